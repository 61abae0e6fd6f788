#pragma once
// Transport: a byte stream to a Redis server (TCP, unix socket, TLS) whose every read and write is
// bounded by a deadline: the neutral transports of net/ (net/transport.hpp), with their failures told
// as Redis errors (net's timeout -> timeout, anything else -> connection).
#include <cstddef>
#include <memory>

#include "backends/redis/error.hpp"
#include "backends/redis/url.hpp"
#include "net/transport.hpp"
#include "util/clock.hpp"

namespace fencerun::redis {

class Transport {
 public:
  explicit Transport(std::unique_ptr<net::Transport> stream) : m_stream(std::move(stream)) {}
  Result<void> write_all(const char* data, std::size_t size, Deadline deadline) {
    return mapped(m_stream->write_all(data, size, deadline));
  }
  // Reads at least one byte (or fails): end of stream is a connection error.
  Result<std::size_t> read_some(char* data, std::size_t capacity, Deadline deadline) {
    return mapped(m_stream->read_some(data, capacity, deadline));
  }
  // The socket, for callers that wait for a pushed message together with other events.
  int fd() const { return m_stream->fd(); }
  // Data already decrypted and buffered inside the transport (poll on fd() would not see it).
  bool has_buffered() const { return m_stream->has_buffered(); }

  static Error to_redis(net::Error e) {
    return Error{e.kind == net::Error::Kind::timeout ? Error::Kind::timeout : Error::Kind::connection,
                 std::move(e.message), e.maybe_executed};
  }

 private:
  template <class T>
  static Result<T> mapped(net::Result<T> r) {
    if (r) return std::move(*r);
    return std::unexpected(to_redis(std::move(r.error())));
  }
  static Result<void> mapped(net::Result<void> r) {
    if (r) return {};
    return std::unexpected(to_redis(std::move(r.error())));
  }

  std::unique_ptr<net::Transport> m_stream;
};

// Opens the transport `endpoint` asks for, bounded by `deadline`.
Result<std::unique_ptr<Transport>> open_transport(const RedisEndpoint& endpoint, Deadline deadline);

}  // namespace fencerun::redis
