// Optimizers with 8-bit moments (flame_optimizer_set_state_bits), against flame.h's description:
//  - the code tables and the first step's stored state: a table built here from flame.h's rule, the
//    per-block absmax (exact: the largest |moment| of each 256 elements) and every stored code a
//    nearest code of moment / absmax; the first step equals the 32-bit optimizer's;
//  - 30 AdamW and Lion steps beside the 32-bit optimizer on the same gradients: parameters under
//    4096 elements keep f32 moments (equal bit for bit), the others stay close (the total update
//    differs by a few percent, printed: AdamW 1-1.5%, Lion 3-3.5% on the H200), state_bytes counts
//    codes, absmax and master weights;
//  - a state file resumes bit for bit (bf16 with master weights and stochastic rounding too) and
//    loads only into an optimizer of the same width; a captured step replays as eager steps do;
//  - bad requests are errors that change nothing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include "host_ref.h"
#include "temp_files_test.h"

using namespace href;

namespace {

class Optim8bit : public TempFilesTest {};

// flame.h's code tables: decade i = 0 .. 6, n_i values 10^(i - 6) * (0.1 + 0.9 * (j + 0.5) / n_i),
// with n_i = 2^i (signed: with the negatives) or 2^(i + 1) (unsigned); plus 0 and 1; ascending.
std::vector<double> spec_codes(bool is_signed) {
  std::vector<double> v = {0.0, 1.0};
  for (int i = 0; i < 7; ++i) {
    const int n = is_signed ? 1 << i : 2 << i;
    for (int j = 0; j < n; ++j) {
      const double x = std::pow(10.0, i - 6) * (0.1 + 0.9 * (j + 0.5) / n);
      v.push_back(x);
      if (is_signed) v.push_back(-x);
    }
  }
  std::sort(v.begin(), v.end());
  return v;
}

void set_grad(flame_ctx_t ctx, flame_tensor_t p, const HT& g) {
  T gt = upload(ctx, g);
  ASSERT_EQ(flame_tensor_set_grad(p, gt), FLAME_OK) << flame_last_error_message();
}

template <class V>
std::vector<V> state_tensor(flame_ctx_t ctx, const std::string& file, const std::string& name) {
  flame_safetensors_t f = nullptr;
  EXPECT_EQ(flame_safetensors_load(ctx, file.c_str(), &f), FLAME_OK) << flame_last_error_message();
  T t;
  EXPECT_EQ(flame_safetensors_get(f, name.c_str(), t.out()), FLAME_OK) << name;
  int64_t n = 0;
  flame_tensor_numel(t, &n);
  std::vector<V> v(static_cast<size_t>(n));
  EXPECT_EQ(flame_to_host(t, v.data(), v.size() * sizeof(V)), FLAME_OK) << flame_last_error_message();
  flame_safetensors_release(f);
  return v;
}

flame_optimizer_t make_optimizer(flame_ctx_t ctx, flame_optimizer_options_t o, std::vector<flame_tensor_t> params,
                                 int32_t bits) {
  flame_optimizer_t opt = nullptr;
  EXPECT_EQ(flame_optimizer_create(ctx, &o, params.data(), static_cast<int64_t>(params.size()), &opt), FLAME_OK)
      << flame_last_error_message();
  EXPECT_EQ(flame_optimizer_set_state_bits(opt, bits), FLAME_OK) << flame_last_error_message();
  return opt;
}

// Checks that every code of one moment is a nearest code (within rounding) of value / absmax.
void expect_nearest_codes(const std::vector<float>& value, const std::vector<uint8_t>& code, const std::vector<float>& absmax,
                          const std::vector<double>& table, const char* what) {
  ASSERT_EQ(value.size(), code.size());
  ASSERT_EQ(absmax.size(), (value.size() + 255) / 256) << what;
  size_t bad_absmax = 0, bad_code = 0;
  for (size_t b = 0; b < absmax.size(); ++b) {
    float am = 0;
    for (size_t i = b * 256; i < std::min(value.size(), b * 256 + 256); ++i) am = std::max(am, std::fabs(value[i]));
    bad_absmax += am != absmax[b];
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const double am = absmax[i / 256];
    const double x = am > 0 ? value[i] / am : 0.0;
    double best = 1e30;
    for (double c : table) best = std::min(best, std::fabs(c - x));
    bad_code += std::fabs(table[code[i]] - x) > best + 1e-6 * std::fabs(x) + 1e-12;
  }
  EXPECT_EQ(bad_absmax, 0u) << what << ": blocks whose absmax is not the largest |moment|";
  EXPECT_EQ(bad_code, 0u) << what << ": elements stored with a code that is not the nearest";
}

TEST_F(Optim8bit, FirstStepStoresNearestCodesAndEqualsThe32BitStep) {
  HREF_RNG(rng);
  const Shape shape = {5000};  // 20 blocks, the last one of 136 elements
  HT w = random(rng, shape, FLAME_DTYPE_F32, -1, 1);
  HT g = random(rng, shape, FLAME_DTYPE_F32, -1, 1);
  T p8 = upload(ctx, w), p32 = upload(ctx, w);
  flame_optimizer_options_t o;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW));
  o.lr = 0.01;
  flame_optimizer_t opt8 = make_optimizer(ctx, o, {p8}, 8), opt32 = make_optimizer(ctx, o, {p32}, 32);
  set_grad(ctx, p8, g);
  set_grad(ctx, p32, g);
  FLAME_ASSERT_OK(flame_optimizer_step(opt8));
  FLAME_ASSERT_OK(flame_optimizer_step(opt32));
  EXPECT_TRUE(matches(p8, download(p32), Tol{1e-6, 1e-7})) << "the first step uses the unrounded moments";
  const std::string file = path("first.safetensors");
  FLAME_ASSERT_OK(flame_optimizer_save_state(opt8, file.c_str()));
  // The moments after one step, in f32 as the kernel forms them: m = (1 - b1) g, v = ((1 - b2) g) g.
  const std::vector<double> gv = g.values();
  std::vector<float> m(gv.size()), v(gv.size());
  for (size_t i = 0; i < gv.size(); ++i) {
    const float gf = static_cast<float>(gv[i]);
    m[i] = (1.0f - static_cast<float>(o.beta1)) * gf;
    v[i] = ((1.0f - static_cast<float>(o.beta2)) * gf) * gf;
  }
  expect_nearest_codes(m, state_tensor<uint8_t>(ctx, file, "state.0.exp_avg"),
                       state_tensor<float>(ctx, file, "state.0.exp_avg_absmax"), spec_codes(true), "exp_avg");
  expect_nearest_codes(v, state_tensor<uint8_t>(ctx, file, "state.0.exp_avg_sq"),
                       state_tensor<float>(ctx, file, "state.0.exp_avg_sq_absmax"), spec_codes(false), "exp_avg_sq");
  flame_optimizer_release(opt8);
  flame_optimizer_release(opt32);
}

double update_gap(const std::vector<double>& w0, const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < w0.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += (b[i] - w0[i]) * (b[i] - w0[i]);
  }
  return std::sqrt(num / den);
}

TEST_F(Optim8bit, StepsTrackThe32BitOptimizer) {
  HREF_RNG(rng);
  struct Param {
    Shape shape;
    flame_dtype_t dtype;
  };
  const Param params[] = {{{70000}, FLAME_DTYPE_F32}, {{64, 80}, FLAME_DTYPE_BF16}, {{1000}, FLAME_DTYPE_F32}};
  for (int32_t kind : {FLAME_OPTIMIZER_ADAMW, FLAME_OPTIMIZER_LION}) {
    SCOPED_TRACE(kind == FLAME_OPTIMIZER_LION ? "lion" : "adamw");
    flame_optimizer_options_t o;
    FLAME_ASSERT_OK(flame_optimizer_options_init(&o, kind));
    o.lr = kind == FLAME_OPTIMIZER_LION ? 1e-3 : 1e-2;
    o.master_weights = 1;
    std::vector<T> w8, w32;
    std::vector<std::vector<double>> w0;
    for (const Param& p : params) {
      HT w = random(rng, p.shape, p.dtype, -1, 1);
      w0.push_back(w.values());
      w8.push_back(upload(ctx, w));
      w32.push_back(upload(ctx, w));
    }
    flame_optimizer_t opt8 = make_optimizer(ctx, o, {w8[0], w8[1], w8[2]}, 8);
    flame_optimizer_t opt32 = make_optimizer(ctx, o, {w32[0], w32[1], w32[2]}, 32);
    for (int step = 0; step < 30; ++step) {
      for (size_t k = 0; k < w8.size(); ++k) {
        // Gradients with a persistent direction plus noise, so that the moments carry information.
        HT g = random(rng, params[k].shape, params[k].dtype, -1, 1);
        std::vector<double> gv = g.values();
        for (size_t i = 0; i < gv.size(); ++i) gv[i] = 0.5 * gv[i] + (i % 3 == 0 ? 0.3 : -0.1);
        const HT gg = HT::from_values(params[k].shape, params[k].dtype, gv);
        set_grad(ctx, w8[k], gg);
        set_grad(ctx, w32[k], gg);
      }
      FLAME_ASSERT_OK(flame_optimizer_step(opt8));
      FLAME_ASSERT_OK(flame_optimizer_step(opt32));
    }
    const std::vector<double> small8 = download(w8[2]).values(), small32 = download(w32[2]).values();
    EXPECT_TRUE(small8 == small32) << "a parameter under 4096 elements keeps f32 moments";
    for (size_t k = 0; k < 2; ++k) {
      const double gap = update_gap(w0[k], download(w8[k]).values(), download(w32[k]).values());
      std::printf("[ 8-bit %s ] param %zu: |update(8-bit) - update(32-bit)| / |update(32-bit)| = %.4f\n",
                  kind == FLAME_OPTIMIZER_LION ? "lion" : "adamw", k, gap);
      EXPECT_LT(gap, kind == FLAME_OPTIMIZER_LION ? 0.1 : 0.05) << "param " << k;  // H200: 0.029-0.035, 0.011-0.014
    }
    // State: codes and absmax per moment for the two large parameters, f32 moments for the small
    // one, f32 master weights for the bf16 one.
    const uint64_t moments = kind == FLAME_OPTIMIZER_LION ? 1 : 2;
    const uint64_t want = moments * (70000 + 4 * 274) + moments * (5120 + 4 * 20) + 4 * 5120 + moments * 4 * 1000;
    uint64_t bytes = 0;
    FLAME_ASSERT_OK(flame_optimizer_state_bytes(opt8, &bytes));
    EXPECT_EQ(bytes, want);
    flame_optimizer_release(opt8);
    flame_optimizer_release(opt32);
  }
}

TEST_F(Optim8bit, StateFileResumesBitForBitAndNeedsTheSameWidth) {
  HREF_RNG(rng);
  const Shape shapes[] = {{5000}, {4096}, {100}};
  const flame_dtype_t dtypes[] = {FLAME_DTYPE_F32, FLAME_DTYPE_BF16, FLAME_DTYPE_F32};
  flame_optimizer_options_t o;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW));
  o.lr = 3e-3;
  o.master_weights = 1;
  o.stochastic_rounding = 1;
  std::vector<T> a;
  for (int k = 0; k < 3; ++k) a.push_back(upload(ctx, random(rng, shapes[k], dtypes[k], -1, 1)));
  std::vector<std::vector<HT>> grads(6);
  for (auto& step : grads)
    for (int k = 0; k < 3; ++k) step.push_back(random(rng, shapes[k], dtypes[k], -1, 1));
  flame_optimizer_t opt = make_optimizer(ctx, o, {a[0], a[1], a[2]}, 8);
  auto run = [&](flame_optimizer_t optimizer, std::vector<T>& ps, int from, int to) {
    for (int s = from; s < to; ++s) {
      for (int k = 0; k < 3; ++k) set_grad(ctx, ps[static_cast<size_t>(k)], grads[static_cast<size_t>(s)][static_cast<size_t>(k)]);
      ASSERT_EQ(flame_optimizer_step(optimizer), FLAME_OK) << flame_last_error_message();
    }
  };
  run(opt, a, 0, 3);
  const std::string file = path("resume.safetensors");
  FLAME_ASSERT_OK(flame_optimizer_save_state(opt, file.c_str()));
  std::vector<T> b;
  for (int k = 0; k < 3; ++k) {
    T copy;
    FLAME_ASSERT_OK(flame_clone(a[static_cast<size_t>(k)], copy.out()));
    b.push_back(std::move(copy));
  }
  run(opt, a, 3, 6);
  // A 32-bit optimizer refuses the 8-bit file and stays usable; the 8-bit one loads and continues.
  flame_optimizer_t wide = make_optimizer(ctx, o, {b[0], b[1], b[2]}, 32);
  EXPECT_EQ(flame_optimizer_load_state(wide, file.c_str()), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("8-bit"), std::string::npos) << flame_last_error_message();
  flame_optimizer_release(wide);
  flame_optimizer_t resumed = make_optimizer(ctx, o, {b[0], b[1], b[2]}, 8);
  FLAME_ASSERT_OK(flame_optimizer_load_state(resumed, file.c_str()));
  run(resumed, b, 3, 6);
  for (int k = 0; k < 3; ++k) {
    const HT x = download(a[static_cast<size_t>(k)]), y = download(b[static_cast<size_t>(k)]);
    EXPECT_TRUE(x.values() == y.values()) << "param " << k << " differs after the resumed steps";
  }
  // A 32-bit state file does not load into an 8-bit optimizer either.
  flame_optimizer_t plain = make_optimizer(ctx, o, {b[0], b[1], b[2]}, 32);
  run(plain, b, 0, 1);
  const std::string plain_file = path("plain.safetensors");
  FLAME_ASSERT_OK(flame_optimizer_save_state(plain, plain_file.c_str()));
  flame_optimizer_t narrow = make_optimizer(ctx, o, {b[0], b[1], b[2]}, 8);
  EXPECT_EQ(flame_optimizer_load_state(narrow, plain_file.c_str()), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("32-bit"), std::string::npos) << flame_last_error_message();
  // An 8-bit file whose group says amsgrad (which 8-bit states cannot keep) is refused.
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find("amsgrad"), colon = bytes.find(':', at);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bytes.at(colon + 1), '0');
  bytes[colon + 1] = '1';
  const std::string amsgrad_file = path("amsgrad.safetensors");
  std::ofstream(amsgrad_file, std::ios::binary) << bytes;
  EXPECT_EQ(flame_optimizer_load_state(narrow, amsgrad_file.c_str()), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(std::string(flame_last_error_message()).find("amsgrad"), std::string::npos) << flame_last_error_message();
  for (flame_optimizer_t x : {opt, resumed, plain, narrow}) flame_optimizer_release(x);
}

TEST_F(Optim8bit, CapturedStepReplaysAsEagerSteps) {
  HREF_RNG(rng);
  const HT w = random(rng, {9000}, FLAME_DTYPE_F32, -1, 1);
  const HT g = random(rng, {9000}, FLAME_DTYPE_F32, -1, 1);
  T eager = upload(ctx, w), graph = upload(ctx, w);
  flame_optimizer_options_t o;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_LION));
  o.lr = 1e-3;
  flame_optimizer_t a = make_optimizer(ctx, o, {eager}, 8), b = make_optimizer(ctx, o, {graph}, 8);
  set_grad(ctx, eager, g);
  set_grad(ctx, graph, g);
  for (int s = 0; s < 4; ++s) FLAME_ASSERT_OK(flame_optimizer_step(a));
  FLAME_ASSERT_OK(flame_optimizer_step(b));  // the state exists before the capture
  FLAME_ASSERT_OK(flame_graph_capture_begin(ctx));
  const flame_status_t st = flame_optimizer_step(b);
  flame_graph_t captured = nullptr;
  FLAME_ASSERT_OK(flame_graph_capture_end(ctx, &captured));
  FLAME_ASSERT_OK(st);
  for (int s = 0; s < 3; ++s) FLAME_ASSERT_OK(flame_graph_replay(captured));
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  EXPECT_TRUE(download(eager).values() == download(graph).values());
  int64_t steps = 0;
  FLAME_ASSERT_OK(flame_optimizer_step_count(b, &steps));
  EXPECT_EQ(steps, 4);
  flame_graph_release(captured);
  flame_optimizer_release(a);
  flame_optimizer_release(b);
}

TEST_F(Optim8bit, BadRequestsAreErrorsThatChangeNothing) {
  HREF_RNG(rng);
  T p = upload(ctx, random(rng, {5000}, FLAME_DTYPE_F32, -1, 1));
  flame_tensor_t raw = p;
  EXPECT_EQ(flame_optimizer_set_state_bits(nullptr, 8), FLAME_ERROR_INVALID_ARGUMENT);
  flame_optimizer_options_t o;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_SGD));
  o.momentum = 0.9;
  flame_optimizer_t sgd = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &o, &raw, 1, &sgd));
  EXPECT_EQ(flame_optimizer_set_state_bits(sgd, 8), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("sgd"), std::string::npos) << flame_last_error_message();
  flame_optimizer_release(sgd);

  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW));
  o.amsgrad = 1;
  flame_optimizer_t ams = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &o, &raw, 1, &ams));
  EXPECT_EQ(flame_optimizer_set_state_bits(ams, 8), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("amsgrad"), std::string::npos) << flame_last_error_message();
  flame_optimizer_release(ams);

  o.amsgrad = 0;
  flame_optimizer_t opt = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &o, &raw, 1, &opt));
  EXPECT_EQ(flame_optimizer_set_state_bits(opt, 7), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_optimizer_set_state_bits(opt, 16), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_ASSERT_OK(flame_optimizer_set_state_bits(opt, 8));
  FLAME_ASSERT_OK(flame_optimizer_set_state_bits(opt, 8));  // unchanged: fine
  // An amsgrad group cannot join an 8-bit optimizer.
  T q = upload(ctx, random(rng, {10}, FLAME_DTYPE_F32, -1, 1));
  flame_tensor_t raw_q = q;
  o.amsgrad = 1;
  EXPECT_EQ(flame_optimizer_add_param_group(opt, &o, &raw_q, 1, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  set_grad(ctx, p, random(rng, {5000}, FLAME_DTYPE_F32, -1, 1));
  FLAME_ASSERT_OK(flame_optimizer_step(opt));
  uint64_t before = 0, after = 0;
  FLAME_ASSERT_OK(flame_optimizer_state_bytes(opt, &before));
  EXPECT_EQ(before, 2u * (5000 + 4 * 20));
  // Once it holds state, the width stays.
  EXPECT_EQ(flame_optimizer_set_state_bits(opt, 32), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("before the first step"), std::string::npos)
      << flame_last_error_message();
  FLAME_ASSERT_OK(flame_optimizer_state_bytes(opt, &after));
  EXPECT_EQ(after, before);
  FLAME_ASSERT_OK(flame_optimizer_step(opt));
  flame_optimizer_release(opt);
}

}  // namespace
