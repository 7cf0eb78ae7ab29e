// Mixed precision of ZeRO's communication (flame_zero_options_t reduce_dtype, gather_dtype).
//
// The runs use SGD without momentum, so that a parameter's change is lr times the sum of its
// averaged gradients and the effect of rounding a gradient is bounded: bf16 keeps 8 significant
// bits (unit roundoff 2^-8), so a gradient averaged in bf16 differs from the f32 one by at most
// 2^-8 of the largest gradient (per rank, and once more for the sum), and the parameters after the
// steps by at most that fraction of the largest change any parameter made (plus the second-order
// effect of the changed parameters on later gradients). The checks allow kReduceFraction = 2^-6 of
// that change for bf16 reduction and kGatherFraction = 2^-4 for bf16 gathering (the forward then
// computes with weights rounded to bf16, whose error passes through every layer), and require the
// runs NOT to be bit-identical: the option took effect.
//
//  - One rank (one GPU): bf16 reduction at stages 1, 2 and 3 against the same run with the default
//    (f32 for f32 parameters): it still rounds the gradient (stage 1's .grad after the step holds
//    bf16 values); bf16 gathering at stage 3; f32 reduction of bf16 parameters on one rank is
//    lossless (bit-identical to the default).
//  - Two ranks: bf16 reduction at stages 1, 2 and 3 and bf16 gathering at stage 3 against the
//    replicated run (one context, the same global batch, the plain optimizer). They skip with fewer
//    than 2 GPUs unless FLAME_REQUIRE_GPUS=2 (then they fail).
//
//   FLAME_REQUIRE_GPU=1 ./build/tests/gpu/flame_gpu_tests --gtest_filter='ZeroCommDtype.OneRank*'
//   FLAME_REQUIRE_GPU=1 FLAME_REQUIRE_GPUS=2 ./build/tests/gpu/flame_gpu_tests --gtest_filter='ZeroCommDtype.*'
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>
#include "flame_test.h"
#include "model_test_handles.h"
#include "rank_test_helpers.h"
#include "zero_test_helpers.h"

namespace {

constexpr int kSteps = 3;
constexpr double kLr = 0.05;
constexpr double kReduceFraction = 1.0 / 64;  // 4 x bf16's unit roundoff 2^-8
constexpr double kGatherFraction = 1.0 / 16;  // 16 x 2^-8: rounded weights through every layer

flame_optimizer_t make_sgd(flame_ctx_t ctx, const flame_tensor_t* params, int64_t n, bool master_weights) {
  flame_optimizer_options_t o;
  flame_optimizer_options_init(&o, FLAME_OPTIMIZER_SGD);
  o.lr = kLr;
  o.master_weights = master_weights ? 1 : 0;
  flame_optimizer_t opt = nullptr;
  EXPECT_EQ(flame_optimizer_create(ctx, &o, params, n, &opt), FLAME_OK) << flame_last_error_message();
  return opt;
}

// got within fraction of the largest change of any parameter of the reference run (want - start)
// of want, element by element, and not bit-identical to it.
void expect_rounded_not_identical(const std::vector<double>& got, const std::vector<double>& want,
                                  const std::vector<double>& start, double fraction, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(start.size(), want.size()) << what;
  double moved = 0, largest = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    moved = std::max(moved, std::fabs(want[k] - start[k]));
    largest = std::max(largest, std::fabs(want[k]));
  }
  ASSERT_GT(moved, 0.0) << what << ": the reference run did not train";
  const double tol = fraction * moved + 1e-6 * largest;  // + f32 rounding of the values themselves
  int bad = 0;
  double worst = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    const double d = std::fabs(got[k] - want[k]);
    worst = std::max(worst, d);
    if (d > tol && bad++ < 5)
      ADD_FAILURE() << what << ": element " << k << " is " << got[k] << ", expected " << want[k] << " within " << tol;
  }
  EXPECT_NE(got, want) << what << ": bit-identical to the reference, so the communication dtype took no effect";
  std::printf("[ZeroCommDtype] %s: largest difference %.3g (%.3g of the largest change %.3g; allowed %.3g)\n",
              what.c_str(), worst, worst / moved, moved, fraction);
}

// ---- a small MLP for stages 1 and 2 (Mlp, zero_test_helpers.h) ----

// Whether every value of t is a bf16 value (t rounded to bf16 and back is t).
bool holds_bf16_values(flame_tensor_t t) {
  T rounded;
  if (flame_to_dtype(t, FLAME_DTYPE_BF16, rounded.out()) != FLAME_OK) return false;
  return to_doubles(rounded) == to_doubles(t);
}

struct MlpRun {
  std::vector<double> start, end;  // rank 0's parameters before and after kSteps steps
  bool grads_bf16 = false;         // stage 1: every .grad after the last step holds bf16 values
};

// kSteps steps of the global batch (2 parts) with ZeRO `stage` over `world` ranks (1 or 2) and
// reduce_dtype; on one rank both parts as two backwards of half the loss each.
MlpRun train_mlp_sharded(int world, int stage, int32_t reduce_dtype, flame_dtype_t d) {
  MlpRun out;
  RankWorld w(world);
  EXPECT_TRUE(w.ok());
  if (!w.ok()) return out;
  on_ranks(world, [&](int r) {
    flame_ctx_t ctx = w.ctxs[static_cast<size_t>(r)];
    Mlp m;
    ASSERT_TRUE(make_mlp(ctx, m, d));
    const std::vector<flame_tensor_t> ps = m.params();
    flame_optimizer_t opt = make_sgd(ctx, ps.data(), static_cast<int64_t>(ps.size()), d != FLAME_DTYPE_F32);
    ASSERT_NE(opt, nullptr);
    flame_zero_options_t o;
    flame_zero_options_init(&o);
    o.stage = stage;
    o.reduce_dtype = reduce_dtype;
    flame_zero_t zero = nullptr;
    ASSERT_EQ(flame_zero_create(w.comms[static_cast<size_t>(r)], opt, &o, &zero), FLAME_OK) << flame_last_error_message();
    if (r == 0) out.start = mlp_values(m);
    for (int s = 0; s < kSteps; ++s) {
      if (world == 2) {
        EXPECT_EQ(mlp_backward(ctx, m, d, r, s, 1.0), FLAME_OK) << flame_last_error_message();
      } else {
        for (int part = 0; part < 2; ++part) EXPECT_EQ(mlp_backward(ctx, m, d, part, s, 0.5), FLAME_OK) << flame_last_error_message();
      }
      EXPECT_EQ(flame_zero_step(zero, nullptr), FLAME_OK) << flame_last_error_message();
      if (s + 1 == kSteps && stage == 1 && r == 0) {  // .grad: the average, as it was communicated
        out.grads_bf16 = true;
        for (flame_tensor_t p : ps) {
          T g;
          EXPECT_EQ(flame_tensor_grad(p, g.out()), FLAME_OK);
          out.grads_bf16 = out.grads_bf16 && g.h && holds_bf16_values(g);
        }
      }
      EXPECT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
    }
    if (r == 0) out.end = mlp_values(m);
    flame_zero_release(zero);
    flame_optimizer_release(opt);
  });
  return out;
}

// The replicated reference: one context, the same global batch, the plain optimizer.
std::vector<double> train_mlp_replicated() {
  std::vector<double> end;
  flame_ctx_t ctx = make_rank_ctx(0);
  EXPECT_NE(ctx, nullptr);
  if (!ctx) return end;
  {
    Mlp m;
    EXPECT_TRUE(make_mlp(ctx, m, FLAME_DTYPE_F32));
    const std::vector<flame_tensor_t> ps = m.params();
    flame_optimizer_t opt = make_sgd(ctx, ps.data(), static_cast<int64_t>(ps.size()), false);
    for (int s = 0; s < kSteps && opt; ++s) {
      for (int part = 0; part < 2; ++part) EXPECT_EQ(mlp_backward(ctx, m, FLAME_DTYPE_F32, part, s, 0.5), FLAME_OK);
      EXPECT_EQ(flame_optimizer_step(opt), FLAME_OK) << flame_last_error_message();
      EXPECT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
    }
    end = mlp_values(m);
    flame_optimizer_release(opt);
  }
  flame_ctx_destroy(ctx);
  return end;
}

// ---- a tiny Flux transformer for stage 3 (f32; 6 sharded blocks, kFlux, zero_test_helpers.h) ----

struct FluxRun {
  std::vector<double> start, end;  // rank 0's whole parameters before and after kSteps steps
};

// world ranks, stage 3 with the given dtypes (sharded), or one context with the plain optimizer
// (world 0: the replicated reference). The same global batch of 2 parts either way.
FluxRun train_flux(int world, int32_t reduce_dtype, int32_t gather_dtype) {
  FluxRun out;
  const bool sharded = world > 0;
  RankWorld w(sharded ? world : 1);
  EXPECT_TRUE(w.ok());
  if (!w.ok()) return out;
  on_ranks(sharded ? world : 1, [&](int r) {
    flame_ctx_t ctx = w.ctxs[static_cast<size_t>(r)];
    ModelHandle m;
    ParamsHandle params;
    ASSERT_TRUE(make_flux_model(ctx, 12345, m, params));
    if (r == 0) out.start = values_of(params.p);
    const flame_tensor_t* ts = nullptr;
    int64_t n = 0;
    ASSERT_EQ(flame_params_count(params.p, &n), FLAME_OK);
    ASSERT_EQ(flame_params_tensors(params.p, &ts), FLAME_OK);
    flame_optimizer_t opt = make_sgd(ctx, ts, n, false);
    ASSERT_NE(opt, nullptr);
    flame_zero_t zero = nullptr;
    if (sharded) {
      ASSERT_EQ(learning_forward(ctx, m.m), FLAME_OK) << flame_last_error_message();
      flame_zero_options_t o;
      flame_zero_options_init(&o);
      o.stage = 3;
      o.model = m.m;
      o.reduce_dtype = reduce_dtype;
      o.gather_dtype = gather_dtype;
      ASSERT_EQ(flame_zero_create(w.comms[static_cast<size_t>(r)], opt, &o, &zero), FLAME_OK) << flame_last_error_message();
    }
    for (int s = 0; s < kSteps; ++s) {
      if (world == 2) {
        EXPECT_EQ(flux_backward(ctx, m.m, r, s, 1.0), FLAME_OK) << flame_last_error_message();
      } else {
        for (int part = 0; part < 2; ++part) EXPECT_EQ(flux_backward(ctx, m.m, part, s, 0.5), FLAME_OK) << flame_last_error_message();
      }
      if (zero) {
        EXPECT_EQ(flame_zero_step(zero, nullptr), FLAME_OK) << flame_last_error_message();
      } else {
        EXPECT_EQ(flame_optimizer_step(opt), FLAME_OK) << flame_last_error_message();
      }
      EXPECT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
    }
    if (zero) {
      ParamsHandle whole;
      EXPECT_EQ(flame_zero_gather_params(zero, &whole.p), FLAME_OK) << flame_last_error_message();
      if (r == 0 && whole.p) out.end = values_of(whole.p);
    } else if (r == 0) {
      out.end = values_of(params.p);
    }
    flame_zero_release(zero);
    flame_optimizer_release(opt);
  });
  return out;
}

}  // namespace

// One rank: bf16 reduction of f32 gradients still rounds them (nothing is summed, but the cast
// is made): stages 1 and 2 end within the bf16 bound of the default run and not equal to it, and
// stage 1's .grad holds the bf16-rounded average.
TEST(ZeroCommDtype, OneRankBf16ReduceRoundsTheGradient) {
  NEED_GPUS_AND_NCCL(1);
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const MlpRun f32 = train_mlp_sharded(1, stage, FLAME_ZERO_PARAM_DTYPE, FLAME_DTYPE_F32);
    const MlpRun bf16 = train_mlp_sharded(1, stage, FLAME_DTYPE_BF16, FLAME_DTYPE_F32);
    ASSERT_FALSE(f32.end.empty());
    ASSERT_FALSE(bf16.end.empty());
    EXPECT_EQ(bf16.start, f32.start);
    expect_rounded_not_identical(bf16.end, f32.end, f32.start, kReduceFraction,
                                 "stage " + std::to_string(stage) + ", 1 rank, bf16 reduce vs f32");
    if (stage == 1) {
      EXPECT_TRUE(bf16.grads_bf16) << "stage 1's .grad is the average as communicated: bf16 values";
      EXPECT_FALSE(f32.grads_bf16) << "the f32 average holds values bf16 cannot (else the check above proves nothing)";
    }
  }
}

// One rank, bf16 parameters (f32 master weights): reducing in f32 casts bf16 -> f32 -> bf16, which
// is exact: the run is bit-identical to the default one, at stages 1 and 2.
TEST(ZeroCommDtype, OneRankF32ReduceOfBf16ParametersIsLossless) {
  NEED_GPUS_AND_NCCL(1);
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const MlpRun def = train_mlp_sharded(1, stage, FLAME_ZERO_PARAM_DTYPE, FLAME_DTYPE_BF16);
    const MlpRun f32 = train_mlp_sharded(1, stage, FLAME_DTYPE_F32, FLAME_DTYPE_BF16);
    ASSERT_FALSE(def.end.empty());
    EXPECT_NE(def.end, def.start) << "the run trained";
    EXPECT_EQ(f32.end, def.end);
  }
}

// One rank, stage 3: bf16 reduction and bf16 gathering each end within their bound of the default
// (f32) run and not equal to it; both together as well.
TEST(ZeroCommDtype, OneRankStage3Bf16ReduceAndGather) {
  NEED_GPUS_AND_NCCL(1);
  const FluxRun f32 = train_flux(1, FLAME_ZERO_PARAM_DTYPE, FLAME_ZERO_PARAM_DTYPE);
  ASSERT_FALSE(f32.end.empty());
  const FluxRun reduce = train_flux(1, FLAME_DTYPE_BF16, FLAME_ZERO_PARAM_DTYPE);
  const FluxRun gather = train_flux(1, FLAME_ZERO_PARAM_DTYPE, FLAME_DTYPE_BF16);
  const FluxRun both = train_flux(1, FLAME_DTYPE_BF16, FLAME_DTYPE_BF16);
  expect_rounded_not_identical(reduce.end, f32.end, f32.start, kReduceFraction, "stage 3, 1 rank, bf16 reduce vs f32");
  expect_rounded_not_identical(gather.end, f32.end, f32.start, kGatherFraction, "stage 3, 1 rank, bf16 gather vs f32");
  expect_rounded_not_identical(both.end, f32.end, f32.start, kGatherFraction + kReduceFraction,
                               "stage 3, 1 rank, bf16 reduce and gather vs f32");
}

// Two ranks, stages 1 and 2: bf16 reduction against the replicated run.
TEST(ZeroCommDtype, TwoRanksBf16ReduceAgainstReplicated) {
  NEED_GPUS_AND_NCCL(2);
  const std::vector<double> replicated = train_mlp_replicated();
  ASSERT_FALSE(replicated.empty());
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const MlpRun bf16 = train_mlp_sharded(2, stage, FLAME_DTYPE_BF16, FLAME_DTYPE_F32);
    ASSERT_FALSE(bf16.end.empty());
    expect_rounded_not_identical(bf16.end, replicated, bf16.start, kReduceFraction,
                                 "stage " + std::to_string(stage) + ", 2 ranks, bf16 reduce vs replicated");
    if (stage == 1) {
      EXPECT_TRUE(bf16.grads_bf16) << "stage 1's .grad is the bf16 average";
    }
  }
}

// Two ranks, stage 3: bf16 reduction, bf16 gathering, both, against the replicated run.
TEST(ZeroCommDtype, TwoRanksStage3Bf16ReduceAndGatherAgainstReplicated) {
  NEED_GPUS_AND_NCCL(2);
  const FluxRun replicated = train_flux(0, FLAME_ZERO_PARAM_DTYPE, FLAME_ZERO_PARAM_DTYPE);
  ASSERT_FALSE(replicated.end.empty());
  const FluxRun reduce = train_flux(2, FLAME_DTYPE_BF16, FLAME_ZERO_PARAM_DTYPE);
  const FluxRun gather = train_flux(2, FLAME_ZERO_PARAM_DTYPE, FLAME_DTYPE_BF16);
  const FluxRun both = train_flux(2, FLAME_DTYPE_BF16, FLAME_DTYPE_BF16);
  expect_rounded_not_identical(reduce.end, replicated.end, replicated.start, kReduceFraction,
                               "stage 3, 2 ranks, bf16 reduce vs replicated");
  expect_rounded_not_identical(gather.end, replicated.end, replicated.start, kGatherFraction,
                               "stage 3, 2 ranks, bf16 gather vs replicated");
  expect_rounded_not_identical(both.end, replicated.end, replicated.start, kGatherFraction + kReduceFraction,
                               "stage 3, 2 ranks, bf16 reduce and gather vs replicated");
}
