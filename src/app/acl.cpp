// `fencerun acl`: the least-privilege ACL rule for fencerun's keys and commands. Redis checks the
// commands a script runs as well, so those are listed too.
#include <cstdio>
#include <string>

#include "app/app.hpp"

namespace fencerun::app {
namespace {

// Glob characters in the prefix must match literally in the key pattern.
std::string glob_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::string acl_rule(const std::string& key_prefix, bool delex, bool delifeq, bool admin) {
  std::string p = glob_escape(key_prefix);
  std::string rule = "resetkeys ~" + p + "* resetchannels &" + p + "* -@all";
  // Sent by fencerun itself: scripts, the status query (+zcard), connection set-up, Sentinel/Cluster, WAIT.
  rule += " +evalsha +eval +get +pttl +select +role +asking +wait +subscribe +publish";
  // The probe on each new connection: which server it is, and whether it has DELIFEQ or DELEX.
  rule += " +hello +command|info";
  // `fencerun -r URL --version`: the PING that carries the probe.
  rule += " +ping";
  // Run inside the acquire, renew, release, leave and wake scripts (the wait queue included).
  rule += " +set +time +pexpire +del +exists +zadd +zrank +zcard +zrange +zrem +incr +zscore +zrangebyscore";
  // The record of runs (acquire and release scripts; status, list and history read it).
  rule += " +lpush +ltrim +lrange +lindex +lset +hset +hget +hdel +hgetall";
  // The native compare-and-delete of the release. A server refuses a rule naming a command it does
  // not have, so each is added only when asked for.
  if (delex) rule += " +delex";
  if (delifeq) rule += " +delifeq";
  // list walks the keys (SCAN, on every master of a Cluster: CLUSTER NODES); break and bump run scripts.
  if (admin) rule += " +scan +cluster|nodes";
  return rule;
}

int acl(const config::Config& c) {
  std::string rule = acl_rule(c.common.key_prefix, c.acl_delex, c.acl_delifeq, c.acl_admin) + "\n";
  std::fwrite(rule.data(), 1, rule.size(), stdout);
  return 0;
}

}  // namespace fencerun::app
