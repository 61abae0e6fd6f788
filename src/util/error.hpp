#pragma once
// UsageError: bad options, bad durations, bad NAME, missing COMMAND. Caught only in main(), exit 64.
#include <stdexcept>
#include <string>

namespace fencerun {

class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace fencerun
