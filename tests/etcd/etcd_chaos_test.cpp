// fencerun on etcd while members fail (each test its own 3-member cluster): the leader killed or
// frozen during a hold (the job runs to its end), token order across leader changes with concurrent
// clients, a frozen majority (the job dead before the lease's deadline, 124), a black-holed member
// first in the URL list (the client moves on), a paused holder (the next token is greater and a
// guard rejects the old holder's write).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <csignal>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "etcd_fixture.hpp"
#include "support/tcp_proxy.hpp"
#include "util/exit_code.hpp"

namespace fencerun::test {
namespace {

// Records pid and token, then runs until the file `go` appears.
constexpr const char* kHold =
    "echo $$ > pid; echo \"$FENCERUN_TOKEN\" > token; while [ ! -e go ]; do sleep 0.05; done";

class EtcdChaosTest : public EtcdOwnTest {
 protected:
  void TearDown() override {
    for (int i = 0; i < etcd().size(); ++i)
      if (etcd().frozen(i)) etcd().thaw(i);
    EtcdOwnTest::TearDown();
  }

  // 4 clients loop `--wait` runs of `name` (--ttl 6s) while `nemesis(round)` strikes `rounds` times, each
  // after a share of `target` acquisitions (it returns false when it could not strike). Every section
  // logs start/end with its token: no overlap, no equal token, no token below an earlier one.
  void token_order(const std::string& what, const std::string& name, int target, int rounds,
                   const std::function<bool(int)>& nemesis) {
    constexpr int k_clients = 4;
    std::atomic<bool> stop{false};
    acquired_ = 0;
    std::mutex mu;
    std::map<int, int> codes;     // exit code -> runs
    std::string usage_error;
    std::vector<std::thread> clients;
    const std::string log = name + ".log";
    // The end of a section fencerun stopped (124) before its command wrote it: when the command died.
    SectionWatcher ends(file(log));
    for (int c = 0; c < k_clients; ++c)
      clients.emplace_back([&] {
        while (!stop) {
          auto r = run(sh_args(name, section_script(log), {"--wait", "20s", "--ttl", "6s", "--timeout", "1s"}), {},
                       60s);
          std::lock_guard lock(mu);
          ++codes[r.exit_code];
          if (r.exit_code == 0) ++acquired_;
          if (r.exit_code == exit_code::k_usage) {
            usage_error = r.describe();
            return;
          }
        }
      });
    int struck = 0;
    const auto deadline = Clock::now() + 150s;
    for (int round = 0; round < rounds; ++round) {
      const int want = (round + 1) * target / (rounds + 1);
      wait_until([&] { return acquired_ >= want || !usage_error.empty() || Clock::now() > deadline; }, 150s, 20ms);
      if (!usage_error.empty() || Clock::now() > deadline) break;
      if (!nemesis(round)) break;
      ++struck;
    }
    wait_until([&] { return acquired_ >= target || !usage_error.empty() || Clock::now() > deadline; }, 150s, 20ms);
    stop = true;
    for (auto& t : clients) t.join();
    ASSERT_TRUE(usage_error.empty()) << usage_error;
    std::string summary;
    for (auto [code, n] : codes) summary += " exit " + std::to_string(code) + ": " + std::to_string(n) + ";";
    const int written = ends.finish();
    summary += " ends written for stopped sections: " + std::to_string(written) + ";";
    auto check = check_sections(read_file(file(log)).value_or(""));
    EXPECT_EQ(struck, rounds) << summary;
    EXPECT_GE(check.acquisitions, target) << summary << "\n" << check;
    EXPECT_EQ(check.regressions, 0) << check;
    EXPECT_EQ(check.equal, 0) << check;
    EXPECT_EQ(check.overlaps, 0) << check;
    EXPECT_EQ(check.malformed, 0) << check;
    EXPECT_TRUE(etcd().wait_healthy(15s));
    // A lease granted or left while the majority was frozen runs out by its TTL (6 s) after the last
    // leader change (a new leader gives every lease its TTL again; under load elections repeat).
    EXPECT_TRUE(nothing_left(name, 25s));
    std::cout << "token order, " << what << ": " << check.acquisitions << " acquisitions, " << check.regressions
              << " regressions, " << check.equal << " equal, " << check.overlaps << " overlaps;" << summary << "\n";
  }
  std::atomic<int> acquired_{0};

  // A holder with --ttl 6s through a leader change made by `change` (given the leader's index):
  // the job keeps running for more than two TTLs after it and ends with 0.
  void hold_through_leader_change(const std::function<void(int)>& change, const std::function<void(int)>& undo) {
    auto h = start(sh_args("lead", kHold, {"--ttl", "6s"}));
    const pid_t cmd = wait_pid("pid");
    const auto token = token_of(wait_line("token"));
    ASSERT_TRUE(token.has_value());
    const int old = etcd().leader();
    ASSERT_GE(old, 0);
    change(old);
    const int next = etcd().wait_for_new_leader(old);
    ASSERT_GE(next, 0) << "no new leader";
    // Two TTLs after the change: the lease was kept through another member.
    const auto until = Clock::now() + 13s;
    while (Clock::now() < until) {
      ASSERT_TRUE(h->running()) << "the holder stopped during the leader change\n" << h->result();
      ASSERT_FALSE(process_dead(cmd)) << "the command was stopped\n" << h->result();
      std::this_thread::sleep_for(100ms);
    }
    undo(old);
    touch("go");
    auto rc = h->wait_for_exit(15s);
    EXPECT_EQ(rc, 0) << h->result();
    EXPECT_TRUE(etcd().wait_healthy(15s));
    EXPECT_TRUE(nothing_left("lead", 10s));
    // The next token is greater.
    auto n = run({"-r", etcd().url(), "lead", "--", "printenv", "FENCERUN_TOKEN"});
    ASSERT_EQ(n.exit_code, 0) << n;
    EXPECT_GT(token_of(n.out).value_or(0), *token);
  }
};

TEST_F(EtcdChaosTest, LeaderKilledDuringHold) {
  hold_through_leader_change([&](int l) { etcd().kill(l); }, [&](int l) { etcd().restart(l); });
}

TEST_F(EtcdChaosTest, LeaderFrozenDuringHold) {
  hold_through_leader_change([&](int l) { etcd().freeze(l); }, [&](int l) { etcd().thaw(l); });
}

// 4 clients loop `--wait` runs while the leader is killed and restarted 3 times; 200 acquisitions or
// more: no two sections overlap, no token is repeated, none goes back.
// 4 clients loop `--wait` runs of NAME while `nemesis(round)` strikes `rounds` times (it returns
// false when it could not); each section logs start/end with its token. Returns the check.
TEST_F(EtcdChaosTest, TokenOrderAcrossThreeLeaderChanges) {
  token_order("leader killed (kill -9) and restarted, 3 times", "order", 200, 3, [&](int) {
    const int old = etcd().leader();
    if (old < 0) return false;
    etcd().kill(old);
    if (etcd().wait_for_new_leader(old) < 0) return false;
    const int after = acquired_;
    wait_until([&] { return acquired_ >= after + 10; }, 60s, 20ms);
    etcd().restart(old);
    return true;
  });
}

TEST_F(EtcdChaosTest, TokenOrderWhileTheLeaderIsFrozen) {
  token_order("leader frozen (SIGSTOP) 3s, then thawed, 3 times", "frozen", 100, 3, [&](int) {
    const int old = etcd().leader();
    if (old < 0) return false;
    etcd().freeze(old);
    std::this_thread::sleep_for(3s);  // the fault's length is the point: a new leader, old leases promoted
    etcd().thaw(old);
    return etcd().wait_healthy(15s);
  });
}

TEST_F(EtcdChaosTest, TokenOrderThroughARollingRestart) {
  token_order("rolling restart (each member killed and restarted in turn)", "rolling", 100, 3, [&](int round) {
    const int member = round % etcd().size();
    etcd().kill(member);
    const int after = acquired_;
    wait_until([&] { return acquired_ >= after + 5; }, 60s, 20ms);
    etcd().restart(member);
    return etcd().wait_healthy(15s);
  });
}

TEST_F(EtcdChaosTest, TokenOrderWhileAMajorityIsFrozen) {
  token_order("a majority frozen 2s (no quorum), then thawed, 3 times", "majority", 100, 3, [&](int round) {
    const int a = round % etcd().size(), b = (round + 1) % etcd().size();
    etcd().freeze(a);
    etcd().freeze(b);
    std::this_thread::sleep_for(2s);
    etcd().thaw(a);
    etcd().thaw(b);
    return etcd().wait_healthy(15s);
  });
}

// The etcdctl lock failure: a holder and 3 waiters (--ttl 3s); the leader is frozen for longer than
// the TTL (the holder ends meanwhile) and thawed (it then revokes overdue leases at once). Each
// waiter checks that its key is still there and the lowest before it runs: no two sections overlap,
// no token repeats or goes back.
TEST_F(EtcdChaosTest, WaitersThroughAFrozenLeaderNeverOverlap) {
  const std::vector<std::string> opts = {"--wait", "60s", "--ttl", "3s", "--timeout", "1s"};
  // The end of a section fencerun stopped (124) before its command wrote it: when the command died.
  SectionWatcher ends(file("log"));
  std::vector<std::unique_ptr<FencerunProcess>> runs;
  // The holder's section lasts until `go`; the waiters' one second each.
  runs.push_back(start(sh_args("thaw",
                               "echo \"$FENCERUN_TOKEN\"; echo \"start $FENCERUN_TOKEN $$\" >> log; "
                               "while [ ! -e go ]; do sleep 0.05; done; echo \"end $FENCERUN_TOKEN\" >> log",
                               opts)));
  for (int i = 0; i < 4; ++i) {
    if (i > 0) runs.push_back(start(sh_args("thaw", section_script("log", "1"), opts)));
    ASSERT_TRUE(wait_until([&] { return waiters("thaw").size() == static_cast<std::size_t>(i) + 1; }, 10s, 20ms))
        << "run " << i << " never wrote its key\n" << runs.back()->result();
  }
  const int l = etcd().leader();
  ASSERT_GE(l, 0);
  etcd().freeze(l);
  // The fault's length (longer than the TTL), not a synchronisation; the holder ends within it.
  std::this_thread::sleep_for(2s);
  touch("go");
  std::this_thread::sleep_for(3s);
  etcd().thaw(l);
  int ran = 0;
  for (auto& r : runs) {
    auto rc = r->wait_for_exit(60s);
    ASSERT_TRUE(rc.has_value()) << r->result();
    EXPECT_TRUE(*rc == 0 || *rc == exit_code::k_lease_lost_default || *rc == exit_code::k_unavailable) << r->result();
    ran += *rc == 0;
  }
  ends.finish();
  auto check = check_sections(read_file(file("log")).value_or(""));
  EXPECT_TRUE(check.ok()) << check;
  EXPECT_GE(check.acquisitions, ran) << check;
  EXPECT_GE(ran, 1) << "no run got through";
  EXPECT_TRUE(etcd().wait_healthy(15s));
  EXPECT_TRUE(nothing_left("thaw", 10s));
}

// Two of three members frozen during a hold with --ttl 4s: the command and its grandchild are dead
// within 4 s of the freeze (the lease's deadline is at most that), and fencerun exits 124.
TEST_F(EtcdChaosTest, MajorityFrozenStopsTheJobBeforeTheDeadline) {
  auto h = start(sh_args("major", kHoldWithGrandchildEtcd, {"--ttl", "4s"}));
  const pid_t cmd = wait_pid("pid");
  const pid_t grandchild = wait_pid("gpid");
  wait_line("token");
  const int l = etcd().leader();
  ASSERT_GE(l, 0);
  const int other = (l + 1) % 3;
  const auto t0 = Clock::now();
  etcd().freeze(l);
  etcd().freeze(other);
  const auto deadline = t0 + 4s;
  EXPECT_TRUE(wait_dead(cmd, std::max<Clock::duration>(deadline - Clock::now(), 0s))) << "the command outlived the lease's deadline\n" << h->result();
  EXPECT_TRUE(wait_dead(grandchild, std::max<Clock::duration>(deadline - Clock::now(), 0s)))
      << "the grandchild outlived the lease's deadline";
  // fencerun itself may spend up to --timeout per member trying to release before it exits.
  auto rc = h->wait_for_exit(20s);
  EXPECT_EQ(rc, exit_code::k_lease_lost_default) << h->result();
  etcd().thaw(l);
  etcd().thaw(other);
  ASSERT_TRUE(etcd().wait_healthy(15s));
  EXPECT_TRUE(nothing_left("major", 15s)) << "the lost lease and its key go once the cluster is back";
}

// Member 0, first in the URL list, reached through a proxy that black-holes it (accepts, never
// answers, no RST): runs acquire through the others within --timeout, and a holder whose member
// becomes a black hole keeps its lease.
TEST_F(EtcdChaosTest, BlackHoledMemberFirstInList) {
  TcpProxy proxy(etcd().client_port(0));
  const std::string url = "etcd://127.0.0.1:" + std::to_string(proxy.port()) + "," + etcd().endpoint(1) + "," +
                          etcd().endpoint(2);
  // A holder connected through the proxy while it passes through; then the member goes dark.
  auto h = start(sh_args_url(url, "hole", kHold, {"--ttl", "6s", "--timeout", "1s"}));
  const pid_t cmd = wait_pid("pid");
  const auto token = token_of(wait_line("token"));
  ASSERT_TRUE(token.has_value());
  proxy.set_mode(TcpProxy::Mode::black_hole);
  const auto until = Clock::now() + 10s;
  while (Clock::now() < until) {
    ASSERT_TRUE(h->running()) << "the holder stopped while its member was black-holed\n" << h->result();
    ASSERT_FALSE(process_dead(cmd));
    std::this_thread::sleep_for(100ms);
  }
  touch("go");
  EXPECT_EQ(h->wait_for_exit(15s), 0) << h->result();

  // New runs with the black hole first in the list acquire within about --timeout.
  long long prev = *token;
  for (int i = 0; i < 3; ++i) {
    auto r = run({"-r", url, "--timeout", "1s", "hole", "--", "printenv", "FENCERUN_TOKEN"}, {}, 30s);
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_LT(r.elapsed, 4000ms) << r;
    auto t = token_of(r.out);
    ASSERT_TRUE(t.has_value()) << r;
    EXPECT_GT(*t, prev);
    prev = *t;
  }
  EXPECT_GT(proxy.connections(), 0) << "the proxy was never tried";
  EXPECT_TRUE(nothing_left("hole", 10s));
}

// fencerun, its watchdog and its command frozen (SIGSTOP) past the TTL: the next run acquires with
// a greater token and writes the guarded counter; the old holder, thawed, is stopped (124), and its
// write through the guard is rejected (77).
TEST_F(EtcdChaosTest, PausedHolderIsFencedOff) {
  const EnvList env = {{"FENCERUN", fencerun_binary()}};
  // Each holder reads the counter, writes it + 1 through the guard, records its token.
  const std::string incr =
      "n=$(cat counter 2>/dev/null || echo 0); printf '%s\\n' $((n + 1)) | \"$FENCERUN\" fence file counter; ";
  auto a = start(sh_args("paused", incr + "echo $$ > pid; echo \"$FENCERUN_TOKEN\" > token; "
                                         "while [ ! -e go ]; do sleep 0.05; done",
                         {"--ttl", "3s"}),
                 env);
  const pid_t cmd = wait_pid("pid");
  const auto token_a = token_of(wait_line("token"));
  ASSERT_TRUE(token_a.has_value());
  ASSERT_EQ(trim(read_file(file("counter")).value_or("")), "1");
  // Freeze the whole holder: fencerun, its watchdog, the command's process group.
  std::vector<pid_t> frozen = {a->pid()};
  for (pid_t p : descendants(a->pid())) frozen.push_back(p);
  if (auto pg = process_group(cmd)) ::kill(-*pg, SIGSTOP);
  for (pid_t p : frozen) ::kill(p, SIGSTOP);
  const auto frozen_at = Clock::now();

  auto b = run(sh_args("paused", incr + "echo \"$FENCERUN_TOKEN\" > token-b", {"--wait", "20s", "--ttl", "3s"}), env,
               30s);
  ASSERT_EQ(b.exit_code, 0) << b;
  EXPECT_GE(ms_between(frozen_at, Clock::now()), 1500) << "the next run acquired long before the old lease could expire";
  const auto token_b = token_of(read_file(file("token-b")).value_or(""));
  ASSERT_TRUE(token_b.has_value());
  EXPECT_GT(*token_b, *token_a);
  EXPECT_EQ(trim(read_file(file("counter")).value_or("")), "2");

  // Thaw the old holder: it finds its lease lost and stops the command.
  for (pid_t p : frozen) ::kill(p, SIGCONT);
  if (auto pg = process_group(cmd)) ::kill(-*pg, SIGCONT);
  auto rc = a->wait_for_exit(10s);
  EXPECT_EQ(rc, exit_code::k_lease_lost_default) << a->result();
  EXPECT_TRUE(wait_dead(cmd, 5s));

  // The old holder's write (counter 1 + 1 with its token), arriving now: rejected, counter unchanged.
  write_file(file("stale-in"), "2\n");
  SpawnOptions so = spawn_options({{"FENCERUN_TOKEN", std::to_string(*token_a)}});
  so.stdin_file = file("stale-in");
  auto stale = run_fencerun({"fence", "file", "counter"}, so, 30s);
  EXPECT_EQ(stale.exit_code, exit_code::k_fence_stale) << stale;
  EXPECT_EQ(trim(read_file(file("counter")).value_or("")), "2");
  EXPECT_TRUE(nothing_left("paused", 6s));
}

}  // namespace
}  // namespace fencerun::test
