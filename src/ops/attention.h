// Scaled-dot-product attention (src/ops/attention.cpp, kernels in cuda/attention.cuh), with the
// semantics of torch.nn.functional.scaled_dot_product_attention.
//
// f16/bf16 with head dims up to 128 on sm_80+ run the fused kernels and record one Attention node
// saving q, k, v, the output and the per-row log-sum-exp (base 2); where the context uses cuDNN and
// there is no mask, no dropout, D == Dv, D % 8 == 0 and D <= 128, cuDNN's fused flash attention
// (runtime/cudnn_sdpa.cpp) runs instead when it has a plan, saving its natural-log Stats, and the
// backward then runs through cuDNN as well (or FLAME's kernels on lse = Stats log2(e)); its rule (autograd/backward_rules.cpp)
// runs the fused backward, or under create_graph attention_backward_composed. Everything else (f32,
// f64, larger head dims, older GPUs) is composed of FLAME ops (matmul, softmax, where; f16/bf16 in
// f32) and differentiates through them. Both paths draw dropout from the same Philox counters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "tensor/autograd_graph.h"
#include "tensor/tensor.h"

namespace flame::ops {

struct AttentionOptions {
  bool causal = false;   // query i attends to keys j <= i
  double scale = 0;      // 0: 1 / sqrt(head dim)
  double dropout_p = 0;  // in [0, 1)
};

// q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv] of one floating dtype; mask (may be null): bool
// (true = attend) or additive in q's dtype, broadcastable to [B, H, Lq, Lk]. Returns [B, H, Lq, Dv].
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    const AttentionOptions& opts);

// ---- what the rule of an Attention node reads back ----
struct AttentionSaved {
  Tensor q, k, v, mask, out, lse;  // lse: f32 [B, H, Lq], base-2 log-sum-exp of the scaled scores
  bool cudnn_stats = false;        // lse holds cuDNN's Stats instead: the natural-log log-sum-exp
  bool causal = false;
  double scale = 1, dropout_p = 0;
  uint64_t seed = 0, offset = 0;  // the Philox key and first counter of the dropout mask
};
AttentionSaved unpack_attention(Node& n);
struct AttentionAttrs {  // node attributes of Attention (saved: q, k, v, out, lse, then the mask if any)
  bool causal = false, has_mask = false;
  bool cudnn_stats = false;  // lse holds cuDNN's Stats
  uint64_t seed = 0, offset = 0;
  double scale = 1, dropout_p = 0;
};

struct AttentionGrads {
  Tensor dq, dk, dv, dmask;  // dmask only when asked for (an additive mask that requires grad)
};
// The fused backward kernels for gradient g of the output (no graph of the backward is built).
AttentionGrads attention_backward(const AttentionSaved& s, const Tensor& g, bool need_dmask);
// The same gradients composed of FLAME ops in f32 (recomputing the probabilities), so that they can
// be differentiated again.
AttentionGrads attention_backward_composed(const AttentionSaved& s, const Tensor& g, bool need_dmask);

// Every kernel instantiation the attention ops may launch (for the CPU kernel-compile test).
std::vector<std::string> attention_instantiations();

}  // namespace flame::ops
