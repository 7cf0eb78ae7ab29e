// Bucket sizes, assignment, cover size and per-bucket batches (see buckets.h).
#include "buckets.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "random.h"

namespace flame_train {

std::vector<Bucket> make_buckets(const BucketOptions& o) {
  if (o.resolution < o.step || o.step < 1 || o.min_side < o.step || o.max_side < o.min_side)
    throw std::invalid_argument("make_buckets: bad options (resolution " + std::to_string(o.resolution) + ", min " +
                                std::to_string(o.min_side) + ", max " + std::to_string(o.max_side) + ", step " +
                                std::to_string(o.step) + ")");
  if (!o.enabled) return {Bucket{o.resolution, o.resolution}};
  const long long area_units = static_cast<long long>(o.resolution / o.step) * (o.resolution / o.step);
  std::vector<std::pair<int, int>> sizes;
  const int square = static_cast<int>(std::sqrt(static_cast<double>(area_units))) * o.step;
  sizes.emplace_back(square, square);
  for (int width = o.min_side; width <= o.max_side; width += o.step) {
    long long h = (area_units / (width / o.step)) * o.step;
    int height = static_cast<int>(std::min<long long>(o.max_side, h));
    if (height >= o.min_side) {
      sizes.emplace_back(width, height);
      sizes.emplace_back(height, width);
    }
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<Bucket> buckets;
  for (const auto& s : sizes) buckets.push_back(Bucket{s.first, s.second});
  return buckets;
}

size_t select_bucket(const std::vector<Bucket>& buckets, int width, int height) {
  for (size_t i = 0; i < buckets.size(); ++i)
    if (buckets[i].width == width && buckets[i].height == height) return i;
  const double ratio = static_cast<double>(width) / height;
  size_t best = 0;
  double best_error = 0.0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    double error = std::fabs(static_cast<double>(buckets[i].width) / buckets[i].height - ratio);
    if (i == 0 || error < best_error) {
      best = i;
      best_error = error;
    }
  }
  return best;
}

CoverSize cover_size(int width, int height, const Bucket& bucket) {
  const double image_ratio = static_cast<double>(width) / height;
  const double bucket_ratio = static_cast<double>(bucket.width) / bucket.height;
  // Wider than the bucket: match heights (the width overhangs); else match widths.
  const double scale = image_ratio > bucket_ratio ? static_cast<double>(bucket.height) / height
                                                  : static_cast<double>(bucket.width) / width;
  CoverSize out;
  out.width = std::max(bucket.width, static_cast<int>(width * scale + 0.5));
  out.height = std::max(bucket.height, static_cast<int>(height * scale + 0.5));
  return out;
}

std::vector<Batch> epoch_batches(const BucketMembers& members, int batch_size, uint64_t seed, uint64_t epoch) {
  if (batch_size < 1) throw std::invalid_argument("epoch_batches: batch_size must be at least 1");
  std::vector<Batch> batches;
  for (size_t b = 0; b < members.size(); ++b) {
    std::vector<Sample> order = members[b];
    RandomStream rng(seed, RandomPurpose::BatchOrder, epoch, b + 1);
    shuffle_with(order, rng);
    for (size_t start = 0; start < order.size(); start += static_cast<size_t>(batch_size)) {
      Batch batch;
      batch.bucket = b;
      size_t end = std::min(order.size(), start + static_cast<size_t>(batch_size));
      batch.samples.assign(order.begin() + static_cast<std::ptrdiff_t>(start),
                           order.begin() + static_cast<std::ptrdiff_t>(end));
      batches.push_back(std::move(batch));
    }
  }
  RandomStream rng(seed, RandomPurpose::BatchOrder, epoch, 0);
  shuffle_with(batches, rng);
  return batches;
}

std::string bucket_name(const Bucket& bucket) {
  return std::to_string(bucket.width) + "x" + std::to_string(bucket.height);
}

}  // namespace flame_train
