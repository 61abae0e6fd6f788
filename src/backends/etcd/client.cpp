#include "backends/etcd/client.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
// Only Beast's message, parser and serializer: not http.hpp, whose stream reads and writes bring in
// Asio's services (static objects initialised at every start-up, etcd or not).
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/string_body.hpp>
#include <charconv>
#include <utility>
#include <nlohmann/json.hpp>

#include "net/transport.hpp"
#include "util/error.hpp"

namespace fencerun::etcd {
namespace {

using nlohmann::json;
namespace beast = boost::beast;
namespace http = boost::beast::http;

// ---- base64, for keys and values (the gateway's bytes fields)

constexpr std::string_view k_b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string b64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    out += {k_b64[v >> 18], k_b64[(v >> 12) & 63], k_b64[(v >> 6) & 63], k_b64[v & 63]};
  }
  if (i + 1 == in.size()) {
    const unsigned v = static_cast<unsigned char>(in[i]) << 16;
    out += {k_b64[v >> 18], k_b64[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8);
    out += {k_b64[v >> 18], k_b64[(v >> 12) & 63], k_b64[(v >> 6) & 63], '='};
  }
  return out;
}

std::optional<std::string> unb64(std::string_view in) {
  std::string out;
  unsigned acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const auto pos = k_b64.find(c);
    if (pos == std::string_view::npos) return std::nullopt;
    acc = (acc << 6) | static_cast<unsigned>(pos);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

// 64-bit numbers come as JSON strings (proto3's JSON mapping); a missing field is zero.
std::int64_t i64(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_number_unsigned()) return static_cast<std::int64_t>(it->get<std::uint64_t>());
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    std::int64_t v = 0;
    std::from_chars(s.data(), s.data() + s.size(), v);
    return v;
  }
  return 0;
}
std::uint64_t u64(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number()) return it->get<std::uint64_t>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    std::uint64_t v = 0;
    std::from_chars(s.data(), s.data() + s.size(), v);
    return v;
  }
  return 0;
}

KeyValue key_value(const json& j) {
  KeyValue kv;
  kv.key = unb64(j.value("key", std::string())).value_or("");
  kv.value = unb64(j.value("value", std::string())).value_or("");
  kv.create_revision = i64(j, "create_revision");
  kv.mod_revision = i64(j, "mod_revision");
  kv.lease = i64(j, "lease");
  return kv;
}

Range range_of(const json& j) {
  Range r;
  if (auto h = j.find("header"); h != j.end()) r.revision = i64(*h, "revision");
  r.count = i64(j, "count");
  if (auto kvs = j.find("kvs"); kvs != j.end() && kvs->is_array())
    for (const auto& kv : *kvs) r.kvs.push_back(key_value(kv));
  return r;
}

json range_json(const RangeRequest& r) {
  json j = {{"key", b64(r.key)}};
  if (!r.range_end.empty()) j["range_end"] = b64(r.range_end);
  if (r.sort != Sort::none) {
    j["sort_target"] = "CREATE";
    j["sort_order"] = r.sort == Sort::create_ascending ? "ASCEND" : "DESCEND";
  }
  if (r.limit > 0) j["limit"] = std::to_string(r.limit);
  if (r.max_create_revision > 0) j["max_create_revision"] = std::to_string(r.max_create_revision);
  return j;
}

std::string lowered(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_auth_message(const std::string& m) {
  const std::string l = lowered(m);
  return l.find("authentication") != std::string::npos || l.find("user name") != std::string::npos ||
         l.find("permission denied") != std::string::npos || l.find("auth token") != std::string::npos ||
         l.find("password") != std::string::npos || l.find("not capable") != std::string::npos;
}

// An answer of etcd's that another member (or a moment later) may not give: no leader now, a leader
// change under the request, a request that timed out inside the cluster, too many requests.
bool is_cluster_unready(const std::string& m, std::int64_t code) {
  const std::string l = lowered(m);
  return code == 14 || code == 4 || l.find("no leader") != std::string::npos ||
         l.find("leader changed") != std::string::npos || l.find("timed out") != std::string::npos ||
         l.find("too many requests") != std::string::npos || l.find("not started") != std::string::npos ||
         l.find("unhealthy") != std::string::npos;
}

std::chrono::milliseconds ms_left(Deadline d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(time_left(d));
}

}  // namespace

std::optional<std::int64_t> http_date_seconds(std::string_view s) {
  // "Www, DD Mon YYYY HH:MM:SS GMT"
  if (s.size() != 29 || s.substr(3, 2) != ", " || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' || s[19] != ':' ||
      s[22] != ':' || s.substr(25) != " GMT")
    return std::nullopt;
  const auto number = [&](std::size_t at, std::size_t n) -> std::optional<int> {
    int v = 0;
    auto [end, ec] = std::from_chars(s.data() + at, s.data() + at + n, v);
    if (ec != std::errc{} || end != s.data() + at + n) return std::nullopt;
    return v;
  };
  constexpr std::string_view months = "JanFebMarAprMayJunJulAugSepOctNovDec";
  const auto m = months.find(s.substr(8, 3));
  const auto d = number(5, 2), y = number(12, 4), hh = number(17, 2), mm = number(20, 2), ss = number(23, 2);
  if (m == std::string_view::npos || m % 3 != 0 || !d || !y || !hh || !mm || !ss || *hh > 23 || *mm > 59 || *ss > 60)
    return std::nullopt;
  const std::chrono::year_month_day ymd{std::chrono::year(*y), std::chrono::month(static_cast<unsigned>(m / 3 + 1)),
                                        std::chrono::day(static_cast<unsigned>(*d))};
  if (!ymd.ok()) return std::nullopt;
  const std::int64_t days = std::chrono::sys_days(ymd).time_since_epoch().count();
  return days * 86400 + *hh * 3600 + *mm * 60 + *ss;
}

std::optional<std::int64_t> clock_apart_us(const MemberClock& c, std::chrono::microseconds bound) {
  // The member read its clock at some instant between sent_us and received_us (this host's clock),
  // and saw a time in [date, date + 1 s). This host is surely ahead by more than `bound` when even
  // the earliest send is past the latest member time by that much; surely behind when the latest
  // receipt is before the earliest member time by that much.
  const std::int64_t earliest = c.date_s * 1'000'000, latest = earliest + 1'000'000;
  const std::int64_t b = bound.count();
  if (c.sent_us - latest <= b && earliest - c.received_us <= b) return std::nullopt;
  // The best single estimate: the middle of both windows.
  return (c.sent_us + c.received_us) / 2 - (earliest + 500'000);
}

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// ---- Client

namespace {

// ---- HTTP/1.1 over the net/ transports: requests written by Beast's serializer, replies read by its
// parser from the bytes the transport hands over. No proxy is ever used: the members are reached as
// the URL names them.

// The Host header's value (and the name a TLS certificate must carry): --tls-server-name when given.
std::string host_header(const EtcdEndpoint& ep, std::size_t i) {
  const auto& m = ep.members[i];
  const std::string& name = ep.tls && !ep.tls_settings.server_name.empty() ? ep.tls_settings.server_name : m.host;
  return (name.find(':') != std::string::npos ? "[" + name + "]" : name) + ":" + std::to_string(m.port);
}

// The bytes of a POST of `body` (JSON) to `path` on member `i`.
std::string post_request(const EtcdEndpoint& ep, std::size_t i, const std::string& path, const std::string& body,
                         const std::optional<std::string>& token) {
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, host_header(ep, i));
  req.set(http::field::content_type, "application/json");
  if (token) req.set(http::field::authorization, *token);
  req.keep_alive(true);
  req.body() = body;
  req.prepare_payload();
  http::request_serializer<http::string_body> sr{req};
  std::string out;
  out.reserve(body.size() + 256);
  beast::error_code ec;
  while (!sr.is_done() && !ec) {
    sr.next(ec, [&](beast::error_code&, const auto& buffers) {
      std::size_t n = 0;
      for (const auto b : beast::buffers_range_ref(buffers)) {
        out.append(static_cast<const char*>(b.data()), b.size());
        n += b.size();
      }
      sr.consume(n);
    });
  }
  return out;
}

// How reading a reply ended.
struct ReadEnd {
  bool ok = false;
  bool got_any = false;            // a byte of the reply arrived
  std::optional<net::Error> fault;  // the transport failed
  std::string bad_http;             // the bytes were not HTTP (the parser's words)
};

// Feeds `parser` from `in` (bytes read but not consumed), then from the transport, until the message
// (or with `header_only`, its header) is complete, bounded by `deadline`.
template <class Parser>
ReadEnd read_message(net::Transport& t, Parser& parser, std::string& in, Deadline deadline, bool header_only = false) {
  ReadEnd end;
  char buf[16384];
  auto complete = [&] { return parser.is_done() || (header_only && parser.is_header_done()); };
  for (;;) {
    while (!in.empty() && !complete()) {
      beast::error_code ec;
      const std::size_t used = parser.put(boost::asio::const_buffer(in.data(), in.size()), ec);
      in.erase(0, used);
      if (ec == http::error::need_more) break;
      if (ec) {
        end.bad_http = ec.message();
        return end;
      }
      if (used == 0) break;
    }
    if (complete()) {
      end.ok = true;
      return end;
    }
    auto n = t.read_some(buf, sizeof buf, deadline);
    if (!n) {
      if (n.error().closed && parser.got_some() && parser.need_eof()) {  // a reply that ends with the connection
        beast::error_code ec;
        parser.put_eof(ec);
        if (!ec) {
          end.ok = true;
          return end;
        }
      }
      end.fault = std::move(n.error());
      return end;
    }
    end.got_any = true;
    in.append(buf, *n);
  }
}

// Whether an idle connection was closed by the member (or holds bytes nobody asked for): then it must
// not carry the next request.
bool idle_connection_closed(const net::Transport& t) {
  if (t.has_buffered()) return true;
  pollfd p{t.fd(), POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0;
}

// Opens a connection to member `i`: TCP, then TLS for etcds:// (the member's host, or
// --tls-server-name, verified and sent as SNI; ALPN offers HTTP/1.1, which the gateway serves).
Result<std::unique_ptr<net::Transport>> connect_member(const EtcdEndpoint& ep, std::size_t i, Deadline deadline) {
  const auto& m = ep.members[i];
  net::Address address{m.host, m.port, {}};
  auto fd = net::connect_socket(address, deadline);
  if (!fd) {
    const bool timeout = fd.error().kind == net::Error::Kind::timeout;
    return std::unexpected(Error{timeout ? Error::Kind::timeout : Error::Kind::unavailable, fd.error().message, false});
  }
  if (!ep.tls) return net::plain_transport(std::move(*fd));
  const net::TlsOptions options{ep.tls_settings, "etcd://", "http/1.1"};
  auto t = net::open_tls_transport(std::move(*fd), m.host, options, deadline);
  if (!t) {
    const bool timeout = t.error().kind == net::Error::Kind::timeout;
    return std::unexpected(
        Error{timeout ? Error::Kind::timeout : Error::Kind::unavailable, "TLS: " + t.error().message, false});
  }
  return std::move(*t);
}

}  // namespace

struct Client::Impl {
  std::vector<std::optional<std::string>> tokens;  // per member: the auth token (simple tokens are a member's own)
  std::optional<MemberClock> clock;                // of the last reply that had a Date
  // Per member: the keep-alive connection, kept for the run, and whether it answered a request.
  std::vector<std::unique_ptr<net::Transport>> connections;
  std::vector<bool> served;
};

namespace {

// One POST to member `i`: the reply's JSON, or the error of this attempt. `retry`: another member may
// do better.
struct Attempt {
  std::optional<json> reply;
  Error error{Error::Kind::unavailable, ""};
  bool retry = false;
  std::optional<MemberClock> clock;  // the member's Date, when its reply had one
};

struct HttpReply {
  unsigned status = 0;
  std::string body;
  std::optional<std::int64_t> date_s;  // the Date header, Unix seconds
  std::int64_t sent_us = 0;            // this host's wall clock when the request went out
  std::int64_t received_us = 0;        // and when the reply was read
};

std::int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The HTTP exchange with member `i` on its connection (opened now, or kept from an earlier request). A
// kept connection that turns out closed before a byte of the reply came is replaced once: the member
// did not run the request.
Result<HttpReply> exchange(Client::Impl& impl, const EtcdEndpoint& ep, std::size_t i, const std::string& request,
                           Deadline deadline, std::chrono::milliseconds budget) {
  auto& conn = impl.connections[i];
  for (int round = 0;; ++round) {
    if (conn && impl.served[i] && idle_connection_closed(*conn)) conn.reset();
    const bool reused = conn != nullptr;
    if (!conn) {
      auto opened = connect_member(ep, i, deadline);
      if (!opened) {
        if (opened.error().kind == Error::Kind::timeout && opened.error().message.find("TLS") == std::string::npos)
          opened.error().message = "no answer within " + std::to_string(budget.count()) + "ms (" +
                                   opened.error().message + ")";
        return std::unexpected(opened.error());
      }
      conn = std::move(*opened);
      impl.served[i] = false;
    }
    auto drop = [&] {
      conn.reset();
      impl.served[i] = false;
    };
    const std::int64_t sent_us = wall_us();
    if (auto w = conn->write_all(request.data(), request.size(), deadline); !w) {
      drop();
      if (reused && round == 0 && w.error().kind == net::Error::Kind::connection) continue;
      const bool timeout = w.error().kind == net::Error::Kind::timeout;
      return std::unexpected(Error{timeout ? Error::Kind::timeout : Error::Kind::unavailable,
                                   timeout ? "no answer within " + std::to_string(budget.count()) + "ms"
                                           : w.error().message,
                                   w.error().maybe_executed});
    }
    http::response_parser<http::string_body> parser;
    parser.eager(true);
    parser.body_limit(64u << 20);
    std::string in;
    ReadEnd end = read_message(*conn, parser, in, deadline);
    if (end.ok) {
      const bool keep = parser.get().keep_alive() && in.empty();
      const auto date = parser.get().find(http::field::date);
      HttpReply reply{parser.get().result_int(), std::move(parser.get().body()),
                      date == parser.get().end()
                          ? std::nullopt
                          : http_date_seconds(std::string_view(date->value().data(), date->value().size())),
                      sent_us, wall_us()};
      if (keep) impl.served[i] = true;
      else drop();
      return reply;
    }
    drop();
    if (end.fault && !end.got_any && reused && round == 0 && end.fault->closed) continue;
    if (!end.bad_http.empty())
      return std::unexpected(Error{Error::Kind::protocol, "not an etcd server (" + end.bad_http + ")", true});
    if (end.fault->kind == net::Error::Kind::timeout)
      return std::unexpected(Error{Error::Kind::timeout, "no answer within " + std::to_string(budget.count()) + "ms", true});
    if (!end.got_any && end.fault->closed)
      return std::unexpected(Error{Error::Kind::protocol, "no HTTP answer: not an etcd client port?", true});
    return std::unexpected(Error{Error::Kind::unavailable, end.fault->message, true});
  }
}

Attempt post(Client::Impl& impl, const EtcdEndpoint& ep, std::size_t i, const std::string& path, const std::string& body,
             const std::optional<std::string>& token, std::chrono::milliseconds budget) {
  Attempt a;
  budget = std::max(budget, std::chrono::milliseconds(1));
  auto got = exchange(impl, ep, i, post_request(ep, i, path, body, token), BootClock::now() + budget, budget);
  if (!got) {
    a.retry = true;
    a.error = got.error();
    return a;
  }
  const unsigned status = got->status;
  if (got->date_s) a.clock = MemberClock{i, *got->date_s, got->sent_us, got->received_us};
  json reply = json::parse(got->body, nullptr, false);
  if (reply.is_discarded() || !reply.is_object()) {
    a.retry = true;
    a.error = {Error::Kind::protocol, "not an etcd server (HTTP " + std::to_string(status) + ", not etcd's JSON)",
               true};
    return a;
  }
  if (auto e = reply.find("error"); e != reply.end()) {
    const std::string message =
        e->is_string() ? e->get<std::string>() : reply.value("message", std::string("error without a message"));
    const std::int64_t code = i64(reply, "code");
    if (code == 5) {  // NotFound: the caller's answer ("requested lease not found")
      a.reply = std::move(reply);
      return a;
    }
    if (is_auth_message(message)) {
      a.error = {Error::Kind::auth, "authentication: " + message, false};
      return a;
    }
    if (is_cluster_unready(message, code)) {
      a.retry = true;
      a.error = {lowered(message).find("timed out") != std::string::npos ? Error::Kind::timeout : Error::Kind::busy,
                 message, true};
      return a;
    }
    a.error = {Error::Kind::protocol, message, true};
    return a;
  }
  if (status != 200) {
    a.retry = true;
    a.error = {Error::Kind::protocol, "not an etcd server (HTTP " + std::to_string(status) + ")", true};
    return a;
  }
  a.reply = std::move(reply);
  return a;
}

}  // namespace

Client::Client(const EtcdEndpoint& endpoint) : m_endpoint(endpoint), m_impl(std::make_unique<Impl>()) {
  m_impl->tokens.resize(m_endpoint.members.size());
  m_impl->connections.resize(m_endpoint.members.size());
  m_impl->served.resize(m_endpoint.members.size());
}

Client::~Client() = default;

std::string Client::member_name(std::size_t member) const {
  const auto& m = m_endpoint.members.at(member);
  return (m.host.find(':') != std::string::npos ? "[" + m.host + "]" : m.host) + ":" + std::to_string(m.port);
}

namespace {

// The whole exchange with the cluster for one request: every member at most once, from the current one
// on, each given an equal share of the time left.
struct Call {
  Client::Impl& impl;
  const EtcdEndpoint& ep;
  std::atomic<std::size_t>& current;
  bool& repeated;

  Result<json> operator()(const std::string& path, const json& body, Deadline deadline,
                          std::optional<std::size_t> only = std::nullopt) {
    const std::string text = body.dump();
    const std::size_t n = only ? 1 : ep.members.size();
    const std::size_t first = only ? *only : current.load();
    repeated = false;
    std::string failures;
    Error last{Error::Kind::unavailable, "no member tried", false};
    bool sent_before = false;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = (first + k) % ep.members.size();
      const auto left = ms_left(deadline);
      if (left <= std::chrono::milliseconds::zero()) {
        if (k == 0) last = Error{Error::Kind::timeout, "no time left for the request", false};
        break;
      }
      const auto budget = left / static_cast<long>(n - k);
      if (auto ok = authenticate(i, deadline, budget); !ok) {
        last = ok.error();
        if (last.kind == Error::Kind::auth) return std::unexpected(last);
        failures += (failures.empty() ? "" : "; ") + name(i) + ": " + last.message;
        continue;
      }
      if (sent_before) repeated = true;
      Attempt a = post(impl, ep, i, path, text, impl.tokens[i], budget);
      if (!a.reply && a.error.kind == Error::Kind::auth && impl.tokens[i] &&
          lowered(a.error.message).find("token") != std::string::npos) {
        // A member's token expires (--auth-token-ttl): authenticate again once.
        impl.tokens[i].reset();
        if (auto ok = authenticate(i, deadline, std::max(ms_left(deadline) / 2, std::chrono::milliseconds(1))); !ok)
          return std::unexpected(ok.error());
        a = post(impl, ep, i, path, text, impl.tokens[i], std::max(ms_left(deadline), std::chrono::milliseconds(1)));
      }
      sent_before = sent_before || a.error.maybe_executed || a.reply.has_value();
      if (a.reply) {
        current.store(i);
        if (a.clock) impl.clock = a.clock;
        return std::move(*a.reply);
      }
      last = a.error;
      last.maybe_executed = sent_before;
      if (!a.retry) return std::unexpected(last);
      failures += (failures.empty() ? "" : "; ") + name(i) + ": " + a.error.message;
    }
    // The next request starts with the member after the one that failed last.
    if (!only) current.store((first + 1) % ep.members.size());
    if (n > 1) last.message = "no member answered (" + failures + ")";
    else if (!failures.empty()) last.message = failures;
    return std::unexpected(last);
  }

  std::string name(std::size_t i) const {
    const auto& m = ep.members[i];
    return (m.host.find(':') != std::string::npos ? "[" + m.host + "]" : m.host) + ":" + std::to_string(m.port);
  }

  Result<void> authenticate(std::size_t i, Deadline deadline, std::chrono::milliseconds budget) {
    if (ep.user.empty() || impl.tokens[i]) return {};
    const json body = {{"name", ep.user}, {"password", ep.password.value_or("")}};
    Attempt a = post(impl, ep, i, "/v3/auth/authenticate", body.dump(), std::nullopt,
                     std::min(budget, std::max(ms_left(deadline), std::chrono::milliseconds(1))));
    if (!a.reply) return std::unexpected(a.error);
    if (a.reply->contains("error") || !a.reply->contains("token"))
      return std::unexpected(Error{Error::Kind::auth, "authentication failed for user '" + ep.user + "'", false});
    impl.tokens[i] = a.reply->value("token", std::string());
    return {};
  }
};

bool not_found(const json& j) { return j.contains("error") && i64(j, "code") == 5; }

}  // namespace

Result<Grant> Client::grant(std::int64_t ttl_seconds, Deadline deadline, std::int64_t id) {
  std::lock_guard g(m_mutex);
  json body = {{"TTL", std::to_string(ttl_seconds)}};
  if (id != 0) body["ID"] = std::to_string(id);
  auto r = Call{*m_impl, m_endpoint, m_current, m_repeated}("/v3/lease/grant", body, deadline);
  if (!r) {
    // A request of an earlier member that timed out may have granted it: the id is ours either way.
    if (id != 0 && r.error().message.find("lease already exists") != std::string::npos) return Grant{id, 0, true};
    return std::unexpected(r.error());
  }
  if (r->contains("error") || i64(*r, "ID") == 0)
    return std::unexpected(Error{Error::Kind::protocol, "the lease was not granted: " + r->dump(), true});
  return Grant{i64(*r, "ID"), i64(*r, "TTL")};
}

Result<std::optional<std::int64_t>> Client::keep_alive(std::int64_t lease, Deadline deadline) {
  std::lock_guard g(m_mutex);
  auto r = Call{*m_impl, m_endpoint, m_current, m_repeated}("/v3/lease/keepalive", {{"ID", std::to_string(lease)}},
                                                            deadline);
  if (!r) return std::unexpected(r.error());
  if (not_found(*r)) return std::optional<std::int64_t>();
  auto result = r->find("result");
  if (result == r->end() || !result->is_object())
    return std::unexpected(Error{Error::Kind::protocol, "unexpected keep-alive answer", true});
  const std::int64_t ttl = i64(*result, "TTL");
  if (ttl <= 0) return std::optional<std::int64_t>();
  return std::optional<std::int64_t>(ttl);
}

Result<bool> Client::revoke(std::int64_t lease, Deadline deadline) {
  std::lock_guard g(m_mutex);
  auto r = Call{*m_impl, m_endpoint, m_current, m_repeated}("/v3/lease/revoke", {{"ID", std::to_string(lease)}},
                                                            deadline);
  if (!r) return std::unexpected(r.error());
  return !not_found(*r);
}

Result<std::optional<std::int64_t>> Client::time_to_live(std::int64_t lease, Deadline deadline) {
  std::lock_guard g(m_mutex);
  auto r = Call{*m_impl, m_endpoint, m_current, m_repeated}("/v3/lease/timetolive",
                                                            {{"ID", std::to_string(lease)}}, deadline);
  if (!r) return std::unexpected(r.error());
  if (not_found(*r)) return std::optional<std::int64_t>();
  const std::int64_t ttl = i64(*r, "TTL");
  if (ttl < 0) return std::optional<std::int64_t>();
  return std::optional<std::int64_t>(ttl);
}

Result<Range> Client::range(const RangeRequest& request, Deadline deadline) {
  std::lock_guard g(m_mutex);
  auto r = Call{*m_impl, m_endpoint, m_current, m_repeated}("/v3/kv/range", range_json(request), deadline);
  if (!r) return std::unexpected(r.error());
  return range_of(*r);
}

Result<Enqueued> Client::enqueue(const std::string& key, const std::string& value, std::int64_t lease,
                                 const std::string& base_key, const std::string& base_value,
                                 const std::string& prefix, Deadline deadline) {
  RangeRequest first{prefix, prefix_end(prefix), Sort::create_ascending, 1, 0};
  const json create_base = {
      {"request_txn",
       {{"compare", json::array({{{"target", "CREATE"}, {"key", b64(base_key)}, {"create_revision", "0"}}})},
        {"success", json::array({{{"request_put", {{"key", b64(base_key)}, {"value", b64(base_value)}}}}})}}}};
  const json body = {
      {"compare", json::array({{{"target", "CREATE"}, {"key", b64(key)}, {"create_revision", "0"}}})},
      {"success",
       json::array({{{"request_put", {{"key", b64(key)}, {"value", b64(value)}, {"lease", std::to_string(lease)}}}},
                    create_base,
                    {{"request_range", range_json(single(key))}},
                    {{"request_range", range_json(single(base_key))}},
                    {{"request_range", range_json(first)}}})},
      // Already there: an earlier attempt of this request ran (its answer was lost).
      {"failure", json::array({create_base,
                               {{"request_range", range_json(single(key))}},
                               {{"request_range", range_json(single(base_key))}},
                               {{"request_range", range_json(first)}}})}};
  std::lock_guard g(m_mutex);
  auto r = Call{*m_impl, m_endpoint, m_current, m_repeated}("/v3/kv/txn", body, deadline);
  if (!r) return std::unexpected(r.error());
  const auto bad = [&](const std::string& why) {
    return std::unexpected(Error{Error::Kind::protocol, "unexpected transaction answer: " + why, true});
  };
  auto responses = r->find("responses");
  if (responses == r->end() || !responses->is_array() || responses->size() < 4) return bad("too few responses");
  const auto& rs = *responses;
  const std::size_t off = r->value("succeeded", false) ? 2 : 1;
  if (rs.size() != off + 3) return bad("wrong number of responses");
  auto read = [&](std::size_t i) -> std::optional<Range> {
    auto it = rs[i].find("response_range");
    if (it == rs[i].end()) return std::nullopt;
    return range_of(*it);
  };
  auto own = read(off), base = read(off + 1), head = read(off + 2);
  if (!own || !base || !head) return bad("a range is missing");
  if (own->kvs.size() != 1 || own->kvs.front().lease != lease) return bad("the key is not ours");
  if (base->kvs.size() != 1) return bad("the base is missing");
  Enqueued e;
  e.revision = r->contains("header") ? i64((*r)["header"], "revision") : 0;
  e.own = own->kvs.front();
  e.base = base->kvs.front().value;
  if (!head->kvs.empty()) e.first = head->kvs.front();
  return e;
}

namespace {

json compare_json(const Compare& c) {
  const bool create = c.target == Compare::Target::create_revision;
  json j = {{"target", create ? "CREATE" : "MOD"},
            {"result", c.not_equal ? "NOT_EQUAL" : "EQUAL"},
            {"key", b64(c.key)},
            {create ? "create_revision" : "mod_revision", std::to_string(c.revision)}};
  if (!c.range_end.empty()) j["range_end"] = b64(c.range_end);
  return j;
}

json op_json(const Op& op) {
  switch (op.kind) {
    case Op::Kind::txn: {
      json compare = json::array(), success = json::array(), failure = json::array();
      for (const auto& c : op.txn->compare) compare.push_back(compare_json(c));
      for (const auto& o : op.txn->success) success.push_back(op_json(o));
      for (const auto& o : op.txn->failure) failure.push_back(op_json(o));
      return {{"request_txn", {{"compare", compare}, {"success", success}, {"failure", failure}}}};
    }
    case Op::Kind::put: {
      json put = {{"key", b64(op.key)}, {"value", b64(op.value)}};
      if (op.lease != 0) put["lease"] = std::to_string(op.lease);
      return {{"request_put", put}};
    }
    case Op::Kind::remove: return {{"request_delete_range", {{"key", b64(op.key)}}}};
    case Op::Kind::range: return {{"request_range", range_json(op.range)}};
  }
  return json::object();
}

}  // namespace

Result<TxnResult> Client::txn(const TxnRequest& request, Deadline deadline) {
  json compare = json::array();
  for (const auto& c : request.compare) compare.push_back(compare_json(c));
  json success = json::array(), failure = json::array();
  for (const auto& op : request.success) success.push_back(op_json(op));
  for (const auto& op : request.failure) failure.push_back(op_json(op));
  json body = {{"success", success}, {"failure", failure}};
  if (!compare.empty()) body["compare"] = compare;
  std::lock_guard g(m_mutex);
  auto r = Call{*m_impl, m_endpoint, m_current, m_repeated}("/v3/kv/txn", body, deadline);
  if (!r) return std::unexpected(r.error());
  TxnResult t;
  if (not_found(*r)) {  // "requested lease not found": the whole transaction was refused
    t.lease_missing = true;
    return t;
  }
  t.succeeded = r->value("succeeded", false);
  if (auto h = r->find("header"); h != r->end()) t.revision = i64(*h, "revision");
  const auto& ops = t.succeeded ? request.success : request.failure;
  auto responses = r->find("responses");
  const std::size_t n = responses != r->end() && responses->is_array() ? responses->size() : 0;
  if (n != ops.size())
    return std::unexpected(Error{Error::Kind::protocol, "unexpected transaction answer: " + std::to_string(n) +
                                                            " responses for " + std::to_string(ops.size()) + " ops",
                                 true});
  t.ranges.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (ops[i].kind != Op::Kind::range) continue;
    auto it = (*responses)[i].find("response_range");
    if (it == (*responses)[i].end())
      return std::unexpected(Error{Error::Kind::protocol, "unexpected transaction answer: a range is missing", true});
    t.ranges[i] = range_of(*it);
  }
  return t;
}

Result<MemberStatus> Client::member_status(std::size_t member, Deadline deadline) {
  std::lock_guard g(m_mutex);
  auto r = Call{*m_impl, m_endpoint, m_current, m_repeated}("/v3/maintenance/status", json::object(), deadline,
                                                            member);
  if (!r) return std::unexpected(r.error());
  MemberStatus s;
  s.version = r->value("version", std::string());
  s.leader = u64(*r, "leader");
  s.raft_term = u64(*r, "raftTerm");
  if (auto h = r->find("header"); h != r->end()) {
    s.member_id = u64(*h, "member_id");
    s.cluster_id = u64(*h, "cluster_id");
  }
  if (s.version.empty()) return std::unexpected(Error{Error::Kind::protocol, "not an etcd server (no version)", true});
  return s;
}

std::optional<MemberClock> Client::last_member_clock() {
  std::lock_guard g(m_mutex);
  return m_impl->clock;
}

Result<std::optional<std::string>> Client::auth_token(std::size_t member, Deadline deadline, bool renew) {
  if (m_endpoint.user.empty()) return std::optional<std::string>();
  // Bounded: the main thread or the renewals may hold the client for a request of theirs.
  std::unique_lock g(m_mutex, std::defer_lock);
  if (!g.try_lock_until(std::chrono::steady_clock::now() + time_left(deadline)))
    return std::unexpected(Error{Error::Kind::timeout, "the client was busy", false});
  if (renew) m_impl->tokens[member].reset();
  Call call{*m_impl, m_endpoint, m_current, m_repeated};
  if (auto ok = call.authenticate(member, deadline, std::max(ms_left(deadline), std::chrono::milliseconds(1))); !ok)
    return std::unexpected(ok.error());
  return m_impl->tokens[member];
}

Result<Client::StreamTarget> Client::stream_target(const std::string& path, Deadline deadline) {
  const std::size_t i = m_current.load();
  auto token = auth_token(i, deadline);
  if (!token) return std::unexpected(token.error());
  StreamTarget t;
  t.url = member_base(m_endpoint, i) + path;
  t.headers = {"Content-Type: application/json"};
  if (*token) t.headers.push_back("Authorization: " + **token);
  return t;
}

// ---- Watch

struct Watch::Impl {
  UniqueFd wake;  // written by stop()
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> deleted_revision{0};
  std::chrono::milliseconds check_every{1000};
  std::mutex mutex;   // guards `active`
  int active = -1;    // the socket of the stream being read (stop() shuts it down)
};

Watch::Watch(Client& client, std::string key, std::int64_t start_revision, std::chrono::milliseconds timeout,
             std::function<void(State)> on_end, std::chrono::milliseconds check_every)
    : m_client(client), m_key(std::move(key)), m_start(start_revision), m_timeout(timeout), m_on_end(std::move(on_end)),
      m_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), m_impl(std::make_unique<Impl>()) {
  if (!m_fd) throw SystemError("eventfd");
  m_impl->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!m_impl->wake) throw SystemError("eventfd");
  if (m_timeout <= std::chrono::milliseconds::zero()) m_timeout = std::chrono::milliseconds(1000);
  m_impl->check_every = check_every > std::chrono::milliseconds::zero()
                            ? check_every
                            : std::min(m_timeout, std::chrono::milliseconds(1000));
  try {
    m_thread = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    throw SystemError("cannot start the watch thread", e.code().value());
  }
}

Watch::~Watch() { stop(); }

void Watch::stop() {
  m_impl->stop.store(true);
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(m_impl->wake.get(), &one, sizeof one);
  {
    std::lock_guard g(m_impl->mutex);
    if (m_impl->active >= 0) ::shutdown(m_impl->active, SHUT_RDWR);
  }
  if (m_thread.joinable()) m_thread.join();
}

std::string Watch::error() const {
  std::lock_guard g(m_mutex);
  return m_error;
}

std::int64_t Watch::deleted_revision() const { return m_impl->deleted_revision.load(); }

void Watch::finish(State state, std::string error) {
  {
    std::lock_guard g(m_mutex);
    if (m_state.load() != State::watching) return;
    m_error = std::move(error);
    m_state.store(state);
  }
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(m_fd.get(), &one, sizeof one);
  if (m_on_end) m_on_end(state);
}

namespace {

// How one stream (one connection to one member) ended.
struct StreamEnd {
  enum class Kind {
    deleted,   // the key's DELETE arrived
    canceled,  // etcd canceled the watch (its start revision compacted): final
    refused,   // the credentials were refused: final
    broken,    // the member did not answer, or the stream broke: watch through another member
    moved,     // the client moved to another member: watch through it
    stopped,   // stop()
  };
  Kind kind;
  std::string error;
  bool created = false;  // etcd confirmed the watch on this stream
};

}  // namespace

void Watch::run() {
  const EtcdEndpoint& ep = m_client.endpoint();
  const std::size_t members = ep.members.size();
  std::int64_t last = m_start - 1;  // every event up to this revision was seen
  std::size_t member = m_client.current_member();
  std::size_t failures = 0;  // streams in a row that were never confirmed
  std::string why;
  bool stale_token = false;  // a stream said the token expired: authenticate again first

  // One stream from member `i`, from `last` + 1 on, until it ends.
  auto stream = [&](std::size_t i) -> StreamEnd {
    using Kind = StreamEnd::Kind;
    const auto opened = BootClock::now();
    const Deadline open_deadline = opened + m_timeout;
    const std::size_t client_member = m_client.current_member();
    std::optional<std::string> token;
    bool renewed = std::exchange(stale_token, false);
  again:
    if (auto t = m_client.auth_token(i, open_deadline, renewed); !t) {
      if (t.error().kind == Error::Kind::auth) return {Kind::refused, t.error().message};
      return {Kind::broken, m_client.member_name(i) + ": " + t.error().message};
    } else {
      token = *t;
    }
    if (m_impl->stop.load()) return {Kind::stopped, {}};
    auto conn = connect_member(ep, i, open_deadline);
    if (!conn) return {Kind::broken, m_client.member_name(i) + ": " + conn.error().message};
    struct Active {  // stop() may shut the socket down while this stream is read
      Impl& impl;
      Active(Impl& im, int fd) : impl(im) {
        std::lock_guard g(impl.mutex);
        impl.active = fd;
      }
      ~Active() {
        std::lock_guard g(impl.mutex);
        impl.active = -1;
      }
    } active(*m_impl, (*conn)->fd());
    if (m_impl->stop.load()) return {Kind::stopped, {}};
    const json body = {{"create_request",
                        {{"key", b64(m_key)}, {"start_revision", std::to_string(last + 1)}, {"progress_notify", true}}}};
    const std::string request = post_request(ep, i, "/v3/watch", body.dump(), token);
    if (auto w = (*conn)->write_all(request.data(), request.size(), open_deadline); !w)
      return {Kind::broken, m_client.member_name(i) + ": " + w.error().message};

    // The reply is a chunked stream of JSON messages, one a line.
    http::response_parser<http::string_body> parser;
    parser.body_limit(boost::none);
    std::string lines;
    auto on_chunk = [&lines](std::uint64_t, beast::string_view data, beast::error_code&) -> std::size_t {
      lines.append(data.data(), data.size());
      return data.size();
    };
    parser.on_chunk_body(on_chunk);
    std::string in;
    ReadEnd head = read_message(**conn, parser, in, open_deadline, true);
    if (m_impl->stop.load()) return {Kind::stopped, {}};
    if (!head.ok) {
      const std::string what = !head.bad_http.empty() ? "not an etcd server (" + head.bad_http + ")"
                               : head.fault->kind == net::Error::Kind::timeout
                                   ? "no answer within " + std::to_string(m_timeout.count()) + "ms"
                                   : head.fault->message;
      return {Kind::broken, m_client.member_name(i) + ": watch: " + what};
    }
    if (parser.get().result_int() != 200) {
      // An error's JSON (the token expired, say), read within what is left of the time to open.
      ReadEnd rest = read_message(**conn, parser, in, open_deadline);
      const std::string text = rest.ok ? parser.get().body() + lines : std::string();
      const json e = json::parse(text, nullptr, false);
      const std::string message = e.is_object() && e.contains("error") && e["error"].is_string()
                                      ? e["error"].get<std::string>()
                                      : "HTTP " + std::to_string(parser.get().result_int());
      if (is_auth_message(message) && token && !renewed && lowered(message).find("token") != std::string::npos) {
        renewed = true;  // a member's token expires (--auth-token-ttl): authenticate again once
        goto again;
      }
      if (is_auth_message(message)) return {Kind::refused, "authentication: " + message};
      return {Kind::broken, m_client.member_name(i) + ": watch: " + message};
    }

    StreamEnd end{Kind::broken, {}};
    // One message: false ends the stream (`end` says why).
    auto on_message = [&](const std::string& line) -> bool {
      const json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        end = {Kind::broken, m_client.member_name(i) + ": the watch stream is not etcd's JSON", end.created};
        return false;
      }
      if (auto e = j.find("error"); e != j.end()) {
        const std::string message =
            e->is_object() ? e->value("message", e->dump()) : e->is_string() ? e->get<std::string>() : e->dump();
        // An expired token (--auth-token-ttl) is told in the stream: the next stream authenticates again.
        if (is_auth_message(message) && lowered(message).find("token") != std::string::npos) stale_token = true;
        end = {Kind::broken, m_client.member_name(i) + ": watch: " + message, end.created};
        return false;
      }
      const json& result = j.contains("result") ? j["result"] : j;
      if (result.value("canceled", false) || i64(result, "compact_revision") > 0) {
        std::string reason = result.value("cancel_reason", std::string());
        if (const auto compacted = i64(result, "compact_revision"); compacted > 0)
          reason = "revision " + std::to_string(last + 1) + " is compacted (compact revision " +
                   std::to_string(compacted) + ")";
        end = {Kind::canceled, "the watch was canceled: " + (reason.empty() ? std::string("by etcd") : reason),
               end.created};
        return false;
      }
      if (result.value("created", false)) {
        end.created = true;  // its header's revision says nothing of the events still to come
      } else if (auto h = result.find("header"); h != result.end()) {
        last = std::max(last, i64(*h, "revision"));
      }
      if (auto events = result.find("events"); events != result.end() && events->is_array())
        for (const auto& e : *events) {
          const std::int64_t revision = e.contains("kv") ? i64(e["kv"], "mod_revision") : 0;
          last = std::max(last, revision);
          if (e.value("type", std::string()) == "DELETE") {
            m_impl->deleted_revision.store(revision);
            end = {Kind::deleted, {}, true};
            return false;
          }
        }
      return true;
    };
    auto take_lines = [&]() -> bool {
      for (;;) {
        const auto nl = lines.find('\n');
        if (nl == std::string::npos) return true;
        std::string line = lines.substr(0, nl);
        lines.erase(0, nl + 1);
        if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
        if (!on_message(line)) return false;
      }
    };
    // A reply with a Content-Length (not a stream): its body is the messages.
    char buf[16384];
    for (;;) {
      if (!take_lines()) return end;
      if (end.created) failures = 0;
      if (parser.is_done()) {
        lines += parser.get().body();
        parser.get().body().clear();
        if (!take_lines()) return end;
        return {Kind::broken, m_client.member_name(i) + ": the watch stream ended", end.created};
      }
      if (!(*conn)->has_buffered()) {
        pollfd p[2] = {{(*conn)->fd(), POLLIN, 0}, {m_impl->wake.get(), POLLIN, 0}};
        const int n = ::poll(p, 2, static_cast<int>(m_impl->check_every.count()));
        if (m_impl->stop.load()) return {Kind::stopped, {}};
        if (n == 0) {
          // The renewals go through the client: when it left the member it had (and this stream's),
          // that member stopped answering in time. Watch through the one it uses now.
          const std::size_t now = m_client.current_member();
          if (now != client_member && now != i)
            return {Kind::moved, m_client.member_name(i) + " left for " + m_client.member_name(now), end.created};
          continue;
        }
        if (n < 0) continue;  // EINTR
      }
      auto got = (*conn)->read_some(buf, sizeof buf, BootClock::now() + m_timeout);
      if (m_impl->stop.load()) return {Kind::stopped, {}};
      if (!got) return {Kind::broken, m_client.member_name(i) + ": watch: " + got.error().message, end.created};
      in.append(buf, *got);
      while (!in.empty() && !parser.is_done()) {
        beast::error_code ec;
        const std::size_t used = parser.put(boost::asio::const_buffer(in.data(), in.size()), ec);
        in.erase(0, used);
        if (ec == http::error::need_more) break;
        if (ec) return {Kind::broken, m_client.member_name(i) + ": watch: " + ec.message(), end.created};
        if (used == 0) break;
      }
    }
  };

  while (!m_impl->stop.load()) {
    StreamEnd end = stream(member);
    switch (end.kind) {
      case StreamEnd::Kind::stopped: return;
      case StreamEnd::Kind::deleted: return finish(State::deleted);
      case StreamEnd::Kind::canceled:
      case StreamEnd::Kind::refused: return finish(State::failed, end.error);
      case StreamEnd::Kind::moved:
        failures = 0;
        member = m_client.current_member();
        continue;
      case StreamEnd::Kind::broken: break;
    }
    why = end.error;
    if (end.created) failures = 0;
    if (++failures >= members) return finish(State::failed, why.empty() ? "the watch stream ended" : why);
    // Another member: the client's, unless that is the one that just failed.
    const std::size_t now = m_client.current_member();
    member = now != member ? now : (member + 1) % members;
    if (m_impl->stop.load()) return;
  }
}

}  // namespace fencerun::etcd
