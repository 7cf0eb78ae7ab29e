// C entry points of the convolutions (ops/conv.h). The options struct is read here (only its first
// struct_size bytes, so callers built against an older, shorter struct keep working); the ops check
// shapes, dtypes and values.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include "api/autocast.h"
#include "api/guard.h"
#include "ops/conv.h"

using namespace flame;

namespace {

// The size of the first version of flame_conv_options_t: every caller's struct has at least these fields.
constexpr size_t kOptionsV1 = offsetof(flame_conv_options_t, padding_same) + sizeof(int32_t);

void defaults(flame_conv_options_t* o) {
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->stride[0] = o->stride[1] = 1;
  o->dilation[0] = o->dilation[1] = 1;
  o->groups = 1;
}

ops::ConvArgs read_options(const flame_conv_options_t* opts) {
  flame_conv_options_t o;
  defaults(&o);
  if (opts) {
    FLAME_CHECK(opts->struct_size >= kOptionsV1 && opts->struct_size <= 4096, FLAME_ERROR_INVALID_ARGUMENT,
                "opts->struct_size is ", opts->struct_size, "; set it with flame_conv_options_init");
    std::memcpy(&o, opts, std::min(opts->struct_size, sizeof o));
  }
  FLAME_CHECK(o.padding_same == 0 || o.padding_same == 1, FLAME_ERROR_INVALID_ARGUMENT, "opts->padding_same must be 0 or 1, got ",
              o.padding_same);
  ops::ConvArgs a;
  for (int i = 0; i < 2; ++i) {
    a.stride[i] = o.stride[i];
    a.padding[i] = o.padding[i];
    a.dilation[i] = o.dilation[i];
    a.output_padding[i] = o.output_padding[i];
  }
  a.groups = o.groups;
  a.same = o.padding_same != 0;
  return a;
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_conv_options_init(flame_conv_options_t* opts) {
  return api_call("flame_conv_options_init", [&] {
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    defaults(opts);
  });
}

FLAME_API flame_status_t flame_conv2d(flame_tensor_t x, flame_tensor_t weight, flame_tensor_t bias,
                                      const flame_conv_options_t* opts, flame_tensor_t* out) {
  return api_call("flame_conv2d", [&] {
    out_param(out, "out");
    const ops::ConvArgs a = read_options(opts);  // before any handle is read
    auto [xt, wt, bt] = unwrap_args({{x, "x"}, {weight, "weight"}, {bias, "bias", true}});
    LiveScope s(xt);
    *out = wrap(ops::conv2d(autocast_low(xt), autocast_low(wt), autocast_low(bt), a));  // api/autocast.h
  });
}

FLAME_API flame_status_t flame_conv_transpose2d(flame_tensor_t x, flame_tensor_t weight, flame_tensor_t bias,
                                                const flame_conv_options_t* opts, flame_tensor_t* out) {
  return api_call("flame_conv_transpose2d", [&] {
    out_param(out, "out");
    const ops::ConvArgs a = read_options(opts);  // before any handle is read
    auto [xt, wt, bt] = unwrap_args({{x, "x"}, {weight, "weight"}, {bias, "bias", true}});
    LiveScope s(xt);
    *out = wrap(ops::conv_transpose2d(autocast_low(xt), autocast_low(wt), autocast_low(bt), a));  // api/autocast.h
  });
}

FLAME_API flame_status_t flame_conv1d(flame_tensor_t x, flame_tensor_t weight, flame_tensor_t bias,
                                      const flame_conv_options_t* opts, flame_tensor_t* out) {
  return api_call("flame_conv1d", [&] {
    out_param(out, "out");
    const ops::ConvArgs a = read_options(opts);  // before any handle is read
    auto [xt, wt, bt] = unwrap_args({{x, "x"}, {weight, "weight"}, {bias, "bias", true}});
    LiveScope s(xt);
    *out = wrap(ops::conv1d(autocast_low(xt), autocast_low(wt), autocast_low(bt), a));  // api/autocast.h
  });
}

}  // extern "C"
