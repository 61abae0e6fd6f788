#pragma once
// Watchdog: a tiny forked process that enforces the lease deadline on the job by itself, so the
// invariant does not depend on fencerun being scheduled. It is told the job's pid (by the child itself,
// before exec) and every new stop point and kill point (after each renewal), and:
//   - at the stop point (plus a small slack, unless fencerun said it is stopping the job itself) sends
//     the kill signal and SIGCONT to the job's pid and process group;
//   - at the kill point sends SIGKILL to the pid, the group and the job's cgroup (cgroup.kill);
//   - reports back, in a page it shares with fencerun (report()), when it sent the kill signal and
//     SIGKILL and when it saw the command itself exit (a pidfd), so that a fencerun that was stopped or
//     starved meanwhile learns when the job really ended, not when it woke up to see it;
//   - when fencerun dies (end of file on its pipe, even after SIGKILL or SIGSTOP-then-kill) or drops
//     the Watchdog object without disarming it, SIGKILLs the job at once.
// It lives in a process group of its own, so a signal aimed at fencerun's group (a terminal's Ctrl-Z,
// kill -STOP -PGID) does not stop it too.
//
// It is started with clone(CLONE_VM), like a thread but as a process of its own: it shares fencerun's
// memory instead of copying it (a fork's copy-on-write faults cost more than the rest of a short run),
// runs on a stack of its own and makes only raw system calls (sys.hpp). It survives a SIGKILL or
// SIGSTOP of fencerun. The kernel's OOM killer, though, kills every process that shares the victim's
// memory (and so does a core dump on kernels before 5.16): once the job has run for 100 ms, the
// watchdog forks itself into a memory of its own and the copy carries on, under a new pid (pid()).
// Short runs end before that and never pay for the copy.
// Where sys.hpp has no raw system calls for the machine, or clone fails, it is forked (then while
// fencerun has a single thread).
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "util/clock.hpp"
#include "util/fd.hpp"

namespace fencerun::supervisor {

// One message on the watchdog's pipe; smaller than PIPE_BUF, so every write is atomic.
struct WatchMessage {
  enum Kind : std::int32_t { guard = 1, deadline = 2, stopping = 3, disarm = 4 };
  std::int32_t kind = 0;
  std::int32_t pid = 0;       // guard: the job's pid, which is also its process group id
  std::int64_t stop_ns = 0;   // guard, deadline: CLOCK_BOOTTIME nanoseconds
  std::int64_t kill_ns = 0;
};

// What the watchdog saw, in a page shared with fencerun (it stays shared after the watchdog moves into
// a memory of its own). CLOCK_BOOTTIME nanoseconds, 0 until it happened.
struct WatchReport {
  std::atomic<std::int64_t> stop_sent_ns{0};  // the kill signal sent at the stop point (by the watchdog)
  std::atomic<std::int64_t> kill_sent_ns{0};  // SIGKILL sent at the kill point (by the watchdog)
  std::atomic<std::int64_t> exited_ns{0};     // the command (the guarded pid) seen exiting
};

// What the watchdog signals: the job's process group (and pid), or, when the job shares fencerun's
// process group (a terminal's foreground job), the members of its cgroup or, without a cgroup,
// fencerun's descendants (see proctree.hpp); and the cgroup's kill file.
struct WatchdogTargets {
  bool own_group = true;
  int cgroup_kill_fd = -1;   // open cgroup.kill, written at the kill point
  int cgroup_procs_fd = -1;  // open cgroup.procs (read), where the job's members are signalled one by one
  int cgroup_events_fd = -1;  // open cgroup.events (read): whether the job is gone
  const char* cgroup_path = nullptr;  // removed by the watchdog once the job is gone, if fencerun died
  pid_t tree_root = 0;       // > 0: the job is every descendant of this pid (fencerun) but the watchdog
};

enum class WatchdogStart { clone, fork };
// How long a cloned watchdog shares fencerun's memory before it moves into its own (default 100 ms).
void set_watchdog_detach_delay(std::chrono::milliseconds delay);
// How the next watchdogs start (tests use fork to cover that path too). Not thread-safe.
void set_watchdog_start(WatchdogStart how);

class Watchdog {
 public:
  // Starts the watchdog. `kill_signal` is sent at the stop point, SIGKILL at the kill point.
  // Throws SystemError when it can neither be cloned nor forked.
  explicit Watchdog(int kill_signal = 15, WatchdogTargets targets = {},
                    std::chrono::milliseconds slack = std::chrono::milliseconds(20));
  // Without disarm(): the watchdog SIGKILLs the job (this is what an exception unwinding past a
  // running job relies on).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The pipe's write end (close-on-exec), for the child to send its own guard message before exec.
  int fd() const { return m_pipe.get(); }
  // The watchdog's pid. A cloned watchdog moves into a memory of its own once the job has run a
  // while, under a new pid: this follows it. pid_slot() stays valid after the Watchdog is gone.
  pid_t pid() const { return m_pid->load(); }
  const std::atomic<pid_t>* pid_slot() const { return m_pid; }
  // What the watchdog saw (stays valid after the Watchdog is gone).
  const WatchReport& report() const { return *m_report; }
  static WatchMessage guard_message(pid_t pgid, Deadline stop_at, Deadline kill_at);

  // From now on, guard process group `pgid` (without a deadline unless one is given).
  void guard(pid_t pgid);
  void guard(pid_t pgid, Deadline stop_at, Deadline kill_at);
  // A renewal moved the stop and kill points. Safe to call from any thread.
  void update(Deadline stop_at, Deadline kill_at);
  // fencerun is sending the kill signal itself: the watchdog only enforces the kill point.
  void stopping();
  // The job is gone: let the watchdog exit quietly.
  void disarm();

 private:
  void send(const WatchMessage& m);
  UniqueFd m_pipe;
  std::atomic<pid_t>* m_pid = nullptr;
  WatchReport* m_report = nullptr;
};

}  // namespace fencerun::supervisor
