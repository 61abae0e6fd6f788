#pragma once
// The id of the etcd lease NAME's record of runs lives on. Header-only: the tests name it too.

#include <cstdint>
#include <string>
#include <string_view>

namespace fencerun::lease {

// `runs_key`: NAME's :runs key; `ttl_s`: the records' TTL in seconds. Chosen by fencerun, the same on
// every host and version (FNV-1a, 64 bits, of "KEY TTL"; positive, never 0), so that a grant applied
// after its request timed out is the lease the next run of NAME takes, not one left for the TTL.
inline std::int64_t etcd_records_lease_id(std::string_view runs_key, std::int64_t ttl_s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](std::string_view bytes) {
    for (unsigned char c : bytes) {
      h ^= c;
      h *= 0x100000001b3ULL;
    }
  };
  mix(runs_key);
  mix(" ");
  mix(std::to_string(ttl_s));
  const auto id = static_cast<std::int64_t>(h & 0x7fffffffffffffffULL);
  return id == 0 ? 1 : id;
}

}  // namespace fencerun::lease
