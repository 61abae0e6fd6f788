#pragma once
// The lease on one Redis server (or a sentinel-managed master, or a cluster node): SET NX with a TTL
// and a fencing token in one script, renewal by an owner-checked PEXPIRE in a background thread,
// release by compare-and-delete. Waiters subscribe to the lock's release channel.
#include <memory>
#include <string>

#include "backends/redis/url.hpp"
#include "lease/lease.hpp"

namespace fencerun::lease {

struct RedisLeaseTarget {
  redis::RedisEndpoint endpoint;
  std::string redacted_url;  // for messages and FENCERUN_REDIS_URL: never a password
  std::string key_prefix;
};

std::unique_ptr<Lease> make_redis_lease(RedisLeaseTarget target, LeaseRequest request);

}  // namespace fencerun::lease
