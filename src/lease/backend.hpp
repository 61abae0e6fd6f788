#pragma once
// The seam between fencerun and where its locks live. Everything above it (src/app/, src/config/,
// main.cpp) knows a backend only through these types; each backend is a folder under src/backends/
// (docs/backends.md) that implements them, and src/backends/registry.cpp is the one table that
// names every backend, by URL scheme.
//
//   Target   where the locks live, as the backend's own URL parsing validated it: its redacted URL,
//            its capabilities, its checks of a run's options, the Backend it builds;
//   Backend  what a subcommand needs of it: the lease a run acquires (lease.hpp), a lock's status,
//            list, history and the servers' versions, and the admin operations when it has them.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lease/lease.hpp"
#include "lease/types.hpp"
#include "util/url.hpp"

namespace fencerun::lease {

// What a backend can do besides a plain exclusive run, status, list and history (which every backend
// does). A backend declares its set in the registry; the configuration refuses an option or command
// whose capability the backend lacks (exit 64), with one message format (refusal()).
enum class Capability : std::uint32_t {
  limit = 1u << 0,          // --limit N: N holders at once
  fair = 1u << 1,           // --fair: waiters in arrival order
  min_replicas = 1u << 2,   // --min-replicas N: replicas confirm the acquisition
  min_interval = 1u << 3,   // --min-interval (and the record of runs it reads)
  break_lock = 1u << 4,     // break NAME [--owner PREFIX]
  bump = 1u << 5,           // bump NAME --above N
  acl = 1u << 6,            // acl: the server's least-privilege rule
  shared_connection = 1u << 7,  // the job's nested fencerun commands reuse the run's credentials
  lock_delay = 1u << 8,     // --lock-delay: a vanished holder's run is waited out
  every = 1u << 9,          // --every: once per schedule slot, judged by the trigger's fire time
  if_record_lost = 1u << 10,  // --if-record-lost skip: the record's marker, kept with the token counter
};

struct Capabilities {
  std::uint32_t bits = 0;
  constexpr bool has(Capability c) const { return (bits & static_cast<std::uint32_t>(c)) != 0; }
};
constexpr Capabilities operator|(Capability a, Capability b) {
  return {static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b)};
}
constexpr Capabilities operator|(Capabilities a, Capability b) { return {a.bits | static_cast<std::uint32_t>(b)}; }

// A capability's name in messages: "--limit", "--fair", "break", ...
std::string_view capability_name(Capability c);

// `fencerun list`: the locks whose NAME matches `pattern` (a glob: * ? [...]).
struct ListRequest {
  std::string pattern = "*";
  bool all = false;  // free locks that have a token counter too
  bool json = false;
};

// break: one lock's holders, changed by hand. Only backends with the break_lock capability have it
// (Backend::admin()).
class LockAdmin {
 public:
  virtual ~LockAdmin() = default;
  // The lock's holders as status shows them.
  virtual Result<LockStatus> holders(const std::string& lock) = 0;
  // Releases the lease of the holder `owner` owner-checked and wakes the waiters (false: it held
  // nothing any more). `limit` is the lock's, as holders() said.
  virtual Result<bool> break_holder(const std::string& lock, long limit, std::string_view owner) = 0;
};

// bump: a lock's token counter, raised by hand. Only backends with the bump capability have it
// (Backend::counter()).
class TokenCounter {
 public:
  virtual ~TokenCounter() = default;
  // Raises the token counter so that the next token is greater than `above` (never lowers it).
  virtual Result<Bumped> bump(const std::string& lock, std::uint64_t above) = 0;
};

// history NAME's options.
struct HistoryRequest {
  std::string lock;
  long count = 0;     // at most this many runs
  bool json = false;
  bool utc = false;   // times in UTC, not the local time zone
  bool all = false;   // also the triggers skipped or busy, per slot, where the backend records them
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
  virtual int history(const HistoryRequest& request) const = 0;

  // --version -r URL: prints which server each one is, its version and how a lock is released there.
  // Returns 0, or k_unavailable (logged) when one cannot be reached.
  virtual int server_version() const = 0;

  // break and bump; nullptr where the backend lacks the capability (the configuration refused the
  // command before a backend was built).
  virtual LockAdmin* admin() { return nullptr; }
  virtual TokenCounter* counter() { return nullptr; }
};

// history's output for `records` (newest first; run_record.hpp), the server's time `now_us`.
// `triggers`: the record of skipped and busy triggers, newest first (run_record.hpp's TriggerCount
// lines; empty where the backend keeps none); `in_progress`: the run in progress as a record ("" none).
void print_history(const HistoryRequest& request, const std::vector<std::string>& records, std::uint64_t now_us,
                   const std::vector<std::string>& triggers = {}, const std::string& in_progress = {});

// What every backend is given besides its URL.
struct BackendSettings {
  std::string key_prefix = "fencerun:";
  std::chrono::milliseconds timeout{2000};  // bound of every request
};

// A run's options that a backend may bound (etcd: whole-second TTLs; a quorum: its longest TTL).
struct RunShape {
  std::chrono::milliseconds ttl{0};
  std::string ttl_text;  // as given, for messages
};

// Where the locks live, as the backend validated it. Built by the registry (configure_target());
// immutable.
class Target {
 public:
  virtual ~Target() = default;
  // The registry's name of the backend: "redis", "quorum", "etcd".
  virtual std::string_view backend() const = 0;
  // What the locks live on, for messages: "Redis", "etcd".
  virtual std::string_view server_kind() const = 0;
  // The log event for a server that cannot be used: redis_unavailable, etcd_unavailable.
  virtual std::string_view unavailable_event() const = 0;
  // The URL (every server's, separated by spaces, for several) without any password.
  virtual const std::string& redacted_url() const = 0;
  // --tls-insecure was given for a TLS connection.
  virtual bool tls_insecure() const = 0;
  // Throws UsageError naming the option when a TLS file named cannot be read.
  virtual void check_files() const = 0;
  // Throws UsageError naming the option when the run's shape is outside what the backend can hold.
  virtual void check_run(const RunShape& run) const { (void)run; }
  // The job's nested fencerun commands reuse this run's connection: a sealed memfd holding what they
  // need (never in the environment), or -1 (capability shared_connection).
  virtual int share_connection() const { return -1; }
  virtual std::unique_ptr<Backend> make_backend(const BackendSettings& settings) const = 0;
};

// ---- The registry (src/backends/registry.cpp) ----

using GetEnv = std::function<std::optional<std::string>(const char*)>;

// What the command line and the environment say about the connection, before a backend parses it.
struct ConnectRequest {
  std::vector<std::string> urls;  // one, or several (a quorum)
  std::string source;             // what chose them, for messages: "--server", "$FENCERUN_SERVER", ...
  util::TlsSettings tls;          // --tls-* (applies to every server)
  bool tls_options = false;       // any --tls-* option was given
  GetEnv getenv;
};

// One backend: its name, what it is, the URL schemes it takes, how many URLs (-r given how many times),
// the words it adds to --version's feature line, its capabilities, why it lacks one it lacks (optional
// text), and its URL parser.
struct Unsupported {
  Capability capability;
  std::string_view why;  // after "not supported on NAME: "; empty: nothing to add
};
struct BackendInfo {
  std::string_view name;
  std::string_view summary;
  std::span<const std::string_view> schemes;
  std::size_t min_urls = 1, max_urls = 1;
  // What a count of URLs outside [min_urls, max_urls] is told ("{n}": the count), after "SOURCE: ".
  std::string_view wrong_count;
  std::string_view features;
  Capabilities capabilities;
  std::span<const Unsupported> unsupported;
  std::shared_ptr<const Target> (*configure)(const ConnectRequest& request);
};

// Every backend, in the order --version and the hints list them.
std::span<const BackendInfo> backends();
// The registry's row of `target`'s backend (its capabilities).
const BackendInfo& info_of(const Target& target);

// The backend for the request's URLs (by scheme and count) and its Target. Throws UsageError naming
// request.source: an unknown scheme lists every scheme; a URL its backend refuses says why.
std::shared_ptr<const Target> configure_target(const ConnectRequest& request);

// "tcp unix tls sentinel cluster quorum etcd": what this build can reach, for --version.
std::string features_line();
// The libraries the backends are built on, one "NAME VERSION" line each, for --version.
std::string library_versions();

// The one refusal format for a capability `target` lacks: "WHAT: not supported on BACKEND (SUMMARY)[: WHY]".
std::string refusal(const Target& target, Capability capability);

}  // namespace fencerun::lease
