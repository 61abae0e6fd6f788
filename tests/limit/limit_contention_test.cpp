// 12 contenders on one lock with --limit 3, each running fencerun 20 times in a loop; each command is
// limit_probe, which records when it entered and left (CLOCK_MONOTONIC, shared by all processes) with
// the slot and token it got, and holds for a random 5-30 ms. From that log:
//   - at no instant are more than 3 commands inside, and at some instant exactly 3 (the limit is
//     reached, not merely respected);
//   - the slots of the commands inside at the same time are distinct, and always 0..2;
//   - tokens are distinct and strictly increasing in acquisition order, as far as the commands can
//     observe it (two holders that acquire at nearly the same time may start their commands in either
//     order): in each slot, a later occupant has the greater token; and a command that entered after
//     an instant at which 3 others were inside acquired after that instant (it could not hold a slot
//     then), so its token is greater than every token that had entered by then; the shared counter
//     <prefix>{NAME}:token ends at the greatest token handed out;
//   - every run exits 0 and every enter has its exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "limit_fixture.hpp"

namespace fencerun::test::limit {
namespace {

struct Event {
  long long ns = 0;
  bool enter = false;
  int slot = -1;
  long long token = 0;
};

class LimitContention : public LimitTest {};

TEST_F(LimitContention, TwelveContendersNeverExceedThreeAndReachIt) {
  const std::string name = "contended";
  constexpr int contenders = 12;
  constexpr int runs = 20;
  constexpr int limit = 3;
  const std::string log = file("log").string();

  std::vector<std::unique_ptr<Process>> loops;
  for (int c = 0; c < contenders; ++c) {
    const std::string cs = std::to_string(c);
    const std::string fencerun = shell_quote(fencerun_binary()) + " -r " + shell_quote(redis().url()) +
                                 " --limit " + std::to_string(limit) + " --wait inf --ttl 10s " + name + " -- " +
                                 shell_quote(probe_binary()) + " log " + shell_quote(log) + " 5 30";
    const std::string script = "i=0; while [ $i -lt " + std::to_string(runs) + " ]; do " + fencerun +
                               "; rc=$?; [ $rc -eq 0 ] || echo \"" + cs + " $i $rc\" >> failures; i=$((i + 1)); "
                               "done; echo " + cs + " >> done";
    loops.push_back(start_group(script));
  }
  const auto t0 = Clock::now();
  const bool all_done = wait_until([&] { return lines("done").size() == static_cast<std::size_t>(contenders); }, 100s, 20ms);
  std::cout << "12 x 20 runs with --limit 3 took " << ms_between(t0, Clock::now()) << " ms\n";
  ASSERT_TRUE(all_done) << lines("done").size() << " of " << contenders << " contenders finished their "
                        << runs << " runs";
  for (auto& l : loops) EXPECT_EQ(l->wait_for_exit(5s), 0) << l->result();
  EXPECT_TRUE(lines("failures").empty()) << "runs that did not exit 0 (contender, run, exit code):\n"
                                         << join(lines("failures"));

  std::vector<Event> events;
  for (const auto& l : lines("log")) {
    std::istringstream in(l);
    std::string what, slot, token;
    long long ns = 0, pid = 0;
    ASSERT_TRUE(in >> what >> ns >> slot >> token >> pid) << "malformed log line: " << l;
    auto s = parse_ll(slot);
    auto t = parse_ll(token);
    ASSERT_TRUE(s && t) << "the command did not get FENCERUN_SLOT and FENCERUN_TOKEN: " << l;
    events.push_back({ns, what == "enter", static_cast<int>(*s), *t});
  }
  // Exits first at the same nanosecond: a tie cannot tell overlap apart from hand-over.
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.ns != b.ns) return a.ns < b.ns;
    return !a.enter && b.enter;
  });

  std::size_t enters = 0;
  std::set<long long> tokens;
  std::map<long long, int> inside;  // token -> slot
  std::set<int> busy;               // slots of the commands inside
  std::map<int, long long> last_in_slot;  // slot -> token of its latest occupant
  int max_inside = 0;
  long long at_three = 0;  // how many times exactly 3 were inside
  long long barrier = 0;   // the greatest token entered by the latest instant at which 3 were inside
  long long max_token = 0;
  long long order_inversions = 0;  // a later enter with a smaller token than an earlier one
  long long last_enter_token = 0;
  std::vector<std::string> problems;  // the first 20 are kept
  long long problem_count = 0;
  auto problem = [&](std::string what) {
    if (problems.size() < 20) problems.push_back(std::move(what));
    ++problem_count;
  };
  for (const auto& e : events) {
    if (e.enter) {
      ++enters;
      if (!tokens.insert(e.token).second) problem("token " + std::to_string(e.token) + " handed out twice");
      if (e.slot < 0 || e.slot >= limit)
        problem("slot " + std::to_string(e.slot) + " is not in 0.." + std::to_string(limit - 1));
      if (busy.contains(e.slot))
        problem("slot " + std::to_string(e.slot) + " entered by token " + std::to_string(e.token) +
                           " while another command inside has it");
      if (e.token <= barrier)
        problem("token " + std::to_string(e.token) + " entered after " + std::to_string(limit) +
                           " others were inside, one of them with token " + std::to_string(barrier) +
                           ": not increasing in acquisition order");
      if (auto it = last_in_slot.find(e.slot); it != last_in_slot.end() && e.token <= it->second)
        problem("slot " + std::to_string(e.slot) + " went from token " + std::to_string(it->second) +
                           " to " + std::to_string(e.token));
      last_in_slot[e.slot] = e.token;
      if (e.token < last_enter_token) ++order_inversions;
      last_enter_token = e.token;
      max_token = std::max(max_token, e.token);
      inside[e.token] = e.slot;
      busy.insert(e.slot);
      max_inside = std::max(max_inside, static_cast<int>(inside.size()));
      if (inside.size() == static_cast<std::size_t>(limit)) {
        ++at_three;
        barrier = max_token;
      }
    } else {
      auto it = inside.find(e.token);
      if (it == inside.end()) {
        problem("exit of token " + std::to_string(e.token) + " that never entered");
        continue;
      }
      if (it->second != e.slot) problem("token " + std::to_string(e.token) + " left another slot");
      busy.erase(it->second);
      inside.erase(it);
    }
  }
  std::cout << enters << " entries; at most " << max_inside << " inside; exactly " << limit << " inside "
            << at_three << " times; " << order_inversions
            << " entries with a smaller token than the entry before (concurrent acquisitions)\n";
  std::string first;
  for (const auto& p : problems) first += "  " + p + "\n";
  EXPECT_EQ(problem_count, 0) << "the first of them:\n" << first;
  EXPECT_EQ(enters, static_cast<std::size_t>(contenders * runs)) << "entries in the log";
  EXPECT_TRUE(inside.empty()) << inside.size() << " commands entered and never left";
  EXPECT_LE(max_inside, limit) << "more than --limit commands inside at once";
  EXPECT_EQ(max_inside, limit) << "the limit was never reached: the holders did not run " << limit << " at once";
  EXPECT_EQ(value(key(name, "token")), std::to_string(max_token))
      << "the shared token counter does not hold the greatest token handed out";
  for (int s = 0; s < limit; ++s) EXPECT_FALSE(exists(slot_key(name, s))) << "slot " << s << " left held";
}

}  // namespace
}  // namespace fencerun::test::limit
