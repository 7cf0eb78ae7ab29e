// Neural-network ops of FLAME_NN_OPS (src/tensor/op_list.h): softmax, log_softmax and the
// normalisations. Each forward is one fused kernel (cuda/softmax.cuh, cuda/norm.cuh) and records one
// node saving what its backward needs (softmax: the output; norms: x, the weight, and the mean and
// rstd the kernel wrote, in f32, or f64 for f64 inputs). The backward rules
// (autograd/backward_rules.cpp) call the fused backward functions below when no graph is being
// built, and compose FLAME ops otherwise (create_graph), so second derivatives work.
#pragma once
#include <string>
#include <vector>
#include "tensor/tensor.h"

namespace flame::ops {

// ---- forward (recorded) ----
Tensor softmax(const Tensor& x, int64_t dim, bool log);
// normalized_shape: the trailing dims of x normalised over; weight and bias may be null.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias, double eps);
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps);
// x: [N, C, *] (channels_last: [N, *, C]); weight/bias: [C] or null.
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps, bool channels_last);
// x: [N, C, *]. Training: batch statistics; running_mean/var (both or neither) updated in place.
// Eval: normalises with the running statistics, which must be given.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps);

// ---- fused backward (internal ops: recorded only to fail if a graph would be built through them) ----
// Gradient of softmax / log_softmax along dim given the output y.
Tensor softmax_backward(const Tensor& g, const Tensor& y, int dim, bool log);

// Node attributes of LayerNorm / RmsNorm / GroupNorm.
struct NormAttrs {
  int64_t k_or_groups = 0;  // layer/rms: how many trailing dims are normalised; group: the groups
  bool has_weight = false, has_bias = false;
  double eps = 0;
};
// Node attributes of BatchNorm.
struct BatchNormAttrs {
  bool training = false, has_weight = false, has_bias = false;
  double eps = 0;
};

enum class NormKind { Layer, Rms, Group };
// How a norm's rows map onto x: rows of D elements; Group: rows are (n, group), D = (C / G) * HW.
struct NormGeometry {
  int64_t rows = 0, D = 0;
  int64_t groups = 1, hw = 1, N = 0, C = 0;  // Group only
};
struct NormGrads {
  Tensor dx, dw, db;
};
// Gradients of layer/rms/group norm from saved x, weight (may be null), mean (null for RMS), rstd.
NormGrads norm_backward(NormKind kind, const NormGeometry& geo, const Tensor& g, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, bool need_dx, bool need_dw, bool need_db);
// Geometry of a recorded layer/rms norm over the last k dims of shape, or of a group norm.
NormGeometry norm_geometry(NormKind kind, const Shape& shape, int64_t k_or_groups);
// Gradients of batch_norm from saved x, weight (may be null), mean and rstd (batch statistics in
// training, running statistics in eval).
NormGrads batch_norm_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, bool training, bool need_dx, bool need_dw, bool need_db);

// ---- every kernel instantiation these ops may launch (for the CPU kernel-compile test) ----
std::vector<std::string> softmax_kernel_instantiations();
std::vector<std::string> norm_kernel_instantiations();

}  // namespace flame::ops
