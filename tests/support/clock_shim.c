/* An LD_PRELOAD library that moves a process's wall clock by FENCERUN_TEST_CLOCK_OFFSET_US
 * microseconds (may be negative): gettimeofday, time and clock_gettime for CLOCK_REALTIME and
 * CLOCK_REALTIME_COARSE. Other clocks (MONOTONIC, BOOTTIME, ...) are left as they are.
 *
 * Used to run redis-server with a skewed clock (its TIME reads gettimeofday). libfaketime aborts
 * there: its lazy dlsym() allocates, jemalloc's initialisation reads the clock, and the two recurse.
 * This shim never calls dlsym or malloc: it reads the clocks with the raw system call, so it works
 * at any point of the process's life, before and during malloc's initialisation. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

static _Atomic int offset_state; /* 0: not read yet, 1: read */
static _Atomic long long offset_us;

/* Parsed by hand: no locale, no allocation, nothing that might read the clock. */
static long long parse_offset(const char *s) {
  long long sign = 1, value = 0;
  if (!s) return 0;
  if (*s == '-' || *s == '+') sign = *s++ == '-' ? -1 : 1;
  for (; *s >= '0' && *s <= '9'; ++s) value = value * 10 + (*s - '0');
  return *s == '\0' ? sign * value : 0;
}

static long long offset(void) {
  if (atomic_load_explicit(&offset_state, memory_order_acquire) == 0) {
    /* Two threads may both parse here; they store the same value. */
    atomic_store_explicit(&offset_us, parse_offset(getenv("FENCERUN_TEST_CLOCK_OFFSET_US")), memory_order_relaxed);
    atomic_store_explicit(&offset_state, 1, memory_order_release);
  }
  return atomic_load_explicit(&offset_us, memory_order_relaxed);
}

static int raw_clock_gettime(clockid_t id, struct timespec *ts) { return (int)syscall(SYS_clock_gettime, id, ts); }

static void shift(struct timespec *ts) {
  const long long off = offset();
  long long sec = (long long)ts->tv_sec + off / 1000000;
  long long nsec = (long long)ts->tv_nsec + (off % 1000000) * 1000;
  if (nsec < 0) {
    nsec += 1000000000;
    sec -= 1;
  } else if (nsec >= 1000000000) {
    nsec -= 1000000000;
    sec += 1;
  }
  ts->tv_sec = (time_t)sec;
  ts->tv_nsec = (long)nsec;
}

SHIM_EXPORT int clock_gettime(clockid_t id, struct timespec *ts) {
  const int rc = raw_clock_gettime(id, ts);
  if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
  return rc;
}

SHIM_EXPORT int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
  if (tz) {
    struct timezone *z = tz;
    z->tz_minuteswest = 0;
    z->tz_dsttime = 0;
  }
  struct timespec ts; /* tv is declared nonnull by glibc */
  const int rc = clock_gettime(CLOCK_REALTIME, &ts);
  if (rc == 0) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = (suseconds_t)(ts.tv_nsec / 1000);
  }
  return rc;
}

SHIM_EXPORT time_t time(time_t *tloc) {
  struct timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
  if (tloc) *tloc = ts.tv_sec;
  return ts.tv_sec;
}
