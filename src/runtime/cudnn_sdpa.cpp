// cuDNN's fused flash attention (see CudnnSdpa in cudnn.h), built with cuDNN's graph (backend) API:
// cudnnBackendCreateDescriptor / SetAttribute / Finalize / GetAttribute / Execute, looked up with
// dlsym in the library cudnn.cpp loaded. Nothing of cudnn-frontend is used; the operation graphs are
// the ones its SDPA nodes emit (scaled_dot_product_flash_attention.h: forward with Stats, and the
// backward node), because cuDNN's runtime-fusion engines recognise attention by that pattern:
//
//  forward:  S = Q K^T (f32) -> * scale -> [causal: GEN_INDEX rows/cols (i32), CMP_GE (bool),
//            BINARY_SELECT(S, lowest float)] -> M = max_j, E = exp(S - M), Z = sum_j E,
//            Stats = M + log Z, P = E / Z (io dtype) -> O = P V
//  backward: softmax_sum = sum_d(dO * O) * 1; S as above, E = exp(S - Stats); dV = E^T dO;
//            dP = dO V^T * 1; dS = (dP - softmax_sum) * E * scale; dK = dS^T Q;
//            dQ_accum (f32) = dS K; dQ = identity(dQ_accum)
//
// K enters as K^T ([B, H, D, Sk], its strides swapped) and V likewise in the backward, so strided
// views (heads split from one qkv projection and transposed) are read in place. scale, the mask
// value and 1 are passed by value, so one plan serves every scale. softmax_sum and dQ_accum live in
// the workspace (dQ_accum zeroed first only before cuDNN 9.6, which clears it itself).
//
// Plans are cached per key (every shape, stride, dtype and the causal flag). A key whose graph or
// plan cuDNN refuses (not supported on this GPU / version) is remembered as unusable and the caller
// runs FLAME's kernels; a failure while executing is an error.
#include "runtime/cudnn.h"
#include "core/error.h"
#include "runtime/capture.h"
#include "runtime/context.h"

#if FLAME_WITH_CUDNN
#include <cudnn.h>
#include <dlfcn.h>
#include <array>
#include <cstdio>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace flame {

#define FLAME_CUDNN_BACKEND_FUNCTIONS(X)                                                            \
  X(cudnnGetErrorString) X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor)             \
  X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute) X(cudnnBackendFinalize) X(cudnnBackendExecute)

namespace {

constexpr size_t kMaxPlans = 1024;  // a model has a handful of attention shapes; bound it anyway
constexpr int64_t kAlign = 256;     // workspace sub-buffers (softmax_sum, dQ_accum) start aligned
// From cuDNN 9.6 the backward engines clear dQ_accum themselves (PyTorch's cudnn-frontend path runs no
// memset there, and FLAME's tests pass with the buffer filled with NaN first); the memset of
// B*H*Sq*D floats cost 31 us of a 1.77 ms forward+backward at B8 H16 S2048 D128 on an H200.
constexpr int32_t kSelfZeroedDqAccum = 90600;

// Unique ids of the non-virtual tensors (the variant pack names them); virtual ones count from 100.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kMaskValue, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum, kFirstVirtual = 100
};

using Key = std::array<int64_t, 23>;
struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
    return static_cast<size_t>(h ^ (h >> 32));
  }
};
Key make_key(const CudnnSdpa& a) {
  return {a.backward, a.dtype, a.causal, a.B, a.H, a.Sq, a.Sk, a.D, a.q_st[0], a.q_st[1], a.q_st[2], a.k_st[0],
          a.k_st[1], a.k_st[2], a.v_st[0], a.v_st[1], a.v_st[2], a.backward ? a.do_st[0] : 0,
          a.backward ? a.do_st[1] : 0, a.backward ? a.do_st[2] : 0, a.o_st[0], a.o_st[1], a.o_st[2]};
}

int64_t round_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Thrown while building a graph or plan: cuDNN refused it (the key falls back to FLAME's kernels).
struct Refused {
  std::string why;
};

}  // namespace

struct CudnnSdpaCache {
#define FLAME_DECLARE_FN(name) decltype(&::name) name = nullptr;
  FLAME_CUDNN_BACKEND_FUNCTIONS(FLAME_DECLARE_FN)
#undef FLAME_DECLARE_FN
  decltype(&::cudnnGetLastErrorString) last_error = nullptr;  // cuDNN 9.0+; optional
  Cudnn& dnn;
  cudnnHandle_t handle = nullptr;
  std::string unavailable;  // non-empty: a backend function is missing, nothing is tried

  struct Plan {
    std::vector<cudnnBackendDescriptor_t> keep;  // every descriptor of the graph, alive with the plan
    cudnnBackendDescriptor_t plan = nullptr;
    int64_t workspace = 0;  // cuDNN's own, before softmax_sum and dQ_accum
  };
  std::unordered_map<Key, Plan, KeyHash> plans;  // plan == nullptr: refused for good

  explicit CudnnSdpaCache(Cudnn& d) : dnn(d), handle(static_cast<cudnnHandle_t>(d.raw_handle())) {
    void* lib = d.library();
#define FLAME_STR2(x) #x
#define FLAME_LOAD_FN(name)                                                                      \
  name = reinterpret_cast<decltype(name)>(dlsym(lib, FLAME_STR2(name)));                         \
  if (!name && unavailable.empty()) unavailable = std::string("libcudnn lacks ") + FLAME_STR2(name);
    FLAME_CUDNN_BACKEND_FUNCTIONS(FLAME_LOAD_FN)
#undef FLAME_LOAD_FN
#undef FLAME_STR2
    last_error = reinterpret_cast<decltype(last_error)>(dlsym(lib, "cudnnGetLastErrorString"));
  }
  ~CudnnSdpaCache() { clear(); }

  void destroy(Plan& p) noexcept {
    if (p.plan) cudnnBackendDestroyDescriptor(p.plan);
    for (auto it = p.keep.rbegin(); it != p.keep.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
    p = Plan();
  }
  void clear() noexcept {
    for (auto& kv : plans) destroy(kv.second);
    plans.clear();
  }

  // "<call> failed: <cudnnGetErrorString> (<code>)[: <cudnnGetLastErrorString>]".
  std::string describe(cudnnStatus_t s, const std::string& what) const {
    const char* text = cudnnGetErrorString ? cudnnGetErrorString(s) : nullptr;
    std::string m = what + " failed: " + (text ? text : "unknown cuDNN status") + " (" + std::to_string(static_cast<int>(s)) + ")";
    if (last_error) {
      char buf[512] = {0};
      last_error(buf, sizeof buf);
      if (buf[0]) m += std::string(": ") + buf;
    }
    return m;
  }

  // ---------------------------------------------------------------- graph building
  // Descriptors made while building one plan go to keep (destroyed with it, or on refusal).
  struct Builder {
    CudnnSdpaCache& c;
    std::vector<cudnnBackendDescriptor_t>& keep;
    int64_t next_uid = kFirstVirtual;

    void ok(cudnnStatus_t s, const std::string& what) const {
      if (s != CUDNN_STATUS_SUCCESS) throw Refused{c.describe(s, what)};
    }
    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t, const char* what) {
      cudnnBackendDescriptor_t d = nullptr;
      ok(c.cudnnBackendCreateDescriptor(t, &d), std::string("cudnnBackendCreateDescriptor(") + what + ")");
      keep.push_back(d);
      return d;
    }
    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n,
             const void* value, const char* what) {
      ok(c.cudnnBackendSetAttribute(d, name, type, n, value), std::string("cudnnBackendSetAttribute(") + what + ")");
    }
    void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t v, const char* what) {
      set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
    }
    void finalize(cudnnBackendDescriptor_t d, const char* what) {
      ok(c.cudnnBackendFinalize(d), std::string("cudnnBackendFinalize(") + what + ")");
    }

    using Dims = std::array<int64_t, 4>;
    // A tensor: non-virtual ones carry a fixed uid and reach memory through the variant pack.
    cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides, bool is_virtual,
                                    bool by_value = false) {
      cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
      const int64_t align = 16;  // the variant pack's addresses are 16-byte aligned (attention.cpp checks)
      const bool virt = is_virtual;
      set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "CUDNN_ATTR_TENSOR_DATA_TYPE");
      set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "CUDNN_ATTR_TENSOR_DIMENSIONS");
      set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "CUDNN_ATTR_TENSOR_STRIDES");
      set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "CUDNN_ATTR_TENSOR_UNIQUE_ID");
      set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT");
      set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "CUDNN_ATTR_TENSOR_IS_VIRTUAL");
      if (by_value) {
        const bool yes = true;
        set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "CUDNN_ATTR_TENSOR_IS_BY_VALUE");
      }
      finalize(t, "tensor");
      return t;
    }
    cudnnBackendDescriptor_t virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
      return tensor(next_uid++, dt, dims, strides, true);
    }
    // A host f32 scalar passed by value at execution ([1, 1, 1, 1], broadcast).
    cudnnBackendDescriptor_t scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

    std::vector<cudnnBackendDescriptor_t> ops;  // in the frontend's order

    // y = mode(x[, b[, t]]) computed in math.
    void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis = -1) {
      cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
      set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "CUDNN_ATTR_POINTWISE_MODE");
      set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, "CUDNN_ATTR_POINTWISE_MATH_PREC");
      if (mode == CUDNN_POINTWISE_GEN_INDEX) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "CUDNN_ATTR_POINTWISE_AXIS");
      finalize(pw, "pointwise");
      cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "operation pointwise");
      set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR");
      set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "CUDNN_ATTR_OPERATION_POINTWISE_XDESC");
      if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "CUDNN_ATTR_OPERATION_POINTWISE_BDESC");
      if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "CUDNN_ATTR_OPERATION_POINTWISE_TDESC");
      set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "CUDNN_ATTR_OPERATION_POINTWISE_YDESC");
      finalize(op, "operation pointwise");
      ops.push_back(op);
    }
    void unary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
      pointwise(mode, CUDNN_DATA_FLOAT, x, nullptr, nullptr, y);
    }
    void binary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
      pointwise(mode, CUDNN_DATA_FLOAT, x, b, nullptr, y);
    }
    // c = a b (batched over the first two dims), accumulated in f32.
    void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
      cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
      const cudnnDataType_t f = CUDNN_DATA_FLOAT;
      set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "CUDNN_ATTR_MATMUL_COMP_TYPE");
      finalize(mm, "matmul");
      cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "operation matmul");
      set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "CUDNN_ATTR_OPERATION_MATMUL_ADESC");
      set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "CUDNN_ATTR_OPERATION_MATMUL_BDESC");
      set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "CUDNN_ATTR_OPERATION_MATMUL_CDESC");
      set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "CUDNN_ATTR_OPERATION_MATMUL_DESC");
      finalize(op, "operation matmul");
      ops.push_back(op);
    }
    // y = reduce(x) over the dims where y has size 1.
    void reduce(cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
      cudnnBackendDescriptor_t rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
      const cudnnDataType_t f = CUDNN_DATA_FLOAT;
      set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, "CUDNN_ATTR_REDUCTION_OPERATOR");
      set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "CUDNN_ATTR_REDUCTION_COMP_TYPE");
      finalize(rd, "reduction");
      cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "operation reduction");
      set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "CUDNN_ATTR_OPERATION_REDUCTION_XDESC");
      set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "CUDNN_ATTR_OPERATION_REDUCTION_YDESC");
      set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "CUDNN_ATTR_OPERATION_REDUCTION_DESC");
      finalize(op, "operation reduction");
      ops.push_back(op);
    }
    // y views x's memory with other dims/strides (a transpose of the last two dims here).
    void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
      cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "operation reshape");
      set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "CUDNN_ATTR_OPERATION_RESHAPE_XDESC");
      set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "CUDNN_ATTR_OPERATION_RESHAPE_YDESC");
      finalize(op, "operation reshape");
      ops.push_back(op);
    }
    // Top-left causal mask: scores where row >= col, else the lowest float (uid kMaskValue).
    cudnnBackendDescriptor_t causal(cudnnBackendDescriptor_t s, const Dims& sd, const Dims& ss) {
      cudnnBackendDescriptor_t row = virt(CUDNN_DATA_INT32, sd, ss), col = virt(CUDNN_DATA_INT32, sd, ss);
      pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, row, 2);
      pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, col, 3);
      cudnnBackendDescriptor_t keep_it = virt(CUDNN_DATA_BOOLEAN, sd, ss);
      pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep_it);
      cudnnBackendDescriptor_t out = virt(CUDNN_DATA_FLOAT, sd, ss);
      pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, scalar(kMaskValue), keep_it, out);
      return out;
    }
  };

  static cudnnDataType_t io_type(DType d) { return d == FLAME_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

  static void forward_graph(Builder& g, const CudnnSdpa& a) {
    using Dims = Builder::Dims;
    const cudnnDataType_t io = io_type(a.dtype), f = CUDNN_DATA_FLOAT;
    const int64_t B = a.B, H = a.H, Sq = a.Sq, Sk = a.Sk, D = a.D;
    const Dims sd = {B, H, Sq, Sk}, ss = {H * Sq * Sk, Sq * Sk, Sk, 1};  // scores, dense (virtual)
    const Dims rd = {B, H, Sq, 1}, rs = {H * Sq, Sq, 1, 1};              // per-row values
    auto q = g.tensor(kQ, io, {B, H, Sq, D}, {a.q_st[0], a.q_st[1], a.q_st[2], 1}, false);
    auto kt = g.tensor(kK, io, {B, H, D, Sk}, {a.k_st[0], a.k_st[1], 1, a.k_st[2]}, false);  // K^T: strides swapped
    auto v = g.tensor(kV, io, {B, H, Sk, D}, {a.v_st[0], a.v_st[1], a.v_st[2], 1}, false);
    auto s = g.virt(f, sd, ss);
    g.matmul(q, kt, s);
    auto s_scaled = g.virt(f, sd, ss);
    g.binary(CUDNN_POINTWISE_MUL, s, g.scalar(kScale), s_scaled);
    auto s_masked = a.causal ? g.causal(s_scaled, sd, ss) : s_scaled;
    auto m = g.virt(f, rd, rs);
    g.reduce(CUDNN_REDUCE_TENSOR_MAX, s_masked, m);
    auto centred = g.virt(f, sd, ss);
    g.binary(CUDNN_POINTWISE_SUB, s_masked, m, centred);
    auto e = g.virt(f, sd, ss);
    g.unary(CUDNN_POINTWISE_EXP, centred, e);
    auto z = g.virt(f, rd, rs);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, e, z);
    auto log_z = g.virt(f, rd, rs);
    g.unary(CUDNN_POINTWISE_LOG, z, log_z);
    auto stats = g.tensor(kStats, f, rd, rs, false);
    g.binary(CUDNN_POINTWISE_ADD, m, log_z, stats);
    auto p = g.virt(io, sd, ss);  // the second matmul's A operand is in the io dtype
    g.binary(CUDNN_POINTWISE_DIV, e, z, p);
    auto o = g.tensor(kO, io, {B, H, Sq, D}, {a.o_st[0], a.o_st[1], a.o_st[2], 1}, false);
    g.matmul(p, v, o);
  }

  static void backward_graph(Builder& g, const CudnnSdpa& a) {
    using Dims = Builder::Dims;
    const cudnnDataType_t io = io_type(a.dtype), f = CUDNN_DATA_FLOAT;
    const int64_t B = a.B, H = a.H, Sq = a.Sq, Sk = a.Sk, D = a.D;
    const Dims sd = {B, H, Sq, Sk}, ss = {H * Sq * Sk, Sq * Sk, Sk, 1};
    const Dims td = {B, H, Sk, Sq}, ts = {H * Sq * Sk, Sq * Sk, 1, Sk};  // the scores transposed (a view)
    const Dims rd = {B, H, Sq, 1}, rs = {H * Sq, Sq, 1, 1};
    const Dims qd = {B, H, Sq, D}, qdense = {H * Sq * D, Sq * D, D, 1};
    const Dims kd = {B, H, Sk, D}, kdense = {H * Sk * D, Sk * D, D, 1};
    auto q = g.tensor(kQ, io, qd, {a.q_st[0], a.q_st[1], a.q_st[2], 1}, false);
    auto kt = g.tensor(kK, io, {B, H, D, Sk}, {a.k_st[0], a.k_st[1], 1, a.k_st[2]}, false);
    auto vt = g.tensor(kV, io, {B, H, D, Sk}, {a.v_st[0], a.v_st[1], 1, a.v_st[2]}, false);
    auto o = g.tensor(kO, io, qd, {a.o_st[0], a.o_st[1], a.o_st[2], 1}, false);
    auto dout = g.tensor(kDO, io, qd, {a.do_st[0], a.do_st[1], a.do_st[2], 1}, false);
    auto stats = g.tensor(kStats, f, rd, rs, false);
    auto one = g.scalar(kOne), scale = g.scalar(kScale);

    // softmax_sum = sum_d(dO * O) (the frontend's strides for the virtual product, as it sends them)
    auto dout_o = g.virt(f, qd, {H * Sq * D, Sq * D, H * D, 1});
    g.binary(CUDNN_POINTWISE_MUL, dout, o, dout_o);
    auto row_sum = g.virt(f, rd, rs);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, dout_o, row_sum);
    auto softmax_sum = g.tensor(kSoftmaxSum, f, rd, rs, false);
    g.binary(CUDNN_POINTWISE_MUL, row_sum, one, softmax_sum);

    // E = exp(scale Q K^T [masked] - Stats); dV = E^T dO
    auto s = g.virt(f, sd, ss);
    g.matmul(q, kt, s);
    auto s_scaled = g.virt(f, sd, ss);
    g.binary(CUDNN_POINTWISE_MUL, s, scale, s_scaled);
    auto s_masked = a.causal ? g.causal(s_scaled, sd, ss) : s_scaled;
    auto centred = g.virt(f, sd, ss);
    g.binary(CUDNN_POINTWISE_SUB, s_masked, stats, centred);
    auto e = g.virt(f, sd, ss);
    g.unary(CUDNN_POINTWISE_EXP, centred, e);
    auto et = g.virt(io, td, ts);
    g.reshape(e, et);
    auto dv = g.tensor(kDV, io, kd, kdense, false);
    g.matmul(et, dout, dv);

    // dS = (dO V^T - softmax_sum) * E * scale; dK = dS^T Q
    auto dp = g.virt(f, sd, ss);
    g.matmul(dout, vt, dp);
    auto dp1 = g.virt(f, sd, ss);
    g.binary(CUDNN_POINTWISE_MUL, dp, one, dp1);  // the dropout mask's place
    auto dp2 = g.virt(f, sd, ss);
    g.binary(CUDNN_POINTWISE_SUB, dp1, softmax_sum, dp2);
    auto dp3 = g.virt(f, sd, ss);
    g.binary(CUDNN_POINTWISE_MUL, dp2, e, dp3);
    auto ds = g.virt(f, sd, ss);
    g.binary(CUDNN_POINTWISE_MUL, dp3, scale, ds);
    auto dst = g.virt(io, td, ts);
    g.reshape(ds, dst);
    auto dk = g.tensor(kDK, io, kd, kdense, false);
    g.matmul(dst, q, dk);

    // dQ = dS K, accumulated in f32 (dQ_accum, workspace), then converted
    auto k = g.virt(f, kd, {a.k_st[0], a.k_st[1], a.k_st[2], 1});
    g.reshape(kt, k);
    auto dq_accum = g.tensor(kDQAccum, f, qd, qdense, false);
    g.matmul(ds, k, dq_accum);
    auto dq = g.tensor(kDQ, io, qd, qdense, false);
    g.unary(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  }

  // The first engine configuration (heuristics mode A, then the fallback list) that finalizes.
  void make_plan(Builder& g, Plan& p) {
    cudnnBackendDescriptor_t graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(g.ops.size()),
          g.ops.data(), "CUDNN_ATTR_OPERATIONGRAPH_OPS");
    g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE");
    g.finalize(graph, "operation graph");
    std::string why;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      try {
        cudnnBackendDescriptor_t heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
        g.set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH");
        g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "CUDNN_ATTR_ENGINEHEUR_MODE");
        g.finalize(heur, "engine heuristics");
        int64_t count = 0;
        g.ok(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
             "cudnnBackendGetAttribute(CUDNN_ATTR_ENGINEHEUR_RESULTS count)");
        if (count <= 0) throw Refused{"the heuristics list no engine"};
        std::vector<cudnnBackendDescriptor_t> cfgs;
        for (int64_t i = 0; i < count; ++i) cfgs.push_back(g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
        int64_t got = 0;
        g.ok(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                      cfgs.data()),
             "cudnnBackendGetAttribute(CUDNN_ATTR_ENGINEHEUR_RESULTS)");
        for (int64_t i = 0; i < got && i < count; ++i) {
          cudnnBackendDescriptor_t plan = nullptr;
          cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
          if (st != CUDNN_STATUS_SUCCESS) throw Refused{describe(st, "cudnnBackendCreateDescriptor(execution plan)")};
          cudnnBackendDescriptor_t cfg = cfgs[static_cast<size_t>(i)];
          st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
          if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
          if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(plan);
          int64_t ws = 0, n = 0;
          if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
          if (st == CUDNN_STATUS_SUCCESS && ws >= 0) {
            p.plan = plan;
            p.workspace = ws;
            return;
          }
          why = describe(st, "execution plan of engine config " + std::to_string(i));  // try the next one
          cudnnBackendDestroyDescriptor(plan);
        }
        if (why.empty()) why = "no engine config finalized";
      } catch (const Refused& r) {
        why = r.why;
      }
    }
    throw Refused{why};
  }

  Plan build(const CudnnSdpa& a) {
    Plan p;
    Builder g{*this, p.keep, kFirstVirtual, {}};
    try {
      if (a.backward)
        backward_graph(g, a);
      else
        forward_graph(g, a);
      make_plan(g, p);
    } catch (const Refused& r) {
      destroy(p);  // p.plan stays null: this key runs FLAME's kernels from now on
      log_refusal(a, r.why);
    } catch (...) {
      destroy(p);
      throw;
    }
    return p;
  }

  // Why a key runs FLAME's kernels instead (the first refusal of each key), through the context's
  // log: at INFO with $FLAME_CUDNN_LOG=1, else at DEBUG.
  void log_refusal(const CudnnSdpa& a, const std::string& why) const {
    Logger& log = dnn.context().log;
    const int32_t level = dnn.log_refusals ? FLAME_LOG_INFO : FLAME_LOG_DEBUG;
    if (!log.enabled(level)) return;
    char shape[160];
    std::snprintf(shape, sizeof shape, "%s B=%lld H=%lld Sq=%lld Sk=%lld D=%lld %s%s", a.backward ? "backward" : "forward",
                  static_cast<long long>(a.B), static_cast<long long>(a.H), static_cast<long long>(a.Sq),
                  static_cast<long long>(a.Sk), static_cast<long long>(a.D), a.dtype == FLAME_DTYPE_BF16 ? "bf16" : "f16",
                  a.causal ? " causal" : "");
    log.write(level, std::string("cuDNN attention ") + shape + ": no plan: " + why);
  }

  bool run(const CudnnSdpa& a) {
    if (!unavailable.empty()) return false;
    Context& ctx = dnn.context();
    const Key key = make_key(a);
    auto it = plans.find(key);
    if (it == plans.end()) {
      if (plans.size() >= kMaxPlans) clear();
      RelaxedCaptureMode relaxed(ctx);  // during a capture, cuDNN's plan set-up is not graph work
      it = plans.emplace(key, build(a)).first;
      ++dnn.plans_built;
    }
    const Plan& p = it->second;
    if (!p.plan) return false;

    // Workspace: cuDNN's, then (backward) softmax_sum [B, H, Sq] and the zeroed dQ_accum [B, H, Sq, D].
    const int64_t rows = a.B * a.H * a.Sq;
    const int64_t sum_at = round_up(p.workspace), acc_at = sum_at + round_up(rows * 4);
    const int64_t total = a.backward ? acc_at + rows * a.D * 4 : p.workspace;
    const size_t bytes = static_cast<size_t>(total);
    CUdeviceptr ws = bytes ? ctx.allocate(bytes) : 0;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    std::string what;
    try {
      if (a.backward && dnn.version < kSelfZeroedDqAccum)
        ctx.check(ctx.drv.cuMemsetD32Async(ws + static_cast<CUdeviceptr>(acc_at), 0, static_cast<size_t>(rows * a.D), ctx.stream),
                  "cuMemsetD32Async");
      const float scale = a.scale, one = 1.0f, lowest = std::numeric_limits<float>::lowest();
      auto ptr = [](CUdeviceptr d) { return reinterpret_cast<void*>(d); };
      std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
      std::vector<void*> ptrs = {ptr(a.q), ptr(a.k), ptr(a.v), ptr(a.o), ptr(a.stats), const_cast<float*>(&scale)};
      if (a.causal) {
        uids.push_back(kMaskValue);
        ptrs.push_back(const_cast<float*>(&lowest));
      }
      if (a.backward) {
        const int64_t more[] = {kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum};
        void* at[] = {ptr(a.dout), ptr(a.dq), ptr(a.dk), ptr(a.dv), const_cast<float*>(&one), ptr(ws + static_cast<CUdeviceptr>(sum_at)),
                      ptr(ws + static_cast<CUdeviceptr>(acc_at))};
        uids.insert(uids.end(), std::begin(more), std::end(more));
        ptrs.insert(ptrs.end(), std::begin(at), std::end(at));
      }
      void* wsp = ptr(ws);
      cudnnBackendDescriptor_t pack = nullptr;
      st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
      what = "cudnnBackendCreateDescriptor(variant pack)";
      if (st == CUDNN_STATUS_SUCCESS) {
        const int64_t n = static_cast<int64_t>(uids.size());
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data());
        what = "cudnnBackendSetAttribute(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)";
        if (st == CUDNN_STATUS_SUCCESS) {
          st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs.data());
          what = "cudnnBackendSetAttribute(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)";
        }
        if (st == CUDNN_STATUS_SUCCESS) {
          st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp);
          what = "cudnnBackendSetAttribute(CUDNN_ATTR_VARIANT_PACK_WORKSPACE)";
        }
        if (st == CUDNN_STATUS_SUCCESS) {
          st = cudnnBackendFinalize(pack);
          what = "cudnnBackendFinalize(variant pack)";
        }
        if (st == CUDNN_STATUS_SUCCESS) {
          ++ctx.drv.counters.launches;
          st = cudnnBackendExecute(handle, p.plan, pack);
          what = a.backward ? "cudnnBackendExecute(attention backward)" : "cudnnBackendExecute(attention forward)";
        }
        cudnnBackendDestroyDescriptor(pack);
      }
    } catch (...) {
      ctx.deallocate(ws, bytes);
      throw;
    }
    ctx.deallocate(ws, bytes);  // stream-ordered: after the launch's use of it
    if (st != CUDNN_STATUS_SUCCESS) {
      const bool oom = st == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                       st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
      fail(oom ? FLAME_ERROR_OUT_OF_MEMORY : FLAME_ERROR_CUDA, "cuDNN attention: ", describe(st, what));
    }
    ++(a.backward ? dnn.attention_grads : dnn.attentions);
    return true;
  }
};

void CudnnSdpaCacheDeleter::operator()(CudnnSdpaCache* c) const noexcept { delete c; }

bool Cudnn::attention(const CudnnSdpa& a) {
  if (!sdpa_) sdpa_.reset(new CudnnSdpaCache(*this));
  return sdpa_->run(a);
}

}  // namespace flame

#else  // configured without cudnn.h: the attention uses FLAME's kernels

namespace flame {

struct CudnnSdpaCache {};
void CudnnSdpaCacheDeleter::operator()(CudnnSdpaCache* c) const noexcept { delete c; }
bool Cudnn::attention(const CudnnSdpa&) { return false; }

}  // namespace flame

#endif
