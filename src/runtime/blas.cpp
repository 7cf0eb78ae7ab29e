// cuBLASLt plans and launches (see blas.h). A plan is built once per key: the matmul descriptor
// with compute type, transposes and epilogue, the three layouts (C and D share one: D is written
// in place with beta = 0), and the first algorithm of the heuristic for the actual pointer
// alignment (set as preferences, so unaligned tensors get an algorithm that accepts them).
#include "runtime/blas.h"
#include <cublasLt.h>
#include <array>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include "core/error.h"
#include "runtime/context.h"

namespace flame {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what cuBLASLt's Hopper kernels want
constexpr size_t kMaxPlans = 4096;                    // a model has a few hundred shapes; bound it anyway
constexpr int kCandidates = 8;                        // heuristic results timed once per plan (autotune)

void check_blas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  flame_status_t st = s == CUBLAS_STATUS_ALLOC_FAILED ? FLAME_ERROR_OUT_OF_MEMORY : FLAME_ERROR_CUDA;
  fail(st, "cuBLASLt ", what, " failed: ", cublasLtGetStatusString(s));
}

cudaDataType_t cuda_type(DType d) {
  check_compute_dtype(d, "cuBLASLt matrix products");
  switch (d) {
    case FLAME_DTYPE_F32: return CUDA_R_32F;
    case FLAME_DTYPE_F64: return CUDA_R_64F;
    case FLAME_DTYPE_F16: return CUDA_R_16F;
    case FLAME_DTYPE_BF16: return CUDA_R_16BF;
    default: fail(FLAME_ERROR_DTYPE_MISMATCH, "matrix products take f32, f64, f16 or bf16, not ", dtype_name(d));
  }
}

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::Relu: return CUBLASLT_EPILOGUE_RELU;
    case Epilogue::ReluBias: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case Epilogue::Gelu: return CUBLASLT_EPILOGUE_GELU;
    case Epilogue::GeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::GeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::BgradB: return CUBLASLT_EPILOGUE_BGRADB;
    case Epilogue::ReluAux: return CUBLASLT_EPILOGUE_RELU_AUX;
    case Epilogue::ReluAuxBias: return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case Epilogue::DRelu: return CUBLASLT_EPILOGUE_DRELU;
    case Epilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The largest power of two (up to 256, cuBLASLt's default assumption) dividing a device address.
int64_t alignment(CUdeviceptr p) {
  if (p == 0) return 256;
  int64_t a = 1;
  while (a < 256 && (p % static_cast<CUdeviceptr>(2 * a)) == 0) a *= 2;
  return a;
}

DType d_type_of(const GemmCall& c) { return c.d_f32 ? FLAME_DTYPE_F32 : c.dtype; }

// All fields of a problem that change the plan; a flat int64 array has no padding to compare.
using PlanKey = std::array<int64_t, 28>;

PlanKey make_key(const GemmCall& c, bool tf32) {
  const GemmOperand &a = c.a, &b = c.b;
  return {c.dtype, tf32, static_cast<int64_t>(c.epilogue), c.m, c.n, c.k, c.batch,
          a.trans, a.rows, a.cols, a.ld, a.batch_stride, b.trans, b.rows, b.cols, b.ld, b.batch_stride,
          c.ldd, c.d_batch_stride, c.aux_ld, alignment(a.ptr), alignment(b.ptr), alignment(c.d),
          alignment(c.bias), alignment(c.aux), d_type_of(c), 0, 0};
}

struct KeyHash {
  size_t operator()(const PlanKey& k) const noexcept {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
    return static_cast<size_t>(h ^ (h >> 32));
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};  // the heuristic's first choice until tuning picks the fastest
  std::array<cublasLtMatmulAlgo_t, kCandidates> candidates{};
  int n_candidates = 0;
  bool supported = false;
  bool tuned = false;
  void destroy() noexcept {
    if (desc) cublasLtMatmulDescDestroy(desc);
    for (auto l : {la, lb, ld})
      if (l) cublasLtMatrixLayoutDestroy(l);
    desc = nullptr;
    la = lb = ld = nullptr;
  }
};

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v, const char* what) {
  check_blas(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v), what);
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_blas(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
             "layout create");
  if (batch > 1) {
    int32_t count = static_cast<int32_t>(batch);
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                     sizeof batch_stride);
  }
  return l;
}

}  // namespace

struct Blas::Impl {
  Context& ctx;
  cublasLtHandle_t handle = nullptr;
  CUdeviceptr workspace = 0;
  std::unordered_map<PlanKey, Plan, KeyHash> plans;

  explicit Impl(Context& c) : ctx(c) {}
  ~Impl() {
    for (auto& kv : plans) kv.second.destroy();
    if (handle) cublasLtDestroy(handle);
    if (workspace) ctx.deallocate(workspace, kWorkspaceBytes);
  }

  cublasStatus_t launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const GemmCall& c) {
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const bool f64 = c.dtype == FLAME_DTYPE_F64;
    const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one_f;
    const void* beta = f64 ? static_cast<const void*>(&zero_d) : &zero_f;
    void* d = reinterpret_cast<void*>(c.d);
    ++ctx.drv.counters.launches;
    return cublasLtMatmul(handle, p.desc, alpha, reinterpret_cast<const void*>(c.a.ptr), p.la,
                          reinterpret_cast<const void*>(c.b.ptr), p.lb, beta, d, p.ld, d, p.ld, &algo,
                          reinterpret_cast<void*>(workspace), kWorkspaceBytes, reinterpret_cast<cudaStream_t>(ctx.stream));
  }

  // Autotune, once per plan on its first call: times each heuristic candidate on the call's own
  // buffers (beta = 0 and outputs never alias inputs, so the repeated writes are harmless) and
  // keeps the fastest. The heuristic's first choice is within a few percent for most shapes but up
  // to ~10% slower for some GPT-2 GEMMs on H200. One synchronisation per new shape.
  void tune(Plan& p, const GemmCall& c) {
    p.tuned = true;
    CUevent start = nullptr, stop = nullptr;
    ctx.check(ctx.drv.cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate");
    if (ctx.drv.cuEventCreate(&stop, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
      ctx.drv.cuEventDestroy(start);
      ctx.check(CUDA_ERROR_OUT_OF_MEMORY, "cuEventCreate");
    }
    float best = 0;
    bool have = false;
    for (int i = 0; i < p.n_candidates; ++i) {
      const cublasLtMatmulAlgo_t& algo = p.candidates[i];
      if (launch(p, algo, c) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a failing candidate is skipped
      ctx.drv.cuEventRecord(start, ctx.stream);
      bool ok = launch(p, algo, c) == CUBLAS_STATUS_SUCCESS && launch(p, algo, c) == CUBLAS_STATUS_SUCCESS;
      ctx.drv.cuEventRecord(stop, ctx.stream);
      float ms = 0;
      if (ctx.drv.cuEventSynchronize(stop) != CUDA_SUCCESS || ctx.drv.cuEventElapsedTime(&ms, start, stop) != CUDA_SUCCESS)
        break;  // a sticky fault: the real launch below reports it
      if (ok && (!have || ms < best)) {
        best = ms;
        have = true;
        p.algo = algo;
      }
    }
    ctx.drv.cuEventDestroy(start);
    ctx.drv.cuEventDestroy(stop);
  }

  Plan build(const GemmCall& c, bool tf32) {
    Plan p;
    const cudaDataType_t t = cuda_type(c.dtype);
    const bool f64 = c.dtype == FLAME_DTYPE_F64;
    cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    try {
      check_blas(cublasLtMatmulDescCreate(&p.desc, compute, f64 ? CUDA_R_64F : CUDA_R_32F), "descriptor create");
      cublasOperation_t ta = c.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta, "TRANSA");
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb, "TRANSB");
      p.la = make_layout(t, c.a.rows, c.a.cols, c.a.ld, c.batch, c.a.batch_stride);
      p.lb = make_layout(t, c.b.rows, c.b.cols, c.b.ld, c.batch, c.b.batch_stride);
      const cudaDataType_t td = cuda_type(d_type_of(c));  // f32 D of bf16 A, B: a gradient for an f32 tensor
      p.ld = make_layout(td, c.m, c.n, c.ldd, c.batch, c.d_batch_stride);
      if (c.epilogue != Epilogue::None) {
        // An epilogue this cuBLASLt rejects for these types is "unsupported", not an error.
        cublasLtEpilogue_t e = lt_epilogue(c.epilogue);
        int32_t bias_type = td;
        if (cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type) !=
                CUBLAS_STATUS_SUCCESS)
          return p;
        set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, reinterpret_cast<void*>(c.bias), "BIAS_POINTER");
        if (uses_aux(c.epilogue)) {
          set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, reinterpret_cast<void*>(c.aux), "AUX_POINTER");
          set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, c.aux_ld, "AUX_LD");
          int64_t aux_stride = c.aux_ld * c.n;
          if (c.batch > 1) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_stride, "AUX_BATCH_STRIDE");
        }
      }
      cublasLtMatmulPreference_t pref = nullptr;
      check_blas(cublasLtMatmulPreferenceCreate(&pref), "preference create");
      uint64_t ws = kWorkspaceBytes;
      uint32_t al[4] = {static_cast<uint32_t>(alignment(c.a.ptr)), static_cast<uint32_t>(alignment(c.b.ptr)),
                        static_cast<uint32_t>(alignment(c.d)), static_cast<uint32_t>(alignment(c.d))};
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      if (c.dtype == FLAME_DTYPE_F16 || c.dtype == FLAME_DTYPE_BF16) {
        // Split-K partial sums stay in f32: reductions in the output type (in place or in the
        // workspace) lose ~3 digits of a bf16 dot product of length 1000.
        uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme);
      }
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], sizeof al[3]);
      std::array<cublasLtMatmulHeuristicResult_t, kCandidates> results{};
      int found = 0;
      // Autotune only products large enough for the choice to matter (>= 2^30 multiply-adds, e.g.
      // 1024^3); small and degenerate ones keep the heuristic's first choice.
      const bool tune = ctx.gemm_autotune && static_cast<double>(c.m) * c.n * c.k * c.batch >= 1073741824.0;
      cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.la, p.lb, p.ld, p.ld, pref,
                                                        tune ? kCandidates : 1, results.data(), &found);
      cublasLtMatmulPreferenceDestroy(pref);
      if (s == CUBLAS_STATUS_SUCCESS && found > 0) {
        p.algo = results[0].algo;
        for (int i = 0; i < found; ++i)
          if (results[i].state == CUBLAS_STATUS_SUCCESS) p.candidates[p.n_candidates++] = results[i].algo;
        p.tuned = p.n_candidates <= 1;
        p.supported = true;
      } else if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) {
        check_blas(s, "heuristic query");
      }
    } catch (...) {
      p.destroy();
      throw;
    }
    return p;
  }
};

Blas::Blas(Context& ctx) : impl_(std::make_unique<Impl>(ctx)) {
  check_blas(cublasLtCreate(&impl_->handle), "handle create");
  impl_->workspace = ctx.allocate(kWorkspaceBytes);
  const char* off = std::getenv("FLAME_DISABLE_EPILOGUES");
  epilogues_enabled = !(off && std::strcmp(off, "1") == 0);
}

Blas::~Blas() = default;

bool Blas::gemm(const GemmCall& c) {
  if (c.epilogue != Epilogue::None && !epilogues_enabled) return false;
  Impl& I = *impl_;
  const bool tf32 = c.dtype == FLAME_DTYPE_F32 && I.ctx.allow_tf32;
  PlanKey key = make_key(c, tf32);
  auto it = I.plans.find(key);
  if (it == I.plans.end()) {
    if (I.plans.size() >= kMaxPlans) {
      for (auto& kv : I.plans) kv.second.destroy();
      I.plans.clear();
    }
    Plan p = I.build(c, tf32);
    ++plans_built;
    it = I.plans.emplace(key, p).first;
  }
  Plan& p = it->second;
  if (!p.supported) {
    if (c.epilogue != Epilogue::None || c.d_f32) return false;
    fail(FLAME_ERROR_UNSUPPORTED, "cuBLASLt has no algorithm for a ", dtype_name(c.dtype), " product of ", c.m, "x", c.k,
         " by ", c.k, "x", c.n, " (batch ", c.batch, ")");
  }
  if (c.epilogue != Epilogue::None) {  // pointers change per call; their alignment is part of the key
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, reinterpret_cast<void*>(c.bias), "BIAS_POINTER");
    if (uses_aux(c.epilogue))
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, reinterpret_cast<void*>(c.aux), "AUX_POINTER");
  }
  if (!p.tuned) {
    if (I.ctx.capture) p.tuned = true;  // timing needs synchronisation: the graph pins the heuristic's choice
    else I.tune(p, c);
  }
  check_blas(I.launch(p, p.algo, c), "matmul");
  return true;
}

Blas& blas(Context& ctx) {
  if (!ctx.blas) ctx.blas = std::make_unique<Blas>(ctx);
  return *ctx.blas;
}

}  // namespace flame
