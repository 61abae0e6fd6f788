#include "lease/schedule.hpp"

#include <algorithm>
#include <charconv>
#include <ctime>
#include <vector>

#include "log/log.hpp"
#include "util/duration.hpp"

namespace fencerun::lease {

std::int64_t slot_index(std::uint64_t t_us, const Every& every) {
  const auto period = static_cast<std::int64_t>(every.period.count()) * 1000;
  const auto t = static_cast<std::int64_t>(t_us) - static_cast<std::int64_t>(every.offset.count()) * 1000;
  if (period <= 0) return 0;
  // floor division: a time before the first slot's start is in slot -1, not 0
  return t >= 0 ? t / period : -((-t + period - 1) / period);
}

std::uint64_t slot_start_us(std::int64_t slot, const Every& every) {
  return static_cast<std::uint64_t>(slot * every.period.count() * 1000 + every.offset.count() * 1000);
}

bool run_counts_for(const ScheduleRule& rule, std::uint64_t start_us, std::optional<std::uint64_t> run_fired_us,
                    std::uint64_t fired_us) {
  if (rule.every) return slot_index(run_fired_us.value_or(start_us), *rule.every) == slot_index(fired_us, *rule.every);
  if (rule.min_interval) {
    const auto i = static_cast<std::int64_t>(rule.min_interval->count()) * 1000;
    return static_cast<std::int64_t>(fired_us) - static_cast<std::int64_t>(start_us) < i;
  }
  return false;
}

std::optional<std::string> already_done(const ScheduleRule& rule, std::uint64_t fired_us,
                                        const std::optional<std::string>& ok, const std::vector<std::string>& runs) {
  if (!ok) return std::nullopt;
  const auto last = parse_run_record(*ok);
  if (!last) return std::nullopt;
  if (rule.every) {
    const auto k = slot_index(fired_us, *rule.every);
    const auto last_slot = slot_index(fired_us_of(*last), *rule.every);
    if (last_slot == k) return ok;
    if (k < last_slot)
      for (const auto& text : runs)
        if (auto r = parse_run_record(text); r && r->outcome == "ok" && slot_index(fired_us_of(*r), *rule.every) == k)
          return text;
    return std::nullopt;
  }
  if (rule.min_interval) {
    const auto i = static_cast<std::int64_t>(rule.min_interval->count()) * 1000;
    if (static_cast<std::int64_t>(fired_us) - static_cast<std::int64_t>(last->start_us) < i) return ok;
  }
  return std::nullopt;
}

namespace {
// "3.2s ago", or for a time after `now_us` "3.2s in the future (clock skew?)".
std::string ago(std::uint64_t then_us, std::uint64_t now_us) {
  if (then_us > now_us + 1000) return age_text(now_us, then_us) + " in the future (clock skew?)";
  return age_text(then_us, now_us) + " ago";
}
}  // namespace

void log_skipped(const std::string& lock, const ScheduleRule& rule, const std::string& record, std::uint64_t now_us,
                 std::uint64_t fired_us, bool in_progress) {
  const auto r = parse_run_record(record);
  std::string why, slot_text;
  if (rule.every) {
    slot_text = rfc3339_utc(slot_start_us(slot_index(fired_us, *rule.every), *rule.every));
    why = "the slot of " + slot_text + " (--every " + util::format_duration(rule.every->period) + ")" +
          (in_progress ? " is being run" : " already ran");
  } else if (rule.min_interval) {
    const std::string i = util::format_duration(*rule.min_interval);
    why = in_progress ? "a run that started less than --min-interval " + i + " before this trigger is still running"
                      : "the last success started less than --min-interval " + i + " before this trigger";
  }
  const std::string host = r ? r->host : "unknown";
  const std::string start = r ? std::to_string(r->start_us) : "unknown";
  const std::string token = r && r->token ? std::to_string(*r->token) : "unknown";
  if (r) why += (in_progress ? ": started " : ": ok, started ") + ago(r->start_us, now_us) + " on " + host + " (token " + token + ")";
  log::event(log::Level::info, "skipped", "skipped: " + why,
             {{"lock", lock},
              {"slot_start", slot_text.empty() ? "none" : slot_text},
              {"in_progress", in_progress ? "true" : "false"},
              {"last_success_host", host},
              {"last_success_start_us", start},
              {"last_success_token", token}});
}

void log_record_lost(const std::string& lock, bool skipped) {
  if (skipped) {
    log::event(log::Level::warn, "record_lost",
               "skipped: no record of the runs of '" + lock + "' on the server (lost with its data in a restart "
               "without persistence or a failover, or never started), and --if-record-lost skip: to start it, run "
               "once without --if-record-lost skip",
               {{"lock", lock}, {"skipped", "true"}});
    return;
  }
  log::event(log::Level::info, "record_lost",
             "no record of the runs of '" + lock + "' on the server: its first run, or the record was lost with the "
             "server's data (a period may run twice); this run starts it",
             {{"lock", lock}, {"skipped", "false"}});
}

void log_rule_mismatch(const std::string& lock, const std::string& held, const std::string& mine) {
  log::event(log::Level::error, "rule_mismatch",
             "lock '" + lock + "' runs with " + schedule_rule_options(held) + "; this run asks for " +
                 schedule_rule_options(mine) + " (all triggers of a lock must use the same rule)",
             {{"lock", lock}, {"held_rule", held}, {"rule", mine}});
}

std::string schedule_rule(const std::optional<Every>& every, std::optional<std::chrono::milliseconds> min_interval,
                          std::chrono::milliseconds records_ttl) {
  if (every)
    return "every " + std::to_string(every->period.count()) + " " + std::to_string(every->offset.count()) + " " +
           std::to_string(records_ttl.count());
  if (min_interval) return "interval " + std::to_string(min_interval->count()) + " " + std::to_string(records_ttl.count());
  return {};
}

std::string schedule_rule_options(std::string_view rule) {
  std::vector<long long> n;
  std::string_view kind = rule.substr(0, rule.find(' '));
  std::string_view rest = rule.size() > kind.size() ? rule.substr(kind.size() + 1) : std::string_view{};
  while (!rest.empty()) {
    auto sp = rest.find(' ');
    long long v = 0;
    auto part = rest.substr(0, sp);
    if (std::from_chars(part.data(), part.data() + part.size(), v).ec != std::errc{}) return std::string(rule);
    n.push_back(v);
    rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
  }
  auto d = [](long long ms) { return util::format_duration(std::chrono::milliseconds(ms)); };
  if (kind == "every" && n.size() == 3)
    return "--every " + d(n[0]) + (n[1] ? " --slot-offset " + d(n[1]) : "") + " --records-ttl " + d(n[2]);
  if (kind == "interval" && n.size() == 2) return "--min-interval " + d(n[0]) + " --records-ttl " + d(n[1]);
  return std::string(rule);
}

std::optional<ScheduleRule> parse_schedule_rule(std::string_view rule) {
  std::vector<long long> n;
  const std::string_view kind = rule.substr(0, rule.find(' '));
  std::string_view rest = rule.size() > kind.size() ? rule.substr(kind.size() + 1) : std::string_view{};
  while (!rest.empty()) {
    const auto sp = rest.find(' ');
    const auto part = rest.substr(0, sp);
    long long v = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc{} || end != part.data() + part.size() || v < 0) return std::nullopt;
    n.push_back(v);
    rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
  }
  using std::chrono::milliseconds;
  if (kind == "every" && n.size() == 3 && n[0] > 0) return ScheduleRule{Every{milliseconds(n[0]), milliseconds(n[1])}, {}};
  if (kind == "interval" && n.size() == 2 && n[0] > 0) return ScheduleRule{std::nullopt, milliseconds(n[0])};
  return std::nullopt;
}

namespace {
struct RuleNow {
  std::string options;                 // the rule as options
  std::optional<std::uint64_t> slot;   // --every: the current slot's start
  bool done = false;                   // its run succeeded (--every) / the interval runs (--min-interval)
  std::uint64_t next_us = 0;           // the next slot's start / when the next run is allowed
};
std::optional<RuleNow> rule_now(std::string_view text, std::uint64_t now_us, const std::optional<std::string>& ok) {
  const auto rule = parse_schedule_rule(text);
  if (!rule) return std::nullopt;
  RuleNow r{schedule_rule_options(text), std::nullopt, false, now_us};
  if (rule->every) {
    const auto k = slot_index(now_us, *rule->every);
    r.slot = slot_start_us(k, *rule->every);
    r.done = already_done(*rule, now_us, ok, {}).has_value();
    r.next_us = r.done ? slot_start_us(k + 1, *rule->every) : now_us;
  } else if (const auto last = ok ? parse_run_record(*ok) : std::nullopt) {
    const auto allowed = last->start_us + static_cast<std::uint64_t>(rule->min_interval->count()) * 1000;
    r.done = allowed > now_us;
    r.next_us = std::max(allowed, now_us);
  }
  return r;
}
}  // namespace

std::string schedule_status_text(std::string_view rule, std::uint64_t now_us, const std::optional<std::string>& ok) {
  const auto r = rule_now(rule, now_us, ok);
  if (!r) return {};
  std::string out = "rule: " + r->options + "\n";
  if (r->slot)
    out += "slot: " + rfc3339_utc(*r->slot) + (r->done ? ", succeeded; next slot " + rfc3339_utc(r->next_us)
                                                       : ", not run yet") + "\n";
  else
    out += r->done ? "next run allowed: " + rfc3339_utc(r->next_us) + "\n" : std::string("next run allowed: now\n");
  return out;
}

std::string schedule_status_json(std::string_view rule, std::uint64_t now_us, const std::optional<std::string>& ok) {
  const auto r = rule_now(rule, now_us, ok);
  if (!r) return {};
  return ",\"rule\":\"" + log::json_escape(r->options) + "\",\"slot_start_us\":" +
         (r->slot ? std::to_string(*r->slot) : std::string("null")) + ",\"done\":" + (r->done ? "true" : "false") +
         ",\"next_allowed_us\":" + std::to_string(r->next_us);
}

std::string rfc3339_utc(std::uint64_t us) {
  const std::time_t t = static_cast<std::time_t>(us / 1'000'000);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace fencerun::lease
