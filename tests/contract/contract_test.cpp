// The contract scenarios that leave the servers alone, run on every setup (contract_fixture.hpp):
// mutual exclusion, token order, FIFO waiting, renewal, break, and what status, list and history
// show. Each test uses lock names of its own on the setup its suite shares.
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "contract_fixture.hpp"

namespace fencerun::test::contract {
namespace {

constexpr int kBusy = 75;
constexpr int kLeaseLost = 124;
constexpr int kUsage = 64;
constexpr int kFree = 3;

// 1. Several runs of one lock, all started at once with --wait: each command's section (between its
// "start T" and "end T" lines in a shared log) overlaps no other, and every run gets its turn.
class Exclusion : public ContractTest {};

TEST_P(Exclusion, MutualExclusion) {
  constexpr int kRuns = 5;
  std::vector<std::unique_ptr<FencerunProcess>> runs;
  for (int i = 0; i < kRuns; ++i)
    runs.push_back(start(sh_args("excl", section_script("log", "0.1"), {"--wait", "60s", "--ttl", "3s"})));
  for (auto& r : runs) {
    ASSERT_TRUE(r->wait_for_exit(90s)) << "a run did not end\n" << r->result();
    EXPECT_EQ(*r->exit_code(), 0) << r->result();
  }
  const auto check = check_sections(read_file(file("log")).value_or(""));
  EXPECT_TRUE(check.ok()) << check;
  EXPECT_EQ(check.acquisitions, kRuns) << check;
  EXPECT_EQ(admin({"status", "excl"}).exit_code, kFree) << "released at the end";
}

INSTANTIATE_TEST_SUITE_P(Contract, Exclusion, kAllSetups, setup_name);

// 2. Tokens strictly increase: over consecutive runs, and from a holder to the runs that waited for
// it, in the order they acquired.
class Tokens : public ContractTest {};

TEST_P(Tokens, StrictlyIncreasing) {
  std::vector<long long> sequential;
  for (int i = 0; i < 3; ++i) {
    auto r = run(sh_args("tok", "echo \"$FENCERUN_TOKEN\""));
    ASSERT_EQ(r.exit_code, 0) << r;
    auto t = token_of(r.out);
    ASSERT_TRUE(t) << r;
    EXPECT_GE(*t, kMinEtcdToken) << "tokens are microseconds of a clock or more";
    EXPECT_LE(*t, kMaxSafeEtcdToken);
    sequential.push_back(*t);
  }
  EXPECT_LT(sequential[0], sequential[1]);
  EXPECT_LT(sequential[1], sequential[2]);

  // A holder, then two waiters: each appends its token when it starts.
  auto holder = start(sh_args("tok", "echo \"start $FENCERUN_TOKEN\" >> log; " + std::string(kHoldJob)));
  const long long held = wait_token("token");
  wait_pid("pid");
  EXPECT_GT(held, sequential[2]);
  std::vector<std::unique_ptr<FencerunProcess>> waiters;
  for (int i = 0; i < 2; ++i)
    waiters.push_back(start(sh_args("tok", "echo \"start $FENCERUN_TOKEN\" >> log", {"--wait", "60s"})));
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(30s)) << holder->result();
  EXPECT_EQ(*holder->exit_code(), 0) << holder->result();
  for (auto& w : waiters) {
    ASSERT_TRUE(w->wait_for_exit(60s)) << w->result();
    EXPECT_EQ(*w->exit_code(), 0) << w->result();
  }
  std::vector<long long> order;
  for (const auto& l : split_lines(read_file(file("log")).value_or(""))) {
    auto t = token_of(l.substr(l.find(' ') + 1));
    ASSERT_TRUE(t) << "malformed line: " << l;
    order.push_back(*t);
  }
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], held);
  EXPECT_LT(order[0], order[1]);
  EXPECT_LT(order[1], order[2]);
}

INSTANTIATE_TEST_SUITE_P(Contract, Tokens, kAllSetups, setup_name);

// 3. FIFO: waiters that began waiting in the order A, B, C acquire in that order (with --fair),
// each with a greater token. A setup without it refuses --fair: exit 64, the option named, nothing run.
class Fifo : public ContractTest {};

TEST_P(Fifo, WaitersAcquireInArrivalOrder) {
  if (!caps().fair) {
    auto r = run(sh_args("fifo", "touch ran", {"--fair", "--wait", "10s"}));
    EXPECT_EQ(r.exit_code, kUsage) << r;
    EXPECT_NE(r.err.find("--fair"), std::string::npos) << "the refusal names the option\n" << r;
    EXPECT_FALSE(std::filesystem::exists(file("ran")));
    return;
  }
  auto holder = start(sh_args("fifo", kHoldJob));
  wait_pid("pid");
  // Each waiter is started once the previous one is queued (status counts it).
  std::vector<std::unique_ptr<FencerunProcess>> waiters;
  for (const std::string who : {"A", "B", "C"}) {
    waiters.push_back(start(sh_args("fifo", "echo \"" + who + " $FENCERUN_TOKEN\" >> order", {"--fair", "--wait", "60s"})));
    const long long expected = static_cast<long long>(waiters.size());
    std::pair<int, std::optional<Json>> st;
    ASSERT_TRUE(wait_until(
        [&] {
          st = status_json("fifo");
          return st.second && json_int_of(st.second->find("waiters")) == expected;
        },
        20s, 20ms))
        << "waiter " << who << " never showed in status";
  }
  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(30s)) << holder->result();
  for (auto& w : waiters) {
    ASSERT_TRUE(w->wait_for_exit(60s)) << w->result();
    EXPECT_EQ(*w->exit_code(), 0) << w->result();
  }
  const auto lines = split_lines(read_file(file("order")).value_or(""));
  ASSERT_EQ(lines.size(), 3u);
  std::string order;
  std::vector<long long> tokens;
  for (const auto& l : lines) {
    order += l.substr(0, 1);
    tokens.push_back(token_of(l.substr(2)).value_or(-1));
  }
  EXPECT_EQ(order, "ABC");
  EXPECT_LT(tokens[0], tokens[1]);
  EXPECT_LT(tokens[1], tokens[2]);
}

INSTANTIATE_TEST_SUITE_P(Contract, Fifo, kAllSetups, setup_name);

// 4. Renewal: a command that runs for over three TTLs keeps the lock the whole time (status shows
// it held by this run, a run that does not wait finds it busy), and fencerun exits with the
// command's status.
class Renewal : public ContractTest {};

TEST_P(Renewal, LongCommandKeepsTheLock) {
  auto holder = start(sh_args("renew", "echo \"$FENCERUN_TOKEN\" > token; echo $$ > pid; sleep 7; exit 3",
                              {"--ttl", "2s"}));
  const long long token = wait_token("token");
  // The command's own pid: fencerun releases the lock after the command has ended, before it exits
  // itself, so an answer counts when the command still ran after it came.
  const pid_t command = wait_pid("pid");
  int checks = 0, intruders = 0;
  auto next_intruder = Clock::now();
  while (!process_dead(command)) {
    auto [code, j] = status_json("renew");
    if (process_dead(command)) break;  // ended while status ran: its answer may be "free"
    ++checks;
    ASSERT_EQ(code, 0) << "the lock looked free while the command ran (check " << checks << ")";
    ASSERT_TRUE(j);
    EXPECT_EQ(json_int_of(j->find("pid")), holder->pid());
    EXPECT_EQ(json_int_of(j->find("token")), token);
    if (Clock::now() >= next_intruder) {
      // A run that does not wait, while the command runs: busy, its command not run.
      auto r = run(sh_args("renew", "touch intruded", {"--wait", "0"}));
      if (process_dead(command)) break;  // it may have come after the release
      EXPECT_EQ(r.exit_code, kBusy) << r;
      ++intruders;
      next_intruder = Clock::now() + 1s;
    }
  }
  ASSERT_TRUE(holder->wait_for_exit(10s));
  const RunResult hr = holder->result();
  EXPECT_EQ(hr.exit_code, 3) << "the command's own status\n" << hr;
  EXPECT_GE(hr.elapsed, 7s) << hr;
  EXPECT_GE(checks, 5);
  EXPECT_GE(intruders, 3);
  EXPECT_EQ(admin({"status", "renew"}).exit_code, kFree);
}

INSTANTIATE_TEST_SUITE_P(Contract, Renewal, kAllSetups, setup_name);

// 7. break: the holder's lease is released, the holder stops its job (its process group too) and
// exits 124, and the lock is free at once. Where break is not supported, it is refused (exit 64,
// the subcommand or the option that makes it unsupported named) and the holder keeps its lock.
class Break : public ContractTest {};

TEST_P(Break, BreakStopsTheHolder) {
  auto holder = start(sh_args("brk", kHoldJob, {"--ttl", "3s"}));
  const pid_t pid = wait_pid("pid");
  const pid_t gpid = wait_pid("gpid");
  const long long token = wait_token("token");
  auto b = admin({"break", "brk", "--yes"});
  if (!caps().break_lock) {
    EXPECT_EQ(b.exit_code, kUsage) << b;
    // Named: the subcommand, or the option that makes it unsupported (several --redis today).
    EXPECT_TRUE(b.err.find("break") != std::string::npos || b.err.find("--redis") != std::string::npos)
        << "the refusal names what is not supported\n" << b;
    auto [code, j] = status_json("brk");
    EXPECT_EQ(code, 0) << "the holder lost its lock to a refused break";
    ASSERT_TRUE(j);
    EXPECT_EQ(json_int_of(j->find("token")), token);
    EXPECT_TRUE(holder->running());
    touch("go");
    ASSERT_TRUE(holder->wait_for_exit(30s)) << holder->result();
    EXPECT_EQ(*holder->exit_code(), 0) << holder->result();
    return;
  }
  ASSERT_EQ(b.exit_code, 0) << b;
  EXPECT_NE(b.out.find("broke brk"), std::string::npos) << b;
  ASSERT_TRUE(holder->wait_for_exit(15s)) << "the broken holder did not stop\n" << holder->result();
  EXPECT_EQ(*holder->exit_code(), kLeaseLost) << holder->result();
  EXPECT_TRUE(process_dead(pid)) << "the command outlived its fencerun";
  EXPECT_TRUE(process_dead(gpid)) << "a process of the job's group outlived its fencerun";
  // The lock is free: a run that does not wait gets it, with a greater token.
  auto next = run(sh_args("brk", "echo \"$FENCERUN_TOKEN\"", {"--wait", "0"}));
  ASSERT_EQ(next.exit_code, 0) << next;
  EXPECT_GT(token_of(next.out).value_or(0), token) << next;
  // Nothing held: nothing to break.
  EXPECT_EQ(admin({"break", "brk", "--yes"}).exit_code, kFree);
}

INSTANTIATE_TEST_SUITE_P(Contract, Break, kAllSetups, setup_name);

// 8. status, list and history: the holder and its token while held; once free, the last token
// (where the setup keeps one) and the record of every run, newest first.
class Inspect : public ContractTest {};

TEST_P(Inspect, StatusListAndHistory) {
  auto st = admin({"status", "insp"});
  EXPECT_EQ(st.exit_code, kFree) << st;
  auto first = run(sh_args("insp", "echo \"$FENCERUN_TOKEN\""));
  ASSERT_EQ(first.exit_code, 0) << first;
  auto failed = run(sh_args("insp", "echo \"$FENCERUN_TOKEN\"; exit 3"));
  ASSERT_EQ(failed.exit_code, 3) << failed;

  auto holder = start(sh_args("insp", kHoldJob, {"--ttl", "4s"}));
  const long long token = wait_token("token");
  wait_pid("pid");
  const std::string pid = std::to_string(holder->pid());

  auto [code, j] = status_json("insp");
  EXPECT_EQ(code, 0);
  ASSERT_TRUE(j);
  EXPECT_TRUE(j->find("held") && j->find("held")->is_true());
  EXPECT_EQ(field(*j, "pid"), pid);
  EXPECT_EQ(field(*j, "host"), hostname());
  EXPECT_EQ(json_int_of(j->find("token")), token);
  EXPECT_GT(json_int_of(j->find("ttl_ms")).value_or(0), 0);
  auto text = admin({"status", "insp"});
  EXPECT_EQ(text.exit_code, 0) << text;
  EXPECT_NE(text.out.find("held by pid " + pid + " on " + hostname()), std::string::npos) << text;
  EXPECT_NE(text.out.find(std::to_string(token)), std::string::npos) << text;

  auto list = admin({"list", "insp*"});
  EXPECT_EQ(list.exit_code, 0) << list;
  EXPECT_NE(list.out.find("insp: held by pid " + pid), std::string::npos) << list;
  EXPECT_NE(list.out.find("token " + std::to_string(token)), std::string::npos) << list;
  auto lj = admin({"list", "insp*", "--json"});
  auto la = parse_json(lj.out);
  ASSERT_TRUE(la && la->kind == Json::Kind::Array && la->items.size() == 1) << lj;
  EXPECT_EQ(field(la->items[0], "lock"), "insp");
  EXPECT_TRUE(la->items[0].find("held") && la->items[0].find("held")->is_true()) << lj;

  touch("go");
  ASSERT_TRUE(holder->wait_for_exit(30s)) << holder->result();
  ASSERT_EQ(*holder->exit_code(), 0) << holder->result();

  auto [free_code, fj] = status_json("insp");
  EXPECT_EQ(free_code, kFree);
  ASSERT_TRUE(fj);
  EXPECT_FALSE(fj->find("held") && fj->find("held")->is_true());
  if (caps().last_token_when_free) {
    EXPECT_EQ(json_int_of(fj->find("last_token")), token);
  }
  ASSERT_TRUE(fj->find("last_run") && fj->find("last_success"));
  EXPECT_EQ(field(*fj->find("last_run"), "token"), std::to_string(token));
  EXPECT_EQ(field(*fj->find("last_run"), "outcome"), "ok");
  EXPECT_EQ(field(*fj->find("last_success"), "token"), std::to_string(token));
  EXPECT_EQ(admin({"list", "insp*"}).exit_code, kFree);
  auto all = admin({"list", "--all", "insp*"});
  EXPECT_NE(all.out.find("insp: free"), std::string::npos) << all;

  auto h = admin({"history", "insp", "--json"});
  EXPECT_EQ(h.exit_code, 0) << h;
  auto ha = parse_json(h.out);
  ASSERT_TRUE(ha && ha->kind == Json::Kind::Array) << h;
  ASSERT_EQ(ha->items.size(), 3u) << h;
  EXPECT_EQ(field(ha->items[0], "outcome"), "ok");
  EXPECT_EQ(field(ha->items[0], "token"), std::to_string(token));
  EXPECT_EQ(field(ha->items[0], "pid"), pid);
  EXPECT_EQ(field(ha->items[1], "outcome"), "failed");
  EXPECT_EQ(field(ha->items[1], "exit_code"), "3");
  EXPECT_EQ(field(ha->items[1], "token"), std::to_string(token_of(failed.out).value_or(-1)));
  EXPECT_EQ(field(ha->items[2], "outcome"), "ok");
  EXPECT_EQ(field(ha->items[2], "token"), std::to_string(token_of(first.out).value_or(-1)));
  auto ht = admin({"history", "insp"});
  // history's line: "START to END (DURATION) OUTCOME on ...", ISO 8601 times with the zone's offset.
  auto history_line = [](const std::string& l, const std::string& what) {
    return l.size() > 25 && l[4] == '-' && l[10] == 'T' && l.find(" to ") == 25 && l.find(") " + what + " on ") != std::string::npos;
  };
  auto lines = split_lines(ht.out);
  ASSERT_EQ(lines.size(), 3u) << ht;
  EXPECT_TRUE(history_line(lines[0], "ok")) << lines[0];
  EXPECT_TRUE(history_line(lines[1], "failed (exit 3)")) << lines[1];
  auto none = admin({"history", "insp-never-ran"});
  EXPECT_EQ(none.exit_code, kFree) << none;
}

INSTANTIATE_TEST_SUITE_P(Contract, Inspect, kAllSetups, setup_name);

}  // namespace
}  // namespace fencerun::test::contract

namespace fencerun::test::contract {
namespace {

// 7. The job's environment (lease/facts.hpp, written once for every backend): the token, the lock,
// the owner, the TTL, the slot and the limit, and the server's URL without a password, the same
// names on every backend.
class Environment : public ContractTest {};

TEST_P(Environment, TheJobIsToldItsLease) {
  auto r = run(sh_args("envjob",
                       "printf '%s|%s|%s|%s|%s|%s|%s\\n' \"$FENCERUN_TOKEN\" \"$FENCERUN_LOCK\" \"$FENCERUN_OWNER\" "
                       "\"$FENCERUN_TTL_MS\" \"$FENCERUN_SLOT\" \"$FENCERUN_LIMIT\" \"${FENCERUN_REDIS_URL:-$FENCERUN_ETCD_URL}\"",
                       {"--ttl", "3s"}));
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> f;
  std::string line = trim(r.out);
  for (std::size_t start = 0;;) {
    const auto bar = line.find('|', start);
    f.push_back(line.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  ASSERT_EQ(f.size(), 7u) << r;
  ASSERT_TRUE(token_of(f[0])) << r;
  EXPECT_EQ(f[1], "envjob");
  EXPECT_EQ(f[2].size(), 32u) << "128 random bits, hex: " << f[2];
  EXPECT_TRUE(is_lower_hex(f[2])) << f[2];
  EXPECT_EQ(f[3], "3000");
  EXPECT_EQ(f[4], "0");
  EXPECT_EQ(f[5], "1");
  EXPECT_FALSE(f[6].empty()) << "the server's URL";
  EXPECT_EQ(f[6].find('@'), std::string::npos) << "no credentials in the job's environment: " << f[6];
}

INSTANTIATE_TEST_SUITE_P(Contract, Environment, kAllSetups, setup_name);

}  // namespace
}  // namespace fencerun::test::contract
