// --min-interval and the record of runs on etcd (one 3-member cluster for the suite): which runs count
// as a success, a killed run recorded by the next one, what status, status --json, list and history
// show (every field against what the runs did), the records' TTL (nothing left behind), a skipped run
// holding nothing. The fleet (one run per period) is in tests/contract, on every backend setup.
#include <gtest/gtest.h>

#include <csignal>

#include "etcd_fixture.hpp"
#include "util/exit_code.hpp"

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

// A NAME unused for longer than the records' TTL leaves no record behind: only its base stays (as the
// token counter does on Redis), and no lease. A run with another --records-ttl moves the record onto a
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
  const auto keys = etcd().keys(lock_prefix("c-ttl"));
  EXPECT_EQ(keys, (std::vector<std::string>{base_key("c-ttl"), lock_prefix("c-ttl") + "ok",
                                            lock_prefix("c-ttl") + "runs"}));
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
        return left.size() == 1;
      },
      15s, 100ms));
  EXPECT_EQ(left, std::vector<std::string>{base_key("c-ttl")});
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
