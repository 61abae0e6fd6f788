#pragma once
// list's walk of one server: SCAN over NAME's keys (bounded COUNT, never KEYS), on every master when
// the server is a Cluster, then each lock found read as status reads it. And the progress line a long
// walk shows on a terminal.
#include <chrono>
#include <cstddef>
#include <expected>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backends/redis/lease_client.hpp"
#include "backends/redis/client.hpp"
#include "backends/redis/url.hpp"
#include "util/clock.hpp"

namespace fencerun::lease {

// What one server's walk found: each matching lock's status, by name (sorted).
using Listing = std::map<std::string, LockStatus>;
struct ListFailure {
  redis::Error error;
  std::string lock;  // the lock being read when it failed; empty during the walk
};
using ProgressReport = std::function<void(std::size_t keys, std::size_t locks)>;

// Walks the server at `endpoint` for the locks under `key_prefix` whose NAME matches `pattern`; every
// request is bounded by `timeout`. `report` hears how far it got.
std::expected<Listing, ListFailure> walk(const redis::RedisEndpoint& endpoint, const std::string& key_prefix,
                                         const std::string& pattern, std::chrono::milliseconds timeout,
                                         const ProgressReport& report);

}  // namespace fencerun::lease
