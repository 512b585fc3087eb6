// Deadline: every wait in Remora has one.
#pragma once

#include <chrono>

namespace remora {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline after(std::chrono::nanoseconds d) { return Deadline(Clock::now() + d); }
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  bool expired() const { return Clock::now() >= at_; }
  Clock::time_point at() const { return at_; }
  std::chrono::nanoseconds remaining() const {
    auto now = Clock::now();
    return now >= at_ ? std::chrono::nanoseconds(0)
                      : std::chrono::duration_cast<std::chrono::nanoseconds>(at_ - now);
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace remora
