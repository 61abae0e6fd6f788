#pragma once
// Logging on stderr, prefixed "fencerun:". Each event has a name (acquired, renew_failed, ...), a
// human message and context fields. Text: `fencerun: acquired lock [lock: nightly, token: 41]`.
// JSON (--log-format json): one object per line with ts, level, event, msg and the fields.
// Thread-safe. spdlog stays inside log.cpp.
#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace fencerun::log {

enum class Level { debug, info, warn, error };
enum class Format { text, json };

struct Field {
  std::string_view key;
  std::string value;
  // A duration: the text shows `value` ("key: 1500ms"), JSON an integer "key_ms": 1500.
  std::optional<long long> millis = std::nullopt;
};

inline Field millis(std::string_view key, std::chrono::milliseconds d, std::string text) {
  return {key, std::move(text), d.count()};
}

// The lease an event belongs to: every lease event carries the lock name and token.
struct Context {
  std::string lock;
  std::string token;
  std::string slot = {};  // a counting lock's slot (--limit N > 1); empty otherwise
};

void init(Level level, Format format);
bool enabled(Level level);
void event(Level level, std::string_view name, std::string_view message, std::initializer_list<Field> fields = {});
void event(Level level, std::string_view name, std::string_view message, const Context& context,
           std::initializer_list<Field> fields = {});

// Escapes `s` as the inside of a JSON string.
std::string json_escape(std::string_view s);

}  // namespace fencerun::log
