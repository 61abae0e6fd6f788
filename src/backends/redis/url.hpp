#pragma once
// Redis URLs: redis://[[user]:password@]host[:port][/db], rediss://... (TLS), unix:///path[?db=N],
// redis+sentinel://[[user]:password@]host:port[,host:port...]/MASTER[?db=N] (rediss+sentinel:// for TLS).
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/url.hpp"

namespace fencerun::redis {

using util::HostPort;
using util::TlsSettings;

struct RedisEndpoint {
  enum class Transport { tcp, tls, unix_socket, sentinel };
  Transport transport = Transport::tcp;
  std::string host = "127.0.0.1";  // tcp and tls
  std::uint16_t port = 6379;       // tcp and tls
  std::string path;                // unix_socket
  int db = 0;
  std::string user;                         // empty: the default user
  std::optional<std::string> password;      // from the URL or the environment; never logged
  TlsSettings tls;                          // for tls, and for sentinel with sentinel_tls

  // sentinel: where to ask for the master, and how to reach the sentinels themselves.
  std::vector<HostPort> sentinels;
  std::string master_name;
  bool sentinel_tls = false;                   // rediss+sentinel://: sentinels and master over TLS
  std::string sentinel_user;                   // ?sentinel_user=NAME
  std::optional<std::string> sentinel_password;  // $FENCERUN_SENTINEL_PASSWORD; never logged
};

// Parses a URL. Errors name what is wrong and quote nothing from the URL but its scheme, so a password
// with unencoded delimiters cannot leak into a message.
std::expected<RedisEndpoint, std::string> parse_redis_url(std::string_view url);

// The URL of `endpoint` in canonical form with any password removed (the user name is kept).
std::string redacted_url(const RedisEndpoint& endpoint);

}  // namespace fencerun::redis
