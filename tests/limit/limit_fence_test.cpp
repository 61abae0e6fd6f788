// A guard per slot: holders of a --limit 2 lock fence their writes to a resource of their slot
// (`fencerun fence redis --resource "$FENCERUN_LOCK:$FENCERUN_SLOT"`, or `fencerun fence file` on a
// file of the slot). Each slot's guard orders that slot's writes: a stale token of a slot (its old
// holder's, after a newer holder of the slot has written) is rejected with 77 and writes nothing,
// while the other slot's holder, whose token is older than the newest one of the lock, keeps writing.
#include <gtest/gtest.h>

#include "limit_fixture.hpp"

namespace fencerun::test::limit {
namespace {

enum class Guard { Redis, File };

void PrintTo(Guard g, std::ostream* os) { *os << (g == Guard::Redis ? "fence redis" : "fence file"); }

class LimitFence : public LimitTest, public ::testing::WithParamInterface<Guard> {
 protected:
  std::string fr() const { return shell_quote(fencerun_binary()); }
  // The guarded write of "$V" to the resource of slot $SLOT, with the token from FENCERUN_TOKEN or
  // "$TOKEN_OPT".
  std::string write_cmd() const {
    if (GetParam() == Guard::Redis)
      return fr() + " fence redis $TOKEN_OPT --resource \"$LOCK:$SLOT\" -- SET \"{$LOCK:$SLOT}:data\" \"$V\"";
    return "echo \"$V\" | " + fr() + " fence file $TOKEN_OPT \"data.$SLOT\"";
  }
  // A holder whose command does its k-th guarded write of "IDk" when `ID.wk` appears (exit status to
  // `ID.rck`, output to `ID.outk`) and ends when `ID.go` appears.
  std::string writer(const std::string& id) const {
    return report_script(id) +
           "; LOCK=$FENCERUN_LOCK; SLOT=$FENCERUN_SLOT; TOKEN_OPT=; i=1; while :; do "
           "while [ ! -e " + id + ".w$i ] && [ ! -e " + id + ".go ]; do sleep 0.005; done; "
           "[ -e " + id + ".w$i ] || exit 0; V=" + id + "$i; " + write_cmd() + " > " + id + ".out$i 2>&1; "
           "echo $? > " + id + ".rc$i.tmp; mv " + id + ".rc$i.tmp " + id + ".rc$i; i=$((i + 1)); done";
  }
  // Holder `id` does its k-th write; its exit status, -1 when it did not report one.
  int write(const std::string& id, int k) {
    touch(id + ".w" + std::to_string(k));
    auto rc = wait_for_line(file(id + ".rc" + std::to_string(k)), 15s);
    if (!rc) return -1;
    return static_cast<int>(parse_ll(*rc).value_or(-1));
  }
  std::string out(const std::string& id, int k) { return read_file(file(id + ".out" + std::to_string(k))).value_or(""); }
  // A late write with an old token to slot `slot`'s resource, as a holder that outlived its lease
  // would send it.
  RunResult stale_write(const std::string& name, int slot, long long token) {
    SpawnOptions o = in_dir();
    o.env = {{"FENCERUN_REDIS_URL", redis().url()},
             {"LOCK", name},
             {"SLOT", std::to_string(slot)},
             {"V", "stale"},
             {"TOKEN_OPT", "--token " + std::to_string(token)}};
    return run_program({"sh", "-c", write_cmd()}, o);
  }
  std::optional<std::string> data(const std::string& name, int slot) {
    if (GetParam() == Guard::Redis) return value("{" + name + ":" + std::to_string(slot) + "}:data");
    auto v = read_file(file("data." + std::to_string(slot)));
    if (!v) return std::nullopt;
    return trim(*v);
  }
};

TEST_P(LimitFence, StaleTokenOfASlotIsRejectedAndTheOtherSlotWritesOn) {
  const std::string name = "fenced";
  const auto opts = limit_opts(2, {"--ttl", "30s"});
  Held a, b;
  auto pa = start(name, writer("a"), opts);
  ASSERT_TRUE(held("a")) << pa->result();
  a = *held("a");
  auto pb = start(name, writer("b"), opts);
  ASSERT_TRUE(held("b")) << pb->result();
  b = *held("b");
  ASSERT_EQ(a.slot, 0);
  ASSERT_EQ(b.slot, 1);
  ASSERT_LT(a.token, b.token);

  // B writes first; A's older token is still good for its own slot.
  EXPECT_EQ(write("b", 1), 0) << out("b", 1);
  EXPECT_EQ(write("a", 1), 0) << "slot 1's newer token kept slot 0's holder from writing: " << out("a", 1);
  EXPECT_EQ(data(name, 0), "a1");
  EXPECT_EQ(data(name, 1), "b1");

  // A leaves; C takes slot 0 with the newest token and writes.
  release("a");
  ASSERT_EQ(pa->wait_for_exit(10s), 0) << pa->result();
  auto pc = start(name, writer("c"), opts);
  auto c = held("c");
  ASSERT_TRUE(c) << pc->result();
  ASSERT_EQ(c->slot, 0);
  ASSERT_GT(c->token, b.token);
  EXPECT_EQ(write("c", 1), 0) << out("c", 1);
  EXPECT_EQ(data(name, 0), "c1");

  // A's late write to slot 0 with its old token: rejected, nothing written.
  auto late = stale_write(name, 0, a.token);
  EXPECT_EQ(late.exit_code, 77) << late;
  EXPECT_NE(late.err.find("stale token " + std::to_string(a.token) + " rejected"), std::string::npos) << late;
  EXPECT_NE(late.err.find("it has accepted " + std::to_string(c->token)), std::string::npos) << late;
  EXPECT_EQ(data(name, 0), "c1") << "the stale write changed slot 0's resource";

  // B, whose token is older than C's, writes on to its own slot.
  EXPECT_EQ(write("b", 2), 0) << "slot 0's newer token kept slot 1's holder from writing: " << out("b", 2);
  EXPECT_EQ(data(name, 1), "b2");
  // Slot 1's guard has B's token: A's is stale there too.
  auto late1 = stale_write(name, 1, a.token);
  EXPECT_EQ(late1.exit_code, 77) << late1;
  EXPECT_NE(late1.err.find("it has accepted " + std::to_string(b.token)), std::string::npos) << late1;
  EXPECT_EQ(data(name, 1), "b2");
  EXPECT_EQ(write("c", 2), 0) << out("c", 2);
  EXPECT_EQ(data(name, 0), "c2");

  release("b");
  release("c");
  EXPECT_EQ(pb->wait_for_exit(10s), 0) << pb->result();
  EXPECT_EQ(pc->wait_for_exit(10s), 0) << pc->result();
}

INSTANTIATE_TEST_SUITE_P(Guards, LimitFence, ::testing::Values(Guard::Redis, Guard::File),
                         [](const ::testing::TestParamInfo<Guard>& p) {
                           return std::string(p.param == Guard::Redis ? "Redis" : "File");
                         });

}  // namespace
}  // namespace fencerun::test::limit
