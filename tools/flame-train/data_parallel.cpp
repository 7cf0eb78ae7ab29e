// Data parallel training in one process, one thread per GPU (see data_parallel.h).
#include "data_parallel.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "memory_check.h"
#include "trainer.h"

namespace flame_train {

DataParallelRank::DataParallelRank(flame_comm_t comm, int rank, int world, std::string cache_file)
    : comm_(comm), rank_(rank), world_(world), cache_file_(std::move(cache_file)) {}

DataParallelRank::~DataParallelRank() = default;  // the synchroniser first, then the communicator

void DataParallelRank::attach(flame_params_t adapter) {
  const flame_tensor_t* tensors = nullptr;
  int64_t n = 0;
  check(flame_params_count(adapter, &n), "flame_params_count");
  check(flame_params_tensors(adapter, &tensors), "flame_params_tensors");
  flame_dp_options_t options;
  check(flame_dp_options_init(&options), "flame_dp_options_init");
  check(flame_dp_create(comm_.get(), tensors, n, &options, dp_.out()), "flame_dp_create");
}

void DataParallelRank::set_sync(bool sync) { check(flame_dp_set_sync(dp_.get(), sync ? 1 : 0), "flame_dp_set_sync"); }

void DataParallelRank::wait() { check(flame_dp_wait(dp_.get()), "flame_dp_wait"); }

double DataParallelRank::mean_over_ranks(flame_ctx_t ctx, double value) {
  Tensor t;
  const int64_t shape[1] = {1};
  check(flame_from_host(ctx, &value, sizeof value, shape, 1, FLAME_DTYPE_F64, t.out()), "flame_from_host");
  check(flame_comm_all_reduce(comm_.get(), t.get(), FLAME_REDUCE_AVG), "flame_comm_all_reduce");
  check(flame_comm_synchronize(comm_.get()), "flame_comm_synchronize");
  double mean = 0;
  check(flame_tensor_item(t.get(), &mean), "flame_tensor_item");
  return mean;
}

namespace {

// FNV-1a over bytes, continuing from hash.
uint64_t fnv1a(uint64_t hash, const std::vector<unsigned char>& bytes) {
  for (unsigned char b : bytes) hash = (hash ^ b) * 0x100000001b3ULL;
  return hash;
}

// The 64-bit hash of every tensor of params, in order, as their bytes on the host.
uint64_t params_hash(flame_params_t params) {
  const flame_tensor_t* tensors = nullptr;
  int64_t n = 0;
  check(flame_params_count(params, &n), "flame_params_count");
  check(flame_params_tensors(params, &tensors), "flame_params_tensors");
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (int64_t i = 0; i < n; ++i) {
    int64_t numel = 0;
    flame_dtype_t dtype;
    check(flame_tensor_numel(tensors[i], &numel), "flame_tensor_numel");
    check(flame_tensor_dtype(tensors[i], &dtype), "flame_tensor_dtype");
    std::vector<unsigned char> bytes(static_cast<size_t>(numel) * flame_dtype_size(dtype));
    check(flame_to_host(tensors[i], bytes.data(), bytes.size()), "flame_to_host");
    hash = fnv1a(hash, bytes);
  }
  return hash;
}

}  // namespace

bool DataParallelRank::adapters_identical(flame_ctx_t ctx, flame_params_t adapter) {
  check(flame_comm_synchronize(comm_.get()), "flame_comm_synchronize");  // the step's work, with the timeout
  const uint64_t hash = params_hash(adapter);
  int64_t bits = 0;
  std::memcpy(&bits, &hash, sizeof bits);
  const int64_t shape[1] = {1};
  Tensor lowest, highest;
  check(flame_from_host(ctx, &bits, sizeof bits, shape, 1, FLAME_DTYPE_I64, lowest.out()), "flame_from_host");
  check(flame_from_host(ctx, &bits, sizeof bits, shape, 1, FLAME_DTYPE_I64, highest.out()), "flame_from_host");
  check(flame_comm_all_reduce(comm_.get(), lowest.get(), FLAME_REDUCE_MIN), "flame_comm_all_reduce");
  check(flame_comm_all_reduce(comm_.get(), highest.get(), FLAME_REDUCE_MAX), "flame_comm_all_reduce");
  check(flame_comm_synchronize(comm_.get()), "flame_comm_synchronize");
  int64_t low = 0, high = 0;
  check(flame_to_host(lowest.get(), &low, sizeof low), "flame_to_host");
  check(flame_to_host(highest.get(), &high, sizeof high), "flame_to_host");
  return low == high;
}

namespace {

// training.gpus GPUs from training.device on must exist.
void check_gpu_count(const TrainConfig& config) {
  int32_t count = 0;
  check(flame_device_count(&count), "flame_device_count");
  const int first = config.training.device, wanted = config.training.gpus;
  if (first + wanted > count)
    throw std::runtime_error("training.gpus " + std::to_string(wanted) + " needs GPUs " + std::to_string(first) + ".." +
                             std::to_string(first + wanted - 1) + " (training.device " + std::to_string(first) +
                             "), but this machine has " + std::to_string(count) + " GPU" + (count == 1 ? "" : "s") +
                             ": lower --gpus (or training.device)");
}

Context open_rank_context(const TrainConfig& config, int rank) {
  flame_ctx_options_t opts;
  check(flame_ctx_options_init(&opts), "flame_ctx_options_init");
  opts.device = config.training.device + rank;
  opts.seed = config.training.seed;  // every rank draws its set-up (model, adapter) as rank 0 does
  Context ctx;
  check(flame_ctx_create(&opts, ctx.out()), "flame_ctx_create");
  return ctx;
}

// NCCL loads (flame_comm_unique_id needs it), else a clear error with the loader's reason.
void check_nccl(flame_ctx_t ctx, int gpus) {
  flame_comm_id_t id;
  const flame_status_t st = flame_comm_unique_id(ctx, &id);
  if (st == FLAME_OK) return;
  throw std::runtime_error("training.gpus " + std::to_string(gpus) + " trains through NCCL, which " +
                           (st == FLAME_ERROR_UNSUPPORTED ? "could not be loaded" : "failed") + " (" +
                           flame_status_string(st) + "): " + flame_last_error_message() +
                           " (or train on one GPU: --gpus 1)");
}

// What one rank's thread ended with.
struct RankOutcome {
  bool failed = false;
  std::chrono::steady_clock::time_point when;  // of the failure: the earliest is the cause
  std::string error;
  TrainResult result;
};

void run_rank(flame_ctx_t ctx, flame_comm_t comm, int rank, const TrainConfig& config, bool demo,
              const TrainState* resume_from, const std::string& cache_file, RankOutcome& outcome) {
  try {
    DataParallelRank dp(comm, rank, config.training.gpus, cache_file);
    outcome.result = run_training(ctx, config, demo, resume_from, &dp);
  } catch (const std::exception& e) {
    outcome.failed = true;
    outcome.when = std::chrono::steady_clock::now();
    outcome.error = e.what();
  }
}

}  // namespace

TrainResult run_data_parallel_training(const TrainConfig& config, bool demo, const TrainState* resume_from) {
  const int world = config.training.gpus;
  check_gpu_count(config);
  std::vector<Context> contexts;
  contexts.push_back(open_rank_context(config, 0));
  check_nccl(contexts[0].get(), world);
  for (int r = 1; r < world; ++r) contexts.push_back(open_rank_context(config, r));
  std::printf("data parallel: %d GPUs (devices %d..%d), global batch %d x %d = %d\n", world, config.training.device,
              config.training.device + world - 1, config.training.batch_size, world, config.training.batch_size * world);

  // Once, on rank 0's GPU, before any rank loads its denoiser (the cache goes into output.dir).
  if (::mkdir(config.output.dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw std::runtime_error("cannot create " + config.output.dir);
  check_memory_estimate(contexts[0].get(), config);
  const std::string cache_file = demo ? std::string() : training_cache_file(contexts[0].get(), config);

  std::vector<flame_ctx_t> handles;
  for (const Context& c : contexts) handles.push_back(c.get());
  std::vector<flame_comm_t> comms(static_cast<size_t>(world), nullptr);
  check(flame_comm_create_group(handles.data(), world, nullptr, comms.data()), "flame_comm_create_group");

  std::vector<RankOutcome> outcomes(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back(run_rank, handles[static_cast<size_t>(r)], comms[static_cast<size_t>(r)], r, std::cref(config),
                         demo, resume_from, std::cref(cache_file), std::ref(outcomes[static_cast<size_t>(r)]));
  for (std::thread& t : threads) t.join();
  // The rank that failed first: the others usually failed waiting for it.
  int first_failed = -1;
  for (int r = 0; r < world; ++r) {
    const RankOutcome& o = outcomes[static_cast<size_t>(r)];
    if (o.failed && (first_failed < 0 || o.when < outcomes[static_cast<size_t>(first_failed)].when)) first_failed = r;
  }
  if (first_failed >= 0)
    throw std::runtime_error("rank " + std::to_string(first_failed) + ": " + outcomes[static_cast<size_t>(first_failed)].error);
  return outcomes[0].result;
}

}  // namespace flame_train
