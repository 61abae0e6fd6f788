#include "support/json.hpp"

#include <charconv>
#include <cstdint>

namespace fencerun::test {

namespace {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  std::optional<Json> document() {
    auto v = value(0);
    ws();
    if (!v || i_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  bool lit(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }

  std::optional<Json> value(int depth) {
    if (depth > 64) return std::nullopt;
    ws();
    if (i_ >= s_.size()) return std::nullopt;
    Json j;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      j.kind = Json::Kind::Object;
      ws();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return j;
      }
      for (;;) {
        ws();
        auto k = string();
        if (!k) return std::nullopt;
        ws();
        if (i_ >= s_.size() || s_[i_] != ':') return std::nullopt;
        ++i_;
        auto v = value(depth + 1);
        if (!v) return std::nullopt;
        j.members.emplace_back(std::move(*k), std::move(*v));
        ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == '}') {
          ++i_;
          return j;
        }
        return std::nullopt;
      }
    }
    if (c == '[') {
      ++i_;
      j.kind = Json::Kind::Array;
      ws();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return j;
      }
      for (;;) {
        auto v = value(depth + 1);
        if (!v) return std::nullopt;
        j.items.push_back(std::move(*v));
        ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') {
          ++i_;
          return j;
        }
        return std::nullopt;
      }
    }
    if (c == '"') {
      auto str = string();
      if (!str) return std::nullopt;
      j.kind = Json::Kind::String;
      j.text = std::move(*str);
      return j;
    }
    if (lit("true")) {
      j.kind = Json::Kind::Bool;
      j.boolean = true;
      return j;
    }
    if (lit("false")) {
      j.kind = Json::Kind::Bool;
      return j;
    }
    if (lit("null")) return j;
    // number
    const size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    const size_t digits = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    if (i_ == digits) return std::nullopt;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    }
    j.kind = Json::Kind::Number;
    j.text = std::string(s_.substr(start, i_ - start));
    return j;
  }

  static void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::optional<uint32_t> hex4() {
    if (i_ + 4 > s_.size()) return std::nullopt;
    uint32_t v = 0;
    auto [p, ec] = std::from_chars(s_.data() + i_, s_.data() + i_ + 4, v, 16);
    if (ec != std::errc{} || p != s_.data() + i_ + 4) return std::nullopt;
    i_ += 4;
    return v;
  }

  std::optional<std::string> string() {
    if (i_ >= s_.size() || s_[i_] != '"') return std::nullopt;
    ++i_;
    std::string out;
    while (i_ < s_.size()) {
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) return std::nullopt;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) return std::nullopt;
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          auto cp = hex4();
          if (!cp) return std::nullopt;
          if (*cp >= 0xD800 && *cp < 0xDC00 && lit("\\u")) {
            auto lo = hex4();
            if (!lo) return std::nullopt;
            *cp = 0x10000 + ((*cp - 0xD800) << 10) + (*lo - 0xDC00);
          }
          utf8(out, *cp);
          break;
        }
        default: return std::nullopt;
      }
    }
    return std::nullopt;
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

const Json* Json::find(std::string_view key) const {
  if (kind != Kind::Object) return nullptr;
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

std::optional<long long> Json::as_int() const {
  if (kind != Kind::Number) return std::nullopt;
  long long v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<std::string> Json::as_string() const {
  if (kind != Kind::String) return std::nullopt;
  return text;
}

std::optional<Json> parse_json(std::string_view s) { return Parser(s).document(); }

}  // namespace fencerun::test
