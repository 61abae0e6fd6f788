// Faults that production Redis deployments produce on their own: a server that closes idle clients
// (`timeout`), one that is loading its dataset after a restart (LOADING), one running a script too
// long (BUSY), one at its client limit (`maxclients`). fencerun rides out the first, waits out the others while --wait lasts, and without
// --wait exits 69 with the server's own words.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

long long count_of(const std::string& text, std::string_view what) {
  long long n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The value of a Prometheus textfile metric (labels ignored), or -1.
long long metric(const std::string& text, const std::string& name) {
  for (const auto& line : split_lines(text)) {
    if (line.rfind(name, 0) != 0 || line.size() == name.size() || (line[name.size()] != ' ' && line[name.size()] != '{'))
      continue;
    return std::stoll(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

// Warnings and errors in a text log (the default format names the level of those).
bool has_warning(const std::string& err) {
  return err.find("fencerun: warning") != std::string::npos || err.find("fencerun: error") != std::string::npos;
}

class IdleTimeoutTest : public FencerunTest {
 protected:
  void SetUp() override {
    FencerunTest::SetUp();
    ASSERT_TRUE(redis().cmd({"CONFIG", "SET", "timeout", "1"}).ok());
  }
};

// The release after a job longer than the idle timeout goes out on a new connection: the lock is
// gone when fencerun exits, not held for the rest of its TTL.
TEST_F(IdleTimeoutTest, ReleaseAfterIdleCloseDeletesTheLock) {
  auto r = run({"-r", redis().url(), "--ttl", "30s", "-vv", "--log-format", "json", "idle", "--", "sleep", "3.5"});
  EXPECT_FALSE(redis().exists(lock_key("idle"))) << "the lock outlived the run: " << r;
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("\"reconnected\""), std::string::npos) << "the server did not close the idle connection? " << r;
  EXPECT_EQ(r.err.find("release_failed"), std::string::npos) << r;
  EXPECT_NE(r.err.find("\"released\""), std::string::npos) << r;
}

// Renewals 2.5 s apart each meet a connection the server closed after 1 s: each is sent on a new
// one, none counts as a failure, and nothing is said at the default level.
TEST_F(IdleTimeoutTest, RenewalsAcrossIdleClosesAreNoFailures) {
  const auto metrics = file("metrics.prom");
  auto r = run({"-r", redis().url(), "--ttl", "7500ms", "--metrics-file", metrics.string(), "renewing", "--", "sleep",
                "8"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_FALSE(has_warning(r.err)) << "a warning at the default level: " << r;
  const std::string m = read_file(metrics);
  std::cout << "renewals " << metric(m, "fencerun_last_renewals") << ", failures "
            << metric(m, "fencerun_last_renew_failures") << "\n";
  EXPECT_GE(metric(m, "fencerun_last_renewals"), 2) << m;
  EXPECT_EQ(metric(m, "fencerun_last_renew_failures"), 0) << m;
  EXPECT_FALSE(redis().exists(lock_key("renewing")));
}

// A waiter whose connection the server closed while it waited acquires once the holder releases.
TEST_F(IdleTimeoutTest, WaiterAcrossIdleCloseAcquires) {
  auto holder = start(sh_args("waited", kHoldUntilGo));
  wait_pid("pid");
  wait_lock("waited");
  auto waiter = start({"-r", redis().url(), "--wait", "30s", "waited", "--", "sh", "-c", "echo got > got"});
  // Long enough for the server to close the waiter's idle connection (timeout 1 s, checked ten
  // times a second).
  std::this_thread::sleep_for(2500ms);
  touch("go");
  EXPECT_EQ(holder->wait_for_exit(10s), 0) << holder->result();
  EXPECT_EQ(waiter->wait_for_exit(10s), 0) << waiter->result();
  EXPECT_TRUE(std::filesystem::exists(file("got")));
  EXPECT_FALSE(has_warning(waiter->err())) << waiter->result();
  EXPECT_FALSE(redis().exists(lock_key("waited")));
}

// A server restarted on a dataset that takes about five seconds to load answers LOADING meanwhile.
class LoadingTest : public FencerunTest {
 protected:
  RedisOptions redis_options() const override {
    return {std::nullopt,
            {"--enable-debug-command", "yes", "--key-load-delay", "100", "--loading-process-events-interval-bytes",
             "1024"}};
  }
  // Returns once the restarted server answers LOADING.
  void restart_loading() {
    ASSERT_TRUE(redis().cmd({"DEBUG", "POPULATE", "20000"}, 10000ms).ok());
    ASSERT_TRUE(redis().cmd({"SAVE"}, 10000ms).ok());
    redis().restart();
    const auto r = redis().cmd({"GET", "x"});
    if (r.type != Reply::Type::Error || r.str.rfind("LOADING", 0) != 0)
      FAIL() << "the restarted server is not loading: " << r.describe();
  }
};

TEST_F(LoadingTest, WaitRidesOutLoading) {
  ASSERT_NO_FATAL_FAILURE(restart_loading());
  const auto t0 = Clock::now();
  auto r = run({"-r", redis().url(), "--wait", "30s", "loading", "--", "true"}, {}, 40s);
  const auto took = ms_between(t0, Clock::now());
  std::cout << "acquired after " << took << " ms of LOADING\n";
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(count_of(r.err, "trying again while the wait lasts"), 1) << r;
  EXPECT_NE(r.err.find("LOADING"), std::string::npos) << r;
  EXPECT_FALSE(redis().exists(lock_key("loading")));
}

TEST_F(LoadingTest, WithoutWaitLoadingIsUnavailable) {
  ASSERT_NO_FATAL_FAILURE(restart_loading());
  auto r = run({"-r", redis().url(), "loading", "--", "true"});
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_NE(r.err.find("LOADING"), std::string::npos) << r;
}

// A script that runs past busy-reply-threshold: the server answers BUSY to everything else until it
// ends (here: SCRIPT KILL).
class BusyTest : public FencerunTest {};

TEST_F(BusyTest, WaitRidesOutABusyScriptAndWithoutWaitItIsUnavailable) {
  ASSERT_TRUE(redis().cmd({"CONFIG", "SET", "busy-reply-threshold", "100"}).ok());
  std::thread script([&] { redis().cmd({"EVAL", "while true do end", "0"}, 30000ms); });
  const bool busy = wait_until([&] { return redis().cmd({"PING"}).str.rfind("BUSY", 0) == 0; }, 5s);
  RunResult nowait;
  std::unique_ptr<FencerunProcess> waiter;
  if (busy) {
    nowait = run({"-r", redis().url(), "busy", "--", "true"});
    waiter = start({"-r", redis().url(), "--wait", "20s", "busy", "--", "true"});
    std::this_thread::sleep_for(700ms);
  }
  redis().cmd({"SCRIPT", "KILL"});
  script.join();
  ASSERT_TRUE(busy) << "the server never answered BUSY";
  EXPECT_EQ(nowait.exit_code, 69) << nowait;
  EXPECT_NE(nowait.err.find("BUSY"), std::string::npos) << nowait;
  EXPECT_EQ(waiter->wait_for_exit(20s), 0) << waiter->result();
  EXPECT_EQ(count_of(waiter->err(), "trying again while the wait lasts"), 1) << waiter->result();
  EXPECT_FALSE(redis().exists(lock_key("busy")));
}

// maxclients 1, taken by an idle client: the server answers "-ERR max number of clients reached"
// and closes.
class MaxClientsTest : public FencerunTest {
 protected:
  RedisOptions redis_options() const override { return {std::nullopt, {"--maxclients", "1"}}; }
  void take_the_only_client() {
    idle_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(redis().port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(idle_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    // The server has accepted it once a second client is refused.
    ASSERT_TRUE(wait_until([&] { return redis().cmd({"PING"}, 500ms).str.find("max number") != std::string::npos; },
                           5s));
  }
  void let_go() {
    if (idle_ >= 0) ::close(idle_);
    idle_ = -1;
  }
  void TearDown() override {
    let_go();
    FencerunTest::TearDown();
  }
  void expect_refused(const std::vector<std::string>& args) {
    const auto t0 = Clock::now();
    auto r = run(args);
    const auto took = ms_between(t0, Clock::now());
    std::cout << args.front() << ": exit " << r.exit_code << " after " << took << " ms\n";
    EXPECT_EQ(r.exit_code, 69) << r;
    EXPECT_LT(took, 1000) << r;
    EXPECT_NE(r.err.find("max number of clients reached"), std::string::npos) << r;
    EXPECT_EQ(r.err.find("reset by peer"), std::string::npos) << r;
  }
  int idle_ = -1;
};

TEST_F(MaxClientsTest, RunStatusAndListNameTheClientLimit) {
  ASSERT_NO_FATAL_FAILURE(take_the_only_client());
  expect_refused({"-r", redis().url(), "full", "--", "true"});
  expect_refused({"status", "-r", redis().url(), "full"});
  expect_refused({"list", "-r", redis().url()});
}

TEST_F(MaxClientsTest, WaitTriesAgainUntilAClientLeaves) {
  ASSERT_NO_FATAL_FAILURE(take_the_only_client());
  auto waiter = start({"-r", redis().url(), "--wait", "20s", "full", "--", "true"});
  std::this_thread::sleep_for(700ms);
  let_go();
  EXPECT_EQ(waiter->wait_for_exit(20s), 0) << waiter->result();
  EXPECT_EQ(count_of(waiter->err(), "trying again while the wait lasts"), 1) << waiter->result();
  EXPECT_NE(waiter->err().find("max number of clients reached"), std::string::npos) << waiter->result();
}

}  // namespace
}  // namespace fencerun::test
