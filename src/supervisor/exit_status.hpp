#pragma once
// Exit codes: what fencerun returns for each outcome (SPEC section 7), and the mapping from a child's
// wait status to an exit code. Pure functions.
namespace fencerun {

namespace exit_code {
inline constexpr int k_success = 0;
inline constexpr int k_usage = 64;
inline constexpr int k_unavailable = 69;
inline constexpr int k_internal = 70;
inline constexpr int k_conflict_default = 75;
inline constexpr int k_status_free = 3;
inline constexpr int k_fence_stale = 77;
// fence guards: the write itself failed (an I/O error, a side file that is a symbolic link, an error
// reply from CMD).
inline constexpr int k_fence_write_failed = 1;
inline constexpr int k_lease_lost_default = 124;
inline constexpr int k_cannot_execute = 126;
inline constexpr int k_not_found = 127;
}  // namespace exit_code

// The exit code for a child that ended with wait(2) status `status`: its own exit status, or 128+N when
// it was killed by signal N.
int exit_code_from_wait_status(int status);

// 128 + signal number: how fencerun reports that a signal ended the wait for the lock.
inline int exit_code_for_signal(int signo) { return 128 + signo; }

}  // namespace fencerun
