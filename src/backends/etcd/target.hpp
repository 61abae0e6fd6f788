#pragma once
// The etcd backend's Target: etcd://[user[:password]@]HOST:PORT[,HOST:PORT...] (etcds:// for TLS),
// the members of one cluster in one URL, with the password of the environment and the --tls-* options.
#include <memory>
#include <string>

#include "backends/etcd/url.hpp"
#include "lease/backend.hpp"

namespace fencerun::etcd {

// etcd's minimum lease TTL with its default election timeout (a TTL below it is raised by the server).
inline constexpr std::chrono::milliseconds k_min_ttl{2000};

class EtcdUrlTarget final : public lease::Target {
 public:
  EtcdUrlTarget(EtcdEndpoint endpoint, std::string url) : m_endpoint(std::move(endpoint)), m_url(std::move(url)) {}
  std::string_view backend() const override { return "etcd"; }
  std::string_view server_kind() const override { return "etcd"; }
  std::string_view unavailable_event() const override { return "etcd_unavailable"; }
  const std::string& redacted_url() const override { return m_url; }
  bool tls_insecure() const override { return m_endpoint.tls_settings.insecure; }
  void check_files() const override { util::check_tls_files(m_endpoint.tls_settings); }
  // An etcd lease lives whole seconds, at least etcd's minimum.
  void check_run(const lease::RunShape& run) const override;
  std::unique_ptr<lease::Backend> make_backend(const lease::BackendSettings& settings) const override;
  const EtcdEndpoint& endpoint() const { return m_endpoint; }

 private:
  EtcdEndpoint m_endpoint;
  std::string m_url;
};

// The registry's parser of an etcd URL. Throws UsageError.
std::shared_ptr<const lease::Target> configure(const lease::ConnectRequest& request);

}  // namespace fencerun::etcd
