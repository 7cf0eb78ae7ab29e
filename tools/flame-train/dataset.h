// The training images of flame-train: scanning the folder, repeats, bucket plan and batch loading.
//
// Layout (kohya's and ai-toolkit's convention):
//   data.path/                  images directly here are repeated data.repeats times
//     a.png  a.txt              caption of a.png: a.txt (data.caption_extension) beside it
//     10_mychar/                kohya's N_name folder: its images are repeated N times; an image
//       b.jpg  b.txt            there without a caption file gets the caption "mychar" (the name)
//     extra/                    any other folder: its images are repeated data.repeats times
// Only the top folder and its direct subfolders are read; hidden entries (".name") are skipped;
// images are png, jpg, jpeg and webp (by extension, then checked by content). Files are listed in
// sorted path order, so the scan is the same on every file system.
//
// scan_dataset reads each image's size from its header (no decoding) and its caption; every
// problem (unreadable or corrupt image, a caption that is not valid UTF-8) is collected and thrown
// as one DatasetError, before any GPU work. plan_buckets assigns images to buckets; load_batch
// decodes, resizes, crops, flips and packs one batch as float NCHW in [-1, 1], with the captions
// after dropout / shuffling and, for SDXL's conditioning, each image's original size and crop.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "buckets.h"
#include "captions.h"
#include "config.h"
#include "images.h"

namespace flame_train {

class DatasetError : public std::runtime_error {
 public:
  explicit DatasetError(const std::vector<std::string>& problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

struct DataOptions {
  std::string path;
  std::string caption_extension = ".txt";
  int repeats = 1;
  BucketOptions buckets;
  CaptionOptions captions;
  bool flip_aug = false;
  bool random_crop = false;
};

struct ImageEntry {
  std::string path;
  std::string caption;  // as read (trimmed); the folder's name when the caption file is missing
  bool caption_missing = false;
  int repeats = 1;
  ImageSize size;
};

struct Dataset {
  std::vector<ImageEntry> images;
  std::vector<std::string> warnings;  // e.g. images without a caption file
  uint64_t sample_count() const;      // images counted with their repeats
};

// kohya's folder name "N_name": true with N (>= 1) and name; false for any other name.
bool parse_repeat_folder(const std::string& folder_name, int* repeats, std::string* name);

// Scans options.path. Throws DatasetError (no images, unreadable files, ...).
// The data set options of a configuration (its data.* keys).
DataOptions data_options_of(const TrainConfig& c);

Dataset scan_dataset(const DataOptions& options);

struct BucketPlan {
  std::vector<Bucket> buckets;
  std::vector<size_t> image_bucket;  // per image
  BucketMembers members;             // per bucket: its samples (each repeat one sample)
};

BucketPlan plan_buckets(const Dataset& dataset, const BucketOptions& options);

// One loaded batch: pixels is samples x 3 x height x width floats in [-1, 1].
struct LoadedBatch {
  int width = 0;
  int height = 0;
  std::vector<float> pixels;
  std::vector<std::string> captions;
  std::vector<ImageSize> original_sizes;  // before resizing
  std::vector<int> crop_left, crop_top;   // in the resized image (SDXL's crop conditioning)
  std::vector<bool> flipped;
};

// Decodes and prepares the batch's samples; seed and epoch key every random choice. Throws
// ImageError when a file changed or broke since the scan.
LoadedBatch load_batch(const Dataset& dataset, const BucketPlan& plan, const Batch& batch, const DataOptions& options,
                       uint64_t seed, uint64_t epoch);

// Batches in one epoch: per bucket, ceil(samples / batch_size). batch_size >= 1.
uint64_t batches_per_epoch(const BucketPlan& plan, int batch_size);

// The --dry-run report: images, samples, buckets with their counts, batches per epoch.
std::string describe_plan(const Dataset& dataset, const BucketPlan& plan, int batch_size);

}  // namespace flame_train
