#pragma once
// SlotsClient: the lease operations of a counting lock (--limit N, N >= 2): N slots, each a lease of
// its own (<prefix>{NAME}:slot:I), tokens from NAME's one counter, the limit stored with the lock so
// that every holder agrees on it, and the wait queue of the plain lock, where a freed slot wakes one
// waiter (scripts/slots_*.lua). One holder per client: renew and release act on the slot the last
// successful try_acquire took.
#include <span>

#include "backends/redis/lease_client.hpp"

namespace fencerun::lease {

class SlotsClient final : public LockOps {
 public:
  SlotsClient(redis::Client& client, LockKeys keys, long limit);

  const LockKeys& keys() const override { return m_keys; }
  redis::Client& client() override { return m_client; }
  redis::Result<AcquireResult> try_acquire(std::string_view owner, std::chrono::milliseconds ttl, long pid,
                                           std::string_view host, const ReplicaAck& ack, const Queueing& queueing,
                                           Deadline deadline) override;
  redis::Result<void> leave_queue(std::string_view owner, Deadline deadline) override;
  redis::Result<RenewOutcome> renew_once(std::string_view value, std::chrono::milliseconds ttl, Deadline deadline,
                                         Deadline& sent) override;
  // Releases the slot held; when no slot is known to be held (an acquire whose reply was lost), the
  // slot that holds `owner`, if any.
  redis::Result<bool> release(std::string_view owner, std::optional<std::string_view> value,
                              Deadline deadline) override;
  // The record of runs: a run in progress per slot; a success of any slot counts for --min-interval.
  void keep_records(RecordArgs args) override { m_records = std::move(args); }
  redis::Result<bool> release_recorded(std::string_view owner, std::string_view value, const Acquired& acquired,
                                       const RunOutcome& outcome, Deadline deadline) override;

 private:
  redis::Result<bool> release_with(std::string_view owner, std::span<const std::string_view> record,
                                   Deadline deadline);

  redis::Client& m_client;
  LockKeys m_keys;
  std::string m_limit;
  std::optional<int> m_slot;  // held since the last successful try_acquire
  std::optional<RecordArgs> m_records;
};

}  // namespace fencerun::lease
