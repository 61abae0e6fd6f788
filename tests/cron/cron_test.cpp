// --min-interval and the record of runs on one server: which runs count as a success, the record of a
// killed run, what status, status --json, list and history show (every field against what the runs
// did), the records' TTL, and bad input.
#include <algorithm>
#include <csignal>
#include <sstream>
#include <string>
#include <vector>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

class CronTest : public FencerunTest {
 protected:
  // -r URL OPTIONS... NAME -- sh -c SCRIPT, run to completion.
  RunResult job(const std::string& script, std::vector<std::string> options = {}, const std::string& name = "job") {
    return run(sh_args(name, script, std::move(options)));
  }
  std::vector<Json> history(const std::string& name = "job", std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"-r", redis().url(), "history", "--json", name};
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
  std::string field(const Json& j, std::string_view key) {
    const Json* f = j.find(key);
    if (!f) return "<missing>";
    if (f->kind == Json::Kind::Null) return "null";
    return f->text;
  }
};

// The command's exit 1 is no success: the next trigger runs; one after a success is skipped with the
// skip code (0 by default), runs nothing, and holds nothing afterwards.
TEST_F(CronTest, FailedRunDoesNotCountSuccessDoes) {
  auto failed = job("echo x >> ran; exit 1", {"--min-interval", "1h"});
  ASSERT_EQ(failed.exit_code, 1) << failed;
  auto ok = job("echo x >> ran", {"--min-interval", "1h"});
  ASSERT_EQ(ok.exit_code, 0) << ok;
  auto skipped = job("echo x >> ran", {"--min-interval", "1h", "-v"});
  EXPECT_EQ(skipped.exit_code, 0) << skipped;
  EXPECT_NE(skipped.err.find("skipped: the last success started"), std::string::npos) << skipped;
  EXPECT_NE(skipped.err.find("on " + hostname()), std::string::npos) << skipped;
  auto coded = job("echo x >> ran", {"--min-interval", "1h", "--skip-exit-code", "99"});
  EXPECT_EQ(coded.exit_code, 99) << coded;
  EXPECT_EQ(split_lines(read_file(file("ran")).value_or("")).size(), 2u);  // the failed run and the ok one
  EXPECT_FALSE(redis().exists("fencerun:{job}:lock"));
  EXPECT_FALSE(redis().exists("fencerun:{job}:run"));
  // Skips are not runs: the record has the two runs only.
  auto h = history();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(field(h[0], "outcome"), "ok");
  EXPECT_EQ(field(h[1], "outcome"), "failed");
  EXPECT_EQ(field(h[1], "exit_code"), "1");
}

// A run stopped for the lease (124) is no success either.
TEST_F(CronTest, RunStoppedForTheLeaseDoesNotCount) {
  auto p = start(sh_args("job", "echo $$ > pid; while :; do sleep 0.05; done", {"--ttl", "3s", "--min-interval", "1h"}));
  wait_pid("pid");
  ASSERT_EQ(redis().cmd({"DEL", "fencerun:{job}:lock"}).integer, 1);
  auto code = p->wait_for_exit(20s);
  ASSERT_EQ(code, 124) << p->result();
  auto h = history();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(field(h[0], "outcome"), "stopped");
  auto next = job("echo x >> ran", {"--min-interval", "1h", "--skip-exit-code", "99"});
  EXPECT_EQ(next.exit_code, 0) << next;
  EXPECT_TRUE(read_file(file("ran")).has_value());
}

// A fencerun killed with SIGKILL never releases: the next run of NAME records it as killed, with its
// token, pid, host and start.
TEST_F(CronTest, KilledRunIsRecordedByTheNextRun) {
  auto p = start(sh_args("job", "echo $$ > pid; echo $FENCERUN_TOKEN > token; sleep 1000", {"--ttl", "2s"}));
  wait_pid("pid");
  const std::string token = wait_line("token");
  const pid_t fencerun_pid = p->pid();
  ASSERT_TRUE(p->signal(SIGKILL));
  p->wait_for_exit(10s);
  kill_if_alive(*wait_for_pid_file(file("pid"), 1s));
  // The lease runs out; the next run finds the run still open and records it.
  ASSERT_TRUE(wait_until([&] { return !redis().exists("fencerun:{job}:lock"); }, 10s));
  auto next = job("true", {"--min-interval", "1h"});
  ASSERT_EQ(next.exit_code, 0) << next;
  auto h = history();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(field(h[0], "outcome"), "ok");
  EXPECT_EQ(field(h[1], "outcome"), "killed");
  EXPECT_EQ(field(h[1], "token"), token);
  EXPECT_EQ(field(h[1], "pid"), std::to_string(fencerun_pid));
  EXPECT_EQ(field(h[1], "host"), hostname());
  EXPECT_EQ(field(h[1], "end_us"), "null");
  EXPECT_EQ(field(h[1], "exit_code"), "null");
  auto status = run({"-r", redis().url(), "status", "job"});
  EXPECT_NE(status.out.find("last run: ok after "), std::string::npos) << status;
}

// status, status --json, list and history -n against what three runs did: ok, failed with exit 3,
// ended by SIGTERM.
TEST_F(CronTest, StatusListAndHistoryShowTheRecords) {
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
    const long long before = redis().time_us();
    auto r = job(s);
    const long long after = redis().time_us();
    runs.push_back({r, wait_line("token"), before, after});
  }
  ASSERT_EQ(runs[0].result.exit_code, 0) << runs[0].result;
  ASSERT_EQ(runs[1].result.exit_code, 3) << runs[1].result;
  ASSERT_EQ(runs[2].result.exit_code, 128 + SIGTERM) << runs[2].result;

  auto h = history();
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
    const long long start = json_int(rec.find("start_us")).value_or(0), end = json_int(rec.find("end_us")).value_or(0);
    EXPECT_LE(ran.before_us, start);
    EXPECT_LE(start, end);
    EXPECT_LE(end, ran.after_us);
    EXPECT_EQ(json_int(rec.find("duration_ms")).value_or(-1), (end - start) / 1000);
  }
  EXPECT_GE(json_int(h[2].find("duration_ms")).value_or(0), 300);  // the first run slept 0.3 s

  // -n 2: the newest two.
  auto two = history("job", {"-n", "2"});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(field(two[0], "token"), runs[2].token);
  EXPECT_EQ(field(two[1], "token"), runs[1].token);
  // history in text: one line per run, newest first.
  auto text = run({"-r", redis().url(), "history", "job"});
  ASSERT_EQ(text.exit_code, 0) << text;
  // history's line: "START to END (DURATION) OUTCOME on ...", ISO 8601 times with the zone's offset.
  auto history_line = [](const std::string& l, const std::string& what) {
    return l.size() > 25 && l[4] == '-' && l[10] == 'T' && l.find(" to ") == 25 && l.find(") " + what + " on ") != std::string::npos;
  };
  auto lines = split_lines(text.out);
  ASSERT_EQ(lines.size(), 3u) << text;
  EXPECT_TRUE(history_line(lines[0], "failed (signal 15)")) << lines[0];
  EXPECT_NE(lines[0].find(" on " + hostname() + ", pid " + std::to_string(runs[2].result.pid) + ", token " + runs[2].token),
            std::string::npos) << lines[0];
  EXPECT_TRUE(history_line(lines[1], "failed (exit 3)")) << lines[1];
  EXPECT_TRUE(history_line(lines[2], "ok")) << lines[2];

  // status: the last run and the last success.
  auto status = run({"-r", redis().url(), "status", "job"});
  EXPECT_EQ(status.exit_code, 3) << status;  // free
  EXPECT_NE(status.out.find("last run: failed (signal 15) after "), std::string::npos) << status;
  EXPECT_NE(status.out.find("last success: ok after "), std::string::npos) << status;
  EXPECT_NE(status.out.find(", token " + runs[0].token + "\n"), std::string::npos) << status;
  auto sj = run({"-r", redis().url(), "status", "--json", "job"});
  auto j = parse_json(sj.out);
  ASSERT_TRUE(j) << sj;
  ASSERT_TRUE(j->find("last_run") && j->find("last_success")) << sj;
  EXPECT_EQ(field(*j->find("last_run"), "token"), runs[2].token);
  EXPECT_EQ(field(*j->find("last_run"), "signal"), std::to_string(SIGTERM));
  EXPECT_EQ(field(*j->find("last_success"), "token"), runs[0].token);
  EXPECT_EQ(field(*j->find("last_success"), "outcome"), "ok");
  EXPECT_EQ(field(*j->find("last_success"), "start_us"), field(h[2], "start_us"));

  // list: the last run's outcome and age; a NAME with records only is no lock.
  auto list = run({"-r", redis().url(), "list", "--all"});
  EXPECT_NE(list.out.find("job: free, last token " + runs[2].token + ", last run failed "), std::string::npos) << list;
  EXPECT_EQ(run({"-r", redis().url(), "list"}).exit_code, 3);
  auto lj = parse_json(run({"-r", redis().url(), "list", "--all", "--json"}).out);
  ASSERT_TRUE(lj && lj->items.size() == 1);
  EXPECT_EQ(field(*lj->items[0].find("last_run"), "token"), runs[2].token);

  // --keep-runs 2: the record keeps the newest two.
  ASSERT_EQ(job("true", {"--keep-runs", "2"}).exit_code, 0);
  EXPECT_EQ(history().size(), 2u);
}

// A NAME unused for longer than the records' TTL leaves no record behind (the token counter stays,
// as it always does: tokens must keep increasing; and with it the marker that the record was started,
// which --if-record-lost reads: expired is not lost).
TEST_F(CronTest, RecordsExpire) {
  ASSERT_EQ(job("true", {"--records-ttl", "1s", "--min-interval", "1s"}).exit_code, 0);
  ASSERT_EQ(job("exit 2", {"--records-ttl", "1s"}).exit_code, 2);
  EXPECT_TRUE(redis().exists("fencerun:{job}:runs"));
  EXPECT_TRUE(redis().exists("fencerun:{job}:ok"));
  EXPECT_LE(redis().pttl("fencerun:{job}:runs"), 1000);
  EXPECT_LE(redis().pttl("fencerun:{job}:rule"), 1000);
  ASSERT_TRUE(wait_until([&] { return redis().keys().size() == 2; }, 10s));
  auto left = redis().keys();  // KEYS has no order
  std::ranges::sort(left);
  EXPECT_EQ(left, (std::vector<std::string>{"fencerun:{job}:since", "fencerun:{job}:token"}));
  auto h = run({"-r", redis().url(), "history", "job"});
  EXPECT_EQ(h.exit_code, 3) << h;
  EXPECT_EQ(h.out, "job: no runs recorded\n");
}

// The metrics file has the last success's start (server time): the run's own when it succeeded, the
// recorded one when --min-interval skipped it, and the file's earlier value after a failed run.
TEST_F(CronTest, MetricsFileHasTheLastSuccessTime) {
  auto value = [&]() -> std::string {
    for (const auto& l : split_lines(read_file(file("m.prom")).value_or("")))
      if (l.starts_with("fencerun_last_success_timestamp_seconds{lock=\"job\"} ")) return l.substr(l.rfind(' ') + 1);
    return "<none>";
  };
  ASSERT_EQ(job("true", {"--metrics-file", "m.prom"}).exit_code, 0);
  auto h = history();
  ASSERT_EQ(h.size(), 1u);
  const std::string start = field(h[0], "start_us");
  ASSERT_GT(start.size(), 6u);
  const std::string expected = start.substr(0, start.size() - 6) + "." + start.substr(start.size() - 6);
  EXPECT_EQ(value(), expected);
  std::filesystem::remove(file("m.prom"));
  ASSERT_EQ(job("true", {"--metrics-file", "m.prom", "--min-interval", "1h", "--skip-exit-code", "9"}).exit_code, 9);
  EXPECT_EQ(value(), expected);  // from the server's record
  ASSERT_EQ(job("exit 1", {"--metrics-file", "m.prom"}).exit_code, 1);
  EXPECT_EQ(value(), expected);  // carried over
  EXPECT_NE(read_file(file("m.prom")).value_or("").find("fencerun_last_exit_code{lock=\"job\"} 1\n"), std::string::npos);
}

// The rule `fencerun acl` prints covers the record: runs, skips, status and history as that user.
TEST_F(CronTest, AclRuleCoversTheRecord) {
  auto rule = run({"acl"});
  ASSERT_EQ(rule.exit_code, 0) << rule;
  std::vector<std::string> setuser = {"ACL", "SETUSER", "jobs", "on", ">cron-pw"};
  std::istringstream words(rule.out);
  for (std::string w; words >> w;) setuser.push_back(w);
  ASSERT_TRUE(redis().cmd(setuser).ok()) << redis().cmd(setuser).describe();
  const EnvList env = {{"FENCERUN_REDIS_PASSWORD", "cron-pw"}};
  const std::string url = "redis://jobs@127.0.0.1:" + std::to_string(redis().port());
  auto first = run({"-r", url, "--min-interval", "1h", "job", "--", "sh", "-c", "echo x >> ran"}, env);
  ASSERT_EQ(first.exit_code, 0) << first;
  auto second = run({"-r", url, "--min-interval", "1h", "--skip-exit-code", "5", "job", "--", "sh", "-c", "echo x >> ran"}, env);
  EXPECT_EQ(second.exit_code, 5) << second;
  auto failed = run({"-r", url, "job", "--", "false"}, env);
  EXPECT_EQ(failed.exit_code, 1) << failed;
  auto status = run({"-r", url, "status", "job"}, env);
  EXPECT_NE(status.out.find("last success: ok after "), std::string::npos) << status;
  EXPECT_NE(status.out.find("last run: failed (exit 1) after "), std::string::npos) << status;
  auto h = run({"-r", url, "history", "job"}, env);
  EXPECT_EQ(h.exit_code, 0) << h;
  EXPECT_EQ(split_lines(h.out).size(), 2u) << h;
  EXPECT_EQ(split_lines(read_file(file("ran")).value_or("")).size(), 1u);
}

// Bad input: exit 64, one line, nothing written to the server.
TEST_F(CronTest, BadInputIsAUsageError) {
  const std::vector<std::vector<std::string>> bad = {
      {"--min-interval", "0"},
      {"--min-interval", "-5s"},
      {"--min-interval", "721h"},  // longer than the records' TTL (720h)
      {"--min-interval", "10s", "--records-ttl", "5s"},
      {"--min-interval", "soon"},
      {"--records-ttl", "0"},
      {"--keep-runs", "0"},
      {"--keep-runs", "1001"},
      {"--skip-exit-code", "256"},
  };
  for (const auto& options : bad) {
    auto r = job("echo x > ran", options);
    EXPECT_EQ(r.exit_code, 64) << r;
    EXPECT_EQ(split_lines(r.err).size(), 1u) << r;
  }
  auto n = run({"-r", redis().url(), "history", "-n", "0", "job"});
  EXPECT_EQ(n.exit_code, 64) << n;
  EXPECT_FALSE(read_file(file("ran")).has_value());
  EXPECT_EQ(redis().dbsize(), 0);
}

// --limit N: a success of any slot counts. Two slots: a run that exits 1 in one slot does not stop the
// next; after a success every later trigger is skipped, whichever slot it would have taken, while the
// other slot's holder still runs. Each slot's run in progress is its own: a SIGKILLed holder of one slot
// is recorded as killed (with its token) by the next run, while the other slot's run is not.
TEST_F(CronTest, LimitSuccessOfAnySlotCounts) {
  const std::vector<std::string> two = {"--limit", "2", "--ttl", "2s"};
  auto with = [&](std::vector<std::string> more) {
    auto o = two;
    o.insert(o.end(), more.begin(), more.end());
    return o;
  };
  // Slot 0: a long run that gets SIGKILLed with its fencerun; slot 1: a failed run, then a success.
  auto held = start(sh_args("job", "echo $$ > pid; echo $FENCERUN_TOKEN > token; echo $FENCERUN_SLOT > slot; sleep 1000",
                            with({})));
  wait_pid("pid");
  const std::string killed_token = wait_line("token");
  ASSERT_EQ(wait_line("slot"), "0");
  auto failed = job("echo x >> ran; exit 1", with({"--min-interval", "1h"}));
  ASSERT_EQ(failed.exit_code, 1) << failed;
  auto ok = job("echo $FENCERUN_SLOT >> ran", with({"--min-interval", "1h"}));
  ASSERT_EQ(ok.exit_code, 0) << ok;
  // Slot 1 is free, slot 0 held: the success of slot 1 counts all the same.
  auto skipped = job("echo x >> ran", with({"--min-interval", "1h", "--skip-exit-code", "9", "-v"}));
  EXPECT_EQ(skipped.exit_code, 9) << skipped;
  EXPECT_NE(skipped.err.find("skipped: the last success started"), std::string::npos) << skipped;
  EXPECT_EQ(split_lines(read_file(file("ran")).value_or("")), (std::vector<std::string>{"x", "1"}));
  // The skip held nothing: slot 1 is free.
  EXPECT_FALSE(redis().exists("fencerun:{job}:slot:1"));

  const pid_t fencerun_pid = held->pid();
  ASSERT_TRUE(held->signal(SIGKILL));
  held->wait_for_exit(10s);
  kill_if_alive(*wait_for_pid_file(file("pid"), 1s));
  ASSERT_TRUE(wait_until([&] { return !redis().exists("fencerun:{job}:slot:0"); }, 10s));
  auto next = job("true", with({}));
  ASSERT_EQ(next.exit_code, 0) << next;
  auto h = history();
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(field(h[0], "outcome"), "ok");
  EXPECT_EQ(field(h[1], "outcome"), "killed");
  EXPECT_EQ(field(h[1], "token"), killed_token);
  EXPECT_EQ(field(h[1], "pid"), std::to_string(fencerun_pid));
  EXPECT_EQ(field(h[2], "outcome"), "ok");
  EXPECT_EQ(field(h[2], "pid"), std::to_string(ok.pid));
  EXPECT_EQ(field(h[3], "outcome"), "failed");
  EXPECT_EQ(field(h[3], "exit_code"), "1");
  // Nothing of the runs in progress is left.
  EXPECT_FALSE(redis().exists("fencerun:{job}:running"));
  auto status = run({"-r", redis().url(), "status", "job"});
  EXPECT_NE(status.out.find("last success: ok after "), std::string::npos) << status;
}

// --limit N under a fleet of triggers at once: with --min-interval only runs that start before the
// first success ends can run (each slot at most once), and none after it.
TEST_F(CronTest, LimitSkipsEveryTriggerAfterASuccess) {
  const std::vector<std::string> o = {"--limit", "3", "--min-interval", "1h", "--skip-exit-code", "7"};
  ASSERT_EQ(job("echo x >> ran", o).exit_code, 0);
  std::vector<std::unique_ptr<FencerunProcess>> ps;
  for (int i = 0; i < 6; ++i) ps.push_back(start(sh_args("job", "echo x >> ran; sleep 0.2", o)));
  for (auto& p : ps) EXPECT_EQ(p->wait_for_exit(20s), 7) << p->result();
  EXPECT_EQ(split_lines(read_file(file("ran")).value_or("")).size(), 1u);
  EXPECT_EQ(history().size(), 1u);
}

}  // namespace
}  // namespace fencerun::test
