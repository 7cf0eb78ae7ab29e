// LoRA files as kohya (sd-scripts), diffusers / peft, ComfyUI and A1111 write and read them: pure key
// plans, no tensors. The LoRA adapter (src/models' owner of the tensors) executes them.
//
// FLAME keeps a model's parameters under their diffusers / transformers names, so a LoRA is attached
// to a diffusers module ("transformer_blocks.0.attn.to_q") with down A [r, in], up B [out, r] and
// scale alpha / r (delta W = alpha / r * B A). The two file formats name these differently:
//  - Peft (diffusers' save_lora_weights): "<component>.<diffusers module>.lora_A.weight" [r, in] and
//    ".lora_B.weight" [out, r]; component = the pipeline slot ("unet", "transformer", "text_encoder",
//    "text_encoder_2", "text_encoder_3"). No alpha tensor: the safetensors metadata key
//    "lora_adapter_metadata" holds JSON of peft's LoraConfig with every field prefixed by the component
//    ("transformer.r", "transformer.lora_alpha", "transformer.rank_pattern", "transformer.alpha_pattern",
//    "transformer.target_modules", ...), as diffusers' _save_lora_weights / _pack_dict_with_prefix write
//    it (json.dumps sort_keys). Without it diffusers takes alpha = r (scale 1).
//  - Kohya: "lora_unet_<original module path, '.' -> '_'>" (BFL names for Flux, SGM names for SDXL,
//    MMDiT names for SD3, diffusers names for SD1.5 as sd-scripts' lora.py writes them),
//    "lora_te1_" (CLIP-L), "lora_te2_" (bigG), "lora_te3_" (T5; sd-scripts' lora_flux.py "make ComfyUI
//    compatible"), text encoders under transformers names; ".lora_down.weight" [r, in],
//    ".lora_up.weight" [out, r] and a 0-d ".alpha" (f32). Metadata ss_* and modelspec.* (sai model
//    spec) as sd-scripts' train_network.py / sai_model_spec.py write them.
//
// Fused original modules. Where the original layout fuses several diffusers modules (Flux's
// img_attn.qkv = to_q,to_k,to_v, single blocks' linear1 = to_q,to_k,to_v,proj_mlp; SD3's attn.qkv), the
// kohya file stores ONE pair for the fused module. Saving FLAME's separate LoRAs there (as sd-scripts'
// lora_flux.py does for split_qkv): down = the modules' downs stacked along rows [sum r, in]; up =
// block diagonal [sum out, sum r] (module m's up in its output rows and its own rank columns, zeros
// elsewhere; a module of the group without a LoRA is a zero block of rank 0). So delta W of module m is
// exactly its own up_m down_m times the stored scale. Scales: the stored alpha is chosen so that
// alpha / sum r equals the first module's alpha_m / r_m; a module whose scale differs has its up block
// multiplied by (alpha_m / r_m) / stored scale (LoraTensorPiece::scale): exact, and no error for
// mixed scales. (sd-scripts itself keeps alpha unchanged there, which changes the scale by 1/n.)
// diffusers' _convert_kohya_flux_lora_to_diffusers splits such a pair exactly: it detects the block
// diagonal ("sparse") up when the ranks are equal, and otherwise gives every module the whole down
// and its rows of the up, which is also exact. ComfyUI applies the fused pair to the fused weight.
//
// DoRA (model_lora.h). Peft: "<component>.<module>.lora_magnitude_vector" [out] and "use_dora": true in
// lora_adapter_metadata (peft's get_peft_model_state_dict names; diffusers reads them into peft).
// Kohya: "<name>.dora_scale" [out, 1], LyCORIS' default layout (wd_on_out: the norm of each output
// row, as peft), which ComfyUI reads (comfy/weight_adapter/base.py weight_decompose; note that it
// divides by ||W||_row, not ||W + scale B A||_row, on that axis) and diffusers' kohya conversion
// renames to lora_magnitude_vector. A fused original stores one dora_scale: each member's magnitude
// in its rows (halves swapped as its up), and for a member without DoRA the row norms of its
// W + scale B A (of W when it has no LoRA), which make its DoRA factor exactly 1. LyCORIS' other
// layout, [1, in] (norms of input columns), is not a peft DoRA: loading it is an error.
//
// LoKr (LyCORIS' Kronecker adapter, model_lora.h): delta W = scale * kron(W1, W2) with W1 [a, b] and
// W2 [out / a, in / b]. Kohya files store, under the module's kohya name, W1 as ".lokr_w1" or as
// ".lokr_w1_a" [a, r] @ ".lokr_w1_b" [r, b], W2 as ".lokr_w2" or ".lokr_w2_a" [out / a, r] @
// ".lokr_w2_b" [r, in / b], and a 0-d ".alpha": scale = alpha / r when a factor is stored low rank,
// 1 when both are whole (LyCORIS' LokrModule, ComfyUI's comfy/weight_adapter/lokr.py, which reads
// exactly these keys). A Kronecker product of one module cannot be split over the members of a fused
// original (Flux's qkv, linear1; SD3's qkv) nor have its row halves swapped: a LoKr on a fused member
// or a half-swapped original is saved under the module's diffusers name with OneTrainer's
// "lora_transformer_" prefix (ComfyUI maps it to the member's rows of the fused weight, or to the
// original with swap_scale_shift applied to the difference: comfy/lora.py model_lora_keys_unet,
// comfy/utils.py flux_to_diffusers / mmdit_to_diffusers), and a LoKr on a transposed original is
// refused. The peft / diffusers format has no LoKr (diffusers' loaders read LoRA only; peft's
// LoKrConfig has no diffusers file): saving LoKr there is an error.
//
// Loading. The rule that is exact for every stored pair, fused or not: module m gets the whole stored
// down [R, in], the rows of the stored up that hold m's output rows (halves swapped where the original
// stores them swapped, e.g. Flux's final adaLN), rank R and the stored alpha (R when absent: scale 1,
// as ComfyUI and diffusers do). So a fused pair loads as rank R LoRAs on each member module.
//
// Names are resolved against the model's own key tables (flux_keys, unet_keys, sd3_keys, clip_keys,
// t5_keys), so every kohya name corresponds to a real original-layout weight "<name>.weight".
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>
#include "models/flux_keys.h"  // KeyShape

namespace flame::models {

enum class LoraFileFormat { Peft, Kohya };

// LoKr's stored factors (LyCORIS' names without the leading '.').
enum class LokrFactor { W1, W1A, W1B, W2, W2A, W2B };
const char* lokr_factor_name(LokrFactor f);  // "lokr_w1", "lokr_w1_a", ...

// LyCORIS' factorization(dimension, factor) (lycoris/functional/general.py): (m, n) with m * n =
// dimension and m <= n; factor > 0 dividing dimension gives (factor, dimension / factor) ordered;
// otherwise the divisor pair closest to a square whose smaller member is at most factor (factor < 0:
// no bound): 128 -> (8, 16), 127 -> (1, 127); factor 4: 360 -> (4, 90).
std::pair<int64_t, int64_t> lokr_factorization(int64_t dimension, int64_t factor);

// The shape of a LoKr module on a [out, in] weight: W1 [w1_rows, w1_cols], W2 [w2_rows, w2_cols].
struct LokrShape {
  int64_t w1_rows = 0, w1_cols = 0;
  int64_t w2_rows = 0, w2_cols = 0;
  bool w1_low_rank = false;  // stored as lokr_w1_a @ lokr_w1_b of the module's rank
  bool w2_low_rank = false;  // stored as lokr_w2_a @ lokr_w2_b
  // The factors stored, in LyCORIS' order (w1 or w1_a, w1_b; w2 or w2_a, w2_b), and their shapes.
  std::vector<LokrFactor> factors() const;
  std::vector<int64_t> factor_shape(LokrFactor f, int64_t rank) const;
  // The elements of all stored factors at that rank (what the adapter trains).
  int64_t elements(int64_t rank) const;
};
// LyCORIS' LokrModule rule for a Linear [out, in] (peft's LoKr layer the same): (a, c) =
// factorization(out, factor), (b, d) = factorization(in, factor); W1 [a, b] is low rank when
// decompose_both and rank < max(a, b) / 2; W2 [c, d] is low rank when rank < max(c, d) / 2.
LokrShape lokr_shape(int64_t out_features, int64_t in_features, int64_t rank, int64_t factor, bool decompose_both);

// Which trainer's default target list (default_lora_targets).
enum class LoraTargetConvention {
  DiffusersScripts,  // diffusers' examples/*/train_dreambooth_lora_*.py defaults
  Kohya,             // sd-scripts' networks/lora*.py: every Linear of the target blocks
};

// One LoRA on one Linear module, under FLAME's (diffusers / transformers) module name.
struct LoraModuleShape {
  std::string module;  // e.g. "transformer_blocks.0.attn.to_q" (no ".weight")
  int64_t rank = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  double alpha = 0;  // scale = alpha / rank
  bool dora = false;  // the module has DoRA's magnitude vector [out]
  // LoKr instead of a LoRA pair: its factors; scale = alpha / rank as above (a LoKr of two whole
  // factors has scale 1 in files: the caller passes alpha = rank * its scale, the plan stores alpha
  // = rank and multiplies W2 by the scale).
  bool lokr = false;
  LokrShape lokr_shape{};
};

enum class LoraTensorKind { Down, Up, Alpha, Magnitude, Lokr };

// Where one module's tensor goes inside a stored tensor. Down: the module's down [r, in] fills rows
// [row_begin, row_begin + rows) (all columns). Up: the module's up [out, r], multiplied by scale and
// with its two row halves exchanged when swap_halves, fills rows [row_begin, row_begin + rows) and
// columns [col_begin, col_begin + cols). Magnitude: the module's DoRA magnitude [out] (with halves
// exchanged when swap_halves) fills rows [row_begin, row_begin + rows) of a [rows, 1] or [rows]
// tensor; with adapted_row_norms the rows hold ||W + scale B A||_row of the module instead (a member of
// a fused original without DoRA: factor 1). Lokr: the module's LoKr factor (LoraStoredTensor::factor)
// whole, times scale. Everything of the stored tensor no piece covers is zero.
struct LoraTensorPiece {
  std::string module;
  int64_t row_begin = 0;
  int64_t rows = 0;
  int64_t col_begin = 0;
  int64_t cols = 0;
  bool swap_halves = false;
  double scale = 1.0;
  bool adapted_row_norms = false;
};

struct LoraStoredTensor {
  std::string key;
  std::vector<int64_t> shape;  // Alpha: {} (0-d)
  LoraTensorKind kind = LoraTensorKind::Down;
  std::vector<LoraTensorPiece> pieces;  // Down / Up
  double alpha = 0;                     // Alpha: the value stored
  LokrFactor factor = LokrFactor::W1;   // Lokr: which factor
};

struct LoraSavePlan {
  LoraFileFormat format = LoraFileFormat::Kohya;
  std::vector<LoraStoredTensor> tensors;          // in file order
  std::map<std::string, std::string> metadata;    // the safetensors "__metadata__" strings
};

// The tensors and metadata of a LoRA file for one pipeline component. class_name / full_config: the
// model's architecture and its config.json (FluxTransformer2DModel, UNet2DConditionModel,
// SD3Transformer2DModel, CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel). component: the
// pipeline slot ("unet", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3"); it gives
// the peft prefix, and with the class the kohya prefix (text_encoder: lora_te1; text_encoder_2:
// lora_te2, lora_te3 for T5 (Flux); text_encoder_3: lora_te3). Errors (FLAME_ERROR_INVALID_ARGUMENT,
// naming the module): an unknown class or component, a module the model does not have or that is no
// Linear, in / out features other than the model's, rank < 1, alpha <= 0, a module listed twice, a
// module whose original tensor is stored transposed (kohya only). An empty module list is an error.
LoraSavePlan plan_lora_save(const std::string& class_name, const nlohmann::json& full_config, const std::string& component,
                            const std::vector<LoraModuleShape>& modules, LoraFileFormat format);

// Several components' plans in one file (unet + text encoders): tensors concatenated; peft metadata
// JSON merged; kohya metadata taken from the first plan that has ss_base_model_version (a denoiser's).
// Errors (FLAME_ERROR_INVALID_ARGUMENT): mixed formats, a key in two plans.
LoraSavePlan merge_lora_save_plans(const std::vector<LoraSavePlan>& plans);

// A range of rows of one stored tensor (all columns).
struct LoraTensorSource {
  std::string key;
  int64_t row_begin = 0;
  int64_t rows = 0;
  bool swap_halves = false;  // exchange the two halves of these rows
};

// One FLAME module's LoRA as a file holds it: delta W = alpha / rank * up_rows @ down_rows.
struct LoraModuleSource {
  std::string module;
  int64_t rank = 0;
  double alpha = 0;       // when alpha_key is empty
  std::string alpha_key;  // a 0-d (or [1]) tensor of the file holding alpha (kohya's ".alpha"): read its value
  int64_t in_features = 0;
  int64_t out_features = 0;
  LoraTensorSource down;  // [rank, in]
  LoraTensorSource up;    // [out, rank]
  LoraTensorSource magnitude;  // DoRA's [out] (rows of a [rows] / [rows, 1] tensor); key empty: plain LoRA
  // LoKr (down / up empty): the stored factors' keys (whole tensors) and shape; rank = the low-rank
  // factors' rank (1 when both are whole: scale 1 whatever the alpha).
  bool lokr = false;
  LokrShape lokr_shape{};
  std::vector<std::pair<LokrFactor, std::string>> lokr_keys;
};

struct LoraLoadPlan {
  LoraFileFormat format = LoraFileFormat::Kohya;  // Kohya when the file uses lora_* underscore names
  std::vector<LoraModuleSource> modules;          // in file key order
  std::vector<std::string> other_component_keys;  // keys of other components (te keys while loading the unet)
};

// Reads a LoRA file's key list (names and shapes, from its safetensors header) and metadata for one
// component. Accepted names: kohya "lora_unet_" / "lora_transformer_" / "lycoris_" (SimpleTuner's
// LyCORIS files, denoisers) / "lora_te{,1,2,3}_" with original
// or diffusers module names (underscored); dotted names with the prefixes "unet.", "transformer.",
// "diffusion_model.", "model.diffusion_model.", "text_encoder{,_2,_3}." or none, under diffusers or
// original module names; suffixes ".lora_down.weight" / ".lora_up.weight" / ".alpha",
// ".lora_A.weight" / ".lora_B.weight", ".lora.down.weight" / ".lora.up.weight",
// ".lora_linear_layer.down.weight" / ".lora_linear_layer.up.weight". Peft alphas come from
// "lora_adapter_metadata" (lora_alpha, alpha_pattern; r / rank_pattern are checked against the
// shapes), else alpha = rank. DoRA magnitudes: ".lora_magnitude_vector" and ".dora_scale" of shape
// [out] or [out, 1]. Errors (FLAME_ERROR_INVALID_FORMAT, naming the key): a key no rule
// knows or whose module the model lacks, a down without its up or the reverse, shapes that contradict
// the model or each other, a non-0-d alpha, two pairs for one module, a magnitude without its pair or
// of another shape (LyCORIS' [1, in] named as such), LyCORIS keys other than LoKr's (LoHa, Tucker
// lokr_t2), bad metadata JSON. LoKr keys (".lokr_w1", ".lokr_w1_a" / "_b", ".lokr_w2",
// ".lokr_w2_a" / "_b" with ".alpha") make a LoKr source; errors: a factor missing or twice (w1 and
// w1_a), LoRA or DoRA tensors beside them, shapes whose Kronecker product is not the weight's, two
// ranks, a name of a fused original or one stored with swapped halves.
LoraLoadPlan plan_lora_load(const std::string& class_name, const nlohmann::json& full_config, const std::string& component,
                            const std::vector<KeyShape>& file_keys, const std::map<std::string, std::string>& metadata);

// A Linear module of a model and its weight's shape, as LoRA candidates (every 2-D weight of the key
// table: includes embeddings; FLAME's Linear modules are a subset).
struct LoraCandidate {
  std::string module;
  int64_t in_features = 0;
  int64_t out_features = 0;
};
std::vector<LoraCandidate> lora_candidate_modules(const std::string& class_name, const nlohmann::json& full_config);

// The default target patterns of a trainer for an architecture (class name; config decides SD1.5's
// conv projections). Patterns follow peft's target_modules rule with '*' added: see
// lora_target_matches.
std::vector<std::string> default_lora_targets(const std::string& class_name, const nlohmann::json& full_config,
                                              LoraTargetConvention convention);

// peft's rule: a module matches a pattern when its name equals the pattern or ends with "." + the
// pattern; '*' in a pattern matches any run of characters (none included).
bool lora_target_matches(const std::string& module, const std::string& pattern);

// The candidates matching any pattern, in the model's order.
std::vector<LoraCandidate> select_lora_modules(const std::vector<LoraCandidate>& candidates,
                                               const std::vector<std::string>& patterns);

}  // namespace flame::models
