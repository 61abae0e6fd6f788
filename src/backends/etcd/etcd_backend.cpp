#include "backends/etcd/etcd_backend.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <map>

#include "backends/etcd/client.hpp"
#include "backends/etcd/etcd_lease.hpp"
#include "lease/lock_view.hpp"
#include "log/log.hpp"
#include "util/exit_code.hpp"

namespace fencerun::lease {
namespace {

using etcd::Client;
using etcd::KeyValue;
using std::chrono::milliseconds;

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// One lock's keys as read: its holders' and waiters' keys (by create_revision), its base, and the record
// of its runs (the newest record, the last success's and the rule its triggers share).
struct LockKeys {
  std::vector<KeyValue> queue;
  std::optional<std::uint64_t> base;
  std::optional<std::string> last_run, last_success, rule;
};

// The newest record of a `runs` value.
std::optional<std::string> newest_record(const std::string& runs) {
  auto records = etcd_run_records(runs, 1);
  if (records.empty()) return std::nullopt;
  return records.front();
}

// Records carry this host's clock (etcd has none a client can read): their ages are told by it too.
std::uint64_t wall_us() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

class EtcdBackend final : public Backend, public LockAdmin {
 public:
  explicit EtcdBackend(const EtcdPlace& target) : m_target(target), m_client(target.endpoint) {}

  LockAdmin* admin() override { return this; }

  std::unique_ptr<Lease> lease(LeaseRequest request) const override {
    return make_etcd_lease({m_target.endpoint, m_target.redacted_url, m_target.key_prefix}, std::move(request));
  }

  int status(const std::string& lock, bool json) const override {
    auto s = const_cast<EtcdBackend*>(this)->holders(lock);
    if (!s) {
      unavailable(s.error(), lock);
      return exit_code::k_unavailable;
    }
    print(json ? status_json(lock, *s) : status_text(lock, *s));
    return s->holders.empty() ? exit_code::k_status_free : 0;
  }

  int list(const ListRequest& request) const override {
    auto& client = const_cast<Client&>(m_client);
    // Every key under the prefix, a page at a time, grouped by lock NAME. A NAME is a lock by its base
    // or its queue; its record of runs alone (keys that outlive neither) does not make one.
    std::map<std::string, LockKeys> locks;
    std::map<std::string, LockKeys> records;
    const std::string& prefix = m_target.key_prefix;
    const std::string end = etcd::prefix_end(prefix);
    std::string from = prefix;
    Progress progress;
    std::size_t seen = 0;
    for (;;) {
      auto page = client.range({from, end, etcd::Sort::none, 1000, 0}, BootClock::now() + m_target.timeout);
      if (!page) {
        unavailable(page.error());
        return exit_code::k_unavailable;
      }
      for (const auto& kv : page->kvs) {
        std::string_view k = kv.key;
        k.remove_prefix(prefix.size());
        if (!k.starts_with('{')) continue;
        const auto close = k.find("}:");
        if (close == std::string_view::npos) continue;
        const std::string name(k.substr(1, close - 1));
        const std::string_view rest = k.substr(close + 2);
        if (fnmatch(request.pattern.c_str(), name.c_str(), 0) != 0) continue;
        if (rest == "base") locks[name].base = parse_u64(kv.value);
        else if (rest.starts_with("wait/")) locks[name].queue.push_back(kv);
        else if (rest == "runs") records[name].last_run = newest_record(kv.value);
        else if (rest == "ok") records[name].last_success = kv.value;
      }
      seen += page->kvs.size();
      progress.update(seen, locks.size());
      if (page->kvs.size() < 1000) break;
      from = page->kvs.back().key + std::string(1, '\0');
    }
    for (auto& [name, keys] : locks) etcd_sort_queue(keys.queue);
    for (auto& [name, r] : records) {
      auto it = locks.find(name);
      if (it == locks.end()) continue;
      it->second.last_run = std::move(r.last_run);
      it->second.last_success = std::move(r.last_success);
    }
    bool any_held = false;
    std::vector<std::string> entries;
    for (auto& [name, keys] : locks) {
      auto s = view(keys);
      if (!s) {
        unavailable(s.error(), name);
        return exit_code::k_unavailable;
      }
      const bool held = !s->holders.empty();
      any_held = any_held || held;
      if (!held && !request.all) continue;
      entries.push_back(request.json ? list_json_fields(name, *s) + "}" : list_text(name, *s));
    }
    progress.finish();
    print(joined(entries, request.json));
    return any_held ? 0 : exit_code::k_status_free;
  }

  int server_version() const override {
    auto& client = const_cast<Client&>(m_client);
    const auto& ep = m_target.endpoint;
    bool all = true;
    std::string lines;
    std::optional<std::uint64_t> leader;
    std::map<std::uint64_t, std::string> names;
    std::vector<std::optional<etcd::MemberStatus>> statuses;
    for (std::size_t i = 0; i < ep.members.size(); ++i) {
      auto st = client.member_status(i, BootClock::now() + m_target.timeout);
      if (!st) {
        all = false;
        log::event(log::Level::error, "etcd_unavailable",
                   "cannot use etcd member " + client.member_name(i) + ": " + st.error().message);
        statuses.emplace_back();
        continue;
      }
      names[st->member_id] = client.member_name(i);
      if (st->leader) leader = st->leader;
      statuses.push_back(*st);
    }
    for (std::size_t i = 0; i < ep.members.size(); ++i) {
      if (!statuses[i]) {
        lines += "member " + client.member_name(i) + ": unavailable\n";
        continue;
      }
      const auto& st = *statuses[i];
      lines += "member " + client.member_name(i) + ": etcd " + st.version +
               (st.leader == st.member_id ? ", leader" : st.leader ? ", follower" : ", no leader") + "\n";
    }
    std::string version;
    for (const auto& st : statuses)
      if (st) version = st->version;
    std::string head = "cluster: etcd " + (version.empty() ? std::string("unknown") : version) + " at " +
                       m_target.redacted_url;
    if (leader && names.contains(*leader)) head += " (leader " + names[*leader] + ")";
    print(head + "\n" + lines);
    return all ? 0 : exit_code::k_unavailable;
  }

  Result<LockStatus> holders(const std::string& lock) override {
    const auto keys = etcd_keys_for(m_target.key_prefix, lock);
    const Deadline deadline = BootClock::now() + m_target.timeout;
    auto queue = m_client.range({keys.prefix, etcd::prefix_end(keys.prefix), etcd::Sort::create_ascending, 0, 0},
                                deadline);
    if (!queue) return std::unexpected(queue.error());
    // The base and the record with its rule, read at one revision.
    etcd::TxnRequest t;
    t.success = {etcd::range_op(etcd::single(keys.base)), etcd::range_op(etcd::single(keys.runs)),
                 etcd::range_op(etcd::single(keys.ok)), etcd::range_op(etcd::single(keys.rule))};
    auto rest = m_client.txn(t, deadline);
    if (!rest) return std::unexpected(rest.error());
    auto value = [&](std::size_t i) -> std::optional<std::string> {
      const auto& r = rest->ranges.at(i);
      if (!r || r->kvs.empty()) return std::nullopt;
      return r->kvs.front().value;
    };
    LockKeys k;
    k.queue = std::move(queue->kvs);
    etcd_sort_queue(k.queue);
    if (auto base = value(0)) k.base = parse_u64(*base);
    if (auto runs = value(1)) k.last_run = newest_record(*runs);
    k.last_success = value(2);
    k.rule = value(3);
    return view(k);
  }

  int history(const HistoryRequest& request) const override {
    const std::string& lock = request.lock;
    const long count = request.count;
    const auto keys = etcd_keys_for(m_target.key_prefix, lock);
    auto runs = const_cast<Client&>(m_client).range(etcd::single(keys.runs), BootClock::now() + m_target.timeout);
    if (!runs) {
      unavailable(runs.error(), lock);
      return exit_code::k_unavailable;
    }
    std::vector<std::string> records;
    if (!runs->kvs.empty())
      records = etcd_run_records(runs->kvs.front().value, static_cast<std::size_t>(std::max<long>(count, 0)));
    print_history(request, records, wall_us());
    return records.empty() ? exit_code::k_status_free : 0;
  }

  Result<bool> break_holder(const std::string& lock, long, std::string_view owner) override {
    // The holder's lease, found by its owner id; revoking it deletes its key (and only its key), in one
    // Raft entry. A lease that is gone already held nothing any more.
    const auto keys = etcd_keys_for(m_target.key_prefix, lock);
    const Deadline deadline = BootClock::now() + m_target.timeout;
    auto queue = m_client.range({keys.prefix, etcd::prefix_end(keys.prefix), etcd::Sort::create_ascending, 0, 0},
                                deadline);
    if (!queue) return std::unexpected(queue.error());
    if (queue->kvs.empty()) return false;
    etcd_sort_queue(queue->kvs);
    const auto& first = queue->kvs.front();
    if (etcd_holder_of(first, std::nullopt).owner != owner) return false;
    return m_client.revoke(first.lease, deadline);
  }

 private:
  // A lock's view from its keys: the holder is the first key; its lease's time to live is asked.
  Result<LockStatus> view(const LockKeys& k) const {
    auto& client = const_cast<Client&>(m_client);
    LockStatus s;
    s.limit = 1;
    s.last_run = k.last_run;
    s.last_success = k.last_success;
    s.rule = k.rule;
    s.now_us = wall_us();  // the clock the records' times and the rule's slots are on
    if (!k.queue.empty()) {
      const auto& first = k.queue.front();
      SlotHolder h{0, etcd_holder_of(first, k.base), std::nullopt};
      auto ttl = client.time_to_live(first.lease, BootClock::now() + m_target.timeout);
      if (!ttl) return std::unexpected(ttl.error());
      if (*ttl) h.remaining = milliseconds(**ttl * 1000);
      else h.remaining = milliseconds(0);
      s.holders.push_back(std::move(h));
      s.waiters = static_cast<long>(k.queue.size()) - 1;
      std::int64_t newest = 0;
      for (const auto& kv : k.queue) newest = std::max(newest, kv.create_revision);
      if (k.base) s.last_token = *k.base + static_cast<std::uint64_t>(newest);
    }
    return s;
  }

  void unavailable(const Error& e, const std::string& lock = {}) const {
    const std::string message = "cannot use etcd at " + m_target.redacted_url + ": " + e.message;
    if (lock.empty()) log::event(log::Level::error, "etcd_unavailable", message, {{"kind", lease::to_string(e.kind)}});
    else log::event(log::Level::error, "etcd_unavailable", message, {{"lock", lock}, {"kind", lease::to_string(e.kind)}});
  }

  EtcdPlace m_target;
  Client m_client;
};

}  // namespace

std::unique_ptr<Backend> make_etcd_backend(const EtcdPlace& target) {
  return std::make_unique<EtcdBackend>(target);
}

}  // namespace fencerun::lease
