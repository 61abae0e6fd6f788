#pragma once
// The backend the configuration names: the one way app/ reaches the locks (lease/backend.hpp).
#include <memory>

#include "config/config.hpp"
#include "lease/backend.hpp"

namespace fencerun::app {

inline std::unique_ptr<lease::Backend> backend_for(const config::CommonConfig& c) {
  return lease::make_backend(
      {c.etcd, c.endpoint, c.redacted_url, c.servers, c.server_urls, c.key_prefix, c.timeout, c.quorum_max_ttl});
}

}  // namespace fencerun::app
