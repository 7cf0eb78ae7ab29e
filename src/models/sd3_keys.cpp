// SD3 MMDiT keys (see sd3_keys.h): one builder walks SD3Transformer2DModel in its state_dict order
// and names each parameter's rows in the original tensors; detection reads the configuration back
// from a key list and checks the list against the builder's.
#include "models/sd3_keys.h"
#include <algorithm>
#include <cmath>
#include "core/error.h"

namespace flame::models {

namespace {

const char* const kComfyPrefix = "model.diffusion_model.";
const char* const kOriginalMarker = "joint_blocks.0.context_block.adaLN_modulation.1.bias";

using Dims = std::vector<int64_t>;

class SD3TableBuilder {
 public:
  explicit SD3TableBuilder(const SD3Config& c) : c_(c), d_(c.inner_dim()) {}

  MappedTable build() {
    const int64_t d = d_, p = c_.patch_size, m = c_.pos_embed_max_size;
    b_.same("pos_embed.pos_embed", "pos_embed", {1, m * m, d});
    b_.weight_bias("pos_embed.proj", "x_embedder.proj", {d, c_.in_channels, p, p});
    b_.weight_bias("time_text_embed.timestep_embedder.linear_1", "t_embedder.mlp.0", {d, 256});
    b_.weight_bias("time_text_embed.timestep_embedder.linear_2", "t_embedder.mlp.2", {d, d});
    b_.weight_bias("time_text_embed.text_embedder.linear_1", "y_embedder.mlp.0", {d, c_.pooled_projection_dim});
    b_.weight_bias("time_text_embed.text_embedder.linear_2", "y_embedder.mlp.2", {d, d});
    b_.weight_bias("context_embedder", "context_embedder", {c_.caption_projection_dim, c_.joint_attention_dim});
    for (int64_t i = 0; i < c_.num_layers; ++i) block(i);
    modulation("norm_out.linear", "final_layer.adaLN_modulation.1", 2, true);
    b_.weight_bias("proj_out", "final_layer.linear", {p * p * c_.out_channels, d});
    return b_.take();
  }

 private:
  // A modulation Linear [k * d, d], stored with [shift; scale] halves when swap.
  void modulation(const std::string& dname, const std::string& oname, int64_t k, bool swap) {
    b_.rows(dname + ".weight", {k * d_, d_}, oname + ".weight", {k * d_, d_}, 0, swap);
    b_.rows(dname + ".bias", {k * d_}, oname + ".bias", {k * d_}, 0, swap);
  }
  // Linear `dname` = the third `third` (0: q, 1: k, 2: v) of the fused projection oname.
  void qkv_part(const std::string& dname, const std::string& oname, int64_t third) {
    b_.rows(dname + ".weight", {d_, d_}, oname + ".weight", {3 * d_, d_}, third * d_);
    b_.rows(dname + ".bias", {d_}, oname + ".bias", {3 * d_}, third * d_);
  }
  void qk_norm(const std::string& dname, const std::string& oname) {
    if (c_.qk_norm.empty()) return;
    b_.same(dname + ".weight", oname + ".weight", {c_.attention_head_dim});
  }
  void feed_forward(const std::string& dname, const std::string& oname) {
    b_.weight_bias(dname + ".net.0.proj", oname + ".fc1", {4 * d_, d_});
    b_.weight_bias(dname + ".net.2", oname + ".fc2", {d_, 4 * d_});
  }

  // JointTransformerBlock: norm1, norm1_context, attn, attn2, ff, ff_context (diffusers' order; the
  // attention's: norm_q, norm_k, to_q, to_k, to_v, add_k_proj, add_v_proj, add_q_proj, to_out.0,
  // to_add_out, norm_added_q, norm_added_k).
  void block(int64_t i) {
    const std::string t = "transformer_blocks." + std::to_string(i) + ".";
    const std::string x = "joint_blocks." + std::to_string(i) + ".x_block.";
    const std::string ctx = "joint_blocks." + std::to_string(i) + ".context_block.";
    const bool last = i == c_.num_layers - 1;
    const bool dual = std::find(c_.dual_attention_layers.begin(), c_.dual_attention_layers.end(), i) !=
                      c_.dual_attention_layers.end();
    modulation(t + "norm1.linear", x + "adaLN_modulation.1", dual ? 9 : 6, false);
    modulation(t + "norm1_context.linear", ctx + "adaLN_modulation.1", last ? 2 : 6, last);
    qk_norm(t + "attn.norm_q", x + "attn.ln_q");
    qk_norm(t + "attn.norm_k", x + "attn.ln_k");
    qkv_part(t + "attn.to_q", x + "attn.qkv", 0);
    qkv_part(t + "attn.to_k", x + "attn.qkv", 1);
    qkv_part(t + "attn.to_v", x + "attn.qkv", 2);
    qkv_part(t + "attn.add_k_proj", ctx + "attn.qkv", 1);
    qkv_part(t + "attn.add_v_proj", ctx + "attn.qkv", 2);
    qkv_part(t + "attn.add_q_proj", ctx + "attn.qkv", 0);
    b_.weight_bias(t + "attn.to_out.0", x + "attn.proj", {d_, d_});
    if (!last) b_.weight_bias(t + "attn.to_add_out", ctx + "attn.proj", {d_, d_});
    qk_norm(t + "attn.norm_added_q", ctx + "attn.ln_q");
    qk_norm(t + "attn.norm_added_k", ctx + "attn.ln_k");
    if (dual) {
      qk_norm(t + "attn2.norm_q", x + "attn2.ln_q");
      qk_norm(t + "attn2.norm_k", x + "attn2.ln_k");
      qkv_part(t + "attn2.to_q", x + "attn2.qkv", 0);
      qkv_part(t + "attn2.to_k", x + "attn2.qkv", 1);
      qkv_part(t + "attn2.to_v", x + "attn2.qkv", 2);
      b_.weight_bias(t + "attn2.to_out.0", x + "attn2.proj", {d_, d_});
    }
    feed_forward(t + "ff", x + "mlp");
    if (!last) feed_forward(t + "ff_context", ctx + "mlp");
  }

  const SD3Config& c_;
  const int64_t d_;
  MappedTableBuilder b_;
};

// The tensor names detection reads, in one layout.
struct SD3Names {
  const char* patch;
  const char* positions;
  const char* pooled;
  const char* out;
  const char* blocks;        // "transformer_blocks." / "joint_blocks."
  const char* first_q_norm;  // block 0's image-stream q norm
  const char* attn2_q;       // a block's attn2 tensor after "<blocks><i>."
};

const SD3Names kOriginalNames{"x_embedder.proj.weight", "pos_embed", "y_embedder.mlp.0.weight",
                              "final_layer.linear.weight", "joint_blocks.", "joint_blocks.0.x_block.attn.ln_q",
                              "x_block.attn2.qkv.weight"};
const SD3Names kDiffusersNames{"pos_embed.proj.weight", "pos_embed.pos_embed",
                               "time_text_embed.text_embedder.linear_1.weight", "proj_out.weight",
                               "transformer_blocks.", "transformer_blocks.0.attn.norm_q", "attn2.to_q.weight"};

bool has_diffusers_markers(const KeyIndex& idx, const std::string& pre) {
  return idx.has(pre + "pos_embed.proj.weight") && idx.has(pre + "context_embedder.weight") &&
         idx.has(pre + "transformer_blocks.0.norm1_context.linear.weight");
}

}  // namespace

SD3Config sd3_medium_config() {
  SD3Config c;
  c.caption_projection_dim = 1536;
  c.pos_embed_max_size = 192;
  c.qk_norm = "";
  c.dual_attention_layers.clear();
  return c;
}

MappedTable sd3_parameter_table(const SD3Config& cfg) {
  FLAME_CHECK(cfg.num_layers >= 1 && cfg.attention_head_dim > 0 && cfg.num_attention_heads > 0 && cfg.patch_size > 0 &&
                  cfg.pos_embed_max_size > 0,
              FLAME_ERROR_INVALID_ARGUMENT, "SD3 configuration: layers, heads, head width, patch size and "
              "pos_embed_max_size must be positive");
  FLAME_CHECK(cfg.caption_projection_dim == cfg.inner_dim(), FLAME_ERROR_INVALID_ARGUMENT,
              "SD3 configuration: caption_projection_dim ", cfg.caption_projection_dim,
              " must equal the inner width num_attention_heads * attention_head_dim = ", cfg.inner_dim());
  FLAME_CHECK(cfg.qk_norm.empty() || cfg.qk_norm == "rms_norm", FLAME_ERROR_INVALID_ARGUMENT,
              "SD3 configuration: qk_norm '", cfg.qk_norm, "' is not supported (none or rms_norm)");
  for (int64_t l : cfg.dual_attention_layers)
    FLAME_CHECK(l >= 0 && l < cfg.num_layers, FLAME_ERROR_INVALID_ARGUMENT, "SD3 configuration: dual attention layer ",
                l, " is not one of the ", cfg.num_layers, " blocks");
  return SD3TableBuilder(cfg).build();
}

bool is_sd3_checkpoint(const std::vector<KeyShape>& keys) {
  const KeyIndex idx(keys, "SD3");
  for (const char* p : {"", kComfyPrefix}) {
    const std::string pre(p);
    if (idx.has(pre + kOriginalMarker) || has_diffusers_markers(idx, pre)) return true;
  }
  return false;
}

SD3Checkpoint detect_sd3_checkpoint(const std::vector<KeyShape>& keys) {
  const KeyIndex idx(keys, "SD3");
  SD3Checkpoint ck;
  bool found = false;
  for (const char* p : {"", kComfyPrefix}) {
    const std::string pre(p);
    if (idx.has(pre + kOriginalMarker)) {
      ck.layout = SD3Layout::Original;
    } else if (has_diffusers_markers(idx, pre)) {
      ck.layout = SD3Layout::Diffusers;
    } else {
      continue;
    }
    ck.prefix = pre;
    found = true;
    break;
  }
  FLAME_CHECK(found, FLAME_ERROR_INVALID_FORMAT, "not an SD3 checkpoint: neither ", kOriginalMarker,
              " (Stability's layout) nor pos_embed.proj.weight with transformer_blocks.0.norm1_context.linear.weight "
              "(diffusers' layout), with or without the prefix ", kComfyPrefix);
  const bool original = ck.layout == SD3Layout::Original;
  const SD3Names& n = original ? kOriginalNames : kDiffusersNames;
  const std::string& pre = ck.prefix;
  SD3Config& c = ck.config;
  const KeyShape& patch = idx.need(pre + n.patch, 4);
  const int64_t d = patch.shape[0];
  c.in_channels = patch.shape[1];
  c.patch_size = patch.shape[2];
  FLAME_CHECK(patch.shape[2] == patch.shape[3] && patch.shape[2] > 0 && d > 0, FLAME_ERROR_INVALID_FORMAT,
              "SD3 tensor ", pre + n.patch, " has an empty or non-square patch kernel ", patch.shape[2], "x",
              patch.shape[3], " or no output channels");
  const KeyShape& positions = idx.need(pre + n.positions, 3);
  const int64_t len = positions.shape[1];
  FLAME_CHECK(len > 0, FLAME_ERROR_INVALID_FORMAT, "SD3 tensor ", pre + n.positions, " holds no positions");
  c.pos_embed_max_size = std::llround(std::sqrt(static_cast<double>(len)));
  FLAME_CHECK(c.pos_embed_max_size * c.pos_embed_max_size == len, FLAME_ERROR_INVALID_FORMAT, "SD3 tensor ",
              pre + n.positions, " holds ", len, " positions, not a square grid");
  const KeyShape& context = idx.need(pre + "context_embedder.weight", 2);
  c.caption_projection_dim = context.shape[0];
  c.joint_attention_dim = context.shape[1];
  c.pooled_projection_dim = idx.need(pre + n.pooled, 2).shape[1];
  c.num_layers = idx.count_indices(pre + n.blocks);
  FLAME_CHECK(c.num_layers >= 1, FLAME_ERROR_INVALID_FORMAT, "SD3 checkpoint has no ", pre + n.blocks, "0");
  const std::string q_norm = pre + n.first_q_norm;
  if (const KeyShape* qn = idx.find(q_norm + ".weight")) {
    FLAME_CHECK(!idx.has(q_norm + ".bias"), FLAME_ERROR_INVALID_FORMAT, "SD3 checkpoint has ", q_norm,
                ".bias: layer-norm QK norms are not supported (SD3.5 uses RMS norms)");
    FLAME_CHECK(qn->shape.size() == 1, FLAME_ERROR_INVALID_FORMAT, "SD3 tensor ", q_norm, ".weight is not a vector");
    c.qk_norm = "rms_norm";
    c.attention_head_dim = qn->shape[0];
  } else {
    c.qk_norm = "";
    c.attention_head_dim = 64;
  }
  FLAME_CHECK(c.attention_head_dim > 0 && d % c.attention_head_dim == 0, FLAME_ERROR_INVALID_FORMAT,
              "SD3 checkpoint: the inner width ", d, " (", pre + n.patch, ") is not a multiple of the head width ",
              c.attention_head_dim);
  c.num_attention_heads = d / c.attention_head_dim;
  const KeyShape& out = idx.need(pre + n.out, 2);
  FLAME_CHECK(out.shape[0] % (c.patch_size * c.patch_size) == 0, FLAME_ERROR_INVALID_FORMAT, "SD3 tensor ",
              pre + n.out, " has ", out.shape[0], " rows, not a multiple of the patch area ",
              c.patch_size * c.patch_size);
  c.out_channels = out.shape[0] / (c.patch_size * c.patch_size);
  FLAME_CHECK(c.caption_projection_dim == d, FLAME_ERROR_INVALID_FORMAT, "SD3 checkpoint: context_embedder.weight "
              "projects to ", c.caption_projection_dim, " but the blocks are ", d, " wide");
  c.dual_attention_layers.clear();
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (idx.has(pre + n.blocks + std::to_string(i) + "." + n.attn2_q)) c.dual_attention_layers.push_back(i);
  const MappedTable table = sd3_parameter_table(c);
  idx.expect_all(original ? table.original : table.diffusers_tensors(), pre,
                 "an SD3 transformer of " + std::to_string(c.num_layers) + " blocks of width " + std::to_string(d));
  return ck;
}

}  // namespace flame::models
