/*
 * realize.c -- runs schedules: compiles kernels (cached by AST identity, then by source on disk),
 * allocates buffers just before the kernel that writes them and frees them right after their last
 * reader (so dead intermediates are recycled by the device's caching allocator), launches, and
 * swaps realized nodes into every live tensor handle.
 *
 * Invariant: after realize_uops succeeds, every target that needed computing has ->realized set to a
 * BUFFER node of the same shape and dtype, and live handles that held the target now hold that node.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../codegen/codegen.h"
#include "engine.h"
#include "viz.h"
#include "../schedule/schedule.h"
#include "../uop/ptrmap.h"

/* In-memory kernel cache: AST -> compiled program and its launch metadata. Bounded like the program
 * cache below it (MAX_LOADED_KERNELS, least recently used out first), since each entry holds a
 * program and its AST; entries are reference counted because TinyJit captures keep using the
 * program and metadata of entries the cache has dropped. */
typedef struct CachedKernel {
  UOp *ast;  /* owned key */
  Program *prg; /* a reference */
  KernelCode *code;
  uint64_t key;
  int refs; /* the cache's own (while listed) + captures' + a running schedule's */
  char *gopts; /* the GPU_OPTS it was generated under (NULL: none): a lookup under another finds
                * nothing, and the new kernel replaces the entry */
  const char *cid; /* the compiler it was built by (the device's compiler_id, a stable string: CC
                    * may name another compiler later); the same rule as gopts */
  struct CachedKernel *prev, *next; /* LRU order, most recent first */
} CachedKernel;

static PtrMap kcache; /* (AST pointer, device, settings) -> CachedKernel* */
static CachedKernel kc_lru = {.prev = &kc_lru, .next = &kc_lru};
static size_t kc_n;
static pthread_mutex_t kc_lock = PTHREAD_MUTEX_INITIALIZER;

bool beam_search(UOp *ast, Device *dev, Buffer **bufs, int nbufs, int beam, OptList *out);

/* GPU_OPTS forces the actions of GPU kernels: part of what a cache entry was made under. */
static const char *kc_gopts(Device *dev) {
  const char *g = dev->caps.gpu ? getenv_str("GPU_OPTS", NULL) : NULL;
  return g && *g ? g : NULL;
}

static bool same_gopts(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

static CachedKernel *ck_retain(CachedKernel *ck) {
  if (ck) __atomic_fetch_add(&ck->refs, 1, __ATOMIC_RELAXED);
  return ck;
}

static void ck_release(CachedKernel *ck) {
  if (!ck || __atomic_sub_fetch(&ck->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  uop_unref(ck->ast);
  program_release(ck->prg);
  kernel_code_free(ck->code);
  free(ck->gopts);
  free(ck);
}

static void lru_unlink(CachedKernel *ck) {
  ck->prev->next = ck->next;
  ck->next->prev = ck->prev;
}

static void lru_front(CachedKernel *ck) {
  ck->next = kc_lru.next;
  ck->prev = &kc_lru;
  kc_lru.next->prev = ck;
  kc_lru.next = ck;
}

static CachedKernel *kcache_get(uint64_t key, const char *gopts, const char *cid) {
  pthread_mutex_lock(&kc_lock);
  CachedKernel *ck = pm_get(&kcache, key);
  if (ck && (!same_gopts(ck->gopts, gopts) || !same_gopts(ck->cid, cid))) ck = NULL;
  if (ck) lru_unlink(ck), lru_front(ck);
  pthread_mutex_unlock(&kc_lock);
  return ck;
}

/* DEBUG=7: the kernel's assembly; a device without a disassembler says so once per process. */
static void debug_disasm(Program *p) {
  static _Atomic int said;
  bool had = tg_has_error();
  char *s = program_disasm(p);
  if (s) {
    fprintf(stderr, "*** %s assembly (%s)\n%s\n", p->name, p->dev->name, s);
    free(s);
  } else {
    if (!atomic_exchange(&said, 1)) fprintf(stderr, "DEBUG=7: no assembly shown: %s\n", tg_last_error());
    if (!had) tg_clear_error();
  }
}

static bool ast_has_vars(UOp *ast);

/* Loads kc's program (compiling it unless a batch already did) and caches it under key. Takes kc.
 * NULL with the error recorded if it does not compile. */
static CachedKernel *kcache_put(uint64_t key, UOp *ast, Device *dev, KernelCode *kc) {
  if (!kc) return NULL;
  int dbg = debug_level();
  if (dbg >= 5) {
    char *s = kernel_ast_format(ast);
    fprintf(stderr, "*** %s AST\n%s", kc->name, s);
    free(s);
  }
  if (dbg >= 6) {
    /* the applied list lowers it again (a kernel with variable loops takes no forced list: the
     * heuristics lower it as it ran) */
    char *s = kernel_lowered_format(ast, &dev->caps, ast_has_vars(ast) ? NULL : &kc->applied);
    fprintf(stderr, "*** %s lowered\n%s", kc->name, s);
    free(s);
  }
  if (dbg >= 4) fprintf(stderr, "%s\n", kc->src);
  Program *p = program_get(dev, kc->name, kc->src);
  if (!p) {
    kernel_code_free(kc);
    return NULL;
  }
  if (dbg >= 7) debug_disasm(p);
  CachedKernel *ck = tg_xcalloc(1, sizeof *ck);
  ck->ast = uop_ref(ast);
  ck->prg = p;
  ck->code = kc;
  ck->key = key;
  ck->refs = 1;
  /* the source stays (a few KB per kernel): tg_jit_export writes the captured kernels' sources */
  const char *g = kc_gopts(dev);
  ck->gopts = g ? tg_xstrdup(g) : NULL;
  ck->cid = device_compiler_id(dev);
  int64_t lim = getenv_int("MAX_LOADED_KERNELS", 4096);
  size_t limit = lim < 1 ? 1 : (size_t)lim;
  CachedKernel *dead = NULL;
  pthread_mutex_lock(&kc_lock);
  CachedKernel *had = pm_get(&kcache, key), *evicted = NULL;
  if (had && (!same_gopts(had->gopts, ck->gopts) || !same_gopts(had->cid, ck->cid))) {
    /* made under another GPU_OPTS or by another compiler: this one replaces it */
    lru_unlink(had);
    pm_del(&kcache, key);
    kc_n--;
    had->next = NULL;
    evicted = had;
    had = NULL;
  }
  if (had) {
    dead = ck;
    ck = had;
  } else {
    pm_put(&kcache, key, ck);
    lru_front(ck);
    kc_n++;
  }
  /* drop the least recently used beyond the limit (never the one just added: the caller runs it) */
  while (kc_n > limit && kc_lru.prev != ck) {
    CachedKernel *v = kc_lru.prev;
    lru_unlink(v);
    pm_del(&kcache, v->key);
    kc_n--;
    v->next = evicted;
    evicted = v;
  }
  pthread_mutex_unlock(&kc_lock);
  if (dead) ck_release(dead);
  while (evicted) {
    CachedKernel *nx = evicted->next;
    ck_release(evicted);
    evicted = nx;
  }
  return ck;
}

size_t kernel_cache_count(void) {
  pthread_mutex_lock(&kc_lock);
  size_t n = kc_n;
  pthread_mutex_unlock(&kc_lock);
  return n;
}

/* The cache key of a kernel: its AST, the device (programs are loaded per device), and the
 * settings that change the code generated for it (NOOPT, LOOP_BOUNDS, ALLOW_TF32, TC_SELECT), so
 * that turning one of them on in a context compiles anew. */
static uint64_t kkey(UOp *ast, Device *dev) {
  uint64_t v = (getenv_int("NOOPT", 0) ? 1u : 0u) | (getenv_int("LOOP_BOUNDS", 1) ? 0u : 2u) | (getenv_int("ALLOW_TF32", 0) ? 4u : 0u);
  uint64_t sel = (uint64_t)(getenv_int("TC_SELECT", -1) + 1) & 0xf;
  return (uint64_t)(uintptr_t)ast ^ (v << 60) ^ (sel << 56) ^ ((uint64_t)(dev->id & 0xff) << 48);
}

/* BEAM's width: tinygrad's values are a few to a hundred; past BEAM_MAX the search's candidate
 * arrays (and its time) would grow without use, so a larger value is taken as BEAM_MAX. */
#define BEAM_MAX 256
static int beam_width(void) {
  int64_t b = getenv_int("BEAM", 0);
  if (b <= BEAM_MAX) return b < 0 ? 0 : (int)b;
  char v[32], m[32];
  snprintf(v, sizeof v, "%lld", (long long)b), snprintf(m, sizeof m, "%d", BEAM_MAX);
  env_warn("BEAM", v, "wider than a search can use", m);
  return BEAM_MAX;
}

/* BEAM>0: the kernel compiled with the searched optimizations (cached per AST and beam width). */
static CachedKernel *get_kernel_beam(UOp *ast, Device *dev, Buffer **bufs, int nbufs, int beam) {
  uint64_t key = kkey(ast, dev) ^ ((uint64_t)beam << 56) ^ 1;
  CachedKernel *ck = kcache_get(key, NULL, device_compiler_id(dev));
  if (ck) return ck;
  OptList l;
  KernelCode *kc = beam_search(ast, dev, bufs, nbufs, beam, &l) ? codegen_for(ast, &dev->caps, &l) : NULL;
  return kcache_put(key, ast, dev, kc ? kc : codegen_for(ast, &dev->caps, NULL));
}

static CachedKernel *get_kernel(UOp *ast, Device *dev) {
  uint64_t key = kkey(ast, dev);
  CachedKernel *ck = kcache_get(key, kc_gopts(dev), device_compiler_id(dev));
  return ck ? ck : kcache_put(key, ast, dev, codegen_for(ast, &dev->caps, NULL));
}

/* ---- parallel compilation: kernels a schedule needs that are not cached yet are compiled on all
 * cores before it runs. Code generation stays on this thread (it is not reentrant) and hands each
 * batch to the compiling threads as soon as it is rendered, so they start while it renders the rest. ---- */
typedef struct {
  UOp *ast;
  Device *dev;
  KernelCode *kc;
} CJob;
typedef struct {
  CJob *jobs;
  int n;
} CJobs;

/* One compiler run: up to BATCH_MAX jobs of one device, compiled by one thread. */
#define BATCH_MAX 24 /* bounded translation units: the compiler's cost per unit grows with its size */
#define BATCH_MIN 4  /* below this, a unit's fixed costs (an object, a compiler process) weigh */
typedef struct {
  int idx[BATCH_MAX], m;
  Device *dev;
  Device *alt;                     /* tiered: the stand-ins' device (NULL: compile as usual) */
  KernelCode *alt_kc[BATCH_MAX];   /* the same kernels rendered for alt */
} CBatch;

/* The batches: this thread appends them as it renders, every thread (this one when it is done
 * rendering) takes the next one. */
typedef struct {
  CJobs *js;
  CBatch *b;
  int nb, next;
  bool done; /* every batch is in */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  const CtxCopy *ctx; /* the realizing thread's Context (CC, DEBUG, ...), for the other threads */
} CQueue;

/* Tiered compilation: the device whose kernels stand in for dev's while dev's own compiler builds
 * them in the background, or NULL. The CPU device with its default compiler gets CPU:LLVM, whose
 * in-process compiles are several times faster than gcc's; TIERED=0, BEAM, DEBUG=7 (which shows the C
 * compiler's code), a CC of the user's own (its code is what was asked for) or an ARCH turn it off,
 * and so does a machine without libLLVM. */
static Device *tier_device(Device *dev) {
  static _Atomic int unavailable;
  if (strcmp(dev->vt->name, "CPU") != 0 || strcmp(dev->renderer, "C") != 0 || !dev->vt->compile_async || dev->arch[0] ||
      !getenv_int("TIERED", 1) || getenv_int("BEAM", 0) > 0 || debug_level() >= 7 || atomic_load(&unavailable))
    return NULL;
  const char *cc = getenv_str("CC", NULL);
  if (cc && *cc && strcmp(cc, "cc") != 0) return NULL;
  char name[48];
  if (dev->index) snprintf(name, sizeof name, "CPU:%d:LLVM", dev->index);
  else snprintf(name, sizeof name, "CPU:LLVM");
  bool had = tg_has_error();
  Device *alt = device_get(name);
  if (!alt) {
    if (debug_level() >= 2) fprintf(stderr, "tiered compile: off (%s)\n", tg_last_error());
    atomic_store(&unavailable, 1);
    if (!had) tg_clear_error();
  }
  return alt;
}

/* Renders the batch's kernels for its stand-in device with the optimizations they were chosen with
 * (float16/bfloat16 vector lanes included: both renderers compute them alike); false (and nothing
 * kept) if one does not render or would launch differently. */
static bool tier_render(CJobs *js, CBatch *b) {
  bool had = tg_has_error(), ok = true;
  for (int k = 0; k < b->m; k++) {
    CJob *j = &js->jobs[b->idx[k]];
    KernelCode *a = codegen_for(j->ast, &b->alt->caps, ast_has_vars(j->ast) ? NULL : &j->kc->applied);
    b->alt_kc[k] = a;
    ok = ok && a && a->nparams == j->kc->nparams && a->nvars == j->kc->nvars &&
         memcmp(a->global_size, j->kc->global_size, sizeof a->global_size) == 0 &&
         memcmp(a->local_size, j->kc->local_size, sizeof a->local_size) == 0;
  }
  if (!ok) {
    for (int k = 0; k < b->m; k++) kernel_code_free(b->alt_kc[k]), b->alt_kc[k] = NULL;
    if (!had) tg_clear_error();
  }
  return ok;
}

/* the names and sources of batch b's kernels */
static void batch_sources(const CJobs *js, const CBatch *b, const char **names, const char **srcs) {
  for (int k = 0; k < b->m; k++) names[k] = js->jobs[b->idx[k]].kc->name, srcs[k] = js->jobs[b->idx[k]].kc->src;
}

static void compile_batch(CJobs *js, CBatch *b) {
  const char *names[BATCH_MAX], *srcs[BATCH_MAX];
  batch_sources(js, b, names, srcs);
  if (b->alt) {
    const char *an[BATCH_MAX], *as[BATCH_MAX];
    Program *stand[BATCH_MAX];
    for (int k = 0; k < b->m; k++) an[k] = b->alt_kc[k]->name, as[k] = b->alt_kc[k]->src;
    program_get_batch(b->alt, an, as, b->m);
    bool all = true, had = tg_has_error();
    for (int k = 0; k < b->m; k++) all = (stand[k] = program_get(b->alt, an[k], as[k])) && all;
    int got = all ? program_get_batch_tiered(b->dev, names, srcs, stand, b->m) : 0;
    for (int k = 0; k < b->m; k++) program_release(stand[k]);
    if (!had) tg_clear_error();
    if (got) return;
  }
  program_get_batch(b->dev, names, srcs, b->m);
}

static void compile_queue(CQueue *q) {
  for (;;) {
    pthread_mutex_lock(&q->lock);
    while (q->next == q->nb && !q->done) pthread_cond_wait(&q->cond, &q->lock);
    int i = q->next < q->nb ? q->next++ : -1;
    pthread_mutex_unlock(&q->lock);
    if (i < 0) return;
    compile_batch(q->js, &q->b[i]);
  }
}

static void *compile_worker(void *arg) {
  CQueue *q = arg;
  ctx_enter(q->ctx);
  compile_queue(q);
  ctx_leave(q->ctx);
  return NULL;
}

/* Decides whether batch x compiles tiered (its stand-ins rendered for the tier device now). */
static void tier_setup(CJobs *js, CBatch *x) {
  if (!program_tier_room(x->m) || !(x->alt = tier_device(x->dev))) return;
  const char *names[BATCH_MAX], *srcs[BATCH_MAX];
  batch_sources(js, x, names, srcs);
  if (program_batch_cached(x->dev, names, srcs, x->m) || !tier_render(js, x)) x->alt = NULL;
}

static void precompile(Schedule *s) {
  CJobs js = {0};
  PtrMap seen;
  pm_init(&seen);
  for (int i = 0; i < s->nitems; i++) {
    SItem *it = &s->items[i];
    if (it->kind != SI_KERNEL || pm_has(&seen, (uint64_t)(uintptr_t)it->ast)) continue;
    pm_put(&seen, (uint64_t)(uintptr_t)it->ast, (void *)1);
    if (kcache_get(kkey(it->ast, it->dev), kc_gopts(it->dev), device_compiler_id(it->dev))) continue;
    js.jobs = tg_xrealloc(js.jobs, sizeof(CJob) * (size_t)(js.n + 1));
    js.jobs[js.n++] = (CJob){it->ast, it->dev, NULL};
  }
  pm_free(&seen);
  /* one kernel compiles in the run loop, unless it is tiered */
  if (js.n >= 2 || (js.n == 1 && program_tier_room(1) && tier_device(js.jobs[0].dev))) {
    double t0 = now_seconds();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = (int)(ncpu < 1 ? 1 : ncpu > 16 ? 16 : ncpu);
    if (nt > js.n) nt = js.n;
    CQueue q = {.js = &js, .b = tg_xcalloc((size_t)js.n, sizeof(CBatch))};
    pthread_mutex_init(&q.lock, NULL);
    pthread_cond_init(&q.cond, NULL);
    CtxCopy *ctx = nt > 1 ? ctx_copy() : NULL;
    q.ctx = ctx;
    pthread_t th[16];
    bool started[16] = {false};
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&th[t], NULL, compile_worker, &q) == 0;
    /* batches shrink as the jobs run out (a share of what is left for each thread), so that the
     * threads finish together; one device per batch */
    for (int i = 0; i < js.n;) {
      int left = js.n - i, want = (left + 2 * nt - 1) / (2 * nt);
      want = want < BATCH_MIN ? BATCH_MIN : want > BATCH_MAX ? BATCH_MAX : want;
      CBatch x = {.m = 0};
      for (; i < js.n && x.m < want; i++) {
        CJob *j = &js.jobs[i];
        if (x.m && j->dev != x.dev) break;
        j->kc = codegen_for(j->ast, &j->dev->caps, NULL);
        if (!j->kc) {
          tg_clear_error(); /* the run loop reports it */
          continue;
        }
        x.dev = j->dev;
        x.idx[x.m++] = i;
      }
      if (!x.m) continue;
      tier_setup(&js, &x);
      pthread_mutex_lock(&q.lock);
      q.b[q.nb++] = x;
      pthread_cond_signal(&q.cond);
      pthread_mutex_unlock(&q.lock);
    }
    pthread_mutex_lock(&q.lock);
    q.done = true;
    pthread_cond_broadcast(&q.cond);
    pthread_mutex_unlock(&q.lock);
    compile_queue(&q);
    for (int t = 1; t < nt; t++)
      if (started[t]) pthread_join(th[t], NULL);
    if (ctx) ctx_copy_free(ctx);
    if (debug_level() >= 2)
      fprintf(stderr, "precompile: %d kernels in %d batches on %d threads, %.1f ms\n", js.n, q.nb, nt, (now_seconds() - t0) * 1e3);
    pthread_cond_destroy(&q.cond);
    pthread_mutex_destroy(&q.lock);
    for (int i = 0; i < q.nb; i++)
      for (int k = 0; k < q.b[i].m; k++) kernel_code_free(q.b[i].alt_kc[k]);
    free(q.b);
    /* the batches loaded the programs; a kernel that failed in its batch compiles alone here, and
     * one that fails again is left for the run loop, which reports its error */
    for (int i = 0; i < js.n; i++)
      if (js.jobs[i].kc && !kcache_put(kkey(js.jobs[i].ast, js.jobs[i].dev), js.jobs[i].ast, js.jobs[i].dev, js.jobs[i].kc))
        tg_clear_error();
  }
  free(js.jobs);
}

_Thread_local Capture *g_capture;

static void capture_add(CachedKernel *ck, Buffer **bufs, int nbufs, size_t nbytes, size_t mem, const int64_t *vals) {
  Capture *c = g_capture;
  if (c->n == c->cap) {
    c->cap = c->cap ? c->cap * 2 : 32;
    c->items = tg_xrealloc(c->items, sizeof(CapItem) * (size_t)c->cap);
  }
  CapItem *it = &c->items[c->n++];
  it->ck = ck_retain(ck);
  it->prg = ck ? ck->prg : NULL;
  it->code = ck ? ck->code : NULL;
  it->nbufs = nbufs;
  it->nbytes = nbytes;
  it->mem = mem;
  it->slot = NULL;
  it->bufs = tg_xmalloc(sizeof(Buffer *) * (size_t)nbufs);
  for (int i = 0; i < nbufs; i++) it->bufs[i] = buffer_ref(bufs[i]);
  it->vals = NULL;
  it->coll = false, it->root = 0, it->dtype = 0, it->redop = 0, it->group = 0;
  if (ck && ck->code->nvars) {
    it->vals = tg_xmalloc(sizeof(int64_t) * (size_t)ck->code->nvars);
    memcpy(it->vals, vals, sizeof(int64_t) * (size_t)ck->code->nvars);
  }
}

bool engine_capturing(void) { return g_capture != NULL; }

static void capitem_free(CapItem *it) {
  for (int j = 0; j < it->nbufs; j++) buffer_unref(it->bufs[j]);
  free(it->bufs);
  free(it->slot);
  free(it->vals);
  ck_release(it->ck);
}

/* Drops the capture's device graph and its planned memory (the items changed, or the capture ends). */
static void capture_graph_drop(Capture *c) {
  if (c->graph) c->gdev->vt->graph_free(c->gdev->state, c->graph);
  for (int i = 0; c->gargs && i < c->n; i++) free(c->gargs[i]);
  for (int s = 0; c->gslot && s < c->nslots; s++) buffer_unref(c->gslot[s]);
  buffer_unref(c->garena);
  free(c->gargs), free(c->gmask), free(c->gslot);
  c->graph = NULL, c->gdev = NULL, c->gargs = NULL, c->gmask = NULL, c->gslot = NULL, c->garena = NULL;
}

void capture_free(Capture *c) {
  capture_graph_drop(c);
  for (int i = 0; i < c->n; i++) capitem_free(&c->items[i]);
  for (int s = 0; c->pin && s < c->nslots; s++) buffer_unref(c->pin[s]);
  for (int k = 0; k < c->ndeps; k++) buffer_unref(c->deps[k]);
  free(c->items);
  free(c->slots);
  free(c->hoisted);
  free(c->pin);
  free(c->deps);
  free(c->dep_ver);
  memset(c, 0, sizeof *c);
}

void capture_forget(Capture *c, Buffer *b, int from) {
  capture_graph_drop(c);
  int s = -1;
  for (int i = from < 0 ? 0 : from; i < c->n; i++) {
    CapItem *it = &c->items[i];
    for (int j = 0; j < it->nbufs; j++) {
      if (it->bufs[j] != b) continue;
      if (s < 0) {
        if (c->nslots == c->slotcap) {
          c->slotcap = c->slotcap ? c->slotcap * 2 : 16;
          c->slots = tg_xrealloc(c->slots, sizeof(CapSlot) * (size_t)c->slotcap);
        }
        s = c->nslots++;
        c->slots[s] = (CapSlot){b->nbytes, b->dev, i, i, b->img_w, b->img_h};
      }
      if (!it->slot) {
        it->slot = tg_xmalloc(sizeof(int) * (size_t)it->nbufs);
        for (int k = 0; k < it->nbufs; k++) it->slot[k] = -1;
      }
      it->slot[j] = s;
      it->bufs[j] = NULL;
      c->slots[s].last = i;
      buffer_unref(b);
    }
  }
}

/* Buffer j of captured item it in a run of run_items (NULL + error when a transient cannot be
 * allocated). */
static Buffer *run_buffer(const Capture *c, const CapItem *it, int j, Buffer **live, Buffer *const *pin, Buffer *const *from,
                          Buffer *const *to, int n) {
  int s = it->slot ? it->slot[j] : -1;
  if (s >= 0) {
    if (pin && pin[s]) return pin[s];
    if (!live[s]) live[s] = buffer_new_like(c->slots[s].dev, c->slots[s].nbytes, c->slots[s].img_w, c->slots[s].img_h);
    return live[s];
  }
  /* one substitution per buffer: with inputs swapped between calls, to[k] may be another from[] */
  for (int k = 0; k < n; k++)
    if (it->bufs[j] == from[k]) return to[k];
  return it->bufs[j];
}

/* A captured kernel's variable arguments (after its nbufs buffers in p): this replay's values of
 * vars[] where it takes them, else the values it was captured with. */
static void kernel_var_args(const CapItem *it, void **p, const int *vars, const int64_t *vals, int nvars) {
  for (int k = 0; k < it->code->nvars; k++) {
    int64_t v = it->vals[k];
    for (int q = 0; q < nvars; q++)
      if (vars[q] == it->code->vars[k]) v = vals[q];
    p[it->nbufs + k] = (void *)(intptr_t)v;
  }
}

static void print_group_line(Buffer *const *out, int n, size_t nbytes, tg_dtype dt, int redop, bool replay) {
  char names[512];
  size_t len = 0;
  names[0] = '\0';
  for (int k = 0; k < n && len + 1 < sizeof names; k++) {
    int w = snprintf(names + len, sizeof names - len, "%s%s", k ? "," : "", out[k]->dev->name);
    if (w < 0) break;
    len += (size_t)w < sizeof names - len ? (size_t)w : sizeof names - len - 1;
  }
  fprintf(stderr, "*** %-8s %6s NCCL allreduce %s %dx%zu bytes %s%s\n", names, "", redop == OP_MAX ? "max" : "sum", n, nbytes,
          tg_dtype_name(dt), replay ? " (jit replay)" : "");
}

/* A captured NCCL group, run at its first member item i: every member's output (items of the same
 * group) from the inputs of item i; ran[] marks the members done. */
static tg_status run_group_items(const Capture *c, int i, bool *ran, Buffer **live, Buffer *const *pin, Buffer *const *from,
                                 Buffer *const *to, int n) {
  const CapItem *it = &c->items[i];
  int m = it->nbufs - 1;
  Buffer **out = tg_xcalloc((size_t)m, sizeof(Buffer *)), **in = tg_xcalloc((size_t)m, sizeof(Buffer *));
  tg_status st = TG_OK;
  for (int k = 0; k < m && st == TG_OK; k++)
    if (!(in[k] = run_buffer(c, it, k + 1, live, pin, from, to, n))) st = tg_last_status();
  for (int j = 0; j < c->n && st == TG_OK; j++) { /* (a rerun of some items may start past the first member) */
    const CapItem *o = &c->items[j];
    if (!o->coll || o->group != it->group || o->root < 0 || o->root >= m) continue;
    if (!(out[o->root] = run_buffer(c, o, 0, live, pin, from, to, n))) st = tg_last_status();
    ran[j] = true;
  }
  for (int k = 0; k < m && st == TG_OK; k++)
    if (!out[k]) st = tg_set_error(TG_ERR_RUNTIME, "TinyJit replay: member %d of a captured NCCL allreduce is missing", k);
  if (st == TG_OK) st = nccl_group_exec(out, in, m, it->nbytes, (tg_dtype)it->dtype, it->redop);
  if (st == TG_OK) {
    for (int k = 0; k < m; k++) counters_add(false, 0, it->nbytes, 0);
    if (debug_level() >= 2) print_group_line(out, m, it->nbytes, (tg_dtype)it->dtype, it->redop, true);
  }
  free(out), free(in);
  return st;
}

/* Runs the items of c that run[] selects (all when run is NULL), buffers from[k] replaced by to[k].
 * A transient slot s runs in pin[s] when pin is given and pin[s] is set (the caller keeps it), else
 * in a buffer allocated at its first use and freed after its last item. Counts every item in the
 * global counters as the captured run counted it. */
static tg_status run_items(const Capture *c, const bool *run, Buffer *const *from, Buffer *const *to, int n,
                           Buffer *const *pin, const int *vars, const int64_t *vals, int nvars) {
  int dbg = debug_level();
  Buffer **live = c->nslots ? tg_xcalloc((size_t)c->nslots, sizeof(Buffer *)) : NULL;
  bool *ran = NULL; /* members of NCCL groups run already (with their group's first member) */
  tg_status st = TG_OK;
  for (int i = 0; i < c->n && st == TG_OK; i++) {
    if (run && !run[i]) continue;
    const CapItem *it = &c->items[i];
    if (it->coll && it->nbufs > 2) {
      if (!ran) ran = tg_xcalloc((size_t)c->n, sizeof(bool));
      if (!ran[i]) st = run_group_items(c, i, ran, live, pin, from, to, n);
    }
    Buffer *bs[64];
    Buffer **b = it->nbufs <= 64 ? bs : tg_xmalloc(sizeof(Buffer *) * (size_t)it->nbufs);
    for (int j = 0; j < it->nbufs && st == TG_OK && !(it->coll && it->nbufs > 2); j++)
      if (!(b[j] = run_buffer(c, it, j, live, pin, from, to, n))) st = tg_last_status();
    if (st != TG_OK) {
      if (b != bs) free(b);
      break;
    }
    if (it->coll && it->nbufs > 2) {
      /* ran with its group */
    } else if (it->coll) {
      st = dist_exec(b[0], b[1], it->nbytes, (tg_dtype)it->dtype, it->root);
      if (st == TG_OK) counters_add(false, 0, it->nbytes, 0);
    } else if (!it->prg) {
      double c0 = viz_on ? now_seconds() : 0;
      st = buffer_copy(b[0], b[1], it->nbytes);
      if (st == TG_OK && viz_on) viz_copy(-1, b[0]->dev, b[1]->dev, it->nbytes, now_seconds() - c0);
      if (st == TG_OK) counters_add(false, 0, it->nbytes, 0);
    } else {
      void *ps[64];
      int nv = it->code->nvars;
      void **p = it->nbufs + nv <= 64 ? ps : tg_xmalloc(sizeof(void *) * (size_t)(it->nbufs + nv));
      for (int j = 0; j < it->nbufs; j++) p[j] = b[j]->ptr;
      kernel_var_args(it, p, vars, vals, nvars);
      buffer_written(b[0]);
      double t = program_exec(it->prg, p, it->nbufs, nv, it->code->global_size, it->code->local_size, dbg >= 2 || viz_on);
      if (p != ps) free(p);
      if (t >= 0 && viz_on) viz_run(-1, it->prg->dev, it->code, NULL, t, it->mem);
      if (t < 0) {
        st = tg_last_status() ? tg_last_status() : TG_ERR_RUNTIME;
      } else {
        uint64_t k = counters_add(true, it->code->ops, it->mem, dbg >= 2 ? t : 0);
        if (dbg >= 2)
          fprintf(stderr, "*** %-8s %6llu %-32s (jit replay) mem %6.3f GB tm %9.2fus\n", it->prg->dev->name,
                  (unsigned long long)k, it->code->name, (double)it->mem * 1e-9, t * 1e6);
      }
    }
    if (b != bs) free(b);
    for (int j = 0; it->slot && j < it->nbufs; j++) {
      int s = it->slot[j];
      if (s >= 0 && c->slots[s].last == i && live[s]) {
        buffer_unref(live[s]);
        live[s] = NULL;
      }
    }
  }
  for (int s = 0; s < c->nslots; s++) buffer_unref(live[s]);
  free(live);
  free(ran);
  return st;
}

/* The transients of the kernels run[] marks, planned into one buffer of gdev: walking the items in
 * order, a slot takes the first gap (256-byte aligned) that fits among the slots still live, the
 * others' memory freed after their last item. Pinned slots keep their pins. */
static size_t slot_span(const CapSlot *s) { return (s->nbytes + 255) / 256 * 256; }

static tg_status graph_plan(Capture *c, const bool *run, Buffer *const *pin) {
  size_t *off = c->nslots ? tg_xcalloc((size_t)c->nslots, sizeof(size_t)) : NULL;
  bool *placed = c->nslots ? tg_xcalloc((size_t)c->nslots, sizeof(bool)) : NULL;
  size_t total = 0;
  for (int i = 0; i < c->n; i++) {
    if (run && !run[i]) continue;
    const CapItem *it = &c->items[i];
    for (int j = 0; it->slot && j < it->nbufs; j++) {
      int sl = it->slot[j];
      if (sl < 0 || placed[sl] || (pin && pin[sl])) continue;
      size_t need = slot_span(&c->slots[sl]), at = 0;
      /* the lowest offset where no live slot (lifetime overlapping this one's) is in the way */
      for (bool moved = true; moved;) {
        moved = false;
        for (int q = 0; q < c->nslots; q++) {
          if (!placed[q] || c->slots[q].last < c->slots[sl].first || c->slots[q].first > c->slots[sl].last) continue;
          size_t qend = off[q] + slot_span(&c->slots[q]);
          if (off[q] < at + need && at < qend) at = qend, moved = true;
        }
      }
      off[sl] = at, placed[sl] = true;
      if (at + need > total) total = at + need;
    }
  }
  tg_status st = TG_OK;
  c->gslot = c->nslots ? tg_xcalloc((size_t)c->nslots, sizeof(Buffer *)) : NULL;
  if (total && !(c->garena = buffer_new(c->gdev, total))) st = tg_last_status();
  for (int sl = 0; st == TG_OK && sl < c->nslots; sl++)
    if (placed[sl] && !(c->gslot[sl] = buffer_wrap(c->gdev, (char *)c->garena->ptr + off[sl], c->slots[sl].nbytes)))
      st = tg_last_status();
  free(off), free(placed);
  return st;
}

/* A replay as the device's graph: 1 when done, 0 when it does not apply (another device or item
 * kind in the run, no graphs on the device, DEBUG>=2 or VIZ timing each kernel, JIT=2), -1 + error.
 * The first replay of a run mask records the graph; later ones update the launches whose arguments
 * changed (new input buffers, variables) and submit it. */
static int graph_replay(Capture *c, const bool *run, Buffer *const *from, Buffer *const *to, int n, const int *vars,
                        const int64_t *vals, int nvars) {
  if (c->gfailed || getenv_int_in("JIT", 1, 0, 2) != 1 || debug_level() >= 2 || viz_on) return 0;
  Device *d = NULL;
  int nk = 0;
  for (int i = 0; i < c->n; i++) {
    if (run && !run[i]) continue;
    const CapItem *it = &c->items[i];
    if (!it->prg || it->coll || !atomic_load(&it->prg->handle) || (d && it->prg->dev != d)) return 0;
    d = it->prg->dev;
    nk++;
  }
  if (nk < 2 || !d->vt->graph_new) return 0;
  bool same = c->graph && c->gdev == d;
  for (int i = 0; same && i < c->n; i++) same = c->gmask[i] == (!run || run[i]);
  tg_status st = TG_OK;
  if (!same) {
    capture_graph_drop(c);
    c->gdev = d;
    c->gmask = tg_xcalloc((size_t)c->n + 1, sizeof(bool));
    c->gargs = tg_xcalloc((size_t)c->n + 1, sizeof(void **));
    for (int i = 0; i < c->n; i++) c->gmask[i] = !run || run[i];
    if ((st = graph_plan(c, run, c->pin)) == TG_OK && !(c->graph = d->vt->graph_new(d->state))) st = tg_last_status();
  }
  int idx = 0;
  for (int i = 0; i < c->n && st == TG_OK; i++) {
    if (!c->gmask[i]) continue;
    const CapItem *it = &c->items[i];
    int na = it->nbufs + it->code->nvars;
    void **p = tg_xmalloc(sizeof(void *) * (size_t)(na + 1));
    for (int j = 0; j < it->nbufs; j++) {
      /* (every transient of the graph's items has its place in the arena: gslot serves as the
       * live buffers, so none is allocated here) */
      Buffer *b = run_buffer(c, it, j, c->gslot, c->pin, from, to, n);
      p[j] = b->ptr;
      if (j == 0) buffer_written(b);
    }
    kernel_var_args(it, p, vars, vals, nvars);
    if (!same) {
      st = d->vt->graph_add(d->state, c->graph, atomic_load(&it->prg->handle), p, na, it->code->global_size, it->code->local_size);
    } else if (memcmp(p, c->gargs[i], sizeof(void *) * (size_t)na) != 0) {
      st = d->vt->graph_set(d->state, c->graph, idx, p, na);
    }
    free(c->gargs[i]);
    c->gargs[i] = p;
    idx++;
  }
  if (st == TG_OK) st = d->vt->graph_launch(d->state, c->graph);
  if (st != TG_OK) {
    /* this capture replays launch by launch from now on: at once where the graph never ran (the
     * driver refused to record or instantiate it), else the failure is this call's */
    capture_graph_drop(c);
    c->gfailed = true;
    if (same) return -1;
    if (debug_level() >= 1) fprintf(stderr, "TinyJit: no graph on %s (%s); replaying launch by launch\n", d->name, tg_last_error());
    tg_clear_error();
    return 0;
  }
  for (int i = 0; i < c->n; i++)
    if (c->gmask[i]) counters_add(true, c->items[i].code->ops, c->items[i].mem, 0);
  return 1;
}

tg_status capture_replay(Capture *c, Buffer *const *from, Buffer *const *to, int n, const int *vars,
                         const int64_t *vals, int nvars) {
  const bool *run = NULL;
  bool *kept = NULL;
  if (c->nhoisted) {
    /* the constant work runs again when a buffer it reads was written since it last ran */
    bool stale = !c->fresh;
    for (int k = 0; k < c->ndeps && !stale; k++) stale = buffer_version(c->deps[k]) != c->dep_ver[k];
    if (stale) {
      for (int k = 0; k < c->ndeps; k++) c->dep_ver[k] = buffer_version(c->deps[k]);
    } else {
      kept = tg_xmalloc((size_t)c->n);
      for (int i = 0; i < c->n; i++) kept[i] = !c->hoisted[i];
      run = kept;
    }
  }
  if (c->serial) pthread_mutex_lock(c->serial);
  cpu_background_pause(true);
  int g = graph_replay(c, run, from, to, n, vars, vals, nvars);
  tg_status st = g > 0 ? TG_OK : g < 0 ? tg_last_status() : run_items(c, run, from, to, n, c->pin, vars, vals, nvars);
  cpu_background_pause(false);
  if (c->serial) pthread_mutex_unlock(c->serial);
  if (c->nhoisted) c->fresh = st == TG_OK; /* a failed run may have left a pin half written */
  free(kept);
  return st;
}

/* ---- pruning (TinyJit prune) ----
 * A buffer is named by a key: a persistent buffer by its pointer, transient slot s by 2s+1 (odd,
 * never a Buffer's address). */
static uint64_t item_key(const CapItem *it, int j) {
  return it->bufs[j] ? (uint64_t)(uintptr_t)it->bufs[j] : 2u * (uint64_t)it->slot[j] + 1u;
}

/* Which items a replay must run (tinygrad's prune rule and its closure). hoist: also every item
 * that writes a persistent buffer (a state update, an output), is a collective, takes variables or
 * reads memory the caller owns (tg_from_blob), with what depends on it, must run. Returns keep[]
 * (malloc'd, c->n entries). */
static bool *capture_keep(const Capture *c, Buffer *const *inputs, int n, bool hoist) {
  bool *keep = tg_xcalloc((size_t)c->n + 1, sizeof(bool));
  /* 1. tinygrad's rule: in order, an item that touches a buffer that depends on the inputs depends
   * on them too, and so does everything it touches */
  PtrMap dep, wr, first_read;
  pm_init(&dep), pm_init(&wr), pm_init(&first_read);
  for (int k = 0; k < n; k++) pm_put(&dep, (uint64_t)(uintptr_t)inputs[k], (void *)1);
  for (int i = 0; i < c->n; i++) {
    const CapItem *it = &c->items[i];
    if (hoist) {
      keep[i] = it->coll || it->bufs[0] || (it->code && it->code->nvars);
      for (int j = 1; j < it->nbufs && !keep[i]; j++) keep[i] = it->bufs[j] && buffer_foreign(it->bufs[j]);
    }
    for (int j = 0; j < it->nbufs && !keep[i]; j++) keep[i] = pm_has(&dep, item_key(it, j));
    if (keep[i])
      for (int j = 0; j < it->nbufs; j++) pm_put(&dep, item_key(it, j), (void *)1);
  }
  /* 2. a dropped item runs once, so what it reads must not change between replays and what it
   * writes must not be overwritten by a replay: keep it when it reads or writes a buffer a kept
   * item writes, or writes a persistent buffer a kept item read before it (that reader sees the
   * previous call's value) */
  bool changed = true;
  while (changed) {
    changed = false;
    pm_clear(&wr);
    pm_clear(&first_read);
    for (int i = 0; i < c->n; i++) {
      if (!keep[i]) continue;
      const CapItem *it = &c->items[i];
      pm_put(&wr, item_key(it, 0), (void *)1);
      for (int j = 1; j < it->nbufs; j++)
        if (!pm_has(&first_read, item_key(it, j))) pm_put(&first_read, item_key(it, j), (void *)(intptr_t)(i + 1));
    }
    for (int i = 0; i < c->n; i++) {
      if (keep[i]) continue;
      const CapItem *it = &c->items[i];
      bool k = pm_has(&wr, item_key(it, 0));
      for (int j = 1; j < it->nbufs && !k; j++) k = pm_has(&wr, item_key(it, j));
      intptr_t r = (intptr_t)pm_get(&first_read, item_key(it, 0));
      if (!k && it->bufs[0] && r > 0 && r - 1 < i) k = true;
      if (k) keep[i] = changed = true;
    }
    /* the members of an NCCL group run together: all kept or none */
    for (int i = 0; i < c->n; i++)
      for (int j = 0; keep[i] && c->items[i].group && j < c->n; j++)
        if (!keep[j] && c->items[j].group == c->items[i].group) keep[j] = changed = true;
  }
  pm_free(&dep), pm_free(&wr), pm_free(&first_read);
  return keep;
}

int capture_prune(Capture *c, Buffer *const *inputs, int n) {
  capture_graph_drop(c);
  if (c->n == 0) return 0;
  TG_ASSERT(!c->nhoisted);
  bool *keep = capture_keep(c, inputs, n, false);
  /* 3. a transient a dropped item writes and a kept one reads becomes a persistent buffer
   * (pinned); the dropped items that produce it run once more now, the capture having freed it */
  Buffer **pin = c->nslots ? tg_xcalloc((size_t)c->nslots, sizeof(Buffer *)) : NULL;
  bool *need = c->nslots ? tg_xcalloc((size_t)c->nslots, sizeof(bool)) : NULL;
  bool *rerun = tg_xcalloc((size_t)c->n, sizeof(bool));
  bool any_rerun = false;
  for (int i = 0; i < c->n; i++)
    for (int j = 0; keep[i] && c->items[i].slot && j < c->items[i].nbufs; j++) {
      int s = c->items[i].slot[j];
      if (s >= 0) need[s] = true;
    }
  tg_status st = TG_OK;
  for (int s = 0; s < c->nslots; s++) {
    bool dropped_writer = false;
    for (int i = 0; i < c->n && !dropped_writer; i++)
      dropped_writer = !keep[i] && c->items[i].slot && c->items[i].slot[0] == s;
    if (!need[s] || !dropped_writer) {
      need[s] = false;
      continue;
    }
    if (st == TG_OK && !(pin[s] = buffer_new_like(c->slots[s].dev, c->slots[s].nbytes, c->slots[s].img_w, c->slots[s].img_h))) st = tg_last_status();
  }
  /* the producers of the pinned slots, and of the transients those read, backwards */
  for (int i = c->n - 1; i >= 0; i--) {
    const CapItem *it = &c->items[i];
    if (keep[i] || !it->slot || it->slot[0] < 0 || !need[it->slot[0]]) continue;
    rerun[i] = any_rerun = true;
    for (int j = 1; j < it->nbufs; j++)
      if (it->slot[j] >= 0) need[it->slot[j]] = true;
  }
  if (st == TG_OK && any_rerun) st = run_items(c, rerun, NULL, NULL, 0, pin, NULL, NULL, 0);
  int kept = -1;
  if (st == TG_OK) {
    /* 4. rebuild: only kept items, pinned slots as their buffers, slot lifetimes recomputed */
    int m = 0;
    for (int i = 0; i < c->n; i++) {
      CapItem *it = &c->items[i];
      if (!keep[i]) {
        capitem_free(it);
        continue;
      }
      for (int j = 0; it->slot && j < it->nbufs; j++) {
        int s = it->slot[j];
        if (s >= 0 && pin[s]) {
          it->bufs[j] = buffer_ref(pin[s]);
          it->slot[j] = -1;
        }
      }
      c->items[m++] = *it;
    }
    c->n = m;
    for (int s = 0; s < c->nslots; s++) c->slots[s].first = c->slots[s].last = -1;
    for (int i = 0; i < c->n; i++)
      for (int j = 0; c->items[i].slot && j < c->items[i].nbufs; j++) {
        int s = c->items[i].slot[j];
        if (s < 0) continue;
        if (c->slots[s].first < 0) c->slots[s].first = i;
        c->slots[s].last = i;
      }
    kept = m;
  }
  for (int s = 0; s < c->nslots; s++) buffer_unref(pin[s]);
  free(pin);
  free(need);
  free(rerun);
  free(keep);
  return kept;
}

int capture_hoist(Capture *c, Buffer *const *inputs, int n) {
  capture_graph_drop(c);
  if (c->n == 0 || c->nhoisted) return c->nhoisted;
  bool *keep = capture_keep(c, inputs, n, true);
  int nh = 0;
  for (int i = 0; i < c->n; i++) nh += !keep[i];
  if (!nh) {
    free(keep);
    return 0;
  }
  /* the transients hoisted items write and kept items read live in pinned buffers across replays */
  c->pin = tg_xcalloc((size_t)c->nslots + 1, sizeof(Buffer *));
  bool *hoisted_out = tg_xcalloc((size_t)c->nslots + 1, sizeof(bool)); /* slots a hoisted item writes */
  for (int i = 0; i < c->n; i++)
    if (!keep[i] && c->items[i].slot && c->items[i].slot[0] >= 0) hoisted_out[c->items[i].slot[0]] = true;
  bool ok = true;
  for (int i = 0; i < c->n && ok; i++)
    for (int j = 1; keep[i] && c->items[i].slot && j < c->items[i].nbufs && ok; j++) {
      int s = c->items[i].slot[j];
      if (s < 0 || c->pin[s] || !hoisted_out[s]) continue;
      if (!(c->pin[s] = buffer_new_like(c->slots[s].dev, c->slots[s].nbytes, c->slots[s].img_w, c->slots[s].img_h))) ok = false;
    }
  free(hoisted_out);
  if (!ok) { /* no memory to keep them: the constant work runs on every replay, as without this */
    tg_clear_error();
    for (int s = 0; s < c->nslots; s++) buffer_unref(c->pin[s]);
    free(c->pin);
    c->pin = NULL;
    free(keep);
    return 0;
  }
  /* what the hoisted items read that outlives a replay: the buffers whose versions decide */
  PtrMap seen;
  pm_init(&seen);
  for (int i = 0; i < c->n; i++) {
    const CapItem *it = &c->items[i];
    for (int j = 1; !keep[i] && j < it->nbufs; j++) {
      Buffer *b = it->bufs[j];
      if (!b || pm_has(&seen, (uint64_t)(uintptr_t)b)) continue;
      pm_put(&seen, (uint64_t)(uintptr_t)b, (void *)1);
      c->deps = tg_xrealloc(c->deps, sizeof(Buffer *) * (size_t)(c->ndeps + 1));
      c->deps[c->ndeps++] = buffer_ref(b);
    }
  }
  pm_free(&seen);
  c->dep_ver = tg_xcalloc((size_t)c->ndeps + 1, sizeof(uint64_t));
  c->hoisted = tg_xcalloc((size_t)c->n + 1, sizeof(bool));
  for (int i = 0; i < c->n; i++) c->hoisted[i] = !keep[i];
  c->nhoisted = nh;
  c->fresh = false; /* the capture freed the transients: the first replay computes the pins */
  free(keep);
  return nh;
}

static void print_kernel_line(Device *dev, uint64_t kn, const char *name, int nbufs, size_t mem, double t, uint64_t ops) {
  double us = t * 1e6;
  fprintf(stderr, "*** %-8s %6llu %-32s arg %2d mem %6.3f GB tm %9.2fus/%9.2fms (%8.2f GFLOPS %6.1f GB/s)\n",
          dev->name, (unsigned long long)kn, name, nbufs, (double)mem * 1e-9, us,
          atomic_load_explicit(&g_counters.time_sum_s, memory_order_relaxed) * 1e3, t > 0 ? (double)ops / t * 1e-9 : 0.0, t > 0 ? (double)mem / t * 1e-9 : 0.0);
}

/* Does the kernel take variables (symbolic sizes)? BEAM does not search those: their loops get no
 * optimizations. */
static bool ast_has_vars(UOp *ast) {
  PtrVec v = {0};
  uop_collect(ast, OP_DEFINE_VAR, &v);
  bool any = v.n > 0;
  pv_free(&v);
  return any;
}

static tg_status run_schedule_items(Schedule *s, bool *ran);

/* Runs a schedule with background compiles stopped (their compiler would take cores the kernels use). */
static tg_status run_schedule(Schedule *s) {
  bool *ran = NULL; /* items of NCCL groups run already (with their group's first member) */
  for (int i = 0; i < s->nitems && !ran; i++)
    if (s->items[i].kind == SI_COLLECTIVE && s->items[i].nbufs > 2) ran = tg_xcalloc((size_t)s->nitems, sizeof(bool));
  cpu_background_pause(true);
  tg_status st = run_schedule_items(s, ran);
  cpu_background_pause(false);
  free(ran);
  return st;
}

static _Atomic uint64_t g_next_group = 1;

/* Runs the NCCL allreduce whose first member in the schedule is item i: its other members are the
 * later SI_COLLECTIVE items over the same inputs with the same op (their outputs are allocated now
 * and they are marked in ran[]); a member the schedule does not compute (a realize of some shards
 * only) writes to a temporary buffer, since every GPU of the group must take part. */
static tg_status run_group(Schedule *s, int i, bool *ran, int cap_from) {
  SItem *it = &s->items[i];
  int m = it->nbufs - 1;
  size_t nbytes = s->bufs[it->bufs[0]].nbytes;
  Buffer **out = tg_xcalloc((size_t)m, sizeof(Buffer *)), **in = tg_xcalloc((size_t)m, sizeof(Buffer *));
  Buffer **tmp = tg_xcalloc((size_t)m, sizeof(Buffer *));
  tg_status st = TG_OK;
  for (int k = 0; k < m; k++) in[k] = s->bufs[it->bufs[k + 1]].buf;
  for (int j = i; j < s->nitems && st == TG_OK; j++) {
    SItem *o = &s->items[j];
    if (o->kind != SI_COLLECTIVE || o->nbufs != it->nbufs || o->redop != it->redop || o->root < 0 || o->root >= m ||
        out[o->root] || memcmp(o->bufs + 1, it->bufs + 1, sizeof(int) * (size_t)m))
      continue;
    SBuf *ob = &s->bufs[o->bufs[0]];
    if (!ob->buf && !(ob->buf = buffer_new_like(ob->dev, ob->nbytes, ob->img_w, ob->img_h))) st = tg_last_status();
    out[o->root] = ob->buf;
    ran[j] = true;
  }
  for (int k = 0; k < m && st == TG_OK; k++)
    if (!out[k] && !(out[k] = tmp[k] = buffer_new(in[k]->dev, nbytes))) st = tg_last_status();
  if (st == TG_OK) st = nccl_group_exec(out, in, m, nbytes, (tg_dtype)it->dtype, it->redop);
  if (st == TG_OK) {
    if (g_capture) { /* one item per member, run together at the first on a replay */
      uint64_t gid = atomic_fetch_add(&g_next_group, 1);
      Buffer **cb = tg_xmalloc(sizeof(Buffer *) * (size_t)(m + 1));
      memcpy(cb + 1, in, sizeof(Buffer *) * (size_t)m);
      for (int k = 0; k < m; k++) {
        cb[0] = out[k];
        capture_add(NULL, cb, m + 1, nbytes, 0, NULL);
        CapItem *ci = &g_capture->items[g_capture->n - 1];
        ci->coll = true, ci->root = k, ci->dtype = it->dtype, ci->redop = it->redop, ci->group = gid;
      }
      free(cb);
    }
    for (int k = 0; k < m; k++) counters_add(false, 0, nbytes, 0);
    if (debug_level() >= 2) print_group_line(out, m, nbytes, (tg_dtype)it->dtype, it->redop, false);
  }
  for (int k = 0; k < m; k++) {
    if (!tmp[k]) continue;
    if (g_capture) capture_forget(g_capture, tmp[k], cap_from);
    buffer_unref(tmp[k]);
  }
  free(out), free(in), free(tmp);
  return st;
}

static tg_status run_schedule_items(Schedule *s, bool *ran) {
  int dbg = debug_level();
  int cap_from = g_capture ? g_capture->n : 0;
  if (g_capture && s->sym_unit) g_capture->sym_unit = true;
  if (g_capture && s->sym_baked) g_capture->sym_baked = true;
  int beam = beam_width();
  if (beam <= 0) precompile(s);
  /* out of memory before any kernel ran: nothing was changed yet, so stop here (later, kernels must
   * all run -- an assign done twice on a retry would be wrong -- and realize_uops reports it) */
  if (tg_oom_check("realize (code generation)")) return TG_ERR_RUNTIME;
  for (int i = 0; i < s->nitems; i++) {
    SItem *it = &s->items[i];
    SBuf *out = &s->bufs[it->bufs[0]];
    if (!out->buf) {
      out->buf = buffer_new_like(out->dev, out->nbytes, out->img_w, out->img_h);
      if (!out->buf) return tg_last_status();
    }
    if (it->kind == SI_COPY) {
      SBuf *in = &s->bufs[it->bufs[1]];
      double c0 = viz_on ? now_seconds() : 0;
      tg_status st = buffer_copy(out->buf, in->buf, out->nbytes);
      if (st != TG_OK) return st;
      if (viz_on) viz_copy(i, out->dev, in->dev, out->nbytes, now_seconds() - c0);
      if (g_capture) {
        Buffer *cb[2] = {out->buf, in->buf};
        capture_add(NULL, cb, 2, out->nbytes, 0, NULL);
      }
      counters_add(false, 0, out->nbytes, 0);
      if (dbg >= 2)
        fprintf(stderr, "*** %-8s %6s copy %zu bytes %s -> %s\n", out->dev->name, "", out->nbytes, in->dev->name,
                out->dev->name);
    } else if (it->kind == SI_COLLECTIVE && it->nbufs > 2) {
      if (!ran[i]) {
        tg_status st = run_group(s, i, ran, cap_from);
        if (st != TG_OK) return st;
      }
    } else if (it->kind == SI_COLLECTIVE) {
      SBuf *in = &s->bufs[it->bufs[1]];
      tg_status st = dist_exec(out->buf, in->buf, out->nbytes, (tg_dtype)it->dtype, it->root);
      if (st != TG_OK) return st;
      if (g_capture) {
        Buffer *cb[2] = {out->buf, in->buf};
        capture_add(NULL, cb, 2, out->nbytes, 0, NULL);
        CapItem *ci = &g_capture->items[g_capture->n - 1];
        ci->coll = true, ci->root = it->root, ci->dtype = it->dtype;
      }
      counters_add(false, 0, out->nbytes, 0);
      if (dbg >= 2)
        fprintf(stderr, "*** %-8s %6s %s %s %zu bytes\n", out->dev->name, "", out->dev->vt->stream ? "NCCL" : "MPI",
                it->root == -1 ? "allreduce" : it->root >= 0 ? "broadcast" : "reduce", out->nbytes);
    } else if (out->nbytes > 0) {
      CachedKernel *ck;
      if (beam > 0 && !(s->nvars && ast_has_vars(it->ast)) && !(it->dev->caps.gpu && kc_gopts(it->dev))) {
        Buffer *bb[64];
        Buffer **bp = it->nbufs <= 64 ? bb : tg_xmalloc(sizeof(Buffer *) * (size_t)it->nbufs);
        for (int j = 0; j < it->nbufs; j++) bp[j] = s->bufs[it->bufs[j]].buf;
        ck = get_kernel_beam(it->ast, it->dev, bp, it->nbufs, beam);
        if (bp != bb) free(bp);
      } else {
        ck = get_kernel(it->ast, it->dev);
      }
      if (!ck) {
        if (!tg_last_status()) tg_set_error(TG_ERR_COMPILE, "realize: no kernel could be made for an item on %s", it->dev->name);
        return tg_last_status();
      }
      ck_retain(ck); /* kept while it runs, whatever the cache drops meanwhile */
      void *ptrs[16];
      int nv = ck->code->nvars;
      void **bufs = it->nbufs + nv <= 16 ? ptrs : tg_xmalloc(sizeof(void *) * (size_t)(it->nbufs + nv));
      int64_t vb[16];
      int64_t *vals = nv <= 16 ? vb : tg_xmalloc(sizeof(int64_t) * (size_t)nv);
      size_t mem = 0;
      for (int j = 0; j < it->nbufs; j++) {
        bufs[j] = s->bufs[it->bufs[j]].buf->ptr;
        mem += s->bufs[it->bufs[j]].nbytes;
      }
      /* the kernel's variables take their bound values, passed after the buffers */
      for (int k = 0; k < nv; k++) {
        vals[k] = 0;
        for (int q = 0; q < s->nvars; q++)
          if (s->vars[q] == ck->code->vars[k]) vals[k] = s->vals[q];
        bufs[it->nbufs + k] = (void *)(intptr_t)vals[k];
      }
      buffer_written(out->buf);
      double t = program_exec(ck->prg, bufs, it->nbufs, nv, ck->code->global_size, ck->code->local_size, dbg >= 2 || viz_on);
      if (bufs != ptrs) free(bufs);
      if (t >= 0 && viz_on) viz_run(i, it->dev, ck->code, it->ast, t, mem);
      if (g_capture) {
        Buffer *cb[64];
        Buffer **cbp = it->nbufs <= 64 ? cb : tg_xmalloc(sizeof(Buffer *) * (size_t)it->nbufs);
        for (int j = 0; j < it->nbufs; j++) cbp[j] = s->bufs[it->bufs[j]].buf;
        capture_add(ck, cbp, it->nbufs, 0, mem, vals);
        if (cbp != cb) free(cbp);
      }
      if (vals != vb) free(vals);
      if (t < 0) {
        ck_release(ck);
        return tg_last_status() ? tg_last_status() : TG_ERR_RUNTIME;
      }
      uint64_t kn = counters_add(true, ck->code->ops, mem, dbg >= 2 ? t : 0);
      if (dbg >= 2) print_kernel_line(it->dev, kn, ck->code->name, it->nbufs, mem, t, ck->code->ops);
      ck_release(ck);
    }
    /* free inputs that die here (targets and pre-existing buffers are kept) */
    for (int j = 1; j < it->nbufs; j++) {
      SBuf *b = &s->bufs[it->bufs[j]];
      if (!b->keep && b->last_use == i && b->buf) {
        if (g_capture) capture_forget(g_capture, b->buf, cap_from);
        buffer_unref(b->buf);
        b->buf = NULL;
      }
    }
  }
  return TG_OK;
}

/* One realize at a time in the process: scheduling writes ->realized on nodes that other threads'
 * graphs share, and two schedules of one node would compute it twice. Each realize still uses every
 * core (the thread pool). Recursive: a TinyJit capture realizes inside a realize's caller. */
static pthread_mutex_t realize_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

typedef struct {
  PtrMap *cand;
  Schedule *s;
  int **out, *n;
} HeldScan;

/* One live handle's node: a candidate it holds is kept (and listed once). */
static void held_visit(void *ctx, UOp *u) {
  HeldScan *h = ctx;
  intptr_t b = (intptr_t)pm_get(h->cand, (uint64_t)(uintptr_t)u);
  if (!b || h->s->bufs[b - 1].keep) return;
  h->s->bufs[b - 1].keep = true;
  *h->out = tg_xrealloc(*h->out, sizeof(int) * (size_t)(*h->n + 2));
  (*h->out)[(*h->n)++] = (int)(b - 1);
  (*h->out)[*h->n] = -1;
}

/* As tinygrad does, a contiguous() that a kernel of this schedule computes on the way to the targets
 * is kept when a live handle holds it: the handle gets the buffer, so using it again (c * 2 after
 * c + 1, an Embedding weight made by zeros_like(...).contiguous()) costs no kernel to recompute it.
 * Marks those buffers kept and returns their sbuf indices, -1 terminated (NULL if none). Not while a
 * TinyJit capture plans the intermediates' memory: a replay may reuse such a buffer. */
static int *keep_held_contiguous(Schedule *s, const RealizeHooks *hooks) {
  if (g_capture) return NULL;
  int *out = NULL, n = 0;
  PtrMap cand;
  pm_init(&cand);
  for (int i = 0; i < s->nbufs; i++) {
    UOp *u = s->bufs[i].node;
    if (!s->bufs[i].keep && u && u->op == OP_CONTIGUOUS && u->arg.i == 0 && !uop_realized(u))
      pm_put(&cand, (uint64_t)(uintptr_t)u, (void *)(intptr_t)(i + 1));
  }
  if (cand.len) {
    HeldScan hs = {&cand, s, &out, &n};
    hooks->each_held(held_visit, &hs);
  }
  pm_free(&cand);
  return out;
}

static tg_status realize_locked(UOp **targets, int n, const RealizeHooks *hooks) {
  /* only nodes that are neither realized nor plain views of a buffer need work */
  UOp **todo = tg_xmalloc(sizeof(UOp *) * (size_t)(n + 1));
  int m = 0;
  for (int i = 0; i < n; i++) {
    UOp *t = targets[i];
    if (uop_realized(t) || g_base_buffer(t)) continue;
    bool dup = false;
    for (int j = 0; j < m && !dup; j++) dup = todo[j] == t;
    if (!dup) todo[m++] = t;
  }
  if (m == 0) {
    free(todo);
    return TG_OK;
  }
  Schedule s;
  int *tbuf = tg_xmalloc(sizeof(int) * (size_t)m);
  /* a graph of the structure of one realized before reuses its schedule (not while a TinyJit capture
   * plans memory: its replays hold on to the buffers the schedule hands out) */
  SchedKey *key = g_capture ? NULL : schedule_key(todo, m);
  tg_status st = TG_OK;
  if (!key || !schedule_from_cache(key, &s, tbuf)) {
    st = schedule_build(&s, todo, m, tbuf);
    if (st == TG_OK && key) schedule_cache_put(key, &s, tbuf);
  }
  schedule_key_free(key);
  if (st == TG_OK && tg_oom_check("realize (scheduling)")) st = TG_ERR_RUNTIME;
  int *held = st == TG_OK ? keep_held_contiguous(&s, hooks) : NULL;
  if (st == TG_OK && viz_on) viz_schedule(&s, todo, m);
  tg_counters before = tg_global_counters();
  double t0 = now_seconds();
  if (st == TG_OK) st = run_schedule(&s);
  if (debug_level() >= 2)
    fprintf(stderr, "realize: %d items, %llu kernels, %.3f MFLOP, %.3f MB moved, %.3f ms\n", s.nitems,
            (unsigned long long)(tg_global_counters().kernel_count - before.kernel_count),
            (double)(tg_global_counters().global_ops - before.global_ops) * 1e-6,
            (double)(tg_global_counters().global_mem - before.global_mem) * 1e-6, (now_seconds() - t0) * 1e3);
  /* the tensor layer hands the results to its handles (and autograd) while the lock is held */
  if (st == TG_OK) {
    for (int i = 0; i < m; i++)
      if (tbuf[i] >= 0) hooks->computed(todo[i], s.bufs[tbuf[i]].buf);
    for (int i = 0; held && held[i] >= 0; i++) {
      SBuf *sb = &s.bufs[held[i]];
      if (sb->buf && !sb->node->realized) hooks->kept(sb->node, sb->buf);
    }
    /* assigns carried out on the way (a kernel needed their result) are done too: handles holding
     * them must not run them again */
    for (int i = 0; i < s.nassigns; i++)
      if (!uop_realized(s.assigns[i])) hooks->assigned(s.assigns[i], s.bufs[s.assign_bufs[i]].buf);
  }
  /* the results are right (the reserve carried the run through), but the failure is reported */
  if (tg_oom_check("realize") && st == TG_OK) st = TG_ERR_RUNTIME;
  schedule_free(&s);
  free(held);
  free(tbuf);
  free(todo);
  return st;
}

tg_status engine_realize(UOp **targets, int n, const RealizeHooks *hooks) {
  pthread_mutex_lock(&realize_lock);
  tg_status st = realize_locked(targets, n, hooks);
  pthread_mutex_unlock(&realize_lock);
  return st;
}
