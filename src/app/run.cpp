// Acquire (waiting if asked), run the command under the lease, release. The order of steps matters:
// the signal mask is set before any thread or child exists, the watchdog and the command are started
// before the renewal thread starts, and the lock is released only after every process of the job is
// gone (the HeldLease releases itself on every way out; the Supervisor kills the job on every way out,
// and is destroyed first).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "app/app.hpp"
#include "app/backend.hpp"
#include "app/metrics.hpp"
#include "util/duration.hpp"
#include "util/fd.hpp"
#include "lease/lease.hpp"
#include "log/log.hpp"
#include "supervisor/exit_status.hpp"
#include "supervisor/signals.hpp"
#include "supervisor/supervisor.hpp"
#include "util/random.hpp"
#include "version.hpp"

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

// fencerun's environment without the variables it sets, then the lease's facts.
// The command's environment: fencerun's own, without any FENCERUN_* variable (an outer run's, a
// password, a setting meant for this fencerun), plus what this run sets: the lease's facts and the
// descriptor of the shared connection (config::share_connection).
std::vector<std::string> child_environment(const lease::HeldLease& held, int connection_fd) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    if (!entry.starts_with("FENCERUN_")) env.emplace_back(entry);
  }
  for (const auto& [name, value] : held.facts()) env.push_back(name + "=" + value);
  if (connection_fd >= 0) env.push_back("FENCERUN_CONNECTION_FD=" + std::to_string(connection_fd));
  return env;
}

Exit by_signal(int signo) { return {exit_code_for_signal(signo), signo}; }

// The wait for the lock sleeps here: any signal that would end fencerun ends the wait instead.
class SignalWaiter final : public lease::Waiter {
 public:
  SignalWaiter(supervisor::SignalChannel& signals, const std::string& lock) : m_signals(signals), m_lock(lock) {}
  std::optional<int> sleep_until(Deadline wake, int fd, bool& woken) override {
    auto sig = m_signals.wait_for_terminating(wake, fd, woken);
    if (sig)
      log::event(log::Level::info, "interrupted", "stopped waiting for the lock",
                 {{"lock", m_lock}, {"signal", supervisor::signal_name(*sig)}});
    return sig;
  }

 private:
  supervisor::SignalChannel& m_signals;
  const std::string& m_lock;
};

lease::LeaseRequest lease_request(const config::Config& c) {
  lease::LeaseRequest r;
  r.lock = c.run.lock;
  r.owner = random_hex(16);
  r.pid = ::getpid();
  r.host = host_name();
  r.timing = c.run.timing;
  r.wait = c.run.wait;
  r.fair = c.run.fair;
  r.limit = c.run.limit;
  r.min_replicas = c.run.min_replicas;
  r.replica_timeout = c.run.replica_timeout;
  r.request_timeout = c.common.timeout;
  r.records = c.run.records;
  r.min_interval = c.run.min_interval;
  r.every = c.run.every;
  r.skip_if_record_lost = c.run.skip_if_record_lost;
  r.lock_delay = c.run.lock_delay;
  r.version = FENCERUN_VERSION;
  return r;
}

Exit not_acquired(const config::Config& c, const lease::NotAcquired& why) {
  switch (why.reason) {
    case lease::NotAcquired::Reason::busy: return {c.run.conflict_exit_code};
    case lease::NotAcquired::Reason::unavailable: return {exit_code::k_unavailable};
    case lease::NotAcquired::Reason::interrupted: return by_signal(why.signal);
    case lease::NotAcquired::Reason::limit_mismatch: return {exit_code::k_usage};
    case lease::NotAcquired::Reason::skipped: return {c.run.skip_exit_code};
    case lease::NotAcquired::Reason::rule_mismatch: return {exit_code::k_usage};
  }
  return {exit_code::k_internal};
}

void log_stop_margin(const supervisor::Outcome& outcome, Deadline deadline, const log::Context& context) {
  if (!outcome.stopped_for_lease || !outcome.command_died_at) return;
  auto margin = std::chrono::duration_cast<milliseconds>(deadline - *outcome.command_died_at);
  if (margin >= milliseconds::zero())
    log::event(log::Level::warn, "command_stopped", "the command was stopped before the lease deadline", context,
               {log::millis("before_deadline", margin, util::format_duration(margin))});
  else
    log::event(log::Level::error, "command_stopped",
               "the command was stopped, but only after the lease deadline: it may have run without the lease",
               context, {log::millis("after_deadline", -margin, util::format_duration(-margin))});
}

// Runs the command under `held` and says how fencerun ends. The job is gone when this returns.
Exit run_under(const config::Config& c, supervisor::SignalChannel& signals, lease::HeldLease& held,
               RunReport& report) {
  const log::Context context{c.run.lock, std::to_string(held.token()),
                             c.run.limit > 1 ? std::to_string(held.slot()) : std::string()};
  const lease::LeaseSchedule schedule(c.run.timing);
  const Deadline deadline = held.deadline();
  auto ran_short = [&] {
    auto late = std::chrono::duration_cast<milliseconds>(BootClock::now() - schedule.stop_at(deadline));
    log::event(log::Level::error, "lease_short",
               "the lease ran short before the command could start (the acquire reply came too late); "
               "not starting it",
               context, {log::millis("past_stop_point", late, util::format_duration(late))});
    report.lease_lost = true;
    return Exit{c.run.lease_lost_exit_code};
  };
  // A signal that ends the wait may have arrived while the acquire request was in flight: honour it
  // before the command starts, holding nothing.
  if (auto sig = signals.pending_terminating()) {
    log::event(log::Level::info, "interrupted", "stopped before starting the command", context,
               {{"signal", supervisor::signal_name(*sig)}});
    return by_signal(*sig);
  }
  // Never start a command whose lease may already be over on the server.
  if (BootClock::now() >= schedule.stop_at(deadline)) return ran_short();

  // The watchdog and the command are started while fencerun has a single thread. From here on the
  // supervisor kills the job on every way out, before the lease is released.
  supervisor::Supervisor sup(signals, {c.run.kill_signal, schedule.stop_points()}, context);
  // The job's fencerun commands reach the same server with the same credentials and TLS settings.
  UniqueFd connection(c.common.target->share_connection());
  auto pid = sup.start(c.run.command, child_environment(held, connection.get()), deadline);
  connection.reset();  // the command has its copy
  if (!pid) {
    if (pid.error().too_late) return ran_short();
    log::event(log::Level::error, "exec_failed", pid.error().message, context);
    return {pid.error().exit_code};
  }
  log::event(log::Level::debug, "started", "started the command", context,
             {{"pid", std::to_string(*pid)}, {"containment", sup.containment()}});

  // The renewal thread starts once the job has run 20 ms, and no later than the first renewal is due
  // (the acquire was sent at deadline - ttl + drift): a short job is over before and never pays for it.
  const auto& t = c.run.timing;
  supervisor::LeaseWatch watch{[&held] { return held.deadline(); }, [&held] { return held.lost(); }, -1,
                               [&held, &sup] {
                                 held.keep([&sup](Deadline renewed) { sup.lease_renewed(renewed); });
                                 return held.wake_fd();
                               },
                               std::min(BootClock::now() + milliseconds(20), deadline - t.ttl + t.drift + t.renew),
                               [&held] { return std::string(lease::loss_cause_name(held.loss_cause())); }};
  auto outcome = sup.supervise(watch);
  held.stop_keeping();
  log_stop_margin(outcome, held.deadline(), context);
  // How it ended goes into the record the release writes.
  lease::RunOutcome ran;
  if (WIFSIGNALED(outcome.wait_status)) ran.signal = WTERMSIG(outcome.wait_status);
  else ran.exit_code = exit_code_from_wait_status(outcome.wait_status);
  ran.outcome = outcome.stopped_for_lease ? "stopped" : ran.exit_code == 0 ? "ok" : "failed";
  if (auto took = outcome.ran()) ran.ran = std::chrono::duration_cast<std::chrono::microseconds>(*took);
  held.set_outcome(ran);
  const bool succeeded = ran.outcome == "ok";
  // The whole job is gone: release (the next waiter is waiting for it).
  auto released = held.release();
  report.renewals = held.stats().renewals;
  report.renew_failures = held.stats().failures;
  report.lease_lost = outcome.stopped_for_lease;
  if (outcome.stopped_for_lease) return {c.run.lease_lost_exit_code};
  if (released == lease::HeldLease::Released::not_ours) {
    // Between the last renewal and the command's own exit the lock was deleted, expired or taken:
    // mutual exclusion may have been broken during the run, and the caller must hear of it.
    log::event(log::Level::warn, "lease_lost",
               "the lease was lost while the command ran (the lock was gone or held by another owner at "
               "release): exclusion may have been broken",
               context, {{"command_status", std::to_string(exit_code_from_wait_status(outcome.wait_status))}});
    report.lease_lost = true;
    return {c.run.lease_lost_exit_code};
  }
  if (succeeded) report.last_success_us = held.started_us();
  // Killed by a signal of its own (Ctrl-C, OOM, ...): end the same way, as timeout(1) does.
  if (WIFSIGNALED(outcome.wait_status)) return by_signal(WTERMSIG(outcome.wait_status));
  return {exit_code_from_wait_status(outcome.wait_status)};
}

Exit run_locked(const config::Config& c, RunReport& report) {
  supervisor::SignalChannel signals;  // before any thread or child exists
  auto lease = backend_for(c.common)->lease(lease_request(c));
  SignalWaiter waiter(signals, c.run.lock);
  auto held = lease->acquire(waiter, report.lock_wait);
  if (!held) {
    if (held.error().reason == lease::NotAcquired::Reason::skipped && held.error().last_success_us > 0)
      report.last_success_us = held.error().last_success_us;
    return not_acquired(c, held.error());
  }
  report.acquired = true;
  report.token = (*held)->token();
  report.slot = (*held)->slot();
  // Released by the HeldLease on every way out, after run_under has seen the job gone.
  return run_under(c, signals, **held, report);
}

}  // namespace

Exit run(const config::Config& c) {
  RunReport report;
  report.lock = c.run.lock;
  report.counting = c.run.limit > 1;
  report.started = std::chrono::system_clock::now();
  Exit code = run_locked(c, report);
  report.exit_code = code.code;
  report.ended = std::chrono::system_clock::now();
  if (c.metrics_file) {
    if (!report.last_success_us) report.last_success_us = previous_last_success(*c.metrics_file);
    if (auto written = write_metrics_file(*c.metrics_file, report); !written)
      log::event(log::Level::warn, "metrics_failed", "cannot write the metrics file: " + written.error(),
                 {{"lock", c.run.lock}});
  }
  return code;
}

}  // namespace fencerun::app
