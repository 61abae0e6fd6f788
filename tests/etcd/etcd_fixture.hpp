#pragma once
// Fixtures of the etcd tests: fencerun run against a real etcd cluster (support/etcd_cluster.hpp).
// EtcdSharedTest shares one 3-member cluster among the tests of a suite (tests that kill or freeze
// no member; each uses lock names of its own); EtcdOwnTest starts a cluster per test (chaos).
// Every test has its own temp dir, the working directory of the fencerun processes it starts.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/etcd/records_lease_id.hpp"
#include "support/etcd_cluster.hpp"
#include "support/json.hpp"
#include "support/process.hpp"
#include "support/util.hpp"

namespace fencerun::test {

inline constexpr long long kMinEtcdToken = 1'700'000'000'000'000LL;  // base from the clock in us
inline constexpr long long kMaxSafeEtcdToken = (1LL << 53) - 1;

inline const std::string kPrefix = "fencerun:";
inline std::string wait_prefix(const std::string& name) { return kPrefix + "{" + name + "}:wait/"; }
inline std::string base_key(const std::string& name) { return kPrefix + "{" + name + "}:base"; }
// Every key of the lock NAME (":wait/...", ":base", and its record of runs: ":run", ":ok", ":runs",
// ":rule", ":since").
inline std::string lock_prefix(const std::string& name) { return kPrefix + "{" + name + "}:"; }

// A key of NAME's record of runs (":run", ":ok", ":runs", and the rule of --every / --min-interval,
// ":rule"), which outlive its runs by --records-ttl, and the record's marker (":since", which stays
// as ":base" does).
inline bool is_record_key(std::string_view key) {
  return key.ends_with("}:run") || key.ends_with("}:ok") || key.ends_with("}:runs") || key.ends_with("}:rule") ||
         key.ends_with("}:since");
}

// Every grpc_server_handled_total counter a member's /metrics shows (requests it handled), by method.
inline std::map<std::string, long long> handled_requests(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) reply.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  std::map<std::string, long long> counts;
  static const std::regex line(R"re(^grpc_server_handled_total\{.*grpc_method="([^"]*)".*\} ([0-9.e+]+)$)re");
  std::istringstream in(reply);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_match(l, m, line)) counts[m[1].str()] += static_cast<long long>(std::stod(m[2].str()));
  }
  return counts;
}

// The same, summed over the cluster's members.
inline std::map<std::string, long long> handled_requests(const EtcdCluster& etcd) {
  std::map<std::string, long long> all;
  for (int i = 0; i < etcd.size(); ++i)
    for (const auto& [method, n] : handled_requests(etcd.client_port(i))) all[method] += n;
  return all;
}

// The requests the members handled between two counts, but the holder's watch of its own key (a
// stream opened once a job has run 20 ms: on a loaded machine even `true` may), and the text by method.
inline long long requests_between(const std::map<std::string, long long>& before,
                                  const std::map<std::string, long long>& after, std::string& by_method) {
  long long used = 0;
  for (const auto& [method, n] : after) {
    const long long d = n - (before.contains(method) ? before.at(method) : 0);
    if (d == 0) continue;
    if (method != "Watch") used += d;
    by_method += " " + method + "=" + std::to_string(d);
  }
  return used;
}

inline bool is_lower_hex(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// Holds the lock with a command that records its pid, token and a grandchild in its process group.
inline constexpr const char* kHoldWithGrandchildEtcd =
    "echo $$ > pid; sleep 1000 & echo $! > gpid; echo \"$FENCERUN_TOKEN\" > token; wait";

// An integral JSON number (or a string of digits, as etcd's gateway writes int64s).
inline std::optional<long long> json_int_of(const Json* j) {
  if (!j || (j->kind != Json::Kind::Number && j->kind != Json::Kind::String)) return std::nullopt;
  return parse_ll(j->text);
}

// Reads a decimal token from a whole line; nullopt when it is not one.
inline std::optional<long long> token_of(const std::string& s) {
  auto t = trim(s);
  if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return parse_ll(t);
}

// The shared log of a mutual-exclusion workload: each holder's command appends "start TOKEN [PID]"
// when it starts and "end TOKEN" when it ends (O_APPEND). Counted: acquisitions (starts), overlaps (a
// start while another holder's section is open, or an end that is not the open section's), equal
// tokens (a token started twice) and regressions (a token not greater than every token started before
// it). Every section must have ended before the next one starts, a section fencerun stopped (124)
// included: a command killed before it could write its end has its end written by a SectionWatcher
// the moment it died.
struct SectionCheck {
  int acquisitions = 0;
  int overlaps = 0;
  int equal = 0;
  int regressions = 0;
  int malformed = 0;
  std::string detail;  // the first problems, for messages
  bool ok() const { return overlaps == 0 && equal == 0 && regressions == 0 && malformed == 0; }
};

// "start 5 123" -> kind "start", token 5, pid 123 (0 when not given).
struct SectionLine {
  std::string kind;
  long long token = 0;
  long long pid = 0;
};
inline std::optional<SectionLine> parse_section_line(const std::string& line) {
  std::istringstream in(line);
  std::string kind, token, pid, extra;
  in >> kind >> token;
  if (in >> pid) {
    if (in >> extra) return std::nullopt;
  }
  auto t = token_of(token);
  if (!t || (kind != "start" && kind != "end")) return std::nullopt;
  SectionLine l{kind, *t, 0};
  if (!pid.empty()) {
    auto p = token_of(pid);
    if (!p || kind != "start") return std::nullopt;
    l.pid = *p;
  }
  return l;
}

inline SectionCheck check_sections(const std::string& log) {
  SectionCheck c;
  bool is_open = false;
  long long open = -1;  // the token of the open section when is_open
  long long max_seen = -1;
  std::set<long long> seen;
  auto note = [&](const std::string& what) {
    if (c.detail.size() < 2000) c.detail += what + "\n";
  };
  for (const auto& line : split_lines(log)) {
    if (trim(line).empty()) continue;
    const auto l = parse_section_line(line);
    if (!l) {
      ++c.malformed;
      note("malformed line: " + line);
      continue;
    }
    const long long t = l->token;
    if (l->kind == "start") {
      ++c.acquisitions;
      if (is_open) {
        ++c.overlaps;
        note("start " + std::to_string(t) + " while " + std::to_string(open) + " is open");
      }
      if (seen.contains(t)) {
        ++c.equal;
        note("token " + std::to_string(t) + " started twice");
      } else if (t <= max_seen) {
        ++c.regressions;
        note("token " + std::to_string(t) + " after " + std::to_string(max_seen));
      }
      seen.insert(t);
      max_seen = std::max(max_seen, t);
      open = t;
      is_open = true;
    } else {
      if (!is_open || open != t) {
        ++c.overlaps;
        note("end " + std::to_string(t) + " while " + (is_open ? std::to_string(open) : std::string("none")) +
             " is open");
      }
      is_open = false;
    }
  }
  return c;
}

// Writes the end of a section whose command was killed before it could write it (fencerun stopped it,
// 124): it follows the log, opens a pidfd on each section's command as it starts ("start TOKEN PID"),
// and when one dies without its "end TOKEN" in the log, appends that line at once. The end is then in
// the log where the command's death was, so check_sections counts a stopped section like any other.
// finish() (or the destructor) waits for the commands still followed to die, up to a bound.
class SectionWatcher {
 public:
  explicit SectionWatcher(std::filesystem::path log) : m_log(std::move(log)), m_thread([this] { run(); }) {}
  ~SectionWatcher() { finish(); }
  SectionWatcher(const SectionWatcher&) = delete;
  SectionWatcher& operator=(const SectionWatcher&) = delete;

  // Stops following once every command seen has died (or `bound` has passed). Returns how many ends
  // it wrote.
  int finish(Clock::duration bound = 10s) {
    m_finish_by.store((Clock::now() + bound).time_since_epoch().count());
    m_finishing.store(true);
    if (m_thread.joinable()) m_thread.join();
    return m_written;
  }
  // How many commands it follows now (opened, not yet seen dead).
  int following() const { return m_following.load(); }

 private:
  void run() {
    std::string pending;
    std::size_t offset = 0;
    std::set<long long> ended;
    std::map<int, long long> followed;  // pidfd -> token
    auto read_more = [&] {
      auto text = read_file(m_log);
      if (!text || text->size() <= offset) return;
      pending += text->substr(offset);
      offset = text->size();
      std::size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        const auto l = parse_section_line(pending.substr(0, nl));
        pending.erase(0, nl + 1);
        if (!l) continue;
        if (l->kind == "end") {
          ended.insert(l->token);
        } else if (l->pid > 0) {
          const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(l->pid), 0));
          if (fd >= 0) followed[fd] = l->token;
        }
        m_following.store(static_cast<int>(followed.size()));
      }
    };
    for (;;) {
      read_more();
      if (m_finishing.load() && (followed.empty() || Clock::now().time_since_epoch().count() > m_finish_by.load())) break;
      std::vector<pollfd> fds;
      for (const auto& [fd, token] : followed) fds.push_back({fd, POLLIN, 0});
      ::poll(fds.data(), fds.size(), 1);
      bool died = false;
      for (const auto& p : fds) died = died || p.revents != 0;
      if (!died) continue;
      read_more();  // an end the command wrote just before it exited
      for (const auto& p : fds) {
        if (!p.revents) continue;
        const long long token = followed[p.fd];
        ::close(p.fd);
        followed.erase(p.fd);
        m_following.store(static_cast<int>(followed.size()));
        if (ended.contains(token)) continue;
        const std::string line = "end " + std::to_string(token) + "\n";
        const int log = ::open(m_log.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
        if (log >= 0) {
          [[maybe_unused]] auto n = ::write(log, line.data(), line.size());
          ::close(log);
          ended.insert(token);
          ++m_written;
        }
      }
    }
    for (const auto& [fd, token] : followed) ::close(fd);
  }

  std::filesystem::path m_log;
  std::atomic<bool> m_finishing{false};
  std::atomic<int> m_following{0};
  std::atomic<Clock::rep> m_finish_by{0};
  int m_written = 0;
  std::thread m_thread;
};

inline std::ostream& operator<<(std::ostream& os, const SectionCheck& c) {
  return os << c.acquisitions << " acquisitions, " << c.overlaps << " overlaps, " << c.equal << " equal tokens, "
            << c.regressions << " regressions, " << c.malformed << " malformed lines\n" << c.detail;
}

// The command of one section: prints its token, appends "start T PID", sleeps, appends "end T".
inline std::string section_script(const std::string& log, const std::string& sleep = "0.02") {
  return "echo \"$FENCERUN_TOKEN\"; echo \"start $FENCERUN_TOKEN $$\" >> " + log + "; sleep " + sleep +
         "; echo \"end $FENCERUN_TOKEN\" >> " + log;
}

// The processes below `root` now (children, their children, ...), from /proc.
inline std::vector<pid_t> descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> all;  // pid, ppid
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    auto pid = parse_ll(e.path().filename().string());
    if (!pid) continue;
    auto stat = read_file(e.path() / "stat");
    if (!stat) continue;
    auto close = stat->rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream in(stat->substr(close + 2));
    char state = 0;
    long long ppid = 0;
    in >> state >> ppid;
    all.emplace_back(static_cast<pid_t>(*pid), static_cast<pid_t>(ppid));
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    for (auto [c, pp] : all)
      if (pp == p) {
        out.push_back(c);
        todo.push_back(c);
      }
  }
  return out;
}

class EtcdTestBase : public ::testing::Test {
 protected:
  virtual EtcdCluster& etcd() = 0;
  virtual bool cluster_ready() const = 0;

  void TearDown() override {
    for (pid_t p : m_cleanup) kill_if_alive(p);
    if (HasFailure() && cluster_ready()) std::cout << etcd().logs() << "\n";
  }

  const TempDir& dir() const { return m_dir; }
  std::filesystem::path file(std::string_view name) const { return m_dir / name; }
  void touch(std::string_view name) const { write_file(file(name), ""); }
  void cleanup_pid(pid_t p) { m_cleanup.push_back(p); }

  SpawnOptions spawn_options(EnvList env = {}) const {
    SpawnOptions o;
    o.env = std::move(env);
    o.cwd = m_dir.path();
    return o;
  }

  // -r URL OPTIONS... NAME -- sh -c SCRIPT
  std::vector<std::string> sh_args(const std::string& name, const std::string& script,
                                   std::vector<std::string> options = {}) {
    return sh_args_url(etcd().url(), name, script, std::move(options));
  }
  static std::vector<std::string> sh_args_url(const std::string& url, const std::string& name, const std::string& script,
                                              std::vector<std::string> options = {}) {
    std::vector<std::string> a = {"-r", url};
    a.insert(a.end(), options.begin(), options.end());
    a.insert(a.end(), {name, "--", "sh", "-c", script});
    return a;
  }

  RunResult run(std::vector<std::string> args, EnvList env = {}, Clock::duration timeout = 60s) const {
    return run_fencerun(std::move(args), spawn_options(std::move(env)), timeout);
  }
  std::unique_ptr<FencerunProcess> start(std::vector<std::string> args, EnvList env = {}) const {
    return std::make_unique<FencerunProcess>(std::move(args), spawn_options(std::move(env)));
  }

  pid_t wait_pid(std::string_view name, Clock::duration timeout = 15s) {
    auto p = wait_for_pid_file(file(name), timeout);
    if (!p) throw std::runtime_error("no pid in " + file(name).string() + " within deadline");
    cleanup_pid(*p);
    return *p;
  }
  std::string wait_line(std::string_view name, Clock::duration timeout = 15s) const {
    auto l = wait_for_line(file(name), timeout);
    if (!l) throw std::runtime_error("no line in " + file(name).string() + " within deadline");
    return *l;
  }

  // The :wait/ keys of NAME now.
  std::vector<std::string> waiters(const std::string& name) { return etcd().keys(wait_prefix(name)); }

  // The keys attached to lease `id` (hex, as `lease list` prints it); nullopt when it is gone.
  std::optional<std::vector<std::string>> lease_keys(const std::string& id) {
    auto r = etcd().etcdctl({"lease", "timetolive", id, "--keys"});
    if (r.exit_code != 0 || r.out.find("already expired") != std::string::npos) return std::nullopt;
    const auto open = r.out.find("attached keys([");
    if (open == std::string::npos) return std::vector<std::string>{};
    const auto from = open + std::string("attached keys([").size();
    const auto close = r.out.find("])", from);
    std::vector<std::string> keys;
    std::istringstream in(r.out.substr(from, close == std::string::npos ? std::string::npos : close - from));
    for (std::string k; in >> k;) keys.push_back(k);
    return keys;
  }
  // An id as etcdctl prints it (hex), without leading zeros.
  static std::string bare_hex(std::string_view id) {
    const auto first = id.find_first_not_of('0');
    return std::string(first == std::string_view::npos ? "0" : id.substr(first));
  }
  // The id of NAME's records' lease for a TTL (fencerun chooses it), in bare hex.
  static std::string records_lease(const std::string& name, std::int64_t ttl_s) {
    char buf[17] = {};
    std::snprintf(buf, sizeof buf, "%llx",
                  static_cast<unsigned long long>(
                      fencerun::lease::etcd_records_lease_id(lock_prefix(name) + "runs", ttl_s)));
    return buf;
  }
  // The leases now but those that carry only keys of a record of runs (one per NAME, living
  // --records-ttl): the runs' own leases, and any lease left with no key but NAME's records' lease
  // (its id is NAME's own: a grant applied after fencerun gave up on it waits there for the next run).
  std::vector<std::string> run_leases(const std::string& name = {},
                                      std::int64_t records_ttl_s = 30LL * 24 * 3600) {
    const std::string own = name.empty() ? "" : records_lease(name, records_ttl_s);
    std::vector<std::string> out;
    for (const auto& id : etcd().leases()) {
      auto keys = lease_keys(id);
      if (!keys) continue;
      if (!keys->empty() && std::ranges::all_of(*keys, [](const std::string& k) { return is_record_key(k); })) continue;
      if (keys->empty() && !name.empty() && bare_hex(id) == own) continue;
      out.push_back(id);
    }
    return out;
  }
  // NAME's keys but its record of runs.
  std::vector<std::string> lock_keys(const std::string& name) {
    std::vector<std::string> out;
    for (auto& k : etcd().keys(lock_prefix(name)))
      if (!is_record_key(k)) out.push_back(k);
    return out;
  }

  // Waits (up to `timeout`, e.g. a killed run's TTL) until NAME has no :wait/ key and the cluster
  // no lease but those of records of runs; true when so. `what` goes into the failure message.
  ::testing::AssertionResult nothing_left(const std::string& name, Clock::duration timeout = 3s) {
    std::vector<std::string> k, l;
    bool ok = wait_until(
        [&] {
          k = waiters(name);
          l = run_leases(name);
          return k.empty() && l.empty();
        },
        timeout, 50ms);
    if (ok) return ::testing::AssertionSuccess();
    std::string s;
    for (auto& x : k) s += " key " + x;
    for (auto& x : l) {
      // Its time to live and keys, to tell a lease that is running out from one left for good.
      auto t = etcd().etcdctl({"lease", "timetolive", x, "--keys"});
      s += " lease " + x + " (" + trim(t.out) + ")";
    }
    return ::testing::AssertionFailure() << "left behind in etcd for lock " << name << ":" << s;
  }

 private:
  TempDir m_dir{"etcd-test"};
  std::vector<pid_t> m_cleanup;
};

// One cluster for every test of the suite (started on the suite's first test).
class EtcdSharedTest : public EtcdTestBase {
 protected:
  static void SetUpTestSuite() {
    if (!EtcdCluster::missing().empty()) return;
    s_cluster = std::make_unique<EtcdCluster>();
  }
  static void TearDownTestSuite() { s_cluster.reset(); }
  void SetUp() override {
    if (auto why = EtcdCluster::missing(); !why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(s_cluster) << "the suite's etcd cluster did not start";
    ASSERT_TRUE(s_cluster->wait_healthy(10s)) << "the suite's etcd cluster is not healthy";
  }
  EtcdCluster& etcd() override { return *s_cluster; }
  bool cluster_ready() const override { return s_cluster != nullptr; }

 private:
  static inline std::unique_ptr<EtcdCluster> s_cluster;
};

// A cluster of its own for each test (tests that kill, restart or freeze members).
class EtcdOwnTest : public EtcdTestBase {
 protected:
  virtual EtcdOptions cluster_options() const { return {}; }
  void SetUp() override {
    if (auto why = EtcdCluster::missing(); !why.empty()) GTEST_SKIP() << why;
    m_cluster = std::make_unique<EtcdCluster>(cluster_options());
  }
  void TearDown() override {
    EtcdTestBase::TearDown();
    m_cluster.reset();
  }
  EtcdCluster& etcd() override { return *m_cluster; }
  bool cluster_ready() const override { return m_cluster != nullptr; }

 private:
  std::unique_ptr<EtcdCluster> m_cluster;
};

}  // namespace fencerun::test
