#pragma once
// The seam's plain types: what a lease and the admin commands know of a lock on any backend (its
// holders, a run's acquisition, how a renewal went), and the renewal the keeper (keeper.hpp) drives.
// Owned by no backend: each fills them from its own keys.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lease/error.hpp"
#include "util/clock.hpp"

namespace fencerun::lease {

// The lock value every backend stores for a holder: "<owner> <token> <pid> <host>".
struct Holder {
  std::string owner;
  std::optional<std::uint64_t> token;
  std::optional<long> pid;
  std::string host;
};
// Parses a lock value; fields that are missing or malformed (a value set by something else) stay empty.
Holder parse_holder(std::string_view value);

// What one successful acquisition took.
struct Acquired {
  std::uint64_t token = 0;
  int slot = 0;            // the slot held (always 0 for the plain lock)
  std::string value;       // the exact lock value, for renew and release
  Deadline sent{};         // read just before the successful request was written
  std::optional<long long> replicas_acked;  // WAIT's answer, when replicas were asked for
  // The server's clock was behind the counter it issued from (the token is counter + 1): had the
  // counter been lost, its clock would have issued a token below the last one. `server_clock_gap` is
  // how far behind it was; zero when it was not.
  bool server_clock_behind = false;
  std::chrono::microseconds server_clock_gap{0};
  std::string started_us;  // the run's start, server time (empty when the script keeps no record)
  std::string fired_us;    // its trigger's fire time, server time (empty without --every/--min-interval)
  bool new_record = false;  // the record's marker was missing: this run starts NAME's record
};

// The lock is busy: what a waiter needs to know.
struct Busy {
  std::optional<std::chrono::milliseconds> remaining;  // nullopt: no expiry, or free but not our turn
  Holder holder;  // known when not queued
  // Fair waiting, lock free but another waiter's turn: how long that turn lasts.
  std::optional<std::chrono::milliseconds> turn_expires;
  std::optional<long> place;  // place in the queue, 0 first; nullopt when not queued
  long queue_length = 0;      // known when queued
  std::optional<std::uint64_t> now_us;  // the server's time, when the record of runs is kept
  std::string run;                      // the run in progress ("" none), when the record is kept
};

// --every / --min-interval: a success (its record) makes this trigger's run unnecessary, or
// (`in_progress`) the holder is running the run this trigger is for; nothing is held.
struct Skipped {
  std::string last_success;
  std::uint64_t now_us = 0;   // server time
  std::uint64_t fired_us = 0;  // the trigger's fire time (server time; 0 unknown)
  bool in_progress = false;
  bool record_lost = false;  // --if-record-lost skip: NAME's record is missing (last_success empty)
};

// The lock's record was written with another rule (--every, --slot-offset, --min-interval,
// --records-ttl): `rule` is that one (schedule.hpp's schedule_rule).
struct RuleMismatch {
  std::string rule;
};

// How a renewal went: renewed, the key was gone (expired or deleted: a server that cannot tell), or
// another owner holds it; where the server can tell more: the key was deleted while its lease still
// lived (broken), or the lease itself is gone (revoked or run out).
enum class RenewOutcome { renewed, gone, stolen, broken, revoked };

// Why a held lease was lost (HeldLease::loss_cause()): the lock is already someone else's, or free
// for anyone to take.
enum class LossCause { none, expired_or_deleted, taken, broken, revoked };

inline LossCause loss_cause_of(RenewOutcome o) {
  switch (o) {
    case RenewOutcome::renewed: return LossCause::none;
    case RenewOutcome::gone: return LossCause::expired_or_deleted;
    case RenewOutcome::stolen: return LossCause::taken;
    case RenewOutcome::broken: return LossCause::broken;
    case RenewOutcome::revoked: return LossCause::revoked;
  }
  return LossCause::expired_or_deleted;
}

// The cause's name in the log (field "cause") and its words.
inline const char* loss_cause_name(LossCause c) {
  switch (c) {
    case LossCause::none: return "none";
    case LossCause::expired_or_deleted: return "expired_or_deleted";
    case LossCause::taken: return "taken";
    case LossCause::broken: return "broken";
    case LossCause::revoked: return "revoked";
  }
  return "unknown";
}
inline const char* loss_cause_text(LossCause c) {
  switch (c) {
    case LossCause::none: return "the lease is held";
    case LossCause::expired_or_deleted: return "the lock key is gone (expired or deleted)";
    case LossCause::taken: return "the lock is held by another owner";
    case LossCause::broken: return "the lock key was deleted while its lease still lived (broken)";
    case LossCause::revoked: return "the lock's lease is gone (revoked, as by break, or run out)";
  }
  return "the lease was lost";
}

struct SlotHolder {
  long slot = 0;
  Holder holder;
  std::optional<std::chrono::milliseconds> remaining;  // nullopt: no expiry
};

// What a lock's keys say: its holders (a plain lock or the slots of a counting one), waiters, last
// token and the record of runs.
struct LockStatus {
  long limit = 1;                  // N of a counting lock while a slot is held, else 1
  std::vector<SlotHolder> holders;  // by slot; the plain lock's holder is slot 0
  long waiters = 0;                // in the wait queue
  std::optional<std::uint64_t> last_token;
  std::optional<std::string> last_run;      // the newest record of a run (run_record.hpp)
  std::optional<std::string> last_success;  // the last successful run's record
  std::uint64_t now_us = 0;                 // the server's time
  std::optional<std::string> rule;          // the rule stored with the record (schedule.hpp), if any
};

// bump: NAME's token counter before (nullopt when it did not exist) and after.
struct Bumped {
  std::optional<std::uint64_t> before;
  std::uint64_t after = 0;
};

// What the keeper (keeper.hpp) needs of a lease: its renewal.
class Renewer {
 public:
  virtual ~Renewer() = default;
  // Owner-checked renewal of what the last successful acquisition took (`value` is its lock value);
  // `sent` receives the time the successful request was written (of a quorum: the round's earliest).
  virtual Result<RenewOutcome> renew(std::string_view value, std::chrono::milliseconds ttl,
                                            Deadline deadline, Deadline& sent) = 0;
};

}  // namespace fencerun::lease
