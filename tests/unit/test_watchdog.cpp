#include <gtest/gtest.h>

#include <linux/kcmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "supervisor/spawn.hpp"
#include "supervisor/watchdog.hpp"
#include "subreaper.hpp"

using fencerun::supervisor::spawn;
using fencerun::test::Subreaper;
using fencerun::test::wait_for_end;
using fencerun::supervisor::SpawnRequest;
using fencerun::supervisor::Watchdog;
using fencerun::supervisor::WatchdogStart;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Started in a throwaway parent process: a watchdog, and a command whose shell leaves a background
// grandchild in the command's group. The grandchild has no parent-death signal, so only the watchdog
// can take it down when the parent dies.
struct Scene {
  pid_t parent = -1;   // stands in for fencerun
  pid_t group = -1;    // the command's process group
  pid_t orphan = -1;   // the background grandchild
};

// moved: the parent waits until its cloned watchdog has moved into a memory of its own.
Scene start_scene(bool disarm, WatchdogStart how, bool moved = false) {
  std::string pattern = (fs::temp_directory_path() / "fencerun-unit.XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) return {};
  fs::path dir = pattern;
  fs::path orphan_file = dir / "orphan";

  int fds[2];
  if (::pipe(fds) != 0) return {};
  pid_t parent = ::fork();
  if (parent < 0) return {};
  if (parent == 0) {
    ::close(fds[0]);
    fencerun::supervisor::set_watchdog_start(how);
    if (moved) fencerun::supervisor::set_watchdog_detach_delay(std::chrono::milliseconds(20));
    Watchdog watchdog;
    if (moved) {
      pid_t first = watchdog.pid();
      for (int i = 0; i < 500 && watchdog.pid() == first; ++i) ::usleep(10'000);
      if (watchdog.pid() == first) ::_exit(3);
    }
    SpawnRequest request;
    request.argv = {"/bin/sh", "-c", "sleep 30 & echo $! > \"$0\"; wait", orphan_file.string()};
    request.env = {"PATH=/usr/bin:/bin"};
    sigemptyset(&request.mask);
    auto pid = spawn(request);
    pid_t group = pid ? *pid : -1;
    if (pid) watchdog.guard(*pid);
    if (disarm) watchdog.disarm();
    if (::write(fds[1], &group, sizeof group) != sizeof group) ::_exit(2);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  Scene scene;
  scene.parent = parent;
  if (::read(fds[0], &scene.group, sizeof scene.group) != sizeof scene.group) scene.group = -1;
  ::close(fds[0]);
  for (int i = 0; i < 500 && scene.orphan <= 0; ++i) {
    std::string text = read_file(orphan_file);
    if (!text.empty() && text.back() == '\n') scene.orphan = std::atoi(text.c_str());
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return scene;
}

void kill_parent(const Scene& scene) {
  ::kill(scene.parent, SIGKILL);
  int status = 0;
  ::waitpid(scene.parent, &status, 0);
}

// How the watchdogs of one test start, put back to the defaults (clone, moving after 100 ms) when the
// test ends, however it ends.
struct StartSettings {
  StartSettings(WatchdogStart how, std::chrono::milliseconds detach_delay) {
    fencerun::supervisor::set_watchdog_start(how);
    fencerun::supervisor::set_watchdog_detach_delay(detach_delay);
  }
  ~StartSettings() {
    fencerun::supervisor::set_watchdog_start(WatchdogStart::clone);
    fencerun::supervisor::set_watchdog_detach_delay(std::chrono::milliseconds(100));
  }
  StartSettings(const StartSettings&) = delete;
  StartSettings& operator=(const StartSettings&) = delete;
};

// Whether `a` and `b` share one memory (kcmp(2): 0 same, > 0 different, < 0 cannot tell).
long same_memory(pid_t a, pid_t b) { return ::syscall(SYS_kcmp, a, b, KCMP_VM, 0, 0); }
bool kcmp_unavailable(long result) { return result < 0 && (errno == ENOSYS || errno == EPERM); }

// A disarmed watchdog exits 0 (by itself: it is waited for here).
void expect_quiet_exit(pid_t pid) {
  auto status = wait_for_end(pid, std::chrono::seconds(5));
  ASSERT_TRUE(status.has_value()) << "watchdog " << pid << " did not exit";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

class WatchdogStarts : public ::testing::TestWithParam<WatchdogStart> {};

std::string start_name(const ::testing::TestParamInfo<WatchdogStart>& info) {
  return info.param == WatchdogStart::clone ? "clone" : "fork";
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(watchdog, WatchdogStarts, ::testing::Values(WatchdogStart::clone, WatchdogStart::fork),
                         start_name);

TEST_P(WatchdogStarts, kills_the_whole_group_when_its_parent_dies) {
  Subreaper reaper;  // the orphan comes back to this process, so its end can be observed exactly
  Scene scene = start_scene(false, GetParam());
  ASSERT_GT(scene.group, 0);
  ASSERT_GT(scene.orphan, 0);
  ASSERT_EQ(::getpgid(scene.orphan), scene.group);

  kill_parent(scene);
  auto status = wait_for_end(scene.orphan, std::chrono::seconds(5));
  if (!status) ::kill(-scene.group, SIGKILL);
  ASSERT_TRUE(status.has_value()) << "a process of the command's group outlived fencerun";
  ASSERT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGKILL);
}

TEST_P(WatchdogStarts, leaves_the_group_alone_once_disarmed) {
  // The control for the test above: without an armed watchdog the grandchild survives its parent.
  Subreaper reaper;
  Scene scene = start_scene(true, GetParam());
  ASSERT_GT(scene.group, 0);
  ASSERT_GT(scene.orphan, 0);
  kill_parent(scene);
  EXPECT_EQ(wait_for_end(scene.orphan, std::chrono::milliseconds(300)), std::nullopt);
  ::kill(-scene.group, SIGKILL);
  auto status = wait_for_end(scene.orphan, std::chrono::seconds(5));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WTERMSIG(*status), SIGKILL);
}

// The cheap start is the one used: a cloned watchdog shares its parent's memory (no page is copied),
// a forked one does not.
TEST_P(WatchdogStarts, shares_the_parents_memory_only_when_cloned) {
  StartSettings settings(GetParam(), std::chrono::hours(1));  // it must not move meanwhile
  Watchdog watchdog;
  const pid_t watchdog_pid = watchdog.pid();
  const long same = same_memory(::getpid(), watchdog_pid);
  watchdog.disarm();
  expect_quiet_exit(watchdog_pid);
  if (kcmp_unavailable(same)) GTEST_SKIP() << "kcmp(2) is not available here";
  if (GetParam() == WatchdogStart::clone) EXPECT_EQ(same, 0) << "the watchdog has a memory of its own";
  else EXPECT_GT(same, 0);
}

// A cloned watchdog runs on the thread-local storage of the thread that started it: a libc call in
// it that fails (its read of an empty pipe fails with EAGAIN after every message) would write that
// thread's errno. It makes only raw system calls, so errno stays what this thread set.
TEST_P(WatchdogStarts, never_writes_the_starting_threads_errno) {
  StartSettings settings(GetParam(), std::chrono::hours(1));  // it shares the memory throughout
  Watchdog watchdog;
  const pid_t watchdog_pid = watchdog.pid();
  int changed = 0;
  for (int i = 0; i < 200; ++i) {
    auto later = fencerun::BootClock::now() + std::chrono::hours(1);
    watchdog.update(later, later);  // succeeds: leaves errno alone
    errno = 4242;
    timespec pause{0, 500'000};
    ::nanosleep(&pause, nullptr);  // succeeds: leaves errno alone
    if (errno != 4242) ++changed;
  }
  watchdog.disarm();
  expect_quiet_exit(watchdog_pid);
  EXPECT_EQ(changed, 0) << "errno changed under this thread while the watchdog ran";
}

// The OOM killer kills every process sharing its victim's memory: once the job has run a while, a
// cloned watchdog forks itself into a memory of its own, the copy carries on under a new pid, and
// pid() follows it.
TEST(watchdog, moves_into_a_memory_of_its_own_once_the_job_has_run_a_while) {
  Subreaper reaper;  // the copy is re-parented here when the first watchdog exits
  StartSettings settings(WatchdogStart::clone, std::chrono::milliseconds(30));
  Watchdog watchdog;
  const pid_t first = watchdog.pid();
  const long same_first = same_memory(::getpid(), first);
  for (int i = 0; i < 500 && watchdog.pid() == first; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const pid_t moved = watchdog.pid();
  const long same_moved = moved != first ? same_memory(::getpid(), moved) : -1;
  watchdog.disarm();
  expect_quiet_exit(first);
  ASSERT_NE(moved, first) << "the watchdog never moved into a memory of its own";
  expect_quiet_exit(moved);  // it took the disarm
  if (kcmp_unavailable(same_first)) GTEST_SKIP() << "kcmp(2) is not available here";
  EXPECT_EQ(same_first, 0) << "the watchdog did not start in the parent's memory";
  EXPECT_GT(same_moved, 0) << "the moved watchdog still shares the parent's memory";
}

TEST(watchdog, kills_the_whole_group_when_its_parent_dies_after_it_moved) {
  Subreaper reaper;
  Scene scene = start_scene(false, WatchdogStart::clone, true);
  ASSERT_GT(scene.group, 0);
  ASSERT_GT(scene.orphan, 0);
  kill_parent(scene);
  auto status = wait_for_end(scene.orphan, std::chrono::seconds(5));
  if (!status) ::kill(-scene.group, SIGKILL);
  ASSERT_TRUE(status.has_value()) << "a process of the command's group outlived the parent of a moved watchdog";
  EXPECT_EQ(WTERMSIG(*status), SIGKILL);
}

// The watchdog reports, in the page it shares with fencerun, when it sent the stop signal and SIGKILL
// and when it saw the command exit: a fencerun that was stopped meanwhile learns when the job ended,
// not when it woke up. The report survives the watchdog's move into a memory of its own.
TEST_P(WatchdogStarts, reports_when_it_stopped_the_command_and_saw_it_exit) {
  StartSettings settings(GetParam(), std::chrono::milliseconds(20));
  using namespace std::chrono;
  auto boot_ns = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_BOOTTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  };
  Watchdog watchdog;
  SpawnRequest request;
  request.argv = {"/bin/sleep", "30"};
  request.env = {"PATH=/usr/bin:/bin"};
  sigemptyset(&request.mask);
  auto pid = spawn(request);
  ASSERT_TRUE(pid.has_value());
  const auto now = fencerun::BootClock::now();
  const std::int64_t asked_stop = (now + milliseconds(300)).time_since_epoch().count();
  watchdog.guard(*pid, now + milliseconds(300), now + milliseconds(600));
  const auto& report = watchdog.report();
  // Not reaped here: the command stays a zombie, as under a stopped fencerun.
  for (int i = 0; i < 500 && report.kill_sent_ns.load() == 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  const std::int64_t stop = report.stop_sent_ns.load(), exited = report.exited_ns.load(),
                     killed = report.kill_sent_ns.load();
  EXPECT_GE(stop, asked_stop);
  EXPECT_LT(stop, asked_stop + 200'000'000);
  EXPECT_GE(exited, stop) << "the command's exit was not seen after the stop signal";
  EXPECT_LT(exited, stop + 200'000'000) << "the command's exit was seen late";
  EXPECT_GE(killed, asked_stop + 300'000'000);
  EXPECT_LE(killed, boot_ns());
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
  watchdog.disarm();
}
