#pragma once
// A minimal JSON reader for checking fencerun's --json and --log-format json output.
// Numbers keep their source text so that 16-digit tokens compare exactly.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fencerun::test {

struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text;  // string value, or the number as written
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json* find(std::string_view key) const;  // object member, or nullptr
  std::optional<long long> as_int() const;        // integral number
  std::optional<std::string> as_string() const;
  bool is_true() const { return kind == Kind::Bool && boolean; }
};

// Whole input must be one JSON value (surrounding whitespace allowed).
std::optional<Json> parse_json(std::string_view s);

}  // namespace fencerun::test
