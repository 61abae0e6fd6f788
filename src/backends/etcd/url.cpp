#include "backends/etcd/url.hpp"

#include <algorithm>

namespace fencerun::etcd {
namespace {

std::string host_port(const util::HostPort& hp) {
  const bool ipv6 = hp.host.find(':') != std::string::npos;
  return (ipv6 ? "[" + hp.host + "]" : hp.host) + ":" + std::to_string(hp.port);
}

std::string lowered(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

bool is_etcd_url(std::string_view url) { return url.starts_with("etcd://") || url.starts_with("etcds://"); }

std::expected<EtcdEndpoint, std::string> parse_etcd_url(std::string_view url) {
  EtcdEndpoint ep;
  std::string_view rest;
  if (url.starts_with("etcd://")) rest = url.substr(7);
  else if (url.starts_with("etcds://")) rest = url.substr(8), ep.tls = true;
  else return std::unexpected("not an etcd URL (expected etcd:// or etcds://)");
  const std::string_view scheme = ep.tls ? "etcds://" : "etcd://";

  // The user information ends at the last '@' (a password may hold '@' only percent-encoded, but a
  // stray one must not let password text be read as a host).
  const auto at = rest.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const auto colon = userinfo.find(':');
    auto user = util::percent_decode(userinfo.substr(0, colon));
    if (!user) return std::unexpected("bad percent-encoding in user name");
    if (user->empty()) return std::unexpected(std::string(scheme) + " URL has a password but no user name");
    ep.user = *user;
    if (colon != std::string_view::npos) {
      auto password = util::percent_decode(userinfo.substr(colon + 1));
      if (!password) return std::unexpected("bad percent-encoding in password");
      if (!password->empty()) ep.password = *password;
    }
  }
  // Nothing after the members: no path, no query (a typo must not pass silently).
  if (rest.find_first_of("/?#") != std::string_view::npos)
    return std::unexpected(std::string(scheme) + " URL takes no path or query: " + std::string(scheme) +
                           "HOST:PORT[,HOST:PORT...]");
  if (rest.empty()) return std::unexpected(std::string(scheme) + " URL has no host");
  for (;;) {
    const auto comma = rest.find(',');
    util::HostPort hp{"", k_default_port};
    if (auto ok = util::parse_host_port(rest.substr(0, comma), hp.host, hp.port); !ok)
      return std::unexpected(ok.error());
    if (hp.host.find_first_of(" \t@") != std::string::npos) return std::unexpected("bad character in host");
    const std::string id = lowered(host_port(hp));
    if (std::ranges::any_of(ep.members, [&](const util::HostPort& m) { return lowered(host_port(m)) == id; }))
      return std::unexpected("member " + id + " is given twice");
    ep.members.push_back(std::move(hp));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return ep;
}

std::string redacted_url(const EtcdEndpoint& ep) {
  std::string out = ep.tls ? "etcds://" : "etcd://";
  if (!ep.user.empty()) out += util::percent_encode_user(ep.user) + "@";
  for (std::size_t i = 0; i < ep.members.size(); ++i) out += (i ? "," : "") + host_port(ep.members[i]);
  return out;
}

std::string member_base(const EtcdEndpoint& ep, std::size_t member) {
  return (ep.tls ? "https://" : "http://") + host_port(ep.members.at(member));
}

}  // namespace fencerun::etcd
