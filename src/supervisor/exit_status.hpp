#pragma once
// The mapping from a child's wait status to an exit code. Pure functions. The codes themselves are
// in util/exit_code.hpp.
#include "util/exit_code.hpp"

namespace fencerun {

// The exit code for a child that ended with wait(2) status `status`: its own exit status, or 128+N when
// it was killed by signal N.
int exit_code_from_wait_status(int status);

// 128 + signal number: how fencerun reports that a signal ended the wait for the lock.
inline int exit_code_for_signal(int signo) { return exit_code::k_signal_base + signo; }

}  // namespace fencerun
