#include "fence/redis_guard.hpp"

#include <cstdio>
#include <span>

#include "fence/embedded_scripts.hpp"
#include "fence/fence.hpp"
#include "backends/redis/client.hpp"
#include "util/exit_code.hpp"
#include "util/clock.hpp"

namespace fencerun::fence {
namespace {

using redis::Reply;

int unavailable(const std::string& what) {
  std::fprintf(stderr, "fencerun: fence redis: %s\n", what.c_str());
  return exit_code::k_unavailable;
}

std::optional<std::uint64_t> token_of(const Reply& r) {
  auto n = r.as_integer();
  if (!n || *n <= 0) return std::nullopt;
  return static_cast<std::uint64_t>(*n);
}

}  // namespace

std::string fence_key(std::string_view prefix, std::string_view resource) {
  return std::string(prefix) + "{" + std::string(resource) + "}:fence";
}

int run_redis_guard(const RedisGuard& guard) {
  redis::Client client(guard.endpoint);
  Deadline deadline = BootClock::now() + guard.timeout;

  std::string token = std::to_string(guard.token);
  std::vector<std::string_view> argv;
  argv.reserve(5 + guard.command.size());
  argv.push_back("EVALSHA");
  argv.push_back(scripts::k_fence.sha1);
  argv.push_back("1");
  argv.push_back(guard.fence_key);
  argv.push_back(token);
  for (const auto& a : guard.command) argv.push_back(a);

  auto reply = client.command(argv, deadline);
  if (reply && reply->error_is("NOSCRIPT")) {
    argv[0] = "EVAL";
    argv[1] = scripts::k_fence.text;
    reply = client.command(argv, deadline);
  }
  if (!reply) {
    const auto& e = reply.error();
    std::string what = std::string(redis::to_string(e.kind)) + ": " + e.message;
    if (e.kind == redis::Error::Kind::timeout)
      what += " (the command may or may not have run)";
    return unavailable(what);
  }
  if (reply->is_error()) return unavailable("fence script failed: " + reply->str);

  const auto& e = reply->elements;
  if (!reply->is_array() || e.size() != 2 || e[0].type != Reply::Type::integer)
    return unavailable("unexpected reply from the fence script");
  if (e[0].integer == 0) {
    auto accepted = token_of(e[1]);
    if (!accepted) return unavailable("fence key " + guard.fence_key + " holds a malformed token");
    std::fprintf(stderr, "fencerun: %s\n", stale_message(guard.token, guard.fence_key, *accepted).c_str());
    return exit_code::k_fence_stale;
  }
  const Reply& result = e[1];
  if (result.is_error()) {
    std::fprintf(stderr, "%s\n", redis::to_display(result).c_str());
    return k_write_failed;
  }
  std::string shown = redis::to_display(result);
  std::fprintf(stdout, "%s\n", shown.c_str());
  return std::fflush(stdout) == 0 ? exit_code::k_success : k_write_failed;
}

}  // namespace fencerun::fence
