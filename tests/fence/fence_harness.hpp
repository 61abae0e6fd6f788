#pragma once
// Scenario harness for the fence guards. Leases and tokens are real: every owner is a fencerun process
// holding a lease in a real redis-server, and its command (a small shell loop) writes through the
// guard on request, with the token fencerun put in its environment. A guard under test is described
// by a GuardKit: a shell function that writes "$DATA" through the guard (status 0 accepted, 77 stale),
// the same write without any guard (the control), and readers for both resources. A guard that runs
// the common scenarios of guard_suite_test.cpp is described by a Kit: a GuardKit that also performs
// one guarded write directly, with a token given as the guard takes it.
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"
#include "util/fd.hpp"

namespace fencerun::test::fence {

class GuardKit {
 public:
  virtual ~GuardKit() = default;
  virtual std::string name() const = 0;
  // Body of the shell function `guarded`: writes "$DATA" through the guard with $FENCERUN_TOKEN;
  // returns 0 accepted, 77 stale token, anything else a failure.
  virtual std::string guarded_body() const = 0;
  // Body of the shell function `plain`: the same write with no guard at all.
  virtual std::string plain_body() const = 0;
  // What each resource holds now (nullopt: nothing written yet).
  virtual std::optional<std::string> guarded_value() const = 0;
  virtual std::optional<std::string> control_value() const = 0;
  // The greatest token the guarded resource has recorded (nullopt: none).
  virtual std::optional<long long> recorded_token() const = 0;
  // Variables the shell functions need.
  virtual EnvList env() const = 0;

  // All three at once (one query where reading is costly).
  struct Snapshot {
    std::optional<std::string> guarded, control;
    std::optional<long long> recorded;
  };
  virtual Snapshot snapshot() const { return {guarded_value(), control_value(), recorded_token()}; }
};

// A token as a guarded write receives it: the --token option (or the SQL argument), $FENCERUN_TOKEN,
// or none at all. `text` is passed as it is, so malformed tokens can be written too.
struct Token {
  enum class Via { Option, Environment, Missing };
  Via via = Via::Option;
  std::string text;

  static Token option(long long t) { return {Via::Option, std::to_string(t)}; }
  static Token option(std::string text) { return {Via::Option, std::move(text)}; }
  static Token environment(std::string text) { return {Via::Environment, std::move(text)}; }
  static Token missing() { return {Via::Missing, {}}; }
  std::string describe() const;
};

// The outcome of one guarded write, in the CLI's terms whatever the guard: 0 accepted, 77 stale
// token, 64 malformed token; anything else is a failure.
struct GuardResult {
  int code = -1;
  std::string message;  // what the guard said about it: its stderr, or its error line ("fencerun: ...")
  std::string detail;   // everything there is, for assertion messages
};

// A guard under the common scenarios: set up on construction (its resource, its server, rows),
// torn down on destruction.
class Kit : public GuardKit {
 public:
  // Why the guard cannot be tested on this machine (a program is missing); nullopt: it can.
  virtual std::optional<std::string> unavailable() const { return std::nullopt; }
  // What the lease owners' shell functions lack here (e.g. redis-cli for the control writes).
  virtual std::optional<std::string> owners_unavailable() const { return std::nullopt; }
  // Starts one write of `data` (a line) through the guard with `token`; finish() waits for it.
  virtual std::unique_ptr<Process> start_write(const Token& token, const std::string& data) = 0;
  virtual GuardResult finish(Process& writer) const = 0;
  GuardResult write(const Token& token, const std::string& data) {
    auto writer = start_write(token, data);
    return finish(*writer);
  }
  // The guard's message when it rejects token `stale` after it accepted `accepted`.
  virtual std::string stale_message(long long stale, long long accepted) const = 0;
  // Token inputs the guard refuses as malformed (64, nothing written).
  virtual std::vector<Token> malformed_tokens() const = 0;
  // Guard-specific checks once the writes are over and `token` is the greatest accepted.
  virtual void expect_settled(long long /*token*/) const {}
  // Checks that nothing was written (no data, no recorded token).
  virtual void expect_nothing_written() const;
  // Extra output when a test failed (server logs).
  virtual void describe_on_failure() const {}
  // The seed of the randomized paused-owner rounds.
  virtual unsigned rounds_seed() const { return 20240610u; }
};

// The malformed tokens of the CLI guards (fence file, fence redis): missing, empty, not a number,
// not positive, above 2^53 - 1, with a space, in another notation.
std::vector<Token> cli_malformed_tokens();

// Waits for a CLI guard (30 s at most): its exit code, and its stderr as the message.
GuardResult finish_cli(Process& writer);

// `args` plus the token as a CLI guard takes it: `--token T`, or FENCERUN_TOKEN=T added to `env`.
void add_cli_token(const Token& token, std::vector<std::string>& args, EnvList& env);

// A kit for a guard that cannot be tested here: unavailable() says `why`; nothing else is called.
std::unique_ptr<Kit> unavailable_kit(std::string name, std::string why);

// A database with an SQL guard loaded, for the read-modify-write scenarios of sql_rmw_test.cpp:
// the test opens clients that read statements from stdin, and speaks the dialect through these.
class SqlDb {
 public:
  virtual ~SqlDb() = default;
  virtual std::string name() const = 0;
  // Runs statements in one client run; throws when they fail.
  virtual void exec(const std::string& sql) const = 0;
  // The first column of the first row (nullopt: no row, or NULL).
  virtual std::optional<std::string> value(const std::string& sql) const = 0;
  // A client that reads statements from stdin, prints rows to stdout (tuples only) and errors to
  // stderr, and goes on after an error.
  virtual std::vector<std::string> client_args() const = 0;
  // A statement or client command that prints `marker` on a line of its own, even after an error in
  // the transaction.
  virtual std::string echo(const std::string& marker) const = 0;
  virtual std::string begin() const = 0;  // opens a transaction (that a fenced read needs)
  virtual std::string admit(const std::string& resource, long long token) const = 0;
  // Reads table rmw_counter's row `key` as a line "<tag><separator><v>"; `locking`: and locks it to
  // the commit (SELECT ... FOR UPDATE where the dialect has it).
  virtual std::string read_counter(const std::string& tag, const std::string& key, bool locking) const = 0;
  // Whether a client's stderr reports a stale token.
  virtual bool stale(const std::string& err) const = 0;
  // How many sessions wait for a lock now; nullopt where that cannot be seen (SQLite).
  virtual std::optional<int> lock_waiters() const { return std::nullopt; }
};

struct SqlDbEntry {
  std::string name;
  // nullptr when the database cannot run here (`why` says why).
  std::function<std::unique_ptr<SqlDb>(std::string& why)> make;
};
inline void PrintTo(const SqlDbEntry& db, std::ostream* os) { *os << db.name; }
// Adds a database to the read-modify-write suite (like register_kit).
bool register_sql_db(std::string name, std::function<std::unique_ptr<SqlDb>(std::string& why)> make);
std::vector<SqlDbEntry> registered_sql_dbs();

class Lab;
struct KitEntry {
  std::string name;  // the test name suffix: letters, digits and _
  std::function<std::unique_ptr<Kit>(Lab&)> make;
};
// Its name in test names and ctest's "# GetParam() = ...".
inline void PrintTo(const KitEntry& kit, std::ostream* os) { *os << kit.name; }
// Adds a kit to the guard suite; returns true (for a namespace-scope initializer in the kit's file).
bool register_kit(std::string name, std::function<std::unique_ptr<Kit>(Lab&)> make);
// Every registered kit, by name.
std::vector<KitEntry> registered_kits();

// One lock, its Redis server and a work directory shared by the owners of a test. The server starts
// on first use: a test that writes through a guard directly needs no lease.
class Lab {
 public:
  explicit Lab(std::string lock_name);
  RedisServer& redis() const;
  const std::string& lock() const { return m_lock; }
  const TempDir& dir() const { return m_dir; }
  std::filesystem::path file(std::string_view name) const { return m_dir / name; }
  // Waits until the lock key is gone (the lease expired or was released); false on timeout.
  bool wait_lock_free(Clock::duration timeout);
  std::optional<std::string> lock_value() const;

 private:
  mutable std::unique_ptr<RedisServer> m_redis;
  std::string m_lock;
  TempDir m_dir{"fence"};
};

// A lease holder: `fencerun -r URL -t TTL -w WAIT LOCK -- sh -c LOOP`. The loop records its pid and
// token, then reads requests from the FIFO <label>.ctl: "go" performs the next write n (guarded
// write, then the unguarded control write, then the guard's status to <label>.rc<n>), anything else
// ends the command.
// An owner host paused as a whole (a stopped VM, a long pause of the machine): fencerun and its
// watchdog stop, so nothing enforces the lease on that side until it resumes.
pid_t watchdog_of(pid_t fencerun);
void pause_owner(pid_t fencerun);
void resume_owner(pid_t fencerun);

class Owner {
 public:
  Owner(Lab& lab, const GuardKit& kit, std::string label, std::string ttl, std::string wait = "0");
  ~Owner();
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;

  const std::string& label() const { return m_label; }
  // Waits until the command runs (the lease is held); throws when fencerun exits first.
  void wait_started(Clock::duration timeout = 10s);
  long long token() const { return m_token; }
  pid_t fencerun_pid() const { return m_proc->pid(); }
  pid_t command_pid() const { return m_cmd_pid; }
  // The data the n-th write of this owner carries.
  std::string data(int n) const;
  // Asks for the next write and waits for the guard's status (nullopt: no answer in time, e.g. the
  // command was stopped).
  std::optional<int> write(Clock::duration timeout = 20s);
  int writes() const { return m_writes; }

  // SIGSTOP fencerun and the command's whole process group: a paused owner.
  void freeze();
  void thaw_command();   // SIGCONT the command's group (fencerun stays stopped)
  void thaw_fencerun();  // SIGCONT fencerun
  // Lets the command end and waits for fencerun's exit code.
  std::optional<int> finish(Clock::duration timeout = 20s);
  std::optional<int> wait_exit(Clock::duration timeout = 20s) { return m_proc->wait_for_exit(timeout); }
  RunResult result() const { return m_proc->result(); }
  bool running() { return m_proc->running(); }

 private:
  void request(const std::string& line);

  Lab& m_lab;
  std::string m_label;
  UniqueFd m_ctl;  // the request FIFO, held open read-write (so neither side blocks on open)
  std::unique_ptr<FencerunProcess> m_proc;
  pid_t m_cmd_pid = -1;
  pid_t m_watchdog = -1;  // the watchdog's process group, while frozen
  pid_t m_pgid = -1;
  long long m_token = 0;
  int m_writes = 0;
};

// What the randomized pause/resume rounds saw.
struct RoundStats {
  int rounds = 0;
  int writes = 0;
  int accepted = 0;
  int stale_attempted = 0;        // writes whose token was older than one already accepted
  int stale_accepted = 0;         // ... that the guard let through (must be 0)
  int fresh_rejected = 0;         // writes that were not stale but got rejected (must be 0)
  int control_stale_applied = 0;  // stale writes the unguarded control applied over newer data
  int monotonic_violations = 0;   // accepted writes older than an earlier accepted one (must be 0)
  int lock_survived = 0;          // rounds in which the new owner's lock survived the old owner's exit
  int lock_checks = 0;
  int late_accepted = 0;          // writes after the lease expired with no newer owner: accepted
  int short_leases = 0;           // rounds started again: the first owner's short lease ran out first
  std::string report(const std::string& guard) const;
};

// `rounds` randomized rounds: owner A (short TTL) writes 0-2 times while valid, is frozen past its
// TTL, then, at random, (a) B acquires and writes before A resumes and tries again with its old
// token (stale), (b) B acquires but has not written yet when A resumes, or (c) nobody acquires before
// A resumes. Every write is checked against a model of the greatest accepted token.
RoundStats run_rounds(Lab& lab, const GuardKit& kit, int rounds, unsigned seed);

// Scenario 1 once, with assertions on everything: A frozen past its TTL, B writes through the guard,
// A resumes and writes with its old token: rejected (77), B's data intact, while the unguarded
// control lets A's stale write overwrite B's.
void paused_owner_scenario(Lab& lab, const GuardKit& kit);

std::string fencerun_path();

}  // namespace fencerun::test::fence
