// redis::Client's reconnect-and-resend policy against a scripted server on a unix socket, which
// decides per connection when to answer and when to close: an idle connection the server closed is
// replaced before the request; a connection closed under a request gets the request once more only
// when it is safe to repeat (Resend::idempotent); the server's refusal survives the close after it.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/redis/client.hpp"
#include "backends/redis/url.hpp"
#include "support/util.hpp"

namespace fencerun::test {
namespace {

using namespace std::chrono_literals;

// Commands in a chunk of RESP requests (each starts with '*' at the start of a line).
int commands_in(const std::string& chunk) {
  int n = 0;
  for (std::size_t i = 0; i < chunk.size(); ++i)
    if (chunk[i] == '*' && (i == 0 || chunk[i - 1] == '\n')) ++n;
  return n;
}

std::string read_chunk(int fd) {
  char buf[65536];
  ssize_t n = ::read(fd, buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

void answer(int fd, const std::string& chunk) {
  std::string out;
  for (int i = commands_in(chunk); i > 0; --i) out += "+PONG\r\n";
  [[maybe_unused]] auto n = ::write(fd, out.data(), out.size());
}

// Connection I (0-based) is handled by behaviours[I], or answered in full when there is none.
class ScriptedServer {
 public:
  using Behaviour = std::function<void(int fd, ScriptedServer&)>;
  explicit ScriptedServer(std::vector<Behaviour> behaviours) : behaviours_(std::move(behaviours)) {
    path_ = (dir_.path() / "s.sock").string();
    listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path_.c_str());
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_, 8) != 0)
      throw std::runtime_error("cannot listen on " + path_);
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedServer() {
    stop_ = true;
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
  }
  redis::RedisEndpoint endpoint() const { return redis::parse_redis_url("unix://" + path_).value(); }
  int connections() const { return connections_.load(); }
  int closed() const { return closed_.load(); }
  void note_commands(int n) { commands_ += n; }
  int commands() const { return commands_.load(); }

 private:
  void serve() {
    while (!stop_) {
      int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      const int index = connections_++;
      if (index < static_cast<int>(behaviours_.size()) && behaviours_[index]) {
        behaviours_[index](fd, *this);
      } else {
        for (std::string chunk = read_chunk(fd); !chunk.empty(); chunk = read_chunk(fd)) {
          note_commands(commands_in(chunk));
          answer(fd, chunk);
        }
      }
      ::close(fd);
      ++closed_;
    }
  }

  TempDir dir_;
  std::string path_;
  int listen_ = -1;
  std::vector<Behaviour> behaviours_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0}, closed_{0}, commands_{0};
  std::thread thread_;
};

// Answers one request, then closes: the server's idle timeout.
void answer_once_then_close(int fd, ScriptedServer& s) {
  auto chunk = read_chunk(fd);
  s.note_commands(commands_in(chunk));
  answer(fd, chunk);
}

// Answers one request, reads the next and closes without answering it.
void answer_once_then_drop_the_next(int fd, ScriptedServer& s) {
  answer_once_then_close(fd, s);
  s.note_commands(commands_in(read_chunk(fd)));
}

Deadline soon() { return BootClock::now() + 2s; }

TEST(ResendTest, IdleConnectionClosedByTheServerIsReplacedBeforeTheRequest) {
  ScriptedServer server({answer_once_then_close});
  redis::Client client(server.endpoint());
  ASSERT_TRUE(client.command({"PING"}, soon()).has_value());
  ASSERT_TRUE(wait_until([&] { return server.closed() == 1; }, 5s));
  // Not idempotent, and still sent: nothing went out on the closed connection.
  auto again = client.command({"PING"}, soon(), redis::Resend::never);
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(server.connections(), 2);
  EXPECT_EQ(server.commands(), 2);
}

TEST(ResendTest, IdempotentRequestIsSentOnceMoreWhenTheConnectionClosesUnderIt) {
  ScriptedServer server({answer_once_then_drop_the_next});
  redis::Client client(server.endpoint());
  ASSERT_TRUE(client.command({"PING"}, soon()).has_value());
  auto again = client.command({"PING"}, soon(), redis::Resend::idempotent);
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(server.connections(), 2);
  EXPECT_EQ(server.commands(), 3);  // the dropped one ran (as far as the client knows) and was sent again
}

TEST(ResendTest, OtherRequestIsNotSentTwice) {
  ScriptedServer server({answer_once_then_drop_the_next});
  redis::Client client(server.endpoint());
  ASSERT_TRUE(client.command({"PING"}, soon()).has_value());
  auto again = client.command({"PING"}, soon(), redis::Resend::never);
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().kind, redis::Error::Kind::connection) << again.error().message;
  EXPECT_TRUE(again.error().maybe_executed);
  EXPECT_EQ(server.connections(), 1);
  EXPECT_EQ(server.commands(), 2);
}

TEST(ResendTest, ARequestSentOnAFreshConnectionIsNotRepeated) {
  // A server that reads the first request of every connection and closes: it may have run it, and
  // a fresh connection failing says the server is in trouble, not that it timed out an idle client.
  auto read_and_close = [](int fd, ScriptedServer& s) { s.note_commands(commands_in(read_chunk(fd))); };
  ScriptedServer server({read_and_close, read_and_close, read_and_close});
  redis::Client client(server.endpoint());
  auto r = client.command({"PING"}, soon(), redis::Resend::idempotent);
  ASSERT_FALSE(r.has_value());
  EXPECT_TRUE(r.error().maybe_executed);
  EXPECT_EQ(server.connections(), 1);
}

TEST(ResendTest, TheRefusalBeforeTheCloseIsReported) {
  // The client limit: the server answers at once, before reading, and closes.
  ScriptedServer server({[](int fd, ScriptedServer&) {
    const std::string no = "-ERR max number of clients reached\r\n";
    [[maybe_unused]] auto n = ::write(fd, no.data(), no.size());
  }});
  redis::Client client(server.endpoint());
  client.learn_server();  // HELLO and COMMAND INFO go out with the request: three replies expected
  auto r = client.command({"PING"}, soon(), redis::Resend::idempotent);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().kind, redis::Error::Kind::unready) << r.error().message;
  EXPECT_NE(r.error().message.find("max number of clients reached"), std::string::npos) << r.error().message;
  EXPECT_FALSE(r.error().maybe_executed);
}

TEST(ResendTest, NotNowAnswersAreUnready) {
  for (const char* word : {"LOADING Redis is loading the dataset in memory", "BUSY Redis is busy running a script",
                           "MASTERDOWN Link with MASTER is down", "CLUSTERDOWN The cluster is down",
                           "ERR max number of clients reached"}) {
    redis::Reply r;
    r.type = redis::Reply::Type::error;
    r.str = word;
    EXPECT_TRUE(redis::is_unready(r)) << word;
  }
  redis::Reply other;
  other.type = redis::Reply::Type::error;
  other.str = "ERR unknown command";
  EXPECT_FALSE(redis::is_unready(other));
  other.type = redis::Reply::Type::string;
  other.str = "LOADING";
  EXPECT_FALSE(redis::is_unready(other));
}

}  // namespace
}  // namespace fencerun::test
