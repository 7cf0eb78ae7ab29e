// Argument helpers shared by the C entry points of the training toolkit (api_optim.cpp,
// api_toolkit.cpp, api_dist.cpp): the optimizer and model handles and lists of tensor handles.
#pragma once
#include <memory>
#include <vector>
#include "flame.h"
#include "tensor/tensor.h"

namespace flame {

class Optimizer;
namespace models {
class Model;
}
// The optimizer of a live handle; FLAME_ERROR_INVALID_ARGUMENT (NULL) or _INVALID_HANDLE naming "opt".
Optimizer& unwrap_opt(flame_optimizer_t o);
// The same, as the shared reference the handle holds (for objects that track optimizers).
std::shared_ptr<Optimizer> optimizer_ref(flame_optimizer_t o);
// The model of a live model handle (api_model.cpp); FLAME_ERROR_INVALID_ARGUMENT (NULL) or
// _INVALID_HANDLE naming arg.
std::shared_ptr<models::Model> model_ref(flame_model_t m, const char* arg);
// The tensors of ts[0..n), each checked as "<name>[i]"; ts may be NULL when n is 0.
std::vector<Tensor> tensor_list(const flame_tensor_t* ts, int64_t n, const char* name);

}  // namespace flame
