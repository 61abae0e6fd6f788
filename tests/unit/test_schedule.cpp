#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "config/config.hpp"
#include "lease/timing.hpp"
#include "util/clock.hpp"

using fencerun::Deadline;
using fencerun::config::LeaseTiming;
using fencerun::lease::LeaseSchedule;
using std::chrono::milliseconds;

namespace {

Deadline at(std::int64_t ms) { return Deadline{milliseconds(ms)}; }

LeaseSchedule schedule_for(milliseconds ttl, std::optional<milliseconds> renew = std::nullopt,
                           std::optional<milliseconds> grace = std::nullopt) {
  auto timing = LeaseTiming::make(ttl, renew, grace);
  EXPECT_TRUE(timing.has_value()) << (timing ? "" : timing.error());
  return LeaseSchedule(timing.value_or(LeaseTiming{}));
}

// ms since the clock's epoch, for readable failure messages.
std::int64_t ms_of(Deadline d) { return std::chrono::duration_cast<milliseconds>(d.time_since_epoch()).count(); }

}  // namespace

TEST(lease_schedule, keeps_its_timing) {
  auto s = schedule_for(milliseconds(30'000));
  EXPECT_EQ(s.timing().ttl, milliseconds(30'000));
  EXPECT_EQ(s.timing().renew, milliseconds(10'000));
}

TEST(lease_schedule, ends_the_lease_ttl_minus_drift_after_the_request_was_sent) {
  auto s = schedule_for(milliseconds(30'000));
  EXPECT_EQ(s.deadline_after(at(1'000)), at(30'698));
  EXPECT_EQ(s.deadline_after(at(0)), at(29'698));
}

TEST(lease_schedule, stops_the_command_grace_plus_margin_before_the_deadline) {
  auto s = schedule_for(milliseconds(30'000));
  EXPECT_EQ(s.stop_at(at(30'698)), at(25'598));
}

TEST(lease_schedule, kills_the_command_margin_before_the_deadline) {
  auto s = schedule_for(milliseconds(30'000));
  EXPECT_EQ(s.stop_points().kill_at(at(30'698)), at(30'598));
}

TEST(lease_schedule, renews_every_renew_interval) {
  auto s = schedule_for(milliseconds(30'000));
  EXPECT_EQ(s.next_renewal(at(1'000)), at(11'000));
  auto fast = schedule_for(milliseconds(30'000), milliseconds(2'500));
  EXPECT_EQ(fast.next_renewal(at(1'000)), at(3'500));
}

TEST(lease_schedule, follows_the_shortest_ttl) {
  auto s = schedule_for(milliseconds(100));  // renew 33, grace 16, drift 3, margin 5
  Deadline deadline = s.deadline_after(at(1'000));
  EXPECT_EQ(deadline, at(1'097));
  EXPECT_EQ(s.stop_at(deadline), at(1'076));
  EXPECT_EQ(s.stop_points().kill_at(deadline), at(1'092));
  EXPECT_EQ(s.next_renewal(at(1'000)), at(1'033));
}

TEST(lease_schedule, backs_off_retries_from_50ms_to_one_second) {
  auto s = schedule_for(milliseconds(3'600'000));
  Deadline now = at(10'000);
  Deadline deadline = s.deadline_after(now);
  std::vector<std::int64_t> waits;
  for (int failures = 1; failures <= 9; ++failures) waits.push_back(ms_of(s.retry_at(now, failures, deadline)) - 10'000);
  EXPECT_EQ(waits, (std::vector<std::int64_t>{50, 100, 200, 400, 800, 1'000, 1'000, 1'000, 1'000}));
}

TEST(lease_schedule, retries_after_50ms_for_a_nonpositive_failure_count) {
  auto s = schedule_for(milliseconds(30'000));
  Deadline deadline = s.deadline_after(at(0));
  EXPECT_EQ(s.retry_at(at(1'000), 0, deadline), at(1'050));
  EXPECT_EQ(s.retry_at(at(1'000), -3, deadline), at(1'050));
}

TEST(lease_schedule, never_backs_off_beyond_one_second_for_huge_failure_counts) {
  auto s = schedule_for(milliseconds(3'600'000));
  Deadline deadline = s.deadline_after(at(0));
  EXPECT_EQ(s.retry_at(at(5'000), 1'000, deadline), at(6'000));
  EXPECT_EQ(s.retry_at(at(5'000), 2'000'000'000, deadline), at(6'000));
}

TEST(lease_schedule, never_retries_later_than_the_stop_point) {
  auto s = schedule_for(milliseconds(30'000));
  Deadline deadline = s.deadline_after(at(0));  // 29698ms; stop at 24598ms
  EXPECT_EQ(s.retry_at(at(24'000), 6, deadline), at(24'598));
  EXPECT_EQ(s.retry_at(at(24'560), 1, deadline), at(24'598));
  EXPECT_EQ(s.retry_at(at(24'548), 1, deadline), at(24'598));
  EXPECT_EQ(s.retry_at(at(24'547), 1, deadline), at(24'597));
}

TEST(lease_schedule, retries_at_once_when_the_stop_point_has_passed) {
  auto s = schedule_for(milliseconds(30'000));
  Deadline deadline = s.deadline_after(at(0));
  EXPECT_EQ(s.retry_at(at(26'000), 1, deadline), at(24'598));
}

TEST(lease_schedule, bounds_a_request_by_the_timeout) {
  auto s = schedule_for(milliseconds(30'000));
  Deadline deadline = s.deadline_after(at(0));
  EXPECT_EQ(s.request_deadline(at(10'000), milliseconds(2'000), deadline), at(12'000));
}

TEST(lease_schedule, bounds_a_request_by_the_stop_point) {
  auto s = schedule_for(milliseconds(30'000));
  Deadline deadline = s.deadline_after(at(0));  // stop at 24598ms
  EXPECT_EQ(s.request_deadline(at(23'000), milliseconds(2'000), deadline), at(24'598));
  EXPECT_EQ(s.request_deadline(at(22'598), milliseconds(2'000), deadline), at(24'598));
  EXPECT_EQ(s.request_deadline(at(22'597), milliseconds(2'000), deadline), at(24'597));
}

TEST(lease_schedule, keeps_its_invariants_for_many_timings) {
  std::vector<std::int64_t> ttls;
  for (std::int64_t ms = 100; ms <= 1'000; ms += 1) ttls.push_back(ms);
  for (std::int64_t ms = 1'001; ms <= 3'600'000; ms = ms * 11 / 10 + 3) ttls.push_back(ms);
  ttls.push_back(3'600'000);
  int checked = 0;
  for (std::int64_t ttl_ms : ttls) {
    milliseconds ttl(ttl_ms);
    const std::optional<milliseconds> renews[] = {std::nullopt, milliseconds(1), ttl / 3};
    const std::optional<milliseconds> graces[] = {std::nullopt, milliseconds(0), ttl / 6};
    for (auto renew : renews) {
      for (auto grace : graces) {
        auto timing = LeaseTiming::make(ttl, renew, grace);
        ASSERT_TRUE(timing.has_value()) << ttl_ms << ": " << timing.error();
        LeaseSchedule s(*timing);
        for (std::int64_t sent_ms : {0LL, 1LL, 123'456'789LL, 86'400'000'000LL}) {
          Deadline sent = at(sent_ms);
          Deadline deadline = s.deadline_after(sent);
          Deadline stop = s.stop_at(deadline);
          Deadline kill = s.stop_points().kill_at(deadline);
          SCOPED_TRACE(testing::Message() << "ttl " << ttl_ms << "ms renew " << timing->renew.count() << "ms grace "
                                          << timing->grace.count() << "ms sent " << sent_ms << "ms");
          // The server-side expiry is sent + ttl at the earliest; fencerun's deadline comes before it.
          ASSERT_LT(deadline, sent + ttl);
          // SIGKILL lands before the deadline, and exactly grace after the stop signal.
          ASSERT_LT(kill, deadline);
          ASSERT_EQ(stop + timing->grace, kill);
          ASSERT_LE(stop, kill);
          // The stop point is in the future when the lease is fresh, and after the first renewal is due,
          // so a healthy renewal always comes before the command is stopped.
          ASSERT_GT(stop, sent);
          ASSERT_LT(s.next_renewal(sent), stop);
          // Retries and requests never outlast the stop point.
          for (int failures : {1, 3, 6, 20}) {
            ASSERT_LE(s.retry_at(s.next_renewal(sent), failures, deadline), stop);
            ASSERT_GT(s.retry_at(s.next_renewal(sent), failures, deadline), s.next_renewal(sent));
          }
          ASSERT_LE(s.request_deadline(s.next_renewal(sent), milliseconds(2'000), deadline), stop);
          ASSERT_LE(s.request_deadline(sent, milliseconds(2'000), deadline), sent + milliseconds(2'000));
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 30'000);
}
