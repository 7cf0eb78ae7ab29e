// Named parameter lists (flame_params_t, api_params.cpp) as other entry points use them: the model
// entry points hand a model's parameters and its forward outputs back as lists, and read a
// forward's inputs from one.
#pragma once
#include <string>
#include <utility>
#include <vector>
#include "tensor/tensor.h"

namespace flame {

// A new list on ctx holding entries in order (names unique, checked). The caller owns it.
flame_params_t make_params_list(Context& ctx, const std::vector<std::pair<std::string, Tensor>>& entries);

// The names and tensors of a live list (FLAME_ERROR_INVALID_ARGUMENT for NULL,
// FLAME_ERROR_INVALID_HANDLE for a released list; arg names it in the message).
std::vector<std::pair<std::string, Tensor>> params_list_entries(flame_params_t params, const char* arg);

}  // namespace flame
