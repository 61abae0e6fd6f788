// The fleet: five "hosts" (fencerun processes) fire the same job every 2 s, each at its own offset in
// the period (0, 0.3, 0.6, 0.9 and 1.2 s: spread inside 1.5 s, as clocks and slow starts spread a
// crontab's firings), with --min-interval 1500ms, for 10 periods. Exactly one command runs per
// period, every other trigger is skipped with the skip code, and no run overlaps another.
#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

constexpr int kHosts = 5;
constexpr int kPeriods = 10;
constexpr auto kPeriod = 2000ms;
constexpr auto kOffsetStep = 300ms;
constexpr int kSkipCode = 42;

class CronFleetTest : public FencerunTest {};

TEST_F(CronFleetTest, OneRunPerPeriod) {
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
  for (auto& t : triggers) {
    std::this_thread::sleep_until(t.at);
    t.process = start(sh_args("fleet", script,
                              {"--min-interval", "1500ms", "--wait", "10s", "--skip-exit-code",
                               std::to_string(kSkipCode)}),
                      {{"PERIOD", std::to_string(t.period)}});
  }
  std::map<int, int> ran, skipped, other;
  for (auto& t : triggers) {
    auto code = t.process->wait_for_exit(30s);
    ASSERT_TRUE(code) << "host " << t.host << " period " << t.period << " did not end";
    if (*code == 0) ++ran[t.period];
    else if (*code == kSkipCode) ++skipped[t.period];
    else {
      ++other[t.period];
      ADD_FAILURE() << "host " << t.host << " period " << t.period << ": " << t.process->result();
    }
  }
  struct Line {
    int period;
    std::string token;
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
  int overlaps = 0;
  for (std::size_t i = 1; i < lines.size(); ++i)
    if (lines[i].start < lines[i - 1].end) ++overlaps;
  std::map<int, int> logged;
  for (const auto& l : lines) ++logged[l.period];

  std::cout << "period  runs  skips  other  logged\n";
  for (int k = 0; k < kPeriods; ++k)
    std::cout << "  " << k << "      " << ran[k] << "     " << skipped[k] << "      " << other[k] << "      "
              << logged[k] << "\n";
  std::cout << "overlaps: " << overlaps << "\n";
  for (int k = 0; k < kPeriods; ++k) {
    EXPECT_EQ(ran[k], 1) << "period " << k;
    EXPECT_EQ(skipped[k], kHosts - 1) << "period " << k;
    EXPECT_EQ(logged[k], 1) << "period " << k;
  }
  EXPECT_EQ(overlaps, 0);
  EXPECT_EQ(lines.size(), static_cast<std::size_t>(kPeriods));
  // The record: the last 10 runs, all ok, one per period's token, newest first.
  auto h = run({"-r", redis().url(), "history", "--json", "fleet"});
  auto j = parse_json(h.out);
  ASSERT_TRUE(j) << h;
  ASSERT_EQ(j->items.size(), static_cast<std::size_t>(kPeriods));
  for (int k = 0; k < kPeriods; ++k) {
    EXPECT_EQ(j->items[kPeriods - 1 - k].find("outcome")->text, "ok");
    EXPECT_EQ(j->items[kPeriods - 1 - k].find("token")->text, lines[k].token);
  }
}

}  // namespace
}  // namespace fencerun::test
