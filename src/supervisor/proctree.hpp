#pragma once
// The processes below a root process, read from /proc/PID/task/TID/children: how a terminal's
// foreground job that shares fencerun's process group is found and stopped where no cgroup can be made.
// fencerun is a child subreaper, so a descendant orphaned while fencerun lives is re-parented to it
// and stays in its tree; a process that daemonises (setsid, double fork) therefore stays reachable.
// descendants() and signal_descendants() make only raw system calls (sys.hpp): the watchdog calls them.
#include <sys/types.h>

#include <cstddef>

namespace fencerun::supervisor::proctree {

// Whether this kernel lists a task's children (CONFIG_PROC_CHILDREN).
bool available();

// Writes up to `max` descendants of `root` to `out` (children, their children, ...), leaving out
// `skip` and everything below it. Returns how many were written.
std::size_t descendants(pid_t root, pid_t skip, pid_t* out, std::size_t max);

// Sends `sig` to every descendant of `root` but `skip`'s subtree. For SIGKILL, looks again until two
// passes in a row find nobody new, so that a child forked during the pass is not missed. Returns how
// many processes were signalled.
std::size_t signal_descendants(pid_t root, pid_t skip, int sig);

}  // namespace fencerun::supervisor::proctree
