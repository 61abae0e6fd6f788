// `fencerun fence redis`: its kit for the guard suite (guard_suite_test.cpp), and what only this guard
// has, against a real redis-server: reply printing, EVAL fallback, limits, passwords, a request
// delayed in the network, the owner-checked release against a bare DEL, and the CLI contract.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <mutex>
#include <thread>

#include "fence_harness.hpp"
#include "util/fd.hpp"

namespace fencerun::test::fence {
namespace {

const char* redis_cli() { return FENCE_TEST_REDIS_CLI; }

bool redis_cli_usable() { return std::string(redis_cli()).size() > 0 && ::access(redis_cli(), X_OK) == 0; }

// The Redis guard in the common scenarios: `fence redis -- SET {LOCK}:data DATA` against the lab's
// server (the one holding the leases, as in production), the control a plain SET with redis-cli.
class RedisKit : public Kit {
 public:
  RedisKit(RedisServer& redis, std::string lock) : m_redis(redis), m_lock(std::move(lock)) {}
  std::string name() const override { return "redis"; }
  std::optional<std::string> owners_unavailable() const override {
    if (redis_cli_usable()) return std::nullopt;
    return "redis-cli not found: the unguarded control writes need it";
  }
  // FENCERUN_REDIS_URL and FENCERUN_LOCK come from fencerun: the resource defaults to the lock name.
  std::string guarded_body() const override {
    return "  \"$FENCERUN\" fence redis -- SET \"$FENCE_DATA_KEY\" \"$DATA\" > /dev/null";
  }
  std::string plain_body() const override {
    return "  \"$REDIS_CLI\" -h 127.0.0.1 -p \"$FENCE_REDIS_PORT\" SET \"$FENCE_CONTROL_KEY\" \"$DATA\" > /dev/null";
  }
  std::optional<std::string> guarded_value() const override { return m_redis.get(data_key()); }
  std::optional<std::string> control_value() const override { return m_redis.get(control_key()); }
  std::optional<long long> recorded_token() const override {
    auto v = m_redis.get(fence_key());
    if (!v) return std::nullopt;
    return parse_ll(*v);
  }
  EnvList env() const override {
    return {{"FENCE_DATA_KEY", data_key()},
            {"FENCE_CONTROL_KEY", control_key()},
            {"FENCE_REDIS_PORT", std::to_string(m_redis.port())},
            {"REDIS_CLI", redis_cli()}};
  }
  std::string data_key() const { return "{" + m_lock + "}:data"; }
  std::string control_key() const { return "{" + m_lock + "}:control"; }
  std::string fence_key() const { return "fencerun:{" + m_lock + "}:fence"; }

  std::unique_ptr<Process> start_write(const Token& token, const std::string& data) override {
    std::vector<std::string> args = {"fence", "redis", "--resource", m_lock};
    SpawnOptions so;
    so.env.emplace_back("FENCERUN_REDIS_URL", m_redis.url());
    add_cli_token(token, args, so.env);
    args.insert(args.end(), {"--", "SET", data_key(), data});
    return std::make_unique<FencerunProcess>(std::move(args), std::move(so));
  }
  GuardResult finish(Process& writer) const override { return finish_cli(writer); }
  std::string stale_message(long long stale, long long accepted) const override {
    return "fencerun: stale token " + std::to_string(stale) + " rejected for " + fence_key() +
           ": it has accepted " + std::to_string(accepted);
  }
  std::vector<Token> malformed_tokens() const override { return cli_malformed_tokens(); }
  void expect_nothing_written() const override {
    EXPECT_FALSE(m_redis.exists(data_key()));
    EXPECT_FALSE(m_redis.exists(fence_key()));
  }
  void describe_on_failure() const override {
    std::cout << "--- redis-server log ---\n" << m_redis.log() << std::endl;
  }
  unsigned rounds_seed() const override { return 20240612u; }

 private:
  RedisServer& m_redis;
  std::string m_lock;
};

const bool g_redis_kit =
    register_kit("redis", [](Lab& lab) { return std::make_unique<RedisKit>(lab.redis(), lab.lock()); });

RunResult fence_redis(const RedisServer& redis, std::vector<std::string> args, EnvList env = {}) {
  args.insert(args.begin(), {"fence", "redis"});
  env.emplace_back("FENCERUN_REDIS_URL", redis.url());
  SpawnOptions so;
  so.env = std::move(env);
  return run_fencerun(std::move(args), so, 30s);
}

#define REQUIRE_REDIS_CLI()                                                                 \
  do {                                                                                      \
    if (!redis_cli_usable()) GTEST_SKIP() << "redis-cli not found: the unguarded control writes need it"; \
  } while (0)

TEST(FenceRedis, ComparesRunsAndRecordsInOneScript) {
  RedisServer redis;
  auto r = fence_redis(redis, {"--resource", "orders", "--token", "10", "--", "SET", "{orders}:x", "a b"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "OK\n");
  EXPECT_EQ(redis.get("fencerun:{orders}:fence"), "10");

  // (Stale, equal and malformed tokens: GuardSuite.*/redis.) Replies print like redis-cli;
  // FENCERUN_LOCK names the resource.
  r = fence_redis(redis, {"--", "GET", "{orders}:x"}, {{"FENCERUN_TOKEN", "10"}, {"FENCERUN_LOCK", "orders"}});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "\"a b\"\n");
  r = fence_redis(redis, {"--resource", "orders", "--token", "11", "--", "MGET", "{orders}:x", "{orders}:none"});
  EXPECT_EQ(r.out, "1) \"a b\"\n2) (nil)\n") << r;
  r = fence_redis(redis, {"--resource", "orders", "--token", "11", "INCR", "{orders}:n"});  // no `--` needed
  EXPECT_EQ(r.out, "(integer) 1\n") << r;
  EXPECT_EQ(redis.get("fencerun:{orders}:fence"), "11");

  // Arguments arrive byte for byte (no option parsing after `--`).
  r = fence_redis(redis, {"--resource", "orders", "--token", "11", "--", "SET", "{orders}:y", "[%s] a,b --token 1"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(redis.get("{orders}:y"), "[%s] a,b --token 1");

  // An error reply of CMD: printed, exit 1, and the token is not recorded.
  r = fence_redis(redis, {"--resource", "orders", "--token", "12", "--", "LPUSH", "{orders}:x", "v"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_NE(r.err.find("WRONGTYPE"), std::string::npos) << r;
  EXPECT_EQ(redis.get("fencerun:{orders}:fence"), "11");

  // --key-prefix moves the fence key.
  r = fence_redis(redis, {"--key-prefix", "app:", "--resource", "orders", "--token", "3", "--", "PING"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "PONG\n");
  EXPECT_EQ(redis.get("app:{orders}:fence"), "3");
}

TEST(FenceRedis, FallsBackToEvalAfterScriptFlush) {
  RedisServer redis;
  ASSERT_TRUE(redis.cmd({"SCRIPT", "FLUSH"}).ok());
  auto r = fence_redis(redis, {"--resource", "r", "--token", "5", "--", "SET", "{r}:k", "v"});
  EXPECT_EQ(r.exit_code, 0) << r;
  ASSERT_TRUE(redis.cmd({"SCRIPT", "FLUSH"}).ok());
  r = fence_redis(redis, {"--resource", "r", "--token", "4", "--", "SET", "{r}:k", "w"});
  EXPECT_EQ(r.exit_code, 77) << r;
  EXPECT_EQ(redis.get("{r}:k"), "v");
}

// (A missing or malformed token: GuardSuite.RefusesAMalformedTokenAndWritesNothing/redis.)
TEST(FenceRedis, RefusesBadUsageAndReportsAnUnreachableServerAsUnavailable) {
  RedisServer redis;
  EXPECT_EQ(fence_redis(redis, {"--token", "5", "--", "PING"}).exit_code, 64) << "no resource";
  EXPECT_EQ(fence_redis(redis, {"--resource", "a{b", "--token", "5", "--", "PING"}).exit_code, 64);
  EXPECT_EQ(fence_redis(redis, {"--resource", "r", "--token", "5"}).exit_code, 64) << "no CMD";
  EXPECT_EQ(fence_redis(redis, {"--resource", "r", "--token", "5", "--bogus", "--", "PING"}).exit_code, 64);
  EXPECT_EQ(fence_redis(redis, {"--resource", "r", "--token", "5", "--timeout", "soon", "--", "PING"}).exit_code, 64);

  auto r = fence_redis(redis, {"-r", "redis://127.0.0.1:" + std::to_string(unused_port()), "--resource", "r",
                               "--token", "5", "--timeout", "500ms", "--", "PING"});
  EXPECT_EQ(r.exit_code, 69) << r;
  // A fence key that does not hold a token is a failing resource, not an accept.
  ASSERT_TRUE(redis.cmd({"SET", "fencerun:{bad}:fence", "zz"}).ok());
  r = fence_redis(redis, {"--resource", "bad", "--token", "5", "--", "SET", "{bad}:k", "v"});
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(redis.exists("{bad}:k"));
}

// `fence redis --resource r --token 5 -- RPUSH {r}:l 2 3 ...`: a CMD of `words` words.
std::vector<std::string> rpush_args(std::size_t words) {
  std::vector<std::string> a = {"--resource", "r", "--token", "5", "--", "RPUSH", "{r}:l"};
  for (std::size_t i = 2; i < words; ++i) a.push_back(std::to_string(i));
  return a;
}

// The script hands CMD to redis.pcall through Lua's unpack(), which returns at most 7998 values in
// the Lua inside Redis: a longer CMD is refused before anything is sent, as a usage error.
TEST(FenceRedis, CommandAboveTheScriptArgumentLimitIsAUsageErrorAndNothingIsSent) {
  RedisServer redis;
  for (std::size_t words : {std::size_t{10000}, std::size_t{7999}}) {
    SCOPED_TRACE(words);
    auto r = fence_redis(redis, rpush_args(words));
    EXPECT_EQ(r.exit_code, 64) << r.err;
    EXPECT_EQ(split_lines(trim(r.err)).size(), 1u) << r.err;
    EXPECT_NE(r.err.find("CMD has " + std::to_string(words) + " words"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("at most 7998"), std::string::npos) << r.err;
  }
  Reply stats = redis.cmd({"INFO", "commandstats"});
  ASSERT_TRUE(stats.ok()) << stats.describe();
  EXPECT_EQ(stats.str.find("cmdstat_eval"), std::string::npos) << "nothing may reach Redis\n" << stats.str;
  EXPECT_FALSE(redis.exists("{r}:l"));
  EXPECT_FALSE(redis.exists("fencerun:{r}:fence"));

  // The limit itself works.
  auto r = fence_redis(redis, rpush_args(7998));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "(integer) 7996\n");
  EXPECT_EQ(redis.get("fencerun:{r}:fence"), "5");
}

TEST(FenceRedis, TakesThePasswordFromTheEnvironment) {
  RedisOptions o;
  o.password = "s3cret";
  RedisServer redis(o);
  auto r = fence_redis(redis, {"--resource", "r", "--token", "5", "--", "PING"});
  EXPECT_EQ(r.exit_code, 69) << r;
  r = fence_redis(redis, {"--resource", "r", "--token", "5", "--", "PING"}, {{"FENCERUN_REDIS_PASSWORD", "s3cret"}});
  EXPECT_EQ(r.exit_code, 0) << r;
  r = fence_redis(redis, {"--resource", "r", "--token", "5", "--", "PING"}, {{"REDISCLI_AUTH", "s3cret"}});
  EXPECT_EQ(r.exit_code, 0) << r;
  r = fence_redis(redis, {"-r", redis.url_with_password(), "--resource", "r", "--token", "5", "--", "PING"},
                  {{"REDISCLI_AUTH", "wrong"}});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err.find("s3cret"), std::string::npos);
}

// A TCP proxy in front of Redis that holds what the client sends until released: a request issued
// while the lease was valid that reaches the server late.
class HoldingProxy {
 public:
  explicit HoldingProxy(int upstream_port) : m_upstream(upstream_port) {
    m_listen.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(m_listen.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    for (int attempt = 0; attempt < 20; ++attempt) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      m_port = pick_free_port();
      a.sin_port = htons(static_cast<uint16_t>(m_port));
      if (::bind(m_listen.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
      m_port = 0;
    }
    if (m_port == 0 || ::listen(m_listen.get(), 4) != 0) throw std::runtime_error("proxy: cannot listen");
    m_thread = std::thread([this] { run(); });
  }
  ~HoldingProxy() {
    m_stop = true;
    m_thread.join();
  }
  int port() const { return m_port; }
  std::size_t held() {
    std::lock_guard<std::mutex> g(m_mu);
    return m_buffer.size();
  }
  void release() { m_holding = false; }

 private:
  static bool send_all(int fd, const char* p, std::size_t n) {
    while (n > 0) {
      ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }
  void run() {
    UniqueFd client;
    while (!m_stop && !client) {
      pollfd p{m_listen.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) client.reset(::accept4(m_listen.get(), nullptr, nullptr, SOCK_CLOEXEC));
    }
    if (!client) return;
    UniqueFd up(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(m_upstream));
    if (::connect(up.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    char buf[65536];
    while (!m_stop) {
      pollfd p[2] = {{client.get(), POLLIN, 0}, {up.get(), POLLIN, 0}};
      ::poll(p, 2, 5);
      if (p[0].revents) {
        ssize_t n = ::recv(client.get(), buf, sizeof buf, 0);
        if (n <= 0) return;
        std::lock_guard<std::mutex> g(m_mu);
        m_buffer.append(buf, static_cast<std::size_t>(n));
      }
      if (p[1].revents) {
        ssize_t n = ::recv(up.get(), buf, sizeof buf, 0);
        if (n <= 0 || !send_all(client.get(), buf, static_cast<std::size_t>(n))) return;
      }
      if (!m_holding) {
        std::lock_guard<std::mutex> g(m_mu);
        if (!m_buffer.empty() && !send_all(up.get(), m_buffer.data(), m_buffer.size())) return;
        m_buffer.clear();
      }
    }
  }

  int m_upstream;
  int m_port = 0;
  UniqueFd m_listen;
  std::atomic<bool> m_stop{false};
  std::atomic<bool> m_holding{true};
  std::mutex m_mu;
  std::string m_buffer;
  std::thread m_thread;
};

// A's write is sent while A holds the lease but reaches Redis only after A's lease expired and B
// wrote (held in a proxy, as a slow network would): the script rejects it.
TEST(FenceRedis, DelayedRequestIsRejected) {
  REQUIRE_REDIS_CLI();
  Lab lab("fence-redis-delayed");
  RedisKit kit(lab.redis(), lab.lock());
  HoldingProxy proxy(lab.redis().port());
  SpawnOptions so;
  so.env = kit.env();
  so.env.emplace_back("FENCERUN", fencerun_path());
  so.env.emplace_back("PROXY_URL", "redis://127.0.0.1:" + std::to_string(proxy.port()));
  so.cwd = lab.dir().path();
  const std::string script =
      "echo \"$FENCERUN_TOKEN\" > a.token\n"
      "\"$FENCERUN\" fence redis -r \"$PROXY_URL\" --timeout 60s -- SET \"$FENCE_DATA_KEY\" \"a $FENCERUN_TOKEN\"\n"
      "echo $? > a.rc\n"
      "sleep 1000\n";
  FencerunProcess a({"-r", lab.redis().url(), "-t", "300ms", lab.lock(), "--", "sh", "-c", script}, so);
  auto a_token = wait_for_line(lab.file("a.token"), 10s);
  ASSERT_TRUE(a_token) << a.result();
  // The request has left A (it sits in the proxy) while A's lease is still valid.
  ASSERT_TRUE(wait_until([&] { return proxy.held() > 0; }, 10s)) << a.result();
  ASSERT_TRUE(lab.lock_value().has_value()) << "A's lease should still be valid when its request is sent";
  pause_owner(a.pid());  // A's fencerun stops renewing
  ASSERT_TRUE(lab.wait_lock_free(10s));

  Owner b(lab, kit, "b", "10s", "5s");
  b.wait_started();
  ASSERT_EQ(b.write(), 0) << b.result();
  ASSERT_EQ(kit.guarded_value(), b.data(0));

  proxy.release();
  auto rc = wait_for_line(lab.file("a.rc"), 20s);
  ASSERT_TRUE(rc) << a.result();
  EXPECT_EQ(*rc, "77") << a.result();
  EXPECT_EQ(kit.guarded_value(), b.data(0)) << "B's data must be intact";
  EXPECT_EQ(kit.recorded_token(), b.token());
  // The control: the same late SET without the guard.
  ASSERT_TRUE(lab.redis().cmd({"SET", kit.control_key(), b.data(0)}).ok());
  ASSERT_TRUE(lab.redis().cmd({"SET", kit.control_key(), "a " + *a_token}).ok());
  EXPECT_EQ(kit.control_value(), "a " + *a_token);
  resume_owner(a.pid());
  EXPECT_TRUE(a.wait_for_exit(10s).has_value());
  EXPECT_EQ(b.finish(), 0) << b.result();
}

// Release: an expired owner that releases with a bare DEL deletes the next owner's lock; fencerun's
// owner-checked release does not.
TEST(FenceRedis, ExpiredOwnerReleaseKeepsTheNewOwnersLockUnlikeBareDel) {
  REQUIRE_REDIS_CLI();
  Lab lab("fence-release");
  RedisKit kit(lab.redis(), lab.lock());
  const std::string lock = lock_key(lab.lock());

  // fencerun's release.
  {
    Owner a(lab, kit, "a", "300ms");
    a.wait_started();
    a.freeze();
    ASSERT_TRUE(lab.wait_lock_free(10s));
    Owner b(lab, kit, "b", "10s", "5s");
    b.wait_started();
    auto b_value = lab.lock_value();
    ASSERT_TRUE(b_value);
    a.thaw_command();
    a.thaw_fencerun();
    ASSERT_TRUE(a.wait_exit().has_value()) << "A must exit once it notices its lease is gone";
    EXPECT_EQ(lab.lock_value(), b_value) << "fencerun's release deleted the new owner's lock\n" << a.result();
    EXPECT_EQ(b.finish(), 0) << b.result();
    EXPECT_FALSE(lab.lock_value().has_value()) << "B releases its own lock";
  }
  // The control: the same expired owner releasing with a bare DEL.
  {
    SpawnOptions so;
    so.env = kit.env();
    so.cwd = lab.dir().path();
    so.env.emplace_back("LOCK_KEY", lock);
    const std::string script =
        "echo $$ > c.pid; echo \"$FENCERUN_TOKEN\" > c.token\n"
        "while [ ! -e c.go ]; do sleep 0.005; done\n"
        "\"$REDIS_CLI\" -h 127.0.0.1 -p \"$FENCE_REDIS_PORT\" DEL \"$LOCK_KEY\" > c.del\n"
        "sleep 1000\n";
    FencerunProcess c({"-r", lab.redis().url(), "-t", "300ms", lab.lock(), "--", "sh", "-c", script}, so);
    ASSERT_TRUE(wait_for_line(lab.file("c.token"), 10s)) << c.result();
    auto cpid = wait_for_pid_file(lab.file("c.pid"), 10s);
    ASSERT_TRUE(cpid);
    auto pgid = process_group(*cpid);
    ASSERT_TRUE(pgid);
    pause_owner(c.pid());
    ::kill(-*pgid, SIGSTOP);
    ASSERT_TRUE(lab.wait_lock_free(10s));
    Owner d(lab, kit, "d", "10s", "5s");
    d.wait_started();
    ASSERT_TRUE(lab.lock_value());
    write_file(lab.file("c.go"), "");
    ::kill(-*pgid, SIGCONT);
    auto del = wait_for_line(lab.file("c.del"), 10s);
    ASSERT_TRUE(del);
    EXPECT_EQ(*del, "1") << "the bare DEL removed a key";
    EXPECT_FALSE(lab.lock_value().has_value()) << "a bare DEL by the expired owner deletes the new owner's lock";
    resume_owner(c.pid());
    ::kill(-*pgid, SIGKILL);
    c.wait_for_exit(10s);
    // D's lock was deleted under it: D's run reports the lost lease instead of a silent success.
    EXPECT_EQ(d.finish(), 124);
  }
}

}  // namespace
}  // namespace fencerun::test::fence
