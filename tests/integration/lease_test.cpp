// The lease interface on its own, against a real redis-server: what acquire() hands back, what a
// HeldLease does on every way out, and how a wait ends. The fencerun binary's behaviour on top of it
// is tested in the other suites.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "backends/redis/url.hpp"
#include "backends/redis/redis_lease.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"

namespace fencerun::test {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

// Sleeps as asked; after `calls_before_signal` sleeps, reports `signal` as having ended the next one.
class CountingWaiter final : public lease::Waiter {
 public:
  explicit CountingWaiter(int calls_before_signal = -1, int signal = SIGINT)
      : m_left(calls_before_signal), m_signal(signal) {}
  std::optional<int> sleep_until(Deadline wake, int fd, bool& woken) override {
    ++calls;
    if (m_left == 0) return m_signal;
    if (m_left > 0) --m_left;
    auto left = std::chrono::duration_cast<milliseconds>(wake - BootClock::now());
    pollfd p{fd, POLLIN, 0};
    if (left > 0ms && ::poll(&p, fd >= 0 ? 1 : 0, static_cast<int>(left.count())) > 0) woken = true;
    return std::nullopt;
  }
  std::atomic<int> calls{0};

 private:
  int m_left;
  int m_signal;
};

class LeaseTest : public ::testing::Test {
 protected:
  lease::RedisLeaseTarget target(const std::string& url) const {
    auto endpoint = redis::parse_redis_url(url);
    EXPECT_TRUE(endpoint.has_value());
    return {endpoint.value_or(redis::RedisEndpoint{}), url, "fencerun:"};
  }
  lease::LeaseRequest request(const std::string& name, milliseconds ttl = 5000ms,
                              std::optional<milliseconds> wait = 0ms, bool fair = false) const {
    lease::LeaseRequest r;
    r.lock = name;
    r.owner = "owner-" + std::to_string(++m_owners) + "-" + std::to_string(::getpid());
    r.pid = ::getpid();
    r.host = "test-host";
    r.timing = lease::LeaseTiming::make(ttl, std::nullopt, std::nullopt).value();
    r.wait = wait;
    r.fair = fair;
    return r;
  }
  std::unique_ptr<lease::Lease> lease_for(const std::string& name, milliseconds ttl = 5000ms,
                                          std::optional<milliseconds> wait = 0ms, bool fair = false) {
    return lease::make_redis_lease(target(redis.url()), request(name, ttl, wait, fair));
  }

  RedisServer redis;
  mutable int m_owners = 0;
};

TEST_F(LeaseTest, AcquireHandsBackATokenAndDroppingTheHeldLeaseReleasesIt) {
  auto lease = lease_for("drop");
  CountingWaiter waiter;
  milliseconds waited{-1};
  auto held = lease->acquire(waiter, waited);
  ASSERT_TRUE(held.has_value());
  EXPECT_GT((*held)->token(), 0u);
  EXPECT_GE(waited, 0ms);
  auto value = parse_lock_value(redis.get(lock_key("drop")).value_or(""));
  ASSERT_TRUE(value.has_value());
  EXPECT_EQ(static_cast<std::uint64_t>(value->token), (*held)->token());
  held->reset();  // no release() call: the destructor does it
  EXPECT_FALSE(redis.exists(lock_key("drop")));
}

TEST_F(LeaseTest, FactsNameTheTokenTheLockAndAUrlWithoutPassword) {
  auto lease = lease_for("facts");
  CountingWaiter waiter;
  milliseconds waited{};
  auto held = lease->acquire(waiter, waited);
  ASSERT_TRUE(held.has_value());
  std::map<std::string, std::string> facts;
  for (auto& [k, v] : (*held)->facts()) facts[k] = v;
  EXPECT_EQ(facts["FENCERUN_TOKEN"], std::to_string((*held)->token()));
  EXPECT_EQ(facts["FENCERUN_LOCK"], "facts");
  EXPECT_EQ(facts["FENCERUN_TTL_MS"], "5000");
  EXPECT_EQ(facts["FENCERUN_REDIS_URL"], redis.url());
  EXPECT_FALSE(facts["FENCERUN_OWNER"].empty());
}

TEST_F(LeaseTest, ASecondOwnerIsToldBusyWithoutWaiting) {
  auto first = lease_for("busy");
  auto second = lease_for("busy");
  CountingWaiter waiter;
  milliseconds waited{};
  auto held = first->acquire(waiter, waited);
  ASSERT_TRUE(held.has_value());
  auto refused = second->acquire(waiter, waited);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().reason, lease::NotAcquired::Reason::busy);
  EXPECT_EQ(waiter.calls, 0);
}

TEST_F(LeaseTest, AWaiterGetsTheLockWhenTheHolderReleasesWithAGreaterToken) {
  auto first = lease_for("handover");
  CountingWaiter waiter;
  milliseconds waited{};
  auto held = first->acquire(waiter, waited);
  ASSERT_TRUE(held.has_value());
  const auto first_token = (*held)->token();
  std::uint64_t second_token = 0;
  std::thread other([&] {
    auto second = lease_for("handover", 5000ms, 10'000ms);
    CountingWaiter w;
    milliseconds waited2{};
    auto got = second->acquire(w, waited2);
    if (got) second_token = (*got)->token();
  });
  // Queued: it joins the queue only once it listens on its own channel.
  const bool queued = wait_until([&] { return redis.cmd({"ZCARD", "fencerun:{handover}:queue"}).integer == 1; }, 5s);
  EXPECT_TRUE(queued);
  EXPECT_EQ((*held)->release(), lease::HeldLease::Released::yes);
  other.join();
  EXPECT_GT(second_token, first_token);
}

TEST_F(LeaseTest, ASignalEndsTheWaitAndAFairWaiterLeavesTheQueue) {
  auto first = lease_for("signal");
  CountingWaiter waiter;
  milliseconds waited{};
  auto held = first->acquire(waiter, waited);
  ASSERT_TRUE(held.has_value());
  auto second = lease_for("signal", 5000ms, std::nullopt, true);
  // The first sleep comes after the waiter joined the queue (a try, the subscription, a try that joins).
  CountingWaiter interrupting(0, SIGTERM);
  auto refused = second->acquire(interrupting, waited);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().reason, lease::NotAcquired::Reason::interrupted);
  EXPECT_EQ(refused.error().signal, SIGTERM);
  EXPECT_EQ(redis.cmd({"ZCARD", "fencerun:{signal}:queue"}).integer, 0);
  EXPECT_TRUE(redis.exists(lock_key("signal")));  // the holder's lock is untouched
}

TEST_F(LeaseTest, NoServerMeansUnavailable) {
  const std::string url = "redis://127.0.0.1:" + std::to_string(unused_port());
  auto lease = lease::make_redis_lease(target(url), request("nobody"));
  CountingWaiter waiter;
  milliseconds waited{};
  auto refused = lease->acquire(waiter, waited);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().reason, lease::NotAcquired::Reason::unavailable);
}

TEST_F(LeaseTest, AKeptLeaseOutlivesItsTtlAndReportsLossAtOnce) {
  auto lease = lease_for("keep", 300ms);
  CountingWaiter waiter;
  milliseconds waited{};
  auto held = lease->acquire(waiter, waited);
  ASSERT_TRUE(held.has_value());
  std::atomic<int> renewed{0};
  (*held)->keep([&](Deadline) { ++renewed; });
  ASSERT_GE((*held)->wake_fd(), 0);
  ASSERT_TRUE(wait_until([&] { return renewed >= 3; }, 5s));  // three renewals: past the 300ms TTL
  EXPECT_TRUE(redis.exists(lock_key("keep")));
  EXPECT_FALSE((*held)->lost());
  EXPECT_GT((*held)->deadline(), BootClock::now());
  redis.cmd({"SET", lock_key("keep"), "someone-else 1 1 host"});
  pollfd p{(*held)->wake_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  EXPECT_TRUE((*held)->lost());
  (*held)->stop_keeping();
  EXPECT_GE((*held)->stats().renewals, 3u);
  EXPECT_EQ((*held)->release(), lease::HeldLease::Released::not_ours);
  EXPECT_EQ(redis.get(lock_key("keep")).value_or(""), "someone-else 1 1 host");  // never another's lock
}

}  // namespace
}  // namespace fencerun::test
