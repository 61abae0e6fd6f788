// fencerun list over a thousand locks: on a standalone server (with real holders, a counting lock, a
// waiter and free locks beside the written ones) and on a 3-master Cluster through each node. Every
// lock is found once, sorted, with what its key says.
#include <algorithm>
#include <set>

#include "admin_fixture.hpp"

namespace fencerun::test::admin {
namespace {

using deploy::tcp;

class ListTest : public AdminTest {
 protected:
  void SetUp() override {
    on_failure_.push_back([this] { return "--- redis-server log ---\n" + redis_.log(); });
  }
  std::string url() const { return redis_.url(); }
  RedisServer redis_;
};

std::vector<FakeLock> free_locks(int n) {
  std::vector<FakeLock> v;
  for (int i = 0; i < n; ++i) {
    FakeLock l;
    l.name = "free" + std::to_string(i);
    l.token = 7'000'000 + i;
    l.held = false;
    v.push_back(l);
  }
  return v;
}

TEST_F(ListTest, EmptyServerHoldsNothing) {
  RunResult r = run({"list", "-r", url()});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_EQ(trim(r.out), "") << r;
  RunResult j = run({"list", "-r", url(), "--json"});
  EXPECT_EQ(j.exit_code, 3) << j;
  auto a = parse_json(j.out);
  ASSERT_TRUE(a && a->kind == Json::Kind::Array) << j;
  EXPECT_TRUE(a->items.empty()) << j;
}

TEST_F(ListTest, ThousandLocksOnAStandaloneServer) {
  const auto locks = numbered_locks(1000);
  const auto frees = free_locks(5);
  write_locks(tcp(redis_.port()), locks);
  write_locks(tcp(redis_.port()), frees);

  // Real holders: a plain lock with one waiter, and a counting lock with both of its slots taken.
  Holder real = start_holder(url(), "real-a", "a", {"--ttl", "30s"});
  auto waiter = start(sh_args(url(), "real-a", "true", {"-w", "60s"}));
  ASSERT_TRUE(wait_until([&] { return redis_.cmd({"ZCARD", "fencerun:{real-a}:queue"}).integer == 1; }, 10s))
      << "the waiter never queued\n" << waiter->result();
  Holder c0 = start_holder(url(), "counted", "c0", {"--ttl", "30s", "--limit", "2"});
  Holder c1 = start_holder(url(), "counted", "c1", {"--ttl", "30s", "--limit", "2"});
  ASSERT_NE(c0.slot, c1.slot);
  ASSERT_GT(redis_.dbsize(), 2000) << "more keys than one SCAN COUNT 1000 call returns";

  std::set<std::string> held_names = {"real-a", "counted"};
  for (const auto& l : locks) held_names.insert(l.name);
  std::set<std::string> all_names = held_names;
  for (const auto& l : frees) all_names.insert(l.name);

  // Text: every held lock once, sorted, with the holder its key names.
  RunResult r = run({"list", "-r", url()});
  ASSERT_EQ(r.exit_code, 0) << r;
  auto listed = parse_list_text(r.out);
  auto names = names_of(listed);
  EXPECT_EQ(duplicates(names), std::vector<std::string>{});
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), held_names);
  EXPECT_EQ(names.size(), held_names.size());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end())) << r.out.substr(0, 2000);
  std::map<std::string, const ListedLock*> by_name;
  for (const auto& l : listed) by_name[l.name] = &l;
  int wrong = 0;
  for (const auto& l : locks) {
    auto it = by_name.find(l.name);
    if (it == by_name.end()) continue;
    const std::string& line = it->second->line;
    const std::string head = l.name + ": held by pid " + std::to_string(l.pid) + " on fakehost (owner " + l.owner8() +
                             "), token " + std::to_string(l.token) + ", ttl ";
    const std::string tail = "ms, last token " + std::to_string(l.token);
    if (!line.starts_with(head) || !line.ends_with(tail) || !it->second->slot_lines.empty()) {
      if (++wrong <= 3) ADD_FAILURE() << "expected '" << head << "...'" << tail << "', got '" << line << "'";
    }
  }
  EXPECT_EQ(wrong, 0);
  ASSERT_TRUE(by_name.count("real-a"));
  const std::string& ra = by_name["real-a"]->line;
  EXPECT_TRUE(ra.starts_with("real-a: held by pid " + std::to_string(real.proc->pid()) + " on " + hostname() +
                             " (owner " + real.owner.substr(0, 8) + "), token " + std::to_string(real.token) + ", ttl "))
      << ra;
  EXPECT_TRUE(ra.ends_with(", 1 waiting, last token " + std::to_string(real.token))) << ra;
  ASSERT_TRUE(by_name.count("counted"));
  const ListedLock& cl = *by_name["counted"];
  EXPECT_EQ(cl.line, "counted: 2 of 2 slots held, last token " + std::to_string(std::max(c0.token, c1.token)));
  ASSERT_EQ(cl.slot_lines.size(), 2u) << r.out.substr(0, 2000);
  for (const Holder* h : {&c0, &c1}) {
    const std::string head = "  slot " + std::to_string(h->slot) + ": pid " + std::to_string(h->proc->pid()) + " on " +
                             hostname() + " (owner " + h->owner.substr(0, 8) + "), token " + std::to_string(h->token) +
                             ", ttl ";
    EXPECT_TRUE(std::any_of(cl.slot_lines.begin(), cl.slot_lines.end(), [&](const std::string& s) {
      return s.starts_with(head) && s.ends_with("ms");
    })) << "no line '" << head << "...ms' among\n" << cl.slot_lines[0] << "\n" << cl.slot_lines[1];
  }

  // JSON: the same locks, each once.
  RunResult j = run({"list", "-r", url(), "--json"});
  ASSERT_EQ(j.exit_code, 0) << j;
  auto a = parse_json(j.out);
  ASSERT_TRUE(a && a->kind == Json::Kind::Array) << j.out.substr(0, 2000);
  auto jnames = names_of(*a);
  EXPECT_EQ(duplicates(jnames), std::vector<std::string>{});
  EXPECT_EQ(std::set<std::string>(jnames.begin(), jnames.end()), held_names);
  EXPECT_EQ(jnames.size(), held_names.size());
  for (const auto& e : a->items) {
    const std::string name = e.find("lock") ? e.find("lock")->as_string().value_or("") : "";
    ASSERT_TRUE(e.find("held")) << name;
    EXPECT_TRUE(e.find("held")->is_true()) << name;
    const Json* holders = e.find("holders");
    ASSERT_TRUE(holders && holders->kind == Json::Kind::Array) << name;
    if (name == "counted") {
      EXPECT_EQ(e.find("limit")->as_int(), 2);
      EXPECT_EQ(holders->items.size(), 2u);
    } else if (name == "real-a") {
      EXPECT_EQ(e.find("waiters")->as_int(), 1);
      ASSERT_EQ(holders->items.size(), 1u);
      EXPECT_EQ(holders->items[0].find("token")->as_int(), real.token);
      EXPECT_EQ(holders->items[0].find("pid")->as_int(), real.proc->pid());
    } else if (name == "lock0421") {
      ASSERT_EQ(holders->items.size(), 1u);
      const Json& h = holders->items[0];
      EXPECT_EQ(e.find("limit")->as_int(), 1);
      EXPECT_EQ(e.find("last_token")->as_int(), 5'000'421);
      EXPECT_EQ(h.find("token")->as_int(), 5'000'421);
      EXPECT_EQ(h.find("pid")->as_int(), 100'421);
      EXPECT_EQ(h.find("host")->as_string(), "fakehost");
      EXPECT_EQ(h.find("owner")->as_string(), "100001a5");
      auto ttl = h.find("ttl_ms")->as_int();
      EXPECT_TRUE(ttl && *ttl > 200'000 && *ttl <= 300'000) << "ttl_ms " << ttl.value_or(-1);
    }
  }

  // --all: the free locks too, as free.
  RunResult all = run({"list", "-r", url(), "--all"});
  ASSERT_EQ(all.exit_code, 0) << all;
  auto all_listed = parse_list_text(all.out);
  auto all_n = names_of(all_listed);
  EXPECT_EQ(duplicates(all_n), std::vector<std::string>{});
  EXPECT_EQ(std::set<std::string>(all_n.begin(), all_n.end()), all_names);
  EXPECT_TRUE(std::is_sorted(all_n.begin(), all_n.end()));
  for (const auto& l : all_listed) {
    if (l.name.starts_with("free")) {
      EXPECT_EQ(l.line, l.name + ": free, last token " + std::to_string(7'000'000 + std::stoi(l.name.substr(4))));
    }
  }
  RunResult all_json = run({"list", "-r", url(), "--all", "--json"});
  ASSERT_EQ(all_json.exit_code, 0) << all_json;
  auto aj = parse_json(all_json.out);
  ASSERT_TRUE(aj && aj->kind == Json::Kind::Array);
  EXPECT_EQ(aj->items.size(), all_names.size());
  EXPECT_EQ(duplicates(names_of(*aj)), std::vector<std::string>{});
  for (const auto& e : aj->items)
    if (e.find("lock")->as_string().value_or("").starts_with("free")) {
      EXPECT_FALSE(e.find("held")->is_true());
      EXPECT_TRUE(e.find("holders")->items.empty());
    }

  // PATTERN: a Redis glob over the names.
  RunResult p = run({"list", "-r", url(), "lock00*"});
  ASSERT_EQ(p.exit_code, 0) << p;
  auto pn = names_of(parse_list_text(p.out));
  EXPECT_EQ(pn.size(), 100u);
  EXPECT_TRUE(std::all_of(pn.begin(), pn.end(), [](const std::string& n) { return n.starts_with("lock00"); }));
  RunResult q = run({"list", "-r", url(), "lock09[5-9]?", "--json"});
  ASSERT_EQ(q.exit_code, 0) << q;
  auto qj = parse_json(q.out);
  ASSERT_TRUE(qj);
  auto qn = names_of(*qj);
  std::vector<std::string> want;
  for (int i = 950; i < 1000; ++i) want.push_back("lock0" + std::to_string(i));
  EXPECT_EQ(qn, want);
  RunResult one = run({"list", "-r", url(), "real-a"});
  EXPECT_EQ(one.exit_code, 0) << one;
  EXPECT_EQ(names_of(parse_list_text(one.out)), std::vector<std::string>{"real-a"});

  // Nothing held among the matches: 3 (the free ones still shown with --all).
  RunResult none = run({"list", "-r", url(), "nomatch*"});
  EXPECT_EQ(none.exit_code, 3) << none;
  EXPECT_EQ(trim(none.out), "") << none;
  RunResult fr = run({"list", "-r", url(), "free*"});
  EXPECT_EQ(fr.exit_code, 3) << fr;
  EXPECT_EQ(trim(fr.out), "") << fr;
  RunResult fr_all = run({"list", "-r", url(), "free*", "--all"});
  EXPECT_EQ(fr_all.exit_code, 3) << fr_all;
  EXPECT_EQ(names_of(parse_list_text(fr_all.out)),
            (std::vector<std::string>{"free0", "free1", "free2", "free3", "free4"}));

  for (const char* id : {"a", "c0", "c1"}) let_go(id);
  for (auto* p2 : {real.proc.get(), c0.proc.get(), c1.proc.get(), waiter.get()}) {
    ASSERT_TRUE(p2->wait_for_exit(20s)) << p2->result();
    EXPECT_EQ(*p2->exit_code(), 0) << p2->result();
  }
}

TEST_F(ListTest, UnreachableRedisIs69) {
  RunResult r = run({"list", "-r", "redis://127.0.0.1:" + std::to_string(unused_port()), "--timeout", "1s"});
  EXPECT_EQ(r.exit_code, 69) << r;
}

// A 3-master Cluster: list asks every master, whichever node it is given.
class ListClusterTest : public AdminTest {
 protected:
  void SetUp() override {
    if (!deploy::program_usable(deploy::redis_cli_program())) GTEST_SKIP() << "redis-cli not found";
    cluster_ = std::make_unique<deploy::ClusterNodes>();
    on_failure_.push_back([this] { return cluster_->logs(); });
  }
  std::string url(size_t i) const { return cluster_->node(i).url(); }
  std::unique_ptr<deploy::ClusterNodes> cluster_;
};

TEST_F(ListClusterTest, ThousandLocksOverThreeMasters) {
  auto locks = numbered_locks(1000);
  auto frees = free_locks(30);
  // The slot ranges, once; the test's hash agrees with the server's.
  std::vector<size_t> owner_of_slot(16384);
  for (int s = 0; s < 16384; ++s) owner_of_slot[static_cast<size_t>(s)] = 99;
  Reply slots = cluster_->node(0).cmd({"CLUSTER", "SLOTS"});
  ASSERT_EQ(slots.type, Reply::Type::Array) << slots.describe();
  for (const auto& range : slots.elements) {
    size_t node = 99;
    for (size_t i = 0; i < cluster_->size(); ++i)
      if (cluster_->node(i).port() == range.elements.at(2).elements.at(1).integer) node = i;
    for (long long s = range.elements[0].integer; s <= range.elements[1].integer; ++s)
      owner_of_slot[static_cast<size_t>(s)] = node;
  }
  for (const auto& l : {locks[0], locks[333], locks[999]})
    ASSERT_EQ(hash_slot(lock_key(l.name)), cluster_->keyslot(lock_key(l.name))) << l.name;
  std::vector<std::vector<FakeLock>> per_node(cluster_->size());
  for (const auto& l : locks) per_node.at(owner_of_slot[static_cast<size_t>(hash_slot(lock_key(l.name)))]).push_back(l);
  std::vector<std::vector<FakeLock>> free_per_node(cluster_->size());
  for (const auto& l : frees) free_per_node.at(owner_of_slot[static_cast<size_t>(hash_slot(lock_key(l.name)))]).push_back(l);
  for (size_t i = 0; i < cluster_->size(); ++i) {
    ASSERT_GT(per_node[i].size(), 200u) << "node " << i << " got too few locks";
    write_locks(tcp(cluster_->node(i).port()), per_node[i]);
    write_locks(tcp(cluster_->node(i).port()), free_per_node[i]);
    EXPECT_GT(cluster_->node(i).dbsize(), 400);
  }
  // One real holder, through node 0 (its key may live on another node).
  Holder real = start_holder(url(0), "real-c", "c", {"--ttl", "30s"});

  std::set<std::string> held_names = {"real-c"};
  for (const auto& l : locks) held_names.insert(l.name);
  for (size_t i = 0; i < cluster_->size(); ++i) {
    SCOPED_TRACE("through node " + std::to_string(i));
    RunResult r = run({"list", "-r", url(i)});
    ASSERT_EQ(r.exit_code, 0) << r;
    auto listed = parse_list_text(r.out);
    auto names = names_of(listed);
    EXPECT_EQ(duplicates(names), std::vector<std::string>{});
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), held_names);
    EXPECT_EQ(names.size(), held_names.size());
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    for (const auto& l : listed) {
      if (l.name == "lock0777") {
        EXPECT_TRUE(l.line.starts_with("lock0777: held by pid 100777 on fakehost (owner 10000309), token 5000777, ttl "))
            << l.line;
      }
    }

    RunResult j = run({"list", "-r", url(i), "--json", "--all"});
    ASSERT_EQ(j.exit_code, 0) << j;
    auto a = parse_json(j.out);
    ASSERT_TRUE(a && a->kind == Json::Kind::Array) << j.out.substr(0, 2000);
    auto jn = names_of(*a);
    EXPECT_EQ(duplicates(jn), std::vector<std::string>{});
    EXPECT_EQ(jn.size(), held_names.size() + frees.size());
  }
  RunResult p = run({"list", "-r", url(2), "lock01*"});
  ASSERT_EQ(p.exit_code, 0) << p;
  EXPECT_EQ(names_of(parse_list_text(p.out)).size(), 100u);
  RunResult none = run({"list", "-r", url(1), "free*"});
  EXPECT_EQ(none.exit_code, 3) << none;

  let_go("c");
  ASSERT_TRUE(real.proc->wait_for_exit(20s)) << real.proc->result();
  EXPECT_EQ(*real.proc->exit_code(), 0) << real.proc->result();
}

}  // namespace
}  // namespace fencerun::test::admin
