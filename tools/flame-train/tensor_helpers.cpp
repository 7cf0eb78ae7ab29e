// Small tensor builders shared by the training step and the samplers (see tensor_helpers.h).
#include "tensor_helpers.h"

namespace flame_train {

Tensor host_f32(flame_ctx_t ctx, const std::vector<float>& v, const std::vector<int64_t>& shape) {
  Tensor t;
  check(flame_from_host(ctx, v.data(), v.size() * sizeof(float), shape.data(), static_cast<int32_t>(shape.size()),
                        FLAME_DTYPE_F32, t.out()),
        "flame_from_host");
  return t;
}

Tensor to_f32(flame_tensor_t t) {
  Tensor out;
  check(flame_to_dtype(t, FLAME_DTYPE_F32, out.out()), "flame_to_dtype");
  return out;
}

Tensor pack_latents(flame_tensor_t x, int64_t b, int64_t c, int64_t h, int64_t w) {
  const int64_t split[6] = {b, c, h / 2, 2, w / 2, 2};
  const int32_t order[6] = {0, 2, 4, 1, 3, 5};
  const int64_t packed[3] = {b, (h / 2) * (w / 2), c * 4};
  Tensor v, p, out;
  check(flame_reshape(x, split, 6, v.out()), "flame_reshape");
  check(flame_permute(v.get(), order, 6, p.out()), "flame_permute");
  check(flame_reshape(p.get(), packed, 3, out.out()), "flame_reshape");
  return out;
}

Tensor unpack_latents(flame_tensor_t x, int64_t b, int64_t c, int64_t h, int64_t w) {
  const int64_t split[6] = {b, h / 2, w / 2, c, 2, 2};
  const int32_t order[6] = {0, 3, 1, 4, 2, 5};
  const int64_t image[4] = {b, c, h, w};
  Tensor v, p, out;
  check(flame_reshape(x, split, 6, v.out()), "flame_reshape");
  check(flame_permute(v.get(), order, 6, p.out()), "flame_permute");
  check(flame_reshape(p.get(), image, 4, out.out()), "flame_reshape");
  return out;
}

Tensor flux_img_ids(flame_ctx_t ctx, int64_t h, int64_t w) {
  std::vector<float> ids(static_cast<size_t>(h * w * 3), 0.0f);
  for (int64_t r = 0; r < h; ++r)
    for (int64_t col = 0; col < w; ++col) {
      ids[static_cast<size_t>((r * w + col) * 3 + 1)] = static_cast<float>(r);
      ids[static_cast<size_t>((r * w + col) * 3 + 2)] = static_cast<float>(col);
    }
  return host_f32(ctx, ids, {h * w, 3});
}

}  // namespace flame_train
