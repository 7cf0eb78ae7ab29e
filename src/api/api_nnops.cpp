// C entry points of the ops in ops/nnops.h: scatter, masked_select, repeat, repeat_interleave, pad,
// dropout, pooling, upsampling, rotary and timestep embeddings, composite blocks.
// Handles, contexts, NULL arrays and enum values are checked here; the ops check shapes, dtypes and
// values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include "api/guard.h"
#include "ops/nnops.h"

using namespace flame;

namespace {

std::vector<int64_t> array_arg(const int64_t* p, int32_t n, const char* name) {
  FLAME_CHECK(p, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  FLAME_CHECK(n >= 0 && n <= 2 * FLAME_MAX_DIMS, FLAME_ERROR_INVALID_ARGUMENT, name, ": ", n, " values is not in [0, ",
              2 * FLAME_MAX_DIMS, "]");
  return std::vector<int64_t>(p, p + n);
}

// The caller's options over the defaults, reading only struct_size bytes (at least the first version's).
template <class S>
S read_options(const S* opts, const char* name, size_t first_version_size) {
  FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  FLAME_CHECK(opts->struct_size >= first_version_size && opts->struct_size <= 4096, FLAME_ERROR_INVALID_ARGUMENT, name,
              "->struct_size is ", opts->struct_size, "; set it with the options' init function");
  S o{};
  std::memcpy(&o, opts, std::min(opts->struct_size, sizeof o));
  return o;
}

ops::Pool2dOptions pool_options(const flame_pool2d_options_t* opts) {
  flame_pool2d_options_t o = read_options(opts, "opts", sizeof(flame_pool2d_options_t));
  ops::Pool2dOptions p;
  for (int i = 0; i < 2; ++i) {
    p.kernel[i] = o.kernel_size[i];
    p.stride[i] = o.stride[i];
    p.padding[i] = o.padding[i];
    p.dilation[i] = o.dilation[i];
  }
  FLAME_CHECK(o.ceil_mode == 0 || o.ceil_mode == 1, FLAME_ERROR_INVALID_ARGUMENT, "opts->ceil_mode must be 0 or 1, got ", o.ceil_mode);
  FLAME_CHECK(o.count_include_pad == 0 || o.count_include_pad == 1, FLAME_ERROR_INVALID_ARGUMENT,
              "opts->count_include_pad must be 0 or 1, got ", o.count_include_pad);
  p.ceil_mode = o.ceil_mode != 0;
  p.count_include_pad = o.count_include_pad != 0;
  p.divisor_override = o.divisor_override;
  return p;
}

// An optional tensor argument: NULL stays null; otherwise it must be live and of x's context.
}  // namespace

extern "C" {

// ---------------------------------------------------------------- indexing

FLAME_API flame_status_t flame_scatter(flame_tensor_t t, int32_t dim, flame_tensor_t index, flame_tensor_t src,
                                       flame_tensor_t* out) {
  return tensor_op("flame_scatter", {{t, "t"}, {index, "index"}, {src, "src"}}, out,
                   [&](const Tensor& x, const Tensor& idx, const Tensor& values) { return ops::scatter(x, dim, idx, values); });
}

FLAME_API flame_status_t flame_masked_select(flame_tensor_t t, flame_tensor_t mask, flame_tensor_t* out) {
  return tensor_op("flame_masked_select", {{t, "t"}, {mask, "mask"}}, out,
                   [&](const Tensor& x, const Tensor& m) { return ops::masked_select(x, m); });
}

FLAME_API flame_status_t flame_repeat(flame_tensor_t t, const int64_t* repeats, int32_t n, flame_tensor_t* out) {
  return tensor_op("flame_repeat", {{t, "t"}}, out, [&](const Tensor& x) {
    return ops::repeat(x, array_arg(repeats, n, "repeats"));
  });
}

FLAME_API flame_status_t flame_repeat_interleave(flame_tensor_t t, int64_t repeats, int32_t dim, flame_tensor_t* out) {
  return tensor_op("flame_repeat_interleave", {{t, "t"}}, out, [&](const Tensor& x) {
    return ops::repeat_interleave(x, repeats, dim, dim == FLAME_DIM_ALL);
  });
}

FLAME_API flame_status_t flame_pad(flame_tensor_t t, const int64_t* pads, int32_t npads, int32_t mode, double value,
                                   flame_tensor_t* out) {
  return tensor_op("flame_pad", {{t, "t"}}, out, [&](const Tensor& x) {
    std::vector<int64_t> p = array_arg(pads, npads, "pads");
    FLAME_CHECK(mode >= FLAME_PAD_CONSTANT && mode <= FLAME_PAD_REPLICATE, FLAME_ERROR_INVALID_ARGUMENT,
                "mode must be a flame_pad_mode_t (0, 1 or 2), got ", mode);
    return ops::pad(x, p, static_cast<ops::PadMode>(mode), value);
  });
}

// ---------------------------------------------------------------- dropout

FLAME_API flame_status_t flame_dropout(flame_tensor_t t, double p, int32_t training, flame_tensor_t* out) {
  return tensor_op("flame_dropout", {{t, "t"}}, out,
                   [&](const Tensor& x) { return ops::dropout(x, p, training != 0); });
}

// ---------------------------------------------------------------- pooling

FLAME_API flame_status_t flame_pool2d_options_init(flame_pool2d_options_t* opts, int64_t kernel_h, int64_t kernel_w) {
  return api_call("flame_pool2d_options_init", [&] {
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    std::memset(opts, 0, sizeof *opts);
    opts->struct_size = sizeof *opts;
    opts->kernel_size[0] = opts->stride[0] = kernel_h;
    opts->kernel_size[1] = opts->stride[1] = kernel_w;
    opts->dilation[0] = opts->dilation[1] = 1;
    opts->count_include_pad = 1;
  });
}

FLAME_API flame_status_t flame_max_pool2d(flame_tensor_t x, const flame_pool2d_options_t* opts, flame_tensor_t* out) {
  return tensor_op("flame_max_pool2d", {{x, "x"}}, out,
                   [&](const Tensor& t) { return ops::max_pool2d(t, pool_options(opts)); });
}

FLAME_API flame_status_t flame_avg_pool2d(flame_tensor_t x, const flame_pool2d_options_t* opts, flame_tensor_t* out) {
  return tensor_op("flame_avg_pool2d", {{x, "x"}}, out,
                   [&](const Tensor& t) { return ops::avg_pool2d(t, pool_options(opts)); });
}

FLAME_API flame_status_t flame_adaptive_avg_pool2d(flame_tensor_t x, int64_t out_h, int64_t out_w, flame_tensor_t* out) {
  return tensor_op("flame_adaptive_avg_pool2d", {{x, "x"}}, out,
                   [&](const Tensor& t) { return ops::adaptive_avg_pool2d(t, out_h, out_w); });
}

// ---------------------------------------------------------------- upsampling

FLAME_API flame_status_t flame_upsample_nearest2d(flame_tensor_t x, int64_t out_h, int64_t out_w, double scale_h, double scale_w,
                                                  flame_tensor_t* out) {
  return tensor_op("flame_upsample_nearest2d", {{x, "x"}}, out, [&](const Tensor& t) {
    return ops::upsample2d(t, out_h, out_w, scale_h, scale_w, false, false);
  });
}

FLAME_API flame_status_t flame_upsample_bilinear2d(flame_tensor_t x, int64_t out_h, int64_t out_w, double scale_h,
                                                   double scale_w, int32_t align_corners, flame_tensor_t* out) {
  return tensor_op("flame_upsample_bilinear2d", {{x, "x"}}, out, [&](const Tensor& t) {
    FLAME_CHECK(align_corners == 0 || align_corners == 1, FLAME_ERROR_INVALID_ARGUMENT, "align_corners must be 0 or 1, got ",
                align_corners);
    return ops::upsample2d(t, out_h, out_w, scale_h, scale_w, true, align_corners != 0);
  });
}

// ---------------------------------------------------------------- positional embeddings

FLAME_API flame_status_t flame_rope_options_init(flame_rope_options_t* opts) {
  return api_call("flame_rope_options_init", [&] {
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    std::memset(opts, 0, sizeof *opts);
    opts->struct_size = sizeof *opts;
    opts->theta = 10000.0;
    opts->seq_dim = -2;
  });
}

FLAME_API flame_status_t flame_rope(flame_tensor_t x, flame_tensor_t positions, const flame_rope_options_t* opts,
                                    flame_tensor_t* out) {
  return tensor_op("flame_rope", {{x, "x"}, {positions, "positions", true}}, out, [&](const Tensor& t, const Tensor& pos) {
    flame_rope_options_t o = read_options(opts, "opts", sizeof(flame_rope_options_t));
    FLAME_CHECK(o.interleaved == 0 || o.interleaved == 1, FLAME_ERROR_INVALID_ARGUMENT, "opts->interleaved must be 0 or 1, got ",
                o.interleaved);
    ops::RopeParams p;
    p.theta = o.theta;
    p.rotary_dim = o.rotary_dim;
    p.offset = o.position_offset;
    p.interleaved = o.interleaved != 0;
    p.seq_dim = o.seq_dim;
    return ops::rope(t, pos, p);
  });
}

FLAME_API flame_status_t flame_timestep_embedding(flame_tensor_t timesteps, int64_t dim, double max_period,
                                                  int32_t flip_sin_to_cos, double downscale_freq_shift, double scale,
                                                  flame_tensor_t* out) {
  return tensor_op("flame_timestep_embedding", {{timesteps, "timesteps"}}, out, [&](const Tensor& t) {
    FLAME_CHECK(flip_sin_to_cos == 0 || flip_sin_to_cos == 1, FLAME_ERROR_INVALID_ARGUMENT, "flip_sin_to_cos must be 0 or 1, got ",
                flip_sin_to_cos);
    return ops::timestep_embedding(t, dim, max_period, flip_sin_to_cos != 0, downscale_freq_shift, scale);
  });
}

// ---------------------------------------------------------------- composite blocks

FLAME_API flame_status_t flame_geglu(flame_tensor_t x, int32_t approximate, flame_tensor_t* out) {
  return tensor_op("flame_geglu", {{x, "x"}}, out, [&](const Tensor& t) {
    FLAME_CHECK(approximate == 0 || approximate == 1, FLAME_ERROR_INVALID_ARGUMENT, "approximate must be 0 or 1, got ", approximate);
    return ops::geglu(t, approximate == 1);
  });
}

FLAME_API flame_status_t flame_adaln_modulate(flame_tensor_t x, flame_tensor_t shift, flame_tensor_t scale, flame_tensor_t* out) {
  return tensor_op("flame_adaln_modulate", {{x, "x"}, {shift, "shift", true}, {scale, "scale", true}}, out,
                   [&](const Tensor& t, const Tensor& sh, const Tensor& sc) { return ops::adaln_modulate(t, sh, sc); });
}

FLAME_API flame_status_t flame_swiglu_mlp(flame_tensor_t x, flame_tensor_t w1, flame_tensor_t w3, flame_tensor_t w2,
                                          flame_tensor_t* out) {
  return tensor_op("flame_swiglu_mlp", {{x, "x"}, {w1, "w1"}, {w3, "w3"}, {w2, "w2"}}, out,
                   [&](const Tensor& t, const Tensor& w1t, const Tensor& w3t, const Tensor& w2t) { return ops::swiglu_mlp(t, w1t, w3t, w2t); });
}

}  // extern "C"
