/*
 * threadpool.h -- a process-wide pool of persistent worker threads for CPU kernels.
 *
 * tp_parallel_for(fn, arg, n, nthreads) runs fn(arg, start, end) over [0, n) split into nthreads
 * contiguous chunks; the calling thread runs chunks too and the call returns when all are done.
 * The range function has exactly the CPU kernel ABI, so kernels are dispatched without a trampoline.
 */
#ifndef TG_THREADPOOL_H
#define TG_THREADPOOL_H

#include <stdbool.h>
#include <stdint.h>

typedef void (*tp_range_fn)(void **arg, int64_t start, int64_t end);

/* Threads the pool can use including the caller: THREADS, else the number of online CPUs. Read once. */
int tp_max_threads(void);
/* The pool size THREADS=want asks for on a process with ncpu CPUs: at least 1, at most
 * max(8 * ncpu, 256) (a larger value is reported on stderr once and capped). */
int tp_threads_setting(int64_t want, long ncpu);

/* Runs fn over [0, n) with up to nthreads threads (<= 0 or more than tp_max_threads(): all of
 * them). Synchronous. Re-entrant: a call made while the pool is busy (another thread, or a kernel
 * calling back in) runs on the calling thread alone instead of waiting. */
void tp_parallel_for(tp_range_fn fn, void **arg, int64_t n, int nthreads);

/* A CPU kernel launch as every CPU renderer's kernels take it: fn over [0, global_size[0]) (1 when
 * NULL) on local_size[0] threads (the kernel's thread hint; 0 or none: all). Returns the seconds it
 * took when wait is set, else 0. */
double tp_run_kernel(tp_range_fn fn, void **bufs, const int64_t *global_size, const int64_t *local_size, bool wait);

#endif
