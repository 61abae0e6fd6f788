// The command funnel. hiredis is used only for its RESP formatter and reader, which work on any byte
// stream; the transport (and so every timeout) is ours.
#include "redis/client.hpp"

#include <hiredis/hiredis.h>

#include "redis/transport.hpp"

namespace fencerun::redis {
namespace {

Reply convert(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING: out.type = Reply::Type::string; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_STATUS: out.type = Reply::Type::status; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_ERROR: out.type = Reply::Type::error; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_INTEGER: out.type = Reply::Type::integer; out.integer = r->integer; break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
      break;
    default: out.type = Reply::Type::nil; break;
  }
  return out;
}

void append_command(std::string& payload, std::span<const std::string_view> argv) {
  std::vector<const char*> ptrs;
  std::vector<std::size_t> lens;
  ptrs.reserve(argv.size());
  lens.reserve(argv.size());
  for (auto a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  char* cmd = nullptr;
  int len = ::redisFormatCommandArgv(&cmd, static_cast<int>(argv.size()), ptrs.data(), lens.data());
  if (len < 0) throw std::bad_alloc();
  payload.append(cmd, static_cast<std::size_t>(len));
  ::redisFreeCommand(cmd);
}

}  // namespace

void Client::ReaderDeleter::operator()(void* r) const { ::redisReaderFree(static_cast<redisReader*>(r)); }

Client::Client(config::RedisEndpoint endpoint) : m_endpoint(std::move(endpoint)) {}
Client::~Client() = default;
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;

void Client::disconnect() {
  m_transport.reset();
  m_reader.reset();
}

Result<void> Client::connect(Deadline deadline) {
  if (m_transport) return {};
  auto transport = open_transport(m_endpoint, deadline);
  if (!transport) return std::unexpected(transport.error());
  m_transport = std::move(*transport);
  m_reader.reset(::redisReaderCreate());
  if (!m_reader) throw std::bad_alloc();

  // AUTH and SELECT go out in one write, only when configured.
  std::string payload;
  std::size_t replies = 0;
  if (m_endpoint.password) {
    if (m_endpoint.user.empty()) {
      std::string_view argv[] = {"AUTH", *m_endpoint.password};
      append_command(payload, argv);
    } else {
      std::string_view argv[] = {"AUTH", m_endpoint.user, *m_endpoint.password};
      append_command(payload, argv);
    }
    ++replies;
  }
  std::string db = std::to_string(m_endpoint.db);
  if (m_endpoint.db != 0) {
    std::string_view argv[] = {"SELECT", db};
    append_command(payload, argv);
    ++replies;
  }
  if (replies == 0) return {};
  auto result = exchange(payload, replies, deadline);
  if (!result) return std::unexpected(result.error());
  for (std::size_t i = 0; i < result->size(); ++i) {
    const Reply& r = (*result)[i];
    if (r.is_error()) {
      disconnect();
      bool is_auth = m_endpoint.password && i == 0;
      // The reply text never contains the password; it is safe to show.
      return std::unexpected(Error{Error::Kind::auth, std::string(is_auth ? "authentication failed: " : "SELECT " + db + " failed: ") + r.str});
    }
  }
  return {};
}

Result<std::vector<Reply>> Client::exchange(const std::string& payload, std::size_t replies, Deadline deadline) {
  auto fail = [this](Error e) -> Result<std::vector<Reply>> {
    disconnect();  // a late reply would desynchronise the stream: start afresh next time
    return std::unexpected(std::move(e));
  };
  if (auto ok = m_transport->write_all(payload.data(), payload.size(), deadline); !ok) return fail(ok.error());
  auto* reader = static_cast<redisReader*>(m_reader.get());
  std::vector<Reply> out;
  out.reserve(replies);
  char buf[16384];
  while (out.size() < replies) {
    void* raw = nullptr;
    if (::redisReaderGetReply(reader, &raw) != REDIS_OK)
      return fail(Error{Error::Kind::protocol, std::string("bad reply from server: ") + reader->errstr});
    if (raw) {
      auto* reply = static_cast<redisReply*>(raw);
      out.push_back(convert(reply));
      ::freeReplyObject(reply);
      continue;
    }
    auto n = m_transport->read_some(buf, sizeof buf, deadline);
    if (!n) return fail(n.error());
    if (::redisReaderFeed(reader, buf, *n) != REDIS_OK)
      return fail(Error{Error::Kind::protocol, std::string("bad reply from server: ") + reader->errstr});
  }
  // A server that demands a password answers every command with NOAUTH: report it as such.
  for (const Reply& r : out) {
    if (r.error_is("NOAUTH") || r.error_is("WRONGPASS"))
      return fail(Error{Error::Kind::auth, "authentication required or refused: " + r.str});
  }
  return out;
}

Result<Reply> Client::command(std::span<const std::string_view> argv, Deadline deadline) {
  if (auto ok = connect(deadline); !ok) return std::unexpected(ok.error());
  std::string payload;
  append_command(payload, argv);
  auto replies = exchange(payload, 1, deadline);
  if (!replies) return std::unexpected(replies.error());
  return std::move(replies->front());
}

Result<std::vector<Reply>> Client::pipeline(std::span<const std::vector<std::string_view>> commands,
                                            Deadline deadline) {
  if (auto ok = connect(deadline); !ok) return std::unexpected(ok.error());
  std::string payload;
  for (const auto& c : commands) append_command(payload, c);
  return exchange(payload, commands.size(), deadline);
}

}  // namespace fencerun::redis
