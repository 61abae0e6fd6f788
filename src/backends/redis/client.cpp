// The command funnel. hiredis is used only for its RESP formatter and reader, which work on any byte
// stream; the transport (and so every timeout) is ours.
#include "backends/redis/client.hpp"

#include <hiredis/hiredis.h>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "log/log.hpp"
#include "backends/redis/transport.hpp"

namespace fencerun::redis {
namespace {

constexpr int k_max_redirects = 5;

Reply convert(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING: out.type = Reply::Type::string; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_STATUS: out.type = Reply::Type::status; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_ERROR: out.type = Reply::Type::error; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_INTEGER: out.type = Reply::Type::integer; out.integer = r->integer; break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
      break;
    default: out.type = Reply::Type::nil; break;
  }
  return out;
}

void append_command(std::string& payload, std::span<const std::string_view> argv) {
  std::vector<const char*> ptrs;
  std::vector<std::size_t> lens;
  ptrs.reserve(argv.size());
  lens.reserve(argv.size());
  for (auto a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  char* cmd = nullptr;
  int len = ::redisFormatCommandArgv(&cmd, static_cast<int>(argv.size()), ptrs.data(), lens.data());
  if (len < 0) throw std::bad_alloc();
  payload.append(cmd, static_cast<std::size_t>(len));
  ::redisFreeCommand(cmd);
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381" -> the target node.
std::optional<HostPort> redirect_target(const Reply& r) {
  std::string_view s = r.str;
  auto sp1 = s.find(' ');
  if (sp1 == std::string_view::npos) return std::nullopt;
  auto sp2 = s.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return std::nullopt;
  std::string_view addr = s.substr(sp2 + 1);
  auto colon = addr.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(addr.data() + colon + 1, addr.data() + addr.size(), port);
  if (ec != std::errc{} || port == 0 || port > 65535) return std::nullopt;
  return HostPort{std::string(addr.substr(0, colon)), static_cast<std::uint16_t>(port)};
}

RedisEndpoint node_endpoint(const RedisEndpoint& base, const HostPort& at, bool tls) {
  RedisEndpoint node = base;
  node.transport = tls ? RedisEndpoint::Transport::tls : RedisEndpoint::Transport::tcp;
  node.host = at.host;
  node.port = at.port;
  node.sentinels.clear();
  return node;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// A refusal of every command because the connection is not (or could not be) authenticated, as a
// message a person can act on; nullopt for any other reply. Redis answers NOAUTH, or, to a long
// command before AUTH, "ERR Protocol error: unauthenticated multibulk length" (and closes). The
// server's text never holds the password, and neither does ours.
std::optional<std::string> auth_refusal(const Reply& r, std::string_view password_hint, const std::string& user) {
  if (!r.is_error()) return std::nullopt;
  if (r.error_is("NOAUTH") || starts_with(r.str, "ERR Protocol error: unauthenticated"))
    return "the server requires a password: " + std::string(password_hint);
  if (r.error_is("WRONGPASS") || starts_with(r.str, "ERR invalid password") ||
      starts_with(r.str, "ERR invalid username-password pair"))
    return "the server refused the password" + (user.empty() ? std::string() : " of user '" + user + "'") + " (" +
           r.str + ")";
  return std::nullopt;
}

// A refusal the server sent before closing the connection, as the error to report instead of the
// closed or reset connection (which says nothing of why). A "not now" refusal (the client limit) means
// the request did not run; after any other, the failure's own maybe_executed stands.
Error refused_then_closed(const Reply& said, const std::string& where, const Error& failure) {
  if (is_unready(said))
    return Error{Error::Kind::unready, where + " refused the request and closed the connection: " + said.str, false};
  return Error{failure.kind, where + " answered " + said.str + " and closed the connection (" + failure.message + ")",
               failure.maybe_executed};
}

// For failures before the caller's request was written (connect, handshake, discovery).
Error not_sent(Error e) {
  e.maybe_executed = false;
  return e;
}

}  // namespace

bool is_unready(const Reply& reply) {
  return reply.error_is("LOADING") || reply.error_is("BUSY") || reply.error_is("MASTERDOWN") ||
         reply.error_is("CLUSTERDOWN") ||
         (reply.is_error() && starts_with(reply.str, "ERR max number of clients reached"));
}

std::string hiredis_version() {
  return std::to_string(HIREDIS_MAJOR) + "." + std::to_string(HIREDIS_MINOR) + "." + std::to_string(HIREDIS_PATCH);
}

struct Client::Connection {
  std::unique_ptr<Transport> transport;
  struct ReaderDeleter {
    void operator()(redisReader* r) const { ::redisReaderFree(r); }
  };
  std::unique_ptr<redisReader, ReaderDeleter> reader{::redisReaderCreate()};
  std::string where;
  std::string user;                 // for messages only
  std::string_view password_hint;   // where the password the server asks for is set
  bool plain_tcp = false;           // TCP without TLS: a TLS server may be behind it
  bool answered = false;            // any byte arrived from the server yet
  bool probed = false;              // the server probe went out with an earlier request
  bool served = false;              // a request of the caller's was answered on it

  // Writes `payload` and reads `count` replies. Any failure leaves the connection unusable. Once the
  // whole payload is written, every failure is reported as maybe executed.
  Result<std::vector<Reply>> exchange(const std::string& payload, std::size_t count, Deadline deadline) {
    if (auto ok = transport->write_all(payload.data(), payload.size(), deadline); !ok) {
      // The transport knows whether any byte went out. A server that answered and closed before
      // reading (a refusal such as its client limit) makes the write fail with EPIPE or ECONNRESET:
      // what it sent is still readable, and says why.
      if (ok.error().kind == Error::Kind::connection)
        if (auto said = last_words())
          return std::unexpected(refused_then_closed(*said, where, ok.error()));
      return std::unexpected(ok.error());
    }
    auto sent_failure = [](Error e) -> Result<std::vector<Reply>> {
      e.maybe_executed = true;
      return std::unexpected(std::move(e));
    };
    std::vector<Reply> out;
    out.reserve(count);
    char buf[16384];
    while (out.size() < count) {
      void* raw = nullptr;
      if (::redisReaderGetReply(reader.get(), &raw) != REDIS_OK)
        return sent_failure(Error{Error::Kind::protocol, std::string("bad reply from server: ") + reader->errstr});
      if (raw) {
        auto* reply = static_cast<redisReply*>(raw);
        out.push_back(convert(reply));
        ::freeReplyObject(reply);
        // Unauthenticated, the server refuses every command (not run), and may close the
        // connection before the rest are answered: report the refusal, not the closed connection.
        if (auto refusal = auth_refusal(out.back(), password_hint, user))
          return std::unexpected(Error{Error::Kind::auth, std::move(*refusal)});
        continue;
      }
      auto n = transport->read_some(buf, sizeof buf, deadline);
      if (!n) {
        // A TLS server (redis-server, openssl s_server) closes or resets a plain connection without
        // a byte of answer. So may a server going down, hence "may".
        if (plain_tcp && !answered && n.error().kind == Error::Kind::connection)
          n.error().message = "the server closed the connection before answering (" + n.error().message +
                              "): it may expect TLS on this port (try rediss://)";
        // An error reply before the close is the server's reason (its client limit, ...), not the
        // reset the next read met.
        if (n.error().kind == Error::Kind::connection) {
          auto said = std::ranges::find_if(out, [](const Reply& r) { return r.is_error(); });
          if (said != out.end()) {
            Error e = n.error();
            e.maybe_executed = true;
            return std::unexpected(refused_then_closed(*said, where, e));
          }
        }
        return sent_failure(n.error());
      }
      answered = true;
      if (::redisReaderFeed(reader.get(), buf, *n) != REDIS_OK)
        return sent_failure(Error{Error::Kind::protocol, std::string("bad reply from server: ") + reader->errstr});
    }
    return out;
  }

  // The first reply of what the server sent and left unread, without waiting: after a failed write,
  // its reason for closing.
  std::optional<Reply> last_words() {
    char buf[4096];
    for (int reads = 0; reads < 4; ++reads) {
      void* raw = nullptr;
      if (::redisReaderGetReply(reader.get(), &raw) != REDIS_OK) return std::nullopt;
      if (raw) {
        Reply r = convert(static_cast<redisReply*>(raw));
        ::freeReplyObject(raw);
        return r;
      }
      auto n = transport->read_some(buf, sizeof buf, BootClock::now());
      if (!n || ::redisReaderFeed(reader.get(), buf, *n) != REDIS_OK) return std::nullopt;
    }
    return std::nullopt;
  }

  // Whether the server closed this idle connection (or sent something unasked, which would
  // desynchronise it): then it must not carry the next request. Only asked of a connection that
  // served a request (a fresh TLS connection may still have the server's session tickets unread).
  bool closed_by_server() const {
    if (!served) return false;
    if (transport->has_buffered() || reader->len > reader->pos) return true;
    pollfd p{transport->fd(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0;
  }
};

Client::Client(RedisEndpoint endpoint) : m_endpoint(std::move(endpoint)) {}
Client::~Client() = default;
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;

void Client::disconnect() {
  m_conn.reset();
  // A sentinel-managed master may have moved: ask again on the next connect.
  if (m_endpoint.transport == RedisEndpoint::Transport::sentinel) m_node.reset();
}

std::string Client::current_node() const { return m_conn ? m_conn->where : std::string(); }

RedisEndpoint Client::subscriber_endpoint() const {
  if (m_endpoint.transport == RedisEndpoint::Transport::sentinel || !m_node) return m_endpoint;
  return *m_node;
}

Result<std::unique_ptr<Client::Connection>> Client::open_node(const RedisEndpoint& node, bool check_master,
                                                              Deadline deadline, bool sentinel) {
  auto transport = open_transport(node, deadline);
  if (!transport) return std::unexpected(not_sent(transport.error()));
  auto conn = std::make_unique<Connection>();
  if (!conn->reader) throw std::bad_alloc();
  conn->transport = std::move(*transport);
  conn->where = node.transport == RedisEndpoint::Transport::unix_socket
                    ? node.path
                    : node.host + ":" + std::to_string(node.port);
  conn->user = node.user;
  conn->password_hint = sentinel ? "set it in $FENCERUN_SENTINEL_PASSWORD"
                                 : "set it in the URL or in $FENCERUN_REDIS_PASSWORD";
  conn->plain_tcp = node.transport == RedisEndpoint::Transport::tcp;

  // AUTH, SELECT and ROLE go out in one write, each only when needed.
  std::string payload;
  std::size_t replies = 0;
  // A user without a password still authenticates (a `nopass` user accepts any password), so a
  // configured user is never silently replaced by the default one.
  const bool auth = node.password.has_value() || !node.user.empty();
  if (auth) {
    std::string_view password = node.password ? std::string_view(*node.password) : std::string_view();
    if (node.user.empty()) {
      std::string_view argv[] = {"AUTH", password};
      append_command(payload, argv);
    } else {
      std::string_view argv[] = {"AUTH", node.user, password};
      append_command(payload, argv);
    }
    ++replies;
  }
  std::string db = std::to_string(node.db);
  if (node.db != 0) {
    std::string_view argv[] = {"SELECT", db};
    append_command(payload, argv);
    ++replies;
  }
  if (check_master) {
    std::string_view argv[] = {"ROLE"};
    append_command(payload, argv);
    ++replies;
  }
  if (replies == 0) return conn;
  // Whatever happens to the handshake, the caller's request has not been sent yet.
  auto result = conn->exchange(payload, replies, deadline);
  if (!result) return std::unexpected(not_sent(result.error()));
  // LOADING, or the client limit answered to the first command: not now, rather than a wrong password.
  for (const Reply& r : *result)
    if (is_unready(r))
      return std::unexpected(Error{Error::Kind::unready, conn->where + " is not serving now: " + r.str, false});
  std::size_t i = 0;
  if (auth && (*result)[i++].is_error()) {  // the reply text never contains the password
    const Reply& refused = (*result)[i - 1];
    if (refused.str.find("without any password configured") != std::string::npos)
      return std::unexpected(Error{Error::Kind::auth, "a password was given but the server has none set" +
                                                          std::string(node.user.empty() ? "" : " for user '" + node.user + "'") +
                                                          " (" + refused.str + ")"});
    return std::unexpected(Error{Error::Kind::auth, "authentication failed at " + conn->where + ": " + refused.str});
  }
  if (node.db != 0 && (*result)[i++].is_error())
    return std::unexpected(Error{Error::Kind::database, "SELECT " + db + " failed: " + (*result)[i - 1].str +
                                                            " (the database number in the URL)"});
  if (check_master) {
    const Reply& role = (*result)[i++];
    if (!role.is_array() || role.elements.empty() || role.elements[0].str != "master")
      return std::unexpected(Error{Error::Kind::connection, conn->where + " is not a master (ROLE says " +
                                                                (role.is_array() && !role.elements.empty()
                                                                     ? role.elements[0].str
                                                                     : to_display(role)) + ")"});
  }
  return conn;
}

Result<RedisEndpoint> Client::discover_master(Deadline deadline) {
  const std::size_t count = m_endpoint.sentinels.size();
  if (count == 0) return std::unexpected(Error{Error::Kind::connection, "no sentinel configured"});
  std::string failures;  // "host:port: why; ..." for the message when none answers
  Error::Kind last_kind = Error::Kind::connection;
  for (std::size_t tried = 0; tried < count; ++tried) {
    // The sentinel that answered last goes first; the others follow in URL order.
    const std::size_t index = (m_sentinel_first + tried) % count;
    const HostPort& sentinel = m_endpoint.sentinels[index];
    const std::string where = sentinel.host + ":" + std::to_string(sentinel.port);
    const Deadline now = BootClock::now();
    const auto left = time_left(deadline, now);
    if (left <= BootClock::duration::zero()) {
      failures += (failures.empty() ? "" : "; ") + where + ": not asked, no time left";
      last_kind = Error::Kind::timeout;
      break;
    }
    // A sentinel that accepts connections but never answers (stopped, overloaded) may use only its
    // share of what is left, so the ones after it still get time; the floor keeps a share usable on
    // a busy machine, and no share reaches past the caller's deadline.
    const auto share = std::max<BootClock::duration>(left / static_cast<long>(count - tried), k_sentinel_min_share);
    const Deadline until = std::min(deadline, now + share);

    RedisEndpoint s = node_endpoint(m_endpoint, sentinel, m_endpoint.sentinel_tls);
    s.user = m_endpoint.sentinel_user;
    s.password = m_endpoint.sentinel_password;
    s.db = 0;
    auto conn = open_node(s, false, until, /*sentinel=*/true);
    if (!conn) {
      if (conn.error().kind == Error::Kind::auth) return std::unexpected(not_sent(conn.error()));
      failures += (failures.empty() ? "" : "; ") + where + ": " + conn.error().message;
      last_kind = conn.error().kind;
      continue;
    }
    std::string payload;
    std::string_view argv[] = {"SENTINEL", "get-master-addr-by-name", m_endpoint.master_name};
    append_command(payload, argv);
    auto reply = (*conn)->exchange(payload, 1, until);
    if (!reply) {
      failures += (failures.empty() ? "" : "; ") + where + ": " + reply.error().message;
      last_kind = reply.error().kind;
      continue;
    }
    const Reply& r = reply->front();
    if (r.is_array() && r.elements.size() == 2) {
      auto port = r.elements[1].as_integer();
      if (port && *port > 0 && *port <= 65535) {
        m_sentinel_first = index;
        return node_endpoint(m_endpoint, {r.elements[0].str, static_cast<std::uint16_t>(*port)}, m_endpoint.sentinel_tls);
      }
    }
    failures += (failures.empty() ? "" : "; ") + where + ": does not know master '" + m_endpoint.master_name + "'" +
                (r.is_error() ? " (" + r.str + ")" : "");
    last_kind = Error::Kind::connection;
  }
  // None answered: next time start with another one than the one that failed first.
  m_sentinel_first = (m_sentinel_first + 1) % count;
  return std::unexpected(Error{last_kind, "no sentinel answered for master '" + m_endpoint.master_name + "' (" + failures + ")"});
}

Result<void> Client::connect(Deadline deadline) {
  if (m_conn) return {};
  const bool sentinel = m_endpoint.transport == RedisEndpoint::Transport::sentinel;
  if (sentinel && !m_node) {
    auto master = discover_master(deadline);
    if (!master) return std::unexpected(not_sent(master.error()));
    m_node = std::move(*master);
    m_master_checked = BootClock::now();
  }
  auto conn = open_node(m_node ? *m_node : m_endpoint, sentinel, deadline);
  if (!conn) {
    if (sentinel) m_node.reset();
    return std::unexpected(conn.error());
  }
  m_conn = std::move(*conn);
  return {};
}

void Client::recheck_master(Deadline deadline) {
  if (m_endpoint.transport != RedisEndpoint::Transport::sentinel || !m_conn || !m_node) return;
  if (BootClock::now() - m_master_checked < k_sentinel_recheck) return;
  // The re-check is an extra on top of the caller's request: it may use only a small slice of the
  // request's time, so a hung sentinel delays the request a little and never makes it fail.
  const auto slice = std::min<BootClock::duration>(time_left(deadline) / 4, k_sentinel_recheck_slice);
  auto master = discover_master(BootClock::now() + slice);
  m_master_checked = BootClock::now();
  if (!master) return;  // sentinels unreachable: keep talking to the master we know
  if (master->host != m_node->host || master->port != m_node->port) {
    m_conn.reset();
    m_node = std::move(*master);
  }
}

std::string ServerInfo::describe() const {
  return name.empty() ? std::string("an unnamed server") : name + (version.empty() ? "" : " " + version);
}

namespace {

// HELLO 2 (the protocol fencerun speaks anyway) names the server and its version; COMMAND INFO answers
// nil for a command the server does not have (or that was renamed).
const std::string& probe_payload() {
  static const std::string payload = [] {
    std::string p;
    std::string_view hello[] = {"HELLO", "2"};
    std::string_view info[] = {"COMMAND", "INFO", "DELIFEQ", "DELEX"};
    append_command(p, hello);
    append_command(p, info);
    return p;
  }();
  return payload;
}
constexpr std::size_t k_probe_replies = 2;

ServerInfo parse_probe(const Reply& hello, const Reply& info, const std::string& where) {
  ServerInfo s;
  s.where = where;
  if (hello.is_array()) {
    // RESP2: ["server", "redis", "version", "7.0.15", "proto", 2, ...]
    for (std::size_t i = 0; i + 1 < hello.elements.size(); i += 2) {
      if (hello.elements[i].str == "server") s.name = hello.elements[i + 1].str;
      if (hello.elements[i].str == "version") s.version = hello.elements[i + 1].str;
    }
  }
  if (info.is_array() && info.elements.size() == 2) {
    s.delifeq = info.elements[0].is_array();
    s.delex = info.elements[1].is_array();
  }
  return s;
}

}  // namespace

void Client::drop_if_closed_by_server() {
  if (!m_conn || !m_conn->closed_by_server()) return;
  log::event(log::Level::debug, "reconnected",
             "the server closed the idle connection to " + m_conn->where + ": sending on a new one",
             {{"node", m_conn->where}});
  disconnect();
}

Result<std::vector<Reply>> Client::send(std::span<const std::vector<std::string_view>> commands, Deadline deadline,
                                        Resend resend) {
  std::string payload;
  for (const auto& c : commands) append_command(payload, c);
  recheck_master(deadline);
  // An idle timeout on the server (or a middlebox) closed the connection: nothing is sent on it.
  drop_if_closed_by_server();
  bool resent = false;
  m_repeated = false;
  for (int redirects = 0;; ++redirects) {
    const bool reused = m_conn && m_conn->served;  // it served earlier requests
    if (auto ok = connect(deadline); !ok) return std::unexpected(ok.error());
    const bool probe = m_learn_server && !m_conn->probed && m_probe_failures < k_max_probe_failures;
    auto replies = probe ? m_conn->exchange(probe_payload() + payload, commands.size() + k_probe_replies, deadline)
                         : m_conn->exchange(payload, commands.size(), deadline);
    if (!replies) {
      // Closed or garbled after the probe went out: maybe a proxy that does not know HELLO or COMMAND.
      // (A timeout says nothing about the probe: a frozen server answers nothing at all.)
      const auto kind = replies.error().kind;
      if (probe && replies.error().maybe_executed && (kind == Error::Kind::connection || kind == Error::Kind::protocol))
        ++m_probe_failures;
      const std::string where = m_conn->where;
      disconnect();  // a late reply would desynchronise the stream: start afresh next time
      // The connection closed or reset before anything of the request was sent on it, or under a
      // request that is safe to repeat on a connection that served earlier ones (the server closed it
      // between the check above and the write, or a middlebox dropped it): once more on a new one.
      if (!resent && kind == Error::Kind::connection &&
          (!replies.error().maybe_executed || (reused && resend == Resend::idempotent)) &&
          time_left(deadline) > BootClock::duration::zero()) {
        resent = true;
        m_repeated = replies.error().maybe_executed;
        log::event(log::Level::debug, "reconnected",
                   "the connection to " + where + " failed (" + replies.error().message +
                       "): sending the request again on a new one",
                   {{"node", where}});
        --redirects;
        continue;
      }
      return std::unexpected(replies.error());
    }
    m_conn->served = true;
    if (probe) {
      // A server that refused the probe for the moment (BUSY, LOADING) is probed again next time.
      if (!is_unready((*replies)[0]) && !is_unready((*replies)[1])) {
        m_conn->probed = true;
        m_probe_failures = 0;
        m_server = parse_probe((*replies)[0], (*replies)[1], m_conn->where);
      }
      replies->erase(replies->begin(), replies->begin() + k_probe_replies);
    }
    const Reply& first = replies->front();
    if (is_unready(first)) {
      // Not run (a command behind the first may have been, if the state ended in between).
      const bool all = std::ranges::all_of(*replies, [](const Reply& r) { return is_unready(r); });
      Error e{Error::Kind::unready, m_conn->where + " is not serving now: " + first.str, !all};
      if (starts_with(first.str, "ERR max number of clients reached")) disconnect();  // it closes anyway
      return std::unexpected(std::move(e));
    }
    if (first.error_is("TRYAGAIN") && BootClock::now() + std::chrono::milliseconds(25) < deadline) {
      // A multi-key request during a slot migration: refused, not run. Try again shortly.
      ::usleep(25'000);
      --redirects;
      continue;
    }
    if (first.error_is("READONLY") && m_endpoint.transport == RedisEndpoint::Transport::sentinel &&
        redirects < k_max_redirects) {
      // The master we knew was demoted by a failover. The write was refused, so it is safe to ask the
      // sentinels again and send it to the new master.
      disconnect();
      continue;
    }
    bool moved = first.error_is("MOVED"), ask = first.error_is("ASK");
    if (!(moved || ask) || redirects >= k_max_redirects) return replies;
    auto target = redirect_target(first);
    if (!target) return replies;
    bool tls = m_endpoint.transport == RedisEndpoint::Transport::tls;
    if (moved) {
      // The slot lives elsewhere for good: talk to that node from now on.
      m_node = node_endpoint(m_endpoint, *target, tls);
      m_conn.reset();
      continue;
    }
    // ASK: this request only, on the importing node. ASKING covers the next command only, so each
    // command of the request gets its own.
    auto other = open_node(node_endpoint(m_endpoint, *target, tls), false, deadline);
    if (!other) return std::unexpected(other.error());  // not sent: open_node reports it so
    std::string asked;
    std::string_view asking_argv[] = {"ASKING"};
    for (const auto& c : commands) {
      append_command(asked, asking_argv);
      append_command(asked, c);
    }
    auto answer = (*other)->exchange(asked, commands.size() * 2, deadline);
    if (!answer) return std::unexpected(answer.error());
    std::vector<Reply> out;
    out.reserve(commands.size());
    for (std::size_t i = 1; i < answer->size(); i += 2) out.push_back(std::move((*answer)[i]));
    return out;
  }
}

Result<void> Client::subscribe(std::string_view channel, Deadline deadline) {
  std::string_view argv[] = {"SUBSCRIBE", channel};
  auto reply = command(argv, deadline, Resend::idempotent);
  if (!reply) return std::unexpected(reply.error());
  if (!reply->is_array() || reply->elements.empty() || reply->elements[0].str != "subscribe") {
    disconnect();
    return std::unexpected(Error{Error::Kind::protocol, "SUBSCRIBE failed: " + to_display(*reply), true});
  }
  return {};
}

int Client::wake_fd() const { return m_conn ? m_conn->transport->fd() : -1; }

bool Client::has_buffered_messages() const {
  if (!m_conn) return false;
  // Bytes inside the TLS layer or unparsed in the reader are invisible to poll().
  return m_conn->transport->has_buffered() || m_conn->reader->len > m_conn->reader->pos;
}

Result<std::vector<std::string>> Client::drain_messages() {
  if (!m_conn) return std::unexpected(Error{Error::Kind::connection, "not subscribed"});
  std::vector<std::string> messages;
  char buf[4096];
  for (;;) {
    void* raw = nullptr;
    if (::redisReaderGetReply(m_conn->reader.get(), &raw) != REDIS_OK) {
      disconnect();
      return std::unexpected(Error{Error::Kind::protocol, "bad message from server"});
    }
    if (raw) {
      // A published message is ["message", channel, payload]; anything else (a subscription's
      // confirmation) carries nothing to act on.
      const auto* r = static_cast<redisReply*>(raw);
      if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 && r->element[0]->type == REDIS_REPLY_STRING &&
          std::string_view(r->element[0]->str, r->element[0]->len) == "message" &&
          r->element[2]->type == REDIS_REPLY_STRING)
        messages.emplace_back(r->element[2]->str, r->element[2]->len);
      ::freeReplyObject(raw);
      continue;
    }
    // Nothing complete is buffered: read what the socket has, without waiting.
    auto n = m_conn->transport->read_some(buf, sizeof buf, BootClock::now());
    if (!n) {
      if (n.error().kind == Error::Kind::timeout) return messages;
      disconnect();
      return std::unexpected(n.error());
    }
    ::redisReaderFeed(m_conn->reader.get(), buf, *n);
  }
}

Result<Reply> Client::command(std::span<const std::string_view> argv, Deadline deadline, Resend resend) {
  std::vector<std::string_view> one(argv.begin(), argv.end());
  auto replies = send(std::span<const std::vector<std::string_view>>(&one, 1), deadline, resend);
  if (!replies) return std::unexpected(replies.error());
  return std::move(replies->front());
}

Result<std::vector<Reply>> Client::pipeline(std::span<const std::vector<std::string_view>> commands,
                                            Deadline deadline, Resend resend) {
  return send(commands, deadline, resend);
}

}  // namespace fencerun::redis
