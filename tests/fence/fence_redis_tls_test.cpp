// `fencerun fence redis` over TLS: the guard takes the connection options of run and status
// (--tls-ca-file, --tls-cert, --tls-key, --tls-server-name, --tls-insecure) against a redis-server
// that accepts only TLS and demands client certificates (the deploy suite's certificates and server).
// Its kit runs the guard suite over TLS (GuardSuite.*/redis_tls).
#include <gtest/gtest.h>
#include <unistd.h>

#include <iostream>

#include "deploy_support.hpp"
#include "fence_harness.hpp"

namespace fencerun::test::fence {
namespace {

using deploy::Certs;
using deploy::TlsRedisServer;

// `fence redis -r rediss://... --tls-*` against a TLS-only server that demands client certificates;
// the leases stay in the lab's plain server. The control is a plain SET over the server's unix socket.
class RedisTlsKit : public Kit {
 public:
  explicit RedisTlsKit(const Lab& lab)
      : m_lock(lab.lock()), m_certs(deploy::make_certs(m_certs_dir.path())), m_server(m_certs, /*auth_clients=*/true) {}
  std::string name() const override { return "redis_tls"; }
  std::optional<std::string> owners_unavailable() const override {
    if (deploy::program_usable(deploy::redis_cli_program())) return std::nullopt;
    return "redis-cli not found: the unguarded control writes need it";
  }
  std::string guarded_body() const override {
    return "  \"$FENCERUN\" fence redis -r \"$FENCE_TLS_URL\" --tls-ca-file \"$FENCE_TLS_CA\" --tls-cert \"$FENCE_TLS_CERT\" "
           "--tls-key \"$FENCE_TLS_KEY\" -- SET \"$FENCE_DATA_KEY\" \"$DATA\" > /dev/null";
  }
  std::string plain_body() const override {
    return "  \"$REDIS_CLI\" -s \"$FENCE_TLS_SOCKET\" SET \"$FENCE_CONTROL_KEY\" \"$DATA\" > /dev/null";
  }
  std::optional<std::string> guarded_value() const override { return get(data_key()); }
  std::optional<std::string> control_value() const override { return get(control_key()); }
  std::optional<long long> recorded_token() const override {
    auto v = get(fence_key());
    if (!v) return std::nullopt;
    return parse_ll(*v);
  }
  EnvList env() const override {
    return {{"FENCE_TLS_URL", url()},
            {"FENCE_TLS_CA", m_certs.ca_crt.string()},
            {"FENCE_TLS_CERT", m_certs.client_crt.string()},
            {"FENCE_TLS_KEY", m_certs.client_key.string()},
            {"FENCE_TLS_SOCKET", m_server.admin().unix_path},
            {"FENCE_DATA_KEY", data_key()},
            {"FENCE_CONTROL_KEY", control_key()},
            {"REDIS_CLI", deploy::redis_cli_program()}};
  }
  std::unique_ptr<Process> start_write(const Token& token, const std::string& data) override {
    std::vector<std::string> args = {"fence", "redis", "-r", url(), "--tls-ca-file", m_certs.ca_crt.string(),
                                     "--tls-cert", m_certs.client_crt.string(), "--tls-key",
                                     m_certs.client_key.string(), "--resource", m_lock};
    SpawnOptions so;
    add_cli_token(token, args, so.env);
    args.insert(args.end(), {"--", "SET", data_key(), data});
    return std::make_unique<FencerunProcess>(std::move(args), std::move(so));
  }
  GuardResult finish(Process& writer) const override { return finish_cli(writer); }
  std::string stale_message(long long stale, long long accepted) const override {
    return "fencerun: stale token " + std::to_string(stale) + " rejected for " + fence_key() +
           ": it has accepted " + std::to_string(accepted);
  }
  std::vector<Token> malformed_tokens() const override { return cli_malformed_tokens(); }
  void expect_nothing_written() const override {
    EXPECT_FALSE(get(data_key()));
    EXPECT_FALSE(get(fence_key()));
  }
  void describe_on_failure() const override {
    std::cout << "--- TLS redis-server log ---\n" << m_server.log() << std::endl;
  }
  unsigned rounds_seed() const override { return 20240614u; }

 private:
  std::string url() const { return "rediss://127.0.0.1:" + std::to_string(m_server.tls_port()); }
  std::string data_key() const { return "{" + m_lock + "}:data"; }
  std::string control_key() const { return "{" + m_lock + "}:control"; }
  std::string fence_key() const { return "fencerun:{" + m_lock + "}:fence"; }
  std::optional<std::string> get(const std::string& key) const {
    Reply r = m_server.cmd({"GET", key});
    if (r.type == Reply::Type::String) return r.str;
    if (r.type == Reply::Type::Nil) return std::nullopt;
    throw std::runtime_error("GET " + key + ": " + r.describe());
  }

  std::string m_lock;
  TempDir m_certs_dir{"certs"};
  Certs m_certs;
  TlsRedisServer m_server;
};

const bool g_redis_tls_kit = register_kit("redis_tls", [](Lab& lab) -> std::unique_ptr<Kit> {
  if (!deploy::program_usable(deploy::openssl_program()))
    return unavailable_kit("redis_tls", "openssl not found: cannot make certificates");
  return std::make_unique<RedisTlsKit>(lab);
});

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

  // (Stale, equal and malformed tokens over TLS: GuardSuite.*/redis_tls.)
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
