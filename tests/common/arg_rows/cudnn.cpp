// Argument-matrix rows (tests/common/arg_matrix.h) for the cuDNN query at the end of flame.h.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_ctx_cudnn_info, a.ctx("ctx"), a.out<int32_t>("version"), a.out<uint64_t>("convolutions"));
FLAME_ARG_ROW(flame_ctx_cudnn_attention_info, a.ctx("ctx"), a.out<uint64_t>("forward"), a.out<uint64_t>("backward"));

}  // namespace
