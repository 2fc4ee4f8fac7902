/*
 * bounds.c -- reduce loops that skip the iterations whose every term is zero because of a validity
 * condition (padding).
 *
 * A load of padded data carries the condition under which its position lies inside the real data
 * (`0 <= oy + ky - 4 < 20` for a 5x5 convolution of a 20-row image padded by 4). When every term a
 * reduction adds is zero wherever such a condition is false -- the masked load is a factor of the
 * product it feeds -- the iterations where it is false add nothing, and when the condition is
 * linear in one reduce loop's variable it can be solved for that variable: `4 - oy <= ky < 24 - oy`.
 * The loop then runs over the intersection of those ranges with its own (bounds computed from the
 * enclosing loops' variables), and inside it the condition is known to hold, so the loads lose
 * their masks. A transposed convolution's input gradient spends a third of its multiply-adds on
 * padding without this.
 *
 * Only sums: a product's skipped term would be 1, a maximum's 0 still competes. Skipping changes
 * one thing: a masked zero times an infinite or NaN factor is NaN, and a skipped term is nothing --
 * as in PyTorch's convolution, which never multiplies its padding.
 */
#include <stdio.h>
#include <string.h>

#include "../uop/ptrmap.h"
#include "codegen.h"

/* Appends the comparisons of an AND tree (the conjuncts of a validity condition). */
static void conjuncts(UOp *g, PtrVec *out) {
  if (g->op == OP_AND && g->dtype == TG_BOOL) {
    conjuncts(g->src[0], out);
    conjuncts(g->src[1], out);
  } else if (g->op == OP_CMPLT && g->dtype == TG_BOOL && g->src[0]->dtype == DT_INDEX) {
    pv_push(out, g);
  }
}

static bool has(const PtrVec *v, const UOp *u) {
  for (size_t i = 0; i < v->n; i++)
    if (v->p[i] == u) return true;
  return false;
}

static void add_unique(PtrVec *v, UOp *u) {
  if (!has(v, u)) pv_push(v, u);
}

/* Conditions under which u is zero whenever one of them is false: the masks of loads that are a
 * factor of u (through products, negation, casts and selects of zero). Memoized per node (memo: node
 * -> PtrVec *): bodies share subexpressions, and a walk without it could be exponential. */
static const PtrVec *zero_conds(UOp *u, PtrMap *memo) {
  PtrVec *out = pm_get(memo, (uint64_t)(uintptr_t)u);
  if (out) return out;
  out = tg_xcalloc(1, sizeof *out);
  switch (u->op) {
  case OP_LOAD:
    if (u->nsrc > 2) conjuncts(u->src[2], out);
    break;
  case OP_MUL:
    for (int j = 0; j < 2; j++) {
      const PtrVec *a = zero_conds(u->src[j], memo);
      for (size_t i = 0; i < a->n; i++) add_unique(out, a->p[i]);
    }
    break;
  case OP_ADD: {
    const PtrVec *a = zero_conds(u->src[0], memo), *b = zero_conds(u->src[1], memo);
    for (size_t i = 0; i < a->n; i++)
      if (has(b, a->p[i])) add_unique(out, a->p[i]);
    break;
  }
  case OP_NEG:
  case OP_CAST: {
    if (u->dtype == TG_BOOL || u->src[0]->dtype == TG_BOOL) break;
    const PtrVec *a = zero_conds(u->src[0], memo);
    for (size_t i = 0; i < a->n; i++) pv_push(out, a->p[i]);
    break;
  }
  case OP_WHERE: {
    /* cond ? x : 0 */
    UOp *z = u->src[2];
    if (z->op != OP_CONST || (tg_dtype_is_float((tg_dtype)z->dtype) ? z->arg.f != 0 : z->arg.i != 0)) break;
    conjuncts(u->src[0], out);
    const PtrVec *a = zero_conds(u->src[1], memo);
    for (size_t i = 0; i < a->n; i++) add_unique(out, a->p[i]);
    break;
  }
  default:
    break;
  }
  pm_put(memo, (uint64_t)(uintptr_t)u, out);
  return out;
}

static void memo_free(PtrMap *memo) {
  for (size_t i = 0; i < memo->cap; i++)
    if (memo->keys[i]) {
      pv_free(memo->vals[i]);
      free(memo->vals[i]);
    }
  pm_free(memo);
}

/* Is e an index expression over constants and the loops in `outer` only? */
static bool over(const UOp *e, const PtrVec *outer) {
  if (e->dtype != DT_INDEX) return false;
  switch (e->op) {
  case OP_CONST: return true;
  case OP_RANGE: return has(outer, e);
  case OP_ADD: case OP_MUL: case OP_IDIV: case OP_MOD:
    for (uint32_t i = 0; i < e->nsrc; i++)
      if (!over(e->src[i], outer)) return false;
    return true;
  default: return false;
  }
}

typedef struct {
  UOp *t;
  int64_t k;
} Term;

/* e as a sum of k * term plus a constant (terms not merged). False past cap terms. */
static bool affine(UOp *e, int64_t k, Term *ts, int *n, int cap, int64_t *c) {
  if (e->op == OP_CONST) {
    *c += k * e->arg.i;
    return true;
  }
  if (e->op == OP_ADD && e->dtype == DT_INDEX)
    return affine(e->src[0], k, ts, n, cap, c) && affine(e->src[1], k, ts, n, cap, c);
  if (e->op == OP_MUL && e->dtype == DT_INDEX && e->src[1]->op == OP_CONST)
    return affine(e->src[0], k * e->src[1]->arg.i, ts, n, cap, c);
  if (*n >= cap) return false;
  ts[(*n)++] = (Term){e, k};
  return true;
}

/* Solves "e < m" (lt) or "e >= m" (!lt) for the loop variable R, where m is an expression over the
 * outer loops. On success *b is the bound (over the outer loops) and *upper says R < b (else R >=
 * b). Handles e = +-T + rest with T = R or T = X // d (d > 0, X solved recursively); every other
 * term must be over the outer loops. New reference in *b. */
static bool solve(UOp *e, bool lt, UOp *m, UOp *R, const PtrVec *outer, UOp **b, bool *upper) {
  Term ts[16];
  int n = 0;
  int64_t c = 0;
  if (!affine(e, 1, ts, &n, 16, &c)) return false;
  int at = -1;
  for (int i = 0; i < n; i++) {
    if (!uop_depends_on(ts[i].t, R)) {
      if (!over(ts[i].t, outer)) return false;
      continue;
    }
    if (at >= 0) return false;
    at = i;
  }
  if (at < 0 || (ts[at].k != 1 && ts[at].k != -1)) return false;
  /* nb = m - rest */
  UOp *nb = s_addc(m, -c);
  for (int i = 0; i < n; i++) {
    if (i == at) continue;
    UOp *p = s_mulc(ts[i].t, -ts[i].k), *s = s_add(nb, p);
    uop_unref(p), uop_unref(nb);
    nb = s;
  }
  if (ts[at].k == -1) {
    /* -T < nb <=> T >= 1 - nb;  -T >= nb <=> T < 1 - nb */
    UOp *neg = s_mulc(nb, -1), *s = s_addc(neg, 1);
    uop_unref(neg), uop_unref(nb);
    nb = s;
    lt = !lt;
  }
  UOp *T = ts[at].t;
  bool ok = false;
  if (T == R) {
    *b = uop_ref(nb), *upper = lt;
    ok = true;
  } else if (T->op == OP_IDIV && T->dtype == DT_INDEX && T->src[1]->op == OP_CONST && T->src[1]->arg.i > 0) {
    /* floor(X / d) < p <=> X < d*p;  floor(X / d) >= p <=> X >= d*p */
    UOp *dm = s_mulc(nb, T->src[1]->arg.i);
    ok = solve(T->src[0], lt, dm, R, outer, b, upper);
    uop_unref(dm);
  }
  uop_unref(nb);
  return ok;
}

static UOp *imax(UOp *a, UOp *b) {
  if (a->vmin >= b->vmax) return uop_ref(a);
  if (b->vmin >= a->vmax) return uop_ref(b);
  UOp *lt = uop_alu(OP_CMPLT, TG_BOOL, a, b, NULL), *r = uop_alu(OP_WHERE, DT_INDEX, lt, b, a);
  uop_unref(lt);
  return r;
}

static UOp *imin(UOp *a, UOp *b) {
  if (a->vmax <= b->vmin) return uop_ref(a);
  if (b->vmax <= a->vmin) return uop_ref(b);
  UOp *lt = uop_alu(OP_CMPLT, TG_BOOL, a, b, NULL), *r = uop_alu(OP_WHERE, DT_INDEX, lt, a, b);
  uop_unref(lt);
  return r;
}

void bound_reduce_loops(LKernel *k) {
  if (k->opts_failed || !k->rbody || k->rop != OP_ADD || k->nr == 0 || k->ncopy == 0 || k->rvw) return;
  if (getenv_int("NOOPT", 0) || !getenv_int("LOOP_BOUNDS", 1)) return;
  /* conditions that zero every copy's term */
  PtrVec conds = {0};
  PtrMap memo;
  pm_init(&memo);
  const PtrVec *first = zero_conds(k->rbodies[0], &memo);
  for (size_t i = 0; i < first->n; i++) pv_push(&conds, first->p[i]);
  for (int c = 1; c < k->ncopy && conds.n; c++) {
    const PtrVec *o = zero_conds(k->rbodies[c], &memo);
    size_t m = 0;
    for (size_t i = 0; i < conds.n; i++)
      if (has(o, conds.p[i])) conds.p[m++] = conds.p[i];
    conds.n = m;
  }
  memo_free(&memo);
  if (!conds.n) {
    pv_free(&conds);
    return;
  }
  PtrVec outer = {0}, used = {0};
  for (int i = 0; i < k->ng; i++) pv_push(&outer, k->granges[i]);
  UOp **lo = tg_xcalloc((size_t)k->nr, sizeof(UOp *)), **hi = tg_xcalloc((size_t)k->nr, sizeof(UOp *));
  bool any = false;
  for (int i = 0; i < k->nr; i++) {
    UOp *R = k->rranges[i];
    lo[i] = s_const(0);
    hi[i] = s_const(R->iarg[0]);
    for (size_t j = 0; j < conds.n; j++) {
      UOp *cond = conds.p[j];
      if (!uop_depends_on(cond, R)) continue;
      /* a < b  <=>  a - b < 0 */
      UOp *nb = s_mulc(cond->src[1], -1), *e = s_add(cond->src[0], nb), *zero = s_const(0), *b = NULL;
      bool upper = false;
      if (solve(e, true, zero, R, &outer, &b, &upper)) {
        UOp *nx = upper ? imin(hi[i], b) : imax(lo[i], b);
        if (upper) uop_unref(hi[i]), hi[i] = nx;
        else uop_unref(lo[i]), lo[i] = nx;
        uop_unref(b);
        if (!has(&used, cond)) pv_push(&used, uop_ref(cond));
      }
      uop_unref(nb), uop_unref(e), uop_unref(zero);
    }
    if (lo[i]->op == OP_CONST && hi[i]->op == OP_CONST && lo[i]->arg.i == 0 && hi[i]->arg.i == R->iarg[0]) {
      uop_unref(lo[i]), uop_unref(hi[i]); /* not narrowed: the renderer runs it over 0..size */
      lo[i] = hi[i] = NULL;
    } else {
      any = true;
    }
    pv_push(&outer, R);
  }
  if (any) {
    /* inside the bounded loops the solved conditions hold: the loads keep no mask for them */
    USubst *s = tg_xmalloc(sizeof(USubst) * used.n);
    UOp *t = uop_const_i(TG_BOOL, 1);
    for (size_t i = 0; i < used.n; i++) s[i] = (USubst){used.p[i], t};
    for (int c = 0; c < k->ncopy; c++) {
      UOp *nbody = uop_substitute(k->rbodies[c], s, (int)used.n);
      uop_unref(k->rbodies[c]);
      k->rbodies[c] = nbody;
    }
    uop_unref(t);
    free(s);
    k->rlo = lo, k->rhi = hi;
    size_t o = strlen(k->opts);
    if (o + 8 < sizeof k->opts) snprintf(k->opts + o, sizeof k->opts - o, "%sBOUNDS", o ? " " : "");
  } else {
    free(lo), free(hi);
  }
  for (size_t i = 0; i < used.n; i++) uop_unref(used.p[i]);
  pv_free(&conds), pv_free(&outer), pv_free(&used);
}
