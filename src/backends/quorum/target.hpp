#pragma once
// The quorum backend's Target: -r given 3, 5 or 7 times with Redis URLs, each a server independent of
// the others; the --tls-* options apply to all of them.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backends/redis/url.hpp"
#include "lease/backend.hpp"

namespace fencerun::quorum {

// -r given this many times at most (3, 5 or 7: an odd number, so that any two majorities share a server).
inline constexpr std::size_t k_max_servers = 7;

class QuorumUrlTarget final : public lease::Target {
 public:
  QuorumUrlTarget(std::vector<redis::RedisEndpoint> servers, std::vector<std::string> urls,
                  std::chrono::milliseconds max_ttl);
  std::string_view backend() const override { return "quorum"; }
  std::string_view server_kind() const override { return "Redis"; }
  std::string_view unavailable_event() const override { return "redis_unavailable"; }
  const std::string& redacted_url() const override { return m_url; }
  bool tls_insecure() const override { return m_servers.front().tls.insecure; }
  void check_files() const override;
  void check_run(const lease::RunShape& run) const override;
  std::unique_ptr<lease::Backend> make_backend(const lease::BackendSettings& settings) const override;

 private:
  std::vector<redis::RedisEndpoint> m_servers;
  std::vector<std::string> m_urls;
  std::string m_url;  // every server's, separated by spaces
  std::chrono::milliseconds m_max_ttl;
};

// The registry's parser of a quorum's URLs. Throws UsageError.
std::shared_ptr<const lease::Target> configure(const lease::ConnectRequest& request);

}  // namespace fencerun::quorum
