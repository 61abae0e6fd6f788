// What a person reads when the password is missing or refused: one line that says what to do, exit
// 69 before the command runs, and never the password itself, whatever the log level.
#include "deploy_support.hpp"

namespace fencerun::test::deploy {
namespace {

constexpr const char* kPassword = "Pw-51c2e8-never-print";
constexpr const char* kRefused = "Refused-9a4d07-never-print";
constexpr const char* kMissing = "the server requires a password: set it in the URL or in $FENCERUN_REDIS_PASSWORD";

void expect_no_secret(const RunResult& r) {
  for (const char* secret : {kPassword, kRefused}) {
    EXPECT_EQ(r.err.find(secret), std::string::npos) << "password on stderr\n" << r;
    EXPECT_EQ(r.out.find(secret), std::string::npos) << "password on stdout\n" << r;
  }
}

class AuthMessageTest : public DeployTest {
 protected:
  void SetUp() override {
    on_failure_.push_back([this] { return "--- redis-server log ---\n" + redis_.log(); });
  }
  std::string url(const std::string& credentials = "") const {
    return "redis://" + credentials + (credentials.empty() ? "" : "@") + "127.0.0.1:" + std::to_string(redis_.port());
  }
  void expect_refused_before_running(const RunResult& r) const {
    EXPECT_EQ(r.exit_code, 69) << r;
    EXPECT_LT(r.elapsed, 1500ms) << "an auth error is not a reason to wait\n" << r;
    EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command must not run\n" << r;
    EXPECT_EQ(redis_.dbsize(), 0) << "nothing may be written";
    EXPECT_EQ(r.err.find("Protocol error"), std::string::npos) << r;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line\n" << r;
    expect_no_secret(r);
  }

  RedisServer redis_{RedisOptions{kPassword, {}}};
};

TEST_F(AuthMessageTest, MissingPasswordSaysWhereToSetIt) {
  RunResult r = run(sh_args(url(), "job", "touch ran", {"--timeout", "1s"}));
  note("no password", r);
  expect_refused_before_running(r);
  EXPECT_NE(r.err.find(kMissing), std::string::npos) << r;
  EXPECT_NE(r.err.find("kind: auth"), std::string::npos) << r;

  RunResult s = run({"status", "-r", url(), "job"});
  note("status, no password", s);
  EXPECT_EQ(s.exit_code, 69) << s;
  EXPECT_NE(s.err.find(kMissing), std::string::npos) << s;

  // While waiting, a missing password is not retried: it will not come by itself.
  RunResult w = run(sh_args(url(), "job", "touch ran", {"--wait", "5s"}));
  expect_refused_before_running(w);
  EXPECT_NE(w.err.find(kMissing), std::string::npos) << w;
}

TEST_F(AuthMessageTest, RefusedPasswordSaysSoWithoutPrintingIt) {
  RunResult r = run(sh_args(url(std::string(":") + kRefused), "job", "touch ran", {"-vv"}));
  note("refused password", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_NE(r.err.find("the server refused the password (WRONGPASS"), std::string::npos) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  expect_no_secret(r);

  RunResult env = run(sh_args(url(), "job", "touch ran", {"-vv"}), {{"FENCERUN_REDIS_PASSWORD", kRefused}});
  EXPECT_EQ(env.exit_code, 69) << env;
  EXPECT_NE(env.err.find("the server refused the password (WRONGPASS"), std::string::npos) << env;
  expect_no_secret(env);

  RunResult s = run({"status", "-r", url(), "job", "--json"}, {{"REDISCLI_AUTH", kRefused}});
  EXPECT_EQ(s.exit_code, 69) << s;
  EXPECT_NE(s.err.find("the server refused the password"), std::string::npos) << s;
  expect_no_secret(s);
  EXPECT_EQ(redis_.dbsize(), 0);
}

TEST_F(AuthMessageTest, RefusedPasswordOfAnAclUserNamesTheUser) {
  Reply ok = redis_.cmd({"ACL", "SETUSER", "alice", "on", std::string(">") + kPassword, "~*", "+@all"});
  ASSERT_EQ(ok.type, Reply::Type::Status) << ok.describe();
  RunResult r = run(sh_args(url(std::string("alice:") + kRefused), "job", "touch ran"));
  note("refused password of alice", r);
  expect_refused_before_running(r);
  EXPECT_NE(r.err.find("the server refused the password of user 'alice' (WRONGPASS"), std::string::npos) << r;

  RunResult right = run(sh_args(url(std::string("alice:") + kPassword), "job", "true"));
  EXPECT_EQ(right.exit_code, 0) << right;
  expect_no_secret(right);
}

TEST(AuthMessage, PasswordForAServerWithoutOneSaysSo) {
  RedisServer open;
  RunResult r = run_fencerun({"-r", "redis://:" + std::string(kRefused) + "@127.0.0.1:" + std::to_string(open.port()),
                              "job", "--", "true"},
                             EnvList{}, 30s);
  note("password for an open server", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_NE(r.err.find("a password was given but the server has none set"), std::string::npos) << r;
  expect_no_secret(r);
  EXPECT_EQ(open.dbsize(), 0);
}

}  // namespace
}  // namespace fencerun::test::deploy
