// Many contenders for one lock: critical sections never overlap and tokens increase strictly in
// acquisition order.
#include <mutex>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

class ContentionTest : public FencerunTest {};

TEST_F(ContentionTest, ConcurrentContendersNeverOverlap) {
  constexpr int kContenders = 8;
  constexpr int kRunsEach = 40;
  // `set -C`: creating the guard fails if it exists, i.e. if another critical section is inside.
  // Every line is one O_APPEND write.
  const std::string script =
      "set -C; if ! : > guard 2>/dev/null; then echo \"overlap $FENCERUN_TOKEN\" >> log; fi; "
      "echo \"start $FENCERUN_TOKEN\" >> log; "
      "echo \"end $FENCERUN_TOKEN\" >> log; "
      "rm -f guard; echo $FENCERUN_TOKEN";

  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::vector<long long>> tokens(kContenders);
  const auto started = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < kContenders; ++c) {
    threads.emplace_back([&, c] {
      try {
        for (int i = 0; i < kRunsEach; ++i) {
          auto r = run(sh_args("contended", script, {"--wait", "60s", "--ttl", "10s"}), {}, 90s);
          if (r.exit_code != 0) {
            std::lock_guard lk(mu);
            failures.push_back("contender " + std::to_string(c) + " run " + std::to_string(i) +
                               ": " + r.describe());
            return;
          }
          auto t = parse_ll(r.out);
          if (!t) {
            std::lock_guard lk(mu);
            failures.push_back("no token from contender " + std::to_string(c) + ": " + r.describe());
            return;
          }
          tokens[c].push_back(*t);
        }
      } catch (const std::exception& e) {
        std::lock_guard lk(mu);
        failures.push_back(std::string("exception: ") + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto elapsed = ms_between(started, Clock::now());
  std::cout << kContenders * kRunsEach << " critical sections in " << elapsed << " ms\n";
  RecordProperty("critical_sections_ms", std::to_string(elapsed));
  for (const auto& f : failures) ADD_FAILURE() << f;
  ASSERT_TRUE(failures.empty());

  const auto log = read_file(file("log")).value_or("");
  const auto lines = split_lines(log);
  ASSERT_EQ(lines.size(), static_cast<size_t>(2 * kContenders * kRunsEach)) << log;
  long long last = 0;
  for (size_t i = 0; i + 1 < lines.size(); i += 2) {
    ASSERT_EQ(lines[i].rfind("start ", 0), 0u) << "line " << i << ": " << lines[i] << "\n" << log;
    ASSERT_EQ(lines[i + 1].rfind("end ", 0), 0u) << "line " << i + 1 << ": " << lines[i + 1];
    const auto s = parse_ll(lines[i].substr(6));
    const auto e = parse_ll(lines[i + 1].substr(4));
    ASSERT_TRUE(s && e);
    ASSERT_EQ(*s, *e) << "critical sections overlap at line " << i;
    ASSERT_GT(*s, last) << "tokens not increasing in acquisition order at line " << i;
    last = *s;
  }
  for (int c = 0; c < kContenders; ++c) {
    ASSERT_EQ(tokens[c].size(), static_cast<size_t>(kRunsEach));
    for (size_t i = 1; i < tokens[c].size(); ++i) EXPECT_LT(tokens[c][i - 1], tokens[c][i]);
  }
  EXPECT_EQ(redis().get(token_key("contended")), std::to_string(last));
  EXPECT_FALSE(redis().exists(lock_key("contended")));
  EXPECT_FALSE(std::filesystem::exists(file("guard")));
}

}  // namespace
}  // namespace fencerun::test
