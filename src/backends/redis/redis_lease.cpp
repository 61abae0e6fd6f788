#include "backends/redis/redis_lease.hpp"

#include <algorithm>
#include <charconv>
#include <optional>
#include <random>
#include <variant>

#include "util/duration.hpp"
#include "lease/keeper.hpp"
#include "backends/redis/lease_client.hpp"
#include "backends/redis/slots_client.hpp"
#include "log/log.hpp"
#include "backends/redis/client.hpp"

namespace fencerun::lease {
namespace {

// A waiter in the queue sleeps until a message on its channel says otherwise ('go': the lock is
// yours to take; 'backup MS': the waiter in front was woken, step in if it has not come in MS; 'head
// MS': you are first, the holder's lease runs MS more). Its own timer is only a safety net, except
// for the first two waiters, which look again when the holder's lease runs out (it may have died
// without releasing). The net widens with the length of the queue, so all waiters together try about
// once a second (fewer when fewer than 30 wait) whatever their number.
constexpr milliseconds k_net_min{30'000};
constexpr milliseconds k_net_max{3'600'000};
constexpr milliseconds k_net_per_waiter{1000};
// Behind the first waiter, the second one looks this much later, so the first one goes first.
constexpr milliseconds k_second_lag{100};

milliseconds jittered(milliseconds base, std::mt19937& rng) {
  std::uniform_int_distribution<long> jitter(base.count() * 3 / 4, base.count() * 5 / 4);
  return milliseconds(jitter(rng));
}

// How long a waiter sleeps after a busy answer, unless woken.
milliseconds next_wait(int attempt, const Busy& busy, std::mt19937& rng) {
  if (!busy.place) {
    // Not listening (subscribing is not allowed): poll, backing off from 10ms to 500ms with jitter,
    // never past the holder's remaining TTL.
    milliseconds pause = jittered(std::min(milliseconds(10) * (1 << std::min(attempt, 6)), milliseconds(500)), rng);
    if (busy.remaining) pause = std::min(pause, *busy.remaining + milliseconds(1));
    if (busy.turn_expires) pause = std::min(pause, *busy.turn_expires);
    return std::max(pause, milliseconds(1));
  }
  const long place = *busy.place;
  milliseconds pause = jittered(std::clamp(k_net_per_waiter * busy.queue_length, k_net_min, k_net_max), rng);
  if (place <= 1) {
    const milliseconds lag = milliseconds(1) + k_second_lag * place;
    if (busy.remaining) pause = std::min(pause, *busy.remaining + lag);
    if (busy.turn_expires) pause = std::min(pause, *busy.turn_expires + lag);
  }
  return pause;
}

// A message on a waiter's channel, read as what it means for the waiter's sleep.
struct Wake {
  bool now = false;                  // 'go'
  std::optional<milliseconds> in;    // 'backup MS' / 'head MS': look again in MS
  bool replaces = false;             // 'head': the new time replaces the old one (also a later one)
};
Wake read_wake(std::string_view message) {
  auto number = [&](std::string_view word) -> std::optional<milliseconds> {
    if (!message.starts_with(word)) return std::nullopt;
    long long ms = 0;
    auto rest = message.substr(word.size());
    auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), ms);
    if (ec != std::errc{} || ptr != rest.data() + rest.size()) return std::nullopt;
    return milliseconds(std::max(ms, 0LL));
  };
  if (message == "go") return {true, std::nullopt, false};
  if (message == "head -1") return {false, std::nullopt, true};  // a lock without expiry: the net only
  if (auto ms = number("backup ")) return {false, *ms, false};
  if (auto ms = number("head ")) return {false, *ms, true};
  return {true, std::nullopt, false};  // not understood: look now, to be safe
}

// While waiting, a connection error is retried after this long (doubling from 100ms to 2s, jittered).
milliseconds reconnect_pause(int failures, std::mt19937& rng) {
  milliseconds base = std::min(milliseconds(100) * (1 << std::min(failures - 1, 5)), milliseconds(2000));
  std::uniform_int_distribution<long> jitter(base.count() * 3 / 4, base.count() * 5 / 4);
  return milliseconds(jitter(rng));
}

// Whether a failed acquire may still have set the lock on the server (the request was, or may have
// been, written): then it is cleaned up by owner id.
bool acquire_may_have_run(const redis::Error& e) {
  // A reply fencerun could not make sense of came from a script that ran.
  return e.maybe_executed || e.kind == redis::Error::Kind::protocol;
}

milliseconds since(Deadline t) { return std::chrono::duration_cast<milliseconds>(BootClock::now() - t); }

class RedisHeldLease final : public KeptLease {
 public:
  RedisHeldLease(LockOps& client, Acquired acquired, const RedisLeaseTarget& target, const LeaseRequest& request,
                 log::Context context)
      : KeptLease(client, std::move(acquired), request, std::move(context)), m_client(client), m_target(target) {}

  ~RedisHeldLease() override {
    try {
      stop_keeping();
      if (!m_released) release();
    } catch (...) {  // a destructor must not throw; the lock expires by itself
    }
  }

  std::uint64_t token() const override { return m_acquired.token; }
  long slot() const override { return m_acquired.slot; }
  std::optional<std::uint64_t> started_us() const override {
    std::uint64_t us = 0;
    const auto& t = m_acquired.started_us;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), us);
    if (t.empty() || ec != std::errc{} || end != t.data() + t.size()) return std::nullopt;
    return us;
  }
  JobFacts job_facts() const override {
    JobFacts f{m_acquired.token, m_request.lock, m_request.owner, m_request.timing.ttl.count(), m_acquired.slot,
               m_request.limit, "FENCERUN_REDIS_URL", m_target.redacted_url, {{"FENCERUN_SERVERS", "1"}}, {}};
    std::uint64_t fired = 0;
    const auto& t = m_acquired.fired_us;
    if (m_request.every && std::from_chars(t.data(), t.data() + t.size(), fired).ec == std::errc{})
      f.slot_start_us = slot_start_us(slot_index(fired, *m_request.every), *m_request.every);
    return f;
  }

  Released release() override {
    stop_keeping();
    m_released = true;
    const Deadline began = BootClock::now();
    auto released = m_outcome ? m_client.release_recorded(m_request.owner, m_acquired.value, m_acquired, *m_outcome,
                                                          began + m_request.request_timeout)
                              : m_client.release(m_request.owner, m_acquired.value, began + m_request.request_timeout);
    if (!released) {
      log::event(log::Level::warn, "release_failed",
                 "could not release the lock (it expires by itself): " + released.error().message, m_context);
      return Released::failed;
    }
    // --min-replicas: the record written at the release waits for the replicas too (a failover to a
    // replica that missed it would run the period again). An extra round trip only with the option.
    if (m_outcome && m_request.min_replicas > 0) {
      const std::string n = std::to_string(m_request.min_replicas);
      const std::string ms = std::to_string(m_request.replica_timeout.count());
      auto w = m_client.client().command({"WAIT", n, ms}, BootClock::now() + m_request.request_timeout +
                                                              m_request.replica_timeout);
      const long long acked = w && !w->is_error() ? w->as_integer().value_or(0) : 0;
      if (acked < m_request.min_replicas)
        log::event(log::Level::warn, "record_not_replicated",
                   "the run's record reached " + std::to_string(acked) + " of --min-replicas " + n +
                       " replicas: a failover now may lose it",
                   m_context, {{"acked", std::to_string(acked)}});
    }
    // Gone, but the release went out twice (the connection failed under the first attempt, which may
    // have run): the lock was ours until our deadline, which had not passed when the first attempt
    // went out, so that attempt deleted it.
    if (*released || (m_client.client().last_request_repeated() && began < deadline())) {
      log::event(log::Level::info, "released", "released lock", m_context);
      return Released::yes;
    }
    return Released::not_ours;
  }

 private:
  LockOps& m_client;
  const RedisLeaseTarget& m_target;
  bool m_released = false;
};

class RedisLease final : public Lease {
 public:
  RedisLease(RedisLeaseTarget target, LeaseRequest request)
      : m_target(std::move(target)), m_request(std::move(request)), m_client(m_target.endpoint),
        m_ops(make_ops(m_client, keys_for(m_target.key_prefix, m_request.lock), m_request.limit)), m_lease(*m_ops) {
    m_lease.keep_records({m_request.records, m_request.min_interval ? m_request.min_interval->count() : 0,
                          m_request.version, m_request.every ? m_request.every->period.count() : 0,
                          m_request.every ? m_request.every->offset.count() : 0,
                          schedule_rule(m_request.every, m_request.min_interval, m_request.records.ttl),
                          m_request.skip_if_record_lost});
    // The log says which server the run talked to, and the release picks its native compare-and-delete.
    m_client.learn_server();
  }

  std::expected<std::unique_ptr<HeldLease>, NotAcquired> acquire(Waiter& waiter, milliseconds& waited) override;

 private:
  void log_unavailable(const redis::Error& e) const {
    log::event(log::Level::error, "redis_unavailable",
               "cannot use Redis at " + m_target.redacted_url + ": " + e.message,
               {{"lock", m_request.lock}, {"kind", redis::to_string(e.kind)}});
  }
  void leave_queue() {
    if (m_joined)
      [[maybe_unused]] auto left = m_lease.leave_queue(m_request.owner, BootClock::now() + m_request.request_timeout);
  }
  // Sleeps until `wake` unless a signal ends the wait first; then gives up the queue place.
  std::optional<int> pause_until(Waiter& waiter, Deadline wake, int fd, bool& woken) {
    auto sig = waiter.sleep_until(wake, fd, woken);
    if (sig) leave_queue();
    return sig;
  }
  std::expected<std::unique_ptr<HeldLease>, NotAcquired> granted(Acquired acquired);
  void log_server(const log::Context& context) const;

  // A failed acquire that may have run on the server is undone by owner id. Kept short: an
  // unresponsive server will not answer this either, and the lock expires anyway.
  void clean_up_after(const redis::Error& error) {
    if (!acquire_may_have_run(error)) return;
    auto cleanup = std::min<milliseconds>(m_request.request_timeout / 4, milliseconds(200));
    [[maybe_unused]] auto cleaned = m_lease.release(m_request.owner, std::nullopt, BootClock::now() + cleanup);
  }
  // At the default level once per outage (the first failure), then at debug level.
  void log_retry(const redis::Error& error, milliseconds retry_in, bool first) const {
    log::event(first ? log::Level::warn : log::Level::debug, "redis_retry",
               "cannot use Redis at " + m_target.redacted_url + ": " + error.message +
                   "; trying again while the wait lasts",
               {{"lock", m_request.lock}, {"kind", redis::to_string(error.kind)},
                log::millis("retry_in", retry_in, util::format_duration(retry_in))});
  }
  void log_busy(const Busy& busy) const {
    const std::string what =
        m_request.limit > 1 ? "all " + std::to_string(m_request.limit) + " slots of the lock are" : "lock is";
    log::event(log::Level::info, "busy",
               m_request.wait->count() == 0 ? what + " busy" : what + " still busy: wait ran out",
               {{"lock", m_request.lock},
                {"holder_pid", busy.holder.pid ? std::to_string(*busy.holder.pid) : "unknown"},
                {"holder_host", busy.holder.host.empty() ? "unknown" : busy.holder.host},
                busy.remaining ? log::millis("ttl", *busy.remaining, util::format_duration(*busy.remaining))
                               : log::Field{"ttl", "none"}});
  }
  void log_skipped(const Skipped& skipped) const {
    lease::log_skipped(m_request.lock, m_request.rule(), skipped.last_success, skipped.now_us, skipped.fired_us,
                       skipped.in_progress);
  }
  // The record counts a trigger that ends without running, for its slot (--every) or the run that made
  // it skip (--min-interval); a failure costs nothing but the count.
  void note_trigger(std::string_view kind, const std::optional<Skipped>& running, std::uint64_t fired) {
    std::uint64_t slot = fired;
    if (m_request.every) slot = slot_start_us(slot_index(fired, *m_request.every), *m_request.every);
    else if (running)
      if (auto r = parse_run_record(running->last_success)) slot = r->start_us;
    [[maybe_unused]] auto noted =
        m_lease.note_trigger(kind, slot, m_request.host, BootClock::now() + m_request.request_timeout);
  }
  // A busy answer whose holder is running the run this trigger is for (--every: its slot's;
  // --min-interval: one that started less than the interval before it fired): a skip, not a conflict.
  std::optional<Skipped> running_this_run(const Busy& busy, std::optional<std::uint64_t> fired) const {
    if (!m_request.rule().any() || busy.run.empty() || !fired || !busy.now_us) return std::nullopt;
    const auto r = parse_run_in_progress(busy.run);
    if (!r) return std::nullopt;
    if (!run_counts_for(m_request.rule(), r->start_us, r->fire_us, *fired)) return std::nullopt;
    return Skipped{run_record_line(*r), *busy.now_us, *fired, true};
  }
  // A queued waiter's busy answer does not name the holder: ask for it (for the message only); of a
  // counting lock's, the one whose lease ends first.
  Busy holder_now(const Busy& busy) {
    Busy named = busy;
    auto st = lock_status(m_client, m_lease.keys(), BootClock::now() + m_request.request_timeout);
    if (!st || st->holders.empty()) return named;
    const auto first = std::ranges::min_element(st->holders, {}, [](const SlotHolder& h) {
      return h.remaining.value_or(milliseconds::max());
    });
    named.holder = first->holder;
    named.remaining = first->remaining;
    return named;
  }
  // A second connection subscribed to this waiter's own wake channel, or nothing (then the wait polls).
  std::optional<redis::Client> subscribe() {
    std::optional<redis::Client> subscriber(std::in_place, m_client.subscriber_endpoint());
    const auto channel = m_lease.keys().wake_channel(m_request.owner);
    if (auto ok = subscriber->subscribe(channel, BootClock::now() + m_request.request_timeout); !ok) {
      log::event(log::Level::debug, "subscribe_failed",
                 "cannot subscribe to wake-ups, polling instead" +
                     std::string(m_request.fair ? " (without a place in the fair queue)" : "") + ": " +
                     ok.error().message,
                 {{"lock", m_request.lock}});
      subscriber.reset();
    }
    return subscriber;
  }
  // Sleeps after a busy answer until it is time to try again: a 'go' message, the timer (which other
  // messages move), a signal (then the wait ends), or a broken subscription (try again at once, and
  // subscribe again).
  std::optional<int> sleep_between_tries(Waiter& waiter, std::optional<redis::Client>& subscriber, Deadline wake,
                                         std::optional<Deadline> wait_until);

  static std::unique_ptr<LockOps> make_ops(redis::Client& client, LockKeys keys, long limit) {
    if (limit > 1) return std::make_unique<SlotsClient>(client, std::move(keys), limit);
    return std::make_unique<LeaseClient>(client, std::move(keys));
  }

  RedisLeaseTarget m_target;
  LeaseRequest m_request;
  redis::Client m_client;
  std::unique_ptr<LockOps> m_ops;  // the plain lock's operations, or a counting lock's
  LockOps& m_lease;
  bool m_joined = false;  // has been in the wait queue (it leaves it when it gives up)
};

std::optional<int> RedisLease::sleep_between_tries(Waiter& waiter, std::optional<redis::Client>& subscriber,
                                                   Deadline wake, std::optional<Deadline> wait_until) {
  for (;;) {
    Deadline until = wait_until ? std::min(wake, *wait_until) : wake;
    bool woken = false;
    if (!(subscriber && subscriber->has_buffered_messages())) {
      if (auto sig = pause_until(waiter, until, subscriber ? subscriber->wake_fd() : -1, woken)) return sig;
      if (!woken) return std::nullopt;  // the timer
    }
    auto messages = subscriber->drain_messages();
    if (!messages) {
      subscriber.reset();
      return std::nullopt;
    }
    const Deadline now = BootClock::now();
    for (const auto& m : *messages) {
      const Wake w = read_wake(m);
      if (w.now) return std::nullopt;
      const Deadline at = now + (w.in ? *w.in + k_second_lag : k_net_min);
      wake = w.replaces ? at : std::min(wake, at);
    }
  }
}

std::expected<std::unique_ptr<HeldLease>, NotAcquired> RedisLease::acquire(Waiter& waiter, milliseconds& waited) {
  const Deadline began = BootClock::now();
  const LeaseSchedule schedule(m_request.timing);
  const auto timeout = m_request.request_timeout;
  const auto refuse = [&](NotAcquired::Reason why, int signal = 0) {
    waited = since(began);
    return std::unexpected(NotAcquired{why, signal});
  };

  // After its first busy answer a waiter subscribes to its own wake channel and then tries again at
  // once, joining the queue: so it is in the queue only while it listens, and no release can slip
  // between a try and the wait. A release then wakes the first waiter in the queue, and only it.
  std::optional<Deadline> wait_until;
  if (m_request.wait) wait_until = began + *m_request.wait;
  // Jitter seeded from the owner id (128 random bits from the kernel): std::random_device costs about
  // 40 us per run on a virtual machine (CPUID and RDRAND trap to the hypervisor).
  std::mt19937 rng(static_cast<std::uint32_t>(std::hash<std::string>{}(m_request.owner)));
  std::optional<redis::Client> subscriber;
  bool subscribe_tried = false;
  int connection_failures = 0;
  // The trigger's fire time: the server's time at the first answer (--every, --min-interval).
  std::optional<std::uint64_t> fired;
  const auto skip = [&](const Skipped& skipped) {
    if (skipped.record_lost) log_record_lost(m_request.lock, true);
    else log_skipped(skipped);
    leave_queue();
    waited = since(began);
    const auto last = parse_run_record(skipped.last_success);
    return std::unexpected(NotAcquired{NotAcquired::Reason::skipped, 0, 0, last ? last->start_us : 0});
  };
  for (int attempt = 0;; ++attempt) {
    // A reply that comes after the stop point is of no use (the command could not start), so no
    // acquire request waits longer than that, whatever --timeout says.
    Deadline now = BootClock::now();
    Deadline bound = std::min(now + timeout, schedule.stop_at(schedule.deadline_after(now)));
    const Queueing queueing{m_request.fair, subscriber.has_value(), fired};
    m_joined = m_joined || queueing.queued;
    auto result = m_lease.try_acquire(m_request.owner, m_request.timing.ttl, m_request.pid, m_request.host,
                                      {m_request.min_replicas, m_request.replica_timeout}, queueing, bound);
    if (!result) {
      const redis::Error& error = result.error();
      clean_up_after(error);
      // A server that is down, slow, restarting (LOADING), busy with a script (BUSY), without its
      // master (MASTERDOWN, CLUSTERDOWN) or full (its client limit) may serve a moment later.
      bool retryable = error.kind == redis::Error::Kind::connection || error.kind == redis::Error::Kind::timeout ||
                       error.kind == redis::Error::Kind::migrating || error.kind == redis::Error::Kind::unready;
      now = BootClock::now();
      if (!retryable || !wait_until || now >= *wait_until) {
        log_unavailable(error);
        leave_queue();
        return refuse(NotAcquired::Reason::unavailable);
      }
      // Waiting: a restart or a failover of the server is not the end of the wait.
      ++connection_failures;
      Deadline wake = std::min(now + reconnect_pause(connection_failures, rng), *wait_until);
      log_retry(error, std::chrono::duration_cast<milliseconds>(wake - now), connection_failures == 1);
      subscriber.reset();
      subscribe_tried = false;
      bool woken = false;
      if (auto sig = pause_until(waiter, wake, -1, woken)) return refuse(NotAcquired::Reason::interrupted, *sig);
      continue;
    }
    if (connection_failures > 0) {
      log::event(log::Level::info, "redis_recovered", "Redis answers again", {{"lock", m_request.lock}});
      connection_failures = 0;
    }
    if (auto* got = std::get_if<Acquired>(&*result)) {
      if (got->new_record && m_request.rule().any()) log_record_lost(m_request.lock, false);
      subscriber.reset();
      waited = since(began);
      return granted(std::move(*got));
    }
    if (auto* other = std::get_if<LimitMismatch>(&*result)) {
      log::event(log::Level::error, "limit_mismatch",
                 "lock '" + m_request.lock + "' is held with --limit " + std::to_string(other->held) +
                     "; this run asks for --limit " + std::to_string(m_request.limit) +
                     " (all holders of a lock must use the same --limit)",
                 {{"lock", m_request.lock}, {"held_limit", std::to_string(other->held)},
                  {"limit", std::to_string(m_request.limit)}});
      leave_queue();
      waited = since(began);
      return std::unexpected(NotAcquired{NotAcquired::Reason::limit_mismatch, 0, other->held});
    }
    if (auto* skipped = std::get_if<Skipped>(&*result)) return skip(*skipped);
    if (auto* other = std::get_if<RuleMismatch>(&*result)) {
      log_rule_mismatch(m_request.lock, other->rule,
                        schedule_rule(m_request.every, m_request.min_interval, m_request.records.ttl));
      leave_queue();
      waited = since(began);
      NotAcquired why{NotAcquired::Reason::rule_mismatch};
      why.held_rule = other->rule;
      return std::unexpected(why);
    }
    const auto& busy = std::get<Busy>(*result);
    if (!fired && busy.now_us) fired = busy.now_us;
    now = BootClock::now();
    if (wait_until && now >= *wait_until) {
      if (auto running = running_this_run(busy, fired)) {
        note_trigger("skip", *running, *fired);
        return skip(*running);
      }
      if (fired && m_request.rule().any()) note_trigger("busy", std::nullopt, *fired);
      log_busy(busy.place ? holder_now(busy) : busy);
      leave_queue();
      return refuse(NotAcquired::Reason::busy);
    }
    if (!subscribe_tried) {
      subscribe_tried = true;
      log::event(log::Level::info, "waiting", "lock is busy, waiting", {{"lock", m_request.lock}});
      subscriber = subscribe();
      continue;  // try again now, listening: a release may have come before the subscription
    }
    if (!subscriber && m_joined) {
      // The subscription broke: subscribe again, then try again (the place is kept if still there).
      subscriber = subscribe();
      if (subscriber) continue;
    }
    if (auto sig = sleep_between_tries(waiter, subscriber, now + next_wait(attempt, busy, rng), wait_until))
      return refuse(NotAcquired::Reason::interrupted, *sig);
  }
}

void RedisLease::log_server(const log::Context& context) const {
  const auto& server = m_client.server();
  if (!server) return;  // the server refused HELLO and COMMAND, or the probe was given up
  // A counting lock's slots are always released by its script (it also hands the slot on).
  const std::string_view path = release_path_name(m_request.limit > 1 ? ReleasePath::script : release_path(server));
  log::event(log::Level::info, "server",
             "talking to " + server->describe() + " at " + server->where + " (release by " + std::string(path) + ")",
             context, {{"server", server->name}, {"server_version", server->version}, {"release", std::string(path)}});
}

std::expected<std::unique_ptr<HeldLease>, NotAcquired> RedisLease::granted(Acquired acquired) {
  const log::Context context{m_request.lock, std::to_string(acquired.token),
                             m_request.limit > 1 ? std::to_string(acquired.slot) : std::string()};
  const bool clock_behind = acquired.server_clock_behind;
  const auto gap = std::chrono::duration_cast<milliseconds>(acquired.server_clock_gap);
  const long long acked = acquired.replicas_acked.value_or(0);
  // From here on the lease is released on every way out.
  auto held = std::make_unique<RedisHeldLease>(m_lease, std::move(acquired), m_target, m_request, context);
  log::event(log::Level::info, "acquired", "acquired lock", context,
             {log::millis("ttl", m_request.timing.ttl, util::format_duration(m_request.timing.ttl))});
  log_server(context);
  if (clock_behind) {
    // Only the counter kept this token above the last one: had it been lost, the clock would have
    // issued a smaller token, and guards would reject every holder until the clock caught up.
    const long long tenths = (gap.count() + 50) / 100;
    log::event(log::Level::warn, "clock_behind",
               "the Redis server's clock is " + std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) +
                   "s behind the last token: tokens rely on the counter alone",
               context, {{"behind_ms", std::to_string(gap.count())}});
  }
  if (m_request.min_replicas > 0 && acked < m_request.min_replicas) {
    log::event(log::Level::error, "replicas_missing",
               "only " + std::to_string(acked) + " of " + std::to_string(m_request.min_replicas) +
                   " replicas confirmed the lock within " + util::format_duration(m_request.replica_timeout) +
                   "; releasing it",
               context);
    held->release();
    return std::unexpected(NotAcquired{NotAcquired::Reason::unavailable});
  }
  return held;
}

}  // namespace

std::unique_ptr<Lease> make_redis_lease(RedisLeaseTarget target, LeaseRequest request) {
  return std::make_unique<RedisLease>(std::move(target), std::move(request));
}

}  // namespace fencerun::lease
