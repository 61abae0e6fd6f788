#pragma once
// What a validated configuration's backend target holds, for tests that look inside it (the code
// above the seam sees only lease::Target).
#include <stdexcept>

#include "backends/etcd/target.hpp"
#include "backends/redis/target.hpp"
#include "config/config.hpp"

namespace fencerun::test {

// The Redis endpoint of a configuration whose URL names one Redis server; throws otherwise.
inline const redis::RedisEndpoint& redis_endpoint(const config::CommonConfig& c) {
  const auto* t = dynamic_cast<const redis::RedisUrlTarget*>(c.target.get());
  if (!t) throw std::logic_error("the configuration's backend is not one Redis server");
  return t->endpoint();
}

// The etcd endpoint of a configuration whose URL names an etcd cluster; nullptr otherwise.
inline const etcd::EtcdEndpoint* etcd_endpoint(const config::CommonConfig& c) {
  const auto* t = dynamic_cast<const etcd::EtcdUrlTarget*>(c.target.get());
  return t ? &t->endpoint() : nullptr;
}

}  // namespace fencerun::test
