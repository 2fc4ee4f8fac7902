/*
 * autograd.c -- reverse-mode differentiation on the lazy graph.
 *
 * In: a scalar loss node and the nodes to differentiate with respect to. Out: lazy gradient nodes
 * (graphs like any other: they fuse and realize later). One gradient rule per primitive op, written
 * with the same graph builders as the forward ops, so a backward pass is just more graph.
 * Invariants: gradients have the shape of the node they belong to; contributions from several
 * consumers are summed; only nodes on a path from the loss to a target are visited.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../uop/ptrmap.h"
#include "tensor.h"

#define NONE ((tg_tensor){0})

static UOp *kconst(UOp *like, double v, tg_dtype dt) { return g_const_shaped(v, dt, like->device, like->shape, like->ndim); }
static UOp *bin(int op, UOp *a, UOp *b) { return g_alu(op, (tg_dtype)a->dtype, a, b, NULL); }
static UOp *mulc(UOp *a, double c) {
  UOp *k = kconst(a, c, (tg_dtype)a->dtype);
  UOp *r = bin(OP_MUL, a, k);
  uop_unref(k);
  return r;
}
static UOp *neg(UOp *a) { return g_alu(OP_NEG, (tg_dtype)a->dtype, a, NULL, NULL); }
static UOp *mul3(UOp *a, UOp *b) { return bin(OP_MUL, a, b); }

/* Gradient contributions of node n (with output gradient g) to each source; out[i] NULL = none. */
static void grad_rule(UOp *n, UOp *g, UOp **out) {
  UOp *a = n->nsrc > 0 ? n->src[0] : NULL, *b = n->nsrc > 1 ? n->src[1] : NULL;
  tg_dtype dt = (tg_dtype)n->dtype;
  for (uint32_t i = 0; i < n->nsrc; i++) out[i] = NULL;
  switch (n->op) {
  case OP_ADD: out[0] = uop_ref(g), out[1] = uop_ref(g); break;
  case OP_SUB: out[0] = uop_ref(g), out[1] = neg(g); break;
  case OP_MUL: out[0] = mul3(g, b), out[1] = mul3(g, a); break;
  case OP_FDIV: {
    /* d/db = -(g/b) * (a/b), the quotient being n: g/b/b * a underflows to 0 (or overflows) where
     * the result does not, e.g. at a = b = 1e30 (tinygrad's -(a*g) * (1/b) * (1/b) has it right) */
    out[0] = bin(OP_FDIV, g, b);
    UOp *u = mul3(out[0], n);
    out[1] = neg(u);
    uop_unref(u);
    break;
  }
  case OP_MAX: {
    /* ties split the gradient in half, as tinygrad does */
    UOp *gt = g_alu(OP_CMPLT, TG_BOOL, b, a, NULL), *lt = g_alu(OP_CMPLT, TG_BOOL, a, b, NULL);
    UOp *eq = g_alu(OP_CMPEQ, TG_BOOL, a, b, NULL);
    UOp *half = mulc(g, 0.5), *z = kconst(g, 0, dt);
    UOp *h = g_alu(OP_WHERE, dt, eq, half, z);
    out[0] = g_alu(OP_WHERE, dt, gt, g, h);
    out[1] = g_alu(OP_WHERE, dt, lt, g, h);
    uop_unref(gt), uop_unref(lt), uop_unref(eq), uop_unref(half), uop_unref(z), uop_unref(h);
    break;
  }
  case OP_POW: {
    /* tinygrad's rules, exact at zero: d/da = b == 0 ? 0 : b * a^(b-1) (so x**0 has gradient 0 even
     * at x = 0); d/db = a == 0 ? (b < 0 ? -inf : 0) : a^b * log2(a) * ln 2 */
    UOp *z = kconst(a, 0, dt), *one = kconst(b, 1, dt), *bm1 = bin(OP_SUB, b, one), *p = bin(OP_POW, a, bm1), *t = mul3(b, p);
    UOp *bz = g_alu(OP_CMPEQ, TG_BOOL, b, z, NULL), *da = g_alu(OP_WHERE, dt, bz, z, t);
    out[0] = mul3(g, da);
    UOp *l2 = g_alu(OP_LOG2, dt, a, NULL, NULL), *t1 = mul3(n, l2), *t2 = mulc(t1, M_LN2);
    UOp *ninf = kconst(a, -INFINITY, dt), *bneg = g_alu(OP_CMPLT, TG_BOOL, b, z, NULL), *at0 = g_alu(OP_WHERE, dt, bneg, ninf, z);
    UOp *az = g_alu(OP_CMPEQ, TG_BOOL, a, z, NULL), *db = g_alu(OP_WHERE, dt, az, at0, t2);
    out[1] = mul3(g, db);
    uop_unref(z), uop_unref(one), uop_unref(bm1), uop_unref(p), uop_unref(t), uop_unref(bz), uop_unref(da);
    uop_unref(l2), uop_unref(t1), uop_unref(t2), uop_unref(ninf), uop_unref(bneg), uop_unref(at0), uop_unref(az), uop_unref(db);
    break;
  }
  case OP_WHERE: {
    UOp *z = kconst(g, 0, dt);
    out[1] = g_alu(OP_WHERE, dt, a, g, z);
    out[2] = g_alu(OP_WHERE, dt, a, z, g);
    uop_unref(z);
    break;
  }
  case OP_NEG: out[0] = neg(g); break;
  case OP_EXP2: {
    UOp *t = mulc(n, M_LN2);
    out[0] = mul3(g, t);
    uop_unref(t);
    break;
  }
  case OP_LOG2: {
    UOp *t = mulc(a, M_LN2);
    out[0] = bin(OP_FDIV, g, t);
    uop_unref(t);
    break;
  }
  case OP_SIN: {
    /* cos(x) = 1 - 2 sin(x/2)^2: x/2 is exact, where tinygrad's sin(pi/2 - x) loses x once pi/2 - x
     * rounds (|x| above ~1e7 in float32), which made the gradient of cos(1e30) 1.6 */
    UOp *h = mulc(a, 0.5), *s = g_alu(OP_SIN, dt, h, NULL, NULL), *s2 = mul3(s, s), *t = mulc(s2, -2.0);
    UOp *one = kconst(a, 1, dt), *c = bin(OP_ADD, one, t);
    out[0] = mul3(g, c);
    uop_unref(h), uop_unref(s), uop_unref(s2), uop_unref(t), uop_unref(one), uop_unref(c);
    break;
  }
  case OP_SQRT: {
    UOp *t = mulc(n, 2);
    out[0] = bin(OP_FDIV, g, t);
    uop_unref(t);
    break;
  }
  case OP_RECIP: {
    UOp *sq = mul3(n, n), *t = mul3(g, sq);
    out[0] = neg(t);
    uop_unref(sq), uop_unref(t);
    break;
  }
  case OP_CAST:
    if (tg_dtype_is_float((tg_dtype)a->dtype)) out[0] = g_cast(g, (tg_dtype)a->dtype);
    break;
  case OP_TRUNC: out[0] = kconst(a, 0, (tg_dtype)a->dtype); break;
  case OP_CONTIGUOUS: out[0] = uop_ref(g); break;
  case OP_COPY: out[0] = g_copy(g, a->device); break;
  /* every process's value feeds the sum on every process, so each gets the sum of all their
   * gradients; a broadcast's value is the root's alone, so its gradient is the sum of theirs on the
   * root (an MPI reduce to it) and zero elsewhere */
  case OP_COLLECTIVE:
    if (n->nsrc > 1) m_allreduce_grad(n, g, out); /* an allreduce over this process's GPUs */
    else out[0] = g_collective(g, n->arg.i < 0 ? -1 : -2 - n->arg.i);
    break;
  case OP_RESHAPE: out[0] = g_reshape(g, a->shape, a->ndim); break;
  case OP_PERMUTE: {
    int64_t inv[64];
    for (int i = 0; i < n->ndim; i++) inv[n->iarg[i]] = i;
    out[0] = g_permute(g, inv);
    break;
  }
  case OP_EXPAND: {
    int64_t ax[64];
    int na = 0;
    for (int i = 0; i < n->ndim; i++)
      if (a->shape[i] == 1 && n->shape[i] != 1) ax[na++] = i;
    /* a narrow float sums in float32 (dtype_sum_acc), as tg_sum does, and rounds once: a bfloat16
     * bias's gradient over 10^4 terms summed in bfloat16 was 10% off (tinygrad sums in the dtype;
     * PyTorch in float32) */
    tg_dtype gd = (tg_dtype)g->dtype;
    UOp *gw = g_cast(g, tg_dtype_is_float(gd) ? dtype_sum_acc(gd) : gd), *r = g_reduce(gw, OP_ADD, ax, na), *rn = g_cast(r, gd);
    out[0] = g_reshape(rn, a->shape, a->ndim);
    uop_unref(gw), uop_unref(r), uop_unref(rn);
    break;
  }
  case OP_PAD: {
    int64_t bd[128];
    for (int i = 0; i < n->ndim; i++) bd[2 * i] = n->iarg[2 * i], bd[2 * i + 1] = n->iarg[2 * i] + a->shape[i];
    out[0] = g_shrink(g, bd);
    break;
  }
  case OP_SHRINK: {
    int64_t pd[128];
    for (int i = 0; i < n->ndim; i++) pd[2 * i] = n->iarg[2 * i], pd[2 * i + 1] = a->shape[i] - n->iarg[2 * i + 1];
    out[0] = g_pad(g, pd);
    break;
  }
  case OP_FLIP: out[0] = g_flip(g, n->iarg); break;
  case OP_REDUCE_AXIS: {
    UOp *ge = g_expand(g, a->shape);
    if (n->arg.i == OP_ADD) {
      out[0] = ge;
    } else if (n->arg.i == OP_MUL) {
      /* d prod / d x_j is the product of the others: prod / x_j where x_j != 0; at a zero it is the
       * product of the non-zero elements if x_j is the only zero, else 0 (tinygrad's rule) */
      UOp *z = kconst(a, 0, dt), *one = kconst(a, 1, dt), *isz = g_alu(OP_CMPEQ, TG_BOOL, a, z, NULL);
      UOp *safe = g_alu(OP_WHERE, dt, isz, one, a), *pr = g_reduce(safe, OP_MUL, n->iarg, (int)n->niarg);
      UOp *zi = g_cast(isz, TG_INT32), *cnt = g_reduce(zi, OP_ADD, n->iarg, (int)n->niarg);
      UOp *c1 = kconst(cnt, 1, TG_INT32), *only = g_alu(OP_CMPEQ, TG_BOOL, cnt, c1, NULL), *zr = kconst(pr, 0, dt);
      UOp *atz = g_alu(OP_WHERE, dt, only, pr, zr), *atze = g_expand(atz, a->shape), *ne = g_expand(n, a->shape);
      UOp *q = bin(OP_FDIV, ne, safe), *d = g_alu(OP_WHERE, dt, isz, atze, q);
      out[0] = mul3(ge, d);
      uop_unref(z), uop_unref(one), uop_unref(isz), uop_unref(safe), uop_unref(pr), uop_unref(zi), uop_unref(cnt);
      uop_unref(c1), uop_unref(only), uop_unref(zr), uop_unref(atz), uop_unref(atze), uop_unref(ne), uop_unref(q), uop_unref(d);
      uop_unref(ge);
    } else {
      /* MAX: the gradient goes to the maxima, split evenly between ties. The comparison reads a
       * again: mark it (and what it is a view of) so the scheduler keeps the maximum and this
       * recomputation reading the same bits */
      for (UOp *v = a;; v = v->src[0]) {
        uop_set_flag(v, UOPF_MAX_GRAD);
        if (!op_is_movement(v->op) || !v->nsrc) break;
      }
      UOp *re = g_expand(n, a->shape), *eq = g_alu(OP_CMPEQ, TG_BOOL, a, re, NULL), *m = g_cast(eq, dt);
      UOp *cnt = g_reduce(m, OP_ADD, n->iarg, (int)n->niarg), *ce = g_expand(cnt, a->shape);
      UOp *t = mul3(ge, m);
      out[0] = bin(OP_FDIV, t, ce);
      uop_unref(re), uop_unref(eq), uop_unref(m), uop_unref(cnt), uop_unref(ce), uop_unref(t), uop_unref(ge);
    }
    break;
  }
  case OP_INDEX: {
    /* d data[r] = sum of the output gradients of the positions that read row r: selected, not
     * multiplied by a one-hot mask, so an inf or NaN gradient stays in the rows that were read (0 * inf
     * put NaN in every other row; tinygrad's mask.where(g, 0) keeps them 0) */
    tg_scope_begin();
    int64_t rows = a->shape[0], m = shape_numel(b->shape, b->ndim), rest = rows ? shape_numel(a->shape, a->ndim) / rows : 0;
    tg_tensor gt = t_wrap(uop_ref(g)), it = t_wrap(uop_ref(b));
    tg_tensor w = tg_where(tg_lt_s(it, 0), tg_add_s(it, (double)rows), it);
    tg_opts o = {.dtype = TG_INT64, .device = device_full_name(device_by_id(a->device))};
    tg_tensor sel = tg_eq(tg_reshape(tg_cast(w, TG_INT64), (const int64_t[]){1, m, 1}, 3),
                          tg_reshape(tg_arange(0, (double)rows, 1, &o), (const int64_t[]){rows, 1, 1}, 3));
    tg_tensor g3 = tg_reshape(gt, (const int64_t[]){1, m, rest}, 3);
    tg_tensor gd = tg_sum(tg_where(sel, g3, tg_const_like(g3, 0)), (const int[]){1}, 1, false);
    tg_tensor r = tg_reshape(gd, a->shape, a->ndim);
    UOp *ru = t_get(r, "tg_backward");
    out[0] = ru ? uop_ref(ru) : NULL;
    tg_scope_end();
    break;
  }
  default: break; /* comparisons, bitwise, integer ops, BUFFER, CONST: no gradient */
  }
}

/* ---- custom gradient registry (node -> entry), entries dropped when the node dies ---- */
typedef struct {
  UOp **inputs; /* owned refs */
  int n;
  ag_custom_fn fn;
  bool history; /* a realized BUFFER node's history (inputs[0]: the node it was computed by) */
} Custom;
static PtrMap customs;
static pthread_mutex_t custom_lock = PTHREAD_MUTEX_INITIALIZER;

static void custom_drop(UOp *u) {
  pthread_mutex_lock(&custom_lock);
  Custom *c = pm_get(&customs, (uint64_t)(uintptr_t)u);
  if (c) pm_put(&customs, (uint64_t)(uintptr_t)u, NULL);
  pthread_mutex_unlock(&custom_lock);
  if (!c) return;
  UOp *t = c->history ? c->inputs[0] : NULL;
  if (t && uop_realized(t) == u && (uop_flags(t) & UOPF_WEAK_REALIZED)) {
    uop_set_realized(t, NULL); /* the result dies with its buffer node; t would be computed again */
    uop_clear_flag(t, UOPF_WEAK_REALIZED);
  }
  for (int i = 0; i < c->n; i++) uop_unref(c->inputs[i]);
  free(c->inputs);
  free(c);
}

static void set_custom(UOp *out, UOp *const *inputs, int n, ag_custom_fn fn);

/* A multi-device node's consumers read its shards, not it: the gradient is registered on each shard
 * too, with the inputs' shards, when that is the same computation per shard -- every sharded input
 * split exactly as the output (a batch-sharded convolution with replicated weights); replicated
 * inputs then collect one contribution per replica, which the join of their gradient sums. */
bool ag_set_custom_grad_mode(UOp *out, UOp *const *inputs, int n, ag_custom_fn fn, int mode) {
  set_custom(out, inputs, n, fn);
  if (!m_is(out)) return true;
  UOp *o = g_resolve(out);
  int ns = (int)o->nsrc, ax = m_axis(o);
  /* the inputs as each shard reads them (new refs) */
  UOp **res = tg_xcalloc((size_t)n + 1, sizeof(UOp *));
  bool ok = true;
  for (int k = 0; k < n && ok; k++) {
    if (!m_is(inputs[k]) || inputs[k]->device != out->device) {
      ok = false;
      break;
    }
    res[k] = mode == AG_SHARD_ELEMENTWISE ? m_reshard_like(inputs[k], out) : uop_ref(inputs[k]);
    UOp *in = g_resolve(res[k]);
    int ia = m_axis(in);
    if ((int)in->nsrc != ns) ok = false;
    else if (ia < 0) {
      /* a replicated input: whole per shard, unless out is split and the op needs it split too (a
       * constant, the same on every device, always fits) */
      if (mode == AG_SHARD_ALIGNED && ax >= 0 && in->src[0]->op != OP_CONST) ok = false;
    } else if (ia != ax) {
      ok = false;
    } else {
      for (int i = 0; i < ns && ok; i++)
        if (in->src[i]->shape[ia] != o->src[i]->shape[ax]) ok = false;
    }
  }
  if (ok) {
    UOp **ins = tg_xmalloc(sizeof(UOp *) * (size_t)(n + 1));
    for (int i = 0; i < ns; i++) {
      for (int k = 0; k < n; k++) ins[k] = g_resolve(res[k])->src[i];
      set_custom(o->src[i], ins, n, fn);
    }
    free(ins);
  }
  for (int k = 0; k < n; k++) uop_unref(res[k]);
  free(res);
  return ok;
}

static void set_custom(UOp *out, UOp *const *inputs, int n, ag_custom_fn fn) {
  __atomic_store_n(&uop_free_hook, custom_drop, __ATOMIC_RELEASE); /* (read by other threads' releases) */
  pthread_mutex_lock(&custom_lock);
  bool have = pm_get(&customs, (uint64_t)(uintptr_t)out) != NULL;
  pthread_mutex_unlock(&custom_lock);
  if (have) return;
  Custom *c = tg_xcalloc(1, sizeof *c);
  c->inputs = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) c->inputs[i] = uop_ref(inputs[i]);
  c->n = n;
  c->fn = fn;
  pthread_mutex_lock(&custom_lock);
  pm_put(&customs, (uint64_t)(uintptr_t)out, c);
  uop_set_flag(out, UOPF_HOOKED);
  pthread_mutex_unlock(&custom_lock);
}

/* the gradient of a realized node is its history's */
static void history_grad(UOp *out, UOp *g, UOp *const *inputs, int n, UOp **grads) {
  (void)out, (void)inputs, (void)n;
  grads[0] = uop_ref(g);
}

static Custom *custom_of(UOp *u);

/* Does u's graph (through histories too) contain a tensor that requires grad? Iterative, as every
 * walk over a whole tensor graph: a graph built by a loop can be a chain of millions of nodes. */
static bool reaches_grad_leaf(UOp *u) {
  if (!__atomic_load_n(&uop_any_grad_leaf, __ATOMIC_SEQ_CST)) return false;
  /* the nodes seen: a small graph (one realize of an expression) in a list on the C stack, searched
   * linearly; a larger one in a hash map */
  UOp *few[32];
  size_t nfew = 0;
  PtrMap seen;
  pm_init(&seen);
  UOp *stk[64];
  PtrVec st = {0};
  size_t ns = 0; /* on stk until it outgrows it, then on st */
  stk[ns++] = u;
  bool found = false;
  while ((ns || st.n) && !found) {
    UOp *x = st.n ? st.p[--st.n] : stk[--ns];
    if (uop_flags(x) & UOPF_GRAD_LEAF) {
      found = true;
      break;
    }
    bool dup = false;
    if (!seen.cap) {
      for (size_t i = 0; i < nfew && !dup; i++) dup = few[i] == x;
      if (!dup && nfew < sizeof few / sizeof *few) few[nfew++] = x;
      else if (!dup) {
        for (size_t i = 0; i < nfew; i++) pm_put(&seen, (uint64_t)(uintptr_t)few[i], (void *)1);
        pm_put(&seen, (uint64_t)(uintptr_t)x, (void *)1);
      }
    } else if (pm_has(&seen, (uint64_t)(uintptr_t)x)) {
      dup = true;
    } else {
      pm_put(&seen, (uint64_t)(uintptr_t)x, (void *)1);
    }
    if (dup) continue;
    Custom *c = custom_of(x);
    int nin = c ? c->n : (int)x->nsrc;
    UOp *const *in = c ? c->inputs : x->src;
    /* a leaf among the direct inputs ends the walk before it descends into a long history */
    for (int i = 0; i < nin && !found; i++) found = (uop_flags(in[i]) & UOPF_GRAD_LEAF) != 0;
    size_t more = (size_t)nin + (c ? x->nsrc : 0);
    if (!st.n && ns + more <= sizeof stk / sizeof *stk) {
      for (int i = nin; i-- > 0;) stk[ns++] = in[i];
      if (c)
        for (uint32_t i = x->nsrc; i-- > 0;) stk[ns++] = x->src[i];
      continue;
    }
    for (size_t i = 0; i < ns; i++) pv_push(&st, stk[i]); /* the rest goes on the heap, in order */
    ns = 0;
    for (int i = nin; i-- > 0;) pv_push(&st, in[i]);
    if (c)
      for (uint32_t i = x->nsrc; i-- > 0;) pv_push(&st, x->src[i]);
  }
  pv_free(&st);
  pm_free(&seen);
  return found;
}

void ag_attach_history(UOp *bn, UOp *t) {
  if (t->op == OP_ASSIGN || t->op == OP_BUFFER || (uop_flags(t) & UOPF_GRAD_LEAF) || uop_realized(t) != bn ||
      (uop_flags(bn) & UOPF_HOOKED))
    return;
  bool need = reaches_grad_leaf(t); /* t itself is not a leaf: checked above */
  if (!need) return;
  ag_set_custom_grad(bn, &t, 1, history_grad);
  Custom *c = custom_of(bn);
  if (!c) return;
  c->history = true;
  uop_set_flag(t, UOPF_WEAK_REALIZED);
  uop_unref(bn); /* t's reference: the handles keep bn alive, and bn keeps t */
}

static Custom *custom_of(UOp *u) {
  if (!(uop_flags(u) & UOPF_HOOKED)) return NULL;
  pthread_mutex_lock(&custom_lock);
  Custom *c = pm_get(&customs, (uint64_t)(uintptr_t)u);
  pthread_mutex_unlock(&custom_lock);
  return c;
}

typedef struct {
  PtrMap idx;   /* node -> position + 1 in order */
  PtrVec order; /* post-order (sources first) */
} Topo;

/* Appends every node reachable from u (through custom gradients' inputs instead of the sources
 * where a node has one; not past an ASSIGN) in post-order, sources in order before the node. An
 * explicit stack of (node, next input) frames instead of recursion. */
typedef struct {
  UOp *u;
  UOp *const *in; /* the inputs followed: a custom gradient's, or the sources */
  int n, next;
} TFrame;

static void topo_visit(Topo *t, UOp *u) {
  if (pm_has(&t->idx, (uint64_t)(uintptr_t)u)) return;
  TFrame *st = NULL;
  size_t ns = 0, cap = 0;
  UOp *push = u;
  for (;;) {
    if (push) {
      pm_put(&t->idx, (uint64_t)(uintptr_t)push, (void *)(intptr_t)-1);
      Custom *c = custom_of(push);
      TFrame f = {push, NULL, 0, 0};
      if (c) f.in = c->inputs, f.n = c->n;
      else if (push->op != OP_ASSIGN) f.in = push->src, f.n = (int)push->nsrc;
      if (ns == cap) st = tg_xrealloc(st, sizeof *st * (cap = cap ? cap * 2 : 64));
      st[ns++] = f;
      push = NULL;
    }
    if (!ns) break;
    TFrame *f = &st[ns - 1];
    if (f->next < f->n) {
      UOp *s = f->in[f->next++];
      if (!pm_has(&t->idx, (uint64_t)(uintptr_t)s)) push = s;
      continue;
    }
    pv_push(&t->order, f->u);
    pm_put(&t->idx, (uint64_t)(uintptr_t)f->u, (void *)(intptr_t)t->order.n);
    ns--;
  }
  free(st);
}

/* A realized tensor is a BUFFER node, and every wrap of a buffer is a node of its own (g_buffer): a
 * tensor written by a realized assign (an optimizer step) holds a new node while a graph built
 * before the write reads the buffer through the old one. tinygrad keeps one node per buffer, so its
 * gradient finds the tensor in such a graph; here every BUFFER node of the graph that wraps the
 * target's buffer whole (same dtype and shape) stands for the target. So does a computed node of the
 * graph realized into that buffer since (a leaf x realized after y = f(x) was built: x's handle
 * holds the BUFFER node, y's graph the computation it came from; tinygrad finds x there, as its
 * realize puts the buffer in place of the computation in every graph). */
static const UOp *buffer_of(const UOp *u) {
  const UOp *r = u->op == OP_BUFFER ? u : uop_realized(u);
  return r && r->op == OP_BUFFER ? r : NULL;
}
static bool buffer_twin(const UOp *a, const UOp *b) {
  a = buffer_of(a), b = buffer_of(b);
  return a && b && a->arg.p == b->arg.p && a->dtype == b->dtype && a->ndim == b->ndim &&
         (a->ndim == 0 || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0);
}
/* The graph's BUFFER nodes and realized nodes by buffer (Buffer * -> PtrVec * of nodes, owned). */
static void buffer_nodes(const Topo *t, PtrMap *by) {
  pm_init(by);
  for (size_t i = 0; i < t->order.n; i++) {
    UOp *u = t->order.p[i];
    const UOp *b = buffer_of(u);
    /* (not a creation: equal creations are one node, and this one may stand for another tensor's
     * value; a requires_grad creation is realized when it is marked, tg_set_requires_grad) */
    if (!b || (u != b && t_reads_no_buffer(u))) continue;
    PtrVec *v = pm_get(by, (uint64_t)(uintptr_t)b->arg.p);
    if (!v) v = tg_xcalloc(1, sizeof *v), pm_put(by, (uint64_t)(uintptr_t)b->arg.p, v);
    pv_push(v, u);
  }
}
static void buffer_nodes_free(PtrMap *by) {
  for (size_t i = 0; i < by->cap; i++)
    if (by->keys[i]) pv_free(by->vals[i]), free(by->vals[i]);
  pm_free(by);
}
/* root's graph walked (t) and its BUFFER nodes by buffer (by); graph_free releases both. */
static void graph_index(UOp *root, Topo *t, PtrMap *by) {
  memset(t, 0, sizeof *t);
  topo_visit(t, root);
  buffer_nodes(t, by);
}
static void graph_free(Topo *t, PtrMap *by) {
  buffer_nodes_free(by);
  pm_free(&t->idx), pv_free(&t->order);
}
/* Does the graph (by, from buffer_nodes) hold target u, itself or a twin? */
static bool graph_holds(const Topo *t, const PtrMap *by, UOp *u) {
  if (pm_has(&t->idx, (uint64_t)(uintptr_t)u)) return true;
  const UOp *b = buffer_of(u);
  const PtrVec *v = b ? pm_get(by, (uint64_t)(uintptr_t)b->arg.p) : NULL;
  for (size_t i = 0; v && i < v->n; i++)
    if (buffer_twin(u, v->p[i])) return true;
  return false;
}

/* Computes d loss / d targets[i] into out[i] (new refs; NULL if unreachable). */
static void compute_grads_plain(UOp *loss, UOp *seed, UOp **targets, int n, UOp **out);
/* MULTI targets (multi-device tensors) take their gradient from their shards' (multi.c). */
static void compute_grads(UOp *loss, UOp *seed, UOp **targets, int n, UOp **out) {
  int extra = 0;
  for (int i = 0; i < n; i++)
    if (m_is(targets[i])) extra += (int)g_resolve(targets[i])->nsrc;
  if (!extra) {
    compute_grads_plain(loss, seed, targets, n, out);
    return;
  }
  UOp **ts = tg_xmalloc(sizeof(UOp *) * (size_t)(n + extra)), **gs = tg_xmalloc(sizeof(UOp *) * (size_t)(n + extra));
  int m = n;
  for (int i = 0; i < n; i++) {
    ts[i] = targets[i];
    if (m_is(targets[i]))
      for (uint32_t j = 0; j < g_resolve(targets[i])->nsrc; j++) ts[m++] = g_resolve(targets[i])->src[j];
  }
  compute_grads_plain(loss, seed, ts, m, gs);
  m = n;
  for (int i = 0; i < n; i++) {
    if (!m_is(targets[i])) {
      out[i] = gs[i];
      continue;
    }
    uop_unref(gs[i]);
    UOp *r = g_resolve(targets[i]);
    out[i] = m_grad_join(r, gs + m);
    for (uint32_t j = 0; j < r->nsrc; j++) uop_unref(gs[m + j]);
    m += (int)r->nsrc;
  }
  free(ts), free(gs);
}

static void compute_grads_nodes(const Topo *t, UOp *loss, UOp *seed, UOp **targets, int n, UOp **out);
/* Does u's gradient flow on, unchanged, into another of the n nodes standing for one target? A
 * buffer node carrying the history of the computation realized into it (ag_attach_history) passes
 * its gradient to that computation; where the graph holds both, the computation's gradient already
 * counts the buffer node's. */
static bool passed_on(UOp *u, UOp *const *twins, int n) {
  Custom *c = u->op == OP_BUFFER ? custom_of(u) : NULL;
  /* (a requires_grad leaf's buffer node stops the pass: its gradient goes nowhere else) */
  if (!c || !c->history || (uop_flags(u) & UOPF_GRAD_LEAF)) return false;
  for (int i = 0; i < n; i++)
    if (twins[i] == c->inputs[0]) return true;
  return false;
}

/* A BUFFER target takes the gradients of its twins in the graph (buffer_twin) too, summed. */
static void compute_grads_plain(UOp *loss, UOp *seed, UOp **targets, int n, UOp **out) {
  Topo t;
  PtrMap by;
  graph_index(loss, &t, &by);
  PtrVec ts = {0};
  int *first = tg_xmalloc(sizeof(int) * (size_t)(n + 1)), *count = tg_xcalloc((size_t)(n + 1), sizeof(int));
  bool twins = false;
  for (int i = 0; i < n; i++) {
    first[i] = (int)ts.n;
    pv_push(&ts, targets[i]), count[i] = 1;
    const UOp *b = buffer_of(targets[i]);
    const PtrVec *v = b ? pm_get(&by, (uint64_t)(uintptr_t)b->arg.p) : NULL;
    for (size_t j = 0; v && j < v->n; j++)
      if (v->p[j] != targets[i] && buffer_twin(targets[i], v->p[j])) pv_push(&ts, v->p[j]), count[i]++, twins = true;
  }
  if (!twins) {
    compute_grads_nodes(&t, loss, seed, targets, n, out);
  } else {
    UOp **gs = tg_xmalloc(sizeof(UOp *) * ts.n);
    compute_grads_nodes(&t, loss, seed, (UOp **)ts.p, (int)ts.n, gs);
    for (int i = 0; i < n; i++) {
      UOp *g = NULL;
      for (int j = first[i]; j < first[i] + count[i]; j++) {
        if (!gs[j]) continue;
        if (passed_on(ts.p[j], (UOp *const *)ts.p + first[i], count[i])) {
          uop_unref(gs[j]);
          continue;
        }
        if (!g) {
          g = gs[j];
        } else {
          UOp *sum = bin(OP_ADD, g, gs[j]);
          uop_unref(g), uop_unref(gs[j]);
          g = sum;
        }
      }
      out[i] = g;
    }
    free(gs);
  }
  graph_free(&t, &by);
  pv_free(&ts);
  free(first), free(count);
}

/* t: loss's graph, walked (graph_index) */
static void compute_grads_nodes(const Topo *t, UOp *loss, UOp *seed, UOp **targets, int n, UOp **out) {
  /* nodes on a path to a target */
  PtrMap on_path;
  pm_init(&on_path);
  for (int i = 0; i < n; i++) pm_put(&on_path, (uint64_t)(uintptr_t)targets[i], (void *)1);
  for (size_t i = 0; i < t->order.n; i++) {
    UOp *u = t->order.p[i];
    if (u->op == OP_ASSIGN) continue;
    Custom *c = custom_of(u);
    int ns = c ? c->n : (int)u->nsrc;
    for (int j = 0; j < ns; j++)
      if (pm_has(&on_path, (uint64_t)(uintptr_t)(c ? c->inputs[j] : u->src[j]))) pm_put(&on_path, (uint64_t)(uintptr_t)u, (void *)1);
  }
  PtrMap grads; /* node -> owned grad */
  pm_init(&grads);
  pm_put(&grads, (uint64_t)(uintptr_t)loss, uop_ref(seed));
  for (size_t k = t->order.n; k-- > 0;) {
    UOp *u = t->order.p[k];
    UOp *g = pm_get(&grads, (uint64_t)(uintptr_t)u);
    if (!g || u->op == OP_ASSIGN || !pm_has(&on_path, (uint64_t)(uintptr_t)u)) continue;
    bool is_target = false;
    for (int i = 0; i < n; i++) is_target = is_target || targets[i] == u;
    /* a realized tensor marked requires_grad is a leaf; other realized targets (unset ones, the loss
     * read before its backward) pass the gradient on through their history */
    if (is_target && u->op == OP_BUFFER && (uop_flags(u) & UOPF_GRAD_LEAF)) continue;
    /* a MULTI node (a multi-device value: the loss, or a node a custom gradient was registered on)
     * passes its gradient to its shards; a custom gradient on one runs on the MULTI nodes first */
    if (u->op == OP_MULTI && !custom_of(u)) {
      UOp **mc = tg_xmalloc(sizeof(UOp *) * u->nsrc);
      m_grad_split(u, g, mc);
      for (uint32_t j = 0; j < u->nsrc; j++) {
        UOp *c = mc[j], *s = u->src[j];
        if (!c) continue;
        UOp *prev = pm_get(&grads, (uint64_t)(uintptr_t)s);
        if (prev) {
          UOp *sum = bin(OP_ADD, prev, c);
          uop_unref(prev), uop_unref(c);
          c = sum;
        }
        pm_put(&grads, (uint64_t)(uintptr_t)s, c);
      }
      free(mc);
      continue;
    }
    UOp *cb[8] = {NULL}, **contrib = cb;
    Custom *cu = custom_of(u);
    int ns;
    UOp *const *srcs;
    if (cu && cu->n <= 8) {
      cu->fn(u, g, cu->inputs, cu->n, contrib);
      ns = cu->n;
      srcs = cu->inputs;
    } else {
      /* (an allreduce member over GPUs has one source per GPU) */
      if ((u->nsrc > 3 && u->op != OP_COLLECTIVE) || u->op == OP_BUFFER || u->op == OP_CONST || u->op == OP_IOTA) continue;
      if (u->nsrc > 8) contrib = tg_xcalloc(u->nsrc, sizeof(UOp *));
      grad_rule(u, g, contrib);
      ns = (int)u->nsrc;
      srcs = u->src;
    }
    for (int j = 0; j < ns; j++) {
      UOp *c = contrib[j];
      if (!c) continue;
      UOp *s = srcs[j];
      if (!pm_has(&on_path, (uint64_t)(uintptr_t)s)) {
        uop_unref(c);
        continue;
      }
      UOp *prev = pm_get(&grads, (uint64_t)(uintptr_t)s);
      if (prev) {
        UOp *sum = bin(OP_ADD, prev, c);
        uop_unref(prev), uop_unref(c);
        pm_put(&grads, (uint64_t)(uintptr_t)s, sum);
      } else {
        pm_put(&grads, (uint64_t)(uintptr_t)s, c);
      }
    }
    if (contrib != cb) free(contrib);
  }
  for (int i = 0; i < n; i++) {
    UOp *g = pm_get(&grads, (uint64_t)(uintptr_t)targets[i]);
    out[i] = g ? uop_ref(g) : NULL;
  }
  for (size_t i = 0; i < grads.cap; i++)
    if (grads.keys[i]) uop_unref(grads.vals[i]);
  pm_free(&grads);
  pm_free(&on_path);
}

/* The gradient of the output to start from: ones for a scalar loss, else the caller's (t's shape,
 * cast to t's dtype), as tinygrad's backward(gradient=) / gradient(gradient=). */
static UOp *loss_seed(const char *fn, UOp *l, tg_tensor upstream) {
  if (!tg_dtype_is_float((tg_dtype)l->dtype)) {
    tg_set_error(TG_ERR_INVALID, "%s: the tensor has dtype %s; only float tensors can be differentiated", fn,
                 tg_dtype_name((tg_dtype)l->dtype));
    return NULL;
  }
  if (upstream.id) {
    UOp *g = t_get(upstream, fn);
    if (!g) return NULL;
    if (g->ndim != l->ndim || (g->ndim && memcmp(g->shape, l->shape, sizeof(int64_t) * (size_t)g->ndim))) {
      char a[256], b[256];
      tg_set_error(TG_ERR_INVALID,
                   "%s: the upstream gradient has shape %s but the tensor has shape %s (they must match)", fn,
                   fmt_shape(a, sizeof a, g->shape, g->ndim), fmt_shape(b, sizeof b, l->shape, l->ndim));
      return NULL;
    }
    if (g->device != l->device) {
      tg_set_error(TG_ERR_INVALID,
                   "%s: the upstream gradient is on %s but the tensor is on %s (move it with tg_to)", fn,
                   device_by_id(g->device)->name, device_by_id(l->device)->name);
      return NULL;
    }
    /* the seed is a constant of the backward pass: no gradient flows into it */
    UOp *c = g_cast(g, (tg_dtype)l->dtype), *d = g_detach(c);
    uop_unref(c);
    return d;
  }
  if (shape_numel(l->shape, l->ndim) != 1) {
    char b[256];
    tg_set_error(TG_ERR_INVALID,
                 "%s: loss of shape %s is not a scalar; reduce it first (e.g. tg_sum or tg_mean) or pass the "
                 "upstream gradient (tg_backward_with_grad / tg_gradient_with_grad)",
                 fn, fmt_shape(b, sizeof b, l->shape, l->ndim));
    return NULL;
  }
  return kconst(l, 1.0, (tg_dtype)l->dtype);
}

static tg_status gradient_impl(const char *fn, tg_tensor loss, tg_tensor upstream, const tg_tensor *targets,
                               int n, tg_tensor *out) {
  UOp *l = t_get(loss, fn);
  if (!l) return TG_ERR_HANDLE;
  if (n < 0 || (n > 0 && (!targets || !out)))
    return tg_set_error(TG_ERR_INVALID, "%s: targets/out NULL or n=%d < 0", fn, n);
  UOp **ts = tg_xmalloc(sizeof(UOp *) * (size_t)(n + 1)), **gs = tg_xmalloc(sizeof(UOp *) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    ts[i] = t_get(targets[i], fn);
    if (!ts[i]) {
      free(ts), free(gs);
      return TG_ERR_HANDLE;
    }
  }
  UOp *seed = loss_seed(fn, l, upstream);
  if (!seed) {
    free(ts), free(gs);
    return TG_ERR_INVALID;
  }
  compute_grads(l, seed, ts, n, gs);
  uop_unref(seed);
  tg_status st = TG_OK;
  if (tg_oom_check("tg_gradient")) { /* nothing handed out yet: drop the gradients built */
    for (int i = 0; i < n; i++) uop_unref(gs[i]), out[i] = NONE;
    free(ts), free(gs);
    return TG_ERR_RUNTIME;
  }
  /* a target the loss reads only through non-differentiable ops (a where condition, the sign of
   * copysign, a comparison) gets zeros, as in tinygrad, so several gradients can be asked for at
   * once; one that is not in the loss's graph at all is reported (the wrong tensor, most likely) */
  Topo tp;
  PtrMap by;
  bool walked = false;
  for (int i = 0; i < n; i++) {
    char b[256];
    if (gs[i]) {
      out[i] = t_wrap(gs[i]);
      continue;
    }
    out[i] = NONE;
    if (st != TG_OK) continue;
    if (!tg_dtype_is_float((tg_dtype)ts[i]->dtype)) {
      st = tg_set_error(TG_ERR_INVALID, "%s: target %d has dtype %s; only float tensors have gradients", fn, i,
                        tg_dtype_name((tg_dtype)ts[i]->dtype));
      continue;
    }
    if (!walked) graph_index(l, &tp, &by), walked = true;
    if (graph_holds(&tp, &by, ts[i]))
      out[i] = t_wrap(kconst(ts[i], 0, (tg_dtype)ts[i]->dtype));
    else
      st = tg_set_error(TG_ERR_INVALID, "%s: target %d (shape %s) is not part of the loss's graph", fn, i,
                        fmt_shape(b, sizeof b, ts[i]->shape, ts[i]->ndim));
  }
  if (walked) graph_free(&tp, &by);
  if (st != TG_OK)
    for (int i = 0; i < n; i++) {
      tg_free(out[i]);
      out[i] = NONE;
    }
  free(ts), free(gs);
  return st;
}

tg_status tg_gradient(tg_tensor loss, const tg_tensor *targets, int n, tg_tensor *out) {
  return gradient_impl("tg_gradient", loss, (tg_tensor){0}, targets, n, out);
}
tg_status tg_gradient_with_grad(tg_tensor t, tg_tensor gradient, const tg_tensor *targets, int n,
                                tg_tensor *out) {
  return gradient_impl("tg_gradient_with_grad", t, gradient, targets, n, out);
}

/* The targets of a backward: every live float handle in the loss graph not marked requires_grad
 * false (unset is tinygrad's None, and counts), with a reference to its node (t_each_live's walk). */
typedef struct {
  Topo t;
  PtrMap by;
  PtrVec nodes;
  tg_tensor *h;
  size_t cap;
} TargetScan;
static void target_scan(void *ctx, Slot *s, tg_tensor h) {
  TargetScan *ts = ctx;
  if (s->requires_grad == 0 || !tg_dtype_is_float((tg_dtype)s->u->dtype)) return;
  bool in = graph_holds(&ts->t, &ts->by, s->u);
  if (!in && m_is(s->u)) /* a multi-device tensor is in the graph through its shards */
    for (uint32_t j = 0; j < g_resolve(s->u)->nsrc && !in; j++) in = graph_holds(&ts->t, &ts->by, g_resolve(s->u)->src[j]);
  if (!in) return;
  if (ts->nodes.n == ts->cap) {
    ts->cap = ts->cap ? 2 * ts->cap : 16;
    ts->h = tg_xrealloc(ts->h, sizeof(tg_tensor) * ts->cap);
  }
  ts->h[ts->nodes.n] = h;
  pv_push(&ts->nodes, uop_ref(s->u));
}

static tg_status backward_impl(const char *fn, tg_tensor loss, tg_tensor upstream) {
  UOp *l = t_get(loss, fn);
  if (!l) return TG_ERR_HANDLE;
  UOp *seed = loss_seed(fn, l, upstream);
  if (!seed) return TG_ERR_INVALID;
  TargetScan ts;
  memset(&ts, 0, sizeof ts);
  graph_index(l, &ts.t, &ts.by);
  t_each_live(target_scan, &ts);
  graph_free(&ts.t, &ts.by);
  PtrVec nodes = ts.nodes;
  tg_tensor *handles = ts.h;
  tg_status st = TG_OK;
  if (nodes.n == 0) {
    st = tg_set_error(TG_ERR_INVALID,
                      "%s: no live float tensor in the loss's graph can take a gradient (all are marked "
                      "requires_grad false)",
                      fn);
  } else {
    UOp **gs = tg_xmalloc(sizeof(UOp *) * nodes.n);
    bool *had = tg_xcalloc(nodes.n, sizeof(bool));
    compute_grads(l, seed, (UOp **)nodes.p, (int)nodes.n, gs);
    size_t got = 0;
    for (size_t i = 0; i < nodes.n; i++) {
      if (!gs[i]) continue;
      got++;
      UOp *old = t_grad_ref(handles[i]);
      if (old) { /* the new total; committed below */
        UOp *sum = bin(OP_ADD, old, gs[i]);
        uop_unref(gs[i]), uop_unref(old);
        gs[i] = sum;
        had[i] = true;
      }
    }
    /* An accumulated gradient is stored, as tinygrad's t.grad.assign(t.grad + g) stores it when the
     * step reads it: its value is the sum at the parameters of now. Kept lazy, the earlier terms
     * would be evaluated again at whatever values the parameters have when it is read, after an
     * optimizer step too (a second step without zero_grad used a gradient tinygrad does not). */
    UOp **acc = tg_xmalloc(sizeof(UOp *) * nodes.n);
    int nacc = 0;
    for (size_t i = 0; i < nodes.n; i++)
      if (gs[i] && had[i]) acc[nacc++] = gs[i];
    if (nacc && realize_uops(acc, nacc) != TG_OK) st = tg_last_status();
    free(acc);
    /* short of memory on the way: no gradient changes, so the call can simply be repeated */
    bool oom = st != TG_OK || tg_oom_check("tg_backward");
    for (size_t i = 0; i < nodes.n; i++)
      if (gs[i]) uop_unref(oom ? gs[i] : t_grad_swap(handles[i], gs[i])); /* (a handle freed meanwhile: dropped) */
    free(had);
    if (oom) st = st != TG_OK ? st : TG_ERR_RUNTIME;
    else if (!got)
      st = tg_set_error(TG_ERR_INVALID,
                        "%s: no tensor not marked requires_grad false is reachable from the loss through "
                        "differentiable ops",
                        fn);
    free(gs);
  }
  uop_unref(seed);
  for (size_t i = 0; i < nodes.n; i++) uop_unref(nodes.p[i]);
  pv_free(&nodes);
  free(handles);
  return st;
}

tg_status tg_backward(tg_tensor loss) { return backward_impl("tg_backward", loss, (tg_tensor){0}); }
tg_status tg_backward_with_grad(tg_tensor t, tg_tensor gradient) {
  return backward_impl("tg_backward_with_grad", t, gradient);
}

tg_tensor tg_set_requires_grad(tg_tensor t, bool requires_grad) {
  Slot *s = t_slot(t);
  if (!s) {
    t_get(t, "tg_set_requires_grad");
    return NONE;
  }
  s->requires_grad = requires_grad ? 1 : 0;
  UOp *u = s->u;
  if (requires_grad && u && u->op != OP_BUFFER && !u->sym && !m_is(u) && shape_numel(u->shape, u->ndim) > 0 &&
      t_reads_no_buffer(u)) {
    /* A creation (tg_zeros, tg_ones, tg_full, ...) is one node with every equal creation, whoever
     * made it (two zero biases of one shape, a randn's own constants, a scatter's identity): marked as
     * a leaf lazily, each of them would take the others' gradients. It gets its own buffer now, as
     * tinygrad's tensors each have theirs, so graphs built from it read that. Not the creation
     * node's own realization: equal creations made later read that buffer (a scatter's identity
     * became the leaf), and a view of a realized creation stays a view. */
    if (!t_own_buffer(s, "tg_set_requires_grad")) return NONE;
  }
  if (requires_grad && s->u) t_flag_grad_leaf(s->u);
  return t;
}

bool tg_requires_grad(tg_tensor t) {
  Slot *s = t_slot(t);
  return s && s->requires_grad == 1;
}

tg_tensor tg_grad(tg_tensor t) {
  Slot *s = t_slot(t);
  if (!s) {
    t_get(t, "tg_grad");
    return NONE;
  }
  return s->grad ? t_wrap(uop_ref(s->grad)) : NONE;
}

void tg_zero_grad(tg_tensor t) {
  Slot *s = t_slot(t);
  if (!s) return;
  uop_unref(s->grad);
  s->grad = NULL;
}

tg_status tg_set_grad(tg_tensor t, tg_tensor grad) {
  Slot *s = t_slot(t);
  if (!s) return t_get(t, "tg_set_grad"), TG_ERR_HANDLE;
  UOp *g = NULL;
  if (grad.id) {
    g = t_get(grad, "tg_set_grad");
    if (!g) return TG_ERR_HANDLE;
    if (g->ndim != s->u->ndim || (g->ndim && memcmp(g->shape, s->u->shape, sizeof(int64_t) * (size_t)g->ndim))) {
      char a[256], b[256];
      return tg_set_error(TG_ERR_INVALID, "tg_set_grad: grad shape %s does not match tensor shape %s", fmt_shape(a, sizeof a, g->shape, g->ndim),
                          fmt_shape(b, sizeof b, s->u->shape, s->u->ndim));
    }
    uop_ref(g);
  }
  uop_unref(s->grad);
  s->grad = g;
  return TG_OK;
}
