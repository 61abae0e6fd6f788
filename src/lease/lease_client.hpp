#pragma once
// LeaseClient: the lease operations on Redis (acquire + token, renew, release, status), each one round
// trip. Knows nothing of processes. Scripts run with EVALSHA and fall back to EVAL on NOSCRIPT.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "redis/client.hpp"
#include "util/clock.hpp"

namespace fencerun::lease {

struct LockKeys {
  std::string lock;     // <prefix>{NAME}:lock
  std::string token;    // <prefix>{NAME}:token
  std::string queue;    // <prefix>{NAME}:queue    waiters (owner ids) by ticket
  std::string tickets;  // <prefix>{NAME}:tickets  ticket counter
  std::string turn;     // <prefix>{NAME}:turn     the waiter woken to take the free lock
  std::string wake;     // <prefix>{NAME}:wake:    + owner id: the channel each waiter listens on
  std::string wake_channel(std::string_view owner) const { return wake + std::string(owner); }
};
LockKeys keys_for(std::string_view prefix, std::string_view name);

// What the lock value says about its holder: "<owner> <token> <pid> <host>".
struct Holder {
  std::string owner;
  std::optional<std::uint64_t> token;
  std::optional<long> pid;
  std::string host;
};
// Parses a lock value; fields that are missing or malformed (a value set by something else) stay empty.
Holder parse_holder(std::string_view value);

struct Acquired {
  std::uint64_t token = 0;
  std::string value;       // the exact lock value, for renew and release
  Deadline sent{};         // read just before the successful request was written
  long server_version = 0; // e.g. 0x070000 for 7.0.0; 0 when unknown
  std::optional<long long> replicas_acked;  // WAIT's answer, when replicas were asked for
  // The server's clock was behind the counter it issued from (the token is counter + 1): had the
  // counter been lost, its clock would have issued a token below the last one. `server_clock_gap` is
  // how far behind it was; zero when it was not.
  bool server_clock_behind = false;
  std::chrono::microseconds server_clock_gap{0};
};

// How many replicas must confirm an acquisition (WAIT), and for how long to wait for them.
struct ReplicaAck {
  int replicas = 0;
  std::chrono::milliseconds timeout{0};
};

// A waiter woken to take the free lock has this long to come for it; then a fair waiter behind it
// takes its place (see _queue.lua).
inline constexpr std::chrono::milliseconds k_turn{3000};

// How an acquire attempt stands towards the wait queue. `queued`: the caller listens on its wake
// channel, so it joins the queue (or keeps its place) when the lock is busy. `fair`: a free lock goes
// to the first waiter only.
struct Queueing {
  bool fair = false;
  bool queued = false;
};
struct Busy {
  std::optional<std::chrono::milliseconds> remaining;  // nullopt: no expiry, or free but not our turn
  Holder holder;  // known when not queued
  // Fair waiting, lock free but another waiter's turn: how long that turn lasts.
  std::optional<std::chrono::milliseconds> turn_expires;
  std::optional<long> place;  // place in the queue, 0 first; nullopt when not queued
  long queue_length = 0;      // known when queued
};
using AcquireResult = std::variant<Acquired, Busy>;

// Decodes the acquire script's reply (acquired or busy); `sent` goes into Acquired. A protocol error
// when the reply does not have the script's shape.
redis::Result<AcquireResult> parse_acquire_reply(const redis::Reply& reply, Deadline sent);

enum class RenewOutcome { renewed, gone, stolen };

struct LockStatus {
  std::optional<Holder> holder;                        // nullopt: free
  std::optional<std::chrono::milliseconds> remaining;  // when held and expiring
  std::optional<std::uint64_t> last_token;
};

class LeaseClient {
 public:
  LeaseClient(redis::Client& client, LockKeys keys) : m_client(client), m_keys(std::move(keys)) {}

  const LockKeys& keys() const { return m_keys; }
  redis::Client& client() { return m_client; }

  // One attempt: acquire with `ttl` and issue a token, or report the holder. With ack.replicas > 0 the
  // reply also says how many replicas confirmed it (the request may take ack.timeout longer).
  redis::Result<AcquireResult> try_acquire(std::string_view owner, std::chrono::milliseconds ttl, long pid,
                                           std::string_view host, const ReplicaAck& ack, const Queueing& queueing,
                                           Deadline deadline);
  // A waiter gives up its place in the queue (the next one takes it).
  redis::Result<void> leave_queue(std::string_view owner, Deadline deadline);
  // Owner-checked renewal; `sent` receives the time the successful request was written.
  redis::Result<RenewOutcome> renew(std::string_view value, std::chrono::milliseconds ttl, Deadline deadline,
                                    Deadline& sent);
  // Owner-checked compare-and-delete. true: deleted; false: it was not ours any more. With the full
  // `value` known, DELEX key IFEQ value is used where the server has it; otherwise the script compares
  // the owner id (the value's first word).
  redis::Result<bool> release(std::string_view owner, std::optional<std::string_view> value, bool try_delex,
                              Deadline deadline);
  redis::Result<LockStatus> status(Deadline deadline);

 private:
  redis::Client& m_client;
  LockKeys m_keys;
  bool m_delex_unsupported = false;
};

// DELEX (compare-and-delete as one command) first appeared in Redis 8.4.
inline bool server_has_delex(long version) { return version >= 0x080400; }

}  // namespace fencerun::lease
