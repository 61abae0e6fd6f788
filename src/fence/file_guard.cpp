// The file guard. Every file operation is relative to a descriptor of PATH's directory, so the temp
// files, the side record, the lock file and PATH are all in one directory (rename is atomic there)
// and the directory fsyncs cover them. Side files are opened with O_NOFOLLOW: a symbolic link planted
// there would make the guard read, create or lock a file elsewhere.
#include "fence/file_guard.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "fence/fence.hpp"
#include "supervisor/exit_status.hpp"
#include "supervisor/signals.hpp"
#include "util/clock.hpp"
#include "util/error.hpp"
#include "util/fd.hpp"
#include "util/random.hpp"

namespace fencerun::fence {
namespace {

// The guarded write failed (exit 1); the message names the operation and the file.
Error io_error(const std::string& what) { return Error(ErrorKind::io, what); }
Error io_error(const std::string& what, int err) { return Error(ErrorKind::io, what + ": " + std::strerror(err)); }

// A side file opened with O_NOFOLLOW failed: ELOOP means it is a symbolic link.
[[noreturn]] void throw_open_error(const std::string& what, const std::string& shown, int err) {
  if (err == ELOOP)
    throw io_error(shown + " is a symbolic link; refusing to follow it (remove it if it is not yours)");
  throw io_error("cannot open " + what + " " + shown, err);
}

// A signal (HUP, INT, QUIT, TERM) ended the guard before its commit; carries its number.
struct Stopped {
  int signo;
};

std::optional<std::uint64_t> to_u64(std::string_view s) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// A plain file name in the same directory that this guard could have created.
bool is_temp_name(std::string_view name) {
  return name.size() > 5 && name.front() == '.' && name.find('/') == std::string_view::npos &&
         name.substr(name.size() - 4) == ".tmp";
}

void write_all(int fd, const char* data, std::size_t size, const std::string& what) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error("cannot write " + what, errno);
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void fsync_or_throw(int fd, const std::string& what) {
  if (::fsync(fd) != 0) throw io_error("cannot fsync " + what, errno);
}

// Reads a whole small file relative to `dirfd`; nullopt when it does not exist.
std::optional<std::string> read_small_file(int dirfd, const std::string& name, const std::string& shown) {
  UniqueFd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW));
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    throw_open_error("side record", shown, errno);
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error("cannot read " + shown, errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > 65536) throw io_error(shown + " is too large to be a fence side record");
  }
  return out;
}

bool exists_at(int dirfd, const std::string& name) {
  struct stat st{};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return true;
  if (errno == ENOENT) return false;
  throw io_error("cannot stat " + name, errno);
}

// Everything the guard knows about PATH's side files.
struct Paths {
  std::string shown;        // PATH as given (messages)
  std::string dir;          // PATH's directory ("." when PATH has none)
  std::string base;         // PATH's file name
  std::string record;       // base + ".fence"
  std::string lock;         // base + ".fence.lock"
};

Paths make_paths(const std::string& path) {
  std::filesystem::path p(path);
  Paths out;
  out.shown = path;
  out.base = p.filename().string();
  out.dir = p.has_parent_path() ? p.parent_path().string() : ".";
  if (out.base.empty() || out.base == "." || out.base == "..")
    throw io_error("PATH '" + path + "' does not name a file");
  out.record = out.base + ".fence";
  out.lock = out.base + ".fence.lock";
  return out;
}

struct State {
  std::optional<SideRecord> record;   // nullopt: nothing accepted yet
  std::uint64_t effective = 0;        // token in force (0: none)
  std::optional<std::string> orphan;  // data temp of a write that never landed
};

State read_state(int dirfd, const Paths& p) {
  State s;
  auto text = read_small_file(dirfd, p.record, p.shown + ".fence");
  if (!text) return s;
  auto record = parse_side_record(*text);
  if (!record)
    throw io_error("side record " + p.shown + ".fence is malformed (" + record.error() +
                             "); refusing to guess which token it accepted");
  bool temp_exists = record->pending && exists_at(dirfd, record->pending->temp_name);
  s.effective = effective_token(*record, temp_exists);
  if (temp_exists) s.orphan = record->pending->temp_name;
  s.record = std::move(*record);
  return s;
}

mode_t current_umask() {
  mode_t m = ::umask(022);
  ::umask(m);
  return m;
}

std::string temp_name(const std::string& stem) { return "." + stem + "." + random_hex(8) + ".tmp"; }

// A temp file being written in PATH's directory. Where the filesystem supports O_TMPFILE it has no
// name until link() (at the commit), so a guard killed before then, even by SIGKILL, leaves nothing
// behind. Elsewhere it gets a random name ".<stem>.<hex>.tmp" at once (created exclusively). A name
// the file still owns is removed on destruction, unless keep() said the name now counts.
class StagedFile {
 public:
  // `unnamed` says whether to try O_TMPFILE; it is cleared when the filesystem refuses it, so the
  // guard's later temp files go straight to the fallback.
  StagedFile(int dirfd, const Paths& p, std::string stem, mode_t mode, bool& unnamed)
      : m_dirfd(dirfd), m_stem(std::move(stem)) {
    if (unnamed) {
      m_fd.reset(::openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, mode));
      if (m_fd) return;
      // EOPNOTSUPP: the filesystem has no O_TMPFILE; EISDIR or EINVAL: the kernel predates it.
      if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
        throw io_error("cannot create a temp file in directory " + p.dir, errno);
      unnamed = false;
    }
    for (int attempt = 0; attempt < 16; ++attempt) {
      std::string name = temp_name(m_stem);
      m_fd.reset(::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, mode));
      if (m_fd) {
        m_name = std::move(name);
        return;
      }
      if (errno != EEXIST) throw io_error("cannot create a temp file next to " + p.shown, errno);
    }
    throw io_error("cannot find a free temp file name next to " + p.shown);
  }
  ~StagedFile() {
    if (!m_name.empty() && !m_kept) ::unlinkat(m_dirfd, m_name.c_str(), 0);
  }
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  int fd() const { return m_fd.get(); }
  // Gives an unnamed file its random name in the directory (a named one keeps its own); returns it.
  const std::string& link() {
    if (!m_name.empty()) return m_name;
    for (int attempt = 0; attempt < 16; ++attempt) {
      std::string name = temp_name(m_stem);
      // AT_EMPTY_PATH links the descriptor itself but needs CAP_DAC_READ_SEARCH; /proc/self/fd
      // does the same for anyone.
      int rc = ::linkat(m_fd.get(), "", m_dirfd, name.c_str(), AT_EMPTY_PATH);
      if (rc != 0 && errno != EEXIST) {
        std::string proc = "/proc/self/fd/" + std::to_string(m_fd.get());
        rc = ::linkat(AT_FDCWD, proc.c_str(), m_dirfd, name.c_str(), AT_SYMLINK_FOLLOW);
      }
      if (rc == 0) {
        m_name = std::move(name);
        return m_name;
      }
      if (errno != EEXIST) throw io_error("cannot give the temp file of " + m_stem + " a name", errno);
    }
    throw io_error("cannot find a free temp file name for " + m_stem);
  }
  void close() { m_fd.reset(); }
  void keep() { m_kept = true; }

 private:
  int m_dirfd;
  std::string m_stem;
  UniqueFd m_fd;
  std::string m_name;  // empty while unnamed
  bool m_kept = false;
};

// Waits until stdin is readable, or throws Stopped for a signal that ends the guard.
void wait_readable(supervisor::SignalChannel& signals, int fd) {
  for (;;) {
    bool ready = false;
    // No deadline of its own: the producer may take as long as it likes; the hour only bounds one wait.
    if (auto sig = signals.wait_for_terminating(BootClock::now() + std::chrono::hours(1), fd, ready))
      throw Stopped{*sig};
    if (ready) return;
  }
}

// stdin -> `file`, with PATH's mode (or 0666 & ~umask for a new PATH), fsynced.
void spool_stdin(int dirfd, const Paths& p, StagedFile& file, supervisor::SignalChannel& signals) {
  char buf[65536];
  for (;;) {
    wait_readable(signals, STDIN_FILENO);
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw io_error("cannot read stdin", errno);
    }
    if (n == 0) break;
    write_all(file.fd(), buf, static_cast<std::size_t>(n), "the temp file of " + p.shown);
  }

  struct stat st{};
  if (::fstatat(dirfd, p.base.c_str(), &st, 0) == 0 && S_ISREG(st.st_mode)) {
    if (::fchmod(file.fd(), st.st_mode & 07777) != 0) throw io_error("cannot set the mode of the temp file", errno);
    // Keep the owner when we may (root replacing another user's file); a failure leaves it ours.
    if (::geteuid() == 0 && (st.st_uid != ::geteuid() || st.st_gid != ::getegid())) {
      [[maybe_unused]] int ignored = ::fchown(file.fd(), st.st_uid, st.st_gid);
    }
  } else if (::fchmod(file.fd(), 0666 & ~current_umask()) != 0) {
    throw io_error("cannot set the mode of the temp file", errno);
  }
  fsync_or_throw(file.fd(), "the temp file of " + p.shown);
}

// Takes flock(LOCK_EX) on `fd`, or throws Stopped for a signal that ends the guard meanwhile (flock
// cannot wait on the signalfd, so a busy lock is retried at short intervals).
void lock_exclusive(int fd, const Paths& p, supervisor::SignalChannel& signals) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return;
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) throw io_error("cannot lock " + p.shown + ".fence.lock", errno);
    if (auto sig = signals.wait_for_terminating(BootClock::now() + pause)) throw Stopped{*sig};
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

void print_stale(std::uint64_t token, const Paths& p, std::uint64_t accepted) {
  std::fprintf(stderr, "fencerun: %s\n", stale_message(token, p.shown, accepted).c_str());
}

// Opens PATH.fence.lock (never through a symbolic link) and holds flock(LOCK_EX) on it: every writer
// and fenced reader of PATH serialises here.
UniqueFd lock_writers(int dirfd, const Paths& p, supervisor::SignalChannel& signals) {
  UniqueFd lock(::openat(dirfd, p.lock.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, 0666));
  if (!lock) throw_open_error("lock file", p.shown + ".fence.lock", errno);
  lock_exclusive(lock.get(), p, signals);
  return lock;
}

// Replaces the side record with `record`: temp file, fsync, rename over PATH.fence.
void write_record(int dirfd, const Paths& p, const SideRecord& record, bool& unnamed) {
  std::string text = format_side_record(record);
  StagedFile temp(dirfd, p, p.record, 0666, unnamed);  // the umask applies
  write_all(temp.fd(), text.data(), text.size(), "the temp file of " + p.shown + ".fence");
  fsync_or_throw(temp.fd(), "the temp file of " + p.shown + ".fence");
  const std::string& name = temp.link();
  temp.close();
  if (::renameat(dirfd, name.c_str(), dirfd, p.record.c_str()) != 0)
    throw io_error("cannot rename " + name + " to " + p.shown + ".fence", errno);
  temp.keep();
}

// Commits the spooled `data` with `token`; the lock is held. The order is what makes a crash safe
// (see file_guard.hpp):
//   0. give data its temp name (an unnamed O_TMPFILE file gets one only now);
//   1. side record "token / pending <effective> <data's name>", fsync the directory;
//   2. rename data over PATH: the commit point; fsync the directory;
//   3. side record "token" alone (tidy: the pending line is harmless once data's name is gone, so this
//      step needs no directory fsync; a crash may leave either version, and both say `token`).
// A crash before 2 leaves data's name in place, so readers know the token never took effect. Once
// the side record names it, that name must not be removed until it is renamed, because its existence
// is what says "this token's data never landed": hence keep() right after step 1.
void commit(int dirfd, const Paths& p, std::uint64_t token, std::uint64_t effective, StagedFile& data,
            bool& unnamed) {
  const std::string& data_temp = data.link();
  data.close();
  SideRecord record;
  record.token = token;
  record.pending = SideRecord::Pending{effective, data_temp};
  write_record(dirfd, p, record, unnamed);
  data.keep();
  fsync_or_throw(dirfd, "directory " + p.dir);

  if (::renameat(dirfd, data_temp.c_str(), dirfd, p.base.c_str()) != 0)
    throw io_error("cannot rename " + data_temp + " to " + p.shown, errno);
  fsync_or_throw(dirfd, "directory " + p.dir);

  record.pending.reset();
  write_record(dirfd, p, record, unnamed);
}

}  // namespace

std::expected<SideRecord, std::string> parse_side_record(std::string_view text) {
  SideRecord r;
  auto nl = text.find('\n');
  std::string_view first = text.substr(0, nl);
  std::string_view rest = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
  auto token = to_u64(first);
  if (!token || *token == 0 || *token >= k_token_limit)
    return std::unexpected("first line '" + std::string(first) + "' is not a token");
  r.token = *token;
  if (rest.empty()) return r;

  // "pending PREVIOUS TEMPNAME\n"
  auto nl2 = rest.find('\n');
  std::string_view line = rest.substr(0, nl2);
  std::string_view after = nl2 == std::string_view::npos ? std::string_view{} : rest.substr(nl2 + 1);
  if (!after.empty()) return std::unexpected("unexpected text after the second line");
  constexpr std::string_view k_pending = "pending ";
  if (line.substr(0, k_pending.size()) != k_pending) return std::unexpected("second line is not 'pending ...'");
  line.remove_prefix(k_pending.size());
  auto sp = line.find(' ');
  if (sp == std::string_view::npos) return std::unexpected("pending line lacks the temp file name");
  auto previous = to_u64(line.substr(0, sp));
  std::string_view name = line.substr(sp + 1);
  if (!previous || *previous >= k_token_limit || *previous > r.token)
    return std::unexpected("pending line has a bad previous token");
  if (!is_temp_name(name)) return std::unexpected("pending line has a bad temp file name");
  r.pending = SideRecord::Pending{*previous, std::string(name)};
  return r;
}

std::string format_side_record(const SideRecord& record) {
  std::string out = std::to_string(record.token) + "\n";
  if (record.pending)
    out += "pending " + std::to_string(record.pending->previous) + " " + record.pending->temp_name + "\n";
  return out;
}

std::uint64_t effective_token(const SideRecord& record, bool temp_exists) {
  if (record.pending && temp_exists) return record.pending->previous;
  return record.token;
}

int run_file_guard(std::uint64_t token, const std::string& path) {
  try {
    // HUP, INT, QUIT and TERM are read from a signalfd, so they end the guard only while it waits
    // (for stdin or the lock), never halfway through the commit, and the temp file is removed first.
    supervisor::SignalChannel signals;
    Paths p = make_paths(path);
    UniqueFd dirfd(::open(p.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dirfd) throw io_error("cannot open directory " + p.dir, errno);
    {
      struct stat st{};
      if (::fstatat(dirfd.get(), p.base.c_str(), &st, 0) == 0 && S_ISDIR(st.st_mode))
        throw io_error("PATH " + p.shown + " is a directory");
    }

    // Early answer for a stale writer, before reading its data (without the lock: the record is only
    // ever replaced by rename, so this reads a whole record; the decision is made again under the lock).
    if (State early = read_state(dirfd.get(), p); token < early.effective) {
      print_stale(token, p, early.effective);
      return exit_code::k_fence_stale;
    }

    // The data is spooled before the lock is taken, so a slow or paused producer never holds up other
    // writers.
    bool unnamed = true;
    StagedFile data(dirfd.get(), p, p.base, 0600, unnamed);
    spool_stdin(dirfd.get(), p, data, signals);

    UniqueFd lock = lock_writers(dirfd.get(), p, signals);
    State s = read_state(dirfd.get(), p);
    if (token < s.effective) {
      print_stale(token, p, s.effective);
      return exit_code::k_fence_stale;
    }
    commit(dirfd.get(), p, token, s.effective, data, unnamed);
    // The record no longer names the data temp of a write that never landed: remove it.
    if (s.orphan) ::unlinkat(dirfd.get(), s.orphan->c_str(), 0);
    return exit_code::k_success;
  } catch (const Stopped& stopped) {
    std::fprintf(stderr, "fencerun: fence file %s: stopped by SIG%s before the commit; nothing written\n",
                 path.c_str(), supervisor::signal_name(stopped.signo).c_str());
    return exit_code_for_signal(stopped.signo);
  } catch (const Error& e) {
    // Reported by main() with its exit code (1 for a failed write); the path says which guard failed.
    throw Error(e.kind(), "fence file " + path + ": " + e.what());
  }
}

int run_file_read(std::uint64_t token, const std::string& path) {
  try {
    supervisor::SignalChannel signals;
    Paths p = make_paths(path);
    UniqueFd dirfd(::open(p.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dirfd) throw io_error("cannot open directory " + p.dir, errno);
    UniqueFd lock = lock_writers(dirfd.get(), p, signals);
    State s = read_state(dirfd.get(), p);
    if (token < s.effective) {
      print_stale(token, p, s.effective);
      return exit_code::k_fence_stale;
    }
    if (token > s.effective || s.orphan) {
      // Admitted: from now on an older token's write is rejected. Durable before PATH is shown, so
      // that a crash cannot forget the admission of a read whose result is already out.
      bool unnamed = true;
      write_record(dirfd.get(), p, SideRecord{token, std::nullopt}, unnamed);
      fsync_or_throw(dirfd.get(), "directory " + p.dir);
      if (s.orphan) ::unlinkat(dirfd.get(), s.orphan->c_str(), 0);
    }
    UniqueFd data(::openat(dirfd.get(), p.base.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW));
    if (!data) {
      if (errno == ENOENT) return exit_code::k_success;  // nothing written yet: empty
      throw_open_error("file", p.shown, errno);
    }
    struct stat st{};
    if (::fstat(data.get(), &st) == 0 && S_ISDIR(st.st_mode)) throw io_error("PATH " + p.shown + " is a directory");
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(data.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw io_error("cannot read " + p.shown, errno);
      if (n == 0) break;
      write_all(STDOUT_FILENO, buf, static_cast<std::size_t>(n), "standard output");
    }
    return exit_code::k_success;
  } catch (const Stopped& stopped) {
    std::fprintf(stderr, "fencerun: fence file %s: stopped by SIG%s while waiting for the lock; nothing admitted\n",
                 path.c_str(), supervisor::signal_name(stopped.signo).c_str());
    return exit_code_for_signal(stopped.signo);
  } catch (const Error& e) {
    throw Error(e.kind(), "fence file " + path + ": " + e.what());
  }
}

}  // namespace fencerun::fence
