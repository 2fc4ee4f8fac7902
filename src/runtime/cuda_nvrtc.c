/*
 * cuda_nvrtc.c -- NVRTC for both CUDA devices: CUDA C (renderer/cstyle.c, LANG_CUDA) in, PTX text
 * or a CUBIN out, and DEBUG=7's listing of a kernel (PTX and SASS).
 *
 * Invariants:
 *  - libnvrtc is opened with dlopen on first use and kept for the process, never linked: from
 *    $CUDA_PATH/lib64 (default /usr/local/cuda), then by its usual sonames (TG_NVRTC_LIB: that file
 *    alone). A failed attempt is tried again at the next open.
 *  - NVRTC includes cuda_fp16.h/cuda_bf16.h from $CUDA_PATH/include.
 *  - PTX is handed out with its terminating NUL (cuModuleLoadData reads PTX as a C string); a CUBIN
 *    is an ELF object, so the two are told apart by their first bytes (cuda_is_cubin).
 */
#include "cuda_nvrtc.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

static struct {
  bool ok;
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
  /* optional (NVRTC 11.1 / 11.2 on): without them every target is PTX for the arch asked */
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t *);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char *);
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int *);
  nvrtcResult (*nvrtcGetSupportedArchs)(int *);
  int major, minor;
  int *archs; /* the archs NVRTC compiles SASS for, ascending */
  int narchs;
} g_nv;

static pthread_mutex_t g_nv_lock = PTHREAD_MUTEX_INITIALIZER;

const char *cuda_path(void) {
  const char *p = getenv_str("CUDA_PATH", NULL);
  return p && *p ? p : "/usr/local/cuda";
}

/* Opens the library and resolves its symbols; fills g_nv.why on failure. Caller holds g_nv_lock. */
static bool nvrtc_open_locked(void) {
  char first[1024];
  snprintf(first, sizeof first, "%s/lib64/libnvrtc.so", cuda_path());
  const char *names[] = {first, "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"};
  size_t nnames = sizeof names / sizeof *names;
  const char *only = getenv_str("TG_NVRTC_LIB", NULL); /* one file and no other (tests name a missing one) */
  if (only && *only) names[0] = only, nnames = 1;
  void *h = NULL;
  for (size_t i = 0; !h && i < nnames; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(g_nv.why, sizeof g_nv.why,
             "NVRTC not found: tried %s%s (set CUDA_PATH to the CUDA toolkit; NVRTC comes with it)", names[0],
             nnames > 1 ? ", libnvrtc.so, libnvrtc.so.13, libnvrtc.so.12" : "");
    return false;
  }
  const char *missing = NULL;
#define SYM(n) \
  if (!missing && !(*(void **)&g_nv.n = dlsym(h, #n))) missing = #n;
  SYM(nvrtcGetErrorString) SYM(nvrtcVersion) SYM(nvrtcCreateProgram) SYM(nvrtcCompileProgram) SYM(nvrtcGetPTXSize)
  SYM(nvrtcGetPTX) SYM(nvrtcGetProgramLogSize) SYM(nvrtcGetProgramLog) SYM(nvrtcDestroyProgram)
#undef SYM
  if (missing) {
    snprintf(g_nv.why, sizeof g_nv.why, "NVRTC: the library found has no symbol %s (not NVRTC 11.2 or later?)", missing);
    dlclose(h);
    return false;
  }
  *(void **)&g_nv.nvrtcGetCUBINSize = dlsym(h, "nvrtcGetCUBINSize");
  *(void **)&g_nv.nvrtcGetCUBIN = dlsym(h, "nvrtcGetCUBIN");
  *(void **)&g_nv.nvrtcGetNumSupportedArchs = dlsym(h, "nvrtcGetNumSupportedArchs");
  *(void **)&g_nv.nvrtcGetSupportedArchs = dlsym(h, "nvrtcGetSupportedArchs");
  g_nv.nvrtcVersion(&g_nv.major, &g_nv.minor);
  int n = 0;
  if (g_nv.nvrtcGetCUBIN && g_nv.nvrtcGetCUBINSize && g_nv.nvrtcGetNumSupportedArchs && g_nv.nvrtcGetSupportedArchs &&
      g_nv.nvrtcGetNumSupportedArchs(&n) == 0 && n > 0) {
    g_nv.archs = tg_xcalloc((size_t)n, sizeof *g_nv.archs);
    if (g_nv.nvrtcGetSupportedArchs(g_nv.archs) == 0) g_nv.narchs = n;
  }
  return true;
}

bool nvrtc_load(const char *who) {
  pthread_mutex_lock(&g_nv_lock);
  if (!g_nv.ok) g_nv.ok = nvrtc_open_locked(); /* a failure is tried again at the next open */
  bool ok = g_nv.ok;
  pthread_mutex_unlock(&g_nv_lock);
  if (!ok) tg_set_error(TG_ERR_RUNTIME, "%s: %s", who, g_nv.why);
  return ok;
}

void nvrtc_version(int *major, int *minor) {
  *major = g_nv.major;
  *minor = g_nv.minor;
}

bool cuda_parse_arch(const char *who, const char *arch, int *sm) {
  char *end = NULL;
  long v = arch && strncmp(arch, "sm_", 3) == 0 ? strtol(arch + 3, &end, 10) : 0;
  if (!end || end == arch + 3 || *end || v < 50 || v > 200) {
    tg_set_error(TG_ERR_INVALID, "%s: arch '%s' is not an sm_XX compute capability (e.g. %s:sm_90)", who, arch ? arch : "",
                 who);
    return false;
  }
  *sm = (int)v;
  return true;
}

int nvrtc_target(const char *who, int sm, bool *cubin) {
  *cubin = false;
  if (g_nv.narchs == 0) return sm; /* an NVRTC that cannot list its archs: PTX for the arch itself */
  int best = 0;
  for (int i = 0; i < g_nv.narchs; i++) {
    if (g_nv.archs[i] == sm) {
      *cubin = true;
      return sm;
    }
    if (g_nv.archs[i] < sm && g_nv.archs[i] > best) best = g_nv.archs[i];
  }
  if (!best)
    tg_set_error(TG_ERR_RUNTIME, "%s: NVRTC %d.%d compiles for sm_%d and newer, not for this GPU's sm_%d (use an older CUDA "
                 "toolkit: set CUDA_PATH)", who, g_nv.major, g_nv.minor, g_nv.archs[0], sm);
  return best;
}

tg_status nvrtc_compile(const char *who, const char *src, int sm, bool cubin, uint8_t **lib, size_t *liblen) {
  *lib = NULL;
  *liblen = 0;
  if (!src) return tg_set_error(TG_ERR_INVALID, "%s: compile: no source", who);
  if (cubin && !g_nv.nvrtcGetCUBIN)
    return tg_set_error(TG_ERR_COMPILE, "%s: NVRTC %d.%d cannot produce a CUBIN (nvrtcGetCUBIN missing)", who, g_nv.major, g_nv.minor);
  nvrtcProgram p = NULL;
  nvrtcResult r = g_nv.nvrtcCreateProgram(&p, src, "tg_kernel.cu", 0, NULL, NULL);
  if (r) return tg_set_error(TG_ERR_COMPILE, "%s: nvrtcCreateProgram: %s", who, g_nv.nvrtcGetErrorString(r));
  char arch[64], inc[1100];
  /* a kernel with Hopper's warpgroup instructions compiles for sm_90a, the arch-specific target
   * they need (it runs on sm_90 alone, which the heuristics choose them for) */
  bool arch_specific = sm == 90 && strstr(src, "wgmma.") != NULL;
  snprintf(arch, sizeof arch, "--gpu-architecture=%s_%d%s", cubin ? "sm" : "compute", sm, arch_specific ? "a" : "");
  snprintf(inc, sizeof inc, "-I%s/include", cuda_path());
  const char *opts[] = {arch, inc, "-std=c++17", "-w"};
  r = g_nv.nvrtcCompileProgram(p, 4, opts);
  tg_status st = TG_OK;
  size_t n = 0;
  if (r) {
    g_nv.nvrtcGetProgramLogSize(p, &n);
    char *log = tg_xcalloc(1, n + 1);
    if (n) g_nv.nvrtcGetProgramLog(p, log);
    st = tg_set_error(TG_ERR_COMPILE, "%s: NVRTC (sm_%d) failed: %s\n%s", who, sm, g_nv.nvrtcGetErrorString(r), log);
    free(log);
  } else if (cubin ? g_nv.nvrtcGetCUBINSize(p, &n) != 0 || n == 0 : g_nv.nvrtcGetPTXSize(p, &n) != 0 || n == 0) {
    st = tg_set_error(TG_ERR_COMPILE, "%s: NVRTC (sm_%d) produced no %s", who, sm, cubin ? "CUBIN" : "PTX");
  } else {
    *lib = tg_xmalloc(n + 1);
    r = cubin ? g_nv.nvrtcGetCUBIN(p, (char *)*lib) : g_nv.nvrtcGetPTX(p, (char *)*lib);
    if (r) {
      free(*lib);
      *lib = NULL;
      st = tg_set_error(TG_ERR_COMPILE, "%s: NVRTC (sm_%d): cannot read the %s: %s", who, sm, cubin ? "CUBIN" : "PTX",
                        g_nv.nvrtcGetErrorString(r));
    } else {
      (*lib)[n] = 0; /* PTX's size counts its NUL already; one more byte costs nothing */
      *liblen = n;
    }
  }
  g_nv.nvrtcDestroyProgram(&p);
  return st;
}

/* nvdisasm or cuobjdump: $CUDA_PATH/bin first, then PATH. malloc'd path, *is_nvdisasm set; NULL when
 * neither is there. */
static char *find_sass_tool(bool *is_nvdisasm) {
  const char *tools[] = {"nvdisasm", "cuobjdump"};
  for (int where = 0; where < 2; where++) {
    for (int t = 0; t < 2; t++) {
      char path[1200];
      if (where == 0) snprintf(path, sizeof path, "%s/bin/%s", cuda_path(), tools[t]);
      else snprintf(path, sizeof path, "%s", tools[t]);
      char *found = host_which(path);
      if (found) {
        *is_nvdisasm = t == 0;
        return found;
      }
    }
  }
  return NULL;
}

char *cuda_listing(const char *who, const char *src, int sm, const uint8_t *cubin_or_null, size_t cubinlen) {
  uint8_t *ptx = NULL, *own = NULL;
  size_t ptxlen = 0, ownlen = 0;
  if (nvrtc_compile(who, src, sm, false, &ptx, &ptxlen) != TG_OK) return NULL;
  SB out;
  sb_init(&out);
  sb_printf(&out, "// PTX (compute_%d)\n%s", sm, (const char *)ptx);
  free(ptx);
  bool is_nvdisasm = false;
  char *tool = find_sass_tool(&is_nvdisasm);
  if (!tool) {
    static _Atomic int said;
    if (!atomic_exchange(&said, 1))
      fprintf(stderr, "DEBUG=7: no SASS shown: neither nvdisasm nor cuobjdump is installed (looked in %s/bin and PATH; they "
                      "come with the CUDA toolkit, or pip install nvidia-cuda-nvdisasm)\n", cuda_path());
    return sb_take(&out);
  }
  const uint8_t *bin = cubin_or_null;
  size_t binlen = cubinlen;
  bool cubin = true;
  if (!bin && g_nv.narchs) nvrtc_target(who, sm, &cubin);
  if (!bin && cubin && nvrtc_compile(who, src, sm, true, &own, &ownlen) == TG_OK) bin = own, binlen = ownlen;
  const char *args[] = {is_nvdisasm ? "-c" : "-sass", NULL};
  char *sass = bin ? host_disassemble(tool, args, bin, binlen, ".cubin") : NULL;
  if (sass) sb_printf(&out, "\n// SASS (sm_%d, %s)\n%s", sm, is_nvdisasm ? "nvdisasm" : "cuobjdump -sass", sass);
  else if (!cubin) sb_printf(&out, "\n// no SASS: NVRTC %d.%d has no machine code for sm_%d\n", g_nv.major, g_nv.minor, sm);
  free(sass);
  free(own);
  free(tool);
  if (bin && !sass) {
    sb_free(&out);
    return NULL; /* the error of the compile or of the tool */
  }
  return sb_take(&out);
}
