#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "supervisor/cgroup.hpp"
#include "supervisor/spawn.hpp"
#include "subreaper.hpp"

using fencerun::supervisor::resolve_executable;
using fencerun::supervisor::spawn;
using fencerun::supervisor::SpawnRequest;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "fencerun-unit.XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    m_path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(m_path, ec);
  }
  const fs::path& path() const { return m_path; }

 private:
  fs::path m_path;
};

void write_file(const fs::path& path, const std::string& text, fs::perms perms) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
  fs::permissions(path, perms);
}

constexpr auto k_exec = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec;
constexpr auto k_no_exec = fs::perms::owner_read | fs::perms::owner_write;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split_nul(const std::string& text) {
  std::vector<std::string> out;
  std::string::size_type start = 0;
  while (start < text.size()) {
    auto end = text.find('\0', start);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// A field of /proc/PID/status, e.g. "SigBlk".
std::string status_field(pid_t pid, const std::string& field) {
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(field + ":")) return line.substr(line.find_first_not_of(" \t", field.size() + 1));
  return "";
}

// Waits (bounded) until `pid` runs `exe`, i.e. until its exec has happened. The new program's exe link
// appears before the kernel has set up its arguments (spawn() returns as soon as the old image is
// gone), so its command line must be there too.
bool wait_for_exec(pid_t pid, const std::string& exe) {
  for (int i = 0; i < 500; ++i) {
    std::error_code ec;
    auto target = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
    if (!ec && target == fs::canonical(exe) && !read_file("/proc/" + std::to_string(pid) + "/cmdline").empty())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int kill_and_reap(pid_t pid) {
  ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

SpawnRequest sleeper(std::vector<std::string> env = {"PATH=/usr/bin:/bin"}) {
  SpawnRequest request;
  request.argv = {"sleep", "30"};
  request.env = std::move(env);
  sigemptyset(&request.mask);
  return request;
}

}  // namespace

// resolve_executable: the PATH search of execvp(3).

TEST(resolve_executable, finds_a_command_in_a_later_path_entry) {
  TempDir t;
  write_file(t.path() / "b" / "tool", "#!/bin/sh\n", k_exec);
  fs::create_directories(t.path() / "a");
  std::string path = (t.path() / "a").string() + ":" + (t.path() / "b").string();
  EXPECT_EQ(resolve_executable("tool", path), (t.path() / "b" / "tool").string());
}

TEST(resolve_executable, takes_the_first_match) {
  TempDir t;
  write_file(t.path() / "a" / "tool", "#!/bin/sh\n", k_exec);
  write_file(t.path() / "b" / "tool", "#!/bin/sh\n", k_exec);
  std::string path = (t.path() / "a").string() + ":" + (t.path() / "b").string();
  EXPECT_EQ(resolve_executable("tool", path), (t.path() / "a" / "tool").string());
}

TEST(resolve_executable, skips_files_that_are_not_executable) {
  TempDir t;
  write_file(t.path() / "a" / "tool", "data\n", k_no_exec);
  write_file(t.path() / "b" / "tool", "#!/bin/sh\n", k_exec);
  std::string path = (t.path() / "a").string() + ":" + (t.path() / "b").string();
  EXPECT_EQ(resolve_executable("tool", path), (t.path() / "b" / "tool").string());
}

TEST(resolve_executable, reports_126_for_a_command_found_but_not_executable) {
  TempDir t;
  write_file(t.path() / "a" / "tool", "data\n", k_no_exec);
  auto r = resolve_executable("tool", (t.path() / "a").string() + ":/nonexistent");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().exit_code, 126);
  EXPECT_EQ(r.error().message, "tool: Permission denied");
}

TEST(resolve_executable, reports_126_for_a_directory) {
  TempDir t;
  fs::create_directories(t.path() / "a" / "tool");
  auto r = resolve_executable("tool", (t.path() / "a").string());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().exit_code, 126);
  EXPECT_EQ(r.error().message, "tool: Is a directory");
}

TEST(resolve_executable, reports_126_for_a_directory_given_by_path) {
  TempDir t;
  auto r = resolve_executable(t.path().string(), "/bin");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().exit_code, 126);
  EXPECT_EQ(r.error().message, t.path().string() + ": Is a directory");
}

TEST(resolve_executable, reports_127_for_a_command_not_found) {
  TempDir t;
  auto r = resolve_executable("fencerun-no-such-tool", t.path().string() + ":/nonexistent");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().exit_code, 127);
  EXPECT_EQ(r.error().message, "fencerun-no-such-tool: command not found");
}

TEST(resolve_executable, uses_a_name_with_a_slash_as_it_is) {
  EXPECT_EQ(resolve_executable("/bin/sh", "/nonexistent"), "/bin/sh");
  TempDir t;
  write_file(t.path() / "tool", "#!/bin/sh\n", k_exec);
  EXPECT_EQ(resolve_executable((t.path() / "tool").string(), ""), (t.path() / "tool").string());
}

TEST(resolve_executable, reports_127_for_a_missing_path) {
  TempDir t;
  std::string missing = (t.path() / "missing").string();
  auto r = resolve_executable(missing, "/bin");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().exit_code, 127);
  EXPECT_EQ(r.error().message, missing + ": No such file or directory");
}

TEST(resolve_executable, reports_126_for_a_path_that_is_not_executable) {
  TempDir t;
  write_file(t.path() / "data", "x\n", k_no_exec);
  std::string data = (t.path() / "data").string();
  auto r = resolve_executable(data, "/bin");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().exit_code, 126);
  EXPECT_EQ(r.error().message, data + ": Permission denied");
}

TEST(resolve_executable, reads_an_empty_path_entry_as_the_current_directory) {
  TempDir t;
  write_file(t.path() / "tool", "#!/bin/sh\n", k_exec);
  auto cwd = fs::current_path();
  fs::current_path(t.path());
  auto r = resolve_executable("tool", "/nonexistent::/also-nonexistent");
  fs::current_path(cwd);
  EXPECT_EQ(r, "./tool");
}

// spawn: a real child in its own process group, with exactly the given argv, environment and mask.

TEST(spawn, starts_the_command_in_its_own_process_group) {
  auto pid = spawn(sleeper());
  ASSERT_TRUE(pid.has_value()) << pid.error().message;
  ASSERT_TRUE(wait_for_exec(*pid, "/bin/sleep"));
  EXPECT_EQ(::getpgid(*pid), *pid);
  EXPECT_NE(::getpgid(*pid), ::getpgrp());
  int status = kill_and_reap(*pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

TEST(spawn, passes_argv_as_written) {
  SpawnRequest request = sleeper();
  request.argv = {"sleep", "29", "1"};  // argv[0] stays "sleep", not the resolved /usr/bin/sleep
  auto pid = spawn(request);
  ASSERT_TRUE(pid.has_value()) << pid.error().message;
  ASSERT_TRUE(wait_for_exec(*pid, "/bin/sleep"));
  EXPECT_EQ(split_nul(read_file("/proc/" + std::to_string(*pid) + "/cmdline")),
            (std::vector<std::string>{"sleep", "29", "1"}));
  kill_and_reap(*pid);
}

TEST(spawn, gives_the_command_exactly_the_given_environment) {
  auto pid = spawn(sleeper({"PATH=/usr/bin:/bin", "FENCERUN_TOKEN=41", "EMPTY=", "SPACED=a b"}));
  ASSERT_TRUE(pid.has_value()) << pid.error().message;
  ASSERT_TRUE(wait_for_exec(*pid, "/bin/sleep"));
  EXPECT_EQ(split_nul(read_file("/proc/" + std::to_string(*pid) + "/environ")),
            (std::vector<std::string>{"PATH=/usr/bin:/bin", "FENCERUN_TOKEN=41", "EMPTY=", "SPACED=a b"}));
  kill_and_reap(*pid);
}

TEST(spawn, gives_the_command_the_requested_signal_mask) {
  // The parent blocks TERM and CHLD (as fencerun does); the child must get the mask it is given.
  sigset_t blocked, old;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &blocked, &old);

  SpawnRequest clean = sleeper();
  auto a = spawn(clean);
  SpawnRequest usr1 = sleeper();
  sigaddset(&usr1.mask, SIGUSR1);
  auto b = spawn(usr1);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);

  ASSERT_TRUE(a.has_value()) << a.error().message;
  ASSERT_TRUE(b.has_value()) << b.error().message;
  ASSERT_TRUE(wait_for_exec(*a, "/bin/sleep"));
  ASSERT_TRUE(wait_for_exec(*b, "/bin/sleep"));
  EXPECT_EQ(status_field(*a, "SigBlk"), "0000000000000000");
  EXPECT_EQ(status_field(*b, "SigBlk"), "0000000000000200");  // bit 10 - 1: SIGUSR1
  kill_and_reap(*a);
  kill_and_reap(*b);
}

TEST(spawn, leaves_default_dispositions_to_the_command) {
  auto pid = spawn(sleeper());
  ASSERT_TRUE(pid.has_value()) << pid.error().message;
  ASSERT_TRUE(wait_for_exec(*pid, "/bin/sleep"));
  EXPECT_EQ(status_field(*pid, "SigIgn"), "0000000000000000");
  // A plain TERM to the group ends it: nothing is blocked or ignored.
  ::kill(-*pid, SIGTERM);
  int status = 0;
  while (::waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

TEST(spawn, reports_127_for_a_command_not_found) {
  SpawnRequest request = sleeper();
  request.argv = {"fencerun-no-such-command"};
  auto pid = spawn(request);
  ASSERT_FALSE(pid.has_value());
  EXPECT_EQ(pid.error().exit_code, 127);
  EXPECT_EQ(pid.error().message, "fencerun-no-such-command: command not found");
}

TEST(spawn, reports_126_for_a_command_that_is_not_executable) {
  TempDir t;
  write_file(t.path() / "data", "x\n", k_no_exec);
  SpawnRequest request = sleeper();
  request.argv = {(t.path() / "data").string()};
  auto pid = spawn(request);
  ASSERT_FALSE(pid.has_value());
  EXPECT_EQ(pid.error().exit_code, 126);
  EXPECT_EQ(pid.error().message, (t.path() / "data").string() + ": Permission denied");
}

TEST(spawn, kills_the_command_when_its_parent_dies) {
  // An intermediate process spawns the command, reports its pid, and is then SIGKILLed. The orphaned
  // command comes back to this process (subreaper), so its end can be observed exactly.
  fencerun::test::Subreaper reaper;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t middle = ::fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    ::close(fds[0]);
    auto pid = spawn(sleeper());
    pid_t child = pid ? *pid : -1;
    if (::write(fds[1], &child, sizeof child) != sizeof child) ::_exit(2);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  pid_t child = -1;
  ASSERT_EQ(::read(fds[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  ::close(fds[0]);
  ASSERT_GT(child, 0);
  ASSERT_TRUE(wait_for_exec(child, "/bin/sleep"));

  ::kill(middle, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(middle, &status, 0), middle);

  auto end = fencerun::test::wait_for_end(child, std::chrono::seconds(5));
  if (!end) ::kill(child, SIGKILL);
  ASSERT_TRUE(end.has_value()) << "the command outlived its parent";
  ASSERT_TRUE(WIFSIGNALED(*end));
  EXPECT_EQ(WTERMSIG(*end), SIGKILL);
}

// An executable without "#!" that is no binary runs with /bin/sh, as execvp(3), env(1), timeout(1)
// and flock(1) run it, with its arguments.
TEST(spawn, runs_a_script_without_a_shebang_with_bin_sh) {
  fencerun::test::Subreaper reaper;
  TempDir t;
  const fs::path out = t.path() / "out";
  write_file(t.path() / "noshebang", "echo \"ran $0 $1 $2\" > '" + out.string() + "'\n", k_exec);
  SpawnRequest request = sleeper();
  request.argv = {(t.path() / "noshebang").string(), "a", "b c"};
  auto pid = spawn(request);
  ASSERT_TRUE(pid.has_value()) << pid.error().message;
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(read_file(out), "ran " + (t.path() / "noshebang").string() + " a b c\n");
}

// A script whose interpreter is missing: the error names its "#!" line, not the script alone.
TEST(spawn, names_the_missing_interpreter_of_a_script) {
  TempDir t;
  write_file(t.path() / "bad", "#!/nonexistent/interpreter -x\necho hi\n", k_exec);
  SpawnRequest request = sleeper();
  request.argv = {(t.path() / "bad").string()};
  auto pid = spawn(request);
  ASSERT_FALSE(pid.has_value());
  EXPECT_EQ(pid.error().exit_code, 127);
  EXPECT_EQ(pid.error().message,
            (t.path() / "bad").string() + ": bad interpreter \"#!/nonexistent/interpreter -x\": No such file or directory");
}

// The job's cgroup: started inside it by clone3(CLONE_INTO_CGROUP) when a cgroup directory is given.
TEST(spawn, starts_the_command_inside_the_given_cgroup) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs a writable cgroup v2 hierarchy (root)";
  std::string why;
  auto cg = fencerun::supervisor::JobCgroup::create(why);
  if (!cg) GTEST_SKIP() << why;
  SpawnRequest request = sleeper();
  request.cgroup_fd = cg->dir_fd();
  request.open_cgroup_procs = [&cg] { return cg->open_procs_for_writing(); };
  fencerun::supervisor::SpawnInfo info;
  auto pid = spawn(request, &info);
  ASSERT_TRUE(pid.has_value()) << pid.error().message;
  EXPECT_TRUE(cg->contains(*pid));
  kill_and_reap(*pid);
}
