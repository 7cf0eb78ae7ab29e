// Context tests: device queries, options, memory statistics and the memory limit, several
// contexts (in one thread and in several threads), one context shared by threads, per-thread
// error messages, tensor reference counting and context lifetime.
//
// This file also registers a test environment that holds one context for the whole run, so that
// the device's primary CUDA context is not torn down and re-created between tests (each GpuTest
// creates and destroys its own FLAME context).
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

class KeepDeviceWarm : public ::testing::Environment {
 public:
  void SetUp() override {
    flame_ctx_options_t o;
    if (flame_ctx_options_init(&o) != FLAME_OK) return;
    if (flame_ctx_create(&o, &ctx_) != FLAME_OK) ctx_ = nullptr;  // no GPU: tests skip on their own
  }
  void TearDown() override {
    flame_ctx_destroy(ctx_);
    ctx_ = nullptr;
  }

 private:
  flame_ctx_t ctx_ = nullptr;
};
::testing::Environment* const kKeepDeviceWarm = ::testing::AddGlobalTestEnvironment(new KeepDeviceWarm);

flame_memory_stats_t stats_of(flame_ctx_t ctx) {
  flame_memory_stats_t s;
  std::memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  flame_status_t st = flame_ctx_memory_stats(ctx, &s);
  EXPECT_EQ(st, FLAME_OK) << flame_last_error_message();
  return s;
}

// Creates a context with options; skips like GpuTest does when there is no GPU.
flame_ctx_t make_ctx(const flame_ctx_options_t& o, std::string* why) {
  flame_ctx_t c = nullptr;
  flame_status_t st = flame_ctx_create(&o, &c);
  if (st != FLAME_OK) *why = std::string(flame_status_string(st)) + ": " + flame_last_error_message();
  return c;
}

class Context : public GpuTest {};

TEST_F(Context, DeviceQueries) {
  char name[256];
  std::memset(name, 'x', sizeof(name));
  FLAME_ASSERT_OK(flame_ctx_device_name(ctx, name, sizeof(name)));
  EXPECT_GT(std::strlen(name), 0u);
  EXPECT_LT(std::strlen(name), sizeof(name));
  char small[4];
  std::memset(small, 'x', sizeof(small));
  FLAME_ASSERT_OK(flame_ctx_device_name(ctx, small, sizeof(small)));
  EXPECT_LE(std::strlen(small), 3u) << "truncated and NUL-terminated";
  EXPECT_EQ(std::strncmp(small, name, std::strlen(small)), 0);
  FLAME_EXPECT_STATUS(flame_ctx_device_name(ctx, nullptr, 10), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_device_name(ctx, name, 0), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_device_name(nullptr, name, sizeof(name)), FLAME_ERROR_INVALID_ARGUMENT);

  int32_t major = -1, minor = -1;
  FLAME_ASSERT_OK(flame_ctx_compute_capability(ctx, &major, &minor));
  EXPECT_GE(major, 5);
  EXPECT_GE(minor, 0);
  EXPECT_LE(minor, 9);
  FLAME_EXPECT_STATUS(flame_ctx_compute_capability(ctx, nullptr, &minor), FLAME_ERROR_INVALID_ARGUMENT);

  void* stream = nullptr;
  FLAME_ASSERT_OK(flame_ctx_stream(ctx, &stream));
  EXPECT_NE(stream, nullptr);
  void* again = nullptr;
  FLAME_ASSERT_OK(flame_ctx_stream(ctx, &again));
  EXPECT_EQ(again, stream) << "one stream per context";
  FLAME_EXPECT_STATUS(flame_ctx_stream(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  int32_t count = 0;
  FLAME_ASSERT_OK(flame_device_count(&count));
  EXPECT_GE(count, 1);
  FLAME_EXPECT_STATUS(flame_device_count(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  FLAME_EXPECT_STATUS(flame_ctx_synchronize(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Context, CreateOptionsAndErrors) {
  FLAME_EXPECT_STATUS(flame_ctx_options_init(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_ctx_options_t o;
  std::memset(&o, 0x5A, sizeof(o));
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof(o));
  EXPECT_EQ(o.device, 0);
  EXPECT_EQ(o.seed, 0u);
  EXPECT_EQ(o.kernel_cache_dir, nullptr);
  EXPECT_EQ(o.memory_limit, 0u);
  EXPECT_EQ(o.allow_tf32, 0);
  EXPECT_EQ(o.gemm_heuristic_only, 0);

  flame_ctx_t c = reinterpret_cast<flame_ctx_t>(static_cast<uintptr_t>(0x10));
  flame_ctx_options_t bad = o;
  bad.struct_size = 0;
  FLAME_EXPECT_STATUS(flame_ctx_create(&bad, &c), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr) << "OUT handle must be NULL after a failure";
  int32_t count = 0;
  FLAME_ASSERT_OK(flame_device_count(&count));
  bad = o;
  bad.device = count;
  c = reinterpret_cast<flame_ctx_t>(static_cast<uintptr_t>(0x10));
  FLAME_EXPECT_STATUS(flame_ctx_create(&bad, &c), FLAME_ERROR_NO_DEVICE);
  EXPECT_EQ(c, nullptr);
  bad.device = -1;
  EXPECT_NE(flame_ctx_create(&bad, &c), FLAME_OK);
  EXPECT_EQ(c, nullptr);
  FLAME_EXPECT_STATUS(flame_ctx_create(&o, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_ctx_destroy(nullptr);  // no-op

  // NULL options: defaults
  flame_ctx_t d = nullptr;
  FLAME_ASSERT_OK(flame_ctx_create(nullptr, &d));
  uint64_t seed = 1, off = 1;
  FLAME_ASSERT_OK(flame_ctx_get_rng_state(d, &seed, &off));
  EXPECT_EQ(seed, 0u);
  flame_ctx_destroy(d);

  // an older, shorter options struct (without allow_tf32) is accepted
  flame_ctx_options_t shorter = o;
  shorter.struct_size = offsetof(flame_ctx_options_t, allow_tf32);
  shorter.seed = 77;
  FLAME_ASSERT_OK(flame_ctx_create(&shorter, &d));
  FLAME_ASSERT_OK(flame_ctx_get_rng_state(d, &seed, &off));
  EXPECT_EQ(seed, 77u);
  flame_ctx_destroy(d);
}

TEST_F(Context, KernelCacheDisabled) {
  flame_ctx_options_t o;
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  o.kernel_cache_dir = "";
  std::string why;
  flame_ctx_t c = make_ctx(o, &why);
  ASSERT_NE(c, nullptr) << why;
  {
    HREF_RNG(rng);
    HT a = random(rng, {1000}, FLAME_DTYPE_F32, Domain()), b = random(rng, {1000}, FLAME_DTYPE_F32, Domain());
    T ta = upload(c, a), tb = upload(c, b), s;
    FLAME_ASSERT_OK(flame_mul(ta, tb, s.out()));
    EXPECT_TRUE(matches(s, map2(a, b, FLAME_DTYPE_F32, [](double x, double y) { return x * y; })));
  }
  flame_ctx_destroy(c);
}

TEST_F(Context, SetErrorMessage) {
  flame_set_error_message("custom text from a hook");
  EXPECT_STREQ(flame_last_error_message(), "custom text from a hook");
  flame_set_error_message(nullptr);
  EXPECT_STREQ(flame_last_error_message(), "");
  T t;
  const int64_t s[] = {-1};
  EXPECT_NE(flame_zeros(ctx, s, 1, FLAME_DTYPE_F32, t.out()), FLAME_OK);
  EXPECT_NE(std::string(flame_last_error_message()).find("zeros"), std::string::npos)
      << "the message names the function: " << flame_last_error_message();
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  EXPECT_STREQ(flame_last_error_message(), "");
}

// ---------------------------------------------------------------------------------------------
// memory statistics

TEST_F(Context, MemoryStats) {
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  const flame_memory_stats_t base = stats_of(ctx);
  EXPECT_GE(base.bytes_reserved, base.bytes_in_use);
  EXPECT_GE(base.peak_bytes_in_use, base.bytes_in_use);
  const uint64_t mib4 = 4u << 20;
  {
    const int64_t n = 1 << 20;  // 4 MiB of f32
    T a, b;
    FLAME_ASSERT_OK(flame_zeros(ctx, &n, 1, FLAME_DTYPE_F32, a.out()));
    flame_memory_stats_t s1 = stats_of(ctx);
    EXPECT_GE(s1.bytes_in_use, base.bytes_in_use + mib4);
    EXPECT_GE(s1.peak_bytes_in_use, s1.bytes_in_use);
    EXPECT_GE(s1.bytes_reserved, s1.bytes_in_use);
    EXPECT_EQ(s1.live_tensors, base.live_tensors + 1);
    FLAME_ASSERT_OK(flame_ones(ctx, &n, 1, FLAME_DTYPE_F32, b.out()));
    flame_memory_stats_t s2 = stats_of(ctx);
    EXPECT_GE(s2.bytes_in_use, base.bytes_in_use + 2 * mib4);
    EXPECT_EQ(s2.live_tensors, base.live_tensors + 2);
    // views allocate nothing
    T v;
    const int64_t shp[] = {1024, 1024};
    FLAME_ASSERT_OK(flame_view(a, shp, 2, v.out()));
    T vt;
    FLAME_ASSERT_OK(flame_transpose(v, 0, 1, vt.out()));
    flame_memory_stats_t s3 = stats_of(ctx);
    EXPECT_EQ(s3.bytes_in_use, s2.bytes_in_use) << "views must not allocate";
    EXPECT_EQ(s3.live_tensors, base.live_tensors + 4);
    // ops with workspaces
    T c, sum, big;
    FLAME_ASSERT_OK(flame_add(a, b, c.out()));
    FLAME_ASSERT_OK(flame_sum_all(vt, sum.out()));
    FLAME_ASSERT_OK(flame_cumsum(vt, 0, big.out()));
    EXPECT_EQ(item(sum), 0.0);
    flame_memory_stats_t s4 = stats_of(ctx);
    EXPECT_GE(s4.peak_bytes_in_use, base.bytes_in_use + 4 * mib4);
    // release the big ones: peak stays, in-use drops; reset_peak brings peak down to in-use
    c = T();
    big = T();
    flame_memory_stats_t s5 = stats_of(ctx);
    EXPECT_LT(s5.bytes_in_use, s4.bytes_in_use);
    EXPECT_GE(s5.peak_bytes_in_use, s4.peak_bytes_in_use);
    FLAME_ASSERT_OK(flame_ctx_reset_peak_memory(ctx));
    flame_memory_stats_t s6 = stats_of(ctx);
    EXPECT_EQ(s6.peak_bytes_in_use, s6.bytes_in_use);
    T d;
    FLAME_ASSERT_OK(flame_zeros(ctx, &n, 1, FLAME_DTYPE_F64, d.out()));
    flame_memory_stats_t s7 = stats_of(ctx);
    EXPECT_GE(s7.peak_bytes_in_use, s6.bytes_in_use + 2 * mib4);
  }
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  flame_memory_stats_t end = stats_of(ctx);
  EXPECT_EQ(end.bytes_in_use, base.bytes_in_use) << "memory returns to the baseline when every tensor is released";
  EXPECT_EQ(end.live_tensors, base.live_tensors);
  FLAME_EXPECT_STATUS(flame_ctx_memory_stats(ctx, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_memory_stats(nullptr, &end), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_ctx_reset_peak_memory(nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Context, MemoryLimit) {
  flame_ctx_options_t o;
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  const uint64_t limit = 64u << 20;
  o.memory_limit = limit;
  std::string why;
  flame_ctx_t c = make_ctx(o, &why);
  ASSERT_NE(c, nullptr) << why;
  {
    HREF_RNG(rng);
    const int64_t n16 = 4 << 20, n40 = 10 << 20, n128 = 32 << 20;  // f32 elements: 16, 40, 128 MiB
    T a, b;
    FLAME_ASSERT_OK(flame_zeros(c, &n16, 1, FLAME_DTYPE_F32, a.out()));
    flame_tensor_t bad;
    HREF_EXPECT_FAIL(FLAME_ERROR_OUT_OF_MEMORY, bad, flame_zeros(c, &n128, 1, FLAME_DTYPE_F32, &bad));
    EXPECT_STRNE(flame_last_error_message(), "");
    FLAME_ASSERT_OK(flame_ones(c, &n40, 1, FLAME_DTYPE_F32, b.out()));  // 56 MiB in use
    HREF_EXPECT_FAIL(FLAME_ERROR_OUT_OF_MEMORY, bad, flame_zeros(c, &n16, 1, FLAME_DTYPE_F32, &bad));
    HREF_EXPECT_FAIL(FLAME_ERROR_OUT_OF_MEMORY, bad, flame_add_scalar(b, 1.0, &bad));  // its output would not fit
    flame_memory_stats_t s = stats_of(c);
    EXPECT_LE(s.bytes_in_use, limit);
    EXPECT_LE(s.peak_bytes_in_use, limit);
    // the context still works: free, then compute
    b = T();
    HT h = random(rng, {4097}, FLAME_DTYPE_F32, Domain());
    T x = upload(c, h), y;
    FLAME_ASSERT_OK(flame_add_scalar(x, 1.0, y.out()));
    EXPECT_TRUE(matches(y, map1(h, FLAME_DTYPE_F32, [](double v) { return v + 1.0; })));
    T z;
    FLAME_ASSERT_OK(flame_ones(c, &n40, 1, FLAME_DTYPE_F32, z.out()));
    T zs;
    FLAME_ASSERT_OK(flame_sum_all(z, zs.out()));
    EXPECT_EQ(item(zs), double(n40));
  }
  flame_ctx_destroy(c);
}

// ---------------------------------------------------------------------------------------------
// several contexts

// A small independent workload on context c; returns "" or a description of what went wrong.
std::string workload(flame_ctx_t c, uint64_t seed, int iterations) {
  Rng rng(seed);
  for (int it = 0; it < iterations; ++it) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 5000);
    HT a = random(rng, {n}, FLAME_DTYPE_F32, Domain()), b = random(rng, {n}, FLAME_DTYPE_F32, Domain());
    std::vector<unsigned char> ba = encode(a.values(), FLAME_DTYPE_F32), bb = encode(b.values(), FLAME_DTYPE_F32);
    flame_tensor_t ta = nullptr, tb = nullptr, tm = nullptr, ts = nullptr;
    std::string err;
    if (flame_from_host(c, ba.data(), ba.size(), &n, 1, FLAME_DTYPE_F32, &ta) != FLAME_OK ||
        flame_from_host(c, bb.data(), bb.size(), &n, 1, FLAME_DTYPE_F32, &tb) != FLAME_OK ||
        flame_mul(ta, tb, &tm) != FLAME_OK || flame_sum_all(tm, &ts) != FLAME_OK) {
      err = std::string("call failed: ") + flame_last_error_message();
    } else {
      std::vector<float> m(static_cast<size_t>(n));
      float s = 0;
      if (flame_to_host(tm, m.data(), m.size() * 4) != FLAME_OK || flame_to_host(ts, &s, 4) != FLAME_OK) {
        err = std::string("to_host failed: ") + flame_last_error_message();
      } else {
        double want_s = 0, abs_s = 0;
        const std::vector<double> va = a.values(), vb = b.values();
        for (int64_t i = 0; i < n && err.empty(); ++i) {
          const double w = double(float(va[size_t(i)] * vb[size_t(i)]));
          want_s += va[size_t(i)] * vb[size_t(i)];
          abs_s += std::fabs(va[size_t(i)] * vb[size_t(i)]);
          if (std::fabs(m[size_t(i)] - w) > 1e-6 * (1 + std::fabs(w))) err = "mul mismatch at " + std::to_string(i);
        }
        if (err.empty() && std::fabs(s - want_s) > 1e-5 * abs_s + 1e-5) err = "sum mismatch";
      }
    }
    flame_tensor_release(ta);
    flame_tensor_release(tb);
    flame_tensor_release(tm);
    flame_tensor_release(ts);
    if (!err.empty()) return "iteration " + std::to_string(it) + ": " + err;
  }
  return "";
}

TEST_F(Context, SeveralContextsInOneThread) {
  HREF_RNG(rng);
  flame_ctx_options_t o;
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  std::vector<flame_ctx_t> cs(3, nullptr);
  std::string why;
  for (auto& c : cs) {
    c = make_ctx(o, &why);
    ASSERT_NE(c, nullptr) << why;
  }
  // interleave tensors and ops of the three contexts
  std::vector<T> xs;
  std::vector<HT> hs;
  for (int k = 0; k < 6; ++k) {
    hs.push_back(random(rng, {257, 3}, FLAME_DTYPE_F64, Domain()));
    xs.push_back(upload(cs[static_cast<size_t>(k % 3)], hs.back()));
  }
  for (int k = 0; k < 3; ++k) {
    T s;
    FLAME_ASSERT_OK(flame_add(xs[static_cast<size_t>(k)], xs[static_cast<size_t>(k + 3)], s.out()));
    flame_ctx_t owner = nullptr;
    FLAME_ASSERT_OK(flame_tensor_context(s, &owner));
    EXPECT_EQ(owner, cs[static_cast<size_t>(k)]);
    EXPECT_TRUE(matches(s, map2(hs[static_cast<size_t>(k)], hs[static_cast<size_t>(k + 3)], FLAME_DTYPE_F64,
                                [](double a, double b) { return a + b; })));
  }
  // tensors of different contexts do not mix
  flame_tensor_t bad;
  HREF_EXPECT_ANY_FAIL(bad, flame_add(xs[0], xs[1], &bad));
  for (int k = 0; k < 3; ++k) EXPECT_EQ(workload(cs[static_cast<size_t>(k)], rng(), 3), "");
  xs.clear();
  for (flame_ctx_t c : cs) flame_ctx_destroy(c);
}

TEST_F(Context, ContextsInSeveralThreads) {
  HREF_RNG(rng);
  const int kThreads = 4;
  std::vector<std::string> errors(kThreads);
  std::vector<uint64_t> seeds(kThreads);
  for (auto& s : seeds) s = rng();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &errors, &seeds] {
      flame_ctx_options_t o;
      flame_ctx_options_init(&o);
      o.seed = static_cast<uint64_t>(t);
      flame_ctx_t c = nullptr;
      if (flame_ctx_create(&o, &c) != FLAME_OK) {
        errors[static_cast<size_t>(t)] = std::string("create: ") + flame_last_error_message();
        return;
      }
      errors[static_cast<size_t>(t)] = workload(c, seeds[static_cast<size_t>(t)], 12);
      flame_ctx_destroy(c);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[static_cast<size_t>(t)], "") << "thread " << t;
}

TEST_F(Context, OneContextSharedByThreads) {
  HREF_RNG(rng);
  const int kThreads = 4;
  std::vector<std::string> errors(kThreads);
  std::vector<uint64_t> seeds(kThreads);
  for (auto& s : seeds) s = rng();
  flame_ctx_t shared = ctx;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, shared, &errors, &seeds] { errors[size_t(t)] = workload(shared, seeds[size_t(t)], 12); });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[size_t(t)], "") << "thread " << t;
  // tensors made on one thread used on another
  HT h = random(rng, {100}, FLAME_DTYPE_F32, Domain());
  T x = upload(ctx, h);
  std::string err;
  std::thread other([&] {
    flame_tensor_t y = nullptr;
    if (flame_neg(x, &y) != FLAME_OK) { err = flame_last_error_message(); return; }
    std::vector<float> v(100);
    if (flame_to_host(y, v.data(), 400) != FLAME_OK) err = flame_last_error_message();
    for (size_t i = 0; i < 100 && err.empty(); ++i)
      if (v[i] != float(-h.values()[i])) err = "value " + std::to_string(i);
    flame_tensor_release(y);
  });
  other.join();
  EXPECT_EQ(err, "");
}

TEST_F(Context, ErrorMessagesArePerThread) {
  const int64_t neg[] = {-3};
  T t;
  ASSERT_NE(flame_zeros(ctx, neg, 1, FLAME_DTYPE_F32, t.out()), FLAME_OK);
  const std::string main_msg = flame_last_error_message();
  EXPECT_FALSE(main_msg.empty());
  std::string other_before, other_after;
  std::thread th([&] {
    other_before = flame_last_error_message();
    int32_t count = 0;
    flame_device_count(&count);  // a successful call
    flame_tensor_t x = nullptr;
    flame_status_t st = flame_add(nullptr, nullptr, &x);
    if (st != FLAME_OK) other_after = flame_last_error_message();
  });
  th.join();
  EXPECT_EQ(other_before, "") << "a new thread has no error message";
  EXPECT_FALSE(other_after.empty());
  EXPECT_EQ(std::string(flame_last_error_message()), main_msg) << "another thread's failure changed this thread's message";
}

// ---------------------------------------------------------------------------------------------
// references and lifetime

TEST_F(Context, TensorReferences) {
  flame_tensor_release(nullptr);  // no-op
  HREF_RNG(rng);
  HT h = random(rng, {6, 5}, FLAME_DTYPE_F32, Domain());
  const flame_memory_stats_t base = stats_of(ctx);
  // retain / release
  T a = upload(ctx, h);
  flame_tensor_t a2 = a.h;
  FLAME_ASSERT_OK(flame_tensor_retain(a2));  // a second reference to the same tensor
  a = T();                                   // drop the first
  EXPECT_TRUE(matches(a2, h)) << "the second reference still works";
  flame_tensor_release(a2);

  // contiguous of a contiguous tensor: a new reference to the same tensor
  T b = upload(ctx, h);
  T b2;
  FLAME_ASSERT_OK(flame_contiguous(b, b2.out()));
  b = T();
  EXPECT_TRUE(matches(b2, h));
  b2 = T();

  // a view keeps the memory of its base alive
  T c = upload(ctx, h);
  T ct;
  FLAME_ASSERT_OK(flame_transpose(c, 0, 1, ct.out()));
  c = T();
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  T junk;  // allocate over any memory freed too early
  const int64_t n = 1 << 16;
  FLAME_ASSERT_OK(flame_full(ctx, &n, 1, FLAME_DTYPE_F32, 12345.0, junk.out()));
  EXPECT_TRUE(matches(ct, h.transpose(0, 1)));
  ct = T();
  junk = T();

  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  const flame_memory_stats_t end = stats_of(ctx);
  EXPECT_EQ(end.live_tensors, base.live_tensors);
  EXPECT_EQ(end.bytes_in_use, base.bytes_in_use);
}

TEST_F(Context, DestroyWithLiveTensors) {
  flame_ctx_options_t o;
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  std::string why;
  flame_ctx_t c = make_ctx(o, &why);
  ASSERT_NE(c, nullptr) << why;
  HREF_RNG(rng);
  HT ha = random(rng, {33, 7}, FLAME_DTYPE_F32, Domain()), hb = random(rng, {7}, FLAME_DTYPE_F32, Domain());
  T a = upload(c, ha), b = upload(c, hb);
  flame_ctx_destroy(c);  // tensors keep the context alive
  T s;
  FLAME_ASSERT_OK(flame_add(a, b, s.out()));
  EXPECT_TRUE(matches(s, map2(ha, hb, FLAME_DTYPE_F32, [](double x, double y) { return x + y; })));
  T r;
  FLAME_ASSERT_OK(flame_sum_all(s, r.out()));
  T v;
  FLAME_ASSERT_OK(flame_transpose(a, 0, 1, v.out()));
  EXPECT_TRUE(matches(v, ha.transpose(0, 1)));
  // the destroyed handle itself is unusable (and detected while its tensors live)
  FLAME_EXPECT_STATUS(flame_ctx_synchronize(c), FLAME_ERROR_INVALID_HANDLE);
  flame_tensor_t bad;
  const int64_t shp[] = {3};
  HREF_EXPECT_FAIL(FLAME_ERROR_INVALID_HANDLE, bad, flame_zeros(c, shp, 1, FLAME_DTYPE_F32, &bad));
  // release everything (the context's resources go with the last tensor); no crash
  a = T();
  b = T();
  s = T();
  r = T();
  v = T();
  // other contexts are unaffected
  T z;
  FLAME_ASSERT_OK(flame_ones(ctx, shp, 1, FLAME_DTYPE_F32, z.out()));
  EXPECT_TRUE(matches(z, HT({3}, FLAME_DTYPE_F32, 1.0)));
}

}  // namespace
