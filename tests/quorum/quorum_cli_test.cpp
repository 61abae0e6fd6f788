// Quorum mode's command line: what is refused with 64 and the one-line message saying why. No server
// is needed: the configuration is checked before anything connects.
#include <gtest/gtest.h>

#include "support/process.hpp"

namespace fencerun::test {
namespace {

// fencerun ARGS; expects 64 and `message` on stderr.
void expect_usage(std::vector<std::string> args, const std::string& message) {
  RunResult r = run_fencerun(std::move(args));
  EXPECT_EQ(r.exit_code, 64) << r;
  EXPECT_NE(r.err.find("fencerun: " + message), std::string::npos) << "expected: " << message << "\n" << r;
  EXPECT_EQ(r.out, "") << r;
}

std::vector<std::string> servers(int n, std::string scheme = "redis://") {
  std::vector<std::string> a;
  for (int i = 0; i < n; ++i) a.insert(a.end(), {"-r", scheme + "127.0.0.1:" + std::to_string(20001 + i)});
  return a;
}

std::vector<std::string> with(std::vector<std::string> a, std::vector<std::string> more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(QuorumCli, RefusesAnEvenNumberOfServers) {
  for (int n : {2, 4, 6})
    expect_usage(with(servers(n), {"job", "--", "true"}),
                 "--redis: " + std::to_string(n) + " servers given; quorum mode takes 3, 5 or 7 (an odd number of "
                 "independent servers)");
}

TEST(QuorumCli, RefusesMoreThanSevenServers) {
  expect_usage(with(servers(9), {"job", "--", "true"}), "--redis: 9 servers given; quorum mode takes 3, 5 or 7");
}

TEST(QuorumCli, RefusesTheSameServerTwice) {
  expect_usage({"-r", "redis://127.0.0.1:20001", "-r", "redis://127.0.0.1:20002", "-r", "redis://127.0.0.1:20001/0",
                "job", "--", "true"},
               "--redis: servers 1 and 3 are the same server (127.0.0.1:20001/0); quorum mode needs independent "
               "servers");
  expect_usage({"-r", "unix:///tmp/a.sock", "-r", "redis://LOCALHOST:20002", "-r", "redis://localhost:20002",
                "job", "--", "true"},
               "--redis: servers 2 and 3 are the same server (localhost:20002/0)");
  // Another database of the same server is the same server: they fail together.
  expect_usage({"-r", "redis://127.0.0.1:1/1", "-r", "redis://127.0.0.1:1/2", "-r", "redis://127.0.0.1:2/3",
                "--timeout", "200ms", "job", "--", "true"},
               "--redis: servers 1 (redis://127.0.0.1:1/1) and 2 (redis://127.0.0.1:1/2) are the same server (both "
               "reach 127.0.0.1:1); quorum mode needs independent servers");
}

TEST(QuorumCli, RefusesServersThatMixTlsAndPlainConnections) {
  expect_usage({"-r", "redis://127.0.0.1:20001", "-r", "rediss://127.0.0.1:20002", "-r", "redis://127.0.0.1:20003",
                "--tls-insecure", "job", "--", "true"},
               "--redis: the servers mix TLS (rediss://) and plain connections; in quorum mode all of them use TLS "
               "or none (the --tls-* options apply to every server)");
}

TEST(QuorumCli, RefusesOptionsQuorumModeDoesNotSupport) {
  // The backend's declared capabilities decide (backends/registry.cpp), in one message format.
  expect_usage(with(servers(3), {"--fair", "job", "--", "true"}),
               "--fair: not supported on quorum (3, 5 or 7 independent Redis servers)");
  expect_usage(with(servers(3), {"--limit", "2", "job", "--", "true"}),
               "--limit: not supported on quorum (3, 5 or 7 independent Redis servers)");
  expect_usage(with(servers(3), {"--min-replicas", "1", "job", "--", "true"}),
               "--min-replicas: not supported on quorum (3, 5 or 7 independent Redis servers): a majority of "
               "independent servers takes the place of replica acknowledgement");
}

TEST(QuorumCli, RefusesSeveralServersForCommandsOtherThanRunStatusAndList) {
  expect_usage(with({"bump", "job", "--above", "5"}, servers(3)),
               "bump: not supported on quorum (3, 5 or 7 independent Redis servers): give one server's URL");
  expect_usage(with({"break", "job"}, servers(3)),
               "break: not supported on quorum (3, 5 or 7 independent Redis servers): give one server's URL");
  expect_usage(with(with({"fence", "redis"}, servers(3)), {"--resource", "r", "--token", "5", "--", "GET", "k"}),
               "fence redis: the guarded data lives in one Redis server; --redis names quorum");
}

// A bad URL among several is named as with one.
TEST(QuorumCli, NamesABadUrlAmongSeveral) {
  expect_usage({"-r", "redis://127.0.0.1:20001", "-r", "http://x", "-r", "redis://127.0.0.1:20003", "job", "--",
                "true"},
               "--redis: ");
}

}  // namespace
}  // namespace fencerun::test
