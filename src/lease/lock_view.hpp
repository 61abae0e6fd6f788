#pragma once
// What status and list both say about a lock, for every backend: a holder's fields, and in quorum
// mode each server's view and the majority view over them. Pure functions.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "lease/lease_client.hpp"
#include "lease/run_record.hpp"
#include "redis/client.hpp"

namespace fencerun::lease {

template <class T>
std::string number_or_null(const std::optional<T>& n) {
  return n ? std::to_string(*n) : std::string("null");
}

// One holder's fields as JSON members (without braces): owner (8 digits), host, pid, token, ttl_ms.
std::string holder_json(const SlotHolder& s);
// "pid P on HOST (owner OWNER8)"
std::string who(const Holder& h);
// "Xms remaining" or "no expiry"
std::string ttl_text(const SlotHolder& s);
// The token, or "unknown"
std::string token_text(const Holder& h);
// list's words for a holder: "WHO, token T, ttl Xms" ("ttl none" without expiry).
std::string holder_text(const SlotHolder& s);
// A listed lock's JSON members, without the closing brace (quorum mode adds its own).
std::string list_json_fields(const std::string& name, const LockStatus& s);

// status's answer for one lock (JSON, one line; or text), and list's line for it: the same for every
// backend that has one view of a lock (Redis, etcd).
std::string status_json(const std::string& lock, const LockStatus& s);
std::string status_text(const std::string& lock, const LockStatus& s);
std::string list_text(const std::string& name, const LockStatus& s);

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
  // (the first answering server's time, which the records' times are moved onto).
  LockStatus runs;
};
QuorumView quorum_view(std::vector<redis::Result<LockStatus>> replies);

// One server's view: "held by WHO, token T, ttl X, counter C", "free, counter C" or "unavailable: why".
std::string server_text(const redis::Result<LockStatus>& s);
// The "servers" JSON array: {url, available, error} or {url, available, held, holder fields, counter}.
std::string servers_json(const QuorumView& v, const std::vector<std::string>& urls);

}  // namespace fencerun::lease

namespace fencerun::lease {

// status: "last run: ...\nlast success: ...\n" from the record of runs (run_record.hpp), "none" for
// one that is not; nothing at all when no run is recorded.
std::string runs_status_text(const LockStatus& s);
// status --json, list --json: ,"last_run":{...}|null,"last_success":{...}|null
std::string runs_json(const LockStatus& s);
// list: ", last run OUTCOME AGE ago" (the run's end, or its start when it has none), or nothing.
std::string runs_list_text(const LockStatus& s);

}  // namespace fencerun::lease
