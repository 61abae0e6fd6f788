#include <cstdio>

#include "app/app.hpp"
#include "lease/lease_client.hpp"
#include "log/log.hpp"
#include "redis/client.hpp"
#include "supervisor/exit_status.hpp"

namespace fencerun::app {

int status(const config::Config& c) {
  redis::Client client(c.common.endpoint);
  lease::LeaseClient lease(client, lease::keys_for(c.common.key_prefix, c.run.lock));
  auto s = lease.status(BootClock::now() + c.common.timeout);
  if (!s) {
    log::event(log::Level::error, "redis_unavailable",
               "cannot use Redis at " + c.common.redacted_url + ": " + s.error().message, {{"lock", c.run.lock}});
    return exit_code::k_unavailable;
  }
  std::string last = s->last_token ? std::to_string(*s->last_token) : "";
  std::string out;
  if (c.json) {
    out = "{\"lock\":\"" + log::json_escape(c.run.lock) + "\",\"held\":" + (s->holder ? "true" : "false");
    if (s->holder) {
      const auto& h = *s->holder;
      out += ",\"owner\":\"" + log::json_escape(h.owner.substr(0, 8)) + "\"";
      out += ",\"host\":" + (h.host.empty() ? std::string("null") : "\"" + log::json_escape(h.host) + "\"");
      out += ",\"pid\":" + (h.pid ? std::to_string(*h.pid) : "null");
      out += ",\"token\":" + (h.token ? std::to_string(*h.token) : "null");
      out += ",\"ttl_ms\":" + (s->remaining ? std::to_string(s->remaining->count()) : "null");
    }
    out += ",\"last_token\":" + (last.empty() ? "null" : last) + "}\n";
  } else if (s->holder) {
    const auto& h = *s->holder;
    out = c.run.lock + ": held by " + (h.pid ? "pid " + std::to_string(*h.pid) : std::string("unknown pid")) +
          " on " + (h.host.empty() ? "unknown host" : h.host) + " (owner " + h.owner.substr(0, 8) + ")\n";
    out += "token: " + (h.token ? std::to_string(*h.token) : std::string("unknown")) + "\n";
    out += "ttl: " + (s->remaining ? std::to_string(s->remaining->count()) + "ms remaining" : std::string("no expiry")) + "\n";
    out += "last token: " + (last.empty() ? "none" : last) + "\n";
  } else {
    out = c.run.lock + ": free\nlast token: " + (last.empty() ? "none" : last) + "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return s->holder ? 0 : exit_code::k_status_free;
}

}  // namespace fencerun::app
