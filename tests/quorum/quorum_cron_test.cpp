// --min-interval, --every and the record of runs in quorum mode: every server keeps the record beside
// the lock (written at the release, in the same step as each server's compare-and-delete); an
// acquisition that holds a majority judges by each server's record on that server's clock (--min-interval:
// the newest success by token). The newest record winning over an older one; a killed run; history
// merged over the servers; one run per slot through a server restarted empty between two triggers; the
// fire time of a server that missed the trigger's first request. The fleet (one run per period, with a
// server restarted empty in the middle of a run) and the slots' timeline are in tests/contract.
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "quorum_fixture.hpp"

namespace fencerun::test {
namespace {

class QuorumCronTest : public QuorumTest {
 protected:
  RedisOptions redis_options() const override {
    RedisOptions o;
    o.extra_args = {"--appendonly", "yes", "--appendfsync", "always"};
    return o;
  }
  // kill -9, its files removed, started again: every key is gone.
  void restart_empty(std::size_t i) {
    server(i).stop();
    std::filesystem::remove_all(server(i).dir() / "appendonlydir");
    server(i).start();
  }
  std::vector<Json> history(std::vector<std::string> extra = {}) {
    auto args = quorum({"history", "--json", "job"});
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run(args);
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 3) << r;
    auto j = parse_json(r.out);
    if (!j || j->kind != Json::Kind::Array) {
      ADD_FAILURE() << "history --json is not an array: " << r;
      return {};
    }
    return j->items;
  }
  static std::string field(const Json& j, std::string_view key) {
    const Json* f = j.find(key);
    if (!f) return "<missing>";
    if (f->kind == Json::Kind::Null) return "null";
    return f->text;
  }
  // --every 24h with the slot of now starting 12 h ago on server 1's clock (the servers share the host's
  // clock): every trigger of a test falls in that slot. Its start, Unix seconds, in `slot_start`.
  std::vector<std::string> one_slot_for_the_test(long long& slot_start) {
    constexpr long long day_ms = 86'400'000;
    const long long now_ms = server(0).time_us() / 1000;
    const long long offset_ms = (now_ms + day_ms / 2) % day_ms;
    slot_start = (now_ms - day_ms / 2) / 1000;
    return {"--every", "24h", "--slot-offset", std::to_string(offset_ms) + "ms", "--skip-exit-code", "9"};
  }
  // The fields of a record on server i ("<start> <end> <outcome> ... <version> [<fire>]"), empty when none.
  std::vector<std::string> record_fields(std::size_t i, const std::string& key) {
    std::vector<std::string> f;
    std::istringstream in(server(i).get(key).value_or(""));
    for (std::string w; in >> w;) f.push_back(w);
    return f;
  }
};

// The servers disagree on the last success: server 3 was down during the newer one. A run that holds
// servers 2 and 3 must go by the newest token (server 2's), not by server 3's older record.
TEST_F(QuorumCronTest, NewestSuccessByTokenWins) {
  const std::vector<std::string> o = {"--min-interval", "1500ms", "--skip-exit-code", "9"};
  auto job = [&](const std::string& script) { return run(quorum_sh("job", script, o)); };
  ASSERT_EQ(job("true").exit_code, 0);
  const long long older = server(2).time_us();
  ASSERT_TRUE(wait_until([&] { return server(2).time_us() - older > 1'600'000; }, 5s));
  server(2).stop();
  auto b = job("echo $FENCERUN_TOKEN > token");
  ASSERT_EQ(b.exit_code, 0) << b;
  const std::string newer = wait_line("token");
  server(2).start();
  server(0).stop();
  // Servers 2 and 3 answer: 2 has the newer success (too recent), 3 the older one (long enough ago).
  auto c = job("echo ran > third");
  EXPECT_EQ(c.exit_code, 9) << c;
  EXPECT_FALSE(std::filesystem::exists(file("third")));
  auto status = run(quorum({"status", "--json", "job"}));
  auto j = parse_json(status.out);
  ASSERT_TRUE(j && j->find("last_success")) << status;
  EXPECT_EQ(field(*j->find("last_success"), "token"), newer) << status;
  // The skip held nothing.
  EXPECT_EQ(holding("job"), 0u);
  server(0).start();
}

// A failed run does not count; a fencerun killed with SIGKILL is recorded as killed (once, though
// every server records it) by the next run; status and history show the records.
TEST_F(QuorumCronTest, KilledAndFailedRunsAreRecorded) {
  auto p = start(quorum_sh("job", "echo $$ > pid; echo $FENCERUN_TOKEN > token; sleep 1000", {"--ttl", "2s"}));
  wait_pid("pid");
  const std::string killed_token = wait_line("token");
  const pid_t fencerun_pid = p->pid();
  ASSERT_TRUE(p->signal(SIGKILL));
  p->wait_for_exit(10s);
  kill_if_alive(*wait_for_pid_file(file("pid"), 1s));
  ASSERT_TRUE(wait_until([&] { return holding("job") == 0; }, 10s));
  auto failed = run(quorum_sh("job", "echo x >> ran; exit 4", {"--min-interval", "1h"}));
  ASSERT_EQ(failed.exit_code, 4) << failed;
  auto ok = run(quorum_sh("job", "echo x >> ran", {"--min-interval", "1h"}));
  ASSERT_EQ(ok.exit_code, 0) << ok;
  auto skipped = run(quorum_sh("job", "echo x >> ran", {"--min-interval", "1h", "-v"}));
  EXPECT_EQ(skipped.exit_code, 0) << skipped;
  EXPECT_NE(skipped.err.find("skipped: the last success started"), std::string::npos) << skipped;
  EXPECT_EQ(split_lines(read_file(file("ran")).value_or("")).size(), 2u);
  EXPECT_EQ(holding("job"), 0u);

  auto h = history();
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(field(h[0], "outcome"), "ok");
  EXPECT_EQ(field(h[0], "pid"), std::to_string(ok.pid));
  EXPECT_EQ(field(h[1], "outcome"), "failed");
  EXPECT_EQ(field(h[1], "exit_code"), "4");
  EXPECT_EQ(field(h[2], "outcome"), "killed");
  EXPECT_EQ(field(h[2], "token"), killed_token);
  EXPECT_EQ(field(h[2], "pid"), std::to_string(fencerun_pid));
  EXPECT_EQ(field(h[2], "end_us"), "null");
  auto two = history({"-n", "2"});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(field(two[1], "exit_code"), "4");
  // Every server keeps the record itself.
  for (std::size_t i = 0; i < k_servers; ++i) EXPECT_EQ(server(i).cmd({"LLEN", "fencerun:{job}:runs"}).integer, 3) << i;

  auto status = run(quorum({"status", "job"}));
  EXPECT_NE(status.out.find("last run: ok after "), std::string::npos) << status;
  EXPECT_NE(status.out.find("last success: ok after "), std::string::npos) << status;
  auto list = run(quorum({"list", "--all"}));
  EXPECT_NE(list.out.find(", last run ok "), std::string::npos) << list;
  // One server restarted empty: the others still have the whole record.
  restart_empty(0);
  EXPECT_EQ(history().size(), 3u);
}

// --every across a server restarted without its data between two triggers of one slot. The second
// trigger holds servers 2 and 3, which kept the success: skipped. Once server 1 counts again (its
// quarantine, 1s + 2% + 10ms here), a third holds servers 1 and 2 with server 3 down: server 1 has no
// record and no rule (nothing to compare, not a mismatch), server 2 has the success: skipped too. One
// run in the slot, and nothing held by the skips.
TEST_F(QuorumCronTest, OneRunPerSlotThroughAServerRestartedEmpty) {
  const EnvList cap = {{"FENCERUN_QUORUM_MAX_TTL", "1s"}};
  long long slot_start = 0;
  auto o = one_slot_for_the_test(slot_start);
  o.insert(o.end(), {"--ttl", "1s", "-v"});
  auto trigger = [&] { return run(quorum_sh("job", "echo $FENCERUN_SLOT_START_UNIX >> ran", o), cap); };
  auto first = trigger();
  ASSERT_EQ(first.exit_code, 0) << first;
  EXPECT_EQ(split_lines(read_file(file("ran")).value_or("")), std::vector<std::string>{std::to_string(slot_start)});

  restart_empty(0);
  auto second = trigger();
  EXPECT_EQ(second.exit_code, 9) << second;
  EXPECT_NE(second.err.find("skipped: the slot of "), std::string::npos) << second;
  EXPECT_EQ(holding("job"), 0u);

  // Server 1's new epoch marker is older than the quarantine once its clock moved on by more.
  const long long restarted = server(0).time_us();
  ASSERT_TRUE(wait_until([&] { return server(0).time_us() - restarted > 1'100'000; }, 5s));
  server(2).stop();
  auto third = trigger();
  EXPECT_EQ(third.exit_code, 9) << third;
  EXPECT_NE(third.err.find("skipped: the slot of "), std::string::npos) << third;
  EXPECT_EQ(third.err.find("rule_mismatch"), std::string::npos) << third;
  EXPECT_FALSE(server(0).exists("fencerun:{job}:ok"));
  EXPECT_FALSE(server(0).exists("fencerun:{job}:rule"));
  EXPECT_EQ(holding("job"), 0u);
  server(2).start();

  auto fourth = trigger();
  EXPECT_EQ(fourth.exit_code, 9) << fourth;
  EXPECT_EQ(split_lines(read_file(file("ran")).value_or("")).size(), 1u);
  auto h = history();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(field(h[0], "outcome"), "ok");
  EXPECT_NE(field(h[0], "fired_us"), "<missing>");
  // status: the rule the servers store and the slot's state, on the merged record.
  auto status = run(quorum({"status", "job"}));
  EXPECT_NE(status.out.find("rule: --every 24h --slot-offset "), std::string::npos) << status;
  EXPECT_NE(status.out.find("slot: " + rfc3339_utc(slot_start) + ", succeeded; next slot "), std::string::npos) << status;
}

// A waiter whose first request server 3 did not answer (it was down for a second more) takes server
// 3's fire time as that server's time less how long ago the trigger fired on this host's boot clock:
// the record there says when the trigger fired, as on the servers that answered at once, not when
// server 3 first answered or when the run started. It runs for the slot the failed holder left undone.
TEST_F(QuorumCronTest, AServerThatMissedTheFirstRequestRecordsTheFireTimeOnItsOwnClock) {
  long long slot_start = 0;
  auto o = one_slot_for_the_test(slot_start);
  // Counters on every server (a new lock needs all three); a failed run marks nothing.
  ASSERT_EQ(run(quorum_sh("job", "exit 3", o)).exit_code, 3);
  server(2).stop();
  auto holder = start(quorum_sh("job", "touch holding; while [ ! -e go ]; do sleep 0.05; done; exit 3", o));
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(file("holding")); }, 10s));
  auto waiter_options = o;
  waiter_options.insert(waiter_options.end(), {"--wait", "30s", "-v"});
  auto waiter = start(quorum_sh("job", "echo $FENCERUN_SLOT_START_UNIX > ran", waiter_options));
  ASSERT_TRUE(wait_until([&] { return waiter->err().find("lock is busy, waiting") != std::string::npos; }, 10s))
      << waiter->result();
  const long long fired_about = server(0).time_us();
  // Server 3 comes back a second after the trigger fired, and the waiter's next try reaches it (a
  // script call on it: no other client runs one meanwhile, the holder renews every 10 s).
  ASSERT_TRUE(wait_until([&] { return server(0).time_us() - fired_about > 1'000'000; }, 5s));
  server(2).start();
  ASSERT_TRUE(wait_until([&] { return server(2).cmd({"CLIENT", "LIST"}).str.find("cmd=eval") != std::string::npos; }, 10s));
  touch("go");
  EXPECT_EQ(holder->wait_for_exit(20s), 3) << holder->result();
  EXPECT_EQ(waiter->wait_for_exit(40s), 0) << waiter->result();
  EXPECT_EQ(wait_line("ran"), std::to_string(slot_start));

  std::vector<long long> fire, start_us;
  for (std::size_t i = 0; i < k_servers; ++i) {
    const auto f = record_fields(i, "fencerun:{job}:ok");
    ASSERT_EQ(f.size(), 10u) << "server " << i + 1 << ": " << server(i).get("fencerun:{job}:ok").value_or("none");
    start_us.push_back(std::atoll(f[0].c_str()));
    fire.push_back(std::atoll(f[9].c_str()));
  }
  for (std::size_t i = 0; i < k_servers; ++i) {
    // One clock (the host's), so the fire times agree within the requests' delays and the host's load.
    EXPECT_LT(std::llabs(fire[i] - fire[0]), 500'000) << "server " << i + 1;
    EXPECT_LT(fire[i], fired_about + 100'000) << "server " << i + 1;
    EXPECT_GT(start_us[i] - fire[i], 900'000) << "server " << i + 1;
  }
}

}  // namespace
}  // namespace fencerun::test
