// C entry points of CUDA graph capture and replay (runtime/capture.h), and flame_copy_from_host,
// which refills the static input tensors a graph reads between replays.
#include "api/guard.h"
#include "runtime/capture.h"

using namespace flame;

constexpr uint64_t kGraphMagic = 0xF1A3E69A00000001ull;

struct flame_graph_s {
  uint64_t magic;
  std::shared_ptr<Graph> graph;
};

namespace {

Graph& unwrap_graph(flame_graph_t g, const char* name = "graph") {
  FLAME_CHECK(g, FLAME_ERROR_INVALID_ARGUMENT, name, " is NULL");
  FLAME_CHECK(g->magic == kGraphMagic && g->graph, FLAME_ERROR_INVALID_HANDLE, name,
              " is not a live graph (released already?)");
  return *g->graph;
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_graph_capture_begin(flame_ctx_t ctx) {
  return api_call("flame_graph_capture_begin", [&] {
    Context& c = context_of(ctx);
    ContextScope scope(c);
    capture_begin(c);
  });
}

FLAME_API flame_status_t flame_graph_capture_begin_shared(flame_ctx_t ctx, flame_graph_t share_pool_with) {
  return api_call("flame_graph_capture_begin_shared", [&] {
    Context& c = context_of(ctx);
    std::shared_ptr<GraphPool> pool;
    if (share_pool_with) {
      Graph& other = unwrap_graph(share_pool_with, "share_pool_with");
      FLAME_CHECK(&other.ctx() == &c, FLAME_ERROR_INVALID_ARGUMENT, "share_pool_with belongs to another context than ctx");
      pool = other.pool();
    }
    ContextScope scope(c);
    capture_begin(c, pool);
  });
}

FLAME_API flame_status_t flame_graph_capture_end(flame_ctx_t ctx, flame_graph_t* graph) {
  return api_call("flame_graph_capture_end", [&] {
    if (graph) *graph = nullptr;
    Context& c = context_of(ctx);
    ContextScope scope(c);
    // graph NULL still ends (and discards) the capture, so that the context is usable afterwards.
    std::unique_ptr<Graph> g = capture_end(c);
    FLAME_CHECK(graph, FLAME_ERROR_INVALID_ARGUMENT, "graph is NULL (the captured graph is discarded)");
    auto h = std::make_unique<flame_graph_s>();
    h->magic = kGraphMagic;
    h->graph = std::move(g);
    *graph = h.release();
  });
}

FLAME_API flame_status_t flame_graph_replay(flame_graph_t graph) {
  return api_call("flame_graph_replay", [&] {
    Graph& g = unwrap_graph(graph);
    ContextScope scope(g.ctx());
    g.replay();
  });
}

// As the optimizer's: the emptied handle is parked in the context's dead_objects, so passing it
// again is FLAME_ERROR_INVALID_HANDLE while the context lives.
FLAME_API void flame_graph_release(flame_graph_t graph) {
  if (!graph || graph->magic != kGraphMagic || !graph->graph) return;
  std::shared_ptr<Context> keep = graph->graph->ctx().shared_from_this();
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  keep->bind();
  graph->magic = kDeadMagic;
  graph->graph.reset();
  try {
    keep->dead_objects.push_back(std::shared_ptr<flame_graph_s>(graph));
    if (keep->dead_objects.size() > 4096) keep->dead_objects.pop_front();
  } catch (...) {  // out of host memory: shared_ptr's constructor deleted the handle
  }
}

FLAME_API flame_status_t flame_copy_from_host(flame_tensor_t dst, const void* data, size_t nbytes) {
  return api_call("flame_copy_from_host", [&] {
    const Tensor& t = unwrap(dst, "dst");
    LiveScope scope(t);
    Context& c = t->ctx();
    c.forbid_in_capture("a copy from the host");
    FLAME_CHECK(t->contiguous(), FLAME_ERROR_INVALID_ARGUMENT, "dst is not contiguous");
    const size_t need = static_cast<size_t>(t->numel()) * t->elem_size();
    FLAME_CHECK(nbytes == need, FLAME_ERROR_INVALID_ARGUMENT, "nbytes is ", nbytes, " but dst holds ", need, " bytes");
    FLAME_CHECK(data || need == 0, FLAME_ERROR_INVALID_ARGUMENT, "data is NULL");
    // Pageable source: staged before the call returns; the copy runs in stream order, after the
    // replays queued before it and before those queued after it.
    if (need) c.check(c.drv.cuMemcpyHtoDAsync(t->data(), data, need, c.stream), "cuMemcpyHtoDAsync");
    t->storage->version.fetch_add(1);  // an in-place write, as far as saved tensors are concerned
  });
}

}  // extern "C"
