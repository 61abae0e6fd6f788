#pragma once
// The etcd backend: locks on an etcd cluster (etcd_lease.hpp), with status, list, break and the
// members' versions; no bump (a token never goes back on etcd: its registry row says why). Built by
// its Target (target.hpp).
#include <chrono>
#include <memory>
#include <string>

#include "backends/etcd/url.hpp"
#include "lease/backend.hpp"

namespace fencerun::lease {

// Where an etcd backend's locks live.
struct EtcdPlace {
  etcd::EtcdEndpoint endpoint;
  std::string redacted_url;  // never a password
  std::string key_prefix;
  std::chrono::milliseconds timeout{2000};
};

std::unique_ptr<Backend> make_etcd_backend(const EtcdPlace& target);

}  // namespace fencerun::lease
