#pragma once
// Error: why a request did not produce a reply. A timeout is always its own kind, because a timed-out
// request may still have run on the server.
#include <expected>
#include <string>

namespace fencerun::redis {

struct Error {
  enum class Kind {
    timeout,     // the deadline passed before the reply arrived (the request may have run)
    connection,  // connect, read or write failed; the connection is closed
    auth,        // AUTH or SELECT was refused, or the server demands a password
    protocol,    // the server sent something that is not RESP, or an unexpected reply shape
  };
  Kind kind;
  std::string message;
};

template <class T>
using Result = std::expected<T, Error>;

inline const char* to_string(Error::Kind kind) {
  switch (kind) {
    case Error::Kind::timeout: return "timeout";
    case Error::Kind::connection: return "connection";
    case Error::Kind::auth: return "auth";
    case Error::Kind::protocol: return "protocol";
  }
  return "unknown";
}

}  // namespace fencerun::redis
