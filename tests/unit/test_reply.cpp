#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "backends/redis/reply.hpp"

using fencerun::redis::Reply;
using fencerun::redis::to_display;

namespace {

Reply make(Reply::Type type, long long value = 0, std::string text = {}, std::vector<Reply> elements = {}) {
  Reply r;
  r.type = type;
  r.integer = value;
  r.str = std::move(text);
  r.elements = std::move(elements);
  return r;
}
Reply nil() { return Reply{}; }
Reply integer(long long v) { return make(Reply::Type::integer, v); }
Reply string(std::string s) { return make(Reply::Type::string, 0, std::move(s)); }
Reply status(std::string s) { return make(Reply::Type::status, 0, std::move(s)); }
Reply error(std::string s) { return make(Reply::Type::error, 0, std::move(s)); }
Reply array(std::vector<Reply> elements) { return make(Reply::Type::array, 0, {}, std::move(elements)); }

}  // namespace

TEST(reply_display, renders_nil) {
  EXPECT_EQ(to_display(nil()), "(nil)");
}

TEST(reply_display, renders_integers) {
  EXPECT_EQ(to_display(integer(42)), "(integer) 42");
  EXPECT_EQ(to_display(integer(-2)), "(integer) -2");
  EXPECT_EQ(to_display(integer(9'007'199'254'740'991)), "(integer) 9007199254740991");
}

TEST(reply_display, renders_status_replies_bare) {
  EXPECT_EQ(to_display(status("OK")), "OK");
}

TEST(reply_display, renders_errors_with_a_tag) {
  EXPECT_EQ(to_display(error("NOSCRIPT No matching script")), "(error) NOSCRIPT No matching script");
}

TEST(reply_display, quotes_strings) {
  EXPECT_EQ(to_display(string("hello world")), "\"hello world\"");
  EXPECT_EQ(to_display(string("")), "\"\"");
}

TEST(reply_display, escapes_quotes_backslashes_and_whitespace) {
  EXPECT_EQ(to_display(string("a\"b\\c")), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(to_display(string("line\nnext\r\tend")), "\"line\\nnext\\r\\tend\"");
}

TEST(reply_display, escapes_other_bytes_in_hex) {
  EXPECT_EQ(to_display(string(std::string("\x00\x01\x7f\xff", 4))), "\"\\x00\\x01\\x7f\\xff\"");
  EXPECT_EQ(to_display(string("caf\xc3\xa9")), "\"caf\\xc3\\xa9\"");
}

TEST(reply_display, escapes_bell_and_backspace_as_redis_cli_does) {
  // redis-cli (sdscatrepr) writes \a and \b for these two bytes.
  EXPECT_EQ(to_display(string("\a\b")), "\"\\a\\b\"");
}

TEST(reply_display, renders_an_empty_array) {
  EXPECT_EQ(to_display(array({})), "(empty array)");
}

TEST(reply_display, numbers_array_elements) {
  EXPECT_EQ(to_display(array({string("owner"), integer(41), nil()})), "1) \"owner\"\n2) (integer) 41\n3) (nil)");
}

TEST(reply_display, right_aligns_numbers_of_long_arrays) {
  std::vector<Reply> elements;
  for (int i = 1; i <= 10; ++i) elements.push_back(integer(i));
  EXPECT_EQ(to_display(array(elements)),
            " 1) (integer) 1\n 2) (integer) 2\n 3) (integer) 3\n 4) (integer) 4\n 5) (integer) 5\n"
            " 6) (integer) 6\n 7) (integer) 7\n 8) (integer) 8\n 9) (integer) 9\n10) (integer) 10");
}

TEST(reply_display, indents_nested_arrays) {
  Reply nested = array({array({string("a"), string("b")}), string("c"), array({}), array({array({integer(1)})})});
  EXPECT_EQ(to_display(nested), "1) 1) \"a\"\n   2) \"b\"\n2) \"c\"\n3) (empty array)\n4) 1) 1) (integer) 1");
}

TEST(reply_integer, reads_integer_replies) {
  EXPECT_EQ(integer(41).as_integer(), 41);
  EXPECT_EQ(integer(-1).as_integer(), -1);
}

TEST(reply_integer, reads_decimal_strings) {
  EXPECT_EQ(string("1712345678901234").as_integer(), 1'712'345'678'901'234);
  EXPECT_EQ(string("-7").as_integer(), -7);
  EXPECT_EQ(status("12").as_integer(), 12);
}

TEST(reply_integer, rejects_other_strings) {
  EXPECT_EQ(string("").as_integer(), std::nullopt);
  EXPECT_EQ(string("4x").as_integer(), std::nullopt);
  EXPECT_EQ(string(" 4").as_integer(), std::nullopt);
  EXPECT_EQ(string("+4").as_integer(), std::nullopt);
  EXPECT_EQ(string("1.5").as_integer(), std::nullopt);
  EXPECT_EQ(string("99999999999999999999").as_integer(), std::nullopt);
}

TEST(reply_integer, rejects_nil_errors_and_arrays) {
  EXPECT_EQ(nil().as_integer(), std::nullopt);
  EXPECT_EQ(error("42").as_integer(), std::nullopt);
  EXPECT_EQ(array({integer(1)}).as_integer(), std::nullopt);
}

TEST(reply_error, matches_the_whole_code_word) {
  Reply noscript = error("NOSCRIPT No matching script. Please use EVAL.");
  EXPECT_TRUE(noscript.error_is("NOSCRIPT"));
  EXPECT_FALSE(noscript.error_is("NOSCRIP"));
  EXPECT_FALSE(noscript.error_is("NOSCRIPTS"));
  EXPECT_FALSE(noscript.error_is("ERR"));
  EXPECT_TRUE(error("NOSCRIPT").error_is("NOSCRIPT"));
  EXPECT_FALSE(error("NOSCRIPTED x").error_is("NOSCRIPT"));
}

TEST(reply_error, matches_only_error_replies) {
  EXPECT_FALSE(string("NOSCRIPT x").error_is("NOSCRIPT"));
  EXPECT_FALSE(status("NOSCRIPT").error_is("NOSCRIPT"));
}

TEST(reply_type, classifies_replies) {
  EXPECT_TRUE(nil().is_nil());
  EXPECT_TRUE(error("ERR").is_error());
  EXPECT_TRUE(string("x").is_string());
  EXPECT_TRUE(status("OK").is_string());
  EXPECT_FALSE(integer(1).is_string());
  EXPECT_TRUE(array({}).is_array());
  EXPECT_FALSE(nil().is_array());
}
