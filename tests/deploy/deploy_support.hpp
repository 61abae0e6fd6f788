#pragma once
// Fixtures for the deployment tests: the Redis topologies fencerun meets in production, started on
// loopback by the test and torn down by pid afterwards (TLS with mutual authentication, ACL users,
// replicas, Sentinel, Cluster). Built on the shared test support library (processes, temp dirs,
// RedisServer) with what it lacks added here.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"

namespace fencerun::test::deploy {

// Programs the tests need besides redis-server; empty when CMake did not find them.
const std::string& redis_cli_program();
const std::string& openssl_program();
bool program_usable(const std::string& path);

// Where a test-side connection goes: TCP on 127.0.0.1 or a unix socket, optionally with AUTH.
struct Target {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string unix_path;  // used instead of host:port when set
  std::string user;
  std::optional<std::string> password;
};

inline Target tcp(int port) { return Target{"127.0.0.1", port, {}, {}, std::nullopt}; }

// One command on a fresh connection (AUTH first when a password is set).
Reply call(const Target& t, const std::vector<std::string>& args,
           std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));

// Several commands on one connection, one reply each (e.g. ASKING followed by a keyed command).
std::vector<Reply> call_many(const Target& t, const std::vector<std::vector<std::string>>& commands,
                             std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));

// "field:value" lines of an INFO reply; nullopt when the field is absent.
std::optional<std::string> info_field(const std::string& info, std::string_view field);
// Flat [k1, v1, k2, v2, ...] array (SENTINEL MASTER / REPLICAS entries) -> value of `key`.
std::optional<std::string> map_field(const Reply& flat, std::string_view key);

std::vector<std::string> split_words(std::string_view s);

// Reads a token written by a child command (decimal, one line).
long long read_token(const std::filesystem::path& p, Clock::duration timeout = 10s);

// ---------------------------------------------------------------------------------------------
// Replication on plain RedisServers.

// Options for a replication-ready server (no diskless delay), optionally a replica of `master_port`.
RedisOptions replication_options(std::optional<int> master_port = std::nullopt);
// Waits until `replica` reports master_link_status:up and `master` lists it online. Throws on timeout.
void wait_replica_online(const RedisServer& master, const RedisServer& replica,
                         Clock::duration timeout = 15s);
// Waits until `replica` has `key` equal to `value` (nullopt: key absent). Returns success.
bool wait_replicated(const RedisServer& replica, const std::string& key,
                     const std::optional<std::string>& value, Clock::duration timeout = 10s);

// ---------------------------------------------------------------------------------------------
// TLS: certificates made with openssl, and a TLS-only redis-server.

struct Certs {
  std::filesystem::path ca_crt, ca_key;
  std::filesystem::path server_crt, server_key;  // SAN IP:127.0.0.1, DNS:localhost; signed by ca
  std::filesystem::path client_crt, client_key;  // signed by ca
  std::filesystem::path other_ca_crt;            // a CA that signed nothing here
};

// Generates everything in `dir`; throws with openssl's output when a step fails.
Certs make_certs(const std::filesystem::path& dir);

class TlsRedisServer {
 public:
  // --port 0 --tls-port P; `auth_clients` sets --tls-auth-clients yes|no. Test-side commands go
  // over the unix socket in the server's directory (no TLS needed there).
  TlsRedisServer(const Certs& certs, bool auth_clients);
  ~TlsRedisServer();
  TlsRedisServer(const TlsRedisServer&) = delete;
  TlsRedisServer& operator=(const TlsRedisServer&) = delete;

  int tls_port() const { return port_; }
  Target admin() const;
  Reply cmd(const std::vector<std::string>& args) const { return call(admin(), args); }
  std::string log() const;

 private:
  TempDir dir_{"tls-redis"};
  std::unique_ptr<Process> proc_;
  int port_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Sentinel: a master, a replica and three sentinels monitoring them as `mymaster`.

class SentinelProcess {
 public:
  SentinelProcess(const std::string& master_name, int master_port, int quorum);
  ~SentinelProcess();
  SentinelProcess(const SentinelProcess&) = delete;
  SentinelProcess& operator=(const SentinelProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return proc_ ? proc_->pid() : -1; }
  Reply cmd(const std::vector<std::string>& args) const { return call(tcp(port_), args); }
  std::string log() const;
  void stop();
  // SIGSTOP: the sentinel keeps its listening socket, so connects succeed and requests hang.
  // Returns once /proc shows it stopped. thaw() sends SIGCONT (also done by stop()).
  void freeze();
  void thaw();

 private:
  TempDir dir_{"sentinel"};
  std::unique_ptr<Process> proc_;
  int port_ = 0;
};

class SentinelTopology {
 public:
  static constexpr const char* kMaster = "mymaster";
  SentinelTopology();  // starts everything and waits until the sentinels see a healthy replica

  RedisServer& master() { return *master_; }
  RedisServer& replica() { return *replica_; }
  RedisServer* server_on(int port);  // master or replica by port
  SentinelProcess& sentinel(int i) { return *sentinels_.at(static_cast<size_t>(i)); }
  // redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/mymaster, optionally with a dead
  // address placed first.
  std::string url(std::optional<int> dead_port_first = std::nullopt) const;

  // The master address sentinel i reports (port), or nullopt.
  std::optional<int> reported_master_port(int i = 0) const;
  // True when every sentinel reports the replica with master-link-status ok and knows the two
  // other sentinels.
  bool healthy() const;
  // SENTINEL FAILOVER on sentinel 0, then waits until sentinel 0 reports the replica as master and
  // the replica's ROLE says master. Returns the new master's port. Throws on timeout.
  int failover(Clock::duration timeout = 20s);
  std::string logs() const;  // all server and sentinel logs, for failure messages

 private:
  std::unique_ptr<RedisServer> master_;
  std::unique_ptr<RedisServer> replica_;
  std::vector<std::unique_ptr<SentinelProcess>> sentinels_;
};

// ROLE of the server on `port`: "master", "slave", or "" when it does not answer.
std::string role_of(int port);

// ---------------------------------------------------------------------------------------------
// Cluster: three masters, no replicas.

class ClusterNodes {
 public:
  ClusterNodes();  // starts the nodes, runs redis-cli --cluster create, waits for cluster_state:ok

  size_t size() const { return nodes_.size(); }
  RedisServer& node(size_t i) { return *nodes_.at(i); }
  std::string node_id(size_t i) const;            // CLUSTER MYID
  long long keyslot(const std::string& key) const;  // CLUSTER KEYSLOT
  // Index of the node owning `slot` according to CLUSTER SLOTS (asked of node 0).
  size_t owner_of(long long slot) const;
  std::string logs() const;

 private:
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

// ---------------------------------------------------------------------------------------------
// Base fixture: a work dir (cwd of the fencerun processes, so `sh -c` commands write relative
// files), spawn helpers, and cleanup of pids recorded by child commands.

class DeployTest : public ::testing::Test {
 protected:
  void TearDown() override;

  const TempDir& dir() const { return dir_; }
  std::filesystem::path file(std::string_view name) const { return dir_ / name; }
  void touch(std::string_view name) const { write_file(file(name), ""); }

  SpawnOptions spawn_options(EnvList env = {}) const;
  RunResult run(std::vector<std::string> args, EnvList env = {}, Clock::duration timeout = 60s) const;
  std::unique_ptr<FencerunProcess> start(std::vector<std::string> args, EnvList env = {}) const;

  // args: -r URL, options..., NAME -- sh -c SCRIPT
  static std::vector<std::string> sh_args(const std::string& url, const std::string& name,
                                          const std::string& script,
                                          std::vector<std::string> options = {});

  // Waits for a pid file written by a child; SIGKILLed at teardown if still alive.
  pid_t wait_pid(std::string_view name, Clock::duration timeout = 15s);

  // Extra text printed when the test failed (server logs).
  std::vector<std::function<std::string()>> on_failure_;

 private:
  TempDir dir_{"deploy"};
  std::vector<pid_t> cleanup_pids_;
};

// Prints "[ tag ] exit N: <stderr>" to the test's output, so that a verbose ctest run shows what
// fencerun said in each situation.
void note(std::string_view tag, const RunResult& r);

// A command that records its token, then runs until the file `go` appears in its cwd.
inline constexpr const char* kTokenUntilGo =
    "echo $$ > pid; echo \"$FENCERUN_TOKEN\" > token; while [ ! -e go ]; do sleep 0.02; done";

}  // namespace fencerun::test::deploy
