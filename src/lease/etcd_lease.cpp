#include "lease/etcd_lease.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <optional>
#include <unistd.h>

#include "etcd/client.hpp"
#include "lease/keeper.hpp"
#include "log/log.hpp"
#include "util/duration.hpp"

namespace fencerun::lease {
namespace {

using etcd::Client;
using etcd::Enqueued;
using etcd::KeyValue;

milliseconds since(Deadline t) { return std::chrono::duration_cast<milliseconds>(BootClock::now() - t); }

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// The base of a new lock: the wall clock in microseconds, the unit of the tokens a Redis server issues,
// so that a lock moved from Redis goes on above its last Redis token (as long as that token came from a
// clock that was not ahead of this one).
std::string new_base() {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  return std::to_string(us.count());
}

// While waiting, a failed request is retried after this long (doubling from 100ms to 2s).
milliseconds retry_pause(int failures) {
  return std::min(milliseconds(100) * (1 << std::min(failures - 1, 5)), milliseconds(2000));
}

bool retryable(const redis::Error& e) {
  return e.kind == redis::Error::Kind::connection || e.kind == redis::Error::Kind::timeout ||
         e.kind == redis::Error::Kind::unready;
}

// The renewal of a held etcd lease: one keep-alive, then the key is read to see that it is still
// there (`fencerun break` deletes it, and a lease alone would not tell).
class EtcdRenewer final : public Renewer {
 public:
  EtcdRenewer(Client& client, std::int64_t lease, std::string key) : m_client(client), m_lease(lease), m_key(std::move(key)) {}

  redis::Result<RenewOutcome> renew(std::string_view, std::chrono::milliseconds, Deadline deadline,
                                    Deadline& sent) override {
    sent = BootClock::now();
    auto ttl = m_client.keep_alive(m_lease, deadline);
    if (!ttl) return std::unexpected(ttl.error());
    if (!*ttl) return RenewOutcome::gone;
    auto own = m_client.range(etcd::single(m_key), deadline);
    if (!own) return std::unexpected(own.error());
    if (own->kvs.empty()) return RenewOutcome::gone;
    if (own->kvs.front().lease != m_lease) return RenewOutcome::stolen;
    m_revision.store(own->revision);
    return RenewOutcome::renewed;
  }
  std::int64_t revision() const { return m_revision.load(); }

 private:
  Client& m_client;
  std::int64_t m_lease;
  std::string m_key;
  std::atomic<std::int64_t> m_revision{0};
};

class EtcdHeldLease final : public KeptLease {
 public:
  EtcdHeldLease(Client& client, std::unique_ptr<EtcdRenewer> renewer, Acquired acquired, std::int64_t lease,
                std::string key, std::int64_t revision, const EtcdLeaseTarget& target, const LeaseRequest& request,
                log::Context context)
      : KeptLease(*renewer, std::move(acquired), request, std::move(context)), m_renewer(std::move(renewer)),
        m_client(client), m_lease(lease), m_key(std::move(key)), m_revision(revision), m_target(target) {}

  ~EtcdHeldLease() override {
    try {
      stop_keeping();
      if (!m_released) release();
    } catch (...) {  // a destructor must not throw; the lease expires by itself
    }
  }

  std::uint64_t token() const override { return m_acquired.token; }
  long slot() const override { return 0; }
  std::vector<std::pair<std::string, std::string>> facts() const override {
    return {{"FENCERUN_TOKEN", std::to_string(m_acquired.token)},
            {"FENCERUN_LOCK", m_request.lock},
            {"FENCERUN_OWNER", m_request.owner},
            {"FENCERUN_TTL_MS", std::to_string(m_request.timing.ttl.count())},
            {"FENCERUN_ETCD_URL", m_target.redacted_url},
            {"FENCERUN_ETCD_LEASE", lease_hex(m_lease)},
            {"FENCERUN_SLOT", "0"},
            {"FENCERUN_LIMIT", "1"}};
  }

  void keep(std::function<void(Deadline)> on_renewed) override {
    KeptLease::keep(std::move(on_renewed));
    // The holder watches its own key: a `fencerun break` (or anything else deleting it) stops the job
    // at once, not at the next renewal.
    watch_own_key(m_revision + 1);
  }
  void stop_keeping() override {
    if (m_watch) m_watch->stop();
    KeptLease::stop_keeping();
  }
  bool lost() const override { return m_deleted.load() || KeptLease::lost(); }

  Released release() override {
    stop_keeping();
    m_released = true;
    const Deadline began = BootClock::now();
    // Revoking the lease deletes the key attached to it, in one Raft entry: only this run's key.
    auto revoked = m_client.revoke(m_lease, began + m_request.request_timeout);
    if (!revoked) {
      log::event(log::Level::warn, "release_failed",
                 "could not release the lock (its lease expires by itself): " + revoked.error().message, m_context);
      return Released::failed;
    }
    if (m_deleted.load()) return Released::not_ours;  // the key was deleted under the job
    if (*revoked || (m_client.last_request_repeated() && began < deadline())) {
      log::event(log::Level::info, "released", "released lock", m_context);
      return Released::yes;
    }
    return Released::not_ours;
  }

 private:
  void watch_own_key(std::int64_t from) {
    try {
      m_watch.emplace(m_client, m_key, from, m_request.request_timeout, [this](etcd::Watch::State state) {
        // A deletion marks the lease lost and wakes the supervisor at once. A watch that fails is left to
        // the renewals, which read the key each time.
        if (state != etcd::Watch::State::deleted) return;
        m_deleted.store(true);
        log::event(log::Level::error, "lease_lost", "lease lost: the lock key was deleted", m_context);
        if (const int fd = wake_fd(); fd >= 0) {
          std::uint64_t one = 1;
          [[maybe_unused]] auto n = ::write(fd, &one, sizeof one);
        }
      });
    } catch (const std::exception& e) {
      log::event(log::Level::debug, "watch_failed", std::string("cannot watch the lock key: ") + e.what(), m_context);
      m_watch.reset();
    }
  }

  std::unique_ptr<EtcdRenewer> m_renewer;
  Client& m_client;
  std::int64_t m_lease;
  std::string m_key;
  std::int64_t m_revision;
  const EtcdLeaseTarget& m_target;
  bool m_released = false;
  std::atomic<bool> m_deleted{false};
  std::optional<etcd::Watch> m_watch;
};


class EtcdLease final : public Lease {
 public:
  EtcdLease(EtcdLeaseTarget target, LeaseRequest request)
      : m_target(std::move(target)), m_request(std::move(request)), m_client(m_target.endpoint),
        m_keys(etcd_keys_for(m_target.key_prefix, m_request.lock)) {}

  std::expected<std::unique_ptr<HeldLease>, NotAcquired> acquire(Waiter& waiter, milliseconds& waited) override;

 private:
  struct Queued {
    std::int64_t lease = 0;
    std::string key;
    std::uint64_t base = 0;
    KeyValue own;
    std::int64_t revision = 0;
    Deadline sent{};  // of the last request that confirmed the lease (grant or keep-alive)
    bool fresh = false;               // just enqueued: `first` is the transaction's own reading
    std::optional<KeyValue> first;
  };
  enum class Step { holder, busy, retry, failed };

  void log_unavailable(const redis::Error& e) const {
    log::event(log::Level::error, "etcd_unavailable", "cannot use etcd at " + m_target.redacted_url + ": " + e.message,
               {{"lock", m_request.lock}, {"kind", redis::to_string(e.kind)}});
  }
  void log_retry(const redis::Error& e, milliseconds retry_in, bool first) const {
    log::event(first ? log::Level::warn : log::Level::debug, "etcd_retry",
               "cannot use etcd at " + m_target.redacted_url + ": " + e.message + "; trying again while the wait lasts",
               {{"lock", m_request.lock}, {"kind", redis::to_string(e.kind)},
                log::millis("retry_in", retry_in, util::format_duration(retry_in))});
  }
  void log_busy(const std::optional<KeyValue>& first, std::uint64_t base) {
    Holder h;
    std::optional<milliseconds> ttl;
    if (first) {
      h = etcd_holder_of(*first, base);
      auto left = m_client.time_to_live(first->lease, BootClock::now() + m_request.request_timeout);
      if (left && *left) ttl = milliseconds(**left * 1000);
    }
    log::event(log::Level::info, "busy", m_request.wait->count() == 0 ? "lock is busy" : "lock is still busy: wait ran out",
               {{"lock", m_request.lock},
                {"holder_pid", h.pid ? std::to_string(*h.pid) : "unknown"},
                {"holder_host", h.host.empty() ? "unknown" : h.host},
                ttl ? log::millis("ttl", *ttl, util::format_duration(*ttl)) : log::Field{"ttl", "unknown"}});
  }
  // Gives up a queued key: revoking the lease deletes it. Kept short: an unreachable cluster will not
  // answer this either, and the lease expires anyway.
  void leave(Queued& q) {
    if (q.lease == 0) return;
    auto bound = std::max(std::min<milliseconds>(m_request.request_timeout, milliseconds(1000)), milliseconds(100));
    [[maybe_unused]] auto revoked = m_client.revoke(q.lease, BootClock::now() + bound);
    q = Queued{};
  }

  // Grants a lease and puts this run's key under the lock's prefix.
  redis::Result<void> enqueue(Queued& q, const LeaseSchedule& schedule);
  // Confirms a queued run as the holder: its lease kept alive now, its key still there and first.
  redis::Result<Step> confirm(Queued& q, const LeaseSchedule& schedule, std::optional<KeyValue>& first);
  std::expected<std::unique_ptr<HeldLease>, NotAcquired> granted(Queued& q);

  EtcdLeaseTarget m_target;
  LeaseRequest m_request;
  Client m_client;
  EtcdKeys m_keys;
};

redis::Result<void> EtcdLease::enqueue(Queued& q, const LeaseSchedule& schedule) {
  const Deadline now = BootClock::now();
  // A reply that comes after the stop point is of no use (the command could not start).
  const Deadline bound = std::min(now + m_request.request_timeout, schedule.stop_at(schedule.deadline_after(now)));
  const std::int64_t ttl_s = m_request.timing.ttl.count() / 1000;
  auto grant = m_client.grant(ttl_s, bound);
  if (!grant) return std::unexpected(grant.error());
  q.lease = grant->id;
  q.sent = now;
  if (grant->ttl < ttl_s) {  // etcd raises a TTL below its minimum, never lowers one
    leave(q);
    return std::unexpected(redis::Error{redis::Error::Kind::protocol,
                                        "the cluster granted a lease of " + std::to_string(grant->ttl) +
                                            "s for --ttl " + std::to_string(ttl_s) + "s",
                                        false});
  }
  q.key = m_keys.key(q.lease);
  const std::string value = m_request.owner + " " + std::to_string(m_request.pid) + " " + m_request.host;
  auto enq = m_client.enqueue(q.key, value, q.lease, m_keys.base, new_base(), m_keys.prefix, bound);
  if (!enq) {
    leave(q);
    return std::unexpected(enq.error());
  }
  auto base = parse_u64(enq->base);
  if (!base || *base > k_max_token) {
    leave(q);
    return std::unexpected(redis::Error{redis::Error::Kind::protocol,
                                        "the lock's base (" + m_keys.base + ") is not a number below 2^53", false});
  }
  q.base = *base;
  q.own = enq->own;
  q.revision = enq->revision;
  q.first = enq->first;
  q.fresh = true;
  return {};
}

redis::Result<EtcdLease::Step> EtcdLease::confirm(Queued& q, const LeaseSchedule& schedule,
                                                  std::optional<KeyValue>& first) {
  const Deadline now = BootClock::now();
  const Deadline bound = std::min(now + m_request.request_timeout, schedule.stop_at(schedule.deadline_after(now)));
  auto alive = m_client.keep_alive(q.lease, bound);
  if (!alive) return std::unexpected(alive.error());
  if (!*alive) return Step::retry;  // the lease ran out (and the key with it): queue again
  const Deadline sent = now;
  auto head = m_client.range({m_keys.prefix, etcd::prefix_end(m_keys.prefix), etcd::Sort::create_ascending, 1, 0},
                             bound);
  if (!head) return std::unexpected(head.error());
  q.revision = head->revision;
  first = head->kvs.empty() ? std::nullopt : std::optional<KeyValue>(head->kvs.front());
  if (!first) return Step::retry;  // not even ours: deleted (a break while waiting)
  if (first->key != q.key) {
    // Ours must still be there, behind the first one.
    auto own = m_client.range(etcd::single(q.key), bound);
    if (!own) return std::unexpected(own.error());
    if (own->kvs.empty() || own->kvs.front().lease != q.lease) return Step::retry;
    q.sent = sent;
    return Step::busy;
  }
  if (first->lease != q.lease) return Step::retry;
  q.sent = sent;
  return Step::holder;
}

std::expected<std::unique_ptr<HeldLease>, NotAcquired> EtcdLease::acquire(Waiter& waiter, milliseconds& waited) {
  const Deadline began = BootClock::now();
  const LeaseSchedule schedule(m_request.timing);
  const auto timeout = m_request.request_timeout;
  std::optional<Deadline> wait_until;
  if (m_request.wait) wait_until = began + *m_request.wait;
  Queued q;
  const auto refuse = [&](NotAcquired::Reason why, int signal = 0) {
    leave(q);
    waited = since(began);
    return std::unexpected(NotAcquired{why, signal});
  };
  int failures = 0;
  bool said_waiting = false;
  // Fails the attempt (unavailable) or, while the wait lasts, pauses before the next one. nullopt: go on.
  const auto on_error = [&](const redis::Error& e) -> std::optional<std::unexpected<NotAcquired>> {
    const Deadline now = BootClock::now();
    if (!retryable(e) || !wait_until || now >= *wait_until) {
      log_unavailable(e);
      return refuse(NotAcquired::Reason::unavailable);
    }
    ++failures;
    const Deadline wake = std::min(now + retry_pause(failures), *wait_until);
    log_retry(e, std::chrono::duration_cast<milliseconds>(wake - now), failures == 1);
    bool woken = false;
    if (auto sig = waiter.sleep_until(wake, -1, woken)) return refuse(NotAcquired::Reason::interrupted, *sig);
    return std::nullopt;
  };

  for (;;) {
    if (q.lease == 0) {
      if (auto ok = enqueue(q, schedule); !ok) {
        if (auto out = on_error(ok.error())) return *out;
        continue;
      }
    }
    // First, or not: a run that was first at once holds the lock from its grant on; one that waited
    // confirms (a keep-alive, then the key read again as first) before it holds.
    std::optional<KeyValue> first;
    Step step;
    if (q.fresh) {
      q.fresh = false;
      first = q.first;
      step = first && first->key == q.key && first->lease == q.lease ? Step::holder : (first ? Step::busy : Step::retry);
    } else {
      step = Step::retry;
    }
    // Late (the transaction's reply came after the stop point) or after a wait: confirm afresh.
    if (step == Step::retry || (step == Step::holder && BootClock::now() >= schedule.stop_at(schedule.deadline_after(q.sent)))) {
      auto confirmed = confirm(q, schedule, first);
      if (!confirmed) {
        if (auto out = on_error(confirmed.error())) return *out;
        continue;
      }
      step = *confirmed;
    }
    if (failures > 0) {
      log::event(log::Level::info, "etcd_recovered", "etcd answers again", {{"lock", m_request.lock}});
      failures = 0;
    }
    if (step == Step::holder) {
      waited = since(began);
      return granted(q);
    }
    if (step == Step::retry) {  // our lease or key is gone: queue again (at the back)
      leave(q);
      continue;
    }
    // Busy.
    const Deadline now = BootClock::now();
    if (wait_until && now >= *wait_until) {
      log_busy(first, q.base);
      return refuse(NotAcquired::Reason::busy);
    }
    if (!said_waiting) {
      said_waiting = true;
      log::event(log::Level::info, "waiting", "lock is busy, waiting", {{"lock", m_request.lock}});
    }
    // Watch the key just before ours; wake for its deletion, for our own keep-alive, or at the end of
    // the wait. Whatever wakes us, the loop confirms afresh.
    auto pred = m_client.range({m_keys.prefix, etcd::prefix_end(m_keys.prefix), etcd::Sort::create_descending, 1,
                                q.own.create_revision - 1},
                               now + timeout);
    if (!pred) {
      if (auto out = on_error(pred.error())) return *out;
      continue;
    }
    if (pred->kvs.empty()) continue;  // nobody before us any more: confirm
    const Deadline keep_at = q.sent + m_request.timing.renew;
    Deadline wake = wait_until ? std::min(keep_at, *wait_until) : keep_at;
    std::optional<etcd::Watch> watch;
    try {
      watch.emplace(m_client, pred->kvs.front().key, pred->revision + 1, timeout);
    } catch (const std::exception&) {
      watch.reset();  // no thread: poll at the keep-alive times
    }
    bool woken = false;
    auto sig = waiter.sleep_until(wake, watch ? watch->fd() : -1, woken);
    const bool watch_failed = watch && watch->state() == etcd::Watch::State::failed;
    if (watch) watch->stop();
    if (sig) return refuse(NotAcquired::Reason::interrupted, *sig);
    if (watch_failed) {
      // A stream that breaks at once (a member going away) must not spin: pause a little.
      bool ignored = false;
      if (auto s2 = waiter.sleep_until(std::min(BootClock::now() + milliseconds(100), wake), -1, ignored))
        return refuse(NotAcquired::Reason::interrupted, *s2);
    }
  }
}

std::expected<std::unique_ptr<HeldLease>, NotAcquired> EtcdLease::granted(Queued& q) {
  const std::uint64_t token = q.base + static_cast<std::uint64_t>(q.own.create_revision);
  if (token > k_max_token) {
    log_unavailable({redis::Error::Kind::protocol, "the token would reach 2^53 (base " + std::to_string(q.base) +
                                                       " + revision " + std::to_string(q.own.create_revision) + ")"});
    leave(q);
    return std::unexpected(NotAcquired{NotAcquired::Reason::unavailable});
  }
  Acquired acquired;
  acquired.token = token;
  acquired.value = q.key;
  acquired.sent = q.sent;
  const log::Context context{m_request.lock, std::to_string(token), std::string()};
  auto renewer = std::make_unique<EtcdRenewer>(m_client, q.lease, q.key);
  auto held = std::make_unique<EtcdHeldLease>(m_client, std::move(renewer), std::move(acquired), q.lease, q.key,
                                              q.revision, m_target, m_request, context);
  log::event(log::Level::info, "acquired", "acquired lock", context,
             {log::millis("ttl", m_request.timing.ttl, util::format_duration(m_request.timing.ttl))});
  log::event(log::Level::info, "server",
             "talking to etcd at " + m_client.member_name(m_client.current_member()) + " (lease " + lease_hex(q.lease) +
                 ", revision " + std::to_string(q.own.create_revision) + ")",
             context, {{"server", "etcd"}, {"lease", lease_hex(q.lease)}});
  q = Queued{};  // the held lease releases it from now on
  return held;
}

}  // namespace

std::string lease_hex(std::int64_t lease) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(lease));
  return buf;
}

Holder etcd_holder_of(const etcd::KeyValue& kv, std::optional<std::uint64_t> base) {
  Holder h;
  std::string_view v = kv.value;
  const auto sp = v.find(' ');
  h.owner = std::string(v.substr(0, sp));
  v = sp == std::string_view::npos ? std::string_view{} : v.substr(sp + 1);
  const auto sp2 = v.find(' ');
  if (auto pid = parse_u64(v.substr(0, sp2))) h.pid = static_cast<long>(*pid);
  h.host = sp2 == std::string_view::npos ? std::string() : std::string(v.substr(sp2 + 1));
  if (base) h.token = *base + static_cast<std::uint64_t>(kv.create_revision);
  return h;
}

std::string EtcdKeys::key(std::int64_t lease) const { return prefix + lease_hex(lease); }

EtcdKeys etcd_keys_for(std::string_view key_prefix, std::string_view name) {
  const std::string tag = std::string(key_prefix) + "{" + std::string(name) + "}:";
  return {tag + "wait/", tag + "base"};
}

std::unique_ptr<Lease> make_etcd_lease(EtcdLeaseTarget target, LeaseRequest request) {
  return std::make_unique<EtcdLease>(std::move(target), std::move(request));
}

}  // namespace fencerun::lease
