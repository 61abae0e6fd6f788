#pragma once
// Small helpers shared by the integration and chaos tests: deadlines, temp dirs, files written by
// child processes, and process liveness read from /proc.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fencerun::test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Milliseconds between two instants, as a plain number (for messages and comparisons).
inline long long ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

// Polls pred every `poll` until it returns true or `timeout` has passed; returns the last result.
bool wait_until(const std::function<bool()>& pred, Clock::duration timeout,
                Clock::duration poll = 5ms);

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction unless
// FENCERUN_TEST_KEEP_TMP is set in the environment.
class TempDir {
 public:
  explicit TempDir(std::string_view tag = "t");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

std::optional<std::string> read_file(const std::filesystem::path& p);
void write_file(const std::filesystem::path& p, std::string_view content, mode_t mode = 0644);

// Waits until `p` exists and its content ends with a newline (a child wrote a whole line), then
// returns the content without surrounding whitespace. nullopt when the deadline passed first.
std::optional<std::string> wait_for_line(const std::filesystem::path& p, Clock::duration timeout);

// Like wait_for_line, parsed as a pid.
std::optional<pid_t> wait_for_pid_file(const std::filesystem::path& p, Clock::duration timeout);

std::vector<std::string> split_lines(std::string_view s);
std::string trim(std::string_view s);
std::optional<long long> parse_ll(std::string_view s);

// State letter from /proc/PID/status ('R', 'S', 'T', 'Z', ...), or nullopt when the pid is gone.
std::optional<char> process_state(pid_t pid);
// Gone, zombie ('Z') or dead ('X'): the process no longer runs. Orphans may stay zombies for a
// while because PID 1 reaps lazily, so kill(pid, 0) is not a usable liveness test.
bool process_dead(pid_t pid);
bool wait_dead(pid_t pid, Clock::duration timeout);
// Process group of a live process, from /proc/PID/stat; nullopt when gone.
std::optional<pid_t> process_group(pid_t pid);

// Kills pid with SIGKILL if it still runs (cleanup of processes a test started indirectly).
void kill_if_alive(pid_t pid);

std::string hostname();

// A TCP port below 32768 on 127.0.0.1 that could be bound just now (random start, retries).
// Nothing listens on it when this returns.
int pick_free_port();

// A port below 32768 with nothing listening: bound and closed, so connecting is refused.
inline int unused_port() { return pick_free_port(); }

std::string shell_quote(std::string_view s);

// "2026-12-05T10:00:00Z": Unix seconds as RFC 3339 in UTC, as FENCERUN_SLOT_START and history --utc
// print them.
std::string rfc3339_utc(long long unix_s);

}  // namespace fencerun::test
