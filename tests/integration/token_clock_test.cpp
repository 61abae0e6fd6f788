// Tokens and the Redis server's clock: the clock floor of `max(counter + 1, server time)` protects a
// lost counter only on a server whose clock is ahead of the last token. Servers with a lagging clock
// run under an LD_PRELOAD shim (tests/support/clock_shim.c) that moves their wall clock.
#include <chrono>
#include <iostream>
#include <regex>

#include "fixture.hpp"

#ifndef FENCERUN_CLOCK_SHIM
#error "FENCERUN_CLOCK_SHIM must name the clock shim library"
#endif

namespace fencerun::test {
namespace {

constexpr long long kLagUs = 30'000'000;  // the lagging server's clock: 30 s behind

// The environment that starts a server with its wall clock moved by `offset_us`.
EnvList clock_offset(long long offset_us) {
  return {{"LD_PRELOAD", FENCERUN_CLOCK_SHIM}, {"FENCERUN_TEST_CLOCK_OFFSET_US", std::to_string(offset_us)}};
}

long long real_time_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

RedisOptions lagging_clock() {
  RedisOptions o;
  o.env = clock_offset(-kLagUs);
  return o;
}

RedisOptions replication(std::optional<int> master_port = std::nullopt, EnvList env = {}) {
  RedisOptions o;
  o.extra_args = {"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"};
  if (master_port) o.extra_args.insert(o.extra_args.end(), {"--replicaof", "127.0.0.1", std::to_string(*master_port)});
  o.env = std::move(env);
  return o;
}

std::string info_field(const std::string& info, const std::string& field) {
  std::smatch m;
  if (std::regex_search(info, m, std::regex("(^|\n)" + field + ":([^\r\n]*)"))) return m[2].str();
  return {};
}

void wait_replica_online(const RedisServer& master, const RedisServer& replica) {
  const std::string online = "port=" + std::to_string(replica.port()) + ",state=online";
  const bool ok = wait_until(
      [&] {
        Reply m = master.cmd({"INFO", "replication"});
        Reply r = replica.cmd({"INFO", "replication"});
        return m.type == Reply::Type::String && r.type == Reply::Type::String &&
               m.str.find(online) != std::string::npos && info_field(r.str, "master_link_status") == "up";
      },
      15s, 20ms);
  if (!ok) throw std::runtime_error("replica never came online\n" + replica.log());
}

// The warning of a run on a server whose clock is behind its counter, in the default text format.
const std::regex kClockBehindWarning(
    R"(fencerun: warning: the Redis server's clock is (\d+)\.(\d)s behind the last token: )"
    R"(tokens rely on the counter alone \[lock: ([^,]+), token: (\d+), behind_ms: (\d+)\])");

class TokenClockTest : public FencerunTest {
 protected:
  void TearDown() override {
    if (HasFailure()) {
      for (const auto* s : {lagging_.get(), master_.get()})
        if (s) std::cout << "--- redis-server log (" << s->url() << ") ---\n" << s->log() << "\n";
    }
    FencerunTest::TearDown();
  }

  // -r URL NAME -- sh -c 'echo $FENCERUN_TOKEN', plus `options`.
  static std::vector<std::string> token_args(const RedisServer& server, const std::string& name,
                                             std::vector<std::string> options = {}) {
    std::vector<std::string> a = {"-r", server.url()};
    a.insert(a.end(), options.begin(), options.end());
    a.insert(a.end(), {name, "--", "sh", "-c", "echo \"$FENCERUN_TOKEN\""});
    return a;
  }

  // Runs fencerun on `server` and returns the token its command saw (fails the test when none).
  long long issue(const RedisServer& server, const std::string& name, RunResult* out = nullptr,
                  std::vector<std::string> options = {}) {
    RunResult r = run(token_args(server, name, std::move(options)));
    EXPECT_EQ(r.exit_code, 0) << r;
    const auto token = parse_ll(trim(r.out));
    EXPECT_TRUE(token.has_value()) << r;
    if (out) *out = r;
    return token.value_or(0);
  }

  std::unique_ptr<RedisServer> lagging_;
  std::unique_ptr<RedisServer> master_;
};

TEST_F(TokenClockTest, ClockShimPutsTheServerClockBehind) {
  lagging_ = std::make_unique<RedisServer>(lagging_clock());
  const long long before = real_time_us();
  const long long lagging = lagging_->time_us();
  const long long normal = redis().time_us();
  const long long after = real_time_us();
  std::cout << "[ clock ] real " << before << ", normal server " << normal << ", lagging server " << lagging
            << " (" << (before - lagging) / 1000 << " ms behind)\n";
  EXPECT_GE(normal, before - 1'000) << "the server without the shim keeps the real clock";
  EXPECT_LE(normal, after + 1'000);
  EXPECT_GE(lagging, before - kLagUs - 1'000) << "TIME of the server under the shim";
  EXPECT_LE(lagging, after - kLagUs + 1'000) << "TIME of the server under the shim";
}

// The documented limit: the counter is lost (a restart without persistence) and the server's clock
// has stepped back past the last token. The next token is smaller, and a guard that accepted the
// last one rejects the new holder with 77 until the clock passes it: safety holds, progress stops.
TEST_F(TokenClockTest, TokenGoesBackwardsWhenCounterIsLostAndServerClockLags) {
  // The holder writes its token to the file `data` through the file guard.
  const std::string guard = "echo \"$FENCERUN_TOKEN\" > token; printf '%s' \"$FENCERUN_TOKEN\" | " +
                            shell_quote(fencerun_binary()) + " fence file data";
  auto first = run({"-r", redis().url(), "stepback", "--", "sh", "-c", guard});
  ASSERT_EQ(first.exit_code, 0) << first;
  const long long t1 = parse_ll(wait_line("token")).value_or(0);
  ASSERT_GT(t1, kMinPlausibleToken) << first;
  ASSERT_EQ(read_file(file("data")), std::to_string(t1));

  redis().stop();
  redis().set_env(clock_offset(-kLagUs));
  redis().start();
  ASSERT_FALSE(redis().exists(token_key("stepback"))) << "the restart must have lost the counter";

  std::filesystem::remove(file("token"));
  auto second = run({"-r", redis().url(), "stepback", "--", "sh", "-c", guard});
  const long long t2 = parse_ll(wait_line("token")).value_or(0);
  std::cout << "[ tokens ] T1=" << t1 << " on the real clock, T2=" << t2 << " after the counter was lost on a "
            << "server 30s behind: " << (t1 - t2) / 1000 << " ms backwards\n";
  ASSERT_GT(t2, kMinPlausibleToken) << second;
  EXPECT_LT(t2, t1) << "the clock floor was expected to fail here (docs: token goes backwards)";
  EXPECT_LT(t1 - t2, kLagUs);
  EXPECT_GT(t1 - t2, kLagUs - 10'000'000);
  EXPECT_EQ(second.exit_code, 77) << "the guard must reject the smaller token\n" << second;
  EXPECT_NE(second.err.find("stale token " + std::to_string(t2) + " rejected"), std::string::npos) << second;
  EXPECT_EQ(read_file(file("data")), std::to_string(t1)) << "the rejected holder must write nothing";
  // Nothing could have told: the server had no counter to compare its clock with.
  EXPECT_EQ(second.err.find("behind the last token"), std::string::npos) << second;

  // The documented way out: set the counter to the greatest token the guard accepted.
  ASSERT_TRUE(redis().cmd({"SET", token_key("stepback"), std::to_string(t1)}).ok());
  std::filesystem::remove(file("token"));
  auto third = run({"-r", redis().url(), "stepback", "--", "sh", "-c", guard});
  EXPECT_EQ(third.exit_code, 0) << third;
  EXPECT_EQ(parse_ll(wait_line("token")), t1 + 1);
  EXPECT_EQ(read_file(file("data")), std::to_string(t1 + 1));
  EXPECT_TRUE(std::regex_search(third.err, kClockBehindWarning)) << third;
}

// The measured case: a replica whose clock lags, promoted after missing the last counter write.
TEST_F(TokenClockTest, TokenGoesBackwardsOnFailoverToLaggingReplicaThatMissedTheLastWrite) {
  master_ = std::make_unique<RedisServer>(replication());
  lagging_ = std::make_unique<RedisServer>(replication(master_->port(), clock_offset(-kLagUs)));
  wait_replica_online(*master_, *lagging_);

  // The replica stops receiving: frozen, and its link cut by the master (a frozen process's socket
  // would still buffer what the master sends). T1 exists only on the master.
  lagging_->freeze();
  Reply cut = master_->cmd({"CLIENT", "KILL", "TYPE", "replica"});
  ASSERT_EQ(cut.type, Reply::Type::Integer) << cut.describe();
  ASSERT_EQ(cut.integer, 1) << "one replica link to cut";
  const long long t1 = issue(*master_, "failover");

  master_->stop();
  lagging_->thaw();
  ASSERT_TRUE(lagging_->cmd({"REPLICAOF", "NO", "ONE"}).ok());
  ASSERT_FALSE(lagging_->exists(token_key("failover"))) << "the promoted replica must have missed T1";
  const long long t2 = issue(*lagging_, "failover");
  std::cout << "[ tokens ] T1=" << t1 << " on the master, T2=" << t2 << " on the promoted replica 30s behind: "
            << (t1 - t2) / 1000 << " ms backwards\n";
  EXPECT_LT(t2, t1) << "the clock floor was expected to fail here (docs: token goes backwards)";
}

TEST_F(TokenClockTest, WarnsWhenServerClockIsBehindItsCounter) {
  // T1 from a server on the real clock, held by a server whose clock lags (a replica that did get
  // the last write, or a counter restored from elsewhere).
  const long long t1 = issue(redis(), "lagging");
  lagging_ = std::make_unique<RedisServer>(lagging_clock());
  ASSERT_TRUE(lagging_->cmd({"SET", token_key("lagging"), std::to_string(t1)}).ok());

  RunResult r;
  const long long t2 = issue(*lagging_, "lagging", &r);
  EXPECT_EQ(t2, t1 + 1) << "the counter, not the clock, issues the token";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, kClockBehindWarning)) << "no clock warning at the default level\n" << r;
  std::cout << "[ warning ] " << m[0].str() << "\n";
  const long long tenths = std::stoll(m[1]) * 10 + std::stoll(m[2]);
  EXPECT_GE(tenths, 250) << "about 30s behind";
  EXPECT_LE(tenths, 300) << "about 30s behind";
  EXPECT_EQ(m[3].str(), "lagging");
  EXPECT_EQ(m[4].str(), std::to_string(t2));
  EXPECT_NEAR(std::stoll(m[5]), tenths * 100, 100);

  // The same in JSON, with the event name and its level.
  RunResult j;
  const long long t3 = issue(*lagging_, "lagging", &j, {"--log-format", "json"});
  EXPECT_EQ(t3, t2 + 1);
  const auto lines = split_lines(j.err);
  ASSERT_EQ(lines.size(), 1u) << "one warning line expected\n" << j;
  auto doc = parse_json(lines[0]);
  ASSERT_TRUE(doc.has_value()) << lines[0];
  EXPECT_EQ(doc->find("event") ? doc->find("event")->as_string() : std::nullopt,
            std::optional<std::string>("clock_behind"));
  EXPECT_EQ(doc->find("level") ? doc->find("level")->as_string() : std::nullopt, std::optional<std::string>("warn"));
  EXPECT_EQ(json_int(doc->find("token")), t3);
  const auto behind = json_int(doc->find("behind_ms"));
  ASSERT_TRUE(behind.has_value()) << lines[0];
  EXPECT_GT(*behind, 25'000);
  EXPECT_LE(*behind, 30'000);
}

TEST_F(TokenClockTest, NoClockWarningWhenServerClockIsAheadOfItsCounter) {
  RunResult first, second;
  const long long t1 = issue(redis(), "ahead", &first);
  const long long t2 = issue(redis(), "ahead", &second);  // the counter holds t1, behind the clock
  EXPECT_GT(t2, t1);
  for (const auto* r : {&first, &second})
    EXPECT_EQ(r->err.find("behind the last token"), std::string::npos) << *r;
  RunResult j;
  issue(redis(), "ahead", &j, {"--log-format", "json"});
  EXPECT_EQ(j.err.find("clock_behind"), std::string::npos) << j;
}

// --min-replicas 1: WAIT makes the replica hold the last counter write, so a promoted replica whose
// clock lags still counts on from it (and says that its clock is behind).
TEST_F(TokenClockTest, MinReplicasKeepsTokensIncreasingAcrossFailoverToLaggingReplica) {
  master_ = std::make_unique<RedisServer>(replication());
  lagging_ = std::make_unique<RedisServer>(replication(master_->port(), clock_offset(-kLagUs)));
  wait_replica_online(*master_, *lagging_);

  const long long t1 = issue(*master_, "covered", nullptr, {"--min-replicas", "1"});
  // WAIT returned once the replica acknowledged the write: it holds T1 now, no polling needed.
  EXPECT_EQ(lagging_->get(token_key("covered")), std::to_string(t1));

  master_->stop();
  ASSERT_TRUE(lagging_->cmd({"REPLICAOF", "NO", "ONE"}).ok());
  RunResult r;
  const long long t2 = issue(*lagging_, "covered", &r);
  std::cout << "[ tokens ] T1=" << t1 << " on the master with --min-replicas 1, T2=" << t2
            << " on the promoted replica 30s behind\n";
  EXPECT_EQ(t2, t1 + 1);
  EXPECT_TRUE(std::regex_search(r.err, kClockBehindWarning)) << r;
}

}  // namespace
}  // namespace fencerun::test
