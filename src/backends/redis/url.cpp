#include "backends/redis/url.hpp"

#include <charconv>

namespace fencerun::redis {

using util::parse_host_port;
using util::percent_decode;
using util::percent_encode_user;

namespace {

std::expected<int, std::string> parse_db(std::string_view text) {
  int db = -1;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), db);
  if (text.empty() || ec != std::errc{} || ptr != text.data() + text.size() || db < 0)
    return std::unexpected("the database is not a non-negative integer");
  return db;
}

// Query of the form "db=N" (other parameters are rejected so typos do not pass silently).
std::expected<void, std::string> apply_query(std::string_view query, RedisEndpoint& ep) {
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    auto eq = param.find('=');
    std::string_view key = param.substr(0, eq);
    std::string_view value = eq == std::string_view::npos ? std::string_view{} : param.substr(eq + 1);
    if (key == "db") {
      auto db = parse_db(value);
      if (!db) return std::unexpected(db.error());
      ep.db = *db;
    } else if (key == "sentinel_user" && ep.transport == RedisEndpoint::Transport::sentinel) {
      auto user = percent_decode(value);
      if (!user) return std::unexpected("bad percent-encoding in sentinel_user");
      ep.sentinel_user = *user;
    } else {
      return std::unexpected(ep.transport == RedisEndpoint::Transport::sentinel
                                 ? "unknown URL parameter (only db and sentinel_user are known)"
                                 : "unknown URL parameter (only db is known)");
    }
  }
  return {};
}

}  // namespace

std::expected<RedisEndpoint, std::string> parse_redis_url(std::string_view url) {
  RedisEndpoint ep;
  auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos)
    return std::unexpected("not a Redis URL (expected redis://, rediss://, unix:// or redis+sentinel://)");
  std::string_view scheme = url.substr(0, scheme_end);
  std::string_view rest = url.substr(scheme_end + 3);

  if (scheme == "unix") {
    ep.transport = RedisEndpoint::Transport::unix_socket;
    auto q = rest.find('?');
    std::string_view path = rest.substr(0, q);
    if (path.empty() || path.front() != '/')
      return std::unexpected("unix:// URL needs an absolute socket path (unix:///path/to/redis.sock)");
    auto decoded = percent_decode(path);
    if (!decoded) return std::unexpected("bad percent-encoding in socket path");
    ep.path = *decoded;
    if (q != std::string_view::npos) {
      auto ok = apply_query(rest.substr(q + 1), ep);
      if (!ok) return std::unexpected(ok.error());
    }
    return ep;
  }
  if (scheme == "redis") ep.transport = RedisEndpoint::Transport::tcp;
  else if (scheme == "rediss") ep.transport = RedisEndpoint::Transport::tls;
  else if (scheme == "redis+sentinel" || scheme == "rediss+sentinel") {
    ep.transport = RedisEndpoint::Transport::sentinel;
    ep.sentinel_tls = scheme == "rediss+sentinel";
  } else {
    return std::unexpected("unsupported URL scheme '" + std::string(scheme) +
                           "' (expected redis://, rediss://, unix:// or redis+sentinel://)");
  }

  // authority [/db] [?query]
  auto q = rest.find('?');
  std::string_view query = q == std::string_view::npos ? std::string_view{} : rest.substr(q + 1);
  rest = rest.substr(0, q);
  auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view db_part = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);

  auto at = authority.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    auto colon = userinfo.find(':');
    auto user = percent_decode(userinfo.substr(0, colon));
    if (!user) return std::unexpected("bad percent-encoding in user name");
    ep.user = *user;
    if (colon != std::string_view::npos) {
      auto password = percent_decode(userinfo.substr(colon + 1));
      if (!password) return std::unexpected("bad percent-encoding in password");
      if (!password->empty()) ep.password = *password;
    }
  }

  if (ep.transport == RedisEndpoint::Transport::sentinel) {
    // host:port[,host:port...]/MASTER[?db=N]
    while (true) {
      auto comma = authority.find(',');
      HostPort hp{"", 26379};
      auto ok = parse_host_port(authority.substr(0, comma), hp.host, hp.port);
      if (!ok) return std::unexpected(ok.error());
      ep.sentinels.push_back(std::move(hp));
      if (comma == std::string_view::npos) break;
      authority.remove_prefix(comma + 1);
    }
    auto name = percent_decode(db_part);
    if (!name || name->empty() || name->find('/') != std::string::npos)
      return std::unexpected("redis+sentinel:// URL needs the master name as its path (.../MASTER)");
    ep.master_name = *name;
    ep.host.clear();
    ep.port = 0;
    if (!query.empty()) {
      auto ok = apply_query(query, ep);
      if (!ok) return std::unexpected(ok.error());
    }
    return ep;
  }

  if (auto ok = parse_host_port(authority, ep.host, ep.port); !ok) return std::unexpected(ok.error());
  if (!db_part.empty()) {
    auto db = parse_db(db_part);
    if (!db) return std::unexpected(db.error());
    ep.db = *db;
  }
  if (!query.empty()) {
    auto ok = apply_query(query, ep);
    if (!ok) return std::unexpected(ok.error());
  }
  return ep;
}

std::string redacted_url(const RedisEndpoint& ep) {
  std::string out;
  if (ep.transport == RedisEndpoint::Transport::unix_socket) {
    out = "unix://" + ep.path;
    if (ep.db != 0) out += "?db=" + std::to_string(ep.db);
    return out;
  }
  auto host_port = [](const std::string& host, std::uint16_t port) {
    bool ipv6 = host.find(':') != std::string::npos;
    return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  };
  if (ep.transport == RedisEndpoint::Transport::sentinel) {
    out = ep.sentinel_tls ? "rediss+sentinel://" : "redis+sentinel://";
    if (!ep.user.empty()) out += percent_encode_user(ep.user) + "@";
    for (std::size_t i = 0; i < ep.sentinels.size(); ++i)
      out += (i ? "," : "") + host_port(ep.sentinels[i].host, ep.sentinels[i].port);
    out += "/" + percent_encode_user(ep.master_name);
    std::string query;
    if (ep.db != 0) query += "db=" + std::to_string(ep.db);
    if (!ep.sentinel_user.empty()) query += (query.empty() ? "" : "&") + ("sentinel_user=" + percent_encode_user(ep.sentinel_user));
    if (!query.empty()) out += "?" + query;
    return out;
  }
  out = ep.transport == RedisEndpoint::Transport::tls ? "rediss://" : "redis://";
  if (!ep.user.empty()) out += percent_encode_user(ep.user) + "@";
  out += host_port(ep.host, ep.port);
  if (ep.db != 0) out += "/" + std::to_string(ep.db);
  return out;
}

}  // namespace fencerun::redis
