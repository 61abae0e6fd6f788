// Tokens in quorum mode under the nemeses that make single-server tokens go backwards, with the
// single-server runs as the control: each scenario counts acquisitions and regressions (a token not
// greater than the greatest one before it, which a guard rejects as stale) and prints the table row
//   [ monotonicity ] MODE NEMESIS: N acquisitions, R regressions
#include <algorithm>

#include "quorum_fixture.hpp"

namespace fencerun::test {
namespace {

constexpr int kAcquisitions = 50;
constexpr int kStale = 77;

struct Tally {
  int acquisitions = 0;
  int regressions = 0;
  long long greatest = 0;
  void add(long long token) {
    ++acquisitions;
    if (token <= greatest) ++regressions;
    greatest = std::max(greatest, token);
  }
};

void print(const std::string& mode, const std::string& nemesis, const Tally& t) {
  std::cout << "[ monotonicity ] " << mode << " " << nemesis << ": " << t.acquisitions << " acquisitions, "
            << t.regressions << " regressions\n";
}

class QuorumTokenTest : public QuorumTest {
 protected:
  // One acquisition: the token the command saw (the test fails when none). A server frozen during an
  // acquisition may run its SET after the thaw, when the run is over: that stale key lives one short
  // TTL, and the next acquisition waits it out if it needs that server.
  long long issue(std::vector<std::string> servers_args) {
    servers_args.insert(servers_args.end(), {"--timeout", "300ms", "--ttl", "1s", "--wait", "5s", "mono", "--", "sh",
                                             "-c", "echo \"$FENCERUN_TOKEN\""});
    RunResult r = run(servers_args);
    EXPECT_EQ(r.exit_code, 0) << r;
    auto token = parse_ll(trim(r.out));
    EXPECT_TRUE(token.has_value()) << r;
    return token.value_or(0);
  }
  std::vector<std::string> single(RedisServer& s) { return {"-r", s.url()}; }
  static void restart_lagging(RedisServer& s) {
    s.stop();
    s.set_env(clock_offset(-kLagUs));
    s.start();
  }
};

// Nemesis 1: before each acquisition a server is restarted empty with its clock 30 s behind. In quorum
// mode the servers take turns (after three rounds every clock lags): the counters of the other two
// keep the tokens increasing, and the write-back repairs the restarted one.
TEST_F(QuorumTokenTest, RestartEmptyWithLaggingClock) {
  Tally quorum_mode;
  for (int i = 0; i < kAcquisitions; ++i) {
    if (i > 0) restart_lagging(server(static_cast<std::size_t>(i) % k_servers));
    quorum_mode.add(issue(quorum()));
  }
  print("quorum", "restart-empty-clock-30s-behind", quorum_mode);
  EXPECT_EQ(quorum_mode.acquisitions, kAcquisitions);
  EXPECT_EQ(quorum_mode.regressions, 0);

  // Control: one server (on the real clock for the first token), restarted the same way.
  RedisServer solo;
  Tally single_mode;
  for (int i = 0; i < kAcquisitions; ++i) {
    if (i > 0) restart_lagging(solo);
    single_mode.add(issue(single(solo)));
  }
  print("single", "restart-empty-clock-30s-behind", single_mode);
  EXPECT_EQ(single_mode.acquisitions, kAcquisitions);
  EXPECT_GT(single_mode.regressions, 0) << "the control was expected to show tokens going backwards";
}

// Nemesis 2: the server that holds the last counter write is lost. Quorum mode, in pairs of
// acquisitions with rotating roles: one server is frozen during the first (its write-back misses it),
// then one of the two that got the write is restarted empty with its clock 30 s behind, and the frozen
// one comes back with the older counter: only the third server has the last write. The second
// acquisition of the pair has all three (and repairs the restarted one). Servers 2 and 3 lag from the
// start, server 1 once it is restarted: then no clock is ahead of the tokens. Control: two single
// servers standing in for a failover pair, one on the real clock and one 30 s behind; after each
// acquisition the server that issued it is lost (restarted empty) and the next one goes to the other.
TEST_F(QuorumTokenTest, LoseTheServerHoldingTheLastCounterWrite) {
  restart_lagging(server(1));
  restart_lagging(server(2));
  Tally quorum_mode;
  quorum_mode.add(issue(quorum()));  // every server has a counter (RefusesATokenWhileAMajorityLacksTheCounter)
  for (int i = 0; i < kAcquisitions / 2; ++i) {
    RedisServer& lost = server(static_cast<std::size_t>(i) % k_servers);
    RedisServer& frozen = server(static_cast<std::size_t>(i + 1) % k_servers);
    frozen.freeze();
    quorum_mode.add(issue(quorum()));
    restart_lagging(lost);
    frozen.thaw();
    quorum_mode.add(issue(quorum()));
  }
  print("quorum", "lose-the-server-with-the-last-write", quorum_mode);
  EXPECT_EQ(quorum_mode.acquisitions, kAcquisitions + 1);
  EXPECT_EQ(quorum_mode.regressions, 0);

  RedisServer real_clock;
  RedisOptions lagging;
  lagging.env = clock_offset(-kLagUs);
  RedisServer lagging_clock(lagging);
  Tally single_mode;
  for (int i = 0; i < kAcquisitions; ++i) {
    RedisServer& current = i % 2 == 0 ? real_clock : lagging_clock;
    single_mode.add(issue(single(current)));
    current.restart();
  }
  print("single", "lose-the-server-with-the-last-write", single_mode);
  EXPECT_EQ(single_mode.acquisitions, kAcquisitions);
  EXPECT_GT(single_mode.regressions, 0) << "the control was expected to show tokens going backwards";
}

// Two of three servers lost their data: the one left may not hold the last token (a write-back needs
// only a majority), so no token is issued until the counters are raised again, as the message says.
TEST_F(QuorumTokenTest, RefusesATokenWhileAMajorityLacksTheCounter) {
  const long long t1 = issue(quorum());
  server(0).restart();
  server(2).restart();
  RunResult r = run(quorum_sh("mono", "echo ran > ran"));
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_NE(r.err.find("only 1 of the 3 servers that answered know the token counter (a majority of all 3 must, or "
                       "none): no token is issued that might not be greater than the last; without a counter: "
                       "server 1, 3 (restarted without its data, or never used for this lock); raise its counter "
                       "above the last token issued, at least " + std::to_string(t1) + ": fencerun -r URL bump mono --above TOKEN"),
            std::string::npos)
      << r;
  for (std::size_t i : {0u, 2u}) EXPECT_FALSE(server(i).exists(lock_key("mono"))) << "released on server " << i;
  // The way out the message names.
  for (std::size_t i : {0u, 2u})
    ASSERT_EQ(run({"-r", server(i).url(), "bump", "mono", "--above", std::to_string(t1)}).exit_code, 0);
  EXPECT_GT(issue(quorum()), t1);
}

// A guard in front of a counter: each holder reads the counter and writes it + 1 through `fence
// redis` on a resource server of its own, while quorum servers are restarted empty with lagging
// clocks. No holder is rejected as stale, no update is lost, and a writer with an old token is
// rejected.
TEST_F(QuorumTokenTest, GuardedCounterSurvivesServerFailures) {
  RedisServer resource;
  constexpr int kRuns = 30;
  const std::string fence = shell_quote(fencerun_binary()) + " fence redis -r " + resource.url() + " --resource c";
  const std::string body = "echo \"$FENCERUN_TOKEN\" >> tokens; v=$(" + fence + " -- GET n) || exit; " +
                           "v=$(echo \"$v\" | tr -d '\"'); [ \"$v\" = '(nil)' ] && v=0; " + fence +
                           " -- SET n $((v + 1)) > /dev/null";
  int rejected = 0, failed = 0;
  for (int i = 0; i < kRuns; ++i) {
    if (i % 3 == 1) restart_lagging(server(static_cast<std::size_t>(i / 3) % k_servers));
    auto r = run(quorum_sh("c", body, {"--timeout", "300ms"}));
    rejected += r.exit_code == kStale;
    failed += r.exit_code != 0;
    EXPECT_EQ(r.exit_code, 0) << r;
  }
  const auto tokens = split_lines(read_file(file("tokens")).value_or(""));
  ASSERT_EQ(tokens.size(), static_cast<std::size_t>(kRuns));
  const long long first = parse_ll(tokens.front()).value_or(0);
  const long long last = parse_ll(tokens.back()).value_or(0);
  auto stale = run_program({"sh", "-c", fence + " --token " + std::to_string(first) + " -- SET n 0"});
  EXPECT_EQ(stale.exit_code, kStale) << "a writer with an old token must be rejected\n" << stale;
  const long long n = parse_ll(resource.get("n").value_or("")).value_or(-1);
  std::cout << "[ guard ] quorum, " << kRuns << " holders with servers restarted empty 30 s behind: " << rejected
            << " rejected as stale, " << failed << " failed, counter " << n << " (lost updates: " << kRuns - n
            << "), stale writer accepted: " << (stale.exit_code == 0 ? 1 : 0) << "\n";
  EXPECT_EQ(n, kRuns) << "lost updates";
  EXPECT_EQ(resource.get("fencerun:{c}:fence"), std::to_string(last));
}

}  // namespace
}  // namespace fencerun::test
