#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include "backends/redis/lease_client.hpp"
#include "backends/redis/reply.hpp"

using fencerun::BootClock;
using fencerun::lease::Acquired;
using fencerun::lease::Busy;
using fencerun::lease::LimitMismatch;
using fencerun::lease::parse_acquire_reply;
using fencerun::redis::Error;
using fencerun::redis::Reply;

namespace {

Reply integer(long long v) {
  Reply r;
  r.type = Reply::Type::integer;
  r.integer = v;
  return r;
}
Reply string(std::string s) {
  Reply r;
  r.type = Reply::Type::string;
  r.str = std::move(s);
  return r;
}
Reply array(std::vector<Reply> elements) {
  Reply r;
  r.type = Reply::Type::array;
  r.elements = std::move(elements);
  return r;
}

const std::string k_value = "0123456789abcdef0123456789abcdef 1718000000000123 4242 host1";

}  // namespace

TEST(acquire_reply, acquired_from_a_server_clock_ahead_of_the_counter_reports_no_gap) {
  const auto sent = BootClock::now();
  auto r = parse_acquire_reply(
      array({integer(1), string("1718000000000123"), string(k_value), integer(0x070000), integer(0)}), sent);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto* a = std::get_if<Acquired>(&*r);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->token, 1718000000000123u);
  EXPECT_EQ(a->value, k_value);
  EXPECT_EQ(a->sent, sent);
  EXPECT_FALSE(a->server_clock_behind);
  EXPECT_EQ(a->server_clock_gap, std::chrono::microseconds(0));
  EXPECT_FALSE(a->replicas_acked.has_value());
}

TEST(acquire_reply, acquired_from_a_server_clock_behind_the_counter_reports_the_gap) {
  auto r = parse_acquire_reply(
      array({integer(1), string("1718000030000001"), string(k_value), integer(0x070000), integer(30'000'123)}),
      BootClock::now());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto* a = std::get_if<Acquired>(&*r);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->token, 1718000030000001u);
  EXPECT_TRUE(a->server_clock_behind);
  EXPECT_EQ(a->server_clock_gap, std::chrono::microseconds(30'000'123));
}

TEST(acquire_reply, acquired_without_the_clock_check_is_a_protocol_error) {
  for (const auto& reply :
       {array({integer(1), string("41"), string(k_value), integer(0x070000)}),
        array({integer(1), string("41"), string(k_value), integer(0x070000), string("soon")}),
        array({integer(1), string("41"), string(k_value), integer(0x070000), integer(-1)})}) {
    auto r = parse_acquire_reply(reply, BootClock::now());
    ASSERT_FALSE(r.has_value()) << to_display(reply);
    EXPECT_EQ(r.error().kind, Error::Kind::protocol);
    EXPECT_EQ(r.error().message, "acquire script returned no clock check");
  }
}

TEST(acquire_reply, acquired_with_a_malformed_token_is_a_protocol_error) {
  auto r = parse_acquire_reply(array({integer(1), string("x41"), string(k_value), integer(0), integer(0)}),
                               BootClock::now());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, Error::Kind::protocol);
  EXPECT_EQ(r.error().message, "acquire script returned a malformed token");
}

TEST(acquire_reply, busy_keeps_its_five_elements) {
  auto r = parse_acquire_reply(array({integer(0), integer(1500), string(k_value), integer(0x070000), integer(0)}),
                               BootClock::now());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto* b = std::get_if<Busy>(&*r);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->remaining, std::chrono::milliseconds(1500));
  EXPECT_EQ(b->holder.owner, "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(b->holder.token, 1718000000000123u);
  EXPECT_FALSE(b->turn_expires.has_value());
}

TEST(acquire_reply, busy_with_another_fair_waiters_turn_says_when_it_expires) {
  Reply nil;
  auto r = parse_acquire_reply(array({integer(0), integer(-2), nil, integer(0x070000), integer(250)}),
                               BootClock::now());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto* b = std::get_if<Busy>(&*r);
  ASSERT_NE(b, nullptr);
  EXPECT_FALSE(b->remaining.has_value());
  EXPECT_EQ(b->turn_expires, std::chrono::milliseconds(250));
  EXPECT_FALSE(b->place.has_value());
}

TEST(acquire_reply, busy_for_a_queued_waiter_gives_its_place) {
  Reply nil;
  auto r = parse_acquire_reply(array({integer(0), integer(900), nil, integer(0x070000), integer(0), integer(3)}),
                               BootClock::now());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto* b = std::get_if<Busy>(&*r);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->remaining, std::chrono::milliseconds(900));
  EXPECT_EQ(b->place, 3);
  EXPECT_TRUE(b->holder.owner.empty());
  auto unqueued = parse_acquire_reply(array({integer(0), integer(900), nil, integer(0x070000), integer(0), integer(-1)}),
                                      BootClock::now());
  ASSERT_TRUE(unqueued.has_value());
  EXPECT_FALSE(std::get<Busy>(*unqueued).place.has_value());
}

TEST(acquire_reply, anything_else_is_a_protocol_error) {
  for (const auto& reply : {integer(1), array({integer(1), string("41")}),
                            array({string("1"), string("41"), string(k_value), integer(0), integer(0)})}) {
    auto r = parse_acquire_reply(reply, BootClock::now());
    ASSERT_FALSE(r.has_value()) << to_display(reply);
    EXPECT_EQ(r.error().message, "unexpected reply to the acquire script");
  }
}

TEST(acquire_reply, an_acquired_slot_is_read_from_the_sixth_field) {
  auto r = parse_acquire_reply(array({integer(1), integer(42), string("owner 42 7 host"), integer(0x070000), integer(0),
                                      integer(5)}),
                               BootClock::now());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto* a = std::get_if<Acquired>(&*r);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->token, 42u);
  EXPECT_EQ(a->slot, 5);
  auto plain = parse_acquire_reply(array({integer(1), integer(43), string("owner 43 7 host"), integer(0x070000),
                                          integer(0)}),
                                   BootClock::now());
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(std::get<Acquired>(*plain).slot, 0);
  auto bad = parse_acquire_reply(array({integer(1), integer(44), string("owner 44 7 host"), integer(0x070000),
                                        integer(0), integer(-1)}),
                                 BootClock::now());
  EXPECT_FALSE(bad.has_value());
}

TEST(acquire_reply, another_limit_names_the_limit_the_lock_is_held_with) {
  auto r = parse_acquire_reply(array({integer(2), integer(3), integer(0x070000)}), BootClock::now());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto* m = std::get_if<LimitMismatch>(&*r);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->held, 3);
  EXPECT_FALSE(parse_acquire_reply(array({integer(2), integer(0), integer(0x070000)}), BootClock::now()).has_value());
  EXPECT_FALSE(parse_acquire_reply(array({integer(2)}), BootClock::now()).has_value());
}
