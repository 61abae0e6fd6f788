#include "fence_harness.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace fencerun::test::fence {
namespace {

// Stopped, or in an uninterruptible wait with SIGSTOP pending (a shell waiting in vfork() for a child
// that was stopped before it could exec): either way it runs no more code until SIGCONT.
bool stopped(pid_t pid) {
  auto st = process_state(pid);
  return st && (*st == 'T' || *st == 'D');
}

}  // namespace

std::string fencerun_path() { return fencerun_binary(); }

// ---------------------------------------------------------------------------------------------- Lab

Lab::Lab(std::string lock_name) : m_lock(std::move(lock_name)) {}

RedisServer& Lab::redis() const {
  if (!m_redis) m_redis = std::make_unique<RedisServer>();
  return *m_redis;
}

bool Lab::wait_lock_free(Clock::duration timeout) {
  return wait_until([&] { return !redis().exists(lock_key(m_lock)); }, timeout, 2ms);
}

std::optional<std::string> Lab::lock_value() const { return redis().get(lock_key(m_lock)); }

// ---------------------------------------------------------------------------------------------- Kit

std::string Token::describe() const {
  switch (via) {
    case Via::Option: return "token option '" + text + "'";
    case Via::Environment: return "FENCERUN_TOKEN='" + text + "'";
    case Via::Missing: break;
  }
  return "no token";
}

void Kit::expect_nothing_written() const {
  EXPECT_EQ(guarded_value(), std::nullopt) << name() << ": nothing may be written";
  EXPECT_EQ(recorded_token(), std::nullopt) << name() << ": no token may be recorded";
}

std::vector<Token> cli_malformed_tokens() {
  return {Token::missing(),
          Token::environment(""),
          Token::environment("abc"),
          Token::environment("x1"),
          Token::environment("-5"),
          Token::environment("0"),
          Token::environment("9007199254740992"),
          Token::environment(" 5"),
          Token::option("1e5")};
}

void add_cli_token(const Token& token, std::vector<std::string>& args, EnvList& env) {
  switch (token.via) {
    case Token::Via::Option: args.insert(args.end(), {"--token", token.text}); break;
    case Token::Via::Environment: env.emplace_back("FENCERUN_TOKEN", token.text); break;
    case Token::Via::Missing: break;
  }
}

GuardResult finish_cli(Process& writer) {
  GuardResult g;
  auto code = writer.wait_for_exit(30s);
  const RunResult r = writer.result();
  g.code = code.value_or(-1);
  g.message = trim(r.err);
  g.detail = (code ? "" : "(did not finish within 30 s) ") + r.describe();
  return g;
}

namespace {

class UnavailableKit : public Kit {
 public:
  UnavailableKit(std::string name, std::string why) : m_name(std::move(name)), m_why(std::move(why)) {}
  std::string name() const override { return m_name; }
  std::optional<std::string> unavailable() const override { return m_why; }
  std::string guarded_body() const override { return unused<std::string>(); }
  std::string plain_body() const override { return unused<std::string>(); }
  std::optional<std::string> guarded_value() const override { return unused<std::optional<std::string>>(); }
  std::optional<std::string> control_value() const override { return unused<std::optional<std::string>>(); }
  std::optional<long long> recorded_token() const override { return unused<std::optional<long long>>(); }
  EnvList env() const override { return unused<EnvList>(); }
  std::unique_ptr<Process> start_write(const Token&, const std::string&) override {
    return unused<std::unique_ptr<Process>>();
  }
  GuardResult finish(Process&) const override { return unused<GuardResult>(); }
  std::string stale_message(long long, long long) const override { return unused<std::string>(); }
  std::vector<Token> malformed_tokens() const override { return unused<std::vector<Token>>(); }

 private:
  template <class T>
  T unused() const {
    throw std::logic_error(m_name + " kit is unavailable (" + m_why + ") and must not be used");
  }
  std::string m_name, m_why;
};

std::vector<KitEntry>& kit_registry() {
  static std::vector<KitEntry> kits;
  return kits;
}
}  // namespace

std::unique_ptr<Kit> unavailable_kit(std::string name, std::string why) {
  return std::make_unique<UnavailableKit>(std::move(name), std::move(why));
}

bool register_kit(std::string name, std::function<std::unique_ptr<Kit>(Lab&)> make) {
  kit_registry().push_back({std::move(name), std::move(make)});
  return true;
}

std::vector<KitEntry> registered_kits() {
  auto kits = kit_registry();
  std::ranges::sort(kits, {}, &KitEntry::name);
  return kits;
}

namespace {
std::vector<SqlDbEntry>& sql_db_registry() {
  static std::vector<SqlDbEntry> dbs;
  return dbs;
}
}  // namespace

bool register_sql_db(std::string name, std::function<std::unique_ptr<SqlDb>(std::string& why)> make) {
  sql_db_registry().push_back({std::move(name), std::move(make)});
  return true;
}

std::vector<SqlDbEntry> registered_sql_dbs() {
  auto dbs = sql_db_registry();
  std::ranges::sort(dbs, {}, &SqlDbEntry::name);
  return dbs;
}

// -------------------------------------------------------------------------------------------- Owner

Owner::Owner(Lab& lab, const GuardKit& kit, std::string label, std::string ttl, std::string wait)
    : m_lab(lab), m_label(std::move(label)) {
  const std::string& L = m_label;
  std::string script = "guarded() {\n" + kit.guarded_body() + "\n}\n" +
                       "plain() {\n" + kit.plain_body() + "\n}\n" +
                       "echo $$ > " + L + ".pid\n"
                       "exec 3< " + L + ".ctl\n"
                       "echo \"$FENCERUN_TOKEN\" > " + L + ".token\n"
                       "n=0\n"
                       "while read -r request <&3; do\n"
                       "  [ \"$request\" = go ] || exit 0\n"
                       "  DATA=\"" + L + " $FENCERUN_TOKEN $n\"\n"
                       "  guarded; rc=$?\n"
                       "  plain\n"
                       "  echo $rc > " + L + ".rc$n\n"
                       "  n=$((n+1))\n"
                       "done\n";
  auto ctl = lab.file(L + ".ctl");
  if (::mkfifo(ctl.c_str(), 0600) != 0) throw std::runtime_error("mkfifo " + ctl.string() + " failed");
  m_ctl.reset(::open(ctl.c_str(), O_RDWR | O_CLOEXEC));
  if (!m_ctl) throw std::runtime_error("cannot open " + ctl.string());
  SpawnOptions so;
  so.env = kit.env();
  so.env.emplace_back("FENCERUN", fencerun_path());
  so.cwd = lab.dir().path();
  m_proc = std::make_unique<FencerunProcess>(
      std::vector<std::string>{"-r", lab.redis().url(), "-t", ttl, "-w", wait, lab.lock(), "--", "sh", "-c", script},
      std::move(so));
}

Owner::~Owner() {
  if (m_pgid > 0) {
    ::kill(-m_pgid, SIGCONT);
    ::kill(-m_pgid, SIGKILL);
  }
  if (m_proc->running()) ::kill(m_proc->pid(), SIGCONT);
  m_proc->kill_and_reap();
}

void Owner::wait_started(Clock::duration timeout) {
  std::optional<std::string> token;
  auto path = m_lab.file(m_label + ".token");
  wait_until([&] { return (token = wait_for_line(path, 0ms)).has_value() || !m_proc->running(); }, timeout, 2ms);
  if (!token) token = wait_for_line(path, 0ms);
  if (!token) {
    if (!m_proc->running()) throw std::runtime_error("owner " + m_label + " exited before its command ran:\n" + m_proc->result().describe());
    throw std::runtime_error("owner " + m_label + " did not start in time");
  }
  auto t = parse_ll(*token);
  if (!t) throw std::runtime_error("owner " + m_label + " wrote a malformed token '" + *token + "'");
  m_token = *t;
  auto pid = wait_for_pid_file(m_lab.file(m_label + ".pid"), timeout);
  if (!pid) throw std::runtime_error("owner " + m_label + " wrote no pid");
  m_cmd_pid = *pid;
  auto pgid = process_group(m_cmd_pid);
  if (!pgid) throw std::runtime_error("owner " + m_label + "'s command vanished");
  m_pgid = *pgid;
}

std::string Owner::data(int n) const { return m_label + " " + std::to_string(m_token) + " " + std::to_string(n); }

std::optional<int> Owner::write(Clock::duration timeout) {
  int n = m_writes++;
  request("go\n");
  auto line = wait_for_line(m_lab.file(m_label + ".rc" + std::to_string(n)), timeout);
  if (!line) return std::nullopt;
  auto rc = parse_ll(*line);
  if (!rc) return std::nullopt;
  return static_cast<int>(*rc);
}

void Owner::request(const std::string& line) {
  if (::write(m_ctl.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    throw std::runtime_error("cannot send a request to owner " + m_label);
}

// fencerun's watchdog ("fencerun-watch", a child of fencerun in a group of its own), or -1.
pid_t watchdog_of(pid_t fencerun) {
  std::ifstream children("/proc/" + std::to_string(fencerun) + "/task/" + std::to_string(fencerun) + "/children");
  for (pid_t child; children >> child;) {
    std::ifstream comm("/proc/" + std::to_string(child) + "/comm");
    std::string name;
    if (std::getline(comm, name) && name == "fencerun-watch") return child;
  }
  return -1;
}

// The watchdog's process group: a watchdog that moves into a memory of its own (a new pid, first a
// child of the old one) stays in it, so a signal to the group reaches it wherever it is.
pid_t watchdog_group_of(pid_t fencerun) {
  pid_t w = watchdog_of(fencerun);
  if (w <= 0) return -1;
  pid_t g = ::getpgid(w);
  return g > 0 ? g : -1;
}

void pause_owner(pid_t fencerun) {
  pid_t g = watchdog_group_of(fencerun);
  if (g > 0) ::kill(-g, SIGSTOP);
  ::kill(fencerun, SIGSTOP);
}

void resume_owner(pid_t fencerun) {
  ::kill(fencerun, SIGCONT);
  pid_t g = watchdog_group_of(fencerun);
  if (g > 0) ::kill(-g, SIGCONT);
}

// The whole owner pauses, as a stopped VM or a long GC pause of the host would: fencerun, its
// watchdog (which would otherwise stop the command at the lease deadline on its own) and the command.
void Owner::freeze() {
  m_watchdog = watchdog_group_of(m_proc->pid());
  if (m_watchdog > 0) ::kill(-m_watchdog, SIGSTOP);
  ::kill(m_proc->pid(), SIGSTOP);
  ::kill(-m_pgid, SIGSTOP);
  bool ok = wait_until([&] { return stopped(m_proc->pid()) && stopped(m_cmd_pid); }, 5s, 1ms);
  if (!ok) {
    auto st = [](pid_t p) { auto s = process_state(p); return s ? std::string(1, *s) : std::string("gone"); };
    throw std::runtime_error("owner " + m_label + " did not stop: fencerun " + std::to_string(m_proc->pid()) + " " +
                             st(m_proc->pid()) + ", command " + std::to_string(m_cmd_pid) + " " + st(m_cmd_pid) +
                             "\n" + m_proc->result().describe());
  }
}

void Owner::thaw_command() { ::kill(-m_pgid, SIGCONT); }
void Owner::thaw_fencerun() {
  ::kill(m_proc->pid(), SIGCONT);
  if (m_watchdog > 0) ::kill(-m_watchdog, SIGCONT);
}

std::optional<int> Owner::finish(Clock::duration timeout) {
  request("exit\n");
  return m_proc->wait_for_exit(timeout);
}

// ------------------------------------------------------------------------------------------- rounds

std::string RoundStats::report(const std::string& guard) const {
  std::ostringstream ss;
  ss << "[fence " << guard << "] rounds=" << rounds << " writes=" << writes << " accepted=" << accepted
     << " stale_attempted=" << stale_attempted << " stale_accepted=" << stale_accepted
     << " fresh_rejected=" << fresh_rejected << " monotonic_violations=" << monotonic_violations
     << " late_accepted=" << late_accepted << " | unguarded control applied " << control_stale_applied
     << " of " << stale_attempted << " stale writes over newer data"
     << " | new owner's lock survived the old owner's release in " << lock_survived << "/" << lock_checks
     << " rounds | rounds started again after a short lease stopped the first owner: " << short_leases;
  return ss.str();
}

namespace {

// The model every write is checked against: the greatest accepted token and the data it wrote.
class Model {
 public:
  Model(const GuardKit& kit, RoundStats& stats) : m_kit(kit), m_s(stats) {}

  // One write by `o`; `late` marks a write after o's lease expired with no newer owner yet. With
  // `may_be_stopped`, an owner that fencerun stopped before it could write (its short lease could not
  // be renewed in time on a loaded machine: exit 124) is not a failure: returns false.
  bool attempt(Owner& o, bool late = false, bool may_be_stopped = false) {
    const int n = o.writes();
    const bool stale = o.token() < m_max;
    auto rc = o.write();
    ++m_s.writes;
    if (!rc) {
      if (may_be_stopped && o.wait_exit(5s) == 124) {
        --m_s.writes;
        return false;
      }
      ADD_FAILURE() << m_kit.name() << ": no status for write " << n << " of owner " << o.label();
      return true;
    }
    const GuardKit::Snapshot now = m_kit.snapshot();
    if (stale) {
      ++m_s.stale_attempted;
      if (*rc == 0) ++m_s.stale_accepted;
      EXPECT_EQ(*rc, 77) << m_kit.name() << ": stale write of " << o.label() << " (token " << o.token()
                         << " < accepted " << m_max << ")";
      if (*rc != 0) {
        EXPECT_EQ(now.guarded, m_data) << m_kit.name() << ": newer data must stay intact";
      }
      if (now.control == o.data(n)) ++m_s.control_stale_applied;
    } else {
      if (*rc != 0) ++m_s.fresh_rejected;
      EXPECT_EQ(*rc, 0) << m_kit.name() << ": write of " << o.label() << " with token " << o.token()
                        << " (greatest accepted " << m_max << ") should be accepted";
    }
    if (*rc == 0) {
      ++m_s.accepted;
      if (late) ++m_s.late_accepted;
      if (o.token() < m_max) ++m_s.monotonic_violations;
      m_max = std::max(m_max, o.token());
      m_data = o.data(n);
      EXPECT_EQ(now.guarded, m_data) << m_kit.name() << ": accepted write not visible";
      EXPECT_EQ(now.recorded, m_max) << m_kit.name() << ": recorded token";
    }
    return true;
  }

 private:
  const GuardKit& m_kit;
  RoundStats& m_s;
  long long m_max = 0;
  std::optional<std::string> m_data;
};

void check_lock_survives(Lab& lab, Owner& old_owner, const std::optional<std::string>& new_value, RoundStats& s) {
  old_owner.thaw_fencerun();
  auto code = old_owner.wait_exit();
  EXPECT_TRUE(code.has_value()) << "old owner " << old_owner.label() << " did not exit after resuming";
  ++s.lock_checks;
  auto now = lab.lock_value();
  if (new_value && now == new_value) ++s.lock_survived;
  EXPECT_EQ(now, new_value) << "the old owner's release touched the new owner's lock";
}

}  // namespace

RoundStats run_rounds(Lab& lab, const GuardKit& kit, int rounds, unsigned seed) {
  RoundStats s;
  Model model(kit, s);
  std::mt19937 rng(seed);
  const char* ttls[] = {"200ms", "250ms", "300ms"};
  int void_rounds = 0;
  for (int r = 0; r < rounds && !::testing::Test::HasFatalFailure(); ++r) {
    ++s.rounds;
    const std::string ttl = ttls[rng() % 3];
    // A lease this short can run out before its command starts when the machine is loaded: fencerun
    // then refuses to start the command (exit 124, "the lease ran short"), which is right, and the
    // round starts again with a fresh owner.
    std::unique_ptr<Owner> first;
    for (int attempt = 0;; ++attempt) {
      // A voided round runs again under the same number: the label (its files, its fifo) must be new.
      first = std::make_unique<Owner>(lab, kit,
                                      "a" + std::to_string(r) + (void_rounds ? "v" + std::to_string(void_rounds) : "") +
                                          (attempt ? "_" + std::to_string(attempt) : ""),
                                      ttl);
      try {
        first->wait_started();
        break;
      } catch (const std::runtime_error& e) {
        if (attempt >= 5 || std::string_view(e.what()).find("the lease ran short") == std::string_view::npos) throw;
        ++s.short_leases;
      }
    }
    Owner& a = *first;
    const int pre = static_cast<int>(rng() % 2);
    bool stopped = false;
    for (int i = 0; i < pre && !stopped; ++i) stopped = !model.attempt(a, false, true);
    if (stopped) {  // the round is void: fencerun stopped its owner before the write, as it must
      ++s.short_leases;
      --s.rounds;
      if (++void_rounds > 20) {
        ADD_FAILURE() << kit.name() << ": 20 rounds voided by owners stopped before their first write";
        break;
      }
      --r;
      continue;
    }
    const unsigned variant = rng() % 100;
    a.freeze();
    EXPECT_TRUE(lab.wait_lock_free(10s)) << "the frozen owner's lease did not expire";
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));

    if (variant < 70) {
      // (a) B acquires and writes; A resumes and writes with its old token: stale.
      Owner b(lab, kit, "b" + std::to_string(r), "5s", "5s");
      b.wait_started();
      EXPECT_GT(b.token(), a.token());
      const int bw = 1 + static_cast<int>(rng() % 2);
      for (int i = 0; i < bw; ++i) model.attempt(b);
      a.thaw_command();
      const int aw = 1 + static_cast<int>(rng() % 2);
      for (int i = 0; i < aw; ++i) model.attempt(a);
      check_lock_survives(lab, a, lab.lock_value(), s);
      if (rng() % 2) model.attempt(b);
      EXPECT_EQ(b.finish(), 0) << b.result();
    } else if (variant < 85) {
      // (b) B holds the lock but has not written when A's write arrives: nothing newer was accepted,
      // so A's write goes in; B's later write follows it; a second A write is then stale.
      Owner b(lab, kit, "b" + std::to_string(r), "5s", "5s");
      b.wait_started();
      a.thaw_command();
      model.attempt(a);
      model.attempt(b);
      if (rng() % 2) model.attempt(a);
      check_lock_survives(lab, a, lab.lock_value(), s);
      EXPECT_EQ(b.finish(), 0) << b.result();
    } else {
      // (c) Nobody acquired in the meantime: A's late write is not stale (no newer token exists).
      a.thaw_command();
      model.attempt(a, /*late=*/true);
      a.thaw_fencerun();
      EXPECT_TRUE(a.wait_exit().has_value());
      Owner b(lab, kit, "b" + std::to_string(r), "5s", "5s");
      b.wait_started();
      model.attempt(b);
      EXPECT_EQ(b.finish(), 0) << b.result();
    }
  }
  return s;
}

void paused_owner_scenario(Lab& lab, const GuardKit& kit) {
  Owner a(lab, kit, "a", "300ms");
  a.wait_started();
  ASSERT_EQ(a.write(), 0) << "A's write while its lease is valid\n" << a.result();
  EXPECT_EQ(kit.guarded_value(), a.data(0));

  a.freeze();
  ASSERT_TRUE(lab.wait_lock_free(10s)) << "A's lease did not expire while A was frozen";

  Owner b(lab, kit, "b", "10s", "5s");
  b.wait_started();
  ASSERT_GT(b.token(), a.token());
  ASSERT_EQ(b.write(), 0) << b.result();
  EXPECT_EQ(kit.guarded_value(), b.data(0));
  EXPECT_EQ(kit.recorded_token(), b.token());
  const auto b_lock = lab.lock_value();
  ASSERT_TRUE(b_lock.has_value());

  // A wakes up believing it still holds the lease and writes with its old token.
  a.thaw_command();
  EXPECT_EQ(a.write(), 77) << "A's stale write must be rejected\n" << a.result();
  EXPECT_EQ(kit.guarded_value(), b.data(0)) << "B's data must be intact";
  EXPECT_EQ(kit.recorded_token(), b.token());
  // The control: the same stale write without a guard overwrote B's data.
  EXPECT_EQ(kit.control_value(), a.data(1)) << "the unguarded control should show the lost update";

  a.thaw_fencerun();
  auto code = a.wait_exit();
  ASSERT_TRUE(code.has_value());
  const std::string err = a.result().err;
  EXPECT_NE(err.find("stale token " + std::to_string(a.token()) + " rejected"), std::string::npos) << err;
  EXPECT_NE(err.find("it has accepted " + std::to_string(b.token())), std::string::npos) << err;
  EXPECT_EQ(lab.lock_value(), b_lock) << "A's release must not touch B's lock";

  ASSERT_EQ(b.write(), 0);  // B still writes (equal token accepted again)
  EXPECT_EQ(kit.guarded_value(), b.data(1));
  EXPECT_EQ(b.finish(), 0) << b.result();
}

}  // namespace fencerun::test::fence
