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
 * COLLECTIVE nodes are in tensor/collective.c. It also runs, through libnccl, the allreduce of a
 * tensor sharded over several GPUs of this one process (tg_shard; nccl_group_exec, at the end).
 *
 * Open MPI's handles are addresses of its predefined objects (MPI_COMM_WORLD is &ompi_mpi_comm_world,
 * MPI_FLOAT &ompi_mpi_float, ...), which dlsym gives; MPI_IN_PLACE is (void *)1 in its ABI.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

typedef void *MPI_Handle;
static struct {
  void *lib;
  bool inited;
  int rank, size;
  int64_t seq;        /* collectives made so far (the same count on every rank) */
  char broken[512];   /* why the world cannot be used any more ("" while it can) */
  MPI_Handle world, f32, f64, i32, i64, sum, max, errors_return;
  int (*Init)(int *, char ***);
  int (*Initialized)(int *);
  int (*Finalized)(int *);
  int (*Iallreduce)(const void *, void *, int, MPI_Handle, MPI_Handle, MPI_Handle, MPI_Handle *);
  int (*Test)(MPI_Handle *, int *, void *);
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

/* libnccl's entry points and this process's communicators (see the NCCL part above dist_exec) */
typedef struct {
  char internal[128];
} NcclId;
enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7, NCCL_SUM = 0, NCCL_MAX = 2 };
/* The communicators of one device tuple inside this process (ncclCommInitAll), see nccl_group_exec */
typedef struct Clique {
  int n;
  Device **dev;
  void **comm;
  struct Clique *next;
} Clique;
static struct {
  void *lib;
  bool tried;
  char tried_name[512]; /* the TG_NCCL_LIB of the failed attempt */
  char why[600];        /* why it could not be opened */
  int (*GetUniqueId)(NcclId *);
  int (*CommInitRank)(void **, int, NcclId, int);
  int (*CommInitAll)(void **, int, const int *);
  int (*GroupStart)(void);
  int (*GroupEnd)(void);
  int (*AllReduce)(const void *, void *, size_t, int, int, void *, void *);
  int (*Broadcast)(const void *, void *, size_t, int, int, void *, void *);
  int (*Reduce)(const void *, void *, size_t, int, int, int, void *, void *);
  int (*CommGetAsyncError)(void *, int *);
  int (*CommAbort)(void *);
  int (*CommDestroy)(void *);
  const char *(*GetErrorString)(int);
  Device *dev[64]; /* communicators, one per device */
  void *comm[64];
  int ncomm;
  Clique *cliques;     /* in-process communicator sets, one per device tuple */
  bool exit_hook;      /* nccl_at_exit is registered */
} N;


static tg_status mpi_fail(const char *fn, const char *what, int rc) {
  char msg[1024] = "";
  int len = 0;
  if (M.Error_string) M.Error_string(rc, msg, &len);
  return tg_set_error(TG_ERR_RUNTIME, "%s: %s failed (MPI error %d: %s)", fn, what, rc, msg[0] ? msg : "unknown");
}

tg_status tg_dist_init(void) {
  pthread_mutex_lock(&dist_lock);
  tg_status st = TG_OK;
  const char *lib = "libmpi.so.40";
  if (M.inited) goto out;
  if (!M.lib) {
    /* TG_LIBMPI names that file alone (a wrong path is an error, not a quiet fall back) */
    const char *env = getenv("TG_LIBMPI");
    const char *names[] = {"libmpi.so.40", "libmpi.so"};
    if (env && *env) M.lib = dlopen(lib = env, RTLD_NOW | RTLD_GLOBAL);
    for (int i = 0; i < 2 && !M.lib && !(env && *env); i++) M.lib = dlopen(lib = names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!M.lib) {
      st = tg_set_error(TG_ERR_RUNTIME, "tg_dist_init: cannot open %s (%s); install Open MPI (Debian: openmpi-bin libopenmpi-dev) or set TG_LIBMPI",
                        env && *env ? env : "libmpi", dlerror());
      goto out;
    }
  }
  /* (a library that lacks a symbol is closed again: a later call may name another) */
#define SYM(field, name)                                                                                                 \
  if (!(*(void **)&M.field = dlsym(M.lib, name))) {                                                                     \
    st = tg_set_error(TG_ERR_RUNTIME, "tg_dist_init: %s lacks %s (tinygrad.c speaks Open MPI's ABI)", lib, name);     \
    goto bad_lib;                                                                                                       \
  }
  SYM(Init, "MPI_Init") SYM(Initialized, "MPI_Initialized") SYM(Finalized, "MPI_Finalized") SYM(Comm_rank, "MPI_Comm_rank")
  SYM(Comm_size, "MPI_Comm_size") SYM(Comm_set_errhandler, "MPI_Comm_set_errhandler") SYM(Allreduce, "MPI_Allreduce")
  SYM(Bcast, "MPI_Bcast") SYM(Reduce, "MPI_Reduce") SYM(Iallreduce, "MPI_Iallreduce") SYM(Test, "MPI_Test")
  SYM(Error_string, "MPI_Error_string") SYM(Finalize, "MPI_Finalize")
#undef SYM
#define OBJ(field, name)                                                                                                 \
  if (!(M.field = dlsym(M.lib, name))) {                                                                                \
    st = tg_set_error(TG_ERR_RUNTIME, "tg_dist_init: %s lacks %s (tinygrad.c speaks Open MPI's ABI)", lib, name);     \
    goto bad_lib;                                                                                                       \
  }
  OBJ(world, "ompi_mpi_comm_world") OBJ(f32, "ompi_mpi_float") OBJ(f64, "ompi_mpi_double") OBJ(i32, "ompi_mpi_int")
  OBJ(i64, "ompi_mpi_long_long_int") OBJ(sum, "ompi_mpi_op_sum") OBJ(max, "ompi_mpi_op_max")
  OBJ(errors_return, "ompi_mpi_errors_return")
#undef OBJ
  int flag = 0, rc;
  M.Finalized(&flag);
  if (flag) {
    st = tg_set_error(TG_ERR_INVALID, "tg_dist_init: MPI was finalized (tg_dist_finalize) in this process; it cannot start again");
    goto out;
  }
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
  M.seq = 0;
  M.broken[0] = '\0';
  goto out;
bad_lib:
  dlclose(M.lib);
  M.lib = NULL;
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
    for (int i = 0; i < N.ncomm; i++) /* (an aborted one is gone already) */
      if (N.dev[i]) N.CommDestroy(N.comm[i]);
    N.ncomm = 0;
    if (M.broken[0]) {
      /* a collective is left pending: MPI_Finalize could wait for it forever */
      st = tg_set_error(TG_ERR_RUNTIME, "tg_dist_finalize: MPI_Finalize skipped: %s", M.broken);
    } else {
      int rc = M.Finalize();
      if (rc) st = mpi_fail("tg_dist_finalize", "MPI_Finalize", rc);
    }
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

/* Waits for a nonblocking MPI call, at most DIST_TIMEOUT seconds (600). Open MPI progresses it
 * inside MPI_Test, so the loop polls: back to back at first, then yielding the core, then (after a
 * second: a peer is busy or gone) every 100 us. A timeout or a failure leaves the call pending, so
 * the world is marked broken. */
static tg_status mpi_wait(MPI_Handle *req, const char *what) {
  double t0 = now_seconds(), limit = (double)getenv_int("DIST_TIMEOUT", 600);
  for (long spin = 0;; spin++) {
    int done = 0, rc = M.Test(req, &done, NULL);
    if (rc) {
      mpi_fail("tg_dist", what, rc);
      snprintf(M.broken, sizeof M.broken, "%s failed", what);
      return tg_last_status();
    }
    if (done) return TG_OK;
    double t = spin < 4096 ? 0 : now_seconds() - t0;
    if (t > limit) {
      snprintf(M.broken, sizeof M.broken, "%s did not finish in %.0f s (DIST_TIMEOUT): a rank died, is stuck, or stopped making the "
               "same collectives", what, limit);
      return tg_set_error(TG_ERR_RUNTIME, "tg_dist: %s; this process's MPI cannot be used again: end it (mpirun then ends the job)", M.broken);
    }
    if (t > 1.0) {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    } else if (spin >= 4096) {
      sched_yield();
    }
  }
}

static void describe_call(char *out, size_t cap, int64_t kind, tg_dtype dt, int64_t n) {
  if (kind == -1) snprintf(out, cap, "an allreduce of %lld %s", (long long)n, tg_dtype_name(dt));
  else if (kind >= 0) snprintf(out, cap, "a broadcast from rank %lld of %lld %s", (long long)kind, (long long)n, tg_dtype_name(dt));
  else snprintf(out, cap, "a reduce to rank %lld of %lld %s", (long long)(-2 - kind), (long long)n, tg_dtype_name(dt));
}

/* Before each collective the ranks agree on what it is (a tiny MPI_Iallreduce of its number, kind,
 * root, dtype and count, as maxima of the values and of their negations): a rank whose program made
 * another collective gets an error on every rank instead of a truncated, reinterpreted or
 * mismatched buffer, and a rank that never comes ends the wait after DIST_TIMEOUT instead of a hang.
 * (The data call itself is the blocking one: a peer that passed this point makes it too.) */
static tg_status mpi_agree(int64_t kind, tg_dtype dt, int64_t n) {
  int64_t seq = M.seq++;
  int64_t d[4] = {seq, kind, (int64_t)dt, n}, v[8], r[8];
  for (int i = 0; i < 4; i++) v[i] = d[i], v[4 + i] = -d[i];
  MPI_Handle req = NULL;
  int rc = M.Iallreduce(v, r, 8, M.i64, M.max, M.world, &req);
  if (rc) {
    snprintf(M.broken, sizeof M.broken, "MPI_Iallreduce failed");
    return mpi_fail("tg_dist", "MPI_Iallreduce (the collective's description)", rc);
  }
  tg_status st = mpi_wait(&req, "the collective's agreement (MPI_Iallreduce)");
  if (st != TG_OK) return st;
  static const char *const field[4] = {"collective number", "kind or root", "dtype", "element count"};
  for (int i = 0; i < 4; i++)
    if (r[i] != -r[4 + i]) {
      char mine[160];
      describe_call(mine, sizeof mine, kind, dt, n);
      return tg_set_error(TG_ERR_INVALID, "tg_dist: the ranks' collective #%lld differ (%s ranges over %lld..%lld; this rank's is %s): "
                          "every rank must make the same collectives, in the same order, with the same shapes and dtypes",
                          (long long)seq, field[i], (long long)-r[4 + i], (long long)r[i], mine);
    }
  return TG_OK;
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
    if (rc) {
      const char *what = root >= 0 ? "MPI_Bcast" : root == -1 ? "MPI_Allreduce" : "MPI_Reduce";
      snprintf(M.broken, sizeof M.broken, "%s failed", what);
      return mpi_fail("tg_dist", what, rc);
    }
    off += cnt;
  }
  return TG_OK;
}

/* ---- NCCL: the collectives of GPU buffers where libnccl is present ----
 * A COLLECTIVE node of a CUDA tensor runs as the NCCL call on the device's own stream (no copy to
 * the host and back), over one communicator per device spanning the MPI ranks: rank 0 makes its
 * id and MPI_Bcast hands it to the others, at the first collective on that device (every rank
 * reaches it in the same order, as with MPI). libnccl is opened at run time (TG_NCCL_LIB, else
 * libnccl.so.2); without it, or with NCCL=0, those tensors go through host memory and MPI. A call
 * is waited for with the device's stream_done while NCCL's asynchronous errors are polled: a peer
 * that died ends it with NCCL's error, and one that stays silent for DIST_TIMEOUT seconds (600)
 * aborts the communicator, so no rank hangs. */
/* ncclDataType_t of a dtype (nccl.h's numbering), -1 where NCCL has none */
static int nccl_type(tg_dtype dt) {
  switch (dt) {
  case TG_INT8: return 0;
  case TG_UINT8: return 1;
  case TG_INT32: return 2;
  case TG_UINT32: return 3;
  case TG_INT64: return 4;
  case TG_UINT64: return 5;
  case TG_FLOAT16: return 6;
  case TG_FLOAT32: return 7;
  case TG_FLOAT64: return 8;
  case TG_BFLOAT16: return 9;
  default: return -1;
  }
}

/* Opens libnccl (under dist_lock): TG_NCCL_LIB, or else libnccl.so.2 / libnccl.so. Once open it
 * stays for the process; a failure is final for that TG_NCCL_LIB value (a program that sets another
 * one tries again). */
static bool nccl_load(void) {
  if (N.lib) return true;
  const char *env = getenv("TG_NCCL_LIB");
  if (N.tried && !strcmp(N.tried_name, env ? env : "")) return false;
  N.tried = true;
  snprintf(N.tried_name, sizeof N.tried_name, "%s", env ? env : "");
  if (env && *env) {
    N.lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
  } else {
    const char *names[] = {"libnccl.so.2", "libnccl.so"};
    for (int i = 0; i < 2 && !N.lib; i++) N.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  }
  if (!N.lib) {
    snprintf(N.why, sizeof N.why, "cannot open libnccl (%s); install NCCL or set TG_NCCL_LIB", dlerror());
    return false;
  }
#define NSYM(field, name)                                                                                                \
  if (!(*(void **)&N.field = dlsym(N.lib, name))) {                                                                     \
    snprintf(N.why, sizeof N.why, "%s lacks %s", env && *env ? env : "libnccl", name);                                  \
    dlclose(N.lib);                                                                                                     \
    N.lib = NULL;                                                                                                       \
    return false;                                                                                                       \
  }
  NSYM(GetUniqueId, "ncclGetUniqueId") NSYM(CommInitRank, "ncclCommInitRank") NSYM(AllReduce, "ncclAllReduce")
  NSYM(Broadcast, "ncclBroadcast") NSYM(Reduce, "ncclReduce") NSYM(CommGetAsyncError, "ncclCommGetAsyncError")
  NSYM(CommAbort, "ncclCommAbort") NSYM(CommDestroy, "ncclCommDestroy") NSYM(GetErrorString, "ncclGetErrorString")
  NSYM(CommInitAll, "ncclCommInitAll") NSYM(GroupStart, "ncclGroupStart") NSYM(GroupEnd, "ncclGroupEnd")
#undef NSYM
  return true;
}

bool dist_nccl_ok(Device *d) {
  if (!d || !d->vt->stream || !d->vt->stream_done || !getenv_int("NCCL", 1)) return false;
  pthread_mutex_lock(&dist_lock);
  bool ok = M.inited && nccl_load();
  if (!ok && debug_level() >= 2 && M.inited)
    fprintf(stderr, "tg_dist: collectives on %s go through host memory: %s\n", d->name, N.why);
  pthread_mutex_unlock(&dist_lock);
  return ok;
}

static tg_status nccl_fail(const char *what, int rc) {
  return tg_set_error(TG_ERR_RUNTIME, "tg_dist: %s failed (NCCL error %d: %s)", what, rc,
                      N.GetErrorString ? N.GetErrorString(rc) : "unknown");
}

/* The communicator of device d over all ranks, made at its first use (a collective call of every
 * rank). NULL + error. */
static void *nccl_comm(Device *d) {
  for (int i = 0; i < N.ncomm; i++)
    if (N.dev[i] == d) return N.comm[i];
  if (N.ncomm == 64) return tg_set_error(TG_ERR_RUNTIME, "tg_dist: NCCL collectives on more than 64 devices"), NULL;
  NcclId id;
  memset(&id, 0, sizeof id);
  int rc = M.rank == 0 ? N.GetUniqueId(&id) : NCCL_SUCCESS;
  if (rc != NCCL_SUCCESS) return nccl_fail("ncclGetUniqueId", rc), NULL;
  /* (rank 0's id, or its failure, reaches every rank: 32 ints) */
  if ((rc = M.Bcast(&id, (int)(sizeof id / 4), M.i32, 0, M.world)) != 0) return mpi_fail("tg_dist", "MPI_Bcast (NCCL id)", rc), NULL;
  void *comm = NULL;
  if (!d->vt->stream(d->state)) return NULL; /* its context current on this thread */
  if ((rc = N.CommInitRank(&comm, M.size, id, M.rank)) != NCCL_SUCCESS) return nccl_fail("ncclCommInitRank", rc), NULL;
  N.dev[N.ncomm] = d, N.comm[N.ncomm++] = comm;
  return comm;
}

/* Aborts a communicator that failed; a later collective on its device makes a new one. */
static void nccl_abort(void *comm) {
  N.CommAbort(comm);
  for (int i = 0; i < N.ncomm; i++)
    if (N.comm[i] == comm) N.dev[i] = NULL;
}

/* Waits for the device's stream to finish the NCCL call just enqueued, watching NCCL's errors. */
static tg_status nccl_wait(Device *d, void *comm, const char *what) {
  double t0 = now_seconds(), limit = (double)getenv_int("DIST_TIMEOUT", 600);
  for (;;) {
    int done = d->vt->stream_done(d->state);
    if (done < 0) return tg_last_status();
    if (done) return TG_OK;
    int err = NCCL_SUCCESS;
    if (N.CommGetAsyncError(comm, &err) == NCCL_SUCCESS && err != NCCL_SUCCESS && err != NCCL_IN_PROGRESS) {
      nccl_abort(comm);
      return nccl_fail(what, err);
    }
    if (now_seconds() - t0 > limit) {
      nccl_abort(comm);
      return tg_set_error(TG_ERR_RUNTIME, "tg_dist: %s on %s did not finish in %.0f s (DIST_TIMEOUT): a rank died or "
                          "stopped making the same collectives", what, d->name, limit);
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

/* dist_exec on a GPU device through NCCL (under dist_lock). */
static tg_status nccl_exec(Buffer *out, Buffer *in, size_t n, tg_dtype dt, int64_t root) {
  Device *d = out->dev;
  int ty = nccl_type(dt);
  if (ty < 0) return tg_set_error(TG_ERR_INVALID, "tg_dist: dtype %s has no NCCL type", tg_dtype_name(dt));
  void *comm = nccl_comm(d);
  if (!comm) return tg_last_status();
  void *stream = d->vt->stream(d->state);
  if (!stream) return tg_last_status();
  size_t cnt = n / tg_dtype_itemsize(dt);
  const char *what = root >= 0 ? "ncclBroadcast" : root == -1 ? "ncclAllReduce" : "ncclReduce";
  int rc = root >= 0    ? N.Broadcast(in->ptr, out->ptr, cnt, ty, (int)root, comm, stream)
           : root == -1 ? N.AllReduce(in->ptr, out->ptr, cnt, ty, NCCL_SUM, comm, stream)
                        : N.Reduce(in->ptr, out->ptr, cnt, ty, NCCL_SUM, (int)(-2 - root), comm, stream);
  if (rc != NCCL_SUCCESS) return nccl_fail(what, rc);
  tg_status st = nccl_wait(d, comm, what);
  if (st == TG_OK && root <= -2 && M.rank != -2 - root) { /* the reduction lands on the root only */
    void *z = calloc(1, n ? n : 1);
    st = z ? d->vt->copyin(d->state, out->ptr, z, n) : tg_set_error(TG_ERR_RUNTIME, "tg_dist: no host memory for %zu bytes", n);
    free(z);
  }
  return st;
}

tg_status dist_exec(Buffer *out, Buffer *in, size_t n, tg_dtype dt, int64_t root) {
  pthread_mutex_lock(&dist_lock); /* MPI is initialized for one thread at a time */
  tg_status st = TG_OK;
  size_t isz = tg_dtype_itemsize(dt);
  buffer_written(out);
  bool nccl = M.inited && out->dev->vt->stream && N.lib;
  MPI_Handle ty = mpi_type(dt);
  /* a rank that cannot make the call still takes part in the agreement (with an impossible count),
   * so the others stop there with an error instead of waiting in the call */
  const char *local = nccl || (out->ptr && in->ptr && ty) ? NULL : "the collective's buffers are not in host memory";
  if (!M.inited)
    st = tg_set_error(TG_ERR_INVALID, "tg_dist: a collective was realized after tg_dist_finalize; realize it before finalizing");
  else if (M.broken[0])
    st = tg_set_error(TG_ERR_RUNTIME, "tg_dist: an earlier collective failed (%s); this process's MPI cannot be used again: end it", M.broken);
  else if ((st = mpi_agree(root, dt, local ? -1 : (int64_t)(n / isz))) == TG_OK && local)
    st = tg_set_error(TG_ERR_RUNTIME, "tg_dist: %s", local);
  if (st == TG_OK && nccl) {
    st = nccl_exec(out, in, n, dt, root);
  } else if (st == TG_OK) {
    if (root >= 0 && M.rank == root) memcpy(out->ptr, in->ptr, n);
    if (n) st = mpi_run(in->ptr, out->ptr, (int64_t)(n / isz), isz, ty, root);
    if (st == TG_OK && root <= -2 && M.rank != -2 - root) memset(out->ptr, 0, n);
  }
  pthread_mutex_unlock(&dist_lock);
  return st;
}

bool dist_dtype_ok(tg_dtype dt) { return mpi_type(dt) != NULL; }

/* ---- NCCL inside one process: a sharded tensor's allreduce over several GPUs ----
 * multi.c builds an allreduce whose parts are on distinct CUDA GPUs as n COLLECTIVE nodes, member k
 * on part k's GPU, each reading every part; realize runs the n items as one NCCL group
 * (nccl_group_exec): ncclGroupStart, one ncclAllReduce per GPU on its communicator and its own
 * stream (ordered with the kernels around it), ncclGroupEnd, then a wait for every stream while the
 * communicators' asynchronous errors are polled, with the same DIST_TIMEOUT and abort as across
 * processes. The communicators of one device tuple (a clique) come from ncclCommInitAll at its
 * first allreduce and are kept, one clique per tuple, until the process exits (an atexit handler
 * destroys them). A failure aborts the clique; the next allreduce makes a new one. */

static int nccl_redop(int op) { return op == OP_ADD ? NCCL_SUM : op == OP_MAX ? NCCL_MAX : -1; }
static const char *redop_name(int op) { return op == OP_ADD ? "sum" : op == OP_MAX ? "max" : "?"; }

/* "CUDA:0,CUDA:1" */
static void dev_names(Device *const *devs, int n, char *out, size_t cap) {
  size_t len = 0;
  out[0] = '\0';
  for (int i = 0; i < n && len + 1 < cap; i++) {
    int w = snprintf(out + len, cap - len, "%s%s", i ? "," : "", devs[i]->name);
    if (w < 0) break;
    len += (size_t)w < cap - len ? (size_t)w : cap - len - 1;
  }
}

bool nccl_group_ok(Device *const *devs, int n, tg_dtype dt, int op) {
  if (n < 2) return false;
  for (int i = 0; i < n; i++) {
    if (!devs[i] || !devs[i]->vt || !devs[i]->vt->stream || !devs[i]->vt->stream_done || devs[i]->vt != devs[0]->vt) return false;
    for (int j = 0; j < i; j++)
      if (devs[j]->index == devs[i]->index) return false; /* one GPU twice (CUDA:0 and NV:0): copies */
  }
  const char *why = NULL;
  char buf[700];
  if (!getenv_int("NCCL", 1)) why = "NCCL=0";
  else if (nccl_type(dt) < 0) snprintf(buf, sizeof buf, "NCCL has no type for %s", tg_dtype_name(dt)), why = buf;
  else if (nccl_redop(op) < 0) why = "only sums and maxima go through NCCL";
  if (!why) {
    pthread_mutex_lock(&dist_lock);
    if (!nccl_load()) snprintf(buf, sizeof buf, "%s", N.why), why = buf;
    pthread_mutex_unlock(&dist_lock);
  }
  if (why && debug_level() >= 2) {
    char names[512];
    dev_names(devs, n, names, sizeof names);
    fprintf(stderr, "allreduce over %s with copies, not NCCL: %s\n", names, why);
  }
  return !why;
}

static void clique_free(Clique *q) {
  free(q->dev);
  free(q->comm);
  free(q);
}

/* Destroys every clique's communicators (at process exit; not while another thread is in a
 * collective: exit must not wait for it). */
static void nccl_at_exit(void) {
  if (pthread_mutex_trylock(&dist_lock) != 0) return;
  for (Clique *q = N.cliques, *nx; q; q = nx) {
    nx = q->next;
    for (int i = 0; i < q->n; i++) N.CommDestroy(q->comm[i]);
    clique_free(q);
  }
  N.cliques = NULL;
  pthread_mutex_unlock(&dist_lock);
}

/* Aborts a clique that failed and forgets it. */
static void clique_abort(Clique *q) {
  for (Clique **p = &N.cliques; *p; p = &(*p)->next)
    if (*p == q) {
      *p = q->next;
      break;
    }
  for (int i = 0; i < q->n; i++) N.CommAbort(q->comm[i]);
  clique_free(q);
}

static tg_status group_fail(const char *what, const char *names, int rc) {
  return tg_set_error(TG_ERR_RUNTIME, "allreduce over %s: %s failed (NCCL error %d: %s); NCCL=0 allreduces with copies between the "
                      "devices instead", names, what, rc, N.GetErrorString ? N.GetErrorString(rc) : "unknown");
}

/* The clique of devs[0..n) (made at its first use). NULL + error. */
static Clique *clique_get(Device *const *devs, int n, const char *names) {
  for (Clique *q = N.cliques; q; q = q->next)
    if (q->n == n && !memcmp(q->dev, devs, sizeof(Device *) * (size_t)n)) return q;
  if (!devs[0]->vt->stream(devs[0]->state)) return NULL; /* a context current on this thread */
  int *ord = tg_xmalloc(sizeof(int) * (size_t)n);
  for (int i = 0; i < n; i++) ord[i] = devs[i]->index; /* CUDA:N is the driver's (and NCCL's) GPU N */
  void **comm = tg_xcalloc((size_t)n, sizeof(void *));
  int rc = N.CommInitAll(comm, n, ord);
  free(ord);
  if (rc != NCCL_SUCCESS) {
    free(comm);
    return group_fail("ncclCommInitAll", names, rc), NULL;
  }
  Clique *q = tg_xcalloc(1, sizeof *q);
  q->n = n;
  q->dev = tg_xmalloc(sizeof(Device *) * (size_t)n);
  memcpy(q->dev, devs, sizeof(Device *) * (size_t)n);
  q->comm = comm;
  q->next = N.cliques;
  N.cliques = q;
  if (!N.exit_hook) N.exit_hook = atexit(nccl_at_exit) == 0;
  return q;
}

/* Waits for every stream of the group just enqueued, watching the communicators' errors. */
static tg_status clique_wait(Clique *q, const char *names) {
  double t0 = now_seconds(), limit = (double)getenv_int("DIST_TIMEOUT", 600);
  for (;;) {
    for (int i = 0; i < q->n; i++) {
      int err = NCCL_SUCCESS;
      if (N.CommGetAsyncError(q->comm[i], &err) == NCCL_SUCCESS && err != NCCL_SUCCESS && err != NCCL_IN_PROGRESS) {
        clique_abort(q);
        return group_fail("ncclAllReduce", names, err);
      }
    }
    bool all = true;
    for (int i = 0; i < q->n; i++) {
      int done = q->dev[i]->vt->stream_done(q->dev[i]->state);
      if (done < 0) {
        clique_abort(q);
        return tg_last_status();
      }
      all = all && done;
    }
    if (all) return TG_OK;
    if (now_seconds() - t0 > limit) {
      clique_abort(q);
      return tg_set_error(TG_ERR_RUNTIME, "allreduce over %s: ncclAllReduce did not finish in %.0f s (DIST_TIMEOUT); its "
                          "communicators were aborted (NCCL=0 allreduces with copies between the devices instead)", names, limit);
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

tg_status nccl_group_exec(Buffer *const *out, Buffer *const *in, int n, size_t nbytes, tg_dtype dt, int op) {
  Device **devs = tg_xmalloc(sizeof(Device *) * (size_t)n);
  for (int i = 0; i < n; i++) devs[i] = out[i]->dev, buffer_written(out[i]);
  char names[512];
  dev_names(devs, n, names, sizeof names);
  pthread_mutex_lock(&dist_lock);
  tg_status st = TG_OK;
  int ty = nccl_type(dt), rop = nccl_redop(op);
  Clique *q = NULL;
  if (!nccl_load()) st = tg_set_error(TG_ERR_RUNTIME, "allreduce over %s: %s", names, N.why);
  else if (ty < 0 || rop < 0)
    st = tg_set_error(TG_ERR_INVALID, "allreduce over %s: NCCL cannot %s %s", names, redop_name(op), tg_dtype_name(dt));
  else if (!(q = clique_get(devs, n, names))) st = tg_last_status();
  void **streams = tg_xcalloc((size_t)n, sizeof(void *));
  for (int i = 0; st == TG_OK && i < n; i++)
    if (!(streams[i] = devs[i]->vt->stream(devs[i]->state))) st = tg_last_status();
  if (st == TG_OK) {
    size_t cnt = nbytes / tg_dtype_itemsize(dt);
    const char *what = "ncclGroupStart";
    int rc = N.GroupStart();
    if (rc == NCCL_SUCCESS) {
      for (int i = 0; rc == NCCL_SUCCESS && i < n; i++)
        if ((rc = N.AllReduce(in[i]->ptr, out[i]->ptr, cnt, ty, rop, q->comm[i], streams[i])) != NCCL_SUCCESS) what = "ncclAllReduce";
      int rc2 = N.GroupEnd(); /* closed even when a call in it failed */
      if (rc2 != NCCL_SUCCESS && rc == NCCL_SUCCESS) rc = rc2, what = "ncclGroupEnd";
    }
    if (rc != NCCL_SUCCESS) {
      clique_abort(q);
      st = group_fail(what, names, rc);
    } else {
      st = clique_wait(q, names);
    }
  }
  pthread_mutex_unlock(&dist_lock);
  free(streams);
  free(devs);
  return st;
}
