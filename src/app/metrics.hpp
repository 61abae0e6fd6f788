#pragma once
// RunReport: what one run did, written as a Prometheus textfile (node_exporter's textfile collector
// format) for cron users who want alerts on their jobs. Written atomically: temp file, fsync, rename.
#include <chrono>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>

namespace fencerun::app {

struct RunReport {
  std::string lock;
  std::chrono::system_clock::time_point started{};
  std::chrono::system_clock::time_point ended{};
  std::chrono::milliseconds lock_wait{0};  // from start until acquired (or until giving up)
  bool acquired = false;
  std::optional<std::uint64_t> token;
  bool counting = false;      // --limit N > 1: the series carry a slot label
  std::optional<long> slot;   // the slot held, once acquired
  std::uint64_t renewals = 0;
  std::uint64_t renew_failures = 0;
  bool lease_lost = false;
  int exit_code = 0;
  // The start (the server's clock, microseconds) of the last successful run of the lock this run knows
  // of: its own when it succeeded, the recorded one when --min-interval skipped it; otherwise the
  // value in the file this run replaces, if any.
  std::optional<std::uint64_t> last_success_us;
};

// The textfile's content.
std::string format_metrics(const RunReport& report);

// The last success time a metrics file at `path` holds (fencerun_last_success_timestamp_seconds).
std::optional<std::uint64_t> previous_last_success(const std::string& path);

// Writes `format_metrics(report)` to `path` atomically; the error says what failed.
std::expected<void, std::string> write_metrics_file(const std::string& path, const RunReport& report);

}  // namespace fencerun::app
