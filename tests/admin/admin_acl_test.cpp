// ACL users: the rule of `fencerun acl --admin` is enough for list, break and bump; the plain run rule
// is not enough for list (SCAN is refused: 69, NOPERM).
#include <algorithm>

#include "admin_fixture.hpp"

namespace fencerun::test::admin {
namespace {

constexpr const char* kPassword = "Adm-4c2e-never-print";

class AdminAclTest : public AdminTest {
 protected:
  void SetUp() override {
    on_failure_.push_back([this] { return "--- redis-server log ---\n" + redis_.log(); });
    RunResult plain = run_fencerun({"acl"}, EnvList{}, 10s);
    ASSERT_EQ(plain.exit_code, 0) << plain;
    RunResult admin = run_fencerun({"acl", "--admin"}, EnvList{}, 10s);
    ASSERT_EQ(admin.exit_code, 0) << admin;
    plain_rule_ = deploy::split_words(plain.out);
    admin_rule_ = deploy::split_words(admin.out);
    for (const auto& [user, rule] : {std::pair{"adm", admin_rule_}, std::pair{"plain", plain_rule_}}) {
      std::vector<std::string> setuser = {"ACL", "SETUSER", user, "on", std::string(">") + kPassword};
      setuser.insert(setuser.end(), rule.begin(), rule.end());
      Reply ok = redis_.cmd(setuser);
      ASSERT_EQ(ok.type, Reply::Type::Status) << ok.describe();
    }
  }
  std::string url(const std::string& user) const {
    return "redis://" + user + ":" + kPassword + "@127.0.0.1:" + std::to_string(redis_.port());
  }
  static void expect_no_password(const RunResult& r) {
    EXPECT_EQ(r.err.find(kPassword), std::string::npos) << r;
    EXPECT_EQ(r.out.find(kPassword), std::string::npos) << r;
  }
  // The default user has a password of its own, so a connection without credentials is refused.
  RedisServer redis_{RedisOptions{"admin-default-9b1f", {}}};
  std::vector<std::string> plain_rule_, admin_rule_;
};

TEST_F(AdminAclTest, AdminRuleIsTheRunRulePlusScanAndClusterNodes) {
  std::vector<std::string> want = plain_rule_;
  want.insert(want.end(), {"+scan", "+cluster|nodes"});
  EXPECT_EQ(admin_rule_, want);
}

TEST_F(AdminAclTest, AdminRuleIsEnoughForListBreakAndBump) {
  Holder h = start_holder(url("adm"), "job", "h", {"--ttl", "3s"});
  RunResult l = run({"list", "-r", url("adm")});
  EXPECT_EQ(l.exit_code, 0) << l;
  EXPECT_TRUE(trim(l.out).starts_with("job: held by pid " + std::to_string(h.proc->pid()))) << l;
  expect_no_password(l);
  RunResult lj = run({"list", "-r", url("adm"), "--json", "--all"});
  EXPECT_EQ(lj.exit_code, 0) << lj;
  EXPECT_TRUE(parse_json(lj.out)) << lj;

  RunResult bump = run({"bump", "-r", url("adm"), "job", "--above", std::to_string(redis_.time_us() + 86'400'000'000LL)});
  EXPECT_EQ(bump.exit_code, 0) << bump;
  expect_no_password(bump);

  RunResult b = run({"break", "-r", url("adm"), "job", "--yes"});
  EXPECT_EQ(b.exit_code, 0) << b;
  EXPECT_TRUE(trim(b.out).starts_with("broke job: pid " + std::to_string(h.proc->pid()))) << b;
  expect_no_password(b);
  EXPECT_FALSE(redis_.exists(lock_key("job")));
  ASSERT_TRUE(h.proc->wait_for_exit(10s)) << h.proc->result();
  EXPECT_EQ(*h.proc->exit_code(), 124) << h.proc->result();

  RunResult after = run({"list", "-r", url("adm")});
  EXPECT_EQ(after.exit_code, 3) << after;
}

TEST_F(AdminAclTest, PlainRuleCannotList) {
  Holder h = start_holder(url("plain"), "job", "h", {"--ttl", "10s"});
  RunResult l = run({"list", "-r", url("plain")});
  deploy::note("list with the run rule", l);
  EXPECT_EQ(l.exit_code, 69) << l;
  EXPECT_NE(l.err.find("NOPERM"), std::string::npos) << l;
  expect_no_password(l);
  let_go("h");
  ASSERT_TRUE(h.proc->wait_for_exit(10s)) << h.proc->result();
  EXPECT_EQ(*h.proc->exit_code(), 0) << h.proc->result();
}

// break and bump run scripts whose commands the run rule already has (the spec of acl --admin).
TEST_F(AdminAclTest, PlainRuleIsEnoughForBreakAndBump) {
  Holder h = start_holder(url("plain"), "job", "h", {"--ttl", "3s"});
  RunResult bump = run({"bump", "-r", url("plain"), "other", "--above", "42"});
  EXPECT_EQ(bump.exit_code, 0) << bump;
  EXPECT_EQ(redis_.get(token_key("other")).value_or(""), "42");
  RunResult b = run({"break", "-r", url("plain"), "job", "--yes"});
  EXPECT_EQ(b.exit_code, 0) << b;
  ASSERT_TRUE(h.proc->wait_for_exit(10s)) << h.proc->result();
  EXPECT_EQ(*h.proc->exit_code(), 124) << h.proc->result();
}

}  // namespace
}  // namespace fencerun::test::admin
