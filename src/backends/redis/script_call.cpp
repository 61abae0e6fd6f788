#include "backends/redis/script_call.hpp"

#include <algorithm>

namespace fencerun::lease::detail {

using redis::Reply;

redis::Error protocol_error(std::string what) { return redis::Error{redis::Error::Kind::protocol, std::move(what)}; }

redis::Result<std::vector<Reply>> run_script(redis::Client& client, const scripts::Source& script,
                                      std::span<const std::string_view> keys, std::span<const std::string_view> args,
                                      std::span<const std::vector<std::string_view>> followups, Deadline deadline,
                                      Deadline& sent, redis::Resend resend) {
  if (auto ok = client.connect(deadline); !ok) return std::unexpected(ok.error());
  std::string numkeys = std::to_string(keys.size());
  std::vector<std::vector<std::string_view>> commands(1 + followups.size());
  auto& argv = commands.front();
  argv.reserve(3 + keys.size() + args.size());
  argv.push_back("EVALSHA");
  argv.push_back(script.sha1);
  argv.push_back(numkeys);
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());
  std::copy(followups.begin(), followups.end(), commands.begin() + 1);
  sent = BootClock::now();
  auto replies = client.pipeline(commands, deadline, resend);
  if (replies && replies->front().error_is("NOSCRIPT")) {
    argv[0] = "EVAL";
    argv[1] = script.text;
    sent = BootClock::now();
    replies = client.pipeline(commands, deadline, resend);
  }
  // While a Cluster slot migrates, TRYAGAIN refuses a script whose declared keys are not all on the
  // node, and a key a script reads without declaring it (a counting lock's slots) fails it there: then
  // it wrote nothing (its reads of such keys come before its writes) and may be tried again.
  if (replies && replies->front().is_error() && replies->front().str.find("non local key") != std::string::npos)
    return std::unexpected(redis::Error{redis::Error::Kind::migrating, std::string(script.name) + " script refused: " + replies->front().str});
  if (replies && replies->front().error_is("TRYAGAIN"))
    return std::unexpected(redis::Error{redis::Error::Kind::migrating, std::string(script.name) + " script refused: " + replies->front().str});
  if (replies && replies->front().is_error())
    return std::unexpected(redis::Error{redis::Error::Kind::protocol, std::string(script.name) + " script failed: " + replies->front().str});
  return replies;
}

redis::Result<Reply> run_script(redis::Client& client, const scripts::Source& script, std::span<const std::string_view> keys,
                         std::span<const std::string_view> args, Deadline deadline, Deadline& sent,
                         redis::Resend resend) {
  auto replies = run_script(client, script, keys, args, {}, deadline, sent, resend);
  if (!replies) return std::unexpected(replies.error());
  return std::move(replies->front());
}

redis::Result<AcquireResult> acquire_with_ack(redis::Client& client, const scripts::Source& script,
                                       std::span<const std::string_view> keys, std::span<const std::string_view> args,
                                       const ReplicaAck& ack, Deadline deadline) {
  std::string replicas = std::to_string(ack.replicas);
  std::string wait_ms = std::to_string(ack.timeout.count());
  std::vector<std::vector<std::string_view>> followups;
  // WAIT goes out with the script: still one round trip. After a busy reply it returns at once.
  if (ack.replicas > 0) followups.push_back({"WAIT", replicas, wait_ms});
  Deadline sent{};
  // Only a WAIT may legitimately hold the reply back for longer than the request timeout.
  Deadline bound = ack.replicas > 0 ? deadline + ack.timeout : deadline;
  auto replies = run_script(client, script, keys, args, followups, bound, sent);
  if (!replies) return std::unexpected(replies.error());
  auto result = parse_acquire_reply(replies->front(), sent);
  if (!result) return std::unexpected(result.error());
  if (auto* acquired = std::get_if<Acquired>(&*result); acquired && ack.replicas > 0) {
    const Reply& w = (*replies)[1];
    if (w.is_error()) return std::unexpected(protocol_error("WAIT failed: " + w.str));
    acquired->replicas_acked = w.as_integer().value_or(0);
  }
  return result;
}

}  // namespace fencerun::lease::detail
