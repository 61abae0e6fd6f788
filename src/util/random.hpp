#pragma once
// Unpredictable identifiers from the kernel CSPRNG (getrandom).
#include <cstddef>
#include <string>

namespace fencerun {

// `bytes` random bytes from getrandom(2), hex-encoded (2 * bytes characters). Throws SystemError
// if the kernel cannot supply them.
std::string random_hex(std::size_t bytes);

}  // namespace fencerun
