#include "supervisor/watchdog.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <new>

#include "supervisor/cgroup.hpp"
#include "supervisor/proctree.hpp"
#include "supervisor/sys.hpp"
#include "util/error.hpp"

namespace fencerun::supervisor {
namespace {

WatchdogStart g_start = WatchdogStart::clone;
std::chrono::milliseconds g_detach_after{100};

std::int64_t to_ns(Deadline d) { return d.time_since_epoch().count(); }

// Closes every descriptor from 3 on but those in `keep` (entries may be -1).
template <std::size_t N>
void close_all_but(int (&keep)[N]) {
  std::sort(std::begin(keep), std::end(keep));
  unsigned from = 3;
  for (int k : keep) {
    if (k < 0 || static_cast<unsigned>(k) < from) continue;
    if (static_cast<unsigned>(k) > from) sys::close_range(from, static_cast<unsigned>(k) - 1);
    from = static_cast<unsigned>(k) + 1;
  }
  sys::close_range(from, ~0U);
}

// fencerun died: nobody else will remove the job's (emptied) cgroup. Waits up to a second for the
// killed members to leave it.
bool cgroup_populated(int events_fd) {
  char buf[256];
  long n = sys::pread(events_fd, buf, sizeof buf, 0);
  static constexpr char k_key[] = "populated ";
  constexpr long k_len = sizeof k_key - 1;
  for (long i = 0; i + k_len < n; ++i) {
    long j = 0;
    while (j < k_len && buf[i + j] == k_key[j]) ++j;
    if (j == k_len) return buf[i + k_len] == '1';
  }
  return false;
}

void remove_cgroup(const WatchdogTargets& targets) {
  if (!targets.cgroup_path || targets.cgroup_events_fd < 0) return;
  for (int i = 0; i < 1000 && cgroup_populated(targets.cgroup_events_fd); ++i) sys::sleep_ns(1'000'000);
  sys::rmdir(targets.cgroup_path);
}

// Only raw system calls from here on (sys.hpp): the watchdog may share fencerun's memory and
// thread-local storage, and the parent may have been multi-threaded at fork.
// `shared_pid` (a cloned watchdog only): where fencerun reads the watchdog's pid. Such a watchdog
// moves into a memory of its own `detach_after_ns` after its start (it forks, and the copy carries
// on), so that the OOM killer, which kills every process sharing its victim's memory, no longer takes
// it with fencerun; short runs end before that and never pay for the copy.
// `report`: the page shared with fencerun where it writes what it did and saw (WatchReport).
[[noreturn]] void watchdog_main(int read_fd, const WatchdogTargets& targets, int kill_signal, std::int64_t slack_ns,
                                WatchReport* report, std::atomic<pid_t>* shared_pid = nullptr,
                                std::int64_t detach_after_ns = 0) {
  const int cgroup_kill_fd = targets.cgroup_kill_fd;
  const int cgroup_procs_fd = targets.cgroup_procs_fd;
  sys::block_all_signals();
  // Its own group: a kill or a stop aimed at fencerun's group must not take the watchdog with it.
  sys::setpgid(0, 0);
  sys::set_name("fencerun-watch");
  int keep[] = {read_fd, cgroup_kill_fd, cgroup_procs_fd, targets.cgroup_events_fd};
  close_all_but(keep);
  int devnull = sys::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    for (int fd = 0; fd <= 2; ++fd) sys::dup2(devnull, fd);
    if (devnull > 2) sys::close(devnull);
  }
  sys::fcntl(read_fd, F_SETFL, O_NONBLOCK);
  int timer = sys::timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK);
  if (timer < 0) timer = -1;

  std::int64_t detach_at = shared_pid && detach_after_ns > 0 ? sys::boot_ns() + detach_after_ns : 0;
  pid_t pid = 0;
  // The command's pidfd: readable once it has exited (a zombie fencerun has not reaped yet included).
  int pidfd = -1;
  std::int64_t stop_ns = 0, kill_ns = 0;
  bool parent_stopping = false, sent_stop = false, sent_kill = false;
  auto hit = [&](int sig) {
    if (pid <= 0) return;
    if (targets.own_group) {
      sys::kill(-pid, sig);
      if (sys::getpgid(pid) != pid) sys::kill(pid, sig);  // the command left its group
    } else if (targets.tree_root > 0) {
      // The job shares fencerun's (the caller's) process group and has no cgroup: it is fencerun's
      // descendants. Once fencerun is gone (we were re-parented), only the command's own subtree is left.
      if (sys::getppid() == targets.tree_root) {
        proctree::signal_descendants(targets.tree_root, sys::getpid(), sig);
      } else {
        sys::kill(pid, sig);
        proctree::signal_descendants(pid, sys::getpid(), sig);
      }
    } else {
      // The job shares fencerun's (the caller's) process group: signal its cgroup's members only.
      if (cgroup_procs_fd >= 0) signal_cgroup_members(cgroup_procs_fd, sig);
      sys::kill(pid, sig);
    }
    if (sig == SIGKILL && cgroup_kill_fd >= 0) sys::write(cgroup_kill_fd, "1", 1);
  };

  for (;;) {
    WatchMessage batch[16];
    for (;;) {
      long n = sys::read(read_fd, batch, sizeof batch);
      if (n == -EINTR) continue;
      if (n < 0) break;  // EAGAIN: nothing more for now
      if (n == 0) {      // end of file: fencerun is gone, or dropped us without disarming
        hit(SIGKILL);
        if (pid <= 0 && cgroup_kill_fd >= 0) sys::write(cgroup_kill_fd, "1", 1);
        remove_cgroup(targets);
        sys::exit_process(0);
      }
      for (long i = 0; i + static_cast<long>(sizeof(WatchMessage)) <= n; i += sizeof(WatchMessage)) {
        const WatchMessage& m = batch[i / static_cast<long>(sizeof(WatchMessage))];
        switch (m.kind) {
          case WatchMessage::guard:
            pid = m.pid;
#ifdef SYS_pidfd_open
            if (pid > 0 && pidfd < 0) {
              long fd = sys::call(SYS_pidfd_open, pid, 0);
              if (fd >= 0) pidfd = static_cast<int>(fd);
            }
#endif
            if (m.stop_ns > 0) stop_ns = m.stop_ns, kill_ns = m.kill_ns;
            break;
          case WatchMessage::deadline:
            // A renewal only ever moves the points later; once the job is being stopped it stays so.
            if (!sent_stop) stop_ns = std::max(stop_ns, m.stop_ns);
            if (!sent_kill) kill_ns = std::max(kill_ns, m.kill_ns);
            break;
          case WatchMessage::stopping: parent_stopping = true; break;
          case WatchMessage::disarm: sys::exit_process(0);
          default: break;
        }
      }
    }
    std::int64_t now = sys::boot_ns();
    if (detach_at > 0 && now >= detach_at) {
      detach_at = 0;
      long copy = sys::fork_process();
      if (copy > 0) {
        // The copy carries on (it holds the pipe, the timer and the state); fencerun, a subreaper,
        // becomes its parent once this one is gone, and learns its pid first.
        shared_pid->store(static_cast<pid_t>(copy));
        sys::exit_process(0);
      }
      // 0: this is the copy, in a memory of its own. < 0: it stays as it is.
    }
    if (pid > 0 && stop_ns > 0 && !sent_stop && !parent_stopping && now >= stop_ns + slack_ns) {
      report->stop_sent_ns.store(sys::boot_ns());
      hit(kill_signal);
      hit(SIGCONT);  // a stopped job must be able to run its handler in the grace time
      sent_stop = true;
    }
    if (pid > 0 && kill_ns > 0 && !sent_kill && now >= kill_ns) {
      report->kill_sent_ns.store(sys::boot_ns());
      hit(SIGKILL);
      sent_kill = true;
    }
    std::int64_t next = 0;
    if (pid > 0 && stop_ns > 0 && !sent_stop && !parent_stopping) next = stop_ns + slack_ns;
    if (pid > 0 && kill_ns > 0 && !sent_kill) next = next ? std::min(next, kill_ns) : kill_ns;
    if (detach_at > 0) next = next ? std::min(next, detach_at) : detach_at;
    itimerspec spec{};
    if (next > 0) {
      spec.it_value.tv_sec = next / 1'000'000'000;
      spec.it_value.tv_nsec = next % 1'000'000'000;
    }
    if (timer >= 0) sys::timerfd_settime(timer, TFD_TIMER_ABSTIME, &spec);
    // Negative descriptors (no timer, no pidfd) are ignored by poll.
    pollfd fds[3] = {{read_fd, POLLIN, 0}, {timer, POLLIN, 0}, {pidfd, POLLIN, 0}};
    long ready = sys::poll(fds, 3, timer >= 0 || next == 0 ? -1 : 10);
    if (ready > 0 && timer >= 0 && fds[1].revents) {
      std::uint64_t expirations;
      sys::read(timer, &expirations, sizeof expirations);
    }
    if (ready > 0 && pidfd >= 0 && fds[2].revents) {
      // The command is over: when, as seen here (fencerun may be stopped and see it only much later).
      std::int64_t unseen = 0;
      report->exited_ns.compare_exchange_strong(unseen, sys::boot_ns());
      sys::close(pidfd);
      pidfd = -1;
    }
  }
}

// What a watchdog started with clone() gets, on its own stack: it shares fencerun's memory, so it
// must not read anything fencerun may later change or free.
struct CloneStart {
  std::atomic<pid_t> current_pid;  // written by the watchdog when it moves (watchdog_main), read by fencerun
  WatchReport* report;
  int read_fd;
  int kill_signal;
  std::int64_t slack_ns;
  std::int64_t detach_after_ns;
  WatchdogTargets targets;
  char cgroup_path[4096];
};

int clone_main(void* arg) {
  auto* start = static_cast<CloneStart*>(arg);
  start->targets.cgroup_path = start->cgroup_path[0] != '\0' ? start->cgroup_path : nullptr;
  watchdog_main(start->read_fd, start->targets, start->kill_signal, start->slack_ns, start->report,
                &start->current_pid, start->detach_after_ns);
}

// The watchdog's stack: its pages are only faulted in as it uses them (signal_descendants needs about
// 70 KiB). Never unmapped: the watchdog outlives fencerun's every use of the memory they share.
constexpr std::size_t k_clone_stack = 256 * 1024;

// Starts the watchdog with clone(CLONE_VM): a process of its own (its own pid, process group, signal
// state and descriptor table; it survives a SIGKILL or SIGSTOP of fencerun, and keeps the memory
// alive), that shares fencerun's memory instead of copying it. A fork marked every writable page of
// fencerun copy-on-write, and both processes then faulted on each page they touched; on a short run
// that cost more than the rest of the run together. Returns the block whose current_pid follows the
// watchdog, or nullptr (then fork).
CloneStart* clone_watchdog(int read_fd, const WatchdogTargets& targets, int kill_signal, std::int64_t slack_ns,
                           WatchReport* report) {
  if (!sys::k_raw) return nullptr;
  if (targets.cgroup_path && std::strlen(targets.cgroup_path) >= sizeof(CloneStart::cgroup_path)) return nullptr;
  void* stack = ::mmap(nullptr, k_clone_stack, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
  if (stack == MAP_FAILED) return nullptr;
  ::mprotect(stack, 4096, PROT_NONE);  // a guard page below the stack
  // The start block sits at the top of the region, the stack grows down from below it.
  char* top = static_cast<char*>(stack) + k_clone_stack;
  auto* start = new (reinterpret_cast<void*>(
      (reinterpret_cast<std::uintptr_t>(top) - sizeof(CloneStart)) & ~std::uintptr_t{63})) CloneStart;
  start->read_fd = read_fd;
  start->report = report;
  start->detach_after_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(g_detach_after).count();
  start->kill_signal = kill_signal;
  start->slack_ns = slack_ns;
  start->targets = targets;
  start->cgroup_path[0] = '\0';
  if (targets.cgroup_path) std::strcpy(start->cgroup_path, targets.cgroup_path);
  void* stack_top = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(start) & ~std::uintptr_t{15});
  // The pid is stored before the watchdog can move: it is read and written by both sides afterwards.
  start->current_pid.store(0);
  pid_t pid = ::clone(clone_main, stack_top, CLONE_VM | SIGCHLD, start);
  if (pid < 0) {
    ::munmap(stack, k_clone_stack);
    return nullptr;
  }
  pid_t expected = 0;
  start->current_pid.compare_exchange_strong(expected, pid);
  return start;
}

}  // namespace

Watchdog::Watchdog(int kill_signal, WatchdogTargets targets, std::chrono::milliseconds slack) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw SystemError("pipe2");
  UniqueFd read_end(fds[0]);
  m_pipe.reset(fds[1]);
  // Never block a writer (the renewal thread) on a watchdog that is itself stopped: a full pipe drops
  // the update, and the watchdog acts on the points it already has, which only errs on the safe side.
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
  const std::int64_t slack_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slack).count();
  // Shared with the watchdog for good, even once it has forked into a memory of its own; never
  // unmapped (a watchdog still sharing fencerun's memory may write it until it exits): one page per run.
  void* page = ::mmap(nullptr, sizeof(WatchReport), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) throw SystemError("cannot start the watchdog: mmap");
  m_report = new (page) WatchReport;
  if (g_start == WatchdogStart::clone) {
    if (CloneStart* start = clone_watchdog(read_end.get(), targets, kill_signal, slack_ns, m_report)) {
      m_pid = &start->current_pid;
      return;
    }
  }
  pid_t pid = ::fork();
  if (pid < 0) throw SystemError("cannot start the watchdog: fork");
  if (pid == 0) watchdog_main(read_end.get(), targets, kill_signal, slack_ns, m_report);
  // Outlives this object, as the cloned watchdog's block does (Supervisor reads it after dropping
  // the Watchdog): one small allocation per run, never freed.
  m_pid = new std::atomic<pid_t>(pid);
}

void set_watchdog_detach_delay(std::chrono::milliseconds delay) { g_detach_after = delay; }

void set_watchdog_start(WatchdogStart how) { g_start = how; }

Watchdog::~Watchdog() {
  // Closing the pipe without a disarm message makes the watchdog SIGKILL the job. Not waited for: it
  // exits by itself, and fencerun's reaper (or init) collects it.
  m_pipe.reset();
}

WatchMessage Watchdog::guard_message(pid_t pgid, Deadline stop_at, Deadline kill_at) {
  WatchMessage m;
  m.kind = WatchMessage::guard;
  m.pid = static_cast<std::int32_t>(pgid);
  m.stop_ns = to_ns(stop_at);
  m.kill_ns = to_ns(kill_at);
  return m;
}

void Watchdog::send(const WatchMessage& m) {
  if (!m_pipe) return;
  for (;;) {
    ssize_t n = ::write(m_pipe.get(), &m, sizeof m);
    if (n < 0 && errno == EINTR) continue;
    return;
  }
}

void Watchdog::guard(pid_t pgid) {
  WatchMessage m;
  m.kind = WatchMessage::guard;
  m.pid = static_cast<std::int32_t>(pgid);
  send(m);
}

void Watchdog::guard(pid_t pgid, Deadline stop_at, Deadline kill_at) { send(guard_message(pgid, stop_at, kill_at)); }

void Watchdog::update(Deadline stop_at, Deadline kill_at) {
  WatchMessage m;
  m.kind = WatchMessage::deadline;
  m.stop_ns = to_ns(stop_at);
  m.kill_ns = to_ns(kill_at);
  send(m);
}

void Watchdog::stopping() {
  WatchMessage m;
  m.kind = WatchMessage::stopping;
  send(m);
}

void Watchdog::disarm() {
  WatchMessage m;
  m.kind = WatchMessage::disarm;
  send(m);
  m_pipe.reset();
}

}  // namespace fencerun::supervisor
