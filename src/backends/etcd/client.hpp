#pragma once
// The etcd v3 client: the few requests fencerun makes of an etcd cluster (leases, one transaction,
// ranges, a member's status, any transaction) and the watch of one key, over etcd's JSON gateway (the
// /v3/ HTTP endpoints every member serves on its client port). It speaks HTTP/1.1 itself: requests
// written and replies parsed with Boost.Beast's serializer and parser, over the plain and TLS byte
// streams of net/ (OpenSSL loaded at the first TLS connection). One keep-alive connection per member
// serves every request of the run; the watch has its own. The only place that includes Beast's or the
// JSON library's headers is client.cpp.
//
// Every request is bounded by its deadline. The members of the URL are tried in turn: a member that
// cannot be reached, does not answer in its share of the time left, or has no leader hands the
// request to the next one. Errors are the seam's neutral kinds (lease/error.hpp): a member that
// cannot be reached is `unavailable`, a cluster without a leader `busy`.
#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/etcd/url.hpp"
#include "lease/error.hpp"
#include "util/clock.hpp"
#include "util/fd.hpp"

namespace fencerun::etcd {

using lease::Error;
using lease::Result;

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t lease = 0;
};

struct Range {
  std::int64_t revision = 0;  // the store's revision when it was read
  std::int64_t count = 0;     // keys in the range (not only those returned)
  std::vector<KeyValue> kvs;
};

enum class Sort { none, create_ascending, create_descending };
struct RangeRequest {
  std::string key;
  std::string range_end;  // empty: the one key
  Sort sort = Sort::none;
  std::int64_t limit = 0;                // 0: all
  std::int64_t max_create_revision = 0;  // 0: no bound
};

// The range of one key.
inline RangeRequest single(std::string key) {
  RangeRequest r;
  r.key = std::move(key);
  return r;
}

struct Grant {
  std::int64_t id = 0;
  std::int64_t ttl = 0;  // as granted (etcd raises a TTL below its minimum); 0 when `existed`
  bool existed = false;  // a lease of the id asked already existed (granted by an earlier request)
};

// What enqueue() did: the caller's key (created now, or found from an earlier attempt of the same
// request), the lock's base, and the key with the smallest create_revision under the prefix.
struct Enqueued {
  std::int64_t revision = 0;
  KeyValue own;
  std::string base;
  std::optional<KeyValue> first;
};

// A general transaction (txn_ops): compares, then one branch of puts, deletes and ranges.
struct Compare {
  enum class Target { create_revision, mod_revision };
  Compare(std::string key_, Target target_, std::int64_t revision_, bool not_equal_ = false,
          std::string range_end_ = {})
      : key(std::move(key_)), target(target_), revision(revision_), not_equal(not_equal_),
        range_end(std::move(range_end_)) {}
  std::string key;
  Target target = Target::mod_revision;
  std::int64_t revision = 0;  // equal to it (0: the key does not exist)
  bool not_equal = false;     // the key's revision differs from `revision` (0: the key exists)
  std::string range_end;      // every key in [key, range_end) compares so (none there: as one missing key)
};
struct TxnRequest;
struct Op {
  enum class Kind { put, remove, range, txn };
  Kind kind = Kind::range;
  std::string key;
  std::string value;       // put
  std::int64_t lease = 0;  // put: attached to this lease (0: none)
  RangeRequest range;      // range
  std::shared_ptr<const TxnRequest> txn;  // txn: nested, its compares read before any op is applied
};
inline Op put_op(std::string key, std::string value, std::int64_t lease = 0) {
  return {Op::Kind::put, std::move(key), std::move(value), lease, {}, {}};
}
inline Op remove_op(std::string key) { return {Op::Kind::remove, std::move(key), {}, 0, {}, {}}; }
inline Op range_op(RangeRequest r) { return {Op::Kind::range, {}, {}, 0, std::move(r), {}}; }
struct TxnRequest {
  std::vector<Compare> compare;
  std::vector<Op> success;
  std::vector<Op> failure;
};
inline Op txn_op(TxnRequest t) { return {Op::Kind::txn, {}, {}, 0, {}, std::make_shared<const TxnRequest>(std::move(t))}; }
struct TxnResult {
  bool succeeded = false;
  bool lease_missing = false;  // a put named a lease that is gone: nothing was applied
  std::int64_t revision = 0;
  std::vector<std::optional<Range>> ranges;  // one per op of the branch taken (set for its ranges)
};

struct MemberStatus {
  std::string version;
  std::uint64_t member_id = 0;
  std::uint64_t leader = 0;
  std::uint64_t raft_term = 0;
  std::uint64_t cluster_id = 0;
};

// The end of the range of keys that start with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(std::string_view prefix);

// A member's clock as one reply showed it: etcd has no clock a client can read, but every reply
// carries an HTTP Date (the member's clock, truncated to the second). With this host's wall clock
// when the request went out and when the reply came, it bounds how far apart the two clocks are.
struct MemberClock {
  std::size_t member = 0;
  std::int64_t date_s = 0;       // the reply's Date, Unix seconds
  std::int64_t sent_us = 0;      // this host's wall clock just before the request was written
  std::int64_t received_us = 0;  // and once the reply was read
};
// An HTTP Date in IMF-fixdate form ("Sun, 06 Nov 1994 08:49:37 GMT", the form servers send), as Unix
// seconds; nullopt for anything else.
std::optional<std::int64_t> http_date_seconds(std::string_view date);
// How far this host's clock is ahead of the member's (negative: behind), in microseconds, when it is
// surely more than `bound` apart: the member's time at its reply was within [date, date + 1 s), read
// between sent_us and received_us on this host. nullopt when the two may be within `bound`.
std::optional<std::int64_t> clock_apart_us(const MemberClock& c, std::chrono::microseconds bound);

class Client {
 public:
  explicit Client(const EtcdEndpoint& endpoint);  // connects to nothing
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // `id` 0: etcd chooses the id; else that id (existed: a lease of that id is there already).
  Result<Grant> grant(std::int64_t ttl_seconds, Deadline deadline, std::int64_t id = 0);
  // LeaseKeepAlive, one round: the lease's TTL, or nullopt when the lease is gone.
  Result<std::optional<std::int64_t>> keep_alive(std::int64_t lease, Deadline deadline);
  // false: there was no such lease (expired, revoked).
  Result<bool> revoke(std::int64_t lease, Deadline deadline);
  // Seconds left, or nullopt when the lease is gone.
  Result<std::optional<std::int64_t>> time_to_live(std::int64_t lease, Deadline deadline);
  Result<Range> range(const RangeRequest& request, Deadline deadline);
  // One transaction: unless `key` exists, put it with `value` attached to `lease`, and create
  // `base_key` with `base_value` unless it exists; then read back the key, the base and the first key
  // (smallest create_revision) in [prefix, prefix_end(prefix)). Repeating it after a lost reply
  // changes nothing and reads the same.
  Result<Enqueued> enqueue(const std::string& key, const std::string& value, std::int64_t lease,
                           const std::string& base_key, const std::string& base_value, const std::string& prefix,
                           Deadline deadline);
  // Any transaction (etcd allows 128 ops in one). A put whose lease is gone makes lease_missing true.
  Result<TxnResult> txn(const TxnRequest& request, Deadline deadline);
  Result<MemberStatus> member_status(std::size_t member, Deadline deadline);

  const EtcdEndpoint& endpoint() const { return m_endpoint; }
  // "HOST:PORT" of the member the last request went to.
  std::string member_name(std::size_t member) const;
  std::size_t current_member() const { return m_current.load(); }
  // The last request was sent more than once (to another member after a failure): a reply of "not
  // found" may then be the first attempt's doing.
  bool last_request_repeated() const { return m_repeated; }
  // The clock of the member that answered the last request, when its reply had a Date.
  std::optional<MemberClock> last_member_clock();

  // The auth token to send to `member` (nullopt without a user), authenticating first when there is
  // none yet (`renew`: the one held expired). Waits for the client (another request may be under way)
  // no longer than `deadline`.
  Result<std::optional<std::string>> auth_token(std::size_t member, Deadline deadline, bool renew = false);

  // For the watch: where to stream from (the current member) and the headers to send (the auth
  // token, authenticating first when needed).
  struct StreamTarget {
    std::string url;
    std::vector<std::string> headers;
  };
  Result<StreamTarget> stream_target(const std::string& path, Deadline deadline);
  struct Impl;

 private:
  EtcdEndpoint m_endpoint;
  std::unique_ptr<Impl> m_impl;
  std::atomic<std::size_t> m_current{0};
  bool m_repeated = false;
  std::timed_mutex m_mutex;  // one request at a time (the renewal thread and the main thread share it)
};

// Watches one key from a revision on, in a thread of its own and on a connection of its own, until the
// key is deleted, the watch cannot go on, or stop(). fd() is readable once either happened.
//
// The watch follows the cluster: when its stream breaks, or its member stops answering, it is opened
// again through another member from the last revision seen + 1 (so a deletion made meanwhile is
// replayed). A member stops answering as far as the watch knows when the client moves away from it
// (its requests, the renewals among them, go to the next member when one does not answer in time):
// the watch looks every `check_every` (default: the timeout, at most 1 s). It fails when etcd cancels
// it (its start revision was compacted: the caller reads the key again), when the credentials are
// refused, or when every member in turn failed to open it.
class Watch {
 public:
  enum class State { watching, deleted, failed };
  // `on_end` (optional) is called from the watch's thread when it ends by itself (deleted or failed).
  // `timeout` bounds the opening of each stream (connect, TLS, the reply's header).
  Watch(Client& client, std::string key, std::int64_t start_revision, std::chrono::milliseconds timeout,
        std::function<void(State)> on_end = {},
        std::chrono::milliseconds check_every = std::chrono::milliseconds::zero());
  ~Watch();  // stops
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  int fd() const { return m_fd.get(); }
  State state() const { return m_state.load(); }
  std::string error() const;
  // The revision of the DELETE that ended the watch (State::deleted), 0 otherwise.
  std::int64_t deleted_revision() const;
  // Ends the stream at once and joins the thread.
  void stop();
  struct Impl;

 private:
  void run();
  void finish(State state, std::string error = {});

  Client& m_client;
  std::string m_key;
  std::int64_t m_start;
  std::chrono::milliseconds m_timeout;
  std::function<void(State)> m_on_end;
  UniqueFd m_fd;
  std::atomic<State> m_state{State::watching};
  mutable std::mutex m_mutex;
  std::string m_error;
  std::unique_ptr<Impl> m_impl;
  std::thread m_thread;
};

}  // namespace fencerun::etcd
