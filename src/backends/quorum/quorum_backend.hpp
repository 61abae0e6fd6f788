#pragma once
// The quorum backend: 3, 5 or 7 independent Redis servers (quorum_lease.hpp for the lease). status and
// list show what each server says and what a majority says; it has no break or bump (its registry
// row declares so). Built by its Target (target.hpp).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backends/redis/url.hpp"
#include "lease/backend.hpp"

namespace fencerun::lease {

// Where a quorum's locks live.
struct QuorumPlace {
  std::vector<redis::RedisEndpoint> servers;
  std::vector<std::string> server_urls;  // by server, redacted
  std::string key_prefix;
  std::chrono::milliseconds timeout{2000};
  std::chrono::milliseconds quorum_max_ttl{60'000};  // $FENCERUN_QUORUM_MAX_TTL (quorum_limits.hpp)
};

std::unique_ptr<Backend> make_quorum_backend(const QuorumPlace& target);

}  // namespace fencerun::lease
