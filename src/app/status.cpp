#include <cstdio>

#include "app/app.hpp"
#include "app/lock_view.hpp"
#include "lease/fanout.hpp"
#include "lease/lease_client.hpp"
#include "lease/quorum_lease.hpp"
#include "log/log.hpp"
#include "redis/client.hpp"
#include "supervisor/exit_status.hpp"

namespace fencerun::app {
namespace {

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
  for (std::size_t i = 0; i < v.servers.size(); ++i)
    out += "server " + std::to_string(i + 1) + " " + urls[i] + ": " + server_text(v.servers[i]) + "\n";
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
         ",\"servers\":" + servers_json(v, urls) + "}\n";
  return out;
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
