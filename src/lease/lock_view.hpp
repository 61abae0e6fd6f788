#pragma once
// What status and list both say about a lock, for every backend: a holder's fields, the lock's
// lines, the record of runs. Pure functions, and the progress line and output of list.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "lease/types.hpp"
#include "lease/run_record.hpp"

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
// A listed lock's JSON members, without the closing brace (a backend may add its own).
std::string list_json_fields(const std::string& name, const LockStatus& s);

// status's answer for one lock (JSON, one line; or text), and list's line for it: the same for every
// backend that has one view of a lock (Redis, etcd).
std::string status_json(const std::string& lock, const LockStatus& s);
std::string status_text(const std::string& lock, const LockStatus& s);
std::string list_text(const std::string& name, const LockStatus& s);

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

namespace fencerun::lease {

// On a terminal, a long walk says how far it got (stderr, one line rewritten in place).
class Progress {
 public:
  Progress();
  ~Progress() { finish(); }
  // Erases the line (before the listing is printed, which may share the terminal).
  void finish();
  void update(std::size_t keys, std::size_t locks);

 private:
  bool m_tty;
  Deadline m_began;
  bool m_shown = false;
};

// The listing: one JSON array of `entries`, or their lines.
std::string joined(const std::vector<std::string>& entries, bool json);

// Writes `s` to stdout and flushes it.
void print(const std::string& s);

}  // namespace fencerun::lease
