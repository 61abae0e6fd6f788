#pragma once
// TcpProxy: a TCP proxy on 127.0.0.1 in front of a server on 127.0.0.1:target_port, for tests that
// need a connection to misbehave at a chosen moment. Each accepted connection gets a connection of
// its own to the target and a thread that forwards both ways. The mode is read for every chunk, so
// it can be changed while connections are open:
//   pass_through         forward everything as it comes
//   delay_replies        hold each server->client chunk for `delay` before forwarding it
//   delay_requests       hold each client->server chunk for `delay` before forwarding it (a request
//                        lands late; its reply comes back as soon as the server answers)
//   black_hole           drop every client->server chunk (requests vanish; nothing comes back)
//   reset_after_request  forward the client's next chunk (the request) to the server, wait for the
//                        server's reply (so the request has run), drop it, and reset the client
//                        connection (SO_LINGER 0: the client reads ECONNRESET)
//
//   TcpProxy proxy(redis.port());
//   proxy.set_mode(TcpProxy::Mode::reset_after_request);
//   ... connect to 127.0.0.1:proxy.port() ...
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace fencerun::test {

class TcpProxy {
 public:
  enum class Mode { pass_through, delay_replies, reset_after_request, delay_requests, black_hole };

  // Listens on a free port below 32768 at once; throws when it cannot.
  explicit TcpProxy(int target_port);
  ~TcpProxy();  // closes every connection and joins the threads
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return m_port; }
  // `max_resets` >= 0: reset_after_request resets that many connections, then passes through.
  void set_mode(Mode mode, std::chrono::milliseconds delay = std::chrono::milliseconds(0), int max_resets = -1);
  int connections() const { return m_connections.load(); }  // accepted so far
  int resets() const { return m_resets.load(); }            // client connections reset so far

 private:
  void accept_loop();
  void forward(int client, int server);

  int m_target_port;
  int m_port = 0;
  int m_listen_fd = -1;
  int m_stop_fd = -1;  // eventfd, readable once the proxy shuts down
  std::atomic<Mode> m_mode{Mode::pass_through};
  std::atomic<long long> m_delay_ms{0};
  std::atomic<int> m_connections{0};
  std::atomic<int> m_resets{0};
  std::atomic<int> m_resets_left{-1};  // -1: no limit
  bool take_reset();
  std::mutex m_mutex;
  std::vector<std::thread> m_threads;
  std::thread m_acceptor;
};

}  // namespace fencerun::test
