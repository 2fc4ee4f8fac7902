/*
 * allreduce.c -- the multi-device allreduce (a sum over the sharded axis) on 2 and 4 CPU devices,
 * naive (RING=0) against ring (RING=2), against a memcpy of the same bytes, measured in one run.
 * Each device holds ALLREDUCE_N float32 elements (default 4M = 16 MB); the figure is the reduced
 * buffer's bytes per second ("algorithm bandwidth", GB/s), best of 5 after a warm-up.
 *
 *   ./build/bench/allreduce        prints "devices=<n> naive=<GB/s> ring=<GB/s> memcpy=<GB/s>"
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

static double run(const char *const *devs, int n, int64_t len, int ring) {
  tg_context_begin();
  tg_context_set_int("RING", ring);
  tg_scope_begin();
  tg_tensor x = tg_shard(tg_rand(TG_SHAPE(n, len), NULL), devs, n, 0);
  double best = 1e30;
  if (tg_realize(x) == TG_OK)
    for (int it = 0; it < 6; it++) {
      tg_scope_begin();
      tg_tensor s = tg_sum(x, (int[]){0}, 1, false);
      double t0 = now();
      if (tg_realize(s) != TG_OK) break;
      tg_synchronize(devs[0]);
      double t = now() - t0;
      if (it > 0 && t < best) best = t;
      tg_scope_end();
    }
  tg_scope_end();
  tg_context_end();
  return (double)len * 4 / best * 1e-9;
}

int main(void) {
  int64_t len = tg_getenv_int("ALLREDUCE_N", 4 << 20);
  const char *devs[] = {"CPU:0", "CPU:1", "CPU:2", "CPU:3"};
  size_t bytes = (size_t)len * 4;
  char *a = malloc(bytes), *b = malloc(bytes);
  memset(a, 1, bytes), memset(b, 0, bytes);
  double mc = 1e30;
  for (int it = 0; it < 6; it++) {
    double t0 = now();
    memcpy(b, a, bytes);
    double t = now() - t0;
    if (it > 0 && t < mc) mc = t;
  }
  printf("elements per device %lld (%.1f MB)\n", (long long)len, (double)bytes / 1e6);
  for (int n = 2; n <= 4; n += 2) {
    double nv = run(devs, n, len, 0), rg = run(devs, n, len, 2);
    printf("devices=%d naive=%.2f ring=%.2f memcpy=%.2f GB/s  (naive/memcpy %.2f, ring/memcpy %.2f)\n", n, nv, rg,
           (double)bytes / mc * 1e-9, nv * mc * 1e9 / (double)bytes, rg * mc * 1e9 / (double)bytes);
  }
  free(a), free(b);
  return 0;
}
