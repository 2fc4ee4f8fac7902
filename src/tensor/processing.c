/*
 * processing.c -- comparison (isclose/allclose), scans (cumprod, cummax/cummin, logcumsumexp), max
 * pooling with indices and unpooling, einsum, interpolate, sorting (sort/argsort/topk), multinomial
 * sampling, and the QR / SVD decompositions.
 *
 * In: handles and arguments from the user. Out: new handles in the caller's scope (several results go
 * to out-pointers, with a tg_status), or none + an error naming the function, the shapes/values and a
 * hint. Like nnops.c, everything is a composition of the public ops, built the way tinygrad builds it
 * (its Tensor methods of the same names), so results are lazy graphs that fuse and that autograd
 * differentiates. Only tg_allclose reads data (it answers a C bool).
 *
 * Invariants: arguments are validated before any graph is built; intermediates live in a private
 * scope that ends before returning (loops open one scope per iteration, so the handle table stays
 * small); an inner failure is re-recorded as "fn: <inner message>".
 *
 * Where we differ from tinygrad (each place says why): the bitonic sort gives each comparator stage
 * a view whose dims are the bit fields of the position (the pair's bit and the run's direction bit
 * among them; for distances below 16 on the (B, 16, N/16) transpose, so the stage runs in vector
 * lanes), where tinygrad reverses every other run between merges, and its comparators exchange
 * values (tinygrad's max/min pair copies a NaN into both places); the SVD's round-robin
 * pairings are computed on the host (they do not depend on the data) so every Jacobi round is the same
 * kernels; QR and SVD of fp8 run in float32 and cast their results back (in fp8 they come out
 * tens of percent off); cummax/cummin indices pick the latest tie like torch; max_unpool2d averages
 * repeated indices instead of adding them; einsum broadcasts size-1 dims and takes diagonals of any
 * rank correctly.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compose.h"

#define NONE ((tg_tensor){0})
#define MAXD 64

int norm_axis(const char *fn, int axis, int ndim, int *out); /* ops.c */

#define fail op_fail
#define begin op_scope_begin
#define done op_scope_done
#define reword op_relabel
typedef OpScope POp;

/* Closes the op's scope for n results: each non-NULL out[i] gets r[i] (moved out), or every one gets
 * none if any result is invalid or a step inside recorded an error (a result need not depend on the
 * step that failed, and a TG_OK beside a recorded error would be a contradiction). */
static tg_status done_n(POp o, tg_tensor *const *out, const tg_tensor *r, int n) {
  bool ok = o.had || !tg_has_error();
  for (int i = 0; i < n; i++)
    if (out[i] && !tg_valid(r[i])) ok = false;
  if (!ok) reword(o);
  for (int i = 0; i < n; i++)
    if (out[i]) *out[i] = ok ? tg_keep(r[i]) : NONE;
  tg_scope_end();
  return ok ? TG_OK : (tg_last_status() ? tg_last_status() : TG_ERR_INVALID);
}

static void clear_outs(tg_tensor *const *out, int n) {
  for (int i = 0; i < n; i++)
    if (out[i]) *out[i] = NONE;
}
static tg_status st_fail(tg_tensor *const *out, int n) {
  clear_outs(out, n);
  return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
}

/* A new handle to the same lazy value (an input handle is never handed back: the caller owns it). */
static tg_tensor same(UOp *u) { return t_wrap(uop_ref(u)); }

#define cdiv ceil_div
static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

static bool is_half(tg_dtype dt) { return dt == TG_FLOAT16 || dt == TG_BFLOAT16; }

/* tinygrad's _inverse: an order-reversing bijection (-x, ~x, not x). */
static tg_tensor inverse(tg_tensor x) {
  tg_dtype dt = tg_dtype_of(x);
  if (tg_dtype_is_float(dt)) return tg_neg(x);
  if (dt == TG_BOOL) return tg_logical_not(x);
  return tg_bitwise_not(x);
}

/* Pads the last dim of x (n dims) by (before, after) with value. n < 1 (the shape of a none handle
 * whose error is already recorded) gives none. */
static tg_tensor pad_last(tg_tensor x, int n, int64_t before, int64_t after, double value) {
  if (n < 1 || n > MAXD) return NONE;
  int64_t p[2 * MAXD] = {0};
  p[2 * (n - 1)] = before, p[2 * (n - 1) + 1] = after;
  return tg_pad(x, p, 2 * n, value);
}
/* x[..., lo:hi] on the last dim (shape xs, n dims); none for n < 1, as pad_last. */
static tg_tensor shrink_last(tg_tensor x, const int64_t *xs, int n, int64_t lo, int64_t hi) {
  if (n < 1 || n > MAXD) return NONE;
  int64_t b[2 * MAXD];
  for (int j = 0; j < n; j++) b[2 * j] = 0, b[2 * j + 1] = xs[j];
  b[2 * (n - 1)] = lo, b[2 * (n - 1) + 1] = hi;
  return tg_shrink(x, b, 2 * n);
}
/* The shape of t into out; its ndim, or -1 (out untouched) for a none handle: every caller checks
 * the count before indexing out[n - 1] (an inner step that failed leaves none behind). */
static int shape_of(tg_tensor t, int64_t *out) { return tg_shape(t, out); }

/* The gradient of a contiguous() is materialized too (tinygrad's contiguous_backward). Networks of
 * lazy ops that read each stage at two positions (the sort's comparators, the Jacobi rounds) would
 * otherwise inline every later stage's gradient twice per stage: 2^depth work per element. */
static void contiguous_grad(UOp *out, UOp *g, UOp *const *inputs, int n, UOp **grads) {
  (void)out, (void)inputs, (void)n;
  grads[0] = g_contiguous(g);
}
static tg_tensor contiguous2(tg_tensor x) {
  tg_tensor y = tg_contiguous(x);
  UOp *xu = tg_valid(x) ? t_get(x, "contiguous") : NULL, *yu = tg_valid(y) ? t_get(y, "contiguous") : NULL;
  if (xu && yu && tg_dtype_is_float((tg_dtype)yu->dtype)) ag_set_custom_grad(yu, &xu, 1, contiguous_grad);
  return y;
}

/* (n, n) bool mask [i, j] = j <= i (lower = true) or i <= j (lower = false), n = a's size along dim
 * (symbolic where that dim is), on a's device */
static tg_tensor tri_mask(UOp *a, int dim, bool lower) {
  tg_tensor c = dim_arange(a, dim), r = tg_unsqueeze(c, -1);
  return lower ? tg_le(c, r) : tg_le(r, c);
}

/* ---------------------------------------------------------------------------------------------- */
/* isclose / allclose                                                                              */

static bool bcast_ok(const char *fn, UOp *a, UOp *b) {
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int i = 0; i < n; i++) {
    int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
    int64_t x = ia >= 0 ? a->shape[ia] : 1, y = ib >= 0 ? b->shape[ib] : 1;
    if (x != y && x != 1 && y != 1) {
      fail("%s: shapes %s and %s cannot broadcast (each dimension must match or be 1)", fn, SHP(a), SHP(b));
      return false;
    }
  }
  return true;
}

static bool isclose_args(const char *fn, tg_tensor x, tg_tensor y, double rtol, double atol, UOp **pa,
                         UOp **pb) {
  UOp *a = t_get(x, fn), *b = a ? t_get(y, fn) : NULL;
  if (!a || !b) return false;
  if (!(rtol >= 0) || !(atol >= 0)) {
    fail("%s: rtol (%g) and atol (%g) must be non-negative numbers", fn, rtol, atol);
    return false;
  }
  if (a->device != b->device) {
    fail("%s: y is on %s but x is on %s; move it with tg_to", fn, device_by_id(b->device)->name,
         device_by_id(a->device)->name);
    return false;
  }
  if (!bcast_ok(fn, a, b)) return false;
  *pa = a, *pb = b;
  return true;
}

/* tinygrad's isclose: finite-and-close | equal infinities | both nan (equal_nan). Floats compute in
 * their promoted dtype (16-bit floats in float32); integers and bools in float64, where |x - y|
 * cannot wrap around. */
static tg_tensor isclose_(tg_tensor x, tg_tensor y, UOp *a, UOp *b, double rtol, double atol,
                          bool equal_nan) {
  tg_dtype dt = tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)b->dtype);
  tg_dtype cdt = tg_dtype_is_float(dt) ? (is_half(dt) ? TG_FLOAT32 : dt) : TG_FLOAT64;
  tg_tensor xc = tg_cast(x, cdt), yc = tg_cast(y, cdt);
  tg_tensor diff = tg_abs(tg_sub(xc, yc));
  tg_tensor tol = tg_add_s(tg_mul_s(tg_abs(yc), rtol), atol);
  tg_tensor close = tg_le(diff, tol);
  if (!tg_dtype_is_float(dt)) return close;
  tg_tensor fin = tg_bitwise_and(tg_bitwise_and(tg_isfinite(xc), tg_isfinite(yc)), close);
  tg_tensor inf = tg_bitwise_and(tg_bitwise_or(tg_isinf(xc), tg_isinf(yc)), tg_eq(xc, yc));
  tg_tensor r = tg_bitwise_or(fin, inf);
  if (equal_nan) r = tg_bitwise_or(r, tg_bitwise_and(tg_isnan(xc), tg_isnan(yc)));
  return r;
}

tg_tensor tg_isclose(tg_tensor x, tg_tensor y, double rtol, double atol, bool equal_nan) {
  const char *fn = "tg_isclose";
  UOp *a, *b;
  if (!isclose_args(fn, x, y, rtol, atol, &a, &b)) return NONE;
  POp o = begin(fn);
  return done(o, isclose_(x, y, a, b, rtol, atol, equal_nan));
}

tg_status tg_allclose(tg_tensor x, tg_tensor y, double rtol, double atol, bool equal_nan, bool *out) {
  const char *fn = "tg_allclose";
  UOp *a, *b;
  if (!out) return tg_set_error(TG_ERR_INVALID, "%s: out is NULL", fn);
  *out = false;
  if (!isclose_args(fn, x, y, rtol, atol, &a, &b))
    return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
  POp o = begin(fn);
  tg_tensor r = tg_all(isclose_(x, y, a, b, rtol, atol, equal_nan), NULL, 0, false);
  double v = 0;
  tg_status st = tg_valid(r) ? tg_item(r, &v) : TG_ERR_INVALID;
  if (st != TG_OK) reword(o);
  tg_scope_end();
  if (st == TG_OK) *out = v != 0;
  return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* scans: tinygrad's _cumalu / _split_cumalu                                                       */

typedef enum { CUM_ADD, CUM_MUL, CUM_MAX } CumOp;

static double cum_identity(CumOp op, tg_dtype dt) {
  return op == CUM_ADD ? 0.0 : op == CUM_MUL ? 1.0 : dtype_min(dt);
}

static tg_tensor cum_reduce(tg_tensor w, CumOp op, int axis) {
  const int ax[1] = {axis};
  return op == CUM_ADD   ? tg_sum(w, ax, 1, false)
         : op == CUM_MUL ? tg_prod(w, ax, 1, false)
                         : tg_max(w, ax, 1, false);
}
static tg_tensor cum_combine(tg_tensor a, tg_tensor b, CumOp op) {
  return op == CUM_ADD ? tg_add(a, b) : op == CUM_MUL ? tg_mul(a, b) : tg_maximum(a, b);
}

/* The sliding windows of the last dim (length L, window k, stride 1): (..., L) -> (..., k, L-k+1) with
 * w[..., j, i] = x[..., i + j], by movement ops only (tinygrad's _pool for one dim): k+1 copies of x
 * laid end to end and re-read with row length L+1 shift each copy by one more element. */
static tg_tensor windows_last(tg_tensor x, int64_t L, int64_t k) {
  int64_t xs[MAXD + 2];
  int n = shape_of(x, xs);
  if (n < 1) return NONE;
  tg_tensor e = tg_unsqueeze(x, -2);
  xs[n - 1] = k + 1, xs[n] = L;
  e = tg_expand(e, xs, n + 1);
  xs[n - 1] = (k + 1) * L;
  e = tg_reshape(e, xs, n);
  e = shrink_last(e, xs, n, 0, k * (L + 1));
  xs[n - 1] = k, xs[n] = L + 1;
  e = tg_reshape(e, xs, n + 1);
  return shrink_last(e, xs, n + 1, 0, L - k + 1);
}

/* tinygrad's _cumalu on the last dim (size s >= 1): pad s-1 identities in front, reduce windows. */
static tg_tensor cum_last(tg_tensor x, CumOp op) {
  int64_t xs[MAXD];
  int n = shape_of(x, xs);
  if (n < 1) return NONE;
  int64_t s = xs[n - 1];
  tg_tensor p = pad_last(x, n, s - 1, 0, cum_identity(op, tg_dtype_of(x)));
  return cum_reduce(windows_last(p, 2 * s - 1, s), op, -2);
}

/* tinygrad's _split_cumalu: x non-empty with ndim >= 1, ax normalized. Up to 512 elements one window
 * reduction; above, a cumulative op inside chunks of 256 plus the running total of earlier chunks. */
static tg_tensor split_cum(tg_tensor x, int ax, CumOp op) {
  tg_tensor t = tg_transpose(x, ax, -1);
  int64_t ts[MAXD + 1];
  int n = shape_of(t, ts);
  if (n < 1) return NONE;
  int64_t s = ts[n - 1];
  const int64_t SPLIT = 256;
  UOp *a = t_get(x, "scan");
  tg_tensor r;
  if (a && t_dim_sym(x, ax)) {
    /* a symbolic axis can be neither padded by its own length nor split into chunks: the (v, v)
     * lower-triangular selection of the identity, reduced (v^2 work per row) */
    tg_tensor id = tg_cast(tg_const_like(t, cum_identity(op, tg_dtype_of(t))), tg_dtype_of(t));
    r = cum_reduce(tg_where(tri_mask(a, ax, true), tg_unsqueeze(t, -2), id), op, -1);
  } else if (s <= 2 * SPLIT) {
    r = cum_last(t, op);
  } else {
    double idv = cum_identity(op, tg_dtype_of(t));
    int64_t padded = cdiv(s, SPLIT) * SPLIT, nch = padded / SPLIT, cs[MAXD + 1];
    memcpy(cs, ts, sizeof(int64_t) * (size_t)n);
    cs[n - 1] = nch, cs[n] = SPLIT;
    tg_tensor chunks = cum_last(tg_reshape(pad_last(t, n, padded - s, 0, idv), cs, n + 1), op);
    int64_t cs2[MAXD + 1];
    int n2 = shape_of(chunks, cs2);
    if (n2 != n + 1) return NONE; /* a step failed (the tensor is too large for the windows) */
    tg_tensor last = tg_squeeze(shrink_last(chunks, cs2, n2, SPLIT - 1, SPLIT), -1);
    tg_tensor base = pad_last(cum_last(last, op), n, 1, -1, idv);
    tg_tensor full = tg_flatten(cum_combine(chunks, tg_unsqueeze(base, -1), op), -2, -1);
    int64_t fs[MAXD];
    int nf = shape_of(full, fs);
    if (nf != n) return NONE;
    r = shrink_last(full, fs, nf, padded - s, padded);
  }
  return tg_transpose(r, ax, -1);
}

/* Common checks of the scans: a live handle, a valid axis, room for the window dims. */
static UOp *scan_args(const char *fn, tg_tensor x, int axis, int *ax) {
  UOp *a = t_get(x, fn);
  if (!a) return NULL;
  if (norm_axis(fn, axis, a->ndim, ax) < 0) return NULL;
  if (a->ndim > MAXD - 4) {
    fail("%s: shape %s has more than %d dimensions", fn, SHP(a), MAXD - 4);
    return NULL;
  }
  return a;
}

tg_tensor tg_cumprod(tg_tensor x, int axis) {
  const char *fn = "tg_cumprod";
  int ax;
  UOp *a = scan_args(fn, x, axis, &ax);
  if (!a) return NONE;
  POp o = begin(fn);
  if (a->ndim == 0 || shape_numel(a->shape, a->ndim) == 0)
    return done(o, tg_cast(x, tg_dtype_of(tg_prod(x, NULL, 0, false))));
  return done(o, split_cum(x, ax, CUM_MUL));
}

/* cummax of x (ndim >= 1, non-empty): values and (if want_idx) int32 indices; torch's tie rule: the
 * latest i <= j with x[i] == values[j], i.e. max over i of (i + 1) * match[i, j], minus 1. */
static void cummax_(UOp *a, tg_tensor x, int ax, bool want_idx, tg_tensor *v, tg_tensor *idx) {
  /* the running max and the comparison with it must read the same bits: an input that rounds
   * (exp2, a division) recomputed in two kernels, vector lanes in one and scalar code in the other,
   * could differ in its last bit and match no position (an index of -1) */
  UOp *xu = want_idx ? t_get(x, "cummax") : NULL;
  if (xu) x = t_wrap(g_stable(xu));
  *v = split_cum(x, ax, CUM_MAX);
  *idx = NONE;
  if (!want_idx) return;
  tg_tensor xt = tg_transpose(x, ax, -1), vt = tg_transpose(*v, ax, -1);
  tg_tensor eq = tg_eq(tg_unsqueeze(xt, -1), tg_unsqueeze(vt, -2));
  /* from a NaN on the running max is NaN (PyTorch's values): its index is the latest NaN's */
  if (tg_dtype_is_float((tg_dtype)a->dtype)) eq = tg_bitwise_or(eq, tg_isnan(tg_unsqueeze(xt, -1)));
  tg_tensor match = tg_bitwise_and(eq, tri_mask(a, ax, false));
  tg_tensor pos = tg_unsqueeze(tg_add_s(dim_arange(a, ax), 1), -1);
  tg_tensor w = tg_where(match, pos, tg_const_like(pos, 0));
  tg_tensor r = tg_sub_s(tg_max(w, (const int[]){-2}, 1, false), 1);
  *idx = tg_transpose(r, ax, -1);
}

static tg_status cum_extreme(const char *fn, tg_tensor x, int axis, tg_tensor *values, tg_tensor *indices,
                             bool is_min) {
  tg_tensor *outs[2] = {values, indices};
  int ax;
  if (!values) {
    clear_outs(outs, 2);
    return tg_set_error(TG_ERR_INVALID, "%s: values is NULL", fn);
  }
  UOp *a = scan_args(fn, x, axis, &ax);
  if (!a) return st_fail(outs, 2);
  POp o = begin(fn);
  tg_tensor r[2];
  if (a->ndim == 0 || shape_numel(a->shape, a->ndim) == 0) {
    r[0] = same(a);
    tg_opts op = on_device(a, TG_INT32);
    r[1] = tg_zeros(a->shape, a->ndim, &op);
  } else {
    tg_tensor src = is_min ? inverse(x) : x;
    cummax_(a, src, ax, indices != NULL, &r[0], &r[1]);
    if (is_min) r[0] = inverse(r[0]);
  }
  return done_n(o, outs, r, 2);
}

tg_status tg_cummax(tg_tensor x, int axis, tg_tensor *values, tg_tensor *indices) {
  return cum_extreme("tg_cummax", x, axis, values, indices, false);
}
tg_status tg_cummin(tg_tensor x, int axis, tg_tensor *values, tg_tensor *indices) {
  return cum_extreme("tg_cummin", x, axis, values, indices, true);
}

tg_tensor tg_logcumsumexp(tg_tensor x, int axis) {
  const char *fn = "tg_logcumsumexp";
  int ax;
  UOp *a = scan_args(fn, x, axis, &ax);
  if (!a) return NONE;
  POp o = begin(fn);
  tg_dtype dt = tg_dtype_is_float((tg_dtype)a->dtype) ? (tg_dtype)a->dtype : tg_default_float();
  tg_tensor xf = tg_cast(x, dt);
  if (a->ndim == 0 || shape_numel(a->shape, a->ndim) == 0) return done(o, xf);
  tg_tensor xt = tg_transpose(xf, ax, -1);
  tg_tensor v, unused;
  cummax_(a, xt, a->ndim - 1, false, &v, &unused);
  /* an infinite running max is replaced by 0 (tinygrad subtracts it: inf - inf = nan where torch
   * gives +-inf); any finite shift gives the same value */
  tg_tensor m = tg_detach(tg_where(tg_isfinite(v), v, tg_const_like(v, 0)));
  /* [i, j] = x_j - m_i for j <= i, else -inf (exp gives 0) */
  tg_tensor d = tg_sub(tg_unsqueeze(xt, -2), tg_unsqueeze(m, -1));
  tg_tensor e = tg_exp(tg_where(tri_mask(a, ax, true), d, tg_const_like(d, -INFINITY)));
  tg_tensor r = tg_add(tg_log(tg_sum(e, (const int[]){-1}, 1, false)), m);
  return done(o, tg_transpose(r, ax, -1));
}

/* ---------------------------------------------------------------------------------------------- */
/* max pooling with indices, unpooling                                                             */


typedef struct {
  int64_t k[2], s[2], d[2], pads[4], hw[2]; /* pads: (H before, H after, W before, W after) */
} PoolArgs;

/* A (y, x) pair of an options field: both 0 -> def, second 0 -> the first twice (as tg_max_pool2d). */
static bool opt_pair(const char *fn, const char *name, const int64_t *v, const int64_t *def, int64_t *out) {
  if (v[0] == 0 && v[1] == 0)
    out[0] = def[0], out[1] = def[1];
  else if (v[1] == 0)
    out[0] = out[1] = v[0];
  else
    out[0] = v[0], out[1] = v[1];
  if (out[0] < 1 || out[1] < 1 || out[0] > ((int64_t)1 << 32) || out[1] > ((int64_t)1 << 32)) {
    fail("%s: %s (%lld, %lld) must be positive (0 means the default)", fn, name, (long long)v[0],
         (long long)v[1]);
    return false;
  }
  return true;
}

/* tg_pool2d_opts -> kernel, stride, dilation, padding (the forms of tg_max_pool2d). check_window:
 * the window must fit in the padded input. */
static bool pool_args(const char *fn, UOp *a, const tg_pool2d_opts *opts, bool check_window, PoolArgs *pa) {
  static const tg_pool2d_opts zero;
  static const int64_t two[2] = {2, 2}, one[2] = {1, 1};
  if (!opts) opts = &zero;
  if (a->ndim < 2 || a->ndim > 30) {
    fail("%s: needs 2..30 dimensions (..., height, width), got shape %s", fn, SHP(a));
    return false;
  }
  if (!opt_pair(fn, "kernel_size", opts->kernel_size, two, pa->k) ||
      !opt_pair(fn, "stride", opts->stride, pa->k, pa->s) ||
      !opt_pair(fn, "dilation", opts->dilation, one, pa->d))
    return false;
  const int64_t *p = opts->padding;
  int64_t *q = pa->pads;
  switch (opts->npadding) {
  case 0:
    if (p[1] || p[2] || p[3]) {
      fail("%s: padding has several entries but npadding is 0; set npadding to 1, 2 or 4", fn);
      return false;
    }
    /* fallthrough */
  case 1:
    q[0] = q[1] = q[2] = q[3] = p[0];
    break;
  case 2:
    q[0] = q[1] = p[0], q[2] = q[3] = p[1];
    break;
  case 4:
    q[2] = p[0], q[3] = p[1], q[0] = p[2], q[1] = p[3];
    break; /* (left, right, top, bottom) */
  default:
    fail("%s: npadding is %d; use 1 (all sides), 2 (pad_h, pad_w) or 4 (left, right, top, bottom)", fn,
         opts->npadding);
    return false;
  }
  for (int i = 0; i < 4; i++)
    if (q[i] > ((int64_t)1 << 32) || q[i] < -((int64_t)1 << 32)) {
      fail("%s: padding %lld is out of range", fn, (long long)q[i]);
      return false;
    }
  pa->hw[0] = a->shape[a->ndim - 2], pa->hw[1] = a->shape[a->ndim - 1];
  for (int j = 0; check_window && j < 2; j++) {
    int64_t ip = pa->hw[j] + q[2 * j] + q[2 * j + 1], span = pa->d[j] * (pa->k[j] - 1) + 1;
    /* (with ceil_mode the one window may hang over the end, as in tg_max_pool2d) */
    if (opts->ceil_mode ? ip - span <= -pa->s[j] : ip < span) {
      fail("%s: the %s window (kernel %lld, dilation %lld spans %lld) is larger than the padded input (%lld) "
           "of "
           "shape %s",
           fn, j ? "horizontal" : "vertical", (long long)pa->k[j], (long long)pa->d[j], (long long)span,
           (long long)ip, SHP(a));
      return false;
    }
  }
  return true;
}

/* tinygrad's _apply_ceil_mode: extra padding after each dim so the last partial window counts */
static void ceil_pads(const PoolArgs *p, int64_t *out) {
  for (int j = 0; j < 2; j++) {
    int64_t i = p->hw[j], pb = p->pads[2 * j], pa = p->pads[2 * j + 1], span = p->d[j] * (p->k[j] - 1) + 1;
    int64_t o = cdiv(i + pb + pa - span, p->s[j]) + 1;
    out[2 * j] = pb;
    out[2 * j + 1] =
        pa + p->s[j] * (o - 1) + span - (i + pb + pa) - imax(p->s[j] * (o - 1) - (pb + i - 1), 0);
  }
}

/* pads the last two dims (pads as PoolArgs) with value and makes the (..., oh, ow, kh, kw) windows */
static tg_tensor pad_pool(tg_tensor x, const int64_t *pads, double value, const PoolArgs *p) {
  int64_t xs[MAXD], pp[2 * MAXD] = {0};
  int n = shape_of(x, xs);
  if (n < 2) return NONE;
  for (int j = 0; j < 2; j++) {
    pp[2 * (n - 2 + j)] = pads[2 * j], pp[2 * (n - 2 + j) + 1] = pads[2 * j + 1];
    xs[n - 2 + j] += pads[2 * j] + pads[2 * j + 1];
  }
  return pool_windows(tg_pad(x, pp, 2 * n, value), xs, n, 2, p->k, p->s, p->d);
}

tg_status tg_max_pool2d_with_indices(tg_tensor x, const tg_pool2d_opts *opts, tg_tensor *values,
                                     tg_tensor *indices) {
  const char *fn = "tg_max_pool2d_with_indices";
  tg_tensor *outs[2] = {values, indices};
  if (!values) {
    clear_outs(outs, 2);
    return tg_set_error(TG_ERR_INVALID, "%s: values is NULL", fn);
  }
  UOp *a = t_get(x, fn);
  PoolArgs p;
  if (!a || !pool_args(fn, a, opts, true, &p)) return st_fail(outs, 2);
  int64_t pads[4];
  memcpy(pads, p.pads, sizeof pads);
  if (opts && opts->ceil_mode) ceil_pads(&p, pads);
  POp o = begin(fn);
  const int ax[2] = {-2, -1};
  tg_tensor pooled = pad_pool(x, pads, dtype_min((tg_dtype)a->dtype), &p);
  tg_tensor r[2] = {tg_max(pooled, ax, 2, false), NONE};
  if (indices) {
    /* tinygrad: positions numbered backwards (HW .. 1) so the max picks the first maximum of a window */
    int64_t hw = p.hw[0] * p.hw[1];
    tg_tensor pos = tg_reshape(iarange(a, (double)hw, 0, -1), p.hw, 2);
    tg_tensor ppos = pad_pool(pos, pads, -2147483648.0, &p);
    tg_tensor m = tg_eq(pooled, tg_max(pooled, ax, 2, true));
    tg_tensor sel = tg_where(m, ppos, tg_const_like(ppos, 0));
    r[1] = tg_rsub_s((double)hw, tg_max(sel, ax, 2, false));
  }
  return done_n(o, outs, r, 2);
}

tg_tensor tg_max_unpool2d(tg_tensor x, tg_tensor indices, const tg_pool2d_opts *opts,
                          const int64_t *output_size, int noutput) {
  const char *fn = "tg_max_unpool2d";
  UOp *a = t_get(x, fn), *ix = a ? t_get(indices, fn) : NULL;
  if (!a || !ix) return NONE;
  PoolArgs p;
  if (!pool_args(fn, a, opts, false, &p)) return NONE;
  if (!tg_dtype_is_int((tg_dtype)ix->dtype))
    return fail("%s: indices have dtype %s; they must be integers (from tg_max_pool2d_with_indices)", fn,
                tg_dtype_name((tg_dtype)ix->dtype));
  if (ix->ndim != a->ndim || memcmp(ix->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim))
    return fail("%s: indices have shape %s but x has shape %s; they must be equal", fn, SHP(ix), SHP(a));
  if (ix->device != a->device)
    return fail("%s: indices are on %s but x is on %s; move them with tg_to", fn,
                device_by_id(ix->device)->name, device_by_id(a->device)->name);
  int64_t os[2];
  if (noutput > 0 || output_size) {
    if (noutput < 2 || !output_size)
      return fail("%s: output_size needs at least 2 entries (height, width), got %d%s", fn, noutput,
                  output_size ? "" : " and NULL");
    os[0] = output_size[noutput - 2], os[1] = output_size[noutput - 1];
  } else {
    for (int j = 0; j < 2; j++)
      os[j] = (p.hw[j] - 1) * p.s[j] - (p.pads[2 * j] + p.pads[2 * j + 1]) + p.d[j] * (p.k[j] - 1) + 1;
  }
  if (os[0] < 0 || os[1] < 0 || os[0] > ((int64_t)1 << 31) || os[1] > ((int64_t)1 << 31) ||
      os[0] * os[1] > ((int64_t)1 << 31))
    return fail("%s: output size (%lld, %lld) is out of range for input %s", fn, (long long)os[0],
                (long long)os[1], SHP(a));
  POp o = begin(fn);
  int n = a->ndim;
  int64_t L = p.hw[0] * p.hw[1], P = os[0] * os[1], sh[MAXD];
  memcpy(sh, a->shape, sizeof(int64_t) * (size_t)n);
  sh[n - 2] = 1, sh[n - 1] = L;
  tg_tensor xi = tg_reshape(indices, sh, n), xv = tg_reshape(x, sh, n);
  /* one-hot of every index over the P output positions: (..., P, L) */
  tg_tensor oh = tg_eq(xi, tg_unsqueeze(tg_cast(iarange(a, 0, (double)P, 1), (tg_dtype)ix->dtype), -1));
  const int last[1] = {-1};
  /* the largest value sent to each position (repeated indices from max pooling carry equal values) */
  tg_tensor lo = tg_cast(tg_const_like(xv, dtype_min((tg_dtype)a->dtype)), (tg_dtype)a->dtype);
  tg_tensor mx = tg_max(tg_where(oh, xv, lo), last, 1, false);
  tg_tensor hit = tg_any(oh, last, 1, false);
  tg_tensor r = tg_where(hit, mx, tg_cast(tg_const_like(xv, 0), (tg_dtype)a->dtype));
  sh[n - 2] = os[0], sh[n - 1] = os[1];
  return done(o, tg_reshape(r, sh, n));
}

/* ---------------------------------------------------------------------------------------------- */
/* einsum                                                                                          */

static bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* Checks one subscript (letters and at most one "..."); returns its letter count or -1. */
static int subscript_letters(const char *fn, const char *s, size_t len, const char *what, int idx,
                             bool *has_ell) {
  int n = 0;
  *has_ell = false;
  for (size_t i = 0; i < len; i++) {
    if (is_letter(s[i])) {
      n++;
    } else if (s[i] == '.' && i + 2 < len && s[i + 1] == '.' && s[i + 2] == '.') {
      if (*has_ell) {
        fail("%s: %s %d has more than one \"...\"", fn, what, idx);
        return -1;
      }
      *has_ell = true;
      i += 2;
    } else {
      fail("%s: %s %d: invalid character '%c' (subscripts are letters a-z, A-Z and one \"...\")", fn, what,
           idx, s[i]);
      return -1;
    }
  }
  return n;
}

/* Diagonal of the dims j < k (equal size n) of x: moved to the end, flattened, padded by n and re-read
 * with row length n + 1, so element [i, 0] is x[.., i, i]. The result has the other dims, then the
 * diagonal. */
static tg_tensor take_diagonal(tg_tensor x, int nd, int j, int k) {
  int64_t xs[MAXD];
  if (shape_of(x, xs) != nd) return NONE;
  int perm[MAXD], m = 0;
  for (int i = 0; i < nd; i++)
    if (i != j && i != k) perm[m++] = i;
  perm[m++] = j, perm[m++] = k;
  int64_t n = xs[j], sh[MAXD];
  tg_tensor y = tg_flatten(tg_permute(x, perm, nd), nd - 2, nd - 1);
  y = pad_last(y, nd - 1, 0, n, 0.0);
  for (int i = 0; i < nd - 2; i++) sh[i] = xs[perm[i]];
  sh[nd - 2] = n, sh[nd - 1] = n + 1;
  y = tg_reshape(y, sh, nd);
  y = shrink_last(y, sh, nd, 0, 1);
  return tg_squeeze(y, -1);
}

/* dtype TG_DTYPE_DEFAULT: the product's dtype (tg_sum's accumulation); else tinygrad's sum(dtype=):
 * the product is cast to dtype, then summed, and the result has that dtype */
static tg_tensor einsum_impl(const char *fn, const char *formula, const tg_tensor *ts, int n, tg_dtype dtype) {
  if (!formula) return fail("%s: formula is NULL", fn);
  if (n < 1 || !ts) return fail("%s: needs at least one tensor (n=%d%s)", fn, n, ts ? "" : ", ts=NULL");
  size_t flen = strlen(formula);
  if (flen > 4096) return fail("%s: formula is longer than 4096 characters", fn);
  UOp **us = tg_xmalloc(sizeof(UOp *) * (size_t)n);
  for (int i = 0; i < n; i++) {
    us[i] = t_get(ts[i], fn);
    if (!us[i]) {
      free(us);
      return NONE;
    }
    if (us[i]->device != us[0]->device) {
      int di = us[i]->device, d0 = us[0]->device;
      free(us);
      return fail("%s: tensor %d is on %s but tensor 0 is on %s; move it with tg_to", fn, i,
                  device_by_id(di)->name, device_by_id(d0)->name);
    }
  }
  /* strip spaces, split "lhs->rhs" and the operands */
  char *f = tg_xmalloc(flen + 1);
  size_t fl = 0;
  for (size_t i = 0; i < flen; i++)
    if (formula[i] != ' ') f[fl++] = formula[i];
  f[fl] = 0;
  tg_tensor result = NONE;
  char **sub = tg_xcalloc((size_t)n, sizeof(char *)); /* expanded subscripts */
  int *ell_n = tg_xcalloc((size_t)n, sizeof(int));
  char *rhs = NULL;
  const char **starts = NULL;
  size_t *lens = NULL;
  char *arrow = strstr(f, "->");
  if (arrow && strstr(arrow + 2, "->")) {
    fail("%s: formula \"%s\" has more than one \"->\"", fn, formula);
    goto out;
  }
  size_t lhs_len = arrow ? (size_t)(arrow - f) : fl;
  int nops = 1;
  for (size_t i = 0; i < lhs_len; i++) nops += f[i] == ',';
  if (nops != n) {
    fail("%s: formula \"%s\" has %d operand%s but %d tensor%s given", fn, formula, nops, nops == 1 ? "" : "s",
         n, n == 1 ? " was" : "s were");
    goto out;
  }
  bool used[128] = {0};
  for (size_t i = 0; i < fl; i++)
    if (is_letter(f[i])) used[(int)f[i]] = true;
  /* per operand: letters, ellipsis */
  starts = tg_xmalloc(sizeof(const char *) * (size_t)n);
  lens = tg_xmalloc(sizeof(size_t) * (size_t)n);
  {
    size_t st = 0;
    int k = 0;
    for (size_t i = 0; i <= lhs_len; i++)
      if (i == lhs_len || f[i] == ',') starts[k] = f + st, lens[k] = i - st, k++, st = i + 1;
  }
  int max_ell = 0;
  for (int i = 0; i < n; i++) {
    bool he;
    int nl = subscript_letters(fn, starts[i], lens[i], "operand", i, &he);
    if (nl < 0) goto out;
    int nd = us[i]->ndim;
    if (he ? nl > nd : nl != nd) {
      fail("%s: operand %d has %d subscript letter%s%s but its shape %s has %d dimension%s", fn, i, nl,
           nl == 1 ? "" : "s", he ? " and \"...\"" : "", SHP(us[i]), nd, nd == 1 ? "" : "s");
      goto out;
    }
    ell_n[i] = he ? nd - nl : 0;
    if (ell_n[i] > max_ell) max_ell = ell_n[i];
  }
  /* letters for the ellipsis dims: ones the formula does not use */
  char ell[64];
  {
    int k = 0;
    for (int c = 'A'; c <= 'z' && k < max_ell; c++)
      if (is_letter((char)c) && !used[c]) ell[k++] = (char)c;
    if (k < max_ell) {
      fail("%s: \"...\" stands for %d dims but only %d letters are unused", fn, max_ell, k);
      goto out;
    }
  }
  for (int i = 0; i < n; i++) {
    sub[i] = tg_xmalloc(lens[i] + (size_t)max_ell + 1);
    size_t k = 0;
    for (size_t j = 0; j < lens[i]; j++) {
      if (starts[i][j] == '.') {
        for (int e = max_ell - ell_n[i]; e < max_ell; e++) sub[i][k++] = ell[e];
        j += 2;
      } else {
        sub[i][k++] = starts[i][j];
      }
    }
    sub[i][k] = 0;
  }
  /* the output subscript */
  rhs = tg_xmalloc(fl + (size_t)max_ell + 1);
  {
    size_t k = 0;
    if (arrow) {
      bool he;
      const char *r = arrow + 2;
      if (subscript_letters(fn, r, strlen(r), "output", 0, &he) < 0) goto out;
      for (const char *c = r; *c; c++) {
        if (*c == '.') {
          for (int e = 0; e < max_ell; e++) rhs[k++] = ell[e];
          c += 2;
        } else {
          rhs[k++] = *c;
        }
      }
    } else {
      for (int e = 0; e < max_ell; e++) rhs[k++] = ell[e];
      int cnt[128] = {0};
      for (int i = 0; i < n; i++)
        for (char *c = sub[i]; *c; c++) cnt[(int)*c]++;
      for (int c = 'A'; c <= 'z'; c++) {
        bool is_ell = false;
        for (int e = 0; e < max_ell; e++) is_ell = is_ell || ell[e] == c;
        if (is_letter((char)c) && cnt[c] == 1 && !is_ell) rhs[k++] = (char)c;
      }
    }
    rhs[k] = 0;
  }
  {
    bool in_lhs[128] = {0}, seen[128] = {0};
    for (int i = 0; i < n; i++)
      for (char *c = sub[i]; *c; c++) in_lhs[(int)*c] = true;
    for (char *c = rhs; *c; c++) {
      if (!in_lhs[(int)*c]) {
        fail("%s: output letter '%c' of \"%s\" does not appear in any operand", fn, *c, formula);
        goto out;
      }
      if (seen[(int)*c]) {
        fail("%s: output letter '%c' of \"%s\" appears more than once", fn, *c, formula);
        goto out;
      }
      seen[(int)*c] = true;
    }
  }
  /* sizes per letter (equal, or 1 broadcasts); repeated letters within an operand must agree */
  int64_t sz[128];
  for (int c = 0; c < 128; c++) sz[c] = -1;
  for (int i = 0; i < n; i++) {
    for (int j = 0; sub[i][j]; j++) {
      int c = sub[i][j];
      int64_t d = us[i]->shape[j];
      for (int k = 0; k < j; k++)
        if (sub[i][k] == sub[i][j] && us[i]->shape[k] != d) {
          fail("%s: operand %d repeats '%c' on dims of sizes %lld and %lld (shape %s); a repeated letter "
               "takes a "
               "diagonal and needs equal sizes",
               fn, i, (char)c, (long long)us[i]->shape[k], (long long)d, SHP(us[i]));
          goto out;
        }
      if (sz[c] < 0 || sz[c] == 1)
        sz[c] = d;
      else if (d != 1 && d != sz[c]) {
        fail("%s: letter '%c' has size %lld in operand %d but %lld elsewhere (sizes must match or be 1)", fn,
             (char)c, (long long)d, i, (long long)sz[c]);
        goto out;
      }
    }
  }
  char alpha[128];
  int na = 0;
  for (int c = 'A'; c <= 'z'; c++)
    if (sz[c] >= 0) alpha[na++] = (char)c;
  if (na > MAXD) {
    fail("%s: %d distinct letters; at most %d are supported", fn, na, MAXD);
    goto out;
  }
  {
    POp o = begin(fn);
    tg_tensor prod = NONE;
    /* the products' dtype: the operands' promoted one, or dtype= where that keeps them exact */
    tg_dtype pdt = TG_DTYPE_DEFAULT;
    if (dtype != TG_DTYPE_DEFAULT) {
      tg_dtype pro = (tg_dtype)us[0]->dtype;
      for (int i = 1; i < n; i++) pro = tg_dtype_promote(pro, (tg_dtype)us[i]->dtype);
      if (dot_products_dtype(pro, dtype) != pro) pdt = dtype;
    }
    for (int i = 0; i < n; i++) {
      tg_tensor x = same(us[i]);
      int nd = (int)strlen(sub[i]);
      char s[MAXD + 1];
      memcpy(s, sub[i], (size_t)nd + 1);
      /* repeated letters: diagonals (the letter moves to the end) */
      for (;;) {
        int j = -1, k = -1;
        for (int p = 0; p < nd && j < 0; p++)
          for (int q = p + 1; q < nd; q++)
            if (s[p] == s[q]) {
              j = p, k = q;
              break;
            }
        if (j < 0) break;
        char c = s[j];
        x = take_diagonal(x, nd, j, k);
        int m = 0;
        for (int p = 0; p < nd; p++)
          if (p != j && p != k) s[m++] = s[p];
        s[m++] = c, s[m] = 0;
        nd--;
      }
      /* dims in alphabet order, then one dim per alphabet letter (size 1 where absent) */
      int perm[MAXD], m = 0;
      for (int q = 0; q < na; q++)
        for (int p = 0; p < nd; p++)
          if (s[p] == alpha[q]) perm[m++] = p;
      int64_t xs[MAXD], sh[MAXD];
      if (shape_of(x, xs) != nd) { /* a diagonal failed */
        prod = NONE;
        break;
      }
      for (int q = 0; q < na; q++) {
        sh[q] = 1;
        for (int p = 0; p < nd; p++)
          if (s[p] == alpha[q]) sh[q] = xs[p];
      }
      if (nd > 1) x = tg_permute(x, perm, nd);
      x = tg_reshape(x, sh, na);
      /* exact products where dtype= is wider than the operands' promoted dtype (dot_products_dtype,
       * as matmul): every operand widened first */
      if (pdt != TG_DTYPE_DEFAULT) x = tg_cast(x, pdt);
      prod = i == 0 ? x : tg_mul(prod, x);
    }
    int red[MAXD], nr = 0;
    for (int q = 0; q < na; q++)
      if (!strchr(rhs, alpha[q])) red[nr++] = q;
    if (dtype != TG_DTYPE_DEFAULT) prod = tg_cast(prod, dtype);
    tg_tensor r = nr ? tg_sum(prod, red, nr, false) : prod;
    if (dtype != TG_DTYPE_DEFAULT) r = tg_cast(r, dtype);
    /* the kept letters are in alphabet order; permute them into the output's order */
    int nk = (int)strlen(rhs), perm[MAXD];
    for (int k = 0; k < nk; k++) {
      int pos = 0;
      for (int q = 0; q < na && alpha[q] != rhs[k]; q++)
        if (strchr(rhs, alpha[q])) pos++;
      perm[k] = pos;
    }
    if (nk > 1) r = tg_permute(r, perm, nk);
    result = done(o, r);
  }
out:
  for (int i = 0; i < n; i++) free(sub[i]);
  free(sub), free(ell_n), free(rhs), free(f), free(us), free(starts), free(lens);
  return result;
}

tg_tensor tg_einsum(const char *formula, const tg_tensor *ts, int n) {
  return einsum_impl("tg_einsum", formula, ts, n, TG_DTYPE_DEFAULT);
}

tg_tensor tg_einsum_dtype(const char *formula, const tg_tensor *ts, int n, tg_dtype dtype) {
  const char *fn = "tg_einsum_dtype";
  if ((int)dtype < 0 || dtype >= TG_DTYPE_COUNT) return fail("%s: invalid dtype %d", fn, (int)dtype);
  return einsum_impl(fn, formula, ts, n, dtype);
}

/* ---------------------------------------------------------------------------------------------- */
/* interpolate                                                                                     */

tg_tensor tg_interpolate(tg_tensor x, const int64_t *size, int nsize, const tg_interpolate_opts *opts) {
  const char *fn = "tg_interpolate";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  static const tg_interpolate_opts zero;
  if (!opts) opts = &zero;
  tg_interp_mode mode = opts->mode;
  static const char *names[] = {"linear", "nearest", "nearest-exact", "bilinear", "trilinear"};
  if ((int)mode < 0 || mode > TG_INTERP_TRILINEAR) return fail("%s: unknown mode %d", fn, (int)mode);
  if (nsize < 1 || nsize > a->ndim || !size)
    return fail("%s: size has %d entries for input shape %s; give 1..%d (the trailing dims to resize)", fn,
                nsize, SHP(a), a->ndim);
  if ((mode == TG_INTERP_BILINEAR && nsize != 2) || (mode == TG_INTERP_TRILINEAR && nsize != 3))
    return fail("%s: mode %s resizes %d dims but size has %d entries", fn, names[mode],
                mode == TG_INTERP_BILINEAR ? 2 : 3, nsize);
  bool linear = mode == TG_INTERP_LINEAR || mode == TG_INTERP_BILINEAR || mode == TG_INTERP_TRILINEAR;
  if (opts->align_corners && !linear)
    return fail("%s: align_corners can only be set with a linear mode (mode is %s)", fn, names[mode]);
  int n = a->ndim;
  for (int i = 0; i < nsize; i++) {
    int64_t in = a->shape[n - nsize + i];
    if (size[i] < 1 || size[i] > ((int64_t)1 << 31) || in < 1)
      return fail("%s: input size %lld and output size %lld of dim %d must be positive (input shape %s)", fn,
                  (long long)in, (long long)size[i], n - nsize + i, SHP(a));
    if (t_dim_sym(x, n - nsize + i))
      return fail("%s: dim %d of shape %s is symbolic; its sampling positions would be computed from the bound "
                  "value (resize plain dims only)", fn, n - nsize + i, SHP(a));
  }
  POp o = begin(fn);
  tg_tensor r = same(a);
  int64_t expand[MAXD];
  memcpy(expand, a->shape, sizeof(int64_t) * (size_t)n);
  for (int i = n - 1; i >= n - nsize; i--) {
    tg_scope_begin();
    int64_t in = a->shape[i], out = size[i - (n - nsize)], rs[MAXD];
    for (int j = 0; j < n; j++) rs[j] = 1;
    rs[i] = expand[i] = out;
    if (linear) {
      /* source position num/den, clipped to [0, in-1]: align_corners i*(in-1)/(out-1), else (2i+1)*in/(2out)
       * - 1/2 */
      tg_tensor ar = iarange(a, 0, (double)out, 1), num;
      int64_t den;
      if (opts->align_corners) {
        den = out > 1 ? out - 1 : 1;
        num = out > 1 ? tg_mul_s(ar, (double)(in - 1)) : tg_mul_s(ar, 0);
      } else {
        den = 2 * out;
        num = tg_sub_s(tg_mul_s(tg_add_s(tg_mul_s(ar, 2), 1), (double)in), (double)out);
      }
      num = tg_clamp(num, 0, (double)((in - 1) * den));
      tg_tensor dd = tg_const_like(num, (double)den);
      tg_tensor lo1 = tg_idiv(num, dd), hi1 = tg_idiv(tg_add_s(num, (double)(den - 1)), dd);
      tg_tensor perc = tg_div_s(tg_cast(tg_mod(num, dd), TG_FLOAT32), (double)den);
      /* along the last dim the gathers cannot vectorize (each lane reads its own source column),
       * so the per-column source positions and weights are stored once as small tables: a load
       * each, not the division and clamps for every element (16x32x56->112: 3.8 -> 2.6 ms). The
       * other dims keep them as arithmetic, which proves the gather in range (schedule.c) so
       * their pass vectorizes along the rows. */
      if (i == n - 1) lo1 = tg_contiguous(lo1), hi1 = tg_contiguous(hi1), perc = tg_contiguous(perc);
      tg_tensor low = tg_expand(tg_reshape(lo1, rs, n), expand, n);
      tg_tensor high = tg_expand(tg_reshape(hi1, rs, n), expand, n);
      perc = tg_expand(tg_reshape(perc, rs, n), expand, n);
      r = tg_lerp(tg_gather(r, i, low), tg_gather(r, i, high), perc);
    } else {
      /* torch's nearest index in float32: floor(scale * i) or floor(scale * (i + 0.5)), at most in-1 */
      tg_opts fo = on_device(a, TG_FLOAT32);
      tg_tensor ar = tg_arange(0, (double)out, 1, &fo);
      if (mode == TG_INTERP_NEAREST_EXACT) ar = tg_add_s(ar, 0.5);
      float scale = (float)in / (float)out;
      tg_tensor idx = tg_cast(tg_mul_s(ar, (double)scale), TG_INT32);
      idx = tg_minimum_s(idx, (double)(in - 1));
      if (i == n - 1) idx = tg_contiguous(idx); /* a table, as for the linear modes (2.8 -> 2.1 ms) */
      r = tg_gather(r, i, tg_expand(tg_reshape(idx, rs, n), expand, n));
    }
    r = tg_keep(r);
    tg_scope_end();
  }
  return done(o, tg_cast(r, (tg_dtype)a->dtype));
}

/* ---------------------------------------------------------------------------------------------- */
/* sort, argsort, topk                                                                             */

/* Bitonic sort, descending, of y (B, N) along N = 2^S. The merge of runs of 2^s into runs of 2^(s+1)
 * (s = 0..S-1) makes comparator stages at distances 2^b, b = s..0: element i meets i ^ 2^b, and the
 * pair keeps its order descending when bit s+1 of i is 0 (always in the last merge), ascending when
 * it is 1, so every run of 2^(s+1) that the next merge reads is bitonic. A stage is one elementwise
 * kernel over a view of y whose dims are bit fields of the position: the partner is the same view
 * flipped on the pair's dim, and the direction is a dim of its own, so every load is a strided
 * (affine) read (tinygrad instead reverses every other run between merges; those reversals fused
 * into the next stage as two loads behind a select of non-affine indices: 2 ms of sort_64k's 30 per
 * merge). */
#define SORT_T 16 /* the rows of the transposed layout (the small distances run across its columns) */

/* u ranks strictly above v: u > v, or u is NaN and v is not (the other way round when nan_small) */
static tg_tensor ranks_above(tg_tensor u, tg_tensor v, bool nan_small) {
  tg_tensor g = tg_gt(u, v);
  if (!tg_dtype_is_float(tg_dtype_of(u))) return g;
  tg_tensor nu = tg_isnan(u), nv = tg_isnan(v);
  return tg_bitwise_or(g, nan_small ? tg_bitwise_and(nv, tg_logical_not(nu))
                                    : tg_bitwise_and(nu, tg_logical_not(nv)));
}

/* One comparator stage on a layout whose dims, outermost first, are the bit fields of the position
 * listed in f (nf fields of widths w[]: the total is the layout's numel); pair and dir are the field
 * indices of the pair's bit and the direction's bit (dir -1: all descending). */
static tg_tensor bitonic_stage(UOp *a, tg_tensor y, const int64_t *lay, int nl, const int64_t *v, int nv,
                               int pair, int dir, bool nan_small, bool store) {
  tg_tensor yv = tg_reshape(y, v, nv);
  const int fp[1] = {pair};
  tg_tensor p = tg_flip(yv, fp, 1);
  int64_t ms[MAXD];
  for (int i = 0; i < nv; i++) ms[i] = 1;
  ms[pair] = 2;
  tg_tensor two = iarange(a, 0, 2, 1);
  tg_tensor keepmax = tg_reshape(tg_eq_s(two, 0), ms, nv); /* the first of a pair keeps the max */
  if (dir >= 0) {
    ms[pair] = 1, ms[dir] = 2;
    keepmax = tg_ne(keepmax, tg_reshape(tg_eq_s(two, 1), ms, nv)); /* ascending runs: the min */
  }
  /* the pair swaps where its second element ranks strictly above its first (descending) or below
   * it (ascending): both elements decide alike, so values are exchanged, never duplicated (a -0.0
   * tied with a 0.0, or a NaN, which ranks above everything, or below when nan_small) */
  tg_tensor sw = tg_where(keepmax, ranks_above(p, yv, nan_small), ranks_above(yv, p, nan_small));
  tg_tensor z = tg_where(sw, p, yv);
  /* stored in the view's shape, the kernel keeps a loop per bit field (the index math of a pair
   * stays outside the inner loop) instead of one loop over the layout taking every field apart */
  if (store) z = contiguous2(z);
  return tg_reshape(z, lay, nl);
}

/* A layout of the N = 2^S positions of a row: bit fields of widths w[0..nf-1], lowest bits first;
 * field 0 is the outermost dim in memory (the plain layout is the single field S). */
typedef struct {
  int nf, w[3];
} SortLayout;

/* y (B, N) in the plain layout -> lay's (B, 2^w[0], ...), or back (to_plain); views only */
static tg_tensor sort_relayout(tg_tensor y, int64_t B, int64_t N, const SortLayout *lay, bool to_plain) {
  int64_t hi[4] = {B};
  int perm[4] = {0};
  for (int f = 0; f < lay->nf; f++) hi[lay->nf - f] = (int64_t)1 << lay->w[f], perm[1 + f] = lay->nf - f;
  if (to_plain) return tg_reshape(tg_permute(y, perm, 1 + lay->nf), (const int64_t[]){B, N}, 2);
  return tg_permute(tg_reshape(y, hi, 1 + lay->nf), perm, 1 + lay->nf);
}

static tg_tensor bitonic_desc(UOp *a, tg_tensor y, int64_t B, int64_t N, int S, bool nan_small) {
  /* From N = 256 on, the stages at distances below SORT_T run on a transposed layout (rows: the low
   * 4 bits; columns: the rest): a pair is two rows and the stage runs in vector lanes along the
   * columns instead of as scalar code (sort_64k: 46 of 136 kernels took 9 of its 10 ms). Its lanes
   * are the columns' low 3 bits; a merge whose direction bit is one of them (bits 4..6) would be
   * scalar code again, so up to that merge (N >= 1024) the columns are split once more and bits
   * 7..9 are the lanes. */
  bool tr = N >= SORT_T * SORT_T;
  const SortLayout plain = {1, {S}}, t1 = {2, {4, S - 4}}, t2 = {3, {4, 3, S - 7}};
  const SortLayout *cur = &plain;
  int64_t ls[4];
  for (int s = 0; s < S; s++) {
    tg_scope_begin();
    bool last_merge = s == S - 1;
    int d = last_merge ? -1 : s + 1; /* the direction bit */
    const SortLayout *small = S >= 10 && s <= 5 ? &t2 : &t1;
    for (int b = s; b >= 0; b--) {
      const SortLayout *want = tr && b < 4 ? small : &plain;
      if (want != cur) {
        /* change layouts: into a transposed one, the stage reads through the transpose (its lanes
         * gather at a stride of SORT_T); back, a transposing copy first (fused, the stage gathers
         * at a stride of N/SORT_T: 2x slower than the copy and the stage apart) */
        if (cur != &plain) y = contiguous2(sort_relayout(y, B, N, cur, true));
        if (want != &plain) y = sort_relayout(y, B, N, want, false);
        cur = want;
      }
      /* the view: every field split at the pair's bit b and the direction bit d, high bits first */
      int64_t v[12];
      int nv = 0, pair = -1, dir = -1, lo = 0;
      v[nv++] = B, ls[0] = B;
      for (int f = 0; f < cur->nf; f++) {
        int top = lo + cur->w[f]; /* the field's bits are lo..top-1 */
        ls[1 + f] = (int64_t)1 << cur->w[f];
        int cut[2], nc = 0;
        if (d >= lo && d < top) cut[nc++] = d;
        if (b >= lo && b < top) cut[nc++] = b; /* (d > b) */
        int at = top;
        for (int c = 0; c < nc; c++) {
          v[nv++] = (int64_t)1 << (at - cut[c] - 1);
          if (cut[c] == d)
            dir = nv;
          else
            pair = nv;
          v[nv++] = 2, at = cut[c];
        }
        v[nv++] = (int64_t)1 << (at - lo);
        lo = top;
      }
      /* every comparator stage is stored but a last one on the plain layout, which fuses into its
       * consumers (on a transposed layout it runs in vector lanes first: fused into the
       * transposing read it is scalar code, 10x slower) */
      y = bitonic_stage(a, y, ls, 1 + cur->nf, v, nv, pair, dir, nan_small,
                        !(last_merge && b == 0) || cur != &plain);
    }
    y = tg_keep(y);
    tg_scope_end();
  }
  if (cur != &plain) y = sort_relayout(y, B, N, cur, true);
  return y;
}

/* x == y, where a NaN equals a NaN */
static tg_tensor same_value(tg_tensor x, tg_tensor y) {
  tg_tensor e = tg_eq(x, y);
  if (!tg_dtype_is_float(tg_dtype_of(x))) return e;
  return tg_bitwise_or(e, tg_bitwise_and(tg_isnan(x), tg_isnan(y)));
}

/* Sorted values and stable int32 indices of x along ax (ndim >= 1, size n >= 2, non-empty). The indices
 * are tinygrad's: the k-th occurrence of a value in the sorted order is the k-th occurrence in the input
 * (counts of equal elements at or before each position, compared between the two). */
static void sort_(UOp *a, tg_tensor x, int ax, bool descending, bool want_idx, tg_tensor *values,
                  tg_tensor *indices) {
  int nd = a->ndim;
  int64_t n = a->shape[ax], B = shape_numel(a->shape, nd) / n, ts[MAXD];
  /* the indices come from comparing x with the sorted values: x must read the same bits in every
   * kernel (g_stable stores a lazy x that could round differently) */
  tg_tensor xt = tg_transpose(want_idx ? t_wrap(g_stable(a)) : x, ax, -1);
  if (shape_of(xt, ts) != nd) {
    *values = *indices = NONE;
    return;
  }
  tg_dtype dt = (tg_dtype)a->dtype;
  tg_tensor w = dt == TG_BOOL ? tg_cast(xt, TG_UINT8) : xt;
  /* ascending = the inverse of a descending sort of the inverse, so padding is always the dtype's min;
   * a float NaN stays NaN under the inverse, so there NaN ranks lowest (torch puts it last
   * ascending, first descending) and the padding is NaN */
  if (!descending) w = inverse(w);
  bool nan_small = !descending && tg_dtype_is_float(dt);
  int S = 0;
  while (((int64_t)1 << S) < n) S++;
  int64_t N = (int64_t)1 << S;
  w = pad_last(tg_reshape(w, (const int64_t[]){B, n}, 2), 2, 0, N - n,
               nan_small ? NAN : dtype_min(tg_dtype_of(w)));
  tg_tensor y = bitonic_desc(a, w, B, N, S, nan_small);
  y = tg_reshape(shrink_last(y, (const int64_t[]){B, N}, 2, 0, n), ts, nd);
  if (!descending) y = inverse(y);
  if (dt == TG_BOOL) y = tg_cast(y, TG_BOOL);
  *values = tg_transpose(y, ax, -1);
  *indices = NONE;
  if (!want_idx) return;
  tg_tensor low = tri_mask(a, ax, true);
  const int last[1] = {-1}, second[1] = {-2};
  /* count[i] = #{j <= i : t[j] == t[i]} (NaNs equal to each other) */
  tg_tensor co =
      tg_sum(tg_bitwise_and(low, same_value(tg_unsqueeze(xt, -1), tg_unsqueeze(xt, -2))), last, 1, false);
  tg_tensor cs =
      tg_sum(tg_bitwise_and(low, same_value(tg_unsqueeze(y, -1), tg_unsqueeze(y, -2))), last, 1, false);
  /* [i, p]: input i is the sorted element p */
  tg_tensor cond = tg_bitwise_and(same_value(tg_unsqueeze(xt, -1), tg_unsqueeze(y, -2)),
                                  tg_eq(tg_unsqueeze(co, -1), tg_unsqueeze(cs, -2)));
  tg_tensor pos = tg_unsqueeze(iarange(a, 0, (double)n, 1), -1);
  tg_tensor idx = tg_sum(tg_where(cond, pos, tg_const_like(pos, 0)), second, 1, false);
  *indices = tg_transpose(tg_cast(idx, TG_INT32), ax, -1);
}

/* want_idx: the int32 indices are asked for, so the dim may have at most 2^31 - 1 elements */
static UOp *sort_args(const char *fn, tg_tensor x, int dim, bool want_idx, int *ax) {
  UOp *a = t_get(x, fn);
  if (!a) return NULL;
  if (norm_axis(fn, dim, a->ndim, ax) < 0) return NULL;
  if (a->ndim > MAXD - 4) {
    fail("%s: shape %s has more than %d dimensions", fn, SHP(a), MAXD - 4);
    return NULL;
  }
  if (want_idx && a->ndim && a->shape[*ax] > INT32_MAX) {
    fail("%s: dim %d of shape %s has %lld elements, more than its int32 indices can number (at most "
         "2147483647); split the dim (tg_reshape) and work on the parts",
         fn, dim, SHP(a), (long long)a->shape[*ax]);
    return NULL;
  }
  return a;
}

/* sort with trivial cases handled; results in the current scope */
static void sort_any(UOp *a, tg_tensor x, int ax, bool descending, bool want_idx, tg_tensor *v,
                     tg_tensor *i) {
  int64_t n = a->ndim ? a->shape[ax] : 1;
  if (n <= 1 || shape_numel(a->shape, a->ndim) == 0) {
    *v = same(a);
    tg_opts op = on_device(a, TG_INT32);
    *i = tg_zeros(a->shape, a->ndim, &op);
    return;
  }
  sort_(a, x, ax, descending, want_idx, v, i);
}

tg_status tg_sort(tg_tensor x, int dim, bool descending, tg_tensor *values, tg_tensor *indices) {
  const char *fn = "tg_sort";
  tg_tensor *outs[2] = {values, indices};
  int ax;
  if (!values && !indices) return tg_set_error(TG_ERR_INVALID, "%s: values and indices are both NULL", fn);
  UOp *a = sort_args(fn, x, dim, indices != NULL, &ax);
  if (!a) return st_fail(outs, 2);
  POp o = begin(fn);
  tg_tensor r[2];
  sort_any(a, x, ax, descending, indices != NULL, &r[0], &r[1]);
  return done_n(o, outs, r, 2);
}

tg_tensor tg_argsort(tg_tensor x, int dim, bool descending) {
  const char *fn = "tg_argsort";
  int ax;
  UOp *a = sort_args(fn, x, dim, true, &ax);
  if (!a) return NONE;
  POp o = begin(fn);
  tg_tensor v, i;
  sort_any(a, x, ax, descending, true, &v, &i);
  return done(o, i);
}

/* select_keys (below) with one reduction a round: where w's values map to int32 in their order (float32 by
 * its bits, -0 made +0 first so that it ties with +0; integers of at most 32 bits as they are) and
 * keys lie in [-2^30, 2^30], one int64 per element holds that int32 in its high half and 2^31 - key
 * in its low half, so int64 order is the selection's order (value descending, then key ascending)
 * and a round is the largest packed value below the last one taken. The key comes back from the
 * low half. Rounds read 8 bytes an element, as the two-reduction form reads w and key. */
static tg_tensor select_keys_packed(tg_tensor w, tg_tensor key, int64_t k) {
  const int last[1] = {-1};
  tg_dtype kt = tg_dtype_of(key);
  tg_opts lo = *TG_OPTS(.dtype = TG_INT64);
  tg_tensor o;
  if (tg_dtype_of(w) == TG_FLOAT32) {
    tg_tensor b = tg_bitcast(tg_where(tg_eq_s(w, 0), tg_zeros_like(w, NULL), w), TG_INT32);
    o = tg_where(tg_lt_s(b, 0), tg_bitwise_xor(b, tg_full_like(b, 0x7fffffff, NULL)), b);
  } else {
    o = tg_cast(w, TG_INT32);
  }
  tg_tensor hi = tg_mul(tg_cast(o, TG_INT64), tg_full_like(o, 4294967296.0, &lo));
  tg_tensor packed = tg_contiguous(tg_add(hi, tg_sub(tg_full_like(key, 2147483648.0, &lo), tg_cast(key, TG_INT64))));
  tg_tensor low = tg_full_like(packed, -9223372036854775808.0, NULL), m = NONE;
  tg_tensor *out = tg_xmalloc(sizeof(tg_tensor) * (size_t)k);
  for (int64_t j = 0; j < k; j++) {
    tg_tensor mw = j ? tg_where(tg_lt(packed, m), packed, low) : packed;
    m = out[j] = tg_contiguous(tg_max(mw, last, 1, true));
  }
  tg_tensor r = tg_cat(out, (int)k, -1);
  free(out);
  tg_tensor kl = tg_bitwise_and(r, tg_full_like(r, 4294967295.0, NULL));
  return tg_contiguous(tg_cast(tg_sub(tg_full_like(kl, 2147483648.0, NULL), kl), kt));
}

/* the dtypes whose values select_keys_packed maps to int32 in their order */
static bool packs(tg_dtype dt) {
  return dt == TG_FLOAT32 || dt == TG_INT32 || dt == TG_INT16 || dt == TG_INT8 || dt == TG_UINT16 || dt == TG_UINT8;
}

/* The top k of w along its last dim (m entries, k <= m, no NaN) by k rounds of selection: round j
 * takes the largest value not yet taken and, among equal ones, the smallest key (keys are distinct
 * within a row and below none_key). The taken set is always the top j of the order (value
 * descending, key ascending), so "not taken" is "ranks below the last one taken": a round reads w,
 * key and the previous round's (value, key) -- a few compares that fuse into both of its
 * reductions -- and stores nothing of w's size. Returns the (..., k) keys, in order. */
static tg_tensor select_keys(tg_tensor w, tg_tensor key, int64_t k, double none_key) {
  /* float32 rows with float32 keys take two reductions a round, both in vector lanes: cheaper than
   * one over packed int64 elements, which stay scalar (topk10 of 1024x1024: 3.5 -> 2.4 ms) */
  bool lanes = tg_dtype_of(w) == TG_FLOAT32 && tg_dtype_of(key) == TG_FLOAT32;
  if (!lanes && packs(tg_dtype_of(w)) && none_key <= (double)(1 << 30)) return select_keys_packed(w, key, k);
  const int last[1] = {-1};
  tg_tensor low = tg_full_like(w, dtype_min(tg_dtype_of(w)), NULL), none = tg_full_like(key, none_key, NULL);
  tg_tensor m = NONE, ps = NONE;
  tg_tensor *out = tg_xmalloc(sizeof(tg_tensor) * (size_t)k);
  for (int64_t j = 0; j < k; j++) {
    tg_tensor left = NONE, mw = w;
    if (j) {
      left = tg_bitwise_or(tg_lt(w, m), tg_bitwise_and(tg_eq(w, m), tg_gt(key, ps)));
      mw = tg_where(left, w, low);
    }
    m = tg_contiguous(tg_max(mw, last, 1, true));
    tg_tensor hit = j ? tg_bitwise_and(tg_eq(w, m), left) : tg_eq(w, m);
    ps = out[j] = tg_contiguous(tg_min(tg_where(hit, key, none), last, 1, true));
  }
  /* stored: read by several kernels, a cat of k pieces costs k loads an element */
  tg_tensor r = tg_contiguous(tg_cat(out, (int)k, -1));
  free(out);
  return r;
}

/* The top k along ax by selection (select_keys): O(k n) per row, where the bitonic sort makes
 * log2(n)^2 / 2 passes and recovers its indices in O(n^2) per row. The same order as the sort's
 * first k (descending, ties to the earliest position), NaN counting as the largest (taken last when
 * largest is false). Values are gathered at the indices, so the gradient goes to exactly the chosen
 * positions. A NaN becomes +inf (-inf when largest is false) with its key moved by -n (+n) from its
 * position, so it wins (loses) the tie with a genuine infinity and the rounds compare no NaN.
 * Long rows are cut first into chunks of TOPK_C: the top k of a row lie in the k chunks whose best
 * elements rank highest (any other chunk's best has k better elements above it), so one pass takes
 * each chunk's maximum, a selection picks k chunks from those, and the final selection runs on
 * their k * TOPK_C elements: only the first pass reads the whole row (topk 10 of 1024x1024: 30
 * kernels over 4 MB each -> 1 over 4 MB and 40 over 0.3-0.5 MB). */
#define TOPK_C 8
static void topk_select(UOp *a, int ax, int64_t k, bool largest, tg_tensor *v, tg_tensor *i) {
  int64_t n = a->shape[ax];
  tg_dtype dt = (tg_dtype)a->dtype;
  bool fl = tg_dtype_is_float(dt);
  /* every round compares values with their maximum: a lazy x that could round differently in
   * another kernel (a vectorized exp in one, libm's in another) is stored once (g_stable) */
  tg_tensor xt = tg_transpose(t_wrap(g_stable(a)), ax, -1);
  tg_tensor w = dt == TG_BOOL ? tg_cast(xt, TG_UINT8) : xt;
  if (!largest) w = inverse(w);
  /* keys as float32 for float32 rows (exact: |key| < 2n <= 2^24), so each round's reductions
   * vectorize */
  tg_dtype pt = dt == TG_FLOAT32 && n < ((int64_t)1 << 23) ? TG_FLOAT32 : TG_INT32;
  tg_opts po = on_device(a, pt), io = on_device(a, TG_INT32);
  tg_tensor pos = tg_arange(0, (double)n, 1, &po), key = pos, isn = NONE;
  if (fl) {
    isn = tg_isnan(xt);
    w = tg_where(isn, tg_full_like(w, largest ? INFINITY : -INFINITY, NULL), w);
    key = tg_add(pos, tg_where(isn, tg_full_like(pos, largest ? (double)-n : (double)n, NULL),
                               tg_zeros_like(pos, NULL)));
  }
  const int last[1] = {-1};
  int64_t ws[MAXD];
  int nd = shape_of(w, ws);
  tg_tensor keys;
  if (n % TOPK_C == 0 && 4 * k * TOPK_C <= n) {
    int64_t nc = n / TOPK_C, cs[MAXD + 1], ks[MAXD];
    memcpy(cs, ws, sizeof(int64_t) * (size_t)nd);
    memcpy(ks, ws, sizeof(int64_t) * (size_t)nd);
    cs[nd - 1] = nc, cs[nd] = TOPK_C, ks[nd - 1] = k * TOPK_C;
    tg_tensor cidx = tg_arange(0, (double)nc, 1, &po), cm, ck, chunk;
    if (fl && largest) { /* a chunk with a NaN ranks first (its maximum is NaN), earlier chunks first */
      tg_tensor mx = tg_max(tg_reshape(xt, cs, nd + 1), last, 1, false), has = tg_isnan(mx);
      cm = tg_where(has, tg_full_like(mx, INFINITY, NULL), mx);
      ck = tg_sub(cidx, tg_where(has, tg_full_like(mx, (double)nc, &po), tg_zeros_like(mx, &po)));
    } else if (fl) { /* a chunk ranks by its best element's key (a genuine -inf before a NaN) */
      tg_tensor cw = tg_reshape(w, cs, nd + 1);
      cm = tg_max(cw, last, 1, false);
      ck = tg_min(tg_where(tg_eq(cw, tg_unsqueeze(cm, -1)), tg_reshape(key, cs, nd + 1),
                           tg_full_like(cw, (double)(2 * n), &po)),
                  last, 1, false);
    } else {
      cm = tg_contiguous(tg_max(tg_reshape(w, cs, nd + 1), last, 1, false)), ck = cidx;
    }
    /* stored: computed in each round's kernels, the masks would cost more than a load */
    if (fl) cm = tg_contiguous(cm), ck = tg_contiguous(ck);
    tg_tensor ckeys = select_keys(cm, ck, k, (double)(2 * n));
    if (fl && largest)
      chunk = tg_where(tg_lt_s(ckeys, 0), tg_add_s(ckeys, (double)nc), ckeys);
    else if (fl)
      chunk = tg_where(tg_lt_s(ckeys, (double)n), ckeys, tg_sub_s(ckeys, (double)n));
    else
      chunk = ckeys;
    chunk = tg_cast(chunk, TG_INT32);
    if (fl && !largest) chunk = tg_idiv(chunk, tg_full_like(chunk, TOPK_C, NULL));
    /* the candidates: the k chunks' positions, values and keys */
    tg_tensor cpos = tg_add(tg_mul_s(tg_unsqueeze(chunk, -1), TOPK_C), tg_arange(0, TOPK_C, 1, &io));
    cpos = tg_contiguous(tg_reshape(cpos, ks, nd));
    /* one gather of x: the candidates' values and keys are computed from it as w and key are */
    tg_tensor cx = tg_gather(xt, -1, cpos), cw = dt == TG_BOOL ? tg_cast(cx, TG_UINT8) : cx,
              ckey = tg_cast(cpos, pt);
    if (!largest) cw = inverse(cw);
    if (fl) {
      tg_tensor cn = tg_isnan(cx);
      cw = tg_where(cn, tg_full_like(cw, largest ? INFINITY : -INFINITY, NULL), cw);
      ckey = tg_add(ckey, tg_where(cn, tg_full_like(ckey, largest ? (double)-n : (double)n, NULL),
                                   tg_zeros_like(ckey, NULL)));
    }
    keys = select_keys(fl ? tg_contiguous(cw) : cw, fl ? tg_contiguous(ckey) : ckey, k, (double)(2 * n));
  } else {
    if (fl) w = tg_contiguous(w), key = tg_contiguous(tg_expand(key, ws, nd));
    keys = select_keys(w, key, k, (double)(2 * n));
  }
  if (fl)
    keys = tg_where(tg_lt_s(keys, 0), tg_add_s(keys, (double)n),
                    tg_where(tg_lt_s(keys, (double)n), keys, tg_sub_s(keys, (double)n)));
  tg_tensor idx = tg_cast(keys, TG_INT32);
  *v = tg_transpose(tg_gather(xt, -1, idx), ax, -1);
  *i = tg_transpose(idx, ax, -1);
}

tg_status tg_topk(tg_tensor x, int64_t k, int dim, bool largest, bool sorted, tg_tensor *values,
                  tg_tensor *indices) {
  const char *fn = "tg_topk";
  (void)sorted; /* the result is always sorted, which every value of `sorted` allows */
  tg_tensor *outs[2] = {values, indices};
  int ax;
  if (!values && !indices) return tg_set_error(TG_ERR_INVALID, "%s: values and indices are both NULL", fn);
  UOp *a = sort_args(fn, x, dim, true, &ax); /* the values are gathered at the indices */
  if (!a) return st_fail(outs, 2);
  int64_t n = a->ndim ? a->shape[ax] : 1;
  if (k < 0 || k > n) {
    fail("%s: k = %lld is out of range for dim %d of shape %s (0..%lld)", fn, (long long)k, dim, SHP(a),
         (long long)n);
    return st_fail(outs, 2);
  }
  POp o = begin(fn);
  tg_tensor r[2];
  if (a->ndim > 0 && k >= 1 && k <= 64 && k < n && shape_numel(a->shape, a->ndim) > 0) {
    topk_select(a, ax, k, largest, &r[0], &r[1]);
    return done_n(o, outs, r, 2);
  }
  sort_any(a, x, ax, largest, indices != NULL, &r[0], &r[1]);
  if (a->ndim > 0) {
    int64_t b[2 * MAXD];
    for (int j = 0; j < a->ndim; j++) b[2 * j] = 0, b[2 * j + 1] = j == ax ? k : a->shape[j];
    for (int j = 0; j < 2; j++)
      if (tg_valid(r[j])) r[j] = tg_shrink(r[j], b, 2 * a->ndim);
  }
  return done_n(o, outs, r, 2);
}

/* ---------------------------------------------------------------------------------------------- */
/* multinomial                                                                                     */

tg_tensor tg_multinomial(tg_tensor probs, int64_t num_samples, bool replacement) {
  const char *fn = "tg_multinomial";
  UOp *a = t_get(probs, fn);
  if (!a) return NONE;
  if (a->ndim < 1 || a->ndim > 2)
    return fail("%s: probs must be 1-d (K,) or 2-d (B, K), got shape %s", fn, SHP(a));
  if (a->dtype == TG_BOOL) return fail("%s: probs has dtype bool; give numeric weights", fn);
  int64_t K = a->shape[a->ndim - 1], B = a->ndim == 2 ? a->shape[0] : 1;
  if (num_samples < 1 || num_samples > ((int64_t)1 << 31))
    return fail("%s: num_samples must be positive, got %lld", fn, (long long)num_samples);
  if (K < 1) return fail("%s: probs has no categories (shape %s)", fn, SHP(a));
  if (!replacement && num_samples > K)
    return fail("%s: cannot draw %lld samples without replacement from %lld categories", fn,
                (long long)num_samples, (long long)K);
  POp o = begin(fn);
  tg_tensor w = a->ndim == 1 ? tg_unsqueeze(probs, 0) : same(a), idx;
  tg_opts fo = on_device(a, TG_FLOAT32);
  if (replacement || num_samples == 1) {
    tg_tensor cw = tg_float(tg_cumsum(w, 1));
    tg_tensor total = shrink_last(cw, (const int64_t[]){B, K}, 2, K - 1, K);
    tg_tensor cdf = tg_div(cw, total);
    tg_tensor u = tg_rand((const int64_t[]){num_samples, B, 1}, 3, &fo);
    idx = tg_permute(tg_sum(tg_ge(u, cdf), (const int[]){2}, 1, false), (const int[]){1, 0}, 2);
  } else {
    /* Efraimidis-Spirakis: the largest keys log2(u) / w */
    tg_tensor u = tg_rand_like(tg_float(w), &fo);
    tg_tensor keys = tg_div(tg_log2(u), tg_float(w));
    tg_tensor v;
    if (tg_topk(keys, num_samples, 1, true, true, &v, &idx) != TG_OK) idx = NONE;
  }
  if (a->ndim == 1) idx = tg_squeeze(idx, 0);
  return done(o, tg_cast(idx, TG_INT32));
}

/* ---------------------------------------------------------------------------------------------- */
/* QR and SVD                                                                                      */

static UOp *linalg_args(const char *fn, tg_tensor x) {
  UOp *a = t_get(x, fn);
  if (!a) return NULL;
  if (a->ndim < 2 || a->ndim > MAXD - 4) {
    fail("%s: expected a matrix or a batch of matrices (..., m, n), got shape %s", fn, SHP(a));
    return NULL;
  }
  return a;
}

/* The dtype of the results: the input's if it is a float, else the default float. */
static tg_dtype linalg_dtype(UOp *a) {
  return tg_dtype_is_float((tg_dtype)a->dtype) ? (tg_dtype)a->dtype : tg_default_float();
}
/* The dtype the decomposition runs in: float32 for the 1-byte floats (fp8), whose 2-3 mantissa bits
 * cannot carry a Householder reflection or a Jacobi rotation (tinygrad runs them in fp8 and its
 * singular values come out tens of percent off); the results are cast back to the fp8 dtype. */
static tg_dtype linalg_compute_dtype(tg_dtype dt) { return tg_dtype_itemsize(dt) < 2 ? TG_FLOAT32 : dt; }

/* eye(m) expanded to batch + (m, m) */
static tg_tensor beye(UOp *a, int64_t m, tg_dtype dt, const int64_t *batch, int nb) {
  tg_opts op = on_device(a, dt);
  int64_t sh[MAXD];
  memcpy(sh, batch, sizeof(int64_t) * (size_t)nb);
  sh[nb] = m, sh[nb + 1] = m;
  tg_tensor e = tg_eye(m, m, &op);
  return nb ? tg_expand(e, sh, nb + 2) : e;
}

/* tinygrad's Householder QR of x (float, ..., m, n): complete Q (m x m) and R (m x n). */
static void qr_(UOp *a, tg_tensor x, tg_tensor *qo, tg_tensor *ro) {
  int nd = tg_ndim(x), nb = nd - 2;
  int64_t xs[MAXD];
  if (nd < 2 || shape_of(x, xs) != nd) {
    *qo = *ro = NONE;
    return;
  }
  int64_t m = xs[nd - 2], n = xs[nd - 1];
  tg_dtype dt = tg_dtype_of(x);
  tg_tensor R = x, Q = beye(a, m, dt, xs, nb);
  tg_tensor idx = iarange(a, 0, (double)m, 1);
  const int last[1] = {-1};
  /* once a step fails (R or Q none) the rest is none too: stop rather than build min(m, n) nones */
  for (int64_t i = 0; i < (m < n ? m : n) && tg_valid(R) && tg_valid(Q); i++) {
    tg_scope_begin();
    tg_tensor at_i = tg_eq_s(idx, (double)i), below = tg_ge(idx, tg_const_like(idx, (double)i));
    int64_t b[2 * MAXD];
    for (int j = 0; j < nd; j++) b[2 * j] = 0, b[2 * j + 1] = xs[j];
    b[2 * (nd - 1)] = i, b[2 * (nd - 1) + 1] = i + 1;
    tg_tensor col = tg_squeeze(tg_shrink(R, b, 2 * nd), -1); /* R[..., :, i] */
    tg_tensor zero = tg_const_like(col, 0);
    tg_tensor xv = tg_where(below, col, zero);
    tg_tensor norm = tg_sqrt(tg_sum(tg_square(xv), last, 1, true));
    tg_tensor x0 = tg_sum(tg_where(at_i, xv, zero), last, 1, true);
    tg_tensor sgn = tg_where(tg_ne_s(x0, 0), tg_sign(x0), tg_const_like(x0, 1));
    tg_tensor active = tg_ne_s(norm, 0);
    tg_tensor u0 = tg_add(x0, tg_mul(sgn, norm));
    tg_tensor one = tg_const_like(u0, 1);
    tg_tensor v = tg_unsqueeze(tg_div(tg_where(at_i, u0, xv), tg_where(active, u0, one)), -1);
    tg_tensor tau =
        tg_where(active, tg_div(tg_mul(sgn, u0), tg_where(active, norm, one)), tg_const_like(u0, 0));
    tg_tensor w = tg_mul(tg_unsqueeze(tau, -1), v);
    R = tg_sub(R, tg_matmul(w, tg_matmul(tg_transpose(v, -2, -1), R)));
    Q = tg_sub(Q, tg_matmul(tg_matmul(Q, v), tg_transpose(w, -2, -1)));
    /* materialize once per reflection: the next one reads R and Q several times */
    R = tg_keep(contiguous2(R)), Q = tg_keep(contiguous2(Q));
    tg_scope_end();
  }
  *qo = Q, *ro = R;
}

tg_status tg_qr(tg_tensor x, tg_tensor *q, tg_tensor *r) {
  const char *fn = "tg_qr";
  tg_tensor *outs[2] = {q, r};
  if (!q || !r) {
    clear_outs(outs, 2);
    return tg_set_error(TG_ERR_INVALID, "%s: q and r must not be NULL", fn);
  }
  UOp *a = linalg_args(fn, x);
  if (!a) return st_fail(outs, 2);
  POp o = begin(fn);
  tg_dtype dt = linalg_dtype(a), cdt = linalg_compute_dtype(dt);
  tg_tensor res[2];
  qr_(a, tg_cast(x, cdt), &res[0], &res[1]);
  for (int i = 0; i < 2; i++) res[i] = tg_cast(res[i], dt);
  return done_n(o, outs, res, 2);
}

/* One-sided Jacobi on the num x num matrix U (batched), tinygrad's svd: each round rotates num/2
 * disjoint column pairs at once. The round-robin pairing (identity on the first half, reversed on the
 * second, then rotated) depends only on num, so it is computed here and uploaded as the selector P
 * with P[a][b] = (a == perm[b]): every round is then the same kernels with a different small input. */
static void jacobi_(UOp *a, tg_tensor *U, tg_tensor *V, int64_t num, const int64_t *batch, int nb) {
  int64_t h = num / 2;
  /* U or V is none when a step before failed: nothing to rotate (the error is already recorded, and
   * tg_dtype_of(none) says nothing about the width of the selector built below) */
  if (h == 0 || !tg_valid(*U) || !tg_valid(*V)) return;
  tg_dtype dt = tg_dtype_of(*U);
  /* the selector is uploaded as float64 or float32 (0 and 1 are exact in every float) and cast to dt:
   * no per-dtype encoding here to get wrong for a dtype added later */
  tg_dtype pdt = dt == TG_FLOAT64 ? TG_FLOAT64 : TG_FLOAT32;
  tg_opts fo = on_device(a, pdt);
  int64_t *perm = tg_xmalloc(sizeof(int64_t) * (size_t)num), *tmp = tg_xmalloc(sizeof(int64_t) * (size_t)num);
  double *pm = tg_xcalloc((size_t)(num * 2 * h), sizeof(double));
  void *pbuf = tg_xmalloc((size_t)(num * 2 * h) * tg_dtype_itemsize(pdt));
  for (int64_t i = 0; i < h; i++) perm[i] = i;
  for (int64_t i = h; i < num; i++) perm[i] = num - 1 - (i - h);
  tg_tensor eye = beye(a, num, dt, batch, nb);
  int64_t bs1h[MAXD], bsh11[MAXD];
  memcpy(bs1h, batch, sizeof(int64_t) * (size_t)nb), memcpy(bsh11, batch, sizeof(int64_t) * (size_t)nb);
  bs1h[nb] = 1, bs1h[nb + 1] = h;
  bsh11[nb] = h, bsh11[nb + 1] = 1, bsh11[nb + 2] = 1;
  /* tinygrad runs 4 * num rounds (about 4 sweeps); the sweeps one-sided Jacobi needs grow with log2(num)
   * (4 leave U visibly non-orthogonal from 8 columns in float64 and 16 in float32), so we run
   * (ceil(log2 num) + 4) * num rounds: still a fixed, data-independent count. */
  int64_t sweeps = 4;
  while (((int64_t)1 << (sweeps - 4)) < num) sweeps++;
  for (int64_t round = 0; round < sweeps * num; round++) {
    tg_scope_begin();
    /* P_pair: the first 2h columns of P (the odd column out rests) */
    for (int64_t r = 0; r < num; r++)
      for (int64_t c = 0; c < 2 * h; c++) pm[r * 2 * h + c] = r == perm[c];
    for (int64_t i = 0; i < num * 2 * h; i++) {
      if (pdt == TG_FLOAT64)
        ((double *)pbuf)[i] = pm[i];
      else
        ((float *)pbuf)[i] = (float)pm[i];
    }
    tg_tensor P = tg_from_data(pbuf, (const int64_t[]){num, 2 * h}, 2, &fo);
    if (pdt != dt) P = tg_cast(P, dt);
    tg_tensor Up = tg_matmul(*U, P);
    tg_tensor parts[2];
    tg_split(Up, (const int64_t[]){h}, 1, -1, parts, 2);
    const int rows[1] = {-2};
    tg_tensor gamma = tg_reshape(tg_sum(tg_mul(parts[0], parts[1]), rows, 1, false), bs1h, nb + 2);
    tg_tensor ab[2];
    tg_split(tg_unsqueeze(tg_sum(tg_square(Up), rows, 1, false), -2), (const int64_t[]){h}, 1, -1, ab, 2);
    tg_tensor rot = tg_ne_s(gamma, 0);
    tg_tensor one = tg_const_like(gamma, 1);
    tg_tensor tau = tg_div(tg_sub(ab[1], ab[0]), tg_mul_s(tg_where(rot, gamma, one), 2));
    tg_tensor t = tg_div(tg_where(tg_ne_s(tau, 0), tg_sign(tau), one),
                         tg_add(tg_abs(tau), tg_sqrt(tg_add_s(tg_square(tau), 1))));
    t = tg_where(rot, t, tg_const_like(t, 0));
    tg_tensor c = tg_rsqrt(tg_add_s(tg_square(t), 1));
    tg_tensor s = tg_mul(c, t);
    /* rotation = I + sum over pairs of the 2x2 deltas at (i_k, j_k) */
    tg_tensor sel[2];
    tg_split(tg_transpose(P, 0, 1), (const int64_t[]){h}, 1, 0, sel, 2);
    tg_tensor ia = tg_unsqueeze(sel[0], -1), ib = tg_unsqueeze(sel[0], -2);
    tg_tensor ja = tg_unsqueeze(sel[1], -1), jb = tg_unsqueeze(sel[1], -2);
    tg_tensor cc = tg_reshape(tg_sub_s(c, 1), bsh11, nb + 3), ss = tg_reshape(s, bsh11, nb + 3);
    tg_tensor delta = tg_add(tg_mul(cc, tg_add(tg_mul(ia, ib), tg_mul(ja, jb))),
                             tg_mul(ss, tg_sub(tg_mul(ia, jb), tg_mul(ja, ib))));
    tg_tensor R = tg_add(eye, tg_sum(delta, (const int[]){-3}, 1, false));
    *U = tg_keep(contiguous2(tg_matmul(*U, R)));
    *V = tg_keep(contiguous2(tg_matmul(*V, R)));
    tg_scope_end();
    if (!tg_valid(*U) || !tg_valid(*V)) break; /* a round failed: the rest would be none too */
    /* next pairing */
    if (num % 2 == 1) {
      for (int64_t i = 0; i < num; i++) perm[i] = ((perm[i] - 1) % num + num) % num;
    } else {
      tmp[0] = perm[0];
      for (int64_t i = 1; i < num; i++) tmp[i] = ((perm[i] - 2) % (num - 1) + (num - 1)) % (num - 1) + 1;
      memcpy(perm, tmp, sizeof(int64_t) * (size_t)num);
    }
  }
  free(perm), free(tmp), free(pm), free(pbuf);
}

tg_status tg_svd(tg_tensor x, bool full_matrices, tg_tensor *u, tg_tensor *s, tg_tensor *vt) {
  const char *fn = "tg_svd";
  tg_tensor *outs[3] = {u, s, vt};
  if (!u || !s || !vt) {
    clear_outs(outs, 3);
    return tg_set_error(TG_ERR_INVALID, "%s: u, s and vt must not be NULL", fn);
  }
  UOp *a = linalg_args(fn, x);
  if (!a) return st_fail(outs, 3);
  int nd = a->ndim, nb = nd - 2;
  int64_t m = a->shape[nd - 2], n = a->shape[nd - 1], num = m < n ? m : n, qn = m < n ? n : m;
  POp o = begin(fn);
  tg_dtype odt = linalg_dtype(a), dt = linalg_compute_dtype(odt);
  tg_tensor xf = tg_cast(x, dt);
  if (m < n) xf = tg_transpose(xf, -2, -1);
  tg_tensor Q, R;
  qr_(a, xf, &Q, &R);
  const int64_t *batch = a->shape;
  int64_t b[2 * MAXD];
  for (int j = 0; j < nb; j++) b[2 * j] = 0, b[2 * j + 1] = batch[j];
  b[2 * nb] = 0, b[2 * nb + 1] = num, b[2 * nb + 2] = 0, b[2 * nb + 3] = num;
  tg_tensor U = tg_contiguous(tg_shrink(R, b, 2 * (nb + 2)));
  tg_tensor V = tg_contiguous(beye(a, num, dt, batch, nb));
  jacobi_(a, &U, &V, num, batch, nb);
  /* singular values = column norms, sorted descending; columns follow */
  tg_tensor S, order;
  tg_sort(tg_sqrt(tg_sum(tg_square(U), (const int[]){-2}, 1, false)), -1, true, &S, &order);
  int64_t sq[MAXD];
  memcpy(sq, batch, sizeof(int64_t) * (size_t)nb);
  sq[nb] = num, sq[nb + 1] = num;
  tg_tensor gi = tg_expand(tg_unsqueeze(order, -2), sq, nb + 2);
  tg_tensor Sd = tg_where(tg_ne_s(S, 0), S, tg_const_like(S, 1));
  U = tg_div(tg_gather(U, -1, gi), tg_unsqueeze(Sd, -2));
  V = tg_gather(V, -1, gi);
  /* U in the top-left num x num block of a qn x qn identity, then rotated back by Q */
  int64_t pd[2 * MAXD] = {0};
  pd[2 * nb + 1] = qn - num, pd[2 * nb + 3] = qn - num;
  tg_tensor eye_q = beye(a, qn, dt, batch, nb),
            eye_n = tg_pad(beye(a, num, dt, batch, nb), pd, 2 * (nb + 2), 0.0);
  U = tg_matmul(Q, tg_add(tg_sub(tg_pad(U, pd, 2 * (nb + 2), 0.0), eye_n), eye_q));
  if (!full_matrices) {
    int64_t us[MAXD];
    int un = shape_of(U, us);
    if (un >= 2) U = shrink_last(U, us, un, 0, num);
  }
  tg_tensor res[3];
  res[1] = S;
  if (m >= n)
    res[0] = U, res[2] = tg_transpose(V, -2, -1);
  else
    res[0] = V, res[2] = tg_transpose(U, -2, -1);
  for (int i = 0; i < 3; i++) res[i] = tg_cast(res[i], odt);
  return done_n(o, outs, res, 3);
}
