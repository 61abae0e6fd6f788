// redis::Error::maybe_executed for failures that happen before any request byte is written, and the
// resolver's deadline. Nothing here needs a Redis server (see tests/deploy/client_errors_test.cpp
// for failures after the request was written).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "backends/redis/url.hpp"
#include "backends/redis/client.hpp"

namespace fencerun::redis {
namespace {

using namespace std::chrono_literals;

redis::RedisEndpoint endpoint(const std::string& url) {
  auto ep = redis::parse_redis_url(url);
  EXPECT_TRUE(ep.has_value()) << url;
  return ep.value_or(redis::RedisEndpoint{});
}

// A loopback port below 32768 that nothing listens on (bound, then closed).
int refused_port() {
  for (int port = 20000 + static_cast<int>(::getpid() % 5000);; ++port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return port;
  }
}

TEST(redis_error, is_not_executed_unless_said_otherwise) {
  Error e{Error::Kind::connection, "x"};
  EXPECT_FALSE(e.maybe_executed);
}

TEST(redis_error, connect_refused_was_not_executed) {
  Client c(endpoint("redis://127.0.0.1:" + std::to_string(refused_port())));
  auto r = c.command({"INCR", "k"}, BootClock::now() + 1s);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, Error::Kind::connection);
  EXPECT_FALSE(r.error().maybe_executed) << r.error().message;
  EXPECT_NE(r.error().message.find("Connection refused"), std::string::npos) << r.error().message;
}

TEST(redis_error, missing_unix_socket_was_not_executed) {
  Client c(endpoint("unix:///nonexistent/fencerun-test/redis.sock"));
  auto r = c.command({"INCR", "k"}, BootClock::now() + 1s);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, Error::Kind::connection);
  EXPECT_FALSE(r.error().maybe_executed);
}

TEST(redis_error, sentinel_discovery_failure_was_not_executed_and_names_each_sentinel) {
  const std::string a = std::to_string(refused_port());
  Client c(endpoint("redis+sentinel://127.0.0.1:" + a + "/mymaster"));
  auto r = c.command({"INCR", "k"}, BootClock::now() + 1s);
  ASSERT_FALSE(r.has_value());
  EXPECT_FALSE(r.error().maybe_executed);
  EXPECT_EQ(r.error().message.rfind("no sentinel answered for master 'mymaster' (127.0.0.1:" + a + ": ", 0), 0u)
      << r.error().message;
}

TEST(redis_error, resolution_with_no_time_left_is_a_timeout_naming_the_host) {
  Client c(endpoint("redis://localhost:6379"));
  auto r = c.command({"PING"}, BootClock::now());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, Error::Kind::timeout);
  EXPECT_EQ(r.error().message, "resolving localhost timed out");
  EXPECT_FALSE(r.error().maybe_executed);
}

TEST(redis_error, unknown_host_was_not_executed) {
  // Either the resolver says no in time or the deadline ends the lookup: never sent.
  Client c(endpoint("redis://fencerun-test.invalid:6379"));
  auto r = c.command({"PING"}, BootClock::now() + 300ms);
  ASSERT_FALSE(r.has_value());
  EXPECT_FALSE(r.error().maybe_executed);
  EXPECT_NE(r.error().message.find("fencerun-test.invalid"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace fencerun::redis
