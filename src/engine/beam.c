/*
 * beam.c -- BEAM=n: choose a kernel's optimizations by timing them.
 *
 * In: a kernel AST, the device and the real buffers of the launch. Out: the Opt list that ran
 * fastest. The search is a beam over rounds of actions (on the CPU four: vector lanes, register
 * tiles, upcast of the vector axis or unroll, loop order or one thread; on GPU devices three rounds
 * of every action); each round extends the n best lists so far by one action,
 * compiles all candidates in parallel on every core, times them on the real inputs with a scratch
 * output, and drops candidates that fail to compile or whose output differs from the unoptimized
 * kernel's. It stops when a round brings no gain. The choice is cached in memory and on disk
 * (keyed by the unoptimized kernel's source, the device and n), so a second run searches nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../codegen/codegen.h"
#include "../runtime/device.h"
#include "../savefile.h"
#include "../uop/ptrmap.h"

typedef struct {
  OptList l;
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
  /* a regular file only: O_NONBLOCK so that a FIFO there cannot make the open wait for a writer */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st;
  FILE *f = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "r") : NULL;
  if (!f) {
    close(fd);
    return false;
  }
  bool got = fgets(line, lsz, f) != NULL;
  fclose(f);
  return got;
}

/* Writes through a per-process temporary file and renames it, so concurrent searches never leave
 * a half-written choice behind. */
static void cache_write(const char *path, const char *line) {
  char tmp[4200];
  static _Atomic unsigned counter;
  snprintf(tmp, sizeof tmp, "%s.%d.%u.tmp", path, (int)getpid(), atomic_fetch_add(&counter, 1));
  int fd = file_create_new(tmp, 0644); /* (a link planted at the temporary name is not followed) */
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f && fd >= 0) close(fd), unlink(tmp);
  if (f) {
    fprintf(f, "%s\n", line);
    /* (a rename that fails -- a directory at path -- must not leave the temporary file behind) */
    if (fclose(f) != 0 || rename(tmp, path) != 0) unlink(tmp);
  }
}


static PtrMap mem_cache; /* key hash -> OptList* */
static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- timing ---- */
static bool outputs_match(const unsigned char *a, const unsigned char *b, size_t nbytes, tg_dtype dt) {
  if (!tg_dtype_is_float(dt)) return memcmp(a, b, nbytes) == 0;
  /* another summation order rounds differently: a few steps of the dtype's precision (float16 has
   * 11 bits, bfloat16 8, fp8 3 or 2) */
  double tol = dt == TG_FLOAT32 || dt == TG_FLOAT64 ? 1e-3 : dt == TG_FLOAT16 ? 1e-2 : dt == TG_BFLOAT16 ? 4e-2 : 0.3;
  size_t isz = tg_dtype_itemsize(dt);
  for (size_t i = 0; i < nbytes / isz; i++) {
    double x = dtype_load(dt, a + i * isz), y = dtype_load(dt, b + i * isz);
    if (x == y || (isnan(x) && isnan(y))) continue; /* (inf == inf: inf - inf is NaN) */
    if (!(fabs(x - y) <= tol * (1 + fabs(y)))) return false;
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
    double r = program_exec(c->prg, b->bufs, b->nbufs, 0, c->kc->global_size, c->kc->local_size, true);
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

static void add_cand(Cand **cs, int *n, int *cap, const OptList *l) {
  char a[256], b[256];
  optlist_format(l, a, sizeof a);
  for (int i = 0; i < *n; i++) {
    optlist_format(&(*cs)[i].l, b, sizeof b);
    if (strcmp(a, b) == 0) return;
  }
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 32;
    *cs = tg_xrealloc(*cs, sizeof(Cand) * (size_t)*cap);
  }
  (*cs)[(*n)++] = (Cand){*l, NULL, NULL, INFINITY};
}

/* base extended by up to three actions (those past OPTLIST_MAX are not candidates) */
static void add_ext(Cand **cs, int *n, int *cap, const OptList *base, int k, const Opt *o) {
  if (base->n + k > OPTLIST_MAX) return;
  OptList c = *base;
  for (int i = 0; i < k; i++) c.o[c.n++] = o[i];
  add_cand(cs, n, cap, &c);
}
#define EXT(...) add_ext(cs, n, cap, base, (int)(sizeof((Opt[]){__VA_ARGS__}) / sizeof(Opt)), (Opt[]){__VA_ARGS__})

/* The axis of the list's vector lanes as the CPU would make them: its first UPCAST, when that is by
 * 4, 8 or 16 and comes before any UNROLL (-1: none). */
static int vector_axis(const OptList *l) {
  for (int i = 0; i < l->n; i++) {
    const Opt *o = &l->o[i];
    if (o->op == OPT_UNROLL) return -1;
    if (o->op == OPT_UPCAST) return o->arg == 4 || o->arg == 8 || o->arg == 16 ? o->axis : -1;
  }
  return -1;
}

static bool has_lanes_action(const OptList *l) {
  for (int i = 0; i < l->n; i++)
    if (l->o[i].op == OPT_UPCAST || l->o[i].op == OPT_UNROLL) return true;
  return false;
}

/* CPU: the lists that extend base by one action of the given round -- vector lanes (UPCAST or
 * UNROLL by 16, 8 or 4), register tiles (UPCAST, PADTO first where the factor does not divide, and
 * 2-D tiles), UPCAST of the vector axis and UNROLL, and the loop order (SWAPs that walk the vector
 * axis outermost or second) or one thread. */
static void cpu_actions(const OptList *base, int round, const int64_t *gs, int ng, const int64_t *rs, int nr, bool red, Cand **cs,
                        int *n, int *cap) {
  add_cand(cs, n, cap, base);
  int va = vector_axis(base);
  switch (round) {
  case 0:
    if (has_lanes_action(base)) break;
    for (int g = 0; g < ng; g++)
      for (int W = 16; W >= 4; W /= 2)
        if (gs[g] % W == 0) EXT({OPT_UPCAST, g, W});
    for (int ri = 0; ri < nr; ri++)
      for (int W = 16; W >= 4; W /= 2)
        if (rs[ri] % W == 0) EXT({OPT_UNROLL, ri, W});
    break;
  case 1:
    for (int g = 0; g < ng; g++)
      for (int f = 2; f <= 8; f *= 2) {
        /* a factor that does not divide the axis pads it (PADTO, reductions only, at most +25%) */
        int64_t padded = (gs[g] + f - 1) / f * f;
        bool divides = gs[g] % f == 0, fits = divides || (red && gs[g] > f && (padded - gs[g]) * 4 <= gs[g]);
        if (g == va || !fits || (!red && f > 4)) continue;
        if (divides) EXT({OPT_UPCAST, g, f});
        else EXT({OPT_PADTO, g, f}, {OPT_UPCAST, g, f});
        /* a second upcast axis: 2-D register tiles */
        for (int g2 = 0; g2 < ng && red && f <= 4; g2++)
          if (g2 != g && g2 != va && gs[g2] % 4 == 0) {
            if (divides) EXT({OPT_UPCAST, g, f}, {OPT_UPCAST, g2, 4});
            else EXT({OPT_PADTO, g, f}, {OPT_UPCAST, g, f}, {OPT_UPCAST, g2, 4});
          }
      }
    break;
  case 2:
    if (va >= 0)
      for (int f = 2; f <= 4; f *= 2) EXT({OPT_UPCAST, va, f});
    for (int ri = 0; ri < nr; ri++)
      for (int f = 2; f <= 4; f *= 2)
        if (rs[ri] % f == 0 && rs[ri] / f >= 2) EXT({OPT_UNROLL, ri, f});
    break;
  case 3:
    for (int pos = 0; pos <= 1 && va > pos; pos++) {
      OptList c = *base;
      for (int j = va; j > pos && c.n < OPTLIST_MAX; j--) c.o[c.n++] = (Opt){OPT_SWAP, j - 1, j};
      if (c.n == base->n + va - pos) add_cand(cs, n, cap, &c);
    }
    EXT({OPT_THREAD, 0, 1});
    break;
  }
}

/* GPU: every list that extends base by one action: GROUP/GROUPTOP of a reduce axis, LOCAL or UPCAST
 * of a global axis, UNROLL of a reduce axis, and on a CUDA device (tc) an empty list by TC in each
 * of the ways a matmul-like kernel may match, unpadded and padded (codegen drops those that do not
 * fit; after a TC only UPCASTs of its axes do). */
static void gpu_actions(const OptList *base, const int64_t *gs, int ng, const int64_t *rs, int nr, bool tc, Cand **cs, int *n, int *cap) {
  add_cand(cs, n, cap, base);
  for (int i = 0; tc && base->n == 0 && i < 4; i++) EXT({OPT_TC, i, 0}), EXT({OPT_TC, i, 2});
  for (int r = 0; r < nr; r++)
    for (int g = 16; g <= 256; g *= 2)
      if (rs[r] >= 2 * g) EXT({OPT_GROUP, r, g}), EXT({OPT_GROUPTOP, r, g});
  for (int a = 0; a < ng; a++)
    for (int l = 2; l <= 32; l *= 2)
      if (gs[a] % l == 0) EXT({OPT_LOCAL, a, l});
  /* (UPCAST 4, 8 and 16 of an axis the output is contiguous on are vectors in OpenCL C) */
  for (int a = 0; a < ng; a++)
    for (int f = 2; f <= 16; f *= 2)
      if (gs[a] % f == 0) EXT({OPT_UPCAST, a, f});
  for (int r = 0; r < nr; r++)
    for (int f = 2; f <= 4; f *= 2)
      if (rs[r] % f == 0 && rs[r] / f >= 2) EXT({OPT_UNROLL, r, f});
}
#undef EXT

static void free_cands(Cand *cs, int n) {
  for (int i = 0; i < n; i++) {
    kernel_code_free(cs[i].kc);
    program_release(cs[i].prg); /* a candidate's program may be unloaded once the cache is full */
    cs[i].kc = NULL, cs[i].prg = NULL;
  }
}

static void remember(uint64_t h, const OptList *l) {
  pthread_mutex_lock(&mem_lock);
  OptList *c = pm_get(&mem_cache, h);
  if (!c) {
    c = tg_xmalloc(sizeof *c);
    pm_put(&mem_cache, h, c);
  }
  *c = *l;
  pthread_mutex_unlock(&mem_lock);
}

/* BEAM on any device: rounds of one more action each (the CPU's four rounds of kinds of actions,
 * or three of every GPU action), timed on the real inputs (GPU: by the device's events), checked
 * against the unoptimized kernel's output. The heuristics' list competes and seeds the beam. The
 * choice is cached in memory and on disk, keyed by the unoptimized source, the device and its
 * compiler or driver, and n. */
bool beam_search(UOp *ast, Device *dev, Buffer **bufs, int nbufs, int beam, OptList *out) {
  const DeviceCaps *caps = &dev->caps;
  const OptList none = {.n = 0};
  bool gpu = caps->gpu;
  KernelCode *base = codegen_for(ast, caps, &none);
  if (!base) return false;
  SB key;
  sb_init(&key);
  const char *cid = device_compiler_id(dev);
  sb_printf(&key, "opts|%s|%s|%s|%d", dev->vt->name, cid ? cid : "", base->src, beam);
  if (getenv_int("ALLOW_TF32", 0)) sb_puts(&key, "|tf32"); /* (TC may take float32 kernels) */
  int64_t sel = getenv_int("TC_SELECT", -1);
  if (sel >= 0) sb_printf(&key, "|tc%lld", (long long)sel); /* (which tensor core TC means) */
  uint64_t h = hash_bytes(key.s, key.len, 0x6265616d);
  sb_free(&key);
  pthread_mutex_lock(&mem_lock);
  OptList *mc = pm_get(&mem_cache, h);
  if (mc) *out = *mc;
  pthread_mutex_unlock(&mem_lock);
  if (mc) {
    kernel_code_free(base);
    return true;
  }
  char *dir = beam_dir();
  char path[4096] = {0};
  char line[512];
  if (dir && cache_read(dir, h, ".opts", path, sizeof path, line, sizeof line)) {
    line[strcspn(line, "\n")] = 0;
    if (optlist_parse(line, out)) {
      free(dir);
      kernel_code_free(base);
      remember(h, out);
      return true;
    }
  }
  double t0 = now_seconds();
  /* loop sizes of the kernel as lowered for this device, before any action */
  int64_t gs[64], rs[64];
  LKernel *lk = lower_kernel_for(ast, caps, &none);
  int ng = lk->ng < 64 ? lk->ng : 64, nr = lk->nr < 64 ? lk->nr : 64;
  bool red = lk->rbody != NULL;
  for (int i = 0; i < ng; i++) gs[i] = lk->granges[i]->iarg[0];
  for (int i = 0; i < nr; i++) rs[i] = lk->rranges[i]->iarg[0];
  lkernel_free(lk);
  /* benchmark setup: real inputs, a scratch output initialised like the real one */
  Bench b;
  unsigned char *orig;
  bool had_error = tg_last_error() != NULL;
  bool ok = bench_init(&b, &orig, ast, dev, bufs, nbufs);
  /* reference output from the unoptimized kernel */
  Cand ref = {none, base, NULL, INFINITY};
  if (ok) ok = bench_ref(&b, &ref, dev);
  OptList best = none;
  double best_t = ref.t;
  Cand *front = tg_xmalloc(sizeof(Cand) * (size_t)(beam + 2));
  int nfront = 0;
  if (ok) front[nfront++] = (Cand){none, NULL, NULL, ref.t};
  /* the hand-coded heuristics' choice competes too, and seeds the beam: the search never ends worse
   * than BEAM=0 */
  KernelCode *hk = ok ? codegen_for(ast, caps, NULL) : NULL;
  if (hk) {
    Cand hc = {hk->applied, codegen_for(ast, caps, &hk->applied), NULL, INFINITY};
    kernel_code_free(hk);
    if (hc.kc) {
      compile_all(&hc, 1, dev);
      hc.t = time_one(&b, &hc, INFINITY);
      if (isfinite(hc.t)) {
        front[nfront++] = (Cand){hc.l, NULL, NULL, hc.t};
        if (hc.t < best_t) best = hc.l, best_t = hc.t;
      }
      free_cands(&hc, 1);
    }
  }
  if (!had_error) tg_clear_error(); /* a kernel the heuristics cannot lower is simply not a candidate */
  int rounds = gpu ? 3 : 4;
  for (int round = 0; ok && round < rounds; round++) {
    Cand *cs = NULL;
    int n = 0, cap = 0;
    for (int f = 0; f < nfront; f++) {
      if (gpu) gpu_actions(&front[f].l, gs, ng, rs, nr, caps->lang == LANG_CUDA, &cs, &n, &cap);
      else cpu_actions(&front[f].l, round, gs, ng, rs, nr, red, &cs, &n, &cap);
    }
    int m = 0; /* keep those that apply */
    for (int i = 0; i < n; i++)
      if ((cs[i].kc = codegen_for(ast, caps, &cs[i].l))) cs[m++] = cs[i];
    n = m;
    compile_all(cs, n, dev);
    for (int i = 0; i < n; i++) cs[i].t = time_one(&b, &cs[i], best_t);
    /* a list that does not apply, compile or run is no candidate, and no error of the call either
     * (an image kernel's lists that cannot store into an image, say) */
    if (!had_error) tg_clear_error();
    qsort(cs, (size_t)n, sizeof(Cand), cand_cmp);
    double prev = best_t;
    if (n && cs[0].t < best_t) best = cs[0].l, best_t = cs[0].t;
    nfront = 0;
    for (int i = 0; i < n && nfront < beam; i++)
      if (isfinite(cs[i].t)) front[nfront++] = (Cand){cs[i].l, NULL, NULL, cs[i].t};
    if (debug_level() >= 1 || now_seconds() - t0 > 2.0) {
      char bl[256];
      optlist_format(&best, bl, sizeof bl);
      fprintf(stderr, "BEAM %d: %-28s round %d/%d: %3d candidates, best %9.2f us [%s] (unoptimized %9.2f us)\n", beam,
              base->name, round + 1, rounds, n, best_t * 1e6, bl, ref.t * 1e6);
    }
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
    if (!had_error) tg_clear_error();
    return false;
  }
  *out = best;
  remember(h, &best);
  if (dir) {
    optlist_format(&best, line, sizeof line);
    cache_write(path, line);
    free(dir);
  }
  return true;
}
