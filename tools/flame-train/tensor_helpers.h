// Small tensor builders shared by the training step (trainer.cpp) and the samplers (sampling.cpp):
// host vectors as f32 tensors, f32 copies, and Flux's packed latent layout with its RoPE image ids
// (diffusers' _pack_latents / _unpack_latents / _prepare_latent_image_ids). Public C ABI only.
#pragma once

#include <cstdint>
#include <vector>

#include "flame_handles.h"

namespace flame_train {

// A new f32 tensor of the given shape holding v (row-major).
Tensor host_f32(flame_ctx_t ctx, const std::vector<float>& v, const std::vector<int64_t>& shape);
// t converted to f32 (a new tensor).
Tensor to_f32(flame_tensor_t t);
// [B, C, H, W] -> [B, (H / 2)(W / 2), 4C], channel-major within each 2x2 patch.
Tensor pack_latents(flame_tensor_t x, int64_t b, int64_t c, int64_t h, int64_t w);
// The inverse of pack_latents: [B, (H / 2)(W / 2), 4C] -> [B, C, H, W].
Tensor unpack_latents(flame_tensor_t x, int64_t b, int64_t c, int64_t h, int64_t w);
// Flux's RoPE ids of h x w packed image tokens: rows (0, row, column), shape [h * w, 3], f32.
Tensor flux_img_ids(flame_ctx_t ctx, int64_t h, int64_t w);

}  // namespace flame_train
