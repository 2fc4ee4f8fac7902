/*
 * fake_libcuda.c -- a stand-in for the NVIDIA driver's libcuda.so.1, for host-side tests of the
 * CUDA device (ops_cuda.c) through TG_CUDA_LIB. Built as build/tests/libfakecuda.so by the Makefile;
 * not part of libtinygrad.
 *
 * In: the cu* calls the runtime makes. Out: GPU memory that is host memory (cuMemAlloc = malloc,
 * copies = memcpy), modules accepted when they look like a CUBIN or PTX (and a function found only if
 * its name is in the image), launches recorded and doing nothing (but see "Kernels that run"), two
 * devices of sm_90 with peer access, events whose elapsed time is a fixed 0.25 ms. fake_cuda_stat(name) reads its counters.
 * Knobs (read at each call): FAKE_CUDA_INIT=<code> makes cuInit return that error; FAKE_CUDA_DEVICES
 * (default 2); FAKE_CUDA_MEM_LIMIT=<bytes> makes cuMemAlloc fail with CUDA_ERROR_OUT_OF_MEMORY past
 * that many live bytes; FAKE_CUDA_NO_PINNED refuses cuMemHostAlloc; FAKE_CUDA_STREAM_BUSY=1 makes
 * cuStreamQuery report CUDA_ERROR_NOT_READY (a stream whose work never finishes);
 * FAKE_CUDA_GRAPH_FAIL=instantiate|set|launch makes that graph call fail (CUDA_ERROR_NOT_SUPPORTED,
 * or CUDA_ERROR_LAUNCH_FAILED for launch).
 * Graphs (cuGraphCreate, cuGraphAddKernelNode, cuGraphInstantiateWithFlags, cuGraphLaunch,
 * cuGraphExecKernelNodeSetParams): chains of kernel nodes whose parameter values are copied when
 * added or set, launched by running the nodes in order (graph_runs counts them).
 * Kernels that run: an image from tests/fake_libnvrtc.c (its marker line, then CUDA C) is compiled for
 * the host with the system's C++ compiler (a prelude supplies CUDA's qualifiers, ids and bit casts)
 * and each launch runs every thread of every block in turn, so kernels without barriers or shared
 * memory compute what a GPU would (NOOPT=1 keeps a kernel free of them; one with a barrier is
 * refused at load). Compiled images are kept per process, shared by the modules that load them.
 * Invariants: every call that needs a context checks that one is current on the calling thread
 * (CUDA_ERROR_INVALID_CONTEXT otherwise, as the driver does), and a launch checks that each kernel
 * parameter points to a live allocation (counted in "bad_params" otherwise).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct FakeCtx {
  int dev;
  int peer_enabled[8];
} FakeCtx;
typedef void (*HostRun)(void **params, const unsigned *grid, const unsigned *block);
typedef struct FakeFunc {
  int nparams; /* from the PTX (-1: a CUBIN's, not read here) */
  int nargs;   /* a kernel run on the host: its parameter count (-1: not one) */
  HostRun run; /* a kernel compiled for the host (see host_compile), else NULL: the launch does nothing */
  struct FakeFunc *next;
} FakeFunc;
typedef struct HostLib HostLib;
typedef struct FakeMod {
  char *image;
  size_t len;
  FakeFunc *funcs; /* handed out by cuModuleGetFunction; freed with the module */
  HostLib *host;   /* the image compiled for the host, or NULL */
} FakeMod;

enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_OOM = 2, ERR_INVALID_DEVICE = 101, ERR_INVALID_IMAGE = 200,
       ERR_INVALID_CONTEXT = 201, ERR_NOT_FOUND = 500, ERR_NOT_READY = 600, ERR_PEER_ALREADY = 704,
       ERR_LAUNCH_FAILED = 719, ERR_NOT_SUPPORTED = 801 };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static FakeCtx g_ctx[8];
static __thread FakeCtx *t_current;

typedef struct Alloc {
  char *p;
  size_t n;
  struct Alloc *next;
} Alloc;
static Alloc *g_allocs;
static size_t g_live_bytes;

static struct {
  long launches, bad_params, peer_copies, enable_peer, htod, dtoh, dtod, pinned, alloc_fail, live_allocs, live_modules,
      live_events, live_streams, retained, last_nparams, max_grid2, last_grid[3], last_block[3], graph_nodes, graph_sets,
      graph_launches, graph_runs, live_graphs;
} g_st;

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : dflt;
}
static int ndevices(void) { return (int)env_long("FAKE_CUDA_DEVICES", 2); }

long fake_cuda_stat(const char *what) {
  pthread_mutex_lock(&g_lock);
  long v = -1;
#define S(n) if (strcmp(what, #n) == 0) v = g_st.n;
  S(launches) S(bad_params) S(peer_copies) S(enable_peer) S(htod) S(dtoh) S(dtod) S(pinned) S(alloc_fail) S(live_allocs)
  S(live_modules) S(live_events) S(live_streams) S(retained) S(graph_nodes) S(graph_sets) S(graph_launches) S(graph_runs)
  S(live_graphs)
#undef S
  if (strcmp(what, "live_bytes") == 0) v = (long)g_live_bytes;
  if (strcmp(what, "grid0") == 0) v = g_st.last_grid[0];
  if (strcmp(what, "nparams") == 0) v = g_st.last_nparams;
  if (strcmp(what, "block0") == 0) v = g_st.last_block[0];
  if (strcmp(what, "max_grid2") == 0) v = g_st.max_grid2;
  pthread_mutex_unlock(&g_lock);
  return v;
}

CUresult cuInit(unsigned flags) { return flags ? ERR_INVALID_VALUE : (CUresult)env_long("FAKE_CUDA_INIT", 0); }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = ndevices(); return OK; }
CUresult cuDeviceGet(int *d, int i) {
  if (i < 0 || i >= ndevices() || i >= 8) return ERR_INVALID_DEVICE;
  *d = i;
  return OK;
}
CUresult cuDeviceGetName(char *s, int n, int d) { snprintf(s, (size_t)n, "Fake GPU %d", d); return OK; }
CUresult cuDeviceGetAttribute(int *v, int a, int d) {
  (void)d;
  switch (a) {
  case 1: case 2: case 3: *v = 1024; break;
  case 4: *v = 64; break;
  case 5: *v = 0x7fffffff; break;
  case 6: case 7: *v = 65535; break;
  case 8: *v = 49152; break;
  case 16: *v = 4; break;
  case 75: *v = 9; break;
  case 76: *v = 0; break;
  default: return ERR_INVALID_VALUE;
  }
  return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *n, int d) { (void)d; *n = (size_t)1 << 30; return OK; }
CUresult cuDeviceCanAccessPeer(int *can, int a, int b) { *can = a != b; return OK; }
CUresult cuDevicePrimaryCtxRetain(FakeCtx **c, int d) {
  if (d < 0 || d >= 8) return ERR_INVALID_DEVICE;
  g_ctx[d].dev = d;
  *c = &g_ctx[d];
  pthread_mutex_lock(&g_lock);
  g_st.retained++;
  pthread_mutex_unlock(&g_lock);
  return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int d) {
  (void)d;
  pthread_mutex_lock(&g_lock);
  g_st.retained--;
  pthread_mutex_unlock(&g_lock);
  return OK;
}
CUresult cuCtxSetCurrent(FakeCtx *c) { t_current = c; return OK; }
CUresult cuCtxEnablePeerAccess(FakeCtx *peer, unsigned flags) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  if (flags || peer == t_current) return ERR_INVALID_VALUE;
  pthread_mutex_lock(&g_lock);
  CUresult r = t_current->peer_enabled[peer->dev] ? ERR_PEER_ALREADY : OK;
  t_current->peer_enabled[peer->dev] = 1;
  g_st.enable_peer++;
  pthread_mutex_unlock(&g_lock);
  return r;
}

/* streams and events: small heap objects, so that a leak shows under ASan and in the counts */
static CUresult obj_new(void **o, long *count) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  *o = malloc(16);
  pthread_mutex_lock(&g_lock);
  (*count)++;
  pthread_mutex_unlock(&g_lock);
  return OK;
}
static CUresult obj_free(void *o, long *count) {
  if (!o) return ERR_INVALID_VALUE;
  free(o);
  pthread_mutex_lock(&g_lock);
  (*count)--;
  pthread_mutex_unlock(&g_lock);
  return OK;
}
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; return obj_new(s, &g_st.live_streams); }
CUresult cuStreamDestroy_v2(void *s) { return obj_free(s, &g_st.live_streams); }
CUresult cuStreamSynchronize(void *s) { return s ? OK : ERR_INVALID_VALUE; }
/* launches do nothing: always done, unless FAKE_CUDA_STREAM_BUSY makes a stream that never finishes */
CUresult cuStreamQuery(void *s) { return !s ? ERR_INVALID_VALUE : env_long("FAKE_CUDA_STREAM_BUSY", 0) ? ERR_NOT_READY : OK; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { return s && e && !f ? OK : ERR_INVALID_VALUE; }
CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; return obj_new(e, &g_st.live_events); }
CUresult cuEventDestroy_v2(void *e) { return obj_free(e, &g_st.live_events); }
CUresult cuEventRecord(void *e, void *s) { return e && s ? OK : ERR_INVALID_VALUE; }
CUresult cuEventSynchronize(void *e) { return e ? OK : ERR_INVALID_VALUE; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
  if (!a || !b) return ERR_INVALID_VALUE;
  *ms = 0.25f;
  return OK;
}

/* memory */
static Alloc *find_alloc(CUdeviceptr p, size_t n) {
  for (Alloc *a = g_allocs; a; a = a->next)
    if ((uintptr_t)p >= (uintptr_t)a->p && (uintptr_t)p + n <= (uintptr_t)a->p + a->n) return a;
  return NULL;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  long limit = env_long("FAKE_CUDA_MEM_LIMIT", -1);
  pthread_mutex_lock(&g_lock);
  if (limit >= 0 && g_live_bytes + n > (size_t)limit) {
    g_st.alloc_fail++;
    pthread_mutex_unlock(&g_lock);
    return ERR_OOM;
  }
  Alloc *a = malloc(sizeof *a);
  a->p = malloc(n);
  a->n = n;
  a->next = g_allocs;
  g_allocs = a;
  g_live_bytes += n;
  g_st.live_allocs++;
  *p = (CUdeviceptr)(uintptr_t)a->p;
  pthread_mutex_unlock(&g_lock);
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  pthread_mutex_lock(&g_lock);
  for (Alloc **pp = &g_allocs; *pp; pp = &(*pp)->next) {
    if ((uintptr_t)(*pp)->p != (uintptr_t)p) continue;
    Alloc *a = *pp;
    *pp = a->next;
    g_live_bytes -= a->n;
    g_st.live_allocs--;
    pthread_mutex_unlock(&g_lock);
    free(a->p);
    free(a);
    return OK;
  }
  pthread_mutex_unlock(&g_lock);
  return ERR_INVALID_VALUE;
}
CUresult cuMemGetInfo_v2(size_t *fr, size_t *total) {
  long limit = env_long("FAKE_CUDA_MEM_LIMIT", 1L << 30);
  pthread_mutex_lock(&g_lock);
  *total = (size_t)limit;
  *fr = g_live_bytes < (size_t)limit ? (size_t)limit - g_live_bytes : 0;
  pthread_mutex_unlock(&g_lock);
  return OK;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
  (void)flags;
  if (!t_current) return ERR_INVALID_CONTEXT;
  if (env_long("FAKE_CUDA_NO_PINNED", 0)) return ERR_OOM;
  *p = malloc(n);
  pthread_mutex_lock(&g_lock);
  g_st.pinned++;
  pthread_mutex_unlock(&g_lock);
  return OK;
}
CUresult cuMemFreeHost(void *p) {
  free(p);
  pthread_mutex_lock(&g_lock);
  g_st.pinned--;
  pthread_mutex_unlock(&g_lock);
  return OK;
}

/* A device-side range must lie in one live allocation (a wrong pointer or size is an error). */
static CUresult dev_range(CUdeviceptr p, size_t n) {
  pthread_mutex_lock(&g_lock);
  Alloc *a = find_alloc(p, n);
  pthread_mutex_unlock(&g_lock);
  return a ? OK : ERR_INVALID_VALUE;
}
static void count(long *c) {
  pthread_mutex_lock(&g_lock);
  (*c)++;
  pthread_mutex_unlock(&g_lock);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) {
  if (!t_current || !st) return t_current ? ERR_INVALID_VALUE : ERR_INVALID_CONTEXT;
  if (dev_range(d, n)) return ERR_INVALID_VALUE;
  memcpy((void *)(uintptr_t)d, s, n);
  count(&g_st.htod);
  return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) {
  if (!t_current || !st) return t_current ? ERR_INVALID_VALUE : ERR_INVALID_CONTEXT;
  if (dev_range(s, n)) return ERR_INVALID_VALUE;
  memcpy(d, (const void *)(uintptr_t)s, n);
  count(&g_st.dtoh);
  return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) {
  if (!t_current || !st) return t_current ? ERR_INVALID_VALUE : ERR_INVALID_CONTEXT;
  if (dev_range(d, n) || dev_range(s, n)) return ERR_INVALID_VALUE;
  memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
  count(&g_st.dtod);
  return OK;
}
CUresult cuMemcpyPeerAsync(CUdeviceptr d, FakeCtx *dc, CUdeviceptr s, FakeCtx *sc, size_t n, void *st) {
  if (!t_current || !st || !dc || !sc || dc == sc) return t_current ? ERR_INVALID_VALUE : ERR_INVALID_CONTEXT;
  if (dev_range(d, n) || dev_range(s, n)) return ERR_INVALID_VALUE;
  memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
  count(&g_st.peer_copies);
  return OK;
}

/* ---- kernels for the host: the fake NVRTC's images ---- */
static const char FAKE_HOST_MARK[] = "// tinygrad.c fake NVRTC: CUDA C for the host\n";
static const char HOST_PRELUDE[] =
    "#include <math.h>\n#include <string.h>\n#include <stdint.h>\n#include <algorithm>\n#include <utility>\n"
    "using std::max; using std::min;\n"
    "struct tg_fake_dim3 { unsigned x, y, z; };\n"
    "static thread_local tg_fake_dim3 blockIdx, threadIdx, blockDim, gridDim;\n"
    "#define __global__\n#define __device__\n#define __forceinline__ inline\n#define __restrict__ __restrict\n"
    "#define __launch_bounds__(...)\n"
    "static inline float __int_as_float(int i){float f;memcpy(&f,&i,4);return f;}\n"
    "static inline int __float_as_int(float f){int i;memcpy(&i,&f,4);return i;}\n"
    "static inline float __uint_as_float(unsigned i){float f;memcpy(&f,&i,4);return f;}\n"
    "static inline unsigned __float_as_uint(float f){unsigned i;memcpy(&i,&f,4);return i;}\n"
    "static inline double __longlong_as_double(long long i){double f;memcpy(&f,&i,8);return f;}\n"
    "static inline long long __double_as_longlong(double f){long long i;memcpy(&i,&f,8);return i;}\n"
    "template <class... A, size_t... I> static void tg_fake_call(void (*f)(A...), void **p, std::index_sequence<I...>)"
    " { f(*(A *)p[I]...); }\n"
    "template <class... A> static void tg_fake_call(void (*f)(A...), void **p) { tg_fake_call(f, p, std::index_sequence_for<A...>{}); }\n"
    "template <class... A> static int tg_fake_count(void (*)(A...)) { return (int)sizeof...(A); }\n"
    "#line 1 \"kernel.cu\"\n";

struct HostLib {
  char *image; /* the key */
  void *handle;
  int refs;
  HostLib *next;
};
static HostLib *g_host_libs;

/* The image's kernels compiled for the host and loaded (shared by equal images), or NULL (said on
 * stderr). Caller holds g_lock. */
static HostLib *host_compile(const char *image) {
  for (HostLib *h = g_host_libs; h; h = h->next)
    if (!strcmp(h->image, image)) {
      h->refs++;
      return h;
    }
  const char *src = image + sizeof FAKE_HOST_MARK - 1;
  if (strstr(src, "__syncthreads") || strstr(src, "__shared__")) {
    fprintf(stderr, "fake libcuda: a kernel with shared memory or a barrier cannot run on the host (NOOPT=1 avoids them)\n");
    return NULL;
  }
  char dir[] = "/tmp/fake-cuda-XXXXXX", path[64], so[64], cmd[256];
  if (!mkdtemp(dir)) return NULL;
  snprintf(path, sizeof path, "%s/k.cpp", dir);
  snprintf(so, sizeof so, "%s/k.so", dir);
  FILE *f = fopen(path, "w");
  if (!f) return NULL;
  fputs(HOST_PRELUDE, f);
  fputs(src, f);
  /* a runner per kernel: every thread of every block in turn */
  for (const char *q = strstr(src, "__global__"); q; q = strstr(q + 1, "__global__")) {
    const char *par = strchr(q, '('), *e = par;
    while (e > q && (e[-1] == ' ')) e--;
    const char *b = e;
    while (b > q && (b[-1] == '_' || (b[-1] >= 'a' && b[-1] <= 'z') || (b[-1] >= 'A' && b[-1] <= 'Z') || (b[-1] >= '0' && b[-1] <= '9'))) b--;
    if (!par || b == e) continue;
    int n = (int)(e - b);
    /* a batch of kernels names each through a macro (#define r_8 r_8__b0): the real name */
    char pat[160];
    snprintf(pat, sizeof pat, "#define %.*s ", n, b);
    const char *d = NULL;
    for (const char *x = strstr(src, pat); x && x < q; x = strstr(x + 1, pat)) d = x;
    if (d) {
      b = d + strlen(pat);
      n = (int)strcspn(b, " \n");
    }
    fprintf(f,
            "\nextern \"C\" void tg_fake_run_%.*s(void **p, const unsigned *g, const unsigned *b) {\n"
            "  gridDim = {g[0], g[1], g[2]}; blockDim = {b[0], b[1], b[2]};\n"
            "  for (unsigned z = 0; z < g[2]; z++) for (unsigned y = 0; y < g[1]; y++) for (unsigned x = 0; x < g[0]; x++)\n"
            "    for (unsigned tz = 0; tz < b[2]; tz++) for (unsigned ty = 0; ty < b[1]; ty++) for (unsigned tx = 0; tx < b[0]; tx++) {\n"
            "      blockIdx = {x, y, z}; threadIdx = {tx, ty, tz}; tg_fake_call(%.*s, p);\n    }\n}\n"
            "extern \"C\" int tg_fake_nargs_%.*s(void) { return tg_fake_count(%.*s); }\n",
            n, b, n, b, n, b, n, b);
  }
  fclose(f);
  snprintf(cmd, sizeof cmd, "c++ -std=c++17 -O1 -w -shared -fPIC -o %s %s", so, path);
  void *handle = system(cmd) == 0 ? dlopen(so, RTLD_NOW | RTLD_LOCAL) : NULL;
  if (!handle) fprintf(stderr, "fake libcuda: the kernel did not compile for the host (%s)\n%s\n", cmd, src);
  unlink(path), unlink(so), rmdir(dir);
  if (!handle) return NULL;
  HostLib *h = calloc(1, sizeof *h);
  h->image = strdup(image);
  h->handle = handle;
  h->refs = 1;
  h->next = g_host_libs;
  g_host_libs = h;
  return h;
}

static void host_release(HostLib *h) {
  if (!h || --h->refs > 0) return;
  for (HostLib **p = &g_host_libs; *p; p = &(*p)->next)
    if (*p == h) {
      *p = h->next;
      break;
    }
  dlclose(h->handle);
  free(h->image);
  free(h);
}

/* modules: a CUBIN (ELF) or PTX text; a function exists when its name is in the image */
CUresult cuModuleLoadData(FakeMod **m, const void *image) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  const unsigned char *b = image;
  size_t len;
  HostLib *host = NULL;
  if (!strncmp(image, FAKE_HOST_MARK, sizeof FAKE_HOST_MARK - 1)) {
    pthread_mutex_lock(&g_lock);
    host = host_compile(image);
    pthread_mutex_unlock(&g_lock);
    if (!host) return ERR_INVALID_IMAGE;
    len = strlen(image);
  } else if (b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F' && b[4] == 2) {
    /* the size is not passed: an ELF64 file ends with its section (or program) header table */
    uint64_t shoff, phoff;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, b + 0x20, 8);
    memcpy(&shoff, b + 0x28, 8);
    memcpy(&phentsize, b + 0x36, 2);
    memcpy(&phnum, b + 0x38, 2);
    memcpy(&shentsize, b + 0x3a, 2);
    memcpy(&shnum, b + 0x3c, 2);
    uint64_t end1 = shoff + (uint64_t)shentsize * shnum, end2 = phoff + (uint64_t)phentsize * phnum;
    len = (size_t)(end1 > end2 ? end1 : end2);
    if (len < 64 || len > (1u << 28)) return ERR_INVALID_IMAGE;
  } else if (strstr(image, ".version") && strstr(image, ".entry")) {
    len = strlen(image);
  } else {
    return ERR_INVALID_IMAGE;
  }
  FakeMod *fm = malloc(sizeof *fm);
  fm->image = malloc(len);
  memcpy(fm->image, image, len);
  fm->len = len;
  fm->funcs = NULL;
  fm->host = host;
  *m = fm;
  count(&g_st.live_modules);
  return OK;
}
CUresult cuModuleUnload(FakeMod *m) {
  if (!m) return ERR_INVALID_VALUE;
  for (FakeFunc *f = m->funcs, *nx; f; f = nx) {
    nx = f->next;
    free(f);
  }
  free(m->image);
  pthread_mutex_lock(&g_lock);
  host_release(m->host);
  free(m);
  g_st.live_modules--;
  pthread_mutex_unlock(&g_lock);
  return OK;
}
CUresult cuModuleGetFunction(FakeFunc **f, FakeMod *m, const char *name) {
  if (!m || !name) return ERR_INVALID_VALUE;
  size_t n = strlen(name);
  bool elf = m->image[0] == 0x7f;
  bool found = false;
  for (size_t i = 0; i + n <= m->len && !found; i++) found = memcmp(m->image + i, name, n) == 0;
  if (!found) return ERR_NOT_FOUND;
  FakeFunc *fn = calloc(1, sizeof *fn);
  fn->nparams = fn->nargs = -1;
  if (m->host) {
    char sym[300];
    snprintf(sym, sizeof sym, "tg_fake_run_%s", name);
    *(void **)&fn->run = dlsym(m->host->handle, sym);
    snprintf(sym, sizeof sym, "tg_fake_nargs_%s", name);
    int (*nargs)(void);
    *(void **)&nargs = dlsym(m->host->handle, sym);
    if (!fn->run || !nargs) {
      free(fn);
      return ERR_NOT_FOUND;
    }
    fn->nargs = nargs();
  } else if (!elf) {
    /* PTX declares a kernel's parameters in the parentheses after ".entry <name>(" */
    char pat[300];
    snprintf(pat, sizeof pat, ".entry %s(", name);
    const char *q = strstr(m->image, pat), *e = q ? strchr(q, ')') : NULL;
    fn->nparams = 0;
    for (q = q ? strstr(q, "_param_") : NULL; q && q < e; q = strstr(q + 1, "_param_")) fn->nparams++;
  }
  pthread_mutex_lock(&g_lock);
  fn->next = m->funcs;
  m->funcs = fn;
  pthread_mutex_unlock(&g_lock);
  *f = fn;
  return OK;
}
CUresult cuFuncGetAttribute(int *v, int a, FakeFunc *f) {
  if (!f || a != 0) return ERR_INVALID_VALUE;
  *v = 1024;
  return OK;
}
static CUresult launch(FakeFunc *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, void **params,
                       long *counter);
CUresult cuLaunchKernel(FakeFunc *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *st, void **params, void **extra) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  if (!f || !st || extra || shmem) return ERR_INVALID_VALUE;
  return launch(f, gx, gy, gz, bx, by, bz, params, &g_st.launches);
}
static CUresult launch(FakeFunc *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, void **params,
                       long *counter) {
  if (!gx || !gy || !gz || !bx || !by || !bz || (long)bx * by * bz > 1024) return ERR_INVALID_VALUE;
  pthread_mutex_lock(&g_lock);
  (*counter)++;
  g_st.last_grid[0] = gx, g_st.last_grid[1] = gy, g_st.last_grid[2] = gz;
  g_st.last_block[0] = bx, g_st.last_block[1] = by, g_st.last_block[2] = bz;
  if (gz > g_st.max_grid2) g_st.max_grid2 = gz;
  if (gy > 65535 || gz > 65535) g_st.bad_params++; /* the driver refuses such a grid */
  /* the parameters: pointers to device pointers, each inside a live allocation (all of them where
   * the PTX tells how many there are, else the first, the output every kernel has) */
  int np = f->nparams >= 0 ? f->nparams : 1;
  g_st.last_nparams = f->nparams;
  if (!params && np) g_st.bad_params++;
  for (int i = 0; params && i < np; i++)
    if (!params[i] || !find_alloc(*(CUdeviceptr *)params[i], 1)) g_st.bad_params++;
  pthread_mutex_unlock(&g_lock);
  if (f->run) {
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    f->run(params, grid, block);
  }
  return OK;
}

/* graphs: a chain of kernel nodes whose parameter values are copied when added (and when set on an
 * instantiated graph), as the driver copies them; a launch runs the nodes in order, each as a
 * kernel launch would (counted in graph_runs, not launches). A node's handle is its index + 1. */
typedef struct {
  FakeFunc *f;
  unsigned g[3], b[3];
  int n;
  CUdeviceptr v[64];
} FakeNode;
typedef struct {
  FakeNode *nodes;
  int n, cap;
  bool exec; /* an instantiated copy */
} FakeGraph;
typedef struct {
  FakeFunc *func;
  unsigned gx, gy, gz, bx, by, bz, shmem;
  void **params, **extra;
} FakeKernelParams;

static CUresult node_fill(FakeNode *nd, const FakeKernelParams *kp) {
  if (!kp || !kp->func || kp->shmem || kp->extra) return ERR_INVALID_VALUE;
  FakeFunc *f = kp->func;
  int n = f->nargs >= 0 ? f->nargs : f->nparams >= 0 ? f->nparams : 1;
  if (n > 64 || (n && !kp->params)) return ERR_INVALID_VALUE;
  nd->f = f;
  nd->g[0] = kp->gx, nd->g[1] = kp->gy, nd->g[2] = kp->gz, nd->b[0] = kp->bx, nd->b[1] = kp->by, nd->b[2] = kp->bz;
  nd->n = n;
  for (int i = 0; i < n; i++) nd->v[i] = *(CUdeviceptr *)kp->params[i];
  return OK;
}
CUresult cuGraphCreate(FakeGraph **g, unsigned flags) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  if (!g || flags) return ERR_INVALID_VALUE;
  *g = calloc(1, sizeof **g);
  count(&g_st.live_graphs);
  return OK;
}
CUresult cuGraphAddKernelNode(void **node, FakeGraph *g, void *const *deps, size_t ndeps, const FakeKernelParams *kp) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  /* the runtime builds chains: no dependency for the first node, the node before for the others */
  if (!node || !g || g->exec || ndeps != (g->n ? 1u : 0u) || (ndeps && deps[0] != (void *)(uintptr_t)g->n)) return ERR_INVALID_VALUE;
  if (g->n == g->cap) g->cap = g->cap ? 2 * g->cap : 16, g->nodes = realloc(g->nodes, sizeof *g->nodes * (size_t)g->cap);
  CUresult r = node_fill(&g->nodes[g->n], kp);
  if (r != OK) return r;
  *node = (void *)(uintptr_t)++g->n;
  count(&g_st.graph_nodes);
  return OK;
}
static bool graph_fails(const char *call) {
  const char *f = getenv("FAKE_CUDA_GRAPH_FAIL");
  return f && !strcmp(f, call);
}
CUresult cuGraphInstantiateWithFlags(FakeGraph **e, FakeGraph *g, unsigned long long flags) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  if (graph_fails("instantiate")) return ERR_NOT_SUPPORTED;
  if (!e || !g || g->exec || flags || !g->n) return ERR_INVALID_VALUE;
  FakeGraph *x = calloc(1, sizeof *x);
  x->nodes = malloc(sizeof *x->nodes * (size_t)g->n);
  memcpy(x->nodes, g->nodes, sizeof *x->nodes * (size_t)g->n);
  x->n = x->cap = g->n;
  x->exec = true;
  *e = x;
  count(&g_st.live_graphs);
  return OK;
}
CUresult cuGraphExecKernelNodeSetParams(FakeGraph *e, void *node, const FakeKernelParams *kp) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  uintptr_t i = (uintptr_t)node;
  if (!e || !e->exec || i < 1 || i > (uintptr_t)e->n || !kp || kp->func != e->nodes[i - 1].f) return ERR_INVALID_VALUE;
  if (graph_fails("set")) return ERR_NOT_SUPPORTED;
  count(&g_st.graph_sets);
  return node_fill(&e->nodes[i - 1], kp);
}
CUresult cuGraphLaunch(FakeGraph *e, void *stream) {
  if (!t_current) return ERR_INVALID_CONTEXT;
  if (!e || !e->exec || !stream) return ERR_INVALID_VALUE;
  if (graph_fails("launch")) return ERR_LAUNCH_FAILED;
  count(&g_st.graph_launches);
  for (int i = 0; i < e->n; i++) {
    FakeNode *nd = &e->nodes[i];
    void *p[64];
    for (int k = 0; k < nd->n; k++) p[k] = &nd->v[k];
    CUresult r = launch(nd->f, nd->g[0], nd->g[1], nd->g[2], nd->b[0], nd->b[1], nd->b[2], p, &g_st.graph_runs);
    if (r != OK) return r;
  }
  return OK;
}
static CUresult graph_free(FakeGraph *g, bool exec) {
  if (!g || g->exec != exec) return ERR_INVALID_VALUE;
  free(g->nodes);
  free(g);
  pthread_mutex_lock(&g_lock);
  g_st.live_graphs--;
  pthread_mutex_unlock(&g_lock);
  return OK;
}
CUresult cuGraphExecDestroy(FakeGraph *e) { return graph_free(e, true); }
CUresult cuGraphDestroy(FakeGraph *g) { return graph_free(g, false); }

CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
  case 0: *s = "CUDA_SUCCESS"; return OK;
  case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
  case 100: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
  case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
  case 500: *s = "CUDA_ERROR_NOT_FOUND"; return OK;
  default: *s = NULL; return ERR_INVALID_VALUE;
  }
}
