// Quorum mode's lease against three independent servers: held on a majority, kept while one server is
// killed, frozen or restarted empty, stopped before its deadline when two are frozen; the facts, the
// release and `status` with each server's view.
#include "quorum_fixture.hpp"

namespace fencerun::test {
namespace {

constexpr int kBusy = 75;
constexpr int kLeaseLost = 124;

TEST_F(QuorumTest, HoldsTheLockOnEveryServerAndWritesTheTokenBack) {
  auto holder = start(quorum_sh("q", std::string(kHoldUntilGo) + "; env | grep ^FENCERUN_ | sort > env"));
  const long long token = parse_ll(wait_line("token")).value_or(0);
  ASSERT_GT(token, kMinPlausibleToken);
  for (std::size_t i = 0; i < k_servers; ++i) {
    auto v = parse_lock_value(server(i).get(lock_key("q")).value_or(""));
    ASSERT_TRUE(v.has_value()) << "server " << i;
    EXPECT_EQ(v->token, token) << "the lock value carries the token on server " << i;
    EXPECT_EQ(server(i).get(token_key("q")), std::to_string(token)) << "write-back on server " << i;
  }
  // Another client finds it busy.
  auto other = run(quorum_sh("q", "echo ran > other"));
  EXPECT_EQ(other.exit_code, kBusy) << other;
  EXPECT_FALSE(std::filesystem::exists(file("other")));

  touch("go");
  ASSERT_EQ(holder->wait_for_exit(10s), 0) << holder->result();
  const std::string env = read_file(file("env")).value_or("");
  EXPECT_NE(env.find("FENCERUN_SERVERS=3\n"), std::string::npos) << env;
  EXPECT_NE(env.find("FENCERUN_TOKEN=" + std::to_string(token) + "\n"), std::string::npos) << env;
  EXPECT_NE(env.find("FENCERUN_REDIS_URL=" + server(0).url() + " " + server(1).url() + " " + server(2).url() + "\n"),
            std::string::npos)
      << env;
  EXPECT_EQ(holding("q"), 0u) << "released on every server";

  // The next holder's token is greater.
  auto next = run(quorum_sh("q", "echo \"$FENCERUN_TOKEN\""));
  ASSERT_EQ(next.exit_code, 0) << next;
  EXPECT_GT(parse_ll(trim(next.out)).value_or(0), token);
}

TEST_F(QuorumTest, StatusShowsEachServerAndTheMajority) {
  auto holder = start(quorum_sh("st", kHoldUntilGo));
  const std::string token = wait_line("token");
  // One server restarted empty: it disagrees, the majority still holds the lock.
  server(2).restart();
  auto s = run(with_status(quorum({"st"})));
  EXPECT_EQ(s.exit_code, 0) << s;
  EXPECT_NE(s.out.find("st: held by pid "), std::string::npos) << s;
  EXPECT_NE(s.out.find(" on 2 of 3 servers (a majority is 2)\ntoken: " + token + "\n"), std::string::npos) << s;
  EXPECT_NE(s.out.find("server 3 " + server(2).url() + ": free, counter none\n"), std::string::npos) << s;
  EXPECT_NE(s.out.find("server 1 " + server(0).url() + ": held by pid "), std::string::npos) << s;
  EXPECT_NE(s.out.find("the servers disagree"), std::string::npos) << s;
  auto j = run(with_status(quorum({"--json", "st"})));
  EXPECT_EQ(j.exit_code, 0) << j;
  auto doc = parse_json(trim(j.out));
  ASSERT_TRUE(doc.has_value()) << j;
  EXPECT_EQ(json_int(doc->find("held_on")), 2);
  EXPECT_EQ(json_int(doc->find("token")), parse_ll(token));
  touch("go");
  ASSERT_EQ(holder->wait_for_exit(10s), 0) << holder->result();

  // Free, and a server down: still a majority view; two down: none.
  server(1).stop();
  auto f = run(with_status(quorum({"st"})));
  EXPECT_EQ(f.exit_code, 3) << f;
  EXPECT_NE(f.out.find("st: free on 2 of 3 servers (a majority is 2)\n"), std::string::npos) << f;
  EXPECT_NE(f.out.find("server 2 " + server(1).url() + ": unavailable: "), std::string::npos) << f;
  server(2).stop();
  auto u = run(with_status(quorum({"st"})));
  EXPECT_EQ(u.exit_code, 69) << u;
  EXPECT_NE(u.out.find("st: unknown: 1 of 3 servers (a majority is 2) answered"), std::string::npos) << u;
}

// A lock held on fewer than a majority (a client with another server list, say) is not held.
TEST_F(QuorumTest, AMinorityHolderDoesNotBlock) {
  ASSERT_TRUE(server(0).cmd({"SET", lock_key("minority"), "0123456789abcdef0123456789abcdef 5 1 elsewhere", "PX",
                             "60000"})
                  .ok());
  auto r = run(quorum_sh("minority", "echo \"$FENCERUN_TOKEN\""));
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(server(0).exists(lock_key("minority"))) << "another owner's key is left alone";
  ASSERT_TRUE(server(1).cmd({"SET", lock_key("minority"), "fedcba9876543210fedcba9876543210 5 1 elsewhere", "PX",
                             "60000"})
                  .ok());
  auto split = run(with_status(quorum({"minority"})));
  EXPECT_EQ(split.exit_code, 3) << split;
  EXPECT_NE(split.out.find("minority: free: held by no owner on a majority of 3 servers (a majority is 2)\n"),
            std::string::npos)
      << split;
  EXPECT_NE(split.out.find("the servers disagree"), std::string::npos) << split;
  auto busy = run(quorum_sh("minority", "echo ran"));
  EXPECT_EQ(busy.exit_code, kBusy) << busy;
  EXPECT_FALSE(server(2).exists(lock_key("minority"))) << "a failed acquisition deletes what it set";
}

enum class Nemesis { killed, frozen, restarted_empty };
std::string to_string(Nemesis n) {
  switch (n) {
    case Nemesis::killed: return "killed";
    case Nemesis::frozen: return "frozen";
    case Nemesis::restarted_empty: return "restarted_empty";
  }
  return "?";
}

class QuorumOneServerDown : public QuorumTest, public ::testing::WithParamInterface<Nemesis> {};

// One server of three fails while the command runs: the lease is kept through several renewals, no
// one else can take the lock, and fencerun exits 0.
TEST_P(QuorumOneServerDown, LeaseHoldsAndTheRunSucceeds) {
  const auto ttl = 1500ms;
  auto holder = start(quorum_sh("down", kHoldUntilGo, {"--ttl", "1500ms", "--timeout", "300ms"}));
  wait_line("token");
  ASSERT_TRUE(wait_until([&] { return holding("down") == 3; }, 5s));
  switch (GetParam()) {
    case Nemesis::killed: server(1).stop(); break;
    case Nemesis::frozen: server(1).freeze(); break;
    case Nemesis::restarted_empty: server(1).restart(); break;
  }
  const auto failed_at = Clock::now();
  // Through three TTLs (several renewals) another client keeps finding the lock busy.
  int tries = 0;
  while (Clock::now() - failed_at < 3 * ttl) {
    auto other = run(quorum_sh("down", "echo ran > other", {"--timeout", "300ms"}));
    EXPECT_EQ(other.exit_code, kBusy) << other;
    ++tries;
    ASSERT_TRUE(holder->running()) << holder->result();
  }
  EXPECT_FALSE(std::filesystem::exists(file("other")));
  touch("go");
  auto code = holder->wait_for_exit(10s);
  EXPECT_EQ(code, 0) << holder->result();
  std::cout << "[ quorum ] one server " << to_string(GetParam()) << ": held " << ms_between(failed_at, Clock::now())
            << " ms after the failure, " << tries << " other clients refused, exit " << code.value_or(-1) << "\n";
  if (GetParam() == Nemesis::frozen) server(1).thaw();
  EXPECT_EQ(server(0).exists(lock_key("down")), false);
  EXPECT_EQ(server(2).exists(lock_key("down")), false);
}

INSTANTIATE_TEST_SUITE_P(Nemeses, QuorumOneServerDown,
                         ::testing::Values(Nemesis::killed, Nemesis::frozen, Nemesis::restarted_empty),
                         [](const ::testing::TestParamInfo<Nemesis>& p) { return to_string(p.param); });

// Two of three frozen: no majority renews, and the job is stopped before the lease's deadline, which
// is at most one TTL after the freeze (the last renewal was sent before it).
TEST_F(QuorumTest, TwoFrozenServersStopTheCommandBeforeTheDeadline) {
  const auto ttl = 1500ms;
  auto holder = start(quorum_sh("frozen", kHoldWithGrandchild, {"--ttl", "1500ms", "--timeout", "300ms"}));
  const pid_t pid = wait_pid("pid");
  const pid_t gpid = wait_pid("gpid");
  ASSERT_TRUE(wait_until([&] { return holding("frozen") == 3; }, 5s));
  server(1).freeze();
  server(2).freeze();
  const auto frozen_at = Clock::now();
  const auto deadline = frozen_at + ttl;
  EXPECT_TRUE(wait_dead(pid, deadline - Clock::now())) << "the command outlived the lease";
  EXPECT_TRUE(wait_dead(gpid, deadline - Clock::now())) << "the grandchild outlived the lease";
  const auto gone_at = Clock::now();
  auto code = holder->wait_for_exit(10s);
  EXPECT_EQ(code, kLeaseLost) << holder->result();
  std::cout << "[ quorum ] two servers frozen: job gone " << ms_between(frozen_at, gone_at) << " ms after the freeze ("
            << ms_between(gone_at, deadline) << " ms before the latest possible deadline), exit " << code.value_or(-1)
            << "\n";
}

// The release's verdict: "lost" only when the answers rule a majority out. The holder sets servers 1
// and 2 (server 3 holds another owner's key); at its release server 1 is frozen (no answer), server 2
// deletes its key, server 3 still has the other key. One "not ours" and one silent server are no
// evidence that the lease was lost: exit 0 with the release_failed warning, not 124.
TEST_F(QuorumTest, ASilentServerAndOneNeverSetAreNoLostLease) {
  server(2).cmd({"SET", lock_key("verdict"), "0123456789abcdef0123456789abcdef 0 1 elsewhere", "PX", "30000"});
  auto a = start(quorum_sh("verdict", kHoldUntilGo, {"--ttl", "3s", "--timeout", "300ms"}));
  wait_line("token");
  ASSERT_TRUE(wait_until([&] { return holding("verdict") == 3; }, 5s));
  server(0).freeze();
  touch("go");
  auto code = a->wait_for_exit(10s);
  server(0).thaw();
  EXPECT_EQ(code, 0) << a->result();
  EXPECT_NE(a->result().err.find("could not release the lock on a majority"), std::string::npos) << a->result();
  EXPECT_EQ(a->result().err.find("exclusion may have been broken"), std::string::npos) << a->result();
  EXPECT_FALSE(server(1).exists(lock_key("verdict"))) << "its key on server 2 must be deleted";
}

// The same with the lease really gone: its key deleted on servers 1 and 2 behind its back (more than
// f servers that kept their data do not hold it): 124, lease lost.
TEST_F(QuorumTest, AReleaseThatFindsAMajorityWithoutItsKeyIsALostLease) {
  auto a = start(quorum_sh("verdict2", kHoldUntilGo, {"--ttl", "3s", "--timeout", "300ms"}));
  wait_line("token");
  ASSERT_TRUE(wait_until([&] { return holding("verdict2") == 3; }, 5s));
  server(0).cmd({"DEL", lock_key("verdict2")});
  server(1).cmd({"DEL", lock_key("verdict2")});
  touch("go");
  EXPECT_EQ(a->wait_for_exit(10s), kLeaseLost) << a->result();
}

// A majority down before the start: unavailable, 69, and nothing runs.
TEST_F(QuorumTest, NoMajorityIsUnavailable) {
  server(0).stop();
  server(2).stop();
  auto r = run(quorum_sh("none", "echo ran > ran", {"--timeout", "300ms"}));
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_NE(r.err.find("cannot use the quorum of 3 servers (a majority is 2): only 1 of 3 servers "
                       "answered; server 1 ("),
            std::string::npos)
      << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_FALSE(server(1).exists(lock_key("none"))) << "what was set is deleted";
}

}  // namespace
}  // namespace fencerun::test

namespace fencerun::test {
namespace {

// Contenders that wait: one holder at a time (an overlap would find the directory `inside`), every
// run gets its turn, and the tokens of the holders in turn increase.
TEST_F(QuorumTest, ContendersHoldTheLockOneAtATime) {
  constexpr int kContenders = 4, kRuns = 5;
  std::string servers;
  for (std::size_t i = 0; i < k_servers; ++i) servers += " -r " + server(i).url();
  const std::string critical = "mkdir inside || echo overlap >> overlaps; echo \"$FENCERUN_TOKEN\" >> tokens; "
                               "sleep 0.05; rmdir inside";
  const std::string loop = "for i in $(seq " + std::to_string(kRuns) + "); do " + shell_quote(fencerun_binary()) +
                           servers + " --wait 30s excl -- sh -c " + shell_quote(critical) +
                           " || echo $? >> failed; done";
  std::vector<std::unique_ptr<Process>> contenders;
  for (int c = 0; c < kContenders; ++c)
    contenders.push_back(std::make_unique<Process>(std::vector<std::string>{"sh", "-c", loop}, spawn_options()));
  for (auto& p : contenders) EXPECT_EQ(p->wait_for_exit(60s), 0) << p->result();
  EXPECT_FALSE(std::filesystem::exists(file("overlaps"))) << read_file(file("overlaps")).value_or("");
  EXPECT_FALSE(std::filesystem::exists(file("failed"))) << read_file(file("failed")).value_or("");
  const auto tokens = split_lines(read_file(file("tokens")).value_or(""));
  EXPECT_EQ(tokens.size(), static_cast<std::size_t>(kContenders * kRuns));
  for (std::size_t i = 1; i < tokens.size(); ++i)
    EXPECT_GT(parse_ll(tokens[i]).value_or(0), parse_ll(tokens[i - 1]).value_or(0)) << "holder " << i;
  std::cout << "[ quorum ] " << kContenders << " contenders x " << kRuns << " runs: " << tokens.size()
            << " held in turn, 0 overlaps expected\n";
}

}  // namespace
}  // namespace fencerun::test

namespace fencerun::test {
namespace {

// Two clients of one lock with different server lists that share only one server: both can hold it.
// `status` over all their servers shows it: each server's holder, and the servers disagreeing.
TEST_F(QuorumTest, StatusShowsClientsWithDifferentServerLists) {
  RedisServer d, e;
  // D and E were used for the lock before (without counters there, B's majority would lack them and
  // B would be refused a token: QuorumTokenTest.RefusesATokenWhileAMajorityLacksTheCounter).
  // Their epoch markers say they kept the lock's data since it began (else they would count towards
  // no majority for a lease cap: QuorumModelTest).
  for (auto* s : {&d, &e}) {
    ASSERT_TRUE(s->cmd({"SET", token_key("mixed"), "1"}).ok());
    ASSERT_TRUE(s->cmd({"SET", "fencerun:{mixed}:epoch", "G1-" + std::to_string(s->port())}).ok());
  }
  auto a = start(quorum_sh("mixed", "echo a > a; while [ ! -e go ]; do sleep 0.02; done"));
  wait_line("a");
  auto b = start({"-r", server(2).url(), "-r", d.url(), "-r", e.url(), "mixed", "--", "sh", "-c",
                  "echo b > b; while [ ! -e go ]; do sleep 0.02; done"});
  wait_line("b");
  auto s = run(with_status(quorum({"-r", d.url(), "-r", e.url(), "mixed"})));
  EXPECT_EQ(s.exit_code, 0) << s;
  EXPECT_NE(s.out.find(" on 3 of 5 servers (a majority is 3)\n"), std::string::npos) << s;
  EXPECT_NE(s.out.find("server 4 " + d.url() + ": held by pid " + std::to_string(b->pid())), std::string::npos) << s;
  EXPECT_NE(s.out.find("server 5 " + e.url() + ": held by pid " + std::to_string(b->pid())), std::string::npos) << s;
  EXPECT_NE(s.out.find("the servers disagree"), std::string::npos) << s;
  touch("go");
  EXPECT_EQ(a->wait_for_exit(10s), 0) << a->result();
  EXPECT_EQ(b->wait_for_exit(10s), 0) << b->result();
}

}  // namespace
}  // namespace fencerun::test

namespace fencerun::test {
namespace {

TEST_F(QuorumTest, VersionNamesEveryServer) {
  auto r = run(quorum({"--version"}));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (std::size_t i = 0; i < k_servers; ++i)
    EXPECT_NE(r.out.find("server " + std::to_string(i + 1) + ": "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at 127.0.0.1:" + std::to_string(server(2).port())), std::string::npos) << r.out;
  // One server down: the others are still named, and the exit says one could not be reached.
  server(1).stop();
  auto down = run(quorum({"--timeout", "1s", "--version"}));
  EXPECT_EQ(down.exit_code, 69) << down.describe();
  EXPECT_NE(down.out.find("server 3: "), std::string::npos) << down.out;
  EXPECT_NE(down.err.find("cannot use Redis at redis://127.0.0.1:"), std::string::npos) << down.err;
}

}  // namespace
}  // namespace fencerun::test

namespace fencerun::test {
namespace {

long long publishes(RedisServer& s) {
  auto info = s.cmd({"INFO", "commandstats"}).str;
  auto at = info.find("cmdstat_publish:calls=");
  return at == std::string::npos ? 0 : parse_ll(info.substr(at + 22, info.find(',', at) - at - 22)).value_or(0);
}

long long listeners(RedisServer& s) {
  auto r = s.cmd({"PUBSUB", "NUMSUB", "fencerun:{woken}:wake:released"});
  return r.elements.size() == 2 ? r.elements[1].integer : 0;
}

// A release publishes on every server; a waiter listens on one of them, and when that server goes
// down while it waits, it still gets the lock after the release (on another server, or by polling).
TEST_F(QuorumTest, ReleasePublishesOnEveryServerAndWaitersListen) {
  auto holder = start(quorum_sh("woken", kHoldUntilGo, {"--ttl", "30s"}));
  wait_pid("pid");
  auto waiter = start(quorum_sh("woken", "echo ran >> ran", {"--wait", "60s"}));
  auto other = start(quorum_sh("woken", "echo ran >> ran", {"--wait", "60s"}));
  auto all_listeners = [&] {
    long long n = 0;
    for (std::size_t i = 0; i < k_servers; ++i) n += listeners(server(i));
    return n;
  };
  ASSERT_TRUE(wait_until([&] { return all_listeners() == 2; }, 10s)) << "the waiters do not both listen";
  std::vector<long long> before;
  for (std::size_t i = 0; i < k_servers; ++i) before.push_back(publishes(server(i)));
  // While the lock is held, waiting wakes nobody: a waiter's own failed attempts publish nothing.
  std::this_thread::sleep_for(1s);
  for (std::size_t i = 0; i < k_servers; ++i)
    EXPECT_EQ(publishes(server(i)), before[i]) << "a publish while the lock was held, on server " << i;
  touch("go");
  ASSERT_EQ(holder->wait_for_exit(10s), 0) << holder->result();
  EXPECT_EQ(waiter->wait_for_exit(10s), 0) << waiter->result();
  EXPECT_EQ(other->wait_for_exit(10s), 0) << other->result();
  EXPECT_EQ(read_file(file("ran")), "ran\nran\n");
  // Each release publishes where it deleted: the holder's on all three servers, each waiter's on the
  // two or three it held (a waiter that lost the race may have held the third for a moment).
  long long total = 0;
  for (std::size_t i = 0; i < k_servers; ++i) {
    const long long n = publishes(server(i)) - before[i];
    EXPECT_GE(n, 1) << "the holder's release published nothing on server " << i;
    total += n;
  }
  EXPECT_GE(total, 3 + 2 + 2);
  EXPECT_LE(total, 3 + 3 + 3);
  std::size_t listening = k_servers;

  // The server the next waiter listens on goes down while it waits.
  std::filesystem::remove(file("go"));
  std::filesystem::remove(file("ran"));
  std::filesystem::remove(file("token"));
  auto holder2 = start(quorum_sh("woken", kHoldUntilGo, {"--ttl", "30s"}));
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(file("token")) && holding("woken") == 3; }, 10s));
  auto waiter2 = start(quorum_sh("woken", "echo ran > ran", {"--wait", "60s"}));
  listening = k_servers;
  ASSERT_TRUE(wait_until([&] {
    for (std::size_t i = 0; i < k_servers; ++i)
      if (listeners(server(i)) == 1) listening = i;
    return listening < k_servers;
  }, 10s));
  server(listening).stop();
  touch("go");
  ASSERT_EQ(holder2->wait_for_exit(10s), 0) << holder2->result();
  EXPECT_EQ(waiter2->wait_for_exit(10s), 0) << waiter2->result();
  EXPECT_EQ(read_file(file("ran")), "ran\n");
}

}  // namespace
}  // namespace fencerun::test
