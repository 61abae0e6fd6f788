#pragma once
// Supervisor: runs the command as a job (its own process group, and its own cgroup where one can be
// made) and watches it until every process of the job is gone. It forwards signals to the job, and
// enforces the stop sequence against a lease deadline it is given:
//   kill signal (then SIGCONT) at deadline - grace - margin,
//   SIGKILL at deadline - margin (or grace after the kill signal, whichever comes first),
//   SIGKILL at once when the lease is reported lost (the lock is already someone else's, or anyone's:
//   the grace the lease would have paid for is not ours to give).
// The same points are handed to a watchdog process that enforces them on its own, so the job dies in
// time even when fencerun is stopped, starved or killed. Processes left after the command exits get the
// same sequence, so nothing outlives the lease. Once start() has succeeded, the job is killed on every
// way out: a Supervisor destroyed before supervise() saw the job gone (an exception, an early return)
// SIGKILLs it and waits for it. Knows nothing of Redis.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <expected>
#include <functional>
#include <mutex>
#include <optional>

#include "lease/timing.hpp"
#include "log/log.hpp"
#include "supervisor/cgroup.hpp"
#include "supervisor/signals.hpp"
#include "supervisor/spawn.hpp"
#include "supervisor/watchdog.hpp"
#include "util/clock.hpp"

namespace fencerun::supervisor {

struct LeaseWatch {
  std::function<Deadline()> deadline;  // current lease deadline (renewals move it later)
  std::function<bool()> lost;          // true: the lock is someone else's: kill the job at once
  int wake_fd = -1;                    // readable when lost() may have changed
  // When set: starts the renewals and returns the new wake_fd; called at keep_by if the job still
  // runs then. A job that is over by then (a short run) never pays for the renewal thread. keep_by
  // must not be later than the first renewal is due.
  std::function<int()> start_keeping;
  Deadline keep_by{};
  std::function<std::string()> loss_cause;  // why lost() is true, for the log (optional)
};

// How the job is stopped: `kill_signal` at points.stop_at(deadline), SIGKILL at points.kill_at(deadline)
// (the lease's one stop formula, lease/timing.hpp).
struct StopPolicy {
  int kill_signal = SIGTERM;
  lease::StopPoints points;
};

struct Outcome {
  int wait_status = 0;          // of the command itself
  bool stopped_for_lease = false;
  bool killed = false;          // SIGKILL was needed
  // When the job was gone: as fencerun saw it, or, when the watchdog ended it (fencerun stopped or
  // starved meanwhile), no later than the watchdog's SIGKILL.
  std::optional<Deadline> command_died_at;
  Deadline command_started_at{};  // when the command was started
  // When the command itself ended: reaped by fencerun, or seen exiting by the watchdog, whichever was
  // first (a fencerun stopped past the stop point sees it only when it runs again).
  std::optional<Deadline> command_ended_at;
  // How long the command ran (command_ended_at - command_started_at).
  std::optional<BootClock::duration> ran() const {
    if (!command_ended_at) return std::nullopt;
    return *command_ended_at - command_started_at;
  }
};

class Supervisor {
 public:
  Supervisor(SignalChannel& signals, StopPolicy policy, log::Context context);
  ~Supervisor();

  // Starts the command (see spawn()) under a lease that ends at `deadline`; never once its stop point
  // has passed (SpawnError::too_late). Call once.
  std::expected<pid_t, SpawnError> start(std::vector<std::string> argv, std::vector<std::string> env,
                                         Deadline deadline);
  // Runs until the command has exited and no process of the job is left.
  Outcome supervise(const LeaseWatch& lease);
  // A renewal moved the deadline: tell the watchdog. Safe to call from any thread.
  void lease_renewed(Deadline deadline);
  // How the job is contained, for the log: "cgroup PATH", "process group" or "process tree".
  std::string containment() const;

 private:
  void reap();
  bool job_alive() const;
  void signal_job(int signo);
  void kill_now_and_wait();
  void drop_watchdog(bool disarm);
  void stop_with_the_job();
  void take_watchdog_report(Outcome& out) const;

  SignalChannel& m_signals;
  StopPolicy m_policy;
  log::Context m_context;
  std::optional<JobCgroup> m_cgroup;
  std::optional<Watchdog> m_watchdog;  // guarded by m_watchdog_mutex (renewals reach it from another thread)
  mutable std::mutex m_watchdog_mutex;
  bool m_gone = false;  // every process of the job was seen gone
  bool m_foreground = false;  // a terminal's foreground job sharing fencerun's group
  bool m_tree = false;        // ... contained as fencerun's descendants, for want of a cgroup
  // Follows the watchdog when it moves into a memory of its own (a new pid); valid after m_watchdog
  // is dropped. Its subtree is left out of the job's process tree.
  const std::atomic<pid_t>* m_watchdog_pid = nullptr;
  pid_t watchdog_pid() const { return m_watchdog_pid ? m_watchdog_pid->load() : -1; }
  pid_t m_pid = -1;
  int m_tty = -1;
  bool m_exited = false;
  int m_status = 0;
  Deadline m_started_at{};  // the command's start
  Deadline m_exited_at{};   // when reap() saw the command exit
  const WatchReport* m_report = nullptr;  // the watchdog's (stays valid after it is dropped)
};

}  // namespace fencerun::supervisor
