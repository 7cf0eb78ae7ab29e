// Flux checkpoint keys: layout detection, configuration from shapes, and the BFL <-> diffusers
// parameter table (see flux_keys.h). One builder emits the original tensors and the diffusers
// parameters that live in them side by side, so the two lists cannot disagree.
#include "models/flux_keys.h"
#include <algorithm>
#include <cctype>
#include <iterator>
#include <map>
#include <tuple>
#include "core/error.h"
#include "core/shape.h"
#include "models/mapped_keys.h"

namespace flame::models {

namespace {

const char* const kComfyPrefix = "model.diffusion_model.";

// Builds the original tensors and the diffusers parameters as rows of them.
class FluxTableBuilder {
 public:
  // An original tensor of shape [rows, cols...].
  void original(const std::string& name, std::vector<int64_t> shape) {
    originals_.push_back({name, std::move(shape)});
  }
  // Diffusers parameter dname = rows [begin, begin + rows) of the original tensor oname.
  void part(const std::string& dname, const std::string& oname, int64_t begin, int64_t rows, bool swap = false) {
    params_.push_back({dname, oname, begin, rows, swap});
  }
  // A Linear stored whole: original weight [out, in] and bias [out], diffusers dname.weight / .bias.
  void linear(const std::string& dname, const std::string& oname, int64_t out, int64_t in) {
    original(oname + ".weight", {out, in});
    original(oname + ".bias", {out});
    part(dname + ".weight", oname + ".weight", 0, out);
    part(dname + ".bias", oname + ".bias", 0, out);
  }
  // A fused Linear [sum(outs), in] whose row blocks are the diffusers Linears dnames.
  void fused_linear(const std::vector<std::string>& dnames, const std::string& oname, const std::vector<int64_t>& outs,
                    int64_t in) {
    int64_t total = 0;
    for (int64_t o : outs) total += o;
    original(oname + ".weight", {total, in});
    original(oname + ".bias", {total});
    int64_t at = 0;
    for (size_t i = 0; i < dnames.size(); ++i) {
      part(dnames[i] + ".weight", oname + ".weight", at, outs[i]);
      part(dnames[i] + ".bias", oname + ".bias", at, outs[i]);
      at += outs[i];
    }
  }
  // An RMSNorm scale [n] (BFL `.scale`, diffusers `.weight`).
  void norm_scale(const std::string& dname, const std::string& oname, int64_t n) {
    original(oname, {n});
    part(dname, oname, 0, n);
  }

  std::vector<KeyShape> originals_;
  std::vector<FluxParameter> params_;
};

FluxTableBuilder build_flux_table(const FluxConfig& c) {
  const int64_t d = c.inner_dim(), hd = c.attention_head_dim, mlp = c.mlp_hidden_dim;
  FluxTableBuilder b;
  // Embedders (BFL order: img_in, time_in, vector_in, guidance_in, txt_in).
  b.linear("x_embedder", "img_in", d, c.in_channels);
  b.linear("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer", d, 256);
  b.linear("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer", d, d);
  b.linear("time_text_embed.text_embedder.linear_1", "vector_in.in_layer", d, c.pooled_projection_dim);
  b.linear("time_text_embed.text_embedder.linear_2", "vector_in.out_layer", d, d);
  if (c.guidance_embeds) {
    b.linear("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer", d, 256);
    b.linear("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer", d, d);
  }
  b.linear("context_embedder", "txt_in", d, c.joint_attention_dim);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string o = "double_blocks." + std::to_string(i) + ".";
    const std::string t = "transformer_blocks." + std::to_string(i) + ".";
    // The image stream, then the text stream, each: modulation, attention (qkv, qk norms, out), MLP.
    b.linear(t + "norm1.linear", o + "img_mod.lin", 6 * d, d);
    b.fused_linear({t + "attn.to_q", t + "attn.to_k", t + "attn.to_v"}, o + "img_attn.qkv", {d, d, d}, d);
    b.norm_scale(t + "attn.norm_q.weight", o + "img_attn.norm.query_norm.scale", hd);
    b.norm_scale(t + "attn.norm_k.weight", o + "img_attn.norm.key_norm.scale", hd);
    b.linear(t + "attn.to_out.0", o + "img_attn.proj", d, d);
    b.linear(t + "ff.net.0.proj", o + "img_mlp.0", mlp, d);
    b.linear(t + "ff.net.2", o + "img_mlp.2", d, mlp);
    b.linear(t + "norm1_context.linear", o + "txt_mod.lin", 6 * d, d);
    b.fused_linear({t + "attn.add_q_proj", t + "attn.add_k_proj", t + "attn.add_v_proj"}, o + "txt_attn.qkv",
                   {d, d, d}, d);
    b.norm_scale(t + "attn.norm_added_q.weight", o + "txt_attn.norm.query_norm.scale", hd);
    b.norm_scale(t + "attn.norm_added_k.weight", o + "txt_attn.norm.key_norm.scale", hd);
    b.linear(t + "attn.to_add_out", o + "txt_attn.proj", d, d);
    b.linear(t + "ff_context.net.0.proj", o + "txt_mlp.0", mlp, d);
    b.linear(t + "ff_context.net.2", o + "txt_mlp.2", d, mlp);
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string o = "single_blocks." + std::to_string(i) + ".";
    const std::string t = "single_transformer_blocks." + std::to_string(i) + ".";
    b.fused_linear({t + "attn.to_q", t + "attn.to_k", t + "attn.to_v", t + "proj_mlp"}, o + "linear1",
                   {d, d, d, mlp}, d);
    b.linear(t + "proj_out", o + "linear2", d, d + mlp);
    b.norm_scale(t + "attn.norm_q.weight", o + "norm.query_norm.scale", hd);
    b.norm_scale(t + "attn.norm_k.weight", o + "norm.key_norm.scale", hd);
    b.linear(t + "norm.linear", o + "modulation.lin", 3 * d, d);
  }
  b.linear("proj_out", "final_layer.linear", c.out_channels, d);
  // BFL's final modulation is [shift; scale], diffusers' AdaLayerNormContinuous [scale; shift].
  b.original("final_layer.adaLN_modulation.1.weight", {2 * d, d});
  b.original("final_layer.adaLN_modulation.1.bias", {2 * d});
  b.part("norm_out.linear.weight", "final_layer.adaLN_modulation.1.weight", 0, 2 * d, true);
  b.part("norm_out.linear.bias", "final_layer.adaLN_modulation.1.bias", 0, 2 * d, true);
  return b;
}

// Rank of a diffusers parameter in FluxTransformer2DModel's registration order: time_text_embed,
// context_embedder, x_embedder, transformer_blocks, single_transformer_blocks, norm_out, proj_out;
// inside a block the order of its submodules (diffusers' transformer_flux.py).
std::vector<FluxParameter> in_diffusers_order(std::vector<FluxParameter> params) {
  static const char* const kTop[] = {"time_text_embed.timestep_embedder.", "time_text_embed.guidance_embedder.",
                                     "time_text_embed.text_embedder.", "context_embedder.", "x_embedder.",
                                     "transformer_blocks.", "single_transformer_blocks.", "norm_out.", "proj_out."};
  static const char* const kDouble[] = {"norm1.", "norm1_context.", "attn.norm_q.", "attn.norm_k.", "attn.to_q.",
                                        "attn.to_k.", "attn.to_v.", "attn.to_out.0.", "attn.norm_added_q.",
                                        "attn.norm_added_k.", "attn.add_q_proj.", "attn.add_k_proj.",
                                        "attn.add_v_proj.", "attn.to_add_out.", "ff.", "ff_context."};
  static const char* const kSingle[] = {"norm.", "proj_mlp.", "proj_out.", "attn.norm_q.", "attn.norm_k.",
                                        "attn.to_q.", "attn.to_k.", "attn.to_v."};
  auto rank_in = [](const std::string& s, const char* const* list, size_t n) -> size_t {
    for (size_t i = 0; i < n; ++i)
      if (s.compare(0, std::char_traits<char>::length(list[i]), list[i]) == 0) return i;
    return n;
  };
  auto key = [&](const FluxParameter& p) {
    const std::string& n = p.diffusers_name;
    const size_t top = rank_in(n, kTop, std::size(kTop));
    int64_t block = 0;
    size_t inner = 0;
    if (top == 5 || top == 6) {
      const size_t dot = n.find('.');
      const size_t dot2 = n.find('.', dot + 1);
      block = std::stoll(n.substr(dot + 1, dot2 - dot - 1));
      const std::string rest = n.substr(dot2 + 1);
      inner = top == 5 ? rank_in(rest, kDouble, std::size(kDouble)) : rank_in(rest, kSingle, std::size(kSingle));
    }
    return std::make_tuple(top, block, inner);  // stable: within a submodule, the builder's order
  };
  std::stable_sort(params.begin(), params.end(),
                   [&](const FluxParameter& a, const FluxParameter& b) { return key(a) < key(b); });
  return params;
}

const KeyShape* find_key(const std::map<std::string, const KeyShape*>& by_name, const std::string& prefix,
                         const std::string& name) {
  auto it = by_name.find(prefix + name);
  return it == by_name.end() ? nullptr : it->second;
}

const KeyShape& need_key(const std::map<std::string, const KeyShape*>& by_name, const std::string& prefix,
                         const std::string& name, size_t rank) {
  const KeyShape* k = find_key(by_name, prefix, name);
  FLAME_CHECK(k, FLAME_ERROR_INVALID_FORMAT, "not a complete Flux checkpoint: no tensor ", prefix + name);
  FLAME_CHECK(k->shape.size() == rank, FLAME_ERROR_INVALID_FORMAT, "Flux tensor ", prefix + name, " has ",
              k->shape.size(), " dimensions, expected ", rank);
  return *k;
}

// The number of blocks "<prefix><group>.<i>." present (highest index + 1), checking there are no gaps.
int64_t count_blocks(const std::vector<KeyShape>& keys, const std::string& prefix, const std::string& group) {
  const std::string head = prefix + group + ".";
  std::vector<bool> seen;
  for (const KeyShape& k : keys) {
    if (k.name.compare(0, head.size(), head) != 0) continue;
    const size_t end = k.name.find('.', head.size());
    const std::string idx = k.name.substr(head.size(), end == std::string::npos ? std::string::npos : end - head.size());
    FLAME_CHECK(!idx.empty() && idx.size() <= 6 && std::all_of(idx.begin(), idx.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; }),
                FLAME_ERROR_INVALID_FORMAT, "Flux tensor ", k.name, " has no block index after ", head);
    const size_t i = std::stoul(idx);
    if (seen.size() <= i) seen.resize(i + 1, false);
    seen[i] = true;
  }
  for (size_t i = 0; i < seen.size(); ++i)
    FLAME_CHECK(seen[i], FLAME_ERROR_INVALID_FORMAT, "Flux checkpoint has ", head, seen.size() - 1,
                " but no tensor of ", head, i);
  return static_cast<int64_t>(seen.size());
}

bool has_key(const std::vector<KeyShape>& keys, const std::string& name) {
  return std::any_of(keys.begin(), keys.end(), [&](const KeyShape& k) { return k.name == name; });
}

}  // namespace

bool is_flux_checkpoint(const std::vector<KeyShape>& keys) {
  for (const char* p : {"", kComfyPrefix}) {
    const std::string pre(p);
    if (has_key(keys, pre + "double_blocks.0.img_attn.norm.key_norm.scale")) return true;
    if (has_key(keys, pre + "transformer_blocks.0.attn.norm_added_k.weight") &&
        has_key(keys, pre + "single_transformer_blocks.0.proj_mlp.weight"))
      return true;
  }
  return false;
}

FluxCheckpoint detect_flux_checkpoint(const std::vector<KeyShape>& keys) {
  FluxCheckpoint ck;
  bool found = false;
  for (const char* p : {"", kComfyPrefix}) {
    const std::string pre(p);
    if (has_key(keys, pre + "double_blocks.0.img_attn.norm.key_norm.scale")) {
      ck.layout = FluxLayout::Original;
      ck.prefix = pre;
      found = true;
      break;
    }
    if (has_key(keys, pre + "transformer_blocks.0.attn.norm_added_k.weight")) {
      ck.layout = FluxLayout::Diffusers;
      ck.prefix = pre;
      found = true;
      break;
    }
  }
  FLAME_CHECK(found, FLAME_ERROR_INVALID_FORMAT,
              "not a Flux checkpoint: neither double_blocks.0.img_attn.norm.key_norm.scale (Black Forest Labs' layout) "
              "nor transformer_blocks.0.attn.norm_added_k.weight (diffusers' layout), with or without the prefix ",
              kComfyPrefix);
  std::map<std::string, const KeyShape*> by_name;
  for (const KeyShape& k : keys) by_name[k.name] = &k;
  FluxConfig& c = ck.config;
  const std::string& pre = ck.prefix;
  const bool bfl = ck.layout == FluxLayout::Original;
  const KeyShape& x_in = need_key(by_name, pre, bfl ? "img_in.weight" : "x_embedder.weight", 2);
  const KeyShape& txt = need_key(by_name, pre, bfl ? "txt_in.weight" : "context_embedder.weight", 2);
  const KeyShape& vec =
      need_key(by_name, pre, bfl ? "vector_in.in_layer.weight" : "time_text_embed.text_embedder.linear_1.weight", 2);
  const KeyShape& qn = need_key(
      by_name, pre, bfl ? "double_blocks.0.img_attn.norm.query_norm.scale" : "transformer_blocks.0.attn.norm_q.weight", 1);
  const KeyShape& mlp_in = need_key(by_name, pre, bfl ? "double_blocks.0.img_mlp.0.weight" : "transformer_blocks.0.ff.net.0.proj.weight", 2);
  const KeyShape& out = need_key(by_name, pre, bfl ? "final_layer.linear.weight" : "proj_out.weight", 2);
  const int64_t inner = x_in.shape[0];
  c.in_channels = x_in.shape[1];
  c.joint_attention_dim = txt.shape[1];
  c.pooled_projection_dim = vec.shape[1];
  c.attention_head_dim = qn.shape[0];
  FLAME_CHECK(c.attention_head_dim > 0 && inner % c.attention_head_dim == 0, FLAME_ERROR_INVALID_FORMAT,
              "Flux checkpoint: the inner width ", inner, " (", pre, bfl ? "img_in" : "x_embedder",
              ".weight) is not a multiple of the head width ", c.attention_head_dim);
  c.num_attention_heads = inner / c.attention_head_dim;
  c.mlp_hidden_dim = mlp_in.shape[0];
  c.out_channels = out.shape[0];
  c.guidance_embeds = find_key(by_name, pre, bfl ? "guidance_in.in_layer.weight"
                                                 : "time_text_embed.guidance_embedder.linear_1.weight") != nullptr;
  c.num_layers = count_blocks(keys, pre, bfl ? "double_blocks" : "transformer_blocks");
  c.num_single_layers = count_blocks(keys, pre, bfl ? "single_blocks" : "single_transformer_blocks");
  FLAME_CHECK(txt.shape[0] == inner && vec.shape[0] == inner && out.shape[1] == inner, FLAME_ERROR_INVALID_FORMAT,
              "Flux checkpoint: the embedders and the output projection disagree about the inner width (",
              inner, ", ", txt.shape[0], ", ", vec.shape[0], ", ", out.shape[1], ")");
  // Every tensor of this configuration must be there with its shape (other keys are left alone: single
  // files may bundle other components under other prefixes).
  const std::vector<KeyShape> want = bfl ? flux_original_tensors(c) : flux_diffusers_tensors(c);
  for (const KeyShape& w : want) {
    const KeyShape* k = find_key(by_name, pre, w.name);
    FLAME_CHECK(k, FLAME_ERROR_INVALID_FORMAT, "Flux checkpoint lacks ", pre + w.name, " (a ",
                c.num_layers, "+", c.num_single_layers, "-block model of width ", inner, " has it)");
    FLAME_CHECK(k->shape == w.shape, FLAME_ERROR_INVALID_FORMAT, "Flux tensor ", pre + w.name, " has shape ",
                shape_str(k->shape), ", expected ", shape_str(w.shape));
  }
  return ck;
}

std::vector<FluxParameter> flux_parameter_map(const FluxConfig& cfg) {
  return in_diffusers_order(build_flux_table(cfg).params_);
}

std::vector<KeyShape> flux_original_tensors(const FluxConfig& cfg) { return build_flux_table(cfg).originals_; }

std::vector<KeyShape> flux_diffusers_tensors(const FluxConfig& cfg) {
  const FluxTableBuilder b = build_flux_table(cfg);
  std::map<std::string, const KeyShape*> originals;
  for (const KeyShape& k : b.originals_) originals[k.name] = &k;
  std::vector<KeyShape> out;
  for (const FluxParameter& p : in_diffusers_order(b.params_)) {
    std::vector<int64_t> shape = originals.at(p.original_name)->shape;
    shape[0] = p.rows;
    out.push_back({p.diffusers_name, std::move(shape)});
  }
  return out;
}

MappedTable flux_parameter_table(const FluxConfig& cfg) {
  const std::vector<KeyShape> shapes = flux_diffusers_tensors(cfg);
  const std::vector<FluxParameter> params = flux_parameter_map(cfg);
  MappedTable t;
  t.original = flux_original_tensors(cfg);
  for (size_t i = 0; i < params.size(); ++i) {
    const FluxParameter& p = params[i];
    FLAME_CHECK(shapes.at(i).name == p.diffusers_name, FLAME_ERROR_INTERNAL, "Flux key table: ", p.diffusers_name,
                " and ", shapes.at(i).name, " out of step");
    t.parameters.push_back({p.diffusers_name, shapes[i].shape, p.original_name, p.row_begin, p.rows, p.swap_halves, false});
  }
  return t;
}

}  // namespace flame::models
