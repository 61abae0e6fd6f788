#include "util/random.hpp"
#include "util/error.hpp"

#include <sys/random.h>

#include <cerrno>
#include <vector>

namespace fencerun {

std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  std::size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SystemError("getrandom");
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr char k_digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (unsigned char c : buf) {
    out.push_back(k_digits[c >> 4]);
    out.push_back(k_digits[c & 0xf]);
  }
  return out;
}

}  // namespace fencerun
