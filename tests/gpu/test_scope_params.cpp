// flame.h "Handle scopes" and "Named parameter lists" on a GPU. Scopes: what is recorded and
// released (checked by the context's live handle count), nesting and its errors, keep, release by
// hand inside a scope (no double release), retained handles, ops that return their input, other
// threads, gradients and hooks, failed calls, a CUDA graph captured inside a scope, a context
// destroyed with a scope open, long scopes. Parameter lists: save and load into fresh tensors
// (F32 and BF16, strided targets), strict and non-strict loads, mismatched shapes and dtypes that
// leave every tensor unchanged, dtype conversion, names and lookups, lifetimes with scopes.
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include "flame_test.h"

namespace {

uint64_t live_tensors(flame_ctx_t c) {
  flame_memory_stats_t s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  EXPECT_EQ(flame_ctx_memory_stats(c, &s), FLAME_OK) << flame_last_error_message();
  return s.live_tensors;
}

int64_t held(flame_scope_t s) {
  int64_t n = -1;
  EXPECT_EQ(flame_scope_count(s, &n), FLAME_OK) << flame_last_error_message();
  return n;
}

flame_tensor_t make(flame_ctx_t ctx, std::vector<float> values, std::vector<int64_t> shape = {},
                    flame_dtype_t dtype = FLAME_DTYPE_F32) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  flame_tensor_t f = nullptr, t = nullptr;
  EXPECT_EQ(flame_from_host(ctx, values.data(), values.size() * sizeof(float), shape.data(),
                            static_cast<int32_t>(shape.size()), FLAME_DTYPE_F32, &f),
            FLAME_OK)
      << flame_last_error_message();
  if (dtype == FLAME_DTYPE_F32) return f;
  EXPECT_EQ(flame_to_dtype(f, dtype, &t), FLAME_OK) << flame_last_error_message();
  flame_tensor_release(f);
  return t;
}

// The values of t as f32 (any dtype, any strides).
std::vector<float> values(flame_tensor_t t) {
  flame_tensor_t f = nullptr, c = nullptr;
  EXPECT_EQ(flame_to_dtype(t, FLAME_DTYPE_F32, &f), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(flame_contiguous(f, &c), FLAME_OK) << flame_last_error_message();
  int64_t n = 0;
  flame_tensor_numel(c, &n);
  std::vector<float> v(static_cast<size_t>(n));
  EXPECT_EQ(flame_to_host(c, v.data(), v.size() * sizeof(float)), FLAME_OK) << flame_last_error_message();
  flame_tensor_release(c);
  flame_tensor_release(f);
  return v;
}

std::vector<float> iota(size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i) - 3.0f;
  return v;
}

class ScopeTest : public GpuTest {};
class ParamsTest : public GpuTest {
 protected:
  std::string path(const char* name) {
    const char* base = std::getenv("TMPDIR");
    std::string p = std::string(base && *base ? base : "/tmp") + "/flame_params_" + std::to_string(getpid()) + "_" + name;
    files_.push_back(p);
    return p;
  }
  void TearDown() override {
    for (const std::string& f : files_) std::remove(f.c_str());
    GpuTest::TearDown();
  }
  std::vector<std::string> files_;
};

// ============================== scopes ==============================

TEST_F(ScopeTest, ReleasesWhatWasMadeInside) {
  const uint64_t live0 = live_tensors(ctx);
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  flame_tensor_t a = make(ctx, iota(6)), b = nullptr, c = nullptr;
  FLAME_ASSERT_OK(flame_add(a, a, &b));
  FLAME_ASSERT_OK(flame_relu(b, &c));
  // make() released its f32 temporaries by hand only for other dtypes: here a, b, c are held.
  EXPECT_EQ(held(s), 3);
  EXPECT_EQ(live_tensors(ctx), live0 + 3);
  FLAME_ASSERT_OK(flame_scope_end(s));
  EXPECT_EQ(live_tensors(ctx), live0) << "the scope released every handle made inside it";
  // Ended: detected, and nothing is released twice.
  FLAME_EXPECT_STATUS(flame_scope_end(s), FLAME_ERROR_INVALID_HANDLE);
  FLAME_EXPECT_STATUS(flame_scope_count(s, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_tensor_numel(c, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  int64_t n = 0;
  FLAME_EXPECT_STATUS(flame_tensor_numel(c, &n), FLAME_ERROR_INVALID_HANDLE);
  FLAME_EXPECT_STATUS(flame_scope_end(nullptr), FLAME_OK);
}

TEST_F(ScopeTest, KeepGivesTheHandleBack) {
  const uint64_t live0 = live_tensors(ctx);
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  flame_tensor_t x = make(ctx, {1, 2, 3}), y = nullptr, outside = make(ctx, {0});
  FLAME_ASSERT_OK(flame_mul(x, x, &y));
  FLAME_ASSERT_OK(flame_scope_keep(s, y));
  EXPECT_EQ(held(s), 2);  // x and outside
  FLAME_EXPECT_STATUS(flame_scope_keep(s, y), FLAME_ERROR_INVALID_ARGUMENT);  // kept already
  EXPECT_NE(std::string(flame_last_error_message()).find("not held by scope"), std::string::npos)
      << flame_last_error_message();
  FLAME_ASSERT_OK(flame_scope_keep(s, outside));
  FLAME_ASSERT_OK(flame_scope_end(s));
  EXPECT_EQ(live_tensors(ctx), live0 + 2);
  EXPECT_EQ(values(y), (std::vector<float>{1, 4, 9}));
  flame_tensor_release(y);
  flame_tensor_release(outside);
  EXPECT_EQ(live_tensors(ctx), live0);
}

TEST_F(ScopeTest, HandlesMadeBeforeTheScopeAreNotHeld) {
  T before(make(ctx, {5}));
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  FLAME_EXPECT_STATUS(flame_scope_keep(s, before), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(held(s), 0);
  FLAME_ASSERT_OK(flame_scope_end(s));
  EXPECT_EQ(values(before), (std::vector<float>{5}));
}

TEST_F(ScopeTest, ReleaseByHandInsideAScopeIsNotRepeated) {
  const uint64_t live0 = live_tensors(ctx);
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  flame_tensor_t a = make(ctx, {1}), b = make(ctx, {2});
  EXPECT_EQ(held(s), 2);
  flame_tensor_release(a);  // by hand: released now, out of the scope
  EXPECT_EQ(held(s), 1);
  EXPECT_EQ(live_tensors(ctx), live0 + 1);
  // Retained then released: the caller's reference goes, the scope keeps its own.
  FLAME_ASSERT_OK(flame_tensor_retain(b));
  flame_tensor_release(b);
  EXPECT_EQ(held(s), 1);
  EXPECT_EQ(values(b), (std::vector<float>{2}));
  // Retained and not released: the scope drops its reference, the caller's stays.
  FLAME_ASSERT_OK(flame_tensor_retain(b));
  FLAME_ASSERT_OK(flame_scope_end(s));
  EXPECT_EQ(live_tensors(ctx), live0 + 1);
  EXPECT_EQ(values(b), (std::vector<float>{2}));
  flame_tensor_release(b);
  EXPECT_EQ(live_tensors(ctx), live0);
}

TEST_F(ScopeTest, NestedScopesEndInnermostFirst) {
  const uint64_t live0 = live_tensors(ctx);
  flame_scope_t outer = nullptr, inner = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &outer));
  flame_tensor_t a = make(ctx, {1});
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &inner));
  flame_tensor_t b = make(ctx, {2}), c = make(ctx, {3});
  EXPECT_EQ(held(outer), 1);
  EXPECT_EQ(held(inner), 2);
  FLAME_EXPECT_STATUS(flame_scope_keep(outer, b), FLAME_ERROR_INVALID_ARGUMENT);  // b is the inner scope's
  EXPECT_NE(std::string(flame_last_error_message()).find("another scope"), std::string::npos) << flame_last_error_message();
  // Ending the outer one first: an error, nothing changes.
  FLAME_EXPECT_STATUS(flame_scope_end(outer), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("innermost"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(held(outer), 1);
  EXPECT_EQ(held(inner), 2);
  EXPECT_EQ(live_tensors(ctx), live0 + 3);
  // Kept from the inner scope: the caller's, not moved to the outer one.
  FLAME_ASSERT_OK(flame_scope_keep(inner, c));
  FLAME_ASSERT_OK(flame_scope_end(inner));
  EXPECT_EQ(held(outer), 1);
  EXPECT_EQ(live_tensors(ctx), live0 + 2);  // a and c
  // The outer scope is innermost again: new handles go there.
  flame_tensor_t d = make(ctx, {4});
  EXPECT_EQ(held(outer), 2);
  (void)a;
  (void)b;
  (void)d;
  FLAME_ASSERT_OK(flame_scope_end(outer));
  EXPECT_EQ(live_tensors(ctx), live0 + 1);
  EXPECT_EQ(values(c), (std::vector<float>{3}));
  flame_tensor_release(c);
  EXPECT_EQ(live_tensors(ctx), live0);
}

TEST_F(ScopeTest, OpsThatReturnTheirInputGiveANewHandle) {
  T x(make(ctx, {1, 2}));
  const uint64_t live0 = live_tensors(ctx);
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  flame_tensor_t y = nullptr, z = nullptr;
  FLAME_ASSERT_OK(flame_contiguous(x, &y));
  FLAME_ASSERT_OK(flame_to_dtype(x, FLAME_DTYPE_F32, &z));
  EXPECT_NE(y, x.h);
  EXPECT_NE(z, x.h);
  EXPECT_EQ(held(s), 2);
  FLAME_ASSERT_OK(flame_scope_end(s));
  EXPECT_EQ(live_tensors(ctx), live0);
  EXPECT_EQ(values(x), (std::vector<float>{1, 2})) << "the input handle keeps its reference";
  // Outside a scope the documented identity holds.
  flame_tensor_t w = nullptr;
  FLAME_ASSERT_OK(flame_contiguous(x, &w));
  EXPECT_EQ(w, x.h);
  flame_tensor_release(w);
}

TEST_F(ScopeTest, OtherThreadsAndContextsAreNotRecorded) {
  const uint64_t live0 = live_tensors(ctx);
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  flame_tensor_t from_thread = nullptr;
  std::thread th([&] {
    from_thread = make(ctx, {7});
    // A scope of its own on this thread is independent of the main thread's.
    flame_scope_t mine = nullptr;
    EXPECT_EQ(flame_scope_begin(ctx, &mine), FLAME_OK);
    flame_tensor_t tmp = make(ctx, {8});
    (void)tmp;
    EXPECT_EQ(held(mine), 1);
    EXPECT_EQ(flame_scope_end(mine), FLAME_OK);
  });
  th.join();
  EXPECT_EQ(held(s), 0);
  // Another context: not recorded by a scope of ctx.
  bool skip = false;
  std::string why;
  flame_ctx_t other = flame_test_context(&skip, &why);
  ASSERT_NE(other, nullptr) << why;
  flame_tensor_t elsewhere = make(other, {9});
  EXPECT_EQ(held(s), 0);
  FLAME_EXPECT_STATUS(flame_scope_keep(s, elsewhere), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_scope_end(s));
  EXPECT_EQ(live_tensors(ctx), live0 + 1);
  EXPECT_EQ(values(from_thread), (std::vector<float>{7}));
  flame_tensor_release(from_thread);
  flame_tensor_release(elsewhere);
  flame_ctx_destroy(other);
  EXPECT_EQ(live_tensors(ctx), live0);
}

struct HookState {
  flame_scope_t scope = nullptr;
  flame_status_t keep_lent = FLAME_OK;
};

flame_status_t doubling_hook(void* user_data, flame_tensor_t grad, flame_tensor_t* replacement) {
  auto* st = static_cast<HookState*>(user_data);
  st->keep_lent = flame_scope_keep(st->scope, grad);  // lent by FLAME: not the scope's
  return flame_mul_scalar(grad, 2.0, replacement);      // recorded, then released by FLAME
}

TEST_F(ScopeTest, GradientsAndHooks) {
  T leaf(make(ctx, {1, 2, 3}));
  FLAME_ASSERT_OK(flame_tensor_set_requires_grad(leaf, 1));
  HookState hs;
  flame_hook_t hook = nullptr;
  FLAME_ASSERT_OK(flame_tensor_register_hook(leaf, doubling_hook, &hs, nullptr, &hook));
  const uint64_t live0 = live_tensors(ctx);
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &hs.scope));
  flame_tensor_t sq = nullptr, loss = nullptr, grad = nullptr;
  FLAME_ASSERT_OK(flame_mul(leaf, leaf, &sq));
  FLAME_ASSERT_OK(flame_sum_all(sq, &loss));
  FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
  EXPECT_EQ(hs.keep_lent, FLAME_ERROR_INVALID_ARGUMENT) << "handles lent to hooks are not recorded";
  EXPECT_EQ(held(hs.scope), 2) << "the hook's replacement left the scope when FLAME released it";
  FLAME_ASSERT_OK(flame_tensor_grad(leaf, &grad));
  EXPECT_EQ(held(hs.scope), 3) << "flame_tensor_grad's result is recorded";
  EXPECT_EQ(values(grad), (std::vector<float>{4, 8, 12}));
  FLAME_ASSERT_OK(flame_scope_end(hs.scope));
  EXPECT_EQ(live_tensors(ctx), live0);
  flame_hook_remove(hook);
}

TEST_F(ScopeTest, FailedCallsRecordNothing) {
  T a(make(ctx, {1, 2, 3})), b(make(ctx, {1, 2}));
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
  FLAME_EXPECT_STATUS(flame_add(a, b, &out), FLAME_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(held(s), 0);
  FLAME_ASSERT_OK(flame_scope_end(s));
}

TEST_F(ScopeTest, CudaGraphCapturedInsideAScope) {
  T x(make(ctx, {1, 2, 3}));
  flame_tensor_t warm = nullptr;  // compile the kernels before the capture
  FLAME_ASSERT_OK(flame_mul_scalar(x, 2.0, &warm));
  flame_tensor_release(warm);
  FLAME_ASSERT_OK(flame_add_scalar(x, 1.0, &warm));
  flame_tensor_release(warm);
  const uint64_t live0 = live_tensors(ctx);
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  flame_tensor_t y = nullptr, z = nullptr;
  flame_status_t st_y = flame_mul_scalar(x, 2.0, &y);
  flame_status_t st_z = flame_add_scalar(y, 1.0, &z);
  flame_graph_t g = nullptr;
  FLAME_ASSERT_OK(flame_graph_capture_end(ctx, &g));
  ASSERT_EQ(st_y, FLAME_OK);
  ASSERT_EQ(st_z, FLAME_OK);
  EXPECT_EQ(held(s), 2);
  FLAME_ASSERT_OK(flame_scope_keep(s, z));
  FLAME_ASSERT_OK(flame_scope_end(s));  // y goes; the graph still writes z
  EXPECT_EQ(live_tensors(ctx), live0 + 1);
  FLAME_ASSERT_OK(flame_graph_replay(g));
  EXPECT_EQ(values(z), (std::vector<float>{3, 5, 7}));
  flame_tensor_release(z);
  flame_graph_release(g);
  EXPECT_EQ(live_tensors(ctx), live0);
}

TEST_F(ScopeTest, ContextDestroyedWithAScopeOpen) {
  bool skip = false;
  std::string why;
  flame_ctx_t c2 = flame_test_context(&skip, &why);
  ASSERT_NE(c2, nullptr) << why;
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(c2, &s));
  flame_tensor_t a = make(c2, {1, 2}), b = nullptr;
  FLAME_ASSERT_OK(flame_mul(a, a, &b));
  flame_ctx_destroy(c2);  // the scope keeps the context alive, as tensors do
  EXPECT_EQ(values(b), (std::vector<float>{1, 4}));
  FLAME_EXPECT_STATUS(flame_scope_end(s), FLAME_OK);
}

TEST_F(ScopeTest, LongScopesWithReleasesByHand) {
  const uint64_t live0 = live_tensors(ctx);
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  T base(make(ctx, {1}));  // made inside: held by the scope too, and released by hand at the end
  std::vector<flame_tensor_t> kept_alive;
  for (int i = 0; i < 20000; ++i) {
    flame_tensor_t t = nullptr;
    ASSERT_EQ(flame_add_scalar(base, i, &t), FLAME_OK) << flame_last_error_message();
    if (i % 3 == 0) kept_alive.push_back(t);  // left to the scope
    else flame_tensor_release(t);             // released by hand (compaction runs in between)
  }
  EXPECT_EQ(held(s), static_cast<int64_t>(kept_alive.size()) + 1);
  EXPECT_EQ(values(kept_alive.back()), (std::vector<float>{1.0f + 19998.0f}));
  flame_tensor_release(kept_alive[5]);
  EXPECT_EQ(held(s), static_cast<int64_t>(kept_alive.size()));
  base.h = nullptr;  // the scope releases it
  FLAME_ASSERT_OK(flame_scope_end(s));
  EXPECT_EQ(live_tensors(ctx), live0);
}

// ============================== parameter lists ==============================

struct Params {
  flame_params_t h = nullptr;
  explicit Params(flame_ctx_t ctx) { EXPECT_EQ(flame_params_create(ctx, &h), FLAME_OK) << flame_last_error_message(); }
  ~Params() { flame_params_release(h); }
  Params(const Params&) = delete;
  Params& operator=(const Params&) = delete;
  operator flame_params_t() const { return h; }
};

TEST_F(ParamsTest, SaveThenLoadIntoFreshTensors) {
  const std::string file = path("round.safetensors");
  T w(make(ctx, iota(12, 0.25f), {3, 4})), b(make(ctx, iota(4, 1.5f), {4}, FLAME_DTYPE_BF16));
  {
    Params p(ctx);
    FLAME_ASSERT_OK(flame_params_add(p, "layer.weight", w));
    FLAME_ASSERT_OK(flame_params_add(p, "layer.bias", b));
    const char* md[] = {"format", "pt"};
    FLAME_ASSERT_OK(flame_params_save_safetensors(p, file.c_str(), md, 1));
  }
  // The file is an ordinary safetensors file.
  flame_safetensors_t f = nullptr;
  FLAME_ASSERT_OK(flame_safetensors_load(ctx, file.c_str(), &f));
  int64_t n = 0;
  FLAME_ASSERT_OK(flame_safetensors_count(f, &n));
  EXPECT_EQ(n, 2);
  const char* fmt = nullptr;
  FLAME_ASSERT_OK(flame_safetensors_metadata(f, "format", &fmt));
  EXPECT_STREQ(fmt, "pt");
  flame_safetensors_release(f);

  const int64_t ws[] = {3, 4}, bs[] = {4};
  T w2, b2;
  FLAME_ASSERT_OK(flame_zeros(ctx, ws, 2, FLAME_DTYPE_F32, w2.out()));
  FLAME_ASSERT_OK(flame_zeros(ctx, bs, 1, FLAME_DTYPE_BF16, b2.out()));
  Params q(ctx);
  FLAME_ASSERT_OK(flame_params_add(q, "layer.weight", w2));
  FLAME_ASSERT_OK(flame_params_add(q, "layer.bias", b2));
  FLAME_ASSERT_OK(flame_params_load_safetensors(q, file.c_str(), 0));
  EXPECT_EQ(values(w2), values(w));
  EXPECT_EQ(values(b2), values(b));
}

TEST_F(ParamsTest, LoadIntoStridedTargets) {
  const std::string file = path("strided.safetensors");
  T w(make(ctx, iota(6), {2, 3}));
  {
    Params p(ctx);
    FLAME_ASSERT_OK(flame_params_add(p, "w", w));
    FLAME_ASSERT_OK(flame_params_save_safetensors(p, file.c_str(), nullptr, 0));
  }
  const int64_t s[] = {3, 2};
  T storage, view;
  FLAME_ASSERT_OK(flame_zeros(ctx, s, 2, FLAME_DTYPE_F32, storage.out()));
  FLAME_ASSERT_OK(flame_transpose(storage, 0, 1, view.out()));  // [2, 3], not contiguous
  Params q(ctx);
  FLAME_ASSERT_OK(flame_params_add(q, "w", view));
  FLAME_ASSERT_OK(flame_params_load_safetensors(q, file.c_str(), 0));
  EXPECT_EQ(values(view), values(w));
}

TEST_F(ParamsTest, StrictAndNonStrictLoads) {
  const std::string file = path("strict.safetensors");
  T a(make(ctx, {1, 2})), b(make(ctx, {3}));
  {
    Params p(ctx);
    FLAME_ASSERT_OK(flame_params_add(p, "a", a));
    FLAME_ASSERT_OK(flame_params_add(p, "b", b));
    FLAME_ASSERT_OK(flame_params_save_safetensors(p, file.c_str(), nullptr, 0));
  }
  // Unexpected: the file has b, the list does not.
  T a2(make(ctx, {0, 0}));
  {
    Params q(ctx);
    FLAME_ASSERT_OK(flame_params_add(q, "a", a2));
    FLAME_EXPECT_STATUS(flame_params_load_safetensors(q, file.c_str(), 0), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flame_last_error_message()).find("'b'"), std::string::npos) << flame_last_error_message();
    EXPECT_EQ(values(a2), (std::vector<float>{0, 0})) << "a failed load changes nothing";
    FLAME_EXPECT_STATUS(flame_params_load_safetensors(q, file.c_str(), FLAME_PARAMS_LOAD_ALLOW_MISSING),
                        FLAME_ERROR_INVALID_ARGUMENT);
    FLAME_ASSERT_OK(flame_params_load_safetensors(q, file.c_str(), FLAME_PARAMS_LOAD_ALLOW_UNEXPECTED));
    EXPECT_EQ(values(a2), (std::vector<float>{1, 2}));
  }
  // Missing: the list has c, the file does not.
  T a3(make(ctx, {0, 0})), b3(make(ctx, {0})), c3(make(ctx, {9}));
  Params r(ctx);
  FLAME_ASSERT_OK(flame_params_add(r, "a", a3));
  FLAME_ASSERT_OK(flame_params_add(r, "b", b3));
  FLAME_ASSERT_OK(flame_params_add(r, "c", c3));
  FLAME_EXPECT_STATUS(flame_params_load_safetensors(r, file.c_str(), 0), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("'c'"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(values(a3), (std::vector<float>{0, 0}));
  FLAME_ASSERT_OK(flame_params_load_safetensors(r, file.c_str(), FLAME_PARAMS_LOAD_NON_STRICT));
  EXPECT_EQ(values(a3), (std::vector<float>{1, 2}));
  EXPECT_EQ(values(b3), (std::vector<float>{3}));
  EXPECT_EQ(values(c3), (std::vector<float>{9})) << "an entry the file lacks keeps its value";
  FLAME_EXPECT_STATUS(flame_params_load_safetensors(r, file.c_str(), 0x100u), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_params_load_safetensors(r, path("absent.safetensors").c_str(), 0), FLAME_ERROR_IO);
}

TEST_F(ParamsTest, MismatchesLeaveEveryTensorUnchanged) {
  const std::string file = path("mismatch.safetensors");
  T a(make(ctx, {1, 2})), b(make(ctx, {3, 4, 5}));
  {
    Params p(ctx);
    FLAME_ASSERT_OK(flame_params_add(p, "a", a));
    FLAME_ASSERT_OK(flame_params_add(p, "b", b));
    FLAME_ASSERT_OK(flame_params_save_safetensors(p, file.c_str(), nullptr, 0));
  }
  // a matches and comes first; b has the wrong shape: a must not be written either.
  T a2(make(ctx, {0, 0})), b2(make(ctx, {0, 0}));
  {
    Params q(ctx);
    FLAME_ASSERT_OK(flame_params_add(q, "a", a2));
    FLAME_ASSERT_OK(flame_params_add(q, "b", b2));
    FLAME_EXPECT_STATUS(flame_params_load_safetensors(q, file.c_str(), FLAME_PARAMS_LOAD_CONVERT_DTYPE),
                        FLAME_ERROR_SHAPE_MISMATCH);
    EXPECT_NE(std::string(flame_last_error_message()).find("[3]"), std::string::npos) << flame_last_error_message();
    EXPECT_EQ(values(a2), (std::vector<float>{0, 0}));
    EXPECT_EQ(values(b2), (std::vector<float>{0, 0}));
  }
  // b as BF16: a dtype mismatch unless converting.
  T a3(make(ctx, {0, 0})), b3(make(ctx, {0, 0, 0}, {3}, FLAME_DTYPE_BF16));
  Params r(ctx);
  FLAME_ASSERT_OK(flame_params_add(r, "a", a3));
  FLAME_ASSERT_OK(flame_params_add(r, "b", b3));
  FLAME_EXPECT_STATUS(flame_params_load_safetensors(r, file.c_str(), 0), FLAME_ERROR_DTYPE_MISMATCH);
  EXPECT_EQ(values(a3), (std::vector<float>{0, 0}));
  EXPECT_EQ(values(b3), (std::vector<float>{0, 0, 0}));
  FLAME_ASSERT_OK(flame_params_load_safetensors(r, file.c_str(), FLAME_PARAMS_LOAD_CONVERT_DTYPE));
  EXPECT_EQ(values(a3), (std::vector<float>{1, 2}));
  EXPECT_EQ(values(b3), (std::vector<float>{3, 4, 5}));  // exact in BF16
}

TEST_F(ParamsTest, NamesAndLookups) {
  T a(make(ctx, {1})), b(make(ctx, {2}));
  Params p(ctx);
  FLAME_ASSERT_OK(flame_params_add(p, "a", a));
  FLAME_ASSERT_OK(flame_params_add(p, "b", b));
  FLAME_ASSERT_OK(flame_params_add(p, "tied", a));  // one tensor under two names
  FLAME_EXPECT_STATUS(flame_params_add(p, "a", b), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_params_add(p, "", b), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_params_add(p, "__metadata__", b), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_params_add(p, "\xff", b), FLAME_ERROR_INVALID_ARGUMENT);
  int64_t n = 0;
  FLAME_ASSERT_OK(flame_params_count(p, &n));
  EXPECT_EQ(n, 3) << "failed adds change nothing";
  const char* name = nullptr;
  FLAME_ASSERT_OK(flame_params_name(p, 1, &name));
  EXPECT_STREQ(name, "b");
  FLAME_EXPECT_STATUS(flame_params_name(p, 3, &name), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(name, nullptr);
  flame_tensor_t t = nullptr;
  FLAME_ASSERT_OK(flame_params_tensor(p, 1, &t));
  EXPECT_EQ(values(t), (std::vector<float>{2}));
  FLAME_ASSERT_OK(flame_params_find(p, "tied", &t));
  EXPECT_EQ(values(t), (std::vector<float>{1}));
  FLAME_ASSERT_OK(flame_params_find(p, "absent", &t));
  EXPECT_EQ(t, nullptr);
  const flame_tensor_t* all = nullptr;
  FLAME_ASSERT_OK(flame_params_tensors(p, &all));
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(values(all[2]), (std::vector<float>{1}));
  Params empty(ctx);
  FLAME_ASSERT_OK(flame_params_tensors(empty, &all));
  EXPECT_EQ(all, nullptr);
  // Another context's tensor.
  bool skip = false;
  std::string why;
  flame_ctx_t other = flame_test_context(&skip, &why);
  ASSERT_NE(other, nullptr) << why;
  T elsewhere(make(other, {1}));
  FLAME_EXPECT_STATUS(flame_params_add(p, "z", elsewhere), FLAME_ERROR_INVALID_ARGUMENT);
  elsewhere = T();
  flame_ctx_destroy(other);
}

TEST_F(ParamsTest, ListsAndScopes) {
  const uint64_t live0 = live_tensors(ctx);
  Params* p = new Params(ctx);
  flame_scope_t s = nullptr;
  FLAME_ASSERT_OK(flame_scope_begin(ctx, &s));
  flame_tensor_t w = make(ctx, {1, 2, 3});
  FLAME_ASSERT_OK(flame_params_add(*p, "w", w));
  flame_tensor_t borrowed = nullptr;
  FLAME_ASSERT_OK(flame_params_find(*p, "w", &borrowed));
  EXPECT_EQ(held(s), 1) << "borrowed handles from a list are not recorded";
  FLAME_ASSERT_OK(flame_scope_end(s));
  EXPECT_EQ(live_tensors(ctx), live0 + 1) << "the list holds a handle of its own";
  EXPECT_EQ(values(borrowed), (std::vector<float>{1, 2, 3}));
  delete p;
  EXPECT_EQ(live_tensors(ctx), live0);
}

}  // namespace
