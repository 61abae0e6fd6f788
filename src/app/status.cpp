#include <cstdio>

#include "app/app.hpp"
#include "lease/lease_client.hpp"
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

}  // namespace

int status(const config::Config& c) {
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
