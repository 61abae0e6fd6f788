#pragma once
// Child processes for tests: fork/exec with prepared argv/envp, stdout and stderr captured to files,
// waiting by polling with deadlines. The fencerun binary under test comes from FENCERUN_BINARY.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/util.hpp"

namespace fencerun::test {

// Environment changes for a child: value set, or nullopt to remove the variable.
using EnvList = std::vector<std::pair<std::string, std::optional<std::string>>>;

struct SpawnOptions {
  EnvList env;                                    // applied after the inherited environment
  std::optional<std::filesystem::path> stdin_file;  // default /dev/null
  std::optional<std::filesystem::path> cwd;
  // Remove FENCERUN_*, REDIS_URL and REDISCLI_AUTH inherited from the test's own environment so
  // that the machine's settings cannot leak into a test. Variables in `env` are applied after.
  bool scrub_env = true;
  // SIGKILL the child if the thread that forked it ends (PR_SET_PDEATHSIG): a crashed or killed
  // test binary leaves no server or fencerun behind. Fork from a thread that outlives the child.
  bool die_with_parent = true;
};

struct RunResult {
  int exit_code = -1;  // exit status, or 128+N when killed by signal N
  std::string out;
  std::string err;
  std::chrono::milliseconds elapsed{0};
  bool timed_out = false;  // the deadline passed; the process was SIGKILLed
  pid_t pid = -1;

  std::string describe() const;  // exit code, timing and both streams, for assertion messages
};

std::ostream& operator<<(std::ostream& os, const RunResult& r);

class Process {
 public:
  // Starts argv[0] (looked up in PATH when it has no slash). Throws when exec fails.
  Process(std::vector<std::string> argv, SpawnOptions opts = {});
  ~Process();  // SIGKILL and reap when still running
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  Clock::time_point started_at() const { return started_; }

  bool running();                                   // reaps when it has exited
  std::optional<int> wait_for_exit(Clock::duration timeout);  // exit code, or nullopt on timeout
  std::optional<int> exit_code() const { return exit_code_; }
  Clock::time_point exited_at() const { return exited_; }
  bool signal(int sig);  // kill(pid, sig) while it has not been reaped
  void kill_and_reap();

  std::string out() const;
  std::string err() const;
  // Result so far (exit_code -1 while still running).
  RunResult result() const;

 private:
  bool try_reap();

  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  Clock::time_point started_;
  Clock::time_point exited_;
  std::unique_ptr<TempDir> io_dir_;
};

// fencerun under test, started with `args` after the binary name.
class FencerunProcess : public Process {
 public:
  explicit FencerunProcess(std::vector<std::string> args, SpawnOptions opts = {});
};

const char* fencerun_binary();

// Runs fencerun to completion (SIGKILL after `timeout`, then timed_out is set).
RunResult run_fencerun(std::vector<std::string> args, SpawnOptions opts,
                       Clock::duration timeout = 30s);
RunResult run_fencerun(std::vector<std::string> args, EnvList env = {},
                       Clock::duration timeout = 30s);

// Any program, same conventions.
RunResult run_program(std::vector<std::string> argv, SpawnOptions opts = {},
                      Clock::duration timeout = 30s);

}  // namespace fencerun::test
