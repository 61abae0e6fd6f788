#include "lease/facts.hpp"

#include "lease/schedule.hpp"

namespace fencerun::lease {

std::vector<std::pair<std::string, std::string>> job_environment(const JobFacts& f) {
  std::vector<std::pair<std::string, std::string>> env = {
      {"FENCERUN_TOKEN", std::to_string(f.token)},     {"FENCERUN_LOCK", f.lock},
      {"FENCERUN_OWNER", f.owner},                     {"FENCERUN_TTL_MS", std::to_string(f.ttl_ms)},
      {f.url_variable, f.url},                         {"FENCERUN_SLOT", std::to_string(f.slot)},
      {"FENCERUN_LIMIT", std::to_string(f.limit)}};
  if (f.slot_start_us) {
    env.emplace_back("FENCERUN_SLOT_START", rfc3339_utc(*f.slot_start_us));
    env.emplace_back("FENCERUN_SLOT_START_UNIX", std::to_string(*f.slot_start_us / 1'000'000));
  }
  env.insert(env.end(), f.extra.begin(), f.extra.end());
  return env;
}

}  // namespace fencerun::lease
