#include "app/lock_view.hpp"

#include <algorithm>

#include "lease/quorum_lease.hpp"
#include "log/log.hpp"

namespace fencerun::app {
namespace {

std::string or_null(const std::optional<std::string>& s) { return s ? *s : std::string("null"); }
}  // namespace

std::string ttl_text(const lease::SlotHolder& s) {
  return s.remaining ? std::to_string(s.remaining->count()) + "ms remaining" : std::string("no expiry");
}
std::string token_text(const lease::Holder& h) { return h.token ? std::to_string(*h.token) : std::string("unknown"); }

std::string holder_json(const lease::SlotHolder& s) {
  const auto& h = s.holder;
  return "\"owner\":\"" + log::json_escape(h.owner.substr(0, 8)) + "\"" +
         ",\"host\":" + or_null(h.host.empty() ? std::nullopt : std::optional("\"" + log::json_escape(h.host) + "\"")) +
         ",\"pid\":" + number_or_null(h.pid) + ",\"token\":" + number_or_null(h.token) +
         ",\"ttl_ms\":" + number_or_null(s.remaining ? std::optional(s.remaining->count()) : std::nullopt);
}

std::string who(const lease::Holder& h) {
  return (h.pid ? "pid " + std::to_string(*h.pid) : std::string("unknown pid")) + " on " +
         (h.host.empty() ? "unknown host" : h.host) + " (owner " + h.owner.substr(0, 8) + ")";
}

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
    v.holder_servers = std::max(v.holder_servers, n);
    if (n < v.majority) continue;
    if (!v.holder || h.remaining < v.holder->remaining) v.holder = h;
  }
  return v;
}

std::string server_text(const redis::Result<lease::LockStatus>& s) {
  if (!s) return "unavailable: " + s.error().message;
  std::string out;
  if (s->holders.empty()) out = "free";
  else
    out = "held by " + who(s->holders.front().holder) + ", token " + token_text(s->holders.front().holder) +
          ", ttl " + ttl_text(s->holders.front());
  return out + ", counter " + (s->last_token ? std::to_string(*s->last_token) : std::string("none"));
}

std::string servers_json(const QuorumView& v, const std::vector<std::string>& urls) {
  std::string out = "[";
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
  return out + "]";
}

}  // namespace fencerun::app
