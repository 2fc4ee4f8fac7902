/*
 * dispatch.c -- un-JIT'd dispatch cost: build and realize ((a+1)*2).relu().sum() on a 16x16 tensor
 * N times with the kernel already compiled, and print microseconds per realize. bench/dispatch.py runs
 * this and PyTorch eager (and tinygrad, when installed) side by side and prints the ratios.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <tinygrad.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 1000;
  float data[256];
  for (int i = 0; i < 256; i++) data[i] = (float)(i % 17) - 8.0f;
  tg_tensor a = tg_persist(tg_from_data(data, TG_SHAPE(16, 16), NULL));
  double best = 1e9, check = 0;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now();
    for (int i = 0; i < iters + 1; i++) {
      if (i == 1) t0 = now(); /* the first iteration compiles (or loads the cached kernel) */
      tg_scope_begin();
      tg_tensor r = tg_sum(tg_relu(tg_mul_s(tg_add_s(a, 1), 2)), TG_ALL_AXES, false);
      if (tg_realize(r) != TG_OK) {
        fprintf(stderr, "error: %s\n", tg_last_error());
        return 1;
      }
      if (i == iters) tg_item(r, &check);
      tg_scope_end();
    }
    double us = (now() - t0) / iters * 1e6;
    if (us < best) best = us;
  }
  printf("tinygrad.c dispatch: %.2f us/realize (result %.1f, live handles %zu)\n", best, check, tg_live_count() - 1);
  tg_free(a);
  return 0;
}
