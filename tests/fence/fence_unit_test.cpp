// The pure parts of the fence guards: token parsing, argument parsing, the file guard's side record.
#include <gtest/gtest.h>

#include "support/targets.hpp"
#include "config/config.hpp"
#include "fence/fence.hpp"
#include "fence/file_guard.hpp"
#include "fence/redis_guard.hpp"
#include "util/error.hpp"

namespace fencerun::fence {
namespace {

GetEnv env_of(std::optional<std::string> token) {
  return [token](const char* name) -> std::optional<std::string> {
    if (std::string_view(name) == "FENCERUN_TOKEN") return token;
    return std::nullopt;
  };
}

TEST(FenceToken, ParsesPositiveDecimalsBelowTwoToThe53) {
  EXPECT_EQ(parse_token("1"), 1u);
  EXPECT_EQ(parse_token("1718000000000123"), 1718000000000123u);
  EXPECT_EQ(parse_token("9007199254740991"), 9007199254740991u);
  for (const char* bad : {"", "0", "00", "-1", "+1", " 1", "1 ", "1.0", "1e5", "0x10", "abc",
                          "9007199254740992", "18446744073709551616", "99999999999999999999999"})
    EXPECT_FALSE(parse_token(bad).has_value()) << "'" << bad << "'";
}

TEST(FenceToken, OptionBeatsEnvironmentAndNothingIsNeverAnAccept) {
  EXPECT_EQ(resolve_token(std::string("5"), env_of("7")), 5u);
  EXPECT_EQ(resolve_token(std::nullopt, env_of("7")), 7u);
  EXPECT_THROW(resolve_token(std::nullopt, env_of(std::nullopt)), UsageError);
  EXPECT_THROW(resolve_token(std::nullopt, env_of("")), UsageError);
  EXPECT_THROW(resolve_token(std::string("x"), env_of("7")), UsageError);  // a bad option is not skipped
  EXPECT_THROW(resolve_token(std::nullopt, env_of("0")), UsageError);
}

TEST(FenceToken, StaleMessageNamesBothTokens) {
  EXPECT_EQ(stale_message(41, "PATH", 42), "stale token 41 rejected for PATH: it has accepted 42");
}

TEST(FenceArgs, File) {
  auto a = parse_file_args({"--token", "5", "out.json"});
  EXPECT_EQ(a.token, "5");
  EXPECT_EQ(a.path, "out.json");
  a = parse_file_args({"out.json", "--token=6"});
  EXPECT_EQ(a.token, "6");
  a = parse_file_args({"--", "-weird-name"});
  EXPECT_EQ(a.path, "-weird-name");
  EXPECT_FALSE(a.token);
  EXPECT_THROW(parse_file_args({}), UsageError);
  EXPECT_THROW(parse_file_args({"a", "b"}), UsageError);
  EXPECT_THROW(parse_file_args({"--token"}), UsageError);
  EXPECT_THROW(parse_file_args({"--bogus", "a"}), UsageError);
  EXPECT_THROW(parse_file_args({"dir/"}), UsageError);
}

TEST(FenceArgs, RedisPassesCommandThroughUntouched) {
  auto a = parse_redis_args({"-r", "redis://h:1", "--timeout=5s", "--key-prefix", "p:", "--resource", "orders",
                             "--token", "9", "--", "SET", "k", "[%s]", "a,b", "--token", "1", "--"});
  EXPECT_EQ(a.connection.redis_urls, std::vector<std::string>{"redis://h:1"});
  EXPECT_EQ(a.connection.timeout, "5s");
  EXPECT_EQ(a.connection.key_prefix, "p:");
  EXPECT_EQ(a.resource, "orders");
  EXPECT_EQ(a.token, "9");
  EXPECT_EQ(a.command, (std::vector<std::string>{"SET", "k", "[%s]", "a,b", "--token", "1", "--"}));
  a = parse_redis_args({"--resource=r", "GET", "-k"});  // CMD starts at the first non-option
  EXPECT_EQ(a.command, (std::vector<std::string>{"GET", "-k"}));
  a = parse_redis_args({"--token", "3", "SET", "k", "--", "[a,b]"});  // a later `--` belongs to CMD
  EXPECT_EQ(a.command, (std::vector<std::string>{"SET", "k", "--", "[a,b]"}));
  EXPECT_EQ(a.token, "3");
  EXPECT_THROW(parse_redis_args({"--resource", "r"}), UsageError);
  EXPECT_THROW(parse_redis_args({"--resource", "r", "--"}), UsageError);
  EXPECT_THROW(parse_redis_args({"-x", "--", "PING"}), UsageError);
  EXPECT_THROW(parse_redis_args({"--bogus", "1", "PING"}), UsageError);
  EXPECT_THROW(parse_redis_args({"--token"}), UsageError);
  EXPECT_EQ(fence_key("fencerun:", "orders"), "fencerun:{orders}:fence");
}

// The connection options are those of run and status, validated by the same code.
TEST(FenceArgs, RedisTakesTheConnectionOptionsOfRun) {
  auto a = parse_redis_args({"--tls-ca-file", "/ca.pem", "--tls-cert=/c.pem", "--tls-key", "/k.pem",
                             "--tls-server-name", "redis.internal", "--tls-insecure", "-r",
                             "rediss+sentinel://s1:26379/mymaster", "-v", "--log-format", "json", "--", "PING"});
  EXPECT_EQ(a.command, (std::vector<std::string>{"PING"}));
  auto env = [](const char* name) -> std::optional<std::string> {
    if (std::string_view(name) == "FENCERUN_SENTINEL_PASSWORD") return "sentinel-secret";
    if (std::string_view(name) == "FENCERUN_REDIS_PASSWORD") return "redis-secret";
    return std::nullopt;
  };
  config::CommonConfig c = config::make_common_config(a.connection, env);
  EXPECT_EQ(fencerun::test::redis_endpoint(c).tls.ca_file, "/ca.pem");
  EXPECT_EQ(fencerun::test::redis_endpoint(c).tls.cert_file, "/c.pem");
  EXPECT_EQ(fencerun::test::redis_endpoint(c).tls.key_file, "/k.pem");
  EXPECT_EQ(fencerun::test::redis_endpoint(c).tls.server_name, "redis.internal");
  EXPECT_TRUE(fencerun::test::redis_endpoint(c).tls.insecure);
  EXPECT_TRUE(fencerun::test::redis_endpoint(c).sentinel_tls);
  EXPECT_EQ(fencerun::test::redis_endpoint(c).sentinel_password, "sentinel-secret");
  EXPECT_EQ(fencerun::test::redis_endpoint(c).password, "redis-secret");
  EXPECT_EQ(c.redacted_url().find("secret"), std::string::npos);
  EXPECT_EQ(c.log_format, config::LogFormat::json);
  EXPECT_EQ(c.log_level, config::LogLevel::info);

  EXPECT_THROW(config::make_common_config(parse_redis_args({"--tls-key", "/k.pem", "PING"}).connection, env),
               UsageError);
}

TEST(FenceArgs, RedisCommandHasAtMostTheScriptsArgumentLimit) {
  std::vector<std::string> words(k_max_command_words + 1, "x");
  std::vector<std::string_view> args = {"--"};
  args.insert(args.end(), words.begin(), words.end());
  try {
    parse_redis_args(args);
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "fence redis: CMD has 7999 words, at most 7998 fit in one fenced command (Lua's unpack limit in Redis)");
  }
  args.pop_back();
  EXPECT_EQ(parse_redis_args(args).command.size(), k_max_command_words);
}

TEST(FenceSideRecord, ParseFormatAndTheEffectiveToken) {
  auto r = parse_side_record("42\n");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->token, 42u);
  EXPECT_FALSE(r->pending);
  EXPECT_EQ(effective_token(*r, true), 42u);
  EXPECT_TRUE(parse_side_record("42"));  // seeded by hand without a newline

  r = parse_side_record("50\npending 42 .data.0011.tmp\n");
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->pending);
  EXPECT_EQ(r->pending->previous, 42u);
  EXPECT_EQ(r->pending->temp_name, ".data.0011.tmp");
  EXPECT_EQ(effective_token(*r, /*temp_exists=*/true), 42u) << "the data never landed";
  EXPECT_EQ(effective_token(*r, /*temp_exists=*/false), 50u) << "the data landed";
  EXPECT_EQ(format_side_record(*r), "50\npending 42 .data.0011.tmp\n");
  r = parse_side_record("50\npending 0 .data.0011.tmp\n");
  ASSERT_TRUE(r);
  EXPECT_EQ(effective_token(*r, true), 0u);

  for (const char* bad : {"", "\n", "x\n", "0\n", "-3\n", "9007199254740992\n", "50\ngarbage\n",
                          "50\npending 42\n", "50\npending 51 .a.tmp\n", "50\npending 42 ../evil.tmp\n",
                          "50\npending 42 .a/b.tmp\n", "50\npending 42 data\n", "50\npending 42 .a.tmp\nmore\n"})
    EXPECT_FALSE(parse_side_record(bad).has_value()) << "'" << bad << "'";
}

TEST(FenceHelp, MentionsEveryGuard) {
  auto h = help_text();
  for (const char* word : {"fence file", "fence redis", "fence sql postgresql", "FENCERUN_TOKEN", "77", "64"})
    EXPECT_NE(h.find(word), std::string::npos) << word;
  EXPECT_NE(postgresql_schema().find("CREATE OR REPLACE FUNCTION fencerun_admit"), std::string::npos);
}

}  // namespace
}  // namespace fencerun::fence
