#include "supervisor/signals.hpp"
#include "util/error.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <tuple>

namespace fencerun::supervisor {
namespace {

struct NamedSignal {
  const char* name;
  int number;
};
constexpr NamedSignal k_signals[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},       {"QUIT", SIGQUIT},   {"ILL", SIGILL},   {"TRAP", SIGTRAP},
    {"ABRT", SIGABRT}, {"BUS", SIGBUS},       {"FPE", SIGFPE},     {"KILL", SIGKILL}, {"USR1", SIGUSR1},
    {"SEGV", SIGSEGV}, {"USR2", SIGUSR2},     {"PIPE", SIGPIPE},   {"ALRM", SIGALRM}, {"TERM", SIGTERM},
    {"STKFLT", SIGSTKFLT}, {"CHLD", SIGCHLD}, {"CONT", SIGCONT},   {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},
    {"TTIN", SIGTTIN}, {"TTOU", SIGTTOU},     {"URG", SIGURG},     {"XCPU", SIGXCPU}, {"XFSZ", SIGXFSZ},
    {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"IO", SIGIO},     {"PWR", SIGPWR},
    {"SYS", SIGSYS},
};

}  // namespace

std::optional<int> parse_signal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  auto number = [](std::string_view t) -> std::optional<int> {
    int n = 0;
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
    if (t.empty() || ec != std::errc{} || ptr != t.data() + t.size()) return std::nullopt;
    return n;
  };
  if (std::isdigit(static_cast<unsigned char>(text.front()))) {
    auto n = number(text);
    if (!n || *n < 1 || *n >= NSIG) return std::nullopt;
    return n;
  }
  std::string upper;
  for (char c : text) upper.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  std::string_view name = upper;
  if (name.starts_with("SIG")) name.remove_prefix(3);
  for (const auto& s : k_signals)
    if (name == s.name) return s.number;
  // Real-time signals as kill(1) writes them: RTMIN, RTMIN+N, RTMAX-N, RTMAX.
  for (auto [prefix, base, sign] : {std::tuple{"RTMIN", SIGRTMIN, 1}, std::tuple{"RTMAX", SIGRTMAX, -1}}) {
    std::string_view p = prefix;
    if (!name.starts_with(p)) continue;
    std::string_view rest = name.substr(p.size());
    int offset = 0;
    if (!rest.empty()) {
      if (rest.front() != (sign > 0 ? '+' : '-')) return std::nullopt;
      auto n = number(rest.substr(1));
      if (!n || rest.size() < 2 || !std::isdigit(static_cast<unsigned char>(rest[1]))) return std::nullopt;
      offset = *n;
    }
    int signo = base + sign * offset;
    if (signo < SIGRTMIN || signo > SIGRTMAX) return std::nullopt;
    return signo;
  }
  return std::nullopt;
}

std::string signal_name(int signo) {
  for (const auto& s : k_signals)
    if (s.number == signo) return s.name;
  if (signo == SIGRTMIN) return "RTMIN";
  if (signo > SIGRTMIN && signo <= SIGRTMAX) return "RTMIN+" + std::to_string(signo - SIGRTMIN);
  return std::to_string(signo);
}

namespace {

// Signals whose default action does not end a process: ignored, or stopping it.
bool ignored_by_default(int signo) {
  return signo == SIGCHLD || signo == SIGCONT || signo == SIGURG || signo == SIGWINCH;
}
bool stops_by_default(int signo) {
  return signo == SIGTSTP || signo == SIGTTIN || signo == SIGTTOU || signo == SIGSTOP;
}
bool catchable(int signo) { return signo >= 1 && signo < NSIG && signo != SIGKILL && signo != SIGSTOP; }

}  // namespace

bool is_forwarded(int signo) { return catchable(signo) && signo != SIGCHLD && signo != SIGPIPE; }

bool ends_wait(int signo) {
  return catchable(signo) && signo != SIGPIPE && !ignored_by_default(signo) && !stops_by_default(signo);
}

bool stops_waiter(int signo) { return signo == SIGTSTP; }

namespace {
bool g_sigchld_ignored = false;
}  // namespace

void die_by_signal(int signo) {
  // As timeout(1) does: end the way the command ended, so that a calling shell sees the signal (a
  // script stops on Ctrl-C), without leaving a core file of fencerun's own.
  rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  struct sigaction old {};
  if (::sigaction(signo, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) return;  // inherited: keep it
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(signo, &dfl, nullptr);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, signo);
  ::raise(signo);
  ::pthread_sigmask(SIG_UNBLOCK, &only, nullptr);
}

bool sigchld_was_ignored() { return g_sigchld_ignored; }

bool reset_inherited_dispositions() {
  struct sigaction old {};
  if (::sigaction(SIGCHLD, nullptr, &old) != 0) return false;
  bool ignored = old.sa_handler == SIG_IGN;
  g_sigchld_ignored = g_sigchld_ignored || ignored;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGCHLD, &dfl, nullptr);
  return ignored;
}

SignalChannel::SignalChannel() {
  sigset_t blocked;
  sigfillset(&blocked);
  sigdelset(&blocked, SIGKILL);
  sigdelset(&blocked, SIGSTOP);
  if (int rc = ::pthread_sigmask(SIG_BLOCK, &blocked, &m_original); rc != 0)
    throw SystemError("pthread_sigmask", rc);
  // PIPE stays blocked but is never read: a write to a closed socket returns EPIPE instead, and a
  // SIGPIPE raised by fencerun's own write is not the job's business.
  sigset_t handled = blocked;
  sigdelset(&handled, SIGPIPE);
  m_fd.reset(::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!m_fd) throw SystemError("signalfd");
}

SignalChannel::~SignalChannel() { ::pthread_sigmask(SIG_SETMASK, &m_original, nullptr); }

std::optional<SignalChannel::Received> SignalChannel::read_one_received() {
  signalfd_siginfo info{};
  for (;;) {
    ssize_t n = ::read(m_fd.get(), &info, sizeof info);
    if (n == static_cast<ssize_t>(sizeof info))
      return Received{static_cast<int>(info.ssi_signo), info.ssi_code == SI_KERNEL};
    if (n < 0 && errno == EINTR) continue;
    return std::nullopt;
  }
}

std::optional<int> SignalChannel::read_one() {
  if (auto r = read_one_received()) return r->signo;
  return std::nullopt;
}

std::optional<int> SignalChannel::pending_terminating() {
  while (auto sig = read_one()) {
    if (ends_wait(*sig)) return sig;
    // Holding nothing yet: a terminal's Ctrl-Z (or kill -TSTP) stops fencerun as it would any program.
    if (stops_waiter(*sig)) ::raise(SIGSTOP);
  }
  return std::nullopt;
}

std::optional<int> SignalChannel::wait_for_terminating(Deadline until) {
  bool ready = false;
  return wait_for_terminating(until, -1, ready);
}

std::optional<int> SignalChannel::wait_for_terminating(Deadline until, int extra_fd, bool& ready) {
  ready = false;
  for (;;) {
    if (auto sig = pending_terminating()) return sig;
    auto left = time_left(until);
    if (left <= BootClock::duration::zero()) return std::nullopt;
    timespec ts{};
    ts.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(left).count();
    ts.tv_nsec = (left - std::chrono::seconds(ts.tv_sec)).count();
    pollfd p[2] = {{m_fd.get(), POLLIN, 0}, {extra_fd, POLLIN, 0}};
    ::ppoll(p, extra_fd >= 0 ? 2 : 1, &ts, nullptr);
    if (extra_fd >= 0 && p[1].revents != 0) {
      if (auto sig = pending_terminating()) return sig;
      ready = true;
      return std::nullopt;
    }
  }
}

}  // namespace fencerun::supervisor
