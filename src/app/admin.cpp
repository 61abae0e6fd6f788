// `fencerun list`, `fencerun break`, `fencerun bump`: operating locks without writing Redis commands
// by hand. list walks the key space with SCAN (bounded COUNT, never KEYS), on every master of a
// Cluster; break releases a holder's lease owner-checked, as its own release would, and wakes the
// waiters; bump raises a token counter that went backwards.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <expected>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "app/app.hpp"
#include "app/lock_view.hpp"
#include "lease/lease_client.hpp"
#include "lease/quorum_lease.hpp"
#include "log/log.hpp"
#include "redis/client.hpp"
#include "supervisor/exit_status.hpp"

namespace fencerun::app {
namespace {

using std::chrono::milliseconds;

void print(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

int unavailable(const config::Config& c, const redis::Error& e, const std::string& lock = {}) {
  if (lock.empty())
    log::event(log::Level::error, "redis_unavailable", "cannot use Redis at " + c.common.redacted_url + ": " + e.message);
  else
    log::event(log::Level::error, "redis_unavailable", "cannot use Redis at " + c.common.redacted_url + ": " + e.message,
               {{"lock", lock}});
  return exit_code::k_unavailable;
}

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

// On a terminal, a long walk says how far it got (stderr, one line rewritten in place).
class Progress {
 public:
  Progress() : m_tty(::isatty(2) == 1), m_began(BootClock::now()) {}
  ~Progress() { finish(); }
  // Erases the line (before the listing is printed, which may share the terminal).
  void finish() {
    if (m_shown) std::fputs("\r\033[K", stderr);
    m_shown = false;
  }
  void update(std::size_t keys, std::size_t locks) {
    if (!m_tty || BootClock::now() - m_began < milliseconds(1000)) return;
    std::fprintf(stderr, "\r\033[Kfencerun: %zu keys of locks found, %zu locks...", keys, locks);
    m_shown = true;
  }

 private:
  bool m_tty;
  Deadline m_began;
  bool m_shown = false;
};

std::string owner8(const lease::Holder& h) { return h.owner.substr(0, 8); }

std::string holder_text(const lease::SlotHolder& s) {
  const auto& h = s.holder;
  return who(h) + ", token " + (h.token ? std::to_string(*h.token) : std::string("unknown")) + ", ttl " +
         (s.remaining ? std::to_string(s.remaining->count()) + "ms" : std::string("none"));
}

// A listed lock's JSON members, without the closing brace (quorum mode adds its own).
std::string list_json_fields(const std::string& name, const lease::LockStatus& s) {
  std::string out = "{\"lock\":\"" + log::json_escape(name) + "\",\"held\":" + (s.holders.empty() ? "false" : "true") +
                    ",\"limit\":" + std::to_string(s.limit) + ",\"holders\":[";
  for (std::size_t i = 0; i < s.holders.size(); ++i)
    out += std::string(i ? "," : "") + "{\"slot\":" + std::to_string(s.holders[i].slot) + "," +
           holder_json(s.holders[i]) + "}";
  return out + "],\"waiters\":" + std::to_string(s.waiters) + ",\"last_token\":" + number_or_null(s.last_token);
}

std::string list_text(const std::string& name, const lease::LockStatus& s) {
  const std::string tail = (s.waiters > 0 ? ", " + std::to_string(s.waiters) + " waiting" : std::string()) +
                           ", last token " + (s.last_token ? std::to_string(*s.last_token) : std::string("none"));
  if (s.holders.empty()) return name + ": free" + tail + "\n";
  if (s.limit == 1) return name + ": held by " + holder_text(s.holders.front()) + tail + "\n";
  std::string out = name + ": " + std::to_string(s.holders.size()) + " of " + std::to_string(s.limit) + " slots held" +
                    tail + "\n";
  for (const auto& h : s.holders) out += "  slot " + std::to_string(h.slot) + ": " + holder_text(h) + "\n";
  return out;
}

// What one server's walk found: each matching lock's status, by name (sorted).
using Listing = std::map<std::string, lease::LockStatus>;
struct ListFailure {
  redis::Error error;
  std::string lock;  // the lock being read when it failed; empty during the walk
};
using Walks = std::vector<std::expected<Listing, ListFailure>>;  // by server
using ProgressReport = std::function<void(std::size_t keys, std::size_t locks)>;

// Walks one server with SCAN, on every master when it is a Cluster, and reads each lock found.
std::expected<Listing, ListFailure> walk(const redis::RedisEndpoint& endpoint, const config::Config& c,
                                         const ProgressReport& report) {
  redis::Client seed(endpoint);
  const Deadline first = BootClock::now() + c.common.timeout;
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
  const std::string match = glob_escape(c.common.key_prefix) + "{" + c.list_pattern + "}:*";
  std::size_t scanned = 0;
  // name -> the node its keys live on (every key of a name shares one hash slot)
  std::map<std::string, std::size_t> names;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    std::string cursor = "0";
    do {
      auto reply = nodes[n].command({"SCAN", cursor, "MATCH", match, "COUNT", "1000"}, BootClock::now() + c.common.timeout,
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
        if (std::string name = name_of(k.str, c.common.key_prefix); !name.empty()) names.emplace(std::move(name), n);
      }
      report(scanned, names.size());
    } while (cursor != "0");
  }
  Listing found;
  for (const auto& [name, n] : names) {
    auto s = lease::lock_status(nodes[n], lease::keys_for(c.common.key_prefix, name), BootClock::now() + c.common.timeout);
    if (!s) return std::unexpected(ListFailure{s.error(), name});
    found.emplace(name, std::move(*s));
    if (found.size() % 256 == 0) report(scanned, names.size());
  }
  return found;
}

// The listing: one JSON array of `entries`, or their lines.
std::string joined(const std::vector<std::string>& entries, bool json) {
  std::string out = json ? "[" : "";
  for (std::size_t i = 0; i < entries.size(); ++i) out += (json && i ? "," : "") + entries[i];
  return json ? out + "]\n" : out;
}

// Quorum mode: every server's walk at once (one thread each: a walk is many round trips, and a server
// that does not answer costs --timeout once, not once per server).
Walks walk_all(const config::Config& c) {
  const std::size_t n = c.common.servers.size();
  Walks walks(n);
  Progress progress;
  std::mutex mutex;
  std::vector<std::pair<std::size_t, std::size_t>> counts(n);  // keys, locks by server
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < n; ++i)
      threads.emplace_back([&, i] {
        walks[i] = walk(c.common.servers[i], c, [&, i](std::size_t keys, std::size_t locks) {
          std::lock_guard lock(mutex);
          counts[i] = {keys, locks};
          std::size_t all_keys = 0, most_locks = 0;  // each server has (nearly) the same locks
          for (const auto& [k, l] : counts) all_keys += k, most_locks = std::max(most_locks, l);
          progress.update(all_keys, most_locks);
        });
      });
  }
  return walks;
}

// The servers' views of `name`: its status on each that answered (free where it has no keys).
std::vector<redis::Result<lease::LockStatus>> views_of(const std::string& name, const Walks& walks) {
  std::vector<redis::Result<lease::LockStatus>> out;
  for (const auto& w : walks) {
    if (!w) {
      out.push_back(std::unexpected(w.error().error));
      continue;
    }
    const auto it = w->find(name);
    out.push_back(it == w->end() ? lease::LockStatus{} : it->second);
  }
  return out;
}

// One line for the majority view, and when the servers disagree one more line per server.
std::string quorum_list_text(const std::string& name, const QuorumView& v, const std::vector<std::string>& urls) {
  const std::string of = " of " + std::to_string(v.servers.size()) + " servers";
  std::string out = name + ": ";
  if (v.holder) out += "held by " + holder_text(*v.holder) + ", on " + std::to_string(v.holder_servers) + of;
  else if (v.answered < v.majority) out += "unknown: " + std::to_string(v.answered) + of + " answered";
  else if (v.holder_servers > 0)
    out += "not held by a majority (held on " + std::to_string(v.holder_servers) + of + ")";
  else out += "free on " + std::to_string(v.free_servers) + of;
  out += ", last token " + (v.last_token ? std::to_string(*v.last_token) : std::string("none"));
  if (!v.disagree) return out + "\n";
  out += ", the servers disagree:\n";
  for (std::size_t i = 0; i < v.servers.size(); ++i)
    out += "  server " + std::to_string(i + 1) + " " + urls[i] + ": " + server_text(v.servers[i]) + "\n";
  return out;
}

// list's JSON element for the majority view (limit 1, no queue in quorum mode) and each server's view.
std::string quorum_list_json(const std::string& name, const QuorumView& v, const std::vector<std::string>& urls) {
  lease::LockStatus majority;
  if (v.holder) majority.holders.push_back(*v.holder);
  majority.last_token = v.last_token;
  return list_json_fields(name, majority) + ",\"held_on\":" + std::to_string(v.holder_servers) +
         ",\"majority\":" + std::to_string(v.majority) + ",\"answered\":" + std::to_string(v.answered) +
         ",\"agree\":" + (v.disagree ? "false" : "true") + ",\"servers\":" + servers_json(v, urls) + "}";
}

int quorum_list(const config::Config& c) {
  const auto walks = walk_all(c);
  const auto& urls = c.common.server_urls;
  std::size_t answered = 0;
  std::set<std::string> names;
  for (const auto& w : walks)
    if (w) {
      ++answered;
      for (const auto& entry : *w) names.insert(entry.first);
    }
  const std::size_t majority = lease::majority_of(walks.size());
  // Each server that could not be listed, named; what the others say is listed all the same.
  const auto level = answered < majority ? log::Level::error : log::Level::warn;
  for (std::size_t i = 0; i < walks.size(); ++i) {
    if (walks[i]) continue;
    const std::string message = "cannot use Redis at " + urls[i] + ": " + walks[i].error().error.message;
    if (walks[i].error().lock.empty()) log::event(level, "redis_unavailable", message);
    else log::event(level, "redis_unavailable", message, {{"lock", walks[i].error().lock}});
  }
  bool any_held = false;
  std::vector<std::string> entries;
  for (const auto& name : names) {
    const auto v = quorum_view(views_of(name, walks));
    any_held = any_held || v.holder;
    // A lock some server holds is listed even without a majority: that is the disagreement to see.
    if (!v.holder && v.holder_servers == 0 && !(c.list_all && v.last_token)) continue;
    entries.push_back(c.json ? quorum_list_json(name, v, urls) : quorum_list_text(name, v, urls));
  }
  print(joined(entries, c.json));
  if (answered < majority) {
    log::event(log::Level::error, "redis_unavailable",
               "only " + std::to_string(answered) + " of " + std::to_string(walks.size()) +
                   " servers answered: no majority view");
    return exit_code::k_unavailable;
  }
  return any_held ? 0 : exit_code::k_status_free;
}

// Asks on the terminal whether to go on; false unless the answer starts with y.
bool confirmed(const std::string& question) {
  std::fprintf(stderr, "%s [y/N] ", question.c_str());
  std::fflush(stderr);
  char line[64] = {};
  if (!std::fgets(line, sizeof line, stdin)) return false;
  return line[0] == 'y' || line[0] == 'Y';
}

}  // namespace

int list(const config::Config& c) {
  if (!c.common.servers.empty()) return quorum_list(c);
  Progress progress;
  auto found = walk(c.common.endpoint, c, [&](std::size_t keys, std::size_t locks) { progress.update(keys, locks); });
  if (!found) return unavailable(c, found.error().error, found.error().lock);
  bool any_held = false;
  std::vector<std::string> entries;
  for (const auto& [name, s] : *found) {
    const bool held = !s.holders.empty();
    any_held = any_held || held;
    if (!held && !(c.list_all && s.last_token)) continue;
    entries.push_back(c.json ? list_json_fields(name, s) + "}" : list_text(name, s));
  }
  progress.finish();
  print(joined(entries, c.json));
  return any_held ? 0 : exit_code::k_status_free;
}

int break_lock(const config::Config& c) {
  if (!c.yes && ::isatty(0) != 1) {
    std::fputs("fencerun: break: --yes is required when stdin is not a terminal (see fencerun --help)\n", stderr);
    return exit_code::k_usage;
  }
  redis::Client client(c.common.endpoint);
  const auto keys = lease::keys_for(c.common.key_prefix, c.run.lock);
  auto s = lease::lock_status(client, keys, BootClock::now() + c.common.timeout);
  if (!s) return unavailable(c, s.error(), c.run.lock);
  std::vector<lease::SlotHolder> targets;
  for (const auto& h : s->holders)
    if (!c.break_owner || h.holder.owner.starts_with(*c.break_owner)) targets.push_back(h);
  if (targets.empty()) {
    std::fprintf(stderr, "fencerun: %s: %s\n", c.run.lock.c_str(),
                 s->holders.empty() ? "nothing held"
                                    : ("no holder's owner id starts with " + *c.break_owner).c_str());
    return exit_code::k_status_free;
  }
  if (!c.yes) {
    std::string question = "break " + c.run.lock + ", held by";
    for (const auto& t : targets)
      question += (s->limit > 1 ? " [slot " + std::to_string(t.slot) + "] " : " ") + holder_text(t);
    question += "?";
    if (!confirmed(question)) {
      std::fputs("fencerun: not broken\n", stderr);
      return 1;
    }
  }
  bool broke = false;
  for (const auto& t : targets) {
    auto released = lease::release_holder(client, keys, s->limit, t.holder.owner, BootClock::now() + c.common.timeout);
    if (!released) return unavailable(c, released.error(), c.run.lock);
    const std::string what = c.run.lock + (s->limit > 1 ? " slot " + std::to_string(t.slot) : std::string()) + ": ";
    if (*released) {
      broke = true;
      log::event(log::Level::info, "broken", "broke the lease of " + holder_text(t),
                 {{"lock", c.run.lock}, {"owner", owner8(t.holder)}});
      print("broke " + what + holder_text(t) + "\n");
    } else {
      std::fprintf(stderr, "fencerun: %sthe holder (owner %s) let go before it could be broken\n", what.c_str(),
                   owner8(t.holder).c_str());
    }
  }
  return broke ? 0 : exit_code::k_status_free;
}

int bump(const config::Config& c) {
  redis::Client client(c.common.endpoint);
  auto b = lease::bump_counter(client, lease::keys_for(c.common.key_prefix, c.run.lock), c.bump_above,
                               BootClock::now() + c.common.timeout);
  if (!b) return unavailable(c, b.error(), c.run.lock);
  const std::string before = b->before ? std::to_string(*b->before) : std::string("none");
  if (b->before && *b->before >= c.bump_above)
    print(c.run.lock + ": token counter is " + before + ", already at least " + std::to_string(c.bump_above) +
          ": unchanged\n");
  else
    print(c.run.lock + ": token counter raised from " + before + " to " + std::to_string(b->after) +
          ": the next token is greater than " + std::to_string(c.bump_above) + "\n");
  return 0;
}

}  // namespace fencerun::app
