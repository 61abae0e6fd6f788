#include "backends/etcd/etcd_lease.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <optional>
#include <thread>
#include <unistd.h>

#include "backends/etcd/client.hpp"
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

bool retryable(const Error& e) {
  return e.kind == Error::Kind::unavailable || e.kind == Error::Kind::timeout ||
         e.kind == Error::Kind::busy;
}

// The renewal of a held etcd lease: one keep-alive, then the key is read to see that it is still
// there (a key deleted by itself leaves the lease alive, and a lease alone would not tell). A lease
// gone is revoked (`fencerun break` revokes the holder's) or ran out; a key gone under a live lease
// was deleted (broken); a key on another lease is another owner's.
class EtcdRenewer final : public Renewer {
 public:
  EtcdRenewer(Client& client, std::int64_t lease, std::string key) : m_client(client), m_lease(lease), m_key(std::move(key)) {}

  Result<RenewOutcome> renew(std::string_view, std::chrono::milliseconds, Deadline deadline,
                                    Deadline& sent) override {
    sent = BootClock::now();
    auto ttl = m_client.keep_alive(m_lease, deadline);
    if (!ttl) return std::unexpected(ttl.error());
    if (!*ttl) return RenewOutcome::revoked;
    auto own = m_client.range(etcd::single(m_key), deadline);
    if (!own) return std::unexpected(own.error());
    if (own->kvs.empty()) return RenewOutcome::broken;
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

// ---- The record of runs (see etcd_lease.hpp)

std::uint64_t wall_us() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const auto sp = s.find(' ');
    out.push_back(s.substr(0, sp));
    s = sp == std::string_view::npos ? std::string_view{} : s.substr(sp + 1);
  }
  return out;
}

// The fields of `run`'s value: "OWNER START_US TOKEN PID HOST VERSION".
struct RunInProgress {
  std::string owner, start, token, pid, host, version;
};
std::optional<RunInProgress> parse_run(std::string_view value) {
  const auto w = words(value);
  if (w.size() != 6) return std::nullopt;
  return RunInProgress{std::string(w[0]), std::string(w[1]), std::string(w[2]),
                       std::string(w[3]), std::string(w[4]), std::string(w[5])};
}

// A run still in progress when the lock is taken by another one ended without a release: its record
// says killed, with what is unknown as '-' (as _runs.lua's record_killed writes it).
std::string killed_record(const RunInProgress& r) {
  return r.start + " - killed - - " + r.token + " " + r.pid + " " + r.host + " " + r.version;
}

std::string joined_records(const std::vector<std::string>& records) {
  std::string out;
  for (const auto& r : records) out += (out.empty() ? "" : "\n") + r;
  return out;
}

// The records' TTL as etcd takes it: whole seconds, rounded up, within etcd's bounds.
std::int64_t records_ttl_seconds(milliseconds ttl) {
  constexpr std::int64_t k_max = 9'000'000'000;  // etcd's maximum lease TTL
  const std::int64_t s = (ttl.count() + 999) / 1000;
  return std::clamp<std::int64_t>(s, 1, k_max);
}

// The three record keys as read (nullopt: absent), and the run's own lock key.
struct RecordState {
  std::optional<KeyValue> run, ok, runs, own;
};

// What a write leaves of a record key: unchanged (nullopt), deleted (an empty inner optional) or this
// value.
using RecordWrite = std::optional<std::optional<std::string>>;
struct RecordWrites {
  RecordWrite run, ok, runs;
  bool empty() const { return !run && !ok && !runs; }
};

// Reads and writes the record of NAME's runs. Every write is a transaction guarded by the keys' mod
// revisions as read (and the holder's own key): a conflict reads again. The keys share one etcd lease
// of the records' TTL, reused while its TTL is the one asked (LeaseKeepAlive resets it), else replaced.
class EtcdRecords {
 public:
  EtcdRecords(Client& client, const EtcdKeys& keys, const LeaseRequest& request)
      : m_client(client), m_keys(keys), m_request(request), m_ttl_s(records_ttl_seconds(request.records.ttl)) {}
  ~EtcdRecords() { drop_unused(); }
  EtcdRecords(const EtcdRecords&) = delete;
  EtcdRecords& operator=(const EtcdRecords&) = delete;

  const LeaseRequest& request() const { return m_request; }
  std::size_t keep() const { return static_cast<std::size_t>(std::max<long>(m_request.records.keep, 1)); }

  Result<RecordState> read(const std::string& own_key) {
    etcd::TxnRequest t;
    t.success = {etcd::range_op(etcd::single(m_keys.run)), etcd::range_op(etcd::single(m_keys.ok)),
                 etcd::range_op(etcd::single(m_keys.runs)), etcd::range_op(etcd::single(own_key))};
    auto r = m_client.txn(t, bound());
    if (!r) return std::unexpected(r.error());
    RecordState s;
    std::optional<KeyValue>* into[] = {&s.run, &s.ok, &s.runs, &s.own};
    for (std::size_t i = 0; i < 4; ++i)
      if (r->ranges[i] && !r->ranges[i]->kvs.empty()) *into[i] = r->ranges[i]->kvs.front();
    return s;
  }

  // Writes `w` unless a key changed since `s` was read or (own_create > 0) the run's own key is not
  // the one of that create_revision any more. false: a conflict (read again).
  Result<bool> write(const RecordState& s, std::int64_t own_create, const std::string& own_key,
                            const RecordWrites& w) {
    // Every key that stays after the write: its value, and its lease now.
    struct Key {
      const std::string& name;
      const std::optional<KeyValue>& now;
      const RecordWrite& write;
    };
    const Key keys[] = {{m_keys.run, s.run, w.run}, {m_keys.ok, s.ok, w.ok}, {m_keys.runs, s.runs, w.runs}};
    std::vector<std::int64_t> old_leases;
    for (const auto& k : keys)
      if (k.now && k.now->lease != 0 && std::ranges::find(old_leases, k.now->lease) == old_leases.end())
        old_leases.push_back(k.now->lease);
    bool puts = false;
    for (const auto& k : keys) puts = puts || (k.write && *k.write);
    std::int64_t lease = 0;
    if (puts) {
      auto chosen = choose_lease(old_leases);
      if (!chosen) return std::unexpected(chosen.error());
      lease = *chosen;
    }
    etcd::TxnRequest t;
    if (own_create > 0)
      t.compare.push_back({own_key, etcd::Compare::Target::create_revision, own_create});
    for (const auto& k : keys) {
      t.compare.push_back({k.name, etcd::Compare::Target::mod_revision, k.now ? k.now->mod_revision : 0});
      if (k.write) {
        if (*k.write) t.success.push_back(etcd::put_op(k.name, **k.write, lease));
        else if (k.now) t.success.push_back(etcd::remove_op(k.name));
      } else if (k.now && puts && k.now->lease != lease) {
        t.success.push_back(etcd::put_op(k.name, k.now->value, lease));  // onto the records' lease
      }
    }
    if (t.success.empty()) return true;
    auto r = m_client.txn(t, bound());
    if (!r) return std::unexpected(r.error());
    if (r->lease_missing) {  // expired (or revoked) between its keep-alive and this put: grant another
      m_dead = lease;
      if (lease == m_granted) m_granted = 0;
      return false;
    }
    if (!r->succeeded) return false;
    if (lease != 0) {
      if (lease == m_granted) m_granted = 0;  // in use
      // No key is left on the leases the keys had before: do not leave them to run out.
      for (auto old : old_leases)
        if (old != lease) [[maybe_unused]] auto revoked = m_client.revoke(old, bound());
    }
    return true;
  }

  // A lease granted for a write that did not happen holds nothing: revoke it.
  void drop_unused() {
    if (m_granted == 0) return;
    [[maybe_unused]] auto revoked = m_client.revoke(m_granted, bound());
    m_granted = 0;
  }

 private:
  Deadline bound() const { return BootClock::now() + m_request.request_timeout; }

  // The lease the record keys go onto: the one they carry, kept alive, when its TTL is the one asked;
  // else a new one (granted once, until a write uses it).
  Result<std::int64_t> choose_lease(const std::vector<std::int64_t>& old_leases) {
    std::int64_t current = old_leases.empty() ? 0 : old_leases.front();
    if (current != 0 && current == m_granted) return current;
    std::optional<std::int64_t> current_ttl;
    if (current != 0 && current != m_dead) {
      auto ttl = m_client.keep_alive(current, bound());
      if (!ttl) return std::unexpected(ttl.error());
      current_ttl = *ttl;
      if (current_ttl && *current_ttl == m_ttl_s) return current;
    }
    if (m_granted == 0) {
      auto g = m_client.grant(m_ttl_s, bound());
      if (!g) return std::unexpected(g.error());
      m_granted = g->id;
      m_granted_ttl = g->ttl;
    }
    // etcd raised a TTL below its minimum: the current lease, just reset to that TTL, is as good.
    if (current_ttl && *current_ttl == m_granted_ttl) {
      drop_unused();
      return current;
    }
    return m_granted;
  }

  Client& m_client;
  const EtcdKeys& m_keys;
  const LeaseRequest& m_request;
  std::int64_t m_ttl_s;
  std::int64_t m_granted = 0;  // granted by this run, not yet carrying a key
  std::int64_t m_granted_ttl = 0;
  std::int64_t m_dead = 0;  // a lease a put found gone
};

// Bounds the transactions a step of the record retries after conflicts (another run writing the
// record at the same time: a lost run's release, the next holder's start).
constexpr int k_record_attempts = 8;

Error record_conflict() {
  return {Error::Kind::busy, "the record of runs kept changing under the transaction", false};
}

class EtcdHeldLease final : public KeptLease {
 public:
  EtcdHeldLease(Client& client, std::unique_ptr<EtcdRenewer> renewer, Acquired acquired, std::int64_t lease,
                std::string key, std::int64_t own_create, std::int64_t revision, EtcdRecords& records,
                std::optional<std::uint64_t> started_us, const EtcdLeaseTarget& target, const LeaseRequest& request,
                log::Context context)
      : KeptLease(*renewer, std::move(acquired), request, std::move(context)), m_renewer(std::move(renewer)),
        m_client(client), m_lease(lease), m_key(std::move(key)), m_own_create(own_create), m_revision(revision),
        m_records(records), m_started_us(started_us), m_target(target) {}

  ~EtcdHeldLease() override {
    try {
      stop_keeping();
      if (!m_released) release();
    } catch (...) {  // a destructor must not throw; the lease expires by itself
    }
  }

  std::uint64_t token() const override { return m_acquired.token; }
  long slot() const override { return 0; }
  // By this host's clock (etcd has none a client can read).
  std::optional<std::uint64_t> started_us() const override { return m_started_us; }
  JobFacts job_facts() const override {
    return {m_acquired.token, m_request.lock, m_request.owner, m_request.timing.ttl.count(), 0, 1,
            "FENCERUN_ETCD_URL", m_target.redacted_url, {{"FENCERUN_ETCD_LEASE", lease_hex(m_lease)}}};
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
  LossCause loss_cause() const override {
    if (KeptLease::lost()) return KeptLease::loss_cause();
    return m_deleted.load() ? m_cause.load() : LossCause::none;
  }

  Released release() override {
    stop_keeping();
    m_released = true;
    // The record first, while the key is there to compare (and to tell a lost run).
    if (m_outcome && m_started_us) record_end(*m_outcome);
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
  // Closes the run in the record (see _runs.lua's close_run): its record prepended to `runs` (or put in
  // place of the killed record the next run wrote for it), `ok` set when it succeeded, `run` deleted
  // when it is still this run's. A run whose key is gone did not hold the lock to the end: 'ok' and
  // 'failed' become 'lost'. Guarded by the keys' mod revisions (and the own key while it is there), and
  // idempotent: a transaction applied twice (a member failing under it) finds its record written.
  // A cluster without a leader for a moment (an election) is waited for, while the lease lasts with a
  // request's time to spare for the revoke: nobody else can hold the lock before it ends anyway.
  void record_end(const RunOutcome& how) {
    // The start plus how long the command ran (a fencerun stopped or starved after the job ended
    // releases late); the time now when that is not known.
    std::uint64_t end = wall_us();
    if (how.ran && how.ran->count() >= 0)
      end = std::min(end, *m_started_us + static_cast<std::uint64_t>(how.ran->count()));
    const std::string token = std::to_string(m_acquired.token);
    auto warn = [&](const Error& e) {
      log::event(log::Level::warn, "record_failed", "could not record the run in etcd: " + e.message, m_context);
    };
    int failures = 0;
    const auto pause_after = [&](const Error& e) {
      if (!retryable(e)) return false;
      const milliseconds pause = retry_pause(++failures);
      if (BootClock::now() + pause + m_request.request_timeout >= deadline()) return false;
      log::event(log::Level::debug, "etcd_retry",
                 "cannot record the run in etcd: " + e.message + "; trying again while the lease lasts", m_context,
                 {log::millis("retry_in", pause, util::format_duration(pause))});
      std::this_thread::sleep_for(pause);
      return true;
    };
    for (int attempt = 0; attempt < k_record_attempts;) {
      auto s = m_records.read(m_key);
      if (!s) {
        if (pause_after(s.error())) continue;
        return warn(s.error());
      }
      const bool ours = s->own && s->own->create_revision == m_own_create && s->own->lease == m_lease;
      std::string outcome = how.outcome;
      if (!ours && outcome != "stopped") outcome = "lost";
      const std::string record =
          std::to_string(*m_started_us) + " " + std::to_string(end) + " " + outcome + " " +
          (how.exit_code ? std::to_string(*how.exit_code) : "-") + " " + (how.signal ? std::to_string(*how.signal) : "-") +
          " " + token + " " + std::to_string(m_request.pid) + " " + (m_request.host.empty() ? "-" : m_request.host) +
          " " + (m_request.version.empty() ? "-" : m_request.version);
      std::vector<std::string> list = s->runs ? etcd_run_records(s->runs->value) : std::vector<std::string>();
      bool replaced = false;
      for (auto& r : list) {
        const auto rec = parse_run_record(r);
        if (!rec || rec->token != m_acquired.token) continue;
        if (rec->outcome != "killed") return;  // written by an earlier attempt of this transaction
        r = record;
        replaced = true;
        break;
      }
      if (!replaced) list.insert(list.begin(), record);
      if (list.size() > m_records.keep()) list.resize(m_records.keep());
      RecordWrites w;
      w.runs = std::optional<std::string>(joined_records(list));
      if (outcome == "ok") w.ok = std::optional<std::string>(record);
      if (s->run)
        if (auto run = parse_run(s->run->value); run && run->owner == m_request.owner) w.run = std::optional<std::string>();
      auto wrote = m_records.write(*s, ours ? m_own_create : 0, m_key, w);
      if (!wrote) {
        if (pause_after(wrote.error())) continue;
        return warn(wrote.error());
      }
      if (*wrote) return;
      ++attempt;  // a conflict: read again
    }
    warn(record_conflict());
  }

  void watch_own_key(std::int64_t from) {
    try {
      m_watch.emplace(m_client, m_key, from, m_request.request_timeout, [this](etcd::Watch::State state) {
        // A deletion marks the lease lost and wakes the supervisor at once. A watch that fails is left to
        // the renewals, which read the key each time.
        if (state != etcd::Watch::State::deleted) return;
        m_deleted.store(true);
        if (const int fd = wake_fd(); fd >= 0) {
          std::uint64_t one = 1;
          [[maybe_unused]] auto n = ::write(fd, &one, sizeof one);
        }
        // The job is being killed already; then, for the log, why: a lease still alive had its key
        // deleted (broken), else the lease itself went (revoked, as by break, or ran out). One
        // keep-alive, bounded, on this thread.
        const auto bound = std::min<milliseconds>(m_request.request_timeout, milliseconds(500));
        auto ttl = m_client.keep_alive(m_lease, BootClock::now() + bound);
        if (ttl) m_cause.store(*ttl ? LossCause::broken : LossCause::revoked);
        const LossCause cause = m_cause.load();
        log::event(log::Level::error, "lease_lost", std::string("lease lost: the lock key was deleted; ") + loss_cause_text(cause),
                   m_context, {{"cause", loss_cause_name(cause)}});
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
  std::int64_t m_own_create;
  std::int64_t m_revision;
  EtcdRecords& m_records;
  std::optional<std::uint64_t> m_started_us;  // the run's start in the record (none: not recorded)
  const EtcdLeaseTarget& m_target;
  bool m_released = false;
  std::atomic<bool> m_deleted{false};
  std::atomic<LossCause> m_cause{LossCause::expired_or_deleted};  // why the key was deleted, once known
  std::optional<etcd::Watch> m_watch;
};


class EtcdLease final : public Lease {
 public:
  EtcdLease(EtcdLeaseTarget target, LeaseRequest request)
      : m_target(std::move(target)), m_request(std::move(request)), m_client(m_target.endpoint),
        m_keys(etcd_keys_for(m_target.key_prefix, m_request.lock)), m_records(m_client, m_keys, m_request) {}

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
  enum class Began { run, skipped, lost };

  void log_unavailable(const Error& e) const {
    log::event(log::Level::error, "etcd_unavailable", "cannot use etcd at " + m_target.redacted_url + ": " + e.message,
               {{"lock", m_request.lock}, {"kind", lease::to_string(e.kind)}});
  }
  void log_retry(const Error& e, milliseconds retry_in, bool first) const {
    log::event(first ? log::Level::warn : log::Level::debug, "etcd_retry",
               "cannot use etcd at " + m_target.redacted_url + ": " + e.message + "; trying again while the wait lasts",
               {{"lock", m_request.lock}, {"kind", lease::to_string(e.kind)},
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

  void log_skipped(const Skipped& skipped) const {
    lease::log_skipped(m_request.lock, *m_request.min_interval, skipped.last_success, skipped.now_us);
  }

  // Grants a lease and puts this run's key under the lock's prefix.
  Result<void> enqueue(Queued& q, const LeaseSchedule& schedule);
  // Confirms a queued run as the holder: its lease kept alive now, its key still there and first.
  Result<Step> confirm(Queued& q, const LeaseSchedule& schedule, std::optional<KeyValue>& first);
  // The holder's first step in the record: a run left in progress is recorded as killed, then either
  // --min-interval skips this run or `run` is put. One transaction, guarded by the holder's own key.
  Result<Began> begin_run(const Queued& q, std::uint64_t token, Skipped& skipped);
  std::expected<std::unique_ptr<HeldLease>, NotAcquired> granted(Queued& q);

  EtcdLeaseTarget m_target;
  LeaseRequest m_request;
  Client m_client;
  EtcdKeys m_keys;
  EtcdRecords m_records;
  std::optional<std::uint64_t> m_started_us;  // of the run that begin_run() put
};

Result<EtcdLease::Began> EtcdLease::begin_run(const Queued& q, std::uint64_t token, Skipped& skipped) {
  // This host's clock: the run's start, and the --min-interval check against the last success's.
  const std::uint64_t now_us = wall_us();
  const std::string token_text = std::to_string(token);
  for (int attempt = 0; attempt < k_record_attempts; ++attempt) {
    auto s = m_records.read(q.key);
    if (!s) return std::unexpected(s.error());
    if (!s->own || s->own->create_revision != q.own.create_revision || s->own->lease != q.lease) return Began::lost;
    std::optional<RunInProgress> run;
    if (s->run) run = parse_run(s->run->value);
    if (run && run->owner == m_request.owner && run->token == token_text) {
      // An earlier attempt of the transaction was applied (its answer was lost).
      m_started_us = parse_u64(run->start);
      if (m_started_us) return Began::run;
    }
    RecordWrites w;
    // A run of another owner still in progress never released: killed. (One of this owner with another
    // token is this run's own, from a key that was lost before its command started: it is replaced.)
    if (run && run->owner != m_request.owner) {
      std::vector<std::string> list = s->runs ? etcd_run_records(s->runs->value) : std::vector<std::string>();
      list.insert(list.begin(), killed_record(*run));
      if (list.size() > m_records.keep()) list.resize(m_records.keep());
      w.runs = std::optional<std::string>(joined_records(list));
    }
    if (s->run) w.run = std::optional<std::string>();
    bool skip = false;
    if (m_request.min_interval && s->ok) {
      const auto last = parse_run_record(s->ok->value);
      const auto min_us = static_cast<long double>(m_request.min_interval->count()) * 1000;
      // A start ahead of this host's clock counts as just now.
      if (last && static_cast<long double>(now_us) - static_cast<long double>(last->start_us) < min_us) {
        skip = true;
        skipped = Skipped{s->ok->value, now_us};
      }
    }
    if (!skip) {
      w.run = std::optional<std::string>(m_request.owner + " " + std::to_string(now_us) + " " + token_text + " " +
                                         std::to_string(m_request.pid) + " " +
                                         (m_request.host.empty() ? "-" : m_request.host) + " " +
                                         (m_request.version.empty() ? "-" : m_request.version));
    }
    auto wrote = m_records.write(*s, q.own.create_revision, q.key, w);
    if (!wrote) return std::unexpected(wrote.error());
    if (!*wrote) continue;  // changed under us: read again
    if (skip) return Began::skipped;
    m_started_us = now_us;
    return Began::run;
  }
  return std::unexpected(record_conflict());
}

Result<void> EtcdLease::enqueue(Queued& q, const LeaseSchedule& schedule) {
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
    return std::unexpected(Error{Error::Kind::protocol,
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
    return std::unexpected(Error{Error::Kind::protocol,
                                        "the lock's base (" + m_keys.base + ") is not a number below 2^53", false});
  }
  q.base = *base;
  q.own = enq->own;
  q.revision = enq->revision;
  q.first = enq->first;
  q.fresh = true;
  return {};
}

Result<EtcdLease::Step> EtcdLease::confirm(Queued& q, const LeaseSchedule& schedule,
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
  const auto on_error = [&](const Error& e) -> std::optional<std::unexpected<NotAcquired>> {
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
      // The record of runs (a token past 2^53 is refused by granted(), before anything is written).
      const std::uint64_t token = q.base + static_cast<std::uint64_t>(q.own.create_revision);
      if (token <= k_max_token) {
        Skipped skipped;
        auto run = begin_run(q, token, skipped);
        if (!run) {
          if (auto out = on_error(run.error())) return *out;
          continue;  // confirms afresh, then reads the record again
        }
        if (*run == Began::lost) {  // our key went (a break, the lease ran out): queue again
          leave(q);
          continue;
        }
        if (*run == Began::skipped) {
          log_skipped(skipped);
          leave(q);  // revoking the lease deletes our key: the next run acquires at once
          waited = since(began);
          const auto last = parse_run_record(skipped.last_success);
          return std::unexpected(NotAcquired{NotAcquired::Reason::skipped, 0, 0, last ? last->start_us : 0});
        }
      }
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
    log_unavailable({Error::Kind::protocol, "the token would reach 2^53 (base " + std::to_string(q.base) +
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
                                              q.own.create_revision, q.revision, m_records, m_started_us, m_target,
                                              m_request, context);
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
  return {tag + "wait/", tag + "base", tag + "run", tag + "ok", tag + "runs"};
}

std::vector<std::string> etcd_run_records(std::string_view value, std::size_t count) {
  std::vector<std::string> out;
  while (!value.empty() && out.size() < count) {
    const auto nl = value.find('\n');
    if (nl != 0) out.emplace_back(value.substr(0, nl));
    value = nl == std::string_view::npos ? std::string_view{} : value.substr(nl + 1);
  }
  return out;
}

std::unique_ptr<Lease> make_etcd_lease(EtcdLeaseTarget target, LeaseRequest request) {
  return std::make_unique<EtcdLease>(std::move(target), std::move(request));
}

}  // namespace fencerun::lease
