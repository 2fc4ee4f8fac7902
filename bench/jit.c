/*
 * jit.c -- TinyJit replay cost: a jitted one-kernel function, ((x+1)*2).relu() on a 16x16 input,
 * called N times after its capture, and the microseconds per call. The kernel's own work is a few
 * nanoseconds, so the figure is what a replay costs beyond it: checking the inputs, binding their
 * buffers, launching the kernel and handing the output back. bench/jit.py runs this beside tinygrad's
 * TinyJit and PyTorch (eager and torch.jit) and prints the ratios.
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

static tg_status step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                      void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = tg_relu(tg_mul_s(tg_add_s(in[0], 1), 2));
  return TG_OK;
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 10000;
  if (iters < 1) iters = 1;
  float data[256];
  for (int i = 0; i < 256; i++) data[i] = (float)(i % 17) - 8.0f;
  tg_tensor x = tg_persist(tg_from_data(data, TG_SHAPE(16, 16), NULL));
  if (tg_realize(x) != TG_OK) return fprintf(stderr, "error: %s\n", tg_last_error()), 1;
  tg_jit *j = tg_jit_new(step, 1, NULL);
  tg_counters c0 = tg_global_counters();
  double best = 1e9, check = 0;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now();
    for (int i = 0; i < iters + 2; i++) {
      if (rep == 0 && i == 2) c0 = tg_global_counters(), t0 = now(); /* calls 0 and 1 run and capture */
      else if (rep > 0 && i == 0) t0 = now();
      if (rep > 0 && i >= iters) break;
      tg_scope_begin();
      tg_tensor out;
      if (tg_jit_call(j, &x, 1, NULL, 0, &out) != TG_OK) return fprintf(stderr, "error: %s\n", tg_last_error()), 1;
      if (rep == 4 && i == iters - 1) {
        float v[256];
        if (tg_data(out, v, sizeof v) != TG_OK) return fprintf(stderr, "error: %s\n", tg_last_error()), 1;
        check = 0;
        for (int k = 0; k < 256; k++) check += v[k];
      }
      tg_scope_end();
    }
    double us = (now() - t0) / iters * 1e6;
    if (us < best) best = us;
  }
  tg_counters c1 = tg_global_counters();
  uint64_t calls = (uint64_t)iters * 5;
  printf("tinygrad.c TinyJit replay: %.2f us/call (%.2f kernels a call, result %.1f, live handles %zu)\n", best,
         (double)(c1.kernel_count - c0.kernel_count) / (double)calls, check, tg_live_count() - 1);
  tg_jit_free(j);
  tg_free(x);
  return 0;
}
