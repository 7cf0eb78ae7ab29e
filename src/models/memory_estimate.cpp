// The preflight memory estimate (memory_estimate.h): parameter lists from the architectures' own
// tables, an activation plan per family (the checkpointable blocks in execution order with what each
// keeps and takes), then the sums for the request's options.
#include "models/memory_estimate.h"
#include "cuda/nf4_constants.cuh"
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include "core/dtype.h"
#include "core/error.h"
#include "models/flux_keys.h"
#include "models/lora_format.h"
#include "models/model_loader.h"
#include "models/sd3_keys.h"
#include "models/unet_blocks.h"

namespace flame::models {

namespace {

struct ParamInfo {
  std::string name;
  Shape shape;
  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};
using ParamList = std::vector<ParamInfo>;

// ---- parameters: the tables the loader checks files against ----

FluxConfig flux_config_of(const nlohmann::json& c, int64_t* patch_size) {
  FluxConfig f;  // FluxTransformer2DModel's defaults, as flux_transformer.cpp reads them
  *patch_size = config_int(c, "patch_size", 1);
  f.in_channels = config_int(c, "in_channels", 64);
  f.out_channels = config_int(c, "out_channels", f.in_channels);
  f.num_layers = config_int(c, "num_layers", 19);
  f.num_single_layers = config_int(c, "num_single_layers", 38);
  f.attention_head_dim = config_int(c, "attention_head_dim", 128);
  f.num_attention_heads = config_int(c, "num_attention_heads", 24);
  f.joint_attention_dim = config_int(c, "joint_attention_dim", 4096);
  f.pooled_projection_dim = config_int(c, "pooled_projection_dim", 768);
  f.guidance_embeds = config_bool(c, "guidance_embeds", false);
  f.axes_dims_rope = config_ints(c, "axes_dims_rope", {16, 56, 56});
  for (int64_t v : {*patch_size, f.in_channels, f.out_channels, f.attention_head_dim, f.num_attention_heads,
                    f.joint_attention_dim, f.pooled_projection_dim})
    FLAME_CHECK(v > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: FluxTransformer2DModel widths must be positive, not ", v);
  FLAME_CHECK(f.num_layers >= 0 && f.num_single_layers >= 0, FLAME_ERROR_INVALID_ARGUMENT,
              "config: \"num_layers\" and \"num_single_layers\" must not be negative");
  f.mlp_hidden_dim = 4 * f.inner_dim();
  return f;
}

SD3Config sd3_config_of(const nlohmann::json& c) {
  SD3Config s;  // SD3Transformer2DModel's defaults, as sd3_transformer.cpp reads them
  s.sample_size = config_int(c, "sample_size", 128);
  s.patch_size = config_int(c, "patch_size", 2);
  s.in_channels = config_int(c, "in_channels", 16);
  s.num_layers = config_int(c, "num_layers", 18);
  s.attention_head_dim = config_int(c, "attention_head_dim", 64);
  s.num_attention_heads = config_int(c, "num_attention_heads", 18);
  s.joint_attention_dim = config_int(c, "joint_attention_dim", 4096);
  s.caption_projection_dim = config_int(c, "caption_projection_dim", 1152);
  s.pooled_projection_dim = config_int(c, "pooled_projection_dim", 2048);
  s.out_channels = config_int(c, "out_channels", 16);
  s.pos_embed_max_size = config_int(c, "pos_embed_max_size", 96);
  s.dual_attention_layers = config_ints(c, "dual_attention_layers", {});
  s.qk_norm = config_string(c, "qk_norm", "");
  for (int64_t v : {s.patch_size, s.in_channels, s.num_layers, s.attention_head_dim, s.num_attention_heads,
                    s.joint_attention_dim, s.pooled_projection_dim, s.out_channels, s.pos_embed_max_size})
    FLAME_CHECK(v > 0, FLAME_ERROR_INVALID_ARGUMENT, "config: SD3Transformer2DModel sizes must be positive, not ", v);
  return s;
}

ParamList parameters_of(const std::string& architecture, const nlohmann::json& config) {
  ParamList out;
  if (architecture == "UNet2DConditionModel") {
    for (const ParamSpec& s : unet2d_condition_param_specs(config)) out.push_back({s.name, s.shape});
  } else if (architecture == "FluxTransformer2DModel") {
    int64_t patch = 1;
    const FluxConfig f = flux_config_of(config, &patch);
    for (KeyShape& k : flux_diffusers_tensors(f)) {
      // The table is for patch_size 1 (every released Flux); the output projection grows with the patch.
      if (k.name == "proj_out.weight" || k.name == "proj_out.bias") k.shape[0] = patch * patch * f.out_channels;
      out.push_back({k.name, k.shape});
    }
  } else if (architecture == "SD3Transformer2DModel") {
    for (const MappedParameter& p : sd3_parameter_table(sd3_config_of(config)).parameters)
      out.push_back({p.diffusers_name, p.shape});
  } else {
    fail(FLAME_ERROR_UNSUPPORTED, "memory estimate: architecture \"", architecture,
         "\" is not estimated (UNet2DConditionModel, FluxTransformer2DModel and SD3Transformer2DModel are)");
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

// A linear layer's weight, as Model::linear_modules counts them (these classes have no embeddings).
bool is_linear_weight(const ParamInfo& p) { return p.shape.size() == 2 && ends_with(p.name, ".weight"); }

// ---- activation plans ----

// One checkpointable block (Model::run_block / ConvNetModel::run_unit), in execution order.
struct Unit {
  std::string prefix;    // its parameters' names start with it
  double saved = 0;      // structural bytes kept for backward when it runs uncheckpointed
  double inputs = 0;     // bytes of its inputs (what a checkpointed block keeps)
};
struct ActivationPlan {
  std::vector<Unit> units;
  double other = 0;      // structural bytes kept outside blocks
  double fraction = 1;   // of the structural count that FLAME keeps (memory_estimate.h)
  double transient = 0;  // backward's working set within one block, as a share of its structural count
};

class ShapeIndex {
 public:
  explicit ShapeIndex(const ParamList& params) {
    for (const ParamInfo& p : params) shapes_.emplace(p.name, p.shape);
  }
  bool has(const std::string& n) const { return shapes_.count(n) != 0; }
  const Shape& at(const std::string& n) const {
    auto it = shapes_.find(n);
    FLAME_CHECK(it != shapes_.end(), FLAME_ERROR_INTERNAL, "memory estimate: no parameter ", n);
    return it->second;
  }
  // How many of head + i + tail exist for i = 0, 1, ...
  int64_t count(const std::string& head, const std::string& tail) const {
    int64_t i = 0;
    while (has(head + std::to_string(i) + tail)) ++i;
    return i;
  }

 private:
  std::map<std::string, Shape> shapes_;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Sizes {
  int64_t batch, latent_h, latent_w, text_tokens;
  double elem;  // bytes of the compute dtype
};

// UNet2DConditionModel (unet2d_condition.cpp): resnets and BasicTransformerBlocks are the units.
// Per position: a resnet keeps its group norms' and SiLUs' inputs and the convolutions' inputs
// (3 x in + 3 x out channels); a BasicTransformerBlock its three layer norms' inputs and outputs, the
// self-attention's q, k, v, output and merged heads, the cross-attention's q, output and merged heads
// (its k, v over the text tokens apart), GEGLU's input (2 x inner) and output (inner): 14 C + 3 inner.
ActivationPlan unet_plan(const ShapeIndex& ix, const Sizes& z) {
  ActivationPlan plan;
  plan.fraction = kConvNetSavedFraction;
  int level = 0;
  auto positions = [&](int l) {
    return static_cast<double>(z.batch) * static_cast<double>(ceil_div(z.latent_h, int64_t(1) << l)) *
           static_cast<double>(ceil_div(z.latent_w, int64_t(1) << l));
  };
  auto resnet = [&](const std::string& prefix) {
    const Shape& w = ix.at(prefix + "conv1.weight");  // [out, in, 3, 3]
    const double ci = static_cast<double>(w[1]), co = static_cast<double>(w[0]), pos = positions(level);
    plan.units.push_back({prefix, (3 * ci + 3 * co) * pos * z.elem, ci * pos * z.elem});
  };
  auto attention = [&](const std::string& prefix) {
    const int64_t depth = ix.count(prefix + "transformer_blocks.", ".norm1.weight");
    const double pos = positions(level);
    for (int64_t k = 0; k < depth; ++k) {
      const std::string b = prefix + "transformer_blocks." + std::to_string(k) + ".";
      const double c = static_cast<double>(ix.at(b + "norm1.weight")[0]);
      const double inner = static_cast<double>(ix.at(b + "ff.net.2.weight")[1]);
      const double text = 2 * c * static_cast<double>(z.batch * z.text_tokens);  // cross-attention k, v
      plan.units.push_back({b, ((14 * c + 3 * inner) * pos + text) * z.elem, c * pos * z.elem});
      if (k == 0) plan.other += 3 * c * pos * z.elem;  // the Transformer2DModel's norm, proj_in, proj_out inputs
    }
  };
  const Shape& conv_in = ix.at("conv_in.weight");
  plan.other += static_cast<double>(conv_in[1]) * positions(0) * z.elem;
  const int64_t downs = ix.count("down_blocks.", ".resnets.0.conv1.weight");
  for (int64_t i = 0; i < downs; ++i) {
    const std::string p = "down_blocks." + std::to_string(i) + ".";
    const int64_t layers = ix.count(p + "resnets.", ".conv1.weight");
    for (int64_t j = 0; j < layers; ++j) {
      resnet(p + "resnets." + std::to_string(j) + ".");
      if (ix.has(p + "attentions." + std::to_string(j) + ".norm.weight")) attention(p + "attentions." + std::to_string(j) + ".");
    }
    if (ix.has(p + "downsamplers.0.conv.weight")) {
      plan.other += static_cast<double>(ix.at(p + "downsamplers.0.conv.weight")[1]) * positions(level) * z.elem;
      ++level;
    }
  }
  if (ix.has("mid_block.resnets.0.conv1.weight")) {
    resnet("mid_block.resnets.0.");
    if (ix.has("mid_block.attentions.0.norm.weight")) attention("mid_block.attentions.0.");
    if (ix.has("mid_block.resnets.1.conv1.weight")) resnet("mid_block.resnets.1.");
  }
  const int64_t ups = ix.count("up_blocks.", ".resnets.0.conv1.weight");
  for (int64_t i = 0; i < ups; ++i) {
    const std::string p = "up_blocks." + std::to_string(i) + ".";
    const int64_t layers = ix.count(p + "resnets.", ".conv1.weight");
    for (int64_t j = 0; j < layers; ++j) {
      resnet(p + "resnets." + std::to_string(j) + ".");
      if (ix.has(p + "attentions." + std::to_string(j) + ".norm.weight")) attention(p + "attentions." + std::to_string(j) + ".");
    }
    if (ix.has(p + "upsamplers.0.conv.weight") && level > 0) {
      --level;
      plan.other += static_cast<double>(ix.at(p + "upsamplers.0.conv.weight")[1]) * positions(level) * z.elem;
    }
  }
  // conv_norm_out's input, its SiLU's input and conv_out's input.
  plan.other += 3 * static_cast<double>(ix.at("conv_out.weight")[1]) * positions(0) * z.elem;
  return plan;
}

// Per token of a double-stream MMDiT stream: the two layer norms' inputs, outputs and modulated
// outputs (6), q and k before their RMS norms (2), the attention's q, k, v and output (4), the merged
// heads (1), the output projection's result that the gate multiplies (1) and the feed-forward's
// result likewise (1): 15 widths, plus the GELU's input and output (2 x mlp).
double mmdit_stream(double d, double mlp) { return 15 * d + 2 * mlp; }

// FluxTransformer2DModel (flux_transformer.cpp): double blocks, then single blocks, over S = L + T tokens.
ActivationPlan flux_plan(const ShapeIndex& ix, const Sizes& z) {
  ActivationPlan plan;
  plan.fraction = kMMDiTSavedFraction;
  plan.transient = kFluxBackwardTransientFraction;
  const Shape& x_embedder = ix.at("x_embedder.weight");  // [D, in]
  const double d = static_cast<double>(x_embedder[0]);
  const double L = static_cast<double>(z.batch * ceil_div(z.latent_h, 2) * ceil_div(z.latent_w, 2));
  const double T = static_cast<double>(z.batch * z.text_tokens), S = L + T;
  plan.other = (static_cast<double>(x_embedder[1]) * L + static_cast<double>(ix.at("context_embedder.weight")[1]) * T +
                3 * d * L) * z.elem;
  const int64_t doubles = ix.count("transformer_blocks.", ".norm1.linear.weight");
  for (int64_t i = 0; i < doubles; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    const double mlp = static_cast<double>(ix.at(p + "ff.net.0.proj.weight")[0]);
    plan.units.push_back({p, mmdit_stream(d, mlp) * S * z.elem, d * S * z.elem});
  }
  const int64_t singles = ix.count("single_transformer_blocks.", ".norm.linear.weight");
  for (int64_t i = 0; i < singles; ++i) {
    const std::string p = "single_transformer_blocks." + std::to_string(i) + ".";
    const double mlp = static_cast<double>(ix.at(p + "proj_mlp.weight")[0]);
    // layer norm input, output, modulated (3), q / k before their norms (2), attention q, k, v, output
    // (4), merged heads (1), [attention, mlp] concatenated (1 + mlp), the gated result (1), GELU input (mlp).
    plan.units.push_back({p, (12 * d + 2 * mlp) * S * z.elem, d * S * z.elem});
  }
  return plan;
}

// SD3Transformer2DModel (sd3_transformer.cpp): joint blocks over the image's patches and the text.
ActivationPlan sd3_plan(const ShapeIndex& ix, const Sizes& z) {
  ActivationPlan plan;
  plan.fraction = kMMDiTSavedFraction;
  const Shape& patch = ix.at("pos_embed.proj.weight");  // [D, in, p, p]
  const double d = static_cast<double>(patch[0]);
  const int64_t p = patch[2];
  const double L = static_cast<double>(z.batch * ceil_div(z.latent_h, p) * ceil_div(z.latent_w, p));
  const double T = static_cast<double>(z.batch * z.text_tokens), S = L + T;
  plan.other = (static_cast<double>(patch[1] * p * p) * L + static_cast<double>(ix.at("context_embedder.weight")[1]) * T +
                3 * d * L) * z.elem;
  const int64_t blocks = ix.count("transformer_blocks.", ".norm1.linear.weight");
  for (int64_t i = 0; i < blocks; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    const double mlp = static_cast<double>(ix.at(b + "ff.net.0.proj.weight")[0]);
    double per = mmdit_stream(d, mlp) * L;
    // The last block's text only feeds the attention: its norm (3), q / k before norms (2), q, k, v, out (4).
    per += ix.has(b + "ff_context.net.0.proj.weight") ? mmdit_stream(d, mlp) * T : 9 * d * T;
    // SD3.5's second attention over the image: modulated input, q / k before norms, q, k, v, out,
    // merged heads and the gated result.
    if (ix.has(b + "attn2.to_q.weight")) per += 9 * d * L;
    plan.units.push_back({b, per * z.elem, d * S * z.elem});
  }
  return plan;
}

int64_t default_text_tokens(const std::string& architecture) {
  if (architecture == "FluxTransformer2DModel") return 512;  // T5 max_sequence_length in diffusers' Flux scripts
  if (architecture == "SD3Transformer2DModel") return 333;   // 77 CLIP + 256 T5 tokens (diffusers' SD3 default)
  return 77;                                                 // CLIP
}

// The longest matching pattern's value (model_lora.cpp's rule for rank_pattern / alpha_pattern).
int64_t module_rank(const LoraAdapterOptions& o, const std::string& module) {
  size_t best = 0;
  int64_t rank = o.rank;
  for (const auto& [pattern, v] : o.rank_pattern)
    if (pattern.size() > best && lora_target_matches(module, pattern)) {
      best = pattern.size();
      rank = v;
    }
  return rank;
}

int64_t positive_int(const nlohmann::json& r, const char* key, int64_t fallback) {
  if (!r.contains(key) || r[key].is_null()) return fallback;
  FLAME_CHECK(r[key].is_number_integer() && r[key].get<int64_t>() > 0, FLAME_ERROR_INVALID_ARGUMENT, "request: \"", key,
              "\" must be a positive integer");
  return r[key].get<int64_t>();
}

}  // namespace

TrainingMemoryRequest parse_training_memory_request(const nlohmann::json& r) {
  FLAME_CHECK(r.is_object(), FLAME_ERROR_INVALID_ARGUMENT, "request must be a JSON object");
  static const std::set<std::string> known = {"architecture", "config", "path", "options", "lora", "batch", "height",
                                              "width", "text_tokens", "checkpointing", "optimizer"};
  for (auto it = r.begin(); it != r.end(); ++it)
    FLAME_CHECK(known.count(it.key()), FLAME_ERROR_INVALID_ARGUMENT, "request: unknown key \"", it.key(),
                "\" (known: architecture, config, path, options, lora, batch, height, width, text_tokens, checkpointing, "
                "optimizer)");
  TrainingMemoryRequest q;
  const nlohmann::json options = r.contains("options") ? r["options"] : nlohmann::json::object();
  FLAME_CHECK(options.is_object(), FLAME_ERROR_INVALID_ARGUMENT, "request: \"options\" must be an object");
  if (r.contains("path")) {
    FLAME_CHECK(r["path"].is_string(), FLAME_ERROR_INVALID_ARGUMENT, "request: \"path\" must be a string");
    FLAME_CHECK(!r.contains("architecture") && !r.contains("config"), FLAME_ERROR_INVALID_ARGUMENT,
                "request: give \"path\" or \"architecture\" (with \"config\"), not both (options may override a "
                "file's architecture and config as for flame_model_load)");
    const ModelLoadPlan plan = plan_model_load(r["path"].get<std::string>(), options);
    q.architecture = plan.architecture;
    q.config = plan.config;
    q.options = plan.options;
  } else {
    FLAME_CHECK(r.contains("architecture") && r["architecture"].is_string(), FLAME_ERROR_INVALID_ARGUMENT,
                "request: \"architecture\" (a string) or \"path\" is required");
    q.architecture = r["architecture"].get<std::string>();
    if (r.contains("config") && !r["config"].is_null()) {
      FLAME_CHECK(r["config"].is_object(), FLAME_ERROR_INVALID_ARGUMENT, "request: \"config\" must be an object");
      q.config = r["config"];
    }
    q.options = parse_model_options(options);
  }
  if (r.contains("lora")) {
    FLAME_CHECK(r["lora"].is_null() || r["lora"].is_object() || r["lora"] == false, FLAME_ERROR_INVALID_ARGUMENT,
                "request: \"lora\" must be an object (flame_model_add_lora's options), or null / false for a full fine-tune");
    q.lora = r["lora"].is_object();
    if (q.lora) q.lora_options = r["lora"];
  }
  q.batch = positive_int(r, "batch", 1);
  q.height = positive_int(r, "height", 1024);
  q.width = positive_int(r, "width", 1024);
  q.text_tokens = positive_int(r, "text_tokens", default_text_tokens(q.architecture));
  if (r.contains("checkpointing") && !r["checkpointing"].is_null()) {
    FLAME_CHECK(r["checkpointing"].is_number_integer() && r["checkpointing"].get<int64_t>() >= 0,
                FLAME_ERROR_INVALID_ARGUMENT, "request: \"checkpointing\" must be an integer >= 0 (every n-th block; 0 off)");
    q.checkpoint_every = r["checkpointing"].get<int64_t>();
  }
  if (r.contains("optimizer") && !r["optimizer"].is_null()) {
    FLAME_CHECK(r["optimizer"].is_string(), FLAME_ERROR_INVALID_ARGUMENT, "request: \"optimizer\" must be a string");
    q.optimizer = r["optimizer"].get<std::string>();
    const std::set<std::string> known = {"adamw", "adam", "lion", "sgd", "adamw8bit", "adam8bit", "lion8bit"};
    FLAME_CHECK(known.count(q.optimizer), FLAME_ERROR_INVALID_ARGUMENT, "request: \"optimizer\" \"", q.optimizer,
                "\" is not known (adamw, adam, lion, sgd, adamw8bit, adam8bit, lion8bit)");
  }
  return q;
}

TrainingMemoryEstimate estimate_training_memory(const TrainingMemoryRequest& q) {
  const ParamList params = parameters_of(q.architecture, q.config);
  const ShapeIndex ix(params);
  const ModelOptions& o = q.options;
  const double elem = static_cast<double>(dtype_size(o.compute_dtype));
  FLAME_CHECK(q.height % 8 == 0 && q.width % 8 == 0, FLAME_ERROR_INVALID_ARGUMENT, "request: height and width (", q.height,
              " x ", q.width, ") must be multiples of 8, the VAE's factor");
  const Sizes z{q.batch, q.height / 8, q.width / 8, q.text_tokens, elem};
  ActivationPlan plan = q.architecture == "UNet2DConditionModel" ? unet_plan(ix, z)
                        : q.architecture == "FluxTransformer2DModel" ? flux_plan(ix, z)
                                                                      : sd3_plan(ix, z);
  TrainingMemoryEstimate e;

  // Parameters as stored, and per unit.
  const uint64_t param_elem = dtype_size(o.param_dtype);
  auto stored_bytes = [&](const ParamInfo& p) -> uint64_t {
    if (!o.quantize.enabled || !is_linear_weight(p)) return p.numel() * param_elem;
    if (o.quantize.nf4()) {  // ops/nf4.h: half a byte per weight, an absmax per block (1 byte, or f32)
      const uint64_t blocks = p.numel() / static_cast<uint64_t>(o.quantize.block_size);
      if (!o.quantize.double_quant) return p.numel() / 2 + blocks * 4;
      const uint64_t chunks = (blocks + kNf4NestedBlock - 1) / kNf4NestedBlock;
      return p.numel() / 2 + blocks + chunks * 4 + 4;  // codes, nested scales, the mean
    }
    const uint64_t scale = o.quantize.scale == QuantScale::PerRow ? static_cast<uint64_t>(p.shape[0]) * 4 : 4;
    return p.numel() * dtype_size(o.quantize.dtype) + scale;
  };
  uint64_t total_param_bytes = 0;
  std::vector<uint64_t> unit_bytes(plan.units.size(), 0), unit_slot_bytes(plan.units.size(), 0);
  // Elements of each unit's weights that its forward keeps as copies in the compute dtype until
  // backward: every weight cast from another storage dtype (Model::param records the cast). A
  // quantised base keeps none (ops::quantized_linear saves q and scale): its largest linear weight,
  // dequantised for one GEMM at a time, is a transient.
  std::vector<double> unit_copies(plan.units.size(), 0);
  double largest_dequantized = 0;
  const bool cast_params = o.param_dtype != o.compute_dtype;
  for (const ParamInfo& p : params) {
    const uint64_t b = stored_bytes(p);
    total_param_bytes += b;
    e.parameter_count += p.numel();
    for (size_t u = 0; u < plan.units.size(); ++u)
      if (starts_with(p.name, plan.units[u].prefix)) {
        unit_bytes[u] += b;
        unit_slot_bytes[u] += (b + 255) / 256 * 256;  // weight_offload.cpp: 256-byte aligned in a slot
        if (o.quantize.enabled && is_linear_weight(p))
          largest_dequantized = std::max(largest_dequantized, static_cast<double>(p.numel()));
        else if (cast_params)
          unit_copies[u] += static_cast<double>(p.numel());
        break;
      }
  }

  // Adapter and what is trained.
  uint64_t trainable_bytes = 0;
  uint64_t optimizer_elem_bytes = 4;
  bool base_frozen = false;
  if (q.lora) {
    const LoraAdapterOptions lo = parse_lora_adapter_options(q.lora_options);
    std::vector<LoraCandidate> candidates;
    for (const ParamInfo& p : params)
      if (is_linear_weight(p)) candidates.push_back({p.name.substr(0, p.name.size() - 7), p.shape[1], p.shape[0]});
    const std::vector<std::string> targets =
        lo.targets.empty() ? default_lora_targets(q.architecture, q.config,
                                                  lo.kohya_preset ? LoraTargetConvention::Kohya
                                                                  : LoraTargetConvention::DiffusersScripts)
                           : lo.targets;
    for (const std::string& t : targets) {
      bool any = false;
      for (const LoraCandidate& m : candidates) any = any || lora_target_matches(m.module, t);
      FLAME_CHECK(any, FLAME_ERROR_INVALID_ARGUMENT, "LoRA target \"", t, "\" matches no linear layer of the model");
    }
    uint64_t adapter_elements = 0;
    for (const LoraCandidate& m : select_lora_modules(candidates, targets)) {
      const int64_t rank = module_rank(lo, m.module);
      if (lo.lokr)  // its Kronecker factors (model_lora.cpp's create_lokr_module), far fewer than a LoRA's
        adapter_elements += static_cast<uint64_t>(
            lokr_shape(m.out_features, m.in_features, rank, lo.lokr_factor, lo.lokr_decompose_both).elements(rank));
      else
        adapter_elements += static_cast<uint64_t>(rank) * static_cast<uint64_t>(m.in_features + m.out_features);
      if (lo.dora) adapter_elements += static_cast<uint64_t>(m.out_features);
    }
    e.adapter = adapter_elements * dtype_size(lo.dtype);
    e.trainable_count = adapter_elements;
    trainable_bytes = e.adapter;
    if (lo.dtype == FLAME_DTYPE_F64) optimizer_elem_bytes = 8;
    base_frozen = lo.freeze_base;
  }
  if (!base_frozen) {  // a full fine-tune, or LoRA with freeze_base false: every unquantised parameter trains
    for (const ParamInfo& p : params)
      if (!(o.quantize.enabled && is_linear_weight(p))) {
        e.trainable_count += p.numel();
        trainable_bytes += p.numel() * param_elem;
      }
    if (o.param_dtype == FLAME_DTYPE_F64) optimizer_elem_bytes = 8;
  }
  e.gradients = trainable_bytes;
  const bool eight_bit = q.optimizer.size() > 4 && q.optimizer.compare(q.optimizer.size() - 4, 4, "8bit") == 0;
  const uint64_t moments = q.optimizer == "sgd" ? 0 : q.optimizer.compare(0, 4, "lion") == 0 ? 1 : 2;
  // 8-bit moments (flame_optimizer_set_state_bits): a byte per element plus an f32 absmax per 256
  e.optimizer = eight_bit ? moments * (e.trainable_count + 4 * ((e.trainable_count + 255) / 256))
                          : moments * e.trainable_count * optimizer_elem_bytes;

  // Offload (weight_offload.cpp's plan): frozen blocks to host memory in execution order until the
  // rest plus the ring fits the budget.
  std::vector<bool> offloaded(plan.units.size(), false);
  e.weights = total_param_bytes;
  if (o.offload.enabled) {
    const uint64_t budget = o.offload.budget_for(total_param_bytes);
    if (total_param_bytes > budget && base_frozen) {
      uint64_t moved = 0, slot = 0;
      const uint64_t slots = static_cast<uint64_t>(o.offload.slots);
      auto resident = [&] { return total_param_bytes - moved + slots * slot; };
      size_t chosen = 0;
      for (size_t u = 0; u < plan.units.size() && !(chosen > 0 && resident() <= budget); ++u) {
        if (unit_bytes[u] == 0) continue;
        moved += unit_bytes[u];
        slot = std::max(slot, unit_slot_bytes[u]);
        offloaded[u] = true;
        ++chosen;
      }
      FLAME_CHECK(resident() <= budget, FLAME_ERROR_INVALID_ARGUMENT, "model option offload: a budget of ", budget,
                  " bytes cannot be met: with all ", chosen, " blocks in host memory, ", resident(),
                  " bytes stay on the device (", total_param_bytes - moved, " bytes of other parameters, plus ", slots,
                  " ring slots of ", slot, " bytes)");
      e.weights = resident();
    }
  }

  // Activations: uncheckpointed blocks keep their share of the structural count (and the weight
  // copies above); checkpointed ones keep their inputs, and the largest of them is recomputed during
  // backward. On top, backward's working set inside the largest block (the gradients of its widest
  // tensors and the attention's) and a quantised base's one dequantised weight.
  const CheckpointPolicy policy{q.checkpoint_every};
  double activations = plan.fraction * plan.other, recompute = 0, transient = largest_dequantized * elem;
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const Unit& unit = plan.units[u];
    transient = std::max(transient, plan.transient * unit.saved + largest_dequantized * elem);
    const double full = plan.fraction * unit.saved + unit_copies[u] * elem;
    if (offloaded[u] || policy.applies_to(static_cast<int64_t>(u))) {
      activations += unit.inputs;
      recompute = std::max(recompute, full);
    } else {
      activations += full;
    }
  }
  e.activations = static_cast<uint64_t>(std::llround(activations + recompute + transient));
  e.workspace = kEstimateWorkspaceBytes;
  e.total = e.weights + e.adapter + e.gradients + e.optimizer + e.activations + e.workspace;
  return e;
}

}  // namespace flame::models
