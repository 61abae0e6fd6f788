#include "supervisor/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "log/log.hpp"
#include "util/exit_code.hpp"
#include "supervisor/proctree.hpp"
#include "util/error.hpp"

namespace fencerun::supervisor {
namespace {

void arm(int timer_fd, Deadline at) {
  itimerspec spec{};
  auto ns = at.time_since_epoch().count();
  if (ns <= 0) ns = 1;
  spec.it_value.tv_sec = ns / 1'000'000'000;
  spec.it_value.tv_nsec = ns % 1'000'000'000;
  ::timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void drain(int fd) {
  std::uint64_t buf;
  while (::read(fd, &buf, sizeof buf) > 0) {
  }
}

// The terminal fencerun may hand to the command: only when fencerun is its foreground group.
int foreground_tty() {
  for (int fd : {0, 1, 2}) {
    if (::isatty(fd) && ::tcgetpgrp(fd) == ::getpgrp()) return fd;
  }
  return -1;
}

}  // namespace

Supervisor::Supervisor(SignalChannel& signals, StopPolicy policy, log::Context context)
    : m_signals(signals), m_policy(policy), m_context(std::move(context)) {}

Supervisor::~Supervisor() {
  // Every way out after start(): nothing of the job may run on without its lease.
  if (m_pid > 0 && !m_gone) kill_now_and_wait();
  if (m_tty >= 0) ::tcsetpgrp(m_tty, ::getpgrp());
}

void Supervisor::kill_now_and_wait() {
  signal_job(SIGKILL);
  // Bounded: SIGKILL cannot be caught, so only an unkillable (D-state) process can outlast this, and
  // the watchdog (SIGKILL again when it sees the pipe close) and the cgroup's own kill follow anyway.
  Deadline until = BootClock::now() + std::chrono::seconds(2);
  while (BootClock::now() < until) {
    reap();
    if (m_exited && !job_alive()) {
      m_gone = true;
      break;
    }
    ::usleep(1000);
  }
  drop_watchdog(m_gone);
  m_cgroup.reset();
}

void Supervisor::drop_watchdog(bool disarm) {
  std::lock_guard lock(m_watchdog_mutex);
  if (disarm && m_watchdog) m_watchdog->disarm();
  m_watchdog.reset();
}

std::string Supervisor::containment() const {
  if (m_tree) return "process tree (terminal foreground, shared process group)";
  if (!m_cgroup) return "process group";
  return (m_foreground ? "cgroup (terminal foreground, shared process group) " : "cgroup ") + m_cgroup->path();
}

std::expected<pid_t, SpawnError> Supervisor::start(std::vector<std::string> argv, std::vector<std::string> env,
                                                   Deadline deadline) {
  const Deadline stop_at = m_policy.points.stop_at(deadline);
  if (BootClock::now() >= stop_at)
    return std::unexpected(SpawnError{exit_code::k_cannot_execute, "the lease ran short before the command could start", true});
  // Orphaned descendants are re-parented to fencerun, so it can reap them and see the group empty.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  std::string why_not;
  if (auto cg = JobCgroup::create(why_not)) m_cgroup.emplace(std::move(*cg));
  // A terminal's foreground job: the command stays in fencerun's process group, so the terminal
  // treats fencerun, the command and the rest of the caller's job (a pipeline, the calling script) as
  // one, as it would without fencerun. The job is then held by its cgroup or, without one, found as
  // fencerun's descendants (fencerun is their subreaper).
  const int tty = foreground_tty();
  m_foreground = tty >= 0 && (m_cgroup.has_value() || proctree::available());
  m_tree = m_foreground && !m_cgroup;
  m_tty = m_foreground ? -1 : tty;
  // The watchdog is started (supervisor/watchdog.hpp) while fencerun has a single thread, so that a
  // fork fallback is safe; it knows the job before the job runs.
  auto slack = std::min<std::chrono::milliseconds>(m_policy.points.grace / 4, std::chrono::milliseconds(20));
  // The watchdog signals the job's members one by one only when they share the caller's group.
  WatchdogTargets targets{!m_foreground, m_cgroup ? m_cgroup->kill_fd() : -1,
                          m_cgroup && m_foreground ? m_cgroup->procs_read_fd() : -1,
                          m_cgroup ? m_cgroup->events_fd() : -1, m_cgroup ? m_cgroup->path().c_str() : nullptr,
                          m_tree ? ::getpid() : 0};
  m_watchdog.emplace(m_policy.kill_signal, targets, slack);
  m_watchdog_pid = m_watchdog->pid_slot();
  m_report = &m_watchdog->report();
  SpawnRequest request;
  request.argv = std::move(argv);
  request.env = std::move(env);
  request.mask = m_signals.original_mask();
  request.tty_fd = m_tty;
  request.own_group = !m_foreground;
  request.cgroup_fd = m_cgroup ? m_cgroup->dir_fd() : -1;
  if (m_cgroup) request.open_cgroup_procs = [this] { return m_cgroup->open_procs_for_writing(); };
  request.watchdog_fd = m_watchdog->fd();
  request.guard = Watchdog::guard_message(0, stop_at, m_policy.points.kill_at(deadline));
  request.exec_before = stop_at;
  request.ignore_sigchld = sigchld_was_ignored();
  SpawnInfo spawned;
  m_started_at = BootClock::now();
  auto pid = spawn(request, &spawned);
  if (!pid) {
    if (m_tty >= 0) ::tcsetpgrp(m_tty, ::getpgrp());
    m_tty = -1;
    // The child never ran the command (exec failed, or the gate closed): nothing to guard.
    drop_watchdog(true);
    m_cgroup.reset();
    return pid;
  }
  m_pid = *pid;
  // Started inside by the kernel, the command is in its cgroup by construction; moved in by itself
  // (an older kernel), it is checked.
  if (m_cgroup && !spawned.in_cgroup && !m_cgroup->contains(m_pid) && !m_cgroup->populated()) {
    if (m_foreground) {
      // Sharing fencerun's group, the command could be stopped through nothing else: end it now.
      ::kill(m_pid, SIGKILL);
      int status = 0;
      ::waitpid(m_pid, &status, 0);
      m_pid = -1;
      drop_watchdog(true);
      std::string path = m_cgroup->path();
      m_cgroup.reset();
      return std::unexpected(SpawnError{exit_code::k_cannot_execute, "the command could not join its cgroup " + path});
    }
    why_not = "the command could not join " + m_cgroup->path();
    m_cgroup.reset();
  }
  log::event(log::Level::debug, "contained",
             m_cgroup ? "the job runs in its own cgroup: every descendant is stopped with it"
             : m_tree ? "the job shares the terminal's foreground group and is stopped as fencerun's descendants (" +
                            why_not + ")"
                      : "the job is stopped through its pid and process group (" + why_not +
                            "): a process that leaves the group escapes",
             m_context, {{"containment", containment()}});
  return pid;
}

void Supervisor::stop_with_the_job() {
  // While fencerun is stopped nothing renews the lease: the watchdog still stops the job at the stop
  // point, so a job stopped for longer than its lease is ended (exit 124) rather than resumed.
  log::event(log::Level::info, "suspended", "the job was stopped (job control); stopping with it", m_context);
  // Stopped by SIGTSTP, as the terminal's Ctrl-Z stops any other process, so the shell reports 148 (as
  // for flock(1)), not SIGSTOP's 147: raised while blocked, then let through for this thread only.
  struct sigaction current {};
  ::sigaction(SIGTSTP, nullptr, &current);
  if (current.sa_handler == SIG_DFL) {
    sigset_t tstp;
    sigemptyset(&tstp);
    sigaddset(&tstp, SIGTSTP);
    ::raise(SIGTSTP);
    ::pthread_sigmask(SIG_UNBLOCK, &tstp, nullptr);  // delivered here: fencerun stops until SIGCONT
    ::pthread_sigmask(SIG_BLOCK, &tstp, nullptr);
  } else {
    ::raise(SIGSTOP);
  }
  log::event(log::Level::info, "resumed", "continued", m_context);
}

void Supervisor::lease_renewed(Deadline deadline) {
  std::lock_guard lock(m_watchdog_mutex);
  if (m_watchdog) m_watchdog->update(m_policy.points.stop_at(deadline), m_policy.points.kill_at(deadline));
}

void Supervisor::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if (pid < 0 && errno == EINTR) continue;
      return;
    }
    if (pid == m_pid) {
      m_exited = true;
      m_exited_at = BootClock::now();
      m_status = status;
      // Take the terminal back as soon as the command is gone.
      if (m_tty >= 0) ::tcsetpgrp(m_tty, ::getpgrp());
    }
  }
}

bool Supervisor::job_alive() const {
  if (m_cgroup && m_cgroup->populated()) return true;
  if (m_tree) {
    pid_t one;
    return proctree::descendants(::getpid(), watchdog_pid(), &one, 1) > 0;
  }
  if (m_foreground) return false;  // the job is its cgroup; fencerun's own group is the caller's
  return ::kill(-m_pid, 0) == 0 || errno == EPERM;
}

void Supervisor::signal_job(int signo) {
  if (m_pid <= 0) return;
  if (signo == SIGKILL && m_cgroup) m_cgroup->kill();
  if (m_tree) {
    // Never the process group: it is fencerun's own and the caller's.
    proctree::signal_descendants(::getpid(), watchdog_pid(), signo);
    return;
  }
  if (m_foreground) {
    // Never the process group: it is fencerun's own and the caller's.
    if (signo != SIGKILL) m_cgroup->signal_all(signo);
    return;
  }
  if (::kill(-m_pid, signo) != 0 && errno != ESRCH)
    log::event(log::Level::warn, "signal_failed", "cannot signal the command's process group", m_context,
               {{"signal", signal_name(signo)}, {"error", std::strerror(errno)}});
  // The command itself may have left its group (setpgid, setsid); until it is reaped its pid is its own.
  // Only then is it signalled apart, so that a handler does not run twice for one stop.
  if (!m_exited && ::getpgid(m_pid) != m_pid) ::kill(m_pid, signo);
}

void Supervisor::take_watchdog_report(Outcome& out) const {
  out.command_started_at = m_started_at;
  if (!m_exited) return;
  Deadline ended = m_exited_at;
  auto at = [](std::int64_t ns) { return Deadline(std::chrono::nanoseconds(ns)); };
  if (m_report) {
    // fencerun may have been stopped or starved while the watchdog ended the job: what the watchdog
    // saw is then when it happened.
    if (const auto ns = m_report->exited_ns.load(); ns > 0 && at(ns) < ended) ended = std::max(at(ns), m_started_at);
    if (const auto ns = m_report->kill_sent_ns.load(); ns > 0 && out.command_died_at && at(ns) < *out.command_died_at)
      out.command_died_at = std::max(at(ns), ended);
  }
  out.command_ended_at = ended;
  if (out.command_died_at && *out.command_died_at < ended) out.command_died_at = ended;
}

Outcome Supervisor::supervise(const LeaseWatch& lease) {
  Outcome out;
  UniqueFd timer(::timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer) throw SystemError("timerfd_create");

  enum class State { running, stopping, killed } state = State::running;
  int wake_fd = lease.wake_fd;
  bool keeping = !lease.start_keeping;
  Deadline kill_at{};

  auto begin_stop = [&](Deadline now, bool for_lease, const char* why) {
    Deadline deadline = lease.deadline();
    kill_at = std::min(now + m_policy.points.grace, m_policy.points.kill_at(deadline));
    state = State::stopping;
    out.stopped_for_lease = out.stopped_for_lease || for_lease;
    log::event(for_lease ? log::Level::error : log::Level::info, "stopping", why, m_context,
               {{"signal", signal_name(m_policy.kill_signal)}, {"pgid", std::to_string(m_pid)}});
    {
      std::lock_guard lock(m_watchdog_mutex);
      if (m_watchdog) m_watchdog->stopping();
    }
    signal_job(m_policy.kill_signal);
    // A job stopped by job control would never run its handler in the grace time otherwise.
    signal_job(SIGCONT);
  };

  for (;;) {
    reap();
    Deadline now = BootClock::now();
    bool alive = !m_exited || job_alive();
    if (!alive) {
      out.command_died_at = now;
      // fencerun was stopped or starved past the stop point and the watchdog ended the job: that is a
      // lease stop too, whatever the wait status says.
      if (state == State::running &&
          (lease.lost() || (WIFSIGNALED(m_status) && now >= m_policy.points.stop_at(lease.deadline()))))
        out.stopped_for_lease = true;
      // The watchdog's SIGKILL at the kill point may land just before this loop's own.
      if (state == State::stopping && now >= kill_at) out.killed = true;
      if (state != State::running && WIFSIGNALED(m_status) && WTERMSIG(m_status) == SIGKILL) out.killed = true;
      break;
    }
    Deadline next = now + std::chrono::hours(24);
    if (!keeping) {
      if (now >= lease.keep_by) {
        keeping = true;
        wake_fd = lease.start_keeping();
      } else {
        next = lease.keep_by;
      }
    }
    if (state != State::killed && lease.lost()) {
      // The lock is gone or another owner's: no grace, the whole job is killed at once.
      const std::string cause = lease.loss_cause ? lease.loss_cause() : std::string();
      log::event(log::Level::error, "stopping", "lease lost: killing the command at once (no grace)", m_context,
                 {{"signal", "SIGKILL"}, {"pgid", std::to_string(m_pid)}, {"cause", cause.empty() ? "lost" : cause}});
      if (state == State::running) out.stopped_for_lease = true;
      signal_job(SIGKILL);
      out.killed = true;
      state = State::killed;
    }
    if (state == State::running) {
      Deadline stop_at = m_policy.points.stop_at(lease.deadline());
      if (now >= stop_at) {
        begin_stop(now, true, "lease could not be renewed in time: stopping the command");
      } else if (m_exited) {
        begin_stop(now, false, "the command exited: stopping processes left in its group");
      } else {
        next = std::min(next, stop_at);
      }
    }
    if (state == State::stopping) {
      if (now >= kill_at) {
        signal_job(SIGKILL);
        out.killed = true;
        state = State::killed;
        log::event(log::Level::warn, "killed", "sent SIGKILL to the command's process group", m_context,
                   {{"pgid", std::to_string(m_pid)}});
      } else {
        next = std::min(next, kill_at);
      }
    }
    // Leftover group members may not be our children: look again shortly.
    if (m_exited) next = std::min(next, now + std::chrono::milliseconds(10));
    arm(timer.get(), next);

    pollfd fds[3] = {{m_signals.fd(), POLLIN, 0}, {timer.get(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int n = ::poll(fds, wake_fd >= 0 ? 3 : 2, -1);
    if (n < 0 && errno != EINTR) throw SystemError("poll");
    if (fds[1].revents) drain(timer.get());
    if (wake_fd >= 0 && fds[2].revents) drain(wake_fd);
    while (auto received = m_signals.read_one_received()) {
      const int sig = received->signo;
      if (!is_forwarded(sig)) continue;  // SIGCHLD: reaped at the top of the loop
      if (m_foreground && received->from_terminal) {
        // The terminal sent it to its whole foreground group: the job has it already. Ctrl-Z: stop
        // with the job, so that the shell sees the whole job stopped and gets its prompt back.
        if (sig == SIGTSTP) stop_with_the_job();
        continue;
      }
      log::event(log::Level::info, "forwarded", "forwarding signal to the command", m_context,
                 {{"signal", signal_name(sig)}});
      signal_job(sig);
      if (m_foreground && sig == SIGTSTP) stop_with_the_job();
    }
  }
  take_watchdog_report(out);
  // Every process of the job is gone: the watchdog has nothing left to guard.
  m_gone = true;
  drop_watchdog(true);
  m_cgroup.reset();
  out.wait_status = m_status;
  return out;
}

}  // namespace fencerun::supervisor
