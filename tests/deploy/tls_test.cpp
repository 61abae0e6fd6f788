// rediss:// against a redis-server that accepts only TLS and demands client certificates.
#include <regex>

#include "deploy_support.hpp"

namespace fencerun::test::deploy {
namespace {

class TlsTest : public DeployTest {
 protected:
  void SetUp() override {
    if (!program_usable(openssl_program())) GTEST_SKIP() << "openssl not found: cannot make certificates";
    certs_ = make_certs(certs_dir_.path());
    server_ = std::make_unique<TlsRedisServer>(certs_, /*auth_clients=*/true);
    on_failure_.push_back([this] { return "--- TLS redis-server log ---\n" + server_->log(); });
  }

  std::string url(const std::string& host = "127.0.0.1") const {
    return "rediss://" + host + ":" + std::to_string(server_->tls_port());
  }
  std::vector<std::string> ca() const { return {"--tls-ca-file", certs_.ca_crt.string()}; }
  std::vector<std::string> client_cert() const {
    return {"--tls-cert", certs_.client_crt.string(), "--tls-key", certs_.client_key.string()};
  }
  std::vector<std::string> ca_and_cert() const {
    auto a = ca();
    auto c = client_cert();
    a.insert(a.end(), c.begin(), c.end());
    return a;
  }
  // Runs a command that writes its token to `token`; with `options` and URL.
  RunResult run_token(const std::vector<std::string>& options, const std::string& u) const {
    std::filesystem::remove(file("token"));
    return run(sh_args(u, "job", "echo \"$FENCERUN_TOKEN\" > token", options));
  }
  bool lock_exists(const std::string& name = "job") const {
    Reply r = server_->cmd({"EXISTS", lock_key(name)});
    if (r.type != Reply::Type::Integer) throw std::runtime_error("EXISTS: " + r.describe());
    return r.integer > 0;
  }
  long long stored_token(const std::string& name = "job") const {
    Reply r = server_->cmd({"GET", token_key(name)});
    if (r.type != Reply::Type::String) return -1;
    return parse_ll(r.str).value_or(-1);
  }

  TempDir certs_dir_{"certs"};
  Certs certs_;
  std::unique_ptr<TlsRedisServer> server_;
};

TEST_F(TlsTest, MutualTlsRunIssuesTokenRunsCommandAndReleases) {
  RunResult r = run_token(ca_and_cert(), url());
  ASSERT_EQ(r.exit_code, 0) << r;
  const long long token = read_token(file("token"), 1s);
  EXPECT_GT(token, 0);
  EXPECT_EQ(stored_token(), token) << "the token counter on the server is the token the command got";
  EXPECT_FALSE(lock_exists()) << "the lock must be released after the command exited";

  // The certificate also names `localhost` (DNS SAN): a host name verifies as well.
  RunResult by_name = run_token(ca_and_cert(), url("localhost"));
  ASSERT_EQ(by_name.exit_code, 0) << by_name;
  EXPECT_GT(read_token(file("token"), 1s), token);
  EXPECT_FALSE(lock_exists());

  // --tls-server-name picks the DNS SAN while connecting by address.
  RunResult named = run_token([&] {
    auto o = ca_and_cert();
    o.insert(o.end(), {"--tls-server-name", "localhost"});
    return o;
  }(), url());
  ASSERT_EQ(named.exit_code, 0) << named;
}

TEST_F(TlsTest, WithoutClientCertificateIsUnavailable) {
  RunResult r = run_token(ca(), url());
  note("tls no client cert", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(std::filesystem::exists(file("token"))) << "the command must not run";
  EXPECT_FALSE(r.err.empty()) << "fencerun must say why";
  EXPECT_FALSE(lock_exists());
}

TEST_F(TlsTest, UntrustedServerCertificateIsRejected) {
  RunResult r = run_token({"--tls-ca-file", certs_.other_ca_crt.string(), "--tls-cert",
                           certs_.client_crt.string(), "--tls-key", certs_.client_key.string()},
                          url());
  EXPECT_EQ(r.exit_code, 69) << r;
  note("tls wrong CA", r);
  EXPECT_FALSE(std::filesystem::exists(file("token"))) << "the command must not run";
  EXPECT_NE(r.err.find("certificate"), std::string::npos) << "message must name the certificate\n" << r;
  EXPECT_FALSE(lock_exists());
  EXPECT_EQ(stored_token(), -1) << "nothing may have been written";
}

TEST_F(TlsTest, ServerNameMismatchIsRejected) {
  auto o = ca_and_cert();
  o.insert(o.end(), {"--tls-server-name", "wrong.example"});
  RunResult r = run_token(o, url());
  note("tls wrong name", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_FALSE(std::filesystem::exists(file("token"))) << "the command must not run";
  EXPECT_TRUE(r.err.find("mismatch") != std::string::npos ||
              r.err.find("wrong.example") != std::string::npos)
      << "message must say the name does not match\n"
      << r;
  EXPECT_EQ(stored_token(), -1) << "nothing may have been written";
}

TEST_F(TlsTest, InsecureSkipsVerificationButWarns) {
  RunResult r = run_token({"--tls-insecure", "--tls-ca-file", certs_.other_ca_crt.string(),
                           "--tls-cert", certs_.client_crt.string(), "--tls-key",
                           certs_.client_key.string()},
                          url());
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_GT(read_token(file("token"), 1s), 0);
  const std::string err = r.err;
  note("tls insecure", r);
  EXPECT_TRUE(std::regex_search(err, std::regex("insecure|not verif|verification", std::regex::icase)))
      << "--tls-insecure must warn on stderr\n"
      << r;
  EXPECT_FALSE(lock_exists());
}

TEST_F(TlsTest, StatusOverTls) {
  std::vector<std::string> status = {"status", "-r", url()};
  auto o = ca_and_cert();
  status.insert(status.end(), o.begin(), o.end());
  status.insert(status.end(), {"job", "--json"});

  RunResult free_before = run(status);
  EXPECT_EQ(free_before.exit_code, 3) << free_before;

  auto holder = start(sh_args(url(), "job", kTokenUntilGo, ca_and_cert()));
  const long long token = read_token(file("token"));
  wait_pid("pid");
  RunResult held = run(status);
  EXPECT_EQ(held.exit_code, 0) << held;
  EXPECT_NE(held.out.find(std::to_string(token)), std::string::npos)
      << "status must show the holder's token " << token << "\n"
      << held;
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(20s)) << holder->result();
  EXPECT_EQ(*holder->exit_code(), 0) << holder->result();

  RunResult free_after = run(status);
  EXPECT_EQ(free_after.exit_code, 3) << free_after;

  // Without a client certificate the server refuses the connection: unavailable.
  std::vector<std::string> no_cert = {"status", "-r", url(), "--tls-ca-file", certs_.ca_crt.string(),
                                      "job"};
  RunResult refused = run(no_cert);
  EXPECT_EQ(refused.exit_code, 69) << refused;
}

}  // namespace
}  // namespace fencerun::test::deploy
