#include <cstdio>

#include "app/app.hpp"
#include "lease/lease_client.hpp"
#include "log/log.hpp"
#include "redis/client.hpp"
#include "supervisor/exit_status.hpp"

namespace fencerun::app {

namespace {

// One server's lines; false when it could not be reached.
bool print_server(const redis::RedisEndpoint& endpoint, const std::string& url, const std::string& label,
                  milliseconds timeout) {
  redis::Client client(endpoint);
  client.learn_server();
  // The probe rides with the PING: one round trip, through Sentinel or a Cluster seed as a run would.
  auto pong = client.command({"PING"}, BootClock::now() + timeout);
  if (!pong || pong->is_error()) {
    log::event(log::Level::error, "redis_unavailable",
               "cannot use Redis at " + url + ": " + (pong ? pong->str : pong.error().message));
    return false;
  }
  const auto& server = client.server();
  if (!server) {  // answered PING but not the probe: a proxy that drops it, say
    std::printf("%s: unknown (HELLO and COMMAND INFO not answered) at %s\n%s: script\n", label.c_str(), url.c_str(),
                label == "server" ? "release" : (label + " release").c_str());
    return true;
  }
  std::printf("%s: %s at %s (%s)\n%s: %s\n", label.c_str(), server->describe().c_str(), server->where.c_str(),
              url.c_str(), label == "server" ? "release" : (label + " release").c_str(),
              std::string(lease::release_path_name(lease::release_path(server))).c_str());
  return true;
}

}  // namespace

int server_version(const config::Config& c) {
  if (c.common.servers.empty())
    return print_server(c.common.endpoint, c.common.redacted_url, "server", c.common.timeout) ? 0
                                                                                               : exit_code::k_unavailable;
  // Quorum mode: every server, in the order given; 69 when any one cannot be reached.
  bool all = true;
  for (std::size_t i = 0; i < c.common.servers.size(); ++i)
    all = print_server(c.common.servers[i], c.common.server_urls[i], "server " + std::to_string(i + 1),
                       c.common.timeout) && all;
  std::fflush(stdout);
  return all ? 0 : exit_code::k_unavailable;
}

}  // namespace fencerun::app
