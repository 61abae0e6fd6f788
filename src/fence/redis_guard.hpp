#pragma once
// The Redis guard: one script (src/fence/scripts/fence.lua) compares the token with
// <prefix>{R}:fence, rejects an older one, else runs CMD and records the token, atomically.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/redis/url.hpp"

namespace fencerun::fence {

struct RedisGuard {
  redis::RedisEndpoint endpoint;
  std::chrono::milliseconds timeout{2000};
  std::string fence_key;  // <prefix>{R}:fence
  std::uint64_t token = 0;
  std::vector<std::string> command;
};

// <prefix>{resource}:fence
std::string fence_key(std::string_view prefix, std::string_view resource);

// Runs the guard; prints CMD's reply like redis-cli on stdout. Returns 0, 77 (stale), 1 (error reply
// from CMD, printed on stderr) or 69 (Redis unreachable, failing, or a timeout).
int run_redis_guard(const RedisGuard& guard);

}  // namespace fencerun::fence
