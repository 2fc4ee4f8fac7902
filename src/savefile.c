/*
 * savefile.c -- replacing a user's file without ever losing it (savefile.h): a temporary file next
 * to the target, fsync, rename.
 *
 * In: a path from the user. Out: the file replaced whole, or left as it was with an error.
 * Invariants: nothing but the temporary file is written before the rename; a temporary file is
 * removed on every failure; a save killed before its rename leaves "<target>.tmp.<pid>.<n>" (the
 * target's name cut to 223 bytes where it is longer), which
 * the next save to that target removes once process <pid> is gone.
 */
#include "savefile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


const char *file_kind(unsigned mode) {
  mode_t m = (mode_t)mode;
  return S_ISREG(m)    ? "a regular file"
         : S_ISDIR(m)  ? "a directory"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
         : S_ISLNK(m)  ? "a symbolic link"
                       : "of an unknown kind";
}

bool fd_write_all(int fd, const void *buf, size_t n) {
  const unsigned char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) { /* (a write of nothing would loop forever) */
      if (w == 0) errno = EIO;
      return false;
    }
    p += w;
    n -= (size_t)w;
  }
  return true;
}

unsigned char *file_read_regular(const char *path, size_t max, size_t *len) {
  /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is then refused as not regular */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return NULL;
  struct stat st;
  unsigned char *buf = NULL;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size <= max) {
    size_t n = (size_t)st.st_size, got = 0;
    buf = malloc(n ? n : 1);
    while (buf && got < n) {
      ssize_t r = read(fd, buf + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += (size_t)r;
    }
    if (buf && got != n) {
      free(buf);
      buf = NULL;
    }
    if (buf) *len = n;
  }
  close(fd);
  return buf;
}

int file_create_new(const char *path, unsigned mode) {
  return open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
}

/* "<digits>" of at most 19 characters: its value; else -1. */
static long long parse_decimal(const char *s, size_t n) {
  if (n == 0 || n > 18) return -1;
  long long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

/* How much of a target's file name its temporary files' names begin with: all of it, unless the
 * name and the ".tmp.<pid>.<n>" after it would pass NAME_MAX (255 bytes on Linux file systems). */
static size_t temp_base_len(const char *base) {
  size_t blen = strlen(base);
  return blen > 255 - 32 ? 255 - 32 : blen;
}

/* Removes the temporary files that saves to `target` by processes now gone left behind: regular
 * files named "<base>.tmp.<pid>.<n>" next to it whose pid no longer exists (kill(pid, 0) says
 * ESRCH). A live process's file -- a save in progress, in this process or another -- is never
 * touched, nor is anything else in the directory. Best effort: errors are ignored. */
static void remove_stale_temps(const char *fn, const char *target) {
  const char *slash = strrchr(target, '/');
  const char *base = slash ? slash + 1 : target;
  size_t blen = temp_base_len(base);
  char *dir = slash ? tg_xstrdup(target) : tg_xstrdup(".");
  if (slash) dir[slash == target ? 1 : (size_t)(slash - target)] = '\0';
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  if (dfd < 0) return;
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  long self = (long)getpid();
  for (struct dirent *e; (e = readdir(d));) {
    const char *nm = e->d_name;
    if (strncmp(nm, base, blen) != 0 || strncmp(nm + blen, ".tmp.", 5) != 0) continue;
    const char *p = nm + blen + 5, *dot = strchr(p, '.');
    if (!dot) continue;
    long long pid = parse_decimal(p, (size_t)(dot - p)), n = parse_decimal(dot + 1, strlen(dot + 1));
    if (pid <= 0 || n < 0 || pid > 0x7fffffff || pid == self) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to ask): keep */
    struct stat st;
    if (fstatat(dirfd(d), nm, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (unlinkat(dirfd(d), nm, 0) == 0 && debug_level() >= 1)
      fprintf(stderr, "%s: removed %s, left by a save of process %lld that no longer exists\n", fn, nm, pid);
  }
  closedir(d);
}

/* The file that saving to `path` writes (malloc'd): path itself, or where its chain of symbolic links
 * ends, so that the links stay links and their target is replaced. A link to a missing file gives
 * that file's path (it is created). *exists says whether the file is there, *mode is its st_mode.
 * NULL with an error if the chain cannot be followed. */
static char *save_target(const char *fn, const char *path, bool *exists, mode_t *mode) {
  char *cur = tg_xstrdup(path);
  for (int depth = 0;; depth++) {
    struct stat st;
    if (lstat(cur, &st) != 0) {
      if (errno == ENOENT) {
        *exists = false;
        return cur;
      }
      tg_set_error(TG_ERR_IO, "%s: %s: cannot stat %s: %s", fn, path, cur, strerror(errno));
      free(cur);
      return NULL;
    }
    if (!S_ISLNK(st.st_mode)) {
      *exists = true;
      *mode = st.st_mode;
      if (depth == 0) return cur;
      /* the link's target, canonical (the temporary file is created next to it) */
      char *real = realpath(cur, NULL);
      if (!real) {
        tg_set_error(TG_ERR_IO, "%s: %s: cannot resolve the symbolic link's target %s: %s", fn, path, cur,
                     strerror(errno));
        free(cur);
        return NULL;
      }
      free(cur);
      return real;
    }
    if (depth == 40) {
      tg_set_error(TG_ERR_IO, "%s: %s: too many levels of symbolic links", fn, path);
      free(cur);
      return NULL;
    }
    /* one more link: read it (its size may be 0 for some file systems: grow until it fits) */
    size_t cap = st.st_size > 0 ? (size_t)st.st_size + 1 : 256;
    char *to = NULL;
    ssize_t r;
    for (;;) {
      to = tg_xrealloc(to, cap);
      r = readlink(cur, to, cap);
      if (r < 0 || (size_t)r < cap) break;
      cap *= 2;
    }
    if (r < 0) {
      tg_set_error(TG_ERR_IO, "%s: %s: cannot read the symbolic link %s: %s", fn, path, cur, strerror(errno));
      free(to);
      free(cur);
      return NULL;
    }
    to[r] = 0;
    if (to[0] != '/') { /* relative to the link's directory */
      char *slash = strrchr(cur, '/');
      size_t dl = slash ? (size_t)(slash - cur) + 1 : 0;
      char *joined = tg_xmalloc(dl + (size_t)r + 1);
      memcpy(joined, cur, dl);
      memcpy(joined + dl, to, (size_t)r + 1);
      free(to);
      to = joined;
    }
    free(cur);
    cur = to;
  }
}


tg_status savefile_open(SaveFile *f, const char *fn, const char *path) {
  memset(f, 0, sizeof *f);
  f->fn = fn, f->path = path, f->fd = -1;
  bool exists = false;
  mode_t mode = 0;
  char *target = save_target(fn, path, &exists, &mode);
  if (!target) return tg_last_status();
  /* only a regular file is ever replaced: renaming over a FIFO, a device or a socket would replace
   * the node itself, and opening one to write could block or write to the device */
  if (exists && !S_ISREG(mode)) {
    tg_status st;
    if (strcmp(target, path) == 0)
      st = tg_set_error(TG_ERR_IO, "%s: %s is not a regular file (%s); nothing was written: save to a regular file's path",
                        fn, path, file_kind(mode));
    else
      st = tg_set_error(TG_ERR_IO,
                        "%s: %s is not a regular file (a symbolic link to %s, %s); nothing was written: save to a "
                        "regular file's path",
                        fn, path, target, file_kind(mode));
    free(target);
    return st;
  }
  /* a file this process may not write is not replaced either (the rename would only need the
   * directory's permission): as open(path, "w") -- Python's, which tinygrad and torch.save use --
   * refuses it */
  if (exists && faccessat(AT_FDCWD, target, W_OK, AT_EACCESS) != 0) {
    tg_status st = tg_set_error(TG_ERR_IO, "%s: %s: %s (mode %03o); nothing was written: make it writable or save elsewhere",
                                fn, path, strerror(errno), (unsigned)(mode & 0777));
    free(target);
    return st;
  }
  remove_stale_temps(fn, target);
  /* a temporary file next to the target: O_EXCL with a unique name, mode 0666 & ~umask */
  size_t plen = strlen(target);
  const char *slash = strrchr(target, '/');
  int keep = (int)((size_t)(slash ? slash + 1 - target : 0) + temp_base_len(slash ? slash + 1 : target));
  char *tmp = tg_xmalloc(plen + 64);
  static unsigned counter;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
    snprintf(tmp, plen + 64, "%.*s.tmp.%ld.%u", keep, target, (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    tg_status st = tg_set_error(TG_ERR_IO, "%s: %s: cannot create a temporary file next to it: %s", fn, path, strerror(errno));
    free(tmp), free(target);
    return st;
  }
  /* the replacement keeps the old file's owner and group where this process may set them (root
   * saving a user's file), as writing into it would; best effort */
  struct stat old_st;
  if (exists && stat(target, &old_st) == 0 && (old_st.st_uid != geteuid() || old_st.st_gid != getegid())) {
    int rc = fchown(fd, old_st.st_uid, old_st.st_gid); /* (refused for others: the saver owns the new file) */
    (void)rc;
  }
  if (exists && fchmod(fd, mode & 07777) != 0) { /* keeping the old permissions is best effort */
  }
  f->target = target, f->tmp = tmp, f->fd = fd;
  return TG_OK;
}

static tg_status write_failed(SaveFile *f) {
  return tg_set_error(TG_ERR_IO, "%s: %s: write failed: %s (the existing file, if any, is untouched)", f->fn, f->path,
                      strerror(errno ? errno : EIO));
}

tg_status savefile_write(SaveFile *f, const void *p, size_t n) {
  if (f->fd < 0) return tg_set_error(TG_ERR_IO, "%s: %s: the file is not open for writing", f->fn, f->path);
  return fd_write_all(f->fd, p, n) ? TG_OK : write_failed(f);
}

tg_status savefile_finish(SaveFile *f) {
  if (f->fd < 0) return tg_set_error(TG_ERR_IO, "%s: %s: the file is not open for writing", f->fn, f->path);
  int fd = f->fd;
  f->fd = -1;
  errno = 0;
  bool ok = fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  return ok ? TG_OK : write_failed(f);
}

tg_status savefile_rename(SaveFile *f) {
  if (!f->tmp || f->fd >= 0) return tg_set_error(TG_ERR_IO, "%s: %s: the file is not finished", f->fn, f->path);
  if (rename(f->tmp, f->target) != 0)
    return tg_set_error(TG_ERR_IO, "%s: %s: cannot rename the temporary file over it: %s", f->fn, f->path, strerror(errno));
  free(f->tmp);
  f->tmp = NULL;
  /* make the rename durable: fsync the directory (best effort) */
  char *dir = tg_xstrdup(f->target);
  char *slash = strrchr(dir, '/');
  const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
  int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    if (fsync(dfd) != 0) { /* best effort */
    }
    close(dfd);
  }
  free(dir);
  return TG_OK;
}

void savefile_close(SaveFile *f) {
  if (f->fd >= 0) close(f->fd);
  if (f->tmp) unlink(f->tmp); /* a failure after the temporary file exists: remove it, leave path alone */
  free(f->tmp), free(f->target);
  f->fd = -1, f->tmp = NULL, f->target = NULL;
}

/* The canonical directory of a target (which exists: the temporary file was made in it) and the
 * target's last component. */
static char *canonical_target(const char *target) {
  const char *slash = strrchr(target, '/');
  char *dir = slash ? tg_xstrdup(target) : tg_xstrdup(".");
  if (slash) dir[slash == target ? 1 : (size_t)(slash - target)] = '\0';
  char *real = realpath(dir, NULL);
  free(dir);
  if (!real) return tg_xstrdup(target);
  const char *base = slash ? slash + 1 : target;
  SB b;
  sb_init(&b);
  sb_printf(&b, "%s/%s", real, base);
  free(real);
  return sb_take(&b);
}

bool savefile_same_target(const SaveFile *a, const SaveFile *b) {
  if (!a->target || !b->target) return false;
  char *x = canonical_target(a->target), *y = canonical_target(b->target);
  bool same = strcmp(x, y) == 0;
  free(x), free(y);
  return same;
}
