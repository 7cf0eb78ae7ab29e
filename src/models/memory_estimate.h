// The preflight memory estimate of a training step (issue 36, Memory; flame_estimate_training_memory):
// the device memory a LoRA (or full) training step of a denoiser needs at its peak, computed on the
// CPU from the architecture's configuration before any weight is read or any GPU touched.
//
// How it is made:
//  - Parameters: the exact list of names and shapes the model registers (unet2d_condition_param_specs,
//    flux_diffusers_tensors, sd3_parameter_table: the same tables the loader checks files against),
//    in the options' dtype; with "quantize" every linear weight at 1 byte per element plus its f32
//    scale (with "dtype": "nf4" at half a byte plus its block statistics); with "offload" the device-resident part after the plan WeightOffload would make (frozen
//    blocks moved in execution order until the rest plus the ring fits the budget).
//  - Adapter, gradients, optimizer state: exact element counts (the LoRA options select modules
//    exactly as flame_model_add_lora does, rank_pattern included); moments in f32 (f64 for f64).
//  - Activations: a structural count of what each block keeps for backward, in elements of the
//    compute dtype per token (or per pixel position for the UNet), written from the blocks' op
//    sequences (resnets 3 x in + 3 x out channels, BasicTransformerBlock 14 + 3 x ff_inner widths,
//    MMDiT streams 15 x width + 2 x mlp, ...), scaled by one factor per family that stands for what
//    FLAME's fused ops and need-based saving drop and for backward's transients: kConvNetSavedFraction
//    for the UNet, kMMDiTSavedFraction for Flux and SD3 (both fitted to FLAME's measured H200 peaks,
//    bench/RESULTS.md T6). With checkpointing, a checkpointed block keeps its inputs only and the
//    largest one is recomputed during backward (its activations come back for that block alone).
//    Flux adds backward's working set inside its largest block (kFluxBackwardTransientFraction). A
//    block's forward keeps the compute-dtype copies of its weights when the storage dtype differs
//    from compute_dtype; a quantised base keeps none (quantized_linear saves the fp8 weight), only
//    its largest linear weight is dequantised at a time.
//  - Workspace: cuBLASLt's 32 MiB.
// Accuracy against the measured peaks: flame.h (flame_estimate_training_memory) gives the table.
#pragma once
#include <cstdint>
#include <string>
#include <nlohmann/json.hpp>
#include "models/model.h"

namespace flame::models {

// What the FLAME ops keep of the structural count (see above), per family: fitted so that the
// estimate meets FLAME's measured peaks (SDXL B=1 for the UNet; Flux-dev and SD3.5-medium without
// checkpointing, one shared value, for the MMDiT family).
constexpr double kConvNetSavedFraction = 0.845;
constexpr double kMMDiTSavedFraction = 0.68;
// Backward's working set inside one Flux block (the gradients of the single blocks' concatenated
// [attention, MLP] width, of the GELU and of the attention), as a share of the block's structural
// count: fitted to the mid-sized Flux model's measured peaks with and without checkpointing
// (tests/gpu/test_memory_estimate.cpp), where one block weighs more than in Flux-dev. SD3's blocks
// have no such wide tensor: kMMDiTSavedFraction alone meets its peaks.
constexpr double kFluxBackwardTransientFraction = 0.6;
constexpr uint64_t kEstimateWorkspaceBytes = uint64_t(32) << 20;  // runtime/blas.cpp kWorkspaceBytes

// A parsed request (flame_estimate_training_memory's JSON; see flame.h).
struct TrainingMemoryRequest {
  std::string architecture;
  nlohmann::json config = nlohmann::json::object();
  ModelOptions options;
  bool lora = true;              // false: every (unquantised) parameter is trained
  nlohmann::json lora_options = nlohmann::json::object();
  int64_t batch = 1;
  int64_t height = 1024, width = 1024;  // pixels
  int64_t text_tokens = -1;             // -1: the architecture's usual length (77, 512, 333)
  int64_t checkpoint_every = 0;         // flame_model_set_checkpointing's every_n_blocks
  std::string optimizer = "adamw";      // "adamw", "adam", "lion", "sgd"; "adamw8bit", "adam8bit", "lion8bit"
};

struct TrainingMemoryEstimate {
  uint64_t weights = 0, adapter = 0, gradients = 0, optimizer = 0, activations = 0, workspace = 0, total = 0;
  uint64_t parameter_count = 0, trainable_count = 0;
};

// Reads the request object; "path" goes through plan_model_load (headers and config.json only).
// Unknown keys and bad values: FLAME_ERROR_INVALID_ARGUMENT naming the key; the file errors of
// flame_model_load for a path.
TrainingMemoryRequest parse_training_memory_request(const nlohmann::json& request);

// The estimate; FLAME_ERROR_UNSUPPORTED for an architecture other than UNet2DConditionModel,
// FluxTransformer2DModel and SD3Transformer2DModel; config errors as create_model's.
TrainingMemoryEstimate estimate_training_memory(const TrainingMemoryRequest& request);

}  // namespace flame::models
