#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "backends/redis/url.hpp"

using fencerun::redis::parse_redis_url;
using fencerun::redis::redacted_url;
using fencerun::redis::RedisEndpoint;
using Transport = fencerun::redis::RedisEndpoint::Transport;

namespace {

RedisEndpoint parsed(const std::string& url) {
  auto ep = parse_redis_url(url);
  EXPECT_TRUE(ep.has_value()) << url << ": " << (ep ? "" : ep.error());
  if (ep) return *ep;
  RedisEndpoint failed;
  failed.host = "<parse failed>";
  return failed;
}

std::string error_of(const std::string& url) {
  auto ep = parse_redis_url(url);
  EXPECT_FALSE(ep.has_value()) << url << " parsed";
  return ep ? std::string() : ep.error();
}

}  // namespace

TEST(redis_url, parses_host_and_port) {
  auto ep = parsed("redis://cache.example:6380");
  EXPECT_EQ(ep.transport, Transport::tcp);
  EXPECT_EQ(ep.host, "cache.example");
  EXPECT_EQ(ep.port, 6380);
  EXPECT_EQ(ep.db, 0);
  EXPECT_EQ(ep.user, "");
  EXPECT_EQ(ep.password, std::nullopt);
}

TEST(redis_url, defaults_the_port_to_6379) {
  auto ep = parsed("redis://localhost");
  EXPECT_EQ(ep.host, "localhost");
  EXPECT_EQ(ep.port, 6379);
}

TEST(redis_url, reads_the_database_from_the_path) {
  auto ep = parsed("redis://localhost:6379/3");
  EXPECT_EQ(ep.db, 3);
  EXPECT_EQ(parsed("redis://localhost/15").db, 15);
  EXPECT_EQ(parsed("redis://localhost/").db, 0);
}

TEST(redis_url, reads_the_database_from_the_query) {
  EXPECT_EQ(parsed("redis://localhost?db=4").db, 4);
  EXPECT_EQ(parsed("redis://localhost:7000/?db=5").db, 5);
}

TEST(redis_url, marks_rediss_as_tls) {
  auto ep = parsed("rediss://secure.example:6380/1");
  EXPECT_EQ(ep.transport, Transport::tls);
  EXPECT_EQ(ep.host, "secure.example");
  EXPECT_EQ(ep.port, 6380);
  EXPECT_EQ(ep.db, 1);
}

TEST(redis_url, reads_user_and_password) {
  auto ep = parsed("redis://alice:s3cret@host:6379/2");
  EXPECT_EQ(ep.user, "alice");
  EXPECT_EQ(ep.password, "s3cret");
  EXPECT_EQ(ep.host, "host");
  EXPECT_EQ(ep.db, 2);
}

TEST(redis_url, reads_a_password_without_a_user) {
  auto ep = parsed("redis://:s3cret@host");
  EXPECT_EQ(ep.user, "");
  EXPECT_EQ(ep.password, "s3cret");
  EXPECT_EQ(ep.host, "host");
}

TEST(redis_url, reads_a_user_without_a_password) {
  auto ep = parsed("redis://alice@host");
  EXPECT_EQ(ep.user, "alice");
  EXPECT_EQ(ep.password, std::nullopt);
}

TEST(redis_url, treats_an_empty_password_as_none) {
  auto ep = parsed("redis://alice:@host");
  EXPECT_EQ(ep.user, "alice");
  EXPECT_EQ(ep.password, std::nullopt);
}

TEST(redis_url, decodes_percent_encoded_user_and_password) {
  auto ep = parsed("redis://al%40ice:p%40ss%3Aw%2Fo%25rd@host");
  EXPECT_EQ(ep.user, "al@ice");
  EXPECT_EQ(ep.password, "p@ss:w/o%rd");
}

TEST(redis_url, splits_the_password_at_the_last_at_sign_and_first_colon) {
  auto ep = parsed("redis://bob:pa:ss@word@host:7001");
  EXPECT_EQ(ep.user, "bob");
  EXPECT_EQ(ep.password, "pa:ss@word");
  EXPECT_EQ(ep.host, "host");
  EXPECT_EQ(ep.port, 7001);
}

TEST(redis_url, rejects_bad_percent_encoding) {
  EXPECT_EQ(error_of("redis://al%4gice:pw@host"), "bad percent-encoding in user name");
  EXPECT_EQ(error_of("redis://alice:pw%2@host"), "bad percent-encoding in password");
  EXPECT_EQ(error_of("redis://alice:pw%@host"), "bad percent-encoding in password");
}

TEST(redis_url, parses_ipv6_hosts_in_brackets) {
  auto ep = parsed("redis://[::1]:6380");
  EXPECT_EQ(ep.host, "::1");
  EXPECT_EQ(ep.port, 6380);
  auto no_port = parsed("redis://[fe80::1]/2");
  EXPECT_EQ(no_port.host, "fe80::1");
  EXPECT_EQ(no_port.port, 6379);
  EXPECT_EQ(no_port.db, 2);
}

TEST(redis_url, rejects_malformed_ipv6_hosts) {
  EXPECT_EQ(error_of("redis://[::1:6380"), "unterminated '[' in host");
  EXPECT_EQ(error_of("redis://[::1]6380"), "unexpected text after ']' in host");
}

TEST(redis_url, parses_unix_socket_paths) {
  auto ep = parsed("unix:///run/redis/redis.sock");
  EXPECT_EQ(ep.transport, Transport::unix_socket);
  EXPECT_EQ(ep.path, "/run/redis/redis.sock");
  EXPECT_EQ(ep.db, 0);
}

TEST(redis_url, reads_the_database_of_a_unix_socket_from_the_query) {
  auto ep = parsed("unix:///tmp/redis.sock?db=7");
  EXPECT_EQ(ep.path, "/tmp/redis.sock");
  EXPECT_EQ(ep.db, 7);
}

TEST(redis_url, decodes_percent_encoded_socket_paths) {
  EXPECT_EQ(parsed("unix:///tmp/my%20redis.sock").path, "/tmp/my redis.sock");
  EXPECT_EQ(error_of("unix:///tmp/bad%zz.sock"), "bad percent-encoding in socket path");
}

TEST(redis_url, rejects_relative_socket_paths) {
  EXPECT_EQ(error_of("unix://redis.sock"),
            "unix:// URL needs an absolute socket path (unix:///path/to/redis.sock)");
  EXPECT_EQ(error_of("unix://"), "unix:// URL needs an absolute socket path (unix:///path/to/redis.sock)");
}

TEST(redis_url, rejects_bad_ports) {
  EXPECT_EQ(error_of("redis://host:0"), "the port is not a number from 1 to 65535");
  EXPECT_EQ(error_of("redis://host:65536"), "the port is not a number from 1 to 65535");
  EXPECT_EQ(error_of("redis://host:http"), "the port is not a number from 1 to 65535");
  EXPECT_EQ(error_of("redis://host:-1"), "the port is not a number from 1 to 65535");
  EXPECT_EQ(error_of("redis://host:"), "the port is not a number from 1 to 65535");
  EXPECT_EQ(error_of("redis://[::1]:"), "the port is not a number from 1 to 65535");
  EXPECT_EQ(error_of("redis://host:63 79"), "the port is not a number from 1 to 65535");
}

TEST(redis_url, accepts_the_extreme_ports) {
  EXPECT_EQ(parsed("redis://host:1").port, 1);
  EXPECT_EQ(parsed("redis://host:65535").port, 65535);
}

TEST(redis_url, rejects_unknown_schemes) {
  EXPECT_EQ(error_of("http://host:6379"),
            "unsupported URL scheme 'http' (expected redis://, rediss://, unix:// or redis+sentinel://)");
  EXPECT_EQ(error_of("REDIS://host"),
            "unsupported URL scheme 'REDIS' (expected redis://, rediss://, unix:// or redis+sentinel://)");
}

TEST(redis_url, rejects_text_that_is_not_a_url) {
  EXPECT_EQ(error_of("localhost:6379"), "not a Redis URL (expected redis://, rediss://, unix:// or redis+sentinel://)");
  EXPECT_EQ(error_of(""), "not a Redis URL (expected redis://, rediss://, unix:// or redis+sentinel://)");
}

TEST(redis_url, rejects_a_missing_host) {
  EXPECT_EQ(error_of("redis://"), "URL has no host");
  EXPECT_EQ(error_of("redis://:6379"), "URL has no host");
  EXPECT_EQ(error_of("redis://user:pw@/0"), "URL has no host");
}

TEST(redis_url, rejects_bad_databases) {
  EXPECT_EQ(error_of("redis://host/abc"), "the database is not a non-negative integer");
  EXPECT_EQ(error_of("redis://host/-1"), "the database is not a non-negative integer");
  EXPECT_EQ(error_of("redis://host/1x"), "the database is not a non-negative integer");
  EXPECT_EQ(error_of("redis://host?db="), "the database is not a non-negative integer");
  EXPECT_EQ(error_of("unix:///tmp/r.sock?db=two"), "the database is not a non-negative integer");
}

TEST(redis_url, rejects_unknown_query_parameters) {
  EXPECT_EQ(error_of("redis://host?timeout=5"), "unknown URL parameter (only db is known)");
  EXPECT_EQ(error_of("redis://host?db=1&dbb=2"), "unknown URL parameter (only db is known)");
  EXPECT_EQ(error_of("unix:///tmp/r.sock?database=1"), "unknown URL parameter (only db is known)");
  EXPECT_EQ(error_of("redis+sentinel://s1/main?sentinel_pass=x"),
            "unknown URL parameter (only db and sentinel_user are known)");
}

TEST(redis_url, keeps_the_password_out_of_errors) {
  // Each URL carries the password "hunter2" and is rejected for another reason.
  for (const char* url : {"redis://alice:hunter2@host:http", "redis://:hunter2@host/abc",
                          "redis://alice:hunter2@host?password=hunter2", "redis://alice:hunter2@[::1",
                          "redis://alice:hunter2@", "redis://alice:hunter2@host:99999",
                          "rediss://:hunter2@[::1]x", "redis://alice:hunter2%zz@host",
                          "redis://alice:hunter2:6379@host:0"}) {
    auto ep = parse_redis_url(url);
    ASSERT_FALSE(ep.has_value()) << url;
    EXPECT_EQ(ep.error().find("hunter2"), std::string::npos) << url << " -> " << ep.error();
  }
}

TEST(redis_url, keeps_a_password_with_unencoded_delimiters_out_of_errors) {
  // '/', '?' and '#' must be percent-encoded in a password; a user who forgets must not see the
  // password echoed back in the error (it ends up in logs and cron mail).
  for (const char* url : {"redis://alice:hunter2/x@host", "redis://alice:hunter2?x@host",
                          "redis://:hunter2/x@host:6379", "redis://alice:hunter2#x@host"}) {
    auto ep = parse_redis_url(url);
    if (ep) {  // accepting the URL is fine too; leaking the password is not
      EXPECT_EQ(redacted_url(*ep).find("hunter2"), std::string::npos) << url << " -> " << redacted_url(*ep);
      continue;
    }
    EXPECT_EQ(ep.error().find("hunter2"), std::string::npos) << url << " -> " << ep.error();
  }
}

TEST(redis_url, redacts_the_password) {
  EXPECT_EQ(redacted_url(parsed("redis://alice:hunter2@host:6380/2")), "redis://alice@host:6380/2");
  EXPECT_EQ(redacted_url(parsed("redis://:hunter2@host")), "redis://host:6379");
  EXPECT_EQ(redacted_url(parsed("rediss://alice:hunter2@host")), "rediss://alice@host:6379");
}

TEST(redis_url, redacts_a_password_that_came_from_the_environment) {
  RedisEndpoint ep = parsed("redis://host");
  ep.password = "hunter2";
  EXPECT_EQ(redacted_url(ep), "redis://host:6379");
}

TEST(redis_url, renders_canonical_urls) {
  EXPECT_EQ(redacted_url(parsed("redis://localhost")), "redis://localhost:6379");
  EXPECT_EQ(redacted_url(parsed("redis://localhost?db=4")), "redis://localhost:6379/4");
  EXPECT_EQ(redacted_url(parsed("redis://localhost/0")), "redis://localhost:6379");
  EXPECT_EQ(redacted_url(parsed("redis://[::1]:6380")), "redis://[::1]:6380");
  EXPECT_EQ(redacted_url(parsed("unix:///tmp/redis.sock")), "unix:///tmp/redis.sock");
  EXPECT_EQ(redacted_url(parsed("unix:///tmp/redis.sock?db=7")), "unix:///tmp/redis.sock?db=7");
  EXPECT_EQ(redacted_url(RedisEndpoint{}), "redis://127.0.0.1:6379");
}

TEST(redis_url, percent_encodes_the_user_in_redacted_urls) {
  EXPECT_EQ(redacted_url(parsed("redis://al%40ice%3A1:pw@host")), "redis://al%40ice%3A1@host:6379");
}

TEST(redis_url, redacted_urls_parse_back_to_the_same_endpoint_without_password) {
  for (const char* url : {"redis://alice:pw@host:6380/2", "rediss://:pw@[::1]:7000", "redis://al%40ice:pw@h/9",
                          "unix:///tmp/redis.sock?db=3", "redis://10.0.0.1"}) {
    RedisEndpoint ep = parsed(url);
    RedisEndpoint back = parsed(redacted_url(ep));
    EXPECT_EQ(back.transport, ep.transport) << url;
    EXPECT_EQ(back.host, ep.host) << url;
    EXPECT_EQ(back.port, ep.port) << url;
    EXPECT_EQ(back.path, ep.path) << url;
    EXPECT_EQ(back.db, ep.db) << url;
    EXPECT_EQ(back.user, ep.user) << url;
    EXPECT_EQ(back.password, std::nullopt) << url;
  }
}

// Sentinel URLs: redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/MASTER[?db=N].

using fencerun::redis::HostPort;

TEST(redis_url, parses_sentinel_urls) {
  auto ep = parsed("redis+sentinel://s1.example:26379,s2.example:26380/mymaster?db=2");
  EXPECT_EQ(ep.transport, Transport::sentinel);
  EXPECT_FALSE(ep.sentinel_tls);
  EXPECT_EQ(ep.sentinels, (std::vector<HostPort>{{"s1.example", 26379}, {"s2.example", 26380}}));
  EXPECT_EQ(ep.master_name, "mymaster");
  EXPECT_EQ(ep.db, 2);
  EXPECT_EQ(ep.host, "");
  EXPECT_EQ(ep.port, 0);
}

TEST(redis_url, defaults_sentinel_ports_to_26379) {
  auto ep = parsed("redis+sentinel://s1,[::1],s3:5000/main");
  EXPECT_EQ(ep.sentinels, (std::vector<HostPort>{{"s1", 26379}, {"::1", 26379}, {"s3", 5000}}));
}

TEST(redis_url, marks_rediss_sentinel_as_tls) {
  auto ep = parsed("rediss+sentinel://s1:26379/main");
  EXPECT_EQ(ep.transport, Transport::sentinel);
  EXPECT_TRUE(ep.sentinel_tls);
}

TEST(redis_url, reads_the_master_credentials_and_the_sentinel_user) {
  auto ep = parsed("redis+sentinel://alice:hunter2@s1:26379/main?sentinel_user=watcher%40ops");
  EXPECT_EQ(ep.user, "alice");
  EXPECT_EQ(ep.password, "hunter2");
  EXPECT_EQ(ep.sentinel_user, "watcher@ops");
  EXPECT_EQ(ep.sentinel_password, std::nullopt);
}

TEST(redis_url, decodes_a_percent_encoded_master_name) {
  EXPECT_EQ(parsed("redis+sentinel://s1/my%20master").master_name, "my master");
}

TEST(redis_url, rejects_a_sentinel_url_without_a_master_name) {
  const char* k_message = "redis+sentinel:// URL needs the master name as its path (.../MASTER)";
  EXPECT_EQ(error_of("redis+sentinel://s1:26379"), k_message);
  EXPECT_EQ(error_of("redis+sentinel://s1:26379/"), k_message);
  EXPECT_EQ(error_of("redis+sentinel://s1:26379/a/b"), k_message);
  EXPECT_EQ(error_of("redis+sentinel://s1:26379/bad%zz"), k_message);
}

TEST(redis_url, rejects_bad_sentinel_addresses) {
  EXPECT_EQ(error_of("redis+sentinel://s1,,s2/main"), "URL has no host");
  EXPECT_EQ(error_of("redis+sentinel://s1:0/main"), "the port is not a number from 1 to 65535");
  EXPECT_EQ(error_of("redis+sentinel:///main"), "URL has no host");
}

TEST(redis_url, accepts_sentinel_user_only_in_sentinel_urls) {
  EXPECT_EQ(error_of("redis://host?sentinel_user=bob"), "unknown URL parameter (only db is known)");
  EXPECT_EQ(error_of("redis+sentinel://s1/main?sentinel_user=b%zz"), "bad percent-encoding in sentinel_user");
}

TEST(redis_url, redacts_sentinel_urls) {
  EXPECT_EQ(redacted_url(parsed("redis+sentinel://alice:hunter2@s1,[::1]:26380/main?db=2&sentinel_user=bob")),
            "redis+sentinel://alice@s1:26379,[::1]:26380/main?db=2&sentinel_user=bob");
  EXPECT_EQ(redacted_url(parsed("rediss+sentinel://:hunter2@s1:26379/main")), "rediss+sentinel://s1:26379/main");
  RedisEndpoint ep = parsed("redis+sentinel://s1/main");
  ep.sentinel_password = "hunter3";
  ep.password = "hunter4";
  EXPECT_EQ(redacted_url(ep), "redis+sentinel://s1:26379/main");
}

TEST(redis_url, redacted_sentinel_urls_parse_back_to_the_same_endpoint) {
  RedisEndpoint ep = parsed("redis+sentinel://al%40ice:pw@s1:1,[fe80::1]:2,s3/my%20master?db=4&sentinel_user=b%2Fb");
  RedisEndpoint back = parsed(redacted_url(ep));
  EXPECT_EQ(back.transport, Transport::sentinel);
  EXPECT_EQ(back.sentinels, ep.sentinels);
  EXPECT_EQ(back.master_name, "my master");
  EXPECT_EQ(back.db, 4);
  EXPECT_EQ(back.user, "al@ice");
  EXPECT_EQ(back.sentinel_user, "b/b");
  EXPECT_EQ(back.password, std::nullopt);
}
