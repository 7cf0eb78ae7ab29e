// LoRA adapters on a model's linear layers (issue 36), as peft's LoraLayer applies them: beside the
// frozen weight, never merged while training,
//   y = linear(x, W, b) + multiplier * (alpha / rank) * linear(linear(dropout(x), A), B)
// with A ("down", [rank, in]) and B ("up", [out, rank]) leaves of their own dtype (f32 by default),
// cast to the model's compute dtype at use (recorded, so gradients reach them in their dtype).
// A model holds any number of named adapters; each covers the linear modules its targets match
// (diffusers / transformers module names, e.g. "transformer_blocks.0.attn.to_q"), with a rank and an
// alpha per module (rank_pattern / alpha_pattern as peft's; targets match by lora_target_matches of
// lora_format.h). Every architecture applies them through
// Model::adapted_linear, so a new architecture gets LoRA by routing its linear layers there.
//
// DoRA (Liu et al. 2024, peft's use_dora): a module may also hold a magnitude vector m [out], a
// trainable leaf initialised to the row norms of W + scale B A (= ||W||_row, B being 0). Its term,
// as peft's DoraLinearLayer computes it, with n = ||W + scale B A||_row detached from the graph,
//   multiplier * ((m / n - 1) * (W x') + (m / n) * scale * B(A(x')))
// where x' = dropout(x) in training with dropout (W x' then computed again) and x otherwise (W x is
// the base output minus the bias): so y = (m / n) * (W x + scale B A x) + b for multiplier 1. A
// multiplier other than 1 interpolates between the base and that output (ComfyUI's strength). W x is
// the layer's own output: with several adapters on one layer, peft would feed earlier adapters'
// terms into a later DoRA adapter's (m / n - 1) factor; FLAME keeps each adapter's term independent.
//
// LoKr (LyCORIS' Kronecker adapter, peft's LoKrConfig): a module may instead hold LoKr factors,
// delta W = scale * kron(W1, W2) with W1 [a, b] (lokr_w1, or lokr_w1_a [a, r] @ lokr_w1_b [r, b]) and
// W2 [out / a, in / b] (lokr_w2, or lokr_w2_a @ lokr_w2_b), shapes by LyCORIS' factorization rule
// (lora_format.h lokr_shape), scale = alpha / r when a factor is low rank and 1 when both are whole
// (LyCORIS and ComfyUI; peft uses alpha / r always). Initialised as LyCORIS: W1 (or both its
// factors) and W2's a Kaiming-uniform, W2 (or lokr_w2_b) zero, so a new LoKr changes nothing. Its
// term, multiplier * scale * kron(W1, W2) dropout(x), is computed without the [out, in] product:
// with x viewed as X [N, b, d], kron(W1, W2) x = (W1 (W2 X^T)^T)^T flattened, two small products and
// two transposes of activation size. LoKr and DoRA do not combine.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>
#include "models/lora_format.h"  // LoraCandidate: a linear layer, lora_target_matches
#include "ops/nf4.h"
#include "tensor/tensor.h"

namespace flame::models {

struct LoraAdapterOptions {
  std::string name = "default";
  std::vector<std::string> targets;  // empty: the architecture's default targets of the preset
  bool kohya_preset = false;         // "preset": "kohya" (sd-scripts' lists) instead of "diffusers"
  int64_t rank = 16;
  double alpha = 16.0;  // absent from the JSON: alpha = rank (scale 1)
  // The first matching entry (target syntax as above) sets a module's rank / alpha.
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  std::string init = "kaiming";  // "kaiming": A ~ U(-1/sqrt(in), 1/sqrt(in)); "gaussian": A ~ N(0, 1/rank); B = 0
  double dropout = 0.0;          // on the adapter's input, in training mode only
  DType dtype = FLAME_DTYPE_F32;  // of A and B
  bool freeze_base = true;        // the model's own parameters stop requiring grad
  double multiplier = 1.0;        // the adapter's strength (ComfyUI's / kohya's multiplier)
  bool dora = false;              // "dora": true: every module also gets DoRA's magnitude vector
  bool lokr = false;              // "type": "lokr" (default "lora")
  int64_t lokr_factor = -1;       // "factor": LyCORIS' factorization factor (-1: closest to square)
  bool lokr_decompose_both = false;  // "decompose_both": W1 low rank too (when rank < max(a, b) / 2)
};

// Reads flame_model_add_lora's options JSON; unknown keys and bad values fail with
// FLAME_ERROR_INVALID_ARGUMENT naming the key.
LoraAdapterOptions parse_lora_adapter_options(const nlohmann::json& options);

struct LoraModule {
  std::string module;  // the linear module it adapts
  Tensor down;         // A [rank, in]; null for a LoKr module
  Tensor up;           // B [out, rank]; null for a LoKr module
  Tensor magnitude;    // DoRA's m [out] in A's dtype; null for a plain LoRA module
  double alpha = 0.0;
  // LoKr (above): W1 = lokr_w1 or lokr_w1_a @ lokr_w1_b, W2 = lokr_w2 or lokr_w2_a @ lokr_w2_b (the
  // unused ones null); lokr_rank is r (of the low-rank factors; the options' rank when both are whole).
  Tensor lokr_w1, lokr_w1_a, lokr_w1_b, lokr_w2, lokr_w2_a, lokr_w2_b;
  int64_t lokr_rank = 0;
  bool is_lokr() const { return lokr_w1 || lokr_w1_a; }
  bool lokr_both_whole() const { return lokr_w1 && lokr_w2; }
  int64_t rank() const { return is_lokr() ? lokr_rank : down->shape[0]; }
  double scale() const {
    if (is_lokr() && lokr_both_whole()) return 1.0;
    return alpha / static_cast<double>(rank());
  }
  // A LoKr module's factors as stored, in LyCORIS' order with their names (LokrShape::factors).
  std::vector<std::pair<LokrFactor, Tensor>> lokr_factors() const;
  LokrShape lokr_shape() const;
};

struct LoraAdapter {
  std::string name;
  double multiplier = 1.0;
  double dropout = 0.0;
  std::vector<LoraModule> modules;  // in the model's module order
  const LoraModule* find(const std::string& module) const;
  // The adapter's tensors under peft's names: "<module>.lora_A.weight", "<module>.lora_B.weight" and,
  // for a DoRA module, "<module>.lora_magnitude_vector"; a LoKr module's "<module>.lokr_w1" (or
  // "_w1_a", "_w1_b") and "<module>.lokr_w2" (or "_w2_a", "_w2_b"), as peft's LoKr state dict.
  std::vector<std::pair<std::string, Tensor>> named_tensors() const;
};

// The adapter a set of options makes for modules (the model's linear layers): the targets select
// modules (a target that selects nothing is FLAME_ERROR_INVALID_ARGUMENT naming it), A and B (or a
// LoKr's factors) are created in options.dtype with the init asked for, drawn from ctx's generator.
std::shared_ptr<LoraAdapter> create_lora_adapter(Context& ctx, const std::vector<LoraCandidate>& modules,
                                                 const std::vector<std::string>& targets,
                                                 const LoraAdapterOptions& options);

// The linear layer an adapter term is added to: its weight and bias (may be null) as the forward
// uses them (compute dtype) and its output x W^T + b. Over a quantised weight, `quantized` and `scale`
// hold it as stored (F8 and its f32 scale; ops/quantized.h) and `weight` is its dequantised value,
// set only when a DoRA term reads it (the norms), else null. Over an NF4 weight, `nf4` holds it.
struct LoraBaseLinear {
  Tensor weight;
  Tensor bias;
  Tensor output;
  Tensor quantized;
  Tensor scale;
  ops::Nf4Weight nf4;  // over an NF4 weight (ops/nf4.h): its packed codes and statistics, else empty
};

// The adapter's term for module m in x's dtype, recorded: multiplier * scale * B(A(dropout(x))),
// DoRA's term (above) when m has a magnitude, LoKr's multiplier * scale * kron(W1, W2) dropout(x).
Tensor lora_delta(const LoraAdapter& adapter, const LoraModule& m, const Tensor& x, const LoraBaseLinear& base,
                  bool training);

// ||W + scale * B A|| of every row of weight [out, in] (f32 [out], computed in f32, not recorded):
// DoRA's norm, and with B = 0 the initial magnitude.
Tensor dora_row_norms(const Tensor& weight, const LoraModule& m);

// The weight with the adapter's module folded in, in f32 (not recorded):
// W + multiplier * scale * B A, or for DoRA W + multiplier * ((m / n) * (W + scale * B A) - W), or
// for LoKr W + multiplier * scale * kron(W1, W2).
Tensor merged_lora_weight(const LoraAdapter& adapter, const LoraModule& m, const Tensor& weight);

// kron(W1, W2) of a LoKr module in f32 [out, in] (not recorded).
Tensor lokr_kron_f32(const LoraModule& m);

}  // namespace flame::models
