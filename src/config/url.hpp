#pragma once
// Redis URLs: redis://[[user]:password@]host[:port][/db], rediss://... (TLS), unix:///path[?db=N].
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>

namespace fencerun::config {

struct RedisEndpoint {
  enum class Transport { tcp, tls, unix_socket };
  Transport transport = Transport::tcp;
  std::string host = "127.0.0.1";  // tcp and tls
  std::uint16_t port = 6379;       // tcp and tls
  std::string path;                // unix_socket
  int db = 0;
  std::string user;                         // empty: the default user
  std::optional<std::string> password;      // from the URL or the environment; never logged
};

// Parses a URL. Errors name what is wrong and never contain the password.
std::expected<RedisEndpoint, std::string> parse_redis_url(std::string_view url);

// The URL of `endpoint` in canonical form with any password removed (the user name is kept).
std::string redacted_url(const RedisEndpoint& endpoint);

}  // namespace fencerun::config
