// --min-interval, --every and the record of runs on etcd (one 3-member cluster for the suite): which
// runs count as a success, a killed run recorded by the next one, what status, status --json, list and
// history show (every field against what the runs did), the records' TTL (nothing left behind), a
// skipped run holding nothing; the rule stored with the record (another one refused), the one-clock
// check against the members' Date (this fencerun's clock moved by an LD_PRELOAD shim), the slot the
// command is told, and the requests of a run. The fleet (one run per period) and the slots (one run
// per slot through late, long, failed, old and killed runs) are in tests/contract, on every setup.
#include <gtest/gtest.h>

#include <csignal>
#include <ctime>

#include "etcd_fixture.hpp"
#include "util/exit_code.hpp"

#ifndef FENCERUN_CLOCK_SHIM
#error "FENCERUN_CLOCK_SHIM must name the clock shim library"
#endif

namespace fencerun::test {
namespace {

class EtcdCronTest : public EtcdSharedTest {
 protected:
  // -r URL OPTIONS... NAME -- sh -c SCRIPT, run to completion.
  RunResult job(const std::string& name, const std::string& script, std::vector<std::string> options = {}) {
    return run(sh_args(name, script, std::move(options)));
  }
  std::vector<Json> history(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"-r", etcd().url(), "history", "--json", name};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run(args);
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == exit_code::k_status_free) << r;
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
  static long long now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  std::string run_key(const std::string& name) { return lock_prefix(name) + "run"; }
  // The environment that moves fencerun's wall clock by `offset_us` (tests/support/clock_shim.c).
  static EnvList clock_offset(long long offset_us) {
    return {{"LD_PRELOAD", FENCERUN_CLOCK_SHIM}, {"FENCERUN_TEST_CLOCK_OFFSET_US", std::to_string(offset_us)}};
  }
};

// The command's exit 1 is no success: the next trigger runs; one after a success is skipped with the
// skip code (0 by default), runs nothing, and holds nothing afterwards.
TEST_F(EtcdCronTest, FailedRunDoesNotCountSuccessDoes) {
  auto failed = job("c-fail", "echo x >> ran; exit 1", {"--min-interval", "1h"});
  ASSERT_EQ(failed.exit_code, 1) << failed;
  auto ok = job("c-fail", "echo x >> ran", {"--min-interval", "1h"});
  ASSERT_EQ(ok.exit_code, 0) << ok;
  auto skipped = job("c-fail", "echo x >> ran", {"--min-interval", "1h", "-v"});
  EXPECT_EQ(skipped.exit_code, 0) << skipped;
  EXPECT_NE(skipped.err.find("skipped: the last success started"), std::string::npos) << skipped;
  EXPECT_NE(skipped.err.find("on " + hostname()), std::string::npos) << skipped;
  auto coded = job("c-fail", "echo x >> ran", {"--min-interval", "1h", "--skip-exit-code", "99"});
  EXPECT_EQ(coded.exit_code, 99) << coded;
  EXPECT_EQ(split_lines(read_file(file("ran")).value_or("")).size(), 2u);  // the failed run and the ok one
  EXPECT_TRUE(nothing_left("c-fail"));
  EXPECT_FALSE(etcd().get(run_key("c-fail")).has_value());
  // Skips are not runs: the record has the two runs only.
  auto h = history("c-fail");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(field(h[0], "outcome"), "ok");
  EXPECT_EQ(field(h[1], "outcome"), "failed");
  EXPECT_EQ(field(h[1], "exit_code"), "1");
}

// A run stopped for the lease (124: its key deleted under it) is no success either.
TEST_F(EtcdCronTest, RunStoppedForTheLeaseDoesNotCount) {
  auto p = start(sh_args("c-stop", "echo $$ > pid; while :; do sleep 0.05; done",
                         {"--ttl", "5s", "--min-interval", "1h"}));
  wait_pid("pid");
  auto keys = waiters("c-stop");
  ASSERT_EQ(keys.size(), 1u);
  etcd().etcdctl_ok({"del", keys[0]});
  auto code = p->wait_for_exit(20s);
  ASSERT_EQ(code, exit_code::k_lease_lost_default) << p->result();
  auto h = history("c-stop");
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(field(h[0], "outcome"), "stopped");
  auto next = job("c-stop", "echo x >> ran", {"--min-interval", "1h", "--skip-exit-code", "99"});
  EXPECT_EQ(next.exit_code, 0) << next;
  EXPECT_TRUE(read_file(file("ran")).has_value());
  EXPECT_TRUE(nothing_left("c-stop"));
}

// A fencerun killed with SIGKILL never releases: the next run of NAME records it as killed, with its
// token, pid, host and start.
TEST_F(EtcdCronTest, KilledRunIsRecordedByTheNextRun) {
  const long long before = now_us();
  auto p = start(sh_args("c-kill", "echo $$ > pid; echo $FENCERUN_TOKEN > token; sleep 1000", {"--ttl", "2s"}));
  wait_pid("pid");
  const std::string token = wait_line("token");
  const pid_t fencerun_pid = p->pid();
  ASSERT_TRUE(etcd().get(run_key("c-kill")).has_value()) << "no run in progress recorded";
  ASSERT_TRUE(p->signal(SIGKILL));
  p->wait_for_exit(10s);
  kill_if_alive(*wait_for_pid_file(file("pid"), 1s));
  // The next run waits for the lease to run out, finds the run still open and records it.
  auto next = job("c-kill", "true", {"--min-interval", "1h", "--wait", "20s"});
  ASSERT_EQ(next.exit_code, 0) << next;
  auto h = history("c-kill");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(field(h[0], "outcome"), "ok");
  EXPECT_EQ(field(h[1], "outcome"), "killed");
  EXPECT_EQ(field(h[1], "token"), token);
  EXPECT_EQ(field(h[1], "pid"), std::to_string(fencerun_pid));
  EXPECT_EQ(field(h[1], "host"), hostname());
  EXPECT_EQ(field(h[1], "end_us"), "null");
  EXPECT_EQ(field(h[1], "exit_code"), "null");
  EXPECT_EQ(field(h[1], "signal"), "null");
  EXPECT_GE(json_int_of(h[1].find("start_us")).value_or(0), before);
  auto status = run({"-r", etcd().url(), "status", "c-kill"});
  EXPECT_NE(status.out.find("last run: ok after "), std::string::npos) << status;
  EXPECT_TRUE(nothing_left("c-kill"));
}

// status, status --json, list and history -n against what three runs did: ok, failed with exit 3,
// ended by SIGTERM.
TEST_F(EtcdCronTest, StatusListAndHistoryShowTheRecords) {
  const auto version_out = run({"--version"}).out;
  const std::string version = trim(split_lines(version_out).at(0).substr(std::string("fencerun ").size()));
  struct Ran {
    RunResult result;
    std::string token;
    long long before_us, after_us;
  };
  std::vector<Ran> runs;
  const std::vector<std::string> scripts = {"echo $FENCERUN_TOKEN > token; sleep 0.3",
                                            "echo $FENCERUN_TOKEN > token; exit 3",
                                            "echo $FENCERUN_TOKEN > token; kill -TERM $$"};
  for (const auto& s : scripts) {
    std::filesystem::remove(file("token"));
    const long long before = now_us();
    auto r = job("c-show", s);
    const long long after = now_us();
    runs.push_back({r, wait_line("token"), before, after});
  }
  ASSERT_EQ(runs[0].result.exit_code, 0) << runs[0].result;
  ASSERT_EQ(runs[1].result.exit_code, 3) << runs[1].result;
  ASSERT_EQ(runs[2].result.exit_code, 128 + SIGTERM) << runs[2].result;

  auto h = history("c-show");
  ASSERT_EQ(h.size(), 3u);
  const std::vector<std::string> outcomes = {"ok", "failed", "failed"};
  const std::vector<std::string> codes = {"0", "3", "null"};
  const std::vector<std::string> signals = {"null", "null", std::to_string(SIGTERM)};
  for (std::size_t i = 0; i < 3; ++i) {
    const Json& rec = h[2 - i];  // newest first
    const Ran& ran = runs[i];
    SCOPED_TRACE("run " + std::to_string(i));
    EXPECT_EQ(field(rec, "outcome"), outcomes[i]);
    EXPECT_EQ(field(rec, "exit_code"), codes[i]);
    EXPECT_EQ(field(rec, "signal"), signals[i]);
    EXPECT_EQ(field(rec, "token"), ran.token);
    EXPECT_EQ(field(rec, "pid"), std::to_string(ran.result.pid));
    EXPECT_EQ(field(rec, "host"), hostname());
    EXPECT_EQ(field(rec, "version"), version);
    const long long start = json_int_of(rec.find("start_us")).value_or(0);
    const long long end = json_int_of(rec.find("end_us")).value_or(0);
    EXPECT_LE(ran.before_us, start);
    EXPECT_LE(start, end);
    EXPECT_LE(end, ran.after_us);
    EXPECT_EQ(json_int_of(rec.find("duration_ms")).value_or(-1), (end - start) / 1000);
  }
  EXPECT_GE(json_int_of(h[2].find("duration_ms")).value_or(0), 300);  // the first run slept 0.3 s

  // -n 2: the newest two.
  auto two = history("c-show", {"-n", "2"});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(field(two[0], "token"), runs[2].token);
  EXPECT_EQ(field(two[1], "token"), runs[1].token);
  // history in text: one line per run, newest first.
  auto text = run({"-r", etcd().url(), "history", "c-show"});
  ASSERT_EQ(text.exit_code, 0) << text;
  // history's line: "START to END (DURATION) OUTCOME on ...", ISO 8601 times with the zone's offset.
  auto history_line = [](const std::string& l, const std::string& what) {
    return l.size() > 25 && l[4] == '-' && l[10] == 'T' && l.find(" to ") == 25 && l.find(") " + what + " on ") != std::string::npos;
  };
  auto lines = split_lines(text.out);
  ASSERT_EQ(lines.size(), 3u) << text;
  EXPECT_TRUE(history_line(lines[0], "failed (signal 15)")) << lines[0];
  EXPECT_NE(lines[0].find(" on " + hostname() + ", pid " + std::to_string(runs[2].result.pid) + ", token " +
                          runs[2].token),
            std::string::npos)
      << lines[0];
  EXPECT_TRUE(history_line(lines[1], "failed (exit 3)")) << lines[1];
  EXPECT_TRUE(history_line(lines[2], "ok")) << lines[2];

  // status: the last run and the last success.
  auto status = run({"-r", etcd().url(), "status", "c-show"});
  EXPECT_EQ(status.exit_code, exit_code::k_status_free) << status;
  EXPECT_NE(status.out.find("last run: failed (signal 15) after "), std::string::npos) << status;
  EXPECT_NE(status.out.find("last success: ok after "), std::string::npos) << status;
  EXPECT_NE(status.out.find(", token " + runs[0].token + "\n"), std::string::npos) << status;
  auto sj = run({"-r", etcd().url(), "status", "--json", "c-show"});
  auto j = parse_json(sj.out);
  ASSERT_TRUE(j) << sj;
  ASSERT_TRUE(j->find("last_run") && j->find("last_success")) << sj;
  EXPECT_EQ(field(*j->find("last_run"), "token"), runs[2].token);
  EXPECT_EQ(field(*j->find("last_run"), "signal"), std::to_string(SIGTERM));
  EXPECT_EQ(field(*j->find("last_run"), "pid"), std::to_string(runs[2].result.pid));
  EXPECT_EQ(field(*j->find("last_run"), "host"), hostname());
  EXPECT_EQ(field(*j->find("last_success"), "token"), runs[0].token);
  EXPECT_EQ(field(*j->find("last_success"), "outcome"), "ok");
  EXPECT_EQ(field(*j->find("last_success"), "exit_code"), "0");
  EXPECT_EQ(field(*j->find("last_success"), "start_us"), field(h[2], "start_us"));

  // list: the last run's outcome and age; the record keys are no locks of their own.
  auto list = run({"-r", etcd().url(), "list", "--all", "c-show*"});
  EXPECT_EQ(list.exit_code, exit_code::k_status_free) << list;
  ASSERT_EQ(split_lines(list.out).size(), 1u) << list;
  EXPECT_TRUE(list.out.starts_with("c-show: free, last token none, last run failed ")) << list;
  EXPECT_EQ(run({"-r", etcd().url(), "list", "c-show*"}).exit_code, exit_code::k_status_free);
  auto lr = run({"-r", etcd().url(), "list", "--all", "--json", "c-show*"});
  auto lj = parse_json(lr.out);
  ASSERT_TRUE(lj && lj->items.size() == 1) << lr;
  EXPECT_EQ(field(*lj->items[0].find("last_run"), "token"), runs[2].token);
  EXPECT_EQ(field(*lj->items[0].find("last_success"), "token"), runs[0].token);

  // While a run holds the lock, list shows it held, with the last run recorded.
  auto holder = start(sh_args("c-show", "echo $$ > hpid; while [ ! -e go ]; do sleep 0.02; done", {"--ttl", "10s"}));
  wait_pid("hpid");
  auto held = run({"-r", etcd().url(), "list", "c-show*"});
  EXPECT_EQ(held.exit_code, 0) << held;
  EXPECT_NE(held.out.find("c-show: held by pid " + std::to_string(holder->pid())), std::string::npos) << held;
  EXPECT_NE(held.out.find(", last run failed "), std::string::npos) << held;
  touch("go");
  ASSERT_EQ(holder->wait_for_exit(20s), 0) << holder->result();

  // --keep-runs 2: the record keeps the newest two.
  ASSERT_EQ(job("c-show", "true", {"--keep-runs", "2"}).exit_code, 0);
  EXPECT_EQ(history("c-show").size(), 2u);
  EXPECT_TRUE(nothing_left("c-show"));
}

// A NAME unused for longer than the records' TTL leaves no record behind: only its base and the record's
// marker stay (as the token counter and the marker do on Redis), and no lease. A run with another --records-ttl moves the record onto a
// lease of its TTL and revokes the old one; runs with the same TTL reuse the lease.
TEST_F(EtcdCronTest, RecordsExpire) {
  // The leases that carry keys of c-ttl.
  auto record_leases = [&] {
    std::vector<std::string> out;
    for (const auto& id : etcd().leases()) {
      auto keys = lease_keys(id);
      if (keys && std::ranges::any_of(*keys, [&](const std::string& k) { return k.starts_with(lock_prefix("c-ttl")); }))
        out.push_back(id);
    }
    return out;
  };
  ASSERT_EQ(job("c-ttl", "true", {"--min-interval", "3s"}).exit_code, 0);  // the default TTL, 720h
  ASSERT_EQ(record_leases().size(), 1u);
  const std::string long_lease = record_leases().front();
  // The records' lease has NAME's own id (the same on every host), one per TTL.
  EXPECT_EQ(bare_hex(long_lease), records_lease("c-ttl", 720 * 3600));
  ASSERT_EQ(job("c-ttl", "exit 2", {"--records-ttl", "3s"}).exit_code, 2);
  ASSERT_EQ(job("c-ttl", "true", {"--records-ttl", "3s"}).exit_code, 0);
  // The first run's rule (--min-interval) went with the record onto its new lease.
  const auto keys = etcd().keys(lock_prefix("c-ttl"));
  EXPECT_EQ(keys, (std::vector<std::string>{base_key("c-ttl"), lock_prefix("c-ttl") + "ok",
                                            lock_prefix("c-ttl") + "rule", lock_prefix("c-ttl") + "runs",
                                            lock_prefix("c-ttl") + "since"}));
  // One lease carries the record, not the 720h one (revoked, not left to run out).
  const auto now = record_leases();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now.front(), long_lease);
  EXPECT_EQ(bare_hex(now.front()), records_lease("c-ttl", 3));
  EXPECT_FALSE(lease_keys(long_lease).has_value()) << "the 720h lease was not revoked";
  EXPECT_EQ(history("c-ttl").size(), 3u);
  std::vector<std::string> left;
  EXPECT_TRUE(wait_until(
      [&] {
        left = etcd().keys(lock_prefix("c-ttl"));
        return left.size() == 2;
      },
      15s, 100ms));
  // The record's marker stays with the base (no lease): the record was started, then it expired.
  EXPECT_EQ(left, (std::vector<std::string>{base_key("c-ttl"), lock_prefix("c-ttl") + "since"}));
  EXPECT_TRUE(nothing_left("c-ttl", 5s));
  auto h = run({"-r", etcd().url(), "history", "c-ttl"});
  EXPECT_EQ(h.exit_code, exit_code::k_status_free) << h;
  EXPECT_EQ(h.out, "c-ttl: no runs recorded\n");
}

// A skipped run holds nothing: its lease is revoked at once (no lease left), and a run that does not
// wait acquires right after it.
TEST_F(EtcdCronTest, SkippedRunLeavesNothingHeld) {
  ASSERT_EQ(job("c-skip", "true", {"--min-interval", "1h"}).exit_code, 0);
  auto skipped = job("c-skip", "echo x >> ran", {"--min-interval", "1h", "--skip-exit-code", "7"});
  EXPECT_EQ(skipped.exit_code, 7) << skipped;
  EXPECT_TRUE(waiters("c-skip").empty());
  EXPECT_TRUE(run_leases().empty()) << "the skipped run's lease was not revoked";
  auto next = job("c-skip", "echo y >> ran", {"--wait", "0"});
  EXPECT_EQ(next.exit_code, 0) << next;
  EXPECT_EQ(read_file(file("ran")).value_or(""), "y\n");
  EXPECT_FALSE(etcd().get(run_key("c-skip")).has_value());
  EXPECT_TRUE(waiters("c-skip").empty());
  // The metrics file has the recorded last success's start when the run is skipped.
  auto h = history("c-skip");
  ASSERT_EQ(h.size(), 2u);
  const std::string start = field(h[0], "start_us");  // the last success: the run that did not wait
  ASSERT_GT(start.size(), 6u);
  ASSERT_EQ(job("c-skip", "true", {"--min-interval", "1h", "--skip-exit-code", "7", "--metrics-file", "m.prom"})
                .exit_code,
            7);
  EXPECT_NE(read_file(file("m.prom"))
                .value_or("")
                .find("fencerun_last_success_timestamp_seconds{lock=\"c-skip\"} " + start.substr(0, start.size() - 6) +
                      "." + start.substr(start.size() - 6) + "\n"),
            std::string::npos)
      << read_file(file("m.prom")).value_or("");
}

// The records' lease revoked under a run (as if it had run out between a keep-alive and a write): the
// record goes with it, and the run's release writes its record on a new lease all the same.
TEST_F(EtcdCronTest, RecordsLeaseGoneUnderARun) {
  ASSERT_EQ(job("c-gone", "true").exit_code, 0);
  auto holder = start(sh_args("c-gone", "echo $FENCERUN_TOKEN > token; while [ ! -e go ]; do sleep 0.02; done",
                              {"--ttl", "10s"}));
  const std::string token = wait_line("token");
  std::string records_lease;
  for (const auto& id : etcd().leases()) {
    auto keys = lease_keys(id);
    if (keys && std::ranges::find(*keys, lock_prefix("c-gone") + "runs") != keys->end()) records_lease = id;
  }
  ASSERT_FALSE(records_lease.empty()) << "no lease carries the record";
  etcd().etcdctl_ok({"lease", "revoke", records_lease});
  ASSERT_FALSE(etcd().get(lock_prefix("c-gone") + "runs").has_value());
  touch("go");
  ASSERT_EQ(holder->wait_for_exit(20s), 0) << holder->result();
  auto h = history("c-gone");
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(field(h[0], "outcome"), "ok");
  EXPECT_EQ(field(h[0], "token"), token);
  EXPECT_EQ(holder->result().err.find("record_failed"), std::string::npos) << holder->result();
  EXPECT_TRUE(nothing_left("c-gone"));
  // The next run with --min-interval sees that success.
  EXPECT_EQ(job("c-gone", "echo x > ran", {"--min-interval", "1h", "--skip-exit-code", "9"}).exit_code, 9);
}

// The rule of --every / --min-interval is stored with the record (":rule", on the records' lease): a
// trigger with another rule is refused (64) naming both, at once even while the lock is held (it does
// not wait), runs nothing and holds nothing; the rule stays as it was.
TEST_F(EtcdCronTest, AnotherRuleIsRefusedNamingBoth) {
  ASSERT_EQ(job("c-rule", "true", {"--every", "1h"}).exit_code, 0);
  const std::string rule_key = lock_prefix("c-rule") + "rule";
  ASSERT_EQ(etcd().get(rule_key).value_or("<none>"), "every 3600000 0 2592000000");
  auto on_lease = lease_keys(records_lease("c-rule", 720 * 3600));
  ASSERT_TRUE(on_lease.has_value()) << "no records' lease";
  EXPECT_NE(std::ranges::find(*on_lease, rule_key), on_lease->end()) << "the rule is not on the records' lease";

  auto other = job("c-rule", "echo x >> ran", {"--min-interval", "30m", "--log-format", "json"});
  EXPECT_EQ(other.exit_code, exit_code::k_usage) << other;
  EXPECT_NE(other.err.find("lock 'c-rule' runs with --every 1h --records-ttl 720h; this run asks for "
                           "--min-interval 30m --records-ttl 720h (all triggers of a lock must use the same rule)"),
            std::string::npos)
      << other;
  EXPECT_NE(other.err.find("\"event\":\"rule_mismatch\""), std::string::npos) << other;
  EXPECT_NE(other.err.find("\"held_rule\":\"every 3600000 0 2592000000\""), std::string::npos) << other;

  // While a run of the lock's own rule holds it (a success of this hour is recorded, so a run without
  // a rule holds it here), another rule is refused at once, without waiting.
  auto holder = start(sh_args("c-rule", "echo $$ > pid; while [ ! -e go ]; do sleep 0.02; done", {"--ttl", "10s"}));
  wait_pid("pid");
  auto waiting = job("c-rule", "echo x >> ran", {"--every", "30m", "--wait", "20s"});
  EXPECT_EQ(waiting.exit_code, exit_code::k_usage) << waiting;
  EXPECT_LT(waiting.elapsed, 10s) << waiting;
  EXPECT_NE(waiting.err.find("runs with --every 1h --records-ttl 720h; this run asks for --every 30m "
                             "--records-ttl 720h"),
            std::string::npos)
      << waiting;
  touch("go");
  ASSERT_EQ(holder->wait_for_exit(20s), 0) << holder->result();
  EXPECT_FALSE(read_file(file("ran")).has_value());
  EXPECT_EQ(etcd().get(rule_key).value_or("<none>"), "every 3600000 0 2592000000");
  // The lock's own rule goes on: this hour ran already.
  auto same = job("c-rule", "echo x >> ran", {"--every", "1h", "--skip-exit-code", "9"});
  EXPECT_EQ(same.exit_code, 9) << same;
  EXPECT_TRUE(nothing_left("c-rule"));
}

// status shows the rule stored with the record and this slot's state, on this host's clock (the one the
// records' times are on): after a success of this hour, the slot succeeded and the next one is the
// next hour.
TEST_F(EtcdCronTest, StatusShowsTheRule) {
  const long long hour_before = now_us() / 3'600'000'000LL;
  ASSERT_EQ(job("c-status", "true", {"--every", "1h"}).exit_code, 0);
  auto s = run({"status", "-r", etcd().url(), "c-status"});
  auto sj = run({"status", "-r", etcd().url(), "c-status", "--json"});
  if (now_us() / 3'600'000'000LL != hour_before) GTEST_SKIP() << "the hour turned during the test";
  EXPECT_EQ(s.exit_code, exit_code::k_status_free) << s;
  EXPECT_NE(s.out.find("rule: --every 1h --records-ttl 720h\n"), std::string::npos) << s;
  EXPECT_NE(s.out.find("slot: " + rfc3339_utc(hour_before * 3600) + ", succeeded; next slot " +
                       rfc3339_utc((hour_before + 1) * 3600) + "\n"),
            std::string::npos)
      << s;
  auto doc = parse_json(sj.out);
  ASSERT_TRUE(doc && doc->kind == Json::Kind::Object) << sj;
  EXPECT_EQ(doc->find("rule") ? doc->find("rule")->as_string() : std::nullopt,
            std::optional<std::string>("--every 1h --records-ttl 720h"))
      << sj.out;
  EXPECT_TRUE(doc->find("done") && doc->find("done")->is_true()) << sj.out;
  EXPECT_EQ(field(*doc, "slot_start_us"), std::to_string(hour_before * 3'600'000'000LL)) << sj.out;
}

// --every and --min-interval judge by this host's clock against the ones that wrote the record: a host
// whose clock is more than 2 s from the etcd member's (the Date of the grant's reply) is refused (69)
// before it takes anything: no key, no lease, nothing run. A plain run is not checked; a second off is
// within the bound.
TEST_F(EtcdCronTest, HostClockSkewedFromTheMembersIsRefused) {
  struct Case {
    long long offset_us;
    std::vector<std::string> rule;
    std::string said;
  };
  const std::vector<Case> cases = {
      {60'000'000, {"--every", "1h"}, "s clock is 60s ahead of etcd member 127.0.0.1:"},
      {-60'000'000, {"--every", "1h"}, "s clock is 60s behind etcd member 127.0.0.1:"},
      {-5'000'000, {"--min-interval", "30m"}, "s clock is 5s behind etcd member 127.0.0.1:"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.said);
    std::vector<std::string> options = c.rule;
    options.insert(options.end(), {"--log-format", "json"});
    auto r = run(sh_args("c-skew", "echo x >> ran", options), clock_offset(c.offset_us));
    EXPECT_EQ(r.exit_code, exit_code::k_unavailable) << r;
    EXPECT_NE(r.err.find(c.said), std::string::npos) << r;
    EXPECT_NE(r.err.find(" (clock skew?): " + c.rule[0] + " needs clocks within 2s"), std::string::npos) << r;
    EXPECT_NE(r.err.find("\"event\":\"clock_skew\""), std::string::npos) << r;
    EXPECT_EQ(r.err.find("\"event\":\"acquired\""), std::string::npos) << r;
  }
  EXPECT_FALSE(read_file(file("ran")).has_value());
  EXPECT_TRUE(etcd().keys(lock_prefix("c-skew")).empty()) << "a refused trigger wrote to etcd";
  EXPECT_TRUE(nothing_left("c-skew"));
  // Within the bound: runs (and writes the rule).
  auto near = run(sh_args("c-skew", "echo near >> ran", {"--every", "1h"}), clock_offset(1'000'000));
  EXPECT_EQ(near.exit_code, 0) << near;
  // Without a rule nothing judges by the clock: runs whatever it says.
  auto plain = run(sh_args("c-skew-plain", "echo plain >> ran"), clock_offset(3'600'000'000LL));
  EXPECT_EQ(plain.exit_code, 0) << plain;
  EXPECT_EQ(read_file(file("ran")).value_or(""), "near\nplain\n");
  EXPECT_TRUE(nothing_left("c-skew"));
}

// The command is told the start of the slot its trigger fired in (FENCERUN_SLOT_START in RFC 3339 UTC,
// FENCERUN_SLOT_START_UNIX), with --slot-offset; the run's record carries the trigger's fire time.
// Without --every neither variable is set.
TEST_F(EtcdCronTest, CommandIsToldItsSlotStart) {
  const long long before = now_us();
  auto r = job("c-slot", "echo \"$FENCERUN_SLOT_START $FENCERUN_SLOT_START_UNIX\"",
               {"--every", "1m", "--slot-offset", "7s"});
  const long long after = now_us();
  ASSERT_EQ(r.exit_code, 0) << r;
  // The slot of a time t (Unix seconds): [60k + 7, 60(k + 1) + 7).
  const auto slot_of = [](long long us) { return (us / 1'000'000 - 7) / 60 * 60 + 7; };
  const long long s = slot_of(before);
  const long long e = slot_of(after);  // the same unless the minute turned during the run
  const std::string told = trim(r.out);
  EXPECT_TRUE(told == rfc3339_utc(s) + " " + std::to_string(s) || told == rfc3339_utc(e) + " " + std::to_string(e))
      << told << " (expected " << rfc3339_utc(s) << " " << s << ")";
  auto h = history("c-slot");
  ASSERT_EQ(h.size(), 1u);
  const long long fired = json_int_of(h[0].find("fired_us")).value_or(0);
  EXPECT_LE(before, fired);
  EXPECT_LE(fired, json_int_of(h[0].find("start_us")).value_or(0));
  EXPECT_EQ(std::to_string(slot_of(fired)), told.substr(told.find(' ') + 1));

  auto plain = job("c-slot-plain", "echo \"${FENCERUN_SLOT_START-unset} ${FENCERUN_SLOT_START_UNIX-unset}\"");
  ASSERT_EQ(plain.exit_code, 0) << plain;
  EXPECT_EQ(plain.out, "unset unset\n");
  EXPECT_TRUE(nothing_left("c-slot"));
}

// An uncontended run with --every makes five requests, as one with --min-interval (the check needs the
// record read before `run` is put, so the commit is a transaction of its own): grant (whose reply's
// Date the clock check reads), queue-and-read, the commit with the check, the record, revoke. A plain
// run makes four. Runs that fail, so that every trigger of the slot runs.
TEST_F(EtcdCronTest, UncontendedEveryRunMakesFiveRequests) {
  const EnvList cache = {{"XDG_CACHE_HOME", file("cache").string()}};
  // Warm: each NAME's base and the records' lease, the cluster's version in the cache.
  ASSERT_EQ(run(sh_args("c-count", "exit 3", {"--every", "1h"}), cache).exit_code, 3);
  ASSERT_EQ(run(sh_args("c-count-interval", "exit 3", {"--min-interval", "1h"}), cache).exit_code, 3);
  ASSERT_EQ(run(sh_args("c-count-plain", "exit 3"), cache).exit_code, 3);
  constexpr int k_runs = 10;
  const auto count = [&](const std::string& name, std::vector<std::string> options) {
    const auto before = handled_requests(etcd());
    for (int i = 0; i < k_runs; ++i) {
      auto r = run(sh_args(name, "exit 3", options), cache);
      EXPECT_EQ(r.exit_code, 3) << r;
    }
    std::string by_method;
    const long long used = requests_between(before, handled_requests(etcd()), by_method);
    std::cout << name << ": " << used << " requests for " << k_runs << " runs (" << by_method << " )\n";
    return used;
  };
  const long long every = count("c-count", {"--every", "1h"});
  const long long interval = count("c-count-interval", {"--min-interval", "1h"});
  const long long plain = count("c-count-plain", {});
  EXPECT_LE(every, 5 * k_runs);
  EXPECT_LE(every, interval);
  EXPECT_LE(plain, 4 * k_runs);
}

// A member killed while a run holds (the first of the URL, the one a run talks to first, or the
// leader): the record's reads and writes at its release go to another member, after the election
// when it was the leader (--timeout 3s leaves the time for one), and the record is whole (one record
// per run, none twice, `run` gone, `ok` this run's).
class EtcdCronChaosTest : public EtcdOwnTest {
 protected:
  std::vector<Json> history(const std::string& name) {
    auto r = run({"-r", etcd().url(), "history", "--json", name});
    auto j = parse_json(r.out);
    if (!j || j->kind != Json::Kind::Array) {
      ADD_FAILURE() << "history --json is not an array: " << r;
      return {};
    }
    return j->items;
  }

  void record_written_through_another_member(bool leader) {
  ASSERT_EQ(run(sh_args("c-member", "true")).exit_code, 0);
  auto holder = start(sh_args("c-member", "echo $FENCERUN_TOKEN > token; while [ ! -e go ]; do sleep 0.02; done",
                              {"--ttl", "10s", "--timeout", "3s"}));
  const std::string token = wait_line("token");
  const int victim = leader ? etcd().leader() : 0;
  ASSERT_GE(victim, 0);
  etcd().kill(victim);
  touch("go");
  ASSERT_EQ(holder->wait_for_exit(30s), 0) << holder->result();
  auto h = history("c-member");
  ASSERT_EQ(h.size(), 2u) << holder->result();
  const Json* t0 = h[0].find("token");
  ASSERT_NE(t0, nullptr);
  EXPECT_EQ(t0->text, token);
  EXPECT_EQ(h[0].find("outcome")->text, "ok");
  EXPECT_NE(h[1].find("token")->text, token);
  EXPECT_FALSE(etcd().get(lock_prefix("c-member") + "run").has_value());
  auto ok = etcd().get(lock_prefix("c-member") + "ok");
  ASSERT_TRUE(ok.has_value());
  EXPECT_NE(ok->find(" ok 0 - " + token + " "), std::string::npos) << *ok;
  EXPECT_EQ(run(sh_args("c-member", "true", {"--min-interval", "1h", "--skip-exit-code", "9"})).exit_code, 9);
  EXPECT_TRUE(nothing_left("c-member", 10s));
  }
};

TEST_F(EtcdCronChaosTest, RecordWrittenThroughAnotherMember) { record_written_through_another_member(false); }
TEST_F(EtcdCronChaosTest, RecordWrittenAfterTheLeaderWasKilled) { record_written_through_another_member(true); }

}  // namespace
}  // namespace fencerun::test
