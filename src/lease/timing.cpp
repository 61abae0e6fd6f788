#include "lease/timing.hpp"

#include "util/duration.hpp"

namespace fencerun::lease {

using util::format_duration;

std::expected<LeaseTiming, std::string> LeaseTiming::make(milliseconds ttl, std::optional<milliseconds> renew,
                                                           std::optional<milliseconds> grace) {
  if (ttl < k_min_ttl)
    return std::unexpected("--ttl: " + format_duration(ttl) + " is too short (at least " +
                           format_duration(k_min_ttl) + ")");
  LeaseTiming t;
  t.ttl = ttl;
  t.drift = drift_for(ttl);
  t.margin = margin_for(ttl);
  t.renew = renew.value_or(default_renew(ttl));
  t.grace = grace.value_or(default_grace(ttl));
  if (t.renew <= milliseconds::zero())
    return std::unexpected("--renew: must be positive, got " + format_duration(t.renew));
  if (t.renew >= ttl)
    return std::unexpected("--renew: " + format_duration(t.renew) + " must be smaller than --ttl " +
                           format_duration(ttl));
  if (t.grace < milliseconds::zero())
    return std::unexpected("--grace: must not be negative, got " + format_duration(t.grace));
  if (t.renew + t.grace + t.margin + t.drift >= ttl) {
    // Name the option at fault: the one the user set, or, with both set, the one past its safe bound
    // (renew <= ttl/3, grace <= ttl/6 always fit).
    bool blame_renew = renew && (!grace || t.renew > default_renew(ttl));
    std::string sum = "renew + grace + " + format_duration(t.margin) + " margin + " + format_duration(t.drift) +
                      " drift must stay below the ttl";
    if (blame_renew) {
      auto largest = ttl - t.grace - t.margin - t.drift - milliseconds(1);
      std::string hint = largest > milliseconds::zero()
                             ? " (with --grace " + format_duration(t.grace) + ", at most " + format_duration(largest) + ")"
                             : " (lower --grace first)";
      return std::unexpected("--renew: " + format_duration(t.renew) + " is too large for --ttl " +
                             format_duration(ttl) + ": " + sum + hint);
    }
    auto largest = ttl - t.renew - t.margin - t.drift - milliseconds(1);
    std::string hint = largest >= milliseconds::zero()
                           ? " (with --renew " + format_duration(t.renew) + ", at most " +
                                 format_duration(largest) + ")"
                           : " (lower --renew first)";
    return std::unexpected("--grace: " + format_duration(t.grace) + " is too large for --ttl " +
                           format_duration(ttl) + ": " + sum + hint);
  }
  return t;
}

}  // namespace fencerun::lease
