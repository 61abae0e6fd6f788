#include "lease/backend.hpp"

#include "lease/etcd_backend.hpp"
#include "lease/quorum_backend.hpp"
#include "lease/redis_backend.hpp"

namespace fencerun::lease {

std::unique_ptr<Backend> make_backend(const BackendTarget& target) {
  // First by the URL's scheme: etcd:// and etcds:// name an etcd cluster (its lease and backend in
  // etcd_lease.cpp and etcd_backend.cpp, its connection layer in src/etcd/); every other scheme the
  // configuration accepts (redis, rediss, unix, redis+sentinel, rediss+sentinel) names Redis.
  if (target.etcd) return make_etcd_backend(target);
  //
  // Then, on Redis, by the number of servers: -r given 3, 5 or 7 times is a quorum of independent
  // servers; one server (a Sentinel-managed master, a Cluster) is the Redis backend.
  if (!target.servers.empty()) return make_quorum_backend(target);
  return make_redis_backend(target);
}

}  // namespace fencerun::lease
