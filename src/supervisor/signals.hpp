#pragma once
// Signals are handled synchronously: every catchable signal is blocked in every thread and read from a
// signalfd, so none is lost between a check and a wait, none runs a handler at a random point, and none
// can end fencerun behind the stop-and-release sequence's back. The child gets the original mask and
// the original dispositions back before exec.
#include <optional>
#include <string>
#include <string_view>

#include <signal.h>

#include "util/clock.hpp"
#include "util/fd.hpp"

namespace fencerun::supervisor {

// Signal name ("TERM", "SIGTERM", "term", "RTMIN+2") or number ("15") -> number.
std::optional<int> parse_signal(std::string_view text);
// 15 -> "TERM"; real-time signals as "RTMIN+N"; the number as text for anything else.
std::string signal_name(int signo);

// What fencerun does with a signal it receives.
//   While the command runs: every signal but CHLD (reaped) and PIPE (never meant for the job: it is
//   what a write to a closed socket raises) is forwarded to the command.
//   While waiting for the lock: a signal whose default action ends a process ends the wait (exit
//   128+N, holding nothing); TSTP stops fencerun as it would stop any program; the rest are ignored.
bool is_forwarded(int signo);
bool ends_wait(int signo);
bool stops_waiter(int signo);

// Puts fencerun's own signal state in order before anything else runs: SIGCHLD back to its default
// (an inherited "ignore" would make the kernel reap the command behind fencerun's back, so its exit
// would never be seen). Returns whether SIGCHLD was ignored, to restore it for the command.
bool reset_inherited_dispositions();
// What reset_inherited_dispositions() found (false before it ran).
bool sigchld_was_ignored();

class SignalChannel {
 public:
  // Blocks every catchable signal in the calling thread; call it before any other thread starts, so
  // that all threads inherit the mask and every process-directed signal reaches the signalfd.
  SignalChannel();
  ~SignalChannel();
  SignalChannel(const SignalChannel&) = delete;
  SignalChannel& operator=(const SignalChannel&) = delete;

  int fd() const { return m_fd.get(); }
  // The mask fencerun started with: restore it in the child before exec.
  const sigset_t& original_mask() const { return m_original; }
  // Next pending signal, without blocking; nullopt when none.
  std::optional<int> read_one();
  // A pending signal that ends the wait, if any (TSTP stops fencerun on the spot; other pending
  // signals are dropped).
  std::optional<int> pending_terminating();
  // Waits until `until` for a signal that ends the wait for the lock; other signals are dropped.
  std::optional<int> wait_for_terminating(Deadline until);

  // The same, but also returns early (with nullopt, `ready` set) when `extra_fd` becomes readable.
  std::optional<int> wait_for_terminating(Deadline until, int extra_fd, bool& ready);

 private:
  UniqueFd m_fd;
  sigset_t m_original{};
};

}  // namespace fencerun::supervisor
