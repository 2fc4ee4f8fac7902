/*
 * test.h -- the minimal C test framework used by every tests/test_*.c binary.
 *
 *   TEST(name) { CHECK(x == 1); CHECK_CLOSE(a, b, 1e-6); }
 *   int main(void) { return RUN_TESTS(); }
 *
 * Tests register themselves via constructor attributes. Each binary prints one line per failing
 * check and ends with "<binary>: N passed, N failed" (counting tests), exiting non-zero on failure.
 */
#ifndef TG_TEST_H
#define TG_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Under AddressSanitizer, TT_LEAK_CHECK_AT_END=1 makes LeakSanitizer's check run when the tests end
 * (in tt_run) instead of at process exit, before the libraries' exit handlers and destructors run.
 * tests/run_tests.sh uses it only when the check at exit could not run at all. */
#if defined(__SANITIZE_ADDRESS__)
#define TT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TT_ASAN 1
#endif
#endif
#ifdef TT_ASAN
#include <sanitizer/lsan_interface.h>
#endif

typedef void (*tt_fn)(void);
typedef struct {
  const char *name;
  tt_fn fn;
} tt_case;

static tt_case tt_cases[1024];
static int tt_ncases;
static int tt_failed_checks;

#define TEST(tname)                                                                                \
  static void test_##tname(void);                                                                  \
  __attribute__((constructor)) static void tt_reg_##tname(void) {                                  \
    tt_cases[tt_ncases].name = #tname;                                                             \
    tt_cases[tt_ncases++].fn = test_##tname;                                                       \
  }                                                                                                \
  static void test_##tname(void)

#define CHECK(c)                                                                                   \
  do {                                                                                             \
    if (!(c)) {                                                                                    \
      tt_failed_checks++;                                                                          \
      fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);                               \
    }                                                                                              \
  } while (0)

#define CHECK_MSG(c, ...)                                                                          \
  do {                                                                                             \
    if (!(c)) {                                                                                    \
      tt_failed_checks++;                                                                          \
      fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);                               \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
    }                                                                                              \
  } while (0)

#define CHECK_CLOSE(a, b, tol)                                                                     \
  do {                                                                                             \
    double tt_a = (double)(a), tt_b = (double)(b);                                                 \
    if (!(fabs(tt_a - tt_b) <= (tol) * (1.0 + fabs(tt_b))) && !(isnan(tt_a) && isnan(tt_b))) {     \
      tt_failed_checks++;                                                                          \
      fprintf(stderr, "  FAIL %s:%d: %s = %.9g, expected %.9g\n", __FILE__, __LINE__, #a, tt_a,    \
              tt_b);                                                                               \
    }                                                                                              \
  } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                            \
  do {                                                                                             \
    const char *tt_h = (hay);                                                                      \
    if (!tt_h || !strstr(tt_h, (needle))) {                                                        \
      tt_failed_checks++;                                                                          \
      fprintf(stderr, "  FAIL %s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__,       \
              tt_h ? tt_h : "(null)", (needle));                                                   \
    }                                                                                              \
  } while (0)

/* Runs all registered tests (or those whose name contains argv filter TEST_FILTER env). */
static inline int tt_run(const char *prog) {
  int passed = 0, failed = 0;
  const char *filter = getenv("TEST_FILTER");
  for (int i = 0; i < tt_ncases; i++) {
    if (filter && *filter && !strstr(tt_cases[i].name, filter)) continue;
    int before = tt_failed_checks;
    tt_cases[i].fn();
    if (tt_failed_checks == before) {
      passed++;
    } else {
      failed++;
      fprintf(stderr, "FAILED: %s\n", tt_cases[i].name);
    }
  }
  const char *base = strrchr(prog, '/');
  printf("%s: %d passed, %d failed\n", base ? base + 1 : prog, passed, failed);
  fflush(stdout);
#ifdef TT_ASAN
  const char *at_end = getenv("TT_LEAK_CHECK_AT_END");
  if (at_end && atoi(at_end)) __lsan_do_leak_check(); /* a leak ends the process here; no check at exit follows */
#endif
  return failed ? 1 : 0;
}
#define RUN_TESTS() tt_run(__FILE__)

/* ---- for tests of the tinygrad.c API (the macros expand where tinygrad.h is included) ---- */

/* BEGIN ... END around a test body: a scope for its handles; at the end no handle may be left
 * beyond those live before, and no error may be left unread. */
#define BEGIN                                                                                      \
  size_t tt_live0 = tg_live_count();                                                               \
  tg_clear_error();                                                                                \
  tg_scope_begin()

#define END                                                                                        \
  do {                                                                                             \
    tg_scope_end();                                                                                \
    CHECK_MSG(tg_live_count() == tt_live0, "live handles %zu, expected %zu", tg_live_count(),      \
              tt_live0);                                                                           \
    CHECK_MSG(tg_last_error() == NULL, "unexpected error left: %s", tg_last_error());              \
    tg_clear_error();                                                                              \
  } while (0)

/* Checks that an error was recorded with `status` and a message containing each needle; clears it. */
#define CHECK_ERR(status, ...)                                                                     \
  do {                                                                                             \
    CHECK_MSG(tg_last_status() == (status), "status %d, expected %d (%s)", (int)tg_last_status(),  \
              (int)(status), tg_last_error() ? tg_last_error() : "no error");                      \
    const char *tt_needles[] = {"", __VA_ARGS__};                                                  \
    for (size_t tt_i = 0; tt_i < sizeof tt_needles / sizeof tt_needles[0]; tt_i++)                 \
      CHECK_STR_CONTAINS(tg_last_error(), tt_needles[tt_i]);                                       \
    tg_clear_error();                                                                              \
  } while (0)

/* Seconds on the monotonic clock, for tests that bound how long something takes. */
static inline double tt_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A temporary directory for a test binary's files, made on first use (under $TMPDIR or /tmp);
 * tpath(name) is a path inside it, valid for the next 31 calls; tmpdir_remove() deletes it. */
static inline char *tt_dir_buf(void) {
  static char d[256];
  return d;
}
static inline const char *tmpdir(void) {
  char *d = tt_dir_buf();
  if (!d[0]) {
    snprintf(d, 256, "%s/tg-test-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(d)) {
      perror("mkdtemp");
      exit(2);
    }
  }
  return d;
}
static inline const char *tpath(const char *name) {
  static char buf[32][512];
  static int k;
  char *p = buf[k++ % 32];
  snprintf(p, 512, "%s/%s", tmpdir(), name);
  return p;
}
/* The whole file at path (malloc'd, *n bytes, followed by a NUL so text can be searched), or NULL
 * if it cannot be opened. */
static inline void *tt_read_file(const char *path, size_t *n) {
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc(len > 0 ? (size_t)len + 1 : 1);
  if (b) {
    *n = len > 0 ? fread(b, 1, (size_t)len, f) : 0;
    b[*n] = '\0';
  }
  fclose(f);
  return b;
}
/* What the process writes to stderr (fd 2, C's stderr included) between tt_stderr_begin() and
 * tt_stderr_end(), which returns it (malloc'd, NUL-terminated; "" if it could not be captured).
 * One capture at a time. */
typedef struct {
  FILE *file;
  int saved;
} tt_capture;
static inline tt_capture *tt_cap(void) {
  static tt_capture c = {NULL, -1};
  return &c;
}
static inline void tt_stderr_begin(void) {
  tt_capture *c = tt_cap();
  fflush(stderr);
  c->file = tmpfile();
  c->saved = c->file ? dup(2) : -1;
  if (c->saved >= 0) dup2(fileno(c->file), 2);
}
static inline char *tt_stderr_end(void) {
  tt_capture *c = tt_cap();
  fflush(stderr);
  if (c->saved >= 0) dup2(c->saved, 2), close(c->saved);
  c->saved = -1;
  if (!c->file) return calloc(1, 1);
  fseek(c->file, 0, SEEK_END);
  long n = ftell(c->file);
  char *out = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
  rewind(c->file);
  if (n > 0 && fread(out, 1, (size_t)n, c->file) != (size_t)n) out[0] = '\0';
  fclose(c->file);
  c->file = NULL;
  return out;
}

static inline void tmpdir_remove(void) {
  char *d = tt_dir_buf(), cmd[600];
  if (!d[0]) return;
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", d);
  d[0] = 0;
}

#endif
