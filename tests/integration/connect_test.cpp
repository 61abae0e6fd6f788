// Connecting: unix sockets, passwords from the URL and the environment, and failing fast with 69
// when Redis is unreachable or refuses us.
#include <map>

#include "fixture.hpp"

namespace fencerun::test {
namespace {

constexpr const char* kPassword = "s3cr3t-Pw";

class ConnectTest : public FencerunTest {};

class PasswordTest : public FencerunTest {
 protected:
  RedisOptions redis_options() const override {
    RedisOptions o;
    o.password = kPassword;
    return o;
  }
};

TEST_F(ConnectTest, UnixSocketUrl) {
  auto r = run({"-r", redis().unix_url(), "unixlock", "--", "sh", "-c",
                "echo $FENCERUN_TOKEN; echo $FENCERUN_REDIS_URL"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const auto lines = split_lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r;
  EXPECT_EQ(redis().get(token_key("unixlock")), lines[0]);
  EXPECT_NE(lines[1].find(redis().socket_path()), std::string::npos) << lines[1];
  EXPECT_FALSE(redis().exists(lock_key("unixlock")));
}

TEST_F(ConnectTest, UnixSocketWithDatabaseNumber) {
  auto r = run({"-r", redis().unix_url() + "?db=3", "dblock", "--", "true"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(redis().dbsize(), 0) << "keys were written to db 0";
  auto c = redis().cmd({"EVAL", "redis.call('SELECT', 3) return redis.call('DBSIZE')", "0"});
  EXPECT_EQ(c.integer, 3) << c.describe();  // the token counter and the record of the run (runs, ok)
}

TEST_F(ConnectTest, TcpUrlWithDatabaseNumber) {
  auto r = run({"-r", redis().url() + "/5", "dblock", "--", "true"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(redis().dbsize(), 0) << "keys were written to db 0";
  auto c = redis().cmd({"EVAL", "redis.call('SELECT', 5) return redis.call('DBSIZE')", "0"});
  EXPECT_EQ(c.integer, 3) << c.describe();  // the token counter and the record of the run (runs, ok)
}

TEST_F(ConnectTest, RedisDownGives69WithinTimeout) {
  const std::string dead = "redis://127.0.0.1:" + std::to_string(unused_port());
  auto r = run({"-r", dead, "--timeout", "1s", "down", "--", "touch", "ran"});
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_LT(r.elapsed, 2000ms) << "must give up within --timeout";
  EXPECT_FALSE(r.err.empty()) << "a message on stderr is expected";
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
}

TEST_F(ConnectTest, UnresponsiveRedisGives69WithinTimeout) {
  // A stopped server still accepts TCP connections (kernel backlog) but never answers.
  redis().freeze();
  auto r = run(sh_args("frozen", "touch ran", {"--timeout", "500ms"}), {}, 20s);
  redis().thaw();
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_GE(r.elapsed, 400ms) << r;
  EXPECT_LT(r.elapsed, 1500ms) << "must give up within --timeout (500ms): " << r;
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
}

TEST_F(ConnectTest, MissingUnixSocketGives69) {
  auto r = run({"-r", "unix://" + (dir() / "no.sock").string(), "--timeout", "1s", "x", "--", "true"});
  EXPECT_EQ(r.exit_code, 69) << r;
}

TEST_F(PasswordTest, PasswordFromUrl) {
  auto r = run({"-r", redis().url_with_password(), "pw", "--", "sh", "-c", "echo $FENCERUN_TOKEN"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(redis().get(token_key("pw")), trim(r.out));
  EXPECT_EQ(r.err.find(kPassword), std::string::npos) << "password leaked to stderr";
}

TEST_F(PasswordTest, PasswordFromUrlWithAclUser) {
  auto r = run({"-r", "redis://default:" + std::string(kPassword) + "@127.0.0.1:" +
                          std::to_string(redis().port()),
                "pwuser", "--", "true"});
  EXPECT_EQ(r.exit_code, 0) << r;
}

TEST_F(PasswordTest, PasswordFromFencerunRedisPassword) {
  auto r = run({"-r", redis().url(), "pwenv", "--", "true"}, {{"FENCERUN_REDIS_PASSWORD", kPassword}});
  EXPECT_EQ(r.exit_code, 0) << r;
}

TEST_F(PasswordTest, PasswordFromRediscliAuth) {
  auto r = run({"-r", redis().url(), "pwcli", "--", "true"}, {{"REDISCLI_AUTH", kPassword}});
  EXPECT_EQ(r.exit_code, 0) << r;
}

TEST_F(PasswordTest, UrlPasswordWinsOverEnvironment) {
  auto r = run({"-r", redis().url_with_password(), "pwprec", "--", "true"},
               {{"FENCERUN_REDIS_PASSWORD", "wrong"}, {"REDISCLI_AUTH", "wrong"}});
  EXPECT_EQ(r.exit_code, 0) << r;
  auto r2 = run({"-r", redis().url(), "pwprec", "--", "true"},
                {{"FENCERUN_REDIS_PASSWORD", kPassword}, {"REDISCLI_AUTH", "wrong"}});
  EXPECT_EQ(r2.exit_code, 0) << "FENCERUN_REDIS_PASSWORD wins over REDISCLI_AUTH: " << r2;
}

TEST_F(PasswordTest, ChildUrlCarriesNoPassword) {
  auto r = run({"-r", redis().url_with_password(), "pwchild", "--", "env"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::string url;
  for (const auto& line : split_lines(r.out))
    if (line.rfind("FENCERUN_REDIS_URL=", 0) == 0) url = line.substr(19);
  ASSERT_FALSE(url.empty()) << r.out;
  EXPECT_EQ(url.find(kPassword), std::string::npos) << url;
  EXPECT_NE(url.find("127.0.0.1:" + std::to_string(redis().port())), std::string::npos) << url;
  EXPECT_EQ(r.out.find(kPassword), std::string::npos)
      << "fencerun put the password into the child's environment:\n" << r.out;
}

// FENCERUN_* variables are fencerun's: the command does not get the password variable, and a
// fencerun inside the job reaches the server all the same (FENCERUN_CONNECTION_FD).
TEST_F(PasswordTest, PasswordVariableIsNotPassedOnButTheJobsFencerunConnects) {
  auto r = run({"-r", redis().url(), "pwinh", "--", "sh", "-c",
                "echo \"[$FENCERUN_REDIS_PASSWORD]\"; \"$0\" status pwinh >/dev/null; echo \"status=$?\"",
                fencerun_binary()},
               {{"FENCERUN_REDIS_PASSWORD", kPassword}});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "[]\nstatus=0\n") << r;
}

TEST_F(PasswordTest, WrongPasswordGives69Fast) {
  auto r = run({"-r", "redis://:wrong@127.0.0.1:" + std::to_string(redis().port()), "--timeout",
                "2s", "pwbad", "--", "touch", "ran"});
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_LT(r.elapsed, 1500ms) << "an auth error is not a reason to wait";
  EXPECT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find("wrong"), std::string::npos) << "password leaked to stderr";
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  EXPECT_EQ(redis().dbsize(), 0);

  auto r2 = run({"-r", redis().url(), "pwbad", "--", "touch", "ran"},
                {{"FENCERUN_REDIS_PASSWORD", "wrong-env-pw"}});
  EXPECT_EQ(r2.exit_code, 69) << r2;
  EXPECT_EQ(r2.err.find("wrong-env-pw"), std::string::npos) << "password leaked to stderr";
}

TEST_F(PasswordTest, MissingPasswordGives69) {
  auto r = run({"-r", redis().url(), "pwnone", "--", "touch", "ran"});
  EXPECT_EQ(r.exit_code, 69) << r;
  EXPECT_LT(r.elapsed, 1500ms);
  EXPECT_FALSE(std::filesystem::exists(file("ran")));
  auto s = run({"status", "-r", redis().url(), "pwnone"});
  EXPECT_EQ(s.exit_code, 69) << s;
}

TEST_F(PasswordTest, StatusWithPassword) {
  auto s = run({"status", "-r", redis().url(), "pwstat"}, {{"REDISCLI_AUTH", kPassword}});
  EXPECT_EQ(s.exit_code, 3) << s;
}

}  // namespace
}  // namespace fencerun::test
