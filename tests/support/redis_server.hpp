#pragma once
// A real redis-server owned by the test: its own port (below 32768), unix socket and temp dir,
// no persistence, killed by pid. A tiny synchronous client (hiredis) checks server state.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/process.hpp"
#include "support/util.hpp"

struct redisContext;
struct redisReply;

namespace fencerun::test {

// The redis-server the tests start: the one CMake found at configure time, else the first
// redis-server on PATH when the test runs; nullopt when there is none.
const std::optional<std::string>& find_redis_server();
// The program of the server under test (support/server_under_test.hpp): that one by default, the
// server matrix's one when FENCERUN_TEST_SERVER_ID is set. Without one, the running test is skipped
// ("redis-server not found: install redis-server"): every server a test starts asks for it, so a
// test that needs one skips and a test that does not runs. Works from a fixture's constructor,
// SetUp or the test body, at any depth.
const std::string& redis_server_program();
// Skips the running test with `why` from any depth (GTEST_SKIP only returns from the function it is
// in): records the skip, then throws the exception GoogleTest takes as "already reported".
[[noreturn]] void skip_current_test(const std::string& why);

struct Reply {
  enum class Type { None, Nil, Status, Error, Integer, String, Array };
  Type type = Type::None;  // None: no reply (connect failed, timed out, I/O error); `str` says why
  std::string str;
  long long integer = 0;
  std::vector<Reply> elements;

  bool ok() const { return type != Type::None && type != Type::Error; }
  bool is_nil() const { return type == Type::Nil; }
  std::string describe() const;
};

// A hiredis reply as a Reply (a null reply gives type None).
Reply to_reply(const redisReply* r);
// One command on an open hiredis connection; type None, with the connection's error, when no reply
// came back.
Reply send_command(redisContext* c, const std::vector<std::string>& args);

struct RedisOptions {
  std::optional<std::string> password;  // --requirepass
  std::vector<std::string> extra_args;
  EnvList env{};  // added to the server's environment (e.g. LD_PRELOAD of a clock shim)
};

class RedisServer {
 public:
  explicit RedisServer(RedisOptions opts = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  pid_t pid() const;
  const std::filesystem::path& dir() const { return dir_->path(); }
  std::string socket_path() const;
  std::string url() const;                // redis://127.0.0.1:PORT (no credentials)
  std::string url_with_password() const;  // redis://:PASSWORD@127.0.0.1:PORT
  std::string unix_url() const;           // unix:///DIR/redis.sock
  const std::optional<std::string>& password() const { return opts_.password; }

  void freeze();  // SIGSTOP; returns once /proc shows the process stopped
  void thaw();    // SIGCONT
  bool frozen() const { return frozen_; }
  void stop();     // SIGKILL and reap: all data is gone (no persistence)
  void start();    // on the same port and socket; waits for PING
  void restart();  // stop() + start()
  // The environment of the next start(); a restart with another one is the same server (port,
  // socket, directory) with e.g. another clock.
  void set_env(EnvList env) { opts_.env = std::move(env); }
  bool running() const { return proc_ != nullptr; }

  // One command on a fresh connection, AUTH first when a password is set.
  Reply cmd(const std::vector<std::string>& args,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) const;
  std::optional<std::string> get(const std::string& key) const;  // nullopt: missing key
  bool exists(const std::string& key) const;
  long long pttl(const std::string& key) const;  // -2 missing, -1 no expiry
  long long dbsize() const;
  std::vector<std::string> keys() const;  // KEYS *
  long long time_us() const;              // TIME as microseconds
  std::string log() const;                // the server's log file

 private:
  bool try_start_once(std::string* why);
  bool ping_until_ready(std::string* why);

  RedisOptions opts_;
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Process> proc_;
  int port_ = 0;
  bool frozen_ = false;
};

std::string lock_key(std::string_view name, std::string_view prefix = "fencerun:");
std::string token_key(std::string_view name, std::string_view prefix = "fencerun:");

// The lock value "<owner> <token> <pid> <host>", parsed; nullopt when it does not have 4 fields.
struct LockValue {
  std::string owner;
  long long token = 0;
  long long pid = 0;
  std::string host;
};
std::optional<LockValue> parse_lock_value(std::string_view v);

}  // namespace fencerun::test
