// Learning-rate schedules (see lr_schedule.h).
#include "lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace flame_train {

LrSchedule make_lr_schedule(const std::string& name, int64_t warmup_steps, int64_t total_steps) {
  LrSchedule s;
  s.warmup_steps = std::max<int64_t>(0, warmup_steps);
  s.total_steps = std::max<int64_t>(1, total_steps);
  if (name == "constant") s.kind = s.warmup_steps > 0 ? LrScheduleKind::ConstantWithWarmup : LrScheduleKind::Constant;
  else if (name == "constant_with_warmup") s.kind = LrScheduleKind::ConstantWithWarmup;
  else if (name == "cosine") s.kind = LrScheduleKind::Cosine;
  else throw std::invalid_argument("unknown learning-rate schedule '" + name + "' (constant, constant_with_warmup, cosine)");
  return s;
}

double lr_multiplier(const LrSchedule& s, int64_t step) {
  if (s.kind == LrScheduleKind::Constant) return 1.0;
  if (step < s.warmup_steps) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, s.warmup_steps));
  if (s.kind == LrScheduleKind::ConstantWithWarmup) return 1.0;
  // Clamped at 1 (transformers' lambda would rise again past total_steps; the loop never gets there).
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) /
                                            static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps)));
  constexpr double kPi = 3.14159265358979323846;
  return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * 0.5 * 2.0 * progress)));
}

}  // namespace flame_train
