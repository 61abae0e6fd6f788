// Running a command under a lease: tokens, keys, environment, exit statuses, argv, logging.
#include <algorithm>
#include <map>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

class RunTest : public FencerunTest {};

std::map<std::string, std::string> parse_env(const std::string& env_output) {
  std::map<std::string, std::string> m;
  for (const auto& line : split_lines(env_output)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return m;
}

TEST_F(RunTest, TokensStrictlyIncreaseOverSequentialRuns) {
  const long long server_time_before = redis().time_us();
  std::vector<long long> tokens;
  for (int i = 0; i < 30; ++i) {
    auto r = run(sh_args("seq", "echo \"$FENCERUN_TOKEN\""));
    ASSERT_EQ(r.exit_code, 0) << r;
    auto t = parse_ll(r.out);
    ASSERT_TRUE(t.has_value()) << "FENCERUN_TOKEN not a decimal integer: " << r;
    tokens.push_back(*t);
  }
  EXPECT_GE(tokens.front(), server_time_before)
      << "the first token must be at least the server time in microseconds";
  for (size_t i = 1; i < tokens.size(); ++i)
    EXPECT_LT(tokens[i - 1], tokens[i]) << "token " << i << " did not increase";
  EXPECT_LE(tokens.back(), kMaxSafeToken);
  EXPECT_EQ(redis().get(token_key("seq")), std::to_string(tokens.back()))
      << "the token key holds the last issued token";
  EXPECT_FALSE(redis().exists(lock_key("seq")));
}

TEST_F(RunTest, ReleaseDeletesLockKeyAndKeepsTokenKey) {
  auto p = start(sh_args("rel", kHoldUntilGo, {"--ttl", "10s"}));
  const std::string value = wait_lock("rel");
  const std::string token = wait_line("token");
  auto lv = parse_lock_value(value);
  ASSERT_TRUE(lv.has_value()) << "lock value not '<owner> <token> <pid> <host>': " << value;
  EXPECT_EQ(std::to_string(lv->token), token);
  const long long pttl = redis().pttl(lock_key("rel"));
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 10000);
  touch("go");
  ASSERT_EQ(p->wait_for_exit(10s), 0) << p->result();
  EXPECT_FALSE(redis().exists(lock_key("rel"))) << "lock key left after release";
  EXPECT_EQ(redis().get(token_key("rel")), token);
  EXPECT_EQ(redis().pttl(token_key("rel")), -1) << "the token key must never expire";
  // Besides the token key only the record of runs stays (tests/cron), and it expires.
  for (const auto& k : redis().keys()) {
    if (k == token_key("rel")) continue;
    EXPECT_TRUE(k == "fencerun:{rel}:runs" || k == "fencerun:{rel}:ok") << k;
    EXPECT_GT(redis().pttl(k), 0) << k;
  }
}

TEST_F(RunTest, EnvironmentGivenToCommand) {
  const std::string script =
      "env > env.out; echo ready > ready; while [ ! -e go ]; do sleep 0.02; done";
  auto p = start(sh_args("envlock", script, {"--ttl", "7s"}),
                 {{"FENCERUN_TEST_INHERITED", "a b=c 'q'"}, {"PLAIN_VAR", "plain"}});
  wait_line("ready");
  const auto lock_value = redis().get(lock_key("envlock"));
  ASSERT_TRUE(lock_value.has_value());
  const auto env = parse_env(read_file(file("env.out")).value_or(""));

  ASSERT_TRUE(env.count("FENCERUN_TOKEN"));
  auto token = parse_ll(env.at("FENCERUN_TOKEN"));
  ASSERT_TRUE(token.has_value()) << env.at("FENCERUN_TOKEN");
  EXPECT_GE(*token, kMinPlausibleToken);
  EXPECT_LE(*token, kMaxSafeToken);
  EXPECT_EQ(env.count("FENCERUN_LOCK") ? env.at("FENCERUN_LOCK") : "", "envlock");
  ASSERT_TRUE(env.count("FENCERUN_OWNER"));
  const std::string owner = env.at("FENCERUN_OWNER");
  EXPECT_EQ(owner.size(), 32u) << owner;
  EXPECT_TRUE(is_hex(owner)) << owner;
  EXPECT_EQ(env.count("FENCERUN_TTL_MS") ? env.at("FENCERUN_TTL_MS") : "", "7000");
  ASSERT_TRUE(env.count("FENCERUN_REDIS_URL"));
  EXPECT_NE(env.at("FENCERUN_REDIS_URL").find("127.0.0.1:" + std::to_string(redis().port())),
            std::string::npos)
      << env.at("FENCERUN_REDIS_URL");
  // Inherited unchanged, except FENCERUN_* variables: only this run's reach the command.
  EXPECT_EQ(env.count("FENCERUN_TEST_INHERITED"), 0u);
  EXPECT_EQ(env.count("FENCERUN_SERVERS") ? env.at("FENCERUN_SERVERS") : "", "1");
  EXPECT_EQ(env.count("PLAIN_VAR") ? env.at("PLAIN_VAR") : "", "plain");
  EXPECT_TRUE(env.count("PATH"));

  // The lock value names this owner and token.
  auto lv = parse_lock_value(*lock_value);
  ASSERT_TRUE(lv.has_value()) << *lock_value;
  EXPECT_EQ(lower(lv->owner), lower(owner));
  EXPECT_EQ(lv->token, *token);
  EXPECT_EQ(lv->host, hostname());
  EXPECT_EQ(redis().get(token_key("envlock")), std::to_string(*token));

  touch("go");
  ASSERT_EQ(p->wait_for_exit(10s), 0) << p->result();
}

TEST_F(RunTest, OwnerDiffersBetweenRuns) {
  auto a = run(sh_args("own", "echo $FENCERUN_OWNER"));
  auto b = run(sh_args("own", "echo $FENCERUN_OWNER"));
  ASSERT_EQ(a.exit_code, 0) << a;
  ASSERT_EQ(b.exit_code, 0) << b;
  EXPECT_NE(trim(a.out), trim(b.out));
}

TEST_F(RunTest, ExitStatusPassedThrough) {
  for (int code : {0, 1, 42, 255}) {
    auto r = run(sh_args("exit", "exit " + std::to_string(code)));
    EXPECT_EQ(r.exit_code, code) << r;
    EXPECT_FALSE(redis().exists(lock_key("exit"))) << "after exit " << code;
  }
}

TEST_F(RunTest, CommandKilledBySignalGives128PlusN) {
  for (auto [sig, name] : {std::pair{15, "TERM"}, {9, "KILL"}, {10, "USR1"}}) {
    auto r = run(sh_args("sig", std::string("kill -") + name + " $$"));
    EXPECT_EQ(r.exit_code, 128 + sig) << "kill -" << name << ": " << r;
    EXPECT_FALSE(redis().exists(lock_key("sig"))) << "after kill -" << name;
  }
}

TEST_F(RunTest, ShellOptionRunsCommandString) {
  auto r = run({"-r", redis().url(), "--shell", "shelllock", "--",
                "echo \"$FENCERUN_LOCK\" | tr a-z A-Z; exit 7"});
  EXPECT_EQ(r.exit_code, 7) << r;
  EXPECT_EQ(r.out, "SHELLLOCK\n") << r;
}

TEST_F(RunTest, ArgvPassedIntact) {
  auto r = run({"-r", redis().url(), "argv", "--", "printf", "%s\\n", "[%s]", "a,b", "x y", "",
                "--", "-v", "--ttl", "'q'", "$HOME", "*"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "[%s]\na,b\nx y\n\n--\n-v\n--ttl\n'q'\n$HOME\n*\n") << r;
}

TEST_F(RunTest, BracketArgumentsArriveExactly) {
  auto r = run({"-r", redis().url(), "argv2", "--", "printf", "%s\\n", "[%s]", "a,b", "x y"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "[%s]\na,b\nx y\n") << r;
}

TEST_F(RunTest, StdinIsTheCommandsOwn) {
  write_file(file("input"), "line one\nline two\n");
  SpawnOptions o = spawn_options();
  o.stdin_file = file("input");
  auto r = run_fencerun({"-r", redis().url(), "stdin", "--", "cat"}, o);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "line one\nline two\n");
}

TEST_F(RunTest, ExplicitRunSubcommand) {
  auto r = run({"run", "-r", redis().url(), "explicit", "--", "sh", "-c", "echo $FENCERUN_LOCK"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "explicit\n");
  // A lock named like a subcommand needs the explicit form.
  auto s = run({"run", "-r", redis().url(), "status", "--", "sh", "-c", "echo $FENCERUN_LOCK"});
  ASSERT_EQ(s.exit_code, 0) << s;
  EXPECT_EQ(s.out, "status\n");
}

TEST_F(RunTest, QuietByDefaultOnSuccess) {
  auto r = run(sh_args("quiet", "true"));
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, "") << "fencerun must print nothing on success by default";
  EXPECT_EQ(r.out, "");
}

TEST_F(RunTest, VerboseTextLogsAcquiredAndReleased) {
  auto r = run(sh_args("verbose", "echo $FENCERUN_TOKEN", {"-v", "--ttl", "30s"}));
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string token = trim(r.out);
  bool acquired = false;
  for (const auto& line : split_lines(r.err)) {
    EXPECT_EQ(line.rfind("fencerun:", 0), 0u) << "log line without prefix: " << line;
    if (line.find("acquired") != std::string::npos) {
      acquired = true;
      EXPECT_NE(line.find("verbose"), std::string::npos) << line;
      EXPECT_NE(line.find(token), std::string::npos) << line;
    }
  }
  EXPECT_TRUE(acquired) << r;
  EXPECT_NE(r.err.find("released"), std::string::npos) << r;
}

TEST_F(RunTest, JsonLogsOneObjectPerLine) {
  auto r = run(sh_args("jsonlog", "echo $FENCERUN_TOKEN", {"-v", "--log-format", "json"}));
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto token = parse_ll(r.out);
  ASSERT_TRUE(token.has_value()) << r;
  std::vector<std::string> events;
  for (const auto& line : split_lines(r.err)) {
    if (line.empty()) continue;
    auto j = parse_json(line);
    ASSERT_TRUE(j.has_value()) << "not a JSON object: " << line;
    ASSERT_EQ(j->kind, Json::Kind::Object) << line;
    auto ev = j->find("event");
    if (!ev) continue;
    events.push_back(ev->as_string().value_or("?"));
    if (events.back() == "acquired" || events.back() == "released") {
      EXPECT_EQ(j->find("lock") ? j->find("lock")->as_string() : std::nullopt,
                std::optional<std::string>("jsonlog"))
          << line;
      EXPECT_EQ(json_int(j->find("token")), token) << line;
      EXPECT_NE(j->find("ts"), nullptr) << line;
      EXPECT_NE(j->find("level"), nullptr) << line;
    }
  }
  EXPECT_NE(std::find(events.begin(), events.end(), "acquired"), events.end()) << r;
  EXPECT_NE(std::find(events.begin(), events.end(), "released"), events.end()) << r;
}

TEST_F(RunTest, KeyPrefixOption) {
  auto r = run(sh_args("pfx", "echo $FENCERUN_TOKEN", {"--key-prefix", "myapp:"}));
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(redis().get(token_key("pfx", "myapp:")), trim(r.out));
  EXPECT_FALSE(redis().exists(token_key("pfx")));
  auto keys = redis().keys();
  std::sort(keys.begin(), keys.end());
  // The token counter and the record of the run, all under the prefix.
  EXPECT_EQ(keys, (std::vector<std::string>{"myapp:{pfx}:ok", "myapp:{pfx}:runs", "myapp:{pfx}:token"}));
}

TEST_F(RunTest, UrlFromEnvironment) {
  const std::string dead = "redis://127.0.0.1:" + std::to_string(unused_port());
  {
    auto r = run({"fromenv", "--", "true"}, {{"FENCERUN_REDIS_URL", redis().url()}});
    EXPECT_EQ(r.exit_code, 0) << "FENCERUN_REDIS_URL: " << r;
  }
  {
    auto r = run({"fromenv", "--", "true"}, {{"REDIS_URL", redis().url()}});
    EXPECT_EQ(r.exit_code, 0) << "REDIS_URL: " << r;
  }
  {
    auto r = run({"fromenv", "--", "true"},
                 {{"FENCERUN_REDIS_URL", redis().url()}, {"REDIS_URL", dead}});
    EXPECT_EQ(r.exit_code, 0) << "FENCERUN_REDIS_URL wins over REDIS_URL: " << r;
  }
  {
    auto r = run({"-r", redis().url(), "fromenv", "--", "true"}, {{"FENCERUN_REDIS_URL", dead}});
    EXPECT_EQ(r.exit_code, 0) << "-r wins over the environment: " << r;
  }
  {
    auto r = run({"--timeout", "1s", "fromenv", "--", "true"}, {{"FENCERUN_REDIS_URL", dead}});
    EXPECT_EQ(r.exit_code, 69) << "the environment URL is used: " << r;
  }
}

TEST_F(RunTest, CommandNotFoundGives127AndReleases) {
  auto r = run({"-r", redis().url(), "nf", "--", "fencerun-no-such-command-xyz", "arg"});
  EXPECT_EQ(r.exit_code, 127) << r;
  EXPECT_FALSE(r.err.empty()) << "a message on stderr is expected";
  EXPECT_FALSE(redis().exists(lock_key("nf"))) << "lock key left behind";
  auto r2 = run({"-r", redis().url(), "nf", "--", "./no-such-file"});
  EXPECT_EQ(r2.exit_code, 127) << r2;
  EXPECT_FALSE(redis().exists(lock_key("nf")));
}

TEST_F(RunTest, NotExecutableGives126AndReleases) {
  write_file(file("script.sh"), "#!/bin/sh\necho should-not-run\n", 0644);
  auto r = run({"-r", redis().url(), "nx", "--", file("script.sh").string()});
  EXPECT_EQ(r.exit_code, 126) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(r.err.empty()) << "a message on stderr is expected";
  EXPECT_FALSE(redis().exists(lock_key("nx"))) << "lock key left behind";
}

// As execvp(3), env(1), timeout(1) and flock(1): an executable without "#!" runs with /bin/sh.
TEST_F(RunTest, ScriptWithoutShebangRunsWithBinSh) {
  write_file(file("noshebang"), "echo \"ran with $FENCERUN_LOCK $1\"\n", 0755);
  auto r = run({"-r", redis().url(), "nosb", "--", file("noshebang").string(), "arg"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "ran with nosb arg\n") << r;
  EXPECT_FALSE(redis().exists(lock_key("nosb")));
}

TEST_F(RunTest, DirectoryGives126IsADirectory) {
  auto r = run({"-r", redis().url(), "dir", "--", dir().path().string()});
  EXPECT_EQ(r.exit_code, 126) << r;
  EXPECT_NE(r.err.find("Is a directory"), std::string::npos) << r;
  EXPECT_FALSE(redis().exists(lock_key("dir")));
}

TEST_F(RunTest, MissingInterpreterGives127NamingTheShebangLine) {
  write_file(file("badinterp"), "#!/nonexistent/bin/interp\necho should-not-run\n", 0755);
  auto r = run({"-r", redis().url(), "bi", "--", file("badinterp").string()});
  EXPECT_EQ(r.exit_code, 127) << r;
  EXPECT_NE(r.err.find("bad interpreter \"#!/nonexistent/bin/interp\""), std::string::npos) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(redis().exists(lock_key("bi")));
}

// FENCERUN_CGROUP: off, 0, false and no in any case turn the job's cgroup off.
TEST_F(RunTest, CgroupSettingIsReadCaseInsensitively) {
  for (const char* value : {"off", "OFF", "0", "false", "No"}) {
    auto r = run(sh_args("cgset", "true", {"-vv"}), {{"FENCERUN_CGROUP", value}});
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_EQ(r.err.find("containment: cgroup"), std::string::npos) << value << "\n" << r;
    EXPECT_NE(r.err.find(std::string("FENCERUN_CGROUP=") + value), std::string::npos) << value << "\n" << r;
  }
}

TEST_F(RunTest, TokensNeverGoBackwardsWhenCounterIsLost) {
  auto a = run(sh_args("durable", "echo $FENCERUN_TOKEN"));
  ASSERT_EQ(a.exit_code, 0) << a;
  const auto t1 = parse_ll(a.out);
  ASSERT_TRUE(t1.has_value()) << a;

  redis().restart();  // no persistence: the counter key is gone
  ASSERT_EQ(redis().dbsize(), 0);
  auto b = run(sh_args("durable", "echo $FENCERUN_TOKEN"));
  ASSERT_EQ(b.exit_code, 0) << b;
  const auto t2 = parse_ll(b.out);
  ASSERT_TRUE(t2.has_value()) << b;
  EXPECT_GT(*t2, *t1) << "token went backwards after the counter key was lost";

  ASSERT_TRUE(redis().cmd({"DEL", token_key("durable")}).ok());
  auto c = run(sh_args("durable", "echo $FENCERUN_TOKEN"));
  ASSERT_EQ(c.exit_code, 0) << c;
  const auto t3 = parse_ll(c.out);
  ASSERT_TRUE(t3.has_value()) << c;
  EXPECT_GT(*t3, *t2) << "token went backwards after DEL of the counter";

  // A counter ahead of the clock keeps counting from itself.
  const long long ahead = *t3 + 1'000'000'000'000LL;
  ASSERT_TRUE(redis().cmd({"SET", token_key("durable"), std::to_string(ahead)}).ok());
  auto d = run(sh_args("durable", "echo $FENCERUN_TOKEN"));
  ASSERT_EQ(d.exit_code, 0) << d;
  EXPECT_EQ(parse_ll(d.out), ahead + 1) << d;
}

}  // namespace
}  // namespace fencerun::test
