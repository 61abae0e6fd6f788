// Bad input to break and bump: exit 64 with one line saying what is wrong, and nothing touched on the
// server (a holder is running and keeps its lease).
#include "admin_fixture.hpp"

namespace fencerun::test::admin {
namespace {

class UsageTest : public AdminTest {
 protected:
  void SetUp() override {
    on_failure_.push_back([this] { return "--- redis-server log ---\n" + redis_.log(); });
  }
  std::string url() const { return redis_.url(); }
  RedisServer redis_;
};

TEST_F(UsageTest, BadInputIs64WithOneLine) {
  Holder h = start_holder(url(), "job", "h", {"--ttl", "10s"});
  const auto keys_before = redis_.keys();
  const std::string value = redis_.get(lock_key("job")).value_or("");
  const std::string token = redis_.get(token_key("job")).value_or("");
  struct Case {
    std::vector<std::string> args;
    std::string msg;
  };
  std::vector<Case> cases = {
      {{"break", "-r", url(), "--yes"}, "missing lock NAME"},
      {{"break", "-r", url()}, "missing lock NAME"},
      {{"bump", "-r", url(), "--above", "5"}, "missing lock NAME"},
      {{"bump", "-r", url(), "job"}, "bump: missing --above N"},
      {{"bump", "-r", url(), "job", "--above"}, "--above"},
  };
  for (std::string bad : {"0", "-1", "abc", "9007199254740992", "", "1e3", "12abc", "1.5"})
    cases.push_back({{"bump", "-r", url(), "job", "--above", bad},
                     "--above: '" + bad + "' is not a positive integer below 2^53"});
  cases.push_back({{"break", "-r", url(), "job", "--owner", "abc1", "--yes"},
                   "--owner: 'abc1' is too short to name one holder: give at least 8 hex digits"});
  cases.push_back({{"break", "-r", url(), "job", "--owner", "xyz12345", "--yes"},
                   "--owner: 'xyz12345' is not the start of an owner id (hex digits, as status shows)"});
  // Its first 7 digits: too short even though they match.
  cases.push_back({{"break", "-r", url(), "job", "--owner", h.owner.substr(0, 7), "--yes"},
                   "--owner: '" + h.owner.substr(0, 7) + "' is too short"});
  // 33 digits: longer than any owner id.
  cases.push_back({{"break", "-r", url(), "job", "--owner", h.owner + "0", "--yes"}, "--owner: '" + h.owner + "0'"});
  for (const auto& c : cases) {
    std::string cmd;
    for (const auto& a : c.args) cmd += " '" + a + "'";
    SCOPED_TRACE("fencerun" + cmd);
    RunResult r = run(c.args);
    deploy::note("usage", r);
    EXPECT_EQ(r.exit_code, 64) << r;
    EXPECT_TRUE(one_line_error(r, c.msg));
    EXPECT_EQ(trim(r.out), "") << r;
  }
  EXPECT_EQ(redis_.keys().size(), keys_before.size());
  EXPECT_EQ(redis_.get(lock_key("job")).value_or(""), value) << "a bad break touched the lock";
  EXPECT_EQ(redis_.get(token_key("job")).value_or(""), token) << "a bad bump touched the counter";
  ASSERT_TRUE(h.proc->running()) << h.proc->result();
  let_go("h");
  ASSERT_TRUE(h.proc->wait_for_exit(10s)) << h.proc->result();
  EXPECT_EQ(*h.proc->exit_code(), 0) << h.proc->result();
}

}  // namespace
}  // namespace fencerun::test::admin
