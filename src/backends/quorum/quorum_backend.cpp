#include "backends/quorum/quorum_backend.hpp"
#include "backends/quorum/quorum_view.hpp"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "backends/quorum/fanout.hpp"
#include "lease/lock_view.hpp"
#include "backends/redis/lock_walk.hpp"
#include "backends/quorum/quorum_lease.hpp"
#include "backends/redis/redis_backend.hpp"
#include "log/log.hpp"
#include "util/exit_code.hpp"

namespace fencerun::lease {
namespace {

std::string status_text(const std::string& lock, const QuorumView& v, const std::vector<std::string>& urls) {
  const std::string of = " of " + std::to_string(v.servers.size()) + " servers (a majority is " +
                         std::to_string(v.majority) + ")";
  std::string out;
  if (v.holder)
    out = lock + ": held by " + who(v.holder->holder) + " on " + std::to_string(v.holder_servers) + of +
          "\ntoken: " + token_text(v.holder->holder) + "\nttl: " + ttl_text(*v.holder) + "\n";
  else if (v.answered < v.majority)
    out = lock + ": unknown: " + std::to_string(v.answered) + of + " answered\n";
  else if (v.free_servers >= v.majority)
    out = lock + ": free on " + std::to_string(v.free_servers) + of + "\n";
  else
    out = lock + ": free: held by no owner on a majority" + of + "\n";
  out += "last token: " + (v.last_token ? std::to_string(*v.last_token) : std::string("none")) + "\n" +
         runs_status_text(v.runs);
  for (std::size_t i = 0; i < v.servers.size(); ++i)
    out += "server " + std::to_string(i + 1) + " " + urls[i] + ": " + server_text(v.servers[i]) + "\n";
  if (v.disagree)
    out += "the servers disagree: a server restarted or was unreachable, a lease is being taken or expiring, or "
           "clients of this lock use different server lists\n";
  return out;
}

std::string status_json(const std::string& lock, const QuorumView& v, const std::vector<std::string>& urls) {
  std::string out = "{\"lock\":\"" + log::json_escape(lock) + "\",\"held\":" + (v.holder ? "true" : "false");
  if (v.holder) out += "," + holder_json(*v.holder) + ",\"held_on\":" + std::to_string(v.holder_servers);
  out += ",\"majority\":" + std::to_string(v.majority) + ",\"answered\":" + std::to_string(v.answered) +
         ",\"agree\":" + (v.disagree ? "false" : "true") + ",\"last_token\":" + number_or_null(v.last_token) +
         runs_json(v.runs) + ",\"servers\":" + servers_json(v, urls) + "}\n";
  return out;
}

using Walks = std::vector<std::expected<Listing, ListFailure>>;  // by server

// The servers' views of `name`: its status on each that answered (free where it has no keys).
std::vector<redis::Result<LockStatus>> views_of(const std::string& name, const Walks& walks) {
  std::vector<redis::Result<LockStatus>> out;
  for (const auto& w : walks) {
    if (!w) {
      out.push_back(std::unexpected(w.error().error));
      continue;
    }
    const auto it = w->find(name);
    out.push_back(it == w->end() ? LockStatus{} : it->second);
  }
  return out;
}

// One line for the majority view, and when the servers disagree one more line per server.
std::string list_text(const std::string& name, const QuorumView& v, const std::vector<std::string>& urls) {
  const std::string of = " of " + std::to_string(v.servers.size()) + " servers";
  std::string out = name + ": ";
  if (v.holder) out += "held by " + holder_text(*v.holder) + ", on " + std::to_string(v.holder_servers) + of;
  else if (v.answered < v.majority) out += "unknown: " + std::to_string(v.answered) + of + " answered";
  else if (v.holder_servers > 0)
    out += "not held by a majority (held on " + std::to_string(v.holder_servers) + of + ")";
  else out += "free on " + std::to_string(v.free_servers) + of;
  out += ", last token " + (v.last_token ? std::to_string(*v.last_token) : std::string("none")) +
         runs_list_text(v.runs);
  if (!v.disagree) return out + "\n";
  out += ", the servers disagree:\n";
  for (std::size_t i = 0; i < v.servers.size(); ++i)
    out += "  server " + std::to_string(i + 1) + " " + urls[i] + ": " + server_text(v.servers[i]) + "\n";
  return out;
}

// list's JSON element for the majority view (limit 1, no queue in quorum mode) and each server's view.
std::string list_json(const std::string& name, const QuorumView& v, const std::vector<std::string>& urls) {
  LockStatus majority;
  if (v.holder) majority.holders.push_back(*v.holder);
  majority.last_token = v.last_token;
  majority.last_run = v.runs.last_run;
  majority.last_success = v.runs.last_success;
  return list_json_fields(name, majority) + ",\"held_on\":" + std::to_string(v.holder_servers) +
         ",\"majority\":" + std::to_string(v.majority) + ",\"answered\":" + std::to_string(v.answered) +
         ",\"agree\":" + (v.disagree ? "false" : "true") + ",\"servers\":" + servers_json(v, urls) + "}";
}


class QuorumBackend final : public Backend {
 public:
  explicit QuorumBackend(const QuorumPlace& target) : m_target(target) {}

  std::unique_ptr<Lease> lease(LeaseRequest request) const override {
    return make_quorum_lease({m_target.servers, m_target.server_urls, m_target.key_prefix, m_target.quorum_max_ttl},
                             std::move(request));
  }

  int status(const std::string& lock, bool json) const override {
    Fanout fanout(m_target.servers);
    const auto keys = keys_for(m_target.key_prefix, lock);
    const auto view = quorum_view(fanout.round<LockStatus>(
        [keys, until = BootClock::now() + m_target.timeout](redis::Client& client, std::size_t) {
          return lock_status(client, keys, until);
        },
        BootClock::now() + m_target.timeout));
    std::string out = json ? status_json(lock, view, m_target.server_urls) : status_text(lock, view, m_target.server_urls);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    if (view.holder) return 0;
    if (view.answered < view.majority) {
      log::event(log::Level::error, "redis_unavailable",
                 "only " + std::to_string(view.answered) + " of " + std::to_string(view.servers.size()) +
                     " servers answered: no majority view",
                 {{"lock", lock}});
      return exit_code::k_unavailable;
    }
    return exit_code::k_status_free;
  }

  int list(const ListRequest& request) const override {
    const auto walks = walk_all(request);
    const auto& urls = m_target.server_urls;
    std::size_t answered = 0;
    std::set<std::string> names;
    for (const auto& w : walks)
      if (w) {
        ++answered;
        for (const auto& entry : *w) names.insert(entry.first);
      }
    const std::size_t majority = majority_of(walks.size());
    // Each server that could not be listed, named; what the others say is listed all the same.
    const auto level = answered < majority ? log::Level::error : log::Level::warn;
    for (std::size_t i = 0; i < walks.size(); ++i) {
      if (walks[i]) continue;
      const std::string message = "cannot use Redis at " + urls[i] + ": " + walks[i].error().error.message;
      if (walks[i].error().lock.empty()) log::event(level, "redis_unavailable", message);
      else log::event(level, "redis_unavailable", message, {{"lock", walks[i].error().lock}});
    }
    bool any_held = false;
    std::vector<std::string> entries;
    for (const auto& name : names) {
      const auto v = quorum_view(views_of(name, walks));
      any_held = any_held || v.holder;
      // A lock some server holds is listed even without a majority: that is the disagreement to see.
      if (!v.holder && v.holder_servers == 0 && !(request.all && v.last_token)) continue;
      entries.push_back(request.json ? list_json(name, v, urls) : list_text(name, v, urls));
    }
    print(joined(entries, request.json));
    if (answered < majority) {
      log::event(log::Level::error, "redis_unavailable",
                 "only " + std::to_string(answered) + " of " + std::to_string(walks.size()) +
                     " servers answered: no majority view");
      return exit_code::k_unavailable;
    }
    return any_held ? 0 : exit_code::k_status_free;
  }

  // The records of every server that answers, merged (merge_records): one record per run, newest token
  // first; 69 when fewer than a majority answered (what they had is printed all the same).
  int history(const HistoryRequest& request) const override {
    const std::string& lock = request.lock;
    const long count = request.count;
    Fanout fanout(m_target.servers);
    const auto keys = keys_for(m_target.key_prefix, lock);
    const auto until = BootClock::now() + m_target.timeout;
    const auto replies = fanout.round<ServerRecords>(
        [runs = keys.runs(), last = std::to_string(count - 1), until](redis::Client& client,
                                                                       std::size_t) -> redis::Result<ServerRecords> {
          std::vector<std::vector<std::string_view>> commands = {{"LRANGE", runs, "0", last}, {"TIME"}};
          auto r = client.pipeline(commands, until, redis::Resend::idempotent);
          if (!r) return std::unexpected(r.error());
          if ((*r)[0].is_error() || (*r)[1].is_error())
            return std::unexpected(redis::Error{redis::Error::Kind::protocol, "history query failed: " +
                                                                                  ((*r)[0].is_error() ? (*r)[0].str
                                                                                                      : (*r)[1].str)});
          ServerRecords out;
          for (const auto& e : (*r)[0].elements)
            if (e.is_string()) out.records.push_back(e.str);
          const auto& t = (*r)[1].elements;
          if (t.size() == 2 && t[0].is_string() && t[1].is_string())
            out.now_us = std::stoull(t[0].str) * 1'000'000 + std::stoull(t[1].str);
          return out;
        },
        until);
    std::vector<ServerRecords> answered;
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (replies[i]) {
        answered.push_back(*replies[i]);
        continue;
      }
      log::event(log::Level::warn, "redis_unavailable",
                 "cannot use Redis at " + m_target.server_urls[i] + ": " + replies[i].error().message, {{"lock", lock}});
    }
    const std::uint64_t now_us = answered.empty() ? 0 : answered.front().now_us;
    const auto records = merge_records(answered, now_us, static_cast<std::size_t>(count));
    if (!answered.empty()) print_history(request, records, now_us);
    const std::size_t majority = majority_of(m_target.servers.size());
    if (answered.size() < majority) {
      log::event(log::Level::error, "redis_unavailable",
                 "only " + std::to_string(answered.size()) + " of " + std::to_string(m_target.servers.size()) +
                     " servers answered: no majority view",
                 {{"lock", lock}});
      return exit_code::k_unavailable;
    }
    return records.empty() ? exit_code::k_status_free : 0;
  }

  // Every server, in the order given; 69 when any one cannot be reached.
  int server_version() const override {
    bool all = true;
    for (std::size_t i = 0; i < m_target.servers.size(); ++i)
      all = show_server(m_target.servers[i], m_target.server_urls[i], "server " + std::to_string(i + 1),
                        m_target.timeout) && all;
    std::fflush(stdout);
    return all ? 0 : exit_code::k_unavailable;
  }


 private:
  // Every server's walk at once (one thread each: a walk is many round trips, and a server that does
  // not answer costs the timeout once, not once per server).
  Walks walk_all(const ListRequest& request) const {
    const std::size_t n = m_target.servers.size();
    Walks walks(n);
    Progress progress;
    std::mutex mutex;
    std::vector<std::pair<std::size_t, std::size_t>> counts(n);  // keys, locks by server
    {
      std::vector<std::jthread> threads;
      for (std::size_t i = 0; i < n; ++i)
        threads.emplace_back([&, i] {
          walks[i] = walk(m_target.servers[i], m_target.key_prefix, request.pattern, m_target.timeout,
                          [&, i](std::size_t keys, std::size_t locks) {
                            std::lock_guard lock(mutex);
                            counts[i] = {keys, locks};
                            std::size_t all_keys = 0, most_locks = 0;  // each server has (nearly) the same locks
                            for (const auto& [k, l] : counts) all_keys += k, most_locks = std::max(most_locks, l);
                            progress.update(all_keys, most_locks);
                          });
        });
    }
    return walks;
  }

  QuorumPlace m_target;
};

}  // namespace

std::unique_ptr<Backend> make_quorum_backend(const QuorumPlace& target) {
  return std::make_unique<QuorumBackend>(target);
}

}  // namespace fencerun::lease
