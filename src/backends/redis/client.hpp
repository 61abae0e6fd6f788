#pragma once
// Client: the one funnel through which fencerun talks to Redis. It connects lazily, authenticates and
// selects the database, and bounds every connect, write and read by a caller-given deadline (never an
// infinite wait). After any failure the connection is closed and the next request reconnects, so a
// redis+sentinel:// client asks the sentinels for the master again and follows a failover. Cluster
// redirections (MOVED, ASK) are followed inside one request.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/redis/url.hpp"
#include "backends/redis/error.hpp"
#include "backends/redis/reply.hpp"
#include "util/clock.hpp"

namespace fencerun::redis {

class Transport;

// Whether a request may be sent a second time when its connection failed under it. Every request is
// sent on a fresh connection when the one it would have used was found closed by the server before
// anything was written (an idle timeout), or when the connection failed before any byte of it went
// out: that is never a repeat. `idempotent` requests (owner-checked
// renewal and release, reads, a subscription) are also sent once more on a fresh connection, within
// the same deadline, when a connection that had served earlier requests closed or reset under them
// (the server may or may not have run them; running them twice is harmless). An acquisition is never
// repeated: its caller undoes a request that may have run.
enum class Resend { never, idempotent };

// The server's error replies that mean "not now" rather than "no": LOADING, BUSY, MASTERDOWN,
// CLUSTERDOWN and "ERR max number of clients reached". The command was not run.
bool is_unready(const Reply& reply);

// The hiredis version fencerun was built with, e.g. "1.1.0" (for --version).
std::string hiredis_version();

// What a server said of itself (HELLO) and which compare-and-delete commands its command table has
// (COMMAND INFO): learned on a connection's first request, in the same write.
struct ServerInfo {
  std::string name;     // "redis", "valkey", ...; empty when the server did not say (HELLO refused)
  std::string version;  // e.g. "8.0.2"
  std::string where;    // the node that answered, host:port or socket path
  bool delifeq = false; // DELIFEQ key value (Valkey 9.0 and later)
  bool delex = false;   // DELEX key IFEQ value (Redis 8.4, Valkey 9.2 and later)
  // "valkey 8.0.1", or "an unnamed server" when HELLO was refused.
  std::string describe() const;
};

class Client {
 public:
  explicit Client(RedisEndpoint endpoint);
  ~Client();
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;

  // Sends one command and waits for its reply until `deadline`.
  // A reply of the kind is_unready() names comes back as an Error of kind `unready` with the
  // server's words.
  Result<Reply> command(std::span<const std::string_view> argv, Deadline deadline, Resend resend = Resend::never);
  Result<Reply> command(std::initializer_list<std::string_view> argv, Deadline deadline,
                        Resend resend = Resend::never) {
    return command(std::span<const std::string_view>(argv.begin(), argv.size()), deadline, resend);
  }
  // Sends several commands in one write and reads all replies (one round trip). Commands must address
  // keys of one hash slot (a redirection of the first command re-sends them all).
  Result<std::vector<Reply>> pipeline(std::span<const std::vector<std::string_view>> commands, Deadline deadline,
                                      Resend resend = Resend::never);

  // Subscriber mode (a connection of its own: RESP2 allows nothing else on it). subscribe() returns once
  // the server confirmed the subscription; afterwards wait with poll() on wake_fd() (and
  // has_buffered_messages()), then call drain_messages() for the payloads of the messages that
  // arrived, without blocking.
  Result<void> subscribe(std::string_view channel, Deadline deadline);
  int wake_fd() const;
  bool has_buffered_messages() const;
  Result<std::vector<std::string>> drain_messages();

  // Connects now if not connected (handshake included).
  Result<void> connect(Deadline deadline);
  bool connected() const { return m_conn != nullptr; }
  void disconnect();
  const RedisEndpoint& endpoint() const { return m_endpoint; }
  // From now on each new connection's first request also carries HELLO and COMMAND INFO (same write,
  // no extra round trip), and server() tells what they said. Off by default: only the lease's own
  // connection needs it.
  void learn_server() { m_learn_server = true; }
  // Whether the last request went out twice, its first attempt having perhaps run (Resend::idempotent
  // after a connection failed under it): an owner-checked release then finds the lock gone.
  bool last_request_repeated() const { return m_repeated; }
  // What the server of the last connection that answered the probe said; nullopt before that.
  const std::optional<ServerInfo>& server() const { return m_server; }
  // The node currently talked to (after sentinel discovery or a cluster redirection), as host:port.
  std::string current_node() const;
  // Where a subscriber that must hear what this client's scripts publish should connect: the node a
  // Cluster redirection sent this client to (a script's PUBLISH counts only that node's subscribers),
  // else the endpoint itself (a Sentinel endpoint keeps following the master).
  RedisEndpoint subscriber_endpoint() const;

  struct Connection;

 private:
  // `sentinel`: the node is a sentinel (its password comes from elsewhere; messages say where).
  Result<std::unique_ptr<Connection>> open_node(const RedisEndpoint& node, bool check_master,
                                                Deadline deadline, bool sentinel = false);
  Result<RedisEndpoint> discover_master(Deadline deadline);
  Result<std::vector<Reply>> send(std::span<const std::vector<std::string_view>> commands, Deadline deadline,
                                  Resend resend);
  // Closes the connection when the server closed (or reset) it while it was idle, so the next
  // request goes out on a fresh one. The debug event `reconnected` says so.
  void drop_if_closed_by_server();

  // Sentinel: look up the master again before a request when the last look-up is older than this,
  // so a failover is followed even while the old master still answers as one.
  static constexpr std::chrono::milliseconds k_sentinel_recheck{1000};
  // At most this much of a request's time goes to that re-check (and at most a quarter of it). On
  // failure the known master is kept and the request goes on.
  static constexpr std::chrono::milliseconds k_sentinel_recheck_slice{250};
  // Each sentinel gets an equal share of the time left for those not yet asked, but at least this.
  static constexpr std::chrono::milliseconds k_sentinel_min_share{50};
  void recheck_master(Deadline deadline);

  RedisEndpoint m_endpoint;
  std::optional<RedisEndpoint> m_node;  // where to connect instead (sentinel result, MOVED)
  Deadline m_master_checked{};
  std::size_t m_sentinel_first = 0;  // index of the sentinel that answered last: asked first
  std::unique_ptr<Connection> m_conn;
  bool m_learn_server = false;
  // A server or proxy that drops the connection on HELLO or COMMAND (some proxies do) is not probed
  // again after this many failed first requests, so it stays usable.
  static constexpr int k_max_probe_failures = 2;
  int m_probe_failures = 0;
  std::optional<ServerInfo> m_server;
  bool m_repeated = false;
};

}  // namespace fencerun::redis
