#pragma once
// LeaseKeeper: renews a held lease in a background thread every --renew, retries failed renewals
// promptly, and publishes the current lease deadline. It never touches processes: whoever runs the
// command reads deadline() and lost(), and polls wake_fd() to hear about a lost lease at once.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "lease/lease_client.hpp"
#include "lease/timing.hpp"
#include "log/log.hpp"
#include "util/fd.hpp"

namespace fencerun::lease {

class LeaseKeeper {
 public:
  struct Stats {
    std::uint64_t renewals = 0;
    std::uint64_t failures = 0;
  };

  // Starts renewing. `lease` (and its connection) belongs to the keeper until stop() returns.
  // `on_renewed` is called from the renewal thread with each new deadline, as soon as it is known
  // (fencerun passes it on to the watchdog). Throws SystemError when the thread cannot start.
  LeaseKeeper(Renewer& lease, const Acquired& acquired, LeaseSchedule schedule,
              std::chrono::milliseconds request_timeout, log::Context context,
              std::function<void(Deadline)> on_renewed = {});
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Stops renewing and joins the thread (an in-flight request finishes first, within its bound).
  void stop();

  Deadline deadline() const { return Deadline(BootClock::duration(m_deadline_ns.load())); }
  // True once a renewal found the lock gone or held by another owner.
  bool lost() const { return m_lost.load(); }
  // Readable (eventfd) when the lease was lost or renewal gave up at the stop point.
  int wake_fd() const { return m_wake.get(); }
  Stats stats() const;

 private:
  void run();
  void wake();

  Renewer& m_lease;
  std::string m_value;
  log::Context m_context;
  LeaseSchedule m_schedule;
  std::chrono::milliseconds m_timeout;
  Deadline m_last_sent;
  std::function<void(Deadline)> m_on_renewed;

  std::atomic<BootClock::rep> m_deadline_ns;
  std::atomic<bool> m_lost{false};
  UniqueFd m_wake;

  mutable std::mutex m_mutex;
  std::condition_variable m_cv;
  bool m_stop_requested = false;
  Stats m_stats;
  std::thread m_thread;
};

}  // namespace fencerun::lease
