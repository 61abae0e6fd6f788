#pragma once
// What every backend's URLs share: a host and port, the TLS settings of a connection, and the
// pieces of parsing (percent-escapes, host[:port]).
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>

namespace fencerun::util {

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

// The pieces of URL parsing every backend's URLs share. percent_decode: nullopt on a bad
// escape. percent_encode_user: all but unreserved characters escaped. parse_host_port: host[:port] or
// [v6]:port; `port` keeps its value when the text has none.
std::optional<std::string> percent_decode(std::string_view in);
std::string percent_encode_user(std::string_view in);
std::expected<void, std::string> parse_host_port(std::string_view authority, std::string& host, std::uint16_t& port);

// Throws UsageError naming the option and the path when --tls-ca-file, --tls-cert or --tls-key names
// something that cannot be opened for reading (missing, unreadable, a directory): a typo found before
// connecting rather than reported as an unavailable server. Empty paths are not checked.
void check_tls_files(const TlsSettings& tls);

}  // namespace fencerun::util
