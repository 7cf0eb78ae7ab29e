// optimizer.type to FLAME's optimizer kind and options (see optimizer_setup.h).
#include "optimizer_setup.h"

#include <stdexcept>

#include "flame_handles.h"

namespace flame_train {

flame_optimizer_kind_t optimizer_kind(const std::string& type) {
  if (type == "adamw" || type == "adamw8bit") return FLAME_OPTIMIZER_ADAMW;
  if (type == "lion" || type == "lion8bit") return FLAME_OPTIMIZER_LION;
  throw std::invalid_argument("optimizer.type: '" + type + "' is not one of adamw, lion, adamw8bit, lion8bit");
}

int32_t optimizer_state_bits(const std::string& type) { return type == "adamw8bit" || type == "lion8bit" ? 8 : 32; }

flame_optimizer_options_t adapter_optimizer_options(const TrainConfig& config) {
  flame_optimizer_options_t o;
  check(flame_optimizer_options_init(&o, optimizer_kind(config.optimizer.type)), "flame_optimizer_options_init");
  o.lr = config.optimizer.learning_rate;
  o.beta1 = config.optimizer.beta1;
  o.beta2 = config.optimizer.beta2;
  o.weight_decay = config.optimizer.weight_decay;
  return o;
}

}  // namespace flame_train
