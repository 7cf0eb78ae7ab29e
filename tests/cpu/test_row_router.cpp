// The row-kernel router (ops/row_router.h) replays tests/data/row_routing.txt: every decision the
// planning code made before the router (the table was dumped from it, commit 9d06476) must come out
// the same, line for line. A deliberate routing change regenerates the table (tools/row_routing_cases.h).
#include <gtest/gtest.h>
#include <fstream>
#include <string>
#include <vector>
#include "tools/row_routing_cases.h"

using namespace flame;

TEST(RowRouter, ReplaysTheCommittedRoutingTable) {
  std::ifstream in(FLAME_SOURCE_DIR "/tests/data/row_routing.txt");
  ASSERT_TRUE(in) << "cannot open tests/data/row_routing.txt";
  std::vector<std::string> want;
  for (std::string line; std::getline(in, line);) want.push_back(line);
  const std::vector<std::string> got = row_routing::routing_lines();
  ASSERT_EQ(got.size(), want.size()) << "the case grid changed: regenerate the table (tools/row_routing_cases.h)";
  ASSERT_GT(want.size(), 20000u);
  int shown = 0, differ = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    ++differ;
    if (shown++ < 20) ADD_FAILURE() << "line " << i + 1 << "\n  table:  " << want[i] << "\n  router: " << got[i];
  }
  EXPECT_EQ(differ, 0) << differ << " of " << want.size() << " decisions differ";
}

TEST(RowRouter, PlansWithinTheKernelsLaunchBounds) {
  // Every register-cached or streamed plan of the grid stays within the kernels' __launch_bounds__
  // (cuda/row_constants.cuh), and shared memory within an sm_90 block's 227 KiB.
  for (DType t : row_routing::kTypes)
    for (int64_t D : row_routing::kD) {
      RowProblem q;
      q.dtype = t;
      q.rows = 65536;
      q.D = D;
      q.v = D % row_routing::full_width(t) == 0 ? row_routing::full_width(t) : 1;
      for (RowOp op : {RowOp::NormForward, RowOp::NormBackward, RowOp::SoftmaxForward, RowOp::SoftmaxBackward,
                       RowOp::CrossEntropyRows, RowOp::CrossEntropyFusedGrad}) {
        q.op = op;
        q.need_weight_grads = true;
        const RowPlan p = plan_row_kernel(q, row_routing::kDevs[0].props);
        const unsigned threads = p.launch.threads_x * p.launch.threads_y;
        unsigned bound = kStreamRowsMaxThreads;
        if (p.path == RowPath::Registers || p.path == RowPath::Staged || p.path == RowPath::Global)
          bound = op == RowOp::SoftmaxForward ? kSoftmaxFwdMaxThreads
                  : op == RowOp::SoftmaxBackward ? kSoftmaxBwdMaxThreads
                                                 : kNormRowsMaxThreads;
        if (p.path == RowPath::SharedRow) bound = kSmemRowsMaxThreads;
        EXPECT_LE(threads, bound) << dtype_name(t) << " D=" << D << " op " << static_cast<int>(op);
        EXPECT_LE(p.launch.smem_bytes, 227u * 1024) << dtype_name(t) << " D=" << D << " op " << static_cast<int>(op);
        EXPECT_EQ(p.launch.smem_bytes > 48u * 1024, p.launch.smem_bytes > 48u * 1024 && p.launch.set_max_smem)
            << "more than 48 KiB of dynamic shared memory needs the attribute";
      }
    }
}
