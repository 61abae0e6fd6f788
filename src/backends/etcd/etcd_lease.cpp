#include "backends/etcd/etcd_lease.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <optional>
#include <thread>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>

#include "backends/etcd/client.hpp"
#include "backends/etcd/records_lease_id.hpp"
#include "lease/keeper.hpp"
#include "log/log.hpp"
#include "util/duration.hpp"
#include "util/fd.hpp"

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

// The fields of `run`'s value: "OWNER START_US TOKEN PID HOST VERSION TTL_MS [FIRE_US]" (older
// versions: no TTL; FIRE_US, its trigger's fire time, only with --every or --min-interval).
struct RunInProgress {
  std::string owner, start, token, pid, host, version;
  std::optional<std::uint64_t> ttl_ms;
  std::optional<std::uint64_t> fire_us;
};
std::optional<RunInProgress> parse_run(std::string_view value) {
  const auto w = words(value);
  if (w.size() < 6 || w.size() > 8) return std::nullopt;
  RunInProgress r{std::string(w[0]), std::string(w[1]), std::string(w[2]), std::string(w[3]),
                  std::string(w[4]), std::string(w[5]), std::nullopt,      std::nullopt};
  if (w.size() >= 7) r.ttl_ms = parse_u64(w[6]);
  if (w.size() == 8) r.fire_us = parse_u64(w[7]);
  return r;
}
std::string run_text(const RunInProgress& r) {
  return r.owner + " " + r.start + " " + r.token + " " + r.pid + " " + r.host + " " + r.version +
         (r.ttl_ms || r.fire_us ? " " + std::to_string(r.ttl_ms.value_or(0)) : "") +
         (r.fire_us ? " " + std::to_string(*r.fire_us) : "");
}

// A run still in progress when the lock is taken by another one ended without a release: its record
// says killed, with what is unknown as '-' (as _runs.lua's record_killed writes it), and its fire time.
std::string killed_record(const RunInProgress& r) {
  return r.start + " - killed - - " + r.token + " " + r.pid + " " + r.host + " " + r.version +
         (r.fire_us ? " " + std::to_string(*r.fire_us) : "");
}

// The run in progress as a record (outcome "running"), for the `skipped` event of a trigger whose run
// it is.
std::optional<std::string> running_record(const RunInProgress& r) {
  RunRecord rec;
  const auto start = parse_u64(r.start);
  if (!start) return std::nullopt;
  rec.start_us = *start;
  rec.outcome = "running";
  rec.token = parse_u64(r.token);
  if (auto pid = parse_u64(r.pid)) rec.pid = static_cast<long>(*pid);
  rec.host = r.host;
  rec.version = r.version;
  rec.fire_us = r.fire_us;
  return run_record_line(rec);
}

std::string joined_records(const std::vector<std::string>& records) {
  std::string out;
  for (const auto& r : records) out += (out.empty() ? "" : "\n") + r;
  return out;
}

// The stamp that heads `runs`, "#kept US TTL_S": when (the writing host's clock) the records' lease
// was last kept alive, and its TTL then.
struct KeptStamp {
  std::uint64_t us = 0;
  std::int64_t ttl_s = 0;
};
std::optional<KeptStamp> kept_stamp(const std::optional<KeyValue>& runs) {
  if (!runs || !runs->value.starts_with("#kept ")) return std::nullopt;
  std::string_view v(runs->value);
  v.remove_prefix(6);
  const auto w = words(v.substr(0, v.find('\n')));
  if (w.size() != 2) return std::nullopt;
  auto us = parse_u64(w[0]);
  auto ttl = parse_u64(w[1]);
  if (!us || !ttl) return std::nullopt;
  return KeptStamp{*us, static_cast<std::int64_t>(*ttl)};
}

// The records' TTL as etcd takes it: whole seconds, rounded up, within etcd's bounds.
std::int64_t records_ttl_seconds(milliseconds ttl) {
  constexpr std::int64_t k_max = 9'000'000'000;  // etcd's maximum lease TTL
  const std::int64_t s = (ttl.count() + 999) / 1000;
  return std::clamp<std::int64_t>(s, 1, k_max);
}

// The record keys as read (nullopt: absent), and the run's own lock key.
struct RecordState {
  std::optional<KeyValue> run, ok, runs, rule, own;
};

// What a write leaves of a record key: unchanged (nullopt), deleted (an empty inner optional) or this
// value.
using RecordWrite = std::optional<std::optional<std::string>>;
struct RecordWrites {
  RecordWrite run, ok, runs, rule;
  // The record's marker, put (with no lease) only if it is still missing: this run starts the record.
  std::optional<std::string> since;
  bool empty() const { return !run && !ok && !runs && !rule && !since; }
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
                 etcd::range_op(etcd::single(m_keys.runs)), etcd::range_op(etcd::single(m_keys.rule)),
                 etcd::range_op(etcd::single(own_key))};
    auto r = m_client.txn(t, bound());
    if (!r) return std::unexpected(r.error());
    RecordState s;
    std::optional<KeyValue>* into[] = {&s.run, &s.ok, &s.runs, &s.rule, &s.own};
    for (std::size_t i = 0; i < 5; ++i)
      if (r->ranges[i] && !r->ranges[i]->kvs.empty()) *into[i] = r->ranges[i]->kvs.front();
    return s;
  }

  // Writes `w` unless a key changed since `s` was read or (own_create > 0) the run's own key is not
  // the one of that create_revision any more. false: a conflict (read again). On success, `after` (when
  // given) is the state the write left, so that the next write needs no read.
  Result<bool> write(const RecordState& s, std::int64_t own_create, const std::string& own_key,
                     const RecordWrites& w, RecordState* after = nullptr) {
    // Every key that stays after the write: its value, and its lease now.
    struct Key {
      const std::string& name;
      const std::optional<KeyValue>& now;
      const RecordWrite& write;
    };
    const Key keys[] = {{m_keys.run, s.run, w.run},
                        {m_keys.ok, s.ok, w.ok},
                        {m_keys.runs, s.runs, w.runs},
                        {m_keys.rule, s.rule, w.rule}};
    std::vector<std::int64_t> old_leases;
    for (const auto& k : keys)
      if (k.now && k.now->lease != 0 && std::ranges::find(old_leases, k.now->lease) == old_leases.end())
        old_leases.push_back(k.now->lease);
    // `run` carries no lease (it must outlive a holder whose lease is revoked; a release deletes it);
    // `ok`, `runs` and `rule` go onto the records' lease (the rule lives as long as the record it
    // judges by).
    bool puts = false;
    for (const auto& k : keys)
      if (&k.name != &m_keys.run) puts = puts || (k.write && *k.write);
    // The lease is kept alive only by a write of `runs` (a release), at most every quarter of its TTL.
    const bool writes_runs = w.runs && *w.runs;
    const auto stamp = kept_stamp(s.runs);
    const std::uint64_t now = wall_us();
    const std::uint64_t quarter_us = static_cast<std::uint64_t>(m_ttl_s) * 250'000;
    const bool refresh = writes_runs && (!stamp || stamp->ttl_s != m_ttl_s || stamp->us > now ||
                                         now - stamp->us >= quarter_us);
    std::int64_t lease = 0;
    std::optional<std::uint64_t> renewed_us;
    if (puts) {
      auto chosen = choose_lease(old_leases, refresh, renewed_us);
      if (!chosen) return std::unexpected(chosen.error());
      lease = *chosen;
    }
    RecordWrites out = w;
    if (writes_runs) {
      const std::uint64_t kept = renewed_us ? *renewed_us : !stamp ? now : stamp->us;
      out.runs = std::optional<std::string>("#kept " + std::to_string(kept) + " " + std::to_string(m_ttl_s) + "\n" +
                                            **w.runs);
    }
    const Key written[] = {{m_keys.run, s.run, out.run},
                           {m_keys.ok, s.ok, out.ok},
                           {m_keys.runs, s.runs, out.runs},
                           {m_keys.rule, s.rule, out.rule}};
    etcd::TxnRequest t;
    if (own_create > 0)
      t.compare.push_back({own_key, etcd::Compare::Target::create_revision, own_create});
    if (w.since) {
      // Another run that started the record meanwhile fails the transaction: read again.
      t.compare.push_back({m_keys.since, etcd::Compare::Target::create_revision, 0});
      t.success.push_back(etcd::put_op(m_keys.since, *w.since, 0));
    }
    for (const auto& k : written) {
      const bool leased = &k.name != &m_keys.run;
      t.compare.push_back({k.name, etcd::Compare::Target::mod_revision, k.now ? k.now->mod_revision : 0});
      if (k.write) {
        if (*k.write) t.success.push_back(etcd::put_op(k.name, **k.write, leased ? lease : 0));
        else if (k.now) t.success.push_back(etcd::remove_op(k.name));
      } else if (leased && k.now && puts && k.now->lease != lease) {
        t.success.push_back(etcd::put_op(k.name, k.now->value, lease));  // onto the records' lease
      }
    }
    if (t.success.empty()) {
      if (after) *after = s;
      return true;
    }
    auto r = m_client.txn(t, bound());
    if (!r) return std::unexpected(r.error());
    if (r->lease_missing) {  // expired (or revoked) since it was last kept alive: grant another
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
    if (after) {
      RecordState a = s;
      std::optional<KeyValue>* into[] = {&a.run, &a.ok, &a.runs, &a.rule};
      for (std::size_t i = 0; i < 4; ++i) {
        const auto& k = written[i];
        if (k.write) {
          if (*k.write) *into[i] = KeyValue{k.name, **k.write, k.now ? k.now->create_revision : r->revision,
                                            r->revision, i == 0 ? 0 : lease};
          else into[i]->reset();
        } else if (i != 0 && k.now && puts && k.now->lease != lease) {
          (*into[i])->mod_revision = r->revision;
          (*into[i])->lease = lease;
        }
      }
      *after = a;
    }
    return true;
  }

  // A lease granted for a write that did not happen is left to the next write of NAME: its id is
  // NAME's own, and another run may have put its record on it meanwhile.
  void drop_unused() { m_granted = 0; }

 private:
  Deadline bound() const { return BootClock::now() + m_request.request_timeout; }

  // The lease the record keys go onto: the one they carry (kept alive when `refresh`, and kept when its
  // TTL is the one asked); else a new one (granted once, until a write uses it). `renewed_us`: when
  // the lease returned was granted or kept alive (this host's clock), if this run did it.
  Result<std::int64_t> choose_lease(const std::vector<std::int64_t>& old_leases, bool refresh,
                                    std::optional<std::uint64_t>& renewed_us) {
    std::int64_t current = old_leases.empty() ? 0 : old_leases.front();
    if (current != 0 && current == m_granted) {
      renewed_us = m_renewed_us;
      return current;
    }
    // Granted or kept alive by this run already (the rule put at the start, then the record at the
    // release): no second keep-alive; the stamp says when that was.
    if (current != 0 && current != m_dead && current == m_renewed) {
      renewed_us = m_renewed_us;
      return current;
    }
    if (current != 0 && current != m_dead && !refresh) return current;
    std::optional<std::int64_t> current_ttl;
    if (current != 0 && current != m_dead) {
      const std::uint64_t asked = wall_us();
      auto ttl = m_client.keep_alive(current, bound());
      if (!ttl) return std::unexpected(ttl.error());
      current_ttl = *ttl;
      if (current_ttl && *current_ttl == m_ttl_s) {
        renewed_us = asked;
        m_renewed = current;
        m_renewed_us = asked;
        return current;
      }
    }
    if (m_granted == 0) {
      m_renewed_us = wall_us();
      // The records' lease has an id of its own (etcd_records_lease_id): a grant that timed out here
      // but was applied later leaves no second lease, only the one the next write of NAME takes.
      const std::int64_t id = etcd_records_lease_id(m_keys.runs, m_ttl_s);
      auto g = m_client.grant(m_ttl_s, bound(), id);
      if (!g) return std::unexpected(g.error());
      if (g->existed) {
        auto ttl = m_client.keep_alive(id, bound());
        if (!ttl) return std::unexpected(ttl.error());
        if (!*ttl) {  // ran out meanwhile
          g = m_client.grant(m_ttl_s, bound(), id);
          if (!g) return std::unexpected(g.error());
          if (g->existed) return std::unexpected(Error{Error::Kind::busy, "the records' lease kept changing", true});
        } else {
          g->ttl = **ttl;
        }
      }
      m_granted = g->id;
      m_granted_ttl = g->ttl;
    }
    renewed_us = m_renewed_us;
    // etcd raised a TTL below its minimum: the current lease, just reset to that TTL, is as good.
    if (current_ttl && *current_ttl == m_granted_ttl) {
      drop_unused();
      m_renewed = current;
      return current;
    }
    m_renewed = m_granted;
    return m_granted;
  }

  Client& m_client;
  const EtcdKeys& m_keys;
  const LeaseRequest& m_request;
  std::int64_t m_ttl_s;
  std::int64_t m_granted = 0;  // granted by this run, not yet carrying a key
  std::int64_t m_granted_ttl = 0;
  std::int64_t m_dead = 0;  // a lease a put found gone
  std::int64_t m_renewed = 0;        // the lease this run granted or kept alive last
  std::uint64_t m_renewed_us = 0;    // when (this host's clock)
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
                std::optional<std::uint64_t> started_us, std::optional<std::uint64_t> fired_us,
                std::optional<RecordState> state, const EtcdLeaseTarget& target, const LeaseRequest& request,
                log::Context context)
      : KeptLease(*renewer, std::move(acquired), request, std::move(context)), m_renewer(std::move(renewer)),
        m_client(client), m_lease(lease), m_key(std::move(key)), m_own_create(own_create), m_revision(revision),
        m_records(records), m_started_us(started_us), m_fired_us(fired_us), m_state(std::move(state)),
        m_target(target) {}

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
    JobFacts f{m_acquired.token, m_request.lock, m_request.owner, m_request.timing.ttl.count(), 0, 1,
               "FENCERUN_ETCD_URL", m_target.redacted_url, {{"FENCERUN_ETCD_LEASE", lease_hex(m_lease)}}, {}};
    // The slot the trigger fired in, not the one it got the lock in (a waiter runs for its own slot).
    if (m_request.every && m_fired_us)
      f.slot_start_us = slot_start_us(slot_index(*m_fired_us, *m_request.every), *m_request.every);
    return f;
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
      // The first attempt writes over the state begin_run() left (no read: one request); a conflict
      // reads again.
      Result<RecordState> s = m_state ? Result<RecordState>(*m_state) : m_records.read(m_key);
      m_state.reset();
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
          " " + (m_request.version.empty() ? "-" : m_request.version) +
          (m_fired_us ? " " + std::to_string(*m_fired_us) : "");
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
      // The last success is the one whose trigger fired last (close_run in _runs.lua): a waiter of an
      // older slot that succeeds after a newer slot's run does not hide that run.
      if (outcome == "ok") {
        const auto last = s->ok ? parse_run_record(s->ok->value) : std::nullopt;
        const auto mine = parse_run_record(record);
        if (!last || !mine || fired_us_of(*mine) >= fired_us_of(*last)) w.ok = std::optional<std::string>(record);
      }
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
  std::optional<std::uint64_t> m_fired_us;    // its trigger's fire time (--every, --min-interval)
  std::optional<RecordState> m_state;         // the record as begin_run() left it
  const EtcdLeaseTarget& m_target;
  bool m_released = false;
  std::atomic<bool> m_deleted{false};
  std::atomic<LossCause> m_cause{LossCause::expired_or_deleted};  // why the key was deleted, once known
  std::optional<etcd::Watch> m_watch;
};


// What one transaction read of the lock: the queue (in queue order), this run's key, the base, the
// record (with its marker) and the lock-delay, at one revision.
struct Look {
  std::int64_t revision = 0;
  std::vector<KeyValue> queue;
  std::optional<KeyValue> own, base, run, ok, runs, delay, rule, since;
};

// The greatest token the record shows as issued: the run in progress's, the records kept, the last
// success's.
// Every token the record shows as issued (the run in progress's but this run's own, the records kept,
// the last success's).
std::vector<std::uint64_t> recorded_tokens(const Look& l, std::string_view own_owner) {
  std::vector<std::uint64_t> out;
  if (l.run)
    if (auto run = parse_run(l.run->value); run && run->owner != own_owner)
      if (auto t = parse_u64(run->token)) out.push_back(*t);
  if (l.runs)
    for (const auto& record : etcd_run_records(l.runs->value))
      if (auto r = parse_run_record(record); r && r->token) out.push_back(*r->token);
  if (l.ok)
    if (auto r = parse_run_record(l.ok->value); r && r->token) out.push_back(*r->token);
  return out;
}

std::uint64_t last_recorded_token(const Look& l, std::string_view own_owner) {
  std::uint64_t last = 0;
  if (l.run)
    if (auto run = parse_run(l.run->value); run && run->owner != own_owner)  // not this run's own commit
      if (auto t = parse_u64(run->token)) last = std::max(last, *t);
  if (l.runs)  // every record kept (a paused holder's late record may come first)
    for (const auto& record : etcd_run_records(l.runs->value))
      if (auto r = parse_run_record(record); r && r->token) last = std::max(last, *r->token);
  if (l.ok)
    if (auto r = parse_run_record(l.ok->value); r && r->token) last = std::max(last, *r->token);
  return last;
}

class EtcdLease final : public Lease {
 public:
  EtcdLease(EtcdLeaseTarget target, LeaseRequest request)
      : m_target(std::move(target)), m_request(std::move(request)), m_client(m_target.endpoint),
        m_keys(etcd_keys_for(m_target.key_prefix, m_request.lock)), m_records(m_client, m_keys, m_request),
        m_rule(schedule_rule(m_request.every, m_request.min_interval, m_request.records.ttl)) {}

  std::expected<std::unique_ptr<HeldLease>, NotAcquired> acquire(Waiter& waiter, milliseconds& waited) override;

 private:
  struct Queued {
    std::int64_t lease = 0;
    std::string key;
    std::int64_t ticket = 0;  // the place kept from a key that vanished (0: none)
    std::string delay_seen;   // the token of the vanished run whose lock-delay this run saw running
    bool put_again = false;   // the key was put again for a token above the recorded ones
    // Keys seen ahead of ours, and since when each one is missing (gone without a key at its place
    // or a record of its run).
    struct Ahead {
      KeyValue kv;
      std::optional<Deadline> missing_until;
    };
    std::vector<Ahead> was_ahead;
    bool saw_revocation = false;  // our key vanished, or a holder's run was left behind
    std::uint64_t base = 0;
    KeyValue own;
    Deadline sent{};  // of the last request that confirmed the lease (grant or keep-alive)
    bool fresh = false;  // `look` was read just now (by the transaction that put the key)
    Look look;
  };
  enum class Began { run, skipped, record_lost, lost, conflict, rule_mismatch };

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
  void log_delay_busy(const RunInProgress& run) const {
    log::event(log::Level::info, "busy",
               std::string(m_request.wait->count() == 0 ? "lock is busy" : "lock is still busy: wait ran out") +
                   ": the last holder's run ended without a release and may still be running (lock-delay)",
               {{"lock", m_request.lock}, {"holder_pid", run.pid}, {"holder_host", run.host}, {"token", run.token}});
  }
  // Gives up a queued key: revoking the lease deletes it. Kept short: an unreachable cluster will not
  // answer this either, and the lease expires anyway.
  void leave(Queued& q) {
    if (q.lease == 0) return;
    auto bound = std::max(std::min<milliseconds>(m_request.request_timeout, milliseconds(1000)), milliseconds(100));
    [[maybe_unused]] auto revoked = m_client.revoke(q.lease, BootClock::now() + bound);
    Queued next;
    next.ticket = q.ticket;
    next.delay_seen = std::move(q.delay_seen);
    next.put_again = q.put_again;
    next.was_ahead = std::move(q.was_ahead);
    next.saw_revocation = q.saw_revocation;
    q = std::move(next);
  }

  void log_skipped(const Skipped& skipped) const {
    lease::log_skipped(m_request.lock, m_request.rule(), skipped.last_success, skipped.now_us, skipped.fired_us,
                       skipped.in_progress);
  }

  // One transaction: `put` (when given: only if the key is not there yet) and the lock read back;
  // `commit`: with the put, the commit of an uncontended run (`run` put when nobody is queued).
  Result<std::optional<Look>> read_lock(const std::string& own_key, const std::optional<etcd::Op>& put, Deadline bound,
                                        bool commit = false);
  // `run`'s value for this run: "OWNER START_US TOKEN PID HOST VERSION TTL_MS".
  std::string run_value(std::uint64_t start_us, const std::string& token) const;
  // Grants a lease and puts this run's key (with its ticket) in the queue, reading the lock back.
  Result<void> enqueue(Queued& q, const LeaseSchedule& schedule);
  // A queued run's lease kept alive now, and the lock read again.
  Result<bool> confirm(Queued& q, const LeaseSchedule& schedule);
  // The holder's first step in the record, over the state just read: a run left in progress is
  // recorded as killed, then either --min-interval skips this run or `run` is put. One transaction,
  // guarded by the holder's own key and the record's keys (the commit point of holding the lock).
  // Under --if-record-lost skip with the record's marker missing: record_lost, nothing written.
  Result<Began> begin_run(const Queued& q, std::uint64_t token, Skipped& skipped);
  // Creates the lock-delay of a vanished holder's run (unless there is one): an etcd lease of its TTL.
  Result<void> start_delay(const Queued& q, const RunInProgress& run);
  std::expected<std::unique_ptr<HeldLease>, NotAcquired> granted(Queued& q);
  // Warns once when the cluster's version has a known lease bug (cached per host, see check_version).
  void check_version();

  EtcdLeaseTarget m_target;
  LeaseRequest m_request;
  Client m_client;
  EtcdKeys m_keys;
  EtcdRecords m_records;
  std::optional<std::uint64_t> m_started_us;  // of the run that begin_run() put
  std::optional<RecordState> m_state;         // the record as begin_run() left it
  std::string m_rule;                         // schedule_rule() of this trigger ("" none)
  std::string m_held_rule;                    // the lock's other rule, when begin_run() found one
  bool m_new_record = false;                  // begin_run() put the record's marker: this run starts it
  // The trigger's fire time: this host's clock at its first request, kept while it waits.
  std::optional<std::uint64_t> m_fired_us;
  bool m_clock_checked = false;
  std::optional<std::pair<etcd::MemberClock, std::int64_t>> m_skewed;  // the reply, and how far apart
};

// How far this host's clock may be from an etcd member's for --every and --min-interval: the rule
// compares times written by different hosts, so they must share one clock (the cluster's, as
// closely as a Date with 1 s resolution and a round trip can tell).
constexpr std::chrono::seconds k_clock_bound{2};

Result<std::optional<Look>> EtcdLease::read_lock(const std::string& own_key, const std::optional<etcd::Op>& put,
                                                 Deadline bound, bool commit) {
  etcd::TxnRequest t;
  const std::vector<etcd::Op> reads = {
      etcd::range_op({m_keys.prefix, etcd::prefix_end(m_keys.prefix), etcd::Sort::create_ascending, 0, 0}),
      etcd::range_op(etcd::single(own_key)),    etcd::range_op(etcd::single(m_keys.base)),
      etcd::range_op(etcd::single(m_keys.run)), etcd::range_op(etcd::single(m_keys.ok)),
      etcd::range_op(etcd::single(m_keys.runs)), etcd::range_op(etcd::single(m_keys.delay)),
      etcd::range_op(etcd::single(m_keys.rule)), etcd::range_op(etcd::single(m_keys.since))};
  if (put) {
    // Already there: an earlier attempt of this request ran (its answer was lost).
    t.compare.push_back({own_key, etcd::Compare::Target::create_revision, 0});
    t.success.push_back(*put);
    if (commit) {
      // The uncontended run commits in the same transaction (step 2's commit, see etcd_lease.hpp):
      // `run` put when, before this transaction, the queue was empty, no run was in progress and the
      // base existed. Its token is written as '=': the base plus `run`'s own mod_revision, which is
      // this transaction's revision, its key's create_revision.
      etcd::TxnRequest c;
      c.compare = {{m_keys.prefix, etcd::Compare::Target::create_revision, 0, false, etcd::prefix_end(m_keys.prefix)},
                   {m_keys.run, etcd::Compare::Target::create_revision, 0},
                   {m_keys.base, etcd::Compare::Target::create_revision, 0, true}};
      c.success = {etcd::put_op(m_keys.run, run_value(wall_us(), "="))};
      t.success.push_back(etcd::txn_op(std::move(c)));
    }
  }
  t.success.insert(t.success.end(), reads.begin(), reads.end());
  if (put) t.failure = reads;
  auto r = m_client.txn(t, bound);
  if (!r) return std::unexpected(r.error());
  if (r->lease_missing) return std::optional<Look>();  // the lease the key was put on is gone
  const std::size_t off = put && r->succeeded ? (commit ? 2 : 1) : 0;
  if (r->ranges.size() != off + reads.size() || !r->ranges[off])
    return std::unexpected(Error{Error::Kind::protocol, "unexpected transaction answer: a range is missing", true});
  Look l;
  l.revision = r->revision;
  l.queue = std::move(r->ranges[off]->kvs);
  etcd_sort_queue(l.queue);
  std::optional<KeyValue>* into[] = {&l.own, &l.base, &l.run, &l.ok, &l.runs, &l.delay, &l.rule, &l.since};
  for (std::size_t i = 0; i < 8; ++i) {
    const auto& range = r->ranges[off + 1 + i];
    if (range && !range->kvs.empty()) *into[i] = range->kvs.front();
  }
  // A token written as '=' (a commit in the queueing transaction) is the base plus `run`'s revision.
  if (l.run && l.base)
    if (auto run = parse_run(l.run->value); run && run->token == "=")
      if (auto base = parse_u64(l.base->value)) {
        run->token = std::to_string(*base + static_cast<std::uint64_t>(l.run->mod_revision));
        l.run->value = run_text(*run);
      }
  return std::optional<Look>(std::move(l));
}

std::string EtcdLease::run_value(std::uint64_t start_us, const std::string& token) const {
  return m_request.owner + " " + std::to_string(start_us) + " " + token + " " + std::to_string(m_request.pid) + " " +
         (m_request.host.empty() ? "-" : m_request.host) + " " + (m_request.version.empty() ? "-" : m_request.version) +
         " " + std::to_string(m_request.timing.ttl.count()) +
         (m_request.rule().any() && m_fired_us ? " " + std::to_string(*m_fired_us) : "");
}

Result<EtcdLease::Began> EtcdLease::begin_run(const Queued& q, std::uint64_t token, Skipped& skipped) {
  // This host's clock: the run's start. --every and --min-interval judge by the trigger's fire time
  // (this host's clock at its first request) against the records' (their hosts' clocks, which the
  // clock check keeps within 2 s of the cluster's, so of each other's).
  const std::uint64_t now_us = wall_us();
  const std::string token_text = std::to_string(token);
  // Over the state the lock was just read in; after a conflict the caller reads again.
  const RecordState state{q.look.run, q.look.ok, q.look.runs, q.look.rule, q.look.own};
  const RecordState* s = &state;
  if (!s->own || s->own->create_revision != q.own.create_revision || s->own->lease != q.lease) return Began::lost;
  std::optional<RunInProgress> run;
  if (s->run) run = parse_run(s->run->value);
  if (run && run->owner == m_request.owner && run->token == token_text) {
    // An earlier attempt of the transaction was applied (its answer was lost).
    m_started_us = parse_u64(run->start);
    if (m_started_us) {
      m_state = state;
      return Began::run;
    }
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
  if (m_request.rule().any() && m_fired_us) {
    // The rule of schedule.hpp, over `ok` and `runs` as read: this transaction writes `run` only if
    // they are unchanged, so two triggers never both pass it (as the acquire script on Redis).
    if (s->rule && s->rule->value != m_rule) {
      m_held_rule = s->rule->value;
      return Began::rule_mismatch;
    }
    // The marker was read with the rest of the lock (no request of its own); nothing is changed when
    // this trigger does not run, not even a killed run's record (as on Redis).
    if (!q.look.since && m_request.skip_if_record_lost) {
      skipped = Skipped{};
      skipped.now_us = now_us;
      skipped.fired_us = *m_fired_us;
      skipped.record_lost = true;
      return Began::record_lost;
    }
    const std::vector<std::string> runs = s->runs ? etcd_run_records(s->runs->value) : std::vector<std::string>();
    if (auto done = already_done(m_request.rule(), *m_fired_us, s->ok ? std::optional(s->ok->value) : std::nullopt,
                                 runs)) {
      skip = true;
      skipped = Skipped{*done, now_us, *m_fired_us, false};
    }
  }
  if (!skip) {
    w.run = std::optional<std::string>(run_value(now_us, token_text));
    // The rule the lock's triggers share, stored with the record (on its lease) by the first one.
    if (!m_rule.empty() && !s->rule) w.rule = std::optional<std::string>(m_rule);
    // The first run with a rule starts the record: its marker, kept as long as the cluster's data.
    if (!m_rule.empty() && !q.look.since) w.since = std::to_string(now_us);
  }
  RecordState after;
  auto wrote = m_records.write(*s, q.own.create_revision, q.key, w, &after);
  if (!wrote) return std::unexpected(wrote.error());
  if (!*wrote) return Began::conflict;  // changed under us: read again
  if (skip) return Began::skipped;
  m_new_record = w.since.has_value();
  m_started_us = now_us;
  m_state = after;
  return Began::run;
}

Result<void> EtcdLease::enqueue(Queued& q, const LeaseSchedule& schedule) {
  const Deadline now = BootClock::now();
  // A reply that comes after the stop point is of no use (the command could not start).
  const Deadline bound = std::min(now + m_request.request_timeout, schedule.stop_at(schedule.deadline_after(now)));
  const std::int64_t ttl_s = m_request.timing.ttl.count() / 1000;
  if (!m_fired_us) m_fired_us = wall_us();
  auto grant = m_client.grant(ttl_s, bound);
  if (!grant) return std::unexpected(grant.error());
  q.lease = grant->id;
  q.sent = now;
  // The one-clock check of --every and --min-interval, on the grant's reply (no request of its own):
  // the record's times are the wall clocks of the hosts that wrote them, so every host's must be the
  // cluster's within k_clock_bound. A host too far off takes nothing: its lease is revoked at once.
  if (m_request.rule().any() && !m_clock_checked)
    if (const auto clock = m_client.last_member_clock()) {
      m_clock_checked = true;
      if (const auto apart = etcd::clock_apart_us(*clock, k_clock_bound)) {
        m_skewed.emplace(*clock, *apart);
        leave(q);
        return {};
      }
    }
  if (grant->ttl < ttl_s) {  // etcd raises a TTL below its minimum, never lowers one
    leave(q);
    return std::unexpected(Error{Error::Kind::protocol,
                                        "the cluster granted a lease of " + std::to_string(grant->ttl) +
                                            "s for --ttl " + std::to_string(ttl_s) + "s",
                                        false});
  }
  q.key = m_keys.key(q.lease);
  QueueValue v{m_request.owner, m_request.pid, m_request.host, m_request.timing.ttl.count(), q.ticket};
  // The commit joins the queueing transaction only where nothing needs a look first: no --every or
  // --min-interval check (it needs the record read before `run` is put), no place kept from a
  // revocation.
  const bool commit = !m_request.rule().any() && q.ticket == 0 && !q.saw_revocation;
  auto look = read_lock(q.key, etcd::put_op(q.key, queue_value(v), q.lease), bound, commit);
  if (!look) {
    leave(q);
    return std::unexpected(look.error());
  }
  if (!*look) {  // the lease is gone already: grant another
    leave(q);
    return {};
  }
  q.look = std::move(**look);
  q.fresh = true;
  return {};
}

Result<bool> EtcdLease::confirm(Queued& q, const LeaseSchedule& schedule) {
  const Deadline now = BootClock::now();
  const Deadline bound = std::min(now + m_request.request_timeout, schedule.stop_at(schedule.deadline_after(now)));
  auto alive = m_client.keep_alive(q.lease, bound);
  if (!alive) return std::unexpected(alive.error());
  if (!*alive) return false;  // the lease ran out (and the key with it)
  auto look = read_lock(q.key, std::nullopt, bound);
  if (!look) return std::unexpected(look.error());
  q.sent = now;
  q.look = std::move(**look);
  return true;
}

Result<void> EtcdLease::start_delay(const Queued& q, const RunInProgress& run) {
  if (q.look.delay) return {};
  const milliseconds delay =
      m_request.lock_delay ? *m_request.lock_delay
                           : milliseconds(static_cast<milliseconds::rep>(run.ttl_ms.value_or(
                                 static_cast<std::uint64_t>(m_request.timing.ttl.count()))));
  const std::int64_t seconds = std::max<std::int64_t>(1, (delay.count() + 999) / 1000);
  const Deadline bound = BootClock::now() + m_request.request_timeout;
  auto grant = m_client.grant(seconds, bound);
  if (!grant) return std::unexpected(grant.error());
  // Only over the run it delays, and only once.
  etcd::TxnRequest t;
  t.compare = {{m_keys.delay, etcd::Compare::Target::create_revision, 0},
               {m_keys.run, etcd::Compare::Target::mod_revision, q.look.run->mod_revision}};
  t.success = {etcd::put_op(m_keys.delay, run.token, grant->id)};
  auto r = m_client.txn(t, bound);
  if (!r || r->lease_missing || !r->succeeded) [[maybe_unused]] auto revoked = m_client.revoke(grant->id, bound);
  if (!r) return std::unexpected(r.error());
  if (r->succeeded && !r->lease_missing)
    log::event(log::Level::warn, "lock_delay",
               "the last holder's run (token " + run.token + " on " + run.host +
                   ") ended without a release and may still be running: waiting " + util::format_duration(delay) +
                   " (lock-delay) before starting",
               {{"lock", m_request.lock}, {"token", run.token}, {"holder_host", run.host},
                log::millis("delay", delay, util::format_duration(delay))});
  return {};
}

std::expected<std::unique_ptr<HeldLease>, NotAcquired> EtcdLease::acquire(Waiter& waiter, milliseconds& waited) {
  const Deadline began = BootClock::now();
  const LeaseSchedule schedule(m_request.timing);
  const auto timeout = m_request.request_timeout;
  std::optional<Deadline> wait_until;
  if (m_request.wait) wait_until = began + *m_request.wait;
  check_version();
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
  // NAME's record was written with another rule: nothing is run (as on Redis, before waiting).
  const auto refuse_rule = [&](const std::string& held) {
    log_rule_mismatch(m_request.lock, held, m_rule);
    q.ticket = 0;
    NotAcquired why{NotAcquired::Reason::rule_mismatch};
    why.held_rule = held;
    leave(q);
    waited = since(began);
    return std::unexpected(why);
  };
  // --every, --min-interval: this trigger's run already ran, or (`in_progress`) is running.
  const auto skip = [&](const Skipped& skipped) {
    if (skipped.record_lost) log_record_lost(m_request.lock, true);
    else log_skipped(skipped);
    q.ticket = 0;
    leave(q);  // revoking the lease deletes our key: the next run acquires at once
    waited = since(began);
    const auto last = parse_run_record(skipped.last_success);
    return std::unexpected(NotAcquired{NotAcquired::Reason::skipped, 0, 0, last ? last->start_us : 0});
  };
  // Our key is gone (revoked, expired, deleted): queue again, keeping our place.
  const auto requeue = [&] {
    q.saw_revocation = true;
    if (q.own.create_revision > 0) q.ticket = etcd_queue_order(q.own);
    leave(q);
  };

  for (;;) {
    if (q.lease == 0) {
      if (auto ok = enqueue(q, schedule); !ok) {
        if (auto out = on_error(ok.error())) return *out;
        continue;
      }
      if (m_skewed) {
        const auto& [clock, apart] = *m_skewed;
        const std::int64_t secs = ((apart < 0 ? -apart : apart) + 500'000) / 1'000'000;
        const std::string option = m_request.every ? "--every" : "--min-interval";
        log::event(log::Level::error, "clock_skew",
                   "this host's clock is " + std::to_string(secs) + "s " + (apart < 0 ? "behind" : "ahead of") +
                       " etcd member " + m_client.member_name(clock.member) + " (clock skew?): " + option +
                       " needs clocks within " + util::format_duration(k_clock_bound),
                   {{"lock", m_request.lock},
                    {"member", m_client.member_name(clock.member)},
                    log::millis("skew", milliseconds(apart / 1000), std::to_string(apart / 1000) + "ms")});
        return refuse(NotAcquired::Reason::unavailable);
      }
      if (q.lease == 0) continue;  // its lease was gone at once
    } else if (!q.fresh ||
               BootClock::now() >= schedule.stop_at(schedule.deadline_after(q.sent))) {
      // After a wait, or late (the reply came after the stop point): keep the lease alive, read again.
      auto confirmed = confirm(q, schedule);
      if (!confirmed) {
        if (auto out = on_error(confirmed.error())) return *out;
        continue;
      }
      if (!*confirmed) {
        requeue();
        continue;
      }
    }
    q.fresh = false;
    if (failures > 0) {
      log::event(log::Level::info, "etcd_recovered", "etcd answers again", {{"lock", m_request.lock}});
      failures = 0;
    }
    const Look& l = q.look;
    if (!l.own || l.own->lease != q.lease) {
      requeue();
      continue;
    }
    q.own = *l.own;
    if (!m_rule.empty() && l.rule && l.rule->value != m_rule) return refuse_rule(l.rule->value);
    if (!l.base) {
      // The lock's first use: its base, once (set from the clock, never changed).
      etcd::TxnRequest t;
      t.compare = {{m_keys.base, etcd::Compare::Target::create_revision, 0}};
      t.success = {etcd::put_op(m_keys.base, new_base())};
      if (auto r = m_client.txn(t, BootClock::now() + timeout); !r) {
        if (auto out = on_error(r.error())) return *out;
      }
      continue;
    }
    auto base = parse_u64(l.base->value);
    if (!base || *base > k_max_token) {
      log_unavailable({Error::Kind::protocol, "the lock's base (" + m_keys.base + ") is not a number below 2^53"});
      return refuse(NotAcquired::Reason::unavailable);
    }
    q.base = *base;

    // Who is before us: the key just before ours in the queue; when we are first, a holder whose run
    // is in progress (a key that came back to an earlier place finds the lock held).
    std::optional<KeyValue> ahead;
    for (const auto& kv : l.queue) {
      if (kv.key == q.key) break;
      ahead = kv;
    }
    std::optional<RunInProgress> run;
    if (l.run) run = parse_run(l.run->value);
    const bool run_of_other = run && run->owner != m_request.owner;
    std::optional<KeyValue> run_holder;
    if (run_of_other)
      for (const auto& kv : l.queue)
        if (parse_queue_value(kv.value).owner == run->owner) run_holder = kv;
    if (!ahead && run_holder) ahead = run_holder;
    if (run_of_other && !run_holder) q.saw_revocation = true;

    // Waiters ahead of ours that vanished together with the holder (a revocation of every lease, as
    // etcd#15247 makes) come back with their places as tickets: a run that saw a revocation (its own
    // key vanished, or a holder's run left behind) and became first gives them one --renew (they
    // notice at their next keep-alive at the latest) and a request's time before it commits. A key
    // counts as gone when no key has its place and no record has its token (a holder that ran and
    // released is in the record). A waiter that left of its own accord (its wait ran out) delays
    // nobody when nothing was revoked.
    std::optional<Deadline> settle_until;
    {
      // A key ahead ran when its token is in the record (not merely below a recorded one: a waiter
      // that came back keeps an old place but gets a new token).
      const auto recorded = recorded_tokens(l, m_request.owner);
      const Deadline now = BootClock::now();
      std::vector<Queued::Ahead> kept;
      for (auto& a : q.was_ahead) {
        const auto place = etcd_queue_order(a.kv);
        const bool back = std::ranges::any_of(l.queue, [&](const KeyValue& kv) {
          return kv.key != q.key && etcd_queue_order(kv) == place;
        });
        const bool ran =
            std::ranges::find(recorded, q.base + static_cast<std::uint64_t>(a.kv.create_revision)) != recorded.end();
        if (back || ran) continue;
        if (!a.missing_until) a.missing_until = now + m_request.timing.renew + timeout;
        if (now >= *a.missing_until) continue;  // not coming back: it left
        settle_until = settle_until ? std::min(*settle_until, *a.missing_until) : *a.missing_until;
        kept.push_back(std::move(a));
      }
      for (const auto& kv : l.queue) {
        if (kv.key == q.key) break;
        kept.push_back({kv, std::nullopt});
      }
      q.was_ahead = std::move(kept);
    }
    const bool settling = !ahead && settle_until.has_value() && q.saw_revocation;

    // The lock-delay of a vanished holder's run: over once this run saw it running and then gone (the
    // server expired its lease), or when the run is closed (its holder's job is gone).
    if (run_of_other && l.delay && l.delay->value == run->token) q.delay_seen = run->token;
    const bool delay_over = run_of_other && !l.delay && q.delay_seen == run->token;
    const bool delayed = !ahead && run_of_other && !delay_over &&
                         !(m_request.lock_delay && m_request.lock_delay->count() == 0);
    if (!ahead && !delayed && settling) {
      // Look again shortly (a vanished waiter's key comes back at a place of its own).
      bool ignored = false;
      if (auto sig = waiter.sleep_until(std::min(BootClock::now() + milliseconds(100), *settle_until), -1, ignored))
        return refuse(NotAcquired::Reason::interrupted, *sig);
      continue;
    }
    if (!ahead && !delayed) {
      // First: the token must be above every one issued before (a key that came back to its place has
      // an older revision than the holders it now follows): put the key again when it is not.
      const std::uint64_t token = q.base + static_cast<std::uint64_t>(q.own.create_revision);
      if (const auto last = last_recorded_token(l, m_request.owner); token <= last) {
        // A run put by the queueing transaction's commit is this key's, which goes: take it back.
        if (run && run->owner == m_request.owner) {
          etcd::TxnRequest t;
          t.compare = {{m_keys.run, etcd::Compare::Target::mod_revision, l.run->mod_revision}};
          t.success = {etcd::remove_op(m_keys.run)};
          [[maybe_unused]] auto dropped = m_client.txn(t, BootClock::now() + timeout);
        }
        // A key put after every recorded holder's has a greater revision, unless the cluster's
        // revisions went back (a restore from a backup, etcd#17780): then no token is safe to issue.
        if (q.put_again) {
          log_unavailable({Error::Kind::protocol,
                           "the cluster's revision " + std::to_string(q.own.create_revision) +
                               " gives token " + std::to_string(token) + ", not above token " + std::to_string(last) +
                               " already issued for this lock: its revisions went back (a restore from a backup, "
                               "or etcd-io/etcd#17780); not running"});
          q.ticket = 0;
          return refuse(NotAcquired::Reason::unavailable);
        }
        q.put_again = true;
        requeue();
        continue;
      }
      if (token <= k_max_token) {
        Skipped skipped;
        auto begun = begin_run(q, token, skipped);
        if (!begun) {
          if (auto out = on_error(begun.error())) return *out;
          continue;  // confirms afresh, then reads the record again
        }
        if (*begun == Began::lost) {  // our key went (a break, the lease ran out): queue again
          requeue();
          continue;
        }
        if (*begun == Began::conflict) continue;  // another holder or run wrote first: read again
        if (*begun == Began::rule_mismatch) return refuse_rule(m_held_rule);
        if (*begun == Began::skipped || *begun == Began::record_lost) return skip(skipped);
        if (m_new_record) log_record_lost(m_request.lock, false);
      }
      // A lock-delay that ended by the vanished run's close is of no use any more.
      if (l.delay && l.delay->lease != 0)
        [[maybe_unused]] auto revoked = m_client.revoke(l.delay->lease, BootClock::now() + timeout);
      waited = since(began);
      return granted(q);
    }
    if (delayed && !l.delay) {
      if (auto ok = start_delay(q, *run); !ok) {
        if (auto out = on_error(ok.error())) return *out;
      }
      continue;  // reads the lock again: the delay now runs
    }

    // Busy (behind a key, or in the lock-delay of a vanished holder's run).
    const Deadline now = BootClock::now();
    if (wait_until && now >= *wait_until) {
      // A holder running this trigger's own run (--every: its slot's; --min-interval: one that
      // started less than the interval before it fired): a skip, not a conflict.
      if (run_of_other && m_request.rule().any() && m_fired_us)
        if (const auto start = parse_u64(run->start);
            start && run_counts_for(m_request.rule(), *start, run->fire_us, *m_fired_us))
          if (auto record = running_record(*run)) return skip(Skipped{*record, wall_us(), *m_fired_us, true});
      if (ahead) log_busy(ahead, q.base);
      else log_delay_busy(*run);
      return refuse(NotAcquired::Reason::busy);
    }
    if (!said_waiting) {
      said_waiting = true;
      log::event(log::Level::info, "waiting", "lock is busy, waiting", {{"lock", m_request.lock}});
    }
    // Watch what we wait for (the key ahead; or the delay and the vanished holder's run); wake for its
    // deletion, for our own keep-alive, or at the end of the wait. Whatever wakes us, the loop confirms
    // afresh.
    const Deadline keep_at = q.sent + m_request.timing.renew;
    Deadline wake = wait_until ? std::min(keep_at, *wait_until) : keep_at;
    UniqueFd woke(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    const int woke_fd = woke.get();
    const auto poke = [woke_fd](etcd::Watch::State) {
      std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(woke_fd, &one, sizeof one);
    };
    std::vector<std::string> watched = ahead ? std::vector<std::string>{ahead->key}
                                             : std::vector<std::string>{m_keys.delay, m_keys.run};
    std::vector<std::unique_ptr<etcd::Watch>> watches;
    bool failed_at_once = false;
    if (woke_fd >= 0) {
      try {
        for (const auto& key : watched)
          watches.push_back(std::make_unique<etcd::Watch>(m_client, key, l.revision + 1, timeout, poke));
      } catch (const std::exception&) {
        watches.clear();  // no thread: poll at the keep-alive times
      }
    }
    bool woken = false;
    auto sig = waiter.sleep_until(wake, watches.empty() ? -1 : woke_fd, woken);
    for (const auto& w : watches) failed_at_once = failed_at_once || w->state() == etcd::Watch::State::failed;
    for (const auto& w : watches) w->stop();
    if (sig) return refuse(NotAcquired::Reason::interrupted, *sig);
    if (failed_at_once) {
      // A stream that breaks at once (a member going away) must not spin: pause a little.
      bool ignored = false;
      if (auto s2 = waiter.sleep_until(std::min(BootClock::now() + milliseconds(100), wake), -1, ignored))
        return refuse(NotAcquired::Reason::interrupted, *s2);
    }
  }
}

// ---- Known etcd bugs (fencerun(1), ETCD): the lowest version of the members, asked of them at most
// once an hour per host (the answer is cached in $XDG_CACHE_HOME/fencerun/etcd-versions), and a
// warning naming each known lease or revision bug that version has.

struct KnownBug {
  int issue;
  const char* what;
  int fixed_in_34;  // the 3.4 release that fixed it (3.4.N)
  int fixed_in_35;  // the 3.5 release that fixed it (3.5.N)
};
constexpr KnownBug k_known_bugs[] = {
    {15247, "a leader that was stuck (slow disk, paused) revokes live leases when it comes back", 31, 13},
    {17780, "a revision can go backwards after a crash during compaction", 32, 14},
};

std::optional<std::array<int, 3>> parse_version(std::string_view v) {
  std::array<int, 3> out{};
  for (int i = 0; i < 3; ++i) {
    const auto end = std::min(v.find('.'), v.size());
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + end, out[i]);
    if (ec != std::errc{} || ptr == v.data()) return std::nullopt;
    v = end < v.size() ? v.substr(end + 1) : std::string_view{};
    if (v.empty() && i < 2) return std::nullopt;
  }
  return out;
}

bool has_bug(const std::array<int, 3>& v, const KnownBug& bug) {
  if (v[0] != 3) return v[0] < 3;
  if (v[1] < 4) return true;
  if (v[1] == 4) return v[2] < bug.fixed_in_34;
  if (v[1] == 5) return v[2] < bug.fixed_in_35;
  return false;
}

std::string version_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg == '/') return std::string(xdg) + "/fencerun/etcd-versions";
  const char* home = std::getenv("HOME");
  if (home && *home == '/') return std::string(home) + "/.cache/fencerun/etcd-versions";
  return {};
}

constexpr std::uint64_t k_version_cache_us = 3'600'000'000;  // an hour

void EtcdLease::check_version() {
  const std::uint64_t now = wall_us();
  std::string members;
  for (std::size_t i = 0; i < m_target.endpoint.members.size(); ++i)
    members += (i ? "," : "") + m_client.member_name(i);
  const std::string path = version_cache_path();
  std::vector<std::string> lines;
  std::string version;
  if (!path.empty()) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line) && lines.size() < 64;) {
      const auto w = words(line);
      if (w.size() != 3) continue;
      if (w[0] == members) {
        auto at = parse_u64(w[1]);
        if (at && *at <= now && now - *at < k_version_cache_us) version = std::string(w[2]);
        continue;  // written again below when asked again
      }
      lines.push_back(line);
    }
  }
  if (version.empty()) {
    // Every member's own version (a rolling upgrade mixes them): the lowest counts.
    std::optional<std::array<int, 3>> lowest;
    const milliseconds each = std::min(m_request.request_timeout, milliseconds(1000));
    for (std::size_t i = 0; i < m_target.endpoint.members.size(); ++i) {
      auto st = m_client.member_status(i, BootClock::now() + each);
      if (!st) continue;
      auto v = parse_version(st->version);
      if (v && (!lowest || *v < *lowest)) {
        lowest = v;
        version = st->version;
      }
    }
    if (version.empty()) return;  // nobody answered: the acquisition tells
    if (!path.empty()) {
      lines.push_back(members + " " + std::to_string(now) + " " + version);
      const auto dir = path.substr(0, path.rfind('/'));
      ::mkdir(dir.substr(0, dir.rfind('/')).c_str(), 0700);
      ::mkdir(dir.c_str(), 0700);
      const std::string tmp = path + "." + std::to_string(::getpid());
      {
        std::ofstream out(tmp, std::ios::trunc);
        for (const auto& l : lines) out << l << '\n';
      }
      if (std::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
    }
  }
  const auto v = parse_version(version);
  if (!v) return;
  std::string bugs;
  for (const auto& bug : k_known_bugs)
    if (has_bug(*v, bug))
      bugs += std::string(bugs.empty() ? "" : "; ") + "etcd-io/etcd#" + std::to_string(bug.issue) + ": " + bug.what;
  if (bugs.empty()) return;
  log::event(log::Level::warn, "etcd_known_bugs",
             "etcd " + version + " has known lease bugs (" + bugs +
                 "); fencerun's lock-delay keeps a revoked holder's job and the next one apart, but upgrade to "
                 "3.4.32, 3.5.14 or later",
             {{"lock", m_request.lock}, {"version", version}});
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
  const std::int64_t revision = m_state && m_state->run ? std::max(q.look.revision, m_state->run->mod_revision)
                                                         : q.look.revision;
  auto held = std::make_unique<EtcdHeldLease>(
      m_client, std::move(renewer), std::move(acquired), q.lease, q.key, q.own.create_revision, revision, m_records,
      m_started_us, m_request.rule().any() ? m_fired_us : std::nullopt, std::move(m_state), m_target, m_request,
      context);
  m_state.reset();
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

QueueValue parse_queue_value(std::string_view value) {
  QueueValue q;
  std::vector<std::string_view> w;
  for (std::string_view rest = value; !rest.empty();) {
    const auto sp = rest.find(' ');
    w.push_back(rest.substr(0, sp));
    rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
  }
  if (!w.empty()) q.owner = std::string(w[0]);
  if (w.size() > 1)
    if (auto pid = parse_u64(w[1])) q.pid = static_cast<long>(*pid);
  if (w.size() == 5) {
    q.host = std::string(w[2]);
    if (auto ttl = parse_u64(w[3])) q.ttl_ms = static_cast<std::int64_t>(*ttl);
    if (auto ticket = parse_u64(w[4]); ticket && *ticket <= k_max_token) q.ticket = static_cast<std::int64_t>(*ticket);
  } else if (w.size() > 2) {
    // "OWNER PID HOST" of an older version (a host name never has a space: fencerun replaces them).
    const auto host_at = value.find(' ', value.find(' ') + 1);
    q.host = std::string(value.substr(host_at + 1));
  }
  return q;
}

std::string queue_value(const QueueValue& v) {
  return v.owner + " " + (v.pid ? std::to_string(*v.pid) : "0") + " " + (v.host.empty() ? "-" : v.host) + " " +
         std::to_string(v.ttl_ms.value_or(0)) + " " + std::to_string(v.ticket);
}

std::int64_t etcd_queue_order(const etcd::KeyValue& kv) {
  const auto ticket = parse_queue_value(kv.value).ticket;
  return ticket > 0 ? ticket : kv.create_revision;
}

void etcd_sort_queue(std::vector<etcd::KeyValue>& queue) {
  std::ranges::stable_sort(queue, [](const etcd::KeyValue& a, const etcd::KeyValue& b) {
    const auto oa = etcd_queue_order(a), ob = etcd_queue_order(b);
    return oa != ob ? oa < ob : a.create_revision < b.create_revision;
  });
}

Holder etcd_holder_of(const etcd::KeyValue& kv, std::optional<std::uint64_t> base) {
  Holder h;
  const auto v = parse_queue_value(kv.value);
  h.owner = v.owner;
  h.pid = v.pid;
  h.host = v.host == "-" ? std::string() : v.host;
  if (base) h.token = *base + static_cast<std::uint64_t>(kv.create_revision);
  return h;
}

std::string EtcdKeys::key(std::int64_t lease) const { return prefix + lease_hex(lease); }

EtcdKeys etcd_keys_for(std::string_view key_prefix, std::string_view name) {
  const std::string tag = std::string(key_prefix) + "{" + std::string(name) + "}:";
  return {tag + "wait/", tag + "base", tag + "run", tag + "ok", tag + "runs", tag + "delay", tag + "rule",
          tag + "since"};
}

std::vector<std::string> etcd_run_records(std::string_view value, std::size_t count) {
  std::vector<std::string> out;
  while (!value.empty() && out.size() < count) {
    const auto nl = value.find('\n');
    if (nl != 0 && value[0] != '#') out.emplace_back(value.substr(0, nl));  // '#': the lease's stamp
    value = nl == std::string_view::npos ? std::string_view{} : value.substr(nl + 1);
  }
  return out;
}

std::unique_ptr<Lease> make_etcd_lease(EtcdLeaseTarget target, LeaseRequest request) {
  return std::make_unique<EtcdLease>(std::move(target), std::move(request));
}

}  // namespace fencerun::lease
