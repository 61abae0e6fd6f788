// `fencerun list`, `fencerun break`, `fencerun bump`: operating locks without writing the server's
// commands by hand, through the backend (lease/backend.hpp). list walks the locks (the backend prints them);
// break releases a holder's lease owner-checked, as its own release would, and wakes the waiters;
// bump raises a token counter that went backwards.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "app/app.hpp"
#include "app/backend.hpp"
#include "lease/lock_view.hpp"
#include "log/log.hpp"
#include "util/error.hpp"
#include "util/exit_code.hpp"

namespace fencerun::app {
namespace {

void print(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// The backend's own event for a server it cannot use: redis_unavailable, etcd_unavailable.
int unavailable(const config::Config& c, const lease::Error& e, const std::string& lock) {
  log::event(log::Level::error, std::string(c.common.target->unavailable_event()),
             "cannot use " + std::string(c.common.server_kind()) + " at " + c.common.redacted_url() + ": " + e.message,
             {{"lock", lock}, {"kind", lease::to_string(e.kind)}});
  return exit_code::k_unavailable;
}

std::string owner8(const lease::Holder& h) { return h.owner.substr(0, 8); }

// Asks on the terminal whether to go on; false unless the answer starts with y.
bool confirmed(const std::string& question) {
  std::fprintf(stderr, "%s [y/N] ", question.c_str());
  std::fflush(stderr);
  char line[64] = {};
  if (!std::fgets(line, sizeof line, stdin)) return false;
  return line[0] == 'y' || line[0] == 'Y';
}

}  // namespace

int list(const config::Config& c) {
  const int rc = backend_for(c.common)->list({c.list_pattern, c.list_all, c.json});
  // Most cron locks are free most of the time: say where they are (on stderr, the output stays empty).
  if (rc == exit_code::k_status_free && !c.list_all && !c.json && ::isatty(2) == 1)
    std::fputs("fencerun: no lock is held; `fencerun list --all` also lists free locks and their last runs\n", stderr);
  return rc;
}

int break_lock(const config::Config& c) {
  if (!c.yes && ::isatty(0) != 1) {
    std::fputs("fencerun: break: --yes is required when stdin is not a terminal (see fencerun --help)\n", stderr);
    return exit_code::k_usage;
  }
  auto backend = backend_for(c.common);
  lease::LockAdmin* admin = backend->admin();  // the configuration refused break where there is none
  if (!admin) throw Error(ErrorKind::internal, "break: the backend has no lock admin");
  auto s = admin->holders(c.run.lock);
  if (!s) return unavailable(c, s.error(), c.run.lock);
  std::vector<lease::SlotHolder> targets;
  for (const auto& h : s->holders)
    if (!c.break_owner || h.holder.owner.starts_with(*c.break_owner)) targets.push_back(h);
  if (targets.empty()) {
    std::fprintf(stderr, "fencerun: %s: %s\n", c.run.lock.c_str(),
                 s->holders.empty() ? "nothing held"
                                    : ("no holder's owner id starts with " + *c.break_owner).c_str());
    return exit_code::k_status_free;
  }
  if (!c.yes) {
    std::string question = "break " + c.run.lock + ", held by";
    for (const auto& t : targets)
      question += (s->limit > 1 ? " [slot " + std::to_string(t.slot) + "] " : " ") + lease::holder_text(t);
    question += "?";
    if (!confirmed(question)) {
      std::fputs("fencerun: not broken\n", stderr);
      return 1;
    }
  }
  bool broke = false;
  for (const auto& t : targets) {
    auto released = admin->break_holder(c.run.lock, s->limit, t.holder.owner);
    if (!released) return unavailable(c, released.error(), c.run.lock);
    const std::string what = c.run.lock + (s->limit > 1 ? " slot " + std::to_string(t.slot) : std::string()) + ": ";
    if (*released) {
      broke = true;
      log::event(log::Level::info, "broken", "broke the lease of " + lease::holder_text(t),
                 {{"lock", c.run.lock}, {"owner", owner8(t.holder)}});
      print("broke " + what + lease::holder_text(t) + "\n");
    } else {
      std::fprintf(stderr, "fencerun: %sthe holder (owner %s) let go before it could be broken\n", what.c_str(),
                   owner8(t.holder).c_str());
    }
  }
  return broke ? 0 : exit_code::k_status_free;
}

int bump(const config::Config& c) {
  auto backend = backend_for(c.common);
  lease::TokenCounter* counter = backend->counter();  // the configuration refused bump where there is none
  if (!counter) throw Error(ErrorKind::internal, "bump: the backend has no token counter");
  auto b = counter->bump(c.run.lock, c.bump_above);
  if (!b) return unavailable(c, b.error(), c.run.lock);
  const std::string before = b->before ? std::to_string(*b->before) : std::string("none");
  if (b->before && *b->before >= c.bump_above)
    print(c.run.lock + ": token counter is " + before + ", already at least " + std::to_string(c.bump_above) +
          ": unchanged\n");
  else
    print(c.run.lock + ": token counter raised from " + before + " to " + std::to_string(b->after) +
          ": the next token is greater than " + std::to_string(c.bump_above) + "\n");
  return 0;
}

}  // namespace fencerun::app
