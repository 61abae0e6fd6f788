#include "util/duration.hpp"

#include <charconv>
#include <cstdint>

namespace fencerun::util {
namespace {

// Cap at about 100 years: anything larger is a typo, and it keeps every sum of durations in range.
constexpr std::int64_t k_max_ms = std::int64_t{100} * 365 * 24 * 3'600'000;

struct Unit {
  std::string_view name;
  std::int64_t scale;  // milliseconds per unit
};
// Largest first: the order the parts of a compound must follow.
constexpr Unit k_units[] = {{"h", 3'600'000}, {"m", 60'000}, {"s", 1'000}, {"ms", 1}};

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Reads a run of digits starting at `pos` and moves `pos` past it.
std::string_view digits_at(std::string_view text, std::size_t& pos) {
  std::size_t start = pos;
  while (pos < text.size() && is_digit(text[pos])) ++pos;
  return text.substr(start, pos - start);
}

}  // namespace

std::expected<std::chrono::milliseconds, std::string> parse_duration(std::string_view text) {
  if (text.empty()) return std::unexpected("empty duration");
  const std::string quoted = "'" + std::string(text) + "'";
  auto fail = [&quoted](std::string_view why) { return std::unexpected(quoted + " " + std::string(why)); };
  const bool negative = text.front() == '-';
  std::size_t pos = (negative || text.front() == '+') ? 1 : 0;
  if (pos == text.size() || !is_digit(text[pos])) {
    if (pos < text.size() && text[pos] == '.') return fail("needs a digit before the decimal point (as in 0.5s)");
    return fail("is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");
  }

  std::int64_t total = 0;
  std::size_t parts = 0;
  std::size_t previous_unit = 0;  // index into k_units of the previous part's unit
  while (pos < text.size()) {
    std::string_view whole = digits_at(text, pos);
    if (whole.empty()) return fail("needs a digit before the decimal point (as in 0.5s)");  // "1s.5ms"
    std::string_view fraction;
    if (pos < text.size() && text[pos] == '.') {
      ++pos;
      fraction = digits_at(text, pos);
      if (fraction.empty()) return fail("needs a digit after the decimal point");
    }
    std::size_t unit_start = pos;
    while (pos < text.size() && !is_digit(text[pos]) && text[pos] != '.') ++pos;
    std::string_view unit = text.substr(unit_start, pos - unit_start);
    if (unit.empty()) {
      if (pos < text.size()) return fail("is not a duration (expected e.g. 500ms, 30s, 5m, 1h)");  // "1.5.5s"
      if (parts > 0) return fail("needs a unit after its last number (use ms, s, m or h)");  // "1m30"
      unit = "s";  // a bare number is seconds
    }
    std::size_t u = 0;
    while (u < std::size(k_units) && k_units[u].name != unit) ++u;
    if (u == std::size(k_units))
      return fail("has an unknown unit '" + std::string(unit) + "' (use ms, s, m or h)");
    if (parts > 0 && u == previous_unit) return fail("repeats the unit '" + std::string(unit) + "'");
    if (parts > 0 && u < previous_unit)
      return fail("has its units out of order (largest first, as in 1h30m, 2m30s, 1s500ms)");
    previous_unit = u;
    ++parts;

    const std::int64_t scale = k_units[u].scale;
    std::int64_t value = 0;
    auto [ptr, ec] = std::from_chars(whole.data(), whole.data() + whole.size(), value);
    if (ec != std::errc{} || value > k_max_ms / scale) return fail("is too large");
    std::int64_t ms = value * scale;
    // The fraction must come out as whole milliseconds. Once its trailing zeros are gone, a fraction
    // of k > 7 digits never does: 10^k would have to divide it times 3'600'000 = 2^7 * 3^2 * 5^5,
    // so 10 would divide the fraction itself. What is left fits easily in 64 bits.
    while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
    if (!fraction.empty()) {
      if (fraction.size() > 7) return fail("is not a whole number of milliseconds");
      std::int64_t numerator = 0;
      std::from_chars(fraction.data(), fraction.data() + fraction.size(), numerator);
      std::int64_t denominator = 1;
      for (std::size_t i = 0; i < fraction.size(); ++i) denominator *= 10;
      if (numerator * scale % denominator != 0) return fail("is not a whole number of milliseconds");
      ms += numerator * scale / denominator;
    }
    if (ms > k_max_ms - total) return fail("is too large");
    total += ms;
  }
  return std::chrono::milliseconds(negative ? -total : total);
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

}  // namespace fencerun::util
