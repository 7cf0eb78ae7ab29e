// The preflight behind the C ABI: flame_model_estimate_memory (models/memory_estimate.h; pure host
// work: no context, no GPU, no weights read) and flame_ctx_device_memory, the device's free memory
// an estimate is compared with.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <nlohmann/json.hpp>
#include "api/guard.h"
#include "runtime/context.h"
#include "models/memory_estimate.h"

using namespace flame;

extern "C" {

FLAME_API flame_status_t flame_model_estimate_memory(const char* request_json, flame_memory_estimate_t* estimate) {
  return api_call("flame_model_estimate_memory", [&] {
    FLAME_CHECK(estimate, FLAME_ERROR_INVALID_ARGUMENT, "estimate is NULL");
    FLAME_CHECK(estimate->struct_size >= sizeof(size_t), FLAME_ERROR_INVALID_ARGUMENT,
                "estimate->struct_size must be set to sizeof(flame_memory_estimate_t)");
    // Cleared up front (struct_size kept) so that every failure leaves zeros.
    const size_t n = std::min(estimate->struct_size, sizeof(flame_memory_estimate_t));
    std::memset(reinterpret_cast<char*>(estimate) + sizeof(size_t), 0, n - sizeof(size_t));
    FLAME_CHECK(estimate->struct_size >= offsetof(flame_memory_estimate_t, trainable_count) + sizeof(uint64_t),
                FLAME_ERROR_INVALID_ARGUMENT, "estimate->struct_size must be set to sizeof(flame_memory_estimate_t)");
    FLAME_CHECK(request_json, FLAME_ERROR_INVALID_ARGUMENT, "request_json is NULL");
    nlohmann::json request;
    try {
      request = nlohmann::json::parse(request_json);
    } catch (const nlohmann::json::exception& e) {
      fail(FLAME_ERROR_INVALID_ARGUMENT, "request_json is not valid JSON: ", e.what());
    }
    const models::TrainingMemoryEstimate e =
        models::estimate_training_memory(models::parse_training_memory_request(request));
    flame_memory_estimate_t v;
    v.struct_size = sizeof v;
    v.weights_bytes = e.weights;
    v.adapter_bytes = e.adapter;
    v.gradient_bytes = e.gradients;
    v.optimizer_bytes = e.optimizer;
    v.activation_bytes = e.activations;
    v.workspace_bytes = e.workspace;
    v.total_bytes = e.total;
    v.parameter_count = e.parameter_count;
    v.trainable_count = e.trainable_count;
    std::memcpy(reinterpret_cast<char*>(estimate) + sizeof(size_t), reinterpret_cast<const char*>(&v) + sizeof(size_t),
                n - sizeof(size_t));
  });
}

FLAME_API flame_status_t flame_ctx_device_memory(flame_ctx_t ctx, uint64_t* free_bytes, uint64_t* total_bytes) {
  return api_call("flame_ctx_device_memory", [&] {
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    Context& c = context_of(ctx);
    ContextScope scope(c);
    c.check_alive();
    size_t free_now = 0, total = 0;
    c.check(c.drv.cuMemGetInfo(&free_now, &total), "cuMemGetInfo");
    if (free_bytes) *free_bytes = free_now;
    if (total_bytes) *total_bytes = total;
  });
}

}  // extern "C"
