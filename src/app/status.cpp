#include <cstdio>

#include "app/app.hpp"
#include "lease/fanout.hpp"
#include "lease/lease_client.hpp"
#include "lease/quorum_lease.hpp"
#include "log/log.hpp"
#include "redis/client.hpp"
#include "supervisor/exit_status.hpp"

namespace fencerun::app {
namespace {

std::string or_null(const std::optional<std::string>& s) { return s ? *s : std::string("null"); }
template <class T>
std::string number_or_null(const std::optional<T>& n) {
  return n ? std::to_string(*n) : std::string("null");
}

// One holder's fields as JSON members (without braces).
std::string holder_json(const lease::SlotHolder& s) {
  const auto& h = s.holder;
  return "\"owner\":\"" + log::json_escape(h.owner.substr(0, 8)) + "\"" +
         ",\"host\":" + or_null(h.host.empty() ? std::nullopt : std::optional("\"" + log::json_escape(h.host) + "\"")) +
         ",\"pid\":" + number_or_null(h.pid) + ",\"token\":" + number_or_null(h.token) +
         ",\"ttl_ms\":" + number_or_null(s.remaining ? std::optional(s.remaining->count()) : std::nullopt);
}

std::string json(const std::string& lock, const lease::LockStatus& s) {
  std::string out = "{\"lock\":\"" + log::json_escape(lock) + "\",\"held\":" + (s.holders.empty() ? "false" : "true");
  // The plain lock's holder, as before there were slots.
  if (s.limit == 1 && !s.holders.empty()) out += "," + holder_json(s.holders.front());
  out += ",\"limit\":" + std::to_string(s.limit) + ",\"holders\":[";
  for (std::size_t i = 0; i < s.holders.size(); ++i)
    out += std::string(i ? "," : "") + "{\"slot\":" + std::to_string(s.holders[i].slot) + "," +
           holder_json(s.holders[i]) + "}";
  out += "],\"waiters\":" + std::to_string(s.waiters) + ",\"last_token\":" + number_or_null(s.last_token) + "}\n";
  return out;
}

std::string who(const lease::Holder& h) {
  return (h.pid ? "pid " + std::to_string(*h.pid) : std::string("unknown pid")) + " on " +
         (h.host.empty() ? "unknown host" : h.host) + " (owner " + h.owner.substr(0, 8) + ")";
}
std::string ttl_text(const lease::SlotHolder& s) {
  return s.remaining ? std::to_string(s.remaining->count()) + "ms remaining" : std::string("no expiry");
}
std::string token_text(const lease::Holder& h) { return h.token ? std::to_string(*h.token) : std::string("unknown"); }

std::string text(const std::string& lock, const lease::LockStatus& s) {
  std::string out;
  const std::string last = "last token: " + (s.last_token ? std::to_string(*s.last_token) : std::string("none")) + "\n";
  // The plain lock's lines are those of before there were slots, with the waiters when there are any.
  const std::string waiters = "waiters: " + std::to_string(s.waiters) + "\n";
  const std::string plain_waiters = s.waiters > 0 ? waiters : std::string();
  if (s.holders.empty()) return lock + ": free\n" + plain_waiters + last;
  if (s.limit == 1) {
    const auto& h = s.holders.front();
    return lock + ": held by " + who(h.holder) + "\ntoken: " + token_text(h.holder) + "\nttl: " + ttl_text(h) + "\n" +
           plain_waiters + last;
  }
  out = lock + ": " + std::to_string(s.holders.size()) + " of " + std::to_string(s.limit) + " slots held\n";
  for (const auto& h : s.holders)
    out += "slot " + std::to_string(h.slot) + ": " + who(h.holder) + ", token " + token_text(h.holder) + ", ttl " +
           ttl_text(h) + "\n";
  return out + waiters + last;
}

// Quorum mode: what each server says, and what a majority says. A server list that differs between
// clients shows here as servers that disagree.
struct QuorumView {
  std::vector<redis::Result<lease::LockStatus>> servers;
  std::size_t majority = 0;
  std::size_t answered = 0;
  std::optional<lease::SlotHolder> holder;  // the owner on a majority, with the shortest ttl among them
  std::size_t holder_servers = 0;
  std::size_t free_servers = 0;
  std::optional<std::uint64_t> last_token;  // the greatest counter
  bool disagree = false;
};

QuorumView quorum_view(std::vector<redis::Result<lease::LockStatus>> replies) {
  QuorumView v;
  v.servers = std::move(replies);
  v.majority = lease::majority_of(v.servers.size());
  std::vector<std::string> owners;  // by answering server; "" when free
  for (const auto& s : v.servers) {
    if (!s) continue;
    ++v.answered;
    if (s->last_token) v.last_token = std::max(v.last_token.value_or(0), *s->last_token);
    owners.push_back(s->holders.empty() ? std::string() : s->holders.front().holder.owner);
    v.free_servers += s->holders.empty();
  }
  v.disagree = std::ranges::any_of(owners, [&](const std::string& o) { return o != owners.front(); });
  for (const auto& s : v.servers) {
    if (!s || s->holders.empty()) continue;
    const auto& h = s->holders.front();
    const auto n = static_cast<std::size_t>(std::ranges::count(owners, h.holder.owner));
    if (n < v.majority) continue;
    v.holder_servers = n;
    if (!v.holder || h.remaining < v.holder->remaining) v.holder = h;
  }
  return v;
}

std::string quorum_text(const std::string& lock, const QuorumView& v, const std::vector<std::string>& urls) {
  const std::string of = " of " + std::to_string(v.servers.size()) + " servers (a majority is " +
                         std::to_string(v.majority) + ")";
  std::string out;
  if (v.holder)
    out = lock + ": held by " + who(v.holder->holder) + " on " + std::to_string(v.holder_servers) + of +
          "\ntoken: " + token_text(v.holder->holder) + "\nttl: " + ttl_text(*v.holder) + "\n";
  else if (v.answered < v.majority)
    out = lock + ": unknown: " + std::to_string(v.answered) + of + " answered\n";
  else if (v.free_servers >= v.majority)
    out = lock + ": free on " + std::to_string(v.free_servers) + of + "\n";
  else
    out = lock + ": free: held by no owner on a majority" + of + "\n";
  out += "last token: " + (v.last_token ? std::to_string(*v.last_token) : std::string("none")) + "\n";
  for (std::size_t i = 0; i < v.servers.size(); ++i) {
    out += "server " + std::to_string(i + 1) + " " + urls[i] + ": ";
    const auto& s = v.servers[i];
    if (!s) {
      out += "unavailable: " + s.error().message + "\n";
      continue;
    }
    if (s->holders.empty()) out += "free";
    else
      out += "held by " + who(s->holders.front().holder) + ", token " + token_text(s->holders.front().holder) +
             ", ttl " + ttl_text(s->holders.front());
    out += ", counter " + (s->last_token ? std::to_string(*s->last_token) : std::string("none")) + "\n";
  }
  if (v.disagree)
    out += "the servers disagree: a server restarted or was unreachable, a lease is being taken or expiring, or "
           "clients of this lock use different server lists\n";
  return out;
}

std::string quorum_json(const std::string& lock, const QuorumView& v, const std::vector<std::string>& urls) {
  std::string out = "{\"lock\":\"" + log::json_escape(lock) + "\",\"held\":" + (v.holder ? "true" : "false");
  if (v.holder) out += "," + holder_json(*v.holder) + ",\"held_on\":" + std::to_string(v.holder_servers);
  out += ",\"majority\":" + std::to_string(v.majority) + ",\"answered\":" + std::to_string(v.answered) +
         ",\"agree\":" + (v.disagree ? "false" : "true") + ",\"last_token\":" + number_or_null(v.last_token) +
         ",\"servers\":[";
  for (std::size_t i = 0; i < v.servers.size(); ++i) {
    const auto& s = v.servers[i];
    out += std::string(i ? "," : "") + "{\"url\":\"" + log::json_escape(urls[i]) + "\",\"available\":" +
           (s ? "true" : "false");
    if (!s) out += ",\"error\":\"" + log::json_escape(s.error().message) + "\"}";
    else {
      out += ",\"held\":" + std::string(s->holders.empty() ? "false" : "true");
      if (!s->holders.empty()) out += "," + holder_json(s->holders.front());
      out += ",\"counter\":" + number_or_null(s->last_token) + "}";
    }
  }
  return out + "]}\n";
}

int quorum_status(const config::Config& c) {
  lease::Fanout fanout(c.common.servers);
  const auto keys = lease::keys_for(c.common.key_prefix, c.run.lock);
  const auto view = quorum_view(fanout.round<lease::LockStatus>(
      [keys, until = BootClock::now() + c.common.timeout](redis::Client& client, std::size_t) {
        return lease::lock_status(client, keys, until);
      },
      BootClock::now() + c.common.timeout));
  std::string out = c.json ? quorum_json(c.run.lock, view, c.common.server_urls)
                           : quorum_text(c.run.lock, view, c.common.server_urls);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  if (view.holder) return 0;
  if (view.answered < view.majority) {
    log::event(log::Level::error, "redis_unavailable",
               "only " + std::to_string(view.answered) + " of " + std::to_string(view.servers.size()) +
                   " servers answered: no majority view",
               {{"lock", c.run.lock}});
    return exit_code::k_unavailable;
  }
  return exit_code::k_status_free;
}

}  // namespace

int status(const config::Config& c) {
  if (!c.common.servers.empty()) return quorum_status(c);
  redis::Client client(c.common.endpoint);
  auto s = lease::lock_status(client, lease::keys_for(c.common.key_prefix, c.run.lock),
                              BootClock::now() + c.common.timeout);
  if (!s) {
    log::event(log::Level::error, "redis_unavailable",
               "cannot use Redis at " + c.common.redacted_url + ": " + s.error().message, {{"lock", c.run.lock}});
    return exit_code::k_unavailable;
  }
  std::string out = c.json ? json(c.run.lock, *s) : text(c.run.lock, *s);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return s->holders.empty() ? exit_code::k_status_free : 0;
}

}  // namespace fencerun::app
