#pragma once
// Error: why a request did not produce a reply. A timeout is always its own kind, because a timed-out
// request may still have run on the server. `maybe_executed` tells a caller whether it must assume
// the request ran (its bytes, or some of them, reached the socket before the failure) or can be sure
// it did not (the failure came before anything of the request was written: name resolution,
// connect, TLS handshake, AUTH/SELECT, sentinel discovery, or a refusal such as NOAUTH).
#include <expected>
#include <string>

#include "lease/error.hpp"

namespace fencerun::redis {

struct Error {
  enum class Kind {
    timeout,     // the deadline passed before the reply arrived (the request may have run)
    connection,  // connect, read or write failed; the connection is closed
    auth,        // AUTH was refused, or the server demands a password
    database,    // SELECT was refused: the URL names a database the server does not have
    protocol,    // the server sent something that is not RESP, or an unexpected reply shape
    migrating,   // a multi-key request refused (TRYAGAIN, not run) while a Cluster slot migrates
    unready,     // the server answered but serves nobody now (LOADING, BUSY, MASTERDOWN, CLUSTERDOWN, or
                 // its client limit): nothing was run; the same request may succeed a little later
  };
  Kind kind;
  std::string message;
  bool maybe_executed = false;  // true: the server may have run the request (it was sent, in part or whole)
};

template <class T>
using Result = std::expected<T, Error>;

inline const char* to_string(Error::Kind kind) {
  switch (kind) {
    case Error::Kind::timeout: return "timeout";
    case Error::Kind::connection: return "connection";
    case Error::Kind::auth: return "auth";
    case Error::Kind::database: return "database";
    case Error::Kind::protocol: return "protocol";
    case Error::Kind::migrating: return "migrating";
    case Error::Kind::unready: return "unready";
  }
  return "unknown";
}

// The seam's kind of a Redis failure: connection -> unavailable, database -> refused, migrating and
// unready -> busy (nothing ran; the same request may succeed a little later).
inline lease::Error to_lease(Error e) {
  using K = lease::Error::Kind;
  K kind = K::protocol;
  switch (e.kind) {
    case Error::Kind::timeout: kind = K::timeout; break;
    case Error::Kind::connection: kind = K::unavailable; break;
    case Error::Kind::auth: kind = K::auth; break;
    case Error::Kind::database: kind = K::refused; break;
    case Error::Kind::protocol: kind = K::protocol; break;
    case Error::Kind::migrating:
    case Error::Kind::unready: kind = K::busy; break;
  }
  return {kind, std::move(e.message), e.maybe_executed};
}
template <class T>
lease::Result<T> to_lease(Result<T> r) {
  if (r) return std::move(*r);
  return std::unexpected(to_lease(std::move(r.error())));
}

}  // namespace fencerun::redis
