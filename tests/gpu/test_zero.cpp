// ZeRO-1 / ZeRO-2 (flame_zero_*: optimizer state sharded over ranks) against the replicated run
// (flame_dp + the same optimizer + flame_clip_grad_norm), and communicators made from the launch
// environment (flame_comm_create_from_env) in two processes.
//
// Ranks run as in test_dist.cpp: one context per GPU, one thread per rank, in one process; the
// launch-environment test re-executes this binary as two ranks. One-rank tests run on any GPU; the
// two-rank ones skip with fewer GPUs unless FLAME_REQUIRE_GPUS=2 (then they fail), and skip without
// NCCL unless FLAME_REQUIRE_GPU=1 or FLAME_REQUIRE_GPUS is set.
//
// On a 2-GPU machine: FLAME_REQUIRE_GPUS=2 ./build/tests/gpu/flame_gpu_tests --gtest_filter='Zero*'
#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "flame_test.h"
#include "rank_test_helpers.h"
#include "zero_test_helpers.h"

extern char** environ;

namespace {



// The MLP (zero_test_helpers.h): 16*8 + 16 + 5*16 + 5 = 229 parameters: on 2 ranks the shard
// boundary (115) cuts W1, and one element of padding ends the flat.

// Rank r's batch of step s: its own rows (data parallelism: ranks see different data).
flame_status_t forward_backward(flame_ctx_t ctx, const Mlp& m, int rank, int step, flame_dtype_t d) {
  const uint32_t seed = 1000u * static_cast<uint32_t>(step) + 10u * static_cast<uint32_t>(rank);
  T x(from_doubles(ctx, uniform(kMlpRows * kMlpIn, seed, 1.0), {kMlpRows, kMlpIn}, d));
  T y(from_doubles(ctx, uniform(kMlpRows * kMlpOut, seed + 1, 1.0), {kMlpRows, kMlpOut}, d));
  T h, out, loss;
  flame_status_t st;
  if ((st = flame_linear(x, m.w1, m.b1, FLAME_ACTIVATION_RELU, h.out())) != FLAME_OK) return st;
  if ((st = flame_linear(h, m.w2, m.b2, FLAME_ACTIVATION_NONE, out.out())) != FLAME_OK) return st;
  if ((st = flame_mse_loss(out, y, FLAME_REDUCTION_MEAN, loss.out())) != FLAME_OK) return st;
  return flame_backward(ctx, loss, nullptr, 0);
}

constexpr int kSteps = 4;
constexpr double kMaxNorm = 0.3;  // small enough that clipping acts on every step

struct RunResult {
  std::vector<std::vector<double>> params;  // per rank
  std::vector<std::vector<double>> norms;   // per rank, per step: the total gradient norm
  std::vector<uint64_t> state_bytes;        // per rank
  std::vector<int> grads_after;             // per rank: parameters that still have a .grad
};

// Trains kSteps on every rank of w: replicated (stage 0: flame_dp + flame_clip_grad_norm +
// flame_optimizer_step) or sharded (stage 1, 2: flame_zero_step with max_grad_norm).
RunResult train(RankWorld& w, int stage, flame_dtype_t d) {
  const int world = static_cast<int>(w.ctxs.size());
  RunResult res;
  res.params.resize(static_cast<size_t>(world));
  res.norms.resize(static_cast<size_t>(world));
  res.state_bytes.resize(static_cast<size_t>(world));
  res.grads_after.resize(static_cast<size_t>(world));
  on_ranks(world, [&](int r) {
    flame_ctx_t ctx = w.ctxs[static_cast<size_t>(r)];
    Mlp m;
    ASSERT_TRUE(make_mlp(ctx, m, d));
    std::vector<flame_tensor_t> ps = m.params();
    flame_optimizer_t opt = make_mlp_adamw(ctx, m, d != FLAME_DTYPE_F32);
    ASSERT_NE(opt, nullptr);
    flame_dp_t dp = nullptr;
    flame_zero_t zero = nullptr;
    if (stage == 0) {
      ASSERT_EQ(flame_dp_create(w.comms[static_cast<size_t>(r)], ps.data(), 4, nullptr, &dp), FLAME_OK) << flame_last_error_message();
    } else {
      flame_zero_options_t o;
      flame_zero_options_init(&o);
      o.stage = stage;
      o.max_grad_norm = kMaxNorm;
      ASSERT_EQ(flame_zero_create(w.comms[static_cast<size_t>(r)], opt, &o, &zero), FLAME_OK) << flame_last_error_message();
    }
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(forward_backward(ctx, m, r, s, d), FLAME_OK) << flame_last_error_message();
      T norm;
      if (stage == 0) {
        EXPECT_EQ(flame_dp_wait(dp), FLAME_OK) << flame_last_error_message();
        EXPECT_EQ(flame_clip_grad_norm(ctx, ps.data(), 4, kMaxNorm, 2.0, 0, norm.out()), FLAME_OK);
        EXPECT_EQ(flame_optimizer_step(opt), FLAME_OK) << flame_last_error_message();
      } else {
        EXPECT_EQ(flame_zero_step(zero, norm.out()), FLAME_OK) << flame_last_error_message();
      }
      std::vector<double> n = to_doubles(norm);
      res.norms[static_cast<size_t>(r)].push_back(n.empty() ? NAN : n[0]);
      if (s + 1 < kSteps) {
        EXPECT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
      }
    }
    int with_grad = 0;
    for (flame_tensor_t p : ps) {
      T g;
      if (flame_tensor_grad(p, g.out()) == FLAME_OK && g.h) ++with_grad;
    }
    res.grads_after[static_cast<size_t>(r)] = with_grad;
    EXPECT_EQ(flame_optimizer_state_bytes(opt, &res.state_bytes[static_cast<size_t>(r)]), FLAME_OK);
    res.params[static_cast<size_t>(r)] = mlp_values(m);
    flame_zero_release(zero);
    flame_dp_release(dp);
    flame_optimizer_release(opt);
  });
  return res;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double abs_tol, double rel_tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t k = 0; k < want.size() && bad < 5; ++k)
    if (!(std::fabs(got[k] - want[k]) <= abs_tol + rel_tol * std::fabs(want[k]))) {
      ADD_FAILURE() << what << ": element " << k << " is " << got[k] << ", the replicated run has " << want[k];
      ++bad;
    }
}

// Sharded (stage 1 and 2) equals replicated for f32 parameters and for bf16 parameters with f32
// master weights; the ranks end equal; each rank holds about half of the optimizer state.
void check_against_replicated(flame_dtype_t d) {
  RankWorld w(2);
  ASSERT_TRUE(w.ok());
  const RunResult ref = train(w, 0, d);
  ASSERT_EQ(ref.params[0], ref.params[1]) << "the replicated ranks differ";
  const int64_t elems = kMlpHidden * kMlpIn + kMlpHidden + kMlpOut * kMlpHidden + kMlpOut;
  const uint64_t per_elem = d == FLAME_DTYPE_F32 ? 8 : 12;  // m, v (f32) [+ f32 master]
  EXPECT_EQ(ref.state_bytes[0], per_elem * static_cast<uint64_t>(elems));
  const bool f32 = d == FLAME_DTYPE_F32;
  for (int stage = 1; stage <= 2; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage) + (f32 ? " f32" : " bf16"));
    const RunResult z = train(w, stage, d);
    EXPECT_EQ(z.params[0], z.params[1]) << "every rank must hold the all-gathered parameters";
    // f32: only the summation order of the norm differs; bf16: that may flip the last bit of a
    // rounded parameter (bf16 has 8 significant bits).
    expect_close(z.params[0], ref.params[0], f32 ? 1e-6 : 1e-3, f32 ? 1e-5 : 8e-3, "parameters");
    // The norm: f32 sums in another order; bf16 also rounds per-tensor (replicated) or per-shard
    // (sharded) norms to bf16 before combining them. AdamW's update hardly depends on that scale.
    for (int r = 0; r < 2; ++r) expect_close(z.norms[r], ref.norms[0], 1e-6, f32 ? 1e-4 : 1.6e-2, "total gradient norm");
    // Shards: 115 + 114 elements of 229; state bytes per rank about halve, and sum to the replicated.
    EXPECT_EQ(z.state_bytes[0], per_elem * 115);
    EXPECT_EQ(z.state_bytes[1], per_elem * 114);
    EXPECT_EQ(z.state_bytes[0] + z.state_bytes[1], ref.state_bytes[0]);
    // Stage 1 leaves the averaged gradients in .grad, stage 2 frees them after the reduce-scatter.
    for (int r = 0; r < 2; ++r) EXPECT_EQ(z.grads_after[r], stage == 1 ? 4 : 0) << "rank " << r;
  }
}

}  // namespace

// Parameters of several hundred MB, so that a step runs in several buckets (256 MiB) with parameters
// split across bucket and shard boundaries: one SGD step (lr 1) from zeros on rank-dependent constant
// gradients gives every element minus the average gradient, and the step's memory beyond the
// parameters and gradients is one shard of gradients plus one bucket — no flat copy of all
// gradients or parameters (which needed shard + 2x the parameter bytes).
TEST(Zero2, LargeParametersStepInBucketsWithoutFlatCopies) {
  NEED_GPUS_AND_NCCL(2);
  RankWorld w(2);
  ASSERT_TRUE(w.ok());
  const std::vector<int64_t> sizes = {30000001, 50000000, 7, 45000000};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  const int64_t shard_bytes = (total + 1) / 2 * 4;
  std::vector<int64_t> extra(2, 0);
  on_ranks(2, [&](int r) {
    flame_ctx_t ctx = w.ctxs[static_cast<size_t>(r)];
    std::vector<T> params(sizes.size());
    std::vector<flame_tensor_t> raw;
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_EQ(flame_zeros(ctx, &sizes[i], 1, FLAME_DTYPE_F32, params[i].out()), FLAME_OK);
      ASSERT_EQ(flame_tensor_set_requires_grad(params[i].h, 1), FLAME_OK);
      raw.push_back(params[i].h);
    }
    flame_optimizer_options_t oo;
    flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_SGD);
    oo.lr = 1.0;
    flame_optimizer_t opt = nullptr;
    ASSERT_EQ(flame_optimizer_create(ctx, &oo, raw.data(), static_cast<int64_t>(raw.size()), &opt), FLAME_OK);
    flame_zero_options_t zo;
    flame_zero_options_init(&zo);
    zo.stage = 2;
    flame_zero_t zero = nullptr;
    ASSERT_EQ(flame_zero_create(w.comms[static_cast<size_t>(r)], opt, &zo, &zero), FLAME_OK) << flame_last_error_message();
    for (size_t i = 0; i < sizes.size(); ++i) {
      T g;
      ASSERT_EQ(flame_full(ctx, &sizes[i], 1, FLAME_DTYPE_F32, static_cast<double>((i + 1) * (r + 1)), g.out()), FLAME_OK);
      ASSERT_EQ(flame_tensor_set_grad(params[i].h, g.h), FLAME_OK);
    }
    flame_memory_stats_t before{}, after{};
    before.struct_size = after.struct_size = sizeof before;
    ASSERT_EQ(flame_ctx_synchronize(ctx), FLAME_OK);
    ASSERT_EQ(flame_ctx_memory_stats(ctx, &before), FLAME_OK);
    ASSERT_EQ(flame_ctx_reset_peak_memory(ctx), FLAME_OK);
    EXPECT_EQ(flame_zero_step(zero, nullptr), FLAME_OK) << flame_last_error_message();
    ASSERT_EQ(flame_ctx_synchronize(ctx), FLAME_OK);
    ASSERT_EQ(flame_ctx_memory_stats(ctx, &after), FLAME_OK);
    extra[static_cast<size_t>(r)] = static_cast<int64_t>(after.peak_bytes_in_use) - static_cast<int64_t>(before.bytes_in_use);
    for (size_t i = 0; i < sizes.size(); ++i) {  // every element: -(average gradient) = -1.5 (i + 1)
      T lo, hi;
      double vlo = 0, vhi = 0;
      ASSERT_EQ(flame_min_all(params[i].h, lo.out()), FLAME_OK);
      ASSERT_EQ(flame_max_all(params[i].h, hi.out()), FLAME_OK);
      ASSERT_EQ(flame_tensor_item(lo.h, &vlo), FLAME_OK);
      ASSERT_EQ(flame_tensor_item(hi.h, &vhi), FLAME_OK);
      EXPECT_EQ(vlo, -1.5 * static_cast<double>(i + 1)) << "rank " << r << " parameter " << i;
      EXPECT_EQ(vhi, -1.5 * static_cast<double>(i + 1)) << "rank " << r << " parameter " << i;
    }
    flame_zero_release(zero);
    flame_optimizer_release(opt);
  });
  const int64_t bound = shard_bytes + (int64_t{256} << 20) + (int64_t{16} << 20);
  for (int r = 0; r < 2; ++r)
    EXPECT_LE(extra[static_cast<size_t>(r)], bound) << "rank " << r << ": the step allocated " << extra[r]
                                                    << " bytes beyond its parameters and gradients";
}

TEST(Zero2, ShardedStepsEqualReplicatedF32) {
  NEED_GPUS_AND_NCCL(2);
  check_against_replicated(FLAME_DTYPE_F32);
}

TEST(Zero2, ShardedStepsEqualReplicatedBf16MasterWeights) {
  NEED_GPUS_AND_NCCL(2);
  check_against_replicated(FLAME_DTYPE_BF16);
}

// One rank: the sharded step is the plain step (the shard is everything), and the optimizer refuses
// what a sharded optimizer cannot do.
TEST(Zero, OneRankEqualsPlainStepAndRefusesUnshardedUse) {
  NEED_GPUS_AND_NCCL(1);
  RankWorld w(1);
  ASSERT_TRUE(w.ok());
  flame_ctx_t ctx = w.ctxs[0];
  std::vector<double> want;
  {
    Mlp m;
    ASSERT_TRUE(make_mlp(ctx, m, FLAME_DTYPE_F32));
    flame_optimizer_t opt = make_mlp_adamw(ctx, m, false);
    std::vector<flame_tensor_t> ps = m.params();
    for (int s = 0; s < 3; ++s) {
      FLAME_ASSERT_OK(forward_backward(ctx, m, 0, s, FLAME_DTYPE_F32));
      FLAME_ASSERT_OK(flame_clip_grad_norm(ctx, ps.data(), 4, kMaxNorm, 2.0, 0, nullptr));
      FLAME_ASSERT_OK(flame_optimizer_step(opt));
      FLAME_ASSERT_OK(flame_optimizer_zero_grad(opt, 1));
    }
    want = mlp_values(m);
    flame_optimizer_release(opt);
  }
  Mlp m;
  ASSERT_TRUE(make_mlp(ctx, m, FLAME_DTYPE_F32));
  flame_optimizer_t opt = make_mlp_adamw(ctx, m, false);
  flame_zero_options_t o;
  FLAME_ASSERT_OK(flame_zero_options_init(&o));
  EXPECT_EQ(o.stage, 1);
  EXPECT_EQ(o.broadcast_parameters, 1);
  EXPECT_EQ(o.max_grad_norm, 0.0);
  o.stage = 3;
  flame_zero_t zero = reinterpret_cast<flame_zero_t>(static_cast<uintptr_t>(1));
  FLAME_EXPECT_STATUS(flame_zero_create(w.comms[0], opt, &o, &zero), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zero, nullptr);
  o.stage = 2;
  o.max_grad_norm = -1;
  FLAME_EXPECT_STATUS(flame_zero_create(w.comms[0], opt, &o, &zero), FLAME_ERROR_INVALID_ARGUMENT);
  o.max_grad_norm = kMaxNorm;
  FLAME_ASSERT_OK(flame_zero_create(w.comms[0], opt, &o, &zero));
  flame_zero_t again = nullptr;
  FLAME_EXPECT_STATUS(flame_zero_create(w.comms[0], opt, &o, &again), FLAME_ERROR_INVALID_ARGUMENT);  // sharded already
  EXPECT_EQ(again, nullptr);
  for (int s = 0; s < 3; ++s) {
    FLAME_ASSERT_OK(forward_backward(ctx, m, 0, s, FLAME_DTYPE_F32));
    FLAME_ASSERT_OK(flame_zero_step(zero, nullptr));
  }
  expect_close(mlp_values(m), want, 1e-6, 1e-5, "one-rank sharded run");
  int64_t steps = 0;
  FLAME_ASSERT_OK(flame_optimizer_step_count(opt, &steps));
  EXPECT_EQ(steps, 3);
  FLAME_EXPECT_STATUS(flame_optimizer_step(opt), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_optimizer_save_state(opt, "/tmp/flame_zero_state_never_written.safetensors"),
                      FLAME_ERROR_UNSUPPORTED);
  flame_optimizer_options_t oo;
  flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW);
  T extra(from_doubles(ctx, {1.0}, {1}, FLAME_DTYPE_F32));
  flame_tensor_t extra_h = extra.h;
  int32_t group = -1;
  FLAME_EXPECT_STATUS(flame_optimizer_add_param_group(opt, &oo, &extra_h, 1, &group), FLAME_ERROR_INVALID_ARGUMENT);
  flame_zero_release(zero);
  flame_zero_release(zero);  // released: detected, nothing happens
  FLAME_EXPECT_STATUS(flame_zero_step(zero, nullptr), FLAME_ERROR_INVALID_HANDLE);
  FLAME_EXPECT_STATUS(flame_zero_step(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_optimizer_release(opt);

  // An optimizer that stepped already cannot be sharded.
  flame_optimizer_t stepped = make_mlp_adamw(ctx, m, false);
  FLAME_ASSERT_OK(forward_backward(ctx, m, 0, 0, FLAME_DTYPE_F32));
  FLAME_ASSERT_OK(flame_optimizer_step(stepped));
  FLAME_EXPECT_STATUS(flame_zero_create(w.comms[0], stepped, nullptr, &zero), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("before its first step"), std::string::npos) << flame_last_error_message();
  flame_optimizer_release(stepped);
}

// A rank whose optimizer cannot be sharded makes the other rank fail too, at once.
TEST(Zero2, OneRankFailingItsChecksFailsEveryRank) {
  NEED_GPUS_AND_NCCL(2);
  RankWorld w(2);
  ASSERT_TRUE(w.ok());
  std::vector<flame_status_t> sts(2);
  std::vector<std::string> msgs(2);
  on_ranks(2, [&](int r) {
    flame_ctx_t ctx = w.ctxs[static_cast<size_t>(r)];
    Mlp m;
    ASSERT_TRUE(make_mlp(ctx, m, FLAME_DTYPE_F32));
    flame_optimizer_t opt = make_mlp_adamw(ctx, m, false);
    if (r == 1) {  // rank 1 stepped its optimizer already
      EXPECT_EQ(forward_backward(ctx, m, r, 0, FLAME_DTYPE_F32), FLAME_OK);
      EXPECT_EQ(flame_optimizer_step(opt), FLAME_OK);
    }
    flame_zero_t zero = nullptr;
    sts[static_cast<size_t>(r)] = flame_zero_create(w.comms[static_cast<size_t>(r)], opt, nullptr, &zero);
    msgs[static_cast<size_t>(r)] = flame_last_error_message();
    EXPECT_EQ(zero, nullptr);
    flame_optimizer_release(opt);
  });
  EXPECT_EQ(sts[1], FLAME_ERROR_INVALID_ARGUMENT) << msgs[1];
  EXPECT_EQ(sts[0], FLAME_ERROR_INVALID_ARGUMENT) << msgs[0];
  EXPECT_NE(msgs[0].find("rank 1 failed to shard its optimizer"), std::string::npos) << msgs[0];
}

// ---- flame_comm_create_from_env: this binary re-executed as two ranks with the torchrun variables ----
namespace {

constexpr const char* kEnvChild = "FLAME_TEST_ZERO_ENV_CHILD";

// A rank: context on LOCAL_RANK, communicator from the environment, all_reduce [RANK + 1] -> 3.
int env_child_main() {
  auto fail = [](const char* what) {
    std::fprintf(stderr, "[env child %s] %s: %s\n", std::getenv("RANK"), what, flame_last_error_message());
    return 1;
  };
  int32_t local_rank = -1;
  if (flame_comm_env_local_rank(&local_rank) != FLAME_OK) return fail("flame_comm_env_local_rank");
  flame_ctx_t ctx = make_rank_ctx(local_rank);
  if (!ctx) return fail("flame_ctx_create");
  flame_comm_t comm = nullptr;
  if (flame_comm_create_from_env(ctx, nullptr, &comm) != FLAME_OK) return fail("flame_comm_create_from_env");
  int32_t rank = -1, size = 0;
  flame_comm_rank(comm, &rank);
  flame_comm_size(comm, &size);
  if (rank != std::atoi(std::getenv("RANK")) || size != 2) return fail("rank or size");
  const int64_t shape[] = {100};
  flame_tensor_t t = nullptr;
  if (flame_full(ctx, shape, 1, FLAME_DTYPE_F32, rank + 1.0, &t) != FLAME_OK) return fail("flame_full");
  if (flame_comm_all_reduce(comm, t, FLAME_REDUCE_SUM) != FLAME_OK) return fail("all_reduce");
  if (flame_comm_synchronize(comm) != FLAME_OK) return fail("synchronize");
  std::vector<float> v(100);
  if (flame_to_host(t, v.data(), v.size() * sizeof(float)) != FLAME_OK) return fail("to_host");
  int wrong = 0;
  for (float x : v) wrong += x != 3.0f;
  flame_tensor_release(t);
  flame_comm_release(comm);
  flame_ctx_destroy(ctx);
  if (wrong) std::fprintf(stderr, "[env child %d] %d of 100 sums are not 3\n", rank, wrong);
  return wrong ? 1 : 0;
}

const bool g_env_child_ran = [] {
  if (std::getenv(kEnvChild)) {
    std::fflush(stdout);
    int rc = env_child_main();
    std::fflush(stderr);
    std::_Exit(rc);
  }
  return false;
}();

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

pid_t spawn_env_rank(int rank, int port, std::string* why) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) { *why = "readlink /proc/self/exe failed"; return -1; }
  exe[n] = '\0';
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string s(*e);
    bool launch_var = false;
    for (const char* v : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=", "MASTER_PORT=", "FLAME_TEST_"})
      launch_var = launch_var || s.rfind(v, 0) == 0;
    if (!launch_var) env.push_back(s);
  }
  for (const std::string& v : {std::string("RANK=") + std::to_string(rank), std::string("LOCAL_RANK=") + std::to_string(rank),
                               std::string("WORLD_SIZE=2"), std::string("MASTER_ADDR=127.0.0.1"),
                               std::string("MASTER_PORT=") + std::to_string(port), std::string("FLAME_RENDEZVOUS_TIMEOUT=60"),
                               std::string(kEnvChild) + "=1"})
    env.push_back(v);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  char* argv[] = {exe, nullptr};
  pid_t pid = 0;
  int err = posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data());
  if (err != 0) { *why = std::string("posix_spawn: ") + std::strerror(err); return -1; }
  return pid;
}

}  // namespace

TEST(Zero2, CommFromLaunchEnvironmentInTwoProcesses) {
  ASSERT_FALSE(g_env_child_ran);
  NEED_GPUS_AND_NCCL(2);
  const int port = free_port();
  std::string why;
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = spawn_env_rank(r, port, &why);
    ASSERT_GT(pids[r], 0) << why;
  }
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << (WIFEXITED(status) ? " exited " + std::to_string(WEXITSTATUS(status)) : " died of a signal")
        << " (its [env child] lines above say why)";
  }
}

// flame_comm_create_from_env with a context on the wrong device fails before any network wait.
TEST(Zero2, CommFromLaunchEnvironmentChecksTheDevice) {
  NEED_GPUS_AND_NCCL(2);
  flame_ctx_t ctx = make_rank_ctx(1);
  ASSERT_NE(ctx, nullptr);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29599", 1);
  flame_comm_t comm = nullptr;
  FLAME_EXPECT_STATUS(flame_comm_create_from_env(ctx, nullptr, &comm), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("LOCAL_RANK=0"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(comm, nullptr);
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
  flame_ctx_destroy(ctx);
}
