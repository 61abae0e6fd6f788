#pragma once
// Validated configuration (pure functions, apart from check_tls_files and make_config, which calls it).
#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/options.hpp"
#include "lease/backend.hpp"
#include "lease/run_record.hpp"
#include "lease/schedule.hpp"
#include "lease/timing.hpp"

namespace fencerun::config {

using std::chrono::milliseconds;

// Lease timing lives with the lease (lease/timing.hpp); the configuration holds one.
using LeaseTiming = lease::LeaseTiming;

// NAME: 1 to 256 bytes of printable ASCII other than space, '{' and '}'. Error text names the problem.
std::expected<void, std::string> validate_lock_name(std::string_view name);

enum class LogFormat { text, json };
enum class LogLevel { debug, info, warn, error };

struct CommonConfig {
  // Where the locks live, as its backend validated it (lease/backend.hpp; the registry picked the
  // backend by the URL's scheme and the number of URLs).
  std::shared_ptr<const lease::Target> target;
  // What the locks live on, for messages: "Redis" or "etcd".
  std::string_view server_kind() const { return target->server_kind(); }
  // The URL without any password (a quorum's: every server's, separated by spaces).
  const std::string& redacted_url() const { return target->redacted_url(); }
  std::string url_source;  // what chose the server: "--redis", "$FENCERUN_SERVER", "$FENCERUN_REDIS_URL", "$REDIS_URL", "the default"
  milliseconds timeout{2000};
  std::string key_prefix = "fencerun:";
  LogLevel log_level = LogLevel::warn;
  LogFormat log_format = LogFormat::text;
  lease::BackendSettings backend_settings() const { return {key_prefix, timeout}; }
};

struct RunConfig {
  std::string lock;
  LeaseTiming timing;
  int kill_signal = 15;
  std::optional<milliseconds> wait;  // nullopt: wait forever ("inf")
  bool fair = false;                 // waiters acquire in the order they began waiting
  long limit = 1;                    // holders at once (--limit N, 1..1024); 1 is the plain lock
  int conflict_exit_code = exit_code::k_conflict_default;
  int lease_lost_exit_code = exit_code::k_lease_lost_default;
  int skip_exit_code = exit_code::k_skipped_default;
  std::optional<milliseconds> min_interval;  // --min-interval
  std::optional<lease::Every> every;         // --every, --slot-offset
  bool skip_if_record_lost = false;          // --if-record-lost skip
  std::optional<milliseconds> lock_delay;    // --lock-delay (etcd)
  lease::RecordSettings records;             // --records-ttl, --keep-runs
  std::vector<std::string> command;  // with --shell: {"/bin/sh", "-c", COMMAND}
  int min_replicas = 0;               // WAIT for this many replicas after acquiring
  milliseconds replica_timeout{1000};
};

struct Config {
  Subcommand subcommand = Subcommand::run;
  CommonConfig common;
  RunConfig run;   // run and status (status uses run.lock)
  bool json = false;
  bool acl_delex = false;
  bool acl_delifeq = false;
  bool acl_admin = false;
  std::optional<std::string> metrics_file;
  // list: the NAME glob (Redis MATCH syntax, default "*"), and free locks too
  std::string list_pattern = "*";
  bool list_all = false;
  // break: the holder's owner id prefix (lower-case hex, at least 8 digits); no question asked
  std::optional<std::string> break_owner;
  bool yes = false;
  // bump: the next token must be greater than this
  std::uint64_t bump_above = 0;
  // history: how many runs to show (-n N, default all that are kept)
  long history_count = lease::k_max_keep_runs;
  bool history_utc = false;  // history --utc
  bool history_all = false;  // history --all
};

using GetEnv = lease::GetEnv;
// Signal name or number -> signal number, or nullopt. Provided by the supervisor layer.
using ParseSignal = std::function<std::optional<int>(std::string_view)>;

// Validates `options`, including that the TLS files named can be read (check_tls_files); throws
// UsageError with a one-line message naming the option. For acl and fence only the connection part
// (Config::common) is filled in.
Config make_config(const Options& options, const GetEnv& getenv, const ParseSignal& parse_signal);

// The connection part of make_config (URL and passwords from the options and the environment, TLS,
// --timeout, --key-prefix, logging), for every command that talks to Redis. Throws UsageError.
// Pure: it does not look at the TLS files (see check_tls_files).
CommonConfig make_common_config(const Options& options, const GetEnv& getenv);

}  // namespace fencerun::config
