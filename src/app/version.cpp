// `fencerun --version -r URL`: which server (or servers) that is, as its backend tells.
#include "app/app.hpp"
#include "app/backend.hpp"

namespace fencerun::app {

int server_version(const config::Config& c) { return backend_for(c.common)->server_version(); }

}  // namespace fencerun::app
