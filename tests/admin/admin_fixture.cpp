#include "admin_fixture.hpp"

#include <cstdio>
#include <stdexcept>

namespace fencerun::test::admin {

std::string FakeLock::value() const {
  return owner + " " + std::to_string(token) + " " + std::to_string(pid) + " " + host;
}

std::vector<FakeLock> numbered_locks(int n, const std::string& stem, long long token_base) {
  std::vector<FakeLock> out;
  for (int i = 0; i < n; ++i) {
    char name[32], owner[40];
    std::snprintf(name, sizeof name, "%04d", i);
    std::snprintf(owner, sizeof owner, "%08x%s", 0x10000000u + static_cast<unsigned>(i), "0123456789abcdef01234567");
    FakeLock l;
    l.name = stem + name;
    l.owner = owner;
    l.token = token_base + i;
    l.pid = 100'000 + i;
    out.push_back(l);
  }
  return out;
}

void write_locks(const Target& t, const std::vector<FakeLock>& locks, long long px_ms) {
  std::vector<std::vector<std::string>> cmds;
  for (const auto& l : locks) {
    if (l.held) cmds.push_back({"SET", lock_key(l.name), l.value(), "PX", std::to_string(px_ms)});
    cmds.push_back({"SET", token_key(l.name), std::to_string(l.token)});
  }
  auto replies = deploy::call_many(t, cmds, 10'000ms);
  if (replies.size() != cmds.size()) throw std::runtime_error("write_locks: " + replies.back().describe());
  for (size_t i = 0; i < replies.size(); ++i)
    if (replies[i].type != Reply::Type::Status)
      throw std::runtime_error("write_locks: " + cmds[i][1] + ": " + replies[i].describe());
}

int hash_slot(const std::string& key) {
  std::string k = key;
  auto open = key.find('{');
  if (open != std::string::npos) {
    auto close = key.find('}', open + 1);
    if (close != std::string::npos && close > open + 1) k = key.substr(open + 1, close - open - 1);
  }
  unsigned crc = 0;
  for (unsigned char c : k) {
    crc ^= static_cast<unsigned>(c) << 8;
    for (int b = 0; b < 8; ++b) crc = (crc & 0x8000) ? ((crc << 1) ^ 0x1021) : (crc << 1);
    crc &= 0xffff;
  }
  return static_cast<int>(crc % 16384);
}

std::vector<ListedLock> parse_list_text(const std::string& out) {
  std::vector<ListedLock> v;
  for (const auto& line : split_lines(out)) {
    if (line.empty()) continue;
    if (line.starts_with(" ")) {
      if (v.empty()) throw std::runtime_error("indented line before any lock: " + line);
      v.back().slot_lines.push_back(line);
      continue;
    }
    auto colon = line.find(": ");
    if (colon == std::string::npos) throw std::runtime_error("not a lock line: " + line);
    v.push_back({line.substr(0, colon), line, {}});
  }
  return v;
}

std::vector<std::string> names_of(const std::vector<ListedLock>& v) {
  std::vector<std::string> n;
  for (const auto& l : v) n.push_back(l.name);
  return n;
}

std::vector<std::string> names_of(const Json& array) {
  std::vector<std::string> n;
  for (const auto& e : array.items) {
    const Json* lock = e.find("lock");
    n.push_back(lock && lock->as_string() ? *lock->as_string() : "(no lock member)");
  }
  return n;
}

std::vector<std::string> duplicates(const std::vector<std::string>& names) {
  std::map<std::string, int> count;
  for (const auto& n : names) ++count[n];
  std::vector<std::string> d;
  for (const auto& [n, c] : count)
    if (c > 1) d.push_back(n + " x" + std::to_string(c));
  return d;
}

RunResult AdminTest::run_with_stdin(std::vector<std::string> args, const std::string& input,
                                    Clock::duration timeout) {
  static int n = 0;
  auto in = file("stdin." + std::to_string(++n));
  write_file(in, input);
  SpawnOptions so = spawn_options();
  so.stdin_file = in;
  return run_fencerun(std::move(args), so, timeout);
}

AdminTest::Holder AdminTest::start_holder(const std::string& url, const std::string& name, const std::string& id,
                                          std::vector<std::string> options) {
  const std::string script = "echo $$ > " + id + ".pid; echo \"${FENCERUN_SLOT:-0} $FENCERUN_OWNER $FENCERUN_TOKEN\" > " +
                             id + ".tmp && mv " + id + ".tmp " + id + ".env; while [ ! -e " + id +
                             ".go ]; do sleep 0.02; done";
  Holder h;
  h.proc = start(sh_args(url, name, script, std::move(options)));
  auto line = wait_for_line(file(id + ".env"), 15s);
  if (!line) throw std::runtime_error("holder " + id + " of " + name + " never ran\n" + h.proc->result().describe());
  wait_pid(id + ".pid");
  auto w = deploy::split_words(*line);
  if (w.size() != 3) throw std::runtime_error("holder " + id + ": malformed env line '" + *line + "'");
  h.slot = static_cast<int>(parse_ll(w[0]).value_or(-1));
  h.owner = w[1];
  h.token = parse_ll(w[2]).value_or(0);
  return h;
}

::testing::AssertionResult one_line_error(const RunResult& r, const std::string& msg) {
  auto lines = split_lines(trim(r.err));
  if (lines.size() != 1)
    return ::testing::AssertionFailure() << "expected one line on stderr, got " << lines.size() << "\n" << r;
  if (!lines[0].starts_with("fencerun: ") || lines[0].find(msg) == std::string::npos)
    return ::testing::AssertionFailure() << "expected 'fencerun: ..." << msg << "...'\n" << r;
  return ::testing::AssertionSuccess();
}

}  // namespace fencerun::test::admin
