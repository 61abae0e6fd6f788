#include "backends/redis/reply.hpp"

#include <charconv>

namespace fencerun::redis {

std::optional<long long> Reply::as_integer() const {
  if (type == Type::integer) return integer;
  if (type != Type::string && type != Type::status) return std::nullopt;
  long long value = 0;
  auto [ptr, ec] = std::from_chars(str.data(), str.data() + str.size(), value);
  if (str.empty() || ec != std::errc{} || ptr != str.data() + str.size()) return std::nullopt;
  return value;
}

std::string to_display(const Reply& r, int indent) {
  switch (r.type) {
    case Reply::Type::nil: return "(nil)";
    case Reply::Type::integer: return "(integer) " + std::to_string(r.integer);
    case Reply::Type::status: return r.str;
    case Reply::Type::error: return "(error) " + r.str;
    case Reply::Type::string: {
      std::string out = "\"";
      for (unsigned char c : r.str) {
        if (c == '"' || c == '\\') { out += '\\'; out += static_cast<char>(c); }
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c == '\a') out += "\\a";
        else if (c == '\b') out += "\\b";
        else if (c < 0x20 || c >= 0x7f) {
          static constexpr char k_hex[] = "0123456789abcdef";
          out += "\\x"; out += k_hex[c >> 4]; out += k_hex[c & 0xf];
        } else out += static_cast<char>(c);
      }
      return out + "\"";
    }
    case Reply::Type::array: {
      if (r.elements.empty()) return "(empty array)";
      std::string out;
      std::size_t width = std::to_string(r.elements.size()).size();
      for (std::size_t i = 0; i < r.elements.size(); ++i) {
        std::string num = std::to_string(i + 1);
        std::string prefix = (i == 0 ? "" : std::string(static_cast<std::size_t>(indent), ' ')) +
                             std::string(width - num.size(), ' ') + num + ") ";
        out += prefix + to_display(r.elements[i], indent + static_cast<int>(width) + 2);
        if (i + 1 < r.elements.size()) out += "\n";
      }
      return out;
    }
  }
  return {};
}

}  // namespace fencerun::redis
