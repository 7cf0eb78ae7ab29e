// Argument-matrix rows (tests/common/arg_matrix.h) for handle scopes and named parameter lists.
// a.scope is one scope of the row, open on the test thread; a.scoped_t a tensor it holds. a.params is
// a list with one entry "x" (F32 [2, 3]), which matches the file of a.st_path, so a strict load works.
#include "arg_matrix.h"

namespace {
using namespace argm;

FLAME_ARG_ROW(flame_scope_begin, a.ctx("ctx"), a.out_scope("scope"));
// scope is never NULLed: flame_scope_end(NULL) is a no-op (tests/cpu/test_abi.cpp checks it).
FLAME_ARG_ROW(flame_scope_end, a.end_scope("scope"));
FLAME_ARG_ROW(flame_scope_keep, a.scope("scope"), a.scoped_t("t"));
FLAME_ARG_ROW(flame_scope_count, a.scope("scope"), a.out<int64_t>("count"));

FLAME_ARG_ROW(flame_params_create, a.ctx("ctx"), a.out_params("params"));
FLAME_ARG_VOID(flame_params_release, a.release_params("params"));
FLAME_ARG_ROW(flame_params_add, a.params("params"), a.str("name", "w"), a.t("t"));
FLAME_ARG_ROW(flame_params_count, a.params("params"), a.out<int64_t>("count"));
FLAME_ARG_ROW(flame_params_name, a.params("params"), 0, a.out_str("name"));
FLAME_ARG_ROW(flame_params_tensor, a.params("params"), 0, a.out_borrowed<flame_tensor_t>("t"));
FLAME_ARG_ROW(flame_params_tensors, a.params("params"), a.out_borrowed<const flame_tensor_t*>("tensors"));
FLAME_ARG_ROW(flame_params_find, a.params("params"), a.str("name", "x"), a.out_borrowed<flame_tensor_t>("t"));
FLAME_ARG_ROW(flame_params_save_safetensors, a.params("params"), a.out_path("path"),
              a.in<const char*>("metadata_kv", {"format", "pt"}), 1);
FLAME_ARG_ROW(flame_params_load_safetensors, a.params("params"), a.st_path("path"), 0u);

}  // namespace
