#include "lease/run_record.hpp"

#include <charconv>
#include <ctime>
#include <functional>
#include <map>
#include <vector>

#include "log/log.hpp"
#include "util/duration.hpp"

namespace fencerun::lease {
namespace {

template <class T>
std::optional<T> number(std::string_view s) {
  T n{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return n;
}

template <class T>
std::string json_number(const std::optional<T>& n) {
  return n ? std::to_string(*n) : std::string("null");
}

std::string tenths(std::uint64_t us) {
  if (us < 1'000'000) return std::to_string(us / 1000) + "ms";
  const std::uint64_t t = (us + 50'000) / 100'000;
  return std::to_string(t / 10) + "." + std::to_string(t % 10) + "s";
}

}  // namespace

std::optional<RunRecord> parse_run_record(std::string_view text) {
  std::vector<std::string_view> f;
  while (!text.empty()) {
    auto sp = text.find(' ');
    f.push_back(text.substr(0, sp));
    text = sp == std::string_view::npos ? std::string_view{} : text.substr(sp + 1);
  }
  if (f.size() != 9 && f.size() != 10) return std::nullopt;
  RunRecord r;
  auto start = number<std::uint64_t>(f[0]);
  if (!start) return std::nullopt;
  r.start_us = *start;
  r.end_us = number<std::uint64_t>(f[1]);
  r.outcome = std::string(f[2]);
  r.exit_code = number<int>(f[3]);
  r.signal = number<int>(f[4]);
  r.token = number<std::uint64_t>(f[5]);
  r.pid = number<long>(f[6]);
  r.host = std::string(f[7]);
  r.version = std::string(f[8]);
  if (f.size() == 10) {
    r.fire_us = number<std::uint64_t>(f[9]);
    if (!r.fire_us) return std::nullopt;
  }
  return r;
}

std::string run_record_line(const RunRecord& r) {
  auto or_dash = [](const auto& n) { return n ? std::to_string(*n) : std::string("-"); };
  return std::to_string(r.start_us) + " " + or_dash(r.end_us) + " " + r.outcome + " " + or_dash(r.exit_code) + " " +
         or_dash(r.signal) + " " + or_dash(r.token) + " " + or_dash(r.pid) + " " + r.host + " " + r.version +
         (r.fire_us ? " " + std::to_string(*r.fire_us) : std::string());
}

std::vector<std::string> merge_records(const std::vector<ServerRecords>& servers, std::uint64_t reference_now_us,
                                       std::size_t count) {
  const auto rank = [](const std::string& outcome) { return outcome == "killed" ? 0 : outcome == "lost" ? 1 : 2; };
  std::map<std::uint64_t, RunRecord, std::greater<>> by_token;
  for (const auto& server : servers)
    for (const auto& text : server.records) {
      auto r = parse_run_record(text);
      if (!r || !r->token) continue;
      // Onto the reference clock.
      const auto shift = [&](std::uint64_t t) { return t + reference_now_us - server.now_us; };
      r->start_us = shift(r->start_us);
      if (r->end_us) r->end_us = shift(*r->end_us);
      if (r->fire_us) r->fire_us = shift(*r->fire_us);
      auto [it, added] = by_token.try_emplace(*r->token, *r);
      if (!added && rank(r->outcome) > rank(it->second.outcome)) it->second = *r;
    }
  std::vector<std::string> out;
  for (const auto& [token, r] : by_token) {
    if (out.size() >= count) break;
    out.push_back(run_record_line(r));
  }
  return out;
}

std::optional<TriggerCount> parse_trigger_count(std::string_view text) {
  std::vector<std::string_view> f;
  while (!text.empty()) {
    auto sp = text.find(' ');
    f.push_back(text.substr(0, sp));
    text = sp == std::string_view::npos ? std::string_view{} : text.substr(sp + 1);
  }
  if (f.size() != 5) return std::nullopt;
  auto slot = number<std::uint64_t>(f[0]);
  auto skipped = number<long>(f[1]);
  auto busy = number<long>(f[2]);
  auto last = number<std::uint64_t>(f[4]);
  if (!slot || !skipped || !busy || !last) return std::nullopt;
  return TriggerCount{*slot, *skipped, *busy, std::string(f[3]), *last};
}

std::string iso8601(std::uint64_t us, bool utc) {
  const std::time_t t = static_cast<std::time_t>(us / 1'000'000);
  std::tm tm{};
  if (utc) ::gmtime_r(&t, &tm);
  else ::localtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out = buf;
  if (utc) return out + "Z";
  const long off = tm.tm_gmtoff;
  const long a = off < 0 ? -off : off;
  std::snprintf(buf, sizeof buf, "%c%02ld:%02ld", off < 0 ? '-' : '+', a / 3600, (a % 3600) / 60);
  return out + buf;
}

std::string run_record_history_text(const RunRecord& r, bool utc) {
  std::string out = iso8601(r.start_us, utc) + " to ";
  if (r.outcome == "running") out += "now,";
  else if (r.end_us) out += iso8601(*r.end_us, utc) + " (" + tenths(*r.end_us > r.start_us ? *r.end_us - r.start_us : 0) + ")";
  else out += "?";
  out += " " + r.outcome;
  if (r.signal) out += " (signal " + std::to_string(*r.signal) + ")";
  else if (r.exit_code && r.outcome != "ok") out += " (exit " + std::to_string(*r.exit_code) + ")";
  out += " on " + r.host + ", pid " + (r.pid ? std::to_string(*r.pid) : std::string("unknown")) + ", token " +
         (r.token ? std::to_string(*r.token) : std::string("unknown"));
  if (r.fire_us) out += ", fired " + iso8601(*r.fire_us, utc);
  return out;
}

std::string age_text(std::uint64_t then_us, std::uint64_t now_us) {
  const std::uint64_t us = now_us > then_us ? now_us - then_us : 0;
  if (us < 60'000'000) return tenths(us);
  const std::uint64_t s = us / 1'000'000;
  if (s < 3600) return std::to_string(s / 60) + "m";
  if (s < 86400) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

std::string run_record_text(const RunRecord& r, std::uint64_t now_us) {
  std::string out = r.outcome;
  if (r.signal) out += " (signal " + std::to_string(*r.signal) + ")";
  else if (r.exit_code && r.outcome != "ok") out += " (exit " + std::to_string(*r.exit_code) + ")";
  if (r.end_us) {
    out += " after " + tenths(*r.end_us > r.start_us ? *r.end_us - r.start_us : 0) + ", ended " +
           age_text(*r.end_us, now_us) + " ago";
  } else {
    out += ", started " + age_text(r.start_us, now_us) + " ago";
  }
  out += " on " + r.host + ", pid " + (r.pid ? std::to_string(*r.pid) : std::string("unknown")) + ", token " +
         (r.token ? std::to_string(*r.token) : std::string("unknown"));
  return out;
}

std::string run_record_json(const RunRecord& r) {
  const std::string duration =
      r.end_us ? std::to_string((*r.end_us > r.start_us ? *r.end_us - r.start_us : 0) / 1000) : std::string("null");
  return "{\"outcome\":\"" + log::json_escape(r.outcome) + "\",\"start_us\":" + std::to_string(r.start_us) +
         ",\"end_us\":" + json_number(r.end_us) + ",\"duration_ms\":" + duration +
         ",\"exit_code\":" + json_number(r.exit_code) + ",\"signal\":" + json_number(r.signal) +
         ",\"token\":" + json_number(r.token) + ",\"pid\":" + json_number(r.pid) + ",\"host\":\"" +
         log::json_escape(r.host) + "\",\"version\":\"" + log::json_escape(r.version) + "\"" +
         (r.fire_us ? ",\"fired_us\":" + std::to_string(*r.fire_us) : std::string()) + "}";
}

}  // namespace fencerun::lease

namespace fencerun::lease {

}  // namespace fencerun::lease
