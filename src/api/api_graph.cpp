// C entry points of CUDA graph capture and replay (runtime/capture.h), and the in-place copies that
// refill the static input tensors a graph reads between replays: flame_copy_from_host (from the
// host) and flame_copy (from another tensor on the device; ops::copy_into).
#include "api/guard.h"
#include "ops/ops.h"
#include "runtime/capture.h"

using namespace flame;

constexpr uint64_t kGraphMagic = 0xF1A3E69A00000001ull;

struct flame_graph_s {
  uint64_t magic;
  std::shared_ptr<Graph> graph;
};

namespace {

Graph& unwrap_graph(flame_graph_t g) {
  FLAME_CHECK(g, FLAME_ERROR_INVALID_ARGUMENT, "graph is NULL");
  FLAME_CHECK(g->magic == kGraphMagic && g->graph, FLAME_ERROR_INVALID_HANDLE, "graph is not a live graph (released already?)");
  return *g->graph;
}

// The element offsets [lo, hi) a tensor's view can touch (negative strides included).
std::pair<int64_t, int64_t> element_span(const TensorImpl& t) {
  int64_t lo = t.offset, hi = t.offset;
  for (int d = 0; d < t.ndim(); ++d) {
    const int64_t reach = (t.shape[d] - 1) * t.strides[d];
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo, hi + 1};
}

// Whether src and dst touch common bytes of one storage (never for empty tensors).
bool memory_overlaps(const TensorImpl& dst, const TensorImpl& src) {
  if (dst.storage != src.storage || dst.numel() == 0 || src.numel() == 0) return false;
  const auto [dlo, dhi] = element_span(dst);
  const auto [slo, shi] = element_span(src);
  const int64_t de = static_cast<int64_t>(dst.elem_size()), se = static_cast<int64_t>(src.elem_size());
  return dlo * de < shi * se && slo * se < dhi * de;
}

bool same_view(const TensorImpl& a, const TensorImpl& b) {
  return a.storage == b.storage && a.offset == b.offset && a.dtype == b.dtype && a.shape == b.shape &&
         a.strides == b.strides;
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

FLAME_API flame_status_t flame_copy(flame_tensor_t dst, flame_tensor_t src) {
  return api_call("flame_copy", [&] {
    const Tensor& d = unwrap(dst, "dst");
    const Tensor& s = unwrap(src, "src");
    FLAME_CHECK(&d->ctx() == &s->ctx(), FLAME_ERROR_INVALID_ARGUMENT, "src belongs to another context than dst");
    LiveScope scope(d);
    FLAME_CHECK(d->shape == s->shape, FLAME_ERROR_SHAPE_MISMATCH, "dst has shape ", shape_str(d->shape), " but src ",
                shape_str(s->shape));
    FLAME_CHECK(d->contiguous(), FLAME_ERROR_INVALID_ARGUMENT, "dst is not contiguous");
    FLAME_CHECK(!requires_grad(*d) || !d->ctx().recording(), FLAME_ERROR_INVALID_ARGUMENT,
                "dst requires grad: write it with grad mode off (flame_ctx_set_grad_enabled)");
    if (same_view(*d, *s)) return;
    FLAME_CHECK(!memory_overlaps(*d, *s), FLAME_ERROR_INVALID_ARGUMENT,
                "src and dst overlap in memory (copy through flame_clone first)");
    ops::copy_into(d, s);
  });
}

}  // extern "C"
