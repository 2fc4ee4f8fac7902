/*
 * graph.c -- builders for lazy tensor-graph nodes. Each builder computes the node's shape and device
 * and hands them to uop_new_meta, which stores them before the (hash-consed) node becomes visible to
 * other threads. Inputs are assumed valid: the public ops check arguments and report errors before
 * calling these.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

const char *fmt_shape(char *buf, size_t n, const int64_t *shape, int ndim) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, n - o, "(");
  for (int i = 0; i < ndim && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (o < n) snprintf(buf + o, n - o, ndim == 1 ? ",)" : ")");
  return buf;
}

static void buffer_release(void *b) { buffer_unref((Buffer *)b); }
extern void (*uop_buffer_release_hook)(void *buf);

UOp *g_buffer(Buffer *b, tg_dtype dt, const int64_t *shape, int ndim) {
  /* every wrap is a distinct node (a unique id in iarg): a buffer written by an assign gets a new
   * node, so values derived from the old contents are never confused with new ones */
  static uint64_t uniq;
  if (!__atomic_load_n(&uop_buffer_release_hook, __ATOMIC_ACQUIRE))
    __atomic_store_n(&uop_buffer_release_hook, buffer_release, __ATOMIC_RELEASE);
  UArg a;
  a.p = b;
  int64_t id = (int64_t)__atomic_add_fetch(&uniq, 1, __ATOMIC_RELAXED);
  UOp *u = uop_new_meta(OP_BUFFER, dt, NULL, 0, &id, 1, a, shape, ndim, b->dev->id);
  return u;
}

/* The element index as a value (an integer dtype): a leaf like a constant, evaluated inside the kernel
 * that reads it, so an arange or random counters cost no memory and no host loop. n is in iarg so
 * iotas of different lengths are different nodes. */
UOp *g_iota(int64_t n, tg_dtype dt, int device) {
  if (device_is_tuple(device)) return m_iota(n, dt, device);
  /* a symbolic length (a tg_sym code) is kept after the concrete one */
  int64_t c = sym_concrete(n);
  int64_t ia[3] = {device, c, n};
  UArg z = {0};
  UOp *u = uop_new_meta(OP_IOTA, dt, NULL, 0, ia, sym_is_code(n) ? 3 : 2, z, &c, 1, device);
  return u;
}

/* Movement arguments may hold symbolic sizes (tg_sym codes): conc gets their concrete values; true
 * when any is a code. */
static bool decode_args(const int64_t *args, int n, int64_t *conc) {
  bool any = false;
  for (int i = 0; i < n; i++) {
    conc[i] = sym_concrete(args[i]);
    any = any || sym_is_code(args[i]);
  }
  return any;
}

/* Are the codes of a movement's result the same as a's own symbolic dims (or both none)? */
static bool same_sym(const int64_t *codes, bool any, const UOp *a) {
  if (!any) return !a->sym;
  return a->sym && !memcmp(codes, a->sym, sizeof(int64_t) * (size_t)a->ndim);
}


UOp *g_const(double v, tg_dtype dt, int device) {
  if (device_is_tuple(device)) return m_const(v, dt, device);
  UArg a;
  if (tg_dtype_is_float(dt)) {
    /* store the value as the dtype sees it, so 0.1 as half and as float differ */
    unsigned char tmp[8];
    dtype_store(dt, tmp, v);
    a.f = dtype_load(dt, tmp);
  } else if (dt == TG_BOOL) {
    a.i = v != 0;
  } else {
    /* an integer scalar the dtype cannot hold wraps (x + 2^63 on int64, x + 1e30 on uint32), as
     * tinygrad's constants do */
    unsigned char tmp[8];
    if (isfinite(v)) dtype_store_i64(dt, tmp, double_wrap_i64(v));
    else dtype_store(dt, tmp, v); /* (an infinity saturates, NaN is 0) */
    a.i = dtype_load_i64(dt, tmp);
  }
  int64_t dev = device;
  UOp *u = uop_new_meta(OP_CONST, dt, NULL, 0, &dev, 1, a, NULL, 0, device);
  return u;
}

UOp *g_const_shaped(double v, tg_dtype dt, int device, const int64_t *shape, int ndim) {
  UOp *c = g_const(v, dt, device);
  if (ndim == 0) return c;
  int64_t ones[64];
  int64_t *o = ndim <= 64 ? ones : tg_xmalloc(sizeof(int64_t) * (size_t)ndim);
  for (int i = 0; i < ndim; i++) o[i] = 1;
  UOp *r = g_reshape(c, o, ndim);
  uop_unref(c);
  UOp *e = g_expand(r, shape);
  uop_unref(r);
  if (o != ones) free(o);
  return e;
}

UOp *g_alu(int op, tg_dtype dt, UOp *a, UOp *b, UOp *c) {
  if (m_is(a) || (b && m_is(b)) || (c && m_is(c))) return m_alu(op, dt, a, b, c);
  UOp *s[3] = {a, b, c};
  UArg z = {0};
  return uop_new_meta(op, dt, s, c ? 3 : (b ? 2 : 1), NULL, 0, z, a->shape, a->ndim, a->device);
}

UOp *g_cast(UOp *a, tg_dtype dt) {
  if (a->dtype == dt) return uop_ref(a);
  return g_alu(OP_CAST, dt, a, NULL, NULL);
}

UOp *g_bitcast(UOp *a, tg_dtype dt) {
  if (a->dtype == dt) return uop_ref(a);
  return g_alu(OP_BITCAST, dt, a, NULL, NULL);
}

static UOp *mk_move(int op, UOp *a, const int64_t *iarg, int niarg, const int64_t *shape, int ndim) {
  UArg z = {0};
  UOp *u = uop_new_meta(op, (tg_dtype)a->dtype, &a, 1, iarg, niarg, z, shape, ndim, a->device);
  return u;
}

/* The same with arguments that hold codes: iarg is the concrete values, then the codes. */
static UOp *mk_move_sym(int op, UOp *a, const int64_t *conc, const int64_t *args, int niarg, bool any,
                        const int64_t *shape, int ndim) {
  if (!any) return mk_move(op, a, conc, niarg, shape, ndim);
  int64_t *ia = tg_xmalloc(sizeof(int64_t) * (size_t)(2 * niarg));
  memcpy(ia, conc, sizeof(int64_t) * (size_t)niarg);
  memcpy(ia + niarg, args, sizeof(int64_t) * (size_t)niarg);
  UOp *u = mk_move(op, a, ia, 2 * niarg, shape, ndim);
  free(ia);
  return u;
}

UOp *g_reshape(UOp *a, const int64_t *shape, int ndim) {
  if (m_is(a)) return m_reshape(a, shape, ndim);
  int64_t cb[64] = {0};
  int64_t *conc = ndim <= 64 ? cb : tg_xmalloc(sizeof(int64_t) * (size_t)ndim);
  bool any = decode_args(shape, ndim, conc);
  UOp *r = NULL;
  if (ndim == a->ndim && (ndim == 0 || !memcmp(conc, a->shape, sizeof(int64_t) * (size_t)ndim)) && (!any || same_sym(shape, any, a)))
    r = uop_ref(a);
  /* collapse reshape chains: reshape(reshape(x)) == reshape(x), unless the inner one is held by a
   * tensor (which a gradient may be asked for) */
  if (!r && a->op == OP_RESHAPE && !(uop_flags(a) & (UOPF_GRAD_LEAF | UOPF_HELD_RESHAPE))) a = a->src[0];
  if (!r && ndim == a->ndim && (ndim == 0 || !memcmp(conc, a->shape, sizeof(int64_t) * (size_t)ndim)) &&
      (!any || same_sym(shape, any, a)))
    r = uop_ref(a);
  if (!r) r = mk_move_sym(OP_RESHAPE, a, conc, shape, ndim, any, conc, ndim);
  if (conc != cb) free(conc);
  return r;
}

UOp *g_permute(UOp *a, const int64_t *order) {
  if (m_is(a)) return m_permute(a, order);
  bool ident = true;
  int64_t shape[64];
  int64_t *sh = a->ndim <= 64 ? shape : tg_xmalloc(sizeof(int64_t) * (size_t)a->ndim);
  for (int i = 0; i < a->ndim; i++) {
    sh[i] = a->shape[order[i]];
    if (order[i] != i) ident = false;
  }
  UOp *u = ident ? uop_ref(a) : mk_move(OP_PERMUTE, a, order, a->ndim, sh, a->ndim);
  if (sh != shape) free(sh);
  return u;
}

UOp *g_expand(UOp *a, const int64_t *shape) {
  if (m_is(a)) return m_expand(a, shape);
  if (a->ndim == 0) return uop_ref(a);
  int64_t cb[64] = {0};
  int64_t *conc = a->ndim <= 64 ? cb : tg_xmalloc(sizeof(int64_t) * (size_t)a->ndim);
  bool any = decode_args(shape, a->ndim, conc);
  UOp *r;
  if (!memcmp(conc, a->shape, sizeof(int64_t) * (size_t)a->ndim) && (!any || same_sym(shape, any, a)))
    r = uop_ref(a);
  else
    r = mk_move_sym(OP_EXPAND, a, conc, shape, a->ndim, any, conc, a->ndim);
  if (conc != cb) free(conc);
  return r;
}

UOp *g_pad(UOp *a, const int64_t *pads0) {
  if (m_is(a)) return m_pad(a, pads0);
  bool any = false;
  int64_t shape[64], pb[128];
  int64_t *sh = a->ndim <= 64 ? shape : tg_xmalloc(sizeof(int64_t) * (size_t)a->ndim);
  int64_t *pads = a->ndim <= 64 ? pb : tg_xmalloc(sizeof(int64_t) * (size_t)(2 * a->ndim));
  bool syms = decode_args(pads0, 2 * a->ndim, pads);
  for (int i = 0; i < a->ndim; i++) {
    sh[i] = a->shape[i] + pads[2 * i] + pads[2 * i + 1];
    any = any || pads[2 * i] || pads[2 * i + 1] || syms;
  }
  UOp *u = any ? mk_move_sym(OP_PAD, a, pads, pads0, 2 * a->ndim, syms, sh, a->ndim) : uop_ref(a);
  if (sh != shape) free(sh);
  if (pads != pb) free(pads);
  return u;
}

UOp *g_shrink(UOp *a, const int64_t *bounds0) {
  if (m_is(a)) return m_shrink(a, bounds0);
  bool any = false;
  int64_t shape[64], bb[128];
  int64_t *sh = a->ndim <= 64 ? shape : tg_xmalloc(sizeof(int64_t) * (size_t)a->ndim);
  int64_t *bounds = a->ndim <= 64 ? bb : tg_xmalloc(sizeof(int64_t) * (size_t)(2 * a->ndim));
  bool syms = decode_args(bounds0, 2 * a->ndim, bounds);
  for (int i = 0; i < a->ndim; i++) {
    sh[i] = bounds[2 * i + 1] - bounds[2 * i];
    any = any || bounds[2 * i] != 0 || bounds[2 * i + 1] != a->shape[i] || syms;
  }
  UOp *u = any ? mk_move_sym(OP_SHRINK, a, bounds, bounds0, 2 * a->ndim, syms, sh, a->ndim) : uop_ref(a);
  if (sh != shape) free(sh);
  if (bounds != bb) free(bounds);
  return u;
}

UOp *g_flip(UOp *a, const int64_t *flags) {
  if (m_is(a)) return m_flip(a, flags);
  bool any = false;
  for (int i = 0; i < a->ndim; i++) any = any || (flags[i] && a->shape[i] > 1);
  if (!any) return uop_ref(a);
  return mk_move(OP_FLIP, a, flags, a->ndim, a->shape, a->ndim);
}

static UOp *reduce1(UOp *a, int op, const int64_t *axes, int naxes) {
  if (naxes == 0) return uop_ref(a);
  int64_t shape[64];
  int64_t *sh = a->ndim <= 64 ? shape : tg_xmalloc(sizeof(int64_t) * (size_t)a->ndim);
  memcpy(sh, a->shape, sizeof(int64_t) * (size_t)a->ndim);
  for (int i = 0; i < naxes; i++) sh[axes[i]] = 1;
  UArg arg;
  arg.i = op;
  UOp *u = uop_new_meta(OP_REDUCE_AXIS, (tg_dtype)a->dtype, &a, 1, axes, naxes, arg, sh, a->ndim, a->device);
  if (sh != shape) free(sh);
  return u;
}

/* A sum of many elements into few outputs would run its whole reduction on one thread (the
 * threads split the output): split it in two stages, tinygrad's split_reduceop. The first reduced
 * axis becomes (G, n/G); the first kernel sums each of the G groups (G partial results per output,
 * computed in parallel), the second sums the G partials. Only sums: a two-stage max would share
 * its gradient among tied maxima per group, not evenly. SPLIT_REDUCEOP=0 turns it off. */
#define SPLIT_MIN_RATIO 32768
#define SPLIT_MAX_OUT 256

/* Does every element of a's last axis sit next to the previous one in memory wherever a reads it:
 * a tree of same-shape elementwise ops over row-major buffers (stored tensors) and broadcast
 * constants? Not a kernel's output yet to be scheduled: the scheduler may store it in another dim
 * order (a convolution's, channels last). `budget` bounds the walk (then: no). */
static bool last_axis_contiguous(UOp *a, int *budget) {
  if (--*budget < 0) return false;
  UOp *r = uop_realized(a);
  if (r) return a->op != OP_CONTIGUOUS || a->arg.i != 1; /* a materialized node may be stored permuted */
  if (a->op == OP_BUFFER || (a->op == OP_CONTIGUOUS && a->arg.i == 0)) return true;
  if (a->op == OP_DETACH) return last_axis_contiguous(a->src[0], budget);
  if (op_is_movement(a->op)) { /* only a constant broadcast */
    UOp *b = a;
    while (op_is_movement(b->op) && !uop_realized(b)) b = b->src[0];
    return b->op == OP_CONST && !uop_realized(b);
  }
  if (!op_is_alu(a->op) || a->sym) return false;
  for (uint32_t i = 0; i < a->nsrc; i++) {
    UOp *s = a->src[i];
    if (s->ndim != a->ndim || memcmp(s->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim) || !last_axis_contiguous(s, budget))
      return false;
  }
  return true;
}

/* A sum over leading axes of a large tensor whose last axis is kept and contiguous (x.sum(0) of a
 * (rows, cols) matrix): one kernel would walk each group of columns down every row, a row apart in
 * memory, which the caches and prefetchers serve at about half the bandwidth of reading rows whole.
 * The first reduced axis n becomes (n/RB, RB), RB = 16 (or 8): the first kernel sums blocks of RB
 * consecutive rows, RB streams side by side, into n/RB partial rows; the second sums those (a
 * 16th of the data, in one kernel). 2048x2048 .sum(0): 1.75 -> 0.73 ms. NULL where it does not apply. */
#define COLSPLIT_MIN_IN (1 << 20)
#define COLSPLIT_MIN_RED 256
#define COLSPLIT_MIN_COLS 64
static UOp *split_columns(UOp *a, int op, const bool *red, int64_t in_n, int64_t out_n) {
  int last = a->ndim - 1;
  /* (not 16-bit floats: their partial rows would be rounded to 11 or 8 bits once more) */
  if (op != OP_ADD || last < 1 || red[last] || a->shape[last] < COLSPLIT_MIN_COLS || in_n < COLSPLIT_MIN_IN ||
      in_n / out_n < COLSPLIT_MIN_RED || a->dtype == TG_FLOAT16 || a->dtype == TG_BFLOAT16)
    return NULL;
  int ax = -1;
  int64_t RB = 0;
  for (int i = 0; i < last && ax < 0; i++)
    for (int64_t d = 16; d >= 8 && red[i] && ax < 0; d /= 2)
      if (a->shape[i] % d == 0 && a->shape[i] / d >= 2) ax = i, RB = d;
  int budget = 64;
  if (ax < 0 || !last_axis_contiguous(a, &budget)) return NULL;
  int64_t sh[64], ax1 = ax + 1, ax2[64];
  int n = 0, nax = 0;
  for (int i = 0; i < a->ndim; i++) {
    if (i == ax) {
      ax2[nax++] = n;
      sh[n++] = a->shape[i] / RB, sh[n++] = RB;
    } else {
      if (red[i]) ax2[nax++] = n;
      sh[n++] = a->shape[i];
    }
  }
  UOp *v = g_reshape(a, sh, n);
  UOp *part = reduce1(v, op, &ax1, 1);
  UOp *tot = g_reduce(part, op, ax2, nax);
  int64_t osh[64];
  for (int i = 0; i < a->ndim; i++) osh[i] = red[i] ? 1 : a->shape[i];
  UOp *r = g_reshape(tot, osh, a->ndim);
  uop_unref(v), uop_unref(part), uop_unref(tot);
  return r;
}

UOp *g_reduce(UOp *a, int op, const int64_t *axes, int naxes) {
  if (m_is(a)) return m_reduce(a, op, axes, naxes);
  int64_t in_n = 1, out_n = 1;
  for (int i = 0; i < a->ndim; i++) in_n *= a->shape[i];
  if (op != OP_ADD || naxes == 0 || a->ndim >= 63 || in_n == 0 || a->sym || !getenv_int("SPLIT_REDUCEOP", 1))
    return reduce1(a, op, axes, naxes);
  bool red[64] = {false};
  for (int i = 0; i < naxes; i++) red[axes[i]] = true;
  for (int i = 0; i < a->ndim; i++)
    if (!red[i]) out_n *= a->shape[i];
  if (out_n > SPLIT_MAX_OUT) {
    UOp *c = split_columns(a, op, red, in_n, out_n);
    return c ? c : reduce1(a, op, axes, naxes);
  }
  if (in_n / out_n < SPLIT_MIN_RATIO) return reduce1(a, op, axes, naxes);
  /* the first reduced axis with a divisor G in [8, 64] leaving at least 8 per group: the largest */
  int ax = -1;
  int64_t G = 0;
  for (int i = 0; i < a->ndim && ax < 0; i++) {
    if (!red[i]) continue;
    for (int64_t d = 64; d >= 8 && ax < 0; d--)
      if (a->shape[i] % d == 0 && a->shape[i] / d >= 8) ax = i, G = d;
  }
  if (ax < 0) return reduce1(a, op, axes, naxes);
  int64_t sh[64], ax2[64];
  int n = 0, nax = 0;
  for (int i = 0; i < a->ndim; i++) {
    if (i == ax) {
      sh[n++] = G, sh[n] = a->shape[i] / G, ax2[nax++] = n++;
    } else {
      if (red[i]) ax2[nax++] = n;
      sh[n++] = a->shape[i];
    }
  }
  UOp *v = g_reshape(a, sh, n);
  UOp *part = reduce1(v, op, ax2, nax);
  const int64_t gax = ax;
  UOp *tot = reduce1(part, op, &gax, 1);
  int64_t osh[64];
  for (int i = 0; i < a->ndim; i++) osh[i] = red[i] ? 1 : a->shape[i];
  UOp *r = g_reshape(tot, osh, a->ndim);
  uop_unref(v), uop_unref(part), uop_unref(tot);
  return r;
}

/* one-input builders as m_map callbacks (a MULTI node applies them per shard) */
static UOp *map_contiguous(UOp *s, const void *c) { (void)c; return g_contiguous(s); }
static UOp *map_materialize(UOp *s, const void *c) { (void)c; return g_materialize(s); }
static UOp *map_stable(UOp *s, const void *c) { (void)c; return g_stable(s); }
static UOp *map_detach(UOp *s, const void *c) { (void)c; return g_detach(s); }
static UOp *map_image(UOp *s, const void *c) { const int64_t *wh = c; return g_image(s, wh[0], wh[1]); }

UOp *g_contiguous(UOp *a) {
  if (m_is(a)) return m_map(a, map_contiguous, NULL);
  UArg z = {0};
  UOp *u = uop_new_meta(OP_CONTIGUOUS, (tg_dtype)a->dtype, &a, 1, NULL, 0, z, a->shape, a->ndim, a->device);
  return u;
}

UOp *g_image(UOp *a, int64_t w, int64_t h) {
  if (m_is(a)) { const int64_t wh[2] = {w, h}; return m_map(a, map_image, wh); }
  UArg m = {0};
  m.i = 2;
  const int64_t wh[2] = {w, h};
  return uop_new_meta(OP_CONTIGUOUS, (tg_dtype)a->dtype, &a, 1, wh, 2, m, a->shape, a->ndim, a->device);
}

/* Materialized like CONTIGUOUS, but the scheduler may store it in any order of its dims (its
 * values are only read through the graph, never handed to the user as a buffer). */
UOp *g_materialize(UOp *a) {
  if (m_is(a)) return m_map(a, map_materialize, NULL);
  UArg m = {0};
  m.i = 1;
  UOp *u = uop_new_meta(OP_CONTIGUOUS, (tg_dtype)a->dtype, &a, 1, NULL, 0, m, a->shape, a->ndim, a->device);
  return u;
}

bool g_is_stored(UOp *u, bool reduce_ok) {
  for (;;) {
    u = g_resolve(u);
    if (!op_is_movement(u->op)) break;
    u = u->src[0];
  }
  return u->op == OP_BUFFER || u->op == OP_CONST || u->op == OP_IOTA || u->op == OP_CONTIGUOUS || u->op == OP_INDEX || u->op == OP_COPY ||
         u->op == OP_COLLECTIVE || u->op == OP_ASSIGN || (reduce_ok && u->op == OP_REDUCE_AXIS);
}

/* Can recomputing u round differently in another kernel: does it compute floats with rounding
 * arithmetic (add, multiply, divide, transcendental, conversion), rather than only selecting,
 * negating, comparing or moving stored values? `budget` bounds the walk (then: assume it can). */
static bool may_round(UOp *u, int *budget) {
  if (--*budget < 0) return true;
  if (g_is_stored(u, true)) return false;
  u = g_resolve(u);
  switch (u->op) {
  case OP_WHERE: case OP_MAX: case OP_NEG: case OP_CMPLT: case OP_CMPNE: case OP_CMPEQ: case OP_AND: case OP_OR:
  case OP_XOR: case OP_DETACH:
    break;
  default:
    if (!op_is_movement(u->op)) return tg_dtype_is_float((tg_dtype)u->dtype);
  }
  for (uint32_t i = 0; i < u->nsrc; i++)
    if (may_round(u->src[i], budget)) return true;
  return false;
}

UOp *g_stable(UOp *a) {
  if (m_is(a)) return m_map(a, map_stable, NULL);
  int budget = 256;
  if (!tg_dtype_is_float((tg_dtype)a->dtype) || !may_round(a, &budget)) return uop_ref(a);
  return g_materialize(a);
}

UOp *g_detach(UOp *a) {
  if (m_is(a)) return m_map(a, map_detach, NULL);
  UArg z = {0};
  UOp *u = uop_new_meta(OP_DETACH, (tg_dtype)a->dtype, &a, 1, NULL, 0, z, a->shape, a->ndim, a->device);
  return u;
}

UOp *g_index(UOp *data, UOp *idx) {
  if (m_is(data) || m_is(idx)) return m_index(data, idx);
  int nd = idx->ndim + data->ndim - 1;
  int64_t *sh = tg_xmalloc(sizeof(int64_t) * (size_t)(nd + 1));
  for (int i = 0; i < idx->ndim; i++) sh[i] = idx->shape[i];
  for (int i = 1; i < data->ndim; i++) sh[idx->ndim + i - 1] = data->shape[i];
  UOp *s[2] = {data, idx};
  UArg z = {0};
  UOp *u = uop_new_meta(OP_INDEX, (tg_dtype)data->dtype, s, 2, NULL, 0, z, sh, nd, data->device);
  free(sh);
  return u;
}

UOp *g_copy(UOp *a, int device) {
  if (m_is(a) || device_is_tuple(device)) return m_copy(a, device);
  if (a->op == OP_IOTA && !uop_realized(a)) return g_iota(a->niarg == 3 ? a->iarg[2] : a->shape[0], (tg_dtype)a->dtype, device);
  if (a->op == OP_CONST && !uop_realized(a)) {
    /* a constant needs no copy: it is the same constant on the other device (a backward pass
     * through tg_to starts from one) */
    int64_t dev = device;
    UOp *u = uop_new_meta(OP_CONST, (tg_dtype)a->dtype, NULL, 0, &dev, 1, a->arg, NULL, 0, device);
    return u;
  }
  UArg arg;
  arg.i = device;
  UOp *u = uop_new_meta(OP_COPY, (tg_dtype)a->dtype, &a, 1, NULL, 0, arg, a->shape, a->ndim, device);
  return u;
}

/* A collective reads a buffer: a bare constant or arange (a leaf with none, e.g. a 0-d tg_full) is
 * stored first. A new reference either way. */
static UOp *collective_source(UOp *a) {
  if (!uop_realized(a) && (a->op == OP_CONST || a->op == OP_IOTA)) return g_contiguous(a);
  return uop_ref(a);
}

UOp *g_collective(UOp *a, int root) {
  UArg arg;
  arg.i = root;
  UOp *src = collective_source(a);
  UOp *u = uop_new_meta(OP_COLLECTIVE, (tg_dtype)a->dtype, &src, 1, NULL, 0, arg, a->shape, a->ndim, a->device);
  uop_unref(src);
  return u;
}

UOp *g_allreduce(UOp *const *parts, int n, int op, int member) {
  UArg arg;
  arg.i = member;
  const int64_t iop = op;
  const UOp *p = parts[member];
  UOp **src = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) src[i] = collective_source(parts[i]);
  UOp *u = uop_new_meta(OP_COLLECTIVE, (tg_dtype)p->dtype, src, n, &iop, 1, arg, p->shape, p->ndim, p->device);
  for (int i = 0; i < n; i++) uop_unref(src[i]);
  free(src);
  return u;
}

/* ASSIGN nodes made since the last time none was pending (handles.c: t_realize_pending_writes) */
_Atomic long g_assigns_made;

UOp *g_assign(UOp *target, UOp *value) {
  atomic_fetch_add(&g_assigns_made, 1);
  if (m_is(target)) return m_assign(target, value);
  UOp *s[2] = {target, value};
  UArg z = {0};
  UOp *u = uop_new_meta(OP_ASSIGN, (tg_dtype)target->dtype, s, 2, NULL, 0, z, target->shape, target->ndim, target->device);
  return u;
}

/* The number of elements a reduction over the dims red[] of a takes, as a node (keepdim shape, or
 * with those dims dropped) when one of them is symbolic: a sum of ones over them, so kernels count
 * at run time instead of baking the bound value in (a mean over start_pos + 1 keys). NULL when
 * every reduced dim is concrete (the caller uses the number). */
UOp *g_sym_count(UOp *a, const bool *red, bool keepdim, tg_dtype dt) {
  bool sym = false;
  int64_t axes[64];
  int na = 0;
  for (int i = 0; i < a->ndim && i < 64; i++) {
    if (!red[i]) continue;
    sym = sym || (a->sym && sym_is_code(a->sym[i]));
    axes[na++] = i;
  }
  if (!sym) return NULL;
  UOp *one = g_const_shaped(1.0, dt, a->device, a->sym, a->ndim);
  UOp *r = g_reduce(one, OP_ADD, axes, na);
  uop_unref(one);
  if (keepdim) return r;
  int64_t sh[64];
  int nd = 0;
  for (int i = 0; i < a->ndim; i++)
    if (!red[i]) sh[nd++] = r->shape[i];
  UOp *q = g_reshape(r, sh, nd);
  uop_unref(r);
  return q;
}

/* An assign of value into the region bounds (2 per dim, tg_sym codes allowed) of target, whose
 * shape stays the target's: tinygrad's assign to a shrink of a buffer, written in place. */
UOp *g_assign_region(UOp *target, UOp *value, const int64_t *bounds0) {
  atomic_fetch_add(&g_assigns_made, 1);
  if (m_is(target)) return m_assign_region(target, value, bounds0);
  int n = 2 * target->ndim;
  int64_t cb[128] = {0};
  int64_t *conc = n <= 128 ? cb : tg_xmalloc(sizeof(int64_t) * (size_t)n);
  bool any = decode_args(bounds0, n, conc);
  int64_t *ia = tg_xmalloc(sizeof(int64_t) * (size_t)(2 * n + 1));
  memcpy(ia, conc, sizeof(int64_t) * (size_t)n);
  if (any) memcpy(ia + n, bounds0, sizeof(int64_t) * (size_t)n);
  UOp *s[2] = {target, value};
  UArg z = {0};
  UOp *u = uop_new_meta(OP_ASSIGN, (tg_dtype)target->dtype, s, 2, ia, any ? 2 * n : n, z, target->shape, target->ndim,
                        target->device);
  free(ia);
  if (conc != cb) free(conc);
  return u;
}

/* u with every symbolic argument of its movement ops down to a buffer replaced by its bound value:
 * the same elements, as a view of concrete shape (for reading data out). */
UOp *g_concrete(UOp *u) {
  if (uop_realized(u)) return uop_ref(uop_realized(u));
  if (u->op == OP_BUFFER || (!op_is_movement(u->op) && u->op != OP_DETACH)) return uop_ref(u);
  UOp *src = g_concrete(u->src[0]);
  if (u->op == OP_DETACH) return src;
  int n;
  const int64_t *args = uop_move_args(u, &n);
  (void)args;
  UOp *r = mk_move(u->op, src, u->iarg, n, u->shape, u->ndim);
  uop_unref(src);
  return r;
}

