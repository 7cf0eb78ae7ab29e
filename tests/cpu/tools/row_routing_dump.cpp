// Dumps every routing decision of the row kernels (norms, softmax / log_softmax, cross-entropy,
// batch_norm) over a grid of shapes, dtypes, vector widths and devices, one line per case:
//
//   build/tests/cpu/flame_row_routing_dump > tests/data/row_routing.txt
//
// This version was written BEFORE the row-kernel router (issue 34, point 2): it calls the launch
// planning of ops/nn_rows.h as it stood (plan_rows, plan_stream, smem_rows, ring_rows, ...) and
// spells out the op-level branches of nn_norm.cpp, softmax.cpp and loss.cpp line for line (they sit
// in the launch code, which needs a GPU). Device properties are parameters: H100/H200 (sm_90, 132
// SMs, 50 MiB L2, 2048 threads per SM) and an sm_80 part (108 SMs, 40 MiB L2) for the non-ring paths.
// The committed table is the reference that tests/cpu/test_row_router.cpp replays through the router.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include "runtime/disk_cache.h"
#include "runtime/driver.h"
#include "runtime/kernel_key.h"
#include "runtime/log.h"
#include "runtime/nvrtc_compiler.h"
// Only to make a Context that holds the device properties the planning reads (sm_count, cc_major):
// its constructor is private, and the planning takes a Context.
#define private public
#include "runtime/context.h"
#undef private
#include "runtime/blas.h"
#include "runtime/capture.h"
#include "runtime/cudnn.h"
#include "ops/nn_rows.h"

using namespace flame;

namespace {

struct Dev {
  const char* name;
  int cc_major, sms;
  int64_t l2, threads_per_sm;
};
const Dev kDevs[] = {{"sm90", 9, 132, 50 * 1024 * 1024, 2048}, {"sm80", 8, 108, 40 * 1024 * 1024, 2048}};
const DType kTypes[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64};
const int64_t kRows[] = {1, 333, 65536};
const int64_t kD[] = {1, 3, 100, 255, 768, 1000, 1024, 1032, 3000, 4096, 6144, 8192, 16384, 16392, 25000, 32768,
                      50304, 65536};

const char* tname(DType t) {
  switch (t) {
    case FLAME_DTYPE_F32: return "f32";
    case FLAME_DTYPE_F16: return "f16";
    case FLAME_DTYPE_BF16: return "bf16";
    default: return "f64";
  }
}
int full_v(DType t) { return static_cast<int>(16 / dtype_size(t)); }
// The vector width row_vector_width gives for pointers that are (or are not) 16-byte aligned.
int width(DType t, int64_t D, bool aligned) {
  return row_vector_width(t, D, {aligned ? CUdeviceptr{256} : CUdeviceptr{258}});
}
Context& fake_ctx(const Dev& d) {
  static Context* c = new Context();  // never destroyed: it owns no driver state
  c->sm_count = d.sms;
  c->cc_major = d.cc_major;
  return *c;
}
std::string plan_str(const RowPlan& p) {
  std::ostringstream o;
  o << "path=" << (p.stream ? "stream" : (p.staged ? "staged" : (p.cache ? "regs" : "global"))) << " nv=" << p.nv << " v=" << p.v
    << " tpr=" << p.tpr << " rpb=" << p.rpb << " grid=" << p.grid;
  return o.str();
}
// launch_smem_rows' block and grid.
std::string smem_launch_str(int64_t rows, int64_t D, DType t, unsigned bytes_per_thread) {
  const unsigned bytes = static_cast<unsigned>(static_cast<size_t>(D) * dtype_size(t));
  unsigned tpr;
  if (bytes <= kShortSmemMax) tpr = bytes > 3 * 1024 ? 64 : 32;
  else if (bytes <= kMidSmemMax) tpr = std::min(512u, std::max(64u, (bytes / bytes_per_thread + 31) / 32 * 32));
  else tpr = 512;
  std::ostringstream o;
  o << "tpr=" << tpr << " grid=" << std::min<int64_t>(rows, INT32_MAX) << " smem=" << bytes;
  return o.str();
}
std::string flat_str(const Dev& d, int64_t work) {
  int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((work + 255) / 256, int64_t{d.sms} * 32));
  return "flat_grid=" + std::to_string(blocks);
}
std::string ring_launch_str(const Dev& d, int64_t rows, int inputs) {
  constexpr unsigned kChunkBytes = 480 * 16, kMaxRingBytes = 192 * 1024;
  const unsigned slots = kMaxRingBytes / (inputs * kChunkBytes);
  const unsigned smem = slots * inputs * kChunkBytes + 16 * slots;
  std::ostringstream o;
  o << "block=512 grid=" << std::min<int64_t>(rows, d.sms) << " smem=" << smem;
  return o.str();
}

// ---- nn_norm.cpp ----
const char* kNorm[] = {"layer", "rms", "group"};
RowBudget norm_fwd_budget() { return RowBudget{1, 0, 32, 512, false, false, true}; }
RowBudget norm_bwd_budget(int mode, bool wb) {
  return RowBudget{2, mode == 2 || !wb ? 0 : 2, 64, 512, true, mode == 2, false, mode != 2};
}

std::string norm_fwd(const Dev& d, int mode, DType t, int64_t rows, int64_t D, int v) {
  Context& ctx = fake_ctx(d);
  if (smem_rows(t, D, v)) return "kernel=norm_fwd_block smem_row=1 v=" + std::to_string(v) + " " +
                                 smem_launch_str(rows, D, t, mode == 0 ? 64 : 128);
  RowPlan p = plan_rows(ctx, rows, D, t, v, norm_fwd_budget());
  return std::string(p.stream ? "kernel=norm_fwd_block smem_row=0 " : "kernel=norm_fwd ") + plan_str(p);
}

std::string norm_bwd(const Dev& d, int mode, DType t, int64_t rows, int64_t D, int64_t hw, int v, bool need_dx,
                     bool need_dw, bool need_db) {
  Context& ctx = fake_ctx(d);
  const size_t asize = dtype_size(t == FLAME_DTYPE_F64 ? FLAME_DTYPE_F64 : FLAME_DTYPE_F32);
  std::ostringstream o;
  RowPlan p = plan_rows(ctx, rows, D, t, v, norm_bwd_budget(mode, need_dw || need_db), 1024);
  if (mode != 2 && D * static_cast<int64_t>(dtype_size(t)) >= 32 * 1024) p = plan_stream(ctx, rows, D, v);
  const int64_t cg = D / hw;
  const bool kernel_wb = (need_dw || need_db) && !p.stream && (mode != 2 || 2 * cg * asize <= 40 * 1024);
  const bool wb_template = mode == 2 || kernel_wb;
  if (p.stream && need_dx && mode != 2 && ring_rows(ctx, t, D, v)) {
    o << "kernel=norm_bwd_ring " << ring_launch_str(d, rows, 2);
  } else if (p.stream) {
    if (need_dx) o << "kernel=norm_bwd_stream " << plan_str(p);
    else o << "kernel=none";
  } else if (need_dx || kernel_wb) {
    const int row = p.staged ? 2 : (p.cache ? 1 : 0);
    const int64_t prow = mode == 2 ? -1 : static_cast<int64_t>(p.grid) * (p.staged ? 1 : p.rpb);
    unsigned smem = mode == 2 && kernel_wb ? static_cast<unsigned>(2 * cg * asize) : 0;
    if (p.staged) smem = static_cast<unsigned>(2 * static_cast<size_t>(D) * dtype_size(t) * p.rpb);
    const int seg_aligned = mode == 2 && hw % (32 * v) == 0 ? 1 : 0;
    o << "kernel=norm_bwd row=" << row << " wb=" << wb_template << " " << plan_str(p) << " smem=" << smem
      << " partial_rows=" << (kernel_wb ? prow : 0) << " seg_aligned=" << seg_aligned;
  } else {
    o << "kernel=none";
  }
  if (!kernel_wb && (need_dw || need_db)) {
    if (mode != 2) {
      const unsigned col_blocks = static_cast<unsigned>((D / v + 255) / 256);
      const int64_t want = std::max<int64_t>(1, std::min<int64_t>((rows + 7) / 8, int64_t{d.sms} * 8 / col_blocks));
      int64_t per_split = (rows + want - 1) / want;
      const int64_t splits = (rows + per_split - 1) / per_split;
      o << " wgrad=columns col_blocks=" << col_blocks << " splits=" << splits << " per_split=" << per_split;
    } else {
      o << " wgrad=composed";
    }
  } else if (need_dw || need_db) {
    o << " wgrad=kernel";
  }
  return o.str();
}

// ---- softmax.cpp ----
RowBudget sm_fwd_budget() { return RowBudget{1, 0, 32, 1024, false, false, true}; }
RowBudget sm_bwd_budget() { return RowBudget{2, 0, 64, 512, false, false, false, true}; }
bool use_permuted(int64_t outer, int64_t D, int64_t inner) { return inner > 1 && outer * inner < 4096 && D > 64; }

std::string softmax_fwd(const Dev& d, DType t, int64_t outer, int64_t D, int64_t inner, int v) {
  Context& ctx = fake_ctx(d);
  if (use_permuted(outer, D, inner)) return "permute_to_rows rows=" + std::to_string(outer * inner);
  if (inner != 1) return "kernel=softmax_cols_fwd " + flat_str(d, outer * inner);
  if (smem_rows(t, D, v)) return "kernel=softmax_fwd_smem v=" + std::to_string(v) + " " + smem_launch_str(outer, D, t, 128);
  RowPlan p = plan_rows(ctx, outer, D, t, v, sm_fwd_budget());
  return std::string(p.stream ? "kernel=softmax_fwd_stream " : "kernel=softmax_fwd ") + plan_str(p);
}

std::string softmax_bwd(const Dev& d, DType t, int64_t outer, int64_t D, int64_t inner, int v) {
  Context& ctx = fake_ctx(d);
  if (use_permuted(outer, D, inner)) return "permute_to_rows rows=" + std::to_string(outer * inner);
  if (inner != 1) return "kernel=softmax_cols_bwd " + flat_str(d, outer * inner);
  RowPlan p = plan_rows(ctx, outer, D, t, v, sm_bwd_budget());
  unsigned smem = p.staged ? static_cast<unsigned>(2 * static_cast<size_t>(D) * dtype_size(t) * p.rpb) : 0;
  return std::string(p.stream ? "kernel=softmax_bwd_stream " : "kernel=softmax_bwd ") + plan_str(p) +
         " smem=" + std::to_string(smem);
}

// ---- loss.cpp ----
struct RowLaunch {
  int v = 1;
  bool warp = false;
  unsigned block = 256, grid = 1;
};
RowLaunch row_launch(int64_t M, int64_t C, DType dt, bool aligned) {
  RowLaunch L;
  L.v = full_v(dt);
  bool ok = C % L.v == 0 && aligned;
  if (!ok) L.v = 1;
  L.warp = C <= 1024;
  int64_t groups = L.warp ? (M + 7) / 8 : M;
  L.block = L.warp ? 256 : (C >= 16384 ? 512 : 256);
  L.grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(groups, int64_t{1} << 20)));
  return L;
}
RowLaunch fused_row_launch(const Dev& d, int64_t M, int64_t C, DType dt, bool aligned) {
  RowLaunch L = row_launch(M, C, dt, aligned);
  const int64_t sms = std::max(1, d.sms), rows_per_block = L.warp ? L.block / 32 : 1;
  const int64_t fit = d.l2 / 2 / (C * static_cast<int64_t>(dtype_size(dt)));
  const int64_t resident = sms * std::max<int64_t>(1, d.threads_per_sm / L.block) * rows_per_block;
  if (fit >= resident) return L;
  const int64_t per_sm = std::max<int64_t>(1, fit / (sms * rows_per_block));
  if (!L.warp && per_sm == 1) L.block = 1024;
  L.grid = static_cast<unsigned>(std::min<int64_t>(L.grid, sms * per_sm));
  return L;
}
std::string launch_str(const char* k, const RowLaunch& L) {
  std::ostringstream o;
  o << "kernel=" << k << " v=" << L.v << " warp=" << L.warp << " block=" << L.block << " grid=" << L.grid;
  return o.str();
}
std::string ce_fwd_grad(const Dev& d, DType t, int64_t M, int64_t C, bool aligned) {
  RowLaunch L = fused_row_launch(d, M, C, t, aligned);
  const int64_t row_bytes = C * static_cast<int64_t>(dtype_size(t));
  const int64_t kChunk = 480 * 16;
  if (d.cc_major >= 9 && t != FLAME_DTYPE_F64 && L.v == full_v(t) && row_bytes >= 32 * 1024 && row_bytes <= 30 * kChunk) {
    const int64_t chunks = (row_bytes + kChunk - 1) / kChunk;
    const int slots = chunks <= 14 ? 14 : 30, groups = chunks <= 14 ? 1 : 2;
    std::ostringstream o;
    o << "kernel=ce_index_fwd_grad_ring slots=" << slots << " groups=" << groups
      << " block=" << groups * 480 + 32 << " grid=" << std::min<int64_t>(M, d.sms * (30 / slots))
      << " smem=" << slots * (kChunk + 16);
    return o.str();
  }
  return launch_str("ce_index_fwd_grad", L);
}

// ---- batch_norm (nn_norm.cpp, bn_channel_pass): per-channel partial sums, a channel split over blocks ----
std::string bn_pass(const Dev& d, int64_t C, int64_t count) {
  int64_t chunks = 1, chunk_len = count;
  if (C < 2 * static_cast<int64_t>(d.sms) && count > 8192) {
    chunks = std::min<int64_t>((count + 4095) / 4096, std::max<int64_t>(1, 4 * d.sms / C));
    chunk_len = (count + chunks - 1) / chunks;
    chunks = (count + chunk_len - 1) / chunk_len;
  }
  std::ostringstream o;
  o << "chunks=" << chunks << " chunk_len=" << chunk_len
    << " reduce_grid=" << std::min<int64_t>(C * chunks, static_cast<int64_t>(d.sms) * 64) << " finalize_" << flat_str(d, C);
  return o.str();
}

void emit(const std::string& in, const std::string& out) { std::printf("%s -> %s\n", in.c_str(), out.c_str()); }

}  // namespace

int main() {
  for (const Dev& d : kDevs)
    for (DType t : kTypes)
      for (int64_t rows : kRows)
        for (int64_t D : kD)
          for (bool aligned : {true, false}) {
            if (!aligned && D % full_v(t) != 0) continue;  // v = 1 either way
            const int v = width(t, D, aligned);
            std::ostringstream k;
            k << d.name << " " << tname(t) << " rows=" << rows << " D=" << D << " aligned=" << aligned;
            const std::string key = k.str();
            for (int mode = 0; mode < 3; ++mode) {
              emit(std::string("norm_fwd ") + kNorm[mode] + " " + key, norm_fwd(d, mode, t, rows, D, v));
              // group norm: one channel per group (hw = D) or D channels of one value (hw = 1)
              for (int64_t hw : mode == 2 ? std::vector<int64_t>{D, 1} : std::vector<int64_t>{1})
                for (int flags : {1, 7, 6}) {  // dx; dx, dw, db; dw, db
                  const bool dx = flags & 1, dw = flags & 2, db = flags & 4;
                  std::ostringstream n;
                  n << "norm_bwd " << kNorm[mode] << " " << key << " hw=" << hw << " dx=" << dx << " dw=" << dw
                    << " db=" << db;
                  emit(n.str(), norm_bwd(d, mode, t, rows, D, hw, v, dx, dw, db));
                }
            }
            for (int64_t inner : {int64_t{1}, int64_t{3}, int64_t{5000}}) {
              std::ostringstream s;
              s << key << " inner=" << inner;
              emit("softmax_fwd " + s.str(), softmax_fwd(d, t, rows, D, inner, v));
              emit("softmax_bwd " + s.str(), softmax_bwd(d, t, rows, D, inner, v));
            }
            emit("ce_index_fwd " + key, launch_str("ce_index_fwd", row_launch(rows, D, t, aligned)));
            emit("ce_index_bwd " + key, launch_str("ce_index_bwd", row_launch(rows, D, t, aligned)));
            emit("ce_prob_fwd " + key, launch_str("ce_prob_fwd", row_launch(rows, D, t, aligned)));
            emit("ce_prob_bwd " + key, launch_str("ce_prob_bwd", row_launch(rows, D, t, aligned)));
            emit("ce_index_fwd_grad " + key, ce_fwd_grad(d, t, rows, D, aligned));
          }
  for (const Dev& d : kDevs)
    for (int64_t C : {1, 3, 64, 200, 264, 512})
      for (int64_t count : {2, 49, 8192, 8193, 100000, 1 << 22}) {
        std::ostringstream b;
        b << "bn_channels " << d.name << " C=" << C << " count=" << count;
        emit(b.str(), bn_pass(d, C, count) + " apply_" + flat_str(d, C * count));
      }
  return 0;
}
