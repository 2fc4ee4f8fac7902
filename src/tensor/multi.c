/*
 * multi.c -- tensors over several devices (tinygrad's shard semantics).
 *
 * A multi-device tensor is a MULTI node: its device is a device tuple (devtuple.c), its shape the
 * logical shape, its sources one ordinary node per member device (the shards), arg.i the sharded
 * axis or -1 when every member holds the whole tensor (replicated). Shard sizes along the axis may
 * differ (even be 0); shard i covers the logical range starting at the sum of the sizes before it.
 *
 * Every graph builder (graph.c) sends a MULTI input here, and the builders here call the builders
 * again on the shards: the graph below a MULTI node is plain per-device graph, and a MULTI node is
 * never the source of another node (only of nothing, or of the handle that holds it). So the
 * scheduler, codegen and runtime never meet one; realize (realize_multi) realizes the shards and
 * records the MULTI of their buffers; autograd splits a MULTI loss's gradient into its shards and
 * assembles a MULTI target's gradient from its shards' (a replicated target's by an allreduce).
 *
 * The rules, per op: elementwise ops run per shard once every input has the sharding of the first
 * sharded one (a replicated input is shrunk to each shard's range; a differently sharded one is
 * gathered first). Reductions run per shard; over the sharded axis the per-shard results are then
 * allreduced (naive or ring, allreduce()) into a replicated tensor. Movement ops run per shard with
 * the axis renumbered (permute), kept (expand, pad and shrink of other axes) or resized (a shrink or
 * pad of the sharded axis leaves uneven shards; a reshape that keeps the axis the outer part of one
 * new axis). Anything else (a flip of the sharded axis, a reshape splitting it unevenly) gathers the
 * tensor onto every member first and stays replicated: slower, never wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/engine.h"
#include "tensor.h"

static tg_tensor NONE_T(void) { return (tg_tensor){0}; }

/* ---- node helpers ---- */

static UOp *res(UOp *u) { return g_resolve(u); }
int m_axis(UOp *u) { return (int)res(u)->arg.i; }
static int m_n(UOp *u) { return (int)res(u)->nsrc; }
static UOp *m_src(UOp *u, int i) { return res(u)->src[i]; }

static int64_t shard_size(UOp *s, int axis) { return axis < 0 ? 0 : s->shape[axis]; }
/* start of shard i along the axis */
static int64_t shard_start(UOp *u, int i) {
  int ax = m_axis(u);
  int64_t o = 0;
  for (int j = 0; j < i; j++) o += shard_size(m_src(u, j), ax);
  return o;
}

/* A MULTI node over `tuple` from n shards (references taken). */
static UOp *m_make(UOp **sh, int n, int axis, int tuple) {
  int64_t shape[64];
  int nd = sh[0]->ndim;
  if (nd) memcpy(shape, sh[0]->shape, sizeof(int64_t) * (size_t)nd);
  if (axis >= 0) {
    shape[axis] = 0;
    for (int i = 0; i < n; i++) shape[axis] += sh[i]->shape[axis];
  }
  UArg a;
  a.i = axis;
  UOp *u = uop_new_meta(OP_MULTI, (tg_dtype)sh[0]->dtype, sh, n, NULL, 0, a, shape, nd, tuple);
  for (int i = 0; i < n; i++) uop_unref(sh[i]);
  return u;
}

static int members(int tuple, const int **ids) { return device_tuple_members(tuple, ids); }

/* Do a and b split the same axis into the same sizes (or are both replicated)? */
static bool same_sharding(UOp *a, UOp *b) {
  if (m_axis(a) != m_axis(b) || m_n(a) != m_n(b)) return false;
  int ax = m_axis(a);
  if (ax < 0) return true;
  for (int i = 0; i < m_n(a); i++)
    if (m_src(a, i)->shape[ax] != m_src(b, i)->shape[ax]) return false;
  return true;
}

/* ---- gather, replicate, reshard ---- */

/* A join: the pieces of a tensor, each padded to the whole and summed. A float piece is padded with
 * -0.0, the zero that leaves every value, -0.0 included, as it was when added (zero padding turned
 * a -0.0 beside it into +0.0): a select on the padded region, which keeps the join differentiable. */
static UOp *join_piece(UOp *x, const int64_t *pads) {
  UOp *p = g_pad(x, pads);
  if (!tg_dtype_is_float((tg_dtype)x->dtype)) return p;
  UOp *t = g_const_shaped(1, TG_BOOL, x->device, x->shape, x->ndim), *in = g_pad(t, pads);
  UOp *nz = g_const_shaped(-0.0, (tg_dtype)x->dtype, x->device, p->shape, p->ndim);
  UOp *r = g_alu(OP_WHERE, (tg_dtype)x->dtype, in, p, nz);
  uop_unref(t), uop_unref(in), uop_unref(nz), uop_unref(p);
  return r;
}

/* The whole tensor on device `dev` (new ref): its replica there, or its shards copied there and
 * joined (each padded to the full length and summed: one fused kernel; join_piece). */
UOp *m_gather(UOp *u, int dev) {
  int ax = m_axis(u), n = m_n(u);
  if (ax < 0) {
    for (int i = 0; i < n; i++)
      if (m_src(u, i)->device == dev) return uop_ref(m_src(u, i));
    return g_copy(m_src(u, 0), dev);
  }
  int64_t total = u->shape[ax];
  UOp *acc = NULL;
  int64_t pads[128];
  for (int i = 0; i < n; i++) {
    UOp *s = m_src(u, i);
    int64_t sz = s->shape[ax], st = shard_start(u, i);
    if (sz == 0 && (acc || i < n - 1)) continue;
    UOp *c = s->device == dev ? uop_ref(s) : g_copy(s, dev);
    memset(pads, 0, sizeof(int64_t) * 2 * (size_t)s->ndim);
    pads[2 * ax] = st, pads[2 * ax + 1] = total - st - sz;
    UOp *p = join_piece(c, pads);
    uop_unref(c);
    if (!acc) {
      acc = p;
    } else {
      UOp *x = g_alu(OP_ADD, (tg_dtype)p->dtype, acc, p, NULL);
      uop_unref(acc), uop_unref(p);
      acc = x;
    }
  }
  return acc;
}

/* u replicated over its tuple (new ref). */
static UOp *m_replicated(UOp *u) {
  if (m_axis(u) < 0) return uop_ref(u);
  int n = m_n(u);
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) sh[i] = m_gather(u, m_src(u, i)->device);
  UOp *r = m_make(sh, n, -1, u->device);
  free(sh);
  return r;
}

/* A single-device node split over `tuple` along axis with the shard sizes of `like` (NULL: even
 * ceil split), or replicated (axis -1). */
static UOp *split_single(UOp *x, int tuple, int axis, UOp *like) {
  const int *ids;
  int n = members(tuple, &ids);
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  int64_t b[128];
  int64_t start = 0, dim = axis >= 0 ? x->shape[axis] : 0, per = (dim + n - 1) / n;
  for (int i = 0; i < n; i++) {
    UOp *v;
    if (axis < 0) {
      v = uop_ref(x);
    } else {
      int64_t sz = like ? m_src(like, i)->shape[axis] : (dim - start < per ? dim - start : per);
      if (sz < 0) sz = 0;
      for (int d = 0; d < x->ndim; d++) b[2 * d] = 0, b[2 * d + 1] = x->shape[d];
      b[2 * axis] = start, b[2 * axis + 1] = start + sz;
      start += sz;
      v = g_shrink(x, b);
    }
    /* each shard its own buffer: never a view of x (TinyJit takes shards as buffers), never x
     * itself (it would be an ancestor of the other shards, their copies, and a gradient joined
     * from the shards' would count theirs twice) */
    sh[i] = v->device != ids[i] ? g_copy(v, ids[i]) : g_contiguous(v);
    uop_unref(v);
  }
  UOp *r = m_make(sh, n, axis, tuple);
  free(sh);
  return r;
}

/* u with the sharding of `like` (same tuple; new ref). */
static UOp *m_reshard(UOp *u, UOp *like) {
  if (same_sharding(u, like)) return uop_ref(u);
  int ax = m_axis(like), n = m_n(like);
  UOp *rep = m_replicated(u);
  if (ax < 0) return rep;
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  int64_t b[128];
  for (int i = 0; i < n; i++) {
    UOp *s = m_src(rep, i);
    for (int d = 0; d < s->ndim; d++) b[2 * d] = 0, b[2 * d + 1] = s->shape[d];
    b[2 * ax] = shard_start(like, i), b[2 * ax + 1] = b[2 * ax] + m_src(like, i)->shape[ax];
    sh[i] = g_shrink(s, b);
  }
  UOp *r = m_make(sh, n, ax, like->device);
  uop_unref(rep);
  free(sh);
  return r;
}

/* ---- allreduce ---- */

/* tinygrad's choice: ring when forced (RING=2) or for more than two devices and more than
 * RING_ALLREDUCE_THRESHOLD elements (unless RING=0). */
static bool use_ring(int n, int64_t numel) {
  int ring = getenv_int("RING", 1);
  return ring >= 2 || (n > 2 && numel > getenv_int("RING_ALLREDUCE_THRESHOLD", 256000) && ring >= 1);
}

static UOp *op2(int op, UOp *a, UOp *b) {
  UOp *r = g_alu(op, (tg_dtype)a->dtype, a, b, NULL);
  uop_unref(a), uop_unref(b);
  return r;
}

/* The allreduce as one NCCL group where every part is on its own GPU (CUDA) and libnccl opens
 * (engine/dist.c decides): out[i] = member i, a COLLECTIVE node over all the parts on part i's
 * device, which realize runs together with the others. false: the graph's copies do it. */
static bool nccl_allreduce(UOp **parts, int n, int op, int64_t numel, UOp **out) {
  if (n < 2 || numel == 0) return false;
  Device **devs = tg_xmalloc(sizeof(Device *) * (size_t)n);
  bool ok = true;
  for (int i = 0; i < n; i++) {
    devs[i] = device_by_id(parts[i]->device);
    ok = ok && !parts[i]->sym;
  }
  ok = ok && nccl_group_ok(devs, n, (tg_dtype)parts[0]->dtype, op);
  free(devs);
  if (!ok) return false;
  if (debug_level() >= 2)
    fprintf(stderr, "allreduce: NCCL %s %dx%lld %s\n", op == OP_ADD ? "sum" : "max", n, (long long)numel, tg_dtype_name((tg_dtype)parts[0]->dtype));
  for (int i = 0; i < n; i++) out[i] = g_allreduce(parts, n, op, i);
  return true;
}

/* Combines n same-shaped parts (part i on device i of the tuple) with op (OP_ADD, OP_MAX, OP_MUL):
 * out[i] is the whole result on device i (new refs). */
static void allreduce(UOp **parts, int n, int op, UOp **out) {
  int64_t numel = shape_numel(parts[0]->shape, parts[0]->ndim);
  if (nccl_allreduce(parts, n, op, numel, out)) return;
  bool ring = use_ring(n, numel) && numel >= n;
  if (debug_level() >= 2)
    fprintf(stderr, "allreduce: %s %dx%lld %s\n", ring ? "ring" : "naive", n, (long long)numel, tg_dtype_name((tg_dtype)parts[0]->dtype));
  if (!ring) {
    for (int i = 0; i < n; i++) {
      UOp *acc = uop_ref(parts[i]);
      for (int k = 1; k < n; k++) acc = op2(op, acc, g_copy(parts[(i + k) % n], parts[i]->device));
      out[i] = acc;
    }
    return;
  }
  /* ring: flat parts cut into n chunks; chunk c travels the ring from device c+1 and is reduced
   * one device at a time until it reaches device c (reduce-scatter), then device c sends it to every
   * device (all-gather); each device joins the chunks. Each device sends about 2 numel/n elements
   * where the naive one sends numel to each of n-1 others. */
  int64_t flat = numel, per = (numel + n - 1) / n;
  UOp **fl = tg_xmalloc(sizeof(UOp *) * (size_t)n), **chunk = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) fl[i] = g_reshape(parts[i], &flat, 1);
  for (int c = 0; c < n; c++) {
    int64_t b[2] = {c * per < numel ? c * per : numel, (c + 1) * per < numel ? (c + 1) * per : numel};
    UOp *acc = NULL;
    for (int k = 1; k <= n; k++) {
      int d = (c + k) % n;
      UOp *piece = g_shrink(fl[d], b);
      acc = acc ? op2(op, g_copy(acc, fl[d]->device), piece) : piece;
      if (acc == piece) continue;
    }
    chunk[c] = acc;
  }
  for (int i = 0; i < n; i++) {
    UOp *joined = NULL;
    for (int c = 0; c < n; c++) {
      int64_t lo = c * per < numel ? c * per : numel, hi = (c + 1) * per < numel ? (c + 1) * per : numel;
      UOp *x = chunk[c]->device == fl[i]->device ? uop_ref(chunk[c]) : g_copy(chunk[c], fl[i]->device);
      int64_t pads[2] = {lo, numel - hi};
      UOp *p = join_piece(x, pads);
      uop_unref(x);
      joined = joined ? op2(OP_ADD, joined, p) : p;
    }
    out[i] = g_reshape(joined, parts[0]->shape, parts[0]->ndim);
    uop_unref(joined);
  }
  for (int i = 0; i < n; i++) uop_unref(fl[i]), uop_unref(chunk[i]);
  free(fl), free(chunk);
}

/* ---- builders (called by graph.c for inputs on a device tuple) ---- */

UOp *m_const(double v, tg_dtype dt, int tuple) {
  const int *ids;
  int n = members(tuple, &ids);
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) sh[i] = g_const(v, dt, ids[i]);
  UOp *r = m_make(sh, n, -1, tuple);
  free(sh);
  return r;
}

UOp *m_iota(int64_t len, tg_dtype dt, int tuple) {
  const int *ids;
  int n = members(tuple, &ids);
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) sh[i] = g_iota(len, dt, ids[i]);
  UOp *r = m_make(sh, n, -1, tuple);
  free(sh);
  return r;
}

/* Per-shard application of a one-input builder that keeps the sharding. */
UOp *m_map(UOp *a, UOp *(*fn)(UOp *, const void *), const void *ctx) {
  int n = m_n(a);
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) sh[i] = fn(m_src(a, i), ctx);
  UOp *r = m_make(sh, n, m_axis(a), a->device);
  free(sh);
  return r;
}

UOp *m_alu(int op, tg_dtype dt, UOp *a, UOp *b, UOp *c) {
  UOp *in[3] = {a, b, c}, *rs[3] = {NULL, NULL, NULL};
  int k = c ? 3 : (b ? 2 : 1);
  UOp *like = a;
  for (int i = 0; i < k; i++)
    if (m_axis(in[i]) >= 0) {
      like = in[i];
      break;
    }
  for (int i = 0; i < k; i++) rs[i] = m_reshard(in[i], like);
  int n = m_n(like);
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++)
    sh[i] = g_alu(op, dt, m_src(rs[0], i), k > 1 ? m_src(rs[1], i) : NULL, k > 2 ? m_src(rs[2], i) : NULL);
  UOp *r = m_make(sh, n, m_axis(like), like->device);
  for (int i = 0; i < k; i++) uop_unref(rs[i]);
  free(sh);
  return r;
}

UOp *m_reduce(UOp *a, int op, const int64_t *axes, int naxes) {
  int ax = m_axis(a), n = m_n(a);
  bool over = false;
  for (int i = 0; i < naxes; i++) over = over || axes[i] == ax;
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) sh[i] = g_reduce(m_src(a, i), op, axes, naxes);
  UOp *r;
  if (over) {
    UOp **out = tg_xmalloc(sizeof(UOp *) * (size_t)n);
    allreduce(sh, n, op, out);
    for (int i = 0; i < n; i++) uop_unref(sh[i]);
    r = m_make(out, n, -1, a->device);
    free(out);
  } else {
    r = m_make(sh, n, ax, a->device);
  }
  free(sh);
  return r;
}

/* a replicated, then the builder per replica */
static UOp *via_replicated(UOp *a, UOp *(*fn)(UOp *, const void *), const void *ctx) {
  UOp *rep = m_replicated(a);
  UOp *r = m_map(rep, fn, ctx);
  uop_unref(rep);
  return r;
}

static UOp *do_reshape(UOp *s, const void *ctx) {
  const int64_t *p = ctx;
  return g_reshape(s, p + 1, (int)p[0]);
}

/* Symbolic sizes on a multi-device tensor: the shards keep a dim's codes where the dim is not split
 * between them (a replicated tensor's, or another axis than the sharded one), so their kernels are
 * symbolic as on one device. Where the sharded axis itself takes a symbolic size, each shard's part
 * is computed from the bound value: the shard nodes are marked as holding it (right for that value;
 * a TinyJit capture is refused rather than replayed with the captured sizes). */
static bool any_code(const int64_t *v, int n) {
  for (int i = 0; i < n; i++)
    if (sym_is_code(v[i])) return true;
  return false;
}
static void mark_baked(UOp **sh, int n, UOp *from) {
  for (int i = 0; i < n; i++) /* (not a shard the op left as it was: that node is the tensor's own) */
    if (sh[i] && sh[i] != m_src(from, i)) uop_mark_sym_baked(sh[i]);
}

UOp *m_reshape(UOp *a, const int64_t *shape, int ndim) {
  int ax = m_axis(a), n = m_n(a);
  int64_t *ctx = tg_xmalloc(sizeof(int64_t) * (size_t)(ndim + 1));
  ctx[0] = ndim;
  for (int i = 0; i < ndim; i++) ctx[i + 1] = ax < 0 ? shape[i] : sym_concrete(shape[i]);
  UOp *r = NULL;
  if (ax < 0) {
    r = m_map(a, do_reshape, ctx);
  } else {
    /* the new axis k whose outer part is the sharded axis: same product before it, and the
     * sharded axis either merged into it (k's size a multiple) or split with k outermost */
    int64_t before = 1, nb = 1;
    for (int i = 0; i < ax; i++) before *= a->shape[i];
    int k = -1;
    for (int i = 0; i <= ndim && k < 0; i++) {
      if (nb == before && i < ndim && ctx[i + 1] != 1) k = i;
      if (i < ndim) nb *= ctx[i + 1];
      if (nb > before) break;
    }
    if (k < 0 && a->shape[ax] == 1) { /* a sharded axis of size 1 (a one-wide slice) maps to a size-1 dim */
      nb = 1;
      for (int i = 0; i < ndim && k < 0; i++) {
        if (nb == before) k = i;
        nb *= ctx[i + 1];
        if (nb > before) break;
      }
    }
    bool ok = k >= 0 && a->shape[ax] > 0;
    int64_t dim = ok ? a->shape[ax] : 0, nk = ok ? ctx[k + 1] : 0;
    bool merge = ok && nk % dim == 0;
    bool split = ok && !merge && dim % nk == 0;
    if (split)
      for (int i = 0; i < n; i++) ok = ok && m_src(a, i)->shape[ax] % (dim / nk) == 0;
    if (ok && (merge || split)) {
      UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
      int64_t *loc = tg_xmalloc(sizeof(int64_t) * (size_t)(ndim + 1));
      for (int i = 0; i < n; i++) {
        memcpy(loc, ctx + 1, sizeof(int64_t) * (size_t)ndim);
        int64_t ls = m_src(a, i)->shape[ax];
        loc[k] = merge ? ls * (nk / dim) : ls / (dim / nk);
        sh[i] = g_reshape(m_src(a, i), loc, ndim);
      }
      if (any_code(shape, ndim)) mark_baked(sh, n, a);
      r = m_make(sh, n, k, a->device);
      free(sh), free(loc);
    } else {
      for (int i = 0; i < ndim; i++) ctx[i + 1] = shape[i]; /* (the gathered tensor keeps the codes) */
      r = via_replicated(a, do_reshape, ctx);
    }
  }
  free(ctx);
  return r;
}

UOp *m_permute(UOp *a, const int64_t *order) {
  int ax = m_axis(a), n = m_n(a), nax = -1;
  for (int i = 0; i < a->ndim; i++)
    if (order[i] == ax) nax = i;
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) sh[i] = g_permute(m_src(a, i), order);
  UOp *r = m_make(sh, n, ax < 0 ? -1 : nax, a->device);
  free(sh);
  return r;
}

static UOp *do_expand(UOp *s, const void *ctx) { return g_expand(s, ctx); }

UOp *m_expand(UOp *a, const int64_t *shape) {
  int ax = m_axis(a), n = m_n(a);
  if (ax >= 0 && sym_concrete(shape[ax]) != a->shape[ax]) {
    UOp *rep = m_replicated(a);
    UOp *r = m_map(rep, do_expand, shape);
    uop_unref(rep);
    return r;
  }
  if (ax < 0) return m_map(a, do_expand, shape);
  int64_t loc[64];
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) {
    memcpy(loc, shape, sizeof(int64_t) * (size_t)a->ndim);
    loc[ax] = m_src(a, i)->shape[ax];
    sh[i] = g_expand(m_src(a, i), loc);
  }
  UOp *r = m_make(sh, n, ax, a->device);
  free(sh);
  return r;
}

UOp *m_pad(UOp *a, const int64_t *pads) {
  int ax = m_axis(a), n = m_n(a);
  int64_t loc[128];
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) {
    memcpy(loc, pads, sizeof(int64_t) * 2 * (size_t)a->ndim);
    /* padding of the sharded axis goes to the first shard (before) and the last one (after) */
    if (ax >= 0) {
      if (i != 0) loc[2 * ax] = 0;
      if (i != n - 1) loc[2 * ax + 1] = 0;
    }
    sh[i] = g_pad(m_src(a, i), loc);
  }
  UOp *r = m_make(sh, n, ax, a->device);
  free(sh);
  return r;
}

UOp *m_shrink(UOp *a, const int64_t *bounds) {
  int ax = m_axis(a), n = m_n(a);
  int64_t loc[128];
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) {
    UOp *s = m_src(a, i);
    memcpy(loc, bounds, sizeof(int64_t) * 2 * (size_t)a->ndim);
    /* each shard keeps its part of the range (possibly none): the shards become uneven */
    if (ax >= 0) {
      loc[2 * ax] = sym_concrete(loc[2 * ax]), loc[2 * ax + 1] = sym_concrete(loc[2 * ax + 1]);
      int64_t st = shard_start(a, i), en = st + s->shape[ax];
      int64_t lo = loc[2 * ax] > st ? loc[2 * ax] : st, hi = loc[2 * ax + 1] < en ? loc[2 * ax + 1] : en;
      if (hi < lo) hi = lo;
      loc[2 * ax] = lo - st, loc[2 * ax + 1] = hi - st;
      if (hi == lo) loc[2 * ax] = loc[2 * ax + 1] = 0;
    }
    sh[i] = g_shrink(s, loc);
  }
  if (ax >= 0 && any_code(bounds + 2 * ax, 2)) mark_baked(sh, n, a);
  UOp *r = m_make(sh, n, ax, a->device);
  free(sh);
  return r;
}

static UOp *do_flip(UOp *s, const void *ctx) { return g_flip(s, ctx); }

UOp *m_flip(UOp *a, const int64_t *flags) {
  int ax = m_axis(a);
  if (ax >= 0 && flags[ax] && a->shape[ax] > 1) return via_replicated(a, do_flip, flags);
  return m_map(a, do_flip, flags);
}

UOp *m_index(UOp *data, UOp *idx) {
  UOp *d = m_replicated(data);
  int n = m_n(d);
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) sh[i] = g_index(m_src(d, i), m_src(idx, i));
  UOp *r = m_make(sh, n, m_axis(idx), d->device);
  uop_unref(d);
  free(sh);
  return r;
}

/* a MULTI node to a device or tuple, or a plain node to a tuple */
UOp *m_copy(UOp *a, int device) {
  if (!device_is_tuple(device)) return m_gather(a, device);
  if (device_is_tuple(a->device)) {
    if (a->device == device) return uop_ref(a);
    /* another tuple: the whole tensor on each of its members */
    const int *ids;
    int n = members(device, &ids);
    UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
    for (int i = 0; i < n; i++) sh[i] = m_gather(a, ids[i]);
    UOp *r = m_make(sh, n, -1, device);
    free(sh);
    return r;
  }
  return split_single(a, device, -1, NULL);
}

UOp *m_reshard_like(UOp *u, UOp *like) { return m_reshard(u, like); }

UOp *m_assign(UOp *target, UOp *value) {
  UOp *v = m_reshard(value, target);
  int n = m_n(target);
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) sh[i] = g_assign(m_src(target, i), m_src(v, i));
  UOp *r = m_make(sh, n, m_axis(target), target->device);
  uop_unref(v);
  free(sh);
  return r;
}

UOp *m_assign_region(UOp *target, UOp *value, const int64_t *bounds) {
  int ax = m_axis(target), n = m_n(target);
  UOp *v = m_replicated(value);
  int64_t loc[128], vb[128];
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) {
    UOp *t = m_src(target, i), *vi = m_src(v, i);
    memcpy(loc, bounds, sizeof(int64_t) * 2 * (size_t)target->ndim);
    if (ax < 0) {
      sh[i] = g_assign_region(t, vi, loc);
      continue;
    }
    loc[2 * ax] = sym_concrete(loc[2 * ax]), loc[2 * ax + 1] = sym_concrete(loc[2 * ax + 1]);
    int64_t st = shard_start(target, i), en = st + t->shape[ax];
    int64_t lo = loc[2 * ax] > st ? loc[2 * ax] : st, hi = loc[2 * ax + 1] < en ? loc[2 * ax + 1] : en;
    if (hi <= lo) { /* the region misses this shard: it keeps its contents */
      sh[i] = uop_ref(t);
      continue;
    }
    for (int d = 0; d < vi->ndim; d++) vb[2 * d] = 0, vb[2 * d + 1] = vi->shape[d];
    vb[2 * ax] = lo - loc[2 * ax], vb[2 * ax + 1] = hi - loc[2 * ax];
    UOp *part = g_shrink(vi, vb);
    loc[2 * ax] = lo - st, loc[2 * ax + 1] = hi - st;
    sh[i] = g_assign_region(t, part, loc);
    if (any_code(bounds + 2 * ax, 2)) uop_mark_sym_baked(sh[i]); /* (not a shard it leaves alone: that is t) */
    uop_unref(part);
  }
  UOp *r = m_make(sh, n, ax, target->device);
  uop_unref(v);
  free(sh);
  return r;
}

/* A MULTI node from shards (borrowed), for TinyJit's flattened calls. */
UOp *m_from_shards(UOp *const *sh, int n, int axis, int tuple) {
  UOp **r = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) r[i] = uop_ref(sh[i]);
  UOp *u = m_make(r, n, axis, tuple);
  free(r);
  return u;
}

/* ---- realize ---- */

/* Realizes targets of which some are MULTI nodes: their shards go to the scheduler with the plain
 * targets; each MULTI target then records the MULTI of its realized shards, which its handles get. */
tg_status realize_multi(UOp **targets, int n) {
  int cap = 0;
  for (int i = 0; i < n; i++) cap += device_is_tuple(targets[i]->device) ? (int)targets[i]->nsrc : 1;
  UOp **all = tg_xmalloc(sizeof(UOp *) * (size_t)(cap + 1));
  int m = 0;
  for (int i = 0; i < n; i++) {
    UOp *t = targets[i];
    if (!device_is_tuple(t->device)) {
      all[m++] = t;
    } else if (!uop_realized(t)) {
      for (uint32_t j = 0; j < t->nsrc; j++) all[m++] = t->src[j];
    }
  }
  tg_status st = realize_uops(all, m);
  free(all);
  if (st != TG_OK) return st;
  for (int i = 0; i < n; i++) {
    UOp *t = targets[i];
    if (!device_is_tuple(t->device) || uop_realized(t)) continue;
    int k = (int)t->nsrc;
    UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)k);
    bool changed = false;
    for (int j = 0; j < k; j++) {
      UOp *r = uop_realized(t->src[j]);
      changed = changed || r;
      sh[j] = uop_ref(r ? r : t->src[j]);
      if ((uop_flags(t) & UOPF_GRAD_LEAF) && r) uop_set_flag(r, UOPF_GRAD_LEAF);
    }
    if (!changed) {
      for (int j = 0; j < k; j++) uop_unref(sh[j]);
      free(sh);
      continue;
    }
    UOp *mr = m_make(sh, k, (int)t->arg.i, t->device);
    free(sh);
    if (uop_flags(t) & UOPF_GRAD_LEAF) uop_set_flag(mr, UOPF_GRAD_LEAF);
    uop_ref(t);
    int holders = t_replace_everywhere(t, mr);
    uop_set_realized(t, mr); /* owned */
    /* each realized shard keeps its shard's graph for autograd, as a realized node does on one
     * device: a sharded tensor read before its backward (the loss printed first) still passes the
     * gradient on (its handles hold mr, not the shards, so the realize's own hand-out skipped them) */
    for (int j = 0; holders > 0 && j < k; j++)
      if (uop_realized(t->src[j]) && uop_realized(t->src[j]) == mr->src[j]) ag_attach_history(mr->src[j], t->src[j]);
    uop_unref(t);
  }
  return TG_OK;
}

/* ---- autograd ---- */

/* The gradient g of a MULTI node u, split into one gradient per shard (out[i], new refs or NULL):
 * a sharded u gets g's shards; a replicated u's value is one tensor held n times, so the whole
 * gradient goes to its first replica only (the others would count it again). */
void m_grad_split(UOp *u, UOp *g, UOp **out) {
  int n = (int)u->nsrc;
  if (!device_is_tuple(g->device)) {
    for (int i = 0; i < n; i++) out[i] = NULL;
    if ((int)u->arg.i < 0) out[0] = g_copy(g, u->src[0]->device);
    return;
  }
  UOp *gs = m_reshard(g, u);
  for (int i = 0; i < n; i++) out[i] = ((int)u->arg.i >= 0 || i == 0) ? uop_ref(m_src(gs, i)) : NULL;
  uop_unref(gs);
}

/* The gradient of MULTI target u from its shards' gradients gs[i] (borrowed, NULL = zero): the
 * MULTI of them for a sharded u; their allreduced sum for a replicated one. NULL if all are NULL. */
UOp *m_grad_join(UOp *u, UOp **gs) {
  int n = (int)u->nsrc;
  bool any = false;
  for (int i = 0; i < n; i++) any = any || gs[i];
  if (!any) return NULL;
  UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++)
    sh[i] = gs[i] ? uop_ref(gs[i]) : g_const_shaped(0, (tg_dtype)u->src[i]->dtype, u->src[i]->device, u->src[i]->shape, u->src[i]->ndim);
  UOp *r;
  if ((int)u->arg.i < 0) {
    int nz = 0, last = 0;
    for (int i = 0; i < n; i++)
      if (gs[i]) nz++, last = i;
    UOp **out = tg_xmalloc(sizeof(UOp *) * (size_t)n);
    if (nz == 1) { /* one contribution: send it to the others, no sum */
      for (int i = 0; i < n; i++) out[i] = i == last ? uop_ref(sh[i]) : g_copy(sh[last], u->src[i]->device);
    } else {
      allreduce(sh, n, OP_ADD, out);
    }
    for (int i = 0; i < n; i++) uop_unref(sh[i]);
    r = m_make(out, n, -1, u->device);
    free(out);
  } else {
    r = m_make(sh, n, (int)u->arg.i, u->device);
  }
  free(sh);
  return r;
}

void m_allreduce_grad(UOp *n, UOp *g, UOp **out) {
  int k = (int)n->nsrc, op = (int)n->iarg[0];
  tg_dtype dt = (tg_dtype)n->dtype;
  UOp **eq = NULL, **cnt = NULL;
  if (op == OP_MAX) {
    /* the gradient goes to the parts that hold the maximum, split evenly between all the tied
     * elements, as a max over the whole logical tensor splits it: a part that is a shard's own max
     * (m_reduce's) holding c of them takes c / (their count over all parts, an allreduce), which
     * its REDUCE_AXIS rule then shares among its c */
    eq = tg_xmalloc(sizeof(UOp *) * (size_t)k), cnt = tg_xmalloc(sizeof(UOp *) * (size_t)k);
    for (int j = 0; j < k; j++) {
      UOp *p = n->src[j], *mj = g_allreduce(n->src, k, op, j), *e = g_alu(OP_CMPEQ, TG_BOOL, p, mj, NULL);
      eq[j] = g_cast(e, dt);
      uop_unref(mj), uop_unref(e);
      if (p->op == OP_REDUCE_AXIS && p->arg.i == OP_MAX) {
        UOp *a = p->src[0], *pe = g_expand(p, a->shape), *ae = g_alu(OP_CMPEQ, TG_BOOL, a, pe, NULL), *af = g_cast(ae, dt);
        UOp *c = g_reduce(af, OP_ADD, p->iarg, (int)p->niarg), *w = g_alu(OP_MUL, dt, eq[j], c, NULL);
        uop_unref(pe), uop_unref(ae), uop_unref(af), uop_unref(c), uop_unref(eq[j]);
        eq[j] = w;
      }
    }
    allreduce(eq, k, OP_ADD, cnt);
  }
  for (int j = 0; j < k; j++) {
    UOp *gj = n->src[j]->device == g->device ? uop_ref(g) : g_copy(g, n->src[j]->device);
    if (op == OP_MAX) {
      UOp *t = g_alu(OP_MUL, dt, gj, eq[j], NULL);
      uop_unref(gj);
      gj = g_alu(OP_FDIV, dt, t, cnt[j], NULL);
      uop_unref(t);
    }
    out[j] = gj;
  }
  for (int j = 0; eq && j < k; j++) uop_unref(eq[j]), uop_unref(cnt[j]);
  free(eq), free(cnt);
}

/* ---- public API ---- */

static bool tuple_from_names(const char *fn, const char *const *devices, int n, int *tuple) {
  if (n < 1 || !devices) {
    tg_set_error(TG_ERR_INVALID, "%s: need at least one device (got n=%d%s)", fn, n, devices ? "" : ", devices NULL");
    return false;
  }
  int *ids = tg_xmalloc(sizeof(int) * (size_t)n);
  bool had = tg_has_error();
  for (int i = 0; i < n; i++) {
    if (!devices[i]) {
      tg_set_error(TG_ERR_INVALID, "%s: device %d is NULL (give a device name such as \"CPU:1\")", fn, i);
      free(ids);
      return false;
    }
    Device *d = device_get(devices[i]);
    if (!d && !had) error_restate(TG_OK, "device_get: ", "%s: device %d", fn, i); /* its reason, under fn */
    if (!d || !d->vt) {
      if (!tg_has_error() || d) tg_set_error(TG_ERR_INVALID, "%s: device %d ('%s') is not a single device", fn, i, devices[i]);
      free(ids);
      return false;
    }
    ids[i] = d->id;
  }
  Device *t = device_tuple_of(ids, n);
  free(ids);
  if (!t) { /* its message names the tuple, not the call */
    tg_status st = tg_last_status();
    char m[512];
    snprintf(m, sizeof m, "%s", tg_last_error() ? tg_last_error() : "cannot make the device tuple");
    tg_clear_error();
    tg_set_error(st, "%s: %s", fn, m);
    return false;
  }
  *tuple = t->id;
  return true;
}

tg_tensor tg_shard(tg_tensor t, const char *const *devices, int n, int axis) {
  UOp *u = t_get(t, "tg_shard");
  if (!u) return NONE_T();
  int tuple;
  if (!tuple_from_names("tg_shard", devices, n, &tuple)) return NONE_T();
  if (axis != TG_SHARD_NONE && (axis < -u->ndim || axis >= u->ndim)) {
    char b[256];
    if (u->ndim == 0)
      tg_set_error(TG_ERR_INVALID, "tg_shard: axis %d: a 0-d tensor has no axis to split (TG_SHARD_NONE replicates it)", axis);
    else
      tg_set_error(TG_ERR_INVALID, "tg_shard: axis %d is out of range for shape %s (-%d..%d, or TG_SHARD_NONE to replicate)", axis,
                   fmt_shape(b, sizeof b, u->shape, u->ndim), u->ndim, u->ndim - 1);
    return NONE_T();
  }
  if (axis != TG_SHARD_NONE && axis < 0) axis += u->ndim;
  /* one device: the tensor copied there (gathered if it is sharded), as tinygrad's shard does */
  if (!device_is_tuple(tuple)) return tg_to(t, device_by_id(tuple)->name);
  if (u->sym) return tg_set_error(TG_ERR_INVALID, "tg_shard: tensors of symbolic shape cannot be sharded"), NONE_T();
  if (device_is_tuple(u->device)) {
    /* a tensor already on a tuple: replicate it onto the new one, then take the shards (sized as
     * an even split of a plain tensor would be) */
    UOp *rep = m_copy(u, tuple);
    if (m_axis(rep) >= 0) { /* (already on that tuple, sharded: m_copy left it as it was) */
      UOp *whole = m_replicated(rep);
      uop_unref(rep);
      rep = whole;
    }
    if (axis == TG_SHARD_NONE) return t_wrap(rep);
    UOp *even = split_single(m_src(rep, 0), tuple, axis, NULL); /* for its sizes only */
    UOp *r = m_reshard(rep, even);
    uop_unref(even), uop_unref(rep);
    return t_wrap(r);
  }
  UOp *src = uop_ref(u);
  UOp *r = split_single(src, tuple, axis == TG_SHARD_NONE ? -1 : axis, NULL);
  uop_unref(src);
  return t_wrap(r);
}

tg_tensor tg_shard_like(tg_tensor t, tg_tensor like) {
  UOp *u = t_get(t, "tg_shard_like"), *l = t_get(like, "tg_shard_like");
  if (!u || !l) return NONE_T();
  if (!device_is_tuple(l->device)) return tg_to(t, device_by_id(l->device)->name);
  if (u->ndim != l->ndim || (u->ndim && memcmp(u->shape, l->shape, sizeof(int64_t) * (size_t)u->ndim))) {
    char a[256], b[256];
    tg_set_error(TG_ERR_INVALID, "tg_shard_like: t has shape %s but like has shape %s (they must match)", fmt_shape(a, sizeof a, u->shape, u->ndim),
                 fmt_shape(b, sizeof b, l->shape, l->ndim));
    return NONE_T();
  }
  UOp *rep = device_is_tuple(u->device) ? m_copy(u, l->device) : split_single(u, l->device, -1, NULL);
  UOp *r = m_reshard(rep, l);
  uop_unref(rep);
  return t_wrap(r);
}

int tg_shard_axis(tg_tensor t) {
  UOp *u = t_get(t, "tg_shard_axis");
  if (!u) return -2;
  return device_is_tuple(u->device) && m_axis(u) >= 0 ? m_axis(u) : TG_SHARD_NONE;
}

int tg_shard_count(tg_tensor t) {
  UOp *u = t_get(t, "tg_shard_count");
  if (!u) return -1;
  return device_is_tuple(u->device) ? m_n(u) : 1;
}

tg_tensor tg_shard_get(tg_tensor t, int i) {
  UOp *u = t_get(t, "tg_shard_get");
  if (!u) return NONE_T();
  int n = device_is_tuple(u->device) ? m_n(u) : 1;
  if (i < 0 || i >= n) return tg_set_error(TG_ERR_INVALID, "tg_shard_get: shard %d of %d does not exist", i, n), NONE_T();
  return t_wrap(uop_ref(device_is_tuple(u->device) ? m_src(u, i) : u));
}

tg_status tg_shard_(tg_tensor t, const char *const *devices, int n, int axis) {
  tg_tensor r = tg_shard(t, devices, n, axis);
  if (!tg_valid(r)) return tg_last_status();
  if (tg_realize(r) != TG_OK) {
    tg_free(r);
    return tg_last_status();
  }
  Slot *s = t_slot(t);
  UOp *nu = uop_ref(t_get(r, "tg_shard_"));
  tg_free(r);
  UOp *old = s->u;
  s->u = nu;
  uop_unref(old);
  /* a gradient of the old value is on the old device */
  uop_unref(s->grad);
  s->grad = NULL;
  if (s->requires_grad == 1) tg_set_requires_grad(t, true);
  return TG_OK;
}
