// rediss:// against a redis-server that accepts only TLS and demands client certificates, and the
// messages when the scheme does not match the port.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>

#include "deploy_support.hpp"

namespace fencerun::test::deploy {
namespace {

// Whether something accepts TCP connections on 127.0.0.1:port right now.
bool accepts_connections(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

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

TEST_F(TlsTest, PlainSchemeOnTheTlsPortSaysTryRediss) {
  const std::string plain = "redis://127.0.0.1:" + std::to_string(server_->tls_port());
  RunResult r = run_token({"--timeout", "1s"}, plain);
  note("redis:// on the TLS port", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_NE(r.err.find("it may expect TLS on this port (try rediss://)"), std::string::npos) << r;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line\n" << r;
  EXPECT_FALSE(std::filesystem::exists(file("token"))) << "the command must not run";
  EXPECT_FALSE(lock_exists());

  RunResult s = run({"status", "-r", plain, "job"});
  EXPECT_EQ(s.exit_code, 69) << s;
  EXPECT_NE(s.err.find("try rediss://"), std::string::npos) << s;
}

TEST_F(TlsTest, MissingTlsFilesAreUsageErrorsNamingOptionAndPath) {
  const std::string missing = file("no-such-ca.pem").string();
  struct Case {
    std::vector<std::string> options;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--tls-ca-file", missing}, "--tls-ca-file: cannot read '" + missing + "': No such file or directory"},
      {{"--tls-ca-file", certs_.ca_crt.string(), "--tls-cert", missing, "--tls-key", certs_.client_key.string()},
       "--tls-cert: cannot read '" + missing + "': No such file or directory"},
      {{"--tls-ca-file", certs_.ca_crt.string(), "--tls-cert", certs_.client_crt.string(), "--tls-key", missing},
       "--tls-key: cannot read '" + missing + "': No such file or directory"},
      {{"--tls-ca-file", dir().path().string()}, "--tls-ca-file: '" + dir().path().string() + "' is a directory, not a file"},
  };
  for (const Case& c : cases) {
    RunResult r = run_token(c.options, url());
    note("missing TLS file", r);
    EXPECT_EQ(r.exit_code, 64) << r;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.expected << "\n" << r;
    EXPECT_FALSE(std::filesystem::exists(file("token"))) << "the command must not run";
    std::vector<std::string> status = {"status", "-r", url(), "job"};
    status.insert(status.end(), c.options.begin(), c.options.end());
    RunResult s = run(status);
    EXPECT_EQ(s.exit_code, 64) << s;
    EXPECT_NE(s.err.find(c.expected), std::string::npos) << s;
  }
  EXPECT_EQ(stored_token(), -1) << "nothing may have been written";
}

// rediss:// to a plain redis-server: it never answers the ClientHello (it takes it for an unfinished
// inline command), so the handshake runs into --timeout, and the message says to try redis://.
TEST_F(DeployTest, TlsSchemeOnAPlainRedisPortSaysTryRedis) {
  RedisServer plain;
  const std::string tls = "rediss://127.0.0.1:" + std::to_string(plain.port());
  RunResult r = run(sh_args(tls, "job", "touch ran", {"--timeout", "500ms"}));
  note("rediss:// on a plain port", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_NE(r.err.find("TLS handshake timed out with no answer from the server: it may not speak TLS on this "
                       "port (try redis://)"),
            std::string::npos)
      << r;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line\n" << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command must not run";
  EXPECT_EQ(plain.dbsize(), 0);
}

// rediss:// to a plain-text server that answers the ClientHello at once (here Python's HTTP server,
// with its 400 page): no TLS record came back, so fencerun says so without waiting for --timeout.
TEST_F(DeployTest, TlsSchemeOnAPlainTextServerThatAnswersSaysTryRedis) {
  if (!program_usable(PYTHON3_EXECUTABLE)) GTEST_SKIP() << "python3 not found";
  const int port = pick_free_port();
  Process http({PYTHON3_EXECUTABLE, "-m", "http.server", "--bind", "127.0.0.1", std::to_string(port)},
               spawn_options());
  ASSERT_TRUE(wait_until([&] { return accepts_connections(port); }, 10s, 20ms))
      << "python3 -m http.server did not listen on " << port << "\n" << http.result();
  const std::string tls = "rediss://127.0.0.1:" + std::to_string(port);
  RunResult r = run(sh_args(tls, "job", "touch ran", {"--timeout", "5s"}));
  note("rediss:// on an HTTP port", r);
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_NE(r.err.find("the server does not speak TLS on this port: try redis://"), std::string::npos) << r;
  EXPECT_LT(r.elapsed, 4s) << "the answer is enough, no need to wait for --timeout\n" << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command must not run";
}

}  // namespace
}  // namespace fencerun::test::deploy
