#pragma once
// The Redis backend's Target: one server (a standalone server, a Sentinel-managed master, any node of
// a Cluster) named by redis://, rediss://, unix:// or redis+sentinel:// / rediss+sentinel://, with
// the passwords of the environment and the --tls-* options. And the pieces a quorum of such servers
// shares with it (backends/quorum/).
#include <memory>
#include <string>

#include "backends/redis/url.hpp"
#include "lease/backend.hpp"

namespace fencerun::redis {

class RedisUrlTarget final : public lease::Target {
 public:
  RedisUrlTarget(RedisEndpoint endpoint, std::string url) : m_endpoint(std::move(endpoint)), m_url(std::move(url)) {}
  std::string_view backend() const override { return "redis"; }
  std::string_view server_kind() const override { return "Redis"; }
  std::string_view unavailable_event() const override { return "redis_unavailable"; }
  const std::string& redacted_url() const override { return m_url; }
  bool tls_insecure() const override { return m_endpoint.tls.insecure; }
  void check_files() const override { util::check_tls_files(m_endpoint.tls); }
  int share_connection() const override;
  std::unique_ptr<lease::Backend> make_backend(const lease::BackendSettings& settings) const override;
  const RedisEndpoint& endpoint() const { return m_endpoint; }

 private:
  RedisEndpoint m_endpoint;
  std::string m_url;
};

// The registry's parser of one Redis URL (ConnectRequest::urls has one). Throws UsageError.
std::shared_ptr<const lease::Target> configure(const lease::ConnectRequest& request);

// One URL with the passwords of the environment (and, inside a run's job, the run's shared
// connection) and the TLS options. Throws UsageError naming request.source.
RedisEndpoint endpoint_of(const std::string& url, const lease::ConnectRequest& request);

bool uses_tls(const RedisEndpoint& endpoint);

// The same server, as far as the URL can tell: host:port/db, the socket path and db, or a sentinel
// group's master name, sentinels and db. Quorum mode refuses a list that names one server twice.
std::string server_identity(const RedisEndpoint& endpoint);

}  // namespace fencerun::redis
