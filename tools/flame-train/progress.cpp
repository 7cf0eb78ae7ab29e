// flame-train's progress line (progress.h).
#include "progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace flame_train {

Progress::Progress(int64_t total_steps, int64_t first_step) : total_(total_steps), first_(first_step), done_(first_step) {}

void Progress::record(int64_t steps_done, double loss, double ms) {
  done_ = steps_done;
  last_loss_ = loss;
  average_ = (1 - kSmoothing) * average_ + kSmoothing * loss;
  weight_ = (1 - kSmoothing) * weight_ + kSmoothing;
  recent_ms_.push_back(ms);
  if (recent_ms_.size() > kWindow) recent_ms_.pop_front();
}

double Progress::smoothed_loss() const { return weight_ > 0 ? average_ / weight_ : 0; }

double Progress::steps_per_second() const {
  double total_ms = 0;
  for (double ms : recent_ms_) total_ms += ms;
  return total_ms > 0 ? 1000.0 * static_cast<double>(recent_ms_.size()) / total_ms : 0;
}

double Progress::seconds_left() const {
  const double rate = steps_per_second();
  return rate > 0 ? static_cast<double>(total_ - done_) / rate : 0;
}

bool Progress::prints_in_log() const { return done_ % 10 == 0 || done_ == first_ + 1 || done_ == total_; }

std::string format_duration(double seconds) {
  const long long s = std::llround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

std::string Progress::line(double lr, uint64_t bytes_in_use, uint64_t peak_bytes) const {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld  %.2f it/s  ETA %s  loss %.5f (avg %.5f)  lr %.3g  GPU %.1f GiB (peak %.1f)",
                static_cast<long long>(done_), static_cast<long long>(total_), steps_per_second(),
                format_duration(seconds_left()).c_str(), last_loss_, smoothed_loss(), lr,
                static_cast<double>(bytes_in_use) / kGiB, static_cast<double>(peak_bytes) / kGiB);
  return buf;
}

}  // namespace flame_train
