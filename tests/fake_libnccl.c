/*
 * fake_libnccl.c -- a stand-in for NVIDIA's libnccl.so.2, for host-side tests of tg_dist's NCCL path
 * (engine/dist.c) through TG_NCCL_LIB, next to tests/fake_libcuda.c (whose GPU memory is host
 * memory). Built as build/tests/libfakenccl.so by the Makefile; not part of libtinygrad.
 *
 * In: the nccl* calls dist.c makes. Out: each collective done with the matching MPI call on the
 * "device" pointers, through the Open MPI library the process has loaded already (tg_dist_init
 * opens it with RTLD_GLOBAL), so a job of several ranks exchanges real data. An id is valid only if
 * it came from ncclGetUniqueId (on rank 0, handed over by the caller); a communicator checks its
 * rank and size. fake_nccl_stat(name) reads the counters ("init", "allreduce", "broadcast",
 * "reduce", "destroy", "abort"). Knob (read at each call): FAKE_NCCL_FAIL=<call name> makes that
 * call ("allreduce", "broadcast", "reduce", "init") return ncclSystemError; FAKE_NCCL_ASYNC=1
 * makes ncclCommGetAsyncError report ncclRemoteError (a peer that died).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct {
  int rank, nranks;
} FakeComm;
enum { OK = 0, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4, REMOTE_ERROR = 6 };
static const char MAGIC[] = "fake-nccl-id";

static struct {
  long init, allreduce, broadcast, reduce, destroy, abort;
} g_st;

long fake_nccl_stat(const char *name) {
  if (!strcmp(name, "init")) return g_st.init;
  if (!strcmp(name, "allreduce")) return g_st.allreduce;
  if (!strcmp(name, "broadcast")) return g_st.broadcast;
  if (!strcmp(name, "reduce")) return g_st.reduce;
  if (!strcmp(name, "destroy")) return g_st.destroy;
  if (!strcmp(name, "abort")) return g_st.abort;
  return -1;
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
  g_st.init++;
  return OK;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, FakeComm *comm, void *stream) {
  if (!comm || !stream || op != 0 || !mpi_type(type)) return INVALID_ARGUMENT;
  if (fails("allreduce")) return SYSTEM_ERROR;
  int (*f)(const void *, void *, int, void *, void *, void *) =
      (int (*)(const void *, void *, int, void *, void *, void *))mpi("MPI_Allreduce");
  if (!f || f(send, recv, (int)count, mpi_type(type), mpi("ompi_mpi_op_sum"), mpi("ompi_mpi_comm_world"))) return SYSTEM_ERROR;
  g_st.allreduce++;
  return OK;
}

int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, FakeComm *comm, void *stream) {
  if (!comm || !stream || !mpi_type(type) || root < 0 || root >= comm->nranks) return INVALID_ARGUMENT;
  if (fails("broadcast")) return SYSTEM_ERROR;
  if (comm->rank == root && send != recv) memcpy(recv, send, count * type_size(type));
  int (*f)(void *, int, void *, int, void *) = (int (*)(void *, int, void *, int, void *))mpi("MPI_Bcast");
  if (!f || f(recv, (int)count, mpi_type(type), root, mpi("ompi_mpi_comm_world"))) return SYSTEM_ERROR;
  g_st.broadcast++;
  return OK;
}

int ncclReduce(const void *send, void *recv, size_t count, int type, int op, int root, FakeComm *comm, void *stream) {
  if (!comm || !stream || op != 0 || !mpi_type(type) || root < 0 || root >= comm->nranks) return INVALID_ARGUMENT;
  if (fails("reduce")) return SYSTEM_ERROR;
  int (*f)(const void *, void *, int, void *, void *, int, void *) =
      (int (*)(const void *, void *, int, void *, void *, int, void *))mpi("MPI_Reduce");
  if (!f || f(send, recv, (int)count, mpi_type(type), mpi("ompi_mpi_op_sum"), root, mpi("ompi_mpi_comm_world"))) return SYSTEM_ERROR;
  g_st.reduce++;
  return OK;
}

int ncclCommGetAsyncError(FakeComm *comm, int *err) {
  if (!comm || !err) return INVALID_ARGUMENT;
  const char *a = getenv("FAKE_NCCL_ASYNC");
  *err = a && atoi(a) ? REMOTE_ERROR : OK;
  return OK;
}

int ncclCommAbort(FakeComm *comm) {
  free(comm);
  g_st.abort++;
  return OK;
}

int ncclCommDestroy(FakeComm *comm) {
  free(comm);
  g_st.destroy++;
  return OK;
}
