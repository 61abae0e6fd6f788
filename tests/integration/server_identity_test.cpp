// The server the tests start is the one they are meant to test: with the server matrix's
// FENCERUN_TEST_SERVER_ID, the id's server (not the default redis-server); without it, the default.
#include <gtest/gtest.h>

#include "support/redis_server.hpp"
#include "support/server_under_test.hpp"

namespace fencerun::test {
namespace {

// hiredis 0.14 speaks RESP2 only: HELLO 2 answers with the server's name and version.
TEST(ServerUnderTest, AnswersHelloWithTheNameAndVersionOfItsProgramAndId) {
  RedisServer redis;
  EXPECT_TRUE(is_server_under_test(redis.cmd({"HELLO", "2"})));
}

}  // namespace
}  // namespace fencerun::test
