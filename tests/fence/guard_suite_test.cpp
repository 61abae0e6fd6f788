// The scenarios every fence guard must pass, run once per guard kit (fence_harness.hpp): a fresh
// token accepted, a stale one rejected with the guard's message, an equal one accepted again,
// malformed tokens refused without a write, the greatest token there is accepted, concurrent writers
// ending with the greatest token, and a paused old owner's late write rejected, once in detail and
// in many randomized rounds. Tests are named GuardSuite.<Sentence>/<kit>, e.g.
// GuardSuite.RejectsAStaleToken/file. A guard gets these tests by defining a kit and registering it
// (register_kit) in its own file, next to the tests that only make sense for it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <random>

#include "fence_harness.hpp"

namespace fencerun::test::fence {
namespace {

class GuardSuite : public ::testing::TestWithParam<KitEntry> {
 protected:
  void SetUp() override {
    m_lab = std::make_unique<Lab>(lock_name());
    m_kit = GetParam().make(*m_lab);
    if (auto why = m_kit->unavailable()) GTEST_SKIP() << *why;
  }
  void TearDown() override {
    if (HasFailure() && m_kit) m_kit->describe_on_failure();
  }

  Lab& lab() { return *m_lab; }
  Kit& kit() { return *m_kit; }

 private:
  // The test's own lock and resource name ("guard-RejectsAStaleToken-file"): the PostgreSQL server
  // is shared by the tests of one program run.
  static std::string lock_name() {
    std::string n = std::string("guard-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::ranges::replace_if(n, [](unsigned char c) { return !std::isalnum(c) && c != '-'; }, '-');
    return n;
  }

  std::unique_ptr<Lab> m_lab;
  std::unique_ptr<Kit> m_kit;
};

// The lease-owner scenarios run shell functions that may need more than the guard (redis-cli for
// the unguarded control writes).
#define REQUIRE_OWNERS()                                             \
  do {                                                               \
    if (auto why_ = kit().owners_unavailable()) GTEST_SKIP() << *why_; \
  } while (0)

TEST_P(GuardSuite, AcceptsAFreshToken) {
  auto r = kit().write(Token::option(42), "first");
  ASSERT_EQ(r.code, 0) << r.detail;
  EXPECT_EQ(kit().guarded_value(), "first");
  EXPECT_EQ(kit().recorded_token(), 42);
  kit().expect_settled(42);
}

TEST_P(GuardSuite, RejectsAStaleToken) {
  ASSERT_EQ(kit().write(Token::option(42), "first").code, 0);
  auto r = kit().write(Token::option(41), "stale");
  EXPECT_EQ(r.code, 77) << r.detail;
  EXPECT_EQ(r.message, kit().stale_message(41, 42)) << r.detail;
  EXPECT_EQ(kit().guarded_value(), "first") << "the stale write must not land";
  EXPECT_EQ(kit().recorded_token(), 42);
  kit().expect_settled(42);
}

TEST_P(GuardSuite, AcceptsAnEqualTokenAgain) {
  ASSERT_EQ(kit().write(Token::option(42), "first").code, 0);
  auto r = kit().write(Token::environment("42"), "equal");
  EXPECT_EQ(r.code, 0) << r.detail;
  EXPECT_EQ(kit().guarded_value(), "equal");
  EXPECT_EQ(kit().recorded_token(), 42);
  kit().expect_settled(42);
}

TEST_P(GuardSuite, RefusesAMalformedTokenAndWritesNothing) {
  for (const Token& token : kit().malformed_tokens()) {
    SCOPED_TRACE(token.describe());
    auto r = kit().write(token, "x");
    EXPECT_EQ(r.code, 64) << r.detail;
    kit().expect_nothing_written();
  }
}

// Tokens are integers up to 2^53 - 1 (exact in a double, so Lua and JSON carry them).
TEST_P(GuardSuite, AcceptsTheGreatestToken) {
  auto r = kit().write(Token::option(9007199254740991), "max");
  EXPECT_EQ(r.code, 0) << r.detail;
  EXPECT_EQ(kit().guarded_value(), "max");
  EXPECT_EQ(kit().recorded_token(), 9007199254740991);
}

// No lost update: of many writers racing with random tokens, the greatest token and its data win,
// whatever order they reach the guard in.
TEST_P(GuardSuite, EndsWithTheGreatestTokenUnderConcurrentWriters) {
  auto payload = [](long long t) { return "token " + std::to_string(t) + " " + std::string(100000, 'x'); };
  std::vector<std::unique_ptr<Process>> writers;
  std::vector<long long> tokens;
  std::mt19937 rng(7);
  for (int i = 0; i < 24; ++i) {
    long long t = 100 + static_cast<long long>(rng() % 1000);
    tokens.push_back(t);
    writers.push_back(kit().start_write(Token::option(t), payload(t)));
  }
  int accepted = 0;
  for (auto& w : writers) {
    auto r = kit().finish(*w);
    EXPECT_TRUE(r.code == 0 || r.code == 77) << r.detail;
    accepted += r.code == 0;
  }
  const long long greatest = *std::ranges::max_element(tokens);
  EXPECT_GE(accepted, 1);
  EXPECT_EQ(kit().recorded_token(), greatest);
  auto data = kit().guarded_value();
  ASSERT_TRUE(data);
  EXPECT_EQ(data->substr(0, data->find(' ', 6)), "token " + std::to_string(greatest));
  EXPECT_EQ(*data, payload(greatest));
  kit().expect_settled(greatest);
}

// A frozen past its TTL, B writes through the guard, A resumes and writes with its old token:
// rejected, B's data intact, while the unguarded control shows the lost update.
TEST_P(GuardSuite, RejectsThePausedOldOwnersLateWrite) {
  REQUIRE_OWNERS();
  paused_owner_scenario(lab(), kit());
}

TEST_P(GuardSuite, LetsNoStaleWriteThroughInManyPausedRounds) {
  REQUIRE_OWNERS();
  auto start = Clock::now();
  RoundStats s = run_rounds(lab(), kit(), 50, kit().rounds_seed());
  std::cout << s.report(kit().name()) << " (" << ms_between(start, Clock::now()) << " ms)" << std::endl;
  RecordProperty("rounds", s.rounds);
  RecordProperty("stale_attempted", s.stale_attempted);
  RecordProperty("stale_accepted", s.stale_accepted);
  RecordProperty("control_stale_applied", s.control_stale_applied);
  EXPECT_GE(s.rounds, 50);
  EXPECT_EQ(s.stale_accepted, 0);
  EXPECT_EQ(s.fresh_rejected, 0);
  EXPECT_EQ(s.monotonic_violations, 0);
  EXPECT_GT(s.stale_attempted, 0);
  EXPECT_EQ(s.control_stale_applied, s.stale_attempted) << "the control must show what the guard stopped";
  EXPECT_EQ(s.lock_survived, s.lock_checks);
}

INSTANTIATE_TEST_SUITE_P(, GuardSuite, ::testing::ValuesIn(registered_kits()),
                         [](const ::testing::TestParamInfo<KitEntry>& kit_param) { return kit_param.param.name; });

}  // namespace
}  // namespace fencerun::test::fence
