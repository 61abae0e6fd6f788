#pragma once
// Client: the one funnel through which fencerun talks to Redis. It connects lazily, authenticates and
// selects the database, and bounds every connect, write and read by a caller-given deadline (never an
// infinite wait). After any failure the connection is closed and the next request reconnects.
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/url.hpp"
#include "redis/error.hpp"
#include "redis/reply.hpp"
#include "util/clock.hpp"

namespace fencerun::redis {

class Transport;

class Client {
 public:
  explicit Client(config::RedisEndpoint endpoint);
  ~Client();
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;

  // Sends one command and waits for its reply until `deadline`.
  Result<Reply> command(std::span<const std::string_view> argv, Deadline deadline);
  Result<Reply> command(std::initializer_list<std::string_view> argv, Deadline deadline) {
    return command(std::span<const std::string_view>(argv.begin(), argv.size()), deadline);
  }
  // Sends several commands in one write and reads all replies (one round trip).
  Result<std::vector<Reply>> pipeline(std::span<const std::vector<std::string_view>> commands, Deadline deadline);

  // Connects now if not connected (handshake included).
  Result<void> connect(Deadline deadline);
  bool connected() const { return static_cast<bool>(m_transport); }
  void disconnect();
  const config::RedisEndpoint& endpoint() const { return m_endpoint; }

 private:
  Result<std::vector<Reply>> exchange(const std::string& payload, std::size_t replies, Deadline deadline);

  config::RedisEndpoint m_endpoint;
  std::unique_ptr<Transport> m_transport;
  struct ReaderDeleter { void operator()(void* r) const; };
  std::unique_ptr<void, ReaderDeleter> m_reader;
};

}  // namespace fencerun::redis
