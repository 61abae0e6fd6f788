// Acquire (waiting if asked), run the command under the lease, release. The order of steps matters:
// the signal mask is set before any thread or child exists, the watchdog and the command are forked
// before the renewal thread starts, and the lock is released only after the whole process group is gone.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <random>
#include <variant>

#include "app/app.hpp"
#include "app/metrics.hpp"
#include "config/duration.hpp"
#include "lease/keeper.hpp"
#include "lease/lease_client.hpp"
#include "lease/schedule.hpp"
#include "log/log.hpp"
#include "redis/client.hpp"
#include "supervisor/exit_status.hpp"
#include "supervisor/signals.hpp"
#include "supervisor/supervisor.hpp"
#include "supervisor/watchdog.hpp"
#include "util/random.hpp"

extern char** environ;

namespace fencerun::app {
namespace {

using std::chrono::milliseconds;

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "unknown";
  std::string h(buf);
  std::replace(h.begin(), h.end(), ' ', '_');
  return h;
}

std::vector<std::string> child_environment(const config::Config& c, const lease::Acquired& acquired,
                                           const std::string& owner) {
  static constexpr std::string_view k_ours[] = {"FENCERUN_TOKEN=", "FENCERUN_LOCK=", "FENCERUN_OWNER=",
                                                "FENCERUN_TTL_MS=", "FENCERUN_REDIS_URL="};
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    bool ours = std::ranges::any_of(k_ours, [&](std::string_view p) { return entry.starts_with(p); });
    if (!ours) env.emplace_back(entry);
  }
  env.push_back("FENCERUN_TOKEN=" + std::to_string(acquired.token));
  env.push_back("FENCERUN_LOCK=" + c.run.lock);
  env.push_back("FENCERUN_OWNER=" + owner);
  env.push_back("FENCERUN_TTL_MS=" + std::to_string(c.run.timing.ttl.count()));
  env.push_back("FENCERUN_REDIS_URL=" + c.common.redacted_url);
  return env;
}

// Fair waiters try again within this long to keep their place (it expires after it).
constexpr milliseconds k_fair_liveness{3000};

// How long to sleep before trying a busy lock again. Subscribed waiters are woken by a release, so
// they only need to look again when the holder's TTL runs out (it may have died), capped so a missed
// message or a key without expiry costs at most a short delay. Without a subscription: back off from
// 10ms to 500ms with jitter, again never past the holder's remaining TTL.
milliseconds next_wait(int attempt, const lease::Busy& busy, bool subscribed, bool fair, std::mt19937& rng) {
  milliseconds pause;
  if (subscribed) {
    pause = milliseconds(2000);
  } else {
    milliseconds base = std::min(milliseconds(10) * (1 << std::min(attempt, 6)), milliseconds(500));
    std::uniform_int_distribution<long> jitter(base.count() * 3 / 4, base.count() * 5 / 4);
    pause = milliseconds(jitter(rng));
  }
  if (fair) pause = std::min(pause, k_fair_liveness / 3);
  if (busy.remaining) pause = std::min(pause, *busy.remaining + milliseconds(1));
  if (busy.turn_expires) pause = std::min(pause, *busy.turn_expires);
  return std::max(pause, milliseconds(1));
}

void log_unavailable(const config::Config& c, const redis::Error& e) {
  log::event(log::Level::error, "redis_unavailable", "cannot use Redis at " + c.common.redacted_url + ": " + e.message,
             {{"lock", c.run.lock}, {"kind", redis::to_string(e.kind)}});
}

Exit run_locked(const config::Config& c, RunReport& report);

Exit by_signal(int signo) { return {exit_code_for_signal(signo), signo}; }

}  // namespace

Exit run(const config::Config& c) {
  RunReport report;
  report.lock = c.run.lock;
  report.started = std::chrono::system_clock::now();
  Exit code = run_locked(c, report);
  report.exit_code = code.code;
  report.ended = std::chrono::system_clock::now();
  if (c.metrics_file) {
    if (auto err = write_metrics_file(*c.metrics_file, report))
      log::event(log::Level::warn, "metrics_failed", "cannot write the metrics file: " + *err, {{"lock", c.run.lock}});
  }
  return code;
}

namespace {

// The lease once acquired: released on every way out of run_locked (an early return, an exception),
// owner-checked and bounded by the request timeout, unless release() already did it.
class HeldLease {
 public:
  HeldLease(lease::LeaseClient& lease, const lease::Acquired& acquired, std::string owner,
            milliseconds timeout, log::Context context)
      : m_lease(lease), m_acquired(acquired), m_owner(std::move(owner)), m_timeout(timeout),
        m_context(std::move(context)) {}
  HeldLease(const HeldLease&) = delete;
  HeldLease& operator=(const HeldLease&) = delete;
  ~HeldLease() {
    try {
      if (!m_done) release();
    } catch (...) {  // a destructor must not throw; the lock expires by itself
    }
  }

  enum class Released { yes, not_ours, failed };
  Released release() {
    m_done = true;
    auto released = m_lease.release(m_owner, m_acquired.value, lease::server_has_delex(m_acquired.server_version),
                                    BootClock::now() + m_timeout);
    if (!released) {
      log::event(log::Level::warn, "release_failed",
                 "could not release the lock (it expires by itself): " + released.error().message, m_context);
      return Released::failed;
    }
    if (*released) {
      log::event(log::Level::info, "released", "released lock", m_context);
      return Released::yes;
    }
    return Released::not_ours;
  }

 private:
  lease::LeaseClient& m_lease;
  const lease::Acquired& m_acquired;
  std::string m_owner;
  milliseconds m_timeout;
  log::Context m_context;
  bool m_done = false;
};

// Whether a failed acquire may still have set the lock on the server (the request was, or may have
// been, written): then it is cleaned up by owner id.
bool acquire_may_have_run(const redis::Error& e) {
  // A reply fencerun could not make sense of came from a script that ran.
  return e.maybe_executed || e.kind == redis::Error::Kind::protocol;
}

// While waiting, a connection error is retried after this long (doubling from 100ms to 2s, jittered).
milliseconds reconnect_pause(int failures, std::mt19937& rng) {
  milliseconds base = std::min(milliseconds(100) * (1 << std::min(failures - 1, 5)), milliseconds(2000));
  std::uniform_int_distribution<long> jitter(base.count() * 3 / 4, base.count() * 5 / 4);
  return milliseconds(jitter(rng));
}

Exit run_locked(const config::Config& c, RunReport& report) {
  const Deadline began = BootClock::now();
  supervisor::SignalChannel signals;  // before any thread or child exists
  redis::Client client(c.common.endpoint);
  lease::LeaseClient lease(client, lease::keys_for(c.common.key_prefix, c.run.lock));
  const lease::LeaseSchedule schedule(c.run.timing);
  const std::string owner = random_hex(16);
  const std::string host = host_name();
  const auto timeout = c.common.timeout;

  // Acquire, or wait for the lock. A waiter subscribes to the lock's release channel after its first
  // busy answer and then tries once more at once, so no release can slip between a try and the wait;
  // a release then wakes it immediately, and a holder that died is noticed at its remaining TTL.
  std::optional<Deadline> wait_until;
  if (c.run.wait) wait_until = BootClock::now() + *c.run.wait;
  const lease::Fairness fairness{c.run.fair, k_fair_liveness};
  std::mt19937 rng(std::random_device{}());
  std::optional<redis::Client> subscriber;
  bool subscribe_tried = false;
  int connection_failures = 0;
  auto leave_queue = [&] {
    if (c.run.fair) [[maybe_unused]] auto left = lease.leave_queue(owner, BootClock::now() + timeout);
  };
  // Sleeps until `wake` unless a signal ends the wait first; returns that signal.
  auto pause_until = [&](Deadline wake, int fd, bool& woken) -> std::optional<int> {
    if (auto sig = signals.wait_for_terminating(wake, fd, woken)) {
      log::event(log::Level::info, "interrupted", "stopped waiting for the lock",
                 {{"lock", c.run.lock}, {"signal", supervisor::signal_name(*sig)}});
      leave_queue();
      return sig;
    }
    return std::nullopt;
  };
  lease::Acquired acquired;
  for (int attempt = 0;; ++attempt) {
    // A reply that comes after the stop point is of no use (the command could not start), so no
    // acquire request waits longer than that, whatever --timeout says.
    Deadline now = BootClock::now();
    Deadline bound = std::min(now + timeout, schedule.stop_at(schedule.deadline_after(now)));
    auto result = lease.try_acquire(owner, c.run.timing.ttl, ::getpid(), host,
                                    {c.run.min_replicas, c.run.replica_timeout}, fairness, bound);
    if (!result) {
      const redis::Error& error = result.error();
      if (acquire_may_have_run(error)) {
        // The request may have run on the server after all: release what we may hold (by owner id).
        // Kept short: an unresponsive server will not answer this either, and the lock expires anyway.
        auto cleanup = std::min<milliseconds>(timeout / 4, milliseconds(200));
        [[maybe_unused]] auto cleaned = lease.release(owner, std::nullopt, false, BootClock::now() + cleanup);
      }
      bool retryable = error.kind == redis::Error::Kind::connection || error.kind == redis::Error::Kind::timeout;
      now = BootClock::now();
      if (!retryable || !wait_until || now >= *wait_until) {
        log_unavailable(c, error);
        leave_queue();
        return {exit_code::k_unavailable};
      }
      // Waiting: a restart or a failover of the server is not the end of the wait.
      ++connection_failures;
      Deadline wake = std::min(now + reconnect_pause(connection_failures, rng), *wait_until);
      log::event(log::Level::warn, "redis_retry", "cannot use Redis at " + c.common.redacted_url + ": " +
                                                      error.message + "; trying again while the wait lasts",
                 {{"lock", c.run.lock}, {"kind", redis::to_string(error.kind)},
                  log::millis("retry_in", std::chrono::duration_cast<milliseconds>(wake - now),
                              config::format_duration(std::chrono::duration_cast<milliseconds>(wake - now)))});
      subscriber.reset();
      subscribe_tried = false;
      bool woken = false;
      if (auto sig = pause_until(wake, -1, woken)) return by_signal(*sig);
      continue;
    }
    if (connection_failures > 0) {
      log::event(log::Level::info, "redis_recovered", "Redis answers again", {{"lock", c.run.lock}});
      connection_failures = 0;
    }
    if (auto* got = std::get_if<lease::Acquired>(&*result)) {
      acquired = std::move(*got);
      break;
    }
    const auto& busy = std::get<lease::Busy>(*result);
    now = BootClock::now();
    report.lock_wait = std::chrono::duration_cast<milliseconds>(now - began);
    if (wait_until && now >= *wait_until) {
      log::event(log::Level::info, "busy", c.run.wait->count() == 0 ? "lock is busy" : "lock is still busy: wait ran out",
                 {{"lock", c.run.lock},
                  {"holder_pid", busy.holder.pid ? std::to_string(*busy.holder.pid) : "unknown"},
                  {"holder_host", busy.holder.host.empty() ? "unknown" : busy.holder.host},
                  busy.remaining ? log::millis("ttl", *busy.remaining, config::format_duration(*busy.remaining))
                                 : log::Field{"ttl", "none"}});
      leave_queue();
      return {c.run.conflict_exit_code};
    }
    if (!subscribe_tried) {
      subscribe_tried = true;
      log::event(log::Level::info, "waiting", "lock is busy, waiting", {{"lock", c.run.lock}});
      subscriber.emplace(c.common.endpoint);
      if (auto ok = subscriber->subscribe(lease.keys().released, BootClock::now() + timeout); !ok) {
        log::event(log::Level::debug, "subscribe_failed", "cannot subscribe to release events, polling instead: " +
                                                              ok.error().message, {{"lock", c.run.lock}});
        subscriber.reset();
      }
      continue;  // try again now: a release may have come before the subscription
    }
    Deadline wake = now + next_wait(attempt, busy, subscriber.has_value(), c.run.fair, rng);
    if (wait_until) wake = std::min(wake, *wait_until);
    bool woken = false;
    int fd = subscriber ? subscriber->wake_fd() : -1;
    if (!(subscriber && subscriber->has_buffered_messages())) {
      if (auto sig = pause_until(wake, fd, woken)) return by_signal(*sig);
    }
    if (subscriber && (woken || subscriber->has_buffered_messages())) {
      if (auto n = subscriber->drain_messages(); !n) subscriber.reset();  // fall back to polling
    }
  }
  subscriber.reset();
  report.lock_wait = std::chrono::duration_cast<milliseconds>(BootClock::now() - began);
  report.acquired = true;
  report.token = acquired.token;

  const std::string token = std::to_string(acquired.token);
  const log::Context context{c.run.lock, token};
  // From here on the lease is released on every way out.
  HeldLease held(lease, acquired, owner, timeout, context);
  log::event(log::Level::info, "acquired", "acquired lock",
             context, {log::millis("ttl", c.run.timing.ttl, config::format_duration(c.run.timing.ttl))});
  if (acquired.server_clock_behind) {
    // Only the counter kept this token above the last one: had it been lost, the clock would have
    // issued a smaller token, and guards would reject every holder until the clock caught up.
    const auto gap = std::chrono::duration_cast<milliseconds>(acquired.server_clock_gap);
    const long long tenths = (gap.count() + 50) / 100;
    log::event(log::Level::warn, "clock_behind",
               "the Redis server's clock is " + std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) +
                   "s behind the last token: tokens rely on the counter alone",
               context, {{"behind_ms", std::to_string(gap.count())}});
  }

  const Deadline deadline = schedule.deadline_after(acquired.sent);
  auto ran_short = [&] {
    auto late = std::chrono::duration_cast<milliseconds>(BootClock::now() - schedule.stop_at(deadline));
    log::event(log::Level::error, "lease_short",
               "the lease ran short before the command could start (the acquire reply came too late); "
               "not starting it",
               context, {log::millis("past_stop_point", late, config::format_duration(late))});
    held.release();
    report.lease_lost = true;
    return Exit{c.run.lease_lost_exit_code};
  };

  if (c.run.min_replicas > 0 && acquired.replicas_acked.value_or(0) < c.run.min_replicas) {
    log::event(log::Level::error, "replicas_missing",
               "only " + std::to_string(acquired.replicas_acked.value_or(0)) + " of " +
                   std::to_string(c.run.min_replicas) + " replicas confirmed the lock within " +
                   config::format_duration(c.run.replica_timeout) + "; releasing it",
               context);
    held.release();
    return {exit_code::k_unavailable};
  }

  // A signal that ends the wait may have arrived while the acquire request was in flight: honour it
  // before the command starts, holding nothing.
  if (auto sig = signals.pending_terminating()) {
    log::event(log::Level::info, "interrupted", "stopped before starting the command", context,
               {{"signal", supervisor::signal_name(*sig)}});
    held.release();
    return by_signal(*sig);
  }
  // Never start a command whose lease may already be over on the server.
  if (BootClock::now() >= schedule.stop_at(deadline)) return ran_short();

  // The watchdog and the command are forked while fencerun has a single thread. From here on the
  // supervisor kills the job on every way out, before the lease is released.
  supervisor::Supervisor sup(signals, {c.run.kill_signal, c.run.timing.grace, c.run.timing.margin}, context);
  auto pid = sup.start(c.run.command, child_environment(c, acquired, owner), deadline);
  if (!pid) {
    if (pid.error().too_late) return ran_short();
    log::event(log::Level::error, "exec_failed", pid.error().message, context);
    held.release();
    return {pid.error().exit_code};
  }
  log::event(log::Level::debug, "started", "started the command", context,
             {{"pid", std::to_string(*pid)}, {"containment", sup.containment()}});

  lease::LeaseKeeper keeper(lease, acquired, schedule, timeout, context,
                            [&sup](Deadline renewed) { sup.lease_renewed(renewed); });
  supervisor::LeaseWatch watch{[&keeper] { return keeper.deadline(); }, [&keeper] { return keeper.lost(); },
                               keeper.wake_fd()};
  auto outcome = sup.supervise(watch);
  keeper.stop();
  if (outcome.stopped_for_lease && outcome.command_died_at) {
    auto margin = std::chrono::duration_cast<milliseconds>(keeper.deadline() - *outcome.command_died_at);
    if (margin >= milliseconds::zero())
      log::event(log::Level::warn, "command_stopped", "the command was stopped before the lease deadline",
                 context, {log::millis("before_deadline", margin, config::format_duration(margin))});
    else
      log::event(log::Level::error, "command_stopped",
                 "the command was stopped, but only after the lease deadline: it may have run without the lease",
                 context, {log::millis("after_deadline", -margin, config::format_duration(-margin))});
  }
  // The whole job is gone: release (the next waiter is waiting for it).
  auto released = held.release();
  report.renewals = keeper.stats().renewals;
  report.renew_failures = keeper.stats().failures;
  report.lease_lost = outcome.stopped_for_lease;
  if (outcome.stopped_for_lease) return {c.run.lease_lost_exit_code};
  if (released == HeldLease::Released::not_ours) {
    // Between the last renewal and the command's own exit the lock was deleted, expired or taken:
    // mutual exclusion may have been broken during the run, and the caller must hear of it.
    log::event(log::Level::warn, "lease_lost",
               "the lease was lost while the command ran (the lock was gone or held by another owner at "
               "release): exclusion may have been broken",
               context, {{"command_status", std::to_string(exit_code_from_wait_status(outcome.wait_status))}});
    report.lease_lost = true;
    return {c.run.lease_lost_exit_code};
  }
  // Killed by a signal of its own (Ctrl-C, OOM, ...): end the same way, as timeout(1) does.
  if (WIFSIGNALED(outcome.wait_status)) return by_signal(WTERMSIG(outcome.wait_status));
  return {exit_code_from_wait_status(outcome.wait_status)};
}

}  // namespace
}  // namespace fencerun::app
