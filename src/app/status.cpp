// `fencerun status NAME`: the lock's view, as its backend shows it; `fencerun history NAME`.
#include "app/app.hpp"
#include "app/backend.hpp"

namespace fencerun::app {

int status(const config::Config& c) { return backend_for(c.common)->status(c.run.lock, c.json); }

// `fencerun history NAME`: the recorded runs, newest first.
int history(const config::Config& c) {
  return backend_for(c.common)->history({c.run.lock, c.history_count, c.json, c.history_utc, c.history_all});
}

}  // namespace fencerun::app
