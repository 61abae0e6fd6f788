// The --metrics-file format, as documented in the man page and the README, checked against a real
// redis-server: every run writes a file that the Prometheus client library's text-format parser
// reads (tests/docs/check_metrics.py), with every documented metric, the lock label, and values that
// match the run: the token the command saw in FENCERUN_TOKEN, its exit code, and for a busy lock
// acquired 0 and exit code 75.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"

namespace fencerun::test {
namespace {

class MetricsFileTest : public ::testing::Test {
 protected:
  void SetUp() override { redis_ = std::make_unique<RedisServer>(); }

  void TearDown() override {
    if (HasFailure() && redis_) std::cout << "--- redis-server log ---\n" << redis_->log() << "\n";
  }

  std::filesystem::path file(std::string_view name) const { return dir_ / name; }

  // fencerun -r URL --metrics-file PATH OPTIONS... NAME -- sh -c SCRIPT, in the temp dir.
  std::vector<std::string> args(const std::string& name, const std::filesystem::path& metrics,
                                const std::string& script, std::vector<std::string> options = {}) const {
    std::vector<std::string> a = {"-r", redis_->url(), "--metrics-file", metrics.string()};
    a.insert(a.end(), options.begin(), options.end());
    a.insert(a.end(), {name, "--", "sh", "-c", script});
    return a;
  }

  SpawnOptions in_dir() const {
    SpawnOptions o;
    o.cwd = dir_.path();
    return o;
  }

  // Parses the file with prometheus_client and checks it; returns the checker's output on failure.
  static void expect_metrics(const std::filesystem::path& metrics, const std::string& lock,
                             std::vector<std::string> expectations) {
    std::vector<std::string> argv = {PYTHON3_EXECUTABLE, CHECK_METRICS_SCRIPT, metrics.string(), lock};
    argv.insert(argv.end(), expectations.begin(), expectations.end());
    RunResult r = run_program(argv, SpawnOptions{}, 30s);
    EXPECT_EQ(r.exit_code, 0) << r;
  }

  std::unique_ptr<RedisServer> redis_;
  TempDir dir_{"metrics"};
};

TEST_F(MetricsFileTest, AcquiredRunReportsTokenExitCodeAndRenewals) {
  const auto metrics = file("job.prom");
  // TTL 3s renews every 1s: a command of 2.5s sees at least one renewal even on a busy machine.
  RunResult r = run_fencerun(
      args("metrics-job", metrics, "echo \"$FENCERUN_TOKEN\" > token; sleep 2.5; exit 3", {"--ttl", "3s"}),
      in_dir(), 60s);
  ASSERT_EQ(r.exit_code, 3) << r;
  const auto token = read_file(file("token"));
  ASSERT_TRUE(token) << "the command wrote no token";
  const std::string t = trim(*token);
  ASSERT_TRUE(parse_ll(t)) << "FENCERUN_TOKEN is not a number: '" << t << "'";
  ASSERT_TRUE(std::filesystem::exists(metrics)) << r;

  expect_metrics(metrics, "metrics-job",
                 {"acquired=1", "exit_code=3", "token=" + t, "lease_lost=0", "renew_failures=0", "renewals>=1",
                  "duration_seconds>=2.4", "lock_wait_seconds<=1"});
  // Written atomically: no temp file is left next to it.
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n == "job.prom" || n == "token") << "left behind: " << n;
  }
}

TEST_F(MetricsFileTest, BusyRunReportsNotAcquiredAndExitCode75) {
  // A holder keeps the lock until the file `go` appears.
  FencerunProcess holder({"-r", redis_->url(), "--ttl", "10s", "metrics-busy", "--", "sh", "-c",
                          "echo \"$FENCERUN_TOKEN\" > held; while [ ! -e go ]; do sleep 0.02; done"},
                         in_dir());
  ASSERT_TRUE(wait_for_line(file("held"), 20s)) << holder.result();

  // Fail fast.
  const auto busy = file("busy.prom");
  RunResult r = run_fencerun(args("metrics-busy", busy, "touch ran"), in_dir(), 30s);
  EXPECT_EQ(r.exit_code, 75) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  ASSERT_TRUE(std::filesystem::exists(busy)) << r;
  expect_metrics(busy, "metrics-busy", {"acquired=0", "exit_code=75", "token=0", "renewals=0", "lease_lost=0"});

  // Waiting that runs out: the wait is reported.
  const auto waited = file("waited.prom");
  r = run_fencerun(args("metrics-busy", waited, "touch ran", {"--wait", "400ms"}), in_dir(), 30s);
  EXPECT_EQ(r.exit_code, 75) << r;
  ASSERT_TRUE(std::filesystem::exists(waited)) << r;
  expect_metrics(waited, "metrics-busy",
                 {"acquired=0", "exit_code=75", "token=0", "lock_wait_seconds>=0.35", "duration_seconds>=0.35"});

  // -E changes the exit code, and the metric follows it.
  const auto custom = file("custom.prom");
  r = run_fencerun(args("metrics-busy", custom, "touch ran", {"-E", "0"}), in_dir(), 30s);
  EXPECT_EQ(r.exit_code, 0) << r;
  expect_metrics(custom, "metrics-busy", {"acquired=0", "exit_code=0"});

  write_file(file("go"), "");
  auto code = holder.wait_for_exit(20s);
  EXPECT_EQ(code, 0) << holder.result();
}

TEST_F(MetricsFileTest, LockLabelIsEscaped) {
  // A NAME may hold `"` and `\`, which the label must escape.
  const std::string name = R"(we"ird\name)";
  const auto metrics = file("escaped.prom");
  RunResult r = run_fencerun(args(name, metrics, "echo \"$FENCERUN_TOKEN\" > token"), in_dir(), 30s);
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string t = trim(read_file(file("token")).value_or(""));
  expect_metrics(metrics, name, {"acquired=1", "exit_code=0", "token=" + t});
}

TEST_F(MetricsFileTest, RedisUnavailableIsReportedToo) {
  const auto metrics = file("down.prom");
  std::vector<std::string> a = {"-r", "redis://127.0.0.1:" + std::to_string(unused_port()), "--timeout", "500ms",
                                "--metrics-file", metrics.string(), "metrics-down", "--", "true"};
  RunResult r = run_fencerun(a, in_dir(), 30s);
  EXPECT_EQ(r.exit_code, 69) << r;
  expect_metrics(metrics, "metrics-down", {"acquired=0", "exit_code=69", "token=0"});
}

}  // namespace
}  // namespace fencerun::test
