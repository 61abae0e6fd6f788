#pragma once
// Transport: a byte stream to a Redis server (TCP, unix socket; TLS in its own implementation) whose
// every read and write is bounded by a deadline.
#include <cstddef>
#include <memory>

#include "backends/redis/url.hpp"
#include "backends/redis/error.hpp"
#include "util/clock.hpp"

namespace fencerun::redis {

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

// Opens the transport `endpoint` asks for, bounded by `deadline`.
Result<std::unique_ptr<Transport>> open_transport(const RedisEndpoint& endpoint, Deadline deadline);

}  // namespace fencerun::redis
