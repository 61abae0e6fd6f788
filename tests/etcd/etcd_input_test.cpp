// Bad input against etcd: unreachable members (69 within about --timeout per member), bad URLs and
// options etcd cannot honour (64), a server that is not etcd (69), wrong or missing credentials (69,
// naming auth), TLS that does not verify (69). In every case the command does not run and nothing is
// left in etcd (no :wait/ key, no lease).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <thread>

#include "etcd_fixture.hpp"
#include "support/redis_server.hpp"
#include "util/exit_code.hpp"

namespace fencerun::test {
namespace {

std::string lower_case(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A TCP server on 127.0.0.1 that answers every connection with a line of garbage and closes it.
class GarbageServer {
 public:
  GarbageServer() {
    for (int attempt = 0; attempt < 20 && m_fd < 0; ++attempt) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      m_port = pick_free_port();
      a.sin_port = htons(static_cast<uint16_t>(m_port));
      if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 16) == 0) {
        m_fd = fd;
      } else {
        ::close(fd);
      }
    }
    if (m_fd < 0) throw std::runtime_error("GarbageServer: cannot listen");
    m_thread = std::thread([this] {
      while (!m_stop) {
        pollfd p{m_fd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        int c = ::accept4(m_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        static const char junk[] = "-ERR this is not etcd\r\nHTTP/1.0 418 garbage\r\n\r\n\x01\x02\x03";
        [[maybe_unused]] auto n = ::write(c, junk, sizeof junk - 1);
        ::close(c);
      }
    });
  }
  ~GarbageServer() {
    m_stop = true;
    m_thread.join();
    ::close(m_fd);
  }
  int port() const { return m_port; }

 private:
  int m_fd = -1;
  int m_port = 0;
  std::atomic<bool> m_stop{false};
  std::thread m_thread;
};

// A TCP listener that never accepts: connections complete (the kernel's backlog) and nothing ever
// answers, nor is any reset sent.
class SilentServer {
 public:
  SilentServer() {
    for (int attempt = 0; attempt < 20 && m_fd < 0; ++attempt) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      m_port = pick_free_port();
      a.sin_port = htons(static_cast<uint16_t>(m_port));
      if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 64) == 0) {
        m_fd = fd;
      } else {
        ::close(fd);
      }
    }
    if (m_fd < 0) throw std::runtime_error("SilentServer: cannot listen");
  }
  ~SilentServer() { ::close(m_fd); }
  SilentServer(const SilentServer&) = delete;
  SilentServer& operator=(const SilentServer&) = delete;
  int port() const { return m_port; }

 private:
  int m_fd = -1;
  int m_port = 0;
};

class EtcdInputTest : public EtcdSharedTest {
 protected:
  // The run of `url` did not start its command and left nothing for NAME in the suite's cluster.
  void expect_clean(const std::string& name) {
    EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "the command ran";
    EXPECT_TRUE(nothing_left(name, 1s));
    EXPECT_TRUE(etcd().keys(lock_prefix(name)).empty()) << "a refused run wrote to etcd";
  }
};

TEST_F(EtcdInputTest, BadUrlsAreUsageErrors) {
  const std::string port = std::to_string(etcd().client_port(0));
  const std::vector<std::string> urls = {"etcd://", "etcd://127.0.0.1:0", "etcd://127.0.0.1:" + port + "/path",
                                         "etcd://127.0.0.1:notaport", "etcds://"};
  for (const auto& url : urls) {
    auto r = run(sh_args_url(url, "badurl", "echo ran > ran"));
    EXPECT_EQ(r.exit_code, exit_code::k_usage) << url << "\n" << r;
    EXPECT_FALSE(r.err.empty()) << url;
  }
  expect_clean("badurl");
}

TEST_F(EtcdInputTest, OptionsEtcdCannotHonourAreUsageErrors) {
  const std::vector<std::vector<std::string>> refused = {
      {"--ttl", "2500ms"}, {"--ttl", "1s"}, {"--ttl", "1500ms"}, {"--limit", "2"}, {"--min-replicas", "1"}};
  for (const auto& opts : refused) {
    auto r = run(sh_args("opts", "echo ran > ran", opts));
    EXPECT_EQ(r.exit_code, exit_code::k_usage) << opts[0] << " " << opts[1] << "\n" << r;
    EXPECT_FALSE(r.err.empty()) << opts[0];
  }
  // Whole seconds of at least 2 s are fine.
  for (const char* ttl : {"2s", "3s", "2000ms"}) {
    auto r = run(sh_args("opts-ok", "true", {"--ttl", ttl}));
    EXPECT_EQ(r.exit_code, 0) << ttl << "\n" << r;
  }
  EXPECT_TRUE(nothing_left("opts-ok"));
  auto b = run({"bump", "-r", etcd().url(), "opts", "--above", "5"});
  EXPECT_EQ(b.exit_code, exit_code::k_usage) << b;
  EXPECT_FALSE(b.err.empty()) << "bump on etcd says why it is not needed";
  expect_clean("opts");
}

TEST_F(EtcdInputTest, UnreachableMembersAreUnavailableWithinTimeout) {
  const std::string url = "etcd://127.0.0.1:" + std::to_string(unused_port()) + ",127.0.0.1:" +
                          std::to_string(unused_port());
  auto r = run(sh_args_url(url, "unreach", "echo ran > ran", {"--timeout", "1s"}));
  EXPECT_EQ(r.exit_code, exit_code::k_unavailable) << r;
  EXPECT_LT(r.elapsed, 4000ms) << "about --timeout per member\n" << r;
  // Members that accept and never answer: about --timeout each.
  SilentServer a, b;
  const std::string silent =
      "etcd://127.0.0.1:" + std::to_string(a.port()) + ",127.0.0.1:" + std::to_string(b.port());
  auto q = run(sh_args_url(silent, "unreach", "echo ran > ran", {"--timeout", "1s"}));
  EXPECT_EQ(q.exit_code, exit_code::k_unavailable) << q;
  EXPECT_GE(q.elapsed, 900ms) << q;
  EXPECT_LT(q.elapsed, 4500ms) << "about --timeout per member\n" << q;
  auto s = run({"status", "-r", url, "--timeout", "1s", "unreach"});
  EXPECT_EQ(s.exit_code, exit_code::k_unavailable) << s;
  auto l = run({"list", "-r", url, "--timeout", "1s"});
  EXPECT_EQ(l.exit_code, exit_code::k_unavailable) << l;
  expect_clean("unreach");
}

TEST_F(EtcdInputTest, NotEtcdServersAreUnavailable) {
  GarbageServer garbage;
  const std::string url = "etcd://127.0.0.1:" + std::to_string(garbage.port());
  auto r = run(sh_args_url(url, "notetcd", "echo ran > ran", {"--timeout", "1s"}));
  EXPECT_EQ(r.exit_code, exit_code::k_unavailable) << r;
  EXPECT_LT(r.elapsed, 5000ms) << r;

  std::unique_ptr<RedisServer> redis;
  try {
    redis = std::make_unique<RedisServer>(RedisOptions{});
  } catch (const std::exception& e) {
    GTEST_SKIP() << "no redis-server to stand in for a non-etcd server: " << e.what();
  }
  const std::string rurl = "etcd://127.0.0.1:" + std::to_string(redis->port());
  auto rr = run(sh_args_url(rurl, "notetcd", "echo ran > ran", {"--timeout", "1s"}));
  EXPECT_EQ(rr.exit_code, exit_code::k_unavailable) << rr;
  EXPECT_LT(rr.elapsed, 5000ms) << rr;
  EXPECT_EQ(redis->dbsize(), 0) << "nothing written to the Redis server";
  expect_clean("notetcd");
}

// --- auth ----------------------------------------------------------------------------------------

class EtcdAuthTest : public EtcdOwnTest {
 protected:
  static constexpr const char* k_password = "pw-7c1e0f";
  EtcdOptions cluster_options() const override {
    EtcdOptions o;
    o.root_password = k_password;
    return o;
  }
};

TEST_F(EtcdAuthTest, PasswordFromUrlOrEnvironmentNeverReachesTheJob) {
  auto r = run({"-r", etcd().url_with_user(std::string("root:") + k_password), "-v", "authjob", "--", "env"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out.find(k_password), std::string::npos) << "the password reached the job's environment\n" << r.out;
  EXPECT_EQ(r.err.find(k_password), std::string::npos) << "the password is in the log\n" << r.err;
  EXPECT_NE(r.out.find("FENCERUN_TOKEN="), std::string::npos) << r.out;

  auto e = run({"-r", etcd().url_with_user("root"), "-v", "authjob", "--", "env"},
               {{"FENCERUN_ETCD_PASSWORD", k_password}});
  ASSERT_EQ(e.exit_code, 0) << e;
  EXPECT_EQ(e.out.find(k_password), std::string::npos) << "the password reached the job's environment\n" << e.out;
  EXPECT_EQ(e.err.find(k_password), std::string::npos) << e.err;
  EXPECT_TRUE(nothing_left("authjob"));
}

TEST_F(EtcdAuthTest, WrongOrMissingPasswordIsUnavailableNamingAuth) {
  auto r = run(sh_args_url(etcd().url_with_user("root:wrong"), "authbad", "echo ran > ran"));
  EXPECT_EQ(r.exit_code, exit_code::k_unavailable) << r;
  EXPECT_NE(lower_case(r.err).find("auth"), std::string::npos) << "stderr names authentication\n" << r;
  EXPECT_EQ(r.err.find("wrong"), std::string::npos) << "the password is in the message\n" << r;

  auto n = run(sh_args_url(etcd().url(), "authbad", "echo ran > ran"));
  EXPECT_EQ(n.exit_code, exit_code::k_unavailable) << n;

  auto u = run(sh_args_url(etcd().url_with_user("nobody:x"), "authbad", "echo ran > ran"));
  EXPECT_EQ(u.exit_code, exit_code::k_unavailable) << u;
  EXPECT_NE(lower_case(u.err).find("auth"), std::string::npos) << u;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_TRUE(nothing_left("authbad"));
  EXPECT_TRUE(etcd().keys(lock_prefix("authbad")).empty());
}

// --- TLS -----------------------------------------------------------------------------------------

class EtcdTlsTest : public EtcdOwnTest {
 protected:
  EtcdOptions cluster_options() const override {
    EtcdOptions o;
    o.tls = true;
    return o;
  }
};

TEST_F(EtcdTlsTest, VerifiedServerAcquires) {
  auto r = run({"-r", etcd().url(), "--tls-ca-file", etcd().certs().ca_crt.string(), "tlsjob", "--", "printenv",
                "FENCERUN_TOKEN"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_GT(token_of(r.out).value_or(0), kMinEtcdToken) << r;
  auto s = run({"-r", etcd().url(), "--tls-ca-file", etcd().certs().ca_crt.string(), "--tls-server-name", "localhost",
                "tlsjob", "--", "true"});
  EXPECT_EQ(s.exit_code, 0) << s;
  EXPECT_TRUE(nothing_left("tlsjob"));
}

TEST_F(EtcdTlsTest, NameMismatchUntrustedCaAndPlainTextAreUnavailable) {
  const std::string ca = etcd().certs().ca_crt.string();
  auto m = run(sh_args("tlsbad", "echo ran > ran", {"--tls-ca-file", ca, "--tls-server-name", "other.example"}));
  EXPECT_EQ(m.exit_code, exit_code::k_unavailable) << "a certificate for another name\n" << m;
  auto c = run(sh_args("tlsbad", "echo ran > ran", {"--tls-ca-file", etcd().certs().other_ca_crt.string()}));
  EXPECT_EQ(c.exit_code, exit_code::k_unavailable) << "a certificate from an untrusted CA\n" << c;
  std::string plain = etcd().url();
  plain.replace(0, std::string("etcds").size(), "etcd");
  auto p = run(sh_args_url(plain, "tlsbad", "echo ran > ran", {"--timeout", "1s"}));
  EXPECT_EQ(p.exit_code, exit_code::k_unavailable) << "plain text to TLS members\n" << p;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_TRUE(nothing_left("tlsbad"));
  EXPECT_TRUE(etcd().keys(lock_prefix("tlsbad")).empty());
}

}  // namespace
}  // namespace fencerun::test

namespace fencerun::test {
namespace {

// Members that require a client certificate: --tls-cert/--tls-key pass, no certificate is refused.
class EtcdMutualTlsTest : public EtcdOwnTest {
 protected:
  EtcdOptions cluster_options() const override {
    EtcdOptions o;
    o.tls = true;
    o.client_cert_auth = true;
    return o;
  }
};

TEST_F(EtcdMutualTlsTest, ClientCertificateRequired) {
  const auto& c = etcd().certs();
  auto ok = run({"-r", etcd().url(), "--tls-ca-file", c.ca_crt.string(), "--tls-cert", c.client_crt.string(),
                 "--tls-key", c.client_key.string(), "mtls", "--", "printenv", "FENCERUN_TOKEN"});
  ASSERT_EQ(ok.exit_code, 0) << ok;
  EXPECT_GT(token_of(ok.out).value_or(0), kMinEtcdToken) << ok;
  auto none = run(sh_args("mtls", "echo ran > ran", {"--tls-ca-file", c.ca_crt.string(), "--timeout", "1s"}));
  EXPECT_EQ(none.exit_code, exit_code::k_unavailable) << "no client certificate\n" << none;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_TRUE(nothing_left("mtls"));
}

}  // namespace
}  // namespace fencerun::test
