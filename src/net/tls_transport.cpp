// TLS over a connected non-blocking socket, with OpenSSL. Certificate and host-name verification are
// on unless TlsSettings::insecure; every handshake, read and write is bounded by the caller's deadline.
//
// OpenSSL is not linked: the distribution's libssl.so.3 (and with it libcrypto.so.3) is loaded with
// dlopen(3) at the first TLS connection. A run over redis:// or a unix socket, and --version or
// --help, never pay for loading and relocating it, and it is still the shared library the system
// updates. Only the headers are used at build time, for the types and constants.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "net/transport.hpp"
#include "util/fd.hpp"

namespace fencerun::net {

namespace {

static_assert(OPENSSL_VERSION_MAJOR == 3, "the library loaded at run time is libssl.so.3");
constexpr const char* k_libssl = "libssl.so.3";

// Every OpenSSL function used here, called through a pointer found with dlsym. (Functions that the
// headers define as macros, such as SSL_CTX_set_min_proto_version, are spelt out as the *_ctrl
// calls they stand for.)
#define FENCERUN_OPENSSL_FUNCTIONS(X)                                                                   \
  X(ERR_get_error) X(ERR_clear_error) X(ERR_error_string_n) X(BIO_get_callback_arg)                   \
  X(BIO_set_callback_arg) X(BIO_set_callback_ex) X(BIO_number_written) X(SSL_get_wbio) X(SSL_get_rbio) \
  X(SSL_write) X(SSL_read) X(SSL_get_error) X(SSL_pending) X(SSL_CTX_free) X(SSL_free) X(SSL_CTX_new)  \
  X(TLS_client_method) X(SSL_CTX_ctrl) X(SSL_ctrl) X(SSL_CTX_set_verify)                               \
  X(SSL_CTX_set_default_verify_paths) X(SSL_CTX_load_verify_locations)                                 \
  X(SSL_CTX_use_certificate_chain_file) X(SSL_CTX_use_PrivateKey_file) X(SSL_new) X(SSL_set_fd)        \
  X(SSL_get0_param) X(X509_VERIFY_PARAM_set1_ip_asc) X(X509_VERIFY_PARAM_set1_host) X(SSL_connect)     \
  X(SSL_get_verify_result) X(X509_verify_cert_error_string) X(SSL_CTX_set_alpn_protos)

struct OpenSsl {
#define FENCERUN_DECLARE(name) decltype(&::name) name = nullptr;
  FENCERUN_OPENSSL_FUNCTIONS(FENCERUN_DECLARE)
#undef FENCERUN_DECLARE
  std::string error;  // why it could not be loaded ("" when loaded)
};

OpenSsl load_openssl() {
  OpenSsl lib;
  // Never unloaded: the process ends with it (OpenSSL's own exit handlers stay valid).
  void* handle = ::dlopen(k_libssl, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    lib.error = std::string("TLS is not available: cannot load ") + k_libssl + (why ? std::string(": ") + why : "");
    return lib;
  }
  // dlsym on libssl's handle also finds the libcrypto functions (libssl depends on it).
#define FENCERUN_RESOLVE(name)                                                             \
  lib.name = reinterpret_cast<decltype(&::name)>(::dlsym(handle, #name));                  \
  if (!lib.name) {                                                                         \
    lib.error = std::string("TLS is not available: ") + k_libssl + " has no " + #name;    \
    return lib;                                                                            \
  }
  FENCERUN_OPENSSL_FUNCTIONS(FENCERUN_RESOLVE)
#undef FENCERUN_RESOLVE
  return lib;
}

// Loaded once, at the first TLS connection (thread-safe: a static's initialisation).
const OpenSsl& openssl() {
  static const OpenSsl lib = load_openssl();
  return lib;
}

}  // namespace

namespace {

struct CtxDeleter {
  void operator()(SSL_CTX* c) const { openssl().SSL_CTX_free(c); }
};
struct SslDeleter {
  void operator()(SSL* s) const { openssl().SSL_free(s); }
};

std::string openssl_error(const std::string& what) {
  unsigned long code = openssl().ERR_get_error();
  openssl().ERR_clear_error();
  if (code == 0) return what;
  char buf[256];
  openssl().ERR_error_string_n(code, buf, sizeof buf);
  return what + ": " + buf;
}

// The first byte the server sent, recorded by a callback on the socket BIO during the handshake. A
// TLS server starts with a record of content type 20 to 23; a plain-text server that answers the
// ClientHello at once (an HTTP server's 400, a banner) does not, where OpenSSL only says "wrong
// version number".
struct FirstByte {
  int value = -1;  // none yet
  bool is_tls_record() const { return value >= 20 && value <= 23; }
};

long record_first_byte(BIO* bio, int oper, const char* data, std::size_t, int, long, int ret, std::size_t* processed) {
  if (oper == (BIO_CB_READ | BIO_CB_RETURN) && ret > 0 && processed != nullptr && *processed > 0) {
    auto* first = reinterpret_cast<FirstByte*>(openssl().BIO_get_callback_arg(bio));
    if (first->value < 0) first->value = static_cast<unsigned char>(data[0]);
  }
  return ret;
}

bool is_ip_address(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// OpenSSL writes to the socket with write(2): keep a SIGPIPE from a closed peer away from the process.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe, &m_old);
  }
  ~SigpipeGuard() {
    if (!sigismember(&m_old, SIGPIPE)) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      timespec zero{};
      while (::sigtimedwait(&pipe, nullptr, &zero) > 0) {
      }
      ::pthread_sigmask(SIG_SETMASK, &m_old, nullptr);
    }
  }

 private:
  sigset_t m_old{};
};

class TlsTransport final : public Transport {
 public:
  TlsTransport(UniqueFd fd, std::unique_ptr<SSL_CTX, CtxDeleter> ctx, std::unique_ptr<SSL, SslDeleter> ssl)
      : m_fd(std::move(fd)), m_ctx(std::move(ctx)), m_ssl(std::move(ssl)) {}

  Result<void> write_all(const char* data, std::size_t size, Deadline deadline) override {
    SigpipeGuard guard;
    // Whether any byte of this request reached the socket: the socket BIO counts what it wrote.
    BIO* wbio = openssl().SSL_get_wbio(m_ssl.get());
    const std::uint64_t written_before = openssl().BIO_number_written(wbio);
    while (size > 0) {
      int n = openssl().SSL_write(m_ssl.get(), data, static_cast<int>(size));
      if (n > 0) {
        data += n;
        size -= static_cast<std::size_t>(n);
        continue;
      }
      if (auto ok = wait_after(n, deadline, "TLS write"); !ok) {
        Error e = ok.error();
        e.maybe_executed = openssl().BIO_number_written(wbio) > written_before;
        return std::unexpected(std::move(e));
      }
    }
    return {};
  }

  Result<std::size_t> read_some(char* data, std::size_t capacity, Deadline deadline) override {
    SigpipeGuard guard;
    for (;;) {
      int n = openssl().SSL_read(m_ssl.get(), data, static_cast<int>(capacity));
      if (n > 0) return static_cast<std::size_t>(n);
      if (auto ok = wait_after(n, deadline, "TLS read"); !ok) return std::unexpected(ok.error());
    }
  }

  // After an SSL call returned `rc`: wait for what it needs, or report why it failed.
  Result<void> wait_after(int rc, Deadline deadline, const char* what) {
    int err = openssl().SSL_get_error(m_ssl.get(), rc);
    if (err == SSL_ERROR_WANT_READ) return wait_for(m_fd.get(), POLLIN, deadline, what);
    if (err == SSL_ERROR_WANT_WRITE) return wait_for(m_fd.get(), POLLOUT, deadline, what);
    if (err == SSL_ERROR_ZERO_RETURN)
      return std::unexpected(Error{Error::Kind::connection, "TLS connection closed by server", false, true});
    if (err == SSL_ERROR_SYSCALL && errno != 0)
      return std::unexpected(
          Error{Error::Kind::connection, std::string(what) + ": " + std::strerror(errno), false, errno == ECONNRESET});
    // An end of stream without close_notify (a peer that just closes the socket).
    if (err == SSL_ERROR_SYSCALL) return std::unexpected(Error{Error::Kind::connection, openssl_error(what), false, true});
    return std::unexpected(Error{Error::Kind::connection, openssl_error(what)});
  }

  SSL* ssl() { return m_ssl.get(); }
  int fd() const override { return m_fd.get(); }
  bool has_buffered() const override { return openssl().SSL_pending(m_ssl.get()) > 0; }

 private:
  UniqueFd m_fd;
  std::unique_ptr<SSL_CTX, CtxDeleter> m_ctx;
  std::unique_ptr<SSL, SslDeleter> m_ssl;
};

}  // namespace

Result<std::unique_ptr<Transport>> open_tls_transport(UniqueFd fd, const std::string& host,
                                                      const TlsOptions& options, Deadline deadline) {
  const util::TlsSettings& tls = options.settings;
  auto fail = [](std::string message) -> Result<std::unique_ptr<Transport>> {
    return std::unexpected(Error{Error::Kind::connection, std::move(message)});
  };
  if (const std::string& unavailable = openssl().error; !unavailable.empty()) return fail(unavailable);
  std::unique_ptr<SSL_CTX, CtxDeleter> ctx(openssl().SSL_CTX_new(openssl().TLS_client_method()));
  if (!ctx) return fail(openssl_error("TLS setup failed"));
  openssl().SSL_CTX_ctrl(ctx.get(), SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, nullptr);
  if (!tls.insecure) {
    openssl().SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    int ok = tls.ca_file.empty() ? openssl().SSL_CTX_set_default_verify_paths(ctx.get())
                                 : openssl().SSL_CTX_load_verify_locations(ctx.get(), tls.ca_file.c_str(), nullptr);
    if (ok != 1) return fail(openssl_error("cannot load CA certificates" + (tls.ca_file.empty() ? "" : " from " + tls.ca_file)));
  } else {
    openssl().SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  }
  if (!tls.cert_file.empty()) {
    if (openssl().SSL_CTX_use_certificate_chain_file(ctx.get(), tls.cert_file.c_str()) != 1)
      return fail(openssl_error("cannot load client certificate " + tls.cert_file));
    const std::string& key = tls.key_file.empty() ? tls.cert_file : tls.key_file;
    if (openssl().SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1)
      return fail(openssl_error("cannot load client key " + key));
  }
  if (!options.alpn.empty()) {
    // ALPN's wire form: each protocol name preceded by its length.
    std::string protos(1, static_cast<char>(options.alpn.size()));
    protos += options.alpn;
    if (openssl().SSL_CTX_set_alpn_protos(ctx.get(), reinterpret_cast<const unsigned char*>(protos.data()),
                                          static_cast<unsigned>(protos.size())) != 0)
      return fail(openssl_error("TLS setup failed (ALPN)"));
  }
  std::unique_ptr<SSL, SslDeleter> ssl(openssl().SSL_new(ctx.get()));
  if (!ssl) return fail(openssl_error("TLS setup failed"));
  openssl().SSL_set_fd(ssl.get(), fd.get());
  const std::string& name = tls.server_name.empty() ? host : tls.server_name;
  if (!is_ip_address(name)) openssl().SSL_ctrl(ssl.get(), SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
                                                const_cast<char*>(name.c_str()));
  if (!tls.insecure) {
    X509_VERIFY_PARAM* param = openssl().SSL_get0_param(ssl.get());
    int ok = is_ip_address(name) ? openssl().X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                                 : openssl().X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0);
    if (ok != 1) return fail("cannot verify TLS server name '" + name + "'");
  }
  FirstByte first;  // outlives the transport, whose BIO points at it until the handshake ends
  auto transport = std::make_unique<TlsTransport>(std::move(fd), std::move(ctx), std::move(ssl));
  BIO* rbio = openssl().SSL_get_rbio(transport->ssl());
  openssl().BIO_set_callback_arg(rbio, reinterpret_cast<char*>(&first));
  openssl().BIO_set_callback_ex(rbio, record_first_byte);
  for (;;) {
    int rc = openssl().SSL_connect(transport->ssl());
    if (rc == 1) break;
    long verify = openssl().SSL_get_verify_result(transport->ssl());
    if (verify != X509_V_OK)
      return fail("TLS certificate of " + name + " rejected: " + openssl().X509_verify_cert_error_string(verify));
    auto ok = transport->wait_after(rc, deadline, "TLS handshake");
    if (ok) continue;
    Error e = ok.error();
    if (first.value >= 0 && !first.is_tls_record()) {
      openssl().ERR_clear_error();
      return fail("the server does not speak TLS on this port" +
                  (options.plain_scheme.empty() ? std::string() : ": try " + options.plain_scheme));
    }
    // A plain server may never answer a ClientHello (redis-server takes it for an unfinished inline
    // command); a TLS server answers at once.
    if (e.kind == Error::Kind::timeout && first.value < 0)
      e.message += " with no answer from the server: it may not speak TLS on this port" +
                   (options.plain_scheme.empty() ? std::string() : " (try " + options.plain_scheme + ")");
    return std::unexpected(std::move(e));
  }
  openssl().BIO_set_callback_ex(rbio, nullptr);
  openssl().BIO_set_callback_arg(rbio, nullptr);
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace fencerun::net
