// The file guard. Every file operation is relative to a descriptor of PATH's directory, so the temp
// files, the side record, the lock file and PATH are all in one directory (rename is atomic there)
// and the directory fsyncs cover them. Side files are opened with O_NOFOLLOW: a symbolic link planted
// there would make the guard read, create or lock a file elsewhere.
#include "fence/file_guard.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "fence/fence.hpp"
#include "supervisor/exit_status.hpp"
#include "util/fd.hpp"
#include "util/random.hpp"

namespace fencerun::fence {
namespace {

// An I/O failure; the message names the operation and the file.
class IoError : public std::runtime_error {
 public:
  IoError(const std::string& what, int err) : std::runtime_error(what + ": " + std::strerror(err)) {}
};

// A side file opened with O_NOFOLLOW failed: ELOOP means it is a symbolic link.
[[noreturn]] void throw_open_error(const std::string& what, const std::string& shown, int err) {
  if (err == ELOOP)
    throw std::runtime_error(shown + " is a symbolic link; refusing to follow it (remove it if it is not yours)");
  throw IoError("cannot open " + what + " " + shown, err);
}

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
      throw IoError("cannot write " + what, errno);
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void fsync_or_throw(int fd, const std::string& what) {
  if (::fsync(fd) != 0) throw IoError("cannot fsync " + what, errno);
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
      throw IoError("cannot read " + shown, errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > 65536) throw std::runtime_error(shown + " is too large to be a fence side record");
  }
  return out;
}

bool exists_at(int dirfd, const std::string& name) {
  struct stat st{};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return true;
  if (errno == ENOENT) return false;
  throw IoError("cannot stat " + name, errno);
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
    throw std::runtime_error("PATH '" + path + "' does not name a file");
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
    throw std::runtime_error("side record " + p.shown + ".fence is malformed (" + record.error() +
                             "); refusing to guess which token it accepted");
  bool temp_exists = record->pending && exists_at(dirfd, record->pending->temp_name);
  s.effective = effective_token(*record, temp_exists);
  if (temp_exists) s.orphan = record->pending->temp_name;
  s.record = std::move(*record);
  return s;
}

// A new file in the directory with a random name ".<stem>.<hex>.tmp", created exclusively.
UniqueFd create_temp(int dirfd, const std::string& stem, mode_t mode, std::string& name) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    name = "." + stem + "." + random_hex(8) + ".tmp";
    UniqueFd fd(::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, mode));
    if (fd) return fd;
    if (errno != EEXIST) throw IoError("cannot create a temp file next to " + stem, errno);
  }
  throw std::runtime_error("cannot find a free temp file name next to " + stem);
}

mode_t current_umask() {
  mode_t m = ::umask(022);
  ::umask(m);
  return m;
}

// Unlinks a temp file unless disarmed (the guard failed before the file's rename counted).
class TempFile {
 public:
  TempFile(int dirfd, std::string name) : m_dirfd(dirfd), m_name(std::move(name)) {}
  ~TempFile() {
    if (m_armed) ::unlinkat(m_dirfd, m_name.c_str(), 0);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& name() const { return m_name; }
  void disarm() { m_armed = false; }

 private:
  int m_dirfd;
  std::string m_name;
  bool m_armed = true;
};

// stdin -> a new temp file in PATH's directory with PATH's mode (or 0666 & ~umask for a new PATH),
// fsynced.
std::string spool_stdin(int dirfd, const Paths& p) {
  std::string name;
  UniqueFd fd = create_temp(dirfd, p.base, 0600, name);
  TempFile guard(dirfd, name);

  char buf[65536];
  for (;;) {
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot read stdin", errno);
    }
    if (n == 0) break;
    write_all(fd.get(), buf, static_cast<std::size_t>(n), "temp file " + name);
  }

  struct stat st{};
  if (::fstatat(dirfd, p.base.c_str(), &st, 0) == 0 && S_ISREG(st.st_mode)) {
    if (::fchmod(fd.get(), st.st_mode & 07777) != 0) throw IoError("cannot set the mode of " + name, errno);
    // Keep the owner when we may (root replacing another user's file); a failure leaves it ours.
    if (::geteuid() == 0 && (st.st_uid != ::geteuid() || st.st_gid != ::getegid())) {
      [[maybe_unused]] int ignored = ::fchown(fd.get(), st.st_uid, st.st_gid);
    }
  } else if (::fchmod(fd.get(), 0666 & ~current_umask()) != 0) {
    throw IoError("cannot set the mode of " + name, errno);
  }
  fsync_or_throw(fd.get(), "temp file " + name);
  guard.disarm();
  return name;
}

void print_stale(std::uint64_t token, const Paths& p, std::uint64_t accepted) {
  std::fprintf(stderr, "fencerun: %s\n", stale_message(token, p.shown, accepted).c_str());
}

// Replaces the side record with `record`: temp file, fsync, rename over PATH.fence.
void write_record(int dirfd, const Paths& p, const SideRecord& record) {
  std::string text = format_side_record(record);
  std::string temp;
  UniqueFd fd = create_temp(dirfd, p.record, 0666, temp);  // the umask applies
  TempFile guard(dirfd, temp);
  write_all(fd.get(), text.data(), text.size(), "temp file " + temp);
  fsync_or_throw(fd.get(), "temp file " + temp);
  fd.reset();
  if (::renameat(dirfd, temp.c_str(), dirfd, p.record.c_str()) != 0)
    throw IoError("cannot rename " + temp + " to " + p.shown + ".fence", errno);
  guard.disarm();
}

// Commits the spooled data `data_temp` with `token`; the lock is held. The order is what makes a
// crash safe (see file_guard.hpp):
//   1. side record "token / pending <effective> <data_temp>", fsync the directory;
//   2. rename data_temp over PATH: the commit point; fsync the directory;
//   3. side record "token" alone (tidy: the pending line is harmless once data_temp is gone, so this
//      step needs no directory fsync; a crash may leave either version, and both say `token`).
// A crash before 2 leaves data_temp in place, so readers know the token never took effect.
// `named` is set once the side record names data_temp: from then on data_temp must not be removed
// until it is renamed, because its existence is what says "this token's data never landed".
void commit(int dirfd, const Paths& p, std::uint64_t token, std::uint64_t effective, const std::string& data_temp,
            bool& named) {
  SideRecord record;
  record.token = token;
  record.pending = SideRecord::Pending{effective, data_temp};
  write_record(dirfd, p, record);
  named = true;
  fsync_or_throw(dirfd, "directory " + p.dir);

  if (::renameat(dirfd, data_temp.c_str(), dirfd, p.base.c_str()) != 0)
    throw IoError("cannot rename " + data_temp + " to " + p.shown, errno);
  fsync_or_throw(dirfd, "directory " + p.dir);

  record.pending.reset();
  write_record(dirfd, p, record);
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
    Paths p = make_paths(path);
    UniqueFd dirfd(::open(p.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dirfd) throw IoError("cannot open directory " + p.dir, errno);
    {
      struct stat st{};
      if (::fstatat(dirfd.get(), p.base.c_str(), &st, 0) == 0 && S_ISDIR(st.st_mode))
        throw std::runtime_error("PATH " + p.shown + " is a directory");
    }

    // Early answer for a stale writer, before reading its data (without the lock: the record is only
    // ever replaced by rename, so this reads a whole record; the decision is made again under the lock).
    if (State early = read_state(dirfd.get(), p); token < early.effective) {
      print_stale(token, p, early.effective);
      return exit_code::k_fence_stale;
    }

    // The data is spooled before the lock is taken, so a slow or paused producer never holds up other
    // writers.
    TempFile data(dirfd.get(), spool_stdin(dirfd.get(), p));

    UniqueFd lock(
        ::openat(dirfd.get(), p.lock.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, 0666));
    if (!lock) throw_open_error("lock file", p.shown + ".fence.lock", errno);
    while (::flock(lock.get(), LOCK_EX) != 0) {
      if (errno != EINTR) throw IoError("cannot lock " + p.shown + ".fence.lock", errno);
    }

    State s = read_state(dirfd.get(), p);
    if (token < s.effective) {
      print_stale(token, p, s.effective);
      return exit_code::k_fence_stale;
    }
    bool named = false;
    try {
      commit(dirfd.get(), p, token, s.effective, data.name(), named);
    } catch (...) {
      if (named) data.disarm();
      throw;
    }
    data.disarm();
    // The record no longer names the data temp of a write that never landed: remove it.
    if (s.orphan) ::unlinkat(dirfd.get(), s.orphan->c_str(), 0);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fencerun: fence file %s: %s\n", path.c_str(), e.what());
    return k_write_failed;
  }
}

}  // namespace fencerun::fence
