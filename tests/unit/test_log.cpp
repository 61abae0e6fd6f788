#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "log/log.hpp"

namespace fl = fencerun::log;

namespace {

// Captures what is written to stderr (fd 2) while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    m_file = std::tmpfile();
    m_saved = ::dup(2);
    ::dup2(::fileno(m_file), 2);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    restore();
    std::rewind(m_file);
    std::string out;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, m_file)) out.append(buf, n);
    return out;
  }

 private:
  void restore() {
    if (m_saved < 0) return;
    std::fflush(stderr);
    ::dup2(m_saved, 2);
    ::close(m_saved);
    m_saved = -1;
  }
  std::FILE* m_file = nullptr;
  int m_saved = -1;
};

const fl::Context k_lease{"nightly", "41"};

}  // namespace

TEST(log_json_escape, escapes_quotes_backslashes_and_control_characters) {
  EXPECT_EQ(fl::json_escape("plain text"), "plain text");
  EXPECT_EQ(fl::json_escape("a\"b\\c"), "a\\\"b\\\\c");
  EXPECT_EQ(fl::json_escape("line\nnext\r\tend"), "line\\nnext\\r\\tend");
  EXPECT_EQ(fl::json_escape(std::string("\x00\x01\x1f", 3)), "\\u0000\\u0001\\u001f");
}

TEST(log_json_escape, keeps_utf8_and_other_bytes) {
  EXPECT_EQ(fl::json_escape("caf\xc3\xa9 \x7f"), "caf\xc3\xa9 \x7f");
}

TEST(log_text, writes_one_prefixed_line_with_the_lease_in_brackets) {
  fl::init(fl::Level::info, fl::Format::text);
  StderrCapture capture;
  fl::event(fl::Level::info, "acquired", "acquired lock", k_lease, {{"ttl", "30s"}});
  EXPECT_EQ(capture.text(), "fencerun: acquired lock [lock: nightly, token: 41, ttl: 30s]\n");
}

TEST(log_text, marks_warnings_and_errors) {
  fl::init(fl::Level::debug, fl::Format::text);
  StderrCapture capture;
  fl::event(fl::Level::warn, "renew_failed", "renew failed", k_lease, {{"error", "timeout"}});
  fl::event(fl::Level::error, "lease_lost", "lease lost", k_lease);
  EXPECT_EQ(capture.text(),
            "fencerun: warning: renew failed [lock: nightly, token: 41, error: timeout]\n"
            "fencerun: error: lease lost [lock: nightly, token: 41]\n");
}

TEST(log_text, leaves_out_an_unknown_token) {
  fl::init(fl::Level::info, fl::Format::text);
  StderrCapture capture;
  fl::event(fl::Level::info, "waiting", "lock busy, waiting", fl::Context{"nightly", ""});
  EXPECT_EQ(capture.text(), "fencerun: lock busy, waiting [lock: nightly]\n");
}

TEST(log_text, writes_events_without_fields_bare) {
  fl::init(fl::Level::info, fl::Format::text);
  StderrCapture capture;
  fl::event(fl::Level::info, "note", "hello");
  EXPECT_EQ(capture.text(), "fencerun: hello\n");
}

TEST(log_levels, stays_quiet_below_the_level) {
  fl::init(fl::Level::warn, fl::Format::text);
  StderrCapture capture;
  fl::event(fl::Level::info, "acquired", "acquired lock", k_lease);
  fl::event(fl::Level::debug, "renewed", "renewed", k_lease);
  EXPECT_EQ(capture.text(), "");
}

TEST(log_levels, orders_levels_from_debug_to_error) {
  fl::init(fl::Level::warn, fl::Format::text);
  EXPECT_FALSE(fl::enabled(fl::Level::debug));
  EXPECT_FALSE(fl::enabled(fl::Level::info));
  EXPECT_TRUE(fl::enabled(fl::Level::warn));
  EXPECT_TRUE(fl::enabled(fl::Level::error));
  fl::init(fl::Level::error, fl::Format::text);
  EXPECT_FALSE(fl::enabled(fl::Level::warn));
  fl::init(fl::Level::debug, fl::Format::text);
  EXPECT_TRUE(fl::enabled(fl::Level::debug));
}

TEST(log_json, writes_one_object_per_line) {
  fl::init(fl::Level::info, fl::Format::json);
  StderrCapture capture;
  fl::event(fl::Level::info, "acquired", "acquired \"lock\"", k_lease, {{"ttl_ms", "30000"}, {"host", "h1"}});
  std::string line = capture.text();
  fl::init(fl::Level::warn, fl::Format::text);
  std::regex shape(
      R"(\{"ts":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z","level":"info","event":"acquired","msg":"acquired \\"lock\\"",)"
      R"("lock":"nightly","token":41,"ttl_ms":30000,"host":"h1"\}\n)");
  EXPECT_TRUE(std::regex_match(line, shape)) << line;
}

TEST(log_json, quotes_values_that_are_not_plain_numbers) {
  fl::init(fl::Level::info, fl::Format::json);
  StderrCapture capture;
  fl::event(fl::Level::info, "e", "m", {{"a", "007"}, {"b", "-1"}, {"c", "12345678901234567"}, {"d", ""}, {"e", "0"}});
  std::string line = capture.text();
  fl::init(fl::Level::warn, fl::Format::text);
  EXPECT_NE(line.find(R"("a":"007","b":"-1","c":"12345678901234567","d":"","e":0})"), std::string::npos) << line;
}

TEST(log_json, writes_durations_as_integer_milliseconds_under_an_ms_key) {
  fl::init(fl::Level::info, fl::Format::json);
  StderrCapture capture;
  fl::event(fl::Level::info, "e", "m", {fl::millis("ttl", std::chrono::milliseconds(30'000), "30s")});
  std::string line = capture.text();
  fl::init(fl::Level::warn, fl::Format::text);
  EXPECT_NE(line.find(R"("ttl_ms":30000})"), std::string::npos) << line;
}

TEST(log_text, writes_durations_as_given) {
  fl::init(fl::Level::info, fl::Format::text);
  StderrCapture capture;
  fl::event(fl::Level::info, "e", "m", {fl::millis("ttl", std::chrono::milliseconds(1'500), "1500ms")});
  std::string line = capture.text();
  fl::init(fl::Level::warn, fl::Format::text);
  EXPECT_EQ(line, "fencerun: m [ttl: 1500ms]\n");
}
