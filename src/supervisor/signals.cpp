#include "supervisor/signals.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <system_error>

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

constexpr int k_forwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH, SIGCONT};

}  // namespace

std::optional<int> parse_signal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  if (std::isdigit(static_cast<unsigned char>(text.front()))) {
    int n = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec != std::errc{} || ptr != text.data() + text.size() || n < 1 || n >= NSIG) return std::nullopt;
    return n;
  }
  std::string upper;
  for (char c : text) upper.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  std::string_view name = upper;
  if (name.starts_with("SIG")) name.remove_prefix(3);
  for (const auto& s : k_signals)
    if (name == s.name) return s.number;
  return std::nullopt;
}

std::string signal_name(int signo) {
  for (const auto& s : k_signals)
    if (s.number == signo) return s.name;
  return std::to_string(signo);
}

bool is_forwarded(int signo) { return std::ranges::find(k_forwarded, signo) != std::end(k_forwarded); }

bool ends_wait(int signo) { return signo == SIGHUP || signo == SIGINT || signo == SIGQUIT || signo == SIGTERM; }

SignalChannel::SignalChannel() {
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : k_forwarded) sigaddset(&handled, s);
  sigaddset(&handled, SIGCHLD);
  sigset_t blocked = handled;
  // Never delivered to fencerun: a write to a closed socket returns EPIPE instead, and tcsetpgrp()
  // from a background group succeeds instead of stopping fencerun.
  sigaddset(&blocked, SIGPIPE);
  sigaddset(&blocked, SIGTTOU);
  sigaddset(&blocked, SIGTTIN);
  if (int rc = ::pthread_sigmask(SIG_BLOCK, &blocked, &m_original); rc != 0)
    throw std::system_error(rc, std::generic_category(), "pthread_sigmask");
  m_fd.reset(::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!m_fd) throw std::system_error(errno, std::generic_category(), "signalfd");
}

SignalChannel::~SignalChannel() { ::pthread_sigmask(SIG_SETMASK, &m_original, nullptr); }

std::optional<int> SignalChannel::read_one() {
  signalfd_siginfo info{};
  for (;;) {
    ssize_t n = ::read(m_fd.get(), &info, sizeof info);
    if (n == static_cast<ssize_t>(sizeof info)) return static_cast<int>(info.ssi_signo);
    if (n < 0 && errno == EINTR) continue;
    return std::nullopt;
  }
}

std::optional<int> SignalChannel::pending_terminating() {
  while (auto sig = read_one())
    if (ends_wait(*sig)) return sig;
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
