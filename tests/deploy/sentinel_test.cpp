// redis+sentinel://: master discovery through sentinels, a dead sentinel in the list, and a failover
// while a lease is held (it survives when the promoted replica has the lock; it is lost, and the
// command stopped, when the promoted replica lacks it). Tokens issued after a failover exceed every
// token issued before it.
#include <iostream>
#include <thread>

#include "deploy_support.hpp"
#include "support/json.hpp"
#include "support/server_under_test.hpp"

namespace fencerun::test::deploy {
namespace {

class SentinelTest : public DeployTest {
 protected:
  void SetUp() override {
    topo_ = std::make_unique<SentinelTopology>();
    on_failure_.push_back([this] { return topo_->logs(); });
  }

  // status --json through the sentinels: exit code and the parsed object.
  std::pair<int, std::optional<Json>> status_json(const std::string& url) const {
    RunResult r = run({"status", "-r", url, "job", "--json"}, {}, 20s);
    return {r.exit_code, parse_json(trim(r.out))};
  }

  static std::optional<long long> json_number(const std::optional<Json>& j, std::string_view key) {
    if (!j) return std::nullopt;
    const Json* v = j->find(key);
    return v ? v->as_int() : std::nullopt;
  }

  // Starts a holder (ttl as given) through the sentinels and waits until it holds the lock on the
  // master and the lock has reached the replica. Returns the token.
  long long hold(std::unique_ptr<FencerunProcess>& holder, const std::string& ttl) {
    std::filesystem::remove(file("token"));
    std::filesystem::remove(file("pid"));
    holder = start(sh_args(topo_->url(), "job", kTokenUntilGo, {"-t", ttl, "-vv"}));
    const long long token = read_token(file("token"), 15s);
    wait_pid("pid");
    auto value = topo_->master().get(lock_key("job"));
    if (!value) throw std::runtime_error("holder runs but the master has no lock");
    lock_value_ = *value;
    if (!wait_replicated(topo_->replica(), lock_key("job"), lock_value_))
      throw std::runtime_error("the lock never reached the replica");
    return token;
  }

  // Waits until the lock on `server` carries our value with a TTL reset by a renewal there (above
  // `above_ms`). Returns the PTTL seen, or -3 on timeout.
  long long wait_renewed_on(const RedisServer& server, long long above_ms, Clock::duration timeout) {
    long long seen = -3;
    wait_until(
        [&] {
          Reply v = server.cmd({"GET", lock_key("job")});
          Reply t = server.cmd({"PTTL", lock_key("job")});
          if (v.type != Reply::Type::String || v.str != lock_value_) return false;
          if (t.type == Reply::Type::Integer && t.integer > above_ms) {
            seen = t.integer;
            return true;
          }
          return false;
        },
        timeout, 20ms);
    return seen;
  }

  // A run through the sentinels after the failover; returns its token.
  long long token_of_next_run() {
    std::filesystem::remove(file("token2"));
    RunResult r = run(sh_args(topo_->url(), "job", "echo \"$FENCERUN_TOKEN\" > token2"), {}, 30s);
    if (r.exit_code != 0) throw std::runtime_error("run after failover failed\n" + r.describe());
    return read_token(file("token2"), 1s);
  }

  std::unique_ptr<SentinelTopology> topo_;
  std::string lock_value_;
};

// The server matrix runs these tests once per server: the master, the replica and the sentinels
// must be that server, not the default one.
TEST_F(SentinelTest, ServersAndSentinelsAreTheServerUnderTest) {
  EXPECT_TRUE(is_server_under_test(topo_->master().cmd({"HELLO", "2"})));
  EXPECT_TRUE(is_server_under_test(topo_->replica().cmd({"HELLO", "2"})));
  for (int i = 0; i < 3; ++i) {
    const Reply hello = topo_->sentinel(i).cmd({"HELLO", "2"});
    EXPECT_TRUE(is_server_under_test(hello));
    EXPECT_EQ(hello_field(hello, "mode"), "sentinel") << hello.describe();
  }
}

TEST_F(SentinelTest, RunAndStatusThroughSentinels) {
  RunResult r = run(sh_args(topo_->url(), "job", "echo \"$FENCERUN_TOKEN\" > token"));
  ASSERT_EQ(r.exit_code, 0) << r;
  const long long t1 = read_token(file("token"), 1s);
  EXPECT_EQ(topo_->master().get(token_key("job")), std::to_string(t1))
      << "the token must have been issued on the master";
  EXPECT_FALSE(topo_->master().exists(lock_key("job")));

  auto [free_code, free_json] = status_json(topo_->url());
  EXPECT_EQ(free_code, 3);
  EXPECT_EQ(json_number(free_json, "last_token"), t1);

  std::unique_ptr<FencerunProcess> holder;
  const long long t2 = hold(holder, "10s");
  EXPECT_GT(t2, t1);
  auto [held_code, held_json] = status_json(topo_->url());
  EXPECT_EQ(held_code, 0);
  EXPECT_EQ(json_number(held_json, "token"), t2);
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  EXPECT_EQ(*holder->exit_code(), 0) << holder->result();
  EXPECT_FALSE(topo_->master().exists(lock_key("job")));
}

TEST_F(SentinelTest, DeadSentinelInTheListIsSkipped) {
  const int dead = unused_port();
  const std::string url = topo_->url(dead);
  RunResult r = run(sh_args(url, "job", "echo \"$FENCERUN_TOKEN\" > token"));
  ASSERT_EQ(r.exit_code, 0) << r;
  const long long t1 = read_token(file("token"), 1s);
  EXPECT_EQ(topo_->master().get(token_key("job")), std::to_string(t1));
  RunResult s = run({"status", "-r", url, "job"});
  EXPECT_EQ(s.exit_code, 3) << s;

  // A sentinel that was running and died (first real entry) is skipped as well.
  topo_->sentinel(0).stop();
  std::filesystem::remove(file("token"));
  RunResult r2 = run(sh_args(url, "job", "echo \"$FENCERUN_TOKEN\" > token"));
  ASSERT_EQ(r2.exit_code, 0) << r2;
  EXPECT_GT(read_token(file("token"), 1s), t1);

  // No sentinel answering at all: unavailable, nothing runs.
  RunResult none = run(sh_args("redis+sentinel://127.0.0.1:" + std::to_string(dead) + "/mymaster",
                               "job", "touch ran"));
  EXPECT_EQ(none.exit_code, 69) << none;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
}

// A sentinel that accepts connections but never answers (SIGSTOPped) must not eat the whole
// --timeout: each sentinel gets a share of it, and the others answer in time.
TEST_F(SentinelTest, HungFirstSentinelDoesNotBlockAcquisition) {
  topo_->sentinel(0).freeze();
  RunResult r = run({"-r", topo_->url(), "--timeout", "2s", "job", "--", "true"}, {}, 20s);
  note("hung first sentinel", r);
  std::cout << "[ hung sentinel ] exit " << r.exit_code << " after " << r.elapsed.count() << " ms\n";
  topo_->sentinel(0).thaw();
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_LT(r.elapsed, 2000ms) << "acquisition must fit in --timeout";
  EXPECT_TRUE(topo_->master().get(token_key("job")).has_value()) << "the token was issued on the master";
}

// A sentinel that hangs while a lease is held: the once-a-second master re-check may take only a
// small slice of a renewal's time, so renewals keep succeeding and the command completes.
TEST_F(SentinelTest, SentinelHangingMidRunDoesNotStarveRenewals) {
  std::unique_ptr<FencerunProcess> holder;
  hold(holder, "2s");
  topo_->sentinel(0).freeze();
  const auto frozen_at = Clock::now();
  long long min_pttl = 1'000'000;
  bool lock_kept = true;
  // Observe for 5 s (about seven renewals at ttl 2s): the lock stays ours and its TTL never runs low.
  while (Clock::now() < frozen_at + 5s && holder->running()) {
    Reply v = topo_->master().cmd({"GET", lock_key("job")});
    Reply t = topo_->master().cmd({"PTTL", lock_key("job")});
    if (v.type != Reply::Type::String || v.str != lock_value_) {
      lock_kept = false;
      break;
    }
    if (t.type == Reply::Type::Integer) min_pttl = std::min(min_pttl, t.integer);
    std::this_thread::sleep_for(20ms);
  }
  const bool ran_through = holder->running();
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  topo_->sentinel(0).thaw();
  const RunResult hr = holder->result();
  std::size_t failed = 0;
  for (auto pos = hr.err.find("renewal failed"); pos != std::string::npos; pos = hr.err.find("renewal failed", pos + 1))
    ++failed;
  std::cout << "[ hung sentinel ] holder exit " << hr.exit_code << "; lowest PTTL seen "
            << min_pttl << " ms; failed renewals " << failed << "\n";
  EXPECT_TRUE(ran_through) << "the command was stopped while a sentinel hung\n" << hr;
  EXPECT_TRUE(lock_kept) << "the lock left the master while the command ran\n" << hr;
  EXPECT_GT(min_pttl, 500) << "renewals fell behind\n" << hr;
  EXPECT_EQ(hr.exit_code, 0) << hr;
  EXPECT_FALSE(topo_->master().exists(lock_key("job"))) << "released at the end";
}

// SENTINEL FAILOVER while the lease is held, and nothing dies: the old master stays a master until
// the sentinels reconfigure it as a replica (they wait about 8 s before converting an instance that
// still claims to be a master), then its clients are disconnected. The lease must survive: fencerun
// has to renew on the new master, which holds the replicated lock, before that copy expires.
TEST_F(SentinelTest, LeaseSurvivesSentinelFailover) {
  std::unique_ptr<FencerunProcess> holder;
  const long long t1 = hold(holder, "6s");
  const int old_master = topo_->master().port();
  const auto failover_started = Clock::now();
  const int new_master = topo_->failover();
  const auto failover_done = Clock::now();
  RedisServer& promoted = *topo_->server_on(new_master);
  ASSERT_EQ(promoted.get(lock_key("job")), lock_value_) << "the replica had the lock before the failover";

  // While the command runs, observe: when does the old master become a replica, when does the lock
  // on the new master get renewed, and does `status` through the sentinels ever call the lock free?
  std::optional<long long> demoted_ms, renewed_on_new_ms, status_free_ms;
  const auto observe_until = failover_done + 25s;
  long long last_pttl = 1'000'000;
  while (Clock::now() < observe_until && holder->running()) {
    const long long now_ms = ms_between(failover_done, Clock::now());
    if (!demoted_ms && role_of(old_master) == "slave") demoted_ms = now_ms;
    if (!renewed_on_new_ms) {
      Reply v = promoted.cmd({"GET", lock_key("job")});
      Reply t = promoted.cmd({"PTTL", lock_key("job")});
      // A renewal on the new master puts the TTL back near 6 s; the replicated copy only counts down.
      if (v.type == Reply::Type::String && v.str == lock_value_ && t.type == Reply::Type::Integer) {
        if (t.integer > last_pttl + 200) renewed_on_new_ms = now_ms;
        last_pttl = t.integer;
      }
    }
    if (!status_free_ms) {
      auto [code, json] = status_json(topo_->url());
      if (code == 3) status_free_ms = now_ms;
    }
    if (demoted_ms && renewed_on_new_ms) break;
    std::this_thread::sleep_for(100ms);
  }
  std::cout << "[ failover ] SENTINEL FAILOVER took " << ms_between(failover_started, failover_done)
            << " ms; old master demoted after "
            << (demoted_ms ? std::to_string(*demoted_ms) + " ms" : std::string("(not seen)"))
            << "; lock renewed on the new master after "
            << (renewed_on_new_ms ? std::to_string(*renewed_on_new_ms) + " ms" : std::string("(never)"))
            << "; status through the sentinels said 'free' after "
            << (status_free_ms ? std::to_string(*status_free_ms) + " ms" : std::string("(never)"))
            << "; holder " << (holder->running() ? "still running" : "exited") << "\n";

  EXPECT_TRUE(holder->running()) << "the lease was lost across the failover";
  EXPECT_TRUE(renewed_on_new_ms.has_value())
      << "fencerun never renewed the lock on the new master (port " << new_master << ")";
  EXPECT_FALSE(status_free_ms.has_value())
      << "while the command still ran, the lock looked free through the sentinels (another fencerun "
         "would have acquired it) after "
      << status_free_ms.value_or(0) << " ms";

  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  const RunResult hr = holder->result();
  std::cout << "[ failover ] holder exit " << hr.exit_code << "; token before failover T1=" << t1
            << "\n--- holder stderr ---\n" << hr.err << "---------------------\n";
  EXPECT_EQ(hr.exit_code, 0) << "fencerun must exit with the command's status (stderr above)";
  EXPECT_EQ(promoted.get(token_key("job")), std::to_string(t1)) << "token counter on the new master";
  EXPECT_FALSE(promoted.exists(lock_key("job"))) << "the lock must be released on the new master";

  const long long t2 = token_of_next_run();
  std::cout << "[ failover ] token after failover T2=" << t2 << "\n";
  EXPECT_GT(t2, t1);
  EXPECT_EQ(promoted.get(token_key("job")), std::to_string(t2)) << "T2 issued on the new master";
}

// Failover, then the old master dies: fencerun's connection fails, it asks the sentinels again and
// renews on the new master, which has the replicated lock. The command completes normally.
TEST_F(SentinelTest, LeaseFollowsFailoverWhenOldMasterDies) {
  // ttl 10 s (renewed every 3.3 s): the copy on the promoted replica, last refreshed before the
  // failover, outlives the next renewal by a margin of seconds even on a loaded machine.
  std::unique_ptr<FencerunProcess> holder;
  const long long t1 = hold(holder, "10s");
  const int new_master = topo_->failover();
  RedisServer& promoted = *topo_->server_on(new_master);
  ASSERT_EQ(promoted.get(lock_key("job")), lock_value_) << "the replica had the lock before the failover";
  const long long pttl_at_failover = promoted.pttl(lock_key("job"));
  const auto killed_at = Clock::now();
  topo_->master().stop();

  // The next renewal goes to the new master: its TTL jumps back up.
  const long long renewed = wait_renewed_on(promoted, std::max(pttl_at_failover, 0LL) + 300, 8s);
  const long long renewed_after = ms_between(killed_at, Clock::now());
  EXPECT_GT(renewed, 0) << "the lock was never renewed on the new master (PTTL at failover "
                        << pttl_at_failover << ")\n"
                        << holder->result();
  EXPECT_TRUE(holder->running()) << holder->result();

  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  const RunResult hr = holder->result();
  std::cout << "[ failover ] old master killed; lock renewed on the new master after " << renewed_after
            << " ms (PTTL " << renewed << "); holder exit " << hr.exit_code << "; T1=" << t1
            << "\n--- holder stderr ---\n" << hr.err << "---------------------\n";
  EXPECT_EQ(hr.exit_code, 0) << hr;
  EXPECT_FALSE(promoted.exists(lock_key("job"))) << "released on the new master";
  EXPECT_EQ(promoted.get(token_key("job")), std::to_string(t1));

  const long long t2 = token_of_next_run();
  std::cout << "[ failover ] token after failover T2=" << t2 << "\n";
  EXPECT_GT(t2, t1);
}

// The promoted replica does not have the lock (deleted on the replica beforehand, which a replica
// made writable for a moment keeps to itself): after the failover fencerun renews on the new master,
// finds the lock gone, stops the command and exits 124.
TEST_F(SentinelTest, LeaseLostWhenPromotedReplicaLacksTheLock) {
  std::unique_ptr<FencerunProcess> holder;
  const long long t1 = hold(holder, "6s");
  const pid_t command_pid = wait_pid("pid");
  RedisServer& replica = topo_->replica();
  ASSERT_TRUE(replica.cmd({"CONFIG", "SET", "replica-read-only", "no"}).ok());
  ASSERT_TRUE(replica.cmd({"DEL", lock_key("job")}).ok());
  ASSERT_TRUE(replica.cmd({"CONFIG", "SET", "replica-read-only", "yes"}).ok());
  ASSERT_FALSE(replica.exists(lock_key("job")));
  ASSERT_TRUE(topo_->master().exists(lock_key("job"))) << "the delete must not reach the master";
  ASSERT_EQ(replica.get(token_key("job")), std::to_string(t1));

  const int new_master = topo_->failover();
  ASSERT_EQ(new_master, replica.port());
  ASSERT_FALSE(replica.exists(lock_key("job")));
  const auto killed_at = Clock::now();
  topo_->master().stop();

  ASSERT_TRUE(holder->wait_for_exit(15s)) << "fencerun kept the command running\n" << holder->result();
  const RunResult hr = holder->result();
  const long long stopped_after = ms_between(killed_at, holder->exited_at());
  std::cout << "[ failover ] old master killed; fencerun exited " << hr.exit_code << " after "
            << stopped_after << " ms; T1=" << t1 << "\n--- holder stderr ---\n"
            << hr.err << "---------------------\n";
  EXPECT_EQ(hr.exit_code, 124) << hr;
  EXPECT_TRUE(wait_dead(command_pid, 5s)) << "the command must have been stopped";
  EXPECT_NE(hr.err.find("lease lost"), std::string::npos) << hr;
  EXPECT_LT(stopped_after, 6000) << "the loss must be noticed before the lease could have expired";
  EXPECT_FALSE(replica.exists(lock_key("job")));

  const long long t2 = token_of_next_run();
  std::cout << "[ failover ] token after failover T2=" << t2 << "\n";
  EXPECT_GT(t2, t1);
}

}  // namespace
}  // namespace fencerun::test::deploy
