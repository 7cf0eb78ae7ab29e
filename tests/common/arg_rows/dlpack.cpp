// Argument-matrix rows (tests/common/arg_matrix.h) for the DLPack exchange. Live DLPack inputs are
// exports of fresh tensors; the versioned pair is expected to be FLAME_ERROR_UNSUPPORTED when the
// library was built with a dlpack.h older than 1.0.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_tensor_to_dlpack, a.t("t"), a.out_dl("out"));
FLAME_ARG_ROW(flame_tensor_from_dlpack, a.ctx("ctx"), a.dl("src"), a.out_t("out"));
FLAME_ARG_ROW(flame_tensor_to_dlpack_versioned, a.t("t"), a.out_dlv("out"));
FLAME_ARG_ROW(flame_tensor_from_dlpack_versioned, a.ctx("ctx"), a.dlv("src"), a.out_t("out"));

}  // namespace
