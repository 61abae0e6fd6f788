#include "supervisor/spawn.hpp"

// Boost.Process 1.74 enables its vfork executor only for pre-2008 POSIX feature levels, although
// glibc declares vfork(2) under _GNU_SOURCE (which g++ defines); it must be set before its headers.
#ifndef BOOST_POSIX_HAS_VFORK
#define BOOST_POSIX_HAS_VFORK 1
#endif

#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/process/child.hpp>
#include <boost/process/exe.hpp>
#include <boost/process/extend.hpp>
#include <boost/process/posix.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <cstring>

#include "util/exit_code.hpp"

namespace fencerun::supervisor {
namespace {

namespace bp = boost::process;

// Runs in the child between vfork and exec. The child borrows fencerun's memory and stack while
// fencerun's thread waits for the exec, so no page is copied for it (fork marked every writable page
// copy-on-write, and both sides then faulted on each page they touched). Hence: only async-signal-safe
// calls, nothing that relies on the thread's cached state (no raise(): it would signal fencerun's
// thread), and every signal stays blocked until just before exec.
struct ChildSetup : bp::extend::handler {
  char* const* argv;
  char** envp;
  const sigset_t* mask;
  int tty_fd;
  bool own_group;
  pid_t parent;
  int cgroup_procs_fd;
  int watchdog_fd;
  WatchMessage guard;
  std::int64_t exec_before_ns;  // 0: no limit
  bool ignore_sigchld;

  template <class Executor>
  void on_exec_setup(Executor& e) const {
    // No handler of fencerun's can run in this child, which shares fencerun's memory: fencerun installs
    // none (it reads signals from a signalfd, supervisor/signals.cpp), so every disposition is the
    // default or "ignore".
    if (own_group) {
      ::setpgid(0, 0);
      if (tty_fd >= 0) ::tcsetpgrp(tty_fd, ::getpid());  // SIGTTOU is still blocked here
    }
    // If fencerun dies, so does the command; a watchdog takes care of the rest of the group.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::kill(::getpid(), SIGKILL);  // fencerun died before prctl took effect
    // Into the job's cgroup before anything can fork, so every descendant is in it.
    if (cgroup_procs_fd >= 0) [[maybe_unused]] auto n = ::write(cgroup_procs_fd, "0", 1);
    // The watchdog learns the pid before the command runs: an instant SIGKILL of fencerun after
    // exec still takes the whole job down.
    if (watchdog_fd >= 0) {
      WatchMessage m = guard;
      m.pid = ::getpid();
      [[maybe_unused]] auto n = ::write(watchdog_fd, &m, sizeof m);
    }
    // The last gate: a lease that ran short between acquire and now starts nothing.
    if (exec_before_ns > 0) {
      timespec ts{};
      ::clock_gettime(CLOCK_BOOTTIME, &ts);
      if (static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec >= exec_before_ns) {
        // A message short enough for std::string's inline buffer: nothing is allocated in this child.
        e.set_error(std::error_code(ETIME, std::system_category()), "too late");
        ::_exit(EXIT_FAILURE);
      }
    }
    if (ignore_sigchld) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      ::sigaction(SIGCHLD, &ign, nullptr);
    }
    ::sigprocmask(SIG_SETMASK, mask, nullptr);
    e.cmd_line = argv;  // argv[0] exactly as the user wrote it
    e.env = envp;
  }
};

bool is_executable_file(const std::string& path, int& err) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    err = errno;
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    err = EACCES;
    return false;
  }
  if (::access(path.c_str(), X_OK) != 0) {
    err = errno;
    return false;
  }
  return true;
}

}  // namespace

std::expected<std::string, SpawnError> resolve_executable(const std::string& name, const std::string& path_env) {
  if (name.find('/') != std::string::npos) {
    int err = 0;
    if (is_executable_file(name, err)) return name;
    if (err == ENOENT || err == ENOTDIR) return std::unexpected(SpawnError{exit_code::k_not_found, name + ": No such file or directory"});
    return std::unexpected(SpawnError{exit_code::k_cannot_execute, name + ": " + std::strerror(err)});
  }
  bool found_unusable = false;
  int unusable_err = 0;
  std::string_view dirs = path_env;
  for (;;) {
    auto colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    int err = 0;
    if (is_executable_file(candidate, err)) return candidate;
    if (err != ENOENT && err != ENOTDIR && !found_unusable) {
      found_unusable = true;
      unusable_err = err;
    }
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  if (found_unusable) return std::unexpected(SpawnError{exit_code::k_cannot_execute, name + ": " + std::strerror(unusable_err)});
  return std::unexpected(SpawnError{exit_code::k_not_found, name + ": command not found"});
}

std::expected<pid_t, SpawnError> spawn(const SpawnRequest& request) {
  const char* path = ::getenv("PATH");
  auto exe = resolve_executable(request.argv.front(), path ? path : "/usr/local/bin:/usr/bin:/bin");
  if (!exe) return std::unexpected(exe.error());

  std::vector<char*> argv, envp;
  for (const auto& a : request.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : request.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  ChildSetup setup;
  setup.argv = argv.data();
  setup.envp = envp.data();
  setup.mask = &request.mask;
  setup.tty_fd = request.tty_fd;
  setup.own_group = request.own_group;
  setup.parent = ::getpid();
  setup.cgroup_procs_fd = request.cgroup_procs_fd;
  setup.watchdog_fd = request.watchdog_fd;
  setup.guard = request.guard;
  setup.exec_before_ns = request.exec_before ? request.exec_before->time_since_epoch().count() : 0;
  setup.ignore_sigchld = request.ignore_sigchld;

  std::error_code ec;
  bp::child child(bp::exe = *exe, setup, bp::posix::use_vfork, ec);
  if (ec && ec.value() == ETIME)
    return std::unexpected(SpawnError{exit_code::k_cannot_execute, "the lease ran short before the command could start", true});
  if (ec) {
    int code = ec.value() == ENOENT ? exit_code::k_not_found : exit_code::k_cannot_execute;
    return std::unexpected(SpawnError{code, request.argv.front() + ": " + std::strerror(ec.value())});
  }
  pid_t pid = child.id();
  child.detach();  // fencerun reaps it itself
  // vfork: the child has exec'd by now, so its group and the terminal's foreground group are set.
  return pid;
}

}  // namespace fencerun::supervisor
