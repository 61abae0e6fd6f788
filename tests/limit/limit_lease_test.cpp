// Each holder of a counting lock has a lease of its own (its slot key), against a real redis-server:
//   - a holder killed with SIGKILL (fencerun and its command) frees its slot when its TTL runs out:
//     a waiter gets in then, into that slot, and not while the dead holder's slot key still exists;
//   - a slot whose lease is lost (its key deleted, or overwritten by another owner) stops only the
//     holder of that slot (exit 124, its command dead); the other holder keeps its slot and exits 0;
//   - Redis frozen: every holder stops its own command before its own slot can expire (exit 124);
//   - a holder stopped (SIGSTOP) past its TTL, whose slot another holder then took, does not free that
//     slot when it runs again: the new holder's key is unchanged and it exits 0 normally.
#include <gtest/gtest.h>
#include <signal.h>

#include <iostream>

#include "limit_fixture.hpp"

namespace fencerun::test::limit {
namespace {

class LimitLease : public LimitTest {};

TEST_F(LimitLease, KilledHolderFreesItsSlotAfterItsTtl) {
  const std::string name = "killed";
  const auto opts = limit_opts(2, {"--ttl", "2s"});
  Held a, b;
  auto pa = start_slot_holder(name, "a", opts, &a);
  auto pb = start_slot_holder(name, "b", opts, &b);
  ASSERT_NE(a.slot, b.slot);
  const std::string ka = slot_key(name, a.slot);
  const auto va = value(ka);
  const auto vb = value(slot_key(name, b.slot));
  ASSERT_TRUE(va && vb) << "the holders' slot keys";

  const long long pttl = redis().pttl(ka);
  const auto t_kill = Clock::now();
  kill_holder(*pa, a);
  ASSERT_TRUE(pa->wait_for_exit(5s)) << pa->result();
  EXPECT_TRUE(wait_dead(a.cmd_pid, 3s)) << "the killed holder's command still runs";
  // The killed holder had renewed up to a full TTL ago at most.
  ASSERT_GT(pttl, 0);
  ASSERT_LE(pttl, 2000);

  auto pc = start(name, "\"" + std::string(probe_binary()) + "\" now > c.t; " + holder_script("c"),
                  limit_opts(2, {"--ttl", "2s", "--wait", "20s"}));
  // Until the waiter's command runs: it must not run while the dead holder's key is still there
  // (the file is looked at first, then the key).
  bool overlapped = false;
  const bool entered = wait_until(
      [&] {
        const bool in = std::filesystem::exists(file("c.env"));
        if (in && value(ka) == va) overlapped = true;
        return in;
      },
      10s, 2ms);
  ASSERT_TRUE(entered) << "the waiter never got the killed holder's slot: " << pc->result();
  EXPECT_FALSE(overlapped) << "the waiter ran while the killed holder's slot key still existed";
  auto c = held("c");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->slot, a.slot) << "the waiter did not get the freed slot";
  auto tc = parse_ll(read_file(file("c.t")).value_or(""));
  ASSERT_TRUE(tc);
  const long long after_kill = (*tc - t_kill.time_since_epoch().count()) / 1000000;
  std::cout << "PTTL of the killed holder's slot " << pttl << " ms; the waiter ran " << after_kill
            << " ms after the kill\n";
  EXPECT_GE(after_kill, pttl - 50) << "the waiter got in before the killed holder's TTL ran out";
  EXPECT_LE(after_kill, pttl + 1500) << "the freed slot was not handed over soon after the TTL ran out";

  // The other holder was not disturbed.
  EXPECT_TRUE(pb->running()) << pb->result();
  EXPECT_EQ(value(slot_key(name, b.slot)), vb) << "the other holder's slot key changed";
  release("b");
  release("c");
  EXPECT_EQ(pb->wait_for_exit(10s), 0) << pb->result();
  EXPECT_EQ(pc->wait_for_exit(10s), 0) << pc->result();
  EXPECT_FALSE(exists(slot_key(name, 0)));
  EXPECT_FALSE(exists(slot_key(name, 1)));
}

enum class Loss { Deleted, Overwritten };
struct LossCase {
  Loss loss;
  int victim;  // the slot whose lease is lost
};

void PrintTo(const LossCase& c, std::ostream* os) {
  *os << (c.loss == Loss::Deleted ? "slot key deleted" : "slot key overwritten") << ", slot " << c.victim;
}

class LimitLostSlot : public LimitTest, public ::testing::WithParamInterface<LossCase> {};

TEST_P(LimitLostSlot, StopsOnlyThatSlotsHolder) {
  const auto [loss, victim_slot] = GetParam();
  const std::string name = "lost";
  const auto opts = limit_opts(2, {"--ttl", "2s"});
  Held h0, h1;
  auto p0 = start_slot_holder(name, "h0", opts, &h0);
  auto p1 = start_slot_holder(name, "h1", opts, &h1);
  ASSERT_EQ(h0.slot, 0) << "the lowest free slot is taken first";
  ASSERT_EQ(h1.slot, 1);
  auto& victim = victim_slot == 0 ? p0 : p1;
  auto& other = victim_slot == 0 ? p1 : p0;
  const Held& vh = victim_slot == 0 ? h0 : h1;
  const Held& oh = victim_slot == 0 ? h1 : h0;
  const std::string other_id = victim_slot == 0 ? "h1" : "h0";
  const std::string vk = slot_key(name, vh.slot);
  const std::string ok = slot_key(name, oh.slot);
  const auto other_value = value(ok);
  ASSERT_TRUE(other_value);

  const std::string intruder = "0123456789abcdef0123456789abcdef 1 1 elsewhere";
  if (loss == Loss::Deleted) {
    ASSERT_EQ(cmd({"DEL", vk}).integer, 1);
  } else {
    ASSERT_TRUE(cmd({"SET", vk, intruder, "PX", "20000"}).ok());
  }
  // Renewal every TTL/3: the loss is seen within a second, and the command stopped at once.
  EXPECT_EQ(victim->wait_for_exit(5s), 124) << victim->result();
  EXPECT_TRUE(wait_dead(vh.cmd_pid, 3s)) << "the command of the holder that lost its slot still runs";
  if (loss == Loss::Overwritten) {
    EXPECT_EQ(value(vk), intruder) << "the holder that lost its slot removed or changed the new owner's key";
  }

  // The other holder renews through two more TTLs and keeps running.
  EXPECT_FALSE(wait_until([&] { return !other->running(); }, 4s)) << other->result();
  EXPECT_EQ(value(ok), other_value) << "the other holder's slot key changed";
  EXPECT_GT(redis().pttl(ok), 0);
  EXPECT_FALSE(process_dead(oh.cmd_pid)) << "the other holder's command was stopped";
  release(other_id);
  EXPECT_EQ(other->wait_for_exit(10s), 0) << other->result();
  EXPECT_FALSE(exists(ok)) << "the other holder did not release its slot";
}

INSTANTIATE_TEST_SUITE_P(Cases, LimitLostSlot,
                         ::testing::Values(LossCase{Loss::Deleted, 0}, LossCase{Loss::Overwritten, 1}),
                         [](const ::testing::TestParamInfo<LossCase>& p) {
                           return std::string(p.param.loss == Loss::Deleted ? "Deleted" : "Overwritten") + "Slot" +
                                  std::to_string(p.param.victim);
                         });

// A holds slot 0 with a 2 s TTL, H holds slot 1. A's fencerun is stopped (SIGSTOP, fencerun only): its
// watchdog ends A's command before the lease can expire, the slot key expires, and B, which waited, gets
// slot 0. Then A runs again: it has lost its lease (124), and its release or renewal must not touch B's
// key.
TEST_F(LimitLease, OldHoldersReleaseNeverFreesAnothersSlot) {
  const std::string name = "stale";
  const auto opts = limit_opts(2, {"--ttl", "2s"});
  Held a, h;
  auto pa = start_slot_holder(name, "a", opts, &a);
  auto ph = start_slot_holder(name, "h", opts, &h);
  ASSERT_EQ(a.slot, 0);
  ASSERT_EQ(h.slot, 1);
  const auto va = value(slot_key(name, 0));
  ASSERT_TRUE(va);

  ASSERT_TRUE(pa->signal(SIGSTOP));
  ASSERT_TRUE(wait_until([&] { return process_state(pa->pid()) == 'T'; }, 3s));
  auto pb = start(name, holder_script("b"), limit_opts(2, {"--ttl", "2s", "--wait", "20s"}));
  EXPECT_TRUE(wait_dead(a.cmd_pid, 4s)) << "the stopped holder's command kept running past its lease";
  auto b = held("b", 10s);
  ASSERT_TRUE(b) << "the waiter never got the expired slot: " << pb->result();
  EXPECT_EQ(b->slot, 0) << "the waiter should have taken the expired slot 0 (slot 1 is held)";
  const auto vb = value(slot_key(name, 0));
  ASSERT_TRUE(vb);
  ASSERT_NE(vb, va);

  ASSERT_TRUE(pa->signal(SIGCONT));
  EXPECT_EQ(pa->wait_for_exit(10s), 124) << "the holder that was stopped past its lease: " << pa->result();
  EXPECT_EQ(value(slot_key(name, 0)), vb) << "the old holder of slot 0 removed or changed the new holder's key";
  EXPECT_GT(redis().pttl(slot_key(name, 0)), 0);
  EXPECT_TRUE(pb->running()) << pb->result();
  EXPECT_FALSE(process_dead(b->cmd_pid)) << "the new holder's command was stopped";

  release("b");
  release("h");
  EXPECT_EQ(pb->wait_for_exit(10s), 0) << "the new holder of slot 0 (its release must find its own key): "
                                       << pb->result();
  EXPECT_EQ(ph->wait_for_exit(10s), 0) << ph->result();
  EXPECT_FALSE(exists(slot_key(name, 0)));
  EXPECT_FALSE(exists(slot_key(name, 1)));
}

// Redis frozen (SIGSTOP) while every slot is held: no renewal can succeed, so each holder stops its
// own command before its own slot's lease can expire on the server (the last PTTL the test read is
// an upper bound of what was left), exits 124, and says it stopped in time.
TEST_F(LimitLease, FrozenRedisStopsEveryHolderBeforeItsSlotExpires) {
  const std::string name = "frozen";
  const auto opts = limit_opts(2, {"--ttl", "2s"});
  Held a, b;
  auto pa = start_slot_holder(name, "a", opts, &a);
  auto pb = start_slot_holder(name, "b", opts, &b);
  ASSERT_NE(a.slot, b.slot);
  const long long pttl_a = redis().pttl(slot_key(name, a.slot));
  const long long pttl_b = redis().pttl(slot_key(name, b.slot));
  const auto frozen_at = Clock::now();
  ASSERT_GT(pttl_a, 0);
  ASSERT_GT(pttl_b, 0);
  redis().freeze();
  std::optional<Clock::time_point> a_dead, b_dead;
  const bool both = wait_until(
      [&] {
        if (!a_dead && process_dead(a.cmd_pid)) a_dead = Clock::now();
        if (!b_dead && process_dead(b.cmd_pid)) b_dead = Clock::now();
        return a_dead && b_dead;
      },
      10s, 2ms);
  redis().thaw();
  ASSERT_TRUE(both) << "a command still ran with Redis frozen\n" << pa->result() << "\n" << pb->result();
  auto ms = [&](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t - frozen_at).count();
  };
  std::cout << "slot " << a.slot << ": command dead " << ms(*a_dead) << " ms after the freeze (PTTL " << pttl_a
            << " ms); slot " << b.slot << ": " << ms(*b_dead) << " ms (PTTL " << pttl_b << " ms)\n";
  EXPECT_LT(ms(*a_dead), pttl_a) << "holder a's command outlived its slot's lease";
  EXPECT_LT(ms(*b_dead), pttl_b) << "holder b's command outlived its slot's lease";
  for (auto* p : {pa.get(), pb.get()}) {
    ASSERT_TRUE(p->wait_for_exit(10s)) << p->result();
    EXPECT_EQ(*p->exit_code(), 124) << p->result();
    EXPECT_NE(p->result().err.find("stopped before the lease deadline"), std::string::npos) << p->result();
    EXPECT_EQ(p->result().err.find("only after the lease deadline"), std::string::npos) << p->result();
  }
}

}  // namespace
}  // namespace fencerun::test::limit
