// The fixture itself, checked with etcdctl only: a 3-member cluster becomes healthy with one leader,
// a killed leader is replaced and comes back on its data dir, a frozen member is thawed, keys and
// leases are seen, TLS and auth clusters answer only with their credentials.
#include <gtest/gtest.h>

#include "etcd_fixture.hpp"

namespace fencerun::test {
namespace {

class EtcdClusterTest : public EtcdOwnTest {};

TEST_F(EtcdClusterTest, ThreeMembersOneLeaderKeysAndLeases) {
  auto& e = etcd();
  ASSERT_EQ(e.size(), 3);
  const std::string url = e.url();
  EXPECT_TRUE(url.starts_with("etcd://127.0.0.1:")) << url;
  EXPECT_EQ(url.find(' '), std::string::npos) << url;
  EXPECT_EQ(url, "etcd://" + e.endpoint(0) + "," + e.endpoint(1) + "," + e.endpoint(2));
  for (int i = 0; i < 3; ++i) {
    EXPECT_LT(e.client_port(i), 32768);
    EXPECT_LT(e.peer_port(i), 32768);
  }
  // One cluster: the member list seen from any member has the three members.
  for (int i = 0; i < 3; ++i) {
    auto r = e.etcdctl({"member", "list"}, e.client_url(i));
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_EQ(split_lines(trim(r.out)).size(), 3u) << r.out;
  }
  const int l = e.leader();
  ASSERT_GE(l, 0);

  e.etcdctl_ok({"put", "fencerun:{x}:base", "17"});
  auto lease = e.etcdctl_ok({"lease", "grant", "30"});  // "lease 694d7a... granted with TTL(30s)"
  auto words = split_lines(lease);
  ASSERT_FALSE(words.empty());
  std::string id = words[0].substr(6, words[0].find(' ', 6) - 6);
  e.etcdctl_ok({"put", "fencerun:{x}:wait/" + id, "o 1 h", "--lease=" + id});
  EXPECT_EQ(e.keys("fencerun:{x}:"), (std::vector<std::string>{"fencerun:{x}:base", "fencerun:{x}:wait/" + id}));
  EXPECT_EQ(e.leases(), std::vector<std::string>{id});
  EXPECT_EQ(e.get("fencerun:{x}:base"), "17");
  EXPECT_EQ(e.get("fencerun:{x}:nothing"), std::nullopt);
  e.etcdctl_ok({"lease", "revoke", id});
  EXPECT_EQ(e.keys("fencerun:{x}:wait/"), std::vector<std::string>{});
  EXPECT_TRUE(e.leases().empty());
}

TEST_F(EtcdClusterTest, KillRestartFreezeThaw) {
  auto& e = etcd();
  const int old = e.leader();
  ASSERT_GE(old, 0);
  e.etcdctl_ok({"put", "k", "before"});
  e.kill(old);
  EXPECT_FALSE(e.running(old));
  const int next = e.wait_for_new_leader(old);
  ASSERT_GE(next, 0);
  ASSERT_NE(next, old);
  e.etcdctl_ok({"put", "k", "during"});
  e.restart(old);
  EXPECT_TRUE(e.running(old));
  ASSERT_TRUE(e.wait_healthy(10s));
  EXPECT_TRUE(wait_until([&] { return trim(e.etcdctl({"get", "k", "--print-value-only"}, e.client_url(old)).out) == "during"; }, 5s))
      << "the restarted member did not catch up";

  const int l = e.leader();
  ASSERT_GE(l, 0);
  e.freeze(l);
  EXPECT_TRUE(e.frozen(l));
  EXPECT_EQ(process_state(e.pid(l)).value_or('?'), 'T');
  EXPECT_GE(e.wait_for_new_leader(l), 0);
  e.thaw(l);
  EXPECT_FALSE(e.frozen(l));
  EXPECT_TRUE(e.wait_healthy(10s));
}

TEST(EtcdClusterOne, SingleMember) {
  if (auto why = EtcdCluster::missing(); !why.empty()) GTEST_SKIP() << why;
  EtcdOptions o;
  o.members = 1;
  EtcdCluster e(o);
  EXPECT_EQ(e.leader(), 0);
  EXPECT_EQ(e.url(), "etcd://" + e.endpoint(0));
}

class EtcdClusterTlsAuthTest : public EtcdOwnTest {
  EtcdOptions cluster_options() const override {
    EtcdOptions o;
    o.tls = true;
    o.root_password = "s3cret";
    return o;
  }
};

TEST_F(EtcdClusterTlsAuthTest, AnswersOnlyWithCaAndPassword) {
  auto& e = etcd();
  EXPECT_TRUE(e.url().starts_with("etcds://127.0.0.1:")) << e.url();
  EXPECT_TRUE(e.client_url(0).starts_with("https://"));
  e.etcdctl_ok({"put", "a", "1"});
  // Without the password: refused.
  auto r = run_program({"etcdctl", "--endpoints=" + e.client_url(0), "--cacert=" + e.certs().ca_crt.string(),
                        "--dial-timeout=2s", "--command-timeout=2s", "put", "a", "2"});
  EXPECT_NE(r.exit_code, 0) << r;
  // Wrong CA: refused.
  r = run_program({"etcdctl", "--endpoints=" + e.client_url(0), "--cacert=" + e.certs().other_ca_crt.string(),
                   "--user=root:s3cret", "--dial-timeout=2s", "--command-timeout=2s", "get", "a"});
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_EQ(e.get("a"), "1");
  EXPECT_EQ(e.url_with_user("root:s3cret"), "etcds://root:s3cret@" + e.endpoint(0) + "," + e.endpoint(1) + "," + e.endpoint(2));
}

}  // namespace
}  // namespace fencerun::test

namespace fencerun::test {
namespace {

// The checker of the mutual-exclusion log the etcd tests use.
TEST(EtcdSectionCheck, CountsOverlapsEqualTokensAndRegressions) {
  auto ok = check_sections("start 5\nend 5\nstart 7\nend 7\n");
  EXPECT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(ok.acquisitions, 2);
  auto overlap = check_sections("start 5\nstart 7\nend 5\nend 7\n");
  EXPECT_GE(overlap.overlaps, 1) << overlap;
  auto equal = check_sections("start 5\nend 5\nstart 5\nend 5\n");
  EXPECT_EQ(equal.equal, 1) << equal;
  auto back = check_sections("start 7\nend 7\nstart 5\nend 5\n");
  EXPECT_EQ(back.regressions, 1) << back;
  // Every section must end before the next starts, one fencerun stopped (124) too.
  auto no_end = check_sections("start 5\nstart 7\nend 7\n");
  EXPECT_EQ(no_end.overlaps, 1) << no_end;
  // "start T PID": the pid of the section's command (SectionWatcher follows it).
  auto with_pids = check_sections("start 5 100\nend 5\nstart 7 101\nend 7\n");
  EXPECT_TRUE(with_pids.ok()) << with_pids;
  EXPECT_EQ(check_sections("start x\n").malformed, 1);
  EXPECT_EQ(check_sections("end 5 100\n").malformed, 1);
}

// A section whose command is killed before it writes its end gets its end from the watcher, at its
// death: before the next start.
TEST(EtcdSectionCheck, WatcherWritesTheEndOfAKilledSection) {
  TempDir dir("sections");
  const auto log = dir / "log";
  SectionWatcher watcher(log);
  Process killed({"/bin/sh", "-c", "echo \"start 5 $$\" >> '" + log.string() + "'; exec sleep 30"});
  ASSERT_TRUE(wait_until([&] { return watcher.following() == 1; }, 10s, 1ms)) << read_file(log).value_or("");
  ASSERT_TRUE(killed.signal(SIGKILL));
  ASSERT_TRUE(wait_until([&] { return read_file(log).value_or("").find("end 5") != std::string::npos; }, 10s, 1ms))
      << read_file(log).value_or("");
  write_file(log, read_file(log).value_or("") + "start 7\nend 7\n");
  EXPECT_EQ(watcher.finish(), 1);
  auto check = check_sections(read_file(log).value_or(""));
  EXPECT_TRUE(check.ok()) << check;
  EXPECT_EQ(check.acquisitions, 2) << check;
}

// descendants() finds a child's children.
TEST(EtcdSectionCheck, DescendantsOfAProcess) {
  TempDir d("desc");
  SpawnOptions so;
  so.cwd = d.path();
  Process p({"sh", "-c", "sleep 30 & echo $! > gpid; wait"}, so);
  auto g = wait_for_pid_file(d / "gpid", 10s);
  ASSERT_TRUE(g.has_value());
  auto ds = descendants(p.pid());
  EXPECT_NE(std::find(ds.begin(), ds.end(), *g), ds.end());
  kill_if_alive(*g);
}

}  // namespace
}  // namespace fencerun::test
