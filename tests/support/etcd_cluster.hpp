#pragma once
// EtcdCluster: a real etcd cluster on loopback for the etcd tests (tests/etcd): 3 members by
// default (1 allowed), each an `etcd` process owned by the test with its own client and peer ports
// below 32768, its own data directory and log, all under one temp dir; one initial-cluster token
// per cluster. Members can be killed (SIGKILL), restarted on the same data dir, frozen (SIGSTOP)
// and thawed; every member is thawed and killed at destruction.
//
//   EtcdCluster etcd;                          // throws when the cluster does not become healthy
//   run_fencerun({"-r", etcd.url(), "job", "--", "true"});
//   etcd.kill(etcd.leader()); etcd.wait_for_new_leader(old);
//
// Options: TLS on the client URLs (a CA and a server certificate for 127.0.0.1/localhost made with
// openssl; the peers stay plain http) and etcd's auth (user root with a password, enabled after
// start). etcd and etcdctl come from PATH; EtcdCluster::missing() says what is not there.
#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/process.hpp"
#include "support/util.hpp"

namespace fencerun::test {

struct EtcdCerts {
  std::filesystem::path ca_crt, ca_key;
  std::filesystem::path server_crt, server_key;  // for IP:127.0.0.1 and DNS:localhost
  std::filesystem::path client_crt, client_key;  // signed by ca_crt
  std::filesystem::path other_ca_crt;            // an unrelated CA
};

// Makes the certificates of EtcdCerts in `dir` with openssl (throws when openssl fails).
EtcdCerts make_etcd_certs(const std::filesystem::path& dir);

struct EtcdOptions {
  int members = 3;
  bool tls = false;                       // https client URLs (server certificate, CA)
  bool client_cert_auth = false;          // with tls: members require a client certificate
  std::optional<std::string> root_password;  // enable auth with user root and this password
  Clock::duration start_timeout = 20s;
};

class EtcdCluster {
 public:
  explicit EtcdCluster(EtcdOptions opts = {});
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Empty when etcd and etcdctl are on PATH, else the reason to skip ("etcd not found: ...").
  static std::string missing();

  int size() const { return static_cast<int>(m_members.size()); }
  const EtcdOptions& options() const { return m_opts; }
  const TempDir& dir() const { return m_dir; }
  const EtcdCerts& certs() const { return m_certs; }  // with tls only

  // "etcd://127.0.0.1:C0,127.0.0.1:C1,127.0.0.1:C2" (etcds:// with tls), no user or password.
  std::string url() const;
  // The same with `userinfo@` ("root:pw" or "root") after the scheme.
  std::string url_with_user(const std::string& userinfo) const;
  std::string endpoint(int i) const;    // "127.0.0.1:C_i"
  std::string client_url(int i) const;  // "http://127.0.0.1:C_i" (https with tls)
  int client_port(int i) const;
  int peer_port(int i) const;
  pid_t pid(int i) const;  // -1 while killed

  bool running(int i) const;  // started and not killed (may be frozen)
  bool frozen(int i) const;

  // The index of the member that is leader now (asked of every running, unfrozen member; the one
  // whose status names itself leader), or -1 when none is found within `timeout`.
  int leader(Clock::duration timeout = 10s);
  // Waits until a member other than `old` is leader and answers; its index, or -1 on timeout.
  int wait_for_new_leader(int old, Clock::duration timeout = 15s);
  // Polls `etcdctl endpoint health` on the running, unfrozen members until all say healthy.
  bool wait_healthy(Clock::duration timeout = 10s);

  void kill(int i);     // SIGKILL and reap (the log is kept)
  void restart(int i);  // start again on the same data dir and ports; waits until it is healthy
  void freeze(int i);   // SIGSTOP; waits until it is stopped
  void thaw(int i);     // SIGCONT

  // etcdctl with the cluster's endpoints (running, unfrozen members unless `endpoints` is given),
  // TLS and auth options; dial and command timeouts of 2 s.
  RunResult etcdctl(std::vector<std::string> args,
                    std::optional<std::string> endpoints = std::nullopt) const;
  // Its stdout; throws with the whole result when etcdctl fails.
  std::string etcdctl_ok(std::vector<std::string> args) const;
  // `get --prefix --keys-only PREFIX`: the keys, sorted as etcd returns them.
  std::vector<std::string> keys(const std::string& prefix) const;
  // `lease list`: the lease ids as etcdctl prints them (hex, no leading zeros).
  std::vector<std::string> leases() const;
  // `get KEY --print-value-only`; nullopt when the key does not exist.
  std::optional<std::string> get(const std::string& key) const;

  // The members' logs (also of killed incarnations), for failure messages.
  std::string logs() const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::filesystem::path data_dir;
    std::unique_ptr<Process> proc;
    bool frozen = false;
    std::string old_log;
  };
  std::vector<std::string> member_argv(int i) const;
  void start_member(int i);
  bool try_start(std::string* why);
  void stop_all();
  std::string live_endpoints() const;
  std::vector<std::string> client_options() const;

  EtcdOptions m_opts;
  TempDir m_dir;
  EtcdCerts m_certs;
  std::string m_token;
  std::vector<Member> m_members;
  bool m_auth = false;
};

}  // namespace fencerun::test
