// `fencerun status NAME`: the lock's view, as its backend shows it.
#include "app/app.hpp"
#include "app/backend.hpp"

namespace fencerun::app {

int status(const config::Config& c) { return backend_for(c.common)->status(c.run.lock, c.json); }

}  // namespace fencerun::app
