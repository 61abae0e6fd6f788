#pragma once
// The lease operations on Redis (acquire + token, renew, release, leave the queue), each one round
// trip: LockOps, with LeaseClient for the plain lock and SlotsClient (slots_client.hpp) for a counting
// lock of N slots. Knows nothing of processes. Scripts run with EVALSHA and fall back to EVAL on
// NOSCRIPT.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lease/lease.hpp"
#include "lease/types.hpp"
#include "backends/redis/client.hpp"
#include "util/clock.hpp"

namespace fencerun::lease {

struct LockKeys {
  std::string lock;     // <prefix>{NAME}:lock
  std::string token;    // <prefix>{NAME}:token
  std::string queue;    // <prefix>{NAME}:queue    waiters (owner ids) by ticket
  std::string tickets;  // <prefix>{NAME}:tickets  ticket counter
  std::string turn;     // <prefix>{NAME}:turn     the waiter woken to take the free lock
  std::string wake;     // <prefix>{NAME}:wake:    + owner id: the channel each waiter listens on
  std::string limit;    // <prefix>{NAME}:limit    a counting lock's N, while a slot is held
  std::string slots;    // <prefix>{NAME}:slot:    + I: slot I of a counting lock
  std::string turns;    // <prefix>{NAME}:turns    a counting lock's waiters woken to take a free slot
  std::string runs_base;  // <prefix>{NAME}:      the run records' keys: run, ok, runs (scripts/_runs.lua)
  std::string run() const { return runs_base + "run"; }
  std::string last_ok() const { return runs_base + "ok"; }
  std::string runs() const { return runs_base + "runs"; }
  std::string wake_channel(std::string_view owner) const { return wake + std::string(owner); }
  std::string slot(long i) const { return slots + std::to_string(i); }
};
LockKeys keys_for(std::string_view prefix, std::string_view name);


// A waiter woken to take the free lock has this long to come for it; then a fair waiter behind it
// takes its place (see _queue.lua).
inline constexpr std::chrono::milliseconds k_turn{3000};

// How an acquire attempt stands towards the wait queue. `queued`: the caller listens on its wake
// channel, so it joins the queue (or keeps its place) when the lock is busy. `fair`: a free lock goes
// to the first waiter only.
struct Queueing {
  bool fair = false;
  bool queued = false;
  std::optional<std::uint64_t> fired_us;  // the trigger's fire time, once a first reply told it
};
// The lock is held with another --limit: `held` is that limit (1 for the plain lock).
struct LimitMismatch {
  long held = 0;
};
using AcquireResult = std::variant<Acquired, Busy, LimitMismatch, Skipped, RuleMismatch>;

// How many replicas must confirm an acquisition (WAIT), and for how long to wait for them.
struct ReplicaAck {
  int replicas = 0;
  std::chrono::milliseconds timeout{0};
};

// What the acquire and release scripts need to keep the record of runs, and --min-interval (ms, 0:
// none). `run` is filled in at release.
struct RecordArgs {
  RecordSettings settings;
  long long min_interval_ms = 0;
  std::string version;
  long long every_ms = 0;        // --every (0: none)
  long long slot_offset_ms = 0;  // --slot-offset
  std::string rule;              // schedule_rule() ("" none)
  bool skip_if_record_lost = false;  // --if-record-lost skip
};

// The record a release writes, as release.lua (ARGV 4 on), record.lua and slots_release.lua take it:
// the key base, outcome, exit code, signal, records' TTL, runs kept, `start` (server time; "" in quorum
// mode: each server's own), token, pid and host (from the lock `value`), fencerun's version, the run's
// duration so far for a server without a start ("" here; quorum mode fills it in) and how long the
// command ran ("" unknown).
std::vector<std::string> record_release_args(const LockKeys& keys, const RecordArgs& records,
                                             const RunOutcome& outcome, std::string_view start, std::uint64_t token,
                                             std::string_view value, std::string_view fired = {});

// The run in progress as the record keeps it ("<owner> <start us> <token> <pid> <host> <version>
// [<fire us>]", scripts/_runs.lua), as a record of outcome "running"; nullopt when malformed.
// `owner`, when given, is set to its owner id (quorum mode: is it the holder's run?).
std::optional<RunRecord> parse_run_in_progress(std::string_view value, std::string* owner = nullptr);

// Decodes an acquire script's reply (acquired, busy, or held with another limit); `sent` goes into
// Acquired. A protocol error when the reply does not have the script's shape.
redis::Result<AcquireResult> parse_acquire_reply(const redis::Reply& reply, Deadline sent);


// What NAME's keys say: its holders (a plain lock or the slots of a counting one), waiters and last
// token. Two round trips for a counting lock, one otherwise.
redis::Result<LockStatus> lock_status(redis::Client& client, const LockKeys& keys, Deadline deadline);

// bump: raises NAME's token counter to at least `above` (never lowers it).
redis::Result<Bumped> bump_counter(redis::Client& client, const LockKeys& keys, std::uint64_t above, Deadline deadline);

// break: releases the lease of the holder whose owner id is `owner` (a plain lock, or the slot of a
// counting lock of `limit` slots that holds it), owner-checked, and wakes the waiters as its own
// release would. false: that holder held nothing any more.
redis::Result<bool> release_holder(redis::Client& client, const LockKeys& keys, long limit, std::string_view owner,
                                   Deadline deadline);


// The operations a lease runs on its server.
class LockOps : public Renewer {
 public:
  virtual const LockKeys& keys() const = 0;
  virtual redis::Client& client() = 0;
  // One attempt: acquire with `ttl` and issue a token, or report the holder. With ack.replicas > 0 the
  // reply also says how many replicas confirmed it (the request may take ack.timeout longer).
  virtual redis::Result<AcquireResult> try_acquire(std::string_view owner, std::chrono::milliseconds ttl, long pid,
                                                   std::string_view host, const ReplicaAck& ack,
                                                   const Queueing& queueing, Deadline deadline) = 0;
  // A waiter gives up its place in the queue (the next one takes it).
  virtual redis::Result<void> leave_queue(std::string_view owner, Deadline deadline) = 0;
  // One owner-checked renewal (Renewer::renew, in Redis's errors; renew() gives the seam's).
  virtual redis::Result<RenewOutcome> renew_once(std::string_view value, std::chrono::milliseconds ttl,
                                                 Deadline deadline, Deadline& sent) = 0;
  Result<RenewOutcome> renew(std::string_view value, std::chrono::milliseconds ttl, Deadline deadline,
                             Deadline& sent) final {
    return redis::to_lease(renew_once(value, ttl, deadline, sent));
  }
  // The record of runs: kept by the acquire and release scripts from now on (the plain lock's only).
  virtual void keep_records(RecordArgs args) { (void)args; }
  // Counts a trigger that ends without running ("skip" or "busy") for the slot starting at `slot_us`
  // (note.lua), where records are kept.
  virtual redis::Result<void> note_trigger(std::string_view kind, std::uint64_t slot_us, std::string_view host,
                                           Deadline deadline) {
    (void)kind, (void)slot_us, (void)host, (void)deadline;
    return {};
  }
  // release() that also writes the run's record (with `value` and `outcome`, when records are kept).
  virtual redis::Result<bool> release_recorded(std::string_view owner, std::string_view value,
                                               const Acquired& acquired, const RunOutcome& outcome,
                                               Deadline deadline) {
    (void)acquired, (void)outcome;
    return release(owner, value, deadline);
  }
  // Owner-checked compare-and-delete. true: deleted; false: it was not ours any more. `value` is the
  // full value when known; without it the owner id (the value's first word) decides.
  virtual redis::Result<bool> release(std::string_view owner, std::optional<std::string_view> value,
                                      Deadline deadline) = 0;
};

// The plain lock: one key, <prefix>{NAME}:lock.
class LeaseClient final : public LockOps {
 public:
  LeaseClient(redis::Client& client, LockKeys keys) : m_client(client), m_keys(std::move(keys)) {}

  const LockKeys& keys() const override { return m_keys; }
  redis::Client& client() override { return m_client; }

  redis::Result<AcquireResult> try_acquire(std::string_view owner, std::chrono::milliseconds ttl, long pid,
                                           std::string_view host, const ReplicaAck& ack, const Queueing& queueing,
                                           Deadline deadline) override;
  redis::Result<void> leave_queue(std::string_view owner, Deadline deadline) override;
  redis::Result<RenewOutcome> renew_once(std::string_view value, std::chrono::milliseconds ttl, Deadline deadline,
                                         Deadline& sent) override;
  // With the full `value` known and the server's command table holding DELIFEQ or DELEX (the client's
  // probe says), that one command deletes the lock and the wake script rides along in the same write;
  // otherwise the release script compares the owner id.
  redis::Result<bool> release(std::string_view owner, std::optional<std::string_view> value,
                              Deadline deadline) override;
  void keep_records(RecordArgs args) override { m_records = std::move(args); }
  redis::Result<void> note_trigger(std::string_view kind, std::uint64_t slot_us, std::string_view host,
                                   Deadline deadline) override;
  redis::Result<bool> release_recorded(std::string_view owner, std::string_view value, const Acquired& acquired,
                                       const RunOutcome& outcome, Deadline deadline) override;

 private:
  redis::Client& m_client;
  LockKeys m_keys;
  std::optional<RecordArgs> m_records;
  bool m_native_refused = false;  // the native command failed once (renamed, ACL): the script from then on
};

// How a plain lock is released on a server: by its native compare-and-delete command, when it has one
// (DELIFEQ preferred: it has no options to get wrong), else by the release script.
enum class ReleasePath { script, delifeq, delex };
ReleasePath release_path(const std::optional<redis::ServerInfo>& server);
std::string_view release_path_name(ReleasePath path);  // "DELIFEQ", "DELEX", "script"

}  // namespace fencerun::lease
