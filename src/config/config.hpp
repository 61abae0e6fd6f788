#pragma once
// Validated configuration and the lease timing rules (pure functions, apart from check_tls_files and
// make_config, which calls it).
#include <chrono>
#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/options.hpp"
#include "config/url.hpp"

namespace fencerun::config {

using std::chrono::milliseconds;

// Lease timing. With drift = ttl/100 + 2ms and margin = min(ttl/20, 100ms), a configuration is valid when
//   ttl >= 100ms, renew > 0, grace >= 0 and renew + grace + margin + drift < ttl.
// Every combination with renew <= ttl/3 and grace <= ttl/6 satisfies it.
struct LeaseTiming {
  milliseconds ttl{};
  milliseconds renew{};   // interval between renewals
  milliseconds grace{};   // kill signal -> SIGKILL
  milliseconds drift{};   // subtracted from the TTL for clock rate differences
  milliseconds margin{};  // SIGKILL lands this long before the deadline (scheduling, teardown)

  static constexpr milliseconds k_min_ttl{100};

  // Builds and checks the timing; the error names the offending option.
  static std::expected<LeaseTiming, std::string> make(milliseconds ttl, std::optional<milliseconds> renew,
                                                       std::optional<milliseconds> grace);
  static milliseconds drift_for(milliseconds ttl) { return ttl / 100 + milliseconds(2); }
  static milliseconds margin_for(milliseconds ttl) { return std::min(ttl / 20, milliseconds(100)); }
  static milliseconds default_renew(milliseconds ttl) { return ttl / 3; }
  static milliseconds default_grace(milliseconds ttl) { return std::min(milliseconds(5000), ttl / 6); }
};

// NAME: 1 to 256 bytes of printable ASCII other than space, '{' and '}'. Error text names the problem.
std::expected<void, std::string> validate_lock_name(std::string_view name);

enum class LogFormat { text, json };
enum class LogLevel { debug, info, warn, error };

struct CommonConfig {
  RedisEndpoint endpoint;
  std::string redacted_url;
  std::string url_source;  // what chose the server: "--redis", "$FENCERUN_REDIS_URL", "$REDIS_URL", "the default"
  milliseconds timeout{2000};
  std::string key_prefix = "fencerun:";
  LogLevel log_level = LogLevel::warn;
  LogFormat log_format = LogFormat::text;
};

struct RunConfig {
  std::string lock;
  LeaseTiming timing;
  int kill_signal = 15;
  std::optional<milliseconds> wait;  // nullopt: wait forever ("inf")
  bool fair = false;                 // waiters acquire in the order they began waiting
  int conflict_exit_code = 75;
  int lease_lost_exit_code = 124;
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
  std::optional<std::string> metrics_file;  // run: Prometheus textfile written after the run
};

using GetEnv = std::function<std::optional<std::string>(const char*)>;
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

// Throws UsageError naming the option and the path when --tls-ca-file, --tls-cert or --tls-key names
// something that cannot be opened for reading (missing, unreadable, a directory): a typo found before
// connecting rather than reported as an unavailable server. Empty paths are not checked.
void check_tls_files(const TlsSettings& tls);

}  // namespace fencerun::config
