// Learning-rate schedules (flame-train): the multiplier of the peak learning rate at optimizer step
// `step` (0-based: the rate the step-th update uses), as diffusers' get_scheduler / transformers'
// get_*_schedule_with_warmup lambdas, which the training scripts call once per optimizer step:
//   constant               1 (diffusers' "constant" ignores warm-up; flame-train's "constant"
//                          with lr_warmup_steps > 0 is "constant_with_warmup")
//   constant_with_warmup   step / warmup during the warm-up, then 1
//   cosine                 step / warmup during the warm-up, then 0.5 (1 + cos(pi progress)),
//                          progress = (step - warmup) / (total - warmup) (num_cycles 0.5)
#pragma once

#include <cstdint>
#include <string>

namespace flame_train {

enum class LrScheduleKind { Constant, ConstantWithWarmup, Cosine };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::Constant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
};

// From the configuration's names ("constant", "constant_with_warmup", "cosine"); "constant" with a
// warm-up becomes ConstantWithWarmup. Throws std::invalid_argument for another name.
LrSchedule make_lr_schedule(const std::string& name, int64_t warmup_steps, int64_t total_steps);

double lr_multiplier(const LrSchedule& s, int64_t step);

}  // namespace flame_train
