#include "support/redis_server.hpp"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/server_under_test.hpp"

// The path CMake found, or empty: then PATH is searched when the tests run.
#ifndef REDIS_SERVER_EXECUTABLE
#define REDIS_SERVER_EXECUTABLE ""
#endif

namespace fencerun::test {

namespace {

bool executable_file(const std::string& path) {
  struct stat st{};
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

const std::optional<std::string>& find_redis_server() {
  static const std::optional<std::string> found = []() -> std::optional<std::string> {
    if (executable_file(REDIS_SERVER_EXECUTABLE)) return std::string(REDIS_SERVER_EXECUTABLE);
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path ? path : "");
    for (std::string dir; std::getline(dirs, dir, ':');) {
      std::string candidate = (dir.empty() ? std::string(".") : dir) + "/redis-server";
      if (executable_file(candidate)) return candidate;
    }
    return std::nullopt;
  }();
  return found;
}

const std::string& redis_server_program() { return server_under_test().server; }

void skip_current_test(const std::string& why) {
  [&] { GTEST_SKIP() << why; }();
  throw ::testing::AssertionException(
      ::testing::TestPartResult(::testing::TestPartResult::kSkip, __FILE__, __LINE__, why.c_str()));
}

Reply to_reply(const redisReply* r) {
  Reply out;
  if (!r) return out;
  switch (r->type) {
    case REDIS_REPLY_NIL:
      out.type = Reply::Type::Nil;
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::Status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Reply::Type::Error;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::Integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_STRING:
      out.type = Reply::Type::String;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::Array;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(to_reply(r->element[i]));
      break;
    default:
      out.type = Reply::Type::Error;
      out.str = "unexpected reply type " + std::to_string(r->type);
  }
  return out;
}

Reply send_command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* raw = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
  if (!raw) {
    Reply none;
    none.str = c->errstr[0] ? c->errstr : "no reply";
    return none;
  }
  Reply out = to_reply(raw);
  freeReplyObject(raw);
  return out;
}

namespace {

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

struct CtxDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};

}  // namespace

std::string Reply::describe() const {
  std::ostringstream ss;
  switch (type) {
    case Type::None: ss << "(no reply: " << str << ")"; break;
    case Type::Nil: ss << "(nil)"; break;
    case Type::Status: ss << "+" << str; break;
    case Type::Error: ss << "-" << str; break;
    case Type::Integer: ss << ":" << integer; break;
    case Type::String: ss << '"' << str << '"'; break;
    case Type::Array:
      ss << "[";
      for (size_t i = 0; i < elements.size(); ++i) ss << (i ? ", " : "") << elements[i].describe();
      ss << "]";
  }
  return ss.str();
}

RedisServer::RedisServer(RedisOptions opts) : opts_(std::move(opts)) {
  redis_server_program();  // skips the test when there is none
  dir_ = std::make_unique<TempDir>("redis");
  std::string why;
  for (int attempt = 0; attempt < 20; ++attempt) {
    port_ = pick_free_port();
    if (try_start_once(&why)) return;
  }
  throw std::runtime_error("could not start redis-server: " + why + "\n" + log());
}

RedisServer::~RedisServer() {
  if (proc_) proc_->kill_and_reap();
}

pid_t RedisServer::pid() const { return proc_ ? proc_->pid() : -1; }
std::string RedisServer::socket_path() const { return (dir_->path() / "redis.sock").string(); }
std::string RedisServer::url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
std::string RedisServer::url_with_password() const {
  return "redis://:" + opts_.password.value_or("") + "@127.0.0.1:" + std::to_string(port_);
}
std::string RedisServer::unix_url() const { return "unix://" + socket_path(); }

bool RedisServer::try_start_once(std::string* why) {
  std::vector<std::string> argv = {
      redis_server_program(),  "--port",       std::to_string(port_), "--bind",
      "127.0.0.1",             "--unixsocket", socket_path(),         "--unixsocketperm",
      "700",                   "--save",       "",                    "--appendonly",
      "no",                    "--daemonize",  "no",                  "--dir",
      dir_->str(),             "--logfile",    (dir_->path() / "redis.log").string(),
      "--databases",           "16"};
  if (opts_.password) {
    argv.push_back("--requirepass");
    argv.push_back(*opts_.password);
  }
  for (const auto& a : opts_.extra_args) argv.push_back(a);
  SpawnOptions so;
  so.scrub_env = false;
  so.env = opts_.env;
  proc_ = std::make_unique<Process>(argv, so);
  frozen_ = false;
  if (ping_until_ready(why)) return true;
  proc_->kill_and_reap();
  proc_.reset();
  return false;
}

bool RedisServer::ping_until_ready(std::string* why) {
  const auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline) {
    if (!proc_->running()) {
      *why = "redis-server exited with " + std::to_string(proc_->exit_code().value_or(-1)) +
             " on port " + std::to_string(port_);
      return false;
    }
    Reply r = cmd({"INFO", "server"}, 500ms);
    if (r.type == Reply::Type::String) {
      // Make sure the server answering is ours and not another test's on the same port.
      const std::string want = "process_id:" + std::to_string(proc_->pid());
      if (r.str.find(want + "\r") != std::string::npos ||
          r.str.find(want + "\n") != std::string::npos)
        return true;
      *why = "another server answers on port " + std::to_string(port_);
    } else {
      *why = "INFO: " + r.describe();
    }
    std::this_thread::sleep_for(5ms);
  }
  *why += " (not ready within 10s)";
  return false;
}

void RedisServer::freeze() {
  if (!proc_) throw std::logic_error("freeze: server not running");
  ::kill(proc_->pid(), SIGSTOP);
  frozen_ = true;
  wait_until(
      [&] {
        auto st = process_state(proc_->pid());
        return !st || *st == 'T' || *st == 't';
      },
      5s, 1ms);
}

void RedisServer::thaw() {
  if (!proc_) return;
  ::kill(proc_->pid(), SIGCONT);
  frozen_ = false;
}

void RedisServer::stop() {
  if (!proc_) return;
  proc_->kill_and_reap();
  proc_.reset();
  frozen_ = false;
}

void RedisServer::start() {
  if (proc_) return;
  std::string why;
  // Same port: the address may be busy for a moment; retry for a few seconds.
  const auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline) {
    if (try_start_once(&why)) return;
    std::this_thread::sleep_for(50ms);
  }
  throw std::runtime_error("could not restart redis-server: " + why + "\n" + log());
}

void RedisServer::restart() {
  stop();
  start();
}

Reply RedisServer::cmd(const std::vector<std::string>& args,
                       std::chrono::milliseconds timeout) const {
  const timeval tv = to_timeval(timeout);
  std::unique_ptr<redisContext, CtxDeleter> c(redisConnectWithTimeout("127.0.0.1", port_, tv));
  Reply fail;
  if (!c) {
    fail.str = "redisConnectWithTimeout returned null";
    return fail;
  }
  if (c->err) {
    fail.str = c->errstr;
    return fail;
  }
  redisSetTimeout(c.get(), tv);
  if (opts_.password) {
    Reply a = send_command(c.get(), {"AUTH", *opts_.password});
    if (!a.ok()) return a;
  }
  return send_command(c.get(), args);
}

std::optional<std::string> RedisServer::get(const std::string& key) const {
  Reply r = cmd({"GET", key});
  if (r.type == Reply::Type::String) return r.str;
  if (r.type == Reply::Type::Nil) return std::nullopt;
  throw std::runtime_error("GET " + key + ": " + r.describe());
}

bool RedisServer::exists(const std::string& key) const {
  Reply r = cmd({"EXISTS", key});
  if (r.type != Reply::Type::Integer) throw std::runtime_error("EXISTS: " + r.describe());
  return r.integer > 0;
}

long long RedisServer::pttl(const std::string& key) const {
  Reply r = cmd({"PTTL", key});
  if (r.type != Reply::Type::Integer) throw std::runtime_error("PTTL: " + r.describe());
  return r.integer;
}

long long RedisServer::dbsize() const {
  Reply r = cmd({"DBSIZE"});
  if (r.type != Reply::Type::Integer) throw std::runtime_error("DBSIZE: " + r.describe());
  return r.integer;
}

std::vector<std::string> RedisServer::keys() const {
  Reply r = cmd({"KEYS", "*"});
  if (r.type != Reply::Type::Array) throw std::runtime_error("KEYS: " + r.describe());
  std::vector<std::string> out;
  for (const auto& e : r.elements) out.push_back(e.str);
  return out;
}

long long RedisServer::time_us() const {
  Reply r = cmd({"TIME"});
  if (r.type != Reply::Type::Array || r.elements.size() != 2)
    throw std::runtime_error("TIME: " + r.describe());
  return std::stoll(r.elements[0].str) * 1000000LL + std::stoll(r.elements[1].str);
}

std::string RedisServer::log() const {
  return read_file(dir_->path() / "redis.log").value_or("(no redis log)");
}

std::string lock_key(std::string_view name, std::string_view prefix) {
  return std::string(prefix) + "{" + std::string(name) + "}:lock";
}
std::string token_key(std::string_view name, std::string_view prefix) {
  return std::string(prefix) + "{" + std::string(name) + "}:token";
}

std::optional<LockValue> parse_lock_value(std::string_view v) {
  std::istringstream ss{std::string(v)};
  LockValue lv;
  std::string token, pid, extra;
  if (!(ss >> lv.owner >> token >> pid >> lv.host)) return std::nullopt;
  if (ss >> extra) return std::nullopt;
  auto t = parse_ll(token);
  auto p = parse_ll(pid);
  if (!t || !p) return std::nullopt;
  lv.token = *t;
  lv.pid = *p;
  return lv;
}

}  // namespace fencerun::test
