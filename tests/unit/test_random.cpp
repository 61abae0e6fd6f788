#include <gtest/gtest.h>

#include <set>
#include <string>

#include "util/random.hpp"

using fencerun::random_hex;

TEST(random_hex, writes_two_lowercase_hex_digits_per_byte) {
  for (std::size_t bytes : {0u, 1u, 16u, 32u, 100u}) {
    std::string hex = random_hex(bytes);
    EXPECT_EQ(hex.size(), 2 * bytes);
    EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos) << hex;
  }
}

TEST(random_hex, never_repeats_a_128_bit_owner_id) {
  std::set<std::string> seen;
  for (int i = 0; i < 1'000; ++i) EXPECT_TRUE(seen.insert(random_hex(16)).second);
}

TEST(random_hex, uses_every_hex_digit) {
  std::string hex = random_hex(4'096);
  for (char c : std::string("0123456789abcdef")) EXPECT_NE(hex.find(c), std::string::npos) << c;
}
