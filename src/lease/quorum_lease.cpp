// Quorum mode. The lease and the fencing token on N = 3, 5 or 7 independent servers, majority M =
// N/2 + 1, all requests of a round sent at once (one worker per server, lease/fanout.hpp).
//
// Lease (as Redlock computes it). Round 1 sets the lock (SET NX PX ttl, owner-checked) on every
// server; it is held when M servers set it. Its deadline is measured from the round's earliest send
// time t0, deadline = t0 + ttl - drift (drift = ttl/100 + 2ms): each server that set the key received
// the request after t0, so the key lives there at least until then (up to clock rate drift). Renewal
// is the same round with an owner-checked PEXPIRE; a renewal counts when M servers renewed, and moves
// the deadline to its own t0 + ttl - drift. The keeper (keeper.hpp) stops the job before the deadline
// exactly as in single-server mode. Another client can hold the lock only on a majority, which shares
// a server with ours, where our key still lives: exclusion holds while no more than N - M servers lose
// their data (a restart without persistence) within one TTL. A failed acquisition deletes what it
// set, owner-checked, on every server.
//
// Token (a majority register, with no assumption on clocks). Round 1 also reads each server's token
// counter and clock. The token is
//     token = max(1 + the greatest counter of the servers that answered, the greatest server clock in µs)
// and round 2 writes it back to every server where our lease is present (raise-only: counter =
// max(counter, token)); the command starts only once M servers confirmed that write. Why the next
// token T' is greater than T: T's write-back set W has M servers; the reading set R of the next
// acquisition counts only when M servers in it report a counter, so it shares a server s with W.
//   - s kept its data since the write: its counter is >= T (raise-only), so T' > T.
//   - s lost its data after the write (restarted empty): it reports no counter, so it is not in R,
//     unless a later write-back repaired it; that write-back carried a token issued after T, greater
//     by the same argument (induction over the acquisitions in order). A late write-back of an older
//     acquisition cannot lower anything (raise-only) and cannot reach a restarted server at all: it is
//     owner-checked, and a restarted server has no lease of that owner.
// So: a server that lost its data does not count towards a majority until a write-back repaired its
// counter; with fewer than M servers reporting a counter, the acquisition is refused (unavailable)
// rather than risk a token that goes backwards. The one exception: when all N servers answered and
// none reports a counter, NAME is new (or more than N - M servers lost their data, which the lease's
// assumption excludes too); then the servers' clocks are the only floor, as in single-server mode,
// and fencerun says so (warning no_counter). When only some answered and none has a counter, that is
// not enough: one server that lost its data and one that never had the counter look the same, so the
// acquisition is refused until every server answers.
// Assumption: a server either keeps its data or loses all of NAME's keys; a server restored from an
// older snapshot (or a replica promoted after missing writes) reports a stale counter and is not
// covered beyond the clock floor.
#include "lease/quorum_lease.hpp"

#include <algorithm>
#include <random>
#include <variant>

#include "lease/embedded_scripts.hpp"
#include "lease/fanout.hpp"
#include "lease/keeper.hpp"
#include "lease/lease_client.hpp"
#include "lease/script_call.hpp"
#include "log/log.hpp"
#include "util/duration.hpp"

namespace fencerun::lease {
namespace {

using redis::Client;
using redis::Error;
using redis::Reply;
using redis::Result;
using detail::protocol_error;
using detail::run_script;
using detail::to_number;

constexpr std::uint64_t k_token_limit = 9'007'199'254'740'992ULL;  // 2^53, as the single-server scripts

// One server's answer to round 1 (quorum_acquire.lua).
struct Claim {
  bool set = false;
  std::optional<std::uint64_t> counter;  // nullopt: the counter key is missing there
  std::uint64_t time_us = 0;
  Holder holder;                          // when not set
  std::optional<milliseconds> remaining;  // the holder's, when not set
};

Result<Claim> parse_claim(const Reply& r) {
  const auto& e = r.elements;
  if (!r.is_array() || e.size() != 6) return std::unexpected(protocol_error("unexpected reply to the acquire script"));
  Claim c;
  c.set = e[0].as_integer() == 1;
  if (e[1].is_string()) {
    c.counter = to_number<std::uint64_t>(e[1].str);
    if (!c.counter) return std::unexpected(protocol_error("the token counter does not hold a number"));
  }
  auto seconds = e[2].as_integer(), micros = e[3].as_integer();
  if (!seconds || !micros) return std::unexpected(protocol_error("acquire script returned no TIME"));
  c.time_us = static_cast<std::uint64_t>(*seconds) * 1'000'000 + static_cast<std::uint64_t>(*micros);
  if (e[4].is_string()) c.holder = parse_holder(e[4].str);
  if (auto pttl = e[5].as_integer(); pttl && *pttl >= 0) c.remaining = milliseconds(*pttl);
  return c;
}

std::string owner_of(std::string_view value) { return std::string(value.substr(0, value.find(' '))); }

template <class T>
std::size_t count_if_ok(const Fanout::Replies<T>& replies, const std::function<bool(const T&)>& pred) {
  return static_cast<std::size_t>(
      std::ranges::count_if(replies, [&](const auto& r) { return r && r->has_value() && pred(**r); }));
}

// The first failure among `replies`, "server I: message", for the logs.
template <class T>
std::string first_failure(const std::vector<Result<T>>& replies, const std::vector<std::string>& urls) {
  for (std::size_t i = 0; i < replies.size(); ++i)
    if (!replies[i]) return "server " + std::to_string(i + 1) + " (" + urls[i] + "): " + replies[i].error().message;
  return "no failure";
}

// The quorum's requests, each a round on every server at once.
class QuorumOps final : public Renewer {
 public:
  QuorumOps(const QuorumTarget& target, LockKeys keys)
      : m_fanout(target.servers), m_endpoints(target.servers), m_urls(target.redacted_urls), m_keys(std::move(keys)) {}

  std::size_t size() const { return m_fanout.size(); }
  std::size_t majority() const { return majority_of(size()); }
  const std::vector<std::string>& urls() const { return m_urls; }
  const std::vector<redis::RedisEndpoint>& endpoints() const { return m_endpoints; }
  // Every release publishes here on every server; waiters listen on one of them. (No queue in quorum
  // mode, so no waiter's own channel; "released" is no owner id, which is hex.)
  std::string released_channel() const { return m_keys.wake + "released"; }

  // Round 1. Ends early once it is decided: M servers set the lock and M report a counter (the rest
  // cannot change the token's guarantee, only raise it, and round 2 raises them anyway).
  std::vector<Result<Claim>> claim(const std::string& value, milliseconds ttl, Deadline until) {
    const std::size_t m = majority();
    return m_fanout.round<Claim>(
        [lock = m_keys.lock, token = m_keys.token, value, owner = owner_of(value),
         ttl_ms = std::to_string(ttl.count()), until](Client& client, std::size_t) -> Result<Claim> {
          std::string_view keys[] = {lock, token};
          std::string_view args[] = {value, ttl_ms, owner};
          Deadline sent{};
          auto reply = run_script(client, scripts::k_quorum_acquire, keys, args, until, sent);
          if (!reply) return std::unexpected(reply.error());
          return parse_claim(*reply);
        },
        until, [m](const Fanout::Replies<Claim>& r) {
          return count_if_ok<Claim>(r, [](const Claim& c) { return c.set; }) >= m &&
                 count_if_ok<Claim>(r, [](const Claim& c) { return c.counter.has_value(); }) >= m;
        });
  }

  // Round 2: the token written back where our lease is; true where it was. Ends once M confirmed.
  std::vector<Result<bool>> write_back(const std::string& value, std::uint64_t token, Deadline until) {
    const std::size_t m = majority();
    return m_fanout.round<bool>(
        [lock = m_keys.lock, counter = m_keys.token, value, owner = owner_of(value),
         text = std::to_string(token), until](Client& client, std::size_t) -> Result<bool> {
          std::string_view keys[] = {lock, counter};
          std::string_view args[] = {owner, text, value};
          Deadline sent{};
          auto reply = run_script(client, scripts::k_quorum_token, keys, args, until, sent);
          if (!reply) return std::unexpected(reply.error());
          auto n = reply->as_integer();
          if (!n) return std::unexpected(protocol_error("unexpected reply to the token script"));
          return *n == 1;
        },
        until, [m](const Fanout::Replies<bool>& r) { return count_if_ok<bool>(r, [](bool b) { return b; }) >= m; });
  }

  // Owner-checked renewal on every server: renewed once M renewed; lost once M say gone or taken.
  Result<RenewOutcome> renew(std::string_view value, milliseconds ttl, Deadline deadline, Deadline& sent) override {
    const std::size_t m = majority();
    sent = BootClock::now();  // the earliest send time of the round
    auto replies = m_fanout.round<RenewOutcome>(
        [lock = m_keys.lock, owner = owner_of(value), ttl_ms = std::to_string(ttl.count()), deadline](
            Client& client, std::size_t) -> Result<RenewOutcome> {
          std::string_view keys[] = {lock};
          std::string_view args[] = {owner, ttl_ms};
          Deadline s{};
          auto reply = run_script(client, scripts::k_quorum_renew, keys, args, deadline, s);
          if (!reply) return std::unexpected(reply.error());
          auto n = reply->as_integer();
          if (!n) return std::unexpected(protocol_error("unexpected reply to the renew script"));
          return *n == 1 ? RenewOutcome::renewed : *n == 0 ? RenewOutcome::gone : RenewOutcome::stolen;
        },
        deadline, [m](const Fanout::Replies<RenewOutcome>& r) {
          return count_if_ok<RenewOutcome>(r, [](RenewOutcome o) { return o == RenewOutcome::renewed; }) >= m ||
                 count_if_ok<RenewOutcome>(r, [](RenewOutcome o) { return o != RenewOutcome::renewed; }) >= m;
        });
    std::size_t renewed = 0, gone = 0, stolen = 0;
    for (const auto& r : replies) {
      if (!r) continue;
      renewed += *r == RenewOutcome::renewed;
      gone += *r == RenewOutcome::gone;
      stolen += *r == RenewOutcome::stolen;
    }
    if (renewed >= m) return RenewOutcome::renewed;
    if (gone + stolen >= m) return stolen > 0 ? RenewOutcome::stolen : RenewOutcome::gone;
    return std::unexpected(Error{Error::Kind::connection,
                                 "renewed on " + std::to_string(renewed) + " of " + std::to_string(size()) +
                                     " servers (a majority is " + std::to_string(m) + "); " +
                                     first_failure(replies, m_urls)});
  }

  struct ReleaseTally {
    std::size_t deleted = 0;   // our lease was there and is gone
    std::size_t not_ours = 0;  // it was not there (expired, lost with the server's data, or taken)
  };
  // Owner-checked compare-and-delete on every server. Ends once M deleted. With `wake`, each server
  // that deleted tells the waiters listening there. The undoing of a failed attempt does not: a waiter
  // that set the lock on a minority and undid it would wake the others, who would do the same, for as
  // long as the lock is held.
  ReleaseTally release(const std::string& owner, Deadline until, bool wake) {
    const std::size_t m = majority();
    auto replies = m_fanout.round<bool>(
        [keys = m_keys, owner, until, wake, channel = released_channel()](Client& client, std::size_t) {
          auto deleted = release_holder(client, keys, 1, owner, until);
          // Best effort: the waiters also poll.
          if (wake && deleted && *deleted)
            [[maybe_unused]] auto woken = client.command({"PUBLISH", channel, "released"}, until);
          return deleted;
        },
        until, [m](const Fanout::Replies<bool>& r) { return count_if_ok<bool>(r, [](bool b) { return b; }) >= m; });
    ReleaseTally out;
    for (const auto& r : replies)
      if (r) ++(*r ? out.deleted : out.not_ours);
    return out;
  }

 private:
  Fanout m_fanout;
  std::vector<redis::RedisEndpoint> m_endpoints;
  std::vector<std::string> m_urls;
  LockKeys m_keys;
};

milliseconds since(Deadline t) { return std::chrono::duration_cast<milliseconds>(BootClock::now() - t); }

milliseconds jittered(milliseconds base, std::mt19937& rng) {
  std::uniform_int_distribution<long> jitter(base.count() * 3 / 4, base.count() * 5 / 4);
  return milliseconds(std::max(jitter(rng), 1L));
}

class QuorumHeldLease final : public KeptLease {
 public:
  QuorumHeldLease(QuorumOps& ops, Acquired acquired, const LeaseRequest& request, log::Context context)
      : KeptLease(ops, std::move(acquired), request, std::move(context)), m_ops(ops) {}

  ~QuorumHeldLease() override {
    try {
      stop_keeping();
      if (!m_released) release();
    } catch (...) {  // a destructor must not throw; the lock expires by itself
    }
  }

  std::uint64_t token() const override { return m_acquired.token; }
  long slot() const override { return 0; }
  std::vector<std::pair<std::string, std::string>> facts() const override {
    std::string urls;
    for (const auto& u : m_ops.urls()) urls += (urls.empty() ? "" : " ") + u;
    return {{"FENCERUN_TOKEN", std::to_string(m_acquired.token)},
            {"FENCERUN_LOCK", m_request.lock},
            {"FENCERUN_OWNER", m_request.owner},
            {"FENCERUN_TTL_MS", std::to_string(m_request.timing.ttl.count())},
            {"FENCERUN_REDIS_URL", urls},
            {"FENCERUN_SERVERS", std::to_string(m_ops.size())},
            {"FENCERUN_SLOT", "0"},
            {"FENCERUN_LIMIT", "1"}};
  }

  // Released when a majority deleted it; not ours when a majority answered and fewer deleted it.
  Released release() override {
    stop_keeping();
    m_released = true;
    const auto r = m_ops.release(m_request.owner, BootClock::now() + m_request.request_timeout, /*wake=*/true);
    const std::size_t m = m_ops.majority();
    if (r.deleted >= m) {
      log::event(log::Level::info, "released", "released lock", m_context);
      return Released::yes;
    }
    if (r.deleted + r.not_ours >= m) return Released::not_ours;
    log::event(log::Level::warn, "release_failed",
               "could not release the lock on a majority of the servers (it expires by itself): deleted on " +
                   std::to_string(r.deleted) + ", answered by " + std::to_string(r.deleted + r.not_ours) + " of " +
                   std::to_string(m_ops.size()),
               m_context);
    return Released::failed;
  }

 private:
  QuorumOps& m_ops;
  bool m_released = false;
};

// What one acquisition attempt came to.
struct HeldElsewhere {
  Holder holder;
  std::optional<milliseconds> remaining;  // the shortest of the holders' leases
};
struct Unavailable {
  std::string why;
};
using Attempt = std::variant<Acquired, HeldElsewhere, Unavailable>;

class QuorumLease final : public Lease {
 public:
  QuorumLease(QuorumTarget target, LeaseRequest request)
      : m_request(std::move(request)), m_ops(target, keys_for(target.key_prefix, m_request.lock)) {}

  std::expected<std::unique_ptr<HeldLease>, NotAcquired> acquire(Waiter& waiter, milliseconds& waited) override;

 private:
  Attempt attempt();
  // Listens for releases on the first server, from `first` on, that takes the subscription; nullopt
  // when none does (then the waiter only polls).
  std::optional<redis::Client> subscribe(std::size_t first);
  // Round 2 for a lock held on a majority since `sent`.
  Attempt token_for(const std::vector<Result<Claim>>& claims, Deadline sent);
  // Undoes a failed attempt on every server (owner-checked). Kept short: an unresponsive server will
  // not answer this either, and the lock expires anyway.
  void undo() {
    auto cleanup = std::min<milliseconds>(m_request.request_timeout / 4, milliseconds(200));
    m_ops.release(m_request.owner, BootClock::now() + cleanup, /*wake=*/false);
  }
  std::string servers_text() const {
    return std::to_string(m_ops.size()) + " servers (a majority is " + std::to_string(m_ops.majority()) + ")";
  }
  log::Field servers_field() const { return {"servers", std::to_string(m_ops.size())}; }

  LeaseRequest m_request;
  QuorumOps m_ops;
};

Attempt QuorumLease::attempt() {
  const LeaseSchedule schedule(m_request.timing);
  const Deadline sent = BootClock::now();
  const Deadline deadline = schedule.deadline_after(sent);
  // A reply after the stop point is of no use: the command could not start.
  const Deadline bound = std::min(sent + m_request.request_timeout, schedule.stop_at(deadline));
  const std::string value =
      m_request.owner + " 0 " + std::to_string(m_request.pid) + " " + m_request.host;
  const auto claims = m_ops.claim(value, m_request.timing.ttl, bound);

  std::size_t set = 0, answered = 0;
  HeldElsewhere busy;
  bool maybe_set = false;
  for (const auto& c : claims) {
    if (!c) {
      maybe_set = maybe_set || c.error().maybe_executed || c.error().kind == Error::Kind::protocol;
      continue;
    }
    ++answered;
    if (c->set) {
      ++set;
      continue;
    }
    if (c->remaining && (!busy.remaining || *c->remaining < *busy.remaining)) {
      busy.remaining = c->remaining;
      busy.holder = c->holder;
    }
    if (busy.holder.owner.empty()) busy.holder = c->holder;
  }
  const std::size_t m = m_ops.majority();
  if (set < m) {
    if (set > 0 || maybe_set) undo();
    if (answered < m)
      return Unavailable{"only " + std::to_string(answered) + " of " + std::to_string(m_ops.size()) +
                         " servers answered; " + first_failure(claims, m_ops.urls())};
    return busy;
  }
  if (BootClock::now() >= schedule.stop_at(deadline)) {
    undo();
    return Unavailable{"the majority's replies came too late: the lease would have run short before the command "
                       "started"};
  }
  return token_for(claims, sent);
}

Attempt QuorumLease::token_for(const std::vector<Result<Claim>>& claims, Deadline sent) {
  const std::size_t m = m_ops.majority();
  std::size_t answered = 0, with_counter = 0;
  std::uint64_t max_counter = 0, max_time = 0;
  for (const auto& c : claims) {
    if (!c) continue;
    ++answered;
    max_time = std::max(max_time, c->time_us);
    if (c->counter) {
      ++with_counter;
      max_counter = std::max(max_counter, *c->counter);
    }
  }
  if (with_counter > 0 && with_counter < m) {
    undo();
    std::string missing;
    for (std::size_t i = 0; i < claims.size(); ++i)
      if (claims[i] && !claims[i]->counter) missing += (missing.empty() ? "" : ", ") + std::to_string(i + 1);
    return Unavailable{"only " + std::to_string(with_counter) + " of the " + std::to_string(answered) +
                       " servers that answered know the token counter (a majority of all " +
                       std::to_string(m_ops.size()) + " must, or none): no token is issued that might not be greater "
                       "than the last; without a counter: server " + missing + " (restarted without its data, or never "
                       "used for this lock); raise its counter above the last token issued, at least " +
                       std::to_string(max_counter) + ": fencerun -r URL bump " + m_request.lock + " --above TOKEN"};
  }
  if (with_counter == 0 && answered < m_ops.size()) {
    // No counter among a majority is not enough to call NAME new: one server that lost its data and
    // one that never had the counter (down since NAME was first used) look the same, and the server
    // that holds the last counter may be the one that did not answer. Only all N can tell.
    undo();
    std::string silent;
    for (std::size_t i = 0; i < claims.size(); ++i)
      if (!claims[i]) silent += (silent.empty() ? "" : ", ") + std::to_string(i + 1);
    return Unavailable{"no server that answered knows the token counter and server " + silent +
                       " did not answer: a new lock cannot be told from lost counters until every server answers "
                       "(or raise the counters of the servers that answered: fencerun -r URL bump " + m_request.lock +
                       " --above TOKEN)"};
  }
  if (with_counter == 0)
    log::event(log::Level::warn, "no_counter",
               "no server of the quorum has a token counter for '" + m_request.lock +
                   "' (a new lock: every server answered): the token rests on the servers' clocks alone",
               {{"lock", m_request.lock}, servers_field()});
  const std::uint64_t token = std::max(max_counter + 1, max_time);
  if (token >= k_token_limit) {
    undo();
    return Unavailable{"the token would pass 2^53"};
  }
  const std::string final_value = m_request.owner + " " + std::to_string(token) + " " + std::to_string(m_request.pid) +
                                  " " + m_request.host;
  const LeaseSchedule schedule(m_request.timing);
  const Deadline bound =
      std::min(BootClock::now() + m_request.request_timeout, schedule.stop_at(schedule.deadline_after(sent)));
  const auto written = m_ops.write_back(final_value, token, bound);
  const auto confirmed =
      static_cast<std::size_t>(std::ranges::count_if(written, [](const Result<bool>& w) { return w && *w; }));
  if (confirmed < m) {
    undo();
    return Unavailable{"the token write-back was confirmed by " + std::to_string(confirmed) + " of " +
                       std::to_string(m_ops.size()) + " servers; " + first_failure(written, m_ops.urls())};
  }
  Acquired acquired;
  acquired.token = token;
  acquired.value = final_value;
  acquired.sent = sent;
  return acquired;
}

std::optional<redis::Client> QuorumLease::subscribe(std::size_t first) {
  const std::size_t n = m_ops.size();
  // A server that does not answer may take only its share of one request's time.
  const auto share = std::max<milliseconds>(m_request.request_timeout / static_cast<long>(n), milliseconds(50));
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (first + k) % n;
    std::optional<redis::Client> subscriber(std::in_place, m_ops.endpoints()[i]);
    if (subscriber->subscribe(m_ops.released_channel(), BootClock::now() + share)) return subscriber;
  }
  log::event(log::Level::debug, "subscribe_failed", "cannot subscribe to releases on any server, polling instead",
             {{"lock", m_request.lock}});
  return std::nullopt;
}

std::expected<std::unique_ptr<HeldLease>, NotAcquired> QuorumLease::acquire(Waiter& waiter, milliseconds& waited) {
  const Deadline began = BootClock::now();
  std::optional<Deadline> wait_until;
  if (m_request.wait) wait_until = began + *m_request.wait;
  // Jitter seeded from the owner id (128 random bits from the kernel): std::random_device costs about
  // 40 us per run on a virtual machine (CPUID and RDRAND trap to the hypervisor).
  std::mt19937 rng(static_cast<std::uint32_t>(std::hash<std::string>{}(m_request.owner)));
  const auto refuse = [&](NotAcquired::Reason why, int signal = 0) {
    waited = since(began);
    return std::unexpected(NotAcquired{why, signal});
  };
  int failures = 0;
  bool told_waiting = false;
  std::optional<redis::Client> subscriber;
  std::size_t subscriptions = 0;  // made so far: a broken one is made again on the next server
  for (int round = 0;; ++round) {
    Attempt result = attempt();
    if (auto* got = std::get_if<Acquired>(&result)) {
      waited = since(began);
      const log::Context context{m_request.lock, std::to_string(got->token)};
      auto held = std::make_unique<QuorumHeldLease>(m_ops, std::move(*got), m_request, context);
      log::event(log::Level::info, "acquired", "acquired lock", context,
                 {log::millis("ttl", m_request.timing.ttl, util::format_duration(m_request.timing.ttl)),
                  servers_field(), {"majority", std::to_string(m_ops.majority())}});
      return held;
    }
    const Deadline now = BootClock::now();
    const bool waiting = !wait_until || now < *wait_until;
    milliseconds pause{};
    if (const auto* down = std::get_if<Unavailable>(&result)) {
      if (!waiting) {
        log::event(log::Level::error, "redis_unavailable",
                   "cannot use the quorum of " + servers_text() + ": " + down->why,
                   {{"lock", m_request.lock}, servers_field()});
        return refuse(NotAcquired::Reason::unavailable);
      }
      // Waiting: a restart or an outage of some servers is not the end of the wait.
      ++failures;
      pause = jittered(std::min(milliseconds(100) * (1 << std::min(failures - 1, 5)), milliseconds(2000)), rng);
      log::event(log::Level::warn, "redis_retry",
                 "cannot use the quorum of " + servers_text() + ": " + down->why +
                     "; trying again while the wait lasts",
                 {{"lock", m_request.lock}, log::millis("retry_in", pause, util::format_duration(pause))});
    } else {
      const auto& busy = std::get<HeldElsewhere>(result);
      if (!waiting) {
        log::event(log::Level::info, "busy",
                   m_request.wait->count() == 0 ? "lock is busy" : "lock is still busy: wait ran out",
                   {{"lock", m_request.lock},
                    {"holder_pid", busy.holder.pid ? std::to_string(*busy.holder.pid) : "unknown"},
                    {"holder_host", busy.holder.host.empty() ? "unknown" : busy.holder.host},
                    busy.remaining ? log::millis("ttl", *busy.remaining, util::format_duration(*busy.remaining))
                                   : log::Field{"ttl", "none"}});
        return refuse(NotAcquired::Reason::busy);
      }
      if (!told_waiting) {
        told_waiting = true;
        log::event(log::Level::info, "waiting", "lock is busy, waiting", {{"lock", m_request.lock}});
      }
      if (!subscriber && subscriptions < 2 * m_ops.size()) {
        subscriber = subscribe(subscriptions++);
        if (subscriber) continue;  // try again now, listening: a release may have come before the subscription
      }
      failures = 0;
      // No wait queue in quorum mode: poll, backing off from 10ms to 500ms with jitter, never past the
      // end of the holder's lease (it may have died without releasing).
      pause = jittered(std::min(milliseconds(10) * (1 << std::min(round, 6)), milliseconds(500)), rng);
      if (busy.remaining) pause = std::min(pause, *busy.remaining + milliseconds(1));
    }
    Deadline wake = now + pause;
    if (wait_until) wake = std::min(wake, *wait_until);
    bool woken = false;
    if (subscriber && subscriber->has_buffered_messages()) continue;
    if (auto sig = waiter.sleep_until(wake, subscriber ? subscriber->wake_fd() : -1, woken))
      return refuse(NotAcquired::Reason::interrupted, *sig);
    // A release anywhere, or a broken subscription (closed by a server going down): try again at once.
    if (woken && subscriber && !subscriber->drain_messages()) subscriber.reset();
  }
}

}  // namespace

std::unique_ptr<Lease> make_quorum_lease(QuorumTarget target, LeaseRequest request) {
  return std::make_unique<QuorumLease>(std::move(target), std::move(request));
}

}  // namespace fencerun::lease
