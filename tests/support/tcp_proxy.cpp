#include "support/tcp_proxy.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "support/util.hpp"

namespace fencerun::test {
namespace {

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

bool send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Waits for `fd` readable or the stop fd; false when stopping or nothing came within `timeout_ms`.
bool wait_readable(int fd, int stop_fd, int timeout_ms) {
  pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  int n = ::poll(p, 2, timeout_ms);
  return n > 0 && !(p[1].revents & POLLIN) && (p[0].revents & (POLLIN | POLLHUP | POLLERR));
}

}  // namespace

TcpProxy::TcpProxy(int target_port) : m_target_port(target_port) {
  m_stop_fd = ::eventfd(0, EFD_CLOEXEC);
  if (m_stop_fd < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  std::string why = "no attempt";
  for (int attempt = 0; attempt < 20 && m_listen_fd < 0; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    int port = pick_free_port();
    sockaddr_in a = loopback(port);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 16) == 0) {
      m_listen_fd = fd;
      m_port = port;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  if (m_listen_fd < 0) {
    ::close(m_stop_fd);
    throw std::runtime_error("TcpProxy: cannot listen: " + why);
  }
  m_acceptor = std::thread([this] { accept_loop(); });
}

TcpProxy::~TcpProxy() {
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(m_stop_fd, &one, sizeof one);
  if (m_acceptor.joinable()) m_acceptor.join();
  {
    std::lock_guard lock(m_mutex);
    for (auto& t : m_threads)
      if (t.joinable()) t.join();
  }
  ::close(m_listen_fd);
  ::close(m_stop_fd);
}

void TcpProxy::set_mode(Mode mode, std::chrono::milliseconds delay, int max_resets) {
  m_delay_ms.store(delay.count());
  m_resets_left.store(max_resets);
  m_mode.store(mode);
}

bool TcpProxy::take_reset() {
  int left = m_resets_left.load();
  for (;;) {
    if (left < 0) return true;
    if (left == 0) return false;
    if (m_resets_left.compare_exchange_weak(left, left - 1)) return true;
  }
}

void TcpProxy::accept_loop() {
  for (;;) {
    pollfd p[2] = {{m_listen_fd, POLLIN, 0}, {m_stop_fd, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents & POLLIN) return;
    if (!(p[0].revents & POLLIN)) continue;
    int client = ::accept4(m_listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    ++m_connections;
    int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = loopback(m_target_port);
    if (server < 0 || ::connect(server, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      if (server >= 0) ::close(server);
      ::close(client);
      continue;
    }
    int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard lock(m_mutex);
    m_threads.emplace_back([this, client, server] { forward(client, server); });
  }
}

void TcpProxy::forward(int client, int server) {
  char buf[16384];
  bool reset = false;
  for (bool open = true; open;) {
    pollfd p[3] = {{client, POLLIN, 0}, {server, POLLIN, 0}, {m_stop_fd, POLLIN, 0}};
    if (::poll(p, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[2].revents & POLLIN) break;
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::recv(client, buf, sizeof buf, 0);
      if (n > 0 && m_mode.load() == Mode::black_hole) continue;
      if (n > 0 && m_mode.load() == Mode::delay_requests) {
        pollfd stop{m_stop_fd, POLLIN, 0};
        if (::poll(&stop, 1, static_cast<int>(m_delay_ms.load())) > 0) break;
      }
      if (n <= 0 || !send_all(server, buf, static_cast<size_t>(n))) break;
      if (m_mode.load() == Mode::reset_after_request && take_reset()) {
        // The reply proves the request ran; the client never sees it.
        if (wait_readable(server, m_stop_fd, 5000)) [[maybe_unused]] auto dropped = ::recv(server, buf, sizeof buf, 0);
        reset = true;
        break;
      }
    }
    if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::recv(server, buf, sizeof buf, 0);
      if (n <= 0) break;
      if (m_mode.load() == Mode::delay_replies) {
        // Hold the chunk, but let a shutting-down proxy go at once.
        pollfd stop{m_stop_fd, POLLIN, 0};
        if (::poll(&stop, 1, static_cast<int>(m_delay_ms.load())) > 0) break;
      }
      open = send_all(client, buf, static_cast<size_t>(n));
    }
  }
  if (reset) {
    linger l{1, 0};  // close() sends RST instead of FIN
    ::setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ++m_resets;
  }
  ::close(client);
  ::close(server);
}

}  // namespace fencerun::test
