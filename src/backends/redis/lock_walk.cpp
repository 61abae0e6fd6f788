#include "backends/redis/lock_walk.hpp"

#include <unistd.h>

#include <cstdio>
#include <string_view>

namespace fencerun::lease {
namespace {

using std::chrono::milliseconds;

// Glob characters in the key prefix must match literally in a MATCH pattern.
std::string glob_escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\') out += '\\';
    out += ch;
  }
  return out;
}

// The masters of a Cluster (from CLUSTER NODES), or nothing when the server is not one.
redis::Result<std::vector<redis::HostPort>> cluster_masters(redis::Client& client, Deadline deadline) {
  auto reply = client.command({"CLUSTER", "NODES"}, deadline);
  if (!reply) return std::unexpected(reply.error());
  if (reply->is_error()) {
    if (reply->str.find("cluster support disabled") != std::string::npos || reply->str.find("unknown command") != std::string::npos)
      return std::vector<redis::HostPort>{};
    return std::unexpected(redis::Error{redis::Error::Kind::protocol, "CLUSTER NODES failed: " + reply->str});
  }
  std::vector<redis::HostPort> masters;
  std::size_t pos = 0;
  const std::string& text = reply->str;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::vector<std::string_view> f;
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    for (std::size_t b = 0; b < line.size();) {
      std::size_t sp = line.find(' ', b);
      if (sp == std::string_view::npos) sp = line.size();
      f.push_back(line.substr(b, sp - b));
      b = sp + 1;
    }
    if (f.size() < 8) continue;
    const std::string_view flags = f[2];
    if (flags.find("master") == std::string_view::npos || flags.find("fail") != std::string_view::npos ||
        flags.find("noaddr") != std::string_view::npos)
      continue;
    // ip:port@cport[,hostname]
    std::string_view addr = f[1].substr(0, f[1].find('@'));
    const std::size_t colon = addr.rfind(':');
    if (colon == std::string_view::npos) continue;
    redis::HostPort hp{std::string(addr.substr(0, colon)), 0};
    unsigned port = 0;
    for (char ch : addr.substr(colon + 1)) port = port * 10 + static_cast<unsigned>(ch - '0');
    hp.port = static_cast<std::uint16_t>(port);
    if (hp.host.empty() || hp.port == 0) continue;
    masters.push_back(std::move(hp));
  }
  return masters;
}

// The names of NAME's keys that `key` (<prefix>{NAME}:...) belongs to; empty when it is no such key.
std::string name_of(std::string_view key, std::string_view prefix) {
  if (!key.starts_with(prefix)) return {};
  key.remove_prefix(prefix.size());
  if (!key.starts_with('{')) return {};
  const std::size_t close = key.find('}');
  if (close == std::string_view::npos || close < 2 || key.substr(close + 1, 1) != ":") return {};
  return std::string(key.substr(1, close - 1));
}

}  // namespace

// Walks one server with SCAN, on every master when it is a Cluster, and reads each lock found.
std::expected<Listing, ListFailure> walk(const redis::RedisEndpoint& endpoint, const std::string& key_prefix,
                                         const std::string& pattern, milliseconds timeout,
                                         const ProgressReport& report) {
  redis::Client seed(endpoint);
  const Deadline first = BootClock::now() + timeout;
  auto masters = cluster_masters(seed, first);
  if (!masters) return std::unexpected(ListFailure{masters.error(), {}});
  // One client per master of a Cluster; the server itself otherwise.
  std::vector<redis::Client> nodes;
  if (masters->empty()) {
    nodes.push_back(std::move(seed));
  } else {
    for (const auto& m : *masters) {
      redis::RedisEndpoint e = endpoint;
      e.host = m.host;
      e.port = m.port;
      nodes.emplace_back(std::move(e));
    }
  }
  const std::string match = glob_escape(key_prefix) + "{" + pattern + "}:*";
  std::size_t scanned = 0;
  // name -> the node its keys live on (every key of a name shares one hash slot)
  std::map<std::string, std::size_t> names;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    std::string cursor = "0";
    do {
      auto reply = nodes[n].command({"SCAN", cursor, "MATCH", match, "COUNT", "1000"}, BootClock::now() + timeout,
                                    redis::Resend::idempotent);
      if (!reply) return std::unexpected(ListFailure{reply.error(), {}});
      if (reply->is_error() || !reply->is_array() || reply->elements.size() != 2 || !reply->elements[0].is_string())
        return std::unexpected(ListFailure{
            redis::Error{redis::Error::Kind::protocol,
                         "SCAN failed: " + (reply->is_error() ? reply->str : std::string("bad reply"))},
            {}});
      cursor = reply->elements[0].str;
      for (const auto& k : reply->elements[1].elements) {
        ++scanned;
        if (std::string name = name_of(k.str, key_prefix); !name.empty()) names.emplace(std::move(name), n);
      }
      report(scanned, names.size());
    } while (cursor != "0");
  }
  Listing found;
  for (const auto& [name, n] : names) {
    auto s = lock_status(nodes[n], keys_for(key_prefix, name), BootClock::now() + timeout);
    if (!s) return std::unexpected(ListFailure{s.error(), name});
    found.emplace(name, std::move(*s));
    if (found.size() % 256 == 0) report(scanned, names.size());
  }
  return found;
}


}  // namespace fencerun::lease
