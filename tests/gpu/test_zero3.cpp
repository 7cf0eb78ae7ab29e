// ZeRO-3 (flame_zero_create stage 3: a model's block parameters sharded over ranks, gathered block by
// block in forward and again for the recompute in backward, gradients reduce-scattered per block)
// on a tiny Flux transformer, through the C ABI:
//  - one rank (any GPU): training equals the plain optimizer on the same model (the shard is the
//    whole block), the sharded parameter handles refuse data use but keep their geometry, and
//    flame_zero_gather_params gives the values back;
//  - two ranks (two GPUs): training equals the replicated run (flame_dp + flame_clip_grad_norm +
//    the optimizer) within rounding, the ranks end equal, each rank holds half the optimizer state,
//    and the bytes a rank holds for parameters, gradients and optimizer state fall well below the
//    replicated run's (measured with flame_ctx_memory_stats);
//  - bad input fails with FLAME_ERROR_INVALID_ARGUMENT and changes nothing.
// Ranks run as in test_zero.cpp: one context per GPU, one thread per rank, in one process. One-rank
// tests run on any GPU and fail without one under FLAME_REQUIRE_GPU=1; the two-rank test skips with
// fewer GPUs unless FLAME_REQUIRE_GPUS=2 (then it fails), and every test skips without NCCL unless
// FLAME_REQUIRE_GPU=1 or FLAME_REQUIRE_GPUS is set.
//
// On a 2-GPU machine: FLAME_REQUIRE_GPUS=2 ./build/tests/gpu/flame_gpu_tests --gtest_filter='Zero3*'
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include "flame_test.h"
#include "rank_test_helpers.h"
#include "model_test_handles.h"
#include "zero_test_helpers.h"

namespace {

// forward, mse against a fixed target, backward; the loss in *loss.
flame_status_t forward_backward(flame_ctx_t ctx, flame_model_t m, int rank, int step, double* loss) {
  ParamsHandle in, out;
  make_flux_inputs(ctx, rank, step, in);
  flame_status_t st = flame_model_forward(m, in.p, &out.p);
  if (st != FLAME_OK) return st;
  flame_tensor_t sample = nullptr;
  if ((st = flame_params_find(out.p, "sample", &sample)) != FLAME_OK) return st;
  T target(host_tensor(ctx, {1, 12, 16}, ramp(12 * 16, 0.5f, 2.2f))), l;
  if ((st = flame_mse_loss(sample, target, FLAME_REDUCTION_MEAN, l.out())) != FLAME_OK) return st;
  if ((st = flame_tensor_item(l, loss)) != FLAME_OK) return st;
  return flame_backward(ctx, l, nullptr, 0);
}

uint64_t bytes_in_use(flame_ctx_t ctx) {
  EXPECT_EQ(flame_ctx_synchronize(ctx), FLAME_OK);
  flame_memory_stats_t s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(flame_ctx_memory_stats(ctx, &s), FLAME_OK);
  return s.bytes_in_use;
}

constexpr int kSteps = 3;
constexpr double kMaxNorm = 0.05;  // small enough that clipping acts

struct RunResult {
  std::vector<std::vector<double>> params;  // per rank, every parameter in the model's order
  std::vector<std::vector<double>> losses;  // per rank, per step
  std::vector<uint64_t> state_bytes;        // per rank: flame_optimizer_state_bytes
  std::vector<int64_t> held_bytes;          // per rank: bytes in use after training, beyond the start
};

// Trains kSteps on every rank of w: replicated (flame_dp + flame_clip_grad_norm + optimizer step,
// checkpointing on) or sharded (ZeRO-3 with max_grad_norm).
RunResult train(RankWorld& w, bool sharded) {
  const int world = static_cast<int>(w.ctxs.size());
  RunResult res;
  res.params.resize(static_cast<size_t>(world));
  res.losses.resize(static_cast<size_t>(world));
  res.state_bytes.resize(static_cast<size_t>(world));
  res.held_bytes.resize(static_cast<size_t>(world));
  on_ranks(world, [&](int r) {
    flame_ctx_t ctx = w.ctxs[static_cast<size_t>(r)];
    flame_comm_t comm = w.comms[static_cast<size_t>(r)];
    const uint64_t start = bytes_in_use(ctx);
    ModelHandle m;
    ParamsHandle params;
    ASSERT_TRUE(make_flux_model(ctx, 12345, m, params));
    int64_t n = 0;
    ASSERT_EQ(flame_params_count(params.p, &n), FLAME_OK);
    const flame_tensor_t* ps = nullptr;
    ASSERT_EQ(flame_params_tensors(params.p, &ps), FLAME_OK);
    flame_optimizer_t opt = make_flux_adamw(ctx, params.p);
    ASSERT_NE(opt, nullptr) << flame_last_error_message();
    flame_dp_t dp = nullptr;
    flame_zero_t zero = nullptr;
    if (sharded) {
      ASSERT_EQ(learning_forward(ctx, m.m), FLAME_OK) << flame_last_error_message();
      flame_zero_options_t o;
      flame_zero_options_init(&o);
      o.stage = 3;
      o.model = m.m;
      o.max_grad_norm = kMaxNorm;
      ASSERT_EQ(flame_zero_create(comm, opt, &o, &zero), FLAME_OK) << flame_last_error_message();
    } else {
      ASSERT_EQ(flame_dp_create(comm, ps, n, nullptr, &dp), FLAME_OK) << flame_last_error_message();
    }
    for (int s = 0; s < kSteps; ++s) {
      double loss = NAN;
      EXPECT_EQ(forward_backward(ctx, m.m, r, s, &loss), FLAME_OK) << flame_last_error_message();
      res.losses[static_cast<size_t>(r)].push_back(loss);
      if (sharded) {
        EXPECT_EQ(flame_zero_step(zero, nullptr), FLAME_OK) << flame_last_error_message();
      } else {
        EXPECT_EQ(flame_dp_wait(dp), FLAME_OK) << flame_last_error_message();
        EXPECT_EQ(flame_clip_grad_norm(ctx, ps, n, kMaxNorm, 2.0, 0, nullptr), FLAME_OK) << flame_last_error_message();
        EXPECT_EQ(flame_optimizer_step(opt), FLAME_OK) << flame_last_error_message();
      }
      EXPECT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
    }
    res.held_bytes[static_cast<size_t>(r)] = static_cast<int64_t>(bytes_in_use(ctx)) - static_cast<int64_t>(start);
    EXPECT_EQ(flame_optimizer_state_bytes(opt, &res.state_bytes[static_cast<size_t>(r)]), FLAME_OK);
    if (sharded) {
      ParamsHandle whole;
      EXPECT_EQ(flame_zero_gather_params(zero, &whole.p), FLAME_OK) << flame_last_error_message();
      if (whole.p) res.params[static_cast<size_t>(r)] = values_of(whole.p);
    } else {
      res.params[static_cast<size_t>(r)] = values_of(params.p);
    }
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

}  // namespace

// Two ranks: the same parameters and losses as the replicated run, and half the optimizer state and
// well under the replicated bytes per rank.
TEST(Zero3, TwoRanksTrainAsReplicatedWithShardedParameters) {
  NEED_GPUS_AND_NCCL(2);
  RankWorld w(2);
  ASSERT_TRUE(w.ok());
  // The replicated run twice around the sharded one: the first also allocates the workspaces the
  // contexts keep (GEMM, ...), so that neither measured run counts them.
  const RunResult ref = train(w, false);
  const RunResult z = train(w, true);
  const RunResult ref2 = train(w, false);
  ASSERT_EQ(ref.params[0], ref.params[1]) << "the replicated ranks differ";
  EXPECT_EQ(z.params[0], z.params[1]) << "both ranks must gather the same parameters";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_close(z.losses[r], ref.losses[r], 1e-6, 1e-4, "losses");
    // f32: only summation orders differ (the reduce-scatter's, the norm's).
    expect_close(z.params[r], ref.params[0], 1e-6, 1e-4, "parameters");
  }
  // Every parameter's optimizer state lives on exactly one rank: the shards add up to the whole.
  EXPECT_EQ(z.state_bytes[0] + z.state_bytes[1], ref.state_bytes[0]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(z.state_bytes[r], ref.state_bytes[0] / 2 + ref.state_bytes[0] / 10) << "rank " << r;
    // Parameters (block shards + the ring of gathered blocks + whole non-block parameters), gradient
    // shards (consumed by the step) and optimizer state, against replicated parameters, optimizer
    // state and the data-parallel gradient buckets.
    std::printf("[ ZeRO-3  ] rank %d holds %lld bytes after training; replicated %lld\n", r,
                static_cast<long long>(z.held_bytes[r]), static_cast<long long>(ref2.held_bytes[r]));
    EXPECT_GT(z.held_bytes[r], 0);
    EXPECT_LT(z.held_bytes[r], ref2.held_bytes[r] * 3 / 4) << "rank " << r;
  }
}

// One rank: the shard is everything; training equals the plain optimizer on an unsharded model.
TEST(Zero3, OneRankTrainsAsThePlainOptimizer) {
  NEED_GPUS_AND_NCCL(1);
  RankWorld w(1);
  ASSERT_TRUE(w.ok());
  flame_ctx_t ctx = w.ctxs[0];
  std::vector<double> want, want_losses;
  {
    ModelHandle m;
    ParamsHandle params;
    ASSERT_TRUE(make_flux_model(ctx, 12345, m, params));
    int64_t n = 0;
    const flame_tensor_t* ps = nullptr;
    FLAME_ASSERT_OK(flame_params_count(params.p, &n));
    FLAME_ASSERT_OK(flame_params_tensors(params.p, &ps));
    flame_optimizer_t opt = make_flux_adamw(ctx, params.p);
    ASSERT_NE(opt, nullptr);
    for (int s = 0; s < kSteps; ++s) {
      double loss = NAN;
      FLAME_ASSERT_OK(forward_backward(ctx, m.m, 0, s, &loss));
      want_losses.push_back(loss);
      FLAME_ASSERT_OK(flame_clip_grad_norm(ctx, ps, n, kMaxNorm, 2.0, 0, nullptr));
      FLAME_ASSERT_OK(flame_optimizer_step(opt));
      FLAME_ASSERT_OK(flame_optimizer_zero_grad(opt, 1));
    }
    want = values_of(params.p);
    flame_optimizer_release(opt);
  }
  ModelHandle m;
  ASSERT_EQ(flame_model_create(ctx, "FluxTransformer2DModel", kFlux, nullptr, &m.m), FLAME_OK);
  fill_flux_params(m.m, 12345);
  ParamsHandle params;
  FLAME_ASSERT_OK(flame_model_params(m.m, &params.p));
  flame_optimizer_t opt = make_flux_adamw(ctx, params.p);
  ASSERT_NE(opt, nullptr);
  FLAME_ASSERT_OK(learning_forward(ctx, m.m));
  flame_zero_options_t o;
  FLAME_ASSERT_OK(flame_zero_options_init(&o));
  o.stage = 3;
  o.model = m.m;
  o.max_grad_norm = kMaxNorm;
  flame_zero_t zero = nullptr;
  FLAME_ASSERT_OK(flame_zero_create(w.comms[0], opt, &o, &zero));
  // No checkpointing asked for: sharded blocks run checkpointed anyway.
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    double loss = NAN;
    FLAME_ASSERT_OK(forward_backward(ctx, m.m, 0, s, &loss));
    losses.push_back(loss);
    T norm;
    FLAME_ASSERT_OK(flame_zero_step(zero, norm.out()));
    double nv = 0;
    FLAME_ASSERT_OK(flame_tensor_item(norm, &nv));
    EXPECT_GT(nv, 0.0);
    FLAME_ASSERT_OK(flame_optimizer_zero_grad(opt, 1));
  }
  expect_close(losses, want_losses, 1e-6, 1e-5, "losses");
  ParamsHandle whole;
  FLAME_ASSERT_OK(flame_zero_gather_params(zero, &whole.p));
  expect_close(values_of(whole.p), want, 1e-6, 1e-5, "parameters");

  // A sharded parameter keeps its geometry but holds no values: data use fails, metadata works.
  flame_tensor_t q = nullptr;
  FLAME_ASSERT_OK(flame_params_find(params.p, "transformer_blocks.0.attn.to_q.weight", &q));
  ASSERT_NE(q, nullptr);
  int64_t dims[2] = {0, 0};
  FLAME_ASSERT_OK(flame_tensor_shape(q, dims, 2));
  EXPECT_EQ(dims[0], 32);
  EXPECT_EQ(dims[1], 32);
  int32_t rg = 0;
  FLAME_ASSERT_OK(flame_tensor_requires_grad(q, &rg));
  EXPECT_EQ(rg, 1);
  T sum;
  EXPECT_EQ(flame_add(q, q, sum.out()), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sum.h, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("sharded"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(flame_model_save(m.m, "/nonexistent/never-written.safetensors", nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  // Parameters read outside blocks stay whole and readable.
  flame_tensor_t x_embedder = nullptr;
  FLAME_ASSERT_OK(flame_params_find(params.p, "x_embedder.weight", &x_embedder));
  ASSERT_NE(x_embedder, nullptr);
  T doubled;
  FLAME_ASSERT_OK(flame_add(x_embedder, x_embedder, doubled.out()));
  // A second helper on the same model is refused.
  flame_optimizer_options_t oo;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_SGD));
  flame_optimizer_t opt2 = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &oo, &x_embedder, 1, &opt2));
  flame_zero_t zero2 = nullptr;
  EXPECT_EQ(flame_zero_create(w.comms[0], opt2, &o, &zero2), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zero2, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("sharded already"), std::string::npos) << flame_last_error_message();
  flame_optimizer_release(opt2);
  flame_zero_release(zero);
  // The model stays sharded after the helper goes: forwards still gather.
  double loss = NAN;
  FLAME_ASSERT_OK(forward_backward(ctx, m.m, 0, 0, &loss));
  EXPECT_TRUE(std::isfinite(loss));
  flame_optimizer_release(opt);
}

// Bad input: clear errors, nothing changed (the model still trains unsharded afterwards).
TEST(Zero3, BadInputFailsAndChangesNothing) {
  NEED_GPUS_AND_NCCL(1);
  RankWorld w(1);
  ASSERT_TRUE(w.ok());
  flame_ctx_t ctx = w.ctxs[0];
  ModelHandle m;
  ASSERT_EQ(flame_model_create(ctx, "FluxTransformer2DModel", kFlux, nullptr, &m.m), FLAME_OK);
  ParamsHandle params;
  FLAME_ASSERT_OK(flame_model_params(m.m, &params.p));
  flame_optimizer_t opt = make_flux_adamw(ctx, params.p);
  ASSERT_NE(opt, nullptr);
  flame_zero_options_t o;
  FLAME_ASSERT_OK(flame_zero_options_init(&o));
  flame_zero_t z = reinterpret_cast<flame_zero_t>(static_cast<uintptr_t>(0x40));
  o.stage = 3;  // no model
  EXPECT_EQ(flame_zero_create(w.comms[0], opt, &o, &z), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(z, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("opts->model"), std::string::npos) << flame_last_error_message();
  o.stage = 2;  // a model without stage 3
  o.model = m.m;
  EXPECT_EQ(flame_zero_create(w.comms[0], opt, &o, &z), FLAME_ERROR_INVALID_ARGUMENT);
  o.stage = 3;
  o.gather_slots = 1;
  EXPECT_EQ(flame_zero_create(w.comms[0], opt, &o, &z), FLAME_ERROR_INVALID_ARGUMENT);
  o.gather_slots = 2;
  // The model has not run a forward: it does not know its blocks yet.
  EXPECT_EQ(flame_zero_create(w.comms[0], opt, &o, &z), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("forward"), std::string::npos) << flame_last_error_message();
  // A model made with "offload" is refused.
  ModelHandle off;
  ASSERT_EQ(flame_model_create(ctx, "FluxTransformer2DModel", kFlux, R"({"offload": {"budget_fraction": 1.0}})", &off.m),
            FLAME_OK);
  FLAME_ASSERT_OK(learning_forward(ctx, off.m));
  o.model = off.m;
  EXPECT_EQ(flame_zero_create(w.comms[0], opt, &o, &z), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("offload"), std::string::npos) << flame_last_error_message();
  // Nothing changed: the optimizer steps unsharded and the parameters are readable.
  double loss = NAN;
  FLAME_ASSERT_OK(forward_backward(ctx, m.m, 0, 0, &loss));
  FLAME_ASSERT_OK(flame_optimizer_step(opt));
  flame_tensor_t q = nullptr;
  FLAME_ASSERT_OK(flame_params_find(params.p, "transformer_blocks.0.attn.to_q.weight", &q));
  T twice;
  FLAME_ASSERT_OK(flame_add(q, q, twice.out()));
  // gather_params needs a stage-3 helper.
  flame_zero_options_t o1;
  FLAME_ASSERT_OK(flame_zero_options_init(&o1));
  flame_optimizer_t opt1 = make_flux_adamw(ctx, params.p);
  flame_zero_t z1 = nullptr;
  FLAME_ASSERT_OK(flame_zero_create(w.comms[0], opt1, &o1, &z1));
  flame_params_t got = reinterpret_cast<flame_params_t>(static_cast<uintptr_t>(0x40));
  EXPECT_EQ(flame_zero_gather_params(z1, &got), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(got, nullptr);
  flame_zero_release(z1);
  flame_optimizer_release(opt1);
  flame_optimizer_release(opt);
}
