#pragma once
// The two things fencerun does: run a command under a lease, and report a lease's status. Each
// returns the process exit code; usage errors were caught before (config::make_config).
#include "config/config.hpp"

namespace fencerun::app {

int run(const config::Config& config);
int status(const config::Config& config);

}  // namespace fencerun::app
