#pragma once
// Durations on the command line: one or more parts, each a number followed by h, m, s or ms, largest
// unit first and each unit at most once ("500ms", "30s", "1.5s", "2m30s", "1h30m", "1s500ms"); a
// number is an integer or a decimal fraction with a digit before the point ("0.5s", not ".5s"). A
// bare number is seconds ("0.5" is 500ms). A leading '-' makes the whole value negative.
#include <chrono>
#include <expected>
#include <string>
#include <string_view>

namespace fencerun::util {

// Parses a duration into whole milliseconds; a value that is not a whole number of milliseconds
// ("0.0001s", "1.5ms") is an error, never rounded. Values beyond 100 years are an error. The error
// text says what was wrong, quoting the text (without the option name).
std::expected<std::chrono::milliseconds, std::string> parse_duration(std::string_view text);

// Shortest exact rendering: 1500ms -> "1500ms", 30000ms -> "30s", 300000ms -> "5m".
std::string format_duration(std::chrono::milliseconds d);

}  // namespace fencerun::util
