#pragma once
// Once per schedule slot (--every) and once per interval (--min-interval): which trigger runs, judged
// on one clock, the server's. The rules, written once here and mirrored by the Redis scripts
// (scripts/_runs.lua, `already_done`):
//
//   fire F      the server's time at the trigger's first request (a waiter keeps it while it waits)
//   slot of t   floor((t - offset) / period): slots are [k*period + offset, (k+1)*period + offset)
//   --every     a trigger runs unless a success is recorded for the slot of its F; a success counts
//               for the slot of its own trigger's F, not for the slot it ran or ended in
//   --min-interval I
//               a trigger runs unless the last success started less than I before F (or after F:
//               a waiter is skipped by a success that started after it fired)
//
// Failed, stopped, lost and killed runs mark nothing, so the next trigger of the slot runs it again.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lease/run_record.hpp"

namespace fencerun::lease {

struct Every {
  std::chrono::milliseconds period{0};
  std::chrono::milliseconds offset{0};  // 0 <= offset < period
};

// The slot time `t_us` (microseconds since the epoch) falls in, and a slot's start.
std::int64_t slot_index(std::uint64_t t_us, const Every& every);
std::uint64_t slot_start_us(std::int64_t slot, const Every& every);

// A trigger's rule: at most one of the two.
struct ScheduleRule {
  std::optional<Every> every;
  std::optional<std::chrono::milliseconds> min_interval;
  bool any() const { return every || min_interval; }
};

// A run in progress started at `start_us`, fired at `run_fired_us` (its start when unknown), is the run
// a trigger fired at `fired_us` is for: --every, the same slot; --min-interval, started less than the
// interval before it fired (its success would skip this trigger).
bool run_counts_for(const ScheduleRule& rule, std::uint64_t start_us, std::optional<std::uint64_t> run_fired_us,
                    std::uint64_t fired_us);

// The record that makes the run of a trigger fired at `fired_us` unnecessary, or nullopt: with
// --every, a success recorded for its slot (`ok`, the last success; else, for a trigger of an older
// slot, an ok record among `runs`); with --min-interval, an `ok` that started less than the interval
// before it fired (or after). All times on one clock. The Redis scripts' already_done (_runs.lua) is
// the same rule.
std::optional<std::string> already_done(const ScheduleRule& rule, std::uint64_t fired_us,
                                        const std::optional<std::string>& ok, const std::vector<std::string>& runs);

// The `skipped` event: `record` (a run record, or with `in_progress` the run in progress as a record)
// makes the run of the trigger fired at `fired_us` unnecessary; `now_us` is the server's time.
void log_skipped(const std::string& lock, const ScheduleRule& rule, const std::string& record, std::uint64_t now_us,
                 std::uint64_t fired_us, bool in_progress);

// The `record_lost` event: NAME's record of runs has no marker on the server (its first run, or lost
// with the server's data). `skipped`: --if-record-lost skip, nothing runs (warning); else the run goes
// on and starts the record (info).
void log_record_lost(const std::string& lock, bool skipped);

// The `rule_mismatch` event: NAME's record was written with rule `held`, this trigger has `mine`.
void log_rule_mismatch(const std::string& lock, const std::string& held, const std::string& mine);

// The rule a lock's triggers share, as stored beside its record: "every PERIOD_MS OFFSET_MS TTL_MS",
// "interval MIN_MS TTL_MS", or "" (no rule: a plain run, checked against nothing).
std::string schedule_rule(const std::optional<Every>& every, std::optional<std::chrono::milliseconds> min_interval,
                          std::chrono::milliseconds records_ttl);
// A rule's text back (nullopt: none or malformed).
std::optional<ScheduleRule> parse_schedule_rule(std::string_view rule);
// What status says of a rule now (`now_us`, the server's time) given the last success: the slot and
// whether it has run, or when the next run is allowed. `json`: the fields as JSON members
// (",\"rule\":...").
std::string schedule_status_text(std::string_view rule, std::uint64_t now_us, const std::optional<std::string>& last_success);
std::string schedule_status_json(std::string_view rule, std::uint64_t now_us, const std::optional<std::string>& last_success);

// "--every 1h --slot-offset 5m --records-ttl 720h" for a rule's text (what a mismatch names).
std::string schedule_rule_options(std::string_view rule);

// The time a record counts for: its trigger's fire time, else (older records) its start.
inline std::uint64_t fired_us_of(const RunRecord& r) { return r.fire_us.value_or(r.start_us); }

// RFC 3339 in UTC with seconds ("2026-12-05T10:00:00Z").
std::string rfc3339_utc(std::uint64_t us);

}  // namespace fencerun::lease
