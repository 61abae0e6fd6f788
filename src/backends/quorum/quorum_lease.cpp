// Quorum mode. The lease and the fencing token on N = 3, 5 or 7 independent servers, majority M =
// N/2 + 1, f = N - M, all requests of a round sent at once (one worker per server, lease/fanout.hpp).
// docs/quorum.md states the failure model and derives exclusion and token order from it step by step;
// this is the short version, with the names used there.
//
// Epoch marker (PREFIX{NAME}:epoch on every server, created by the scripts when missing: the server's
// TIME in µs, "-", a random word; "G" in front once the write-back of a new lock marked it). It is
// lost with the server's data and created again, so its age says how long the server has kept NAME's
// data. A server COUNTS towards a majority when its marker is "G" or at least the quarantine Q old
// (QuorumOps::settled; Q = the quorum-wide lease cap + 2% + 10ms), or when every server answered, none
// has a counter and no marker counts yet (a new lock). Model: at most f servers lose their data
// within any Q.
//
// Lease (as Redlock computes it, counting only servers that count). Round 1 (quorum_acquire.lua) sets
// the lock (SET NX PX ttl, or PEXPIRE when it is ours); it is held when M servers that count set it,
// until t0 + ttl - drift (t0 the round's earliest send, drift = ttl/100 + 2ms). Renewal
// (quorum_renew.lua) extends it, and sets it again where it is missing and the server's marker is not
// the one this holder saw (the server lost NAME's data since); it counts when M servers that count
// renewed. Two owners' valid claims share a server s that both counted: the later found the earlier's
// key expired or released, or s lost its data after the earlier's script ran there, and then its
// marker was at least Q > ttl old when the later ran: either way the earlier claim had ended.
//
// Token. Round 1 also reads each server's counter and clock in the same atomic step. The token is
//     token = max(1 + the greatest counter reported, the (f+1)-th greatest clock of those that answered)
// issued only when M servers that count AND where this attempt set the lock reported a counter (the
// read set R), or when all N answered and none has a counter (then it is the median clock). Round 2
// (quorum_token.lua) writes it back, raise-only and owner-checked, to every server; the command starts
// once M confirmed (the write set W). R of a later acquisition shares a server s with W of an earlier
// one; on s the write came before the read (the read set the later owner's lock, so the earlier's was
// gone: its holding was over); if s kept its data its counter is >= the earlier token, and if it lost
// it, a counter there came from a later owner-checked write-back, whose token is greater by induction.
// So tokens strictly increase in the order the lock is held: never equal, never backwards.
// Not covered: a server restored from an older snapshot (a stale counter and an old marker).
//
// --every, --min-interval. Every server keeps NAME's record of runs and judges by its own clock: the
// trigger's fire time is carried per server (FireTimes), round 1 returns each server's records, and a
// run that holds a majority is skipped when any server's record makes it unnecessary (already_ran).
// The rule the triggers share is stored by the write-back and compared by round 1 where it exists.
#include "backends/quorum/quorum_lease.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <random>
#include <variant>

#include "backends/redis/embedded_scripts.hpp"
#include "backends/quorum/fanout.hpp"
#include "lease/keeper.hpp"
#include "backends/redis/lease_client.hpp"
#include "backends/redis/script_call.hpp"
#include "log/log.hpp"
#include "util/duration.hpp"
#include "util/error.hpp"
#include "util/random.hpp"

namespace fencerun::lease {
namespace {

using redis::Client;
using redis::Reply;
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
  std::string epoch;                      // NAME's epoch marker on this server
  bool created = false;                   // the marker was missing and this round created it
  std::optional<std::string> last_ok;     // with a rule: the last success's record on this server
  // With a rule (--every, --min-interval), on this server:
  std::optional<std::string> other_rule;  // the rule stored for NAME, when it is another one (nothing set)
  std::optional<std::uint64_t> fired_us;  // the trigger's fire time, on its clock
  std::vector<std::string> runs;          // --every: the runs kept, newest first
  std::string run;                        // the run in progress ("" none), when another holds the lock
};

redis::Result<Claim> parse_claim(const Reply& r) {
  const auto& e = r.elements;
  if (!r.is_array() || e.size() < 8) return std::unexpected(protocol_error("unexpected reply to the acquire script"));
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
  if (!e[6].is_string()) return std::unexpected(protocol_error("acquire script returned no epoch marker"));
  c.epoch = e[6].str;
  c.created = e[7].as_integer() == 1;
  if (e.size() >= 9 && e[8].is_string()) c.last_ok = e[8].str;
  if (e.size() >= 10 && e[9].is_string()) c.other_rule = e[9].str;
  if (e.size() >= 11 && e[10].is_string()) c.fired_us = to_number<std::uint64_t>(e[10].str);
  if (e.size() >= 12 && e[11].is_array())
    for (const auto& run : e[11].elements)
      if (run.is_string()) c.runs.push_back(run.str);
  if (e.size() >= 13 && e[12].is_string()) c.run = e[12].str;
  return c;
}

std::uint64_t time_us(const Reply& seconds, const Reply& micros) {
  auto s = seconds.as_integer(), u = micros.as_integer();
  return s && u && *s >= 0 && *u >= 0 ? static_cast<std::uint64_t>(*s) * 1'000'000 + static_cast<std::uint64_t>(*u) : 0;
}

// One server's answer to a renewal (quorum_renew.lua).
struct Renewal {
  RenewOutcome outcome = RenewOutcome::gone;
  bool set_again = false;
  std::string epoch;
  std::uint64_t time_us = 0;
};

// NAME's epoch marker on a server: the server's TIME in µs when it was created, "-" and a random word
// of the client that created it, "G" in front when
// it was created by the first use of NAME, with every server answering (quorum_token.lua). How long
// this server has kept NAME's data without a gap, on its own clock: nullopt for a "G" marker (since
// the lock began), else now - created (0 when the clock went back since).
std::optional<std::uint64_t> epoch_age_us(std::string_view epoch, std::uint64_t now_us) {
  if (epoch.starts_with("G")) return std::nullopt;
  auto created = to_number<std::uint64_t>(epoch.substr(0, epoch.find('-')));
  if (!created || *created > now_us) return 0;
  return now_us - *created;
}

std::string owner_of(std::string_view value) { return std::string(value.substr(0, value.find(' '))); }

// The trigger's fire time as the scripts take it, for one server (docs/quorum.md, "The trigger's fire
// time on each server"): that server's time at the first of the trigger's requests it answered (""
// before it answered one), and the microseconds since the trigger's first request on this host's boot
// clock, measured now, just before the request goes out (a server that has not answered yet takes its
// own time less that).
struct FireTimes {
  std::vector<std::optional<std::uint64_t>> by_server;
  Deadline first_request{};
  std::array<std::string, 2> args(std::size_t i) const {
    const auto since = std::chrono::duration_cast<std::chrono::microseconds>(BootClock::now() - first_request);
    const auto& known = by_server.at(i);
    return {known ? std::to_string(*known) : std::string(), std::to_string(std::max<long long>(since.count(), 0))};
  }
};

template <class T>
std::size_t count_if_ok(const Fanout::Replies<T>& replies, const std::function<bool(const T&)>& pred) {
  return static_cast<std::size_t>(
      std::ranges::count_if(replies, [&](const auto& r) { return r && r->has_value() && pred(**r); }));
}

// The first failure among `replies`, "server I: message", for the logs.
template <class T>
std::string first_failure(const std::vector<redis::Result<T>>& replies, const std::vector<std::string>& urls) {
  for (std::size_t i = 0; i < replies.size(); ++i)
    if (!replies[i]) return "server " + std::to_string(i + 1) + " (" + urls[i] + "): " + replies[i].error().message;
  return "no failure";
}

// The quorum's requests, each a round on every server at once.
class QuorumOps final : public Renewer {
 public:
  QuorumOps(const QuorumTarget& target, LockKeys keys)
      : m_fanout(target.servers),
        m_endpoints(target.servers),
        m_urls(target.redacted_urls),
        m_keys(std::move(keys)),
        m_epoch_key(m_keys.lock.substr(0, m_keys.lock.size() - 4) + "epoch"),
        m_quarantine_us(static_cast<std::uint64_t>((target.max_ttl + target.max_ttl / 50 + milliseconds(10)).count()) *
                        1000),
        m_seen(target.servers.size()) {
    m_fired.by_server.resize(target.servers.size());
  }

  // How long a server that lost NAME's data counts towards no majority (on its own clock): the
  // quorum-wide lease cap, +2% for clock rate drift, +10ms.
  std::uint64_t quarantine_us() const { return m_quarantine_us; }
  // Whether a server whose marker is `epoch` counts towards a majority at its time `now_us`.
  bool settled(std::string_view epoch, std::uint64_t now_us) const {
    auto age = epoch_age_us(epoch, now_us);
    return !age || *age >= m_quarantine_us;
  }
  // The epoch marker this holder last saw on each server ("" when none): the renewal sets the lock
  // again only where it changed (the server lost NAME's data since).
  void saw(std::size_t i, std::string epoch) { m_seen.at(i) = std::move(epoch); }

  std::size_t size() const { return m_fanout.size(); }
  std::size_t majority() const { return majority_of(size()); }
  const std::vector<std::string>& urls() const { return m_urls; }
  const std::vector<redis::RedisEndpoint>& endpoints() const { return m_endpoints; }
  // The record of runs (run_record.hpp): kept by the scripts of every round from now on.
  void keep_records(RecordArgs args) { m_records = std::move(args); }
  // With a rule (--every, --min-interval): whether the rounds carry the trigger's fire time.
  bool ruled() const { return m_records && !m_records->rule.empty(); }
  // The trigger's first request was sent at `t` (the first call counts).
  void trigger_sent(Deadline t) {
    if (!m_trigger_sent) {
      m_trigger_sent = true;
      m_fired.first_request = t;
    }
  }
  // The fire time on server i's clock, once it answered one of the trigger's requests.
  std::optional<std::uint64_t> fired_us(std::size_t i) const { return m_fired.by_server.at(i); }
  const std::optional<RecordArgs>& records() const { return m_records; }
  const LockKeys& keys() const { return m_keys; }

  // Every release publishes here on every server; waiters listen on one of them. (No queue in quorum
  // mode, so no waiter's own channel; "released" is no owner id, which is hex.)
  std::string released_channel() const { return m_keys.wake + "released"; }

  // Round 1. Ends early once it is decided: M servers set the lock and M report a counter (the rest
  // cannot change the token's guarantee, only raise it, and round 2 raises them anyway).
  std::vector<redis::Result<Claim>> claim(const std::string& value, milliseconds ttl, Deadline until) {
    const std::size_t m = majority();
    auto claims = m_fanout.round<Claim>(
        [lock = m_keys.lock, token = m_keys.token, epoch = m_epoch_key, value, owner = owner_of(value),
         ttl_ms = std::to_string(ttl.count()), until, records = record_args(), ruled = ruled(),
         fired = m_fired](Client& client, std::size_t i) -> redis::Result<Claim> {
          // Never sent after the round's end: a request sent late could land after the attempt was undone.
          if (BootClock::now() >= until) return std::unexpected(redis::Error{redis::Error::Kind::timeout, "no reply within the round"});
          std::string_view keys[] = {lock, token, epoch};
          const std::string word = random_hex(6);
          std::vector<std::string_view> args = {value, ttl_ms, owner, word};
          args.insert(args.end(), records.begin(), records.end());
          const auto fire = fired.args(i);
          if (ruled) args.insert(args.end(), fire.begin(), fire.end());
          Deadline sent{};
          auto reply = run_script(client, scripts::k_quorum_acquire, keys, args, until, sent);
          if (!reply) return std::unexpected(reply.error());
          return parse_claim(*reply);
        },
        until, [m, this](const Fanout::Replies<Claim>& r) {
          // Decided once M servers that count set the lock and know the counter (the rest can only
          // raise the token, and the write-back raises them anyway).
          return count_if_ok<Claim>(r, [this](const Claim& c) {
                   return c.set && c.counter && settled(c.epoch, c.time_us);
                 }) >= m;
        });
    for (std::size_t i = 0; i < claims.size(); ++i)
      if (claims[i]) learn_fired(i, claims[i]->fired_us);
    return claims;
  }

  // Round 2: the token written back where our lease is; true where it was. Ends once M confirmed.
  // `new_lock`: mark the epoch markers "G" (every server answered round 1 and created its marker).
  // With records kept, each server where it was written records the run in progress (with a rule:
  // and stores the rule); `started` and `fired` receive the start and the trigger's fire time (its
  // clock, microseconds; "" none) of the first server that confirmed.
  std::vector<redis::Result<bool>> write_back(const std::string& value, std::uint64_t token, bool new_lock, Deadline until,
                                       std::string& started, std::string& fired) {
    const std::size_t m = majority();
    struct Written {
      bool ours = false;
      std::string epoch;
      std::string started;
      std::optional<std::uint64_t> fired_us;
    };
    const Holder h = parse_holder(value);
    std::vector<std::string> records;
    if (m_records)
      records = {m_keys.runs_base, std::to_string(m_records->settings.ttl.count()),
                 h.pid ? std::to_string(*h.pid) : "-", h.host.empty() ? "-" : h.host, m_records->version};
    if (ruled()) records.push_back(m_records->rule);
    auto written = m_fanout.round<Written>(
        [lock = m_keys.lock, counter = m_keys.token, epoch = m_epoch_key, value, owner = owner_of(value),
         text = std::to_string(token), flag = std::string(new_lock ? "1" : "0"), until, records, ruled = ruled(),
         fired = m_fired](Client& client, std::size_t i) -> redis::Result<Written> {
          if (BootClock::now() >= until) return std::unexpected(redis::Error{redis::Error::Kind::timeout, "no reply within the round"});
          std::string_view keys[] = {lock, counter, epoch};
          std::vector<std::string_view> args = {owner, text, value, flag};
          args.insert(args.end(), records.begin(), records.end());
          const auto fire = fired.args(i);
          if (ruled) args.insert(args.end(), fire.begin(), fire.end());
          Deadline sent{};
          auto reply = run_script(client, scripts::k_quorum_token, keys, args, until, sent);
          if (!reply) return std::unexpected(reply.error());
          const auto& e = reply->elements;
          if (!reply->is_array() || e.size() < 2 || !e[0].as_integer())
            return std::unexpected(protocol_error("unexpected reply to the token script"));
          return Written{*e[0].as_integer() == 1, e[1].is_string() ? e[1].str : std::string(),
                         e.size() >= 3 && e[2].is_string() ? e[2].str : std::string(),
                         e.size() >= 4 && e[3].is_string() ? to_number<std::uint64_t>(e[3].str) : std::nullopt};
        },
        until, [m](const Fanout::Replies<Written>& r) {
          return count_if_ok<Written>(r, [](const Written& w) { return w.ours; }) >= m;
        });
    std::vector<redis::Result<bool>> out;
    for (std::size_t i = 0; i < written.size(); ++i) {
      if (!written[i]) {
        out.push_back(std::unexpected(written[i].error()));
        continue;
      }
      if (!written[i]->epoch.empty()) saw(i, written[i]->epoch);
      learn_fired(i, written[i]->fired_us);
      if (started.empty() && written[i]->ours) {
        started = written[i]->started;
        if (const auto f = fired_us(i)) fired = std::to_string(*f);
      }
      out.push_back(written[i]->ours);
    }
    return out;
  }

  // Owner-checked renewal on every server, setting the lock again where the server lost NAME's data
  // since this holder saw it (quorum_renew.lua): renewed once M servers that count renewed or set it
  // again; lost once M say gone or taken.
  Result<RenewOutcome> renew(std::string_view value, milliseconds ttl, Deadline deadline, Deadline& sent) override {
    return redis::to_lease(renew_once(value, ttl, deadline, sent));
  }
  redis::Result<RenewOutcome> renew_once(std::string_view value, milliseconds ttl, Deadline deadline, Deadline& sent) {
    const std::size_t m = majority();
    sent = BootClock::now();  // the earliest send time of the round
    const auto counts = [this](const Renewal& r) {
      return r.outcome == RenewOutcome::renewed && settled(r.epoch, r.time_us);
    };
    auto replies = m_fanout.round<Renewal>(
        [lock = m_keys.lock, epoch = m_epoch_key, owner = owner_of(value), full = std::string(value),
         ttl_ms = std::to_string(ttl.count()), deadline, seen = m_seen](Client& client, std::size_t i) -> redis::Result<Renewal> {
          if (BootClock::now() >= deadline) return std::unexpected(redis::Error{redis::Error::Kind::timeout, "no reply within the round"});
          std::string_view keys[] = {lock, epoch};
          const std::string word = random_hex(6);
          std::string_view args[] = {owner, ttl_ms, full, seen[i], word};
          Deadline s{};
          auto reply = run_script(client, scripts::k_quorum_renew, keys, args, deadline, s);
          if (!reply) return std::unexpected(reply.error());
          const auto& e = reply->elements;
          auto n = reply->is_array() && e.size() == 4 ? e[0].as_integer() : std::nullopt;
          if (!n || !e[1].is_string()) return std::unexpected(protocol_error("unexpected reply to the renew script"));
          Renewal out;
          out.outcome = *n >= 1 ? RenewOutcome::renewed : *n == 0 ? RenewOutcome::gone : RenewOutcome::stolen;
          out.set_again = *n == 2;
          out.epoch = e[1].str;
          out.time_us = time_us(e[2], e[3]);
          return out;
        },
        deadline, [m, counts](const Fanout::Replies<Renewal>& r) {
          return count_if_ok<Renewal>(r, counts) >= m ||
                 count_if_ok<Renewal>(r, [](const Renewal& x) { return x.outcome != RenewOutcome::renewed; }) >= m;
        });
    std::size_t renewed = 0, gone = 0, stolen = 0, set_again = 0;
    for (std::size_t i = 0; i < replies.size(); ++i) {
      const auto& r = replies[i];
      if (!r) continue;
      saw(i, r->epoch);
      renewed += counts(*r);
      set_again += r->set_again;
      gone += r->outcome == RenewOutcome::gone;
      stolen += r->outcome == RenewOutcome::stolen;
    }
    if (set_again > 0)
      log::event(log::Level::info, "lease_set_again",
                 "set the lease again on " + std::to_string(set_again) + " server(s) that lost it with their data",
                 {{"servers", std::to_string(size())}});
    if (renewed >= m) return RenewOutcome::renewed;
    if (gone + stolen >= m) return stolen > 0 ? RenewOutcome::stolen : RenewOutcome::gone;
    return std::unexpected(redis::Error{redis::Error::Kind::connection,
                                 "renewed on " + std::to_string(renewed) + " of " + std::to_string(size()) +
                                     " servers that count (a majority is " + std::to_string(m) + "); " +
                                     first_failure(replies, m_urls)});
  }

  struct ReleaseTally {
    std::size_t deleted = 0;    // our lease was there and is gone
    std::size_t not_ours = 0;   // it was not there (expired, deleted, or taken) on a server that kept its data,
                                // or on one that answered none of our rounds
    std::size_t data_lost = 0;  // it was not there, and the server lost NAME's data since we saw it
  };
  // Owner-checked compare-and-delete on every server. Ends once M deleted. With `wake`, each server
  // that deleted tells the waiters listening there. The undoing of a failed attempt does not: a waiter
  // that set the lock on a minority and undid it would wake the others, who would do the same, for as
  // long as the lock is held.
  // `unmark`: by server, the epoch marker the failed attempt created there ("" none), taken back
  // (quorum_unmark.lua).
  // `record`: the run's record, as release.lua takes it from ARGV 4 on (each server writes it in the
  // same step as its compare-and-delete); empty: none (an attempt undone).
  // `drop_run`: also delete this owner's run in progress (an attempt undone after its token write-back
  // recorded it on some servers), owner-checked.
  ReleaseTally release(const std::string& owner, Deadline until, bool wake, std::vector<std::string> unmark = {},
                       std::vector<std::string> record = {}, bool drop_run = false) {
    const std::size_t m = majority();
    enum class Outcome { deleted, not_ours, data_lost };
    auto replies = m_fanout.round<Outcome>(
        [keys = m_keys, owner, until, wake, channel = released_channel(), unmark, epoch = m_epoch_key,
         seen = m_seen, record, drop_run, ruled = ruled(), fired = m_fired](Client& client, std::size_t i) -> redis::Result<Outcome> {
          // The record's fire time on this server's clock (release.lua's ARGV 17 and 18).
          std::vector<std::string> mine = record;
          if (ruled && !mine.empty()) {
            const auto fire = fired.args(i);
            mine.resize(15);
            mine[13] = fire[0];
            mine[14] = fire[1];
          }
          auto deleted = mine.empty() ? release_holder(client, keys, 1, owner, until)
                                      : release_recording(client, keys.lock, owner, mine, until);
          if (drop_run) {
            // release.lua with the run's key alone: deleted only if it holds this owner's run.
            const std::string run = keys.run();
            std::string_view k[] = {run};
            std::string_view a[] = {owner};
            Deadline sent{};
            [[maybe_unused]] auto dropped = run_script(client, scripts::k_release, k, a, until, sent);
          }
          if (i < unmark.size() && !unmark[i].empty()) {
            std::string_view k[] = {epoch};
            std::string_view a[] = {unmark[i]};
            Deadline sent{};
            [[maybe_unused]] auto taken = run_script(client, scripts::k_quorum_unmark, k, a, until, sent);
          }
          if (!deleted) return std::unexpected(deleted.error());
          // Best effort: the waiters also poll.
          if (wake && *deleted)
            [[maybe_unused]] auto woken = client.command({"PUBLISH", channel, "released"}, until);
          if (*deleted) return Outcome::deleted;
          // Never seen (it answered none of this holder's rounds in time, e.g. a round that ended once
          // a majority answered): it was in none of the majorities the lease was counted on, and it
          // does not hold the key now.
          if (seen[i].empty()) return Outcome::not_ours;
          auto now = client.command({"GET", epoch}, until);
          if (!now) return std::unexpected(now.error());
          // The same marker, or the same one marked "G" since (a new lock's write-back that reached
          // this server after the holder stopped listening): the server kept its data.
          const bool kept = now->is_string() && (now->str == seen[i] || now->str == "G" + seen[i]);
          return kept ? Outcome::not_ours : Outcome::data_lost;
        },
        until, [m](const Fanout::Replies<Outcome>& r) {
          return count_if_ok<Outcome>(r, [](Outcome o) { return o == Outcome::deleted; }) >= m;
        });
    ReleaseTally out;
    for (const auto& r : replies)
      if (r) ++(*r == Outcome::deleted ? out.deleted : *r == Outcome::not_ours ? out.not_ours : out.data_lost);
    return out;
  }

 private:
  Fanout m_fanout;
  std::vector<redis::RedisEndpoint> m_endpoints;
  std::vector<std::string> m_urls;
  LockKeys m_keys;
  std::string m_epoch_key;
  std::uint64_t m_quarantine_us;
  std::vector<std::string> m_seen;
  std::optional<RecordArgs> m_records;
  FireTimes m_fired;
  bool m_trigger_sent = false;

  // A server's fire time, from its first reply that tells it (later ones repeat it).
  void learn_fired(std::size_t i, std::optional<std::uint64_t> us) {
    if (us && !m_fired.by_server.at(i)) m_fired.by_server.at(i) = us;
  }
  // Round 1's record arguments (quorum_acquire.lua's ARGV 5..8, with a rule 9..10; the fire time, 11..12,
  // is each server's own), none when no record is kept.
  std::vector<std::string> record_args() const {
    if (!m_records) return {};
    std::vector<std::string> a = {m_keys.runs_base, std::to_string(m_records->min_interval_ms),
                                  std::to_string(m_records->settings.ttl.count()), std::to_string(m_records->settings.keep)};
    if (ruled()) a.insert(a.end(), {m_records->rule, m_records->every_ms > 0 ? "1" : "0"});
    return a;
  }
  // The release script on one server with the run's record (owner id compared; no wait queue here).
  static redis::Result<bool> release_recording(Client& client, const std::string& lock, const std::string& owner,
                                        const std::vector<std::string>& record, Deadline until) {
    std::string_view keys[] = {lock};
    std::vector<std::string_view> args = {owner, "", "0"};
    args.insert(args.end(), record.begin(), record.end());
    Deadline sent{};
    auto reply = run_script(client, scripts::k_release, keys, args, until, sent, redis::Resend::idempotent);
    if (!reply) return std::unexpected(reply.error());
    auto n = reply->as_integer();
    if (!n) return std::unexpected(protocol_error("unexpected reply to the release script"));
    return *n == 1;
  }
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
  std::optional<std::uint64_t> started_us() const override {
    const auto& t = m_acquired.started_us;
    return t.empty() ? std::nullopt : to_number<std::uint64_t>(t);
  }
  JobFacts job_facts() const override {
    std::string urls;
    for (const auto& u : m_ops.urls()) urls += (urls.empty() ? "" : " ") + u;
    JobFacts f{m_acquired.token, m_request.lock, m_request.owner, m_request.timing.ttl.count(), 0, 1,
               "FENCERUN_REDIS_URL", urls, {{"FENCERUN_SERVERS", std::to_string(m_ops.size())}}, std::nullopt};
    // The slot of the fire time on the clock of the server whose start the run reports.
    if (m_request.every)
      if (const auto fired = to_number<std::uint64_t>(m_acquired.fired_us))
        f.slot_start_us = slot_start_us(slot_index(*fired, *m_request.every), *m_request.every);
    return f;
  }

  // Released when a majority deleted it; not ours when a majority answered and fewer deleted it.
  Released release() override {
    stop_keeping();
    m_released = true;
    const auto r = m_ops.release(m_request.owner, BootClock::now() + m_request.request_timeout, /*wake=*/true, {},
                                 record());
    const std::size_t m = m_ops.majority();
    // A server that lost NAME's data since this holder saw it says nothing about the lease: it was
    // held on the others (the keeper stops the job before the lease's deadline in any case).
    if (r.deleted >= m || (r.deleted > 0 && r.not_ours == 0 && r.deleted + r.data_lost >= m)) {
      log::event(log::Level::info, "released", "released lock", m_context);
      return Released::yes;
    }
    // Lost only when the answers rule a majority out: more than f servers that kept their data do not
    // hold it (expired, broken, taken, or never set there). A server that did not answer may have held
    // it to the end, as may one that lost its data since: "not ours" on some servers while others are
    // silent is no evidence that the lease was lost (a server this run never set, and one down at the
    // release, are not two servers that lost it).
    if (r.not_ours > m_ops.size() - m) return Released::not_ours;
    log::event(log::Level::warn, "release_failed",
               "could not release the lock on a majority of the servers (it expires by itself): deleted on " +
                   std::to_string(r.deleted) + ", answered by " + std::to_string(r.deleted + r.not_ours + r.data_lost) +
                   " of " +
                   std::to_string(m_ops.size()),
               m_context);
    return Released::failed;
  }

 private:
  // The run's record for the release (release.lua's ARGV 4..16): no start, each server uses its own.
  std::vector<std::string> record() const {
    const auto& records = m_ops.records();
    if (!records || !m_outcome || m_acquired.started_us.empty()) return {};
    const auto duration = std::chrono::duration_cast<std::chrono::microseconds>(BootClock::now() - m_acquired.sent);
    auto args = record_release_args(m_ops.keys(), *records, *m_outcome, "", m_acquired.token, m_acquired.value);
    args[11] = std::to_string(duration.count());
    return args;
  }

  QuorumOps& m_ops;
  bool m_released = false;
};

// What one acquisition attempt came to.
struct HeldElsewhere {
  Holder holder;
  std::optional<milliseconds> remaining;  // the shortest of the holders' leases
  // With a rule: the holder is running the run this trigger is for (a skip when the wait ends).
  std::optional<Skipped> running_this_run;
};
struct Unavailable {
  std::string why;
};
// Skipped (--every, --min-interval): a server's record makes the run unnecessary, judged on that
// server's clock; nothing is held. RuleMismatch: a server stores another rule for NAME.
using Attempt = std::variant<Acquired, HeldElsewhere, Unavailable, Skipped, RuleMismatch>;

class QuorumLease final : public Lease {
 public:
  QuorumLease(QuorumTarget target, LeaseRequest request)
      : m_request(std::move(request)), m_ops(target, keys_for(target.key_prefix, m_request.lock)) {
    m_ops.keep_records({m_request.records, m_request.min_interval ? m_request.min_interval->count() : 0,
                        m_request.version, m_request.every ? m_request.every->period.count() : 0,
                        m_request.every ? m_request.every->offset.count() : 0,
                        schedule_rule(m_request.every, m_request.min_interval, m_request.records.ttl),
                        false});  // --if-record-lost skip: refused in quorum mode (registry.cpp)
  }

  std::expected<std::unique_ptr<HeldLease>, NotAcquired> acquire(Waiter& waiter, milliseconds& waited) override;

 private:
  Attempt attempt();
  // Listens for releases on the first server, from `first` on, that takes the subscription; nullopt
  // when none does (then the waiter only polls).
  std::optional<redis::Client> subscribe(std::size_t first);
  // --every, --min-interval, with the lock held on a majority: the record that makes this run
  // unnecessary, judged by each server that answered on its own clock; nullopt: it runs.
  std::optional<Skipped> already_ran(const std::vector<redis::Result<Claim>>& claims) const;
  // A busy answer's run in progress (`c`, a server where another holds the lock) that is the run this
  // trigger is for, judged on that server's clock.
  std::optional<Skipped> running_this_run(const Claim& c) const;
  // Round 2 for a lock held on a majority since `sent`.
  Attempt token_for(const std::vector<redis::Result<Claim>>& claims, Deadline sent, bool new_lock);
  // Undoes a failed attempt on every server (owner-checked). Kept short: an unresponsive server will
  // not answer this either, and the lock expires anyway.
  void undo() {
    auto cleanup = std::min<milliseconds>(m_request.request_timeout / 4, milliseconds(200));
    m_ops.release(m_request.owner, BootClock::now() + cleanup, /*wake=*/false, m_created, {},
                  m_wrote_back && m_ops.records().has_value());
  }
  std::string servers_text() const {
    return std::to_string(m_ops.size()) + " servers (a majority is " + std::to_string(m_ops.majority()) + ")";
  }
  log::Field servers_field() const { return {"servers", std::to_string(m_ops.size())}; }

  LeaseRequest m_request;
  QuorumOps m_ops;
  std::vector<std::string> m_created;  // by server, the epoch marker this attempt created ("" none)
  bool m_wrote_back = false;           // this attempt sent its token write-back (round 2)
};

Attempt QuorumLease::attempt() {
  const LeaseSchedule schedule(m_request.timing);
  const Deadline sent = BootClock::now();
  const Deadline deadline = schedule.deadline_after(sent);
  // A reply after the stop point is of no use: the command could not start.
  const Deadline bound = std::min(sent + m_request.request_timeout, schedule.stop_at(deadline));
  const std::string value =
      m_request.owner + " 0 " + std::to_string(m_request.pid) + " " + m_request.host;
  m_wrote_back = false;
  m_ops.trigger_sent(sent);
  const auto claims = m_ops.claim(value, m_request.timing.ttl, bound);
  const std::size_t n = m_ops.size(), m = m_ops.majority();
  // Markers this attempt created are taken back if it fails, but only while NAME still looks new (no
  // server that answered had one): a server that lost NAME's data while another kept it must keep the
  // marker, whose age is its quarantine.
  m_created.assign(n, std::string());
  if (std::ranges::all_of(claims, [](const redis::Result<Claim>& c) { return !c || c->created; }))
    for (std::size_t i = 0; i < n; ++i)
      if (claims[i]) m_created[i] = claims[i]->epoch;

  // Two -r that reach the same data (one server under two addresses) see the same epoch marker: the
  // first request created it, the second read it.
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j)
      if (claims[i] && claims[j] && claims[i]->epoch == claims[j]->epoch) {
        undo();
        throw UsageError("--redis: servers " + std::to_string(i + 1) + " (" + m_ops.urls()[i] + ") and " +
                         std::to_string(j + 1) + " (" + m_ops.urls()[j] +
                         ") are the same server (they hold the same data); quorum mode needs independent servers");
      }

  // Triggers of one lock share one rule: a server that stores another one set nothing and refuses. A
  // server without a stored rule (a new lock, or restarted without its data) has nothing to compare.
  for (const auto& c : claims)
    if (c && c->other_rule) {
      undo();
      return RuleMismatch{*c->other_rule};
    }

  // A new lock: every server answered, none has a token counter, and no marker counts (none is "G" or
  // at least Q old): no server has kept any of NAME's data that a holder ever relied on. Then every
  // server counts at once; otherwise a server counts once its marker is older than the quarantine (it
  // lost NAME's data at least one lease cap ago) or marks the lock's beginning. Markers that other
  // contenders created an instant ago (two first runs at once), or that a first run killed before its
  // write-back left, do not make a new lock look restarted. Within the model this state cannot follow
  // a holder's start: its write-back put counters on M servers, and at most f of them lose their data
  // within Q, so M - f >= 1 counters remain.
  const bool new_lock = std::ranges::all_of(claims, [&](const redis::Result<Claim>& c) {
    return c && !c->counter && !m_ops.settled(c->epoch, c->time_us);
  });
  const auto counts = [&](const redis::Result<Claim>& c) {
    return c && (new_lock || m_ops.settled(c->epoch, c->time_us));
  };
  std::size_t set = 0, answered = 0, counted = 0;
  HeldElsewhere busy;
  bool maybe_set = false;
  for (const auto& c : claims) {
    if (!c) {
      maybe_set = maybe_set || c.error().maybe_executed || c.error().kind == redis::Error::Kind::protocol;
      continue;
    }
    ++answered;
    counted += counts(c);
    if (c->set) {
      set += counts(c);
      maybe_set = true;
      continue;
    }
    if (c->remaining && (!busy.remaining || *c->remaining < *busy.remaining)) {
      busy.remaining = c->remaining;
      busy.holder = c->holder;
    }
    if (busy.holder.owner.empty()) busy.holder = c->holder;
    if (!busy.running_this_run) busy.running_this_run = running_this_run(*c);
  }
  if (set < m) {
    if (maybe_set) undo();
    if (answered < m)
      return Unavailable{"only " + std::to_string(answered) + " of " + std::to_string(n) + " servers answered; " +
                         first_failure(claims, m_ops.urls())};
    if (counted < m && std::ranges::all_of(claims, [](const redis::Result<Claim>& c) { return !c || c->created; })) {
      std::string silent;
      for (std::size_t i = 0; i < n; ++i)
        if (!claims[i]) silent += (silent.empty() ? "" : ", ") + std::to_string(i + 1);
      return Unavailable{"no server that answered knows the token counter and server " + silent +
                         " did not answer: a new lock cannot be told from lost counters until every server answers; " +
                         first_failure(claims, m_ops.urls())};
    }
    if (counted < m) {
      std::string why = "only " + std::to_string(counted) + " of " + std::to_string(n) + " servers count towards a majority";
      for (std::size_t i = 0; i < n; ++i)
        if (claims[i] && !counts(claims[i])) {
          const auto age = epoch_age_us(claims[i]->epoch, claims[i]->time_us).value_or(0);
          const auto left_ms = (m_ops.quarantine_us() - std::min(age, m_ops.quarantine_us())) / 1000;
          why += "; server " + std::to_string(i + 1) + " (" + m_ops.urls()[i] + ") lost the data of '" +
                 m_request.lock + "' " + (claims[i]->created ? std::string("(restarted without it, or never had it)")
                                                            : std::to_string(age / 1000) + "ms ago") +
                 " and counts again in " + std::to_string(left_ms) + "ms (the quorum's lease cap)";
        }
      if (answered < n) why += "; " + first_failure(claims, m_ops.urls());
      return Unavailable{why};
    }
    return busy;
  }
  if (BootClock::now() >= schedule.stop_at(deadline)) {
    undo();
    return Unavailable{"the majority's replies came too late: the lease would have run short before the command "
                       "started"};
  }
  if (auto skipped = already_ran(claims)) {
    undo();
    return *skipped;
  }
  return token_for(claims, sent, new_lock);
}

// With the lock held on a majority S, each server that answered judges by its own record and its own
// clock, the trigger's fire time there: a record on any of them that makes the run unnecessary skips
// it. A success recorded at its release on a set D shares a server with S that kept it (docs/quorum.md,
// "--min-interval, --every and the record of runs"). --min-interval looks at the newest success by
// token only: a server that missed it holds an older one, which says nothing about the newest.
std::optional<Skipped> QuorumLease::already_ran(const std::vector<redis::Result<Claim>>& claims) const {
  const ScheduleRule rule = m_request.rule();
  if (!rule.any()) return std::nullopt;
  std::optional<std::uint64_t> newest;
  if (!rule.every)
    for (const auto& c : claims)
      if (c && c->last_ok)
        if (auto r = parse_run_record(*c->last_ok); r && r->token && (!newest || *r->token > *newest)) newest = r->token;
  for (const auto& c : claims) {
    if (!c || !c->last_ok || !c->fired_us) continue;
    if (!rule.every) {
      const auto r = parse_run_record(*c->last_ok);
      if (!r || r->token != newest) continue;
    }
    if (auto done = already_done(rule, *c->fired_us, c->last_ok, c->runs)) return Skipped{*done, c->time_us, *c->fired_us, false};
  }
  return std::nullopt;
}

std::optional<Skipped> QuorumLease::running_this_run(const Claim& c) const {
  if (!m_request.rule().any() || c.run.empty() || !c.fired_us) return std::nullopt;
  std::string owner;
  const auto r = parse_run_in_progress(c.run, &owner);
  // Only the holder's own run on this server: it is what the trigger waits for.
  if (!r || owner != c.holder.owner) return std::nullopt;
  if (!run_counts_for(m_request.rule(), r->start_us, r->fire_us, *c.fired_us)) return std::nullopt;
  return Skipped{run_record_line(*r), c.time_us, *c.fired_us, true};
}

Attempt QuorumLease::token_for(const std::vector<redis::Result<Claim>>& claims, Deadline sent, bool new_lock) {
  const std::size_t n = m_ops.size(), m = m_ops.majority(), f = n - m;
  std::size_t answered = 0, read = 0, any_counter = 0;
  std::uint64_t max_counter = 0;
  std::vector<std::uint64_t> clocks;
  for (const auto& c : claims) {
    if (!c) continue;
    ++answered;
    clocks.push_back(c->time_us);
    if (c->counter) {
      ++any_counter;
      max_counter = std::max(max_counter, *c->counter);
      // Counted only where this attempt set the lock in the same atomic step, on a server that counts:
      // no other owner could write there between (its write-back is owner-checked).
      read += c->set && (new_lock || m_ops.settled(c->epoch, c->time_us));
    }
  }
  // The clock floor: the (f+1)-th greatest clock of those that answered (the median when all N
  // did), so that no f servers whose clocks are wrong can set it.
  std::ranges::sort(clocks, std::greater<>());
  const std::uint64_t floor = clocks.at(std::min(f, clocks.size() - 1));
  const bool no_counter = any_counter == 0 && answered == n;
  if (read < m && !no_counter) {
    undo();
    std::string missing;
    for (std::size_t i = 0; i < claims.size(); ++i)
      if (claims[i] && !claims[i]->counter) missing += (missing.empty() ? "" : ", ") + std::to_string(i + 1);
    if (any_counter == 0) {
      // No counter among a majority is not enough to call NAME new: one server that lost its data and
      // one that never had the counter (down since NAME was first used) look the same, and the server
      // that holds the last counter may be the one that did not answer. Only all N can tell.
      std::string silent;
      for (std::size_t i = 0; i < claims.size(); ++i)
        if (!claims[i]) silent += (silent.empty() ? "" : ", ") + std::to_string(i + 1);
      return Unavailable{"no server that answered knows the token counter and server " + silent +
                         " did not answer: a new lock cannot be told from lost counters until every server answers "
                         "(or raise the counters of the servers that answered: fencerun -r URL bump " +
                         m_request.lock + " --above TOKEN)"};
    }
    return Unavailable{"only " + std::to_string(read) + " of the servers where this run set the lock know the token "
                       "counter (a majority of all " + std::to_string(n) + " must, or none): no token is issued that "
                       "might not be greater than the last; without a counter: server " +
                       (missing.empty() ? std::string("none") : missing) +
                       " (restarted without its data, or never used for this lock); raise its counter above the last "
                       "token issued, at least " + std::to_string(max_counter) + ": fencerun -r URL bump " +
                       m_request.lock + " --above TOKEN"};
  }
  if (no_counter)
    log::event(log::Level::info, "no_counter",
               "no server of the quorum has a token counter for '" + m_request.lock +
                   "' (every server answered): the first token is the servers' median clock. Nothing to do for a "
                   "new lock; if '" + m_request.lock + "' was used before with these servers, every server lost its "
                   "data, and the token is ordered after the earlier ones only under the clock assumption of "
                   "docs/quorum.md",
               {{"lock", m_request.lock}, servers_field()});
  const std::uint64_t token = std::max(max_counter + 1, floor);
  if (token >= k_token_limit) {
    undo();
    return Unavailable{"the token would pass 2^53"};
  }
  const std::string final_value = m_request.owner + " " + std::to_string(token) + " " + std::to_string(m_request.pid) +
                                  " " + m_request.host;
  const LeaseSchedule schedule(m_request.timing);
  const Deadline bound =
      std::min(BootClock::now() + m_request.request_timeout, schedule.stop_at(schedule.deadline_after(sent)));
  for (std::size_t i = 0; i < claims.size(); ++i) m_ops.saw(i, claims[i] ? claims[i]->epoch : std::string());
  std::string started, fired;
  m_wrote_back = true;
  const auto written = m_ops.write_back(final_value, token, new_lock, bound, started, fired);
  const auto confirmed =
      static_cast<std::size_t>(std::ranges::count_if(written, [](const redis::Result<bool>& w) { return w && *w; }));
  if (confirmed < m) {
    undo();
    return Unavailable{"the token write-back was confirmed by " + std::to_string(confirmed) + " of " +
                       std::to_string(m_ops.size()) + " servers; " + first_failure(written, m_ops.urls())};
  }
  Acquired acquired;
  acquired.token = token;
  acquired.value = final_value;
  acquired.sent = sent;
  acquired.started_us = started;
  acquired.fired_us = fired;
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
  const auto skip = [&](const Skipped& skipped) {
    log_skipped(m_request.lock, m_request.rule(), skipped.last_success, skipped.now_us, skipped.fired_us,
                skipped.in_progress);
    waited = since(began);
    const auto last = parse_run_record(skipped.last_success);
    return std::unexpected(NotAcquired{NotAcquired::Reason::skipped, 0, 0, last ? last->start_us : 0});
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
    if (const auto* skipped = std::get_if<Skipped>(&result)) return skip(*skipped);
    if (const auto* other = std::get_if<RuleMismatch>(&result)) {
      log_rule_mismatch(m_request.lock, other->rule,
                        schedule_rule(m_request.every, m_request.min_interval, m_request.records.ttl));
      waited = since(began);
      NotAcquired why{NotAcquired::Reason::rule_mismatch};
      why.held_rule = other->rule;
      return std::unexpected(why);
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
      if (!waiting && busy.running_this_run) return skip(*busy.running_this_run);
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
