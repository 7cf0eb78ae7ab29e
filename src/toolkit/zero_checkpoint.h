// Checkpoints of ZeRO training (flame_zero_save_full, flame_zero_save_shards, flame_zero_load): one
// format for both. A "shard set" is world_size safetensors files; file r holds, for every parameter
// i of the optimizer (numbered across its groups, as torch's state_dict), the elements [lo, hi) that
// rank r owned (param.<i>, state.<i>.<slot>, master.<i>), and metadata "flame.zero_shard" naming the
// set's files and every parameter's shape, dtype and range. The gathered file is the set of one rank
// that owned everything (world 1, lo 0, hi numel, tensors in the parameters' shapes), so any set
// loads on any number of ranks: each rank reads the ranges it now needs from every file.
// The format is documented in flame.h (flame_zero_save_shards).
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "core/shape.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "toolkit/zero.h"

namespace flame {

// One parameter as a shard file describes it.
struct ZeroShardParam {
  Shape shape;
  std::string dtype;          // dtype_name(): "bf16", "f32", ...
  int64_t lo = 0, hi = 0;     // the elements (row-major) this file holds
  std::vector<bool> present;  // per slot (the optimizer kind's slots, then master): the file holds it
};

// One file of a shard set, as read from its header (host only, no device).
struct ZeroShardFile {
  std::string path;
  int64_t world = 1, rank = 0;
  std::string kind;  // "sgd", "adam", "adamw", "lion"
  int64_t step = 0;
  RoundingRng rng;
  std::vector<double> lrs;  // per group
  std::vector<std::string> files;  // every file of the set by base name, index = rank
  std::vector<ZeroShardParam> params;
  const st::Header* header = nullptr;   // the file's parsed header (kept by the caller)
  const unsigned char* bytes = nullptr; // the whole file (kept by the caller)
};

// The metadata key and the base name of rank r's file of a set saved with path prefix `prefix`.
extern const char* const kZeroShardKey;
std::string zero_shard_file_name(const std::string& prefix, int64_t rank, int64_t world);

// Reads and checks one file's metadata and tensors (names, dtypes, element counts against the
// ranges). FLAME_ERROR_INVALID_FORMAT naming the file and the problem.
ZeroShardFile parse_zero_shard_file(const st::Header& h, const std::string& path);
// Checks that files (index = rank) form one set: same world, kind, step, file list and parameters;
// every parameter's ranges tile [0, numel) exactly; every slot held by all files with a non-empty
// range or by none. FLAME_ERROR_INVALID_FORMAT.
void check_zero_shard_set(const std::vector<ZeroShardFile>& files);

// Collective: gathers the optimizer's parameters and state to rank 0, which writes `path`.
void save_zero_full(ZeroOptimizer& z, const std::string& path);
// Every rank writes its own file of the set `prefix` (no communication).
void save_zero_shards(ZeroOptimizer& z, const std::string& prefix);
// Loads a set (path: any of its files, or a gathered file) into this rank's parameters and state.
void load_zero(ZeroOptimizer& z, const std::string& path);

}  // namespace flame
