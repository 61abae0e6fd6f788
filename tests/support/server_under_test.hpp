#pragma once
// The server the tests start: Debian 12's redis-server by default, or the server matrix's
// FENCERUN_TEST_SERVER_ID ("valkey-9"), looked up in the registry tests/servers/prepare writes.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "support/redis_server.hpp"

namespace fencerun::test {

struct ServerUnderTest {
  std::string id;        // FENCERUN_TEST_SERVER_ID; empty for the default server
  std::string name;      // as the program reports it: "redis", "valkey"
  std::string version;   // "9.1.2"
  std::string server;    // the program that starts a server
  std::string sentinel;  // the program that starts a sentinel (with --sentinel)

  std::string describe() const;  // "valkey 9.1.2 (valkey-9)"
};

// The server of this test run. The first call prints "server under test: ..." once. Skips the
// running test when it cannot be had: no redis-server for the default, an id that is not prepared
// ("valkey-9 not prepared: run tests/servers/prepare") or that the registry names as missing (with
// the reason tests/servers/prepare gave).
const ServerUnderTest& server_under_test();

// A field of a HELLO 2 reply (flat [key, value, ...] array): "server", "version", "mode"; empty
// when absent.
std::string hello_field(const Reply& hello, std::string_view key);

// Whether a HELLO reply (of a server or a sentinel) comes from the server under test: its `server`
// and `version` fields are the ones the program reports with --version, and a matrix id names that
// server and the start of that version ("valkey-9": valkey 9.x).
::testing::AssertionResult is_server_under_test(const Reply& hello);

}  // namespace fencerun::test
