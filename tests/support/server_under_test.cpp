#include "support/server_under_test.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <variant>
#include <vector>

#include "support/process.hpp"
#include "support/util.hpp"

namespace fencerun::test {

namespace {

// The cache tests/servers/prepare uses when FENCERUN_SERVER_CACHE is not set.
constexpr const char* k_default_cache = "/var/cache/fencerun-test-servers";

// The server, or why this run cannot have it (the reason the tests skip with).
using Lookup = std::variant<ServerUnderTest, std::string>;

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream ss(line);
  for (std::string f; std::getline(ss, f, '\t');) fields.push_back(f);
  return fields;
}

Lookup from_registry(const std::string& id) {
  const char* cache = std::getenv("FENCERUN_SERVER_CACHE");
  const auto registry = std::filesystem::path(cache && *cache ? cache : k_default_cache) / "registry";
  const std::string not_prepared = id + " not prepared: run tests/servers/prepare";
  const auto text = read_file(registry);
  if (!text) return not_prepared + " (no " + registry.string() + ")";
  for (const auto& line : split_lines(*text)) {
    const auto f = split_tabs(line);
    if (f.size() < 2 || f[1] != id) continue;
    if (f[0] == "ready" && f.size() == 6) return ServerUnderTest{id, f[2], f[3], f[4], f[5]};
    if (f[0] == "missing" && f.size() == 3) return id + " not prepared: " + f[2];
    throw std::runtime_error(registry.string() + ": malformed line: " + line);
  }
  return not_prepared + " (" + registry.string() + " does not name it)";
}

// Name and version from "Redis server v=7.0.15 sha=..." (`program --version`).
ServerUnderTest from_version_output(const std::string& program) {
  const RunResult r = run_program({program, "--version"}, {}, 10s);
  std::istringstream words(r.out);
  std::string name;
  words >> name;
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (std::string w; words >> w;)
    if (w.starts_with("v=")) return ServerUnderTest{"", name, w.substr(2), program, program};
  throw std::runtime_error(program + " --version printed no version: " + r.describe());
}

Lookup look_up() {
  const char* id = std::getenv("FENCERUN_TEST_SERVER_ID");
  if (id && *id) return from_registry(id);
  const auto& program = find_redis_server();
  if (!program) return std::string("redis-server not found: install redis-server");
  return from_version_output(*program);
}

}  // namespace

std::string ServerUnderTest::describe() const {
  return name + " " + version + " (" + (id.empty() ? "default: " + server : id) + ")";
}

const ServerUnderTest& server_under_test() {
  static const Lookup found = [] {
    Lookup l = look_up();
    if (const auto* s = std::get_if<ServerUnderTest>(&l)) {
      std::printf("server under test: %s\n", s->describe().c_str());
      std::fflush(stdout);
    }
    return l;
  }();
  if (const auto* why = std::get_if<std::string>(&found)) skip_current_test(*why);
  return std::get<ServerUnderTest>(found);
}

std::string hello_field(const Reply& hello, std::string_view key) {
  for (size_t i = 0; i + 1 < hello.elements.size(); i += 2)
    if (hello.elements[i].str == key) return hello.elements[i + 1].str;
  return "";
}

::testing::AssertionResult is_server_under_test(const Reply& hello) {
  const ServerUnderTest& s = server_under_test();
  if (hello.type != Reply::Type::Array) return ::testing::AssertionFailure() << "HELLO: " << hello.describe();
  const std::string name = hello_field(hello, "server");
  const std::string version = hello_field(hello, "version");
  if (name != s.name || version != s.version)
    return ::testing::AssertionFailure() << "HELLO says " << name << " " << version << "; " << s.server
                                         << " --version said " << s.name << " " << s.version;
  if (s.id.empty()) return ::testing::AssertionSuccess();
  const auto dash = s.id.rfind('-');
  if (s.id.substr(0, dash) != name || !version.starts_with(s.id.substr(dash + 1) + "."))
    return ::testing::AssertionFailure() << "the id " << s.id << " does not name " << name << " " << version;
  return ::testing::AssertionSuccess();
}

}  // namespace fencerun::test
