// LoKr adapters (flame_model_add_lora's "type": "lokr", src/models/model_lora.h) through the C ABI on a
// tiny CLIP text model (q/k/v/out_proj [64, 64], fc1 [96, 64]) and a tiny Flux:
//  - a new LoKr changes no output (W2 or lokr_w2_b zero), freezes the base, and names its factors as
//    peft's LoKr state dict ("<module>.lokr_w1", "_w1_a", "_w1_b", "_w2", "_w2_a", "_w2_b") with the
//    shapes of LyCORIS' factorization rule;
//  - with random factors the output equals that of a second model whose weights hold
//    W + multiplier * scale * kron(W1, W2) computed on the host in double (scale = alpha / rank when a
//    factor is low rank, 1 when both are whole), for whole / low-rank W1 and W2 and a factor;
//  - the gradients of every factor equal the chain rule on the host (double) through that merged
//    model's weight gradient G: dW1[i, j] = s sum_kl G[i c + k, j d + l] W2[k, l], dW2 likewise, and
//    for a low-rank W = A B: dA = dW B^T, dB = A^T dW; no base parameter gets a gradient;
//  - a kohya file (LyCORIS' keys) loads back into a fresh model with the same output; the peft
//    format refuses LoKr; merge gives the adapter's output; bad options change nothing.
// ComfyUI's key rules for the written keys: tests/cpu/test_lora_format.cpp (LoraFormat.Lokr*);
// peft's LoKr reading FLAME's file: tests/models/check_lokr_parity.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>
#include <unistd.h>
#include "flame_test.h"
#include "model_test_handles.h"

namespace {

class ModelLokr : public GpuTest {};

const char* const kClip = kTinyClipConfig;
const char* const kFlux = kTinyFluxConfig;

struct Case {
  const char* arch;
  const char* config;
  const char* output;
};
const Case kClipCase = {"CLIPTextModel", kClip, "last_hidden_state"};
const Case kFluxCase = {"FluxTransformer2DModel", kFlux, "sample"};

void make_model(flame_ctx_t ctx, const Case& c, ModelHandle& m) {
  ASSERT_EQ(flame_model_create(ctx, c.arch, c.config, nullptr, &m.m), FLAME_OK) << flame_last_error_message();
  ParamsHandle ps;
  ASSERT_EQ(flame_model_params(m.m, &ps.p), FLAME_OK);
  fill_list(ps.p, 12345, 0.2f);
}

std::vector<float> run(flame_model_t m, const Case& c, flame_params_t in) { return forward_output(m, c.output, in); }

flame_tensor_t find_or_null(flame_params_t list, const std::string& name) {
  flame_tensor_t t = nullptr;
  EXPECT_EQ(flame_params_find(list, name.c_str(), &t), FLAME_OK);
  return t;
}

// A row-major host matrix.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  double at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * cols + j)]; }
};

Mat mat_of(flame_tensor_t t) {
  const std::vector<int64_t> s = shape_of(t);
  EXPECT_EQ(s.size(), 2u);
  return {s.at(0), s.at(1), to_double(host_of(t))};
}

Mat matmul(const Mat& a, const Mat& b) {
  Mat c{a.rows, b.cols, std::vector<double>(static_cast<size_t>(a.rows * b.cols), 0.0)};
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t k = 0; k < a.cols; ++k)
      for (int64_t j = 0; j < b.cols; ++j) c.v[static_cast<size_t>(i * c.cols + j)] += a.at(i, k) * b.at(k, j);
  return c;
}

Mat transposed(const Mat& a) {
  Mat t{a.cols, a.rows, std::vector<double>(a.v.size())};
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < a.cols; ++j) t.v[static_cast<size_t>(j * t.cols + i)] = a.at(i, j);
  return t;
}

// One LoKr module of an adapter list on the host: its factors (A / B null-sized when whole).
struct HostLokr {
  std::string module;
  flame_tensor_t t1 = nullptr, t1a = nullptr, t1b = nullptr, t2 = nullptr, t2a = nullptr, t2b = nullptr;
  Mat w1, w2;  // the full factors
  int64_t rank() const { return t2a ? shape_of(t2a)[1] : t1a ? shape_of(t1a)[1] : 0; }
};

std::vector<HostLokr> lokr_modules(flame_params_t adapter) {
  std::map<std::string, HostLokr> by_module;
  std::vector<std::string> order;
  for (const std::string& n : names_of(adapter)) {
    const size_t dot = n.rfind(".lokr_w");
    EXPECT_NE(dot, std::string::npos) << n << ": not a LoKr factor name";
    if (dot == std::string::npos) continue;
    const std::string mod = n.substr(0, dot), part = n.substr(dot + 1);
    if (!by_module.count(mod)) order.push_back(mod);
    HostLokr& h = by_module[mod];
    h.module = mod;
    flame_tensor_t t = find_or_null(adapter, n);
    if (part == "lokr_w1") h.t1 = t;
    else if (part == "lokr_w1_a") h.t1a = t;
    else if (part == "lokr_w1_b") h.t1b = t;
    else if (part == "lokr_w2") h.t2 = t;
    else if (part == "lokr_w2_a") h.t2a = t;
    else if (part == "lokr_w2_b") h.t2b = t;
    else ADD_FAILURE() << n << ": unknown LoKr factor";
  }
  std::vector<HostLokr> out;
  for (const std::string& mod : order) {
    HostLokr h = by_module.at(mod);
    EXPECT_TRUE(h.t1 ? !h.t1a && !h.t1b : h.t1a && h.t1b) << mod;
    EXPECT_TRUE(h.t2 ? !h.t2a && !h.t2b : h.t2a && h.t2b) << mod;
    h.w1 = h.t1 ? mat_of(h.t1) : matmul(mat_of(h.t1a), mat_of(h.t1b));
    h.w2 = h.t2 ? mat_of(h.t2) : matmul(mat_of(h.t2a), mat_of(h.t2b));
    out.push_back(std::move(h));
  }
  return out;
}

// LyCORIS' scale: alpha / rank when a factor is low rank, 1 when both are whole.
double lokr_scale(const HostLokr& h, double alpha) { return h.t1 && h.t2 ? 1.0 : alpha / static_cast<double>(h.rank()); }

// Writes W + s kron(W1, W2) (host, double) into the weights of `into` for every LoKr module.
void merge_on_host(const std::vector<HostLokr>& mods, flame_params_t params, flame_model_t into, double s) {
  ParamsHandle dst;
  ASSERT_EQ(flame_model_params(into, &dst.p), FLAME_OK);
  for (const HostLokr& h : mods) {
    const Mat w = mat_of(find_or_null(params, h.module + ".weight"));
    const int64_t c = h.w2.rows, d = h.w2.cols;
    ASSERT_EQ(h.w1.rows * c, w.rows) << h.module;
    ASSERT_EQ(h.w1.cols * d, w.cols) << h.module;
    std::vector<float> merged(w.v.size());
    for (int64_t o = 0; o < w.rows; ++o)
      for (int64_t k = 0; k < w.cols; ++k)
        merged[static_cast<size_t>(o * w.cols + k)] =
            static_cast<float>(w.at(o, k) + s * h.w1.at(o / c, k / d) * h.w2.at(o % c, k % d));
    ASSERT_EQ(flame_copy_from_host(find_or_null(dst.p, h.module + ".weight"), merged.data(), merged.size() * sizeof(float)),
              FLAME_OK);
  }
}

std::string temp_path(const char* tag) {
  return std::string("/tmp/flame_model_lokr_") + tag + "_" + std::to_string(static_cast<long>(getpid())) + ".safetensors";
}

// Adds a LoKr adapter with options, checks the fresh adapter, fills it, and compares the output and
// every factor's gradient with the host reference. alpha / multiplier: the options' values.
void check_lokr(flame_ctx_t ctx, const char* options, double alpha, double multiplier, size_t modules,
                const std::vector<std::string>& expect_parts) {
  SCOPED_TRACE(options);
  const Case& c = kClipCase;
  ModelHandle m;
  make_model(ctx, c, m);
  ParamsHandle in, params, adapter;
  make_tiny_model_inputs(ctx, c.arch, in);
  ASSERT_EQ(flame_model_params(m.m, &params.p), FLAME_OK);
  const std::vector<float> base = run(m.m, c, in.p);
  ASSERT_EQ(flame_model_add_lora(m.m, options, &adapter.p), FLAME_OK) << flame_last_error_message();
  std::vector<HostLokr> mods = lokr_modules(adapter.p);
  ASSERT_EQ(mods.size(), modules);
  for (const HostLokr& h : mods) {
    std::vector<std::string> parts;
    for (const char* p : {"lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b"}) {
      flame_tensor_t t = nullptr;
      ASSERT_EQ(flame_params_find(adapter.p, (h.module + "." + p).c_str(), &t), FLAME_OK);
      if (!t) continue;
      parts.push_back(p);
      int32_t rg = 0;
      ASSERT_EQ(flame_tensor_requires_grad(t, &rg), FLAME_OK);
      EXPECT_EQ(rg, 1) << h.module << "." << p << ": a factor is a trainable leaf";
    }
    if (h.module.find("fc1") == std::string::npos) {
      EXPECT_EQ(parts, expect_parts) << h.module;
    }
  }
  EXPECT_LE(rel_diff(run(m.m, c, in.p), base), 1e-6) << "a new LoKr adapter changed the output";

  fill_list(adapter.p, 777, 0.6f);
  mods = lokr_modules(adapter.p);
  const std::vector<float> adapted = run(m.m, c, in.p);
  EXPECT_GT(rel_diff(adapted, base), 1e-3) << "the LoKr adapter has no effect";
  ModelHandle merged;
  make_model(ctx, c, merged);
  for (const HostLokr& h : mods) {
    std::vector<HostLokr> one{h};
    merge_on_host(one, params.p, merged.m, multiplier * lokr_scale(h, alpha));
  }
  EXPECT_LE(rel_diff(adapted, run(merged.m, c, in.p)), 1e-4) << "LoKr output differs from (W + s kron(W1, W2)) x + b";

  backward_sum_squares(ctx, m.m, c.output, in.p);
  backward_sum_squares(ctx, merged.m, c.output, in.p);
  ParamsHandle merged_params;
  ASSERT_EQ(flame_model_params(merged.m, &merged_params.p), FLAME_OK);
  for (const HostLokr& h : mods) {
    SCOPED_TRACE(h.module);
    const double s = multiplier * lokr_scale(h, alpha);
    const std::vector<double> gv = grad_of(find_or_null(merged_params.p, h.module + ".weight"));
    const int64_t a = h.w1.rows, b = h.w1.cols, cc = h.w2.rows, d = h.w2.cols;
    ASSERT_EQ(static_cast<int64_t>(gv.size()), a * cc * b * d);
    const Mat g{a * cc, b * d, gv};
    Mat g1{a, b, std::vector<double>(static_cast<size_t>(a * b), 0.0)}, g2{cc, d, std::vector<double>(static_cast<size_t>(cc * d), 0.0)};
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j)
        for (int64_t k = 0; k < cc; ++k)
          for (int64_t l = 0; l < d; ++l) {
            const double gg = s * g.at(i * cc + k, j * d + l);
            g1.v[static_cast<size_t>(i * b + j)] += gg * h.w2.at(k, l);
            g2.v[static_cast<size_t>(k * d + l)] += gg * h.w1.at(i, j);
          }
    auto expect_grads = [&](flame_tensor_t whole, flame_tensor_t fa, flame_tensor_t fb, const Mat& gw, const char* what) {
      if (whole) {
        EXPECT_LE(rel_diff(grad_of(whole), gw.v), 1e-3) << what;
        return;
      }
      const Mat ma = mat_of(fa), mb = mat_of(fb);
      EXPECT_LE(rel_diff(grad_of(fa), matmul(gw, transposed(mb)).v), 1e-3) << what << "_a";
      EXPECT_LE(rel_diff(grad_of(fb), matmul(transposed(ma), gw).v), 1e-3) << what << "_b";
    };
    expect_grads(h.t1, h.t1a, h.t1b, g1, "dL/dW1");
    expect_grads(h.t2, h.t2a, h.t2b, g2, "dL/dW2");
  }
  for (const std::string& name : names_of(params.p)) {
    T gr;
    ASSERT_EQ(flame_tensor_grad(find_or_null(params.p, name), gr.out()), FLAME_OK);
    EXPECT_EQ(gr.h, nullptr) << name << " got a gradient: the base is frozen";
  }
}

// q/k/v/out_proj [64, 64]: factorization(64) = (8, 8). fc1 [96, 64]: (8, 12) x (8, 8).
TEST_F(ModelLokr, MatchesHostKroneckerAndGradients) {
  // rank 4 >= 8 / 2: both factors whole (scale 1 whatever alpha)
  check_lokr(ctx, R"({"type": "lokr", "rank": 4, "alpha": 3, "targets": ["q_proj", "v_proj"]})", 3, 1, 4,
             {"lokr_w1", "lokr_w2"});
  // rank 2 < 8 / 2: W2 low rank (scale alpha / rank); with fc1 [96, 64]
  check_lokr(ctx, R"({"type": "lokr", "rank": 2, "alpha": 3, "targets": ["k_proj", "fc1"]})", 3, 1, 4,
             {"lokr_w1", "lokr_w2_a", "lokr_w2_b"});
  // decompose_both: W1 low rank too; a multiplier
  check_lokr(ctx, R"({"type": "lokr", "rank": 2, "alpha": 5, "decompose_both": true, "multiplier": 0.5, "targets": ["out_proj", "fc1"]})",
             5, 0.5, 4, {"lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b"});
  // factor 4: 64 = 4 x 16, W2 [16, 16] low rank at rank 4
  // q_proj alone moves the tiny CLIP's output by ~1e-5 only (through the softmax of short sequences),
  // below the "has an effect" check: out_proj joins it.
  check_lokr(ctx, R"({"type": "lokr", "rank": 4, "alpha": 8, "factor": 4, "targets": ["q_proj", "out_proj"]})", 8, 1, 4,
             {"lokr_w1", "lokr_w2_a", "lokr_w2_b"});
}

TEST_F(ModelLokr, FactorShapesFollowLycoris) {
  ModelHandle m;
  make_model(ctx, kClipCase, m);
  ParamsHandle adapter;
  ASSERT_EQ(flame_model_add_lora(m.m, R"({"type": "lokr", "rank": 2, "factor": 4, "targets": ["text_model.encoder.layers.0.mlp.fc1"]})",
                                 &adapter.p), FLAME_OK) << flame_last_error_message();
  // fc1 [96, 64], factor 4: (4, 24) x (4, 16); W2 [24, 16] low rank (2 < 12)
  const std::string mod = "text_model.encoder.layers.0.mlp.fc1";
  EXPECT_EQ(names_of(adapter.p), (std::vector<std::string>{mod + ".lokr_w1", mod + ".lokr_w2_a", mod + ".lokr_w2_b"}));
  EXPECT_EQ(shape_of(find_or_null(adapter.p, mod + ".lokr_w1")), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(shape_of(find_or_null(adapter.p, mod + ".lokr_w2_a")), (std::vector<int64_t>{24, 2}));
  EXPECT_EQ(shape_of(find_or_null(adapter.p, mod + ".lokr_w2_b")), (std::vector<int64_t>{2, 16}));
  // LyCORIS' init: W1 Kaiming-uniform in +-1/sqrt(4), W2's a in +-1/sqrt(2), W2's b zero
  const std::vector<float> w1 = host_of(find_or_null(adapter.p, mod + ".lokr_w1"));
  EXPECT_TRUE(std::any_of(w1.begin(), w1.end(), [](float v) { return v != 0; }));
  for (float v : w1) EXPECT_LE(std::fabs(v), 0.5f);
  for (float v : host_of(find_or_null(adapter.p, mod + ".lokr_w2_a"))) EXPECT_LE(std::fabs(v), 1.0f / std::sqrt(2.0f) + 1e-6f);
  for (float v : host_of(find_or_null(adapter.p, mod + ".lokr_w2_b"))) EXPECT_EQ(v, 0.0f);
}

TEST_F(ModelLokr, KohyaFileRoundTripsAndPeftRefuses) {
  for (const char* opts : {R"({"type": "lokr", "rank": 2, "alpha": 3, "decompose_both": true})",
                           R"({"type": "lokr", "rank": 4, "alpha": 3, "multiplier": 0.7})",
                           R"({"type": "lokr", "rank": 2, "alpha": 6, "multiplier": 0.5, "targets": ["fc1", "fc2"]})"}) {
    SCOPED_TRACE(opts);
    const Case& c = kClipCase;
    ModelHandle m;
    make_model(ctx, c, m);
    ParamsHandle in, adapter;
    make_tiny_model_inputs(ctx, c.arch, in);
    ASSERT_EQ(flame_model_add_lora(m.m, opts, &adapter.p), FLAME_OK) << flame_last_error_message();
    fill_list(adapter.p, 4242, 0.6f);
    const std::vector<float> adapted = run(m.m, c, in.p);
    const std::string path = temp_path("kohya");
    ASSERT_EQ(flame_model_save_lora(m.m, nullptr, path.c_str(), R"({"format": "kohya"})"), FLAME_OK) << flame_last_error_message();
    ModelHandle fresh;
    make_model(ctx, c, fresh);
    ParamsHandle loaded;
    ASSERT_EQ(flame_model_load_lora(fresh.m, path.c_str(), R"({"trainable": true})", &loaded.p), FLAME_OK)
        << flame_last_error_message();
    EXPECT_EQ(names_of(loaded.p), names_of(adapter.p)) << "the file holds other factors";
    EXPECT_LE(rel_diff(run(fresh.m, c, in.p), adapted), 1e-5) << "the kohya LoKr file means another adapter";
    // the loaded factors train: gradients reach them
    backward_sum_squares(ctx, fresh.m, c.output, in.p);
    for (const std::string& n : names_of(loaded.p)) {
      double mx = 0;
      for (double v : grad_of(find_or_null(loaded.p, n))) mx = std::max(mx, std::fabs(v));
      EXPECT_GT(mx, 0) << n;
    }
    std::remove(path.c_str());

    const std::string peft = temp_path("peft");
    EXPECT_EQ(flame_model_save_lora(m.m, nullptr, peft.c_str(), R"({"format": "peft"})"), FLAME_ERROR_INVALID_ARGUMENT);
    const std::string msg = flame_last_error_message();
    EXPECT_NE(msg.find("LoKr"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kohya"), std::string::npos) << msg;
    EXPECT_NE(access(peft.c_str(), F_OK), 0) << "a refused save left a file";
  }
}

TEST_F(ModelLokr, FluxFusedTargetsSaveUnderMemberNamesAndLoadBack) {
  const Case& c = kFluxCase;
  ModelHandle m;
  make_model(ctx, c, m);
  ParamsHandle in, adapter;
  make_tiny_model_inputs(ctx, c.arch, in);
  ASSERT_EQ(flame_model_add_lora(m.m, R"({"type": "lokr", "rank": 2, "targets": ["to_q", "to_out.0"]})", &adapter.p), FLAME_OK)
      << flame_last_error_message();
  fill_list(adapter.p, 99, 0.5f);
  const std::vector<float> adapted = run(m.m, c, in.p);
  // to_q lives in the fused img_attn.qkv of BFL's layout: stored under OneTrainer's member name
  // (lora_transformer_transformer_blocks_0_attn_to_q), it loads back to the same adapter
  const std::string path = temp_path("flux");
  ASSERT_EQ(flame_model_save_lora(m.m, nullptr, path.c_str(), nullptr), FLAME_OK) << flame_last_error_message();
  {
    ModelHandle fresh;
    make_model(ctx, c, fresh);
    ParamsHandle loaded;
    ASSERT_EQ(flame_model_load_lora(fresh.m, path.c_str(), nullptr, &loaded.p), FLAME_OK) << flame_last_error_message();
    EXPECT_LE(rel_diff(run(fresh.m, c, in.p), adapted), 1e-5) << "the member-named LoKr file means another adapter";
  }
  std::remove(path.c_str());
  // to_out.0 alone (img_attn.proj, whole) saves under its original name and loads back
  ASSERT_EQ(flame_model_remove_lora(m.m, nullptr), FLAME_OK);
  ParamsHandle proj_adapter;
  ASSERT_EQ(flame_model_add_lora(m.m, R"({"name": "proj", "type": "lokr", "rank": 2, "alpha": 1, "targets": ["to_out.0", "proj_out"]})",
                                 &proj_adapter.p), FLAME_OK) << flame_last_error_message();
  fill_list(proj_adapter.p, 98, 0.5f);
  const std::vector<float> proj = run(m.m, c, in.p);
  ASSERT_EQ(flame_model_save_lora(m.m, "proj", path.c_str(), nullptr), FLAME_OK) << flame_last_error_message();
  ModelHandle fresh;
  make_model(ctx, c, fresh);
  ParamsHandle loaded;
  ASSERT_EQ(flame_model_load_lora(fresh.m, path.c_str(), nullptr, &loaded.p), FLAME_OK) << flame_last_error_message();
  EXPECT_LE(rel_diff(run(fresh.m, c, in.p), proj), 1e-5);
  std::remove(path.c_str());
}

void check_merge(flame_ctx_t ctx, const Case& c, const char* options) {
  SCOPED_TRACE(std::string(c.arch) + " " + options);
  ModelHandle m;
  make_model(ctx, c, m);
  ParamsHandle in, adapter;
  make_tiny_model_inputs(ctx, c.arch, in);
  ASSERT_EQ(flame_model_add_lora(m.m, options, &adapter.p), FLAME_OK) << flame_last_error_message();
  fill_list(adapter.p, 31, 0.5f);
  const std::vector<float> adapted = run(m.m, c, in.p);
  ASSERT_EQ(flame_model_merge_lora(m.m, nullptr), FLAME_OK) << flame_last_error_message();
  flame_params_t none = reinterpret_cast<flame_params_t>(1);
  EXPECT_EQ(flame_model_lora_params(m.m, nullptr, &none), FLAME_ERROR_INVALID_ARGUMENT) << "the merged adapter is still there";
  EXPECT_LE(rel_diff(run(m.m, c, in.p), adapted), 1e-5) << "the merged weights give another output";
}

TEST_F(ModelLokr, MergeGivesTheAdapterOutput) {
  check_merge(ctx, kClipCase, R"({"type": "lokr", "rank": 4, "alpha": 8})");
  check_merge(ctx, kClipCase, R"({"type": "lokr", "rank": 2, "alpha": 8, "decompose_both": true, "multiplier": 0.5})");
  check_merge(ctx, kFluxCase, R"({"type": "lokr", "rank": 2, "alpha": 2, "preset": "kohya"})");
}

TEST_F(ModelLokr, BadOptionsChangeNothing) {
  ModelHandle m;
  make_model(ctx, kClipCase, m);
  ParamsHandle in;
  make_tiny_model_inputs(ctx, kClipCase.arch, in);
  const std::vector<float> base = run(m.m, kClipCase, in.p);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"type": "lokr", "dora": true})", "dora"},
      {R"({"type": "loha"})", "type"},
      {R"({"factor": 4})", "factor"},
      {R"({"type": "lokr", "factor": 0})", "factor"},
      {R"({"type": "lokr", "decompose_both": 1})", "decompose_both"},
      {R"({"type": "lokr", "init": "gaussian"})", "init"},
  };
  for (const auto& [opts, needle] : bad) {
    flame_params_t none = reinterpret_cast<flame_params_t>(1);
    EXPECT_EQ(flame_model_add_lora(m.m, opts, &none), FLAME_ERROR_INVALID_ARGUMENT) << opts;
    EXPECT_EQ(none, nullptr);
    EXPECT_NE(std::string(flame_last_error_message()).find(needle), std::string::npos) << flame_last_error_message();
  }
  flame_params_t none = reinterpret_cast<flame_params_t>(1);
  EXPECT_EQ(flame_model_lora_params(m.m, nullptr, &none), FLAME_ERROR_INVALID_ARGUMENT) << "a refused adapter stayed";
  EXPECT_LE(rel_diff(run(m.m, kClipCase, in.p), base), 1e-7);
}

}  // namespace
