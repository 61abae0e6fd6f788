#include "config/config.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "config/quorum_limits.hpp"
#include "lease/lease.hpp"
#include "util/duration.hpp"
#include "util/error.hpp"

namespace fencerun::config {

using redis::parse_redis_url;
using redis::redacted_url;
using util::format_duration;
using util::parse_duration;
namespace {

milliseconds duration_option(std::string_view option, const std::string& text) {
  auto d = parse_duration(text);
  if (!d) throw UsageError(std::string(option) + ": " + d.error());
  return *d;
}

// The TLS files are read only once a connection is made; a path that cannot be read is a typo to
// report now, naming the option, rather than as an unavailable server later.
void readable_file_option(std::string_view option, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError(std::string(option) + ": '" + path + "' is a directory, not a file");
  // O_NONBLOCK: a FIFO given by mistake must not hang the check.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw UsageError(std::string(option) + ": cannot read '" + path + "': " + std::strerror(errno));
  ::close(fd);
}

int exit_code_option(std::string_view option, int value) {
  if (value < 0 || value > 255)
    throw UsageError(std::string(option) + ": " + std::to_string(value) + " is not an exit code (0-255)");
  return value;
}

// --limit N: a whole number from 1 to 1024 (lease::k_max_limit), in decimal digits only.
long limit_option(const std::string& text) {
  const std::string_view digits = std::string_view(text).substr(text.starts_with('-') ? 1 : 0);
  const bool whole = !digits.empty() &&
                     std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  if (!whole) throw UsageError("--limit: '" + text + "' is not a whole number from 1 to 1024");
  long n = 0;  // saturates above the range: a long run of digits is out of range, not an overflow
  for (char ch : digits) n = std::min(n * 10 + (ch - '0'), lease::k_max_limit + 1);
  if (text.starts_with('-') || n < 1 || n > lease::k_max_limit)
    throw UsageError("--limit: " + text + " is not from 1 to 1024");
  return n;
}

// --keep-runs N, history -n N: a whole number from 1 to 1000 (lease::k_max_keep_runs).
long count_option(std::string_view option, const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 4 &&
                      std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  const long n = digits ? std::stol(text) : 0;
  if (!digits || n < 1 || n > lease::k_max_keep_runs)
    throw UsageError(std::string(option) + ": '" + text + "' is not a whole number from 1 to " +
                     std::to_string(lease::k_max_keep_runs));
  return n;
}

// break --owner PREFIX: the start of an owner id (32 hex digits), long enough to name one holder.
std::string owner_prefix_option(const std::string& text) {
  constexpr std::size_t k_min = 8, k_max = 32;
  const bool hex = std::all_of(text.begin(), text.end(), [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)); });
  if (!hex || text.empty() || text.size() > k_max)
    throw UsageError("--owner: '" + text + "' is not the start of an owner id (hex digits, as status shows)");
  if (text.size() < k_min)
    throw UsageError("--owner: '" + text + "' is too short to name one holder: give at least 8 hex digits");
  std::string lower = text;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return lower;
}

// bump --above N: a token, a positive decimal integer below 2^53.
std::uint64_t token_option(std::string_view option, const std::string& text) {
  constexpr std::uint64_t k_limit = 9'007'199'254'740'992ULL;  // 2^53
  const bool digits = !text.empty() && text.size() <= 16 &&
                      std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  const std::uint64_t n = digits ? std::stoull(text) : 0;
  if (!digits || n == 0 || n >= k_limit)
    throw UsageError(std::string(option) + ": '" + text + "' is not a positive integer below 2^53");
  return n;
}

}  // namespace


std::expected<void, std::string> validate_lock_name(std::string_view name) {
  if (name.empty()) return std::unexpected("lock NAME is empty");
  if (name.size() > 256)
    return std::unexpected("lock NAME is " + std::to_string(name.size()) + " bytes long (at most 256)");
  for (unsigned char c : name) {
    if (c <= 0x20 || c >= 0x7f)
      return std::unexpected("lock NAME may hold only printable ASCII without spaces");
    if (c == '{' || c == '}')
      return std::unexpected("lock NAME may not contain '{' or '}' (reserved for the Redis Cluster hash tag)");
  }
  return {};
}

namespace {

bool uses_tls(const RedisEndpoint& e) {
  return e.transport == RedisEndpoint::Transport::tls ||
         (e.transport == RedisEndpoint::Transport::sentinel && e.sentinel_tls);
}

// One -r URL (or the environment's, or the default) with the passwords of the environment and the TLS
// options, which apply to every server.
// What a fencerun run shares with the fencerun commands of its job (share_connection()).
struct Inherited {
  std::optional<std::string> password;
  std::optional<std::string> sentinel_password;
  TlsSettings tls;
};

RedisEndpoint endpoint_option(const std::string& url, const Options& o, const GetEnv& getenv,
                              std::string_view source = "--redis", const Inherited* inherited = nullptr) {
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
  const bool tls_options = !o.tls_ca_file.empty() || !o.tls_cert.empty() || !o.tls_key.empty() ||
                           !o.tls_server_name.empty() || o.tls_insecure;
  auto& tls = e.tls;
  tls.ca_file = o.tls_ca_file;
  tls.cert_file = o.tls_cert;
  tls.key_file = o.tls_key;
  tls.server_name = o.tls_server_name;
  tls.insecure = o.tls_insecure;
  if (!tls_options && inherited) tls = inherited->tls;
  return e;
}

// An etcd URL with the password of the environment and the TLS options.
etcd::EtcdEndpoint etcd_option(const std::string& url, const Options& o, const GetEnv& getenv,
                               std::string_view source) {
  auto endpoint = etcd::parse_etcd_url(url);
  if (!endpoint) {
    std::string message = std::string(source) + ": " + endpoint.error();
    if (url.find('@') != std::string::npos)
      message += " (a password with '@', ':', ',' or '/' must be percent-encoded, or given in $FENCERUN_ETCD_PASSWORD)";
    throw UsageError(message);
  }
  etcd::EtcdEndpoint e = std::move(*endpoint);
  if (!e.password && !e.user.empty()) {
    auto pw = getenv("FENCERUN_ETCD_PASSWORD");
    if (pw && !pw->empty()) e.password = *pw;
  }
  if (!e.user.empty() && !e.password)
    throw UsageError(std::string(source) + ": no password for etcd user '" + e.user + "': give it in the URL (etcd://" +
                     e.user + ":PASSWORD@...) or in $FENCERUN_ETCD_PASSWORD");
  e.tls_settings.ca_file = o.tls_ca_file;
  e.tls_settings.cert_file = o.tls_cert;
  e.tls_settings.key_file = o.tls_key;
  e.tls_settings.server_name = o.tls_server_name;
  e.tls_settings.insecure = o.tls_insecure;
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

// Quorum mode's list: 3, 5 or 7 distinct servers, all with TLS or none (the --tls-* options are
// given once, for all of them).
void check_quorum(const std::vector<RedisEndpoint>& servers) {
  const std::size_t n = servers.size();
  if (n % 2 == 0 || n > k_max_quorum_servers)
    throw UsageError("--redis: " + std::to_string(n) +
                     " servers given; quorum mode takes 3, 5 or 7 (an odd number of independent servers)");
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j)
      if (server_identity(servers[i]) == server_identity(servers[j]))
        throw UsageError("--redis: servers " + std::to_string(i + 1) + " and " + std::to_string(j + 1) +
                         " are the same server (" + server_identity(servers[i]) +
                         "); quorum mode needs independent servers");
  if (std::ranges::any_of(servers, uses_tls) && !std::ranges::all_of(servers, uses_tls))
    throw UsageError("--redis: the servers mix TLS (rediss://) and plain connections; in quorum mode all of "
                     "them use TLS or none (the --tls-* options apply to every server)");
}

}  // namespace

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

CommonConfig make_common_config(const Options& o, const GetEnv& getenv) {
  CommonConfig c;
  // Where the lock lives, and the password (URL first, then the environment). Only -r names several
  // servers: the environment and the default name one.
  std::string url = o.redis_urls.size() == 1 ? o.redis_urls.front() : "";
  c.url_source = "--redis";
  if (o.redis_urls.size() > 1 && std::ranges::any_of(o.redis_urls, etcd::is_etcd_url))
    throw UsageError("--redis: an etcd URL names one cluster; give its members in one URL, separated by commas "
                     "(etcd://HOST:PORT,HOST:PORT,...)");
  if (o.redis_urls.size() > 1) {
    for (const auto& u : o.redis_urls) c.servers.push_back(endpoint_option(u, o, getenv));
    check_quorum(c.servers);
    url = o.redis_urls.front();
  }
  if (url.empty()) {
    url = getenv("FENCERUN_REDIS_URL").value_or(""), c.url_source = "$FENCERUN_REDIS_URL";
    // A quorum-mode run gives its command every server's URL, separated by spaces.
    if (url.find(' ') != std::string::npos)
      throw UsageError("$FENCERUN_REDIS_URL names several servers (set by a quorum-mode fencerun); give the server "
                       "to use with -r URL");
  }
  if (etcd::is_etcd_url(url)) {
    c.etcd = etcd_option(url, o, getenv, c.url_source);
    c.redacted_url = etcd::redacted_url(*c.etcd);
  }
  // Inside a run's job: the run's password and TLS settings, from the descriptor it shared.
  std::optional<Inherited> inherited;
  if (!url.empty() && c.url_source == "$FENCERUN_REDIS_URL") inherited = read_inherited(getenv, url);
  if (url.empty()) url = getenv("REDIS_URL").value_or(""), c.url_source = "$REDIS_URL";
  if (url.empty()) url = "redis://127.0.0.1:6379", c.url_source = "the default";
  if (!c.etcd) c.endpoint = endpoint_option(url, o, getenv, c.url_source, inherited ? &*inherited : nullptr);
  if (!o.tls_key.empty() && o.tls_cert.empty()) throw UsageError("--tls-key: needs --tls-cert as well");
  if (!c.etcd) c.redacted_url = redacted_url(c.endpoint);
  if (!c.servers.empty()) {
    c.redacted_url.clear();
    for (const auto& s : c.servers) {
      c.server_urls.push_back(redacted_url(s));
      c.redacted_url += (c.redacted_url.empty() ? "" : " ") + c.server_urls.back();
    }
    check_quorum_addresses(c.servers, c.server_urls);
    c.quorum_max_ttl = quorum_max_ttl(getenv("FENCERUN_QUORUM_MAX_TTL"));
  }

  c.timeout = duration_option("--timeout", o.timeout);
  if (c.timeout <= milliseconds::zero())
    throw UsageError("--timeout: must be positive, got " + o.timeout);
  if (o.key_prefix.find_first_of("{}") != std::string::npos)
    throw UsageError("--key-prefix: may not contain '{' or '}' (reserved for the Redis Cluster hash tag)");
  c.key_prefix = o.key_prefix;
  c.log_level = o.verbosity >= 2   ? LogLevel::debug
                : o.verbosity == 1 ? LogLevel::info
                : o.verbosity == 0 ? LogLevel::warn
                                   : LogLevel::error;
  if (o.log_format == "text") c.log_format = LogFormat::text;
  else if (o.log_format == "json") c.log_format = LogFormat::json;
  else throw UsageError("--log-format: '" + o.log_format + "' is not one of text, json");
  return c;
}

int share_connection(const CommonConfig& c) {
  if (!c.servers.empty()) return -1;  // quorum mode: a nested command names its server with -r
  if (c.etcd) return -1;              // etcd: nested fencerun commands name their server with -r
  const RedisEndpoint& e = c.endpoint;
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
  line("url", c.redacted_url);
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

// A run on etcd: an etcd lease lives whole seconds, at least etcd's minimum; one holder at a time.
void check_etcd_run(const RunConfig& run, const Options& o) {
  const milliseconds ttl = run.timing.ttl;
  if (ttl % milliseconds(1000) != milliseconds::zero() || ttl < k_etcd_min_ttl)
    throw UsageError("--ttl: on etcd a lease lives whole seconds, at least " + format_duration(k_etcd_min_ttl) +
                     " (etcd's minimum lease TTL), got " + o.ttl);
  if (run.limit > 1) throw UsageError("--limit: only 1 on etcd, got " + o.limit);
  if (run.min_replicas > 0)
    throw UsageError("--min-replicas: not needed on etcd: a write is acknowledged only once a majority of the "
                     "cluster's members has it in its Raft log");
}

void check_tls_files(const TlsSettings& tls) {
  readable_file_option("--tls-ca-file", tls.ca_file);
  readable_file_option("--tls-cert", tls.cert_file);
  readable_file_option("--tls-key", tls.key_file);
}

Config make_config(const Options& o, const GetEnv& getenv, const ParseSignal& parse_signal) {
  Config c;
  c.subcommand = o.subcommand;
  c.json = o.json;

  c.common = make_common_config(o, getenv);
  const bool on_etcd = c.common.etcd.has_value();
  check_tls_files(on_etcd ? c.common.etcd->tls_settings : c.common.endpoint.tls);
  // TLS options on a plain connection would be ignored: the user meant TLS.
  const bool tls_options = !o.tls_ca_file.empty() || !o.tls_cert.empty() || !o.tls_key.empty() ||
                           !o.tls_server_name.empty() || o.tls_insecure;
  if (on_etcd && tls_options && !c.common.etcd->tls)
    throw UsageError("--tls-*: TLS options given, but " + c.common.url_source + " names " + c.common.redacted_url +
                     ", not a TLS URL (use etcds://)");
  if (on_etcd && o.subcommand == Subcommand::bump)
    throw UsageError("bump: not needed on etcd: a token is the lock's base plus its key's create_revision, which "
                     "etcd's Raft log never lowers (a lock moved from Redis keeps its guards working through the base; "
                     "see ETCD in fencerun(1))");
  if (on_etcd && o.subcommand == Subcommand::acl)
    throw UsageError("acl: prints Redis ACL rules; on etcd, grant the user readwrite on the key prefix (see ETCD in "
                     "fencerun(1))");
  if (!on_etcd && tls_options && !uses_tls(c.common.endpoint))
    throw UsageError("--tls-*: TLS options given, but " + c.common.url_source + " names " +
                     c.common.redacted_url + ", not a TLS URL (use rediss:// or rediss+sentinel://)");
  const bool quorum = !c.common.servers.empty();
  if (quorum && o.subcommand != Subcommand::run && o.subcommand != Subcommand::status &&
      o.subcommand != Subcommand::list && o.subcommand != Subcommand::history && o.subcommand != Subcommand::version)
    throw UsageError("--redis: several servers (quorum mode) are for run, status, list and history only; give one");
  c.acl_delex = o.acl_delex;
  c.acl_delifeq = o.acl_delifeq;
  c.acl_admin = o.acl_admin;
  if (o.subcommand == Subcommand::version || o.subcommand == Subcommand::help || o.subcommand == Subcommand::acl ||
      o.subcommand == Subcommand::fence)
    return c;
  if (o.subcommand == Subcommand::list) {
    c.json = o.json;
    c.list_all = o.list_all;
    if (o.list_pattern) {
      // A glob of names: what a NAME may hold, plus the glob characters (which names may hold too).
      if (auto ok = validate_lock_name(*o.list_pattern); !ok) {
        std::string message = ok.error();  // "lock NAME ...": the same rule, said of PATTERN
        message.replace(0, std::string_view("lock NAME").size(), "PATTERN");
        throw UsageError("list: " + message);
      }
      c.list_pattern = *o.list_pattern;
    }
    return c;
  }

  if (o.lock_name.empty()) throw UsageError("missing lock NAME");
  if (auto ok = validate_lock_name(o.lock_name); !ok) throw UsageError(ok.error());
  c.run.lock = o.lock_name;
  if (o.subcommand == Subcommand::status) {
    if (!o.command.empty()) throw UsageError("status takes no COMMAND");
    return c;
  }
  if (o.subcommand == Subcommand::break_lock) {
    c.yes = o.yes;
    if (o.break_owner) c.break_owner = owner_prefix_option(*o.break_owner);
    return c;
  }
  if (o.subcommand == Subcommand::history) {
    if (o.history_count) c.history_count = count_option("-n", *o.history_count);
    return c;
  }
  if (o.subcommand == Subcommand::bump) {
    if (!o.bump_above) throw UsageError("bump: missing --above N");
    c.bump_above = token_option("--above", *o.bump_above);
    return c;
  }

  std::optional<milliseconds> renew, grace;
  if (o.renew) renew = duration_option("--renew", *o.renew);
  if (o.grace) grace = duration_option("--grace", *o.grace);
  auto timing = LeaseTiming::make(duration_option("--ttl", o.ttl), renew, grace);
  if (!timing) throw UsageError(timing.error());
  c.run.timing = *timing;

  auto sig = parse_signal(o.kill_signal);
  if (!sig) throw UsageError("--kill-signal: '" + o.kill_signal + "' is not a signal name or number");
  c.run.kill_signal = *sig;

  if (o.wait == "inf" || o.wait == "infinity" || o.wait == "forever") {
    c.run.wait = std::nullopt;
  } else {
    auto w = duration_option("--wait", o.wait);
    if (w < milliseconds::zero()) throw UsageError("--wait: must not be negative, got " + o.wait);
    c.run.wait = w;
  }
  c.run.fair = o.fair;
  c.run.limit = limit_option(o.limit);
  if (o.metrics_file) {
    if (o.metrics_file->empty()) throw UsageError("--metrics-file: empty path");
    c.metrics_file = o.metrics_file;
  }
  c.run.conflict_exit_code = exit_code_option("--conflict-exit-code", o.conflict_exit_code);
  c.run.lease_lost_exit_code = exit_code_option("--lease-lost-exit-code", o.lease_lost_exit_code);
  c.run.skip_exit_code = exit_code_option("--skip-exit-code", o.skip_exit_code);
  if (o.records_ttl) {
    c.run.records.ttl = duration_option("--records-ttl", *o.records_ttl);
    if (c.run.records.ttl <= milliseconds::zero())
      throw UsageError("--records-ttl: must be positive, got " + *o.records_ttl);
  }
  if (o.keep_runs) c.run.records.keep = count_option("--keep-runs", *o.keep_runs);
  if (o.min_interval) {
    const milliseconds m = duration_option("--min-interval", *o.min_interval);
    if (m <= milliseconds::zero()) throw UsageError("--min-interval: must be positive, got " + *o.min_interval);
    if (m > c.run.records.ttl)
      throw UsageError("--min-interval: " + format_duration(m) + " is longer than the records' TTL " +
                       format_duration(c.run.records.ttl) + " (--records-ttl): the last success would be forgotten first");
    c.run.min_interval = m;
  }
  if (o.min_replicas < 0) throw UsageError("--min-replicas: must not be negative");
  c.run.min_replicas = o.min_replicas;
  c.run.replica_timeout = duration_option("--replica-timeout", o.replica_timeout);
  if (c.run.replica_timeout <= milliseconds::zero())
    throw UsageError("--replica-timeout: must be positive, got " + o.replica_timeout);
  if (quorum) check_quorum_ttl(c.run.timing.ttl, c.common.quorum_max_ttl);
  if (quorum && c.run.fair) throw UsageError("--fair: not supported in quorum mode (several --redis servers)");
  if (quorum && c.run.limit > 1)
    throw UsageError("--limit: only 1 in quorum mode (several --redis servers), got " + o.limit);
  if (quorum && c.run.min_replicas > 0)
    throw UsageError("--min-replicas: not supported in quorum mode (several --redis servers): a majority of "
                     "independent servers takes the place of replica acknowledgement");
  if (on_etcd) check_etcd_run(c.run, o);
  if (c.run.min_replicas > 0 && c.run.replica_timeout * 2 >= c.run.timing.ttl)
    throw UsageError("--replica-timeout: " + format_duration(c.run.replica_timeout) +
                     " must be shorter than half of --ttl " + format_duration(c.run.timing.ttl));

  if (o.command.empty()) throw UsageError("missing COMMAND (usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...])");
  if (o.shell) {
    if (o.command.size() != 1)
      throw UsageError("--shell takes exactly one COMMAND string (quote it), got " +
                       std::to_string(o.command.size()) + " words");
    c.run.command = {"/bin/sh", "-c", o.command.front()};
  } else {
    c.run.command = o.command;
  }
  if (c.run.command.front().empty()) throw UsageError("COMMAND is empty");
  return c;
}

}  // namespace fencerun::config
