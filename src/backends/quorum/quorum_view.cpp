#include "backends/quorum/quorum_view.hpp"

#include <algorithm>

#include "backends/quorum/quorum_lease.hpp"
#include "lease/run_record.hpp"
#include "log/log.hpp"

namespace fencerun::lease {

QuorumView quorum_view(std::vector<redis::Result<LockStatus>> replies) {
  QuorumView v;
  v.servers = std::move(replies);
  v.majority = majority_of(v.servers.size());
  std::vector<std::string> owners;  // by answering server; "" when free
  for (const auto& s : v.servers) {
    if (!s) continue;
    ++v.answered;
    if (s->last_token) v.last_token = std::max(v.last_token.value_or(0), *s->last_token);
    owners.push_back(s->holders.empty() ? std::string() : s->holders.front().holder.owner);
    v.free_servers += s->holders.empty();
  }
  v.disagree = std::ranges::any_of(owners, [&](const std::string& o) { return o != owners.front(); });
  std::vector<ServerRecords> runs, successes;
  for (const auto& s : v.servers) {
    if (!s) continue;
    if (v.runs.now_us == 0) v.runs.now_us = s->now_us;
    if (s->last_run) runs.push_back({{*s->last_run}, s->now_us});
    if (s->last_success) successes.push_back({{*s->last_success}, s->now_us});
    // The rule the triggers share, as stored by the runs' write-backs (a server restarted without its
    // data has none; the others have the same one, or a trigger would have been refused).
    if (!v.runs.rule && s->rule) v.runs.rule = s->rule;
  }
  if (auto r = merge_records(runs, v.runs.now_us, 1); !r.empty()) v.runs.last_run = r.front();
  if (auto r = merge_records(successes, v.runs.now_us, 1); !r.empty()) v.runs.last_success = r.front();
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

std::string server_text(const redis::Result<LockStatus>& s) {
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

}  // namespace fencerun::lease
