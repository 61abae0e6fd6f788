#include "config/config.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cstring>

#include "lease/backend.hpp"
#include "lease/lease.hpp"
#include "util/duration.hpp"
#include "util/error.hpp"

namespace fencerun::config {

using util::format_duration;
using util::parse_duration;
namespace {

milliseconds duration_option(std::string_view option, const std::string& text) {
  auto d = parse_duration(text);
  if (!d) throw UsageError(std::string(option) + ": " + d.error());
  return *d;
}

int exit_code_option(std::string_view option, int value) {
  if (value < 0 || value > 255)
    throw UsageError(std::string(option) + ": " + std::to_string(value) + " is not an exit code (0-255)");
  return value;
}

// --limit N: a whole number from 1 to 1024 (lease::k_max_limit), in decimal digits only.
long limit_option(const std::string& text) {
  const std::string_view digits = std::string_view(text).substr(text.starts_with('-') ? 1 : 0);
  const bool whole = !digits.empty() &&
                     std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  if (!whole) throw UsageError("--limit: '" + text + "' is not a whole number from 1 to 1024");
  long n = 0;  // saturates above the range: a long run of digits is out of range, not an overflow
  for (char ch : digits) n = std::min(n * 10 + (ch - '0'), lease::k_max_limit + 1);
  if (text.starts_with('-') || n < 1 || n > lease::k_max_limit)
    throw UsageError("--limit: " + text + " is not from 1 to 1024");
  return n;
}

// --keep-runs N, history -n N: a whole number from 1 to 1000 (lease::k_max_keep_runs).
long count_option(std::string_view option, const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 4 &&
                      std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  const long n = digits ? std::stol(text) : 0;
  if (!digits || n < 1 || n > lease::k_max_keep_runs)
    throw UsageError(std::string(option) + ": '" + text + "' is not a whole number from 1 to " +
                     std::to_string(lease::k_max_keep_runs));
  return n;
}

// break --owner PREFIX: the start of an owner id (32 hex digits), long enough to name one holder.
std::string owner_prefix_option(const std::string& text) {
  constexpr std::size_t k_min = 8, k_max = 32;
  const bool hex = std::all_of(text.begin(), text.end(), [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)); });
  if (!hex || text.empty() || text.size() > k_max)
    throw UsageError("--owner: '" + text + "' is not the start of an owner id (hex digits, as status shows)");
  if (text.size() < k_min)
    throw UsageError("--owner: '" + text + "' is too short to name one holder: give at least 8 hex digits");
  std::string lower = text;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return lower;
}

// bump --above N: a positive decimal integer that some token could still exceed: every token is below
// 2^53 (so the largest is 2^53 - 1), and the next one must be greater than N, so N is at most 2^53 - 2.
// A larger N would leave the lock unable to issue any token (every run 69) until its counter was
// deleted by hand.
std::uint64_t token_option(std::string_view option, const std::string& text) {
  constexpr std::uint64_t k_largest = (std::uint64_t{1} << 53) - 2;
  const bool digits = !text.empty() && text.size() <= 16 &&
                      std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  const std::uint64_t n = digits ? std::stoull(text) : 0;
  if (!digits || n == 0 || n >= (std::uint64_t{1} << 53))
    throw UsageError(std::string(option) + ": '" + text + "' is not a positive integer below 2^53");
  if (n > k_largest)
    throw UsageError(std::string(option) + ": " + text + " leaves no token to issue: tokens stay below 2^53, so the " +
                     "next one can exceed at most " + std::to_string(k_largest));
  return n;
}

}  // namespace


std::expected<void, std::string> validate_lock_name(std::string_view name) {
  if (name.empty()) return std::unexpected("lock NAME is empty");
  if (name.size() > 256)
    return std::unexpected("lock NAME is " + std::to_string(name.size()) + " bytes long (at most 256)");
  for (unsigned char c : name) {
    if (c <= 0x20 || c >= 0x7f)
      return std::unexpected("lock NAME may hold only printable ASCII without spaces");
    if (c == '{' || c == '}')
      return std::unexpected("lock NAME may not contain '{' or '}' (reserved for the Redis Cluster hash tag)");
  }
  return {};
}

CommonConfig make_common_config(const Options& o, const GetEnv& getenv) {
  CommonConfig c;
  // Where the locks live: -r/--server (once, or a quorum's servers), else $FENCERUN_SERVER, else
  // $FENCERUN_REDIS_URL (what a run gives its job), else $REDIS_URL, else a local Redis. The
  // backend is the registry's choice, by the URLs' scheme and number (backends/registry.cpp).
  lease::ConnectRequest request;
  request.getenv = getenv;
  request.urls = o.redis_urls;
  request.source = o.server_option;
  auto from_env = [&](const char* name) {
    if (!request.urls.empty()) return;
    auto v = getenv(name);
    if (!v || v->empty()) return;
    // A quorum-mode run gives its command every server's URL, separated by spaces.
    if (v->find(' ') != std::string::npos)
      throw UsageError("$" + std::string(name) +
                       " names several servers (set by a quorum-mode fencerun); give the server to use with -r URL");
    request.urls = {*v};
    request.source = "$" + std::string(name);
  };
  from_env("FENCERUN_SERVER");
  from_env("FENCERUN_REDIS_URL");
  from_env("REDIS_URL");
  if (request.urls.empty()) request.urls = {"redis://127.0.0.1:6379"}, request.source = "the default";
  if (!o.tls_key.empty() && o.tls_cert.empty()) throw UsageError("--tls-key: needs --tls-cert as well");
  request.tls = {o.tls_ca_file, o.tls_cert, o.tls_key, o.tls_server_name, o.tls_insecure};
  request.tls_options = !o.tls_ca_file.empty() || !o.tls_cert.empty() || !o.tls_key.empty() ||
                        !o.tls_server_name.empty() || o.tls_insecure;
  c.target = lease::configure_target(request);
  c.url_source = request.source;

  c.timeout = duration_option("--timeout", o.timeout);
  if (c.timeout <= milliseconds::zero())
    throw UsageError("--timeout: must be positive, got " + o.timeout);
  if (o.key_prefix.find_first_of("{}") != std::string::npos)
    throw UsageError("--key-prefix: may not contain '{' or '}' (reserved for the Redis Cluster hash tag)");
  c.key_prefix = o.key_prefix;
  c.log_level = o.verbosity >= 2   ? LogLevel::debug
                : o.verbosity == 1 ? LogLevel::info
                : o.verbosity == 0 ? LogLevel::warn
                                   : LogLevel::error;
  if (o.log_format == "text") c.log_format = LogFormat::text;
  else if (o.log_format == "json") c.log_format = LogFormat::json;
  else throw UsageError("--log-format: '" + o.log_format + "' is not one of text, json");
  return c;
}

Config make_config(const Options& o, const GetEnv& getenv, const ParseSignal& parse_signal) {
  Config c;
  c.subcommand = o.subcommand;
  c.json = o.json;

  // The TLS files named: a typo is reported now, naming the option, not as an unavailable server later
  // (before the URL is judged, and again for files a nested command inherited).
  if (!o.tls_key.empty() && o.tls_cert.empty()) throw UsageError("--tls-key: needs --tls-cert as well");
  util::check_tls_files({o.tls_ca_file, o.tls_cert, o.tls_key, {}, false});
  c.common = make_common_config(o, getenv);
  const lease::Target& target = *c.common.target;
  target.check_files();
  // What the backend cannot do is refused from its declared capabilities (backends/registry.cpp).
  auto require = [&](bool asked, lease::Capability capability) {
    if (asked && !lease::info_of(target).capabilities.has(capability))
      throw UsageError(lease::refusal(target, capability));
  };
  require(o.subcommand == Subcommand::bump, lease::Capability::bump);
  require(o.subcommand == Subcommand::break_lock, lease::Capability::break_lock);
  require(o.subcommand == Subcommand::acl, lease::Capability::acl);
  c.acl_delex = o.acl_delex;
  c.acl_delifeq = o.acl_delifeq;
  c.acl_admin = o.acl_admin;
  if (o.subcommand == Subcommand::version || o.subcommand == Subcommand::help || o.subcommand == Subcommand::acl ||
      o.subcommand == Subcommand::fence)
    return c;
  if (o.subcommand == Subcommand::list) {
    c.json = o.json;
    c.list_all = o.list_all;
    if (o.list_pattern) {
      // A glob of names: what a NAME may hold, plus the glob characters (which names may hold too).
      if (auto ok = validate_lock_name(*o.list_pattern); !ok) {
        std::string message = ok.error();  // "lock NAME ...": the same rule, said of PATTERN
        message.replace(0, std::string_view("lock NAME").size(), "PATTERN");
        throw UsageError("list: " + message);
      }
      c.list_pattern = *o.list_pattern;
    }
    return c;
  }

  if (o.lock_name.empty()) throw UsageError("missing lock NAME");
  if (auto ok = validate_lock_name(o.lock_name); !ok) throw UsageError(ok.error());
  c.run.lock = o.lock_name;
  if (o.subcommand == Subcommand::status) {
    if (!o.command.empty()) throw UsageError("status takes no COMMAND");
    return c;
  }
  if (o.subcommand == Subcommand::break_lock) {
    c.yes = o.yes;
    if (o.break_owner) c.break_owner = owner_prefix_option(*o.break_owner);
    return c;
  }
  if (o.subcommand == Subcommand::history) {
    if (o.history_count) c.history_count = count_option("-n", *o.history_count);
    c.history_utc = o.utc;
    c.history_all = o.list_all;
    return c;
  }
  if (o.subcommand == Subcommand::bump) {
    if (!o.bump_above) throw UsageError("bump: missing --above N");
    c.bump_above = token_option("--above", *o.bump_above);
    return c;
  }

  std::optional<milliseconds> renew, grace;
  if (o.renew) renew = duration_option("--renew", *o.renew);
  if (o.grace) grace = duration_option("--grace", *o.grace);
  auto timing = LeaseTiming::make(duration_option("--ttl", o.ttl), renew, grace);
  if (!timing) throw UsageError(timing.error());
  c.run.timing = *timing;

  auto sig = parse_signal(o.kill_signal);
  if (!sig) throw UsageError("--kill-signal: '" + o.kill_signal + "' is not a signal name or number");
  c.run.kill_signal = *sig;

  if (o.wait == "inf" || o.wait == "infinity" || o.wait == "forever") {
    c.run.wait = std::nullopt;
  } else {
    auto w = duration_option("--wait", o.wait);
    if (w < milliseconds::zero()) throw UsageError("--wait: must not be negative, got " + o.wait);
    c.run.wait = w;
  }
  c.run.fair = o.fair;
  c.run.limit = limit_option(o.limit);
  if (o.metrics_file) {
    if (o.metrics_file->empty()) throw UsageError("--metrics-file: empty path");
    c.metrics_file = o.metrics_file;
  }
  c.run.conflict_exit_code = exit_code_option("--conflict-exit-code", o.conflict_exit_code);
  c.run.lease_lost_exit_code = exit_code_option("--lease-lost-exit-code", o.lease_lost_exit_code);
  c.run.skip_exit_code = exit_code_option("--skip-exit-code", o.skip_exit_code);
  if (o.records_ttl) {
    c.run.records.ttl = duration_option("--records-ttl", *o.records_ttl);
    if (c.run.records.ttl <= milliseconds::zero())
      throw UsageError("--records-ttl: must be positive, got " + *o.records_ttl);
  }
  if (o.keep_runs) c.run.records.keep = count_option("--keep-runs", *o.keep_runs);
  if (o.min_interval) {
    const milliseconds m = duration_option("--min-interval", *o.min_interval);
    if (m <= milliseconds::zero()) throw UsageError("--min-interval: must be positive, got " + *o.min_interval);
    if (m > c.run.records.ttl)
      throw UsageError("--min-interval: " + format_duration(m) + " is longer than the records' TTL " +
                       format_duration(c.run.records.ttl) + " (--records-ttl): the last success would be forgotten first");
    c.run.min_interval = m;
  }
  if (o.slot_offset && !o.every) throw UsageError("--slot-offset: only with --every");
  if (o.every) {
    if (o.min_interval) throw UsageError("--every and --min-interval: give one rule, not both");
    const milliseconds p = duration_option("--every", *o.every);
    if (p <= milliseconds::zero()) throw UsageError("--every: must be positive, got " + *o.every);
    if (p > c.run.records.ttl)
      throw UsageError("--every: " + format_duration(p) + " is longer than the records' TTL " +
                       format_duration(c.run.records.ttl) + " (--records-ttl): the slot's success would be forgotten first");
    milliseconds offset{0};
    if (o.slot_offset) {
      offset = duration_option("--slot-offset", *o.slot_offset);
      if (offset < milliseconds::zero() || offset >= p)
        throw UsageError("--slot-offset: must be at least 0 and less than --every " + format_duration(p) + ", got " +
                         *o.slot_offset);
    }
    if (c.run.limit > 1) throw UsageError("--every: not with --limit N (a counting lock)");
    c.run.every = lease::Every{p, offset};
  }
  if (o.if_record_lost) {
    if (*o.if_record_lost == "skip") c.run.skip_if_record_lost = true;
    else if (*o.if_record_lost != "run")
      throw UsageError("--if-record-lost: 'run' or 'skip', got '" + *o.if_record_lost + "'");
    if (!o.every && !o.min_interval) throw UsageError("--if-record-lost: only with --every or --min-interval");
  }
  if (c.run.skip_exit_code == c.run.conflict_exit_code && (o.every || o.min_interval))
    throw UsageError("--skip-exit-code " + std::to_string(c.run.skip_exit_code) +
                     " is the busy code (--conflict-exit-code): a skipped trigger could not be told from a busy one");
  if (o.lock_delay) {
    const milliseconds d = duration_option("--lock-delay", *o.lock_delay);
    if (d < milliseconds::zero()) throw UsageError("--lock-delay: must not be negative, got " + *o.lock_delay);
    c.run.lock_delay = d;
  }
  if (o.min_replicas < 0) throw UsageError("--min-replicas: must not be negative");
  c.run.min_replicas = o.min_replicas;
  c.run.replica_timeout = duration_option("--replica-timeout", o.replica_timeout);
  if (c.run.replica_timeout <= milliseconds::zero())
    throw UsageError("--replica-timeout: must be positive, got " + o.replica_timeout);
  target.check_run({c.run.timing.ttl, o.ttl});
  require(c.run.limit > 1, lease::Capability::limit);
  require(c.run.fair, lease::Capability::fair);
  require(c.run.min_replicas > 0, lease::Capability::min_replicas);
  require(c.run.min_interval.has_value(), lease::Capability::min_interval);
  require(c.run.lock_delay.has_value(), lease::Capability::lock_delay);
  require(c.run.every.has_value(), lease::Capability::every);
  require(c.run.skip_if_record_lost, lease::Capability::if_record_lost);
  if (c.run.min_replicas > 0 && c.run.replica_timeout * 2 >= c.run.timing.ttl)
    throw UsageError("--replica-timeout: " + format_duration(c.run.replica_timeout) +
                     " must be shorter than half of --ttl " + format_duration(c.run.timing.ttl));

  if (o.command.empty()) throw UsageError("missing COMMAND (usage: fencerun [OPTIONS] NAME [--] COMMAND [ARG...])");
  if (o.shell) {
    if (o.command.size() != 1)
      throw UsageError("--shell takes exactly one COMMAND string (quote it), got " +
                       std::to_string(o.command.size()) + " words");
    c.run.command = {"/bin/sh", "-c", o.command.front()};
  } else {
    c.run.command = o.command;
  }
  if (c.run.command.front().empty()) throw UsageError("COMMAND is empty");
  return c;
}

}  // namespace fencerun::config
