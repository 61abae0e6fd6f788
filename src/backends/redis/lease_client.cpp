#include "backends/redis/lease_client.hpp"

#include <charconv>
#include <span>
#include <vector>

#include "backends/redis/embedded_scripts.hpp"
#include "backends/redis/script_call.hpp"
#include "backends/redis/slots_client.hpp"

namespace fencerun::lease {
using redis::Reply;
using detail::protocol_error;
using detail::run_script;
using detail::to_number;

LockKeys keys_for(std::string_view prefix, std::string_view name) {
  std::string base = std::string(prefix) + "{" + std::string(name) + "}:";
  return LockKeys{base + "lock",    base + "token",  base + "queue", base + "tickets", base + "turn",
                  base + "wake:",   base + "limit",  base + "slot:", base + "turns", base};
}

std::optional<RunRecord> parse_run_in_progress(std::string_view value, std::string* owner) {
  std::vector<std::string_view> f;
  for (std::string_view rest = value; !rest.empty();) {
    const auto sp = rest.find(' ');
    f.push_back(rest.substr(0, sp));
    rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
  }
  if (f.size() != 6 && f.size() != 7) return std::nullopt;
  const auto start = to_number<std::uint64_t>(f[1]);
  if (!start) return std::nullopt;
  RunRecord r;
  r.start_us = *start;
  r.outcome = "running";
  r.token = to_number<std::uint64_t>(f[2]);
  r.pid = to_number<long>(f[3]);
  r.host = std::string(f[4]);
  r.version = std::string(f[5]);
  if (f.size() == 7) r.fire_us = to_number<std::uint64_t>(f[6]);
  if (owner) *owner = std::string(f[0]);
  return r;
}

redis::Result<AcquireResult> parse_acquire_reply(const Reply& reply, Deadline sent) {
  const auto& e = reply.elements;
  if (!reply.is_array() || e.size() < 2 || e[0].type != Reply::Type::integer ||
      (e[0].integer != 2 && e[0].integer != 4 && e[0].integer != 5 && e.size() < 4))
    return std::unexpected(protocol_error("unexpected reply to the acquire script"));
  if (e[0].integer == 2) {
    auto held = e[1].as_integer();
    if (!held || *held < 1) return std::unexpected(protocol_error("acquire script returned a malformed limit"));
    return LimitMismatch{static_cast<long>(*held)};
  }
  if (e[0].integer == 3) {
    auto now = e.size() >= 3 && e[2].is_string() ? to_number<std::uint64_t>(e[2].str) : std::nullopt;
    if (!e[1].is_string() || !now) return std::unexpected(protocol_error("acquire script returned a malformed skip"));
    const std::uint64_t server_now = *now;
    Skipped skipped{e[1].str, server_now};
    skipped.fired_us = server_now;
    if (e.size() >= 5 && e[4].is_string())
      if (auto fired = to_number<std::uint64_t>(e[4].str)) skipped.fired_us = *fired;
    return skipped;
  }
  if (e[0].integer == 5) {
    auto now = e[1].is_string() ? to_number<std::uint64_t>(e[1].str) : std::nullopt;
    if (!now) return std::unexpected(protocol_error("acquire script returned a malformed lost record"));
    Skipped skipped{"", *now};
    skipped.fired_us = *now;
    skipped.record_lost = true;
    return skipped;
  }
  if (e[0].integer == 4) {
    if (!e[1].is_string()) return std::unexpected(protocol_error("acquire script returned a malformed rule"));
    return RuleMismatch{e[1].str};
  }
  if (e[0].integer == 1) {
    auto token = e[1].as_integer();
    if (!token || *token <= 0 || !e[2].is_string())
      return std::unexpected(protocol_error("acquire script returned a malformed token"));
    auto gap = e.size() >= 5 ? e[4].as_integer() : std::nullopt;
    if (!gap || *gap < 0) return std::unexpected(protocol_error("acquire script returned no clock check"));
    Acquired acquired;
    acquired.token = static_cast<std::uint64_t>(*token);
    acquired.value = e[2].str;
    acquired.sent = sent;
    if (e.size() >= 6) {
      auto slot = e[5].as_integer();
      if (!slot || *slot < 0) return std::unexpected(protocol_error("acquire script returned a malformed slot"));
      acquired.slot = static_cast<int>(*slot);
    }
    if (e.size() >= 7 && e[6].is_string()) acquired.started_us = e[6].str;
    if (e.size() >= 8 && e[7].is_string()) acquired.fired_us = e[7].str;
    if (e.size() >= 9) acquired.new_record = e[8].as_integer().value_or(0) == 1;
    acquired.server_clock_behind = *gap > 0;
    acquired.server_clock_gap = std::chrono::microseconds(*gap);
    return acquired;
  }
  Busy busy;
  if (auto pttl = e[1].as_integer(); pttl && *pttl >= 0) busy.remaining = std::chrono::milliseconds(*pttl);
  if (e[2].is_string()) busy.holder = parse_holder(e[2].str);
  if (e.size() >= 5)
    if (auto turn = e[4].as_integer(); turn && *turn > 0) busy.turn_expires = std::chrono::milliseconds(*turn);
  if (e.size() >= 6)
    if (auto place = e[5].as_integer(); place && *place >= 0) busy.place = static_cast<long>(*place);
  if (e.size() >= 7)
    if (auto length = e[6].as_integer(); length && *length > 0) busy.queue_length = static_cast<long>(*length);
  if (e.size() >= 8 && e[7].is_string()) busy.now_us = to_number<std::uint64_t>(e[7].str);
  if (e.size() >= 9 && e[8].is_string()) busy.run = e[8].str;
  return busy;
}

redis::Result<AcquireResult> LeaseClient::try_acquire(std::string_view owner, std::chrono::milliseconds ttl, long pid,
                                               std::string_view host, const ReplicaAck& ack, const Queueing& queueing,
                                               Deadline deadline) {
  std::string ttl_ms = std::to_string(ttl.count());
  std::string pid_text = std::to_string(pid);
  std::string turn_ms = std::to_string(k_turn.count());
  // A run that does not queue (yet) declares only the two keys it uses, so a Cluster slot migration of
  // absent queue keys cannot make the request fail with TRYAGAIN.
  std::string_view all_keys[] = {m_keys.lock, m_keys.token, m_keys.queue, m_keys.tickets, m_keys.turn};
  std::span<const std::string_view> keys(all_keys, queueing.fair || queueing.queued ? 5 : 2);
  std::string min_ms, records_ttl, keep, every_ms, offset_ms, fired;
  if (m_records) {
    min_ms = std::to_string(m_records->min_interval_ms);
    records_ttl = std::to_string(m_records->settings.ttl.count());
    keep = std::to_string(m_records->settings.keep);
    every_ms = std::to_string(m_records->every_ms);
    offset_ms = std::to_string(m_records->slot_offset_ms);
    if (queueing.fired_us) fired = std::to_string(*queueing.fired_us);
  }
  std::string_view args[] = {owner,       ttl_ms,  pid_text,     host, queueing.fair ? "1" : "0",
                             queueing.queued ? "1" : "0", m_keys.wake, turn_ms, m_keys.limit, m_keys.slots,
                             m_keys.runs_base, min_ms, records_ttl, keep,
                             m_records ? std::string_view(m_records->version) : std::string_view(),
                             every_ms, offset_ms, fired,
                             m_records ? std::string_view(m_records->rule) : std::string_view(),
                             m_records && m_records->skip_if_record_lost ? "1" : "0"};
  std::span<const std::string_view> sent_args(args, m_records ? 20 : 10);
  return detail::acquire_with_ack(m_client, scripts::k_acquire, keys, sent_args, ack, deadline);
}

redis::Result<void> LeaseClient::note_trigger(std::string_view kind, std::uint64_t slot_us, std::string_view host,
                                              Deadline deadline) {
  if (!m_records) return {};
  const std::string slot = std::to_string(slot_us), ttl = std::to_string(m_records->settings.ttl.count()),
                    keep = std::to_string(m_records->settings.keep);
  std::string_view keys[] = {m_keys.lock};
  std::string_view args[] = {m_keys.runs_base, slot, kind, host, ttl, keep};
  Deadline sent{};
  auto r = run_script(m_client, scripts::k_note, keys, args, deadline, sent, redis::Resend::never);
  if (!r) return std::unexpected(r.error());
  return {};
}

redis::Result<RenewOutcome> LeaseClient::renew_once(std::string_view value, std::chrono::milliseconds ttl, Deadline deadline,
                                        Deadline& sent) {
  std::string ttl_ms = std::to_string(ttl.count());
  std::string_view keys[] = {m_keys.lock};
  std::string_view args[] = {value, ttl_ms};
  auto reply = run_script(m_client, scripts::k_renew, keys, args, deadline, sent, redis::Resend::idempotent);
  if (!reply) return std::unexpected(reply.error());
  auto n = reply->as_integer();
  if (!n) return std::unexpected(protocol_error("unexpected reply to the renew script"));
  if (*n == 1) return RenewOutcome::renewed;
  return *n == 0 ? RenewOutcome::gone : RenewOutcome::stolen;
}

ReleasePath release_path(const std::optional<redis::ServerInfo>& server) {
  if (!server) return ReleasePath::script;
  if (server->delifeq) return ReleasePath::delifeq;
  return server->delex ? ReleasePath::delex : ReleasePath::script;
}

std::string_view release_path_name(ReleasePath path) {
  switch (path) {
    case ReleasePath::delifeq: return "DELIFEQ";
    case ReleasePath::delex: return "DELEX";
    case ReleasePath::script: break;
  }
  return "script";
}

redis::Result<bool> LeaseClient::release(std::string_view owner, std::optional<std::string_view> value, Deadline deadline) {
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view queue_keys[] = {m_keys.lock, m_keys.queue, m_keys.turn};
  Deadline sent{};
  std::string_view wake_args[] = {m_keys.wake, turn_ms};
  const ReleasePath path = m_native_refused ? ReleasePath::script : release_path(m_client.server());
  if (value && path != ReleasePath::script) {
    // The wake script rides along in the same write: it wakes the first waiter if the lock is gone.
    std::vector<std::string_view> del = {"DELIFEQ", m_keys.lock, *value};
    if (path == ReleasePath::delex) del = {"DELEX", m_keys.lock, "IFEQ", *value};
    std::vector<std::vector<std::string_view>> commands = {
        std::move(del),
        {"EVALSHA", scripts::k_wake.sha1, "3", m_keys.lock, m_keys.queue, m_keys.turn, m_keys.wake, turn_ms}};
    auto replies = m_client.pipeline(commands, deadline, redis::Resend::idempotent);
    if (!replies) return std::unexpected(replies.error());
    const Reply& reply = replies->front();
    if (auto n = reply.as_integer(); n && !reply.is_error()) {
      // The delete ran; a wake that could not (the script not cached yet) is sent on its own.
      if ((*replies)[1].error_is("NOSCRIPT"))
        [[maybe_unused]] auto woken = run_script(m_client, scripts::k_wake, queue_keys, wake_args, deadline, sent,
                                                redis::Resend::idempotent);
      return *n == 1;
    }
    // Refused (renamed, not allowed by the ACL, absent after a failover): nothing was deleted.
    // Remember, and use the script.
    m_native_refused = true;
  }
  std::string_view args[] = {owner, m_keys.wake, turn_ms};
  auto reply = run_script(m_client, scripts::k_release, queue_keys, args, deadline, sent, redis::Resend::idempotent);
  if (!reply && reply.error().kind == redis::Error::Kind::migrating) {
    // The slot is migrating and the queue keys are not where the lock is: release the lock alone. A
    // waiter then notices at the end of the lease it was told about.
    reply = run_script(m_client, scripts::k_release, std::span(queue_keys, 1), args, deadline, sent,
                       redis::Resend::idempotent);
  }
  if (!reply) return std::unexpected(reply.error());
  auto n = reply->as_integer();
  if (!n) return std::unexpected(protocol_error("unexpected reply to the release script"));
  return *n == 1;
}

std::vector<std::string> record_release_args(const LockKeys& keys, const RecordArgs& records,
                                             const RunOutcome& outcome, std::string_view start, std::uint64_t token,
                                             std::string_view value, std::string_view fired) {
  const Holder h = parse_holder(value);
  return {keys.runs_base,
          outcome.outcome,
          outcome.exit_code ? std::to_string(*outcome.exit_code) : "-",
          outcome.signal ? std::to_string(*outcome.signal) : "-",
          std::to_string(records.settings.ttl.count()),
          std::to_string(records.settings.keep),
          std::string(start),
          std::to_string(token),
          h.pid ? std::to_string(*h.pid) : "-",
          h.host.empty() ? "-" : h.host,
          records.version,
          "",
          outcome.ran ? std::to_string(outcome.ran->count()) : "",
          std::string(fired)};
}

redis::Result<bool> LeaseClient::release_recorded(std::string_view owner, std::string_view value, const Acquired& acquired,
                                          const RunOutcome& outcome, Deadline deadline) {
  if (!m_records || acquired.started_us.empty()) return release(owner, value, deadline);
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view queue_keys[] = {m_keys.lock, m_keys.queue, m_keys.turn};
  const auto record_text = record_release_args(m_keys, *m_records, outcome, acquired.started_us, acquired.token, value,
                                                acquired.fired_us);
  const std::vector<std::string_view> record(record_text.begin(), record_text.end());
  std::string_view wake_args[] = {m_keys.wake, turn_ms};
  Deadline sent{};
  auto record_alone = [&](std::string_view known) -> redis::Result<void> {
    std::vector<std::string_view> args = {owner, value, known};
    args.insert(args.end(), std::begin(record), std::end(record));
    std::string_view lock_key[] = {m_keys.lock};
    auto r = run_script(m_client, scripts::k_record, lock_key, args, deadline, sent, redis::Resend::idempotent);
    if (!r) return std::unexpected(r.error());
    return {};
  };
  const ReleasePath path = m_native_refused ? ReleasePath::script : release_path(m_client.server());
  if (path != ReleasePath::script) {
    // The record first (it sees the lock still ours), then the native delete and the wake, in one
    // write: still one round trip.
    std::vector<std::string_view> rec = {"EVALSHA", scripts::k_record.sha1, "1", m_keys.lock, owner, value, ""};
    rec.insert(rec.end(), std::begin(record), std::end(record));
    std::vector<std::string_view> del = {"DELIFEQ", m_keys.lock, value};
    if (path == ReleasePath::delex) del = {"DELEX", m_keys.lock, "IFEQ", value};
    std::vector<std::vector<std::string_view>> commands = {
        std::move(rec), std::move(del),
        {"EVALSHA", scripts::k_wake.sha1, "3", m_keys.lock, m_keys.queue, m_keys.turn, m_keys.wake, turn_ms}};
    auto replies = m_client.pipeline(commands, deadline, redis::Resend::idempotent);
    if (!replies) return std::unexpected(replies.error());
    const bool recorded = !(*replies)[0].is_error();
    const Reply& reply = (*replies)[1];
    if (auto n = reply.as_integer(); n && !reply.is_error()) {
      if (!recorded) [[maybe_unused]] auto r = record_alone(*n == 1 ? "1" : "0");
      if ((*replies)[2].error_is("NOSCRIPT"))
        [[maybe_unused]] auto woken = run_script(m_client, scripts::k_wake, queue_keys, wake_args, deadline, sent,
                                                redis::Resend::idempotent);
      return *n == 1;
    }
    // Refused (renamed, not allowed by the ACL): nothing was deleted. The script from now on; the
    // record is written by it unless the record script already wrote it.
    m_native_refused = true;
    if (recorded) return release(owner, value, deadline);
  }
  std::vector<std::string_view> args = {owner, m_keys.wake, turn_ms};
  args.insert(args.end(), std::begin(record), std::end(record));
  auto reply = run_script(m_client, scripts::k_release, queue_keys, args, deadline, sent, redis::Resend::idempotent);
  if (!reply && reply.error().kind == redis::Error::Kind::migrating)
    reply = run_script(m_client, scripts::k_release, std::span(queue_keys, 1), args, deadline, sent,
                       redis::Resend::idempotent);
  if (!reply) return std::unexpected(reply.error());
  auto n = reply->as_integer();
  if (!n) return std::unexpected(protocol_error("unexpected reply to the release script"));
  return *n == 1;
}

redis::Result<void> LeaseClient::leave_queue(std::string_view owner, Deadline deadline) {
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view keys[] = {m_keys.lock, m_keys.queue, m_keys.turn};
  std::string_view args[] = {owner, m_keys.wake, turn_ms};
  Deadline sent{};
  auto reply = run_script(m_client, scripts::k_leave, keys, args, deadline, sent, redis::Resend::idempotent);
  if (!reply) return std::unexpected(reply.error());
  return {};
}

redis::Result<LockStatus> lock_status(redis::Client& client, const LockKeys& keys, Deadline deadline) {
  // While a Cluster slot migrates, the keys of one request may be on either node: a command answered
  // with a redirection is sent again on its own, which follows it.
  auto redirected = [&](redis::Result<std::vector<Reply>>& replies, const std::vector<std::vector<std::string_view>>& sent) {
    if (!replies) return;
    for (std::size_t i = 0; i < replies->size(); ++i) {
      Reply& r = (*replies)[i];
      if (!(r.error_is("ASK") || r.error_is("MOVED"))) continue;
      auto again = client.pipeline(std::span(&sent[i], 1), deadline, redis::Resend::idempotent);
      if (!again) {
        replies = std::unexpected(again.error());
        return;
      }
      r = std::move(again->front());
    }
  };
  auto check = [](const redis::Result<std::vector<Reply>>& replies) -> redis::Result<void> {
    if (!replies) return std::unexpected(replies.error());
    for (const auto& r : *replies)
      if (r.is_error()) return std::unexpected(protocol_error("status query failed: " + r.str));
    return {};
  };
  auto holder_at = [](long slot, const Reply& value, const Reply& pttl) -> std::optional<SlotHolder> {
    if (!value.is_string()) return std::nullopt;
    SlotHolder h{slot, parse_holder(value.str), std::nullopt};
    if (auto ms = pttl.as_integer(); ms && *ms >= 0) h.remaining = std::chrono::milliseconds(*ms);
    return h;
  };
  const std::string runs = keys.runs(), last_ok = keys.last_ok(), rule = keys.runs_base + "rule";
  std::vector<std::vector<std::string_view>> commands = {{"GET", keys.lock},   {"PTTL", keys.lock},
                                                         {"GET", keys.token},  {"GET", keys.limit},
                                                         {"ZCARD", keys.queue}, {"LINDEX", runs, "0"},
                                                         {"GET", last_ok},      {"TIME"},
                                                         {"GET", rule}};
  auto replies = client.pipeline(commands, deadline, redis::Resend::idempotent);
  redirected(replies, commands);
  if (auto ok = check(replies); !ok) return std::unexpected(ok.error());
  const auto& r = *replies;
  LockStatus s;
  if (r[2].is_string()) s.last_token = to_number<std::uint64_t>(r[2].str);
  s.waiters = static_cast<long>(r[4].as_integer().value_or(0));
  if (r[5].is_string()) s.last_run = r[5].str;
  if (r[6].is_string()) s.last_success = r[6].str;
  if (r.size() > 8 && r[8].is_string()) s.rule = r[8].str;
  if (r[7].is_array() && r[7].elements.size() == 2 && r[7].elements[0].is_string() && r[7].elements[1].is_string()) {
    auto sec = to_number<std::uint64_t>(r[7].elements[0].str), usec = to_number<std::uint64_t>(r[7].elements[1].str);
    if (sec && usec) s.now_us = *sec * 1'000'000 + *usec;
  }
  if (auto h = holder_at(0, r[0], r[1])) {
    s.holders.push_back(std::move(*h));
    return s;
  }
  const auto limit = r[3].is_string() ? to_number<long>(r[3].str) : std::nullopt;
  if (!limit || *limit < 2 || *limit > k_max_limit) return s;
  // A counting lock: its slots, in a second round trip.
  std::vector<std::string> slot_keys;
  for (long i = 0; i < *limit; ++i) slot_keys.push_back(keys.slot(i));
  std::vector<std::vector<std::string_view>> slot_commands;
  for (const auto& k : slot_keys) {
    slot_commands.push_back({"GET", k});
    slot_commands.push_back({"PTTL", k});
  }
  auto slots = client.pipeline(slot_commands, deadline, redis::Resend::idempotent);
  redirected(slots, slot_commands);
  if (auto ok = check(slots); !ok) return std::unexpected(ok.error());
  for (long i = 0; i < *limit; ++i)
    if (auto h = holder_at(i, (*slots)[2 * i], (*slots)[2 * i + 1])) s.holders.push_back(std::move(*h));
  // Slots all gone: the stored limit binds nobody and the lock is free.
  if (!s.holders.empty()) s.limit = *limit;
  return s;
}

redis::Result<Bumped> bump_counter(redis::Client& client, const LockKeys& keys, std::uint64_t above, Deadline deadline) {
  std::string n = std::to_string(above);
  std::string_view script_keys[] = {keys.token};
  std::string_view args[] = {n};
  Deadline sent{};
  auto reply = run_script(client, scripts::k_bump, script_keys, args, deadline, sent);
  if (!reply) return std::unexpected(reply.error());
  const auto& e = reply->elements;
  if (!reply->is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string())
    return std::unexpected(protocol_error("unexpected reply to the bump script"));
  Bumped b;
  if (e[0].str != "-1") b.before = to_number<std::uint64_t>(e[0].str);
  auto after = to_number<std::uint64_t>(e[1].str);
  if (!after) return std::unexpected(protocol_error("unexpected reply to the bump script"));
  b.after = *after;
  return b;
}

redis::Result<bool> release_holder(redis::Client& client, const LockKeys& keys, long limit, std::string_view owner,
                            Deadline deadline) {
  if (limit > 1) return SlotsClient(client, keys, limit).release(owner, std::nullopt, deadline);
  return LeaseClient(client, keys).release(owner, std::nullopt, deadline);
}

}  // namespace fencerun::lease
