// Helpers of the multi-rank GPU tests (test_dist.cpp, test_zero*.cpp): the GPU count
// asked for by FLAME_REQUIRE_GPUS, ranks as threads of one process, host doubles to and from
// tensors of any dtype, and (for the ZeRO tests) contexts of one seed on GPUs 0..world-1 joined by
// one communicator, with the skip-or-fail rule for missing GPUs and NCCL.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include "flame_test.h"

// FLAME_REQUIRE_GPUS: the GPUs a multi-rank test must find (0: none required).
inline int required_gpus() {
  const char* v = std::getenv("FLAME_REQUIRE_GPUS");
  return v ? std::atoi(v) : 0;
}

inline int device_count() {
  int32_t n = 0;
  return flame_device_count(&n) == FLAME_OK ? n : 0;
}

// Runs body(rank) for every rank on its own thread and joins them.
inline void on_ranks(int world, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

// A tensor of dtype d from host doubles (values the tests choose so that d holds them as needed).
inline flame_tensor_t from_doubles(flame_ctx_t c, const std::vector<double>& v, std::vector<int64_t> shape,
                                   flame_dtype_t d) {
  flame_tensor_t f64 = nullptr, out = nullptr;
  if (flame_from_host(c, v.data(), v.size() * sizeof(double), shape.data(), static_cast<int32_t>(shape.size()),
                      FLAME_DTYPE_F64, &f64) != FLAME_OK)
    return nullptr;
  flame_to_dtype(f64, d, &out);
  flame_tensor_release(f64);
  return out;
}

// A tensor's values as host doubles (empty when a copy fails).
inline std::vector<double> to_doubles(flame_tensor_t t) {
  int64_t n = 0;
  flame_tensor_numel(t, &n);
  std::vector<double> v(static_cast<size_t>(n));
  flame_tensor_t f64 = nullptr;
  if (flame_to_dtype(t, FLAME_DTYPE_F64, &f64) != FLAME_OK) return {};
  flame_status_t st = flame_to_host(f64, v.data(), v.size() * sizeof(double));
  flame_tensor_release(f64);
  return st == FLAME_OK ? v : std::vector<double>{};
}

// A context on device with seed 77 and the heuristic GEMM choice (the same algorithm in every
// context: comparable results across ranks); null on failure.
inline flame_ctx_t make_rank_ctx(int device) {
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.device = device;
  o.seed = 77;
  o.gemm_heuristic_only = 1;
  flame_ctx_t c = nullptr;
  return flame_ctx_create(&o, &c) == FLAME_OK ? c : nullptr;
}

inline std::string nccl_missing() {  // "" when NCCL loads
  flame_ctx_t c = make_rank_ctx(0);
  if (!c) return flame_last_error_message();
  flame_comm_id_t id;
  std::string why = flame_comm_unique_id(c, &id) == FLAME_OK ? "" : flame_last_error_message();
  flame_ctx_destroy(c);
  return why;
}

// Skips the test with fewer than n GPUs or without NCCL; fails instead when FLAME_REQUIRE_GPUS asks
// for n (or, for n = 1, FLAME_REQUIRE_GPU is set), and without NCCL when either is set.
#define NEED_GPUS_AND_NCCL(n)                                                                          \
  do {                                                                                                 \
    const int have_ = device_count();                                                                  \
    if (have_ < (n)) {                                                                                 \
      if (required_gpus() >= (n) || ((n) == 1 && flame_gpu_required()))                                \
        FAIL() << "needs " << (n) << " GPUs (FLAME_REQUIRE_GPUS / FLAME_REQUIRE_GPU set), found " << have_; \
      GTEST_SKIP() << "needs " << (n) << " GPUs, found " << have_;                                     \
    }                                                                                                  \
    const std::string why_ = nccl_missing();                                                           \
    if (!why_.empty()) {                                                                               \
      if (flame_gpu_required() || required_gpus() > 0) FAIL() << "NCCL is not available: " << why_;   \
      GTEST_SKIP() << "NCCL is not available: " << why_;                                               \
    }                                                                                                  \
  } while (0)

// Contexts on GPUs 0..world-1 (make_rank_ctx) and one communicator (flame_comm_create_group),
// released at the end.
struct RankWorld {
  std::vector<flame_ctx_t> ctxs;
  std::vector<flame_comm_t> comms;
  explicit RankWorld(int world) {
    for (int r = 0; r < world; ++r) ctxs.push_back(make_rank_ctx(r));
    comms.assign(static_cast<size_t>(world), nullptr);
    for (flame_ctx_t c : ctxs)
      if (!c) return;
    flame_comm_options_t o;
    flame_comm_options_init(&o);
    o.timeout_ms = 60000;
    if (flame_comm_create_group(ctxs.data(), world, &o, comms.data()) != FLAME_OK) ADD_FAILURE() << flame_last_error_message();
  }
  bool ok() const { return !comms.empty() && comms[0]; }
  ~RankWorld() {
    on_ranks(static_cast<int>(comms.size()), [&](int r) { flame_comm_release(comms[static_cast<size_t>(r)]); });
    for (flame_ctx_t c : ctxs) flame_ctx_destroy(c);
  }
  RankWorld(const RankWorld&) = delete;
  RankWorld& operator=(const RankWorld&) = delete;
};
