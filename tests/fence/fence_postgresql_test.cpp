// `fencerun fence sql postgresql` and fencerun_admit(): the printed schema loaded into a real
// PostgreSQL (initdb as the postgres user in a temp dir, server on a unix socket only), exercised from
// psql transactions with tokens from real fencerun leases. Its kit runs the guard suite
// (guard_suite_test.cpp); the tests here are the ones only this guard has.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "fence_harness.hpp"
#include "util/fd.hpp"

namespace fencerun::test::fence {
namespace {

std::string pg_bin(const char* tool) { return std::string(FENCE_TEST_PG_BIN_DIR) + "/" + tool; }

// A psql process kept open for the test's own reads (a new psql per read costs a process and a
// backend each time). Each query is followed by a marker line that carries psql's ERROR variable.
class PgReader {
 public:
  explicit PgReader(std::vector<std::string> argv) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    m_pid = ::fork();
    if (m_pid < 0) throw std::runtime_error("fork failed");
    if (m_pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) ::dup2(devnull, 2);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    m_in.reset(in[1]);
    m_out.reset(out[0]);
  }
  ~PgReader() {
    m_in.reset();
    m_out.reset();
    if (m_pid > 0) {
      ::kill(m_pid, SIGKILL);
      int status = 0;
      ::waitpid(m_pid, &status, 0);
    }
  }
  PgReader(const PgReader&) = delete;
  PgReader& operator=(const PgReader&) = delete;

  // The rows (unaligned, tuples only), or nullopt when the statement failed or psql did not answer.
  std::optional<std::string> query(const std::string& sql) {
    static constexpr std::string_view k_marker = "__fence_test_end__ ";
    std::string request = sql + ";\n\\echo " + std::string(k_marker) + ":ERROR\n";
    if (::write(m_in.get(), request.data(), request.size()) != static_cast<ssize_t>(request.size())) return std::nullopt;
    const auto deadline = Clock::now() + 30s;
    for (;;) {
      auto pos = m_buffer.find(k_marker);
      auto eol = pos == std::string::npos ? std::string::npos : m_buffer.find('\n', pos);
      if (eol != std::string::npos) {
        std::string rows = m_buffer.substr(0, pos);
        bool error = m_buffer.substr(pos + k_marker.size(), eol - pos - k_marker.size()) != "false";
        m_buffer.erase(0, eol + 1);
        if (error) return std::nullopt;
        return rows;
      }
      if (Clock::now() >= deadline) return std::nullopt;
      pollfd p{m_out.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      ssize_t n = ::read(m_out.get(), buf, sizeof buf);
      if (n <= 0) return std::nullopt;
      m_buffer.append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  pid_t m_pid = -1;
  UniqueFd m_in, m_out;
  std::string m_buffer;
};

// A PostgreSQL server owned by the test run: data directory and socket directory in a temp dir owned
// by the postgres user (initdb refuses root), the postmaster a child process of the test (killed with
// it), reachable on a unix socket only.
class PgServer {
 public:
  // nullptr when the PostgreSQL binaries are missing (`why` says which); throws when they are there
  // but the server does not start.
  static PgServer* get(std::string& why) {
    auto& server = instance();
    static std::string missing;
    if (server) return server.get();
    if (!missing.empty()) {
      why = missing;
      return nullptr;
    }
    for (const char* tool : {"initdb", "pg_ctl", "postgres", "psql"}) {
      if (std::string(FENCE_TEST_PG_BIN_DIR).empty() || ::access(pg_bin(tool).c_str(), X_OK) != 0) {
        missing = std::string("PostgreSQL binary '") + tool + "' not found (looked in '" + FENCE_TEST_PG_BIN_DIR +
                  "', from /usr/lib/postgresql/*/bin at configure time): PostgreSQL guard tests skipped";
        why = missing;
        return nullptr;
      }
    }
    server.reset(new PgServer());
    return server.get();
  }
  // At the end of the test program; never starts a server.
  static void shutdown() { instance().reset(); }

  std::string socket_dir() const { return (m_dir.path() / "sock").string(); }
  int port() const { return m_port; }

  // psql -c SQL (unaligned, tuples only); the result's out has the rows.
  RunResult psql(const std::string& sql, Clock::duration timeout = 30s) const {
    return run_program(base_args({"-tA", "-c", sql}), {}, timeout);
  }
  // A read through the test's own long-lived psql.
  std::optional<std::string> read(const std::string& sql) const {
    if (!m_reader) m_reader = std::make_unique<PgReader>(base_args({"-tA"}));
    return m_reader->query(sql);
  }
  std::vector<std::string> base_args(std::vector<std::string> extra) const {
    std::vector<std::string> a = {pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", socket_dir(), "-p",
                                  std::to_string(m_port), "-U", "postgres", "-d", "postgres"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  EnvList env() const {
    return {{"PSQL", pg_bin("psql")}, {"PGSOCK", socket_dir()}, {"PGPORT", std::to_string(m_port)}};
  }

  ~PgServer() { stop(); }

 private:
  static std::unique_ptr<PgServer>& instance() {
    static std::unique_ptr<PgServer> server;
    return server;
  }

  PgServer() {
    const bool root = ::geteuid() == 0;
    const passwd* pw = root ? ::getpwnam("postgres") : nullptr;
    if (root && !pw) throw std::runtime_error("running as root, but there is no postgres user to run initdb as");
    if (pw) {
      m_uid = pw->pw_uid;
      m_gid = pw->pw_gid;
      if (::chown(m_dir.path().c_str(), m_uid, m_gid) != 0) throw std::runtime_error("chown of the PostgreSQL dir failed");
    }
    std::filesystem::create_directory(m_dir.path() / "sock");
    if (pw && ::chown((m_dir.path() / "sock").c_str(), m_uid, m_gid) != 0)
      throw std::runtime_error("chown of the socket dir failed");

    std::vector<std::string> initdb = {pg_bin("initdb"), "-D", (m_dir.path() / "data").string(), "-A", "trust",
                                       "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale", "C"};
    if (pw) initdb.insert(initdb.begin(), {"runuser", "-u", "postgres", "--"});
    SpawnOptions so;
    so.cwd = m_dir.path();
    auto r = run_program(initdb, so, 120s);
    if (r.exit_code != 0) throw std::runtime_error("initdb failed:\n" + r.describe());

    for (int attempt = 0; attempt < 10 && m_pid < 0; ++attempt) {
      m_port = pick_free_port();
      start();
      if (!wait_until([&] { return psql("SELECT 1").exit_code == 0 || !alive(); }, 60s, 50ms) || !alive()) {
        stop();
        continue;
      }
    }
    if (m_pid < 0) throw std::runtime_error("PostgreSQL did not start; log:\n" + read_file(m_dir / "log").value_or(""));
  }

  void start() {
    std::string postgres = pg_bin("postgres");
    std::string data = (m_dir.path() / "data").string();
    std::string sock = socket_dir();
    std::string port = std::to_string(m_port);
    std::string log = (m_dir.path() / "log").string();
    std::vector<std::string> argv = {postgres, "-D", data, "-k", sock, "-p", port, "-c", "listen_addresses=",
                                     "-c", "fsync=off", "-c", "max_connections=60"};
    std::vector<char*> args;
    for (auto& s : argv) args.push_back(s.data());
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        [[maybe_unused]] int ignored = ::fchown(fd, m_uid, m_gid);
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, 0);
      if (m_uid != 0 && ::geteuid() == 0) {
        if (::setgroups(0, nullptr) != 0 || ::setgid(m_gid) != 0 || ::setuid(m_uid) != 0) ::_exit(126);
      }
      // After the credentials change (which clears it): the server dies with the test program.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      if (::chdir(m_dir.path().c_str()) != 0) ::_exit(127);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    m_pid = pid;
  }

  bool alive() {
    if (m_pid < 0) return false;
    int status = 0;
    if (::waitpid(m_pid, &status, WNOHANG) == m_pid) {
      m_pid = -1;
      return false;
    }
    return true;
  }

  void stop() {
    m_reader.reset();
    if (m_pid < 0) return;
    ::kill(m_pid, SIGQUIT);  // immediate shutdown: the data is thrown away anyway
    if (!wait_until([&] { return !alive(); }, 10s, 5ms)) {
      ::kill(m_pid, SIGKILL);
      int status = 0;
      ::waitpid(m_pid, &status, 0);
    }
    m_pid = -1;
  }

  TempDir m_dir{"pg"};
  mutable std::unique_ptr<PgReader> m_reader;
  uid_t m_uid = 0;
  gid_t m_gid = 0;
  int m_port = 0;
  pid_t m_pid = -1;
};

#define REQUIRE_PG(var)                         \
  std::string why_##var;                        \
  PgServer* var = PgServer::get(why_##var);     \
  if (!var) GTEST_SKIP() << why_##var

std::string schema_text() {
  auto r = run_fencerun({"fence", "sql", "postgresql"});
  if (r.exit_code != 0) throw std::runtime_error("fence sql postgresql failed:\n" + r.describe());
  return r.out;
}

// Loads the printed schema (idempotent) and a data and a control table.
void load_schema(const PgServer& pg) {
  TempDir dir("pg-schema");
  auto file = dir / "schema.sql";
  write_file(file, schema_text() +
                       "CREATE TABLE IF NOT EXISTS fence_data (k text PRIMARY KEY, v text);\n"
                       "CREATE TABLE IF NOT EXISTS control_data (k text PRIMARY KEY, v text);\n");
  auto r = run_program(pg.base_args({"-f", file.string()}));
  if (r.exit_code != 0) throw std::runtime_error("loading the schema failed:\n" + r.describe());
}

std::optional<std::string> query_value(const PgServer& pg, const std::string& sql) {
  auto r = pg.read(sql);
  if (!r) {
    ADD_FAILURE() << "query failed: " << sql;
    return std::nullopt;
  }
  std::string v = trim(*r);
  if (v.empty()) return std::nullopt;
  return v;
}

// The PostgreSQL guard in the common scenarios: a psql transaction that admits the token and then
// updates the resource's row of fence_data; the control is the same update in control_data, without
// fencerun_admit. SQLSTATE ZF077 (stale) counts as 77, 22023 (malformed token) as 64.
class PgKit : public Kit {
 public:
  PgKit(const PgServer& pg, std::string resource) : m_pg(pg), m_resource(std::move(resource)) {
    auto r = pg.psql("INSERT INTO fence_data VALUES ('" + m_resource + "', NULL) ON CONFLICT DO NOTHING; "
                     "INSERT INTO control_data VALUES ('" + m_resource + "', NULL) ON CONFLICT DO NOTHING;");
    if (r.exit_code != 0) throw std::runtime_error(r.describe());
  }
  std::string name() const override { return "postgresql"; }
  // One psql run (a script on stdin, so a failed statement does not stop it) runs the writer's
  // transaction, admit first, and then the control: the same write as a plain UPDATE in a transaction
  // of its own, without fencerun_admit (`plain` has nothing left to do). SQLSTATE ZF077 -> 77.
  std::string guarded_body() const override {
    return "  err=$(\"$PSQL\" -X -q -v VERBOSITY=verbose -h \"$PGSOCK\" -p \"$PGPORT\" -U postgres -d postgres "
           "2>&1 >/dev/null <<SQL\n"
           "BEGIN;\n"
           "SELECT fencerun_admit('$FENCE_RESOURCE', $FENCERUN_TOKEN);\n"
           "UPDATE fence_data SET v = '$DATA' WHERE k = '$FENCE_RESOURCE';\n"
           "COMMIT;\n"
           "UPDATE control_data SET v = '$DATA' WHERE k = '$FENCE_RESOURCE';\n"
           "SQL\n"
           ")\n"
           "  rc=$?\n"
           "  [ -n \"$err\" ] && printf '%s\\n' \"$err\" >&2\n"
           "  case \"$err\" in *ZF077*) return 77 ;; *ERROR*) return 1 ;; esac\n"
           "  return $rc";
  }
  std::string plain_body() const override { return "  :"; }
  std::optional<std::string> guarded_value() const override {
    return query_value(m_pg, "SELECT v FROM fence_data WHERE k = '" + m_resource + "'");
  }
  std::optional<std::string> control_value() const override {
    return query_value(m_pg, "SELECT v FROM control_data WHERE k = '" + m_resource + "'");
  }
  std::optional<long long> recorded_token() const override {
    auto v = query_value(m_pg, "SELECT token FROM fencerun_fence WHERE resource = '" + m_resource + "'");
    if (!v) return std::nullopt;
    return parse_ll(*v);
  }
  Snapshot snapshot() const override {
    const std::string k = "'" + m_resource + "'";
    auto r = m_pg.read("SELECT (SELECT v FROM fence_data WHERE k = " + k + "), (SELECT v FROM control_data WHERE k = " +
                       k + "), (SELECT token FROM fencerun_fence WHERE resource = " + k + ")");
    Snapshot s;
    if (!r) {
      ADD_FAILURE() << "snapshot query failed";
      return s;
    }
    std::string line = trim(*r);
    auto p1 = line.find('|');
    auto p2 = line.find('|', p1 + 1);
    if (p1 == std::string::npos || p2 == std::string::npos) {
      ADD_FAILURE() << "unexpected snapshot '" << line << "'";
      return s;
    }
    auto field = [](std::string v) { return v.empty() ? std::nullopt : std::optional<std::string>(v); };
    s.guarded = field(line.substr(0, p1));
    s.control = field(line.substr(p1 + 1, p2 - p1 - 1));
    if (auto t = field(line.substr(p2 + 1))) s.recorded = parse_ll(*t);
    return s;
  }
  EnvList env() const override {
    EnvList e = m_pg.env();
    e.emplace_back("FENCE_RESOURCE", m_resource);
    return e;
  }

  // The token goes into the SQL as it is (none: NULL); how a CLI guard would take it does not apply.
  std::unique_ptr<Process> start_write(const Token& token, const std::string& data) override {
    auto file = m_dir / ("write." + std::to_string(++m_writes) + ".sql");
    const std::string res = literal(m_resource);
    write_file(file, "BEGIN;\nSELECT fencerun_admit(" + res + ", " +
                         (token.via == Token::Via::Missing ? std::string("NULL") : token.text) + ");\n"
                         "UPDATE fence_data SET v = " + literal(data) + " WHERE k = " + res + ";\nCOMMIT;\n");
    return std::make_unique<Process>(m_pg.base_args({"-v", "VERBOSITY=verbose", "-f", file.string()}));
  }
  GuardResult finish(Process& writer) const override {
    GuardResult g;
    auto code = writer.wait_for_exit(30s);
    const RunResult r = writer.result();
    g.detail = (code ? "" : "(did not finish within 30 s) ") + r.describe();
    if (auto at = r.err.find("fencerun: "); at != std::string::npos)
      g.message = r.err.substr(at, r.err.find('\n', at) - at);
    else
      g.message = trim(r.err);
    if (!code) g.code = -1;
    else if (*code == 0) g.code = 0;
    else if (r.err.find("ZF077") != std::string::npos) g.code = 77;
    else if (r.err.find("22023") != std::string::npos) g.code = 64;
    else g.code = 1;
    return g;
  }
  std::string stale_message(long long stale, long long accepted) const override {
    return "fencerun: stale token " + std::to_string(stale) + " rejected for " + m_resource + ": it has accepted " +
           std::to_string(accepted);
  }
  std::vector<Token> malformed_tokens() const override {
    return {Token::option("0"), Token::option("-1"), Token::missing(), Token::option("9007199254740992")};
  }
  unsigned rounds_seed() const override { return 20240613u; }

 private:
  static std::string literal(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
  }

  const PgServer& m_pg;
  std::string m_resource;
  TempDir m_dir{"pg-writes"};
  int m_writes = 0;
};

const bool g_pg_kit = register_kit("postgresql", [](Lab& lab) -> std::unique_ptr<Kit> {
  std::string why;
  PgServer* pg = PgServer::get(why);
  if (!pg) return unavailable_kit("postgresql", why);
  load_schema(*pg);
  return std::make_unique<PgKit>(*pg, lab.lock());
});

// The database for the read-modify-write suite (sql_rmw_test.cpp): psql sessions without
// ON_ERROR_STOP (they go on after an error; the test rolls back itself), verbose errors (SQLSTATE).
class PgDb : public SqlDb {
 public:
  explicit PgDb(const PgServer& pg) : m_pg(pg) {
    load_schema(pg);
    exec("CREATE TABLE IF NOT EXISTS rmw_counter (k text PRIMARY KEY, v bigint NOT NULL)");
  }
  std::string name() const override { return "postgresql"; }
  void exec(const std::string& sql) const override {
    auto r = m_pg.psql(sql);
    if (r.exit_code != 0) throw std::runtime_error("psql failed: " + sql + "\n" + r.describe());
  }
  std::optional<std::string> value(const std::string& sql) const override { return query_value(m_pg, sql); }
  std::vector<std::string> client_args() const override {
    return {pg_bin("psql"), "-X", "-q", "-tA", "-v", "VERBOSITY=verbose", "-h", m_pg.socket_dir(), "-p",
            std::to_string(m_pg.port()), "-U", "postgres", "-d", "postgres"};
  }
  std::string echo(const std::string& marker) const override { return "\\echo " + marker + "\n"; }
  std::string begin() const override { return "BEGIN;\n"; }
  std::string admit(const std::string& resource, long long token) const override {
    return "SELECT fencerun_admit('" + resource + "', " + std::to_string(token) + ");\n";
  }
  std::string read_counter(const std::string& tag, const std::string& key, bool locking) const override {
    return "SELECT '" + tag + "', v FROM rmw_counter WHERE k = '" + key + "'" + (locking ? " FOR UPDATE" : "") + ";\n";
  }
  bool stale(const std::string& err) const override { return err.find("ZF077") != std::string::npos; }
  std::optional<int> lock_waiters() const override {
    auto v = query_value(m_pg, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'");
    return v ? static_cast<int>(parse_ll(*v).value_or(0)) : 0;
  }

 private:
  const PgServer& m_pg;
};

const bool g_pg_db = register_sql_db("postgresql", [](std::string& why) -> std::unique_ptr<SqlDb> {
  PgServer* pg = PgServer::get(why);
  if (!pg) return nullptr;
  return std::make_unique<PgDb>(*pg);
});

class PgEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { PgServer::shutdown(); }
};
const auto* const g_pg_environment = ::testing::AddGlobalTestEnvironment(new PgEnvironment);

TEST(FencePostgresql, PrintedSchemaIsTheInstalledFile) {
  auto file = read_file(FENCE_TEST_SQL_FILE);
  ASSERT_TRUE(file);
  EXPECT_EQ(schema_text(), *file);
  EXPECT_NE(file->find("fencerun_admit(resource text, token bigint)"), std::string::npos);
  EXPECT_NE(file->find("'ZF077'"), std::string::npos);
  auto r = run_fencerun({"fence", "sql", "postgres"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, *file);
  r = run_fencerun({"fence", "sql", "oracle"});
  EXPECT_EQ(r.exit_code, 64) << r;
  EXPECT_NE(r.err.find("unsupported dialect 'oracle' (supported: postgresql, mysql (mariadb), sqlite)"),
            std::string::npos)
      << r;
}

// (Newer, stale, equal and malformed tokens through a whole transaction: GuardSuite.*/postgresql.)
TEST(FencePostgresql, AStaleAdmitRollsBackWritesBeforeItAndIsRejectedUnderRepeatableReadToo) {
  REQUIRE_PG(pg);
  load_schema(*pg);
  load_schema(*pg);  // loading twice is fine
  ASSERT_EQ(pg->psql("INSERT INTO fence_data VALUES ('acct', 'initial')").exit_code, 0);

  auto r = pg->psql("BEGIN; SELECT fencerun_admit('acct', 42); UPDATE fence_data SET v = 'by 42' WHERE k = 'acct'; COMMIT;");
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(query_value(*pg, "SELECT token FROM fencerun_fence WHERE resource = 'acct'"), "42");

  // Writes made before the admit in the same transaction roll back too.
  r = pg->psql("BEGIN; UPDATE fence_data SET v = 'sneaky' WHERE k = 'acct'; SELECT fencerun_admit('acct', 7); COMMIT;");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(query_value(*pg, "SELECT v FROM fence_data WHERE k = 'acct'"), "by 42");

  // A stale admit in a REPEATABLE READ transaction is rejected too.
  r = pg->psql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT fencerun_admit('acct', 40); COMMIT;");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(query_value(*pg, "SELECT token FROM fencerun_fence WHERE resource = 'acct'"), "42");
}

// Writes a line to a FIFO that a psql client reads its SQL from.
void send(int fd, const std::string& text) {
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
}

// Delayed request behind the row lock: A's transaction was started while A held the lease; its
// fencerun_admit arrives after B admitted (B holds the fence row's lock) and waits; B commits; A's
// admit then sees B's token and raises, so A's transaction rolls back. The control: the same delayed
// transaction without fencerun_admit waits for B's row lock too, then overwrites B's committed data.
TEST(FencePostgresql, DelayedTransactionBlockedBehindNewOwnerIsRejected) {
  REQUIRE_PG(pg);
  load_schema(*pg);
  Lab lab("fence-pg-delayed");
  PgKit kit(*pg, lab.lock());
  std::vector<UniqueFd> fifos;
  for (const char* name : {"a.sql", "actl.sql", "b.sql"}) {
    ASSERT_EQ(::mkfifo(lab.file(name).c_str(), 0600), 0);
    fifos.emplace_back(::open(lab.file(name).c_str(), O_RDWR | O_CLOEXEC));
    ASSERT_TRUE(fifos.back());
  }
  UniqueFd& a_sql = fifos[0];
  UniqueFd& actl_sql = fifos[1];
  UniqueFd& b_sql = fifos[2];

  SpawnOptions so;
  so.env = kit.env();
  so.cwd = lab.dir().path();
  // Each owner starts its psql clients while it holds the lease; the SQL arrives through the FIFOs.
  auto client = [](const std::string& who, const std::string& fifo) {
    return "\"$PSQL\" -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -v token=\"$FENCERUN_TOKEN\" "
           "-h \"$PGSOCK\" -p \"$PGPORT\" -U postgres -d postgres < " + fifo + " > " + who + ".out 2> " + who +
           ".err; echo $? > " + who + ".rc\n";
  };
  const std::string a_script =
      "echo \"$FENCERUN_TOKEN\" > a.token\n"
      "( " + client("a", "a.sql") + ") &\n"
      "( " + client("actl", "actl.sql") + ") &\n"
      "wait; sleep 1000\n";
  FencerunProcess a({"-r", lab.redis().url(), "-t", "300ms", lab.lock(), "--", "sh", "-c", a_script}, so);
  auto a_token = wait_for_line(lab.file("a.token"), 10s);
  ASSERT_TRUE(a_token) << a.result();
  // A starts its transactions while valid (an earlier, valid admit of A is not needed for the point).
  send(a_sql.get(), "BEGIN;\nSELECT 1;\n");
  send(actl_sql.get(), "BEGIN;\nSELECT 1;\n");
  pause_owner(a.pid());  // A's fencerun pauses: its lease runs out
  ASSERT_TRUE(lab.wait_lock_free(10s));

  const std::string b_script = "echo \"$FENCERUN_TOKEN\" > b.token\n" + client("b", "b.sql") + "sleep 1000\n";
  FencerunProcess b({"-r", lab.redis().url(), "-t", "10s", "-w", "5s", lab.lock(), "--", "sh", "-c", b_script}, so);
  auto b_token = wait_for_line(lab.file("b.token"), 10s);
  ASSERT_TRUE(b_token) << b.result();
  const std::string res = lab.lock();
  send(b_sql.get(), "BEGIN;\nSELECT fencerun_admit('" + res + "', :'token');\n"
                    "UPDATE fence_data SET v = 'b ' || :'token' WHERE k = '" + res + "';\n"
                    "UPDATE control_data SET v = 'b ' || :'token' WHERE k = '" + res + "';\n");
  // B holds the fence row's lock (and the data rows' locks) once its admit ran.
  auto locks_waiting = [&] {
    return query_value(*pg, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").value_or("0");
  };
  ASSERT_TRUE(wait_until([&] {
    return query_value(*pg, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                            "WHERE c.relname = 'control_data' AND l.mode = 'RowExclusiveLock' AND l.granted")
               .value_or("0") != "0";
  }, 10s));

  // A's delayed requests arrive now and wait behind B.
  send(a_sql.get(), "SELECT fencerun_admit('" + res + "', :'token');\n"
                    "UPDATE fence_data SET v = 'a ' || :'token' WHERE k = '" + res + "';\nCOMMIT;\n");
  send(actl_sql.get(), "UPDATE control_data SET v = 'a ' || :'token' WHERE k = '" + res + "';\nCOMMIT;\n");
  ASSERT_TRUE(wait_until([&] { return locks_waiting() == "2"; }, 10s)) << "A's clients should wait for B's locks";

  send(b_sql.get(), "COMMIT;\n");
  b_sql.reset();
  ASSERT_EQ(wait_for_line(lab.file("b.rc"), 10s), "0") << read_file(lab.file("b.err")).value_or("");
  a_sql.reset();
  actl_sql.reset();
  auto a_rc = wait_for_line(lab.file("a.rc"), 10s);
  ASSERT_TRUE(a_rc);
  EXPECT_NE(*a_rc, "0");
  const std::string a_err = read_file(lab.file("a.err")).value_or("");
  EXPECT_NE(a_err.find("ZF077"), std::string::npos) << a_err;
  EXPECT_NE(a_err.find("stale token " + *a_token + " rejected for " + res + ": it has accepted " + *b_token),
            std::string::npos)
      << a_err;
  EXPECT_EQ(kit.guarded_value(), "b " + *b_token) << "B's data must be intact";
  EXPECT_EQ(kit.recorded_token(), parse_ll(*b_token));
  ASSERT_EQ(wait_for_line(lab.file("actl.rc"), 10s), "0");
  EXPECT_EQ(kit.control_value(), "a " + *a_token) << "without the admit, A's delayed write overwrites B's";

  resume_owner(a.pid());
  EXPECT_TRUE(a.wait_for_exit(10s).has_value());
}

// The row lock orders writers: A admitted first (valid) and holds the row; B's admit waits for A's
// commit, then passes. Commit order follows token order.
TEST(FencePostgresql, RowLockSerialisesAdmittedWriters) {
  REQUIRE_PG(pg);
  load_schema(*pg);
  TempDir dir("pg-order");
  ASSERT_EQ(::mkfifo((dir / "a.sql").c_str(), 0600), 0);
  UniqueFd a_sql(::open((dir / "a.sql").c_str(), O_RDWR | O_CLOEXEC));
  SpawnOptions so;
  so.stdin_file = dir / "a.sql";
  Process a(pg->base_args({}), so);
  send(a_sql.get(), "BEGIN;\nSELECT fencerun_admit('order', 100);\n");
  ASSERT_TRUE(wait_until([&] {
    return query_value(*pg, "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
                            "AND query LIKE '%fencerun_admit(''order'', 100)%'") == "1";
  }, 10s)) << "A's admit did not run";
  Process b(pg->base_args({"-c", "SELECT fencerun_admit('order', 101)"}));
  ASSERT_TRUE(wait_until([&] {
    return query_value(*pg, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'") == "1";
  }, 10s)) << "B must wait for A's lock";
  EXPECT_TRUE(b.running());
  send(a_sql.get(), "COMMIT;\n");
  a_sql.reset();
  ASSERT_EQ(a.wait_for_exit(10s), 0) << a.result();
  ASSERT_EQ(b.wait_for_exit(10s), 0) << b.result();
  EXPECT_EQ(query_value(*pg, "SELECT token FROM fencerun_fence WHERE resource = 'order'"), "101");
}

}  // namespace
}  // namespace fencerun::test::fence
