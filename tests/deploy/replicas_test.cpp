// Replicas: --min-replicas (WAIT in the acquire round trip) and tokens that never go backwards across
// a restart without persistence or a failover to a replica that missed the last increment.
#include <csignal>
#include <iostream>

#include "deploy_support.hpp"

namespace fencerun::test::deploy {
namespace {

class ReplicaTest : public DeployTest {
 protected:
  void SetUp() override {
    master_ = std::make_unique<RedisServer>(replication_options());
    replica_ = std::make_unique<RedisServer>(replication_options(master_->port()));
    on_failure_.push_back([this] {
      return "--- master log ---\n" + (master_ ? master_->log() : std::string("(stopped)")) +
             "--- replica log ---\n" + (replica_ ? replica_->log() : std::string("(stopped)"));
    });
    wait_replica_online(*master_, *replica_);
  }
  void TearDown() override {
    if (replica_ && replica_->frozen()) replica_->thaw();
    DeployTest::TearDown();
  }

  std::unique_ptr<RedisServer> master_;
  std::unique_ptr<RedisServer> replica_;
};

TEST_F(ReplicaTest, MinReplicasOneSucceedsWithOneReplica) {
  RunResult r = run(sh_args(master_->url(), "job",
                            "echo \"$FENCERUN_TOKEN\" > token; "
                            "sleep 0.2",  // a moment for the replica check below
                            {"--min-replicas", "1", "-v"}));
  ASSERT_EQ(r.exit_code, 0) << r;
  const long long token = read_token(file("token"), 1s);
  EXPECT_GT(token, 0);
  EXPECT_FALSE(master_->exists(lock_key("job")));
  EXPECT_TRUE(wait_replicated(*replica_, token_key("job"), std::to_string(token)))
      << "the token counter must reach the replica";
}

TEST_F(ReplicaTest, MinReplicasTwoWithOneReplicaReleasesAndExits69) {
  RunResult r = run(sh_args(master_->url(), "job", "touch ran", {"--min-replicas", "2"}));
  note("min-replicas 2 of 1", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command must not run";
  EXPECT_NE(r.err.find("only 1 of 2 replicas"), std::string::npos)
      << "message must name the counts\n"
      << r;
  EXPECT_FALSE(master_->exists(lock_key("job"))) << "the lock must have been released";
  EXPECT_TRUE(wait_replicated(*replica_, lock_key("job"), std::nullopt))
      << "the release must reach the replica as well";
  // The lock is free for the next one.
  RunResult next = run(sh_args(master_->url(), "job", "true", {"--min-replicas", "1"}));
  EXPECT_EQ(next.exit_code, 0) << next;
}

// Each holder of a counting lock waits for its own replicas; a slot not confirmed is released.
TEST_F(ReplicaTest, MinReplicasWithALimitConfirmsEachSlotOrReleasesIt) {
  RunResult ok = run(sh_args(master_->url(), "job", "echo \"$FENCERUN_SLOT\" > slot",
                             {"--limit", "2", "--min-replicas", "1"}));
  ASSERT_EQ(ok.exit_code, 0) << ok;
  EXPECT_EQ(trim(read_file(file("slot")).value_or("")), "0");
  RunResult short_of = run(sh_args(master_->url(), "job", "touch ran", {"--limit", "2", "--min-replicas", "2"}));
  EXPECT_EQ(short_of.exit_code, 69) << short_of;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command must not run";
  EXPECT_NE(short_of.err.find("only 1 of 2 replicas"), std::string::npos) << short_of;
  EXPECT_FALSE(master_->exists("fencerun:{job}:slot:0")) << "the slot must have been released";
  EXPECT_FALSE(master_->exists("fencerun:{job}:limit"));
}

TEST_F(ReplicaTest, MinReplicasWithFrozenReplicaTimesOut) {
  replica_->freeze();
  RunResult r = run(sh_args(master_->url(), "job", "touch ran",
                            {"--min-replicas", "1", "--replica-timeout", "300ms"}));
  note("min-replicas frozen replica", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command must not run";
  EXPECT_NE(r.err.find("only 0 of 1 replicas"), std::string::npos) << r;
  EXPECT_LT(r.elapsed, 3s) << "WAIT is bounded by --replica-timeout\n" << r;
  EXPECT_FALSE(master_->exists(lock_key("job"))) << "the lock must have been released";
  replica_->thaw();
}

TEST_F(ReplicaTest, TokensSurviveRestartWithoutPersistence) {
  RunResult first = run(sh_args(master_->url(), "job", "echo \"$FENCERUN_TOKEN\" > token"));
  ASSERT_EQ(first.exit_code, 0) << first;
  const long long t1 = read_token(file("token"), 1s);

  replica_.reset();  // only the master matters here
  master_->restart();
  ASSERT_FALSE(master_->exists(token_key("job"))) << "the restart must have lost the counter";
  std::filesystem::remove(file("token"));
  RunResult second = run(sh_args(master_->url(), "job", "echo \"$FENCERUN_TOKEN\" > token"));
  ASSERT_EQ(second.exit_code, 0) << second;
  const long long t2 = read_token(file("token"), 1s);
  EXPECT_GT(t2, t1) << "token went backwards after a restart";

  // A counter ahead of the clock (restored from elsewhere) is honoured: counter + 1.
  const long long ahead = master_->time_us() + 3'600'000'000LL;
  ASSERT_TRUE(master_->cmd({"SET", token_key("job"), std::to_string(ahead)}).ok());
  std::filesystem::remove(file("token"));
  RunResult third = run(sh_args(master_->url(), "job", "echo \"$FENCERUN_TOKEN\" > token"));
  ASSERT_EQ(third.exit_code, 0) << third;
  const long long t3 = read_token(file("token"), 1s);
  EXPECT_EQ(t3, ahead + 1);
  std::cout << "[ tokens ] before restart T1=" << t1 << ", after restart T2=" << t2
            << ", counter set ahead of the clock -> T3=" << t3 << "\n";
}

TEST_F(ReplicaTest, TokensSurviveFailoverToLaggingReplica) {
  // T1 on the master, replicated.
  RunResult first = run(sh_args(master_->url(), "job", "echo \"$FENCERUN_TOKEN\" > token"));
  ASSERT_EQ(first.exit_code, 0) << first;
  const long long t1 = read_token(file("token"), 1s);
  ASSERT_TRUE(wait_replicated(*replica_, token_key("job"), std::to_string(t1)));

  // The replica stops receiving: frozen (it cannot reconnect) and its link cut by the master (a
  // frozen process's socket would still buffer what the master sends). T2 exists only on the master.
  replica_->freeze();
  Reply cut = master_->cmd({"CLIENT", "KILL", "TYPE", "replica"});
  ASSERT_EQ(cut.type, Reply::Type::Integer) << cut.describe();
  ASSERT_EQ(cut.integer, 1) << "one replica link to cut";
  std::filesystem::remove(file("token"));
  RunResult second = run(sh_args(master_->url(), "job", "echo \"$FENCERUN_TOKEN\" > token"));
  ASSERT_EQ(second.exit_code, 0) << second;
  const long long t2 = read_token(file("token"), 1s);
  EXPECT_GT(t2, t1);

  // The master dies before the replica can catch up; the replica is promoted.
  master_->stop();
  replica_->thaw();
  Reply promote = replica_->cmd({"REPLICAOF", "NO", "ONE"});
  ASSERT_TRUE(promote.ok()) << promote.describe();
  ASSERT_EQ(role_of(replica_->port()), "master");
  ASSERT_EQ(replica_->get(token_key("job")), std::to_string(t1))
      << "the promoted replica must hold T1, not T2, for this test to mean anything";

  std::filesystem::remove(file("token"));
  RunResult third = run(sh_args(replica_->url(), "job", "echo \"$FENCERUN_TOKEN\" > token"));
  ASSERT_EQ(third.exit_code, 0) << third;
  const long long t3 = read_token(file("token"), 1s);
  std::cout << "[ tokens ] T1=" << t1 << " (replicated), T2=" << t2
            << " (master only), T3=" << t3 << " (promoted replica)\n";
  EXPECT_LT(t1, t2);
  EXPECT_LT(t2, t3) << "the token issued after the failover must exceed the one the replica missed"
                    << " (T1=" << t1 << " T2=" << t2 << " T3=" << t3 << ")";
}

}  // namespace
}  // namespace fencerun::test::deploy
