#include "config/duration.hpp"

#include <charconv>
#include <cstdint>
#include <limits>

namespace fencerun::config {

std::expected<std::chrono::milliseconds, std::string> parse_duration(std::string_view text) {
  if (text.empty()) return std::unexpected("empty duration");
  std::size_t digits = 0;
  bool negative = text.front() == '-';
  std::size_t start = (negative || text.front() == '+') ? 1 : 0;
  while (start + digits < text.size() && text[start + digits] >= '0' && text[start + digits] <= '9')
    ++digits;
  if (digits == 0)
    return std::unexpected("'" + std::string(text) + "' is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  std::string_view number = text.substr(start, digits);
  std::string_view unit = text.substr(start + digits);
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc{} || ptr != number.data() + number.size())
    return std::unexpected("'" + std::string(text) + "' is too large");
  std::int64_t scale = 0;
  if (unit.empty() || unit == "s") scale = 1000;
  else if (unit == "ms") scale = 1;
  else if (unit == "m") scale = 60'000;
  else if (unit == "h") scale = 3'600'000;
  else
    return std::unexpected("'" + std::string(text) + "' has an unknown unit '" + std::string(unit) +
                           "' (use ms, s, m or h)");
  // Cap at about 100 years: anything larger is a typo, and it keeps every sum of durations in range.
  constexpr std::int64_t k_max_ms = std::int64_t{100} * 365 * 24 * 3'600'000;
  if (value > k_max_ms / scale) return std::unexpected("'" + std::string(text) + "' is too large");
  std::int64_t ms = value * scale;
  return std::chrono::milliseconds(negative ? -ms : ms);
}

std::string format_duration(std::chrono::milliseconds d) {
  auto ms = d.count();
  std::string sign = ms < 0 ? "-" : "";
  std::int64_t a = ms < 0 ? -ms : ms;
  if (a != 0 && a % 3'600'000 == 0) return sign + std::to_string(a / 3'600'000) + "h";
  if (a != 0 && a % 60'000 == 0) return sign + std::to_string(a / 60'000) + "m";
  if (a % 1000 == 0) return sign + std::to_string(a / 1000) + "s";
  return sign + std::to_string(a) + "ms";
}

}  // namespace fencerun::config
