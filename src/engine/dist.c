/*
 * dist.c -- tensors across processes: tg_dist_* over MPI (Open MPI's libmpi, opened at run time with
 * dlopen, so libtinygrad has no MPI dependency and works without it).
 *
 * In: a process started by mpirun (or a lone process: a world of size 1). Out: rank and size, and a
 * tensor's sum over all ranks (tg_dist_allreduce) or rank root's copy (tg_dist_broadcast), as new
 * tensors on the input's device (and sharding). Errors come back as statuses, never aborts: the world
 * communicator gets MPI_ERRORS_RETURN, so a failed call (a peer that died) returns an error code
 * that is reported with MPI's own message.
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

#include "../tensor/tensor.h"

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
  SYM(Comm_set_errhandler, "MPI_Comm_set_errhandler") SYM(Allreduce, "MPI_Allreduce") SYM(Bcast, "MPI_Bcast")
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

/* The buffer behind a realized tensor, NULL for a view or a lazy one. */
static Buffer *realized_buffer(tg_tensor t) {
  UOp *u = t_get(t, "tg_dist");
  UOp *b = u ? g_resolve(u) : NULL;
  return b && b->op == OP_BUFFER ? g_buffer_of(b) : NULL;
}

/* The collective over n elements of buf, in int-sized pieces (MPI counts are int): Bcast from
 * root, or Allreduce reading send (NULL: in place). */
static tg_status mpi_run(const char *fn, const char *send, char *buf, int64_t n, size_t isz, MPI_Handle ty, int root,
                         bool bcast) {
  for (int64_t off = 0; off < n;) {
    int cnt = n - off > INT_MAX / 2 ? INT_MAX / 2 : (int)(n - off);
    char *at = buf + off * (int64_t)isz;
    int rc = bcast ? M.Bcast(at, cnt, ty, root, M.world)
                   : M.Allreduce(send ? send + off * (int64_t)isz : (void *)1 /* MPI_IN_PLACE */, at, cnt, ty, M.sum, M.world);
    if (rc) return mpi_fail(fn, bcast ? "MPI_Bcast" : "MPI_Allreduce", rc);
    off += cnt;
  }
  return TG_OK;
}

/* A single-device tensor in host memory (the CPU devices): MPI reads t's buffer and writes the
 * result's directly, no staging copy on either side. */
static tg_tensor collective_host(const char *fn, tg_tensor t, const tg_opts *o, const int64_t *shape, int nd, int64_t n,
                                 int root, bool bcast, MPI_Handle ty) {
  size_t isz = tg_dtype_itemsize(o->dtype);
  tg_tensor src = tg_contiguous(t), out = tg_empty(shape, nd, o);
  Buffer *sb = NULL, *ob = NULL;
  if (tg_realize(src) == TG_OK && tg_realize(out) == TG_OK) sb = realized_buffer(src), ob = realized_buffer(out);
  tg_status st = TG_OK;
  if (!sb || !ob || !sb->ptr || !ob->ptr)
    st = tg_has_error() ? tg_last_status() : tg_set_error(TG_ERR_RUNTIME, "%s: the tensor's buffer could not be realized", fn);
  if (st == TG_OK && bcast && M.rank == root) memcpy(ob->ptr, sb->ptr, (size_t)n * isz);
  if (st == TG_OK) st = mpi_run(fn, sb->ptr, ob->ptr, n, isz, ty, root, bcast);
  tg_free(src);
  if (st == TG_OK) return out;
  tg_free(out);
  return (tg_tensor){0};
}

/* t's data on the host, op'd across ranks in place, then back as a tensor like t */
static tg_tensor collective(const char *fn, tg_tensor t, int root, bool bcast) {
  if (!M.inited) return tg_set_error(TG_ERR_INVALID, "%s: call tg_dist_init first", fn), (tg_tensor){0};
  UOp *u = t_get(t, fn);
  if (!u) return (tg_tensor){0};
  MPI_Handle ty = mpi_type((tg_dtype)u->dtype);
  if (!ty)
    return tg_set_error(TG_ERR_INVALID, "%s: dtype %s is not supported (float32, float64, int32, int64)", fn, tg_dtype_name((tg_dtype)u->dtype)),
           (tg_tensor){0};
  if (bcast && (root < 0 || root >= M.size))
    return tg_set_error(TG_ERR_INVALID, "%s: root %d is not a rank (0..%d)", fn, root, M.size - 1), (tg_tensor){0};
  /* u's fields copied: reading the data realizes t, which may free the node u was */
  int nd = u->ndim, dev = u->device;
  tg_dtype dt = (tg_dtype)u->dtype;
  int64_t shape[64];
  if (nd) memcpy(shape, u->shape, sizeof(int64_t) * (size_t)nd);
  int64_t n = shape_numel(shape, nd);
  size_t isz = tg_dtype_itemsize(dt);
  Device *d = device_by_id(dev);
  tg_opts o = {.dtype = dt, .device = d->name, .requires_grad = TG_GRAD_UNSET};
  if (!m_is(u) && n > 0 && (d->vt == &cpu_device_vt || d->vt == &llvm_device_vt))
    return collective_host(fn, t, &o, shape, nd, n, root, bcast, ty);
  char *buf = malloc((size_t)n * isz + 1);
  if (!buf) return tg_set_error(TG_ERR_RUNTIME, "%s: cannot allocate %lld elements on the host", fn, (long long)n), (tg_tensor){0};
  if (tg_data(t, buf, (size_t)n * isz) != TG_OK) {
    free(buf);
    return (tg_tensor){0};
  }
  if (mpi_run(fn, NULL, buf, n, isz, ty, root, bcast) != TG_OK) {
    free(buf);
    return (tg_tensor){0};
  }
  tg_tensor r = tg_from_data(buf, shape, nd, &o);
  free(buf);
  if (tg_valid(r) && tg_shard_axis(t) >= 0) r = tg_shard_like(r, t);
  return r;
}

tg_tensor tg_dist_allreduce(tg_tensor t) { return collective("tg_dist_allreduce", t, 0, false); }
tg_tensor tg_dist_broadcast(tg_tensor t, int root) { return collective("tg_dist_broadcast", t, root, true); }
