// Plain TCP and unix-socket transport: non-blocking sockets, every wait done with poll() against the
// caller's deadline.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "net/transport.hpp"
#include "util/fd.hpp"

namespace fencerun::net {
namespace {

Error timeout_error(const char* what) { return Error{Error::Kind::timeout, std::string(what) + " timed out"}; }

Error errno_error(const std::string& what, int err) {
  return Error{Error::Kind::connection, what + ": " + std::strerror(err)};
}

}  // namespace

// Waits until `fd` is ready for `events` or the deadline passes. EINTR is retried: signals are
// handled through signalfd elsewhere and never need to interrupt a request.
Result<void> wait_for(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    auto left = time_left(deadline);
    if (left <= BootClock::duration::zero()) return std::unexpected(timeout_error(what));
    timespec ts{};
    ts.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(left).count();
    ts.tv_nsec = (left - std::chrono::seconds(ts.tv_sec)).count();
    pollfd p{fd, events, 0};
    int n = ::ppoll(&p, 1, &ts, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(errno_error("poll", errno));
    }
    if (n == 0) continue;  // re-check the deadline on the boot clock
    return {};
  }
}

namespace {

class SocketTransport final : public Transport {
 public:
  explicit SocketTransport(UniqueFd fd) : m_fd(std::move(fd)) {}
  int fd() const override { return m_fd.get(); }

  Result<void> write_all(const char* data, std::size_t size, Deadline deadline) override {
    bool wrote = false;  // once any byte is out, the server may run what it got
    auto fail = [&wrote](Error e) -> Result<void> {
      e.maybe_executed = wrote;
      return std::unexpected(std::move(e));
    };
    while (size > 0) {
      ssize_t n = ::send(m_fd.get(), data, size, MSG_NOSIGNAL);
      if (n > 0) {
        wrote = true;
        data += n;
        size -= static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (auto ok = wait_for(m_fd.get(), POLLOUT, deadline, "write"); !ok) return fail(ok.error());
        continue;
      }
      return fail(errno_error("write", errno));
    }
    return {};
  }

  Result<std::size_t> read_some(char* data, std::size_t capacity, Deadline deadline) override {
    for (;;) {
      ssize_t n = ::recv(m_fd.get(), data, capacity, 0);
      if (n > 0) return static_cast<std::size_t>(n);
      if (n == 0) return std::unexpected(Error{Error::Kind::connection, "connection closed by server", false, true});
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (auto ok = wait_for(m_fd.get(), POLLIN, deadline, "read"); !ok) return std::unexpected(ok.error());
        continue;
      }
      Error e = errno_error("read", errno);
      e.closed = errno == ECONNRESET;
      return std::unexpected(std::move(e));
    }
  }

 private:
  UniqueFd m_fd;
};

Result<UniqueFd> connect_address(const sockaddr* addr, socklen_t len, int family, Deadline deadline,
                                 const std::string& where) {
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return std::unexpected(errno_error("socket", errno));
  if (family != AF_UNIX) {
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  if (::connect(fd.get(), addr, len) == 0) return fd;
  if (errno != EINPROGRESS && errno != EINTR) return std::unexpected(errno_error("connect to " + where, errno));
  if (auto ok = wait_for(fd.get(), POLLOUT, deadline, ("connect to " + where).c_str()); !ok)
    return std::unexpected(ok.error());
  int err = 0;
  socklen_t err_len = sizeof err;
  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &err_len);
  if (err != 0) return std::unexpected(errno_error("connect to " + where, err));
  return fd;
}

struct AddrinfoDeleter {
  void operator()(addrinfo* ai) const { ::freeaddrinfo(ai); }
};
using AddrinfoPtr = std::unique_ptr<addrinfo, AddrinfoDeleter>;

// One name lookup, shared by the caller and the thread that runs it. Whoever lets go last frees it,
// so a caller that gave up never frees memory the resolver thread still writes.
struct Lookup {
  std::string host;
  std::string port;
  std::mutex mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  int rc = 0;
  AddrinfoPtr result;
};

// getaddrinfo() has no deadline of its own (glibc waits 5 s per nameserver try, several tries), so it
// runs on a detached thread and the caller waits only until its deadline. A lookup that is given up
// keeps running until the resolver's own timeouts end it, then frees itself.
Result<AddrinfoPtr> resolve(const std::string& host, std::uint16_t port, Deadline deadline) {
  if (time_left(deadline) <= BootClock::duration::zero())
    return std::unexpected(Error{Error::Kind::timeout, "resolving " + host + " timed out"});
  auto lookup = std::make_shared<Lookup>();
  lookup->host = host;
  lookup->port = std::to_string(port);
  {
    // The thread must never take a signal meant for the process (fencerun waits for signals
    // synchronously elsewhere): it starts with every signal blocked.
    sigset_t all, old;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    try {
      std::thread([lookup] {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* res = nullptr;
        int rc = ::getaddrinfo(lookup->host.c_str(), lookup->port.c_str(), &hints, &res);
        std::lock_guard guard(lookup->mutex);
        lookup->rc = rc;
        lookup->result.reset(rc == 0 ? res : nullptr);
        lookup->finished = true;
        lookup->finished_cv.notify_all();
      }).detach();
    } catch (const std::system_error& e) {
      ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
      return std::unexpected(Error{Error::Kind::connection, "cannot resolve " + host + ": " + e.what()});
    }
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  std::unique_lock lock(lookup->mutex);
  // The condition variable waits on the steady clock, the deadline is on the boot clock: wait for
  // what is left, then look again.
  while (!lookup->finished) {
    auto left = time_left(deadline);
    if (left <= BootClock::duration::zero())
      return std::unexpected(Error{Error::Kind::timeout, "resolving " + host + " timed out"});
    lookup->finished_cv.wait_for(lock, left);
  }
  if (lookup->rc != 0)
    return std::unexpected(Error{Error::Kind::connection, "cannot resolve " + host + ": " + ::gai_strerror(lookup->rc)});
  return std::move(lookup->result);
}

}  // namespace

Result<UniqueFd> connect_socket(const Address& ep, Deadline deadline) {
  if (!ep.unix_path.empty()) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (ep.unix_path.size() >= sizeof addr.sun_path)
      return std::unexpected(Error{Error::Kind::connection, "socket path too long: " + ep.unix_path});
    std::memcpy(addr.sun_path, ep.unix_path.c_str(), ep.unix_path.size() + 1);
    return connect_address(reinterpret_cast<const sockaddr*>(&addr), sizeof addr, AF_UNIX, deadline, ep.unix_path);
  }
  std::string where = ep.host + ":" + std::to_string(ep.port);
  // Numeric addresses skip the resolver entirely (the common case, and the fast one).
  sockaddr_in v4{};
  if (::inet_pton(AF_INET, ep.host.c_str(), &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    v4.sin_port = htons(ep.port);
    return connect_address(reinterpret_cast<const sockaddr*>(&v4), sizeof v4, AF_INET, deadline, where);
  }
  sockaddr_in6 v6{};
  if (::inet_pton(AF_INET6, ep.host.c_str(), &v6.sin6_addr) == 1) {
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(ep.port);
    return connect_address(reinterpret_cast<const sockaddr*>(&v6), sizeof v6, AF_INET6, deadline, where);
  }
  auto resolved = resolve(ep.host, ep.port, deadline);
  if (!resolved) return std::unexpected(resolved.error());
  Error last{Error::Kind::connection, "no address for " + ep.host};
  for (addrinfo* ai = resolved->get(); ai; ai = ai->ai_next) {
    auto fd = connect_address(ai->ai_addr, ai->ai_addrlen, ai->ai_family, deadline, where);
    if (fd) return fd;
    last = fd.error();
    if (last.kind == Error::Kind::timeout) break;
  }
  return std::unexpected(last);
}

std::unique_ptr<Transport> plain_transport(UniqueFd fd) { return std::make_unique<SocketTransport>(std::move(fd)); }

Result<std::unique_ptr<Transport>> open_transport(const Address& address, const TlsOptions* tls, Deadline deadline) {
  auto fd = connect_socket(address, deadline);
  if (!fd) return std::unexpected(fd.error());
  if (!tls) return plain_transport(std::move(*fd));
  return open_tls_transport(std::move(*fd), address.host, *tls, deadline);
}

}  // namespace fencerun::net
