// `fencerun fence ...`: argument handling and dispatch. `fence redis` takes the connection options
// through the same parser and configuration code as run and status; CMD's words reach Redis byte
// for byte. Only `fence file`'s one option is parsed here.
#include "fence/fence.hpp"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "cli/parse.hpp"
#include "config/config.hpp"
#include "fence/embedded_scripts.hpp"
#include "fence/file_guard.hpp"
#include "fence/redis_guard.hpp"
#include "log/log.hpp"
#include "supervisor/exit_status.hpp"
#include "util/error.hpp"

namespace fencerun::fence {
namespace {

std::optional<std::string> get_env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

// Walks the arguments of one guard: options (`--name VALUE`, `--name=VALUE`, `-x VALUE`) until the
// first operand or `--`.
class ArgCursor {
 public:
  explicit ArgCursor(const std::vector<std::string_view>& args) : m_args(args) {}

  bool done() const { return m_i >= m_args.size(); }
  std::string_view peek() const { return m_args[m_i]; }
  std::string_view next() { return m_args[m_i++]; }
  bool is_option() const {
    auto a = peek();
    return a.size() > 1 && a[0] == '-';
  }

  // Matches the current argument against `long_name` (and `short_name` when not empty); on a match
  // stores the value and advances.
  bool value_option(std::string_view long_name, std::string_view short_name, std::optional<std::string>& out) {
    std::string_view a = peek();
    if (a == long_name || (!short_name.empty() && a == short_name)) {
      if (m_i + 1 >= m_args.size()) throw UsageError(std::string(long_name) + ": missing value");
      out = std::string(m_args[m_i + 1]);
      m_i += 2;
      return true;
    }
    if (a.size() > long_name.size() + 1 && a.substr(0, long_name.size()) == long_name && a[long_name.size()] == '=') {
      out = std::string(a.substr(long_name.size() + 1));
      ++m_i;
      return true;
    }
    return false;
  }

 private:
  const std::vector<std::string_view>& m_args;
  std::size_t m_i = 0;
};

bool is_help(std::string_view a) { return a == "-h" || a == "--help" || a == "help"; }

[[noreturn]] void unknown_option(std::string_view guard, std::string_view a) {
  throw UsageError("fence " + std::string(guard) + ": unknown option '" + std::string(a) + "'");
}

int main_file(const std::vector<std::string_view>& args) {
  FileArgs a = parse_file_args(args);
  std::uint64_t token = resolve_token(a.token, get_env);
  return run_file_guard(token, a.path);
}

log::Level to_log_level(config::LogLevel level) {
  switch (level) {
    case config::LogLevel::debug: return log::Level::debug;
    case config::LogLevel::info: return log::Level::info;
    case config::LogLevel::warn: return log::Level::warn;
    case config::LogLevel::error: return log::Level::error;
  }
  return log::Level::warn;
}

int main_redis(const std::vector<std::string_view>& args) {
  RedisArgs a = parse_redis_args(args);
  std::uint64_t token = resolve_token(a.token, get_env);
  // URL, passwords, TLS, --timeout and --key-prefix exactly as run and status take them.
  config::CommonConfig common = config::make_common_config(a.connection, get_env);
  log::init(to_log_level(common.log_level),
            common.log_format == config::LogFormat::json ? log::Format::json : log::Format::text);
  if (common.endpoint.tls.insecure)
    log::event(log::Level::warn, "tls_insecure", "TLS certificate verification is disabled (--tls-insecure)");

  std::optional<std::string> resource = a.resource;
  if (!resource) resource = get_env("FENCERUN_LOCK");
  if (!resource || resource->empty())
    throw UsageError("fence redis: missing --resource R (and FENCERUN_LOCK is not set)");
  if (auto ok = config::validate_lock_name(*resource); !ok)
    throw UsageError("--resource: " + ok.error());

  RedisGuard guard;
  guard.endpoint = std::move(common.endpoint);
  guard.timeout = common.timeout;
  guard.fence_key = fence_key(common.key_prefix, *resource);
  guard.token = token;
  guard.command = std::move(a.command);
  return run_redis_guard(guard);
}

int main_sql(const std::vector<std::string_view>& args) {
  if (args.empty()) throw UsageError("fence sql: missing dialect (supported: postgresql)");
  if (args.size() > 1) throw UsageError("fence sql: too many arguments");
  if (args[0] != "postgresql" && args[0] != "postgres")
    throw UsageError("fence sql: unsupported dialect '" + std::string(args[0]) + "' (supported: postgresql)");
  auto schema = postgresql_schema();
  std::fwrite(schema.data(), 1, schema.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : k_write_failed;
}

}  // namespace

std::string help_text() {
  return "Resource-side guards: admit a write only when its fencing token is not older than the\n"
         "greatest token the resource has accepted.\n"
         "\n"
         "Usage:\n"
         "  fencerun fence file [--token N] PATH\n"
         "      stdin replaces PATH (temp file, fsync, rename); the greatest accepted token is kept\n"
         "      in PATH.fence, writers serialise on PATH.fence.lock\n"
         "  fencerun fence redis [OPTIONS] [--resource R] [--token N] -- CMD [ARG...]\n"
         "      one script compares the token with <prefix>{R}:fence, runs CMD, records the token,\n"
         "      and prints CMD's reply; R defaults to $FENCERUN_LOCK; CMD has at most " +
         std::to_string(k_max_command_words) + " words.\n"
         "      OPTIONS are the connection options of run and status: -r URL, --timeout DUR,\n"
         "      --key-prefix P, --tls-ca-file FILE, --tls-cert FILE, --tls-key FILE,\n"
         "      --tls-server-name NAME, --tls-insecure, -v, -q, --log-format FMT; passwords from\n"
         "      the URL, $FENCERUN_REDIS_PASSWORD, $REDISCLI_AUTH, $FENCERUN_SENTINEL_PASSWORD\n"
         "  fencerun fence sql postgresql\n"
         "      prints the schema: table fencerun_fence and function fencerun_admit(resource, token)\n"
         "\n"
         "The token comes from --token N, else $FENCERUN_TOKEN (a positive integer below 2^53).\n"
         "A token equal to the greatest accepted one is accepted.\n"
         "\n"
         "Exit status: 0 accepted; 77 stale token rejected; 64 usage error, also a missing or\n"
         "malformed token; 69 Redis unavailable; 1 the write failed (I/O error, a side file that is\n"
         "a symbolic link, error reply from CMD); 128+N fence file stopped by signal N before its\n"
         "commit (nothing written).\n";
}

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

FileArgs parse_file_args(const std::vector<std::string_view>& args) {
  FileArgs out;
  ArgCursor c(args);
  std::vector<std::string_view> operands;
  bool options_done = false;
  while (!c.done()) {
    if (!options_done && c.peek() == "--") {
      c.next();
      options_done = true;
      continue;
    }
    if (!options_done && c.is_option()) {
      if (c.value_option("--token", "", out.token)) continue;
      unknown_option("file", c.peek());
    }
    operands.push_back(c.next());
  }
  if (operands.empty()) throw UsageError("fence file: missing PATH");
  if (operands.size() > 1) throw UsageError("fence file: takes one PATH, got " + std::to_string(operands.size()));
  out.path = std::string(operands.front());
  if (out.path.empty()) throw UsageError("fence file: PATH is empty");
  if (out.path.back() == '/') throw UsageError("fence file: PATH '" + out.path + "' names a directory");
  return out;
}

RedisArgs parse_redis_args(const std::vector<std::string_view>& args) {
  RedisArgs out;
  try {
    out.connection = cli::parse_connection_command(args, {{"--token", &out.token}, {"--resource", &out.resource}});
  } catch (const UsageError& e) {
    throw UsageError(std::string("fence redis: ") + e.what());
  }
  out.command = std::move(out.connection.command);
  out.connection.command.clear();
  if (out.command.empty())
    throw UsageError("fence redis: missing CMD (usage: fencerun fence redis [OPTIONS] -- CMD [ARG...])");
  if (out.command.size() > k_max_command_words)
    throw UsageError("fence redis: CMD has " + std::to_string(out.command.size()) + " words, at most " +
                     std::to_string(k_max_command_words) + " fit in one fenced command (Lua's unpack limit in Redis)");
  return out;
}

std::string_view postgresql_schema() { return scripts::k_postgresql.text; }

int main(int argc, const char* const* argv) {
  try {
    std::vector<std::string_view> args;
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    if (args.empty()) throw UsageError("fence: missing guard (file, redis or sql)");
    std::string_view guard = args.front();
    args.erase(args.begin());
    // `fence --help`, `fence help`, and `fence GUARD -h|--help` as the first word after GUARD.
    if (is_help(guard) || (!args.empty() && (args.front() == "-h" || args.front() == "--help"))) {
      std::fputs(help_text().c_str(), stdout);
      return 0;
    }
    if (guard == "file") return main_file(args);
    if (guard == "redis") return main_redis(args);
    if (guard == "sql") return main_sql(args);
    throw UsageError("fence: unknown guard '" + std::string(guard) + "' (expected file, redis or sql)");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "fencerun: %s (see fencerun fence --help)\n", e.what());
    return exit_code::k_usage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fencerun: internal error: %s\n", e.what());
    return exit_code::k_internal;
  }
}

}  // namespace fencerun::fence
