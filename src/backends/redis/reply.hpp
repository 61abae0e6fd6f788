#pragma once
// Reply: a decoded RESP2 reply, independent of hiredis. Server errors are replies (type error), not
// failures: the caller decides what an error reply means (e.g. NOSCRIPT).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fencerun::redis {

struct Reply {
  enum class Type { nil, integer, string, status, error, array };
  Type type = Type::nil;
  long long integer = 0;
  std::string str;  // string, status, error
  std::vector<Reply> elements;

  bool is_error() const { return type == Type::error; }
  bool is_nil() const { return type == Type::nil; }
  bool is_string() const { return type == Type::string || type == Type::status; }
  bool is_array() const { return type == Type::array; }
  // Error replies start with a code word: "NOSCRIPT No matching script".
  bool error_is(std::string_view code) const {
    return is_error() && str.size() >= code.size() && std::string_view(str).substr(0, code.size()) == code &&
           (str.size() == code.size() || str[code.size()] == ' ');
  }
  // An integer reply, or a string reply holding a plain decimal integer.
  std::optional<long long> as_integer() const;
};

// Renders a reply the way redis-cli does (used by `status` and the guards).
std::string to_display(const Reply& reply, int indent = 0);

}  // namespace fencerun::redis
