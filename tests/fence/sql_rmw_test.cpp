// Read-modify-write through the SQL guards (postgresql, mysql, sqlite: each guard's file registers
// its database with register_sql_db). A counter row; two owners with tokens t1 < t2, each a client
// session of its own, interleaved as A reads, B reads, A writes, B writes, where a write stores the
// value it read plus one, in a transaction of its own:
//
//   (a) no guard at all: an update is lost;
//   (b) write-only fencing, the admit in the write's transaction and the read outside it: both writes
//       are accepted (t1 then t2 is the order the guard allows) and an update is still lost - the
//       hazard of fencing the write only;
//   (c) fenced read: the admit and the read (SELECT ... FOR UPDATE, or BEGIN IMMEDIATE) in the write's
//       transaction, the lock held to the commit: B's read waits for A's commit, or, when B went
//       first, A's admit waits for B's commit and is rejected as stale. No update is lost.
//
// Tests are named SqlRmw.<Sentence>/<database>. Every wait polls with a deadline; the assertions are
// on counts (accepted increments, the final counter, stale rejections), never on timings.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <iostream>

#include "fence_harness.hpp"
#include "util/fd.hpp"

namespace fencerun::test::fence {
namespace {

// One client session reading its statements from a FIFO. Each batch of statements is followed by a
// marker line, so the test knows when the batch has run (and that it still waits while it has not).
class Session {
 public:
  Session(const SqlDb& db, std::string label, const TempDir& dir) : m_db(db), m_label(std::move(label)) {
    auto fifo = dir / (m_label + ".in");
    if (::mkfifo(fifo.c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed");
    m_in.reset(::open(fifo.c_str(), O_RDWR | O_CLOEXEC));
    if (!m_in) throw std::runtime_error("open of the FIFO failed");
    SpawnOptions so;
    so.stdin_file = fifo;
    m_proc = std::make_unique<Process>(db.client_args(), so);
  }
  ~Session() {
    m_in.reset();  // end of input: the client exits, rolling back what is still open
    if (m_proc && !m_proc->wait_for_exit(10s)) m_proc->kill_and_reap();
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Sends `statements` and the batch's marker; returns the batch's number.
  int send(const std::string& statements) {
    ++m_batches;
    m_err_from = m_proc->err().size();
    std::string text = statements + m_db.echo(marker(m_batches));
    if (::write(m_in.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      throw std::runtime_error("write to the session failed");
    return m_batches;
  }
  bool done(int batch) const { return ("\n" + m_proc->out()).find("\n" + marker(batch) + "\n") != std::string::npos; }
  // Waits (30 s at most) until the last batch has run.
  bool wait() const {
    return wait_until([&] { return done(m_batches) || !m_proc->running(); }, 30s, 5ms) && done(m_batches);
  }
  // What the client said on stderr since the last batch was sent.
  std::string errors() const { return m_proc->err().substr(std::min(m_err_from, m_proc->err().size())); }
  // The value of the counter line "<tag><sep><v>" (nullopt: not printed).
  std::optional<long long> counter(const std::string& tag) const {
    for (const auto& line : split_lines(m_proc->out())) {
      if (!line.starts_with(tag) || line.size() <= tag.size() || std::isalnum(static_cast<unsigned char>(line[tag.size()])))
        continue;
      return parse_ll(trim(line.substr(tag.size() + 1)));
    }
    return std::nullopt;
  }
  std::string describe() const { return m_label + ": " + m_proc->result().describe(); }

 private:
  std::string marker(int batch) const { return "__" + m_label + "_batch_" + std::to_string(batch) + "__"; }

  const SqlDb& m_db;
  std::string m_label;
  UniqueFd m_in;
  std::unique_ptr<Process> m_proc;
  int m_batches = 0;
  std::size_t m_err_from = 0;
};

enum class Mode { Control, WriteOnly, FencedRead };

struct RmwStats {
  int rounds = 0;
  int increments = 0;  // read-modify-writes attempted
  int accepted = 0;    // ... that committed
  int stale = 0;       // ... rejected as stale
  int lost = 0;        // accepted increments missing from the counter
  std::string report(const std::string& db, const std::string& mode) const {
    return "sql rmw " + db + " " + mode + ": " + std::to_string(rounds) + " rounds, " + std::to_string(increments) +
           " increments, " + std::to_string(accepted) + " accepted, " + std::to_string(stale) + " stale, " +
           std::to_string(lost) + " lost updates";
  }
};

class SqlRmw : public ::testing::TestWithParam<SqlDbEntry> {
 protected:
  void SetUp() override {
    std::string why;
    m_db = GetParam().make(why);
    if (!m_db) GTEST_SKIP() << why;
    std::string n = std::string("rmw-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : n)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '-';
    m_resource = n;
    db().exec("DELETE FROM fencerun_fence WHERE resource = '" + m_resource + "'");
  }

  SqlDb& db() { return *m_db; }

  // One owner's read-modify-write, step by step.
  struct Owner {
    Session& session;
    long long token;
    std::string tag;
    bool stale = false;
    std::optional<long long> read;
  };

  // The read: in FencedRead mode it opens the transaction, admits the token and reads with the lock;
  // otherwise a plain read on its own. Does not wait (a fenced read may block).
  void start_read(Owner& o, Mode mode, const std::string& key) {
    if (mode == Mode::FencedRead)
      o.session.send(db().begin() + db().admit(m_resource, o.token) + db().read_counter(o.tag, key, true));
    else
      o.session.send(db().read_counter(o.tag, key, false));
  }
  void finish_read(Owner& o, Mode mode) {
    ASSERT_TRUE(o.session.wait()) << "the read did not finish: " << o.session.describe();
    const std::string err = o.session.errors();
    if (mode == Mode::FencedRead && db().stale(err)) {
      o.stale = true;  // the owner's lease is gone: it stops, rolling back
      o.session.send("ROLLBACK;\n");
      ASSERT_TRUE(o.session.wait()) << o.session.describe();
      return;
    }
    ASSERT_EQ(err, "") << o.session.describe();
    o.read = o.session.counter(o.tag);
    ASSERT_TRUE(o.read) << "no counter value: " << o.session.describe();
  }
  // The write of read + 1 and the commit; WriteOnly admits first in a transaction of its own (and
  // rolls back when stale), Control has no admit.
  void write(Owner& o, Mode mode, const std::string& key, RmwStats& s) {
    ++s.increments;
    if (o.stale) {
      ++s.stale;
      return;
    }
    if (mode != Mode::FencedRead) {
      o.session.send(db().begin() + (mode == Mode::WriteOnly ? db().admit(m_resource, o.token) : std::string()));
      ASSERT_TRUE(o.session.wait()) << o.session.describe();
      const std::string err = o.session.errors();
      if (db().stale(err)) {
        ++s.stale;
        o.session.send("ROLLBACK;\n");
        ASSERT_TRUE(o.session.wait()) << o.session.describe();
        return;
      }
      ASSERT_EQ(err, "") << o.session.describe();
    }
    o.session.send("UPDATE rmw_counter SET v = " + std::to_string(*o.read + 1) + " WHERE k = '" + key + "';\nCOMMIT;\n");
    ASSERT_TRUE(o.session.wait()) << o.session.describe();
    ASSERT_EQ(o.session.errors(), "") << o.session.describe();
    ++s.accepted;
  }
  // Waits until some session waits for a lock, where the database shows it.
  void expect_lock_wait() {
    if (!db().lock_waiters()) return;
    EXPECT_TRUE(wait_until([&] { return db().lock_waiters().value_or(0) >= 1; }, 20s, 10ms))
        << "the second owner should wait for the first one's lock";
  }

  // `rounds` rounds of two owners, A (t1) and B (t2 > t1), fresh tokens each round. `b_first`: B
  // reads first (FencedRead only: then A's admit waits for B and is stale).
  RmwStats run(Mode mode, int rounds, bool b_first = false) {
    RmwStats s;
    TempDir dir("rmw");
    Session sa(db(), "a", dir), sb(db(), "b", dir);
    for (int r = 0; r < rounds; ++r) {
      const std::string key = m_resource + "-" + std::to_string(r) + (b_first ? "-ba" : "-ab");
      db().exec("DELETE FROM rmw_counter WHERE k = '" + key + "'");
      db().exec("INSERT INTO rmw_counter (k, v) VALUES ('" + key + "', 0)");
      const long long t1 = 1000 + 2 * r;
      Owner a{sa, t1, "a" + std::to_string(r) + "x", false, std::nullopt};
      Owner b{sb, t1 + 1, "b" + std::to_string(r) + "x", false, std::nullopt};
      Owner& first = b_first ? b : a;
      Owner& second = b_first ? a : b;
      const int before = s.accepted;

      start_read(first, mode, key);
      finish_read(first, mode);
      if (::testing::Test::HasFatalFailure()) return s;
      start_read(second, mode, key);
      if (mode == Mode::FencedRead) {
        // The second read waits behind the first owner's lock until that one commits.
        expect_lock_wait();
        write(first, mode, key, s);
        if (::testing::Test::HasFatalFailure()) return s;
        finish_read(second, mode);
      } else {
        finish_read(second, mode);
        if (::testing::Test::HasFatalFailure()) return s;
        write(first, mode, key, s);
      }
      if (::testing::Test::HasFatalFailure()) return s;
      write(second, mode, key, s);
      if (::testing::Test::HasFatalFailure()) return s;

      auto v = db().value("SELECT v FROM rmw_counter WHERE k = '" + key + "'");
      EXPECT_TRUE(v);
      const long long final_value = v ? parse_ll(*v).value_or(-1) : -1;
      s.lost += (s.accepted - before) - static_cast<int>(final_value);
      ++s.rounds;
    }
    return s;
  }

  void record(const RmwStats& s, const std::string& mode) {
    std::cout << s.report(GetParam().name, mode) << std::endl;
    RecordProperty("rounds", s.rounds);
    RecordProperty("accepted", s.accepted);
    RecordProperty("stale", s.stale);
    RecordProperty("lost", s.lost);
  }

  std::unique_ptr<SqlDb> m_db;
  std::string m_resource;
};

constexpr int k_rounds = 5;

TEST_P(SqlRmw, WithoutTheGuardAnUpdateIsLost) {
  RmwStats s = run(Mode::Control, k_rounds);
  record(s, "control");
  EXPECT_EQ(s.rounds, k_rounds);
  EXPECT_EQ(s.accepted, 2 * k_rounds);
  EXPECT_EQ(s.lost, k_rounds) << "each round's counter ends at 1 after two increments";
}

// The hazard: fencing the write alone does not protect a value read outside the fenced transaction.
TEST_P(SqlRmw, WriteOnlyFencingAcceptsBothWritesAndStillLosesAnUpdate) {
  RmwStats s = run(Mode::WriteOnly, k_rounds);
  record(s, "write-only");
  EXPECT_EQ(s.rounds, k_rounds);
  EXPECT_EQ(s.accepted, 2 * k_rounds) << "t1 then t2: the guard accepts both";
  EXPECT_EQ(s.stale, 0);
  EXPECT_EQ(s.lost, k_rounds);
}

// A reads first: B's fenced read waits for A's commit, then reads A's increment; both accepted.
TEST_P(SqlRmw, FencedReadMakesTheNewerOwnerWaitAndLosesNoUpdate) {
  RmwStats s = run(Mode::FencedRead, k_rounds);
  record(s, "fenced-read (A first)");
  EXPECT_EQ(s.rounds, k_rounds);
  EXPECT_EQ(s.accepted, 2 * k_rounds);
  EXPECT_EQ(s.stale, 0);
  EXPECT_EQ(s.lost, 0);
}

// B reads first: A's fenced read waits for B's commit, and A's admit is then rejected as stale, so A
// writes nothing; the counter holds B's increment only.
TEST_P(SqlRmw, FencedReadRejectsTheOlderOwnerBehindTheNewerAndLosesNoUpdate) {
  RmwStats s = run(Mode::FencedRead, k_rounds, true);
  record(s, "fenced-read (B first)");
  EXPECT_EQ(s.rounds, k_rounds);
  EXPECT_EQ(s.accepted, k_rounds);
  EXPECT_EQ(s.stale, k_rounds);
  EXPECT_EQ(s.lost, 0);
}

INSTANTIATE_TEST_SUITE_P(, SqlRmw, ::testing::ValuesIn(registered_sql_dbs()),
                         [](const ::testing::TestParamInfo<SqlDbEntry>& db) { return db.param.name; });

}  // namespace
}  // namespace fencerun::test::fence
