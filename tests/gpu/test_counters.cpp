// flame_ctx_counters / flame_ctx_reset_counters: the counts of work a context issues from the host.
// Each test warms its calls up first (kernel loads, GEMM autotuning, first allocations), resets the
// counters, makes the call once and checks the exact counts flame.h documents: an add is one launch
// and no sync, a copy to the host one copy and one sync, a bf16 -> f32 conversion one cast, a matmul
// one launch; work recorded in a capture counts as it is captured, and a replay counts as one launch.
#include <cstring>
#include <vector>
#include "flame_test.h"

namespace {

class Counters : public GpuTest {
 protected:
  flame_ctx_counters_t read() {
    flame_ctx_counters_t c;
    std::memset(&c, 0xab, sizeof c);
    c.struct_size = sizeof c;
    EXPECT_EQ(flame_ctx_counters(ctx, &c), FLAME_OK) << flame_last_error_message();
    return c;
  }
  T ones(std::vector<int64_t> shape, flame_dtype_t dtype) {
    T t;
    EXPECT_EQ(flame_ones(ctx, shape.data(), static_cast<int32_t>(shape.size()), dtype, t.out()), FLAME_OK)
        << flame_last_error_message();
    return t;
  }
};

TEST_F(Counters, AddIsOneLaunchAndNoSync) {
  T a = ones({4, 8}, FLAME_DTYPE_F32), b = ones({4, 8}, FLAME_DTYPE_F32);
  {
    T warm;
    FLAME_ASSERT_OK(flame_add(a, b, warm.out()));
  }
  FLAME_ASSERT_OK(flame_ctx_reset_counters(ctx));
  T y;
  FLAME_ASSERT_OK(flame_add(a, b, y.out()));
  const flame_ctx_counters_t c = read();
  EXPECT_EQ(c.struct_size, sizeof c) << "struct_size is left as the caller set it";
  EXPECT_EQ(c.launches, 1u);
  EXPECT_EQ(c.cast_kernels, 0u);
  EXPECT_EQ(c.host_syncs, 0u);
  EXPECT_EQ(c.driver_allocations, 0u) << "the output reuses the warm-up's freed block";
}

TEST_F(Counters, CopyToHostIsOneCopyAndOneSync) {
  T a = ones({4, 8}, FLAME_DTYPE_F32);
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  FLAME_ASSERT_OK(flame_ctx_reset_counters(ctx));
  std::vector<float> host(32);
  FLAME_ASSERT_OK(flame_to_host(a, host.data(), host.size() * sizeof(float)));
  EXPECT_EQ(host[31], 1.0f);
  flame_ctx_counters_t c = read();
  EXPECT_EQ(c.launches, 1u) << "one device-to-host copy";
  EXPECT_EQ(c.host_syncs, 1u);
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  c = read();
  EXPECT_EQ(c.launches, 1u);
  EXPECT_EQ(c.host_syncs, 2u) << "flame_ctx_synchronize is a sync too";
}

TEST_F(Counters, Bf16ToF32IsOneCast) {
  T a = ones({4, 8}, FLAME_DTYPE_BF16);
  {
    T warm;
    FLAME_ASSERT_OK(flame_to_dtype(a, FLAME_DTYPE_F32, warm.out()));
  }
  FLAME_ASSERT_OK(flame_ctx_reset_counters(ctx));
  T f;
  FLAME_ASSERT_OK(flame_to_dtype(a, FLAME_DTYPE_F32, f.out()));
  flame_ctx_counters_t c = read();
  EXPECT_EQ(c.launches, 1u);
  EXPECT_EQ(c.cast_kernels, 1u);
  EXPECT_EQ(c.host_syncs, 0u);
  // A conversion to the tensor's own dtype launches nothing.
  T same;
  FLAME_ASSERT_OK(flame_to_dtype(a, FLAME_DTYPE_BF16, same.out()));
  c = read();
  EXPECT_EQ(c.launches, 1u);
  EXPECT_EQ(c.cast_kernels, 1u);
  // An add is not a cast.
  T s;
  FLAME_ASSERT_OK(flame_add(f, f, s.out()));
  c = read();
  EXPECT_EQ(c.launches, 2u);
  EXPECT_EQ(c.cast_kernels, 1u);
}

TEST_F(Counters, MatmulIsOneLaunch) {
  T a = ones({64, 32}, FLAME_DTYPE_BF16), b = ones({32, 48}, FLAME_DTYPE_BF16);
  {
    T warm;  // the first product of a shape autotunes (several launches and a sync)
    FLAME_ASSERT_OK(flame_matmul(a, b, warm.out()));
    FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  }
  FLAME_ASSERT_OK(flame_ctx_reset_counters(ctx));
  T y;
  FLAME_ASSERT_OK(flame_matmul(a, b, y.out()));
  const flame_ctx_counters_t c = read();
  EXPECT_EQ(c.launches, 1u);
  EXPECT_EQ(c.cast_kernels, 0u);
  EXPECT_EQ(c.host_syncs, 0u);
}

TEST_F(Counters, ResetZeroesEveryCount) {
  const int64_t big = 1 << 22;  // 16 MiB of f32: above the small-block free lists, from the driver's pool
  T e;
  FLAME_ASSERT_OK(flame_empty(ctx, &big, 1, FLAME_DTYPE_F32, e.out()));
  T a = ones({4}, FLAME_DTYPE_BF16), f;
  FLAME_ASSERT_OK(flame_to_dtype(a, FLAME_DTYPE_F32, f.out()));
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  flame_ctx_counters_t c = read();
  EXPECT_GE(c.launches, 2u);
  EXPECT_GE(c.cast_kernels, 1u);
  EXPECT_GE(c.host_syncs, 1u);
  EXPECT_GE(c.driver_allocations, 1u);
  FLAME_ASSERT_OK(flame_ctx_reset_counters(ctx));
  c = read();
  EXPECT_EQ(c.launches, 0u);
  EXPECT_EQ(c.cast_kernels, 0u);
  EXPECT_EQ(c.host_syncs, 0u);
  EXPECT_EQ(c.driver_allocations, 0u);
  // A large block is asked of the driver each time (FLAME's free lists hold small blocks only).
  T e2;
  FLAME_ASSERT_OK(flame_empty(ctx, &big, 1, FLAME_DTYPE_F32, e2.out()));
  EXPECT_EQ(read().driver_allocations, 1u);
}

TEST_F(Counters, CaptureCountsAsCapturedAndReplayIsOneLaunch) {
  T a = ones({4, 8}, FLAME_DTYPE_F32), b = ones({4, 8}, FLAME_DTYPE_F32);
  {
    T warm;
    FLAME_ASSERT_OK(flame_add(a, b, warm.out()));
    FLAME_ASSERT_OK(flame_mul(a, b, warm.out()));
  }
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  FLAME_ASSERT_OK(flame_ctx_reset_counters(ctx));
  T s, p;
  flame_status_t st1 = flame_add(a, b, s.out());
  flame_status_t st2 = flame_mul(s, b, p.out());
  flame_ctx_counters_t c;
  c.struct_size = sizeof c;
  flame_status_t read_st = flame_ctx_counters(ctx, &c);
  flame_graph_t g = nullptr;
  flame_status_t end = flame_graph_capture_end(ctx, &g);
  ASSERT_EQ(st1, FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(st2, FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(read_st, FLAME_OK) << "the counters can be read during a capture";
  ASSERT_EQ(end, FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(c.launches, 2u) << "two kernels recorded into the graph, counted as captured";
  EXPECT_EQ(c.host_syncs, 0u);
  FLAME_ASSERT_OK(flame_ctx_reset_counters(ctx));
  FLAME_ASSERT_OK(flame_graph_replay(g));
  FLAME_ASSERT_OK(flame_graph_replay(g));
  c = read();
  EXPECT_EQ(c.launches, 2u) << "each replay is one graph launch, whatever the graph holds";
  EXPECT_EQ(c.host_syncs, 0u);
  EXPECT_EQ(c.driver_allocations, 0u) << "a replay allocates nothing";
  std::vector<float> host(32);
  FLAME_ASSERT_OK(flame_to_host(p, host.data(), host.size() * sizeof(float)));
  EXPECT_EQ(host[0], 2.0f);
  flame_graph_release(g);
}

TEST_F(Counters, StructSizeRules) {
  flame_ctx_counters_t c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof(size_t);  // not even the first count
  FLAME_EXPECT_STATUS(flame_ctx_counters(ctx, &c), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(flame_last_error_message(), "struct_size"), nullptr) << flame_last_error_message();
  c.struct_size = 0;
  FLAME_EXPECT_STATUS(flame_ctx_counters(ctx, &c), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_counters(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_counters(nullptr, &c), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_reset_counters(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  // An older, shorter struct gets the fields it has and nothing past them.
  T a = ones({4}, FLAME_DTYPE_F32);
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  std::memset(&c, 0xab, sizeof c);
  c.struct_size = offsetof(flame_ctx_counters_t, cast_kernels);
  FLAME_ASSERT_OK(flame_ctx_counters(ctx, &c));
  EXPECT_EQ(c.struct_size, offsetof(flame_ctx_counters_t, cast_kernels));
  EXPECT_NE(c.launches, 0xababababababababull);
  EXPECT_EQ(c.cast_kernels, 0xababababababababull) << "cast_kernels lies past the caller's struct";
  EXPECT_EQ(c.driver_allocations, 0xababababababababull);
}

}  // namespace
