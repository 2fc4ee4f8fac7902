/*
 * conv.c -- the four convolutions of beautiful_mnist (batch 512), forward and backward, in
 * tinygrad.c. Prints "name fwd_ms bwd_ms" lines (best of several runs, compile excluded);
 * bench/conv.py runs the same convolutions in PyTorch and prints the ratios.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <tinygrad.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int bench(const char *name, int64_t bs, int64_t cin, int64_t hw, int64_t cout, int64_t k) {
  tg_scope_begin();
  tg_tensor x = tg_contiguous(tg_rand(TG_SHAPE(bs, cin, hw, hw), NULL));
  tg_tensor w = tg_set_requires_grad(tg_contiguous(tg_rand(TG_SHAPE(cout, cin, k, k), NULL)), true);
  tg_set_requires_grad(x, true);
  if (tg_realize(x) != TG_OK || tg_realize(w) != TG_OK) return 1;
  double fwd = 1e30, bwd = 1e30;
  for (int it = 0; it < 5; it++) {
    tg_scope_begin();
    tg_tensor y = tg_conv2d(x, w, (tg_tensor){0}, NULL);
    double t0 = now();
    if (tg_realize(y) != TG_OK) return 1;
    double t1 = now();
    /* backward of sum(y * r) for a fixed random r: both input and weight gradients */
    tg_tensor y2 = tg_conv2d(x, w, (tg_tensor){0}, NULL);
    tg_tensor r = tg_rand_like(y2, NULL);
    tg_realize(r);
    tg_zero_grad(x), tg_zero_grad(w);
    if (tg_backward(tg_sum(tg_mul(y2, r), TG_ALL_AXES, false)) != TG_OK) return 1;
    tg_tensor g[2] = {tg_grad(x), tg_grad(w)};
    double t2 = now();
    if (tg_realize_many(g, 2) != TG_OK) return 1;
    double t3 = now();
    if (it > 0) {
      if (t1 - t0 < fwd) fwd = t1 - t0;
      if (t3 - t2 < bwd) bwd = t3 - t2;
    }
    tg_scope_end();
  }
  printf("%s %.3f %.3f\n", name, fwd * 1e3, bwd * 1e3);
  fflush(stdout);
  tg_scope_end();
  return 0;
}

int main(void) {
  int rc = 0;
  rc |= bench("conv1_1x28_32k5", 512, 1, 28, 32, 5);
  rc |= bench("conv2_32x24_32k5", 512, 32, 24, 32, 5);
  rc |= bench("conv3_32x10_64k3", 512, 32, 10, 64, 3);
  rc |= bench("conv4_64x8_64k3", 512, 64, 8, 64, 3);
  if (rc) fprintf(stderr, "error: %s\n", tg_last_error());
  return rc;
}
