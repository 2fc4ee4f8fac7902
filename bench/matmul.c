/*
 * matmul.c -- fp32 N x N matmul throughput of tinygrad.c with the default (hand-coded) kernel opts.
 * Usage: matmul N [N ...]; prints "N GFLOPS" lines (best of several runs, kernel compiled first).
 * bench/matmul.py runs it beside OpenBLAS (numpy) and PyTorch and prints the ratios.
 * MATMUL_GPU_OPTS=<Opt list> applies that list (GPU_OPTS) to the matmul kernel alone, to time one
 * choice of GPU optimizations (DEV=CL MATMUL_GPU_OPTS=UPCAST:1:16,UPCAST:0:8 build/bench/matmul 1024).
 * MATMUL_DTYPE=float16 or bfloat16: operands and result in that dtype, products summed in float32
 * (what a half matmul on tensor cores computes, and PyTorch's a.half() @ b.half() on CUDA).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <tinygrad.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  const char *dts = getenv("MATMUL_DTYPE");
  tg_dtype dt = TG_FLOAT32;
  if (dts && *dts) {
    if (!strcmp(dts, "float16") || !strcmp(dts, "half")) dt = TG_FLOAT16;
    else if (!strcmp(dts, "bfloat16")) dt = TG_BFLOAT16;
    else if (strcmp(dts, "float32") && strcmp(dts, "float")) {
      fprintf(stderr, "matmul: MATMUL_DTYPE '%s' is not float32, float16 or bfloat16\n", dts);
      return 2;
    }
  }
  for (int ai = 1; ai < argc; ai++) {
    int64_t n = atoll(argv[ai]);
    tg_scope_begin();
    tg_tensor a = tg_cast(tg_rand(TG_SHAPE(n, n), NULL), dt), b = tg_cast(tg_rand(TG_SHAPE(n, n), NULL), dt);
    if (tg_realize(a) != TG_OK || tg_realize(b) != TG_OK) {
      fprintf(stderr, "error: %s\n", tg_last_error());
      return 1;
    }
    double best = 1e30, budget = now() + 4.0;
    for (int it = 0; it < 20 && (it < 3 || now() < budget); it++) {
      tg_scope_begin();
      tg_tensor c = dt == TG_FLOAT32 ? tg_matmul(a, b) : tg_cast(tg_matmul_dtype(a, b, TG_FLOAT32), dt);
      const char *gopts = getenv("MATMUL_GPU_OPTS");
      tg_context_begin();
      if (gopts && *gopts) tg_context_set("GPU_OPTS", gopts);
      double t0 = now();
      /* a GPU device queues the kernel: the time is until it has finished */
      if (tg_realize(c) != TG_OK || tg_synchronize(NULL) != TG_OK) {
        fprintf(stderr, "error: %s\n", tg_last_error());
        tg_context_end();
        return 1;
      }
      double t = now() - t0;
      tg_context_end();
      if (it > 0 && t < best) best = t; /* run 0 compiles */
      tg_scope_end();
    }
    printf("%lld %.2f\n", (long long)n, 2.0 * (double)n * (double)n * (double)n / best * 1e-9);
    fflush(stdout);
    tg_scope_end();
  }
  return 0;
}
