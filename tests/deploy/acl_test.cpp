// ACL users: the rule printed by `fencerun acl` is enough for run, --wait and status; a user without
// it gets a clear refusal; the password never shows up in fencerun's output.
#include <algorithm>
#include <thread>

#include "deploy_support.hpp"

namespace fencerun::test::deploy {
namespace {

constexpr const char* kPassword = "Pw-7f3a9c-never-print";
constexpr const char* kWrongPassword = "Wrong-0b1d-never-print";

class AclTest : public DeployTest {
 protected:
  void SetUp() override {
    on_failure_.push_back([this] { return "--- redis-server log ---\n" + redis_.log(); });
    RunResult rule = run_fencerun({"acl"}, EnvList{}, 10s);
    ASSERT_EQ(rule.exit_code, 0) << rule;
    rule_ = split_words(rule.out);
    ASSERT_FALSE(rule_.empty()) << rule;
    std::vector<std::string> setuser = {"ACL", "SETUSER", "fr", "on", std::string(">") + kPassword};
    setuser.insert(setuser.end(), rule_.begin(), rule_.end());
    Reply ok = redis_.cmd(setuser);
    ASSERT_EQ(ok.type, Reply::Type::Status) << ok.describe() << " for the rule: " << rule.out;
    Reply weak = redis_.cmd({"ACL", "SETUSER", "weak", "on", std::string(">") + kPassword, "-@all", "+ping"});
    ASSERT_EQ(weak.type, Reply::Type::Status) << weak.describe();
  }

  std::string url(const std::string& user = "fr", const std::string& password = kPassword) const {
    return "redis://" + user + (password.empty() ? "" : ":" + password) + "@127.0.0.1:" +
           std::to_string(redis_.port());
  }

  static void expect_no_password(const RunResult& r) {
    EXPECT_EQ(r.err.find(kPassword), std::string::npos) << "password leaked on stderr\n" << r;
    EXPECT_EQ(r.out.find(kPassword), std::string::npos) << "password leaked on stdout\n" << r;
    EXPECT_EQ(r.err.find(kWrongPassword), std::string::npos) << "password leaked on stderr\n" << r;
  }

  // The default user has a password of its own (as on a production server), so that a connection
  // without credentials is refused instead of silently running as `default`.
  RedisServer redis_{RedisOptions{"admin-secret-3d1e", {}}};
  std::vector<std::string> rule_;
};

TEST_F(AclTest, RuleFromFencerunAclIsEnoughForRunWaitAndStatus) {
  // The rule must name fencerun's key pattern and not open everything.
  bool has_keys = false;
  for (const auto& w : rule_) has_keys |= w.rfind("~fencerun:", 0) == 0;
  EXPECT_TRUE(has_keys) << "rule without a fencerun: key pattern";

  // A plain run, verbose, with the child's view of the URL recorded.
  RunResult r = run(sh_args(url(), "job",
                            "echo \"$FENCERUN_TOKEN\" > token; echo \"$FENCERUN_REDIS_URL\" > url",
                            {"-vv"}));
  ASSERT_EQ(r.exit_code, 0) << r;
  expect_no_password(r);
  const long long t1 = read_token(file("token"), 1s);
  const std::string child_url = read_file(file("url")).value_or("");
  EXPECT_EQ(child_url.find(kPassword), std::string::npos)
      << "FENCERUN_REDIS_URL must not carry the password: " << child_url;
  EXPECT_FALSE(redis_.exists(lock_key("job")));

  // Status while free, then a holder and a waiter: the waiter acquires after the holder releases.
  RunResult free_status = run({"status", "-r", url(), "job"});
  EXPECT_EQ(free_status.exit_code, 3) << free_status;
  expect_no_password(free_status);

  std::filesystem::remove(file("token"));
  auto holder = start(sh_args(url(), "job", kTokenUntilGo, {"-t", "10s"}));
  const long long t2 = read_token(file("token"));
  wait_pid("pid");
  EXPECT_GT(t2, t1);

  RunResult held = run({"status", "-r", url(), "job", "--json"});
  EXPECT_EQ(held.exit_code, 0) << held;
  EXPECT_NE(held.out.find(std::to_string(t2)), std::string::npos) << held;

  auto waiter =
      start(sh_args(url(), "job", "echo \"$FENCERUN_TOKEN\" > token2", {"-w", "30s", "--fair", "-vv"}));
  // The waiter must really be waiting (not failing) before the holder lets go: subscribed to its own
  // channel and in the queue, which the rule allows (a waiter that may not subscribe would poll).
  const bool queued = wait_until([&] { return redis_.cmd({"ZCARD", "fencerun:{job}:queue"}).integer == 1; }, 10s);
  ASSERT_TRUE(queued) << "the waiter never took a place in the queue\n" << waiter->result();
  ASSERT_TRUE(waiter->running()) << "waiter ended while the lock was held\n" << waiter->result();
  EXPECT_FALSE(std::filesystem::exists(file("token2")));
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  EXPECT_EQ(*holder->exit_code(), 0) << holder->result();
  ASSERT_TRUE(waiter->wait_for_exit(20s)) << waiter->result();
  EXPECT_EQ(*waiter->exit_code(), 0) << waiter->result();
  expect_no_password(waiter->result());
  EXPECT_EQ(waiter->result().err.find("polling instead"), std::string::npos) << waiter->result();
  const long long t3 = read_token(file("token2"), 1s);
  EXPECT_GT(t3, t2);
  EXPECT_FALSE(redis_.exists(lock_key("job")));
}

// The rule is enough for a counting lock too: its scripts' commands are in it, and so are its keys.
TEST_F(AclTest, RuleFromFencerunAclIsEnoughForACountingLock) {
  const std::string hold = "echo $$ > pid$FENCERUN_SLOT; while [ ! -e go ]; do sleep 0.02; done";
  auto a = start(sh_args(url(), "job", hold, {"-t", "10s", "--limit", "2"}));
  wait_pid("pid0");
  auto b = start(sh_args(url(), "job", hold, {"-t", "10s", "--limit", "2"}));
  wait_pid("pid1");
  RunResult held = run({"status", "-r", url(), "job", "--json"});
  EXPECT_EQ(held.exit_code, 0) << held;
  EXPECT_NE(held.out.find("\"limit\":2"), std::string::npos) << held;
  auto waiter = start(sh_args(url(), "job", "echo \"$FENCERUN_SLOT\" > slot", {"-w", "30s", "--fair", "--limit", "2"}));
  ASSERT_TRUE(wait_until([&] { return redis_.cmd({"ZCARD", "fencerun:{job}:queue"}).integer == 1; }, 10s))
      << "the waiter never took a place in the queue\n" << waiter->result();
  touch("go");
  for (auto* p : {a.get(), b.get(), waiter.get()}) {
    ASSERT_TRUE(p->wait_for_exit(20s)) << p->result();
    EXPECT_EQ(*p->exit_code(), 0) << p->result();
    expect_no_password(p->result());
  }
  EXPECT_EQ(waiter->result().err.find("polling instead"), std::string::npos) << waiter->result();
  EXPECT_TRUE(std::filesystem::exists(file("slot")));
  EXPECT_FALSE(redis_.exists("fencerun:{job}:slot:0"));
  EXPECT_FALSE(redis_.exists("fencerun:{job}:slot:1"));
  EXPECT_FALSE(redis_.exists("fencerun:{job}:limit"));
}

// A user with the rule's keys and commands but no channel (an older rule, or a site's policy): a waiter
// cannot subscribe, so it polls without a place in the queue, and still acquires after the release.
// A release by this user works though it may not wake the waiter that listens; that one then looks
// again when the lease it was told about runs out (2 s here).
TEST_F(AclTest, UserWithoutChannelsWaitsByPolling) {
  std::vector<std::string> setuser = {"ACL", "SETUSER", "nochan", "on", std::string(">") + kPassword};
  for (const auto& w : rule_)
    if (!w.starts_with("&")) setuser.push_back(w);
  ASSERT_EQ(redis_.cmd(setuser).type, Reply::Type::Status);
  auto holder = start(sh_args(url("nochan"), "job", kTokenUntilGo, {"-t", "2s"}));
  wait_pid("pid");
  // A waiter of the full rule listens and queues; one without channels polls, unqueued.
  auto listening = start(sh_args(url(), "job", "echo listening >> order", {"-t", "2s", "-w", "30s", "--fair"}));
  ASSERT_TRUE(wait_until([&] { return redis_.cmd({"ZCARD", "fencerun:{job}:queue"}).integer == 1; }, 10s))
      << listening->result();
  auto polling = start(sh_args(url("nochan"), "job", "echo polling >> order", {"-t", "2s", "-w", "30s", "-v"}));
  ASSERT_TRUE(wait_until([&] { return polling->result().err.find("waiting") != std::string::npos; }, 10s))
      << polling->result();
  EXPECT_EQ(redis_.cmd({"ZCARD", "fencerun:{job}:queue"}).integer, 1) << "a waiter that cannot listen queued";
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  EXPECT_EQ(*holder->exit_code(), 0) << holder->result();
  EXPECT_EQ(holder->result().err.find("could not release"), std::string::npos)
      << "the release (which would wake the listening waiter) failed\n" << holder->result();
  for (auto* w : {listening.get(), polling.get()}) {
    ASSERT_TRUE(w->wait_for_exit(30s)) << w->result();
    EXPECT_EQ(*w->exit_code(), 0) << w->result();
    expect_no_password(w->result());
  }
  auto order = split_lines(read_file(file("order")).value_or(""));
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, (std::vector<std::string>{"listening", "polling"}));
  EXPECT_FALSE(redis_.exists(lock_key("job")));
  EXPECT_EQ(redis_.cmd({"ZCARD", "fencerun:{job}:queue"}).integer, 0);
}

TEST_F(AclTest, UserWithoutPermissionsGetsNopermAndLeavesNoKey) {
  RunResult r = run(sh_args(url("weak"), "job", "touch ran", {"-vv"}));
  note("acl weak user", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_NE(r.err.find("NOPERM"), std::string::npos) << "the refusal must be reported as NOPERM\n" << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command must not run";
  expect_no_password(r);
  EXPECT_EQ(redis_.dbsize(), 0) << "no key may be left behind";

  RunResult s = run({"status", "-r", url("weak"), "job"});
  EXPECT_EQ(s.exit_code, 69) << s;
  EXPECT_NE(s.err.find("NOPERM"), std::string::npos) << s;
}

TEST_F(AclTest, WrongPasswordIsUnavailable) {
  RunResult r = run(sh_args(url("fr", kWrongPassword), "job", "touch ran", {"-vv"}));
  note("acl wrong password", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command must not run";
  EXPECT_FALSE(r.err.empty()) << "fencerun must say why";
  expect_no_password(r);
  EXPECT_EQ(redis_.dbsize(), 0);

  // Unknown user: the same.
  RunResult u = run(sh_args(url("nosuchuser"), "job", "touch ran", {"-vv"}));
  note("acl unknown user", u);
  EXPECT_EQ(u.exit_code, 69) << u;
  expect_no_password(u);
}

TEST_F(AclTest, PasswordFromEnvironmentWithUserInUrl) {
  const std::string url_user_only = "redis://fr@127.0.0.1:" + std::to_string(redis_.port());
  RunResult r = run(sh_args(url_user_only, "job",
                            "echo \"$FENCERUN_TOKEN\" > token; echo \"$FENCERUN_REDIS_URL\" > url",
                            {"-vv"}),
                    {{"FENCERUN_REDIS_PASSWORD", kPassword}});
  ASSERT_EQ(r.exit_code, 0) << r;
  expect_no_password(r);
  EXPECT_GT(read_token(file("token"), 1s), 0);
  EXPECT_FALSE(redis_.exists(lock_key("job")));

  // redis-cli's convention works as well.
  RunResult cli = run(sh_args(url_user_only, "job", "true", {"-vv"}), {{"REDISCLI_AUTH", kPassword}});
  ASSERT_EQ(cli.exit_code, 0) << cli;
  expect_no_password(cli);

  // FENCERUN_REDIS_PASSWORD wins over REDISCLI_AUTH.
  RunResult both = run(sh_args(url_user_only, "job", "true", {"-vv"}),
                       {{"FENCERUN_REDIS_PASSWORD", kPassword}, {"REDISCLI_AUTH", kWrongPassword}});
  ASSERT_EQ(both.exit_code, 0) << both;

  // Without any password: a usage error that says so, before connecting.
  RunResult none = run(sh_args(url_user_only, "job", "touch ran", {"-vv"}));
  note("acl user without password", none);
  EXPECT_EQ(none.exit_code, 64) << none;
  EXPECT_NE(none.err.find("no password for user 'fr'"), std::string::npos) << none;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));

  RunResult s = run({"status", "-r", url_user_only, "job"}, {{"FENCERUN_REDIS_PASSWORD", kPassword}});
  EXPECT_EQ(s.exit_code, 3) << s;
  expect_no_password(s);
}

}  // namespace
}  // namespace fencerun::test::deploy
