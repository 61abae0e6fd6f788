// The contract scenarios with faults, run on every setup, each test on a setup of its own (label
// chaos): the servers frozen under a holder, a holder frozen past its lease, a holder killed, and a
// server fault in the middle of a run.
#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "contract_fixture.hpp"

namespace fencerun::test::contract {
namespace {

constexpr int kBusy = 75;
constexpr int kLeaseLost = 124;

// The command of a second run: records its token, and whether the first run's command (its pid in
// the file `pid`) still ran when this one started, which would be two holders at once.
inline constexpr const char* kSecondJob =
    "a=$(cat pid); if [ -e /proc/$a/status ] && ! grep -q '^State:[[:space:]]*[ZX]' /proc/$a/status; "
    "then echo \"$a\" > overlap; fi; echo \"$FENCERUN_TOKEN\" > token2; echo $$ > pid2";

// 5. The lease lost because the servers stop answering (frozen: a majority of them, or the only
// one): the command and its process group are stopped before the lease can have expired on the
// server, and fencerun exits 124.
class LeaseLostChaos : public ContractChaosTest {};

TEST_P(LeaseLostChaos, JobStoppedBeforeTheLeaseEnds) {
  constexpr auto kTtl = 3s;
  auto holder = start(sh_args("lost", kHoldJob, {"--ttl", "3s"}));
  const pid_t pid = wait_pid("pid");
  const pid_t gpid = wait_pid("gpid");
  wait_token("token");
  ASSERT_TRUE(holder->running()) << holder->result();
  backend().lose_majority();
  // Every renewal sent from now on fails: the last one that succeeded was sent before this instant.
  const auto frozen = Clock::now();
  Clock::time_point job_dead{};
  ASSERT_TRUE(wait_until(
      [&] {
        if (!process_dead(pid) || !process_dead(gpid)) return false;
        job_dead = Clock::now();
        return true;
      },
      kTtl + 5s, 1ms))
      << "the job still runs " << ms_between(frozen, Clock::now()) << " ms after the servers froze";
  std::cout << "[ lease lost ] job dead " << ms_between(frozen, job_dead) << " ms after the freeze (TTL "
            << std::chrono::duration_cast<std::chrono::milliseconds>(kTtl).count() << " ms)\n";
  EXPECT_LT(job_dead - frozen, kTtl + 1s) << "the job outlived the lease";
  ASSERT_TRUE(holder->wait_for_exit(30s)) << holder->result();
  EXPECT_EQ(*holder->exit_code(), kLeaseLost) << holder->result();
  backend().thaw_all();
}

INSTANTIATE_TEST_SUITE_P(Contract, LeaseLostChaos, kAllSetups, setup_name);

// 6. Owner-checked release: a holder frozen (SIGSTOP) past its lease has its job stopped by the
// watchdog; the next run gets the lock; the first fencerun, thawed, exits 124 and its release does
// not delete the new holder's lock (which keeps the lock, and releases it itself at the end).
class ReleaseChaos : public ContractChaosTest {};

TEST_P(ReleaseChaos, LostHolderDoesNotDeleteTheNextOwnersLock) {
  auto first = start(sh_args("rel", kHoldJob, {"--ttl", "2s"}));
  const pid_t pid = wait_pid("pid");
  const pid_t gpid = wait_pid("gpid");
  const long long t1 = wait_token("token");
  ASSERT_TRUE(first->signal(SIGSTOP));
  // The second run waits for the first one's lease to run out.
  auto second = start(sh_args("rel", std::string(kSecondJob) + "; while [ ! -e go2 ]; do sleep 0.02; done",
                              {"--wait", "30s", "--ttl", "4s"}));
  const pid_t pid2 = wait_pid("pid2", 30s);
  (void)pid2;
  EXPECT_FALSE(std::filesystem::exists(file("overlap"))) << "the frozen holder's command still ran";
  EXPECT_TRUE(process_dead(pid) && process_dead(gpid)) << "the frozen holder's job still ran";
  const long long t2 = wait_token("token2");
  EXPECT_GT(t2, t1);
  ASSERT_TRUE(first->signal(SIGCONT));
  ASSERT_TRUE(first->wait_for_exit(30s)) << first->result();
  EXPECT_EQ(*first->exit_code(), kLeaseLost) << first->result();
  // The second run still holds the lock: status names it, a run that does not wait is busy.
  auto [code, j] = status_json("rel");
  EXPECT_EQ(code, 0) << "the lock is gone after the first holder's release";
  ASSERT_TRUE(j);
  EXPECT_EQ(json_int_of(j->find("pid")), second->pid());
  EXPECT_EQ(json_int_of(j->find("token")), t2);
  auto third = run(sh_args("rel", "touch third", {"--wait", "0"}));
  EXPECT_EQ(third.exit_code, kBusy) << third;
  EXPECT_TRUE(second->running());
  touch("go2");
  ASSERT_TRUE(second->wait_for_exit(30s)) << second->result();
  // 0, not 124: its own release found its lock in place.
  EXPECT_EQ(*second->exit_code(), 0) << second->result();
}

INSTANTIATE_TEST_SUITE_P(Contract, ReleaseChaos, kAllSetups, setup_name);

// 6b. The record of a run whose fencerun was frozen (SIGSTOP) past its lease: the watchdog stops the
// command at the stop point; fencerun, thawed seconds after the lease ran out, exits 124 and writes a
// record whose duration is what the command ran (its end is when the watchdog ended it, not when
// fencerun woke up), and does not claim that the command may have run without the lease.
class PausedRecordChaos : public ContractChaosTest {};

TEST_P(PausedRecordChaos, RecordSaysWhatTheCommandRan) {
  using namespace std::chrono;
  // The command writes when it began (wall clock, ns) and its pid, then sleeps until it is stopped.
  auto holder = start(sh_args("paused", "date +%s%N > begun; echo $$ > pid; exec sleep 30", {"--ttl", "3s"}));
  const pid_t pid = wait_pid("pid");
  ASSERT_TRUE(holder->signal(SIGSTOP));
  const auto frozen = Clock::now();
  // The command's end as seen from outside (a zombie counts as ended).
  system_clock::time_point ended{};
  ASSERT_TRUE(wait_until(
      [&] {
        if (!process_dead(pid)) return false;
        ended = system_clock::now();
        return true;
      },
      10s, 1ms))
      << "the command of the frozen fencerun still runs " << ms_between(frozen, Clock::now()) << " ms after";
  // fencerun stays frozen until the lease has run out on the server (the lock is free): past its TTL.
  ASSERT_TRUE(wait_until([&] { return status_json("paused").first == 3; }, 20s, 50ms))  // 3: free
      << "the lock stayed held by the frozen run";
  ASSERT_TRUE(holder->signal(SIGCONT));
  ASSERT_TRUE(holder->wait_for_exit(30s)) << holder->result();
  const RunResult r = holder->result();
  EXPECT_EQ(r.exit_code, kLeaseLost) << r;
  EXPECT_EQ(r.err.find("may have run without the lease"), std::string::npos) << r;
  const auto begun_line = wait_line("begun");
  const system_clock::time_point begun{duration_cast<system_clock::duration>(nanoseconds(std::stoll(begun_line)))};
  const long long ran_ms = duration_cast<milliseconds>(ended - begun).count();
  auto h = admin({"history", "paused", "--json"});
  auto j = parse_json(h.out);
  ASSERT_TRUE(j && j->kind == Json::Kind::Array && !j->items.empty()) << h;
  const auto recorded = json_int_of(j->items[0].find("duration_ms"));
  ASSERT_TRUE(recorded) << h;
  std::cout << "[ paused ] the command ran " << ran_ms << " ms, the record says " << *recorded << " ms (fencerun "
            << "frozen " << ms_between(frozen, Clock::now()) << " ms)\n";
  EXPECT_EQ(field(j->items[0], "outcome"), "stopped") << h;
  EXPECT_LE(std::abs(*recorded - ran_ms), 100) << h << "\n" << r;
}

INSTANTIATE_TEST_SUITE_P(Contract, PausedRecordChaos, kAllSetups, setup_name);

// 6c. A holder whose lock is deleted or taken by someone else (break; for the Redis setups also the
// key deleted or overwritten by hand) kills its whole job at once: SIGKILL, without waiting for
// --grace (the lock is already someone else's), even when the job ignores the stop signal; fencerun
// exits 124 and its log names the cause.
class LostLeaseChaos : public ContractChaosTest {
 protected:
  static constexpr auto kRenew = 1s;
  // A job that ignores SIGTERM (its children inherit that), with a grandchild in its group.
  static constexpr const char* kDeafJob =
      "trap '' TERM; echo $$ > pid; sleep 1000 & echo $! > gpid; while :; do sleep 0.05; done";

  std::unique_ptr<FencerunProcess> start_holder(const std::string& name) {
    // A long --grace (30s) that a lost lease must not wait for; quorum mode's lease cap raised to fit.
    return start(sh_args(name, kDeafJob, {"--ttl", "40s", "--renew", "1s", "--grace", "30s"}),
                 {{"FENCERUN_QUORUM_MAX_TTL", "60s"}});
  }

  // Every server's copy of NAME's lock key: deleted, or set to another owner's value (keeping its TTL).
  void on_every_copy(const std::string& name, bool take) {
    std::vector<RedisServer*> servers;
    switch (setup()) {
      case SetupId::redis: servers = {&backend_as<RedisBackend>().server()}; break;
      case SetupId::sentinel: servers = {&backend_as<SentinelBackend>().master()}; break;
      case SetupId::quorum:
        for (std::size_t i = 0; i < QuorumBackend::kServers; ++i) servers.push_back(&backend_as<QuorumBackend>().server(i));
        break;
      case SetupId::etcd: FAIL() << "no Redis key on etcd";
    }
    for (auto* s : servers) {
      Reply r = take ? s->cmd({"SET", lock_key(name), "intruder 1 1 elsewhere", "KEEPTTL", "XX"})
                     : s->cmd({"DEL", lock_key(name)});
      ASSERT_TRUE(r.ok()) << r.describe();
    }
  }

  // The job is gone well within one renewal interval (plus slack) of `lost_at`, not after --grace.
  void expect_killed_at_once(FencerunProcess& holder, pid_t pid, pid_t gpid, Clock::time_point lost_at,
                             const std::string& cause) {
    Clock::time_point dead{};
    ASSERT_TRUE(wait_until(
        [&] {
          if (!process_dead(pid) || !process_dead(gpid)) return false;
          dead = Clock::now();
          return true;
        },
        kRenew + 10s, 1ms))
        << "the job still runs " << ms_between(lost_at, Clock::now()) << " ms after its lock was lost";
    std::cout << "[ lost lease ] job dead " << ms_between(lost_at, dead) << " ms after the loss (" << cause
              << "; renew 1000 ms, grace 30000 ms)\n";
    EXPECT_LT(dead - lost_at, kRenew + 1500ms) << "the job outlived its lost lease by more than a renewal";
    ASSERT_TRUE(holder.wait_for_exit(30s)) << holder.result();
    const RunResult r = holder.result();
    EXPECT_EQ(r.exit_code, kLeaseLost) << r;
    EXPECT_NE(r.err.find("lease lost"), std::string::npos) << r;
    EXPECT_NE(r.err.find("cause: " + cause), std::string::npos) << "the log does not name the cause " << cause << "\n" << r;
    EXPECT_NE(r.err.find("no grace"), std::string::npos) << r;
  }
};

TEST_P(LostLeaseChaos, DeletedLockKillsTheJobAtOnce) {
  auto holder = start_holder("gone");
  const pid_t pid = wait_pid("pid");
  const pid_t gpid = wait_pid("gpid");
  ASSERT_TRUE(holder->running()) << holder->result();
  std::string cause;
  const auto lost_at = Clock::now();
  if (caps().break_lock) {
    auto b = admin({"break", "gone", "--yes"});
    ASSERT_EQ(b.exit_code, 0) << b;
    // etcd: break revokes the holder's lease; Redis: it deletes the key (expired or deleted, as the
    // holder can tell).
    cause = setup() == SetupId::etcd ? "revoked" : "expired_or_deleted";
  } else {
    on_every_copy("gone", false);
    cause = "expired_or_deleted";
  }
  expect_killed_at_once(*holder, pid, gpid, lost_at, cause);
}

TEST_P(LostLeaseChaos, TakenLockKillsTheJobAtOnce) {
  if (setup() == SetupId::etcd) GTEST_SKIP() << "etcd: a key on a live lease cannot be given to another owner by hand";
  auto holder = start_holder("taken");
  const pid_t pid = wait_pid("pid");
  const pid_t gpid = wait_pid("gpid");
  ASSERT_TRUE(holder->running()) << holder->result();
  const auto lost_at = Clock::now();
  on_every_copy("taken", true);
  expect_killed_at_once(*holder, pid, gpid, lost_at, "taken");
}

INSTANTIATE_TEST_SUITE_P(Contract, LostLeaseChaos, kAllSetups, setup_name);

// 10. A holder's fencerun killed with SIGKILL: its job dies with it, the next run gets the lock once
// the TTL has run out (not much later), and the record shows the killed run.
class KilledHolderChaos : public ContractChaosTest {};

TEST_P(KilledHolderChaos, NextRunGetsTheLockAndTheRecordShowsTheKill) {
  constexpr auto kTtl = 2s;
  auto holder = start(sh_args("kill", kHoldJob, {"--ttl", "2s"}));
  const pid_t pid = wait_pid("pid");
  const pid_t gpid = wait_pid("gpid");
  const long long token = wait_token("token");
  const pid_t killed = holder->pid();
  auto waiter = start(sh_args("kill", "echo \"$FENCERUN_TOKEN\" > token2; echo $$ > pid2", {"--wait", "30s"}));
  ASSERT_TRUE(holder->signal(SIGKILL));
  const auto killed_at = Clock::now();
  holder->wait_for_exit(10s);
  EXPECT_TRUE(wait_dead(pid, 5s)) << "the command outlived its killed fencerun";
  EXPECT_TRUE(wait_dead(gpid, 5s)) << "a process of the job outlived its killed fencerun";
  wait_pid("pid2", 30s);
  const auto acquired = Clock::now();
  ASSERT_TRUE(waiter->wait_for_exit(30s)) << waiter->result();
  EXPECT_EQ(*waiter->exit_code(), 0) << waiter->result();
  std::cout << "[ killed holder ] the next run held the lock " << ms_between(killed_at, acquired)
            << " ms after the kill (TTL 2000 ms)\n";
  EXPECT_LT(acquired - killed_at, kTtl + 3s) << "the lock stayed blocked long after the TTL";
  EXPECT_GT(wait_token("token2"), token);
  auto h = admin({"history", "kill", "--json"});
  auto j = parse_json(h.out);
  ASSERT_TRUE(j && j->kind == Json::Kind::Array) << h;
  ASSERT_EQ(j->items.size(), 2u) << h;
  EXPECT_EQ(field(j->items[0], "outcome"), "ok") << h;
  EXPECT_EQ(field(j->items[1], "outcome"), "killed") << h;
  EXPECT_EQ(field(j->items[1], "pid"), std::to_string(killed)) << h;
  EXPECT_EQ(field(j->items[1], "token"), std::to_string(token)) << h;
}

INSTANTIATE_TEST_SUITE_P(Contract, KilledHolderChaos, kAllSetups, setup_name);

// 11. A server fault in the middle of a run:
//   redis     the server killed and started again without its data: the holder finds its lock gone
//             (124, its job stopped), and the next run's token is still greater;
//   sentinel  a failover to the replica (which has the lock): the run goes on, or stops with 124;
//   quorum    one of the three servers killed: the majority holds, the run goes on and ends with 0;
//   etcd      the leader killed: the run goes on, or stops with 124.
// In every case a run that waits gets the lock afterwards with a greater token, and, but on the
// single server that lost its data, never while the first job still runs.
class ServerFaultChaos : public ContractChaosTest {};

TEST_P(ServerFaultChaos, RunSurvivesOrStopsSafely) {
  auto first = start(sh_args("fault", kHoldJob, {"--ttl", "3s"}));
  const pid_t pid = wait_pid("pid");
  const pid_t gpid = wait_pid("gpid");
  const long long t1 = wait_token("token");
  std::string fault;
  switch (setup()) {
    case SetupId::redis:
      fault = "server restarted empty";
      backend_as<RedisBackend>().server().restart();
      break;
    case SetupId::sentinel: {
      auto& s = backend_as<SentinelBackend>();
      // The replica has the lock before the failover (a replica that lacks it hands the lock to the
      // next run while this job still runs: asynchronous replication, not what is tested here).
      const auto value = s.master().get(lock_key("fault"));
      ASSERT_TRUE(value) << "the holder runs but the master has no lock";
      ASSERT_TRUE(deploy::wait_replicated(s.replica(), lock_key("fault"), value)) << "the lock never reached the replica";
      fault = "sentinel failover";
      s.failover();
      break;
    }
    case SetupId::quorum:
      fault = "one of three servers killed";
      backend_as<QuorumBackend>().server(0).stop();
      break;
    case SetupId::etcd: {
      auto& c = backend_as<EtcdBackend>().cluster();
      const int leader = c.leader();
      ASSERT_GE(leader, 0);
      fault = "etcd leader killed";
      c.kill(leader);
      break;
    }
  }
  const auto fault_at = Clock::now();
  // A second run waits for the lock meanwhile.
  auto second = start(sh_args("fault", kSecondJob, {"--wait", "60s", "--ttl", "3s"}));
  if (setup() == SetupId::quorum) {
    // While one server is down the others hold the lock: a run that does not wait is busy.
    auto r = run(sh_args("fault", "touch intruded", {"--wait", "0"}));
    EXPECT_EQ(r.exit_code, kBusy) << r;
  }
  // Two TTLs after the fault, the first run either still runs or has stopped.
  const bool stopped = wait_until([&] { return !first->running(); }, 6s, 20ms);
  const bool survived = !stopped;
  std::cout << "[ " << fault << " ] the first run " << (survived ? "ran on" : "stopped") << " ("
            << ms_between(fault_at, Clock::now()) << " ms after the fault)\n";
  touch("go");
  ASSERT_TRUE(first->wait_for_exit(30s)) << first->result();
  const RunResult fr = first->result();
  if (fr.exit_code != 0) std::cout << "[ " << fault << " ] the first run exited " << fr.exit_code << ":\n" << fr.err;
  EXPECT_TRUE(process_dead(pid) && process_dead(gpid)) << "the first run's job outlived its fencerun";
  switch (setup()) {
    case SetupId::redis:
      EXPECT_EQ(fr.exit_code, kLeaseLost) << "its lock was gone with the server's data\n" << fr;
      break;
    case SetupId::quorum:
      EXPECT_EQ(fr.exit_code, 0) << "a majority of the servers held the lock\n" << fr;
      break;
    default:
      EXPECT_TRUE(fr.exit_code == 0 || fr.exit_code == kLeaseLost) << fr;
      if (fr.exit_code == kLeaseLost) {
        EXPECT_FALSE(survived) << "stopped only at the end\n" << fr;
      }
  }
  ASSERT_TRUE(second->wait_for_exit(60s)) << second->result();
  EXPECT_EQ(*second->exit_code(), 0) << second->result();
  EXPECT_GT(wait_token("token2"), t1) << "the token after the fault is not greater";
  if (setup() != SetupId::redis) {
    EXPECT_FALSE(std::filesystem::exists(file("overlap"))) << "two holders at once after: " << fault;
  }
}

INSTANTIATE_TEST_SUITE_P(Contract, ServerFaultChaos, kAllSetups, setup_name);

}  // namespace
}  // namespace fencerun::test::contract
