#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "util/duration.hpp"

using fencerun::util::format_duration;
using fencerun::util::parse_duration;
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

TEST(duration, parses_decimal_fractions) {
  EXPECT_EQ(parsed("0.5s"), milliseconds(500));
  EXPECT_EQ(parsed("1.5s"), milliseconds(1'500));
  EXPECT_EQ(parsed("0.25m"), milliseconds(15'000));
  EXPECT_EQ(parsed("1.5h"), milliseconds(5'400'000));
  EXPECT_EQ(parsed("0.001s"), milliseconds(1));
  EXPECT_EQ(parsed("0.050s"), milliseconds(50));
  EXPECT_EQ(parsed("2.0ms"), milliseconds(2));
}

TEST(duration, reads_a_bare_decimal_number_as_seconds) {
  EXPECT_EQ(parsed("0.5"), milliseconds(500));
  EXPECT_EQ(parsed("2.25"), milliseconds(2'250));
  EXPECT_EQ(parsed("0.0"), milliseconds(0));
}

TEST(duration, ignores_trailing_zeros_of_a_fraction) {
  EXPECT_EQ(parsed("1.50000000000000000000000000s"), milliseconds(1'500));
  EXPECT_EQ(parsed("0.1000000h"), milliseconds(360'000));
  EXPECT_EQ(parsed("3.000ms"), milliseconds(3));
}

TEST(duration, accepts_the_finest_fraction_of_an_hour) {
  // 7 digits is as fine as a whole number of milliseconds gets: 0.0000025h is 9ms.
  EXPECT_EQ(parsed("0.0000025h"), milliseconds(9));
}

TEST(duration, parses_compounds_largest_unit_first) {
  EXPECT_EQ(parsed("2m30s"), milliseconds(150'000));
  EXPECT_EQ(parsed("1h30m"), milliseconds(5'400'000));
  EXPECT_EQ(parsed("1m0.5s"), milliseconds(60'500));
  EXPECT_EQ(parsed("1s500ms"), milliseconds(1'500));
  EXPECT_EQ(parsed("1h2m3s4ms"), milliseconds(3'723'004));
  EXPECT_EQ(parsed("1h0m0s0ms"), milliseconds(3'600'000));
  EXPECT_EQ(parsed("1h15s"), milliseconds(3'615'000));
  EXPECT_EQ(parsed("1.5h30m"), milliseconds(7'200'000));
  EXPECT_EQ(parsed("90m90s"), milliseconds(5'490'000));
}

TEST(duration, applies_a_sign_to_the_whole_compound) {
  EXPECT_EQ(parsed("-1m30s"), milliseconds(-90'000));
  EXPECT_EQ(parsed("-0.5"), milliseconds(-500));
  EXPECT_EQ(parsed("+1.5s"), milliseconds(1'500));
  EXPECT_EQ(parsed("+2m30s"), milliseconds(150'000));
}

TEST(duration, rejects_a_fraction_without_a_leading_digit) {
  EXPECT_EQ(error_of(".5s"), "'.5s' needs a digit before the decimal point (as in 0.5s)");
  EXPECT_EQ(error_of(".5"), "'.5' needs a digit before the decimal point (as in 0.5s)");
  EXPECT_EQ(error_of("-.5s"), "'-.5s' needs a digit before the decimal point (as in 0.5s)");
  EXPECT_EQ(error_of("1s.5ms"), "'1s.5ms' needs a digit before the decimal point (as in 0.5s)");
}

TEST(duration, rejects_a_decimal_point_without_digits_after_it) {
  EXPECT_EQ(error_of("1."), "'1.' needs a digit after the decimal point");
  EXPECT_EQ(error_of("1.s"), "'1.s' needs a digit after the decimal point");
  EXPECT_EQ(error_of("1..5s"), "'1..5s' needs a digit after the decimal point");
  EXPECT_EQ(error_of("1m2.s"), "'1m2.s' needs a digit after the decimal point");
}

TEST(duration, rejects_a_second_decimal_point) {
  EXPECT_EQ(error_of("1.5.5s"), "'1.5.5s' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  EXPECT_EQ(error_of("1.2.3"), "'1.2.3' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
}

TEST(duration, rejects_values_that_are_not_whole_milliseconds) {
  EXPECT_EQ(error_of("0.0001s"), "'0.0001s' is not a whole number of milliseconds");
  EXPECT_EQ(error_of("1.5ms"), "'1.5ms' is not a whole number of milliseconds");
  EXPECT_EQ(error_of("0.0005"), "'0.0005' is not a whole number of milliseconds");
  EXPECT_EQ(error_of("0.00001m"), "'0.00001m' is not a whole number of milliseconds");
  EXPECT_EQ(error_of("0.0000001h"), "'0.0000001h' is not a whole number of milliseconds");
  EXPECT_EQ(error_of("1s0.5ms"), "'1s0.5ms' is not a whole number of milliseconds");
  EXPECT_EQ(error_of("0.00000001h"), "'0.00000001h' is not a whole number of milliseconds");
  EXPECT_EQ(error_of("1.0000000000000000000001s"), "'1.0000000000000000000001s' is not a whole number of milliseconds");
}

TEST(duration, rejects_units_out_of_order) {
  EXPECT_EQ(error_of("1s2m"), "'1s2m' has its units out of order (largest first, as in 1h30m, 2m30s, 1s500ms)");
  EXPECT_EQ(error_of("500ms1s"), "'500ms1s' has its units out of order (largest first, as in 1h30m, 2m30s, 1s500ms)");
  EXPECT_EQ(error_of("30m1h"), "'30m1h' has its units out of order (largest first, as in 1h30m, 2m30s, 1s500ms)");
}

TEST(duration, rejects_a_repeated_unit) {
  EXPECT_EQ(error_of("1s1s"), "'1s1s' repeats the unit 's'");
  EXPECT_EQ(error_of("1m30s1m"), "'1m30s1m' has its units out of order (largest first, as in 1h30m, 2m30s, 1s500ms)");
  EXPECT_EQ(error_of("5ms5ms"), "'5ms5ms' repeats the unit 'ms'");
  EXPECT_EQ(error_of("1h1h"), "'1h1h' repeats the unit 'h'");
}

TEST(duration, rejects_a_compound_ending_without_a_unit) {
  EXPECT_EQ(error_of("1m30"), "'1m30' needs a unit after its last number (use ms, s, m or h)");
  EXPECT_EQ(error_of("1h0.5"), "'1h0.5' needs a unit after its last number (use ms, s, m or h)");
}

TEST(duration, rejects_spaces_anywhere) {
  EXPECT_EQ(error_of("1m 30s"), "'1m 30s' has an unknown unit 'm ' (use ms, s, m or h)");
  EXPECT_EQ(error_of("0.5 s"), "'0.5 s' has an unknown unit ' s' (use ms, s, m or h)");
  EXPECT_EQ(error_of(" 0.5"), "' 0.5' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  EXPECT_EQ(error_of("0.5 "), "'0.5 ' has an unknown unit ' ' (use ms, s, m or h)");
  EXPECT_EQ(error_of("- 5s"), "'- 5s' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
}

TEST(duration, rejects_other_signs_and_notations) {
  EXPECT_EQ(error_of("--5s"), "'--5s' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  EXPECT_EQ(error_of("+-5s"), "'+-5s' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  EXPECT_EQ(error_of("1m-30s"), "'1m-30s' has an unknown unit 'm-' (use ms, s, m or h)");
  EXPECT_EQ(error_of("1e3s"), "'1e3s' has an unknown unit 'e' (use ms, s, m or h)");
  EXPECT_EQ(error_of("1,5s"), "'1,5s' has an unknown unit ',' (use ms, s, m or h)");
  EXPECT_EQ(error_of("s"), "'s' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  EXPECT_EQ(error_of("inf"), "'inf' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  EXPECT_EQ(error_of("1m30x"), "'1m30x' has an unknown unit 'x' (use ms, s, m or h)");
}

TEST(duration, rejects_numbers_that_overflow) {
  EXPECT_EQ(error_of("99999999999999999999.5s"), "'99999999999999999999.5s' is too large");
  EXPECT_EQ(error_of("1h99999999999999999999ms"), "'1h99999999999999999999ms' is too large");
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
  // The cap holds for the sum of a compound and for a fraction too.
  EXPECT_EQ(parsed(std::to_string(k_century_h - 1) + "h59m59.999s"), milliseconds(k_century_h * 3'600'000 - 1));
  EXPECT_EQ(parsed(std::to_string(k_century_h - 1) + "h60m"), milliseconds(k_century_h * 3'600'000));
  EXPECT_EQ(error_of(std::to_string(k_century_h) + "h1ms"), "'876000h1ms' is too large");
  EXPECT_EQ(error_of(std::to_string(k_century_h) + ".001h"), "'876000.001h' is too large");
  EXPECT_EQ(parsed("-" + std::to_string(k_century_h) + "h"), milliseconds(-k_century_h * 3'600'000));
  EXPECT_EQ(error_of("-" + std::to_string(k_century_h) + "h0.001s"), "'-876000h0.001s' is too large");
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

TEST(duration, parses_what_the_documentation_shows) {
  // man/fencerun.1.adoc, README.md and --help name these.
  EXPECT_EQ(parsed("500ms"), milliseconds(500));
  EXPECT_EQ(parsed("30s"), milliseconds(30'000));
  EXPECT_EQ(parsed("1.5s"), milliseconds(1'500));
  EXPECT_EQ(parsed("2m30s"), milliseconds(150'000));
  EXPECT_EQ(parsed("1h"), milliseconds(3'600'000));
  EXPECT_EQ(parsed("0.5"), milliseconds(500));
}
