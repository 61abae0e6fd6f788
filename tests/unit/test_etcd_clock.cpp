// The one-clock check of --every and --min-interval on etcd: a member's clock as its reply's HTTP Date
// shows it (to the second), and when this host's clock is surely further from it than the bound.
#include <gtest/gtest.h>

#include <chrono>

#include "backends/etcd/client.hpp"

using fencerun::etcd::clock_apart_us;
using fencerun::etcd::http_date_seconds;
using fencerun::etcd::MemberClock;
using namespace std::chrono_literals;

TEST(etcd_clock, reads_the_date_servers_send) {
  EXPECT_EQ(http_date_seconds("Thu, 01 Jan 1970 00:00:00 GMT"), 0);
  EXPECT_EQ(http_date_seconds("Sun, 06 Nov 1994 08:49:37 GMT"), 784111777);
  EXPECT_EQ(http_date_seconds("Sat, 05 Dec 2026 10:14:38 GMT"), 1796465678);
  EXPECT_EQ(http_date_seconds("Tue, 29 Feb 2028 23:59:59 GMT"), 1835481599);
  // Not IMF-fixdate, or not a date: nothing (the check is then not made).
  EXPECT_FALSE(http_date_seconds("Sunday, 06-Nov-94 08:49:37 GMT"));
  EXPECT_FALSE(http_date_seconds("Sun Nov  6 08:49:37 1994"));
  EXPECT_FALSE(http_date_seconds("Sun, 06 Nov 1994 08:49:37 UTC"));
  EXPECT_FALSE(http_date_seconds("Sun, 31 Nov 1994 08:49:37 GMT"));
  EXPECT_FALSE(http_date_seconds("Sun, 06 Foo 1994 08:49:37 GMT"));
  EXPECT_FALSE(http_date_seconds("Sun, 06 Nov 1994 24:49:37 GMT"));
  EXPECT_FALSE(http_date_seconds(""));
}

TEST(etcd_clock, refuses_only_a_clock_surely_further_than_the_bound) {
  constexpr std::int64_t s = 1'000'000;
  const std::int64_t date = 1796465678;
  // Sent and received (this host's clock) around a member time in [date, date + 1 s).
  const auto at = [&](double sent_s, double received_s) {
    return MemberClock{0, date, date * s + static_cast<std::int64_t>(sent_s * s),
                       date * s + static_cast<std::int64_t>(received_s * s)};
  };
  // In step, or within what the second's resolution and the round trip leave open.
  EXPECT_FALSE(clock_apart_us(at(0.2, 0.21), 2s));
  EXPECT_FALSE(clock_apart_us(at(2.9, 3.0), 2s));    // up to 2.9 s ahead if the member read date + 0.99 s
  EXPECT_FALSE(clock_apart_us(at(-2.0, -1.9), 2s));  // 2 s behind at most
  EXPECT_FALSE(clock_apart_us(at(-10, 10), 2s));     // a round trip of 20 s tells nothing
  // Surely ahead or behind by more than 2 s: refused, with the middle of both windows.
  auto ahead = clock_apart_us(at(60.5, 60.5), 2s);
  ASSERT_TRUE(ahead);
  EXPECT_EQ(*ahead, 60 * s);
  EXPECT_TRUE(clock_apart_us(at(3.1, 3.2), 2s));
  auto behind = clock_apart_us(at(-59.5, -59.4), 2s);
  ASSERT_TRUE(behind);
  EXPECT_EQ(*behind, -59'950'000);
  EXPECT_TRUE(clock_apart_us(at(-2.1, -2.05), 2s));
}
