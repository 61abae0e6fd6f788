#include "supervisor/proctree.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "supervisor/sys.hpp"

namespace fencerun::supervisor::proctree {
namespace {

constexpr std::size_t max_tracked = 8192;

// Appends the decimal form of `v` to `p`; returns the new end.
char* put_number(char* p, long v) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  while (n > 0) *p++ = digits[--n];
  return p;
}

char* put_text(char* p, const char* s) {
  while (*s) *p++ = *s++;
  return p;
}

bool contains(const pid_t* list, std::size_t n, pid_t pid) {
  for (std::size_t i = 0; i < n; ++i)
    if (list[i] == pid) return true;
  return false;
}

// Calls add(child) for every child of every thread of `pid`.
template <typename Add>
void for_each_child(pid_t pid, Add&& add) {
  char path[64];
  char* p = put_text(path, "/proc/");
  p = put_number(p, pid);
  p = put_text(p, "/task");
  *p = '\0';
  int dir = sys::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;  // gone
  char entries[4096];
  for (;;) {
    long n = sys::getdents64(dir, entries, sizeof entries);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      auto* e = reinterpret_cast<dirent64*>(entries + off);
      off += e->d_reclen;
      long tid = 0;
      const char* s = e->d_name;
      if (*s < '0' || *s > '9') continue;
      for (; *s >= '0' && *s <= '9'; ++s) tid = tid * 10 + (*s - '0');
      char file[96];
      char* q = put_text(file, path);
      *q++ = '/';
      q = put_number(q, tid);
      q = put_text(q, "/children");
      *q = '\0';
      int fd = sys::open(file, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      char buf[1024];
      long value = 0;
      bool in_number = false;
      for (;;) {
        long got = sys::read(fd, buf, sizeof buf);
        if (got <= 0) break;
        for (long i = 0; i < got; ++i) {
          char c = buf[i];
          if (c >= '0' && c <= '9') {
            value = value * 10 + (c - '0');
            in_number = true;
          } else if (in_number) {
            add(static_cast<pid_t>(value));
            value = 0;
            in_number = false;
          }
        }
      }
      if (in_number) add(static_cast<pid_t>(value));
      sys::close(fd);
    }
  }
  sys::close(dir);
}

}  // namespace

bool available() {
  char path[64];
  char* p = put_text(path, "/proc/");
  p = put_number(p, ::getpid());
  p = put_text(p, "/task/");
  p = put_number(p, ::getpid());
  p = put_text(p, "/children");
  *p = '\0';
  return ::access(path, R_OK) == 0;
}

std::size_t descendants(pid_t root, pid_t skip, pid_t* out, std::size_t max) {
  std::size_t count = 0;
  // Breadth first: out[0..count) is both the result and the queue.
  auto add = [&](pid_t child) {
    if (child <= 0 || child == skip || child == root || count >= max || contains(out, count, child)) return;
    out[count++] = child;
  };
  for_each_child(root, add);
  for (std::size_t next = 0; next < count; ++next) for_each_child(out[next], add);
  return count;
}

std::size_t signal_descendants(pid_t root, pid_t skip, int sig) {
  pid_t found[max_tracked];
  pid_t done[max_tracked];
  std::size_t done_count = 0;
  int quiet_passes = 0;
  for (int pass = 0; pass < 200 && quiet_passes < 2; ++pass) {
    std::size_t n = descendants(root, skip, found, max_tracked);
    bool fresh = false;
    for (std::size_t i = 0; i < n; ++i) {
      if (contains(done, done_count, found[i])) continue;
      sys::kill(found[i], sig);
      fresh = true;
      if (done_count < max_tracked) done[done_count++] = found[i];
    }
    if (sig != SIGKILL) break;  // one pass: a handler must not run twice for one signal
    quiet_passes = fresh ? 0 : quiet_passes + 1;
  }
  return done_count;
}

}  // namespace fencerun::supervisor::proctree
