// cuDNN loading, plans and launches (see cudnn.h). The function table is filled with dlsym from
// libcudnn.so.9, whose front library exports the whole API and loads its sub-libraries (cnn, ops,
// engines) itself; types come from cudnn.h, function types from decltype, so nothing links.
//
// A plan per key: tensor and filter descriptors with explicit strides, the convolution descriptor,
// and the candidates of cudnnGet*Algorithm_v7 (heuristic order) that are deterministic, not FFT,
// of an allowed math type, and need at most kMaxWorkspace bytes (cudnnGet*WorkspaceSize, which is
// what the launch checks). A launch takes the first candidate; one that cuDNN then refuses
// (NOT_SUPPORTED) is dropped for good, and a plan with none left reports "no algorithm".
// Workspaces come from the context's pool per call (stream-ordered, so freeing right after the
// launch is safe and cheap).
#include "runtime/cudnn.h"
#include "core/error.h"
#include "runtime/context.h"

#if FLAME_WITH_CUDNN
#include <cudnn.h>
#include <dlfcn.h>
#include <array>
#include <cstdlib>
#include <unordered_map>
#include <vector>

namespace flame {

#define FLAME_CUDNN_FUNCTIONS(X)                                                                      \
  X(cudnnGetVersion) X(cudnnGetErrorString) X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream)           \
  X(cudnnCreateTensorDescriptor) X(cudnnDestroyTensorDescriptor) X(cudnnSetTensor4dDescriptorEx)      \
  X(cudnnCreateFilterDescriptor) X(cudnnDestroyFilterDescriptor) X(cudnnSetFilter4dDescriptor)        \
  X(cudnnCreateConvolutionDescriptor) X(cudnnDestroyConvolutionDescriptor)                            \
  X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionGroupCount) X(cudnnSetConvolutionMathType)  \
  X(cudnnGetConvolutionForwardAlgorithmMaxCount) X(cudnnGetConvolutionForwardAlgorithm_v7)            \
  X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnConvolutionForward)                               \
  X(cudnnGetConvolutionBackwardDataAlgorithmMaxCount) X(cudnnGetConvolutionBackwardDataAlgorithm_v7)  \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize) X(cudnnConvolutionBackwardData)                     \
  X(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount)                                               \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7) X(cudnnGetConvolutionBackwardFilterWorkspaceSize)  \
  X(cudnnConvolutionBackwardFilter)

namespace {

constexpr size_t kMaxWorkspace = size_t(1) << 30;  // algorithms wanting more are skipped
constexpr size_t kMaxPlans = 4096;                 // a model has a few hundred shapes; bound it anyway

// Families of cudnnStatus_t (the thousands digit): 2 bad parameter, 3 not supported.
bool refused(cudnnStatus_t s) {
  const int v = static_cast<int>(s);
  return v / 1000 == 2 || v / 1000 == 3 || s == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED;
}

cudnnDataType_t cudnn_type(DType d) {
  check_compute_dtype(d, "cuDNN convolutions");
  switch (d) {
    case FLAME_DTYPE_F32: return CUDNN_DATA_FLOAT;
    case FLAME_DTYPE_F16: return CUDNN_DATA_HALF;
    case FLAME_DTYPE_BF16: return CUDNN_DATA_BFLOAT16;
    default: fail(FLAME_ERROR_INTERNAL, "cuDNN convolution of dtype ", dtype_name(d));
  }
}

// Every field that changes a plan; a flat int64 array has no padding to compare.
using PlanKey = std::array<int64_t, 22>;

PlanKey make_key(const CudnnConv& c, bool tf32) {
  return {static_cast<int64_t>(c.dir), c.dtype, c.channels_last, tf32, c.N, c.C, c.H, c.W, c.O, c.kh, c.kw,
          c.G, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw, c.Ho, c.Wo, 0, 0};
}

struct KeyHash {
  size_t operator()(const PlanKey& k) const noexcept {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
    return static_cast<size_t>(h ^ (h >> 32));
  }
};

struct Candidate {
  int algo = 0;  // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  std::vector<Candidate> candidates;  // usable algorithms, best first
  size_t next = 0;                    // candidates before it were refused at launch
  cudnnMathType_t math_set = CUDNN_DEFAULT_MATH;
};

// Dense strides of [N, C, H, W] in the memory format: NCHW, or NHWC (C fastest).
std::array<int64_t, 4> dense_strides(int64_t C, int64_t H, int64_t W, bool nhwc) {
  if (nhwc) return {H * W * C, 1, W * C, C};
  return {C * H * W, H * W, W, 1};
}

}  // namespace

struct Cudnn::Impl {
#define FLAME_DECLARE_FN(name) decltype(&::name) name = nullptr;
  FLAME_CUDNN_FUNCTIONS(FLAME_DECLARE_FN)
#undef FLAME_DECLARE_FN
  Context& ctx;
  void* lib = nullptr;
  cudnnHandle_t handle = nullptr;
  std::unordered_map<PlanKey, Plan, KeyHash> plans;

  explicit Impl(Context& c) : ctx(c) {}
  ~Impl() {
    clear_plans();
    if (handle) cudnnDestroy(handle);
    if (lib) dlclose(lib);  // opened with RTLD_NODELETE: the code stays mapped for cuDNN's own exit handlers
  }

  void clear_plans() noexcept {
    for (auto& kv : plans) destroy(kv.second);
    plans.clear();
  }
  void destroy(Plan& p) noexcept {
    if (p.x) cudnnDestroyTensorDescriptor(p.x);
    if (p.y) cudnnDestroyTensorDescriptor(p.y);
    if (p.w) cudnnDestroyFilterDescriptor(p.w);
    if (p.conv) cudnnDestroyConvolutionDescriptor(p.conv);
    p = Plan();
  }

  std::string describe(cudnnStatus_t s) const {
    const char* text = cudnnGetErrorString ? cudnnGetErrorString(s) : nullptr;
    return std::string(text ? text : "unknown cuDNN status") + " (" + std::to_string(static_cast<int>(s)) + ")";
  }
  // Throws for any failure: FLAME_ERROR_OUT_OF_MEMORY for allocation failures, else FLAME_ERROR_CUDA.
  void check(cudnnStatus_t s, const char* what) const {
    if (s == CUDNN_STATUS_SUCCESS) return;
    const bool oom = s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                     s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
    fail(oom ? FLAME_ERROR_OUT_OF_MEMORY : FLAME_ERROR_CUDA, "cuDNN ", what, " failed: ", describe(s));
  }

  void load() {
    const char* override_path = std::getenv("FLAME_CUDNN_PATH");
    const char* path = override_path && *override_path ? override_path : "libcudnn.so.9";
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!lib) {
      const char* why = dlerror();
      fail(FLAME_ERROR_UNSUPPORTED, "cannot load ", path, ": ", why ? why : "unknown reason");
    }
#define FLAME_STR2(x) #x
#define FLAME_LOAD_FN(name)                                                                      \
  name = reinterpret_cast<decltype(name)>(dlsym(lib, FLAME_STR2(name)));                         \
  if (!name) fail(FLAME_ERROR_UNSUPPORTED, path, " lacks ", FLAME_STR2(name));
    FLAME_CUDNN_FUNCTIONS(FLAME_LOAD_FN)
#undef FLAME_LOAD_FN
#undef FLAME_STR2
    const size_t v = cudnnGetVersion();
    FLAME_CHECK(v / 10000 == 9, FLAME_ERROR_UNSUPPORTED, path, " is cuDNN version ", v, ", not 9.x");
    cudnnStatus_t s = cudnnCreate(&handle);
    if (s != CUDNN_STATUS_SUCCESS) {
      handle = nullptr;
      fail(FLAME_ERROR_UNSUPPORTED, "cudnnCreate failed: ", describe(s));
    }
    check(cudnnSetStream(handle, reinterpret_cast<cudaStream_t>(ctx.stream)), "cudnnSetStream");
  }

  // The math type a candidate needs: f16/bf16 and TF32 run as cuDNN reports; IEEE f32 stays FMA.
  static bool math_allowed(DType dt, bool tf32, cudnnMathType_t m) {
    if (dt != FLAME_DTYPE_F32) return true;
    if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;  // would round f32 to f16
    return tf32 || m != CUDNN_TENSOR_OP_MATH;
  }
  static bool is_fft(CudnnDir d, int algo) {
    switch (d) {
      case CudnnDir::Forward: return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING;
      case CudnnDir::BackwardData:
        return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING;
      case CudnnDir::BackwardFilter:
        return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING;
    }
    return true;
  }

  cudnnMathType_t base_math(DType dt, bool tf32) const {
    if (dt == FLAME_DTYPE_F32) return tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    return CUDNN_TENSOR_OP_MATH;
  }
  // IEEE f32 keeps CUDNN_FMA_MATH on the descriptor whatever a candidate reports, so no TF32
  // kernel can run; other types take the candidate's math type (cuDNN selects by algo + math).
  cudnnStatus_t set_math(Plan& p, DType dt, bool tf32, cudnnMathType_t m) {
    const cudnnMathType_t want = dt == FLAME_DTYPE_F32 && !tf32 ? CUDNN_FMA_MATH : m;
    if (want == p.math_set) return CUDNN_STATUS_SUCCESS;
    cudnnStatus_t s = cudnnSetConvolutionMathType(p.conv, want);
    if (s == CUDNN_STATUS_SUCCESS) p.math_set = want;
    return s;
  }

  cudnnStatus_t workspace_size(const Plan& p, CudnnDir d, int algo, size_t* bytes) {
    switch (d) {
      case CudnnDir::Forward:
        return cudnnGetConvolutionForwardWorkspaceSize(handle, p.x, p.w, p.conv, p.y,
                                                       static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
      case CudnnDir::BackwardData:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, p.w, p.y, p.conv, p.x,
                                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
      case CudnnDir::BackwardFilter:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, p.x, p.y, p.conv, p.w,
                                                              static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
    }
    return CUDNN_STATUS_BAD_PARAM;
  }

  // The heuristic's results as (algo, status, determinism, math) rows, best first.
  template <class Perf, class MaxCountFn, class QueryFn>
  cudnnStatus_t heuristic(MaxCountFn max_count, QueryFn query, std::vector<Candidate>* out,
                          std::vector<bool>* usable, CudnnDir d, DType dt, bool tf32) {
    int count = 0;
    cudnnStatus_t s = max_count(handle, &count);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    std::vector<Perf> perf(static_cast<size_t>(count > 0 ? count : 1));
    int found = 0;
    s = query(static_cast<int>(perf.size()), &found, perf.data());
    if (s != CUDNN_STATUS_SUCCESS) return s;
    for (int i = 0; i < found && i < static_cast<int>(perf.size()); ++i) {
      const Perf& r = perf[static_cast<size_t>(i)];
      const int algo = static_cast<int>(r.algo);
      const bool ok = r.status == CUDNN_STATUS_SUCCESS && r.determinism == CUDNN_DETERMINISTIC && !is_fft(d, algo) &&
                      math_allowed(dt, tf32, r.mathType);
      out->push_back({algo, r.mathType, 0});
      usable->push_back(ok);
    }
    return CUDNN_STATUS_SUCCESS;
  }

  // Descriptors and candidates; a plan without candidates means "no algorithm". Statuses that say
  // cuDNN cannot express or run this convolution leave it so; any other failure throws.
  Plan build(const CudnnConv& c, bool tf32) {
    Plan p;
    try {
      const cudnnDataType_t t = cudnn_type(c.dtype);
      auto soft = [&](cudnnStatus_t s, const char* what) {  // true when cuDNN refused
        if (s == CUDNN_STATUS_SUCCESS) return false;
        if (refused(s)) return true;
        check(s, what);
        return true;
      };
      check(cudnnCreateTensorDescriptor(&p.x), "cudnnCreateTensorDescriptor");
      check(cudnnCreateTensorDescriptor(&p.y), "cudnnCreateTensorDescriptor");
      check(cudnnCreateFilterDescriptor(&p.w), "cudnnCreateFilterDescriptor");
      check(cudnnCreateConvolutionDescriptor(&p.conv), "cudnnCreateConvolutionDescriptor");
      const auto xs = dense_strides(c.C, c.H, c.W, c.channels_last), ys = dense_strides(c.O, c.Ho, c.Wo, c.channels_last);
      auto i32 = [](int64_t v) { return static_cast<int>(v); };
      if (soft(cudnnSetTensor4dDescriptorEx(p.x, t, i32(c.N), i32(c.C), i32(c.H), i32(c.W), i32(xs[0]), i32(xs[1]),
                                            i32(xs[2]), i32(xs[3])), "cudnnSetTensor4dDescriptorEx") ||
          soft(cudnnSetTensor4dDescriptorEx(p.y, t, i32(c.N), i32(c.O), i32(c.Ho), i32(c.Wo), i32(ys[0]), i32(ys[1]),
                                            i32(ys[2]), i32(ys[3])), "cudnnSetTensor4dDescriptorEx") ||
          soft(cudnnSetFilter4dDescriptor(p.w, t, c.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, i32(c.O),
                                          i32(c.C / c.G), i32(c.kh), i32(c.kw)), "cudnnSetFilter4dDescriptor") ||
          soft(cudnnSetConvolution2dDescriptor(p.conv, i32(c.ph), i32(c.pw), i32(c.sh), i32(c.sw), i32(c.dh), i32(c.dw),
                                               CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT), "cudnnSetConvolution2dDescriptor") ||
          soft(cudnnSetConvolutionGroupCount(p.conv, i32(c.G)), "cudnnSetConvolutionGroupCount"))
        return p;
      p.math_set = base_math(c.dtype, tf32);
      if (soft(cudnnSetConvolutionMathType(p.conv, p.math_set), "cudnnSetConvolutionMathType")) return p;

      std::vector<Candidate> all;
      std::vector<bool> usable;
      cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
      switch (c.dir) {
        case CudnnDir::Forward:
          s = heuristic<cudnnConvolutionFwdAlgoPerf_t>(
              cudnnGetConvolutionForwardAlgorithmMaxCount,
              [&](int n, int* found, cudnnConvolutionFwdAlgoPerf_t* r) {
                return cudnnGetConvolutionForwardAlgorithm_v7(handle, p.x, p.w, p.conv, p.y, n, found, r);
              },
              &all, &usable, c.dir, c.dtype, tf32);
          break;
        case CudnnDir::BackwardData:
          s = heuristic<cudnnConvolutionBwdDataAlgoPerf_t>(
              cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
              [&](int n, int* found, cudnnConvolutionBwdDataAlgoPerf_t* r) {
                return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, p.w, p.y, p.conv, p.x, n, found, r);
              },
              &all, &usable, c.dir, c.dtype, tf32);
          break;
        case CudnnDir::BackwardFilter:
          s = heuristic<cudnnConvolutionBwdFilterAlgoPerf_t>(
              cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
              [&](int n, int* found, cudnnConvolutionBwdFilterAlgoPerf_t* r) {
                return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, p.x, p.y, p.conv, p.w, n, found, r);
              },
              &all, &usable, c.dir, c.dtype, tf32);
          break;
      }
      if (soft(s, "heuristic query")) return p;
      for (size_t i = 0; i < all.size(); ++i) {
        if (!usable[i]) continue;
        Candidate cand = all[i];
        bool dup = false;  // the heuristic may list an algorithm once per math type
        for (const Candidate& h : p.candidates) dup = dup || (h.algo == cand.algo && h.math == cand.math);
        if (dup || set_math(p, c.dtype, tf32, cand.math) != CUDNN_STATUS_SUCCESS) continue;
        if (workspace_size(p, c.dir, cand.algo, &cand.workspace) != CUDNN_STATUS_SUCCESS || cand.workspace > kMaxWorkspace)
          continue;
        p.candidates.push_back(cand);
      }
    } catch (...) {
      destroy(p);
      throw;
    }
    return p;
  }

  cudnnStatus_t launch(const Plan& p, const CudnnConv& c, const Candidate& cand, CUdeviceptr ws) {
    const float one = 1.0f, zero = 0.0f;
    const void* beta = c.beta_one ? &one : &zero;
    void* wsp = reinterpret_cast<void*>(ws);
    void* x = reinterpret_cast<void*>(c.x);
    void* w = reinterpret_cast<void*>(c.w);
    void* y = reinterpret_cast<void*>(c.y);
    ++ctx.drv.counters.launches;
    switch (c.dir) {
      case CudnnDir::Forward:
        return cudnnConvolutionForward(handle, &one, p.x, x, p.w, w, p.conv, static_cast<cudnnConvolutionFwdAlgo_t>(cand.algo),
                                       wsp, cand.workspace, beta, p.y, y);
      case CudnnDir::BackwardData:
        return cudnnConvolutionBackwardData(handle, &one, p.w, w, p.y, y, p.conv,
                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(cand.algo), wsp, cand.workspace, beta,
                                            p.x, x);
      case CudnnDir::BackwardFilter:
        return cudnnConvolutionBackwardFilter(handle, &one, p.x, x, p.y, y, p.conv,
                                              static_cast<cudnnConvolutionBwdFilterAlgo_t>(cand.algo), wsp, cand.workspace,
                                              beta, p.w, w);
    }
    return CUDNN_STATUS_BAD_PARAM;
  }
};

Cudnn::Cudnn(Context& ctx) : impl_(std::make_unique<Impl>(ctx)) {
  impl_->load();
  version = static_cast<int32_t>(impl_->cudnnGetVersion());
  const char* log = std::getenv("FLAME_CUDNN_LOG");
  log_refusals = log && log[0] == '1';
}

Cudnn::~Cudnn() = default;
void* Cudnn::library() const { return impl_->lib; }
void* Cudnn::raw_handle() const { return impl_->handle; }
Context& Cudnn::context() const { return impl_->ctx; }

bool Cudnn::run(const CudnnConv& c) {
  Impl& I = *impl_;
  Context& ctx = I.ctx;
  const bool tf32 = c.dtype == FLAME_DTYPE_F32 && ctx.allow_tf32;
  const PlanKey key = make_key(c, tf32);
  auto it = I.plans.find(key);
  if (it == I.plans.end()) {
    if (I.plans.size() >= kMaxPlans) I.clear_plans();
    Plan p = I.build(c, tf32);
    ++plans_built;
    it = I.plans.emplace(key, p).first;
  }
  Plan& p = it->second;
  for (; p.next < p.candidates.size(); ++p.next) {
    const Candidate& cand = p.candidates[p.next];
    I.check(I.set_math(p, c.dtype, tf32, cand.math), "cudnnSetConvolutionMathType");
    CUdeviceptr ws = cand.workspace ? ctx.allocate(cand.workspace) : 0;
    const cudnnStatus_t s = I.launch(p, c, cand, ws);
    ctx.deallocate(ws, cand.workspace);  // stream-ordered: after the launch's use of it
    if (s == CUDNN_STATUS_SUCCESS) {
      ++convolutions;
      return true;
    }
    if (!refused(s)) I.check(s, "convolution");
    // Refused before launching anything: try the next algorithm, and never this one again.
  }
  return false;
}

}  // namespace flame

#else  // configured without cudnn.h (see CMakeLists.txt): the convolutions use FLAME's kernels

namespace flame {

struct Cudnn::Impl {};
Cudnn::Cudnn(Context&) { fail(FLAME_ERROR_UNSUPPORTED, "FLAME was built without cuDNN's headers"); }
Cudnn::~Cudnn() = default;
bool Cudnn::run(const CudnnConv&) { return false; }
void* Cudnn::library() const { return nullptr; }
void* Cudnn::raw_handle() const { return nullptr; }
Context& Cudnn::context() const { fail(FLAME_ERROR_INTERNAL, "cuDNN is not built in"); }

}  // namespace flame

#endif

namespace flame {

Cudnn* cudnn(Context& ctx) {
  if (ctx.cudnn) return ctx.cudnn.get();
  if (!ctx.cudnn_enabled || !ctx.cudnn_unavailable.empty()) return nullptr;
  try {
    ctx.cudnn = std::make_unique<Cudnn>(ctx);
  } catch (const Error& e) {  // not installed, too old, or no handle: FLAME's kernels instead
    ctx.cudnn_unavailable = e.what();
    return nullptr;
  }
  return ctx.cudnn.get();
}

}  // namespace flame
