#include "log/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <span>
#include <vector>

namespace fencerun::log {
namespace {

std::atomic<Level> g_level{Level::warn};
std::atomic<Format> g_format{Format::text};

spdlog::logger& logger() {
  // Created on first use, not at static-initialisation time: most runs log nothing.
  static spdlog::logger instance("fencerun", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  static const bool configured = [] {
    instance.set_pattern("%v");
    instance.set_level(spdlog::level::trace);
    instance.flush_on(spdlog::level::trace);
    return true;
  }();
  (void)configured;
  return instance;
}

const char* level_name(Level l) {
  switch (l) {
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warn: return "warn";
    case Level::error: return "error";
  }
  return "info";
}

spdlog::level::level_enum to_spdlog(Level l) {
  switch (l) {
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

std::string timestamp() {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

void write_event(Level level, std::string_view name, std::string_view message, std::span<const Field> fields);

bool is_json_number(std::string_view s) {
  if (s.empty() || s.size() > 16) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return s.size() == 1 || s[0] != '0';
}

}  // namespace

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

void init(Level level, Format format) {
  g_level.store(level);
  g_format.store(format);
}

bool enabled(Level level) { return level >= g_level.load(); }

void event(Level level, std::string_view name, std::string_view message, const Context& context,
           std::initializer_list<Field> fields) {
  if (!enabled(level)) return;
  std::vector<Field> all;
  all.reserve(fields.size() + 3);
  all.push_back({"lock", context.lock});
  if (!context.token.empty()) all.push_back({"token", context.token});
  if (!context.slot.empty()) all.push_back({"slot", context.slot});
  all.insert(all.end(), fields.begin(), fields.end());
  write_event(level, name, message, all);
}

void event(Level level, std::string_view name, std::string_view message, std::initializer_list<Field> fields) {
  if (!enabled(level)) return;
  write_event(level, name, message, std::span<const Field>(fields.begin(), fields.size()));
}

namespace {
void write_event(Level level, std::string_view name, std::string_view message, std::span<const Field> fields) {
  std::string line;
  if (g_format.load() == Format::json) {
    line = "{\"ts\":\"" + timestamp() + "\",\"level\":\"" + level_name(level) + "\",\"event\":\"" +
           json_escape(name) + "\",\"msg\":\"" + json_escape(message) + "\"";
    for (const auto& f : fields) {
      if (f.millis) {
        line += ",\"" + json_escape(f.key) + "_ms\":" + std::to_string(*f.millis);
        continue;
      }
      line += ",\"" + json_escape(f.key) + "\":";
      line += is_json_number(f.value) ? f.value : "\"" + json_escape(f.value) + "\"";
    }
    line += "}";
  } else {
    line = "fencerun: ";
    if (level == Level::error) line += "error: ";
    else if (level == Level::warn) line += "warning: ";
    line += message;
    if (!fields.empty()) {
      line += " [";
      bool first = true;
      for (const auto& f : fields) {
        if (!first) line += ", ";
        first = false;
        line += f.key;
        line += ": ";
        line += f.value;
      }
      line += "]";
    }
  }
  logger().log(to_spdlog(level), spdlog::string_view_t(line.data(), line.size()));
}

}  // namespace

}  // namespace fencerun::log
