#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "config/duration.hpp"

using fencerun::config::format_duration;
using fencerun::config::parse_duration;
using std::chrono::milliseconds;

namespace {

milliseconds parsed(const std::string& text) {
  auto d = parse_duration(text);
  EXPECT_TRUE(d.has_value()) << text << ": " << (d ? "" : d.error());
  return d.value_or(milliseconds(-424242));
}

std::string error_of(const std::string& text) {
  auto d = parse_duration(text);
  EXPECT_FALSE(d.has_value()) << text << " parsed as " << (d ? d->count() : 0) << "ms";
  return d ? std::string() : d.error();
}

}  // namespace

TEST(duration, parses_milliseconds) {
  EXPECT_EQ(parsed("500ms"), milliseconds(500));
  EXPECT_EQ(parsed("1ms"), milliseconds(1));
  EXPECT_EQ(parsed("0ms"), milliseconds(0));
}

TEST(duration, parses_seconds) {
  EXPECT_EQ(parsed("30s"), milliseconds(30'000));
  EXPECT_EQ(parsed("1s"), milliseconds(1'000));
}

TEST(duration, parses_minutes) {
  EXPECT_EQ(parsed("5m"), milliseconds(300'000));
}

TEST(duration, parses_hours) {
  EXPECT_EQ(parsed("1h"), milliseconds(3'600'000));
  EXPECT_EQ(parsed("24h"), milliseconds(86'400'000));
}

TEST(duration, reads_a_bare_integer_as_seconds) {
  EXPECT_EQ(parsed("7"), milliseconds(7'000));
  EXPECT_EQ(parsed("0"), milliseconds(0));
}

TEST(duration, keeps_leading_zeros_decimal) {
  EXPECT_EQ(parsed("010s"), milliseconds(10'000));
}

TEST(duration, parses_negative_values_as_negative) {
  // Rejecting them is the caller's job, with the option's name in the message.
  EXPECT_EQ(parsed("-5s"), milliseconds(-5'000));
  EXPECT_EQ(parsed("-1"), milliseconds(-1'000));
  EXPECT_EQ(parsed("-250ms"), milliseconds(-250));
}

TEST(duration, rejects_empty_text) {
  EXPECT_EQ(error_of(""), "empty duration");
}

TEST(duration, rejects_text_without_digits) {
  EXPECT_EQ(error_of("abc"), "'abc' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  EXPECT_EQ(error_of("ms"), "'ms' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  EXPECT_EQ(error_of("-"), "'-' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  EXPECT_EQ(error_of(" 5s"), "' 5s' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
}

TEST(duration, rejects_unknown_units) {
  EXPECT_EQ(error_of("5x"), "'5x' has an unknown unit 'x' (use ms, s, m or h)");
  EXPECT_EQ(error_of("5sec"), "'5sec' has an unknown unit 'sec' (use ms, s, m or h)");
  EXPECT_EQ(error_of("5S"), "'5S' has an unknown unit 'S' (use ms, s, m or h)");
  EXPECT_EQ(error_of("5 s"), "'5 s' has an unknown unit ' s' (use ms, s, m or h)");
  EXPECT_EQ(error_of("5d"), "'5d' has an unknown unit 'd' (use ms, s, m or h)");
  EXPECT_EQ(error_of("5s "), "'5s ' has an unknown unit 's ' (use ms, s, m or h)");
}

TEST(duration, rejects_fractions) {
  EXPECT_EQ(error_of("1.5s"), "'1.5s' has an unknown unit '.5s' (use ms, s, m or h)");
}

TEST(duration, rejects_compound_durations) {
  EXPECT_EQ(error_of("1m30s"), "'1m30s' has an unknown unit 'm30s' (use ms, s, m or h)");
}

TEST(duration, rejects_numbers_that_overflow) {
  EXPECT_EQ(error_of("99999999999999999999"), "'99999999999999999999' is too large");
  EXPECT_EQ(error_of("9223372036854775807ms"), "'9223372036854775807ms' is too large");
  EXPECT_EQ(error_of("9223372036854775807h"), "'9223372036854775807h' is too large");
  EXPECT_EQ(error_of("-99999999999999999999s"), "'-99999999999999999999s' is too large");
}

TEST(duration, accepts_one_hundred_years_and_no_more) {
  constexpr long long k_century_h = 100LL * 365 * 24;
  EXPECT_EQ(parsed(std::to_string(k_century_h) + "h"), milliseconds(k_century_h * 3'600'000));
  EXPECT_EQ(error_of(std::to_string(k_century_h + 1) + "h"), "'876001h' is too large");
  EXPECT_EQ(parsed(std::to_string(k_century_h * 3'600'000) + "ms"), milliseconds(k_century_h * 3'600'000));
}

TEST(duration, formats_whole_hours_minutes_and_seconds) {
  EXPECT_EQ(format_duration(milliseconds(3'600'000)), "1h");
  EXPECT_EQ(format_duration(milliseconds(7'200'000)), "2h");
  EXPECT_EQ(format_duration(milliseconds(300'000)), "5m");
  EXPECT_EQ(format_duration(milliseconds(60'000)), "1m");
  EXPECT_EQ(format_duration(milliseconds(30'000)), "30s");
  EXPECT_EQ(format_duration(milliseconds(90'000)), "90s");
  EXPECT_EQ(format_duration(milliseconds(5'400'000)), "90m");
}

TEST(duration, formats_other_values_in_milliseconds) {
  EXPECT_EQ(format_duration(milliseconds(1'500)), "1500ms");
  EXPECT_EQ(format_duration(milliseconds(302)), "302ms");
  EXPECT_EQ(format_duration(milliseconds(1)), "1ms");
}

TEST(duration, formats_zero_as_seconds) {
  EXPECT_EQ(format_duration(milliseconds(0)), "0s");
}

TEST(duration, formats_negative_values_with_a_sign) {
  EXPECT_EQ(format_duration(milliseconds(-30'000)), "-30s");
  EXPECT_EQ(format_duration(milliseconds(-250)), "-250ms");
  EXPECT_EQ(format_duration(milliseconds(-3'600'000)), "-1h");
}

TEST(duration, round_trips_through_format_and_parse) {
  for (long long ms : {1LL, 99LL, 100LL, 999LL, 1'000LL, 1'001LL, 59'999LL, 60'000LL, 61'000LL, 3'599'999LL,
                       3'600'000LL, 86'400'000LL, -1LL, -1'000LL, -60'000LL, -3'600'000LL, 0LL}) {
    auto text = format_duration(milliseconds(ms));
    EXPECT_EQ(parsed(text), milliseconds(ms)) << text;
  }
}
