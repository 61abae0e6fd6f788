#include "app/metrics.hpp"

#include <expected>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "util/random.hpp"

namespace fencerun::app {
namespace {

std::string label_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string seconds(std::chrono::system_clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ms / 1000), static_cast<long long>(ms % 1000));
  return buf;
}

// Durations are never negative in the file: a wall clock stepped back during the run counts as 0.
std::string seconds(std::chrono::milliseconds d) {
  if (d < std::chrono::milliseconds::zero()) d = std::chrono::milliseconds::zero();
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(d.count() / 1000),
                static_cast<long long>(d.count() % 1000));
  return buf;
}

}  // namespace

std::string format_metrics(const RunReport& r) {
  std::string labels = "{lock=\"" + label_escape(r.lock) + "\"";
  if (r.counting) labels += ",slot=\"" + (r.slot ? std::to_string(*r.slot) : std::string()) + "\"";
  labels += "}";
  std::string out;
  auto metric = [&](const char* name, const char* help, const std::string& value) {
    out += std::string("# HELP ") + name + " " + help + "\n";
    out += std::string("# TYPE ") + name + " gauge\n";
    out += std::string(name) + labels + " " + value + "\n";
  };
  metric("fencerun_last_start_timestamp_seconds", "Unix time the last run started.", seconds(r.started));
  metric("fencerun_last_end_timestamp_seconds", "Unix time the last run ended.", seconds(r.ended));
  metric("fencerun_last_duration_seconds", "Wall time of the last run, lock wait included.",
         seconds(std::chrono::duration_cast<std::chrono::milliseconds>(r.ended - r.started)));
  metric("fencerun_last_lock_wait_seconds", "Time the last run waited for the lock.", seconds(r.lock_wait));
  metric("fencerun_last_acquired", "1 if the last run acquired the lock, 0 if it was busy or failed.",
         r.acquired ? "1" : "0");
  metric("fencerun_last_exit_code", "Exit code of the last run.", std::to_string(r.exit_code));
  metric("fencerun_last_token", "Fencing token of the last run (0 when none was issued).",
         std::to_string(r.token.value_or(0)));
  metric("fencerun_last_renewals", "Successful lease renewals in the last run.", std::to_string(r.renewals));
  metric("fencerun_last_renew_failures", "Failed lease renewal attempts in the last run.",
         std::to_string(r.renew_failures));
  if (r.last_success_us) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%llu.%06llu", static_cast<unsigned long long>(*r.last_success_us / 1'000'000),
                  static_cast<unsigned long long>(*r.last_success_us % 1'000'000));
    metric("fencerun_last_success_timestamp_seconds",
           "Unix time (the lock server's clock) the last successful run of the lock started.", buf);
  }
  metric("fencerun_last_lease_lost", "1 if the last run lost its lease and the command was stopped.",
         r.lease_lost ? "1" : "0");
  return out;
}

std::optional<std::uint64_t> previous_last_success(const std::string& path) {
  std::ifstream in(path);
  const std::string name = "fencerun_last_success_timestamp_seconds{";
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(name)) continue;
    const auto sp = line.rfind(' ');
    const auto dot = line.find('.', sp);
    if (sp == std::string::npos || dot == std::string::npos) return std::nullopt;
    try {
      std::string frac = line.substr(dot + 1);
      frac.resize(6, '0');
      return std::stoull(line.substr(sp + 1, dot - sp - 1)) * 1'000'000 + std::stoull(frac);
    } catch (...) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::expected<void, std::string> write_metrics_file(const std::string& path, const RunReport& report) {
  const std::string content = format_metrics(report);
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  // The collector reads *.prom files: the temp name must not end in .prom.
  std::string tmp = path + ".tmp-" + random_hex(6);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return std::unexpected("cannot create " + tmp + ": " + std::strerror(errno));
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return std::unexpected("cannot write " + tmp + ": " + err);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  bool synced = ::fsync(fd) == 0;
  int sync_errno = errno;
  bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    std::string err = std::strerror(synced ? errno : sync_errno);
    ::unlink(tmp.c_str());
    return std::unexpected("cannot write " + tmp + ": " + err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    return std::unexpected("cannot rename " + tmp + " to " + path + ": " + err);
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

}  // namespace fencerun::app
