// The record of runs: a record's text read and written back, and quorum mode's merge of the servers'
// records (one per token, newest first, the most telling outcome of a run the servers disagree on,
// times moved onto one server's clock).
#include <gtest/gtest.h>

#include "lease/run_record.hpp"

namespace fencerun::lease {
namespace {

TEST(RunRecord, LineIsTheInverseOfParse) {
  for (const std::string text : {"1000 2000 ok 0 - 42 77 web1 1.2.3", "5 - killed - - 7 12 h 0.9",
                                 "10 20 failed - 15 8 9 host-2 2.0"}) {
    auto r = parse_run_record(text);
    ASSERT_TRUE(r) << text;
    EXPECT_EQ(run_record_line(*r), text);
  }
}

TEST(MergeRecords, OnePerTokenNewestFirstAndAtMostCount) {
  const std::vector<ServerRecords> servers = {
      {{"300 310 ok 0 - 3 1 a v", "100 110 ok 0 - 1 1 a v"}, 1000},
      {{"300 310 ok 0 - 3 1 a v", "200 210 failed 1 - 2 1 b v", "100 110 ok 0 - 1 1 a v"}, 1000},
  };
  const auto all = merge_records(servers, 1000, 10);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0], "300 310 ok 0 - 3 1 a v");
  EXPECT_EQ(all[1], "200 210 failed 1 - 2 1 b v");  // only server 2 has it
  EXPECT_EQ(all[2], "100 110 ok 0 - 1 1 a v");
  const auto two = merge_records(servers, 1000, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1], "200 210 failed 1 - 2 1 b v");
}

TEST(MergeRecords, TheRunsOwnOutcomeWinsOverLostAndLostOverKilled) {
  const std::vector<ServerRecords> servers = {
      {{"100 - killed - - 9 1 a v"}, 1000},
      {{"100 150 lost 0 - 9 1 a v"}, 1000},
      {{"100 150 ok 0 - 9 1 a v"}, 1000},
  };
  EXPECT_EQ(merge_records(servers, 1000, 5), std::vector<std::string>{"100 150 ok 0 - 9 1 a v"});
  const std::vector<ServerRecords> no_ok = {servers[0], servers[1]};
  EXPECT_EQ(merge_records(no_ok, 1000, 5), std::vector<std::string>{"100 150 lost 0 - 9 1 a v"});
  const std::vector<ServerRecords> reversed = {servers[2], servers[0]};
  EXPECT_EQ(merge_records(reversed, 1000, 5), std::vector<std::string>{"100 150 ok 0 - 9 1 a v"});
}

TEST(MergeRecords, TimesAreMovedOntoTheReferenceClock) {
  // Server 2's clock is 500 ahead of the reference: its record's times move back by 500.
  const std::vector<ServerRecords> servers = {{{"1600 1700 ok 0 - 4 1 a v"}, 2500}};
  EXPECT_EQ(merge_records(servers, 2000, 5), std::vector<std::string>{"1100 1200 ok 0 - 4 1 a v"});
  // A killed run has no end to move.
  const std::vector<ServerRecords> killed = {{{"1600 - killed - - 4 1 a v"}, 1000}};
  EXPECT_EQ(merge_records(killed, 2000, 5), std::vector<std::string>{"2600 - killed - - 4 1 a v"});
}

TEST(MergeRecords, MalformedRecordsAndRecordsWithoutATokenAreLeftOut) {
  const std::vector<ServerRecords> servers = {{{"garbage", "1 2 ok 0 - - 1 a v", "3 4 ok 0 - 5 1 a v"}, 0}};
  EXPECT_EQ(merge_records(servers, 0, 5), std::vector<std::string>{"3 4 ok 0 - 5 1 a v"});
}

}  // namespace
}  // namespace fencerun::lease
