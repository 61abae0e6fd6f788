// Name resolution is bounded by --timeout. The test makes resolution hang for real: fencerun runs in
// a mount namespace of its own (unshare -m) where /etc/resolv.conf points at 127.0.0.1:53, a UDP
// socket this test owns that reads every query and never answers, and /etc/hosts is a file the test
// can rewrite while fencerun runs. glibc would wait 5 s per try there; fencerun must give up at its
// deadline, on the acquire path and on the renewal thread's reconnect alike. Needs root and
// unshare(1); skips otherwise.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <thread>

#include "deploy_support.hpp"

namespace fencerun::test::deploy {
namespace {

constexpr const char* kHost = "redis.invalid-test.example";

// A nameserver that never answers: binds 127.0.0.1:53/udp and counts the queries it swallows.
class SilentNameserver {
 public:
  SilentNameserver() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      why_ = std::string("socket: ") + std::strerror(errno);
      return;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(53);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      why_ = std::string("cannot bind 127.0.0.1:53/udp: ") + std::strerror(errno);
      ::close(fd_);
      fd_ = -1;
      return;
    }
    thread_ = std::thread([this] { swallow(); });
  }
  ~SilentNameserver() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  SilentNameserver(const SilentNameserver&) = delete;
  SilentNameserver& operator=(const SilentNameserver&) = delete;

  bool ok() const { return fd_ >= 0; }
  const std::string& why() const { return why_; }
  int queries() const { return queries_.load(); }

 private:
  void swallow() {
    char buf[1500];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      if (::recv(fd_, buf, sizeof buf, 0) > 0) ++queries_;
    }
  }

  int fd_ = -1;
  std::string why_;
  std::atomic<bool> stop_{false};
  std::atomic<int> queries_{0};
  std::thread thread_;
};

class ResolverTest : public DeployTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (mount namespace with a bind-mounted resolv.conf)";
    unshare_ = find_in_path("unshare");
    if (unshare_.empty()) GTEST_SKIP() << "unshare(1) not found";
    RunResult probe = run_program({unshare_, "-m", "true"}, {}, 10s);
    if (probe.exit_code != 0) GTEST_SKIP() << "unshare -m does not work here: " << trim(probe.err);
    dns_ = std::make_unique<SilentNameserver>();
    if (!dns_->ok()) GTEST_SKIP() << dns_->why();
    // Generous resolver timeouts, so that only fencerun's own deadline can end a lookup in time.
    write_file(file("resolv.conf"), "nameserver 127.0.0.1\noptions timeout:5 attempts:2\n");
    write_file(file("hosts"), "127.0.0.1 localhost\n");
  }

  static std::string find_in_path(const std::string& name) {
    for (const char* dir : {"/usr/bin", "/bin", "/usr/sbin", "/sbin"}) {
      std::string p = std::string(dir) + "/" + name;
      if (::access(p.c_str(), X_OK) == 0) return p;
    }
    return "";
  }

  // unshare -m sh -c 'mount --bind ... && exec fencerun ARGS': the process is fencerun itself.
  std::vector<std::string> in_namespace(const std::vector<std::string>& fencerun_args) const {
    std::string script = "mount --bind " + shell_quote(file("resolv.conf").string()) + " /etc/resolv.conf && " +
                         "mount --bind " + shell_quote(file("hosts").string()) + " /etc/hosts && exec " +
                         shell_quote(fencerun_binary());
    for (const auto& a : fencerun_args) script += " " + shell_quote(a);
    return {unshare_, "-m", "sh", "-c", script};
  }

  std::string unshare_;
  std::unique_ptr<SilentNameserver> dns_;
};

TEST_F(ResolverTest, HungNameResolutionIsBoundedByTimeoutOnAcquire) {
  const std::string url = std::string("redis://") + kHost + ":6379";
  RunResult r = run_program(in_namespace({"-r", url, "--timeout", "500ms", "job", "--", "touch", "ran"}),
                            spawn_options(), 30s);
  note("hung resolver", r);
  std::cout << "[ hung resolver ] exit " << r.exit_code << " after " << r.elapsed.count() << " ms; "
            << dns_->queries() << " DNS queries swallowed\n";
  EXPECT_GT(dns_->queries(), 0) << "the lookup never reached the silent nameserver\n" << r;
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_LT(r.elapsed, 2000ms) << "resolution must be bounded by --timeout 500ms\n" << r;
  EXPECT_EQ(split_lines(trim(r.err)).size(), 1u) << r;
  EXPECT_NE(r.err.find("resolving redis.invalid-test.example timed out"), std::string::npos) << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
}

// The name resolves (through the bind-mounted hosts file) when the lease is taken; then it stops
// resolving and the connection is killed, so the renewal thread must reconnect through the hung
// resolver. Renewals fail within their deadlines and the command is stopped before the lease
// could expire, not once glibc gives up 10 s later.
TEST_F(ResolverTest, HungNameResolutionDoesNotDelayTheStopWhileHeld) {
  RedisServer redis;
  write_file(file("hosts"), std::string("127.0.0.1 localhost\n127.0.0.1 ") + kHost + "\n");
  const std::string url = std::string("redis://") + kHost + ":" + std::to_string(redis.port());
  Process holder(in_namespace({"-r", url, "--timeout", "500ms", "--ttl", "2s", "job", "--", "sh", "-c",
                               kTokenUntilGo}),
                 spawn_options());
  const pid_t command_pid = wait_pid("pid");
  ASSERT_TRUE(redis.exists(lock_key("job"))) << holder.result();

  write_file(file("hosts"), "127.0.0.1 localhost\n");
  const auto killed_at = Clock::now();
  Reply k = redis.cmd({"CLIENT", "KILL", "TYPE", "normal"});
  ASSERT_TRUE(k.ok()) << k.describe();

  ASSERT_TRUE(holder.wait_for_exit(20s)) << holder.result();
  const RunResult hr = holder.result();
  const long long exited_after = ms_between(killed_at, holder.exited_at());
  std::cout << "[ hung resolver ] connection killed; fencerun exited " << hr.exit_code << " after "
            << exited_after << " ms; " << dns_->queries() << " DNS queries swallowed\n"
            << "--- stderr ---\n" << hr.err << "--------------\n";
  EXPECT_GT(dns_->queries(), 0) << "the reconnect never reached the silent nameserver";
  EXPECT_EQ(hr.exit_code, 124) << hr;
  EXPECT_TRUE(wait_dead(command_pid, 5s)) << "the command must have been stopped";
  EXPECT_LT(exited_after, 3500) << "the stop must come before the 2 s lease could expire, plus a margin";
  EXPECT_NE(hr.err.find("resolving redis.invalid-test.example timed out"), std::string::npos) << hr;
}

}  // namespace
}  // namespace fencerun::test::deploy
