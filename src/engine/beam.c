/*
 * beam.c -- BEAM=n: choose a kernel's optimizations by timing them.
 *
 * In: a kernel AST, the device and the real buffers of the launch. Out: the OptCfg that ran fastest.
 * The search is a beam over four rounds of actions (vectorize an axis, upcast an axis, upcast the
 * vector axis, swap loop order); each round extends the n best configurations so far by one action,
 * compiles all candidates in parallel on every core, times them on the real inputs with a scratch
 * output, and drops candidates that fail to compile or whose output differs from the unoptimized
 * kernel's. It stops when a round brings no gain. The choice is cached in memory and on disk
 * (keyed by the unoptimized kernel's source, the device and n), so a second run searches nothing.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../codegen/codegen.h"
#include "../runtime/device.h"
#include "../uop/ptrmap.h"

typedef struct {
  OptCfg cfg;
  KernelCode *kc;
  Program *prg;
  double t;
} Cand;

typedef struct {
  Cand *c;
  int n;
  int next;
  Device *dev;
  CtxCopy *ctx; /* the searching thread's Context (CC, DEBUG, ...) */
} CandJobs;

static void *cand_compile(void *arg) {
  CandJobs *j = arg;
  ctx_enter(j->ctx);
  for (;;) {
    int i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
    if (i >= j->n) break;
    j->c[i].prg = program_get(j->dev, j->c[i].kc->name, j->c[i].kc->src);
    if (!j->c[i].prg) tg_clear_error(); /* a candidate that does not compile is dropped */
  }
  ctx_leave(j->ctx);
  return NULL;
}

static void compile_all(Cand *c, int n, Device *dev) {
  CandJobs j = {c, n, 0, dev, ctx_copy()};
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = (int)(ncpu < 1 ? 1 : ncpu > 16 ? 16 : ncpu);
  pthread_t th[16];
  int started = 0;
  for (int t = 1; t < nt && t < n; t++)
    if (pthread_create(&th[started], NULL, cand_compile, &j) == 0) started++;
  cand_compile(&j);
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  ctx_copy_free(j.ctx);
}

/* ---- on-disk choice cache ---- */
static char *beam_dir(void) {
  if (getenv_int("DISABLE_COMPILER_CACHE", 0)) return NULL;
  const char *base = getenv_str("TINYGRAD_CACHE_DIR", NULL);
  SB b;
  sb_init(&b);
  if (base && *base) sb_printf(&b, "%s", base);
  else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME")) sb_printf(&b, "%s/tinygrad.c", getenv("XDG_CACHE_HOME"));
  else if (getenv("HOME")) sb_printf(&b, "%s/.cache/tinygrad.c", getenv("HOME"));
  else {
    sb_free(&b);
    return NULL;
  }
  mkdir(b.s, 0755);
  sb_puts(&b, "/beam");
  if (mkdir(b.s, 0755) != 0 && errno != EEXIST) {
    sb_free(&b);
    return NULL;
  }
  return sb_take(&b);
}


/* Reads the first line of the cached choice for key hash h (file <dir>/<h><ext>); path gets the
 * file's name either way so a fresh choice can be stored there. */
static bool cache_read(const char *dir, uint64_t h, const char *ext, char *path, size_t psz, char *line, int lsz) {
  snprintf(path, psz, "%s/%016llx%s", dir, (unsigned long long)h, ext);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  bool got = fgets(line, lsz, f) != NULL;
  fclose(f);
  return got;
}

/* Writes through a per-process temporary file and renames it, so concurrent searches never leave
 * a half-written choice behind. */
static void cache_write(const char *path, const char *line) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (f) {
    fprintf(f, "%s\n", line);
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
  }
}


static PtrMap mem_cache; /* key hash -> OptCfg* */
static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- timing ---- */
static bool outputs_match(const unsigned char *a, const unsigned char *b, size_t nbytes, tg_dtype dt) {
  if (dt != TG_FLOAT32 && dt != TG_FLOAT64) return memcmp(a, b, nbytes) == 0;
  size_t isz = tg_dtype_itemsize(dt);
  for (size_t i = 0; i < nbytes / isz; i++) {
    double x = dtype_load(dt, a + i * isz), y = dtype_load(dt, b + i * isz);
    if (isnan(x) && isnan(y)) continue;
    if (!(fabs(x - y) <= 1e-3 * (1 + fabs(y)))) return false;
  }
  return true;
}

typedef struct {
  void **bufs;
  int nbufs;
  Buffer *scratch;
  const unsigned char *orig; /* output contents before the launch (in-place kernels read them) */
  unsigned char *ref;        /* unoptimized kernel's output */
  unsigned char *got;
  size_t nbytes;
  tg_dtype odt;
} Bench;

static double time_one(Bench *b, Cand *c, double best) {
  if (!c->prg) return INFINITY;
  double t = INFINITY;
  for (int rep = 0; rep < 3; rep++) {
    if (b->orig && buffer_copyin(b->scratch, b->orig, b->nbytes) != TG_OK) return INFINITY;
    double r = program_exec(c->prg, b->bufs, b->nbufs, c->kc->global_size, c->kc->local_size, true);
    if (r < 0) {
      tg_clear_error();
      return INFINITY;
    }
    if (r < t) t = r;
    if (rep == 0) {
      if (b->ref) {
        if (buffer_copyout(b->scratch, b->got, b->nbytes) != TG_OK || !outputs_match(b->got, b->ref, b->nbytes, b->odt)) {
          if (debug_level() >= 3) fprintf(stderr, "BEAM: dropped %s (%s): output differs\n", c->kc->name, "wrong result");
          return INFINITY;
        }
      }
      if (r > 4 * best || r > 0.05) break;
    }
  }
  return t;
}

/* Benchmark setup: the real inputs, a scratch output initialised like the real one (orig keeps the
 * output's contents). Returns false when the scratch cannot be made or read. */
static bool bench_init(Bench *b, unsigned char **orig, UOp *ast, Device *dev, Buffer **bufs, int nbufs) {
  *b = (Bench){0};
  b->nbufs = nbufs;
  b->bufs = tg_xmalloc(sizeof(void *) * (size_t)nbufs);
  b->nbytes = bufs[0]->nbytes;
  b->odt = (tg_dtype)ast->src[0]->dtype;
  b->scratch = buffer_new_like(dev, b->nbytes, bufs[0]->img_w, bufs[0]->img_h);
  *orig = tg_xmalloc(b->nbytes + 1);
  b->ref = tg_xmalloc(b->nbytes + 1);
  b->got = tg_xmalloc(b->nbytes + 1);
  bool ok = b->scratch && buffer_copyout(bufs[0], *orig, b->nbytes) == TG_OK;
  b->orig = *orig;
  for (int i = 0; i < nbufs; i++) b->bufs[i] = bufs[i]->ptr;
  if (ok) b->bufs[0] = b->scratch->ptr;
  return ok;
}

/* Times the reference (unoptimized) candidate without checking it, and keeps its output as the
 * one every other candidate must match. */
static bool bench_ref(Bench *b, Cand *ref, Device *dev) {
  compile_all(ref, 1, dev);
  unsigned char *keep = b->ref;
  b->ref = NULL;
  ref->t = time_one(b, ref, INFINITY);
  b->ref = keep;
  return isfinite(ref->t) && buffer_copyout(b->scratch, b->ref, b->nbytes) == TG_OK;
}

static void bench_free(Bench *b, unsigned char *orig) {
  if (b->scratch) buffer_unref(b->scratch);
  free(orig), free(b->ref), free(b->got), free(b->bufs);
}

static int cand_cmp(const void *x, const void *y) {
  const Cand *a = x, *b = y;
  return a->t < b->t ? -1 : a->t > b->t;
}

static bool cfg_eq(const OptCfg *a, const OptCfg *b) { return memcmp(a, b, sizeof *a) == 0; }

static void add_cand(Cand **cs, int *n, int *cap, OptCfg c) {
  for (int i = 0; i < *n; i++)
    if (cfg_eq(&(*cs)[i].cfg, &c)) return;
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 32;
    *cs = tg_xrealloc(*cs, sizeof(Cand) * (size_t)*cap);
  }
  (*cs)[*n].cfg = c;
  (*cs)[*n].kc = NULL;
  (*cs)[*n].prg = NULL;
  (*cs)[(*n)++].t = INFINITY;
}

/* Extends cfg by one action of the given round. */
static void actions(const OptCfg *base, int round, const int64_t *gs, int ng, const int64_t *rs, int nr, bool red, Cand **cs,
                    int *n, int *cap) {
  add_cand(cs, n, cap, *base);
  OptCfg c;
  switch (round) {
  case 0:
    for (int g = 0; g < ng; g++)
      for (int W = 16; W >= 4; W /= 2)
        if (gs[g] % W == 0) c = *base, c.vaxis = g, c.vw = W, add_cand(cs, n, cap, c);
    for (int ri = 0; ri < nr; ri++)
      for (int W = 16; W >= 4; W /= 2)
        if (rs[ri] % W == 0) c = *base, c.raxis = ri, c.rw = W, add_cand(cs, n, cap, c);
    break;
  case 1:
    for (int g = 0; g < ng; g++)
      for (int f = 2; f <= 8; f *= 2) {
        /* a factor that does not divide the axis pads it (PADTO, reductions only, at most +25%) */
        int64_t padded = (gs[g] + f - 1) / f * f;
        bool fits = gs[g] % f == 0 || (red && gs[g] > f && (padded - gs[g]) * 4 <= gs[g]);
        if (g == base->vaxis || !fits || (!red && f > 4)) continue;
        c = *base, c.uaxis = g, c.ufac = f, add_cand(cs, n, cap, c);
        /* a second upcast axis: 2-D register tiles */
        for (int g2 = 0; g2 < ng && red && f <= 4; g2++)
          if (g2 != g && g2 != base->vaxis && gs[g2] % 4 == 0) {
            OptCfg c2 = c;
            c2.uaxis2 = g2, c2.ufac2 = 4;
            add_cand(cs, n, cap, c2);
          }
      }
    break;
  case 2:
    if (base->vaxis >= 0)
      for (int f = 2; f <= 4; f *= 2) c = *base, c.vfac = f, add_cand(cs, n, cap, c);
    for (int ri = 0; ri < nr; ri++) /* UNROLL a reduce axis */
      for (int f = 2; f <= 4; f *= 2)
        if (rs[ri] % f == 0 && rs[ri] / f >= 2) c = *base, c.raxis2 = ri, c.rufac = f, add_cand(cs, n, cap, c);
    break;
  case 3:
    for (int sw = 1; sw <= 2; sw++)
      if (base->vaxis > sw - 1) c = *base, c.swap = sw, add_cand(cs, n, cap, c);
    break;
  }
}

static void free_cands(Cand *cs, int n) {
  for (int i = 0; i < n; i++) {
    kernel_code_free(cs[i].kc);
    program_release(cs[i].prg); /* a candidate's program may be unloaded once the cache is full */
  }
}

bool beam_search(UOp *ast, Device *dev, Buffer **bufs, int nbufs, int beam, OptCfg *out) {
  /* key: the unoptimized source identifies the computation */
  OptCfg none = OPTCFG_NONE;
  KernelCode *base = codegen_for(ast, &dev->caps, &none);
  if (!base) return false;
  SB key;
  sb_init(&key);
  sb_printf(&key, "%s|%s|%d", dev->vt->name, base->src, beam);
  uint64_t h = hash_bytes(key.s, key.len, 0x6265616d);
  sb_free(&key);
  pthread_mutex_lock(&mem_lock);
  OptCfg *mc = pm_get(&mem_cache, h);
  pthread_mutex_unlock(&mem_lock);
  if (mc) {
    *out = *mc;
    kernel_code_free(base);
    return true;
  }
  char *dir = beam_dir();
  char path[4096] = {0};
  char line[256];
  if (dir && cache_read(dir, h, ".txt", path, sizeof path, line, sizeof line) && optcfg_parse(line, out)) {
    free(dir);
    kernel_code_free(base);
    pthread_mutex_lock(&mem_lock);
    OptCfg *c = tg_xmalloc(sizeof *c);
    *c = *out;
    pm_put(&mem_cache, h, c);
    pthread_mutex_unlock(&mem_lock);
    return true;
  }
  double t0 = now_seconds();
  int64_t gs[64], rs[64];
  bool red = false;
  int ng = kernel_global_sizes(ast, gs, 64, &red);
  if (ng > 64) ng = 64;
  int nr = kernel_reduce_sizes(ast, rs, 64);
  if (nr > 64) nr = 64;
  /* benchmark setup: real inputs, a scratch output initialised like the real one */
  Bench b;
  unsigned char *orig;
  bool ok = bench_init(&b, &orig, ast, dev, bufs, nbufs);
  /* reference output from the unoptimized kernel */
  Cand ref = {none, base, NULL, INFINITY};
  if (ok) ok = bench_ref(&b, &ref, dev);
  OptCfg best = none;
  double best_t = ref.t;
  Cand *front = tg_xmalloc(sizeof(Cand) * (size_t)(beam + 2));
  int nfront = 1;
  front[0] = (Cand){none, NULL, NULL, ref.t};
  /* the hand-coded heuristics' choice competes too, and seeds the beam: the search never ends worse
   * than BEAM=0 */
  bool had_error = tg_last_error() != NULL;
  KernelCode *hk = ok ? codegen_for(ast, &dev->caps, NULL) : NULL;
  if (hk) {
    Cand hc = {hk->cfg, codegen_for(ast, &dev->caps, &hk->cfg), NULL, INFINITY};
    kernel_code_free(hk);
    if (hc.kc) {
      compile_all(&hc, 1, dev);
      hc.t = time_one(&b, &hc, INFINITY);
      if (isfinite(hc.t)) {
        front[nfront++] = (Cand){hc.cfg, NULL, NULL, hc.t};
        if (hc.t < best_t) best = hc.cfg, best_t = hc.t;
      }
      free_cands(&hc, 1);
    }
  } else if (!had_error) {
    tg_clear_error(); /* a kernel the heuristics cannot lower is simply not a candidate */
  }
  for (int round = 0; ok && round < 4; round++) {
    Cand *cs = NULL;
    int n = 0, cap = 0;
    for (int f = 0; f < nfront; f++) actions(&front[f].cfg, round, gs, ng, rs, nr, red, &cs, &n, &cap);
    for (int i = 0; i < n; i++) cs[i].kc = codegen_for(ast, &dev->caps, &cs[i].cfg);
    int m = 0; /* keep those that apply */
    for (int i = 0; i < n; i++)
      if (cs[i].kc) cs[m++] = cs[i];
    n = m;
    compile_all(cs, n, dev);
    for (int i = 0; i < n; i++) cs[i].t = time_one(&b, &cs[i], best_t);
    qsort(cs, (size_t)n, sizeof(Cand), cand_cmp);
    double prev = best_t;
    if (n && cs[0].t < best_t) best = cs[0].cfg, best_t = cs[0].t;
    nfront = 0;
    for (int i = 0; i < n && nfront < beam; i++)
      if (isfinite(cs[i].t)) front[nfront++] = (Cand){cs[i].cfg, NULL, NULL, cs[i].t};
    if (debug_level() >= 1 || now_seconds() - t0 > 2.0)
      fprintf(stderr, "BEAM %d: %-28s round %d/4: %3d candidates, best %9.2f us (unoptimized %9.2f us)\n", beam, base->name,
              round + 1, n, best_t * 1e6, ref.t * 1e6);
    free_cands(cs, n);
    free(cs);
    if (nfront == 0 || (round >= 1 && best_t >= prev)) break;
  }
  free(front);
  program_release(ref.prg);
  bench_free(&b, orig);
  kernel_code_free(base);
  if (!ok) {
    free(dir);
    return false;
  }
  *out = best;
  pthread_mutex_lock(&mem_lock);
  OptCfg *c = tg_xmalloc(sizeof *c);
  *c = best;
  pm_put(&mem_cache, h, c);
  pthread_mutex_unlock(&mem_lock);
  if (dir) {
    optcfg_format(&best, line, 160);
    cache_write(path, line);
    free(dir);
  }
  return true;
}

/* ---- GPU devices: the same search over Opt lists ---- */

typedef struct {
  OptList l;
  KernelCode *kc;
  Program *prg;
  double t;
} GCand;

static void add_gcand(GCand **cs, int *n, int *cap, const OptList *l) {
  char a[256], b[256];
  optlist_format(l, a, sizeof a);
  for (int i = 0; i < *n; i++) {
    optlist_format(&(*cs)[i].l, b, sizeof b);
    if (strcmp(a, b) == 0) return;
  }
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 32;
    *cs = tg_xrealloc(*cs, sizeof(GCand) * (size_t)*cap);
  }
  (*cs)[(*n)++] = (GCand){*l, NULL, NULL, INFINITY};
}

/* Every list that extends base by one action: GROUP/GROUPTOP of a reduce axis, LOCAL or UPCAST of
 * a global axis, UNROLL of a reduce axis (codegen drops those that do not fit). */
static void gpu_actions(const OptList *base, const int64_t *gs, int ng, const int64_t *rs, int nr, GCand **cs, int *n, int *cap) {
  add_gcand(cs, n, cap, base);
  if (base->n >= OPTLIST_MAX) return;
  OptList c;
#define EXTEND(OP, AX, ARG) (c = *base, c.o[c.n++] = (Opt){OP, AX, ARG}, add_gcand(cs, n, cap, &c))
  for (int r = 0; r < nr; r++)
    for (int g = 16; g <= 256; g *= 2)
      if (rs[r] >= 2 * g) EXTEND(OPT_GROUP, r, g), EXTEND(OPT_GROUPTOP, r, g);
  for (int a = 0; a < ng; a++)
    for (int l = 2; l <= 32; l *= 2)
      if (gs[a] % l == 0) EXTEND(OPT_LOCAL, a, l);
  /* (UPCAST 4, 8 and 16 of an axis the output is contiguous on are vectors in OpenCL C) */
  for (int a = 0; a < ng; a++)
    for (int f = 2; f <= 16; f *= 2)
      if (gs[a] % f == 0) EXTEND(OPT_UPCAST, a, f);
  for (int r = 0; r < nr; r++)
    for (int f = 2; f <= 4; f *= 2)
      if (rs[r] % f == 0 && rs[r] / f >= 2) EXTEND(OPT_UNROLL, r, f);
#undef EXTEND
}

/* BEAM on a GPU device: rounds of one more action each, timed by the device's events on the real
 * inputs, checked against the list-less kernel's output. Cached like the CPU's choice, keyed by
 * the device's identity (platform, device, driver). */
bool beam_search_gpu(UOp *ast, Device *dev, Buffer **bufs, int nbufs, int beam, OptList *out) {
  OptList none = {.n = 0};
  KernelCode *base = codegen_gpu(ast, &dev->caps, &none);
  if (!base) return false;
  SB key;
  sb_init(&key);
  sb_printf(&key, "gpu|%s|%s|%s|%d", dev->vt->name, dev->vt->compiler_id(dev->state), base->src, beam);
  uint64_t h = hash_bytes(key.s, key.len, 0x6265616d);
  sb_free(&key);
  char *dir = beam_dir();
  char path[4096] = {0};
  char line[512];
  if (dir && cache_read(dir, h, ".opts", path, sizeof path, line, sizeof line)) {
    line[strcspn(line, "\n")] = 0;
    if (optlist_parse(line, out)) {
      free(dir);
      kernel_code_free(base);
      return true;
    }
  }
  /* loop sizes of the kernel as lowered for the GPU (no actions) */
  int64_t gs[64], rs[64];
  LKernel *lk = lower_kernel_for(ast, NULL, &dev->caps, &none);
  int ng = lk->ng < 64 ? lk->ng : 64, nr = lk->nr < 64 ? lk->nr : 64;
  for (int i = 0; i < ng; i++) gs[i] = lk->granges[i]->iarg[0];
  for (int i = 0; i < nr; i++) rs[i] = lk->rranges[i]->iarg[0];
  lkernel_free(lk);
  Bench b;
  unsigned char *orig;
  bool ok = bench_init(&b, &orig, ast, dev, bufs, nbufs);
  Cand ref = {OPTCFG_NONE, base, NULL, INFINITY};
  if (ok) ok = bench_ref(&b, &ref, dev);
  OptList best = none;
  double best_t = ref.t;
  GCand *front = tg_xmalloc(sizeof(GCand) * (size_t)(beam + 1));
  int nfront = 1;
  front[0] = (GCand){none, NULL, NULL, ref.t};
  for (int round = 0; ok && round < 3; round++) {
    GCand *cs = NULL;
    int n = 0, cap = 0;
    for (int f = 0; f < nfront; f++) gpu_actions(&front[f].l, gs, ng, rs, nr, &cs, &n, &cap);
    int m = 0;
    for (int i = 0; i < n; i++)
      if ((cs[i].kc = codegen_gpu(ast, &dev->caps, &cs[i].l))) cs[m++] = cs[i];
    n = m;
    /* compile and time through the CPU candidates' machinery */
    Cand *cc = tg_xcalloc((size_t)(n ? n : 1), sizeof(Cand));
    for (int i = 0; i < n; i++) cc[i] = (Cand){OPTCFG_NONE, cs[i].kc, NULL, INFINITY};
    compile_all(cc, n, dev);
    for (int i = 0; i < n; i++) cs[i].t = time_one(&b, &cc[i], best_t);
    free(cc);
    for (int i = 0; i < n; i++) kernel_code_free(cs[i].kc), cs[i].kc = NULL;
    /* sort by time (few candidates: insertion sort keeps this simple) */
    for (int i = 1; i < n; i++)
      for (int j = i; j > 0 && cs[j].t < cs[j - 1].t; j--) {
        GCand t = cs[j];
        cs[j] = cs[j - 1], cs[j - 1] = t;
      }
    double prev = best_t;
    if (n && cs[0].t < best_t) best = cs[0].l, best_t = cs[0].t;
    nfront = 0;
    for (int i = 0; i < n && nfront < beam; i++)
      if (isfinite(cs[i].t)) front[nfront++] = cs[i];
    if (debug_level() >= 1) {
      char bl[256];
      optlist_format(&best, bl, sizeof bl);
      fprintf(stderr, "BEAM %d: %-28s round %d/3: %3d candidates, best %9.2f us [%s] (no actions %9.2f us)\n", beam,
              base->name, round + 1, n, best_t * 1e6, bl, ref.t * 1e6);
    }
    free(cs);
    if (nfront == 0 || (round >= 1 && best_t >= prev)) break;
  }
  free(front);
  bench_free(&b, orig);
  kernel_code_free(base);
  if (!ok) {
    free(dir);
    tg_clear_error();
    return false;
  }
  *out = best;
  if (dir) {
    optlist_format(&best, line, 256);
    cache_write(path, line);
    free(dir);
  }
  return true;
}
