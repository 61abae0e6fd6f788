#pragma once
// Starting the command: resolve it on PATH like execvp(3), start it in its own process group with the
// parent-death signal set and fencerun's original signal mask restored, optionally as the terminal's
// foreground group. Boost.Process stays inside spawn.cpp.
#include <sys/types.h>

#include <expected>
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
  int cgroup_procs_fd = -1;       // >= 0: the child moves itself into this cgroup before exec
  int watchdog_fd = -1;           // >= 0: the child sends `guard` (with its own pid) here before exec,
  WatchMessage guard{};           //   so the watchdog guards it before the command can run
  std::optional<Deadline> exec_before;  // the child never execs at or after this point (the stop point)
  bool ignore_sigchld = false;    // restore an inherited "ignore" of SIGCHLD for the command
};

struct SpawnError {
  int exit_code;  // 127 not found, 126 found but not executable (or exec failed otherwise)
  std::string message;
  bool too_late = false;  // exec_before had passed: the command was never started
};

// Starts the command; with own_group its pid is also its process group id.
std::expected<pid_t, SpawnError> spawn(const SpawnRequest& request);

// The PATH search of execvp(3), done in the parent so the error is known before fork.
std::expected<std::string, SpawnError> resolve_executable(const std::string& name, const std::string& path_env);

}  // namespace fencerun::supervisor
