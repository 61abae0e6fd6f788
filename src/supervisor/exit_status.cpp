#include "supervisor/exit_status.hpp"

#include <sys/wait.h>

namespace fencerun {

int exit_code_from_wait_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return exit_code::k_signal_base + WTERMSIG(status);
  return exit_code::k_internal;  // stopped/continued statuses are never passed here
}

}  // namespace fencerun
