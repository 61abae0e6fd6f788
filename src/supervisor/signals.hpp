#pragma once
// Signals are handled synchronously: the signals fencerun cares about are blocked in every thread and
// read from a signalfd, so none is lost between a check and a wait, and no handler runs at a random
// point. The child gets the original mask back before exec.
#include <optional>
#include <string>
#include <string_view>

#include <signal.h>

#include "util/clock.hpp"
#include "util/fd.hpp"

namespace fencerun::supervisor {

// Signal name ("TERM", "SIGTERM", "term") or number ("15") -> number.
std::optional<int> parse_signal(std::string_view text);
// 15 -> "TERM" (or the number as text for unnamed signals).
std::string signal_name(int signo);

// Signals forwarded to the command's process group while it runs.
bool is_forwarded(int signo);
// Signals that end the wait for the lock (exit 128+N).
bool ends_wait(int signo);

class SignalChannel {
 public:
  // Blocks HUP INT QUIT TERM USR1 USR2 WINCH CONT CHLD (and PIPE, TTOU, TTIN, which fencerun never
  // wants delivered) in the calling thread; call it before any other thread starts, so all inherit it.
  SignalChannel();
  ~SignalChannel();
  SignalChannel(const SignalChannel&) = delete;
  SignalChannel& operator=(const SignalChannel&) = delete;

  int fd() const { return m_fd.get(); }
  // The mask fencerun started with: restore it in the child before exec.
  const sigset_t& original_mask() const { return m_original; }
  // Next pending signal, without blocking; nullopt when none.
  std::optional<int> read_one();
  // A pending signal that ends the wait, if any (other pending signals are dropped).
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
