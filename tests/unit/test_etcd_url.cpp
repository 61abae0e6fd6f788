// etcd URLs and the configuration's rules for a run on etcd: pure logic, no cluster.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "support/targets.hpp"
#include "config/config.hpp"
#include "backends/etcd/client.hpp"
#include "backends/etcd/url.hpp"
#include "backends/etcd/etcd_lease.hpp"
#include "backends/etcd/records_lease_id.hpp"
#include "util/error.hpp"

using fencerun::etcd::parse_etcd_url;
using fencerun::etcd::redacted_url;

namespace {

std::string error_of(const std::string& url) {
  auto ep = parse_etcd_url(url);
  EXPECT_FALSE(ep.has_value()) << url << " parsed";
  return ep ? std::string() : ep.error();
}

}  // namespace

TEST(etcd_url, parses_members_in_order_with_the_default_port) {
  auto ep = parse_etcd_url("etcd://10.0.0.1:2381,node-b,[::1]:2390");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_FALSE(ep->tls);
  ASSERT_EQ(ep->members.size(), 3u);
  EXPECT_EQ(ep->members[0].host, "10.0.0.1");
  EXPECT_EQ(ep->members[0].port, 2381);
  EXPECT_EQ(ep->members[1].host, "node-b");
  EXPECT_EQ(ep->members[1].port, 2379);
  EXPECT_EQ(ep->members[2].host, "::1");
  EXPECT_EQ(redacted_url(*ep), "etcd://10.0.0.1:2381,node-b:2379,[::1]:2390");
  EXPECT_EQ(fencerun::etcd::member_base(*ep, 2), "http://[::1]:2390");
}

TEST(etcd_url, tls_scheme_and_user_without_the_password_in_the_redacted_form) {
  auto ep = parse_etcd_url("etcds://fence%2Drun:s3cr%40t@h1:1,h2:2");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_TRUE(ep->tls);
  EXPECT_EQ(ep->user, "fence-run");
  EXPECT_EQ(ep->password, "s3cr@t");
  EXPECT_EQ(redacted_url(*ep), "etcds://fence-run@h1:1,h2:2");
  EXPECT_EQ(redacted_url(*ep).find("s3cr"), std::string::npos);
  EXPECT_EQ(fencerun::etcd::member_base(*ep, 0), "https://h1:1");
}

TEST(etcd_url, refuses_what_is_not_one_cluster_of_members) {
  EXPECT_NE(error_of("etcd://").find("no host"), std::string::npos);
  EXPECT_NE(error_of("etcd://h:0").find("port"), std::string::npos);
  EXPECT_NE(error_of("etcd://h:99999").find("port"), std::string::npos);
  EXPECT_NE(error_of("etcd://h:2379/path").find("no path"), std::string::npos);
  EXPECT_NE(error_of("etcd://h:2379?x=1").find("no path"), std::string::npos);
  EXPECT_NE(error_of("etcd://h:1,H:1").find("twice"), std::string::npos);
  EXPECT_NE(error_of("etcd://h:1,,h:2").find("no host"), std::string::npos);
  EXPECT_NE(error_of("etcd://:pw@h:1").find("no user name"), std::string::npos);
  // A message never quotes the password.
  EXPECT_EQ(error_of("etcd://u:hunter2@h:1/x").find("hunter2"), std::string::npos);
  EXPECT_TRUE(fencerun::etcd::is_etcd_url("etcds://x"));
  EXPECT_FALSE(fencerun::etcd::is_etcd_url("redis://x"));
}

TEST(etcd_keys, one_key_per_lease_under_the_locks_prefix) {
  auto keys = fencerun::lease::etcd_keys_for("fencerun:", "nightly");
  EXPECT_EQ(keys.prefix, "fencerun:{nightly}:wait/");
  EXPECT_EQ(keys.base, "fencerun:{nightly}:base");
  EXPECT_EQ(keys.rule, "fencerun:{nightly}:rule");
  EXPECT_EQ(keys.key(0x694d8a1f2b3c4d5eLL), "fencerun:{nightly}:wait/694d8a1f2b3c4d5e");
  EXPECT_EQ(fencerun::lease::lease_hex(1), "0000000000000001");
  // A NAME holds no '}', so no lock's prefix is another's.
  EXPECT_EQ(fencerun::etcd::prefix_end("fencerun:{a}:wait/"), "fencerun:{a}:wait0");
  EXPECT_EQ(fencerun::etcd::prefix_end(std::string("a\xff", 2)), "b");
}

namespace {

using fencerun::config::Options;

fencerun::config::Config configure(Options o, std::map<std::string, std::string> env = {}) {
  return fencerun::config::make_config(
      o,
      [&env](const char* name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      [](std::string_view) -> std::optional<int> { return 15; });
}

std::string usage_error(Options o, std::map<std::string, std::string> env = {}) {
  try {
    configure(std::move(o), std::move(env));
  } catch (const fencerun::UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

Options etcd_run(std::string url = "etcd://127.0.0.1:2379,127.0.0.1:2479") {
  Options o;
  o.redis_urls = {std::move(url)};
  o.lock_name = "nightly";
  o.command = {"true"};
  return o;
}

}  // namespace

TEST(etcd_config, a_run_on_etcd_keeps_the_cluster_and_its_password_from_the_environment) {
  auto c = configure(etcd_run("etcd://fencerun@127.0.0.1:2379"), {{"FENCERUN_ETCD_PASSWORD", "pw"}});
  const auto* endpoint = fencerun::test::etcd_endpoint(c.common);
  ASSERT_NE(endpoint, nullptr);
  EXPECT_EQ(endpoint->password.value_or(""), "pw");
  EXPECT_EQ(c.common.redacted_url(), "etcd://fencerun@127.0.0.1:2379");
  EXPECT_EQ(c.common.server_kind(), "etcd");
  EXPECT_NE(usage_error(etcd_run("etcd://fencerun@127.0.0.1:2379")).find("FENCERUN_ETCD_PASSWORD"),
            std::string::npos);
}

TEST(etcd_config, refuses_what_etcd_cannot_honour) {
  auto o = etcd_run();
  o.ttl = "2500ms";
  EXPECT_NE(usage_error(o).find("whole seconds"), std::string::npos);
  o.ttl = "1s";
  EXPECT_NE(usage_error(o).find("whole seconds"), std::string::npos);
  o.ttl = "2s";
  EXPECT_EQ(usage_error(o), "<no error>");
  o = etcd_run();
  o.limit = "2";
  EXPECT_NE(usage_error(o).find("--limit"), std::string::npos);
  o = etcd_run();
  o.min_replicas = 1;
  EXPECT_NE(usage_error(o).find("not supported on etcd (an etcd cluster): not needed"), std::string::npos);
  o = etcd_run();
  o.subcommand = fencerun::config::Subcommand::bump;
  o.command.clear();
  o.bump_above = "5";
  EXPECT_NE(usage_error(o).find("not supported on etcd (an etcd cluster): not needed"), std::string::npos);
  o = etcd_run();
  o.min_interval = "1h";  // the record of runs is kept on etcd too
  EXPECT_EQ(usage_error(o), "<no error>");
  o = etcd_run();
  o.tls_insecure = true;
  EXPECT_NE(usage_error(o).find("etcds://"), std::string::npos);
  o = etcd_run();
  o.redis_urls = {"etcd://a:1", "etcd://b:1", "etcd://c:1"};
  EXPECT_NE(usage_error(o).find("one cluster"), std::string::npos);
}

// The records' lease id is part of the format every host of a fleet shares: it must never change.
TEST(etcd_records_lease_id, is_stable_positive_and_per_name_and_ttl) {
  using fencerun::lease::etcd_records_lease_id;
  const auto a = etcd_records_lease_id("fencerun:{nightly}:runs", 2592000);
  EXPECT_EQ(a, etcd_records_lease_id("fencerun:{nightly}:runs", 2592000));
  EXPECT_GT(a, 0);
  EXPECT_NE(a, etcd_records_lease_id("fencerun:{nightly}:runs", 3));
  EXPECT_NE(a, etcd_records_lease_id("fencerun:{hourly}:runs", 2592000));
  // FNV-1a 64 of "fencerun:{nightly}:runs 2592000", top bit cleared.
  EXPECT_EQ(a, 0x661943150706d9c2LL);
}
