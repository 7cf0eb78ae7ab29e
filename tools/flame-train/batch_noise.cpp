// Per-sample keyed training noise (see batch_noise.h).
#include "batch_noise.h"

#include <vector>

#include "config.h"
#include "random.h"

namespace flame_train {
namespace {

// Restores the context's generator state at the end of the scope (also when a draw throws).
class GeneratorStateGuard {
 public:
  explicit GeneratorStateGuard(flame_ctx_t ctx) : ctx_(ctx) {
    check(flame_ctx_get_rng_state(ctx, &seed_, &offset_), "flame_ctx_get_rng_state");
  }
  ~GeneratorStateGuard() { flame_ctx_set_rng_state(ctx_, seed_, offset_); }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  flame_ctx_t ctx_;
  uint64_t seed_ = 0, offset_ = 0;
};

Tensor randn(flame_ctx_t ctx, const std::vector<int64_t>& shape) {
  Tensor out;
  check(flame_randn(ctx, shape.data(), static_cast<int32_t>(shape.size()), FLAME_DTYPE_F32, out.out()), "flame_randn");
  return out;
}

}  // namespace

uint64_t batch_sample_item(const BatchPlace& place, int64_t i) {
  return static_cast<uint64_t>(place.micro) * static_cast<uint64_t>(kMaxGlobalBatch) + place.first_position +
         static_cast<uint64_t>(i);
}

uint64_t dropout_generator_seed(uint64_t seed, const BatchPlace& place) {
  return RandomStream(seed, RandomPurpose::Dropout, place.step, batch_sample_item(place, 0)).next_u64();
}

void seed_dropout_generator(flame_ctx_t ctx, uint64_t seed, const BatchPlace& place) {
  check(flame_ctx_set_rng_state(ctx, dropout_generator_seed(seed, place), 0), "flame_ctx_set_rng_state");
}

Tensor draw_batch_noise(flame_ctx_t ctx, uint64_t seed, const BatchPlace& place, int64_t b, int64_t c, int64_t h,
                        int64_t w, double noise_offset) {
  GeneratorStateGuard keep(ctx);
  std::vector<Tensor> samples;
  for (int64_t i = 0; i < b; ++i) {
    RandomStream key(seed, RandomPurpose::Noise, place.step, batch_sample_item(place, i));
    check(flame_ctx_set_rng_state(ctx, key.next_u64(), 0), "flame_ctx_set_rng_state");
    Tensor noise = randn(ctx, {1, c, h, w});
    if (noise_offset > 0) {  // diffusers: noise += offset * randn(B, C, 1, 1)
      Tensor offset = randn(ctx, {1, c, 1, 1}), scaled, sum;
      check(flame_mul_scalar(offset.get(), noise_offset, scaled.out()), "flame_mul_scalar");
      check(flame_add(noise.get(), scaled.get(), sum.out()), "flame_add");
      noise = std::move(sum);
    }
    samples.push_back(std::move(noise));
  }
  if (samples.size() == 1) return std::move(samples.front());
  std::vector<flame_tensor_t> parts;
  for (const Tensor& t : samples) parts.push_back(t.get());
  Tensor out;
  check(flame_cat(parts.data(), static_cast<int32_t>(parts.size()), 0, out.out()), "flame_cat");
  return out;
}

}  // namespace flame_train
