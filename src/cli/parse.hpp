#pragma once
// The command line -> config::Options. One declared grammar (src/cli/parse.cpp: one table of
// commands, one of options) drives the scan of argv (which word is which command), the checks of
// which command takes which option, every help text (the list of commands in `fencerun --help`
// too) and the command and option lists the tests compare with the man page and the shell
// completions. Arguments from the COMMAND on (after NAME, or after `--`; for `fence redis`, CMD)
// are never interpreted, so they arrive byte for byte.
//
// Grammar: fencerun [GLOBAL OPTIONS] [SUBCOMMAND] [OPTIONS] [OPERANDS] [--] [COMMAND...], where
// SUBCOMMAND is one of the words of the table of commands (run, status, ..., fence GUARD, help; the
// list `fencerun --help` prints), recognised after any options as git does. Without one, the first word is the NAME of a run; a first word one
// edit away from a subcommand is refused ("did you mean"), `fencerun run NAME` always means a lock.
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

// The text of `fencerun --help`.
std::string help_text();

// The help of one command: any name help_commands() returns ("" is the same as help_text()).
// Empty for anything else.
std::string help_text(std::string_view command);

// The option names ("-r", "--server", "--redis", ...) each command of help_commands() takes, from
// the grammar ("": the top level, run's options and --version). For the test that every declared
// option is in the help and nothing else is.
struct DeclaredOptions {
  std::string command;
  std::vector<std::string> names;
};
std::vector<DeclaredOptions> declared_options();

// The commands help_text() knows, in the table's order: "" (the top level), "run", "status", ...,
// "fence", "fence file", ...
std::vector<std::string> help_commands();

}  // namespace fencerun::cli
