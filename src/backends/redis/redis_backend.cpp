#include "backends/redis/redis_backend.hpp"

#include <cstdio>
#include <optional>

#include "lease/lock_view.hpp"
#include "backends/redis/lease_client.hpp"
#include "backends/redis/lock_walk.hpp"
#include "backends/redis/redis_lease.hpp"
#include "log/log.hpp"
#include "util/exit_code.hpp"

namespace fencerun::lease {
namespace {

// The run in progress of a GET of NAME's `run` key, as a record line ("" none).
std::string in_progress_record(const redis::Reply& reply) {
  if (!reply.is_string()) return {};
  auto r = parse_run_in_progress(reply.str);
  return r ? run_record_line(*r) : std::string();
}

using std::chrono::milliseconds;

class RedisBackend final : public Backend, public LockAdmin, public TokenCounter {
 public:
  explicit RedisBackend(const RedisPlace& target) : m_target(target) {}

  std::unique_ptr<Lease> lease(LeaseRequest request) const override {
    return make_redis_lease({m_target.endpoint, m_target.redacted_url, m_target.key_prefix}, std::move(request));
  }

  int status(const std::string& lock, bool json) const override {
    redis::Client client(m_target.endpoint);
    auto s = lock_status(client, keys_for(m_target.key_prefix, lock), BootClock::now() + m_target.timeout);
    if (!s) {
      log::event(log::Level::error, "redis_unavailable",
                 "cannot use Redis at " + m_target.redacted_url + ": " + s.error().message, {{"lock", lock}});
      return exit_code::k_unavailable;
    }
    std::string out = json ? status_json(lock, *s) : status_text(lock, *s);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    return s->holders.empty() ? exit_code::k_status_free : 0;
  }

  int list(const ListRequest& request) const override {
    Progress progress;
    auto found = walk(m_target.endpoint, m_target.key_prefix, request.pattern, m_target.timeout,
                      [&](std::size_t keys, std::size_t locks) { progress.update(keys, locks); });
    if (!found) {
      const std::string message = "cannot use Redis at " + m_target.redacted_url + ": " + found.error().error.message;
      if (found.error().lock.empty()) log::event(log::Level::error, "redis_unavailable", message);
      else log::event(log::Level::error, "redis_unavailable", message, {{"lock", found.error().lock}});
      return exit_code::k_unavailable;
    }
    bool any_held = false;
    std::vector<std::string> entries;
    for (const auto& [name, s] : *found) {
      const bool held = !s.holders.empty();
      any_held = any_held || held;
      if (!held && !(request.all && s.last_token)) continue;
      entries.push_back(request.json ? list_json_fields(name, s) + "}" : list_text(name, s));
    }
    progress.finish();
    print(joined(entries, request.json));
    return any_held ? 0 : exit_code::k_status_free;
  }

  int history(const HistoryRequest& request) const override {
    const std::string& lock = request.lock;
    const long count = request.count;
    redis::Client client(m_target.endpoint);
    const auto keys = keys_for(m_target.key_prefix, lock);
    const std::string runs = keys.runs(), last = std::to_string(count - 1);
    const std::string triggers = keys.runs_base + "triggers", run = keys.run();
    std::vector<std::vector<std::string_view>> commands = {
        {"LRANGE", runs, "0", last}, {"TIME"}, {"LRANGE", triggers, "0", "-1"}, {"GET", run}};
    auto replies = client.pipeline(commands, BootClock::now() + m_target.timeout, redis::Resend::idempotent);
    if (replies && ((*replies)[0].is_error() || (*replies)[1].is_error()))
      replies = std::unexpected(redis::Error{redis::Error::Kind::protocol,
                                             "history query failed: " + ((*replies)[0].is_error() ? (*replies)[0].str
                                                                                                  : (*replies)[1].str)});
    if (!replies) {
      log::event(log::Level::error, "redis_unavailable",
                 "cannot use Redis at " + m_target.redacted_url + ": " + replies.error().message, {{"lock", lock}});
      return exit_code::k_unavailable;
    }
    std::vector<std::string> records;
    for (const auto& e : (*replies)[0].elements)
      if (e.is_string()) records.push_back(e.str);
    std::uint64_t now_us = 0;
    const auto& t = (*replies)[1].elements;
    if (t.size() == 2) now_us = std::stoull(t[0].str) * 1'000'000 + std::stoull(t[1].str);
    std::vector<std::string> counts;
    for (const auto& e : (*replies)[2].elements)
      if (e.is_string()) counts.push_back(e.str);
    print_history(request, records, now_us, counts, in_progress_record((*replies)[3]));
    return records.empty() ? exit_code::k_status_free : 0;
  }

  int server_version() const override {
    return show_server(m_target.endpoint, m_target.redacted_url, "server", m_target.timeout) ? 0
                                                                                               : exit_code::k_unavailable;
  }

  LockAdmin* admin() override { return this; }
  TokenCounter* counter() override { return this; }

  Result<LockStatus> holders(const std::string& lock) override {
    return redis::to_lease(lock_status(client(), keys_for(m_target.key_prefix, lock), BootClock::now() + m_target.timeout));
  }
  Result<bool> break_holder(const std::string& lock, long limit, std::string_view owner) override {
    return redis::to_lease(release_holder(client(), keys_for(m_target.key_prefix, lock), limit, owner,
                                          BootClock::now() + m_target.timeout));
  }
  Result<Bumped> bump(const std::string& lock, std::uint64_t above) override {
    return redis::to_lease(
        bump_counter(client(), keys_for(m_target.key_prefix, lock), above, BootClock::now() + m_target.timeout));
  }

 private:
  // break and bump: one connection for all their requests, opened by the first.
  redis::Client& client() {
    if (!m_client) m_client.emplace(m_target.endpoint);
    return *m_client;
  }

  RedisPlace m_target;
  std::optional<redis::Client> m_client;
};

}  // namespace

std::unique_ptr<Backend> make_redis_backend(const RedisPlace& target) {
  return std::make_unique<RedisBackend>(target);
}

bool show_server(const redis::RedisEndpoint& endpoint, const std::string& url, const std::string& label,
                 milliseconds timeout) {
  redis::Client client(endpoint);
  client.learn_server();
  // The probe rides with the PING: one round trip, through Sentinel or a Cluster seed as a run would.
  auto pong = client.command({"PING"}, BootClock::now() + timeout);
  if (!pong || pong->is_error()) {
    log::event(log::Level::error, "redis_unavailable",
               "cannot use Redis at " + url + ": " + (pong ? pong->str : pong.error().message));
    return false;
  }
  const auto& server = client.server();
  if (!server) {  // answered PING but not the probe: a proxy that drops it, say
    std::printf("%s: unknown (HELLO and COMMAND INFO not answered) at %s\n%s: script\n", label.c_str(), url.c_str(),
                label == "server" ? "release" : (label + " release").c_str());
    return true;
  }
  std::printf("%s: %s at %s (%s)\n%s: %s\n", label.c_str(), server->describe().c_str(), server->where.c_str(),
              url.c_str(), label == "server" ? "release" : (label + " release").c_str(),
              std::string(release_path_name(release_path(server))).c_str());
  return true;
}

}  // namespace fencerun::lease
