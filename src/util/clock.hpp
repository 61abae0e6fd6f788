#pragma once
// BootClock: CLOCK_BOOTTIME, a monotonic clock that keeps counting while the machine is suspended.
// Every lease deadline is kept on it, so a suspend cannot make fencerun believe it still holds a lease.
#include <chrono>
#include <ctime>

namespace fencerun {

struct BootClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<BootClock>;
  static constexpr bool is_steady = true;

  static time_point now() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_BOOTTIME, &ts);
    return time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
  }
};

using Deadline = BootClock::time_point;
using std::chrono::milliseconds;

// Time left until `deadline` (never negative).
inline BootClock::duration time_left(Deadline deadline, Deadline now = BootClock::now()) {
  return deadline > now ? deadline - now : BootClock::duration::zero();
}

}  // namespace fencerun
