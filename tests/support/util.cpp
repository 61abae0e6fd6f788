#include "support/util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <ctime>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

namespace fencerun::test {

bool wait_until(const std::function<bool()>& pred, Clock::duration timeout, Clock::duration poll) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (Clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(poll);
  }
}

TempDir::TempDir(std::string_view tag) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/fencerun-" +
                      std::string(tag) + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp");
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (std::getenv("FENCERUN_TEST_KEEP_TMP")) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::optional<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::filesystem::path& p, std::string_view content, mode_t mode) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + p.string());
  size_t off = 0;
  while (off < content.size()) {
    const ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      throw std::system_error(errno, std::generic_category(), "write " + p.string());
    }
    off += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);
  ::close(fd);
}

std::optional<std::string> wait_for_line(const std::filesystem::path& p, Clock::duration timeout) {
  std::optional<std::string> result;
  wait_until(
      [&] {
        auto c = read_file(p);
        if (c && !c->empty() && c->back() == '\n') {
          result = trim(*c);
          return true;
        }
        return false;
      },
      timeout, 2ms);
  return result;
}

std::optional<pid_t> wait_for_pid_file(const std::filesystem::path& p, Clock::duration timeout) {
  auto line = wait_for_line(p, timeout);
  if (!line) return std::nullopt;
  auto v = parse_ll(*line);
  if (!v || *v <= 0) return std::nullopt;
  return static_cast<pid_t>(*v);
}

std::vector<std::string> split_lines(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string_view::npos) nl = s.size();
    out.emplace_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

std::string trim(std::string_view s) {
  const auto ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

std::optional<long long> parse_ll(std::string_view s) {
  long long v = 0;
  const auto t = trim(s);
  if (t.empty()) return std::nullopt;
  auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc{} || ptr != t.data() + t.size()) return std::nullopt;
  return v;
}

std::optional<char> process_state(pid_t pid) {
  auto status = read_file("/proc/" + std::to_string(pid) + "/status");
  if (!status) return std::nullopt;
  for (const auto& line : split_lines(*status)) {
    if (line.rfind("State:", 0) == 0) {
      for (size_t i = 6; i < line.size(); ++i)
        if (line[i] != ' ' && line[i] != '\t') return line[i];
    }
  }
  return std::nullopt;  // vanished while reading
}

bool process_dead(pid_t pid) {
  auto st = process_state(pid);
  return !st || *st == 'Z' || *st == 'X';
}

bool wait_dead(pid_t pid, Clock::duration timeout) {
  return wait_until([&] { return process_dead(pid); }, timeout, 1ms);
}

std::optional<pid_t> process_group(pid_t pid) {
  auto stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return std::nullopt;
  // pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses: split after the last ')'.
  const auto rp = stat->rfind(')');
  if (rp == std::string::npos) return std::nullopt;
  std::istringstream ss(stat->substr(rp + 1));
  std::string state;
  long ppid = 0, pgrp = 0;
  if (!(ss >> state >> ppid >> pgrp)) return std::nullopt;
  return static_cast<pid_t>(pgrp);
}

void kill_if_alive(pid_t pid) {
  if (pid > 1 && !process_dead(pid)) ::kill(pid, SIGKILL);
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return {};
  return buf;
}

int pick_free_port() {
  thread_local std::mt19937 rng{std::random_device{}() ^ static_cast<unsigned>(::getpid())};
  std::uniform_int_distribution<int> dist(20000, 32000);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = dist(rng);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (ok) return port;
  }
  throw std::runtime_error("no free TCP port below 32768 found");
}

std::string shell_quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  out += "'";
  return out;
}

std::string rfc3339_utc(long long unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace fencerun::test
