#include "support/etcd_cluster.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <random>
#include <sstream>
#include <stdexcept>

#include "support/json.hpp"

namespace fencerun::test {
namespace {

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream in(path ? path : "/usr/bin:/bin");
  std::string d;
  while (std::getline(in, d, ':')) {
    if (d.empty()) continue;
    if (::access((std::filesystem::path(d) / program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

void run_or_throw(const std::vector<std::string>& argv, const std::filesystem::path& cwd) {
  SpawnOptions so;
  so.cwd = cwd;
  auto r = run_program(argv, so, 30s);
  if (r.exit_code != 0) throw std::runtime_error("command failed: " + argv.at(0) + " " + argv.at(1) + "\n" + r.describe());
}

std::string unique_token() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  return "fencerun-test-" + std::to_string(::getpid()) + "-" + std::to_string(++counter) + "-" +
         std::to_string(rd());
}

}  // namespace

EtcdCerts make_etcd_certs(const std::filesystem::path& dir) {
  const std::string ossl = "openssl";
  EtcdCerts c;
  c.ca_crt = dir / "ca.crt";
  c.ca_key = dir / "ca.key";
  c.server_crt = dir / "server.crt";
  c.server_key = dir / "server.key";
  c.client_crt = dir / "client.crt";
  c.client_key = dir / "client.key";
  c.other_ca_crt = dir / "other-ca.crt";
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
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
  req_x509(c.ca_key.string(), c.ca_crt.string(), "fencerun etcd test CA");
  req_x509((dir / "other-ca.key").string(), c.other_ca_crt.string(), "unrelated test CA");
  signed_cert("server", "fencerun etcd test member",
              "basicConstraints=CA:FALSE\n"
              "keyUsage=digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=serverAuth,clientAuth\n"
              "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
              "2001");
  signed_cert("client", "root",
              "basicConstraints=CA:FALSE\n"
              "keyUsage=digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=clientAuth\n",
              "2002");
  return c;
}

std::string EtcdCluster::missing() {
  for (const char* p : {"etcd", "etcdctl"})
    if (!on_path(p)) return std::string(p) + " not found: install etcd-server and etcd-client";
  return {};
}

EtcdCluster::EtcdCluster(EtcdOptions opts) : m_opts(std::move(opts)), m_dir("etcd") {
  if (m_opts.members < 1) throw std::invalid_argument("EtcdCluster: at least one member");
  if (auto why = missing(); !why.empty()) throw std::runtime_error(why);
  if (m_opts.tls) {
    std::filesystem::create_directories(m_dir / "certs");
    m_certs = make_etcd_certs(m_dir / "certs");
  }
  std::string why;
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (try_start(&why)) break;
    stop_all();
    if (attempt == 3) throw std::runtime_error("could not start the etcd cluster: " + why + "\n" + logs());
  }
  if (m_opts.root_password) {
    etcdctl_ok({"user", "add", "root:" + *m_opts.root_password});
    etcdctl_ok({"auth", "enable"});
    m_auth = true;
    if (!wait_healthy(10s)) throw std::runtime_error("etcd cluster unhealthy after auth enable\n" + logs());
  }
}

EtcdCluster::~EtcdCluster() { stop_all(); }

bool EtcdCluster::try_start(std::string* why) {
  static std::atomic<int> generation{0};
  m_token = unique_token();
  m_members.clear();
  const int gen = ++generation;
  for (int i = 0; i < m_opts.members; ++i) {
    Member m;
    m.name = "e" + std::to_string(i);
    // Two distinct free ports per member, none shared with another member.
    for (;;) {
      m.client_port = pick_free_port();
      m.peer_port = pick_free_port();
      bool clash = m.client_port == m.peer_port;
      for (const auto& o : m_members)
        clash = clash || o.client_port == m.client_port || o.client_port == m.peer_port ||
                o.peer_port == m.client_port || o.peer_port == m.peer_port;
      if (!clash) break;
    }
    m.data_dir = m_dir / ("g" + std::to_string(gen) + "-" + m.name);
    m_members.push_back(std::move(m));
  }
  for (int i = 0; i < size(); ++i) start_member(i);
  if (wait_healthy(m_opts.start_timeout) && leader(m_opts.start_timeout) >= 0) return true;
  *why = "not healthy within the deadline (token " + m_token + ")";
  return false;
}

std::vector<std::string> EtcdCluster::member_argv(int i) const {
  const Member& m = m_members.at(i);
  std::string cluster;
  for (const auto& o : m_members) {
    if (!cluster.empty()) cluster += ",";
    cluster += o.name + "=http://127.0.0.1:" + std::to_string(o.peer_port);
  }
  std::vector<std::string> a = {"etcd",
                                "--name", m.name,
                                "--data-dir", m.data_dir.string(),
                                "--listen-client-urls", client_url(i),
                                "--advertise-client-urls", client_url(i),
                                "--listen-peer-urls", "http://127.0.0.1:" + std::to_string(m.peer_port),
                                "--initial-advertise-peer-urls", "http://127.0.0.1:" + std::to_string(m.peer_port),
                                "--initial-cluster", cluster,
                                "--initial-cluster-state", "new",
                                "--initial-cluster-token", m_token,
                                "--logger", "zap",
                                "--log-outputs", "stderr"};
  if (m_opts.tls) {
    a.insert(a.end(), {"--cert-file", m_certs.server_crt.string(), "--key-file", m_certs.server_key.string()});
    // A trusted CA makes etcd require client certificates: only with client_cert_auth.
    if (m_opts.client_cert_auth)
      a.insert(a.end(), {"--client-cert-auth", "--trusted-ca-file", m_certs.ca_crt.string()});
  }
  return a;
}

void EtcdCluster::start_member(int i) {
  Member& m = m_members.at(i);
  SpawnOptions so;
  so.cwd = m_dir.path();
  // Nothing of the machine's etcd settings may reach the members.
  so.env = {{"ETCD_NAME", std::nullopt}, {"ETCD_DATA_DIR", std::nullopt}, {"ETCD_INITIAL_CLUSTER", std::nullopt},
            {"ETCD_LISTEN_CLIENT_URLS", std::nullopt}, {"ETCD_ADVERTISE_CLIENT_URLS", std::nullopt},
            {"ETCD_UNSUPPORTED_ARCH", std::nullopt}};
  m.proc = std::make_unique<Process>(member_argv(i), so);
  m.frozen = false;
}

void EtcdCluster::stop_all() {
  for (auto& m : m_members) {
    if (!m.proc) continue;
    if (m.frozen) m.proc->signal(SIGCONT);
    m.frozen = false;
    m.old_log += m.proc->err();
    m.proc->kill_and_reap();
    m.proc.reset();
  }
}

std::string EtcdCluster::url() const { return url_with_user(""); }

std::string EtcdCluster::url_with_user(const std::string& userinfo) const {
  std::string u = m_opts.tls ? "etcds://" : "etcd://";
  if (!userinfo.empty()) u += userinfo + "@";
  for (int i = 0; i < size(); ++i) u += (i ? "," : "") + endpoint(i);
  return u;
}

std::string EtcdCluster::endpoint(int i) const { return "127.0.0.1:" + std::to_string(client_port(i)); }
std::string EtcdCluster::client_url(int i) const { return (m_opts.tls ? "https://" : "http://") + endpoint(i); }
int EtcdCluster::client_port(int i) const { return m_members.at(i).client_port; }
int EtcdCluster::peer_port(int i) const { return m_members.at(i).peer_port; }
pid_t EtcdCluster::pid(int i) const { return m_members.at(i).proc ? m_members.at(i).proc->pid() : -1; }

bool EtcdCluster::running(int i) const {
  const Member& m = m_members.at(i);
  return m.proc && !process_dead(m.proc->pid());
}
bool EtcdCluster::frozen(int i) const { return m_members.at(i).frozen; }

std::vector<std::string> EtcdCluster::client_options() const {
  std::vector<std::string> a = {"--dial-timeout=2s", "--command-timeout=2s"};
  if (m_opts.tls) {
    a.push_back("--cacert=" + m_certs.ca_crt.string());
    if (m_opts.client_cert_auth)
      a.insert(a.end(), {"--cert=" + m_certs.client_crt.string(), "--key=" + m_certs.client_key.string()});
  }
  if (m_auth) a.push_back("--user=root:" + *m_opts.root_password);
  return a;
}

std::string EtcdCluster::live_endpoints() const {
  std::string e;
  for (int i = 0; i < size(); ++i)
    if (running(i) && !frozen(i)) e += (e.empty() ? "" : ",") + client_url(i);
  return e;
}

RunResult EtcdCluster::etcdctl(std::vector<std::string> args, std::optional<std::string> endpoints) const {
  std::vector<std::string> argv = {"etcdctl", "--endpoints=" + (endpoints ? *endpoints : live_endpoints())};
  auto opts = client_options();
  argv.insert(argv.end(), opts.begin(), opts.end());
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions so;
  so.cwd = m_dir.path();
  so.env = {{"ETCDCTL_API", "3"},           {"ETCDCTL_ENDPOINTS", std::nullopt}, {"ETCDCTL_USER", std::nullopt},
            {"ETCDCTL_CACERT", std::nullopt}, {"ETCDCTL_CERT", std::nullopt},     {"ETCDCTL_KEY", std::nullopt}};
  return run_program(argv, so, 20s);
}

std::string EtcdCluster::etcdctl_ok(std::vector<std::string> args) const {
  auto r = etcdctl(args);
  if (r.exit_code != 0) {
    std::string cmd;
    for (const auto& a : args) cmd += " " + a;
    throw std::runtime_error("etcdctl" + cmd + " failed:\n" + r.describe());
  }
  return r.out;
}

bool EtcdCluster::wait_healthy(Clock::duration timeout) {
  return wait_until(
      [&] {
        auto e = live_endpoints();
        return !e.empty() && etcdctl({"endpoint", "health"}, e).exit_code == 0;
      },
      timeout, 100ms);
}

int EtcdCluster::leader(Clock::duration timeout) {
  int found = -1;
  wait_until(
      [&] {
        for (int i = 0; i < size(); ++i) {
          if (!running(i) || frozen(i)) continue;
          auto r = etcdctl({"endpoint", "status", "-w", "json"}, client_url(i));
          if (r.exit_code != 0) continue;
          auto j = parse_json(r.out);
          if (!j || j->kind != Json::Kind::Array || j->items.empty()) continue;
          const Json* st = j->items[0].find("Status");
          const Json* hd = st ? st->find("header") : nullptr;
          const Json* ld = st ? st->find("leader") : nullptr;
          const Json* me = hd ? hd->find("member_id") : nullptr;
          if (ld && me && !ld->text.empty() && ld->text != "0" && ld->text == me->text) {
            found = i;
            return true;
          }
        }
        return false;
      },
      timeout, 50ms);
  return found;
}

int EtcdCluster::wait_for_new_leader(int old, Clock::duration timeout) {
  int found = -1;
  wait_until(
      [&] {
        int l = leader(0s);
        if (l >= 0 && l != old) found = l;
        return found >= 0;
      },
      timeout, 50ms);
  return found;
}

void EtcdCluster::kill(int i) {
  Member& m = m_members.at(i);
  if (!m.proc) return;
  if (m.frozen) m.proc->signal(SIGCONT);
  m.frozen = false;
  m.proc->kill_and_reap();
  m.old_log += m.proc->err() + "--- " + m.name + " killed ---\n";
  m.proc.reset();
}

void EtcdCluster::restart(int i) {
  kill(i);
  start_member(i);
  const std::string ep = client_url(i);
  if (!wait_until([&] { return etcdctl({"endpoint", "health"}, ep).exit_code == 0; }, 15s, 100ms))
    throw std::runtime_error("member " + m_members.at(i).name + " not healthy after restart\n" + logs());
}

void EtcdCluster::freeze(int i) {
  Member& m = m_members.at(i);
  if (!m.proc) throw std::logic_error("freeze: member not running");
  m.proc->signal(SIGSTOP);
  m.frozen = true;
  wait_until(
      [&] {
        auto st = process_state(m.proc->pid());
        return !st || *st == 'T' || *st == 't';
      },
      5s, 1ms);
}

void EtcdCluster::thaw(int i) {
  Member& m = m_members.at(i);
  if (!m.proc) return;
  m.proc->signal(SIGCONT);
  m.frozen = false;
}

std::vector<std::string> EtcdCluster::keys(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto& l : split_lines(etcdctl_ok({"get", "--prefix", "--keys-only", prefix})))
    if (!trim(l).empty()) out.push_back(trim(l));
  return out;
}

std::vector<std::string> EtcdCluster::leases() const {
  // "found N leases" then one id per line.
  std::vector<std::string> out;
  for (auto& l : split_lines(etcdctl_ok({"lease", "list"}))) {
    auto t = trim(l);
    if (t.empty() || t.starts_with("found ")) continue;
    out.push_back(t);
  }
  return out;
}

std::optional<std::string> EtcdCluster::get(const std::string& key) const {
  auto r = etcdctl({"get", key, "-w", "json"});
  if (r.exit_code != 0) throw std::runtime_error("etcdctl get " + key + " failed:\n" + r.describe());
  auto j = parse_json(r.out);
  const Json* kvs = j ? j->find("kvs") : nullptr;
  if (!kvs || kvs->items.empty()) return std::nullopt;
  return trim(etcdctl_ok({"get", key, "--print-value-only"}));
}

std::string EtcdCluster::logs() const {
  std::string s;
  for (const auto& m : m_members) {
    s += "--- etcd member " + m.name + " (client " + std::to_string(m.client_port) + ", peer " +
         std::to_string(m.peer_port) + ") ---\n";
    std::string log = m.old_log + (m.proc ? m.proc->err() : std::string());
    // The tail only: etcd logs at info level say a lot.
    constexpr std::size_t k_tail = 8000;
    if (log.size() > k_tail) log = "[...]\n" + log.substr(log.size() - k_tail);
    s += log;
  }
  return s;
}

}  // namespace fencerun::test
