/*
 * allreduce_mpi.c -- tg_dist_allreduce against a plain MPI_Allreduce of the same float32 buffer,
 * measured alternately in one run under mpirun (each rank holds ALLREDUCE_N elements, default 4M =
 * 16 MB); the figure is the reduced buffer's bytes per second, best of 7 after a warm-up.
 *
 *   mpirun --oversubscribe -np 2 build/bench/allreduce_mpi
 *   (as root: add --allow-run-as-root)
 *
 * Rank 0 prints "ranks=<n> tinygrad.c=<GB/s> MPI_Allreduce=<GB/s> ratio=<tinygrad.c / MPI>". The
 * plain call goes to the libmpi the library opened (the same process-wide MPI), found with dlsym.
 */
#include <dlfcn.h>
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

typedef int (*allreduce_fn)(const void *, void *, int, void *, void *, void *);
typedef int (*barrier_fn)(void *);

int main(void) {
  if (tg_dist_init() != TG_OK) {
    fprintf(stderr, "allreduce_mpi: %s\n", tg_last_error());
    return 1;
  }
  /* the libmpi tg_dist_init opened: dlopen of the same name returns it */
  const char *names[] = {getenv("TG_LIBMPI"), "libmpi.so.40", "libmpi.so", NULL};
  void *lib = NULL;
  for (int i = 0; i < 3 && !lib; i++)
    if (names[i] && *names[i]) lib = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
  allreduce_fn allreduce = lib ? (allreduce_fn)dlsym(lib, "MPI_Allreduce") : NULL;
  barrier_fn barrier = lib ? (barrier_fn)dlsym(lib, "MPI_Barrier") : NULL;
  void *world = lib ? dlsym(lib, "ompi_mpi_comm_world") : NULL, *f32 = lib ? dlsym(lib, "ompi_mpi_float") : NULL,
       *sum = lib ? dlsym(lib, "ompi_mpi_op_sum") : NULL;
  if (!allreduce || !barrier || !world || !f32 || !sum) {
    fprintf(stderr, "allreduce_mpi: this needs Open MPI's libmpi (MPI_Allreduce and its predefined handles)\n");
    return 1;
  }
  int64_t n = tg_getenv_int("ALLREDUCE_N", 4 << 20);
  int rank = tg_dist_rank(), size = tg_dist_size();
  tg_scope_begin();
  tg_tensor x = tg_contiguous(tg_rand(TG_SHAPE(n), NULL));
  float *src = malloc(sizeof(float) * (size_t)n), *dst = malloc(sizeof(float) * (size_t)n);
  if (tg_realize(x) != TG_OK || tg_data(x, src, sizeof(float) * (size_t)n) != TG_OK || !dst) return 1;
  double best_tg = 1e30, best_mpi = 1e30;
  for (int it = 0; it < 8; it++) {
    barrier(world);
    double t0 = now();
    tg_scope_begin();
    tg_tensor r = tg_dist_allreduce(x);
    if (!tg_valid(r) || tg_realize(r) != TG_OK) {
      fprintf(stderr, "allreduce_mpi: %s\n", tg_last_error());
      return 1;
    }
    tg_scope_end();
    double t1 = now();
    barrier(world);
    double t2 = now();
    if (allreduce(src, dst, (int)n, f32, sum, world) != 0) return 1;
    double t3 = now();
    if (it > 0 && t1 - t0 < best_tg) best_tg = t1 - t0;
    if (it > 0 && t3 - t2 < best_mpi) best_mpi = t3 - t2;
  }
  double bytes = (double)n * 4;
  if (rank == 0)
    printf("ranks=%d elements=%lld (%.1f MB) tinygrad.c=%.2f MPI_Allreduce=%.2f GB/s ratio=%.2f\n", size, (long long)n,
           bytes / 1e6, bytes / best_tg * 1e-9, bytes / best_mpi * 1e-9, best_mpi / best_tg);
  free(src), free(dst);
  tg_scope_end();
  tg_dist_finalize();
  return 0;
}
