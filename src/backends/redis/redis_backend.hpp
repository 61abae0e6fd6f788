#pragma once
// The Redis backend: one server, a Sentinel-managed master or a Cluster (redis_lease.hpp for the
// lease). Built by make_backend() (backend.hpp).
#include <memory>
#include <chrono>
#include <string>

#include "lease/backend.hpp"
#include "backends/redis/url.hpp"

namespace fencerun::lease {

// Where a Redis backend's locks live.
struct RedisPlace {
  redis::RedisEndpoint endpoint;
  std::string redacted_url;  // for messages: never a password
  std::string key_prefix;
  std::chrono::milliseconds timeout{2000};  // bound of every request
};

std::unique_ptr<Backend> make_redis_backend(const RedisPlace& target);

// --version -r URL: one server's lines under `label` ("server", "server 2", ...): what it is, where, and
// how a lock is released there. false (logged) when it could not be reached.
bool show_server(const redis::RedisEndpoint& endpoint, const std::string& url, const std::string& label,
                 std::chrono::milliseconds timeout);

}  // namespace fencerun::lease
