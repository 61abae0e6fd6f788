#pragma once
// Three independent redis-servers for quorum mode: the integration fixture's server and two more, each
// with its own port, socket and directory. A server's clock can be moved (restart with clock_offset).
#include <memory>
#include <string>
#include <vector>

#include "fixture.hpp"

#ifndef FENCERUN_CLOCK_SHIM
#error "FENCERUN_CLOCK_SHIM must name the clock shim library"
#endif

namespace fencerun::test {

inline constexpr long long kLagUs = 30'000'000;  // a lagging server's clock: 30 s behind

// The environment that starts a server with its wall clock moved by `offset_us`.
inline EnvList clock_offset(long long offset_us) {
  return {{"LD_PRELOAD", FENCERUN_CLOCK_SHIM}, {"FENCERUN_TEST_CLOCK_OFFSET_US", std::to_string(offset_us)}};
}

class QuorumTest : public FencerunTest {
 protected:
  void SetUp() override {
    FencerunTest::SetUp();
    for (int i = 1; i < 3; ++i) m_more.push_back(std::make_unique<RedisServer>(redis_options()));
  }
  void TearDown() override {
    for (auto& s : m_more)
      if (s->frozen()) s->thaw();
    if (HasFailure())
      for (auto& s : m_more) std::cout << "--- redis-server log (" << s->url() << ") ---\n" << s->log() << "\n";
    FencerunTest::TearDown();
  }

  RedisServer& server(std::size_t i) { return i == 0 ? redis() : *m_more.at(i - 1); }
  static constexpr std::size_t k_servers = 3;

  // -r URL for every server, then `options`.
  std::vector<std::string> quorum(std::vector<std::string> options = {}) {
    std::vector<std::string> a;
    for (std::size_t i = 0; i < k_servers; ++i) a.insert(a.end(), {"-r", server(i).url()});
    a.insert(a.end(), options.begin(), options.end());
    return a;
  }
  // quorum(options) NAME -- sh -c SCRIPT
  std::vector<std::string> quorum_sh(const std::string& name, const std::string& script,
                                     std::vector<std::string> options = {}) {
    auto a = quorum(std::move(options));
    a.insert(a.end(), {name, "--", "sh", "-c", script});
    return a;
  }
  static std::vector<std::string> with_status(std::vector<std::string> a) {
    a.insert(a.begin(), "status");
    return a;
  }
  // How many servers hold NAME's lock key now.
  std::size_t holding(const std::string& name) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < k_servers; ++i)
      n += server(i).running() && !server(i).frozen() && server(i).exists(lock_key(name));
    return n;
  }

 private:
  std::vector<std::unique_ptr<RedisServer>> m_more;
};

}  // namespace fencerun::test
