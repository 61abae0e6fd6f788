// Tokens in quorum mode under the nemeses that make single-server tokens go backwards, with the
// single-server runs as the control: each scenario counts acquisitions and regressions (a token not
// greater than the greatest one before it, which a guard rejects as stale) and prints the table row
//   [ monotonicity ] MODE NEMESIS: N acquisitions, R regressions
#include <algorithm>
#include <functional>

#include "quorum_fixture.hpp"

namespace fencerun::test {
namespace {

constexpr int kAcquisitions = 50;
constexpr int kStale = 77;
// The quorum-wide lease cap these tests run under (every run takes --ttl 1s): a server restarted
// empty counts towards no majority for about a second (QuorumModelTest).
const EnvList kCap = {{"FENCERUN_QUORUM_MAX_TTL", "1s"}};

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
    RunResult r = run(servers_args, kCap);
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
  // At once: the restarted servers count towards no majority for a lease cap. Once they count again
  // (within the wait), they still lack the counter.
  RunResult r = run(quorum_sh("mono", "echo ran > ran", {"--ttl", "1s", "--timeout", "300ms", "--wait", "3s"}), kCap);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_NE(r.err.find("only 1 of 3 servers count towards a majority; server 1 ("), std::string::npos) << r;
  EXPECT_NE(r.err.find("only 1 of the servers where this run set the lock know the token counter (a majority of all "
                       "3 must, or none): no token is issued that might not be greater than the last; without a "
                       "counter: server 1, 3 (restarted without its data, or never used for this lock); raise its "
                       "counter above the last token issued, at least " + std::to_string(t1) +
                       ": fencerun -r URL bump mono --above TOKEN"),
            std::string::npos)
      << r;
  for (std::size_t i : {0u, 2u}) EXPECT_FALSE(server(i).exists(lock_key("mono"))) << "released on server " << i;
  // The way out the message names.
  for (std::size_t i : {0u, 2u})
    ASSERT_EQ(run({"-r", server(i).url(), "bump", "mono", "--above", std::to_string(t1)}).exit_code, 0);
  EXPECT_GT(issue(quorum()), t1);
}

// No counter on the servers that answered, one server silent: NAME may be new, or the silent server
// may be the one that holds the last counter while an answering one lost its data (and the other never
// had it). The token is issued from the clocks alone only when every server answered.
TEST_F(QuorumTokenTest, IssuesAClockOnlyTokenOnlyWhenEveryServerAnswered) {
  server(1).stop();
  RunResult r = run(quorum_sh("fresh", "echo ran > ran"));
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_NE(r.err.find("no server that answered knows the token counter and server 2 did not answer"), std::string::npos)
      << r;
  for (std::size_t i : {0u, 2u}) EXPECT_FALSE(server(i).exists(lock_key("fresh"))) << "released on server " << i;
  server(1).start();
  // The refused run took back the epoch markers it created: with every server up, the lock is new.
  RunResult all = run(quorum_sh("fresh", "echo ran > ran", {"-v"}));
  EXPECT_EQ(all.exit_code, 0) << all;
  EXPECT_NE(all.err.find("no server of the quorum has a token counter"), std::string::npos) << "a new lock's first token rests on the clocks: " << all;
  EXPECT_EQ(run(quorum_sh("fresh2", "true")).err.find("no_counter"), std::string::npos)
      << "not a warning at the default level";
  // The counters are written: the next run needs a majority only.
  server(1).stop();
  EXPECT_EQ(run(quorum_sh("fresh", "true")).exit_code, 0);
}

// A guard in front of a counter: each holder reads the counter and writes it + 1 through `fence
// redis` on a resource server of its own (fenced read and write), while lock servers are restarted
// empty with lagging clocks. Quorum mode: no holder is rejected as stale, no update is lost, and a
// writer with an old token is rejected. Control: one server restarted the same way, whose holders the
// guard rejects as stale (the outage) while their tokens are below the last one it accepted.
struct GuardTally {
  int rejected = 0, failed = 0;
  long long counter = 0;
  bool stale_accepted = false;
};

class QuorumGuardTest : public QuorumTokenTest {
 protected:
  static constexpr int kRuns = 30;
  // kRuns holders on `servers_args`, calling `nemesis(i)` before holder i.
  GuardTally guarded_runs(const std::string& tag, std::vector<std::string> servers_args,
                          const std::function<void(int)>& nemesis) {
    RedisServer resource;
    const std::string fence = shell_quote(fencerun_binary()) + " fence redis -r " + resource.url() + " --resource c";
    const std::string body = "v=$(" + fence + " -- GET n) || exit; " +
                             "v=$(echo \"$v\" | tr -d '\"'); [ \"$v\" = '(nil)' ] && v=0; " + fence +
                             " -- SET n $((v + 1)) > /dev/null";
    servers_args.insert(servers_args.end(),
                        {"--timeout", "300ms", "--ttl", "1s", "--wait", "5s", "c", "--", "sh", "-c", body});
    GuardTally t;
    for (int i = 0; i < kRuns; ++i) {
      nemesis(i);
      auto r = run(servers_args, kCap);
      t.rejected += r.exit_code == kStale;
      t.failed += r.exit_code != 0;
    }
    t.counter = parse_ll(resource.get("n").value_or("0")).value_or(-1);
    // A writer with a token below the last one the guard accepted.
    const long long accepted = parse_ll(resource.get("fencerun:{c}:fence").value_or("0")).value_or(0);
    auto stale = run_program({"sh", "-c", fence + " --token " + std::to_string(accepted - 1) + " -- SET n 0"});
    t.stale_accepted = stale.exit_code == 0;
    std::cout << "[ guard ] " << tag << ", " << kRuns << " holders, lock servers restarted empty 30 s behind: "
              << t.rejected << " rejected as stale, " << t.failed << " failed, counter " << t.counter << " of " << kRuns
              << " (rejected holders write nothing), stale writer accepted: " << t.stale_accepted << "\n";
    return t;
  }
};

TEST_F(QuorumGuardTest, GuardedCounterSurvivesServerFailures) {
  const auto q = guarded_runs("quorum", quorum(), [&](int i) {
    if (i % 3 == 1) restart_lagging(server(static_cast<std::size_t>(i / 3) % k_servers));
  });
  EXPECT_EQ(q.rejected, 0);
  EXPECT_EQ(q.failed, 0);
  EXPECT_EQ(q.counter, kRuns) << "lost updates";
  EXPECT_FALSE(q.stale_accepted);

  RedisServer solo;
  const auto s = guarded_runs("single", single(solo), [&](int i) {
    if (i % 3 == 1) restart_lagging(solo);
  });
  EXPECT_GT(s.rejected, 0) << "the control was expected to show holders rejected as stale";
  EXPECT_EQ(s.counter, kRuns - s.rejected) << "a rejected holder writes nothing; no other update is lost";
  EXPECT_FALSE(s.stale_accepted);
}

}  // namespace
}  // namespace fencerun::test
