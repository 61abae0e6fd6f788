#pragma once
// LeaseSchedule: when the lease ends on fencerun's side, when the command must be signalled and
// killed, and when to renew or retry. Pure arithmetic on BootClock time points, so it can be tested
// with any clock values.
//
//   deadline = t_sent + ttl - drift      (t_sent: read just before the acquire/renew request was written)
//   stop_at  = deadline - grace - margin (send --kill-signal to the process group)
//   kill_at  = deadline - margin         (SIGKILL to the process group)
#include <algorithm>
#include <chrono>

#include "config/config.hpp"
#include "util/clock.hpp"

namespace fencerun::lease {

class LeaseSchedule {
 public:
  explicit LeaseSchedule(config::LeaseTiming timing) : m_timing(timing) {}

  const config::LeaseTiming& timing() const { return m_timing; }
  Deadline deadline_after(Deadline sent) const { return sent + m_timing.ttl - m_timing.drift; }
  Deadline stop_at(Deadline deadline) const { return deadline - m_timing.grace - m_timing.margin; }
  Deadline kill_at(Deadline deadline) const { return deadline - m_timing.margin; }
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
  config::LeaseTiming m_timing;
};

}  // namespace fencerun::lease
