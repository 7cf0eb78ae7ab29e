// UNet2DConditionModel keys (see unet_keys.h): one builder walks the model in diffusers' order of
// registration and names each parameter in both layouts; detection reads the configuration back
// from a key list and checks the list against the builder's.
#include "models/unet_keys.h"
#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include "core/error.h"
#include "core/shape.h"

namespace flame::models {

namespace {

const char* const kSgmPrefix = "model.diffusion_model.";

using Dims = std::vector<int64_t>;

// Emits parameters as (diffusers name, SGM name, shape), in diffusers' order.
class UNetBuilder {
 public:
  explicit UNetBuilder(const UNetConfig& c) : c_(c) {}

  void param(const std::string& d, const std::string& o, Dims shape) { out_.push_back({d, o, std::move(shape)}); }
  // weight [shape...] and bias [shape[0]].
  void weight_bias(const std::string& d, const std::string& o, const Dims& weight) {
    param(d + ".weight", o + ".weight", weight);
    param(d + ".bias", o + ".bias", {weight[0]});
  }
  void conv3(const std::string& d, const std::string& o, int64_t out, int64_t in) { weight_bias(d, o, {out, in, 3, 3}); }

  // ResnetBlock2D (diffusers: norm1, conv1, time_emb_proj, norm2, conv2, conv_shortcut; SGM: in_layers.0,
  // in_layers.2, emb_layers.1, out_layers.0, out_layers.3, skip_connection).
  void resnet(const std::string& d, const std::string& o, int64_t cin, int64_t cout) {
    weight_bias(d + "norm1", o + "in_layers.0", {cin});
    conv3(d + "conv1", o + "in_layers.2", cout, cin);
    weight_bias(d + "time_emb_proj", o + "emb_layers.1", {cout, c_.time_embed_dim()});
    weight_bias(d + "norm2", o + "out_layers.0", {cout});
    conv3(d + "conv2", o + "out_layers.3", cout, cout);
    if (cin != cout) weight_bias(d + "conv_shortcut", o + "skip_connection", {cout, cin, 1, 1});
  }

  // Transformer2DModel over ch channels with depth BasicTransformerBlocks (same names in both layouts).
  void transformer(const std::string& d, const std::string& o, int64_t ch, int64_t depth) {
    const Dims proj = c_.use_linear_projection ? Dims{ch, ch} : Dims{ch, ch, 1, 1};
    weight_bias(d + "norm", o + "norm", {ch});
    weight_bias(d + "proj_in", o + "proj_in", proj);
    for (int64_t k = 0; k < depth; ++k) {
      const std::string b = "transformer_blocks." + std::to_string(k) + ".";
      auto both = [&](const std::string& rest, Dims shape) { param(d + b + rest, o + b + rest, std::move(shape)); };
      both("norm1.weight", {ch});
      both("norm1.bias", {ch});
      both("attn1.to_q.weight", {ch, ch});
      both("attn1.to_k.weight", {ch, ch});
      both("attn1.to_v.weight", {ch, ch});
      both("attn1.to_out.0.weight", {ch, ch});
      both("attn1.to_out.0.bias", {ch});
      both("norm2.weight", {ch});
      both("norm2.bias", {ch});
      both("attn2.to_q.weight", {ch, ch});
      both("attn2.to_k.weight", {ch, c_.cross_attention_dim});
      both("attn2.to_v.weight", {ch, c_.cross_attention_dim});
      both("attn2.to_out.0.weight", {ch, ch});
      both("attn2.to_out.0.bias", {ch});
      both("norm3.weight", {ch});
      both("norm3.bias", {ch});
      both("ff.net.0.proj.weight", {8 * ch, ch});  // GEGLU: two halves of 4 * ch
      both("ff.net.0.proj.bias", {8 * ch});
      both("ff.net.2.weight", {ch, 4 * ch});
      both("ff.net.2.bias", {ch});
    }
    weight_bias(d + "proj_out", o + "proj_out", proj);
  }

  std::vector<UNetParameter> build() {
    const Dims& ch = c_.block_out_channels;
    const int64_t n = static_cast<int64_t>(ch.size()), L = c_.layers_per_block, T = c_.time_embed_dim();
    conv3("conv_in", "input_blocks.0.0", ch[0], c_.in_channels);
    weight_bias("time_embedding.linear_1", "time_embed.0", {T, ch[0]});
    weight_bias("time_embedding.linear_2", "time_embed.2", {T, T});
    if (c_.projection_class_embeddings_input_dim > 0) {
      weight_bias("add_embedding.linear_1", "label_emb.0.0", {T, c_.projection_class_embeddings_input_dim});
      weight_bias("add_embedding.linear_2", "label_emb.0.2", {T, T});
    }
    // Down blocks: attentions, resnets, downsampler; SGM input_blocks.<1 + b (L + 1) + l>.
    for (int64_t b = 0; b < n; ++b) {
      const std::string d = "down_blocks." + std::to_string(b) + ".";
      const int64_t in = b == 0 ? ch[0] : ch[b - 1], out = ch[b];
      auto sgm = [&](int64_t l, int j) {
        return "input_blocks." + std::to_string(1 + b * (L + 1) + l) + "." + std::to_string(j) + ".";
      };
      if (c_.down_block_has_attention.at(b))
        for (int64_t l = 0; l < L; ++l)
          transformer(d + "attentions." + std::to_string(l) + ".", sgm(l, 1), out, c_.transformer_layers_per_block.at(b));
      for (int64_t l = 0; l < L; ++l) resnet(d + "resnets." + std::to_string(l) + ".", sgm(l, 0), l == 0 ? in : out, out);
      if (b < n - 1) conv3(d + "downsamplers.0.conv", sgm(L, 0) + "op", out, out);
    }
    // Up blocks (registered before the mid block): attentions, resnets, upsampler; SGM
    // output_blocks.<u (L + 1) + l>. Each resnet also takes the skip connection of the down path.
    for (int64_t u = 0; u < n; ++u) {
      const std::string d = "up_blocks." + std::to_string(u) + ".";
      const int64_t rb = n - 1 - u;  // the down block this one mirrors
      const int64_t out = ch[rb], prev = u == 0 ? ch[n - 1] : ch[rb + 1], skip_last = ch[std::max<int64_t>(rb - 1, 0)];
      const bool attention = c_.down_block_has_attention.at(rb);
      auto sgm = [&](int64_t l, int j) {
        return "output_blocks." + std::to_string(u * (L + 1) + l) + "." + std::to_string(j) + ".";
      };
      if (attention)
        for (int64_t l = 0; l <= L; ++l)
          transformer(d + "attentions." + std::to_string(l) + ".", sgm(l, 1), out, c_.transformer_layers_per_block.at(rb));
      for (int64_t l = 0; l <= L; ++l) {
        const int64_t res_in = l == 0 ? prev : out, skip = l == L ? skip_last : out;
        resnet(d + "resnets." + std::to_string(l) + ".", sgm(l, 0), res_in + skip, out);
      }
      if (u < n - 1) conv3(d + "upsamplers.0.conv", sgm(L, attention ? 2 : 1) + "conv", out, out);
    }
    // Mid block: attention, then its two resnets; SGM middle_block.0 (resnet), .1 (attention), .2 (resnet).
    const int64_t mid = ch[n - 1];
    if (c_.mid_block_has_attention)
      transformer("mid_block.attentions.0.", "middle_block.1.", mid, c_.transformer_layers_per_block.back());
    resnet("mid_block.resnets.0.", "middle_block.0.", mid, mid);
    resnet("mid_block.resnets.1.", c_.mid_block_has_attention ? "middle_block.2." : "middle_block.1.", mid, mid);
    weight_bias("conv_norm_out", "out.0", {ch[0]});
    conv3("conv_out", "out.2", c_.out_channels, ch[0]);
    return out_;
  }

 private:
  const UNetConfig& c_;
  std::vector<UNetParameter> out_;
};

using KeyMap = std::map<std::string, const KeyShape*>;

const KeyShape* find(const KeyMap& keys, const std::string& name) {
  auto it = keys.find(name);
  return it == keys.end() ? nullptr : it->second;
}

const KeyShape& need(const KeyMap& keys, const std::string& name, size_t rank) {
  const KeyShape* k = find(keys, name);
  FLAME_CHECK(k, FLAME_ERROR_INVALID_FORMAT, "not a complete UNet checkpoint: no tensor ", name);
  FLAME_CHECK(k->shape.size() == rank, FLAME_ERROR_INVALID_FORMAT, "UNet tensor ", name, " has ", k->shape.size(),
              " dimensions, expected ", rank);
  return *k;
}

// The distinct values of the integer field right after `head` in the keys that start with it.
std::set<int64_t> indices_after(const std::vector<KeyShape>& keys, const std::string& head) {
  std::set<int64_t> out;
  for (const KeyShape& k : keys) {
    if (k.name.compare(0, head.size(), head) != 0) continue;
    const size_t end = k.name.find('.', head.size());
    const std::string idx = k.name.substr(head.size(), end == std::string::npos ? std::string::npos : end - head.size());
    FLAME_CHECK(!idx.empty() && idx.size() <= 6 &&
                    std::all_of(idx.begin(), idx.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; }),
                FLAME_ERROR_INVALID_FORMAT, "UNet tensor ", k.name, " has no index after ", head);
    out.insert(std::stoll(idx));
  }
  return out;
}

// The count of consecutive indices 0..n-1 after head (an index missing in between is an error).
int64_t count_indices(const std::vector<KeyShape>& keys, const std::string& head) {
  const std::set<int64_t> idx = indices_after(keys, head);
  if (idx.empty()) return 0;
  const int64_t n = *idx.rbegin() + 1;
  FLAME_CHECK(static_cast<int64_t>(idx.size()) == n, FLAME_ERROR_INVALID_FORMAT, "UNet checkpoint has ", head, n - 1,
              " but not every index below it");
  return n;
}

bool has(const std::vector<KeyShape>& keys, const std::string& name) {
  return std::any_of(keys.begin(), keys.end(), [&](const KeyShape& k) { return k.name == name; });
}

bool has_prefix(const std::vector<KeyShape>& keys, const std::string& head) {
  return std::any_of(keys.begin(), keys.end(), [&](const KeyShape& k) { return k.name.compare(0, head.size(), head) == 0; });
}

UNetConfig config_from_sgm(const std::vector<KeyShape>& keys, const KeyMap& km, const std::string& p) {
  UNetConfig c;
  const KeyShape& conv_in = need(km, p + "input_blocks.0.0.weight", 4);
  c.in_channels = conv_in.shape[1];
  c.out_channels = need(km, p + "out.2.weight", 4).shape[0];
  const int64_t inputs = count_indices(keys, p + "input_blocks.");
  int64_t downsamplers = 0;
  for (int64_t i = 1; i < inputs; ++i)
    if (find(km, p + "input_blocks." + std::to_string(i) + ".0.op.weight")) ++downsamplers;
  const int64_t n = downsamplers + 1;
  FLAME_CHECK(inputs % n == 0 && inputs / n >= 2, FLAME_ERROR_INVALID_FORMAT, "UNet checkpoint: ", inputs,
              " input blocks do not split into ", n, " down blocks of equal length");
  c.layers_per_block = inputs / n - 1;
  c.block_out_channels.clear();
  c.down_block_has_attention.clear();
  c.transformer_layers_per_block.clear();
  for (int64_t b = 0; b < n; ++b) {
    const std::string first = p + "input_blocks." + std::to_string(1 + b * (c.layers_per_block + 1)) + ".";
    c.block_out_channels.push_back(need(km, first + "0.out_layers.3.weight", 4).shape[0]);
    const bool attention = find(km, first + "1.norm.weight") != nullptr;
    c.down_block_has_attention.push_back(attention);
    c.transformer_layers_per_block.push_back(attention ? count_indices(keys, first + "1.transformer_blocks.") : 1);
  }
  c.mid_block_has_attention = find(km, p + "middle_block.1.norm.weight") != nullptr;
  const KeyShape* label = find(km, p + "label_emb.0.0.weight");
  c.projection_class_embeddings_input_dim = label ? label->shape.at(1) : 0;
  return c;
}

UNetConfig config_from_diffusers(const std::vector<KeyShape>& keys, const KeyMap& km, const std::string& p) {
  UNetConfig c;
  c.in_channels = need(km, p + "conv_in.weight", 4).shape[1];
  c.out_channels = need(km, p + "conv_out.weight", 4).shape[0];
  const int64_t n = count_indices(keys, p + "down_blocks.");
  FLAME_CHECK(n >= 1, FLAME_ERROR_INVALID_FORMAT, "UNet checkpoint has no down_blocks");
  c.layers_per_block = count_indices(keys, p + "down_blocks.0.resnets.");
  c.block_out_channels.clear();
  c.down_block_has_attention.clear();
  c.transformer_layers_per_block.clear();
  for (int64_t b = 0; b < n; ++b) {
    const std::string d = p + "down_blocks." + std::to_string(b) + ".";
    c.block_out_channels.push_back(need(km, d + "resnets.0.conv2.weight", 4).shape[0]);
    const bool attention = has_prefix(keys, d + "attentions.");
    c.down_block_has_attention.push_back(attention);
    c.transformer_layers_per_block.push_back(attention ? count_indices(keys, d + "attentions.0.transformer_blocks.") : 1);
  }
  c.mid_block_has_attention = has_prefix(keys, p + "mid_block.attentions.");
  const KeyShape* add = find(km, p + "add_embedding.linear_1.weight");
  c.projection_class_embeddings_input_dim = add ? add->shape.at(1) : 0;
  return c;
}

// The cross-attention width and projection kind from the first attention's tensors.
void attention_widths(const std::vector<KeyShape>& keys, const std::string& attention_head, UNetConfig* c) {
  for (const KeyShape& k : keys) {
    if (k.name.compare(0, attention_head.size(), attention_head) != 0) continue;
    const std::string tail = ".transformer_blocks.0.attn2.to_k.weight";
    if (k.name.size() > tail.size() && k.name.compare(k.name.size() - tail.size(), tail.size(), tail) == 0) {
      FLAME_CHECK(k.shape.size() == 2, FLAME_ERROR_INVALID_FORMAT, "UNet tensor ", k.name, " is not a matrix");
      c->cross_attention_dim = k.shape[1];
      const std::string proj = k.name.substr(0, k.name.size() - tail.size()) + ".proj_in.weight";
      for (const KeyShape& q : keys)
        if (q.name == proj) c->use_linear_projection = q.shape.size() == 2;
      return;
    }
  }
}

}  // namespace

UNetConfig sd15_unet_config() {
  UNetConfig c;
  c.block_out_channels = {320, 640, 1280, 1280};
  c.down_block_has_attention = {true, true, true, false};
  c.transformer_layers_per_block = {1, 1, 1, 1};
  c.cross_attention_dim = 768;
  c.use_linear_projection = false;
  c.projection_class_embeddings_input_dim = 0;
  return c;
}

std::vector<UNetParameter> unet_parameters(const UNetConfig& cfg) {
  const size_t n = cfg.block_out_channels.size();
  FLAME_CHECK(n >= 1 && cfg.down_block_has_attention.size() == n && cfg.transformer_layers_per_block.size() == n &&
                  cfg.layers_per_block >= 1,
              FLAME_ERROR_INVALID_ARGUMENT, "UNet configuration: ", n, " block widths, ", cfg.down_block_has_attention.size(),
              " block kinds and ", cfg.transformer_layers_per_block.size(), " transformer depths must agree (and at least one layer per block)");
  return UNetBuilder(cfg).build();
}

MappedTable unet_parameter_table(const UNetConfig& cfg) {
  MappedTableBuilder b;
  for (const UNetParameter& p : unet_parameters(cfg)) b.same(p.diffusers_name, p.original_name, p.shape);
  return b.take();
}

bool is_unet_checkpoint(const std::vector<KeyShape>& keys) {
  for (const char* p : {kSgmPrefix, ""}) {
    const std::string pre(p);
    if (has(keys, pre + "input_blocks.0.0.weight") && has(keys, pre + "out.2.weight")) return true;
    if (has(keys, pre + "conv_in.weight") && has_prefix(keys, pre + "down_blocks.0.resnets.")) return true;
  }
  return false;
}

UNetCheckpoint detect_unet_checkpoint(const std::vector<KeyShape>& keys) {
  UNetCheckpoint ck;
  bool found = false;
  for (const char* p : {kSgmPrefix, ""}) {
    const std::string pre(p);
    if (has(keys, pre + "input_blocks.0.0.weight") && has(keys, pre + "out.2.weight")) {
      ck = {UNetLayout::Original, pre, {}};
      found = true;
      break;
    }
    if (has(keys, pre + "conv_in.weight") && has_prefix(keys, pre + "down_blocks.0.resnets.")) {
      ck = {UNetLayout::Diffusers, pre, {}};
      found = true;
      break;
    }
  }
  FLAME_CHECK(found, FLAME_ERROR_INVALID_FORMAT,
              "not a UNet checkpoint: neither input_blocks.0.0.weight with out.2.weight (Stability's layout, usually "
              "under ", kSgmPrefix, ") nor conv_in.weight with down_blocks (diffusers' layout)");
  KeyMap km;
  for (const KeyShape& k : keys) km[k.name] = &k;
  const bool sgm = ck.layout == UNetLayout::Original;
  ck.config = sgm ? config_from_sgm(keys, km, ck.prefix) : config_from_diffusers(keys, km, ck.prefix);
  attention_widths(keys, ck.prefix, &ck.config);
  // Every tensor of the implied configuration, with its shape.
  for (const UNetParameter& u : unet_parameters(ck.config)) {
    const std::string name = ck.prefix + (sgm ? u.original_name : u.diffusers_name);
    const KeyShape* k = find(km, name);
    FLAME_CHECK(k, FLAME_ERROR_INVALID_FORMAT, "UNet checkpoint lacks ", name, " (its other tensors describe a UNet of ",
                ck.config.block_out_channels.size(), " blocks of ", ck.config.layers_per_block, " layers that has it)");
    FLAME_CHECK(k->shape == u.shape, FLAME_ERROR_INVALID_FORMAT, "UNet tensor ", name, " has shape ", shape_str(k->shape),
                ", expected ", shape_str(u.shape));
  }
  return ck;
}

}  // namespace flame::models
