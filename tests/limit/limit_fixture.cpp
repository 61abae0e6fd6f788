#include "limit_fixture.hpp"

#include <signal.h>
#include <unistd.h>

#include <sstream>
#include <stdexcept>

#ifndef LIMIT_PROBE
#error "LIMIT_PROBE must name the limit_probe helper"
#endif

namespace fencerun::test::limit {

const char* probe_binary() { return LIMIT_PROBE; }

void LimitTest::TearDown() {
  for (pid_t g : groups_) ::kill(-g, SIGKILL);
  HandoverTest::TearDown();
}

std::vector<std::string> LimitTest::limit_opts(int n, std::vector<std::string> more) {
  std::vector<std::string> o = {"--limit", std::to_string(n)};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

std::string LimitTest::report_script(const std::string& id) {
  return "printf '%s %s %s %s %s\\n' \"${FENCERUN_SLOT:-unset}\" \"${FENCERUN_TOKEN:-unset}\" "
         "\"${FENCERUN_LIMIT:-unset}\" \"$$\" \"${FENCERUN_OWNER:-unset}\" > " + id + ".env.tmp && mv " + id +
         ".env.tmp " + id + ".env";
}

std::string LimitTest::holder_script(const std::string& id) {
  return report_script(id) + "; while [ ! -e " + id + ".go ]; do sleep 0.01; done";
}

std::optional<Held> LimitTest::held(const std::string& id, Clock::duration timeout) {
  auto line = wait_for_line(file(id + ".env"), timeout);
  if (!line) return std::nullopt;
  std::istringstream in(*line);
  std::string slot, token, limit, pid, owner;
  if (!(in >> slot >> token >> limit >> pid >> owner)) return std::nullopt;
  Held h;
  auto s = parse_ll(slot);
  auto t = parse_ll(token);
  auto l = parse_ll(limit);
  auto p = parse_ll(pid);
  if (!s || !t || !l || !p) {
    ADD_FAILURE() << id << " saw FENCERUN_SLOT/TOKEN/LIMIT: " << *line;
    return std::nullopt;
  }
  h.slot = static_cast<int>(*s);
  h.token = *t;
  h.limit = *l;
  h.cmd_pid = static_cast<pid_t>(*p);
  h.owner = owner;
  return h;
}

std::unique_ptr<FencerunProcess> LimitTest::start_slot_holder(const std::string& name, const std::string& id,
                                                              std::vector<std::string> options, Held* out) {
  auto p = start(name, holder_script(id), std::move(options));
  auto h = held(id);
  if (!h) throw std::runtime_error("holder " + id + " never ran its command: " + p->result().describe());
  if (out) *out = *h;
  return p;
}

SpawnOptions LimitTest::in_dir() const {
  SpawnOptions o;
  o.cwd = file(".");
  return o;
}

RunResult LimitTest::run(std::vector<std::string> args, Clock::duration timeout) {
  return run_fencerun(std::move(args), in_dir(), timeout);
}

RunResult LimitTest::run_sh(const std::string& name, const std::string& script, std::vector<std::string> options,
                            Clock::duration timeout) {
  std::vector<std::string> a = {"-r", redis().url()};
  a.insert(a.end(), options.begin(), options.end());
  a.insert(a.end(), {name, "--", "sh", "-c", script});
  return run(std::move(a), timeout);
}

std::unique_ptr<Process> LimitTest::start_group(const std::string& script) {
  // setsid(1) execs in place: the test's child is no group leader, so no fork.
  auto p = std::make_unique<Process>(std::vector<std::string>{"setsid", "sh", "-c", script}, in_dir());
  groups_.push_back(p->pid());
  return p;
}

void LimitTest::kill_holder(Process& fencerun, const Held& h) {
  fencerun.signal(SIGKILL);
  if (process_group(h.cmd_pid) == h.cmd_pid) ::kill(-h.cmd_pid, SIGKILL);
  ::kill(h.cmd_pid, SIGKILL);
}

}  // namespace fencerun::test::limit
