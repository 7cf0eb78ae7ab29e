// C entry points of scaled-dot-product attention (ops/attention.h): handles, contexts and the
// options struct are checked here; shapes, dtypes and values by the op.
#include <algorithm>
#include <cstring>
#include "api/autocast.h"
#include "api/guard.h"
#include "ops/attention.h"

using namespace flame;

namespace {

ops::AttentionOptions options_arg(const flame_attention_options_t* opts) {
  ops::AttentionOptions o;
  if (!opts) return o;
  FLAME_CHECK(opts->struct_size >= sizeof(flame_attention_options_t) && opts->struct_size <= 4096,
              FLAME_ERROR_INVALID_ARGUMENT, "opts->struct_size is ", opts->struct_size,
              "; set it to sizeof(flame_attention_options_t) (flame_attention_options_init does)");
  flame_attention_options_t v;
  std::memcpy(&v, opts, sizeof v);  // the fields this version knows
  FLAME_CHECK((v.flags & ~static_cast<uint32_t>(FLAME_ATTENTION_CAUSAL)) == 0, FLAME_ERROR_INVALID_ARGUMENT,
              "opts->flags has unknown bits (", v.flags, ")");
  o.causal = (v.flags & FLAME_ATTENTION_CAUSAL) != 0;
  o.scale = v.scale;
  o.dropout_p = v.dropout_p;
  return o;
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_attention_options_init(flame_attention_options_t* opts) {
  return api_call("flame_attention_options_init", [&] {
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    *opts = flame_attention_options_t{};
    opts->struct_size = sizeof(flame_attention_options_t);
  });
}

FLAME_API flame_status_t flame_scaled_dot_product_attention(flame_tensor_t q, flame_tensor_t k, flame_tensor_t v,
                                                            flame_tensor_t mask, const flame_attention_options_t* opts,
                                                            flame_tensor_t* out) {
  return api_call("flame_scaled_dot_product_attention", [&] {
    out_param(out, "out");
    const Tensor& tq = unwrap(q, "q");
    const Tensor& tk = unwrap(k, "k");
    const Tensor& tv = unwrap(v, "v");
    Tensor tm = mask ? unwrap(mask, "mask") : nullptr;
    FLAME_CHECK(&tk->ctx() == &tq->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "k belongs to another context than q");
    FLAME_CHECK(&tv->ctx() == &tq->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "v belongs to another context than q");
    FLAME_CHECK(!tm || &tm->ctx() == &tq->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "mask belongs to another context than q");
    LiveScope scope(tq);
    const ops::AttentionOptions o = options_arg(opts);
    // autocast (api/autocast.h): f32 q, k, v and an additive f32 mask in the low dtype
    *out = wrap(ops::scaled_dot_product_attention(autocast_low(tq), autocast_low(tk), autocast_low(tv), autocast_low(tm), o));
  });
}

}  // extern "C"
