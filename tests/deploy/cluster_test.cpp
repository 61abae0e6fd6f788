// Redis Cluster: fencerun pointed at a node that does not own NAME's slot follows MOVED; during a
// slot migration it follows ASK to the importing node. Both keys of NAME share one slot.
#include <iostream>
#include <thread>

#include "deploy_support.hpp"
#include "support/json.hpp"

namespace fencerun::test::deploy {
namespace {

class ClusterTest : public DeployTest {
 protected:
  void SetUp() override {
    if (!program_usable(redis_cli_program()))
      GTEST_SKIP() << "redis-cli not found: cannot create a cluster";
    cluster_ = std::make_unique<ClusterNodes>();
    on_failure_.push_back([this] { return cluster_->logs(); });
    slot_ = cluster_->keyslot(lock_key("job"));
    owner_ = cluster_->owner_of(slot_);
  }

  std::string url(size_t node) { return cluster_->node(node).url(); }
  size_t other(size_t k) const { return (owner_ + k) % cluster_->size(); }

  long long run_token(size_t via, const std::vector<std::string>& options = {}) {
    std::filesystem::remove(file("token"));
    RunResult r = run(sh_args(url(via), "job", "echo \"$FENCERUN_TOKEN\" > token", options));
    if (r.exit_code != 0) {
      ADD_FAILURE() << "run via node " << via << " failed\n" << r;
      return -1;
    }
    return read_token(file("token"), 1s);
  }

  std::pair<int, std::optional<Json>> status_json(size_t via) {
    RunResult r = run({"status", "-r", url(via), "job", "--json"});
    if (r.exit_code != 0 && r.exit_code != 3) ADD_FAILURE() << "status via node " << via << "\n" << r;
    return {r.exit_code, parse_json(trim(r.out))};
  }

  static std::optional<long long> json_number(const std::optional<Json>& j, std::string_view key) {
    if (!j) return std::nullopt;
    const Json* v = j->find(key);
    return v ? v->as_int() : std::nullopt;
  }

  std::unique_ptr<ClusterNodes> cluster_;
  long long slot_ = -1;
  size_t owner_ = 0;
};

TEST_F(ClusterTest, RunThroughNodeThatDoesNotOwnTheSlot) {
  ASSERT_EQ(cluster_->keyslot(token_key("job")), slot_) << "lock and token must share one slot";
  const size_t entry = other(1), third = other(2);
  ASSERT_NE(entry, owner_);

  const long long t1 = run_token(entry);
  const long long t2 = run_token(entry);
  EXPECT_GT(t2, t1);
  RedisServer& owner = cluster_->node(owner_);
  EXPECT_EQ(owner.get(token_key("job")), std::to_string(t2)) << "keys live on the owning node";
  EXPECT_FALSE(owner.exists(lock_key("job"))) << "released";
  EXPECT_EQ(cluster_->node(entry).dbsize(), 0) << "nothing written on the node fencerun was given";
  EXPECT_EQ(cluster_->node(third).dbsize(), 0);

  auto [free_code, free_json] = status_json(entry);
  EXPECT_EQ(free_code, 3);
  EXPECT_EQ(json_number(free_json, "last_token"), t2);

  // A holder through one node, a waiter through the other: the waiter acquires after the release.
  std::filesystem::remove(file("token"));
  auto holder = start(sh_args(url(entry), "job", kTokenUntilGo, {"-t", "3s"}));
  const long long t3 = read_token(file("token"));
  wait_pid("pid");
  EXPECT_GT(t3, t2);
  auto [held_code, held_json] = status_json(third);
  EXPECT_EQ(held_code, 0);
  EXPECT_EQ(json_number(held_json, "token"), t3);

  auto waiter = start(sh_args(url(third), "job", "echo \"$FENCERUN_TOKEN\" > token2", {"-w", "30s"}));
  // Long enough for renewals (every second) through the redirection, and for the waiter to wait.
  std::this_thread::sleep_for(1500ms);
  ASSERT_TRUE(waiter->running()) << waiter->result();
  ASSERT_TRUE(holder->running()) << holder->result();
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  EXPECT_EQ(*holder->exit_code(), 0) << holder->result();
  ASSERT_TRUE(waiter->wait_for_exit(20s)) << waiter->result();
  EXPECT_EQ(*waiter->exit_code(), 0) << waiter->result();
  EXPECT_GT(read_token(file("token2"), 1s), t3);
  EXPECT_FALSE(owner.exists(lock_key("job")));
  EXPECT_EQ(cluster_->node(entry).dbsize(), 0);
  EXPECT_EQ(cluster_->node(third).dbsize(), 0);
}

// Slot migration as `redis-cli --cluster reshard` does it: IMPORTING on the target, MIGRATING on
// the source, MIGRATE key by key, then SETSLOT NODE. While the slot migrates, the source answers ASK
// for keys it no longer has, and the target serves them only to a client that sent ASKING first.
// A lease held across the migration must keep being renewed (through ASK), `status` must work, and a
// second acquirer must see the lock as busy.
// --fair waiters through a node that does not own the slot: each subscribes where the queue lives
// (a script's PUBLISH counts that node's subscribers only), so a release wakes the first of them and
// none is taken for gone: they acquire in the order they began waiting.
TEST_F(ClusterTest, FairWaitersThroughAnotherNodeKeepTheirOrder) {
  const size_t entry = other(1), third = other(2);
  RedisServer& owner = cluster_->node(owner_);
  auto holder = start(sh_args(url(entry), "job", kTokenUntilGo, {"-t", "10s", "--fair"}));
  wait_pid("pid");
  const std::string queue = "fencerun:{job}:queue";
  std::vector<std::unique_ptr<FencerunProcess>> waiters;
  for (int i = 0; i < 5; ++i) {
    waiters.push_back(start(sh_args(url(i % 2 ? entry : third), "job", "echo " + std::to_string(i) + " >> order",
                                    {"-t", "10s", "-w", "60s", "--fair"})));
    ASSERT_TRUE(wait_until([&] { return owner.cmd({"ZCARD", queue}).integer == i + 1; }, 10s))
        << "waiter " << i << " never queued: " << waiters.back()->result();
  }
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  for (auto& w : waiters) {
    ASSERT_TRUE(w->wait_for_exit(30s)) << w->result();
    EXPECT_EQ(*w->exit_code(), 0) << w->result();
  }
  EXPECT_EQ(split_lines(read_file(file("order")).value_or("")),
            (std::vector<std::string>{"0", "1", "2", "3", "4"}));
  EXPECT_EQ(owner.cmd({"ZCARD", queue}).integer, 0);
  EXPECT_FALSE(owner.exists(lock_key("job")));
}

// A counting lock through a node that does not own NAME's slot: every key of NAME (its slots, the
// limit, the counter, the queue) hashes to NAME's one slot, so its scripts run where the keys live.
TEST_F(ClusterTest, CountingLockThroughAnotherNodeKeepsEveryKeyOnTheOwner) {
  const size_t entry = other(1), third = other(2);
  RedisServer& owner = cluster_->node(owner_);
  for (const char* suffix : {"slot:0", "slot:1", "limit", "turns", "queue"})
    EXPECT_EQ(cluster_->keyslot(std::string("fencerun:{job}:") + suffix), slot_) << suffix;
  const std::string hold = "echo $$ > pid$FENCERUN_SLOT; echo \"$FENCERUN_TOKEN\" > token$FENCERUN_SLOT; "
                           "while [ ! -e go ]; do sleep 0.02; done";
  auto a = start(sh_args(url(entry), "job", hold, {"-t", "5s", "--limit", "2"}));
  wait_pid("pid0");
  auto b = start(sh_args(url(third), "job", hold, {"-t", "5s", "--limit", "2"}));
  wait_pid("pid1");
  EXPECT_GT(read_token(file("token1")), read_token(file("token0")));
  EXPECT_TRUE(owner.exists("fencerun:{job}:slot:0"));
  EXPECT_TRUE(owner.exists("fencerun:{job}:slot:1"));
  EXPECT_EQ(owner.get("fencerun:{job}:limit"), "2");
  EXPECT_EQ(cluster_->node(entry).dbsize(), 0);
  EXPECT_EQ(cluster_->node(third).dbsize(), 0);

  RunResult busy = run(sh_args(url(entry), "job", "touch ran", {"--limit", "2"}));
  EXPECT_EQ(busy.exit_code, 75) << busy;
  RunResult other_limit = run(sh_args(url(third), "job", "touch ran", {"--limit", "3"}));
  EXPECT_EQ(other_limit.exit_code, 64) << other_limit;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  auto [code, json] = status_json(entry);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(json_number(json, "limit"), 2);

  // A waiter through a third way in is woken by a freed slot.
  auto waiter = start(sh_args(url(third), "job", "echo \"$FENCERUN_SLOT\" > waiter_slot",
                              {"-t", "5s", "--limit", "2", "-w", "30s"}));
  ASSERT_TRUE(wait_until([&] { return owner.cmd({"ZCARD", "fencerun:{job}:queue"}).integer == 1; }, 10s))
      << waiter->result();
  touch("go");
  for (auto* p : {a.get(), b.get(), waiter.get()}) {
    ASSERT_TRUE(p->wait_for_exit(20s)) << p->result();
    EXPECT_EQ(*p->exit_code(), 0) << p->result();
  }
  const std::string waiter_slot = trim(read_file(file("waiter_slot")).value_or(""));
  EXPECT_TRUE(waiter_slot == "0" || waiter_slot == "1") << waiter_slot;
  for (const char* suffix : {"slot:0", "slot:1", "limit"})
    EXPECT_FALSE(owner.exists(std::string("fencerun:{job}:") + suffix)) << suffix;
}

TEST_F(ClusterTest, AskDuringSlotMigration) {
  const size_t source = owner_, target = other(1), entry = other(2);
  const long long t1 = run_token(entry);
  ASSERT_GT(t1, 0);
  RedisServer& src = cluster_->node(source);
  RedisServer& dst = cluster_->node(target);
  const Target dst_asking = tcp(dst.port());
  auto on_target = [&](std::vector<std::string> command) {
    return call_many(dst_asking, {{"ASKING"}, std::move(command)}).back();
  };

  // A holder (ttl 2 s: renewed every 667 ms) acquired before the migration starts.
  std::filesystem::remove(file("token"));
  auto holder = start(sh_args(url(entry), "job", kTokenUntilGo, {"-t", "2s"}));
  const long long t2 = read_token(file("token"));
  wait_pid("pid");
  EXPECT_GT(t2, t1);

  const std::string slot = std::to_string(slot_);
  ASSERT_TRUE(dst.cmd({"CLUSTER", "SETSLOT", slot, "IMPORTING", cluster_->node_id(source)}).ok());
  ASSERT_TRUE(src.cmd({"CLUSTER", "SETSLOT", slot, "MIGRATING", cluster_->node_id(target)}).ok());
  {
    // Keys still on the source: served there, by status and by the acquire script (busy).
    auto [code, json] = status_json(entry);
    EXPECT_EQ(code, 0);
    EXPECT_EQ(json_number(json, "token"), t2);
    RunResult contender = run(sh_args(url(entry), "job", "touch ran"));
    note("cluster contender, keys on the migrating source", contender);
    EXPECT_EQ(contender.exit_code, 75) << contender;
    EXPECT_FALSE(std::filesystem::exists(file("ran")));
  }
  // Every key of the slot moves: the lock, the token counter and the record of runs.
  Reply in_slot = src.cmd({"CLUSTER", "GETKEYSINSLOT", slot, "100"});
  std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", std::to_string(dst.port()), "", "0", "5000", "KEYS"};
  for (const auto& k : in_slot.elements) migrate.push_back(k.str);
  ASSERT_GE(migrate.size(), 9u) << "lock, token and the record (run, runs, ok): " << in_slot.describe();
  Reply moved = src.cmd(migrate);
  ASSERT_TRUE(moved.ok()) << moved.describe();
  ASSERT_EQ(src.dbsize(), 0);
  ASSERT_EQ(dst.dbsize(), static_cast<long long>(migrate.size() - 7));
  Reply direct = dst.cmd({"GET", token_key("job")});
  EXPECT_TRUE(direct.type == Reply::Type::Error && direct.str.rfind("MOVED", 0) == 0)
      << "without ASKING the importing node redirects: " << direct.describe();

  // Renewals now reach the lock only through ASK: after more than a TTL the holder still runs
  // and the lock on the target carries a fresh TTL.
  std::this_thread::sleep_for(2500ms);
  EXPECT_TRUE(holder->running()) << "lease lost during the migration\n" << holder->result();
  Reply pttl = on_target({"PTTL", lock_key("job")});
  EXPECT_EQ(pttl.type, Reply::Type::Integer) << pttl.describe();
  EXPECT_GT(pttl.integer, 600) << "the lock on the target was not renewed";

  // A second acquirer is told the lock is busy (the acquire script runs on the target via ASK).
  RunResult contender = run(sh_args(url(entry), "job", "touch ran"));
  note("cluster contender, keys on the importing target", contender);
  EXPECT_EQ(contender.exit_code, 75) << contender;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));

  // status: three keyed commands in one request, each redirected by ASK.
  {
    auto [code, json] = status_json(entry);
    EXPECT_EQ(code, 0) << "status during a slot migration";
    EXPECT_EQ(json_number(json, "token"), t2);
  }

  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  EXPECT_EQ(*holder->exit_code(), 0) << holder->result();
  EXPECT_EQ(on_target({"EXISTS", lock_key("job")}).integer, 0) << "released on the target via ASK";
  EXPECT_EQ(on_target({"GET", token_key("job")}).str, std::to_string(t2));
  {
    auto [code, json] = status_json(entry);
    EXPECT_EQ(code, 3) << "status during a slot migration";
    EXPECT_EQ(json_number(json, "last_token"), t2);
  }

  // A fresh acquisition while the slot still migrates: Redis refuses a multi-key request on the
  // importing node when some of its keys are missing (TRYAGAIN), so it cannot succeed until the
  // migration ends. It must fail safe: exit 69, command not run, no lock anywhere.
  RunResult during = run(sh_args(url(entry), "job", "touch ran", {"--timeout", "1s"}));
  std::cout << "[ cluster ] acquire of a free lock during the migration: exit " << during.exit_code
            << "\n" << during.err;
  EXPECT_EQ(during.exit_code, 69) << during;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_EQ(on_target({"EXISTS", lock_key("job")}).integer, 0);
  EXPECT_EQ(src.dbsize(), 0);

  // Finish the migration: the slot belongs to the target everywhere; fencerun follows MOVED there.
  for (size_t i = 0; i < cluster_->size(); ++i)
    ASSERT_TRUE(
        cluster_->node(i).cmd({"CLUSTER", "SETSLOT", slot, "NODE", cluster_->node_id(target)}).ok());
  const long long t3 = run_token(entry);
  EXPECT_GT(t3, t2);
  EXPECT_EQ(dst.get(token_key("job")), std::to_string(t3));
  EXPECT_FALSE(dst.exists(lock_key("job")));
  EXPECT_EQ(src.dbsize(), 0);
}

}  // namespace
}  // namespace fencerun::test::deploy
