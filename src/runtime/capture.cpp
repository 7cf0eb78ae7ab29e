// CUDA graph capture and the capture's private pool: see capture.h for the design.
#include "runtime/capture.h"
#include "core/error.h"
#include "runtime/blas.h"

namespace flame {

namespace {

// The context whose capture the failing call on this thread aborted, until api_call hands over the
// status and message (ContextScope's destructor runs before api_call's catch block).
thread_local std::weak_ptr<Context> t_aborted_capture;

// After a capture: blocks that tensors hold are shared with them, the rest belong to the graph.
void finish_pool(Context& c, const std::shared_ptr<GraphPool>& pool) noexcept {
  try {
    for (CUdeviceptr p : pool->live) c.graph_held[p] = pool;
    for (CUdeviceptr p : pool->setup_live) c.graph_held[p] = pool;
    for (auto& kv : pool->free_blocks) pool->graph_only.push_back(kv.second);
  } catch (...) {  // out of host memory: the blocks not listed leak rather than being freed under the graph
  }
  pool->live.clear();
  pool->setup_live.clear();
  pool->free_blocks.clear();
}

// A graph (or an abandoned capture) lets go of its pool. The last user's blocks go back (held ones
// when their tensors go); while other graphs share the pool, every block stays with them.
void release_pool(Context& c, GraphPool& pool) noexcept {
  if (--pool.users > 0) return;
  pool.released = true;
  for (CUdeviceptr p : pool.graph_only) c.release_block(p);
  pool.graph_only.clear();
}

// A shared capture's starting free list: the pool's capture-memory blocks that only earlier graphs
// use (graph_only and in `sizes`); set-up memory and pre-capture blocks stay in graph_only.
struct ReusableBlocks {
  std::multimap<size_t, CUdeviceptr> free_blocks;
  std::vector<CUdeviceptr> graph_only;
};

ReusableBlocks reusable_blocks(const GraphPool& pool) {
  ReusableBlocks r;
  for (CUdeviceptr p : pool.graph_only) {
    auto it = pool.sizes.find(p);
    if (it != pool.sizes.end()) r.free_blocks.emplace(it->second, p);
    else r.graph_only.push_back(p);
  }
  return r;
}

// The capture starts using the pool (after everything that can fail: nothing throws here).
void join_pool(GraphPool& pool, ReusableBlocks& reusable) noexcept {
  pool.free_blocks.swap(reusable.free_blocks);
  pool.graph_only.swap(reusable.graph_only);
  ++pool.users;
}

// The stream waits for the side stream's set-up work (after a capture ended or was abandoned).
void join_side_stream(Context& c) noexcept {
  if (c.drv.cuEventRecord(c.side_events[1], c.side_stream) == CUDA_SUCCESS)
    c.drv.cuStreamWaitEvent(c.stream, c.side_events[1], 0);
  else
    c.drv.cuStreamSynchronize(c.side_stream);  // cannot order by event: wait for it instead
}

// The side stream and its events, made on the first capture.
void make_side_stream(Context& c) {
  if (!c.side_stream) {
    // The side stream may reuse pool blocks freed on the stream before a capture (it waits for them
    // by event: capture_begin), but the pool must never order it after the stream by itself: that
    // would make it wait on the capturing stream. Eager work allocates on one stream only, so this
    // changes nothing outside captures.
    int no = 0;
    c.check(c.drv.cuMemPoolSetAttribute(c.pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &no),
            "cuMemPoolSetAttribute");
    c.check(c.drv.cuStreamCreate(&c.side_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }
  for (CUevent& e : c.side_events)
    if (!e) c.check(c.drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
}

}  // namespace

RelaxedCaptureMode::RelaxedCaptureMode(Context& c) : c_(c) {
  if (!c.capture) return;
  prev_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  swapped_ = c.drv.cuThreadExchangeStreamCaptureMode(&prev_) == CUDA_SUCCESS;
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (swapped_) c_.drv.cuThreadExchangeStreamCaptureMode(&prev_);
}

void ContextScope::note_capture_failure(Context& c) noexcept {
  if (!c.capture) return;
  c.capture->failed = true;
  t_aborted_capture = c.weak_from_this();
}

void record_capture_error(flame_status_t status, const std::string& message) noexcept {
  std::shared_ptr<Context> c = t_aborted_capture.lock();
  if (!c) return;
  t_aborted_capture.reset();
  std::lock_guard<std::recursive_mutex> lock(c->mutex);
  if (!c->capture || c->capture->status != FLAME_OK) return;  // the first failure is the one reported
  c->capture->status = status;
  try {
    c->capture->message = message;
  } catch (...) {
  }
}

void Context::forbid_in_capture(const char* what) const {
  if (capture)
    fail(FLAME_ERROR_UNSUPPORTED, what,
         " is not allowed while the context captures a CUDA graph (between flame_graph_capture_begin and _end)");
}

void Context::release_block(CUdeviceptr p) noexcept {
  if (capture) {  // the graph being captured may read it
    try {
      capture->pool->graph_only.push_back(p);
    } catch (...) {  // out of host memory: leak it
    }
    return;
  }
  drv.cuMemFreeAsync(p, stream);
}

CUdeviceptr capture_allocate(Context& c, size_t bytes) {
  GraphPool& pool = *c.capture->pool;
  const bool setup = c.setup_depth > 0;
  if (!setup) {  // best fit among the blocks freed earlier in this capture, wasting at most half
    auto it = pool.free_blocks.lower_bound(bytes);
    if (it != pool.free_blocks.end() && it->first <= 2 * bytes) {
      const CUdeviceptr p = it->second;
      pool.live.insert(p);
      pool.free_blocks.erase(it);
      return p;
    }
  }
  CUdeviceptr p = 0;
  CUresult r;
  {
    RelaxedCaptureMode relaxed(c);  // an ordinary allocation on the side stream, not a graph node
    r = c.drv.cuMemAllocFromPoolAsync(&p, bytes, c.pool, c.side_stream);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) c.fail_out_of_memory(bytes, Context::OomCause::Capture);
  c.check(r, "cuMemAllocFromPoolAsync");
  try {
    if (setup) {
      pool.setup_live.insert(p);
    } else {  // capture memory: another capture of the pool may reuse it once nothing holds it
      pool.sizes.emplace(p, bytes);
      pool.live.insert(p);
    }
  } catch (...) {
    pool.sizes.erase(p);
    pool.graph_only.push_back(p);  // reserved, freed with the graph (no free while capturing)
    throw;
  }
  return p;
}

void capture_deallocate(Context& c, CUdeviceptr p) noexcept {
  try {
    if (c.capture) {
      GraphPool& pool = *c.capture->pool;
      if (pool.live.count(p)) {  // back to the capture's pool, for later allocations of the capture
        pool.free_blocks.emplace(pool.sizes.at(p), p);
        pool.live.erase(p);
        return;
      }
      if (pool.setup_live.erase(p)) {  // set-up memory the graph reads: never reused
        pool.graph_only.push_back(p);
        return;
      }
    }
    auto it = c.graph_held.find(p);
    if (it != c.graph_held.end()) {
      std::shared_ptr<GraphPool> owner = std::move(it->second);
      c.graph_held.erase(it);
      if (!owner->released) {  // the graph still writes it on every replay
        owner->graph_only.push_back(p);
        return;
      }
    }
  } catch (...) {  // out of host memory: leaking is safe, freeing memory a graph uses is not
    return;
  }
  c.release_block(p);
}

void Context::abort_capture() noexcept {
  if (!capture) return;
  CUgraph g = nullptr;
  drv.cuStreamEndCapture(stream, &g);
  std::unique_ptr<Capture> cap = std::move(capture);
  if (g) drv.cuGraphDestroy(g);
  join_side_stream(*this);
  finish_pool(*this, cap->pool);
  release_pool(*this, *cap->pool);
}

void capture_begin(Context& c, const std::shared_ptr<GraphPool>& shared) {
  FLAME_CHECK(!c.capture, FLAME_ERROR_INVALID_ARGUMENT, "the context is capturing a graph already (captures do not nest)");
  FLAME_CHECK(!shared || shared->users > 0, FLAME_ERROR_INVALID_ARGUMENT,
              "the pool to share belongs to no live graph");
  c.check_alive();
  blas(c);  // the cuBLASLt handle and its workspace: cublasLtCreate is no graph work
  make_side_stream(c);
  // Set-up work on the side stream comes after everything queued so far.
  c.check(c.drv.cuEventRecord(c.side_events[0], c.stream), "cuEventRecord");
  c.check(c.drv.cuStreamWaitEvent(c.side_stream, c.side_events[0], 0), "cuStreamWaitEvent");
  auto cap = std::make_unique<Capture>();
  if (shared) cap->pool = shared;
  cap->thread = std::this_thread::get_id();
  ReusableBlocks reusable = reusable_blocks(*cap->pool);
  c.check(c.drv.cuStreamBeginCapture(c.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  join_pool(*cap->pool, reusable);
  c.capture = std::move(cap);
}

std::unique_ptr<Graph> capture_end(Context& c) {
  FLAME_CHECK(c.capture, FLAME_ERROR_INVALID_ARGUMENT, "the context is not capturing a graph (no flame_graph_capture_begin)");
  FLAME_CHECK(c.capture->thread == std::this_thread::get_id(), FLAME_ERROR_INVALID_ARGUMENT,
              "the capture must end on the thread that began it (it is aborted now; end it there)");
  CUgraph g = nullptr;
  CUresult r = c.drv.cuStreamEndCapture(c.stream, &g);
  std::unique_ptr<Capture> cap = std::move(c.capture);  // from here on, frees are real frees again
  join_side_stream(c);
  auto discard = [&] {
    if (g) c.drv.cuGraphDestroy(g);
    finish_pool(c, cap->pool);
    release_pool(c, *cap->pool);
  };
  if (cap->failed) {
    discard();
    fail(cap->status != FLAME_OK ? cap->status : FLAME_ERROR_UNSUPPORTED,
         "the capture was aborted by a call that failed during it; the graph is discarded: ",
         cap->message.empty() ? std::string("(no message)") : cap->message);
  }
  if (r != CUDA_SUCCESS || !g) {
    discard();
    c.check(r != CUDA_SUCCESS ? r : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "cuStreamEndCapture");
  }
  CUgraphExec exec = nullptr;
  r = c.drv.cuGraphInstantiateWithFlags(&exec, g, 0);
  if (r != CUDA_SUCCESS) {
    discard();
    c.check(r, "cuGraphInstantiateWithFlags");
  }
  finish_pool(c, cap->pool);
  try {
    return std::make_unique<Graph>(c.shared_from_this(), g, exec, std::move(cap));
  } catch (...) {
    c.drv.cuGraphExecDestroy(exec);
    c.drv.cuGraphDestroy(g);
    throw;  // the pool's own blocks leak (host out of memory)
  }
}

Graph::Graph(std::shared_ptr<Context> ctx, CUgraph g, CUgraphExec exec, std::unique_ptr<Capture> cap)
    : ctx_(std::move(ctx)), graph_(g), exec_(exec), cap_(std::move(cap)) {}

Graph::~Graph() {
  Context& c = *ctx_;
  std::lock_guard<std::recursive_mutex> lock(c.mutex);
  c.bind();
  RelaxedCaptureMode relaxed(c);  // released while another capture runs: no graph work either
  release_pool(c, *cap_->pool);   // stream-ordered after every replay queued so far
  c.drv.cuGraphExecDestroy(exec_);  // an exec still running is freed when it completes
  c.drv.cuGraphDestroy(graph_);
}

void Graph::replay() {
  Context& c = *ctx_;
  c.check_alive();
  c.forbid_in_capture("replaying a graph");
  c.check(c.drv.cuGraphLaunch(exec_, c.stream), "cuGraphLaunch");
  for (auto& f : cap_->on_replay) f();
  if (cap_->arms_device_error) c.arm_device_error();
}

}  // namespace flame
