#include "cli/parse.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <string_view>
#include <vector>

#include "util/error.hpp"

namespace fencerun::cli {
namespace {

void add_connection_options(CLI::App& app, config::Options& o) {
  app.add_option("-r,--redis", o.redis_url);
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
  app.add_option("--metrics-file", o.metrics_file);
  app.add_option("-E,--conflict-exit-code", o.conflict_exit_code);
  app.add_option("--lease-lost-exit-code", o.lease_lost_exit_code);
  app.add_flag("--shell", o.shell);
  app.add_option("--min-replicas", o.min_replicas);
  app.add_option("--replica-timeout", o.replica_timeout);
  app.add_option("NAME", o.lock_name);
}

}  // namespace

std::string help_text() {
  return R"(Usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...]
       fencerun run [OPTIONS] NAME [--] COMMAND [ARG...]
       fencerun status [OPTIONS] NAME [--json]
       fencerun acl [--key-prefix STR] [--delex]
       fencerun fence file|redis|sql ...  (resource-side guards: fencerun(1))
       fencerun --version | --help

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
                           redis://127.0.0.1:6379)
  -t, --ttl DUR            lease length (default: 30s)
      --renew DUR          renewal interval (default: ttl/3)
      --grace DUR          time between the kill signal and SIGKILL
                           (default: min(5s, ttl/6))
      --kill-signal SIG    first signal sent to the command when the lease is
                           lost or runs short (default: TERM)
  -w, --wait DUR           wait this long for a busy lock; 'inf' waits forever
                           (default: 0)
      --fair               waiters acquire in the order they began waiting
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
      --tls-ca-file FILE   CA certificates to verify the server with
                           (default: the system store)
      --tls-cert FILE      client certificate (mutual TLS)
      --tls-key FILE       key of the client certificate
                           (default: in --tls-cert)
      --tls-server-name NAME
                           name to verify in the server certificate
                           (default: the host)
      --tls-insecure       do not verify the server certificate (warns)
  -v, --verbose            log lease events (repeat for debug)
  -q, --quiet              log errors only
      --log-format FMT     text or json (default: text)
      --json               status: print JSON
      --delex              acl: also allow DELEX (Redis 8.4 and later)
  -h, --help               show this help and exit
      --version            show the version and exit

Durations: 500ms, 30s, 1.5s, 2m30s, 1h; a bare number is seconds (0.5 = 500ms).

Exit status: the command's own status; 128+N if it was killed by signal N;
64 usage error; 69 Redis unavailable; 75 lock busy; 124 lease lost;
126 command not executable; 127 command not found; 70 internal error.
status: 0 held, 3 free, 69 unavailable.

Password: from the URL, else $FENCERUN_REDIS_PASSWORD, else $REDISCLI_AUTH;
sentinels' own password: $FENCERUN_SENTINEL_PASSWORD.
See fencerun(1) for details.
)";
}

namespace {

// Every option of run and status, and whether it takes a value as the next word. The pre-scan below
// needs to know which words are option values; the help test checks this table against --help.
struct KnownOption {
  std::string_view name;
  bool takes_value;
};
constexpr KnownOption k_options[] = {
    {"-r", true},          {"--redis", true},          {"--timeout", true},
    {"--key-prefix", true}, {"-v", false},             {"--verbose", false},
    {"-q", false},          {"--quiet", false},        {"--log-format", true},
    {"--tls-ca-file", true}, {"--tls-cert", true},     {"--tls-key", true},
    {"--tls-server-name", true}, {"--tls-insecure", false}, {"-t", true},
    {"--ttl", true},        {"--renew", true},         {"--grace", true},
    {"--kill-signal", true}, {"-w", true},             {"--wait", true},
    {"--fair", false},      {"--metrics-file", true},  {"-E", true},
    {"--conflict-exit-code", true}, {"--lease-lost-exit-code", true}, {"--shell", false},
    {"--min-replicas", true}, {"--replica-timeout", true}, {"--json", false},
    {"--delex", false},     {"-h", false},             {"--help", false},
    {"--version", false},
};

const KnownOption* find_option(std::string_view name) {
  for (const auto& o : k_options)
    if (o.name == name) return &o;
  return nullptr;
}

bool is_option_word(std::string_view a) { return a.size() > 1 && a[0] == '-'; }

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

// One option word: known, or a usage error in the words of getopt ("unrecognized option").
// Returns whether the next word is its value.
bool check_option(std::string_view word) {
  if (word.starts_with("--")) {
    std::string_view name = word.substr(0, word.find('='));
    const KnownOption* o = find_option(name);
    if (!o) {
      std::string message = "unrecognized option '" + std::string(name) + "'";
      std::string_view best;
      std::size_t best_distance = 3;
      for (const auto& k : k_options) {
        if (!k.name.starts_with("--")) continue;
        std::size_t d = distance(name, k.name);
        if (d < best_distance) best_distance = d, best = k.name;
      }
      if (!best.empty()) message += ", did you mean '" + std::string(best) + "'?";
      throw UsageError(message);
    }
    return o->takes_value && name.size() == word.size();
  }
  // Short options: a cluster of flags (-vv), or one that takes a value, attached (-t5s) or next.
  for (std::size_t i = 1; i < word.size(); ++i) {
    std::string name = std::string("-") + word[i];
    const KnownOption* o = find_option(name);
    if (!o) throw UsageError("invalid option -- '" + std::string(1, word[i]) + "'");
    if (o->takes_value) return i + 1 == word.size();
  }
  return false;
}

}  // namespace

config::Options parse(int argc, const char* const* argv) {
  config::Options o;
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
      if (!other_subcommand && check_option(a) && i + 1 < argc) before.emplace_back(argv[++i]);
      continue;
    }
    if (first_word) {
      first_word = false;
      if (a == "status" || a == "acl") other_subcommand = true;
      if (a == "status" || a == "acl" || a == "run") {
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

  for (const auto& a : before) {
    if (a == "-h" || a == "--help") {
      o.subcommand = config::Subcommand::help;
      o.help_text = help_text();
      return o;
    }
    if (a == "--version") {
      o.subcommand = config::Subcommand::version;
      return o;
    }
  }

  CLI::App app{"fencerun"};
  app.set_help_flag();
  app.allow_extras(false);
  add_run_options(app, o);
  CLI::App* run = app.add_subcommand("run");
  add_run_options(*run, o);
  CLI::App* status = app.add_subcommand("status");
  add_connection_options(*status, o);
  status->add_flag("--json", o.json);
  status->add_option("NAME", o.lock_name);
  CLI::App* acl = app.add_subcommand("acl");
  acl->add_option("--key-prefix", o.key_prefix);
  acl->add_flag("--delex", o.acl_delex);
  app.require_subcommand(0, 1);

  // CLI11 wants argv order reversed when given a vector.
  std::vector<std::string> args(before.rbegin(), before.rend());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  if (acl->parsed()) {
    o.subcommand = config::Subcommand::acl;
    if (saw_separator) throw UsageError("acl takes no COMMAND");
  } else if (status->parsed()) {
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

config::Options parse_connection_command(const std::vector<std::string_view>& words,
                                         const std::vector<OwnOption>& own) {
  config::Options o;
  // CLI11 sees only the words before the first `--` (it would re-interpret the command's), and stops
  // at the first operand (prefix_command), leaving it and every word after it unparsed.
  std::size_t separator = words.size();
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "--") {
      separator = i;
      break;
    }
  }
  CLI::App app{"fencerun"};
  app.set_help_flag();
  app.prefix_command();
  add_connection_options(app, o);
  for (const auto& option : own) app.add_option(option.name, *option.value);
  std::vector<std::string> args(words.rend() - static_cast<std::ptrdiff_t>(separator), words.rend());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  // With prefix_command, CLI11 also leaves unknown options unparsed: the first word it left must be
  // the command's.
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front().size() > 1 && rest.front().front() == '-')
    throw UsageError("unknown option '" + rest.front() + "'");
  std::size_t first = separator - rest.size();
  if (first == separator) first = std::min(separator + 1, words.size());
  for (std::size_t i = first; i < words.size(); ++i) o.command.emplace_back(words[i]);
  return o;
}

}  // namespace fencerun::cli
