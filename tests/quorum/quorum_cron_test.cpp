// --min-interval and the record of runs in quorum mode: every server keeps the record beside the lock
// (written at the release, in the same step as each server's compare-and-delete); an acquisition that
// holds a majority takes the newest success (by token) of the servers that answered. The newest record
// winning over an older one; a killed run; history merged over the servers. The fleet (one run per
// period, with a server restarted empty in the middle of a run) is in tests/contract.
#include <csignal>
#include <filesystem>
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

}  // namespace
}  // namespace fencerun::test
