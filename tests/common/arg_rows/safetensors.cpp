// Argument-matrix rows (tests/common/arg_matrix.h) for safetensors. a.st is an open handle of a
// small valid file that Args writes itself (tensor "x", F32 [2, 3]; metadata {"format": "pt"}), so
// a row needs no GPU to make its file; saves go to Args' temporary directory.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_safetensors_load, a.ctx("ctx"), a.st_path("path"), a.out_st("file"));
FLAME_ARG_VOID(flame_safetensors_release, a.release_st("file"));
FLAME_ARG_ROW(flame_safetensors_count, a.st("file"), a.out<int64_t>("count"));
FLAME_ARG_ROW(flame_safetensors_name, a.st("file"), 0, a.out_str("name"));
// shape may be NULL by contract (dtype and ndim only): given, never NULLed.
FLAME_ARG_ROW(flame_safetensors_info, a.st("file"), a.str("name", "x"), a.out<flame_dtype_t>("dtype"),
              a.opt_out<int64_t>("shape", 8), 8, a.out<int32_t>("ndim"));
FLAME_ARG_ROW(flame_safetensors_get, a.st("file"), a.str("name", "x"), a.out_t("out"));
FLAME_ARG_ROW(flame_safetensors_metadata_count, a.st("file"), a.out<int64_t>("count"));
FLAME_ARG_ROW(flame_safetensors_metadata_key, a.st("file"), 0, a.out_str("key"));
FLAME_ARG_ROW(flame_safetensors_metadata, a.st("file"), a.str("key", "format"), a.out_str("value"));
// Two tensors of ctx (f32 and i64) and one metadata entry.
FLAME_ARG_ROW(flame_safetensors_save, a.ctx("ctx"), a.out_path("path"), a.in<const char*>("names", {"x", "y"}),
              a.ts("tensors", {sp(), sp({4}, FLAME_DTYPE_I64)}), 2, a.in<const char*>("metadata_kv", {"format", "pt"}), 1);

}  // namespace
