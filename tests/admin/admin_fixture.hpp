#pragma once
// The fixture of the admin tests (fencerun list, break, bump): the deployment fixture (a work dir,
// the real fencerun binary, Redis topologies started by the test) plus locks written straight into
// Redis in fencerun's format (value "OWNER TOKEN PID HOST" with PX, and the token counter), so that a
// thousand of them take one pipelined connection instead of a thousand fencerun runs, and readers of
// list's text and JSON output.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "deploy/deploy_support.hpp"
#include "support/json.hpp"

namespace fencerun::test::admin {

using deploy::Target;

// A lock written by the test: held (lock key with PX) or free (token counter only).
struct FakeLock {
  std::string name;
  std::string owner;  // 32 hex digits
  long long token = 0;
  long long pid = 0;
  std::string host = "fakehost";
  bool held = true;

  std::string value() const;  // "OWNER TOKEN PID HOST"
  std::string owner8() const { return owner.substr(0, 8); }
};

// lockNNNN with distinct owners (the first 8 hex digits are NNNN's), tokens and pids.
std::vector<FakeLock> numbered_locks(int n, const std::string& stem = "lock", long long token_base = 5'000'000);

// SET lock PX / SET token for every lock, on one connection to `t`; throws on an error reply.
void write_locks(const Target& t, const std::vector<FakeLock>& locks, long long px_ms = 300'000);

// Cluster hash slot of a key (CRC16/XMODEM of the hash tag, mod 16384), as Redis computes it.
int hash_slot(const std::string& key);

// One line of `fencerun list` text output that starts a lock (not indented).
struct ListedLock {
  std::string name;
  std::string line;
  std::vector<std::string> slot_lines;  // the indented "  slot N: ..." lines after it
};
// Lines in output order; throws on an indented line before any lock line.
std::vector<ListedLock> parse_list_text(const std::string& out);
// Names in output order.
std::vector<std::string> names_of(const std::vector<ListedLock>& v);
std::vector<std::string> names_of(const Json& array);  // the "lock" member of each element
// Names that occur more than once.
std::vector<std::string> duplicates(const std::vector<std::string>& names);

class AdminTest : public deploy::DeployTest {
 protected:
  // fencerun ARGS with stdin read from a file of `input`.
  RunResult run_with_stdin(std::vector<std::string> args, const std::string& input, Clock::duration timeout = 30s);
  // Holder of NAME whose command writes `id.env` ("SLOT OWNER TOKEN", its shell's pid in `id.pid`)
  // and runs until `id.go` exists. Returns once id.env was written; throws otherwise.
  struct Holder {
    std::unique_ptr<FencerunProcess> proc;
    int slot = -1;
    std::string owner;
    long long token = 0;
  };
  Holder start_holder(const std::string& url, const std::string& name, const std::string& id,
                      std::vector<std::string> options);
  void let_go(const std::string& id) { touch(id + ".go"); }
};

// "fencerun: MSG ..." on exactly one line of stderr.
::testing::AssertionResult one_line_error(const RunResult& r, const std::string& msg);

}  // namespace fencerun::test::admin
