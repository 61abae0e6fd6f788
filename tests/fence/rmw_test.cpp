// Read-modify-write under fencing: K workers x R rounds of "read the counter, add one, write it back",
// each increment under its own real lease (fencerun --ttl, so its token is fresh), and the steps of
// the workers interleaved at random, as when a holder is paused past its lease between its read and
// its write. Run once with only the write fenced and once with the read fenced too
// (`fence file --read`, `fence redis -- GET`, the SQL guards' admit committed before the read).
// Asserted: no write with a token older than one the
// resource had already admitted is ever accepted (both modes); with write-only fencing updates are
// lost (the hazard); with fenced reads none is: the counter equals the accepted increments.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fence_harness.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"

namespace fencerun::test::fence {
namespace {

constexpr int k_stale = 77;

// The counter and its guard. A read returns the value (0 before the first write) or nullopt when the
// guard rejected it as stale.
class Counter {
 public:
  virtual ~Counter() = default;
  virtual std::optional<long long> read(long long token, bool fenced) = 0;
  virtual int write(long long token, long long value) = 0;  // the guard's exit code
  virtual long long value() = 0;                           // the final value, read directly
};

long long to_number(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  // fence redis prints a string reply quoted, as redis-cli does.
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"') text = text.substr(1, text.size() - 2);
  if (text.empty() || text == "(nil)") return 0;
  return std::stoll(text);
}

class FileCounter final : public Counter {
 public:
  explicit FileCounter(std::filesystem::path path) : m_path(std::move(path)) {}
  std::optional<long long> read(long long token, bool fenced) override {
    if (!fenced) {
      std::ifstream in(m_path);
      std::string line;
      std::getline(in, line);
      return to_number(line);
    }
    auto r = run_fencerun({"fence", "file", "--read", "--token", std::to_string(token), m_path.string()});
    if (r.exit_code == k_stale) return std::nullopt;
    EXPECT_EQ(r.exit_code, 0) << r;
    return to_number(r.out);
  }
  int write(long long token, long long value) override {
    auto r = run_program({"sh", "-c", "echo \"$1\" | \"$0\" fence file --token \"$2\" \"$3\"", fencerun_binary(),
                          std::to_string(value), std::to_string(token), m_path.string()});
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == k_stale) << r;
    return r.exit_code;
  }
  long long value() override { return read(0, false).value_or(-1); }

 private:
  std::filesystem::path m_path;
};

class RedisCounter final : public Counter {
 public:
  explicit RedisCounter(RedisServer& redis) : m_redis(redis) {}
  std::optional<long long> read(long long token, bool fenced) override {
    if (!fenced) return to_number(m_redis.get("{counter}:value").value_or(""));
    auto r = guard(token, {"GET", "{counter}:value"});
    if (r.exit_code == k_stale) return std::nullopt;
    EXPECT_EQ(r.exit_code, 0) << r;
    return to_number(r.out);
  }
  int write(long long token, long long value) override {
    auto r = guard(token, {"SET", "{counter}:value", std::to_string(value)});
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == k_stale) << r;
    return r.exit_code;
  }
  long long value() override { return to_number(m_redis.get("{counter}:value").value_or("")); }

 private:
  RunResult guard(long long token, std::vector<std::string> cmd) {
    std::vector<std::string> args = {"fence", "redis", "-r", m_redis.url(), "--token", std::to_string(token),
                                     "--resource", "counter", "--"};
    args.insert(args.end(), cmd.begin(), cmd.end());
    return run_fencerun(args);
  }
  RedisServer& m_redis;
};

// A counter row through a SQL guard (the databases the SQL kits register). A fenced read commits the
// admission of its token before it reads (so an older owner's later write is rejected); a write admits
// its token in the write's own transaction.
class SqlCounter final : public Counter {
 public:
  explicit SqlCounter(std::unique_ptr<SqlDb> db) : m_db(std::move(db)) {
    m_db->exec("DELETE FROM fencerun_fence WHERE resource = 'rmw_kxr'");
    m_db->exec("DELETE FROM rmw_counter WHERE k = 'kxr'");
    m_db->exec("INSERT INTO rmw_counter (k, v) VALUES ('kxr', 0)");
  }
  std::optional<long long> read(long long token, bool fenced) override {
    if (fenced && !run(m_db->begin() + m_db->admit("rmw_kxr", token) + "COMMIT;\n")) return std::nullopt;
    return value();
  }
  int write(long long token, long long v) override {
    return run(m_db->begin() + m_db->admit("rmw_kxr", token) + "UPDATE rmw_counter SET v = " + std::to_string(v) +
               " WHERE k = 'kxr';\nCOMMIT;\n")
               ? 0
               : k_stale;
  }
  long long value() override { return to_number(m_db->value("SELECT v FROM rmw_counter WHERE k = 'kxr'").value_or("")); }

 private:
  // true: committed; false: the admit rejected the token as stale (anything else fails the test).
  bool run(const std::string& statements) {
    try {
      m_db->exec(statements);
      return true;
    } catch (const std::exception& e) {
      // The guard's SQLSTATE where the client shows it, else its message (the same words in every guard).
      const std::string what = e.what();
      EXPECT_TRUE(m_db->stale(what) || what.find("fencerun: stale token") != std::string::npos) << what;
      return false;
    }
  }
  std::unique_ptr<SqlDb> m_db;
};

struct Tally {
  int rounds = 0;
  int writes = 0;            // writes attempted
  int accepted = 0;          // increments the guard accepted
  int stale_rejected = 0;    // reads or writes rejected as stale
  int stale_accepted = 0;    // writes accepted with a token below one already admitted (must stay 0)
  long long final_value = 0;
  long long lost() const { return accepted - final_value; }
};

std::ostream& operator<<(std::ostream& os, const Tally& t) {
  return os << "rounds " << t.rounds << ", writes " << t.writes << ", accepted " << t.accepted
            << ", stale rejected " << t.stale_rejected << ", stale accepted " << t.stale_accepted
            << ", final counter " << t.final_value << ", lost updates " << t.lost();
}

// One worker's increment in progress.
struct Step {
  int worker;
  long long token = 0;
  std::optional<long long> seen;  // what its read returned
  int stage = 0;                  // 0: take a lease, 1: read, 2: write
};

class RmwTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  // A fresh token from a real lease that ends at once, released by its command's exit (the holder is then
  // "paused past its lease"). The TTL leaves room for a slow acquire on a busy machine.
  long long take_token() {
    auto r = run_fencerun({"-r", redis.url(), "--ttl", "2s", "--wait", "10s", "rmw", "--", "sh", "-c",
                           "echo \"$FENCERUN_TOKEN\""});
    EXPECT_EQ(r.exit_code, 0) << r;
    return std::stoll(r.out);
  }

  Tally run_workers(Counter& counter, bool fenced_read, int workers, int rounds, unsigned seed) {
    std::mt19937 rng(seed);
    Tally t;
    long long admitted = 0;  // the greatest token the resource has admitted so far (the model)
    std::vector<Step> live;
    int started = 0;
    const int total = workers * rounds;
    while (started < total || !live.empty()) {
      // Up to `workers` increments in flight; pick one at random and move it one step.
      while (static_cast<int>(live.size()) < workers && started < total) {
        Step fresh{};
        fresh.worker = started++ % workers;
        live.push_back(fresh);
      }
      std::uniform_int_distribution<std::size_t> pick(0, live.size() - 1);
      std::size_t i = pick(rng);
      Step& s = live[i];
      if (s.stage == 0) {
        s.token = take_token();
        s.stage = 1;
      } else if (s.stage == 1) {
        s.seen = counter.read(s.token, fenced_read);
        if (!s.seen) {  // a stale read: this increment is abandoned, nothing written
          ++t.stale_rejected;
          live.erase(live.begin() + static_cast<long>(i));
          ++t.rounds;
          continue;
        }
        if (fenced_read) admitted = std::max(admitted, s.token);
        s.stage = 2;
      } else {
        ++t.writes;
        int rc = counter.write(s.token, *s.seen + 1);
        if (rc == 0) {
          ++t.accepted;
          if (s.token < admitted) ++t.stale_accepted;
          admitted = std::max(admitted, s.token);
        } else if (rc == k_stale) {
          ++t.stale_rejected;
        }
        live.erase(live.begin() + static_cast<long>(i));
        ++t.rounds;
      }
    }
    t.final_value = counter.value();
    return t;
  }

  RedisServer redis;
  TempDir dir;
};

TEST_P(RmwTest, FencedReadsLoseNoUpdateWhereWriteOnlyFencingDoes) {
  const auto& [guard, fenced_read] = GetParam();
  std::unique_ptr<Counter> counter;
  if (guard == "file") {
    counter = std::make_unique<FileCounter>(dir.path() / "counter");
  } else if (guard == "redis") {
    counter = std::make_unique<RedisCounter>(redis);
  } else {
    for (const auto& db : registered_sql_dbs()) {
      if (db.name != guard) continue;
      std::string why;
      auto made = db.make(why);
      if (!made) GTEST_SKIP() << guard << ": " << why;
      counter = std::make_unique<SqlCounter>(std::move(made));
    }
    ASSERT_TRUE(counter) << "no SQL database registered as " << guard;
  }
  Tally t = run_workers(*counter, fenced_read, 4, 10, 20261201u);
  std::cout << guard << (fenced_read ? " fenced read: " : " write-only: ") << t << "\n";
  EXPECT_EQ(t.rounds, 40);
  EXPECT_EQ(t.stale_accepted, 0) << t;
  if (fenced_read) {
    EXPECT_EQ(t.lost(), 0) << t;
    EXPECT_GT(t.accepted, 0) << t;
  } else {
    // The hazard the fenced read removes: the interleavings of this seed lose updates.
    EXPECT_GT(t.lost(), 0) << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Guards, RmwTest,
                         ::testing::Combine(::testing::Values("file", "redis", "postgresql", "mysql", "sqlite"),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<RmwTest::ParamType>& p) {
                           return std::get<0>(p.param) + (std::get<1>(p.param) ? "_fenced_read" : "_write_only");
                         });

}  // namespace
}  // namespace fencerun::test::fence
