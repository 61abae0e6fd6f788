#include "lease/slots_client.hpp"

#include "lease/embedded_scripts.hpp"
#include "lease/script_call.hpp"

namespace fencerun::lease {

using redis::Result;

SlotsClient::SlotsClient(redis::Client& client, LockKeys keys, long limit)
    : m_client(client), m_keys(std::move(keys)), m_limit(std::to_string(limit)) {}

Result<AcquireResult> SlotsClient::try_acquire(std::string_view owner, std::chrono::milliseconds ttl, long pid,
                                               std::string_view host, const ReplicaAck& ack,
                                               const Queueing& queueing, Deadline deadline) {
  std::string ttl_ms = std::to_string(ttl.count());
  std::string pid_text = std::to_string(pid);
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view keys[] = {m_keys.limit, m_keys.token, m_keys.queue, m_keys.tickets, m_keys.turns, m_keys.lock};
  std::string_view args[] = {owner,       ttl_ms,  pid_text, host,         queueing.fair ? "1" : "0",
                             queueing.queued ? "1" : "0", m_keys.wake, turn_ms, m_limit, m_keys.slots};
  auto result = detail::acquire_with_ack(m_client, scripts::k_slots_acquire, keys, args, ack, deadline);
  if (result)
    if (auto* acquired = std::get_if<Acquired>(&*result)) m_slot = acquired->slot;
  return result;
}

Result<void> SlotsClient::leave_queue(std::string_view owner, Deadline deadline) {
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view keys[] = {m_keys.queue, m_keys.turns};
  std::string_view args[] = {owner, m_keys.wake, turn_ms, m_keys.slots, m_limit};
  Deadline sent{};
  auto reply = detail::run_script(m_client, scripts::k_slots_leave, keys, args, deadline, sent,
                                  redis::Resend::idempotent);
  if (!reply) return std::unexpected(reply.error());
  return {};
}

Result<RenewOutcome> SlotsClient::renew(std::string_view value, std::chrono::milliseconds ttl, Deadline deadline,
                                        Deadline& sent) {
  if (!m_slot) return RenewOutcome::gone;
  std::string key = m_keys.slot(*m_slot);
  std::string ttl_ms = std::to_string(ttl.count());
  std::string_view keys[] = {key};
  std::string_view args[] = {value, ttl_ms};
  auto reply = detail::run_script(m_client, scripts::k_renew, keys, args, deadline, sent,
                                  redis::Resend::idempotent);
  if (!reply) return std::unexpected(reply.error());
  auto n = reply->as_integer();
  if (!n) return std::unexpected(detail::protocol_error("unexpected reply to the renew script"));
  if (*n == 1) return RenewOutcome::renewed;
  return *n == 0 ? RenewOutcome::gone : RenewOutcome::stolen;
}

Result<bool> SlotsClient::release(std::string_view owner, std::optional<std::string_view> value,
                                  Deadline deadline) {
  // The script compares the owner id, the first word of the value: `value` adds nothing to that.
  (void)value;
  std::string slot = m_slot ? std::to_string(*m_slot) : std::string();
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view keys[] = {m_keys.limit, m_keys.queue, m_keys.turns};
  std::string_view args[] = {owner, slot, m_keys.slots, m_limit, m_keys.wake, turn_ms};
  Deadline sent{};
  auto reply = detail::run_script(m_client, scripts::k_slots_release, keys, args, deadline, sent,
                                  redis::Resend::idempotent);
  if (!reply) return std::unexpected(reply.error());
  auto n = reply->as_integer();
  if (!n) return std::unexpected(detail::protocol_error("unexpected reply to the release script"));
  return *n == 1;
}

}  // namespace fencerun::lease
