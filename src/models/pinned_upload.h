// Uploads of checkpoint bytes through pinned host memory. A copy from pageable memory (the mapped
// page cache) is staged by the driver in one thread, about 6 GB/s on an H200 host: Flux-dev's
// 22 GiB took 3.8 s. PinnedUploader instead copies the mapping into two pinned buffers in turn with
// several threads, and while the DMA engine uploads one buffer (asynchronously, on the context's
// stream) the threads fill the other; an event per buffer says when it may be refilled.
// CheckpointFiles uses one while a PinnedUploadScope is open on its files (model_loader.cpp opens
// one around a model's parameters); without one, or for small tensors, it copies from the mapping.
#pragma once
#include <array>
#include <cstddef>
#include <mutex>
#include "runtime/context.h"

namespace flame::models {

constexpr size_t kPinnedPieceBytes = size_t(32) << 20;  // each of the two buffers
constexpr size_t kPinnedMinBytes = size_t(1) << 20;     // smaller copies go straight from the mapping

class PinnedUploader {
 public:
  // Allocates the buffers and events on ctx's device; throws flame::Error when it cannot (callers
  // fall back to the pageable path: see try_create).
  explicit PinnedUploader(Context& ctx);
  // Waits for the uploads still reading the buffers, then frees them. Never throws.
  ~PinnedUploader();
  PinnedUploader(const PinnedUploader&) = delete;
  PinnedUploader& operator=(const PinnedUploader&) = delete;

  // A new uploader, or null when pinned memory cannot be had (a locked-memory limit, say).
  static std::unique_ptr<PinnedUploader> try_create(Context& ctx);

  // Queues the copy of bytes from host src to device address dst on ctx's stream; returns once src
  // has been read (the upload itself may still run). Thread-safe (one upload at a time).
  void upload(const unsigned char* src, size_t bytes, CUdeviceptr dst);
  Context& ctx() const { return ctx_; }

 private:
  void release() noexcept;
  Context& ctx_;
  std::array<void*, 2> buffers_{};
  std::array<CUevent, 2> drained_{};  // recorded after each buffer's last upload
  std::array<bool, 2> in_flight_{};
  int next_ = 0;
  std::mutex mutex_;
};

// Copies n bytes from src to dst with up to `threads` threads (page faults of a mapped source run
// in parallel too).
void parallel_copy(void* dst, const unsigned char* src, size_t n, unsigned threads);

}  // namespace flame::models
