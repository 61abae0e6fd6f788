// redis::Error::maybe_executed against a real redis-server, with a TcpProxy in between to break the
// connection at the chosen moment: a failure after the request was written says it may have run
// (and the server shows it did), a failure before says it did not (and the server shows it did not).
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "backends/redis/url.hpp"
#include "backends/redis/client.hpp"
#include "support/redis_server.hpp"
#include "support/tcp_proxy.hpp"

namespace fencerun::test {
namespace {

redis::RedisEndpoint endpoint(const std::string& url) {
  auto ep = redis::parse_redis_url(url);
  if (!ep) throw std::runtime_error(url + ": " + ep.error());
  return *ep;
}

std::string via(const TcpProxy& proxy, const std::string& rest = "") {
  return "redis://127.0.0.1:" + std::to_string(proxy.port()) + rest;
}

redis::Result<redis::Reply> incr(redis::Client& c, std::chrono::milliseconds timeout = 2000ms) {
  return c.command({"INCR", "counter"}, BootClock::now() + timeout);
}

TEST(ClientErrors, PassThroughProxyForwardsRequestsAndReplies) {
  RedisServer redis;
  TcpProxy proxy(redis.port());
  redis::Client c(endpoint(via(proxy)));
  auto r = incr(c);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->integer, 1);
  EXPECT_EQ(proxy.connections(), 1);
}

TEST(ClientErrors, ResetAfterTheRequestWasWrittenMayHaveExecuted) {
  RedisServer redis;
  TcpProxy proxy(redis.port());
  redis::Client c(endpoint(via(proxy)));
  ASSERT_TRUE(c.command({"PING"}, BootClock::now() + 2000ms).has_value());
  proxy.set_mode(TcpProxy::Mode::reset_after_request);
  auto r = incr(c);
  ASSERT_FALSE(r.has_value());
  std::cout << "[ reset ] " << redis::to_string(r.error().kind) << ": " << r.error().message
            << " (maybe_executed " << r.error().maybe_executed << ")\n";
  EXPECT_EQ(r.error().kind, redis::Error::Kind::connection) << r.error().message;
  EXPECT_TRUE(r.error().maybe_executed) << r.error().message;
  EXPECT_EQ(proxy.resets(), 1);
  EXPECT_EQ(redis.get("counter"), "1") << "the request did run: the flag must say so";
}

TEST(ClientErrors, TimeoutAfterTheRequestWasWrittenMayHaveExecuted) {
  RedisServer redis;
  TcpProxy proxy(redis.port());
  proxy.set_mode(TcpProxy::Mode::delay_replies, 1500ms);
  redis::Client c(endpoint(via(proxy)));
  const auto began = BootClock::now();
  auto r = incr(c, 300ms);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(BootClock::now() - began);
  ASSERT_FALSE(r.has_value());
  std::cout << "[ delayed ] " << redis::to_string(r.error().kind) << ": " << r.error().message << " after "
            << took.count() << " ms (maybe_executed " << r.error().maybe_executed << ")\n";
  EXPECT_EQ(r.error().kind, redis::Error::Kind::timeout);
  EXPECT_TRUE(r.error().maybe_executed);
  EXPECT_LT(took, 1000ms);
  EXPECT_EQ(redis.get("counter"), "1");
}

TEST(ClientErrors, ResetDuringTheHandshakeWasNotExecuted) {
  // SELECT 1 goes out before the request; the reset hits it, so INCR never left the client.
  RedisServer redis;
  TcpProxy proxy(redis.port());
  proxy.set_mode(TcpProxy::Mode::reset_after_request);
  redis::Client c(endpoint(via(proxy, "/1")));
  auto r = incr(c);
  ASSERT_FALSE(r.has_value());
  EXPECT_FALSE(r.error().maybe_executed) << r.error().message;
  EXPECT_EQ(proxy.resets(), 1);
  EXPECT_EQ(redis.dbsize(), 0) << "nothing ran in db 0";
  Reply in_db1 = redis.cmd({"EVAL", "redis.call('SELECT', 1) return redis.call('DBSIZE')", "0"});
  EXPECT_EQ(in_db1.integer, 0) << in_db1.describe();
}

TEST(ClientErrors, RefusedPasswordWasNotExecuted) {
  RedisOptions o;
  o.password = "right-password";
  RedisServer redis(o);
  redis::Client c(endpoint("redis://:wrong-password@127.0.0.1:" + std::to_string(redis.port())));
  auto r = incr(c);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, redis::Error::Kind::auth);
  EXPECT_FALSE(r.error().maybe_executed);
  EXPECT_EQ(r.error().message.find("wrong-password"), std::string::npos) << "the password is never in a message";
  EXPECT_FALSE(redis.exists("counter"));
}

TEST(ClientErrors, MissingPasswordWasNotExecuted) {
  RedisOptions o;
  o.password = "right-password";
  RedisServer redis(o);
  redis::Client c(endpoint("redis://127.0.0.1:" + std::to_string(redis.port())));
  auto r = incr(c);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, redis::Error::Kind::auth) << r.error().message;
  EXPECT_FALSE(r.error().maybe_executed) << "NOAUTH: refused, not run";
  EXPECT_EQ(r.error().message, "the server requires a password: set it in the URL or in $FENCERUN_REDIS_PASSWORD");
  EXPECT_FALSE(redis.exists("counter"));
}

TEST(ClientErrors, MissingPasswordForALongCommandSaysWhereToSetIt) {
  // Before AUTH, Redis answers a command of more than 10 arguments with "ERR Protocol error:
  // unauthenticated multibulk length" and closes the connection; fencerun's scripts are such commands.
  RedisOptions o;
  o.password = "right-password";
  RedisServer redis(o);
  redis::Client c(endpoint("redis://127.0.0.1:" + std::to_string(redis.port())));
  std::vector<std::string_view> eval = {"EVAL", "return redis.call('INCR', KEYS[1])", "1", "counter"};
  for (int i = 0; i < 12; ++i) eval.push_back("arg");
  std::vector<std::vector<std::string_view>> commands = {eval, {"PING"}};
  auto r = c.pipeline(commands, BootClock::now() + 2000ms);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, redis::Error::Kind::auth) << r.error().message;
  EXPECT_EQ(r.error().message, "the server requires a password: set it in the URL or in $FENCERUN_REDIS_PASSWORD");
  EXPECT_FALSE(r.error().maybe_executed) << "refused, not run";
  EXPECT_FALSE(redis.exists("counter"));
}

TEST(ClientErrors, RefusedPasswordSaysItWasRefused) {
  RedisOptions o;
  o.password = "right-password";
  RedisServer redis(o);
  redis::Client c(endpoint("redis://:refused-password@127.0.0.1:" + std::to_string(redis.port())));
  auto r = incr(c);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, redis::Error::Kind::auth);
  EXPECT_EQ(r.error().message,
            "the server refused the password (WRONGPASS invalid username-password pair or user is disabled.)");
  EXPECT_FALSE(r.error().maybe_executed);
}

TEST(ClientErrors, TlsHandshakeWithAPlainRedisTimesOutSayingTryRedis) {
  // A plain redis-server never answers a ClientHello: the handshake runs into the deadline, and the
  // message says what the silence most likely means.
  RedisServer redis;
  redis::Client c(endpoint("rediss://127.0.0.1:" + std::to_string(redis.port())));
  const auto began = BootClock::now();
  auto r = c.command({"PING"}, BootClock::now() + 300ms);
  ASSERT_FALSE(r.has_value());
  EXPECT_LT(BootClock::now() - began, 2s);
  EXPECT_EQ(r.error().kind, redis::Error::Kind::timeout);
  EXPECT_FALSE(r.error().maybe_executed);
  EXPECT_EQ(r.error().message,
            "TLS handshake timed out with no answer from the server: it may not speak TLS on this port (try redis://)");
}

TEST(ClientErrors, StoppedServerTimesOutWithTheRequestMaybeExecuted) {
  RedisServer redis;
  redis::Client c(endpoint(redis.url()));
  ASSERT_TRUE(c.command({"PING"}, BootClock::now() + 2000ms).has_value());
  redis.freeze();
  auto r = incr(c, 300ms);
  redis.thaw();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, redis::Error::Kind::timeout);
  EXPECT_TRUE(r.error().maybe_executed);
  EXPECT_TRUE(wait_until([&] { return redis.get("counter") == "1"; }, 5s, 10ms))
      << "the server ran the request once it woke up";
}

}  // namespace
}  // namespace fencerun::test
