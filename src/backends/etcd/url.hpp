#pragma once
// etcd URLs: etcd://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]...] and etcds://... (TLS). The hosts
// are members (or gRPC-gateway proxies) of ONE cluster, tried in turn when one does not answer; the
// port defaults to 2379. Pure: no connection, no client library.
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/url.hpp"

namespace fencerun::etcd {

inline constexpr std::uint16_t k_default_port = 2379;

struct EtcdEndpoint {
  bool tls = false;
  std::vector<util::HostPort> members;  // at least one, in the order given, no duplicates
  std::string user;                      // empty: no authentication
  std::optional<std::string> password;   // from the URL or $FENCERUN_ETCD_PASSWORD; never logged
  util::TlsSettings tls_settings;       // for etcds://
};

// True for the etcd schemes (etcd://, etcds://), whatever follows.
bool is_etcd_url(std::string_view url);

// Parses a URL. Errors name what is wrong and quote nothing from the URL but its scheme, so that a
// password cannot leak into a message.
std::expected<EtcdEndpoint, std::string> parse_etcd_url(std::string_view url);

// The URL in canonical form without the password (the user name is kept).
std::string redacted_url(const EtcdEndpoint& endpoint);

// "http://HOST:PORT" or "https://HOST:PORT" (IPv6 hosts in brackets): a member's base address.
std::string member_base(const EtcdEndpoint& endpoint, std::size_t member);

}  // namespace fencerun::etcd
