#include "tensor/op_list.h"

namespace flame {

const char* op_name(OpId op) {
  switch (op) {
#define FLAME_OP_NAME(Id, name, ...) case OpId::Id: return #name;
    FLAME_ALL_OPS(FLAME_OP_NAME)
#undef FLAME_OP_NAME
    case OpId::Count: return "accumulate_grad";
  }
  return "unknown";
}

}  // namespace flame
