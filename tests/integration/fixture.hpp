#pragma once
// Shared fixture: every test gets its own redis-server (own port, own unix socket) and its own
// temp dir, which is also the working directory of the fencerun processes it starts, so that
// `sh -c` commands can write pid and token files with relative names.
#include <gtest/gtest.h>

#include <csignal>
#include <iostream>
#include <memory>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/json.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"

namespace fencerun::test {

// Holds the lock with a command that records its pid, starts a grandchild in its process group
// (recording that pid too) and waits.
inline constexpr const char* kHoldWithGrandchild =
    "echo $$ > pid; sleep 1000 & echo $! > gpid; wait";
// Records its pid and token, then runs until the file `go` appears.
inline constexpr const char* kHoldUntilGo =
    "echo $$ > pid; echo \"$FENCERUN_TOKEN\" > token; "
    "while [ ! -e go ]; do sleep 0.02; done";

class FencerunTest : public ::testing::Test {
 protected:
  void SetUp() override { redis_ = std::make_unique<RedisServer>(redis_options()); }

  void TearDown() override {
    if (redis_ && redis_->frozen()) redis_->thaw();
    for (pid_t p : cleanup_pids_) kill_if_alive(p);
    if (HasFailure() && redis_) {
      std::cout << "--- redis-server log (" << redis_->url() << ") ---\n"
                << redis_->log() << "\n";
    }
  }

  virtual RedisOptions redis_options() const { return {}; }

  RedisServer& redis() { return *redis_; }
  const TempDir& dir() const { return dir_; }
  std::filesystem::path file(std::string_view name) const { return dir_ / name; }

  SpawnOptions spawn_options(EnvList env = {}) const {
    SpawnOptions o;
    o.env = std::move(env);
    o.cwd = dir_.path();
    return o;
  }

  // [-r URL] OPTIONS... NAME -- sh -c SCRIPT
  std::vector<std::string> sh_args(const std::string& name, const std::string& script,
                                   std::vector<std::string> options = {}) const {
    std::vector<std::string> a = {"-r", redis_->url()};
    a.insert(a.end(), options.begin(), options.end());
    a.insert(a.end(), {name, "--", "sh", "-c", script});
    return a;
  }

  RunResult run(std::vector<std::string> args, EnvList env = {},
                Clock::duration timeout = 30s) const {
    return run_fencerun(std::move(args), spawn_options(std::move(env)), timeout);
  }

  std::unique_ptr<FencerunProcess> start(std::vector<std::string> args, EnvList env = {}) const {
    return std::make_unique<FencerunProcess>(std::move(args), spawn_options(std::move(env)));
  }

  // Waits for a pid file written by a child command; the pid is SIGKILLed at teardown if it still
  // runs, so a failing test leaves nothing behind.
  pid_t wait_pid(std::string_view name, Clock::duration timeout = 10s) {
    auto p = wait_for_pid_file(file(name), timeout);
    if (!p) throw std::runtime_error("no pid in " + file(name).string() + " within deadline");
    cleanup_pids_.push_back(*p);
    return *p;
  }

  std::string wait_line(std::string_view name, Clock::duration timeout = 10s) const {
    auto l = wait_for_line(file(name), timeout);
    if (!l) throw std::runtime_error("no line in " + file(name).string() + " within deadline");
    return *l;
  }

  // Waits until the lock key for `name` exists; returns its value.
  std::string wait_lock(const std::string& name, Clock::duration timeout = 10s,
                        std::string_view prefix = "fencerun:") {
    std::optional<std::string> v;
    wait_until([&] { return (v = redis_->get(lock_key(name, prefix))).has_value(); }, timeout);
    if (!v) throw std::runtime_error("lock key " + lock_key(name, prefix) + " never appeared");
    return *v;
  }

  void touch(std::string_view name) const { write_file(file(name), ""); }

 private:
  std::unique_ptr<RedisServer> redis_;
  TempDir dir_{"work"};
  std::vector<pid_t> cleanup_pids_;
};

inline bool is_hex(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789abcdefABCDEF") == std::string_view::npos;
}

inline std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A JSON value that should hold an integer, written either as a number or as a decimal string.
inline std::optional<long long> json_int(const Json* j) {
  if (!j) return std::nullopt;
  if (auto v = j->as_int()) return v;
  if (auto s = j->as_string()) return parse_ll(*s);
  return std::nullopt;
}

// Tokens are server time in microseconds or more: 2023-11 is 1.7e15; below 2^53.
inline constexpr long long kMinPlausibleToken = 1'700'000'000'000'000LL;
inline constexpr long long kMaxSafeToken = (1LL << 53) - 1;

}  // namespace fencerun::test
