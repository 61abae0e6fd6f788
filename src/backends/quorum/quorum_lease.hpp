#pragma once
// Quorum mode: the lease on 3, 5 or 7 independent Redis servers, held while a majority holds it, with
// a fencing token kept in a majority register (see quorum_lease.cpp for the argument). The same
// Lease / HeldLease interface as the single-server lease; no wait queue (--fair and --limit N > 1 are
// refused by the configuration).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "lease/lease.hpp"
#include "backends/redis/url.hpp"

namespace fencerun::lease {

struct QuorumTarget {
  std::vector<redis::RedisEndpoint> servers;
  std::vector<std::string> redacted_urls;  // by server, for messages and FENCERUN_REDIS_URL: never a password
  std::string key_prefix;
  // The quorum-wide lease cap ($FENCERUN_QUORUM_MAX_TTL): a server that lost NAME's data counts
  // towards no majority until this much (+2% + 10ms) has passed since (quorum_lease.cpp).
  std::chrono::milliseconds max_ttl{60'000};
};

// More than half of `servers`.
inline std::size_t majority_of(std::size_t servers) { return servers / 2 + 1; }

std::unique_ptr<Lease> make_quorum_lease(QuorumTarget target, LeaseRequest request);

}  // namespace fencerun::lease
