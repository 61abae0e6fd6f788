#pragma once
// Durations on the command line: an integer followed by ms, s, m or h ("500ms", "30s", "5m"); a bare
// integer is seconds.
#include <chrono>
#include <expected>
#include <string>
#include <string_view>

namespace fencerun::config {

// Parses a duration; the error text says what was wrong (without the option name).
std::expected<std::chrono::milliseconds, std::string> parse_duration(std::string_view text);

// Shortest exact rendering: 1500ms -> "1500ms", 30000ms -> "30s", 300000ms -> "5m".
std::string format_duration(std::chrono::milliseconds d);

}  // namespace fencerun::config
