// cuDNN for FLAME's convolutions and attention: libcudnn.so.9 loaded at run time with dlopen (never
// a link-time dependency), per context, on the first convolution or attention. When it is missing,
// fails to load, or the context was created with FLAME_DISABLE_CUDNN=1, the convolutions and the
// attention run FLAME's own kernels (cuda/conv.cuh, cuda/attention.cuh), which always exist;
// ops/conv.cpp and ops/attention.cpp decide per call. The attention graphs are in cudnn_sdpa.cpp.
//
// The legacy convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter) with
// explicit-stride tensor descriptors, one memory format per call (NCHW or NHWC for all three
// tensors), f32 compute. A per-context plan cache keyed by every geometry, dtype and option field
// holds the descriptors and the deterministic algorithms of cuDNN's heuristic (in its order), so a
// repeated call builds nothing and queries nothing. Only deterministic algorithms are used (FLAME
// documents deterministic convolutions), never FFT ones, and f32 stays IEEE (CUDNN_FMA_MATH)
// unless the context allows TF32.
#pragma once
#include <cuda.h>
#include <cstdint>
#include <memory>
#include <string>
#include "core/dtype.h"

namespace flame {

class Context;

enum class CudnnDir : int32_t {
  Forward,         // y = conv(x, w) + beta y
  BackwardData,    // x = conv^T(y, w) + beta x   (the input gradient; conv_transpose2d)
  BackwardFilter,  // w = wgrad(y, x)             (the weight gradient)
};

// One convolution in cuDNN's terms: x [N, C, H, W], w [O, C / G, kh, kw], y [N, O, Ho, Wo], each
// dense in one memory format: NCHW, or NHWC (w as [O][kh][kw][C / G]) when channels_last. The
// padding is symmetric (ph rows before and after); Ho and Wo must be what that padding gives.
// Pointers must be 16-byte aligned. beta_one: the result is added to what the output holds (a
// bias written there first); otherwise it is overwritten.
struct CudnnConv {
  CudnnDir dir = CudnnDir::Forward;
  DType dtype = FLAME_DTYPE_F32;
  bool channels_last = false;
  bool beta_one = false;
  int64_t N = 0, C = 0, H = 0, W = 0, O = 0, kh = 0, kw = 0, G = 1;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, Ho = 0, Wo = 0;
  CUdeviceptr x = 0, w = 0, y = 0;
};

// One scaled-dot-product attention in cuDNN's fused flash-attention graph (runtime/cudnn_sdpa.cpp):
// q [B, H, Sq, D], k and v [B, H, Sk, D] of one dtype (f16/bf16), last dim contiguous, the strides
// of the first three dims as given (elements, each a multiple of 8), 16-byte aligned addresses,
// D % 8 == 0 and D <= 128; causal: top-left (query i sees keys j <= i). o [B, H, Sq, D] has the
// strides o_st (dims 0..2, the last one 1; e.g. [B, Sq, H, D] memory); dq, dk, dv are contiguous; stats f32 [B, H, Sq] holds the natural-log log-sum-exp of the
// scaled scores of each row (cuDNN's "Stats": max + log(sum exp(s - max))). backward reads q, k, v,
// o, stats and dout (strides do_st) and writes dq, dk, dv; the forward writes o and stats.
struct CudnnSdpa {
  bool backward = false;
  DType dtype = FLAME_DTYPE_F16;
  bool causal = false;
  int64_t B = 0, H = 0, Sq = 0, Sk = 0, D = 0;
  int64_t q_st[3] = {0, 0, 0}, k_st[3] = {0, 0, 0}, v_st[3] = {0, 0, 0}, do_st[3] = {0, 0, 0}, o_st[3] = {0, 0, 0};
  float scale = 1.0f;  // passed by value: one plan serves every scale
  CUdeviceptr q = 0, k = 0, v = 0, o = 0, stats = 0, dout = 0, dq = 0, dk = 0, dv = 0;
};

struct CudnnSdpaCache;  // plans of runtime/cudnn_sdpa.cpp
struct CudnnSdpaCacheDeleter {
  void operator()(CudnnSdpaCache* c) const noexcept;
};

class Cudnn {
 public:
  // Loads libcudnn.so.9 (or $FLAME_CUDNN_PATH), creates a handle on the context's stream. Throws
  // (FLAME_ERROR_UNSUPPORTED with the reason) when that fails; cudnn(ctx) below catches it.
  explicit Cudnn(Context& ctx);
  ~Cudnn();
  Cudnn(const Cudnn&) = delete;
  Cudnn& operator=(const Cudnn&) = delete;

  // Runs c on the context's stream. Returns false (having written nothing) when cuDNN has no
  // deterministic algorithm for it: the caller then runs FLAME's kernels. Throws on other failures.
  bool run(const CudnnConv& c);

  // Runs a through cuDNN's fused attention on the context's stream (runtime/cudnn_sdpa.cpp).
  // Returns false, having written nothing, when cuDNN cannot build a plan for a's shapes, strides,
  // dtype and mask on this GPU (remembered per key: never retried): the caller runs FLAME's
  // kernels. Throws (FLAME_ERROR_CUDA naming the call, or OUT_OF_MEMORY) when executing fails.
  bool attention(const CudnnSdpa& a);

  int32_t version = 0;          // cudnnGetVersion(), e.g. 91900
  uint64_t convolutions = 0;    // successful run() calls (flame_ctx_cudnn_info)
  uint64_t plans_built = 0;     // plan cache misses
  uint64_t attentions = 0;      // forward attentions run by attention() (flame_ctx_cudnn_attention_info)
  uint64_t attention_grads = 0; // backward attentions run by attention()
  bool log_refusals = false;    // $FLAME_CUDNN_LOG=1 at load: log at INFO (not DEBUG) why an attention plan was refused

  // For runtime/cudnn_sdpa.cpp: the dlopen handle of the library and the cudnnHandle_t.
  void* library() const;
  void* raw_handle() const;
  Context& context() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<CudnnSdpaCache, CudnnSdpaCacheDeleter> sdpa_;  // destroyed before impl_ (the handle)
};

// The context's cuDNN, loaded on the first call; nullptr when the context does not use it
// (FLAME_DISABLE_CUDNN=1 at creation, or loading failed: ctx.cudnn_unavailable says why).
Cudnn* cudnn(Context& ctx);

}  // namespace flame
