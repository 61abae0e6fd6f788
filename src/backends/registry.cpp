// The one table of backends (lease/backend.hpp): which URL schemes and how many URLs pick each, what
// it adds to --version's feature line, what it can do, and its URL parser. Adding a backend is one row
// here and a folder next to this file (docs/backends.md).
#include <algorithm>
#include <array>
#include <string>

#include "backends/etcd/target.hpp"
#include "backends/quorum/target.hpp"
#include "backends/redis/client.hpp"
#include "backends/redis/target.hpp"
#include "lease/backend.hpp"
#include "util/error.hpp"

namespace fencerun::lease {
namespace {

using C = Capability;

constexpr std::array<std::string_view, 5> k_redis_schemes = {"redis", "rediss", "unix", "redis+sentinel",
                                                            "rediss+sentinel"};
constexpr std::array<std::string_view, 2> k_etcd_schemes = {"etcd", "etcds"};

// Why --lock-delay means nothing there: a Redis server deletes a lock key only when its TTL ran out on
// the server's clock, after the holder's own deadline; nothing but `break` deletes one early.
constexpr std::string_view k_no_early_expiry =
    "a Redis key is deleted only when its TTL ran out on the server, after the holder's own deadline";
constexpr std::array<Unsupported, 1> k_redis_lacks = {{{C::lock_delay, k_no_early_expiry}}};
constexpr std::array<Unsupported, 8> k_quorum_lacks = {{
    {C::lock_delay, k_no_early_expiry},
    {C::if_record_lost, "not yet"},
    {C::limit, ""},
    {C::fair, ""},
    {C::min_replicas, "a majority of independent servers takes the place of replica acknowledgement"},
    {C::break_lock, "give one server's URL to break a lock there"},
    {C::bump, "give one server's URL to bump its counter"},
    {C::acl, "give one server's URL (every server takes the same rule)"},
}};
constexpr std::array<Unsupported, 5> k_etcd_lacks = {{
    {C::limit, ""},
    {C::min_replicas,
     "not needed: a write is acknowledged only once a majority of the cluster's members has it in its Raft log"},
    {C::bump,
     "not needed: a token is the lock's base plus its key's create_revision, which etcd's Raft log never lowers "
     "(a lock moved from Redis keeps its guards working through the base; see ETCD in fencerun(1))"},
    {C::acl, "it prints Redis ACL rules; on etcd, grant the user readwrite on the key prefix (see ETCD in fencerun(1))"},
    {C::shared_connection, ""},
}};

constexpr Capabilities k_all = C::limit | C::fair | C::min_replicas | C::min_interval | C::break_lock | C::bump |
                               C::acl | C::shared_connection | C::lock_delay | C::every |
                               C::if_record_lost;

constexpr Capabilities without(Capabilities all, std::span<const Unsupported> lacks) {
  for (const auto& u : lacks) all.bits &= ~static_cast<std::uint32_t>(u.capability);
  return all;
}

// The table. A quorum and one Redis take the same schemes: the number of URLs picks between them.
const std::array<BackendInfo, 3> k_backends = {{
    {"redis", "one Redis server, a Sentinel-managed master or a Cluster", k_redis_schemes, 1, 1, "",
     "tcp unix tls sentinel cluster", without(k_all, k_redis_lacks), k_redis_lacks, &redis::configure},
    {"quorum", "3, 5 or 7 independent Redis servers", k_redis_schemes, 2, quorum::k_max_servers,
     "{n} servers given; quorum mode takes 3, 5 or 7 (an odd number of independent servers)", "quorum",
     without(k_all, k_quorum_lacks), k_quorum_lacks, &quorum::configure},
    {"etcd", "an etcd cluster", k_etcd_schemes, 1, 1,
     "an etcd URL names one cluster; give its members in one URL, separated by commas "
     "(etcd://HOST:PORT,HOST:PORT,...)",
     "etcd", without(k_all, k_etcd_lacks), k_etcd_lacks, &etcd::configure},
}};

// "redis://, rediss://, ..., etcds://": every scheme of the table, once each.
std::string every_scheme() {
  std::string out;
  std::vector<std::string_view> seen;
  for (const auto& b : k_backends)
    for (auto s : b.schemes) {
      if (std::ranges::find(seen, s) != seen.end()) continue;
      seen.push_back(s);
      out += (out.empty() ? "" : ", ") + std::string(s) + "://";
    }
  return out;
}

// Levenshtein distance, for "did you mean".
std::size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The scheme of `url` (before "://", lower-case); nullopt when it has no "://".
std::optional<std::string> scheme_of(std::string_view url) {
  const auto sep = url.find("://");
  if (sep == std::string_view::npos || sep == 0) return std::nullopt;
  std::string s(url.substr(0, sep));
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// What an unknown or malformed scheme is told: every scheme, and the nearest one when it is close. Quotes
// nothing of the URL past its scheme (a password must not reach a message).
[[noreturn]] void unknown_scheme(std::string_view source, std::string_view url) {
  // The word before the first ':' or '/', as the user typed it: "etc" of "etc://", "etcd" of "etcd:/h".
  std::string word(url.substr(0, std::min(url.find(':'), url.find('/'))));
  if (word.size() > 32) word.clear();
  for (char& ch : word) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string_view nearest;
  std::size_t best = 3;
  for (const auto& b : k_backends)
    for (auto s : b.schemes)
      if (auto d = distance(word, s); d < best || (d == best && nearest.empty() && d < 3)) best = d, nearest = s;
  const bool has_scheme = scheme_of(url).has_value();
  std::string message = std::string(source) + ": " +
                        (has_scheme ? "unknown URL scheme '" + word + "://'" : std::string("not a URL (no SCHEME://)")) +
                        "; fencerun takes " + every_scheme();
  if (!nearest.empty() && (word != nearest || !has_scheme)) message += " (did you mean " + std::string(nearest) + "://?)";
  throw UsageError(message);
}

}  // namespace

std::span<const BackendInfo> backends() { return k_backends; }

const BackendInfo& info_of(const Target& target) {
  for (const auto& b : k_backends)
    if (b.name == target.backend()) return b;
  throw fencerun::Error(ErrorKind::internal, "no backend named " + std::string(target.backend()));
}

std::shared_ptr<const Target> configure_target(const ConnectRequest& request) {
  const auto& urls = request.urls;
  auto takes = [](const BackendInfo& b, const std::string& url) {
    auto s = scheme_of(url);
    return s && std::ranges::find(b.schemes, *s) != b.schemes.end();
  };
  for (const auto& url : urls)
    if (std::ranges::none_of(k_backends, [&](const BackendInfo& b) { return takes(b, url); }))
      unknown_scheme(request.source, url);
  const BackendInfo* last = nullptr;  // the last row that takes the scheme: it says what count it wants
  for (const auto& b : k_backends) {
    if (!takes(b, urls.front())) continue;
    if (!std::ranges::all_of(urls, [&](const std::string& u) { return takes(b, u); }))
      throw UsageError(std::string(request.source) + ": the URLs mix backends; give one backend's URLs (" +
                       std::string(b.name) + ": " + std::string(b.summary) + ")");
    if (urls.size() >= b.min_urls && urls.size() <= b.max_urls) return b.configure(request);
    last = &b;
  }
  if (!last) throw fencerun::Error(ErrorKind::internal, "no backend takes the URLs' scheme");
  std::string message(last->wrong_count);
  if (auto at = message.find("{n}"); at != std::string::npos) message.replace(at, 3, std::to_string(urls.size()));
  throw UsageError(std::string(request.source) + ": " + message);
}

std::string features_line() {
  std::string out;
  for (const auto& b : k_backends) out += (out.empty() ? "" : " ") + std::string(b.features);
  return out;
}

std::string library_versions() { return "hiredis " + redis::hiredis_version() + "\n"; }

std::string_view capability_name(Capability c) {
  switch (c) {
    case C::limit: return "--limit";
    case C::fair: return "--fair";
    case C::min_replicas: return "--min-replicas";
    case C::min_interval: return "--min-interval";
    case C::break_lock: return "break";
    case C::bump: return "bump";
    case C::acl: return "acl";
    case C::shared_connection: return "the shared connection";
    case C::lock_delay: return "--lock-delay";
    case C::every: return "--every";
    case C::if_record_lost: return "--if-record-lost skip";
  }
  return "?";
}

std::string refusal(const Target& target, Capability capability) {
  const auto& info = info_of(target);
  std::string message = std::string(capability_name(capability)) + ": not supported on " + std::string(info.name) +
                        " (" + std::string(info.summary) + ")";
  for (const auto& u : info.unsupported)
    if (u.capability == capability && !u.why.empty()) message += ": " + std::string(u.why);
  return message;
}

}  // namespace fencerun::lease
