#include "util/url.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include "util/error.hpp"

namespace fencerun::util {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::optional<std::string> percent_decode(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return std::nullopt;
    int hi = hex_value(in[i + 1]), lo = hex_value(in[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

std::string percent_encode_user(std::string_view in) {
  static constexpr char k_hex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : in) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_' || c == '.' || c == '~';
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(k_hex[c >> 4]);
      out.push_back(k_hex[c & 0xf]);
    }
  }
  return out;
}

// host[:port] or [v6]:port; `port` keeps its value when the text has none.
std::expected<void, std::string> parse_host_port(std::string_view authority, std::string& host, std::uint16_t& port) {
  std::string_view h = authority;
  std::string_view p;
  bool has_port = false;
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    auto close = authority.find(']');
    if (close == std::string_view::npos) return std::unexpected("unterminated '[' in host");
    h = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return std::unexpected("unexpected text after ']' in host");
      p = after.substr(1);
      has_port = true;
    }
  } else {
    auto colon = authority.rfind(':');
    if (colon != std::string_view::npos) {
      h = authority.substr(0, colon);
      p = authority.substr(colon + 1);
      has_port = true;
    }
  }
  if (h.empty()) return std::unexpected("URL has no host");
  host = std::string(h);
  if (has_port) {
    unsigned value = 0;
    auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
    if (p.empty() || ec != std::errc{} || ptr != p.data() + p.size() || value == 0 || value > 65535)
      return std::unexpected("the port is not a number from 1 to 65535");
    port = static_cast<std::uint16_t>(value);
  }
  return {};
}

namespace {

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

}  // namespace

void check_tls_files(const TlsSettings& tls) {
  readable_file_option("--tls-ca-file", tls.ca_file);
  readable_file_option("--tls-cert", tls.cert_file);
  readable_file_option("--tls-key", tls.key_file);
}

}  // namespace fencerun::util
