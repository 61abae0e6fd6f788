#pragma once
// Backend: where the locks live, and all that a subcommand needs of it: the lease a run acquires, a
// lock's view for status, the walk for list, break, bump and the servers' versions. The Redis backend
// (one server, a Sentinel-managed master or a Cluster) and the quorum backend (3, 5 or 7 independent
// servers) implement it; make_backend() is the one place that picks between them, so the subcommands
// (src/app/) never ask which one they have.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "etcd/url.hpp"
#include "lease/lease.hpp"
#include "lease/lease_client.hpp"
#include "redis/client.hpp"
#include "redis/url.hpp"

namespace fencerun::lease {

// Where the locks live, as the configuration (config::CommonConfig) validated it. It refers to the
// configuration's own fields, which must outlive the backend built from it (a lease copies what it
// keeps).
struct BackendTarget {
  const std::optional<etcd::EtcdEndpoint>& etcd;  // etcd://: the cluster (the Redis fields are unused)
  const redis::RedisEndpoint& endpoint;  // the server; in quorum mode the first one's
  const std::string& redacted_url;       // for messages and FENCERUN_REDIS_URL: never a password
  // Quorum mode (-r given 3, 5 or 7 times): every server in the order given, and its redacted URL.
  // Empty with one server.
  const std::vector<redis::RedisEndpoint>& servers;
  const std::vector<std::string>& server_urls;
  const std::string& key_prefix;
  std::chrono::milliseconds timeout;         // bound of every request
  std::chrono::milliseconds quorum_max_ttl;  // quorum mode's lease cap (quorum_lease.hpp)
};

// `fencerun list`: the locks whose NAME matches `pattern` (Redis MATCH syntax).
struct ListRequest {
  std::string pattern = "*";
  bool all = false;  // free locks that have a token counter too
  bool json = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // run: the lease one run acquires (Lease::acquire). Connects to nothing before acquire().
  virtual std::unique_ptr<Lease> lease(LeaseRequest request) const = 0;

  // status NAME: prints the lock's view on stdout (text, or JSON with `json`). Returns 0 when it is
  // held, exit_code::k_status_free when it is free, k_unavailable (logged) when that cannot be told.
  virtual int status(const std::string& lock, bool json) const = 0;

  // list: prints the held locks that match (and free ones with request.all), one line or JSON array
  // element each; a progress line on a terminal. Returns 0 when any is held, k_status_free when none,
  // k_unavailable (logged) when the servers could not be walked.
  virtual int list(const ListRequest& request) const = 0;

  // history NAME: prints the recorded runs of NAME, newest first, at most `count` (text, or a JSON array
  // with `json`). Returns 0 when some are recorded, k_status_free when none, k_unavailable (logged)
  // when that cannot be told.
  virtual int history(const std::string& lock, long count, bool json) const = 0;

  // --version -r URL: prints which server each one is, its version and how a lock is released there.
  // Returns 0, or k_unavailable (logged) when one cannot be reached.
  virtual int server_version() const = 0;

  // break and bump, one server's operations (the configuration refuses them in quorum mode, where
  // these fail with a protocol error). holders(): the lock's holders as status shows them;
  // break_holder(): releases the lease of the holder `owner` owner-checked and wakes the waiters
  // (false: it held nothing any more); bump(): raises the token counter to at least `above`. All
  // run on one connection, each bounded by the timeout.
  virtual redis::Result<LockStatus> holders(const std::string& lock) = 0;
  virtual redis::Result<bool> break_holder(const std::string& lock, long limit, std::string_view owner) = 0;
  virtual redis::Result<Bumped> bump(const std::string& lock, std::uint64_t above) = 0;
};

// history's output for `records` (newest first; run_record.hpp), the server's time `now_us`.
void print_history(const std::string& lock, const std::vector<std::string>& records, std::uint64_t now_us, bool json);

// The backend for `target`: by the URL's scheme and the number of servers. Never connects.
std::unique_ptr<Backend> make_backend(const BackendTarget& target);

}  // namespace fencerun::lease
