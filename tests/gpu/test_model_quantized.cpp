// A quantised frozen base (the "quantize" model option: fp8 e4m3 linear weights with a scale per
// tensor or per row, src/models/quantized_weights.h) through the C ABI, on tiny Flux and SDXL UNet
// models in bf16. Two models are made from the same seed: Q quantised, R plain. Then:
//  - Q's parameter list holds R's names, each linear "<m>.weight" as an F8 tensor followed by its f32
//    "<m>.scale_weight" (0-d or [out, 1]), both frozen; every quantised value is R's weight rounded
//    to nearest e4m3 after division by amax / 448 (checked on the host, element by element); the
//    list's bytes fall by one byte per linear weight element (about half for Flux);
//  - R's linear weights are set to Q's dequantised values (bf16(f32(q) * scale), on the host), and
//    then Q's forward equals R's, and a LoRA trained 3 steps with AdamW on each gives the same
//    losses; gradients reach the adapter's A and B only;
//  - Q saved (diffusers names and the original layout, whose fused tensors carry [rows, 1] scales)
//    and loaded back with the option is bit-identical; loaded without it, it is R (dequantised);
//  - bad options fail with FLAME_ERROR_INVALID_ARGUMENT and change nothing.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <unistd.h>
#include "flame_test.h"
#include "model_test_handles.h"

namespace {

class ModelQuantized : public GpuTest {};

const char* const kFlux =
    R"({"num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
        "in_channels": 16, "joint_attention_dim": 24, "pooled_projection_dim": 20, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";
const char* const kUnetSdxl = R"({"block_out_channels": [32, 48, 64], "layers_per_block": 2,
  "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
  "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
  "transformer_layers_per_block": [1, 2, 3], "attention_head_dim": [1, 2, 4], "cross_attention_dim": 40,
  "use_linear_projection": true, "norm_num_groups": 8, "addition_embed_type": "text_time",
  "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 72})";

struct Case {
  const char* arch;
  const char* config;
  const char* scale;  // "tensor" or "row"
};

// ---- host views of tensors ----

size_t dtype_bytes(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F64: return 8;
    case FLAME_DTYPE_F32: return 4;
    case FLAME_DTYPE_F16:
    case FLAME_DTYPE_BF16: return 2;
    default: return 1;
  }
}

flame_dtype_t dtype_of(flame_tensor_t t) {
  flame_dtype_t d = FLAME_DTYPE_F32;
  EXPECT_EQ(flame_tensor_dtype(t, &d), FLAME_OK);
  return d;
}

int64_t numel_of(flame_tensor_t t) {
  int64_t n = 0;
  EXPECT_EQ(flame_tensor_numel(t, &n), FLAME_OK);
  return n;
}

std::vector<unsigned char> bytes_of(flame_tensor_t t) {
  std::vector<unsigned char> b(static_cast<size_t>(numel_of(t)) * dtype_bytes(dtype_of(t)));
  EXPECT_EQ(flame_to_host(t, b.data(), b.size()), FLAME_OK) << flame_last_error_message();
  return b;
}

int32_t requires_grad_of(flame_tensor_t t) {
  int32_t rg = -1;
  EXPECT_EQ(flame_tensor_requires_grad(t, &rg), FLAME_OK);
  return rg;
}

float float_of_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t bf16_of_float(float f) {  // round to nearest even (no NaN in these values)
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float float_of_e4m3(unsigned char b) {
  const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return sign ? -mag : mag;
}

std::vector<float> bf16_values(flame_tensor_t t) {
  const std::vector<unsigned char> b = bytes_of(t);
  std::vector<float> v(b.size() / 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, &b[2 * i], 2);
    v[i] = float_of_bf16(h);
  }
  return v;
}

// A float tensor of any dtype as f32 values.
std::vector<float> floats_of(flame_tensor_t t) {
  T f;
  EXPECT_EQ(flame_to_dtype(t, FLAME_DTYPE_F32, f.out()), FLAME_OK) << flame_last_error_message();
  return f.h ? host_of(f.h) : std::vector<float>{};
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ---- models and inputs ----

void make_inputs(flame_ctx_t ctx, const Case& c, ParamsHandle& in) { make_tiny_model_inputs(ctx, c.arch, in); }

std::string quantize_options(const Case& c) {
  return std::string(R"({"dtype": "bf16", "quantize": {"dtype": "f8_e4m3", "scale": ")") + c.scale + "\"}}";
}

void create_seeded(flame_ctx_t ctx, const Case& c, const std::string& options, ModelHandle& m) {
  ASSERT_EQ(flame_ctx_manual_seed(ctx, 1234), FLAME_OK);
  ASSERT_EQ(flame_model_create(ctx, c.arch, c.config, options.c_str(), &m.m), FLAME_OK) << flame_last_error_message();
}

// The model's output "sample" as f32 values (empty on failure).
std::vector<float> run(flame_model_t m, flame_params_t in) {
  ParamsHandle out;
  EXPECT_EQ(flame_model_forward(m, in, &out.p), FLAME_OK) << flame_last_error_message();
  flame_tensor_t y = nullptr;
  if (out.p) {
    EXPECT_EQ(flame_params_find(out.p, "sample", &y), FLAME_OK);
  }
  return y ? floats_of(y) : std::vector<float>{};
}

int64_t list_bytes(flame_params_t list) {
  int64_t count = 0, total = 0;
  EXPECT_EQ(flame_params_count(list, &count), FLAME_OK);
  for (int64_t i = 0; i < count; ++i) {
    flame_tensor_t t = nullptr;
    EXPECT_EQ(flame_params_tensor(list, i, &t), FLAME_OK);
    total += numel_of(t) * static_cast<int64_t>(dtype_bytes(dtype_of(t)));
  }
  return total;
}

// Checks that q (e4m3 bytes) and scales (one, or one per row) quantise w ([rows, cols]) as
// documented: scale = amax / 448 over the tensor or the row, q = e4m3(w / scale) to nearest.
void expect_quantization(const std::string& name, const std::vector<float>& w, const std::vector<unsigned char>& q,
                         const std::vector<float>& scales, int64_t rows) {
  ASSERT_EQ(w.size(), q.size()) << name;
  const int64_t cols = static_cast<int64_t>(w.size()) / rows;
  const bool per_row = scales.size() > 1 || rows == 1;
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scales[per_row ? static_cast<size_t>(r) : 0];
    double amax = 0;
    for (int64_t k = per_row ? r * cols : 0; k < (per_row ? (r + 1) * cols : static_cast<int64_t>(w.size())); ++k)
      amax = std::max(amax, std::fabs(static_cast<double>(w[static_cast<size_t>(k)])));
    EXPECT_NEAR(s, std::max(amax, 1e-12) / 448.0, 1e-5 * s) << name << " row " << r;
    for (int64_t k = r * cols; k < (r + 1) * cols; ++k) {
      const double x = w[static_cast<size_t>(k)] / static_cast<double>(s);
      const double ax = std::fabs(x);
      const double ulp = ax >= std::ldexp(1.0, -6) ? std::ldexp(1.0, static_cast<int>(std::floor(std::log2(ax))) - 3)
                                                   : std::ldexp(1.0, -9);
      if (std::fabs(float_of_e4m3(q[static_cast<size_t>(k)]) - x) > 0.5 * ulp * (1 + 1e-3) + 1e-6) ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << name << ": values not rounded to the nearest e4m3";
}

// Sets R's linear weights to Q's dequantised values and checks Q's list against R's (structure,
// quantisation, frozen flags, bytes). Returns the number of quantised weights.
int64_t match_reference(flame_params_t q_list, flame_params_t r_list, const Case& c) {
  int64_t nq = 0, nr = 0, quantized = 0, quantized_elems = 0, scale_bytes = 0;
  EXPECT_EQ(flame_params_count(q_list, &nq), FLAME_OK);
  EXPECT_EQ(flame_params_count(r_list, &nr), FLAME_OK);
  const int64_t r_bytes = list_bytes(r_list);
  for (int64_t i = 0; i < nq; ++i) {
    const char* name = nullptr;
    flame_tensor_t t = nullptr;
    EXPECT_EQ(flame_params_name(q_list, i, &name), FLAME_OK);
    EXPECT_EQ(flame_params_tensor(q_list, i, &t), FLAME_OK);
    const std::string n = name;
    if (!ends_with(n, ".scale_weight")) {
      flame_tensor_t r = nullptr;
      EXPECT_EQ(flame_params_find(r_list, name, &r), FLAME_OK);
      EXPECT_NE(r, nullptr) << n << " is not a parameter of the plain model";
      if (r && dtype_of(t) != FLAME_DTYPE_F8_E4M3) {
        EXPECT_EQ(dtype_of(t), FLAME_DTYPE_BF16) << n;
        EXPECT_EQ(bytes_of(t), bytes_of(r)) << n << ": a parameter that is not quantised changed";
        EXPECT_EQ(requires_grad_of(t), 1) << n;
      }
      continue;
    }
    // "<m>.scale_weight" follows its "<m>.weight"
    const std::string weight = n.substr(0, n.size() - std::string(".scale_weight").size()) + ".weight";
    const char* prev = nullptr;
    flame_tensor_t q = nullptr, r = nullptr;
    EXPECT_GE(i, 1);
    EXPECT_EQ(flame_params_name(q_list, i - 1, &prev), FLAME_OK);
    EXPECT_EQ(std::string(prev), weight) << n << " does not follow its weight";
    EXPECT_EQ(flame_params_find(q_list, weight.c_str(), &q), FLAME_OK);
    EXPECT_EQ(flame_params_find(r_list, weight.c_str(), &r), FLAME_OK);
    if (!q || !r) {
      ADD_FAILURE() << weight << " is missing";
      continue;
    }
    ++quantized;
    EXPECT_EQ(dtype_of(q), FLAME_DTYPE_F8_E4M3) << weight;
    EXPECT_EQ(dtype_of(t), FLAME_DTYPE_F32) << n;
    EXPECT_EQ(requires_grad_of(q), 0) << weight << " is not frozen";
    EXPECT_EQ(requires_grad_of(t), 0) << n << " is not frozen";
    const std::vector<int64_t> ws = shape_of(q), ss = shape_of(t);
    EXPECT_EQ(ws, shape_of(r)) << weight;
    if (ws.size() != 2) continue;
    if (std::string(c.scale) == "row") {
      EXPECT_EQ(ss, std::vector<int64_t>({ws[0], 1})) << n;
    } else {
      EXPECT_TRUE(ss.empty()) << n;
    }
    const std::vector<unsigned char> qb = bytes_of(q);
    const std::vector<float> scales = host_of(t), w = bf16_values(r);
    expect_quantization(weight, w, qb, scales, ws[0]);
    // R's weight := bf16(f32(q) * scale), as Model::param dequantises
    std::vector<uint16_t> deq(qb.size());
    const int64_t cols = ws[1];
    for (size_t k = 0; k < qb.size(); ++k) {
      const float s = scales.size() > 1 ? scales[k / static_cast<size_t>(cols)] : scales[0];
      deq[k] = bf16_of_float(float_of_e4m3(qb[k]) * s);
    }
    EXPECT_EQ(flame_copy_from_host(r, deq.data(), deq.size() * sizeof(uint16_t)), FLAME_OK) << flame_last_error_message();
    quantized_elems += static_cast<int64_t>(qb.size());
    scale_bytes += static_cast<int64_t>(scales.size() * sizeof(float));
  }
  EXPECT_EQ(nq, nr + quantized) << "Q's list is R's plus one scale per quantised weight";
  // Memory: one byte less per quantised element, plus the scales.
  const int64_t q_bytes = list_bytes(q_list);
  EXPECT_EQ(q_bytes, r_bytes - quantized_elems + scale_bytes);
  if (std::string(c.arch) == "FluxTransformer2DModel") {
    EXPECT_LT(q_bytes, 0.6 * static_cast<double>(r_bytes));
  }
  return quantized;
}

// Three AdamW steps of a rank-4 LoRA with fixed initial values: the losses, and checks that only
// the adapter's tensors get gradients.
std::vector<double> train_lora(flame_ctx_t ctx, flame_model_t m, flame_params_t in) {
  ParamsHandle adapter, params;
  EXPECT_EQ(flame_model_add_lora(m, R"({"rank": 4, "alpha": 8})", &adapter.p), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(flame_model_params(m, &params.p), FLAME_OK);
  if (!adapter.p || !params.p) return {};
  int64_t na = 0, np = 0;
  EXPECT_EQ(flame_params_count(adapter.p, &na), FLAME_OK);
  EXPECT_EQ(flame_params_count(params.p, &np), FLAME_OK);
  uint32_t state = 99;
  std::vector<flame_tensor_t> tensors;
  for (int64_t i = 0; i < na; ++i) {  // A and B non-zero, the same in every model
    flame_tensor_t t = nullptr;
    EXPECT_EQ(flame_params_tensor(adapter.p, i, &t), FLAME_OK);
    std::vector<float> v(static_cast<size_t>(numel_of(t)));
    for (float& x : v) {
      state = state * 1664525u + 1013904223u;
      x = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.2f;
    }
    EXPECT_EQ(flame_copy_from_host(t, v.data(), v.size() * sizeof(float)), FLAME_OK);
    tensors.push_back(t);
  }
  flame_optimizer_options_t o;
  EXPECT_EQ(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW), FLAME_OK);
  o.lr = 1e-2;
  flame_optimizer_t opt = nullptr;
  EXPECT_EQ(flame_optimizer_create(ctx, &o, tensors.data(), na, &opt), FLAME_OK) << flame_last_error_message();
  std::vector<double> losses;
  for (int step = 0; step < 3 && opt; ++step) {
    ParamsHandle out;
    EXPECT_EQ(flame_model_forward(m, in, &out.p), FLAME_OK) << flame_last_error_message();
    flame_tensor_t y = nullptr;
    if (out.p) {
    EXPECT_EQ(flame_params_find(out.p, "sample", &y), FLAME_OK);
  }
    if (!y) break;
    T y32, sq, loss;
    EXPECT_EQ(flame_to_dtype(y, FLAME_DTYPE_F32, y32.out()), FLAME_OK);
    EXPECT_EQ(flame_mul(y32.h, y32.h, sq.out()), FLAME_OK);
    EXPECT_EQ(flame_sum_all(sq.h, loss.out()), FLAME_OK);
    EXPECT_EQ(flame_backward(ctx, loss.h, nullptr, 0), FLAME_OK) << flame_last_error_message();
    double value = 0;
    EXPECT_EQ(flame_tensor_item(loss.h, &value), FLAME_OK);
    losses.push_back(value);
    for (int64_t i = 0; i < na; ++i) {
      T g;
      EXPECT_EQ(flame_tensor_grad(tensors[static_cast<size_t>(i)], g.out()), FLAME_OK);
      EXPECT_NE(g.h, nullptr) << "adapter tensor " << i << " got no gradient";
    }
    for (int64_t i = 0; i < np; ++i) {
      flame_tensor_t t = nullptr;
      T g;
      EXPECT_EQ(flame_params_tensor(params.p, i, &t), FLAME_OK);
      EXPECT_EQ(requires_grad_of(t), 0) << "base parameter " << i << " is not frozen";
      EXPECT_EQ(flame_tensor_grad(t, g.out()), FLAME_OK);
      EXPECT_EQ(g.h, nullptr) << "base parameter " << i << " got a gradient";
    }
    EXPECT_EQ(flame_optimizer_step(opt), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
  }
  flame_optimizer_release(opt);
  EXPECT_EQ(flame_model_remove_lora(m, nullptr), FLAME_OK);
  return losses;
}

std::string temp_path(const std::string& tag) {
  return "/tmp/flame_model_quantized_" + tag + "_" + std::to_string(static_cast<long>(getpid())) + ".safetensors";
}

// Every parameter of a and b: same names, dtypes and bytes.
void expect_identical(flame_model_t a, flame_model_t b) {
  ParamsHandle pa, pb;
  ASSERT_EQ(flame_model_params(a, &pa.p), FLAME_OK);
  ASSERT_EQ(flame_model_params(b, &pb.p), FLAME_OK);
  int64_t na = 0, nb = 0;
  ASSERT_EQ(flame_params_count(pa.p, &na), FLAME_OK);
  ASSERT_EQ(flame_params_count(pb.p, &nb), FLAME_OK);
  ASSERT_EQ(na, nb);
  for (int64_t i = 0; i < na; ++i) {
    const char *n1 = nullptr, *n2 = nullptr;
    flame_tensor_t t1 = nullptr, t2 = nullptr;
    ASSERT_EQ(flame_params_name(pa.p, i, &n1), FLAME_OK);
    ASSERT_EQ(flame_params_name(pb.p, i, &n2), FLAME_OK);
    ASSERT_STREQ(n1, n2);
    ASSERT_EQ(flame_params_tensor(pa.p, i, &t1), FLAME_OK);
    ASSERT_EQ(flame_params_tensor(pb.p, i, &t2), FLAME_OK);
    EXPECT_EQ(dtype_of(t1), dtype_of(t2)) << n1;
    EXPECT_EQ(shape_of(t1), shape_of(t2)) << n1;
    EXPECT_TRUE(bytes_of(t1) == bytes_of(t2)) << n1 << " differs after the round trip";
    if (dtype_of(t2) == FLAME_DTYPE_F8_E4M3 || ends_with(n2, ".scale_weight")) {
      EXPECT_EQ(requires_grad_of(t2), 0) << n2 << " is not frozen after loading";
    }
  }
}

// Saves q in layout (NULL: diffusers names) and loads it back with the quantize option (bit-identical
// to q) and without it (the plain reference r, whose weights hold q's dequantised values).
void check_round_trip(flame_ctx_t ctx, const Case& c, flame_model_t q, flame_model_t r, flame_params_t in,
                      const char* layout) {
  SCOPED_TRACE(layout ? layout : "diffusers");
  const std::string path = temp_path(std::string(c.scale) + "_" + (layout ? layout : "diffusers"));
  ASSERT_EQ(flame_model_save(q, path.c_str(), layout), FLAME_OK) << flame_last_error_message();
  const std::string named = layout ? std::string() : std::string(R"("architecture": ")") + c.arch + "\", ";
  const std::string with = "{" + named + R"("config": )" + c.config + R"(, "dtype": "bf16", "quantize": {"scale": ")" +
                           c.scale + "\"}}";
  const std::string without = "{" + named + R"("config": )" + c.config + R"(, "dtype": "bf16"})";
  ModelHandle lq, lr;
  ASSERT_EQ(flame_model_load(ctx, path.c_str(), with.c_str(), &lq.m), FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(flame_model_load(ctx, path.c_str(), without.c_str(), &lr.m), FLAME_OK) << flame_last_error_message();
  std::remove(path.c_str());
  expect_identical(q, lq.m);
  expect_identical(r, lr.m);
  EXPECT_EQ(rel_diff(run(lq.m, in), run(q, in)), 0.0);
}

void check_case(flame_ctx_t ctx, const Case& c) {
  SCOPED_TRACE(std::string(c.arch) + ", scale per " + c.scale);
  ModelHandle q, r;
  create_seeded(ctx, c, quantize_options(c), q);
  create_seeded(ctx, c, R"({"dtype": "bf16"})", r);
  ParamsHandle in, q_list, r_list;
  make_inputs(ctx, c, in);
  ASSERT_EQ(flame_model_params(q.m, &q_list.p), FLAME_OK);
  ASSERT_EQ(flame_model_params(r.m, &r_list.p), FLAME_OK);
  EXPECT_GT(match_reference(q_list.p, r_list.p, c), 10);
  if (::testing::Test::HasFailure()) return;

  // the quantised model computes with the dequantised weights
  const std::vector<float> yq = run(q.m, in.p), yr = run(r.m, in.p);
  ASSERT_FALSE(yq.empty());
  EXPECT_LE(rel_diff(yq, yr), 1e-5) << "the fp8 base differs from its dequantised bf16 twin";

  // LoRA training on the fp8 base: the same losses as on the dequantised bf16 model
  const std::vector<double> lq = train_lora(ctx, q.m, in.p), lr = train_lora(ctx, r.m, in.p);
  ASSERT_EQ(lq.size(), 3u);
  ASSERT_EQ(lr.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(lq[i], lr[i], std::ldexp(std::fabs(lr[i]), -8)) << "step " << i;
  EXPECT_NE(lq[2], lq[0]) << "the adapter did not train";

  check_round_trip(ctx, c, q.m, r.m, in.p, nullptr);
  check_round_trip(ctx, c, q.m, r.m, in.p, "original");

  // bad options: errors naming the key, nothing made, the model unchanged
  const std::string path = temp_path("bad");
  ASSERT_EQ(flame_model_save(q.m, path.c_str(), nullptr), FLAME_OK);
  for (const char* bad : {R"({"quantize": {"dtype": "f8_e5m2"}})", R"({"quantize": {"scale": "block"}})",
                          R"({"quantize": {"bits": 8}})", R"({"quantize": "fp8"})"}) {
    flame_model_t none = reinterpret_cast<flame_model_t>(1);
    EXPECT_EQ(flame_model_create(ctx, c.arch, c.config, bad, &none), FLAME_ERROR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(flame_last_error_message()).find("quantize"), std::string::npos) << flame_last_error_message();
    EXPECT_EQ(none, nullptr);
    none = reinterpret_cast<flame_model_t>(1);
    EXPECT_EQ(flame_model_load(ctx, path.c_str(), bad, &none), FLAME_ERROR_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(none, nullptr);
  }
  std::remove(path.c_str());
  EXPECT_EQ(rel_diff(run(q.m, in.p), yq), 0.0);
}

TEST_F(ModelQuantized, FluxPerTensor) { check_case(ctx, {"FluxTransformer2DModel", kFlux, "tensor"}); }
TEST_F(ModelQuantized, FluxPerRow) { check_case(ctx, {"FluxTransformer2DModel", kFlux, "row"}); }
TEST_F(ModelQuantized, SdxlUnetPerTensor) { check_case(ctx, {"UNet2DConditionModel", kUnetSdxl, "tensor"}); }
TEST_F(ModelQuantized, SdxlUnetPerRow) { check_case(ctx, {"UNet2DConditionModel", kUnetSdxl, "row"}); }

// A weight stored in F8 with a per-row scale loads into a per-tensor model only when the rows agree.
TEST_F(ModelQuantized, PerRowFileIntoPerTensorModelNeedsEqualRows) {
  const Case row{"FluxTransformer2DModel", kFlux, "row"};
  ModelHandle q;
  create_seeded(ctx, row, quantize_options(row), q);
  const std::string path = temp_path("rows");
  ASSERT_EQ(flame_model_save(q.m, path.c_str(), nullptr), FLAME_OK) << flame_last_error_message();
  const std::string per_tensor = std::string(R"({"architecture": "FluxTransformer2DModel", "config": )") + kFlux +
                                 R"(, "dtype": "bf16", "quantize": {"scale": "tensor"}})";
  flame_model_t none = reinterpret_cast<flame_model_t>(1);
  EXPECT_EQ(flame_model_load(ctx, path.c_str(), per_tensor.c_str(), &none), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("\"row\""), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(none, nullptr);
  std::remove(path.c_str());
}

}  // namespace
