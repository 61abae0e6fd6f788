// `fencerun fence file`: its kit for the guard suite (guard_suite_test.cpp), and what only this guard
// has: the crash-recovery rule, side files and temp files, its lock, delayed data, the CLI contract.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <thread>

#include "fence_harness.hpp"
#include "util/fd.hpp"

namespace fencerun::test::fence {
namespace {

// Runs `fencerun fence file ARGS...` with `input` on stdin.
RunResult fence_file(const TempDir& dir, std::vector<std::string> args, const std::string& input, EnvList env = {}) {
  static int counter = 0;
  auto in = dir / ("stdin." + std::to_string(++counter));
  write_file(in, input);
  SpawnOptions so;
  so.env = std::move(env);
  so.stdin_file = in;
  so.cwd = dir.path();
  args.insert(args.begin(), {"fence", "file"});
  return run_fencerun(std::move(args), so, 30s);
}

std::vector<std::string> temp_files(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    auto n = e.path().filename().string();
    if (n.size() > 4 && n.front() == '.' && n.substr(n.size() - 4) == ".tmp") out.push_back(n);
  }
  return out;
}

// True when process `pid` holds an unnamed file (O_TMPFILE) in `dir`: the guard's data being spooled.
bool holds_unnamed_file(pid_t pid, const std::filesystem::path& dir) {
  std::error_code ec;
  const std::string prefix = dir.string() + "/#";
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    auto target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.starts_with(prefix) && target.ends_with(" (deleted)")) return true;
  }
  return false;
}

// The file guard in the common scenarios: `fence file data` run in the lab's directory, the control
// a plain file written by the shell.
class FileKit : public Kit {
 public:
  explicit FileKit(const TempDir& dir) : m_dir(dir), m_data(dir / "data"), m_control(dir / "control") {}
  std::string name() const override { return "file"; }
  std::string guarded_body() const override {
    return "  printf '%s\\n' \"$DATA\" | \"$FENCERUN\" fence file \"$FENCE_FILE\"";
  }
  std::string plain_body() const override { return "  printf '%s\\n' \"$DATA\" > \"$FENCE_CONTROL\""; }
  std::optional<std::string> guarded_value() const override { return value(m_data); }
  std::optional<std::string> control_value() const override { return value(m_control); }
  std::optional<long long> recorded_token() const override {
    auto text = read_file(m_data.string() + ".fence");
    if (!text) return std::nullopt;
    return parse_ll(trim(text->substr(0, text->find('\n'))));
  }
  EnvList env() const override { return {{"FENCE_FILE", m_data.string()}, {"FENCE_CONTROL", m_control.string()}}; }

  std::unique_ptr<Process> start_write(const Token& token, const std::string& data) override {
    auto in = m_dir / ("write." + std::to_string(++m_writes));
    write_file(in, data + "\n");
    std::vector<std::string> args = {"fence", "file"};
    SpawnOptions so;
    add_cli_token(token, args, so.env);
    args.push_back("data");
    so.stdin_file = in;
    so.cwd = m_dir.path();
    return std::make_unique<FencerunProcess>(std::move(args), std::move(so));
  }
  GuardResult finish(Process& writer) const override { return finish_cli(writer); }
  std::string stale_message(long long stale, long long accepted) const override {
    return "fencerun: stale token " + std::to_string(stale) + " rejected for data: it has accepted " +
           std::to_string(accepted);
  }
  std::vector<Token> malformed_tokens() const override { return cli_malformed_tokens(); }
  // The record holds the token alone once no write is in progress; no temp file is left.
  void expect_settled(long long token) const override {
    EXPECT_EQ(read_file(m_data.string() + ".fence"), std::to_string(token) + "\n");
    EXPECT_TRUE(temp_files(m_dir.path()).empty());
  }
  void expect_nothing_written() const override {
    EXPECT_FALSE(std::filesystem::exists(m_data));
    EXPECT_FALSE(std::filesystem::exists(m_data.string() + ".fence"));
  }
  unsigned rounds_seed() const override { return 20240611u; }

 private:
  // The content without the one newline every write ends with.
  static std::optional<std::string> value(const std::filesystem::path& p) {
    auto v = read_file(p);
    if (v && v->ends_with('\n')) v->pop_back();
    return v;
  }
  const TempDir& m_dir;
  std::filesystem::path m_data, m_control;
  int m_writes = 0;
};

const bool g_file_kit = register_kit("file", [](Lab& lab) { return std::make_unique<FileKit>(lab.dir()); });

// Fresh, stale and equal tokens and malformed ones are in the guard suite (GuardSuite.*/file).
TEST(FenceFile, TakesTheTokenOptionBeforeTheEnvironment) {
  TempDir dir("fence-file");
  ASSERT_EQ(fence_file(dir, {"--token", "42", "data"}, "first\n").exit_code, 0);
  auto r = fence_file(dir, {"--token=43", "data"}, "newer\n", {{"FENCERUN_TOKEN", "1"}});  // option wins
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(read_file(dir / "data"), "newer\n");
  EXPECT_EQ(read_file(dir / "data.fence"), "43\n");
  EXPECT_TRUE(temp_files(dir.path()).empty());
}

TEST(FenceFile, MissingOrExtraPathIsAUsageError) {
  TempDir dir("fence-file");
  auto r = fence_file(dir, {"--token", "5"}, "x\n");
  EXPECT_EQ(r.exit_code, 64) << "missing PATH\n" << r;
  r = fence_file(dir, {"--token", "5", "a", "b"}, "x\n");
  EXPECT_EQ(r.exit_code, 64) << r;
}

TEST(FenceFile, CrashBetweenRecordAndDataRenameMeansTheTokenNeverTookEffect) {
  TempDir dir("fence-file");
  ASSERT_EQ(fence_file(dir, {"--token", "42", "data"}, "old\n").exit_code, 0);
  // State after a crash between the record's rename and the data's rename: the record names the
  // token 50 and its data temp file, which still exists.
  write_file(dir / ".data.00112233aabbccdd.tmp", "never landed\n");
  write_file(dir / "data.fence", "50\npending 42 .data.00112233aabbccdd.tmp\n");
  auto r = fence_file(dir, {"--token", "45", "data"}, "after crash\n");
  EXPECT_EQ(r.exit_code, 0) << "50 never took effect, so 45 is not stale\n" << r;
  EXPECT_EQ(read_file(dir / "data"), "after crash\n");
  EXPECT_EQ(read_file(dir / "data.fence"), "45\n");
  EXPECT_FALSE(std::filesystem::exists(dir / ".data.00112233aabbccdd.tmp")) << "the orphan is removed";

  // Crash after the data's rename (temp gone) but before the record was tidied: 50 is in force.
  write_file(dir / "data.fence", "50\npending 45 .data.00112233aabbccdd.tmp\n");
  r = fence_file(dir, {"--token", "49", "data"}, "stale\n");
  EXPECT_EQ(r.exit_code, 77) << r;
  EXPECT_NE(r.err.find("it has accepted 50"), std::string::npos) << r;

  // A malformed record is never guessed at.
  write_file(dir / "data.fence", "fifty\n");
  r = fence_file(dir, {"--token", "99", "data"}, "x\n");
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(read_file(dir / "data"), "after crash\n");
}

// Side files are never followed through a symbolic link: a link planted as PATH.fence or
// PATH.fence.lock would make the guard read, create or lock a file outside the directory.
TEST(FenceFile, RefusesSymlinkedSideFilesAndLeavesTheirTargetsAlone) {
  for (const std::string side : {".fence", ".fence.lock"}) {
    SCOPED_TRACE(side);
    TempDir dir("fence-file");
    TempDir outside("fence-outside");
    // One target exists (it must stay byte for byte as it was), one does not (it must not appear).
    write_file(outside / "existing", "5\n", 0644);
    for (const std::string target : {"existing", "missing"}) {
      SCOPED_TRACE(target);
      std::filesystem::remove(dir / ("data" + side));
      std::filesystem::create_symlink(outside / target, dir / ("data" + side));
      auto r = fence_file(dir, {"--token", "7", "data"}, "new\n");
      EXPECT_EQ(r.exit_code, 1) << r;
      EXPECT_EQ(split_lines(trim(r.err)).size(), 1u) << "one line\n" << r;
      EXPECT_NE(r.err.find("data" + side + " is a symbolic link"), std::string::npos) << r;
      EXPECT_EQ(read_file(outside / "existing"), "5\n");
      EXPECT_FALSE(std::filesystem::exists(outside / "missing")) << "the guard created a file outside";
      EXPECT_TRUE(std::filesystem::is_symlink(dir / ("data" + side))) << "the planted link is left as it was";
      EXPECT_FALSE(std::filesystem::exists(dir / "data")) << "nothing may be written";
      EXPECT_TRUE(temp_files(dir.path()).empty());
    }
  }
}

std::set<std::string> names_in(const std::filesystem::path& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// A guard started with `fence file --token 9 data` in `dir`, its stdin a FIFO the test writes to
// and keeps open, so the guard stays in the middle of reading it.
class GuardReadingAPipe {
 public:
  explicit GuardReadingAPipe(const TempDir& dir, EnvList env = {}) : m_fifo(dir / "stdin.fifo") {
    if (::mkfifo(m_fifo.c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed");
    m_writer.reset(::open(m_fifo.c_str(), O_RDWR | O_CLOEXEC));  // never blocks on Linux
    SpawnOptions so;
    so.cwd = dir.path();
    so.stdin_file = m_fifo;
    so.env = std::move(env);
    m_proc = std::make_unique<FencerunProcess>(std::vector<std::string>{"fence", "file", "--token", "9", "data"}, so);
  }
  ~GuardReadingAPipe() { std::filesystem::remove(m_fifo); }
  FencerunProcess& proc() { return *m_proc; }
  // Sends `data` and waits until the guard has taken all of it from the pipe and sleeps in the next
  // read.
  bool feed(const std::string& data) {
    if (::write(m_writer.get(), data.data(), data.size()) != static_cast<ssize_t>(data.size())) return false;
    return wait_until(
        [&] {
          int queued = -1;
          return ::ioctl(m_writer.get(), FIONREAD, &queued) == 0 && queued == 0 &&
                 process_state(m_proc->pid()) == 'S';
        },
        10s);
  }

 private:
  std::filesystem::path m_fifo;
  UniqueFd m_writer;
  std::unique_ptr<FencerunProcess> m_proc;
};

// A guard killed while it reads stdin leaves nothing in the directory: its data file has no name
// until the commit (O_TMPFILE).
TEST(FenceFile, KilledWhileReadingStdinLeavesNoFileBehind) {
  TempDir dir("fence-file");
  ASSERT_EQ(fence_file(dir, {"--token", "5", "data"}, "old\n").exit_code, 0);
  std::filesystem::remove(dir / "stdin.1");
  const auto before = names_in(dir.path());
  {
    GuardReadingAPipe guard(dir);
    ASSERT_TRUE(guard.feed(std::string(200000, 'x'))) << guard.proc().result();
    ASSERT_TRUE(guard.proc().running());
    guard.proc().signal(SIGKILL);
    ASSERT_TRUE(guard.proc().wait_for_exit(10s).has_value());
    EXPECT_EQ(guard.proc().result().exit_code, 128 + SIGKILL);
  }
  auto after = names_in(dir.path());
  std::vector<std::string> left;
  std::ranges::set_difference(after, before, std::back_inserter(left));
  RecordProperty("files_left_after_sigkill", static_cast<int>(left.size()));
  EXPECT_TRUE(left.empty()) << "left behind: " << ::testing::PrintToString(left);
  EXPECT_EQ(read_file(dir / "data"), "old\n");
  EXPECT_EQ(read_file(dir / "data.fence"), "5\n");
}

// Where O_TMPFILE is unsupported (simulated by a preloaded openat that refuses it), the guard
// falls back to a named temp file: writes still work, and TERM, INT or HUP while it reads stdin
// removes that file before the guard exits 128+N.
TEST(FenceFile, WithoutTmpfileSupportASignalWhileReadingRemovesTheNamedTempFile) {
  const EnvList no_tmpfile = {{"LD_PRELOAD", FENCE_TEST_NO_TMPFILE_PRELOAD}};
  TempDir dir("fence-file");
  auto r = fence_file(dir, {"--token", "5", "data"}, "old\n", no_tmpfile);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(read_file(dir / "data"), "old\n");
  EXPECT_EQ(read_file(dir / "data.fence"), "5\n");
  EXPECT_TRUE(temp_files(dir.path()).empty());
  std::filesystem::remove(dir / "stdin.1");
  const auto before = names_in(dir.path());
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    SCOPED_TRACE(sig);
    {
      GuardReadingAPipe guard(dir, no_tmpfile);
      ASSERT_TRUE(guard.feed(std::string(200000, 'x'))) << guard.proc().result();
      EXPECT_EQ(temp_files(dir.path()).size(), 1u) << "the fallback spools into a named temp file";
      guard.proc().signal(sig);
      ASSERT_TRUE(guard.proc().wait_for_exit(10s).has_value());
      EXPECT_EQ(guard.proc().result().exit_code, 128 + sig) << guard.proc().result();
    }
    auto after = names_in(dir.path());
    std::vector<std::string> left;
    std::ranges::set_difference(after, before, std::back_inserter(left));
    EXPECT_TRUE(left.empty()) << "left behind: " << ::testing::PrintToString(left);
    EXPECT_EQ(read_file(dir / "data"), "old\n");
  }
}

TEST(FenceFile, LockFileIsNeverReplacedAndModeIsKept) {
  TempDir dir("fence-file");
  write_file(dir / "data", "orig\n", 0640);
  ::chmod((dir / "data").c_str(), 0640);
  ASSERT_EQ(fence_file(dir, {"--token", "7", "data"}, "one\n").exit_code, 0);
  struct stat lock1{}, lock2{}, data{};
  ASSERT_EQ(::stat((dir / "data.fence.lock").c_str(), &lock1), 0);
  ASSERT_EQ(fence_file(dir, {"--token", "8", "data"}, "two\n").exit_code, 0);
  ASSERT_EQ(::stat((dir / "data.fence.lock").c_str(), &lock2), 0);
  EXPECT_EQ(lock1.st_ino, lock2.st_ino) << "every writer must lock the same inode";
  ASSERT_EQ(::stat((dir / "data").c_str(), &data), 0);
  EXPECT_EQ(data.st_mode & 07777, 0640u);
  // PATH in another directory, given with a directory part.
  std::filesystem::create_directory(dir / "sub");
  ASSERT_EQ(fence_file(dir, {"--token", "8", "sub/out.json"}, "{}\n").exit_code, 0);
  EXPECT_EQ(read_file(dir / "sub" / "out.json"), "{}\n");
  EXPECT_EQ(read_file(dir / "sub" / "out.json.fence"), "8\n");
}

TEST(FenceFile, HeldLockBlocksWritersAndStaleCheckHappensUnderIt) {
  TempDir dir("fence-file");
  ASSERT_EQ(fence_file(dir, {"--token", "10", "data"}, "ten\n").exit_code, 0);
  // Somebody holds the lock: a writer with an older token that passed the early check waits...
  UniqueFd lock(::open((dir / "data.fence.lock").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(lock);
  ASSERT_EQ(::flock(lock.get(), LOCK_EX), 0);
  write_file(dir / "in11", "eleven\n");
  write_file(dir / "in12", "twelve\n");
  SpawnOptions so;
  so.cwd = dir.path();
  so.stdin_file = dir / "in11";
  FencerunProcess w11({"fence", "file", "--token", "11", "data"}, so);
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(w11.running()) << "the writer must wait for the lock";
  // ...while a newer token is recorded behind its back (as another writer would have done).
  write_file(dir / "data", "twelve\n");
  write_file(dir / "data.fence", "12\n");
  ::flock(lock.get(), LOCK_UN);
  auto code = w11.wait_for_exit(10s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 77) << w11.result();
  EXPECT_EQ(read_file(dir / "data"), "twelve\n");
  EXPECT_TRUE(temp_files(dir.path()).empty()) << "the rejected writer's temp file is removed";
}

// A's write is issued while A holds the lease: the guard runs and waits for its data, which is still
// in flight (a FIFO the test holds). A's lease expires, B writes; then A's data arrives: rejected.
TEST(FenceFile, DelayedRequestIsRejected) {
  Lab lab("fence-file-delayed");
  FileKit kit(lab.dir());
  auto fifo = lab.file("a.fifo");
  auto cfifo = lab.file("a.cfifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo(cfifo.c_str(), 0600), 0);
  UniqueFd wr(::open(fifo.c_str(), O_RDWR | O_CLOEXEC));    // never blocks on Linux
  UniqueFd cwr(::open(cfifo.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(wr && cwr);

  SpawnOptions so;
  so.env = kit.env();
  so.env.emplace_back("FENCERUN", fencerun_path());
  so.cwd = lab.dir().path();
  const std::string script =
      "echo \"$FENCERUN_TOKEN\" > a.token\n"
      "\"$FENCERUN\" fence file \"$FENCE_FILE\" < a.fifo & echo $! > a.guard; wait $!; echo $? > a.rc\n"
      // The control: the same delayed write, unguarded.
      "read line < a.cfifo; printf '%s\\n' \"$line\" > \"$FENCE_CONTROL\"; echo done > a.cdone\n"
      "sleep 1000\n";
  FencerunProcess a({"-r", lab.redis().url(), "-t", "300ms", lab.lock(), "--", "sh", "-c", script}, so);
  auto a_token = wait_for_line(lab.file("a.token"), 10s);
  ASSERT_TRUE(a_token) << a.result();
  // The guard has started (while the lease is valid) and spooled nothing yet: it holds its unnamed
  // temp file.
  auto guard_pid = wait_for_pid_file(lab.file("a.guard"), 10s);
  ASSERT_TRUE(guard_pid) << a.result();
  ASSERT_TRUE(wait_until([&] { return holds_unnamed_file(*guard_pid, lab.dir().path()); }, 10s)) << a.result();
  EXPECT_TRUE(temp_files(lab.dir().path()).empty()) << "no named temp file while the guard waits for data";
  // A's fencerun stops renewing (paused); the request stays in flight.
  pause_owner(a.pid());
  ASSERT_TRUE(lab.wait_lock_free(10s));

  Owner b(lab, kit, "b", "10s", "5s");
  b.wait_started();
  ASSERT_EQ(b.write(), 0) << b.result();
  ASSERT_EQ(kit.guarded_value(), b.data(0));
  ASSERT_EQ(kit.control_value(), b.data(0));

  // A's data finally arrives.
  const std::string a_data = "a " + *a_token + " delayed\n";
  ASSERT_EQ(::write(wr.get(), a_data.data(), a_data.size()), static_cast<ssize_t>(a_data.size()));
  wr.reset();
  auto rc = wait_for_line(lab.file("a.rc"), 10s);
  ASSERT_TRUE(rc);
  EXPECT_EQ(*rc, "77") << a.result();
  EXPECT_EQ(kit.guarded_value(), b.data(0)) << "B's data must be intact";
  EXPECT_EQ(kit.recorded_token(), b.token());
  ASSERT_EQ(::write(cwr.get(), a_data.data(), a_data.size()), static_cast<ssize_t>(a_data.size()));
  ASSERT_TRUE(wait_for_line(lab.file("a.cdone"), 10s));
  EXPECT_EQ(kit.control_value(), trim(a_data)) << "the unguarded control lets the delayed write through";
  resume_owner(a.pid());
  EXPECT_TRUE(a.wait_for_exit(10s).has_value());
  EXPECT_EQ(b.finish(), 0) << b.result();
  EXPECT_NE(a.result().err.find("stale token " + *a_token + " rejected"), std::string::npos) << a.result();
}

}  // namespace
}  // namespace fencerun::test::fence
