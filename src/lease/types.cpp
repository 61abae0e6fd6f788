#include "lease/types.hpp"

#include <charconv>

namespace fencerun::lease {
namespace {

template <class T>
std::optional<T> number(std::string_view s) {
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

Holder parse_holder(std::string_view value) {
  Holder h;
  std::string_view fields[4];
  std::size_t n = 0;
  while (n < 4 && !value.empty()) {
    auto sp = n < 3 ? value.find(' ') : std::string_view::npos;
    fields[n++] = value.substr(0, sp);
    value = sp == std::string_view::npos ? std::string_view{} : value.substr(sp + 1);
  }
  h.owner = std::string(fields[0]);
  if (n >= 2) h.token = number<std::uint64_t>(fields[1]);
  if (n >= 3) h.pid = number<long>(fields[2]);
  if (n >= 4) h.host = std::string(fields[3]);
  return h;
}

}  // namespace fencerun::lease
