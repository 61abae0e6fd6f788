#pragma once
// Transport: a byte stream to a server (TCP, unix socket; TLS in its own implementation) whose every
// read and write is bounded by a deadline. The backends' clients speak their protocols over it (RESP
// for Redis, HTTP/1.1 for etcd); it knows no protocol and no backend.
//
// OpenSSL is loaded with dlopen(3) at the first TLS connection (tls_transport.cpp): a run that makes
// none never maps it.
#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <string>

#include "util/clock.hpp"
#include "util/fd.hpp"
#include "util/url.hpp"

namespace fencerun::net {

// Why a connection, a read or a write failed. The connection is unusable after any failure.
struct Error {
  enum class Kind {
    timeout,     // the deadline passed first
    connection,  // resolve, connect, handshake, read or write failed, or the peer closed
  };
  Kind kind;
  std::string message;
  bool maybe_executed = false;  // a write failed after some of its bytes reached the socket
  bool closed = false;          // a read met the peer's orderly close (end of stream) or a reset
};

template <class T>
using Result = std::expected<T, Error>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual Result<void> write_all(const char* data, std::size_t size, Deadline deadline) = 0;
  // Reads at least one byte (or fails): end of stream is a connection error.
  virtual Result<std::size_t> read_some(char* data, std::size_t capacity, Deadline deadline) = 0;
  // The socket, for callers that wait for a pushed message together with other events.
  virtual int fd() const = 0;
  // Data already decrypted and buffered inside the transport (poll on fd() would not see it).
  virtual bool has_buffered() const { return false; }
};

// Where to connect: a host and port, or a unix socket's path.
struct Address {
  std::string host;
  std::uint16_t port = 0;
  std::string unix_path;  // non-empty: this unix socket instead of host:port
};

// What a TLS connection needs besides the socket.
struct TlsOptions {
  util::TlsSettings settings;  // CA, client certificate and key, server name, insecure
  std::string plain_scheme;    // the URL scheme to suggest when the server does not speak TLS ("redis://")
  std::string alpn;            // the protocol offered with ALPN ("http/1.1"); empty: no ALPN
};

// Connects a non-blocking socket to `address` (numeric addresses skip the resolver; a name is resolved
// on a thread of its own, given up at the deadline).
Result<UniqueFd> connect_socket(const Address& address, Deadline deadline);
// A transport over a connected socket, without TLS.
std::unique_ptr<Transport> plain_transport(UniqueFd fd);
// The TLS handshake over a connected socket, verifying `host` (or tls.settings.server_name).
Result<std::unique_ptr<Transport>> open_tls_transport(UniqueFd fd, const std::string& host, const TlsOptions& tls,
                                                      Deadline deadline);
// connect_socket, then TLS when `tls` is given.
Result<std::unique_ptr<Transport>> open_transport(const Address& address, const TlsOptions* tls, Deadline deadline);

// Waits until `fd` is ready for `events` (poll(2) flags) or the deadline passes.
Result<void> wait_for(int fd, short events, Deadline deadline, const char* what);

}  // namespace fencerun::net
