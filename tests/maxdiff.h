/*
 * maxdiff.h -- the largest absolute difference between two tensors' elements, compared as float32
 * (INFINITY when their sizes differ or either cannot be read; a NaN on either side counts as
 * infinitely far). For tests that compare a device's or a sharded result with the CPU's.
 */
#ifndef TG_TEST_MAXDIFF_H
#define TG_TEST_MAXDIFF_H

#include <math.h>
#include <stdlib.h>
#include <tinygrad.h>

static inline double tensor_maxdiff(tg_tensor a, tg_tensor b) {
  int64_t n = tg_numel(a);
  if (n != tg_numel(b) || n < 0) return INFINITY;
  float *x = malloc(sizeof(float) * (size_t)(n + 1)), *y = malloc(sizeof(float) * (size_t)(n + 1));
  tg_tensor ac = tg_cast(a, TG_FLOAT32), bc = tg_cast(b, TG_FLOAT32);
  double m = INFINITY;
  if (tg_data(ac, x, sizeof(float) * (size_t)n) == TG_OK && tg_data(bc, y, sizeof(float) * (size_t)n) == TG_OK) {
    m = 0;
    for (int64_t i = 0; i < n; i++) {
      double d = fabs((double)x[i] - (double)y[i]);
      if (!(d <= m)) m = d;
    }
  }
  free(x), free(y);
  return m;
}

#endif
