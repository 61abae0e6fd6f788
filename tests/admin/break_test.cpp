// fencerun break against running holders: the holder stops with 124 at its next renewal, a waiter
// takes the lock at once, and the broken holder's late guarded write is rejected. --owner picks one
// holder (a wrong one touches nothing); without --yes and without a terminal nothing is broken.
#include <cctype>
#include <regex>

#include "admin_fixture.hpp"

namespace fencerun::test::admin {
namespace {

class BreakTest : public AdminTest {
 protected:
  void SetUp() override {
    on_failure_.push_back([this] { return "--- redis-server log ---\n" + redis_.log(); });
  }
  std::string url() const { return redis_.url(); }
  std::optional<std::string> get(const std::string& k) const { return redis_.get(k); }

  // "broke NAME[ slot S]: pid P on HOST (owner XXXXXXXX), token T, ttl Nms" for holder h; returns N.
  static std::optional<long long> broke_line(const std::string& line, const std::string& name, const Holder& h,
                                             std::optional<int> slot) {
    const std::string head = "broke " + name + (slot ? " slot " + std::to_string(*slot) : "") + ": pid " +
                             std::to_string(h.proc->pid()) + " on " + hostname() + " (owner " +
                             h.owner.substr(0, 8) + "), token " + std::to_string(h.token) + ", ttl ";
    if (!line.starts_with(head) || !line.ends_with("ms")) return std::nullopt;
    return parse_ll(line.substr(head.size(), line.size() - head.size() - 2));
  }

  // A prefix of 8 hex digits that starts neither owner.
  static std::string other_owner8(const std::string& a, const std::string& b) {
    for (char c : std::string("0123456789abcdef"))
      if (c != a[0] && c != b[0]) return std::string(1, c) + a.substr(1, 7);
    return "";
  }

  static std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  }

  RedisServer redis_;
};

TEST_F(BreakTest, BreakingARunningHolderHandsTheLockToAWaiterAndFencesTheOldHolder) {
  const std::string fr = shell_quote(fencerun_binary());
  Holder h = start_holder(url(), "job", "h", {"--ttl", "3s"});
  const std::string old_value = get(lock_key("job")).value_or("");
  ASSERT_FALSE(old_value.empty());
  // The waiter writes both guarded resources with its own (newer) token.
  auto waiter = start(sh_args(url(), "job",
                              "echo \"$FENCERUN_TOKEN\" > w.token; echo waiter | " + fr + " fence file data && " + fr +
                                  " fence redis -- SET res waiter > w.redis",
                              {"--ttl", "3s", "-w", "30s"}));
  ASSERT_TRUE(wait_until([&] { return redis_.cmd({"ZCARD", "fencerun:{job}:queue"}).integer == 1; }, 10s))
      << "the waiter never queued\n" << waiter->result();
  ASSERT_TRUE(waiter->running()) << waiter->result();

  const auto before = Clock::now();
  RunResult b = run({"break", "-r", url(), "job", "--yes"});
  const auto broken_at = Clock::now();
  ASSERT_EQ(b.exit_code, 0) << b;
  auto lines = split_lines(trim(b.out));
  ASSERT_EQ(lines.size(), 1u) << b;
  auto ttl = broke_line(lines[0], "job", h, std::nullopt);
  ASSERT_TRUE(ttl) << "unexpected report: " << lines[0];
  EXPECT_GT(*ttl, 1000) << "a lease of 3s renewed every second has more than 2s left";
  EXPECT_LE(*ttl, 3000);
  EXPECT_NE(get(lock_key("job")).value_or(""), old_value) << "the broken lease is still there";

  // The waiter takes the lock at once, long before the broken lease would have run out.
  auto wline = wait_for_line(file("w.token"), 10s);
  const auto acquired_at = Clock::now();
  ASSERT_TRUE(wline) << "the waiter never acquired\n" << waiter->result();
  const long long new_token = parse_ll(*wline).value_or(0);
  EXPECT_GT(new_token, h.token);
  EXPECT_LT(ms_between(broken_at, acquired_at), 1000) << "the waiter was not woken by the break";
  EXPECT_LT(ms_between(before, acquired_at), *ttl - 500) << "the waiter only got the lock when the lease ran out";

  // The broken holder stops at its next renewal (every second): 124.
  ASSERT_TRUE(h.proc->wait_for_exit(10s)) << h.proc->result();
  EXPECT_EQ(*h.proc->exit_code(), 124) << h.proc->result();
  EXPECT_LT(ms_between(broken_at, h.proc->exited_at()), 2000) << "the holder ran on past its renew interval\n"
                                                               << h.proc->result();
  EXPECT_NE(h.proc->result().err.find("lease lost"), std::string::npos) << h.proc->result();

  ASSERT_TRUE(waiter->wait_for_exit(20s)) << waiter->result();
  ASSERT_EQ(*waiter->exit_code(), 0) << waiter->result();
  EXPECT_EQ(read_file(file("data")).value_or(""), "waiter\n");
  EXPECT_EQ(redis_.get("res").value_or(""), "waiter");

  // The broken holder's late writes with its old token: rejected, nothing changed.
  RunResult late_file = run_with_stdin({"fence", "file", "--token", std::to_string(h.token), "data"}, "late\n");
  EXPECT_EQ(late_file.exit_code, 77) << late_file;
  EXPECT_EQ(read_file(file("data")).value_or(""), "waiter\n");
  RunResult late_redis = run({"fence", "redis", "-r", url(), "--resource", "job", "--token", std::to_string(h.token),
                              "--", "SET", "res", "late"});
  EXPECT_EQ(late_redis.exit_code, 77) << late_redis;
  EXPECT_EQ(redis_.get("res").value_or(""), "waiter");
  EXPECT_FALSE(redis_.exists(lock_key("job")));
}

TEST_F(BreakTest, BreakIsLoggedAsBroken) {
  Holder h = start_holder(url(), "job", "h", {"--ttl", "10s"});
  RunResult b = run({"break", "-r", url(), "job", "--yes", "-v", "--log-format", "json"});
  ASSERT_EQ(b.exit_code, 0) << b;
  bool found = false;
  for (const auto& line : split_lines(b.err)) {
    auto j = parse_json(line);
    if (j && j->find("event") && j->find("event")->as_string() == "broken") {
      found = true;
      EXPECT_EQ(j->find("level")->as_string(), "info") << line;
      EXPECT_EQ(j->find("lock")->as_string(), "job") << line;
    }
  }
  EXPECT_TRUE(found) << "no 'broken' event\n" << b;
  ASSERT_TRUE(h.proc->wait_for_exit(10s)) << h.proc->result();
  EXPECT_EQ(*h.proc->exit_code(), 124) << h.proc->result();
}

TEST_F(BreakTest, WrongOwnerLeavesThePlainLockAndTheRightOneBreaksIt) {
  Holder h = start_holder(url(), "job", "h", {"--ttl", "3s"});
  const std::string value = get(lock_key("job")).value_or("");
  const std::string token = get(token_key("job")).value_or("");
  const std::string wrong = other_owner8(h.owner, h.owner);
  RunResult b = run({"break", "-r", url(), "job", "--owner", wrong, "--yes"});
  EXPECT_EQ(b.exit_code, 3) << b;
  EXPECT_TRUE(one_line_error(b, "job: no holder's owner id starts with " + wrong));
  EXPECT_EQ(trim(b.out), "") << b;
  EXPECT_EQ(get(lock_key("job")).value_or(""), value);
  EXPECT_EQ(get(token_key("job")).value_or(""), token);
  // It keeps running through more than one renewal.
  EXPECT_FALSE(wait_until([&] { return !h.proc->running(); }, 1500ms)) << h.proc->result();
  EXPECT_EQ(get(lock_key("job")).value_or(""), value) << "the holder lost its lease";
  EXPECT_GT(redis_.pttl(lock_key("job")), 1000);

  // The whole owner id, in capitals: the same holder (case does not matter).
  RunResult ok = run({"break", "-r", url(), "job", "--owner", upper(h.owner), "--yes"});
  ASSERT_EQ(ok.exit_code, 0) << ok;
  EXPECT_TRUE(broke_line(trim(ok.out), "job", h, std::nullopt)) << ok;
  EXPECT_FALSE(redis_.exists(lock_key("job")));
  EXPECT_EQ(get(token_key("job")).value_or(""), token) << "break must not touch the token counter";
  ASSERT_TRUE(h.proc->wait_for_exit(10s)) << h.proc->result();
  EXPECT_EQ(*h.proc->exit_code(), 124) << h.proc->result();
}

TEST_F(BreakTest, OwnerPicksOneHolderOfACountingLock) {
  Holder a = start_holder(url(), "pool", "a", {"--ttl", "3s", "--limit", "2"});
  Holder b = start_holder(url(), "pool", "b", {"--ttl", "3s", "--limit", "2"});
  ASSERT_NE(a.slot, b.slot);
  const std::string ka = "fencerun:{pool}:slot:" + std::to_string(a.slot);
  const std::string kb = "fencerun:{pool}:slot:" + std::to_string(b.slot);
  const std::string va = get(ka).value_or(""), vb = get(kb).value_or("");
  ASSERT_FALSE(va.empty());
  ASSERT_FALSE(vb.empty());
  ASSERT_NE(a.owner.substr(0, 8), b.owner.substr(0, 8));

  const std::string wrong = other_owner8(a.owner, b.owner);
  RunResult w = run({"break", "-r", url(), "pool", "--owner", wrong, "--yes"});
  EXPECT_EQ(w.exit_code, 3) << w;
  EXPECT_TRUE(one_line_error(w, "pool: no holder's owner id starts with " + wrong));
  EXPECT_EQ(get(ka).value_or(""), va);
  EXPECT_EQ(get(kb).value_or(""), vb);

  RunResult r = run({"break", "-r", url(), "pool", "--owner", a.owner.substr(0, 8), "--yes"});
  ASSERT_EQ(r.exit_code, 0) << r;
  auto lines = split_lines(trim(r.out));
  ASSERT_EQ(lines.size(), 1u) << r;
  EXPECT_TRUE(broke_line(lines[0], "pool", a, a.slot)) << lines[0];
  EXPECT_FALSE(redis_.exists(ka)) << "the broken slot is still held";
  EXPECT_EQ(get(kb).value_or(""), vb) << "the other slot was touched";

  ASSERT_TRUE(a.proc->wait_for_exit(10s)) << a.proc->result();
  EXPECT_EQ(*a.proc->exit_code(), 124) << a.proc->result();
  // b keeps its slot through its renewals.
  EXPECT_FALSE(wait_until([&] { return !b.proc->running(); }, 1500ms)) << b.proc->result();
  EXPECT_EQ(get(kb).value_or(""), vb);
  RunResult l = run({"list", "-r", url(), "pool"});
  EXPECT_EQ(l.exit_code, 0) << l;
  EXPECT_TRUE(trim(l.out).starts_with("pool: 1 of 2 slots held")) << l;
  let_go("b");
  ASSERT_TRUE(b.proc->wait_for_exit(10s)) << b.proc->result();
  EXPECT_EQ(*b.proc->exit_code(), 0) << b.proc->result();
}

TEST_F(BreakTest, WithoutOwnerEveryHolderOfACountingLockIsBroken) {
  Holder a = start_holder(url(), "pool", "a", {"--ttl", "3s", "--limit", "2"});
  Holder b = start_holder(url(), "pool", "b", {"--ttl", "3s", "--limit", "2"});
  RunResult r = run({"break", "-r", url(), "pool", "--yes"});
  ASSERT_EQ(r.exit_code, 0) << r;
  auto lines = split_lines(trim(r.out));
  ASSERT_EQ(lines.size(), 2u) << r;
  for (const Holder* h : {&a, &b})
    EXPECT_TRUE(broke_line(lines[0], "pool", *h, h->slot) || broke_line(lines[1], "pool", *h, h->slot))
        << "no report of slot " << h->slot << "\n" << r;
  for (const Holder* h : {&a, &b}) {
    ASSERT_TRUE(h->proc->wait_for_exit(10s)) << h->proc->result();
    EXPECT_EQ(*h->proc->exit_code(), 124) << h->proc->result();
  }
  RunResult again = run({"break", "-r", url(), "pool", "--yes"});
  EXPECT_EQ(again.exit_code, 3) << again;
  EXPECT_TRUE(one_line_error(again, "pool: nothing held"));
}

TEST_F(BreakTest, NothingHeldIs3) {
  RunResult r = run({"break", "-r", url(), "job", "--yes"});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_TRUE(one_line_error(r, "job: nothing held"));
  EXPECT_EQ(trim(r.out), "");
  EXPECT_EQ(redis_.dbsize(), 0);
}

TEST_F(BreakTest, WithoutYesAndWithoutATerminalNothingIsBroken) {
  Holder h = start_holder(url(), "job", "h", {"--ttl", "3s"});
  const std::string value = get(lock_key("job")).value_or("");
  const std::string msg = "break: --yes is required when stdin is not a terminal (see fencerun --help)";
  RunResult r = run({"break", "-r", url(), "job"});  // stdin /dev/null
  EXPECT_EQ(r.exit_code, 64) << r;
  EXPECT_TRUE(one_line_error(r, msg));
  EXPECT_EQ(trim(r.out), "");
  // A "y" on a stdin that is not a terminal is no answer either.
  RunResult y = run_with_stdin({"break", "-r", url(), "job"}, "y\n");
  EXPECT_EQ(y.exit_code, 64) << y;
  EXPECT_TRUE(one_line_error(y, msg));
  EXPECT_EQ(get(lock_key("job")).value_or(""), value);
  EXPECT_FALSE(wait_until([&] { return !h.proc->running(); }, 1500ms)) << h.proc->result();
  EXPECT_EQ(get(lock_key("job")).value_or(""), value);
  let_go("h");
  ASSERT_TRUE(h.proc->wait_for_exit(10s)) << h.proc->result();
  EXPECT_EQ(*h.proc->exit_code(), 0) << h.proc->result();
}

}  // namespace
}  // namespace fencerun::test::admin
