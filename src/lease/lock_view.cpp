#include "lease/lock_view.hpp"

#include <algorithm>

#include "lease/quorum_lease.hpp"
#include "log/log.hpp"

namespace fencerun::lease {
namespace {

std::string or_null(const std::optional<std::string>& s) { return s ? *s : std::string("null"); }
}  // namespace

std::string ttl_text(const SlotHolder& s) {
  return s.remaining ? std::to_string(s.remaining->count()) + "ms remaining" : std::string("no expiry");
}
std::string token_text(const Holder& h) { return h.token ? std::to_string(*h.token) : std::string("unknown"); }

std::string holder_json(const SlotHolder& s) {
  const auto& h = s.holder;
  return "\"owner\":\"" + log::json_escape(h.owner.substr(0, 8)) + "\"" +
         ",\"host\":" + or_null(h.host.empty() ? std::nullopt : std::optional("\"" + log::json_escape(h.host) + "\"")) +
         ",\"pid\":" + number_or_null(h.pid) + ",\"token\":" + number_or_null(h.token) +
         ",\"ttl_ms\":" + number_or_null(s.remaining ? std::optional(s.remaining->count()) : std::nullopt);
}

std::string who(const Holder& h) {
  return (h.pid ? "pid " + std::to_string(*h.pid) : std::string("unknown pid")) + " on " +
         (h.host.empty() ? "unknown host" : h.host) + " (owner " + h.owner.substr(0, 8) + ")";
}

std::string holder_text(const SlotHolder& s) {
  const auto& h = s.holder;
  return who(h) + ", token " + (h.token ? std::to_string(*h.token) : std::string("unknown")) + ", ttl " +
         (s.remaining ? std::to_string(s.remaining->count()) + "ms" : std::string("none"));
}

std::string list_json_fields(const std::string& name, const LockStatus& s) {
  std::string out = "{\"lock\":\"" + log::json_escape(name) + "\",\"held\":" + (s.holders.empty() ? "false" : "true") +
                    ",\"limit\":" + std::to_string(s.limit) + ",\"holders\":[";
  for (std::size_t i = 0; i < s.holders.size(); ++i)
    out += std::string(i ? "," : "") + "{\"slot\":" + std::to_string(s.holders[i].slot) + "," +
           holder_json(s.holders[i]) + "}";
  return out + "],\"waiters\":" + std::to_string(s.waiters) + ",\"last_token\":" + number_or_null(s.last_token) +
         runs_json(s);
}

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

std::string status_json(const std::string& lock, const LockStatus& s) {
  std::string out = "{\"lock\":\"" + log::json_escape(lock) + "\",\"held\":" + (s.holders.empty() ? "false" : "true");
  // The plain lock's holder, as before there were slots.
  if (s.limit == 1 && !s.holders.empty()) out += "," + holder_json(s.holders.front());
  out += ",\"limit\":" + std::to_string(s.limit) + ",\"holders\":[";
  for (std::size_t i = 0; i < s.holders.size(); ++i)
    out += std::string(i ? "," : "") + "{\"slot\":" + std::to_string(s.holders[i].slot) + "," +
           holder_json(s.holders[i]) + "}";
  out += "],\"waiters\":" + std::to_string(s.waiters) + ",\"last_token\":" + number_or_null(s.last_token) +
         runs_json(s) + "}\n";
  return out;
}

std::string status_text(const std::string& lock, const LockStatus& s) {
  std::string out;
  const std::string last = "last token: " + (s.last_token ? std::to_string(*s.last_token) : std::string("none")) +
                           "\n" + runs_status_text(s);
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

std::string list_text(const std::string& name, const LockStatus& s) {
  const std::string tail = (s.waiters > 0 ? ", " + std::to_string(s.waiters) + " waiting" : std::string()) +
                           ", last token " + (s.last_token ? std::to_string(*s.last_token) : std::string("none")) +
                           runs_list_text(s);
  if (s.holders.empty()) return name + ": free" + tail + "\n";
  if (s.limit == 1) return name + ": held by " + holder_text(s.holders.front()) + tail + "\n";
  std::string out = name + ": " + std::to_string(s.holders.size()) + " of " + std::to_string(s.limit) + " slots held" +
                    tail + "\n";
  for (const auto& h : s.holders) out += "  slot " + std::to_string(h.slot) + ": " + holder_text(h) + "\n";
  return out;
}

}  // namespace fencerun::lease

namespace fencerun::lease {

std::string runs_status_text(const LockStatus& s) {
  if (!s.last_run && !s.last_success) return {};  // nothing recorded (a lock never run, or records expired)
  auto line = [&](std::string_view label, const std::optional<std::string>& text) {
    const auto r = text ? parse_run_record(*text) : std::nullopt;
    return std::string(label) + ": " + (r ? run_record_text(*r, s.now_us) : std::string("none")) + "\n";
  };
  return line("last run", s.last_run) + line("last success", s.last_success);
}

std::string runs_json(const LockStatus& s) {
  auto field = [](const std::optional<std::string>& text) {
    const auto r = text ? parse_run_record(*text) : std::nullopt;
    return r ? run_record_json(*r) : std::string("null");
  };
  return ",\"last_run\":" + field(s.last_run) + ",\"last_success\":" + field(s.last_success);
}

std::string runs_list_text(const LockStatus& s) {
  const auto r = s.last_run ? parse_run_record(*s.last_run) : std::nullopt;
  if (!r) return {};
  return ", last run " + r->outcome + " " + age_text(r->end_us.value_or(r->start_us), s.now_us) + " ago";
}

}  // namespace fencerun::lease
