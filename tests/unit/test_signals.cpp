#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/signals.hpp"
#include "util/clock.hpp"

using fencerun::BootClock;
using fencerun::supervisor::ends_wait;
using fencerun::supervisor::is_forwarded;
using fencerun::supervisor::parse_signal;
using fencerun::supervisor::signal_name;
using fencerun::supervisor::SignalChannel;

TEST(signal_names, parses_names_with_and_without_the_sig_prefix) {
  EXPECT_EQ(parse_signal("TERM"), SIGTERM);
  EXPECT_EQ(parse_signal("SIGTERM"), SIGTERM);
  EXPECT_EQ(parse_signal("KILL"), SIGKILL);
  EXPECT_EQ(parse_signal("SIGINT"), SIGINT);
  EXPECT_EQ(parse_signal("USR1"), SIGUSR1);
}

TEST(signal_names, ignores_case) {
  EXPECT_EQ(parse_signal("term"), SIGTERM);
  EXPECT_EQ(parse_signal("sigterm"), SIGTERM);
  EXPECT_EQ(parse_signal("SigHup"), SIGHUP);
}

TEST(signal_names, parses_numbers) {
  EXPECT_EQ(parse_signal("15"), 15);
  EXPECT_EQ(parse_signal("9"), 9);
  EXPECT_EQ(parse_signal("1"), 1);
  EXPECT_EQ(parse_signal(std::to_string(SIGRTMAX)), SIGRTMAX);
}

TEST(signal_names, rejects_numbers_that_are_no_signal) {
  EXPECT_EQ(parse_signal("0"), std::nullopt);
  EXPECT_EQ(parse_signal("-1"), std::nullopt);
  EXPECT_EQ(parse_signal(std::to_string(NSIG)), std::nullopt);
  EXPECT_EQ(parse_signal("99999999999999999999"), std::nullopt);
  EXPECT_EQ(parse_signal("15x"), std::nullopt);
  EXPECT_EQ(parse_signal("+15"), std::nullopt);
}

TEST(signal_names, rejects_unknown_names) {
  EXPECT_EQ(parse_signal(""), std::nullopt);
  EXPECT_EQ(parse_signal("SIG"), std::nullopt);
  EXPECT_EQ(parse_signal("BOGUS"), std::nullopt);
  EXPECT_EQ(parse_signal("SIGSIGTERM"), std::nullopt);
  EXPECT_EQ(parse_signal(" TERM"), std::nullopt);
  EXPECT_EQ(parse_signal("TERM "), std::nullopt);
}

TEST(signal_names, names_signals_without_the_prefix) {
  EXPECT_EQ(signal_name(SIGTERM), "TERM");
  EXPECT_EQ(signal_name(SIGKILL), "KILL");
  EXPECT_EQ(signal_name(SIGHUP), "HUP");
  EXPECT_EQ(signal_name(SIGWINCH), "WINCH");
}

TEST(signal_names, names_real_time_signals_as_kill_does) {
  EXPECT_EQ(signal_name(SIGRTMIN), "RTMIN");
  EXPECT_EQ(signal_name(SIGRTMIN + 3), "RTMIN+3");
  EXPECT_EQ(parse_signal("RTMIN"), SIGRTMIN);
  EXPECT_EQ(parse_signal("SIGRTMIN+3"), SIGRTMIN + 3);
  EXPECT_EQ(parse_signal("RTMAX-1"), SIGRTMAX - 1);
  EXPECT_EQ(parse_signal("RTMAX"), SIGRTMAX);
  EXPECT_EQ(parse_signal("RTMIN+99"), std::nullopt);
  EXPECT_EQ(parse_signal("RTMIN-1"), std::nullopt);
  EXPECT_EQ(parse_signal("RTMIN+"), std::nullopt);
}

TEST(signal_names, names_unnamed_signals_by_number) { EXPECT_EQ(signal_name(0), "0"); }

TEST(signal_names, round_trips_every_standard_signal) {
  for (int signo = 1; signo < 32; ++signo) {
    std::string name = signal_name(signo);
    EXPECT_NE(name, std::to_string(signo)) << signo << " has no name";
    EXPECT_EQ(parse_signal(name), signo) << name;
    EXPECT_EQ(parse_signal("SIG" + name), signo) << name;
  }
}

TEST(signal_sets, forwards_every_catchable_signal_but_chld_and_pipe) {
  const std::vector<int> kept{SIGKILL, SIGSTOP, SIGCHLD, SIGPIPE};
  for (int signo = 1; signo < NSIG; ++signo) {
    bool expected = std::find(kept.begin(), kept.end(), signo) == kept.end();
    EXPECT_EQ(is_forwarded(signo), expected) << signal_name(signo);
  }
}

TEST(signal_sets, ends_the_wait_for_every_signal_whose_default_ends_a_process) {
  // Ignored by default, stopping by default, uncatchable, or fencerun's own EPIPE: the wait goes on.
  const std::vector<int> not_ending{SIGCHLD, SIGCONT, SIGURG,  SIGWINCH, SIGTSTP,
                                    SIGTTIN, SIGTTOU, SIGSTOP, SIGKILL,  SIGPIPE};
  for (int signo = 1; signo < NSIG; ++signo) {
    bool expected = std::find(not_ending.begin(), not_ending.end(), signo) == not_ending.end();
    EXPECT_EQ(ends_wait(signo), expected) << signal_name(signo);
  }
  for (int signo : {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGALRM, SIGPWR, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF,
                    SIGSTKFLT, SIGUSR1, SIGRTMIN, SIGRTMAX})
    EXPECT_TRUE(ends_wait(signo)) << signal_name(signo);
}

namespace {

sigset_t current_mask() {
  sigset_t mask;
  ::pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  return mask;
}

}  // namespace

TEST(signal_channel, blocks_the_handled_signals_while_it_lives) {
  sigset_t before = current_mask();
  ASSERT_FALSE(sigismember(&before, SIGTERM));
  {
    SignalChannel channel;
    sigset_t mask = current_mask();
    for (int signo = 1; signo < SIGRTMIN; ++signo) {
      if (signo == SIGKILL || signo == SIGSTOP || signo == 32 || signo == 33) continue;
      EXPECT_TRUE(sigismember(&mask, signo)) << signal_name(signo);
    }
    EXPECT_TRUE(sigismember(&mask, SIGRTMAX));
    EXPECT_FALSE(sigismember(&channel.original_mask(), SIGTERM));
    EXPECT_GE(channel.fd(), 0);
  }
  sigset_t after = current_mask();
  EXPECT_FALSE(sigismember(&after, SIGTERM));
  EXPECT_FALSE(sigismember(&after, SIGCHLD));
  EXPECT_FALSE(sigismember(&after, SIGPIPE));
}

TEST(signal_channel, reads_a_pending_signal_once) {
  SignalChannel channel;
  EXPECT_EQ(channel.read_one(), std::nullopt);
  ::kill(::getpid(), SIGUSR1);
  EXPECT_EQ(channel.read_one(), SIGUSR1);
  EXPECT_EQ(channel.read_one(), std::nullopt);
}

TEST(signal_channel, finds_a_terminating_signal_among_others) {
  SignalChannel channel;
  // signalfd hands out pending standard signals lowest number first: TERM (15), then WINCH (28).
  ::kill(::getpid(), SIGWINCH);
  ::kill(::getpid(), SIGTERM);
  EXPECT_EQ(channel.pending_terminating(), SIGTERM);
  EXPECT_EQ(channel.read_one(), SIGWINCH);
  EXPECT_EQ(channel.read_one(), std::nullopt);
}

TEST(signal_channel, drops_signals_that_do_not_end_the_wait) {
  SignalChannel channel;
  ::kill(::getpid(), SIGWINCH);
  EXPECT_EQ(channel.pending_terminating(), std::nullopt);
  EXPECT_EQ(channel.read_one(), std::nullopt);
}

TEST(signal_channel, returns_a_pending_terminating_signal_at_once) {
  SignalChannel channel;
  ::kill(::getpid(), SIGTERM);
  auto start = BootClock::now();
  EXPECT_EQ(channel.wait_for_terminating(start + std::chrono::seconds(10)), SIGTERM);
  EXPECT_LT(BootClock::now() - start, std::chrono::seconds(5));
}

TEST(signal_channel, waits_until_the_deadline_without_a_terminating_signal) {
  SignalChannel channel;
  ::kill(::getpid(), SIGURG);
  auto start = BootClock::now();
  EXPECT_EQ(channel.wait_for_terminating(start + std::chrono::milliseconds(100)), std::nullopt);
  auto waited = BootClock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_EQ(channel.read_one(), std::nullopt);
}

TEST(signal_channel, returns_at_once_for_a_deadline_in_the_past) {
  SignalChannel channel;
  auto start = BootClock::now();
  EXPECT_EQ(channel.wait_for_terminating(start - std::chrono::seconds(1)), std::nullopt);
  EXPECT_LT(BootClock::now() - start, std::chrono::seconds(1));
}
