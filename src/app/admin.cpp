// `fencerun list`, `fencerun break`, `fencerun bump`: operating locks without writing Redis commands
// by hand. list walks the key space with SCAN (bounded COUNT, never KEYS), on every master of a
// Cluster; break releases a holder's lease owner-checked, as its own release would, and wakes the
// waiters; bump raises a token counter that went backwards.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "app/app.hpp"
#include "lease/lease_client.hpp"
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
  return (h.pid ? "pid " + std::to_string(*h.pid) : std::string("unknown pid")) + " on " +
         (h.host.empty() ? "unknown host" : h.host) + " (owner " + owner8(h) + "), token " +
         (h.token ? std::to_string(*h.token) : std::string("unknown")) + ", ttl " +
         (s.remaining ? std::to_string(s.remaining->count()) + "ms" : std::string("none"));
}

template <class T>
std::string number_or_null(const std::optional<T>& n) {
  return n ? std::to_string(*n) : std::string("null");
}

std::string list_json(const std::string& name, const lease::LockStatus& s) {
  std::string out = "{\"lock\":\"" + log::json_escape(name) + "\",\"held\":" + (s.holders.empty() ? "false" : "true") +
                    ",\"limit\":" + std::to_string(s.limit) + ",\"holders\":[";
  for (std::size_t i = 0; i < s.holders.size(); ++i) {
    const auto& h = s.holders[i];
    out += std::string(i ? "," : "") + "{\"slot\":" + std::to_string(h.slot) + ",\"owner\":\"" +
           log::json_escape(owner8(h.holder)) + "\",\"host\":" +
           (h.holder.host.empty() ? std::string("null") : "\"" + log::json_escape(h.holder.host) + "\"") +
           ",\"pid\":" + number_or_null(h.holder.pid) + ",\"token\":" + number_or_null(h.holder.token) +
           ",\"ttl_ms\":" + number_or_null(h.remaining ? std::optional(h.remaining->count()) : std::nullopt) + "}";
  }
  return out + "],\"waiters\":" + std::to_string(s.waiters) + ",\"last_token\":" + number_or_null(s.last_token) + "}";
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
  redis::Client seed(c.common.endpoint);
  const Deadline first = BootClock::now() + c.common.timeout;
  auto masters = cluster_masters(seed, first);
  if (!masters) return unavailable(c, masters.error());
  // One client per master of a Cluster; the server itself otherwise.
  std::vector<redis::Client> nodes;
  if (masters->empty()) {
    nodes.push_back(std::move(seed));
  } else {
    for (const auto& m : *masters) {
      redis::RedisEndpoint e = c.common.endpoint;
      e.host = m.host;
      e.port = m.port;
      nodes.emplace_back(std::move(e));
    }
  }
  const std::string match = glob_escape(c.common.key_prefix) + "{" + c.list_pattern + "}:*";
  Progress progress;
  std::size_t scanned = 0;
  // name -> the node its keys live on (every key of a name shares one hash slot)
  std::map<std::string, std::size_t> names;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    std::string cursor = "0";
    do {
      auto reply = nodes[n].command({"SCAN", cursor, "MATCH", match, "COUNT", "1000"}, BootClock::now() + c.common.timeout);
      if (!reply) return unavailable(c, reply.error());
      if (reply->is_error() || !reply->is_array() || reply->elements.size() != 2 || !reply->elements[0].is_string())
        return unavailable(c, redis::Error{redis::Error::Kind::protocol,
                                           "SCAN failed: " + (reply->is_error() ? reply->str : std::string("bad reply"))});
      cursor = reply->elements[0].str;
      for (const auto& k : reply->elements[1].elements) {
        ++scanned;
        if (std::string name = name_of(k.str, c.common.key_prefix); !name.empty()) names.emplace(std::move(name), n);
      }
      progress.update(scanned, names.size());
    } while (cursor != "0");
  }
  bool any_held = false;
  std::string out = c.json ? "[" : "";
  bool first_entry = true;
  std::size_t done = 0;
  for (const auto& [name, n] : names) {
    auto s = lease::lock_status(nodes[n], lease::keys_for(c.common.key_prefix, name), BootClock::now() + c.common.timeout);
    if (!s) return unavailable(c, s.error(), name);
    if (++done % 256 == 0) progress.update(scanned, names.size());
    const bool held = !s->holders.empty();
    any_held = any_held || held;
    if (!held && !(c.list_all && s->last_token)) continue;
    if (c.json) {
      out += (first_entry ? "" : ",") + list_json(name, *s);
    } else {
      out += list_text(name, *s);
    }
    first_entry = false;
  }
  if (c.json) out += "]\n";
  progress.finish();
  print(out);
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
