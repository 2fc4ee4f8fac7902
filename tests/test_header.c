/*
 * test_header.c -- include/tinygrad.h is a clean C11 header: this file compiles with
 * -std=c11 -Wall -Wextra -Werror -pedantic under gcc and clang (tests/run_tests.sh does that) and links
 * against the library. It also serves as the program the install check builds with pkg-config.
 * It expands the C-only helper macros (TG_SHAPE, TG_AXES, TG_OPTS) without running any kernel.
 */
#include <stdio.h>
#include <string.h>

#include "tinygrad.h"

static int count_shape(const int64_t *shape, int ndim) {
  return shape && ndim == 2 && shape[1] == 3 ? ndim : -1;
}
static int count_axes(const int *axes, int naxes) { return axes && naxes == 3 && axes[2] == -1 ? naxes : -1; }

int main(void) {
  int passed = 0, failed = 0;
#define EXPECT(c)                                                                                            \
  do {                                                                                                       \
    if (c) {                                                                                                 \
      passed++;                                                                                              \
    } else {                                                                                                 \
      failed++;                                                                                              \
      fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);                                         \
    }                                                                                                        \
  } while (0)

  const char *name = tg_dtype_name(TG_FLOAT32);
  EXPECT(name != NULL && strcmp(name, "float") == 0);
  EXPECT(tg_live_count() == 0);
  EXPECT(count_shape(TG_SHAPE(2, 3)) == 2);
  EXPECT(count_axes(TG_AXES(0, 1, -1)) == 3);
  const tg_opts *opts = TG_OPTS(.dtype = TG_INT32, .requires_grad = true);
  EXPECT(opts->dtype == TG_INT32 && opts->device == NULL && opts->requires_grad == 1);
  /* the option macros start from tinygrad's defaults; a designator overrides one, 0 included */
  EXPECT(TG_OPTS()->requires_grad == TG_GRAD_UNSET && TG_OPTS(.requires_grad = false)->requires_grad == 0);
  const tg_adamw_opts *aw = TG_ADAMW_OPTS(.weight_decay = 0, .lr = 0);
  EXPECT(aw->lr == 0 && aw->b1 == 0.9 && aw->b2 == 0.999 && aw->eps == 1e-8 && aw->weight_decay == 0);
  EXPECT(TG_LAMB_OPTS()->eps == 1e-6 && TG_LARS_OPTS(.classic = false)->momentum == 0.9 && !TG_LARS_OPTS(.classic = false)->classic);
  EXPECT(TG_POOL2D_OPTS(.kernel_size = {3})->kernel_size[1] == 0 && TG_POOL2D_OPTS()->kernel_size[1] == 2);
  EXPECT(TG_BATCHNORM_OPTS(.momentum = 0)->momentum == 0 && TG_BATCHNORM_OPTS()->track_running_stats);
  EXPECT(strlen(TG_VERSION) > 0);
  EXPECT(TG_JIT_OPTS(.prune = true)->prune);
  EXPECT(TG_JIT_EXPORT_OPTS(.name = "net")->name[0] == 'n' && !TG_JIT_EXPORT_OPTS(.name = "net")->weights_path);

  printf("test_header: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
