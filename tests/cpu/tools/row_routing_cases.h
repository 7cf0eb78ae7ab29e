// The cases of tests/data/row_routing.txt and their lines, from the row-kernel router
// (ops/row_router.h): flame_row_routing_dump prints them, test_row_router.cpp compares them with
// the committed table. The table was first written by the planning code that the router replaced
// (commit 9d06476, tools/row_routing_dump.cpp as it was then), so the test proves the router makes
// the same decisions. A deliberate routing change regenerates the table:
//
//   cmake --build build --target flame_row_routing_dump && build/tests/cpu/flame_row_routing_dump > tests/data/row_routing.txt
//
// and the commit explains the changed lines.
//
// Grid: sm_90 with 132 SMs, 50 MiB L2 (H100 SXM / H200) and sm_80 with 108 SMs, 40 MiB L2; f32, f16,
// bf16, f64; rows 1, 333, 65536; D from 1 to 65536 with odd sizes; pointers 16-byte aligned or not
// (v = 1). Per case: the three norms forward and backward (dx; dx, dw, db; dw, db; group norm with
// one channel per group or D channels), softmax forward / backward with the dim last, before 3 or
// 5000 inner elements, the cross-entropy row kernels and the fused forward with gradient; then
// batch_norm's channel passes.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>
#include "ops/row_router.h"

namespace flame::row_routing {

struct Dev {
  const char* name;
  RowDevice props;
};
inline const Dev kDevs[] = {{"sm90", {9, 132, 50 * 1024 * 1024, 2048}}, {"sm80", {8, 108, 40 * 1024 * 1024, 2048}}};
inline const DType kTypes[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64};
inline const int64_t kRows[] = {1, 333, 65536};
inline const int64_t kD[] = {1, 3, 100, 255, 768, 1000, 1024, 1032, 3000, 4096, 6144, 8192, 16384, 16392, 25000, 32768,
                             50304, 65536};
inline const char* const kNormNames[] = {"layer", "rms", "group"};

inline const char* type_name(DType t) {
  switch (t) {
    case FLAME_DTYPE_F32: return "f32";
    case FLAME_DTYPE_F16: return "f16";
    case FLAME_DTYPE_BF16: return "bf16";
    default: return "f64";
  }
}
inline int full_width(DType t) { return static_cast<int>(16 / dtype_size(t)); }

inline std::string rows_str(const RowPlan& p) {
  std::ostringstream o;
  const char* path = p.path == RowPath::Stream ? "stream"
                     : p.path == RowPath::Staged ? "staged"
                     : p.path == RowPath::Registers ? "regs"
                                                    : "global";
  o << "path=" << path << " nv=" << p.nv << " v=" << p.v << " tpr=" << p.launch.threads_x << " rpb=" << p.launch.threads_y
    << " grid=" << p.launch.grid;
  return o.str();
}
inline std::string shared_row_str(const RowPlan& p) {
  std::ostringstream o;
  o << "tpr=" << p.launch.threads_x << " grid=" << p.launch.grid << " smem=" << p.launch.smem_bytes;
  return o.str();
}
inline std::string ring_str(const RowPlan& p) {
  std::ostringstream o;
  o << "block=" << p.launch.threads_x << " grid=" << p.launch.grid << " smem=" << p.launch.smem_bytes;
  return o.str();
}

inline std::string norm_forward_line(const RowPlan& p) {
  if (p.path == RowPath::SharedRow) return "kernel=norm_fwd_block smem_row=1 v=" + std::to_string(p.v) + " " + shared_row_str(p);
  return std::string(p.path == RowPath::Stream ? "kernel=norm_fwd_block smem_row=0 " : "kernel=norm_fwd ") + rows_str(p);
}

inline std::string norm_backward_line(const RowProblem& q, const RowPlan& p) {
  std::ostringstream o;
  if (p.path == RowPath::Ring) {
    o << "kernel=norm_bwd_ring " << ring_str(p);
  } else if (p.path == RowPath::Stream) {
    o << "kernel=norm_bwd_stream " << rows_str(p);
  } else if (p.path == RowPath::None) {
    o << "kernel=none";
  } else {
    const int row = p.path == RowPath::Staged ? kRowSmem : (p.path == RowPath::Registers ? kRowRegs : kRowGlobal);
    const bool in_kernel = p.weight_grads == WeightGrads::InKernel;
    const int64_t partial = !in_kernel ? 0 : (q.norm == RowNorm::Group ? -1 : p.partial_rows);
    o << "kernel=norm_bwd row=" << row << " wb=" << p.weight_grads_template << " " << rows_str(p)
      << " smem=" << p.launch.smem_bytes << " partial_rows=" << partial << " seg_aligned=" << p.segment_aligned;
  }
  switch (p.weight_grads) {
    case WeightGrads::None: break;
    case WeightGrads::InKernel: o << " wgrad=kernel"; break;
    case WeightGrads::Composed: o << " wgrad=composed"; break;
    case WeightGrads::Columns:
      o << " wgrad=columns col_blocks=" << p.columns.col_blocks << " splits=" << p.columns.splits
        << " per_split=" << p.columns.rows_per_split;
      break;
  }
  return o.str();
}

inline std::string softmax_line(const RowProblem& q, const RowPlan& p, bool forward) {
  const std::string dir = forward ? "fwd" : "bwd";
  if (p.path == RowPath::PermuteToRows) return "permute_to_rows rows=" + std::to_string(q.rows * q.inner);
  if (p.path == RowPath::Columns) return "kernel=softmax_cols_" + dir + " flat_grid=" + std::to_string(p.launch.grid);
  if (p.path == RowPath::SharedRow) return "kernel=softmax_fwd_smem v=" + std::to_string(p.v) + " " + shared_row_str(p);
  std::string s = std::string("kernel=softmax_") + dir + (p.path == RowPath::Stream ? "_stream " : " ") + rows_str(p);
  if (!forward) s += " smem=" + std::to_string(p.launch.smem_bytes);
  return s;
}

inline std::string ce_line(const char* kernel, const RowPlan& p) {
  std::ostringstream o;
  if (p.path == RowPath::Ring) {
    o << "kernel=" << kernel << "_ring slots=" << p.ring.slots << " groups=" << p.ring.groups << " " << ring_str(p);
  } else {
    o << "kernel=" << kernel << " v=" << p.v << " warp=" << (p.path == RowPath::WarpPerRow)
      << " block=" << p.launch.threads_x << " grid=" << p.launch.grid;
  }
  return o.str();
}

inline std::string batch_norm_line(const RowPlan& p) {
  std::ostringstream o;
  const ChannelSplit& s = p.channels;
  o << "chunks=" << s.chunks << " chunk_len=" << s.chunk_len << " reduce_grid=" << s.reduce_grid
    << " finalize_flat_grid=" << s.finalize_grid << " apply_flat_grid=" << s.apply_grid;
  return o.str();
}

// Every case as "<inputs> -> <decision>", in the table's order.
inline std::vector<std::string> routing_lines() {
  std::vector<std::string> lines;
  auto emit = [&](const std::string& in, const std::string& out) { lines.push_back(in + " -> " + out); };
  for (const Dev& d : kDevs)
    for (DType t : kTypes)
      for (int64_t rows : kRows)
        for (int64_t D : kD)
          for (bool aligned : {true, false}) {
            if (!aligned && D % full_width(t) != 0) continue;  // v = 1 either way
            RowProblem q;
            q.dtype = t;
            q.rows = rows;
            q.D = D;
            q.v = aligned && D % full_width(t) == 0 ? full_width(t) : 1;
            std::ostringstream k;
            k << d.name << " " << type_name(t) << " rows=" << rows << " D=" << D << " aligned=" << aligned;
            const std::string key = k.str();
            for (RowNorm norm : {RowNorm::Layer, RowNorm::Rms, RowNorm::Group}) {
              const char* name = kNormNames[static_cast<int>(norm)];
              q.op = RowOp::NormForward;
              q.norm = norm;
              emit(std::string("norm_fwd ") + name + " " + key, norm_forward_line(plan_row_kernel(q, d.props)));
              q.op = RowOp::NormBackward;
              for (int64_t hw : norm == RowNorm::Group ? std::vector<int64_t>{D, 1} : std::vector<int64_t>{1})
                for (int flags : {1, 7, 6}) {  // dx; dx, dw, db; dw, db
                  q.hw = hw;
                  q.need_dx = flags & 1;
                  q.need_weight_grads = flags & 6;
                  std::ostringstream n;
                  n << "norm_bwd " << name << " " << key << " hw=" << hw << " dx=" << (flags & 1)
                    << " dw=" << ((flags & 2) != 0) << " db=" << ((flags & 4) != 0);
                  emit(n.str(), norm_backward_line(q, plan_row_kernel(q, d.props)));
                }
              q.hw = 1;
            }
            for (int64_t inner : {int64_t{1}, int64_t{3}, int64_t{5000}}) {
              std::ostringstream s;
              s << key << " inner=" << inner;
              q.inner = inner;
              q.op = RowOp::SoftmaxForward;
              emit("softmax_fwd " + s.str(), softmax_line(q, plan_row_kernel(q, d.props), true));
              q.op = RowOp::SoftmaxBackward;
              emit("softmax_bwd " + s.str(), softmax_line(q, plan_row_kernel(q, d.props), false));
            }
            q.inner = 1;
            q.op = RowOp::CrossEntropyRows;
            const RowPlan ce = plan_row_kernel(q, d.props);
            for (const char* kernel : {"ce_index_fwd", "ce_index_bwd", "ce_prob_fwd", "ce_prob_bwd"})
              emit(std::string(kernel) + " " + key, ce_line(kernel, ce));
            q.op = RowOp::CrossEntropyFusedGrad;
            emit("ce_index_fwd_grad " + key, ce_line("ce_index_fwd_grad", plan_row_kernel(q, d.props)));
          }
  for (const Dev& d : kDevs)
    for (int64_t C : {1, 3, 64, 200, 264, 512})
      for (int64_t count : {2, 49, 8192, 8193, 100000, 1 << 22}) {
        RowProblem q;
        q.op = RowOp::BatchNormChannels;
        q.rows = C;
        q.D = count;
        std::ostringstream b;
        b << "bn_channels " << d.name << " C=" << C << " count=" << count;
        emit(b.str(), batch_norm_line(plan_row_kernel(q, d.props)));
      }
  return lines;
}

}  // namespace flame::row_routing
