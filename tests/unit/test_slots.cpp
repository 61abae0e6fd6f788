// Once per schedule slot and per interval (lease/schedule.hpp): slots, the rule text, which run in
// progress a trigger is for, and the record's fire-time field.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include "lease/facts.hpp"
#include "lease/run_record.hpp"
#include "lease/schedule.hpp"

using namespace fencerun::lease;
using std::chrono::milliseconds;

namespace {

constexpr std::uint64_t s(std::uint64_t seconds) { return seconds * 1'000'000; }

TEST(slots, are_periods_from_the_epoch_moved_by_the_offset) {
  const Every hourly{milliseconds(3'600'000), milliseconds(0)};
  EXPECT_EQ(slot_index(s(0), hourly), 0);
  EXPECT_EQ(slot_index(s(3599), hourly), 0);
  EXPECT_EQ(slot_index(s(3600), hourly), 1);
  EXPECT_EQ(slot_start_us(slot_index(s(7300), hourly), hourly), s(7200));
  const Every offset{milliseconds(3'600'000), milliseconds(300'000)};  // :05 past each hour
  EXPECT_EQ(slot_index(s(3600 + 299), offset), 0);
  EXPECT_EQ(slot_index(s(3600 + 300), offset), 1);
  EXPECT_EQ(slot_start_us(1, offset), s(3900));
  // Before the first slot's start: slot -1 (floor, not truncation).
  EXPECT_EQ(slot_index(s(100), offset), -1);
}

TEST(slots, a_realistic_time_is_exact_at_the_boundary) {
  const Every e{milliseconds(6000), milliseconds(0)};
  const std::uint64_t t = 1'796'464'800'000'000;  // a multiple of 6 s
  EXPECT_EQ(slot_index(t - 1, e) + 1, slot_index(t, e));
  EXPECT_EQ(slot_start_us(slot_index(t + 5'999'999, e), e), t);
}

TEST(slots, the_rule_text_names_every_option_that_must_match) {
  const Every e{milliseconds(3'600'000), milliseconds(300'000)};
  EXPECT_EQ(schedule_rule(e, std::nullopt, milliseconds(86'400'000)), "every 3600000 300000 86400000");
  EXPECT_EQ(schedule_rule(std::nullopt, milliseconds(5000), milliseconds(86'400'000)), "interval 5000 86400000");
  EXPECT_EQ(schedule_rule(std::nullopt, std::nullopt, milliseconds(1)), "");
  EXPECT_EQ(schedule_rule_options("every 3600000 300000 86400000"), "--every 1h --slot-offset 5m --records-ttl 24h");
  EXPECT_EQ(schedule_rule_options("every 60000 0 86400000"), "--every 1m --records-ttl 24h");
  EXPECT_EQ(schedule_rule_options("interval 5000 86400000"), "--min-interval 5s --records-ttl 24h");
  EXPECT_EQ(schedule_rule_options("nonsense x"), "nonsense x");
}

TEST(slots, a_run_in_progress_counts_for_a_trigger_of_its_slot_only) {
  const ScheduleRule every{Every{milliseconds(6000), milliseconds(0)}, std::nullopt};
  // Fired in slot 1 (6-12 s), started late in slot 2: it is slot 1's run.
  EXPECT_TRUE(run_counts_for(every, s(13), s(11), s(7)));
  EXPECT_FALSE(run_counts_for(every, s(13), s(11), s(12)));
  // Without a fire time, its start decides.
  EXPECT_TRUE(run_counts_for(every, s(13), std::nullopt, s(12)));
  const ScheduleRule interval{std::nullopt, milliseconds(5000)};
  EXPECT_TRUE(run_counts_for(interval, s(10), std::nullopt, s(14)));
  EXPECT_FALSE(run_counts_for(interval, s(10), std::nullopt, s(15)));
  EXPECT_FALSE(run_counts_for(ScheduleRule{}, s(10), std::nullopt, s(10)));
}

TEST(slots, a_record_carries_its_fire_time_and_older_ones_parse) {
  const std::string old = "100 200 ok 0 - 7 42 host 0.1.0";
  auto r = parse_run_record(old);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->fire_us);
  EXPECT_EQ(fired_us_of(*r), 100u);
  EXPECT_EQ(run_record_line(*r), old);
  auto n = parse_run_record(old + " 90");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->fire_us, 90u);
  EXPECT_EQ(fired_us_of(*n), 90u);
  EXPECT_EQ(run_record_line(*n), old + " 90");
  EXPECT_NE(run_record_json(*n).find("\"fired_us\":90"), std::string::npos);
  EXPECT_FALSE(parse_run_record(old + " x"));
  EXPECT_FALSE(parse_run_record(old + " 90 91"));
}

TEST(slots, the_job_is_told_its_slot_start) {
  JobFacts f;
  f.slot_start_us = s(1'796'464'800);
  const auto env = job_environment(f);
  auto find = [&](const std::string& k) {
    for (const auto& [name, value] : env)
      if (name == k) return value;
    return std::string("(none)");
  };
  EXPECT_EQ(find("FENCERUN_SLOT_START"), "2026-12-05T10:00:00Z");
  EXPECT_EQ(find("FENCERUN_SLOT_START_UNIX"), "1796464800");
  JobFacts none;
  EXPECT_EQ(job_environment(none).size(), env.size() - 2);
}

}  // namespace

namespace {

TEST(slots, already_done_is_a_success_of_the_trigger_slot) {
  const ScheduleRule every{Every{milliseconds(6000), milliseconds(0)}, std::nullopt};
  // Slot 6 (36-42 s): its trigger fired at 37 s, started late at 43.2 s, in slot 7.
  const std::string late_ok = "43200000 43400000 ok 0 - 7 42 h 0.1.0 37000000";
  // A trigger of slot 7 runs: the late success is slot 6's.
  EXPECT_FALSE(already_done(every, s(43), late_ok, {late_ok}));
  // Another trigger of slot 6 is skipped.
  EXPECT_EQ(already_done(every, s(41), late_ok, {late_ok}), late_ok);
  // A trigger of slot 5 that waited: slot 5's success is found among the runs kept.
  const std::string slot5 = "31000000 31100000 ok 0 - 6 42 h 0.1.0 30500000";
  const std::string failed5 = "30100000 30200000 failed 3 - 5 42 h 0.1.0 30000000";
  EXPECT_EQ(already_done(every, s(32), late_ok, {late_ok, slot5, failed5}), slot5);
  // A slot whose only run failed is run again.
  EXPECT_FALSE(already_done(every, s(32), late_ok, {late_ok, failed5}));
  EXPECT_FALSE(already_done(every, s(43), std::nullopt, {}));
}

TEST(slots, already_done_by_interval_is_judged_at_the_fire_time) {
  const ScheduleRule interval{std::nullopt, milliseconds(5000)};
  const std::string ok = "10000000 13500000 ok 0 - 7 42 h 0.1.0";
  EXPECT_EQ(already_done(interval, s(14), ok, {}), ok);
  EXPECT_FALSE(already_done(interval, s(15), ok, {}));
  // A waiter that fired before the success started is skipped by it.
  EXPECT_EQ(already_done(interval, s(9), ok, {}), ok);
}

}  // namespace

namespace {

TEST(slots, status_says_the_slot_and_when_the_next_run_is_allowed) {
  EXPECT_FALSE(parse_schedule_rule(""));
  EXPECT_FALSE(parse_schedule_rule("every 0 0 1"));
  EXPECT_FALSE(parse_schedule_rule("every x 0 1"));
  ASSERT_TRUE(parse_schedule_rule("every 6000 0 86400000"));
  EXPECT_EQ(parse_schedule_rule("interval 5000 86400000")->min_interval, milliseconds(5000));
  const std::string ok = "37000000 37100000 ok 0 - 7 42 h 0.1.0 37000000";  // slot 6 (36-42 s)
  EXPECT_EQ(schedule_status_text("every 6000 0 86400000", s(40), ok),
            "rule: --every 6s --records-ttl 24h\nslot: 1970-01-01T00:00:36Z, succeeded; next slot 1970-01-01T00:00:42Z\n");
  EXPECT_EQ(schedule_status_text("every 6000 0 86400000", s(43), ok),
            "rule: --every 6s --records-ttl 24h\nslot: 1970-01-01T00:00:42Z, not run yet\n");
  EXPECT_EQ(schedule_status_text("interval 5000 86400000", s(40), ok),
            "rule: --min-interval 5s --records-ttl 24h\nnext run allowed: 1970-01-01T00:00:42Z\n");
  EXPECT_EQ(schedule_status_text("interval 5000 86400000", s(43), ok),
            "rule: --min-interval 5s --records-ttl 24h\nnext run allowed: now\n");
  EXPECT_EQ(schedule_status_json("every 6000 0 86400000", s(40), ok),
            ",\"rule\":\"--every 6s --records-ttl 24h\",\"slot_start_us\":36000000,\"done\":true,"
            "\"next_allowed_us\":42000000");
  EXPECT_EQ(schedule_status_text("garbage", s(1), ok), "");
}

}  // namespace
