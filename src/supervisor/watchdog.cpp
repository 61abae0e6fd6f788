#include "supervisor/watchdog.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

namespace fencerun::supervisor {
namespace {

[[noreturn]] void watchdog_main(int read_fd) {
  sigset_t all;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  // Its own group: a kill aimed at fencerun's group must not take the watchdog with it.
  ::setpgid(0, 0);
  ::prctl(PR_SET_NAME, "fencerun-watch");
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
  }
  if (read_fd != 3) {
    ::dup2(read_fd, 3);
  }
  ::close_range(4, ~0U, 0);  // the Redis socket and anything else fencerun holds
  std::int32_t pgid = 0;
  for (;;) {
    std::int32_t message = 0;
    ssize_t n = ::read(3, &message, sizeof message);
    if (n == static_cast<ssize_t>(sizeof message)) {
      if (message <= 0) ::_exit(0);  // disarmed
      pgid = message;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // End of file: fencerun is gone.
    if (pgid > 0) ::kill(-pgid, SIGKILL);
    ::_exit(0);
  }
}

}  // namespace

Watchdog::Watchdog() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  UniqueFd read_end(fds[0]);
  m_pipe.reset(fds[1]);
  m_pid = ::fork();
  if (m_pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (m_pid == 0) watchdog_main(read_end.get());
}

Watchdog::~Watchdog() {
  // Not waited for: once disarmed it exits by itself, and fencerun's reaper (or init) collects it.
  disarm();
}

void Watchdog::guard(pid_t pgid) {
  std::int32_t message = static_cast<std::int32_t>(pgid);
  [[maybe_unused]] auto n = ::write(m_pipe.get(), &message, sizeof message);
}

void Watchdog::disarm() {
  if (!m_pipe) return;
  std::int32_t message = 0;
  [[maybe_unused]] auto n = ::write(m_pipe.get(), &message, sizeof message);
  m_pipe.reset();
}

}  // namespace fencerun::supervisor
