#pragma once
// The command line -> config::Options: one CLI11 parser for every command (run, status, acl, and
// fence with its guards file, redis and sql). CLI11 stays inside parse.cpp. Arguments from the
// COMMAND on (after NAME, or after `--`; for `fence redis`, CMD) are never seen by the option
// parser, so they arrive byte for byte.
#include <string>
#include <string_view>
#include <vector>

#include "config/options.hpp"

namespace fencerun::cli {

// Throws UsageError with a one-line message for anything malformed.
config::Options parse(int argc, const char* const* argv);

// `fencerun fence WORDS...` (`words` excludes "fence"): Subcommand::fence with fence_guard, the
// guard's options and operands (CMD of `fence redis` in Options::command), or Subcommand::help.
// Throws UsageError without the "(see fencerun fence --help)" that parse() adds.
config::Options parse_fence(const std::vector<std::string_view>& words);

// The text of `fencerun --help` (also shown for run, status and acl).
std::string help_text();

// The help of one command: "" (the same as help_text()), "fence", "fence file", "fence redis" or
// "fence sql". Empty for anything else.
std::string help_text(std::string_view command);

// The option names ("-r", "--redis", ...) the parser declares for each command: "" (the top level,
// which takes run's options), "run", "status", "acl", "fence", "fence file", "fence redis",
// "fence sql". For the test that every declared option is in the help and nothing else is.
struct DeclaredOptions {
  std::string command;
  std::vector<std::string> names;
};
std::vector<DeclaredOptions> declared_options();

}  // namespace fencerun::cli
