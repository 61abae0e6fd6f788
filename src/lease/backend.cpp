#include "lease/backend.hpp"

#include "lease/quorum_backend.hpp"
#include "lease/redis_backend.hpp"

namespace fencerun::lease {

std::unique_ptr<Backend> make_backend(const BackendTarget& target) {
  // First by the URL's scheme. Every scheme the configuration accepts today (redis, rediss, unix,
  // redis+sentinel, rediss+sentinel) names Redis; it refuses any other, etcd:// and etcds:// included
  // (redis::parse_url). An etcd backend plugs in here, ahead of the Redis ones: its own lease and
  // backend in src/lease/, its connection layer in src/etcd/, and the configuration accepting its URLs.
  //
  // Then, on Redis, by the number of servers: -r given 3, 5 or 7 times is a quorum of independent
  // servers; one server (a Sentinel-managed master, a Cluster) is the Redis backend.
  if (!target.servers.empty()) return make_quorum_backend(target);
  return make_redis_backend(target);
}

}  // namespace fencerun::lease
