// Usage errors: exit 64, a one-line message on stderr, nothing written to Redis, the command not
// run. And the boundary cases that must be accepted.
#include <set>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

struct UsageCase {
  const char* label = "";
  std::vector<std::string> before_name;  // options before NAME (after -r URL)
  std::string name = "ok";
  bool with_command = true;              // append `-- touch ran`
  std::vector<std::string> raw;          // when non-empty: used instead of the assembled args
};

std::ostream& operator<<(std::ostream& os, const UsageCase& c) { return os << c.label; }

UsageCase with_options(const char* label, std::vector<std::string> before_name) {
  UsageCase c;
  c.label = label;
  c.before_name = std::move(before_name);
  return c;
}

UsageCase with_name(const char* label, std::string name) {
  UsageCase c;
  c.label = label;
  c.name = std::move(name);
  return c;
}

// Whole argument list; "@URL" is replaced by the test server's URL.
UsageCase with_args(const char* label, std::vector<std::string> raw) {
  UsageCase c;
  c.label = label;
  c.raw = std::move(raw);
  return c;
}

class UsageTest : public FencerunTest, public ::testing::WithParamInterface<UsageCase> {};

TEST_P(UsageTest, Exits64WithOneLineMessage) {
  const UsageCase& c = GetParam();
  std::vector<std::string> args;
  if (!c.raw.empty()) {
    for (const auto& a : c.raw) args.push_back(a == "@URL" ? redis().url() : a);
  } else {
    args = {"-r", redis().url()};
    args.insert(args.end(), c.before_name.begin(), c.before_name.end());
    args.push_back(c.name);
    if (c.with_command) args.insert(args.end(), {"--", "touch", "ran"});
  }
  auto r = run(args, {}, 10s);
  EXPECT_EQ(r.exit_code, 64) << r;
  const auto lines = split_lines(r.err);
  EXPECT_EQ(lines.size(), 1u) << "expected one line on stderr: " << r;
  if (!lines.empty()) {
    EXPECT_FALSE(trim(lines[0]).empty()) << r;
  }
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command ran";
  EXPECT_EQ(redis().dbsize(), 0) << "a usage error wrote to Redis";
}

const std::string k257(257, 'n');

std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> words;
  std::size_t at = 0;
  while ((at = s.find_first_not_of(' ', at)) != std::string_view::npos) {
    std::size_t end = s.find(' ', at);
    words.emplace_back(s.substr(at, end - at));
    at = end;
  }
  return words;
}

INSTANTIATE_TEST_SUITE_P(
    BadInvocations, UsageTest,
    ::testing::Values(
        with_options("ttl_not_a_duration", {"--ttl", "abc"}),
        with_options("ttl_bad_unit", {"--ttl", "10x"}),
        with_options("ttl_zero", {"--ttl", "0"}),
        with_options("ttl_negative", {"--ttl", "-5s"}),
        with_options("ttl_below_minimum", {"--ttl", "50ms"}),
        with_options("ttl_empty", {"--ttl", ""}),
        with_options("renew_equal_ttl", {"--ttl", "10s", "--renew", "10s"}),
        with_options("renew_above_ttl", {"--ttl", "10s", "--renew", "20s"}),
        with_options("renew_zero", {"--ttl", "10s", "--renew", "0"}),
        with_options("grace_too_large", {"--ttl", "10s", "--grace", "9s"}),
        with_options("grace_equal_ttl", {"--ttl", "10s", "--grace", "10s"}),
        with_options("wait_bad", {"--wait", "bogus"}),
        with_options("timeout_bad", {"--timeout", "soon"}),
        with_options("kill_signal_unknown", {"--kill-signal", "NOPE"}),
        with_options("kill_signal_out_of_range", {"--kill-signal", "999"}),
        with_options("log_format_bad", {"--log-format", "xml"}),
        with_options("unknown_option", {"--bogus"}),
        with_options("unknown_short_option", {"-Z"}),
        with_options("conflict_exit_code_not_a_number", {"-E", "abc"}),
        with_name("name_with_space", "a b"),
        with_name("name_with_open_brace", "a{b"),
        with_name("name_with_close_brace", "a}b"),
        with_name("name_hash_tag", "{x}"),
        with_name("name_empty", ""),
        with_name("name_too_long", k257),
        with_name("name_with_tab", "a\tb"),
        with_name("name_with_newline", "a\nb"),
        with_name("name_non_ascii", "caf\xc3\xa9"),
        with_args("missing_command_after_separator", {"-r", "@URL", "ok", "--"}),
        with_args("missing_command_and_separator", {"-r", "@URL", "ok"}),
        with_args("missing_name", {"-r", "@URL", "--", "touch", "ran"}),
        with_args("no_arguments", {"-r", "@URL"}),
        with_args("status_without_name", {"status", "-r", "@URL"}),
        with_args("status_bad_name", {"status", "-r", "@URL", "a b"}),
        with_args("run_bad_ttl", {"run", "-r", "@URL", "--ttl", "nope", "ok", "--", "touch", "ran"}),
        // A first word one edit away from a subcommand: refused, no lock taken, nothing run.
        with_args("typo_lsit", {"-r", "@URL", "lsit", "touch", "ran"}),
        with_args("typo_stauts", {"-r", "@URL", "stauts", "touch", "ran"}),
        with_args("typo_fnce", {"-r", "@URL", "fnce", "touch", "ran"}),
        with_args("typo_brake", {"-r", "@URL", "brake", "x", "touch", "ran"}),
        with_args("word_version", {"-r", "@URL", "version"}),
        // An option the subcommand does not take, before or after its word.
        with_args("run_option_before_status", {"-r", "@URL", "--ttl", "5s", "status", "ok"}),
        with_args("run_option_after_status", {"-r", "@URL", "status", "ok", "--ttl", "5s"}),
        with_args("run_option_before_list", {"-r", "@URL", "--ttl", "5s", "--wait", "1s", "list"}),
        with_args("run_option_before_acl", {"--ttl", "5s", "acl"}),
        with_args("redis_option_after_acl", {"acl", "-r", "@URL"}),
        with_args("status_option_for_run", {"-r", "@URL", "--json", "ok", "--", "touch", "ran"}),
        with_args("status_two_names", {"-r", "@URL", "status", "a", "b"}),
        with_args("missing_value", {"-r", "@URL", "ok", "--ttl"}),
        with_args("exit_code_not_a_number", {"-r", "@URL", "--min-replicas", "abc", "ok", "--", "touch", "ran"}),
        with_args("empty_redis_url", {"-r", "", "ok", "--", "touch", "ran"}),
        with_args("user_without_password", {"-r", "redis://bob@127.0.0.1:1", "ok", "--", "touch", "ran"}),
        with_args("tls_option_on_a_plain_url", {"-r", "@URL", "--tls-insecure", "ok", "--", "touch", "ran"}),
        with_args("empty_key_prefix", {"-r", "@URL", "--key-prefix", "", "ok", "--", "touch", "ran"}),
        with_args("fence_file_takes_no_redis", {"-r", "@URL", "fence", "file", "ran"})),
    [](const ::testing::TestParamInfo<UsageCase>& param_info) {
      return std::string(param_info.param.label);
    });

class UsageAcceptedTest : public FencerunTest {};

TEST_F(UsageAcceptedTest, BoundaryValuesAreAccepted) {
  const std::vector<std::vector<std::string>> accepted = {
      {"--ttl", "6s", "--renew", "2s", "--grace", "1s"},     // renew = ttl/3, grace = ttl/6
      {"--ttl", "3000ms", "--renew", "1s", "--grace", "500ms"},
      {"--ttl", "1m", "--renew", "20s", "--grace", "5s"},
      {"--ttl", "1h", "--wait", "inf"},
      {"--ttl", "30", "--wait", "0"},                        // bare integers are seconds
      {"--kill-signal", "INT"},
      {"--kill-signal", "SIGHUP"},
      {"--kill-signal", "9"},
      {"--log-format", "text"},
      {"-q"},
      {"-E", "3", "--lease-lost-exit-code", "100"},
  };
  for (const auto& opts : accepted) {
    std::string label;
    for (const auto& o : opts) label += o + " ";
    auto r = run(sh_args("boundary", "echo $FENCERUN_TTL_MS", opts));
    EXPECT_EQ(r.exit_code, 0) << label << ": " << r;
  }
  auto r2 = run(sh_args("ttl", "echo $FENCERUN_TTL_MS", {"--ttl", "2m"}));
  EXPECT_EQ(r2.out, "120000\n") << r2;
  auto r3 = run(sh_args("ttl", "echo $FENCERUN_TTL_MS", {"--ttl", "45"}));
  EXPECT_EQ(r3.out, "45000\n") << r3;
}

TEST_F(UsageAcceptedTest, MinimumTtlAccepted) {
  // 100ms is accepted. With renewals every 33ms and the stop point ~76ms after acquiring, a loaded
  // machine can legitimately make the lease run short (124); what matters here is that it is not
  // a usage error and that the command saw the TTL when it ran.
  auto r = run(sh_args("ttl", "echo $FENCERUN_TTL_MS", {"--ttl", "100ms"}));
  EXPECT_NE(r.exit_code, 64) << r;
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 124) << r;
  if (r.exit_code == 0) {
    EXPECT_EQ(r.out, "100\n") << r;
  }
  auto r2 = run(sh_args("ttl", "true", {"--ttl", "100ms", "--renew", "33ms", "--grace", "16ms"}));
  EXPECT_TRUE(r2.exit_code == 0 || r2.exit_code == 124) << r2;
}

TEST_F(UsageAcceptedTest, LongestNameAndPunctuationAccepted) {
  const std::string n256(256, 'n');
  auto r = run(sh_args(n256, "echo $FENCERUN_LOCK"));
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(trim(r.out), n256);
  const std::string punct = "a:b/c.d-e_f@g#h!~*";
  auto r2 = run(sh_args(punct, "echo $FENCERUN_LOCK"));
  EXPECT_EQ(r2.exit_code, 0) << r2;
  EXPECT_TRUE(redis().exists(token_key(punct)));
}

TEST_F(UsageAcceptedTest, VersionAndHelp) {
  auto v = run({"--version"});
  EXPECT_EQ(v.exit_code, 0) << v;
  EXPECT_FALSE(v.out.empty());
  auto h = run({"--help"});
  EXPECT_EQ(h.exit_code, 0) << h;
  EXPECT_NE(h.out.find("--ttl"), std::string::npos) << h;
}

// The messages of the grammar: exact first lines, as a user sees them.
TEST_F(UsageAcceptedTest, MessagesNameTheSubcommandAndWhatToDo) {
  struct Case {
    std::vector<std::string> args;
    std::string line;
  };
  const std::vector<Case> cases = {
      {{"lsit", "echo", "hi"},
       "fencerun: 'lsit' is not a subcommand: did you mean 'list'? (to run a command under a lock of that name: "
       "fencerun run lsit ...) (see fencerun --help)"},
      {{"--ttl", "5s", "status", "x"},
       "fencerun: status does not take --ttl (an option of run); see fencerun status --help"},
      {{"status", "x", "--jsn"},
       "fencerun: status: unrecognized option '--jsn', did you mean '--json'? (see fencerun status --help)"},
      {{"job", "--ttl"}, "fencerun: --ttl needs a value (DUR) (see fencerun --help)"},
      {{"-E", "abc", "job", "true"},
       "fencerun: --conflict-exit-code: 'abc' is not an exit code (0-255) (see fencerun --help)"},
      {{"-r", "", "job", "true"},
       "fencerun: -r is empty (an unset variable?): give a URL, or leave -r out to use $FENCERUN_SERVER, "
       "$FENCERUN_REDIS_URL, $REDIS_URL or redis://127.0.0.1:6379 (see fencerun --help)"},
      {{"--server=", "job", "true"},
       "fencerun: --server is empty (an unset variable?): give a URL, or leave --server out to use "
       "$FENCERUN_SERVER, $FENCERUN_REDIS_URL, $REDIS_URL or redis://127.0.0.1:6379 (see fencerun --help)"},
      {{"job"}, "fencerun: missing COMMAND (usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...]) (see fencerun --help)"},
      {{"job", "--"},
       "fencerun: missing COMMAND (usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...]) (see fencerun --help)"},
  };
  for (const auto& c : cases) {
    auto r = run(c.args);
    EXPECT_EQ(r.exit_code, 64) << r;
    EXPECT_EQ(trim(r.err), c.line) << r;
  }
  // A bad URL in the environment names the variable.
  auto env = run({"job", "--", "true"}, {{"FENCERUN_REDIS_URL", "bogus"}});
  EXPECT_EQ(env.exit_code, 64) << env;
  EXPECT_EQ(env.err.rfind("fencerun: $FENCERUN_REDIS_URL: ", 0), 0u) << env;
  auto env2 = run({"job", "--", "true"}, {{"REDIS_URL", "redis://h:http"}});
  EXPECT_EQ(env2.err.rfind("fencerun: $REDIS_URL: ", 0), 0u) << env2;
}

// Each subcommand's --help is its own: its usage line, only its options.
TEST_F(UsageAcceptedTest, EverySubcommandHasItsOwnHelp) {
  const std::string top = run({"--help"}).out;
  for (std::string sub : {"run", "status", "list", "break", "bump", "acl"}) {
    auto r = run({sub, "--help"});
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_NE(r.out, top) << sub;
    EXPECT_NE(r.out.find(" " + sub + " "), std::string::npos) << r;
    EXPECT_EQ(run({"help", sub}).out, r.out) << sub;
    EXPECT_EQ(run({"-v", sub, "--help"}).out, r.out) << sub;
  }
  EXPECT_EQ(run({"status", "--help"}).out.find("--ttl"), std::string::npos);
  EXPECT_NE(run({"bump", "--help"}).out.find("--above"), std::string::npos);
  EXPECT_NE(run({"fence", "redis", "--help"}).out.find("--resource"), std::string::npos);
}

// Global options before a subcommand are the subcommand's, `fence` included.
TEST_F(UsageAcceptedTest, SubcommandsAreRecognisedAfterGlobalOptions) {
  auto held = run(sh_args("g1", "true"));
  ASSERT_EQ(held.exit_code, 0) << held;
  auto before = run({"-r", redis().url(), "--timeout", "1s", "status", "g1"});
  auto after = run({"status", "g1", "-r", redis().url(), "--timeout", "1s"});
  EXPECT_EQ(before.exit_code, 3) << before;
  // The same lines, but for how long ago the run ended.
  const std::regex age(R"(ended [0-9.]+m?s ago)");
  EXPECT_EQ(std::regex_replace(before.out, age, "ended ..."), std::regex_replace(after.out, age, "ended ..."));
  // A first word one edit away from a subcommand took no lock: the server holds only g1's counter.
  auto typo = run({"-r", redis().url(), "lsit", "touch", "ran"});
  EXPECT_EQ(typo.exit_code, 64) << typo;
  EXPECT_FALSE(redis().exists(token_key("lsit")));
  // `run` makes it a lock name.
  auto named = run({"-r", redis().url(), "run", "lsit", "touch", "ran"});
  EXPECT_EQ(named.exit_code, 0) << named;
  EXPECT_TRUE(std::filesystem::exists(file("ran")));
}

// The command sees FENCERUN_SERVERS=1 and none of the FENCERUN_* variables fencerun inherited.
TEST_F(UsageAcceptedTest, TheCommandSeesOnlyThisRunsFencerunVariables) {
  auto r = run(sh_args("envjob", "env | grep ^FENCERUN_ | sort"),
               {{"FENCERUN_SERVERS", "5"}, {"FENCERUN_SLOT", "7"}, {"FENCERUN_FROM_OUTSIDE", "x"},
                {"FENCERUN_CGROUP", "off"}, {"FENCERUN_SENTINEL_PASSWORD", "sentinel-secret"}});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("FENCERUN_SERVERS=1\n"), std::string::npos) << r;
  EXPECT_NE(r.out.find("FENCERUN_SLOT=0\n"), std::string::npos) << r;
  EXPECT_NE(r.out.find("FENCERUN_CONNECTION_FD="), std::string::npos) << r;
  EXPECT_EQ(r.out.find("FENCERUN_FROM_OUTSIDE"), std::string::npos) << r;
  EXPECT_EQ(r.out.find("FENCERUN_CGROUP"), std::string::npos) << r;
  EXPECT_EQ(r.out.find("sentinel-secret"), std::string::npos) << r;
  std::set<std::string> names;
  for (const auto& line : split_lines(r.out)) names.insert(line.substr(0, line.find('=')));
  EXPECT_EQ(names, (std::set<std::string>{"FENCERUN_CONNECTION_FD", "FENCERUN_LIMIT", "FENCERUN_LOCK",
                                          "FENCERUN_OWNER", "FENCERUN_REDIS_URL", "FENCERUN_SERVERS",
                                          "FENCERUN_SLOT", "FENCERUN_TOKEN", "FENCERUN_TTL_MS"}))
      << r;
}

// A user made from `fencerun acl` can do what the rule claims, `--version -r` (PING) included.
TEST_F(UsageAcceptedTest, TheAclRuleCoversVersionAndRuns) {
  auto rule = run({"acl"});
  ASSERT_EQ(rule.exit_code, 0) << rule;
  std::vector<std::string> setuser = {"ACL", "SETUSER", "locker", "on", ">locker-pw"};
  for (const auto& w : split_words(trim(rule.out))) setuser.push_back(w);
  auto reply = redis().cmd(setuser);
  ASSERT_EQ(reply.str, "OK") << reply.str;
  const std::string url = "redis://locker:locker-pw@127.0.0.1:" + std::to_string(redis().port());
  auto version = run({"-r", url, "--version"});
  EXPECT_EQ(version.exit_code, 0) << version;
  EXPECT_NE(version.out.find("server: "), std::string::npos) << version;
  auto job = run({"-r", url, "acljob", "--", "true"});
  EXPECT_EQ(job.exit_code, 0) << job;
  auto status = run({"-r", url, "status", "acljob"});
  EXPECT_EQ(status.exit_code, 3) << status;
  // fence redis inside the job, as that user: the rule plus the command it runs.
  redis().cmd({"ACL", "SETUSER", "locker", "+hset", "~{acljob}:*"});
  auto fenced = run({"-r", url, "acljob", "--", fencerun_binary(), "fence", "redis", "--", "HSET", "{acljob}:h", "f", "v"});
  EXPECT_EQ(fenced.exit_code, 0) << fenced;
}

}  // namespace
}  // namespace fencerun::test
