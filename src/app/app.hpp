#pragma once
// The two things fencerun does: run a command under a lease, and report a lease's status. Each
// returns the process exit code; usage errors were caught before (config::make_config).
#include <string>

#include "config/config.hpp"

namespace fencerun::app {

// How fencerun ends: with `code`, or, when `signal` is set, by that signal (as the command did, or
// as the signal that ended the wait would have ended it), so that a calling shell sees it.
struct Exit {
  int code = 0;
  int signal = 0;
};
Exit run(const config::Config& config);
int status(const config::Config& config);
int history(const config::Config& config);
// --version -r URL: which server that is, its version and how fencerun releases a lock there.
int server_version(const config::Config& config);
int acl(const config::Config& config);
int list(const config::Config& config);
int break_lock(const config::Config& config);
int bump(const config::Config& config);

// The ACL rule `fencerun acl` prints: key and channel patterns for `key_prefix` and every command
// fencerun sends or its scripts run.
std::string acl_rule(const std::string& key_prefix, bool delex, bool delifeq = false, bool admin = false);

}  // namespace fencerun::app
