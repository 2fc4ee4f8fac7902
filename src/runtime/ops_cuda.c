/*
 * ops_cuda.c -- the NVIDIA device (DEV=CUDA, also spelled DEV=NV): buffers are GPU memory from the
 * CUDA driver API, kernels are CUDA C (renderer/cstyle.c, LANG_CUDA) compiled by NVRTC
 * (cuda_nvrtc.c) to a CUBIN for the GPU's arch, loaded as modules and launched on one stream.
 *
 * In: CUDA C source with `extern "C" __global__` kernels taking one pointer per buffer (no other
 * arguments: GPU kernels have no symbolic sizes), host data for copies.
 * Out: CUBINs or PTX (compile, cached on disk), loaded functions (load), launches (exec).
 * Invariants:
 *  - libcuda.so.1, the NVIDIA driver's library, is opened with dlopen at the first CUDA open, never
 *    linked; TG_CUDA_LIB names another file. A library whose cuInit fails is closed again (a later
 *    open tries afresh); one that initialised stays for the process.
 *  - CUDA:N is the driver's device N. An open device holds its primary context and one
 *    non-blocking stream: each of its copies and launches goes to that stream, in order, and every
 *    call that needs the context makes it current on the calling thread first.
 *  - copyin returns when src may be reused (copied into pinned staging, or consumed by the driver);
 *    copyout returns when dst holds the data. A staging half is reused only after the event
 *    recorded behind its last transfer has completed.
 *  - Buffer.ptr holds a CUdeviceptr, never a host address.
 *  - One module per distinct binary and device: the kernels of a batch compile share it (loaded
 *    once, unloaded with its last kernel).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_nvrtc.h"

/* The few CUDA driver types and constants used here, as cuda.h defines them (no build dependency
 * on the CUDA headers). */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
};
enum {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2, /* Y = 3, Z = 4 */
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,  /* Y = 6, Z = 7 */
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
};
#define CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK 0
#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_EVENT_DISABLE_TIMING 0x2u
#define CU_MEMHOSTALLOC_PORTABLE 0x1u

/* The entry points: the field, the symbol (the _v2 one where the driver has it), and an older
 * symbol to fall back on (NULL: none). */
#define CU_FUNCS(X)                                                                                                  \
  X(cuInit, "cuInit", NULL, (unsigned))                                                                              \
  X(cuDriverGetVersion, "cuDriverGetVersion", NULL, (int *))                                                         \
  X(cuDeviceGetCount, "cuDeviceGetCount", NULL, (int *))                                                             \
  X(cuDeviceGet, "cuDeviceGet", NULL, (CUdevice *, int))                                                             \
  X(cuDeviceGetName, "cuDeviceGetName", NULL, (char *, int, CUdevice))                                               \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", NULL, (int *, int, CUdevice))                                      \
  X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", NULL, (size_t *, CUdevice))                                             \
  X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", NULL, (int *, CUdevice, CUdevice))                               \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL, (CUcontext *, CUdevice))                             \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", (CUdevice))              \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", NULL, (CUcontext))                                                           \
  X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", NULL, (CUcontext, unsigned))                                     \
  X(cuStreamCreate, "cuStreamCreate", NULL, (CUstream *, unsigned))                                                  \
  X(cuStreamSynchronize, "cuStreamSynchronize", NULL, (CUstream))                                                    \
  X(cuStreamQuery, "cuStreamQuery", NULL, (CUstream))                                                                \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", NULL, (CUstream, CUevent, unsigned))                                     \
  X(cuStreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy", (CUstream))                                            \
  X(cuMemAlloc, "cuMemAlloc_v2", NULL, (CUdeviceptr *, size_t))                                                      \
  X(cuMemFree, "cuMemFree_v2", NULL, (CUdeviceptr))                                                                  \
  X(cuMemGetInfo, "cuMemGetInfo_v2", NULL, (size_t *, size_t *))                                                     \
  X(cuMemHostAlloc, "cuMemHostAlloc", NULL, (void **, size_t, unsigned))                                             \
  X(cuMemFreeHost, "cuMemFreeHost", NULL, (void *))                                                                  \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", NULL, (CUdeviceptr, const void *, size_t, CUstream))                  \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", NULL, (void *, CUdeviceptr, size_t, CUstream))                        \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", NULL, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                   \
  X(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", NULL, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream)) \
  X(cuModuleLoadData, "cuModuleLoadData", NULL, (CUmodule *, const void *))                                          \
  X(cuModuleGetFunction, "cuModuleGetFunction", NULL, (CUfunction *, CUmodule, const char *))                        \
  X(cuModuleUnload, "cuModuleUnload", NULL, (CUmodule))                                                              \
  X(cuFuncGetAttribute, "cuFuncGetAttribute", NULL, (int *, int, CUfunction))                                        \
  X(cuLaunchKernel, "cuLaunchKernel", NULL,                                                                          \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **))  \
  X(cuEventCreate, "cuEventCreate", NULL, (CUevent *, unsigned))                                                     \
  X(cuEventRecord, "cuEventRecord", NULL, (CUevent, CUstream))                                                       \
  X(cuEventSynchronize, "cuEventSynchronize", NULL, (CUevent))                                                       \
  X(cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime", (float *, CUevent, CUevent))                  \
  X(cuEventDestroy, "cuEventDestroy_v2", "cuEventDestroy", (CUevent))                                                \
  X(cuGetErrorName, "cuGetErrorName", NULL, (CUresult, const char **))

typedef struct {
#define DECL(field, sym, old, args) CUresult(*field) args;
  CU_FUNCS(DECL)
#undef DECL
} CuApi;

static CuApi g_cu;

/* CUDA graphs (TinyJit's replays): optional, a driver without them replays launch by launch. The
 * kernel node's parameters in their first layout (CUDA_KERNEL_NODE_PARAMS_v1), which every driver
 * since CUDA 10 keeps under the unversioned names. */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct {
  CUfunction func;
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  void **kernelParams, **extra;
} CuKernelNodeParams;
static struct {
  CUresult (*create)(CUgraph *, unsigned);
  CUresult (*add_kernel)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const CuKernelNodeParams *);
  CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*set_params)(CUgraphExec, CUgraphNode, const CuKernelNodeParams *);
  CUresult (*launch)(CUgraphExec, CUstream);
  CUresult (*exec_destroy)(CUgraphExec);
  CUresult (*destroy)(CUgraph);
} g_cug;
static void *g_cu_lib;
static char *g_cu_libname; /* the file g_cu_lib came from (messages) */
static pthread_mutex_t g_cu_lock = PTHREAD_MUTEX_INITIALIZER;

#define CU_LIBRARY "libcuda.so.1"

/* A name for a driver error: the driver's own where it has one. */
static const char *cu_err(CUresult r) {
  const char *s = NULL;
  if (g_cu.cuGetErrorName && g_cu.cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
  switch (r) {
  case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
  case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
  case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
  default: return "CUDA error";
  }
}

/* The symbol `sym`, else `old` (NULL: no older name). */
static void *dlsym_either(void *h, const char *sym, const char *old) {
  void *p = dlsym(h, sym);
  return p || !old ? p : dlsym(h, old);
}

/* Opens the driver library and initialises it, once it works; false + an error saying what is
 * missing and where it comes from. Caller holds g_cu_lock. */
static bool cu_load_locked(void) {
  if (g_cu_lib) return true;
  const char *name = getenv_str("TG_CUDA_LIB", CU_LIBRARY);
  if (!name || !*name) name = CU_LIBRARY;
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    tg_set_error(TG_ERR_RUNTIME, "CUDA: cannot load the CUDA driver library %s (%s); it comes with the NVIDIA driver "
                 "(install the driver on a machine with an NVIDIA GPU; the CUDA toolkit alone does not provide it)",
                 name, why ? why : "not found");
    return false;
  }
  CuApi api;
  const char *missing = NULL;
#define LOAD(field, sym, old, args) \
  if (!missing && !(*(void **)&api.field = dlsym_either(h, sym, old))) missing = sym;
  CU_FUNCS(LOAD)
#undef LOAD
  if (missing) {
    tg_set_error(TG_ERR_RUNTIME, "CUDA: %s has no %s (not the CUDA driver library, or a driver older than CUDA 11)", name, missing);
    dlclose(h);
    return false;
  }
  CUresult r = api.cuInit(0);
  if (r != CUDA_SUCCESS) {
    g_cu = api; /* for cu_err */
    if (r == CUDA_ERROR_STUB_LIBRARY)
      tg_set_error(TG_ERR_RUNTIME, "CUDA: only the CUDA toolkit's stub libcuda was found (%s): no NVIDIA driver is "
                   "installed (libcuda.so.1 comes with the NVIDIA driver)", name);
    else if (r == CUDA_ERROR_NO_DEVICE)
      tg_set_error(TG_ERR_RUNTIME, "CUDA: no NVIDIA GPU found (cuInit: CUDA_ERROR_NO_DEVICE, driver library %s)", name);
    else if (r == CUDA_ERROR_INSUFFICIENT_DRIVER)
      tg_set_error(TG_ERR_RUNTIME, "CUDA: the NVIDIA kernel driver is older than its library %s (cuInit: "
                   "CUDA_ERROR_INSUFFICIENT_DRIVER): reinstall or update the driver", name);
    else
      tg_set_error(TG_ERR_RUNTIME, "CUDA: cuInit failed: %s (%d), driver library %s", cu_err(r), r, name);
    memset(&g_cu, 0, sizeof g_cu);
    dlclose(h);
    return false;
  }
  g_cu = api;
  g_cu_lib = h;
  memset(&g_cug, 0, sizeof g_cug);
  void *gf[7] = {dlsym(h, "cuGraphCreate"), dlsym(h, "cuGraphAddKernelNode"), dlsym(h, "cuGraphInstantiateWithFlags"),
                 dlsym(h, "cuGraphExecKernelNodeSetParams"), dlsym(h, "cuGraphLaunch"), dlsym(h, "cuGraphExecDestroy"),
                 dlsym(h, "cuGraphDestroy")};
  bool all = true;
  for (int i = 0; i < 7; i++) all = all && gf[i];
  if (all) {
    *(void **)&g_cug.create = gf[0], *(void **)&g_cug.add_kernel = gf[1], *(void **)&g_cug.instantiate = gf[2];
    *(void **)&g_cug.set_params = gf[3], *(void **)&g_cug.launch = gf[4], *(void **)&g_cug.exec_destroy = gf[5];
    *(void **)&g_cug.destroy = gf[6];
  }
  free(g_cu_libname);
  g_cu_libname = tg_xstrdup(name);
  return true;
}

/* A module: one loaded binary, shared by the kernels compiled into it. */
typedef struct CuModule {
  uint64_t hash;
  size_t len;
  CUmodule mod;
  int refs;
  struct CuModule *next;
} CuModule;

typedef struct {
  CuModule *m;
  CUfunction fn;
  int max_threads; /* threads per block this kernel can take (its registers limit it) */
  char name[64];
} CuProgram;

/* Pinned staging for copies: two halves, so one is filled or drained while the other transfers. */
#define STAGE_HALF ((size_t)8 << 20)

typedef struct {
  int index;
  char label[24]; /* "CUDA:1" for messages */
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  CUevent ev_start, ev_end; /* a launch's timing */
  pthread_mutex_t lock;     /* the stream's order of submission, staging, modules, peers */
  int sm;                   /* the GPU's compute capability: 90 for sm_90 */
  int target;               /* the arch kernels are compiled for */
  bool cubin;               /* compiled to machine code (else PTX the driver compiles at load) */
  char id[96];              /* NVRTC version, arch and format: the disk cache's and program cache's key */
  char name[256];
  int sms, driver_version;
  size_t total_mem;
  int64_t max_grid[3];
  DeviceCaps caps;
  uint8_t *stage;           /* 2 * STAGE_HALF pinned bytes; NULL until first used or when refused */
  bool stage_refused;
  CUevent stage_ev[2];
  bool stage_busy[2];
  CuModule *mods;
  int *peers;               /* devices whose memory this context may access (peer access enabled) */
  size_t npeers;
} CuState;

static void cu_current(CuState *s) { g_cu.cuCtxSetCurrent(s->ctx); }

/* The NVIDIA kernel module's version from /proc ("580.65.06"), or "" where it cannot be read. */
static void kernel_driver_version(char *out, size_t cap) {
  out[0] = '\0';
  FILE *f = fopen("/proc/driver/nvidia/version", "r");
  if (!f) return;
  char line[512];
  if (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "Kernel Module");
    if (p) {
      p += strlen("Kernel Module");
      while (*p == ' ') p++;
      size_t n = strcspn(p, " \t\n");
      snprintf(out, cap, "%.*s", (int)n, p);
    }
  }
  fclose(f);
}

static int attr(CuState *s, int a, int dflt) {
  int v = 0;
  return g_cu.cuDeviceGetAttribute(&v, a, s->dev) == CUDA_SUCCESS ? v : dflt;
}

static void cuda_close(void *state);

/* The arch kernels are compiled for: the GPU's own, or `arch` (sm_XX) where the GPU can run it. */
static bool pick_target(CuState *s, const char *arch) {
  int want = s->sm;
  if (arch && !cuda_parse_arch("CUDA", arch, &want)) return false;
  if (want > s->sm) {
    tg_set_error(TG_ERR_INVALID, "%s: the GPU is sm_%d and cannot run code for %s", s->label, s->sm, arch);
    return false;
  }
  bool cubin = false;
  int t = nvrtc_target(s->label, want, &cubin);
  if (!t) return false;
  /* machine code runs only on GPUs of its major version with at least its minor one; older majors
   * go as PTX, which the driver compiles for this GPU */
  s->cubin = cubin && t / 10 == s->sm / 10;
  s->target = t;
  s->caps.sm = want; /* what codegen may use (tensor cores from sm_80) */
  int major, minor;
  nvrtc_version(&major, &minor);
  s->caps.wgmma = t == 90 && s->sm == 90 && major >= 12;
  snprintf(s->id, sizeof s->id, "nvrtc-%d.%d-sm_%d-%s", major, minor, t, s->cubin ? "cubin" : "ptx");
  return true;
}

static void *cuda_open_arch(int index, const char *arch) {
  int sm_check = 0;
  if (arch && !cuda_parse_arch("CUDA", arch, &sm_check)) return NULL; /* a bad string needs no GPU to be told */
  pthread_mutex_lock(&g_cu_lock);
  bool ok = cu_load_locked();
  pthread_mutex_unlock(&g_cu_lock);
  if (!ok) return NULL;
  int n = 0;
  CUresult r = g_cu.cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS || n == 0) {
    tg_set_error(TG_ERR_RUNTIME, "CUDA: no NVIDIA GPU found (%s)", r != CUDA_SUCCESS ? cu_err(r) : "the driver reports 0 devices");
    return NULL;
  }
  if (index >= n) {
    char have[64];
    if (n == 1) snprintf(have, sizeof have, "one GPU, CUDA:0");
    else snprintf(have, sizeof have, "%d GPUs, CUDA:0 to CUDA:%d", n, n - 1);
    tg_set_error(TG_ERR_RUNTIME, "CUDA: no device CUDA:%d (this machine has %s)", index, have);
    return NULL;
  }
  if (!nvrtc_load("CUDA")) return NULL;
  CuState *s = tg_xcalloc(1, sizeof *s);
  s->index = index;
  snprintf(s->label, sizeof s->label, "CUDA:%d", index);
  pthread_mutex_init(&s->lock, NULL);
  const char *what = "cuDeviceGet";
  if ((r = g_cu.cuDeviceGet(&s->dev, index)) == CUDA_SUCCESS && (what = "cuDevicePrimaryCtxRetain") &&
      (r = g_cu.cuDevicePrimaryCtxRetain(&s->ctx, s->dev)) == CUDA_SUCCESS && (what = "cuCtxSetCurrent") &&
      (r = g_cu.cuCtxSetCurrent(s->ctx)) == CUDA_SUCCESS && (what = "cuStreamCreate") &&
      (r = g_cu.cuStreamCreate(&s->stream, CU_STREAM_NON_BLOCKING)) == CUDA_SUCCESS && (what = "cuEventCreate") &&
      (r = g_cu.cuEventCreate(&s->ev_start, 0)) == CUDA_SUCCESS)
    r = g_cu.cuEventCreate(&s->ev_end, 0);
  if (r != CUDA_SUCCESS) {
    tg_set_error(TG_ERR_RUNTIME, "CUDA: cannot set up %s: %s failed: %s (%d)", s->label, what, cu_err(r), r);
    cuda_close(s);
    return NULL;
  }
  if (g_cu.cuDeviceGetName(s->name, (int)sizeof s->name - 1, s->dev) != CUDA_SUCCESS) snprintf(s->name, sizeof s->name, "?");
  s->sm = attr(s, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0) * 10 + attr(s, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0);
  s->sms = attr(s, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
  if (g_cu.cuDriverGetVersion(&s->driver_version) != CUDA_SUCCESS) s->driver_version = 0;
  if (g_cu.cuDeviceTotalMem(&s->total_mem, s->dev) != CUDA_SUCCESS) s->total_mem = 0;
  DeviceCaps *c = &s->caps;
  c->lang = LANG_CUDA;
  c->gpu = true;
  c->fp16 = c->fp64 = true;
  c->max_dims = 3;
  c->max_local = attr(s, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024);
  for (int i = 0; i < 3; i++) {
    c->max_local_dims[i] = attr(s, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X + i, i < 2 ? 1024 : 64);
    s->max_grid[i] = attr(s, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X + i, i ? 65535 : 0x7fffffff);
  }
  c->local_mem = attr(s, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 48 * 1024);
  if (s->sm < 50) {
    tg_set_error(TG_ERR_RUNTIME, "%s (%s) reports compute capability sm_%d; tinygrad.c needs sm_50 or newer", s->label, s->name, s->sm);
    cuda_close(s);
    return NULL;
  }
  if (!pick_target(s, arch)) {
    cuda_close(s);
    return NULL;
  }
  return s;
}

static void *cuda_open(int index) { return cuda_open_arch(index, NULL); }

static void cuda_close(void *state) {
  CuState *s = state;
  if (!s) return;
  if (s->ctx) {
    cu_current(s);
    if (s->stream) g_cu.cuStreamSynchronize(s->stream);
    for (CuModule *m = s->mods, *nx; m; m = nx) {
      nx = m->next;
      g_cu.cuModuleUnload(m->mod);
      free(m);
    }
    for (int i = 0; i < 2; i++)
      if (s->stage_ev[i]) g_cu.cuEventDestroy(s->stage_ev[i]);
    if (s->stage) g_cu.cuMemFreeHost(s->stage);
    if (s->ev_start) g_cu.cuEventDestroy(s->ev_start);
    if (s->ev_end) g_cu.cuEventDestroy(s->ev_end);
    if (s->stream) g_cu.cuStreamDestroy(s->stream);
    g_cu.cuDevicePrimaryCtxRelease(s->dev);
  }
  pthread_mutex_destroy(&s->lock);
  free(s->peers);
  free(s);
}

static void cuda_caps(void *state, DeviceCaps *out) { *out = ((CuState *)state)->caps; }
static const char *cuda_compiler_id(void *state) { return ((CuState *)state)->id; }

static void cuda_describe(void *state) {
  CuState *s = state;
  size_t free_b = 0, total_b = 0;
  cu_current(s);
  if (g_cu.cuMemGetInfo(&free_b, &total_b) != CUDA_SUCCESS) free_b = 0, total_b = s->total_mem;
  char kmod[64];
  kernel_driver_version(kmod, sizeof kmod);
  int major, minor;
  nvrtc_version(&major, &minor);
  fprintf(stderr, "%s: %s, sm_%d, %d SMs, %.1f GiB (%.1f GiB free), CUDA driver API %d.%d%s%s (%s); kernels: %s for sm_%d by NVRTC %d.%d\n",
          s->label, s->name, s->sm, s->sms, (double)total_b / (1 << 30), (double)free_b / (1 << 30), s->driver_version / 1000,
          (s->driver_version % 1000) / 10, kmod[0] ? ", NVIDIA driver " : "", kmod, g_cu_libname ? g_cu_libname : CU_LIBRARY,
          s->cubin ? "CUBIN" : "PTX", s->target, major, minor);
}

/* ---------------------------------------------------------------------------------------------- */
/* memory                                                                                          */

static void *cuda_alloc(void *state, size_t nbytes) {
  CuState *s = state;
  CUdeviceptr p = 0;
  cu_current(s);
  CUresult r = g_cu.cuMemAlloc(&p, nbytes ? nbytes : 1);
  if (r == CUDA_SUCCESS && p) return (void *)(uintptr_t)p;
  size_t free_b = 0, total_b = 0;
  if (g_cu.cuMemGetInfo(&free_b, &total_b) != CUDA_SUCCESS) free_b = total_b = 0;
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    tg_set_error(TG_ERR_RUNTIME, "CUDA: out of GPU memory on %s: cannot allocate %zu bytes (%zu MiB free of %zu MiB)", s->label,
                 nbytes, free_b >> 20, total_b >> 20);
  else
    tg_set_error(TG_ERR_RUNTIME, "CUDA: cannot allocate %zu bytes on %s: %s (%d)", nbytes, s->label, cu_err(r), r);
  return NULL;
}

static void cuda_free(void *state, void *ptr, size_t nbytes) {
  (void)nbytes;
  if (!ptr) return;
  cu_current(state);
  g_cu.cuMemFree((CUdeviceptr)(uintptr_t)ptr);
}

/* The staging buffer, set up at first use; false when the driver refuses pinned memory (copies
 * then go straight from and to pageable memory). Caller holds s->lock. */
static bool stage_ready(CuState *s) {
  if (s->stage) return true;
  if (s->stage_refused) return false;
  void *p = NULL;
  if (g_cu.cuMemHostAlloc(&p, 2 * STAGE_HALF, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS || !p ||
      g_cu.cuEventCreate(&s->stage_ev[0], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      g_cu.cuEventCreate(&s->stage_ev[1], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    for (int i = 0; i < 2; i++)
      if (s->stage_ev[i]) g_cu.cuEventDestroy(s->stage_ev[i]), s->stage_ev[i] = NULL;
    if (p) g_cu.cuMemFreeHost(p);
    s->stage_refused = true;
    return false;
  }
  s->stage = p;
  return true;
}

/* Waits until staging half i is no longer read or written by a transfer. */
static CUresult stage_wait(CuState *s, int i) {
  if (!s->stage_busy[i]) return CUDA_SUCCESS;
  s->stage_busy[i] = false;
  return g_cu.cuEventSynchronize(s->stage_ev[i]);
}

static tg_status cuda_copyin(void *state, void *dst, const void *src, size_t nbytes) {
  CuState *s = state;
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst;
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  CUresult r = CUDA_SUCCESS;
  if (!stage_ready(s)) {
    r = g_cu.cuMemcpyHtoDAsync(d, src, nbytes, s->stream); /* pageable: the driver has read src on return */
  } else {
    for (size_t off = 0, k = 0; off < nbytes && r == CUDA_SUCCESS; off += STAGE_HALF, k++) {
      int i = (int)(k & 1);
      size_t m = nbytes - off < STAGE_HALF ? nbytes - off : STAGE_HALF;
      if ((r = stage_wait(s, i)) != CUDA_SUCCESS) break;
      memcpy(s->stage + (size_t)i * STAGE_HALF, (const char *)src + off, m);
      if ((r = g_cu.cuMemcpyHtoDAsync(d + off, s->stage + (size_t)i * STAGE_HALF, m, s->stream)) == CUDA_SUCCESS &&
          (r = g_cu.cuEventRecord(s->stage_ev[i], s->stream)) == CUDA_SUCCESS)
        s->stage_busy[i] = true;
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (r != CUDA_SUCCESS)
    return tg_set_error(TG_ERR_RUNTIME, "CUDA: copy of %zu bytes to %s failed: %s (%d)", nbytes, s->label, cu_err(r), r);
  return TG_OK;
}

static tg_status cuda_copyout(void *state, void *dst, const void *src, size_t nbytes) {
  CuState *s = state;
  CUdeviceptr sp = (CUdeviceptr)(uintptr_t)src;
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  CUresult r = CUDA_SUCCESS;
  if (!stage_ready(s)) {
    if ((r = g_cu.cuMemcpyDtoHAsync(dst, sp, nbytes, s->stream)) == CUDA_SUCCESS) r = g_cu.cuStreamSynchronize(s->stream);
  } else {
    /* chunk k transfers into half k&1 while chunk k-1 is copied out of the other half */
    size_t nchunks = (nbytes + STAGE_HALF - 1) / STAGE_HALF;
    for (size_t k = 0; k <= nchunks && r == CUDA_SUCCESS; k++) {
      if (k < nchunks) {
        int i = (int)(k & 1);
        size_t off = k * STAGE_HALF, m = nbytes - off < STAGE_HALF ? nbytes - off : STAGE_HALF;
        if ((r = stage_wait(s, i)) != CUDA_SUCCESS) break;
        if ((r = g_cu.cuMemcpyDtoHAsync(s->stage + (size_t)i * STAGE_HALF, sp + off, m, s->stream)) != CUDA_SUCCESS ||
            (r = g_cu.cuEventRecord(s->stage_ev[i], s->stream)) != CUDA_SUCCESS)
          break;
        s->stage_busy[i] = true;
      }
      if (k > 0) {
        int i = (int)((k - 1) & 1);
        size_t off = (k - 1) * STAGE_HALF, m = nbytes - off < STAGE_HALF ? nbytes - off : STAGE_HALF;
        if ((r = stage_wait(s, i)) != CUDA_SUCCESS) break;
        memcpy((char *)dst + off, s->stage + (size_t)i * STAGE_HALF, m);
      }
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (r != CUDA_SUCCESS)
    return tg_set_error(TG_ERR_RUNTIME, "CUDA: copy of %zu bytes from %s failed: %s (%d)%s", nbytes, s->label, cu_err(r), r,
                        r == CUDA_ERROR_OUT_OF_MEMORY ? "" : " (an earlier kernel on the stream may have failed)");
  return TG_OK;
}

static tg_status cuda_copy(void *state, void *dst, const void *src, size_t nbytes) {
  CuState *s = state;
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  CUresult r = g_cu.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, nbytes, s->stream);
  pthread_mutex_unlock(&s->lock);
  if (r != CUDA_SUCCESS)
    return tg_set_error(TG_ERR_RUNTIME, "CUDA: copy of %zu bytes on %s failed: %s (%d)", nbytes, s->label, cu_err(r), r);
  return TG_OK;
}

/* Makes `waiter`'s stream wait for everything submitted to `from`'s stream so far (no host wait).
 * Takes from->lock, then waiter->lock, one at a time. */
static CUresult stream_after(CuState *waiter, CuState *from) {
  CUevent ev = NULL;
  pthread_mutex_lock(&from->lock);
  cu_current(from);
  CUresult r = g_cu.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  if (r == CUDA_SUCCESS) r = g_cu.cuEventRecord(ev, from->stream);
  pthread_mutex_unlock(&from->lock);
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&waiter->lock);
    cu_current(waiter);
    r = g_cu.cuStreamWaitEvent(waiter->stream, ev, 0);
    pthread_mutex_unlock(&waiter->lock);
  }
  if (ev) g_cu.cuEventDestroy(ev); /* released by the driver once the wait is satisfied */
  return r;
}

/* Between two GPUs (or CUDA:0 and NV:0, one GPU): the copy runs on the destination's stream after
 * the source's earlier work, and the source's later work waits for it (it may overwrite src). */
static int cuda_copy_peer(void *dst_state, void *dst, void *src_state, const void *src, size_t nbytes) {
  CuState *d = dst_state, *s = src_state;
  bool same = d->dev == s->dev;
  if (!same) {
    int can = 0;
    if (g_cu.cuDeviceCanAccessPeer(&can, d->dev, s->dev) != CUDA_SUCCESS || !can) return 0;
    pthread_mutex_lock(&d->lock);
    bool enabled = false;
    for (size_t i = 0; i < d->npeers && !enabled; i++) enabled = d->peers[i] == s->dev;
    if (!enabled) {
      cu_current(d);
      CUresult r = g_cu.cuCtxEnablePeerAccess(s->ctx, 0);
      if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        d->peers = tg_xrealloc(d->peers, (d->npeers + 1) * sizeof *d->peers);
        d->peers[d->npeers++] = s->dev;
        enabled = true;
      }
    }
    pthread_mutex_unlock(&d->lock);
    if (!enabled) return 0;
  }
  CUresult r = stream_after(d, s);
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&d->lock);
    cu_current(d);
    CUdeviceptr dp = (CUdeviceptr)(uintptr_t)dst, sp = (CUdeviceptr)(uintptr_t)src;
    r = same ? g_cu.cuMemcpyDtoDAsync(dp, sp, nbytes, d->stream) : g_cu.cuMemcpyPeerAsync(dp, d->ctx, sp, s->ctx, nbytes, d->stream);
    pthread_mutex_unlock(&d->lock);
  }
  if (r == CUDA_SUCCESS) r = stream_after(s, d);
  if (r != CUDA_SUCCESS) {
    tg_set_error(TG_ERR_RUNTIME, "CUDA: peer copy of %zu bytes from %s to %s failed: %s (%d)", nbytes, s->label, d->label, cu_err(r), r);
    return -1;
  }
  return 1;
}

static void cuda_synchronize(void *state) {
  CuState *s = state;
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  CUresult r = g_cu.cuStreamSynchronize(s->stream);
  pthread_mutex_unlock(&s->lock);
  if (r != CUDA_SUCCESS) {
    static _Atomic int said;
    if (!atomic_exchange(&said, 1)) fprintf(stderr, "CUDA: %s's stream failed: %s (%d)\n", s->label, cu_err(r), r);
  }
}

static void *cuda_stream(void *state) {
  CuState *s = state;
  cu_current(s);
  return s->stream;
}

static int cuda_stream_done(void *state) {
  CuState *s = state;
  cu_current(s);
  CUresult r = g_cu.cuStreamQuery(s->stream);
  if (r == CUDA_SUCCESS) return 1;
  if (r == CUDA_ERROR_NOT_READY) return 0;
  tg_set_error(TG_ERR_RUNTIME, "CUDA: %s's stream failed: %s (%d)", s->label, cu_err(r), r);
  return -1;
}

/* ---------------------------------------------------------------------------------------------- */
/* compile, load, exec                                                                             */

static tg_status nvrtc_build(void *ctx, const char *src, uint8_t **lib, size_t *liblen) {
  CuState *s = ctx;
  return nvrtc_compile(s->label, src, s->target, s->cubin, lib, liblen);
}

static tg_status cuda_compile(void *state, const char *src, uint8_t **lib, size_t *liblen) {
  CuState *s = state;
  return disk_cache_compile(s->id, src, nvrtc_build, s, lib, liblen);
}

static void cuda_cache_evict(void *state, const char *src) { disk_cache_evict(((CuState *)state)->id, src); }

static char *cuda_disasm(void *state, const char *src, const uint8_t *lib, size_t liblen) {
  CuState *s = state;
  bool bin = cuda_is_cubin(lib, liblen);
  return cuda_listing(s->label, src, s->target, bin ? lib : NULL, bin ? liblen : 0);
}

/* What a failed module load means for the user. */
static const char *load_hint(CUresult r) {
  switch (r) {
  case CUDA_ERROR_NO_BINARY_FOR_GPU: return " (the kernel's machine code is for another GPU: a wrong CUDA:sm_XX?)";
  case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: return " (NVRTC is newer than the driver: update the NVIDIA driver, or set CUDA_PATH to an older CUDA toolkit)";
  default: return "";
  }
}

static void *cuda_load(void *state, const char *fname, const uint8_t *lib, size_t liblen) {
  CuState *s = state;
  if (!fname || !lib || !liblen) {
    tg_set_error(TG_ERR_INVALID, "load: no %s", fname ? "binary" : "name");
    return NULL;
  }
  uint64_t h = hash_bytes(lib, liblen, 0x6375626d6f64ULL);
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  CuModule *m = s->mods;
  while (m && !(m->hash == h && m->len == liblen)) m = m->next;
  CUresult r = CUDA_SUCCESS;
  if (!m) {
    CUmodule mod = NULL;
    if (!cuda_is_cubin(lib, liblen) && lib[liblen - 1] != 0) {
      /* PTX is read as a C string: give it its NUL */
      char *t = tg_xmalloc(liblen + 1);
      memcpy(t, lib, liblen);
      t[liblen] = 0;
      r = g_cu.cuModuleLoadData(&mod, t);
      free(t);
    } else {
      r = g_cu.cuModuleLoadData(&mod, lib);
    }
    if (r == CUDA_SUCCESS) {
      m = tg_xcalloc(1, sizeof *m);
      *m = (CuModule){h, liblen, mod, 0, s->mods};
      s->mods = m;
    }
  }
  CUfunction fn = NULL;
  if (m && (r = g_cu.cuModuleGetFunction(&fn, m->mod, fname)) == CUDA_SUCCESS) m->refs++;
  pthread_mutex_unlock(&s->lock);
  if (!fn) {
    tg_set_error(TG_ERR_RUNTIME, "cannot load kernel '%s' on %s: %s %s (%d)%s", fname, s->label,
                 m ? "cuModuleGetFunction" : "cuModuleLoadData", cu_err(r), r, load_hint(r));
    return NULL; /* a module without kernels stays until the device closes; the next load of it finds it */
  }
  CuProgram *p = tg_xcalloc(1, sizeof *p);
  p->m = m;
  p->fn = fn;
  snprintf(p->name, sizeof p->name, "%s", fname);
  if (g_cu.cuFuncGetAttribute(&p->max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn) != CUDA_SUCCESS || p->max_threads <= 0)
    p->max_threads = (int)s->caps.max_local;
  return p;
}

static void cuda_unload(void *state, void *prg) {
  CuState *s = state;
  CuProgram *p = prg;
  if (!p) return;
  pthread_mutex_lock(&s->lock);
  if (--p->m->refs == 0) {
    for (CuModule **pp = &s->mods; *pp; pp = &(*pp)->next)
      if (*pp == p->m) {
        *pp = p->m->next;
        break;
      }
    cu_current(s);
    g_cu.cuModuleUnload(p->m->mod);
    free(p->m);
  }
  pthread_mutex_unlock(&s->lock);
  free(p);
}

/* The largest divisor of g that is at most lim (1 at least): a block that tiles the launch exactly,
 * since the kernels have no bounds check of their own. */
static int64_t divisor_upto(int64_t g, int64_t lim) {
  for (int64_t d = lim < g ? lim : g; d > 1; d--)
    if (g % d == 0) return d;
  return 1;
}

/* The launch's grid and block (ids stride over a grid past the device's y and z limits, cstyle.c):
 * 1, or 0 for an empty launch, or -1 + error when it cannot launch. */
static int launch_geometry(CuState *s, CuProgram *p, const int64_t *global_size, const int64_t *local_size, unsigned grid[3],
                           unsigned blk[3]) {
  int64_t g[3], b[3];
  for (int i = 0; i < 3; i++) g[i] = global_size ? global_size[i] : 1;
  if (g[0] <= 0 || g[1] <= 0 || g[2] <= 0) return 0;
  int64_t budget = p->max_threads < s->caps.max_local ? p->max_threads : s->caps.max_local;
  bool have_local = local_size && local_size[0] > 0;
  for (int i = 0; i < 3; i++) {
    if (have_local) {
      b[i] = local_size[i] > 0 ? local_size[i] : 1;
    } else {
      b[i] = divisor_upto(g[i], budget < s->caps.max_local_dims[i] ? budget : s->caps.max_local_dims[i]);
      budget /= b[i];
    }
  }
  const char *bad = NULL;
  for (int i = 0; i < 3 && !bad; i++) {
    if (g[i] % b[i]) bad = "the block does not divide the launch";
    else if (b[i] > s->caps.max_local_dims[i]) bad = "a block dimension exceeds the device's";
    else if (i == 0 && g[i] / b[i] > s->max_grid[i]) bad = "more blocks than the device's grid allows";
  }
  if (!bad && b[0] * b[1] * b[2] > p->max_threads) bad = "more threads per block than this kernel can take (its registers)";
  if (bad) {
    tg_set_error(TG_ERR_RUNTIME, "CUDA: cannot launch '%s' on %s: %s: global %lldx%lldx%lld, block %lldx%lldx%lld (at most %d "
                 "threads per block, grid %lldx%lldx%lld)", p->name, s->label, bad, (long long)g[0], (long long)g[1],
                 (long long)g[2], (long long)b[0], (long long)b[1], (long long)b[2], p->max_threads,
                 (long long)s->max_grid[0], (long long)s->max_grid[1], (long long)s->max_grid[2]);
    return -1;
  }
  /* y and z: at most the grid's limit; the kernels' ids stride over the rest (cstyle.c) */
  for (int i = 0; i < 3; i++) {
    int64_t n = g[i] / b[i];
    grid[i] = (unsigned)(i && n > s->max_grid[i] ? s->max_grid[i] : n);
    blk[i] = (unsigned)b[i];
  }
  return 1;
}

/* cuLaunchKernel's parameters: each argument's value (a device pointer, or a variable's value) in
 * vals[i], and args[i] pointing at it. */
static void kernel_args(CUdeviceptr *vals, void **args, void **bufs, int nbufs) {
  for (int i = 0; i < nbufs; i++) {
    vals[i] = (CUdeviceptr)(uintptr_t)bufs[i];
    args[i] = &vals[i];
  }
}

static double cuda_exec(void *state, void *prg, void **bufs, int nbufs, int nvals, const int64_t *global_size,
                        const int64_t *local_size, bool wait) {
  nbufs += nvals; /* a variable is a 64-bit parameter (`long`) after the buffers, the same size as a pointer */
  CuState *s = state;
  CuProgram *p = prg;
  if (!p) {
    tg_set_error(TG_ERR_INVALID, "exec: no program");
    return -1.0;
  }
  unsigned grid[3], blk[3];
  int geo = launch_geometry(s, p, global_size, local_size, grid, blk);
  if (geo <= 0) return geo < 0 ? -1.0 : 0.0;
  CUdeviceptr vals_small[16];
  void *args_small[16];
  CUdeviceptr *vals = nbufs <= 16 ? vals_small : tg_xmalloc(sizeof *vals * (size_t)nbufs);
  void **args = nbufs <= 16 ? args_small : tg_xmalloc(sizeof *args * (size_t)nbufs);
  kernel_args(vals, args, bufs, nbufs);
  float ms = 0.0f;
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  CUresult r = wait ? g_cu.cuEventRecord(s->ev_start, s->stream) : CUDA_SUCCESS;
  const char *what = "cuLaunchKernel";
  if (r == CUDA_SUCCESS)
    r = g_cu.cuLaunchKernel(p->fn, grid[0], grid[1], grid[2], blk[0], blk[1], blk[2], 0, s->stream, nbufs ? args : NULL, NULL);
  if (wait && r == CUDA_SUCCESS && (r = g_cu.cuEventRecord(s->ev_end, s->stream)) == CUDA_SUCCESS) {
    what = "the kernel";
    if ((r = g_cu.cuEventSynchronize(s->ev_end)) == CUDA_SUCCESS) r = g_cu.cuEventElapsedTime(&ms, s->ev_start, s->ev_end);
  }
  pthread_mutex_unlock(&s->lock);
  if (vals != vals_small) free(vals);
  if (args != args_small) free(args);
  if (r != CUDA_SUCCESS) {
    tg_set_error(TG_ERR_RUNTIME, "CUDA: %s '%s' on %s failed: %s (%d); grid %ux%ux%u, block %ux%ux%u", what, p->name,
                 s->label, cu_err(r), r, grid[0], grid[1], grid[2], blk[0], blk[1], blk[2]);
    return -1.0;
  }
  return wait ? (double)ms * 1e-3 : 0.0;
}

/* ---- graphs: TinyJit's replays as one submission ---- */

typedef struct {
  CUgraphNode node; /* NULL: an empty launch, nothing to run */
  CuKernelNodeParams kp;
  CUdeviceptr *vals;
  void **args;
  int nbufs;
} CuLaunch;

typedef struct {
  CUgraph g;
  CUgraphExec exec; /* made at the first launch */
  CuLaunch *l;
  int n, cap;
  CUgraphNode last; /* the chain's end: each launch depends on the one before */
} CuGraph;

static tg_status graph_fail(CuState *s, const char *what, CUresult r) {
  tg_set_error(TG_ERR_RUNTIME, "CUDA: %s on %s failed: %s (%d)", what, s->label, cu_err(r), r);
  return TG_ERR_RUNTIME;
}

static void *cuda_graph_new(void *state) {
  CuState *s = state;
  if (!g_cug.create) {
    tg_set_error(TG_ERR_RUNTIME, "CUDA: the driver library %s has no CUDA graphs", g_cu_libname ? g_cu_libname : CU_LIBRARY);
    return NULL;
  }
  CuGraph *gr = tg_xcalloc(1, sizeof *gr);
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  CUresult r = g_cug.create(&gr->g, 0);
  pthread_mutex_unlock(&s->lock);
  if (r != CUDA_SUCCESS) {
    free(gr);
    graph_fail(s, "cuGraphCreate", r);
    return NULL;
  }
  return gr;
}

static tg_status cuda_graph_add(void *state, void *graph, void *prg, void **bufs, int nbufs, const int64_t *global_size,
                                const int64_t *local_size) {
  CuState *s = state;
  CuGraph *gr = graph;
  CuProgram *p = prg;
  if (!gr || !p || gr->exec) {
    tg_set_error(TG_ERR_INVALID, "CUDA graph: %s", !gr || !p ? "no graph or program" : "launches are added before the first run");
    return TG_ERR_INVALID;
  }
  unsigned grid[3], blk[3];
  int geo = launch_geometry(s, p, global_size, local_size, grid, blk);
  if (geo < 0) return tg_last_status();
  if (gr->n == gr->cap) {
    gr->cap = gr->cap ? 2 * gr->cap : 16;
    gr->l = tg_xrealloc(gr->l, sizeof *gr->l * (size_t)gr->cap);
  }
  CuLaunch *l = &gr->l[gr->n];
  memset(l, 0, sizeof *l);
  l->nbufs = nbufs;
  l->vals = tg_xcalloc((size_t)nbufs + 1, sizeof *l->vals);
  l->args = tg_xcalloc((size_t)nbufs + 1, sizeof *l->args);
  kernel_args(l->vals, l->args, bufs, nbufs);
  gr->n++;
  if (geo == 0) return TG_OK;
  l->kp = (CuKernelNodeParams){p->fn, grid[0], grid[1], grid[2], blk[0], blk[1], blk[2], 0, nbufs ? l->args : NULL, NULL};
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  CUresult r = g_cug.add_kernel(&l->node, gr->g, gr->last ? &gr->last : NULL, gr->last ? 1 : 0, &l->kp);
  pthread_mutex_unlock(&s->lock);
  if (r != CUDA_SUCCESS) {
    l->node = NULL;
    return graph_fail(s, "cuGraphAddKernelNode", r);
  }
  gr->last = l->node;
  return TG_OK;
}

static tg_status cuda_graph_set(void *state, void *graph, int i, void **bufs, int nbufs) {
  CuState *s = state;
  CuGraph *gr = graph;
  if (!gr || i < 0 || i >= gr->n || nbufs != gr->l[i].nbufs || !gr->exec) {
    tg_set_error(TG_ERR_INVALID, "CUDA graph: no launch %d of %d arguments in a graph that ran", i, nbufs);
    return TG_ERR_INVALID;
  }
  CuLaunch *l = &gr->l[i];
  kernel_args(l->vals, l->args, bufs, nbufs);
  if (!l->node) return TG_OK;
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  CUresult r = g_cug.set_params(gr->exec, l->node, &l->kp);
  pthread_mutex_unlock(&s->lock);
  return r == CUDA_SUCCESS ? TG_OK : graph_fail(s, "cuGraphExecKernelNodeSetParams", r);
}

static tg_status cuda_graph_launch(void *state, void *graph) {
  CuState *s = state;
  CuGraph *gr = graph;
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  const char *what = "cuGraphInstantiateWithFlags";
  CUresult r = gr->exec ? CUDA_SUCCESS : g_cug.instantiate(&gr->exec, gr->g, 0);
  if (r != CUDA_SUCCESS) gr->exec = NULL;
  else what = "cuGraphLaunch", r = g_cug.launch(gr->exec, s->stream);
  pthread_mutex_unlock(&s->lock);
  return r == CUDA_SUCCESS ? TG_OK : graph_fail(s, what, r);
}

static void cuda_graph_free(void *state, void *graph) {
  CuState *s = state;
  CuGraph *gr = graph;
  if (!gr) return;
  pthread_mutex_lock(&s->lock);
  cu_current(s);
  if (gr->exec) g_cug.exec_destroy(gr->exec);
  if (gr->g) g_cug.destroy(gr->g);
  pthread_mutex_unlock(&s->lock);
  for (int i = 0; i < gr->n; i++) free(gr->l[i].vals), free(gr->l[i].args);
  free(gr->l);
  free(gr);
}

const DeviceVT cuda_device_vt = {
    .name = "CUDA",
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copyin = cuda_copyin,
    .copyout = cuda_copyout,
    .compile = cuda_compile,
    .load = cuda_load,
    .unload = cuda_unload,
    .exec = cuda_exec,
    .graph_new = cuda_graph_new,
    .graph_add = cuda_graph_add,
    .graph_set = cuda_graph_set,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .synchronize = cuda_synchronize,
    .compiler_id = cuda_compiler_id,
    .caps = cuda_caps,
    .copy = cuda_copy,
    .describe = cuda_describe,
    .cache_evict = cuda_cache_evict,
    .disasm = cuda_disasm,
    .open_arch = cuda_open_arch,
    .copy_peer = cuda_copy_peer,
    .stream = cuda_stream,
    .stream_done = cuda_stream_done,
};
