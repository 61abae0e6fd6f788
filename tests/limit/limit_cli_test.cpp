// What a user of --limit sees, against a real redis-server: the checked values of --limit (usage
// errors that run nothing and write nothing), the agreement of all holders of a lock on N (a run with
// another N exits 64 naming both values, without running its command, and a free lock takes any N),
// FENCERUN_SLOT and FENCERUN_LIMIT in the command's environment, and `fencerun status` (text and
// --json) listing every holder with its slot, token, owner, pid and TTL, the limit and the waiters.
#include <gtest/gtest.h>

#include <regex>

#include "limit_fixture.hpp"
#include "support/json.hpp"

namespace fencerun::test::limit {
namespace {

std::optional<long long> json_int(const Json* j) { return j ? j->as_int() : std::nullopt; }
std::optional<std::string> json_str(const Json* j) { return j ? j->as_string() : std::nullopt; }

class LimitCli : public LimitTest {
 protected:
  // The line of stderr that says which --limit the lock is held with and which this run asked for.
  static std::string mismatch(const std::string& name, int held, int asked) {
    return "lock '" + name + "' is held with --limit " + std::to_string(held) +
           "; this run asks for --limit " + std::to_string(asked) +
           " (all holders of a lock must use the same --limit)";
  }
  // A line of `text` that holds `message` (errors are logged as "fencerun: error: MESSAGE [fields]").
  static bool has_line(const std::string& text, const std::string& message) {
    for (const auto& l : split_lines(text))
      if (l.find(message) != std::string::npos) return true;
    return false;
  }
};

// --- values of --limit ---

struct BadLimit {
  std::string value;
  std::string message;  // how the one line on stderr begins (usage errors may add a pointer to --help);
                        // empty: only its gist is checked
};

void PrintTo(const BadLimit& b, std::ostream* os) { *os << "--limit '" << b.value << "'"; }

class LimitBadValue : public LimitCli, public ::testing::WithParamInterface<BadLimit> {};

TEST_P(LimitBadValue, IsAUsageErrorThatRunsAndWritesNothing) {
  const auto& [v, message] = GetParam();
  auto r = run_sh("bad", "echo ran > ran", {"--limit", v});
  EXPECT_EQ(r.exit_code, 64) << r;
  const auto err = split_lines(r.err);
  ASSERT_EQ(err.size(), 1u) << "one line on stderr:\n" << r;
  if (!message.empty()) {
    EXPECT_TRUE(err[0] == message || err[0].starts_with(message + " (")) << "expected: " << message << "\n" << r;
  } else {
    EXPECT_NE(err[0].find("--limit"), std::string::npos) << r;
    EXPECT_NE(err[0].find("1 to 1024"), std::string::npos) << r;
  }
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command ran";
  EXPECT_EQ(redis().dbsize(), 0) << "a usage error wrote keys: " << join(redis().keys());
}

INSTANTIATE_TEST_SUITE_P(
    Values, LimitBadValue,
    ::testing::Values(BadLimit{"0", "fencerun: --limit: 0 is not from 1 to 1024"},
                      BadLimit{"1025", "fencerun: --limit: 1025 is not from 1 to 1024"},
                      BadLimit{"-1", "fencerun: --limit: -1 is not from 1 to 1024"},
                      BadLimit{"abc", "fencerun: --limit: 'abc' is not a whole number from 1 to 1024"},
                      BadLimit{"3x", "fencerun: --limit: '3x' is not a whole number from 1 to 1024"},
                      BadLimit{"1.5", "fencerun: --limit: '1.5' is not a whole number from 1 to 1024"},
                      BadLimit{"", ""}, BadLimit{"99999999999999999999", ""}),
    [](const ::testing::TestParamInfo<BadLimit>& p) {
      const std::string& v = p.param.value;
      if (v.empty()) return std::string("Empty");
      if (v == "-1") return std::string("Minus1");
      if (v == "1.5") return std::string("Fraction");
      if (v.size() > 10) return std::string("Overflow");
      return "V" + v;
    });

TEST_F(LimitCli, BoundaryValuesRun) {
  for (const std::string v : {"1", "1024"}) {
    auto r = run_sh("edge" + v, "echo \"$FENCERUN_SLOT $FENCERUN_LIMIT\"", {"--limit", v});
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_EQ(r.out, "0 " + v + "\n") << r;
  }
}

// --- agreement on N ---

TEST_F(LimitCli, MismatchedLimitIsRefusedNamingBothValues) {
  const std::string name = "agree";
  Held h;
  auto holder = start_slot_holder(name, "h", limit_opts(3), &h);
  EXPECT_EQ(h.limit, 3);

  auto two = run_sh(name, "echo ran > ran2", {"--limit", "2"});
  EXPECT_EQ(two.exit_code, 64) << two;
  EXPECT_TRUE(has_line(two.err, mismatch(name, 3, 2))) << "expected: " << mismatch(name, 3, 2) << "\n" << two;
  EXPECT_FALSE(std::filesystem::exists(file("ran2"))) << "the --limit 2 run ran its command";

  // Waiting does not help a run with another N: it is refused at once, not at the end of its wait.
  auto waiting = run_sh(name, "echo ran > ran2w", {"--limit", "2", "--wait", "20s"});
  EXPECT_EQ(waiting.exit_code, 64) << waiting;
  EXPECT_LT(waiting.elapsed, 5s) << waiting;
  EXPECT_FALSE(std::filesystem::exists(file("ran2w")));

  auto plain = run_sh(name, "echo ran > ran1", {});
  EXPECT_EQ(plain.exit_code, 64) << plain;
  EXPECT_TRUE(has_line(plain.err, mismatch(name, 3, 1))) << "expected: " << mismatch(name, 3, 1) << "\n" << plain;
  EXPECT_FALSE(std::filesystem::exists(file("ran1"))) << "the plain run ran its command";

  // The refused runs took nothing: the holder's slot only, no plain lock, nobody queued.
  EXPECT_TRUE(exists(slot_key(name, 0)));
  EXPECT_FALSE(exists(slot_key(name, 1))) << "a refused run took a slot";
  EXPECT_FALSE(exists(key(name, "lock"))) << "a refused plain run took the plain lock";
  EXPECT_EQ(queued(name), 0) << "a refused run stayed queued";
  EXPECT_EQ(value(key(name, "limit")), "3");

  // The same N is welcome.
  auto three = run_sh(name, "echo \"$FENCERUN_SLOT\" > ran3", {"--limit", "3"});
  EXPECT_EQ(three.exit_code, 0) << three;
  EXPECT_EQ(read_file(file("ran3")), "1\n");

  release("h");
  ASSERT_EQ(holder->wait_for_exit(10s), 0) << holder->result();

  // Reversed: a plain holder (no --limit), then a counting run.
  auto plain_holder = start_slot_holder(name, "p", {"--ttl", "30s"});
  ASSERT_TRUE(exists(key(name, "lock")));
  auto counting = run_sh(name, "echo ran > ran4", {"--limit", "2"});
  EXPECT_EQ(counting.exit_code, 64) << counting;
  EXPECT_TRUE(has_line(counting.err, mismatch(name, 1, 2))) << "expected: " << mismatch(name, 1, 2) << "\n"
                                                            << counting;
  EXPECT_FALSE(std::filesystem::exists(file("ran4")));
  EXPECT_FALSE(exists(slot_key(name, 0)));
  EXPECT_FALSE(exists(slot_key(name, 1)));
  // --limit 1 is the plain lock: busy (75), not a mismatch.
  auto one = run_sh(name, "echo ran > ran5", {"--limit", "1"});
  EXPECT_EQ(one.exit_code, 75) << one;
  EXPECT_FALSE(std::filesystem::exists(file("ran5")));
  release("p");
  ASSERT_EQ(plain_holder->wait_for_exit(10s), 0) << plain_holder->result();

  // No holder any more: any N may be used, one after the other.
  for (const std::string v : {"2", "5", "1"}) {
    auto r = run_sh(name, "echo \"$FENCERUN_LIMIT\"", {"--limit", v});
    EXPECT_EQ(r.exit_code, 0) << "--limit " << v << " on a free lock: " << r;
    EXPECT_EQ(r.out, v + "\n") << r;
  }
  auto r = run_sh(name, "echo \"$FENCERUN_LIMIT\"", {});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "1\n") << r;
}

// --- environment and status ---

TEST_F(LimitCli, PlainRunSeesSlotZeroOfOne) {
  auto r = run_sh("plainenv", "echo \"$FENCERUN_SLOT $FENCERUN_LIMIT\"", {});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "0 1\n") << r;
}

TEST_F(LimitCli, StatusListsEveryHolderTheLimitAndTheWaiters) {
  const std::string name = "shown";
  const auto opts = limit_opts(3, {"--ttl", "20s"});
  std::vector<std::unique_ptr<FencerunProcess>> ps;
  std::vector<Held> hs(3);
  for (int i = 0; i < 3; ++i) {
    ps.push_back(start_slot_holder(name, "h" + std::to_string(i), opts, &hs[i]));
    EXPECT_EQ(hs[i].slot, i) << "the lowest free slot is taken";
    EXPECT_EQ(hs[i].limit, 3);
    EXPECT_EQ(hs[i].owner.size(), 32u) << hs[i].owner;
    if (i > 0) {
      EXPECT_GT(hs[i].token, hs[i - 1].token);
    }
  }
  // A fourth run waits.
  auto w = start(name, holder_script("w"), limit_opts(3, {"--ttl", "20s", "--wait", "60s"}));
  ASSERT_TRUE(wait_queued(name, 1)) << "the fourth run is not waiting: " << w->result();

  const std::regex slot_line(R"(slot (\d+): pid (\d+) on (\S+) \(owner ([0-9a-f]{8})\), token (\d+), ttl (\d+)ms remaining)");
  auto check_text = [&](const std::vector<int>& slots, const std::vector<const Held*>& by, const std::vector<pid_t>& pids,
                        long long waiters, long long last) {
    auto r = run({"status", "-r", redis().url(), name});
    EXPECT_EQ(r.exit_code, 0) << r;
    auto l = split_lines(r.out);
    // An earlier plain run of NAME left its record: its two lines come last (tests/cron).
    if (l.size() == slots.size() + 5 && l.back().starts_with("last success: ")) l.resize(slots.size() + 3);
    ASSERT_EQ(l.size(), slots.size() + 3) << r;
    EXPECT_EQ(l[0], name + ": " + std::to_string(slots.size()) + " of 3 slots held") << r;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(l[1 + i], m, slot_line)) << l[1 + i];
      EXPECT_EQ(std::stoi(m[1]), slots[i]) << r;
      EXPECT_EQ(std::stoll(m[2]), pids[i]) << "the pid of the fencerun holding slot " << slots[i] << "\n" << r;
      EXPECT_EQ(m[3].str(), hostname());
      EXPECT_EQ(m[4].str(), by[i]->owner.substr(0, 8)) << r;
      EXPECT_EQ(std::stoll(m[5]), by[i]->token) << r;
      EXPECT_GT(std::stoll(m[6]), 0);
      EXPECT_LE(std::stoll(m[6]), 20000);
    }
    EXPECT_EQ(l[slots.size() + 1], "waiters: " + std::to_string(waiters)) << r;
    EXPECT_EQ(l[slots.size() + 2], "last token: " + std::to_string(last)) << r;
  };
  auto check_json = [&](const std::vector<int>& slots, const std::vector<const Held*>& by, const std::vector<pid_t>& pids,
                        long long waiters, long long last) {
    auto r = run({"status", "-r", redis().url(), "--json", name});
    EXPECT_EQ(r.exit_code, 0) << r;
    auto doc = parse_json(r.out);
    ASSERT_TRUE(doc && doc->kind == Json::Kind::Object) << "not a JSON object: " << r.out;
    EXPECT_EQ(json_str(doc->find("lock")), name);
    EXPECT_TRUE(doc->find("held") && doc->find("held")->is_true()) << r.out;
    EXPECT_EQ(json_int(doc->find("limit")), 3) << r.out;
    EXPECT_EQ(json_int(doc->find("waiters")), waiters) << r.out;
    EXPECT_EQ(json_int(doc->find("last_token")), last) << r.out;
    const Json* holders = doc->find("holders");
    ASSERT_TRUE(holders && holders->kind == Json::Kind::Array) << r.out;
    ASSERT_EQ(holders->items.size(), slots.size()) << r.out;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      // Matched by slot, whatever the order of the array.
      const Json* e = nullptr;
      for (const auto& it : holders->items)
        if (json_int(it.find("slot")) == slots[i]) e = &it;
      ASSERT_NE(e, nullptr) << "no holder of slot " << slots[i] << " in " << r.out;
      EXPECT_EQ(json_str(e->find("owner")), by[i]->owner.substr(0, 8)) << r.out;
      EXPECT_EQ(json_str(e->find("host")), hostname()) << r.out;
      EXPECT_EQ(json_int(e->find("pid")), pids[i]) << r.out;
      EXPECT_EQ(json_int(e->find("token")), by[i]->token) << r.out;
      const auto ttl = json_int(e->find("ttl_ms"));
      ASSERT_TRUE(ttl) << r.out;
      EXPECT_GT(*ttl, 0);
      EXPECT_LE(*ttl, 20000);
    }
  };

  check_text({0, 1, 2}, {&hs[0], &hs[1], &hs[2]}, {ps[0]->pid(), ps[1]->pid(), ps[2]->pid()}, 1, hs[2].token);
  check_json({0, 1, 2}, {&hs[0], &hs[1], &hs[2]}, {ps[0]->pid(), ps[1]->pid(), ps[2]->pid()}, 1, hs[2].token);

  // Slot 1 frees: the waiter takes it (the lowest free one); then slot 0 frees, and nobody waits.
  release("h1");
  ASSERT_EQ(ps[1]->wait_for_exit(10s), 0) << ps[1]->result();
  auto wh = held("w");
  ASSERT_TRUE(wh) << w->result();
  EXPECT_EQ(wh->slot, 1);
  EXPECT_GT(wh->token, hs[2].token);
  release("h0");
  ASSERT_EQ(ps[0]->wait_for_exit(10s), 0) << ps[0]->result();
  ASSERT_TRUE(wait_until([&] { return !exists(slot_key(name, 0)); }, 5s));
  check_text({1, 2}, {&*wh, &hs[2]}, {w->pid(), ps[2]->pid()}, 0, wh->token);
  check_json({1, 2}, {&*wh, &hs[2]}, {w->pid(), ps[2]->pid()}, 0, wh->token);

  release("w");
  release("h2");
  ASSERT_EQ(w->wait_for_exit(10s), 0) << w->result();
  ASSERT_EQ(ps[2]->wait_for_exit(10s), 0) << ps[2]->result();
  auto f = run({"status", "-r", redis().url(), name});
  EXPECT_EQ(f.exit_code, 3) << "a free counting lock: " << f;
  auto fj = run({"status", "-r", redis().url(), "--json", name});
  EXPECT_EQ(fj.exit_code, 3) << fj;
  auto fdoc = parse_json(fj.out);
  ASSERT_TRUE(fdoc && fdoc->kind == Json::Kind::Object) << fj.out;
  ASSERT_NE(fdoc->find("held"), nullptr) << fj.out;
  EXPECT_FALSE(fdoc->find("held")->is_true()) << fj.out;
  const Json* holders = fdoc->find("holders");
  ASSERT_TRUE(holders && holders->kind == Json::Kind::Array) << fj.out;
  EXPECT_TRUE(holders->items.empty()) << fj.out;
  EXPECT_EQ(json_int(fdoc->find("waiters")), 0) << fj.out;
  EXPECT_EQ(json_int(fdoc->find("last_token")), wh->token) << fj.out;
  EXPECT_NE(fdoc->find("limit"), nullptr) << "\"limit\" is always there: " << fj.out;
}

TEST_F(LimitCli, StatusOfAPlainLockShowsWaitersAndTheHolderAsSlotZero) {
  const std::string name = "plainshown";
  Held h;
  auto holder = start_slot_holder(name, "h", {"--ttl", "20s"}, &h);
  EXPECT_EQ(h.slot, 0);
  EXPECT_EQ(h.limit, 1);
  auto w = start(name, holder_script("w"), {"--ttl", "20s", "--wait", "60s"});
  ASSERT_TRUE(wait_queued(name, 1)) << w->result();

  auto r = run({"status", "-r", redis().url(), name});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(has_line(r.out, "waiters: 1")) << r;
  EXPECT_TRUE(has_line(r.out, "token: " + std::to_string(h.token))) << r;
  auto j = run({"status", "-r", redis().url(), "--json", name});
  EXPECT_EQ(j.exit_code, 0) << j;
  auto doc = parse_json(j.out);
  ASSERT_TRUE(doc && doc->kind == Json::Kind::Object) << j.out;
  EXPECT_EQ(json_int(doc->find("limit")), 1) << j.out;
  EXPECT_EQ(json_int(doc->find("waiters")), 1) << j.out;
  EXPECT_EQ(json_int(doc->find("token")), h.token) << "the plain lock keeps its top-level fields: " << j.out;
  EXPECT_EQ(json_int(doc->find("pid")), holder->pid()) << j.out;
  const Json* holders = doc->find("holders");
  ASSERT_TRUE(holders && holders->kind == Json::Kind::Array) << j.out;
  ASSERT_EQ(holders->items.size(), 1u) << j.out;
  EXPECT_EQ(json_int(holders->items[0].find("slot")), 0) << j.out;
  EXPECT_EQ(json_int(holders->items[0].find("token")), h.token) << j.out;
  EXPECT_EQ(json_str(holders->items[0].find("owner")), h.owner.substr(0, 8)) << j.out;

  release("h");
  release("w");
  EXPECT_EQ(holder->wait_for_exit(10s), 0) << holder->result();
  EXPECT_EQ(w->wait_for_exit(10s), 0) << w->result();
}

// --- logs and metrics ---

// Every log event of a run that holds a slot names the slot next to the lock and the token; every
// metrics series has the label slot="I" once a slot was acquired, slot="" when none was.
TEST_F(LimitCli, LogsAndMetricsNameTheSlot) {
  const std::string name = "logged";
  auto h = start_slot_holder(name, "h", limit_opts(2));
  auto json = run_sh(name, "true", limit_opts(2, {"--ttl", "30s", "-v", "--log-format", "json", "--metrics-file", "m.prom"}));
  ASSERT_EQ(json.exit_code, 0) << json;
  int with_token = 0;
  for (const auto& l : split_lines(json.err)) {
    auto doc = parse_json(l);
    ASSERT_TRUE(doc && doc->kind == Json::Kind::Object) << "not a JSON log line: " << l;
    if (!doc->find("token")) continue;
    ++with_token;
    const Json* slot = doc->find("slot");
    ASSERT_NE(slot, nullptr) << "an event with a token but no slot: " << l;
    // The interface writes "slot":"1"; a number 1 is taken too (the token is a number in these logs).
    EXPECT_TRUE(slot->kind == Json::Kind::String || slot->kind == Json::Kind::Number) << l;
    EXPECT_EQ(slot->text, "1") << l;
    EXPECT_EQ(json_str(doc->find("lock")), name) << l;
  }
  EXPECT_GE(with_token, 2) << "the acquire and the release are logged with the token:\n" << json;

  auto text = run_sh(name, "true", limit_opts(2, {"--ttl", "30s", "-v"}));
  ASSERT_EQ(text.exit_code, 0) << text;
  int text_events = 0;
  for (const auto& l : split_lines(text.err)) {
    if (l.find("token") == std::string::npos) continue;
    ++text_events;
    EXPECT_TRUE(l.find("slot: 1") != std::string::npos || l.find("slot=1") != std::string::npos) << l;
  }
  EXPECT_GE(text_events, 2) << text;

  auto series = [&](const std::string& f) {
    std::vector<std::string> out;
    for (const auto& l : lines(f))
      if (!l.empty() && l[0] != '#') out.push_back(l);
    return out;
  };
  const auto m = series("m.prom");
  ASSERT_FALSE(m.empty()) << "no metrics written";
  for (const auto& l : m) EXPECT_NE(l.find("{lock=\"" + name + "\",slot=\"1\"}"), std::string::npos) << l;

  // Both slots held: a run that gets none has slot="".
  auto h2 = start_slot_holder(name, "h2", limit_opts(2));
  auto busy = run_sh(name, "true", limit_opts(2, {"--metrics-file", "busy.prom"}));
  EXPECT_EQ(busy.exit_code, 75) << busy;
  const auto b = series("busy.prom");
  ASSERT_FALSE(b.empty()) << "no metrics written for the busy run";
  for (const auto& l : b) EXPECT_NE(l.find("{lock=\"" + name + "\",slot=\"\"}"), std::string::npos) << l;

  release("h");
  release("h2");
  EXPECT_EQ(h->wait_for_exit(10s), 0) << h->result();
  EXPECT_EQ(h2->wait_for_exit(10s), 0) << h2->result();
}

}  // namespace
}  // namespace fencerun::test::limit
