/*
 * dist.c -- tensors across processes: tg_dist_* over MPI (Open MPI's libmpi, opened at run time with
 * dlopen, so libtinygrad has no MPI dependency and works without it).
 *
 * In: a process started by mpirun (or a lone process: a world of size 1). Out: rank and size, and a
 * tensor's sum over all ranks (tg_dist_allreduce) or rank root's copy (tg_dist_broadcast), as new
 * lazy tensors on the input's device (and sharding). They are graph nodes (COLLECTIVE) like any op:
 * realized with the rest of the graph, differentiable (an allreduce's gradient is the allreduce of
 * the gradient, a broadcast's an MPI_Reduce to the root), and captured by TinyJit, whose replays run
 * the MPI call again; so a whole data-parallel training step (forward, BatchNorm statistics over all
 * ranks, backward, gradient allreduce, optimizer) is one jitted function. MPI needs every rank to
 * make the same collectives in the same order, which the same program over the same graph does:
 * scheduling is deterministic. Errors come back as statuses, never aborts: the world communicator
 * gets MPI_ERRORS_RETURN, so a failed call (a peer that died) returns an error code that is
 * reported with MPI's own message.
 *
 * This file is the MPI side (loading libmpi, running a collective); the tensor calls that build
 * COLLECTIVE nodes are in tensor/collective.c.
 *
 * Open MPI's handles are addresses of its predefined objects (MPI_COMM_WORLD is &ompi_mpi_comm_world,
 * MPI_FLOAT &ompi_mpi_float, ...), which dlsym gives; MPI_IN_PLACE is (void *)1 in its ABI.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

typedef void *MPI_Handle;
static struct {
  void *lib;
  bool inited;
  int rank, size;
  MPI_Handle world, f32, f64, i32, i64, sum, errors_return;
  int (*Init)(int *, char ***);
  int (*Initialized)(int *);
  int (*Comm_rank)(MPI_Handle, int *);
  int (*Comm_size)(MPI_Handle, int *);
  int (*Comm_set_errhandler)(MPI_Handle, MPI_Handle);
  int (*Allreduce)(const void *, void *, int, MPI_Handle, MPI_Handle, MPI_Handle);
  int (*Bcast)(void *, int, MPI_Handle, int, MPI_Handle);
  int (*Reduce)(const void *, void *, int, MPI_Handle, MPI_Handle, int, MPI_Handle);
  int (*Error_string)(int, char *, int *);
  int (*Finalize)(void);
} M;
static pthread_mutex_t dist_lock = PTHREAD_MUTEX_INITIALIZER;

static tg_status mpi_fail(const char *fn, const char *what, int rc) {
  char msg[1024] = "";
  int len = 0;
  if (M.Error_string) M.Error_string(rc, msg, &len);
  return tg_set_error(TG_ERR_RUNTIME, "%s: %s failed (MPI error %d: %s)", fn, what, rc, msg[0] ? msg : "unknown");
}

tg_status tg_dist_init(void) {
  pthread_mutex_lock(&dist_lock);
  tg_status st = TG_OK;
  if (M.inited) goto out;
  const char *names[] = {getenv("TG_LIBMPI"), "libmpi.so.40", "libmpi.so", NULL};
  for (int i = 0; i < 3 && !M.lib; i++)
    if (names[i] && *names[i]) M.lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
  if (!M.lib) {
    st = tg_set_error(TG_ERR_RUNTIME, "tg_dist_init: cannot open libmpi (%s); install Open MPI (Debian: openmpi-bin libopenmpi-dev) or set TG_LIBMPI",
                      dlerror());
    goto out;
  }
#define SYM(field, name)                                                                                                 \
  if (!(*(void **)&M.field = dlsym(M.lib, name))) {                                                                     \
    st = tg_set_error(TG_ERR_RUNTIME, "tg_dist_init: libmpi lacks %s (tinygrad.c speaks Open MPI's ABI)", name);      \
    goto out;                                                                                                           \
  }
  SYM(Init, "MPI_Init") SYM(Initialized, "MPI_Initialized") SYM(Comm_rank, "MPI_Comm_rank") SYM(Comm_size, "MPI_Comm_size")
  SYM(Comm_set_errhandler, "MPI_Comm_set_errhandler") SYM(Allreduce, "MPI_Allreduce") SYM(Bcast, "MPI_Bcast") SYM(Reduce, "MPI_Reduce")
  SYM(Error_string, "MPI_Error_string") SYM(Finalize, "MPI_Finalize")
#undef SYM
#define OBJ(field, name)                                                                                                 \
  if (!(M.field = dlsym(M.lib, name))) {                                                                                \
    st = tg_set_error(TG_ERR_RUNTIME, "tg_dist_init: libmpi lacks %s (tinygrad.c speaks Open MPI's ABI)", name);      \
    goto out;                                                                                                           \
  }
  OBJ(world, "ompi_mpi_comm_world") OBJ(f32, "ompi_mpi_float") OBJ(f64, "ompi_mpi_double") OBJ(i32, "ompi_mpi_int")
  OBJ(i64, "ompi_mpi_long_long_int") OBJ(sum, "ompi_mpi_op_sum") OBJ(errors_return, "ompi_mpi_errors_return")
#undef OBJ
  int flag = 0, rc;
  M.Initialized(&flag);
  if (!flag && (rc = M.Init(NULL, NULL)) != 0) {
    st = mpi_fail("tg_dist_init", "MPI_Init", rc);
    goto out;
  }
  M.Comm_set_errhandler(M.world, M.errors_return);
  if ((rc = M.Comm_rank(M.world, &M.rank)) != 0 || (rc = M.Comm_size(M.world, &M.size)) != 0) {
    st = mpi_fail("tg_dist_init", "MPI_Comm_rank/size", rc);
    goto out;
  }
  M.inited = true;
out:
  pthread_mutex_unlock(&dist_lock);
  return st;
}

int tg_dist_rank(void) { return M.inited ? M.rank : -1; }
int tg_dist_size(void) { return M.inited ? M.size : -1; }

tg_status tg_dist_finalize(void) {
  pthread_mutex_lock(&dist_lock);
  tg_status st = TG_OK;
  if (M.inited) {
    int rc = M.Finalize();
    if (rc) st = mpi_fail("tg_dist_finalize", "MPI_Finalize", rc);
    M.inited = false;
  }
  pthread_mutex_unlock(&dist_lock);
  return st;
}

static MPI_Handle mpi_type(tg_dtype dt) {
  switch (dt) {
  case TG_FLOAT32: return M.f32;
  case TG_FLOAT64: return M.f64;
  case TG_INT32: return M.i32;
  case TG_INT64: return M.i64;
  default: return NULL;
  }
}

/* The collective over n elements, in int-sized pieces (MPI counts are int): MPI_Allreduce of send
 * into buf (root -1), MPI_Bcast of buf from root (root >= 0), or MPI_Reduce of send into buf on
 * rank -2-root (root <= -2). */
static tg_status mpi_run(const char *send, char *buf, int64_t n, size_t isz, MPI_Handle ty, int64_t root) {
  for (int64_t off = 0; off < n;) {
    int cnt = n - off > INT_MAX / 2 ? INT_MAX / 2 : (int)(n - off);
    char *at = buf + off * (int64_t)isz;
    const char *from = send + off * (int64_t)isz;
    int rc = root >= 0    ? M.Bcast(at, cnt, ty, (int)root, M.world)
             : root == -1 ? M.Allreduce(from, at, cnt, ty, M.sum, M.world)
                          : M.Reduce(from, at, cnt, ty, M.sum, (int)(-2 - root), M.world);
    if (rc) return mpi_fail("tg_dist", root >= 0 ? "MPI_Bcast" : root == -1 ? "MPI_Allreduce" : "MPI_Reduce", rc);
    off += cnt;
  }
  return TG_OK;
}

tg_status dist_exec(Buffer *out, Buffer *in, size_t n, tg_dtype dt, int64_t root) {
  pthread_mutex_lock(&dist_lock); /* MPI is initialized for one thread at a time */
  tg_status st = TG_OK;
  size_t isz = tg_dtype_itemsize(dt);
  buffer_written(out);
  MPI_Handle ty = M.inited ? mpi_type(dt) : NULL;
  if (!M.inited)
    st = tg_set_error(TG_ERR_INVALID, "tg_dist: a collective was realized after tg_dist_finalize; realize it before finalizing");
  else if (!out->ptr || !in->ptr || !ty)
    st = tg_set_error(TG_ERR_RUNTIME, "tg_dist: the collective's buffers are not in host memory");
  if (st == TG_OK && root >= 0 && M.rank == root) memcpy(out->ptr, in->ptr, n);
  if (st == TG_OK && n) st = mpi_run(in->ptr, out->ptr, (int64_t)(n / isz), isz, ty, root);
  if (st == TG_OK && root <= -2 && M.rank != -2 - root) memset(out->ptr, 0, n);
  pthread_mutex_unlock(&dist_lock);
  return st;
}

bool dist_dtype_ok(tg_dtype dt) { return mpi_type(dt) != NULL; }
