// `fencerun fence ...` as a subcommand of the one command line: its help, its usage errors, the
// connection configuration it shares with run (TLS files checked before connecting), and exit codes
// that are those of exit_status.hpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli/parse.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"
#include "supervisor/exit_status.hpp"

namespace fencerun::test {
namespace {

RunResult fence(const std::vector<std::string>& args, EnvList env = {},
                std::optional<std::filesystem::path> in = {}) {
  std::vector<std::string> all = {"fence"};
  all.insert(all.end(), args.begin(), args.end());
  SpawnOptions so;
  so.env = std::move(env);
  so.stdin_file = std::move(in);
  return run_fencerun(std::move(all), so, 30s);
}

// No EVAL or EVALSHA reached the server.
void expect_nothing_sent(const RedisServer& redis) {
  auto stats = redis.cmd({"INFO", "commandstats"});
  ASSERT_TRUE(stats.ok()) << stats.describe();
  EXPECT_EQ(stats.str.find("cmdstat_eval"), std::string::npos) << stats.str;
}

TEST(FenceCli, HelpOfFenceAndOfEachGuard) {
  struct Case {
    std::vector<std::string> args;
    const char* command;
  };
  for (const Case& c : std::vector<Case>{{{"--help"}, "fence"},
                                         {{"help"}, "fence"},
                                         {{"file", "--help"}, "fence file"},
                                         {{"redis", "-h"}, "fence redis"},
                                         {{"redis", "-r", "redis://h", "--help", "--", "PING"}, "fence redis"},
                                         {{"sql", "--help"}, "fence sql"}}) {
    auto r = fence(c.args);
    EXPECT_EQ(r.exit_code, exit_code::k_success) << r;
    EXPECT_EQ(r.out, cli::help_text(c.command)) << c.command;
    EXPECT_EQ(r.err, "");
  }
  // `fencerun --help` is unchanged by fence being one of its subcommands.
  auto r = run_fencerun({"--help"});
  EXPECT_EQ(r.exit_code, exit_code::k_success);
  EXPECT_EQ(r.out, cli::help_text());
}

TEST(FenceCli, UsageErrorsExit64AndPointToFenceHelp) {
  auto r = fence({"redis", "--tokn", "5", "--resource", "r", "--", "PING"});
  EXPECT_EQ(r.exit_code, exit_code::k_usage) << r;
  EXPECT_EQ(r.err,
            "fencerun: fence redis: unrecognized option '--tokn', did you mean '--token'? (see fencerun fence redis --help)\n");
  r = fence({"file", "--token", "5"});
  EXPECT_EQ(r.exit_code, exit_code::k_usage) << r;
  EXPECT_EQ(r.err, "fencerun: fence file: missing PATH (see fencerun fence --help)\n");
  r = fence({"frobnicate"});
  EXPECT_EQ(r.exit_code, exit_code::k_usage) << r;
  EXPECT_EQ(r.err, "fencerun: fence: unknown guard 'frobnicate' (expected file, redis or sql) (see fencerun fence --help)\n");
  r = fence({"sql", "oracle"});
  EXPECT_EQ(r.exit_code, exit_code::k_usage) << r;
  r = fence({"redis", "--resource", "r", "--", "PING"});  // no token
  EXPECT_EQ(r.exit_code, exit_code::k_usage) << r;
  EXPECT_NE(r.err.find("no fencing token"), std::string::npos) << r;
}

// An unreadable --tls-ca-file, --tls-cert or --tls-key is a usage error before connecting, as for
// run: exit 64 naming the option, and nothing reaches the server.
TEST(FenceCli, RedisRefusesAnUnreadableTlsFileLikeRun) {
  RedisServer redis;
  TempDir dir("fence-cli");
  const std::string missing = (dir / "missing-ca.pem").string();
  for (const std::string& option : std::vector<std::string>{"--tls-ca-file", "--tls-cert"}) {
    SCOPED_TRACE(option);
    auto r = fence({"redis", "-r", redis.url(), option, missing, "--resource", "r", "--token", "5", "--", "SET",
                    "{r}:k", "v"});
    EXPECT_EQ(r.exit_code, exit_code::k_usage) << r;
    EXPECT_EQ(split_lines(trim(r.err)).size(), 1u) << r;
    EXPECT_NE(r.err.find(option + ": cannot read '" + missing + "'"), std::string::npos) << r;

    auto run = run_fencerun({"-r", redis.url(), option, missing, "fence-cli-job", "--", "true"});
    EXPECT_EQ(run.exit_code, exit_code::k_usage) << run;
    EXPECT_NE(run.err.find(option + ": cannot read '" + missing + "'"), std::string::npos) << run;
  }
  auto r = fence({"redis", "-r", redis.url(), "--tls-ca-file", dir.str(), "--resource", "r", "--token", "5", "--",
                  "SET", "{r}:k", "v"});
  EXPECT_EQ(r.exit_code, exit_code::k_usage) << r;
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r;
  EXPECT_FALSE(redis.exists("{r}:k"));
  EXPECT_FALSE(redis.exists("fencerun:{r}:fence"));
  expect_nothing_sent(redis);
}

TEST(FenceCli, RedisExitCodesComeFromTheExitStatusTable) {
  RedisServer redis;
  auto guard = [&](const std::string& token, std::vector<std::string> cmd) {
    std::vector<std::string> args = {"redis", "-r", redis.url(), "--resource", "r", "--token", token, "--"};
    args.insert(args.end(), cmd.begin(), cmd.end());
    return fence(args);
  };
  auto r = guard("10", {"SET", "{r}:k", "v10"});
  EXPECT_EQ(r.exit_code, exit_code::k_success) << r;
  EXPECT_EQ(r.out, "OK\n");
  r = guard("9", {"SET", "{r}:k", "v9"});
  EXPECT_EQ(r.exit_code, exit_code::k_fence_stale) << r;
  EXPECT_EQ(redis.get("{r}:k"), "v10");
  r = guard("11", {"LPUSH", "{r}:k", "x"});  // WRONGTYPE: the write failed
  EXPECT_EQ(r.exit_code, exit_code::k_fence_write_failed) << r;
  EXPECT_EQ(redis.get("fencerun:{r}:fence"), "10");
  r = fence({"redis", "-r", "redis://127.0.0.1:" + std::to_string(unused_port()), "--timeout", "500ms", "--resource",
             "r", "--token", "12", "--", "PING"});
  EXPECT_EQ(r.exit_code, exit_code::k_unavailable) << r;
  r = fence({"sql", "postgresql"});
  EXPECT_EQ(r.exit_code, exit_code::k_success) << r;
  EXPECT_NE(r.out.find("fencerun_admit"), std::string::npos);
}

TEST(FenceCli, FileExitCodesComeFromTheExitStatusTable) {
  TempDir dir("fence-cli");
  auto in = dir / "stdin";
  write_file(in, "data\n");
  const std::string data = (dir / "data").string();
  auto r = fence({"file", "--token", "5", data}, {}, in);
  EXPECT_EQ(r.exit_code, exit_code::k_success) << r;
  r = fence({"file", data}, {{"FENCERUN_TOKEN", "4"}}, in);
  EXPECT_EQ(r.exit_code, exit_code::k_fence_stale) << r;
  // A side file that is a symbolic link: refused, the write failed.
  const std::string other = (dir / "other").string();
  std::filesystem::create_symlink(dir / "elsewhere", other + ".fence");
  r = fence({"file", "--token", "5", other}, {}, in);
  EXPECT_EQ(r.exit_code, exit_code::k_fence_write_failed) << r;
  EXPECT_FALSE(std::filesystem::exists(other));
}

}  // namespace
}  // namespace fencerun::test
