// Data set scan, bucket plan, batch loading and the plan report (see dataset.h).
#include "dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "random.h"
#include "resample.h"

namespace flame_train {
namespace fs = std::filesystem;
namespace {

// UTF-8 structure: lead bytes, continuation bytes, no truncated sequence (overlong three- and
// four-byte forms are not looked for: the tokenizers replace what they cannot map).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t extra;
    if (c < 0x80) extra = 0;
    else if (c >= 0xc2 && c <= 0xdf) extra = 1;
    else if ((c & 0xf0) == 0xe0) extra = 2;
    else if (c >= 0xf0 && c <= 0xf4) extra = 3;
    else return false;
    if (extra > s.size() - i - 1) return false;
    for (size_t k = 1; k <= extra; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    i += extra + 1;
  }
  return true;
}

// The caption: the first line of the file (as kohya reads it), without a UTF-8 BOM, trimmed.
bool read_caption(const fs::path& path, std::string* caption, std::vector<std::string>& problems) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    problems.push_back(path.string() + ": cannot read the caption file");
    return false;
  }
  std::string line;
  std::getline(in, line);
  if (line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
  size_t start = line.find_first_not_of(" \t");
  line = start == std::string::npos ? "" : line.substr(start);
  if (!valid_utf8(line)) {
    problems.push_back(path.string() + ": the caption is not valid UTF-8");
    return false;
  }
  *caption = line;
  return true;
}

bool hidden(const fs::path& p) { return p.filename().string().rfind('.', 0) == 0; }

// The images directly in folder, in sorted order.
std::vector<fs::path> images_in(const fs::path& folder, std::vector<std::string>& problems) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (hidden(p) || !has_image_extension(p.string())) continue;
    std::error_code type_ec;
    if (fs::is_regular_file(p, type_ec)) out.push_back(p);
  }
  if (ec) problems.push_back(folder.string() + ": cannot list the folder: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

void add_folder(const fs::path& folder, int repeats, const std::string& class_name, const DataOptions& options,
                Dataset& dataset, std::vector<std::string>& problems) {
  for (const fs::path& image : images_in(folder, problems)) {
    ImageEntry entry;
    entry.path = image.string();
    entry.repeats = repeats;
    try {
      entry.size = read_image_size(entry.path);
    } catch (const ImageError& e) {
      problems.push_back(e.what());
      continue;
    }
    fs::path caption_path = image;
    caption_path.replace_extension(options.caption_extension);
    std::error_code ec;
    if (fs::exists(caption_path, ec)) {
      if (!read_caption(caption_path, &entry.caption, problems)) continue;
      if (entry.caption.empty()) dataset.warnings.push_back(caption_path.string() + ": empty caption");
    } else {
      entry.caption_missing = true;
      entry.caption = class_name;
      dataset.warnings.push_back(entry.path + ": no caption file " + caption_path.filename().string() +
                                 (class_name.empty() ? " (empty caption)" : " (caption '" + class_name + "')"));
    }
    dataset.images.push_back(std::move(entry));
  }
}

}  // namespace

DatasetError::DatasetError(const std::vector<std::string>& problems)
    : std::runtime_error(problems.empty() ? std::string("data set error") : problems.front()), problems_(problems) {}

uint64_t Dataset::sample_count() const {
  uint64_t n = 0;
  for (const auto& e : images) n += static_cast<uint64_t>(e.repeats);
  return n;
}

bool parse_repeat_folder(const std::string& folder_name, int* repeats, std::string* name) {
  size_t underscore = folder_name.find('_');
  if (underscore == 0 || underscore == std::string::npos || underscore > 6) return false;
  int n = 0;
  for (size_t i = 0; i < underscore; ++i) {
    if (folder_name[i] < '0' || folder_name[i] > '9') return false;
    n = n * 10 + (folder_name[i] - '0');
  }
  if (n < 1) return false;
  *repeats = n;
  *name = folder_name.substr(underscore + 1);
  return true;
}

DataOptions data_options_of(const TrainConfig& c) {
  DataOptions d;
  d.path = c.data.path;
  d.caption_extension = c.data.caption_extension;
  d.repeats = c.data.repeats;
  d.buckets = c.data.buckets;
  d.captions = c.data.captions;
  d.flip_aug = c.data.flip_aug;
  d.random_crop = c.data.random_crop;
  return d;
}

Dataset scan_dataset(const DataOptions& options) {
  Dataset dataset;
  std::vector<std::string> problems;
  const fs::path root(options.path);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw DatasetError({options.path + ": not a folder"});
  add_folder(root, options.repeats, "", options, dataset, problems);
  std::vector<fs::path> subfolders;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!hidden(it->path()) && fs::is_directory(it->path(), type_ec)) subfolders.push_back(it->path());
  }
  if (ec) problems.push_back(options.path + ": cannot list the folder: " + ec.message());
  std::sort(subfolders.begin(), subfolders.end());
  for (const fs::path& folder : subfolders) {
    int repeats = options.repeats;
    std::string name;
    parse_repeat_folder(folder.filename().string(), &repeats, &name);
    add_folder(folder, repeats, name, options, dataset, problems);
  }
  if (problems.empty() && dataset.images.empty())
    problems.push_back(options.path + ": no images (png, jpg, jpeg, webp) in the folder or its subfolders");
  if (!problems.empty()) throw DatasetError(problems);
  return dataset;
}

BucketPlan plan_buckets(const Dataset& dataset, const BucketOptions& options) {
  BucketPlan plan;
  plan.buckets = make_buckets(options);
  plan.members.resize(plan.buckets.size());
  uint64_t id = 0;
  for (size_t i = 0; i < dataset.images.size(); ++i) {
    const ImageEntry& e = dataset.images[i];
    const size_t b = select_bucket(plan.buckets, e.size.width, e.size.height);
    plan.image_bucket.push_back(b);
    for (int r = 0; r < e.repeats; ++r) plan.members[b].push_back(Sample{i, id++});
  }
  return plan;
}

LoadedBatch load_batch(const Dataset& dataset, const BucketPlan& plan, const Batch& batch, const DataOptions& options,
                       uint64_t seed, uint64_t epoch) {
  const Bucket bucket = plan.buckets.at(batch.bucket);
  LoadedBatch out;
  out.width = bucket.width;
  out.height = bucket.height;
  const size_t per_image = static_cast<size_t>(bucket.width) * bucket.height * 3;
  out.pixels.resize(per_image * batch.samples.size());
  for (size_t s = 0; s < batch.samples.size(); ++s) {
    const Sample& sample = batch.samples[s];
    const ImageEntry& entry = dataset.images.at(sample.image);
    ImageRGB8 image = decode_image(entry.path);
    const CoverSize cover = cover_size(image.width, image.height, bucket);
    ImageF32 resized = resize_image(image, cover.width, cover.height);
    int left = (cover.width - bucket.width) / 2, top = (cover.height - bucket.height) / 2;
    if (options.random_crop) {
      RandomStream rng(seed, RandomPurpose::Crop, epoch, sample.id);
      left = static_cast<int>(rng.next_below(static_cast<uint64_t>(cover.width - bucket.width) + 1));
      top = static_cast<int>(rng.next_below(static_cast<uint64_t>(cover.height - bucket.height) + 1));
    }
    bool flip = false;
    if (options.flip_aug) {
      RandomStream rng(seed, RandomPurpose::Flip, epoch, sample.id);
      flip = rng.next_unit() < 0.5;
    }
    crop_to_tensor(resized, left, top, bucket.width, bucket.height, flip, &out.pixels[s * per_image]);
    out.captions.push_back(process_caption(entry.caption, options.captions, seed, epoch, sample.id));
    out.original_sizes.push_back(ImageSize{image.width, image.height});
    out.crop_left.push_back(left);
    out.crop_top.push_back(top);
    out.flipped.push_back(flip);
  }
  return out;
}

uint64_t batches_per_epoch(const BucketPlan& plan, int batch_size) {
  const uint64_t bs = static_cast<uint64_t>(batch_size < 1 ? 1 : batch_size);
  uint64_t batches = 0;
  for (const auto& m : plan.members) batches += (m.size() + bs - 1) / bs;
  return batches;
}

std::string describe_plan(const Dataset& dataset, const BucketPlan& plan, int batch_size) {
  std::ostringstream out;
  size_t missing = 0;
  for (const auto& e : dataset.images) missing += e.caption_missing ? 1 : 0;
  out << "images: " << dataset.images.size() << " (" << missing << " without a caption file), samples per epoch with "
      << "repeats: " << dataset.sample_count() << "\n";
  size_t used = 0;
  std::ostringstream rows;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const size_t n = plan.members[b].size();
    if (n == 0) continue;
    const uint64_t nb = (n + static_cast<size_t>(batch_size) - 1) / static_cast<size_t>(batch_size);
    ++used;
    rows << "  " << bucket_name(plan.buckets[b]) << "  aspect " << std::fixed;
    rows.precision(3);
    rows << static_cast<double>(plan.buckets[b].width) / plan.buckets[b].height << "  samples " << n << "  batches "
         << nb << "\n";
  }
  out << "buckets: " << used << " used of " << plan.buckets.size() << "; batch size " << batch_size
      << ", batches per epoch: " << batches_per_epoch(plan, batch_size) << "\n"
      << rows.str();
  return out.str();
}

}  // namespace flame_train
