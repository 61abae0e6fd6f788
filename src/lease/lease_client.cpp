#include "lease/lease_client.hpp"

#include <charconv>
#include <span>
#include <vector>

#include "lease/embedded_scripts.hpp"

namespace fencerun::lease {
namespace {

using redis::Error;
using redis::Reply;
using redis::Result;

Error protocol_error(std::string what) { return Error{Error::Kind::protocol, std::move(what)}; }

template <class T>
std::optional<T> to_number(std::string_view s) {
  T value{};
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc{} || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

// EVALSHA, then EVAL when the server does not have the script cached (first use after a restart or
// SCRIPT FLUSH). `followups` go out in the same write, after the script. `sent` is read just before the
// request that produced the replies was written.
Result<std::vector<Reply>> run_script(redis::Client& client, const scripts::Source& script,
                                      std::span<const std::string_view> keys, std::span<const std::string_view> args,
                                      std::span<const std::vector<std::string_view>> followups, Deadline deadline,
                                      Deadline& sent) {
  if (auto ok = client.connect(deadline); !ok) return std::unexpected(ok.error());
  std::string numkeys = std::to_string(keys.size());
  std::vector<std::vector<std::string_view>> commands(1 + followups.size());
  auto& argv = commands.front();
  argv.reserve(3 + keys.size() + args.size());
  argv.push_back("EVALSHA");
  argv.push_back(script.sha1);
  argv.push_back(numkeys);
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());
  std::copy(followups.begin(), followups.end(), commands.begin() + 1);
  sent = BootClock::now();
  auto replies = client.pipeline(commands, deadline);
  if (replies && replies->front().error_is("NOSCRIPT")) {
    argv[0] = "EVAL";
    argv[1] = script.text;
    sent = BootClock::now();
    replies = client.pipeline(commands, deadline);
  }
  if (replies && replies->front().error_is("TRYAGAIN"))
    return std::unexpected(Error{Error::Kind::migrating, std::string(script.name) + " script refused: " + replies->front().str});
  if (replies && replies->front().is_error())
    return std::unexpected(Error{Error::Kind::protocol, std::string(script.name) + " script failed: " + replies->front().str});
  return replies;
}

Result<Reply> run_script(redis::Client& client, const scripts::Source& script, std::span<const std::string_view> keys,
                         std::span<const std::string_view> args, Deadline deadline, Deadline& sent) {
  auto replies = run_script(client, script, keys, args, {}, deadline, sent);
  if (!replies) return std::unexpected(replies.error());
  return std::move(replies->front());
}

}  // namespace

LockKeys keys_for(std::string_view prefix, std::string_view name) {
  std::string base = std::string(prefix) + "{" + std::string(name) + "}:";
  return LockKeys{base + "lock", base + "token", base + "queue", base + "tickets", base + "turn", base + "wake:"};
}

Holder parse_holder(std::string_view value) {
  Holder h;
  std::string_view fields[4];
  std::size_t n = 0;
  while (n < 4 && !value.empty()) {
    auto sp = n < 3 ? value.find(' ') : std::string_view::npos;
    fields[n++] = value.substr(0, sp);
    value = sp == std::string_view::npos ? std::string_view{} : value.substr(sp + 1);
  }
  h.owner = std::string(fields[0]);
  if (n >= 2) h.token = to_number<std::uint64_t>(fields[1]);
  if (n >= 3) h.pid = to_number<long>(fields[2]);
  if (n >= 4) h.host = std::string(fields[3]);
  return h;
}

Result<AcquireResult> parse_acquire_reply(const Reply& reply, Deadline sent) {
  const auto& e = reply.elements;
  if (!reply.is_array() || e.size() < 4 || e[0].type != Reply::Type::integer)
    return std::unexpected(protocol_error("unexpected reply to the acquire script"));
  long version = static_cast<long>(e[3].as_integer().value_or(0));
  if (e[0].integer == 1) {
    auto token = e[1].as_integer();
    if (!token || *token <= 0 || !e[2].is_string())
      return std::unexpected(protocol_error("acquire script returned a malformed token"));
    auto gap = e.size() >= 5 ? e[4].as_integer() : std::nullopt;
    if (!gap || *gap < 0) return std::unexpected(protocol_error("acquire script returned no clock check"));
    Acquired acquired{static_cast<std::uint64_t>(*token), e[2].str, sent, version, std::nullopt};
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
  return busy;
}

Result<AcquireResult> LeaseClient::try_acquire(std::string_view owner, std::chrono::milliseconds ttl, long pid,
                                               std::string_view host, const ReplicaAck& ack, const Queueing& queueing,
                                               Deadline deadline) {
  std::string ttl_ms = std::to_string(ttl.count());
  std::string pid_text = std::to_string(pid);
  std::string turn_ms = std::to_string(k_turn.count());
  // A run that does not queue (yet) declares only the two keys it uses, so a Cluster slot migration of
  // absent queue keys cannot make the request fail with TRYAGAIN.
  std::string_view all_keys[] = {m_keys.lock, m_keys.token, m_keys.queue, m_keys.tickets, m_keys.turn};
  std::span<const std::string_view> keys(all_keys, queueing.fair || queueing.queued ? 5 : 2);
  std::string_view args[] = {owner, ttl_ms, pid_text, host, queueing.fair ? "1" : "0", queueing.queued ? "1" : "0",
                             m_keys.wake, turn_ms};
  std::string replicas = std::to_string(ack.replicas);
  std::string wait_ms = std::to_string(ack.timeout.count());
  std::vector<std::vector<std::string_view>> followups;
  // WAIT goes out with the script: still one round trip. After a busy reply it returns at once.
  if (ack.replicas > 0) followups.push_back({"WAIT", replicas, wait_ms});
  Deadline sent{};
  // Only a WAIT may legitimately hold the reply back for longer than the request timeout.
  Deadline bound = ack.replicas > 0 ? deadline + ack.timeout : deadline;
  auto replies = run_script(m_client, scripts::k_acquire, keys, args, followups, bound, sent);
  if (!replies) return std::unexpected(replies.error());
  auto result = parse_acquire_reply(replies->front(), sent);
  if (!result) return std::unexpected(result.error());
  if (auto* acquired = std::get_if<Acquired>(&*result); acquired && ack.replicas > 0) {
    const Reply& w = (*replies)[1];
    if (w.is_error()) return std::unexpected(protocol_error("WAIT failed: " + w.str));
    acquired->replicas_acked = w.as_integer().value_or(0);
  }
  return result;
}

Result<RenewOutcome> LeaseClient::renew(std::string_view value, std::chrono::milliseconds ttl, Deadline deadline,
                                        Deadline& sent) {
  std::string ttl_ms = std::to_string(ttl.count());
  std::string_view keys[] = {m_keys.lock};
  std::string_view args[] = {value, ttl_ms};
  auto reply = run_script(m_client, scripts::k_renew, keys, args, deadline, sent);
  if (!reply) return std::unexpected(reply.error());
  auto n = reply->as_integer();
  if (!n) return std::unexpected(protocol_error("unexpected reply to the renew script"));
  if (*n == 1) return RenewOutcome::renewed;
  return *n == 0 ? RenewOutcome::gone : RenewOutcome::stolen;
}

Result<bool> LeaseClient::release(std::string_view owner, std::optional<std::string_view> value, bool try_delex,
                                  Deadline deadline) {
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view queue_keys[] = {m_keys.lock, m_keys.queue, m_keys.turn};
  Deadline sent{};
  std::string_view wake_args[] = {m_keys.wake, turn_ms};
  if (value && try_delex && !m_delex_unsupported) {
    // The wake script rides along in the same write: it wakes the first waiter if the lock is gone.
    std::vector<std::vector<std::string_view>> commands = {
        {"DELEX", m_keys.lock, "IFEQ", *value},
        {"EVALSHA", scripts::k_wake.sha1, "3", m_keys.lock, m_keys.queue, m_keys.turn, m_keys.wake, turn_ms}};
    auto replies = m_client.pipeline(commands, deadline);
    if (!replies) return std::unexpected(replies.error());
    const Reply& reply = replies->front();
    if (auto n = reply.as_integer(); n && !reply.is_error()) {
      // The DELEX ran; a wake that could not (the script not cached yet) is sent on its own.
      if ((*replies)[1].error_is("NOSCRIPT"))
        [[maybe_unused]] auto woken = run_script(m_client, scripts::k_wake, queue_keys, wake_args, deadline, sent);
      return *n == 1;
    }
    // Renamed, disabled or absent after all: remember and use the script.
    m_delex_unsupported = true;
  }
  std::string_view args[] = {owner, m_keys.wake, turn_ms};
  auto reply = run_script(m_client, scripts::k_release, queue_keys, args, deadline, sent);
  if (!reply && reply.error().kind == Error::Kind::migrating) {
    // The slot is migrating and the queue keys are not where the lock is: release the lock alone. A
    // waiter then notices at the end of the lease it was told about.
    reply = run_script(m_client, scripts::k_release, std::span(queue_keys, 1), args, deadline, sent);
  }
  if (!reply) return std::unexpected(reply.error());
  auto n = reply->as_integer();
  if (!n) return std::unexpected(protocol_error("unexpected reply to the release script"));
  return *n == 1;
}

Result<void> LeaseClient::leave_queue(std::string_view owner, Deadline deadline) {
  std::string turn_ms = std::to_string(k_turn.count());
  std::string_view keys[] = {m_keys.lock, m_keys.queue, m_keys.turn};
  std::string_view args[] = {owner, m_keys.wake, turn_ms};
  Deadline sent{};
  auto reply = run_script(m_client, scripts::k_leave, keys, args, deadline, sent);
  if (!reply) return std::unexpected(reply.error());
  return {};
}

Result<LockStatus> LeaseClient::status(Deadline deadline) {
  std::vector<std::vector<std::string_view>> commands = {
      {"GET", m_keys.lock}, {"PTTL", m_keys.lock}, {"GET", m_keys.token}};
  auto replies = m_client.pipeline(commands, deadline);
  if (!replies) return std::unexpected(replies.error());
  for (const auto& r : *replies)
    if (r.is_error()) return std::unexpected(protocol_error("status query failed: " + r.str));
  LockStatus s;
  const auto& value = (*replies)[0];
  if (value.is_string()) {
    s.holder = parse_holder(value.str);
    if (auto pttl = (*replies)[1].as_integer(); pttl && *pttl >= 0) s.remaining = std::chrono::milliseconds(*pttl);
  }
  if ((*replies)[2].is_string()) {
    if (auto t = to_number<std::uint64_t>((*replies)[2].str)) s.last_token = *t;
  }
  return s;
}

}  // namespace fencerun::lease
