// `fencerun fence sql sqlite` and the view fencerun_admit with its trigger: the printed schema loaded
// into a real database file, exercised from sqlite3 shell transactions (BEGIN IMMEDIATE, a busy
// timeout, -bail) with tokens from real fencerun leases. Its kit runs the guard suite
// (guard_suite_test.cpp) and its database the read-modify-write suite (sql_rmw_test.cpp); the tests
// here are the ones only this guard has.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "fence_harness.hpp"
#include "util/fd.hpp"

namespace fencerun::test::fence {
namespace {

constexpr std::string_view k_stale = "fencerun: stale token rejected: the resource has accepted a greater token";
constexpr std::string_view k_invalid = "fencerun: invalid fencing token (expected a positive integer below 2^53)";

std::string sqlite3_path() {
  static const std::string path = [] {
    for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
      std::string candidate = std::string(dir) + "/sqlite3";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return std::string();
  }();
  return path;
}

std::optional<std::string> sqlite_missing() {
  if (sqlite3_path().empty())
    return std::string("sqlite3 not found in /usr/bin or /usr/local/bin (Debian: apt-get install sqlite3): "
                       "SQLite guard tests skipped");
  return std::nullopt;
}

// A database file with the printed schema, a data and a control table, and the shell's arguments.
class SqliteDb {
 public:
  SqliteDb() {
    auto r = run_fencerun({"fence", "sql", "sqlite"});
    if (r.exit_code != 0) throw std::runtime_error("fence sql sqlite failed:\n" + r.describe());
    m_schema = r.out;
    load_schema();
  }
  const std::string& schema() const { return m_schema; }
  std::string file() const { return (m_dir / "fence.db").string(); }
  // The shell on the database: stops at the first error (closing the connection rolls back an open
  // transaction), waits up to 30 s for the lock.
  std::vector<std::string> args(std::vector<std::string> extra = {}, bool bail = true) const {
    std::vector<std::string> a = {sqlite3_path()};
    if (bail) a.emplace_back("-bail");
    a.insert(a.end(), {"-batch", "-cmd", ".timeout 30000"});
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(file());
    return a;
  }
  RunResult sql(const std::string& statements) const {
    auto a = args();
    a.push_back(statements);
    return run_program(a);
  }
  void load_schema() const {
    auto path = m_dir / "schema.sql";
    write_file(path, m_schema +
                         "CREATE TABLE IF NOT EXISTS fence_data (k TEXT PRIMARY KEY, v TEXT);\n"
                         "CREATE TABLE IF NOT EXISTS control_data (k TEXT PRIMARY KEY, v TEXT);\n"
                         "CREATE TABLE IF NOT EXISTS rmw_counter (k TEXT PRIMARY KEY, v INTEGER NOT NULL);\n");
    SpawnOptions so;
    so.stdin_file = path;
    auto r = run_program(args(), so);
    if (r.exit_code != 0) throw std::runtime_error("loading the schema failed:\n" + r.describe());
  }
  EnvList env() const { return {{"SQLITE3", sqlite3_path()}, {"SQLITE_DB", file()}}; }

 private:
  TempDir m_dir{"sqlite"};
  std::string m_schema;
};

std::string literal(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// One value (nullopt: no row, or NULL, which the shell prints as an empty line).
std::optional<std::string> query_value(const SqliteDb& db, const std::string& sql) {
  auto r = db.sql(sql);
  if (r.exit_code != 0) {
    ADD_FAILURE() << "query failed: " << sql << "\n" << r;
    return std::nullopt;
  }
  std::string v = r.out;
  if (auto eol = v.find('\n'); eol != std::string::npos) v.erase(eol);
  if (v.empty()) return std::nullopt;
  return v;
}

// The shell's error line ("Error: near line 2: stepping, fencerun: ... (19)"): its message part.
std::string guard_message(const std::string& err) {
  auto at = err.find("fencerun: ");
  if (at == std::string::npos) return trim(err);
  std::string m = err.substr(at, err.find('\n', at) - at);
  if (m.size() > 5 && m.ends_with(" (19)")) m.resize(m.size() - 5);
  return m;
}

// The SQLite guard in the common scenarios: a sqlite3 -bail run whose BEGIN IMMEDIATE transaction
// inserts the token into fencerun_admit and then updates the resource's row of fence_data; the
// control is the same update in control_data, in a run of its own. The stale message counts as 77,
// the invalid-token message as 64. On a stale token the lease owner's shell function reads the
// accepted token and names both, as docs/fencing.md shows.
class SqliteKit : public Kit {
 public:
  SqliteKit(std::string resource) : m_resource(std::move(resource)) {
    if (sqlite_missing()) return;
    m_db = std::make_unique<SqliteDb>();
    auto r = m_db->sql("INSERT OR IGNORE INTO fence_data VALUES (" + literal(m_resource) + ", NULL); " +
                       "INSERT OR IGNORE INTO control_data VALUES (" + literal(m_resource) + ", NULL);");
    if (r.exit_code != 0) throw std::runtime_error(r.describe());
  }
  std::optional<std::string> unavailable() const override { return sqlite_missing(); }
  std::string name() const override { return "sqlite"; }
  std::string guarded_body() const override {
    return "  err=$(\"$SQLITE3\" -bail -batch -cmd '.timeout 30000' \"$SQLITE_DB\" 2>&1 >/dev/null <<SQL\n"
           "BEGIN IMMEDIATE;\n"
           "INSERT INTO fencerun_admit (resource, token) VALUES ('$FENCE_RESOURCE', $FENCERUN_TOKEN);\n"
           "UPDATE fence_data SET v = '$DATA' WHERE k = '$FENCE_RESOURCE';\n"
           "COMMIT;\n"
           "SQL\n"
           ")\n"
           "  rc=$?\n"
           "  [ -n \"$err\" ] && printf '%s\\n' \"$err\" >&2\n"
           "  case \"$err\" in\n"
           "    *'fencerun: stale token'*)\n"
           // The trigger's message cannot carry the tokens: the writer names them, as documented.
           "      accepted=$(\"$SQLITE3\" -cmd '.timeout 30000' \"$SQLITE_DB\" "
           "\"SELECT token FROM fencerun_fence WHERE resource = '$FENCE_RESOURCE'\")\n"
           "      echo \"fencerun: stale token $FENCERUN_TOKEN rejected for $FENCE_RESOURCE: it has accepted $accepted\" >&2\n"
           "      return 77 ;;\n"
           "    *rror*) return 1 ;;\n"
           "  esac\n"
           "  return $rc";
  }
  std::string plain_body() const override {
    return "  \"$SQLITE3\" -bail -batch -cmd '.timeout 30000' \"$SQLITE_DB\" "
           "\"UPDATE control_data SET v = '$DATA' WHERE k = '$FENCE_RESOURCE'\"";
  }
  std::optional<std::string> guarded_value() const override {
    return query_value(*m_db, "SELECT v FROM fence_data WHERE k = " + literal(m_resource));
  }
  std::optional<std::string> control_value() const override {
    return query_value(*m_db, "SELECT v FROM control_data WHERE k = " + literal(m_resource));
  }
  std::optional<long long> recorded_token() const override {
    auto v = query_value(*m_db, "SELECT token FROM fencerun_fence WHERE resource = " + literal(m_resource));
    if (!v) return std::nullopt;
    return parse_ll(*v);
  }
  Snapshot snapshot() const override {
    const std::string k = literal(m_resource);
    auto a = m_db->args({"-separator", "\x1f", "-nullvalue", "\x1e"});
    a.push_back("SELECT (SELECT v FROM fence_data WHERE k = " + k + "), (SELECT v FROM control_data WHERE k = " + k +
                "), (SELECT token FROM fencerun_fence WHERE resource = " + k + ")");
    auto r = run_program(a);
    Snapshot s;
    std::string line = r.out.substr(0, r.out.find('\n'));
    auto p1 = line.find('\x1f');
    auto p2 = p1 == std::string::npos ? p1 : line.find('\x1f', p1 + 1);
    if (r.exit_code != 0 || p2 == std::string::npos) {
      ADD_FAILURE() << "snapshot query failed: " << r;
      return s;
    }
    auto field = [](std::string v) { return v == "\x1e" ? std::nullopt : std::optional<std::string>(v); };
    s.guarded = field(line.substr(0, p1));
    s.control = field(line.substr(p1 + 1, p2 - p1 - 1));
    if (auto t = field(line.substr(p2 + 1))) s.recorded = parse_ll(*t);
    return s;
  }
  EnvList env() const override {
    EnvList e = m_db->env();
    e.emplace_back("FENCE_RESOURCE", m_resource);
    return e;
  }

  // The token goes into the SQL as it is (none: NULL).
  std::unique_ptr<Process> start_write(const Token& token, const std::string& data) override {
    auto file = m_dir / ("write." + std::to_string(++m_writes) + ".sql");
    const std::string res = literal(m_resource);
    write_file(file, "BEGIN IMMEDIATE;\nINSERT INTO fencerun_admit (resource, token) VALUES (" + res + ", " +
                         (token.via == Token::Via::Missing ? std::string("NULL") : token.text) + ");\n"
                         "UPDATE fence_data SET v = " + literal(data) + " WHERE k = " + res + ";\nCOMMIT;\n");
    SpawnOptions so;
    so.stdin_file = file;
    return std::make_unique<Process>(m_db->args(), so);
  }
  GuardResult finish(Process& writer) const override {
    GuardResult g;
    auto code = writer.wait_for_exit(60s);
    const RunResult r = writer.result();
    g.detail = (code ? "" : "(did not finish within 60 s) ") + r.describe();
    g.message = guard_message(r.err);
    if (!code) g.code = -1;
    else if (*code == 0 && r.err.empty()) g.code = 0;
    else if (r.err.find(k_stale) != std::string::npos) g.code = 77;
    else if (r.err.find(k_invalid) != std::string::npos) g.code = 64;
    else g.code = 1;
    return g;
  }
  // SQLite 3.40's RAISE() takes a literal message only: the tokens are not in it.
  std::string stale_message(long long, long long) const override { return std::string(k_stale); }
  std::vector<Token> malformed_tokens() const override {
    return {Token::option("0"),   Token::option("-1"),   Token::missing(), Token::option("9007199254740992"),
            Token::option("1.5"), Token::option("'42'"), Token::option("x'2a'")};
  }
  unsigned rounds_seed() const override { return 20240615u; }

 private:
  std::string m_resource;
  std::unique_ptr<SqliteDb> m_db;
  TempDir m_dir{"sqlite-writes"};
  int m_writes = 0;
};

const bool g_sqlite_kit = register_kit("sqlite", [](Lab& lab) -> std::unique_ptr<Kit> {
  if (auto why = sqlite_missing()) return unavailable_kit("sqlite", *why);
  return std::make_unique<SqliteKit>(lab.lock());
});

// The database for the read-modify-write suite: sessions without -bail (they go on after an error;
// the test rolls back itself).
class SqliteRmwDb : public SqlDb {
 public:
  std::string name() const override { return "sqlite"; }
  void exec(const std::string& sql) const override {
    auto r = m_db.sql(sql);
    if (r.exit_code != 0) throw std::runtime_error("sqlite3 failed: " + sql + "\n" + r.describe());
  }
  std::optional<std::string> value(const std::string& sql) const override { return query_value(m_db, sql); }
  std::vector<std::string> client_args() const override { return m_db.args({}, false); }
  std::string echo(const std::string& marker) const override { return ".print " + marker + "\n"; }
  std::string begin() const override { return "BEGIN IMMEDIATE;\n"; }
  std::string admit(const std::string& resource, long long token) const override {
    return "INSERT INTO fencerun_admit (resource, token) VALUES (" + literal(resource) + ", " + std::to_string(token) +
           ");\n";
  }
  // BEGIN IMMEDIATE already holds the database's write lock: there is no FOR UPDATE.
  std::string read_counter(const std::string& tag, const std::string& key, bool) const override {
    return "SELECT '" + tag + "', v FROM rmw_counter WHERE k = " + literal(key) + ";\n";
  }
  bool stale(const std::string& err) const override { return err.find(k_stale) != std::string::npos; }

 private:
  SqliteDb m_db;
};

const bool g_sqlite_db = register_sql_db("sqlite", [](std::string& why) -> std::unique_ptr<SqlDb> {
  if (auto missing = sqlite_missing()) {
    why = *missing;
    return nullptr;
  }
  return std::make_unique<SqliteRmwDb>();
});

#define REQUIRE_SQLITE()                                   \
  do {                                                     \
    if (auto why_ = sqlite_missing()) GTEST_SKIP() << *why_; \
  } while (0)

TEST(FenceSqlite, PrintedSchemaIsTheInstalledFile) {
  REQUIRE_SQLITE();
  auto file = read_file(FENCE_TEST_SQLITE_FILE);
  ASSERT_TRUE(file);
  SqliteDb db;
  EXPECT_EQ(db.schema(), *file);
  EXPECT_NE(file->find("INSTEAD OF INSERT ON fencerun_admit"), std::string::npos);
  EXPECT_NE(file->find(k_stale), std::string::npos);
  EXPECT_NE(file->find(k_invalid), std::string::npos);
}

// (Newer, stale, equal and malformed tokens through a whole transaction: GuardSuite.*/sqlite.)
TEST(FenceSqlite, SchemaLoadsTwiceAndAStaleAdmitRollsBackTheTransactionsEarlierWrites) {
  REQUIRE_SQLITE();
  SqliteDb db;
  db.load_schema();  // loading twice is fine
  db.load_schema();
  ASSERT_EQ(db.sql("INSERT INTO fence_data VALUES ('acct', 'initial')").exit_code, 0);
  auto r = db.sql("BEGIN IMMEDIATE; INSERT INTO fencerun_admit VALUES ('acct', 42); "
                  "UPDATE fence_data SET v = 'by 42' WHERE k = 'acct'; COMMIT;");
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(query_value(db, "SELECT token FROM fencerun_fence WHERE resource = 'acct'"), "42");
  EXPECT_EQ(query_value(db, "SELECT count(*) FROM fencerun_admit"), "1") << "the view shows the fence rows";

  // A write before the admit in the same transaction: -bail stops at the error, and closing the
  // connection rolls the transaction back.
  r = db.sql("BEGIN IMMEDIATE; UPDATE fence_data SET v = 'sneaky' WHERE k = 'acct'; "
             "INSERT INTO fencerun_admit VALUES ('acct', 7); COMMIT;");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(guard_message(r.err), k_stale) << r;
  EXPECT_EQ(query_value(db, "SELECT v FROM fence_data WHERE k = 'acct'"), "by 42");

  // Without -bail, an explicit ROLLBACK after the error (what an application does).
  auto a = db.args({}, false);
  a.push_back("BEGIN IMMEDIATE; UPDATE fence_data SET v = 'sneaky' WHERE k = 'acct'; "
              "INSERT INTO fencerun_admit VALUES ('acct', 8); ROLLBACK;");
  r = run_program(a);
  EXPECT_NE(r.err.find(k_stale), std::string::npos) << r;
  EXPECT_EQ(query_value(db, "SELECT v FROM fence_data WHERE k = 'acct'"), "by 42");
  EXPECT_EQ(query_value(db, "SELECT token FROM fencerun_fence WHERE resource = 'acct'"), "42");

  // Equal, then greater; a text token is malformed even when it looks like a number.
  EXPECT_EQ(db.sql("INSERT INTO fencerun_admit VALUES ('acct', 42)").exit_code, 0);
  EXPECT_EQ(db.sql("INSERT INTO fencerun_admit VALUES ('acct', 43)").exit_code, 0);
  EXPECT_EQ(query_value(db, "SELECT token FROM fencerun_fence WHERE resource = 'acct'"), "43");
  r = db.sql("INSERT INTO fencerun_admit VALUES ('acct', '44')");
  EXPECT_EQ(guard_message(r.err), k_invalid) << r;
  r = db.sql("INSERT INTO fencerun_admit VALUES (NULL, 44)");
  EXPECT_EQ(guard_message(r.err), k_invalid) << r;
  EXPECT_EQ(query_value(db, "SELECT token FROM fencerun_fence WHERE resource = 'acct'"), "43");
}

// BEGIN IMMEDIATE serialises writers: while A's transaction (admitted, not committed) holds the write
// lock, B's whole transaction waits in its busy handler; once A commits, B's greater token passes.
TEST(FenceSqlite, BeginImmediateSerialisesAdmittedWriters) {
  REQUIRE_SQLITE();
  SqliteDb db;
  TempDir dir("sqlite-order");
  ASSERT_EQ(::mkfifo((dir / "a.sql").c_str(), 0600), 0);
  UniqueFd a_sql(::open((dir / "a.sql").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(a_sql);
  SpawnOptions so;
  so.stdin_file = dir / "a.sql";
  Process a(db.args(), so);
  auto send = [&](const std::string& text) {
    ASSERT_EQ(::write(a_sql.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  };
  send("BEGIN IMMEDIATE;\nINSERT INTO fencerun_admit VALUES ('order', 100);\n.print a-admitted\n");
  ASSERT_TRUE(wait_until([&] { return a.out().find("a-admitted") != std::string::npos; }, 20s)) << a.result();
  auto b_args = db.args();
  b_args.push_back("BEGIN IMMEDIATE; INSERT INTO fencerun_admit VALUES ('order', 101); COMMIT; SELECT 'b-done';");
  Process b(b_args);
  // While A holds the lock, another connection cannot write (a zero busy timeout fails at once).
  auto probe = run_program({sqlite3_path(), "-bail", db.file(), "BEGIN IMMEDIATE; ROLLBACK;"});
  EXPECT_NE(probe.exit_code, 0) << probe;
  EXPECT_NE(probe.err.find("locked"), std::string::npos) << probe;
  EXPECT_TRUE(b.out().find("b-done") == std::string::npos) << "B cannot commit while A holds the lock";
  send("COMMIT;\n");
  a_sql.reset();
  ASSERT_EQ(a.wait_for_exit(20s), 0) << a.result();
  ASSERT_EQ(b.wait_for_exit(40s), 0) << b.result();
  EXPECT_EQ(query_value(db, "SELECT token FROM fencerun_fence WHERE resource = 'order'"), "101");
}

}  // namespace
}  // namespace fencerun::test::fence
