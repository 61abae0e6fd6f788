#include <gtest/gtest.h>

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "log/log.hpp"
#include "supervisor/signals.hpp"
#include "supervisor/supervisor.hpp"
#include "util/clock.hpp"
#include "util/fd.hpp"

using fencerun::BootClock;
using fencerun::Deadline;
using fencerun::UniqueFd;
using fencerun::supervisor::LeaseWatch;
using fencerun::supervisor::Outcome;
using fencerun::supervisor::SignalChannel;
using fencerun::supervisor::StopPolicy;
using fencerun::supervisor::Supervisor;
using std::chrono::milliseconds;

namespace fencerun::test {
// A scratch directory for one test.
struct TempDirLike {
  std::string path;
  TempDirLike() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fencerun-unit.XXXXXX").string();
    path = ::mkdtemp(pattern.data()) ? pattern : "/tmp";
  }
  ~TempDirLike() {
    std::error_code ec;
    if (path != "/tmp") std::filesystem::remove_all(path, ec);
  }
};
}  // namespace fencerun::test

namespace {

// A lease as the supervisor sees it: a deadline that renewals move, a lost flag and its wake-up fd.
class FakeLease {
 public:
  explicit FakeLease(Deadline deadline) : m_deadline(deadline.time_since_epoch().count()) {}
  // As the keeper does: publish the deadline, then pass it on (to the supervisor's watchdog).
  void set_deadline(Deadline d) {
    m_deadline.store(d.time_since_epoch().count());
    std::lock_guard lock(m_mutex);
    if (m_on_renewed) m_on_renewed(d);
  }
  void on_renewed(std::function<void(Deadline)> f) {
    std::lock_guard lock(m_mutex);
    m_on_renewed = std::move(f);
  }
  Deadline deadline() const { return Deadline(BootClock::duration(m_deadline.load())); }
  void lose() {
    m_lost.store(true);
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(m_wake.get(), &one, sizeof one);
  }
  LeaseWatch watch() {
    return LeaseWatch{[this] { return deadline(); }, [this] { return m_lost.load(); }, m_wake.get(), {}, {}, {}};
  }

 private:
  std::atomic<BootClock::rep> m_deadline;
  std::atomic<bool> m_lost{false};
  std::mutex m_mutex;
  std::function<void(Deadline)> m_on_renewed;
  UniqueFd m_wake{::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
};

// grace 400ms and margin 300ms: the stop signal goes out 700ms before the deadline, SIGKILL 300ms before.
constexpr StopPolicy k_policy{SIGTERM, {milliseconds(400), milliseconds(300)}};

struct Supervised {
  Outcome outcome;
  Deadline started;
};

// `signals` must exist before any helper thread starts, so that every thread inherits its mask (as in
// fencerun, where it is created first): a process-directed signal then always reaches the signalfd.
Supervised supervise(SignalChannel& signals, std::vector<std::string> argv, FakeLease& lease,
                     StopPolicy policy = k_policy) {
  Supervisor supervisor(signals, policy, fencerun::log::Context{"unit", "1"});
  Supervised run{{}, BootClock::now()};
  auto pid = supervisor.start(std::move(argv), {"PATH=/usr/bin:/bin"}, lease.deadline());
  EXPECT_TRUE(pid.has_value()) << (pid ? "" : pid.error().message);
  if (!pid) return run;
  lease.on_renewed([&supervisor](Deadline d) { supervisor.lease_renewed(d); });
  run.outcome = supervisor.supervise(lease.watch());
  lease.on_renewed({});
  return run;
}

std::vector<std::string> sh(const std::string& script) { return {"/bin/sh", "-c", script}; }

class supervisor : public testing::Test {
 protected:
  void SetUp() override { fencerun::log::init(fencerun::log::Level::error, fencerun::log::Format::text); }
  void TearDown() override { fencerun::log::init(fencerun::log::Level::warn, fencerun::log::Format::text); }

  SignalChannel m_signals;
};

}  // namespace

TEST_F(supervisor, returns_the_status_of_a_command_that_ends_in_time) {
  FakeLease lease(BootClock::now() + std::chrono::hours(1));
  Supervised run = supervise(m_signals, sh("exit 3"), lease);
  ASSERT_TRUE(WIFEXITED(run.outcome.wait_status));
  EXPECT_EQ(WEXITSTATUS(run.outcome.wait_status), 3);
  EXPECT_FALSE(run.outcome.stopped_for_lease);
  EXPECT_FALSE(run.outcome.killed);
  EXPECT_TRUE(run.outcome.command_died_at.has_value());
}

TEST_F(supervisor, reports_a_command_killed_by_a_signal_of_its_own) {
  FakeLease lease(BootClock::now() + std::chrono::hours(1));
  Supervised run = supervise(m_signals, sh("kill -SEGV $$"), lease);
  ASSERT_TRUE(WIFSIGNALED(run.outcome.wait_status));
  EXPECT_EQ(WTERMSIG(run.outcome.wait_status), SIGSEGV);
  EXPECT_FALSE(run.outcome.stopped_for_lease);
}

TEST_F(supervisor, stops_the_command_grace_plus_margin_before_the_deadline) {
  Deadline deadline = BootClock::now() + milliseconds(1'500);
  FakeLease lease(deadline);
  Supervised run = supervise(m_signals, {"sleep", "30"}, lease);
  ASSERT_TRUE(WIFSIGNALED(run.outcome.wait_status));
  EXPECT_EQ(WTERMSIG(run.outcome.wait_status), SIGTERM);
  EXPECT_TRUE(run.outcome.stopped_for_lease);
  EXPECT_FALSE(run.outcome.killed);
  ASSERT_TRUE(run.outcome.command_died_at.has_value());
  EXPECT_GE(*run.outcome.command_died_at, deadline - milliseconds(700));
  EXPECT_LT(*run.outcome.command_died_at, deadline);
}

TEST_F(supervisor, sends_the_configured_kill_signal) {
  Deadline deadline = BootClock::now() + milliseconds(1'500);
  FakeLease lease(deadline);
  StopPolicy policy = k_policy;
  policy.kill_signal = SIGUSR1;
  Supervised run = supervise(m_signals, {"sleep", "30"}, lease, policy);
  ASSERT_TRUE(WIFSIGNALED(run.outcome.wait_status));
  EXPECT_EQ(WTERMSIG(run.outcome.wait_status), SIGUSR1);
  EXPECT_TRUE(run.outcome.stopped_for_lease);
}

TEST_F(supervisor, kills_a_command_that_ignores_the_stop_signal_before_the_deadline) {
  Deadline deadline = BootClock::now() + milliseconds(1'500);
  FakeLease lease(deadline);
  Supervised run = supervise(m_signals, sh("trap '' TERM; while :; do sleep 0.1; done"), lease);
  ASSERT_TRUE(WIFSIGNALED(run.outcome.wait_status));
  EXPECT_EQ(WTERMSIG(run.outcome.wait_status), SIGKILL);
  EXPECT_TRUE(run.outcome.stopped_for_lease);
  EXPECT_TRUE(run.outcome.killed);
  ASSERT_TRUE(run.outcome.command_died_at.has_value());
  EXPECT_GE(*run.outcome.command_died_at, deadline - milliseconds(300));
  EXPECT_LT(*run.outcome.command_died_at, deadline);
}

TEST_F(supervisor, kills_a_grandchild_that_ignores_the_stop_signal_before_the_deadline) {
  // The command dies of TERM; its background grandchild ignores TERM and must get SIGKILL in time.
  Deadline deadline = BootClock::now() + milliseconds(1'500);
  FakeLease lease(deadline);
  Supervised run = supervise(m_signals, sh("(trap '' TERM; exec sleep 30) & exec sleep 30"), lease);
  ASSERT_TRUE(WIFSIGNALED(run.outcome.wait_status));
  EXPECT_EQ(WTERMSIG(run.outcome.wait_status), SIGTERM);
  EXPECT_TRUE(run.outcome.killed);
  ASSERT_TRUE(run.outcome.command_died_at.has_value());
  EXPECT_LT(*run.outcome.command_died_at, deadline);
}

TEST_F(supervisor, stops_a_grandchild_of_a_command_that_ignores_the_stop_signal) {
  // The command ignores TERM; its grandchild does not. Both are gone before the deadline.
  Deadline deadline = BootClock::now() + milliseconds(1'500);
  FakeLease lease(deadline);
  Supervised run =
      supervise(m_signals, sh("trap '' TERM; (trap - TERM; exec sleep 30) & while :; do sleep 0.1; done"), lease);
  ASSERT_TRUE(WIFSIGNALED(run.outcome.wait_status));
  EXPECT_EQ(WTERMSIG(run.outcome.wait_status), SIGKILL);
  EXPECT_TRUE(run.outcome.killed);
  ASSERT_TRUE(run.outcome.command_died_at.has_value());
  EXPECT_LT(*run.outcome.command_died_at, deadline);
}

TEST_F(supervisor, stops_processes_left_in_the_group_after_the_command_exits) {
  FakeLease lease(BootClock::now() + std::chrono::hours(1));
  auto before = BootClock::now();
  Supervised run = supervise(m_signals, sh("sleep 30 & exit 5"), lease);
  ASSERT_TRUE(WIFEXITED(run.outcome.wait_status));
  EXPECT_EQ(WEXITSTATUS(run.outcome.wait_status), 5);
  EXPECT_FALSE(run.outcome.stopped_for_lease);
  EXPECT_FALSE(run.outcome.killed);
  EXPECT_LT(BootClock::now() - before, std::chrono::seconds(10));
}

// A lost lease (the lock gone or another owner's) kills the job at once: SIGKILL, no grace.
TEST_F(supervisor, kills_at_once_when_the_lease_is_already_lost) {
  FakeLease lease(BootClock::now() + std::chrono::hours(1));
  lease.lose();
  auto before = BootClock::now();
  Supervised run = supervise(m_signals, {"sleep", "30"}, lease);
  ASSERT_TRUE(WIFSIGNALED(run.outcome.wait_status));
  EXPECT_EQ(WTERMSIG(run.outcome.wait_status), SIGKILL);
  EXPECT_TRUE(run.outcome.stopped_for_lease);
  EXPECT_TRUE(run.outcome.killed);
  EXPECT_LT(BootClock::now() - before, std::chrono::seconds(5));
}

TEST_F(supervisor, wakes_up_when_the_lease_is_lost_while_the_command_runs) {
  FakeLease lease(BootClock::now() + std::chrono::hours(1));
  std::atomic<BootClock::rep> lost_at{0};
  std::thread loser([&] {
    std::this_thread::sleep_for(milliseconds(300));
    lost_at.store(BootClock::now().time_since_epoch().count());
    lease.lose();
  });
  Supervised run = supervise(m_signals, {"sleep", "30"}, lease);
  loser.join();
  ASSERT_TRUE(WIFSIGNALED(run.outcome.wait_status));
  EXPECT_EQ(WTERMSIG(run.outcome.wait_status), SIGKILL);
  EXPECT_TRUE(run.outcome.stopped_for_lease);
  ASSERT_TRUE(run.outcome.command_died_at.has_value());
  EXPECT_LT(*run.outcome.command_died_at - Deadline(BootClock::duration(lost_at.load())), std::chrono::seconds(2));
}

// A job that ignores the stop signal, under a long grace: a lost lease does not wait for the grace.
TEST_F(supervisor, does_not_wait_for_the_grace_when_the_lease_is_lost) {
  FakeLease lease(BootClock::now() + std::chrono::hours(1));
  std::atomic<BootClock::rep> lost_at{0};
  std::thread loser([&] {
    std::this_thread::sleep_for(milliseconds(300));
    lost_at.store(BootClock::now().time_since_epoch().count());
    lease.lose();
  });
  const StopPolicy long_grace{SIGTERM, {std::chrono::seconds(30), milliseconds(300)}};
  Supervised run = supervise(m_signals, sh("trap '' TERM; sleep 30 & wait; sleep 30"), lease, long_grace);
  loser.join();
  ASSERT_TRUE(WIFSIGNALED(run.outcome.wait_status));
  EXPECT_EQ(WTERMSIG(run.outcome.wait_status), SIGKILL);
  EXPECT_TRUE(run.outcome.stopped_for_lease);
  EXPECT_TRUE(run.outcome.killed);
  ASSERT_TRUE(run.outcome.command_died_at.has_value());
  EXPECT_LT(*run.outcome.command_died_at - Deadline(BootClock::duration(lost_at.load())), std::chrono::seconds(2));
}

// The command's run time: from its start to its end as reaped.
TEST_F(supervisor, measures_how_long_the_command_ran) {
  FakeLease lease(BootClock::now() + std::chrono::hours(1));
  Supervised run = supervise(m_signals, sh("sleep 0.3"), lease);
  ASSERT_TRUE(run.outcome.ran().has_value());
  EXPECT_GE(*run.outcome.ran(), milliseconds(290));
  EXPECT_LT(*run.outcome.ran(), milliseconds(2000));
}

TEST_F(supervisor, follows_a_deadline_that_renewals_move_later) {
  FakeLease lease(BootClock::now() + milliseconds(1'200));
  std::atomic<bool> done{false};
  std::thread renewer([&] {
    while (!done.load()) {
      lease.set_deadline(BootClock::now() + milliseconds(1'200));
      std::this_thread::sleep_for(milliseconds(100));
    }
  });
  Supervised run = supervise(m_signals, sh("sleep 1.5; exit 0"), lease);
  done.store(true);
  renewer.join();
  ASSERT_TRUE(WIFEXITED(run.outcome.wait_status));
  EXPECT_EQ(WEXITSTATUS(run.outcome.wait_status), 0);
  EXPECT_FALSE(run.outcome.stopped_for_lease);
}

TEST_F(supervisor, forwards_signals_to_the_command_group) {
  FakeLease lease(BootClock::now() + std::chrono::hours(1));
  std::thread sender([] {
    std::this_thread::sleep_for(milliseconds(300));
    ::kill(::getpid(), SIGUSR1);
  });
  Supervised run = supervise(m_signals, sh("trap 'exit 42' USR1; while :; do sleep 0.05; done"), lease);
  sender.join();
  ASSERT_TRUE(WIFEXITED(run.outcome.wait_status));
  EXPECT_EQ(WEXITSTATUS(run.outcome.wait_status), 42);
  EXPECT_FALSE(run.outcome.stopped_for_lease);
}

TEST_F(supervisor, reports_a_command_that_cannot_be_found) {
  Supervisor unstarted(m_signals, k_policy, fencerun::log::Context{"unit", "1"});
  auto pid = unstarted.start({"fencerun-no-such-command"}, {"PATH=/usr/bin:/bin"},
                             BootClock::now() + std::chrono::hours(1));
  ASSERT_FALSE(pid.has_value());
  EXPECT_EQ(pid.error().exit_code, 127);
}

TEST_F(supervisor, never_starts_a_command_past_its_stop_point) {
  // 600ms left is inside grace (400ms) + margin (300ms): the command must not run at all.
  fencerun::test::TempDirLike dir;
  Supervisor late(m_signals, k_policy, fencerun::log::Context{"unit", "1"});
  auto pid = late.start(sh("touch " + dir.path + "/ran"), {"PATH=/usr/bin:/bin"},
                        BootClock::now() + milliseconds(600));
  ASSERT_FALSE(pid.has_value());
  EXPECT_TRUE(pid.error().too_late);
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/ran"));
}

TEST_F(supervisor, has_the_watchdog_stop_the_job_when_nobody_supervises_it) {
  // fencerun stopped or starved after start(): supervise() never runs, yet the job must get the kill
  // signal at the stop point and be dead before the deadline.
  Deadline deadline = BootClock::now() + milliseconds(1'500);
  Supervisor frozen(m_signals, k_policy, fencerun::log::Context{"unit", "1"});
  auto pid = frozen.start(sh("trap '' TERM; while :; do sleep 0.05; done"), {"PATH=/usr/bin:/bin"}, deadline);
  ASSERT_TRUE(pid.has_value());
  // Not our child's reaper here: look at /proc until it is a zombie or gone.
  auto dead = [&] {
    std::ifstream status("/proc/" + std::to_string(*pid) + "/status");
    std::string line;
    while (std::getline(status, line))
      if (line.starts_with("State:")) return line.find('Z') != std::string::npos;
    return true;
  };
  while (!dead() && BootClock::now() < deadline + std::chrono::seconds(3))
    std::this_thread::sleep_for(milliseconds(5));
  Deadline died = BootClock::now();
  EXPECT_TRUE(dead());
  EXPECT_LT(died, deadline) << "the job outlived its lease by "
                            << std::chrono::duration_cast<milliseconds>(died - deadline).count() << "ms";
  EXPECT_GE(died, deadline - milliseconds(700));
}

TEST_F(supervisor, kills_the_whole_job_when_dropped_while_it_runs) {
  // An exception between start() and the end of supervise() unwinds through the destructor: every
  // process of the job, the ones that left its process group included, must be dead when it returns.
  fencerun::test::TempDirLike dir;
  std::string pids = dir.path + "/pids";
  pid_t command = -1;
  bool cgroup = false;
  {
    Supervisor dropped(m_signals, k_policy, fencerun::log::Context{"unit", "1"});
    auto pid = dropped.start(sh("sleep 1000 & echo $! >> " + pids + "; setsid sleep 1000 & echo $! >> " + pids +
                                "; echo ready >> " + pids + "; wait"),
                             {"PATH=/usr/bin:/bin"}, BootClock::now() + std::chrono::hours(1));
    ASSERT_TRUE(pid.has_value());
    command = *pid;
    cgroup = dropped.containment().starts_with("cgroup");
    for (int i = 0; i < 500; ++i) {
      std::ifstream in(pids);
      std::stringstream all;
      all << in.rdbuf();
      if (all.str().find("ready") != std::string::npos) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  std::ifstream in(pids);
  std::vector<pid_t> left;
  for (std::string line; std::getline(in, line);)
    if (line != "ready") left.push_back(std::stoi(line));
  ASSERT_EQ(left.size(), 2u);
  // Without a cgroup the setsid child has left the process group and escapes by design (documented):
  // only the group's processes are checked then.
  if (!cgroup) {
    ::kill(left.back(), SIGKILL);
    left.pop_back();
  }
  left.push_back(command);
  for (pid_t p : left) {
    // Gone, or a zombie waiting for its reaper: either way it runs no more.
    std::ifstream status("/proc/" + std::to_string(p) + "/status");
    std::string line, state;
    while (std::getline(status, line))
      if (line.starts_with("State:")) state = line;
    EXPECT_TRUE(state.empty() || state.find('Z') != std::string::npos) << p << " still runs: " << state;
    ::kill(p, SIGKILL);
  }
}

TEST(cgroup_setting, turns_the_cgroup_off_for_off_0_false_and_no_in_any_case) {
  using fencerun::supervisor::cgroup_disabled_by;
  for (const char* v : {"off", "OFF", "Off", "0", "false", "FALSE", "no", "No"}) EXPECT_TRUE(cgroup_disabled_by(v)) << v;
  for (const char* v : {"", "on", "1", "true", "yes", "auto", "offf", "o"}) EXPECT_FALSE(cgroup_disabled_by(v)) << v;
}

// The renewals start at keep_by while the job runs; a job over before then never starts them.
TEST_F(supervisor, starts_the_renewals_at_keep_by_only_if_the_job_still_runs) {
  for (bool long_job : {false, true}) {
    SCOPED_TRACE(long_job ? "a job of 300ms" : "a job over at once");
    FakeLease lease(BootClock::now() + std::chrono::hours(1));
    Supervisor sup(m_signals, k_policy, fencerun::log::Context{"unit", "1"});
    auto pid = sup.start(sh(long_job ? "sleep 0.3" : "true"), {"PATH=/usr/bin:/bin"}, lease.deadline());
    ASSERT_TRUE(pid.has_value());
    const Deadline keep_by = BootClock::now() + milliseconds(100);
    std::optional<Deadline> started;
    LeaseWatch watch = lease.watch();
    const int wake = watch.wake_fd;
    watch.wake_fd = -1;
    watch.start_keeping = [&] {
      started = BootClock::now();
      return wake;
    };
    watch.keep_by = keep_by;
    auto outcome = sup.supervise(watch);
    EXPECT_TRUE(WIFEXITED(outcome.wait_status));
    if (!long_job) {
      EXPECT_FALSE(started.has_value()) << "a short job paid for the renewals";
    } else {
      ASSERT_TRUE(started.has_value()) << "the renewals never started";
      EXPECT_GE(*started, keep_by);
      EXPECT_LT(*started, keep_by + milliseconds(100));
    }
  }
}

// A lease lost after the deferred start is still seen at once (the wake fd returned is polled).
TEST_F(supervisor, hears_of_a_lost_lease_through_the_wake_fd_of_deferred_renewals) {
  FakeLease lease(BootClock::now() + std::chrono::hours(1));
  Supervisor sup(m_signals, k_policy, fencerun::log::Context{"unit", "1"});
  auto pid = sup.start(sh("sleep 30"), {"PATH=/usr/bin:/bin"}, lease.deadline());
  ASSERT_TRUE(pid.has_value());
  LeaseWatch watch = lease.watch();
  const int wake = watch.wake_fd;
  watch.wake_fd = -1;
  std::thread loser;
  watch.start_keeping = [&] {
    loser = std::thread([&lease] {
      std::this_thread::sleep_for(milliseconds(100));
      lease.lose();
    });
    return wake;
  };
  watch.keep_by = BootClock::now() + milliseconds(20);
  const Deadline began = BootClock::now();
  auto outcome = sup.supervise(watch);
  loser.join();
  EXPECT_TRUE(outcome.stopped_for_lease);
  EXPECT_LT(BootClock::now() - began, milliseconds(1500));
}
