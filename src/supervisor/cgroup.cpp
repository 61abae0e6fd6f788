#include "supervisor/cgroup.hpp"

#include <fcntl.h>
#include <signal.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "supervisor/sys.hpp"
#include "util/random.hpp"

namespace fencerun::supervisor {
namespace {

// The whole of a small file (a /proc file has no size to ask for: read until the end).
std::string slurp(const char* path) {
  std::string out;
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// Calls `f` with each line of `text` (without its newline) until it returns true.
template <class F>
void for_each_line(std::string_view text, F f) {
  while (!text.empty()) {
    auto nl = text.find('\n');
    if (f(text.substr(0, nl))) return;
    if (nl == std::string_view::npos) return;
    text.remove_prefix(nl + 1);
  }
}

// The `index`th space-separated field of `line` ("" when it has fewer).
std::string_view field(std::string_view line, int index) {
  for (int i = 0;; ++i) {
    auto start = line.find_first_not_of(' ');
    if (start == std::string_view::npos) return {};
    line.remove_prefix(start);
    auto end = line.find(' ');
    if (i == index) return line.substr(0, end);
    if (end == std::string_view::npos) return {};
    line.remove_prefix(end);
  }
}

// Mount point of the cgroup v2 hierarchy ("" when there is none), from /proc/self/mountinfo.
std::string cgroup2_mount_from_mountinfo() {
  const std::string text = slurp("/proc/self/mountinfo");
  std::string mount;
  for_each_line(text, [&](std::string_view line) {
    auto sep = line.find(" - ");
    if (sep == std::string_view::npos) return false;
    if (line.substr(sep + 3, 8) != "cgroup2 ") return false;
    // Fields: id parent major:minor root mount-point ...
    std::string_view fields = line.substr(0, sep);
    if (field(fields, 3) != "/") return false;  // a bind mount of a sub-tree: paths would not line up
    mount = std::string(field(fields, 4));
    return true;
  });
  return mount;
}

// Mount point of the cgroup v2 hierarchy where fencerun's own cgroup `own` is. The usual places are
// tried first (a statfs each): the kernel writes out every mount to produce /proc/self/mountinfo,
// about 0.1 ms, on every run. A usual place counts only if `own` is there below it, as it is when the
// hierarchy's root is mounted there (a bind mount of a sub-tree, where paths do not line up, has no
// such directory and is then rejected by the full check).
std::string cgroup2_mount(const std::string& own) {
  for (const char* place : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    struct statfs fs {};
    if (::statfs(place, &fs) != 0 || fs.f_type != CGROUP2_SUPER_MAGIC) continue;
    struct stat st {};
    if (::stat((std::string(place) + own + "/cgroup.procs").c_str(), &st) == 0) return place;
    break;
  }
  return cgroup2_mount_from_mountinfo();
}

// The cgroup v2 path ("0::/PATH") in the text of a /proc/PID/cgroup file.
std::optional<std::string> v2_path(std::string_view text) {
  std::optional<std::string> path;
  for_each_line(text, [&](std::string_view line) {
    if (!line.starts_with("0::")) return false;
    path = std::string(line.substr(3));
    return true;
  });
  return path;
}

// fencerun's own cgroup v2 path.
std::optional<std::string> own_cgroup() { return v2_path(slurp("/proc/self/cgroup")); }

}  // namespace

bool cgroup_disabled_by(std::string_view value) {
  for (std::string_view off : {"off", "0", "false", "no"}) {
    if (value.size() == off.size() &&
        std::equal(value.begin(), value.end(), off.begin(), [](char a, char b) { return (a | 0x20) == b; }))
      return true;
  }
  return false;
}

void signal_cgroup_members(int procs_fd, int signo) {
  // Only raw system calls (the watchdog calls it too, sys.hpp): no allocation, a fixed buffer read in
  // pieces.
  char buf[4096];
  off_t offset = 0;
  long pid = 0;
  bool in_number = false;
  for (;;) {
    long n = sys::pread(procs_fd, buf, sizeof buf, offset);
    if (n <= 0) break;
    offset += n;
    for (long i = 0; i < n; ++i) {
      char c = buf[i];
      if (c >= '0' && c <= '9') {
        pid = pid * 10 + (c - '0');
        in_number = true;
      } else {
        if (in_number && pid > 0) sys::kill(static_cast<pid_t>(pid), signo);
        pid = 0;
        in_number = false;
      }
    }
  }
  if (in_number && pid > 0) sys::kill(static_cast<pid_t>(pid), signo);
}

std::optional<JobCgroup> JobCgroup::create(std::string& why_not) {
  if (const char* mode = std::getenv("FENCERUN_CGROUP"); mode && cgroup_disabled_by(mode)) {
    why_not = std::string("FENCERUN_CGROUP=") + mode;
    return std::nullopt;
  }
  auto own = own_cgroup();
  std::string mount = own ? cgroup2_mount(*own) : std::string();
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
  // Only what every run needs is opened here (each open costs a path walk in the cgroup file system);
  // cgroup.procs is opened when it is needed: for writing where the kernel cannot start the command
  // inside (open_procs_for_writing), for reading when the job shares the caller's process group or is
  // signalled member by member (procs_read_fd, signal_all).
  cg.m_dir.reset(::openat(AT_FDCWD, cg.m_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (cg.m_dir) {
    cg.m_kill.reset(::openat(cg.m_dir.get(), "cgroup.kill", O_WRONLY | O_CLOEXEC));
    cg.m_events.reset(::openat(cg.m_dir.get(), "cgroup.events", O_RDONLY | O_CLOEXEC));
  }
  if (!cg.m_dir || !cg.m_kill || !cg.m_events) {
    why_not = std::string(cg.m_kill ? "cannot open the new cgroup's files" : "no cgroup.kill (Linux 5.14 or later)");
    return std::nullopt;  // the destructor removes the directory
  }
  return cg;
}

JobCgroup::JobCgroup(JobCgroup&& other) noexcept
    : m_path(std::exchange(other.m_path, {})),
      m_relative(std::exchange(other.m_relative, {})),
      m_dir(std::move(other.m_dir)),
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
  m_dir.reset();
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

int JobCgroup::open_procs_for_writing() const {
  return m_dir ? ::openat(m_dir.get(), "cgroup.procs", O_WRONLY | O_CLOEXEC) : -1;
}

int JobCgroup::procs_read_fd() const {
  if (!m_procs_read && m_dir) m_procs_read.reset(::openat(m_dir.get(), "cgroup.procs", O_RDONLY | O_CLOEXEC));
  return m_procs_read.get();
}

void JobCgroup::signal_all(int signo) const {
  if (int fd = procs_read_fd(); fd >= 0) signal_cgroup_members(fd, signo);
}

bool JobCgroup::contains(pid_t pid) const {
  auto path = v2_path(slurp(("/proc/" + std::to_string(pid) + "/cgroup").c_str()));
  return path && *path == m_relative;
}

}  // namespace fencerun::supervisor
