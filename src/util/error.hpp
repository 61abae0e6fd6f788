#pragma once
// fencerun's errors, from the Redis layer up to main(). Every failure that ends fencerun is a
// fencerun::Error of one kind, and the kind picks the exit code (util/exit_code.hpp); main() is the
// one place that catches and reports them. Below it, layers return values where a failure is an
// expected outcome the caller decides on (redis::Result<T> from the Redis layer, lease::NotAcquired
// from acquire(), std::expected<T, std::string> from pure validation, which config turns into a
// UsageError naming the option), and throw where nothing but ending fencerun makes sense.
//
//   kind         exit  raised for
//   usage         64   bad options, durations, NAME, URL, TLS files, tokens; a missing COMMAND
//   unavailable   69   Redis cannot be used (unreachable, refusing, timing out)
//   internal      70   a system facility fencerun relies on failed (fork, pipe, signalfd, a thread)
//   io             1   a guarded resource could not be read or written (fence)
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "util/exit_code.hpp"

namespace fencerun {

enum class ErrorKind { usage, unavailable, internal, io };

constexpr int exit_code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::usage: return exit_code::k_usage;
    case ErrorKind::unavailable: return exit_code::k_unavailable;
    case ErrorKind::internal: return exit_code::k_internal;
    case ErrorKind::io: return exit_code::k_fence_write_failed;
  }
  return exit_code::k_internal;
}

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), m_kind(kind) {}
  ErrorKind kind() const { return m_kind; }
  int exit_code() const { return exit_code_for(m_kind); }

 private:
  ErrorKind m_kind;
};

// Bad input from the user: one line naming the option. Exit 64.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(ErrorKind::usage, message) {}
};

// A system call fencerun cannot do without failed: "what: strerror(errno)". Exit 70.
class SystemError : public Error {
 public:
  explicit SystemError(const std::string& what, int err = errno)
      : Error(ErrorKind::internal, what + ": " + std::strerror(err)), m_errno(err) {}
  int error_number() const { return m_errno; }

 private:
  int m_errno;
};

}  // namespace fencerun
