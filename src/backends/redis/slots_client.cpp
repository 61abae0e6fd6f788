#include "backends/redis/slots_client.hpp"

#include <vector>

#include "backends/redis/embedded_scripts.hpp"
#include "backends/redis/script_call.hpp"

namespace fencerun::lease {


SlotsClient::SlotsClient(redis::Client& client, LockKeys keys, long limit)
    : m_client(client), m_keys(std::move(keys)), m_limit(std::to_string(limit)) {}

redis::Result<AcquireResult> SlotsClient::try_acquire(std::string_view owner, std::chrono::milliseconds ttl, long pid,
                                               std::string_view host, const ReplicaAck& ack,
                                               const Queueing& queueing, Deadline deadline) {
  std::string ttl_ms = std::to_string(ttl.count());
  std::string pid_text = std::to_string(pid);
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view keys[] = {m_keys.limit, m_keys.token, m_keys.queue, m_keys.tickets, m_keys.turns, m_keys.lock};
  std::string min_ms, records_ttl, keep;
  if (m_records) {
    min_ms = std::to_string(m_records->min_interval_ms);
    records_ttl = std::to_string(m_records->settings.ttl.count());
    keep = std::to_string(m_records->settings.keep);
  }
  std::string_view args[] = {owner,       ttl_ms,  pid_text, host,         queueing.fair ? "1" : "0",
                             queueing.queued ? "1" : "0", m_keys.wake, turn_ms, m_limit, m_keys.slots,
                             m_keys.runs_base, min_ms, records_ttl, keep,
                             m_records ? std::string_view(m_records->version) : std::string_view()};
  std::span<const std::string_view> sent_args(args, m_records ? 15 : 10);
  auto result = detail::acquire_with_ack(m_client, scripts::k_slots_acquire, keys, sent_args, ack, deadline);
  if (result)
    if (auto* acquired = std::get_if<Acquired>(&*result)) m_slot = acquired->slot;
  return result;
}

redis::Result<void> SlotsClient::leave_queue(std::string_view owner, Deadline deadline) {
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view keys[] = {m_keys.queue, m_keys.turns};
  std::string_view args[] = {owner, m_keys.wake, turn_ms, m_keys.slots, m_limit};
  Deadline sent{};
  auto reply = detail::run_script(m_client, scripts::k_slots_leave, keys, args, deadline, sent,
                                  redis::Resend::idempotent);
  if (!reply) return std::unexpected(reply.error());
  return {};
}

redis::Result<RenewOutcome> SlotsClient::renew_once(std::string_view value, std::chrono::milliseconds ttl, Deadline deadline,
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

redis::Result<bool> SlotsClient::release(std::string_view owner, std::optional<std::string_view> value,
                                  Deadline deadline) {
  // The script compares the owner id, the first word of the value: `value` adds nothing to that.
  (void)value;
  return release_with(owner, {}, deadline);
}

redis::Result<bool> SlotsClient::release_recorded(std::string_view owner, std::string_view value, const Acquired& acquired,
                                           const RunOutcome& outcome, Deadline deadline) {
  if (!m_records || acquired.started_us.empty() || !m_slot) return release(owner, value, deadline);
  const auto record_text = record_release_args(m_keys, *m_records, outcome, acquired.started_us, acquired.token, value,
                                                acquired.fired_us);
  const std::vector<std::string_view> record(record_text.begin(), record_text.end());
  return release_with(owner, record, deadline);
}

redis::Result<bool> SlotsClient::release_with(std::string_view owner, std::span<const std::string_view> record,
                                       Deadline deadline) {
  std::string slot = m_slot ? std::to_string(*m_slot) : std::string();
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view keys[] = {m_keys.limit, m_keys.queue, m_keys.turns};
  std::vector<std::string_view> args = {owner, slot, m_keys.slots, m_limit, m_keys.wake, turn_ms};
  args.insert(args.end(), record.begin(), record.end());
  Deadline sent{};
  auto reply = detail::run_script(m_client, scripts::k_slots_release, keys, args, deadline, sent,
                                  redis::Resend::idempotent);
  if (!reply) return std::unexpected(reply.error());
  auto n = reply->as_integer();
  if (!n) return std::unexpected(detail::protocol_error("unexpected reply to the release script"));
  return *n == 1;
}

}  // namespace fencerun::lease
