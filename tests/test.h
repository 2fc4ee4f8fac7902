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
  return failed ? 1 : 0;
}
#define RUN_TESTS() tt_run(__FILE__)

#endif
