#include "support/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

extern char** environ;

#ifndef FENCERUN_BINARY
#error "FENCERUN_BINARY must name the fencerun executable under test"
#endif

namespace fencerun::test {

namespace {

bool scrubbed(std::string_view name) {
  return name.rfind("FENCERUN_", 0) == 0 || name == "REDIS_URL" || name == "REDISCLI_AUTH";
}

std::vector<std::string> build_env(const SpawnOptions& opts) {
  std::map<std::string, std::string> vars;
  std::vector<std::string> order;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    const auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    std::string name(kv.substr(0, eq));
    if (opts.scrub_env && scrubbed(name)) continue;
    if (!vars.count(name)) order.push_back(name);
    vars[name] = std::string(kv.substr(eq + 1));
  }
  for (const auto& [name, value] : opts.env) {
    if (value) {
      if (!vars.count(name)) order.push_back(name);
      vars[name] = *value;
    } else {
      vars.erase(name);
    }
  }
  std::vector<std::string> out;
  for (const auto& name : order)
    if (auto it = vars.find(name); it != vars.end()) out.push_back(name + "=" + it->second);
  return out;
}

int open_or_throw(const std::filesystem::path& p, int flags, mode_t mode = 0600) {
  const int fd = ::open(p.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + p.string());
  return fd;
}

void close_from(int lowfd) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, static_cast<unsigned>(lowfd), ~0U, 0) == 0) return;
#endif
  for (int fd = lowfd; fd < 4096; ++fd) ::close(fd);
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

std::string RunResult::describe() const {
  std::ostringstream ss;
  ss << "exit_code=" << exit_code << (timed_out ? " (TIMED OUT, killed)" : "")
     << " elapsed=" << elapsed.count() << "ms pid=" << pid << "\n--- stdout ---\n"
     << out << "\n--- stderr ---\n"
     << err << "\n--------------";
  return ss.str();
}

std::ostream& operator<<(std::ostream& os, const RunResult& r) { return os << r.describe(); }

Process::Process(std::vector<std::string> argv, SpawnOptions opts) {
  if (argv.empty()) throw std::invalid_argument("empty argv");
  io_dir_ = std::make_unique<TempDir>("io");

  // Everything the child needs is prepared before fork: the child only makes async-signal-safe
  // calls, so spawning from several threads at once is safe.
  const std::vector<std::string> env = build_env(opts);
  std::vector<char*> argv_c, env_c;
  for (auto& a : argv) argv_c.push_back(a.data());
  argv_c.push_back(nullptr);
  std::vector<std::string> env_copy = env;
  for (auto& e : env_copy) env_c.push_back(e.data());
  env_c.push_back(nullptr);

  // execvpe is not async-signal-safe in every libc in its PATH search; resolve here.
  std::string program = argv[0];
  if (program.find('/') == std::string::npos) {
    std::string path_var = "/usr/local/bin:/usr/bin:/bin";
    for (const auto& e : env)
      if (e.rfind("PATH=", 0) == 0) path_var = e.substr(5);
    std::istringstream ps(path_var);
    std::string dir;
    while (std::getline(ps, dir, ':')) {
      const auto cand = (dir.empty() ? std::string(".") : dir) + "/" + program;
      if (::access(cand.c_str(), X_OK) == 0) {
        program = cand;
        break;
      }
    }
  }

  const int in_fd = open_or_throw(opts.stdin_file.value_or("/dev/null"), O_RDONLY);
  const int out_fd = open_or_throw(io_dir_->path() / "stdout", O_WRONLY | O_CREAT | O_TRUNC);
  const int err_fd = open_or_throw(io_dir_->path() / "stderr", O_WRONLY | O_CREAT | O_TRUNC);
  int errpipe[2];
  if (::pipe2(errpipe, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  const std::string cwd = opts.cwd ? opts.cwd->string() : std::string();
  const pid_t parent = ::getpid();

  started_ = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (pid == 0) {
    if (opts.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s)
      if (s != SIGKILL && s != SIGSTOP) ::sigaction(s, &dfl, nullptr);
    ::dup2(in_fd, 0);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    // Keep the error pipe: move it to fd 3 so that it survives the close below.
    int ep = errpipe[1];
    if (ep != 3) {
      ::dup3(ep, 3, O_CLOEXEC);
      ep = 3;
    }
    close_from(4);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) {
      const int e = errno;
      (void)!::write(ep, &e, sizeof e);
      ::_exit(127);
    }
    ::execve(program.c_str(), argv_c.data(), env_c.data());
    const int e = errno;
    (void)!::write(ep, &e, sizeof e);
    ::_exit(127);
  }
  pid_ = pid;
  ::close(in_fd);
  ::close(out_fd);
  ::close(err_fd);
  ::close(errpipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(errpipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(errpipe[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    throw std::system_error(child_errno, std::generic_category(), "exec " + argv[0]);
  }
}

Process::~Process() {
  try {
    kill_and_reap();
  } catch (...) {
  }
}

bool Process::try_reap() {
  if (exit_code_) return true;
  if (pid_ <= 0) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = Clock::now();
    exit_code_ = decode_status(status);
    return true;
  }
  return false;
}

bool Process::running() { return !try_reap(); }

std::optional<int> Process::wait_for_exit(Clock::duration timeout) {
  wait_until([&] { return try_reap(); }, timeout, 1ms);
  return exit_code_;
}

bool Process::signal(int sig) {
  if (pid_ <= 0 || exit_code_) return false;
  return ::kill(pid_, sig) == 0;
}

void Process::kill_and_reap() {
  if (pid_ <= 0 || exit_code_) return;
  if (try_reap()) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exited_ = Clock::now();
  exit_code_ = decode_status(status);
}

std::string Process::out() const { return read_file(io_dir_->path() / "stdout").value_or(""); }
std::string Process::err() const { return read_file(io_dir_->path() / "stderr").value_or(""); }

RunResult Process::result() const {
  RunResult r;
  r.pid = pid_;
  r.exit_code = exit_code_.value_or(-1);
  r.out = out();
  r.err = err();
  r.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      (exit_code_ ? exited_ : Clock::now()) - started_);
  return r;
}

// FENCERUN_TEST_BINARY runs the suite against another build (an installed package, an older commit).
const char* fencerun_binary() {
  const char* other = std::getenv("FENCERUN_TEST_BINARY");
  return other && *other ? other : FENCERUN_BINARY;
}

namespace {
std::vector<std::string> with_binary(std::vector<std::string> args) {
  args.insert(args.begin(), fencerun_binary());
  return args;
}
}  // namespace

FencerunProcess::FencerunProcess(std::vector<std::string> args, SpawnOptions opts)
    : Process(with_binary(std::move(args)), std::move(opts)) {}

RunResult run_program(std::vector<std::string> argv, SpawnOptions opts, Clock::duration timeout) {
  Process p(std::move(argv), std::move(opts));
  bool timed_out = !p.wait_for_exit(timeout).has_value();
  if (timed_out) p.kill_and_reap();
  RunResult r = p.result();
  r.timed_out = timed_out;
  return r;
}

RunResult run_fencerun(std::vector<std::string> args, SpawnOptions opts, Clock::duration timeout) {
  return run_program(with_binary(std::move(args)), std::move(opts), timeout);
}

RunResult run_fencerun(std::vector<std::string> args, EnvList env, Clock::duration timeout) {
  SpawnOptions opts;
  opts.env = std::move(env);
  return run_fencerun(std::move(args), std::move(opts), timeout);
}

}  // namespace fencerun::test
