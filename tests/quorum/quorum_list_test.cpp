// `fencerun list` in quorum mode against three independent servers: each lock once with the majority
// view (`on K of N servers`), a lock held on a minority shown as not held and disagreeing with each
// server's view, the servers that cannot be reached named on stderr (69 without a majority), --json
// and the pattern.
#include <algorithm>

#include "quorum_fixture.hpp"

namespace fencerun::test {
namespace {

constexpr int kFree = 3;
constexpr int kUnavailable = 69;

// Runs until `go` appears, recording its token in the file `token_file`.
std::string hold_until_go(const std::string& token_file) {
  return "echo \"$FENCERUN_TOKEN\" > " + token_file + "; while [ ! -e go ]; do sleep 0.02; done";
}

class QuorumListTest : public QuorumTest {
 protected:
  std::vector<std::string> list(std::vector<std::string> options = {}) {
    auto a = quorum(std::move(options));
    a.insert(a.begin(), "list");
    return a;
  }
  // Another client's lease on server `i` only (as one with another server list would leave).
  void hold_on_one_server(std::size_t i, const std::string& name) {
    ASSERT_TRUE(server(i).cmd({"SET", lock_key(name), "0123456789abcdef0123456789abcdef 5 1 elsewhere", "PX",
                               "60000"})
                    .ok());
  }
  // "held by pid P on HOST (owner O), token T, ttl Xms, on K of 3 servers, last token T" without the
  // pid, host, owner and ttl, which the test does not know: the line's start and end.
  static void expect_held_line(const std::string& out, const std::string& name, const std::string& token,
                               std::size_t servers) {
    const auto begin = out.find(name + ": held by pid ");
    ASSERT_NE(begin, std::string::npos) << out;
    const std::string line = out.substr(begin, out.find('\n', begin) - begin);
    EXPECT_NE(line.find(", token " + token + ", ttl "), std::string::npos) << line;
    EXPECT_TRUE(line.ends_with("ms, on " + std::to_string(servers) + " of 3 servers, last token " + token)) << line;
  }
};

TEST_F(QuorumListTest, ListsTheMajorityViewAndMarksADisagreement) {
  auto a = start(quorum_sh("qa", hold_until_go("token")));
  auto b = start(quorum_sh("qb", hold_until_go("token2")));
  const std::string ta = wait_line("token"), tb = wait_line("token2");
  ASSERT_TRUE(wait_until([&] { return holding("qa") == 3 && holding("qb") == 3; }, 5s));
  hold_on_one_server(0, "qm");

  auto r = run(list());
  EXPECT_EQ(r.exit_code, 0) << r;
  expect_held_line(r.out, "qa", ta, 3);
  expect_held_line(r.out, "qb", tb, 3);
  const std::string minority =
      "qm: not held by a majority (held on 1 of 3 servers), last token none, the servers disagree:\n"
      "  server 1 " + server(0).url() + ": held by pid 1 on elsewhere (owner 01234567), token 5, ttl ";
  EXPECT_NE(r.out.find(minority), std::string::npos) << r;
  EXPECT_NE(r.out.find("\n  server 2 " + server(1).url() + ": free, counter none\n  server 3 " + server(2).url() +
                       ": free, counter none\n"),
            std::string::npos)
      << r;
  EXPECT_LT(r.out.find("qa: "), r.out.find("qb: ")) << "sorted by name";
  EXPECT_LT(r.out.find("qb: "), r.out.find("qm: ")) << "sorted by name";
  EXPECT_EQ(std::ranges::count(r.out, '\n'), 2 + 4) << "qa, qb: one line each; qm: one and one per server\n" << r;
  EXPECT_EQ(r.err, "") << r;

  // The pattern selects by name on every server.
  auto p = run(list({"q[ab]"}));
  EXPECT_EQ(p.exit_code, 0) << p;
  EXPECT_EQ(std::ranges::count(p.out, '\n'), 2) << p;
  EXPECT_EQ(p.out.find("qm: "), std::string::npos) << p;
  auto m = run(list({"qm"}));
  EXPECT_EQ(m.exit_code, kFree) << "held by no majority\n" << m;
  EXPECT_TRUE(m.out.starts_with("qm: not held by a majority")) << m;

  auto j = run(list({"--json"}));
  EXPECT_EQ(j.exit_code, 0) << j;
  auto doc = parse_json(trim(j.out));
  ASSERT_TRUE(doc && doc->kind == Json::Kind::Array && doc->items.size() == 3) << j;
  const Json& qa = doc->items[0];
  EXPECT_EQ(qa.find("lock")->as_string(), "qa");
  EXPECT_TRUE(qa.find("held")->is_true());
  EXPECT_EQ(json_int(qa.find("held_on")), 3);
  EXPECT_EQ(json_int(qa.find("majority")), 2);
  EXPECT_EQ(json_int(qa.find("answered")), 3);
  EXPECT_TRUE(qa.find("agree")->is_true());
  EXPECT_EQ(json_int(qa.find("last_token")), parse_ll(ta));
  ASSERT_EQ(qa.find("holders")->items.size(), 1u);
  EXPECT_EQ(json_int(qa.find("holders")->items[0].find("token")), parse_ll(ta));
  const Json* servers = qa.find("servers");
  ASSERT_TRUE(servers && servers->items.size() == 3) << j;
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(servers->items[i].find("url")->as_string(), server(i).url());
    EXPECT_TRUE(servers->items[i].find("held")->is_true());
    EXPECT_EQ(json_int(servers->items[i].find("counter")), parse_ll(ta));
  }
  const Json& qm = doc->items[2];
  EXPECT_EQ(qm.find("lock")->as_string(), "qm");
  EXPECT_FALSE(qm.find("held")->is_true());
  EXPECT_EQ(json_int(qm.find("held_on")), 1);
  EXPECT_FALSE(qm.find("agree")->is_true());
  EXPECT_TRUE(qm.find("holders")->items.empty());
  EXPECT_TRUE(qm.find("servers")->items[0].find("held")->is_true());
  EXPECT_FALSE(qm.find("servers")->items[1].find("held")->is_true());

  // Released: only --all lists the free locks with a token history; the minority holder still shows.
  touch("go");
  ASSERT_EQ(a->wait_for_exit(10s), 0) << a->result();
  ASSERT_EQ(b->wait_for_exit(10s), 0) << b->result();
  auto f = run(list());
  EXPECT_EQ(f.exit_code, kFree) << f;
  EXPECT_TRUE(f.out.starts_with("qm: not held by a majority")) << f;
  auto all = run(list({"--all"}));
  EXPECT_EQ(all.exit_code, kFree) << all;
  // Each with its last run (the record every server keeps): ok, some milliseconds ago.
  const auto lines = split_lines(all.out);
  ASSERT_GE(lines.size(), 3u) << all;
  EXPECT_TRUE(lines[0].starts_with("qa: free on 3 of 3 servers, last token " + ta + ", last run ok ")) << all;
  EXPECT_TRUE(lines[1].starts_with("qb: free on 3 of 3 servers, last token " + tb + ", last run ok ")) << all;
  EXPECT_TRUE(lines[2].starts_with("qm: not held by a majority")) << all;
}

TEST_F(QuorumListTest, AServerThatCannotBeReachedIsNamedAndTheOthersListed) {
  auto holder = start(quorum_sh("down", hold_until_go("token"), {"--ttl", "30s"}));
  const std::string token = wait_line("token");
  ASSERT_TRUE(wait_until([&] { return holding("down") == 3; }, 5s));
  server(1).stop();
  auto r = run(list({"--timeout", "500ms"}));
  EXPECT_EQ(r.exit_code, 0) << "a majority answered\n" << r;
  expect_held_line(r.out, "down", token, 2);
  EXPECT_EQ(std::ranges::count(r.out, '\n'), 1) << "the servers that answered agree\n" << r;
  EXPECT_NE(r.err.find("cannot use Redis at " + server(1).url() + ": "), std::string::npos) << r;
  EXPECT_EQ(r.err.find(server(0).url()), std::string::npos) << r;

  auto j = run(list({"--timeout", "500ms", "--json"}));
  EXPECT_EQ(j.exit_code, 0) << j;
  auto doc = parse_json(trim(j.out));
  ASSERT_TRUE(doc && doc->items.size() == 1) << j;
  EXPECT_EQ(json_int(doc->items[0].find("held_on")), 2);
  EXPECT_EQ(json_int(doc->items[0].find("answered")), 2);
  const Json& down = doc->items[0].find("servers")->items[1];
  EXPECT_FALSE(down.find("available")->is_true()) << j;
  EXPECT_TRUE(down.find("error")->as_string().has_value()) << j;

  // Two of three down: what the last one says, and 69.
  server(2).stop();
  auto u = run(list({"--timeout", "500ms"}));
  EXPECT_EQ(u.exit_code, kUnavailable) << u;
  EXPECT_EQ(u.out, "down: unknown: 1 of 3 servers answered, last token " + token + "\n") << u;
  EXPECT_NE(u.err.find("cannot use Redis at " + server(1).url()), std::string::npos) << u;
  EXPECT_NE(u.err.find("cannot use Redis at " + server(2).url()), std::string::npos) << u;
  EXPECT_NE(u.err.find("only 1 of 3 servers answered: no majority view"), std::string::npos) << u;
  touch("go");
  holder->wait_for_exit(40s);
}

}  // namespace
}  // namespace fencerun::test
