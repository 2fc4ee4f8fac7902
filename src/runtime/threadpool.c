/*
 * threadpool.c -- persistent workers that split one range job at a time.
 *
 * In: a range function, its argument, a length n and a thread count. Out: fn has been called on
 * contiguous chunks covering [0, n) exactly once each, when tp_parallel_for returns.
 *
 * Protocol (one job in flight, guarded by `submit`):
 *  - The submitter writes the job fields, then `claim` = (gen << 32 | 0), then bumps the futex word
 *    `gen`. Workers spin on `gen` for a short while (dispatch latency of a few microseconds), then
 *    sleep in futex_wait so an idle process burns no CPU.
 *  - Every participant (the caller included) takes chunks by CAS on `claim`; a CAS only succeeds
 *    while the claim word still carries the generation the participant saw, so a worker that wakes
 *    late can never run a chunk of a newer job with stale fields (or vice versa).
 *  - `remaining` counts unfinished chunks; the caller waits for it to reach 0 (spin, then futex),
 *    then closes the job by setting the chunk index to CLOSED before any field is rewritten.
 * If a worker is slow to wake, the caller simply claims its chunk too: latency never depends on a
 * sleeping thread being scheduled.
 */
#include "threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../helpers.h"

/* How long an idle thread polls before sleeping: long enough to bridge the host-side gap between
 * two kernels of one schedule, short enough not to hog a core of a shared machine. The first
 * SPIN_PURE_NS of it is a pure busy-wait, the rest yields between polls. */
#define SPIN_NS 100000
#define SPIN_PURE_NS 10000
#define CLOSED 0xffffffffu

typedef struct {
  _Alignas(64) _Atomic uint32_t gen;   /* futex word, bumped once per job */
  _Atomic int sleepers;                /* workers blocked on gen */
  _Alignas(64) _Atomic uint64_t claim; /* gen << 32 | next chunk index (CLOSED once done) */
  _Atomic(tp_range_fn) fn;
  _Atomic(void **) arg;
  _Atomic int64_t n;
  _Atomic uint32_t nchunks;
  _Alignas(64) _Atomic uint32_t remaining; /* futex word for the submitter */
  _Atomic int caller_waiting;
  _Alignas(64) pthread_mutex_t submit;
  int nthreads; /* including the submitting thread */
  pthread_t *threads;
} Pool;

static _Atomic(Pool *) g_pool;
/* Pools abandoned in a forked child (their workers do not exist there); kept reachable. */
static Pool *g_orphan_pool;
static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_max_threads;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One step of a spin-wait that began at t0; false once the window is over. Busy-waits first (the
 * fastest hand-off), then yields, so that with more threads than free cores the spinning thread
 * gives its core to the one it waits for. */
static inline bool spin_step(int64_t t0, unsigned it, int64_t *now) {
  if ((it & 31) == 0) *now = mono_ns();
  if (*now - t0 < SPIN_PURE_NS)
    cpu_relax();
  else
    sched_yield();
  return *now - t0 < SPIN_NS;
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int count) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

int tp_threads_setting(int64_t want, long ncpu) {
  if (ncpu <= 0) ncpu = 1;
  if (want < 1) {
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)want);
    env_warn("THREADS", v, "at least one thread", "1");
    want = 1;
  }
  /* more threads than 8 per CPU only add switching (and THREADS=1000000000 asked the pool for a
   * billion threads): capped, with a warning */
  int64_t cap = 8 * (int64_t)ncpu < 256 ? 256 : 8 * (int64_t)ncpu;
  if (want > cap) {
    char v[32], m[32];
    snprintf(v, sizeof v, "%lld", (long long)want);
    snprintf(m, sizeof m, "%lld", (long long)cap);
    env_warn("THREADS", v, "more threads than the pool takes: at most 8 per CPU, or 256", m);
    want = cap;
  }
  return (int)want;
}

int tp_max_threads(void) {
  int t = atomic_load_explicit(&g_max_threads, memory_order_relaxed);
  if (t > 0) return t;
  /* CPUs this process may run on (taskset, cpusets), not every CPU of the machine. */
  cpu_set_t set;
  long ncpu = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (ncpu <= 0) ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu <= 0) ncpu = 1;
  t = tp_threads_setting(getenv_int("THREADS", ncpu), ncpu);
  atomic_store(&g_max_threads, t);
  return t;
}

/* Chunk i of k over [0, n): sizes differ by at most one, no overflow for any n. */
static inline void chunk_bounds(int64_t n, uint32_t k, uint32_t i, int64_t *lo, int64_t *hi) {
  int64_t q = n / k, r = n % k;
  *lo = q * i + (i < r ? (int64_t)i : r);
  *hi = *lo + q + (i < r ? 1 : 0);
}

/* Claims and runs chunks of job `g` until none is left or the job is no longer `g`. */
static void run_chunks(Pool *p, uint32_t g) {
  /* Loaded before the CAS: valid because a successful CAS on (g, i) proves job g was still open,
   * and fields of a newer job are only written after job g was closed (release/acquire chain). */
  uint32_t nch = atomic_load_explicit(&p->nchunks, memory_order_acquire);
  tp_range_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
  void **arg = atomic_load_explicit(&p->arg, memory_order_acquire);
  int64_t n = atomic_load_explicit(&p->n, memory_order_acquire);
  uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(c >> 32) != g) return;
    uint32_t i = (uint32_t)c;
    if (i >= nch) return;
    if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel,
                                               memory_order_acquire))
      continue;
    int64_t lo, hi;
    chunk_bounds(n, nch, i, &lo, &hi);
    if (hi > lo) fn(arg, lo, hi);
    if (atomic_fetch_sub(&p->remaining, 1) == 1 && atomic_load(&p->caller_waiting))
      futex_wake(&p->remaining, 1);
    c = atomic_load_explicit(&p->claim, memory_order_acquire);
  }
}

static void *worker_main(void *vp) {
  Pool *p = vp;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
    if (g == seen) {
      int64_t t0 = mono_ns(), now = t0;
      for (unsigned it = 1; (g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen; it++)
        if (!spin_step(t0, it, &now)) break;
      if (g == seen) {
        atomic_fetch_add(&p->sleepers, 1);
        while ((g = atomic_load(&p->gen)) == seen) futex_wait(&p->gen, seen);
        atomic_fetch_sub(&p->sleepers, 1);
      }
    }
    seen = g;
    run_chunks(p, g);
  }
  return NULL;
}

static void pool_forget_after_fork(void) {
  /* The child has only the forking thread: the old pool's workers are gone and its lock may be
   * held. Start over lazily; keep the old struct reachable rather than touching its state. */
  g_orphan_pool = atomic_load(&g_pool);
  atomic_store(&g_pool, NULL);
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  g_pool_lock = fresh;
}

static Pool *pool_get(void) {
  Pool *p = atomic_load_explicit(&g_pool, memory_order_acquire);
  if (p) return p;
  pthread_mutex_lock(&g_pool_lock);
  p = atomic_load(&g_pool);
  if (!p) {
    static bool atfork_done;
    if (!atfork_done) {
      pthread_atfork(NULL, NULL, pool_forget_after_fork);
      atfork_done = true;
    }
    p = tg_xcalloc(1, sizeof *p);
    pthread_mutex_init(&p->submit, NULL);
    int want = tp_max_threads();
    p->threads = tg_xcalloc((size_t)want, sizeof(pthread_t));
    /* Workers never handle signals: they belong to the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = 0;
    for (int i = 1; i < want; i++) {
      if (pthread_create(&p->threads[started], NULL, worker_main, p) != 0) break;
      pthread_detach(p->threads[started]);
      started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    p->nthreads = started + 1;
    atomic_store_explicit(&g_pool, p, memory_order_release);
  }
  pthread_mutex_unlock(&g_pool_lock);
  return p;
}

void tp_parallel_for(tp_range_fn fn, void **arg, int64_t n, int nthreads) {
  if (n <= 0) return;
  int maxt = tp_max_threads();
  if (nthreads <= 0 || nthreads > maxt) nthreads = maxt;
  if (nthreads > n) nthreads = (int)n;
  if (nthreads <= 1) {
    fn(arg, 0, n);
    return;
  }
  Pool *p = pool_get();
  if (nthreads > p->nthreads) nthreads = p->nthreads;
  if (nthreads <= 1 || pthread_mutex_trylock(&p->submit) != 0) {
    fn(arg, 0, n);
    return;
  }
  uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
  uint32_t nch = (uint32_t)nthreads;
  atomic_store_explicit(&p->fn, fn, memory_order_release);
  atomic_store_explicit(&p->arg, arg, memory_order_release);
  atomic_store_explicit(&p->n, n, memory_order_release);
  atomic_store_explicit(&p->nchunks, nch, memory_order_release);
  atomic_store_explicit(&p->remaining, nch, memory_order_relaxed);
  atomic_store_explicit(&p->claim, (uint64_t)g << 32, memory_order_release);
  atomic_store(&p->gen, g);
  if (atomic_load(&p->sleepers) > 0) futex_wake(&p->gen, (int)nch - 1);

  run_chunks(p, g);

  if (atomic_load_explicit(&p->remaining, memory_order_acquire) != 0) {
    int64_t t0 = mono_ns(), now = t0;
    for (unsigned it = 1; atomic_load_explicit(&p->remaining, memory_order_acquire) != 0; it++)
      if (!spin_step(t0, it, &now)) break;
    uint32_t r;
    if (atomic_load(&p->remaining) != 0) {
      atomic_store(&p->caller_waiting, 1);
      while ((r = atomic_load(&p->remaining)) != 0) futex_wait(&p->remaining, r);
      atomic_store(&p->caller_waiting, 0);
    }
  }
  atomic_store_explicit(&p->claim, ((uint64_t)g << 32) | CLOSED, memory_order_release);
  pthread_mutex_unlock(&p->submit);
}

double tp_run_kernel(tp_range_fn fn, void **bufs, const int64_t *global_size, const int64_t *local_size, bool wait) {
  int64_t n = global_size ? global_size[0] : 1;
  int64_t nt = local_size ? local_size[0] : 0;
  int nthreads = nt > 0 && nt < INT32_MAX ? (int)nt : 0;
  double t0 = wait ? now_seconds() : 0;
  tp_parallel_for(fn, bufs, n, nthreads);
  return wait ? now_seconds() - t0 : 0.0;
}
