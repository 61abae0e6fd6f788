#pragma once
// The backend the configuration names: the one way app/ reaches the locks (lease/backend.hpp).
#include <memory>

#include "config/config.hpp"
#include "lease/backend.hpp"

namespace fencerun::app {

inline std::unique_ptr<lease::Backend> backend_for(const config::CommonConfig& c) {
  return c.target->make_backend(c.backend_settings());
}

}  // namespace fencerun::app
