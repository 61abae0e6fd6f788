#include "deploy_support.hpp"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/server_under_test.hpp"

#ifndef REDIS_CLI_EXECUTABLE
#define REDIS_CLI_EXECUTABLE ""
#endif
#ifndef OPENSSL_EXECUTABLE
#define OPENSSL_EXECUTABLE ""
#endif

namespace fencerun::test::deploy {

namespace {

// Starts `argv`, waits until INFO over `t` shows the process's pid. False when it exited or did
// not answer within 10 s (the process is then killed).
bool start_and_wait(std::unique_ptr<Process>& proc, std::vector<std::string> argv, const Target& t,
                    std::string* why) {
  SpawnOptions so;
  so.scrub_env = false;
  proc = std::make_unique<Process>(std::move(argv), so);
  const auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline) {
    if (!proc->running()) {
      *why = "exited with " + std::to_string(proc->exit_code().value_or(-1));
      proc.reset();
      return false;
    }
    Reply r = call(t, {"INFO", "server"}, 500ms);
    if (r.type == Reply::Type::String) {
      if (info_field(r.str, "process_id") == std::to_string(proc->pid())) return true;
      *why = "another process answers on port " + std::to_string(t.port);
    } else {
      *why = "INFO: " + r.describe();
    }
    std::this_thread::sleep_for(5ms);
  }
  proc->kill_and_reap();
  proc.reset();
  *why += " (not ready within 10s)";
  return false;
}

void run_or_throw(const std::vector<std::string>& argv, const std::filesystem::path& cwd) {
  SpawnOptions so;
  so.cwd = cwd;
  so.scrub_env = false;
  RunResult r = run_program(argv, so, 30s);
  if (r.exit_code != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += " " + a;
    throw std::runtime_error("command failed:" + cmd + "\n" + r.describe());
  }
}

}  // namespace

const std::string& redis_cli_program() {
  static const std::string p = REDIS_CLI_EXECUTABLE;
  return p;
}
const std::string& openssl_program() {
  static const std::string p = OPENSSL_EXECUTABLE;
  return p;
}
bool program_usable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0;
}

Reply call(const Target& t, const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  return call_many(t, {args}, timeout).front();
}

std::vector<Reply> call_many(const Target& t, const std::vector<std::vector<std::string>>& commands,
                             std::chrono::milliseconds timeout) {
  std::vector<Reply> out;
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  redisContext* c = t.unix_path.empty() ? redisConnectWithTimeout(t.host.c_str(), t.port, tv)
                                        : redisConnectUnixWithTimeout(t.unix_path.c_str(), tv);
  Reply fail;
  if (!c) {
    fail.str = "cannot allocate a hiredis context";
    return {fail};
  }
  std::unique_ptr<redisContext, void (*)(redisContext*)> guard(c, redisFree);
  if (c->err) {
    fail.str = c->errstr;
    return {fail};
  }
  redisSetTimeout(c, tv);
  if (t.password) {
    Reply a = t.user.empty() ? send_command(c, {"AUTH", *t.password}) : send_command(c, {"AUTH", t.user, *t.password});
    if (!a.ok()) return {a};
  }
  for (const auto& args : commands) out.push_back(send_command(c, args));
  return out;
}

std::optional<std::string> info_field(const std::string& info, std::string_view field) {
  for (const auto& line : split_lines(info)) {
    std::string l = trim(line);
    if (l.size() > field.size() && l.compare(0, field.size(), field) == 0 && l[field.size()] == ':')
      return l.substr(field.size() + 1);
  }
  return std::nullopt;
}

std::optional<std::string> map_field(const Reply& flat, std::string_view key) {
  for (size_t i = 0; i + 1 < flat.elements.size(); i += 2)
    if (flat.elements[i].str == key) return flat.elements[i + 1].str;
  return std::nullopt;
}

std::vector<std::string> split_words(std::string_view s) {
  std::istringstream in{std::string(s)};
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

long long read_token(const std::filesystem::path& p, Clock::duration timeout) {
  auto line = wait_for_line(p, timeout);
  if (!line) throw std::runtime_error("no token in " + p.string());
  auto v = parse_ll(*line);
  if (!v) throw std::runtime_error("not a token in " + p.string() + ": '" + *line + "'");
  return *v;
}

// ---------------------------------------------------------------------------------------------

RedisOptions replication_options(std::optional<int> master_port) {
  RedisOptions o;
  o.extra_args = {"--repl-diskless-sync-delay", "0", "--repl-diskless-sync", "yes"};
  if (master_port) {
    o.extra_args.insert(o.extra_args.end(),
                        {"--replicaof", "127.0.0.1", std::to_string(*master_port)});
  }
  return o;
}

void wait_replica_online(const RedisServer& master, const RedisServer& replica, Clock::duration timeout) {
  const std::string online = "port=" + std::to_string(replica.port()) + ",state=online";
  std::string last_master, last_replica;
  bool ok = wait_until(
      [&] {
        Reply m = master.cmd({"INFO", "replication"});
        Reply r = replica.cmd({"INFO", "replication"});
        last_master = m.str;
        last_replica = r.str;
        return m.type == Reply::Type::String && r.type == Reply::Type::String &&
               m.str.find(online) != std::string::npos &&
               info_field(r.str, "master_link_status") == "up";
      },
      timeout, 20ms);
  if (!ok)
    throw std::runtime_error("replica on port " + std::to_string(replica.port()) +
                             " never came online\n--- master ---\n" + last_master +
                             "\n--- replica ---\n" + last_replica);
}

bool wait_replicated(const RedisServer& replica, const std::string& key,
                     const std::optional<std::string>& value, Clock::duration timeout) {
  return wait_until(
      [&] {
        Reply r = replica.cmd({"GET", key});
        if (value) return r.type == Reply::Type::String && r.str == *value;
        return r.type == Reply::Type::Nil;
      },
      timeout, 10ms);
}

// ---------------------------------------------------------------------------------------------

Certs make_certs(const std::filesystem::path& dir) {
  const std::string ossl = openssl_program();
  Certs c;
  c.ca_crt = dir / "ca.crt";
  c.ca_key = dir / "ca.key";
  c.server_crt = dir / "server.crt";
  c.server_key = dir / "server.key";
  c.client_crt = dir / "client.crt";
  c.client_key = dir / "client.key";
  c.other_ca_crt = dir / "other-ca.crt";
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                       "-nodes"};
  auto req_x509 = [&](const std::string& key, const std::string& crt, const std::string& cn) {
    std::vector<std::string> a = {ossl, "req", "-x509"};
    a.insert(a.end(), ec.begin(), ec.end());
    a.insert(a.end(), {"-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=" + cn});
    run_or_throw(a, dir);
  };
  auto signed_cert = [&](const std::string& name, const std::string& cn, const std::string& ext,
                         const std::string& serial) {
    write_file(dir / (name + ".ext"), ext);
    std::vector<std::string> a = {ossl, "req"};
    a.insert(a.end(), ec.begin(), ec.end());
    a.insert(a.end(), {"-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn});
    run_or_throw(a, dir);
    run_or_throw({ossl, "x509", "-req", "-in", name + ".csr", "-CA", c.ca_crt.string(), "-CAkey",
                  c.ca_key.string(), "-set_serial", serial, "-days", "2", "-out", name + ".crt",
                  "-extfile", name + ".ext"},
                 dir);
  };
  req_x509(c.ca_key.string(), c.ca_crt.string(), "fencerun test CA");
  req_x509((dir / "other-ca.key").string(), c.other_ca_crt.string(), "unrelated test CA");
  signed_cert("server", "fencerun test server",
              "basicConstraints=CA:FALSE\n"
              "keyUsage=digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=serverAuth,clientAuth\n"
              "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
              "1001");
  signed_cert("client", "fencerun test client",
              "basicConstraints=CA:FALSE\n"
              "keyUsage=digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=clientAuth\n",
              "1002");
  return c;
}

TlsRedisServer::TlsRedisServer(const Certs& certs, bool auth_clients) {
  std::string why;
  for (int attempt = 0; attempt < 20; ++attempt) {
    port_ = pick_free_port();
    std::vector<std::string> argv = {
        redis_server_program(), "--port", "0", "--tls-port", std::to_string(port_),
        "--bind", "127.0.0.1", "--unixsocket", (dir_ / "redis.sock").string(),
        "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--daemonize", "no",
        "--dir", dir_.str(), "--logfile", (dir_ / "redis.log").string(),
        "--tls-cert-file", certs.server_crt.string(), "--tls-key-file", certs.server_key.string(),
        "--tls-ca-cert-file", certs.ca_crt.string(), "--tls-auth-clients",
        auth_clients ? "yes" : "no"};
    if (start_and_wait(proc_, argv, admin(), &why)) return;
  }
  throw std::runtime_error("could not start a TLS redis-server: " + why + "\n" + log());
}

TlsRedisServer::~TlsRedisServer() {
  if (proc_) proc_->kill_and_reap();
}

Target TlsRedisServer::admin() const {
  Target t;
  t.unix_path = (dir_ / "redis.sock").string();
  return t;
}

std::string TlsRedisServer::log() const {
  return read_file(dir_ / "redis.log").value_or("(no redis log)");
}

// ---------------------------------------------------------------------------------------------

SentinelProcess::SentinelProcess(const std::string& master_name, int master_port, int quorum) {
  std::string why;
  for (int attempt = 0; attempt < 20; ++attempt) {
    port_ = pick_free_port();
    const auto conf = dir_ / "sentinel.conf";
    write_file(conf, "port " + std::to_string(port_) +
                         "\n"
                         "bind 127.0.0.1\n"
                         "daemonize no\n"
                         "dir " + dir_.str() + "\n"
                         "logfile " + (dir_ / "sentinel.log").string() + "\n"
                         "sentinel monitor " + master_name + " 127.0.0.1 " +
                         std::to_string(master_port) + " " + std::to_string(quorum) + "\n"
                         "sentinel down-after-milliseconds " + master_name + " 1000\n"
                         "sentinel failover-timeout " + master_name + " 3000\n");
    if (start_and_wait(proc_, {server_under_test().sentinel, conf.string(), "--sentinel"}, tcp(port_),
                       &why))
      return;
  }
  throw std::runtime_error("could not start a sentinel: " + why + "\n" + log());
}

SentinelProcess::~SentinelProcess() { stop(); }

void SentinelProcess::stop() {
  if (proc_) proc_->kill_and_reap();
}

void SentinelProcess::freeze() {
  if (!proc_ || !proc_->signal(SIGSTOP)) throw std::logic_error("freeze: sentinel not running");
  if (!wait_until(
          [&] {
            auto st = process_state(proc_->pid());
            return !st || *st == 'T' || *st == 't';
          },
          5s, 1ms))
    throw std::runtime_error("sentinel on port " + std::to_string(port_) + " did not stop");
}

void SentinelProcess::thaw() {
  if (proc_) proc_->signal(SIGCONT);
}

std::string SentinelProcess::log() const {
  return read_file(dir_ / "sentinel.log").value_or("(no sentinel log)");
}

SentinelTopology::SentinelTopology() {
  master_ = std::make_unique<RedisServer>(replication_options());
  replica_ = std::make_unique<RedisServer>(replication_options(master_->port()));
  wait_replica_online(*master_, *replica_);
  for (int i = 0; i < 3; ++i)
    sentinels_.push_back(std::make_unique<SentinelProcess>(kMaster, master_->port(), 2));
  if (!wait_until([&] { return healthy(); }, 20s, 50ms))
    throw std::runtime_error("sentinels did not see a healthy replica within 20s\n" + logs());
}

RedisServer* SentinelTopology::server_on(int port) {
  if (master_->port() == port) return master_.get();
  if (replica_->port() == port) return replica_.get();
  return nullptr;
}

std::string SentinelTopology::url(std::optional<int> dead_port_first) const {
  std::string u = "redis+sentinel://";
  bool first = true;
  if (dead_port_first) {
    u += "127.0.0.1:" + std::to_string(*dead_port_first);
    first = false;
  }
  for (const auto& s : sentinels_) {
    u += (first ? "" : ",") + std::string("127.0.0.1:") + std::to_string(s->port());
    first = false;
  }
  return u + "/" + kMaster;
}

std::optional<int> SentinelTopology::reported_master_port(int i) const {
  Reply r = sentinels_.at(static_cast<size_t>(i))->cmd({"SENTINEL", "get-master-addr-by-name", kMaster});
  if (r.type != Reply::Type::Array || r.elements.size() != 2) return std::nullopt;
  auto p = parse_ll(r.elements[1].str);
  if (!p) return std::nullopt;
  return static_cast<int>(*p);
}

bool SentinelTopology::healthy() const {
  for (const auto& s : sentinels_) {
    Reply replicas = s->cmd({"SENTINEL", "REPLICAS", kMaster});
    if (replicas.type != Reply::Type::Array || replicas.elements.size() != 1) return false;
    const Reply& r = replicas.elements[0];
    if (map_field(r, "flags") != "slave" || map_field(r, "master-link-status") != "ok") return false;
    Reply others = s->cmd({"SENTINEL", "SENTINELS", kMaster});
    if (others.type != Reply::Type::Array || others.elements.size() != 2) return false;
    Reply m = s->cmd({"SENTINEL", "MASTER", kMaster});
    if (map_field(m, "flags") != "master") return false;
  }
  return true;
}

std::string role_of(int port) {
  Reply r = call(tcp(port), {"ROLE"}, 1000ms);
  if (r.type != Reply::Type::Array || r.elements.empty()) return "";
  return r.elements[0].str;
}

int SentinelTopology::failover(Clock::duration timeout) {
  const int old_master = master_->port(), new_master = replica_->port();
  Reply r = sentinels_[0]->cmd({"SENTINEL", "FAILOVER", kMaster});
  if (r.type != Reply::Type::Status)
    throw std::runtime_error("SENTINEL FAILOVER: " + r.describe() + "\n" + logs());
  if (!wait_until(
          [&] { return reported_master_port(0) == new_master && role_of(new_master) == "master"; },
          timeout, 20ms))
    throw std::runtime_error("failover from " + std::to_string(old_master) + " to " +
                             std::to_string(new_master) + " did not complete\n" + logs());
  return new_master;
}

std::string SentinelTopology::logs() const {
  std::string out = "--- master " + std::to_string(master_->port()) + " ---\n" + master_->log() +
                    "--- replica " + std::to_string(replica_->port()) + " ---\n" + replica_->log();
  for (const auto& s : sentinels_)
    out += "--- sentinel " + std::to_string(s->port()) + " ---\n" + s->log();
  return out;
}

// ---------------------------------------------------------------------------------------------

ClusterNodes::ClusterNodes() {
  RedisOptions o;
  o.extra_args = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                  "--cluster-node-timeout", "2000"};
  std::vector<std::string> create = {redis_cli_program(), "--cluster", "create"};
  for (int i = 0; i < 3; ++i) {
    // The cluster bus listens on port + 10000: RedisServer retries another port when it is taken.
    nodes_.push_back(std::make_unique<RedisServer>(o));
    create.push_back("127.0.0.1:" + std::to_string(nodes_.back()->port()));
  }
  create.insert(create.end(), {"--cluster-replicas", "0", "--cluster-yes"});
  SpawnOptions so;
  so.scrub_env = true;
  RunResult r = run_program(create, so, 60s);
  if (r.exit_code != 0) throw std::runtime_error("redis-cli --cluster create failed\n" + r.describe());
  auto all_ok = [&] {
    for (const auto& n : nodes_) {
      Reply info = n->cmd({"CLUSTER", "INFO"});
      if (info.type != Reply::Type::String || info_field(info.str, "cluster_state") != "ok")
        return false;
      if (info_field(info.str, "cluster_known_nodes") != "3") return false;
      Reply slots = n->cmd({"CLUSTER", "SLOTS"});
      if (slots.type != Reply::Type::Array || slots.elements.size() != 3) return false;
    }
    return true;
  };
  if (!wait_until(all_ok, 30s, 50ms))
    throw std::runtime_error("cluster did not reach cluster_state:ok on every node\n" + logs());
}

std::string ClusterNodes::node_id(size_t i) const {
  Reply r = nodes_.at(i)->cmd({"CLUSTER", "MYID"});
  if (r.type != Reply::Type::String) throw std::runtime_error("CLUSTER MYID: " + r.describe());
  return r.str;
}

long long ClusterNodes::keyslot(const std::string& key) const {
  Reply r = nodes_.at(0)->cmd({"CLUSTER", "KEYSLOT", key});
  if (r.type != Reply::Type::Integer) throw std::runtime_error("CLUSTER KEYSLOT: " + r.describe());
  return r.integer;
}

size_t ClusterNodes::owner_of(long long slot) const {
  Reply r = nodes_.at(0)->cmd({"CLUSTER", "SLOTS"});
  if (r.type != Reply::Type::Array) throw std::runtime_error("CLUSTER SLOTS: " + r.describe());
  for (const auto& range : r.elements) {
    if (range.elements.size() < 3) continue;
    if (slot < range.elements[0].integer || slot > range.elements[1].integer) continue;
    const long long port = range.elements[2].elements.at(1).integer;
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i]->port() == port) return i;
  }
  throw std::runtime_error("no node owns slot " + std::to_string(slot) + ": " + r.describe());
}

std::string ClusterNodes::logs() const {
  std::string out;
  for (const auto& n : nodes_)
    out += "--- node " + std::to_string(n->port()) + " ---\n" + n->log();
  return out;
}

// ---------------------------------------------------------------------------------------------

void note(std::string_view tag, const RunResult& r) {
  std::cout << "[ " << tag << " ] exit " << r.exit_code << ": " << trim(r.err) << "\n";
}

void DeployTest::TearDown() {
  for (pid_t p : cleanup_pids_) kill_if_alive(p);
  if (HasFailure())
    for (const auto& f : on_failure_) std::cout << f() << "\n";
}

SpawnOptions DeployTest::spawn_options(EnvList env) const {
  SpawnOptions o;
  o.env = std::move(env);
  o.cwd = dir_.path();
  return o;
}

RunResult DeployTest::run(std::vector<std::string> args, EnvList env, Clock::duration timeout) const {
  return run_fencerun(std::move(args), spawn_options(std::move(env)), timeout);
}

std::unique_ptr<FencerunProcess> DeployTest::start(std::vector<std::string> args, EnvList env) const {
  return std::make_unique<FencerunProcess>(std::move(args), spawn_options(std::move(env)));
}

std::vector<std::string> DeployTest::sh_args(const std::string& url, const std::string& name,
                                             const std::string& script,
                                             std::vector<std::string> options) {
  std::vector<std::string> a = {"-r", url};
  a.insert(a.end(), options.begin(), options.end());
  a.insert(a.end(), {name, "--", "sh", "-c", script});
  return a;
}

pid_t DeployTest::wait_pid(std::string_view name, Clock::duration timeout) {
  auto p = wait_for_pid_file(file(name), timeout);
  if (!p) throw std::runtime_error("no pid in " + file(name).string() + " within deadline");
  cleanup_pids_.push_back(*p);
  return *p;
}

}  // namespace fencerun::test::deploy
