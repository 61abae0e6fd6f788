#pragma once
// How the lease clients (lease_client.cpp, slots_client.cpp) call their scripts. Internal to the
// lease layer.
#include <charconv>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/redis/embedded_scripts.hpp"
#include "backends/redis/lease_client.hpp"
#include "backends/redis/client.hpp"
#include "util/clock.hpp"

namespace fencerun::lease::detail {

redis::Error protocol_error(std::string what);

template <class T>
std::optional<T> to_number(std::string_view s) {
  T value{};
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc{} || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

// EVALSHA, then EVAL when the server does not have the script cached (first use after a restart or
// SCRIPT FLUSH). `followups` go out in the same write, after the script. `sent` is read just before the
// request that produced the replies was written (before its first try, when the client sent it twice:
// see redis::Resend, which owner-checked scripts ask for).
redis::Result<std::vector<redis::Reply>> run_script(redis::Client& client, const scripts::Source& script,
                                                    std::span<const std::string_view> keys,
                                                    std::span<const std::string_view> args,
                                                    std::span<const std::vector<std::string_view>> followups,
                                                    Deadline deadline, Deadline& sent,
                                                    redis::Resend resend = redis::Resend::never);
redis::Result<redis::Reply> run_script(redis::Client& client, const scripts::Source& script,
                                       std::span<const std::string_view> keys, std::span<const std::string_view> args,
                                       Deadline deadline, Deadline& sent, redis::Resend resend = redis::Resend::never);

// An acquire script, with WAIT after it when replicas must confirm (still one round trip): its reply
// decoded, and with an acquisition how many replicas confirmed it.
redis::Result<AcquireResult> acquire_with_ack(redis::Client& client, const scripts::Source& script,
                                              std::span<const std::string_view> keys,
                                              std::span<const std::string_view> args, const ReplicaAck& ack,
                                              Deadline deadline);

}  // namespace fencerun::lease::detail
