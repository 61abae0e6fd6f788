#pragma once
// The quorum backend: 3, 5 or 7 independent Redis servers (quorum_lease.hpp for the lease). status and
// list show what each server says and what a majority says; break and bump are refused by the
// configuration. Built by make_backend() (backend.hpp).
#include <memory>

#include "lease/backend.hpp"

namespace fencerun::lease {

std::unique_ptr<Backend> make_quorum_backend(const BackendTarget& target);

}  // namespace fencerun::lease
