// C entry points of the DLPack exchange (flame.h, "DLPack exchange").
//
// Export: a heap holder owns the DLManagedTensor(Versioned), the shape/stride arrays it points to
// and an alias of the tensor (same Storage, no autograd), which keeps the memory and the context
// alive; the deleter deletes the holder under the context's lock, from whatever thread calls it.
// Import: the foreign memory becomes a Storage whose release first waits for the context's stream
// (FLAME's queued kernels may still use the memory) and then calls the producer's deleter once.
// The deleter is armed only after every allocation succeeded, so that a failed import leaves src
// with the caller. A FLAME export that comes back to its own context reuses its Storage: one
// version counter, no second owner.
#include "api/guard.h"
#include "tensor/autograd_graph.h"
#include "interop/dlpack.h"

using namespace flame;

namespace {

template <class Managed>
struct ExportHolder {
  Managed managed{};
  Tensor tensor;
  int64_t shape[FLAME_MAX_DIMS] = {};
  int64_t strides[FLAME_MAX_DIMS] = {};
};

template <class Managed>
void export_deleter(Managed* self) noexcept {
  if (!self) return;
  auto* h = static_cast<ExportHolder<Managed>*>(self->manager_ctx);
  std::shared_ptr<Context> keep = h->tensor->storage->ctx;
  // Deleters run on the consumer's threads: give them back their current CUDA context.
  CUcontext prev = nullptr;
  bool restore = keep->drv.cuCtxGetCurrent(&prev) == CUDA_SUCCESS;
  Driver& drv = keep->drv;
  {
    std::lock_guard<std::recursive_mutex> lock(keep->mutex);
    keep->bind();
    delete h;  // returns the memory to the pool unless other tensors still hold it
  }
  // The Driver lives in the Context: restore before the context can go with `keep`.
  if (restore) drv.cuCtxSetCurrent(prev);
}

template <class Managed>
Managed* make_export(const Tensor& x) {
  Context& c = x->ctx();
  c.synchronize();  // the consumer may use the data on any stream from now on
  auto h = std::make_unique<ExportHolder<Managed>>();
  h->tensor = alias(x);
  DLTensor& d = h->managed.dl_tensor;
  d.data = reinterpret_cast<void*>(static_cast<uintptr_t>(x->data()));
  d.device.device_type = kDLCUDA;
  d.device.device_id = c.ordinal;
  d.ndim = x->ndim();
  d.dtype = dlpack::to_dl(x->dtype);
  for (int i = 0; i < x->ndim(); ++i) {
    h->shape[i] = x->shape[static_cast<size_t>(i)];
    h->strides[i] = x->strides[static_cast<size_t>(i)];
  }
  d.shape = h->shape;
  d.strides = h->strides;
  d.byte_offset = 0;
  h->managed.manager_ctx = h.get();
  h->managed.deleter = &export_deleter<Managed>;
  return &h.release()->managed;
}

Tensor view_of(Context& c, std::shared_ptr<Storage> storage, const dlpack::Layout& l, int64_t offset) {
  auto t = std::make_shared<TensorImpl>();
  t->storage = std::move(storage);
  t->shape = l.shape;
  t->strides = l.strides;
  t->offset = offset;
  t->dtype = l.dtype;
  if (c.mode.inference) autograd_meta(*t).is_inference = true;  // as make_tensor
  return t;
}

// Imports src into c and returns the new handle; src is taken over only when this returns.
template <class Managed>
flame_tensor_t import_managed(Context& c, Managed* src, const char* arg) {
  dlpack::Layout l = dlpack::import_layout(src->dl_tensor, c.ordinal, arg);

  if (src->deleter == &export_deleter<Managed>) {  // our own export, back home?
    auto* h = static_cast<ExportHolder<Managed>*>(src->manager_ctx);
    const std::shared_ptr<Storage>& st = h->tensor->storage;
    const uint64_t elem = dtype_size(l.dtype), lo = st->ptr, hi = st->ptr + st->bytes;
    if (st->ctx.get() == &c && h->tensor->dtype == l.dtype &&
        (l.bytes == 0 || (l.base >= lo && l.base + l.bytes <= hi && (l.base - lo) % elem == 0))) {
      int64_t offset = l.bytes == 0 ? 0 : static_cast<int64_t>((l.base - lo) / elem) + l.offset;
      flame_tensor_t out = wrap(view_of(c, st, l, offset));
      src->deleter(src);
      return out;
    }
  }

  // Foreign memory. `armed` turns on once nothing can fail any more: before that, destroying the
  // storage (an exception below) must not call the deleter the caller still owns.
  auto armed = std::make_shared<std::atomic<bool>>(false);
  Context* cp = &c;  // the Storage holding this closure keeps the context alive
  auto release = [cp, src, armed] {
    if (!armed->load()) return;
    {
      std::lock_guard<std::recursive_mutex> lock(cp->mutex);
      cp->bind();
      cp->drv.cuStreamSynchronize(cp->stream);  // FLAME's queued work on the memory ends first
    }
    if (src->deleter) src->deleter(src);
  };
  auto storage = std::make_shared<Storage>(c.shared_from_this(), static_cast<CUdeviceptr>(l.base), l.bytes, release);
  flame_tensor_t out = wrap(view_of(c, std::move(storage), l, l.offset));
  armed->store(true);
  return out;
}

#if FLAME_HAVE_DLPACK_VERSIONED
void check_version(const DLManagedTensorVersioned* src) {
  FLAME_CHECK(src->version.major == DLPACK_MAJOR_VERSION, FLAME_ERROR_UNSUPPORTED, "src has DLPack version ",
              src->version.major, ".", src->version.minor, "; FLAME reads major version ", DLPACK_MAJOR_VERSION,
              " (call src->deleter yourself)");
  FLAME_CHECK(!(src->flags & DLPACK_FLAG_BITMASK_READ_ONLY), FLAME_ERROR_UNSUPPORTED,
              "src is read-only (DLPACK_FLAG_BITMASK_READ_ONLY); FLAME tensors are writable");
}
#else
[[noreturn]] void no_versioned() {
#ifdef DLPACK_VERSION
  fail(FLAME_ERROR_UNSUPPORTED, "this FLAME was built with dlpack.h version ", DLPACK_VERSION,
       ", which predates the versioned struct of DLPack 1.0");
#else
  fail(FLAME_ERROR_UNSUPPORTED, "this FLAME was built with a dlpack.h older than DLPack 1.0 (no versioned struct)");
#endif
}
#endif

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_tensor_to_dlpack(flame_tensor_t t, DLManagedTensor** out) {
  return api_call("flame_tensor_to_dlpack", [&] {
    out_param(out, "out");
    const Tensor& x = unwrap(t, "t");
    LiveScope s(x);
    *out = make_export<DLManagedTensor>(x);
  });
}

FLAME_API flame_status_t flame_tensor_from_dlpack(flame_ctx_t ctx, DLManagedTensor* src, flame_tensor_t* out) {
  return api_call("flame_tensor_from_dlpack", [&] {
    out_param(out, "out");
    Context& c = context_of(ctx);
    FLAME_CHECK(src, FLAME_ERROR_INVALID_ARGUMENT, "src is NULL");
    LiveScope s(c);
    *out = import_managed(c, src, "src");
  });
}

FLAME_API flame_status_t flame_tensor_to_dlpack_versioned(flame_tensor_t t, DLManagedTensorVersioned** out) {
  return api_call("flame_tensor_to_dlpack_versioned", [&] {
    out_param(out, "out");
    const Tensor& x = unwrap(t, "t");
#if FLAME_HAVE_DLPACK_VERSIONED
    LiveScope s(x);
    DLManagedTensorVersioned* m = make_export<DLManagedTensorVersioned>(x);
    m->version.major = DLPACK_MAJOR_VERSION;
    m->version.minor = DLPACK_MINOR_VERSION;
    m->flags = 0;
    *out = m;
#else
    (void)x;
    no_versioned();
#endif
  });
}

FLAME_API flame_status_t flame_tensor_from_dlpack_versioned(flame_ctx_t ctx, DLManagedTensorVersioned* src,
                                                            flame_tensor_t* out) {
  return api_call("flame_tensor_from_dlpack_versioned", [&] {
    out_param(out, "out");
    Context& c = context_of(ctx);
    FLAME_CHECK(src, FLAME_ERROR_INVALID_ARGUMENT, "src is NULL");
#if FLAME_HAVE_DLPACK_VERSIONED
    check_version(src);
    LiveScope s(c);
    *out = import_managed(c, src, "src");
#else
    (void)c;
    no_versioned();
#endif
  });
}

}  // extern "C"
