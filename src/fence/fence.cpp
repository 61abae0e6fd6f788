// `fencerun fence ...`: the guards' checks of what cli::parse() found, and dispatch. The options are
// declared and parsed with those of run and status (src/cli/parse.cpp); `fence redis` is configured
// by the same code as they are (config::make_config). CMD's words reach Redis byte for byte.
#include "fence/fence.hpp"

#include <charconv>
#include <cstdio>

#include "cli/parse.hpp"
#include "config/config.hpp"
#include "backends/redis/target.hpp"
#include "fence/embedded_scripts.hpp"
#include "fence/file_guard.hpp"
#include "fence/redis_guard.hpp"
#include "log/log.hpp"
#include "util/exit_code.hpp"
#include "util/error.hpp"

namespace fencerun::fence {
namespace {

log::Level to_log_level(config::LogLevel level) {
  switch (level) {
    case config::LogLevel::debug: return log::Level::debug;
    case config::LogLevel::info: return log::Level::info;
    case config::LogLevel::warn: return log::Level::warn;
    case config::LogLevel::error: return log::Level::error;
  }
  return log::Level::warn;
}

int main_file(const config::Options& o, const GetEnv& getenv) {
  FileArgs a = file_args(o);
  std::uint64_t token = resolve_token(a.token, getenv);
  return a.read ? run_file_read(token, a.path) : run_file_guard(token, a.path);
}

int main_redis(const config::Options& o, const GetEnv& getenv) {
  RedisArgs a = redis_args(o);
  std::uint64_t token = resolve_token(a.token, getenv);
  // URL, passwords, TLS (the files checked now), --timeout and --key-prefix exactly as run and
  // status take them.
  config::Config config = config::make_config(o, getenv, [](std::string_view) { return std::optional<int>(); });
  config::CommonConfig& common = config.common;
  log::init(to_log_level(common.log_level),
            common.log_format == config::LogFormat::json ? log::Format::json : log::Format::text);
  // The guard keeps its mark in one Redis server: the Redis backend's target names it.
  const auto* redis_target = dynamic_cast<const redis::RedisUrlTarget*>(common.target.get());
  if (!redis_target)
    throw UsageError("fence redis: the guarded data lives in one Redis server; " + common.url_source + " names " +
                     std::string(common.target->backend()) + " (" + common.redacted_url() + ")");
  if (redis_target->tls_insecure())
    log::event(log::Level::warn, "tls_insecure", "TLS certificate verification is disabled (--tls-insecure)");

  std::optional<std::string> resource = a.resource;
  if (!resource) resource = getenv("FENCERUN_LOCK");
  if (!resource || resource->empty())
    throw UsageError("fence redis: missing --resource R (and FENCERUN_LOCK is not set)");
  if (auto ok = config::validate_lock_name(*resource); !ok)
    throw UsageError("--resource: " + ok.error());

  RedisGuard guard;
  guard.endpoint = redis_target->endpoint();
  guard.timeout = common.timeout;
  guard.fence_key = fence_key(common.key_prefix, *resource);
  guard.token = token;
  guard.command = std::move(a.command);
  return run_redis_guard(guard);
}

int main_sql(const config::Options& o) {
  const auto& args = o.fence_operands;
  if (args.empty()) throw UsageError("fence sql: missing dialect (supported: " + std::string(k_sql_dialects) + ")");
  if (args.size() > 1) throw UsageError("fence sql: too many arguments");
  auto schema = sql_schema(args[0]);
  if (!schema)
    throw UsageError("fence sql: unsupported dialect '" + args[0] + "' (supported: " + std::string(k_sql_dialects) +
                     ")");
  std::fwrite(schema->data(), 1, schema->size(), stdout);
  return std::fflush(stdout) == 0 ? exit_code::k_success : exit_code::k_fence_write_failed;
}

// `fence GUARD ARGS...` through the one parser.
config::Options parse_guard(std::string_view guard, const std::vector<std::string_view>& args) {
  std::vector<std::string_view> words = {guard};
  words.insert(words.end(), args.begin(), args.end());
  return cli::parse_fence(words);
}

}  // namespace

std::string help_text() { return cli::help_text("fence"); }

std::expected<std::uint64_t, std::string> parse_token(std::string_view text) {
  if (text.empty()) return std::unexpected("is empty");
  for (char c : text)
    if (c < '0' || c > '9') return std::unexpected("'" + std::string(text) + "' is not a decimal integer");
  std::uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || ptr != text.data() + text.size() || value >= k_token_limit)
    return std::unexpected("'" + std::string(text) + "' is too large (tokens are below 2^53)");
  if (value == 0) return std::unexpected("must be positive, got " + std::string(text));
  return value;
}

std::uint64_t resolve_token(const std::optional<std::string>& option, const GetEnv& getenv) {
  if (option) {
    auto t = parse_token(*option);
    if (!t) throw UsageError("--token: " + t.error());
    return *t;
  }
  auto env = getenv("FENCERUN_TOKEN");
  if (!env)
    throw UsageError("no fencing token: pass --token N or run under fencerun (FENCERUN_TOKEN is not set)");
  auto t = parse_token(*env);
  if (!t) throw UsageError("FENCERUN_TOKEN: " + t.error());
  return *t;
}

std::string stale_message(std::uint64_t token, std::string_view resource, std::uint64_t accepted) {
  return "stale token " + std::to_string(token) + " rejected for " + std::string(resource) + ": it has accepted " +
         std::to_string(accepted);
}

FileArgs file_args(const config::Options& o) {
  FileArgs out;
  out.token = o.fence_token;
  out.read = o.fence_read;
  const auto& operands = o.fence_operands;
  if (operands.empty()) throw UsageError("fence file: missing PATH");
  if (operands.size() > 1) throw UsageError("fence file: takes one PATH, got " + std::to_string(operands.size()));
  out.path = operands.front();
  if (out.path.empty()) throw UsageError("fence file: PATH is empty");
  if (out.path.back() == '/') throw UsageError("fence file: PATH '" + out.path + "' names a directory");
  return out;
}

RedisArgs redis_args(const config::Options& o) {
  RedisArgs out;
  out.connection = o;
  out.connection.command.clear();
  out.token = o.fence_token;
  out.resource = o.fence_resource;
  out.command = o.command;
  if (out.command.empty())
    throw UsageError("fence redis: missing CMD (usage: fencerun fence redis [OPTIONS] -- CMD [ARG...])");
  if (out.command.size() > k_max_command_words)
    throw UsageError("fence redis: CMD has " + std::to_string(out.command.size()) + " words, at most " +
                     std::to_string(k_max_command_words) + " fit in one fenced command (Lua's unpack limit in Redis)");
  return out;
}

FileArgs parse_file_args(const std::vector<std::string_view>& args) { return file_args(parse_guard("file", args)); }

RedisArgs parse_redis_args(const std::vector<std::string_view>& args) {
  return redis_args(parse_guard("redis", args));
}

std::string_view postgresql_schema() { return scripts::k_postgresql.text; }

std::optional<std::string_view> sql_schema(std::string_view dialect) {
  if (dialect == "postgresql" || dialect == "postgres") return scripts::k_postgresql.text;
  if (dialect == "mysql" || dialect == "mariadb") return scripts::k_mysql.text;
  if (dialect == "sqlite") return scripts::k_sqlite.text;
  return std::nullopt;
}

int run(const config::Options& o, const GetEnv& getenv) {
  try {
    switch (o.fence_guard) {
      case config::FenceGuard::file: return main_file(o, getenv);
      case config::FenceGuard::redis: return main_redis(o, getenv);
      case config::FenceGuard::sql: return main_sql(o);
      case config::FenceGuard::none: break;
    }
    throw UsageError("fence: missing guard (file, redis or sql)");
  } catch (const UsageError& e) {
    throw UsageError(std::string(e.what()) + " (see fencerun fence --help)");
  }
}

}  // namespace fencerun::fence
