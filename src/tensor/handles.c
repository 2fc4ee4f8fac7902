/*
 * handles.c -- the registry of live tensors: generational handles in a slot table, and scopes.
 *
 * In: handles from the user. Out: the UOp behind a handle, or a clear error for none/freed/stale.
 * Invariants: a handle id = (generation << 32) | (slot + 1); a slot's generation increments when it is
 * freed, so stale ids never alias a new tensor. Each slot belongs to one scope depth; scope lists
 * record ids (not slots), so an entry whose id went stale or whose slot moved out is skipped.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../uop/ptrmap.h"
#include "tensor.h"

static pthread_mutex_t h_lock = PTHREAD_MUTEX_INITIALIZER;
/* Slots live in fixed chunks that never move, so a Slot pointer stays valid while other threads
 * create handles (a growing array would be reallocated under them). */
#define CHUNK_BITS 12
#define CHUNK ((size_t)1 << CHUNK_BITS)
#define MAX_CHUNKS ((size_t)1 << 19) /* 2^31 slots: free_head is an int32 */
static Slot *chunks[MAX_CHUNKS];
static size_t nslots, capslots, nlive;
static int32_t free_head = -1;

static inline Slot *slot_at(size_t i) { return &chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]; }

/* per-thread scope stack: lists of ids owned by each open scope (depth 1..n; depth 0 = root) */
typedef struct {
  uint64_t *ids;
  size_t n, cap;
  bool library; /* opened by t_scope_begin_library */
} IdList;
static _Thread_local IdList *scope_stack;
static _Thread_local int scope_depth, scope_cap;

/* A small number per thread, for Slot.thread (0: not assigned yet) */
static _Atomic uint32_t next_thread;
static _Thread_local uint32_t this_thread;
static uint32_t thread_no(void) {
  if (!this_thread) this_thread = ++next_thread;
  return this_thread;
}

static inline uint32_t id_slot(uint64_t id) { return (uint32_t)(id & 0xffffffffu) - 1; }
static inline uint32_t id_gen(uint64_t id) { return (uint32_t)(id >> 32); }

static Slot *slot_lookup(uint64_t id) {
  if (!id) return NULL;
  uint32_t s = id_slot(id);
  if (s >= nslots) return NULL;
  Slot *sl = slot_at(s);
  if (sl->scope < 0 || sl->gen != id_gen(id)) return NULL;
  return sl;
}

UOp *t_get(tg_tensor t, const char *fn) {
  pthread_mutex_lock(&h_lock);
  Slot *s = slot_lookup(t.id);
  UOp *u = s ? s->u : NULL;
  pthread_mutex_unlock(&h_lock);
  if (!u) {
    if (!tg_has_error()) {
      if (!t.id)
        tg_set_error(TG_ERR_HANDLE, "%s: got a none tensor (an earlier call failed or the handle was never set)", fn);
      else
        tg_set_error(TG_ERR_HANDLE, "%s: stale tensor handle %#llx (freed, or its scope ended); keep it with tg_keep/tg_persist", fn,
                     (unsigned long long)t.id);
    }
  }
  return u;
}

Slot *t_slot(tg_tensor t) {
  pthread_mutex_lock(&h_lock);
  Slot *s = slot_lookup(t.id);
  pthread_mutex_unlock(&h_lock);
  return s;
}
int t_scope_depth(void) { return scope_depth; }

void t_each_live(void (*visit)(void *ctx, Slot *s, tg_tensor h), void *ctx) {
  pthread_mutex_lock(&h_lock);
  for (size_t i = 0; i < nslots; i++) {
    Slot *s = slot_at(i);
    if (s->scope >= 0 && s->u) visit(ctx, s, (tg_tensor){((uint64_t)s->gen << 32) | (uint64_t)(i + 1)});
  }
  pthread_mutex_unlock(&h_lock);
}

UOp *t_grad_ref(tg_tensor h) {
  pthread_mutex_lock(&h_lock);
  Slot *s = slot_lookup(h.id);
  UOp *g = s && s->grad ? uop_ref(s->grad) : NULL;
  pthread_mutex_unlock(&h_lock);
  return g;
}

UOp *t_grad_swap(tg_tensor h, UOp *g) {
  pthread_mutex_lock(&h_lock);
  Slot *s = slot_lookup(h.id);
  UOp *old = g;
  if (s) old = s->grad, s->grad = g;
  pthread_mutex_unlock(&h_lock);
  return old;
}

void t_flag_grad_leaf(UOp *to) {
  uop_set_flag(to, UOPF_GRAD_LEAF);
  if (m_is(to))
    for (uint32_t j = 0; j < g_resolve(to)->nsrc; j++) uop_set_flag(g_resolve(to)->src[j], UOPF_GRAD_LEAF);
}

static void scope_push_id(uint64_t id) {
  if (scope_depth == 0) return;
  IdList *l = &scope_stack[scope_depth - 1];
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 64;
    l->ids = tg_xrealloc(l->ids, l->cap * sizeof(uint64_t));
  }
  l->ids[l->n++] = id;
}

tg_tensor t_wrap(UOp *u) {
  tg_tensor t = {0};
  if (!u) return t;
  pthread_mutex_lock(&h_lock);
  uint32_t s;
  if (free_head >= 0) {
    s = (uint32_t)free_head;
    free_head = slot_at(s)->next_free;
  } else {
    if (nslots == capslots) {
      if ((nslots >> CHUNK_BITS) >= MAX_CHUNKS) {
        pthread_mutex_unlock(&h_lock);
        uop_unref(u);
        tg_set_error(TG_ERR_RUNTIME, "tensor handles: all %zu handles are live; free some (tg_free, scopes)", nslots);
        return t;
      }
      chunks[nslots >> CHUNK_BITS] = tg_xcalloc(CHUNK, sizeof(Slot));
      capslots += CHUNK;
    }
    s = (uint32_t)nslots++;
    slot_at(s)->gen = 1;
  }
  Slot *sl = slot_at(s);
  sl->u = u;
  if (u->op == OP_RESHAPE) uop_set_flag(u, UOPF_HELD_RESHAPE);
  sl->thread = thread_no();
  sl->scope = scope_depth;
  sl->requires_grad = TG_GRAD_UNSET;
  sl->grad = NULL;
  sl->next_free = -1;
  nlive++;
  t.id = ((uint64_t)sl->gen << 32) | (uint64_t)(s + 1);
  pthread_mutex_unlock(&h_lock);
  scope_push_id(t.id);
  /* every op hands its result out here: one that ran short of memory on the way is undone */
  if (tg_oom_mark()) {
    char what[64];
    snprintf(what, sizeof what, "building a tensor (%s %s)", op_names[u->op], tg_dtype_name((tg_dtype)u->dtype));
    tg_oom_check(what);
    tg_free(t);
    return (tg_tensor){0};
  }
  return t;
}

/* Caller holds h_lock. Returns the UOps to release (outside the lock). */
static void slot_release(uint64_t id, UOp **u, UOp **g) {
  Slot *sl = slot_at(id_slot(id));
  *u = sl->u;
  *g = sl->grad;
  sl->u = NULL;
  sl->grad = NULL;
  sl->scope = -1;
  sl->borrowed = false;
  sl->gen++;
  if (sl->gen == 0) sl->gen = 1;
  sl->next_free = free_head;
  free_head = (int32_t)id_slot(id);
  nlive--;
}

void tg_free(tg_tensor t) {
  pthread_mutex_lock(&h_lock);
  Slot *s = slot_lookup(t.id);
  UOp *u = NULL, *g = NULL;
  bool borrowed = s && s->borrowed;
  if (s && !borrowed) slot_release(t.id, &u, &g);
  pthread_mutex_unlock(&h_lock);
  if (borrowed) {
    /* freeing it would leave its owner holding a dead handle that fails far from here */
    tg_set_error(TG_ERR_HANDLE,
                 "tg_free: tensor %#llx is borrowed from a state dict, which owns it: leave it to "
                 "tg_state_dict_free (or take a handle of your own with tg_detach and free that)",
                 (unsigned long long)t.id);
    return;
  }
  uop_unref(u);
  uop_unref(g);
}

void t_set_borrowed(tg_tensor t, bool borrowed) {
  pthread_mutex_lock(&h_lock);
  Slot *s = slot_lookup(t.id);
  if (s) s->borrowed = borrowed;
  pthread_mutex_unlock(&h_lock);
}

bool tg_valid(tg_tensor t) { return t_slot(t) != NULL; }

size_t tg_live_count(void) {
  pthread_mutex_lock(&h_lock);
  size_t n = nlive;
  pthread_mutex_unlock(&h_lock);
  return n;
}

/* A thread that exits with scopes open: they end as tg_scope_end would end them (nobody else can;
 * their handles were lost with the thread's stack of scopes). */
static pthread_key_t scope_key;
static pthread_once_t scope_key_once = PTHREAD_ONCE_INIT;
static void scopes_at_exit(void *p) {
  (void)p;
  while (scope_depth > 0) tg_scope_end();
  free(scope_stack);
  scope_stack = NULL;
  scope_cap = 0;
}
static bool scope_key_ok;
static void scope_key_create(void) { scope_key_ok = pthread_key_create(&scope_key, scopes_at_exit) == 0; }

void tg_scope_begin(void) {
  if (scope_cap == 0) { /* this thread's first scope: close what it leaves open when it exits */
    pthread_once(&scope_key_once, scope_key_create);
    if (scope_key_ok) pthread_setspecific(scope_key, (void *)1);
  }
  if (scope_depth == scope_cap) {
    scope_cap = scope_cap ? scope_cap * 2 : 8;
    scope_stack = tg_xrealloc(scope_stack, (size_t)scope_cap * sizeof(IdList));
  }
  scope_stack[scope_depth].ids = NULL;
  scope_stack[scope_depth].n = scope_stack[scope_depth].cap = 0;
  scope_stack[scope_depth].library = false;
  scope_depth++;
}

void t_scope_begin_library(void) {
  tg_scope_begin();
  scope_stack[scope_depth - 1].library = true;
  sym_library(1);
}

void tg_scope_end(void) {
  if (scope_depth == 0) {
    tg_set_error(TG_ERR_INVALID, "tg_scope_end: no open scope (calls to tg_scope_begin/tg_scope_end are unbalanced)");
    return;
  }
  IdList *l = &scope_stack[scope_depth - 1];
  bool oom_mark = tg_oom_mark(); /* freeing completes even if its scratch ran short */
  PtrVec dead = {0};
  pthread_mutex_lock(&h_lock);
  for (size_t i = 0; i < l->n; i++) {
    Slot *s = slot_lookup(l->ids[i]);
    if (!s || s->scope != scope_depth) continue;
    UOp *u, *g;
    slot_release(l->ids[i], &u, &g);
    pv_push(&dead, u);
    if (g) pv_push(&dead, g);
  }
  pthread_mutex_unlock(&h_lock);
  for (size_t i = 0; i < dead.n; i++) uop_unref(dead.p[i]);
  pv_free(&dead);
  free(l->ids);
  if (l->library) sym_library(-1);
  scope_depth--;
  if (scope_depth == 0) {
    free(scope_stack);
    scope_stack = NULL;
    scope_cap = 0;
  }
  tg_oom_forget(oom_mark);
}

tg_tensor tg_keep(tg_tensor t) {
  pthread_mutex_lock(&h_lock);
  Slot *s = slot_lookup(t.id);
  bool ok = s != NULL;
  if (s && s->scope > 0) s->scope--;
  int32_t depth = s ? s->scope : 0;
  pthread_mutex_unlock(&h_lock);
  if (!ok) {
    t_get(t, "tg_keep");
    return (tg_tensor){0};
  }
  if (depth > 0 && depth <= scope_depth) {
    int saved = scope_depth;
    scope_depth = depth;
    scope_push_id(t.id);
    scope_depth = saved;
  }
  return t;
}

tg_tensor tg_persist(tg_tensor t) {
  pthread_mutex_lock(&h_lock);
  Slot *s = slot_lookup(t.id);
  if (s) s->scope = 0;
  pthread_mutex_unlock(&h_lock);
  if (!s) {
    t_get(t, "tg_persist");
    return (tg_tensor){0};
  }
  return t;
}

int t_replace_buffer_everywhere(Buffer *b, UOp *to) {
  int n = 0;
  pthread_mutex_lock(&h_lock);
  size_t cap = 16;
  UOp **olds = tg_xmalloc(sizeof(UOp *) * cap);
  for (size_t i = 0; i < nslots; i++) {
    Slot *sl = slot_at(i);
    if (sl->scope < 0 || !sl->u || sl->u == to) continue;
    UOp *r = uop_realized(sl->u) ? uop_realized(sl->u) : sl->u;
    if (r->op != OP_BUFFER || g_buffer_of(r) != b) continue;
    if ((size_t)n == cap) olds = tg_xrealloc(olds, sizeof(UOp *) * (cap *= 2));
    olds[n++] = sl->u;
    sl->u = to;
    if (sl->requires_grad == 1) t_flag_grad_leaf(to);
  }
  pthread_mutex_unlock(&h_lock);
  for (int i = 0; i < n; i++) {
    uop_ref(to);
    uop_unref(olds[i]);
  }
  free(olds);
  return n;
}

int t_replace_node_everywhere(UOp *from, UOp *to) {
  int n = 0;
  pthread_mutex_lock(&h_lock);
  for (size_t i = 0; i < nslots; i++) {
    Slot *sl = slot_at(i);
    if (sl->scope < 0 || sl->u != from) continue;
    sl->u = uop_ref(to);
    if (sl->requires_grad == 1) t_flag_grad_leaf(to);
    n++;
  }
  pthread_mutex_unlock(&h_lock);
  for (int i = 0; i < n; i++) uop_unref(from);
  return n;
}

tg_status t_realize_pending_writes(Buffer *b) {
  long made = atomic_load(&g_assigns_made);
  if (!made) return TG_OK; /* no write made since none was pending: nothing to scan for */
  int n = 0, any = 0;
  size_t cap = 0;
  UOp **pend = NULL;
  pthread_mutex_lock(&h_lock);
  for (size_t i = 0; i < nslots; i++) {
    Slot *sl = slot_at(i);
    UOp *u = g_view_base(sl->scope < 0 ? NULL : sl->u); /* the write itself or a view of it */
    if (!u || u->op != OP_ASSIGN || uop_realized(u) || u->nsrc < 1) continue;
    any++;
    if (g_buffer_of(g_base_buffer(u->src[0])) != b) continue;
    bool dup = false;
    for (int k = 0; k < n && !dup; k++) dup = pend[k] == u;
    if (dup) continue;
    if ((size_t)n == cap) pend = tg_xrealloc(pend, sizeof(UOp *) * (cap = cap ? cap * 2 : 8));
    pend[n++] = uop_ref(u);
  }
  /* no handle holds a pending write: the count restarts (unless a write was made meanwhile) */
  if (!any) atomic_compare_exchange_strong(&g_assigns_made, &made, 0);
  pthread_mutex_unlock(&h_lock);
  tg_status st = n ? realize_uops(pend, n) : TG_OK;
  for (int k = 0; k < n; k++) uop_unref(pend[k]);
  free(pend);
  return st;
}

int t_replace_each(UOp *from, UOp *const *tos, int ntos) {
  int n = 0;
  uint32_t me = thread_no();
  pthread_mutex_lock(&h_lock);
  for (size_t i = 0; i < nslots && n < ntos; i++) {
    Slot *sl = slot_at(i);
    if (sl->scope >= 0 && sl->u == from && sl->thread == me) {
      UOp *to = tos[n++];
      sl->u = uop_ref(to);
      if (sl->requires_grad == 1) t_flag_grad_leaf(to);
    }
  }
  pthread_mutex_unlock(&h_lock);
  for (int i = 0; i < n; i++) uop_unref(from);
  return n;
}

int t_replace_everywhere(UOp *from, UOp *to) {
  int n = 0;
  uint32_t me = thread_no();
  pthread_mutex_lock(&h_lock);
  for (size_t i = 0; i < nslots; i++) {
    Slot *sl = slot_at(i);
    if (sl->scope >= 0 && sl->u == from && sl->thread == me) {
      sl->u = to;
      if (sl->requires_grad == 1) t_flag_grad_leaf(to);
      n++;
    }
  }
  pthread_mutex_unlock(&h_lock);
  /* adjust references outside the lock: each replaced slot drops `from` and holds `to` */
  for (int i = 0; i < n; i++) {
    uop_ref(to);
    uop_unref(from);
  }
  return n;
}
