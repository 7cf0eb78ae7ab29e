// C entry points of the cuDNN queries (runtime/cudnn.h): whether a context runs its convolutions
// and attention through cuDNN, and how many so far.
#include "api/guard.h"
#include "runtime/cudnn.h"

using namespace flame;

extern "C" {

FLAME_API flame_status_t flame_ctx_cudnn_info(flame_ctx_t ctx, int32_t* version, uint64_t* convolutions) {
  return api_call("flame_ctx_cudnn_info", [&] {
    Context& c = context_of(ctx);
    out_param(version, "version");
    out_param(convolutions, "convolutions");
    LiveScope s(c);
    Cudnn* dnn = cudnn(c);  // loads it on first use, as a convolution would
    *version = dnn ? dnn->version : 0;
    *convolutions = dnn ? dnn->convolutions : 0;
  });
}

FLAME_API flame_status_t flame_ctx_cudnn_attention_info(flame_ctx_t ctx, uint64_t* forward, uint64_t* backward) {
  return api_call("flame_ctx_cudnn_attention_info", [&] {
    Context& c = context_of(ctx);
    out_param(forward, "forward");
    out_param(backward, "backward");
    LiveScope s(c);
    Cudnn* dnn = c.cudnn.get();  // counts only: loading cuDNN is left to the first convolution or attention
    *forward = dnn ? dnn->attentions : 0;
    *backward = dnn ? dnn->attention_grads : 0;
  });
}

}  // extern "C"
