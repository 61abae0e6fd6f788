#pragma once
// Lease: what a job runs under. acquire() takes the lock, waiting if asked, and hands back a
// HeldLease, which renews in the background, reports loss, and releases itself (owner-checked,
// bounded by the request timeout) on every way out. The application knows only these two types:
// the Redis lease (redis_lease.hpp) is one implementation, for a plain lock or for N holders at once
// (a counting lock, --limit N); others (a quorum of servers) are further implementations of the same
// interface. Knows nothing of processes.
#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lease/facts.hpp"
#include "lease/run_record.hpp"
#include "lease/schedule.hpp"
#include "lease/timing.hpp"
#include "lease/types.hpp"
#include "util/clock.hpp"

namespace fencerun::lease {

// --limit N: a counting lock has from 2 to this many slots (1 is the plain lock).
inline constexpr long k_max_limit = 1024;

// What one acquisition asks for.
struct LeaseRequest {
  std::string lock;   // NAME
  std::string owner;  // unique and unpredictable: another client cannot renew or release our lock
  long pid = 0;       // shown to other clients as the holder
  std::string host;
  LeaseTiming timing;
  std::optional<milliseconds> wait = milliseconds::zero();  // nullopt: as long as it takes
  bool fair = false;                                        // waiters acquire in arrival order
  long limit = 1;  // holders at once (--limit N): 1 is the plain lock, 2..1024 a counting lock of N slots
  int min_replicas = 0;                                     // replicas that must confirm it
  milliseconds replica_timeout{1000};
  milliseconds request_timeout{2000};  // bound of every request
  // The record of runs NAME's server keeps (run_record.hpp), and --min-interval: the command is not
  // started when the last successful run of NAME started less than this long ago (server time).
  RecordSettings records;
  std::optional<milliseconds> min_interval;
  // --every / --slot-offset: the command is not started when a success is recorded for the slot the
  // trigger fired in (schedule.hpp).
  std::optional<Every> every;
  ScheduleRule rule() const { return {every, min_interval}; }
  // --if-record-lost skip: no run while NAME's record is missing on the server (lost, or never started).
  bool skip_if_record_lost = false;
  // --lock-delay: how long the next holder waits after a holder vanished without releasing (its key
  // revoked, expired or broken while its run was in progress). nullopt: that holder's TTL.
  std::optional<milliseconds> lock_delay;
  std::string version;  // fencerun's, for the record
};

// The caller's side of waiting: a sleep that a signal may end.
class Waiter {
 public:
  virtual ~Waiter() = default;
  // Sleeps until `wake`, or until `fd` (when >= 0) is readable (then sets `woken`). Returns the signal
  // that ended the sleep early, if one did; the lease then gives up holding nothing.
  virtual std::optional<int> sleep_until(Deadline wake, int fd, bool& woken) = 0;
};

// Why acquire() returned without a lease.
struct NotAcquired {
  enum class Reason {
    busy,         // held by another owner until the wait ran out
    unavailable,  // the server could not be used, or did not confirm the lock (replicas)
    interrupted,  // a signal ended the wait
    limit_mismatch,  // the lock is held with another --limit
    skipped,         // --every, --min-interval: this trigger's run already ran or is running (nothing is held)
    rule_mismatch,   // the lock's record was written with another --every/--min-interval/--records-ttl
  };
  NotAcquired(Reason why, int sig = 0, long held = 0, std::uint64_t last_success = 0)
      : reason(why), signal(sig), held_limit(held), last_success_us(last_success) {}
  Reason reason;
  int signal = 0;       // interrupted: which
  long held_limit = 0;  // limit_mismatch: the lock's limit
  std::uint64_t last_success_us = 0;  // skipped: when the last success started (server time), 0 unknown
  std::string held_rule;              // rule_mismatch: the lock's rule (schedule_rule)
};

class HeldLease {
 public:
  enum class Released { yes, not_ours, failed };
  struct Stats {
    std::uint64_t renewals = 0;
    std::uint64_t failures = 0;
  };

  // Stops renewing and releases the lock unless release() already did. Never throws.
  virtual ~HeldLease() = default;

  virtual std::uint64_t token() const = 0;
  // The slot held, 0..limit-1 (0 for the plain lock).
  virtual long slot() const = 0;
  // The lease's end on this side as last known (the first one until renewals move it).
  virtual Deadline deadline() const = 0;
  // What the job is told of its lease, as every backend knows it (facts.hpp writes the variables).
  virtual JobFacts job_facts() const = 0;
  // The job's environment: (name, value) pairs, e.g. {"FENCERUN_TOKEN", "42"} (job_environment()).
  std::vector<std::pair<std::string, std::string>> facts() const { return job_environment(job_facts()); }

  // Starts renewing in the background; `on_renewed` gets each new deadline as soon as it is known
  // (from the renewal thread). Throws SystemError when it cannot start.
  virtual void keep(std::function<void(Deadline)> on_renewed) = 0;
  // Stops renewing (an in-flight request finishes first, within its bound).
  virtual void stop_keeping() = 0;
  // True once renewal found the lock gone or taken.
  virtual bool lost() const = 0;
  // Why, once lost() is true (none before; a lease that cannot tell says expired_or_deleted).
  virtual LossCause loss_cause() const { return lost() ? LossCause::expired_or_deleted : LossCause::none; }
  // Readable when lost() may have changed, or renewal gave up at the stop point; -1 before keep().
  virtual int wake_fd() const = 0;
  virtual Stats stats() const = 0;

  // The run's start by the server's clock (microseconds), when it keeps a record of runs.
  virtual std::optional<std::uint64_t> started_us() const { return std::nullopt; }
  // How the run ended, for the record the release writes (before release()).
  virtual void set_outcome(const RunOutcome& outcome) { m_outcome = outcome; }

  // Owner-checked release, bounded by the request timeout. not_ours: the lock was gone or held by
  // another owner by then.
  virtual Released release() = 0;

 protected:
  std::optional<RunOutcome> m_outcome;
};

class Lease {
 public:
  virtual ~Lease() = default;
  // Acquires the lock, waiting as the request says. `waited` receives how long it took (until the lock
  // was held or the wait ended). A HeldLease must not outlive the Lease that granted it.
  virtual std::expected<std::unique_ptr<HeldLease>, NotAcquired> acquire(Waiter& waiter, milliseconds& waited) = 0;
};

}  // namespace fencerun::lease
