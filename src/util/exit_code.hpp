#pragma once
// Exit codes: what fencerun returns for each outcome (the man page's EXIT STATUS). The one table:
// every part of fencerun names its codes from here.
namespace fencerun::exit_code {

inline constexpr int k_success = 0;
// fence guards: the write itself failed (an I/O error, a side file that is a symbolic link, an error
// reply from CMD).
inline constexpr int k_fence_write_failed = 1;
inline constexpr int k_status_free = 3;             // status: the lock is free
inline constexpr int k_usage = 64;                  // bad options or input (EX_USAGE)
inline constexpr int k_unavailable = 69;            // Redis cannot be used (EX_UNAVAILABLE)
inline constexpr int k_internal = 70;               // fencerun's own failure (EX_SOFTWARE)
inline constexpr int k_conflict_default = 75;       // the lock is busy (EX_TEMPFAIL); --conflict-exit-code
inline constexpr int k_fence_stale = 77;            // fence: a stale token was rejected
inline constexpr int k_skipped_default = 0;         // --min-interval: skipped, ran recently; --skip-exit-code
inline constexpr int k_lease_lost_default = 124;    // the lease was lost (as timeout(1)); --lease-lost-exit-code
inline constexpr int k_cannot_execute = 126;        // COMMAND found but not executable
inline constexpr int k_not_found = 127;             // COMMAND not found
inline constexpr int k_signal_base = 128;           // + N: ended by signal N

}  // namespace fencerun::exit_code
