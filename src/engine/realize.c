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
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../codegen/codegen.h"
#include "engine.h"
#include "../schedule/schedule.h"
#include "../uop/ptrmap.h"

typedef struct {
  UOp *ast;  /* owned key */
  Program *prg;
  KernelCode *code;
} CachedKernel;

static PtrMap kcache; /* AST pointer -> CachedKernel* (per device kind: CPU only today) */
static pthread_mutex_t kc_lock = PTHREAD_MUTEX_INITIALIZER;

bool beam_search(UOp *ast, Device *dev, Buffer **bufs, int nbufs, int beam, OptCfg *out);

static CachedKernel *kcache_get(uint64_t key) {
  pthread_mutex_lock(&kc_lock);
  CachedKernel *ck = pm_get(&kcache, key);
  pthread_mutex_unlock(&kc_lock);
  return ck;
}

/* Loads kc's program (compiling it unless a batch already did) and caches it under key. Takes kc.
 * NULL with the error recorded if it does not compile. */
static CachedKernel *kcache_put(uint64_t key, UOp *ast, Device *dev, KernelCode *kc) {
  if (!kc) return NULL;
  if (debug_level() >= 4) fprintf(stderr, "%s\n", kc->src);
  Program *p = program_get(dev, kc->name, kc->src);
  if (!p) {
    kernel_code_free(kc);
    return NULL;
  }
  CachedKernel *ck = tg_xcalloc(1, sizeof *ck);
  ck->ast = uop_ref(ast);
  ck->prg = p;
  ck->code = kc;
  /* the source stays (a few KB per kernel): tg_jit_export writes the captured kernels' sources */
  pthread_mutex_lock(&kc_lock);
  CachedKernel *had = pm_get(&kcache, key);
  if (had) {
    uop_unref(ck->ast);
    kernel_code_free(ck->code);
    free(ck);
    ck = had;
  } else {
    pm_put(&kcache, key, ck);
  }
  pthread_mutex_unlock(&kc_lock);
  return ck;
}

/* The cache key of a kernel: its AST, and the settings that change the code generated for it
 * (NOOPT, LOOP_BOUNDS), so that turning one of them on in a context compiles anew. */
static uint64_t kkey(UOp *ast) {
  uint64_t v = (getenv_int("NOOPT", 0) ? 1u : 0u) | (getenv_int("LOOP_BOUNDS", 1) ? 0u : 2u);
  return (uint64_t)(uintptr_t)ast ^ (v << 60);
}

/* BEAM>0: the kernel compiled with the searched optimizations (cached per AST and beam width). */
static CachedKernel *get_kernel_beam(UOp *ast, Device *dev, Buffer **bufs, int nbufs, int beam) {
  uint64_t key = kkey(ast) ^ ((uint64_t)beam << 56) ^ 1;
  CachedKernel *ck = kcache_get(key);
  if (ck) return ck;
  OptCfg cfg;
  KernelCode *kc = beam_search(ast, dev, bufs, nbufs, beam, &cfg) ? codegen_c_cfg(ast, &cfg) : NULL;
  return kcache_put(key, ast, dev, kc ? kc : codegen_c(ast));
}

static CachedKernel *get_kernel(UOp *ast, Device *dev) {
  uint64_t key = kkey(ast);
  CachedKernel *ck = kcache_get(key);
  return ck ? ck : kcache_put(key, ast, dev, codegen_c(ast));
}

/* ---- parallel compilation: kernels a schedule needs that are not cached yet are compiled on all
 * cores before it runs (codegen stays on this thread; compiling is the slow part) ---- */
typedef struct {
  UOp *ast;
  Device *dev;
  KernelCode *kc;
} CJob;
typedef struct {
  CJob *jobs;
  int n;
} CJobs;

typedef struct {
  CJobs *js;
  int first, stride;
} CGroup;

/* One compiler run for every stride-th job starting at first (batched compilation). */
static void *compile_group(void *arg) {
  CGroup *g = arg;
  CJobs *js = g->js;
  int m = 0;
  const char **names = tg_xmalloc(sizeof(char *) * (size_t)(js->n + 1)), **srcs = tg_xmalloc(sizeof(char *) * (size_t)(js->n + 1));
  Device *dev = NULL;
  for (int i = g->first; i < js->n; i += g->stride) {
    if (!js->jobs[i].kc) continue;
    if (dev && js->jobs[i].dev != dev) continue; /* one device per batch; others compile singly */
    dev = js->jobs[i].dev;
    names[m] = js->jobs[i].kc->name;
    srcs[m++] = js->jobs[i].kc->src;
    /* bounded translation units: the compiler's cost per unit grows with its size */
    if (m == 24) {
      program_get_batch(dev, names, srcs, m);
      m = 0;
    }
  }
  if (m) program_get_batch(dev, names, srcs, m);
  free(names), free(srcs);
  return NULL;
}

static void precompile(Schedule *s) {
  CJobs js = {0};
  PtrMap seen;
  pm_init(&seen);
  for (int i = 0; i < s->nitems; i++) {
    SItem *it = &s->items[i];
    if (it->kind != SI_KERNEL || pm_has(&seen, (uint64_t)(uintptr_t)it->ast)) continue;
    pm_put(&seen, (uint64_t)(uintptr_t)it->ast, (void *)1);
    if (kcache_get(kkey(it->ast))) continue;
    js.jobs = tg_xrealloc(js.jobs, sizeof(CJob) * (size_t)(js.n + 1));
    js.jobs[js.n++] = (CJob){it->ast, it->dev, NULL};
  }
  pm_free(&seen);
  if (js.n >= 2) {
    for (int i = 0; i < js.n; i++) js.jobs[i].kc = codegen_c(js.jobs[i].ast);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = (int)(ncpu < 1 ? 1 : ncpu > 16 ? 16 : ncpu);
    if (nt > js.n) nt = js.n;
    pthread_t th[16];
    CGroup groups[16];
    bool started[16] = {false};
    for (int t = 0; t < nt; t++) groups[t] = (CGroup){&js, t, nt};
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&th[t], NULL, compile_group, &groups[t]) == 0;
    compile_group(&groups[0]);
    for (int t = 1; t < nt; t++) {
      if (started[t]) pthread_join(th[t], NULL);
      else compile_group(&groups[t]);
    }
    /* the batches loaded the programs; a kernel that failed in its batch compiles alone here, and
     * one that fails again is left for the run loop, which reports its error */
    for (int i = 0; i < js.n; i++)
      if (js.jobs[i].kc && !kcache_put(kkey(js.jobs[i].ast), js.jobs[i].ast, js.jobs[i].dev, js.jobs[i].kc))
        tg_clear_error();
  }
  free(js.jobs);
}

_Thread_local Capture *g_capture;

static void capture_add(Program *prg, const KernelCode *code, Buffer **bufs, int nbufs, size_t nbytes, size_t mem) {
  Capture *c = g_capture;
  if (c->n == c->cap) {
    c->cap = c->cap ? c->cap * 2 : 32;
    c->items = tg_xrealloc(c->items, sizeof(CapItem) * (size_t)c->cap);
  }
  CapItem *it = &c->items[c->n++];
  it->prg = prg;
  it->code = code;
  it->nbufs = nbufs;
  it->nbytes = nbytes;
  it->mem = mem;
  it->slot = NULL;
  it->bufs = tg_xmalloc(sizeof(Buffer *) * (size_t)nbufs);
  for (int i = 0; i < nbufs; i++) it->bufs[i] = buffer_ref(bufs[i]);
}

bool engine_capturing(void) { return g_capture != NULL; }

static void capitem_free(CapItem *it) {
  for (int j = 0; j < it->nbufs; j++) buffer_unref(it->bufs[j]);
  free(it->bufs);
  free(it->slot);
}

void capture_free(Capture *c) {
  for (int i = 0; i < c->n; i++) capitem_free(&c->items[i]);
  free(c->items);
  free(c->slots);
  memset(c, 0, sizeof *c);
}

void capture_forget(Capture *c, Buffer *b, int from) {
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
        c->slots[s] = (CapSlot){b->nbytes, b->dev, i, i};
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

/* Runs the items of c that run[] selects (all when run is NULL), buffers from[k] replaced by to[k].
 * A transient slot s runs in pin[s] when pin is given and pin[s] is set (the caller keeps it), else
 * in a buffer allocated at its first use and freed after its last item. Counts every item in the
 * global counters as the captured run counted it. */
static tg_status run_items(const Capture *c, const bool *run, Buffer *const *from, Buffer *const *to, int n,
                           Buffer *const *pin) {
  int dbg = debug_level();
  Buffer **live = c->nslots ? tg_xcalloc((size_t)c->nslots, sizeof(Buffer *)) : NULL;
  tg_status st = TG_OK;
  for (int i = 0; i < c->n && st == TG_OK; i++) {
    if (run && !run[i]) continue;
    const CapItem *it = &c->items[i];
    Buffer *bs[64];
    Buffer **b = it->nbufs <= 64 ? bs : tg_xmalloc(sizeof(Buffer *) * (size_t)it->nbufs);
    for (int j = 0; j < it->nbufs; j++) {
      int s = it->slot ? it->slot[j] : -1;
      if (s >= 0) {
        if (pin && pin[s]) {
          b[j] = pin[s];
          continue;
        }
        if (!live[s] && !(live[s] = buffer_new(c->slots[s].dev, c->slots[s].nbytes))) st = tg_last_status();
        b[j] = live[s];
        continue;
      }
      b[j] = it->bufs[j];
      /* one substitution per buffer: with inputs swapped between calls, to[k] may be another from[] */
      for (int k = 0; k < n; k++)
        if (b[j] == from[k]) {
          b[j] = to[k];
          break;
        }
    }
    if (st != TG_OK) {
      if (b != bs) free(b);
      break;
    }
    if (!it->prg) {
      st = buffer_copy(b[0], b[1], it->nbytes);
      if (st == TG_OK) counters_add(false, 0, it->nbytes, 0);
    } else {
      void *ps[64];
      void **p = it->nbufs <= 64 ? ps : tg_xmalloc(sizeof(void *) * (size_t)it->nbufs);
      for (int j = 0; j < it->nbufs; j++) p[j] = b[j]->ptr;
      double t = program_exec(it->prg, p, it->nbufs, it->code->global_size, it->code->local_size, dbg >= 2);
      if (p != ps) free(p);
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
  return st;
}

tg_status capture_replay(const Capture *c, Buffer *const *from, Buffer *const *to, int n) {
  return run_items(c, NULL, from, to, n, NULL);
}

/* ---- pruning (TinyJit prune) ----
 * A buffer is named by a key: a persistent buffer by its pointer, transient slot s by 2s+1 (odd,
 * never a Buffer's address). */
static uint64_t item_key(const CapItem *it, int j) {
  return it->bufs[j] ? (uint64_t)(uintptr_t)it->bufs[j] : 2u * (uint64_t)it->slot[j] + 1u;
}

int capture_prune(Capture *c, Buffer *const *inputs, int n) {
  if (c->n == 0) return 0;
  bool *keep = tg_xcalloc((size_t)c->n, sizeof(bool));
  /* 1. tinygrad's rule: in order, an item that touches a buffer that depends on the inputs depends
   * on them too, and so does everything it touches */
  PtrMap dep, wr, first_read;
  pm_init(&dep), pm_init(&wr), pm_init(&first_read);
  for (int k = 0; k < n; k++) pm_put(&dep, (uint64_t)(uintptr_t)inputs[k], (void *)1);
  for (int i = 0; i < c->n; i++) {
    const CapItem *it = &c->items[i];
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
  }
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
    if (st == TG_OK && !(pin[s] = buffer_new(c->slots[s].dev, c->slots[s].nbytes))) st = tg_last_status();
  }
  /* the producers of the pinned slots, and of the transients those read, backwards */
  for (int i = c->n - 1; i >= 0; i--) {
    const CapItem *it = &c->items[i];
    if (keep[i] || !it->slot || it->slot[0] < 0 || !need[it->slot[0]]) continue;
    rerun[i] = any_rerun = true;
    for (int j = 1; j < it->nbufs; j++)
      if (it->slot[j] >= 0) need[it->slot[j]] = true;
  }
  if (st == TG_OK && any_rerun) st = run_items(c, rerun, NULL, NULL, 0, pin);
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
  pm_free(&dep), pm_free(&wr), pm_free(&first_read);
  return kept;
}

static void print_kernel_line(Device *dev, uint64_t kn, const char *name, int nbufs, size_t mem, double t, uint64_t ops) {
  double us = t * 1e6;
  fprintf(stderr, "*** %-8s %6llu %-32s arg %2d mem %6.3f GB tm %9.2fus/%9.2fms (%8.2f GFLOPS %6.1f GB/s)\n",
          dev->name, (unsigned long long)kn, name, nbufs, (double)mem * 1e-9, us,
          atomic_load_explicit(&g_counters.time_sum_s, memory_order_relaxed) * 1e3, t > 0 ? (double)ops / t * 1e-9 : 0.0, t > 0 ? (double)mem / t * 1e-9 : 0.0);
}

static tg_status run_schedule(Schedule *s) {
  int dbg = debug_level();
  int cap_from = g_capture ? g_capture->n : 0;
  int beam = (int)getenv_int("BEAM", 0);
  if (beam <= 0) precompile(s);
  for (int i = 0; i < s->nitems; i++) {
    SItem *it = &s->items[i];
    SBuf *out = &s->bufs[it->bufs[0]];
    if (!out->buf) {
      out->buf = buffer_new(out->dev, out->nbytes);
      if (!out->buf) return tg_last_status();
    }
    if (it->kind == SI_COPY) {
      SBuf *in = &s->bufs[it->bufs[1]];
      tg_status st = buffer_copy(out->buf, in->buf, out->nbytes);
      if (st != TG_OK) return st;
      if (g_capture) {
        Buffer *cb[2] = {out->buf, in->buf};
        capture_add(NULL, NULL, cb, 2, out->nbytes, 0);
      }
      counters_add(false, 0, out->nbytes, 0);
      if (dbg >= 2)
        fprintf(stderr, "*** %-8s %6s copy %zu bytes %s -> %s\n", out->dev->name, "", out->nbytes, in->dev->name,
                out->dev->name);
    } else if (out->nbytes > 0) {
      CachedKernel *ck;
      if (beam > 0) {
        Buffer *bb[64];
        Buffer **bp = it->nbufs <= 64 ? bb : tg_xmalloc(sizeof(Buffer *) * (size_t)it->nbufs);
        for (int j = 0; j < it->nbufs; j++) bp[j] = s->bufs[it->bufs[j]].buf;
        ck = get_kernel_beam(it->ast, it->dev, bp, it->nbufs, beam);
        if (bp != bb) free(bp);
      } else {
        ck = get_kernel(it->ast, it->dev);
      }
      if (!ck) return tg_last_status();
      void *ptrs[16];
      void **bufs = it->nbufs <= 16 ? ptrs : tg_xmalloc(sizeof(void *) * (size_t)it->nbufs);
      size_t mem = 0;
      for (int j = 0; j < it->nbufs; j++) {
        bufs[j] = s->bufs[it->bufs[j]].buf->ptr;
        mem += s->bufs[it->bufs[j]].nbytes;
      }
      double t = program_exec(ck->prg, bufs, it->nbufs, ck->code->global_size, ck->code->local_size, dbg >= 2);
      if (bufs != ptrs) free(bufs);
      if (g_capture) {
        Buffer *cb[64];
        Buffer **cbp = it->nbufs <= 64 ? cb : tg_xmalloc(sizeof(Buffer *) * (size_t)it->nbufs);
        for (int j = 0; j < it->nbufs; j++) cbp[j] = s->bufs[it->bufs[j]].buf;
        capture_add(ck->prg, ck->code, cbp, it->nbufs, 0, mem);
        if (cbp != cb) free(cbp);
      }
      if (t < 0) return tg_last_status() ? tg_last_status() : TG_ERR_RUNTIME;
      uint64_t kn = counters_add(true, ck->code->ops, mem, dbg >= 2 ? t : 0);
      if (dbg >= 2) print_kernel_line(it->dev, kn, ck->code->name, it->nbufs, mem, t, ck->code->ops);
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

tg_status realize_uops(UOp **targets, int n) {
  /* only nodes that are neither realized nor plain views of a buffer need work */
  UOp **todo = tg_xmalloc(sizeof(UOp *) * (size_t)(n + 1));
  int m = 0;
  for (int i = 0; i < n; i++) {
    UOp *t = targets[i];
    if (t->realized || g_base_buffer(t)) continue;
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
  tg_status st = schedule_build(&s, todo, m, tbuf);
  tg_counters before = tg_global_counters();
  double t0 = now_seconds();
  if (st == TG_OK) st = run_schedule(&s);
  if (debug_level() >= 2)
    fprintf(stderr, "realize: %d items, %llu kernels, %.3f MFLOP, %.3f MB moved, %.3f ms\n", s.nitems,
            (unsigned long long)(tg_global_counters().kernel_count - before.kernel_count),
            (double)(tg_global_counters().global_ops - before.global_ops) * 1e-6,
            (double)(tg_global_counters().global_mem - before.global_mem) * 1e-6, (now_seconds() - t0) * 1e3);
  if (st == TG_OK) {
    for (int i = 0; i < m; i++) {
      UOp *t = todo[i];
      if (tbuf[i] < 0) continue;
      Buffer *b = s.bufs[tbuf[i]].buf;
      UOp *bn = g_buffer(buffer_ref(b), (tg_dtype)t->dtype, t->shape, t->ndim);
      t->realized = bn; /* owned by t */
      /* handles now hold bn; bn keeps t's graph for autograd when a gradient may flow through it */
      if (t_replace_everywhere(t, bn) > 0) ag_attach_history(bn, t);
    }
    /* assigns carried out on the way (a kernel needed their result) are done too: handles holding
     * them must not run them again */
    for (int i = 0; i < s.nassigns; i++) {
      UOp *a = s.assigns[i];
      if (a->realized) continue;
      UOp *bn = g_buffer(buffer_ref(s.bufs[s.assign_bufs[i]].buf), (tg_dtype)a->dtype, a->shape, a->ndim);
      a->realized = bn;
      t_replace_everywhere(a, bn);
    }
  }
  schedule_free(&s);
  free(tbuf);
  free(todo);
  return st;
}
