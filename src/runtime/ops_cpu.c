/*
 * ops_cpu.c -- the CPU device: host memory, kernels in C compiled by the system C compiler, loaded
 * with dlopen, run on the persistent thread pool.
 *
 * In: C source defining `void <fname>(void **restrict bufs, int64_t gstart, int64_t gend)`.
 * Out: shared-object bytes (compile), a callable program (load), a synchronous run (exec).
 * Invariants:
 *  - compile never crashes on bad input or a missing compiler: it returns TG_ERR_COMPILE with the
 *    compiler's own diagnostic.
 *  - A disk-cache entry is only ever seen complete (written to a private name, then rename()d) and
 *    is checked before use: magic, version, lengths, its key (the compiler id and a hash of the
 *    source, stored in the entry) and a checksum over key and payload. A file that is no entry of
 *    this source is deleted and rebuilt, and so is one whose binary then fails to load
 *    (cpu_cache_evict, called by program_get). Only regular files are read, opened without
 *    blocking (a FIFO planted in the cache directory cannot hang the process).
 *    Without a usable cache directory everything still works, just uncached.
 *  - Every loaded object gets a file name never used before in this process: glibc's dlopen
 *    returns an already-loaded object when the path string repeats, so reusing
 *    "/proc/self/fd/<n>" (memfd) after the fd number is recycled would silently run the wrong code.
 *
 * exec: local_size[0] is the number of threads to use (0, negative or NULL = all of them, THREADS
 * or the online CPUs); global_size[0] is split into that many contiguous chunks, the caller runs
 * one. global_size[0] <= 0 runs nothing.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../savefile.h"
#include "device.h"
#include "threadpool.h"

extern char **environ;

/* Lean on purpose: compile time is paid on every cache miss (BEAM compiles thousands). Valid for
 * gcc and clang. -fno-stack-protector keeps register-tile kernels free of canary checks on
 * distributions that enable the protector by default. The two linker options lay a kernel object
 * out as 2 mappings instead of 5 (code with read-only data, then data; no RELRO): a process that
 * loads many thousands of kernels (a long BEAM search, a fuzzer) reaches the kernel's limit on
 * mappings (vm.max_map_count, 65530 by default) 2.5 times later, and the objects are a third of
 * the size on disk. */
static const char *const CPU_CFLAGS[] = {"-shared",
                                         "-Wl,-z,noseparate-code",
                                         "-Wl,-z,norelro",
                                         "-fPIC",
                                         "-O2",
                                         "-march=native",
                                         "-fno-math-errno",
                                         "-ffp-contract=fast",
                                         "-fwrapv",
                                         "-fno-stack-protector",
                                         "-w",
                                         "-pipe"};
#define N_CFLAGS (sizeof CPU_CFLAGS / sizeof CPU_CFLAGS[0])
/* gcc only (clang rejects it): gcc 12's loop vectorizer miscompiles some of our index arithmetic --
 * a flipped axis summed into one accumulator, `d[(j+1)%2 + ((i-j+(j+1)/2)%3)*2]` over i < 3, j < 2,
 * adds the wrong elements at -O2. Kernels vectorize explicitly (GCC vector types), so the loop
 * vectorizer had little to do in them. */
static const char *const GCC_CFLAGS[] = {"-fno-tree-loop-vectorize"};
#define N_GCC_CFLAGS (sizeof GCC_CFLAGS / sizeof GCC_CFLAGS[0])

#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_MIN ((size_t)8 << 20)
/* Blocks from MAP_MIN up are mapped from the kernel directly, not taken from the C heap: freeing
 * one gives its memory back at once (glibc serves requests below its adaptive mmap threshold, up to
 * 32 MB, from the heap, which keeps freed pages resident). */
#define MAP_MIN ((size_t)1 << 20)

/* Size of the mapping behind a block of sz bytes: whole pages, or whole 2 MB pages from HUGE_MIN
 * up. Large blocks start on 2 MB boundaries and ask for transparent huge pages where the kernel
 * offers them: a first touch then faults in 2 MB instead of 4 KB (a fresh 37 MB activation took
 * ~9000 faults), and kernels striding across the buffer miss the TLB far less. */
static size_t map_size(size_t sz) {
  size_t page = sz >= HUGE_MIN ? HUGE_PAGE : 4096;
  return (sz + page - 1) & ~(page - 1);
}

static void *map_block(size_t sz) {
  size_t len = map_size(sz);
  if (sz < HUGE_MIN) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
  }
  /* over-map by one huge page, then trim both ends to a 2 MB-aligned range */
  char *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  uintptr_t a = ((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
  char *p = (char *)a;
  if (p > raw) munmap(raw, (size_t)(p - raw));
  size_t tail = (size_t)(raw + len + HUGE_PAGE - (p + len));
  if (tail) munmap(p + len, tail);
#ifdef MADV_HUGEPAGE
  madvise(p, len, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
  return p;
}

static void unmap_block(void *p, size_t sz) { munmap(p, map_size(sz)); }

/* Entry layout (version 2): "TGCK", u32 version, u64 payload length, u32 key length, u32 0, the key,
 * the payload (the shared object), u64 checksum of everything before it. */
#define CACHE_MAGIC "TGCK"
#define CACHE_VERSION 2u
#define CACHE_HDR 24
#define CACHE_TRAILER 8
#define CACHE_MAX_KEY 65536
#define CACHE_SEED 0x54474b45524e4c31ULL
#define DIAG_KEEP 65536 /* compiler output read into memory */
#define DIAG_SHOW 4096  /* compiler output put in the error message */

typedef struct {
  int index;
} CpuState;

typedef struct {
  tp_range_fn fn;
  void *dl;
} CpuProgram;

static _Atomic uint64_t g_file_counter;

/* ---------------------------------------------------------------------------------------------- */
/* small file and process helpers                                                                  */

/* Whole file into a malloc'd buffer; NULL if it cannot be read, is not a regular file, or is larger
 * than any kernel library (a planted 100 GB file is refused, not allocated). */
#define MAX_LIB_BYTES ((size_t)1 << 30)
static uint8_t *read_file(const char *path, size_t *len) { return file_read_regular(path, MAX_LIB_BYTES, len); }

static bool mkdir_p(const char *path) {
  char *p = tg_xstrdup(path);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = '\0';
    mkdir(p, 0755);
    *s = '/';
  }
  mkdir(p, 0755);
  struct stat st;
  bool ok = stat(p, &st) == 0 && S_ISDIR(st.st_mode);
  free(p);
  return ok;
}

/* Background compiles (see compile_async below): their compiler runs in a process group of its own,
 * g_bg_pgid (0: none running), which is stopped while kernels run (cpu_background_pause) and killed
 * at exit. tl_background marks the thread that starts them. */
static _Thread_local bool tl_background;
static pthread_mutex_t g_pause_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t g_bg_pgid;
static int g_pause_depth;

void cpu_background_pause(bool pause) {
  pthread_mutex_lock(&g_pause_lock);
  bool edge = pause ? g_pause_depth++ == 0 : g_pause_depth > 0 && --g_pause_depth == 0;
  if (edge && g_bg_pgid > 0) kill(-g_bg_pgid, pause ? SIGSTOP : SIGCONT);
  pthread_mutex_unlock(&g_pause_lock);
}

/* The background compiler thread does not read `environ`: a setenv on the caller's thread may
 * reallocate it meanwhile (a heap use-after-free under ASan). Each of its jobs carries a copy of
 * the environment taken on the caller's thread, which it passes to the compiler and reads TMPDIR
 * from (tl_envp; NULL on other threads, which read the process's). */
static _Thread_local char **tl_envp;

static char **env_snapshot(void) {
  size_t n = 0, bytes = 0;
  for (char **e = environ; e && *e; e++) n++, bytes += strlen(*e) + 1;
  char **v = tg_xmalloc(sizeof(char *) * (n + 1) + bytes);
  char *p = (char *)(v + n + 1);
  for (size_t i = 0; i < n; i++) {
    size_t l = strlen(environ[i]) + 1;
    memcpy(p, environ[i], l);
    v[i] = p, p += l;
  }
  v[n] = NULL;
  return v;
}

static const char *env_of(const char *name) {
  if (!tl_envp) return getenv(name);
  size_t l = strlen(name);
  for (char **e = tl_envp; *e; e++)
    if (!strncmp(*e, name, l) && (*e)[l] == '=') return *e + l + 1;
  return NULL;
}

/* Runs the program at `path` with stdin from /dev/null; stdout and stderr go to `out` (the first
 * `keep` bytes; the rest is drained so the child never blocks). Returns 0 and the wait status, or
 * the errno of a failed spawn. */
static int run_capture(const char *path, char *const argv[], SB *out, size_t keep, int *wstatus) {
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0) return errno;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  if (tl_background) {
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&at, 0);
  }
  pid_t pid;
  int rc = posix_spawn(&pid, path, &fa, &at, argv, tl_envp ? tl_envp : environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc == 0 && tl_background) {
    pthread_mutex_lock(&g_pause_lock);
    g_bg_pgid = pid;
    if (g_pause_depth > 0) kill(-pid, SIGSTOP); /* kernels are running: it waits for them */
    pthread_mutex_unlock(&g_pause_lock);
  }
  close(pfd[1]);
  if (rc != 0) {
    close(pfd[0]);
    return rc;
  }
  char buf[4096];
  for (;;) {
    ssize_t r = read(pfd[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (out->len < keep) {
      size_t take = (size_t)r < keep - out->len ? (size_t)r : keep - out->len;
      sb_printf(out, "%.*s", (int)take, buf);
    }
  }
  close(pfd[0]);
  *wstatus = -1;
  if (tl_background) {
    /* signals go to its group until it has exited: wait without reaping first, so that its pid
     * is withdrawn before it can be handed to another process */
    siginfo_t si;
    while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&g_pause_lock);
    g_bg_pgid = 0;
    pthread_mutex_unlock(&g_pause_lock);
  }
  while (waitpid(pid, wstatus, 0) < 0 && errno == EINTR) {
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* compiler identity                                                                               */

typedef struct CompilerInfo {
  char *cc;    /* the CC setting as given, e.g. "cc" or "ccache clang" */
  char **argv; /* cc split on blanks, NULL-terminated */
  int argc;
  char *path; /* argv[0] resolved through PATH; NULL if not found */
  char *id;   /* part of every disk-cache key */
  bool gcc;   /* not clang: GCC_CFLAGS apply */
  struct CompilerInfo *next;
} CompilerInfo;

static pthread_mutex_t g_cc_lock = PTHREAD_MUTEX_INITIALIZER;
static CompilerInfo *g_compilers; /* one per CC value seen; never freed (ids are handed out) */

char *host_which(const char *prog) {
  if (strchr(prog, '/')) return access(prog, X_OK) == 0 ? tg_xstrdup(prog) : NULL;
  const char *pathenv = getenv("PATH");
  if (!pathenv || !*pathenv) pathenv = "/usr/local/bin:/usr/bin:/bin";
  SB b;
  sb_init(&b);
  for (const char *p = pathenv;;) {
    const char *e = strchr(p, ':');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    b.len = 0;
    sb_printf(&b, "%.*s/%s", (int)n, n ? p : ".", prog);
    struct stat st;
    if (access(b.s, X_OK) == 0 && stat(b.s, &st) == 0 && S_ISREG(st.st_mode)) return sb_take(&b);
    if (!e) break;
    p = e + 1;
  }
  sb_free(&b);
  return NULL;
}

static CompilerInfo *compiler_new(const char *cc) {
  CompilerInfo *ci = tg_xcalloc(1, sizeof *ci);
  ci->cc = tg_xstrdup(cc);
  char *copy = tg_xstrdup(cc);
  for (char *save = NULL, *tok = strtok_r(copy, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
    ci->argv = tg_xrealloc(ci->argv, (size_t)(ci->argc + 2) * sizeof *ci->argv);
    ci->argv[ci->argc++] = tg_xstrdup(tok);
    ci->argv[ci->argc] = NULL;
  }
  free(copy);
  if (ci->argc) ci->path = host_which(ci->argv[0]);

  SB version;
  sb_init(&version);
  if (ci->path) {
    char **argv = tg_xcalloc((size_t)ci->argc + 2, sizeof *argv);
    for (int i = 0; i < ci->argc; i++) argv[i] = ci->argv[i];
    argv[ci->argc] = "--version";
    int ws;
    if (run_capture(ci->path, argv, &version, 4096, &ws) != 0) version.len = 0;
    free(argv);
    if (version.s) {
      version.s[strcspn(version.s, "\n")] = '\0';
      version.len = strlen(version.s);
    }
  }
  ci->gcc = !(version.len && strstr(version.s, "clang"));
  SB id;
  sb_init(&id);
  sb_printf(&id, "cc:%s@%s:%s|", ci->cc, ci->path ? ci->path : "(missing)", version.len ? version.s : "?");
  for (size_t i = 0; i < N_CFLAGS; i++) sb_printf(&id, "%s%s", i ? " " : "", CPU_CFLAGS[i]);
  for (size_t i = 0; ci->gcc && i < N_GCC_CFLAGS; i++) sb_printf(&id, " %s", GCC_CFLAGS[i]);
  sb_free(&version);
  ci->id = sb_take(&id);
  return ci;
}

/* Compiler for the current CC setting (a Context may change it, so it is looked up each time). */
static CompilerInfo *compiler_get(void) {
  const char *cc = getenv_str("CC", "cc");
  if (!cc || !*cc) cc = "cc";
  pthread_mutex_lock(&g_cc_lock);
  CompilerInfo *ci = g_compilers;
  while (ci && strcmp(ci->cc, cc) != 0) ci = ci->next;
  if (!ci) {
    ci = compiler_new(cc);
    ci->next = g_compilers;
    g_compilers = ci;
  }
  pthread_mutex_unlock(&g_cc_lock);
  return ci;
}

static const char *cpu_compiler_id(void *state) {
  (void)state;
  return compiler_get()->id;
}

/* ---------------------------------------------------------------------------------------------- */
/* on-disk cache                                                                                   */

static char *cache_dir(void) {
  SB b;
  sb_init(&b);
  const char *d = getenv_str("TINYGRAD_CACHE_DIR", NULL);
  if (d && *d) {
    sb_puts(&b, d);
  } else if ((d = getenv_str("XDG_CACHE_HOME", NULL)) && *d) {
    sb_printf(&b, "%s/tinygrad.c", d);
  } else if ((d = getenv_str("HOME", NULL)) && *d) {
    sb_printf(&b, "%s/.cache/tinygrad.c", d);
  } else {
    return NULL;
  }
  sb_puts(&b, "/kernels");
  return sb_take(&b);
}

/* The key stored in an entry: the compiler id and a 128-bit hash of the source. The file name is a
 * hash of both as well, but only the stored key proves that an entry belongs to this source (a file
 * copied in from another cache, or a name collision, has another key). */
static char *cache_key(const char *id, const char *src) {
  size_t n = strlen(src);
  SB k;
  sb_init(&k);
  sb_printf(&k, "%s\nsrc:%016llx%016llx", id, (unsigned long long)hash_bytes(src, n, CACHE_SEED),
            (unsigned long long)hash_bytes(src, n, ~CACHE_SEED));
  return sb_take(&k);
}

/* The entry's path for src, or NULL when there is no cache (DISABLE_COMPILER_CACHE, no directory
 * setting); *dir gets the directory (malloc'd, or NULL). */
static char *cache_entry_path(const char *id, const char *src, char **dir) {
  *dir = NULL;
  if (getenv_int("DISABLE_COMPILER_CACHE", 0) != 0 || !(*dir = cache_dir())) return NULL;
  size_t n = strlen(src);
  uint64_t base = hash_bytes(id, strlen(id), CACHE_SEED);
  uint64_t h1 = hash_bytes(src, n, base), h2 = hash_bytes(src, n, ~base);
  SB e;
  sb_init(&e);
  sb_printf(&e, "%s/%016llx%016llx.so", *dir, (unsigned long long)h1, (unsigned long long)h2);
  return sb_take(&e);
}

/* Payload of a valid entry for `key` (malloc'd), or NULL. An entry that exists but is damaged or
 * belongs to another key is deleted; something that is not a regular file is left (the rebuilt
 * entry is renamed over it). */
static uint8_t *cache_read(const char *path, const char *key, size_t *len) {
  size_t n = 0;
  uint8_t *buf = read_file(path, &n);
  if (!buf) return NULL;
  uint32_t version = 0, klen = 0;
  uint64_t plen = 0, sum;
  size_t want_klen = strlen(key);
  bool ok = n >= CACHE_HDR + CACHE_TRAILER && memcmp(buf, CACHE_MAGIC, 4) == 0;
  if (ok) {
    memcpy(&version, buf + 4, 4);
    memcpy(&plen, buf + 8, 8);
    memcpy(&klen, buf + 16, 4);
    ok = version == CACHE_VERSION && klen <= CACHE_MAX_KEY && plen <= n &&
         plen == n - CACHE_HDR - CACHE_TRAILER - (uint64_t)klen;
  }
  if (ok) {
    memcpy(&sum, buf + n - CACHE_TRAILER, 8);
    ok = sum == hash_bytes(buf, n - CACHE_TRAILER, CACHE_SEED);
  }
  bool foreign = ok && (klen != want_klen || memcmp(buf + CACHE_HDR, key, klen) != 0);
  if (!ok || foreign) {
    if (debug_level() >= 2)
      fprintf(stderr, "kernel cache: discarding %s entry %s\n", foreign ? "another kernel's" : "damaged", path);
    unlink(path);
    free(buf);
    return NULL;
  }
  memmove(buf, buf + CACHE_HDR + klen, (size_t)plen);
  *len = (size_t)plen;
  return buf;
}

/* Best effort: a failure leaves no file behind and is otherwise ignored. */
static void cache_write(const char *dir, const char *path, const char *key, const uint8_t *lib, size_t len) {
  SB tmp;
  sb_init(&tmp);
  sb_printf(&tmp, "%s/.tmp-%d-%ld-%llu", dir, (int)getpid(), (long)syscall(SYS_gettid),
            (unsigned long long)atomic_fetch_add(&g_file_counter, 1));
  size_t klen = strlen(key);
  size_t total = CACHE_HDR + klen + len + CACHE_TRAILER;
  uint8_t *e = klen <= CACHE_MAX_KEY ? malloc(total) : NULL;
  int fd = e ? file_create_new(tmp.s, 0644) : -1;
  if (fd >= 0) {
    uint32_t version = CACHE_VERSION, k32 = (uint32_t)klen, zero = 0;
    uint64_t plen = len;
    memcpy(e, CACHE_MAGIC, 4);
    memcpy(e + 4, &version, 4);
    memcpy(e + 8, &plen, 8);
    memcpy(e + 16, &k32, 4);
    memcpy(e + 20, &zero, 4);
    memcpy(e + CACHE_HDR, key, klen);
    memcpy(e + CACHE_HDR + klen, lib, len);
    uint64_t sum = hash_bytes(e, total - CACHE_TRAILER, CACHE_SEED);
    memcpy(e + total - CACHE_TRAILER, &sum, 8);
    bool ok = fd_write_all(fd, e, total);
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp.s, path) != 0) unlink(tmp.s);
  }
  free(e);
  sb_free(&tmp);
}

/* ---------------------------------------------------------------------------------------------- */
/* compile                                                                                         */

/* The kernel's name for error messages: the identifier before the first "(void **". */
static void kernel_name(const char *src, char *out, size_t cap) {
  const char *p = strstr(src, "(void **");
  const char *e = p;
  while (p && p > src &&
         (p[-1] == '_' || (p[-1] >= '0' && p[-1] <= '9') || ((p[-1] | 32) >= 'a' && (p[-1] | 32) <= 'z')))
    p--;
  snprintf(out, cap, "%.*s", p && e > p ? (int)(e - p) : 1, p && e > p ? p : "?");
}

static tg_status compile_now(CompilerInfo *ci, const char *src, uint8_t **lib, size_t *liblen) {
  if (!ci->path) return tg_set_error(TG_ERR_COMPILE, "C compiler '%s' not found (set CC)", ci->cc);
  const char *tmpdir = env_of("TMPDIR");
  if (!tmpdir || !*tmpdir) tmpdir = "/tmp";
  SB cpath, opath, diag;
  sb_init(&cpath);
  sb_init(&opath);
  sb_init(&diag);
  sb_printf(&cpath, "%s/tgk-XXXXXX.c", tmpdir);
  int fd = mkstemps(cpath.s, 2);
  if (fd < 0) {
    tg_status st = tg_set_error(TG_ERR_COMPILE, "compile failed: cannot create a file in %s: %s", tmpdir,
                                strerror(errno));
    sb_free(&cpath);
    return st;
  }
  bool wrote = fd_write_all(fd, src, strlen(src));
  close(fd);
  /* The .c name is ours (mkstemps), so the matching .so name cannot collide either. */
  sb_printf(&opath, "%.*s.so", (int)(cpath.len - 2), cpath.s);

  tg_status st = TG_OK;
  char name[96];
  kernel_name(src, name, sizeof name);
  size_t nargs = (size_t)ci->argc + N_CFLAGS + N_GCC_CFLAGS + 5, k = 0;
  char **argv = tg_xcalloc(nargs, sizeof *argv);
  for (int i = 0; i < ci->argc; i++) argv[k++] = ci->argv[i];
  for (size_t i = 0; i < N_CFLAGS; i++) argv[k++] = (char *)CPU_CFLAGS[i];
  for (size_t i = 0; ci->gcc && i < N_GCC_CFLAGS; i++) argv[k++] = (char *)GCC_CFLAGS[i];
  argv[k++] = "-o";
  argv[k++] = opath.s;
  argv[k++] = cpath.s;
  argv[k++] = "-lm";
  argv[k] = NULL;
  int ws = 0, rc = wrote ? run_capture(ci->path, argv, &diag, DIAG_KEEP, &ws) : EIO;
  free(argv);
  unlink(cpath.s);
  if (rc == ENOENT) {
    st = tg_set_error(TG_ERR_COMPILE, "C compiler '%s' not found (set CC)", ci->cc);
  } else if (rc != 0) {
    st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s': cannot run '%s': %s", name, ci->path,
                      strerror(rc));
  } else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    while (diag.len && (diag.s[diag.len - 1] == '\n' || diag.s[diag.len - 1] == ' '))
      diag.s[--diag.len] = '\0';
    st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s' (%s, %s %d):\n%.*s%s", name, ci->cc,
                      WIFEXITED(ws) ? "exit" : "signal",
                      WIFEXITED(ws)     ? WEXITSTATUS(ws)
                      : WIFSIGNALED(ws) ? WTERMSIG(ws)
                                        : -1,
                      (int)(diag.len < DIAG_SHOW ? diag.len : DIAG_SHOW), diag.s ? diag.s : "",
                      diag.len > DIAG_SHOW ? "\n... (truncated)" : "");
  } else if (!(*lib = read_file(opath.s, liblen))) {
    st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s': no output from '%s'", name, ci->cc);
  }
  unlink(opath.s);
  sb_free(&cpath);
  sb_free(&opath);
  sb_free(&diag);
  return st;
}

tg_status disk_cache_compile(const char *id, const char *src, disk_cache_build_fn build, void *ctx, uint8_t **lib,
                             size_t *liblen) {
  *lib = NULL;
  *liblen = 0;
  if (!src) return tg_set_error(TG_ERR_INVALID, "compile: no source");
  char *dir = NULL, *entry = cache_entry_path(id, src, &dir), *key = entry ? cache_key(id, src) : NULL;
  if (entry && (*lib = cache_read(entry, key, liblen))) {
    free(dir), free(entry), free(key);
    return TG_OK;
  }
  tg_status st = build(ctx, src, lib, liblen);
  if (st == TG_OK && entry && mkdir_p(dir)) cache_write(dir, entry, key, *lib, *liblen);
  free(dir), free(entry), free(key);
  return st;
}

void disk_cache_evict(const char *id, const char *src) {
  if (!src) return;
  char *dir = NULL, *entry = cache_entry_path(id, src, &dir);
  if (entry) {
    if (unlink(entry) == 0 && debug_level() >= 2) fprintf(stderr, "kernel cache: removed %s (its binary did not load)\n", entry);
  }
  free(dir), free(entry);
}

static tg_status cc_build(void *ctx, const char *src, uint8_t **lib, size_t *liblen) {
  return compile_now(ctx, src, lib, liblen);
}

static tg_status cpu_compile(void *state, const char *src, uint8_t **lib, size_t *liblen) {
  (void)state;
  CompilerInfo *ci = compiler_get();
  return disk_cache_compile(ci->id, src, cc_build, ci, lib, liblen);
}

/* The binary cpu_compile gave for src did not load: whatever entry the cache holds for it is
 * damaged (or not ours), so the next compile builds it afresh. */
static void cpu_cache_evict(void *state, const char *src) {
  (void)state;
  disk_cache_evict(compiler_get()->id, src);
}

static bool cpu_cached(void *state, const char *src) {
  (void)state;
  char *dir = NULL, *entry = cache_entry_path(compiler_get()->id, src, &dir);
  bool have = entry && access(entry, R_OK) == 0;
  free(dir), free(entry);
  return have;
}

/* ---- background compiles (compile_async): one thread at the lowest priority (SCHED_IDLE, else
 * nice 19; the compiler processes it starts inherit it), so it takes only CPU time left idle, and
 * its compiler is stopped outright while kernels run (cpu_background_pause). The job
 * records what the caller's thread would compile with (compiler, cache entry) when it is queued. At
 * exit the running compiler is killed and queued jobs are dropped: nothing is half-written (the
 * cache entry is renamed into place only when complete) and the temporary files are removed. ---- */
typedef struct BgJob {
  CompilerInfo *ci;
  char *src, *dir, *entry, *key;
  void (*done)(void *ctx, const uint8_t *lib, size_t liblen, const char *err);
  void *ctx;
  char **envp; /* the caller's environment (env_snapshot) */
  struct BgJob *next;
} BgJob;

static pthread_mutex_t g_bg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_bg_cond = PTHREAD_COND_INITIALIZER;
static BgJob *g_bg_head, *g_bg_tail;
static bool g_bg_started, g_bg_stop, g_bg_exited;
static pthread_t g_bg_thread;

static void bg_job_free(BgJob *j) {
  free(j->src), free(j->dir), free(j->entry), free(j->key), free(j->envp);
  free(j);
}

static void *bg_main(void *arg) {
  (void)arg;
  /* SCHED_IDLE where the kernel has it (any other thread preempts it at once), else nice 19 */
  struct sched_param sp = {0};
  if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
  tl_background = true;
  pthread_mutex_lock(&g_bg_lock);
  for (;;) {
    while (!g_bg_head && !g_bg_stop) pthread_cond_wait(&g_bg_cond, &g_bg_lock);
    if (g_bg_stop) break;
    BgJob *j = g_bg_head;
    g_bg_head = j->next;
    if (!g_bg_head) g_bg_tail = NULL;
    pthread_mutex_unlock(&g_bg_lock);
    uint8_t *lib = NULL;
    size_t len = 0;
    char *err = NULL;
    tl_envp = j->envp;
    if (!(j->entry && (lib = cache_read(j->entry, j->key, &len)))) {
      if (compile_now(j->ci, j->src, &lib, &len) == TG_OK) {
        if (j->entry && mkdir_p(j->dir)) cache_write(j->dir, j->entry, j->key, lib, len);
      } else {
        err = tg_xstrdup(tg_last_error() ? tg_last_error() : "compile failed");
        tg_clear_error();
      }
    }
    pthread_mutex_lock(&g_bg_lock);
    bool stop = g_bg_stop;
    pthread_mutex_unlock(&g_bg_lock);
    if (stop) j->done(j->ctx, NULL, 0, NULL);
    else j->done(j->ctx, lib, len, err ? err : lib ? NULL : "compile failed");
    tl_envp = NULL;
    free(lib), free(err);
    bg_job_free(j);
    pthread_mutex_lock(&g_bg_lock);
  }
  g_bg_exited = true;
  pthread_mutex_unlock(&g_bg_lock);
  return NULL;
}

static void bg_at_exit(void) {
  pthread_mutex_lock(&g_bg_lock);
  g_bg_stop = true;
  BgJob *j = g_bg_head;
  g_bg_head = g_bg_tail = NULL;
  pthread_cond_broadcast(&g_bg_cond);
  pthread_mutex_unlock(&g_bg_lock);
  while (j) {
    BgJob *nx = j->next;
    j->done(j->ctx, NULL, 0, NULL);
    bg_job_free(j);
    j = nx;
  }
  /* the job in progress ends as soon as its compiler does (at most a few seconds if it will not) */
  for (int i = 0; i < 2000; i++) {
    pthread_mutex_lock(&g_bg_lock);
    bool exited = g_bg_exited;
    pthread_mutex_unlock(&g_bg_lock);
    if (exited) {
      pthread_join(g_bg_thread, NULL);
      return;
    }
    /* first asked to stop (the compiler driver then removes its temporary files; a paused group is
     * continued to see the signal), killed if it has not gone after 50 ms */
    pthread_mutex_lock(&g_pause_lock);
    if (g_bg_pgid > 0) {
      kill(-g_bg_pgid, i < 50 ? SIGTERM : SIGKILL);
      if (i == 0) kill(-g_bg_pgid, SIGCONT);
    }
    pthread_mutex_unlock(&g_pause_lock);
    usleep(1000);
  }
}

static bool cpu_compile_async(void *state, const char *src,
                              void (*done)(void *ctx, const uint8_t *lib, size_t liblen, const char *err), void *ctx) {
  (void)state;
  CompilerInfo *ci = compiler_get();
  if (!ci->path || !src) return false;
  BgJob *j = tg_xcalloc(1, sizeof *j);
  j->ci = ci;
  j->src = tg_xstrdup(src);
  j->entry = cache_entry_path(ci->id, src, &j->dir);
  j->key = j->entry ? cache_key(ci->id, src) : NULL;
  j->done = done;
  j->ctx = ctx;
  j->envp = env_snapshot();
  pthread_mutex_lock(&g_bg_lock);
  bool ok = !g_bg_stop;
  if (ok && !g_bg_started) {
    ok = pthread_create(&g_bg_thread, NULL, bg_main, NULL) == 0;
    if (ok) {
      g_bg_started = true;
      atexit(bg_at_exit);
    }
  }
  if (ok) {
    if (g_bg_tail) g_bg_tail->next = j;
    else g_bg_head = j;
    g_bg_tail = j;
    pthread_cond_signal(&g_bg_cond);
  }
  pthread_mutex_unlock(&g_bg_lock);
  if (!ok) bg_job_free(j);
  return ok;
}

char *host_disassemble(const char *tool, const char *const *args, const uint8_t *bin, size_t len, const char *suffix) {
  const char *tmpdir = getenv("TMPDIR");
  if (!tmpdir || !*tmpdir) tmpdir = "/tmp";
  SB path, out;
  sb_init(&path);
  sb_init(&out);
  sb_printf(&path, "%s/tgd-XXXXXX%s", tmpdir, suffix);
  int fd = mkstemps(path.s, (int)strlen(suffix));
  char *res = NULL;
  if (fd < 0) {
    tg_set_error(TG_ERR_RUNTIME, "disassembly: cannot create a file in %s: %s", tmpdir, strerror(errno));
  } else {
    bool ok = fd_write_all(fd, bin, len);
    ok = close(fd) == 0 && ok;
    size_t nargs = 0;
    while (args && args[nargs]) nargs++;
    char **argv = tg_xcalloc(nargs + 3, sizeof *argv);
    argv[0] = (char *)tool;
    for (size_t i = 0; i < nargs; i++) argv[i + 1] = (char *)args[i];
    argv[nargs + 1] = path.s;
    int ws = 0, rc = ok ? run_capture(tool, argv, &out, (size_t)1 << 24, &ws) : EIO;
    free(argv);
    unlink(path.s);
    if (rc != 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
      tg_set_error(TG_ERR_RUNTIME, "disassembly: %s failed: %s", tool, rc ? strerror(rc) : out.s ? out.s : "?");
    else
      res = sb_take(&out);
  }
  sb_free(&out);
  sb_free(&path);
  return res;
}

/* DEBUG=7: the kernel object disassembled by objdump (binutils). */
static char *cpu_disasm(void *state, const char *src, const uint8_t *lib, size_t liblen) {
  (void)state;
  char *objdump = host_which(getenv_str("OBJDUMP", "objdump"));
  if (!objdump) {
    tg_set_error(TG_ERR_RUNTIME, "disassembly: objdump not found (install binutils, or set OBJDUMP)");
    return NULL;
  }
  char name[96], only[128];
  kernel_name(src ? src : "", name, sizeof name);
  snprintf(only, sizeof only, "--disassemble=%s", name); /* the kernel alone, not the loader stubs */
  const char *args[] = {only, "--no-show-raw-insn", NULL};
  char *res = host_disassemble(objdump, args, lib, liblen, ".so");
  free(objdump);
  return res;
}

/* ---------------------------------------------------------------------------------------------- */
/* load, exec                                                                                      */

static void *cpu_load(void *state, const char *fname, const uint8_t *lib, size_t liblen) {
  (void)state;
  if (!fname || !lib) {
    tg_set_error(TG_ERR_INVALID, "load: no %s", fname ? "binary" : "name");
    return NULL;
  }
  /* tmpfs first (no disk I/O); the others in case it is missing, full or mounted noexec. */
  const char *dirs[] = {"/dev/shm", env_of("TMPDIR"), "/tmp"}; /* (also on the background thread: tier_done) */
  void *dl = NULL;
  char why[512] = "no writable temporary directory";
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0] && !dl; i++) {
    if (!dirs[i] || !*dirs[i]) continue;
    char path[4096];
    int len = snprintf(path, sizeof path, "%s/tgk-%d-%llu-XXXXXX.so", dirs[i], (int)getpid(),
                       (unsigned long long)atomic_fetch_add(&g_file_counter, 1));
    if (len < 0 || (size_t)len >= sizeof path) continue;
    int fd = mkstemps(path, 3);
    if (fd < 0) continue;
    bool ok = fd_write_all(fd, lib, liblen);
    ok = close(fd) == 0 && ok;
    if (ok) {
      dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (!dl) snprintf(why, sizeof why, "%s", dlerror());
    }
    unlink(path);
  }
  if (!dl) {
    tg_set_error(TG_ERR_RUNTIME, "cannot load kernel '%s': %s", fname, why);
    return NULL;
  }
  void *sym = dlsym(dl, fname);
  if (!sym) {
    tg_set_error(TG_ERR_RUNTIME, "cannot load kernel '%s': symbol not found in its binary", fname);
    dlclose(dl);
    return NULL;
  }
  CpuProgram *p = tg_xmalloc(sizeof *p);
  p->fn = (tp_range_fn)sym;
  p->dl = dl;
  return p;
}

static void cpu_unload(void *state, void *prg) {
  (void)state;
  CpuProgram *p = prg;
  if (!p) return;
  dlclose(p->dl);
  free(p);
}

static double cpu_exec(void *state, void *prg, void **bufs, int nbufs, int nvals, const int64_t *global_size,
                       const int64_t *local_size, bool wait) {
  (void)state;
  (void)nbufs, (void)nvals; /* (the kernel reads its variables from bufs itself) */
  const CpuProgram *p = prg;
  if (!p) {
    tg_set_error(TG_ERR_INVALID, "exec: no program");
    return -1.0;
  }
  return tp_run_kernel(p->fn, bufs, global_size, local_size, wait);
}

/* ---------------------------------------------------------------------------------------------- */
/* memory                                                                                          */

static void *cpu_open(int index) {
  CpuState *s = tg_xcalloc(1, sizeof *s);
  s->index = index;
  return s;
}

static void cpu_close(void *state) { free(state); }

static void *cpu_alloc(void *state, size_t nbytes) {
  (void)state;
  /* Reject what RAM plus swap could never hold, instead of letting the allocator (or ASan's)
   * abort or the kernel overcommit into an OOM kill later. */
  size_t lim = host_memory_limit();
  if (nbytes > lim) {
    tg_set_error(TG_ERR_RUNTIME, "CPU: cannot allocate %zu bytes (RAM + swap is %zu bytes)", nbytes, lim);
    return NULL;
  }
  size_t sz = (nbytes + 63) & ~(size_t)63;
  void *p;
  if (sz >= MAP_MIN) {
    p = map_block(sz);
  } else {
    p = aligned_alloc(64, sz ? sz : 64);
  }
  if (!p) tg_set_error(TG_ERR_RUNTIME, "CPU: cannot allocate %zu bytes: out of memory", nbytes);
  return p;
}

static void cpu_free(void *state, void *ptr, size_t nbytes) {
  (void)state;
  size_t sz = (nbytes + 63) & ~(size_t)63;
  if (sz >= MAP_MIN) unmap_block(ptr, sz);
  else free(ptr);
}

static tg_status cpu_copy(void *state, void *dst, const void *src, size_t nbytes) {
  (void)state;
  if (nbytes) memmove(dst, src, nbytes);
  return TG_OK;
}

static void cpu_synchronize(void *state) { (void)state; }

void cpu_host_simd(int *vec_bytes, int *vec_regs) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) *vec_bytes = 64, *vec_regs = 32;
  else if (__builtin_cpu_supports("avx2") || __builtin_cpu_supports("avx")) *vec_bytes = 32, *vec_regs = 16;
  else *vec_bytes = 16, *vec_regs = 16;
#elif defined(__aarch64__)
  *vec_bytes = 16, *vec_regs = 32; /* NEON (SVE's width is not assumed) */
#else
  *vec_bytes = 16, *vec_regs = 16;
#endif
}

/* sysfs spells a cache's size "32K", "1024K" or "32M" */
static int64_t sysfs_cache_bytes(const char *dir, int index, const char *what, char *buf, size_t n) {
  char path[128];
  snprintf(path, sizeof path, "%s/index%d/%s", dir, index, what);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  bool got = fgets(buf, (int)n, f) != NULL;
  fclose(f);
  if (!got) return -1;
  buf[strcspn(buf, "\n")] = 0;
  char *end;
  long long v = strtoll(buf, &end, 10);
  return *end == 'K' ? v << 10 : *end == 'M' ? v << 20 : *end == 'G' ? v << 30 : v;
}

void cpu_host_caches(int64_t *l1d, int64_t *l2, int64_t *l3) {
  int64_t lv[4] = {0, 0, 0, 0};
  const char *dir = "/sys/devices/system/cpu/cpu0/cache";
  char type[32], tmp[32];
  for (int i = 0; i < 16; i++) {
    int64_t level = sysfs_cache_bytes(dir, i, "level", tmp, sizeof tmp);
    if (level < 0) break;
    if (sysfs_cache_bytes(dir, i, "type", type, sizeof type) < 0 || strcmp(type, "Instruction") == 0) continue;
    int64_t size = sysfs_cache_bytes(dir, i, "size", tmp, sizeof tmp);
    if (level >= 1 && level <= 3 && size > 0) lv[level] = size;
  }
#ifdef _SC_LEVEL1_DCACHE_SIZE
  /* (sysconf's L3 may be the whole package's: only where sysfs says nothing) */
  if (!lv[1]) lv[1] = sysconf(_SC_LEVEL1_DCACHE_SIZE) > 0 ? sysconf(_SC_LEVEL1_DCACHE_SIZE) : 0;
  if (!lv[2]) lv[2] = sysconf(_SC_LEVEL2_CACHE_SIZE) > 0 ? sysconf(_SC_LEVEL2_CACHE_SIZE) : 0;
  if (!lv[3]) lv[3] = sysconf(_SC_LEVEL3_CACHE_SIZE) > 0 ? sysconf(_SC_LEVEL3_CACHE_SIZE) : 0;
#endif
  *l1d = lv[1], *l2 = lv[2], *l3 = lv[3];
}

/* Kernels are compiled with -march=native: they use what the host has. */
static void cpu_caps(void *state, DeviceCaps *c) {
  (void)state;
  cpu_host_simd(&c->vec_bytes, &c->vec_regs);
  cpu_host_caches(&c->l1d_bytes, &c->l2_bytes, &c->l3_bytes);
}

const DeviceVT cpu_device_vt = {
    .name = "CPU",
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copyin = cpu_copy,
    .copyout = cpu_copy,
    .compile = cpu_compile,
    .load = cpu_load,
    .unload = cpu_unload,
    .exec = cpu_exec,
    .synchronize = cpu_synchronize,
    .compiler_id = cpu_compiler_id,
    .caps = cpu_caps,
    .cache_evict = cpu_cache_evict,
    .disasm = cpu_disasm,
    .cached = cpu_cached,
    .compile_async = cpu_compile_async,
};
