#pragma once
// A TCP proxy between fencerun and a redis-server for the tests of slow and broken networks: every
// reply is held back for a fixed delay, or the first connections that carry a script request are
// reset (RST) once the server has answered, so the request ran but its reply is lost.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/util.hpp"

namespace fencerun::test {

class ReplyProxy {
 public:
  struct Mode {
    std::chrono::milliseconds reply_delay{0};
    int resets_after_script = 0;  // connections to reset after the reply to their first script run
  };

  ReplyProxy(int target_port, Mode mode) : m_target(target_port), m_mode(mode) {
    for (int attempt = 0; attempt < 50 && m_listen < 0; ++attempt) {
      int port = pick_free_port();
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in a = address(port);
      if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 64) == 0) {
        m_listen = fd;
        m_port = port;
      } else {
        ::close(fd);
      }
    }
    if (m_listen < 0) throw std::runtime_error("proxy: no port to listen on");
    m_resets_left = mode.resets_after_script;
    m_acceptor = std::thread([this] { accept_loop(); });
  }

  ~ReplyProxy() {
    m_stop = true;
    ::shutdown(m_listen, SHUT_RDWR);
    m_acceptor.join();
    for (auto& t : m_pumps) t.join();
    ::close(m_listen);
  }

  int port() const { return m_port; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(m_port); }
  int resets_done() const { return m_mode.resets_after_script - m_resets_left.load(); }

 private:
  static sockaddr_in address(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  void accept_loop() {
    while (!m_stop) {
      pollfd p{m_listen, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int client = ::accept4(m_listen, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a = address(m_target);
      if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      std::lock_guard lock(m_mutex);
      m_pumps.emplace_back([this, client, server] { pump(client, server); });
    }
  }

  // Both directions of one connection, until either side closes or the proxy stops.
  void pump(int client, int server) {
    bool script_seen = false, reset_this = false;
    char buf[65536];
    while (!m_stop) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      if (p[0].revents) {
        ssize_t n = ::read(client, buf, sizeof buf);
        if (n <= 0) break;
        std::string_view chunk(buf, static_cast<size_t>(n));
        if (!script_seen && (chunk.find("EVALSHA") != chunk.npos || chunk.find("EVAL") != chunk.npos)) {
          script_seen = true;
          int left = m_resets_left.load();
          while (left > 0 && !m_resets_left.compare_exchange_weak(left, left - 1)) {
          }
          reset_this = left > 0;
        }
        if (::write(server, buf, static_cast<size_t>(n)) != n) break;
      }
      if (p[1].revents) {
        ssize_t n = ::read(server, buf, sizeof buf);
        if (n <= 0) break;
        // A NOSCRIPT answer means the script did not run (EVAL follows): only a real reply is lost.
        if (reset_this && !std::string_view(buf, static_cast<size_t>(n)).starts_with("-NOSCRIPT")) {
          linger l{1, 0};  // close with RST: the reply is lost, the request has run
          ::setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof l);
          break;
        }
        if (m_mode.reply_delay.count() > 0) std::this_thread::sleep_for(m_mode.reply_delay);
        if (::write(client, buf, static_cast<size_t>(n)) != n) break;
      }
    }
    ::close(client);
    ::close(server);
  }

  int m_target;
  Mode m_mode;
  int m_listen = -1;
  int m_port = 0;
  std::atomic<bool> m_stop{false};
  std::atomic<int> m_resets_left{0};
  std::mutex m_mutex;
  std::thread m_acceptor;
  std::vector<std::thread> m_pumps;
};

}  // namespace fencerun::test
