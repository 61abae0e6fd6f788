#pragma once
// The lease on an etcd cluster: an etcd lease (LeaseGrant, kept alive with LeaseKeepAlive) with one
// key per holder or waiter attached to it:
//
//   <prefix>{NAME}:wait/<lease id, 16 hex digits>   "OWNER PID HOST TTL_MS TICKET", attached to the run's lease
//   <prefix>{NAME}:base                              the lock's token base, set once, never changed
//   <prefix>{NAME}:delay                             the lock-delay of a vanished holder (see below)
//
// The queue's order is each key's TICKET, or its create_revision when TICKET is 0: a waiter whose key
// vanished (its lease revoked, etcd-io/etcd#15247 revokes them all at once) queues again with the
// place it had as TICKET, so waiters keep their order through revocations. The first key in that
// order holds the lock once it has put the run in progress (`run`, below) in a transaction that
// compares its own key and the record's keys: that write is the commit point, so two keys that both
// see themselves first (a revoked waiter coming back) never both run. The token is base + the holder
// key's create_revision, checked to be above every token recorded before (a key that would not be is
// put again). Revisions are the Raft log's, strictly increasing across leader changes; the base, set
// once from the clock in microseconds, keeps tokens above those a Redis server issued for the same lock
// before (see fencerun(1), ETCD). Release writes the record (deleting `run`), then revokes the lease,
// which deletes the key with it.
//
// Lock-delay: a holder whose key vanished without that release (its lease revoked or expired, or the
// key deleted by `fencerun break`) left its `run` behind. Its command may still be running until its
// own deadline, at most its TTL after the key vanished. The next holder therefore does not start while
// `run` names an owner without a key: it creates `delay` on an etcd lease of that TTL (--lock-delay
// overrides it), and waits until the server expires it or the vanished holder closes its run (it does
// once its whole job is gone). Timed by the server's lease, one clock for every host.
//
// The record of runs (run_record.hpp), beside the lock; `ok`, `runs` and `rule` attached to one etcd
// lease of --records-ttl (kept alive by a release at most every quarter of that TTL, when the stamp
// "#kept US TTL_S" that heads `runs` says so; a NAME unused that long leaves nothing), `run` to none:
//
//   <prefix>{NAME}:run    the run in progress: "OWNER START_US TOKEN PID HOST VERSION TTL_MS [FIRE_US]"
//   <prefix>{NAME}:ok     the last successful run's record
//   <prefix>{NAME}:runs   "#kept US TTL_S", then the last --keep-runs records, newest first, one per line
//   <prefix>{NAME}:rule   --every / --min-interval: the rule the lock's triggers share (schedule_rule)
//   <prefix>{NAME}:since  the record's marker: the start of the first run with a rule (no lease, as
//                         `base`: it outlives the records' lease, so a missing one means the record
//                         was never started or was lost with the cluster's data, e.g. a restore from
//                         an older snapshot). Put in the transaction that puts that run's `run`;
//                         --if-record-lost skip runs nothing while it is missing.
//
// Times are this host's wall clock (etcd has none a client can read); so is a trigger's fire time
// (FIRE_US, and the records' tenth field), taken at its first request and kept while it waits. The
// holder writes them in transactions that compare its own key's create_revision (it holds the lock
// only while that key is there) and the record keys' mod_revision as read: the check of --every or
// --min-interval (schedule.hpp's already_done) and the write of `run` are one such transaction, so two
// hosts never both pass it. Because those times come from several hosts' clocks, a trigger with a rule
// is refused (69) when this host's clock is more than 2 s from the member's, as the Date of its
// LeaseGrant's reply tells (etcd::clock_apart_us).
//
// An uncontended run makes four requests: LeaseGrant; one transaction that puts the key, reads the
// queue, the base and the record, and (nested, when nobody was queued and no run was in progress)
// puts `run`; after the command, one that writes the record; LeaseRevoke. With --every or
// --min-interval the commit is a transaction of its own (the check reads the record first): five.
// `run` carries no lease: it must outlive a holder whose lease was revoked; a release deletes it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/etcd/client.hpp"
#include "backends/etcd/url.hpp"
#include "lease/types.hpp"
#include "lease/lease.hpp"

namespace fencerun::lease {

struct EtcdKeys {
  std::string prefix;  // <prefix>{NAME}:wait/   every holder's and waiter's key starts with it
  std::string base;    // <prefix>{NAME}:base
  std::string run;     // <prefix>{NAME}:run    the record of runs
  std::string ok;      // <prefix>{NAME}:ok
  std::string runs;    // <prefix>{NAME}:runs
  std::string delay;   // <prefix>{NAME}:delay
  std::string rule;    // <prefix>{NAME}:rule   the rule of --every / --min-interval its triggers share
  std::string since;   // <prefix>{NAME}:since  the record's marker (--if-record-lost)
  std::string key(std::int64_t lease) const;  // prefix + the lease id in 16 lower-case hex digits
};
EtcdKeys etcd_keys_for(std::string_view key_prefix, std::string_view name);

// Tokens are base + revision; both must keep it below 2^53 (JSON consumers, guards).
inline constexpr std::uint64_t k_max_token = (std::uint64_t{1} << 53) - 1;

// The 16 hex digits of a lease id, as its key and $FENCERUN_ETCD_LEASE show it.
std::string lease_hex(std::int64_t lease);

// The records of the `runs` key's value, newest first (at most `count`).
std::vector<std::string> etcd_run_records(std::string_view value, std::size_t count = SIZE_MAX);

// What a queue key's value says: "OWNER PID HOST TTL_MS TICKET" (older versions: "OWNER PID HOST").
struct QueueValue {
  std::string owner;
  std::optional<long> pid;
  std::string host;
  std::optional<std::int64_t> ttl_ms;
  std::int64_t ticket = 0;
};
QueueValue parse_queue_value(std::string_view value);
std::string queue_value(const QueueValue& v);

// A key's place in the queue: its ticket, or its create_revision.
std::int64_t etcd_queue_order(const etcd::KeyValue& kv);
// Sorts keys into queue order (ties: by create_revision).
void etcd_sort_queue(std::vector<etcd::KeyValue>& queue);

// What a key's value says of its holder, with its token when the base is known.
Holder etcd_holder_of(const etcd::KeyValue& kv, std::optional<std::uint64_t> base);

struct EtcdLeaseTarget {
  etcd::EtcdEndpoint endpoint;
  std::string redacted_url;  // for messages and FENCERUN_ETCD_URL: never a password
  std::string key_prefix;
};

std::unique_ptr<Lease> make_etcd_lease(EtcdLeaseTarget target, LeaseRequest request);

}  // namespace fencerun::lease
