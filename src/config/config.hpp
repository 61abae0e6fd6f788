#pragma once
// Validated configuration (pure functions, apart from check_tls_files and make_config, which calls it).
#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/options.hpp"
#include "etcd/url.hpp"
#include "redis/url.hpp"
#include "lease/run_record.hpp"
#include "lease/timing.hpp"

namespace fencerun::config {

// The connection settings are the Redis layer's own types.
using redis::HostPort;
using redis::RedisEndpoint;
using redis::TlsSettings;

using std::chrono::milliseconds;

// Lease timing lives with the lease (lease/timing.hpp); the configuration holds one.
using LeaseTiming = lease::LeaseTiming;

// NAME: 1 to 256 bytes of printable ASCII other than space, '{' and '}'. Error text names the problem.
std::expected<void, std::string> validate_lock_name(std::string_view name);

enum class LogFormat { text, json };
enum class LogLevel { debug, info, warn, error };

// Quorum mode: -r given this many times at most (3, 5 or 7: an odd number, so that any two majorities
// share a server).
inline constexpr std::size_t k_max_quorum_servers = 7;

// etcd's minimum lease TTL with its default election timeout (a TTL below it is raised by the server).
inline constexpr milliseconds k_etcd_min_ttl{2000};

struct CommonConfig {
  // etcd://... or etcds://...: the locks live on an etcd cluster (the Redis fields below are unused).
  std::optional<etcd::EtcdEndpoint> etcd;
  // What the locks live on, for messages: "etcd" or "Redis".
  const char* server_kind() const { return etcd ? "etcd" : "Redis"; }
  RedisEndpoint endpoint;    // in quorum mode the first server's
  std::string redacted_url;  // in quorum mode every server's, separated by spaces
  // Quorum mode (-r given 3, 5 or 7 times): every server in the order given, and its redacted URL.
  // Empty with one server.
  std::vector<RedisEndpoint> servers;
  std::vector<std::string> server_urls;
  milliseconds quorum_max_ttl{60'000};  // $FENCERUN_QUORUM_MAX_TTL (config/quorum_limits.hpp)
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
  long limit = 1;                    // holders at once (--limit N, 1..1024); 1 is the plain lock
  int conflict_exit_code = exit_code::k_conflict_default;
  int lease_lost_exit_code = exit_code::k_lease_lost_default;
  int skip_exit_code = exit_code::k_skipped_default;
  std::optional<milliseconds> min_interval;  // --min-interval
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
  long history_count = lease::k_max_keep_runs;  // run: Prometheus textfile written after the run
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

// The same server, as far as the URL can tell: host:port/db, the socket path and db, or a sentinel
// group's master name, sentinels and db. Quorum mode refuses a list that names one server twice.
std::string server_identity(const RedisEndpoint& endpoint);

// The connection a run shares with the fencerun commands of its job (a nested `fence redis`, status,
// run): a sealed memfd, not close-on-exec, holding the run's redacted URL, its passwords and TLS
// settings (file paths made absolute). The command gets its number in $FENCERUN_CONNECTION_FD and
// the URL in $FENCERUN_REDIS_URL; make_common_config() reads it when the URL comes from
// $FENCERUN_REDIS_URL and is the one recorded. The password is in no environment, argument, log
// or file. Returns the descriptor (the caller closes it once the command has started), or -1 in
// quorum mode or when memfd_create fails (the job then gets no credentials).
int share_connection(const CommonConfig& common);

// Throws UsageError naming the option and the path when --tls-ca-file, --tls-cert or --tls-key names
// something that cannot be opened for reading (missing, unreadable, a directory): a typo found before
// connecting rather than reported as an unavailable server. Empty paths are not checked.
void check_tls_files(const TlsSettings& tls);

}  // namespace fencerun::config
