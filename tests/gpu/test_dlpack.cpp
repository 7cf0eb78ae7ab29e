// DLPack exchange on the GPU: flame_tensor_to_dlpack / flame_tensor_from_dlpack and the versioned
// pair. Checked: the exported fields (data pointer, device, dtype codes, shape and strides in
// elements, views with zero and negative strides, 0-d and empty tensors); round trips share the
// pointer; memory stays alive until the deleter and returns to the pool after it (memory stats);
// a foreign tensor's deleter runs exactly once, after the last FLAME reference, also when that
// goes on another thread; bad input is an error that takes nothing over. The "foreign" producer
// here is the test itself: a DLManagedTensor over a FLAME tensor's memory whose deleter counts
// its calls and releases the FLAME handle it keeps.
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include FLAME_DLPACK_HEADER
#include "host_ref.h"

using namespace href;

namespace {

#if defined(DLPACK_MAJOR_VERSION) && DLPACK_MAJOR_VERSION >= 1
constexpr bool kHaveVersioned = true;
#else
constexpr bool kHaveVersioned = false;
#endif

flame_memory_stats_t mem(flame_ctx_t ctx) {
  flame_memory_stats_t s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  EXPECT_EQ(flame_ctx_synchronize(ctx), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(flame_ctx_memory_stats(ctx, &s), FLAME_OK) << flame_last_error_message();
  return s;
}

// The DLPack dtype flame.h documents for each FLAME dtype.
struct DlCode {
  flame_dtype_t dtype;
  uint8_t code, bits;
};
const DlCode kCodes[] = {{FLAME_DTYPE_F32, 2, 32}, {FLAME_DTYPE_F16, 2, 16}, {FLAME_DTYPE_BF16, 4, 16},
                         {FLAME_DTYPE_F64, 2, 64}, {FLAME_DTYPE_I32, 0, 32}, {FLAME_DTYPE_I64, 0, 64},
                         {FLAME_DTYPE_U8, 1, 8},   {FLAME_DTYPE_BOOL, 6, 8}};

// A producer-made DLManagedTensor (or the versioned one) over a FLAME tensor's memory.
template <class Managed>
struct Producer {
  Managed m{};
  int64_t shape[FLAME_MAX_DIMS] = {};
  int64_t strides[FLAME_MAX_DIMS] = {};
  flame_tensor_t keep = nullptr;  // one reference, released by the deleter
  std::atomic<int>* calls = nullptr;
};

template <class Managed>
void producer_deleter(Managed* self) {
  auto* p = static_cast<Producer<Managed>*>(self->manager_ctx);
  p->calls->fetch_add(1);
  flame_tensor_release(p->keep);
  delete p;
}

// Describes t (any strides) as DLPack; with_strides false leaves strides NULL (t contiguous).
template <class Managed>
Managed* produce(flame_tensor_t t, std::atomic<int>* calls, bool with_strides = true) {
  auto* p = new Producer<Managed>();
  EXPECT_EQ(flame_tensor_retain(t), FLAME_OK);
  p->keep = t;
  p->calls = calls;
  DLTensor& d = p->m.dl_tensor;
  d.data = reinterpret_cast<void*>(ptr_of(t));
  d.device.device_type = kDLCUDA;
  d.device.device_id = 0;  // flame_test_context uses device 0
  Shape s = shape_of(t), st = strides_of(t);
  d.ndim = static_cast<int32_t>(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    p->shape[i] = s[i];
    p->strides[i] = st[i];
  }
  d.shape = p->shape;
  d.strides = with_strides ? p->strides : nullptr;
  d.byte_offset = 0;
  for (const DlCode& c : kCodes)
    if (c.dtype == dtype_of(t)) {
      d.dtype.code = c.code;
      d.dtype.bits = c.bits;
      d.dtype.lanes = 1;
    }
  p->m.manager_ctx = p;
  p->m.deleter = &producer_deleter<Managed>;
  return &p->m;
}

void expect_fields(const DLTensor& d, flame_tensor_t t) {
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d.data), ptr_of(t)) << "the export must not copy";
  EXPECT_EQ(static_cast<int>(d.device.device_type), static_cast<int>(kDLCUDA));
  EXPECT_EQ(d.device.device_id, 0);
  EXPECT_EQ(d.byte_offset, 0u);
  EXPECT_EQ(d.dtype.lanes, 1);
  Shape s = shape_of(t), st = strides_of(t);
  ASSERT_EQ(d.ndim, static_cast<int32_t>(s.size()));
  ASSERT_NE(d.shape, nullptr);
  ASSERT_NE(d.strides, nullptr) << "FLAME always gives strides (in elements)";
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(d.shape[i], s[i]) << "dim " << i;
    EXPECT_EQ(d.strides[i], st[i]) << "dim " << i;
  }
  for (const DlCode& c : kCodes)
    if (c.dtype == dtype_of(t)) {
      EXPECT_EQ(d.dtype.code, c.code) << dname(c.dtype);
      EXPECT_EQ(d.dtype.bits, c.bits) << dname(c.dtype);
    }
}

class Dlpack : public GpuTest {};

TEST_F(Dlpack, ExportFieldsEveryDtype) {
  HREF_RNG(rng);
  for (const DlCode& c : kCodes) {
    SCOPED_TRACE(dname(c.dtype));
    HT h = random(rng, {2, 3}, c.dtype);
    T t = upload(ctx, h);
    DLManagedTensor* m = nullptr;
    FLAME_ASSERT_OK(flame_tensor_to_dlpack(t, &m));
    ASSERT_NE(m, nullptr);
    ASSERT_NE(m->deleter, nullptr);
    expect_fields(m->dl_tensor, t);
    // Back into FLAME: the same memory and values, as a new leaf.
    T back;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, m, back.out()));
    EXPECT_EQ(ptr_of(back), ptr_of(t));
    EXPECT_EQ(dtype_of(back), c.dtype);
    EXPECT_TRUE(matches(back, h, Tol{0, 0}));
    int32_t leaf = 0, rg = 1;
    FLAME_ASSERT_OK(flame_tensor_is_leaf(back, &leaf));
    FLAME_ASSERT_OK(flame_tensor_requires_grad(back, &rg));
    EXPECT_EQ(leaf, 1);
    EXPECT_EQ(rg, 0);
  }
}

TEST_F(Dlpack, ExportKeepsMemoryUntilTheDeleter) {
  const flame_memory_stats_t base = mem(ctx);
  HREF_RNG(rng);
  HT h = random(rng, {64, 33}, FLAME_DTYPE_F32);
  DLManagedTensor* m = nullptr;
  {
    T t = upload(ctx, h);
    FLAME_ASSERT_OK(flame_tensor_to_dlpack(t, &m));
  }  // the only handle is gone; the export holds the memory
  flame_memory_stats_t held = mem(ctx);
  EXPECT_EQ(held.live_tensors, base.live_tensors);
  EXPECT_GE(held.bytes_in_use, base.bytes_in_use + 64 * 33 * 4);
  {
    T back;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, m, back.out()));  // takes m over
    EXPECT_TRUE(matches(back, h, Tol{0, 0})) << "the memory survived its last handle";
  }
  flame_memory_stats_t after = mem(ctx);
  EXPECT_EQ(after.bytes_in_use, base.bytes_in_use) << "freed once both sides let go";
  EXPECT_EQ(after.live_tensors, base.live_tensors);
}

TEST_F(Dlpack, DeleterFromAnotherThreadFreesTheMemory) {
  const flame_memory_stats_t base = mem(ctx);
  HREF_RNG(rng);
  std::vector<DLManagedTensor*> ms;
  for (int i = 0; i < 8; ++i) {
    T t = upload(ctx, random(rng, {1000 + i}, FLAME_DTYPE_F32));
    DLManagedTensor* m = nullptr;
    FLAME_ASSERT_OK(flame_tensor_to_dlpack(t, &m));
    ms.push_back(m);
  }
  EXPECT_GT(mem(ctx).bytes_in_use, base.bytes_in_use);
  std::vector<std::thread> threads;
  for (DLManagedTensor* m : ms) threads.emplace_back([m] { m->deleter(m); });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mem(ctx).bytes_in_use, base.bytes_in_use);
}

TEST_F(Dlpack, ExportOutlivesTheContextHandle) {
  flame_ctx_options_t o;
  FLAME_ASSERT_OK(flame_ctx_options_init(&o));
  flame_ctx_t c2 = nullptr;
  FLAME_ASSERT_OK(flame_ctx_create(&o, &c2));
  HREF_RNG(rng);
  HT h = random(rng, {5, 7}, FLAME_DTYPE_F64);
  DLManagedTensor* m = nullptr;
  DLManagedTensor* m2 = nullptr;
  {
    T t = upload(c2, h);
    FLAME_ASSERT_OK(flame_tensor_to_dlpack(t, &m));
    FLAME_ASSERT_OK(flame_tensor_to_dlpack(t, &m2));
  }
  flame_ctx_destroy(c2);  // the exports keep the context (and the memory) alive
  // Import one export into the test's context: the memory is still there and correct.
  ASSERT_EQ(m->dl_tensor.device.device_id, 0);
  {
    T back;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, m, back.out()));
    EXPECT_TRUE(matches(back, h, Tol{0, 0}));
  }  // ctx's release syncs, then runs m's deleter: still c2's memory, still alive through m2
  std::thread([m2] { m2->deleter(m2); }).join();  // the last reference: c2 goes on this thread
}

// Views: negative, zero and non-unit strides, offsets, 0-d and empty tensors round-trip exactly.
TEST_F(Dlpack, ViewsRoundTripWithTheirStrides) {
  HREF_RNG(rng);
  HT h = random(rng, {4, 6}, FLAME_DTYPE_F32);
  T base = upload(ctx, h);
  struct V {
    const char* name;
    T t;
    HT ref;
  };
  std::vector<V> views;
  {
    T v;
    FLAME_ASSERT_OK(flame_transpose(base, 0, 1, v.out()));
    views.push_back({"transpose", std::move(v), h.transpose(0, 1)});
  }
  {
    const int32_t d[] = {1};
    T v;
    FLAME_ASSERT_OK(flame_flip(base, d, 1, v.out()));
    views.push_back({"flip", std::move(v), h.flip({1})});
  }
  {
    T v;
    FLAME_ASSERT_OK(flame_slice(base, 1, 1, 6, 2, v.out()));
    views.push_back({"slice 1:6:2", std::move(v), h.slice(1, 1, 6, 2)});
  }
  {
    T col, v;
    FLAME_ASSERT_OK(flame_narrow(base, 1, 2, 1, col.out()));
    const int64_t to[] = {4, 5};
    FLAME_ASSERT_OK(flame_expand(col, to, 2, v.out()));
    views.push_back({"expand (zero stride)", std::move(v), h.narrow(1, 2, 1).expand({4, 5})});
  }
  {
    T v;
    FLAME_ASSERT_OK(flame_select(base, 0, 2, v.out()));
    T s;
    FLAME_ASSERT_OK(flame_select(v, 0, 3, s.out()));
    views.push_back({"0-d", std::move(s), h.select(0, 2).select(0, 3)});
  }
  {
    T v;
    FLAME_ASSERT_OK(flame_narrow(base, 0, 1, 0, v.out()));
    views.push_back({"empty", std::move(v), h.narrow(0, 1, 0)});
  }
  for (V& v : views) {
    SCOPED_TRACE(v.name);
    DLManagedTensor* m = nullptr;
    FLAME_ASSERT_OK(flame_tensor_to_dlpack(v.t, &m));
    expect_fields(m->dl_tensor, v.t);
    T back;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, m, back.out()));
    EXPECT_EQ(shape_of(back), shape_of(v.t));
    EXPECT_EQ(strides_of(back), strides_of(v.t));
    if (numel_of(v.t) > 0) {
      EXPECT_EQ(ptr_of(back), ptr_of(v.t));
    }
    EXPECT_TRUE(matches(back, v.ref, Tol{0, 0}));
  }
}

TEST_F(Dlpack, ForeignDeleterRunsOnceAfterTheLastReference) {
  const flame_memory_stats_t base = mem(ctx);
  HREF_RNG(rng);
  HT h = random(rng, {8, 16}, FLAME_DTYPE_F32);
  std::atomic<int> calls{0};
  T imported;
  {
    T src = upload(ctx, h);
    DLManagedTensor* m = produce<DLManagedTensor>(src, &calls);
    FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, m, imported.out()));
    EXPECT_EQ(ptr_of(imported), ptr_of(src)) << "no copy";
  }
  EXPECT_TRUE(matches(imported, h, Tol{0, 0}));
  const flame_memory_stats_t with = mem(ctx);
  EXPECT_EQ(with.bytes_in_use, base.bytes_in_use + 8 * 16 * 4) << "only the producer's FLAME tensor counts";

  T view;  // a view keeps the imported memory alive after the imported handle goes
  FLAME_ASSERT_OK(flame_narrow(imported, 0, 2, 3, view.out()));
  T sum;
  FLAME_ASSERT_OK(flame_add(view, view, sum.out()));  // queued work on the memory
  flame_tensor_release(imported.h);
  imported.h = nullptr;
  EXPECT_EQ(calls.load(), 0);
  EXPECT_TRUE(matches(sum, map2(h.narrow(0, 2, 3), h.narrow(0, 2, 3), FLAME_DTYPE_F32,
                                [](double a, double b) { return a + b; }),
                      Tol{0, 0}));
  std::thread([&view] {
    flame_tensor_release(view.h);  // the last reference goes on another thread
    view.h = nullptr;
  }).join();
  EXPECT_EQ(calls.load(), 1);
  sum = T();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(mem(ctx).bytes_in_use, base.bytes_in_use);
}

TEST_F(Dlpack, ForeignNonContiguousAndNullStrides) {
  HREF_RNG(rng);
  HT h = random(rng, {5, 7}, FLAME_DTYPE_F64);
  T base = upload(ctx, h);
  std::atomic<int> calls{0};
  {
    T tr;
    FLAME_ASSERT_OK(flame_transpose(base, 0, 1, tr.out()));
    T imported, out;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, produce<DLManagedTensor>(tr, &calls), imported.out()));
    EXPECT_EQ(strides_of(imported), (Shape{1, 7}));
    EXPECT_FALSE(is_contiguous(imported));
    FLAME_ASSERT_OK(flame_mul_scalar(imported, 3.0, out.out()));
    EXPECT_TRUE(matches(out, map1(h.transpose(0, 1), FLAME_DTYPE_F64, [](double a) { return 3 * a; }), Tol{0, 0}));
  }
  EXPECT_EQ(calls.load(), 1);
  {
    T imported;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, produce<DLManagedTensor>(base, &calls, false), imported.out()));
    EXPECT_EQ(strides_of(imported), (Shape{7, 1})) << "NULL strides mean compact row-major";
    EXPECT_TRUE(matches(imported, h, Tol{0, 0}));
  }
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(Dlpack, ImportedTensorsTakePartInAutograd) {
  HREF_RNG(rng);
  HT h = random(rng, {3, 4}, FLAME_DTYPE_F32);
  T base = upload(ctx, h);
  std::atomic<int> calls{0};
  {
    T x, y, loss, g;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, produce<DLManagedTensor>(base, &calls), x.out()));
    FLAME_ASSERT_OK(flame_tensor_set_requires_grad(x, 1));
    FLAME_ASSERT_OK(flame_mul(x, x, y.out()));
    FLAME_ASSERT_OK(flame_sum_all(y, loss.out()));
    FLAME_ASSERT_OK(flame_backward(ctx, loss, nullptr, 0));
    FLAME_ASSERT_OK(flame_tensor_grad(x, g.out()));
    EXPECT_TRUE(matches(g, map1(h, FLAME_DTYPE_F32, [](double a) { return 2 * a; }), tol_for(FLAME_DTYPE_F32)));
  }
  EXPECT_EQ(calls.load(), 1);
}

// Bad input: the documented status, *out NULL, a message naming the problem, and src left to the
// caller (its deleter not called).
TEST_F(Dlpack, BadInputIsAnErrorAndTakesNothing) {
  HREF_RNG(rng);
  T base = upload(ctx, random(rng, {4, 4}, FLAME_DTYPE_F32));
  std::atomic<int> calls{0};
  DLManagedTensor* m = produce<DLManagedTensor>(base, &calls);
  DLTensor& d = m->dl_tensor;
  const DLTensor good = d;

  DLManagedTensor* exp = reinterpret_cast<DLManagedTensor*>(0x40);
  FLAME_EXPECT_STATUS(flame_tensor_to_dlpack(nullptr, &exp), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(exp, nullptr);
  FLAME_EXPECT_STATUS(flame_tensor_to_dlpack(base, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  {
    flame_tensor_t dead = nullptr;
    FLAME_ASSERT_OK(flame_clone(base, &dead));
    flame_tensor_release(dead);
    FLAME_EXPECT_STATUS(flame_tensor_to_dlpack(dead, &exp), FLAME_ERROR_INVALID_HANDLE);
  }

  struct Case {
    const char* what;
    std::function<void(DLTensor&)> edit;
    flame_status_t status;
    const char* in_message;
  };
  static int64_t big_shape[2] = {int64_t{1} << 40, int64_t{1} << 40};
  static int64_t neg_shape[2] = {4, -1};
  static int64_t huge_strides[2] = {INT64_MAX, 1};
  const Case cases[] = {
      {"CPU memory", [](DLTensor& t) { t.device.device_type = kDLCPU; }, FLAME_ERROR_UNSUPPORTED, "CPU"},
      {"pinned host memory", [](DLTensor& t) { t.device.device_type = kDLCUDAHost; }, FLAME_ERROR_UNSUPPORTED, "CUDA"},
      {"another GPU", [](DLTensor& t) { t.device.device_id = 1; }, FLAME_ERROR_INVALID_ARGUMENT, "device 1"},
      {"complex64", [](DLTensor& t) { t.dtype.code = 5; t.dtype.bits = 64; }, FLAME_ERROR_DTYPE_MISMATCH, "dtype"},
      {"int8", [](DLTensor& t) { t.dtype.code = 0; t.dtype.bits = 8; }, FLAME_ERROR_DTYPE_MISMATCH, "dtype"},
      {"2 lanes", [](DLTensor& t) { t.dtype.lanes = 2; }, FLAME_ERROR_DTYPE_MISMATCH, "lanes"},
      {"ndim 9", [](DLTensor& t) { t.ndim = 9; }, FLAME_ERROR_INVALID_ARGUMENT, "ndim"},
      {"ndim -1", [](DLTensor& t) { t.ndim = -1; }, FLAME_ERROR_INVALID_ARGUMENT, "ndim"},
      {"shape NULL", [](DLTensor& t) { t.shape = nullptr; }, FLAME_ERROR_INVALID_ARGUMENT, "shape"},
      {"negative size", [](DLTensor& t) { t.shape = neg_shape; }, FLAME_ERROR_INVALID_ARGUMENT, "negative"},
      {"2^80 elements", [](DLTensor& t) { t.shape = big_shape; }, FLAME_ERROR_INVALID_ARGUMENT, "shape"},
      {"strides past 2^63", [](DLTensor& t) { t.strides = huge_strides; }, FLAME_ERROR_INVALID_ARGUMENT, "strides"},
      {"misaligned", [](DLTensor& t) { t.byte_offset = 2; }, FLAME_ERROR_INVALID_ARGUMENT, "aligned"},
      {"data NULL", [](DLTensor& t) { t.data = nullptr; }, FLAME_ERROR_INVALID_ARGUMENT, "NULL"},
  };
  const flame_memory_stats_t before = mem(ctx);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    d = good;
    c.edit(d);
    flame_tensor_t out = reinterpret_cast<flame_tensor_t>(0x40);
    FLAME_EXPECT_STATUS(flame_tensor_from_dlpack(ctx, m, &out), c.status);
    EXPECT_EQ(out, nullptr);
    const std::string msg = flame_last_error_message();
    EXPECT_NE(msg.find("flame_tensor_from_dlpack"), std::string::npos) << msg;
    EXPECT_NE(msg.find("src"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.in_message), std::string::npos) << msg;
    EXPECT_EQ(calls.load(), 0) << "a failed import must not call the deleter";
  }
  d = good;
  flame_tensor_t out = reinterpret_cast<flame_tensor_t>(0x40);
  FLAME_EXPECT_STATUS(flame_tensor_from_dlpack(nullptr, m, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  FLAME_EXPECT_STATUS(flame_tensor_from_dlpack(ctx, nullptr, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("src"), std::string::npos);
  FLAME_EXPECT_STATUS(flame_tensor_from_dlpack(ctx, m, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(calls.load(), 0);
  const flame_memory_stats_t after = mem(ctx);
  EXPECT_EQ(after.live_tensors, before.live_tensors);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  m->deleter(m);  // still the caller's
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(Dlpack, NullDeleterIsAccepted) {
  HREF_RNG(rng);
  HT h = random(rng, {6}, FLAME_DTYPE_I32);
  T base = upload(ctx, h);
  int64_t shape[1] = {6};
  DLManagedTensor m{};
  m.dl_tensor.data = reinterpret_cast<void*>(ptr_of(base));
  m.dl_tensor.device.device_type = kDLCUDA;
  m.dl_tensor.ndim = 1;
  m.dl_tensor.dtype.code = 0;
  m.dl_tensor.dtype.bits = 32;
  m.dl_tensor.dtype.lanes = 1;
  m.dl_tensor.shape = shape;
  T imported;
  FLAME_ASSERT_OK(flame_tensor_from_dlpack(ctx, &m, imported.out()));
  EXPECT_TRUE(matches(imported, h, Tol{0, 0}));
}

TEST_F(Dlpack, Versioned) {
  HREF_RNG(rng);
  HT h = random(rng, {3, 5}, FLAME_DTYPE_BF16);
  T t = upload(ctx, h);
  DLManagedTensorVersioned* v = reinterpret_cast<DLManagedTensorVersioned*>(0x40);
  flame_tensor_t out = reinterpret_cast<flame_tensor_t>(0x40);
  if (!kHaveVersioned) {  // built with a dlpack.h older than 1.0: a clear "unsupported"
    FLAME_EXPECT_STATUS(flame_tensor_to_dlpack_versioned(t, &v), FLAME_ERROR_UNSUPPORTED);
    EXPECT_EQ(v, nullptr);
    uint64_t opaque[16] = {0};  // never read: the struct is unknown to this build
    FLAME_EXPECT_STATUS(flame_tensor_from_dlpack_versioned(ctx, reinterpret_cast<DLManagedTensorVersioned*>(opaque), &out),
                        FLAME_ERROR_UNSUPPORTED);
    EXPECT_EQ(out, nullptr);
    return;
  }
#if defined(DLPACK_MAJOR_VERSION) && DLPACK_MAJOR_VERSION >= 1
  FLAME_ASSERT_OK(flame_tensor_to_dlpack_versioned(t, &v));
  EXPECT_EQ(v->version.major, static_cast<uint32_t>(DLPACK_MAJOR_VERSION));
  EXPECT_EQ(v->version.minor, static_cast<uint32_t>(DLPACK_MINOR_VERSION));
  EXPECT_EQ(v->flags, 0u);
  expect_fields(v->dl_tensor, t);
  {
    T back;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack_versioned(ctx, v, back.out()));
    EXPECT_EQ(ptr_of(back), ptr_of(t));
    EXPECT_TRUE(matches(back, h, Tol{0, 0}));
  }
  std::atomic<int> calls{0};
  DLManagedTensorVersioned* p = produce<DLManagedTensorVersioned>(t, &calls);
  p->version.major = DLPACK_MAJOR_VERSION;
  p->version.minor = 0;
  p->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  FLAME_EXPECT_STATUS(flame_tensor_from_dlpack_versioned(ctx, p, &out), FLAME_ERROR_UNSUPPORTED);
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("read-only"), std::string::npos);
  p->flags = 0;
  p->version.major = DLPACK_MAJOR_VERSION + 1;
  FLAME_EXPECT_STATUS(flame_tensor_from_dlpack_versioned(ctx, p, &out), FLAME_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(flame_last_error_message()).find("version"), std::string::npos);
  EXPECT_EQ(calls.load(), 0);
  p->version.major = DLPACK_MAJOR_VERSION;
#ifdef DLPACK_FLAG_BITMASK_IS_COPIED
  p->flags = DLPACK_FLAG_BITMASK_IS_COPIED;  // informational: accepted
#endif
  {
    T imported;
    FLAME_ASSERT_OK(flame_tensor_from_dlpack_versioned(ctx, p, imported.out()));
    EXPECT_EQ(ptr_of(imported), ptr_of(t));
    EXPECT_TRUE(matches(imported, h, Tol{0, 0}));
  }
  EXPECT_EQ(calls.load(), 1);
#endif
}

}  // namespace
