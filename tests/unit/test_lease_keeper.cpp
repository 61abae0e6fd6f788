// The keeper reports a lost lease with its cause: what the renewal found (the key gone, another
// owner's, deleted under a live lease, the lease itself revoked).
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>

#include "lease/keeper.hpp"
#include "log/log.hpp"

namespace {

using namespace std::chrono_literals;
using fencerun::BootClock;
using fencerun::Deadline;
using fencerun::lease::Acquired;
using fencerun::lease::LeaseKeeper;
using fencerun::lease::LeaseSchedule;
using fencerun::lease::LeaseTiming;
using fencerun::lease::LossCause;
using fencerun::lease::RenewOutcome;

// Renews `renewals` times, then answers `then`.
class FakeRenewer final : public fencerun::lease::Renewer {
 public:
  FakeRenewer(int renewals, RenewOutcome then) : m_left(renewals), m_then(then) {}
  fencerun::lease::Result<RenewOutcome> renew(std::string_view, std::chrono::milliseconds, Deadline,
                                              Deadline& sent) override {
    sent = BootClock::now();
    if (m_left.fetch_sub(1) > 0) return RenewOutcome::renewed;
    return m_then;
  }

 private:
  std::atomic<int> m_left;
  RenewOutcome m_then;
};

class LeaseKeeperCause : public ::testing::TestWithParam<std::pair<RenewOutcome, LossCause>> {
 protected:
  void SetUp() override { fencerun::log::init(fencerun::log::Level::error, fencerun::log::Format::text); }
  void TearDown() override { fencerun::log::init(fencerun::log::Level::warn, fencerun::log::Format::text); }
};

TEST_P(LeaseKeeperCause, ReportsWhyTheLeaseWasLost) {
  const auto [outcome, cause] = GetParam();
  FakeRenewer renewer(1, outcome);
  auto timing = LeaseTiming::make(3000ms, 100ms, std::nullopt);
  ASSERT_TRUE(timing.has_value());
  Acquired acquired;
  acquired.value = "owner 1 1 host";
  acquired.sent = BootClock::now();
  LeaseKeeper keeper(renewer, acquired, LeaseSchedule(*timing), 1000ms, fencerun::log::Context{"unit", "1"});
  EXPECT_EQ(keeper.loss_cause(), LossCause::none);
  pollfd p{keeper.wake_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  EXPECT_TRUE(keeper.lost());
  EXPECT_EQ(keeper.loss_cause(), cause);
  EXPECT_EQ(keeper.stats().renewals, 1u);
  keeper.stop();
}

INSTANTIATE_TEST_SUITE_P(
    lease_keeper, LeaseKeeperCause,
    ::testing::Values(std::pair{RenewOutcome::gone, LossCause::expired_or_deleted},
                      std::pair{RenewOutcome::stolen, LossCause::taken},
                      std::pair{RenewOutcome::broken, LossCause::broken},
                      std::pair{RenewOutcome::revoked, LossCause::revoked}),
    [](const auto& p) { return std::string(fencerun::lease::loss_cause_name(p.param.second)); });

}  // namespace
