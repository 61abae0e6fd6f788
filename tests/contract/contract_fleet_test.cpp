// 9. The record of runs and --min-interval on a fleet, on every setup: four "hosts" (fencerun
// processes) fire the same job every period, each at its own offset in the period (0 to 0.9 s, as
// clocks and slow starts spread a crontab's firings), with --min-interval between the spread and the
// period (0.8 s of margin on both sides), for five periods. Exactly one command runs per period,
// every other trigger is skipped with the skip code, no run overlaps another, tokens increase, and
// the record has one ok run per period. In the quorum setup one server is killed and started again
// without its data while the third period's run is under way (label chaos): still one run per
// period, and the record merged over the servers has every run.
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "contract_fixture.hpp"

namespace fencerun::test::contract {
namespace {

constexpr int kHosts = 4;
constexpr int kPeriods = 5;
constexpr auto kPeriod = 2500ms;
constexpr auto kOffsetStep = 300ms;
constexpr int kSkipCode = 42;
constexpr int kRestartPeriod = 2;

class Fleet : public ContractTest {
 protected:
  // The quorum variant restarts a server: a setup of its own.
  bool own_setup() const override { return GetParam() == SetupId::quorum; }
};

TEST_P(Fleet, OneRunPerPeriod) {
  // The command logs "<period> <token> <start ns> <end ns>" once it is done.
  const std::string script =
      "s=$(date +%s%N); sleep 0.2; echo \"$PERIOD $FENCERUN_TOKEN $s $(date +%s%N)\" >> runs.log";
  struct Trigger {
    Clock::time_point at;
    int period, host;
    std::unique_ptr<FencerunProcess> process;
  };
  std::vector<Trigger> triggers;
  const auto t0 = Clock::now() + 500ms;
  for (int k = 0; k < kPeriods; ++k)
    for (int h = 0; h < kHosts; ++h) triggers.push_back({t0 + k * kPeriod + h * kOffsetStep, k, h, nullptr});
  std::ranges::sort(triggers, {}, &Trigger::at);
  std::jthread restarter;
  if (setup() == SetupId::quorum)
    restarter = std::jthread([&] {
      // 100 ms into the period: its first host's command runs (it sleeps 0.2 s). The schedule of
      // the fault, not a wait for a result.
      std::this_thread::sleep_until(t0 + kRestartPeriod * kPeriod + 100ms);
      backend_as<QuorumBackend>().server(0).restart();
    });
  for (auto& t : triggers) {
    std::this_thread::sleep_until(t.at);  // the schedule itself, not a wait for a result
    t.process = start(sh_args("fleet", script,
                              {"--ttl", "3s", "--min-interval", "1700ms", "--wait", "10s", "--skip-exit-code",
                               std::to_string(kSkipCode)}),
                      {{"PERIOD", std::to_string(t.period)}});
  }
  if (restarter.joinable()) restarter.join();
  std::map<int, int> ran, skipped, other;
  for (auto& t : triggers) {
    auto code = t.process->wait_for_exit(30s);
    ASSERT_TRUE(code) << "host " << t.host << " period " << t.period << " did not end";
    if (*code == 0)
      ++ran[t.period];
    else if (*code == kSkipCode)
      ++skipped[t.period];
    else {
      ++other[t.period];
      ADD_FAILURE() << "host " << t.host << " period " << t.period << ": " << t.process->result();
    }
  }
  struct Line {
    int period;
    long long token;
    long long start, end;
  };
  std::vector<Line> lines;
  for (const auto& l : split_lines(read_file(file("runs.log")).value_or(""))) {
    std::istringstream in(l);
    Line x{};
    in >> x.period >> x.token >> x.start >> x.end;
    ASSERT_TRUE(in) << "malformed log line: " << l;
    lines.push_back(x);
  }
  std::ranges::sort(lines, {}, &Line::start);
  int overlaps = 0, regressions = 0;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].start < lines[i - 1].end) ++overlaps;
    if (lines[i].token <= lines[i - 1].token) ++regressions;
  }
  std::map<int, int> logged;
  for (const auto& l : lines) ++logged[l.period];

  std::cout << "[ fleet " << to_string(setup()) << " ] period  runs  skips  other  logged"
            << (setup() == SetupId::quorum ? "   (server 1 restarted empty in period 2)" : "") << "\n";
  for (int k = 0; k < kPeriods; ++k)
    std::cout << "[ fleet " << to_string(setup()) << " ]   " << k << "      " << ran[k] << "     " << skipped[k]
              << "      " << other[k] << "      " << logged[k] << "\n";
  for (int k = 0; k < kPeriods; ++k) {
    EXPECT_EQ(ran[k], 1) << "period " << k;
    EXPECT_EQ(skipped[k], kHosts - 1) << "period " << k;
    EXPECT_EQ(logged[k], 1) << "period " << k;
  }
  EXPECT_EQ(overlaps, 0);
  EXPECT_EQ(regressions, 0);
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(kPeriods));
  // The record: one ok run per period's token, newest first.
  auto h = admin({"history", "--json", "fleet"});
  auto j = parse_json(h.out);
  ASSERT_TRUE(j && j->kind == Json::Kind::Array) << h;
  ASSERT_EQ(j->items.size(), static_cast<std::size_t>(kPeriods)) << h;
  for (int k = 0; k < kPeriods; ++k) {
    EXPECT_EQ(field(j->items[kPeriods - 1 - k], "outcome"), "ok") << h;
    EXPECT_EQ(field(j->items[kPeriods - 1 - k], "token"), std::to_string(lines[k].token)) << h;
  }
}

INSTANTIATE_TEST_SUITE_P(Contract, Fleet, kAllSetups, setup_name);

}  // namespace
}  // namespace fencerun::test::contract
