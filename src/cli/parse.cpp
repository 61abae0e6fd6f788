#include "cli/parse.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "util/error.hpp"

namespace fencerun::cli {
namespace {

using config::Options;

// ---- The grammar: one table of commands, one of options. The scan (which word is which command,
// how what follows it is read), every help text (each command's, the list of commands in
// `fencerun --help`, `help CMD`), help_commands() and declared_options() are built from these two
// tables, so they cannot disagree.

// Commands, as bits: an option lists the commands that take it.
enum Command : unsigned {
  k_run = 1u << 0,
  k_status = 1u << 1,
  k_list = 1u << 2,
  k_break = 1u << 3,
  k_bump = 1u << 4,
  k_acl = 1u << 5,
  k_fence = 1u << 6,  // `fence` without a guard: only its help
  k_fence_file = 1u << 7,
  k_fence_redis = 1u << 8,
  k_fence_sql = 1u << 9,
  k_version = 1u << 10,  // `fencerun [-r URL] --version`
  k_history = 1u << 11,
  k_help = 1u << 12,  // `fencerun help [COMMAND...]`: takes no option of its own
};
constexpr unsigned k_every = (1u << 13) - 1;
// Commands that talk to a lock server: they take the connection options.
constexpr unsigned k_server =
    k_run | k_status | k_list | k_break | k_bump | k_history | k_fence_redis | k_version;
// Every command that does something takes the logging options.
constexpr unsigned k_logging = k_every & ~(k_fence | k_help);

// How the scan reads a command's words.
enum class Form {
  top,      // "": fencerun itself, no word; only its help (the scan starts without a command)
  run,      // a word: options, NAME, COMMAND
  admin,    // a word: options and at most one operand, no COMMAND
  fence,    // a word followed by a guard
  guard,    // the word after `fence`: options and operands (for fence redis: CMD)
  help,     // a word: `help [COMMAND...]`
  version,  // the option --version
};

struct CommandSpec;
using HelpFn = std::string (*)(const CommandSpec&);

struct CommandSpec {
  unsigned bit;               // 0 for the top level
  std::string_view name;      // as typed: "status", "fence redis"; "" the top level
  std::string_view operands;  // after the name in the list of `fencerun --help`: "NAME --above N"
  std::string_view summary;   // one line
  Form form;
  config::Subcommand subcommand;
  config::FenceGuard guard;
  unsigned options;           // whose options it takes: its own bit, or (top level) run's and --version's
  HelpFn help;                // its help text; nullptr: none
};

std::string top_help(const CommandSpec&);
std::string run_help(const CommandSpec&);
std::string status_help(const CommandSpec&);
std::string list_help(const CommandSpec&);
std::string break_help(const CommandSpec&);
std::string bump_help(const CommandSpec&);
std::string history_help(const CommandSpec&);
std::string acl_help(const CommandSpec&);
std::string fence_help(const CommandSpec&);
std::string fence_file_help(const CommandSpec&);
std::string fence_redis_help(const CommandSpec&);
std::string fence_sql_help(const CommandSpec&);

using config::FenceGuard;
using config::Subcommand;

// Every command, once. The words (forms run, admin, fence, help) are listed in `fencerun --help` in
// this order, and are the words a misspelt first word is compared with; the commands with a help
// are help_commands(), in this order.
// clang-format off
constexpr std::array k_commands = {
  CommandSpec{0, "", "", "run COMMAND under a lock (NAME is the first word)",
              Form::top, Subcommand::run, FenceGuard::none, k_run | k_version, top_help},
  CommandSpec{k_run, "run", "NAME COMMAND...", "the same, explicitly (any NAME)",
              Form::run, Subcommand::run, FenceGuard::none, k_run, run_help},
  CommandSpec{k_status, "status", "NAME", "is the lock held, by whom, its last token",
              Form::admin, Subcommand::status, FenceGuard::none, k_status, status_help},
  CommandSpec{k_list, "list", "[PATTERN]", "held locks (the server needs SCAN)",
              Form::admin, Subcommand::list, FenceGuard::none, k_list, list_help},
  CommandSpec{k_break, "break", "NAME", "delete a lock and its waiter queue",
              Form::admin, Subcommand::break_lock, FenceGuard::none, k_break, break_help},
  CommandSpec{k_bump, "bump", "NAME --above N", "raise a token counter",
              Form::admin, Subcommand::bump, FenceGuard::none, k_bump, bump_help},
  CommandSpec{k_history, "history", "NAME", "the recorded runs of NAME, newest first",
              Form::admin, Subcommand::history, FenceGuard::none, k_history, history_help},
  CommandSpec{k_acl, "acl", "", "print the least-privilege Redis ACL rule",
              Form::admin, Subcommand::acl, FenceGuard::none, k_acl, acl_help},
  CommandSpec{k_fence, "fence", "", "resource-side guards that check the token",  // operands: the guards
              Form::fence, Subcommand::fence, FenceGuard::none, k_fence, fence_help},
  CommandSpec{k_fence_file, "fence file", "PATH", "replace a file from stdin, rejecting stale tokens",
              Form::guard, Subcommand::fence, FenceGuard::file, k_fence_file, fence_file_help},
  CommandSpec{k_fence_redis, "fence redis", "CMD...", "run a Redis command, rejecting stale tokens",
              Form::guard, Subcommand::fence, FenceGuard::redis, k_fence_redis, fence_redis_help},
  CommandSpec{k_fence_sql, "fence sql", "DIALECT", "print the schema of a SQL guard",
              Form::guard, Subcommand::fence, FenceGuard::sql, k_fence_sql, fence_sql_help},
  CommandSpec{k_help, "help", "SUBCOMMAND", "the help of a subcommand (also SUBCOMMAND --help)",
              Form::help, Subcommand::help, FenceGuard::none, k_help, nullptr},
  CommandSpec{k_version, "--version", "", "show the version",
              Form::version, Subcommand::version, FenceGuard::none, k_version, nullptr},
};
// clang-format on

// A word typed as a command (`status`, `help`), not the top level, a guard or --version.
constexpr bool is_word(const CommandSpec& c) {
  return c.form == Form::run || c.form == Form::admin || c.form == Form::fence || c.form == Form::help;
}

const CommandSpec& command_spec(unsigned bit) {
  for (const auto& c : k_commands)
    if (c.bit == bit) return c;
  return k_commands.front();
}

// A guard's word: "redis" of "fence redis".
std::string_view guard_word(const CommandSpec& c) { return c.name.substr(c.name.find(' ') + 1); }

// "a, b or c" (last = " or "), "a, b and c".
std::string join(const std::vector<std::string_view>& names, std::string_view last) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += std::string(i == 0 ? "" : i + 1 == names.size() ? last : ", ") + std::string(names[i]);
  return out;
}

// The guards' words: file, redis, sql.
std::vector<std::string_view> guard_words() {
  std::vector<std::string_view> out;
  for (const auto& c : k_commands)
    if (c.form == Form::guard) out.push_back(guard_word(c));
  return out;
}

// Sets the option in Options; `typed` is the name as the user wrote it (for messages).
using Setter = void (*)(Options&, std::string_view typed, std::string_view value);

struct OptionSpec {
  char short_name;             // 0: none
  std::string_view long_name;  // without the dashes
  std::string_view value;      // the value's name in the help; empty for a flag
  unsigned commands;
  Setter set;                  // nullptr: -h/--help and --version, handled by the scan
  std::string_view help;       // lines separated by '\n'
  std::string_view alias = {}; // another long name of the same option (--redis of --server)
};

std::string s(std::string_view v) { return std::string(v); }

// A whole number for an int option, with a message naming the option and what it expects.
int int_value(std::string_view typed, std::string_view v, std::string_view expected) {
  int n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc{} || end != v.data() + v.size())
    throw UsageError(s(typed) + ": '" + s(v) + "' is not " + s(expected));
  return n;
}

constexpr std::string_view k_exit_code = "an exit code (0-255)";

// clang-format off
constexpr std::array k_options = {
  OptionSpec{'r', "server", "URL", k_server,
    [](Options& o, std::string_view typed, std::string_view v) {
      if (v.empty())
        throw UsageError(s(typed) + " is empty (an unset variable?): give a URL, or leave " + s(typed) +
                         " out to use $FENCERUN_SERVER, $FENCERUN_REDIS_URL, $REDIS_URL or "
                         "redis://127.0.0.1:6379");
      o.redis_urls.emplace_back(v);
      // Messages about the URL name the spelling given (-r is short for both).
      if (typed.find("server") != std::string_view::npos) o.server_option = "--server";
    },
    "where the locks live. Redis:\n"
    "redis://[[user]:password@]host[:port][/db][?db=N];\n"
    "rediss://... (TLS); unix:///PATH[?db=N];\n"
    "redis+sentinel://host:port[,host:port...]/MASTER\n"
    "[?db=N][&sentinel_user=U] (rediss+sentinel:// for\n"
    "TLS); a Redis Cluster node works as redis://. etcd:\n"
    "etcd://[user[:password]@]host[:port][,host[:port]\n"
    "...] (etcds:// for TLS), a cluster's members in one\n"
    "URL. Quorum mode: -r given 3, 5 or 7 times, Redis\n"
    "servers independent of each other (run, status,\n"
    "list). Default: $FENCERUN_SERVER, else\n"
    "$FENCERUN_REDIS_URL, else $REDIS_URL, else\n"
    "redis://127.0.0.1:6379",
    "redis"},
  OptionSpec{'t', "ttl", "DUR", k_run, [](Options& o, std::string_view, std::string_view v) { o.ttl = v; },
    "lease length (default: 30s)"},
  OptionSpec{0, "renew", "DUR", k_run, [](Options& o, std::string_view, std::string_view v) { o.renew = s(v); },
    "renewal interval (default: ttl/3)"},
  OptionSpec{0, "grace", "DUR", k_run, [](Options& o, std::string_view, std::string_view v) { o.grace = s(v); },
    "time between the kill signal and SIGKILL\n(default: min(5s, ttl/6))"},
  OptionSpec{0, "kill-signal", "SIG", k_run,
    [](Options& o, std::string_view, std::string_view v) { o.kill_signal = v; },
    "first signal sent to the command when the lease is\nlost or runs short (default: TERM)"},
  OptionSpec{'w', "wait", "DUR", k_run, [](Options& o, std::string_view, std::string_view v) { o.wait = v; },
    "wait this long for a busy lock; 'inf' (also\n'infinity', 'forever') waits forever (default: 0)"},
  OptionSpec{0, "fair", "", k_run, [](Options& o, std::string_view, std::string_view) { o.fair = true; },
    "waiters acquire in the order they began waiting"},
  OptionSpec{0, "limit", "N", k_run, [](Options& o, std::string_view, std::string_view v) { o.limit = v; },
    "up to N holders at once, each in a slot of its own\n(FENCERUN_SLOT, 0..N-1); 1 to 1024 (default: 1)"},
  OptionSpec{'E', "conflict-exit-code", "N", k_run,
    [](Options& o, std::string_view, std::string_view v) {
      o.conflict_exit_code = int_value("--conflict-exit-code", v, k_exit_code);
    },
    "exit code when the lock is busy or the wait ran out\n(default: 75)"},
  OptionSpec{0, "lease-lost-exit-code", "N", k_run,
    [](Options& o, std::string_view, std::string_view v) {
      o.lease_lost_exit_code = int_value("--lease-lost-exit-code", v, k_exit_code);
    },
    "exit code when the lease was lost and the command was\nstopped (default: 124)"},
  OptionSpec{0, "min-interval", "DUR", k_run,
    [](Options& o, std::string_view, std::string_view v) { o.min_interval = s(v); },
    "do not start COMMAND when the last successful run of\n"
    "NAME started less than DUR ago (server time); exit\n"
    "with --skip-exit-code instead"},
  OptionSpec{0, "every", "DUR", k_run, [](Options& o, std::string_view, std::string_view v) { o.every = s(v); },
    "once per slot of DUR (server time): do not start\n"
    "COMMAND when a success is recorded for the slot this\n"
    "trigger fired in; exit with --skip-exit-code instead"},
  OptionSpec{0, "slot-offset", "DUR", k_run,
    [](Options& o, std::string_view, std::string_view v) { o.slot_offset = s(v); },
    "--every: slots start DUR after each multiple of the\nperiod since the epoch (default: 0)"},
  OptionSpec{0, "if-record-lost", "run|skip", k_run,
    [](Options& o, std::string_view, std::string_view v) { o.if_record_lost = s(v); },
    "when NAME's record of runs is missing on the server\n"
    "(lost with its data, or never started): run anyway\n"
    "(default), or skip: run nothing until one run without\n"
    "it starts the record"},
  OptionSpec{0, "lock-delay", "DUR", k_run,
    [](Options& o, std::string_view, std::string_view v) { o.lock_delay = s(v); },
    "etcd: when the last holder vanished (its lease\n"
    "revoked or expired, or broken) during its run, wait\n"
    "DUR before starting (default: its TTL; 0: at once)"},
  OptionSpec{0, "skip-exit-code", "N", k_run,
    [](Options& o, std::string_view, std::string_view v) {
      o.skip_exit_code = int_value("--skip-exit-code", v, k_exit_code);
    },
    "exit code when --every or --min-interval skips the\nrun (default: 0; not the busy code)"},
  OptionSpec{0, "records-ttl", "DUR", k_run,
    [](Options& o, std::string_view, std::string_view v) { o.records_ttl = s(v); },
    "how long the record of NAME's runs is kept after its\nlast run (default: 720h, 30 days)"},
  OptionSpec{0, "keep-runs", "N", k_run,
    [](Options& o, std::string_view, std::string_view v) { o.keep_runs = s(v); },
    "how many runs of NAME the record keeps, 1 to 1000\n(default: 20)"},
  OptionSpec{0, "timeout", "DUR", k_server, [](Options& o, std::string_view, std::string_view v) { o.timeout = v; },
    "bound on connecting and on each request to the\nserver (default: 2s)"},
  OptionSpec{0, "key-prefix", "STR", k_server | k_acl,
    [](Options& o, std::string_view typed, std::string_view v) {
      if (v.empty())
        throw UsageError(s(typed) + " is empty: fencerun's keys need a prefix of their own (default: fencerun:)");
      o.key_prefix = v;
    },
    "prefix of every key and channel fencerun uses\n(default: fencerun:)"},
  OptionSpec{0, "shell", "", k_run, [](Options& o, std::string_view, std::string_view) { o.shell = true; },
    "run COMMAND (one string) with /bin/sh -c"},
  OptionSpec{0, "metrics-file", "PATH", k_run,
    [](Options& o, std::string_view, std::string_view v) { o.metrics_file = s(v); },
    "after the run, write a Prometheus textfile there"},
  OptionSpec{0, "min-replicas", "N", k_run,
    [](Options& o, std::string_view, std::string_view v) {
      o.min_replicas = int_value("--min-replicas", v, "a whole number");
    },
    "count the lock as acquired only once N replicas\n"
    "confirm it (WAIT); otherwise release it and exit 69\n"
    "(default: 0)"},
  OptionSpec{0, "replica-timeout", "DUR", k_run,
    [](Options& o, std::string_view, std::string_view v) { o.replica_timeout = v; },
    "how long to wait for those replicas (default: 1s)"},
  OptionSpec{0, "tls-ca-file", "FILE", k_server,
    [](Options& o, std::string_view, std::string_view v) { o.tls_ca_file = v; },
    "CA certificates to verify the server with\n(default: the system store)"},
  OptionSpec{0, "tls-cert", "FILE", k_server, [](Options& o, std::string_view, std::string_view v) { o.tls_cert = v; },
    "client certificate (mutual TLS)"},
  OptionSpec{0, "tls-key", "FILE", k_server, [](Options& o, std::string_view, std::string_view v) { o.tls_key = v; },
    "key of the client certificate\n(default: in --tls-cert)"},
  OptionSpec{0, "tls-server-name", "NAME", k_server,
    [](Options& o, std::string_view, std::string_view v) { o.tls_server_name = v; },
    "name to verify in the server certificate\n(default: the host)"},
  OptionSpec{0, "tls-insecure", "", k_server,
    [](Options& o, std::string_view, std::string_view) { o.tls_insecure = true; },
    "do not verify the server certificate (warns)"},
  OptionSpec{'n', "count", "N", k_history,
    [](Options& o, std::string_view, std::string_view v) { o.history_count = s(v); },
    "show the newest N runs (default: all kept)"},
  OptionSpec{0, "json", "", k_status | k_list | k_history, [](Options& o, std::string_view, std::string_view) { o.json = true; },
    "print JSON"},
  OptionSpec{0, "utc", "", k_history, [](Options& o, std::string_view, std::string_view) { o.utc = true; },
    "times in UTC (default: the local time zone)"},
  OptionSpec{0, "all", "", k_list | k_history, [](Options& o, std::string_view, std::string_view) { o.list_all = true; },
    "list: also free locks that have issued tokens;\nhistory: also the skipped and busy triggers"},
  OptionSpec{0, "owner", "PREFIX", k_break,
    [](Options& o, std::string_view, std::string_view v) { o.break_owner = s(v); },
    "only the holder whose owner id starts with PREFIX\n(8 to 32 hex digits, as status shows)"},
  OptionSpec{'y', "yes", "", k_break, [](Options& o, std::string_view, std::string_view) { o.yes = true; },
    "do not ask (required without a terminal)"},
  OptionSpec{0, "above", "N", k_bump,
    [](Options& o, std::string_view, std::string_view v) { o.bump_above = s(v); },
    "raise the token counter so that the next token is\ngreater than N (below 2^53; tokens cannot be lowered)"},
  OptionSpec{0, "delex", "", k_acl, [](Options& o, std::string_view, std::string_view) { o.acl_delex = true; },
    "also allow DELEX (Redis 8.4 and later)"},
  OptionSpec{0, "delifeq", "", k_acl, [](Options& o, std::string_view, std::string_view) { o.acl_delifeq = true; },
    "also allow DELIFEQ (Valkey 9.0 and later)"},
  OptionSpec{0, "admin", "", k_acl, [](Options& o, std::string_view, std::string_view) { o.acl_admin = true; },
    "also allow what list sends (SCAN, CLUSTER NODES);\nbreak and bump need nothing more than the run rule"},
  OptionSpec{0, "resource", "R", k_fence_redis,
    [](Options& o, std::string_view, std::string_view v) { o.fence_resource = s(v); },
    "the resource (default: $FENCERUN_LOCK)"},
  OptionSpec{0, "token", "N", k_fence_file | k_fence_redis,
    [](Options& o, std::string_view, std::string_view v) { o.fence_token = s(v); },
    "fencing token, a positive integer below 2^53\n(default: $FENCERUN_TOKEN)"},
  OptionSpec{0, "read", "", k_fence_file, [](Options& o, std::string_view, std::string_view) { o.fence_read = true; },
    "admit the token and print PATH instead of writing"},
  OptionSpec{'v', "verbose", "", k_logging,
    [](Options& o, std::string_view, std::string_view) { ++o.verbosity; },
    "log more (repeat for debug)"},
  OptionSpec{'q', "quiet", "", k_logging, [](Options& o, std::string_view, std::string_view) { --o.verbosity; },
    "log errors only"},
  OptionSpec{0, "log-format", "FMT", k_logging,
    [](Options& o, std::string_view, std::string_view v) { o.log_format = v; },
    "text or json (default: text)"},
  OptionSpec{'h', "help", "", k_every, nullptr, "show this help and exit"},
  OptionSpec{0, "version", "", k_version, nullptr,
    "show the version and exit (with -r: also the\nserver's name, version and release path)"},
};
// clang-format on

const OptionSpec* find_long(std::string_view name) {
  for (const auto& spec : k_options)
    if (spec.long_name == name || (!spec.alias.empty() && spec.alias == name)) return &spec;
  return nullptr;
}

const OptionSpec* find_short(char c) {
  for (const auto& spec : k_options)
    if (spec.short_name == c) return &spec;
  return nullptr;
}

bool is_option_word(std::string_view a) { return a.size() > 1 && a[0] == '-' && a != "--"; }

// Optimal string alignment distance (Levenshtein plus the swap of two neighbours), for "did you mean";
// a changed letter costs `substitution`.
std::size_t distance(std::string_view a, std::string_view b, std::size_t substitution = 1) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t change = a[i - 1] == b[j - 1] ? 0 : substitution;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + change});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// A first word close enough to a subcommand to be a typo of it (case ignored): a letter added or
// dropped, two neighbours swapped (`lsit`, `stauts`, `fnce`), or, from five letters on, its letters
// in another order (`brake`). A changed letter does not count: it makes ordinary words of the
// subcommands (lost, last, dump, gun), which are lock names, and neither does a subcommand with
// letters after it (fenced, runs). nullopt when none is.
std::optional<std::string_view> misspelt_subcommand(std::string_view word) {
  // A lock name with digits or punctuation (job1, acl-sync) is no typo of a word.
  if (!std::ranges::all_of(word, [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }))
    return std::nullopt;
  std::string lower(word);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string sorted_word = lower;
  std::ranges::sort(sorted_word);
  for (const auto& c : k_commands) {
    if (!is_word(c)) continue;
    const std::string_view sub = c.name;
    if (lower.size() > sub.size() && lower.starts_with(sub)) continue;  // fenced, runs: a word of its own
    if (distance(lower, sub, 2) <= 1) return sub;
    std::string sorted_sub(sub);
    std::ranges::sort(sorted_sub);
    if (sub.size() >= 5 && sorted_sub == sorted_word) return sub;
  }
  if (distance(lower, "version", 2) <= 1) return "--version";
  return std::nullopt;
}

// "run", "status and list", "run, status, list and fence redis": the commands in `mask`.
std::string command_list(unsigned mask) {
  std::vector<std::string_view> names;
  for (const auto& c : k_commands)
    if ((mask & c.bit) && c.form != Form::version && c.form != Form::help) names.push_back(c.name);
  return join(names, " and ");
}

// The scan of one command line, word by word.
class Scan {
 public:
  explicit Scan(std::span<const std::string_view> words) : m_words(words) {}

  Options run_scan(unsigned start_command) {
    if (start_command == 0) scan_top();
    else m_command = start_command, m_explicit = true;
    if (m_help_word) return help_for(m_help_words);
    if (command_spec(m_command).form == Form::fence) scan_fence();  // m_command: the guard, if any
    switch (command_spec(m_command).form) {
      case Form::run: return scan_run();
      case Form::admin: return scan_admin();
      case Form::version: return finish_version();
      default: return scan_guard();  // a guard, or fence without one (its help)
    }
  }

 private:
  std::span<const std::string_view> m_words;
  std::size_t m_i = 0;
  Options m_o;
  unsigned m_command = 0;
  bool m_explicit = false;  // the subcommand word was typed (`run NAME`)
  bool m_help = false;
  bool m_version = false;
  bool m_help_word = false;  // `fencerun help [COMMAND...]`
  std::vector<std::string_view> m_help_words;
  // Every option taken, as typed, to check against the command once it is known.
  std::vector<std::pair<std::string, const OptionSpec*>> m_seen;

  bool at_end() const { return m_i >= m_words.size(); }
  std::string_view word() const { return m_words[m_i]; }

  std::string prefix() const {
    if (m_command == 0 || m_command == k_run || m_command == k_version) return "";
    return s(command_spec(m_command).name) + ": ";
  }

  // A usage error, prefixed with the subcommand ("status: ..."); parse() then adds where its help
  // is (the top level's "(see fencerun --help)" comes from main).
  [[noreturn]] void fail(const std::string& message) const {
    throw UsageError(prefix() + message);
  }

  // The closest option name to `name` (a long option, with its dashes) among those the command
  // (or, before it is known, any command) takes.
  std::string suggestion(std::string_view name) const {
    const unsigned scope = m_command && m_command != k_fence ? m_command : k_every;
    std::string best;
    std::size_t best_distance = 3;
    for (const auto& spec : k_options) {
      if (!(spec.commands & scope)) continue;
      for (std::string_view long_name : {spec.long_name, spec.alias}) {
        if (long_name.empty()) continue;
        std::string candidate = "--" + s(long_name);
        std::size_t d = distance(name, candidate);
        if (d < best_distance) best_distance = d, best = candidate;
      }
    }
    return best.empty() ? "" : ", did you mean '" + best + "'?";
  }

  void take(const OptionSpec& spec, std::string typed, std::string_view value) {
    if (!spec.set) {
      (spec.long_name == "help" ? m_help : m_version) = true;
    } else if (!m_help) {  // with --help, no value is checked
      spec.set(m_o, typed, value);
    }
    m_seen.emplace_back(std::move(typed), &spec);
  }

  std::string missing_value(const OptionSpec& spec, std::string_view typed) const {
    return s(typed) + " needs a value (" + s(spec.value) + ")";
  }

  // The option word at m_i (and its value): `--name`, `--name=value`, `--name value`, `-abc`
  // (flags), `-tVALUE`, `-t VALUE`.
  void take_option() {
    std::string_view a = word();
    ++m_i;
    if (a.starts_with("--")) {
      const std::size_t eq = a.find('=');
      const std::string_view name = a.substr(0, eq);
      const OptionSpec* spec = find_long(name.substr(2));
      if (!spec) fail("unrecognized option '" + s(name) + "'" + suggestion(name));
      if (spec->value.empty()) {
        if (eq != std::string_view::npos) fail(s(name) + " takes no value, got '" + s(a.substr(eq + 1)) + "'");
        take(*spec, s(name), {});
        return;
      }
      if (eq != std::string_view::npos) return take(*spec, s(name), a.substr(eq + 1));
      if (at_end()) fail(missing_value(*spec, name));
      take(*spec, s(name), m_words[m_i++]);
      return;
    }
    for (std::size_t k = 1; k < a.size(); ++k) {
      const OptionSpec* spec = find_short(a[k]);
      const std::string typed = "-" + std::string(1, a[k]);
      if (!spec) fail("invalid option -- '" + std::string(1, a[k]) + "'");
      if (spec->value.empty()) {
        take(*spec, typed, {});
        continue;
      }
      if (k + 1 < a.size()) return take(*spec, typed, a.substr(k + 1));
      if (at_end()) fail(missing_value(*spec, typed));
      return take(*spec, typed, m_words[m_i++]);
    }
  }

  // Options before the first word, then the subcommand word, if any.
  void scan_top() {
    while (!at_end() && is_option_word(word())) take_option();
    if (at_end() || word() == "--") {
      m_command = m_version ? k_version : k_run;
      return;
    }
    const std::string_view first = word();
    for (const auto& c : k_commands) {
      if (!is_word(c) || c.name != first) continue;
      ++m_i;
      if (c.form == Form::help) {
        m_help_word = true;
        m_help_words.assign(m_words.begin() + static_cast<std::ptrdiff_t>(m_i), m_words.end());
        return;
      }
      m_command = c.bit, m_explicit = true;
      return;
    }
    if (m_version) fail("--version takes no NAME or COMMAND, got '" + s(first) + "'");
    if (auto sub = misspelt_subcommand(first)) {
      if (*sub == "--version")
        fail("'" + s(first) + "' is not a subcommand: for the version, run 'fencerun --version' (to run a command "
             "under a lock of that name: fencerun run " + s(first) + " ...)");
      fail("'" + s(first) + "' is not a subcommand: did you mean '" + s(*sub) +
           "'? (to run a command under a lock of that name: fencerun run " + s(first) + " ...)");
    }
    m_command = k_run;  // the first word is a NAME
  }

  // Every option taken must be one the command takes.
  void check_options() const {
    const CommandSpec& c = command_spec(m_command);
    for (const auto& [typed, spec] : m_seen) {
      if (spec->commands & m_command) continue;
      if (spec->commands == k_version)
        throw UsageError("--version is not an option of " + s(c.name) +
                         ": give it alone (fencerun [-r URL] --version)");
      const std::string where = command_list(spec->commands & ~k_version);
      const std::string name = m_command == k_version ? "--version" : s(c.name);
      throw UsageError(name + " does not take " + typed + (where.empty() ? "" : " (an option of " + where + ")") +
                       "; see fencerun " + (m_command == k_version ? "" : name + " ") + "--help");
    }
  }

  Options help_of(std::string_view command) {
    Options o;
    o.subcommand = config::Subcommand::help;
    o.help_text = help_text(command);
    return o;
  }

  Options help_for(std::span<const std::string_view> words) {
    std::string command;
    for (std::string_view w : words) command += (command.empty() ? "" : " ") + s(w);
    if (command.empty()) return help_of("");
    const std::string text = help_text(command);
    if (text.empty()) {
      std::vector<std::string_view> names;
      for (const auto& c : k_commands)
        if (c.help && !c.name.empty()) names.push_back(c.name);
      throw UsageError("help: no help for '" + command + "' (commands: " + join(names, ", ") + ")");
    }
    return help_of(command);
  }

  Options finish_version() {
    if (m_help) return help_of("");
    check_options();
    m_o.subcommand = config::Subcommand::version;
    return std::move(m_o);
  }

  Options scan_run() {
    // Options end at the command, as with flock(1), timeout(1) and env(1): options (and their
    // values) are read up to NAME and after it, until `--` or the first other word; that word and
    // everything after it are the COMMAND, untouched.
    bool have_name = false;
    while (!at_end()) {
      std::string_view a = word();
      if (a == "--") {
        ++m_i;
        break;
      }
      if (is_option_word(a)) {
        take_option();
        continue;
      }
      if (have_name) break;
      have_name = true;
      m_o.lock_name = a;
      ++m_i;
    }
    for (; !at_end(); ++m_i) m_o.command.emplace_back(word());
    if (m_help) return help_of(m_explicit ? "run" : "");
    if (m_version && !m_explicit && !have_name) {
      m_command = k_version;
      return finish_version();
    }
    check_options();
    m_o.subcommand = config::Subcommand::run;
    if (!have_name || m_o.lock_name.empty()) throw UsageError("missing lock NAME" + std::string(k_run_usage));
    if (m_o.command.empty()) throw UsageError("missing COMMAND" + std::string(k_run_usage));
    return std::move(m_o);
  }

  static constexpr std::string_view k_run_usage = " (usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...])";

  // status, list, break, bump, acl: options and operands, in any order; no COMMAND.
  Options scan_admin() {
    const std::string name = s(command_spec(m_command).name);
    std::vector<std::string> operands;
    for (; !at_end();) {
      std::string_view a = word();
      if (a == "--") {
        throw UsageError(name + " takes no COMMAND (to run a command under a lock named '" + name +
                         "': fencerun run " + name + " -- COMMAND)");
      }
      if (is_option_word(a)) {
        take_option();
        continue;
      }
      operands.emplace_back(a);
      ++m_i;
    }
    if (m_help) return help_of(name);
    check_options();
    const CommandSpec& c = command_spec(m_command);
    // The operand, from the table: "NAME", "[PATTERN]", "NAME --above N"; none for acl.
    const std::size_t most = c.operands.empty() ? 0 : 1;
    std::string_view what = c.operands.substr(0, c.operands.find(' '));
    if (what.starts_with('[')) what = what.substr(1, what.size() - 2);
    if (operands.size() > most) {
      if (most == 0)
        throw UsageError(name + " takes no NAME, got '" + operands.front() + "'; see fencerun " + name + " --help");
      throw UsageError(name + " takes one " + s(what) + ", got " + std::to_string(operands.size()) + " words ('" +
                       operands[0] + "', '" + operands[1] + "'); see fencerun " + name + " --help");
    }
    m_o.subcommand = c.subcommand;
    if (!operands.empty()) {
      if (m_command == k_list) m_o.list_pattern = operands.front();
      else m_o.lock_name = operands.front();
    }
    return std::move(m_o);
  }

  // `fence` is followed by its guard; options before the guard are the guard's.
  void scan_fence() {
    while (!at_end() && is_option_word(word())) take_option();
    if (at_end()) {
      if (m_help) return;  // `fence --help`
      fail("missing guard (" + join(guard_words(), " or ") + ")");
    }
    std::string_view guard = word();
    if (guard == "help") {
      m_help = true;
      m_i = m_words.size();
      return;
    }
    for (const auto& c : k_commands) {
      if (c.form == Form::guard && guard_word(c) == guard) {
        m_command = c.bit;
        ++m_i;
        return;
      }
    }
    // `fence nonsense --help` is still fence's help.
    if (std::ranges::any_of(m_words.subspan(m_i), [](std::string_view w) { return w == "-h" || w == "--help"; })) {
      m_help = true;
      m_i = m_words.size();
      return;
    }
    fail("unknown guard '" + s(guard) + "' (expected " + join(guard_words(), " or ") + ")");
  }

  // fence file, fence redis, fence sql.
  Options scan_guard() {
    if (command_spec(m_command).form == Form::fence) return help_of("fence");
    const bool has_command = m_command == k_fence_redis;
    std::vector<std::string> operands;
    while (!at_end()) {
      std::string_view a = word();
      if (a == "--") {
        ++m_i;
        break;
      }
      if (is_option_word(a)) {
        take_option();
        continue;
      }
      if (has_command) break;
      operands.emplace_back(a);
      ++m_i;
    }
    for (; !at_end(); ++m_i) (has_command ? m_o.command : operands).emplace_back(word());
    const CommandSpec& c = command_spec(m_command);
    if (m_help) return help_of(c.name);
    check_options();
    m_o.subcommand = config::Subcommand::fence;
    m_o.fence_guard = c.guard;
    m_o.fence_operands = std::move(operands);
    return std::move(m_o);
  }
};

// ---- Help texts: each command's usage and description, its options from the table, its footer.

// One option's lines: "  -t, --ttl DUR            lease length..." with the text at column 28
// (27 spaces), on the next line when the name is too long ("  -r, --server, --redis URL").
std::string option_lines(const OptionSpec& spec) {
  std::string head = spec.short_name ? "  -" + std::string(1, spec.short_name) + ", " : "      ";
  head += "--" + s(spec.long_name);
  if (!spec.alias.empty()) head += ", --" + s(spec.alias);
  if (!spec.value.empty()) head += " " + s(spec.value);
  const std::string indent(27, ' ');
  std::string out = head;
  if (head.size() <= 25) out += std::string(27 - head.size(), ' ');
  else out += "\n" + indent;
  std::string_view help = spec.help;
  bool first = true;
  while (!help.empty()) {
    const std::size_t nl = help.find('\n');
    out += (first ? "" : indent) + s(help.substr(0, nl)) + "\n";
    first = false;
    help = nl == std::string_view::npos ? std::string_view{} : help.substr(nl + 1);
  }
  return out;
}

// The options section of a command: every option the commands in `mask` take, in table order.
std::string options_section(unsigned mask) {
  std::string out = "Options:\n";
  for (const auto& spec : k_options)
    if (spec.commands & mask) out += option_lines(spec);
  return out;
}

// fence redis: only Redis.
constexpr std::string_view k_redis_password_help =
    "Password: from the URL, else $FENCERUN_REDIS_PASSWORD, else $REDISCLI_AUTH;\n"
    "sentinels' own password: $FENCERUN_SENTINEL_PASSWORD. Inside a job, the\n"
    "run's server, TLS settings and credentials are inherited (fencerun(1)).\n";

constexpr std::string_view k_password_help =
    "Password: from the URL, else $FENCERUN_REDIS_PASSWORD, else $REDISCLI_AUTH;\n"
    "sentinels' own password: $FENCERUN_SENTINEL_PASSWORD; an etcd user's:\n"
    "$FENCERUN_ETCD_PASSWORD. Inside a job, the run's server, TLS settings and\n"
    "credentials are inherited (fencerun(1)).\n";

constexpr std::string_view k_durations =
    "Durations: 500ms, 30s, 1.5s, 2m30s, 1h; a bare number is seconds (0.5 = 500ms).\n";

// The lines "  status NAME              is the lock held, ..." of `fencerun --help`: every word of the
// table, with its operands (fence: its guards) and summary.
std::string command_lines() {
  std::string out;
  for (const auto& c : k_commands) {
    if (!is_word(c)) continue;
    std::string head = "  " + s(c.name);
    if (c.form == Form::fence) {
      std::vector<std::string_view> guards = guard_words();
      head += " ";
      for (std::size_t i = 0; i < guards.size(); ++i) head += (i ? "|" : "") + s(guards[i]);
    } else if (!c.operands.empty()) {
      head += " " + s(c.operands);
    }
    out += head + (head.size() <= 25 ? std::string(27 - head.size(), ' ') : "\n" + std::string(27, ' ')) +
           s(c.summary) + "\n";
  }
  return out;
}

std::string run_help(bool top, unsigned options) {
  std::string usage = top ? R"(Usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...]
       fencerun [OPTIONS] SUBCOMMAND [OPTIONS] ...
       fencerun [-r URL] --version | --help
       fencerun help [SUBCOMMAND]
)"
                          : R"(Usage: fencerun [OPTIONS] run [OPTIONS] NAME [--] COMMAND [ARG...]
)";
  std::string text = usage + R"(
Run COMMAND while holding the lease NAME on a lock server (Redis: one server,
Sentinel, Cluster or a quorum of servers; or an etcd cluster), and give it a
fencing token (FENCERUN_TOKEN) that the protected resource can check to reject
stale writers. The lease is renewed in the background; if it cannot be renewed
in time, every process of the command is stopped before the lease expires.
Options end at the first word after NAME (or at --): the rest is COMMAND and
its arguments. A NAME that is a subcommand, or one letter away from one, needs
'run' before it.
)";
  if (top) text += "\nSubcommands (options may come before or after the subcommand word):\n" + command_lines();
  text += "\n" + options_section(options) + "\n" + std::string(k_durations) + R"(
Environment given to COMMAND: FENCERUN_TOKEN, FENCERUN_LOCK, FENCERUN_OWNER,
FENCERUN_TTL_MS, FENCERUN_SLOT, FENCERUN_LIMIT, FENCERUN_SERVERS,
FENCERUN_REDIS_URL (no password), FENCERUN_CONNECTION_FD; on etcd
FENCERUN_ETCD_URL and FENCERUN_ETCD_LEASE instead of the last three; no other
FENCERUN_*.

Exit status: the command's own status; 128+N if it was killed by signal N;
64 usage error; 69 server unavailable; 75 lock busy; 124 lease lost;
126 command not executable; 127 command not found; 70 internal error.

)" + std::string(k_password_help) + "See fencerun(1) for details.\n";
  return text;
}

std::string top_help(const CommandSpec& c) { return run_help(true, c.options); }
std::string run_help(const CommandSpec& c) { return run_help(false, c.options); }

std::string admin_help(const CommandSpec& c, std::string_view usage, std::string_view description,
                       std::string_view exit_status) {
  return "Usage: " + s(usage) + "\n\n" + s(description) + "\n" + options_section(c.options) + "\n" +
         "Exit status: " + s(exit_status) + "\n" + (c.options & k_server ? "\n" + s(k_password_help) : "") +
         "See fencerun(1) for details.\n";
}

std::string status_help(const CommandSpec& c) {
  return admin_help(c, "fencerun [OPTIONS] status [OPTIONS] NAME",
                    R"(Say whether the lock NAME is held: by which host, process and owner id, for how
much longer, with which token, and the last token issued. With --limit locks,
every held slot. With --json, one JSON object.
)",
                    "0 held; 3 free; 64 usage error; 69 server unavailable.");
}

std::string list_help(const CommandSpec& c) {
  return admin_help(c, "fencerun [OPTIONS] list [OPTIONS] [PATTERN]",
                    R"(List the locks held (or, with --all, also the free ones that have issued
tokens), one line each: NAME, holder, time left, token. PATTERN is a Redis
MATCH glob over NAMEs (* ? [abc]; default *); a NAME with those characters
matches itself and others. Needs SCAN (fencerun acl --admin).
)",
                    "0 some lock listed; 3 none; 64 usage error; 69 server unavailable.");
}

std::string break_help(const CommandSpec& c) {
  return admin_help(c, "fencerun [OPTIONS] break [OPTIONS] NAME",
                    R"(Delete the lock NAME (every holder, or the one --owner names) and wake its
waiters. The holder is not stopped at once: it finds the lease gone at its next
renewal (within --renew, 10s by default), stops its command and exits 124; a
command that ends before then is never stopped. Asks for confirmation on a
terminal; without one, --yes is required.
)",
                    "0 broken; 3 nothing held (or no such owner); 1 not confirmed;\n"
                    "64 usage error; 69 server unavailable.");
}

std::string bump_help(const CommandSpec& c) {
  return admin_help(c, "fencerun [OPTIONS] bump [OPTIONS] NAME --above N",
                    R"(Raise the token counter of NAME so that the next token is greater than N (a
resource that accepted tokens from another counter, a restored backup). Tokens
stay below 2^53 and a counter is never lowered: a counter raised near 2^53
leaves the lock unusable, with no way back but deleting its keys by hand.
)",
                    "0 raised (or already above N); 64 usage error;\n69 server unavailable.");
}

std::string history_help(const CommandSpec& c) {
  return admin_help(c, "fencerun [OPTIONS] history [OPTIONS] NAME",
                    R"(List the recorded runs of NAME, newest first: how each ended (ok, failed,
stopped, lost, killed), its exit code or signal, how long it ran, when it
ended, host, pid and token. The server keeps the last --keep-runs runs (20 by
default) for --records-ttl (720h by default) after the last run. With --json,
a JSON array.
)",
                    "0 runs listed; 3 none recorded; 64 usage error; 69 server\nunavailable.");
}

std::string acl_help(const CommandSpec& c) {
  return admin_help(c, "fencerun acl [OPTIONS]",
                    R"(Print the least-privilege Redis ACL rule for fencerun: the commands that run,
status, break, bump, fence redis and --version -r send, on the keys and
channels under --key-prefix. Use it as: redis-cli ACL SETUSER locker on
'>PASSWORD' $(fencerun acl).
)",
                    "0; 64 usage error.");
}

std::string fence_help(const CommandSpec& c) {
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

)" + options_section(c.options) +
         R"(
The token comes from --token N, else $FENCERUN_TOKEN (a positive integer below
2^53). A token equal to the greatest accepted one is accepted.

Exit status: 0 accepted; 77 stale token rejected; 64 usage error, also a
missing or malformed token; 69 Redis unavailable; 1 the write failed (I/O
error, a side file that is a symbolic link, error reply from CMD); 128+N fence
file stopped by signal N before its commit (nothing written).
See fencerun(1) for details.
)";
}

std::string fence_file_help(const CommandSpec& c) {
  return R"(Usage: fencerun fence file [OPTIONS] [--] PATH

Replace PATH with standard input, only when the fencing token is not older
than the greatest token PATH has accepted: the data goes to a temporary file,
fsync, rename. The greatest accepted token is kept in PATH.fence, writers
serialise on PATH.fence.lock; a side file that is a symbolic link is refused.
A token equal to the greatest accepted one is accepted.

With --read, admit the token the same way (record it as the greatest
accepted, or reject it when stale) and print PATH on standard output, so that
an older owner's later write is rejected: fence the read of every
read-modify-write, then write with the same token.

)" + options_section(c.options) +
         R"(
Exit status: 0 accepted; 77 stale token rejected; 64 usage error, also a
missing or malformed token; 1 the write failed (I/O error, a side file that is
a symbolic link); 128+N stopped by signal N before its commit (nothing
written).
)";
}

std::string fence_redis_help(const CommandSpec& c) {
  return R"(Usage: fencerun fence redis [OPTIONS] [--] CMD [ARG...]

Run the Redis command CMD only when the fencing token is not older than the
greatest token accepted for resource R: one script compares the token with
<prefix>{R}:fence, runs CMD, records the token, and prints CMD's reply.
Options end at CMD (or at --); CMD and its arguments reach Redis byte for
byte, at most )" + std::to_string(config::k_fence_max_command_words) + R"( words. Inside a fencerun job, the run's server,
TLS settings and credentials are used unless -r is given.

)" + options_section(c.options) +
         "\n" + s(k_redis_password_help) + R"(
Exit status: 0 accepted; 77 stale token rejected; 64 usage error, also a
missing or malformed token; 69 Redis unavailable; 1 an error reply from CMD.
)";
}

std::string fence_sql_help(const CommandSpec& c) {
  return R"(Usage: fencerun fence sql [OPTIONS] postgresql|mysql|sqlite

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

)" + options_section(c.options);
}

std::vector<std::string> names_of(unsigned mask) {
  std::vector<std::string> names;
  for (const auto& spec : k_options) {
    if (!(spec.commands & mask)) continue;
    if (spec.short_name) names.push_back("-" + std::string(1, spec.short_name));
    names.push_back("--" + s(spec.long_name));
    if (!spec.alias.empty()) names.push_back("--" + s(spec.alias));
  }
  return names;
}

}  // namespace

std::string help_text() { return top_help(k_commands.front()); }

std::string help_text(std::string_view command) {
  for (const auto& c : k_commands)
    if (c.help && c.name == command) return c.help(c);
  return {};
}

std::vector<std::string> help_commands() {
  std::vector<std::string> out;
  for (const auto& c : k_commands)
    if (c.help) out.push_back(s(c.name));
  return out;
}

std::vector<DeclaredOptions> declared_options() {
  std::vector<DeclaredOptions> out;
  for (const auto& c : k_commands)
    if (c.help) out.push_back({s(c.name), names_of(c.options)});
  return out;
}

config::Options parse_fence(const std::vector<std::string_view>& words) {
  Scan scan(words);
  return scan.run_scan(k_fence);
}

config::Options parse(int argc, const char* const* argv) {
  // `fencerun --version` and `fencerun --help` alone are answered without the scan.
  if (argc == 2) {
    std::string_view only = argv[1];
    if (only == "--version" || only == "-h" || only == "--help") {
      config::Options o;
      o.subcommand = only == "--version" ? config::Subcommand::version : config::Subcommand::help;
      if (o.subcommand == config::Subcommand::help) o.help_text = help_text();
      return o;
    }
  }
  std::vector<std::string_view> words(argv + 1, argv + argc);
  Scan scan(words);
  config::Options o;
  try {
    o = scan.run_scan(0);
  } catch (const UsageError& e) {
    // A subcommand's messages point at its own help.
    std::string_view message = e.what();
    if (message.find("--help") != std::string_view::npos) throw;
    std::string_view command;  // the longest command name the message starts with
    for (const auto& c : k_commands) {
      if (c.form == Form::top || c.form == Form::run || c.form == Form::help || c.form == Form::version ||
          c.name.size() <= command.size())
        continue;
      if (message.starts_with(s(c.name) + ": ") || message.starts_with(s(c.name) + " ")) command = c.name;
    }
    if (command.empty()) throw;
    throw UsageError(std::string(message) + " (see fencerun " + s(command) + " --help)");
  }
  return o;
}

}  // namespace fencerun::cli
