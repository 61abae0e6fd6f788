#include <gtest/gtest.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "cli/parse.hpp"
#include "util/error.hpp"

using fencerun::UsageError;
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
  EXPECT_EQ(o.redis_url, std::nullopt);
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
  EXPECT_EQ(o.redis_url, "redis://db:6380/1");
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
  EXPECT_EQ(o.redis_url, "redis://db");
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
  EXPECT_EQ(o.redis_url, "redis://db");
  EXPECT_TRUE(o.command.empty());
}

TEST(cli, rejects_a_command_for_status) {
  EXPECT_EQ(usage_error({"status", "nightly", "--", "true"}),
            "status takes no COMMAND (to run a command under a lock named 'status': fencerun run status -- COMMAND)");
}

TEST(cli, parses_acl) {
  Options o = parse({"acl", "--key-prefix", "jobs:", "--delex"});
  EXPECT_EQ(o.subcommand, Subcommand::acl);
  EXPECT_EQ(o.key_prefix, "jobs:");
  EXPECT_TRUE(o.acl_delex);
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
  EXPECT_EQ(usage_error({"nightly"}), "missing COMMAND (fencerun [OPTIONS] NAME [--] COMMAND [ARG...])");
  EXPECT_EQ(usage_error({"help"}), "for help, run 'fencerun --help'");
  EXPECT_EQ(usage_error({"status", "--", "true"}),
            "status takes no COMMAND (to run a command under a lock named 'status': fencerun run status -- COMMAND)");
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
                             "--verbose", "--quiet", "--log-format", "--json", "--min-replicas", "--replica-timeout",
                             "--tls-ca-file", "--tls-cert", "--tls-key", "--tls-server-name", "--tls-insecure",
                             "--help", "--version"})
    EXPECT_NE(help.find(option), std::string::npos) << option;
}
