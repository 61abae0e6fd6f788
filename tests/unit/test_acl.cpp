#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "app/app.hpp"
#include "backends/redis/lease_client.hpp"

using fencerun::app::acl_rule;
namespace fs = std::filesystem;

namespace {

std::set<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::set<std::string> out;
  for (std::string w; in >> w;) out.insert(w);
  return out;
}

// Every command the lease scripts run through redis.call / redis.pcall, lower-cased.
std::set<std::string> script_commands() {
  std::set<std::string> out;
  std::regex call(R"(redis\.p?call\(\s*['"]([A-Za-z]+)['"])");
  for (const auto& entry : fs::directory_iterator(fs::path(FENCERUN_SOURCE_DIR) / "src" / "backends" / "redis" / "scripts")) {
    if (entry.path().extension() != ".lua") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    std::string s = text.str();
    for (auto it = std::sregex_iterator(s.begin(), s.end(), call); it != std::sregex_iterator(); ++it) {
      std::string name = (*it)[1];
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      out.insert(name);
    }
  }
  return out;
}

// Does the ACL key pattern (a Redis glob with only '*' and escapes here) match `key`?
bool glob_matches(const std::string& pattern, const std::string& key) {
  std::string literal;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      literal += pattern[++i];
    } else if (pattern[i] == '*' && i + 1 == pattern.size()) {
      return key.starts_with(literal);
    } else {
      literal += pattern[i];
    }
  }
  return key == literal;
}

}  // namespace

TEST(acl_rule, limits_keys_and_channels_to_the_prefix) {
  auto rule = words(acl_rule("fencerun:", false));
  EXPECT_TRUE(rule.contains("resetkeys"));
  EXPECT_TRUE(rule.contains("~fencerun:*"));
  EXPECT_TRUE(rule.contains("resetchannels"));
  EXPECT_TRUE(rule.contains("&fencerun:*"));
  EXPECT_TRUE(rule.contains("-@all"));
}

TEST(acl_rule, starts_from_nothing_before_allowing_commands) {
  std::string rule = acl_rule("fencerun:", false);
  auto deny = rule.find("-@all");
  ASSERT_NE(deny, std::string::npos);
  EXPECT_LT(deny, rule.find('+'));
}

TEST(acl_rule, allows_every_command_the_lease_scripts_run) {
  auto commands = script_commands();
  ASSERT_FALSE(commands.empty());
  auto rule = words(acl_rule("fencerun:", false));
  for (const auto& c : commands) EXPECT_TRUE(rule.contains("+" + c)) << c << " is run by a script but not allowed";
}

TEST(acl_rule, allows_the_commands_fencerun_sends_itself) {
  auto rule = words(acl_rule("fencerun:", false));
  for (const char* c : {"evalsha", "eval", "get", "pttl", "select", "role", "asking", "wait", "subscribe", "publish",
                        "hello", "command|info"})
    EXPECT_TRUE(rule.contains(std::string("+") + c)) << c;
}

TEST(acl_rule, allows_delex_and_delifeq_only_when_asked) {
  EXPECT_FALSE(words(acl_rule("fencerun:", false)).contains("+delex"));
  EXPECT_TRUE(words(acl_rule("fencerun:", true)).contains("+delex"));
  EXPECT_FALSE(words(acl_rule("fencerun:", false)).contains("+delifeq"));
  EXPECT_TRUE(words(acl_rule("fencerun:", false, true)).contains("+delifeq"));
  EXPECT_FALSE(words(acl_rule("fencerun:", false, true)).contains("+delex"));
}

TEST(acl_rule, allows_of_command_only_its_info_subcommand) {
  auto rule = words(acl_rule("fencerun:", true, true));
  EXPECT_FALSE(rule.contains("+command"));
  EXPECT_TRUE(rule.contains("+command|info"));
}

TEST(acl_rule, allows_nothing_dangerous) {
  auto rule = words(acl_rule("fencerun:", true, true, true));
  for (const char* c : {"+@all", "+flushall", "+flushdb", "+keys", "+config", "+script", "+debug", "+shutdown",
                        "+acl", "+@admin", "+@dangerous", "allkeys", "allchannels", "allcommands", "~*", "&*"})
    EXPECT_FALSE(rule.contains(c)) << c;
}

TEST(acl_rule, escapes_glob_characters_in_the_prefix) {
  auto rule = words(acl_rule("a*b?[c]\\:", false));
  EXPECT_TRUE(rule.contains("~a\\*b\\?\\[c\\]\\\\:*"));
  EXPECT_TRUE(rule.contains("&a\\*b\\?\\[c\\]\\\\:*"));
}

TEST(acl_rule, key_pattern_covers_the_lock_keys_and_nothing_outside_the_prefix) {
  for (std::string prefix : {"fencerun:", "jobs:*:", "x"}) {
    auto rule = words(acl_rule(prefix, false));
    std::string pattern;
    for (const auto& w : rule)
      if (w.starts_with("~")) pattern = w.substr(1);
    ASSERT_FALSE(pattern.empty()) << prefix;
    auto keys = fencerun::lease::keys_for(prefix, "nightly");
    EXPECT_TRUE(glob_matches(pattern, keys.lock)) << pattern << " vs " << keys.lock;
    EXPECT_TRUE(glob_matches(pattern, keys.token)) << pattern << " vs " << keys.token;
    EXPECT_FALSE(glob_matches(pattern, "other:{nightly}:lock")) << pattern;
  }
}

TEST(acl_rule, admin_adds_what_list_sends_and_nothing_else) {
  const std::string run = acl_rule("fencerun:", false);
  const std::string admin = acl_rule("fencerun:", false, false, true);
  EXPECT_EQ(admin, run + " +scan +cluster|nodes");
}
