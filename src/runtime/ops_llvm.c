/*
 * ops_llvm.c -- the CPU device's LLVM renderer (DEV=CPU:LLVM[:ARCH]): host memory and the thread
 * pool as the C renderer's device, kernels in LLVM IR (renderer/llvmir.c) compiled in process by
 * libLLVM and loaded by its ORC LLJIT. No compiler process runs and no file is written except the
 * kernel cache.
 *
 * In: LLVM IR text defining `void @<fname>(ptr %bufs, i64 %gstart, i64 %gend)`.
 * Out: compile -> a blob "TGLL", u32 symbol length, the symbol, the ELF object (cached on disk under
 *      the same cache as the C kernels, keyed by "llvm15", the target triple, CPU and features);
 *      load -> the object added to the JIT under its own resource tracker, its entry point looked up;
 *      unload removes the tracker (the code is freed); disasm -> the target machine's assembly.
 * Invariants:
 *  - libLLVM-15 is opened with dlopen at the first CPU:LLVM open, never linked (TG_LLVM_LIB names
 *    another library; a test points it at a missing one). Only the C API is used; its few types are
 *    declared here as opaque pointers, so the library builds without LLVM's headers.
 *  - Each compile uses its own LLVMContext and target machine: compiles run on several threads at
 *    once. The JIT is one per process (ORC is thread-safe), created at the first open.
 *  - A kernel's symbol is its name and a hash of its source and target, so two kernels of one name
 *    never meet in the JIT's one symbol table.
 *  - Kernels call the narrow-float conversions and the integer power below; they are defined in the
 *    JIT as absolute symbols (addresses in this library), so statically linked programs work too.
 *    libm's functions (exp2f, powf, ...) and memset/memcpy come from the process.
 *  - The arch string is "<triple arch>,<cpu>,<feature>,..." (tinygrad's spelling:
 *    "x86_64,znver2,avx2,-avx512f"); features without a sign are enabled. It must name this
 *    machine's architecture (the kernels run here), and every enabled feature must be one the host
 *    has: anything else is refused when the device opens.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "device.h"
#include "threadpool.h"

typedef void *Ref; /* every LLVM handle: LLVMContextRef, LLVMModuleRef, LLVMErrorRef, ... */
typedef struct {
  uint8_t generic, target;
} JitFlags;
typedef struct {
  Ref name;
  uint64_t addr;
  JitFlags flags;
} SymPair;

#define LLVM_FUNCS(X)                                                                                  \
  X(Ref, LLVMContextCreate, (void))                                                                    \
  X(void, LLVMContextDispose, (Ref))                                                                   \
  X(Ref, LLVMCreateMemoryBufferWithMemoryRangeCopy, (const char *, size_t, const char *))              \
  X(int, LLVMParseIRInContext, (Ref, Ref, Ref *, char **))                                             \
  X(int, LLVMGetTargetFromTriple, (const char *, Ref *, char **))                                      \
  X(Ref, LLVMCreateTargetMachine, (Ref, const char *, const char *, const char *, int, int, int))      \
  X(void, LLVMDisposeTargetMachine, (Ref))                                                             \
  X(void, LLVMSetTarget, (Ref, const char *))                                                          \
  X(Ref, LLVMCreateTargetDataLayout, (Ref))                                                            \
  X(void, LLVMSetModuleDataLayout, (Ref, Ref))                                                         \
  X(void, LLVMDisposeTargetData, (Ref))                                                                \
  X(Ref, LLVMCreatePassBuilderOptions, (void))                                                         \
  X(void, LLVMPassBuilderOptionsSetLoopVectorization, (Ref, int))                                      \
  X(void, LLVMDisposePassBuilderOptions, (Ref))                                                        \
  X(Ref, LLVMRunPasses, (Ref, const char *, Ref, Ref))                                                 \
  X(int, LLVMTargetMachineEmitToMemoryBuffer, (Ref, Ref, int, char **, Ref *))                         \
  X(const char *, LLVMGetBufferStart, (Ref))                                                           \
  X(size_t, LLVMGetBufferSize, (Ref))                                                                  \
  X(void, LLVMDisposeMemoryBuffer, (Ref))                                                              \
  X(void, LLVMDisposeModule, (Ref))                                                                    \
  X(void, LLVMDisposeMessage, (char *))                                                                \
  X(Ref, LLVMGetNamedFunction, (Ref, const char *))                                                    \
  X(void, LLVMSetValueName2, (Ref, const char *, size_t))                                              \
  X(int, LLVMLinkModules2, (Ref, Ref))                                                                 \
  X(char *, LLVMGetHostCPUName, (void))                                                                \
  X(char *, LLVMGetHostCPUFeatures, (void))                                                            \
  X(char *, LLVMGetDefaultTargetTriple, (void))                                                        \
  X(char *, LLVMGetErrorMessage, (Ref))                                                                \
  X(void, LLVMDisposeErrorMessage, (char *))                                                           \
  X(Ref, LLVMOrcCreateLLJIT, (Ref *, Ref))                                                             \
  X(Ref, LLVMOrcLLJITGetMainJITDylib, (Ref))                                                           \
  X(char, LLVMOrcLLJITGetGlobalPrefix, (Ref))                                                          \
  X(Ref, LLVMOrcLLJITMangleAndIntern, (Ref, const char *))                                             \
  X(Ref, LLVMOrcLLJITAddObjectFileWithRT, (Ref, Ref, Ref))                                             \
  X(Ref, LLVMOrcLLJITLookup, (Ref, uint64_t *, const char *))                                          \
  X(Ref, LLVMOrcJITDylibCreateResourceTracker, (Ref))                                                  \
  X(Ref, LLVMOrcResourceTrackerRemove, (Ref))                                                          \
  X(void, LLVMOrcReleaseResourceTracker, (Ref))                                                        \
  X(Ref, LLVMOrcLLJITGetExecutionSession, (Ref))                                                       \
  X(Ref, LLVMOrcExecutionSessionGetSymbolStringPool, (Ref))                                            \
  X(void, LLVMOrcSymbolStringPoolClearDeadEntries, (Ref))                                              \
  X(Ref, LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess, (Ref *, char, void *, void *))          \
  X(void, LLVMOrcJITDylibAddGenerator, (Ref, Ref))                                                     \
  X(Ref, LLVMOrcAbsoluteSymbols, (SymPair *, size_t))                                                  \
  X(Ref, LLVMOrcJITDylibDefine, (Ref, Ref))                                                             \
  X(void, LLVMParseCommandLineOptions, (int, const char *const *, const char *))

typedef struct {
#define DECL(ret, name, args) ret(*name) args;
  LLVM_FUNCS(DECL)
#undef DECL
} LlvmApi;

static LlvmApi L;
static void *g_llvm_lib;
static Ref g_jit, g_jd;
static char *g_host_triple, *g_host_cpu, *g_host_features;
static pthread_mutex_t g_llvm_lock = PTHREAD_MUTEX_INITIALIZER;
/* Code generation without loop strength reduction, which LLVM's O2 back end runs on every loop
 * (with its analysis of each induction variable's users): on beautiful_mnist's kernels it took about
 * a sixth of the code generator's time, and the kernels ran no slower without it (the renderer's loops
 * index their buffers with one counter and constant offsets, which addressing modes take as they
 * are). The switch is one of LLVM's process-wide options, so it is set only when this library is
 * the one that brings LLVM into the process: another user of it (PoCL, Mesa) that loaded it first
 * keeps its code generation as it was. TG_LLVM_LSR=1 keeps the pass. */
static bool g_no_lsr;

#define LLVM_LIBRARY "libLLVM-15.so.1"
/* The IR pipeline. The renderer has already done what LLVM's O2 would spend its time on: loops are
 * unrolled and vectorized explicitly, the register tiles are spelled out. What is left is putting
 * the loop counters into registers (sroa), folding the index arithmetic (early-cse, instcombine)
 * and tidying the branches; the wrapper's body is inlined. O2's loop unrolling, SLP vectorizer and
 * GVN took 7x the time on beautiful_mnist's kernels (5.2 s against 0.7 s of compiling) for a train
 * step no faster (308 against 285-290 ms), and bench/ops.py finds no op slower. LICM hoists what
 * the renderer writes inside a loop but does not depend on it -- a scalar splatted into a vector
 * for each use (a row's mean in a variance: 91 -> 65 us, C 54; passes 35 -> 39 ms of a step's
 * compiling). */
#define LLVM_PASSES "always-inline,function(sroa,early-cse,instcombine,simplifycfg,loop-mssa(licm))"
/* What a kernel marked LLVM_LOOP_VECTORIZE_MARK (one the renderer left scalar) gets before it
 * joins its batch: the lean pipeline, then LLVM's loop vectorizer with its cost model (which only
 * makes legal changes: no float reduction is reassociated). An integer max-index reduction (argmax's
 * second kernel) ran 1.8-3x slower than gcc's SLP-vectorized C before; run over every kernel, the
 * vectorizer cost half as much compile time again for nothing on kernels the renderer vectorized. */
#define LLVM_LV_PASSES                                                                                  \
  "always-inline,function(sroa,early-cse,instcombine,simplifycfg,loop-simplify,lcssa,loop-rotate,loop-vectorize," \
  "instcombine,simplifycfg)"
/* What a kernel marked LLVM_SHORT_LOOPS_MARK gets before it joins its batch: its loops of small
 * constant trip count unrolled whole (a pooling window's 2x2 steps: branches and counter updates
 * around two loads and a max each). Only those kernels: run over every kernel of a beautiful_mnist
 * step it took their compiling from 196-218 to 243-249 ms (measured on a busy host). */
#define LLVM_SHORT_LOOP_PASSES "function(sroa,early-cse,instcombine,simplifycfg,loop(loop-rotate),loop(loop-unroll-full))"
#define LLVM_PACKAGES "libllvm15 (Debian/Ubuntu; llvm-15-dev brings it too)"

/* The target machine of one architecture: the kernels' triple, CPU and features. */
typedef struct {
  int index;
  char triple[128];
  char cpu[64];
  char *features; /* "+avx2,-avx512f" (malloc'd) */
  char id[512];   /* part of every cache key */
  char passes[512]; /* the optimization pipeline (LLVM_PASSES, or TG_LLVM_PASSES) */
  /* idle target machines: creating one costs about a millisecond (its subtarget's tables), so
   * compiles take one from here and put it back; at most one per compiling thread is ever made */
  pthread_mutex_t tm_lock;
  Ref tm_free[16];
  int ntm_free;
} LlvmState;

/* One object in the JIT, holding a batch of kernels or a single one: loaded once, shared by their
 * programs, removed with the last of them. */
typedef struct BatchObj {
  uint64_t hash; /* a batch's (its kernels' symbols end in it), or a single kernel object's bytes' */
  Ref rt;
  int refs;
  struct BatchObj *next;
} BatchObj;

static BatchObj *g_batches;
static pthread_mutex_t g_batch_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
  tp_range_fn fn;
  BatchObj *batch; /* the shared object it is in */
} LlvmProgram;

/* ---------------------------------------------------------------------------------------------- */
/* the kernels' runtime helpers (the C prelude's algorithms, called from LLVM IR)                   */

static float h2f(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, b;
  if (e == 0) {
    if (m == 0) b = s;
    else {
      e = 113;
      while (!(m & 0x400)) m <<= 1, e--;
      m &= 0x3ff;
      b = s | (e << 23) | (m << 13);
    }
  } else if (e == 31) b = s | 0x7f800000u | (m << 13);
  else b = s | ((e + 112) << 23) | (m << 13);
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static uint16_t f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t s = (x >> 16) & 0x8000, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) {
    uint32_t p = (a >> 13) & 0x3ff;
    return (uint16_t)(s | 0x7c00 | (p ? p : 0x200));
  }
  if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00);
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return (uint16_t)s;
    uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000, sh = 126 - e, r = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(s | r);
  }
  uint32_t r = a + 0xc8000fffu + ((a >> 13) & 1);
  return (uint16_t)(s | (r >> 13));
}
static float rh(float f) { return h2f(f2h(f)); }
static float b2f(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static uint16_t f2b(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) & 0x7f ? (x >> 16) : ((x >> 16) | 0x40));
  x += 0x7fffu + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}
static float rb(float f) { return b2f(f2b(f)); }
/* fp8: the host's conversions (dtype.c), which the C prelude's tg_f2f8 / tg_f82f spell for kernels */
static uint8_t f28a(double f) { return double_to_fp8(f, TG_FP8E4M3); }
static uint8_t f28b(double f) { return double_to_fp8(f, TG_FP8E5M2); }
static uint8_t f28c(double f) { return double_to_fp8(f, TG_FP8E4M3FNUZ); }
static uint8_t f28d(double f) { return double_to_fp8(f, TG_FP8E5M2FNUZ); }
static float f8a2f(uint8_t b) { return (float)fp8_to_double(b, TG_FP8E4M3); }
static float f8b2f(uint8_t b) { return (float)fp8_to_double(b, TG_FP8E5M2); }
static float f8c2f(uint8_t b) { return (float)fp8_to_double(b, TG_FP8E4M3FNUZ); }
static float f8d2f(uint8_t b) { return (float)fp8_to_double(b, TG_FP8E5M2FNUZ); }
static float r8a(double f) { return f8a2f(f28a(f)); }
static float r8b(double f) { return f8b2f(f28b(f)); }
static float r8c(double f) { return f8c2f(f28c(f)); }
static float r8d(double f) { return f8d2f(f28d(f)); }
static int64_t ipow(int64_t b, int64_t e) {
  if (e < 0) return b == 1 ? 1 : (b == -1 ? ((e & 1) ? -1 : 1) : 0);
  uint64_t r = 1, ub = (uint64_t)b; /* wraps like the C kernels' (-fwrapv) */
  while (e) {
    if (e & 1) r *= ub;
    ub *= ub;
    e >>= 1;
  }
  return (int64_t)r;
}

static const struct {
  const char *name;
  void *fn;
} HELPERS[] = {
    {"tg_llvm_h2f", (void *)h2f},   {"tg_llvm_f2h", (void *)f2h},   {"tg_llvm_rh", (void *)rh},
    {"tg_llvm_b2f", (void *)b2f},   {"tg_llvm_f2b", (void *)f2b},   {"tg_llvm_rb", (void *)rb},
    {"tg_llvm_8a2f", (void *)f8a2f}, {"tg_llvm_8b2f", (void *)f8b2f}, {"tg_llvm_8c2f", (void *)f8c2f},
    {"tg_llvm_8d2f", (void *)f8d2f}, {"tg_llvm_f28a", (void *)f28a},  {"tg_llvm_f28b", (void *)f28b},
    {"tg_llvm_f28c", (void *)f28c},  {"tg_llvm_f28d", (void *)f28d},  {"tg_llvm_r8a", (void *)r8a},
    {"tg_llvm_r8b", (void *)r8b},    {"tg_llvm_r8c", (void *)r8c},    {"tg_llvm_r8d", (void *)r8d},
    {"tg_llvm_ipow", (void *)ipow},
};
#define NHELPERS (sizeof HELPERS / sizeof HELPERS[0])

/* ---------------------------------------------------------------------------------------------- */
/* loading libLLVM                                                                                 */

/* Is the line after a kernel's first line (nl points at that first line's end; end: the IR's end)
 * exactly `mark`? */
static bool has_mark(const char *nl, const char *end, const char *mark) {
  size_t ml = strlen(mark);
  return nl && (size_t)(end - nl) > ml + 1 && memcmp(nl + 1, mark, ml) == 0 && nl[1 + ml] == '\n';
}

static char *take_error(Ref err) {
  if (!err) return tg_xstrdup("?");
  char *m = L.LLVMGetErrorMessage(err);
  char *s = tg_xstrdup(m ? m : "?");
  if (m) L.LLVMDisposeErrorMessage(m);
  return s;
}

/* the target of the host's architecture ("X86" for x86_64): its four initializers */
static const char *target_family(const char *arch) {
  if (!strcmp(arch, "x86_64") || !strcmp(arch, "i386") || !strcmp(arch, "i686")) return "X86";
  if (!strcmp(arch, "aarch64") || !strcmp(arch, "arm64")) return "AArch64";
  if (!strncmp(arch, "riscv", 5)) return "RISCV";
  if (!strncmp(arch, "ppc64", 5) || !strncmp(arch, "powerpc64", 9)) return "PowerPC";
  if (!strcmp(arch, "s390x")) return "SystemZ";
  return NULL;
}

/* Opens the library, initializes the host's target and creates the JIT once; false + error. */
static bool llvm_load_api(void) {
  pthread_mutex_lock(&g_llvm_lock);
  bool ok = g_jit != NULL;
  if (ok || g_llvm_lib) goto out; /* loaded but the JIT failed earlier: the error was given then */
  const char *name = getenv_str("TG_LLVM_LIB", LLVM_LIBRARY);
  if (!name || !*name) name = LLVM_LIBRARY;
  void *pre = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD); /* another part of the process uses it */
  bool shared = pre != NULL;
  if (pre) dlclose(pre);
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    tg_set_error(TG_ERR_RUNTIME, "CPU:LLVM: cannot load the LLVM library %s (%s); on Debian/Ubuntu install %s", name,
                 why ? why : "not found", LLVM_PACKAGES);
    goto out;
  }
  LlvmApi api;
  const char *missing = NULL;
#define LOAD(ret, fn, args)                              \
  if (!missing && !(*(void **)&api.fn = dlsym(h, #fn))) \
    missing = #fn;
  LLVM_FUNCS(LOAD)
#undef LOAD
  if (missing) {
    tg_set_error(TG_ERR_RUNTIME, "CPU:LLVM: %s has no %s (LLVM 15 or newer is needed: %s)", name, missing, LLVM_PACKAGES);
    dlclose(h);
    goto out;
  }
  L = api;
  char *triple = L.LLVMGetDefaultTargetTriple();
  char arch[64];
  snprintf(arch, sizeof arch, "%.*s", (int)strcspn(triple, "-"), triple);
  const char *fam = target_family(arch);
  const char *parts[] = {"TargetInfo", "Target", "TargetMC", "AsmPrinter"};
  for (int i = 0; fam && i < 4; i++) {
    char sym[96];
    snprintf(sym, sizeof sym, "LLVMInitialize%s%s", fam, parts[i]);
    void (*init)(void);
    *(void **)&init = dlsym(h, sym);
    if (!init) {
      fam = NULL;
      break;
    }
    init();
  }
  if (!fam) {
    tg_set_error(TG_ERR_RUNTIME, "CPU:LLVM: %s cannot generate code for this machine (%s)", name, triple);
    L.LLVMDisposeMessage(triple);
    dlclose(h);
    goto out;
  }
  g_llvm_lib = h;
  g_no_lsr = !shared && !getenv_int("TG_LLVM_LSR", 0);
  if (g_no_lsr) {
    const char *argv[] = {"libtinygrad", "-disable-lsr"};
    L.LLVMParseCommandLineOptions(2, argv, NULL); /* errors go to LLVM's null stream, never exit */
  }
  g_host_triple = tg_xstrdup(triple);
  L.LLVMDisposeMessage(triple);
  char *cpu = L.LLVMGetHostCPUName(), *feat = L.LLVMGetHostCPUFeatures();
  g_host_cpu = tg_xstrdup(cpu ? cpu : "generic");
  g_host_features = tg_xstrdup(feat ? feat : "");
  if (cpu) L.LLVMDisposeMessage(cpu);
  if (feat) L.LLVMDisposeMessage(feat);
  Ref jit = NULL, err = L.LLVMOrcCreateLLJIT(&jit, NULL);
  if (err) {
    char *m = take_error(err);
    tg_set_error(TG_ERR_RUNTIME, "CPU:LLVM: cannot create the JIT: %s", m);
    free(m);
    goto out;
  }
  Ref jd = L.LLVMOrcLLJITGetMainJITDylib(jit);
  /* libm and libc for the calls LLVM emits (exp2f, powf, memset, ...) */
  Ref gen = NULL;
  err = L.LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, L.LLVMOrcLLJITGetGlobalPrefix(jit), NULL, NULL);
  if (!err) L.LLVMOrcJITDylibAddGenerator(jd, gen);
  else free(take_error(err));
  SymPair syms[NHELPERS];
  for (size_t i = 0; i < NHELPERS; i++) {
    syms[i].name = L.LLVMOrcLLJITMangleAndIntern(jit, HELPERS[i].name);
    syms[i].addr = (uint64_t)(uintptr_t)HELPERS[i].fn;
    syms[i].flags = (JitFlags){1 /* exported */ | 4 /* callable */, 0};
  }
  err = L.LLVMOrcJITDylibDefine(jd, L.LLVMOrcAbsoluteSymbols(syms, NHELPERS));
  if (err) {
    char *m = take_error(err);
    tg_set_error(TG_ERR_RUNTIME, "CPU:LLVM: cannot define the kernels' helpers in the JIT: %s", m);
    free(m);
    goto out;
  }
  g_jd = jd;
  g_jit = jit;
  ok = true;
out:
  pthread_mutex_unlock(&g_llvm_lock);
  return ok;
}

/* ---------------------------------------------------------------------------------------------- */
/* the arch string                                                                                 */

/* Is feature f (n bytes: "avx2") named with sign c ('+' or '-') in a feature list
 * ("+sse,+avx2,-avx512f")? The first entry naming f decides. */
static bool feature_is(const char *list, char c, const char *f, size_t n) {
  for (const char *p = list; p && *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n + 1 && strncmp(p + 1, f, n) == 0) return p[0] == c;
    if (!e) break;
    p = e + 1;
  }
  return false;
}

/* Is feature f enabled on the host? */
static bool host_has(const char *f, size_t n) { return feature_is(g_host_features, '+', f, n); }

static bool valid_name(const char *s, size_t n) {
  if (n == 0) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
      return false;
  }
  return true;
}

/* "x86_64,znver2,avx2,-avx512f" -> state; NULL arch = the host. false + error. */
static bool parse_arch(LlvmState *s, const char *arch) {
  char host_arch[64];
  snprintf(host_arch, sizeof host_arch, "%.*s", (int)strcspn(g_host_triple, "-"), g_host_triple);
  if (!arch || !*arch) {
    snprintf(s->triple, sizeof s->triple, "%s", g_host_triple);
    snprintf(s->cpu, sizeof s->cpu, "%s", g_host_cpu);
    s->features = tg_xstrdup(g_host_features);
    return true;
  }
  const char *hint = "write it as <arch>,<cpu>[,<feature>...], e.g. x86_64,znver2,avx2,-avx512f";
  const char *c1 = strchr(arch, ',');
  size_t an = c1 ? (size_t)(c1 - arch) : strlen(arch);
  if (!valid_name(arch, an)) {
    tg_set_error(TG_ERR_INVALID, "device_get: CPU:LLVM arch '%s': empty or bad architecture name; %s", arch, hint);
    return false;
  }
  if (!(an == strlen(host_arch) && strncasecmp(arch, host_arch, an) == 0)) {
    tg_set_error(TG_ERR_INVALID, "device_get: CPU:LLVM arch '%s': architecture '%.*s' is not this machine's (%s); "
                 "CPU kernels run where they are compiled", arch, (int)an, arch, host_arch);
    return false;
  }
  snprintf(s->triple, sizeof s->triple, "%s", g_host_triple);
  const char *cpu = c1 ? c1 + 1 : NULL;
  if (!cpu) {
    snprintf(s->cpu, sizeof s->cpu, "%s", g_host_cpu);
    s->features = tg_xstrdup(g_host_features);
    return true;
  }
  const char *c2 = strchr(cpu, ',');
  size_t cn = c2 ? (size_t)(c2 - cpu) : strlen(cpu);
  if (!valid_name(cpu, cn) || cn >= sizeof s->cpu || cpu[0] == '+' || cpu[0] == '-') {
    tg_set_error(TG_ERR_INVALID, "device_get: CPU:LLVM arch '%s': bad CPU name '%.*s'; %s", arch, (int)cn, cpu, hint);
    return false;
  }
  snprintf(s->cpu, sizeof s->cpu, "%.*s", (int)cn, cpu);
  SB f;
  sb_init(&f);
  for (const char *p = c2; p;) {
    const char *tok = p + 1, *e = strchr(tok, ',');
    size_t n = e ? (size_t)(e - tok) : strlen(tok);
    p = e;
    bool off = n && tok[0] == '-', sign = n && (tok[0] == '-' || tok[0] == '+');
    const char *name = sign ? tok + 1 : tok;
    size_t nn = sign ? n - 1 : n;
    if (!valid_name(name, nn) || name[0] == '-' || name[0] == '+') {
      tg_set_error(TG_ERR_INVALID, "device_get: CPU:LLVM arch '%s': bad feature '%.*s' (a name, +name or -name); %s", arch,
                   (int)n, tok, hint);
      sb_free(&f);
      return false;
    }
    if (nn >= 8 && !strncmp(name + nn - 8, "bit-mode", 8)) { /* (the triple sets the mode) */
      tg_set_error(TG_ERR_INVALID, "device_get: CPU:LLVM arch '%s': '%.*s' is the code's mode, which the architecture sets "
                   "(x86_64: 64-bit), not a feature to choose", arch, (int)n, tok);
      sb_free(&f);
      return false;
    }
    if (off && nn == 5 && !strncmp(name, "64bit", 5)) {
      tg_set_error(TG_ERR_INVALID, "device_get: CPU:LLVM arch '%s': '-64bit': x86_64 code needs the 64-bit instructions", arch);
      sb_free(&f);
      return false;
    }
    if (off && nn == 3 && !strncmp(name, "sse", 3)) { /* (x86-64 returns floats in SSE registers) */
      tg_set_error(TG_ERR_INVALID, "device_get: CPU:LLVM arch '%s': '-sse' leaves LLVM no registers for the x86-64 calling "
                   "convention's float values (its back end stops the process on the first kernel calling a math function); "
                   "turn off wider extensions (-avx512f, -avx2, -sse4.1, ...) instead", arch);
      sb_free(&f);
      return false;
    }
    if (!off && !host_has(name, nn)) {
      tg_set_error(TG_ERR_INVALID, "device_get: CPU:LLVM arch '%s': this CPU has no '%.*s' (its kernels would not run here)",
                   arch, (int)nn, name);
      sb_free(&f);
      return false;
    }
    sb_printf(&f, "%s%c%.*s", f.len ? "," : "", off ? '-' : '+', (int)nn, name);
  }
  /* x86-64 code needs the CPU's 64-bit instructions, which a CPU LLVM does not know ("native") or a
   * 32-bit one ("i386", "pentium") lacks: LLVM's back end then stopped the process ("64-bit code
   * requested on a subtarget that doesn't support it"). They are asked for explicitly, so such a
   * CPU name only tunes (LLVM says once that it does not know it). */
  if (!strcmp(target_family(host_arch), "X86")) sb_printf(&f, "%s+64bit", f.len ? "," : "");
  s->features = f.s ? sb_take(&f) : tg_xstrdup("");
  return true;
}

static void *llvm_open_arch(int index, const char *arch) {
  if (!llvm_load_api()) return NULL;
  LlvmState *s = tg_xcalloc(1, sizeof *s);
  s->index = index;
  if (!parse_arch(s, arch)) {
    free(s->features);
    free(s);
    return NULL;
  }
  Ref t = NULL;
  char *err = NULL;
  if (L.LLVMGetTargetFromTriple(s->triple, &t, &err)) {
    tg_set_error(TG_ERR_RUNTIME, "CPU:LLVM: no target for %s: %s", s->triple, err ? err : "?");
    if (err) L.LLVMDisposeMessage(err);
    free(s->features);
    free(s);
    return NULL;
  }
  /* the features are hashed: the host's list is long */
  const char *pipe = getenv_str("TG_LLVM_PASSES", LLVM_PASSES);
  snprintf(s->passes, sizeof s->passes, "%s", pipe && *pipe ? pipe : LLVM_PASSES);
  /* the pipelines are part of the key: a kernel built by another one is another binary */
  static const char pre[] = LLVM_LV_PASSES "|" LLVM_SHORT_LOOP_PASSES;
  snprintf(s->id, sizeof s->id, "llvm15%s:%016llx|%s|%s|%016llx", g_no_lsr ? "-nolsr" : "",
           (unsigned long long)hash_bytes(pre, strlen(pre), hash_bytes(s->passes, strlen(s->passes), 0x70617373ULL)), s->triple, s->cpu,
           (unsigned long long)hash_bytes(s->features, strlen(s->features), 0x6c6c766dULL));
  pthread_mutex_init(&s->tm_lock, NULL);
  return s;
}

static void *llvm_open(int index) { return llvm_open_arch(index, NULL); }

static void llvm_close(void *state) {
  LlvmState *s = state;
  if (!s) return;
  for (int i = 0; i < s->ntm_free; i++) L.LLVMDisposeTargetMachine(s->tm_free[i]);
  pthread_mutex_destroy(&s->tm_lock);
  free(s->features);
  free(s);
}

static const char *llvm_compiler_id(void *state) { return ((LlvmState *)state)->id; }

/* ---------------------------------------------------------------------------------------------- */
/* compile                                                                                         */

/* The kernel's name: the identifier after "define void @" that is not the .body function. */
static void ir_kernel_name(const char *src, char *out, size_t cap) {
  const char *p = src;
  out[0] = '\0';
  while ((p = strstr(p, "define void @"))) {
    p += strlen("define void @");
    size_t n = strcspn(p, "(");
    if (n < cap && !(n > 5 && strncmp(p + n - 5, ".body", 5) == 0)) {
      snprintf(out, cap, "%.*s", (int)n, p);
      return;
    }
  }
  snprintf(out, cap, "?");
}

typedef struct {
  LlvmState *s;
  int filetype; /* 0: assembly, 1: object */
} BuildCtx;

/* O2 code generation, PIC, the small code model: the JIT links the object as a shared library
 * would be. NULL when LLVM makes none (the caller reports it). */
static Ref tm_take(LlvmState *s, Ref target) {
  Ref tm = NULL;
  pthread_mutex_lock(&s->tm_lock);
  if (s->ntm_free) tm = s->tm_free[--s->ntm_free];
  pthread_mutex_unlock(&s->tm_lock);
  return tm ? tm : L.LLVMCreateTargetMachine(target, s->triple, s->cpu, s->features, 2, 2, 3);
}

static void tm_put(LlvmState *s, Ref tm) {
  pthread_mutex_lock(&s->tm_lock);
  if (s->ntm_free < (int)(sizeof s->tm_free / sizeof s->tm_free[0])) s->tm_free[s->ntm_free++] = tm, tm = NULL;
  pthread_mutex_unlock(&s->tm_lock);
  if (tm) L.LLVMDisposeTargetMachine(tm);
}

/* One kernel of a compile: its entry point's name, the symbol it gets in the JIT, its IR. */
typedef struct {
  char name[128];
  char sym[192];
  const char *ir;
  size_t irlen;
} Seg;

/* A batch from program_get_batch: "#define NAME ALIAS\n<IR>#undef NAME\n" per kernel. Fills segs
 * (malloc'd) with each kernel, its symbol ALIAS_<hash of the batch>; the count, or -1 when src is
 * not a well-formed batch. */
static int split_batch(const char *src, uint64_t h, Seg **segs) {
  int n = 0, cap = 0;
  Seg *v = NULL;
  const char *p = src;
  while (strncmp(p, "#define ", 8) == 0) {
    p += 8;
    size_t nl = strcspn(p, " \n");
    if (p[nl] != ' ' || nl == 0 || nl >= 100) goto bad;
    const char *alias = p + nl + 1;
    size_t al = strcspn(alias, "\n");
    if (alias[al] != '\n' || al == 0 || al >= 150) goto bad;
    const char *ir = alias + al + 1;
    char undef[128];
    snprintf(undef, sizeof undef, "#undef %.*s\n", (int)nl, p);
    const char *end = strstr(ir, undef);
    if (!end) goto bad;
    if (n == cap) cap = cap ? cap * 2 : 16, v = tg_xrealloc(v, sizeof(Seg) * (size_t)cap);
    snprintf(v[n].name, sizeof v[n].name, "%.*s", (int)nl, p);
    snprintf(v[n].sym, sizeof v[n].sym, "%.*s_%016llx", (int)al, alias, (unsigned long long)h);
    v[n].ir = ir;
    v[n].irlen = (size_t)(end - ir);
    n++;
    p = end + strlen(undef);
  }
  if (n == 0 || *p) goto bad;
  *segs = v;
  return n;
bad:
  free(v);
  return -1;
}

/* IR text -> optimized module -> object (or assembly) bytes. *lib is malloc'd. A batch of kernels
 * is linked into one module and becomes one object: the code generator's and the JIT's fixed costs
 * per object (about a millisecond) are paid once for all of them. */
static tg_status llvm_build(void *vctx, const char *src, uint8_t **lib, size_t *liblen) {
  BuildCtx *bc = vctx;
  LlvmState *s = bc->s;
  double t0 = now_seconds();
  uint64_t h = hash_bytes(src, strlen(src), hash_bytes(s->id, strlen(s->id), 0x74676c6cULL));
  bool batch = strncmp(src, "#define ", 8) == 0;
  Seg one, *segs = &one;
  int nseg = 1;
  if (batch) {
    nseg = split_batch(src, h, &segs);
    if (nseg < 0) return tg_set_error(TG_ERR_COMPILE, "compile failed: a CPU:LLVM batch of kernels is malformed");
  } else {
    ir_kernel_name(src, one.name, sizeof one.name);
    snprintf(one.sym, sizeof one.sym, "%s_%016llx", one.name, (unsigned long long)h);
    one.ir = src;
    one.irlen = strlen(src);
  }
  char what[200];
  if (batch) snprintf(what, sizeof what, "a batch of %d kernels (%s, ...)", nseg, segs[0].name);
  else snprintf(what, sizeof what, "%s", one.name);
  Ref ctx = L.LLVMContextCreate();
  Ref mod = NULL, tm = NULL, dl = NULL;
  tg_status st = TG_OK;
  char *err = NULL;
  Ref target = NULL;
  if (L.LLVMGetTargetFromTriple(s->triple, &target, &err)) {
    st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s': no target %s: %s", what, s->triple, err ? err : "?");
    if (err) L.LLVMDisposeMessage(err);
    goto done;
  }
  tm = tm_take(s, target);
  if (!tm) {
    st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s': no target machine for %s %s", what, s->triple, s->cpu);
    goto done;
  }
  dl = L.LLVMCreateTargetDataLayout(tm);
  for (int i = 0; i < nseg && st == TG_OK; i++) {
    Ref buf = L.LLVMCreateMemoryBufferWithMemoryRangeCopy(segs[i].ir, segs[i].irlen, segs[i].name);
    Ref m = NULL;
    char *msg = NULL;
    if (L.LLVMParseIRInContext(ctx, buf, &m, &msg)) { /* takes buf */
      st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s' (LLVM IR): %s", segs[i].name, msg ? msg : "?");
      if (msg) L.LLVMDisposeMessage(msg);
      break;
    }
    /* the kernel's symbol: its name and a hash of its source and target (unique in the JIT) */
    Ref fn = L.LLVMGetNamedFunction(m, segs[i].name);
    if (!fn) {
      st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s': the module defines no @%s", segs[i].name, segs[i].name);
      L.LLVMDisposeModule(m);
      break;
    }
    L.LLVMSetValueName2(fn, segs[i].sym, strlen(segs[i].sym));
    L.LLVMSetTarget(m, s->triple);
    L.LLVMSetModuleDataLayout(m, dl);
    const char *nl = memchr(segs[i].ir, '\n', segs[i].irlen);
    bool lv = has_mark(nl, segs[i].ir + segs[i].irlen, LLVM_LOOP_VECTORIZE_MARK);
    const char *pre = lv ? LLVM_LV_PASSES : has_mark(nl, segs[i].ir + segs[i].irlen, LLVM_SHORT_LOOPS_MARK) ? LLVM_SHORT_LOOP_PASSES : NULL;
    if (pre) {
      Ref vo = L.LLVMCreatePassBuilderOptions();
      Ref verr = L.LLVMRunPasses(m, pre, tm, vo);
      L.LLVMDisposePassBuilderOptions(vo);
      if (verr) {
        char *why = take_error(verr);
        st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s' (LLVM %s): %s", segs[i].name,
                          lv ? "loop vectorizer" : "short-loop unrolling", why);
        free(why);
        L.LLVMDisposeModule(m);
        break;
      }
    }
    if (!mod) mod = m;
    else if (L.LLVMLinkModules2(mod, m)) /* takes m; internal names that clash are renamed */
      st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s': LLVM cannot link it into its batch", segs[i].name);
  }
  if (st != TG_OK) goto done;
  double t1 = now_seconds();
  Ref opts = L.LLVMCreatePassBuilderOptions();
  /* the renderer vectorizes explicitly (as with gcc, whose loop vectorizer is off for the C kernels) */
  L.LLVMPassBuilderOptionsSetLoopVectorization(opts, 0);
  Ref perr = L.LLVMRunPasses(mod, s->passes, tm, opts);
  L.LLVMDisposePassBuilderOptions(opts);
  if (perr) {
    char *m = take_error(perr);
    st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s' (LLVM passes): %s", what, m);
    free(m);
    goto done;
  }
  double t2 = now_seconds();
  Ref out = NULL;
  if (L.LLVMTargetMachineEmitToMemoryBuffer(tm, mod, bc->filetype, &err, &out)) {
    st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s' (LLVM code generation): %s", what, err ? err : "?");
    if (err) L.LLVMDisposeMessage(err);
    goto done;
  }
  size_t n = L.LLVMGetBufferSize(out);
  if (bc->filetype == 0) {
    *lib = tg_xmalloc(n + 1);
    memcpy(*lib, L.LLVMGetBufferStart(out), n);
    (*lib)[n] = 0;
    *liblen = n;
  } else if (batch) {
    /* "TGLB", the batch's hash (which names its symbols), the object */
    *liblen = 12 + n;
    *lib = tg_xmalloc(*liblen);
    memcpy(*lib, "TGLB", 4);
    memcpy(*lib + 4, &h, 8);
    memcpy(*lib + 12, L.LLVMGetBufferStart(out), n);
  } else {
    /* "TGLL", the symbol's length, the symbol, the object */
    size_t sl = strlen(one.sym);
    uint32_t sl32 = (uint32_t)sl;
    *liblen = 8 + sl + n;
    *lib = tg_xmalloc(*liblen);
    memcpy(*lib, "TGLL", 4);
    memcpy(*lib + 4, &sl32, 4);
    memcpy(*lib + 8, one.sym, sl);
    memcpy(*lib + 8 + sl, L.LLVMGetBufferStart(out), n);
  }
  L.LLVMDisposeMemoryBuffer(out);
  if (debug_level() >= 3)
    fprintf(stderr, "CPU:LLVM: compiled %s in %.1f ms (parse %.1f, passes %.1f, codegen %.1f; %zu bytes of IR, %zu of %s)\n",
            what, (now_seconds() - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (now_seconds() - t2) * 1e3, strlen(src), n,
            bc->filetype ? "object" : "assembly");
done:
  if (dl) L.LLVMDisposeTargetData(dl);
  if (tm) tm_put(s, tm);
  if (mod) L.LLVMDisposeModule(mod);
  L.LLVMContextDispose(ctx);
  if (segs != &one) free(segs);
  return st;
}

static tg_status llvm_compile(void *state, const char *src, uint8_t **lib, size_t *liblen) {
  BuildCtx bc = {state, 1};
  return disk_cache_compile(((LlvmState *)state)->id, src, llvm_build, &bc, lib, liblen);
}

static void llvm_cache_evict(void *state, const char *src) { disk_cache_evict(((LlvmState *)state)->id, src); }

/* DEBUG=7: the target machine's assembly of the kernel (compiled again, not cached). */
static char *llvm_disasm(void *state, const char *src, const uint8_t *lib, size_t liblen) {
  (void)lib, (void)liblen;
  BuildCtx bc = {state, 0};
  uint8_t *s = NULL;
  size_t n = 0;
  if (llvm_build(&bc, src, &s, &n) != TG_OK) return NULL;
  return (char *)s;
}

/* ---------------------------------------------------------------------------------------------- */
/* load, exec                                                                                      */

/* Drops one program's hold on its batch object; the last one removes it from the JIT. */
static void batch_release(BatchObj *b) {
  pthread_mutex_lock(&g_batch_lock);
  bool last = --b->refs == 0;
  if (last)
    for (BatchObj **pp = &g_batches; *pp; pp = &(*pp)->next)
      if (*pp == b) {
        *pp = b->next;
        break;
      }
  pthread_mutex_unlock(&g_batch_lock);
  if (!last) return;
  Ref err = L.LLVMOrcResourceTrackerRemove(b->rt);
  if (err) free(take_error(err));
  L.LLVMOrcReleaseResourceTracker(b->rt);
  free(b);
  /* the JIT interns every symbol name it ever saw; names of removed objects stay in its pool until
   * it is swept (a program that keeps making new kernels grew by ~60 bytes a kernel): every 64
   * removals */
  static _Atomic unsigned removed;
  if (atomic_fetch_add(&removed, 1) % 64 == 63)
    L.LLVMOrcSymbolStringPoolClearDeadEntries(L.LLVMOrcExecutionSessionGetSymbolStringPool(L.LLVMOrcLLJITGetExecutionSession(g_jit)));
}

/* Adds an object to the JIT under a new tracker; NULL + *why on failure. (Its symbols resolve at
 * the first lookup, where a broken object shows.) */
static Ref add_object(const uint8_t *obj, size_t olen, char **why) {
  Ref buf = L.LLVMCreateMemoryBufferWithMemoryRangeCopy((const char *)obj, olen, "tg-kernels");
  Ref rt = L.LLVMOrcJITDylibCreateResourceTracker(g_jd);
  Ref err = L.LLVMOrcLLJITAddObjectFileWithRT(g_jit, rt, buf); /* takes buf */
  if (err) {
    *why = take_error(err);
    Ref e2 = L.LLVMOrcResourceTrackerRemove(rt);
    if (e2) free(take_error(e2));
    L.LLVMOrcReleaseResourceTracker(rt);
    return NULL;
  }
  return rt;
}

/* A kernel in a shared object: the object (keyed by key) goes into the JIT with the first of its
 * kernels to load and stays while any of them is loaded. A batch object holds many kernels; a single
 * kernel's object is shared too, by the CPU devices that load it (CPU:LLVM and CPU:1:LLVM load the
 * same kernel, whose symbol a second copy in the JIT would define twice). */
static void *load_shared(const char *fname, uint64_t key, const uint8_t *obj, size_t olen, const char *sym) {
  pthread_mutex_lock(&g_batch_lock);
  BatchObj *b = g_batches;
  while (b && b->hash != key) b = b->next;
  char *why = NULL;
  if (!b) {
    Ref rt = add_object(obj, olen, &why);
    if (rt) {
      b = tg_xcalloc(1, sizeof *b);
      b->hash = key, b->rt = rt, b->next = g_batches;
      g_batches = b;
    }
  }
  if (b) b->refs++; /* held across the lookup */
  pthread_mutex_unlock(&g_batch_lock);
  uint64_t addr = 0;
  if (b) {
    Ref err = L.LLVMOrcLLJITLookup(g_jit, &addr, sym);
    if (err) why = take_error(err);
    else if (!addr) why = tg_xstrdup("address 0");
  }
  if (why) {
    tg_set_error(TG_ERR_RUNTIME, "cannot load kernel '%s': %s", fname, why);
    free(why);
    if (b) batch_release(b);
    return NULL;
  }
  LlvmProgram *p = tg_xcalloc(1, sizeof *p);
  *(void **)&p->fn = (void *)(uintptr_t)addr;
  p->batch = b;
  return p;
}

static void *llvm_load(void *state, const char *fname, const uint8_t *lib, size_t liblen) {
  (void)state;
  if (fname && lib && liblen > 12 && memcmp(lib, "TGLB", 4) == 0 && strlen(fname) < 200) {
    uint64_t h;
    memcpy(&h, lib + 4, 8);
    char sym[256];
    snprintf(sym, sizeof sym, "%s_%016llx", fname, (unsigned long long)h);
    return load_shared(fname, h, lib + 12, liblen - 12, sym);
  }
  uint32_t sl = 0;
  if (!fname || !lib || liblen < 8 || memcmp(lib, "TGLL", 4) != 0 || (memcpy(&sl, lib + 4, 4), sl == 0) || sl > 512 ||
      8 + (size_t)sl >= liblen) {
    tg_set_error(TG_ERR_RUNTIME, "cannot load kernel '%s': not a CPU:LLVM kernel object", fname ? fname : "?");
    return NULL;
  }
  char sym[520];
  memcpy(sym, lib + 8, sl);
  sym[sl] = '\0';
  return load_shared(fname, hash_bytes(lib, liblen, 0x4c4c4f424a), lib + 8 + sl, liblen - 8 - sl, sym);
}

static void llvm_unload(void *state, void *prg) {
  (void)state;
  LlvmProgram *p = prg;
  if (!p) return;
  batch_release(p->batch);
  free(p);
}

static double llvm_exec(void *state, void *prg, void **bufs, int nbufs, int nvals, const int64_t *global_size,
                        const int64_t *local_size, bool wait) {
  (void)state, (void)nbufs, (void)nvals; /* (the kernel reads its variables from bufs itself) */
  const LlvmProgram *p = prg;
  if (!p) {
    tg_set_error(TG_ERR_INVALID, "exec: no program");
    return -1.0;
  }
  return tp_run_kernel(p->fn, bufs, global_size, local_size, wait);
}

/* Does the arch string turn feature f off ("-avx512f")? */
static bool turned_off(const LlvmState *s, const char *f) { return feature_is(s->features, '-', f, strlen(f)); }

static void llvm_caps(void *state, DeviceCaps *c) {
  LlvmState *s = state;
  /* the host's registers, less what the arch string turns off (an arch can only name features the
   * host has); a CPU name alone is taken to keep the host's vector width */
  cpu_host_simd(&c->vec_bytes, &c->vec_regs);
  cpu_host_caches(&c->l1d_bytes, &c->l2_bytes, &c->l3_bytes);
  if (c->vec_bytes > 32 && turned_off(s, "avx512f")) c->vec_bytes = 32, c->vec_regs = 16;
  if (c->vec_bytes > 16 && (turned_off(s, "avx2") || turned_off(s, "avx"))) c->vec_bytes = 16, c->vec_regs = 16;
  /* F16C where the host has it and the arch string neither turns it off nor names another CPU
   * (whose features this side does not know) without naming +f16c */
  c->f16c = host_has("f16c", 4) && !turned_off(s, "f16c") &&
            (!strcmp(s->cpu, g_host_cpu) || feature_is(s->features, '+', "f16c", 4));
  c->lang = LANG_LLVM;
  c->gpu = false;
  c->fp16 = c->fp64 = true;
  c->max_dims = 1;
}

static void llvm_describe(void *state) {
  LlvmState *s = state;
  fprintf(stderr, "CPU:LLVM: %s, cpu %s, in-process LLVM (%s)\n", s->triple, s->cpu, LLVM_LIBRARY);
}

/* Memory is the CPU device's (host memory). */
static tg_status llvm_copy(void *state, void *dst, const void *src, size_t nbytes) {
  (void)state;
  if (nbytes) memmove(dst, src, nbytes);
  return TG_OK;
}
static void llvm_synchronize(void *state) { (void)state; }
static void *llvm_alloc(void *state, size_t nbytes) { return cpu_device_vt.alloc(state, nbytes); }
static void llvm_free(void *state, void *ptr, size_t nbytes) { cpu_device_vt.free(state, ptr, nbytes); }

const DeviceVT llvm_device_vt = {
    .name = "LLVM",
    .open = llvm_open,
    .open_arch = llvm_open_arch,
    .close = llvm_close,
    .alloc = llvm_alloc,
    .free = llvm_free,
    .copyin = llvm_copy,
    .copyout = llvm_copy,
    .copy = llvm_copy,
    .compile = llvm_compile,
    .load = llvm_load,
    .unload = llvm_unload,
    .exec = llvm_exec,
    .synchronize = llvm_synchronize,
    .compiler_id = llvm_compiler_id,
    .caps = llvm_caps,
    .describe = llvm_describe,
    .cache_evict = llvm_cache_evict,
    .disasm = llvm_disasm,
};
