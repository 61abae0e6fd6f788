#pragma once
// The fixture of the --limit tests: the hand-over fixture (a redis-server of the test's own, the real
// fencerun binary started in the test's temp dir, queue helpers) plus what a counting lock needs:
// slot keys, holders that report the slot and token fencerun gave them, shell loops that run fencerun
// many times (in a session of their own, killed as a group when the test ends), and the probe command
// (limit_probe.c) that records enter/exit times on CLOCK_MONOTONIC.
#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "handover/handover_fixture.hpp"

namespace fencerun::test::limit {

using handover::join;

// What a holder's command saw: FENCERUN_SLOT, FENCERUN_TOKEN, FENCERUN_LIMIT, its own pid ($$) and
// FENCERUN_OWNER.
struct Held {
  int slot = -1;
  long long token = 0;
  long long limit = 0;
  pid_t cmd_pid = -1;
  std::string owner;
};

// The limit_probe helper built next to the tests.
const char* probe_binary();

class LimitTest : public handover::HandoverTest {
 protected:
  void TearDown() override;

  static std::string slot_key(const std::string& name, int slot) { return key(name, "slot:" + std::to_string(slot)); }
  // --limit N plus `more`.
  static std::vector<std::string> limit_opts(int n, std::vector<std::string> more = {"--ttl", "30s"});

  // Shell that writes `id.env` (see Held) from the command's environment.
  static std::string report_script(const std::string& id);
  // The command of a holder `id`: writes `id.env`, then runs until the file `id.go` appears.
  static std::string holder_script(const std::string& id);
  // A holder of NAME started with `options` (which include --limit): returns once its command has
  // written `id.env`; `held` receives what it saw. Throws when it never did.
  std::unique_ptr<FencerunProcess> start_slot_holder(const std::string& name, const std::string& id,
                                                     std::vector<std::string> options, Held* held = nullptr);
  // What holder `id` wrote to `id.env`, once it did; nullopt after the timeout or when malformed.
  std::optional<Held> held(const std::string& id, Clock::duration timeout = 10s);
  // Lets holder `id` end (touches `id.go`).
  void release(const std::string& id) { touch(id + ".go"); }

  // fencerun ARGS... to completion, in the test's temp dir (no -r added).
  RunResult run(std::vector<std::string> args, Clock::duration timeout = 30s);
  // fencerun -r URL OPTIONS NAME -- sh -c SCRIPT to completion, in the test's temp dir.
  RunResult run_sh(const std::string& name, const std::string& script, std::vector<std::string> options,
                   Clock::duration timeout = 30s);

  // `sh -c SCRIPT` in a session (and process group) of its own, in the test's temp dir; the group is
  // SIGKILLed when the test ends, so that fencerun runs a loop started are not left behind.
  std::unique_ptr<Process> start_group(const std::string& script);

  // SIGKILL to a holder's fencerun and to its command (and the command's group when it leads one).
  void kill_holder(Process& fencerun, const Held& h);

  // The lock value stored in a slot key (nullopt: no such key).
  std::optional<std::string> value(const std::string& k) { return redis().get(k); }

  SpawnOptions in_dir() const;

 private:
  std::vector<pid_t> groups_;
};

}  // namespace fencerun::test::limit
