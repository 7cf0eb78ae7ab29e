// cuBLASLt for FLAME's matrix products. One handle per context (created on first use), a 32 MiB
// workspace from the context's pool, and a plan cache: a descriptor set (matmul desc + 3 layouts)
// and the heuristic's algorithm per problem key (sizes, leading dims, batch strides, transposes,
// dtype, compute mode, epilogue and pointer alignment), so that a repeated call only patches the
// pointers and launches. Everything is column-major here; ops/matmul.cpp maps row-major tensors.
#pragma once
#include <cuda.h>
#include <cstdint>
#include <memory>
#include "core/dtype.h"

namespace flame {

class Context;

enum class Epilogue : int32_t {
  None,
  Bias,          // D = A B + bias (bias has D's row count)
  Relu,          // D = relu(A B)
  ReluBias,      // D = relu(A B + bias)
  Gelu,          // D = gelu_tanh(A B)
  GeluBias,      // D = gelu_tanh(A B + bias)
  GeluAux,       // aux = A B, D = gelu_tanh(aux)
  GeluAuxBias,   // aux = A B + bias, D = gelu_tanh(aux)
  BgradB,        // D = A B, bias := sum of B over k (one value per column of D)
  ReluAux,       // D = relu(A B), aux := bit mask of D > 0 (aux_ld in bits, a multiple of 128)
  ReluAuxBias,   // D = relu(A B + bias), aux := bit mask
  DRelu,         // D = (A B) * mask(aux): relu's backward from the forward's bit mask
  DGelu,         // D = (A B) * gelu_tanh'(aux): gelu's backward from the forward's pre-activation
};

// Epilogues that read or write the aux buffer (relu: a bit mask; gelu: the pre-activation).
inline bool uses_aux(Epilogue e) { return e >= Epilogue::GeluAux && e != Epilogue::BgradB; }

// One operand as cuBLASLt stores it: a column-major rows x cols matrix with leading dim ld,
// used transposed when trans is set, batch_stride elements between batch entries (0 = shared).
struct GemmOperand {
  CUdeviceptr ptr = 0;
  bool trans = false;
  int64_t rows = 0, cols = 0, ld = 0, batch_stride = 0;
};

// D (m x n, column-major, ld ldd) = alpha * op(A) op(B) [epilogue], batch entries with strides.
struct GemmCall {
  DType dtype = FLAME_DTYPE_F32;  // of A, B and D
  bool d_f32 = false;             // D (and the bias gradient) in f32 instead, with f16/bf16 A and B
  int64_t m = 0, n = 0, k = 0, batch = 1;
  GemmOperand a, b;
  CUdeviceptr d = 0;
  int64_t ldd = 0, d_batch_stride = 0;
  Epilogue epilogue = Epilogue::None;
  CUdeviceptr bias = 0;  // bias (read) or bias gradient (written), dtype of D
  CUdeviceptr aux = 0;   // uses_aux(epilogue): gelu pre-activation (dtype of D) or relu bit mask
  int64_t aux_ld = 0;    // in elements (gelu, a multiple of 8) or bits (relu, a multiple of 128)
};

class Blas {
 public:
  explicit Blas(Context& ctx);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // Runs the product on the context's stream. Returns false (and does nothing) when cuBLASLt has no
  // algorithm for this epilogue, shape and alignment: the caller then computes the same result
  // with separate kernels. Throws for any other failure.
  bool gemm(const GemmCall& call);
  // Epilogues off (FLAME_DISABLE_EPILOGUES=1 at context creation): every epilogue takes the
  // separate-kernel path, which the tests compare against the fused one.
  bool epilogues_enabled = true;
  uint64_t plans_built = 0;  // for tests: cache misses (descriptor set + heuristic query)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The context's Blas, created on first use.
Blas& blas(Context& ctx);

}  // namespace flame
