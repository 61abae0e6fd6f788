// `fencerun fence redis` over TLS: the guard takes the connection options of run and status
// (--tls-ca-file, --tls-cert, --tls-key, --tls-server-name, --tls-insecure) against a redis-server
// that accepts only TLS and demands client certificates (the deploy suite's certificates and server).
#include <gtest/gtest.h>

#include <iostream>

#include "deploy_support.hpp"

namespace fencerun::test::fence {
namespace {

using deploy::Certs;
using deploy::TlsRedisServer;

class FenceRedisTls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!deploy::program_usable(deploy::openssl_program()))
      GTEST_SKIP() << "openssl not found: cannot make certificates";
    m_certs = deploy::make_certs(m_certs_dir.path());
    m_server = std::make_unique<TlsRedisServer>(m_certs, /*auth_clients=*/true);
  }
  void TearDown() override {
    if (HasFailure() && m_server) std::cout << "--- TLS redis-server log ---\n" << m_server->log() << std::endl;
  }

  std::string url(const std::string& host = "127.0.0.1") const {
    return "rediss://" + host + ":" + std::to_string(m_server->tls_port());
  }
  std::vector<std::string> client_cert() const {
    return {"--tls-cert", m_certs.client_crt.string(), "--tls-key", m_certs.client_key.string()};
  }
  // `fencerun fence redis OPTIONS... --resource r --token TOKEN -- CMD...`
  RunResult fence(std::vector<std::string> options, const std::string& token, std::vector<std::string> cmd,
                  EnvList env = {}) const {
    std::vector<std::string> args = {"fence", "redis"};
    args.insert(args.end(), options.begin(), options.end());
    args.insert(args.end(), {"--resource", "r", "--token", token, "--"});
    args.insert(args.end(), cmd.begin(), cmd.end());
    SpawnOptions so;
    so.env = std::move(env);
    return run_fencerun(std::move(args), so, 30s);
  }
  std::optional<std::string> get(const std::string& key) const {
    Reply r = m_server->cmd({"GET", key});
    if (r.type == Reply::Type::String) return r.str;
    return std::nullopt;
  }

  TempDir m_certs_dir{"certs"};
  Certs m_certs;
  std::unique_ptr<TlsRedisServer> m_server;
};

TEST_F(FenceRedisTls, VerifiesTheServerWithTheCaFileAndSendsTheClientCertificate) {
  auto with_ca = client_cert();
  with_ca.insert(with_ca.end(), {"--tls-ca-file", m_certs.ca_crt.string()});
  auto options = with_ca;
  options.insert(options.begin(), {"-r", url()});
  // CMD's words stay byte for byte, also when they look like the connection options.
  auto r = fence(options, "10", {"SET", "{r}:k", "--tls-insecure [%s] a,b"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "OK\n");
  EXPECT_EQ(get("{r}:k"), "--tls-insecure [%s] a,b");
  EXPECT_EQ(get("fencerun:{r}:fence"), "10");

  // A stale token over TLS: rejected, nothing written.
  r = fence(options, "9", {"SET", "{r}:k", "stale"});
  EXPECT_EQ(r.exit_code, 77) << r;
  EXPECT_EQ(get("{r}:k"), "--tls-insecure [%s] a,b");

  // The URL from the environment, as under fencerun; --tls-server-name picks the DNS SAN.
  options = with_ca;
  options.insert(options.end(), {"--tls-server-name", "localhost"});
  r = fence(options, "11", {"INCR", "{r}:n"}, {{"FENCERUN_REDIS_URL", url()}});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "(integer) 1\n");
  EXPECT_EQ(get("fencerun:{r}:fence"), "11");
}

TEST_F(FenceRedisTls, RefusesAServerItCannotVerifyAndSendsNothing) {
  auto options = client_cert();
  options.insert(options.begin(), {"-r", url()});
  // The system trust store does not know the test CA.
  auto r = fence(options, "5", {"SET", "{r}:k", "v"});
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_NE(r.err.find("certificate"), std::string::npos) << r;
  // The right CA, the wrong name.
  auto named = options;
  named.insert(named.end(), {"--tls-ca-file", m_certs.ca_crt.string(), "--tls-server-name", "wrong.example"});
  r = fence(named, "5", {"SET", "{r}:k", "v"});
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(get("{r}:k"));
  EXPECT_FALSE(get("fencerun:{r}:fence"));

  // --tls-insecure connects anyway, and says so.
  auto insecure = options;
  insecure.insert(insecure.end(), {"--tls-insecure", "--tls-ca-file", m_certs.other_ca_crt.string()});
  r = fence(insecure, "5", {"SET", "{r}:k", "v"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("TLS certificate verification is disabled"), std::string::npos) << r;
  EXPECT_EQ(get("{r}:k"), "v");
}

}  // namespace
}  // namespace fencerun::test::fence
