/*
 * results.c -- the tensor layer's realize: multi-device nodes go shard by shard (multi.c), the rest
 * to the engine (engine_realize), which reports each result back through the hooks below; they give
 * the results to the live handles and keep autograd's history.
 *
 * In: lazy nodes to realize. Out: each computed node's ->realized set to a BUFFER node, and the
 * handles that held it holding that node (or their own copy of it, see hand_out).
 * Invariant: the hooks run while the engine holds its realize lock, so a handle is never seen with
 * half a result, and the engine itself never touches handles or autograd.
 */
#include <stdlib.h>

#include "../engine/engine.h"
#include "../uop/ptrmap.h"
#include "tensor.h"

/* Does t's value come from no buffer at all (a tg_zeros, tg_full, tg_arange or tg_eye, maybe cast,
 * reshaped or made contiguous)? seen: the nodes already known to. */
static bool reads_no_buffer_(UOp *t, PtrMap *seen, bool realized_reads) {
  if ((realized_reads && uop_realized(t)) || t->op == OP_BUFFER) return false;
  if (pm_has(seen, (uint64_t)(uintptr_t)t)) return true;
  for (uint32_t i = 0; i < t->nsrc; i++)
    if (!reads_no_buffer_(t->src[i], seen, realized_reads)) return false;
  pm_put(seen, (uint64_t)(uintptr_t)t, t);
  return true;
}
static bool reads_no_buffer(UOp *t, PtrMap *seen) { return reads_no_buffer_(t, seen, true); }

bool t_reads_no_buffer(UOp *t) {
  PtrMap seen;
  pm_init(&seen);
  bool r = reads_no_buffer_(t, &seen, false); /* realized or not: its structure tells */
  pm_free(&seen);
  return r;
}

bool t_own_buffer(Slot *s, const char *fn) {
  UOp *u = s->u;
  Buffer *nb = buffer_new(device_by_id(u->device), (size_t)shape_numel(u->shape, u->ndim) * tg_dtype_itemsize((tg_dtype)u->dtype));
  if (!nb) return false;
  UOp *e = g_buffer(nb, (tg_dtype)u->dtype, u->shape, u->ndim);
  UOp *a0 = g_assign(e, u);
  uop_unref(e);
  tg_status st = realize_uops(&a0, 1);
  UOp *r = uop_realized(a0);
  if (st != TG_OK || !r) {
    if (st == TG_OK) tg_set_error(TG_ERR_RUNTIME, "%s: could not give the tensor a buffer of its own", fn);
    uop_unref(a0);
    return false;
  }
  s->u = uop_ref(r);
  uop_unref(u);
  uop_unref(a0);
  return true;
}

/* Hands the buffer node bn (b's) of the just realized t to the live handles holding t. Creating a
 * tensor (tg_zeros, tg_full, tg_arange, ...) makes a new tensor each time, as in tinygrad, where each
 * creation gets its own buffer; here hash-consing makes two creations of one shape one node. So when
 * several handles hold a node that reads no buffer, each after the first gets a copy of b, and an
 * assign to one never changes another. A value computed from buffers (x + y built twice) stays one
 * buffer for all its handles, as in tinygrad. Returns how many handles hold t's value now. */
static int hand_out(UOp *t, UOp *bn, Buffer *b) {
  int holders = t_replace_everywhere(t, bn); /* bn is a new node: only these handles hold it */
  if (holders <= 1 || b->img_w) return holders;
  PtrMap seen;
  pm_init(&seen);
  bool fresh = true; /* t itself is realized by now: its inputs tell */
  for (uint32_t i = 0; fresh && i < t->nsrc; i++) fresh = reads_no_buffer(t->src[i], &seen);
  pm_free(&seen);
  if (!fresh) return holders;
  UOp **tos = tg_xmalloc(sizeof(UOp *) * (size_t)holders);
  int n = 1;
  tos[0] = bn; /* the first handle keeps bn */
  for (; n < holders; n++) {
    Buffer *c = buffer_new(b->dev, b->nbytes);
    if (!c) break;
    if (buffer_copy(c, b, b->nbytes) != TG_OK) {
      buffer_unref(c);
      break;
    }
    tos[n] = g_buffer(c, (tg_dtype)t->dtype, t->shape, t->ndim);
  }
  /* on a failed allocation (the error is recorded) the remaining handles share bn */
  t_replace_each(bn, tos, n);
  for (int i = 1; i < n; i++) uop_unref(tos[i]);
  free(tos);
  return holders;
}

typedef struct {
  void (*visit)(void *ctx, UOp *u);
  void *ctx;
} HeldWalk;
static void held_one(void *ctx, Slot *s, tg_tensor h) {
  (void)h;
  HeldWalk *w = ctx;
  w->visit(w->ctx, s->u);
}
static void each_held(void (*visit)(void *ctx, UOp *u), void *ctx) {
  HeldWalk w = {visit, ctx};
  t_each_live(held_one, &w);
}

static void computed(UOp *t, Buffer *b) {
  if (t->sym) {
    /* a symbolic shape is stored at its max: handles get the [0, size) view of that buffer
     * (tinygrad's buffer of a symbolic tensor is its max size too); t itself stays lazy */
    int64_t mx[64], bd[128];
    for (int d = 0; d < t->ndim && t->ndim <= 64; d++) {
      mx[d] = sym_is_code(t->sym[d]) ? sym_maxval(t->sym[d]) : t->shape[d];
      bd[2 * d] = 0, bd[2 * d + 1] = t->sym[d];
    }
    UOp *bm = g_buffer(buffer_ref(b), (tg_dtype)t->dtype, mx, t->ndim);
    UOp *view = g_shrink(bm, bd);
    uop_unref(bm);
    t_replace_everywhere(t, view);
    uop_unref(view);
    return;
  }
  UOp *bn = g_buffer(buffer_ref(b), (tg_dtype)t->dtype, t->shape, t->ndim);
  uop_set_realized(t, bn); /* owned by t */
  /* handles now hold bn; bn keeps t's graph for autograd when a gradient may flow through it */
  if (hand_out(t, bn, b) > 0) ag_attach_history(bn, t);
}

/* user contiguous() intermediates that a live handle holds become that handle's buffer */
static void kept(UOp *t, Buffer *b) {
  UOp *bn = g_buffer(buffer_ref(b), (tg_dtype)t->dtype, t->shape, t->ndim);
  t->realized = bn;
  if (hand_out(t, bn, b) > 0) ag_attach_history(bn, t);
}

static void assigned(UOp *a, Buffer *b) {
  UOp *bn = g_buffer(buffer_ref(b), (tg_dtype)a->dtype, a->shape, a->ndim);
  uop_set_realized(a, bn);
  t_replace_everywhere(a, bn);
}

static const RealizeHooks tensor_hooks = {each_held, computed, kept, assigned};

tg_status realize_uops(UOp **targets, int n) {
  /* multi-device targets realize their shards (multi.c), which comes back here */
  for (int i = 0; i < n; i++)
    if (device_is_tuple(targets[i]->device)) return realize_multi(targets, n);
  return engine_realize(targets, n, &tensor_hooks);
}
