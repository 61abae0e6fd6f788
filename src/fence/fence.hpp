#pragma once
// `fencerun fence ...`: resource-side guards that admit a write only when its fencing token is not
// older than the greatest token the resource has accepted (SPEC section 9).
//
//   fencerun fence file [--token N] PATH                  stdin replaces PATH
//   fencerun fence redis [OPTIONS] [--token N] -- CMD...  one script: compare, run CMD, record
//   fencerun fence sql postgresql|mysql|sqlite            prints the schema with fencerun_admit
//
// Exit codes: 0 accepted, 77 stale token rejected, 64 usage (also a missing or malformed token: never
// an implicit accept), 69 Redis unavailable or failing, 1 the write itself failed (I/O error, or an
// error reply from CMD), 128+N a signal N stopped `fence file` before its commit.
#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/options.hpp"
#include "util/exit_code.hpp"

namespace fencerun::fence {

// Exit code of a guard whose write failed: an I/O error (or a side file that is a symbolic link) in
// `fence file`, an error reply from CMD in `fence redis` (exit_status.hpp, like every other code).
inline constexpr int k_write_failed = exit_code::k_fence_write_failed;

// The most words CMD of `fence redis` may have (config/options.hpp says why).
inline constexpr std::size_t k_max_command_words = config::k_fence_max_command_words;

using GetEnv = std::function<std::optional<std::string>(const char*)>;

// Runs the guard that cli::parse() found (`options.subcommand` is Subcommand::fence) and returns its
// exit code (exit_status.hpp). Throws UsageError, ending in "(see fencerun fence --help)".
int run(const config::Options& options, const GetEnv& getenv);

// The help text of `fencerun fence --help`.
std::string help_text();

// Tokens are positive decimal integers below 2^53 (they survive JSON and every SQL bigint).
inline constexpr std::uint64_t k_token_limit = std::uint64_t{1} << 53;

// Parses a token: digits only (no sign, no spaces), value from 1 to 2^53 - 1. The error says why.
std::expected<std::uint64_t, std::string> parse_token(std::string_view text);

// --token when given, else $FENCERUN_TOKEN. Throws UsageError when both are missing or the one used
// is malformed.
std::uint64_t resolve_token(const std::optional<std::string>& option, const GetEnv& getenv);

// The one-line message of a rejected write (without the "fencerun: " prefix).
std::string stale_message(std::uint64_t token, std::string_view resource, std::uint64_t accepted);

// Parsed command lines (exposed for tests).
struct FileArgs {
  std::optional<std::string> token;
  std::string path;
  bool read = false;  // --read
};
struct RedisArgs {
  config::Options connection;  // the connection options of run and status (-r, --timeout, --tls-*, ...)
  std::optional<std::string> token;
  std::optional<std::string> resource;
  std::vector<std::string> command;  // byte for byte; 1 to k_max_command_words words
};
// From what cli::parse_fence() found; these check the operands (one PATH; CMD of 1 to
// k_max_command_words words). Throw UsageError.
FileArgs file_args(const config::Options& options);
RedisArgs redis_args(const config::Options& options);
// The same from the words after "fence GUARD", through cli::parse_fence(). Throw UsageError.
FileArgs parse_file_args(const std::vector<std::string_view>& args);
RedisArgs parse_redis_args(const std::vector<std::string_view>& args);

// The schema printed by `fencerun fence sql postgresql` (sql/postgresql.sql, embedded at build time).
std::string_view postgresql_schema();
// The schema `fencerun fence sql DIALECT` prints: postgresql (or postgres), mysql (or mariadb), sqlite
// (sql/<dialect>.sql, embedded at build time); nullopt for any other word.
std::optional<std::string_view> sql_schema(std::string_view dialect);
inline constexpr std::string_view k_sql_dialects = "postgresql, mysql (mariadb), sqlite";

}  // namespace fencerun::fence
