// Aspect-ratio buckets (flame-train), as kohya's sd-scripts makes and uses them
// (library/model_util.make_bucket_resolutions and train_util.BucketManager):
//
//   * the buckets, in units of step (u = step): area = floor(resolution / u)^2 units; the square
//     bucket floor(sqrt(area)) * u; then for width = min_side, min_side + u, ... <= max_side:
//     height = min(max_side, floor(area / floor(width / u)) * u), both (width, height) and
//     (height, width); sorted by (width, height), duplicates removed. One departure from kohya:
//     a bucket with a side under min_side is left out (kohya keeps it, even a 0-pixel side when
//     max_side is large for the resolution); with the defaults the two lists are the same;
//   * an image goes to the bucket of its exact size when there is one, otherwise to the bucket whose
//     aspect ratio (width / height) is nearest to its own (the first such bucket in sorted order);
//   * it is scaled so that it covers the bucket (the side that is tighter matches exactly, sizes
//     rounded half up as kohya does), then cropped to the bucket: centred, or at a random offset.
// With buckets disabled there is one bucket, resolution x resolution.
//
// Batches never mix buckets: each epoch, every bucket's samples are shuffled, cut into batches of
// batch_size (the last one of a bucket may be smaller, as in kohya), and the batches of all buckets
// are shuffled together; all of it with RandomStream keyed by (seed, epoch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flame_train {

struct Bucket {
  int width = 0;
  int height = 0;
};

struct BucketOptions {
  bool enabled = true;
  int resolution = 1024;  // max area = resolution^2
  int min_side = 256;
  int max_side = 2048;
  int step = 64;
};

// The bucket sizes. Throws std::invalid_argument for options that make no bucket (validated
// earlier by the configuration, so this is a programming error).
std::vector<Bucket> make_buckets(const BucketOptions& options);

// Index of the bucket for an image of width x height (see above).
size_t select_bucket(const std::vector<Bucket>& buckets, int width, int height);

// The size an image is resized to before the crop: it covers the bucket.
struct CoverSize {
  int width = 0;
  int height = 0;
};
CoverSize cover_size(int width, int height, const Bucket& bucket);

// One sample of an epoch: an image and the number that keys its random augmentations (each repeat
// of an image is its own sample with its own crop, flip and caption draw).
struct Sample {
  size_t image = 0;
  uint64_t id = 0;
};

struct Batch {
  size_t bucket = 0;
  std::vector<Sample> samples;
};

// Samples per bucket: the input of epoch_batches (built by the data set from repeats).
using BucketMembers = std::vector<std::vector<Sample>>;

// The batches of one epoch. batch_size >= 1.
std::vector<Batch> epoch_batches(const BucketMembers& members, int batch_size, uint64_t seed, uint64_t epoch);

// "1024x1024"
std::string bucket_name(const Bucket& bucket);

}  // namespace flame_train
