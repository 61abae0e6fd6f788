#pragma once
// Subreaper: while it lives, orphaned descendants of this test process are re-parented to it instead
// of init, so a test can reap them, see exactly how they ended, and leave no zombie behind.
#include <sys/prctl.h>
#include <sys/wait.h>

#include <chrono>
#include <optional>
#include <thread>

namespace fencerun::test {

class Subreaper {
 public:
  Subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }
  ~Subreaper() {
    reap_all();
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }
  Subreaper(const Subreaper&) = delete;
  Subreaper& operator=(const Subreaper&) = delete;

  // Reaps every child that has already ended.
  static void reap_all() {
    int status = 0;
    while (::waitpid(-1, &status, WNOHANG) > 0) {
    }
  }
};

// The wait status of `pid` once it ends, or nullopt if it has not ended (or has not become a child of
// this process: an orphan is re-parented only once every process between us has gone) by `timeout`.
inline std::optional<int> wait_for_end(pid_t pid, std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    if (std::chrono::steady_clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace fencerun::test
