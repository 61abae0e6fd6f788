#include "backends/quorum/quorum_limits.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <filesystem>
#include <set>

#include "util/duration.hpp"
#include "util/error.hpp"

namespace fencerun::quorum {

using std::chrono::milliseconds;

milliseconds quorum_max_ttl(const std::optional<std::string>& value) {
  if (!value || value->empty()) return k_quorum_max_ttl_default;
  auto d = util::parse_duration(*value);
  if (!d || *d < milliseconds(100))
    throw UsageError("$FENCERUN_QUORUM_MAX_TTL: not a duration of at least 100ms: '" + *value +
                     "' (the quorum-wide lease cap, e.g. 60s; every client of the quorum must use the same)");
  return *d;
}

void check_quorum_ttl(milliseconds ttl, milliseconds max_ttl) {
  if (ttl > max_ttl)
    throw UsageError("--ttl: " + util::format_duration(ttl) + " is above quorum mode's lease cap of " +
                     util::format_duration(max_ttl) +
                     " ($FENCERUN_QUORUM_MAX_TTL, the same for every client of the quorum): give a shorter --ttl "
                     "(renewal keeps a long job's lease)");
}

namespace {

// The "address:port" of `e` when its host is an address (a unix socket: its path); empty for a host
// name (or a Sentinel, which names its master later). Names are not looked up here: a lookup has no
// deadline of its own and would come before --timeout bounds anything. Two -r that reach one server
// under a name and an address are caught by the epoch marker in the run's first round instead.
std::set<std::string> addresses(const redis::RedisEndpoint& e) {
  std::set<std::string> out;
  if (e.transport == redis::RedisEndpoint::Transport::unix_socket) {
    std::error_code ec;
    auto path = std::filesystem::weakly_canonical(e.path, ec);
    out.insert("unix:" + (ec ? e.path : path.string()));
    return out;
  }
  if (e.transport != redis::RedisEndpoint::Transport::tcp && e.transport != redis::RedisEndpoint::Transport::tls)
    return out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(e.host.c_str(), std::to_string(e.port).c_str(), &hints, &found) != 0) return out;
  for (addrinfo* a = found; a; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* where = a->ai_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                                                : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if ((a->ai_family == AF_INET || a->ai_family == AF_INET6) && inet_ntop(a->ai_family, where, text, sizeof text)) {
      std::string addr = text;
      if (addr.rfind("::ffff:", 0) == 0) addr = addr.substr(7);  // an IPv4 address written as IPv6
      // The database is left out: two databases of one server fail together, so they are one server.
      out.insert(addr + ":" + std::to_string(e.port));
    }
  }
  freeaddrinfo(found);
  return out;
}

}  // namespace

void check_quorum_addresses(const std::vector<redis::RedisEndpoint>& servers,
                            const std::vector<std::string>& redacted_urls) {
  std::vector<std::set<std::string>> resolved;
  for (const auto& s : servers) resolved.push_back(addresses(s));
  for (std::size_t i = 0; i < servers.size(); ++i)
    for (std::size_t j = i + 1; j < servers.size(); ++j)
      for (const auto& a : resolved[i])
        if (resolved[j].contains(a))
          throw UsageError("--redis: servers " + std::to_string(i + 1) + " (" + redacted_urls.at(i) + ") and " +
                           std::to_string(j + 1) + " (" + redacted_urls.at(j) + ") are the same server (both reach " + a +
                           "); quorum mode needs independent servers");
}

}  // namespace fencerun::quorum
