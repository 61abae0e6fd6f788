#pragma once
// Supervisor: runs the command in its own process group and watches it until the whole group is gone.
// It forwards signals to the group, and enforces the stop sequence against a lease deadline it is given:
//   kill signal at deadline - grace - margin (or at once when the lease is reported lost),
//   SIGKILL at deadline - margin (or grace after the kill signal, whichever comes first).
// Processes left in the group after the command exits get the same sequence, so nothing outlives the
// lease. Knows nothing of Redis.
#include <sys/types.h>

#include <chrono>
#include <expected>
#include <functional>
#include <optional>

#include "log/log.hpp"
#include "supervisor/signals.hpp"
#include "supervisor/spawn.hpp"
#include "util/clock.hpp"

namespace fencerun::supervisor {

struct LeaseWatch {
  std::function<Deadline()> deadline;  // current lease deadline (renewals move it later)
  std::function<bool()> lost;          // true: stop at once
  int wake_fd = -1;                    // readable when lost() may have changed
};

struct StopPolicy {
  int kill_signal = SIGTERM;
  std::chrono::milliseconds grace{};
  std::chrono::milliseconds margin{};
};

struct Outcome {
  int wait_status = 0;          // of the command itself
  bool stopped_for_lease = false;
  bool killed = false;          // SIGKILL was needed
  std::optional<Deadline> command_died_at;  // when the group was seen gone
};

class Supervisor {
 public:
  Supervisor(SignalChannel& signals, StopPolicy policy, log::Context context);
  ~Supervisor();

  // Starts the command (see spawn()). Call once.
  std::expected<pid_t, SpawnError> start(std::vector<std::string> argv, std::vector<std::string> env);
  // Runs until the command has exited and no process is left in its group.
  Outcome supervise(const LeaseWatch& lease);

 private:
  void reap();
  bool group_alive() const;
  void signal_group(int signo);

  SignalChannel& m_signals;
  StopPolicy m_policy;
  log::Context m_context;
  pid_t m_pid = -1;
  int m_tty = -1;
  bool m_exited = false;
  int m_status = 0;
};

}  // namespace fencerun::supervisor
