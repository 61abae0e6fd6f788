// The guards as a user types them: global options before `fence` (`fencerun -q fence file`,
// `fencerun -r URL fence redis`, `fencerun -v fence sql`), guarding for real; and `fence redis`
// inside a run's job reaching the run's server with the run's password (in the URL) or its private
// CA, neither of which is in the job's environment or command line.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "deploy_support.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/util.hpp"

namespace fencerun::test::fence {
namespace {

RunResult run_in(const TempDir& dir, std::vector<std::string> args, EnvList env = {}, const char* stdin_text = nullptr) {
  SpawnOptions o;
  o.env = std::move(env);
  o.env.emplace_back("JOBDIR", dir.str());
  o.cwd = dir.path();
  if (stdin_text) {
    write_file(dir / "stdin", stdin_text);
    o.stdin_file = dir / "stdin";
  }
  return run_fencerun(std::move(args), o, 30s);
}

TEST(NestedGuard, GlobalOptionsBeforeFenceFileGuardForReal) {
  TempDir dir("nested");
  const std::string path = (dir / "state").string();
  auto first = run_in(dir, {"-q", "fence", "file", path}, {{"FENCERUN_TOKEN", "5"}}, "five\n");
  ASSERT_EQ(first.exit_code, 0) << first;
  EXPECT_EQ(read_file(path), "five\n");
  auto stale = run_in(dir, {"-q", "fence", "file", path}, {{"FENCERUN_TOKEN", "4"}}, "four\n");
  EXPECT_EQ(stale.exit_code, 77) << stale;
  EXPECT_EQ(read_file(path), "five\n") << "a stale write landed";
  // The option must be one the guard takes, wherever it stands.
  auto wrong = run_in(dir, {"--ttl", "5s", "fence", "file", path}, {{"FENCERUN_TOKEN", "6"}}, "six\n");
  EXPECT_EQ(wrong.exit_code, 64) << wrong;
  EXPECT_EQ(read_file(path), "five\n");
}

TEST(NestedGuard, GlobalOptionsBeforeFenceRedisGuardForReal) {
  TempDir dir("nested");
  RedisServer redis;
  auto ok = run_in(dir, {"-r", redis.url(), "fence", "redis", "--resource", "r", "--token", "9", "--", "SET", "{r}:k", "v9"});
  ASSERT_EQ(ok.exit_code, 0) << ok;
  EXPECT_EQ(redis.get("{r}:k"), "v9");
  auto stale = run_in(dir, {"-r", redis.url(), "-v", "fence", "redis", "--resource", "r", "--token", "8", "--", "SET",
                            "{r}:k", "v8"});
  EXPECT_EQ(stale.exit_code, 77) << stale;
  EXPECT_EQ(redis.get("{r}:k"), "v9");
}

TEST(NestedGuard, GlobalOptionsBeforeFenceSqlGiveASchemaThatRejectsAStaleToken) {
  TempDir dir("nested");
  auto plain = run_in(dir, {"fence", "sql", "sqlite"});
  auto verbose = run_in(dir, {"-v", "fence", "sql", "sqlite"});
  ASSERT_EQ(plain.exit_code, 0) << plain;
  EXPECT_EQ(verbose.exit_code, 0) << verbose;
  EXPECT_EQ(verbose.out, plain.out);
  EXPECT_NE(plain.out.find("fencerun_admit"), std::string::npos);
  // The schema printed that way guards for real: a stale token is refused by the database.
  if (!std::filesystem::exists("/usr/bin/sqlite3")) GTEST_SKIP() << "sqlite3 not found";
  write_file(dir / "schema.sql", verbose.out);
  const std::string db = (dir / "app.db").string();
  auto load = run_program({"sqlite3", "-bail", db, ".read " + (dir / "schema.sql").string()});
  ASSERT_EQ(load.exit_code, 0) << load;
  auto admit = [&](const char* token) {
    return run_program({"sqlite3", "-bail", db,
                        std::string("BEGIN IMMEDIATE; INSERT INTO fencerun_admit VALUES ('r', ") + token + "); COMMIT;"});
  };
  EXPECT_EQ(admit("5").exit_code, 0);
  auto stale = admit("4");
  EXPECT_NE(stale.exit_code, 0) << stale;
  EXPECT_NE(stale.err.find("stale token"), std::string::npos) << stale;
}

// A script for the job: the nested guard, then what the job can see of the run.
const char* const k_job =
    "\"$NESTED_FENCERUN\" fence redis -- SET \"{nested}:k\" \"$FENCERUN_TOKEN\" && "
    "\"$NESTED_FENCERUN\" fence redis --token 1 -- SET \"{nested}:k\" stale; echo \"stale=$?\"; "
    "env > \"$JOBDIR/job.env\"; cat /proc/$$/cmdline > \"$JOBDIR/job.cmdline\"";

TEST(NestedGuard, InsideAJobReachesTheRunsServerWithThePasswordOfItsUrl) {
  TempDir dir("nested");
  RedisOptions ro;
  ro.password = "nested-s3cret";
  RedisServer redis(ro);
  auto r = run_in(dir, {"-r", redis.url_with_password(), "nested", "--", "sh", "-c", k_job},
                  {{"NESTED_FENCERUN", fencerun_binary()}});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("stale=77"), std::string::npos) << r;
  auto token = redis.get("{nested}:k");
  ASSERT_TRUE(token) << r;
  EXPECT_NE(*token, "stale");
  // The password is in neither the job's environment nor its command line, nor in any log.
  EXPECT_EQ(read_file(dir / "job.env").value_or("").find("nested-s3cret"), std::string::npos);
  EXPECT_EQ(read_file(dir / "job.cmdline").value_or("").find("nested-s3cret"), std::string::npos);
  EXPECT_EQ(r.err.find("nested-s3cret"), std::string::npos) << r;
}

TEST(NestedGuard, InsideAJobReachesTheRunsTlsServerWithItsPrivateCa) {
  if (!deploy::program_usable(deploy::openssl_program())) GTEST_SKIP() << "openssl not found";
  TempDir dir("nested");
  TempDir certs_dir("certs");
  const deploy::Certs certs = deploy::make_certs(certs_dir.path());
  deploy::TlsRedisServer server(certs, /*auth_clients=*/true);
  const std::string url = "rediss://127.0.0.1:" + std::to_string(server.tls_port());
  // Relative TLS paths: the job runs elsewhere (cd /), the shared settings are absolute.
  std::filesystem::copy_file(certs.ca_crt, dir / "ca.pem");
  std::filesystem::copy_file(certs.client_crt, dir / "client.pem");
  std::filesystem::copy_file(certs.client_key, dir / "client.key");
  const std::string job = std::string("cd / && ") + k_job;
  auto r = run_in(dir,
                  {"-r", url, "--tls-ca-file", "ca.pem", "--tls-cert", "client.pem", "--tls-key", "client.key", "tlsnested",
                   "--", "sh", "-c", job},
                  {{"NESTED_FENCERUN", fencerun_binary()}});
  ASSERT_EQ(r.exit_code, 0) << r << server.log();
  EXPECT_NE(r.out.find("stale=77"), std::string::npos) << r;
  auto token = server.cmd({"GET", "{nested}:k"});
  EXPECT_NE(token.str, "stale");
  EXPECT_FALSE(token.str.empty());
  // Without the shared connection (a process that closed it), the guard has only the URL: refused.
  auto closed = run_in(dir,
                       {"-r", url, "--tls-ca-file", "ca.pem", "--tls-cert", "client.pem", "--tls-key", "client.key",
                        "tlsnested2", "--", "sh", "-c", "eval \"exec $FENCERUN_CONNECTION_FD<&-\"; "
                        "\"$NESTED_FENCERUN\" fence redis -- SET \"{nested}:k2\" x"},
                       {{"NESTED_FENCERUN", fencerun_binary()}});
  EXPECT_EQ(closed.exit_code, 69) << closed;
}

}  // namespace
}  // namespace fencerun::test::fence
