#pragma once
// The job's environment contract, written once for every backend: what the command is told of its
// lease (README, "What the command gets"; fencerun(1), ENVIRONMENT).
//
//   FENCERUN_TOKEN    the fencing token, decimal
//   FENCERUN_LOCK     NAME
//   FENCERUN_OWNER    this lease's owner id
//   FENCERUN_TTL_MS   the lease's TTL in milliseconds
//   FENCERUN_SLOT     the slot held (0 for the plain lock)
//   FENCERUN_LIMIT    the lock's holders at once (1 for the plain lock)
//   the server        FENCERUN_REDIS_URL (Redis, a quorum: every URL, separated by spaces) or
//                     FENCERUN_ETCD_URL (etcd), without any password
//   FENCERUN_SLOT_START, FENCERUN_SLOT_START_UNIX
//                     --every: the start of the slot the trigger fired in (RFC 3339, UTC; seconds)
//   and what the backend adds (FENCERUN_SERVERS, FENCERUN_ETCD_LEASE).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fencerun::lease {

struct JobFacts {
  std::uint64_t token = 0;
  std::string lock;
  std::string owner;
  long long ttl_ms = 0;
  long slot = 0;
  long limit = 1;
  std::string url_variable;  // FENCERUN_REDIS_URL, FENCERUN_ETCD_URL
  std::string url;           // redacted
  std::vector<std::pair<std::string, std::string>> extra;  // the backend's own, after the others
  std::optional<std::uint64_t> slot_start_us;              // --every: the trigger's slot's start
};

std::vector<std::pair<std::string, std::string>> job_environment(const JobFacts& facts);

}  // namespace fencerun::lease
