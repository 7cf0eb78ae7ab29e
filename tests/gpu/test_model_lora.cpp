// LoRA adapters on models through the C ABI (flame_model_add_lora / _save_lora / _load_lora), on tiny
// Flux, SDXL UNet and CLIP models with distinct parameter values:
//  - a new adapter changes no output (B = 0), freezes the base and trains only A and B;
//  - with random A and B, the output equals that of a second model whose weights hold
//    W + alpha / rank * B A (merged on the host in double): the adapter's math, independently;
//  - backward reaches every A and B and no base parameter;
//  - written as kohya and as peft files and loaded into a fresh model of the same base weights, the
//    adapter gives the same output (Flux's kohya file stores fused qkv / linear1 pairs: the load
//    splits them exactly);
//  - removing the adapter restores the base output; bad requests fail and change nothing.
// DoRA (ModelLora.Dora*): the magnitude starts at ||W||_row; with random A, B and m the output equals
// that of a model holding (m / n) (W + s B A) (host, double), and the gradients of A, B and m equal
// the chain rule (host, double) through that merged model's weight gradients; kohya and peft files
// round-trip (Flux: fused qkv / linear1 with members lacking a LoRA, and swapped halves).
// Merge (ModelLora.Merge*): flame_model_merge_lora gives the adapter's output without the adapter.
// Conformance with diffusers' and ComfyUI's readers is tests/models/check_lora_formats.py's job.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>
#include <unistd.h>
#include <algorithm>
#include "flame_test.h"
#include "model_test_handles.h"

namespace {

class ModelLora : public GpuTest {};


const char* const kFlux = kTinyFluxConfig;
const char* const kUnetSdxl = R"({"block_out_channels": [32, 48, 64], "layers_per_block": 2,
  "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
  "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
  "transformer_layers_per_block": [1, 2, 3], "attention_head_dim": [1, 2, 4], "cross_attention_dim": 40,
  "use_linear_projection": true, "norm_num_groups": 8, "addition_embed_type": "text_time",
  "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 72})";
const char* const kClip = kTinyClipConfig;

struct Case {
  const char* arch;
  const char* config;
  const char* output;
};


void make_model(flame_ctx_t ctx, const Case& c, ModelHandle& m) {
  ASSERT_EQ(flame_model_create(ctx, c.arch, c.config, nullptr, &m.m), FLAME_OK) << flame_last_error_message();
  ParamsHandle ps;
  ASSERT_EQ(flame_model_params(m.m, &ps.p), FLAME_OK);
  fill_list(ps.p, 12345, 0.2f);
}

void make_inputs(flame_ctx_t ctx, const Case& c, ParamsHandle& in) { make_tiny_model_inputs(ctx, c.arch, in); }

std::vector<float> run(flame_model_t m, const Case& c, flame_params_t in) { return forward_output(m, c.output, in); }

// Writes W + scale * B A into model's weights for every module of the adapter list (host, double).
void merge_on_host(flame_params_t adapter, flame_model_t into, double scale) {
  ParamsHandle ps;
  ASSERT_EQ(flame_model_params(into, &ps.p), FLAME_OK);
  int64_t count = 0;
  ASSERT_EQ(flame_params_count(adapter, &count), FLAME_OK);
  for (int64_t i = 0; i + 1 < count; i += 2) {
    const char *name_a = nullptr, *name_b = nullptr;
    flame_tensor_t a = nullptr, b = nullptr, w = nullptr;
    ASSERT_EQ(flame_params_name(adapter, i, &name_a), FLAME_OK);
    ASSERT_EQ(flame_params_name(adapter, i + 1, &name_b), FLAME_OK);
    const std::string module = std::string(name_a).substr(0, std::string(name_a).size() - std::string(".lora_A.weight").size());
    ASSERT_EQ(std::string(name_b), module + ".lora_B.weight");
    ASSERT_EQ(flame_params_tensor(adapter, i, &a), FLAME_OK);
    ASSERT_EQ(flame_params_tensor(adapter, i + 1, &b), FLAME_OK);
    ASSERT_EQ(flame_params_find(ps.p, (module + ".weight").c_str(), &w), FLAME_OK);
    ASSERT_NE(w, nullptr) << module;
    int64_t sa[2], sb[2];
    ASSERT_EQ(flame_tensor_shape(a, sa, 2), FLAME_OK);
    ASSERT_EQ(flame_tensor_shape(b, sb, 2), FLAME_OK);
    const int64_t r = sa[0], in = sa[1], out = sb[0];
    const std::vector<float> va = host_of(a), vb = host_of(b);
    std::vector<float> vw = host_of(w);
    ASSERT_EQ(static_cast<int64_t>(vw.size()), out * in) << module;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) {
        double d = 0;
        for (int64_t j = 0; j < r; ++j) d += static_cast<double>(vb[o * r + j]) * va[j * in + k];
        vw[o * in + k] = static_cast<float>(vw[o * in + k] + scale * d);
      }
    ASSERT_EQ(flame_copy_from_host(w, vw.data(), vw.size() * sizeof(float)), FLAME_OK);
  }
}

std::string temp_path(const char* tag) {
  return std::string("/tmp/flame_model_lora_") + tag + "_" + std::to_string(static_cast<long>(getpid())) + ".safetensors";
}

void check_case(flame_ctx_t ctx, const Case& c) {
  SCOPED_TRACE(c.arch);
  ModelHandle m;
  make_model(ctx, c, m);
  ParamsHandle in;
  make_inputs(ctx, c, in);
  const std::vector<float> base = run(m.m, c, in.p);
  ASSERT_FALSE(base.empty());

  ParamsHandle adapter;
  ASSERT_EQ(flame_model_add_lora(m.m, R"({"rank": 4, "alpha": 8})", &adapter.p), FLAME_OK) << flame_last_error_message();
  int64_t n_adapter = 0;
  ASSERT_EQ(flame_params_count(adapter.p, &n_adapter), FLAME_OK);
  EXPECT_GE(n_adapter, 8);
  EXPECT_LE(rel_diff(run(m.m, c, in.p), base), 1e-6) << "a new adapter (B = 0) changed the output";

  // frozen base, trainable adapter
  ParamsHandle params;
  ASSERT_EQ(flame_model_params(m.m, &params.p), FLAME_OK);
  int64_t n_params = 0;
  ASSERT_EQ(flame_params_count(params.p, &n_params), FLAME_OK);
  for (int64_t i = 0; i < n_params; ++i) {
    flame_tensor_t t = nullptr;
    int32_t rg = 1;
    ASSERT_EQ(flame_params_tensor(params.p, i, &t), FLAME_OK);
    ASSERT_EQ(flame_tensor_requires_grad(t, &rg), FLAME_OK);
    EXPECT_EQ(rg, 0) << "base parameter " << i << " still requires grad";
  }

  fill_list(adapter.p, 777, 0.3f);
  const std::vector<float> adapted = run(m.m, c, in.p);
  EXPECT_GT(rel_diff(adapted, base), 1e-3) << "the adapter has no effect";

  ModelHandle merged;
  make_model(ctx, c, merged);
  merge_on_host(adapter.p, merged.m, 8.0 / 4.0);
  EXPECT_LE(rel_diff(adapted, run(merged.m, c, in.p)), 1e-4) << "adapter output differs from W + scale B A";

  // backward: every A and B gets a gradient, no base parameter does
  {
    ParamsHandle out;
    ASSERT_EQ(flame_model_forward(m.m, in.p, &out.p), FLAME_OK);
    flame_tensor_t y = nullptr;
    ASSERT_EQ(flame_params_find(out.p, c.output, &y), FLAME_OK);
    T sq, loss;
    ASSERT_EQ(flame_mul(y, y, sq.out()), FLAME_OK);
    ASSERT_EQ(flame_sum_all(sq.h, loss.out()), FLAME_OK);
    ASSERT_EQ(flame_backward(ctx, loss.h, nullptr, 0), FLAME_OK) << flame_last_error_message();
    for (int64_t i = 0; i < n_adapter; ++i) {
      flame_tensor_t t = nullptr;
      T g;
      ASSERT_EQ(flame_params_tensor(adapter.p, i, &t), FLAME_OK);
      ASSERT_EQ(flame_tensor_grad(t, g.out()), FLAME_OK);
      ASSERT_NE(g.h, nullptr) << "adapter tensor " << i << " got no gradient";
      double mx = 0;
      for (float v : host_of(g.h)) mx = std::max(mx, std::fabs(static_cast<double>(v)));
      EXPECT_GT(mx, 0) << "adapter tensor " << i << " has a zero gradient";
      ASSERT_EQ(flame_tensor_set_grad(t, nullptr), FLAME_OK);
    }
    for (int64_t i = 0; i < n_params; ++i) {
      flame_tensor_t t = nullptr;
      T g;
      ASSERT_EQ(flame_params_tensor(params.p, i, &t), FLAME_OK);
      ASSERT_EQ(flame_tensor_grad(t, g.out()), FLAME_OK);
      EXPECT_EQ(g.h, nullptr) << "base parameter " << i << " got a gradient";
    }
  }

  // files in both formats, read back into a fresh model of the same base weights
  for (const char* format : {"kohya", "peft"}) {
    SCOPED_TRACE(format);
    const std::string path = temp_path(format);
    const std::string opts = std::string(R"({"format": ")") + format + "\"}";
    ASSERT_EQ(flame_model_save_lora(m.m, nullptr, path.c_str(), opts.c_str()), FLAME_OK) << flame_last_error_message();
    ModelHandle fresh;
    make_model(ctx, c, fresh);
    ParamsHandle loaded;
    ASSERT_EQ(flame_model_load_lora(fresh.m, path.c_str(), nullptr, &loaded.p), FLAME_OK) << flame_last_error_message();
    EXPECT_LE(rel_diff(run(fresh.m, c, in.p), adapted), 1e-4) << "the " << format << " file means another adapter";
    std::remove(path.c_str());
  }

  // errors change nothing
  flame_params_t none = reinterpret_cast<flame_params_t>(1);
  EXPECT_EQ(flame_model_add_lora(m.m, R"({"rank": 2})", &none), FLAME_ERROR_INVALID_ARGUMENT);  // "default" in use
  EXPECT_EQ(none, nullptr);
  none = reinterpret_cast<flame_params_t>(1);
  EXPECT_EQ(flame_model_add_lora(m.m, R"({"name": "x", "targets": ["no_such_module"]})", &none), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("no_such_module"), std::string::npos);
  EXPECT_EQ(flame_model_add_lora(m.m, R"({"name": "x", "rank": 0})", &none), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_model_add_lora(m.m, R"({"name": "x", "ranks": 4})", &none), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("ranks"), std::string::npos);
  EXPECT_EQ(flame_model_lora_params(m.m, "x", &none), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_LE(rel_diff(run(m.m, c, in.p), adapted), 1e-6);

  ASSERT_EQ(flame_model_remove_lora(m.m, nullptr), FLAME_OK);
  EXPECT_LE(rel_diff(run(m.m, c, in.p), base), 1e-6) << "removing the adapter did not restore the base";
  EXPECT_EQ(flame_model_remove_lora(m.m, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(ModelLora, FluxAdapterMatchesMergedWeightsAndFiles) {
  check_case(ctx, {"FluxTransformer2DModel", kFlux, "sample"});
}

TEST_F(ModelLora, SdxlUnetAdapterMatchesMergedWeightsAndFiles) {
  check_case(ctx, {"UNet2DConditionModel", kUnetSdxl, "sample"});
}

TEST_F(ModelLora, ClipAdapterMatchesMergedWeightsAndFiles) {
  check_case(ctx, {"CLIPTextModel", kClip, "last_hidden_state"});
}

// Foreign files: a model checkpoint is no LoRA, and a Flux LoRA is none for a UNet.
TEST_F(ModelLora, ForeignFilesAreClearErrors) {
  ModelHandle flux, unet;
  make_model(ctx, {"FluxTransformer2DModel", kFlux, "sample"}, flux);
  make_model(ctx, {"UNet2DConditionModel", kUnetSdxl, "sample"}, unet);
  const std::string model_path = temp_path("model"), lora_path = temp_path("flux");
  ASSERT_EQ(flame_model_save(flux.m, model_path.c_str(), nullptr), FLAME_OK);
  ParamsHandle adapter;
  ASSERT_EQ(flame_model_add_lora(flux.m, nullptr, &adapter.p), FLAME_OK);
  ASSERT_EQ(flame_model_save_lora(flux.m, nullptr, lora_path.c_str(), nullptr), FLAME_OK) << flame_last_error_message();
  flame_params_t none = reinterpret_cast<flame_params_t>(1);
  EXPECT_EQ(flame_model_load_lora(unet.m, model_path.c_str(), nullptr, &none), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(flame_model_load_lora(unet.m, lora_path.c_str(), nullptr, &none), FLAME_ERROR_INVALID_FORMAT);
  EXPECT_NE(std::string(flame_last_error_message()).find("lora"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(flame_model_load_lora(unet.m, "/nonexistent/lora.safetensors", nullptr, &none), FLAME_ERROR_IO);
  EXPECT_EQ(flame_model_lora_params(unet.m, nullptr, &none), FLAME_ERROR_INVALID_ARGUMENT);  // nothing was added
  std::remove(model_path.c_str());
  std::remove(lora_path.c_str());
}

// ---- DoRA and merge ----

flame_tensor_t find_tensor(flame_params_t list, const std::string& name) {
  flame_tensor_t t = nullptr;
  EXPECT_EQ(flame_params_find(list, name.c_str(), &t), FLAME_OK);
  EXPECT_NE(t, nullptr) << name;
  return t;
}

std::string module_of(const std::string& name, const std::string& suffix) {
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0
             ? name.substr(0, name.size() - suffix.size())
             : std::string();
}

// The DoRA modules of an adapter list (those with a magnitude).
std::vector<std::string> dora_modules(flame_params_t adapter) {
  std::vector<std::string> out;
  for (const std::string& n : names_of(adapter)) {
    const std::string m = module_of(n, ".lora_magnitude_vector");
    if (!m.empty()) out.push_back(m);
  }
  return out;
}

// One DoRA module on the host in double: W [out, in], A [r, in], B [out, r], m [out], scale s.
struct HostDora {
  int64_t out = 0, in = 0, r = 0;
  std::vector<double> w, a, b, m;
  double s = 0;
  double adapted(int64_t o, int64_t k) const {  // (W + s B A)[o, k]
    double d = 0;
    for (int64_t j = 0; j < r; ++j) d += b[o * r + j] * a[j * in + k];
    return w[o * in + k] + s * d;
  }
  double row_norm(int64_t o) const {
    double n = 0;
    for (int64_t k = 0; k < in; ++k) n += adapted(o, k) * adapted(o, k);
    return std::sqrt(n);
  }
};

HostDora host_dora(flame_params_t adapter, flame_params_t params, const std::string& module, double scale) {
  HostDora h;
  flame_tensor_t a = find_tensor(adapter, module + ".lora_A.weight"), w = find_tensor(params, module + ".weight");
  int64_t sa[2] = {0, 0}, sw[2] = {0, 0};
  EXPECT_EQ(flame_tensor_shape(a, sa, 2), FLAME_OK);
  EXPECT_EQ(flame_tensor_shape(w, sw, 2), FLAME_OK);
  h.r = sa[0];
  h.in = sa[1];
  h.out = sw[0];
  h.s = scale;
  h.w = to_double(host_of(w));
  h.a = to_double(host_of(a));
  h.b = to_double(host_of(find_tensor(adapter, module + ".lora_B.weight")));
  h.m = to_double(host_of(find_tensor(adapter, module + ".lora_magnitude_vector")));
  return h;
}

// Gives every A, B and m of a DoRA adapter values: A and B pseudo-random, m = ||W||_row * (1 + 0.2 sin).
void fill_dora(flame_params_t adapter, flame_params_t params) {
  uint32_t seed = 4242;
  for (const std::string& mod : dora_modules(adapter)) {
    for (const char* part : {".lora_A.weight", ".lora_B.weight"}) {
      flame_tensor_t t = find_tensor(adapter, mod + part);
      int64_t n = 0;
      ASSERT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) {
        seed = seed * 1664525u + 1013904223u;
        x = (static_cast<float>(seed >> 8) / 16777216.0f - 0.5f) * 0.4f;
      }
      ASSERT_EQ(flame_copy_from_host(t, v.data(), v.size() * sizeof(float)), FLAME_OK);
    }
    const std::vector<float> w = host_of(find_tensor(params, mod + ".weight"));
    flame_tensor_t mt = find_tensor(adapter, mod + ".lora_magnitude_vector");
    std::vector<float> m = host_of(mt);
    const size_t in = w.size() / m.size();
    for (size_t o = 0; o < m.size(); ++o) {
      double n = 0;
      for (size_t k = 0; k < in; ++k) n += static_cast<double>(w[o * in + k]) * w[o * in + k];
      m[o] = static_cast<float>(std::sqrt(n) * (1.0 + 0.2 * std::sin(0.9 * static_cast<double>(o) + 0.1)));
    }
    ASSERT_EQ(flame_copy_from_host(mt, m.data(), m.size() * sizeof(float)), FLAME_OK);
  }
}

// Writes (m / n) (W + s B A) (host, double) into the weights of every DoRA module of `into`.
void merge_dora_on_host(flame_params_t adapter, flame_params_t params, flame_model_t into, double scale) {
  ParamsHandle dst;
  ASSERT_EQ(flame_model_params(into, &dst.p), FLAME_OK);
  for (const std::string& mod : dora_modules(adapter)) {
    const HostDora h = host_dora(adapter, params, mod, scale);
    std::vector<float> merged(static_cast<size_t>(h.out * h.in));
    for (int64_t o = 0; o < h.out; ++o) {
      const double f = h.m[o] / h.row_norm(o);
      for (int64_t k = 0; k < h.in; ++k) merged[o * h.in + k] = static_cast<float>(f * h.adapted(o, k));
    }
    ASSERT_EQ(flame_copy_from_host(find_tensor(dst.p, mod + ".weight"), merged.data(), merged.size() * sizeof(float)), FLAME_OK);
  }
}

double rel_diff_d(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return den > 0 ? num / den : num;
}

const Case kClipCase = {"CLIPTextModel", kClip, "last_hidden_state"};
const Case kFluxCase = {"FluxTransformer2DModel", kFlux, "sample"};

TEST_F(ModelLora, DoraMatchesHostMergedWeightsAndGradients) {
  const Case& c = kClipCase;
  ModelHandle m;
  make_model(ctx, c, m);
  ParamsHandle in, params;
  make_inputs(ctx, c, in);
  ASSERT_EQ(flame_model_params(m.m, &params.p), FLAME_OK);
  const std::vector<float> base = run(m.m, c, in.p);
  ParamsHandle adapter;
  ASSERT_EQ(flame_model_add_lora(m.m, R"({"rank": 4, "alpha": 8, "dora": true})", &adapter.p), FLAME_OK)
      << flame_last_error_message();
  const std::vector<std::string> mods = dora_modules(adapter.p);
  ASSERT_EQ(mods.size(), 2u * 4);  // q, k, v, out_proj of 2 layers
  EXPECT_EQ(names_of(adapter.p).size(), 3 * mods.size());
  // m starts at ||W||_row (B = 0), and the output is the base output.
  for (const std::string& mod : mods) {
    const HostDora h = host_dora(adapter.p, params.p, mod, 2.0);
    for (int64_t o = 0; o < h.out; ++o) EXPECT_NEAR(h.m[o], h.row_norm(o), 1e-5 * h.row_norm(o)) << mod << " row " << o;
    int32_t rg = 0;
    ASSERT_EQ(flame_tensor_requires_grad(find_tensor(adapter.p, mod + ".lora_magnitude_vector"), &rg), FLAME_OK);
    EXPECT_EQ(rg, 1) << mod << ": the magnitude is a trainable leaf";
  }
  EXPECT_LE(rel_diff(run(m.m, c, in.p), base), 1e-6) << "a new DoRA adapter changed the output";

  fill_dora(adapter.p, params.p);
  const std::vector<float> adapted = run(m.m, c, in.p);
  EXPECT_GT(rel_diff(adapted, base), 1e-3) << "the DoRA adapter has no effect";
  ModelHandle merged;
  make_model(ctx, c, merged);
  merge_dora_on_host(adapter.p, params.p, merged.m, 2.0);
  EXPECT_LE(rel_diff(adapted, run(merged.m, c, in.p)), 1e-4) << "DoRA output differs from (m / n) (W + s B A) x + b";

  // Gradients: with n constant, dL/dm = sum_k G (W + s B A) / n, dL/dB = s diag(m / n) G A^T and
  // dL/dA = s B^T diag(m / n) G, where G is the merged model's weight gradient.
  backward_sum_squares(ctx, m.m, c.output, in.p);
  backward_sum_squares(ctx, merged.m, c.output, in.p);
  ParamsHandle merged_params;
  ASSERT_EQ(flame_model_params(merged.m, &merged_params.p), FLAME_OK);
  for (const std::string& mod : mods) {
    SCOPED_TRACE(mod);
    const HostDora h = host_dora(adapter.p, params.p, mod, 2.0);
    const std::vector<double> g = grad_of(find_tensor(merged_params.p, mod + ".weight"));
    ASSERT_EQ(static_cast<int64_t>(g.size()), h.out * h.in);
    std::vector<double> gm(h.out, 0.0), gb(h.out * h.r, 0.0), ga(h.r * h.in, 0.0);
    for (int64_t o = 0; o < h.out; ++o) {
      const double n = h.row_norm(o), f = h.m[o] / n;
      for (int64_t k = 0; k < h.in; ++k) {
        const double gok = g[o * h.in + k];
        gm[o] += gok * h.adapted(o, k) / n;
        for (int64_t j = 0; j < h.r; ++j) {
          gb[o * h.r + j] += h.s * f * gok * h.a[j * h.in + k];
          ga[j * h.in + k] += h.s * f * h.b[o * h.r + j] * gok;
        }
      }
    }
    EXPECT_LE(rel_diff_d(grad_of(find_tensor(adapter.p, mod + ".lora_magnitude_vector")), gm), 1e-3) << "dL/dm";
    EXPECT_LE(rel_diff_d(grad_of(find_tensor(adapter.p, mod + ".lora_B.weight")), gb), 1e-3) << "dL/dB";
    EXPECT_LE(rel_diff_d(grad_of(find_tensor(adapter.p, mod + ".lora_A.weight")), ga), 1e-3) << "dL/dA";
  }
  // no base parameter got a gradient
  for (const std::string& name : names_of(params.p)) {
    T g;
    ASSERT_EQ(flame_tensor_grad(find_tensor(params.p, name), g.out()), FLAME_OK);
    EXPECT_EQ(g.h, nullptr) << name;
  }
  // training mode with dropout: W x' is computed again on the dropped input; gradients still reach A, B, m
  ParamsHandle dropped;
  ASSERT_EQ(flame_model_add_lora(m.m, R"({"name": "drop", "rank": 2, "dora": true, "dropout": 0.5, "targets": ["fc1"]})",
                                 &dropped.p), FLAME_OK) << flame_last_error_message();
  fill_dora(dropped.p, params.p);
  ASSERT_EQ(flame_model_set_training(m.m, 1), FLAME_OK);
  backward_sum_squares(ctx, m.m, c.output, in.p);
  for (const std::string& name : names_of(dropped.p)) {
    double mx = 0;
    for (double v : grad_of(find_tensor(dropped.p, name))) mx = std::max(mx, std::fabs(v));
    EXPECT_GT(mx, 0) << name << " got a zero gradient in training mode with dropout";
  }
  // bad options change nothing
  flame_params_t none = reinterpret_cast<flame_params_t>(1);
  EXPECT_EQ(flame_model_add_lora(m.m, R"({"name": "x", "dora": 1})", &none), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(none, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("dora"), std::string::npos);
}

// Flux's targets chosen so that the kohya file fuses qkv with to_v lacking a LoRA, linear1 with to_v
// and proj_mlp lacking one, and norm_out.linear with its halves swapped.
TEST_F(ModelLora, DoraFilesRoundTripInBothFormats) {
  for (const Case& c : {kFluxCase, kClipCase}) {
    SCOPED_TRACE(c.arch);
    ModelHandle m;
    make_model(ctx, c, m);
    ParamsHandle in, params, adapter;
    make_inputs(ctx, c, in);
    ASSERT_EQ(flame_model_params(m.m, &params.p), FLAME_OK);
    const char* opts = std::string(c.arch) == "FluxTransformer2DModel"
                           ? R"({"rank": 4, "alpha": 2, "dora": true, "targets": ["to_q", "to_k", "to_out.0", "norm_out.linear"]})"
                           : R"({"rank": 4, "alpha": 2, "dora": true})";
    ASSERT_EQ(flame_model_add_lora(m.m, opts, &adapter.p), FLAME_OK) << flame_last_error_message();
    fill_dora(adapter.p, params.p);
    const std::vector<float> adapted = run(m.m, c, in.p);
    for (const char* format : {"kohya", "peft"}) {
      SCOPED_TRACE(format);
      const std::string path = temp_path(format);
      const std::string save_opts = std::string(R"({"format": ")") + format + "\"}";
      ASSERT_EQ(flame_model_save_lora(m.m, nullptr, path.c_str(), save_opts.c_str()), FLAME_OK) << flame_last_error_message();
      ModelHandle fresh;
      make_model(ctx, c, fresh);
      ParamsHandle loaded;
      ASSERT_EQ(flame_model_load_lora(fresh.m, path.c_str(), nullptr, &loaded.p), FLAME_OK) << flame_last_error_message();
      EXPECT_GE(dora_modules(loaded.p).size(), dora_modules(adapter.p).size()) << "magnitudes lost in the file";
      EXPECT_LE(rel_diff(run(fresh.m, c, in.p), adapted), 1e-4) << "the " << format << " DoRA file means another adapter";
      std::remove(path.c_str());
    }
  }
  // A DoRA adapter with a multiplier cannot be written (the file's alpha would lie).
  ModelHandle m;
  make_model(ctx, kClipCase, m);
  ParamsHandle adapter;
  ASSERT_EQ(flame_model_add_lora(m.m, R"({"dora": true, "multiplier": 0.5})", &adapter.p), FLAME_OK);
  const std::string path = temp_path("dora_multiplier");
  EXPECT_EQ(flame_model_save_lora(m.m, nullptr, path.c_str(), nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("multiplier"), std::string::npos);
}

void check_merge(flame_ctx_t ctx, const Case& c, const char* options) {
  SCOPED_TRACE(std::string(c.arch) + " " + options);
  ModelHandle m;
  make_model(ctx, c, m);
  ParamsHandle in, params, adapter;
  make_inputs(ctx, c, in);
  ASSERT_EQ(flame_model_params(m.m, &params.p), FLAME_OK);
  ASSERT_EQ(flame_model_add_lora(m.m, options, &adapter.p), FLAME_OK) << flame_last_error_message();
  if (dora_modules(adapter.p).empty()) fill_list(adapter.p, 999, 0.3f);
  else fill_dora(adapter.p, params.p);
  const std::vector<float> adapted = run(m.m, c, in.p);
  // errors change nothing
  EXPECT_EQ(flame_model_merge_lora(m.m, "no_such_adapter"), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("no_such_adapter"), std::string::npos);
  EXPECT_EQ(flame_model_merge_lora(nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_LE(rel_diff(run(m.m, c, in.p), adapted), 1e-7);

  ASSERT_EQ(flame_model_merge_lora(m.m, nullptr), FLAME_OK) << flame_last_error_message();
  flame_params_t none = reinterpret_cast<flame_params_t>(1);
  EXPECT_EQ(flame_model_lora_params(m.m, nullptr, &none), FLAME_ERROR_INVALID_ARGUMENT) << "the merged adapter is still there";
  EXPECT_LE(rel_diff(run(m.m, c, in.p), adapted), 1e-5) << "the merged weights give another output";
  EXPECT_EQ(flame_model_merge_lora(m.m, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(ModelLora, MergeLoraGivesTheAdapterOutput) {
  check_merge(ctx, kClipCase, R"({"rank": 4, "alpha": 8})");
  check_merge(ctx, kClipCase, R"({"rank": 4, "alpha": 8, "multiplier": 0.5})");
  check_merge(ctx, kFluxCase, R"({"rank": 4, "alpha": 2, "preset": "kohya"})");
}

TEST_F(ModelLora, MergeDoraGivesTheAdapterOutput) {
  check_merge(ctx, kClipCase, R"({"rank": 4, "alpha": 8, "dora": true})");
  check_merge(ctx, kClipCase, R"({"rank": 4, "alpha": 8, "dora": true, "multiplier": 0.5})");
  check_merge(ctx, kFluxCase, R"({"rank": 4, "alpha": 2, "dora": true})");
}

}  // namespace
