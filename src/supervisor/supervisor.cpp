#include "supervisor/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "log/log.hpp"

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
  if (m_tty >= 0) ::tcsetpgrp(m_tty, ::getpgrp());
}

std::expected<pid_t, SpawnError> Supervisor::start(std::vector<std::string> argv, std::vector<std::string> env) {
  // Orphaned descendants are re-parented to fencerun, so it can reap them and see the group empty.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  m_tty = foreground_tty();
  SpawnRequest request{std::move(argv), std::move(env), m_signals.original_mask(), m_tty};
  auto pid = spawn(request);
  if (!pid) {
    if (m_tty >= 0) ::tcsetpgrp(m_tty, ::getpgrp());
    m_tty = -1;
    return pid;
  }
  m_pid = *pid;
  return pid;
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
      m_status = status;
      // Take the terminal back as soon as the command is gone.
      if (m_tty >= 0) ::tcsetpgrp(m_tty, ::getpgrp());
    }
  }
}

bool Supervisor::group_alive() const { return ::kill(-m_pid, 0) == 0 || errno == EPERM; }

void Supervisor::signal_group(int signo) {
  if (::kill(-m_pid, signo) != 0 && errno != ESRCH)
    log::event(log::Level::warn, "signal_failed", "cannot signal the command's process group", m_context,
               {{"signal", signal_name(signo)}, {"error", std::strerror(errno)}});
}

Outcome Supervisor::supervise(const LeaseWatch& lease) {
  Outcome out;
  UniqueFd timer(::timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer) throw std::system_error(errno, std::generic_category(), "timerfd_create");

  enum class State { running, stopping, killed } state = State::running;
  Deadline kill_at{};

  auto begin_stop = [&](Deadline now, bool for_lease, const char* why) {
    Deadline deadline = lease.deadline();
    kill_at = std::min(now + m_policy.grace, deadline - m_policy.margin);
    state = State::stopping;
    out.stopped_for_lease = out.stopped_for_lease || for_lease;
    log::event(for_lease ? log::Level::error : log::Level::info, "stopping", why, m_context,
               {{"signal", signal_name(m_policy.kill_signal)}, {"pgid", std::to_string(m_pid)}});
    signal_group(m_policy.kill_signal);
  };

  for (;;) {
    reap();
    Deadline now = BootClock::now();
    bool alive = !m_exited || group_alive();
    if (!alive) {
      out.command_died_at = now;
      break;
    }
    Deadline next = now + std::chrono::hours(24);
    if (state == State::running) {
      Deadline stop_at = lease.deadline() - m_policy.grace - m_policy.margin;
      if (lease.lost()) {
        begin_stop(now, true, "lease lost: stopping the command");
      } else if (now >= stop_at) {
        begin_stop(now, true, "lease could not be renewed in time: stopping the command");
      } else if (m_exited) {
        begin_stop(now, false, "the command exited: stopping processes left in its group");
      } else {
        next = stop_at;
      }
    }
    if (state == State::stopping) {
      if (now >= kill_at) {
        signal_group(SIGKILL);
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

    pollfd fds[3] = {{m_signals.fd(), POLLIN, 0}, {timer.get(), POLLIN, 0}, {lease.wake_fd, POLLIN, 0}};
    int n = ::poll(fds, lease.wake_fd >= 0 ? 3 : 2, -1);
    if (n < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    if (fds[1].revents) drain(timer.get());
    if (lease.wake_fd >= 0 && fds[2].revents) drain(lease.wake_fd);
    while (auto sig = m_signals.read_one()) {
      if (*sig == SIGCHLD) continue;  // reaped at the top of the loop
      if (!m_exited && is_forwarded(*sig)) {
        log::event(log::Level::info, "forwarded", "forwarding signal to the command", m_context,
                   {{"signal", signal_name(*sig)}});
        signal_group(*sig);
      }
    }
  }
  out.wait_status = m_status;
  return out;
}

}  // namespace fencerun::supervisor
