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
#include <optional>
#include <string>
#include <thread>

#include "lease/lease.hpp"
#include "lease/types.hpp"
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
  // Why (none while lost() is false).
  LossCause loss_cause() const { return m_cause.load(); }
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
  std::atomic<LossCause> m_cause{LossCause::none};  // set before m_lost
  std::atomic<bool> m_lost{false};
  UniqueFd m_wake;

  mutable std::mutex m_mutex;
  std::condition_variable m_cv;
  bool m_stop_requested = false;
  Stats m_stats;
  std::thread m_thread;
};

// The renewal half of a HeldLease, shared by the lease implementations: keep() starts a LeaseKeeper
// on `renewer`, which stays (stopped) after stop_keeping(), so deadline(), lost() and the stats still
// answer. The implementation adds the token, the facts and the release.
class KeptLease : public HeldLease {
 public:
  Deadline deadline() const override {
    return m_keeper ? m_keeper->deadline() : m_schedule.deadline_after(m_acquired.sent);
  }
  void keep(std::function<void(Deadline)> on_renewed) override {
    m_keeper.emplace(m_renewer, m_acquired, m_schedule, m_request.request_timeout, m_context, std::move(on_renewed));
  }
  void stop_keeping() override {
    if (m_keeper) m_keeper->stop();
  }
  bool lost() const override { return m_keeper && m_keeper->lost(); }
  LossCause loss_cause() const override { return m_keeper ? m_keeper->loss_cause() : LossCause::none; }
  int wake_fd() const override { return m_keeper ? m_keeper->wake_fd() : -1; }
  Stats stats() const override {
    if (!m_keeper) return {};
    auto s = m_keeper->stats();
    return {s.renewals, s.failures};
  }

 protected:
  KeptLease(Renewer& renewer, Acquired acquired, const LeaseRequest& request, log::Context context)
      : m_acquired(std::move(acquired)), m_request(request), m_context(std::move(context)), m_renewer(renewer),
        m_schedule(request.timing) {}

  Acquired m_acquired;
  const LeaseRequest& m_request;
  log::Context m_context;

 private:
  Renewer& m_renewer;
  LeaseSchedule m_schedule;
  std::optional<LeaseKeeper> m_keeper;
};

}  // namespace fencerun::lease
