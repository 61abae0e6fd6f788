// A Redis node's connection on the neutral transports (net/): TCP, unix socket or TLS as the endpoint
// says.
#include "backends/redis/transport.hpp"

#include <optional>

namespace fencerun::redis {

Result<std::unique_ptr<Transport>> open_transport(const RedisEndpoint& ep, Deadline deadline) {
  net::Address address;
  if (ep.transport == RedisEndpoint::Transport::unix_socket) {
    address.unix_path = ep.path;
  } else {
    address.host = ep.host;
    address.port = ep.port;
  }
  std::optional<net::TlsOptions> tls;
  if (ep.transport == RedisEndpoint::Transport::tls) tls = net::TlsOptions{ep.tls, "redis://", {}};
  auto stream = net::open_transport(address, tls ? &*tls : nullptr, deadline);
  if (!stream) return std::unexpected(Transport::to_redis(std::move(stream.error())));
  return std::make_unique<Transport>(std::move(*stream));
}

}  // namespace fencerun::redis
