// `fencerun fence sql mysql` and the procedure fencerun_admit(): the printed schema loaded into a real
// MariaDB (mariadb-install-db into a temp dir, mariadbd on a unix socket only, no networking),
// exercised from mariadb client transactions with tokens from real fencerun leases. Its kit runs the
// guard suite (guard_suite_test.cpp) and its database the read-modify-write suite (sql_rmw_test.cpp);
// the tests here are the ones only this guard has.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "fence_harness.hpp"
#include "util/fd.hpp"

namespace fencerun::test::fence {
namespace {

// The first of `names` that is an executable file, in /usr/sbin, /usr/bin or $PATH; empty if none.
std::string find_tool(std::initializer_list<const char*> names) {
  std::vector<std::string> dirs = {"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"};
  if (const char* path = std::getenv("PATH")) {
    std::string_view p = path;
    while (!p.empty()) {
      auto colon = p.find(':');
      dirs.emplace_back(p.substr(0, colon));
      p = colon == std::string_view::npos ? std::string_view() : p.substr(colon + 1);
    }
  }
  for (const char* name : names)
    for (const auto& dir : dirs) {
      std::string candidate = dir + "/" + name;
      if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  return {};
}

// A MariaDB server owned by the test run: its data directory, socket and logs in a temp dir, the
// server a child process of the test (killed with it), reachable on a unix socket only. As root it
// runs as root (--user=root): there is nothing to protect in a throwaway data directory.
class MyServer {
 public:
  // nullptr when the MariaDB programs are missing (`why` says which); throws when they are there but
  // the server does not start.
  static MyServer* get(std::string& why) {
    auto& server = instance();
    static std::string missing;
    if (server) return server.get();
    if (!missing.empty()) {
      why = missing;
      return nullptr;
    }
    Tools t{find_tool({"mariadbd", "mysqld"}), find_tool({"mariadb-install-db", "mysql_install_db"}),
            find_tool({"mariadb", "mysql"})};
    const char* lacking = t.server.empty() ? "mariadbd" : t.install_db.empty() ? "mariadb-install-db"
                                                    : t.client.empty()     ? "mariadb"
                                                                           : nullptr;
    if (lacking) {
      missing = std::string("MariaDB program '") + lacking +
                "' not found (Debian: apt-get install mariadb-server mariadb-client): MariaDB/MySQL guard tests "
                "skipped";
      why = missing;
      return nullptr;
    }
    server.reset(new MyServer(std::move(t)));
    return server.get();
  }
  static void shutdown() { instance().reset(); }

  std::string socket() const { return (m_dir.path() / "sock").string(); }
  const std::string& client() const { return m_tools.client; }

  // The client on database `fence`, batch mode without column names: rows tab-separated, NULL as
  // "NULL"; it stops at the first error.
  std::vector<std::string> base_args(std::vector<std::string> extra, bool database = true) const {
    std::vector<std::string> a = {m_tools.client, "--no-defaults", "-S", socket(), "-u", "root", "-N", "-B"};
    a.insert(a.end(), extra.begin(), extra.end());
    if (database) a.emplace_back("fence");
    return a;
  }
  RunResult sql(const std::string& statements, Clock::duration timeout = 30s) const {
    return run_program(base_args({"-e", statements}), {}, timeout);
  }
  EnvList env() const { return {{"MARIADB", m_tools.client}, {"MYSOCK", socket()}}; }
  std::string log() const { return read_file(m_dir / "error.log").value_or("(no log)"); }

  ~MyServer() { stop(); }

 private:
  struct Tools {
    std::string server, install_db, client;
  };
  static std::unique_ptr<MyServer>& instance() {
    static std::unique_ptr<MyServer> server;
    return server;
  }

  explicit MyServer(Tools tools) : m_tools(std::move(tools)) {
    const bool root = ::geteuid() == 0;
    const std::string data = (m_dir.path() / "data").string();
    // A temp directory of its own: the server's temporary tables must not share /tmp with the rest of
    // the suite (a bootstrap once failed there deleting its own temp table).
    const std::string tmp = (m_dir.path() / "tmp").string();
    std::filesystem::create_directories(tmp);
    std::vector<std::string> install = {m_tools.install_db, "--no-defaults", "--datadir=" + data,
                                        "--tmpdir=" + tmp, "--auth-root-authentication-method=normal",
                                        "--skip-test-db"};
    if (root) install.emplace_back("--user=root");
    SpawnOptions so;
    so.cwd = m_dir.path();
    auto r = run_program(install, so, 120s);
    if (r.exit_code != 0) throw std::runtime_error("mariadb-install-db failed:\n" + r.describe());

    std::vector<std::string> argv = {m_tools.server,
                                     "--no-defaults",
                                     "--datadir=" + data,
                                     "--tmpdir=" + tmp,
                                     "--socket=" + socket(),
                                     "--skip-networking",
                                     "--pid-file=" + (m_dir.path() / "pid").string(),
                                     "--log-error=" + (m_dir.path() / "error.log").string(),
                                     "--innodb-flush-log-at-trx-commit=0",
                                     "--innodb-buffer-pool-size=64M",
                                     "--skip-log-bin",
                                     "--max-connections=200",
                                     "--innodb-lock-wait-timeout=60"};
    if (root) argv.emplace_back("--user=root");
    m_proc = std::make_unique<Process>(argv, so);
    bool up = wait_until([&] {
      return !m_proc->running() || run_program(base_args({"-e", "SELECT 1"}, false), {}, 10s).exit_code == 0;
    }, 60s, 50ms);
    if (!up || !m_proc->running()) {
      std::string why = "mariadbd did not start; log:\n" + log() + "\n" + m_proc->result().describe();
      stop();
      throw std::runtime_error(why);
    }
    r = run_program(base_args({"-e", "CREATE DATABASE IF NOT EXISTS fence"}, false));
    if (r.exit_code != 0) throw std::runtime_error("CREATE DATABASE failed:\n" + r.describe());
  }

  void stop() {
    if (!m_proc) return;
    if (m_proc->running()) {
      m_proc->signal(SIGTERM);
      if (!m_proc->wait_for_exit(20s)) m_proc->kill_and_reap();
    }
    m_proc.reset();
  }

  Tools m_tools;
  TempDir m_dir{"mariadb"};
  std::unique_ptr<Process> m_proc;
};

#define REQUIRE_MY(var)                     \
  std::string why_##var;                    \
  MyServer* var = MyServer::get(why_##var); \
  if (!var) GTEST_SKIP() << why_##var

std::string schema_text() {
  auto r = run_fencerun({"fence", "sql", "mysql"});
  if (r.exit_code != 0) throw std::runtime_error("fence sql mysql failed:\n" + r.describe());
  return r.out;
}

// Loads the printed schema (idempotent) and a data and a control table.
void load_schema(const MyServer& my) {
  TempDir dir("my-schema");
  auto file = dir / "schema.sql";
  write_file(file, schema_text() +
                       "CREATE TABLE IF NOT EXISTS fence_data (k VARCHAR(255) PRIMARY KEY, v LONGTEXT) ENGINE = InnoDB;\n"
                       "CREATE TABLE IF NOT EXISTS control_data (k VARCHAR(255) PRIMARY KEY, v LONGTEXT) ENGINE = InnoDB;\n");
  SpawnOptions so;
  so.stdin_file = file;
  auto r = run_program(my.base_args({}), so);
  if (r.exit_code != 0) throw std::runtime_error("loading the schema failed:\n" + r.describe());
}

std::string literal(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'' || c == '\\') out += c;
    out += c;
  }
  return out + "'";
}

// One value from the client's batch output (nullopt: no row or NULL).
std::optional<std::string> query_value(const MyServer& my, const std::string& sql) {
  auto r = my.sql(sql);
  if (r.exit_code != 0) {
    ADD_FAILURE() << "query failed: " << sql << "\n" << r;
    return std::nullopt;
  }
  std::string v = r.out;
  if (!v.empty() && v.back() == '\n') v.pop_back();
  if (auto eol = v.find('\n'); eol != std::string::npos) v.erase(eol);
  if (v.empty() || v == "NULL") return std::nullopt;
  return v;
}

// The error line of the client ("ERROR 1644 (45077) at line 2: fencerun: ..."): its message part.
std::string guard_message(const std::string& err) {
  if (auto at = err.find("fencerun: "); at != std::string::npos) return err.substr(at, err.find('\n', at) - at);
  return trim(err);
}

// The MariaDB guard in the common scenarios: a client run whose transaction calls fencerun_admit and
// then updates the resource's row of fence_data (the client stops at the first error, so a rejected
// transaction never commits); the control is the same update in control_data, without the admit, in a
// client run of its own. SQLSTATE 45077 (stale) counts as 77, 22023 (malformed token) as 64.
class MysqlKit : public Kit {
 public:
  MysqlKit(const MyServer& my, std::string resource) : m_my(my), m_resource(std::move(resource)) {
    auto r = my.sql("INSERT IGNORE INTO fence_data VALUES (" + literal(m_resource) + ", NULL); " +
                    "INSERT IGNORE INTO control_data VALUES (" + literal(m_resource) + ", NULL);");
    if (r.exit_code != 0) throw std::runtime_error(r.describe());
  }
  std::string name() const override { return "mysql"; }
  std::string guarded_body() const override {
    return "  err=$(\"$MARIADB\" --no-defaults -S \"$MYSOCK\" -u root fence 2>&1 >/dev/null <<SQL\n"
           "START TRANSACTION;\n"
           "CALL fencerun_admit('$FENCE_RESOURCE', $FENCERUN_TOKEN);\n"
           "UPDATE fence_data SET v = '$DATA' WHERE k = '$FENCE_RESOURCE';\n"
           "COMMIT;\n"
           "SQL\n"
           ")\n"
           "  rc=$?\n"
           "  [ -n \"$err\" ] && printf '%s\\n' \"$err\" >&2\n"
           "  case \"$err\" in *'(45077)'*) return 77 ;; *ERROR*) return 1 ;; esac\n"
           "  return $rc";
  }
  std::string plain_body() const override {
    return "  \"$MARIADB\" --no-defaults -S \"$MYSOCK\" -u root fence "
           "-e \"UPDATE control_data SET v = '$DATA' WHERE k = '$FENCE_RESOURCE'\"";
  }
  std::optional<std::string> guarded_value() const override {
    return query_value(m_my, "SELECT v FROM fence_data WHERE k = " + literal(m_resource));
  }
  std::optional<std::string> control_value() const override {
    return query_value(m_my, "SELECT v FROM control_data WHERE k = " + literal(m_resource));
  }
  std::optional<long long> recorded_token() const override {
    auto v = query_value(m_my, "SELECT token FROM fencerun_fence WHERE resource = " + literal(m_resource));
    if (!v) return std::nullopt;
    return parse_ll(*v);
  }
  Snapshot snapshot() const override {
    const std::string k = literal(m_resource);
    auto r = m_my.sql("SELECT (SELECT v FROM fence_data WHERE k = " + k + "), (SELECT v FROM control_data WHERE k = " +
                      k + "), (SELECT token FROM fencerun_fence WHERE resource = " + k + ")");
    Snapshot s;
    std::string line = r.out.substr(0, r.out.find('\n'));
    auto p1 = line.find('\t');
    auto p2 = p1 == std::string::npos ? p1 : line.find('\t', p1 + 1);
    if (r.exit_code != 0 || p2 == std::string::npos) {
      ADD_FAILURE() << "snapshot query failed: " << r;
      return s;
    }
    auto field = [](std::string v) { return v == "NULL" ? std::nullopt : std::optional<std::string>(v); };
    s.guarded = field(line.substr(0, p1));
    s.control = field(line.substr(p1 + 1, p2 - p1 - 1));
    if (auto t = field(line.substr(p2 + 1))) s.recorded = parse_ll(*t);
    return s;
  }
  EnvList env() const override {
    EnvList e = m_my.env();
    e.emplace_back("FENCE_RESOURCE", m_resource);
    return e;
  }

  // The token goes into the SQL as it is (none: NULL).
  std::unique_ptr<Process> start_write(const Token& token, const std::string& data) override {
    auto file = m_dir / ("write." + std::to_string(++m_writes) + ".sql");
    const std::string res = literal(m_resource);
    write_file(file, "START TRANSACTION;\nCALL fencerun_admit(" + res + ", " +
                         (token.via == Token::Via::Missing ? std::string("NULL") : token.text) + ");\n"
                         "UPDATE fence_data SET v = " + literal(data) + " WHERE k = " + res + ";\nCOMMIT;\n");
    SpawnOptions so;
    so.stdin_file = file;
    return std::make_unique<Process>(m_my.base_args({}), so);
  }
  GuardResult finish(Process& writer) const override {
    GuardResult g;
    auto code = writer.wait_for_exit(30s);
    const RunResult r = writer.result();
    g.detail = (code ? "" : "(did not finish within 30 s) ") + r.describe();
    g.message = guard_message(r.err);
    if (!code) g.code = -1;
    else if (*code == 0) g.code = 0;
    else if (r.err.find("(45077)") != std::string::npos) g.code = 77;
    else if (r.err.find("(22023)") != std::string::npos) g.code = 64;
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
  void describe_on_failure() const override { std::cerr << "mariadbd log:\n" << m_my.log() << "\n"; }
  unsigned rounds_seed() const override { return 20240614u; }

 private:
  const MyServer& m_my;
  std::string m_resource;
  TempDir m_dir{"my-writes"};
  int m_writes = 0;
};

const bool g_my_kit = register_kit("mysql", [](Lab& lab) -> std::unique_ptr<Kit> {
  std::string why;
  MyServer* my = MyServer::get(why);
  if (!my) return unavailable_kit("mysql", why);
  load_schema(*my);
  return std::make_unique<MysqlKit>(*my, lab.lock());
});

// The database for the read-modify-write suite: clients with --force (they go on after an error;
// the test rolls back itself).
class MyDb : public SqlDb {
 public:
  explicit MyDb(const MyServer& my) : m_my(my) {
    load_schema(my);
    exec("CREATE TABLE IF NOT EXISTS rmw_counter (k VARCHAR(255) PRIMARY KEY, v BIGINT NOT NULL) ENGINE = InnoDB");
  }
  std::string name() const override { return "mysql"; }
  void exec(const std::string& sql) const override {
    auto r = m_my.sql(sql);
    if (r.exit_code != 0) throw std::runtime_error("mariadb failed: " + sql + "\n" + r.describe());
  }
  std::optional<std::string> value(const std::string& sql) const override { return query_value(m_my, sql); }
  std::vector<std::string> client_args() const override { return m_my.base_args({"--force", "-n"}); }
  std::string echo(const std::string& marker) const override { return "SELECT '" + marker + "';\n"; }
  std::string begin() const override { return "START TRANSACTION;\n"; }
  std::string admit(const std::string& resource, long long token) const override {
    return "CALL fencerun_admit(" + literal(resource) + ", " + std::to_string(token) + ");\n";
  }
  std::string read_counter(const std::string& tag, const std::string& key, bool locking) const override {
    return "SELECT '" + tag + "', v FROM rmw_counter WHERE k = " + literal(key) + (locking ? " FOR UPDATE" : "") +
           ";\n";
  }
  bool stale(const std::string& err) const override { return err.find("(45077)") != std::string::npos; }
  std::optional<int> lock_waiters() const override {
    auto v = value("SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'");
    return v ? static_cast<int>(parse_ll(*v).value_or(0)) : 0;
  }

 private:
  const MyServer& m_my;
};

const bool g_my_db = register_sql_db("mysql", [](std::string& why) -> std::unique_ptr<SqlDb> {
  MyServer* my = MyServer::get(why);
  if (!my) return nullptr;
  return std::make_unique<MyDb>(*my);
});

class MyEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { MyServer::shutdown(); }
};
const auto* const g_my_environment = ::testing::AddGlobalTestEnvironment(new MyEnvironment);

TEST(FenceMysql, PrintedSchemaIsTheInstalledFileAndMariadbIsASynonym) {
  auto file = read_file(FENCE_TEST_MYSQL_FILE);
  ASSERT_TRUE(file);
  EXPECT_EQ(schema_text(), *file);
  auto r = run_fencerun({"fence", "sql", "mariadb"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, *file);
  EXPECT_NE(file->find("PROCEDURE fencerun_admit(IN p_resource VARCHAR(255), IN p_token BIGINT)"), std::string::npos);
  EXPECT_NE(file->find("SIGNAL SQLSTATE '45077'"), std::string::npos);
  EXPECT_NE(file->find("SIGNAL SQLSTATE '22023'"), std::string::npos);
  EXPECT_NE(file->find("FOR UPDATE"), std::string::npos);
}

// (Newer, stale, equal and malformed tokens through a whole transaction: GuardSuite.*/mysql.)
TEST(FenceMysql, SchemaLoadsTwiceAndAStaleAdmitRollsBackTheTransactionsEarlierWrites) {
  REQUIRE_MY(my);
  load_schema(*my);
  load_schema(*my);  // loading twice is fine
  ASSERT_EQ(my->sql("INSERT INTO fence_data VALUES ('acct', 'initial')").exit_code, 0);
  auto r = my->sql("START TRANSACTION; CALL fencerun_admit('acct', 42); "
                   "UPDATE fence_data SET v = 'by 42' WHERE k = 'acct'; COMMIT;");
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(query_value(*my, "SELECT token FROM fencerun_fence WHERE resource = 'acct'"), "42");

  // A write before the admit in the same transaction: the client stops at the error, and its
  // disconnect rolls the open transaction back.
  r = my->sql("START TRANSACTION; UPDATE fence_data SET v = 'sneaky' WHERE k = 'acct'; "
              "CALL fencerun_admit('acct', 7); COMMIT;");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("ERROR 1644 (45077)"), std::string::npos) << r;
  EXPECT_NE(r.err.find("fencerun: stale token 7 rejected for acct: it has accepted 42"), std::string::npos) << r;
  EXPECT_EQ(query_value(*my, "SELECT v FROM fence_data WHERE k = 'acct'"), "by 42");

  // An explicit ROLLBACK after the error (what an application does) in one session.
  r = run_program(my->base_args({"--force", "-e",
                                 "START TRANSACTION; UPDATE fence_data SET v = 'sneaky' WHERE k = 'acct'; "
                                 "CALL fencerun_admit('acct', 9); ROLLBACK;"}));
  EXPECT_NE(r.err.find("(45077)"), std::string::npos) << r;
  EXPECT_EQ(query_value(*my, "SELECT v FROM fence_data WHERE k = 'acct'"), "by 42");

  // Rejected under every isolation level; the recorded token is untouched.
  for (const char* level : {"READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"}) {
    SCOPED_TRACE(level);
    r = my->sql(std::string("SET SESSION TRANSACTION ISOLATION LEVEL ") + level +
                "; START TRANSACTION; CALL fencerun_admit('acct', 40); COMMIT;");
    EXPECT_NE(r.err.find("(45077)"), std::string::npos) << r;
  }
  EXPECT_EQ(query_value(*my, "SELECT token FROM fencerun_fence WHERE resource = 'acct'"), "42");
  // Equal, then greater.
  EXPECT_EQ(my->sql("CALL fencerun_admit('acct', 42)").exit_code, 0);
  EXPECT_EQ(my->sql("CALL fencerun_admit('acct', 43)").exit_code, 0);
  EXPECT_EQ(query_value(*my, "SELECT token FROM fencerun_fence WHERE resource = 'acct'"), "43");
  // A malformed token names itself.
  r = my->sql("CALL fencerun_admit('acct', 0)");
  EXPECT_NE(r.err.find("ERROR 1644 (22023)"), std::string::npos) << r;
  EXPECT_NE(r.err.find("fencerun: invalid fencing token 0 for acct (expected a positive integer below 2^53)"),
            std::string::npos)
      << r;
}

// The row lock orders writers: A admitted first and holds the fence row; B's admit waits (seen in
// INNODB_TRX) until A commits, then passes.
TEST(FenceMysql, RowLockSerialisesAdmittedWriters) {
  REQUIRE_MY(my);
  load_schema(*my);
  TempDir dir("my-order");
  ASSERT_EQ(::mkfifo((dir / "a.sql").c_str(), 0600), 0);
  UniqueFd a_sql(::open((dir / "a.sql").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(a_sql);
  SpawnOptions so;
  so.stdin_file = dir / "a.sql";
  Process a(my->base_args({"-n"}), so);
  auto send = [&](const std::string& text) {
    ASSERT_EQ(::write(a_sql.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  };
  send("START TRANSACTION;\nCALL fencerun_admit('order', 100);\nSELECT 'a-admitted';\n");
  ASSERT_TRUE(wait_until([&] { return a.out().find("a-admitted") != std::string::npos; }, 20s)) << a.result();
  Process b(my->base_args({"-e", "CALL fencerun_admit('order', 101)"}));
  ASSERT_TRUE(wait_until([&] {
    return query_value(*my, "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'") ==
           "1";
  }, 20s, 20ms)) << "B must wait for A's lock";
  EXPECT_TRUE(b.running());
  send("COMMIT;\n");
  a_sql.reset();
  ASSERT_EQ(a.wait_for_exit(20s), 0) << a.result();
  ASSERT_EQ(b.wait_for_exit(20s), 0) << b.result();
  EXPECT_EQ(query_value(*my, "SELECT token FROM fencerun_fence WHERE resource = 'order'"), "101");
}

// Many first writers of a new resource at once: the insert-if-missing never fails with a duplicate
// key or a deadlock; the greatest token is recorded.
TEST(FenceMysql, ConcurrentFirstAdmitsOfANewResourceNeitherFailNorDeadlock) {
  REQUIRE_MY(my);
  load_schema(*my);
  std::vector<std::unique_ptr<Process>> writers;
  for (int i = 1; i <= 16; ++i)
    writers.push_back(std::make_unique<Process>(
        my->base_args({"-e", "START TRANSACTION; CALL fencerun_admit('fresh', " + std::to_string(1000 + i) +
                                 "); COMMIT;"})));
  int accepted = 0, stale = 0;
  for (auto& w : writers) {
    auto code = w->wait_for_exit(30s);
    ASSERT_TRUE(code);
    const auto err = w->err();
    if (*code == 0) ++accepted;
    else if (err.find("(45077)") != std::string::npos) ++stale;
    else ADD_FAILURE() << w->result();
  }
  EXPECT_EQ(accepted + stale, 16);
  EXPECT_GE(accepted, 1);
  EXPECT_EQ(query_value(*my, "SELECT token FROM fencerun_fence WHERE resource = 'fresh'"), "1016");
}

}  // namespace
}  // namespace fencerun::test::fence
