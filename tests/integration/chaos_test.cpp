// Chaos: the server freezes or dies, the lock is stolen, fencerun is killed, commands ignore the
// stop signal or leave processes behind. The invariant under test: the command and every process
// in its group are dead before the lease can expire on the server, and a lost lease never deletes
// another owner's lock.
#include <iomanip>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

class ChaosTest : public FencerunTest {
 protected:
  // Waits until the lock's PTTL jumps up (a renewal was just processed), then freezes the server
  // at once, so that no renewal can slip in between the PTTL read and the freeze (renewals are
  // ttl/3 apart). Returns the earliest instant at which the server can consider the key expired:
  // the PTTL request was sent after `t0`, so the expiry is at or after t0 + PTTL (less 1 ms for
  // the server's millisecond rounding).
  Clock::time_point freeze_right_after_renew(const std::string& name, bool kill_instead = false) {
    const std::string key = lock_key(name);
    long long prev = redis().pttl(key);
    const auto deadline = Clock::now() + 15s;
    while (Clock::now() < deadline) {
      const auto t0 = Clock::now();
      const long long p = redis().pttl(key);
      if (p < 0) throw std::runtime_error("lock key vanished while waiting for a renewal");
      if (p > prev + 30) {
        if (kill_instead)
          redis().stop();
        else
          redis().freeze();
        std::cout << "server " << (kill_instead ? "killed" : "frozen") << " with PTTL " << p
                  << " ms left\n";
        return t0 + std::chrono::milliseconds(p) - 1ms;
      }
      prev = p;
      std::this_thread::sleep_for(2ms);
    }
    throw std::runtime_error("no renewal of " + key + " observed within 15s");
  }

  struct DeathWatch {
    bool dead = false;
    Clock::time_point last_seen_alive;  // a check that began at this instant still saw a process
    Clock::time_point first_seen_dead;  // all were dead when this check ended
  };

  // Polls every millisecond until all pids are dead (gone or zombie) or the timeout passes.
  static DeathWatch watch_death(const std::vector<pid_t>& pids, Clock::duration timeout) {
    DeathWatch w;
    w.last_seen_alive = Clock::now();
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      const auto t = Clock::now();
      bool all = true;
      for (pid_t p : pids) all = all && process_dead(p);
      if (all) {
        w.dead = true;
        w.first_seen_dead = Clock::now();
        return w;
      }
      w.last_seen_alive = t;
      std::this_thread::sleep_for(1ms);
    }
    return w;
  }

  static std::vector<std::string> events(const std::string& json_log) {
    std::vector<std::string> out;
    for (const auto& line : split_lines(json_log)) {
      auto j = parse_json(line);
      if (!j) continue;
      if (auto e = j->find("event")) out.push_back(e->as_string().value_or(""));
    }
    return out;
  }

  static bool has(const std::vector<std::string>& v, std::string_view s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  }

  // Runs the "server stops answering" scenario and checks the invariant against the expiry bound.
  void expect_dead_before_expiry(const std::string& name, const std::string& script,
                                 std::vector<std::string> options, bool kill_server,
                                 const char* property) {
    options.insert(options.end(), {"-v", "--log-format", "json"});
    auto p = start(sh_args(name, script, options));
    const pid_t cmd = wait_pid("pid");
    const pid_t gc = wait_pid("gpid");
    wait_lock(name);
    const auto expiry = freeze_right_after_renew(name, kill_server);
    const auto w = watch_death({cmd, gc}, 15s);
    ASSERT_TRUE(w.dead) << "command or grandchild still alive long after the lease expired";
    const long long gap = ms_between(w.first_seen_dead, expiry);
    const long long gap_upper = ms_between(w.last_seen_alive, expiry);
    std::cout << property << ": command and grandchild dead " << gap << " ms (at most " << gap_upper
              << " ms) before the earliest server-side expiry\n";
    RecordProperty(property, std::to_string(gap));
    EXPECT_LT(w.last_seen_alive, expiry) << "a process of the command was seen alive "
                                         << -gap_upper << " ms after the lease could expire";
    EXPECT_LT(w.first_seen_dead, expiry)
        << "the command was dead only " << -gap << " ms after the lease could expire";
    if (kill_server)
      redis().start();
    else
      redis().thaw();
    auto code = p->wait_for_exit(15s);
    EXPECT_EQ(code, 124) << p->result();
    EXPECT_TRUE(has(events(p->err()), "stopping")) << "no 'stopping' event: " << p->result();
    if (!kill_server) {
      // Whatever the release did, the key is gone by now (expired or released), never renewed.
      EXPECT_TRUE(wait_until([&] { return !redis().exists(lock_key(name)); }, 5s));
    }
  }
};

TEST_F(ChaosTest, FrozenRedisCommandAndGrandchildDieBeforeLeaseExpires) {
  expect_dead_before_expiry("frozen", kHoldWithGrandchild, {"--ttl", "3s"}, false,
                            "gap_ms_frozen_redis");
}

TEST_F(ChaosTest, FrozenRedisTermIgnoringCommandKilledBeforeLeaseExpires) {
  expect_dead_before_expiry("frozen_ign", std::string("trap '' TERM; ") + kHoldWithGrandchild,
                            {"--ttl", "3s"}, false, "gap_ms_frozen_redis_term_ignored");
}

TEST_F(ChaosTest, KilledRedisCommandDiesBeforeLeaseDeadline) {
  expect_dead_before_expiry("killed_srv", kHoldWithGrandchild, {"--ttl", "3s"}, true,
                            "gap_ms_killed_redis");
}

TEST_F(ChaosTest, ShortTtlFrozenRedisCommandDiesBeforeLeaseExpires) {
  expect_dead_before_expiry("frozen_short", kHoldWithGrandchild, {"--ttl", "1s"}, false,
                            "gap_ms_frozen_redis_ttl_1s");
}

TEST_F(ChaosTest, RedisPauseShorterThanLeaseIsRidden) {
  // The server stops answering for 1.2s of a 3s lease: renewals fail or stall, are retried, and
  // succeed once it answers again. The command is not disturbed and the lease stays ours.
  auto p = start(sh_args("pause", kHoldUntilGo, {"--ttl", "3s", "-v", "--log-format", "json"}));
  const pid_t cmd = wait_pid("pid");
  const std::string value = wait_lock("pause");
  freeze_right_after_renew("pause");
  // Sleep through the next renewal (due 1s after the last one).
  std::this_thread::sleep_for(1200ms);
  redis().thaw();
  // A renewal has succeeded again: PTTL back above the point where the next one is due.
  EXPECT_TRUE(wait_until([&] { return redis().pttl(lock_key("pause")) > 2500; }, 3s))
      << "no renewal after the server came back";
  EXPECT_FALSE(process_dead(cmd)) << "the command was stopped although the lease never ran short";
  EXPECT_TRUE(p->running()) << p->result();
  EXPECT_EQ(redis().get(lock_key("pause")), value);
  touch("go");
  EXPECT_EQ(p->wait_for_exit(10s), 0) << p->result();
  EXPECT_FALSE(redis().exists(lock_key("pause")));
}

TEST_F(ChaosTest, LockDeletedAndTakenByAnotherOwner) {
  auto a = start(sh_args("steal", kHoldWithGrandchild, {"--ttl", "3s", "-v", "--log-format", "json"}));
  const pid_t cmd = wait_pid("pid");
  const pid_t gc = wait_pid("gpid");
  const auto a_value = parse_lock_value(wait_lock("steal"));
  ASSERT_TRUE(a_value.has_value());

  ASSERT_EQ(redis().cmd({"DEL", lock_key("steal")}).integer, 1);
  const auto stolen_at = Clock::now();
  auto b = start(sh_args("steal",
                         "echo $$ > bpid; echo $FENCERUN_TOKEN > btoken; "
                         "while [ ! -e go ]; do sleep 0.02; done",
                         {"--ttl", "30s", "--wait", "5s"}));
  wait_pid("bpid");
  const auto b_value = redis().get(lock_key("steal"));
  ASSERT_TRUE(b_value.has_value());
  const auto b_lock = parse_lock_value(*b_value);
  ASSERT_TRUE(b_lock.has_value());
  EXPECT_GT(b_lock->token, a_value->token);
  EXPECT_EQ(b_lock->pid, b->pid());

  const auto w = watch_death({cmd, gc}, 10s);
  ASSERT_TRUE(w.dead) << "the first owner's command survived the loss of its lease";
  std::cout << "first owner's command dead " << ms_between(stolen_at, w.first_seen_dead)
            << " ms after its lock was taken\n";
  EXPECT_LT(ms_between(stolen_at, w.first_seen_dead), 2500)
      << "the loss must be noticed at the next renewal (every 1s) and the command stopped at once";
  ASSERT_EQ(a->wait_for_exit(10s), 124) << a->result();
  EXPECT_TRUE(has(events(a->err()), "lease_lost")) << a->result();

  EXPECT_EQ(redis().get(lock_key("steal")), b_value) << "the first owner touched the new lock";
  EXPECT_GT(redis().pttl(lock_key("steal")), 20000);
  EXPECT_TRUE(b->running());
  touch("go");
  EXPECT_EQ(b->wait_for_exit(10s), 0) << b->result();
  EXPECT_FALSE(redis().exists(lock_key("steal")));
}

TEST_F(ChaosTest, LockOverwrittenByAnotherOwner) {
  auto a = start(sh_args("ovr", kHoldWithGrandchild, {"--ttl", "3s"}));
  const pid_t cmd = wait_pid("pid");
  const pid_t gc = wait_pid("gpid");
  wait_lock("ovr");
  const std::string other = "0123456789abcdef0123456789abcdef 1 1 elsewhere";
  ASSERT_TRUE(redis().cmd({"SET", lock_key("ovr"), other, "PX", "60000"}).ok());
  const auto w = watch_death({cmd, gc}, 10s);
  ASSERT_TRUE(w.dead);
  ASSERT_EQ(a->wait_for_exit(10s), 124) << a->result();
  EXPECT_EQ(redis().get(lock_key("ovr")), other) << "release deleted or changed another owner's lock";
  EXPECT_GT(redis().pttl(lock_key("ovr")), 50000) << "another owner's lock TTL was changed";
}

TEST_F(ChaosTest, LeaseLostExitCodeOption) {
  auto a = start(sh_args("llx", kHoldWithGrandchild, {"--ttl", "1500ms", "--lease-lost-exit-code", "99"}));
  wait_pid("pid");
  wait_lock("llx");
  ASSERT_EQ(redis().cmd({"DEL", lock_key("llx")}).integer, 1);
  EXPECT_EQ(a->wait_for_exit(10s), 99) << a->result();
}

// --kill-signal is what a job whose lease runs short (renewals failing: the server frozen) gets at the
// stop point. (A lost lease, the lock gone or another owner's, is SIGKILLed at once instead.)
TEST_F(ChaosTest, KillSignalOptionUsedWhenTheLeaseRunsShort) {
  const std::string script =
      "trap 'echo INT >> got; exit 0' INT; trap 'echo TERM >> got; exit 0' TERM; "
      "echo $$ > pid; while :; do sleep 0.05; done";
  auto a = start(sh_args("ksig", script, {"--ttl", "1500ms", "--kill-signal", "INT", "--timeout", "500ms"}));
  const pid_t cmd = wait_pid("pid");
  wait_lock("ksig");
  redis().freeze();
  EXPECT_TRUE(wait_dead(cmd, 10s));
  EXPECT_EQ(a->wait_for_exit(10s), 124)
      << "a command that exits 0 after the stop signal still means the lease ran short: "
      << a->result();
  redis().thaw();
  EXPECT_EQ(read_file(file("got")).value_or(""), "INT\n");
}

TEST_F(ChaosTest, SigkillOfFencerunKillsCommandGroup) {
  auto p = start(sh_args("sigkill", kHoldWithGrandchild, {"--ttl", "3s"}));
  const pid_t cmd = wait_pid("pid");
  const pid_t gc = wait_pid("gpid");
  // The command leads its own process group and the grandchild is in it.
  EXPECT_EQ(process_group(cmd), cmd);
  EXPECT_EQ(process_group(gc), cmd);
  EXPECT_NE(process_group(cmd), process_group(::getpid()));
  const auto killed_at = Clock::now();
  ASSERT_TRUE(p->signal(SIGKILL));
  EXPECT_EQ(p->wait_for_exit(5s), 128 + SIGKILL);
  const auto w = watch_death({cmd, gc}, 5s);
  EXPECT_TRUE(w.dead) << "command state " << process_state(cmd).value_or('-') << ", grandchild state "
                      << process_state(gc).value_or('-') << " 5s after fencerun was SIGKILLed";
  if (w.dead)
    std::cout << "command group dead " << ms_between(killed_at, w.first_seen_dead)
              << " ms after SIGKILL of fencerun\n";
}

TEST_F(ChaosTest, SigkillOfFencerunKillsTermIgnoringCommandGroup) {
  auto p = start(sh_args("sigkill2",
                         "trap '' TERM; echo $$ > pid; sleep 1000 & echo $! > gpid; wait",
                         {"--ttl", "3s"}));
  const pid_t cmd = wait_pid("pid");
  const pid_t gc = wait_pid("gpid");
  ASSERT_TRUE(p->signal(SIGKILL));
  p->wait_for_exit(5s);
  const auto w = watch_death({cmd, gc}, 8s);
  EXPECT_TRUE(w.dead) << "command state " << process_state(cmd).value_or('-') << ", grandchild state "
                      << process_state(gc).value_or('-') << " 8s after fencerun was SIGKILLed";
}

TEST_F(ChaosTest, SigtermOfFencerunForwardedAndLockReleased) {
  const std::string script =
      "trap 'echo TERM > trapped; trap - TERM; kill -TERM $$' TERM; echo $$ > pid; "
      "while :; do sleep 0.05; done";
  auto p = start(sh_args("sigterm", script, {"--ttl", "10s"}));
  const pid_t cmd = wait_pid("pid");
  wait_lock("sigterm");
  ASSERT_TRUE(p->signal(SIGTERM));
  EXPECT_EQ(p->wait_for_exit(10s), 143) << p->result();
  EXPECT_EQ(read_file(file("trapped")).value_or(""), "TERM\n") << "the command did not get SIGTERM";
  EXPECT_TRUE(process_dead(cmd));
  EXPECT_FALSE(redis().exists(lock_key("sigterm"))) << "lock not released";
  EXPECT_TRUE(redis().exists(token_key("sigterm")));
}

// A lost lease (the lock key deleted: the lock is anyone's) kills the whole job at once with SIGKILL:
// no stop signal, no --grace, even for a command that would trap the stop signal and run on.
TEST_F(ChaosTest, TermIgnoringCommandKilledAtOnceOnLeaseLoss) {
  // The command traps TERM (and records it) and keeps running; its grandchild ignores TERM.
  const std::string script =
      "trap 'echo TERM >> got' TERM; echo $$ > pid; "
      "sh -c 'trap \"\" TERM; exec sleep 1000' & echo $! > gpid; "
      "while :; do sleep 0.05; done";
  auto a = start(sh_args("ignore", script, {"--ttl", "6s", "--renew", "1s", "--grace", "3s"}));
  const pid_t cmd = wait_pid("pid");
  const pid_t gc = wait_pid("gpid");
  wait_lock("ignore");
  const auto lost_at = Clock::now();
  ASSERT_TRUE(redis().cmd({"DEL", lock_key("ignore")}).ok());
  const auto w = watch_death({cmd, gc}, 10s);
  ASSERT_TRUE(w.dead) << "TERM-ignoring command not killed";
  const long long after = ms_between(lost_at, w.first_seen_dead);
  std::cout << "TERM-ignoring command dead " << after << " ms after its lock was deleted\n";
  EXPECT_LE(after, 1000 + 1500) << "renew interval + slack exceeded: the grace was waited for";
  EXPECT_EQ(read_file(file("got")).value_or(""), "") << "a stop signal was sent to a job whose lock was gone";
  EXPECT_EQ(a->wait_for_exit(10s), 124) << a->result();
}

TEST_F(ChaosTest, TermIgnoringGrandchildKilledOnLeaseLoss) {
  const std::string script =
      "echo $$ > pid; sh -c 'trap \"\" TERM; echo $$ > gpid; exec sleep 1000' & wait";
  auto a = start(sh_args("gchild", script, {"--ttl", "3s", "--grace", "500ms"}));
  const pid_t cmd = wait_pid("pid");
  const pid_t gc = wait_pid("gpid");
  EXPECT_EQ(process_group(gc), cmd) << "the grandchild is in the command's process group";
  wait_lock("gchild");
  ASSERT_TRUE(redis().cmd({"DEL", lock_key("gchild")}).ok());
  const auto w = watch_death({cmd, gc}, 10s);
  EXPECT_TRUE(w.dead) << "grandchild state " << process_state(gc).value_or('-');
  auto code = a->wait_for_exit(10s);
  EXPECT_EQ(code, 124) << a->result();
  EXPECT_TRUE(process_dead(gc)) << "fencerun exited with a process of the group still running";
}

TEST_F(ChaosTest, LeftoverGroupProcessesKilledBeforeRelease) {
  // The command exits at once, leaving two background processes in its group, one ignoring TERM.
  const std::string script =
      "sleep 1000 & echo $! > gpid; "
      "sh -c 'trap \"\" TERM; echo $$ > gpid2; exec sleep 1000' & "
      "while [ ! -s gpid2 ]; do sleep 0.01; done; exit 0";
  auto p = start(sh_args("leftover", script, {"--ttl", "10s", "--grace", "500ms"}));
  const pid_t g1 = wait_pid("gpid");
  const pid_t g2 = wait_pid("gpid2");
  bool violation = false;
  bool saw_lock = false;
  std::string detail;
  wait_until(
      [&] {
        const bool running = p->running();
        const bool lock = redis().exists(lock_key("leftover"));
        saw_lock = saw_lock || lock;
        if (!lock && saw_lock && !(process_dead(g1) && process_dead(g2)) && !violation) {
          violation = true;
          detail = std::string("lock released while leftovers ran: ") +
                   process_state(g1).value_or('-') + " " + process_state(g2).value_or('-');
        }
        return !running;
      },
      15s, 1ms);
  ASSERT_FALSE(p->running()) << "fencerun did not exit";
  EXPECT_EQ(p->exit_code(), 0) << p->result();
  EXPECT_TRUE(process_dead(g1)) << "leftover still running after fencerun exited";
  EXPECT_TRUE(process_dead(g2)) << "TERM-ignoring leftover still running after fencerun exited";
  EXPECT_FALSE(violation) << detail;
  EXPECT_FALSE(redis().exists(lock_key("leftover")));
}

TEST_F(ChaosTest, LeaseRenewedWhileCommandRunsPastTtl) {
  // ttl 600ms, the command runs 2.5s: renewals keep the lock, and the key is never missing.
  auto p = start(sh_args("renew", "echo $$ > pid; sleep 2.5", {"--ttl", "600ms"}));
  const pid_t cmd = wait_pid("pid");
  wait_lock("renew");
  bool always_held = true;
  long long min_pttl = 1'000'000;
  wait_until(
      [&] {
        const long long t = redis().pttl(lock_key("renew"));
        // The command still runs after the read, so nothing was released yet: the lock must be
        // there.
        if (!process_dead(cmd)) {
          if (t < 0)
            always_held = false;
          else
            min_pttl = std::min(min_pttl, t);
        }
        return !p->running();
      },
      15s, 5ms);
  EXPECT_EQ(p->exit_code(), 0) << p->result();
  EXPECT_TRUE(always_held) << "the lock key disappeared while the command ran";
  std::cout << "lowest PTTL seen: " << min_pttl << " ms of 600\n";
  EXPECT_GT(min_pttl, 100) << "renewals came late";
  EXPECT_FALSE(redis().exists(lock_key("renew")));
}

}  // namespace
}  // namespace fencerun::test
