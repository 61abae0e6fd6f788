#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "supervisor/exit_status.hpp"

using fencerun::exit_code_for_signal;
using fencerun::exit_code_from_wait_status;

namespace {

// Waits for `pid` and returns its raw wait status.
int reap(pid_t pid) {
  int status = 0;
  pid_t got;
  do {
    got = ::waitpid(pid, &status, 0);
  } while (got < 0 && errno == EINTR);
  EXPECT_EQ(got, pid);
  return status;
}

// A real child that exits with `code`.
int status_of_child_exiting(int code) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(code);
  EXPECT_GT(pid, 0);
  return reap(pid);
}

// A real child that kills itself with `signo` (default disposition, unblocked, no core file).
int status_of_child_killed_by(int signo) {
  pid_t pid = ::fork();
  if (pid == 0) {
    rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::signal(signo, SIG_DFL);
    sigset_t set;
    ::sigemptyset(&set);
    ::sigaddset(&set, signo);
    ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
    ::kill(::getpid(), signo);
    ::_exit(200);  // not reached for a terminating signal
  }
  EXPECT_GT(pid, 0);
  return reap(pid);
}

}  // namespace

TEST(exit_status, passes_through_every_exit_status_of_a_real_child) {
  for (int code = 0; code <= 255; ++code) {
    int status = status_of_child_exiting(code);
    ASSERT_TRUE(WIFEXITED(status)) << code;
    EXPECT_EQ(exit_code_from_wait_status(status), code);
  }
}

TEST(exit_status, passes_through_every_constructed_exit_status) {
  for (int code = 0; code <= 255; ++code) EXPECT_EQ(exit_code_from_wait_status(W_EXITCODE(code, 0)), code);
}

TEST(exit_status, reports_sigterm_as_143) {
  EXPECT_EQ(exit_code_from_wait_status(status_of_child_killed_by(SIGTERM)), 143);
}

TEST(exit_status, reports_sigkill_as_137) {
  EXPECT_EQ(exit_code_from_wait_status(status_of_child_killed_by(SIGKILL)), 137);
}

TEST(exit_status, reports_sigint_as_130) {
  EXPECT_EQ(exit_code_from_wait_status(status_of_child_killed_by(SIGINT)), 130);
}

TEST(exit_status, reports_sigsegv_as_139_without_a_core_dump) {
  int status = status_of_child_killed_by(SIGSEGV);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(WCOREDUMP(status));
  EXPECT_EQ(exit_code_from_wait_status(status), 139);
}

TEST(exit_status, reports_128_plus_n_for_every_terminating_signal) {
  std::vector<int> signals{SIGHUP,  SIGINT,  SIGQUIT, SIGILL,  SIGTRAP, SIGABRT, SIGBUS,    SIGFPE,  SIGKILL, SIGUSR1,
                           SIGSEGV, SIGUSR2, SIGPIPE, SIGALRM, SIGTERM, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGSYS};
  for (int rt = SIGRTMIN; rt <= SIGRTMAX; ++rt) signals.push_back(rt);
  for (int signo : signals) {
    int status = status_of_child_killed_by(signo);
    ASSERT_TRUE(WIFSIGNALED(status)) << signo;
    ASSERT_EQ(WTERMSIG(status), signo);
    EXPECT_EQ(exit_code_from_wait_status(status), 128 + signo) << signo;
  }
}

TEST(exit_status, reports_a_signal_even_when_a_core_was_dumped) {
  EXPECT_EQ(exit_code_from_wait_status(W_EXITCODE(0, SIGSEGV) | WCOREFLAG), 139);
  EXPECT_EQ(exit_code_from_wait_status(W_EXITCODE(0, SIGABRT) | WCOREFLAG), 134);
}

TEST(exit_status, reports_a_signal_that_ended_the_wait_as_128_plus_n) {
  EXPECT_EQ(exit_code_for_signal(SIGHUP), 129);
  EXPECT_EQ(exit_code_for_signal(SIGINT), 130);
  EXPECT_EQ(exit_code_for_signal(SIGQUIT), 131);
  EXPECT_EQ(exit_code_for_signal(SIGTERM), 143);
}

TEST(exit_status, uses_the_exit_codes_of_the_spec) {
  namespace code = fencerun::exit_code;
  EXPECT_EQ(code::k_usage, 64);
  EXPECT_EQ(code::k_unavailable, 69);
  EXPECT_EQ(code::k_internal, 70);
  EXPECT_EQ(code::k_conflict_default, 75);
  EXPECT_EQ(code::k_status_free, 3);
  EXPECT_EQ(code::k_fence_stale, 77);
  EXPECT_EQ(code::k_lease_lost_default, 124);
  EXPECT_EQ(code::k_cannot_execute, 126);
  EXPECT_EQ(code::k_not_found, 127);
}
