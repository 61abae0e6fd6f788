#include "backends/quorum/target.hpp"

#include <algorithm>

#include "backends/quorum/quorum_backend.hpp"
#include "backends/quorum/quorum_limits.hpp"
#include "backends/redis/target.hpp"
#include "util/error.hpp"

namespace fencerun::quorum {

using redis::RedisEndpoint;
using redis::server_identity;
using redis::uses_tls;

namespace {

// Quorum mode's list: 3, 5 or 7 distinct servers, all with TLS or none (the --tls-* options are
// given once, for all of them).
void check_quorum(const std::vector<RedisEndpoint>& servers, std::string_view source) {
  const std::size_t n = servers.size();
  if (n % 2 == 0 || n > k_max_servers)
    throw UsageError(std::string(source) + ": " + std::to_string(n) +
                     " servers given; quorum mode takes 3, 5 or 7 (an odd number of independent servers)");
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j)
      if (server_identity(servers[i]) == server_identity(servers[j]))
        throw UsageError(std::string(source) + ": servers " + std::to_string(i + 1) + " and " + std::to_string(j + 1) +
                         " are the same server (" + server_identity(servers[i]) +
                         "); quorum mode needs independent servers");
  if (std::ranges::any_of(servers, uses_tls) && !std::ranges::all_of(servers, uses_tls))
    throw UsageError(std::string(source) + ": the servers mix TLS (rediss://) and plain connections; in quorum mode all of "
                     "them use TLS or none (the --tls-* options apply to every server)");
}

}  // namespace

QuorumUrlTarget::QuorumUrlTarget(std::vector<RedisEndpoint> servers, std::vector<std::string> urls,
                                 std::chrono::milliseconds max_ttl)
    : m_servers(std::move(servers)), m_urls(std::move(urls)), m_max_ttl(max_ttl) {
  for (const auto& u : m_urls) m_url += (m_url.empty() ? "" : " ") + u;
}

void QuorumUrlTarget::check_files() const { util::check_tls_files(m_servers.front().tls); }

void QuorumUrlTarget::check_run(const lease::RunShape& run) const { check_quorum_ttl(run.ttl, m_max_ttl); }

std::unique_ptr<lease::Backend> QuorumUrlTarget::make_backend(const lease::BackendSettings& s) const {
  return lease::make_quorum_backend({m_servers, m_urls, s.key_prefix, s.timeout, m_max_ttl});
}

std::shared_ptr<const lease::Target> configure(const lease::ConnectRequest& r) {
  std::vector<RedisEndpoint> servers;
  for (const auto& u : r.urls) servers.push_back(redis::endpoint_of(u, r));
  check_quorum(servers, r.source);
  if (r.tls_options && !uses_tls(servers.front()))
    throw UsageError("--tls-*: TLS options given, but " + r.source + " names " + redis::redacted_url(servers.front()) +
                     ", not a TLS URL (use rediss:// or rediss+sentinel://)");
  std::vector<std::string> urls;
  for (const auto& s : servers) urls.push_back(redis::redacted_url(s));
  check_quorum_addresses(servers, urls);
  return std::make_shared<QuorumUrlTarget>(std::move(servers), std::move(urls),
                                           quorum_max_ttl(r.getenv("FENCERUN_QUORUM_MAX_TTL")));
}

}  // namespace fencerun::quorum
