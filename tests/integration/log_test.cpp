// --log-format json as scripts read it: every line one object with ts, level, event and msg;
// durations only as integer milliseconds in *_ms fields; the holder's pid and host apart.
#include <regex>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

class JsonLogTest : public FencerunTest {
 protected:
  // Checks every stderr line of a run; returns the events seen, in order.
  std::vector<std::string> check_lines(const std::string& err) {
    static const std::regex duration_text(R"(^-?\d+(ms|s|m|h)$)");
    std::vector<std::string> events;
    for (const auto& line : split_lines(err)) {
      if (line.empty()) continue;
      auto doc = parse_json(line);
      EXPECT_TRUE(doc.has_value() && doc->kind == Json::Kind::Object) << "not a JSON object: " << line;
      if (!doc) continue;
      for (const char* key : {"ts", "level", "event", "msg"})
        EXPECT_TRUE(doc->find(key) && doc->find(key)->as_string()) << key << " missing in " << line;
      for (const auto& [key, value] : doc->members) {
        if (key.ends_with("_ms")) {
          EXPECT_TRUE(value.kind == Json::Kind::Number && value.as_int()) << key << " is not an integer: " << line;
        }
        if (value.kind == Json::Kind::String) {
          EXPECT_FALSE(std::regex_match(value.text, duration_text)) << key << " holds a duration as text: " << line;
        }
      }
      if (auto e = doc->find("event")) events.push_back(e->as_string().value_or(""));
    }
    return events;
  }
  static bool has(const std::vector<std::string>& events, std::string_view e) {
    return std::find(events.begin(), events.end(), e) != events.end();
  }
};

TEST_F(JsonLogTest, EveryLineOfARunIsAnObjectWithDurationsInMilliseconds) {
  auto r = run(sh_args("json", "true", {"-vv", "--log-format", "json", "--ttl", "3s"}));
  ASSERT_EQ(r.exit_code, 0) << r;
  auto events = check_lines(r.err);
  for (const char* e : {"acquired", "started", "released"}) EXPECT_TRUE(has(events, e)) << e << "\n" << r.err;
  EXPECT_NE(r.err.find("\"ttl_ms\":3000"), std::string::npos) << r.err;
}

TEST_F(JsonLogTest, BusyNamesTheHoldersPidAndHostApart) {
  auto holder = start(sh_args("jbusy", kHoldUntilGo));
  pid_t pid = wait_pid("pid");
  (void)pid;
  auto r = run(sh_args("jbusy", "true", {"-v", "--log-format", "json"}));
  EXPECT_EQ(r.exit_code, 75) << r;
  auto events = check_lines(r.err);
  EXPECT_TRUE(has(events, "busy")) << r.err;
  EXPECT_NE(r.err.find("\"holder_pid\":" + std::to_string(holder->pid())), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\"holder_host\":\"" + hostname() + "\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\"ttl_ms\":"), std::string::npos) << r.err;
  touch("go");
  EXPECT_EQ(holder->wait_for_exit(10s), 0);
}

TEST_F(JsonLogTest, LeaseLossAndRetriesUseMillisecondFields) {
  auto lost = start(sh_args("jlost", kHoldUntilGo, {"-vv", "--log-format", "json", "--ttl", "1500ms"}));
  wait_pid("pid");
  redis().cmd({"DEL", lock_key("jlost")});
  EXPECT_EQ(lost->wait_for_exit(10s), 124) << lost->result();
  auto events = check_lines(lost->err());
  for (const char* e : {"lease_lost", "stopping", "command_stopped"}) EXPECT_TRUE(has(events, e)) << e << "\n" << lost->err();
  EXPECT_NE(lost->err().find("\"before_deadline_ms\":"), std::string::npos) << lost->err();

  auto down = run({"-r", "redis://127.0.0.1:" + std::to_string(unused_port()), "--wait", "500ms", "-v",
                   "--log-format", "json", "jdown", "--", "true"});
  EXPECT_EQ(down.exit_code, 69) << down;
  events = check_lines(down.err);
  EXPECT_TRUE(has(events, "redis_retry")) << down.err;
  EXPECT_TRUE(has(events, "redis_unavailable")) << down.err;
  EXPECT_NE(down.err.find("\"retry_in_ms\":"), std::string::npos) << down.err;
}

}  // namespace
}  // namespace fencerun::test

namespace fencerun::test {
namespace {

TEST_F(JsonLogTest, SaysWhichVariableChoseTheServer) {
  // $REDIS_URL is often an application's own: -v names it as the source.
  auto r = run({"-v", "urlsrc", "--", "true"}, {{"REDIS_URL", redis().url()}});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("using Redis at " + redis().url() + " (from $REDIS_URL)"), std::string::npos) << r;
  auto r2 = run({"-v", "urlsrc", "--", "true"}, {{"FENCERUN_REDIS_URL", redis().url()}, {"REDIS_URL", "redis://127.0.0.1:1"}});
  EXPECT_EQ(r2.exit_code, 0) << r2;
  EXPECT_EQ(r2.err.find("using Redis at"), std::string::npos) << "only $REDIS_URL is worth a line at -v\n" << r2;
}

}  // namespace
}  // namespace fencerun::test
