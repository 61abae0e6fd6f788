#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "support/targets.hpp"
#include "config/config.hpp"
#include "util/error.hpp"

using fencerun::UsageError;
using fencerun::config::Config;
using fencerun::config::LogFormat;
using fencerun::config::LogLevel;
using fencerun::config::make_config;
using fencerun::config::Options;
using fencerun::config::Subcommand;
using Transport = fencerun::redis::RedisEndpoint::Transport;
using std::chrono::milliseconds;

namespace {

using Env = std::map<std::string, std::string>;

std::optional<int> fake_parse_signal(std::string_view name) {
  static const std::map<std::string, int, std::less<>> k_signals{
      {"TERM", 15}, {"SIGTERM", 15}, {"INT", 2}, {"HUP", 1}, {"KILL", 9}, {"USR1", 10}, {"15", 15}, {"2", 2}};
  auto it = k_signals.find(name);
  if (it == k_signals.end()) return std::nullopt;
  return it->second;
}

Options run_options(std::vector<std::string> command = {"true"}) {
  Options o;
  o.lock_name = "nightly";
  o.command = std::move(command);
  return o;
}

Config configure(const Options& o, const Env& env = {}) {
  std::vector<std::string> asked;
  return make_config(
      o,
      [&env](const char* name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      fake_parse_signal);
}

// A directory of its own under $TMPDIR, removed with what is in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fencerun-config-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    m_path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(m_path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // Creates `name` with some content and returns its path.
  std::string file(const std::string& name) const {
    std::ofstream(m_path / name) << "-----BEGIN CERTIFICATE-----\n";
    return (m_path / name).string();
  }
  std::string path(const std::string& name) const { return (m_path / name).string(); }

 private:
  std::filesystem::path m_path;
};

// The message of the UsageError that make_config throws, or "<no error>".
std::string usage_error(const Options& o, const Env& env = {}) {
  try {
    configure(o, env);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(make_config, applies_the_defaults) {
  Config c = configure(run_options({"backup", "--all"}));
  EXPECT_EQ(c.subcommand, Subcommand::run);
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).transport, Transport::tcp);
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).host, "127.0.0.1");
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).port, 6379);
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).db, 0);
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).password, std::nullopt);
  EXPECT_EQ(c.common.redacted_url(), "redis://127.0.0.1:6379");
  EXPECT_EQ(c.common.timeout, milliseconds(2'000));
  EXPECT_EQ(c.common.key_prefix, "fencerun:");
  EXPECT_EQ(c.common.log_level, LogLevel::warn);
  EXPECT_EQ(c.common.log_format, LogFormat::text);
  EXPECT_EQ(c.run.lock, "nightly");
  EXPECT_EQ(c.run.timing.ttl, milliseconds(30'000));
  EXPECT_EQ(c.run.timing.renew, milliseconds(10'000));
  EXPECT_EQ(c.run.timing.grace, milliseconds(5'000));
  EXPECT_EQ(c.run.kill_signal, 15);
  EXPECT_EQ(c.run.wait, milliseconds(0));
  EXPECT_EQ(c.run.conflict_exit_code, 75);
  EXPECT_EQ(c.run.lease_lost_exit_code, 124);
  EXPECT_EQ(c.run.command, (std::vector<std::string>{"backup", "--all"}));
}

// Where the lock lives: --redis, else $FENCERUN_REDIS_URL, else $REDIS_URL, else the default.

TEST(make_config, prefers_the_redis_option_to_the_environment) {
  Options o = run_options();
  o.redis_urls = {"redis://option.example:7001"};
  Config c = configure(o, {{"FENCERUN_REDIS_URL", "redis://fencerun.example"}, {"REDIS_URL", "redis://plain.example"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).host, "option.example");
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).port, 7001);
}

TEST(make_config, prefers_fencerun_redis_url_to_redis_url) {
  Config c = configure(run_options(),
                       {{"FENCERUN_REDIS_URL", "redis://fencerun.example/2"}, {"REDIS_URL", "redis://plain.example"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).host, "fencerun.example");
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).db, 2);
}

TEST(make_config, refuses_the_server_list_a_quorum_mode_run_gives_its_command) {
  const Env env = {{"FENCERUN_REDIS_URL", "redis://a:6379 redis://b:6379 redis://c:6379"}};
  EXPECT_EQ(usage_error(run_options(), env),
            "$FENCERUN_REDIS_URL names several servers (set by a quorum-mode fencerun); give the server to use with "
            "-r URL");
  Options o = run_options();
  o.redis_urls = {"redis://resource:6379"};
  EXPECT_EQ(fencerun::test::redis_endpoint(configure(o, env).common).host, "resource");
}

TEST(make_config, falls_back_to_redis_url) {
  Config c = configure(run_options(), {{"REDIS_URL", "unix:///run/redis.sock?db=3"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).transport, Transport::unix_socket);
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).path, "/run/redis.sock");
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).db, 3);
  EXPECT_EQ(c.common.redacted_url(), "unix:///run/redis.sock?db=3");
}

TEST(make_config, skips_empty_url_variables) {
  Config c = configure(run_options(), {{"FENCERUN_REDIS_URL", ""}, {"REDIS_URL", "redis://plain.example"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).host, "plain.example");
  Config d = configure(run_options(), {{"FENCERUN_REDIS_URL", ""}, {"REDIS_URL", ""}});
  EXPECT_EQ(d.common.redacted_url(), "redis://127.0.0.1:6379");
}

TEST(make_config, rejects_a_bad_url_naming_the_redis_option) {
  Options o = run_options();
  o.redis_urls = {"http://example:80"};
  // Every backend's schemes are listed (the registry's table), and nothing of the URL past its scheme.
  EXPECT_EQ(usage_error(o),
            "--redis: unknown URL scheme 'http://'; fencerun takes redis://, rediss://, unix://, redis+sentinel://, "
            "rediss+sentinel://, etcd://, etcds://");
  // A URL from the environment is blamed on its variable, not on -r.
  EXPECT_EQ(usage_error(run_options(), {{"REDIS_URL", "redis://host:http"}}),
            "$REDIS_URL: the port is not a number from 1 to 65535");
  EXPECT_EQ(usage_error(run_options(), {{"FENCERUN_REDIS_URL", "bogus"}}).rfind("$FENCERUN_REDIS_URL: not a URL", 0),
            0u);
  // $FENCERUN_SERVER, the neutral spelling, comes first.
  EXPECT_EQ(fencerun::test::redis_endpoint(
                configure(run_options(), {{"FENCERUN_SERVER", "redis://neutral:7"}, {"FENCERUN_REDIS_URL", "redis://old:8"}})
                    .common)
                .host,
            "neutral");
  // The spelling given is the one blamed.
  o.server_option = "--server";
  EXPECT_EQ(usage_error(o).rfind("--server: unknown URL scheme 'http://'", 0), 0u) << usage_error(o);
  o.server_option = "--redis";
  // Near misses of a scheme are named, for etcd as for Redis.
  for (const char* url : {"etc://h:2379", "etcd:/h:2379", "etcds//h:2379"}) {
    o.redis_urls = {url};
    EXPECT_NE(usage_error(o).find("etcd://, etcds://"), std::string::npos) << url;
    EXPECT_NE(usage_error(o).find("did you mean etcd"), std::string::npos) << url << ": " << usage_error(o);
  }
  // A password with an unencoded '@' or ':' says how to write it.
  o.redis_urls = {"redis://u:p@ss:w/rd@host"};
  EXPECT_NE(usage_error(o).find("must be percent-encoded as %40, %3A, %2F, or given in $FENCERUN_REDIS_PASSWORD"),
            std::string::npos)
      << usage_error(o);
}

TEST(make_config, says_that_a_user_has_no_password) {
  Options o = run_options();
  o.redis_urls = {"redis://bob@host"};
  EXPECT_EQ(usage_error(o), "--redis: no password for user 'bob': give it in the URL (redis://bob:PASSWORD@...) or in "
                            "$FENCERUN_REDIS_PASSWORD");
  EXPECT_EQ(fencerun::test::redis_endpoint(configure(o, {{"FENCERUN_REDIS_PASSWORD", "pw"}}).common).password, "pw");
}

TEST(make_config, refuses_tls_options_on_a_plain_connection) {
  TempDir dir;
  Options o = run_options();
  o.redis_urls = {"redis://host"};
  o.tls_insecure = true;
  EXPECT_EQ(usage_error(o), "--tls-*: TLS options given, but --redis names redis://host:6379, not a TLS URL (use "
                            "rediss:// or rediss+sentinel://)");
  o.tls_insecure = false;
  o.tls_ca_file = dir.file("ca.pem");
  EXPECT_NE(usage_error(o).find("not a TLS URL"), std::string::npos);
}

// The password: from the URL, else $FENCERUN_REDIS_PASSWORD, else $REDISCLI_AUTH.

TEST(make_config, prefers_the_password_in_the_url) {
  Options o = run_options();
  o.redis_urls = {"redis://alice:from-url@host"};
  Config c = configure(o, {{"FENCERUN_REDIS_PASSWORD", "from-fencerun"}, {"REDISCLI_AUTH", "from-cli"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).user, "alice");
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).password, "from-url");
}

TEST(make_config, prefers_fencerun_redis_password_to_rediscli_auth) {
  Config c = configure(run_options(), {{"FENCERUN_REDIS_PASSWORD", "from-fencerun"}, {"REDISCLI_AUTH", "from-cli"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).password, "from-fencerun");
}

TEST(make_config, falls_back_to_rediscli_auth) {
  Config c = configure(run_options(), {{"REDISCLI_AUTH", "from-cli"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).password, "from-cli");
  Config d = configure(run_options(), {{"FENCERUN_REDIS_PASSWORD", ""}, {"REDISCLI_AUTH", "from-cli"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(d.common).password, "from-cli");
}

TEST(make_config, applies_an_environment_password_to_a_url_from_the_environment) {
  Config c = configure(run_options(),
                       {{"REDIS_URL", "redis://bob@db.example:6380"}, {"FENCERUN_REDIS_PASSWORD", "hunter2"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).user, "bob");
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).password, "hunter2");
}

TEST(make_config, leaves_the_password_unset_without_one) {
  Config c = configure(run_options(), {{"FENCERUN_REDIS_PASSWORD", ""}, {"REDISCLI_AUTH", ""}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).password, std::nullopt);
}

TEST(make_config, keeps_every_password_out_of_the_redacted_url) {
  Options o = run_options();
  o.redis_urls = {"redis://alice:hunter2@host:6380/1"};
  EXPECT_EQ(configure(o).common.redacted_url(), "redis://alice@host:6380/1");
  Config c = configure(run_options(), {{"FENCERUN_REDIS_PASSWORD", "hunter3"}});
  EXPECT_EQ(c.common.redacted_url(), "redis://127.0.0.1:6379");
  Config d = configure(run_options(), {{"REDISCLI_AUTH", "hunter4"}});
  EXPECT_EQ(d.common.redacted_url(), "redis://127.0.0.1:6379");
}

// The command.

TEST(make_config, keeps_the_command_argv_intact) {
  Config c = configure(run_options({"printf", "%s\\n", "two words", "'quoted'", "$HOME", ""}));
  EXPECT_EQ(c.run.command, (std::vector<std::string>{"printf", "%s\\n", "two words", "'quoted'", "$HOME", ""}));
}

TEST(make_config, wraps_a_shell_command_in_bin_sh) {
  Options o = run_options({"make -j4 && make install"});
  o.shell = true;
  EXPECT_EQ(configure(o).run.command, (std::vector<std::string>{"/bin/sh", "-c", "make -j4 && make install"}));
}

TEST(make_config, rejects_several_words_with_shell) {
  Options o = run_options({"make", "install"});
  o.shell = true;
  EXPECT_EQ(usage_error(o), "--shell takes exactly one COMMAND string (quote it), got 2 words");
}

TEST(make_config, rejects_a_missing_command) {
  EXPECT_EQ(usage_error(run_options({})), "missing COMMAND (usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...])");
}

TEST(make_config, rejects_an_empty_command_name) {
  EXPECT_EQ(usage_error(run_options({""})), "COMMAND is empty");
}

// The lock NAME.

TEST(make_config, rejects_a_missing_lock_name) {
  Options o = run_options();
  o.lock_name = "";
  EXPECT_EQ(usage_error(o), "missing lock NAME");
}

TEST(make_config, rejects_a_bad_lock_name) {
  Options o = run_options();
  o.lock_name = "{nightly}";
  EXPECT_EQ(usage_error(o), "lock NAME may not contain '{' or '}' (reserved for the Redis Cluster hash tag)");
  o.lock_name = "night ly";
  EXPECT_EQ(usage_error(o), "lock NAME may hold only printable ASCII without spaces");
}

// Durations.

TEST(make_config, reads_ttl_renew_and_grace) {
  Options o = run_options();
  o.ttl = "2m";
  o.renew = "20s";
  o.grace = "1500ms";
  Config c = configure(o);
  EXPECT_EQ(c.run.timing.ttl, milliseconds(120'000));
  EXPECT_EQ(c.run.timing.renew, milliseconds(20'000));
  EXPECT_EQ(c.run.timing.grace, milliseconds(1'500));
}

TEST(make_config, rejects_a_bad_ttl_naming_the_option) {
  Options o = run_options();
  o.ttl = "abc";
  EXPECT_EQ(usage_error(o), "--ttl: 'abc' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  o.ttl = "10x";
  EXPECT_EQ(usage_error(o), "--ttl: '10x' has an unknown unit 'x' (use ms, s, m or h)");
}

TEST(make_config, rejects_zero_and_negative_ttls) {
  Options o = run_options();
  o.ttl = "0";
  EXPECT_EQ(usage_error(o), "--ttl: 0s is too short (at least 100ms)");
  o.ttl = "-30s";
  EXPECT_EQ(usage_error(o), "--ttl: -30s is too short (at least 100ms)");
}

TEST(make_config, rejects_renew_not_smaller_than_the_ttl) {
  Options o = run_options();
  o.ttl = "10s";
  o.renew = "10s";
  EXPECT_EQ(usage_error(o), "--renew: 10s must be smaller than --ttl 10s");
  o.renew = "bogus";
  EXPECT_EQ(usage_error(o), "--renew: 'bogus' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  o.renew = "0";
  EXPECT_EQ(usage_error(o), "--renew: must be positive, got 0s");
}

TEST(make_config, rejects_a_grace_too_large_naming_the_option) {
  Options o = run_options();
  o.grace = "20s";
  EXPECT_EQ(usage_error(o),
            "--grace: 20s is too large for --ttl 30s: renew + grace + 100ms margin + 302ms drift must stay "
            "below the ttl (with --renew 10s, at most 19597ms)");
  o.grace = "-1s";
  EXPECT_EQ(usage_error(o), "--grace: must not be negative, got -1s");
  o.grace = "1.5ms";
  EXPECT_EQ(usage_error(o), "--grace: '1.5ms' is not a whole number of milliseconds");
  o.grace = "-0.5s";
  EXPECT_EQ(usage_error(o), "--grace: must not be negative, got -500ms");
}

TEST(make_config, accepts_renew_a_third_and_grace_a_sixth_of_the_ttl) {
  Options o = run_options();
  o.ttl = "600ms";
  o.renew = "200ms";
  o.grace = "100ms";
  Config c = configure(o);
  EXPECT_EQ(c.run.timing.renew, milliseconds(200));
  EXPECT_EQ(c.run.timing.grace, milliseconds(100));
}

TEST(make_config, reads_the_timeout) {
  Options o = run_options();
  o.timeout = "250ms";
  EXPECT_EQ(configure(o).common.timeout, milliseconds(250));
}

TEST(make_config, rejects_a_zero_or_bad_timeout) {
  Options o = run_options();
  o.timeout = "0";
  EXPECT_EQ(usage_error(o), "--timeout: must be positive, got 0");
  o.timeout = "-1s";
  EXPECT_EQ(usage_error(o), "--timeout: must be positive, got -1s");
  o.timeout = "5x";
  EXPECT_EQ(usage_error(o), "--timeout: '5x' has an unknown unit 'x' (use ms, s, m or h)");
}

// --wait.

TEST(make_config, waits_forever_for_inf) {
  Options o = run_options();
  for (const char* forever : {"inf", "infinity", "forever"}) {
    o.wait = forever;
    EXPECT_EQ(configure(o).run.wait, std::nullopt) << forever;
  }
}

TEST(make_config, reads_a_finite_wait) {
  Options o = run_options();
  o.wait = "90s";
  EXPECT_EQ(configure(o).run.wait, milliseconds(90'000));
  o.wait = "0";
  EXPECT_EQ(configure(o).run.wait, milliseconds(0));
}

TEST(make_config, rejects_a_negative_or_bad_wait) {
  Options o = run_options();
  o.wait = "-1s";
  EXPECT_EQ(usage_error(o), "--wait: must not be negative, got -1s");
  o.wait = "soon";
  EXPECT_EQ(usage_error(o), "--wait: 'soon' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
}

TEST(make_config, waits_a_fraction_of_a_second_as_flock_does) {
  Options o = run_options();
  o.wait = "0.5";
  EXPECT_EQ(configure(o).run.wait, milliseconds(500));
  o.wait = "1m30s";
  EXPECT_EQ(configure(o).run.wait, milliseconds(90'000));
}

TEST(make_config, reads_fractions_and_compounds_in_every_duration_option) {
  Options o = run_options();
  o.ttl = "1m30s";
  o.renew = "20.5s";
  o.grace = "1s500ms";
  o.timeout = "0.25";
  o.replica_timeout = "0.75s";
  Config c = configure(o);
  EXPECT_EQ(c.run.timing.ttl, milliseconds(90'000));
  EXPECT_EQ(c.run.timing.renew, milliseconds(20'500));
  EXPECT_EQ(c.run.timing.grace, milliseconds(1'500));
  EXPECT_EQ(c.common.timeout, milliseconds(250));
  EXPECT_EQ(c.run.replica_timeout, milliseconds(750));
}

TEST(make_config, rejects_a_bad_fraction_or_compound_naming_the_option) {
  Options o = run_options();
  o.ttl = "1s2m";
  EXPECT_EQ(usage_error(o), "--ttl: '1s2m' has its units out of order (largest first, as in 1h30m, 2m30s, 1s500ms)");
  o.ttl = "30s";
  o.wait = "1s1s";
  EXPECT_EQ(usage_error(o), "--wait: '1s1s' repeats the unit 's'");
  o.wait = "0.0001s";
  EXPECT_EQ(usage_error(o), "--wait: '0.0001s' is not a whole number of milliseconds");
  o.wait = "-0.5";
  EXPECT_EQ(usage_error(o), "--wait: must not be negative, got -0.5");
  o.wait = ".5";
  EXPECT_EQ(usage_error(o), "--wait: '.5' needs a digit before the decimal point (as in 0.5s)");
  o.wait = "0";
  o.timeout = "1.";
  EXPECT_EQ(usage_error(o), "--timeout: '1.' needs a digit after the decimal point");
  o.timeout = "0.0";
  EXPECT_EQ(usage_error(o), "--timeout: must be positive, got 0.0");
}

// Signals and exit codes.

TEST(make_config, resolves_the_kill_signal_through_the_given_parser) {
  Options o = run_options();
  o.kill_signal = "INT";
  EXPECT_EQ(configure(o).run.kill_signal, 2);
  o.kill_signal = "USR1";
  EXPECT_EQ(configure(o).run.kill_signal, 10);
}

TEST(make_config, rejects_an_unknown_kill_signal) {
  Options o = run_options();
  o.kill_signal = "BOGUS";
  EXPECT_EQ(usage_error(o), "--kill-signal: 'BOGUS' is not a signal name or number");
}

TEST(make_config, reads_the_exit_codes) {
  Options o = run_options();
  o.conflict_exit_code = 0;
  o.lease_lost_exit_code = 255;
  Config c = configure(o);
  EXPECT_EQ(c.run.conflict_exit_code, 0);
  EXPECT_EQ(c.run.lease_lost_exit_code, 255);
}

TEST(make_config, rejects_exit_codes_outside_0_to_255) {
  Options o = run_options();
  o.conflict_exit_code = 256;
  EXPECT_EQ(usage_error(o), "--conflict-exit-code: 256 is not an exit code (0-255)");
  o.conflict_exit_code = 75;
  o.lease_lost_exit_code = -1;
  EXPECT_EQ(usage_error(o), "--lease-lost-exit-code: -1 is not an exit code (0-255)");
}

// Common options.

TEST(make_config, rejects_braces_in_the_key_prefix) {
  Options o = run_options();
  o.key_prefix = "app{1}:";
  EXPECT_EQ(usage_error(o), "--key-prefix: may not contain '{' or '}' (reserved for the Redis Cluster hash tag)");
}

TEST(make_config, keeps_a_custom_key_prefix) {
  Options o = run_options();
  o.key_prefix = "jobs:";
  EXPECT_EQ(configure(o).common.key_prefix, "jobs:");
}

TEST(make_config, maps_verbosity_to_log_levels) {
  Options o = run_options();
  const std::pair<int, LogLevel> cases[] = {{-2, LogLevel::error}, {-1, LogLevel::error}, {0, LogLevel::warn},
                                            {1, LogLevel::info},   {2, LogLevel::debug},  {3, LogLevel::debug}};
  for (auto [verbosity, level] : cases) {
    o.verbosity = verbosity;
    EXPECT_EQ(configure(o).common.log_level, level) << verbosity;
  }
}

TEST(make_config, reads_the_log_format) {
  Options o = run_options();
  o.log_format = "json";
  EXPECT_EQ(configure(o).common.log_format, LogFormat::json);
  o.log_format = "xml";
  EXPECT_EQ(usage_error(o), "--log-format: 'xml' is not one of text, json");
}

// Subcommands.

TEST(make_config, needs_no_command_for_status) {
  Options o = run_options({});
  o.subcommand = Subcommand::status;
  o.json = true;
  Config c = configure(o);
  EXPECT_EQ(c.subcommand, Subcommand::status);
  EXPECT_EQ(c.run.lock, "nightly");
  EXPECT_TRUE(c.json);
}

TEST(make_config, rejects_a_command_for_status) {
  Options o = run_options({"true"});
  o.subcommand = Subcommand::status;
  EXPECT_EQ(usage_error(o), "status takes no COMMAND");
}

TEST(make_config, needs_no_lock_name_for_version_and_help) {
  for (Subcommand s : {Subcommand::version, Subcommand::help}) {
    Options o;
    o.subcommand = s;
    EXPECT_EQ(configure(o).subcommand, s);
  }
}

TEST(make_config, needs_no_lock_name_for_acl) {
  Options o;
  o.subcommand = Subcommand::acl;
  o.acl_delex = true;
  o.key_prefix = "jobs:";
  Config c = configure(o);
  EXPECT_EQ(c.subcommand, Subcommand::acl);
  EXPECT_TRUE(c.acl_delex);
  EXPECT_EQ(c.common.key_prefix, "jobs:");
}

// Sentinels and TLS.

TEST(make_config, reads_the_sentinel_password_from_the_environment) {
  Options o = run_options();
  o.redis_urls = {"redis+sentinel://s1:26379/main"};
  Config c = configure(o, {{"FENCERUN_SENTINEL_PASSWORD", "sentinel-secret"}, {"REDISCLI_AUTH", "master-secret"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).sentinel_password, "sentinel-secret");
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).password, "master-secret");
  EXPECT_EQ(c.common.redacted_url(), "redis+sentinel://s1:26379/main");
}

TEST(make_config, ignores_the_sentinel_password_without_sentinels) {
  Config c = configure(run_options(), {{"FENCERUN_SENTINEL_PASSWORD", "sentinel-secret"}});
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).sentinel_password, std::nullopt);
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).password, std::nullopt);
}

TEST(make_config, passes_the_tls_options_on) {
  TempDir dir;
  Options o = run_options();
  o.redis_urls = {"rediss://secure.example:6380"};
  o.tls_ca_file = dir.file("ca.pem");
  o.tls_cert = dir.file("client.pem");
  o.tls_key = dir.file("client.key");
  o.tls_server_name = "redis.internal";
  o.tls_insecure = true;
  Config c = configure(o);
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).transport, Transport::tls);
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).tls.ca_file, dir.path("ca.pem"));
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).tls.cert_file, dir.path("client.pem"));
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).tls.key_file, dir.path("client.key"));
  EXPECT_EQ(fencerun::test::redis_endpoint(c.common).tls.server_name, "redis.internal");
  EXPECT_TRUE(fencerun::test::redis_endpoint(c.common).tls.insecure);
}

TEST(make_config, verifies_tls_by_default) {
  Options o = run_options();
  o.redis_urls = {"rediss://secure.example"};
  EXPECT_FALSE(fencerun::test::redis_endpoint(configure(o).common).tls.insecure);
}

TEST(make_config, rejects_a_tls_key_without_a_certificate) {
  Options o = run_options();
  o.redis_urls = {"rediss://secure.example"};
  o.tls_key = "/etc/client.key";
  EXPECT_EQ(usage_error(o), "--tls-key: needs --tls-cert as well");
}

TEST(make_config, rejects_a_missing_tls_file_naming_the_option_and_the_path) {
  TempDir dir;
  Options o = run_options();
  o.redis_urls = {"rediss://secure.example"};
  o.tls_ca_file = dir.path("missing-ca.pem");
  EXPECT_EQ(usage_error(o), "--tls-ca-file: cannot read '" + dir.path("missing-ca.pem") + "': No such file or directory");
  o.tls_ca_file = dir.file("ca.pem");
  o.tls_cert = dir.path("missing-client.pem");
  EXPECT_EQ(usage_error(o), "--tls-cert: cannot read '" + dir.path("missing-client.pem") + "': No such file or directory");
  o.tls_cert = dir.file("client.pem");
  o.tls_key = dir.path("missing-client.key");
  EXPECT_EQ(usage_error(o), "--tls-key: cannot read '" + dir.path("missing-client.key") + "': No such file or directory");
  o.tls_key = dir.file("client.key");
  EXPECT_EQ(fencerun::test::redis_endpoint(configure(o).common).tls.key_file, dir.path("client.key"));
}

TEST(make_config, rejects_a_tls_file_in_a_missing_directory) {
  Options o = run_options();
  o.redis_urls = {"rediss://secure.example"};
  o.tls_ca_file = "/nonexistent-fencerun-dir/ca.pem";
  EXPECT_EQ(usage_error(o), "--tls-ca-file: cannot read '/nonexistent-fencerun-dir/ca.pem': No such file or directory");
}

TEST(make_config, rejects_a_directory_as_a_tls_file) {
  TempDir dir;
  Options o = run_options();
  o.redis_urls = {"rediss://secure.example"};
  o.tls_cert = dir.path("");
  EXPECT_EQ(usage_error(o), "--tls-cert: '" + o.tls_cert + "' is a directory, not a file");
}

TEST(make_config, rejects_an_unreadable_tls_file) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads every file";
  TempDir dir;
  std::string ca = dir.file("ca.pem");
  ASSERT_EQ(::chmod(ca.c_str(), 0), 0);
  Options o = run_options();
  o.redis_urls = {"rediss://secure.example"};
  o.tls_ca_file = ca;
  EXPECT_EQ(usage_error(o), "--tls-ca-file: cannot read '" + ca + "': Permission denied");
}

TEST(make_config, checks_the_tls_files_before_anything_connects) {
  // The status subcommand and plain redis:// URLs go through the same check: a file named on the
  // command line that cannot be read is a typo wherever it appears.
  Options o = run_options({});
  o.subcommand = Subcommand::status;
  o.redis_urls = {"rediss://secure.example"};
  o.tls_ca_file = "/nonexistent-fencerun-dir/ca.pem";
  EXPECT_EQ(usage_error(o), "--tls-ca-file: cannot read '/nonexistent-fencerun-dir/ca.pem': No such file or directory");
  o.redis_urls = {"redis://plain.example"};
  EXPECT_EQ(usage_error(o), "--tls-ca-file: cannot read '/nonexistent-fencerun-dir/ca.pem': No such file or directory");
}

// Replica acknowledgement.

TEST(make_config, reads_min_replicas_and_the_replica_timeout) {
  Options o = run_options();
  o.min_replicas = 2;
  o.replica_timeout = "500ms";
  Config c = configure(o);
  EXPECT_EQ(c.run.min_replicas, 2);
  EXPECT_EQ(c.run.replica_timeout, milliseconds(500));
  Config d = configure(run_options());
  EXPECT_EQ(d.run.min_replicas, 0);
  EXPECT_EQ(d.run.replica_timeout, milliseconds(1'000));
}

TEST(make_config, rejects_negative_min_replicas) {
  Options o = run_options();
  o.min_replicas = -1;
  EXPECT_EQ(usage_error(o), "--min-replicas: must not be negative");
}

TEST(make_config, rejects_a_zero_or_bad_replica_timeout) {
  Options o = run_options();
  o.replica_timeout = "0";
  EXPECT_EQ(usage_error(o), "--replica-timeout: must be positive, got 0");
  o.replica_timeout = "soon";
  EXPECT_EQ(usage_error(o), "--replica-timeout: 'soon' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
}

TEST(make_config, keeps_the_replica_timeout_below_half_the_ttl) {
  Options o = run_options();
  o.ttl = "2s";
  o.min_replicas = 1;
  o.replica_timeout = "1s";
  EXPECT_EQ(usage_error(o), "--replica-timeout: 1s must be shorter than half of --ttl 2s");
  o.replica_timeout = "999ms";
  EXPECT_EQ(configure(o).run.replica_timeout, milliseconds(999));
  o.min_replicas = 0;
  o.replica_timeout = "5s";
  EXPECT_EQ(configure(o).run.replica_timeout, milliseconds(5'000));
}

// --limit N.

TEST(make_config, reads_the_limit_and_defaults_to_one) {
  EXPECT_EQ(configure(run_options()).run.limit, 1);
  for (auto [text, n] : {std::pair{"1", 1L}, {"2", 2L}, {"1024", 1024L}, {"007", 7L}, {"0000000012", 12L}}) {
    Options o = run_options();
    o.limit = text;
    EXPECT_EQ(configure(o).run.limit, n) << text;
  }
}

TEST(make_config, rejects_a_limit_outside_one_to_1024) {
  for (const char* text : {"0", "1025", "999999", "00000", "-1", "-3", "99999999999999999999", "00001025"}) {
    Options o = run_options();
    o.limit = text;
    EXPECT_EQ(usage_error(o), std::string("--limit: ") + text + " is not from 1 to 1024");
  }
}

TEST(make_config, rejects_a_limit_that_is_not_a_whole_number) {
  for (const char* text : {"abc", "", "-", "+2", "2.5", " 3", "3 ", "1e3", "0x10", "--1"}) {
    Options o = run_options();
    o.limit = text;
    EXPECT_EQ(usage_error(o), std::string("--limit: '") + text + "' is not a whole number from 1 to 1024") << text;
  }
}

// list, break, bump.

TEST(make_config, reads_list_break_and_bump) {
  Options l;
  l.subcommand = Subcommand::list;
  EXPECT_EQ(configure(l).list_pattern, "*");
  l.list_pattern = "db-*";
  l.list_all = true;
  l.json = true;
  Config lc = configure(l);
  EXPECT_EQ(lc.list_pattern, "db-*");
  EXPECT_TRUE(lc.list_all);
  EXPECT_TRUE(lc.json);

  Options b;
  b.subcommand = Subcommand::break_lock;
  b.lock_name = "nightly";
  b.break_owner = "3F2A9C1E";
  b.yes = true;
  Config bc = configure(b);
  EXPECT_EQ(bc.run.lock, "nightly");
  EXPECT_EQ(bc.break_owner, "3f2a9c1e");  // owner ids are lower-case hex
  EXPECT_TRUE(bc.yes);

  Options u;
  u.subcommand = Subcommand::bump;
  u.lock_name = "nightly";
  u.bump_above = "9007199254740990";  // the largest N some token (2^53 - 1) can still exceed
  EXPECT_EQ(configure(u).bump_above, 9'007'199'254'740'990u);
  // One more would leave the lock no token to issue: every later run would fail.
  u.bump_above = "9007199254740991";
  EXPECT_EQ(usage_error(u),
            "--above: 9007199254740991 leaves no token to issue: tokens stay below 2^53, so the next one can exceed "
            "at most 9007199254740990");
}

TEST(make_config, rejects_bad_break_and_bump_input) {
  Options b;
  b.subcommand = Subcommand::break_lock;
  EXPECT_EQ(usage_error(b), "missing lock NAME");
  b.lock_name = "nightly";
  b.break_owner = "3f2a9c1";
  EXPECT_EQ(usage_error(b), "--owner: '3f2a9c1' is too short to name one holder: give at least 8 hex digits");
  for (const char* bad : {"xyz12345", "", "3f2a9c1e-", "0123456789abcdef0123456789abcdef0"}) {
    b.break_owner = bad;
    EXPECT_EQ(usage_error(b), std::string("--owner: '") + bad + "' is not the start of an owner id (hex digits, as status shows)");
  }

  Options u;
  u.subcommand = Subcommand::bump;
  EXPECT_EQ(usage_error(u), "missing lock NAME");
  u.lock_name = "nightly";
  EXPECT_EQ(usage_error(u), "bump: missing --above N");
  for (const char* bad : {"0", "-1", "abc", "", "1e3", "9007199254740992", "99999999999999999"}) {
    u.bump_above = bad;
    EXPECT_EQ(usage_error(u), std::string("--above: '") + bad + "' is not a positive integer below 2^53") << bad;
  }

  Options l;
  l.subcommand = Subcommand::list;
  l.list_pattern = "a b";
  EXPECT_EQ(usage_error(l), "list: PATTERN may hold only printable ASCII without spaces");
}

// ---- The connection a run shares with its job (config::share_connection).

TEST(shared_connection, gives_a_nested_command_the_runs_password_and_tls_settings) {
  TempDir dir;
  Options outer = run_options();
  outer.redis_urls = {"rediss://alice:s3cr%25t%0Aline@secure.example:6380/2"};
  outer.tls_ca_file = dir.file("ca.pem");
  outer.tls_server_name = "redis.internal";
  Config run = configure(outer);
  const int fd = run.common.target->share_connection();
  ASSERT_GE(fd, 3);
  // Sealed: nobody in the job can change it.
  EXPECT_LT(::write(fd, "x", 1), 0);

  Env job = {{"FENCERUN_REDIS_URL", run.common.redacted_url()}, {"FENCERUN_CONNECTION_FD", std::to_string(fd)}};
  Options inner = run_options();
  inner.subcommand = Subcommand::fence;
  Config nested = configure(inner, job);
  EXPECT_EQ(fencerun::test::redis_endpoint(nested.common).password, "s3cr%t\nline");
  EXPECT_EQ(fencerun::test::redis_endpoint(nested.common).user, "alice");
  EXPECT_EQ(fencerun::test::redis_endpoint(nested.common).db, 2);
  EXPECT_EQ(fencerun::test::redis_endpoint(nested.common).tls.ca_file, dir.path("ca.pem"));
  EXPECT_EQ(fencerun::test::redis_endpoint(nested.common).tls.server_name, "redis.internal");
  EXPECT_EQ(nested.common.redacted_url().find("s3cr"), std::string::npos);

  // Not for another URL, nor for -r: those are the command's own choice.
  Env other = job;
  other["FENCERUN_REDIS_URL"] = "rediss://alice@other.example:6380/2";
  EXPECT_NE(usage_error(inner, other).find("no password for user 'alice'"), std::string::npos);
  Options explicit_r = inner;
  explicit_r.redis_urls = {"rediss://alice@secure.example:6380/2"};
  EXPECT_NE(usage_error(explicit_r, job).find("no password for user 'alice'"), std::string::npos);
  // A descriptor that is not a sealed fencerun connection is ignored.
  Env bogus = job;
  bogus["FENCERUN_CONNECTION_FD"] = "0";
  EXPECT_NE(usage_error(inner, bogus).find("no password"), std::string::npos);
  ::close(fd);
  EXPECT_NE(usage_error(inner, job).find("no password"), std::string::npos);
}

TEST(shared_connection, is_not_made_in_quorum_mode) {
  Options o = run_options();
  o.redis_urls = {"redis://a:1", "redis://b:2", "redis://c:3"};
  EXPECT_EQ(configure(o).common.target->share_connection(), -1);
}

namespace {

// The URLs of each backend of the registry, as a run would give them.
std::vector<std::string> urls_of(std::string_view backend) {
  if (backend == "redis") return {"redis://127.0.0.1:6379"};
  if (backend == "quorum") return {"redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"};
  if (backend == "etcd") return {"etcd://127.0.0.1:2379"};
  return {};
}

// An Options that asks for `capability`, on `urls`.
Options asking_for(fencerun::lease::Capability capability, std::vector<std::string> urls) {
  using C = fencerun::lease::Capability;
  Options o = run_options();
  o.redis_urls = std::move(urls);
  o.ttl = "10s";
  switch (capability) {
    case C::limit: o.limit = "2"; break;
    case C::fair: o.fair = true; break;
    case C::min_replicas: o.min_replicas = 1; break;
    case C::min_interval: o.min_interval = "1m"; break;
    case C::break_lock: o.subcommand = Subcommand::break_lock, o.command.clear(); break;
    case C::bump: o.subcommand = Subcommand::bump, o.command.clear(), o.bump_above = "5"; break;
    case C::acl: o.subcommand = Subcommand::acl, o.command.clear(); break;
    case C::shared_connection: break;
    case C::lock_delay: o.lock_delay = "5s"; break;
    case C::every: o.every = "1h"; break;
    case C::if_record_lost: o.if_record_lost = "skip", o.min_interval = "1m"; break;
  }
  return o;
}

}  // namespace

// Every backend of the registry: what it declares it lacks is refused, 64, in the one message format that
// names the capability and the backend; what it declares it has is accepted.
TEST(capabilities, every_backend_refuses_exactly_what_it_declares_it_lacks) {
  using C = fencerun::lease::Capability;
  const C asked[] = {C::limit, C::fair, C::min_replicas, C::min_interval, C::break_lock, C::bump, C::acl,
                     C::lock_delay, C::every, C::if_record_lost};
  ASSERT_EQ(fencerun::lease::backends().size(), 3u);
  for (const auto& b : fencerun::lease::backends()) {
    const auto urls = urls_of(b.name);
    ASSERT_FALSE(urls.empty()) << b.name << ": the test knows no URL of this backend";
    EXPECT_EQ(configure(run_options(), {{"FENCERUN_SERVER", urls.front()}}).common.target->backend(),
              urls.size() == 1 ? b.name : "redis");
    for (C c : asked) {
      const std::string error = usage_error(asking_for(c, urls));
      const std::string what(fencerun::lease::capability_name(c));
      if (b.capabilities.has(c)) {
        EXPECT_EQ(error, "<no error>") << b.name << " " << what;
      } else {
        EXPECT_EQ(error.rfind(what + ": not supported on " + std::string(b.name) + " (" + std::string(b.summary) + ")", 0),
                  0u)
            << b.name << " " << what << ": " << error;
      }
    }
  }
}

// --version's feature line and the hints come from the same table.
TEST(capabilities, the_feature_line_names_every_backend) {
  EXPECT_EQ(fencerun::lease::features_line(), "tcp unix tls sentinel cluster quorum etcd");
}

// --every and --slot-offset: one rule per trigger, slots that fit the record, and a skip code that is
// not the busy code.
TEST(every, bad_combinations_are_usage_errors_naming_the_rule) {
  auto with = [](auto set) {
    Options o = run_options();
    set(o);
    return usage_error(o);
  };
  EXPECT_EQ(with([](Options& o) { o.every = "1h"; }), "<no error>");
  EXPECT_EQ(with([](Options& o) { o.every = "1h", o.slot_offset = "5m"; }), "<no error>");
  EXPECT_EQ(with([](Options& o) { o.every = "1h", o.min_interval = "50m"; }),
            "--every and --min-interval: give one rule, not both");
  EXPECT_EQ(with([](Options& o) { o.slot_offset = "5m"; }), "--slot-offset: only with --every");
  EXPECT_EQ(with([](Options& o) { o.every = "1h", o.slot_offset = "1h"; }),
            "--slot-offset: must be at least 0 and less than --every 1h, got 1h");
  EXPECT_EQ(with([](Options& o) { o.every = "0s"; }), "--every: must be positive, got 0s");
  EXPECT_EQ(with([](Options& o) { o.every = "2h", o.records_ttl = "1h"; }).rfind("--every: 2h is longer than the records' TTL 1h", 0),
            0u);
  EXPECT_EQ(with([](Options& o) { o.every = "1h", o.limit = "2"; }), "--every: not with --limit N (a counting lock)");
  EXPECT_EQ(with([](Options& o) { o.every = "1h", o.skip_exit_code = 75; }).rfind("--skip-exit-code 75 is the busy code", 0),
            0u);
  EXPECT_EQ(with([](Options& o) { o.min_interval = "1h", o.skip_exit_code = 75; }).rfind("--skip-exit-code 75 is the busy code", 0),
            0u);
  EXPECT_EQ(with([](Options& o) { o.every = "1h", o.skip_exit_code = 75, o.conflict_exit_code = 76; }), "<no error>");
}
