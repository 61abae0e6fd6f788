#include "supervisor/watchdog.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>

#include "supervisor/cgroup.hpp"
#include "supervisor/proctree.hpp"
#include "util/error.hpp"
#include <cerrno>

namespace fencerun::supervisor {
namespace {

std::int64_t boot_ns() { return BootClock::now().time_since_epoch().count(); }
std::int64_t to_ns(Deadline d) { return d.time_since_epoch().count(); }

// Closes every descriptor from 3 on but those in `keep` (entries may be -1).
template <std::size_t N>
void close_all_but(int (&keep)[N]) {
  std::sort(std::begin(keep), std::end(keep));
  unsigned from = 3;
  for (int k : keep) {
    if (k < 0 || static_cast<unsigned>(k) < from) continue;
    if (static_cast<unsigned>(k) > from) ::close_range(from, static_cast<unsigned>(k) - 1, 0);
    from = static_cast<unsigned>(k) + 1;
  }
  ::close_range(from, ~0U, 0);
}

// fencerun died: nobody else will remove the job's (emptied) cgroup. Waits up to a second for the
// killed members to leave it.
void remove_cgroup(const WatchdogTargets& targets) {
  if (!targets.cgroup_path || targets.cgroup_procs_fd < 0) return;
  for (int i = 0; i < 1000; ++i) {
    char c;
    if (::pread(targets.cgroup_procs_fd, &c, 1, 0) <= 0) break;  // empty
    timespec ms{0, 1'000'000};
    ::nanosleep(&ms, nullptr);
  }
  ::rmdir(targets.cgroup_path);
}

// Only async-signal-safe calls from here on: the parent may have been multi-threaded at fork.
[[noreturn]] void watchdog_main(int read_fd, const WatchdogTargets& targets, int kill_signal, std::int64_t slack_ns) {
  const int cgroup_kill_fd = targets.cgroup_kill_fd;
  const int cgroup_procs_fd = targets.cgroup_procs_fd;
  sigset_t all;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  // Its own group: a kill or a stop aimed at fencerun's group must not take the watchdog with it.
  ::setpgid(0, 0);
  ::prctl(PR_SET_NAME, "fencerun-watch");
  int keep[] = {read_fd, cgroup_kill_fd, cgroup_procs_fd};
  close_all_but(keep);
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    for (int fd = 0; fd <= 2; ++fd) ::dup2(devnull, fd);
    if (devnull > 2) ::close(devnull);
  }
  ::fcntl(read_fd, F_SETFL, O_NONBLOCK);
  int timer = ::timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK);

  pid_t pid = 0;
  std::int64_t stop_ns = 0, kill_ns = 0;
  bool parent_stopping = false, sent_stop = false, sent_kill = false;
  auto hit = [&](int sig) {
    if (pid <= 0) return;
    if (targets.own_group) {
      ::kill(-pid, sig);
      if (::getpgid(pid) != pid) ::kill(pid, sig);  // the command left its group
    } else if (targets.tree_root > 0) {
      // The job shares fencerun's (the caller's) process group and has no cgroup: it is fencerun's
      // descendants. Once fencerun is gone (we were re-parented), only the command's own subtree is left.
      if (::getppid() == targets.tree_root) {
        proctree::signal_descendants(targets.tree_root, ::getpid(), sig);
      } else {
        ::kill(pid, sig);
        proctree::signal_descendants(pid, ::getpid(), sig);
      }
    } else {
      // The job shares fencerun's (the caller's) process group: signal its cgroup's members only.
      if (cgroup_procs_fd >= 0) signal_cgroup_members(cgroup_procs_fd, sig);
      ::kill(pid, sig);
    }
    if (sig == SIGKILL && cgroup_kill_fd >= 0) [[maybe_unused]] auto n = ::write(cgroup_kill_fd, "1", 1);
  };

  for (;;) {
    WatchMessage batch[16];
    for (;;) {
      ssize_t n = ::read(read_fd, batch, sizeof batch);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;  // EAGAIN: nothing more for now
      if (n == 0) {      // end of file: fencerun is gone, or dropped us without disarming
        hit(SIGKILL);
        if (pid <= 0 && cgroup_kill_fd >= 0) [[maybe_unused]] auto k = ::write(cgroup_kill_fd, "1", 1);
        remove_cgroup(targets);
        ::_exit(0);
      }
      for (ssize_t i = 0; i + static_cast<ssize_t>(sizeof(WatchMessage)) <= n; i += sizeof(WatchMessage)) {
        const WatchMessage& m = batch[i / static_cast<ssize_t>(sizeof(WatchMessage))];
        switch (m.kind) {
          case WatchMessage::guard:
            pid = m.pid;
            if (m.stop_ns > 0) stop_ns = m.stop_ns, kill_ns = m.kill_ns;
            break;
          case WatchMessage::deadline:
            // A renewal only ever moves the points later; once the job is being stopped it stays so.
            if (!sent_stop) stop_ns = std::max(stop_ns, m.stop_ns);
            if (!sent_kill) kill_ns = std::max(kill_ns, m.kill_ns);
            break;
          case WatchMessage::stopping: parent_stopping = true; break;
          case WatchMessage::disarm: ::_exit(0);
          default: break;
        }
      }
    }
    std::int64_t now = boot_ns();
    if (pid > 0 && stop_ns > 0 && !sent_stop && !parent_stopping && now >= stop_ns + slack_ns) {
      hit(kill_signal);
      hit(SIGCONT);  // a stopped job must be able to run its handler in the grace time
      sent_stop = true;
    }
    if (pid > 0 && kill_ns > 0 && !sent_kill && now >= kill_ns) {
      hit(SIGKILL);
      sent_kill = true;
    }
    std::int64_t next = 0;
    if (pid > 0 && stop_ns > 0 && !sent_stop && !parent_stopping) next = stop_ns + slack_ns;
    if (pid > 0 && kill_ns > 0 && !sent_kill) next = next ? std::min(next, kill_ns) : kill_ns;
    itimerspec spec{};
    if (next > 0) {
      spec.it_value.tv_sec = next / 1'000'000'000;
      spec.it_value.tv_nsec = next % 1'000'000'000;
    }
    if (timer >= 0) ::timerfd_settime(timer, TFD_TIMER_ABSTIME, &spec, nullptr);
    pollfd fds[2] = {{read_fd, POLLIN, 0}, {timer, POLLIN, 0}};
    int ready = ::poll(fds, timer >= 0 ? 2 : 1, timer >= 0 || next == 0 ? -1 : 10);
    if (ready > 0 && timer >= 0 && fds[1].revents) {
      std::uint64_t expirations;
      [[maybe_unused]] auto n = ::read(timer, &expirations, sizeof expirations);
    }
  }
}

}  // namespace

Watchdog::Watchdog(int kill_signal, WatchdogTargets targets, std::chrono::milliseconds slack) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw SystemError("pipe2");
  UniqueFd read_end(fds[0]);
  m_pipe.reset(fds[1]);
  // Never block a writer (the renewal thread) on a watchdog that is itself stopped: a full pipe drops
  // the update, and the watchdog acts on the points it already has, which only errs on the safe side.
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
  m_pid = ::fork();
  if (m_pid < 0) throw SystemError("fork");
  if (m_pid == 0)
    watchdog_main(read_end.get(), targets, kill_signal,
                  std::chrono::duration_cast<std::chrono::nanoseconds>(slack).count());
}

Watchdog::~Watchdog() {
  // Closing the pipe without a disarm message makes the watchdog SIGKILL the job. Not waited for: it
  // exits by itself, and fencerun's reaper (or init) collects it.
  m_pipe.reset();
}

WatchMessage Watchdog::guard_message(pid_t pgid, Deadline stop_at, Deadline kill_at) {
  WatchMessage m;
  m.kind = WatchMessage::guard;
  m.pid = static_cast<std::int32_t>(pgid);
  m.stop_ns = to_ns(stop_at);
  m.kill_ns = to_ns(kill_at);
  return m;
}

void Watchdog::send(const WatchMessage& m) {
  if (!m_pipe) return;
  for (;;) {
    ssize_t n = ::write(m_pipe.get(), &m, sizeof m);
    if (n < 0 && errno == EINTR) continue;
    return;
  }
}

void Watchdog::guard(pid_t pgid) {
  WatchMessage m;
  m.kind = WatchMessage::guard;
  m.pid = static_cast<std::int32_t>(pgid);
  send(m);
}

void Watchdog::guard(pid_t pgid, Deadline stop_at, Deadline kill_at) { send(guard_message(pgid, stop_at, kill_at)); }

void Watchdog::update(Deadline stop_at, Deadline kill_at) {
  WatchMessage m;
  m.kind = WatchMessage::deadline;
  m.stop_ns = to_ns(stop_at);
  m.kill_ns = to_ns(kill_at);
  send(m);
}

void Watchdog::stopping() {
  WatchMessage m;
  m.kind = WatchMessage::stopping;
  send(m);
}

void Watchdog::disarm() {
  WatchMessage m;
  m.kind = WatchMessage::disarm;
  send(m);
  m_pipe.reset();
}

}  // namespace fencerun::supervisor
