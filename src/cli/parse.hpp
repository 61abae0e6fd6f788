#pragma once
// The command line -> config::Options. CLI11 stays inside parse.cpp. Arguments after the first `--`
// are the COMMAND and are never seen by the option parser, so they arrive byte for byte.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/options.hpp"

namespace fencerun::cli {

// Throws UsageError with a one-line message for anything malformed.
config::Options parse(int argc, const char* const* argv);

// The text of `fencerun --help`.
std::string help_text();

// An option of one command alone (`--name VALUE` or `--name=VALUE`), parsed together with the
// connection options so that both kinds may come in any order.
struct OwnOption {
  std::string name;                   // e.g. "--token"
  std::optional<std::string>* value;  // set when the option is given
};

// For commands that take the connection options of run and status (-r, --timeout, --key-prefix,
// --tls-*, -v, -q, --log-format) plus `own`, then a COMMAND (`fencerun fence redis`). Options end
// at `--` or at the first word that is not an option; the words from there on (after the `--`) are
// Options::command, byte for byte. Throws UsageError.
config::Options parse_connection_command(const std::vector<std::string_view>& words,
                                         const std::vector<OwnOption>& own);

}  // namespace fencerun::cli
