/*
 * describe.c -- text forms of a kernel for DEBUG=5 and DEBUG=6 (every renderer).
 *
 * In: a kernel AST (SINK of one STORE) or a lowered LKernel.
 * Out: malloc'd text, one node per line. Nothing is changed.
 *  - AST (DEBUG=5): nodes in topological order (sources first), each with a small id, its op, its
 *    dtype, the loop space it varies over -- the sizes of the RANGEs it depends on, outermost axis
 *    first, "()" for a loop-invariant node -- its argument and its sources' ids.
 *  - lowered (DEBUG=6): the loop nest the renderer emits (global loops, the split one marked, the
 *    reduce loops with their accumulator, bounds and vector widths) and the instruction list: every
 *    node of every upcast copy, in the order the renderer declares them, with the loop each one is
 *    hoisted to.
 */
#include <stdio.h>
#include <string.h>

#include "../uop/ptrmap.h"
#include "codegen.h"

typedef struct {
  PtrMap id;    /* node -> id + 1 */
  PtrVec order; /* topological order */
} Topo;

static void topo_rec(Topo *t, UOp *u) {
  if (!u || pm_has(&t->id, (uint64_t)(uintptr_t)u)) return;
  pm_put(&t->id, (uint64_t)(uintptr_t)u, (void *)0);
  for (uint32_t i = 0; i < u->nsrc; i++) topo_rec(t, u->src[i]);
  pm_put(&t->id, (uint64_t)(uintptr_t)u, (void *)(uintptr_t)(t->order.n + 1));
  pv_push(&t->order, u);
}

static long node_id(Topo *t, UOp *u) { return (long)(uintptr_t)pm_get(&t->id, (uint64_t)(uintptr_t)u) - 1; }

/* The RANGE nodes u depends on, as a bit set over `ranges` (at most 64 are told apart). */
static uint64_t range_deps(UOp *u, PtrMap *memo, UOp **ranges, int nr) {
  if (pm_has(memo, (uint64_t)(uintptr_t)u)) return (uint64_t)(uintptr_t)pm_get(memo, (uint64_t)(uintptr_t)u);
  uint64_t m = 0;
  if (u->op == OP_RANGE)
    for (int i = 0; i < nr && i < 64; i++)
      if (ranges[i] == u) m |= (uint64_t)1 << i;
  for (uint32_t i = 0; i < u->nsrc; i++) m |= range_deps(u->src[i], memo, ranges, nr);
  pm_put(memo, (uint64_t)(uintptr_t)u, (void *)(uintptr_t)m);
  return m;
}

static int range_axis_cmp(const void *a, const void *b) {
  const UOp *x = *(UOp *const *)a, *y = *(UOp *const *)b;
  return x->arg.i < y->arg.i ? -1 : x->arg.i > y->arg.i;
}

static void put_arg(SB *b, const UOp *u) {
  switch (u->op) {
  case OP_CONST:
    if (tg_dtype_is_float((tg_dtype)u->dtype)) sb_printf(b, " %.9g", u->arg.f);
    else sb_printf(b, " %lld", (long long)u->arg.i);
    break;
  case OP_DEFINE_GLOBAL: sb_printf(b, " data%lld", (long long)u->arg.i); break;
  case OP_RANGE: sb_printf(b, " axis=%lld size=%lld", (long long)u->arg.i, (long long)(u->niarg ? u->iarg[0] : 0)); break;
  case OP_REDUCE: sb_printf(b, " %s", u->arg.i >= 0 && u->arg.i < OP_COUNT ? op_names[u->arg.i] : "?"); break;
  case OP_LOAD:
    if (u->arg.i > 1) sb_printf(b, " vec%lld", (long long)u->arg.i);
    if (u->niarg == 1) sb_printf(b, " gather stride=%lld", (long long)u->iarg[0]);
    break;
  default:
    if (u->niarg && u->op != OP_RANGE) {
      sb_puts(b, " (");
      for (uint32_t i = 0; i < u->niarg; i++) sb_printf(b, "%s%lld", i ? "," : "", (long long)u->iarg[i]);
      sb_puts(b, ")");
    }
  }
}

static void put_srcs(SB *b, Topo *t, const UOp *u) {
  if (!u->nsrc) return;
  sb_puts(b, " src=[");
  for (uint32_t i = 0; i < u->nsrc; i++) sb_printf(b, "%s%ld", i ? "," : "", node_id(t, u->src[i]));
  sb_puts(b, "]");
}

char *kernel_ast_format(UOp *ast) {
  Topo t;
  pm_init(&t.id);
  memset(&t.order, 0, sizeof t.order);
  topo_rec(&t, ast);
  UOp **ranges = tg_xmalloc(sizeof(UOp *) * (t.order.n + 1));
  int nr = 0;
  for (size_t i = 0; i < t.order.n; i++)
    if (((UOp *)t.order.p[i])->op == OP_RANGE) ranges[nr++] = t.order.p[i];
  qsort(ranges, (size_t)nr, sizeof(UOp *), range_axis_cmp);
  PtrMap memo;
  pm_init(&memo);
  SB b;
  sb_init(&b);
  sb_printf(&b, "kernel AST: %zu nodes, %d loops\n", t.order.n, nr);
  for (size_t i = 0; i < t.order.n; i++) {
    UOp *u = t.order.p[i];
    uint64_t m = range_deps(u, &memo, ranges, nr);
    sb_printf(&b, "%4zu %-13s %-8s (", i, op_names[u->op], tg_dtype_name((tg_dtype)u->dtype));
    bool first = true;
    for (int r = 0; r < nr && r < 64; r++)
      if (m >> r & 1) {
        sb_printf(&b, "%s%lld", first ? "" : ",", (long long)ranges[r]->iarg[0]);
        first = false;
      }
    sb_puts(&b, ")");
    put_arg(&b, u);
    put_srcs(&b, &t, u);
    sb_puts(&b, "\n");
  }
  pm_free(&memo);
  free(ranges);
  pm_free(&t.id);
  pv_free(&t.order);
  return sb_take(&b);
}

char *lkernel_format(const LKernel *k) {
  SB b;
  sb_init(&b);
  int nl = k->ng + k->nr;
  UOp **loops = tg_xmalloc(sizeof(UOp *) * (size_t)(nl + 1));
  for (int i = 0; i < k->ng; i++) loops[i] = k->granges[i];
  for (int i = 0; i < k->nr; i++) loops[k->ng + i] = k->rranges[i];
  sb_printf(&b, "lowered kernel: %d global loop%s, %d reduce loop%s, %d upcast cop%s, vector width %d%s%s\n", k->ng,
            k->ng == 1 ? "" : "s", k->nr, k->nr == 1 ? "" : "s", k->ncopy, k->ncopy == 1 ? "y" : "ies",
            k->vw ? k->vw : k->rvw, k->rvw ? " (reduce axis)" : "", k->gpu ? ", GPU kernel model" : "");
  if (k->opts[0]) sb_printf(&b, "opts: %s\n", k->opts);
  for (int i = 0; i < nl; i++) {
    sb_printf(&b, "%*sfor ridx%d", 2 * i, "", i);
    bool red = i >= k->ng;
    if (red && k->rlo && k->rlo[i - k->ng]) sb_printf(&b, " in [bounded, see lo/hi] of %lld", (long long)loops[i]->iarg[0]);
    else if (i == 0 && !k->gpu) sb_printf(&b, " in [gstart, gend) of %lld (split across threads)", (long long)loops[i]->iarg[0]);
    else sb_printf(&b, " in [0, %lld)", (long long)loops[i]->iarg[0]);
    if (red) sb_printf(&b, "  reduce %s into %s accumulators", op_names[k->rop], tg_dtype_name(k->racc));
    else sb_puts(&b, "  global");
    sb_puts(&b, ":\n");
  }
  sb_printf(&b, "%*sstore data0 (%s)%s\n", 2 * nl, "", k->np ? tg_dtype_name(k->pdt[0]) : "?", k->sop ? " max-combining" : "");
  /* instruction list: every expression the renderer consumes, ids in topological order */
  Topo t;
  pm_init(&t.id);
  memset(&t.order, 0, sizeof t.order);
  for (int c = 0; c < k->ncopy; c++) {
    topo_rec(&t, k->rbodies[c]);
    topo_rec(&t, k->values[c]);
    topo_rec(&t, k->sidxs[c]);
    if (k->sfirsts) topo_rec(&t, k->sfirsts[c]);
  }
  for (int i = 0; k->rlo && i < k->nr; i++) topo_rec(&t, k->rlo[i]), topo_rec(&t, k->rhi[i]);
  for (int i = 0; i < k->nfrag; i++) topo_rec(&t, k->tc_frag[i]);
  PtrMap memo;
  pm_init(&memo);
  sb_printf(&b, "instructions (%zu):\n", t.order.n);
  for (size_t i = 0; i < t.order.n; i++) {
    UOp *u = t.order.p[i];
    uint64_t m = range_deps(u, &memo, loops, nl);
    int lvl = -1;
    for (int r = 0; r < nl && r < 64; r++)
      if (m >> r & 1) lvl = r;
    const char *role = "";
    for (int c = 0; c < k->ncopy; c++) {
      if (u == k->rplaces[c]) role = "  <- reduction result";
      else if (u == k->rbodies[c]) role = "  <- accumulated";
      else if (u == k->values[c]) role = "  <- stored value";
      else if (u == k->sidxs[c]) role = "  <- store index";
    }
    for (int i = 0; i < k->nfrag; i++)
      if (u == k->tc_frag[i]) role = i < k->tc_um * k->tc->na ? "  <- tensor core A element" : "  <- tensor core B element";
    sb_printf(&b, "%4zu %-13s %-8s", i, u->op == OP_NOOP ? "ACC" : op_names[u->op], tg_dtype_name((tg_dtype)u->dtype));
    if (lvl < 0) sb_puts(&b, " @top");
    else sb_printf(&b, " @ridx%d", lvl);
    put_arg(&b, u);
    put_srcs(&b, &t, u);
    sb_printf(&b, "%s\n", role);
  }
  pm_free(&memo);
  pm_free(&t.id);
  pv_free(&t.order);
  free(loops);
  return sb_take(&b);
}

char *kernel_lowered_format(UOp *ast, const DeviceCaps *caps, const OptList *opts) {
  LKernel *k = lower_kernel_for(ast, caps, opts);
  char *s = lkernel_format(k);
  lkernel_free(k);
  return s;
}
