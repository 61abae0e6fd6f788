// fencerun bump: raises a token counter so that the next token is greater than N, never lowers it,
// and works on a name that never issued a token.
#include "admin_fixture.hpp"

namespace fencerun::test::admin {
namespace {

class BumpTest : public AdminTest {
 protected:
  void SetUp() override {
    on_failure_.push_back([this] { return "--- redis-server log ---\n" + redis_.log(); });
  }
  std::string url() const { return redis_.url(); }
  // One run of NAME: the token its command saw.
  long long run_once(const std::string& name) {
    std::filesystem::remove(file("token"));
    RunResult r = run(sh_args(url(), name, "echo \"$FENCERUN_TOKEN\" > token"));
    EXPECT_EQ(r.exit_code, 0) << r;
    return parse_ll(read_file(file("token")).value_or("")).value_or(-1);
  }
  std::string counter(const std::string& name) { return redis_.get(token_key(name)).value_or("(none)"); }
  RedisServer redis_;
};

TEST_F(BumpTest, NextTokenIsAboveN) {
  const long long t1 = run_once("job");
  ASSERT_GT(t1, 0);
  // Above the server's clock too (tokens are at least its time in microseconds): a day ahead.
  const long long n = redis_.time_us() + 86'400'000'000LL;
  RunResult b = run({"bump", "-r", url(), "job", "--above", std::to_string(n)});
  ASSERT_EQ(b.exit_code, 0) << b;
  EXPECT_EQ(trim(b.out), "job: token counter raised from " + std::to_string(t1) + " to " + std::to_string(n) +
                             ": the next token is greater than " + std::to_string(n))
      << b;
  EXPECT_EQ(counter("job"), std::to_string(n));
  EXPECT_FALSE(redis_.exists(lock_key("job"))) << "bump must not take the lock";
  const long long t2 = run_once("job");
  EXPECT_GT(t2, n);
  const long long t3 = run_once("job");
  EXPECT_GT(t3, t2);
}

TEST_F(BumpTest, NeverLowersTheCounter) {
  const long long t1 = run_once("job");
  for (long long n : {5LL, t1 - 1, t1}) {
    RunResult b = run({"bump", "-r", url(), "job", "--above", std::to_string(n)});
    ASSERT_EQ(b.exit_code, 0) << b;
    EXPECT_EQ(trim(b.out), "job: token counter is " + std::to_string(t1) + ", already at least " + std::to_string(n) +
                               ": unchanged")
        << b;
    EXPECT_EQ(counter("job"), std::to_string(t1)) << "after --above " << n;
  }
  EXPECT_GT(run_once("job"), t1);
}

TEST_F(BumpTest, NameWithoutATokenYet) {
  const long long n = redis_.time_us() + 3'600'000'000LL;
  RunResult b = run({"bump", "-r", url(), "fresh", "--above", std::to_string(n)});
  ASSERT_EQ(b.exit_code, 0) << b;
  EXPECT_EQ(trim(b.out), "fresh: token counter raised from none to " + std::to_string(n) +
                             ": the next token is greater than " + std::to_string(n))
      << b;
  EXPECT_EQ(counter("fresh"), std::to_string(n));
  EXPECT_EQ(redis_.keys(), std::vector<std::string>{token_key("fresh")}) << "bump wrote more than the counter";
  // list --all shows it as a free lock with that token history.
  RunResult l = run({"list", "-r", url(), "--all"});
  EXPECT_EQ(l.exit_code, 3) << l;
  EXPECT_EQ(trim(l.out), "fresh: free, last token " + std::to_string(n)) << l;
  EXPECT_GT(run_once("fresh"), n);
}

TEST_F(BumpTest, LargestAcceptedN) {
  const std::string max = "9007199254740990";  // 2^53 - 2: the next token (2^53 - 1) is still below 2^53
  RunResult b = run({"bump", "-r", url(), "top", "--above", max});
  ASSERT_EQ(b.exit_code, 0) << b;
  EXPECT_EQ(counter("top"), max);
  RunResult r = run(sh_args(url(), "top", "echo $FENCERUN_TOKEN > token"));
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(read_file(file("token")).value_or(""), "9007199254740991\n");
}

// One more would leave the lock no token to issue (every later run would fail until the counter was
// deleted by hand): refused before anything is written.
TEST_F(BumpTest, AboveThatLeavesNoTokenIsRefused) {
  RunResult b = run({"bump", "-r", url(), "top", "--above", "9007199254740991"});
  EXPECT_EQ(b.exit_code, 64) << b;
  EXPECT_NE(b.err.find("--above: 9007199254740991 leaves no token to issue"), std::string::npos) << b;
  EXPECT_EQ(counter("top"), "(none)");
  RunResult r = run(sh_args(url(), "top", "touch ran"));
  EXPECT_EQ(r.exit_code, 0) << r;
}

}  // namespace
}  // namespace fencerun::test::admin
