#pragma once
// Starting the command: resolve it on PATH like execvp(3), start it in its own process group with the
// parent-death signal set and fencerun's original signal mask restored, optionally as the terminal's
// foreground group, and straight into the job's cgroup (clone3 with CLONE_INTO_CGROUP) where the
// kernel can.
#include <sys/types.h>

#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <signal.h>

#include "supervisor/watchdog.hpp"
#include "util/clock.hpp"

namespace fencerun::supervisor {

struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0] is passed as written; the executable is resolved from it
  std::vector<std::string> env;   // "KEY=VALUE" entries, the complete environment
  sigset_t mask{};                // signal mask for the child
  int tty_fd = -1;                // >= 0: make the child's group the foreground group of this terminal
  bool own_group = true;          // false: the child stays in fencerun's process group (tty_fd unused)
  int cgroup_fd = -1;             // >= 0: the job's cgroup directory: the child starts inside it
  std::function<int()> open_cgroup_procs;  // set with cgroup_fd: opens its cgroup.procs for writing,
                                  //   where the kernel cannot start the child inside (before Linux 5.7):
                                  //   the child moves itself in before exec
  int watchdog_fd = -1;           // >= 0: the child sends `guard` (with its own pid) here before exec,
  WatchMessage guard{};           //   so the watchdog guards it before the command can run
  std::optional<Deadline> exec_before;  // the child never execs at or after this point (the stop point)
  bool ignore_sigchld = false;    // restore an inherited "ignore" of SIGCHLD for the command
};

struct SpawnError {
  // 127 not found (or its #! interpreter not found), 126 found but not executable (or exec failed
  // otherwise), 70 fencerun could not start it (out of processes, memory or descriptors)
  int exit_code;
  std::string message;
  bool too_late = false;  // exec_before had passed: the command was never started
};

struct SpawnInfo {
  bool in_cgroup = false;  // started inside request.cgroup_fd by the kernel itself
};

// Starts the command; with own_group its pid is also its process group id. A file that is executable
// but neither a binary nor a "#!" script is run with /bin/sh, as execvp(3) does.
std::expected<pid_t, SpawnError> spawn(const SpawnRequest& request, SpawnInfo* info = nullptr);

// The PATH search of execvp(3), done in the parent so the error is known before fork.
std::expected<std::string, SpawnError> resolve_executable(const std::string& name, const std::string& path_env);

}  // namespace fencerun::supervisor
