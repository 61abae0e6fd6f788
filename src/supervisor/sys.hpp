#pragma once
// Raw system calls, for the code the watchdog runs (watchdog.cpp, proctree.cpp and
// signal_cgroup_members in cgroup.cpp). The watchdog shares fencerun's memory and runs on the
// thread-local storage of the fencerun thread that started it (watchdog.hpp), so it must not go
// through libc's wrappers: they write errno there, which fencerun's own thread reads. These return
// what the kernel returns (a negative errno on failure) and touch nothing else: no errno, no lock, no
// allocation. Where this file has no raw form for the machine (k_raw is false), the watchdog is forked
// instead, and libc's syscall(2) is used.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace fencerun::supervisor::sys {

#if defined(__x86_64__)
inline constexpr bool k_raw = true;
inline long call(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
  long ret;
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
}
#elif defined(__aarch64__)
inline constexpr bool k_raw = true;
inline long call(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  register long x4 __asm__("x4") = e;
  register long x5 __asm__("x5") = f;
  __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory", "cc");
  return x0;
}
#else
inline constexpr bool k_raw = false;
inline long call(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
  long r = ::syscall(n, a, b, c, d, e, f);
  return r == -1 ? -errno : r;
}
#endif

template <typename T>
long arg(T v) {
  if constexpr (requires { reinterpret_cast<long>(v); }) return reinterpret_cast<long>(v);
  else return static_cast<long>(v);
}

inline long read(int fd, void* buf, std::size_t n) { return call(SYS_read, fd, arg(buf), static_cast<long>(n)); }
inline long write(int fd, const void* buf, std::size_t n) { return call(SYS_write, fd, arg(buf), static_cast<long>(n)); }
inline long pread(int fd, void* buf, std::size_t n, long offset) {
  return call(SYS_pread64, fd, arg(buf), static_cast<long>(n), offset);
}
inline int open(const char* path, int flags) { return static_cast<int>(call(SYS_openat, AT_FDCWD, arg(path), flags, 0)); }
inline long close(int fd) { return call(SYS_close, fd); }
inline long close_range(unsigned first, unsigned last) { return call(SYS_close_range, first, last, 0); }
inline long dup2(int from, int to) { return from == to ? to : call(SYS_dup3, from, to, 0); }
inline long fcntl(int fd, int cmd, long value) { return call(SYS_fcntl, fd, cmd, value); }
inline long getdents64(int fd, void* buf, std::size_t n) { return call(SYS_getdents64, fd, arg(buf), static_cast<long>(n)); }
inline long kill(pid_t pid, int sig) { return call(SYS_kill, pid, sig); }
inline pid_t getpgid(pid_t pid) { return static_cast<pid_t>(call(SYS_getpgid, pid)); }
inline pid_t getppid() { return static_cast<pid_t>(call(SYS_getppid)); }
inline pid_t getpid() { return static_cast<pid_t>(call(SYS_getpid)); }
inline long setpgid(pid_t pid, pid_t pgid) { return call(SYS_setpgid, pid, pgid); }
inline long set_name(const char* name) { return call(SYS_prctl, 15 /* PR_SET_NAME */, arg(name)); }
// Blocks every signal (the kernel's sigset_t is 8 bytes on Linux).
inline long block_all_signals() {
  unsigned long all = ~0UL;
  return call(SYS_rt_sigprocmask, SIG_SETMASK, arg(&all), 0, sizeof all);
}
inline int timerfd_create(int clock, int flags) { return static_cast<int>(call(SYS_timerfd_create, clock, flags)); }
inline long timerfd_settime(int fd, int flags, const void* spec) { return call(SYS_timerfd_settime, fd, flags, arg(spec), 0); }
// poll(2) with a timeout in milliseconds (< 0: none).
inline long poll(pollfd* fds, unsigned n, int timeout_ms) {
  if (timeout_ms < 0) return call(SYS_ppoll, arg(fds), n, 0, 0, 8);
  timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1'000'000L};
  return call(SYS_ppoll, arg(fds), n, arg(&ts), 0, 8);
}
inline std::int64_t boot_ns() {
  timespec ts{};
  call(SYS_clock_gettime, CLOCK_BOOTTIME, arg(&ts));
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
inline void sleep_ns(long ns) {
  timespec ts{ns / 1'000'000'000, ns % 1'000'000'000};
  call(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, arg(&ts), 0);
}
inline long rmdir(const char* path) { return call(SYS_unlinkat, AT_FDCWD, arg(path), AT_REMOVEDIR); }
// fork(2) as a raw clone: the child gets a copy of this memory and returns 0 here.
inline long fork_process() { return call(SYS_clone, SIGCHLD, 0, 0, 0, 0); }
[[noreturn]] inline void exit_process(int code) {
  for (;;) call(SYS_exit_group, code);
}

}  // namespace fencerun::supervisor::sys
