#pragma once
// Quorum mode's status: what each server says of a lock, and what a majority says. Pure functions.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "backends/redis/error.hpp"
#include "lease/lock_view.hpp"

namespace fencerun::lease {

// Quorum mode: what each server says, and what a majority says. A server list that differs between
// clients shows here as servers that disagree.
struct QuorumView {
  std::vector<redis::Result<LockStatus>> servers;
  std::size_t majority = 0;
  std::size_t answered = 0;
  std::optional<SlotHolder> holder;  // the owner on a majority, with the shortest ttl among them
  std::size_t holder_servers = 0;           // the most servers one owner holds the lock on
  std::size_t free_servers = 0;
  std::optional<std::uint64_t> last_token;  // the greatest counter
  bool disagree = false;                    // the servers that answered do not all name the same owner (or none)
  // The record of runs merged over the servers (merge_records): last_run, last_success and now_us
  // (the first answering server's time, which the records' times are moved onto), and the stored rule
  // (the first answering server's that has one).
  LockStatus runs;
};
QuorumView quorum_view(std::vector<redis::Result<LockStatus>> replies);

// One server's view: "held by WHO, token T, ttl X, counter C", "free, counter C" or "unavailable: why".
std::string server_text(const redis::Result<LockStatus>& s);
// The "servers" JSON array: {url, available, error} or {url, available, held, holder fields, counter}.
std::string servers_json(const QuorumView& v, const std::vector<std::string>& urls);

}  // namespace fencerun::lease
