#include "supervisor/cgroup.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>

#include "util/random.hpp"

namespace fencerun::supervisor {
namespace {

std::string slurp(const char* path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Mount point of the cgroup v2 hierarchy ("" when there is none), from /proc/self/mountinfo.
std::string cgroup2_mount() {
  std::istringstream lines(slurp("/proc/self/mountinfo"));
  for (std::string line; std::getline(lines, line);) {
    auto sep = line.find(" - ");
    if (sep == std::string::npos) continue;
    if (line.compare(sep + 3, 8, "cgroup2 ") != 0) continue;
    // Fields: id parent major:minor root mount-point ...
    std::istringstream fields(line.substr(0, sep));
    std::string id, parent, dev, root, mount;
    fields >> id >> parent >> dev >> root >> mount;
    if (root != "/") continue;  // a bind mount of a sub-tree: paths would not line up
    return mount;
  }
  return {};
}

// fencerun's own cgroup v2 path ("0::/PATH" in /proc/self/cgroup).
std::optional<std::string> own_cgroup() {
  std::istringstream lines(slurp("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("0::")) return line.substr(3);
  return std::nullopt;
}

}  // namespace

void signal_cgroup_members(int procs_fd, int signo) {
  // Async-signal-safe (the watchdog calls it too): no allocation, a fixed buffer read in pieces.
  char buf[4096];
  off_t offset = 0;
  long pid = 0;
  bool in_number = false;
  for (;;) {
    ssize_t n = ::pread(procs_fd, buf, sizeof buf, offset);
    if (n <= 0) break;
    offset += n;
    for (ssize_t i = 0; i < n; ++i) {
      char c = buf[i];
      if (c >= '0' && c <= '9') {
        pid = pid * 10 + (c - '0');
        in_number = true;
      } else {
        if (in_number && pid > 0) ::kill(static_cast<pid_t>(pid), signo);
        pid = 0;
        in_number = false;
      }
    }
  }
  if (in_number && pid > 0) ::kill(static_cast<pid_t>(pid), signo);
}

std::optional<JobCgroup> JobCgroup::create(std::string& why_not) {
  if (const char* mode = std::getenv("FENCERUN_CGROUP"); mode && std::string_view(mode) == "off") {
    why_not = "FENCERUN_CGROUP=off";
    return std::nullopt;
  }
  std::string mount = cgroup2_mount();
  auto own = own_cgroup();
  if (mount.empty() || !own) {
    why_not = "no cgroup v2 hierarchy";
    return std::nullopt;
  }
  if (own->empty() || own->back() != '/') own->push_back('/');
  JobCgroup cg;
  cg.m_relative = *own + "fencerun-" + std::to_string(::getpid()) + "-" + random_hex(4);
  cg.m_path = mount + cg.m_relative;
  if (::mkdir(cg.m_path.c_str(), 0755) != 0) {
    why_not = "cannot create a cgroup in " + mount + *own + ": " + std::strerror(errno);
    return std::nullopt;
  }
  cg.m_procs.reset(::open((cg.m_path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  cg.m_kill.reset(::open((cg.m_path + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC));
  cg.m_events.reset(::open((cg.m_path + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC));
  cg.m_procs_read.reset(::open((cg.m_path + "/cgroup.procs").c_str(), O_RDONLY | O_CLOEXEC));
  if (!cg.m_procs || !cg.m_kill || !cg.m_events || !cg.m_procs_read) {
    why_not = std::string(cg.m_kill ? "cannot open the new cgroup's files" : "no cgroup.kill (Linux 5.14 or later)");
    return std::nullopt;  // the destructor removes the directory
  }
  return cg;
}

JobCgroup::JobCgroup(JobCgroup&& other) noexcept
    : m_path(std::exchange(other.m_path, {})),
      m_relative(std::exchange(other.m_relative, {})),
      m_procs(std::move(other.m_procs)),
      m_kill(std::move(other.m_kill)),
      m_events(std::move(other.m_events)),
      m_procs_read(std::move(other.m_procs_read)) {}

JobCgroup::~JobCgroup() {
  if (m_path.empty()) return;
  if (populated()) {
    kill();
    // Members killed by cgroup.kill leave it within microseconds; rmdir below fails harmlessly otherwise.
    for (int i = 0; i < 200 && populated(); ++i) ::usleep(1000);
  }
  m_procs.reset();
  m_kill.reset();
  m_events.reset();
  m_procs_read.reset();
  ::rmdir(m_path.c_str());
}

bool JobCgroup::populated() const {
  if (!m_events) return false;
  char buf[256];
  ssize_t n = ::pread(m_events.get(), buf, sizeof buf - 1, 0);
  if (n <= 0) return false;
  buf[n] = '\0';
  return std::strstr(buf, "populated 1") != nullptr;
}

void JobCgroup::kill() const {
  if (m_kill) [[maybe_unused]] auto n = ::write(m_kill.get(), "1", 1);
}

void JobCgroup::signal_all(int signo) const {
  if (!m_procs_read) return;
  signal_cgroup_members(m_procs_read.get(), signo);
}

bool JobCgroup::contains(pid_t pid) const {
  std::string text = slurp(("/proc/" + std::to_string(pid) + "/cgroup").c_str());
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("0::")) return line.substr(3) == m_relative;
  return false;
}

}  // namespace fencerun::supervisor
