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
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "etcd/client.hpp"
#include "etcd/url.hpp"
#include "lease/lease_client.hpp"
#include "lease/lease.hpp"

namespace fencerun::lease {

struct EtcdKeys {
  std::string prefix;  // <prefix>{NAME}:wait/   every holder's and waiter's key starts with it
  std::string base;    // <prefix>{NAME}:base
  std::string key(std::int64_t lease) const;  // prefix + the lease id in 16 lower-case hex digits
};
EtcdKeys etcd_keys_for(std::string_view key_prefix, std::string_view name);

// Tokens are base + revision; both must keep it below 2^53 (JSON consumers, guards).
inline constexpr std::uint64_t k_max_token = (std::uint64_t{1} << 53) - 1;

// The 16 hex digits of a lease id, as its key and $FENCERUN_ETCD_LEASE show it.
std::string lease_hex(std::int64_t lease);

// What a key's value says of its holder ("OWNER PID HOST"), with its token when the base is known.
Holder etcd_holder_of(const etcd::KeyValue& kv, std::optional<std::uint64_t> base);

struct EtcdLeaseTarget {
  etcd::EtcdEndpoint endpoint;
  std::string redacted_url;  // for messages and FENCERUN_ETCD_URL: never a password
  std::string key_prefix;
};

std::unique_ptr<Lease> make_etcd_lease(EtcdLeaseTarget target, LeaseRequest request);

}  // namespace fencerun::lease
