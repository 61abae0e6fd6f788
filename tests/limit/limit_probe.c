/* The command of the --limit tests' contenders: records, on CLOCK_MONOTONIC (the clock of the test's
 * std::chrono::steady_clock), when it entered and when it left, with the slot and token fencerun
 * gave it.
 *
 *   limit_probe log FILE MIN_MS MAX_MS   append "enter NS SLOT TOKEN PID", hold for a random time
 *                                        from MIN_MS to MAX_MS, append "exit NS SLOT TOKEN PID"
 *   limit_probe now                      print the clock in nanoseconds
 *
 * Each line is one write(2) to FILE opened with O_APPEND, so that lines of concurrent holders never
 * interleave. SLOT and TOKEN are FENCERUN_SLOT and FENCERUN_TOKEN as given ("unset" when missing). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static const char* env_or_unset(const char* name) {
  const char* v = getenv(name);
  return v && *v ? v : "unset";
}

static int append_line(const char* path, const char* what, const char* slot, const char* token) {
  char line[256];
  const int n = snprintf(line, sizeof line, "%s %lld %s %s %ld\n", what, now_ns(), slot, token, (long)getpid());
  if (n <= 0 || n >= (int)sizeof line) return -1;
  const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  const ssize_t w = write(fd, line, (size_t)n);
  const int saved = errno;
  close(fd);
  errno = saved;
  return w == n ? 0 : -1;
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "now") == 0) {
    printf("%lld\n", now_ns());
    return 0;
  }
  if (argc != 5 || strcmp(argv[1], "log") != 0) {
    fprintf(stderr, "usage: limit_probe log FILE MIN_MS MAX_MS | limit_probe now\n");
    return 2;
  }
  const char* path = argv[2];
  const long lo = strtol(argv[3], NULL, 10);
  const long hi = strtol(argv[4], NULL, 10);
  if (lo < 0 || hi < lo) return 2;
  const char* slot = env_or_unset("FENCERUN_SLOT");
  const char* token = env_or_unset("FENCERUN_TOKEN");
  if (append_line(path, "enter", slot, token) != 0) {
    perror("limit_probe: enter");
    return 1;
  }
  srandom((unsigned)(now_ns() ^ ((long long)getpid() << 16)));
  const long ms = lo + (hi > lo ? random() % (hi - lo + 1) : 0);
  struct timespec hold = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&hold, &hold) != 0 && errno == EINTR) {
  }
  if (append_line(path, "exit", slot, token) != 0) {
    perror("limit_probe: exit");
    return 1;
  }
  return 0;
}
