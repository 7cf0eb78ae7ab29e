// flame.h must compile as C++17 with -pedantic -Wall -Wextra -Werror -Wold-style-cast and give C
// linkage. Built as an object library (flame_header_cxx17); never linked or run.
#include "flame.h"
#include "flame.h"
#include <type_traits>

static_assert(std::is_same<decltype(&flame_add), flame_status_t (*)(flame_tensor_t, flame_tensor_t, flame_tensor_t*)>::value,
              "flame_add has the documented signature");
static_assert(std::is_standard_layout<flame_ctx_options_t>::value, "options struct is C layout");
static_assert(offsetof(flame_ctx_options_t, struct_size) == 0, "struct_size comes first");
static_assert(offsetof(flame_memory_stats_t, struct_size) == 0, "struct_size comes first");
static_assert(offsetof(flame_ctx_counters_t, struct_size) == 0, "struct_size comes first");
static_assert(sizeof(flame_status_t) == 4 && sizeof(flame_dtype_t) == 4, "enums are 32-bit");
static_assert(FLAME_OK == 0, "FLAME_OK is zero");

extern "C" int flame_header_cxx17_probe();
extern "C" int flame_header_cxx17_probe() {
  flame_ctx_options_t o{};
  o.struct_size = sizeof o;
  return static_cast<int>(o.struct_size) + FLAME_ABI_VERSION;
}
