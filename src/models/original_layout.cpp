// The original-layout save plan (see original_layout.h): the layout's prefix and naming, the family's
// configuration read back from the model's own parameter list by the same detection the loader uses
// (so that a layout the loader could not read back is refused here), and the key table turned
// around: stored tensor -> pieces.
#include "models/original_layout.h"
#include <algorithm>
#include <map>
#include "core/error.h"
#include "core/shape.h"
#include "models/architecture.h"
#include "models/clip_keys.h"
#include "models/sd3_keys.h"
#include "models/t5_keys.h"
#include "models/unet_keys.h"
#include "models/vae_keys.h"

namespace flame::models {

namespace {

// Where a layout puts a class's tensors: the prefix, and whether they carry the key table's original
// names (else the parameters' own names).
struct LayoutRule {
  Architecture architecture;
  const char* layout;
  const char* prefix;
  bool original_names;
};

// The first rule of each class is its "original".
const LayoutRule kRules[] = {
    {Architecture::FluxTransformer, "bfl", "", true},
    {Architecture::FluxTransformer, "comfyui", "model.diffusion_model.", true},
    {Architecture::UNet2DCondition, "sgm", "model.diffusion_model.", true},
    {Architecture::UNet2DCondition, "ldm", "model.diffusion_model.", true},
    {Architecture::SD3Transformer, "sd3", "model.diffusion_model.", true},
    {Architecture::AutoencoderKL, "sgm", "first_stage_model.", true},
    {Architecture::AutoencoderKL, "ldm", "first_stage_model.", true},
    {Architecture::AutoencoderKL, "bfl", "", true},
    {Architecture::CLIPText, "sgm", "conditioner.embedders.0.transformer.", false},
    {Architecture::CLIPText, "sd3", "text_encoders.clip_l.transformer.", false},
    {Architecture::CLIPTextWithProjection, "sgm", "conditioner.embedders.1.model.", true},
    {Architecture::CLIPTextWithProjection, "sd3", nullptr, false},  // prefix by width (clip_l / clip_g)
    {Architecture::T5Encoder, "sd3", "text_encoders.t5xxl.transformer.", false},
    {Architecture::T5Encoder, "comfyui", "", false},
};

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

const LayoutRule& rule_for(Architecture a, const std::string& class_name, const std::string& layout) {
  for (const LayoutRule& r : kRules)
    if (r.architecture == a && (layout == "original" || layout == r.layout)) return r;
  fail(FLAME_ERROR_INVALID_ARGUMENT, "layout \"", layout, "\" is not one ", class_name, " is saved in; ",
       class_name, " takes \"diffusers\", ", joined(original_layouts(class_name)));
}

// The family's key table for the configuration detection reads from the parameters' own names.
MappedTable table_of(Architecture a, const std::vector<KeyShape>& params) {
  switch (a) {
    case Architecture::FluxTransformer:
      return flux_parameter_table(detect_flux_checkpoint(params).config);
    case Architecture::UNet2DCondition:
      return unet_parameter_table(detect_unet_checkpoint(params).config);
    case Architecture::SD3Transformer:
      return sd3_parameter_table(detect_sd3_checkpoint(params).config);
    case Architecture::AutoencoderKL:
      return vae_parameter_table(detect_vae_checkpoint(params).config);
    case Architecture::CLIPText:
    case Architecture::CLIPTextWithProjection:
      return clip_parameter_table(detect_clip_checkpoint_at(params, "").config);
    case Architecture::T5Encoder:
      return t5_parameter_table(detect_t5_checkpoint(params).config);
  }
  fail(FLAME_ERROR_INTERNAL, "no key table for architecture ", static_cast<int>(a));
}

// The table must describe exactly the model's parameters (names and shapes).
void expect_table_matches(const MappedTable& table, const std::vector<KeyShape>& params, const std::string& class_name) {
  std::map<std::string, const std::vector<int64_t>*> want;
  for (const KeyShape& p : params) want[p.name] = &p.shape;
  FLAME_CHECK(want.size() == table.parameters.size(), FLAME_ERROR_INTERNAL, class_name, ": the key table has ",
              table.parameters.size(), " parameters, the model ", want.size());
  for (const MappedParameter& p : table.parameters) {
    auto it = want.find(p.diffusers_name);
    FLAME_CHECK(it != want.end(), FLAME_ERROR_INTERNAL, class_name, ": the key table's parameter ", p.diffusers_name,
                " is not the model's");
    FLAME_CHECK(*it->second == p.shape, FLAME_ERROR_INTERNAL, class_name, ": parameter ", p.diffusers_name, " is ",
                shape_str(*it->second), ", the key table says ", shape_str(p.shape));
  }
}

std::vector<OriginalTensor> under_own_names(const std::vector<KeyShape>& params, const std::string& prefix) {
  std::vector<OriginalTensor> out;
  for (const KeyShape& p : params) {
    OriginalPiece whole{p.name, p.shape, 0, p.shape.empty() ? 1 : p.shape[0], false, false};
    out.push_back({prefix + p.name, p.shape, {whole}});
  }
  return out;
}

// The table read backwards: each stored tensor with the pieces tiling its rows.
std::vector<OriginalTensor> under_original_names(const MappedTable& table, const std::string& prefix) {
  std::map<std::string, std::vector<OriginalPiece>> pieces;
  for (const MappedParameter& p : table.parameters)
    pieces[p.original_name].push_back({p.diffusers_name, p.shape, p.row_begin, p.rows, p.swap_halves, p.transposed});
  std::vector<OriginalTensor> out;
  for (const KeyShape& stored : table.original) {
    std::vector<OriginalPiece>& ps = pieces[stored.name];
    std::sort(ps.begin(), ps.end(), [](const OriginalPiece& a, const OriginalPiece& b) { return a.row_begin < b.row_begin; });
    const int64_t total = stored.shape.empty() ? 1 : stored.shape[0];
    int64_t next = 0;
    for (const OriginalPiece& p : ps) {
      FLAME_CHECK(p.row_begin == next && p.rows > 0, FLAME_ERROR_INTERNAL, "key table: ", stored.name, " row ", next,
                  " is not covered exactly once (", p.parameter, " starts at ", p.row_begin, ")");
      next += p.rows;
    }
    FLAME_CHECK(next == total, FLAME_ERROR_INTERNAL, "key table: the pieces of ", stored.name, " cover ", next, " of ",
                total, " rows");
    out.push_back({prefix + stored.name, stored.shape, std::move(ps)});
  }
  return out;
}

// The SD3 single files' CLIP prefix for a CLIPTextModelWithProjection of this width.
std::string sd3_clip_prefix(const std::vector<KeyShape>& params) {
  const KeyShape* tokens = nullptr;
  for (const KeyShape& p : params)
    if (p.name == "text_model.embeddings.token_embedding.weight") tokens = &p;
  const int64_t width = tokens && tokens->shape.size() == 2 ? tokens->shape[1] : 0;
  if (width == 768) return "text_encoders.clip_l.transformer.";
  if (width == 1280) return "text_encoders.clip_g.transformer.";
  fail(FLAME_ERROR_INVALID_ARGUMENT, "layout \"sd3\" of CLIPTextModelWithProjection: width ", width,
       " is neither CLIP-L's 768 (text_encoders.clip_l) nor bigG's 1280 (text_encoders.clip_g)");
}

}  // namespace

std::vector<std::string> original_layouts(const std::string& class_name) {
  std::vector<std::string> out;
  const std::optional<Architecture> a = architecture_from_class_name(class_name);
  if (!a) return out;
  out.push_back("original");
  for (const LayoutRule& r : kRules)
    if (r.architecture == *a) out.push_back(r.layout);
  return out;
}

OriginalSavePlan plan_original_save(const std::string& class_name, const std::vector<KeyShape>& parameters,
                                    const std::string& layout) {
  const std::optional<Architecture> a = architecture_from_class_name(class_name);
  FLAME_CHECK(a, FLAME_ERROR_INVALID_ARGUMENT, "layout \"", layout, "\": class ", class_name,
              " has no original single-file layout (only \"diffusers\")");
  const LayoutRule& rule = rule_for(*a, class_name, layout);
  MappedTable table;
  std::string prefix = rule.prefix ? rule.prefix : std::string();
  try {
    table = table_of(*a, parameters);
    if (!rule.prefix) prefix = sd3_clip_prefix(parameters);
  } catch (const Error& e) {
    if (e.status() == FLAME_ERROR_INTERNAL) throw;
    fail(FLAME_ERROR_INVALID_ARGUMENT, "layout \"", rule.layout, "\" cannot hold this ", class_name,
         " (the loader would not read it back): ", e.what());
  }
  expect_table_matches(table, parameters, class_name);
  OriginalSavePlan plan;
  plan.layout = rule.layout;
  plan.tensors = rule.original_names ? under_original_names(table, prefix) : under_own_names(parameters, prefix);
  return plan;
}

}  // namespace flame::models
