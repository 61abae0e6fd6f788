#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "subreaper.hpp"
#include "supervisor/proctree.hpp"

namespace proctree = fencerun::supervisor::proctree;
using fencerun::test::Subreaper;
using fencerun::test::wait_for_end;

namespace {

std::vector<pid_t> below(pid_t root, pid_t skip) {
  std::vector<pid_t> out(1024);
  out.resize(proctree::descendants(root, skip, out.data(), out.size()));
  return out;
}

bool has(const std::vector<pid_t>& v, pid_t pid) { return std::find(v.begin(), v.end(), pid) != v.end(); }

pid_t start_shell(const std::string& script) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Polls until `file` holds `lines` lines of pids; returns them.
std::vector<pid_t> read_pids(const std::string& file, std::size_t lines) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(file);
    std::vector<pid_t> pids;
    for (pid_t p; in >> p;) pids.push_back(p);
    if (pids.size() >= lines) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return {};
}

bool alive(pid_t pid) {
  // A zombie is not alive: read its state.
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

}  // namespace

TEST(proctree, is_available_on_this_kernel) { EXPECT_TRUE(proctree::available()); }

TEST(proctree, finds_children_grandchildren_and_daemons_but_not_the_skipped_subtree) {
  Subreaper reaper;
  std::string file = "/tmp/fencerun-proctree." + std::to_string(::getpid());
  ::unlink(file.c_str());
  // A background grandchild, one in a new session, and a double-forked daemon whose parent exits
  // (re-parented to us, the subreaper).
  pid_t shell = start_shell("sleep 30 & echo $! >> " + file + "; setsid sleep 30 & echo $! >> " + file +
                            "; (sleep 30 & echo $! >> " + file + "); wait");
  pid_t skipped = start_shell("sleep 30");
  auto pids = read_pids(file, 3);
  ASSERT_EQ(pids.size(), 3u);
  auto found = below(::getpid(), skipped);
  EXPECT_TRUE(has(found, shell));
  for (pid_t p : pids) EXPECT_TRUE(has(found, p)) << p;
  EXPECT_FALSE(has(found, skipped));

  EXPECT_GE(proctree::signal_descendants(::getpid(), skipped, SIGKILL), 4u);
  for (pid_t p : pids) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (alive(p) && std::chrono::steady_clock::now() < until) {
      Subreaper::reap_all();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_FALSE(alive(p)) << p;
  }
  Subreaper::reap_all();
  EXPECT_FALSE(alive(shell));
  EXPECT_TRUE(alive(skipped));
  ::kill(skipped, SIGKILL);
  EXPECT_TRUE(wait_for_end(skipped, std::chrono::seconds(5)).has_value());
  ::unlink(file.c_str());
}

TEST(proctree, kills_a_tree_that_keeps_forking) {
  // A fork bomb in slow motion: every process keeps forking. SIGKILL passes repeat until nothing new
  // is found, so nothing is left.
  Subreaper reaper;
  pid_t shell = start_shell("f() { while :; do sh -c 'sleep 30' & sleep 0.001; done; }; f & f & wait");
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (below(::getpid(), -1).size() < 20 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  proctree::signal_descendants(::getpid(), -1, SIGKILL);
  until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::vector<pid_t> left;
  do {
    Subreaper::reap_all();
    left = below(::getpid(), -1);
    std::erase_if(left, [](pid_t p) { return !alive(p); });
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (std::chrono::steady_clock::now() < until);
  EXPECT_TRUE(left.empty()) << left.size() << " processes left";
  EXPECT_FALSE(alive(shell));
}

TEST(proctree, one_pass_for_other_signals) {
  Subreaper reaper;
  std::string file = "/tmp/fencerun-proctree-term." + std::to_string(::getpid());
  ::unlink(file.c_str());
  // Counts the TERMs it gets: exactly one per signal_descendants call.
  pid_t shell = start_shell("n=0; trap 'n=$((n+1)); echo $n >> " + file + "' TERM; echo 0 >> " + file +
                            "; while :; do sleep 0.01; done");
  ASSERT_EQ(read_pids(file, 1).size(), 1u);
  proctree::signal_descendants(::getpid(), -1, SIGTERM);
  auto lines = read_pids(file, 2);
  ASSERT_EQ(lines.size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a second TERM would show by now
  EXPECT_EQ(read_pids(file, 2).size(), 2u);
  proctree::signal_descendants(::getpid(), -1, SIGKILL);
  EXPECT_TRUE(wait_for_end(shell, std::chrono::seconds(5)).has_value());
  ::unlink(file.c_str());
}
