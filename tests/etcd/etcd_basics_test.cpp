// fencerun on a healthy 3-member etcd cluster (one cluster for the suite): the job's environment,
// tokens strictly increasing, busy, FIFO hand-over, mutual exclusion after every wait, status, list,
// break, --version, and nothing left in etcd after a run (no :wait/ key, no lease).
#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <regex>
#include <thread>

#include "etcd_fixture.hpp"
#include "util/exit_code.hpp"

namespace fencerun::test {
namespace {

class EtcdBasicsTest : public EtcdSharedTest {};

std::map<std::string, std::string> env_lines(const std::string& out) {
  std::map<std::string, std::string> m;
  for (const auto& l : split_lines(out)) {
    auto eq = l.find('=');
    if (eq != std::string::npos) m[l.substr(0, eq)] = l.substr(eq + 1);
  }
  return m;
}

TEST_F(EtcdBasicsTest, JobEnvironment) {
  auto r = run({"-r", etcd().url(), "--ttl", "5s", "envjob", "--", "env"});
  ASSERT_EQ(r.exit_code, 0) << r;
  auto env = env_lines(r.out);
  auto token = token_of(env["FENCERUN_TOKEN"]);
  ASSERT_TRUE(token.has_value()) << r.out;
  EXPECT_GT(*token, kMinEtcdToken) << "token = base (clock in microseconds) + create_revision";
  EXPECT_LE(*token, kMaxSafeEtcdToken);
  EXPECT_EQ(env["FENCERUN_LOCK"], "envjob");
  EXPECT_EQ(env["FENCERUN_TTL_MS"], "5000");
  EXPECT_FALSE(env["FENCERUN_OWNER"].empty()) << r.out;
  EXPECT_EQ(env["FENCERUN_ETCD_URL"], etcd().url());
  const std::string lease = env["FENCERUN_ETCD_LEASE"];
  EXPECT_EQ(lease.size(), 16u) << lease;
  EXPECT_TRUE(is_lower_hex(lease)) << lease;
  // The base key stays; the run's own key and lease are gone.
  auto base = etcd().get(base_key("envjob"));
  ASSERT_TRUE(base.has_value()) << "no " << base_key("envjob");
  ASSERT_TRUE(token_of(*base).has_value()) << *base;
  EXPECT_LT(*token_of(*base), *token);
  EXPECT_TRUE(nothing_left("envjob"));
}

// While a run holds the lock: its key is fencerun:{NAME}:wait/<its lease in hex>, attached to that
// lease, with the value "OWNER PID HOST", and the token is base + the key's create_revision.
TEST_F(EtcdBasicsTest, HolderKeyLeaseAndToken) {
  auto h = start(sh_args("keyjob",
                         "echo \"$FENCERUN_TOKEN\" > token; echo \"$FENCERUN_ETCD_LEASE\" > lease; "
                         "echo \"$FENCERUN_OWNER\" > owner; while [ ! -e go ]; do sleep 0.02; done",
                         {"--ttl", "10s"}));
  const auto token = token_of(wait_line("token"));
  const std::string lease = wait_line("lease");
  const std::string owner = wait_line("owner");
  ASSERT_TRUE(token.has_value());
  auto keys = waiters("keyjob");
  ASSERT_EQ(keys, std::vector<std::string>{wait_prefix("keyjob") + lease});
  auto value = etcd().get(keys[0]);
  ASSERT_TRUE(value.has_value());
  std::istringstream in(*value);
  std::string v_owner, v_pid, v_host;
  in >> v_owner >> v_pid >> v_host;
  EXPECT_EQ(v_owner, owner) << *value;
  EXPECT_EQ(v_pid, std::to_string(h->pid())) << *value;
  EXPECT_EQ(v_host, hostname()) << *value;

  auto j = parse_json(etcd().etcdctl_ok({"get", keys[0], "-w", "json"}));
  ASSERT_TRUE(j.has_value());
  const Json* kvs = j->find("kvs");
  ASSERT_TRUE(kvs && kvs->items.size() == 1);
  auto create_revision = json_int_of(kvs->items[0].find("create_revision"));
  auto key_lease = kvs->items[0].find("lease");
  ASSERT_TRUE(create_revision.has_value());
  ASSERT_NE(key_lease, nullptr);
  EXPECT_EQ(std::stoull(key_lease->text), std::stoull(lease, nullptr, 16)) << "the key is attached to the run's lease";
  auto base = token_of(etcd().get(base_key("keyjob")).value_or(""));
  ASSERT_TRUE(base.has_value());
  EXPECT_EQ(*token, *base + *create_revision);
  // The run's lease is granted (etcdctl may print it without leading zeros: compare the numbers).
  bool granted = false;
  for (const auto& l : etcd().leases()) granted = granted || std::stoull(l, nullptr, 16) == std::stoull(lease, nullptr, 16);
  EXPECT_TRUE(granted) << lease;

  touch("go");
  ASSERT_EQ(h->wait_for_exit(15s), 0) << h->result();
  EXPECT_TRUE(nothing_left("keyjob"));
  EXPECT_EQ(etcd().get(base_key("keyjob")), std::to_string(*base)) << "the base is set once and stays";
}

TEST_F(EtcdBasicsTest, TokensStrictlyIncreaseOver200Runs) {
  long long prev = 0;
  for (int i = 0; i < 200; ++i) {
    auto r = run({"-r", etcd().url(), "seq", "--", "printenv", "FENCERUN_TOKEN"}, {}, 20s);
    ASSERT_EQ(r.exit_code, 0) << "run " << i << "\n" << r;
    auto t = token_of(r.out);
    ASSERT_TRUE(t.has_value()) << r;
    ASSERT_GT(*t, prev) << "run " << i;
    ASSERT_GT(*t, kMinEtcdToken);
    ASSERT_LE(*t, kMaxSafeEtcdToken);
    prev = *t;
  }
  EXPECT_TRUE(nothing_left("seq"));
  EXPECT_EQ(lock_keys("seq"), std::vector<std::string>{base_key("seq")});
}

TEST_F(EtcdBasicsTest, BusyWhileHeld) {
  auto h = start(sh_args("busy", "echo \"$FENCERUN_TOKEN\" > token; while [ ! -e go ]; do sleep 0.02; done"));
  wait_line("token");
  auto r = run(sh_args("busy", "echo ran > ran"));  // --wait 0: try once
  EXPECT_EQ(r.exit_code, exit_code::k_conflict_default) << r;
  EXPECT_LT(r.elapsed, 2000ms) << r;
  auto w = run(sh_args("busy", "echo ran > ran", {"--wait", "1s"}));
  EXPECT_EQ(w.exit_code, exit_code::k_conflict_default) << w;
  EXPECT_GE(w.elapsed, 900ms) << w;
  EXPECT_LT(w.elapsed, 4000ms) << w;
  EXPECT_FALSE(std::filesystem::exists(file("ran"))) << "a busy run must not run its command";
  EXPECT_EQ(waiters("busy").size(), 1u) << "only the holder's key: busy runs leave nothing";
  EXPECT_EQ(run_leases().size(), 1u) << "only the holder's lease: busy runs revoke theirs";
  touch("go");
  ASSERT_EQ(h->wait_for_exit(15s), 0) << h->result();
  EXPECT_TRUE(nothing_left("busy"));
  // A failing command: its exit code, nothing left.
  auto f = run(sh_args("busy", "exit 3"));
  EXPECT_EQ(f.exit_code, 3) << f;
  EXPECT_TRUE(nothing_left("busy"));
}

// 20 waiters, each started once the previous one's key exists, run in the order they started, with
// increasing tokens.
TEST_F(EtcdBasicsTest, FifoHandOverWith20Waiters) {
  auto h = start(sh_args("fifo", "echo \"$FENCERUN_TOKEN\" > token; while [ ! -e go ]; do sleep 0.02; done"));
  const auto first = token_of(wait_line("token"));
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(waiters("fifo").size(), 1u);
  std::vector<std::unique_ptr<FencerunProcess>> ws;
  for (int i = 0; i < 20; ++i) {
    ws.push_back(start(sh_args("fifo", "echo \"" + std::to_string(i) + " $FENCERUN_TOKEN\" >> order", {"--wait", "60s"})));
    ASSERT_TRUE(wait_until([&] { return waiters("fifo").size() == static_cast<std::size_t>(i) + 2; }, 10s, 20ms))
        << "waiter " << i << " never wrote its key\n" << ws.back()->result();
  }
  touch("go");
  ASSERT_EQ(h->wait_for_exit(15s), 0) << h->result();
  for (int i = 0; i < 20; ++i) ASSERT_EQ(ws[i]->wait_for_exit(30s), 0) << "waiter " << i << "\n" << ws[i]->result();
  auto lines = split_lines(read_file(file("order")).value_or(""));
  ASSERT_EQ(lines.size(), 20u);
  long long prev = *first;
  for (int i = 0; i < 20; ++i) {
    std::istringstream in(lines[i]);
    int who = -1;
    long long t = 0;
    in >> who >> t;
    EXPECT_EQ(who, i) << "the commands ran out of start order:\n" << read_file(file("order")).value_or("");
    EXPECT_GT(t, prev) << lines[i];
    prev = t;
  }
  EXPECT_TRUE(nothing_left("fifo"));
}

// Mutual exclusion after every wait: 6 clients, 10 runs each, all waiting; no two sections overlap,
// no token repeats or goes back.
TEST_F(EtcdBasicsTest, WaitersNeverOverlapNorShareTokens) {
  constexpr int k_clients = 6, k_runs = 10;
  std::vector<std::thread> threads;
  std::vector<std::vector<RunResult>> results(k_clients);
  for (int c = 0; c < k_clients; ++c)
    threads.emplace_back([&, c] {
      for (int i = 0; i < k_runs; ++i) {
        results[c].push_back(run(sh_args("mutex", section_script("log"), {"--wait", "60s"}), {}, 90s));
        if (results[c].back().exit_code == exit_code::k_usage) return;
      }
    });
  for (auto& t : threads) t.join();
  for (auto& rs : results)
    for (auto& r : rs) EXPECT_EQ(r.exit_code, 0) << r;
  auto check = check_sections(read_file(file("log")).value_or(""));
  EXPECT_EQ(check.acquisitions, k_clients * k_runs) << check;
  EXPECT_TRUE(check.ok()) << check;
  EXPECT_TRUE(nothing_left("mutex"));
}

TEST_F(EtcdBasicsTest, StatusListBreak) {
  auto free = run({"status", "-r", etcd().url(), "adm"});
  EXPECT_EQ(free.exit_code, exit_code::k_status_free) << free;
  auto free_json = run({"status", "-r", etcd().url(), "adm", "--json"});
  EXPECT_EQ(free_json.exit_code, exit_code::k_status_free) << free_json;
  auto free_doc = parse_json(free_json.out);
  ASSERT_TRUE(free_doc && free_doc->find("held")) << free_json;
  EXPECT_EQ(free_doc->find("held")->kind, Json::Kind::Bool);
  EXPECT_FALSE(free_doc->find("held")->boolean) << free_json;
  EXPECT_TRUE(etcd().keys(lock_prefix("adm")).empty()) << "status must not write";
  auto h = start(sh_args("adm", kHoldWithGrandchildEtcd, {"--ttl", "10s"}));
  const pid_t cmd = wait_pid("pid");
  const pid_t grandchild = wait_pid("gpid");
  const std::string token = wait_line("token");

  auto s = run({"status", "-r", etcd().url(), "adm"});
  EXPECT_EQ(s.exit_code, 0) << s;
  EXPECT_NE(s.out.find("adm"), std::string::npos) << s;
  EXPECT_NE(s.out.find(token), std::string::npos) << "status names the holder's token\n" << s;
  EXPECT_NE(s.out.find(std::to_string(h->pid())), std::string::npos) << "status names the holder's pid\n" << s;

  auto sj = run({"status", "-r", etcd().url(), "adm", "--json"});
  EXPECT_EQ(sj.exit_code, 0) << sj;
  auto doc = parse_json(sj.out);
  ASSERT_TRUE(doc && doc->kind == Json::Kind::Object) << sj;
  EXPECT_EQ(doc->find("lock") ? doc->find("lock")->as_string() : std::nullopt, std::optional<std::string>("adm"));
  EXPECT_TRUE(doc->find("held") && doc->find("held")->is_true()) << sj.out;
  EXPECT_EQ(doc->find("token") ? doc->find("token")->text : "", token) << sj.out;
  EXPECT_EQ(json_int_of(doc->find("pid")), h->pid()) << sj.out;

  auto l = run({"list", "-r", etcd().url()});
  EXPECT_EQ(l.exit_code, 0) << l;
  EXPECT_NE(l.out.find("adm"), std::string::npos) << l;
  auto lj = run({"list", "-r", etcd().url(), "--json"});
  EXPECT_EQ(lj.exit_code, 0) << lj;
  auto arr = parse_json(lj.out);
  ASSERT_TRUE(arr && arr->kind == Json::Kind::Array) << lj;
  bool listed = false;
  for (const auto& item : arr->items)
    if (item.find("lock") && item.find("lock")->as_string() == "adm") {
      listed = true;
      EXPECT_TRUE(item.find("held") && item.find("held")->is_true()) << lj.out;
      // As for Redis: the holders, each with its token and pid.
      const Json* holders = item.find("holders");
      ASSERT_TRUE(holders && holders->kind == Json::Kind::Array && holders->items.size() == 1) << lj.out;
      EXPECT_EQ(holders->items[0].find("token") ? holders->items[0].find("token")->text : "", token) << lj.out;
      EXPECT_EQ(json_int_of(holders->items[0].find("pid")), h->pid()) << lj.out;
    }
  EXPECT_TRUE(listed) << lj.out;

  const auto broken_at = Clock::now();
  auto b = run({"break", "-r", etcd().url(), "adm", "-y"});
  EXPECT_EQ(b.exit_code, 0) << b;
  auto rc = h->wait_for_exit(5s);
  EXPECT_EQ(rc, exit_code::k_lease_lost_default) << h->result();
  EXPECT_TRUE(process_dead(cmd));
  EXPECT_TRUE(process_dead(grandchild));
  EXPECT_LT(ms_between(broken_at, h->exited_at()), 2000) << "the holder watches its key and stops at once";

  auto after = run({"status", "-r", etcd().url(), "adm"});
  EXPECT_EQ(after.exit_code, exit_code::k_status_free) << after;
  EXPECT_TRUE(nothing_left("adm", 12s)) << "at the latest when the broken holder's lease (10 s) runs out";
  // The lock is free for the next run, whose token is greater.
  auto next = run({"-r", etcd().url(), "adm", "--", "printenv", "FENCERUN_TOKEN"});
  ASSERT_EQ(next.exit_code, 0) << next;
  EXPECT_GT(token_of(next.out).value_or(0), *token_of(token));
}

TEST_F(EtcdBasicsTest, KilledAndSignalledWaitersLeaveNothing) {
  auto h = start(sh_args("kw", "echo \"$FENCERUN_TOKEN\" > token; while [ ! -e go ]; do sleep 0.02; done"));
  wait_line("token");
  // A waiter ended by SIGTERM removes its key at once.
  auto t = start(sh_args("kw", "echo ran > ran", {"--wait", "60s", "--ttl", "3s"}));
  ASSERT_TRUE(wait_until([&] { return waiters("kw").size() == 2; }, 10s)) << t->result();
  t->signal(SIGTERM);
  auto trc = t->wait_for_exit(5s);
  ASSERT_TRUE(trc.has_value()) << t->result();
  EXPECT_NE(*trc, 0) << t->result();
  EXPECT_TRUE(wait_until([&] { return waiters("kw").size() == 1; }, 2s)) << "the signalled waiter's key stayed";
  // A waiter killed with SIGKILL: its key goes with its lease, within the TTL.
  auto k = start(sh_args("kw", "echo ran > ran", {"--wait", "60s", "--ttl", "3s"}));
  ASSERT_TRUE(wait_until([&] { return waiters("kw").size() == 2; }, 10s)) << k->result();
  k->kill_and_reap();
  EXPECT_TRUE(wait_until([&] { return waiters("kw").size() == 1; }, 6s)) << "the killed waiter's key outlived its TTL";
  touch("go");
  ASSERT_EQ(h->wait_for_exit(15s), 0) << h->result();
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_TRUE(nothing_left("kw", 6s));
}

TEST_F(EtcdBasicsTest, VersionNamesTheCluster) {
  auto r = run({"--version", "-r", etcd().url()});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("3.4.23"), std::string::npos) << "the members' etcd version\n" << r;
}

}  // namespace
}  // namespace fencerun::test
