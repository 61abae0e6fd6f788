#pragma once
// The contract suite: one set of black-box scenarios (the real fencerun binary as a child process)
// run against every backend setup fencerun supports, each started on loopback by the test with the
// shared test support code:
//
//   redis     one redis-server                         -r redis://127.0.0.1:P
//   sentinel  a master, its replica and one sentinel   -r redis+sentinel://127.0.0.1:S/mymaster
//   quorum    three independent redis-servers          -r URL -r URL -r URL
//   etcd      a 3-member etcd cluster                  -r etcd://h:p,h:p,h:p
//
// The setup is the test's parameter, so every test name ends in it
// (Contract/Exclusion.MutualExclusion/etcd). Scenarios that do not hurt the servers share one
// setup per suite (each test uses lock names of its own); chaos scenarios (servers or fencerun
// frozen or killed) start a setup per test. What a backend declares it cannot do is in
// capabilities(): there the scenario checks the refusal (exit 64, the option named) instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "deploy_support.hpp"
#include "etcd_fixture.hpp"
#include "support/etcd_cluster.hpp"
#include "support/json.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"

namespace fencerun::test::contract {

enum class SetupId { redis, sentinel, quorum, etcd };

inline std::string to_string(SetupId s) {
  switch (s) {
    case SetupId::redis: return "redis";
    case SetupId::sentinel: return "sentinel";
    case SetupId::quorum: return "quorum";
    case SetupId::etcd: return "etcd";
  }
  return "?";
}

inline std::string setup_name(const ::testing::TestParamInfo<SetupId>& info) { return to_string(info.param); }

// What each setup supports today. A scenario that needs what a setup lacks asserts the refusal
// instead: exit 64 and the option (or subcommand) named on stderr.
struct Capabilities {
  bool fair;                  // --fair: waiters acquire in the order they began waiting
  bool break_lock;            // `break NAME --yes`
  bool last_token_when_free;  // status --json has last_token once the lock is free again
  bool every;                 // --every: once per schedule slot
  bool if_record_lost;        // --if-record-lost skip
};

inline Capabilities capabilities(SetupId s) {
  switch (s) {
    case SetupId::redis: return {.fair = true, .break_lock = true, .last_token_when_free = true, .every = true,
                                 .if_record_lost = true};
    case SetupId::sentinel:
      return {.fair = true, .break_lock = true, .last_token_when_free = true, .every = true, .if_record_lost = true};
    // Quorum mode refuses --fair and break (exit 64).
    case SetupId::quorum: return {.fair = false, .break_lock = false, .last_token_when_free = true, .every = true,
                                  .if_record_lost = false};
    // etcd's queue is first come, first served (--fair is accepted and is how it always works);
    // its last token is the newest key's, so a free lock has none (the record keeps it).
    case SetupId::etcd: return {.fair = true, .break_lock = true, .last_token_when_free = false, .every = true,
                                .if_record_lost = true};
  }
  return {};
}

// A running setup: the -r options that reach it, the environment its clients need, and the faults
// the chaos scenarios inject.
class Backend {
 public:
  explicit Backend(SetupId s) : m_setup(s) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  SetupId setup() const { return m_setup; }
  virtual std::vector<std::string> urls() const = 0;  // "-r", URL, ...
  virtual EnvList env() const { return {}; }
  // Freezes (SIGSTOP) enough servers that no renewal can succeed; thaw_all() undoes it.
  virtual void lose_majority() = 0;
  virtual void thaw_all() = 0;
  virtual std::string logs() const = 0;

 private:
  SetupId m_setup;
};

class RedisBackend : public Backend {
 public:
  RedisBackend() : Backend(SetupId::redis), m_server(std::make_unique<RedisServer>()) {}
  std::vector<std::string> urls() const override { return {"-r", m_server->url()}; }
  void lose_majority() override { m_server->freeze(); }
  void thaw_all() override {
    if (m_server->frozen()) m_server->thaw();
  }
  std::string logs() const override { return "--- redis " + m_server->url() + " ---\n" + m_server->log(); }
  RedisServer& server() { return *m_server; }

 private:
  std::unique_ptr<RedisServer> m_server;
};

// A master, a replica and one sentinel (quorum 1) monitoring them as `mymaster`.
class SentinelBackend : public Backend {
 public:
  static constexpr const char* kMaster = "mymaster";
  SentinelBackend() : Backend(SetupId::sentinel) {
    m_master = std::make_unique<RedisServer>(deploy::replication_options());
    m_replica = std::make_unique<RedisServer>(deploy::replication_options(m_master->port()));
    deploy::wait_replica_online(*m_master, *m_replica);
    m_sentinel = std::make_unique<deploy::SentinelProcess>(kMaster, m_master->port(), 1);
    if (!wait_until([&] { return healthy(); }, 20s, 50ms))
      throw std::runtime_error("the sentinel did not see a healthy replica within 20s\n" + logs());
  }
  std::vector<std::string> urls() const override {
    return {"-r", "redis+sentinel://127.0.0.1:" + std::to_string(m_sentinel->port()) + "/" + kMaster};
  }
  // Both data servers: with the replica frozen too, the sentinel has nothing to fail over to.
  void lose_majority() override {
    m_master->freeze();
    m_replica->freeze();
  }
  void thaw_all() override {
    for (auto* s : {m_master.get(), m_replica.get()})
      if (s->frozen()) s->thaw();
    m_sentinel->thaw();
  }
  std::string logs() const override {
    return "--- master " + m_master->url() + " ---\n" + m_master->log() + "--- replica " + m_replica->url() +
           " ---\n" + m_replica->log() + "--- sentinel ---\n" + m_sentinel->log();
  }
  RedisServer& master() { return *m_master; }
  RedisServer& replica() { return *m_replica; }

  // The sentinel sees the replica with a working link, and the master as master.
  bool healthy() const {
    Reply replicas = m_sentinel->cmd({"SENTINEL", "REPLICAS", kMaster});
    if (replicas.type != Reply::Type::Array || replicas.elements.size() != 1) return false;
    const Reply& r = replicas.elements[0];
    if (deploy::map_field(r, "flags") != "slave" || deploy::map_field(r, "master-link-status") != "ok") return false;
    return deploy::map_field(m_sentinel->cmd({"SENTINEL", "MASTER", kMaster}), "flags") == "master";
  }
  // SENTINEL FAILOVER, then waits until the sentinel names the replica master and it says so itself.
  void failover(Clock::duration timeout = 20s) {
    Reply r = m_sentinel->cmd({"SENTINEL", "FAILOVER", kMaster});
    if (r.type != Reply::Type::Status) throw std::runtime_error("SENTINEL FAILOVER: " + r.describe() + "\n" + logs());
    const int target = m_replica->port();
    if (!wait_until(
            [&] {
              Reply a = m_sentinel->cmd({"SENTINEL", "get-master-addr-by-name", kMaster});
              return a.type == Reply::Type::Array && a.elements.size() == 2 &&
                     a.elements[1].str == std::to_string(target) && deploy::role_of(target) == "master";
            },
            timeout, 20ms))
      throw std::runtime_error("the failover did not complete\n" + logs());
  }

 private:
  std::unique_ptr<RedisServer> m_master, m_replica;
  std::unique_ptr<deploy::SentinelProcess> m_sentinel;
};

// Three independent redis-servers. Every client gives the same lease cap (FENCERUN_QUORUM_MAX_TTL),
// short, so that a server restarted without its data counts again after a few seconds.
class QuorumBackend : public Backend {
 public:
  static constexpr std::size_t kServers = 3;
  QuorumBackend() : Backend(SetupId::quorum) {
    for (std::size_t i = 0; i < kServers; ++i) m_servers.push_back(std::make_unique<RedisServer>());
  }
  std::vector<std::string> urls() const override {
    std::vector<std::string> a;
    for (const auto& s : m_servers) a.insert(a.end(), {"-r", s->url()});
    return a;
  }
  EnvList env() const override { return {{"FENCERUN_QUORUM_MAX_TTL", "5s"}}; }
  void lose_majority() override {
    m_servers[0]->freeze();
    m_servers[1]->freeze();
  }
  void thaw_all() override {
    for (auto& s : m_servers)
      if (s->frozen()) s->thaw();
  }
  std::string logs() const override {
    std::string out;
    for (const auto& s : m_servers) out += "--- redis " + s->url() + " ---\n" + s->log();
    return out;
  }
  RedisServer& server(std::size_t i) { return *m_servers.at(i); }

 private:
  std::vector<std::unique_ptr<RedisServer>> m_servers;
};

class EtcdBackend : public Backend {
 public:
  EtcdBackend() : Backend(SetupId::etcd), m_cluster(std::make_unique<EtcdCluster>()) {}
  std::vector<std::string> urls() const override { return {"-r", m_cluster->url()}; }
  // Two of the three members: no majority, no keep-alive.
  void lose_majority() override {
    m_cluster->freeze(0);
    m_cluster->freeze(1);
  }
  void thaw_all() override {
    for (int i = 0; i < m_cluster->size(); ++i)
      if (m_cluster->frozen(i)) m_cluster->thaw(i);
  }
  std::string logs() const override { return m_cluster->logs(); }
  EtcdCluster& cluster() { return *m_cluster; }

 private:
  std::unique_ptr<EtcdCluster> m_cluster;
};

inline std::unique_ptr<Backend> make_backend(SetupId s) {
  switch (s) {
    case SetupId::redis: return std::make_unique<RedisBackend>();
    case SetupId::sentinel: return std::make_unique<SentinelBackend>();
    case SetupId::quorum: return std::make_unique<QuorumBackend>();
    case SetupId::etcd: return std::make_unique<EtcdBackend>();
  }
  throw std::logic_error("unknown setup");
}

// Records its pid, its token and a grandchild in its process group (pid, token, gpid), then runs
// until the file `go` appears; the grandchild is ended then.
inline constexpr const char* kHoldJob =
    "echo $$ > pid; echo \"$FENCERUN_TOKEN\" > token; sleep 1000 & echo $! > gpid; "
    "while [ ! -e go ]; do sleep 0.02; done; kill $!";

// The base of every contract test: the setup of the test's parameter (shared by the suite, or the
// test's own), a temp dir that is the working directory of the fencerun processes, and helpers.
class ContractTest : public ::testing::TestWithParam<SetupId> {
 protected:
  // Chaos fixtures start the setup per test.
  virtual bool own_setup() const { return false; }

  static void TearDownTestSuite() { shared().clear(); }

  void SetUp() override {
    if (GetParam() == SetupId::etcd)
      if (auto why = EtcdCluster::missing(); !why.empty()) GTEST_SKIP() << why;
    if (own_setup()) {
      m_own = make_backend(GetParam());
      m_backend = m_own.get();
      return;
    }
    auto& slot = shared()[GetParam()];
    if (!slot) slot = make_backend(GetParam());
    m_backend = slot.get();
  }

  void TearDown() override {
    if (m_backend) m_backend->thaw_all();
    for (pid_t p : m_cleanup) kill_if_alive(p);
    if (HasFailure() && m_backend) std::cout << m_backend->logs() << "\n";
    m_own.reset();
  }

  SetupId setup() const { return GetParam(); }
  Capabilities caps() const { return capabilities(GetParam()); }
  Backend& backend() { return *m_backend; }
  template <class T>
  T& backend_as() {
    return dynamic_cast<T&>(*m_backend);
  }

  const TempDir& dir() const { return m_dir; }
  std::filesystem::path file(std::string_view name) const { return m_dir / name; }
  void touch(std::string_view name) const { write_file(file(name), ""); }

  SpawnOptions spawn_options(EnvList env = {}) const {
    SpawnOptions o;
    o.env = m_backend->env();
    o.env.insert(o.env.end(), env.begin(), env.end());
    o.cwd = m_dir.path();
    return o;
  }

  // -r URL... ARGS...
  std::vector<std::string> with_urls(std::vector<std::string> args) const {
    auto a = m_backend->urls();
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
  // -r URL... OPTIONS... NAME -- sh -c SCRIPT, with --ttl 3s unless OPTIONS give one (short
  // enough for every setup: quorum mode's lease cap is FENCERUN_QUORUM_MAX_TTL, 5s here).
  std::vector<std::string> sh_args(const std::string& name, const std::string& script,
                                   std::vector<std::string> options = {}) const {
    if (std::ranges::find(options, "--ttl") == options.end()) options.insert(options.begin(), {"--ttl", "3s"});
    auto a = with_urls(std::move(options));
    a.insert(a.end(), {name, "--", "sh", "-c", script});
    return a;
  }

  RunResult run(std::vector<std::string> args, EnvList env = {}, Clock::duration timeout = 60s) const {
    return run_fencerun(std::move(args), spawn_options(std::move(env)), timeout);
  }
  std::unique_ptr<FencerunProcess> start(std::vector<std::string> args, EnvList env = {}) const {
    return std::make_unique<FencerunProcess>(std::move(args), spawn_options(std::move(env)));
  }
  // A subcommand (status, list, history, break) against the setup.
  RunResult admin(std::vector<std::string> args) const { return run(with_urls(std::move(args)), {}, 30s); }

  // status NAME --json: the exit code and the object (nullopt when the output is no JSON).
  std::pair<int, std::optional<Json>> status_json(const std::string& name) const {
    auto r = admin({"status", name, "--json"});
    return {r.exit_code, parse_json(r.out)};
  }

  // Waits for a pid file written by a child command; the pid is SIGKILLed at teardown if it runs.
  pid_t wait_pid(std::string_view name, Clock::duration timeout = 20s) {
    auto p = wait_for_pid_file(file(name), timeout);
    if (!p) throw std::runtime_error("no pid in " + file(name).string() + " within deadline");
    m_cleanup.push_back(*p);
    return *p;
  }
  std::string wait_line(std::string_view name, Clock::duration timeout = 20s) const {
    auto l = wait_for_line(file(name), timeout);
    if (!l) throw std::runtime_error("no line in " + file(name).string() + " within deadline");
    return *l;
  }
  long long wait_token(std::string_view name, Clock::duration timeout = 20s) const {
    const auto l = wait_line(name, timeout);
    auto t = token_of(l);
    if (!t) throw std::runtime_error("not a token in " + file(name).string() + ": '" + l + "'");
    return *t;
  }

  static std::string field(const Json& j, std::string_view key) {
    const Json* f = j.find(key);
    if (!f) return "<missing>";
    if (f->kind == Json::Kind::Null) return "null";
    return f->text;
  }

 private:
  static std::map<SetupId, std::unique_ptr<Backend>>& shared() {
    static std::map<SetupId, std::unique_ptr<Backend>> s;
    return s;
  }

  Backend* m_backend = nullptr;
  std::unique_ptr<Backend> m_own;
  TempDir m_dir{"contract"};
  std::vector<pid_t> m_cleanup;
};

// A setup of its own for each test: servers or fencerun are frozen or killed.
class ContractChaosTest : public ContractTest {
 protected:
  bool own_setup() const override { return true; }
};

inline const auto kAllSetups = ::testing::Values(SetupId::redis, SetupId::sentinel, SetupId::quorum, SetupId::etcd);

}  // namespace fencerun::test::contract
