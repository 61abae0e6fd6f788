// 10. Once per schedule slot (--every), on every setup. One timeline of two slots of kPeriod (aligned
// on the host's clock, which is the servers' on loopback), five locks side by side, each a case a cron
// fleet meets every week:
//   late    slot k's only trigger fires late and succeeds; the triggers of slot k+1 still run it once
//           (an interval of 0.6 P would have skipped slot k+1), and those that find it busy are skips
//   long    a job longer than the triggers' spread, with waiters: one run per slot, the waiters skipped
//   failed  slot k's first run fails: the next trigger of the slot runs it again, the one after skips
//   old     a waiter of slot k still waiting in slot k+1 runs for slot k only, and a waiter of slot
//           k+1 runs for k+1: each told its own slot (FENCERUN_SLOT_START_UNIX)
//   killed  slot k's run SIGKILLed with its fencerun: the next trigger of the slot runs it after the TTL
//           (on etcd after the lock-delay too, the killed holder's TTL again: it waits long enough)
// Exit codes: a run 0 (or its command's), a skip --skip-exit-code (42 here), never the busy code 75.
// A setup without --every refuses it (64, naming it). Triggers of another rule are refused (64).
#include <csignal>
#include <ctime>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "contract_fixture.hpp"

namespace fencerun::test::contract {
namespace {

constexpr auto kPeriod = 4000ms;
constexpr int kSkipCode = 42;

class Slots : public ContractTest {
 protected:
  // --every ... NAME -- sh -c SCRIPT with the skip code; SCRIPT logs "CASE SLOT_START TOKEN" when done.
  std::vector<std::string> slot_args(const std::string& name, const std::string& body, std::vector<std::string> extra = {}) {
    std::vector<std::string> o = {"--every", "4s", "--ttl", "2s", "--skip-exit-code", std::to_string(kSkipCode)};
    o.insert(o.end(), extra.begin(), extra.end());
    return sh_args(name, body + "; echo \"" + name + " $FENCERUN_SLOT_START_UNIX $FENCERUN_TOKEN\" >> runs.log", o);
  }
};

TEST_P(Slots, OneRunPerSlotThroughLateLongFailedOldAndKilledRuns) {
  if (!caps().every) {
    auto r = run(slot_args("late", "true"));
    EXPECT_EQ(r.exit_code, 64) << r;
    EXPECT_NE(r.err.find("--every: not supported on"), std::string::npos) << r;
    return;
  }
  // S: the start of the first slot that begins at least 0.5 s from now (Unix time, host clock).
  using namespace std::chrono;
  const auto now_ms = duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
  const long long p = kPeriod.count();
  long long s_ms = (now_ms / p + 1) * p;
  if (s_ms - now_ms < 500) s_ms += p;
  const auto steady_s = Clock::now() + milliseconds(s_ms - now_ms);
  const long long slot_k = s_ms / 1000, slot_k1 = (s_ms + p) / 1000;
  auto at = [&](double periods) { return steady_s + milliseconds(static_cast<long long>(periods * p)); };

  struct Trigger {
    Clock::time_point when;
    std::string name;
    std::string body;
    std::vector<std::string> extra;
    int expect;  // exit code
    std::unique_ptr<FencerunProcess> process;
  };
  std::vector<Trigger> t;
  // late: fires 0.6 P into slot k; slot k+1's three triggers, 0.1 s apart, the first runs 0.6 s.
  t.push_back({at(0.6), "late", "sleep 0.2", {}, 0, nullptr});
  t.push_back({at(1.05), "late", "sleep 0.6", {}, 0, nullptr});
  t.push_back({at(1.1), "late", "sleep 0.6", {}, kSkipCode, nullptr});  // busy with slot k+1's run: a skip
  t.push_back({at(1.15), "late", "sleep 0.6", {}, kSkipCode, nullptr});
  // long: a 1.5 s job and two waiters in slot k; one trigger in slot k+1.
  t.push_back({at(0.05), "long", "sleep 1.5", {}, 0, nullptr});
  t.push_back({at(0.1), "long", "true", {"--wait", "10s"}, kSkipCode, nullptr});
  t.push_back({at(0.15), "long", "true", {"--wait", "10s"}, kSkipCode, nullptr});
  t.push_back({at(1.05), "long", "true", {}, 0, nullptr});
  // failed: exits 3, then the slot runs again, then it is done.
  t.push_back({at(0.05), "failed", "exit 3", {}, 3, nullptr});
  t.push_back({at(0.3), "failed", "true", {}, 0, nullptr});
  t.push_back({at(0.55), "failed", "true", {}, kSkipCode, nullptr});
  // old: slot k's run fails 0.3 P into slot k+1; a waiter of each slot runs for its own; then k+1 is done.
  t.push_back({at(0.4), "old", "sleep 3.6; exit 3", {}, 3, nullptr});
  t.push_back({at(0.5), "old", "true", {"--wait", "20s"}, 0, nullptr});
  t.push_back({at(1.1), "old", "true", {"--wait", "20s"}, 0, nullptr});
  t.push_back({at(1.75), "old", "true", {}, kSkipCode, nullptr});
  // killed: its fencerun is SIGKILLed (the watchdog stops the job); after the 2 s TTL the slot runs
  // (etcd: its lease runs out up to 2.5 s after the kill, then the 2 s lock-delay: up to 5 s).
  t.push_back({at(0.05), "killed", "echo $$ > killed.pid; sleep 30", {}, -1, nullptr});
  t.push_back({at(0.7), "killed", "true", {"--wait", "7s"}, 0, nullptr});
  t.push_back({at(0.95), "killed", "true", {}, kSkipCode, nullptr});
  std::ranges::stable_sort(t, {}, &Trigger::when);

  std::jthread killer([&] {
    std::this_thread::sleep_until(at(0.3));  // the schedule of the fault, not a wait for a result
    for (auto& x : t)
      if (x.name == "killed" && x.expect == -1 && x.process) ::kill(x.process->pid(), SIGKILL);
  });
  for (auto& x : t) {
    std::this_thread::sleep_until(x.when);  // the schedule itself
    x.process = start(slot_args(x.name, x.body, x.extra));
  }
  killer.join();
  for (auto& x : t) {
    auto code = x.process->wait_for_exit(40s);
    ASSERT_TRUE(code) << x.name << " did not end";
    if (x.expect >= 0) {
      EXPECT_EQ(*code, x.expect) << x.name << " fired " << duration_cast<milliseconds>(x.when - steady_s).count()
                                 << " ms into slot k: " << x.process->result();
    }
  }
  // What ran, per lock: the slot each run was told, in order.
  std::map<std::string, std::vector<long long>> slots;
  for (const auto& l : split_lines(read_file(file("runs.log")).value_or(""))) {
    std::istringstream in(l);
    std::string name;
    long long slot = 0, token = 0;
    in >> name >> slot >> token;
    ASSERT_TRUE(in) << "malformed line: " << l;
    slots[name].push_back(slot);
  }
  using V = std::vector<long long>;
  EXPECT_EQ(slots["late"], (V{slot_k, slot_k1}));
  EXPECT_EQ(slots["long"], (V{slot_k, slot_k1}));
  EXPECT_EQ(slots["failed"], (V{slot_k}));  // the run that failed logged nothing (exit 3 first)
  auto old = slots["old"];
  std::ranges::sort(old);
  EXPECT_EQ(old, (V{slot_k, slot_k1}));
  EXPECT_EQ(slots["killed"], (V{slot_k}));
  // The triggers that ended without running are counted per slot (history --all), where the backend
  // records them (one Redis server, Sentinel).
  if (setup() == SetupId::redis || setup() == SetupId::sentinel) {
    auto long_all = admin({"history", "--all", "--utc", "long"});
    EXPECT_NE(long_all.out.find("triggers of " + rfc3339_utc(slot_k) + ": 2 skipped, 0 busy, the last on "), std::string::npos)
        << long_all;
    auto late_all = admin({"history", "--all", "--utc", "late"});
    EXPECT_NE(late_all.out.find("triggers of " + rfc3339_utc(slot_k1) + ": 2 skipped, 0 busy, the last on "), std::string::npos)
        << late_all;
  }
  // The record says the same: the failed run and the success of slot k.
  auto h = admin({"history", "--json", "failed"});
  auto j = parse_json(h.out);
  ASSERT_TRUE(j && j->kind == Json::Kind::Array) << h;
  ASSERT_EQ(j->items.size(), 2u) << h;
  EXPECT_EQ(field(j->items[0], "outcome"), "ok") << h;
  EXPECT_EQ(field(j->items[1], "outcome"), "failed") << h;
}

// Triggers of one lock share one rule: another --every, --slot-offset, --min-interval or
// --records-ttl is refused (64) naming both; the stored rule's own triggers go on.
TEST_P(Slots, AnotherRuleIsRefusedNamingBoth) {
  if (!caps().every) GTEST_SKIP() << to_string(setup()) << " refuses --every (the test above checks that)";
  ASSERT_EQ(run(sh_args("rule", "true", {"--every", "1h"})).exit_code, 0);
  for (const std::vector<std::string>& other :
       {std::vector<std::string>{"--every", "30m"}, {"--every", "1h", "--slot-offset", "5m"}, {"--min-interval", "50m"},
        {"--every", "1h", "--records-ttl", "48h"}}) {
    auto r = run(sh_args("rule", "echo ran", other));
    EXPECT_EQ(r.exit_code, 64) << r;
    EXPECT_EQ(r.out, "") << r;
    EXPECT_NE(r.err.find("runs with --every 1h --records-ttl 720h; this run asks for "), std::string::npos) << r;
  }
  // The lock's own rule still works (skipped: this hour already ran), and a plain run is not judged.
  EXPECT_EQ(run(sh_args("rule", "echo ran", {"--every", "1h"})).out, "");
  EXPECT_EQ(run(sh_args("rule", "echo ran")).out, "ran\n");
}

// A trigger that finds the lock busy with the run it is for is a skip, not a conflict: --every (the
// run of its slot) and --min-interval (a run that started less than the interval before it fired);
// busy with anything else, or without a rule, it exits 75 as before.
TEST_P(Slots, BusyWithItsOwnRunIsASkip) {
  const std::string skip = std::to_string(kSkipCode);
  for (const std::vector<std::string>& rule :
       {std::vector<std::string>{"--min-interval", "1h"}, std::vector<std::string>{"--every", "1h"}}) {
    if (rule[0] == "--every" && !caps().every) continue;
    const std::string name = "busy" + rule[0].substr(2, 5);
    std::vector<std::string> opts = rule;
    opts.insert(opts.end(), {"--skip-exit-code", skip});
    auto holder = start(sh_args(name, "echo $$ > " + name + ".pid; while [ ! -e " + name + ".go ]; do sleep 0.02; done", opts));
    wait_pid(name + ".pid");
    auto r = run(sh_args(name, "echo ran", opts));
    EXPECT_EQ(r.exit_code, kSkipCode) << rule[0] << ": " << r;
    EXPECT_EQ(r.out, "") << r;
    r = run(sh_args(name, "echo ran"));  // no rule: a conflict
    EXPECT_EQ(r.exit_code, 75) << rule[0] << ": " << r;
    touch(name + ".go");
    EXPECT_EQ(holder->wait_for_exit(20s), 0) << holder->result();
  }
}

// --if-record-lost skip: while NAME's record is missing on the server (never started, or lost with
// the server's data) no trigger runs; one run without the flag starts it. On one Redis server
// restarted without persistence, the slot that already ran is not run a second time by the triggers
// with the flag (those without it run: the record is gone, which the run logs).
TEST_P(Slots, MissingRecordRunsNothingUnderSkip) {
  const std::vector<std::string> skip = {"--every", "1h", "--if-record-lost", "skip", "--skip-exit-code",
                                         std::to_string(kSkipCode)};
  if (!caps().if_record_lost) {
    auto r = run(sh_args("lost", "echo ran", {"--min-interval", "1h", "--if-record-lost", "skip"}));
    EXPECT_EQ(r.exit_code, 64) << r;
    EXPECT_NE(r.err.find("--if-record-lost skip: not supported on"), std::string::npos) << r;
    return;
  }
  // Never started: nothing runs, and the message says how to start it.
  auto r = run(sh_args("lost", "echo ran", skip));
  EXPECT_EQ(r.exit_code, kSkipCode) << r;
  EXPECT_EQ(r.out, "") << r;
  EXPECT_NE(r.err.find("run once without --if-record-lost skip"), std::string::npos) << r;
  // Started by one run without the flag; then the flag's triggers are judged by the record.
  r = run(sh_args("lost", "echo ran", {"-v", "--every", "1h"}));
  EXPECT_EQ(r.out, "ran\n") << r;
  EXPECT_NE(r.err.find("this run starts it"), std::string::npos) << "the first run says it starts the record\n" << r;
  r = run(sh_args("lost", "echo ran", skip));
  EXPECT_EQ(r.exit_code, kSkipCode) << r;
  EXPECT_EQ(r.out, "") << r;
  if (setup() != SetupId::redis) return;
  // The server restarted without its data: the slot is not run again under skip.
  backend_as<RedisBackend>().server().restart();
  r = run(sh_args("lost", "echo ran", skip));
  EXPECT_EQ(r.exit_code, kSkipCode) << r;
  EXPECT_EQ(r.out, "") << r;
  EXPECT_NE(r.err.find("lost with its data"), std::string::npos) << r;
}

INSTANTIATE_TEST_SUITE_P(Contract, Slots, kAllSetups, setup_name);

}  // namespace
}  // namespace fencerun::test::contract
