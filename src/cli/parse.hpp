#pragma once
// The command line -> config::Options. CLI11 stays inside parse.cpp. Arguments after the first `--`
// are the COMMAND and are never seen by the option parser, so they arrive byte for byte.
#include <string>

#include "config/options.hpp"

namespace fencerun::cli {

// Throws UsageError with a one-line message for anything malformed.
config::Options parse(int argc, const char* const* argv);

// The text of `fencerun --help`.
std::string help_text();

}  // namespace fencerun::cli
