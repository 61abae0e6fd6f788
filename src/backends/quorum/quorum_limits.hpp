#pragma once
// Quorum mode's checks that need more than the text of the options: the servers are independent
// after name resolution, and the quorum-wide lease cap (the longest lease any client of the quorum
// may take, which sets how long a server that lost its data stays out of every majority).
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "backends/redis/url.hpp"

namespace fencerun::quorum {

inline constexpr std::chrono::milliseconds k_quorum_max_ttl_default{60'000};

// $FENCERUN_QUORUM_MAX_TTL (a duration, at least 100ms), else 60s. Every client of a quorum must see
// the same value. Throws UsageError naming the variable when it is not a duration.
std::chrono::milliseconds quorum_max_ttl(const std::optional<std::string>& value);

// --ttl must not exceed the cap: 64 otherwise.
void check_quorum_ttl(std::chrono::milliseconds ttl, std::chrono::milliseconds max_ttl);

// Two TCP/TLS servers whose host names resolve to a shared address with the same port, or two unix
// sockets with the same path, are one server, whatever their databases (they fail together): 64
// naming both. Names that do not resolve are left to the connection,
// which reports them. (The same server reached under addresses that differ, 127.0.0.1 and
// 127.0.0.2, is found when fencerun talks to it: see quorum_lease.cpp.)
void check_quorum_addresses(const std::vector<redis::RedisEndpoint>& servers,
                            const std::vector<std::string>& redacted_urls);

}  // namespace fencerun::quorum
