// Argument-matrix rows (tests/common/arg_matrix.h) for CUDA graph capture and replay, and
// flame_copy_from_host and flame_copy (the static-input refills). a.capture_ctx hands out a context that is
// capturing (Live), a.begin_ctx one for capture_begin; Args ends any capture a row left open.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_graph_capture_begin, a.begin_ctx("ctx"));
FLAME_ARG_ROW(flame_graph_capture_end, a.capture_ctx("ctx"), a.out_cuda_graph("graph"));
FLAME_ARG_ROW(flame_graph_replay, a.cuda_graph("graph"));
FLAME_ARG_VOID(flame_graph_release, a.release_cuda_graph("graph"));
FLAME_ARG_ROW(flame_copy_from_host, a.t("dst"), a.buf("data", 24), 24);
FLAME_ARG_ROW(flame_copy, a.t("dst"), a.t("src"));

}  // namespace
