// parse -> configure -> run -> exit code. The one place that catches errors and picks the status for
// them (util/error.hpp).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "app/app.hpp"
#include "cli/parse.hpp"
#include "config/config.hpp"
#include "fence/fence.hpp"
#include "log/log.hpp"
#include "lease/backend.hpp"
#include "supervisor/exit_status.hpp"
#include "supervisor/signals.hpp"
#include "util/error.hpp"
#include "version.hpp"

namespace {

std::optional<std::string> get_env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

fencerun::log::Level to_log_level(fencerun::config::LogLevel l) {
  using L = fencerun::config::LogLevel;
  switch (l) {
    case L::debug: return fencerun::log::Level::debug;
    case L::info: return fencerun::log::Level::info;
    case L::warn: return fencerun::log::Level::warn;
    case L::error: return fencerun::log::Level::error;
  }
  return fencerun::log::Level::warn;
}

// Started with fd 0, 1 or 2 closed (cron, daemons, `<&- >&-`): give each closed one /dev/null.
void reopen_closed_stdio() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int opened = ::open("/dev/null", O_RDWR);
    if (opened >= 0 && opened != fd) {
      ::dup2(opened, fd);
      ::close(opened);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fencerun;
  // Before anything opens a descriptor: a closed 0, 1 or 2 would otherwise be taken by the Redis socket
  // or a pipe, and a log line or the child's output would land in it.
  reopen_closed_stdio();
  supervisor::reset_inherited_dispositions();
  try {
    auto options = cli::parse(argc, argv);
    if (options.subcommand == config::Subcommand::fence) return fence::run(options, get_env);
    if (options.subcommand == config::Subcommand::help) {
      std::fputs(options.help_text.c_str(), stdout);
      return 0;
    }
    if (options.subcommand == config::Subcommand::version) {
      // The libraries and the features come from the table of backends (backends/registry.cpp).
      std::printf("fencerun %s\n%sfeatures: %s\n", FENCERUN_VERSION, lease::library_versions().c_str(),
                  lease::features_line().c_str());
      if (options.redis_urls.empty()) return 0;
      std::fflush(stdout);
      return app::server_version(config::make_config(options, get_env, supervisor::parse_signal));
    }
    auto config = config::make_config(options, get_env, supervisor::parse_signal);
    log::init(to_log_level(config.common.log_level),
              config.common.log_format == config::LogFormat::json ? log::Format::json : log::Format::text);
    if (config.common.target->tls_insecure())
      log::event(log::Level::warn, "tls_insecure", "TLS certificate verification is disabled (--tls-insecure)");
    // $REDIS_URL is often an application's own setting: say which source chose the server.
    log::event(config.common.url_source == "$REDIS_URL" ? log::Level::info : log::Level::debug, "server_url",
               "using " + std::string(config.common.server_kind()) + " at " + config.common.redacted_url() + " (from " +
                   config.common.url_source + ")",
               {{"source", config.common.url_source}, {"backend", std::string(config.common.target->backend())}});
    if (config.subcommand == config::Subcommand::status) return app::status(config);
    if (config.subcommand == config::Subcommand::acl) return app::acl(config);
    if (config.subcommand == config::Subcommand::list) return app::list(config);
    if (config.subcommand == config::Subcommand::break_lock) return app::break_lock(config);
    if (config.subcommand == config::Subcommand::bump) return app::bump(config);
    if (config.subcommand == config::Subcommand::history) return app::history(config);
    app::Exit exit = app::run(config);
    if (exit.signal) supervisor::die_by_signal(exit.signal);  // returns only if that signal is ignored
    return exit.code;
  } catch (const Error& e) {
    // The one place errors are reported; the kind picks the exit code (util/error.hpp).
    std::string_view message = e.what();
    if (e.kind() == ErrorKind::usage)
      std::fprintf(stderr, "fencerun: %s%s\n", e.what(),
                   message.find("--help") == std::string_view::npos ? " (see fencerun --help)" : "");
    else if (e.kind() == ErrorKind::internal)
      std::fprintf(stderr, "fencerun: internal error: %s\n", e.what());
    else
      std::fprintf(stderr, "fencerun: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {  // a library's own (std::bad_alloc, ...): fencerun's failure
    std::fprintf(stderr, "fencerun: internal error: %s\n", e.what());
    return exit_code::k_internal;
  }
}
