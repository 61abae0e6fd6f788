#pragma once
// The fixture of the hand-over tests: a redis-server of the test's own, the real fencerun binary
// started in the test's temp dir, and helpers that read the lock's keys. Every command the test
// itself sends to its server goes through cmd() and is counted, so that a test can tell the server's
// command counter (INFO stats) apart from what fencerun sent.
//
// "Waiting" is read from the server in a way that does not depend on how the lease protocol names
// its channels: a waiter past its first busy try is subscribed to some channel `fencerun:{NAME}:*`
// (one shared release channel, or a wake-up channel of its own), so the number of waiters is the sum
// of PUBSUB NUMSUB over the channels PUBSUB CHANNELS lists for that pattern.
#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"

namespace fencerun::test::handover {

// Wall-clock nanoseconds, the same clock as `date +%s%N` in the commands.
long long wall_ns();

// utime + stime of a process (all its threads), in clock ticks, from /proc/PID/stat.
std::optional<long long> cpu_ticks(pid_t pid);

std::string join(const std::vector<std::string>& v);

// A Redis glob pattern that matches `s` literally (escapes * ? [ ] and backslash).
std::string glob_escape(std::string_view s);

class HandoverTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  RedisServer& redis() { return *redis_; }
  std::filesystem::path file(std::string_view name) const { return dir_ / name; }
  void touch(std::string_view name) const { write_file(file(name), ""); }

  static std::string key(const std::string& name, std::string_view suffix) {
    return "fencerun:{" + name + "}:" + std::string(suffix);
  }

  // One command to the test's server, counted in commands_sent() when a reply came back.
  Reply cmd(const std::vector<std::string>& args);
  // Commands the test itself has sent to its server so far (through cmd()).
  long long commands_sent() const { return commands_sent_; }
  // INFO stats total_commands_processed (the INFO itself is counted by the server only after it
  // answered, and by commands_sent() as soon as it answered).
  long long server_commands();
  bool exists(const std::string& k);

  // fencerun -r URL OPTIONS... NAME -- sh -c SCRIPT, in the test's temp dir.
  std::unique_ptr<FencerunProcess> start(const std::string& name, const std::string& script,
                                         std::vector<std::string> options = {});

  // A holder whose command runs until the file `go` appears and then writes `date +%s%N` to
  // `released` as its last act.
  std::unique_ptr<FencerunProcess> start_holder(const std::string& name, const std::string& go,
                                                const std::string& released,
                                                std::vector<std::string> options = {"--ttl", "30s"});

  // Waiters of NAME: subscriptions to the channels `fencerun:{NAME}:*`; -1 when the server did not
  // answer.
  long long subscribers(const std::string& name);
  bool wait_subscribers(const std::string& name, long long n, Clock::duration timeout = 10s,
                        Clock::duration poll = 5ms);

  long long queued(const std::string& name);
  bool wait_queued(const std::string& name, long long n, Clock::duration timeout = 10s, Clock::duration poll = 5ms);
  std::vector<std::string> queue_members(const std::string& name);
  bool in_zset(const std::string& name, std::string_view set, const std::string& member);

  // A nanosecond timestamp written by a command.
  long long stamp(const std::string& name, Clock::duration timeout = 10s);

  std::vector<std::string> lines(const std::string& name);

  // Stops a process with SIGSTOP (and its process group too when it leads one of its own), and
  // returns once /proc shows it stopped; thaw() sends SIGCONT the same way.
  bool freeze(Process& p, Clock::duration timeout = 5s);
  bool thaw(Process& p);

 private:
  std::unique_ptr<RedisServer> redis_;
  TempDir dir_{"handover"};
  std::vector<pid_t> cleanup_pids_;
  long long commands_sent_ = 0;
};

}  // namespace fencerun::test::handover
