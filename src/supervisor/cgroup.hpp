#pragma once
// JobCgroup: a cgroup v2 group of the job's own, below fencerun's cgroup, when the hierarchy is writable
// there (root, or a unit with Delegate=yes). Every descendant of the command stays in it whatever it
// does with process groups and sessions (setsid, setpgid, `set -m`), and cgroup.kill ends them all at
// once. Where no cgroup can be made, the job is stopped through its pid and process group only.
#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

#include "util/fd.hpp"

namespace fencerun::supervisor {

// Whether a FENCERUN_CGROUP value turns the job's cgroup off: off, 0, false or no, in any case.
bool cgroup_disabled_by(std::string_view value);

// `signo` to every pid listed in the open cgroup.procs file `procs_fd`. Async-signal-safe.
void signal_cgroup_members(int procs_fd, int signo);

class JobCgroup {
 public:
  // Makes the cgroup, or returns nullopt with the reason in `why_not` (disabled by
  // FENCERUN_CGROUP=off, no cgroup v2, not writable, no cgroup.kill on this kernel).
  static std::optional<JobCgroup> create(std::string& why_not);
  JobCgroup(JobCgroup&& other) noexcept;
  JobCgroup& operator=(JobCgroup&&) = delete;
  // Kills what is left and removes the cgroup.
  ~JobCgroup();

  const std::string& path() const { return m_path; }
  // The cgroup's directory (O_PATH), for clone3(CLONE_INTO_CGROUP): the command starts inside.
  int dir_fd() const { return m_dir.get(); }
  // cgroup.procs newly opened for writing (-1 on failure; the caller closes it): "0" written to it
  // moves the writer in (the child does it before exec where the kernel cannot start it inside).
  int open_procs_for_writing() const;
  int kill_fd() const { return m_kill.get(); }
  // True while any process is in the cgroup (cgroup.events "populated 1").
  bool populated() const;
  // SIGKILL to every process in the cgroup.
  void kill() const;
  // `signo` to every process in the cgroup now (read from cgroup.procs).
  void signal_all(int signo) const;
  // cgroup.procs open for reading (pread from 0), opened on first use (-1 when it cannot be).
  int procs_read_fd() const;
  // cgroup.events open for reading ("populated 0" once the job is gone).
  int events_fd() const { return m_events.get(); }
  // Whether `pid` is in this cgroup (read from /proc/PID/cgroup).
  bool contains(pid_t pid) const;

 private:
  JobCgroup() = default;
  std::string m_path;      // absolute path in the mounted hierarchy
  std::string m_relative;  // as /proc/PID/cgroup shows it
  UniqueFd m_dir, m_kill, m_events;
  mutable UniqueFd m_procs_read;
};

}  // namespace fencerun::supervisor
