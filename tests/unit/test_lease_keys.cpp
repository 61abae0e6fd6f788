#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "backends/redis/lease_client.hpp"

using fencerun::lease::Holder;
using fencerun::lease::keys_for;
using fencerun::lease::parse_holder;
using fencerun::lease::release_path;
using fencerun::lease::release_path_name;
using fencerun::lease::ReleasePath;

namespace {

// The part of a key Redis Cluster hashes: the text between the first '{' and the next '}', when not empty.
std::string_view hash_tag(std::string_view key) {
  auto open = key.find('{');
  if (open == std::string_view::npos) return key;
  auto close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

}  // namespace

TEST(lock_keys, puts_the_name_in_a_hash_tag_after_the_prefix) {
  auto keys = keys_for("fencerun:", "nightly");
  EXPECT_EQ(keys.lock, "fencerun:{nightly}:lock");
  EXPECT_EQ(keys.token, "fencerun:{nightly}:token");
}

TEST(lock_keys, name_the_queue_keys_and_each_waiters_wake_channel) {
  auto keys = keys_for("fencerun:", "nightly");
  EXPECT_EQ(keys.queue, "fencerun:{nightly}:queue");
  EXPECT_EQ(keys.tickets, "fencerun:{nightly}:tickets");
  EXPECT_EQ(keys.turn, "fencerun:{nightly}:turn");
  EXPECT_EQ(keys.wake_channel("0123abcd"), "fencerun:{nightly}:wake:0123abcd");
}

TEST(lock_keys, uses_the_given_prefix) {
  auto keys = keys_for("jobs:", "db/backup");
  EXPECT_EQ(keys.lock, "jobs:{db/backup}:lock");
  EXPECT_EQ(keys.token, "jobs:{db/backup}:token");
  EXPECT_EQ(keys_for("", "x").lock, "{x}:lock");
}

TEST(lock_keys, share_one_cluster_slot) {
  for (std::string_view name : {"nightly", "a", "db/backup:eu-1", "x:lock"}) {
    auto keys = keys_for("fencerun:", name);
    EXPECT_EQ(hash_tag(keys.lock), name);
    EXPECT_EQ(hash_tag(keys.token), name);
    EXPECT_EQ(hash_tag(keys.queue), name);
    EXPECT_EQ(hash_tag(keys.tickets), name);
    EXPECT_EQ(hash_tag(keys.turn), name);
    EXPECT_EQ(hash_tag(keys.limit), name);
    EXPECT_EQ(hash_tag(keys.turns), name);
    EXPECT_EQ(hash_tag(keys.slot(0)), name);
    EXPECT_EQ(hash_tag(keys.slot(1023)), name);
  }
}

TEST(lock_keys, name_a_counting_locks_limit_slots_and_turns) {
  auto keys = keys_for("fencerun:", "deploy");
  EXPECT_EQ(keys.limit, "fencerun:{deploy}:limit");
  EXPECT_EQ(keys.turns, "fencerun:{deploy}:turns");
  EXPECT_EQ(keys.slot(0), "fencerun:{deploy}:slot:0");
  EXPECT_EQ(keys.slot(17), "fencerun:{deploy}:slot:17");
  EXPECT_EQ(keys.token, "fencerun:{deploy}:token");  // one counter for every slot
}

TEST(lock_holder, parses_all_four_fields) {
  Holder h = parse_holder("0123456789abcdef0123456789abcdef 41 12345 build-host");
  EXPECT_EQ(h.owner, "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(h.token, 41u);
  EXPECT_EQ(h.pid, 12345);
  EXPECT_EQ(h.host, "build-host");
}

TEST(lock_holder, keeps_spaces_in_the_host_field) {
  EXPECT_EQ(parse_holder("owner 1 2 my laptop").host, "my laptop");
}

TEST(lock_holder, parses_tokens_up_to_two_to_the_53) {
  EXPECT_EQ(parse_holder("owner 9007199254740991 1 h").token, 9'007'199'254'740'991u);
}

TEST(lock_holder, leaves_missing_fields_empty) {
  Holder h = parse_holder("owner");
  EXPECT_EQ(h.owner, "owner");
  EXPECT_EQ(h.token, std::nullopt);
  EXPECT_EQ(h.pid, std::nullopt);
  EXPECT_EQ(h.host, "");
  Holder two = parse_holder("owner 7");
  EXPECT_EQ(two.token, 7u);
  EXPECT_EQ(two.pid, std::nullopt);
}

TEST(lock_holder, leaves_malformed_numbers_empty) {
  Holder h = parse_holder("owner seven -3x host");
  EXPECT_EQ(h.owner, "owner");
  EXPECT_EQ(h.token, std::nullopt);
  EXPECT_EQ(h.pid, std::nullopt);
  EXPECT_EQ(h.host, "host");
  EXPECT_EQ(parse_holder("owner -1").token, std::nullopt);
  EXPECT_EQ(parse_holder("owner 99999999999999999999999").token, std::nullopt);
}

TEST(lock_holder, reads_a_value_set_by_something_else_as_the_owner) {
  EXPECT_EQ(parse_holder("locked").owner, "locked");
  Holder empty = parse_holder("");
  EXPECT_EQ(empty.owner, "");
  EXPECT_EQ(empty.token, std::nullopt);
}

TEST(release_path, follows_the_servers_command_table) {
  using fencerun::redis::ServerInfo;
  EXPECT_EQ(release_path(std::nullopt), ReleasePath::script);  // not probed (yet)
  EXPECT_EQ(release_path(ServerInfo{"redis", "7.0.15", "h:1", false, false}), ReleasePath::script);
  EXPECT_EQ(release_path(ServerInfo{"valkey", "9.0.0", "h:1", true, false}), ReleasePath::delifeq);
  EXPECT_EQ(release_path(ServerInfo{"redis", "8.4.0", "h:1", false, true}), ReleasePath::delex);
  // Valkey 9.2 has both: DELIFEQ, which takes no options.
  EXPECT_EQ(release_path(ServerInfo{"valkey", "9.2.0", "h:1", true, true}), ReleasePath::delifeq);
  EXPECT_EQ(release_path_name(ReleasePath::delifeq), "DELIFEQ");
  EXPECT_EQ(release_path_name(ReleasePath::delex), "DELEX");
  EXPECT_EQ(release_path_name(ReleasePath::script), "script");
}
