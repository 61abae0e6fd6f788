#pragma once
// Options: what the command line said, as plain strings and flags, before validation.
// The CLI layer fills it; config::make_config turns it into a validated Config.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "util/exit_code.hpp"

namespace fencerun::config {

enum class Subcommand { run, status, acl, fence, list, break_lock, bump, history, version, help };

// The most words CMD of `fence redis` may have: the script passes them to redis.pcall through
// Lua's unpack(), which returns at most 7998 values in the Lua 5.1 of Redis (LUAI_MAXCSTACK 8000
// stack slots, minus the two arguments of unpack itself).
inline constexpr std::size_t k_fence_max_command_words = 7998;

// `fencerun fence GUARD ...`
enum class FenceGuard { none, file, redis, sql };

struct Options {
  Subcommand subcommand = Subcommand::run;
  std::string help_text;  // with Subcommand::help

  // -r/--redis, in the order given: none (the environment or the default), one, or a quorum's servers.
  std::vector<std::string> redis_urls;
  std::string server_option = "--redis";  // how -r was spelled, for messages: "--redis" (also -r) or "--server"
  std::string ttl = "30s";
  std::optional<std::string> renew;
  std::optional<std::string> grace;
  std::string kill_signal = "TERM";
  std::string wait = "0";
  bool fair = false;
  std::string limit = "1";
  std::optional<std::string> metrics_file;
  int conflict_exit_code = exit_code::k_conflict_default;
  int lease_lost_exit_code = exit_code::k_lease_lost_default;
  int skip_exit_code = exit_code::k_skipped_default;
  std::optional<std::string> min_interval;
  std::optional<std::string> every;
  std::optional<std::string> slot_offset;
  std::optional<std::string> if_record_lost;
  std::optional<std::string> lock_delay;
  std::optional<std::string> records_ttl;
  std::optional<std::string> keep_runs;
  std::optional<std::string> history_count;  // history -n N
  std::string timeout = "2s";
  std::string key_prefix = "fencerun:";
  bool shell = false;
  int verbosity = 0;  // -v: +1, -q: -1
  std::string log_format = "text";
  bool json = false;  // status --json

  // TLS (rediss://, rediss+sentinel://)
  std::string tls_ca_file;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  bool tls_insecure = false;

  // replica acknowledgement of the acquisition
  int min_replicas = 0;
  std::string replica_timeout = "1s";

  bool acl_delex = false;  // acl --delex
  bool acl_delifeq = false;  // acl --delifeq
  bool acl_admin = false;  // acl --admin: also what list, break and bump send

  // list [PATTERN] [--all], break NAME [--owner PREFIX] [--yes], bump NAME --above N
  std::optional<std::string> list_pattern;
  bool list_all = false;
  bool utc = false;  // history --utc
  std::optional<std::string> break_owner;
  bool yes = false;
  std::optional<std::string> bump_above;

  // fence: the guard, --token, --resource (redis) and the operands (file: PATH, sql: the dialect)
  FenceGuard fence_guard = FenceGuard::none;
  std::optional<std::string> fence_token;
  bool fence_read = false;  // fence file --read: admit the token and print PATH
  std::optional<std::string> fence_resource;
  std::vector<std::string> fence_operands;

  std::string lock_name;
  std::vector<std::string> command;  // everything after `--` (fence redis: CMD)
};

}  // namespace fencerun::config
