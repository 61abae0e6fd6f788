#include "backends/redis/target.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>

#include "backends/redis/redis_backend.hpp"
#include "util/error.hpp"

namespace fencerun::redis {

using lease::GetEnv;

namespace {

// What a fencerun run shares with the fencerun commands of its job (share_connection()).
struct Inherited {
  std::optional<std::string> password;
  std::optional<std::string> sentinel_password;
  TlsSettings tls;
};

RedisEndpoint endpoint_of(const std::string& url, const lease::ConnectRequest& r, const Inherited* inherited) {
  const GetEnv& getenv = r.getenv;
  const std::string_view source = r.source;
  auto endpoint = parse_redis_url(url);
  if (!endpoint) {
    std::string message = std::string(source) + ": " + endpoint.error();
    // A password holding '@', ':' or '/' cuts the URL at the wrong place.
    if (url.find('@') != std::string::npos && url.find("://") != std::string::npos)
      message += " (a password with '@', ':' or '/' must be percent-encoded as %40, %3A, %2F, or given in "
                 "$FENCERUN_REDIS_PASSWORD)";
    throw UsageError(message);
  }
  RedisEndpoint e = std::move(*endpoint);
  if (!e.password && inherited) e.password = inherited->password;
  if (!e.password) {
    auto pw = getenv("FENCERUN_REDIS_PASSWORD");
    if (!pw || pw->empty()) pw = getenv("REDISCLI_AUTH");
    if (pw && !pw->empty()) e.password = *pw;
  }
  // AUTH needs a password with a user name; a user with `nopass` accepts any.
  if (!e.user.empty() && !e.password)
    throw UsageError(std::string(source) + ": no password for user '" + e.user +
                     "': give it in the URL (redis://" + e.user +
                     ":PASSWORD@...) or in $FENCERUN_REDIS_PASSWORD");
  if (e.transport == RedisEndpoint::Transport::sentinel) {
    auto pw = getenv("FENCERUN_SENTINEL_PASSWORD");
    if (pw && !pw->empty()) e.sentinel_password = *pw;
    if (!e.sentinel_password && inherited) e.sentinel_password = inherited->sentinel_password;
  }
  e.tls = r.tls;
  if (!r.tls_options && inherited) e.tls = inherited->tls;
  return e;
}

// ---- The connection shared with the job: a sealed memfd, inherited by the command's processes.

constexpr std::string_view k_shared_magic = "fencerun-connection 1\n";

std::string escape_value(std::string_view v) {
  std::string out;
  for (char ch : v) {
    if (ch == '%') out += "%25";
    else if (ch == '\n') out += "%0A";
    else out += ch;
  }
  return out;
}

std::string unescape_value(std::string_view v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '%' && v.substr(i, 3) == "%25") out += '%', i += 2;
    else if (v[i] == '%' && v.substr(i, 3) == "%0A") out += '\n', i += 2;
    else out += v[i];
  }
  return out;
}

// The memfd named by $FENCERUN_CONNECTION_FD, when it is one that a run wrote for `url` (the job's
// $FENCERUN_REDIS_URL): sealed against writes, with the header and the same URL. Anything else (a
// closed or reused descriptor, another run's) is ignored.
std::optional<Inherited> read_inherited(const GetEnv& getenv, const std::string& url) {
  auto fd_text = getenv("FENCERUN_CONNECTION_FD");
  if (!fd_text || fd_text->empty()) return std::nullopt;
  int fd = -1;
  auto [end, ec] = std::from_chars(fd_text->data(), fd_text->data() + fd_text->size(), fd);
  if (ec != std::errc{} || end != fd_text->data() + fd_text->size() || fd < 3) return std::nullopt;
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_WRITE)) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size > 65536) return std::nullopt;
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  if (::pread(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) return std::nullopt;
  if (!text.starts_with(k_shared_magic)) return std::nullopt;
  Inherited in;
  bool same_url = false;
  std::string_view rest = std::string_view(text).substr(k_shared_magic.size());
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    const std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, eq);
    std::string value = unescape_value(line.substr(eq + 1));
    if (key == "url") same_url = value == url;
    else if (key == "password") in.password = std::move(value);
    else if (key == "sentinel_password") in.sentinel_password = std::move(value);
    else if (key == "tls_ca_file") in.tls.ca_file = std::move(value);
    else if (key == "tls_cert") in.tls.cert_file = std::move(value);
    else if (key == "tls_key") in.tls.key_file = std::move(value);
    else if (key == "tls_server_name") in.tls.server_name = std::move(value);
    else if (key == "tls_insecure") in.tls.insecure = value == "1";
  }
  if (!same_url) return std::nullopt;
  return in;
}

}  // namespace

bool uses_tls(const RedisEndpoint& e) {
  return e.transport == RedisEndpoint::Transport::tls ||
         (e.transport == RedisEndpoint::Transport::sentinel && e.sentinel_tls);
}

RedisEndpoint endpoint_of(const std::string& url, const lease::ConnectRequest& r) {
  // Inside a run's job: the run's password and TLS settings, from the descriptor it shared.
  std::optional<Inherited> inherited;
  if (r.source == "$FENCERUN_REDIS_URL" || r.source == "$FENCERUN_SERVER") inherited = read_inherited(r.getenv, url);
  return endpoint_of(url, r, inherited ? &*inherited : nullptr);
}

std::string server_identity(const RedisEndpoint& e) {
  const std::string db = "/" + std::to_string(e.db);
  switch (e.transport) {
    case RedisEndpoint::Transport::unix_socket: return e.path + db;
    case RedisEndpoint::Transport::sentinel: {
      std::vector<std::string> sentinels;
      for (const auto& s : e.sentinels) sentinels.push_back(s.host + ":" + std::to_string(s.port));
      std::ranges::sort(sentinels);
      std::string id = "sentinel master " + e.master_name + " via";
      for (const auto& s : sentinels) id += " " + s;
      return id + db;
    }
    case RedisEndpoint::Transport::tcp:
    case RedisEndpoint::Transport::tls: break;
  }
  std::string host = e.host;
  for (char& ch : host) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(e.port) + db;
}

int RedisUrlTarget::share_connection() const {
  const RedisEndpoint& e = m_endpoint;
  auto absolute = [](const std::string& path) {
    if (path.empty()) return path;
    std::error_code ec;
    auto p = std::filesystem::absolute(path, ec);
    return ec ? path : p.string();
  };
  std::string text(k_shared_magic);
  auto line = [&text](std::string_view key, std::string_view value) {
    text += std::string(key) + "=" + escape_value(value) + "\n";
  };
  line("url", m_url);
  if (e.password) line("password", *e.password);
  if (e.sentinel_password) line("sentinel_password", *e.sentinel_password);
  if (!e.tls.ca_file.empty()) line("tls_ca_file", absolute(e.tls.ca_file));
  if (!e.tls.cert_file.empty()) line("tls_cert", absolute(e.tls.cert_file));
  if (!e.tls.key_file.empty()) line("tls_key", absolute(e.tls.key_file));
  if (!e.tls.server_name.empty()) line("tls_server_name", e.tls.server_name);
  if (e.tls.insecure) line("tls_insecure", "1");
  // Not close-on-exec: the command inherits it. Sealed: nothing in the job can change it.
  const int fd = ::memfd_create("fencerun-connection", MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) == 0;
  if (!ok) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::shared_ptr<const lease::Target> configure(const lease::ConnectRequest& r) {
  RedisEndpoint e = endpoint_of(r.urls.front(), r);
  // TLS options on a plain connection would be ignored: the user meant TLS.
  if (r.tls_options && !uses_tls(e))
    throw UsageError("--tls-*: TLS options given, but " + r.source + " names " + redacted_url(e) +
                     ", not a TLS URL (use rediss:// or rediss+sentinel://)");
  std::string url = redacted_url(e);
  return std::make_shared<RedisUrlTarget>(std::move(e), std::move(url));
}

std::unique_ptr<lease::Backend> RedisUrlTarget::make_backend(const lease::BackendSettings& s) const {
  return lease::make_redis_backend({m_endpoint, m_url, s.key_prefix, s.timeout});
}

}  // namespace fencerun::redis
