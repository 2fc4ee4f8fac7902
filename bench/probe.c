/*
 * probe.c -- the machine's limits, for the benchmarks to print their results against: the FP32 FMA
 * peak (GFLOPS) and the memory bandwidth of a triad (GB/s), each on every online CPU (or THREADS).
 *
 *   build/bench/probe          prints "fma_gflops <v> threads <n> isa <avx512|avx2|scalar>" and
 *                              "triad_gbs <v> threads <n>"
 *
 * The FMA probe runs 12 independent chains of vector FMAs per thread (enough to cover the FMA
 * latency on two pipes), with the widest vectors the CPU has, chosen at run time (cpuid through
 * __builtin_cpu_supports), so one binary is right on an AVX-512, an AVX2 or another machine. The triad
 * is a[i] = b[i] + 2 c[i] over three 256 MB arrays, each thread on its own slice (first touched by
 * that thread), best of 5; it counts 12 bytes an element (no write-allocate traffic).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { CHAINS = 12 };
#define ITERS 60000000L

typedef struct {
  int isa;      /* 2 avx512, 1 avx2, 0 scalar */
  double flops; /* done by this thread */
  float sink;
  pthread_barrier_t *bar;
} FmaJob;

/* twelve named accumulators: an array indexed in a loop may be kept in memory, and then the
 * store-to-load latency, not the FMA units, sets the pace */
#define CHAIN12(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float fma512(long iters) {
  __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
#define DECL(c) __m512 x##c = _mm512_set1_ps((float)c);
#define STEP(c) x##c = _mm512_fmadd_ps(x##c, m, a);
#define SUM(c) s = _mm512_add_ps(s, x##c);
  CHAIN12(DECL)
  for (long i = 0; i < iters; i++) {
    CHAIN12(STEP)
    __asm__ volatile("" ::: "memory");
  }
  __m512 s = _mm512_setzero_ps();
  CHAIN12(SUM)
  return _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}

__attribute__((target("avx2,fma"))) static float fma256(long iters) {
  __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
#define DECL(c) __m256 x##c = _mm256_set1_ps((float)c);
#define STEP(c) x##c = _mm256_fmadd_ps(x##c, m, a);
#define SUM(c) s = _mm256_add_ps(s, x##c);
  CHAIN12(DECL)
  for (long i = 0; i < iters; i++) {
    CHAIN12(STEP)
    __asm__ volatile("" ::: "memory");
  }
  __m256 s = _mm256_setzero_ps();
  CHAIN12(SUM)
  float v[8];
  _mm256_storeu_ps(v, s);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
#undef DECL
#undef STEP
#undef SUM
}
#endif

static float fma_scalar(long iters) {
  float acc[CHAINS];
  for (int c = 0; c < CHAINS; c++) acc[c] = (float)c;
  for (long i = 0; i < iters; i++)
    for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * 0.999999f + 1e-7f;
  float s = 0;
  for (int c = 0; c < CHAINS; c++) s += acc[c];
  return s;
}

static int lanes(int isa) { return isa == 2 ? 16 : isa == 1 ? 8 : 1; }

static void *fma_thread(void *arg) {
  FmaJob *j = arg;
  long iters = j->isa == 0 ? ITERS / 8 : ITERS;
  pthread_barrier_wait(j->bar);
#if defined(__x86_64__)
  if (j->isa == 2) j->sink = fma512(iters);
  else if (j->isa == 1) j->sink = fma256(iters);
  else
#endif
    j->sink = fma_scalar(iters);
  j->flops = 2.0 * CHAINS * lanes(j->isa) * (double)iters;
  return NULL;
}

typedef struct {
  float *a, *b, *c;
  size_t n;
  int reps;
  double best;
  pthread_barrier_t *bar;
} TriadJob;

static void *triad_thread(void *arg) {
  TriadJob *j = arg;
  for (size_t i = 0; i < j->n; i++) j->a[i] = 0, j->b[i] = (float)(i & 255), j->c[i] = 1.0f;
  for (int r = 0; r < j->reps; r++) {
    pthread_barrier_wait(j->bar);
    double t0 = now();
    for (size_t i = 0; i < j->n; i++) j->a[i] = j->b[i] + 2.0f * j->c[i];
    pthread_barrier_wait(j->bar);
    double t = now() - t0;
    if (r == 0 || t < j->best) j->best = t;
  }
  return NULL;
}

int main(void) {
  long nth = sysconf(_SC_NPROCESSORS_ONLN);
  const char *env = getenv("THREADS");
  if (env && atoi(env) > 0) nth = atoi(env);
  if (nth < 1) nth = 1;
  if (nth > 256) nth = 256;
  int isa = 0;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) isa = 2;
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isa = 1;
#endif
  pthread_t th[256];
  pthread_barrier_t bar;

  /* FMA peak: the best of 3 timed runs of all threads at once */
  FmaJob fj[256];
  double best = 0;
  float sink = 0;
  for (int rep = 0; rep < 3; rep++) {
    pthread_barrier_init(&bar, NULL, (unsigned)nth + 1);
    for (long t = 0; t < nth; t++) {
      fj[t] = (FmaJob){.isa = isa, .bar = &bar};
      pthread_create(&th[t], NULL, fma_thread, &fj[t]);
    }
    pthread_barrier_wait(&bar);
    double t0 = now();
    double flops = 0;
    for (long t = 0; t < nth; t++) {
      pthread_join(th[t], NULL);
      flops += fj[t].flops;
      sink += fj[t].sink;
    }
    double g = flops / (now() - t0) * 1e-9;
    if (g > best) best = g;
    pthread_barrier_destroy(&bar);
  }
  printf("fma_gflops %.1f threads %ld isa %s\n", best, nth, isa == 2 ? "avx512" : isa == 1 ? "avx2" : "scalar");
  if (sink == 12345.0f) printf("(sink)\n");

  /* triad: 3 x 256 MB, each thread on its slice */
  size_t n = (size_t)64 << 20;
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
  if (!a || !b || !c) {
    fprintf(stderr, "probe: out of memory for the triad's 768 MB\n");
    return 1;
  }
  TriadJob tj[256];
  pthread_barrier_init(&bar, NULL, (unsigned)nth);
  size_t per = n / (size_t)nth;
  for (long t = 0; t < nth; t++) {
    size_t lo = (size_t)t * per, len = t == nth - 1 ? n - lo : per;
    tj[t] = (TriadJob){.a = a + lo, .b = b + lo, .c = c + lo, .n = len, .reps = 5, .bar = &bar};
    pthread_create(&th[t], NULL, triad_thread, &tj[t]);
  }
  double worst = 0;
  for (long t = 0; t < nth; t++) {
    pthread_join(th[t], NULL);
    if (tj[t].best > worst) worst = tj[t].best; /* the slowest slice bounds the whole triad */
  }
  pthread_barrier_destroy(&bar);
  printf("triad_gbs %.1f threads %ld\n", 12.0 * (double)n / worst * 1e-9, nth);
  free(a), free(b), free(c);
  return 0;
}
