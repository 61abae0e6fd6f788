// Which server a run talks to, and how it releases there: the native compare-and-delete (DELIFEQ,
// DELEX) where the server's command table has one, the release script elsewhere, with the waiters'
// wake-up on every path. Runs against whichever server the suite is run with (the server matrix), and
// asserts from that server's own answers (HELLO, COMMAND INFO, INFO commandstats), not from names.
#include <map>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

struct Identity {
  std::string name;
  std::string version;
  bool delifeq = false;
  bool delex = false;
};

class ServerTest : public FencerunTest {
 protected:
  // What the server says of itself, asked by the test.
  Identity identity() {
    Identity id;
    auto hello = redis().cmd({"HELLO", "2"});
    for (std::size_t i = 0; i + 1 < hello.elements.size(); i += 2) {
      if (hello.elements[i].str == "server") id.name = hello.elements[i + 1].str;
      if (hello.elements[i].str == "version") id.version = hello.elements[i + 1].str;
    }
    auto info = redis().cmd({"COMMAND", "INFO", "DELIFEQ", "DELEX"});
    if (info.elements.size() == 2) {
      id.delifeq = info.elements[0].type == Reply::Type::Array;
      id.delex = info.elements[1].type == Reply::Type::Array;
    }
    return id;
  }

  // calls= of each command in INFO commandstats ("cmdstat_delifeq:calls=1,...").
  std::map<std::string, long long> command_calls() {
    std::map<std::string, long long> calls;
    auto info = redis().cmd({"INFO", "commandstats"});
    std::istringstream lines(info.str);
    for (std::string line; std::getline(lines, line);) {
      auto colon = line.find(':'), eq = line.find("calls=");
      if (line.rfind("cmdstat_", 0) != 0 || colon == std::string::npos || eq == std::string::npos) continue;
      calls[line.substr(8, colon - 8)] = parse_ll(line.substr(eq + 6, line.find(',', eq) - eq - 6)).value_or(0);
    }
    return calls;
  }

  std::string expected_path(const Identity& id) {
    return id.delifeq ? "DELIFEQ" : id.delex ? "DELEX" : "script";
  }
};

TEST_F(ServerTest, verbose_log_names_the_server_and_its_release) {
  const Identity id = identity();
  ASSERT_FALSE(id.name.empty()) << "the server did not answer HELLO";
  // Read by tests/servers/matrix-table for its release column.
  std::cout << "release path: " << expected_path(id) << " (" << id.name << " " << id.version << ")\n";
  auto r = run(sh_args("named", "true", {"-v"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("talking to " + id.name + " " + id.version + " at 127.0.0.1:" + std::to_string(redis().port()) +
                       " (release by " + expected_path(id) + ")"),
            std::string::npos)
      << r.err;
}

TEST_F(ServerTest, json_log_carries_server_version_and_release_path) {
  const Identity id = identity();
  auto r = run(sh_args("named", "true", {"-v", "--log-format", "json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  bool seen = false;
  for (const auto& line : split_lines(r.err)) {
    auto j = parse_json(line);
    if (!j || !j->find("event") || j->find("event")->as_string() != "server") continue;
    seen = true;
    EXPECT_EQ(j->find("server")->as_string(), id.name);
    EXPECT_EQ(j->find("server_version")->as_string(), id.version);
    EXPECT_EQ(j->find("release")->as_string(), expected_path(id));
  }
  EXPECT_TRUE(seen) << r.err;
}

TEST_F(ServerTest, release_uses_the_native_command_where_the_server_has_one) {
  const Identity id = identity();
  const auto before = command_calls();
  auto r = run(sh_args("native", "true"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(redis().exists(lock_key("native")));
  const auto after = command_calls();
  auto delta = [&](const std::string& c) {
    return (after.contains(c) ? after.at(c) : 0) - (before.contains(c) ? before.at(c) : 0);
  };
  EXPECT_EQ(delta("delifeq"), id.delifeq ? 1 : 0);
  EXPECT_EQ(delta("delex"), !id.delifeq && id.delex ? 1 : 0);
}

TEST_F(ServerTest, native_release_deletes_only_its_own_lock) {
  const Identity id = identity();
  if (!id.delifeq && !id.delex) GTEST_SKIP() << id.name << " " << id.version << " has no native compare-and-delete";
  // The lease runs out while the command runs; another owner's value is in the key at release time.
  auto holder = start(sh_args("stolen", kHoldUntilGo, {"--ttl", "3s"}));
  wait_pid("pid");
  const std::string other = "ffffffffffffffffffffffffffffffff 1 1 elsewhere";
  ASSERT_TRUE(redis().cmd({"SET", lock_key("stolen"), other, "PX", "60000"}).ok());
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(30s).has_value());
  EXPECT_NE(holder->exit_code(), 0) << "the lease was taken: the run must say so";
  EXPECT_EQ(redis().get(lock_key("stolen")), other) << "another owner's lock was deleted";
}

TEST_F(ServerTest, waiters_are_woken_on_every_release_path) {
  const Identity id = identity();
  // A long lease: a waiter that was not woken would wait for it to run out (30 s).
  auto holder = start(sh_args("wake", kHoldUntilGo, {"--ttl", "30s"}));
  wait_pid("pid");
  auto waiter = start(sh_args("wake", "echo waited > waited", {"-w", "60s", "-v"}));
  wait_until([&] { return redis().cmd({"ZCARD", "fencerun:{wake}:queue"}).integer == 1; }, 10s);
  const auto before = command_calls();
  touch("go");
  ASSERT_EQ(holder->wait_for_exit(10s), 0) << holder->err();
  // Woken by the release's publish, the waiter takes the lock at once, far inside the holder's 30 s.
  EXPECT_EQ(waiter->wait_for_exit(15s), 0) << waiter->err();
  EXPECT_EQ(read_file(file("waited")), "waited\n");
  const auto after = command_calls();
  EXPECT_GE(after.contains("publish") ? after.at("publish") - (before.contains("publish") ? before.at("publish") : 0) : 0, 1)
      << "no wake-up was published on the " << expected_path(id) << " path";
}

TEST_F(ServerTest, a_user_not_allowed_the_native_command_still_releases) {
  const Identity id = identity();
  if (!id.delifeq && !id.delex) GTEST_SKIP() << id.name << " " << id.version << " has no native compare-and-delete";
  // The rule without --delifeq/--delex: the native command is refused (NOPERM) and the script releases.
  auto rule = run({"acl"});
  ASSERT_EQ(rule.exit_code, 0) << rule.err;
  std::vector<std::string> setuser = {"ACL", "SETUSER", "jobs", "on", ">secret-pw"};
  std::istringstream words(rule.out);
  for (std::string w; words >> w;) setuser.push_back(w);
  ASSERT_TRUE(redis().cmd(setuser).ok()) << redis().cmd(setuser).describe();
  const std::string url = "redis://jobs:secret-pw@127.0.0.1:" + std::to_string(redis().port());
  auto r = run({"-r", url, "acl-native", "--", "true"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(redis().exists(lock_key("acl-native"))) << "the lock was left held";
  EXPECT_EQ(r.err.find("release_failed"), std::string::npos) << r.err;
}

TEST_F(ServerTest, version_with_a_server_names_it) {
  const Identity id = identity();
  auto r = run({"-r", redis().url(), "--version"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("fencerun "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("server: " + id.name + " " + id.version + " at 127.0.0.1:" + std::to_string(redis().port())),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("release: " + expected_path(id) + "\n"), std::string::npos) << r.out;
}

TEST_F(ServerTest, version_with_an_unreachable_server_exits_69) {
  const int port = redis().port();
  redis().stop();
  auto r = run({"-r", "redis://127.0.0.1:" + std::to_string(port), "--timeout", "1s", "--version"});
  EXPECT_EQ(r.exit_code, 69) << r.out << r.err;
  EXPECT_NE(r.out.find("fencerun "), std::string::npos) << "the version is printed first";
  EXPECT_NE(r.err.find("cannot use Redis at redis://127.0.0.1:" + std::to_string(port)), std::string::npos) << r.err;
}

TEST_F(ServerTest, version_alone_talks_to_no_server) {
  redis().freeze();  // a probe would hang until its timeout
  auto r = run({"--version"}, {{"FENCERUN_REDIS", redis().url()}}, 10s);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.find("server:"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace fencerun::test
