#include <cstdio>

#include "app/app.hpp"
#include "lease/lease_client.hpp"
#include "log/log.hpp"
#include "redis/client.hpp"
#include "supervisor/exit_status.hpp"

namespace fencerun::app {

int server_version(const config::Config& c) {
  redis::Client client(c.common.endpoint);
  client.learn_server();
  // The probe rides with the PING: one round trip, through Sentinel or a Cluster seed as a run would.
  auto pong = client.command({"PING"}, BootClock::now() + c.common.timeout);
  if (!pong || pong->is_error()) {
    log::event(log::Level::error, "redis_unavailable",
               "cannot use Redis at " + c.common.redacted_url + ": " + (pong ? pong->str : pong.error().message));
    return exit_code::k_unavailable;
  }
  const auto& server = client.server();
  if (!server) {  // answered PING but not the probe: a proxy that drops it, say
    std::printf("server: unknown (HELLO and COMMAND INFO not answered) at %s\nrelease: script\n",
                c.common.redacted_url.c_str());
    return 0;
  }
  std::printf("server: %s at %s (%s)\nrelease: %s\n", server->describe().c_str(), server->where.c_str(),
              c.common.redacted_url.c_str(), std::string(lease::release_path_name(lease::release_path(server))).c_str());
  return 0;
}

}  // namespace fencerun::app
