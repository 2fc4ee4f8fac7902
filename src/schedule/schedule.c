/*
 * schedule.c -- fusion and kernel construction.
 *
 * In: the target nodes of a realize. Out: an ordered list of kernels (each a kernel AST over
 * parameter buffers) and the buffers they use, with last uses marked so the engine can free and
 * reuse memory as soon as it dies.
 *
 * Fusion rules (decided in one pass from consumers to producers):
 *  - realize targets, CONTIGUOUS, COPY and ASSIGN are materialized (each is a kernel "root");
 *  - elementwise and movement nodes are not materialized: every kernel that needs them recomputes
 *    them inline (movement ops become index arithmetic, so views cost nothing);
 *  - a reduction fuses into the kernel its consumers belong to when they all belong to one kernel,
 *    every path up to that kernel's root is only elementwise ops and reshapes (so output positions
 *    map 1:1), and the kernel has no other reduction; otherwise it is materialized as its own
 *    kernel, with the elementwise ops feeding it fused in;
 *  - the source of a COPY is materialized (the copy needs a buffer to copy from);
 *  - an expensive, large elementwise result read by several kernels is materialized rather than
 *    recomputed by each (worth_materializing).
 * Assigns run after every other read of their buffer in the schedule: they are emitted last unless a
 * kernel needs their result, and then the buffer's old contents are first copied aside if another
 * kernel still reads them (see snapshot_if_read_elsewhere).
 * Kernel ASTs are built by propagating index expressions from the output down to the loads:
 * a PAD adds a validity condition, EXPAND zeroes an index, RESHAPE re-linearizes, and the symbolic
 * simplifier (uop.c) folds the results.
 */
#include "schedule.h"

#include <stdio.h>
#include <string.h>

#include "../uop/ptrmap.h"

#define MAXD 64 /* dimensions of a tensor the builder handles on the stack (as the tensor layer) */

typedef struct {
  UOp *n;
  int root;
  bool fusable;
  bool mat;
  bool leaf;
  bool target;
  UOp *fused_reduce;
  int sbuf;
  bool emitted;
  /* what the consumers decided, reported to their sources in decide() */
  int npush;      /* consumers that reported */
  int cand_root;  /* the kernel root all of them belong to; -1 if they differ */
  bool cand_fus;  /* every one reaches that root through elementwise ops and reshapes only */
  bool cand_copy; /* one of them is a COPY, which needs a real buffer to copy from */
  bool cand_perm; /* one of them reaches its root through a PERMUTE */
  UOp *cand_rep;  /* the node whose output index this one is read at (the nearest movement op or root) */
  bool rep_conflict; /* consumers read it at different indices (through different movement ops) */
  UOp *rep;       /* this node's own: cand_rep, or itself for a root */
  bool perm;      /* this node reaches its kernel's root through a PERMUTE */
  bool fused_perm; /* (on a root) its fused reduce is reached through a PERMUTE */
  int *lay;        /* (materialized intermediates) storage order of the dims, outermost first; NULL: as the shape */
  int depth;       /* ops from this node down to the nearest stored value (see depth_bound) */
  bool deep;       /* materialized because it was deeper than the bound */
  bool into_red;   /* a consumer in the same kernel is (or feeds, unmaterialized) a reduction's input */
  int64_t bcast;   /* largest EXPAND output through which a consumer reaches a reduction's input (0: none) */
  bool cast_mat;   /* a CAST of this node is stored (worth_materializing_bcast, or a CONTIGUOUS of it) */
} NI;

typedef struct {
  Schedule *s;
  PtrMap idx; /* node -> index + 1 */
  NI *ni;
  int nn, capn;
  PtrMap bufslot; /* Buffer* -> sbuf index + 1 */
  PtrVec pending_assign; /* NI indices (as intptr) of ASSIGN kernels not yet emitted */
  PtrMap snap;           /* Buffer* -> sbuf index + 1 of a copy of its contents from before an assign */
} SCtx;

static NI *info(SCtx *c, UOp *n) {
  intptr_t i = (intptr_t)pm_get(&c->idx, (uint64_t)(uintptr_t)n);
  return i ? &c->ni[i - 1] : NULL;
}

/* computed where it is read, no buffer behind it */
static bool is_computed_leaf(UOp *n) { return (n->op == OP_CONST || n->op == OP_IOTA) && !uop_realized(n); }
static bool is_leaf_node(UOp *n) { return uop_realized(n) || n->op == OP_BUFFER || n->op == OP_CONST || n->op == OP_IOTA; }

/* Kernel depth bound: a node more than this many ops above the nearest stored value (a leaf or a
 * materialized node) is materialized itself. A lazy graph built by a loop (x = x + y, a million
 * times) is then a chain of kernels of bounded depth instead of one kernel whose building, lowering,
 * rendering and compiling would each recurse a million levels deep. Kernels of ordinary models are
 * far shallower, so this changes nothing for them; DEPTH_SPLIT sets another bound, 8 to 512: building
 * a kernel recurses about once per level (about 1 KB of stack a level): 10 000 levels overflowed an
 * 8 MB stack, 2048 a thread's 1 MB one. */
#define DEPTH_SPLIT_DEFAULT 256

int schedule_depth_bound(void) { return (int)getenv_int_in("DEPTH_SPLIT", DEPTH_SPLIT_DEFAULT, 8, 512); }

/* What a node adds to the depth of the kernels reading it: 0 when they load it from a buffer. */
static int depth_seen_by_consumers(const NI *x) {
  UOp *n = x->n;
  if (x->leaf || x->deep || n->op == OP_CONTIGUOUS || n->op == OP_COPY || n->op == OP_COLLECTIVE || n->op == OP_ASSIGN) return 0;
  return x->depth;
}

typedef struct {
  UOp *n;
  uint32_t next; /* next source to visit */
  bool leaf;
  int depth;     /* 1 + the deepest source seen so far */
} VFrame;

static int64_t node_numel(const UOp *n) {
  int64_t e = 1;
  for (int d = 0; d < n->ndim; d++) e *= n->shape[d];
  return e;
}

/* Does n have more elements than every value it is computed from (looking through movement ops to
 * the nodes below them)? Then it is a broadcast: the product inside a matmul, x[:, None, :] * w,
 * or an EXPAND itself. Stored, it would be the whole broadcast (BERT's feed-forward input times its
 * weight: 9.7 GB), so the depth bound does not cut there but at the reduction above it or the
 * values below it. */
static bool is_broadcast(const UOp *n) {
  if (n->op == OP_EXPAND) return true;
  if (!op_is_alu(n->op)) return false;
  int64_t big = 0;
  for (uint32_t i = 0; i < n->nsrc; i++) {
    const UOp *s = n->src[i];
    for (int k = 0; k < 64 && op_is_movement(s->op) && !uop_realized(s) && s->nsrc; k++) s = s->src[0];
    int64_t e = node_numel(s);
    if (e > big) big = e;
  }
  return node_numel(n) > big;
}

/* Records every node reachable from n in post-order (sources first), once each. Iterative: a graph
 * may be a chain of millions of nodes. */
static void visit(SCtx *c, UOp *n, bool target, int bound) {
  if (pm_has(&c->idx, (uint64_t)(uintptr_t)n)) {
    if (target) info(c, n)->target = true;
    return;
  }
  VFrame *st = NULL;
  size_t ns = 0, cap = 0;
  VFrame top = {n, 0, is_leaf_node(n) && !(target && is_computed_leaf(n)), 1};
  st = tg_xmalloc(sizeof *st * (cap = 64));
  st[ns++] = top;
  while (ns) {
    VFrame *f = &st[ns - 1];
    if (!f->leaf && f->next < f->n->nsrc) {
      UOp *s = f->n->src[f->next++];
      NI *xs = info(c, s);
      if (xs) {
        int d = depth_seen_by_consumers(xs) + 1;
        if (d > f->depth) f->depth = d;
        continue;
      }
      if (ns == cap) st = tg_xrealloc(st, sizeof *st * (cap *= 2));
      st[ns++] = (VFrame){s, 0, is_leaf_node(s), 1};
      continue;
    }
    VFrame done = *f;
    ns--;
    if (c->nn == c->capn) {
      c->capn = c->capn ? c->capn * 2 : 64;
      c->ni = tg_xrealloc(c->ni, sizeof(NI) * (size_t)c->capn);
    }
    NI *x = &c->ni[c->nn++];
    memset(x, 0, sizeof *x);
    x->n = done.n;
    x->leaf = done.leaf;
    x->target = ns == 0 && target;
    x->root = -1;
    x->sbuf = -1;
    x->depth = done.leaf ? 0 : done.depth;
    /* past the bound, a node is stored -- unless it is a broadcast (while the depth stays under twice
     * the bound: a chain of broadcasts must still be cut somewhere) */
    if (!done.leaf && done.depth > bound && (done.depth > 2 * bound || !is_broadcast(done.n))) x->deep = x->mat = true;
    pm_put(&c->idx, (uint64_t)(uintptr_t)done.n, (void *)(intptr_t)c->nn);
    if (ns) {
      int d = depth_seen_by_consumers(x) + 1;
      if (d > st[ns - 1].depth) st[ns - 1].depth = d;
    }
  }
  free(st);
}

/* Consumers before producers (the reverse of the post-order in which visit() recorded the nodes),
 * so when a node is decided every consumer has already reported its kernel root to it. A node all
 * of whose consumers sit in the same kernel belongs to that kernel (a reduce used twice by one
 * elementwise epilogue, as relu(sum(x)) does, still fuses); consumers in different kernels leave it
 * without a root: elementwise nodes are then recomputed in each, a reduce is materialized. */
/* ALU ops needed to compute n inline, counting shared subexpressions once and stopping at leaves
 * and reductions (read from their own buffer); stops counting at `cap`. */
static int inline_cost(SCtx *c, UOp *n, PtrMap *seen, int cap) {
  if (pm_has(seen, (uint64_t)(uintptr_t)n)) return 0;
  pm_put(seen, (uint64_t)(uintptr_t)n, (void *)1);
  NI *x = info(c, n);
  if (!x || x->leaf || x->deep || n->op == OP_REDUCE_AXIS || n->op == OP_CONTIGUOUS || n->op == OP_INDEX) return 0;
  int cost = op_is_alu(n->op) ? 1 : 0;
  for (uint32_t k = 0; k < n->nsrc && cost < cap; k++) cost += inline_cost(c, n->src[k], seen, cap - cost);
  return cost;
}

/* An elementwise result read by several kernels, at least one of them a reduction, is recomputed
 * inline by each of them. When it is expensive (a normalization's backward: the forward
 * recomputed, a comparison mask, a division) and large, it is cheaper to store it once and load it:
 * batchnorm's backward reads its incoming gradient (max_pool2d's backward: a comparison with the
 * recomputed normalized forward) from several reductions and an elementwise kernel. */
#define RECOMPUTE_MAX_OPS 12
#define RECOMPUTE_MIN_NUMEL 65536
static bool worth_materializing(SCtx *c, NI *x) {
  UOp *n = x->n;
  if (!op_is_alu(n->op) || x->npush < 2 || x->cand_root != -1 || node_numel(n) < RECOMPUTE_MIN_NUMEL) return false;
  PtrMap seen;
  pm_init(&seen);
  int cost = inline_cost(c, n, &seen, RECOMPUTE_MAX_OPS + 1);
  pm_free(&seen);
  return cost > RECOMPUTE_MAX_OPS;
}

/* Weighted ALU count of computing n inline (as inline_cost): transcendental and dividing ops count
 * 8, the rest 1. Stops counting at `cap`. */
static int recompute_weight(SCtx *c, UOp *n, PtrMap *seen, int cap) {
  if (pm_has(seen, (uint64_t)(uintptr_t)n)) return 0;
  pm_put(seen, (uint64_t)(uintptr_t)n, (void *)1);
  NI *x = info(c, n);
  if (!x || x->leaf || x->deep || x->mat || n->op == OP_REDUCE_AXIS || n->op == OP_CONTIGUOUS || n->op == OP_INDEX) return 0;
  int op = n->op, cost = 0;
  if (op == OP_EXP2 || op == OP_LOG2 || op == OP_SIN || op == OP_SQRT || op == OP_RECIP || op == OP_FDIV || op == OP_IDIV ||
      op == OP_MOD || op == OP_POW)
    cost = 8;
  else if (op_is_alu(op) && op != OP_CAST && op != OP_BITCAST)
    cost = 1;
  for (uint32_t k = 0; k < n->nsrc && cost < cap; k++) cost += recompute_weight(c, n->src[k], seen, cap - cost);
  return cost;
}

/* An elementwise result that a reduction reads through an EXPAND (the left-hand side of a matmul,
 * broadcast over the output columns; a convolution's input over its output channels) would be
 * recomputed once per broadcast copy inside the reduce loop: gelu(h) @ W computes gelu once per
 * element of h and output column. Stored once, it is loaded instead. Cheap chains (a relu, a cast,
 * an add) stay fused: their recomputation costs less than the extra kernel's store and load. The
 * topmost such node materializes the whole chain below it (its sources fuse into its kernel). */
#define BCAST_RECOMPUTE_MAX 6
static bool worth_materializing_bcast(SCtx *c, NI *x) {
  UOp *n = x->n;
  if (!op_is_alu(n->op) || !x->bcast || x->bcast < 2 * node_numel(n) || x->bcast < RECOMPUTE_MIN_NUMEL) return false;
  PtrMap seen;
  pm_init(&seen);
  int cost = recompute_weight(c, n, &seen, BCAST_RECOMPUTE_MAX + 1);
  pm_free(&seen);
  return cost > BCAST_RECOMPUTE_MAX;
}

static bool dims_to_reduce(SCtx *c, UOp *u, const int *d, UOp *reduce, int *out, int depth);

/* May root r store its dims in another order than its shape's (an intermediate nobody else sees)? */
static bool root_may_reorder(const NI *r) {
  UOp *n = r->n;
  if (r->target || r->cand_copy || n->ndim < 2 || n->ndim > MAXD) return false;
  return n->op == OP_REDUCE_AXIS || op_is_alu(n->op) || (n->op == OP_CONTIGUOUS && n->arg.i == 1);
}

/* Does root (shape order) read `reduce` with the reduction's dims in the same order? Fusing a reduce
 * into a root through permutes builds the kernel in the root's loop order: a root that must keep
 * its shape order (a realize target in NCHW over a channels-last convolution) would then loop with
 * the channels outside and lose their vectorization. */
static bool root_keeps_reduce_order(SCtx *c, UOp *root, UOp *reduce) {
  UOp *value = root->op == OP_CONTIGUOUS ? root->src[0] : root;
  int d[MAXD], at[MAXD];
  if (value->ndim > MAXD || reduce->ndim > MAXD) return false;
  for (int i = 0; i < value->ndim; i++) d[i] = i;
  if (!dims_to_reduce(c, value, d, reduce, at, 0)) return false;
  int last = -1;
  for (int j = 0; j < reduce->ndim; j++) {
    if (at[j] < 0) continue;
    if (at[j] <= last) return false;
    last = at[j];
  }
  return true;
}

static void decide(SCtx *c) {
  for (int i = c->nn - 1; i >= 0; i--) {
    NI *x = &c->ni[i];
    if (x->leaf) continue;
    UOp *n = x->n;
    if (!x->mat && (worth_materializing(c, x) || worth_materializing_bcast(c, x))) {
      x->mat = true;
      NI *s = n->op == OP_CAST ? info(c, n->src[0]) : NULL;
      if (s) s->cast_mat = true;
    }
    if (n->op == OP_CONTIGUOUS && n->src[0]->op == OP_CAST) { /* the matmul's own float32 copy */
      NI *s = info(c, n->src[0]->src[0]);
      if (s) s->cast_mat = true;
    }
    /* A float16 value widened for a matmul: the widening CAST is what the bcast rule stores, so
     * the value itself would be recomputed by every other kernel that reads it -- a residual
     * stream through layernorms recomputes every earlier layer (2 x 16 tokens of the float16 BERT
     * encoder: the sixth layer's normalization read 36 buffers). Read by another kernel too, the
     * value is stored as well. */
    if (!x->mat && x->cast_mat && x->npush >= 2 && x->cand_root == -1 && op_is_alu(n->op)) {
      PtrMap seen;
      pm_init(&seen);
      x->mat = recompute_weight(c, n, &seen, BCAST_RECOMPUTE_MAX + 1) > BCAST_RECOMPUTE_MAX;
      pm_free(&seen);
    }
    /* a gather (INDEX) fuses into its consumers' kernel when they are all in one kernel and reach
     * its output 1:1 (an elementwise epilogue: an interpolation's lerp of two gathers); read by a
     * reduction or by several kernels it gets its own small kernel, so consumers read a plain
     * buffer (no data-dependent addresses inside reduce loops, nothing recomputed per use) */
    bool gather_own = n->op == OP_INDEX && !(x->npush > 0 && x->cand_root >= 0 && x->cand_fus);
    if (x->target || n->op == OP_CONTIGUOUS || n->op == OP_COPY || n->op == OP_COLLECTIVE || n->op == OP_ASSIGN || gather_own || x->cand_copy) x->mat = true;
    if (!x->mat && x->npush > 0) {
      x->root = x->cand_root;
      /* through a permute the reduce is evaluated at the index its path gives it (root-order
       * build), so every path from the root must give it the same one */
      x->fusable = x->cand_root >= 0 && x->cand_fus && !(x->cand_perm && x->rep_conflict);
      x->perm = x->cand_perm;
      x->rep = x->rep_conflict ? NULL : x->cand_rep;
    }
    if (x->mat) x->rep = n;
    if (x->mat) {
      x->root = i;
      x->fusable = n->op != OP_REDUCE_AXIS;
      if (n->op == OP_REDUCE_AXIS) x->fused_reduce = n;
    } else if (n->op == OP_REDUCE_AXIS) {
      NI *r = x->root >= 0 ? &c->ni[x->root] : NULL;
      if (x->fusable && r && !r->fused_reduce &&
          (!x->perm || root_may_reorder(r) || root_keeps_reduce_order(c, r->n, n))) {
        r->fused_reduce = n;
        r->fused_perm = x->perm;
      } else {
        x->mat = true;
        x->root = i;
        x->fused_reduce = n;
      }
    }
    /* report to the sources: output positions pass through 1:1 only across elementwise ops,
     * reshapes and permutes (a reduce's input loop is not its output) */
    int op = n->op;
    bool through = x->fusable && op != OP_REDUCE_AXIS &&
                   (op_is_alu(op) || op == OP_RESHAPE || op == OP_PERMUTE || op == OP_CONTIGUOUS || op == OP_ASSIGN || op == OP_DETACH);
    bool perm = through && (op == OP_PERMUTE || (!x->mat && x->perm));
    UOp *rep = (op == OP_PERMUTE || op == OP_RESHAPE) ? n : x->rep;
    /* reduction inputs and the broadcasts into them, for worth_materializing_bcast */
    bool red = op == OP_REDUCE_AXIS || (!x->mat && x->into_red);
    int64_t bcast = x->mat ? 0 : x->bcast;
    if (!x->mat && op == OP_EXPAND && x->into_red && node_numel(n) > bcast) bcast = node_numel(n);
    for (uint32_t k = 0; k < n->nsrc; k++) {
      bool dup = false;
      for (uint32_t j = 0; j < k && !dup; j++) dup = n->src[j] == n->src[k];
      NI *s = dup ? NULL : info(c, n->src[k]);
      if (!s) continue; /* leaves take reports too: an assign asks who else reads its buffer */
      if (s->npush++ == 0) {
        s->cand_root = x->root;
        s->cand_fus = through;
        s->cand_rep = rep;
      } else {
        if (s->cand_root != x->root) s->cand_root = -1;
        s->cand_fus = s->cand_fus && through;
        if (s->cand_rep != rep) s->rep_conflict = true;
      }
      if (op == OP_COPY || op == OP_COLLECTIVE) s->cand_copy = true;
      if (perm) s->cand_perm = true;
      if (red) s->into_red = true;
      if (bcast > s->bcast) s->bcast = bcast;
    }
  }
}

/* ---- buffers ---- */
static int sbuf_new(Schedule *s, Device *dev, size_t nbytes, UOp *node) {
  if (s->nbufs == s->capbufs) {
    s->capbufs = s->capbufs ? s->capbufs * 2 : 16;
    s->bufs = tg_xrealloc(s->bufs, sizeof(SBuf) * (size_t)s->capbufs);
  }
  SBuf *b = &s->bufs[s->nbufs];
  memset(b, 0, sizeof *b);
  b->dev = dev;
  b->nbytes = nbytes;
  b->last_use = -1;
  b->node = node;
  return s->nbufs++;
}

/* sbuf for an existing Buffer (deduplicated by Buffer identity, so aliasing views share a param) */
static int sbuf_existing(SCtx *c, Buffer *buf, UOp *node) {
  intptr_t i = (intptr_t)pm_get(&c->bufslot, (uint64_t)(uintptr_t)buf);
  if (i) return (int)i - 1;
  int k = sbuf_new(c->s, buf->dev, buf->nbytes, node);
  c->s->bufs[k].buf = buffer_ref(buf);
  c->s->bufs[k].keep = true;
  pm_put(&c->bufslot, (uint64_t)(uintptr_t)buf, (void *)(intptr_t)(k + 1));
  return k;
}

static int leaf_sbuf(SCtx *c, NI *x) {
  if (x->sbuf >= 0) return x->sbuf;
  UOp *b = uop_realized(x->n) ? uop_realized(x->n) : x->n;
  TG_ASSERT(b->op == OP_BUFFER);
  x->sbuf = sbuf_existing(c, g_buffer_of(b), b);
  return x->sbuf;
}

/* The sbuf a plain read of leaf x loads from: the buffer, or the copy of its old contents taken
 * before an assign overwrote it earlier in this schedule. */
static int read_sbuf(SCtx *c, NI *x) {
  int sb = leaf_sbuf(c, x);
  if (c->snap.len) {
    intptr_t t = (intptr_t)pm_get(&c->snap, (uint64_t)(uintptr_t)c->s->bufs[sb].buf);
    if (t) return (int)t - 1;
  }
  return sb;
}

static SItem *item_new(Schedule *s) {
  if (s->nitems == s->capitems) {
    s->capitems = s->capitems ? s->capitems * 2 : 16;
    s->items = tg_xrealloc(s->items, sizeof(SItem) * (size_t)s->capitems);
  }
  SItem *it = &s->items[s->nitems++];
  memset(it, 0, sizeof *it);
  return it;
}

/* ---- kernel building ---- */
typedef struct {
  SCtx *c;
  UOp *root;
  UOp *reduce_node;
  UOp *reduce_uop;
  UOp *reduce_at[MAXD]; /* root-order build: the index the reduce was built at (NULL: not yet) */
  bool root_order;
  PtrMap memo;    /* key node -> result */
  PtrVec keys;    /* owned key nodes */
  int *params;    /* sbuf index per param */
  int nparams;
  PtrVec pre;     /* NI indices of pending assigns this kernel reads */
} KB;

/* The index of sbuf in a kernel's param list, appended if it is not there yet. */
static int param_slot(int **params, int *np, int sbuf) {
  for (int i = 0; i < *np; i++)
    if ((*params)[i] == sbuf) return i;
  *params = tg_xrealloc(*params, sizeof(int) * (size_t)(*np + 1));
  (*params)[*np] = sbuf;
  return (*np)++;
}

static int kb_param(KB *kb, int sbuf) { return param_slot(&kb->params, &kb->nparams, sbuf); }

static UOp *k_global(int param, tg_dtype dt) {
  UArg a;
  a.i = param;
  return uop_new(OP_DEFINE_GLOBAL, dt, NULL, 0, NULL, 0, a);
}

/* ---- symbolic dims ----
 * A node's symbolic dims (n->sym, tg_sym codes) become index arithmetic over DEFINE_VAR nodes: loops
 * over them end at the variable's expression, and storage is laid out at their max, so strides stay
 * constants. */
static bool dim_sym(const UOp *n, int i) { return n->sym && sym_is_code(n->sym[i]); }

/* the loop over dim i of n, axis id */
static UOp *k_range(int id, const UOp *n, int i) {
  if (!dim_sym(n, i)) return s_range(id, n->shape[i]);
  UOp *e = sym_expr(n->sym[i]);
  UOp *r = s_range_sym(id, sym_maxval(n->sym[i]), e);
  uop_unref(e);
  return r;
}

/* dim i of n as index arithmetic */
static UOp *dim_expr(const UOp *n, int i) { return dim_sym(n, i) ? sym_expr(n->sym[i]) : s_const(n->shape[i]); }

/* The shape n is stored in: symbolic dims at their max (buf holds it when n has any). */
static const int64_t *store_shape(const UOp *n, int64_t *buf) {
  if (!n->sym) return n->shape;
  for (int i = 0; i < n->ndim; i++) buf[i] = dim_sym(n, i) ? sym_maxval(n->sym[i]) : n->shape[i];
  return buf;
}

static size_t store_bytes(const UOp *n) {
  int64_t b[MAXD];
  const int64_t *sh = n->ndim <= MAXD ? store_shape(n, b) : n->shape;
  return (size_t)shape_numel(sh, n->ndim) * tg_dtype_itemsize((tg_dtype)n->dtype);
}

static UOp *flat_index(UOp **idx, const int64_t *shape, int ndim);
static void unravel(UOp *F, const int64_t *shape, int ndim, UOp **out);

/* The index in `to` of the element at index idx of `from`, across a reshape (same elements in the
 * same order). With symbolic dims the dims are matched in groups (a symbolic dim maps to one dim,
 * concrete dims re-linearize within their group), so no product with a variable arises. */
static void reshape_index(UOp **idx, const UOp *from, const UOp *to, UOp **out) {
  if (!from->sym && !to->sym) {
    UOp *F = flat_index(idx, from->shape, from->ndim);
    unravel(F, to->shape, to->ndim, out);
    uop_unref(F);
    return;
  }
  int ga[MAXD], gb[MAXD];
  int ng = sym_reshape_groups(from->shape, from->sym, from->ndim, to->shape, to->sym, to->ndim, ga, gb);
  if (ng < 0) {
    /* a symbolic dim bound to 1 met a plain size-1 dim (the graph was built treating it as one,
     * as broadcasting does): at this value they are the same, so match them as size-1 dims (a
     * TinyJit capture refuses such values: see Schedule.sym_unit) */
    int64_t fs[MAXD], ts[MAXD];
    for (int i = 0; i < from->ndim; i++) fs[i] = from->sym && from->shape[i] != 1 ? from->sym[i] : from->shape[i];
    for (int j = 0; j < to->ndim; j++) ts[j] = to->sym && to->shape[j] != 1 ? to->sym[j] : to->shape[j];
    ng = sym_reshape_groups(from->shape, fs, from->ndim, to->shape, ts, to->ndim, ga, gb);
  }
  TG_ASSERT(ng >= 0); /* UOPF_SYM_LOST graphs are refused before */
  for (int j = 0; j < to->ndim; j++) out[j] = NULL;
  for (int g = 0; g < ng; g++) {
    UOp *fi[MAXD], *ti[MAXD];
    int64_t fs[MAXD], ts[MAXD];
    int nf = 0, nt = 0, tj[MAXD];
    bool sym = false;
    for (int i = 0; i < from->ndim; i++)
      if (ga[i] == g) fi[nf] = idx[i], fs[nf++] = from->shape[i], sym = sym || dim_sym(from, i);
    for (int j = 0; j < to->ndim; j++)
      if (gb[j] == g) ts[nt] = to->shape[j], tj[nt++] = j;
    if (sym) {
      out[tj[0]] = uop_ref(fi[0]);
      continue;
    }
    UOp *F = flat_index(fi, fs, nf);
    unravel(F, ts, nt, ti);
    uop_unref(F);
    for (int k = 0; k < nt; k++) out[tj[k]] = ti[k];
  }
  for (int j = 0; j < to->ndim; j++)
    if (!out[j]) out[j] = s_const(0);
}

static UOp *flat_index(UOp **idx, const int64_t *shape, int ndim) {
  UOp *acc = s_const(0);
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    if (shape[i] != 1) {
      UOp *t = s_mulc(idx[i], st);
      UOp *nx = s_add(acc, t);
      uop_unref(t);
      uop_unref(acc);
      acc = nx;
    }
    st *= shape[i];
  }
  return acc;
}

/* flat index of idx into a buffer that stores the dims in order lay (NULL: in order) */
static UOp *lay_flat(UOp **idx, const int64_t *shape, int ndim, const int *lay) {
  if (!lay) return flat_index(idx, shape, ndim);
  UOp *pi[MAXD] = {0};
  int64_t ps[MAXD] = {0};
  for (int j = 0; j < ndim; j++) pi[j] = idx[lay[j]], ps[j] = shape[lay[j]];
  return flat_index(pi, ps, ndim);
}

/* loop axis id of each dim: its place in lay, so the kernel's loops follow the storage order */
static void lay_ids(const int *lay, int ndim, int *id) {
  for (int i = 0; i < ndim; i++) id[i] = i;
  if (lay)
    for (int j = 0; j < ndim; j++) id[lay[j]] = j;
}

/* idx_out[j] = (F // stride_j) % shape_j over a contiguous shape */
static void unravel(UOp *F, const int64_t *shape, int ndim, UOp **out) {
  int64_t st = 1;
  /* a 0-size shape has no elements to index (and its strides would divide by 0) */
  bool empty = false;
  for (int j = 0; j < ndim; j++) empty = empty || shape[j] == 0;
  for (int j = ndim - 1; j >= 0; j--) {
    if (shape[j] == 1 || empty) {
      out[j] = s_const(0);
    } else {
      UOp *d = s_divc(F, st);
      out[j] = s_modc(d, shape[j]);
      uop_unref(d);
    }
    st *= shape[j];
  }
}

static UOp *k_zero(tg_dtype dt) { return tg_dtype_is_float(dt) ? uop_const_f(dt, 0.0) : uop_const_i(dt, 0); }

static UOp *k_load(KB *kb, int sbuf, tg_dtype dt, UOp *index, UOp *valid) {
  int p = kb_param(kb, sbuf);
  UOp *g = k_global(p, dt);
  UOp *s[3] = {g, index, valid};
  UArg z = {0};
  UOp *r = uop_new(OP_LOAD, dt, s, valid ? 3 : 2, NULL, 0, z);
  uop_unref(g);
  return r;
}

static UOp *kbuild(KB *kb, UOp *n, UOp **idx, UOp *valid);

static void flush_assign(SCtx *c, int ni_index);

/* The fused reduce evaluated at output index idx (root-order build): its kept axes take idx, its
 * reduced axes get reduce loops of their own (axis ids 100 + dim, after the root's 0..ndim-1). */
static UOp *build_reduce_at(KB *kb, UOp *reduce, UOp **idx) {
  UOp *in = reduce->src[0];
  int k = in->ndim, na = (int)reduce->niarg;
  UOp *ix[MAXD], *rs[MAXD + 1];
  bool red[MAXD] = {false};
  for (int i = 0; i < na; i++) red[reduce->iarg[i]] = true;
  for (int i = 0; i < k; i++) ix[i] = red[i] ? k_range(100 + i, in, i) : uop_ref(idx[i]);
  UOp *vin = kbuild(kb, in, ix, NULL);
  rs[0] = vin;
  for (int i = 0; i < na; i++) rs[i + 1] = ix[reduce->iarg[i]];
  UOp *r = uop_new(OP_REDUCE, (tg_dtype)reduce->dtype, rs, na + 1, NULL, 0, reduce->arg);
  uop_unref(vin);
  for (int i = 0; i < k; i++) uop_unref(ix[i]);
  for (int i = 0; i < reduce->ndim; i++) kb->reduce_at[i] = idx[i]; /* kept alive by the memo's keys */
  return r;
}

/* A load of node n (a leaf, or an intermediate stored by an earlier kernel; info x) at flat
 * position fi of its storage. */
static UOp *stored_load(KB *kb, UOp *n, NI *x, UOp *fi, UOp *valid) {
  SCtx *c = kb->c;
  int sb;
  if (x->leaf) {
    sb = read_sbuf(c, x);
  } else {
    if (n->op == OP_ASSIGN && !x->emitted) flush_assign(c, (int)(x - c->ni));
    sb = x->sbuf;
    TG_ASSERT(sb >= 0);
  }
  return k_load(kb, sb, (tg_dtype)n->dtype, fi, valid);
}

/* ---- gather indices computed from positions ----
 * An index built only from iotas and constants (an interpolation's source row, an arange) is
 * rebuilt as symbolic index arithmetic, which carries bounds: a gather whose index provably stays
 * in range then loads without the wrap and the mask, at an address the vectorizer can follow. Only
 * where the value semantics agree exactly: no wrap-around in the value's dtype (bounds checked),
 * division and modulo of non-negative values by positive constants. NULL: not convertible. */
static bool fits_dtype(const UOp *s, tg_dtype dt) {
  if (s->vmin == INT64_MIN || s->vmax == INT64_MAX) return false;
  switch (dt) {
  case TG_INT32: return s->vmin >= INT32_MIN && s->vmax <= INT32_MAX;
  case TG_UINT32: return s->vmin >= 0 && s->vmax <= (int64_t)UINT32_MAX;
  case TG_INT64: return true;
  default: return false;
  }
}

/* Results are memoized per conversion (m: node -> result, SYM_NONE for "not convertible"; bool
 * questions under the node's address + 1): shared subexpressions, such as a clamp's operand read
 * by its comparison and by its select, are converted once, not once per path. */
static char sym_none_;
#define SYM_NONE ((void *)&sym_none_)
static UOp *sym_index(PtrMap *m, UOp *u, int depth);
static UOp *sym_bool(PtrMap *m, UOp *u, int depth);

static UOp *sym_index_(PtrMap *m, UOp *u, int depth) {
  if (depth > 64) return NULL;
  if (u->op == OP_RANGE) return uop_ref(u);
  tg_dtype dt = (tg_dtype)u->dtype; /* int64 values and index arithmetic share a dtype */
  if (dt != TG_INT32 && dt != TG_UINT32 && dt != TG_INT64) return NULL;
  UOp *a = NULL, *b = NULL, *r = NULL;
  switch (u->op) {
  case OP_CONST:
    return s_const(u->arg.i);
  case OP_CAST:
    r = tg_dtype_is_int((tg_dtype)u->src[0]->dtype) ? sym_index(m, u->src[0], depth + 1) : NULL; /* DT_INDEX is int64 */
    break;
  case OP_ADD:
    if ((a = sym_index(m, u->src[0], depth + 1)) && (b = sym_index(m, u->src[1], depth + 1))) r = s_add(a, b);
    break;
  case OP_MUL:
    if ((a = sym_index(m, u->src[0], depth + 1)) && (b = sym_index(m, u->src[1], depth + 1))) {
      if (b->op == OP_CONST) r = s_mulc(a, b->arg.i);
      else if (a->op == OP_CONST) r = s_mulc(b, a->arg.i);
    }
    break;
  case OP_NEG:
    if ((a = sym_index(m, u->src[0], depth + 1))) r = s_mulc(a, -1);
    break;
  case OP_MAX:
    if ((a = sym_index(m, u->src[0], depth + 1)) && (b = sym_index(m, u->src[1], depth + 1)))
      r = a->vmin >= b->vmax ? uop_ref(a) : b->vmin >= a->vmax ? uop_ref(b) : uop_alu(OP_MAX, DT_INDEX, a, b, NULL);
    break;
  case OP_SUB:
    if ((a = sym_index(m, u->src[0], depth + 1)) && (b = sym_index(m, u->src[1], depth + 1))) {
      UOp *nb = s_mulc(b, -1);
      r = s_add(a, nb);
      uop_unref(nb);
    }
    break;
  case OP_IDIV: case OP_MOD:
    if ((a = sym_index(m, u->src[0], depth + 1)) && (b = sym_index(m, u->src[1], depth + 1)) && b->op == OP_CONST &&
        b->arg.i > 0 && a->vmin >= 0)
      r = u->op == OP_IDIV ? s_divc(a, b->arg.i) : s_modc(a, b->arg.i);
    break;
  case OP_WHERE: {
    UOp *c = sym_bool(m, u->src[0], depth + 1);
    if (c && c->op == OP_CONST) {
      r = sym_index(m, u->src[c->arg.i ? 1 : 2], depth + 1);
    } else if (c && (a = sym_index(m, u->src[1], depth + 1)) && (b = sym_index(m, u->src[2], depth + 1))) {
      r = uop_alu(OP_WHERE, DT_INDEX, c, a, b);
    }
    uop_unref(c);
    break;
  }
  default:
    break;
  }
  uop_unref(a), uop_unref(b);
  if (r && !fits_dtype(r, dt)) uop_unref(r), r = NULL;
  return r;
}

/* A condition over such values: a constant when the bounds decide it, else a symbolic comparison. */
static UOp *sym_bool_(PtrMap *m, UOp *u, int depth) {
  if (depth > 64 || u->dtype != TG_BOOL) return NULL;
  UOp *a = NULL, *b = NULL, *r = NULL;
  switch (u->op) {
  case OP_CONST:
    return uop_const_i(TG_BOOL, u->arg.i != 0);
  case OP_CMPLT:
    if (u->src[0]->dtype == TG_BOOL) {
      if ((a = sym_bool(m, u->src[0], depth + 1)) && (b = sym_bool(m, u->src[1], depth + 1)) && a->op == OP_CONST &&
          b->op == OP_CONST)
        r = uop_const_i(TG_BOOL, a->arg.i < b->arg.i);
    } else if ((a = sym_index(m, u->src[0], depth + 1)) && (b = sym_index(m, u->src[1], depth + 1))) {
      if (b->op == OP_CONST) r = s_ltc(a, b->arg.i);
      else if (a->op == OP_CONST) r = s_gec(b, a->arg.i + 1);
      else if (a->vmax < b->vmin || a->vmin >= b->vmax) r = uop_const_i(TG_BOOL, a->vmax < b->vmin);
    }
    break;
  case OP_CMPNE: case OP_CMPEQ: {
    bool ne = u->op == OP_CMPNE;
    if (u->src[0]->dtype == TG_BOOL) {
      a = sym_bool(m, u->src[0], depth + 1), b = a ? sym_bool(m, u->src[1], depth + 1) : NULL;
    } else {
      a = sym_index(m, u->src[0], depth + 1), b = a ? sym_index(m, u->src[1], depth + 1) : NULL;
    }
    if (a && b && a->op == OP_CONST && b->op == OP_CONST) {
      r = uop_const_i(TG_BOOL, (a->arg.i != b->arg.i) == ne);
    } else if (a && b && u->src[0]->dtype != TG_BOOL && (a->vmax < b->vmin || b->vmax < a->vmin)) {
      r = uop_const_i(TG_BOOL, ne); /* ranges apart: never equal */
    }
    break;
  }
  case OP_AND: case OP_OR:
    if ((a = sym_bool(m, u->src[0], depth + 1)) && (b = sym_bool(m, u->src[1], depth + 1))) {
      if (u->op == OP_AND) {
        r = s_and(a, b);
      } else if (a->op == OP_CONST || b->op == OP_CONST) {
        UOp *k = a->op == OP_CONST ? a : b, *o = k == a ? b : a;
        r = k->arg.i ? uop_ref(k) : uop_ref(o);
      }
    }
    break;
  case OP_NEG: /* logical not */
    if ((a = sym_bool(m, u->src[0], depth + 1)) && a->op == OP_CONST) r = uop_const_i(TG_BOOL, !a->arg.i);
    else if (a && a->op == OP_CMPLT && a->src[1]->op == OP_CONST && a->src[0]->dtype == DT_INDEX)
      r = s_gec(a->src[0], a->src[1]->arg.i);
    else if (a && a->op == OP_CMPLT && a->src[0]->op == OP_CONST && a->src[1]->dtype == DT_INDEX)
      r = s_ltc(a->src[1], a->src[0]->arg.i + 1);
    break;
  default:
    break;
  }
  uop_unref(a), uop_unref(b);
  return r;
}

static UOp *sym_memo(PtrMap *m, UOp *u, int depth, bool is_bool) {
  uint64_t key = (uint64_t)(uintptr_t)u + (is_bool ? 1 : 0);
  void *hit = pm_get(m, key);
  if (hit) return hit == SYM_NONE ? NULL : uop_ref(hit);
  UOp *r = is_bool ? sym_bool_(m, u, depth) : sym_index_(m, u, depth);
  pm_put(m, key, r ? (void *)uop_ref(r) : SYM_NONE);
  return r;
}
static UOp *sym_index(PtrMap *m, UOp *u, int depth) { return sym_memo(m, u, depth, false); }
static UOp *sym_bool(PtrMap *m, UOp *u, int depth) { return sym_memo(m, u, depth, true); }

/* The index u as symbolic arithmetic (new ref), or NULL. */
static UOp *sym_convert(UOp *u) {
  PtrMap m;
  pm_init(&m);
  UOp *r = sym_index(&m, u, 0);
  for (size_t i = 0; i < m.cap; i++)
    if (m.keys[i] && m.vals[i] != SYM_NONE) uop_unref(m.vals[i]);
  pm_free(&m);
  return r;
}

/* The row an INDEX reads for index value iv among `rows` rows (new ref), and in *nv the load's
 * validity: `valid` and the row being in range (new ref, NULL for always). An index computed from
 * positions that provably stays in range is used as it is, with no wrap and no mask; any other
 * (data-dependent) index wraps negatives and masks what is out of range. */
/* Bounds that a condition puts on its operands: in a conjunction of `!(a < lo)` and `a < hi` with
 * constant lo, hi, the value a lies in [lo, hi) wherever the condition holds. Each a bounded both
 * ways goes into m (node -> a stand-in index with those bounds: a loop variable of its own, plus
 * lo), so that sym_index treats a data-dependent value as known to be in range; the stand-in is
 * only ever used to bound an expression, never emitted. Returns the number of values bounded. */
typedef struct {
  UOp *a;
  int64_t lo, hi;
  bool has_lo, has_hi;
} CondBound;

static void cond_bounds(UOp *c, CondBound *b, int *nb, int cap, int depth) {
  if (depth > 16) return;
  if (c->op == OP_AND) {
    cond_bounds(c->src[0], b, nb, cap, depth + 1), cond_bounds(c->src[1], b, nb, cap, depth + 1);
    return;
  }
  bool neg = c->op == OP_NEG;
  UOp *lt = neg ? c->src[0] : c;
  if (lt->op != OP_CMPLT || lt->src[1]->op != OP_CONST || !tg_dtype_is_int((tg_dtype)lt->src[0]->dtype)) return;
  UOp *a = lt->src[0];
  int64_t k = lt->src[1]->arg.i;
  int i = 0;
  while (i < *nb && b[i].a != a) i++;
  if (i == *nb) {
    if (*nb == cap) return;
    b[(*nb)++] = (CondBound){a, 0, 0, false, false};
  }
  if (neg) b[i].lo = b[i].has_lo ? (k > b[i].lo ? k : b[i].lo) : k, b[i].has_lo = true;
  else b[i].hi = b[i].has_hi ? (k < b[i].hi ? k : b[i].hi) : k, b[i].has_hi = true;
}

/* x provably in [0, rows) wherever cond holds (x's data-dependent values bounded by cond)? */
static bool in_range_given(UOp *x, UOp *cond, int64_t rows) {
  CondBound b[8];
  int nb = 0;
  cond_bounds(cond, b, &nb, 8, 0);
  PtrMap m;
  pm_init(&m);
  int seeded = 0;
  for (int i = 0; i < nb; i++) {
    if (!b[i].has_lo || !b[i].has_hi || b[i].hi <= b[i].lo) continue;
    UOp *r = s_range(-1000 - i, b[i].hi - b[i].lo), *v = s_addc(r, b[i].lo);
    uop_unref(r);
    pm_put(&m, (uint64_t)(uintptr_t)b[i].a, v); /* the map owns v */
    seeded++;
  }
  UOp *s = seeded ? sym_index(&m, x, 0) : NULL;
  bool ok = s && s->vmin >= 0 && s->vmax < rows;
  uop_unref(s);
  for (size_t i = 0; i < m.cap; i++)
    if (m.keys[i] && m.vals[i] != SYM_NONE) uop_unref(m.vals[i]);
  pm_free(&m);
  return ok;
}

static UOp *index_row(UOp *iv, int64_t rows, UOp *valid, UOp **nv) {
  UOp *si = sym_convert(iv);
  if (si && si->vmin >= 0 && si->vmax < rows) {
    *nv = valid ? uop_ref(valid) : NULL;
    return si;
  }
  uop_unref(si);
  /* where(ok, x, rows): a gather's position, `rows` (masked) where its index is out of range. When
   * ok bounds the data-dependent index so that x stays in range, the load is masked by ok alone,
   * without the negative wrap and the second range check (interpolate's column tables) */
  if (iv->op == OP_WHERE && iv->src[2]->op == OP_CONST && iv->src[2]->arg.i == rows && iv->src[0]->dtype == TG_BOOL &&
      tg_dtype_is_int((tg_dtype)iv->src[1]->dtype) && in_range_given(iv->src[1], iv->src[0], rows)) {
    *nv = s_and(valid, iv->src[0]);
    return uop_alu(OP_CAST, DT_INDEX, iv->src[1], NULL, NULL);
  }
  UOp *ci = uop_alu(OP_CAST, DT_INDEX, iv, NULL, NULL);
  UOp *z = s_const(0), *nn = s_const(rows);
  UOp *neg = uop_alu(OP_CMPLT, TG_BOOL, ci, z, NULL);
  UOp *wr = uop_alu(OP_ADD, DT_INDEX, ci, nn, NULL);
  UOp *row = uop_alu(OP_WHERE, DT_INDEX, neg, wr, ci);
  UOp *lo = uop_alu(OP_CMPLT, TG_BOOL, row, z, NULL);
  UOp *ok_lo = uop_alu(OP_NEG, TG_BOOL, lo, NULL, NULL);
  UOp *ok_hi = uop_alu(OP_CMPLT, TG_BOOL, row, nn, NULL);
  UOp *ok = s_and(ok_lo, ok_hi);
  *nv = s_and(valid, ok);
  UOp *tmp[] = {ci, z, nn, neg, wr, lo, ok_lo, ok_hi, ok};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) uop_unref(tmp[i]);
  return row;
}

static UOp *kbuild_inner(KB *kb, UOp *n, UOp **idx, UOp *valid) {
  SCtx *c = kb->c;
  NI *x = info(c, n);
  tg_dtype dt = (tg_dtype)n->dtype;
  if (n == kb->reduce_node && n != kb->root) {
    if (kb->root_order) {
      if (!kb->reduce_uop) {
        kb->reduce_uop = build_reduce_at(kb, n, idx);
      } else {
        /* decide() fuses through a permute only along a single path: one index */
        for (int i = 0; i < n->ndim; i++) TG_ASSERT(kb->reduce_at[i] == idx[i]);
      }
    }
    return uop_ref(kb->reduce_uop);
  }
  if (is_computed_leaf(n)) {
    /* a constant, or an iota's element index as a value; zero outside `valid` */
    UOp *k = n->op == OP_IOTA ? uop_alu(OP_CAST, dt, idx[0], NULL, NULL)
             : tg_dtype_is_float(dt) ? uop_const_f(dt, n->arg.f)
                                     : uop_const_i(dt, n->arg.i);
    if (!valid) return k;
    UOp *z = k_zero(dt);
    UOp *r = uop_alu(OP_WHERE, dt, valid, k, z);
    uop_unref(k);
    uop_unref(z);
    return r;
  }
  if (x->leaf || (x->mat && n != kb->root)) {
    int64_t ssb[MAXD];
    UOp *fi = lay_flat(idx, n->ndim <= MAXD ? store_shape(n, ssb) : n->shape, n->ndim, x->leaf ? NULL : x->lay);
    UOp *r = stored_load(kb, n, x, fi, valid);
    uop_unref(fi);
    return r;
  }
  int nd = n->ndim;
  if (op_is_alu(n->op)) {
    UOp *s[3] = {NULL, NULL, NULL};
    for (uint32_t i = 0; i < n->nsrc; i++) s[i] = kbuild(kb, n->src[i], idx, valid);
    UOp *r = uop_alu(n->op, dt, s[0], s[1], s[2]);
    for (uint32_t i = 0; i < n->nsrc; i++) uop_unref(s[i]);
    /* NEG of a bool is logical not (not_of, tg_logical_not): not zero-preserving, unlike NEG of a number */
    if (valid && (!(op_flags[n->op] & OPF_ZERO) || (n->op == OP_NEG && dt == TG_BOOL))) {
      UOp *z = k_zero(dt);
      UOp *w = uop_alu(OP_WHERE, dt, valid, r, z);
      uop_unref(z);
      uop_unref(r);
      r = w;
    }
    return r;
  }
  if (op_is_movement(n->op)) {
    UOp *src = n->src[0];
    int snd = src->ndim;
    UOp *sidx_buf[16];
    UOp **sidx = snd <= 16 ? sidx_buf : tg_xmalloc(sizeof(UOp *) * (size_t)snd);
    UOp *nvalid = valid ? uop_ref(valid) : NULL;
    switch (n->op) {
    case OP_RESHAPE: {
      if (n->sym || src->sym) {
        reshape_index(idx, n, src, sidx);
        break;
      }
      UOp *F = flat_index(idx, n->shape, nd);
      NI *xs = info(c, src);
      bool stored = xs->leaf ? !is_computed_leaf(src) : xs->mat && src != kb->root && !xs->lay;
      if (stored && src != kb->reduce_node) {
        /* a reshape of stored row-major data reads it at the same flat position: no
         * div/mod to the source's dims and back (which the simplifier cannot undo when the
         * index is data-dependent, as in a gather) */
        UOp *r = stored_load(kb, src, xs, F, nvalid);
        uop_unref(F);
        uop_unref(nvalid);
        if (sidx != sidx_buf) free(sidx);
        return r;
      }
      unravel(F, src->shape, snd, sidx);
      uop_unref(F);
      break;
    }
    case OP_PERMUTE:
      for (int i = 0; i < nd; i++) sidx[n->iarg[i]] = uop_ref(idx[i]);
      break;
    case OP_EXPAND:
      for (int i = 0; i < nd; i++)
        sidx[i] = (src->shape[i] == 1 && !dim_sym(src, i) && (n->shape[i] != 1 || dim_sym(n, i))) ? s_const(0) : uop_ref(idx[i]);
      break;
    case OP_PAD: {
      int na;
      const int64_t *pa = uop_move_args(n, &na);
      for (int i = 0; i < nd; i++) {
        int64_t before = n->iarg[2 * i];
        if (sym_is_code(pa[2 * i])) {
          UOp *e = sym_expr(pa[2 * i]), *ne = s_mulc(e, -1);
          sidx[i] = s_add(idx[i], ne);
          uop_unref(e), uop_unref(ne);
        } else {
          sidx[i] = s_addc(idx[i], -before);
        }
        if (before || n->iarg[2 * i + 1] || sym_is_code(pa[2 * i]) || sym_is_code(pa[2 * i + 1])) {
          UOp *se = dim_expr(src, i);
          UOp *ge = s_gec(sidx[i], 0), *lt = s_lt(sidx[i], se);
          uop_unref(se);
          UOp *both = s_and(ge, lt);
          UOp *nv = s_and(nvalid, both);
          uop_unref(ge);
          uop_unref(lt);
          uop_unref(both);
          uop_unref(nvalid);
          nvalid = nv;
        }
      }
      break;
    }
    case OP_SHRINK: {
      int na;
      const int64_t *sa = uop_move_args(n, &na);
      for (int i = 0; i < nd; i++) {
        if (sym_is_code(sa[2 * i])) {
          UOp *e = sym_expr(sa[2 * i]);
          sidx[i] = s_add(idx[i], e);
          uop_unref(e);
        } else {
          sidx[i] = s_addc(idx[i], n->iarg[2 * i]);
        }
      }
      break;
    }
    case OP_FLIP:
      for (int i = 0; i < nd; i++) {
        if (n->iarg[i]) {
          UOp *m = s_mulc(idx[i], -1), *se = dim_expr(src, i), *t = s_add(m, se);
          sidx[i] = s_addc(t, -1);
          uop_unref(m), uop_unref(se), uop_unref(t);
        } else {
          sidx[i] = uop_ref(idx[i]);
        }
      }
      break;
    default:
      TG_ASSERT(0);
    }
    UOp *r;
    if (nvalid && nvalid->op == OP_CONST && nvalid->arg.i == 0) {
      r = k_zero(dt); /* the whole access is padding */
    } else {
      UOp *v = (nvalid && nvalid->op == OP_CONST) ? NULL : nvalid;
      r = kbuild(kb, src, sidx, v);
    }
    for (int i = 0; i < snd; i++) uop_unref(sidx[i]);
    if (sidx != sidx_buf) free(sidx);
    uop_unref(nvalid);
    return r;
  }
  if (n->op == OP_CONTIGUOUS || n->op == OP_DETACH) return kbuild(kb, n->src[0], idx, valid);
  if (n->op == OP_INDEX) {
    UOp *data = n->src[0], *ix = n->src[1];
    int k = ix->ndim;
    UOp *iv = kbuild(kb, ix, idx, valid), *nv;
    UOp *row = index_row(iv, data->shape[0], valid, &nv);
    UOp **didx = tg_xmalloc(sizeof(UOp *) * (size_t)(data->ndim + 1));
    didx[0] = row;
    for (int i = 1; i < data->ndim; i++) didx[i] = idx[k + i - 1];
    UOp *r = kbuild(kb, data, didx, nv);
    free(didx);
    uop_unref(iv), uop_unref(row), uop_unref(nv);
    return r;
  }
  TG_ASSERT(0 && "unexpected node in kernel");
  return NULL;
}

static UOp *kbuild(KB *kb, UOp *n, UOp **idx, UOp *valid) {
  UOp *ks_buf[18];
  int nk = n->ndim + 2;
  UOp **ks = nk <= 18 ? ks_buf : tg_xmalloc(sizeof(UOp *) * (size_t)nk);
  ks[0] = n;
  for (int i = 0; i < n->ndim; i++) ks[i + 1] = idx[i];
  int m = n->ndim + 1;
  if (valid) ks[m++] = valid;
  UArg z = {0};
  z.i = valid ? 1 : 0;
  UOp *key = uop_new(OP_NOOP, TG_DTYPE_DEFAULT, ks, m, NULL, 0, z);
  if (ks != ks_buf) free(ks);
  UOp *r = pm_get(&kb->memo, (uint64_t)(uintptr_t)key);
  if (r) {
    uop_unref(key);
    return uop_ref(r);
  }
  r = kbuild_inner(kb, n, idx, valid);
  pm_put(&kb->memo, (uint64_t)(uintptr_t)key, r);
  pv_push(&kb->keys, key);
  uop_ref(r);
  return r;
}

static void kb_free(KB *kb) {
  for (size_t i = 0; i < kb->memo.cap; i++)
    if (kb->memo.keys[i]) uop_unref(kb->memo.vals[i]);
  pm_free(&kb->memo);
  for (size_t i = 0; i < kb->keys.n; i++) uop_unref(kb->keys.p[i]);
  pv_free(&kb->keys);
  free(kb->params);
  uop_unref(kb->reduce_uop);
}

/* Does any LOAD of param 0 use an index other than `sidx`? (in-place hazard for assign) */
static bool reads_out_elsewhere(UOp *u, UOp *sidx, PtrMap *seen) {
  if (pm_has(seen, (uint64_t)(uintptr_t)u)) return false;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  if (u->op == OP_LOAD && u->src[0]->arg.i == 0 && (u->src[1] != sidx || u->nsrc > 2)) return true;
  for (uint32_t i = 0; i < u->nsrc; i++)
    if (reads_out_elsewhere(u->src[i], sidx, seen)) return true;
  return false;
}

/* The store index of an assign into a region of its target (ASSIGN with iarg: the region's bounds,
 * tinygrad's assign to a shrink of a buffer): the value's index idx moved by the region's starts,
 * in the target's storage. NULL for any other root. */
static UOp *region_store(UOp *root, UOp **idx) {
  if (root->op != OP_ASSIGN || !root->niarg) return NULL;
  UOp *t = root->src[0];
  int na;
  const int64_t *ra = uop_move_args(root, &na);
  (void)na;
  UOp *ti[MAXD];
  for (int i = 0; i < t->ndim; i++) {
    UOp *st = sym_expr(ra[2 * i]);
    ti[i] = s_add(idx[i], st);
    uop_unref(st);
  }
  int64_t ssb[MAXD];
  UOp *f = flat_index(ti, store_shape(t, ssb), t->ndim);
  for (int i = 0; i < t->ndim; i++) uop_unref(ti[i]);
  return f;
}

/* Builds the kernel computing `value` (shape of root) into sbuf `out`. Returns the SINK AST or NULL
 * if an in-place hazard was found (only possible when out already holds an input). */
/* Builds the kernel computing root (its value `value`, with `reduce` fused) into sbuf `out`, storing
 * the dims in order lay (NULL: as the shape; only for roots whose value is the node itself or reached
 * root-order). */
static UOp *build_kernel(SCtx *c, UOp *root, UOp *value, UOp *reduce, bool root_order, const int *lay, int out,
                         int **params, int *nparams, bool check_hazard) {
  KB kb;
  memset(&kb, 0, sizeof kb);
  kb.c = c;
  kb.root = root;
  kb_param(&kb, out);
  UOp *sidx, *val;
  int id[MAXD];
  if (reduce && value != reduce && root_order) {
    /* the reduce feeds the root through a permute: loop over the root's output (below) and evaluate
     * the reduce at the index the path gives it */
    kb.reduce_node = reduce;
    kb.root_order = true;
  }
  if (reduce && !kb.root_order) {
    UOp *in = reduce->src[0];
    int k = in->ndim;
    UOp **r = tg_xmalloc(sizeof(UOp *) * (size_t)(k + 1));
    lay_ids(lay, k, id);
    if (lay) /* the reduced dims keep their order, after the output's */
      for (int i = 0; i < (int)reduce->niarg; i++) id[reduce->iarg[i]] = 100 + (int)reduce->iarg[i];
    for (int i = 0; i < k; i++) r[i] = k_range(id[i], in, i);
    UOp *vin = kbuild(&kb, in, r, NULL);
    int na = (int)reduce->niarg;
    UOp **rs = tg_xmalloc(sizeof(UOp *) * (size_t)(na + 1));
    rs[0] = vin;
    for (int i = 0; i < na; i++) rs[i + 1] = r[reduce->iarg[i]];
    kb.reduce_uop = uop_new(OP_REDUCE, (tg_dtype)reduce->dtype, rs, na + 1, NULL, 0, reduce->arg);
    kb.reduce_node = reduce;
    uop_unref(vin);
    free(rs);
    UOp **o = tg_xmalloc(sizeof(UOp *) * (size_t)(k + 1));
    for (int i = 0; i < k; i++) o[i] = (reduce->shape[i] == 1 && in->shape[i] != 1) ? s_const(0) : uop_ref(r[i]);
    for (int i = 0; i < (int)reduce->niarg; i++) {
      uop_unref(o[reduce->iarg[i]]);
      o[reduce->iarg[i]] = s_const(0);
    }
    int64_t ssb[MAXD];
    if (value == reduce) {
      sidx = region_store(root, o);
      if (!sidx) sidx = lay_flat(o, store_shape(reduce, ssb), k, lay);
      val = uop_ref(kb.reduce_uop);
    } else {
      UOp **vi = tg_xmalloc(sizeof(UOp *) * (size_t)(value->ndim + 1));
      reshape_index(o, reduce, value, vi);
      val = kbuild(&kb, value, vi, NULL);
      sidx = region_store(root, vi);
      if (!sidx) sidx = flat_index(vi, store_shape(value, ssb), value->ndim);
      for (int i = 0; i < value->ndim; i++) uop_unref(vi[i]);
      free(vi);
    }
    for (int i = 0; i < k; i++) uop_unref(o[i]), uop_unref(r[i]);
    free(o);
    free(r);
  } else {
    int k = value->ndim;
    lay_ids(lay, k, id);
    UOp **r = tg_xmalloc(sizeof(UOp *) * (size_t)(k + 1));
    for (int i = 0; i < k; i++) r[i] = k_range(id[i], value, i);
    val = kbuild(&kb, value, r, NULL);
    int64_t ssb[MAXD];
    sidx = region_store(root, r);
    if (!sidx) sidx = lay_flat(r, store_shape(value, ssb), k, lay);
    for (int i = 0; i < k; i++) uop_unref(r[i]);
    free(r);
  }
  UOp *ast = NULL;
  bool hazard = false;
  if (check_hazard) {
    PtrMap seen;
    pm_init(&seen);
    hazard = reads_out_elsewhere(val, sidx, &seen);
    pm_free(&seen);
  }
  if (!hazard) {
    tg_dtype odt = (tg_dtype)root->dtype;
    UOp *g = k_global(0, odt);
    UOp *cv = (val->dtype == odt) ? uop_ref(val) : uop_alu(OP_CAST, odt, val, NULL, NULL);
    UOp *st[3] = {g, sidx, cv};
    UArg z = {0};
    UOp *store = uop_new(OP_STORE, odt, st, 3, NULL, 0, z);
    ast = uop_new(OP_SINK, TG_DTYPE_DEFAULT, &store, 1, NULL, 0, z);
    uop_unref(store);
    uop_unref(cv);
    uop_unref(g);
    *params = kb.params;
    *nparams = kb.nparams;
    kb.params = NULL;
  }
  uop_unref(val);
  uop_unref(sidx);
  kb_free(&kb);
  return ast;
}

/* ---- storage order of intermediates ----
 * A materialized intermediate is only read by later kernels of the same schedule, so it may store
 * its dims in any order. It takes the order of its kernel's largest input: a convolution's output is
 * channels-last, and the normalization, activation and pooling after it (whose shapes say
 * (batch, channels, h, w)) then read and write it along the channels, contiguously, instead of
 * striding across it in every kernel. */

/* A malloc'd copy of the storage order, or NULL when it is the shape's own order. */
static int *layout_or_null(const int *order, int k) {
  bool ident = true;
  for (int i = 0; i < k; i++) ident = ident && order[i] == i;
  if (ident) return NULL;
  int *lay = tg_xmalloc(sizeof(int) * (size_t)k);
  memcpy(lay, order, sizeof(int) * (size_t)k);
  return lay;
}

static bool layout_candidate(const NI *x) {
  UOp *n = x->n;
  if (x->target || x->cand_copy || n->ndim < 2 || n->ndim > MAXD || n->sym) return false;
  /* (a CONTIGUOUS keeps row-major order -- tg_contiguous promises it -- unless it was made by
   * g_materialize) */
  bool free_contig = n->op == OP_CONTIGUOUS && n->arg.i == 1;
  if (n->op != OP_REDUCE_AXIS && !op_is_alu(n->op) && !free_contig) return false;
  UOp *value = n->op == OP_CONTIGUOUS ? n->src[0] : n;
  return !x->fused_reduce || x->fused_reduce == value || x->fused_perm;
}

#define COEF_UNKNOWN INT64_MIN

/* the coefficient of loop variable r in index expression u (affine in r), or COEF_UNKNOWN */
static int64_t coef_of(UOp *u, UOp *r) {
  if (u == r) return 1;
  if (u->op == OP_ADD) {
    int64_t a = coef_of(u->src[0], r), b = a == COEF_UNKNOWN ? 0 : coef_of(u->src[1], r);
    return a == COEF_UNKNOWN || b == COEF_UNKNOWN ? COEF_UNKNOWN : a + b;
  }
  if (u->op == OP_MUL && u->src[1]->op == OP_CONST) {
    int64_t a = coef_of(u->src[0], r);
    return a == COEF_UNKNOWN ? a : a * u->src[1]->arg.i;
  }
  return uop_depends_on(u, r) ? COEF_UNKNOWN : 0;
}

/* The storage order for materialized node n whose kernel (built in shape order) is ast: the dims
 * by decreasing stride in the kernel's largest load (among the places of the dims it moves along). NULL
 * when that is the shape order, or the load is no larger than n, or its index is not affine. */
static int *choose_layout(SCtx *c, UOp *n, UOp *ast, const int *params) {
  UOp *store = ast->src[0];
  PtrVec loads = {0};
  uop_collect(store->src[2], OP_LOAD, &loads);
  UOp *best = NULL;
  size_t best_bytes = 0;
  for (size_t i = 0; i < loads.n; i++) {
    UOp *ld = loads.p[i];
    size_t nb = c->s->bufs[params[ld->src[0]->arg.i]].nbytes;
    if (nb > best_bytes) best = ld, best_bytes = nb;
  }
  pv_free(&loads);
  size_t own = (size_t)node_numel(n) * tg_dtype_itemsize((tg_dtype)n->dtype);
  if (!best || best_bytes < own) return NULL;
  int k = n->ndim, nz = 0;
  int64_t co[MAXD];
  int order[MAXD];
  for (int i = 0; i < k; i++) {
    if (n->shape[i] == 1) {
      co[i] = 0;
      continue;
    }
    UOp *r = s_range(i, n->shape[i]);
    co[i] = coef_of(best->src[1], r);
    uop_unref(r);
    if (co[i] == COEF_UNKNOWN) return NULL;
    if (co[i] < 0) co[i] = -co[i];
  }
  /* the dims the load moves along are sorted by stride among their own places; the others (a
   * convolution's output channels, which its input does not depend on) stay where they are */
  int pos[MAXD], srt[MAXD];
  for (int i = 0; i < k; i++) {
    order[i] = i;
    if (co[i] == 0) continue;
    pos[nz] = i;
    int j = nz++;
    while (j > 0 && co[srt[j - 1]] < co[i]) srt[j] = srt[j - 1], j--;
    srt[j] = i;
  }
  for (int j = 0; j < nz; j++) order[pos[j]] = srt[j];
  return layout_or_null(order, k);
}

/* Walks from u (node dim k of u is root dim d[k]) down to `reduce` through elementwise ops and
 * permutes; on arrival, out[j] = the root dim that reduce dim j is read at. False through anything
 * else (a reshape) or when the reduce is not reached. Whether a node leads to the reduce does not
 * depend on the dims carried, so the nodes that do not are remembered (`dead`): a graph of shared
 * subexpressions (an iteration's x used twice per step) has exponentially many paths. */
static bool dims_walk(SCtx *c, UOp *u, const int *d, UOp *reduce, int *out, int depth, PtrMap *dead);
static bool dims_to_reduce(SCtx *c, UOp *u, const int *d, UOp *reduce, int *out, int depth) {
  PtrMap dead;
  pm_init(&dead);
  bool r = dims_walk(c, u, d, reduce, out, depth, &dead);
  pm_free(&dead);
  return r;
}
static bool dims_step(SCtx *c, UOp *u, const int *d, UOp *reduce, int *out, int depth, PtrMap *dead);
static bool dims_walk(SCtx *c, UOp *u, const int *d, UOp *reduce, int *out, int depth, PtrMap *dead) {
  if (pm_has(dead, (uint64_t)(uintptr_t)u)) return false;
  if (dims_step(c, u, d, reduce, out, depth, dead)) return true;
  if (depth <= 64) pm_put(dead, (uint64_t)(uintptr_t)u, (void *)1); /* (past the depth bound: not known dead) */
  return false;
}
static bool dims_step(SCtx *c, UOp *u, const int *d, UOp *reduce, int *out, int depth, PtrMap *dead) {
  if (depth > 64) return false;
  if (u == reduce) {
    memcpy(out, d, sizeof(int) * (size_t)u->ndim);
    return true;
  }
  NI *x = info(c, u);
  if (!x || x->leaf || (x->mat && depth > 0)) return false;
  if (u->op == OP_PERMUTE) {
    int sd[MAXD];
    for (int k = 0; k < u->ndim; k++) sd[u->iarg[k]] = d[k];
    return dims_walk(c, u->src[0], sd, reduce, out, depth + 1, dead);
  }
  if (u->op == OP_RESHAPE) { /* only one that adds or drops size-1 dims maps dims one to one */
    UOp *src = u->src[0];
    int sd[MAXD], i = 0, j = 0;
    if (src->ndim > MAXD) return false;
    for (;;) {
      while (i < u->ndim && u->shape[i] == 1) i++;
      while (j < src->ndim && src->shape[j] == 1) sd[j++] = -1;
      if (i == u->ndim || j == src->ndim) break;
      if (u->shape[i] != src->shape[j]) return false;
      sd[j++] = d[i++];
    }
    if (i != u->ndim || j != src->ndim) return false;
    return dims_walk(c, src, sd, reduce, out, depth + 1, dead);
  }
  if (op_is_alu(u->op) || u->op == OP_DETACH || u->op == OP_CONTIGUOUS) {
    for (uint32_t i = 0; i < u->nsrc; i++)
      if (u->src[i]->ndim == u->ndim && dims_walk(c, u->src[i], d, reduce, out, depth + 1, dead)) return true;
  }
  return false;
}

/* Storage order for a root whose fused reduction is reached through permutes: the reduction's own
 * dim order (a channels-last convolution keeps its output channels innermost, where they vectorize),
 * or NULL when that is the root's shape order or the path is not a plain permutation. */
static int *reduce_order(SCtx *c, UOp *n, UOp *value, UOp *reduce) {
  int k = n->ndim, d[MAXD], at[MAXD], order[MAXD], no = 0;
  if (value->ndim != k || reduce->ndim > MAXD || k > MAXD) return NULL;
  for (int i = 0; i < k; i++) d[i] = i;
  if (!dims_to_reduce(c, value, d, reduce, at, 0)) return NULL;
  bool seen[MAXD] = {false};
  for (int j = 0; j < reduce->ndim; j++) { /* the reduction's dims in its order (-1: a size-1 dim) */
    if (at[j] < 0) continue;
    if (at[j] >= k || seen[at[j]]) return NULL;
    seen[at[j]] = true, order[no++] = at[j];
  }
  for (int i = 0; i < k; i++) /* root dims of size 1 the reduction does not have */
    if (!seen[i]) order[no++] = i;
  return layout_or_null(order, k);
}

static void add_item(SCtx *c, int kind, UOp *ast, int *params, int nparams, Device *dev) {
  Schedule *s = c->s;
  SItem *it = item_new(s);
  it->kind = kind;
  it->ast = ast;
  it->bufs = params;
  it->nbufs = nparams;
  it->dev = dev;
  int me = s->nitems - 1;
  for (int i = 1; i < nparams; i++) s->bufs[params[i]].last_use = me;
  if (s->bufs[params[0]].last_use < me) s->bufs[params[0]].last_use = me;
}

/* A plain copy kernel out[i] = in[i] over `shape` (used when an assign must go through a temp). */
static UOp *copy_ast(tg_dtype dt, int64_t numel) {
  UOp *r = s_range(0, numel);
  UOp *g1 = k_global(1, dt);
  UOp *ls[2] = {g1, r};
  UArg z = {0};
  UOp *ld = uop_new(OP_LOAD, dt, ls, 2, NULL, 0, z);
  UOp *g0 = k_global(0, dt);
  UOp *st[3] = {g0, r, ld};
  UOp *store = uop_new(OP_STORE, dt, st, 3, NULL, 0, z);
  UOp *ast = uop_new(OP_SINK, TG_DTYPE_DEFAULT, &store, 1, NULL, 0, z);
  uop_unref(store);
  uop_unref(g0);
  uop_unref(ld);
  uop_unref(g1);
  uop_unref(r);
  return ast;
}

static void flush_assigns_for(SCtx *c, UOp *root);

static void emit_assign(SCtx *c, NI *x) {
  UOp *n = x->n;
  Device *dev = device_by_id(n->device);
  flush_assigns_for(c, n);
  int *params = NULL, np = 0;
  UOp *ast = build_kernel(c, n, n->src[1], x->fused_reduce, x->fused_perm, NULL, x->sbuf, &params, &np, true);
  if (!ast && n->niarg) {
    /* an assign into a region whose value reads the target elsewhere: computed in place it could
     * read what it already wrote */
    c->s->region_hazard = true;
    x->emitted = true;
    return;
  }
  if (!ast) {
    /* the value reads the target at other positions: compute it into a temp first */
    size_t nbytes = store_bytes(n);
    int tmp = sbuf_new(c->s, dev, nbytes, NULL);
    ast = build_kernel(c, n, n->src[1], x->fused_reduce, x->fused_perm, NULL, tmp, &params, &np, false);
    add_item(c, SI_KERNEL, ast, params, np, dev);
    int *p2 = tg_xmalloc(sizeof(int) * 2);
    p2[0] = x->sbuf, p2[1] = tmp;
    add_item(c, SI_KERNEL, copy_ast((tg_dtype)n->dtype, shape_numel(n->shape, n->ndim)), p2, 2, dev);
  } else {
    add_item(c, SI_KERNEL, ast, params, np, dev);
  }
  x->emitted = true;
}

/* An assign emitted early (a kernel needs its result) runs before kernels still to come; those must
 * still see the buffer's old contents when they read it directly (tinygrad: reads of a buffer in a
 * schedule happen before the assign to it). If the buffer's old contents are read outside the
 * assign's own kernel, copy them aside first and send later plain reads to the copy. Assigns left
 * to the end of the schedule need none of this: every other kernel already ran. */
static void snapshot_if_read_elsewhere(SCtx *c, int ai) {
  int tsb = c->ni[ai].sbuf;
  Buffer *B = c->s->bufs[tsb].buf;
  if (pm_has(&c->snap, (uint64_t)(uintptr_t)B)) return;
  bool elsewhere = false;
  for (int i = 0; i < c->nn && !elsewhere; i++) {
    NI *l = &c->ni[i];
    if (!l->leaf || l->npush == 0) continue;
    UOp *b = g_resolve(l->n);
    if (b->op == OP_BUFFER && g_buffer_of(b) == B) elsewhere = l->cand_root != ai;
  }
  if (!elsewhere) return;
  Device *dev = c->s->bufs[tsb].dev;
  int t = sbuf_new(c->s, dev, c->s->bufs[tsb].nbytes, NULL);
  int *p = tg_xmalloc(sizeof(int) * 2);
  p[0] = t, p[1] = tsb;
  add_item(c, SI_COPY, NULL, p, 2, dev);
  pm_put(&c->snap, (uint64_t)(uintptr_t)B, (void *)(intptr_t)(t + 1));
}

/* Does the kernel rooted at `root` (computing `n` inline) read buffer B directly (a leaf load)? */
static bool kernel_reads_buffer(SCtx *c, UOp *n, UOp *root, Buffer *B, PtrMap *seen) {
  if (pm_has(seen, (uint64_t)(uintptr_t)n)) return false;
  pm_put(seen, (uint64_t)(uintptr_t)n, (void *)1);
  NI *x = info(c, n);
  if (!x) return false;
  if (x->leaf) {
    UOp *b = g_resolve(n);
    return b->op == OP_BUFFER && g_buffer_of(b) == B;
  }
  if (x->mat && n != root) return false; /* loaded from its own kernel's output */
  for (uint32_t i = 0; i < n->nsrc; i++)
    if (kernel_reads_buffer(c, n->src[i], root, B, seen)) return true;
  return false;
}

/* Assigns left to the end run one after another: if a later one still reads the old contents of the
 * buffer assign `ai` writes (two parameters whose updates read each other, as every optimizer step
 * on a multi-layer model does), copy them aside first so it does not see the new values. */
static void snapshot_if_read_by_pending(SCtx *c, int ai) {
  Buffer *B = c->s->bufs[c->ni[ai].sbuf].buf;
  if (pm_has(&c->snap, (uint64_t)(uintptr_t)B)) return;
  bool read = false;
  for (size_t i = 0; i < c->pending_assign.n && !read; i++) {
    intptr_t k = (intptr_t)c->pending_assign.p[i];
    if (k < 0 || k == ai || c->ni[k].emitted) continue;
    UOp *an = c->ni[k].n;
    PtrMap seen;
    pm_init(&seen);
    read = kernel_reads_buffer(c, an->src[1], an, B, &seen);
    pm_free(&seen);
  }
  if (!read) return;
  int tsb = c->ni[ai].sbuf;
  Device *dev = c->s->bufs[tsb].dev;
  int t = sbuf_new(c->s, dev, c->s->bufs[tsb].nbytes, NULL);
  int *p = tg_xmalloc(sizeof(int) * 2);
  p[0] = t, p[1] = tsb;
  add_item(c, SI_COPY, NULL, p, 2, dev);
  pm_put(&c->snap, (uint64_t)(uintptr_t)B, (void *)(intptr_t)(t + 1));
}

static void flush_assign(SCtx *c, int ni_index) {
  for (size_t i = 0; i < c->pending_assign.n; i++) {
    if ((intptr_t)c->pending_assign.p[i] == ni_index) {
      c->pending_assign.p[i] = (void *)(intptr_t)-1;
      snapshot_if_read_elsewhere(c, ni_index);
      emit_assign(c, &c->ni[ni_index]);
      return;
    }
  }
}

/* Pending assigns whose results the kernel rooted at `root` reads (through what it computes inline). */
static void collect_assigns(SCtx *c, UOp *n, UOp *root, PtrMap *seen, PtrVec *out) {
  if (pm_has(seen, (uint64_t)(uintptr_t)n)) return;
  pm_put(seen, (uint64_t)(uintptr_t)n, (void *)1);
  NI *x = info(c, n);
  if (!x || x->leaf) return;
  if (x->mat && n != root) {
    if (n->op == OP_ASSIGN && !x->emitted) pv_push(out, (void *)(intptr_t)(x - c->ni));
    return;
  }
  for (uint32_t i = 0; i < n->nsrc; i++) collect_assigns(c, n->src[i], root, seen, out);
}

/* Emits the pending assigns a kernel needs before that kernel is built, so any snapshot of their
 * old contents is in place before the kernel's own plain reads are decided. */
static void flush_assigns_for(SCtx *c, UOp *root) {
  if (!c->pending_assign.n) return;
  PtrMap seen;
  PtrVec need = {0};
  pm_init(&seen);
  collect_assigns(c, root, root, &seen, &need);
  pm_free(&seen);
  for (size_t i = 0; i < need.n; i++) flush_assign(c, (int)(intptr_t)need.p[i]);
  pv_free(&need);
}

/* ---- window fusion ----
 * A small window maximum (a 2x2 max-pool with stride 2) over a convolution's output materializes
 * the whole output only to reduce it four to one. When the window kernel K2 is the only reader of
 * the buffer K1 writes, K1's value (its reduction included) is inlined at each of K2's loads: K2 then
 * has a reduction inside its window reduction, which the lowering turns into a combining store (the
 * window's loops are global loops; each position max-combines into the output). The
 * buffer is never allocated: beautiful_mnist's evaluation stores its second convolution pooled
 * (122 MiB) instead of whole (488 MiB). Only when each element of the buffer is read once (disjoint
 * windows, no recomputation), and never for an input a maximum's gradient will compare with the
 * maximum again (UOPF_MAX_GRAD): that comparison must see the bits the maximum saw. On GPU devices
 * one work-item computes a whole window (see fuse_windows). */
#define WINDOW_MAX 16

/* The loads of param p in u (appended to v); false if one has a validity mask. */
static bool loads_of(UOp *u, int p, PtrVec *v, PtrMap *seen) {
  if (pm_has(seen, (uint64_t)(uintptr_t)u)) return true;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  if (u->op == OP_LOAD && u->src[0]->op == OP_DEFINE_GLOBAL && u->src[0]->arg.i == p) {
    if (u->nsrc > 2) return false;
    pv_push(v, u);
    return true;
  }
  for (uint32_t i = 0; i < u->nsrc; i++)
    if (!loads_of(u->src[i], p, v, seen)) return false;
  return true;
}

/* Maps one kernel's params (its DEFINE_GLOBAL nodes gl, over sbufs bufs) to fresh nodes numbered
 * in the merged list params; param `drop` maps to a placeholder that leaves the kernel (its loads
 * are replaced). The returned table owns its `to` nodes (subst_free). */
static USubst *renumber_params(const PtrVec *gl, const int *bufs, int drop, int **params, int *np) {
  USubst *s = tg_xmalloc(sizeof(USubst) * (gl->n + 1));
  for (size_t g = 0; g < gl->n; g++) {
    UOp *d = gl->p[g];
    UArg a;
    a.i = d->arg.i == drop ? -1 : param_slot(params, np, bufs[d->arg.i]);
    s[g] = (USubst){d, uop_new(OP_DEFINE_GLOBAL, (tg_dtype)d->dtype, NULL, 0, NULL, 0, a)};
  }
  return s;
}

static void subst_free(USubst *s, size_t n) {
  for (size_t i = 0; i < n; i++) uop_unref(s[i].to);
  free(s);
}

/* Tries to inline item j (K1) into item i (K2); true if done (item j is then dead). */
static bool fuse_window(Schedule *s, int j, int i) {
  SItem *k1 = &s->items[j], *k2 = &s->items[i];
  UOp *st1 = k1->ast->src[0], *st2 = k2->ast->src[0];
  UOp *w = st2->src[2];
  int B = k1->bufs[0];
  if (w->op != OP_REDUCE || w->arg.i != OP_MAX || w->dtype != TG_FLOAT32) return false;
  if (st1->src[2]->dtype != TG_FLOAT32 || (st1->src[2]->op == OP_CAST)) return false;
  int64_t win = 1;
  for (uint32_t r = 1; r < w->nsrc; r++) win *= w->src[r]->iarg[0];
  if (win < 2 || win > WINDOW_MAX) return false;
  /* every element of B read exactly once: as many (output, window position) pairs as elements (and
   * some: an empty tensor has no ranges to fuse) */
  if (s->bufs[k2->bufs[0]].nbytes / 4 * (size_t)win != s->bufs[B].nbytes / 4 || s->bufs[B].nbytes == 0) return false;
  PtrVec red1 = {0}, red2 = {0};
  uop_collect(st1->src[2], OP_REDUCE, &red1);
  uop_collect(w->src[0], OP_REDUCE, &red2);
  size_t nred1 = red1.n, nred2 = red2.n;
  pv_free(&red1), pv_free(&red2);
  PtrMap seen;
  pm_init(&seen);
  int pB = -1;
  for (int q = 1; q < k2->nbufs; q++)
    if (k2->bufs[q] == B) pB = q;
  PtrVec loads = {0};
  /* one load of B (two would each recompute K1's reduction) */
  bool ok = nred1 == 1 && nred2 == 0 && pB > 0 && loads_of(w->src[0], pB, &loads, &seen) && loads.n == 1;
  pm_free(&seen);
  /* K1's store index must be a plain layout: sum of its global ranges times strides */
  PtrVec gr = {0};
  if (ok) uop_collect(st1->src[1], OP_RANGE, &gr);
  int64_t stride[MAXD];
  UOp *z = s_const(0);
  if (ok && gr.n <= MAXD) {
    UOp *acc = s_const(0);
    for (size_t g = 0; g < gr.n; g++) {
      USubst sub[MAXD];
      for (size_t h = 0; h < gr.n; h++) sub[h] = (USubst){gr.p[h], z};
      UOp *one = s_const(1);
      sub[g].to = one;
      UOp *e = uop_substitute(st1->src[1], sub, (int)gr.n);
      stride[g] = e->op == OP_CONST ? e->arg.i : -1;
      ok = ok && stride[g] > 0;
      UOp *t = s_mulc(gr.p[g], stride[g] > 0 ? stride[g] : 1), *nx = s_add(acc, t);
      uop_unref(t), uop_unref(acc), uop_unref(e), uop_unref(one);
      acc = nx;
    }
    ok = ok && acc == st1->src[1];
    uop_unref(acc);
  } else {
    ok = false;
  }
  uop_unref(z);
  for (int q = 0; q < k1->nbufs; q++) ok = ok && (q == 0 || k1->bufs[q] != B); /* K1 reads no B */
  if (!ok) {
    pv_free(&loads), pv_free(&gr);
    return false;
  }
  /* the merged parameter list: K2's without B, then K1's inputs. Each kernel numbers its params
   * from 0 (K1's DEFINE_GLOBAL(2) is the very node K2's is when their dtypes agree), so each
   * kernel's expressions are renumbered by a table of their own */
  int *params = NULL, np = 0;
  PtrVec g2 = {0}, g1 = {0};
  uop_collect(k2->ast, OP_DEFINE_GLOBAL, &g2);
  uop_collect(st1->src[2], OP_DEFINE_GLOBAL, &g1);
  USubst *sub = renumber_params(&g2, k2->bufs, pB, &params, &np), *sub1 = renumber_params(&g1, k1->bufs, -1, &params, &np);
  int ns = (int)g2.n;
  UOp *v1 = uop_substitute(st1->src[2], sub1, (int)g1.n); /* K1's value over the new params */
  /* K1's reduce loops get ids of their own (K2's window loops may use the same ones) */
  PtrVec r1 = {0};
  uop_collect(v1, OP_RANGE, &r1);
  int nsub2 = 0;
  USubst *sub2 = tg_xmalloc(sizeof(USubst) * (r1.n + 1));
  for (size_t q = 0; q < r1.n; q++) {
    bool global = false;
    for (size_t g = 0; g < gr.n; g++) global = global || gr.p[g] == r1.p[q];
    if (global) continue;
    /* keep their order (loops are sorted by id; adjacent loops merge) */
    UOp *r = r1.p[q];
    int rank = 0;
    for (size_t o = 0; o < r1.n; o++) rank += ((UOp *)r1.p[o])->arg.i < r->arg.i;
    sub2[nsub2++] = (USubst){r, s_range(900 + rank, r->iarg[0])};
  }
  UOp *v1r = uop_substitute(v1, sub2, nsub2);
  for (int q = 0; q < nsub2; q++) uop_unref(sub2[q].to);
  free(sub2);
  pv_free(&r1);
  /* each load of B becomes K1's value at the position its index names */
  USubst *ls = tg_xmalloc(sizeof(USubst) * (loads.n + 1));
  for (size_t q = 0; q < loads.n; q++) {
    UOp *L = uop_substitute(((UOp *)loads.p[q])->src[1], sub, ns);
    USubst *gs = tg_xmalloc(sizeof(USubst) * (gr.n + 1));
    for (size_t g = 0; g < gr.n; g++) {
      UOp *d = s_divc(L, stride[g]);
      gs[g] = (USubst){gr.p[g], s_modc(d, ((UOp *)gr.p[g])->iarg[0])};
      uop_unref(d);
    }
    ls[q] = (USubst){uop_substitute(loads.p[q], sub, ns), uop_substitute(v1r, gs, (int)gr.n)};
    for (size_t g = 0; g < gr.n; g++) uop_unref(gs[g].to);
    free(gs);
    uop_unref(L);
  }
  UOp *w2 = uop_substitute(w, sub, ns), *si2 = uop_substitute(st2->src[1], sub, ns);
  UOp *wv = uop_substitute(w2, ls, (int)loads.n);
  for (size_t q = 0; q < loads.n; q++) uop_unref(ls[q].from), uop_unref(ls[q].to);
  free(ls);
  UOp *g0 = uop_substitute(st2->src[0], sub, ns);
  UOp *stv[3] = {g0, si2, wv};
  UArg za = {0};
  UOp *store = uop_new(OP_STORE, (tg_dtype)st2->dtype, stv, 3, NULL, 0, za);
  UOp *ast = uop_new(OP_SINK, TG_DTYPE_DEFAULT, &store, 1, NULL, 0, za);
  uop_unref(store), uop_unref(g0), uop_unref(wv), uop_unref(w2), uop_unref(si2), uop_unref(v1), uop_unref(v1r);
  subst_free(sub, g2.n), subst_free(sub1, g1.n);
  pv_free(&g2), pv_free(&g1), pv_free(&loads), pv_free(&gr);
  uop_unref(k2->ast);
  k2->ast = ast;
  free(k2->bufs);
  k2->bufs = params;
  k2->nbufs = np;
  uop_unref(k1->ast);
  k1->ast = NULL;
  return true;
}

static void mark_images(Schedule *s);

static void fuse_windows(Schedule *s) {
  bool any = false;
  for (int i = 0; i < s->nitems; i++) {
    SItem *k2 = &s->items[i];
    /* the window's positions combine into one output one after another (the first stores, the
     * others max into it): on a GPU, whose work-items run in any order and at once, the lowering
     * gives one work-item the whole window (lower.c, take_window). Not into a 2-D image, whose
     * texels are written whole */
    if (k2->kind != SI_KERNEL || !k2->ast) continue;
    const SBuf *o = &s->bufs[k2->bufs[0]];
    if ((o->buf ? o->buf->img_w : o->img_w) > 0) continue;
    for (int q = 1; q < k2->nbufs; q++) {
      int B = k2->bufs[q];
      SBuf *b = &s->bufs[B];
      if (b->keep || b->buf || b->last_use != i || !b->node || b->node->op != OP_CONTIGUOUS || b->node->arg.i != 1 ||
          (uop_flags(b->node) & UOPF_MAX_GRAD))
        continue;
      int j = -1, readers = 0;
      for (int m = 0; m < s->nitems; m++) {
        SItem *it = &s->items[m];
        if (!it->ast && it->kind == SI_KERNEL) continue;
        if (it->bufs[0] == B) j = m;
        for (int r = 1; r < it->nbufs; r++) readers += it->bufs[r] == B;
      }
      if (j < 0 || j >= i || readers != 1 || s->items[j].kind != SI_KERNEL) continue;
      if (fuse_window(s, j, i)) {
        any = true;
        break;
      }
    }
  }
  if (!any) return;
  int m = 0;
  for (int i = 0; i < s->nitems; i++) {
    if (s->items[i].kind == SI_KERNEL && !s->items[i].ast) {
      free(s->items[i].bufs);
      continue;
    }
    s->items[m++] = s->items[i];
  }
  s->nitems = m;
  for (int b = 0; b < s->nbufs; b++) s->bufs[b].last_use = -1;
  for (int i = 0; i < s->nitems; i++) {
    for (int r = 1; r < s->items[i].nbufs; r++) s->bufs[s->items[i].bufs[r]].last_use = i;
    if (s->bufs[s->items[i].bufs[0]].last_use < i) s->bufs[s->items[i].bufs[0]].last_use = i;
  }
}

/* If kernel `ast` (params as built, writing sbuf out) only copies an intermediate of this schedule
 * to out in the same order -- STORE(i, LOAD(i)) over the whole buffer, same dtype -- returns that
 * intermediate's sbuf, else -1. A CONTIGUOUS of data already stored in its order (a gradient a
 * kernel wrote channels-last, made channels-last again for a convolution) is then no kernel. */
static int pure_copy_source(Schedule *s, UOp *ast, const int *params, int np, int out) {
  if (np != 2 || ast->op != OP_SINK || ast->nsrc != 1) return -1;
  UOp *st = ast->src[0];
  if (st->op != OP_STORE || st->nsrc != 3) return -1;
  UOp *ld = st->src[2];
  if (ld->op != OP_LOAD || ld->nsrc != 2 || ld->src[1] != st->src[1] || ld->dtype != st->dtype) return -1;
  if (ld->src[0]->op != OP_DEFINE_GLOBAL || ld->src[0]->arg.i != 1) return -1;
  const SBuf *in = &s->bufs[params[1]], *o = &s->bufs[out];
  if (in->keep || in->buf || in->nbytes != o->nbytes || in->dev != o->dev) return -1;
  return params[1];
}

/* Records the value of a variable a code binds (-1 for unbound); an error for an unbound variable
 * or one bound to two values in one realize. */
static tg_status note_code(Schedule *s, int64_t code) {
  SymDim d;
  if (!sym_decode(code, &d)) return TG_OK;
  const char *name = "?";
  var_info(d.var, &name, NULL, NULL);
  if (d.value < 0)
    return tg_set_error(TG_ERR_INVALID, "tg_realize: variable '%s' [%lld, %lld] is unbound; bind it with "
                        "tg_var_bind before using it in a size (tg_sym)", name, (long long)d.min, (long long)d.max);
  for (int i = 0; i < s->nvars; i++) {
    if (s->vars[i] != d.var) continue;
    if (s->vals[i] != d.value)
      return tg_set_error(TG_ERR_INVALID, "tg_realize: variable '%s' is bound to %lld and to %lld in one realize",
                          name, (long long)s->vals[i], (long long)d.value);
    return TG_OK;
  }
  s->vars = tg_xrealloc(s->vars, sizeof(int) * (size_t)(s->nvars + 1));
  s->vals = tg_xrealloc(s->vals, sizeof(int64_t) * (size_t)(s->nvars + 1));
  s->vars[s->nvars] = d.var, s->vals[s->nvars++] = d.value;
  return TG_OK;
}

/* The variables of every node's symbolic sizes and arguments, with their values; refuses graphs
 * where a reshape merged or split a symbolic dim. */
static tg_status collect_vars(SCtx *c) {
  for (int i = 0; i < c->nn; i++) {
    UOp *n = c->ni[i].n;
    if (uop_flags(n) & UOPF_SYM_BAKED) c->s->sym_baked = true;
    if (uop_flags(n) & UOPF_SYM_LOST)
      return tg_set_error(TG_ERR_INVALID, "tg_realize: a reshape (or pad) merges or splits a symbolic dim, which is "
                          "not expressible as variable + constant; keep symbolic dims whole");
    for (int k = 0; n->sym && k < n->ndim; k++) {
      tg_status st = note_code(c->s, n->sym[k]);
      if (st != TG_OK) return st;
      if (sym_is_code(n->sym[k]) && n->shape[k] <= 1) c->s->sym_unit = true;
    }
    int na;
    const int64_t *a = (op_is_movement(n->op) || n->op == OP_ASSIGN) ? uop_move_args(n, &na) : NULL;
    for (int k = 0; a && a != n->iarg && k < na; k++) {
      tg_status st = note_code(c->s, a[k]);
      if (st != TG_OK) return st;
    }
    if (n->op == OP_IOTA && n->niarg == 3) {
      tg_status st = note_code(c->s, n->iarg[2]);
      if (st != TG_OK) return st;
    }
  }
  return TG_OK;
}

tg_status schedule_build(Schedule *s, UOp **targets, int n, int *tbuf) {
  SCtx c;
  memset(&c, 0, sizeof c);
  c.s = s;
  memset(s, 0, sizeof *s);
  int bound = schedule_depth_bound();
  for (int i = 0; i < n; i++) visit(&c, targets[i], true, bound);
  tg_status vst = collect_vars(&c);
  if (vst != TG_OK) {
    pm_free(&c.idx);
    free(c.ni);
    schedule_free(s);
    return vst;
  }
  decide(&c);
  for (int i = 0; i < c.nn; i++) {
    NI *x = &c.ni[i];
    if (!x->mat) continue;
    UOp *nd = x->n;
    Device *dev = device_by_id(nd->device);
    size_t nbytes = store_bytes(nd);
    if (nd->op == OP_ASSIGN) {
      NI *t = info(&c, nd->src[0]);
      x->sbuf = leaf_sbuf(&c, t);
      pv_push(&c.pending_assign, (void *)(intptr_t)i);
      continue;
    }
    x->sbuf = sbuf_new(s, dev, nbytes, nd);
    s->bufs[x->sbuf].keep = x->target;
    if (nd->op == OP_CONTIGUOUS && nd->arg.i == 2 && nd->niarg == 2) /* g_image: a 2-D image */
      s->bufs[x->sbuf].img_w = nd->iarg[0], s->bufs[x->sbuf].img_h = nd->iarg[1];
    if (nd->op == OP_COPY) {
      NI *src = info(&c, nd->src[0]);
      if (src->n->op == OP_ASSIGN && !src->emitted) flush_assign(&c, (int)(src - c.ni));
      int in = src->leaf ? read_sbuf(&c, src) : src->sbuf;
      int *params = tg_xmalloc(sizeof(int) * 2);
      params[0] = x->sbuf, params[1] = in;
      add_item(&c, SI_COPY, NULL, params, 2, dev);
      continue;
    }
    if (nd->op == OP_COLLECTIVE) { /* (several sources: a member of an allreduce over devices) */
      int ns = (int)nd->nsrc;
      int *params = tg_xmalloc(sizeof(int) * (size_t)(ns + 1));
      params[0] = x->sbuf;
      for (int k = 0; k < ns; k++) {
        NI *src = info(&c, nd->src[k]);
        if (src->n->op == OP_ASSIGN && !src->emitted) flush_assign(&c, (int)(src - c.ni));
        params[k + 1] = src->leaf ? read_sbuf(&c, src) : src->sbuf;
      }
      add_item(&c, SI_COLLECTIVE, NULL, params, ns + 1, dev);
      s->items[s->nitems - 1].root = nd->arg.i;
      s->items[s->nitems - 1].dtype = nd->dtype;
      s->items[s->nitems - 1].redop = ns > 1 ? (int)nd->iarg[0] : 0;
      continue;
    }
    UOp *value = nd->op == OP_CONTIGUOUS ? nd->src[0] : nd;
    flush_assigns_for(&c, nd);
    int *params = NULL, np = 0;
    UOp *ast = build_kernel(&c, nd, value, x->fused_reduce, x->fused_perm, NULL, x->sbuf, &params, &np, false);
    if (ast && layout_candidate(x) &&
        (x->lay = x->fused_perm ? reduce_order(&c, nd, value, x->fused_reduce) : choose_layout(&c, nd, ast, params)) != NULL) {
      uop_unref(ast);
      free(params);
      params = NULL;
      ast = build_kernel(&c, nd, value, x->fused_reduce, x->fused_perm, x->lay, x->sbuf, &params, &np, false);
    }
    int src = ast && nd->op == OP_CONTIGUOUS && nd->arg.i != 2 && !x->lay ? pure_copy_source(s, ast, params, np, x->sbuf) : -1;
    if (src >= 0) {
      /* the copy would reproduce its source byte for byte: use the source's buffer instead (it is
       * an intermediate of this schedule, so nothing else can write it or hold it) */
      s->bufs[src].keep = s->bufs[src].keep || x->target;
      x->sbuf = src;
      uop_unref(ast);
      free(params);
      continue;
    }
    add_item(&c, SI_KERNEL, ast, params, np, dev);
  }
  for (size_t i = 0; i < c.pending_assign.n; i++) {
    intptr_t k = (intptr_t)c.pending_assign.p[i];
    if (k < 0 || c.ni[k].emitted) continue;
    c.pending_assign.p[i] = (void *)(intptr_t)-1;
    flush_assigns_for(&c, c.ni[k].n); /* assigns whose results it reads go first */
    snapshot_if_read_by_pending(&c, (int)k);
    emit_assign(&c, &c.ni[k]);
  }
  for (int i = 0; i < c.nn; i++) {
    NI *x = &c.ni[i];
    if (!x->mat || x->n->op != OP_ASSIGN) continue;
    s->assigns = tg_xrealloc(s->assigns, sizeof(UOp *) * (size_t)(s->nassigns + 1));
    s->assign_bufs = tg_xrealloc(s->assign_bufs, sizeof(int) * (size_t)(s->nassigns + 1));
    s->assigns[s->nassigns] = x->n;
    s->assign_bufs[s->nassigns++] = x->sbuf;
  }
  if (getenv_int("FUSE_WINDOW", 1) && !s->nvars) fuse_windows(s);
  mark_images(s);
  for (int i = 0; i < n; i++) {
    NI *x = info(&c, targets[i]);
    tbuf[i] = (x && x->mat) ? x->sbuf : -1;
  }
  for (int i = 0; i < c.nn; i++) free(c.ni[i].lay);
  pm_free(&c.idx);
  pm_free(&c.bufslot);
  pm_free(&c.snap);
  pv_free(&c.pending_assign);
  free(c.ni);
  if (s->region_hazard) {
    schedule_free(s);
    return tg_set_error(TG_ERR_INVALID, "tg_assign: the value assigned into a region of a buffer reads that buffer "
                        "outside the region; realize the value first (tg_contiguous + tg_realize)");
  }
  return TG_OK;
}

/* Params held in images (made by g_image here, or realized so earlier) become image params:
 * DEFINE_GLOBAL with iarg {texels per row}, so codegen loads and stores them as texels and the kernel
 * cache tells the two kinds of kernel apart. Done last, after every fusion of the schedule. */
static void mark_images(Schedule *s) {
  for (int i = 0; i < s->nitems; i++) {
    SItem *it = &s->items[i];
    if (it->kind != SI_KERNEL || !it->ast) continue;
    PtrVec gl = {0};
    uop_collect(it->ast, OP_DEFINE_GLOBAL, &gl);
    USubst *sub = tg_xmalloc(sizeof(USubst) * (gl.n + 1));
    int ns = 0;
    for (size_t g = 0; g < gl.n; g++) {
      UOp *d = gl.p[g];
      if (d->niarg || d->arg.i < 0 || d->arg.i >= it->nbufs) continue;
      SBuf *b = &s->bufs[it->bufs[d->arg.i]];
      int64_t w = b->buf ? b->buf->img_w : b->img_w;
      if (w <= 0) continue;
      sub[ns++] = (USubst){d, uop_new(OP_DEFINE_GLOBAL, (tg_dtype)d->dtype, NULL, 0, &w, 1, d->arg)};
    }
    if (ns) {
      UOp *a = uop_substitute(it->ast, sub, ns);
      uop_unref(it->ast);
      it->ast = a;
    }
    for (int j = 0; j < ns; j++) uop_unref(sub[j].to);
    free(sub);
    pv_free(&gl);
  }
}

void schedule_free(Schedule *s) {
  for (int i = 0; i < s->nitems; i++) {
    uop_unref(s->items[i].ast);
    free(s->items[i].bufs);
  }
  for (int i = 0; i < s->nbufs; i++)
    if (s->bufs[i].buf) buffer_unref(s->bufs[i].buf);
  free(s->items);
  free(s->bufs);
  free(s->assigns);
  free(s->assign_bufs);
  free(s->vars);
  free(s->vals);
  memset(s, 0, sizeof *s);
}
