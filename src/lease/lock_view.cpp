#include "lease/lock_view.hpp"

#include <algorithm>
#include <cstdio>

#include "lease/backend.hpp"
#include "lease/schedule.hpp"

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
  const std::string rule = s.rule ? schedule_status_text(*s.rule, s.now_us, s.last_success) : std::string();
  if (!s.last_run && !s.last_success) return rule;  // nothing recorded (a lock never run, or records expired)
  auto line = [&](std::string_view label, const std::optional<std::string>& text) {
    const auto r = text ? parse_run_record(*text) : std::nullopt;
    return std::string(label) + ": " + (r ? run_record_text(*r, s.now_us) : std::string("none")) + "\n";
  };
  return line("last run", s.last_run) + line("last success", s.last_success) + rule;
}

std::string runs_json(const LockStatus& s) {
  auto field = [](const std::optional<std::string>& text) {
    const auto r = text ? parse_run_record(*text) : std::nullopt;
    return r ? run_record_json(*r) : std::string("null");
  };
  return ",\"last_run\":" + field(s.last_run) + ",\"last_success\":" + field(s.last_success) +
         (s.rule ? schedule_status_json(*s.rule, s.now_us, s.last_success) : std::string());
}

std::string runs_list_text(const LockStatus& s) {
  const auto r = s.last_run ? parse_run_record(*s.last_run) : std::nullopt;
  if (!r) return {};
  return ", last run " + r->outcome + " " + age_text(r->end_us.value_or(r->start_us), s.now_us) + " ago";
}

}  // namespace fencerun::lease

namespace fencerun::lease {

Progress::Progress() : m_tty(::isatty(2) == 1), m_began(BootClock::now()) {}

void Progress::finish() {
  if (m_shown) std::fputs("\r\033[K", stderr);
  m_shown = false;
}

void Progress::update(std::size_t keys, std::size_t locks) {
  if (!m_tty || BootClock::now() - m_began < milliseconds(1000)) return;
  std::fprintf(stderr, "\r\033[Kfencerun: %zu keys of locks found, %zu locks...", keys, locks);
  m_shown = true;
}

std::string joined(const std::vector<std::string>& entries, bool json) {
  std::string out = json ? "[" : "";
  for (std::size_t i = 0; i < entries.size(); ++i) out += (json && i ? "," : "") + entries[i];
  return json ? out + "]\n" : out;
}

void print(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

}  // namespace fencerun::lease

namespace fencerun::lease {

void print_history(const HistoryRequest& request, const std::vector<std::string>& records, std::uint64_t now_us,
                   const std::vector<std::string>& triggers, const std::string& in_progress) {
  (void)now_us;  // the lines give absolute times
  std::string out;
  if (request.json) {
    out = "[";
    bool first = true;
    for (const auto& text : records) {
      auto r = parse_run_record(text);
      if (!r) continue;
      out += (first ? "" : ",") + run_record_json(*r);
      first = false;
    }
    out += "]\n";
  } else if (records.empty() && in_progress.empty()) {
    out = request.lock + ": no runs recorded\n";
  } else {
    if (auto r = in_progress.empty() ? std::nullopt : parse_run_record(in_progress))
      out += run_record_history_text(*r, request.utc) + "\n";
    for (const auto& text : records)
      if (auto r = parse_run_record(text)) out += run_record_history_text(*r, request.utc) + "\n";
  }
  if (request.all && !request.json)
    for (const auto& text : triggers)
      if (auto t = parse_trigger_count(text))
        out += "triggers of " + iso8601(t->slot_us, request.utc) + ": " + std::to_string(t->skipped) + " skipped, " +
               std::to_string(t->busy) + " busy, the last on " + t->last_host + " at " +
               iso8601(t->last_us, request.utc) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

}  // namespace fencerun::lease
