/*
 * fake_libnccl.c -- a stand-in for NVIDIA's libnccl.so.2, for host-side tests of tg_dist's NCCL path
 * (engine/dist.c) through TG_NCCL_LIB, next to tests/fake_libcuda.c (whose GPU memory is host
 * memory). Built as build/tests/libfakenccl.so by the Makefile; not part of libtinygrad.
 *
 * In: the nccl* calls dist.c makes. Two kinds of communicators:
 *  - across processes (ncclGetUniqueId, ncclCommInitRank): each collective is done with the matching
 *    MPI call on the "device" pointers, through the Open MPI library the process has loaded already
 *    (tg_dist_init opens it with RTLD_GLOBAL), so a job of several ranks exchanges real data. An id
 *    is valid only if it came from ncclGetUniqueId (on rank 0, handed over by the caller); a
 *    communicator checks its rank and size.
 *  - inside one process (ncclCommInitAll: one communicator per listed device, a clique): an
 *    ncclAllReduce on one of them must come between ncclGroupStart and ncclGroupEnd (real NCCL would
 *    wait forever for the others on one thread); the group queues the calls and ncclGroupEnd combines
 *    those of each clique -- every rank of it exactly once, with equal counts, types and ops -- on the
 *    host (sum, prod, max, min over every NCCL type but fp8), in rank order, into every rank's recv.
 * fake_nccl_stat(name) reads the counters: "init" (ncclCommInitRank), "initall", "allreduce" (calls,
 * both kinds), "group" (ncclGroupEnd calls that combined something), "local_allreduce" (allreduces
 * combined in a group), "last_op", "last_count", "last_type", "last_nranks" (of the last one),
 * "broadcast", "reduce", "destroy", "abort", "live" (communicators neither destroyed nor aborted).
 * Knobs (read at each call): FAKE_NCCL_FAIL=<call name> makes that call ("allreduce", "broadcast",
 * "reduce", "init", "initall", "groupstart", "groupend") return ncclSystemError; FAKE_NCCL_ASYNC=1
 * makes ncclCommGetAsyncError report ncclRemoteError (a peer that died); FAKE_NCCL_LIVE_CHECK=1
 * makes the process exit with status 3 (after saying so) if communicators are still live when the
 * library is unloaded at exit.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct {
  int n, refs; /* its communicators; those not yet destroyed */
} Clique;
typedef struct {
  int rank, nranks;
  Clique *clique; /* NULL: a communicator across processes (MPI) */
} FakeComm;
enum { OK = 0, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, REMOTE_ERROR = 6 };
static const char MAGIC[] = "fake-nccl-id";

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  long init, initall, allreduce, group, local_allreduce, last_op, last_count, last_type, last_nranks, broadcast, reduce, destroy,
      abort, live;
} g_st;

long fake_nccl_stat(const char *name) {
  pthread_mutex_lock(&g_lock);
  long v = -1;
#define S(n) if (!strcmp(name, #n)) v = g_st.n;
  S(init) S(initall) S(allreduce) S(group) S(local_allreduce) S(last_op) S(last_count) S(last_type) S(last_nranks) S(broadcast)
  S(reduce) S(destroy) S(abort) S(live)
#undef S
  pthread_mutex_unlock(&g_lock);
  return v;
}

static void bump(long *c, long d) {
  pthread_mutex_lock(&g_lock);
  *c += d;
  pthread_mutex_unlock(&g_lock);
}

__attribute__((destructor)) static void live_check(void) {
  const char *c = getenv("FAKE_NCCL_LIVE_CHECK");
  if (c && atoi(c) && g_st.live) {
    fprintf(stderr, "fake libnccl: %ld communicators were neither destroyed nor aborted at exit\n", g_st.live);
    fflush(stderr);
    _exit(3);
  }
}

static int fails(const char *call) {
  const char *f = getenv("FAKE_NCCL_FAIL");
  return f && !strcmp(f, call);
}

/* Open MPI's entry points and predefined objects, from the process's global symbols */
static void *mpi(const char *name) { return dlsym(RTLD_DEFAULT, name); }
static void *mpi_type(int t) {
  switch (t) {
  case 7: return mpi("ompi_mpi_float");
  case 8: return mpi("ompi_mpi_double");
  case 2: return mpi("ompi_mpi_int");
  case 4: return mpi("ompi_mpi_long_long_int");
  default: return NULL;
  }
}
static size_t type_size(int t) { return t == 8 || t == 4 ? 8 : 4; }

const char *ncclGetErrorString(int r) {
  switch (r) {
  case OK: return "no error";
  case SYSTEM_ERROR: return "unhandled system error (fake)";
  case INVALID_ARGUMENT: return "invalid argument (fake)";
  case INVALID_USAGE: return "invalid usage (fake)";
  case REMOTE_ERROR: return "remote process exited or there was a network error (fake)";
  default: return "unknown (fake)";
  }
}

int ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return INVALID_ARGUMENT;
  memset(id, 0, sizeof *id);
  memcpy(id->internal, MAGIC, sizeof MAGIC);
  snprintf(id->internal + 32, 32, "%d", (int)getpid());
  return OK;
}

int ncclCommInitRank(FakeComm **comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks || memcmp(id.internal, MAGIC, sizeof MAGIC)) return INVALID_ARGUMENT;
  if (fails("init")) return SYSTEM_ERROR;
  int (*size)(void *, int *) = (int (*)(void *, int *))mpi("MPI_Comm_size");
  int (*rk)(void *, int *) = (int (*)(void *, int *))mpi("MPI_Comm_rank");
  int n = -1, r = -1;
  if (!size || !rk || size(mpi("ompi_mpi_comm_world"), &n) || rk(mpi("ompi_mpi_comm_world"), &r) || n != nranks || r != rank)
    return INVALID_ARGUMENT;
  *comm = calloc(1, sizeof **comm);
  if (!*comm) return SYSTEM_ERROR;
  (*comm)->rank = rank, (*comm)->nranks = nranks;
  bump(&g_st.init, 1), bump(&g_st.live, 1);
  return OK;
}

/* ---- inside one process: cliques and groups ---- */

int ncclCommInitAll(FakeComm **comms, int ndev, const int *devlist) {
  if (!comms || ndev < 1) return INVALID_ARGUMENT;
  for (int i = 0; i < ndev; i++) {
    if (devlist && devlist[i] < 0) return INVALID_ARGUMENT;
    for (int j = 0; devlist && j < i; j++)
      if (devlist[j] == devlist[i]) return INVALID_USAGE; /* NCCL: "Duplicate GPU detected" */
  }
  if (fails("initall")) return SYSTEM_ERROR;
  Clique *q = calloc(1, sizeof *q);
  if (!q) return SYSTEM_ERROR;
  q->n = q->refs = ndev;
  for (int i = 0; i < ndev; i++) {
    comms[i] = calloc(1, sizeof **comms);
    comms[i]->rank = i, comms[i]->nranks = ndev, comms[i]->clique = q;
  }
  bump(&g_st.initall, 1), bump(&g_st.live, ndev);
  return OK;
}

typedef struct {
  const void *send;
  void *recv;
  size_t count;
  int type, op;
  FakeComm *comm;
} Queued;
/* the calling thread's group (NCCL's group state is per thread) */
static __thread int t_depth;
static __thread Queued *t_q;
static __thread int t_nq, t_capq;

int ncclGroupStart(void) {
  if (fails("groupstart")) return SYSTEM_ERROR;
  t_depth++;
  return OK;
}

static size_t esize(int t) { return t <= 1 ? 1 : t == 6 || t == 9 ? 2 : t == 2 || t == 3 || t == 7 ? 4 : 8; }

static float half_to_f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, u;
  if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
    float v = (float)m * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  u = e == 31 ? sign | 0x7f800000 | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f_to_half(float f) { /* round to nearest even, as the GPU converts */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffff;
  if (ax > 0x7f800000) return sign | 0x7e00; /* NaN */
  if (ax >= 0x477ff000) return sign | 0x7c00; /* 65520 and up: inf */
  if (ax < 0x38800000) {                      /* below 2^-14: a subnormal half (or zero) */
    int e = (int)(ax >> 23);
    if (e < 102) return sign;
    uint32_t m = (ax & 0x7fffff) | 0x800000, sh = (uint32_t)(126 - e), q = m >> sh, r = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    if (r > half || (r == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t h = ((((ax >> 23) - 112) << 10) | ((ax & 0x7fffff) >> 13)), r = ax & 0x1fff;
  if (r > 0x1000 || (r == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}
static float bf_to_f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f_to_bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64); /* NaN stays NaN */
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

#define OPS(T)                                                                                                         \
  static T op_##T(int op, T a, T b) { return op == 0 ? (T)(a + b) : op == 1 ? (T)(a * b) : op == 2 ? (a > b ? a : b) : (a < b ? a : b); }
OPS(int8_t) OPS(uint8_t) OPS(int32_t) OPS(uint32_t) OPS(int64_t) OPS(uint64_t) OPS(float) OPS(double)
#undef OPS

/* acc = acc op x over n elements of NCCL type t (half and bfloat16 through float) */
static void combine(void *acc, const void *x, size_t n, int t, int op) {
#define LOOP(T)                                                                                                        \
  for (size_t i = 0; i < n; i++) ((T *)acc)[i] = op_##T(op, ((T *)acc)[i], ((const T *)x)[i]);                      \
  break;
  switch (t) {
  case 0: LOOP(int8_t)
  case 1: LOOP(uint8_t)
  case 2: LOOP(int32_t)
  case 3: LOOP(uint32_t)
  case 4: LOOP(int64_t)
  case 5: LOOP(uint64_t)
  case 7: LOOP(float)
  case 8: LOOP(double)
  case 6:
    for (size_t i = 0; i < n; i++)
      ((uint16_t *)acc)[i] = f_to_half(op_float(op, half_to_f(((uint16_t *)acc)[i]), half_to_f(((const uint16_t *)x)[i])));
    break;
  case 9:
    for (size_t i = 0; i < n; i++)
      ((uint16_t *)acc)[i] = f_to_bf(op_float(op, bf_to_f(((uint16_t *)acc)[i]), bf_to_f(((const uint16_t *)x)[i])));
    break;
  }
#undef LOOP
}

/* The queued allreduces of the clique of call k (all its ranks present, alike), combined. */
static int run_clique(int k) {
  Clique *q = t_q[k].comm->clique;
  const Queued **by = calloc((size_t)q->n, sizeof *by);
  if (!by) return SYSTEM_ERROR;
  int rc = OK;
  for (int i = 0; i < t_nq; i++) {
    const Queued *c = &t_q[i];
    if (c->comm->clique != q) continue;
    if (by[c->comm->rank] || c->count != t_q[k].count || c->type != t_q[k].type || c->op != t_q[k].op) rc = INVALID_USAGE;
    by[c->comm->rank] = c;
  }
  for (int r = 0; r < q->n && rc == OK; r++)
    if (!by[r]) rc = INVALID_USAGE; /* real NCCL would wait for it forever */
  size_t bytes = t_q[k].count * esize(t_q[k].type);
  char *acc = rc == OK ? malloc(bytes ? bytes : 1) : NULL;
  if (rc == OK && !acc) rc = SYSTEM_ERROR;
  if (rc == OK) {
    memcpy(acc, by[0]->send, bytes);
    for (int r = 1; r < q->n; r++) combine(acc, by[r]->send, t_q[k].count, t_q[k].type, t_q[k].op);
    for (int r = 0; r < q->n; r++) memcpy(by[r]->recv, acc, bytes);
    pthread_mutex_lock(&g_lock);
    g_st.local_allreduce++;
    g_st.last_op = t_q[k].op, g_st.last_count = (long)t_q[k].count, g_st.last_type = t_q[k].type, g_st.last_nranks = q->n;
    pthread_mutex_unlock(&g_lock);
  }
  for (int i = 0; i < t_nq; i++) /* done with these */
    if (t_q[i].comm && t_q[i].comm->clique == q && (&t_q[i] != &t_q[k])) t_q[i].comm = NULL;
  t_q[k].comm = NULL;
  free(acc);
  free(by);
  return rc;
}

int ncclGroupEnd(void) {
  if (t_depth == 0) return INVALID_USAGE;
  if (--t_depth > 0) return OK;
  int rc = fails("groupend") ? SYSTEM_ERROR : OK;
  bool any = t_nq > 0;
  for (int k = 0; k < t_nq && rc == OK; k++)
    if (t_q[k].comm) rc = run_clique(k);
  free(t_q);
  t_q = NULL, t_nq = t_capq = 0;
  if (rc == OK && any) bump(&g_st.group, 1);
  return rc;
}

static int queue_allreduce(const void *send, void *recv, size_t cnt, int type, int op, FakeComm *comm) {
  if (t_depth == 0) return INVALID_USAGE; /* one thread calling one rank after another: needs a group */
  if (t_nq == t_capq) {
    int cap = t_capq ? 2 * t_capq : 8;
    Queued *q = realloc(t_q, sizeof *q * (size_t)cap);
    if (!q) return SYSTEM_ERROR;
    t_q = q, t_capq = cap;
  }
  t_q[t_nq++] = (Queued){send, recv, cnt, type, op, comm};
  return OK;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, FakeComm *comm, void *stream) {
  if (comm && comm->clique) {
    if (!stream || op < 0 || op > 3 || type < 0 || type > 9 || (count && (!send || !recv))) return INVALID_ARGUMENT;
    if (fails("allreduce")) return SYSTEM_ERROR;
    int rc = queue_allreduce(send, recv, count, type, op, comm);
    if (rc == OK) bump(&g_st.allreduce, 1);
    return rc;
  }
  if (!comm || !stream || op != 0 || !mpi_type(type)) return INVALID_ARGUMENT;
  if (fails("allreduce")) return SYSTEM_ERROR;
  int (*f)(const void *, void *, int, void *, void *, void *) =
      (int (*)(const void *, void *, int, void *, void *, void *))mpi("MPI_Allreduce");
  if (!f || f(send, recv, (int)count, mpi_type(type), mpi("ompi_mpi_op_sum"), mpi("ompi_mpi_comm_world"))) return SYSTEM_ERROR;
  bump(&g_st.allreduce, 1);
  return OK;
}

int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, FakeComm *comm, void *stream) {
  if (!comm || !stream || !mpi_type(type) || root < 0 || root >= comm->nranks) return INVALID_ARGUMENT;
  if (fails("broadcast")) return SYSTEM_ERROR;
  if (comm->rank == root && send != recv) memcpy(recv, send, count * type_size(type));
  int (*f)(void *, int, void *, int, void *) = (int (*)(void *, int, void *, int, void *))mpi("MPI_Bcast");
  if (!f || f(recv, (int)count, mpi_type(type), root, mpi("ompi_mpi_comm_world"))) return SYSTEM_ERROR;
  bump(&g_st.broadcast, 1);
  return OK;
}

int ncclReduce(const void *send, void *recv, size_t count, int type, int op, int root, FakeComm *comm, void *stream) {
  if (!comm || !stream || op != 0 || !mpi_type(type) || root < 0 || root >= comm->nranks) return INVALID_ARGUMENT;
  if (fails("reduce")) return SYSTEM_ERROR;
  int (*f)(const void *, void *, int, void *, void *, int, void *) =
      (int (*)(const void *, void *, int, void *, void *, int, void *))mpi("MPI_Reduce");
  if (!f || f(send, recv, (int)count, mpi_type(type), mpi("ompi_mpi_op_sum"), root, mpi("ompi_mpi_comm_world"))) return SYSTEM_ERROR;
  bump(&g_st.reduce, 1);
  return OK;
}

int ncclCommGetAsyncError(FakeComm *comm, int *err) {
  if (!comm || !err) return INVALID_ARGUMENT;
  const char *a = getenv("FAKE_NCCL_ASYNC");
  *err = a && atoi(a) ? REMOTE_ERROR : OK;
  return OK;
}

/* A clique's last communicator frees it. */
static void comm_free(FakeComm *comm) {
  if (comm->clique && --comm->clique->refs == 0) free(comm->clique);
  free(comm);
  bump(&g_st.live, -1);
}

int ncclCommAbort(FakeComm *comm) {
  if (!comm) return INVALID_ARGUMENT;
  comm_free(comm);
  bump(&g_st.abort, 1);
  return OK;
}

int ncclCommDestroy(FakeComm *comm) {
  if (!comm) return INVALID_ARGUMENT;
  comm_free(comm);
  bump(&g_st.destroy, 1);
  return OK;
}
