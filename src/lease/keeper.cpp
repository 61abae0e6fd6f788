#include "lease/keeper.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <system_error>


#include "util/duration.hpp"
#include "log/log.hpp"
#include "util/error.hpp"

namespace fencerun::lease {

LeaseKeeper::LeaseKeeper(Renewer& lease, const Acquired& acquired, LeaseSchedule schedule,
                         std::chrono::milliseconds request_timeout, log::Context context,
                         std::function<void(Deadline)> on_renewed)
    : m_lease(lease),
      m_value(acquired.value),
      m_context(std::move(context)),
      m_schedule(schedule),
      m_timeout(request_timeout),
      m_last_sent(acquired.sent),
      m_on_renewed(std::move(on_renewed)),
      m_deadline_ns(schedule.deadline_after(acquired.sent).time_since_epoch().count()),
      m_wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!m_wake) throw SystemError("eventfd");
  try {
    m_thread = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    throw SystemError("cannot start the renewal thread", e.code().value());
  }
}

LeaseKeeper::~LeaseKeeper() { stop(); }

void LeaseKeeper::stop() {
  {
    std::lock_guard lock(m_mutex);
    m_stop_requested = true;
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

LeaseKeeper::Stats LeaseKeeper::stats() const {
  std::lock_guard lock(m_mutex);
  return m_stats;
}

void LeaseKeeper::wake() {
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(m_wake.get(), &one, sizeof one);
}

void LeaseKeeper::run() {
  const auto ttl = m_schedule.timing().ttl;
  Deadline next = m_schedule.next_renewal(m_last_sent);
  int failures = 0;
  for (;;) {
    {
      std::unique_lock lock_guard(m_mutex);
      // The condition variable waits on the steady clock; the schedule is on the boot clock. Waking
      // early is harmless (the loop re-checks), so convert the remaining time each round.
      while (!m_stop_requested) {
        auto left = time_left(next);
        if (left <= BootClock::duration::zero()) break;
        m_cv.wait_for(lock_guard, left);
      }
      if (m_stop_requested) return;
    }
    Deadline now = BootClock::now();
    Deadline current = deadline();
    Deadline stop_point = m_schedule.stop_at(current);
    if (now >= stop_point) {
      log::event(log::Level::warn, "renew_gave_up", "lease ran short without a successful renewal",
                 m_context);
      wake();
      return;
    }
    Deadline sent{};
    auto outcome = m_lease.renew(m_value, ttl, m_schedule.request_deadline(now, m_timeout, current), sent);
    if (outcome && *outcome == RenewOutcome::renewed) {
      auto new_deadline = m_schedule.deadline_after(sent);
      if (new_deadline > current) {
        m_deadline_ns.store(new_deadline.time_since_epoch().count());
        if (m_on_renewed) m_on_renewed(new_deadline);
      }
      {
        std::lock_guard g(m_mutex);
        ++m_stats.renewals;
      }
      if (failures > 0)
        log::event(log::Level::info, "renew_recovered", "renewal succeeded again",
                   m_context, {{"failures", std::to_string(failures)}});
      failures = 0;
      log::event(log::Level::debug, "renewed", "renewed lease", m_context);
      next = m_schedule.next_renewal(sent);
      continue;
    }
    if (outcome) {  // gone, stolen, broken or revoked: the lease is lost, stop at once
      const LossCause cause = loss_cause_of(*outcome);
      m_cause.store(cause);
      m_lost.store(true);
      log::event(log::Level::error, "lease_lost", std::string("lease lost: ") + loss_cause_text(cause), m_context,
                 {{"cause", loss_cause_name(cause)}});
      wake();
      return;
    }
    ++failures;
    {
      std::lock_guard g(m_mutex);
      ++m_stats.failures;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(time_left(stop_point, BootClock::now()));
    log::event(log::Level::warn, "renew_failed", "renewal failed: " + outcome.error().message,
               m_context, {log::millis("stop_in", left, util::format_duration(left))});
    next = m_schedule.retry_at(BootClock::now(), failures, current);
  }
}

}  // namespace fencerun::lease
