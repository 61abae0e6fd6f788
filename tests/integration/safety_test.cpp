// The safety invariant on every path: whatever happens to fencerun (a late reply, an internal error,
// SIGSTOP, SIGKILL right after the start, closed stdio, unexpected signals), no process of the job
// runs on without a lease, no lock is left held, and the caller hears about a lost lease.
#include <linux/kcmp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <fstream>
#include <sstream>

#include "fixture.hpp"
#include "support/tcp_proxy.hpp"

namespace fencerun::test {
namespace {

class SafetyTest : public FencerunTest {
 protected:
  // Waits until fencerun (pid) has released or lost the lock and the key is gone.
  bool lock_gone(const std::string& name, Clock::duration timeout = 5s) {
    return wait_until([&] { return !redis().exists(lock_key(name)); }, timeout);
  }
  void write_script(std::string_view name, std::string_view text) const { write_file(file(name), text, 0755); }
  // fencerun under strace with `trace` options (a fault to inject), running `script` under lock `name`.
  std::vector<std::string> under_strace(std::vector<std::string> trace, std::string name, std::string script) {
    std::vector<std::string> args = {"strace", "-qq", "-o", "/dev/null"};
    args.insert(args.end(), trace.begin(), trace.end());
    args.push_back(fencerun_binary());
    for (auto& a : sh_args(std::move(name), std::move(script))) args.push_back(a);
    return args;
  }
  std::string redis_cli() const { return "redis-cli -p " + std::to_string(const_cast<SafetyTest*>(this)->redis().port()); }
};

// 1. A reply that arrives after the stop point must not start the command.
TEST_F(SafetyTest, LateAcquireReplyNeverStartsTheCommand) {
  TcpProxy proxy(redis().port());
  proxy.set_mode(TcpProxy::Mode::delay_replies, 1500ms);
  const std::string url = "redis://127.0.0.1:" + std::to_string(proxy.port());
  auto r = run({"-r", url, "--ttl", "1s", "late", "--", "sh", "-c", "echo ran > ran"});
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command ran after its lease's stop point\n" << r;
  EXPECT_TRUE(r.exit_code == 69 || r.exit_code == 124) << r;
  // Bounded by the TTL's stop point (about 770ms), not by --timeout (2s) plus the delay.
  EXPECT_LT(r.elapsed, 1500ms) << r;
  // Whatever was set expires with its TTL: another owner acquires.
  auto next = run({"-r", redis().url(), "--wait", "3s", "late", "--", "true"});
  EXPECT_EQ(next.exit_code, 0) << next;
}

// 2. An internal error after the command started (the renewal thread cannot be created) kills the job
// first and releases the lock. (strace counts calls per process, and only fencerun's own process
// calls clone3: sh forks with clone.)
TEST_F(SafetyTest, InternalErrorAfterStartKillsTheJobAndReleases) {
  if (::access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "strace is not installed";
  // clone3 is what pthread_create uses (fork uses clone): fail it after 500ms, by which time the
  // command has started a background grandchild.
  // The command itself is started with fencerun's first clone3 (when=1): only the later ones fail.
  auto r = run_program(under_strace({"-f", "-e", "trace=clone3", "-e", "inject=clone3:error=EAGAIN:delay_enter=500000:when=2+"},
                                    "internal", kHoldWithGrandchild),
                       spawn_options(), 30s);
  EXPECT_EQ(r.exit_code, 70) << r;
  auto pid = wait_for_pid_file(file("pid"), 1s);
  auto gpid = wait_for_pid_file(file("gpid"), 1s);
  ASSERT_TRUE(pid && gpid) << "the command did not start its grandchild before the fault\n" << r;
  EXPECT_TRUE(wait_dead(*pid, 2s));
  EXPECT_TRUE(wait_dead(*gpid, 2s)) << "the grandchild outlived an internal error";
  kill_if_alive(*gpid);
  EXPECT_FALSE(redis().exists(lock_key("internal"))) << "the lock was left held";
}

// 2b. The watchdog is started with clone(CLONE_VM); when that is refused it is forked instead, and it
// still takes the job down when fencerun is SIGKILLed. fork() is a clone too: refusing every clone
// leaves no watchdog, and then the command never starts and the lock is released.
TEST_F(SafetyTest, RefusedWatchdogCloneFallsBackToFork) {
  if (::access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "strace is not installed";
  // Without -f only fencerun is traced (strace counts calls per process): its first clone is the
  // watchdog's, the fork after it is not refused.
  auto r = run_program(under_strace({"-e", "trace=clone", "-e", "inject=clone:error=EAGAIN:when=1"}, "refused",
                                    "sleep 1000 & echo $! > gpid; kill -9 $PPID; wait"),
                       spawn_options(), 30s);
  auto gpid = wait_for_pid_file(file("gpid"), 2s);
  ASSERT_TRUE(gpid.has_value()) << "the command did not run with a forked watchdog\n" << r;
  EXPECT_TRUE(wait_dead(*gpid, 3s)) << "the forked watchdog did not take the job down\n" << r;
  kill_if_alive(*gpid);
}

TEST_F(SafetyTest, NoWatchdogMeansNoCommandAndNoLockLeft) {
  if (::access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "strace is not installed";
  auto r = run_program(under_strace({"-e", "trace=clone", "-e", "inject=clone:error=EAGAIN"}, "nowatchdog",
                                    "echo ran > ran"),
                       spawn_options(), 30s);
  EXPECT_EQ(r.exit_code, 70) << r;
  EXPECT_NE(r.err.find("cannot start the watchdog"), std::string::npos) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command ran without a watchdog";
  EXPECT_FALSE(redis().exists(lock_key("nowatchdog"))) << "the lock was left held";
}

// 2c. Once the job has run a while, the watchdog lives in a memory of its own (so that the OOM killer
// does not take it with fencerun), and it still takes the whole job down when fencerun is SIGKILLed.
TEST_F(SafetyTest, WatchdogOfALongerJobHasItsOwnMemoryAndStillEndsTheJob) {
  auto p = start(sh_args("moved", kHoldWithGrandchild));
  pid_t pid = wait_pid("pid");
  pid_t gpid = wait_pid("gpid");
  const std::string children = "/proc/" + std::to_string(p->pid()) + "/task/" + std::to_string(p->pid()) + "/children";
  pid_t watchdog = -1;
  long same = -1;
  bool moved = wait_until([&] {
    std::ifstream in(children);
    for (pid_t c; in >> c;) {
      std::ifstream comm("/proc/" + std::to_string(c) + "/comm");
      std::string name;
      if (!std::getline(comm, name) || name != "fencerun-watch") continue;
      watchdog = c;
      same = ::syscall(SYS_kcmp, p->pid(), c, KCMP_VM, 0, 0);
      if (same != 0) return true;
    }
    return false;
  }, 5s, 10ms);
  if (same < 0 && (errno == ENOSYS || errno == EPERM)) GTEST_SKIP() << "kcmp(2) is not available here";
  EXPECT_TRUE(moved) << "the watchdog (" << watchdog << ") still shares fencerun's memory";
  ASSERT_TRUE(p->signal(SIGKILL));
  EXPECT_TRUE(wait_dead(pid, 3s)) << "the command outlived fencerun";
  EXPECT_TRUE(wait_dead(gpid, 3s)) << "the grandchild outlived fencerun";
}

// 3. fencerun stopped for longer than the TTL: the watchdog kills the job before the lease can expire.
TEST_F(SafetyTest, StoppedFencerunStillStopsTheJobBeforeTheLeaseExpires) {
  auto p = start(sh_args("frozen", kHoldWithGrandchild, {"--ttl", "1500ms"}));
  pid_t pid = wait_pid("pid");
  pid_t gpid = wait_pid("gpid");
  ASSERT_TRUE(p->signal(SIGSTOP));
  long long pttl_at_death = -3;
  bool dead = wait_until([&] {
    if (!(process_dead(pid) && process_dead(gpid))) return false;
    pttl_at_death = redis().pttl(lock_key("frozen"));
    return true;
  }, 5s, 1ms);
  p->signal(SIGCONT);
  ASSERT_TRUE(dead) << "the job kept running while fencerun was stopped";
  std::cout << "PTTL when the whole job was dead: " << pttl_at_death << " ms\n";
  EXPECT_GT(pttl_at_death, 0) << "the job outlived its lease on the server";
  auto code = p->wait_for_exit(10s);
  EXPECT_EQ(code, 124) << p->result();
}

TEST_F(SafetyTest, TstpNeverStopsFencerunAndReachesTheCommand) {
  auto p = start(sh_args("tstp", kHoldUntilGo, {"--ttl", "2s", "-v"}));
  pid_t pid = wait_pid("pid");
  ASSERT_TRUE(p->signal(SIGTSTP));
  EXPECT_TRUE(wait_until([&] { return p->err().find("signal: TSTP") != std::string::npos; }, 3s))
      << "TSTP was not forwarded to the command\n" << p->err();
  // Whether the shell shows as stopped at once varies under load; fencerun's side is what is asserted.
  wait_until([&] { return process_state(pid) == 'T'; }, 1s);
  // fencerun keeps running (and renewing) through a few TTLs.
  for (int i = 0; i < 30; ++i) {
    ASSERT_NE(process_state(p->pid()), 'T') << "fencerun was stopped by SIGTSTP";
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(redis().exists(lock_key("tstp")));
  ASSERT_TRUE(p->signal(SIGCONT));
  EXPECT_TRUE(wait_until([&] { return process_state(pid) != 'T'; }, 3s));
  touch("go");
  EXPECT_EQ(p->wait_for_exit(10s), 0) << p->result();
}

// 4. SIGKILL of fencerun the moment the command starts: no process of the job survives.
TEST_F(SafetyTest, FencerunKilledAtOnceByItsCommandLeavesNothingRunning) {
  int survivors = 0;
  for (int round = 0; round < 20; ++round) {
    std::filesystem::remove(file("gpid"));
    auto r = run(sh_args("instant", "sleep 1000 & echo $! > gpid; kill -9 $PPID; wait"), {}, 10s);
    auto gpid = wait_for_pid_file(file("gpid"), 2s);
    ASSERT_TRUE(gpid.has_value()) << r;
    if (!wait_dead(*gpid, 3s)) {
      ++survivors;
      kill_if_alive(*gpid);
    }
    // Leave the next round a free lock (the killed holder's lease would block it).
    redis().cmd({"DEL", lock_key("instant")});
  }
  EXPECT_EQ(survivors, 0) << survivors << " of 20 background children outlived a SIGKILLed fencerun";
}

// 5. Processes that leave the process group are stopped too: in the job's cgroup where one can be
// made, and the command's own pid always.
TEST_F(SafetyTest, ProcessesThatLeaveTheGroupAreStoppedWithTheJob) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs a writable cgroup v2 hierarchy (root)";
  auto p = start(sh_args("escape", "echo $$ > pid; setsid sleep 1000 & echo $! > gpid; wait",
                         {"--ttl", "2s", "-vv"}));
  wait_pid("pid");
  pid_t gpid = wait_pid("gpid");
  ASSERT_TRUE(wait_until([&] { return process_group(gpid) == gpid; }, 3s)) << "setsid did not take effect";
  if (p->err().find("containment: cgroup") == std::string::npos) {
    redis().cmd({"DEL", lock_key("escape")});
    p->wait_for_exit(10s);
    GTEST_SKIP() << "no cgroup could be made here: " << p->err();
  }
  redis().cmd({"DEL", lock_key("escape")});  // the lease is lost at the next renewal
  EXPECT_EQ(p->wait_for_exit(10s), 124) << p->result();
  EXPECT_TRUE(wait_dead(gpid, 2s)) << "a process that left the group outlived the job";
}

// The cgroup v2 mount point, or "" (from /proc/self/mountinfo).
std::string cgroup2_mount() {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    auto sep = line.find(" - cgroup2 ");
    if (sep == std::string::npos) continue;
    std::istringstream f(line.substr(0, sep));
    std::string id, parent, dev, root, mount;
    f >> id >> parent >> dev >> root >> mount;
    return mount;
  }
  return {};
}

// Job cgroups named after fencerun's pid, anywhere below the mount.
int job_cgroups_of(pid_t fencerun) {
  std::string mount = cgroup2_mount();
  if (mount.empty()) return 0;
  int n = 0;
  std::error_code ec;
  const std::string prefix = "fencerun-" + std::to_string(fencerun) + "-";
  for (auto it = std::filesystem::recursive_directory_iterator(mount, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_directory(ec) && it->path().filename().string().starts_with(prefix)) ++n;
  return n;
}

TEST_F(SafetyTest, KilledFencerunLeavesNoCgroupBehind) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs a writable cgroup v2 hierarchy (root)";
  auto p = start(sh_args("cgleft", kHoldWithGrandchild, {"-vv"}));
  wait_pid("pid");
  pid_t gpid = wait_pid("gpid");
  if (p->err().find("containment: cgroup") == std::string::npos) GTEST_SKIP() << "no cgroup here: " << p->err();
  ASSERT_EQ(job_cgroups_of(p->pid()), 1);
  p->signal(SIGKILL);
  EXPECT_TRUE(wait_dead(gpid, 3s));
  EXPECT_TRUE(wait_until([&] { return job_cgroups_of(p->pid()) == 0; }, 5s))
      << "the job's cgroup outlived a SIGKILLed fencerun";
}

// The job's cgroup as the command sees it ("0::/PATH" in /proc/self/cgroup), and as fencerun logs it.
std::string cgroup_seen(const std::filesystem::path& file) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("0::")) return line.substr(3);
  return {};
}

// 5b. The command starts inside its cgroup (clone3 with CLONE_INTO_CGROUP) and, where the kernel has no
// clone3 (ENOSYS) or no CLONE_INTO_CGROUP (EINVAL, E2BIG), moves itself in before exec: either way it
// is in the job's cgroup from before its first instruction, and so is everything it starts.
TEST_F(SafetyTest, CommandStartsInItsCgroupWithOrWithoutClone3) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs a writable cgroup v2 hierarchy (root)";
  if (::access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "strace is not installed";
  for (const char* fault : {"", "ENOSYS", "EINVAL", "E2BIG"}) {
    SCOPED_TRACE(std::string("clone3 refused with ") + (*fault ? fault : "nothing"));
    std::filesystem::remove(file("cg"));
    std::filesystem::remove(file("gcg"));
    const std::string script = "cat /proc/self/cgroup > cg; sh -c 'cat /proc/self/cgroup > gcg'";
    std::vector<std::string> args = {"strace", "-qq", "-o", "/dev/null", "-e", "trace=clone3,vfork,write"};
    if (*fault) args.insert(args.end(), {"-e", std::string("inject=clone3:error=") + fault + ":when=1"});
    args.push_back(fencerun_binary());
    for (auto& a : sh_args("inside", script, {"-vv"})) args.push_back(a);
    auto r = run_program(args, spawn_options(), 30s);
    ASSERT_EQ(r.exit_code, 0) << r;
    auto at = r.err.find("containment: cgroup /");
    if (at == std::string::npos) GTEST_SKIP() << "no cgroup could be made here: " << r.err;
    std::string logged = r.err.substr(at + 19, r.err.find(']', at) - at - 19);
    std::string seen = cgroup_seen(file("cg"));
    ASSERT_FALSE(seen.empty()) << r;
    EXPECT_TRUE(logged.ends_with(seen)) << "the command ran in " << seen << ", not in the job's " << logged;
    EXPECT_EQ(cgroup_seen(file("gcg")), seen) << "a child of the command was not in the job's cgroup";
  }
}

// 5c. fencerun's own failure to start the command (out of processes, memory or descriptors) is not the
// command's: exit 70, nothing run, the lock released at once, whichever way the command is started.
TEST_F(SafetyTest, FailureToStartTheCommandExits70AndReleases) {
  if (::access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "strace is not installed";
  const std::vector<std::vector<std::string>> faults = {
      {"-e", "trace=clone3", "-e", "inject=clone3:error=EAGAIN:when=1"},
      {"-e", "trace=clone3", "-e", "inject=clone3:error=ENOMEM:when=1"},
      {"-e", "trace=clone3,vfork", "-e", "inject=clone3:error=ENOSYS:when=1", "-e", "inject=vfork:error=EAGAIN"},
  };
  for (const auto& fault : faults) {
    SCOPED_TRACE(fault.back());
    auto r = run_program(under_strace(fault, "nofork", "echo ran > ran"), spawn_options(), 30s);
    EXPECT_EQ(r.exit_code, 70) << r;
    EXPECT_NE(r.err.find("the command was not run"), std::string::npos) << r;
    EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command ran";
    EXPECT_FALSE(redis().exists(lock_key("nofork"))) << "the lock was left held";
    EXPECT_LT(r.elapsed, 5s) << r;
  }
}

// The same with a real limit: a pids cgroup (v1 or v2) that lets fencerun start its watchdog but
// not the command.
TEST_F(SafetyTest, PidsLimitThatLeavesNoRoomForTheCommandExits70) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a pids cgroup";
  std::filesystem::path pids;
  for (const char* root : {"/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    std::error_code ec;
    if (std::filesystem::exists(std::string(root) + "/cgroup.procs", ec) &&
        (std::string(root).ends_with("pids") ||
         read_file(std::string(root) + "/cgroup.subtree_control").value_or("").find("pids") != std::string::npos)) {
      pids = std::filesystem::path(root) / ("fencerun-test-pids-" + std::to_string(::getpid()));
      break;
    }
  }
  if (pids.empty() || ::mkdir(pids.c_str(), 0755) != 0) GTEST_SKIP() << "no pids controller to limit with here";
  struct Remove {
    std::filesystem::path p;
    ~Remove() { ::rmdir(p.c_str()); }
  } remove{pids};
  // fencerun (the shell execs it) and its watchdog: 2. The command would be the third.
  std::ofstream(pids / "pids.max") << "2\n";
  const std::string inner = "echo $$ > " + (pids / "cgroup.procs").string() + " && exec " + shell_quote(fencerun_binary()) +
                            " -r " + redis().url() + " pidsmax -- sh -c 'echo ran > ran'";
  auto r = run_program({"sh", "-c", inner}, spawn_options(), 30s);
  EXPECT_EQ(r.exit_code, 70) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command ran";
  EXPECT_FALSE(redis().exists(lock_key("pidsmax"))) << "the lock was left held";
  wait_until([&] { return read_file(pids / "cgroup.procs").value_or("").empty(); }, 3s);
}

TEST_F(SafetyTest, CommandThatLeavesItsGroupIsStoppedThroughItsPid) {
  auto p = start(sh_args("leaver", "exec perl -e 'setpgrp(0,0); open F, \">pid\"; print F \"$$\\n\"; close F; sleep 1000'",
                         {"--ttl", "2s", "-vv"}),
                 {{"FENCERUN_CGROUP", "off"}});
  pid_t pid = wait_pid("pid");
  ASSERT_TRUE(wait_until([&] { return process_group(pid) == pid; }, 3s));
  EXPECT_NE(p->err().find("containment: process group"), std::string::npos) << p->err();
  redis().cmd({"DEL", lock_key("leaver")});
  EXPECT_EQ(p->wait_for_exit(10s), 124) << p->result();
  EXPECT_TRUE(wait_dead(pid, 2s));
}

// 6. An inherited "ignore" of SIGCHLD must not hide the command's exit.
TEST_F(SafetyTest, InheritedIgnoredSigchldDoesNotHangFencerun) {
  // bash's trap '' sets SIG_IGN (dash keeps SIGCHLD for itself).
  std::string inner = shell_quote(fencerun_binary()) + " -r " + redis().url() + " chld -- grep SigIgn /proc/self/status";
  auto r = run_program({"bash", "-c", "trap '' CHLD; exec " + inner}, spawn_options(), 15s);
  EXPECT_FALSE(r.timed_out) << "fencerun never noticed the command's exit\n" << r;
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_FALSE(redis().exists(lock_key("chld")));
  // The command gets the disposition it would have had without fencerun.
  auto colon = r.out.find(':');
  ASSERT_NE(colon, std::string::npos) << r;
  unsigned long long mask = std::stoull(trim(r.out.substr(colon + 1)), nullptr, 16);
  EXPECT_TRUE(mask & (1ULL << (SIGCHLD - 1))) << r.out;
}

// 7. Started with fds 0-2 closed: logs and the watchdog's pipe never land on the Redis socket.
TEST_F(SafetyTest, ClosedStdioRunReleasesCleanly) {
  std::string inner = shell_quote(fencerun_binary());
  for (auto& a : sh_args("closed", "echo hello", {"-vv"})) inner += " " + shell_quote(a);
  auto r = run_program({"sh", "-c", "exec " + inner + " <&- >&- 2>&-"}, spawn_options(), 15s);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_FALSE(redis().exists(lock_key("closed"))) << "the release went wrong";
}

TEST_F(SafetyTest, ClosedStdioKilledFencerunStillTakesTheJobDown) {
  write_script("job.sh", "echo $$ > pid; sleep 1000 & echo $! > gpid; wait\n");
  std::string inner = shell_quote(fencerun_binary()) + " -r " + redis().url() + " closedkill -- sh job.sh";
  auto outer = std::make_unique<Process>(std::vector<std::string>{"sh", "-c", "exec " + inner + " <&- >&- 2>&-"},
                                         spawn_options());
  pid_t pid = wait_pid("pid");
  pid_t gpid = wait_pid("gpid");
  outer->signal(SIGKILL);  // outer exec'd fencerun: this is fencerun
  EXPECT_TRUE(wait_dead(pid, 3s));
  EXPECT_TRUE(wait_dead(gpid, 3s)) << "the job outlived a SIGKILLed fencerun started without stdio";
}

// 8. Signals nobody expects: forwarded to the command while it runs; ending the wait while waiting.
TEST_F(SafetyTest, UnexpectedSignalsAreForwardedNotFatal) {
  for (int signo : {SIGALRM, SIGPWR, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGSTKFLT, SIGRTMIN + 1}) {
    std::filesystem::remove(file("got"));
    std::filesystem::remove(file("pid"));
    std::string n = std::to_string(signo);
    auto p = start(sh_args("sig", "trap 'echo " + n + " > got; exit 7' " + n +
                                      "; echo $$ > pid; while :; do sleep 0.02; done"));
    wait_pid("pid");
    ASSERT_TRUE(p->signal(signo));
    auto code = p->wait_for_exit(10s);
    EXPECT_EQ(code, 7) << "signal " << signo << ": " << p->result();
    EXPECT_EQ(read_file(file("got")).value_or(""), n + "\n") << "signal " << signo;
    EXPECT_TRUE(lock_gone("sig")) << "signal " << signo << " left the lock held";
  }
}

TEST_F(SafetyTest, UnexpectedSignalEndsTheWaitHoldingNothing) {
  auto holder = start(sh_args("waited", kHoldUntilGo));
  wait_pid("pid");
  auto waiter = start(sh_args("waited", "echo ran > ran", {"--wait", "60s", "--fair"}));
  ASSERT_TRUE(wait_until([&] { return redis().exists("fencerun:{waited}:queue"); }, 5s));
  ASSERT_TRUE(waiter->signal(SIGALRM));
  EXPECT_EQ(waiter->wait_for_exit(5s), 128 + SIGALRM) << waiter->result();
  // It ended the wait itself (rather than being killed by the signal): its place in the queue is gone.
  auto queued = redis().cmd({"ZCARD", "fencerun:{waited}:queue"});
  EXPECT_EQ(queued.integer, 0) << "the waiter died without leaving the queue";
  touch("go");
  EXPECT_EQ(holder->wait_for_exit(10s), 0);
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_FALSE(redis().exists(lock_key("waited")));
}

// 9. A command stopped by job control still runs its handler in the grace time (the lease running
// short: the server frozen, renewals fail until the stop point).
TEST_F(SafetyTest, StoppedCommandGetsContinuedAfterTheKillSignal) {
  auto p = start(sh_args("contd", "trap 'echo term > got_term; exit 0' TERM; echo $$ > pid; kill -STOP $$; sleep 1000",
                         {"--ttl", "3s", "--grace", "500ms", "--timeout", "500ms"}));
  pid_t pid = wait_pid("pid");
  ASSERT_TRUE(wait_until([&] { return process_state(pid) == 'T'; }, 3s));
  redis().freeze();
  EXPECT_EQ(p->wait_for_exit(10s), 124) << p->result();
  redis().thaw();
  EXPECT_EQ(read_file(file("got_term")).value_or(""), "term\n") << "the TERM handler never ran";
}

// 11. A connection reset after the acquire ran on the server: the lock is cleaned up at once.
TEST_F(SafetyTest, ResetAfterAcquireLeavesNoLockBehind) {
  TcpProxy proxy(redis().port());
  const std::string url = "redis://127.0.0.1:" + std::to_string(proxy.port());
  // A first run loads the scripts, so that the request that is reset is the acquire itself (not a
  // NOSCRIPT answer that ran nothing).
  ASSERT_EQ(run({"-r", url, "warm-up", "--", "true"}).exit_code, 0);
  proxy.set_mode(TcpProxy::Mode::reset_after_request, 0ms, 1);
  auto r = run({"-r", url, "--ttl", "30s", "reset", "--", "sh", "-c", "echo ran > ran"});
  EXPECT_EQ(proxy.resets(), 1);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_FALSE(redis().exists(lock_key("reset"))) << "the lock set by the lost request stays for its TTL";
}

// 12b. A wait survives a server that is down for part of it.
TEST_F(SafetyTest, WaitRidesOutARedisRestart) {
  redis().stop();
  auto p = start(sh_args("restart", "echo ran > ran", {"--wait", "20s"}));
  std::this_thread::sleep_for(700ms);  // fencerun meets a refused connection first
  redis().start();
  EXPECT_EQ(p->wait_for_exit(20s), 0) << p->result();
  EXPECT_TRUE(std::filesystem::exists(file("ran")));
  EXPECT_NE(p->err().find("trying again"), std::string::npos) << p->err();
}

TEST_F(SafetyTest, WaitThatEndsOnConnectionErrorsExitsUnavailable) {
  int port = unused_port();
  auto r = run({"-r", "redis://127.0.0.1:" + std::to_string(port), "--wait", "1s", "down", "--", "true"});
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_GE(r.elapsed, 900ms) << r;
}

// 13. A lease lost between the last renewal and the command's exit is reported.
TEST_F(SafetyTest, LeaseLostBeforeTheCommandExitsIsReported) {
  auto metrics = file("metrics.prom").string();
  auto r = run(sh_args("silent", redis_cli() + " DEL " + lock_key("silent") + " > /dev/null; exit 0",
                       {"--metrics-file", metrics}));
  EXPECT_EQ(r.exit_code, 124) << r;
  EXPECT_NE(r.err.find("lease was lost"), std::string::npos) << r;
  auto text = read_file(metrics).value_or("");
  EXPECT_NE(text.find("fencerun_last_lease_lost 1"), std::string::npos) << text;
}

}  // namespace
}  // namespace fencerun::test
