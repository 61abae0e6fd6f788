#pragma once
// Watchdog: a tiny forked process that kills the command's whole process group with SIGKILL if
// fencerun dies without saying goodbye (even by SIGKILL), so no job runs on without its lease. It
// learns of fencerun's death through end-of-file on a pipe. Fork it while fencerun is single-threaded.
#include <sys/types.h>

#include "util/fd.hpp"

namespace fencerun::supervisor {

class Watchdog {
 public:
  // Forks the watchdog. Throws std::system_error when it cannot.
  Watchdog();
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // From now on, guard process group `pgid`.
  void guard(pid_t pgid);
  // The group is gone: let the watchdog exit quietly.
  void disarm();

 private:
  UniqueFd m_pipe;
  pid_t m_pid = -1;
};

}  // namespace fencerun::supervisor
