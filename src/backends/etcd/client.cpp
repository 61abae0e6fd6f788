#include "backends/etcd/client.hpp"

#include <curl/curl.h>
#include <dlfcn.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "util/error.hpp"

namespace fencerun::etcd {
namespace {

using nlohmann::json;

// ---- libcurl, loaded at the first use (see client.hpp).

constexpr const char* k_libcurl = "libcurl.so.4";

#define FENCERUN_CURL_FUNCTIONS(X)                                                                        \
  X(curl_global_init) X(curl_easy_init) X(curl_easy_setopt) X(curl_easy_perform) X(curl_easy_getinfo)    \
  X(curl_easy_cleanup) X(curl_easy_strerror) X(curl_slist_append) X(curl_slist_free_all)                \
  X(curl_multi_init) X(curl_multi_add_handle) X(curl_multi_remove_handle) X(curl_multi_perform)          \
  X(curl_multi_poll) X(curl_multi_wakeup) X(curl_multi_info_read) X(curl_multi_cleanup)

struct Curl {
#define FENCERUN_DECLARE(name) decltype(&::name) name = nullptr;
  FENCERUN_CURL_FUNCTIONS(FENCERUN_DECLARE)
#undef FENCERUN_DECLARE
  std::string error;  // why it could not be loaded ("" when loaded)
};

Curl load_curl() {
  Curl lib;
  // Never unloaded: the process ends with it.
  void* handle = ::dlopen(k_libcurl, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    lib.error = std::string("etcd is not available: cannot load ") + k_libcurl + (why ? std::string(": ") + why : "");
    return lib;
  }
#define FENCERUN_RESOLVE(name)                                                       \
  lib.name = reinterpret_cast<decltype(&::name)>(::dlsym(handle, #name));          \
  if (!lib.name) {                                                                   \
    lib.error = std::string("etcd is not available: ") + k_libcurl + " has no " #name; \
    return lib;                                                                      \
  }
  FENCERUN_CURL_FUNCTIONS(FENCERUN_RESOLVE)
#undef FENCERUN_RESOLVE
  if (lib.curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) lib.error = "etcd is not available: libcurl did not start";
  return lib;
}

// Loaded once, by the first Client (on the main thread, before any renewal thread starts).
const Curl& curl() {
  static const Curl lib = load_curl();
  return lib;
}

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

struct SList {
  curl_slist* list = nullptr;
  ~SList() {
    if (list) curl().curl_slist_free_all(list);
  }
  void add(const std::string& s) { list = curl().curl_slist_append(list, s.c_str()); }
};

std::size_t append_body(char* data, std::size_t size, std::size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

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

struct Client::Impl {
  CURL* easy = nullptr;
  std::vector<std::optional<std::string>> tokens;  // per member: the auth token (simple tokens are a member's own)
  ~Impl() {
    if (easy) curl().curl_easy_cleanup(easy);
  }
};

namespace {

// The address and TLS options of member `i` on `easy`; `url` is the member's base URL + path.
// With --tls-server-name the request goes to that name (verified and sent as SNI) and is connected
// to the member's address.
void set_target(CURL* easy, const EtcdEndpoint& ep, std::size_t i, const std::string& path, SList& connect_to) {
  const auto& c = curl();
  const auto& m = ep.members[i];
  std::string url = member_base(ep, i) + path;
  if (ep.tls && !ep.tls_settings.server_name.empty()) {
    const std::string& name = ep.tls_settings.server_name;
    const bool ipv6 = m.host.find(':') != std::string::npos;
    url = "https://" + name + ":" + std::to_string(m.port) + path;
    connect_to.add(name + ":" + std::to_string(m.port) + ":" + (ipv6 ? "[" + m.host + "]" : m.host) + ":" +
                   std::to_string(m.port));
    c.curl_easy_setopt(easy, CURLOPT_CONNECT_TO, connect_to.list);
  } else {
    c.curl_easy_setopt(easy, CURLOPT_CONNECT_TO, static_cast<curl_slist*>(nullptr));
  }
  c.curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  c.curl_easy_setopt(easy, CURLOPT_PROXY, "");  // never $http_proxy: the members are named as they are
  c.curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  c.curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  if (ep.tls) {
    const auto& t = ep.tls_settings;
    if (!t.ca_file.empty()) c.curl_easy_setopt(easy, CURLOPT_CAINFO, t.ca_file.c_str());
    if (!t.cert_file.empty()) c.curl_easy_setopt(easy, CURLOPT_SSLCERT, t.cert_file.c_str());
    if (!t.key_file.empty() || !t.cert_file.empty())
      c.curl_easy_setopt(easy, CURLOPT_SSLKEY, (t.key_file.empty() ? t.cert_file : t.key_file).c_str());
    c.curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, t.insecure ? 0L : 1L);
    c.curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, t.insecure ? 0L : 2L);
  }
}

// One POST to member `i`: the reply's JSON, or the error of this attempt. `retry`: another member may
// do better.
struct Attempt {
  std::optional<json> reply;
  Error error{Error::Kind::unavailable, ""};
  bool retry = false;
};

Attempt post(CURL* easy, const EtcdEndpoint& ep, std::size_t i, const std::string& path, const std::string& body,
             const std::optional<std::string>& token, std::chrono::milliseconds budget) {
  const auto& c = curl();
  Attempt a;
  SList headers, connect_to;
  headers.add("Content-Type: application/json");
  headers.add("Expect:");
  if (token) headers.add("Authorization: " + *token);
  std::string response;
  char detail[CURL_ERROR_SIZE] = {};
  c.curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, detail);
  set_target(easy, ep, i, path, connect_to);
  c.curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers.list);
  c.curl_easy_setopt(easy, CURLOPT_POST, 1L);
  c.curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.c_str());
  c.curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  c.curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &append_body);
  c.curl_easy_setopt(easy, CURLOPT_WRITEDATA, &response);
  const long ms = std::max<long>(1, static_cast<long>(budget.count()));
  c.curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, ms);
  c.curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, ms);
  const CURLcode rc = c.curl_easy_perform(easy);
  c.curl_easy_setopt(easy, CURLOPT_HTTPHEADER, static_cast<curl_slist*>(nullptr));
  c.curl_easy_setopt(easy, CURLOPT_CONNECT_TO, static_cast<curl_slist*>(nullptr));
  c.curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, static_cast<char*>(nullptr));
  if (rc != CURLE_OK) {
    long connected = 0;
    c.curl_easy_getinfo(easy, CURLINFO_REQUEST_SIZE, &connected);
    a.retry = true;
    a.error.maybe_executed = connected > 0;
    // libcurl's own words for this failure (a certificate's names, say), else its code's.
    const std::string why = detail[0] ? std::string(detail) : std::string(c.curl_easy_strerror(rc));
    switch (rc) {
      case CURLE_OPERATION_TIMEDOUT:
        a.error = {Error::Kind::timeout, "no answer within " + std::to_string(ms) + "ms", connected > 0};
        break;
      case CURLE_SSL_CONNECT_ERROR:
      case CURLE_PEER_FAILED_VERIFICATION:
      case CURLE_SSL_CACERT_BADFILE:
      case CURLE_SSL_CERTPROBLEM:
      case CURLE_SSL_CIPHER:
      case CURLE_SSL_ISSUER_ERROR:
        a.error = {Error::Kind::unavailable, "TLS: " + why, false};
        break;
      case CURLE_GOT_NOTHING:
        a.error = {Error::Kind::protocol, "no HTTP answer: not an etcd client port?", connected > 0};
        break;
      case CURLE_UNSUPPORTED_PROTOCOL:
      case CURLE_WEIRD_SERVER_REPLY:
      case CURLE_HTTP2:
        a.error = {Error::Kind::protocol, "not an etcd server (" + why + ")", connected > 0};
        break;
      default:
        a.error = {Error::Kind::unavailable, why, connected > 0};
    }
    return a;
  }
  long status = 0;
  c.curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  json reply = json::parse(response, nullptr, false);
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
    if (!curl().error.empty()) return std::unexpected(Error{Error::Kind::unavailable, curl().error, false});
    if (!impl.easy) impl.easy = curl().curl_easy_init();
    if (!impl.easy) return std::unexpected(Error{Error::Kind::unavailable, "libcurl: cannot start a transfer", false});
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
      Attempt a = post(impl.easy, ep, i, path, text, impl.tokens[i], budget);
      if (!a.reply && a.error.kind == Error::Kind::auth && impl.tokens[i] &&
          lowered(a.error.message).find("token") != std::string::npos) {
        // A member's token expires (--auth-token-ttl): authenticate again once.
        impl.tokens[i].reset();
        if (auto ok = authenticate(i, deadline, std::max(ms_left(deadline) / 2, std::chrono::milliseconds(1))); !ok)
          return std::unexpected(ok.error());
        a = post(impl.easy, ep, i, path, text, impl.tokens[i], std::max(ms_left(deadline), std::chrono::milliseconds(1)));
      }
      sent_before = sent_before || a.error.maybe_executed || a.reply.has_value();
      if (a.reply) {
        current.store(i);
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
    Attempt a = post(impl.easy, ep, i, "/v3/auth/authenticate", body.dump(), std::nullopt,
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

Result<Grant> Client::grant(std::int64_t ttl_seconds, Deadline deadline) {
  std::lock_guard g(m_mutex);
  auto r = Call{*m_impl, m_endpoint, m_current, m_repeated}("/v3/lease/grant",
                                                            {{"TTL", std::to_string(ttl_seconds)}}, deadline);
  if (!r) return std::unexpected(r.error());
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

json op_json(const Op& op) {
  switch (op.kind) {
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
  for (const auto& c : request.compare) {
    const bool create = c.target == Compare::Target::create_revision;
    compare.push_back({{"target", create ? "CREATE" : "MOD"},
                       {"result", "EQUAL"},
                       {"key", b64(c.key)},
                       {create ? "create_revision" : "mod_revision", std::to_string(c.revision)}});
  }
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

Result<Client::StreamTarget> Client::stream_target(const std::string& path, Deadline deadline) {
  std::lock_guard g(m_mutex);
  if (!curl().error.empty()) return std::unexpected(Error{Error::Kind::unavailable, curl().error, false});
  if (!m_impl->easy) m_impl->easy = curl().curl_easy_init();
  const std::size_t i = m_current.load();
  Call call{*m_impl, m_endpoint, m_current, m_repeated};
  if (auto ok = call.authenticate(i, deadline, ms_left(deadline)); !ok) return std::unexpected(ok.error());
  StreamTarget t;
  t.url = member_base(m_endpoint, i) + path;
  t.headers = {"Content-Type: application/json", "Expect:"};
  if (m_impl->tokens[i]) t.headers.push_back("Authorization: " + *m_impl->tokens[i]);
  return t;
}

// ---- Watch

struct Watch::Impl {
  CURLM* multi = nullptr;
  std::atomic<bool> stop{false};
  std::string pending;  // stream bytes not yet a whole line
  ~Impl() {
    if (multi) curl().curl_multi_cleanup(multi);
  }
};

namespace {

struct StreamContext {
  Watch* watch;
  std::string* pending;
  std::function<bool(const json&)> on_message;  // false: stop reading
};

std::size_t stream_chunk(char* data, std::size_t size, std::size_t n, void* user) {
  auto* ctx = static_cast<StreamContext*>(user);
  ctx->pending->append(data, size * n);
  for (;;) {
    const auto nl = ctx->pending->find('\n');
    if (nl == std::string::npos) break;
    const std::string line = ctx->pending->substr(0, nl);
    ctx->pending->erase(0, nl + 1);
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (!ctx->on_message(j)) return 0;  // aborts the transfer
  }
  return size * n;
}

}  // namespace

Watch::Watch(Client& client, std::string key, std::int64_t start_revision, std::chrono::milliseconds timeout,
             std::function<void(State)> on_end)
    : m_client(client), m_key(std::move(key)), m_start(start_revision), m_timeout(timeout), m_on_end(std::move(on_end)),
      m_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), m_impl(std::make_unique<Impl>()) {
  if (!m_fd) throw SystemError("eventfd");
  if (curl().error.empty()) m_impl->multi = curl().curl_multi_init();
  try {
    m_thread = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    throw SystemError("cannot start the watch thread", e.code().value());
  }
}

Watch::~Watch() { stop(); }

void Watch::stop() {
  m_impl->stop.store(true);
  if (m_impl->multi) curl().curl_multi_wakeup(m_impl->multi);
  if (m_thread.joinable()) m_thread.join();
}

std::string Watch::error() const {
  std::lock_guard g(m_mutex);
  return m_error;
}

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

void Watch::run() {
  const auto& c = curl();
  if (!c.error.empty() || !m_impl->multi) return finish(State::failed, c.error.empty() ? "libcurl: no multi handle" : c.error);
  auto target = m_client.stream_target("/v3/watch", BootClock::now() + m_timeout);
  if (!target) return finish(State::failed, target.error().message);
  CURL* easy = c.curl_easy_init();
  if (!easy) return finish(State::failed, "libcurl: cannot start a transfer");
  SList headers, connect_to;
  for (const auto& h : target->headers) headers.add(h);
  const std::size_t member = m_client.current_member();
  const json body = {{"create_request", {{"key", b64(m_key)}, {"start_revision", std::to_string(m_start)}}}};
  const std::string text = body.dump();
  std::string path = "/v3/watch";
  set_target(easy, m_client.endpoint(), member, path, connect_to);
  c.curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers.list);
  c.curl_easy_setopt(easy, CURLOPT_POST, 1L);
  c.curl_easy_setopt(easy, CURLOPT_POSTFIELDS, text.c_str());
  c.curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(text.size()));
  c.curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, std::max<long>(1, static_cast<long>(m_timeout.count())));
  std::string outcome;
  State ended = State::failed;
  StreamContext ctx{this, &m_impl->pending, [&](const json& j) {
                      if (j.is_discarded() || !j.is_object()) {
                        outcome = "the watch stream is not etcd's JSON";
                        return false;
                      }
                      if (j.contains("error")) {
                        outcome = "watch: " + j["error"].dump();
                        return false;
                      }
                      const auto& result = j.contains("result") ? j["result"] : j;
                      if (result.value("canceled", false)) {
                        outcome = "the watch was canceled: " + result.value("cancel_reason", std::string("compacted"));
                        return false;
                      }
                      if (auto events = result.find("events"); events != result.end() && events->is_array())
                        for (const auto& e : *events)
                          if (e.value("type", std::string()) == "DELETE") {
                            ended = State::deleted;
                            return false;
                          }
                      return true;
                    }};
  c.curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &stream_chunk);
  c.curl_easy_setopt(easy, CURLOPT_WRITEDATA, &ctx);
  c.curl_multi_add_handle(m_impl->multi, easy);
  for (;;) {
    int running = 0;
    c.curl_multi_perform(m_impl->multi, &running);
    int queued = 0;
    while (CURLMsg* msg = c.curl_multi_info_read(m_impl->multi, &queued)) {
      if (msg->msg == CURLMSG_DONE && outcome.empty() && ended != State::deleted)
        outcome = msg->data.result == CURLE_OK ? "the watch stream ended"
                                               : std::string("watch: ") + c.curl_easy_strerror(msg->data.result);
    }
    if (m_impl->stop.load() || ended == State::deleted || !outcome.empty() || running == 0) break;
    c.curl_multi_poll(m_impl->multi, nullptr, 0, 1000, nullptr);
  }
  c.curl_multi_remove_handle(m_impl->multi, easy);
  c.curl_easy_cleanup(easy);
  if (ended == State::deleted) return finish(State::deleted);
  if (m_impl->stop.load()) return;
  finish(State::failed, outcome.empty() ? "the watch stream ended" : outcome);
}

}  // namespace fencerun::etcd
