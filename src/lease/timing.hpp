#pragma once
// Lease timing: the configured durations, and the arithmetic on BootClock time points that follows
// from them. Pure, so it can be tested with any clock values.
//
//   deadline = t_sent + ttl - drift      (t_sent: read just before the acquire/renew request was written)
//   stop_at  = deadline - grace - margin (send --kill-signal to the job)
//   kill_at  = deadline - margin         (SIGKILL to the job)
//
// The stop and kill points are computed in one place, StopPoints, which the supervisor and the
// watchdog are given; LeaseSchedule adds when to renew and retry.
#include <algorithm>
#include <chrono>
#include <expected>
#include <optional>
#include <string>

#include "util/clock.hpp"

namespace fencerun::lease {

using std::chrono::milliseconds;

// Lease timing. With drift = ttl/100 + 2ms and margin = min(ttl/20, 100ms), a configuration is valid when
//   ttl >= 100ms, renew > 0, grace >= 0 and renew + grace + margin + drift < ttl.
// Every combination with renew <= ttl/3 and grace <= ttl/6 satisfies it.
struct LeaseTiming {
  milliseconds ttl{};
  milliseconds renew{};   // interval between renewals
  milliseconds grace{};   // kill signal -> SIGKILL
  milliseconds drift{};   // subtracted from the TTL for clock rate differences
  milliseconds margin{};  // SIGKILL lands this long before the deadline (scheduling, teardown)

  static constexpr milliseconds k_min_ttl{100};

  // Builds and checks the timing; the error names the offending option.
  static std::expected<LeaseTiming, std::string> make(milliseconds ttl, std::optional<milliseconds> renew,
                                                       std::optional<milliseconds> grace);
  static milliseconds drift_for(milliseconds ttl) { return ttl / 100 + milliseconds(2); }
  static milliseconds margin_for(milliseconds ttl) { return std::min(ttl / 20, milliseconds(100)); }
  static milliseconds default_renew(milliseconds ttl) { return ttl / 3; }
  static milliseconds default_grace(milliseconds ttl) { return std::min(milliseconds(5000), ttl / 6); }
};

// When the job is signalled, and when it is killed, for a lease that ends at a deadline.
struct StopPoints {
  milliseconds grace{};
  milliseconds margin{};

  Deadline stop_at(Deadline deadline) const { return deadline - grace - margin; }
  Deadline kill_at(Deadline deadline) const { return deadline - margin; }
};

class LeaseSchedule {
 public:
  explicit LeaseSchedule(LeaseTiming timing) : m_timing(timing) {}

  const LeaseTiming& timing() const { return m_timing; }
  Deadline deadline_after(Deadline sent) const { return sent + m_timing.ttl - m_timing.drift; }
  StopPoints stop_points() const { return {m_timing.grace, m_timing.margin}; }
  Deadline stop_at(Deadline deadline) const { return stop_points().stop_at(deadline); }
  Deadline next_renewal(Deadline last_sent) const { return last_sent + m_timing.renew; }

  // After `failures` consecutive failed renewals (>= 1): retry promptly, backing off from 50ms to 1s,
  // but never later than the stop point.
  Deadline retry_at(Deadline now, int failures, Deadline deadline) const {
    auto backoff = std::chrono::milliseconds(50) * (1 << std::clamp(failures - 1, 0, 5));
    return std::min(now + std::min(backoff, std::chrono::milliseconds(1000)), stop_at(deadline));
  }

  // A renew request may not block past the stop point, nor longer than the request timeout.
  Deadline request_deadline(Deadline now, std::chrono::milliseconds timeout, Deadline deadline) const {
    return std::min(now + timeout, stop_at(deadline));
  }

 private:
  LeaseTiming m_timing;
};

}  // namespace fencerun::lease
