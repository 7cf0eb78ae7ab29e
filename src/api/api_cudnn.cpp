// C entry point of the cuDNN query (runtime/cudnn.h): whether a context runs its convolutions
// through cuDNN, and how many so far.
#include "api/guard.h"
#include "runtime/cudnn.h"

using namespace flame;

extern "C" {

FLAME_API flame_status_t flame_ctx_cudnn_info(flame_ctx_t ctx, int32_t* version, uint64_t* convolutions) {
  return api_call("flame_ctx_cudnn_info", [&] {
    Context& c = context_of(ctx);
    out_param(version, "version");
    out_param(convolutions, "convolutions");
    ContextScope s(c);
    c.check_alive();
    Cudnn* dnn = cudnn(c);  // loads it on first use, as a convolution would
    *version = dnn ? dnn->version : 0;
    *convolutions = dnn ? dnn->convolutions : 0;
  });
}

}  // extern "C"
