// Contention with a running holder: busy exit codes, waiting, signals while waiting, signal
// forwarding, and `fencerun status`.
#include <regex>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

class LockTest : public FencerunTest {
 protected:
  // Starts a holder of `name` that runs until `go` appears; returns once the command runs.
  std::unique_ptr<FencerunProcess> hold(const std::string& name,
                                        std::vector<std::string> options = {"--ttl", "10s"}) {
    auto p = start(sh_args(name, kHoldUntilGo, std::move(options)));
    wait_pid("pid");
    holder_token_ = *parse_ll(wait_line("token"));
    return p;
  }
  long long holder_token_ = 0;
};

TEST_F(LockTest, BusyExits75WithoutRunningTheCommand) {
  auto holder = hold("busy");
  const auto before = redis().get(lock_key("busy"));
  auto r = run(sh_args("busy", "touch ran"));
  EXPECT_EQ(r.exit_code, 75) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command ran without the lock";
  EXPECT_LT(r.elapsed, 2000ms) << "without --wait, busy must fail fast";
  EXPECT_EQ(redis().get(lock_key("busy")), before) << "a busy attempt changed the holder's lock";
  touch("go");
  EXPECT_EQ(holder->wait_for_exit(10s), 0) << holder->result();
}

TEST_F(LockTest, BusyWithConflictExitCode) {
  auto holder = hold("busy3");
  auto r = run(sh_args("busy3", "touch ran", {"-E", "3"}));
  EXPECT_EQ(r.exit_code, 3) << r;
  auto r2 = run(sh_args("busy3", "touch ran", {"--conflict-exit-code", "0"}));
  EXPECT_EQ(r2.exit_code, 0) << r2;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  touch("go");
  EXPECT_EQ(holder->wait_for_exit(10s), 0) << holder->result();
}

TEST_F(LockTest, WaitAcquiresAfterHolderReleases) {
  auto holder = hold("waitok");
  auto waiter = start(sh_args("waitok", "echo $FENCERUN_TOKEN > token2", {"--wait", "5s"}));
  // Give the waiter time to find the lock busy, then let the holder finish.
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(waiter->running()) << "the waiter did not wait: " << waiter->result();
  EXPECT_FALSE(std::filesystem::exists(file("token2")));
  const auto released_at = Clock::now();
  touch("go");
  ASSERT_EQ(holder->wait_for_exit(10s), 0) << holder->result();
  ASSERT_EQ(waiter->wait_for_exit(10s), 0) << waiter->result();
  const auto t2 = parse_ll(read_file(file("token2")).value_or(""));
  ASSERT_TRUE(t2.has_value());
  EXPECT_GT(*t2, holder_token_);
  std::cout << "waiter acquired " << ms_between(released_at, waiter->exited_at())
            << " ms after the holder was told to finish\n";
  EXPECT_FALSE(redis().exists(lock_key("waitok")));
}

TEST_F(LockTest, WaitRunsOutGives75) {
  auto holder = hold("waitout");
  auto r = run(sh_args("waitout", "touch ran", {"--wait", "300ms"}));
  EXPECT_EQ(r.exit_code, 75) << r;
  EXPECT_GE(r.elapsed, 300ms) << r;
  EXPECT_LT(r.elapsed, 3000ms) << r;
  auto r2 = run(sh_args("waitout", "touch ran", {"-w", "300ms", "-E", "9"}));
  EXPECT_EQ(r2.exit_code, 9) << r2;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  touch("go");
  EXPECT_EQ(holder->wait_for_exit(10s), 0) << holder->result();
}

TEST_F(LockTest, WaitUntilHolderLeaseExpires) {
  // A holder that cannot release (SIGKILLed with its lease in place): a waiter acquires once the
  // key expires on the server.
  auto holder = start(sh_args("expire", kHoldUntilGo, {"--ttl", "1s"}));
  const pid_t cmd = wait_pid("pid");
  ASSERT_TRUE(holder->signal(SIGKILL));
  holder->wait_for_exit(5s);
  ASSERT_TRUE(wait_dead(cmd, 5s));
  auto r = run(sh_args("expire", "echo $FENCERUN_TOKEN", {"--wait", "5s"}));
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_LT(r.elapsed, 3000ms) << r;
}

TEST_F(LockTest, SignalEndsWaitWith128PlusSignal) {
  auto holder = hold("sigwait");
  const auto before = redis().get(lock_key("sigwait"));
  for (auto [sig, name] : {std::pair{SIGINT, "INT"}, {SIGTERM, "TERM"}, {SIGHUP, "HUP"},
                           {SIGQUIT, "QUIT"}}) {
    auto waiter = start(sh_args("sigwait", "touch ran", {"--wait", "60s"}));
    std::this_thread::sleep_for(200ms);
    ASSERT_TRUE(waiter->running()) << name << ": " << waiter->result();
    const auto sent = Clock::now();
    waiter->signal(sig);
    auto code = waiter->wait_for_exit(5s);
    EXPECT_EQ(code, 128 + sig) << name << ": " << waiter->result();
    EXPECT_LT(ms_between(sent, waiter->exited_at()), 1000) << name << ": must stop waiting at once";
  }
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_EQ(redis().get(lock_key("sigwait")), before);
  touch("go");
  EXPECT_EQ(holder->wait_for_exit(10s), 0) << holder->result();
}

TEST_F(LockTest, SignalsAreForwardedToTheCommand) {
  const std::string script =
      "trap 'echo USR1 >> got' USR1; trap 'echo USR2 >> got' USR2; trap 'echo HUP >> got' HUP; "
      "echo $$ > pid; while [ ! -e go ]; do sleep 0.02; done";
  auto p = start(sh_args("fwd", script));
  wait_pid("pid");
  std::string expected;
  for (auto [sig, name] : {std::pair{SIGUSR1, "USR1"}, {SIGUSR2, "USR2"}, {SIGHUP, "HUP"}}) {
    ASSERT_TRUE(p->signal(sig));
    expected += std::string(name) + "\n";
    EXPECT_TRUE(wait_until([&] { return read_file(file("got")).value_or("") == expected; }, 5s))
        << name << " not forwarded; got: " << read_file(file("got")).value_or("(nothing)");
  }
  touch("go");
  EXPECT_EQ(p->wait_for_exit(10s), 0) << p->result();
}

TEST_F(LockTest, InterruptForwardedEndsCommandAndReleases) {
  auto p = start(sh_args("intr", kHoldUntilGo));
  const pid_t cmd = wait_pid("pid");
  wait_lock("intr");
  ASSERT_TRUE(p->signal(SIGINT));
  EXPECT_EQ(p->wait_for_exit(10s), 128 + SIGINT) << p->result();
  EXPECT_TRUE(process_dead(cmd));
  EXPECT_FALSE(redis().exists(lock_key("intr")));
}

TEST_F(LockTest, StatusHeldByAnotherFencerun) {
  auto holder = hold("stat", {"--ttl", "20s"});
  auto r = run({"status", "-r", redis().url(), "stat"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto lines = split_lines(r.out);
  ASSERT_GE(lines.size(), 4u) << r;
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[0], m,
                               std::regex(R"(stat: held by pid (\d+) on (\S+) \(owner ([0-9a-fA-F]{8})\))")))
      << lines[0];
  EXPECT_EQ(std::stoll(m[1]), holder->pid()) << "the pid of the fencerun holding the lock";
  EXPECT_EQ(m[2].str(), hostname());
  const auto lv = parse_lock_value(redis().get(lock_key("stat")).value_or(""));
  ASSERT_TRUE(lv.has_value());
  EXPECT_EQ(lower(m[3].str()), lower(lv->owner.substr(0, 8)));
  EXPECT_EQ(lines[1], "token: " + std::to_string(holder_token_));
  ASSERT_TRUE(std::regex_match(lines[2], m, std::regex(R"(ttl: (\d+)ms remaining)"))) << lines[2];
  EXPECT_GT(std::stoll(m[1]), 0);
  EXPECT_LE(std::stoll(m[1]), 20000);
  EXPECT_EQ(lines[3], "last token: " + std::to_string(holder_token_));

  auto j = run({"status", "-r", redis().url(), "stat", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j;
  auto doc = parse_json(j.out);
  ASSERT_TRUE(doc.has_value()) << "status --json is not JSON: " << j.out;
  ASSERT_EQ(doc->kind, Json::Kind::Object);
  EXPECT_EQ(doc->find("lock") ? doc->find("lock")->as_string() : std::nullopt,
            std::optional<std::string>("stat"));
  EXPECT_TRUE(doc->find("held") && doc->find("held")->is_true()) << j.out;
  EXPECT_EQ(doc->find("owner") ? lower(doc->find("owner")->as_string().value_or("")) : "",
            lower(lv->owner.substr(0, 8)));
  EXPECT_EQ(doc->find("host") ? doc->find("host")->as_string() : std::nullopt,
            std::optional<std::string>(hostname()));
  EXPECT_EQ(json_int(doc->find("pid")), holder->pid());
  EXPECT_EQ(json_int(doc->find("token")), holder_token_);
  EXPECT_EQ(json_int(doc->find("last_token")), holder_token_);
  const auto ttl = json_int(doc->find("ttl_ms"));
  ASSERT_TRUE(ttl.has_value()) << j.out;
  EXPECT_GT(*ttl, 0);
  EXPECT_LE(*ttl, 20000);

  touch("go");
  ASSERT_EQ(holder->wait_for_exit(10s), 0) << holder->result();

  auto f = run({"status", "-r", redis().url(), "stat"});
  EXPECT_EQ(f.exit_code, 3) << f;
  // The record of runs follows (tests/cron checks its fields).
  EXPECT_TRUE(f.out.starts_with("stat: free\nlast token: " + std::to_string(holder_token_) + "\nlast run: ok after "))
      << f;
  EXPECT_NE(f.out.find("\nlast success: ok after "), std::string::npos) << f;

  auto fj = run({"status", "-r", redis().url(), "--json", "stat"});
  EXPECT_EQ(fj.exit_code, 3) << fj;
  auto fdoc = parse_json(fj.out);
  ASSERT_TRUE(fdoc.has_value()) << fj.out;
  ASSERT_NE(fdoc->find("held"), nullptr) << fj.out;
  EXPECT_EQ(fdoc->find("held")->kind, Json::Kind::Bool);
  EXPECT_FALSE(fdoc->find("held")->boolean);
  EXPECT_EQ(json_int(fdoc->find("last_token")), holder_token_);
}

TEST_F(LockTest, StatusNeverUsedLock) {
  auto r = run({"status", "-r", redis().url(), "never"});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_EQ(r.out, "never: free\nlast token: none\n") << r;
  auto j = run({"status", "-r", redis().url(), "never", "--json"});
  EXPECT_EQ(j.exit_code, 3) << j;
  auto doc = parse_json(j.out);
  ASSERT_TRUE(doc.has_value()) << j.out;
  ASSERT_NE(doc->find("last_token"), nullptr) << j.out;
  EXPECT_EQ(doc->find("last_token")->kind, Json::Kind::Null) << j.out;
  EXPECT_EQ(redis().dbsize(), 0) << "status must not write";
}

TEST_F(LockTest, StatusWithRedisDown) {
  const std::string dead = "redis://127.0.0.1:" + std::to_string(unused_port());
  auto r = run({"status", "-r", dead, "--timeout", "1s", "x"});
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(r.err.empty());
  EXPECT_LT(r.elapsed, 3000ms);
}

TEST_F(LockTest, StatusUsesKeyPrefix) {
  auto r = run(sh_args("pst", "true", {"--key-prefix", "app1:"}));
  ASSERT_EQ(r.exit_code, 0) << r;
  auto s = run({"status", "-r", redis().url(), "--key-prefix", "app1:", "pst"});
  EXPECT_EQ(s.exit_code, 3) << s;
  EXPECT_TRUE(s.out.starts_with("pst: free\nlast token: " + redis().get(token_key("pst", "app1:")).value_or("?") +
                                 "\nlast run: ok after "))
      << s;
  EXPECT_TRUE(redis().exists("app1:{pst}:runs")) << "the record is under the key prefix";
}

}  // namespace
}  // namespace fencerun::test
