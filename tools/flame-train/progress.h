// flame-train's progress line (issue 37): step / total, steps per second and the time left over the
// recent steps, the loss smoothed as the trainers' bars show it (an exponential moving average,
// weight 0.1 on each new step, bias-corrected as Adam's moments are so the first steps are not
// pulled towards 0), the learning rate, and the GPU memory in use and at peak (the caller passes the
// pool's counters: flame_ctx_memory_stats reads host-side counters, no synchronisation).
// Host arithmetic only (flame_train_core); trainer.cpp prints what line() returns: on a terminal
// every step over the previous line ("\r"), in a log every 10 steps, the first and the last.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

namespace flame_train {

class Progress {
 public:
  explicit Progress(int64_t total_steps, int64_t first_step = 0);

  // Records finished step steps_done (1-based) that took ms milliseconds.
  void record(int64_t steps_done, double loss, double ms);
  double smoothed_loss() const;
  double steps_per_second() const;  // over the last kWindow steps; 0 before any
  double seconds_left() const;      // the remaining steps at steps_per_second(); 0 when unknown

  // "step 30/2000  1.52 it/s  ETA 21:37  loss 0.1234 (avg 0.1301)  lr 1e-04  GPU 14.1 GiB (peak 14.3)"
  std::string line(double lr, uint64_t bytes_in_use, uint64_t peak_bytes) const;
  // Whether the step just recorded prints when the output is not a terminal.
  bool prints_in_log() const;

  static constexpr size_t kWindow = 20;
  static constexpr double kSmoothing = 0.1;

 private:
  int64_t total_ = 0, first_ = 0, done_ = 0;
  double last_loss_ = 0, average_ = 0, weight_ = 0;  // weight_: 1 - 0.9^n, the bias correction
  std::deque<double> recent_ms_;
};

// "1:02:03" or "21:37" (minutes:seconds under an hour).
std::string format_duration(double seconds);

}  // namespace flame_train
