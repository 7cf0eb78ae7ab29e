// The training noise of one batch, keyed per sample by its place in the global batch, so that a
// sample gets the same noise whichever GPU trains it and however the global batch is cut into
// per-GPU batches (data parallel, data_parallel.h): `--gpus 2` with batch_size 1 draws what
// `--gpus 1` with batch_size 2 draws. Each sample's noise is flame_randn from the context's Philox
// generator set to (key, 0), key = RandomStream(seed, Noise, step, micro * kMaxGlobalBatch (config.h) + position); with
// noise_offset > 0, diffusers' offset * randn(1, C, 1, 1) follows from the same stream. The context's
// own generator state is restored afterwards (dropout and the resumable state keep their stream).
// LoRA dropout draws its masks inside the step from the context's generator: before each micro-batch
// the generator is set to (RandomStream(seed, Dropout, step, item of the batch's first sample), 0),
// so that every rank of a data-parallel run draws its own masks (not the same ones on each GPU) and a
// resumed run draws the masks of the uninterrupted one.
// Public C ABI only; not during a CUDA graph capture (random numbers are refused there).
#pragma once

#include <cstdint>

#include "flame_handles.h"

namespace flame_train {

// Where a batch lies in its step: the optimizer step (0-based), the accumulation micro-step, and the
// position of its first sample in the global batch (the batches of lower ranks come first).
struct BatchPlace {
  uint64_t step = 0;
  int micro = 0;
  uint64_t first_position = 0;
};

// f32 noise [b, c, h, w]: sample i keyed by place.first_position + i (see above). Throws FlameError;
// the context's generator state is restored on every path.
Tensor draw_batch_noise(flame_ctx_t ctx, uint64_t seed, const BatchPlace& place, int64_t b, int64_t c, int64_t h,
                        int64_t w, double noise_offset);

// The RandomStream item of sample i of a batch at place (the timestep draws use it too).
uint64_t batch_sample_item(const BatchPlace& place, int64_t i);

// The Philox seed of the dropout masks of the micro-batch at place (see above).
uint64_t dropout_generator_seed(uint64_t seed, const BatchPlace& place);

// Sets the context's generator to (dropout_generator_seed(seed, place), 0). Throws FlameError.
void seed_dropout_generator(flame_ctx_t ctx, uint64_t seed, const BatchPlace& place);

}  // namespace flame_train
