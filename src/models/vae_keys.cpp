// AutoencoderKL keys (see vae_keys.h): one builder walks the encoder and decoder in diffusers' order
// of registration and names each parameter in both layouts; detection reads the configuration back.
#include "models/vae_keys.h"
#include "core/error.h"

namespace flame::models {

namespace {

const char* const kPrefixes[] = {"", "first_stage_model.", "vae."};

class VAETableBuilder {
 public:
  explicit VAETableBuilder(const VAEConfig& c) : c_(c) {}

  MappedTable build() {
    const std::vector<int64_t>& ch = c_.block_out_channels;
    const int64_t n = static_cast<int64_t>(ch.size()), L = c_.layers_per_block;
    // Encoder: conv_in, down_blocks, mid_block, conv_norm_out, conv_out (2 x latent: mean and log-variance).
    conv("encoder.conv_in", "encoder.conv_in", ch[0], c_.in_channels, 3);
    for (int64_t i = 0; i < n; ++i) {
      const std::string d = "encoder.down_blocks." + std::to_string(i) + ".";
      const std::string o = "encoder.down." + std::to_string(i) + ".";
      for (int64_t j = 0; j < L; ++j)
        resnet(d + "resnets." + std::to_string(j) + ".", o + "block." + std::to_string(j) + ".",
               j == 0 ? (i == 0 ? ch[0] : ch[i - 1]) : ch[i], ch[i]);
      if (i < n - 1) conv(d + "downsamplers.0.conv", o + "downsample.conv", ch[i], ch[i], 3);
    }
    mid_block("encoder.", ch[n - 1]);
    b_.weight_bias("encoder.conv_norm_out", "encoder.norm_out", {ch[n - 1]});
    conv("encoder.conv_out", "encoder.conv_out", 2 * c_.latent_channels, ch[n - 1], 3);
    // Decoder: conv_in, up_blocks (registered before mid_block), mid_block, conv_norm_out, conv_out.
    conv("decoder.conv_in", "decoder.conv_in", ch[n - 1], c_.latent_channels, 3);
    for (int64_t u = 0; u < n; ++u) {
      const int64_t k = n - 1 - u;  // the LDM index, and the encoder block this one mirrors
      const std::string d = "decoder.up_blocks." + std::to_string(u) + ".";
      const std::string o = "decoder.up." + std::to_string(k) + ".";
      const int64_t prev = u == 0 ? ch[n - 1] : ch[k + 1];
      for (int64_t j = 0; j <= L; ++j)
        resnet(d + "resnets." + std::to_string(j) + ".", o + "block." + std::to_string(j) + ".", j == 0 ? prev : ch[k],
               ch[k]);
      if (u < n - 1) conv(d + "upsamplers.0.conv", o + "upsample.conv", ch[k], ch[k], 3);
    }
    mid_block("decoder.", ch[n - 1]);
    b_.weight_bias("decoder.conv_norm_out", "decoder.norm_out", {ch[0]});
    conv("decoder.conv_out", "decoder.conv_out", c_.out_channels, ch[0], 3);
    if (c_.use_quant_conv) conv("quant_conv", "quant_conv", 2 * c_.latent_channels, 2 * c_.latent_channels, 1);
    if (c_.use_post_quant_conv) conv("post_quant_conv", "post_quant_conv", c_.latent_channels, c_.latent_channels, 1);
    return b_.take();
  }

 private:
  void conv(const std::string& d, const std::string& o, int64_t out, int64_t in, int64_t k) {
    b_.weight_bias(d, o, {out, in, k, k});
  }
  // ResnetBlock2D without time embedding: norm1, conv1, norm2, conv2, conv_shortcut (LDM nin_shortcut).
  void resnet(const std::string& d, const std::string& o, int64_t in, int64_t out) {
    b_.weight_bias(d + "norm1", o + "norm1", {in});
    conv(d + "conv1", o + "conv1", out, in, 3);
    b_.weight_bias(d + "norm2", o + "norm2", {out});
    conv(d + "conv2", o + "conv2", out, out, 3);
    if (in != out) conv(d + "conv_shortcut", o + "nin_shortcut", out, in, 1);
  }
  // The mid attention's projection: diffusers Linear [C, C], LDM 1x1 convolution [C, C, 1, 1].
  void attention_projection(const std::string& d, const std::string& o, int64_t c) {
    b_.reshaped(d + ".weight", {c, c}, o + ".weight", {c, c, 1, 1});
    b_.same(d + ".bias", o + ".bias", {c});
  }
  // UNetMidBlock2D: attentions.0 (group_norm, to_q, to_k, to_v, to_out.0), then resnets 0 and 1.
  void mid_block(const std::string& part, int64_t c) {
    const std::string d = part + "mid_block.", o = part + "mid.";
    if (c_.mid_block_add_attention) {
      b_.weight_bias(d + "attentions.0.group_norm", o + "attn_1.norm", {c});
      attention_projection(d + "attentions.0.to_q", o + "attn_1.q", c);
      attention_projection(d + "attentions.0.to_k", o + "attn_1.k", c);
      attention_projection(d + "attentions.0.to_v", o + "attn_1.v", c);
      attention_projection(d + "attentions.0.to_out.0", o + "attn_1.proj_out", c);
    }
    resnet(d + "resnets.0.", o + "block_1.", c, c);
    resnet(d + "resnets.1.", o + "block_2.", c, c);
  }

  const VAEConfig& c_;
  MappedTableBuilder b_;
};

// Which layout, if any, starts at prefix pre.
std::optional<VAELayout> layout_at(const KeyIndex& idx, const std::string& pre) {
  if (!idx.has(pre + "encoder.conv_in.weight") || !idx.has(pre + "decoder.conv_in.weight")) return std::nullopt;
  if (idx.has(pre + "encoder.down.0.block.0.conv1.weight")) return VAELayout::Original;
  if (idx.has(pre + "encoder.down_blocks.0.resnets.0.conv1.weight")) return VAELayout::Diffusers;
  return std::nullopt;
}

}  // namespace

VAEConfig flux_vae_config() {
  VAEConfig c;
  c.latent_channels = 16;
  c.scaling_factor = 0.3611;
  c.shift_factor = 0.1159;
  c.use_quant_conv = false;
  c.use_post_quant_conv = false;
  return c;
}

VAEConfig sd3_vae_config() {
  VAEConfig c = flux_vae_config();
  c.scaling_factor = 1.5305;
  c.shift_factor = 0.0609;
  return c;
}

MappedTable vae_parameter_table(const VAEConfig& cfg) {
  FLAME_CHECK(!cfg.block_out_channels.empty() && cfg.layers_per_block >= 1 && cfg.latent_channels >= 1,
              FLAME_ERROR_INVALID_ARGUMENT, "AutoencoderKL configuration: ", cfg.block_out_channels.size(),
              " blocks, ", cfg.layers_per_block, " layers a block and ", cfg.latent_channels,
              " latent channels (at least one of each needed)");
  return VAETableBuilder(cfg).build();
}

bool is_vae_checkpoint(const std::vector<KeyShape>& keys) {
  const KeyIndex idx(keys, "AutoencoderKL");
  for (const char* p : kPrefixes)
    if (layout_at(idx, p)) return true;
  return false;
}

VAECheckpoint detect_vae_checkpoint(const std::vector<KeyShape>& keys) {
  const KeyIndex idx(keys, "AutoencoderKL");
  VAECheckpoint ck;
  bool found = false;
  for (const char* p : kPrefixes) {
    if (const std::optional<VAELayout> layout = layout_at(idx, p)) {
      ck.layout = *layout;
      ck.prefix = p;
      found = true;
      break;
    }
  }
  FLAME_CHECK(found, FLAME_ERROR_INVALID_FORMAT, "not an AutoencoderKL checkpoint: no encoder.conv_in.weight and "
              "decoder.conv_in.weight with encoder.down.0.block.0 (LDM layout) or encoder.down_blocks.0.resnets.0 "
              "(diffusers' layout), under no prefix, first_stage_model. or vae.");
  const bool ldm = ck.layout == VAELayout::Original;
  const std::string& pre = ck.prefix;
  VAEConfig& c = ck.config;
  const KeyShape& conv_in = idx.need(pre + "encoder.conv_in.weight", 4);
  c.in_channels = conv_in.shape[1];
  const std::string down = pre + (ldm ? "encoder.down." : "encoder.down_blocks.");
  const int64_t n = idx.count_indices(down);
  c.layers_per_block = idx.count_indices(down + "0." + (ldm ? "block." : "resnets."));
  FLAME_CHECK(c.layers_per_block >= 1, FLAME_ERROR_INVALID_FORMAT, "AutoencoderKL checkpoint has no ", down,
              "0 resnets");
  c.block_out_channels.clear();
  for (int64_t i = 0; i < n; ++i)
    c.block_out_channels.push_back(
        idx.need(down + std::to_string(i) + (ldm ? ".block.0.conv1.weight" : ".resnets.0.conv1.weight"), 4).shape[0]);
  c.latent_channels = idx.need(pre + "decoder.conv_in.weight", 4).shape[1];
  c.out_channels = idx.need(pre + "decoder.conv_out.weight", 4).shape[0];
  c.use_quant_conv = idx.has(pre + "quant_conv.weight");
  c.use_post_quant_conv = idx.has(pre + "post_quant_conv.weight");
  c.mid_block_add_attention =
      idx.has(pre + (ldm ? "encoder.mid.attn_1.q.weight" : "encoder.mid_block.attentions.0.to_q.weight"));
  if (c.latent_channels == 16) {
    const VAEConfig flux = flux_vae_config();
    c.scaling_factor = flux.scaling_factor;
    c.shift_factor = flux.shift_factor;
  }
  const MappedTable table = vae_parameter_table(c);
  idx.expect_all(ldm ? table.original : table.diffusers_tensors(), pre,
                 "an AutoencoderKL of " + std::to_string(n) + " blocks of " + std::to_string(c.layers_per_block) +
                     " layers and " + std::to_string(c.latent_channels) + " latent channels");
  return ck;
}

}  // namespace flame::models
