#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/targets.hpp"
#include "cli/parse.hpp"
#include "config/config.hpp"
#include "fence/fence.hpp"
#include "util/error.hpp"

using fencerun::UsageError;
using fencerun::config::FenceGuard;
using fencerun::config::Options;
using fencerun::config::Subcommand;

namespace {

using Args = std::vector<std::string>;

Options parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"fencerun"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(nullptr);
  return fencerun::cli::parse(static_cast<int>(argv.size()) - 1, argv.data());
}

// The message of the UsageError that parsing throws, or "<no error>".
std::string usage_error(std::initializer_list<const char*> args) {
  try {
    parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(cli, runs_name_and_command) {
  Options o = parse({"nightly", "--", "backup", "--all"});
  EXPECT_EQ(o.subcommand, Subcommand::run);
  EXPECT_EQ(o.lock_name, "nightly");
  EXPECT_EQ(o.command, (Args{"backup", "--all"}));
}

TEST(cli, keeps_defaults_when_no_option_is_given) {
  Options o = parse({"nightly", "--", "true"});
  Options d;
  EXPECT_TRUE(o.redis_urls.empty());
  EXPECT_EQ(o.ttl, d.ttl);
  EXPECT_EQ(o.renew, std::nullopt);
  EXPECT_EQ(o.grace, std::nullopt);
  EXPECT_EQ(o.kill_signal, "TERM");
  EXPECT_EQ(o.wait, "0");
  EXPECT_EQ(o.conflict_exit_code, 75);
  EXPECT_EQ(o.lease_lost_exit_code, 124);
  EXPECT_EQ(o.timeout, "2s");
  EXPECT_EQ(o.key_prefix, "fencerun:");
  EXPECT_FALSE(o.shell);
  EXPECT_EQ(o.verbosity, 0);
  EXPECT_EQ(o.log_format, "text");
}

TEST(cli, passes_the_command_through_byte_for_byte) {
  Options o = parse({"nightly", "--", "sh", "-c", "echo \"$1\" --ttl 5s", "-v", "--", "--help", "", "\xff"});
  EXPECT_EQ(o.command, (Args{"sh", "-c", "echo \"$1\" --ttl 5s", "-v", "--", "--help", "", "\xff"}));
  EXPECT_EQ(o.subcommand, Subcommand::run);
  EXPECT_EQ(o.ttl, "30s");
  EXPECT_EQ(o.verbosity, 0);
}

TEST(cli, accepts_the_explicit_run_form) {
  Options o = parse({"run", "-t", "10s", "nightly", "--", "true"});
  EXPECT_EQ(o.subcommand, Subcommand::run);
  EXPECT_EQ(o.lock_name, "nightly");
  EXPECT_EQ(o.ttl, "10s");
  EXPECT_EQ(o.command, (Args{"true"}));
}

TEST(cli, takes_a_subcommand_name_as_lock_name_in_the_run_form) {
  Options o = parse({"run", "status", "--", "true"});
  EXPECT_EQ(o.subcommand, Subcommand::run);
  EXPECT_EQ(o.lock_name, "status");
}

TEST(cli, reads_every_run_option) {
  Options o = parse({"-r", "redis://db:6380/1", "-t", "1m", "--renew", "10s", "--grace", "2s", "--kill-signal",
                     "INT", "-w", "inf", "-E", "3", "--lease-lost-exit-code", "99", "--timeout", "500ms",
                     "--key-prefix", "jobs:", "--shell", "--log-format", "json", "nightly", "--", "make all"});
  EXPECT_EQ(o.redis_urls, std::vector<std::string>{"redis://db:6380/1"});
  EXPECT_EQ(o.ttl, "1m");
  EXPECT_EQ(o.renew, "10s");
  EXPECT_EQ(o.grace, "2s");
  EXPECT_EQ(o.kill_signal, "INT");
  EXPECT_EQ(o.wait, "inf");
  EXPECT_EQ(o.conflict_exit_code, 3);
  EXPECT_EQ(o.lease_lost_exit_code, 99);
  EXPECT_EQ(o.timeout, "500ms");
  EXPECT_EQ(o.key_prefix, "jobs:");
  EXPECT_TRUE(o.shell);
  EXPECT_EQ(o.log_format, "json");
  EXPECT_EQ(o.lock_name, "nightly");
  EXPECT_EQ(o.command, (Args{"make all"}));
}

TEST(cli, reads_long_options_with_equals_signs) {
  Options o = parse({"--redis=redis://db", "--ttl=45s", "--wait=5m", "--conflict-exit-code=0", "nightly", "--", "x"});
  EXPECT_EQ(o.redis_urls, std::vector<std::string>{"redis://db"});
  EXPECT_EQ(o.ttl, "45s");
  EXPECT_EQ(o.wait, "5m");
  EXPECT_EQ(o.conflict_exit_code, 0);
}

TEST(cli, reads_options_after_the_name) {
  Options o = parse({"nightly", "--ttl", "10s", "--", "true"});
  EXPECT_EQ(o.lock_name, "nightly");
  EXPECT_EQ(o.ttl, "10s");
}

TEST(cli, reads_the_tls_and_replica_options) {
  Options o = parse({"--tls-ca-file", "/ca.pem", "--tls-cert", "/c.pem", "--tls-key", "/c.key", "--tls-server-name",
                     "redis.internal", "--tls-insecure", "--min-replicas", "2", "--replica-timeout", "250ms",
                     "nightly", "--", "true"});
  EXPECT_EQ(o.tls_ca_file, "/ca.pem");
  EXPECT_EQ(o.tls_cert, "/c.pem");
  EXPECT_EQ(o.tls_key, "/c.key");
  EXPECT_EQ(o.tls_server_name, "redis.internal");
  EXPECT_TRUE(o.tls_insecure);
  EXPECT_EQ(o.min_replicas, 2);
  EXPECT_EQ(o.replica_timeout, "250ms");
}

TEST(cli, counts_verbose_and_quiet_flags) {
  EXPECT_EQ(parse({"-v", "nightly", "--", "true"}).verbosity, 1);
  EXPECT_EQ(parse({"-v", "-v", "nightly", "--", "true"}).verbosity, 2);
  EXPECT_EQ(parse({"-vv", "nightly", "--", "true"}).verbosity, 2);
  EXPECT_EQ(parse({"--verbose", "nightly", "--", "true"}).verbosity, 1);
  EXPECT_EQ(parse({"-q", "nightly", "--", "true"}).verbosity, -1);
  EXPECT_EQ(parse({"--quiet", "nightly", "--", "true"}).verbosity, -1);
}

TEST(cli, parses_status) {
  Options o = parse({"status", "nightly", "--json", "-r", "redis://db"});
  EXPECT_EQ(o.subcommand, Subcommand::status);
  EXPECT_EQ(o.lock_name, "nightly");
  EXPECT_TRUE(o.json);
  EXPECT_EQ(o.redis_urls, std::vector<std::string>{"redis://db"});
  EXPECT_TRUE(o.command.empty());
}

TEST(cli, rejects_a_command_for_status) {
  EXPECT_EQ(usage_error({"status", "nightly", "--", "true"}),
            "status takes no COMMAND (to run a command under a lock named 'status': fencerun run status -- COMMAND) "
            "(see fencerun status --help)");
}

TEST(cli, parses_acl) {
  Options o = parse({"acl", "--key-prefix", "jobs:", "--delex"});
  EXPECT_EQ(o.subcommand, Subcommand::acl);
  EXPECT_EQ(o.key_prefix, "jobs:");
  EXPECT_TRUE(o.acl_delex);
  EXPECT_FALSE(o.acl_delifeq);
  EXPECT_TRUE(parse({"acl", "--delifeq"}).acl_delifeq);
}

TEST(cli, version_with_a_server_keeps_its_url) {
  Options o = parse({"-r", "redis://127.0.0.1:7000", "--version"});
  EXPECT_EQ(o.subcommand, Subcommand::version);
  EXPECT_EQ(o.redis_urls, (std::vector<std::string>{"redis://127.0.0.1:7000"}));
  EXPECT_TRUE(parse({"--version"}).redis_urls.empty());
}

TEST(cli, shows_help) {
  for (const char* flag : {"-h", "--help"}) {
    Options o = parse({flag});
    EXPECT_EQ(o.subcommand, Subcommand::help) << flag;
    EXPECT_EQ(o.help_text, fencerun::cli::help_text());
  }
  EXPECT_EQ(parse({"--ttl", "5s", "nightly", "--help"}).subcommand, Subcommand::help);
}

TEST(cli, shows_the_version) {
  EXPECT_EQ(parse({"--version"}).subcommand, Subcommand::version);
}

TEST(cli, treats_help_after_the_separator_as_part_of_the_command) {
  Options o = parse({"nightly", "--", "grep", "--help"});
  EXPECT_EQ(o.subcommand, Subcommand::run);
  EXPECT_EQ(o.command, (Args{"grep", "--help"}));
}

TEST(cli, ends_options_at_the_command_without_a_separator) {
  // As flock(1), timeout(1) and env(1): the first word after NAME starts the command.
  Options o = parse({"nightly", "true"});
  EXPECT_EQ(o.lock_name, "nightly");
  EXPECT_EQ(o.command, (Args{"true"}));
  o = parse({"job", "ls", "-l", "/"});
  EXPECT_EQ(o.command, (Args{"ls", "-l", "/"}));
  // The command's own --version and --help are the command's, never fencerun's.
  o = parse({"job", "mycmd", "--version"});
  EXPECT_EQ(o.subcommand, Subcommand::run);
  EXPECT_EQ(o.command, (Args{"mycmd", "--version"}));
  o = parse({"job", "mycmd", "-h"});
  EXPECT_EQ(o.command, (Args{"mycmd", "-h"}));
  // Options between NAME and the command are still fencerun's; their values are skipped.
  o = parse({"-w", "5s", "job", "--ttl", "10s", "backup", "--ttl", "1s"});
  EXPECT_EQ(o.ttl, "10s");
  EXPECT_EQ(o.wait, "5s");
  EXPECT_EQ(o.command, (Args{"backup", "--ttl", "1s"}));
  // A `--` still works, and a word after it that looks like an option is the command's.
  o = parse({"job", "--", "--weird-name"});
  EXPECT_EQ(o.command, (Args{"--weird-name"}));
  o = parse({"run", "status", "true"});
  EXPECT_EQ(o.lock_name, "status");
  EXPECT_EQ(o.command, (Args{"true"}));
}

TEST(cli, rejects_a_missing_command) {
  // One wording, with or without the `--`.
  EXPECT_EQ(usage_error({"nightly"}), "missing COMMAND (usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...])");
  EXPECT_EQ(usage_error({"nightly", "--"}), usage_error({"nightly"}));
  EXPECT_EQ(parse({"help"}).help_text, fencerun::cli::help_text());
  EXPECT_EQ(usage_error({"status", "--", "true"}),
            "status takes no COMMAND (to run a command under a lock named 'status': fencerun run status -- COMMAND) "
            "(see fencerun status --help)");
}

TEST(cli, names_a_misspelt_option_and_suggests_the_closest) {
  EXPECT_EQ(usage_error({"--wiat", "5s", "job", "true"}), "unrecognized option '--wiat', did you mean '--wait'?");
  EXPECT_EQ(usage_error({"job", "--tll=5s", "true"}), "unrecognized option '--tll', did you mean '--ttl'?");
  EXPECT_EQ(usage_error({"--frobnicate", "job", "true"}), "unrecognized option '--frobnicate'");
  EXPECT_EQ(usage_error({"-Z", "job", "true"}), "invalid option -- 'Z'");
}

TEST(cli, takes_attached_and_clustered_short_options) {
  Options o = parse({"-vv", "-t5s", "job", "true"});
  EXPECT_EQ(o.verbosity, 2);
  EXPECT_EQ(o.ttl, "5s");
  EXPECT_EQ(o.command, (Args{"true"}));
}

TEST(cli, rejects_unknown_options_naming_them) {
  std::string message = usage_error({"--bogus", "nightly", "--", "true"});
  EXPECT_NE(message.find("--bogus"), std::string::npos) << message;
}

TEST(cli, rejects_an_option_without_its_value) {
  std::string message = usage_error({"nightly", "--", "true", "--ttl"});
  EXPECT_EQ(message, "<no error>");  // after `--` it belongs to the command
  message = usage_error({"nightly", "--ttl"});
  EXPECT_NE(message.find("--ttl"), std::string::npos) << message;
}

TEST(cli, rejects_a_non_numeric_exit_code) {
  std::string message = usage_error({"-E", "busy", "nightly", "--", "true"});
  EXPECT_NE(message, "<no error>");
  EXPECT_NE(message.find("busy"), std::string::npos) << message;
}

TEST(cli, mentions_every_run_option_in_the_help) {
  std::string help = fencerun::cli::help_text();
  for (const char* option : {"--redis", "--ttl", "--renew", "--grace", "--kill-signal", "--wait",
                             "--conflict-exit-code", "--lease-lost-exit-code", "--timeout", "--key-prefix", "--shell",
                             "--verbose", "--quiet", "--log-format", "--min-replicas", "--replica-timeout",
                             "--limit", "--tls-ca-file", "--tls-cert", "--tls-key", "--tls-server-name", "--tls-insecure",
                             "--help", "--version"})
    EXPECT_NE(help.find(option), std::string::npos) << option;
}

// ---- The options each --help documents are exactly those the parser declares.

namespace {

using Names = std::set<std::string>;

// The option names a help text documents: the names at the start of each line of its "Options:"
// section (up to the next blank line) that begins with '-': "  -r, --redis URL ..." -> -r, --redis.
Names documented_options(const std::string& help) {
  Names names;
  std::istringstream in(help);
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (!in_section) {
      in_section = line == "Options:";
      continue;
    }
    if (line.empty()) break;
    std::size_t at = line.find_first_not_of(' ');
    while (at != std::string::npos && line[at] == '-') {
      std::size_t end = line.find_first_of(" ,=", at);
      names.insert(line.substr(at, end - at));
      if (end == std::string::npos || line.compare(end, 2, ", ") != 0) break;
      at = end + 2;
    }
  }
  return names;
}

std::map<std::string, Names> declared() {
  std::map<std::string, Names> out;
  for (const auto& d : fencerun::cli::declared_options()) out[d.command].insert(d.names.begin(), d.names.end());
  return out;
}


}  // namespace

TEST(cli_help, documents_exactly_the_declared_options) {
  auto d = declared();
  ASSERT_EQ(d.size(), 12u);
  EXPECT_EQ(fencerun::cli::help_text(""), fencerun::cli::help_text());
  // Every command's help documents exactly the options it takes.
  for (const std::string& command : fencerun::cli::help_commands()) {
    EXPECT_FALSE(d[command].empty()) << command;
    EXPECT_EQ(documented_options(fencerun::cli::help_text(command)), d[command]) << "'" << command << "'";
  }
  // The top level is run plus --version.
  Names top = d["run"];
  top.insert("--version");
  EXPECT_EQ(d[""], top);
  EXPECT_GT(top.size(), 30u);
  // fence redis takes the connection options of status, and its own.
  Names redis = d["status"];
  redis.erase("--json");
  redis.insert({"--resource", "--token"});
  EXPECT_EQ(d["fence redis"], redis);
  EXPECT_EQ(d["fence file"], (Names{"--token", "--read", "-v", "--verbose", "-q", "--quiet", "--log-format", "-h",
                                    "--help"}));
  EXPECT_EQ(d["acl"], (Names{"--key-prefix", "--delex", "--delifeq", "--admin", "-v", "--verbose", "-q", "--quiet",
                             "--log-format", "-h", "--help"}));
  EXPECT_EQ(d["bump"].count("--above"), 1u);
  EXPECT_EQ(d["bump"].count("--ttl"), 0u);
  EXPECT_EQ(d["break"].count("--yes"), 1u);
  EXPECT_EQ(d["list"].count("--all"), 1u);
}

TEST(cli_help, the_comparison_notices_an_option_missing_from_the_help) {
  auto d = declared();
  std::string help = fencerun::cli::help_text("fence redis");
  std::size_t at = help.find("      --tls-insecure");
  ASSERT_NE(at, std::string::npos);
  help.erase(at, help.find('\n', at) + 1 - at);
  Names documented = documented_options(help);
  EXPECT_NE(documented, d["fence redis"]);
  EXPECT_EQ(documented.count("--tls-insecure"), 0u);
  EXPECT_EQ(documented.size() + 1, d["fence redis"].size());
  EXPECT_TRUE(documented_options("Usage: x\n\n  -v, --verbose\n").empty()) << "no Options: section";
}

TEST(cli_help, every_help_fits_80_columns) {
  for (const std::string& command : fencerun::cli::help_commands()) {
    std::istringstream in(fencerun::cli::help_text(command));
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      EXPECT_LE(line.size(), 80u) << "'" << command << "' line " << n << ": " << line;
    }
    EXPECT_GT(n, 3) << command;
  }
  EXPECT_EQ(fencerun::cli::help_text("nonsense"), "");
  EXPECT_EQ(fencerun::fence::help_text(), fencerun::cli::help_text("fence"));
}

// ---- fence: a subcommand of the same parser.

TEST(cli_fence, parses_the_guards) {
  Options o = parse({"fence", "redis", "-r", "rediss://h:1", "--tls-ca-file", "/ca.pem", "--resource", "r", "--token",
                     "5", "-vv", "SET", "k", "--token", "--", "\xff", ""});
  EXPECT_EQ(o.subcommand, Subcommand::fence);
  EXPECT_EQ(o.fence_guard, FenceGuard::redis);
  EXPECT_EQ(o.redis_urls, std::vector<std::string>{"rediss://h:1"});
  EXPECT_EQ(o.tls_ca_file, "/ca.pem");
  EXPECT_EQ(o.fence_resource, "r");
  EXPECT_EQ(o.fence_token, "5");
  EXPECT_EQ(o.verbosity, 2);
  EXPECT_EQ(o.command, (Args{"SET", "k", "--token", "--", "\xff", ""}));

  o = parse({"fence", "redis", "--token=7", "--", "-weird", "--help"});
  EXPECT_EQ(o.fence_token, "7");
  EXPECT_EQ(o.command, (Args{"-weird", "--help"}));

  o = parse({"fence", "file", "out.json", "--token=6"});
  EXPECT_EQ(o.fence_guard, FenceGuard::file);
  EXPECT_EQ(o.fence_token, "6");
  EXPECT_EQ(o.fence_operands, (Args{"out.json"}));
  EXPECT_TRUE(o.command.empty());
  o = parse({"fence", "file", "--token", "1", "--token", "2", "--", "-x", "--token"});
  EXPECT_EQ(o.fence_token, "2");
  EXPECT_EQ(o.fence_operands, (Args{"-x", "--token"}));

  o = parse({"fence", "sql", "postgresql"});
  EXPECT_EQ(o.fence_guard, FenceGuard::sql);
  EXPECT_EQ(o.fence_operands, (Args{"postgresql"}));
}

TEST(cli_fence, shows_the_help_of_fence_and_of_each_guard) {
  for (auto args : std::vector<std::vector<const char*>>{{"fence", "--help"}, {"fence", "-h"}, {"fence", "help"},
                                                          {"fence", "nonsense", "--help"}}) {
    std::vector<const char*> argv{"fencerun"};
    argv.insert(argv.end(), args.begin(), args.end());
    Options o = fencerun::cli::parse(static_cast<int>(argv.size()), argv.data());
    EXPECT_EQ(o.subcommand, Subcommand::help) << args[1];
    EXPECT_EQ(o.help_text, fencerun::cli::help_text("fence")) << args[1];
  }
  EXPECT_EQ(parse({"fence", "file", "--help"}).help_text, fencerun::cli::help_text("fence file"));
  EXPECT_EQ(parse({"fence", "file", "--token", "5", "-h", "x"}).help_text, fencerun::cli::help_text("fence file"));
  EXPECT_EQ(parse({"fence", "redis", "-r", "redis://h", "--help", "--", "PING"}).help_text,
            fencerun::cli::help_text("fence redis"));
  EXPECT_EQ(parse({"fence", "sql", "-h"}).help_text, fencerun::cli::help_text("fence sql"));
  // After CMD starts, --help is CMD's.
  EXPECT_EQ(parse({"fence", "redis", "ECHO", "--help"}).subcommand, Subcommand::fence);
}

TEST(cli_fence, names_a_misspelt_option_and_the_guard) {
  EXPECT_EQ(usage_error({"fence", "redis", "--tokn", "5", "--", "PING"}),
            "fence redis: unrecognized option '--tokn', did you mean '--token'? (see fencerun fence redis --help)");
  EXPECT_EQ(usage_error({"fence", "redis", "--tls-ca-fil=/x", "PING"}),
            "fence redis: unrecognized option '--tls-ca-fil', did you mean '--tls-ca-file'? (see fencerun fence redis "
            "--help)");
  EXPECT_EQ(usage_error({"fence", "file", "--bogus", "x"}),
            "fence file: unrecognized option '--bogus' (see fencerun fence file --help)");
  EXPECT_EQ(usage_error({"fence", "redis", "-x", "--", "PING"}),
            "fence redis: invalid option -- 'x' (see fencerun fence redis --help)");
  // run's options are not fence's.
  EXPECT_EQ(usage_error({"fence", "redis", "--ttl", "5s", "--", "PING"}),
            "fence redis does not take --ttl (an option of run); see fencerun fence redis --help");
  EXPECT_EQ(usage_error({"fence", "file", "--resource", "r", "x"}),
            "fence file does not take --resource (an option of fence redis); see fencerun fence file --help");
  EXPECT_EQ(usage_error({"fence"}), "fence: missing guard (file, redis or sql) (see fencerun fence --help)");
  EXPECT_EQ(usage_error({"fence", "nope"}),
            "fence: unknown guard 'nope' (expected file, redis or sql) (see fencerun fence --help)");
  std::string missing_value = usage_error({"fence", "redis", "--token"});
  EXPECT_EQ(missing_value.rfind("fence redis: ", 0), 0u) << missing_value;
  EXPECT_NE(missing_value.find("--token"), std::string::npos) << missing_value;
}

// ---- One grammar: a subcommand is recognised after the global options, as git does.

TEST(cli_grammar, recognises_fence_after_global_options) {
  Options o = parse({"-q", "fence", "file", "/srv/x"});
  EXPECT_EQ(o.subcommand, Subcommand::fence);
  EXPECT_EQ(o.fence_guard, FenceGuard::file);
  EXPECT_EQ(o.fence_operands, (Args{"/srv/x"}));
  EXPECT_EQ(o.verbosity, -1);
  o = parse({"-r", "redis://h:1", "fence", "redis", "--", "SET", "k", "v"});
  EXPECT_EQ(o.fence_guard, FenceGuard::redis);
  EXPECT_EQ(o.redis_urls, (std::vector<std::string>{"redis://h:1"}));
  EXPECT_EQ(o.command, (Args{"SET", "k", "v"}));
  o = parse({"-v", "fence", "sql", "sqlite"});
  EXPECT_EQ(o.fence_guard, FenceGuard::sql);
  EXPECT_EQ(o.verbosity, 1);
}

TEST(cli_grammar, a_subcommand_word_is_a_lock_name_only_after_run) {
  Options o = parse({"run", "fence", "--", "file", "x"});
  EXPECT_EQ(o.subcommand, Subcommand::run);
  EXPECT_EQ(o.lock_name, "fence");
  EXPECT_EQ(o.command, (Args{"file", "x"}));
  o = parse({"-v", "run", "fence", "true"});
  EXPECT_EQ(o.lock_name, "fence");
  o = parse({"status", "fence"});
  EXPECT_EQ(o.subcommand, Subcommand::status);
  EXPECT_EQ(o.lock_name, "fence");
  // A word after NAME is the command's, even a subcommand's name.
  o = parse({"job", "status", "x"});
  EXPECT_EQ(o.subcommand, Subcommand::run);
  EXPECT_EQ(o.command, (Args{"status", "x"}));
}

TEST(cli_grammar, takes_global_options_before_or_after_the_subcommand) {
  for (auto args : std::vector<std::vector<const char*>>{{"-r", "redis://h:1", "--timeout", "1s", "status", "x"},
                                                          {"status", "-r", "redis://h:1", "--timeout", "1s", "x"},
                                                          {"status", "x", "-r", "redis://h:1", "--timeout", "1s"}}) {
    std::vector<const char*> argv{"fencerun"};
    argv.insert(argv.end(), args.begin(), args.end());
    Options o = fencerun::cli::parse(static_cast<int>(argv.size()), argv.data());
    EXPECT_EQ(o.subcommand, Subcommand::status);
    EXPECT_EQ(o.redis_urls, (std::vector<std::string>{"redis://h:1"}));
    EXPECT_EQ(o.timeout, "1s");
    EXPECT_EQ(o.lock_name, "x");
  }
  EXPECT_EQ(parse({"--key-prefix", "jobs:", "acl"}).key_prefix, "jobs:");
  EXPECT_TRUE(parse({"--json", "list"}).json);
}

TEST(cli_grammar, refuses_an_option_the_subcommand_does_not_take_wherever_it_stands) {
  const std::string ttl = "status does not take --ttl (an option of run); see fencerun status --help";
  EXPECT_EQ(usage_error({"--ttl", "5s", "status", "x"}), ttl);
  EXPECT_EQ(usage_error({"status", "--ttl", "5s", "x"}), ttl);
  EXPECT_EQ(usage_error({"status", "x", "--ttl", "5s"}), ttl);
  EXPECT_EQ(usage_error({"--ttl", "5s", "--wait", "1s", "list"}),
            "list does not take --ttl (an option of run); see fencerun list --help");
  EXPECT_EQ(usage_error({"--ttl", "5s", "acl"}), "acl does not take --ttl (an option of run); see fencerun acl --help");
  EXPECT_EQ(usage_error({"acl", "-r", "redis://h"}),
            "acl does not take -r (an option of run, status, list, break, bump, history and fence redis); see "
            "fencerun acl --help");
  EXPECT_EQ(usage_error({"--json", "x", "true"}),
            "run does not take --json (an option of status, list and history); see fencerun run --help");
  EXPECT_EQ(usage_error({"-r", "redis://h", "fence", "file", "x"}),
            "fence file does not take -r (an option of run, status, list, break, bump, history and fence redis); "
            "see fencerun fence file --help");
  EXPECT_EQ(usage_error({"--above", "5", "x", "true"}),
            "run does not take --above (an option of bump); see fencerun run --help");
}

TEST(cli_grammar, names_the_subcommand_and_its_operands_in_messages) {
  EXPECT_EQ(usage_error({"status", "a", "b"}),
            "status takes one NAME, got 2 words ('a', 'b'); see fencerun status --help");
  EXPECT_EQ(usage_error({"bump", "x", "y", "--above", "5"}),
            "bump takes one NAME, got 2 words ('x', 'y'); see fencerun bump --help");
  EXPECT_EQ(usage_error({"list", "a", "b"}), "list takes one PATTERN, got 2 words ('a', 'b'); see fencerun list --help");
  EXPECT_EQ(usage_error({"acl", "x"}), "acl takes no NAME, got 'x'; see fencerun acl --help");
  EXPECT_EQ(usage_error({"status", "x", "--jsn"}),
            "status: unrecognized option '--jsn', did you mean '--json'? (see fencerun status --help)");
  EXPECT_EQ(usage_error({"break", "x", "--ownr", "12345678"}),
            "break: unrecognized option '--ownr', did you mean '--owner'? (see fencerun break --help)");
  EXPECT_EQ(usage_error({"bump", "x", "--abve", "5"}),
            "bump: unrecognized option '--abve', did you mean '--above'? (see fencerun bump --help)");
}

TEST(cli_grammar, says_which_value_is_missing_or_malformed_in_its_own_words) {
  EXPECT_EQ(usage_error({"job", "--ttl"}), "--ttl needs a value (DUR)");
  EXPECT_EQ(usage_error({"-r"}), "-r needs a value (URL)");
  EXPECT_EQ(usage_error({"-E", "abc", "x", "true"}), "--conflict-exit-code: 'abc' is not an exit code (0-255)");
  EXPECT_EQ(usage_error({"--min-replicas", "abc", "x", "true"}), "--min-replicas: 'abc' is not a whole number");
  EXPECT_EQ(usage_error({"--fair=yes", "x", "true"}), "--fair takes no value, got 'yes'");
  EXPECT_EQ(usage_error({"-r", "", "x", "true"}).rfind("-r is empty (an unset variable?)", 0), 0u);
  EXPECT_EQ(usage_error({"--redis=", "x", "true"}).rfind("--redis is empty", 0), 0u);
  EXPECT_EQ(usage_error({"--key-prefix", "", "x", "true"}).rfind("--key-prefix is empty", 0), 0u);
}

TEST(cli_grammar, refuses_a_first_word_one_edit_away_from_a_subcommand) {
  for (auto [typo, sub] : std::vector<std::pair<const char*, const char*>>{
           {"lsit", "list"}, {"stauts", "status"}, {"fnce", "fence"}, {"brake", "break"}, {"bmup", "bump"},
           {"alc", "acl"}, {"rnu", "run"}, {"urn", "run"}, {"stats", "status"}, {"Status", "status"}, {"hlep", "help"}}) {
    EXPECT_EQ(usage_error({typo, "echo", "hi"}),
              std::string("'") + typo + "' is not a subcommand: did you mean '" + sub +
                  "'? (to run a command under a lock of that name: fencerun run " + typo + " ...)");
    // `run NAME` always means a lock.
    EXPECT_EQ(parse({"run", typo, "echo", "hi"}).lock_name, typo);
  }
  EXPECT_EQ(usage_error({"version"}).rfind("'version' is not a subcommand: for the version, run 'fencerun --version'", 0),
            0u);
  // Names that are no typo of a word: digits, punctuation, far from every subcommand, or a changed
  // letter (ordinary words), or a short word's letters in another order.
  for (const char* name : {"job1", "acl-sync", "nightly", "backup", "stat", "lists2", "lost", "last", "dump", "gun",
                           "bread", "hello", "slit", "fenced", "runs", "lists"})
    EXPECT_EQ(parse({name, "true"}).lock_name, name) << name;
}

TEST(cli_grammar, gives_each_subcommand_its_own_help) {
  for (const char* sub : {"run", "status", "list", "break", "bump", "history", "acl"}) {
    const std::string own = fencerun::cli::help_text(sub);
    EXPECT_NE(own, fencerun::cli::help_text()) << sub;
    EXPECT_NE(own.find(std::string(" ") + sub + " "), std::string::npos) << sub;
    EXPECT_EQ(parse({sub, "--help"}).help_text, own) << sub;
    EXPECT_EQ(parse({sub, "-h"}).help_text, own) << sub;
    EXPECT_EQ(parse({"help", sub}).help_text, own) << sub;
    EXPECT_EQ(parse({"-v", sub, "x", "--help"}).help_text, own) << sub;
  }
  EXPECT_EQ(parse({"help", "fence", "redis"}).help_text, fencerun::cli::help_text("fence redis"));
  EXPECT_EQ(parse({"help"}).help_text, fencerun::cli::help_text());
  EXPECT_EQ(usage_error({"help", "nope"}).rfind("help: no help for 'nope'", 0), 0u);
  // Options of another subcommand are not listed.
  EXPECT_EQ(fencerun::cli::help_text("status").find("--ttl"), std::string::npos);
  EXPECT_EQ(fencerun::cli::help_text("acl").find("--redis"), std::string::npos);
  EXPECT_NE(fencerun::cli::help_text("acl").find("(SCAN, CLUSTER NODES);\n                           break and bump "
                                                 "need nothing more than the run rule"),
            std::string::npos);
}

TEST(cli_grammar, version_takes_only_the_connection_options) {
  EXPECT_EQ(parse({"-r", "redis://h", "--timeout", "1s", "--version"}).subcommand, Subcommand::version);
  EXPECT_EQ(usage_error({"--version", "x"}), "--version takes no NAME or COMMAND, got 'x'");
  EXPECT_EQ(usage_error({"--ttl", "5s", "--version"}),
            "--version does not take --ttl (an option of run); see fencerun --help");
}

// fence redis is configured by run's code: TLS files checked before connecting, the sentinels'
// password from $FENCERUN_SENTINEL_PASSWORD.
namespace {

std::optional<std::string> sentinel_env(const char* name) {
  if (std::string_view(name) == "FENCERUN_SENTINEL_PASSWORD") return "sentinel-secret";
  if (std::string_view(name) == "FENCERUN_TOKEN") return "5";
  return std::nullopt;
}

std::optional<int> no_signal(std::string_view) { return std::nullopt; }

}  // namespace

TEST(cli_fence, redis_reads_the_sentinel_password_from_the_environment) {
  Options o = parse({"fence", "redis", "-r", "redis+sentinel://s1:26379,s2:26379/mymaster", "--", "PING"});
  auto c = fencerun::config::make_config(o, sentinel_env, no_signal);
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).sentinel_password, "sentinel-secret");
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).password, std::nullopt);
  EXPECT_EQ(c.common.redacted_url().find("secret"), std::string::npos);
}

TEST(cli_fence, redis_checks_the_tls_files_like_run) {
  const char* missing = "/nonexistent/fencerun-test/ca.pem";
  Options run = parse({"--tls-ca-file", missing, "job", "--", "true"});
  Options fence = parse({"fence", "redis", "--tls-ca-file", missing, "--resource", "r", "--", "PING"});
  std::string run_error, fence_error;
  try {
    fencerun::config::make_config(run, sentinel_env, no_signal);
  } catch (const UsageError& e) {
    run_error = e.what();
  }
  try {
    fencerun::config::make_config(fence, sentinel_env, no_signal);
  } catch (const UsageError& e) {
    fence_error = e.what();
  }
  EXPECT_EQ(run_error.rfind("--tls-ca-file: cannot read '/nonexistent/fencerun-test/ca.pem'", 0), 0u) << run_error;
  EXPECT_EQ(fence_error, run_error);
  // The guard itself stops there, before connecting: a usage error naming the option.
  try {
    fencerun::fence::run(fence, sentinel_env);
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), run_error + " (see fencerun fence --help)");
  }
}

TEST(cli, an_option_given_twice_takes_the_last_value) {
  Options o = parse({"-r", "redis://a:1", "-t", "10s", "-w", "1s", "--ttl", "20s", "-w", "2s", "job", "--", "true"});
  EXPECT_EQ(o.ttl, "20s");
  EXPECT_EQ(o.wait, "2s");
}

// Quorum mode: every -r is kept, in order, one URL each (NAME is not taken for a URL).
TEST(cli, a_repeated_redis_option_keeps_every_server) {
  Options o = parse({"-r", "redis://a:1", "-t", "10s", "--redis", "redis://b:2", "-r", "unix:///s", "job", "--", "true"});
  EXPECT_EQ(o.redis_urls, (std::vector<std::string>{"redis://a:1", "redis://b:2", "unix:///s"}));
  EXPECT_EQ(o.lock_name, "job");
  Options s = parse({"status", "-r", "redis://a:1", "-r", "redis://b:2", "job"});
  EXPECT_EQ(s.redis_urls, (std::vector<std::string>{"redis://a:1", "redis://b:2"}));
  EXPECT_EQ(s.lock_name, "job");
}

// --server is the same option as -r and --redis: repeatable, one URL each, in order, whichever
// spelling, for every command that takes a server.
TEST(cli, server_is_the_same_option_as_redis) {
  Options o = parse({"--server", "redis://a:1", "-r", "redis://b:2", "--redis", "redis://c:3", "--server=unix:///s",
                     "job", "--", "true"});
  EXPECT_EQ(o.redis_urls, (std::vector<std::string>{"redis://a:1", "redis://b:2", "redis://c:3", "unix:///s"}));
  // Messages about the URL name the spelling given.
  EXPECT_EQ(o.server_option, "--server");
  EXPECT_EQ(parse({"-r", "redis://a:1", "job", "true"}).server_option, "--redis");
  EXPECT_EQ(o.lock_name, "job");
  EXPECT_EQ(o.command, (Args{"true"}));
  EXPECT_EQ(parse({"job", "--server", "etcd://e1:2379,e2:2379", "true"}).redis_urls,
            std::vector<std::string>{"etcd://e1:2379,e2:2379"});
  for (const char* sub : {"status", "list", "break", "bump", "history"})
    EXPECT_EQ(parse({sub, "--server", "redis://h", "x"}).redis_urls, std::vector<std::string>{"redis://h"}) << sub;
  EXPECT_EQ(parse({"--server", "redis://h", "--version"}).subcommand, Subcommand::version);
  Options f = parse({"fence", "redis", "--server", "redis://h", "--token", "3", "--resource", "r", "--", "PING"});
  EXPECT_EQ(f.redis_urls, std::vector<std::string>{"redis://h"});
  EXPECT_EQ(f.command, (Args{"PING"}));
  // Its messages name it as typed.
  EXPECT_EQ(usage_error({"--server"}), "--server needs a value (URL)");
  EXPECT_EQ(usage_error({"--server", "", "x", "true"}),
            "--server is empty (an unset variable?): give a URL, or leave --server out to use $FENCERUN_SERVER, "
            "$FENCERUN_REDIS_URL, $REDIS_URL or redis://127.0.0.1:6379");
  EXPECT_EQ(usage_error({"--servr", "x", "true"}), "unrecognized option '--servr', did you mean '--server'?");
  EXPECT_EQ(usage_error({"--reddis", "x", "true"}), "unrecognized option '--reddis', did you mean '--redis'?");
  EXPECT_EQ(usage_error({"acl", "--server", "redis://h"}),
            "acl does not take --server (an option of run, status, list, break, bump, history and fence redis); "
            "see fencerun acl --help");
  // Declared (and so documented) under both long names, with -r.
  for (const auto& d : fencerun::cli::declared_options()) {
    const bool server = std::ranges::find(d.names, "--redis") != d.names.end();
    EXPECT_EQ(std::ranges::find(d.names, "--server") != d.names.end(), server) << d.command;
    EXPECT_EQ(std::ranges::find(d.names, "-r") != d.names.end(), server) << d.command;
  }
  EXPECT_NE(fencerun::cli::help_text().find("\n  -r, --server, --redis URL\n"), std::string::npos);
}

// The help of every command that takes a server names each kind: Redis's schemes, etcd's, and
// quorum mode.
TEST(cli_help, names_redis_etcd_and_quorum_mode) {
  for (const char* command : {"", "run", "status", "list", "break", "history", "fence redis"}) {
    const std::string help = fencerun::cli::help_text(command);
    for (const char* word : {"redis://", "rediss://", "unix://", "redis+sentinel://", "rediss+sentinel://", "etcd://",
                             "etcds://", "-r given 3, 5 or 7 times", "$FENCERUN_SERVER"})
      EXPECT_NE(help.find(word), std::string::npos) << "'" << command << "': " << word;
  }
  for (const char* command : {"", "run"})
    EXPECT_NE(fencerun::cli::help_text(command).find("an etcd cluster"), std::string::npos) << command;
  EXPECT_EQ(fencerun::cli::help_text("acl").find("etcd://"), std::string::npos);
}

namespace {

// The words `fencerun --help` lists under "Subcommands", in order.
std::vector<std::string> listed_commands(const std::string& help) {
  std::vector<std::string> words;
  std::istringstream in(help);
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (!in_section) {
      in_section = line.starts_with("Subcommands");
      continue;
    }
    if (line.empty()) break;
    if (line.starts_with("  ") && line[2] != ' ') words.push_back(line.substr(2, line.find(' ', 2) - 2));
  }
  return words;
}

}  // namespace

// One table of commands: what `fencerun --help` lists is what the parser dispatches and what has a help.
TEST(cli_help, lists_every_command_the_parser_knows) {
  const std::vector<std::string> listed = listed_commands(fencerun::cli::help_text());
  EXPECT_EQ(listed, (std::vector<std::string>{"run", "status", "list", "break", "bump", "history", "acl", "fence",
                                              "help"}));
  EXPECT_NE(fencerun::cli::help_text().find("\n  history NAME             the recorded runs of NAME, newest first\n"),
            std::string::npos);
  EXPECT_NE(fencerun::cli::help_text().find("\n  fence file|redis|sql     "), std::string::npos);
  // Every command with a help of its own is listed (as its first word), and every listed word but
  // help is a command whose --help and `help WORD` are its own help.
  std::vector<std::string> helped;
  for (const std::string& c : fencerun::cli::help_commands())
    if (!c.empty() && c.find(' ') == std::string::npos) helped.push_back(c);
  helped.push_back("help");
  EXPECT_EQ(helped, listed);
  for (const std::string& word : listed) {
    if (word == "help") continue;
    const std::string own = fencerun::cli::help_text(word);
    EXPECT_FALSE(own.empty()) << word;
    EXPECT_EQ(parse({word.c_str(), "--help"}).help_text, own) << word;
    EXPECT_EQ(parse({"help", word.c_str()}).help_text, own) << word;
  }
  // The same table answers `help` with a wrong command, and picks the typo's subcommand.
  EXPECT_EQ(usage_error({"help", "histroy"}),
            "help: no help for 'histroy' (commands: run, status, list, break, bump, history, acl, fence, fence file, "
            "fence redis, fence sql)");
  EXPECT_EQ(usage_error({"histroy", "x"}).rfind("'histroy' is not a subcommand: did you mean 'history'?", 0), 0u);
  EXPECT_EQ(fencerun::cli::help_commands(),
            (std::vector<std::string>{"", "run", "status", "list", "break", "bump", "history", "acl", "fence",
                                      "fence file", "fence redis", "fence sql"}));
}
