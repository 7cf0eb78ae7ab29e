// Pinned uploads of checkpoint bytes (pinned_upload.h).
#include "models/pinned_upload.h"
#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
#include "core/error.h"

namespace flame::models {

void parallel_copy(void* dst, const unsigned char* src, size_t n, unsigned threads) {
  constexpr size_t kMinPerThread = size_t(4) << 20;
  const size_t parts = std::max<size_t>(1, std::min<size_t>(threads, n / kMinPerThread));
  if (parts == 1) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t per = (n + parts - 1) / parts;
  auto copy_part = [&](size_t i) {
    const size_t begin = i * per, end = std::min(n, begin + per);
    if (begin < end) std::memcpy(static_cast<unsigned char*>(dst) + begin, src + begin, end - begin);
  };
  std::vector<std::thread> workers;
  workers.reserve(parts - 1);
  for (size_t i = 1; i < parts; ++i) workers.emplace_back(copy_part, i);
  copy_part(0);
  for (std::thread& t : workers) t.join();
}

PinnedUploader::PinnedUploader(Context& ctx) : ctx_(ctx) {
  try {
    ContextScope scope(ctx_);
    for (int b = 0; b < 2; ++b) {
      ctx_.check(ctx_.drv.cuMemHostAlloc(&buffers_[b], kPinnedPieceBytes, 0), "cuMemHostAlloc (checkpoint upload)");
      ctx_.check(ctx_.drv.cuEventCreate(&drained_[b], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
  } catch (...) {
    release();
    throw;
  }
}

PinnedUploader::~PinnedUploader() { release(); }

void PinnedUploader::release() noexcept {
  std::unique_ptr<ContextScope> scope;
  try {
    scope = std::make_unique<ContextScope>(ctx_);
  } catch (...) {  // the context is failing: free what the driver still accepts
  }
  for (int b = 0; b < 2; ++b) {
    if (in_flight_[b] && drained_[b]) ctx_.drv.cuEventSynchronize(drained_[b]);
    if (drained_[b]) ctx_.drv.cuEventDestroy(drained_[b]);
    if (buffers_[b]) ctx_.drv.cuMemFreeHost(buffers_[b]);
    drained_[b] = nullptr;
    buffers_[b] = nullptr;
    in_flight_[b] = false;
  }
}

std::unique_ptr<PinnedUploader> PinnedUploader::try_create(Context& ctx) {
  try {
    return std::make_unique<PinnedUploader>(ctx);
  } catch (const Error&) {
    return nullptr;
  }
}

void PinnedUploader::upload(const unsigned char* src, size_t bytes, CUdeviceptr dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(kPinnedPieceBytes, bytes - done);
    const int b = next_;
    if (in_flight_[b]) ctx_.check(ctx_.drv.cuEventSynchronize(drained_[b]), "cuEventSynchronize");
    in_flight_[b] = false;
    parallel_copy(buffers_[b], src + done, n, threads);
    ctx_.check(ctx_.drv.cuMemcpyHtoDAsync(dst + static_cast<CUdeviceptr>(done), buffers_[b], n, ctx_.stream),
               "cuMemcpyHtoDAsync");
    ctx_.check(ctx_.drv.cuEventRecord(drained_[b], ctx_.stream), "cuEventRecord");
    in_flight_[b] = true;
    next_ = 1 - b;
    done += n;
  }
}

}  // namespace flame::models
