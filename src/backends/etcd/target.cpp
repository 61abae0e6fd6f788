#include "backends/etcd/target.hpp"

#include "backends/etcd/etcd_backend.hpp"
#include "util/duration.hpp"
#include "util/error.hpp"

namespace fencerun::etcd {
namespace {

EtcdEndpoint endpoint_of(const lease::ConnectRequest& r) {
  const std::string& url = r.urls.front();
  const std::string_view source = r.source;
  auto endpoint = parse_etcd_url(url);
  if (!endpoint) {
    std::string message = std::string(source) + ": " + endpoint.error();
    if (url.find('@') != std::string::npos)
      message += " (a password with '@', ':', ',' or '/' must be percent-encoded, or given in $FENCERUN_ETCD_PASSWORD)";
    throw UsageError(message);
  }
  EtcdEndpoint e = std::move(*endpoint);
  if (!e.password && !e.user.empty()) {
    auto pw = r.getenv("FENCERUN_ETCD_PASSWORD");
    if (pw && !pw->empty()) e.password = *pw;
  }
  if (!e.user.empty() && !e.password)
    throw UsageError(std::string(source) + ": no password for etcd user '" + e.user + "': give it in the URL (etcd://" +
                     e.user + ":PASSWORD@...) or in $FENCERUN_ETCD_PASSWORD");
  e.tls_settings = r.tls;
  return e;
}

}  // namespace

void EtcdUrlTarget::check_run(const lease::RunShape& run) const {
  if (run.ttl % std::chrono::milliseconds(1000) != std::chrono::milliseconds::zero() || run.ttl < k_min_ttl)
    throw UsageError("--ttl: on etcd a lease lives whole seconds, at least " + util::format_duration(k_min_ttl) +
                     " (etcd's minimum lease TTL), got " + run.ttl_text);
}

std::unique_ptr<lease::Backend> EtcdUrlTarget::make_backend(const lease::BackendSettings& s) const {
  return lease::make_etcd_backend({m_endpoint, m_url, s.key_prefix, s.timeout});
}

std::shared_ptr<const lease::Target> configure(const lease::ConnectRequest& r) {
  EtcdEndpoint e = endpoint_of(r);
  if (r.tls_options && !e.tls)
    throw UsageError("--tls-*: TLS options given, but " + r.source + " names " + redacted_url(e) +
                     ", not a TLS URL (use etcds://)");
  std::string url = redacted_url(e);
  return std::make_shared<EtcdUrlTarget>(std::move(e), std::move(url));
}

}  // namespace fencerun::etcd
