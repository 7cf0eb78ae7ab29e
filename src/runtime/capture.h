// CUDA graph capture of a context's stream (flame_graph_*), and the private memory pool of a capture.
//
// Capture. flame_graph_capture_begin puts the context's stream into capture mode
// (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL); every FLAME call on the context then records its kernels,
// memsets and device copies into a graph instead of running them, until flame_graph_capture_end
// instantiates the graph. Thread-local rather than global: a capture on one context must not forbid
// driver calls on other threads (other contexts keep working), while a call on the capturing thread
// that the capture cannot represent still fails loudly instead of producing a wrong graph. Rather
// than relaxed: FLAME's own side work (below) is the only unsafe call it means to make, and it
// switches to relaxed around exactly those calls (cuThreadExchangeStreamCaptureMode).
//
// Memory. Nothing may allocate with cuMemAlloc, free, or synchronise while capturing, and a block the
// graph uses must keep its address for every replay. As PyTorch does, a capture gets its own pool:
// - A block allocated during the capture is a real block of the context's CUmemoryPool, allocated
//   with cuMemAllocFromPoolAsync on the context's side stream (a second stream that is never
//   captured): an ordinary stream-ordered allocation, not a graph node. The side stream waits for
//   the work queued before the capture, and the stream waits for the side stream when the capture
//   ends, so the block exists before the first replay. (Allocating on the capturing stream itself
//   would make a graph memory node, whose address is unmapped outside the graph's launches, so a
//   tensor the user keeps could not be read between replays.)
// - A block freed during the capture goes back to the capture's pool and may serve a later
//   allocation of the same capture: safe, since the graph runs its nodes in capture order.
// - A block that existed before the capture and is freed during it is kept until the graph is
//   released (the graph may still read it); so is every block freed by a released graph while
//   another capture is in progress.
// - When the capture ends, blocks that tensors still hold (outputs such as the loss, new .grad
//   tensors) stay valid and are rewritten by every replay; each is freed when both its tensor and
//   the graph (every graph of a shared pool) are gone (Context::graph_held). All other blocks of the
//   pool belong to the graph.
// - Set-up memory (SetupScope): state that must persist across replays (optimizer moments, the
//   optimizer's step/lr record) or constant tables the graph reads (the optimizer's tensor tables) are
//   allocated the same way but initialised on the side stream at capture time, once, and are never
//   handed to another allocation of the capture.
//
// Shared pools (flame_graph_capture_begin_shared, PyTorch's graph(pool=other.pool())). Graphs of the
// same step at several input shapes can capture into one pool, so that together they hold about
// what the largest one needs. At the start of a shared capture, the capture's free list is the
// pool's capture-memory blocks that nothing else holds: the earlier captures' graph_only blocks
// (their intermediates, and kept outputs whose tensors are gone). Blocks that tensors still hold
// (GraphPool::sizes minus graph_only) are never handed out, nor is set-up memory or a block that
// existed before a capture (neither is in `sizes`). This is safe because the graphs of one pool
// never run at the same time: they replay in stream order on their one context, and each graph
// writes a block before it reads it within a replay. The cost is the documented one: the kept
// output of a capture may sit in a block that an earlier graph of the pool uses as an
// intermediate, so replaying that graph overwrites it. The pool counts its users (a capture, then
// the graph it becomes); only when the last one goes is it `released`: its graph_only blocks go
// back to the device, and blocks kept by tensors are freed as their tensors go.
//
// Kernels. A kernel first used during a capture is compiled (NVRTC, host only) and its module loaded
// with the thread in relaxed mode. Drivers of CUDA 12.3 and newer load modules while a stream
// captures (NVIDIA Warp's capture_begin documents this; it preloads modules only on older drivers);
// on an older driver the load may invalidate the capture, which capture_end then reports. A warm-up
// step before capturing avoids the question, and it also lets cuBLASLt time its candidates.
//
// Errors. Host copies, synchronisation, random numbers and anything else the graph could not
// replay faithfully throw FLAME_ERROR_UNSUPPORTED; any failed call aborts the capture, so that
// flame_graph_capture_end returns that call's status and message and discards the graph, leaving
// the context usable.
#pragma once
#include <cuda.h>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include "runtime/context.h"

namespace flame {

// The private memory of one graph, or of several graphs sharing it (fields live, setup_live and
// free_blocks describe the capture in progress; they are empty between captures).
struct GraphPool {
  std::unordered_map<CUdeviceptr, size_t> sizes;   // every capture-memory block of the pool: its size
  std::unordered_set<CUdeviceptr> live;            // held now (capture memory)
  std::unordered_set<CUdeviceptr> setup_live;      // held now (set-up memory, never reused)
  std::multimap<size_t, CUdeviceptr> free_blocks;  // free during the capture: reusable within it
  std::vector<CUdeviceptr> graph_only;             // blocks only the graphs need (freed at release)
  int users = 0;                                   // captures and graphs using the pool
  bool released = false;                           // the last user is gone (graph released, capture aborted)
};

struct Capture {
  std::shared_ptr<GraphPool> pool = std::make_shared<GraphPool>();
  std::thread::id thread;          // capture_end must come from this thread (thread-local mode)
  bool failed = false;             // a call failed during the capture: end discards the graph
  flame_status_t status = FLAME_OK;
  std::string message;
  bool arms_device_error = false;  // a captured kernel checks indices (runtime/context.h)
  std::vector<std::function<void()>> on_replay;  // host bookkeeping per replay (optimizer step counts)
};

// Allocations inside are set-up memory while the context captures (see the top of this file).
class SetupScope {
 public:
  explicit SetupScope(Context& c) : c_(c) { ++c_.setup_depth; }
  ~SetupScope() { --c_.setup_depth; }
  SetupScope(const SetupScope&) = delete;
  SetupScope& operator=(const SetupScope&) = delete;

 private:
  Context& c_;
};

// Switches the calling thread to CU_STREAM_CAPTURE_MODE_RELAXED for one set-up call (side-stream
// allocation or copy, module load) and back.
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(Context& c);
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  Context& c_;
  CUstreamCaptureMode prev_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool swapped_ = false;
};

// An instantiated graph and the memory it owns (the C handle flame_graph_t wraps one).
class Graph {
 public:
  Graph(std::shared_ptr<Context> ctx, CUgraph g, CUgraphExec exec, std::unique_ptr<Capture> cap);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void replay();
  Context& ctx() { return *ctx_; }
  const std::shared_ptr<GraphPool>& pool() const { return cap_->pool; }

 private:
  std::shared_ptr<Context> ctx_;
  CUgraph graph_;
  CUgraphExec exec_;
  std::unique_ptr<Capture> cap_;
};

// flame_graph_capture_begin(_shared) / _end (the context is locked by the caller). shared: the pool
// of a live graph of ctx to capture into (see "Shared pools" above), or NULL for a pool of its own.
void capture_begin(Context& ctx, const std::shared_ptr<GraphPool>& shared = nullptr);
std::unique_ptr<Graph> capture_end(Context& ctx);

}  // namespace flame
