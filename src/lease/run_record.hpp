#pragma once
// The record of a lock's runs, kept by the lock server next to the lock (scripts/_runs.lua): when each
// run started and ended (server time), how it ended, and where it ran. Parsing and the words status,
// list and history print (pure functions), and the event of a skipped run.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fencerun::lease {

// How long records live after the last write to them, and how many runs are kept.
inline constexpr std::chrono::milliseconds k_default_records_ttl{std::chrono::hours(24 * 30)};
inline constexpr long k_default_keep_runs = 20;
inline constexpr long k_max_keep_runs = 1000;

struct RecordSettings {
  std::chrono::milliseconds ttl = k_default_records_ttl;
  long keep = k_default_keep_runs;
};

// How a run ended, as fencerun tells the server at release: 'ok' (exit 0), 'failed' (another exit code
// or a signal), 'stopped' (stopped for the lease). The server makes 'ok' and 'failed' 'lost' when the
// lock was not the run's any more; 'killed' is written by the next run of NAME.
// `ran`: how long the command ran, as this side measured it (boot clock, so a stopped or starved
// fencerun does not lengthen it); the record's end is its start plus this, not the time of the release.
struct RunOutcome {
  std::string outcome;
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::optional<std::chrono::microseconds> ran;
};

// One record: "<start us> <end us> <outcome> <exit code> <signal> <token> <pid> <host> <version>
// [<fire us>]": the last field, the server's time when the run's trigger fired (--every and
// --min-interval judge by it), is absent from records of runs without a rule and of older versions.
struct RunRecord {
  std::uint64_t start_us = 0;
  std::optional<std::uint64_t> end_us;  // unknown for a killed run
  std::string outcome;
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::optional<std::uint64_t> token;
  std::optional<long> pid;
  std::string host;
  std::string version;
  std::optional<std::uint64_t> fire_us;
};
std::optional<RunRecord> parse_run_record(std::string_view text);
// The record's text again (parse_run_record's inverse).
std::string run_record_line(const RunRecord& r);

// Quorum mode: each server's records (newest first) and its time. Merged: one record per token, the
// newest tokens first, at most `count`; where the servers disagree on a run, the record of a server
// that still held the run's lock at its release wins (ok, failed, stopped), then "lost", then
// "killed". Times are moved onto the clock of `reference_now_us` (each record by the difference
// between that and its own server's time).
struct ServerRecords {
  std::vector<std::string> records;
  std::uint64_t now_us = 0;
};
std::vector<std::string> merge_records(const std::vector<ServerRecords>& servers, std::uint64_t reference_now_us,
                                       std::size_t count);

// "ok after 12.3s, ended 3m ago on web-2, token T" (a killed run: "killed, started 3m ago on ...").
std::string run_record_text(const RunRecord& r, std::uint64_t now_us);
// The record's JSON object.
std::string run_record_json(const RunRecord& r);
// Skipped and busy triggers of one slot (--every: the slot's start; --min-interval: the start of the
// run that made them skip or wait), as the record keeps them: "<slot us> <skipped> <busy> <last host>
// <last us>", newest slot first.
struct TriggerCount {
  std::uint64_t slot_us = 0;
  long skipped = 0;
  long busy = 0;
  std::string last_host;
  std::uint64_t last_us = 0;
};
std::optional<TriggerCount> parse_trigger_count(std::string_view text);

// ISO 8601 with seconds and the zone's offset ("2026-12-05T11:00:03+01:00"), or in UTC ("...Z").
std::string iso8601(std::uint64_t us, bool utc);
// history's line of a run: "START to END (DURATION) OUTCOME on HOST, pid P, token T[, fired TIME]".
std::string run_record_history_text(const RunRecord& r, bool utc);

// "1.2s", "3m", "2h", "4d": how long ago `then_us` was.
std::string age_text(std::uint64_t then_us, std::uint64_t now_us);

}  // namespace fencerun::lease
