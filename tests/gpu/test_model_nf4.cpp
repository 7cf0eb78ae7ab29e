// An NF4 frozen base ("quantize": {"dtype": "nf4"}, QLoRA / bitsandbytes Linear4bit with
// quant_type "nf4"; src/ops/nf4.h) through the C ABI, on tiny Flux and SDXL UNet models in bf16
// whose linear layers' rows are multiples of 64. Models made from the same seed: Q (NF4 without
// double quantisation), D (NF4 defaults: block 64, double quantisation) and R, B (plain bf16). Then:
//  - Q's and D's parameter lists: each linear "<m>.weight" is U8 [out, in / 2] followed by
//    "<m>.weight.absmax" (F32, or U8 with D's "<m>.weight.nested_absmax" and ".nested_offset"), all
//    frozen; Q's codes and absmax equal a host reference of NF4 computed from R's bf16 weights;
//  - B's bf16 file loaded with Q's option (flame_model_load quantises on the GPU) is Q bit for bit;
//  - R's linear weights set to Q's dequantised values (bf16(level * absmax), on the host): Q's forward
//    equals R's (the NF4 linear computes with the dequantised weight);
//  - against the bf16 model: NF4's error per weight is at most half the widest level gap (0.139) of
//    its block's absmax, and its RMS is 9.2% of the weights' RMS for normal weights in blocks of 64
//    (simulated); a layer's output error is about as large, and independent errors of L layers in
//    sequence add to about sqrt(L) x 9.2%: the bound 0.4 on the output's relative RMS difference
//    admits up to 19 quantised layers in sequence (the tiny models have fewer); double quantisation
//    moves each absmax by its 8-bit error only (well under 1%): D within 0.05 of Q;
//  - a LoRA trained 5 AdamW steps on D and on the bf16 base B: losses finite and falling; D's first
//    loss within (1 -+ 0.4)^2 of B's (the forward bound), and D's relative fall within half of B's
//    either way; gradients reach the adapter only; merging it into the NF4 base and saving the
//    model are refused (FLAME_ERROR_INVALID_ARGUMENT, nothing changed);
//  - memory (flame_ctx_memory_stats): the device bytes of D's linear weights (with their statistics)
//    are at most 0.3 of B's;
//  - a block size that does not divide a layer's rows fails naming the layer; bad keys name the key.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>
#include <unistd.h>
#include "flame_test.h"
#include "model_test_handles.h"

namespace {

class ModelNf4 : public GpuTest {};

// Every linear layer's rows are multiples of 64 (the default block).
const char* const kFlux =
    R"({"num_layers": 1, "num_single_layers": 2, "attention_head_dim": 16, "num_attention_heads": 4,
        "in_channels": 64, "joint_attention_dim": 64, "pooled_projection_dim": 64, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";
const char* const kUnetSdxl = R"({"block_out_channels": [64, 128, 192], "layers_per_block": 1,
  "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
  "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
  "transformer_layers_per_block": [1, 1, 1], "attention_head_dim": [1, 2, 4], "cross_attention_dim": 64,
  "use_linear_projection": true, "norm_num_groups": 16, "addition_embed_type": "text_time",
  "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 64})";
// The shared tiny Flux config (model_test_handles.h): rows of 24 and 20, which no block divides.
const char* const kFluxOddRows =
    R"({"num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16, "num_attention_heads": 2,
        "in_channels": 16, "joint_attention_dim": 24, "pooled_projection_dim": 20, "guidance_embeds": true,
        "axes_dims_rope": [4, 6, 6]})";

const char* const kBf16 = R"({"dtype": "bf16"})";
const char* const kNf4Plain = R"({"dtype": "bf16", "quantize": {"dtype": "nf4", "double_quant": false}})";
const char* const kNf4 = R"({"dtype": "bf16", "quantize": {"dtype": "nf4"}})";

// QLoRA's NF4 levels (bitsandbytes' table), code order: written out here, not taken from FLAME.
const float kLevels[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                           -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                           0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
                           0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// ---- inputs and host views ----

void add_input(ParamsHandle& in, const char* name, flame_tensor_t t) {
  ASSERT_EQ(flame_params_add(in.p, name, t), FLAME_OK);
  flame_tensor_release(t);
}

void make_inputs(flame_ctx_t ctx, const std::string& arch, ParamsHandle& in) {
  ASSERT_EQ(flame_params_create(ctx, &in.p), FLAME_OK);
  if (arch == "FluxTransformer2DModel") {
    add_input(in, "hidden_states", host_tensor(ctx, {1, 12, 64}, ramp(12 * 64, 1.0f)));
    add_input(in, "encoder_hidden_states", host_tensor(ctx, {1, 5, 64}, ramp(5 * 64, 1.0f)));
    add_input(in, "pooled_projections", host_tensor(ctx, {1, 64}, ramp(64, 1.0f)));
    add_input(in, "timestep", host_tensor(ctx, {1}, {0.5f}));
    add_input(in, "guidance", host_tensor(ctx, {1}, {3.5f}));
    std::vector<float> ids(12 * 3, 0.0f);
    for (int r = 0; r < 12; ++r) {
      ids[r * 3 + 1] = static_cast<float>(r / 3);
      ids[r * 3 + 2] = static_cast<float>(r % 3);
    }
    add_input(in, "img_ids", host_tensor(ctx, {12, 3}, ids));
    add_input(in, "txt_ids", host_tensor(ctx, {5, 3}, std::vector<float>(15, 0.0f)));
  } else {
    add_input(in, "sample", host_tensor(ctx, {1, 4, 16, 16}, ramp(4 * 16 * 16, 1.0f)));
    add_input(in, "timestep", host_tensor(ctx, {1}, {10.0f}));
    add_input(in, "encoder_hidden_states", host_tensor(ctx, {1, 7, 64}, ramp(7 * 64, 1.0f)));
    add_input(in, "text_embeds", host_tensor(ctx, {1, 16}, ramp(16, 1.0f)));
    add_input(in, "time_ids", host_tensor(ctx, {1, 6}, {16, 16, 0, 0, 16, 16}));
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
size_t dtype_bytes(flame_dtype_t d) {
  switch (d) {
    case FLAME_DTYPE_F32: return 4;
    case FLAME_DTYPE_F16:
    case FLAME_DTYPE_BF16: return 2;
    default: return 1;
  }
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
uint16_t bf16_of_float(float f) {  // round to nearest even (no NaN here)
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
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
std::vector<float> floats_of(flame_tensor_t t) {
  T f;
  EXPECT_EQ(flame_to_dtype(t, FLAME_DTYPE_F32, f.out()), FLAME_OK) << flame_last_error_message();
  return f.h ? host_of(f.h) : std::vector<float>{};
}
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ||a - b|| / ||b||.
double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void create_seeded(flame_ctx_t ctx, const char* arch, const char* config, const char* options, ModelHandle& m) {
  ASSERT_EQ(flame_ctx_manual_seed(ctx, 1234), FLAME_OK);
  ASSERT_EQ(flame_model_create(ctx, arch, config, options, &m.m), FLAME_OK) << flame_last_error_message();
}

std::vector<float> run(flame_model_t m, flame_params_t in) {
  ParamsHandle out;
  EXPECT_EQ(flame_model_forward(m, in, &out.p), FLAME_OK) << flame_last_error_message();
  flame_tensor_t y = nullptr;
  if (out.p) {
    EXPECT_EQ(flame_params_find(out.p, "sample", &y), FLAME_OK);
  }
  return y ? floats_of(y) : std::vector<float>{};
}

struct Entry {
  std::string name;
  flame_tensor_t t;
};
std::vector<Entry> entries(flame_params_t list) {
  int64_t n = 0;
  EXPECT_EQ(flame_params_count(list, &n), FLAME_OK);
  std::vector<Entry> out;
  for (int64_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    flame_tensor_t t = nullptr;
    EXPECT_EQ(flame_params_name(list, i, &name), FLAME_OK);
    EXPECT_EQ(flame_params_tensor(list, i, &t), FLAME_OK);
    out.push_back({name, t});
  }
  return out;
}

// ---- the parameter list of an NF4 model against the plain one ----

// Checks Q's (no double quantisation) list against R's: each NF4 weight's codes and absmax equal the
// host reference from R's bf16 weight, then sets R's weight to bf16(level * absmax). Returns the
// names of the NF4 weights.
std::set<std::string> match_reference(flame_params_t q_list, flame_params_t r_list) {
  std::set<std::string> nf4;
  const std::vector<Entry> q = entries(q_list);
  for (size_t i = 0; i < q.size(); ++i) {
    if (dtype_of(q[i].t) != FLAME_DTYPE_U8) continue;
    const std::string& name = q[i].name;
    nf4.insert(name);
    flame_tensor_t r = nullptr;
    EXPECT_EQ(flame_params_find(r_list, name.c_str(), &r), FLAME_OK);
    if (!r || i + 1 >= q.size()) {
      ADD_FAILURE() << name << ": no plain twin or no absmax";
      continue;
    }
    const std::vector<int64_t> rs = shape_of(r), qs = shape_of(q[i].t);
    if (rs.size() != 2) {
      ADD_FAILURE() << name << ": the plain weight is not 2-D";
      continue;
    }
    EXPECT_EQ(qs, std::vector<int64_t>({rs[0], rs[1] / 2})) << name;
    EXPECT_EQ(q[i + 1].name, name + ".absmax") << name << ": its absmax does not follow it";
    EXPECT_EQ(dtype_of(q[i + 1].t), FLAME_DTYPE_F32) << name;
    EXPECT_EQ(shape_of(q[i + 1].t), std::vector<int64_t>({rs[0] * rs[1] / 64})) << name;
    EXPECT_EQ(requires_grad_of(q[i].t), 0) << name << " is not frozen";
    EXPECT_EQ(requires_grad_of(q[i + 1].t), 0) << name << ".absmax is not frozen";
    const std::vector<float> w = bf16_values(r), absmax = host_of(q[i + 1].t);
    const std::vector<unsigned char> packed = bytes_of(q[i].t);
    if (packed.size() * 2 != w.size()) {
      ADD_FAILURE() << name << ": " << packed.size() << " packed bytes for " << w.size() << " elements";
      continue;
    }
    int64_t wrong_absmax = 0, wrong_codes = 0;
    std::vector<uint16_t> deq(w.size());
    for (size_t b = 0; b < absmax.size(); ++b) {
      float m = 0.0f;
      for (size_t k = b * 64; k < (b + 1) * 64; ++k) m = std::max(m, std::fabs(w[k]));
      wrong_absmax += absmax[b] != m;
      const float inv = m > 0.0f ? 1.0f / m : 0.0f;
      for (size_t k = b * 64; k < (b + 1) * 64; ++k) {
        const float n = w[k] * inv;
        int want = 0;
        for (int t = 0; t < 15; ++t)
          if (static_cast<double>(n) > static_cast<double>(static_cast<float>((static_cast<double>(kLevels[t]) + kLevels[t + 1]) / 2)))
            want = t + 1;
        const int got = k % 2 == 0 ? packed[k / 2] >> 4 : packed[k / 2] & 15;
        wrong_codes += got != want;
        deq[k] = bf16_of_float(kLevels[got] * absmax[b]);
      }
    }
    EXPECT_EQ(wrong_absmax, 0) << name;
    EXPECT_EQ(wrong_codes, 0) << name;
    EXPECT_EQ(flame_copy_from_host(r, deq.data(), deq.size() * sizeof(uint16_t)), FLAME_OK) << flame_last_error_message();
  }
  return nf4;
}

// D's list: every NF4 weight followed by its U8 absmax codes, the nested scales and the mean.
void check_double_quant_list(flame_params_t d_list, const std::set<std::string>& nf4) {
  const std::vector<Entry> d = entries(d_list);
  size_t seen = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    if (!nf4.count(d[i].name)) continue;
    ++seen;
    ASSERT_LT(i + 3, d.size());
    const int64_t blocks = numel_of(d[i].t) * 2 / 64;
    EXPECT_EQ(dtype_of(d[i].t), FLAME_DTYPE_U8) << d[i].name;
    EXPECT_EQ(d[i + 1].name, d[i].name + ".absmax");
    EXPECT_EQ(dtype_of(d[i + 1].t), FLAME_DTYPE_U8) << d[i + 1].name;
    EXPECT_EQ(numel_of(d[i + 1].t), blocks);
    EXPECT_EQ(d[i + 2].name, d[i].name + ".nested_absmax");
    EXPECT_EQ(dtype_of(d[i + 2].t), FLAME_DTYPE_F32);
    EXPECT_EQ(numel_of(d[i + 2].t), (blocks + 255) / 256);
    EXPECT_EQ(d[i + 3].name, d[i].name + ".nested_offset");
    EXPECT_TRUE(shape_of(d[i + 3].t).empty());
    for (size_t k = i; k < i + 4; ++k) EXPECT_EQ(requires_grad_of(d[k].t), 0) << d[k].name << " is not frozen";
  }
  EXPECT_EQ(seen, nf4.size());
}

// ---- LoRA training ----

// Five AdamW steps of a rank-4 LoRA with fixed initial values: the losses (sum of squares of the
// output); checks that only the adapter's tensors get gradients.
std::vector<double> train_lora(flame_ctx_t ctx, flame_model_t m, flame_params_t in) {
  ParamsHandle adapter, params;
  EXPECT_EQ(flame_model_add_lora(m, R"({"rank": 4, "alpha": 8})", &adapter.p), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(flame_model_params(m, &params.p), FLAME_OK);
  if (!adapter.p || !params.p) return {};
  const std::vector<Entry> a = entries(adapter.p), base = entries(params.p);
  uint32_t state = 99;
  std::vector<flame_tensor_t> tensors;
  for (const Entry& e : a) {  // A and B non-zero, the same in every model
    std::vector<float> v(static_cast<size_t>(numel_of(e.t)));
    for (float& x : v) {
      state = state * 1664525u + 1013904223u;
      x = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.2f;
    }
    EXPECT_EQ(flame_copy_from_host(e.t, v.data(), v.size() * sizeof(float)), FLAME_OK);
    tensors.push_back(e.t);
  }
  flame_optimizer_options_t o;
  EXPECT_EQ(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW), FLAME_OK);
  o.lr = 1e-2;
  flame_optimizer_t opt = nullptr;
  EXPECT_EQ(flame_optimizer_create(ctx, &o, tensors.data(), static_cast<int64_t>(tensors.size()), &opt), FLAME_OK)
      << flame_last_error_message();
  std::vector<double> losses;
  for (int step = 0; step < 5 && opt; ++step) {
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
    for (flame_tensor_t t : tensors) {
      T g;
      EXPECT_EQ(flame_tensor_grad(t, g.out()), FLAME_OK);
      EXPECT_NE(g.h, nullptr) << "an adapter tensor got no gradient";
    }
    for (const Entry& e : base) {
      T g;
      EXPECT_EQ(flame_tensor_grad(e.t, g.out()), FLAME_OK);
      EXPECT_EQ(g.h, nullptr) << "base parameter " << e.name << " got a gradient";
    }
    EXPECT_EQ(flame_optimizer_step(opt), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(flame_optimizer_zero_grad(opt, 1), FLAME_OK);
  }
  flame_optimizer_release(opt);
  return losses;
}

// ---- memory ----

uint64_t bytes_in_use(flame_ctx_t ctx) {
  flame_memory_stats_t s;
  s.struct_size = sizeof s;
  EXPECT_EQ(flame_ctx_memory_stats(ctx, &s), FLAME_OK);
  return s.bytes_in_use;
}

// The device bytes a new model of options holds (its parameters and anything else it keeps).
uint64_t model_bytes(flame_ctx_t ctx, const char* arch, const char* config, const char* options, ModelHandle& m) {
  EXPECT_EQ(flame_ctx_synchronize(ctx), FLAME_OK);
  const uint64_t before = bytes_in_use(ctx);
  create_seeded(ctx, arch, config, options, m);
  EXPECT_EQ(flame_ctx_synchronize(ctx), FLAME_OK);
  return bytes_in_use(ctx) - before;
}

void check_case(flame_ctx_t ctx, const char* arch, const char* config) {
  SCOPED_TRACE(arch);
  ModelHandle q, d, r, b;
  create_seeded(ctx, arch, config, kNf4Plain, q);
  create_seeded(ctx, arch, config, kNf4, d);
  create_seeded(ctx, arch, config, kBf16, r);
  ParamsHandle in, q_list, d_list, r_list;
  make_inputs(ctx, arch, in);
  ASSERT_EQ(flame_model_params(q.m, &q_list.p), FLAME_OK);
  ASSERT_EQ(flame_model_params(d.m, &d_list.p), FLAME_OK);
  ASSERT_EQ(flame_model_params(r.m, &r_list.p), FLAME_OK);
  const std::vector<float> y_bf16 = run(r.m, in.p);  // before R takes Q's dequantised weights
  ASSERT_FALSE(y_bf16.empty());

  const std::set<std::string> nf4 = match_reference(q_list.p, r_list.p);
  EXPECT_GT(nf4.size(), 10u);
  check_double_quant_list(d_list.p, nf4);
  if (::testing::Test::HasFailure()) return;

  // Q computes with its dequantised weights; against bf16 within NF4's error; D within 8-bit absmax error of Q
  const std::vector<float> yq = run(q.m, in.p), yd = run(d.m, in.p), y_twin = run(r.m, in.p);
  EXPECT_LE(rel_rms(yq, y_twin), 1e-5) << "the NF4 base differs from its dequantised bf16 twin";
  const double vs_bf16 = rel_rms(yq, y_bf16), dq_vs_plain = rel_rms(yd, yq);
  std::printf("[ %s ] NF4 vs bf16: relative RMS %.4f; double quant vs not: %.4f\n", arch, vs_bf16, dq_vs_plain);
  EXPECT_LE(vs_bf16, 0.4);
  EXPECT_GT(vs_bf16, 0.0) << "NF4 equal to bf16: nothing was quantised?";
  EXPECT_LE(dq_vs_plain, 0.05);

  // flame_model_load quantises while loading: B's bf16 file loaded with Q's option is Q, bit for bit
  create_seeded(ctx, arch, config, kBf16, b);
  const std::string file = "/tmp/flame_model_nf4_load_" + std::to_string(static_cast<long>(getpid())) + ".safetensors";
  ASSERT_EQ(flame_model_save(b.m, file.c_str(), nullptr), FLAME_OK) << flame_last_error_message();
  const std::string load_options = std::string(R"({"architecture": ")") + arch + R"(", "config": )" + config +
                                   R"(, "dtype": "bf16", "quantize": {"dtype": "nf4", "double_quant": false}})";
  {
    ModelHandle loaded;
    ParamsHandle l_list;
    ASSERT_EQ(flame_model_load(ctx, file.c_str(), load_options.c_str(), &loaded.m), FLAME_OK) << flame_last_error_message();
    std::remove(file.c_str());
    ASSERT_EQ(flame_model_params(loaded.m, &l_list.p), FLAME_OK);
    const std::vector<Entry> le = entries(l_list.p), qe = entries(q_list.p);
    ASSERT_EQ(le.size(), qe.size());
    for (size_t i = 0; i < le.size(); ++i) {
      EXPECT_EQ(le[i].name, qe[i].name);
      EXPECT_EQ(dtype_of(le[i].t), dtype_of(qe[i].t)) << le[i].name;
      EXPECT_TRUE(bytes_of(le[i].t) == bytes_of(qe[i].t)) << le[i].name << " differs from the created NF4 model's";
    }
    EXPECT_EQ(rel_rms(run(loaded.m, in.p), yq), 0.0);
  }

  // LoRA on the NF4 base (D) against the same on the bf16 base (B)
  const std::vector<double> ld = train_lora(ctx, d.m, in.p), lb = train_lora(ctx, b.m, in.p);
  ASSERT_EQ(ld.size(), 5u);
  ASSERT_EQ(lb.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(std::isfinite(ld[i]) && std::isfinite(lb[i])) << "step " << i;
  EXPECT_LT(ld[4], ld[0]) << "the loss on the NF4 base did not fall";
  EXPECT_LT(lb[4], lb[0]);
  EXPECT_GE(ld[0], 0.36 * lb[0]);
  EXPECT_LE(ld[0], 1.96 * lb[0]);
  const double fall_nf4 = 1.0 - ld[4] / ld[0], fall_bf16 = 1.0 - lb[4] / lb[0];
  EXPECT_NEAR(fall_nf4, fall_bf16, 0.5 * fall_bf16) << "the NF4 base trains unlike the bf16 one";
  std::printf("[ %s ] LoRA losses NF4 %.5g -> %.5g, bf16 %.5g -> %.5g\n", arch, ld[0], ld[4], lb[0], lb[4]);

  // merging into the NF4 base and saving it are refused, nothing changed
  const std::vector<float> with_adapter = run(d.m, in.p);
  EXPECT_EQ(flame_model_merge_lora(d.m, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("NF4"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(rel_rms(run(d.m, in.p), with_adapter), 0.0);
  const std::string path = "/tmp/flame_model_nf4_" + std::to_string(static_cast<long>(getpid())) + ".safetensors";
  EXPECT_EQ(flame_model_save(d.m, path.c_str(), nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("NF4"), std::string::npos) << flame_last_error_message();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "a file was written";
  EXPECT_EQ(flame_model_remove_lora(d.m, nullptr), FLAME_OK);
  EXPECT_EQ(flame_model_remove_lora(b.m, nullptr), FLAME_OK);
}

TEST_F(ModelNf4, TinyFlux) { check_case(ctx, "FluxTransformer2DModel", kFlux); }
TEST_F(ModelNf4, TinySdxlUnet) { check_case(ctx, "UNet2DConditionModel", kUnetSdxl); }

TEST_F(ModelNf4, LinearWeightBytesAtMostThreeTenthsOfBf16) {
  {  // what a context allocates once, at its first model (if anything), before measuring
    ModelHandle warm_up;
    create_seeded(ctx, "FluxTransformer2DModel", kFlux, kNf4, warm_up);
  }
  for (const auto& [arch, config] : {std::pair<const char*, const char*>{"FluxTransformer2DModel", kFlux},
                                     std::pair<const char*, const char*>{"UNet2DConditionModel", kUnetSdxl}}) {
    SCOPED_TRACE(arch);
    ModelHandle bf16, nf4;
    const uint64_t bf16_bytes = model_bytes(ctx, arch, config, kBf16, bf16);
    const uint64_t nf4_bytes = model_bytes(ctx, arch, config, kNf4, nf4);
    ParamsHandle b_list, n_list;
    ASSERT_EQ(flame_model_params(bf16.m, &b_list.p), FLAME_OK);
    ASSERT_EQ(flame_model_params(nf4.m, &n_list.p), FLAME_OK);
    std::set<std::string> linear;
    for (const Entry& e : entries(n_list.p))
      if (dtype_of(e.t) == FLAME_DTYPE_U8 && ends_with(e.name, ".weight")) linear.insert(e.name);
    uint64_t other = 0, linear_bf16_list = 0;  // the bf16 model's parameters that are not linear weights
    for (const Entry& e : entries(b_list.p)) {
      const uint64_t n = static_cast<uint64_t>(numel_of(e.t)) * dtype_bytes(dtype_of(e.t));
      (linear.count(e.name) ? linear_bf16_list : other) += n;
    }
    ASSERT_GT(linear_bf16_list, 0u);
    // what both models hold beside their parameters (if anything) counts for neither
    const uint64_t params_bf16 = other + linear_bf16_list;
    ASSERT_GE(bf16_bytes, params_bf16);
    const uint64_t beside = bf16_bytes - params_bf16;
    ASSERT_GE(nf4_bytes, other + beside);
    const uint64_t linear_nf4 = nf4_bytes - other - beside;  // packed codes, statistics, the 8-bit code table
    const double ratio = static_cast<double>(linear_nf4) / static_cast<double>(linear_bf16_list);
    std::printf("[ %s ] linear weights on the device: bf16 %llu bytes, NF4 %llu bytes (%.3f)\n", arch,
                static_cast<unsigned long long>(linear_bf16_list), static_cast<unsigned long long>(linear_nf4), ratio);
    EXPECT_LE(ratio, 0.3);
  }
}

TEST_F(ModelNf4, BadBlockSizesAndKeysFailNamingThem) {
  struct Bad {
    const char* config;
    const char* options;
    std::vector<const char*> named;
  };
  const std::vector<Bad> bad = {
      {kFluxOddRows, kNf4, {"quantize.block_size", "linear layer"}},  // rows of 24 / 20 elements
      {kFluxOddRows, R"({"quantize": {"dtype": "nf4", "block_size": 16}})", {"quantize.block_size", "linear layer"}},
      {kFlux, R"({"quantize": {"dtype": "nf4", "block_size": 4096}})", {"quantize.block_size", "linear layer"}},
      {kFlux, R"({"quantize": {"dtype": "nf4", "block_size": 48}})", {"quantize.block_size"}},
      {kFlux, R"({"quantize": {"dtype": "nf4", "block_size": 8}})", {"quantize.block_size"}},
      {kFlux, R"({"quantize": {"dtype": "nf4", "blocksize": 64}})", {"quantize.blocksize"}},
      {kFlux, R"({"quantize": {"dtype": "nf4", "double_quant": "yes"}})", {"quantize.double_quant"}},
      {kFlux, R"({"quantize": {"dtype": "nf4", "scale": "row"}})", {"quantize.scale"}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.options);
    flame_model_t none = reinterpret_cast<flame_model_t>(1);
    EXPECT_EQ(flame_model_create(ctx, "FluxTransformer2DModel", b.config, b.options, &none), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(none, nullptr);
    const std::string message = flame_last_error_message();
    for (const char* n : b.named) EXPECT_NE(message.find(n), std::string::npos) << message;
  }
}

}  // namespace
