#pragma once
// The lease on an etcd cluster: an etcd lease (LeaseGrant, kept alive with LeaseKeepAlive) with one
// key per holder or waiter attached to it, etcd's own lock recipe:
//
//   <prefix>{NAME}:wait/<lease id, 16 hex digits>   "OWNER PID HOST", attached to the run's lease
//   <prefix>{NAME}:base                              the lock's token base, set once, never changed
//
// The holder is the key with the smallest create_revision; a waiter watches only the key just before
// its own (FIFO, one watch each). The token is base + the holder key's create_revision: revisions are
// the Raft log's, strictly increasing across leader changes, and the base, set once from the clock in
// microseconds, keeps tokens above those a Redis server issued for the same lock before (see
// fencerun(1), ETCD). Release revokes the lease, which deletes the key with it.
//
// The record of runs (run_record.hpp), beside the lock, attached to one etcd lease of --records-ttl
// (kept alive at each write, so a NAME unused that long leaves nothing):
//
//   <prefix>{NAME}:run    the run in progress: "OWNER START_US TOKEN PID HOST VERSION"
//   <prefix>{NAME}:ok     the last successful run's record
//   <prefix>{NAME}:runs   the last --keep-runs records, newest first, one per line
//
// Times are this host's wall clock (etcd has none a client can read). The holder writes them in
// transactions that compare its own key's create_revision (it holds the lock only while that key is
// there) and the three keys' mod_revision as read: the --min-interval check and the write of `run` are
// one such transaction, so two hosts never both pass it.
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
  std::string key(std::int64_t lease) const;  // prefix + the lease id in 16 lower-case hex digits
};
EtcdKeys etcd_keys_for(std::string_view key_prefix, std::string_view name);

// Tokens are base + revision; both must keep it below 2^53 (JSON consumers, guards).
inline constexpr std::uint64_t k_max_token = (std::uint64_t{1} << 53) - 1;

// The 16 hex digits of a lease id, as its key and $FENCERUN_ETCD_LEASE show it.
std::string lease_hex(std::int64_t lease);

// The records of the `runs` key's value, newest first (at most `count`).
std::vector<std::string> etcd_run_records(std::string_view value, std::size_t count = SIZE_MAX);

// What a key's value says of its holder ("OWNER PID HOST"), with its token when the base is known.
Holder etcd_holder_of(const etcd::KeyValue& kv, std::optional<std::uint64_t> base);

struct EtcdLeaseTarget {
  etcd::EtcdEndpoint endpoint;
  std::string redacted_url;  // for messages and FENCERUN_ETCD_URL: never a password
  std::string key_prefix;
};

std::unique_ptr<Lease> make_etcd_lease(EtcdLeaseTarget target, LeaseRequest request);

}  // namespace fencerun::lease
