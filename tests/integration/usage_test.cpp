// Usage errors: exit 64, a one-line message on stderr, nothing written to Redis, the command not
// run. And the boundary cases that must be accepted.
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
        with_args("run_bad_ttl", {"run", "-r", "@URL", "--ttl", "nope", "ok", "--", "touch", "ran"})),
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

}  // namespace
}  // namespace fencerun::test
