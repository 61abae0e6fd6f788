#include "cli/parse.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "util/error.hpp"

namespace fencerun::cli {
namespace {

// The connection options of run, status and fence redis.
void add_connection_options(CLI::App& app, config::Options& o) {
  // Repeated for quorum mode: every -r is kept, one URL each (CLI11 would otherwise take the
  // words after it as more URLs).
  app.add_option("-r,--redis", o.redis_urls)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);
  app.add_option("--timeout", o.timeout);
  app.add_option("--key-prefix", o.key_prefix);
  app.add_flag_function("-v,--verbose", [&o](std::int64_t n) { o.verbosity += static_cast<int>(n); });
  app.add_flag_function("-q,--quiet", [&o](std::int64_t n) { o.verbosity -= static_cast<int>(n); });
  app.add_option("--log-format", o.log_format);
  app.add_option("--tls-ca-file", o.tls_ca_file);
  app.add_option("--tls-cert", o.tls_cert);
  app.add_option("--tls-key", o.tls_key);
  app.add_option("--tls-server-name", o.tls_server_name);
  app.add_flag("--tls-insecure", o.tls_insecure);
}

void add_run_options(CLI::App& app, config::Options& o) {
  add_connection_options(app, o);
  app.add_option("-t,--ttl", o.ttl);
  app.add_option("--renew", o.renew);
  app.add_option("--grace", o.grace);
  app.add_option("--kill-signal", o.kill_signal);
  app.add_option("-w,--wait", o.wait);
  app.add_flag("--fair", o.fair);
  app.add_option("--limit", o.limit);
  app.add_option("--metrics-file", o.metrics_file);
  app.add_option("-E,--conflict-exit-code", o.conflict_exit_code);
  app.add_option("--lease-lost-exit-code", o.lease_lost_exit_code);
  app.add_flag("--shell", o.shell);
  app.add_option("--min-replicas", o.min_replicas);
  app.add_option("--replica-timeout", o.replica_timeout);
  app.add_option("NAME", o.lock_name);
}

// The one parser of every command, bound to one Options. -h/--help and --version are answered by
// parse() before CLI11 runs, but they are declared like the other options: the pre-scan below looks
// every option up here, and declared_options() lists them. Operands (NAME aside) and COMMAND/CMD are
// collected by the pre-scan, never by CLI11. Neither copied nor moved: the App holds references
// into `o`.
struct Parser {
  config::Options o;
  bool help = false;
  bool version = false;
  CLI::App app{"fencerun"};
  CLI::App* run = nullptr;
  CLI::App* status = nullptr;
  CLI::App* acl = nullptr;
  CLI::App* list = nullptr;
  CLI::App* break_lock = nullptr;
  CLI::App* bump = nullptr;
  CLI::App* fence = nullptr;
  CLI::App* fence_file = nullptr;
  CLI::App* fence_redis = nullptr;
  CLI::App* fence_sql = nullptr;

  // The top-level command alone; the others are added when needed (each of the dozens of options
  // costs its share of the start-up of every run).
  // `fencerun fence ...` needs none of the top-level options (WithoutTopLevel).
  struct WithoutTopLevel {};
  Parser() : Parser(WithoutTopLevel{}) {
    add_run_options(app, o);
    app.add_flag("-h,--help", help);
    app.add_flag("--version", version);
  }
  explicit Parser(WithoutTopLevel) {
    app.set_help_flag();  // before the subcommands: they inherit it
    app.allow_extras(false);
    // An option given twice takes the last value, as getopt-based tools do (a wrapper's defaults can
    // be overridden by the options after them). Inherited by the subcommands.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.require_subcommand(0, 1);
  }
  void add_run() {
    if (run) return;
    run = app.add_subcommand("run");
    add_run_options(*run, o);
  }
  void add_status_and_acl() {
    if (status) return;
    status = app.add_subcommand("status");
    add_connection_options(*status, o);
    status->add_flag("--json", o.json);
    status->add_option("NAME", o.lock_name);
    acl = app.add_subcommand("acl");
    acl->add_option("--key-prefix", o.key_prefix);
    acl->add_flag("--delex", o.acl_delex);
    acl->add_flag("--delifeq", o.acl_delifeq);
    acl->add_flag("--admin", o.acl_admin);
    list = app.add_subcommand("list");
    add_connection_options(*list, o);
    list->add_flag("--json", o.json);
    list->add_flag("--all", o.list_all);
    list->add_option("PATTERN", o.list_pattern);
    break_lock = app.add_subcommand("break");
    add_connection_options(*break_lock, o);
    break_lock->add_option("--owner", o.break_owner);
    break_lock->add_flag("-y,--yes", o.yes);
    break_lock->add_option("NAME", o.lock_name);
    bump = app.add_subcommand("bump");
    add_connection_options(*bump, o);
    bump->add_option("--above", o.bump_above);
    bump->add_option("NAME", o.lock_name);
  }
  void add_fence() {
    if (fence) return;
    fence = app.add_subcommand("fence");
    fence->add_flag("-h,--help", help);
    fence_file = fence->add_subcommand("file");
    // As getopt: a repeated --token counts the last time.
    fence_file->add_option("--token", o.fence_token)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    fence_file->add_flag("--read", o.fence_read);
    fence_file->add_flag("-h,--help", help);
    fence_redis = fence->add_subcommand("redis");
    fence_redis->add_option("--resource", o.fence_resource);
    fence_redis->add_option("--token", o.fence_token);
    add_connection_options(*fence_redis, o);
    fence_redis->add_flag("-h,--help", help);
    fence_sql = fence->add_subcommand("sql");
    fence_sql->add_flag("-h,--help", help);
    fence->require_subcommand(0, 1);
  }
  void add_all() {
    add_run();
    add_status_and_acl();
    add_fence();
  }
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  // CLI11 wants argv order reversed when given a vector. `prefix` names the command in messages.
  void parse(const std::vector<std::string>& words, std::string_view prefix) {
    std::vector<std::string> args(words.rbegin(), words.rend());
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      throw UsageError(std::string(prefix) + e.what());
    }
  }
};

const CLI::Option* find_option(const std::vector<const CLI::App*>& scope, std::string_view name) {
  for (const CLI::App* a : scope) {
    const CLI::Option* opt = a->get_option_no_throw(std::string(name));
    if (opt && opt->nonpositional()) return opt;
  }
  return nullptr;
}

bool is_option_word(std::string_view a) { return a.size() > 1 && a[0] == '-'; }
bool is_help_word(std::string_view a) { return a == "-h" || a == "--help"; }

// Levenshtein distance, for "did you mean".
std::size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// One option word, looked up in the commands of `scope`: known, or a usage error in the words of
// getopt ("unrecognized option"). Returns whether the next word is its value.
bool check_option(std::string_view word, const std::vector<const CLI::App*>& scope) {
  if (word.starts_with("--")) {
    std::string_view name = word.substr(0, word.find('='));
    const CLI::Option* o = find_option(scope, name);
    if (!o) {
      std::string message = "unrecognized option '" + std::string(name) + "'";
      std::string best;
      std::size_t best_distance = 3;
      for (const CLI::App* a : scope)
        for (const CLI::Option* k : a->get_options())
          for (const std::string& l : k->get_lnames()) {
            std::size_t d = distance(name, "--" + l);
            if (d < best_distance) best_distance = d, best = "--" + l;
          }
      if (!best.empty()) message += ", did you mean '" + best + "'?";
      throw UsageError(message);
    }
    return o->get_expected_min() > 0 && name.size() == word.size();
  }
  // Short options: a cluster of flags (-vv), or one that takes a value, attached (-t5s) or next.
  for (std::size_t i = 1; i < word.size(); ++i) {
    const CLI::Option* o = find_option(scope, std::string("-") + word[i]);
    if (!o) throw UsageError("invalid option -- '" + std::string(1, word[i]) + "'");
    if (o->get_expected_min() > 0) return i + 1 == word.size();
  }
  return false;
}

std::vector<std::string> names_of(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
  }
  return names;
}

constexpr std::string_view k_fence_hint = " (see fencerun fence --help)";

// The TLS options' lines, shared by `fencerun --help` and `fencerun fence redis --help`.
constexpr std::string_view k_tls_help = R"(      --tls-ca-file FILE   CA certificates to verify the server with
                           (default: the system store)
      --tls-cert FILE      client certificate (mutual TLS)
      --tls-key FILE       key of the client certificate
                           (default: in --tls-cert)
      --tls-server-name NAME
                           name to verify in the server certificate
                           (default: the host)
      --tls-insecure       do not verify the server certificate (warns)
)";

}  // namespace

std::string help_text() {
  return R"(Usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...]
       fencerun run [OPTIONS] NAME [--] COMMAND [ARG...]
       fencerun status [OPTIONS] NAME [--json]
       fencerun list [OPTIONS] [PATTERN] [--all] [--json]
       fencerun break [OPTIONS] NAME [--owner PREFIX] [--yes]
       fencerun bump [OPTIONS] NAME --above N
       fencerun acl [--key-prefix STR] [--delex] [--delifeq] [--admin]
       fencerun fence file|redis|sql ...  (resource-side guards: fencerun(1))
       fencerun [-r URL] --version | --help

Run COMMAND while holding the lease NAME in Redis, and give it a fencing token
(FENCERUN_TOKEN) that the protected resource can check to reject stale writers.
The lease is renewed in the background; if it cannot be renewed in time, every
process of the command is stopped before the lease expires. Options end at the
first word after NAME (or at --): the rest is COMMAND and its arguments.

Options:
  -r, --redis URL          Redis to use: redis://[[user]:password@]host[:port]
                           [/db], rediss://... (TLS), unix:///PATH[?db=N],
                           redis+sentinel://host:port[,host:port...]/MASTER;
                           a Redis Cluster node works as redis://
                           (default: $FENCERUN_REDIS_URL, $REDIS_URL,
                           redis://127.0.0.1:6379); given 3, 5 or 7 times:
                           quorum mode on that many independent servers
  -t, --ttl DUR            lease length (default: 30s)
      --renew DUR          renewal interval (default: ttl/3)
      --grace DUR          time between the kill signal and SIGKILL
                           (default: min(5s, ttl/6))
      --kill-signal SIG    first signal sent to the command when the lease is
                           lost or runs short (default: TERM)
  -w, --wait DUR           wait this long for a busy lock; 'inf' waits forever
                           (default: 0)
      --fair               waiters acquire in the order they began waiting
      --limit N            up to N holders at once, each in a slot of its own
                           (FENCERUN_SLOT, 0..N-1); 1 to 1024 (default: 1)
  -E, --conflict-exit-code N
                           exit code when the lock is busy or the wait ran out
                           (default: 75)
      --lease-lost-exit-code N
                           exit code when the lease was lost and the command was
                           stopped (default: 124)
      --timeout DUR        bound on connecting and on each Redis request
                           (default: 2s)
      --key-prefix STR     prefix of every key fencerun writes
                           (default: fencerun:)
      --shell              run COMMAND (one string) with /bin/sh -c
      --metrics-file PATH  after the run, write a Prometheus textfile there
      --min-replicas N     count the lock as acquired only once N replicas
                           confirm it (WAIT); otherwise release it and exit 69
                           (default: 0)
      --replica-timeout DUR
                           how long to wait for those replicas (default: 1s)
)" + std::string(k_tls_help) + R"(  -v, --verbose            log lease events (repeat for debug)
  -q, --quiet              log errors only
      --log-format FMT     text or json (default: text)
      --json               status, list: print JSON
      --all                list: also free locks that have issued tokens
      --owner PREFIX       break: only the holder whose owner id starts with
                           PREFIX (at least 8 hex digits, as status shows)
  -y, --yes                break: do not ask (required without a terminal)
      --above N            bump: raise the token counter so that the next
                           token is greater than N
      --delex              acl: also allow DELEX (Redis 8.4 and later)
      --delifeq            acl: also allow DELIFEQ (Valkey 9.0 and later)
      --admin              acl: also allow what list, break and bump send
  -h, --help               show this help and exit
      --version            show the version and exit (with -r: also the
                           server's name, version and release path)

Durations: 500ms, 30s, 1.5s, 2m30s, 1h; a bare number is seconds (0.5 = 500ms).

Exit status: the command's own status; 128+N if it was killed by signal N;
64 usage error; 69 Redis unavailable; 75 lock busy; 124 lease lost;
126 command not executable; 127 command not found; 70 internal error.
status, list: 0 held, 3 free (nothing held), 69 unavailable.
break: 0 broken, 3 nothing held (or no such owner), 1 not confirmed.

Password: from the URL, else $FENCERUN_REDIS_PASSWORD, else $REDISCLI_AUTH;
sentinels' own password: $FENCERUN_SENTINEL_PASSWORD.
See fencerun(1) for details.
)";
}

namespace {

std::string fence_help() {
  return R"(Usage: fencerun fence file [--token N] [--read] [--] PATH
       fencerun fence redis [OPTIONS] [--] CMD [ARG...]
       fencerun fence sql postgresql|mysql|sqlite
       fencerun fence [file|redis|sql] --help

Resource-side guards: admit a write only when its fencing token is not older
than the greatest token the resource has accepted.

  fence file            stdin replaces PATH (temp file, fsync, rename); the
                        greatest accepted token is kept in PATH.fence, writers
                        serialise on PATH.fence.lock; --read admits the token
                        and prints PATH (the read of a read-modify-write)
  fence redis           one script compares the token with <prefix>{R}:fence,
                        runs CMD, records the token, and prints CMD's reply;
                        OPTIONS are the connection options of run and status
  fence sql DIALECT     prints the schema of the SQL guard: table fencerun_fence
                        and fencerun_admit(resource, token), a function
                        (postgresql), a procedure (mysql, also mariadb) or a
                        view with a trigger (sqlite)

Options:
  -h, --help            show this help and exit (after a guard: its options)

The token comes from --token N, else $FENCERUN_TOKEN (a positive integer below
2^53). A token equal to the greatest accepted one is accepted.

Exit status: 0 accepted; 77 stale token rejected; 64 usage error, also a
missing or malformed token; 69 Redis unavailable; 1 the write failed (I/O
error, a side file that is a symbolic link, error reply from CMD); 128+N fence
file stopped by signal N before its commit (nothing written).
See fencerun(1) for details.
)";
}

std::string fence_file_help() {
  return R"(Usage: fencerun fence file [--token N] [--read] [--] PATH

Replace PATH with standard input, only when the fencing token is not older
than the greatest token PATH has accepted: the data goes to a temporary file,
fsync, rename. The greatest accepted token is kept in PATH.fence, writers
serialise on PATH.fence.lock; a side file that is a symbolic link is refused.
A token equal to the greatest accepted one is accepted.

With --read, admit the token the same way (record it as the greatest
accepted, or reject it when stale) and print PATH on standard output, so that
an older owner's later write is rejected: fence the read of every
read-modify-write, then write with the same token.

Options:
      --token N            fencing token, a positive integer below 2^53
                           (default: $FENCERUN_TOKEN)
      --read               admit the token and print PATH instead of writing
  -h, --help               show this help and exit

Exit status: 0 accepted; 77 stale token rejected; 64 usage error, also a
missing or malformed token; 1 the write failed (I/O error, a side file that is
a symbolic link); 128+N stopped by signal N before its commit (nothing
written).
)";
}

std::string fence_redis_help() {
  return R"(Usage: fencerun fence redis [OPTIONS] [--] CMD [ARG...]

Run the Redis command CMD only when the fencing token is not older than the
greatest token accepted for resource R: one script compares the token with
<prefix>{R}:fence, runs CMD, records the token, and prints CMD's reply.
Options end at CMD (or at --); CMD and its arguments reach Redis byte for
byte, at most )" + std::to_string(config::k_fence_max_command_words) + R"( words.

Options:
      --resource R         the resource (default: $FENCERUN_LOCK)
      --token N            fencing token, a positive integer below 2^53
                           (default: $FENCERUN_TOKEN)
  -r, --redis URL          Redis to use, the URLs of run (default:
                           $FENCERUN_REDIS_URL, $REDIS_URL,
                           redis://127.0.0.1:6379)
      --timeout DUR        bound on connecting and on the request
                           (default: 2s)
      --key-prefix STR     prefix of the fence key (default: fencerun:)
)" + std::string(k_tls_help) + R"(  -v, --verbose            log more (repeat for debug)
  -q, --quiet              log errors only
      --log-format FMT     text or json (default: text)
  -h, --help               show this help and exit

Password: from the URL, else $FENCERUN_REDIS_PASSWORD, else $REDISCLI_AUTH;
sentinels' own password: $FENCERUN_SENTINEL_PASSWORD.

Exit status: 0 accepted; 77 stale token rejected; 64 usage error, also a
missing or malformed token; 69 Redis unavailable; 1 an error reply from CMD.
)";
}

std::string fence_sql_help() {
  return R"(Usage: fencerun fence sql postgresql|mysql|sqlite

Print the schema of the SQL guard for a database, to load once and use in the
writer's own transaction, before its writes:

  postgresql  (also postgres) table fencerun_fence and function
              fencerun_admit(resource, token); stale: SQLSTATE ZF077
  mysql       (also mariadb) table fencerun_fence and procedure
              fencerun_admit(resource, token); stale: SQLSTATE 45077
  sqlite      table fencerun_fence, view fencerun_admit(resource, token) and
              its INSTEAD OF INSERT trigger; in BEGIN IMMEDIATE

A malformed token raises SQLSTATE 22023 (sqlite: "fencerun: invalid fencing
token"). The same files are installed in share/fencerun.

Options:
  -h, --help               show this help and exit
)";
}

}  // namespace

std::string help_text(std::string_view command) {
  if (command.empty()) return help_text();
  if (command == "fence") return fence_help();
  if (command == "fence file") return fence_file_help();
  if (command == "fence redis") return fence_redis_help();
  if (command == "fence sql") return fence_sql_help();
  return {};
}

std::vector<DeclaredOptions> declared_options() {
  Parser p;
  p.add_all();
  return {{"", names_of(p.app)},
          {"run", names_of(*p.run)},
          {"status", names_of(*p.status)},
          {"acl", names_of(*p.acl)},
          {"list", names_of(*p.list)},
          {"break", names_of(*p.break_lock)},
          {"bump", names_of(*p.bump)},
          {"fence", names_of(*p.fence)},
          {"fence file", names_of(*p.fence_file)},
          {"fence redis", names_of(*p.fence_redis)},
          {"fence sql", names_of(*p.fence_sql)}};
}

config::Options parse_fence(const std::vector<std::string_view>& words) {
  Parser p{Parser::WithoutTopLevel{}};
  p.add_fence();
  config::Options& o = p.o;
  if (words.empty()) throw UsageError("fence: missing guard (file, redis or sql)");
  std::string_view guard = words.front();
  const bool help_next = words.size() > 1 && is_help_word(words[1]);
  CLI::App* app = nullptr;
  std::string command = "fence";
  if (is_help_word(guard) || guard == "help") {
    // `fence --help`, `fence help`
  } else if (guard == "file") {
    app = p.fence_file, o.fence_guard = config::FenceGuard::file;
  } else if (guard == "redis") {
    app = p.fence_redis, o.fence_guard = config::FenceGuard::redis;
  } else if (guard == "sql") {
    app = p.fence_sql, o.fence_guard = config::FenceGuard::sql;
  } else if (!help_next) {
    throw UsageError("fence: unknown guard '" + std::string(guard) + "' (expected file, redis or sql)");
  }
  if (!app) {
    o.subcommand = config::Subcommand::help;
    o.help_text = fence_help();
    return o;
  }
  command += " " + std::string(guard);
  const std::string prefix = command + ": ";

  // Options, and their values, up to `--`; for `fence redis` also up to the first other word, which
  // starts CMD. Those words, and every word after the `--`, are operands (PATH, the dialect) or CMD,
  // untouched: CLI11 sees only the options.
  const bool has_command = o.fence_guard == config::FenceGuard::redis;
  std::vector<std::string> before = {"fence", std::string(guard)};
  std::vector<std::string> operands;
  bool help = false;
  std::size_t i = 1;
  for (; i < words.size(); ++i) {
    std::string_view a = words[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (!is_option_word(a)) {
      if (has_command) break;
      operands.emplace_back(a);
      continue;
    }
    help = help || is_help_word(a);
    bool takes_value = false;
    try {
      takes_value = check_option(a, {app});
    } catch (const UsageError& e) {
      throw UsageError(prefix + e.what());
    }
    before.emplace_back(a);
    if (takes_value && i + 1 < words.size()) before.emplace_back(words[++i]);
  }
  for (; i < words.size(); ++i) (has_command ? o.command : operands).emplace_back(words[i]);
  if (help) {
    o = config::Options{};
    o.subcommand = config::Subcommand::help;
    o.help_text = help_text(command);
    return o;
  }

  p.parse(before, prefix);
  o.subcommand = config::Subcommand::fence;
  o.fence_operands = std::move(operands);
  return o;
}

config::Options parse(int argc, const char* const* argv) {
  // `fencerun --version` and `fencerun --help` alone are answered without building the parser (its
  // dozens of options cost more than the rest of the start-up). A single word is no option's value,
  // so the answer is the one the full scan below would give.
  if (argc == 2) {
    std::string_view only = argv[1];
    if (only == "--version" || is_help_word(only)) {
      config::Options o;
      o.subcommand = only == "--version" ? config::Subcommand::version : config::Subcommand::help;
      if (o.subcommand == config::Subcommand::help) o.help_text = help_text();
      return o;
    }
  }
  if (argc > 1 && std::string_view(argv[1]) == "fence") {
    std::vector<std::string_view> words(argv + 2, argv + argc);
    try {
      return parse_fence(words);
    } catch (const UsageError& e) {
      throw UsageError(e.what() + std::string(k_fence_hint));
    }
  }

  Parser p;  // `fence` only as the first word (above): elsewhere it is a lock NAME
  config::Options& o = p.o;
  // An option word is looked up in the top-level command first; one it does not know is looked up
  // again, and reported, with status and acl added (their options may come before their name).
  std::vector<const CLI::App*> scope = {&p.app};
  auto takes_value = [&](std::string_view word) {
    if (!p.status) {
      try {
        return check_option(word, scope);
      } catch (const UsageError&) {
        p.add_status_and_acl();
        scope = {&p.app, p.status, p.acl, p.list, p.break_lock, p.bump};
      }
    }
    return check_option(word, scope);
  };
  // Options end at the command, as with flock(1), timeout(1) and env(1): options (and their values)
  // are read up to NAME and after it, until `--` or the first other word; that word and everything
  // after it are the COMMAND, untouched. CLI11 sees only what comes before (it would re-interpret
  // the command's arguments).
  std::vector<std::string> before;
  int i = 1;
  bool saw_separator = false;
  bool first_word = true;
  bool have_name = false;
  bool other_subcommand = false;  // status, acl: no COMMAND, every word is theirs
  for (; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") {
      saw_separator = true;
      ++i;
      break;
    }
    if (is_option_word(a)) {
      before.emplace_back(a);
      if (!other_subcommand && takes_value(a) && i + 1 < argc) before.emplace_back(argv[++i]);
      continue;
    }
    if (first_word) {
      first_word = false;
      const bool admin = a == "status" || a == "acl" || a == "list" || a == "break" || a == "bump";
      if (admin) other_subcommand = true, p.add_status_and_acl();
      if (a == "run") p.add_run();
      if (admin || a == "run") {
        before.emplace_back(a);
        continue;
      }
    }
    if (other_subcommand || !have_name) {
      have_name = !other_subcommand;
      before.emplace_back(a);
      continue;
    }
    break;  // the first word after NAME: the command starts here
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);

  bool version = false;
  for (const auto& a : before) {
    if (a == "-h" || a == "--help") {
      o.subcommand = config::Subcommand::help;
      o.help_text = help_text();
      return o;
    }
    version = version || a == "--version";
  }

  p.parse(before, "");
  if (version) {
    // With a server named (-r), --version also says what that server is.
    o.subcommand = config::Subcommand::version;
    return o;
  }
  if (p.acl && p.acl->parsed()) {
    o.subcommand = config::Subcommand::acl;
    if (saw_separator) throw UsageError("acl takes no COMMAND");
  } else if (p.list && (p.list->parsed() || p.break_lock->parsed() || p.bump->parsed())) {
    const std::string_view which = p.list->parsed() ? "list" : p.break_lock->parsed() ? "break" : "bump";
    o.subcommand = p.list->parsed()         ? config::Subcommand::list
                   : p.break_lock->parsed() ? config::Subcommand::break_lock
                                            : config::Subcommand::bump;
    if (saw_separator) throw UsageError(std::string(which) + " takes no COMMAND");
  } else if (p.status && p.status->parsed()) {
    o.subcommand = config::Subcommand::status;
    if (saw_separator)
      throw UsageError("status takes no COMMAND (to run a command under a lock named 'status': "
                       "fencerun run status -- COMMAND)");
  } else {
    o.subcommand = config::Subcommand::run;
    if (!saw_separator && o.command.empty() && !o.lock_name.empty()) {
      if (o.lock_name == "help") throw UsageError("for help, run 'fencerun --help'");
      throw UsageError("missing COMMAND (fencerun [OPTIONS] NAME [--] COMMAND [ARG...])");
    }
  }
  return o;
}

}  // namespace fencerun::cli
