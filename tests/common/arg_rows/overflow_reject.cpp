// Rejection rows for sizes whose element count or byte size overflows int64 (issue 32): every op
// that makes or broadcasts a shape (creation, expand, view, reshape, binary and ternary broadcasts,
// matmul batch broadcasts, masked_select, repeat, repeat_interleave, cat, stack, pad, to_host) must
// refuse them with FLAME_ERROR_INVALID_ARGUMENT, a message naming the sizes, OUT NULL and nothing
// left behind. The inputs are legal broadcast views of one-element tensors, so the rows need no
// memory: a [2^31, 2^31] view reads one float. The probe's cases are the first rows.
#include "arg_matrix.h"

namespace {

constexpr int64_t p(int n) { return int64_t{1} << n; }
constexpr int64_t kMax = INT64_MAX;
constexpr flame_status_t kInvalid = FLAME_ERROR_INVALID_ARGUMENT;

}  // namespace

// ---- expand: the only view op that adds elements ----
FLAME_ARG_REJECT("expand: [1] to [2^40, 2^40] (the probe: 2^80 elements)", kInvalid, "elements",
                 return flame_expand(in.full({1}), in.shape({p(40), p(40)}), 2, out););
FLAME_ARG_REJECT("expand: [1, 4] to [2^62 + 1, 4] (the probe: 2^64 + 4 elements)", kInvalid, "elements",
                 return flame_expand(in.full({1, 4}), in.shape({p(62) + 1, 4}), 2, out););
FLAME_ARG_REJECT("expand: [1] to [2^62, 4] (a new leading dim)", kInvalid, "elements",
                 return flame_expand(in.full({1}), in.shape({p(62), 4}), 2, out););
FLAME_ARG_REJECT("expand: a legal [2^31, 2^31] view to [4, 2^31, 2^31]", kInvalid, "elements",
                 return flame_expand(in.broadcast({1, 1}, {p(31), p(31)}), in.shape({4, p(31), p(31)}), 3, out););
FLAME_ARG_REJECT("expand: [1, 1] to [0, 2^62, 4] (empty, but its strides would overflow)", kInvalid, "elements",
                 return flame_expand(in.full({1, 1}), in.shape({0, p(62), 4}), 3, out););
FLAME_ARG_REJECT("expand: [1] to [2^63 - 1, 2]", kInvalid, "elements",
                 return flame_expand(in.full({1}), in.shape({kMax, 2}), 2, out););

// ---- view and reshape: requested sizes whose product overflows ----
FLAME_ARG_REJECT("view: [2, 3] as [2^40, 2^40]", kInvalid, "elements",
                 return flame_view(in.full({2, 3}), in.shape({p(40), p(40)}), 2, out););
FLAME_ARG_REJECT("view: a [2^31, 2^31] view as [2^62 + 1, 4]", kInvalid, "elements",
                 return flame_view(in.broadcast({1, 1}, {p(31), p(31)}), in.shape({p(62) + 1, 4}), 2, out););
FLAME_ARG_REJECT("reshape: [2, 2] as [2^62 + 1, 4] (2^64 + 4 wraps to 4)", kInvalid, "elements",
                 return flame_reshape(in.full({2, 2}), in.shape({p(62) + 1, 4}), 2, out););
FLAME_ARG_REJECT("reshape: [2, 3] as [-1, 2^40, 2^40]", kInvalid, "elements",
                 return flame_reshape(in.full({2, 3}), in.shape({-1, p(40), p(40)}), 3, out););
FLAME_ARG_REJECT("reshape: a [2^62] view as [2^62, 2^62]", kInvalid, "elements",
                 return flame_reshape(in.broadcast({1}, {p(62)}), in.shape({p(62), p(62)}), 2, out););

// ---- broadcasts of binary and ternary ops ----
FLAME_ARG_REJECT("add: [2^40, 1] + [1, 2^40] views", kInvalid, "elements",
                 return flame_add(in.broadcast({1, 1}, {p(40), 1}), in.broadcast({1, 1}, {1, p(40)}), out););
FLAME_ARG_REJECT("mul: a [2^62 + 1, 1] view * [4]", kInvalid, "elements",
                 return flame_mul(in.broadcast({1, 1}, {p(62) + 1, 1}), in.full({4}), out););
FLAME_ARG_REJECT("sub: [2^32, 1, 1] - [1, 2^32, 1] views (2^64 elements)", kInvalid, "elements",
                 return flame_sub(in.broadcast({1, 1, 1}, {p(32), 1, 1}), in.broadcast({1, 1, 1}, {1, p(32), 1}), out););
FLAME_ARG_REJECT("add: [2^31, 1] + [1, 2^31] f32 views: 2^62 elements, 2^64 bytes", kInvalid, "overflows",
                 return flame_add(in.broadcast({1, 1}, {p(31), 1}), in.broadcast({1, 1}, {1, p(31)}), out););
FLAME_ARG_REJECT("where: [2^40, 1, 1] bool, [1, 2^40, 1] and [1] views", kInvalid, "elements",
                 return flame_where(in.broadcast({1, 1, 1}, {p(40), 1, 1}, FLAME_DTYPE_BOOL),
                                    in.broadcast({1, 1, 1}, {1, p(40), 1}), in.full({1}), out););
FLAME_ARG_REJECT("matmul: batch dims [2^40, 1] and [1, 2^40] of [2, 2] matrices", kInvalid, "elements",
                 return flame_matmul(in.broadcast({1, 1, 2, 2}, {p(40), 1, 2, 2}), in.broadcast({1, 1, 2, 2}, {1, p(40), 2, 2}),
                                     out););
FLAME_ARG_REJECT("masked_select: a [2^40, 1] view by a [1, 2^40] mask", kInvalid, "elements",
                 return flame_masked_select(in.broadcast({1, 1}, {p(40), 1}),
                                            in.broadcast({1, 1}, {1, p(40)}, FLAME_DTYPE_BOOL), out););

// ---- ops whose output shape grows: repeat, repeat_interleave, cat, stack, pad ----
FLAME_ARG_REJECT("repeat: [2, 3] by [2^62, 1] (a size of 2^63)", kInvalid, "overflows",
                 return flame_repeat(in.full({2, 3}), in.shape({p(62), 1}), 2, out););
FLAME_ARG_REJECT("repeat: [2, 3] by [2^31, 2^31] (3 * 2^63 elements)", kInvalid, "elements",
                 return flame_repeat(in.full({2, 3}), in.shape({p(31), p(31)}), 2, out););
FLAME_ARG_REJECT("repeat_interleave: a [2^62] view twice along dim 0", kInvalid, "overflows",
                 return flame_repeat_interleave(in.broadcast({1}, {p(62)}), 2, 0, out););
FLAME_ARG_REJECT("cat: two [2^62] views (a size of 2^63)", kInvalid, "overflows",
                 flame_tensor_t v = in.broadcast({1}, {p(62)});
                 return flame_cat(in.list({v, v}), 2, 0, out););
FLAME_ARG_REJECT("cat: two [2^40, 2^22] views along dim 1 (2^63 elements)", kInvalid, "elements",
                 flame_tensor_t v = in.broadcast({1, 1}, {p(40), p(22)});
                 return flame_cat(in.list({v, v}), 2, 1, out););
FLAME_ARG_REJECT("stack: four [2^62] views", kInvalid, "stack: shape [4, 4611686018427387904]",
                 flame_tensor_t v = in.broadcast({1}, {p(62)});
                 return flame_stack(in.list({v, v, v, v}), 4, 0, out););
FLAME_ARG_REJECT("pad: a [2^63 - 1] view by one element", kInvalid, "overflows",
                 return flame_pad(in.broadcast({1}, {kMax}), in.shape({1, 0}), 2, FLAME_PAD_CONSTANT, 0.0, out););

// ---- creation and copies: the same check and the same message ----
FLAME_ARG_REJECT("zeros: [2^62 + 1, 4] (the probe's sizes)", kInvalid, "elements",
                 return flame_zeros(in.ctx(), in.shape({p(62) + 1, 4}), 2, FLAME_DTYPE_F32, out););
FLAME_ARG_REJECT("to_host: a [2^62] f32 view (2^64 bytes)", kInvalid, "overflows",
                 (void)out;
                 static float sink[4];
                 return flame_to_host(in.broadcast({1}, {p(62)}), sink, sizeof sink););
