#include "handover_fixture.hpp"

#include <algorithm>

#include <signal.h>

#include <iostream>
#include <sstream>
#include <stdexcept>

namespace fencerun::test::handover {

long long wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::optional<long long> cpu_ticks(pid_t pid) {
  auto stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return std::nullopt;
  // Fields after the command name (which may contain spaces) start after the last ')'.
  const auto close = stat->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream in(stat->substr(close + 2));
  std::vector<std::string> f;
  for (std::string w; in >> w;) f.push_back(w);
  // f[0] is field 3 (state); utime is field 14, stime field 15.
  if (f.size() < 13) return std::nullopt;
  auto u = parse_ll(f[11]);
  auto s = parse_ll(f[12]);
  if (!u || !s) return std::nullopt;
  return *u + *s;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

std::string glob_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

void HandoverTest::SetUp() { redis_ = std::make_unique<RedisServer>(); }

void HandoverTest::TearDown() {
  if (HasFailure() && redis_) std::cout << "--- redis-server log ---\n" << redis_->log() << "\n";
  for (pid_t p : cleanup_pids_) kill_if_alive(p);
}

Reply HandoverTest::cmd(const std::vector<std::string>& args) {
  Reply r = redis_->cmd(args);
  if (r.type != Reply::Type::None) ++commands_sent_;
  return r;
}

long long HandoverTest::server_commands() {
  Reply r = cmd({"INFO", "stats"});
  if (r.type != Reply::Type::String) throw std::runtime_error("INFO stats: " + r.describe());
  const std::string field = "total_commands_processed:";
  for (const auto& l : split_lines(r.str)) {
    if (l.starts_with(field)) {
      if (auto v = parse_ll(trim(l.substr(field.size())))) return *v;
    }
  }
  throw std::runtime_error("INFO stats has no total_commands_processed: " + r.str);
}

bool HandoverTest::exists(const std::string& k) {
  Reply r = cmd({"EXISTS", k});
  if (r.type != Reply::Type::Integer) throw std::runtime_error("EXISTS: " + r.describe());
  return r.integer > 0;
}

std::unique_ptr<FencerunProcess> HandoverTest::start(const std::string& name, const std::string& script,
                                                     std::vector<std::string> options) {
  // The test's server unless the options name another (a proxy in front of it): -r given twice names
  // two servers, which quorum mode refuses.
  const bool own_server = std::ranges::find(options, "-r") != options.end();
  std::vector<std::string> a;
  if (!own_server) a = {"-r", redis_->url()};
  a.insert(a.end(), options.begin(), options.end());
  a.insert(a.end(), {name, "--", "sh", "-c", script});
  SpawnOptions o;
  o.cwd = dir_.path();
  auto p = std::make_unique<FencerunProcess>(std::move(a), std::move(o));
  cleanup_pids_.push_back(p->pid());
  return p;
}

std::unique_ptr<FencerunProcess> HandoverTest::start_holder(const std::string& name, const std::string& go,
                                                            const std::string& released,
                                                            std::vector<std::string> options) {
  auto p = start(name, "while [ ! -e " + go + " ]; do sleep 0.01; done; date +%s%N > " + released,
                 std::move(options));
  if (!wait_until([&] { return exists(key(name, "lock")); }, 10s))
    throw std::runtime_error("the holder never took " + name + ": " + p->result().describe());
  return p;
}

long long HandoverTest::subscribers(const std::string& name) {
  Reply channels = cmd({"PUBSUB", "CHANNELS", glob_escape(key(name, "")) + "*"});
  if (channels.type != Reply::Type::Array) return -1;
  if (channels.elements.empty()) return 0;
  std::vector<std::string> numsub = {"PUBSUB", "NUMSUB"};
  for (const auto& c : channels.elements) numsub.push_back(c.str);
  Reply r = cmd(numsub);
  if (r.type != Reply::Type::Array || r.elements.size() != 2 * channels.elements.size()) return -1;
  long long n = 0;
  for (std::size_t i = 1; i < r.elements.size(); i += 2) n += r.elements[i].integer;
  return n;
}

bool HandoverTest::wait_subscribers(const std::string& name, long long n, Clock::duration timeout,
                                    Clock::duration poll) {
  return wait_until([&] { return subscribers(name) == n; }, timeout, poll);
}

long long HandoverTest::queued(const std::string& name) { return cmd({"ZCARD", key(name, "queue")}).integer; }

bool HandoverTest::wait_queued(const std::string& name, long long n, Clock::duration timeout, Clock::duration poll) {
  return wait_until([&] { return queued(name) == n; }, timeout, poll);
}

std::vector<std::string> HandoverTest::queue_members(const std::string& name) {
  std::vector<std::string> m;
  for (const auto& e : cmd({"ZRANGE", key(name, "queue"), "0", "-1"}).elements) m.push_back(e.str);
  return m;
}

bool HandoverTest::in_zset(const std::string& name, std::string_view set, const std::string& member) {
  return !cmd({"ZSCORE", key(name, set), member}).is_nil();
}

long long HandoverTest::stamp(const std::string& name, Clock::duration timeout) {
  auto l = wait_for_line(file(name), timeout);
  if (!l) throw std::runtime_error("no timestamp in " + name);
  auto v = parse_ll(*l);
  if (!v) throw std::runtime_error("not a timestamp in " + name + ": " + *l);
  return *v;
}

std::vector<std::string> HandoverTest::lines(const std::string& name) {
  return split_lines(read_file(file(name)).value_or(""));
}

bool HandoverTest::freeze(Process& p, Clock::duration timeout) {
  const pid_t pid = p.pid();
  const bool leads_group = process_group(pid) == pid;
  if (!p.signal(SIGSTOP)) return false;
  if (leads_group) ::kill(-pid, SIGSTOP);
  return wait_until([&] { return process_state(pid) == 'T'; }, timeout);
}

bool HandoverTest::thaw(Process& p) {
  const pid_t pid = p.pid();
  const bool leads_group = process_group(pid) == pid;
  if (leads_group) ::kill(-pid, SIGCONT);
  return p.signal(SIGCONT);
}

}  // namespace fencerun::test::handover
