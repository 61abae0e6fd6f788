#include "supervisor/spawn.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "util/exit_code.hpp"
#include "util/fd.hpp"

namespace fencerun::supervisor {
namespace {

// Everything the child needs, prepared by the parent: the child allocates nothing. `error` and
// `too_late` are written by the child, which shares fencerun's memory until it execs or exits, and
// read by the parent once it runs again.
struct ChildPlan {
  const char* exe;
  char* const* argv;
  char* const* envp;
  char* const* sh_argv;  // "/bin/sh" exe argv[1..]: a script without "#!" (ENOEXEC), as execvp(3)
  const sigset_t* mask;
  int tty_fd;
  bool own_group;
  pid_t parent;
  int cgroup_procs_fd;  // only where the child could not be started inside its cgroup
  int watchdog_fd;
  WatchMessage guard;
  std::int64_t exec_before_ns;  // 0: no limit
  bool ignore_sigchld;
  volatile int error = 0;
  volatile bool too_late = false;
};

// Runs in the child between clone and exec. The child shares fencerun's memory (CLONE_VM, or
// vfork(2)) while fencerun's thread waits for the exec, so no page is copied for it (a fork marked
// every writable page copy-on-write, and both sides then faulted on each page they touched). Hence:
// only async-signal-safe calls, nothing that relies on the thread's cached state (no raise(): it
// would signal fencerun's thread), and every signal stays blocked until just before exec. No handler
// of fencerun's can run here: fencerun installs none (it reads signals from a signalfd,
// supervisor/signals.cpp), so every disposition is the default or "ignore". The thread that called
// spawn() is this child's parent for PR_SET_PDEATHSIG: fencerun spawns from its main thread.
[[noreturn]] void child_main(ChildPlan* plan) {
  if (plan->own_group) {
    ::setpgid(0, 0);
    if (plan->tty_fd >= 0) ::tcsetpgrp(plan->tty_fd, ::getpid());  // SIGTTOU is still blocked here
  }
  // If fencerun dies, so does the command; a watchdog takes care of the rest of the group.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != plan->parent) ::kill(::getpid(), SIGKILL);  // fencerun died before prctl took effect
  // Only where clone3(CLONE_INTO_CGROUP) was not available: into the job's cgroup before anything can
  // fork, so every descendant is in it.
  if (plan->cgroup_procs_fd >= 0) [[maybe_unused]] auto n = ::write(plan->cgroup_procs_fd, "0", 1);
  // The watchdog learns the pid before the command runs: an instant SIGKILL of fencerun after exec
  // still takes the whole job down.
  if (plan->watchdog_fd >= 0) {
    WatchMessage m = plan->guard;
    m.pid = ::getpid();
    [[maybe_unused]] auto n = ::write(plan->watchdog_fd, &m, sizeof m);
  }
  // The last gate: a lease that ran short between acquire and now starts nothing.
  if (plan->exec_before_ns > 0) {
    timespec ts{};
    ::clock_gettime(CLOCK_BOOTTIME, &ts);
    if (static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec >= plan->exec_before_ns) {
      plan->too_late = true;
      ::_exit(EXIT_FAILURE);
    }
  }
  if (plan->ignore_sigchld) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    ::sigaction(SIGCHLD, &ign, nullptr);
  }
  ::sigprocmask(SIG_SETMASK, plan->mask, nullptr);
  ::execve(plan->exe, plan->argv, plan->envp);
  int err = errno;
  // An executable without "#!" that is no binary: run it with /bin/sh, as execvp(3), env(1),
  // timeout(1) and flock(1) do.
  if (err == ENOEXEC) {
    ::execve("/bin/sh", plan->sh_argv, plan->envp);
    err = errno;
  }
  plan->error = err;
  ::_exit(127);
}

int child_entry(void* arg) { child_main(static_cast<ChildPlan*>(arg)); }

// clone3(2)'s argument (linux/sched.h; glibc 2.36 has no wrapper), up to the `cgroup` field (Linux 5.7).
struct CloneArgs {
  std::uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
      set_tid_size, cgroup;
};
constexpr std::uint64_t k_clone_vm = 0x100, k_clone_vfork = 0x4000, k_clone_into_cgroup = 0x200000000ULL;

// The child's stack while it shares fencerun's memory: lives in the parent's frame, which stays
// alive (the parent is suspended) until the child has exec'd or exited.
constexpr std::size_t k_child_stack = 64 * 1024;

#if defined(__x86_64__) && defined(SYS_clone3)
constexpr bool k_have_clone3 = true;
// clone3(CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP): the child starts on its own stack, inside the
// job's cgroup from its first instruction, without the migration through cgroup.procs (which waits
// for an RCU grace period after a quiet spell, about 17 ms). The child runs `fn(arg)`, which never
// returns. Returns the child's pid or a negative errno.
__attribute__((noinline)) long clone3_run(CloneArgs* args, int (*fn)(void*), void* arg) {
  long ret;
  register long r12 __asm__("r12") = reinterpret_cast<long>(fn);
  register long r13 __asm__("r13") = reinterpret_cast<long>(arg);
  __asm__ volatile(
      "syscall\n\t"
      "testq %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      // The child: a fresh stack (16-byte aligned at its top), every register but rax as the parent's.
      "xorl %%ebp, %%ebp\n\t"
      "movq %%r13, %%rdi\n\t"
      "callq *%%r12\n\t"
      "movl %%eax, %%edi\n\t"
      "movl $231, %%eax\n\t"  // exit_group, should fn ever return
      "syscall\n\t"
      "hlt\n"
      "1:\n\t"
      : "=a"(ret)
      : "a"(static_cast<long>(SYS_clone3)), "D"(args), "S"(sizeof(CloneArgs)), "r"(r12), "r"(r13)
      : "rcx", "r11", "memory", "cc");
  return ret;
}
#else
constexpr bool k_have_clone3 = false;
long clone3_run(CloneArgs*, int (*)(void*), void*) { return -ENOSYS; }
#endif

// vfork(2): the child runs on fencerun's stack below this frame, which it never returns to.
__attribute__((noinline)) pid_t vfork_run(ChildPlan* plan) {
  pid_t pid = ::vfork();
  if (pid == 0) child_main(plan);
  return pid < 0 ? -errno : pid;
}

// Failures that are fencerun's (the system's) and not the command's: out of processes, memory or
// descriptors. They exit 70 (k_internal), never 126/127.
bool is_resource_error(int err) { return err == EAGAIN || err == ENOMEM || err == EMFILE || err == ENFILE; }

bool is_executable_file(const std::string& path, int& err) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    err = errno;
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    err = EISDIR;
    return false;
  }
  if (::access(path.c_str(), X_OK) != 0) {
    err = errno;
    return false;
  }
  return true;
}

// "#!INTERPRETER" of a script whose exec failed with ENOENT although it exists ("" if none).
std::string interpreter_line(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n < 3 || buf[0] != '#' || buf[1] != '!') return {};
  std::string line(buf, static_cast<std::size_t>(n));
  line = line.substr(0, line.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

SpawnError exec_error(const std::string& name, const std::string& exe, int err) {
  if (is_resource_error(err))
    return SpawnError{exit_code::k_internal,
                      "cannot start " + name + ": " + std::strerror(err) + " (the command was not run)"};
  if (err == ENOENT) {
    // The file exists (it was resolved): what is missing is its interpreter.
    if (auto line = interpreter_line(exe); !line.empty())
      return SpawnError{exit_code::k_not_found, name + ": bad interpreter \"" + line + "\": No such file or directory"};
    return SpawnError{exit_code::k_not_found, name + ": No such file or directory"};
  }
  return SpawnError{exit_code::k_cannot_execute, name + ": " + std::strerror(err)};
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
    std::string_view dir = dirs.substr(0, colon);
    if (dir.empty()) dir = ".";
    std::string candidate;
    candidate.append(dir).append("/").append(name);
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

std::expected<pid_t, SpawnError> spawn(const SpawnRequest& request, SpawnInfo* info) {
  const char* path = ::getenv("PATH");
  auto exe = resolve_executable(request.argv.front(), path ? path : "/usr/local/bin:/usr/bin:/bin");
  if (!exe) return std::unexpected(exe.error());

  std::vector<char*> argv, envp, sh_argv;
  argv.reserve(request.argv.size() + 1);
  sh_argv.reserve(request.argv.size() + 2);
  for (const auto& a : request.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  sh_argv.push_back(const_cast<char*>("/bin/sh"));
  sh_argv.push_back(exe->data());
  sh_argv.insert(sh_argv.end(), argv.begin() + 1, argv.end());
  envp.reserve(request.env.size() + 1);
  for (const auto& e : request.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  ChildPlan plan;
  plan.exe = exe->c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  plan.sh_argv = sh_argv.data();
  plan.mask = &request.mask;
  plan.tty_fd = request.tty_fd;
  plan.own_group = request.own_group;
  plan.parent = ::getpid();
  plan.cgroup_procs_fd = -1;
  plan.watchdog_fd = request.watchdog_fd;
  plan.guard = request.guard;
  plan.exec_before_ns = request.exec_before ? request.exec_before->time_since_epoch().count() : 0;
  plan.ignore_sigchld = request.ignore_sigchld;

  long pid = -ENOSYS;
  bool into_cgroup = false;
  if (k_have_clone3) {
    alignas(64) char stack[k_child_stack];
    CloneArgs args{};
    args.flags = k_clone_vm | k_clone_vfork;
    args.exit_signal = SIGCHLD;
    args.stack = reinterpret_cast<std::uint64_t>(stack);
    args.stack_size = sizeof stack;
    if (request.cgroup_fd >= 0) {
      args.flags |= k_clone_into_cgroup;
      args.cgroup = static_cast<std::uint64_t>(request.cgroup_fd);
    }
    pid = clone3_run(&args, child_entry, &plan);
    into_cgroup = pid > 0 && request.cgroup_fd >= 0;
  }
  // A kernel before 5.7 (no CLONE_INTO_CGROUP: EINVAL, E2BIG) or 5.3 (no clone3: ENOSYS), or a cgroup
  // the kernel will not start a process in (EBUSY, EOPNOTSUPP, EACCES, ...): vfork, and the child
  // moves itself into the cgroup (the caller checks that it did). Out of processes, memory or
  // descriptors: fencerun's own failure, nothing is retried.
  if (pid < 0 && !is_resource_error(static_cast<int>(-pid))) {
    UniqueFd procs(request.open_cgroup_procs ? request.open_cgroup_procs() : -1);
    plan.cgroup_procs_fd = procs.get();
    pid = vfork_run(&plan);
  }
  if (pid < 0)
    return std::unexpected(SpawnError{exit_code::k_internal,
                                      "cannot start " + request.argv.front() + ": " + std::strerror(static_cast<int>(-pid)) +
                                          " (the command was not run)"});
  // CLONE_VFORK: the child has exec'd or exited by now, so its group and the terminal's foreground
  // group are set, and its error (if any) is in `plan`.
  if (plan.too_late || plan.error != 0) {
    int status = 0;
    while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
    }
    if (plan.too_late)
      return std::unexpected(SpawnError{exit_code::k_cannot_execute, "the lease ran short before the command could start", true});
    return std::unexpected(exec_error(request.argv.front(), *exe, plan.error));
  }
  if (info) info->in_cgroup = into_cgroup;
  return static_cast<pid_t>(pid);
}

}  // namespace fencerun::supervisor
