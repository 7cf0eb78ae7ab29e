#include "ops/op_list.h"

namespace flame {

const char* op_name(OpId op) {
  switch (op) {
#define FLAME_OP_NAME(Id, name, ...) case OpId::Id: return #name;
    FLAME_UNARY_OPS(FLAME_OP_NAME) FLAME_SCALAR_OPS(FLAME_OP_NAME) FLAME_SPECIAL_UNARY_OPS(FLAME_OP_NAME) FLAME_INTERNAL_UNARY_OPS(FLAME_OP_NAME)
    FLAME_BINARY_OPS(FLAME_OP_NAME) FLAME_INTERNAL_BINARY_OPS(FLAME_OP_NAME) FLAME_STRUCTURAL_OPS(FLAME_OP_NAME)
    FLAME_NN_OPS(FLAME_OP_NAME) FLAME_NN_INTERNAL_OPS(FLAME_OP_NAME)
    FLAME_LOSS_OPS(FLAME_OP_NAME) FLAME_INDEXING_OPS(FLAME_OP_NAME)
    FLAME_CONV_OPS(FLAME_OP_NAME)
#undef FLAME_OP_NAME
    case OpId::Count: return "accumulate_grad";
  }
  return "unknown";
}

}  // namespace flame
