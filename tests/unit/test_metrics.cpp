#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "app/metrics.hpp"

using fencerun::app::format_metrics;
using fencerun::app::RunReport;
using fencerun::app::write_metrics_file;
using std::chrono::milliseconds;
namespace fs = std::filesystem;

namespace {

std::chrono::system_clock::time_point at_ms(long long ms) {
  return std::chrono::system_clock::time_point(milliseconds(ms));
}

RunReport sample_report() {
  RunReport r;
  r.lock = "nightly";
  r.started = at_ms(1'700'000'000'250);
  r.ended = at_ms(1'700'000'012'750);
  r.lock_wait = milliseconds(1'500);
  r.acquired = true;
  r.token = 1'700'000'000'123'456;
  r.renewals = 3;
  r.renew_failures = 1;
  r.lease_lost = false;
  r.exit_code = 0;
  return r;
}

// The sample lines ("name{labels} value") of a textfile.
std::vector<std::string> samples(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.starts_with("#")) out.push_back(line);
  return out;
}

}  // namespace

TEST(metrics, formats_every_gauge_with_help_type_and_lock_label) {
  EXPECT_EQ(format_metrics(sample_report()),
            "# HELP fencerun_last_start_timestamp_seconds Unix time the last run started.\n"
            "# TYPE fencerun_last_start_timestamp_seconds gauge\n"
            "fencerun_last_start_timestamp_seconds{lock=\"nightly\"} 1700000000.250\n"
            "# HELP fencerun_last_end_timestamp_seconds Unix time the last run ended.\n"
            "# TYPE fencerun_last_end_timestamp_seconds gauge\n"
            "fencerun_last_end_timestamp_seconds{lock=\"nightly\"} 1700000012.750\n"
            "# HELP fencerun_last_duration_seconds Wall time of the last run, lock wait included.\n"
            "# TYPE fencerun_last_duration_seconds gauge\n"
            "fencerun_last_duration_seconds{lock=\"nightly\"} 12.500\n"
            "# HELP fencerun_last_lock_wait_seconds Time the last run waited for the lock.\n"
            "# TYPE fencerun_last_lock_wait_seconds gauge\n"
            "fencerun_last_lock_wait_seconds{lock=\"nightly\"} 1.500\n"
            "# HELP fencerun_last_acquired 1 if the last run acquired the lock, 0 if it was busy or failed.\n"
            "# TYPE fencerun_last_acquired gauge\n"
            "fencerun_last_acquired{lock=\"nightly\"} 1\n"
            "# HELP fencerun_last_exit_code Exit code of the last run.\n"
            "# TYPE fencerun_last_exit_code gauge\n"
            "fencerun_last_exit_code{lock=\"nightly\"} 0\n"
            "# HELP fencerun_last_token Fencing token of the last run (0 when none was issued).\n"
            "# TYPE fencerun_last_token gauge\n"
            "fencerun_last_token{lock=\"nightly\"} 1700000000123456\n"
            "# HELP fencerun_last_renewals Successful lease renewals in the last run.\n"
            "# TYPE fencerun_last_renewals gauge\n"
            "fencerun_last_renewals{lock=\"nightly\"} 3\n"
            "# HELP fencerun_last_renew_failures Failed lease renewal attempts in the last run.\n"
            "# TYPE fencerun_last_renew_failures gauge\n"
            "fencerun_last_renew_failures{lock=\"nightly\"} 1\n"
            "# HELP fencerun_last_lease_lost 1 if the last run lost its lease and the command was stopped.\n"
            "# TYPE fencerun_last_lease_lost gauge\n"
            "fencerun_last_lease_lost{lock=\"nightly\"} 0\n");
}

TEST(metrics, labels_a_counting_locks_series_with_the_slot) {
  RunReport r = sample_report();
  r.counting = true;
  r.slot = 2;
  for (const auto& line : samples(format_metrics(r)))
    EXPECT_NE(line.find("{lock=\"nightly\",slot=\"2\"} "), std::string::npos) << line;
  r.slot.reset();  // busy: no slot held
  for (const auto& line : samples(format_metrics(r)))
    EXPECT_NE(line.find("{lock=\"nightly\",slot=\"\"} "), std::string::npos) << line;
  for (const auto& line : samples(format_metrics(sample_report())))
    EXPECT_EQ(line.find("slot="), std::string::npos) << line;  // the plain lock: as before
}

TEST(metrics, reports_a_busy_run_without_a_token) {
  RunReport r = sample_report();
  r.acquired = false;
  r.token.reset();
  r.exit_code = 75;
  std::string text = format_metrics(r);
  EXPECT_NE(text.find("fencerun_last_acquired{lock=\"nightly\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("fencerun_last_token{lock=\"nightly\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("fencerun_last_exit_code{lock=\"nightly\"} 75\n"), std::string::npos);
}

TEST(metrics, escapes_the_lock_label) {
  RunReport r = sample_report();
  r.lock = "a\"b\\c";
  EXPECT_NE(format_metrics(r).find("fencerun_last_acquired{lock=\"a\\\"b\\\\c\"} 1\n"), std::string::npos);
}

TEST(metrics, writes_only_well_formed_sample_values) {
  // Also when the wall clock stepped back during the run (ended before started).
  std::regex sample(R"re([a-z_]+\{lock="nightly"\} -?[0-9]+(\.[0-9]+)?)re");
  RunReport stepped_back = sample_report();
  stepped_back.ended = stepped_back.started - milliseconds(1'500);
  for (const RunReport& r : {sample_report(), stepped_back}) {
    auto lines = samples(format_metrics(r));
    EXPECT_EQ(lines.size(), 10u);
    for (const auto& line : lines) EXPECT_TRUE(std::regex_match(line, sample)) << line;
  }
}

TEST(metrics, writes_the_file_atomically_and_leaves_no_temp_file) {
  std::string pattern = (fs::temp_directory_path() / "fencerun-unit.XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  fs::path dir = pattern;
  fs::path file = dir / "fencerun_nightly.prom";
  std::ofstream(file) << "old content\n";

  EXPECT_TRUE(write_metrics_file(file.string(), sample_report()).has_value());
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), format_metrics(sample_report()));
  EXPECT_EQ((fs::status(file).permissions() & fs::perms::all),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);
  fs::remove_all(dir);
}

TEST(metrics, reports_a_file_it_cannot_write) {
  auto written = write_metrics_file("/nonexistent-dir/fencerun.prom", sample_report());
  ASSERT_FALSE(written.has_value());
  const std::string& error = written.error();
  EXPECT_TRUE(error.starts_with("cannot create /nonexistent-dir/fencerun.prom.tmp-")) << error;
  EXPECT_TRUE(error.ends_with(": No such file or directory")) << error;
}
