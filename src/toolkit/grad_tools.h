// Fused gradient tools over lists of tensors (kernels in cuda/grad_tools.cuh): per-tensor
// normalisation, Gaussian noise from the context's generator, statistics, and the loss scaler's
// unscale-and-check. Each is a few launches for a whole list: one table of tensors and, per dtype,
// one table of 65536-element chunks. The in-place tools write strided tensors through a contiguous
// copy and bump every written tensor's version counter (saved tensors notice the change).
#pragma once
#include <string>
#include <vector>
#include "tensor/tensor.h"

namespace flame::toolkit {

// Must match cuda/grad_tools.cuh.
struct GtTensor {
  uint64_t ptr;
  int64_t numel, first_chunk, n_chunks, rng_base;
};
struct GtChunk {
  int64_t tensor, start, slot;
};
constexpr int kStatColumns = 6;  // norm, min, max, mean, NaN count, Inf count

// Checks a list for the tools: tensors of ctx, floating; `inplace` also refuses tensors that
// require grad while grad mode is on (the tools record nothing). Messages name "<name>[i]".
void check_tensor_list(Context& ctx, const std::vector<Tensor>& ts, const char* name, bool inplace);

// g <- g * target / (||g||_2 + eps), per tensor.
void normalize(Context& ctx, const std::vector<Tensor>& ts, double target, double eps);
// g <- g + std_dev * N(0, 1); element e of the list (counting across tensors in order) uses Philox
// counter offset + e of the context's generator, which advances by the total element count.
void add_noise(Context& ctx, const std::vector<Tensor>& ts, double std_dev);
// An f64 [n + 1, 6] tensor: one row per tensor, then the list as a whole (no synchronisation).
Tensor stats(Context& ctx, const std::vector<Tensor>& ts);
// g <- g * (1 / scale); found_inf (and found_any, when given) = 1 where a value is not finite.
// scale, found_inf and found_any are 0-d f32 device tensors.
void unscale(Context& ctx, const std::vector<Tensor>& ts, const Tensor& scale, const Tensor& found_inf,
             const Tensor& found_any);
// The scale update of a loss scaler on the device (scale f32, growth_tracker i32, found_inf f32).
void update_scale(Context& ctx, const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth,
                  double backoff, int64_t interval);

// Every kernel instantiation the tools may launch (the CPU kernel test compiles them all).
std::vector<std::string> grad_tools_instantiations();

}  // namespace flame::toolkit
