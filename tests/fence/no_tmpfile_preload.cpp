// LD_PRELOAD library for the fence file tests: openat(2) with O_TMPFILE fails with EOPNOTSUPP, as on
// a filesystem without O_TMPFILE support (older NFS, FAT, some FUSE filesystems), so the tests can
// run the guard's named temp file fallback on any machine. Every other openat goes to the kernel.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>

namespace {

int forward(int dirfd, const char* path, int flags, va_list ap) {
  mode_t mode = 0;
  if ((flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE) mode = static_cast<mode_t>(va_arg(ap, int));
  if ((flags & O_TMPFILE) == O_TMPFILE) {
    errno = EOPNOTSUPP;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_openat, dirfd, path, flags, mode));
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  int fd = forward(dirfd, path, flags, ap);
  va_end(ap);
  return fd;
}

__attribute__((visibility("default"))) int openat64(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  int fd = forward(dirfd, path, flags, ap);
  va_end(ap);
  return fd;
}

// What a fortified (_FORTIFY_SOURCE) openat() without a mode argument calls.
__attribute__((visibility("default"))) int __openat_2(int dirfd, const char* path, int flags) {
  if ((flags & O_TMPFILE) == O_TMPFILE) {
    errno = EOPNOTSUPP;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_openat, dirfd, path, flags, 0));
}

}
