// The argument-validation matrix, GPU part (issue 12): the rows of tests/common/arg_rows/ with live
// handles, strictly, plus the rows that need live tensors of particular kinds.
//
// For every row that returns a status:
//  1. all arguments valid: the expected status (FLAME_OK; FLAME_ERROR_UNSUPPORTED for the versioned
//     DLPack pair in a build with a pre-1.0 dlpack.h). This proves that each variant below differs
//     from a valid call in exactly one argument;
//  2. each nullable pointer NULL: FLAME_ERROR_INVALID_ARGUMENT, the message naming the function and
//     the argument, OUT handles NULL;
//  3. each handle released (a tensor released, a context destroyed while a tensor keeps it
//     readable, a safetensors file released): FLAME_ERROR_INVALID_HANDLE naming it; not for
//     optimizers, which flame_optimizer_release frees at once (flame.h promises no detection);
//  4. with two or more handles, each one from another context: FLAME_ERROR_INVALID_ARGUMENT
//     saying "context";
//  and after each call the context's live tensor count is back where it was (nothing leaked).
// Void rows: a live target, NULL and (tensors, contexts) a released handle. Then wrong dtypes,
// ranks, shapes, overflowing sizes, out-of-range axes and indices, non-finite scalars: each the
// documented status, OUT NULL, a message saying what is wrong, nothing leaked.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include FLAME_DLPACK_HEADER
#include "arg_matrix.h"
#include "flame_test.h"

namespace {

bool names_word(const std::string& msg, const std::string& name) {
  size_t colon = msg.find(": ");
  const std::string body = colon == std::string::npos ? msg : msg.substr(colon + 2);
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t p = body.find(name); p != std::string::npos; p = body.find(name, p + 1)) {
    size_t e = p + name.size();
    if ((p == 0 || !word(body[p - 1])) && (e == body.size() || !word(body[e]))) return true;
  }
  return false;
}

uint64_t live_tensors(flame_ctx_t c) {
  flame_memory_stats_t s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  EXPECT_EQ(flame_ctx_memory_stats(c, &s), FLAME_OK) << flame_last_error_message();
  return s.live_tensors;
}

class ArgMatrixGpu : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (!ctx) return;
    flame_ctx_options_t o;
    flame_ctx_options_init(&o);
    o.kernel_cache_dir = "";
    ASSERT_EQ(flame_ctx_create(&o, &ctx2), FLAME_OK) << flame_last_error_message();
    hooks.free_dl = [](DLManagedTensor* m) { m->deleter(m); };
#if defined(DLPACK_MAJOR_VERSION) && DLPACK_MAJOR_VERSION >= 1
    hooks.free_dlv = [](DLManagedTensorVersioned* m) { m->deleter(m); };
#endif
    flame_tensor_t t = nullptr;
    const int64_t shape[] = {1};
    ASSERT_EQ(flame_zeros(ctx, shape, 1, FLAME_DTYPE_F32, &t), FLAME_OK);
    DLManagedTensorVersioned* v = nullptr;
    hooks.versioned = flame_tensor_to_dlpack_versioned(t, &v) == FLAME_OK;
    if (v) hooks.free_dlv(v);
    flame_tensor_release(t);
  }
  void TearDown() override {
    flame_ctx_destroy(ctx2);
    GpuTest::TearDown();
  }
  // Runs one variant of row r and checks that nothing leaked in either context.
  template <class Setup, class Check>
  void variant(const argm::Row& r, Setup setup, Check check) {
    const uint64_t live1 = live_tensors(ctx), live2 = live_tensors(ctx2);
    {
      argm::Args a(argm::Mode::Live, ctx, ctx2, &hooks);
      setup(a);
      flame_status_t st = r.call(a);
      const std::string msg = flame_last_error_message();
      check(a, st, msg);
      if (st != FLAME_OK)
        for (const std::string& o : a.uncleared_outs()) ADD_FAILURE() << "OUT " << o << " not NULL after a failure";
      a.finish(st);
    }
    EXPECT_EQ(live_tensors(ctx), live1) << "tensor handles leaked";
    EXPECT_EQ(live_tensors(ctx2), live2) << "tensor handles leaked in the second context";
  }

  flame_ctx_t ctx2 = nullptr;
  argm::DlpackHooks hooks;
};

TEST_F(ArgMatrixGpu, EveryRowStrictly) {
  size_t rows = 0, nulls = 0, released = 0, foreign = 0;
  for (const argm::Row& r : argm::registry()) {
    SCOPED_TRACE(r.name + " (" + r.file + ":" + std::to_string(r.line) + ")");
    ++rows;
    if (r.kind == argm::Kind::Pure) {
      argm::Args a(argm::Mode::Live, ctx, ctx2, &hooks);
      EXPECT_EQ(r.call(a), FLAME_OK);
      continue;
    }
    argm::Args probe(argm::Mode::Probe);
    r.call(probe);
    probe.finish(FLAME_ERROR_INVALID_ARGUMENT);
    const std::vector<std::string> nullable = probe.nullable_names();
    const std::vector<argm::ArgInfo> handles = probe.handles();

    if (r.kind == argm::Kind::Void) {
      variant(r, [](argm::Args&) {}, [](argm::Args&, flame_status_t, const std::string&) {});
      variant(r, [](argm::Args& a) { a.null_at = 0; }, [](argm::Args&, flame_status_t, const std::string&) {});
      if (probe.takes_released)
        variant(r, [](argm::Args& a) { a.bad = argm::Bad::Released; },
                [](argm::Args&, flame_status_t, const std::string&) {});
      continue;
    }

    variant(r, [](argm::Args&) {}, [&](argm::Args& a, flame_status_t st, const std::string& msg) {
      EXPECT_EQ(st, a.expected_valid) << "the all-valid call: " << flame_status_string(st) << " \"" << msg << "\"";
    });
    for (size_t k = 0; k < nullable.size(); ++k) {
      SCOPED_TRACE(nullable[k] + " = NULL");
      ++nulls;
      variant(r, [k](argm::Args& a) { a.null_at = static_cast<int>(k); },
              [&](argm::Args&, flame_status_t st, const std::string& msg) {
                EXPECT_EQ(st, FLAME_ERROR_INVALID_ARGUMENT) << flame_status_string(st) << " \"" << msg << "\"";
                EXPECT_TRUE(names_word(msg, nullable[k])) << "the message names " << nullable[k] << ": \"" << msg << "\"";
                EXPECT_NE(msg.find(r.name), std::string::npos) << msg;
              });
    }
    for (size_t k = 0; k < handles.size(); ++k) {
      if (!handles[k].detects_released) continue;  // optimizers: a released one is freed memory
      SCOPED_TRACE(handles[k].name + " released");
      ++released;
      variant(r, [k](argm::Args& a) { a.bad_at = static_cast<int>(k); a.bad = argm::Bad::Released; },
              [&](argm::Args&, flame_status_t st, const std::string& msg) {
                EXPECT_EQ(st, FLAME_ERROR_INVALID_HANDLE) << flame_status_string(st) << " \"" << msg << "\"";
                EXPECT_TRUE(names_word(msg, handles[k].name)) << "the message names " << handles[k].name << ": \"" << msg << "\"";
              });
    }
    if (handles.size() >= 2) {
      for (size_t k = 0; k < handles.size(); ++k) {
        SCOPED_TRACE(handles[k].name + " from another context");
        ++foreign;
        variant(r, [k](argm::Args& a) { a.bad_at = static_cast<int>(k); a.bad = argm::Bad::Foreign; },
                [&](argm::Args&, flame_status_t st, const std::string& msg) {
                  EXPECT_EQ(st, FLAME_ERROR_INVALID_ARGUMENT) << flame_status_string(st) << " \"" << msg << "\"";
                  EXPECT_NE(msg.find("context"), std::string::npos) << msg;
                });
      }
    }
  }
  std::printf("[ArgMatrixGpu] %zu rows; %zu NULL arguments, %zu released handles, %zu foreign handles\n", rows, nulls,
              released, foreign);
}

// ---- rows that need live tensors of a particular kind ----

struct Owned {  // tensors of one case, released at its end
  std::vector<flame_tensor_t> v;
  ~Owned() {
    for (flame_tensor_t t : v) flame_tensor_release(t);
  }
  flame_tensor_t make(flame_ctx_t c, std::vector<int64_t> shape, flame_dtype_t d = FLAME_DTYPE_F32) {
    flame_tensor_t t = nullptr;
    EXPECT_EQ(flame_full(c, shape.data(), static_cast<int32_t>(shape.size()), d, 1.0, &t), FLAME_OK)
        << flame_last_error_message();
    v.push_back(t);
    return t;
  }
};

struct Semantic {
  const char* what;
  flame_status_t want;
  const char* in_message;  // a word the message must contain
  std::function<flame_status_t(flame_ctx_t, Owned&, flame_tensor_t*)> call;
};

TEST_F(ArgMatrixGpu, WrongKindsOfTensorsAndValues) {
  const double nan = std::nan(""), inf = INFINITY;
  const std::vector<Semantic> cases = {
      // sizes and ranks
      {"empty: 2^80 elements", FLAME_ERROR_INVALID_ARGUMENT, "elements",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) {
         const int64_t s[] = {int64_t{1} << 40, int64_t{1} << 40};
         return flame_empty(c, s, 2, FLAME_DTYPE_F32, o);
       }},
      {"empty: 2^64 bytes", FLAME_ERROR_INVALID_ARGUMENT, "overflows",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) {
         const int64_t s[] = {int64_t{1} << 61};
         return flame_empty(c, s, 1, FLAME_DTYPE_F64, o);
       }},
      {"empty: 0 x 2^62 x 2^62 (strides past 2^63)", FLAME_ERROR_INVALID_ARGUMENT, "elements",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) {
         const int64_t s[] = {0, int64_t{1} << 62, int64_t{1} << 62};
         return flame_empty(c, s, 3, FLAME_DTYPE_F32, o);
       }},
      {"zeros: negative size", FLAME_ERROR_INVALID_ARGUMENT, "negative",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) {
         const int64_t s[] = {2, -3};
         return flame_zeros(c, s, 2, FLAME_DTYPE_F32, o);
       }},
      {"ones: ndim 9", FLAME_ERROR_INVALID_ARGUMENT, "ndim",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) {
         const int64_t s[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
         return flame_ones(c, s, 9, FLAME_DTYPE_F32, o);
       }},
      {"full: ndim -1", FLAME_ERROR_INVALID_ARGUMENT, "ndim",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) {
         const int64_t s[] = {1};
         return flame_full(c, s, -1, FLAME_DTYPE_F32, 0.0, o);
       }},
      {"rand: dtype 99", FLAME_ERROR_INVALID_ARGUMENT, "dtype",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) {
         const int64_t s[] = {2};
         return flame_rand(c, s, 1, static_cast<flame_dtype_t>(99), o);
       }},
      {"eye: n -1", FLAME_ERROR_INVALID_ARGUMENT, "sizes",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) { return flame_eye(c, -1, 3, FLAME_DTYPE_F32, o); }},
      {"linspace: steps -1", FLAME_ERROR_INVALID_ARGUMENT, "steps",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) { return flame_linspace(c, 0, 1, -1, FLAME_DTYPE_F32, o); }},
      {"from_host: nbytes does not match", FLAME_ERROR_INVALID_ARGUMENT, "nbytes",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) {
         static float data[6];
         const int64_t s[] = {2, 3};
         return flame_from_host(c, data, 20, s, 2, FLAME_DTYPE_F32, o);
       }},
      {"to_host: nbytes does not match", FLAME_ERROR_INVALID_ARGUMENT, "nbytes",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) {
         static float data[6];
         return flame_to_host(k.make(c, {2, 3}), data, 20);
       }},
      {"item: 6 elements", FLAME_ERROR_INVALID_ARGUMENT, "item",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) {
         double v = 0;
         return flame_tensor_item(k.make(c, {2, 3}), &v);
       }},
      {"tensor_shape: capacity below ndim", FLAME_ERROR_INVALID_ARGUMENT, "capacity",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) {
         int64_t d[1];
         return flame_tensor_shape(k.make(c, {2, 3}), d, 1);
       }},
      // shapes
      {"add: 2x3 and 4 do not broadcast", FLAME_ERROR_SHAPE_MISMATCH, "broadcast",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_add(k.make(c, {2, 3}), k.make(c, {4}), o); }},
      {"reshape: 6 elements into 4", FLAME_ERROR_SHAPE_MISMATCH, "reshape",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) {
         const int64_t s[] = {4};
         return flame_reshape(k.make(c, {2, 3}), s, 1, o);
       }},
      {"view: strides forbid a view", FLAME_ERROR_INVALID_ARGUMENT, "view",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) {
         flame_tensor_t tr = nullptr;
         flame_status_t st = flame_transpose(k.make(c, {2, 3}), 0, 1, &tr);
         if (st != FLAME_OK) return st;
         k.v.push_back(tr);
         const int64_t s[] = {6};
         return flame_view(tr, s, 1, o);
       }},
      {"squeeze: a dim of size 3", FLAME_ERROR_INVALID_ARGUMENT, "size",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_squeeze(k.make(c, {2, 3}), 1, o); }},
      {"permute: 1 dim for a 2-d tensor", FLAME_ERROR_INVALID_ARGUMENT, "permute",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) {
         const int32_t d[] = {0};
         return flame_permute(k.make(c, {2, 3}), d, 1, o);
       }},
      {"diagonal: dim1 == dim2", FLAME_ERROR_INVALID_ARGUMENT, "differ",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_diagonal(k.make(c, {3, 3}), 0, 1, 1, o); }},
      {"cat: n = 0", FLAME_ERROR_INVALID_ARGUMENT, "tensors",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) {
         flame_tensor_t one[] = {k.make(c, {2})};
         return flame_cat(one, 0, 0, o);
       }},
      // axes and indices
      {"transpose: dim 2 of a 2-d tensor", FLAME_ERROR_INVALID_ARGUMENT, "range",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_transpose(k.make(c, {2, 3}), 0, 2, o); }},
      {"sum: dim -3 of a 2-d tensor", FLAME_ERROR_INVALID_ARGUMENT, "range",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) {
         const int32_t d[] = {-3};
         return flame_sum(k.make(c, {2, 3}), d, 1, 0, o);
       }},
      {"mean: the same dim twice", FLAME_ERROR_INVALID_ARGUMENT, "twice",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) {
         const int32_t d[] = {1, -1};
         return flame_mean(k.make(c, {2, 3}), d, 2, 0, o);
       }},
      {"unsqueeze: dim 4 of a 2-d tensor", FLAME_ERROR_INVALID_ARGUMENT, "range",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_unsqueeze(k.make(c, {2, 3}), 4, o); }},
      {"argmax: dim 2 of a 2-d tensor", FLAME_ERROR_INVALID_ARGUMENT, "range",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_argmax(k.make(c, {2, 3}), 2, 0, o); }},
      {"select: index 9 of 2", FLAME_ERROR_INVALID_ARGUMENT, "index",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_select(k.make(c, {2, 3}), 0, 9, o); }},
      {"narrow: past the end", FLAME_ERROR_INVALID_ARGUMENT, "fit",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_narrow(k.make(c, {2, 3}), 1, 2, 5, o); }},
      {"split: capacity below the pieces", FLAME_ERROR_INVALID_ARGUMENT, "capacity",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) {
         flame_tensor_t outs[1] = {nullptr};
         int32_t n = 0;
         return flame_split(k.make(c, {4, 3}), 1, 0, outs, 1, &n);
       }},
      {"split: split_size 0", FLAME_ERROR_INVALID_ARGUMENT, "split_size",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) {
         flame_tensor_t outs[4] = {nullptr};
         int32_t n = 0;
         return flame_split(k.make(c, {4, 3}), 0, 0, outs, 4, &n);
       }},
      {"chunk: 0 chunks", FLAME_ERROR_INVALID_ARGUMENT, "chunks",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) {
         flame_tensor_t outs[4] = {nullptr};
         int32_t n = 0;
         return flame_chunk(k.make(c, {4, 3}), 0, 0, outs, 4, &n);
       }},
      // dtypes
      {"add: bool + bool", FLAME_ERROR_DTYPE_MISMATCH, "bool",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) {
         return flame_add(k.make(c, {3}, FLAME_DTYPE_BOOL), k.make(c, {3}, FLAME_DTYPE_BOOL), o);
       }},
      {"where: an f32 condition", FLAME_ERROR_DTYPE_MISMATCH, "bool",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) {
         return flame_where(k.make(c, {3}), k.make(c, {3}), k.make(c, {3}), o);
       }},
      {"set_requires_grad: an i32 tensor", FLAME_ERROR_DTYPE_MISMATCH, "floating",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) {
         return flame_tensor_set_requires_grad(k.make(c, {3}, FLAME_DTYPE_I32), 1);
       }},
      {"set_grad: a grad of another dtype", FLAME_ERROR_DTYPE_MISMATCH, "dtype",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) {
         return flame_tensor_set_grad(k.make(c, {3}), k.make(c, {3}, FLAME_DTYPE_F64));
       }},
      {"set_grad: a grad of another shape", FLAME_ERROR_SHAPE_MISMATCH, "shape",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) { return flame_tensor_set_grad(k.make(c, {3}), k.make(c, {4})); }},
      // non-finite and out-of-range scalars
      {"softplus: beta NaN", FLAME_ERROR_INVALID_ARGUMENT, "beta",
       [nan](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_softplus(k.make(c, {3}), nan, 20, o); }},
      {"softplus: beta inf", FLAME_ERROR_INVALID_ARGUMENT, "beta",
       [inf](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_softplus(k.make(c, {3}), inf, 20, o); }},
      {"clamp: lo NaN", FLAME_ERROR_INVALID_ARGUMENT, "NaN",
       [nan](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_clamp(k.make(c, {3}), nan, 1, o); }},
      {"clamp: lo above hi", FLAME_ERROR_INVALID_ARGUMENT, "above",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_clamp(k.make(c, {3}), 2, 1, o); }},
      {"arange: end inf", FLAME_ERROR_INVALID_ARGUMENT, "finite",
       [inf](flame_ctx_t c, Owned&, flame_tensor_t* o) { return flame_arange(c, 0, inf, 1, FLAME_DTYPE_F32, o); }},
      {"arange: step 0", FLAME_ERROR_INVALID_ARGUMENT, "step",
       [](flame_ctx_t c, Owned&, flame_tensor_t* o) { return flame_arange(c, 0, 5, 0, FLAME_DTYPE_F32, o); }},
      {"gelu: approximate 2", FLAME_ERROR_INVALID_ARGUMENT, "approximate",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_gelu(k.make(c, {3}), 2, o); }},
      {"norm: p = 3", FLAME_ERROR_UNSUPPORTED, "p",
       [](flame_ctx_t c, Owned& k, flame_tensor_t* o) { return flame_norm(k.make(c, {3}), 3.0, nullptr, 0, 0, o); }},
      // autograd
      {"backward: unknown flags", FLAME_ERROR_INVALID_ARGUMENT, "flags",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) {
         flame_tensor_t x = k.make(c, {3});
         flame_tensor_set_requires_grad(x, 1);
         flame_tensor_t s = nullptr;
         flame_status_t st = flame_sum_all(x, &s);
         if (st != FLAME_OK) return st;
         k.v.push_back(s);
         return flame_backward(c, s, nullptr, 64);
       }},
      {"backward: a root that does not require grad", FLAME_ERROR_INVALID_ARGUMENT, "grad",
       [](flame_ctx_t c, Owned& k, flame_tensor_t*) { return flame_backward(c, k.make(c, {}), nullptr, 0); }},
      // context options and statistics
      {"memory_stats: struct_size 0", FLAME_ERROR_INVALID_ARGUMENT, "struct_size",
       [](flame_ctx_t c, Owned&, flame_tensor_t*) {
         flame_memory_stats_t s;
         std::memset(&s, 0, sizeof s);
         return flame_ctx_memory_stats(c, &s);
       }},
      {"ctx_create: device 4096", FLAME_ERROR_NO_DEVICE, "device",
       [](flame_ctx_t, Owned&, flame_tensor_t*) {
         flame_ctx_options_t o;
         flame_ctx_options_init(&o);
         o.device = 4096;
         flame_ctx_t c2 = reinterpret_cast<flame_ctx_t>(static_cast<uintptr_t>(0x40));
         flame_status_t st = flame_ctx_create(&o, &c2);
         return c2 == nullptr ? st : FLAME_ERROR_INTERNAL;  // *ctx must be NULL on failure
       }},
  };
  for (const Semantic& s : cases) {
    SCOPED_TRACE(s.what);
    const uint64_t live = live_tensors(ctx);
    {
      Owned k;
      flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
      flame_status_t st = s.call(ctx, k, &out);
      const std::string msg = flame_last_error_message();
      EXPECT_EQ(st, s.want) << flame_status_string(st) << " \"" << msg << "\"";
      // Functions with an OUT tensor set it to NULL; the others leave the sentinel alone.
      EXPECT_TRUE(out == nullptr || out == reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40)))
          << "OUT must be NULL after a failure";
      EXPECT_NE(msg.find(s.in_message), std::string::npos) << "\"" << msg << "\" should say " << s.in_message;
    }
    EXPECT_EQ(live_tensors(ctx), live) << "a failed call leaked a handle";
  }
  std::printf("[ArgMatrixGpu] %zu rows with live tensors of the wrong kind\n", cases.size());
}

// The rejection rows (tests/common/arg_rows/*_reject.cpp; issue 32: overflowing sizes): each call
// fails with its status and a message containing its word, OUT NULL, nothing left behind.
TEST_F(ArgMatrixGpu, RejectionRows) {
  ASSERT_FALSE(argm::reject_registry().empty());
  for (const argm::RejectRow& r : argm::reject_registry()) {
    SCOPED_TRACE(r.what + " (" + r.file + ":" + std::to_string(r.line) + ")");
    const uint64_t live = live_tensors(ctx);
    {
      argm::Inputs in(ctx);
      flame_tensor_t out = reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40));
      const flame_status_t st = r.call(in, &out);
      const std::string msg = flame_last_error_message();
      ASSERT_TRUE(in.ok()) << "the row's inputs could not be made: " << in.setup_error();
      EXPECT_EQ(st, r.status) << flame_status_string(st) << " \"" << msg << "\"";
      EXPECT_NE(msg.find(r.word), std::string::npos) << "\"" << msg << "\" should say " << r.word;
      EXPECT_TRUE(out == nullptr || out == reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40)))
          << "OUT must be NULL after a failure";
      if (st == FLAME_OK && out && out != reinterpret_cast<flame_tensor_t>(static_cast<uintptr_t>(0x40)))
        flame_tensor_release(out);
    }
    EXPECT_EQ(live_tensors(ctx), live) << "a failed call left a tensor behind";
  }
  std::printf("[ArgMatrixGpu] %zu rejection rows\n", argm::reject_registry().size());
}

}  // namespace
