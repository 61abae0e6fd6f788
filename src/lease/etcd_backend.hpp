#pragma once
// The etcd backend: locks on an etcd cluster (etcd_lease.hpp), with status, list, break and the
// members' versions. bump is refused by the configuration (a token never goes back on etcd). Built by
// make_backend() (backend.hpp).
#include <memory>

#include "lease/backend.hpp"

namespace fencerun::lease {

std::unique_ptr<Backend> make_etcd_backend(const BackendTarget& target);

}  // namespace fencerun::lease
