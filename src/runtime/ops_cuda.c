/*
 * ops_cuda.c -- the compile-only NULL device for CUDA (DEV=NULL:CUDA[:sm_XX]): kernels are rendered
 * in CUDA C (renderer/cstyle.c, LANG_CUDA) and compiled to PTX with NVRTC for the arch; nothing is
 * launched and buffers stay zeroed. It checks CUDA codegen on machines without a GPU.
 *
 * In: CUDA C source with one `extern "C" __global__` function per program.
 * Out: PTX text (compile), a placeholder program (load), launches that do nothing (exec).
 * Invariants:
 *  - libnvrtc is opened with dlopen at the first open, never linked: from $CUDA_PATH/lib64
 *    (default /usr/local/cuda), then by its usual sonames. Without it the open fails with an error
 *    naming the library and CUDA_PATH.
 *  - NVRTC includes cuda_fp16.h/cuda_bf16.h from $CUDA_PATH/include.
 *  - Buffers are host memory, zeroed at allocation; copies into a buffer are dropped (as in
 *    tinygrad's NULL device), so every read gives zeros.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

static struct {
  bool tried, ok;
  char why[1536];
  const char *(*nvrtcGetErrorString)(nvrtcResult);
  nvrtcResult (*nvrtcVersion)(int *, int *);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t *);
  nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char *);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t *);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char *);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *);
  int major, minor;
} g_nv;

static pthread_mutex_t g_nv_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *cuda_path(void) {
  const char *p = getenv_str("CUDA_PATH", NULL);
  return p && *p ? p : "/usr/local/cuda";
}

static bool nvrtc_load(void) {
  pthread_mutex_lock(&g_nv_lock);
  if (g_nv.tried) {
    pthread_mutex_unlock(&g_nv_lock);
    return g_nv.ok;
  }
  g_nv.tried = true;
  char first[1024];
  snprintf(first, sizeof first, "%s/lib64/libnvrtc.so", cuda_path());
  const char *names[] = {first, "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"};
  void *h = NULL;
  for (size_t i = 0; !h && i < sizeof names / sizeof *names; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(g_nv.why, sizeof g_nv.why,
             "NVRTC not found: tried %s, libnvrtc.so, libnvrtc.so.13, libnvrtc.so.12 (set CUDA_PATH to the CUDA toolkit)", first);
    pthread_mutex_unlock(&g_nv_lock);
    return false;
  }
#define SYM(n)                                                                                      \
  if (!(*(void **)&g_nv.n = dlsym(h, #n))) {                                                         \
    snprintf(g_nv.why, sizeof g_nv.why, "NVRTC: %s has no symbol %s", names[0], #n);                \
    pthread_mutex_unlock(&g_nv_lock);                                                               \
    return false;                                                                                   \
  }
  SYM(nvrtcGetErrorString) SYM(nvrtcVersion) SYM(nvrtcCreateProgram) SYM(nvrtcCompileProgram) SYM(nvrtcGetPTXSize)
  SYM(nvrtcGetPTX) SYM(nvrtcGetProgramLogSize) SYM(nvrtcGetProgramLog) SYM(nvrtcDestroyProgram)
#undef SYM
  g_nv.nvrtcVersion(&g_nv.major, &g_nv.minor);
  g_nv.ok = true;
  pthread_mutex_unlock(&g_nv_lock);
  return true;
}

typedef struct {
  int index;
  int sm; /* 80 for sm_80 */
  char id[96];
} NullCuda;

static void *nullcuda_open_arch(int index, const char *arch) {
  int sm = 90;
  if (arch) {
    char *end = NULL;
    long v = strncmp(arch, "sm_", 3) == 0 ? strtol(arch + 3, &end, 10) : 0;
    if (!end || *end || v < 50 || v > 200) {
      tg_set_error(TG_ERR_INVALID, "NULL:CUDA: arch '%s' is not an sm_XX compute capability (e.g. NULL:CUDA:sm_90)", arch);
      return NULL;
    }
    sm = (int)v;
  }
  if (!nvrtc_load()) {
    tg_set_error(TG_ERR_RUNTIME, "NULL:CUDA: %s", g_nv.why);
    return NULL;
  }
  NullCuda *s = tg_xcalloc(1, sizeof *s);
  s->index = index;
  s->sm = sm;
  snprintf(s->id, sizeof s->id, "nvrtc-%d.%d-sm_%d-ptx", g_nv.major, g_nv.minor, sm);
  return s;
}
static void *nullcuda_open(int index) { return nullcuda_open_arch(index, NULL); }
static void nullcuda_close(void *state) { free(state); }

static void nullcuda_caps(void *state, DeviceCaps *c) {
  (void)state;
  memset(c, 0, sizeof *c);
  c->lang = LANG_CUDA;
  c->gpu = true;
  c->fp16 = c->fp64 = true;
  c->max_local = 1024;
  c->max_local_dims[0] = c->max_local_dims[1] = 1024;
  c->max_local_dims[2] = 64;
  c->local_mem = 48 * 1024;
  c->max_dims = 3;
}
static const char *nullcuda_compiler_id(void *state) { return ((NullCuda *)state)->id; }
static void nullcuda_describe(void *state) {
  NullCuda *s = state;
  fprintf(stderr, "NULL:CUDA:%d: compile-only, NVRTC %d.%d, sm_%d\n", s->index, g_nv.major, g_nv.minor, s->sm);
}

static void *nullcuda_alloc(void *state, size_t nbytes) {
  (void)state;
  return tg_xcalloc(1, nbytes ? nbytes : 1);
}
static void nullcuda_free(void *state, void *ptr, size_t nbytes) {
  (void)state, (void)nbytes;
  free(ptr);
}
static tg_status nullcuda_copyin(void *state, void *dst, const void *src, size_t nbytes) {
  (void)state, (void)dst, (void)src, (void)nbytes; /* nothing runs: buffers stay zeroed */
  return TG_OK;
}
static tg_status nullcuda_copyout(void *state, void *dst, const void *src, size_t nbytes) {
  (void)state;
  memcpy(dst, src, nbytes);
  return TG_OK;
}
static tg_status nullcuda_copy(void *state, void *dst, const void *src, size_t nbytes) {
  (void)state, (void)dst, (void)src, (void)nbytes;
  return TG_OK;
}

/* CUDA C -> PTX for the device's arch; the NVRTC log is the error on failure. */
static tg_status nullcuda_compile(void *state, const char *src, uint8_t **lib, size_t *liblen) {
  NullCuda *s = state;
  *lib = NULL;
  *liblen = 0;
  if (!src) return tg_set_error(TG_ERR_INVALID, "compile: no source");
  nvrtcProgram p = NULL;
  nvrtcResult r = g_nv.nvrtcCreateProgram(&p, src, "tg_kernel.cu", 0, NULL, NULL);
  if (r) return tg_set_error(TG_ERR_COMPILE, "NULL:CUDA: nvrtcCreateProgram: %s", g_nv.nvrtcGetErrorString(r));
  char arch[64], inc[1100];
  snprintf(arch, sizeof arch, "--gpu-architecture=compute_%d", s->sm);
  snprintf(inc, sizeof inc, "-I%s/include", cuda_path());
  const char *opts[] = {arch, inc, "-std=c++17", "-w"};
  r = g_nv.nvrtcCompileProgram(p, 4, opts);
  tg_status st = TG_OK;
  if (r) {
    size_t n = 0;
    g_nv.nvrtcGetProgramLogSize(p, &n);
    char *log = tg_xcalloc(1, n + 1);
    if (n) g_nv.nvrtcGetProgramLog(p, log);
    st = tg_set_error(TG_ERR_COMPILE, "NULL:CUDA: NVRTC (sm_%d) failed: %s\n%s", s->sm, g_nv.nvrtcGetErrorString(r), log);
    free(log);
  } else {
    size_t n = 0;
    g_nv.nvrtcGetPTXSize(p, &n);
    *lib = tg_xmalloc(n ? n : 1);
    g_nv.nvrtcGetPTX(p, (char *)*lib);
    *liblen = n;
  }
  g_nv.nvrtcDestroyProgram(&p);
  return st;
}

static void *nullcuda_load(void *state, const char *fname, const uint8_t *lib, size_t liblen) {
  (void)state, (void)liblen;
  if (!fname || !lib) {
    tg_set_error(TG_ERR_INVALID, "load: no %s", fname ? "binary" : "name");
    return NULL;
  }
  return tg_xstrdup(fname);
}
static void nullcuda_unload(void *state, void *prg) {
  (void)state;
  free(prg);
}
static double nullcuda_exec(void *state, void *prg, void **bufs, int nbufs, const int64_t *global_size,
                            const int64_t *local_size, bool wait) {
  (void)state, (void)prg, (void)bufs, (void)nbufs, (void)global_size, (void)local_size, (void)wait;
  return 0.0;
}
static void nullcuda_synchronize(void *state) { (void)state; }
static char *nullcuda_disasm(void *state, const char *src, const uint8_t *lib, size_t liblen) {
  (void)state, (void)src;
  char *t = tg_xmalloc(liblen + 1);
  memcpy(t, lib, liblen);
  t[liblen] = '\0';
  return t;
}

const DeviceVT nullcuda_device_vt = {
    .name = "NULL",
    .open = nullcuda_open,
    .close = nullcuda_close,
    .alloc = nullcuda_alloc,
    .free = nullcuda_free,
    .copyin = nullcuda_copyin,
    .copyout = nullcuda_copyout,
    .compile = nullcuda_compile,
    .load = nullcuda_load,
    .unload = nullcuda_unload,
    .exec = nullcuda_exec,
    .synchronize = nullcuda_synchronize,
    .compiler_id = nullcuda_compiler_id,
    .caps = nullcuda_caps,
    .copy = nullcuda_copy,
    .describe = nullcuda_describe,
    .disasm = nullcuda_disasm,
    .open_arch = nullcuda_open_arch,
};
