#pragma once
// Redis URLs: redis://[[user]:password@]host[:port][/db], rediss://... (TLS), unix:///path[?db=N],
// redis+sentinel://[[user]:password@]host:port[,host:port...]/MASTER[?db=N] (rediss+sentinel:// for TLS).
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fencerun::redis {

struct HostPort {
  std::string host;
  std::uint16_t port = 0;
  bool operator==(const HostPort&) const = default;
};

struct TlsSettings {
  std::string ca_file;      // empty: the system's trust store
  std::string cert_file;    // client certificate (mutual TLS)
  std::string key_file;     // its key (default: cert_file)
  std::string server_name;  // name to verify and send as SNI (default: the host)
  bool insecure = false;    // skip certificate and name verification
};

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

// The pieces of URL parsing that the etcd URLs (etcd/url.hpp) share. percent_decode: nullopt on a bad
// escape. percent_encode_user: all but unreserved characters escaped. parse_host_port: host[:port] or
// [v6]:port; `port` keeps its value when the text has none.
std::optional<std::string> percent_decode(std::string_view in);
std::string percent_encode_user(std::string_view in);
std::expected<void, std::string> parse_host_port(std::string_view authority, std::string& host, std::uint16_t& port);

// Parses a URL. Errors name what is wrong and quote nothing from the URL but its scheme, so a password
// with unencoded delimiters cannot leak into a message.
std::expected<RedisEndpoint, std::string> parse_redis_url(std::string_view url);

// The URL of `endpoint` in canonical form with any password removed (the user name is kept).
std::string redacted_url(const RedisEndpoint& endpoint);

}  // namespace fencerun::redis
