#pragma once
// lease::Error: why a backend's request did not produce an answer, in words that belong to no
// backend. Every backend maps its own client's failures into these kinds at its edge
// (backends/redis/: redis::Error; backends/etcd/: HTTP and gRPC status codes), so the seam and
// everything above it decide on them alone.
//
// `maybe_executed` tells a caller whether it must assume the request ran on the server (its bytes, or
// some of them, were sent before the failure) or can be sure it did not (the failure came before
// anything was sent: name resolution, connect, TLS handshake, authentication, discovery, a refusal).
// A timeout is always its own kind, because a timed-out request may still have run.
#include <expected>
#include <string>

namespace fencerun::lease {

struct Error {
  enum class Kind {
    timeout,      // the deadline passed before the answer arrived (the request may have run)
    unavailable,  // the server could not be reached, or the connection broke
    auth,         // the credentials were refused, or the server demands some
    refused,      // the server refused the request as given (a database it does not have, a permission)
    protocol,     // the answer was not of the shape the protocol promises
    busy,         // the server answered but serves nobody now (loading, no leader, a slot migrating):
                  // nothing was run; the same request may succeed a little later
  };
  Kind kind;
  std::string message;
  bool maybe_executed = false;  // true: the server may have run the request
};

template <class T>
using Result = std::expected<T, Error>;

inline const char* to_string(Error::Kind kind) {
  switch (kind) {
    case Error::Kind::timeout: return "timeout";
    case Error::Kind::unavailable: return "unavailable";
    case Error::Kind::auth: return "auth";
    case Error::Kind::refused: return "refused";
    case Error::Kind::protocol: return "protocol";
    case Error::Kind::busy: return "busy";
  }
  return "unknown";
}

// A failure that may pass: worth another try while the caller's deadline lasts.
inline bool transient(const Error& e) {
  return e.kind == Error::Kind::timeout || e.kind == Error::Kind::unavailable || e.kind == Error::Kind::busy;
}

}  // namespace fencerun::lease
