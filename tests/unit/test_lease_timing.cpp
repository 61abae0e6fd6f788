#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"

using fencerun::config::LeaseTiming;
using std::chrono::milliseconds;

namespace {

LeaseTiming made(milliseconds ttl, std::optional<milliseconds> renew = std::nullopt,
                 std::optional<milliseconds> grace = std::nullopt) {
  auto t = LeaseTiming::make(ttl, renew, grace);
  EXPECT_TRUE(t.has_value()) << ttl.count() << "ms: " << (t ? "" : t.error());
  return t.value_or(LeaseTiming{});
}

std::string error_of(milliseconds ttl, std::optional<milliseconds> renew = std::nullopt,
                     std::optional<milliseconds> grace = std::nullopt) {
  auto t = LeaseTiming::make(ttl, renew, grace);
  EXPECT_FALSE(t.has_value()) << "ttl " << ttl.count() << "ms accepted";
  return t ? std::string() : t.error();
}

// The ttls the grid tests walk: every millisecond up to 2s, then a spread up to one hour.
std::vector<milliseconds> ttl_grid() {
  std::vector<milliseconds> ttls;
  for (std::int64_t ms = 100; ms <= 2'000; ++ms) ttls.emplace_back(ms);
  for (std::int64_t ms = 2'001; ms <= 3'600'000; ms = ms * 21 / 20 + 7) ttls.emplace_back(ms);
  for (std::int64_t ms : {2'999, 3'000, 3'001, 5'999, 6'000, 6'001, 29'999, 30'000, 30'001, 59'999, 60'000,
                          100'000, 299'999, 300'000, 3'599'999, 3'600'000})
    ttls.emplace_back(ms);
  return ttls;
}

}  // namespace

TEST(lease_timing, derives_the_defaults_for_thirty_seconds) {
  auto t = made(milliseconds(30'000));
  EXPECT_EQ(t.ttl, milliseconds(30'000));
  EXPECT_EQ(t.renew, milliseconds(10'000));
  EXPECT_EQ(t.grace, milliseconds(5'000));
  EXPECT_EQ(t.drift, milliseconds(302));
  EXPECT_EQ(t.margin, milliseconds(100));
}

TEST(lease_timing, derives_the_defaults_for_the_shortest_ttl) {
  auto t = made(milliseconds(100));
  EXPECT_EQ(t.renew, milliseconds(33));
  EXPECT_EQ(t.grace, milliseconds(16));
  EXPECT_EQ(t.drift, milliseconds(3));
  EXPECT_EQ(t.margin, milliseconds(5));
}

TEST(lease_timing, derives_the_defaults_for_one_second) {
  auto t = made(milliseconds(1'000));
  EXPECT_EQ(t.renew, milliseconds(333));
  EXPECT_EQ(t.grace, milliseconds(166));
  EXPECT_EQ(t.drift, milliseconds(12));
  EXPECT_EQ(t.margin, milliseconds(50));
}

TEST(lease_timing, caps_the_default_grace_at_five_seconds) {
  auto t = made(milliseconds(3'600'000));
  EXPECT_EQ(t.renew, milliseconds(1'200'000));
  EXPECT_EQ(t.grace, milliseconds(5'000));
  EXPECT_EQ(t.drift, milliseconds(36'002));
  EXPECT_EQ(t.margin, milliseconds(100));
}

TEST(lease_timing, computes_drift_as_one_percent_plus_two_milliseconds) {
  EXPECT_EQ(LeaseTiming::drift_for(milliseconds(100)), milliseconds(3));
  EXPECT_EQ(LeaseTiming::drift_for(milliseconds(199)), milliseconds(3));
  EXPECT_EQ(LeaseTiming::drift_for(milliseconds(200)), milliseconds(4));
  EXPECT_EQ(LeaseTiming::drift_for(milliseconds(30'000)), milliseconds(302));
}

TEST(lease_timing, keeps_the_margin_at_most_one_hundred_milliseconds) {
  EXPECT_EQ(LeaseTiming::margin_for(milliseconds(100)), milliseconds(5));
  EXPECT_EQ(LeaseTiming::margin_for(milliseconds(2'000)), milliseconds(100));
  EXPECT_EQ(LeaseTiming::margin_for(milliseconds(2'019)), milliseconds(100));
  EXPECT_EQ(LeaseTiming::margin_for(milliseconds(1'999)), milliseconds(99));
  EXPECT_EQ(LeaseTiming::margin_for(milliseconds(3'600'000)), milliseconds(100));
}

TEST(lease_timing, keeps_explicit_renew_and_grace) {
  auto t = made(milliseconds(60'000), milliseconds(5'000), milliseconds(2'500));
  EXPECT_EQ(t.renew, milliseconds(5'000));
  EXPECT_EQ(t.grace, milliseconds(2'500));
}

TEST(lease_timing, accepts_zero_grace) {
  EXPECT_EQ(made(milliseconds(30'000), std::nullopt, milliseconds(0)).grace, milliseconds(0));
}

TEST(lease_timing, rejects_ttls_below_one_hundred_milliseconds) {
  EXPECT_EQ(error_of(milliseconds(99)), "--ttl: 99ms is too short (at least 100ms)");
  EXPECT_EQ(error_of(milliseconds(1)), "--ttl: 1ms is too short (at least 100ms)");
}

TEST(lease_timing, rejects_zero_ttl) {
  EXPECT_EQ(error_of(milliseconds(0)), "--ttl: 0s is too short (at least 100ms)");
}

TEST(lease_timing, rejects_negative_ttl) {
  EXPECT_EQ(error_of(milliseconds(-5'000)), "--ttl: -5s is too short (at least 100ms)");
}

TEST(lease_timing, rejects_renew_not_smaller_than_the_ttl) {
  EXPECT_EQ(error_of(milliseconds(30'000), milliseconds(30'000)), "--renew: 30s must be smaller than --ttl 30s");
  EXPECT_EQ(error_of(milliseconds(30'000), milliseconds(45'000)), "--renew: 45s must be smaller than --ttl 30s");
}

TEST(lease_timing, rejects_zero_and_negative_renew) {
  EXPECT_EQ(error_of(milliseconds(30'000), milliseconds(0)), "--renew: must be positive, got 0s");
  EXPECT_EQ(error_of(milliseconds(30'000), milliseconds(-1)), "--renew: must be positive, got -1ms");
}

TEST(lease_timing, rejects_negative_grace) {
  EXPECT_EQ(error_of(milliseconds(30'000), std::nullopt, milliseconds(-1'000)),
            "--grace: must not be negative, got -1s");
}

TEST(lease_timing, rejects_grace_too_large_for_the_ttl) {
  EXPECT_EQ(error_of(milliseconds(30'000), std::nullopt, milliseconds(20'000)),
            "--grace: 20s is too large for --ttl 30s: renew + grace + 100ms margin + 302ms drift must stay "
            "below the ttl (with --renew 10s, at most 19597ms)");
}

TEST(lease_timing, accepts_the_largest_grace_its_error_suggests) {
  EXPECT_EQ(made(milliseconds(30'000), std::nullopt, milliseconds(19'597)).grace, milliseconds(19'597));
  EXPECT_FALSE(LeaseTiming::make(milliseconds(30'000), std::nullopt, milliseconds(19'598)).has_value());
}

TEST(lease_timing, points_at_renew_when_no_grace_would_fit) {
  EXPECT_EQ(error_of(milliseconds(30'000), milliseconds(29'700), milliseconds(0)),
            "--renew: 29700ms is too large for --ttl 30s: renew + grace + 100ms margin + 302ms drift must stay "
            "below the ttl (with --grace 0s, at most 29597ms)");
}

TEST(lease_timing, names_renew_when_only_renew_was_given) {
  // The default grace (5s) is fine; the --renew the user set is what does not fit.
  EXPECT_EQ(error_of(milliseconds(30'000), milliseconds(25'000)),
            "--renew: 25s is too large for --ttl 30s: renew + grace + 100ms margin + 302ms drift must stay "
            "below the ttl (with --grace 5s, at most 24597ms)");
  EXPECT_TRUE(LeaseTiming::make(milliseconds(30'000), milliseconds(24'597), std::nullopt).has_value());
}

TEST(lease_timing, names_grace_when_both_were_given_and_renew_is_within_its_bound) {
  EXPECT_EQ(error_of(milliseconds(30'000), milliseconds(10'000), milliseconds(20'000)),
            "--grace: 20s is too large for --ttl 30s: renew + grace + 100ms margin + 302ms drift must stay "
            "below the ttl (with --renew 10s, at most 19597ms)");
}

TEST(lease_timing, follows_the_documented_rule_at_its_boundary) {
  // Valid exactly when renew + grace + margin + drift < ttl.
  for (std::int64_t ttl_ms : {100, 101, 150, 999, 1'000, 2'000, 30'000, 3'600'000}) {
    milliseconds ttl(ttl_ms);
    milliseconds overhead = LeaseTiming::margin_for(ttl) + LeaseTiming::drift_for(ttl);
    for (milliseconds renew : {milliseconds(1), ttl / 3, ttl / 2, ttl - overhead - milliseconds(1)}) {
      milliseconds largest = ttl - overhead - renew - milliseconds(1);
      if (largest < milliseconds(0)) continue;
      EXPECT_TRUE(LeaseTiming::make(ttl, renew, largest).has_value()) << ttl_ms << " " << renew.count();
      EXPECT_FALSE(LeaseTiming::make(ttl, renew, largest + milliseconds(1)).has_value())
          << ttl_ms << " " << renew.count();
    }
  }
}

TEST(lease_timing, accepts_its_own_defaults_for_every_ttl) {
  for (milliseconds ttl : ttl_grid()) {
    auto t = LeaseTiming::make(ttl, std::nullopt, std::nullopt);
    ASSERT_TRUE(t.has_value()) << ttl.count() << "ms: " << t.error();
    EXPECT_EQ(t->renew, ttl / 3);
    EXPECT_EQ(t->grace, std::min(milliseconds(5'000), ttl / 6));
  }
}

TEST(lease_timing, accepts_the_largest_renew_and_grace_the_spec_allows_for_every_millisecond_ttl) {
  // Validity only tightens as renew or grace grow, so the corner renew = ttl/3, grace = ttl/6 is the
  // hardest case; check it for every ttl from 100ms to one hour.
  for (std::int64_t ms = 100; ms <= 3'600'000; ++ms) {
    milliseconds ttl(ms);
    auto t = LeaseTiming::make(ttl, ttl / 3, ttl / 6);
    if (!t) FAIL() << "ttl " << ms << "ms, renew " << (ttl / 3).count() << "ms, grace " << (ttl / 6).count()
                   << "ms: " << t.error();
  }
}

TEST(lease_timing, accepts_every_renew_and_grace_within_the_spec_for_every_ttl_up_to_one_second) {
  // The full grid, millisecond by millisecond: 1 <= renew <= ttl/3, 0 <= grace <= ttl/6.
  std::int64_t checked = 0;
  for (std::int64_t ms = 100; ms <= 1'000; ++ms) {
    milliseconds ttl(ms);
    for (milliseconds renew(1); renew <= ttl / 3; ++renew) {
      for (milliseconds grace(0); grace <= ttl / 6; ++grace) {
        auto t = LeaseTiming::make(ttl, renew, grace);
        if (!t) FAIL() << "ttl " << ms << "ms, renew " << renew.count() << "ms, grace " << grace.count()
                       << "ms: " << t.error();
        if (t->renew != renew || t->grace != grace) FAIL() << "values changed for ttl " << ms << "ms";
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 18'596'736);
}

TEST(lease_timing, accepts_a_spread_of_renew_and_grace_within_the_spec_for_ttls_up_to_one_hour) {
  for (milliseconds ttl : ttl_grid()) {
    std::vector<milliseconds> renews{milliseconds(1), milliseconds(2), ttl / 3 - milliseconds(1), ttl / 3};
    std::vector<milliseconds> graces{milliseconds(0), milliseconds(1), ttl / 6 - milliseconds(1), ttl / 6};
    for (int i = 1; i < 40; ++i) {
      renews.push_back(ttl / 3 * i / 40);
      graces.push_back(ttl / 6 * i / 40);
    }
    for (milliseconds renew : renews) {
      if (renew < milliseconds(1)) continue;
      for (milliseconds grace : graces) {
        auto t = LeaseTiming::make(ttl, renew, grace);
        if (!t) FAIL() << "ttl " << ttl.count() << "ms, renew " << renew.count() << "ms, grace " << grace.count()
                       << "ms: " << t.error();
      }
    }
  }
}

// Lock names.

using fencerun::config::validate_lock_name;

namespace {

std::string name_error(std::string_view name) {
  auto ok = validate_lock_name(name);
  EXPECT_FALSE(ok.has_value()) << "'" << name << "' accepted";
  return ok ? std::string() : ok.error();
}

constexpr const char* k_not_printable = "lock NAME may hold only printable ASCII without spaces";
constexpr const char* k_braces = "lock NAME may not contain '{' or '}' (reserved for the Redis Cluster hash tag)";

}  // namespace

TEST(lock_name, rejects_an_empty_name) {
  EXPECT_EQ(name_error(""), "lock NAME is empty");
}

TEST(lock_name, accepts_256_bytes) {
  EXPECT_TRUE(validate_lock_name(std::string(256, 'a')).has_value());
  EXPECT_TRUE(validate_lock_name("x").has_value());
}

TEST(lock_name, rejects_257_bytes) {
  EXPECT_EQ(name_error(std::string(257, 'a')), "lock NAME is 257 bytes long (at most 256)");
  EXPECT_EQ(name_error(std::string(4'096, 'a')), "lock NAME is 4096 bytes long (at most 256)");
}

TEST(lock_name, rejects_spaces) {
  EXPECT_EQ(name_error("nightly backup"), k_not_printable);
  EXPECT_EQ(name_error(" "), k_not_printable);
}

TEST(lock_name, rejects_braces) {
  EXPECT_EQ(name_error("a{b"), k_braces);
  EXPECT_EQ(name_error("a}b"), k_braces);
  EXPECT_EQ(name_error("{tag}"), k_braces);
}

TEST(lock_name, rejects_non_ascii) {
  EXPECT_EQ(name_error("caf\xc3\xa9"), k_not_printable);
  EXPECT_EQ(name_error("\xff"), k_not_printable);
}

TEST(lock_name, rejects_control_characters) {
  EXPECT_EQ(name_error("a\tb"), k_not_printable);
  EXPECT_EQ(name_error("a\nb"), k_not_printable);
  EXPECT_EQ(name_error("a\x01"), k_not_printable);
  EXPECT_EQ(name_error("a\x7f"), k_not_printable);
  EXPECT_EQ(name_error(std::string_view("a\0b", 3)), k_not_printable);
}

TEST(lock_name, accepts_every_printable_character_but_space_and_braces) {
  std::string all;
  for (int c = 0x21; c <= 0x7e; ++c)
    if (c != '{' && c != '}') all.push_back(static_cast<char>(c));
  ASSERT_EQ(all.size(), 92u);
  EXPECT_TRUE(validate_lock_name(all).has_value());
  EXPECT_TRUE(validate_lock_name("nightly-backup.db_1:prod/eu@host#2").has_value());
}

TEST(lock_name, judges_every_single_byte) {
  for (int c = 0; c < 256; ++c) {
    std::string name(1, static_cast<char>(c));
    auto ok = validate_lock_name(name);
    bool printable = c > 0x20 && c < 0x7f;
    if (printable && c != '{' && c != '}') {
      EXPECT_TRUE(ok.has_value()) << "byte " << c;
    } else if (printable) {
      EXPECT_EQ(ok ? "" : ok.error(), k_braces) << "byte " << c;
    } else {
      EXPECT_EQ(ok ? "" : ok.error(), k_not_printable) << "byte " << c;
    }
  }
}
