/*
 * schedcache.c -- the schedule cache: a realize of a graph with the same structure as an earlier one
 * reuses that one's schedule instead of fusing and building its kernels again.
 *
 * Hash-consing makes two builds of one expression over the same buffers one node, but a loop that
 * builds ((a + 1) * 2).relu().sum(), realizes it and drops it makes new nodes every time (the old
 * ones are freed), and an expression over new buffers (each step's batch) is new anyway. The
 * schedule is a function of the graph's structure alone, with the leaf buffers as placeholders, as in
 * tinygrad's schedule cache: which buffers are the same one, their sizes, devices and image shapes,
 * and the nodes above them. So the graph is written out as a list of words in post-order (op, dtype,
 * arguments, shape, device, the sources' positions; a leaf as its buffer's class: the first, second,
 * ... distinct Buffer met), and a realize whose list equals a cached one's gets a copy of that
 * schedule with its own buffers and nodes put in the placeholders' places.
 *
 * Not cached: graphs with assigns (their ordering depends on which buffers other kernels read),
 * symbolic sizes (the variables' values are part of the schedule), more than SCHED_NODES nodes (the
 * list would cost what it saves), and anything realized while a TinyJit capture plans its memory.
 * At most SCHED_ENTRIES schedules and SCHED_WORDS key words are kept, least recently used out first.
 * SCACHE=0 turns the cache off (tinygrad's name). The settings schedule_build reads (DEPTH_SPLIT,
 * FUSE_WINDOW) are part of the key.
 *
 * The cache holds kernel ASTs (as the kernel cache does), never graph nodes or buffers. Callers hold
 * the realize lock, which serializes every use.
 */
#include <string.h>

#include "schedule.h"

#define SCHED_NODES 4096   /* larger graphs are not cached */
#define SCHED_ENTRIES 256  /* schedules kept, least recently used out first */
#define SCHED_WORDS (4 << 20) /* and at most this many key words (32 MB) over all of them */

typedef struct {
  Device *dev;
  size_t nbytes;
  int last_use;
  bool keep;
  int64_t img_w, img_h;
  int cls;  /* a buffer that existed before: its class (index into the key's classes), else -1 */
  int node; /* the node: -1 none, 2k node k of the key's list, 2k+1 the realized BUFFER node of leaf k */
} TBuf;

typedef struct Entry {
  uint64_t hash;
  uint64_t *words;
  size_t nw;
  SItem *items; /* as schedule_build made them (ASTs owned by the entry) */
  int nitems;
  TBuf *bufs;
  int nbufs;
  int *tbuf;
  int ntargets;
  struct Entry *prev, *next; /* LRU, most recent first */
} Entry;

struct SchedKey {
  uint64_t hash;
  uint64_t *words;
  size_t nw, capw;
  UOp **nodes; /* in post-order; node->kpos is its position while node->kmark == epoch */
  int nn, capn;
  uint32_t epoch;
  PtrMap bpos; /* a realized leaf's BUFFER node -> the leaf's position + 1 */
  Buffer **cls;
  int ncls, capcls;
  PtrMap clsof; /* Buffer* -> class + 1 */
  int ntargets;
};

static PtrMap g_entries; /* hash -> Entry* */
static Entry g_lru = {.prev = &g_lru, .next = &g_lru};
static int g_nentries;
static size_t g_nwords; /* key words held by all entries */
static uint64_t g_hits;

static void grow_words(SchedKey *k) {
  k->capw = k->capw ? k->capw * 2 : 256;
  k->words = tg_xrealloc(k->words, sizeof(uint64_t) * k->capw);
}

static inline void put_word(SchedKey *k, uint64_t w) {
  if (__builtin_expect(k->nw == k->capw, 0)) grow_words(k);
  k->words[k->nw++] = w;
}

static int buffer_class(SchedKey *k, Buffer *b) {
  intptr_t c = (intptr_t)pm_get(&k->clsof, (uint64_t)(uintptr_t)b);
  if (c) return (int)c - 1;
  if (k->ncls == k->capcls) {
    k->capcls = k->capcls ? k->capcls * 2 : 16;
    k->cls = tg_xrealloc(k->cls, sizeof(Buffer *) * (size_t)k->capcls);
  }
  k->cls[k->ncls] = b;
  pm_put(&k->clsof, (uint64_t)(uintptr_t)b, (void *)(intptr_t)(k->ncls + 1));
  return k->ncls++;
}

static void put_shape(SchedKey *k, const UOp *u) {
  put_word(k, (uint64_t)u->ndim);
  for (int d = 0; d < u->ndim; d++) put_word(k, (uint64_t)u->shape[d]);
}

/* A BUFFER node: what the schedule sees of it (its Buffer only as a class). */
static void put_buffer_node(SchedKey *k, UOp *b) {
  Buffer *buf = g_buffer_of(b);
  put_word(k, (uint64_t)b->dtype | (uint64_t)(uint32_t)b->device << 8);
  put_shape(k, b);
  put_word(k, (uint64_t)buffer_class(k, buf));
  put_word(k, (uint64_t)buf->nbytes);
  put_word(k, (uint64_t)(uint32_t)buf->dev->id);
  put_word(k, (uint64_t)buf->img_w);
  put_word(k, (uint64_t)buf->img_h);
}

enum { W_NODE = 1, W_BUFFER = 2, W_REALIZED = 3 };

/* Writes node u (its sources already written). false: the graph is not cacheable. */
static bool put_node(SchedKey *k, UOp *u) {
  const uint8_t relevant = UOPF_MAX_GRAD | UOPF_SYM_LOST | UOPF_SYM_BAKED;
  uint8_t fl = uop_flags(u);
  if (u->sym || (fl & (UOPF_SYM_LOST | UOPF_SYM_BAKED)) || u->op == OP_ASSIGN || u->op == OP_MULTI) return false;
  UOp *r = uop_realized(u);
  if (r) {
    if (r->op != OP_BUFFER || r->sym) return false;
    put_word(k, W_REALIZED | (uint64_t)u->op << 8 | (uint64_t)u->dtype << 24);
    put_word(k, (uint64_t)(uint32_t)u->device);
    put_shape(k, u);
    put_buffer_node(k, r);
    pm_put(&k->bpos, (uint64_t)(uintptr_t)r, (void *)(intptr_t)(k->nn + 1)); /* u's position, + 1 */
    return true;
  }
  if (u->op == OP_BUFFER) {
    put_word(k, W_BUFFER | (uint64_t)(fl & relevant) << 32);
    put_buffer_node(k, u);
    return true;
  }
  put_word(k, W_NODE | (uint64_t)u->op << 8 | (uint64_t)u->dtype << 24 | (uint64_t)(fl & relevant) << 32);
  put_word(k, (uint64_t)u->arg.i);
  put_word(k, (uint64_t)(uint32_t)u->device);
  put_shape(k, u);
  put_word(k, (uint64_t)u->nsrc);
  for (uint32_t i = 0; i < u->nsrc; i++) put_word(k, (uint64_t)u->src[i]->kpos);
  put_word(k, (uint64_t)u->niarg);
  for (uint32_t i = 0; i < u->niarg; i++) put_word(k, (uint64_t)u->iarg[i]);
  return true;
}

/* The one key's storage is kept between realizes (the lists and maps keep their capacity), unless
 * it grew large: a key is made on every realize. Callers hold the realize lock. */
static SchedKey g_spare;
static bool g_spare_used;

static void key_release_storage(SchedKey *k) {
  free(k->words);
  free(k->nodes);
  free(k->cls);
  pm_free(&k->bpos);
  pm_free(&k->clsof);
}

void schedule_key_free(SchedKey *k) {
  if (!k) return;
  g_spare_used = false;
  if (k->capw > 16384 || k->capn > 4096) {
    key_release_storage(k);
    memset(k, 0, sizeof *k);
  }
}

static uint32_t g_epoch;

static SchedKey *key_new(void) {
  TG_ASSERT(!g_spare_used); /* one key at a time: it lives from schedule_key to schedule_key_free */
  g_spare_used = true;
  SchedKey *k = &g_spare;
  k->nw = 0, k->nn = 0, k->ncls = 0, k->ntargets = 0, k->hash = 0;
  if (k->bpos.len) pm_clear(&k->bpos);
  if (k->clsof.len) pm_clear(&k->clsof);
  if (++g_epoch == 0) { /* wrapped: no node may keep a mark of an old walk */
    uop_clear_kmarks();
    g_epoch = 1;
  }
  k->epoch = g_epoch;
  return k;
}

static inline bool seen(const SchedKey *k, const UOp *u) { return u->kmark == k->epoch; }

typedef struct {
  UOp *n;
  uint32_t next;
} KFrame;

SchedKey *schedule_key(UOp **targets, int n) {
  if (!getenv_int("SCACHE", 1)) return NULL;
  SchedKey *k = key_new();
  put_word(k, (uint64_t)schedule_depth_bound());
  put_word(k, (uint64_t)getenv_int("FUSE_WINDOW", 1));
  KFrame st[64], *sp = st;
  size_t cap = sizeof st / sizeof *st;
  bool ok = true;
  for (int t = 0; t < n && ok; t++) {
    if (seen(k, targets[t])) continue;
    size_t ns = 0;
    sp[ns++] = (KFrame){targets[t], 0};
    while (ns && ok) {
      KFrame *f = &sp[ns - 1];
      bool leaf = uop_realized(f->n) || f->n->op == OP_BUFFER;
      if (!leaf && f->next < f->n->nsrc) {
        UOp *s = f->n->src[f->next++];
        if (seen(k, s)) continue;
        if (ns == cap) {
          KFrame *np = tg_xmalloc(sizeof *np * cap * 2);
          memcpy(np, sp, sizeof *np * ns);
          if (sp != st) free(sp);
          sp = np, cap *= 2;
        }
        sp[ns++] = (KFrame){s, 0};
        continue;
      }
      UOp *u = f->n;
      ns--;
      if (k->nn == SCHED_NODES || !put_node(k, u)) {
        ok = false;
        break;
      }
      if (k->nn == k->capn) {
        k->capn = k->capn ? k->capn * 2 : 64;
        k->nodes = tg_xrealloc(k->nodes, sizeof(UOp *) * (size_t)k->capn);
      }
      u->kpos = (uint32_t)k->nn;
      u->kmark = k->epoch;
      k->nodes[k->nn++] = u;
    }
  }
  if (sp != st) free(sp);
  if (!ok) {
    schedule_key_free(k);
    return NULL;
  }
  for (int t = 0; t < n; t++) put_word(k, (uint64_t)targets[t]->kpos);
  k->ntargets = n;
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i < k->nw; i++) { /* cheap: the table rehashes it, and a hit compares every word */
    h = (h ^ k->words[i]) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  k->hash = h | 1; /* a PtrMap key is never 0 */
  return k;
}

static void entry_free(Entry *e) {
  for (int i = 0; i < e->nitems; i++) {
    uop_unref(e->items[i].ast);
    free(e->items[i].bufs);
  }
  free(e->items);
  free(e->bufs);
  free(e->tbuf);
  free(e->words);
  free(e);
}

static void lru_unlink(Entry *e) {
  e->prev->next = e->next;
  e->next->prev = e->prev;
}

static void lru_front(Entry *e) {
  e->next = g_lru.next;
  e->prev = &g_lru;
  g_lru.next->prev = e;
  g_lru.next = e;
}

/* n items copied from src into a new array; each copy holds its own AST reference and bufs list */
static SItem *items_copy(const SItem *src, int n) {
  SItem *dst = tg_xcalloc((size_t)(n ? n : 1), sizeof(SItem));
  for (int i = 0; i < n; i++) {
    dst[i] = src[i];
    dst[i].ast = src[i].ast ? uop_ref(src[i].ast) : NULL;
    dst[i].bufs = tg_xmalloc(sizeof(int) * (size_t)(src[i].nbufs ? src[i].nbufs : 1));
    memcpy(dst[i].bufs, src[i].bufs, sizeof(int) * (size_t)src[i].nbufs);
  }
  return dst;
}

static UOp *decode_node(const SchedKey *k, int ref) {
  if (ref < 0) return NULL;
  UOp *u = k->nodes[ref / 2];
  return (ref & 1) ? uop_realized(u) : u;
}

bool schedule_from_cache(SchedKey *k, Schedule *s, int *tbuf) {
  Entry *e = pm_get(&g_entries, k->hash);
  if (!e || e->nw != k->nw || e->ntargets != k->ntargets || memcmp(e->words, k->words, sizeof(uint64_t) * k->nw) != 0)
    return false;
  lru_unlink(e), lru_front(e);
  g_hits++;
  memset(s, 0, sizeof *s);
  s->items = items_copy(e->items, e->nitems);
  s->nitems = s->capitems = e->nitems;
  s->bufs = tg_xmalloc(sizeof(SBuf) * (size_t)(e->nbufs ? e->nbufs : 1));
  s->nbufs = s->capbufs = e->nbufs;
  for (int i = 0; i < e->nbufs; i++) {
    const TBuf *t = &e->bufs[i];
    SBuf *b = &s->bufs[i];
    memset(b, 0, sizeof *b);
    b->dev = t->dev, b->nbytes = t->nbytes, b->last_use = t->last_use, b->keep = t->keep;
    b->img_w = t->img_w, b->img_h = t->img_h;
    b->buf = t->cls >= 0 ? buffer_ref(k->cls[t->cls]) : NULL;
    b->node = decode_node(k, t->node);
  }
  memcpy(tbuf, e->tbuf, sizeof(int) * (size_t)e->ntargets);
  return true;
}

/* The key's code for node u (see TBuf.node); -2 if u is not one the key knows. */
static int encode_node(const SchedKey *k, UOp *u) {
  if (!u) return -1;
  if (seen(k, u) && u->kpos < (uint32_t)k->nn && k->nodes[u->kpos] == u) return (int)(2 * u->kpos);
  intptr_t p = (intptr_t)pm_get(&k->bpos, (uint64_t)(uintptr_t)u);
  if (p) return (int)(2 * (p - 1) + 1);
  return -2;
}

void schedule_cache_put(SchedKey *k, const Schedule *s, const int *tbuf) {
  if (s->nassigns || s->nvars || s->sym_unit || s->sym_baked) return;
  Entry *e = tg_xcalloc(1, sizeof *e);
  e->bufs = tg_xmalloc(sizeof(TBuf) * (size_t)(s->nbufs ? s->nbufs : 1));
  e->nbufs = s->nbufs;
  for (int i = 0; i < s->nbufs; i++) {
    const SBuf *b = &s->bufs[i];
    TBuf *t = &e->bufs[i];
    t->dev = b->dev, t->nbytes = b->nbytes, t->last_use = b->last_use, t->keep = b->keep;
    t->img_w = b->img_w, t->img_h = b->img_h;
    t->cls = -1;
    if (b->buf) {
      intptr_t c = (intptr_t)pm_get(&k->clsof, (uint64_t)(uintptr_t)b->buf);
      t->cls = (int)c - 1;
    }
    t->node = encode_node(k, b->node);
    if ((b->buf && t->cls < 0) || t->node == -2) { /* a buffer or node from outside the graph */
      free(e->bufs);
      free(e);
      return;
    }
  }
  e->items = items_copy(s->items, s->nitems);
  e->nitems = s->nitems;
  e->tbuf = tg_xmalloc(sizeof(int) * (size_t)(k->ntargets ? k->ntargets : 1));
  memcpy(e->tbuf, tbuf, sizeof(int) * (size_t)k->ntargets);
  e->ntargets = k->ntargets;
  e->hash = k->hash;
  e->nw = k->nw;
  e->words = tg_xmalloc(sizeof(uint64_t) * k->nw);
  memcpy(e->words, k->words, sizeof(uint64_t) * k->nw);
  Entry *old = pm_get(&g_entries, e->hash);
  if (old) {
    lru_unlink(old);
    g_nentries--;
    g_nwords -= old->nw;
    entry_free(old);
  }
  pm_put(&g_entries, e->hash, e);
  lru_front(e);
  g_nentries++;
  g_nwords += e->nw;
  while ((g_nentries > SCHED_ENTRIES || g_nwords > SCHED_WORDS) && g_lru.prev != e) {
    Entry *v = g_lru.prev;
    lru_unlink(v);
    pm_del(&g_entries, v->hash);
    g_nentries--;
    g_nwords -= v->nw;
    entry_free(v);
  }
}

size_t schedule_cache_count(void) { return (size_t)g_nentries; }
uint64_t schedule_cache_hits(void) { return g_hits; }
