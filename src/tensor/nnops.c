/*
 * nnops.c -- the higher-level op surface: cat/stack/repeat/split/gather, statistical reductions
 * (var, std, logsumexp, argmax, cumsum, ...), pooling and convolution, and functional nn (norms,
 * dropout, attention, losses).
 *
 * In: handles and arguments from the user. Out: new handles (or none + an error naming the function,
 * the shapes/values and a hint). Every op here is a composition of the public primitive ops, built
 * the way tinygrad builds it, so the result is one lazy graph that fuses and that autograd
 * differentiates with the per-primitive rules. Nothing here computes data, with one exception:
 * dropout realizes its mask at once so that the forward value and the gradient see the same mask
 * (see tg_dropout).
 *
 * Pattern: validate every argument first (so errors name the function the user called), then
 * compose inside a private scope and move only the result out. If an inner op still fails, its
 * message is re-recorded with this function's name in front (see `done`).
 *
 * Convolution and pooling use tinygrad's _pool: windows are made with movement ops only
 * (repeat + shrink + reshape + permute), so conv2d is a single reduce kernel over the input and
 * weight buffers with no im2col buffer.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compose.h"

#define NONE ((tg_tensor){0})
#define MAXD 64
/* windowed ops (pools, cumsum) go through tg_repeat, which doubles the dims, plus window dims */
#define MAXD_WINDOW 30

int norm_axis(const char *fn, int axis, int ndim, int *out); /* ops.c */

#define fail op_fail
#define begin op_scope_begin
#define done op_scope_done
#define cdiv ceil_div
typedef OpScope NnOp;
static const char *shp(char *buf, size_t n, const UOp *u) { return fmt_shape(buf, n, u->shape, u->ndim); }

/* A new handle to the same lazy value (never hand an input handle back: the caller owns it). */
static tg_tensor same(UOp *u) { return t_wrap(uop_ref(u)); }
static bool is_data_view(UOp *u);
static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* A float16/bfloat16 convolution where halves are computed in float32 (half_via_float32): the
 * convolution of the float32 values (exact products, a float32 sum) rounded once, then the bias added
 * in its dtype -- tinygrad's (x * w).sum(dtype=float32).cast(half) + bias. Rounding every product, as
 * the half kernels did, put 174 of 420 results of a small float16 convolution off by an ulp. With a
 * sum dtype (conv2d(dtype=), not the halves' own) the float32 convolution sums in it and the result
 * stays in it. false when the dtypes do not call for it; else true with the result (NONE on error) in
 * *out. */
static bool conv_half_via_float32(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, UOp *a, UOp *w,
                                  tg_dtype dtype, tg_tensor (*conv)(tg_tensor, tg_tensor, tg_dtype, void *), void *ctx,
                                  tg_tensor *out) {
  tg_dtype dt = tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)w->dtype);
  if (!half_via_float32(a, dt)) return false;
  OpScope o = op_scope_begin(fn);
  tg_dtype inner = dtype == TG_FLOAT32 ? TG_DTYPE_DEFAULT : dtype;
  tg_tensor r = tg_cast(conv(tg_cast(x, TG_FLOAT32), tg_cast(weight, TG_FLOAT32), inner, ctx),
                        dtype != TG_DTYPE_DEFAULT ? dtype : dt);
  if (bias.id) {
    int64_t bs[2 + TG_WINDOW_MAXDIMS];
    bs[0] = w->shape[0];
    for (int j = 1; j < a->ndim - 1; j++) bs[j] = 1;
    r = tg_add(r, tg_reshape(bias, bs, a->ndim - 1));
  }
  *out = op_scope_done(o, r);
  return true;
}

/* WINO's tiles take a sum dtype of float32 or float64 (their transform matrices are made in those); a
 * convolution summing in another dtype runs directly */
static bool wino_dtype_ok(tg_dtype dtype) {
  return dtype == TG_DTYPE_DEFAULT || dtype == TG_FLOAT32 || dtype == TG_FLOAT64;
}

static bool same_device(const char *fn, UOp *a, UOp *b, const char *what) {
  if (a->device == b->device) return true;
  tg_set_error(TG_ERR_INVALID, "%s: %s is on %s but the input is on %s; move it with tg_to", fn, what,
               device_by_id(b->device)->name, device_by_id(a->device)->name);
  return false;
}

/* Broadcast shape of a and b into out (returns ndim) or -1 with an error naming fn. */
static int bcast_shape(const char *fn, const int64_t *a, int na, const int64_t *b, int nb, int64_t *out,
                       const char *what) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int ia = i - (n - na), ib = i - (n - nb);
    int64_t x = ia >= 0 ? a[ia] : 1, y = ib >= 0 ? b[ib] : 1;
    if (x != y && x != 1 && y != 1) {
      char s1[256], s2[256];
      tg_set_error(TG_ERR_INVALID,
                   "%s: %s: shapes %s and %s cannot broadcast (each dimension must match or be 1)", fn, what,
                   fmt_shape(s1, sizeof s1, a, na), fmt_shape(s2, sizeof s2, b, nb));
      return -1;
    }
    out[i] = x == 1 ? y : x;
  }
  return n;
}

/* Normalizes reduction axes (naxes == 0: all) into flags red[ndim]. Returns the number of reduced
 * elements or -1. */
static int64_t reduce_flags(const char *fn, UOp *a, const int *axes, int naxes, bool *red) {
  if (!t_axes_count_ok(fn, axes, naxes, a->ndim)) return -1;
  for (int i = 0; i < a->ndim; i++) red[i] = naxes == 0;
  for (int i = 0; i < naxes; i++) {
    int ax;
    if (norm_axis(fn, axes[i], a->ndim, &ax) < 0) return -1;
    if (a->ndim == 0) continue;
    if (red[ax]) {
      tg_set_error(TG_ERR_INVALID, "%s: axis %d appears twice in axes", fn, axes[i]);
      return -1;
    }
    red[ax] = true;
  }
  int64_t n = 1;
  for (int i = 0; i < a->ndim; i++)
    if (red[i]) n *= a->shape[i];
  return n;
}

/* Shape after reducing the flagged axes (keepdim: size 1). Returns ndim. */
static int reduced_shape(UOp *a, const bool *red, bool keepdim, int64_t *out) {
  int k = 0;
  for (int i = 0; i < a->ndim; i++) {
    if (!red[i])
      out[k++] = a->shape[i];
    else if (keepdim)
      out[k++] = 1;
  }
  return k;
}

static tg_tensor reshape_n(tg_tensor x, const int64_t *shape, int n) { return tg_reshape(x, shape, n); }

/* ---------------------------------------------------------------------------------------------- */
/* movement                                                                                        */

static tg_tensor repeat_impl(tg_tensor x, UOp *a, const int64_t *reps, int n) {
  int64_t base[MAXD], uns[MAXD], exp_[MAXD], fin[MAXD];
  int off = n - a->ndim;
  for (int i = 0; i < n; i++) base[i] = i < off ? 1 : a->shape[i - off];
  for (int i = 0; i < n; i++) {
    uns[2 * i] = 1, uns[2 * i + 1] = base[i];
    exp_[2 * i] = reps[i], exp_[2 * i + 1] = base[i];
    fin[i] = reps[i] * base[i];
  }
  tg_tensor r = tg_reshape(x, uns, 2 * n);
  r = tg_expand(r, exp_, 2 * n);
  return tg_reshape(r, fin, n);
}

tg_tensor tg_repeat(tg_tensor x, const int64_t *repeats, int nrepeats) {
  const char *fn = "tg_repeat";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (nrepeats < a->ndim || nrepeats > MAXD / 2 || (nrepeats > 0 && !repeats))
    return fail("%s: got %d repeats for a tensor of shape %s; give one repeat count per dimension (at least "
                "%d, at most %d)",
                fn, nrepeats, SHP(a), a->ndim, MAXD / 2);
  int off = nrepeats - a->ndim;
  for (int i = 0; i < nrepeats; i++) {
    if (repeats[i] < 0)
      return fail("%s: repeat count %lld for dim %d is negative", fn, (long long)repeats[i], i);
    int64_t size;
    if (__builtin_mul_overflow(repeats[i], i < off ? 1 : a->shape[i - off], &size))
      return fail("%s: repeat count %lld for dim %d of shape %s overflows int64", fn, (long long)repeats[i],
                  i, SHP(a));
    if (i >= off && repeats[i] != 1 && t_dim_sym(x, i - off))
      return fail("%s: dim %d of shape %s is symbolic; %lld copies of it make a multiple of its variable, which "
                  "is not expressible as variable + constant (repeat only its plain dims)", fn, i - off, SHP(a),
                  (long long)repeats[i]);
  }
  NnOp o = begin(fn);
  return done(o, repeat_impl(x, a, repeats, nrepeats));
}

/* How many inputs one cat kernel combines. Each output element of a pad+add cat evaluates every
 * input's pad, so one kernel over n inputs costs n times the output (and scheduling a chain of n
 * pads is worse): past CAT_GROUP inputs, groups of CAT_GROUP are concatenated into buffers of their
 * own first, and those are concatenated in turn -- work and graph size grow with the total size
 * times CAT_GROUP per level, about n / (CAT_GROUP - 1) extra kernels. Up to CAT_GROUP inputs the cat
 * stays one lazy expression that fuses into its consumer, as tinygrad's does. */
#define CAT_GROUP 32

/* Sum (or, for bool, OR) of each input padded to its place along d: a balanced tree, so no chain
 * deeper than log2(n) is built. */
static tg_tensor cat_sum(const tg_tensor *ts, int n, int d, tg_dtype dt) {
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    UOp *a = t_get(ts[i], "tg_cat"); /* a group that failed to build (its error is recorded) */
    if (!a) return NONE;
    total += a->shape[d];
  }
  tg_tensor *p = tg_xmalloc(sizeof(tg_tensor) * (size_t)n);
  int64_t before = 0;
  for (int i = 0; i < n; i++) {
    UOp *a = t_get(ts[i], "tg_cat");
    int64_t pads[2 * MAXD] = {0};
    pads[2 * d] = before;
    pads[2 * d + 1] = total - before - a->shape[d];
    before += a->shape[d];
    p[i] = tg_pad(tg_cast(ts[i], dt), pads, 2 * a->ndim, 0.0);
  }
  for (int w = 1; w < n; w *= 2)
    for (int i = 0; i + w < n; i += 2 * w) p[i] = dt == TG_BOOL ? tg_bitwise_or(p[i], p[i + w]) : tg_add(p[i], p[i + w]);
  tg_tensor r = p[0];
  free(p);
  return r;
}

static tg_tensor cat_tree(const tg_tensor *ts, int n, int d, tg_dtype dt) {
  if (n <= CAT_GROUP) return cat_sum(ts, n, d, dt);
  int m = (n + CAT_GROUP - 1) / CAT_GROUP;
  tg_tensor *parts = tg_xmalloc(sizeof(tg_tensor) * (size_t)m);
  for (int g = 0; g < m; g++) {
    int k = n - g * CAT_GROUP < CAT_GROUP ? n - g * CAT_GROUP : CAT_GROUP;
    parts[g] = k == 1 ? tg_cast(ts[g * CAT_GROUP], dt) : tg_contiguous(cat_sum(ts + g * CAT_GROUP, k, d, dt));
  }
  tg_tensor r = cat_tree(parts, m, d, dt);
  free(parts);
  return r;
}

tg_tensor tg_cat(const tg_tensor *ts, int n, int dim) {
  const char *fn = "tg_cat";
  if (n < 1 || !ts) return fail("%s: needs at least one tensor (got n=%d%s)", fn, n, ts ? "" : ", ts=NULL");
  UOp *a0 = t_get(ts[0], fn);
  if (!a0) return NONE;
  if (a0->ndim == 0) return fail("%s: cannot concatenate 0-d tensors (use tg_stack)", fn);
  int d;
  if (norm_axis(fn, dim, a0->ndim, &d) < 0) return NONE;
  tg_dtype dt = (tg_dtype)a0->dtype;
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    UOp *a = t_get(ts[i], fn);
    if (!a) return NONE;
    bool ok = a->ndim == a0->ndim;
    for (int j = 0; ok && j < a->ndim; j++) ok = j == d || a->shape[j] == a0->shape[j];
    if (!ok)
      return fail(
          "%s: tensor %d has shape %s but tensor 0 has shape %s; all shapes must match except in dim %d", fn,
          i, SHP(a), SHP(a0), d);
    if (!same_device(fn, a0, a, "a tensor")) return NONE;
    dt = tg_dtype_promote(dt, (tg_dtype)a->dtype);
    if (__builtin_add_overflow(total, a->shape[d], &total))
      return fail("%s: the sizes along dim %d add up past int64", fn, d);
  }
  NnOp o = begin(fn);
  if (n == 1) return done(o, tg_cast(ts[0], dt));
  return done(o, cat_tree(ts, n, d, dt));
}

tg_tensor tg_stack(const tg_tensor *ts, int n, int dim) {
  const char *fn = "tg_stack";
  if (n < 1 || !ts) return fail("%s: needs at least one tensor (got n=%d%s)", fn, n, ts ? "" : ", ts=NULL");
  UOp *a0 = t_get(ts[0], fn);
  if (!a0) return NONE;
  if (a0->ndim >= MAXD) return fail("%s: too many dimensions", fn);
  int d;
  if (norm_axis(fn, dim, a0->ndim + 1, &d) < 0) return NONE;
  for (int i = 1; i < n; i++) {
    UOp *a = t_get(ts[i], fn);
    if (!a) return NONE;
    if (a->ndim != a0->ndim || (a->ndim && memcmp(a->shape, a0->shape, sizeof(int64_t) * (size_t)a->ndim)))
      return fail(
          "%s: tensor %d has shape %s but tensor 0 has shape %s; stacked tensors must have equal shapes", fn,
          i, SHP(a), SHP(a0));
    if (!same_device(fn, a0, a, "a tensor")) return NONE;
  }
  NnOp o = begin(fn);
  tg_tensor *u = tg_xmalloc(sizeof(tg_tensor) * (size_t)n);
  for (int i = 0; i < n; i++) u[i] = tg_unsqueeze(ts[i], d);
  tg_tensor r = tg_cat(u, n, d);
  free(u);
  return done(o, r);
}

/* Shared by split and chunk: chunk size c (sizes == NULL) or explicit sizes. */
static int split_impl(const char *fn, tg_tensor x, UOp *a, int d, int64_t c, const int64_t *sizes, int nsizes,
                      int64_t forced, tg_tensor *out, int out_cap) {
  int64_t dim_sz = a->shape[d];
  int64_t count;
  if (forced > 0)
    count = forced;
  else if (sizes)
    count = nsizes;
  else
    count = dim_sz ? cdiv(dim_sz, c) : 1;
  if (count > 0x7fffffff)
    return tg_set_error(TG_ERR_INVALID, "%s: %lld pieces is too many", fn, (long long)count), -1;
  if (!out) return (int)count;
  if (out_cap < count)
    return tg_set_error(TG_ERR_INVALID,
                        "%s: out has room for %d handles but dim %d of shape %s splits into %lld pieces", fn,
                        out_cap, d, SHP(a), (long long)count),
           -1;
  int64_t start = 0;
  /* (pieces of a symbolic dim are cut at the bound value: marked as such, see sym_library) */
  sym_library(1);
  for (int64_t i = 0; i < count; i++) {
    int64_t sz = forced > 0 ? 0 : sizes ? sizes[i] : (c < dim_sz - start ? c : dim_sz - start);
    int64_t b[2 * MAXD];
    for (int j = 0; j < a->ndim; j++) b[2 * j] = 0, b[2 * j + 1] = a->shape[j];
    b[2 * d] = start, b[2 * d + 1] = start + sz;
    start += sz;
    out[i] = tg_shrink(x, b, 2 * a->ndim);
    if (!tg_valid(out[i])) {
      sym_library(-1);
      for (int64_t j = 0; j <= i; j++) tg_free(out[j]), out[j] = NONE;
      return -1;
    }
  }
  sym_library(-1);
  return (int)count;
}

int tg_split(tg_tensor x, const int64_t *sizes, int nsizes, int dim, tg_tensor *out, int out_cap) {
  const char *fn = "tg_split";
  UOp *a = t_get(x, fn);
  if (!a) return -1;
  if (a->ndim == 0) return tg_set_error(TG_ERR_INVALID, "%s: cannot split a 0-d tensor", fn), -1;
  int d;
  if (norm_axis(fn, dim, a->ndim, &d) < 0) return -1;
  if (nsizes < 1 || !sizes)
    return tg_set_error(TG_ERR_INVALID,
                        "%s: sizes is %s with nsizes=%d; give a chunk size or a list of sizes", fn,
                        sizes ? "set" : "NULL", nsizes),
           -1;
  if (nsizes == 1) {
    if (sizes[0] < 1 && a->shape[d] > 0)
      return tg_set_error(TG_ERR_INVALID, "%s: chunk size %lld must be positive", fn, (long long)sizes[0]),
             -1;
    return split_impl(fn, x, a, d, sizes[0] < 1 ? 1 : sizes[0], NULL, 0, 0, out, out_cap);
  }
  int64_t sum = 0;
  for (int i = 0; i < nsizes; i++) {
    if (sizes[i] < 0)
      return tg_set_error(TG_ERR_INVALID, "%s: size %lld (entry %d) is negative", fn, (long long)sizes[i], i),
             -1;
    if (__builtin_add_overflow(sum, sizes[i], &sum))
      return tg_set_error(TG_ERR_INVALID,
                          "%s: sizes add up past int64; they must sum to dim %d of shape %s (size %lld)", fn,
                          d, SHP(a), (long long)a->shape[d]),
             -1;
  }
  if (sum != a->shape[d])
    return tg_set_error(TG_ERR_INVALID,
                        "%s: sizes sum to %lld but dim %d of shape %s has size %lld; they must sum exactly",
                        fn, (long long)sum, d, SHP(a), (long long)a->shape[d]),
           -1;
  return split_impl(fn, x, a, d, 0, sizes, nsizes, 0, out, out_cap);
}

int tg_chunk(tg_tensor x, int chunks, int dim, tg_tensor *out, int out_cap) {
  const char *fn = "tg_chunk";
  UOp *a = t_get(x, fn);
  if (!a) return -1;
  if (a->ndim == 0) return tg_set_error(TG_ERR_INVALID, "%s: cannot chunk a 0-d tensor", fn), -1;
  int d;
  if (norm_axis(fn, dim, a->ndim, &d) < 0) return -1;
  if (chunks < 1)
    return tg_set_error(TG_ERR_INVALID, "%s: chunks must be at least 1, got %d", fn, chunks), -1;
  int64_t dim_sz = a->shape[d];
  if (dim_sz == 0) return split_impl(fn, x, a, d, 0, NULL, 0, chunks, out, out_cap);
  return split_impl(fn, x, a, d, cdiv(dim_sz, chunks), NULL, 0, 0, out, out_cap);
}

/* gather as tinygrad writes it: out[..., i, ...] = sum over k of (index[..., i, ...] == k) * x[..., k, ...].
 * O(index elements x dim size); the forward below is one load per element, and this remains the
 * gradient's form and the forward where x or index has a symbolic dim. */
static tg_tensor gather_onehot(tg_tensor x, UOp *a, int d, tg_tensor index, UOp *ix) {
  int64_t b[2 * MAXD];
  for (int j = 0; j < a->ndim; j++) b[2 * j] = 0, b[2 * j + 1] = j == d ? a->shape[j] : ix->shape[j];
  tg_tensor xs = tg_transpose(tg_unsqueeze(tg_shrink(x, b, 2 * a->ndim), -1), -1, d);
  tg_tensor oh = tg_eq(tg_unsqueeze(index, -1), dim_arange(a, d));
  tg_tensor w = tg_where(oh, xs, tg_const_like(xs, 0));
  return tg_cast(tg_sum(w, (const int[]){-1}, 1, false), (tg_dtype)a->dtype);
}

/* d x of out = gather(x, d, index): the gradient of the one-hot form, a sum over the index
 * positions per x element, padded back to x's shape. inputs: x, index, and d as an int64 CONST. */
static void gather_grad(UOp *out, UOp *g, UOp *const *inputs, int n, UOp **grads) {
  (void)out, (void)n;
  UOp *a = inputs[0], *ix = inputs[1];
  int d = (int)inputs[2]->arg.i, nd = a->ndim;
  tg_scope_begin();
  tg_tensor gt = t_wrap(uop_ref(g)), it = t_wrap(uop_ref(ix));
  tg_tensor oh = tg_eq(tg_unsqueeze(it, -1), dim_arange(a, d));
  tg_tensor w = tg_where(oh, tg_unsqueeze(gt, -1), tg_zeros_like(tg_unsqueeze(gt, -1), NULL));
  tg_tensor sm = tg_sum(w, (const int[]){d}, 1, false); /* the other dims, then x's dim d last */
  int perm[MAXD];
  for (int j = 0, k = 0; j < nd; j++) perm[j] = j == d ? nd - 1 : k++;
  int64_t p[2 * MAXD] = {0};
  for (int j = 0; j < nd; j++) p[2 * j + 1] = j == d ? 0 : a->shape[j] - ix->shape[j];
  tg_tensor r = tg_pad(tg_permute(sm, perm, nd), p, 2 * nd, 0.0);
  UOp *ru = tg_valid(r) ? t_get(r, "tg_backward") : NULL;
  grads[0] = ru && ru->dtype != a->dtype ? g_cast(ru, (tg_dtype)a->dtype) : ru ? uop_ref(ru) : NULL;
  tg_scope_end();
}

/* One data-dependent load per output element: x's elements (cut to index's extent in the other
 * dims) as one flat row list, read at the linear position of (i with i_d = index[i]); an index
 * outside [0, size of d) reads position `total`, which the load masks to 0. */
static tg_tensor gather_impl(tg_tensor x, UOp *a, int d, tg_tensor index, UOp *ix) {
  int nd = a->ndim;
  int64_t sh[MAXD], total = 1;
  for (int j = 0; j < nd; j++) sh[j] = j == d ? a->shape[j] : ix->shape[j], total *= sh[j];
  /* (a symbolic dim cannot be flattened into the row list) */
  if (total == 0 || shape_numel(ix->shape, ix->ndim) == 0 || a->sym || ix->sym) return gather_onehot(x, a, d, index, ix);
  int64_t b[2 * MAXD];
  for (int j = 0; j < nd; j++) b[2 * j] = 0, b[2 * j + 1] = sh[j];
  tg_tensor xs = tg_shrink(x, b, 2 * nd);
  /* x computed lazily and read at least once per element on average (an upsampling's second dim):
   * store it first (in its own shape, so that kernel loops over x's dims), and the gather reads it
   * at the flat position instead of recomputing it there behind a div/mod chain back to x's dims */
  if (!g_is_stored(a, false) && 2 * shape_numel(ix->shape, ix->ndim) >= total) xs = tg_contiguous(xs);
  tg_tensor flat = tg_reshape(xs, (const int64_t[]){total}, 1);
  tg_opts o = on_device(a, TG_INT64);
  tg_tensor v = tg_cast(index, TG_INT64);
  tg_tensor ok = tg_bitwise_and(tg_logical_not(tg_lt_s(v, 0)), tg_lt_s(v, (double)a->shape[d]));
  int64_t stride = 1;
  tg_tensor lin = NONE;
  for (int j = nd - 1; j >= 0; j--) {
    tg_tensor term;
    if (j == d) {
      term = tg_mul_s(v, (double)stride);
    } else {
      int64_t rs[MAXD];
      for (int k = 0; k < nd; k++) rs[k] = k == j ? sh[j] : 1;
      term = tg_reshape(tg_arange(0, (double)sh[j] * (double)stride, (double)stride, &o), rs, nd);
    }
    lin = j == nd - 1 ? term : tg_add(lin, term);
    stride *= sh[j];
  }
  lin = tg_where(ok, lin, tg_full_like(v, (double)total, NULL));
  tg_tensor r = tg_index(flat, lin);
  UOp *ru = tg_valid(r) ? t_get(r, "tg_gather") : NULL;
  if (ru) {
    UOp *dc = g_const((double)d, TG_INT64, a->device);
    UOp *ins[3] = {a, ix, dc};
    /* on several devices only where each shard gathers from its own shard of x, at positions along
     * an unsplit axis; otherwise autograd differentiates the index graph itself */
    if (!m_is(ru) || m_axis(ru) != d) ag_set_custom_grad_mode(ru, ins, 3, gather_grad, AG_SHARD_ALIGNED);
    uop_unref(dc);
  }
  return r;
}

tg_tensor tg_gather(tg_tensor x, int dim, tg_tensor index) {
  const char *fn = "tg_gather";
  UOp *a = t_get(x, fn), *ix = a ? t_get(index, fn) : NULL;
  if (!a || !ix) return NONE;
  if (!tg_dtype_is_int((tg_dtype)ix->dtype))
    return fail("%s: index has dtype %s; it must be an integer tensor", fn,
                tg_dtype_name((tg_dtype)ix->dtype));
  if (a->ndim == 0 || ix->ndim != a->ndim)
    return fail("%s: index shape %s and input shape %s must have the same number of dimensions (at least 1)",
                fn, SHP(ix), SHP(a));
  int d;
  if (norm_axis(fn, dim, a->ndim, &d) < 0) return NONE;
  for (int j = 0; j < a->ndim; j++)
    if (j != d && ix->shape[j] > a->shape[j])
      return fail("%s: index shape %s is larger than input shape %s in dim %d (only dim %d may be larger)",
                  fn, SHP(ix), SHP(a), j, d);
  if (!same_device(fn, a, ix, "index")) return NONE;
  NnOp o = begin(fn);
  return done(o, gather_impl(x, a, d, index, ix));
}

tg_status tg_meshgrid(const tg_tensor *ts, int n, tg_tensor *out, const tg_meshgrid_opts *opts) {
  const char *fn = "tg_meshgrid";
  if (n < 1 || !ts || !out || n > MAXD)
    return tg_set_error(TG_ERR_INVALID, "%s: needs 1..%d tensors and an out array (n=%d)", fn, MAXD, n);
  bool xy = opts && opts->xy;
  int64_t shape[MAXD];
  for (int i = 0; i < n; i++) {
    UOp *a = t_get(ts[i], fn);
    if (!a) return TG_ERR_HANDLE;
    if (a->ndim > 1)
      return tg_set_error(TG_ERR_INVALID, "%s: tensor %d has shape %s; inputs must be 0-d or 1-d", fn, i,
                          SHP(a));
    shape[i] = shape_numel(a->shape, a->ndim);
  }
  if (xy && n >= 2) {
    int64_t t = shape[0];
    shape[0] = shape[1], shape[1] = t;
  }
  for (int i = 0; i < n; i++) out[i] = NONE;
  for (int i = 0; i < n; i++) {
    int pos = (xy && n >= 2 && i < 2) ? 1 - i : i;
    int64_t rs[MAXD];
    for (int j = 0; j < n; j++) rs[j] = j == pos ? shape[j] : 1;
    NnOp o = begin(fn);
    tg_tensor r = tg_expand(tg_reshape(ts[i], rs, n), shape, n);
    out[i] = done(o, r);
    if (!tg_valid(out[i])) {
      for (int j = 0; j < i; j++) tg_free(out[j]), out[j] = NONE;
      return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
    }
  }
  return TG_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* reductions                                                                                      */

static tg_tensor var_impl(const char *fn, tg_tensor x, const int *axes, int naxes, bool keepdim,
                          double correction) {
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  bool red[MAXD];
  int64_t n = reduce_flags(fn, a, axes, naxes, red);
  if (n < 0) return NONE;
  if (!isfinite(correction)) return fail("%s: correction %g must be finite", fn, correction);
  tg_dtype out = tg_dtype_is_float((tg_dtype)a->dtype) ? (tg_dtype)a->dtype : TG_FLOAT32; /* (as tg_mean) */
  tg_tensor m = tg_mean(x, axes, naxes, true);
  tg_tensor dd = tg_sub(x, m);
  tg_tensor num = tg_sum(tg_mul(dd, dd), axes, naxes, keepdim);
  UOp *sc = g_sym_count(a, red, keepdim, out);
  if (sc) { /* a symbolic count: max(n - correction, 0) computed in the kernel */
    tg_tensor den = tg_maximum_s(tg_sub_s(t_wrap(sc), correction), 0.0);
    return tg_cast(tg_div(num, den), out);
  }
  double den = (double)n - correction;
  return tg_cast(tg_div_s(num, den > 0 ? den : 0.0), out);
}

tg_tensor tg_var(tg_tensor x, const int *axes, int naxes, bool keepdim, double correction) {
  NnOp o = begin("tg_var");
  return done(o, var_impl("tg_var", x, axes, naxes, keepdim, correction));
}

tg_tensor tg_std(tg_tensor x, const int *axes, int naxes, bool keepdim, double correction) {
  NnOp o = begin("tg_std");
  return done(o, tg_sqrt(var_impl("tg_std", x, axes, naxes, keepdim, correction)));
}

static tg_status two_out(const char *fn, bool is_std, tg_tensor x, const int *axes, int naxes, bool keepdim,
                         double correction, tg_tensor *v, tg_tensor *mean) {
  if (!v || !mean) return tg_set_error(TG_ERR_INVALID, "%s: output pointers must not be NULL", fn);
  *v = NONE, *mean = NONE;
  NnOp o = begin(fn);
  tg_tensor r = var_impl(fn, x, axes, naxes, keepdim, correction);
  if (is_std) r = tg_sqrt(r);
  tg_tensor vv = done(o, r);
  if (!tg_valid(vv)) return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
  o = begin(fn);
  tg_tensor mm = done(o, tg_mean(x, axes, naxes, keepdim));
  if (!tg_valid(mm)) {
    tg_free(vv);
    return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
  }
  *v = vv, *mean = mm;
  return TG_OK;
}

tg_status tg_var_mean(tg_tensor x, const int *axes, int naxes, bool keepdim, double correction,
                      tg_tensor *var_out, tg_tensor *mean_out) {
  return two_out("tg_var_mean", false, x, axes, naxes, keepdim, correction, var_out, mean_out);
}
tg_status tg_std_mean(tg_tensor x, const int *axes, int naxes, bool keepdim, double correction,
                      tg_tensor *std_out, tg_tensor *mean_out) {
  return two_out("tg_std_mean", true, x, axes, naxes, keepdim, correction, std_out, mean_out);
}

tg_tensor tg_logsumexp(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  const char *fn = "tg_logsumexp";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  bool red[MAXD];
  if (reduce_flags(fn, a, axes, naxes, red) < 0) return NONE;
  int64_t os[MAXD];
  int on = reduced_shape(a, red, keepdim, os);
  NnOp o = begin(fn);
  /* integers and bools as floats: x - max(x) would wrap (and bools have no subtraction) */
  if (!tg_dtype_is_float((tg_dtype)a->dtype)) x = tg_cast(x, tg_default_float());
  tg_tensor m = tg_detach(tg_max(x, axes, naxes, true));
  /* an infinite max is shifted by 0 instead (as PyTorch's): inf - inf would make a row holding +inf
   * NaN rather than +inf, and a row of -inf NaN rather than -inf */
  m = tg_where(tg_isinf(m), tg_zeros_like(m, NULL), m);
  tg_tensor l = tg_log(tg_sum(tg_exp(tg_sub(x, m)), axes, naxes, keepdim));
  return done(o, tg_add(l, keepdim ? m : reshape_n(m, os, on)));
}

static tg_tensor arg_impl(const char *fn, tg_tensor x, const int *axes, int naxes, bool keepdim,
                          bool is_min) {
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (naxes < 0 || naxes > 1 || (naxes == 1 && !axes))
    return fail("%s: give one axis (naxes=1) or none (naxes=0: the flattened tensor), got naxes=%d", fn,
                naxes);
  NnOp o = begin(fn);
  /* the max and the comparison with it must read the same bits (g_stable) */
  tg_tensor src = t_wrap(g_stable(a));
  int ax = 0, nd = a->ndim;
  int64_t n;
  if (naxes == 0) {
    int64_t flat = shape_numel(a->shape, a->ndim);
    src = tg_reshape(src, &flat, 1);
    nd = 1, n = flat;
  } else {
    if (norm_axis(fn, axes[0], a->ndim, &ax) < 0) return done(o, NONE);
    n = a->ndim ? a->shape[ax] : 1;
    if (a->ndim == 0) {
      int64_t one = 1;
      src = tg_reshape(src, &one, 1);
      nd = 1;
    }
  }
  if (n == 0) {
    tg_scope_end();
    return fail("%s: cannot take the %s of an empty dimension (shape %s)", fn, is_min ? "argmin" : "argmax",
                SHP(a));
  }
  if (n > INT32_MAX) {
    tg_scope_end();
    return fail("%s: %lld positions along the %s (shape %s) do not fit the int32 index it returns (at most "
                "2147483647, as tinygrad's); reduce a reshaped view in two steps (the argmax of each block, "
                "then of the blocks' maxima)", fn, (long long)n, naxes ? "axis" : "flattened tensor", SHP(a));
  }
  int axv[1] = {ax};
  tg_tensor mx = is_min ? tg_min(src, axv, 1, true) : tg_max(src, axv, 1, true);
  tg_tensor m = tg_eq(src, mx);
  /* a NaN is the max (and the min) of its row, as tg_max and PyTorch have it: the first NaN is the
   * answer (compared only with the max, no position would match and the result would be n) */
  if (tg_dtype_is_float((tg_dtype)a->dtype)) m = tg_bitwise_or(m, tg_isnan(src));
  int64_t rs[MAXD];
  rs[0] = n;
  for (int i = 1; i < nd - ax; i++) rs[i] = 1;
  SymDim sd;
  if (naxes == 1 && t_dim_sym(src, ax) && sym_decode(a->sym[ax], &sd)) {
    if (sd.min + sd.offset < 1) {
      tg_scope_end();
      return fail("%s: the symbolic axis %d may be empty (its variable goes down to %lld): an argmax/argmin of an "
                  "empty dimension has no answer; give the variable a minimum that keeps it non-empty",
                  fn, ax, (long long)sd.min);
    }
    /* a symbolic axis: the first position holding the extreme, as the least of where(m, i, max) (the
     * positions n..1 below would need n as a value) */
    rs[0] = a->sym[ax];
    tg_tensor pos = tg_reshape(dim_arange(a, ax), rs, nd - ax);
    tg_tensor far = tg_cast(tg_const_like(pos, 2147483647.0), TG_INT32);
    return done(o, tg_min(tg_where(m, pos, far), axv, 1, keepdim));
  }
  /* the positions n..1 as int32 (tinygrad's), or as float32 for a float input of at most 2^24
   * positions, where they are exact: the selection is then a float max, which vectorizes (the
   * integer one ran as scalar code, 2x slower with LLVM's code than with gcc's). Its max is taken
   * without tg_max's stable copy (that is for a gradient, and these products round nothing). */
  bool fpos = tg_dtype_is_float((tg_dtype)a->dtype) && n <= ((int64_t)1 << 24);
  tg_tensor pos = iarange(a, (double)n, 0, -1);
  if (fpos) pos = tg_cast(pos, TG_FLOAT32);
  tg_tensor idx = tg_mul(m, tg_reshape(pos, rs, nd - ax)), best;
  if (fpos) {
    UOp *iu = t_get(idx, fn);
    int64_t ax64 = ax;
    best = iu ? t_wrap(g_reduce(iu, OP_MAX, &ax64, 1)) : NONE;
    if (!keepdim) best = tg_squeeze(best, ax);
  } else {
    best = tg_max(idx, axv, 1, keepdim);
  }
  tg_tensor r = tg_cast(tg_rsub_s((double)n, best), TG_INT32);
  if (a->ndim == 0 && naxes == 1) r = keepdim ? tg_reshape(r, NULL, 0) : r;
  if (naxes == 0 && keepdim) { /* every dim kept, of size 1 (PyTorch's; tinygrad ignores keepdim here) */
    int64_t ones[MAXD];
    for (int i = 0; i < a->ndim; i++) ones[i] = 1;
    r = tg_reshape(r, ones, a->ndim);
  }
  return done(o, r);
}

tg_tensor tg_argmax(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  return arg_impl("tg_argmax", x, axes, naxes, keepdim, false);
}
tg_tensor tg_argmin(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  return arg_impl("tg_argmin", x, axes, naxes, keepdim, true);
}

tg_tensor tg_any(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  const char *fn = "tg_any";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  bool red[MAXD];
  if (reduce_flags(fn, a, axes, naxes, red) < 0) return NONE;
  NnOp o = begin(fn);
  return done(o, tg_max(tg_cast(x, TG_BOOL), axes, naxes, keepdim));
}

tg_tensor tg_all(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  const char *fn = "tg_all";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  bool red[MAXD];
  if (reduce_flags(fn, a, axes, naxes, red) < 0) return NONE;
  NnOp o = begin(fn);
  tg_tensor nb = tg_eq_s(tg_cast(x, TG_BOOL), 0);
  return done(o, tg_eq_s(tg_max(nb, axes, naxes, keepdim), 0));
}

/* tinygrad's _pool on the trailing nk dims: (..., i...) -> (..., o..., k...) using movement ops. */
tg_tensor pool_windows(tg_tensor x, const int64_t *xs, int n, int nk, const int64_t *k, const int64_t *s,
                           const int64_t *d) {
  int noop = n - nk;
  for (int j = 0; j < nk; j++)
    if (t_dim_sym(x, noop + j))
      return fail("windows over dim %d, a symbolic size, would split it at sizes computed from its bound value "
                  "(pool or convolve over plain dims only)", noop + j);
  int64_t o[8] = {0}, f[8] = {0}, reps[MAXD] = {0}, sh[MAXD] = {0}, b[2 * MAXD] = {0};
  bool disjoint = true;
  for (int j = 0; j < nk; j++) disjoint = disjoint && d[j] == 1 && s[j] >= k[j];
  if (disjoint) {
    /* windows that do not overlap (stride >= kernel, no dilation): pad or shrink each dim to o*s,
     * split it into (o, s) and keep the first k of each s -- a pure view, whose gradient is a view
     * too (no reduction over overlapping copies) */
    int64_t pp[2 * MAXD] = {0};
    bool anypad = false;
    for (int j = 0; j < noop; j++) b[2 * j + 1] = xs[j];
    for (int j = 0; j < nk; j++) {
      int64_t i = xs[noop + j];
      o[j] = cdiv(i - (k[j] - 1), s[j]);
      if (o[j] * s[j] > i) pp[2 * (noop + j) + 1] = o[j] * s[j] - i, anypad = true;
      b[2 * (noop + j) + 1] = o[j] * s[j];
    }
    tg_tensor r = anypad ? tg_pad(x, pp, 2 * n, 0.0) : x;
    r = tg_shrink(r, b, 2 * n);
    for (int j = 0; j < noop; j++) sh[j] = xs[j];
    for (int j = 0; j < nk; j++) sh[noop + 2 * j] = o[j], sh[noop + 2 * j + 1] = s[j];
    r = tg_reshape(r, sh, noop + 2 * nk);
    for (int j = 0; j < noop; j++) b[2 * j] = 0, b[2 * j + 1] = xs[j];
    for (int j = 0; j < nk; j++)
      b[2 * (noop + 2 * j)] = 0, b[2 * (noop + 2 * j) + 1] = o[j], b[2 * (noop + 2 * j + 1)] = 0,
                        b[2 * (noop + 2 * j + 1) + 1] = k[j];
    r = tg_shrink(r, b, 2 * (noop + 2 * nk));
    int perm[MAXD];
    for (int j = 0; j < noop; j++) perm[j] = j;
    for (int j = 0; j < nk; j++) perm[noop + j] = noop + 2 * j, perm[noop + nk + j] = noop + 2 * j + 1;
    return tg_permute(r, perm, noop + 2 * nk);
  }
  for (int j = 0; j < nk; j++) {
    int64_t i = xs[noop + j], span;
    /* tinygrad asserts this too. Callers check the window against the padded input, but a
     * ceil_mode pool over an empty dim with no padding before it trims the padding after it back to
     * nothing (a window may not start in the padding), leaving a 0-sized dim: the repeat below
     * would divide by it. */
    if (__builtin_mul_overflow(d[j], k[j] - 1, &span) || i <= span)
      return fail("the window over dim %d (kernel %lld, dilation %lld) is larger than that dim of the padded "
                  "input (%lld; a ceil_mode window may not start in the padding after the input)",
                  noop + j, (long long)k[j], (long long)d[j], (long long)i);
    o[j] = cdiv(i - d[j] * (k[j] - 1), s[j]);
    f[j] = imax(1, cdiv(o[j] * s[j] - d[j], i));
  }
  for (int j = 0; j < noop; j++) reps[j] = 1;
  for (int j = 0; j < nk; j++) reps[noop + j] = cdiv(k[j] * (xs[noop + j] * f[j] + d[j]), xs[noop + j]);
  tg_tensor r = tg_repeat(x, reps, n);
  /* handle dilation */
  for (int j = 0; j < noop; j++) b[2 * j] = 0, b[2 * j + 1] = xs[j], sh[j] = xs[j];
  for (int j = 0; j < nk; j++)
    b[2 * (noop + j)] = 0, b[2 * (noop + j) + 1] = k[j] * (xs[noop + j] * f[j] + d[j]);
  r = tg_shrink(r, b, 2 * n);
  for (int j = 0; j < nk; j++) sh[noop + 2 * j] = k[j], sh[noop + 2 * j + 1] = xs[noop + j] * f[j] + d[j];
  r = tg_reshape(r, sh, noop + 2 * nk);
  /* handle stride */
  for (int j = 0; j < nk; j++)
    b[2 * (noop + 2 * j)] = 0, b[2 * (noop + 2 * j) + 1] = k[j], b[2 * (noop + 2 * j + 1)] = 0,
                      b[2 * (noop + 2 * j + 1) + 1] = o[j] * s[j];
  r = tg_shrink(r, b, 2 * (noop + 2 * nk));
  for (int j = 0; j < nk; j++)
    sh[noop + 3 * j] = k[j], sh[noop + 3 * j + 1] = o[j], sh[noop + 3 * j + 2] = s[j];
  r = tg_reshape(r, sh, noop + 3 * nk);
  for (int j = 0; j < nk; j++) {
    int64_t *bb = b + 2 * (noop + 3 * j);
    bb[0] = 0, bb[1] = k[j], bb[2] = 0, bb[3] = o[j], bb[4] = 0, bb[5] = 1;
  }
  r = tg_shrink(r, b, 2 * (noop + 3 * nk));
  for (int j = 0; j < nk; j++) sh[noop + 2 * j] = k[j], sh[noop + 2 * j + 1] = o[j];
  r = tg_reshape(r, sh, noop + 2 * nk);
  /* move the kernel dims to the end */
  int perm[MAXD];
  for (int j = 0; j < noop; j++) perm[j] = j;
  for (int j = 0; j < nk; j++) perm[noop + j] = noop + 2 * j + 1, perm[noop + nk + j] = noop + 2 * j;
  return tg_permute(r, perm, noop + 2 * nk);
}

/* cumsum along the last axis of x (shape xs, n dims, s = xs[n-1] elements): out[i] = sum over j of
 * where(j <= i, x[j], 0), reducing a (..., s, s) view. The outputs i are contiguous, so the kernel
 * vectorizes along them (x[j] broadcast, a compare against the lane's i): a row costs s^2 selects
 * and adds, in vector lanes. A where, not a multiply by a 0/1 matrix, so an inf or NaN only reaches
 * the outputs at and after it. A row longer than 16 is padded with zeros to a multiple of 16 (the
 * vector width) and the padding's outputs dropped. */
static tg_tensor cumalu_last(tg_tensor x, const int64_t *xs, int n) {
  int64_t s = xs[n - 1], s16 = s > 16 && !t_dim_sym(x, n - 1) ? cdiv(s, 16) * 16 : s;
  if (s16 != s) {
    int64_t pads[2 * MAXD] = {0}, b[2 * MAXD], ps[MAXD];
    pads[2 * (n - 1) + 1] = s16 - s;
    memcpy(ps, xs, sizeof(int64_t) * (size_t)n);
    ps[n - 1] = s16;
    tg_tensor r = cumalu_last(tg_pad(x, pads, 2 * n, 0.0), ps, n);
    for (int k = 0; k < n; k++) b[2 * k] = 0, b[2 * k + 1] = xs[k];
    return tg_shrink(r, b, 2 * n);
  }
  UOp *a = t_get(x, "tg_cumsum");
  if (!a) return NONE;
  tg_tensor j = dim_arange(a, n - 1);
  tg_tensor lower = tg_le(j, tg_unsqueeze(j, -1)); /* [i][j]: j <= i */
  tg_tensor z = tg_cast(tg_const_like(x, 0), tg_dtype_of(x));
  return tg_sum(tg_where(lower, tg_unsqueeze(x, -2), z), (const int[]){-1}, 1, false);
}

/* cumsum along the last axis (shape ts, n dims). Up to 64 elements: one kernel (s^2 work per row).
 * Longer: cumsums inside chunks of SPLIT, plus the running total of the earlier chunks -- itself a
 * cumsum of the chunk totals, split again while there are more than 64 of them. About SPLIT vector
 * lane operations per element plus two kernels per level (1M elements, one thread: 0.44 ms, where
 * the pad + pool formulation this replaced took 5.5 ms and its backward pass 37 ms). SPLIT is 16
 * for rows of up to 1024, else one float32 vector of the device (`split`, cumsum_split): half the
 * work per element on AVX2 (1M elements: chunks of 8 1.1-1.4 ms, of 16 1.6-1.9 ms). */
static tg_tensor cumsum_last(tg_tensor t, const int64_t *ts, int n, int64_t split) {
  int64_t s = ts[n - 1];
  if (s <= 64 || t_dim_sym(t, n - 1)) return cumalu_last(t, ts, n);
  /* up to 64 chunks of 16 the rows are short: fewer levels (kernels) matter more there */
  const int64_t SPLIT = s <= 64 * 16 ? 16 : split;
  int64_t padded = cdiv(s, SPLIT) * SPLIT, nch = padded / SPLIT, pads[2 * MAXD] = {0}, cs[MAXD], bs[MAXD];
  pads[2 * (n - 1)] = padded - s;
  memcpy(cs, ts, sizeof(int64_t) * (size_t)n);
  cs[n - 1] = nch, cs[n] = SPLIT;
  tg_tensor chunks = cumalu_last(tg_reshape(tg_pad(t, pads, 2 * n, 0.0), cs, n + 1), cs, n + 1);
  int64_t b[2 * MAXD];
  for (int j = 0; j <= n; j++) b[2 * j] = 0, b[2 * j + 1] = cs[j];
  b[2 * n] = SPLIT - 1;
  memcpy(bs, cs, sizeof(int64_t) * (size_t)n);
  tg_tensor last = tg_reshape(tg_shrink(chunks, b, 2 * (n + 1)), bs, n);
  int64_t bp[2 * MAXD] = {0};
  bp[2 * (n - 1)] = 1, bp[2 * (n - 1) + 1] = -1;
  tg_tensor base = tg_pad(cumsum_last(last, bs, n, split), bp, 2 * n, 0.0);
  tg_tensor full = tg_flatten(tg_add(chunks, tg_unsqueeze(base, -1)), -2, -1);
  for (int j = 0; j < n; j++) b[2 * j] = 0, b[2 * j + 1] = ts[j];
  b[2 * (n - 1)] = padded - s, b[2 * (n - 1) + 1] = padded;
  return tg_shrink(full, b, 2 * n);
}

/* chunk length for cumsum_last: 8 where the device's vectors hold 8 float32 (AVX2), else 16 */
static int64_t cumsum_split(int device) {
  Device *d = device_by_id(device);
  return d && d->caps.vec_bytes == 32 ? 8 : 16;
}

tg_tensor tg_cumsum(tg_tensor x, int axis) {
  const char *fn = "tg_cumsum";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  int ax;
  if (norm_axis(fn, axis, a->ndim, &ax) < 0) return NONE;
  if (a->ndim > MAXD_WINDOW) return fail("%s: shape %s has more than %d dimensions", fn, SHP(a), MAXD_WINDOW);
  NnOp o = begin(fn);
  if (a->ndim == 0 || shape_numel(a->shape, a->ndim) == 0) {
    tg_dtype dt = tg_dtype_of(tg_sum(x, NULL, 0, false));
    return done(o, tg_cast(x, dt));
  }
  int n = a->ndim;
  int64_t ts[MAXD];
  memcpy(ts, a->shape, sizeof(int64_t) * (size_t)n);
  ts[ax] = a->shape[n - 1], ts[n - 1] = a->shape[ax];
  tg_tensor t = tg_transpose(x, ax, -1);
  /* float16/bfloat16: every level of a long row's scan in float32, one rounding at the end (each
   * level rounded to 16 bits drifted: a bfloat16 cumsum of 100 000 ones ended at 99328, not 99840) */
  tg_dtype dt = (tg_dtype)a->dtype;
  bool half = (dt == TG_FLOAT16 || dt == TG_BFLOAT16) && ts[n - 1] > 64;
  tg_tensor r = cumsum_last(half ? tg_cast(t, TG_FLOAT32) : t, ts, n, cumsum_split(a->device));
  return done(o, tg_transpose(half ? tg_cast(r, dt) : r, ax, -1));
}

/* tinygrad's _tri over a's last two dims: arange(r)[:, None] + diagonal <= arange(c) */
static tg_tensor tri(UOp *a, int64_t diagonal) {
  tg_tensor rr = tg_unsqueeze(dim_arange(a, a->ndim - 2), -1);
  return tg_le(tg_add_s(rr, (double)diagonal), dim_arange(a, a->ndim - 1));
}

static tg_tensor tri_op(const char *fn, tg_tensor x, int64_t diagonal, bool upper) {
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (a->ndim < 2) return fail("%s: needs a tensor with at least 2 dimensions, got shape %s", fn, SHP(a));
  /* a diagonal past the matrix selects all or nothing, as the nearest one on its edge does (tinygrad
   * and numpy take any integer) */
  if (!t_dim_sym(x, a->ndim - 2) && !t_dim_sym(x, a->ndim - 1)) {
    int64_t rows = a->shape[a->ndim - 2], cols = a->shape[a->ndim - 1];
    if (diagonal > cols) diagonal = cols;
    if (diagonal < -rows) diagonal = -rows;
  }
  if (diagonal > ((int64_t)1 << 40) || diagonal < -((int64_t)1 << 40))
    return fail("%s: diagonal %lld is out of range", fn, (long long)diagonal);
  NnOp o = begin(fn);
  tg_tensor z = tg_cast(tg_const_like(x, 0), (tg_dtype)a->dtype); /* bool x: false, not int 0 */
  tg_tensor res = upper ? tg_where(tri(a, diagonal), x, z) : tg_where(tri(a, diagonal + 1), z, x);
  return done(o, res);
}
tg_tensor tg_triu(tg_tensor x, int64_t diagonal) { return tri_op("tg_triu", x, diagonal, true); }
tg_tensor tg_tril(tg_tensor x, int64_t diagonal) { return tri_op("tg_tril", x, diagonal, false); }

/* ---------------------------------------------------------------------------------------------- */
/* pooling and convolution                                                                          */

/* A (y, x) pair from an options field: both 0 -> def, second 0 -> repeats the first. */
static bool opt_pair(const char *fn, const char *name, const int64_t *v, const int64_t *def, int64_t *out) {
  if (v[0] == 0 && v[1] == 0) {
    out[0] = def[0], out[1] = def[1];
  } else if (v[1] == 0) {
    out[0] = out[1] = v[0];
  } else {
    out[0] = v[0], out[1] = v[1];
  }
  if (out[0] < 1 || out[1] < 1 || out[0] > ((int64_t)1 << 32) || out[1] > ((int64_t)1 << 32)) {
    tg_set_error(TG_ERR_INVALID, "%s: %s (%lld, %lld) must be positive (0 means the default)", fn, name,
                 (long long)v[0], (long long)v[1]);
    return false;
  }
  return true;
}

/* tinygrad's padding forms -> per spatial dim (before, after) in (H, W) order: out[0..1] H, out[2..3] W. */
static bool opt_pads(const char *fn, const int64_t *p, int np, int64_t *out) {
  switch (np) {
  case 0:
    if (p[1] || p[2] || p[3]) {
      tg_set_error(TG_ERR_INVALID,
                   "%s: padding has several entries (%lld, %lld, %lld, %lld) but npadding is 0; set npadding "
                   "to 1, 2 or 4",
                   fn, (long long)p[0], (long long)p[1], (long long)p[2], (long long)p[3]);
      return false;
    }
    /* fallthrough */
  case 1:
    out[0] = out[1] = out[2] = out[3] = p[0];
    break;
  case 2:
    out[0] = out[1] = p[0], out[2] = out[3] = p[1];
    break;
  case 4:
    out[2] = p[0], out[3] = p[1], out[0] = p[2], out[1] = p[3];
    break; /* (left, right, top, bottom) */
  default:
    tg_set_error(TG_ERR_INVALID,
                 "%s: npadding is %d; use 1 (all sides), 2 (pad_h, pad_w) or 4 (left, right, top, bottom)",
                 fn, np);
    return false;
  }
  for (int i = 0; i < 4; i++)
    if (out[i] > ((int64_t)1 << 32) || out[i] < -((int64_t)1 << 32)) {
      tg_set_error(TG_ERR_INVALID, "%s: padding %lld is out of range", fn, (long long)out[i]);
      return false;
    }
  return true;
}

/* Checks that a window fits in the padded input along each of the nk spatial dims; sp = their sizes,
 * pads = (before, after) per dim. */
/* Does every window fit the padded input? With ceil_s (a ceil_mode pool's strides) the last window
 * may hang over the end, as in tinygrad and PyTorch: there must only be one window, ceil((ip - span)
 * / s) + 1 >= 1, i.e. ip - span > -s. */
static bool window_fits(const char *fn, UOp *a, int nk, const int64_t *sp, const int64_t *pads, const int64_t *k,
                        const int64_t *d, const int64_t *ceil_s) {
  for (int j = 0; j < nk; j++) {
    int64_t ip = sp[j] + pads[2 * j] + pads[2 * j + 1], span;
    if (__builtin_mul_overflow(d[j], k[j] - 1, &span)) {
      tg_set_error(TG_ERR_INVALID, "%s: kernel %lld with dilation %lld spans more than int64 can hold", fn,
                   (long long)k[j], (long long)d[j]);
      return false;
    }
    if (ceil_s ? ip - (span + 1) <= -ceil_s[j] : ip <= span) {
      char what[32];
      if (nk == 2) snprintf(what, sizeof what, "%s", j ? "horizontal" : "vertical");
      else snprintf(what, sizeof what, "spatial dim %d", j);
      tg_set_error(TG_ERR_INVALID,
                   "%s: the %s window (kernel %lld, dilation %lld spans %lld) is larger than the padded "
                   "input (%lld = %lld + padding %lld + %lld) of shape %s",
                   fn, what, (long long)k[j], (long long)d[j], (long long)(span + 1), (long long)ip,
                   (long long)sp[j], (long long)pads[2 * j], (long long)pads[2 * j + 1], SHP(a));
      return false;
    }
  }
  return true;
}

/* pad the last nk dims of x with pads ((before, after) per dim), then pool */
static tg_tensor pad_pool(tg_tensor x, UOp *a, int nk, const int64_t *pads, double value, const int64_t *k,
                          const int64_t *s, const int64_t *d) {
  int n = a->ndim;
  int64_t p[2 * MAXD] = {0}, xs[MAXD];
  bool any = false;
  memcpy(xs, a->shape, sizeof(int64_t) * (size_t)n);
  for (int j = 0; j < nk; j++) {
    p[2 * (n - nk + j)] = pads[2 * j], p[2 * (n - nk + j) + 1] = pads[2 * j + 1];
    xs[n - nk + j] += pads[2 * j] + pads[2 * j + 1];
    any = any || pads[2 * j] || pads[2 * j + 1];
  }
  return pool_windows(any ? tg_pad(x, p, 2 * n, value) : x, xs, n, nk, k, s, d);
}

static tg_tensor pad_pool2(tg_tensor x, UOp *a, const int64_t *pads, double value, const int64_t *k,
                           const int64_t *s, const int64_t *d) {
  return pad_pool(x, a, 2, pads, value, k, s, d);
}

/* tinygrad's _apply_ceil_mode: extra padding after each dim so the last partial window counts */
static void ceil_pads(int nk, const int64_t *sp, const int64_t *pads, const int64_t *k, const int64_t *s,
                      const int64_t *d, int64_t *out) {
  for (int j = 0; j < nk; j++) {
    int64_t i = sp[j], pb = pads[2 * j], pa = pads[2 * j + 1];
    int64_t o = cdiv(i + pb + pa - (d[j] * (k[j] - 1) + 1), s[j]) + 1;
    out[2 * j] = pb;
    out[2 * j + 1] = pa + s[j] * (o - 1) + (d[j] * (k[j] - 1) + 1) - (i + pb + pa) -
                     imax(s[j] * (o - 1) - (pb + i - 1), 0);
  }
}

/* Resolved window arguments of a pool over the trailing nk dims: pads are (before, after) per dim. */
typedef struct {
  int nk;
  int64_t k[TG_WINDOW_MAXDIMS], s[TG_WINDOW_MAXDIMS], d[TG_WINDOW_MAXDIMS], pads[2 * TG_WINDOW_MAXDIMS],
      sp[TG_WINDOW_MAXDIMS];
  bool ceil_mode, exclude_pad;
} PoolArgs;

static bool pool_args(const char *fn, UOp *a, const tg_pool2d_opts *opts, PoolArgs *pa) {
  static const tg_pool2d_opts zero;
  if (!opts) opts = &zero;
  if (a->ndim < 2 || a->ndim > MAXD_WINDOW) {
    tg_set_error(TG_ERR_INVALID, "%s: needs 2..%d dimensions (..., height, width), got shape %s", fn,
                 MAXD_WINDOW, SHP(a));
    return false;
  }
  static const int64_t two[2] = {2, 2}, one[2] = {1, 1};
  pa->nk = 2;
  if (!opt_pair(fn, "kernel_size", opts->kernel_size, two, pa->k) ||
      !opt_pair(fn, "stride", opts->stride, pa->k, pa->s) ||
      !opt_pair(fn, "dilation", opts->dilation, one, pa->d) ||
      !opt_pads(fn, opts->padding, opts->npadding, pa->pads))
    return false;
  pa->sp[0] = a->shape[a->ndim - 2], pa->sp[1] = a->shape[a->ndim - 1];
  pa->ceil_mode = opts->ceil_mode, pa->exclude_pad = opts->exclude_pad;
  return window_fits(fn, a, 2, pa->sp, pa->pads, pa->k, pa->d, pa->ceil_mode ? pa->s : NULL);
}

/* ---- n-d window options (tg_window_opts) ---- */

/* One value per spatial dim from an n-d options array: all zero -> def, only the first set -> that
 * value in every dim, else nk positive values (entries past nk must be zero). */
static bool opt_dims(const char *fn, const char *name, const int64_t *v, int nk, const int64_t *def,
                     int64_t *out) {
  int last = -1;
  for (int j = 0; j < TG_WINDOW_MAXDIMS; j++)
    if (v[j]) last = j;
  if (last < 0) {
    for (int j = 0; j < nk; j++) out[j] = def[j];
  } else if (last == 0) {
    for (int j = 0; j < nk; j++) out[j] = v[0];
  } else if (last >= nk) {
    tg_set_error(TG_ERR_INVALID, "%s: %s has an entry at position %d but there are only %d spatial dims", fn,
                 name, last, nk);
    return false;
  } else {
    for (int j = 0; j < nk; j++) out[j] = v[j];
  }
  for (int j = 0; j < nk; j++)
    if (out[j] < 1 || out[j] > ((int64_t)1 << 32)) {
      tg_set_error(TG_ERR_INVALID,
                   "%s: %s[%d] = %lld must be positive (give all %d values, or only the first for every dim; "
                   "all zero means the default)",
                   fn, name, j, (long long)out[j], nk);
      return false;
    }
  return true;
}

/* n-d padding forms (tinygrad's): npadding 0 or 1 = padding[0] on every side, nk = one value per dim
 * (both sides), 2*nk = (before, after) pairs from the LAST dim back (F.pad order). out = (before,
 * after) per dim, first dim first. */
static bool opt_pads_nd(const char *fn, const int64_t *p, int np, int nk, int64_t *out) {
  if (np == 0) {
    for (int j = 1; j < 2 * TG_WINDOW_MAXDIMS; j++)
      if (p[j]) {
        tg_set_error(TG_ERR_INVALID, "%s: padding has several entries but npadding is 0; set npadding to 1, %d or %d",
                     fn, nk, 2 * nk);
        return false;
      }
  }
  if (np == 0 || np == 1) {
    for (int j = 0; j < 2 * nk; j++) out[j] = p[0];
  } else if (np == nk) {
    for (int j = 0; j < nk; j++) out[2 * j] = out[2 * j + 1] = p[j];
  } else if (np == 2 * nk) {
    for (int j = 0; j < nk; j++) out[2 * j] = p[2 * (nk - 1 - j)], out[2 * j + 1] = p[2 * (nk - 1 - j) + 1];
  } else {
    tg_set_error(TG_ERR_INVALID,
                 "%s: npadding is %d; with %d spatial dims use 1 (all sides), %d (one per dim) or %d ((before, "
                 "after) from the last dim back)",
                 fn, np, nk, nk, 2 * nk);
    return false;
  }
  for (int j = 0; j < 2 * nk; j++)
    if (out[j] > ((int64_t)1 << 32) || out[j] < -((int64_t)1 << 32)) {
      tg_set_error(TG_ERR_INVALID, "%s: padding %lld is out of range", fn, (long long)out[j]);
      return false;
    }
  return true;
}

static bool nd_count_ok(const char *fn, int nk) {
  if (nk < 1 || nk > TG_WINDOW_MAXDIMS) {
    tg_set_error(TG_ERR_INVALID, "%s: %d spatial dims; 1..%d are supported", fn, nk, TG_WINDOW_MAXDIMS);
    return false;
  }
  return true;
}

static bool pool_args_nd(const char *fn, UOp *a, int nk, const tg_window_opts *opts, PoolArgs *pa) {
  static const tg_window_opts zero;
  if (!opts) opts = &zero;
  if (!nd_count_ok(fn, nk)) return false;
  if (a->ndim < nk || a->ndim + nk > MAXD_WINDOW) {
    tg_set_error(TG_ERR_INVALID, "%s: a %d-d pool needs %d..%d dimensions (..., spatial dims), got shape %s", fn,
                 nk, nk, MAXD_WINDOW - nk, SHP(a));
    return false;
  }
  if (opts->groups || opts->noutput_padding || opts->dtype)
    return tg_set_error(TG_ERR_INVALID, "%s: groups, output_padding and dtype are convolution options; leave them 0",
                        fn),
           false;
  for (int j = 0; j < TG_WINDOW_MAXDIMS; j++)
    if (opts->output_padding[j])
      return tg_set_error(TG_ERR_INVALID, "%s: output_padding is a transposed-convolution option; leave it 0", fn),
             false;
  int64_t two[TG_WINDOW_MAXDIMS], one[TG_WINDOW_MAXDIMS];
  for (int j = 0; j < TG_WINDOW_MAXDIMS; j++) two[j] = 2, one[j] = 1;
  pa->nk = nk;
  if (!opt_dims(fn, "kernel_size", opts->kernel_size, nk, two, pa->k) ||
      !opt_dims(fn, "stride", opts->stride, nk, pa->k, pa->s) ||
      !opt_dims(fn, "dilation", opts->dilation, nk, one, pa->d) ||
      !opt_pads_nd(fn, opts->padding, opts->npadding, nk, pa->pads))
    return false;
  for (int j = 0; j < nk; j++) pa->sp[j] = a->shape[a->ndim - nk + j];
  pa->ceil_mode = opts->ceil_mode, pa->exclude_pad = opts->exclude_pad;
  return window_fits(fn, a, nk, pa->sp, pa->pads, pa->k, pa->d, pa->ceil_mode ? pa->s : NULL);
}

static const int last_axes[TG_WINDOW_MAXDIMS] = {-1, -2, -3, -4, -5, -6, -7, -8};

static tg_tensor max_pool_impl(const char *fn, tg_tensor x, UOp *a, const PoolArgs *p) {
  int nk = p->nk;
  int64_t pads[2 * TG_WINDOW_MAXDIMS];
  memcpy(pads, p->pads, sizeof pads);
  if (p->ceil_mode) ceil_pads(nk, p->sp, p->pads, p->k, p->s, p->d, pads);
  NnOp o = begin(fn);
  /* the gradient of a max compares every input with the maximum: a computed input is stored once,
   * so the forward and backward kernels compare the same bits (recomputed in two kernels it can
   * round differently -- the compiler contracts a*b+c into FMAs per kernel -- and a window would
   * then match no element at all) */
  x = t_wrap(g_stable(a));
  a = t_get(x, fn);
  tg_tensor w = pad_pool(x, a, nk, pads, dtype_min((tg_dtype)a->dtype), p->k, p->s, p->d);
  return done(o, tg_max(w, last_axes, nk, false));
}

static tg_tensor avg_pool_impl(const char *fn, tg_tensor x, UOp *a, const PoolArgs *p) {
  int nk = p->nk;
  bool ceil = p->ceil_mode, include = !p->exclude_pad;
  int64_t pads[2 * TG_WINDOW_MAXDIMS];
  memcpy(pads, p->pads, sizeof pads);
  if (ceil) ceil_pads(nk, p->sp, p->pads, p->k, p->s, p->d, pads);
  NnOp o = begin(fn);
  tg_tensor r;
  if (!include) {
    tg_tensor num = tg_sum(pad_pool(x, a, nk, pads, 0.0, p->k, p->s, p->d), last_axes, nk, false);
    tg_tensor ones = tg_ones_like(x, NULL);
    r = tg_div(num, tg_sum(pad_pool(ones, a, nk, pads, 0.0, p->k, p->s, p->d), last_axes, nk, false));
  } else if (!ceil) {
    r = tg_mean(pad_pool(x, a, nk, pads, 0.0, p->k, p->s, p->d), last_axes, nk, false);
  } else {
    /* divide by the window's overlap with the regularly padded input (padding counts, the ceil
     * overhang not) */
    tg_tensor num = tg_sum(pad_pool(x, a, nk, pads, 0.0, p->k, p->s, p->d), last_axes, nk, false);
    int n = a->ndim;
    int64_t pp[2 * MAXD] = {0}, extra[2 * TG_WINDOW_MAXDIMS];
    for (int j = 0; j < nk; j++)
      pp[2 * (n - nk + j)] = p->pads[2 * j], pp[2 * (n - nk + j) + 1] = p->pads[2 * j + 1];
    for (int j = 0; j < 2 * nk; j++) extra[j] = pads[j] - p->pads[j];
    tg_tensor ones = tg_ones_like(tg_pad(x, pp, 2 * n, 0.0), NULL);
    UOp *ou = t_get(ones, fn);
    r = ou ? tg_div(num, tg_sum(pad_pool(ones, ou, nk, extra, 0.0, p->k, p->s, p->d), last_axes, nk, false))
           : NONE;
  }
  return done(o, r);
}

/* The four pooling entry points: parse the 2-D or N-D options, then run the max or average pool. */
static tg_tensor pool_entry(const char *fn, tg_tensor x, bool nd, const tg_pool2d_opts *o2, int nk, const tg_window_opts *ond,
                            bool is_max) {
  UOp *a = t_get(x, fn);
  PoolArgs p;
  if (!a || !(nd ? pool_args_nd(fn, a, nk, ond, &p) : pool_args(fn, a, o2, &p))) return NONE;
  if (nd && is_max && p.exclude_pad) return fail("%s: exclude_pad is an avg_pool option", fn);
  return is_max ? max_pool_impl(fn, x, a, &p) : avg_pool_impl(fn, x, a, &p);
}

tg_tensor tg_max_pool2d(tg_tensor x, const tg_pool2d_opts *opts) {
  return pool_entry("tg_max_pool2d", x, false, opts, 0, NULL, true);
}

tg_tensor tg_avg_pool2d(tg_tensor x, const tg_pool2d_opts *opts) {
  return pool_entry("tg_avg_pool2d", x, false, opts, 0, NULL, false);
}

tg_tensor tg_max_pool_nd(tg_tensor x, int nk, const tg_window_opts *opts) {
  return pool_entry("tg_max_pool_nd", x, true, NULL, nk, opts, true);
}

tg_tensor tg_avg_pool_nd(tg_tensor x, int nk, const tg_window_opts *opts) {
  return pool_entry("tg_avg_pool_nd", x, true, NULL, nk, opts, false);
}

/* Is u (through movement ops) data that is already in memory or will be materialized anyway? */
static bool is_data_view(UOp *u) { return g_is_stored(u, false); }

/* Is u a (bs, c, h, w) view of channels-last data: PERMUTE(0,3,1,2) of something in memory? */
static bool is_nhwc_view(UOp *u) {
  if (uop_realized(u) || u->op != OP_PERMUTE || u->ndim != 4 || u->niarg != 4) return false;
  static const int64_t nchw[4] = {0, 3, 1, 2};
  return !memcmp(u->iarg, nchw, sizeof nchw) && is_data_view(u->src[0]);
}

/* Does a stride-1 convolution with this weight shape accumulate channels-last (see tg_conv2d)? A
 * convolution with a huge reduction keeps the channels-first form when its rows are wide enough for
 * the reduction itself to vectorize. */
static bool chlast_ok(int64_t cout, int64_t cin, int64_t kh, int64_t kw) {
  return cout % 8 == 0 && (cin * kh * kw <= 4096 || kw % 4 != 0);
}

/* (bs, c, h, w) -> the same values as a view of a channels-last (bs, h, w, c) buffer */
static tg_tensor to_nhwc(tg_tensor x) {
  return tg_permute(tg_contiguous(tg_permute(x, (const int[]){0, 2, 3, 1}, 4)), (const int[]){0, 3, 1, 2}, 4);
}

/* Weight gradient of a stride-1 "valid" convolution: dw[co, ci, ky, kx] = sum over (n, oy, ox) of
 * x[n, oy+ky, ox+kx, ci] * g[n, oy, ox, co], from channels-last x (bs, H, W, cin) and g (bs, oh, ow,
 * cout), so that one of the channel axes is contiguous in both a load and the output and
 * vectorizes. The batch is split into groups of a few images whose data stays in the core's L2
 * cache while every output element's partial sum over the group is accumulated; the per-group
 * partials are summed by a second, small kernel. Without the split every output tile would stream
 * the whole batch from memory again. ws = (cout, cin, kh, kw). */
static tg_tensor conv_weight_grad(tg_tensor xl, tg_tensor gl, const int64_t *ws) {
  UOp *xu = t_get(xl, "tg_conv2d");
  if (!xu) return xl;
  int64_t bs = xu->shape[0], H = xu->shape[1], W = xu->shape[2], cin = xu->shape[3], cout = ws[0], kh = ws[2],
          kw = ws[3];
  int64_t oh = H - kh + 1, ow = W - kw + 1;
  /* images per group: the largest divisor of bs whose x and g fit in about 384 KiB */
  int64_t per_img = (H * W * cin + oh * ow * cout) * 4, ipg = 1;
  for (int64_t d = 1; d <= bs; d++)
    if (bs % d == 0 && d * per_img <= (384 << 10)) ipg = d;
  if (bs == 0) ipg = 0; /* an empty batch: one empty group */
  int64_t G = bs ? bs / ipg : 1;
  /* vectorize along cin when it is a multiple of 8, else along cout */
  bool ci_last = cin % 8 == 0 || cout % 8 != 0;
  /* windows over the channels-last buffer: (cin, bs, kh, kw, oh, ow) */
  int64_t vs[4] = {cin, bs, H, W};
  tg_tensor win = pool_windows(tg_permute(xl, (const int[]){3, 0, 1, 2}, 4), vs, 4, 2, (const int64_t[]){oh, ow},
                               (const int64_t[]){1, 1}, (const int64_t[]){1, 1});
  win = tg_reshape(win, (const int64_t[]){cin, G, ipg, kh, kw, oh, ow}, 7);
  tg_tensor gg = tg_reshape(gl, (const int64_t[]){G, ipg, oh, ow, cout}, 5);
  tg_tensor part;
  if (ci_last) { /* (G, cout, kh, kw, cin) */
    win = tg_permute(win, (const int[]){1, 3, 4, 0, 2, 5, 6}, 7); /* (G, kh, kw, cin, ipg, oh, ow) */
    win = tg_reshape(win, (const int64_t[]){G, 1, kh, kw, cin, ipg, oh, ow}, 8);
    gg = tg_reshape(tg_permute(gg, (const int[]){0, 4, 1, 2, 3}, 5), (const int64_t[]){G, cout, 1, 1, 1, ipg, oh, ow}, 8);
  } else { /* (G, cin, kh, kw, cout) */
    win = tg_permute(win, (const int[]){1, 0, 3, 4, 2, 5, 6}, 7); /* (G, cin, kh, kw, ipg, oh, ow) */
    win = tg_reshape(win, (const int64_t[]){G, cin, kh, kw, 1, ipg, oh, ow}, 8);
    gg = tg_reshape(tg_permute(gg, (const int[]){0, 4, 1, 2, 3}, 5), (const int64_t[]){G, 1, 1, 1, cout, ipg, oh, ow}, 8);
  }
  part = tg_sum(tg_mul(win, gg), (const int[]){-1, -2, -3}, 3, false);
  if (G > 1) part = tg_sum(tg_contiguous(part), (const int[]){0}, 1, false);
  else part = tg_reshape(part, (const int64_t[]){ci_last ? cout : cin, kh, kw, ci_last ? cin : cout}, 4);
  return ci_last ? tg_permute(part, (const int[]){0, 3, 1, 2}, 4) : tg_permute(part, (const int[]){3, 0, 1, 2}, 4);
}

/* Backward of a stride-1, undilated, ungrouped "valid" convolution y = conv(xp, w):
 *   dxp = full correlation of dy with w flipped and transposed (a convolution of padded dy),
 *   dw  = convolution of xp^T (cin, batch, H, W) with dy^T (cout, batch, oh, ow), transposed back.
 * Both are single fused reduce kernels; differentiating the window views instead would materialize
 * a (batch, cin, oh, ow, kh, kw) intermediate. */
static void conv_valid_grad(UOp *out, UOp *g, UOp *const *in, int n, UOp **grads) {
  (void)out, (void)n;
  tg_scope_begin();
  /* the incoming gradient is usually a lazy elementwise chain (relu, batchnorm backward): realize it
   * once, channels-last, or the weight-gradient reduction would recompute it for every (cin, ky, kx) */
  tg_tensor gl = tg_contiguous(tg_permute(t_wrap(uop_ref(g)), (const int[]){0, 2, 3, 1}, 4)); /* (bs, oh, ow, cout) */
  tg_tensor gt = tg_permute(gl, (const int[]){0, 3, 1, 2}, 4), w = t_wrap(uop_ref(in[1]));
  /* the input, channels-last: usually it already is (conv2d materializes computed inputs so) */
  tg_tensor xp = t_wrap(uop_ref(in[0]));
  tg_tensor xl = is_nhwc_view(in[0]) ? tg_permute(xp, (const int[]){0, 2, 3, 1}, 4)
                                     : tg_contiguous(tg_permute(xp, (const int[]){0, 2, 3, 1}, 4));
  int64_t kh = in[1]->shape[2], kw = in[1]->shape[3];
  tg_tensor wt = tg_permute(tg_flip(w, (const int[]){2, 3}, 2), (const int[]){1, 0, 2, 3}, 4);
  tg_tensor gx;
  if (chlast_ok(in[1]->shape[1], in[1]->shape[0], kh, kw)) {
    /* the convolution pads the channels-last gradient itself: its loads carry the padding's validity
     * conditions, which bound its window loops (codegen/bounds.c), so the third of the window that
     * falls on padding at a 5x5 kernel is never computed */
    gx = tg_conv2d(gt, wt, (tg_tensor){0}, TG_CONV2D_OPTS(.padding = {kh - 1, kw - 1}, .npadding = 2));
  } else {
    tg_tensor gp = tg_pad(gt, (const int64_t[]){0, 0, 0, 0, kh - 1, kh - 1, kw - 1, kw - 1}, 8, 0.0);
    gx = tg_conv2d(tg_contiguous(gp), wt, (tg_tensor){0}, NULL);
  }
  tg_tensor gw = conv_weight_grad(xl, gl, in[1]->shape);
  UOp *ux = t_get(gx, "tg_conv2d"), *uw = t_get(gw, "tg_conv2d");
  grads[0] = ux ? g_cast(ux, (tg_dtype)in[0]->dtype) : NULL;
  grads[1] = uw ? g_cast(uw, (tg_dtype)in[1]->dtype) : NULL;
  tg_scope_end();
}

static tg_tensor conv2d_nobias(tg_tensor x, tg_tensor w, tg_dtype dtype, void *opts) {
  tg_conv2d_opts co = *(const tg_conv2d_opts *)opts;
  co.dtype = dtype;
  return tg_conv2d(x, w, (tg_tensor){0}, &co);
}

/* conv2d(dtype=)'s argument: an error (false) for a value outside the dtypes; *out is dtype, or
 * TG_DTYPE_DEFAULT where it is the convolution's own promoted dtype dt (the plain convolution). */
static bool conv_sum_dtype(const char *fn, tg_dtype dtype, tg_dtype dt, tg_dtype *out) {
  if ((int)dtype < 0 || dtype >= TG_DTYPE_COUNT)
    return tg_set_error(TG_ERR_INVALID, "%s: invalid dtype %d (use a TG_* dtype or TG_DTYPE_DEFAULT)", fn, (int)dtype),
           false;
  /* (an integer's own dtype is not the default: that sums in int32 / uint32) */
  *out = dtype == dt && tg_dtype_is_float(dt) ? TG_DTYPE_DEFAULT : dtype;
  return true;
}

/* A convolution's result dtype: tinygrad's conv2d ends in sum(dtype=), so without a sum dtype a float
 * keeps the operands' promoted dtype and an integer or bool one stays in the dtype it accumulated
 * in (sum_acc_dtype: int8 -> int32, uint8 -> uint32, bool -> int32) */
static tg_dtype conv_out_dtype(tg_dtype sum_dtype, tg_dtype dt) {
  if (sum_dtype != TG_DTYPE_DEFAULT) return sum_dtype;
  return tg_dtype_is_float(dt) ? dt : dtype_sum_acc(dt);
}

/* A convolution whose sum dtype its products must not wrap or round before (dot_products_dtype:
 * int8 operands summed as int32 or float32, 16-bit floats as float32) runs on operands widened to
 * it first, as tinygrad 0.14's (measured: int8 conv2d dtype=int32 equals the exact sums).
 * conv(x, w, bias, dtype, ctx) is the convolution itself. */
typedef tg_tensor (*ConvFn)(tg_tensor x, tg_tensor w, tg_tensor bias, tg_dtype dtype, void *ctx);
static bool conv_exact_products(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, UOp *a, UOp *w, tg_dtype sdt,
                                ConvFn conv, void *ctx, tg_tensor *out) {
  tg_dtype dt = tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)w->dtype), pd = dot_products_dtype(dt, sdt);
  if (sdt == TG_DTYPE_DEFAULT || pd == dt) return false;
  OpScope o = op_scope_begin(fn);
  *out = op_scope_done(o, conv(tg_cast(x, pd), tg_cast(weight, pd), bias, sdt, ctx));
  return true;
}

static tg_tensor conv2d_opts_fn(tg_tensor x, tg_tensor w, tg_tensor bias, tg_dtype dtype, void *opts) {
  tg_conv2d_opts co = *(const tg_conv2d_opts *)opts;
  co.dtype = dtype;
  return tg_conv2d(x, w, bias, &co);
}

/* The convolution's sum of products: tg_sum, or with a dtype tinygrad's sum(dtype=) (cast, then summed
 * in dtype) */
static tg_tensor conv_sum(tg_tensor prod, const int *axes, int naxes, bool keepdim, tg_dtype dtype) {
  return dtype == TG_DTYPE_DEFAULT ? tg_sum(prod, axes, naxes, keepdim) : tg_sum_dtype(prod, axes, naxes, keepdim, dtype);
}

tg_tensor tg_conv2d(tg_tensor x, tg_tensor weight, tg_tensor bias, const tg_conv2d_opts *opts) {
  const char *fn = "tg_conv2d";
  static const tg_conv2d_opts zero;
  if (!opts) opts = &zero;
  UOp *a = t_get(x, fn), *w = a ? t_get(weight, fn) : NULL, *b = NULL;
  if (!a || !w) return NONE;
  if (bias.id && !(b = t_get(bias, fn))) return NONE;
  tg_dtype sdt;
  if (!conv_sum_dtype(fn, opts->dtype, tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)w->dtype), &sdt)) return NONE;
  tg_tensor wide;
  if (conv_exact_products(fn, x, weight, bias, a, w, sdt, conv2d_opts_fn, (void *)opts, &wide)) return wide;
  if (a->ndim == w->ndim && w->ndim >= 3 && w->ndim != 4 && w->ndim - 2 <= TG_WINDOW_MAXDIMS) {
    /* tinygrad's conv2d takes any number of spatial dims; a (y, x) pair option only carries one value
     * per dim here when it is uniform */
    int nsp = w->ndim - 2;
    bool uniform = (!opts->stride[1] || opts->stride[1] == opts->stride[0]) &&
                   (!opts->dilation[1] || opts->dilation[1] == opts->dilation[0]) && opts->npadding <= 1;
    if (!uniform)
      return fail("%s: a %d-d convolution (weight %s) takes only uniform stride, dilation and padding here; use "
                  "tg_conv_nd for per-dim values",
                  fn, nsp, SHP(w));
    int64_t g = opts->groups ? opts->groups : 1, s[TG_WINDOW_MAXDIMS], d[TG_WINDOW_MAXDIMS],
            pads[2 * TG_WINDOW_MAXDIMS];
    if (opts->npadding == 0 && (opts->padding[1] || opts->padding[2] || opts->padding[3]))
      return fail("%s: padding has several entries but npadding is 0", fn);
    for (int j = 0; j < nsp; j++) {
      s[j] = opts->stride[0] ? opts->stride[0] : 1, d[j] = opts->dilation[0] ? opts->dilation[0] : 1;
      pads[2 * j] = pads[2 * j + 1] = opts->padding[0];
      if (s[j] < 1 || d[j] < 1)
        return fail("%s: stride %lld and dilation %lld must be positive", fn, (long long)s[j], (long long)d[j]);
    }
    return conv_nd_resolved(fn, x, weight, bias, g, s, d, pads, sdt);
  }
  if (a->ndim != 4 || w->ndim != 4)
    return fail("%s: input %s must be (batch, cin, spatial...) and weight %s (cout, cin/groups, kernel...) with "
                "the same spatial dims",
                fn, SHP(a), SHP(w));
  int64_t groups = opts->groups ? opts->groups : 1;
  if (groups < 1) return fail("%s: groups %lld must be positive", fn, (long long)groups);
  int64_t bs = a->shape[0], cin_ = a->shape[1], cout = w->shape[0], cin = w->shape[1], kh = w->shape[2],
          kw = w->shape[3];
  int64_t gcin;
  if (__builtin_mul_overflow(groups, cin, &gcin))
    return fail(
        "%s: groups=%lld times the weight's %lld input channels overflows int64 (input %s, weight %s)", fn,
        (long long)groups, (long long)cin, SHP(a), SHP(w));
  if (gcin != cin_)
    return fail("%s: input %s has %lld channels but weight %s with groups=%lld expects groups*cin = %lld", fn,
                SHP(a), (long long)cin_, SHP(w), (long long)groups, (long long)gcin);
  if (cout % groups)
    return fail("%s: cout %lld of weight %s is not divisible by groups=%lld", fn, (long long)cout, SHP(w),
                (long long)groups);
  if (kh < 1 || kw < 1) return fail("%s: weight %s has an empty kernel", fn, SHP(w));
  if (b && (b->ndim != 1 || b->shape[0] != cout))
    return fail("%s: bias has shape %s but the weight %s needs (%lld,)", fn, SHP(b), SHP(w), (long long)cout);
  if (!same_device(fn, a, w, "weight") || (b && !same_device(fn, a, b, "bias"))) return NONE;
  static const int64_t one[2] = {1, 1};
  int64_t s[2], d[2], pads[4], k[2] = {kh, kw};
  if (!opt_pair(fn, "stride", opts->stride, one, s) || !opt_pair(fn, "dilation", opts->dilation, one, d) ||
      !opt_pads(fn, opts->padding, opts->npadding, pads))
    return NONE;
  int64_t hw[2] = {a->shape[2], a->shape[3]};
  if (!window_fits(fn, a, 2, hw, pads, k, d, NULL)) return NONE;
  int64_t oy = cdiv(hw[0] + pads[0] + pads[1] - d[0] * (kh - 1), s[0]),
          ox = cdiv(hw[1] + pads[2] + pads[3] - d[1] * (kw - 1), s[1]);
  int64_t rcout = cout / groups;
  tg_tensor hr;
  if (conv_half_via_float32(fn, x, weight, bias, a, w, sdt, conv2d_nobias, (void *)opts, &hr)) return hr;
  int im = image_mode(fn, a, w, b);
  if (im < 0) return NONE;
  /* IMAGE's kernels sum in the input dtype: a sum dtype runs the direct convolution */
  if (im && sdt == TG_DTYPE_DEFAULT &&
      image_conv_fits(a->device, a->shape[0], w->shape[1], hw[0], hw[1], cout, kh, kw, groups, s, d, pads))
    return image_conv2d(fn, x, weight, bias, groups, s, d, pads);
  if (wino_dtype_ok(sdt) && wino_applies(a, w, 2, s, d, pads, groups))
    return wino_conv(fn, x, weight, bias, groups, 2, pads, sdt);
  NnOp o = begin(fn);
  bool simple = groups == 1 && s[0] == 1 && s[1] == 1 && d[0] == 1 && d[1] == 1;
  tg_tensor xin = x;
  UOp *ain = a;
  bool chlast = simple && chlast_ok(cout, cin, kh, kw) && tg_dtype_is_float((tg_dtype)w->dtype);
  bool nhwc = chlast && is_nhwc_view(a);
  if (chlast && !nhwc && (cin >= 16 || !is_data_view(a))) {
    /* the input is computed (the previous layer's bias, activation, normalization): materialize it,
     * channels-last, instead of letting every window load recompute it -- each input element is read
     * cout*kh*kw times. The producer's kernel (usually the previous convolution, itself
     * channels-last) stores it contiguously along the channels.
     * A stored channels-first input with 16 or more channels is copied channels-last too: read in
     * place, one output position's window (4 batch rows x cin x kh rows of cache lines, 768 lines
     * for 64 channels and 3x3) overflows L1 and every load comes from L2; channels-last, the window
     * is a few contiguous runs along cin (conv 16x64x56x56, 3x3: 58 -> 49 ms kernel, plus a 1.6 ms
     * copy). With fewer channels the (kh, kw, cin) loop is too short, and the copy does not pay. */
    x = to_nhwc(x);
    a = t_get(x, fn);
    if (!a) return NONE;
    nhwc = true;
  }
  if (simple) {
    /* pad first, so the convolution proper is "valid" on xin and gets an efficient custom backward */
    xin = tg_pad(x, (const int64_t[]){0, 0, 0, 0, pads[0], pads[1], pads[2], pads[3]}, 8, 0.0);
    ain = t_get(xin, fn);
    if (!ain) return done(o, xin);
    memset(pads, 0, sizeof pads);
  }
  /* (bs, groups*cin, oy, ox, kh, kw) windows -> (bs, groups, rcout, oy, ox, cin, kh, kw) */
  tg_tensor win0 = pad_pool2(xin, ain, pads, 0.0, k, s, d), r;
  /* the channels-last form reads a detached weight: its gradient comes from the custom backward.
   * Where that backward cannot reach the consumers (a multi-device convolution whose weight is
   * sharded: each output shard then reads every input shard), it is built again on the weight
   * itself, and autograd differentiates the graph. */
  for (bool detach = true;; detach = false) {
    tg_tensor win = win0;
    if (chlast) {
      tg_tensor wsrc = detach ? tg_detach(weight) : weight;
      /* channels-last accumulation: the kernel's output is (bs, oy, ox, cout), contiguous along cout,
       * with the weight copied to (cin, kh, kw, cout), so the channel axis vectorizes even when output
       * rows are short (6 or 10 wide); the result is viewed back as (bs, cout, oy, ox) */
      tg_tensor wr;
      if (nhwc) { /* reduce in (kh, kw, cin) order: the loads of a channels-last input run along cin */
        win = tg_permute(win, (const int[]){0, 2, 3, 4, 5, 1}, 6); /* (bs, oy, ox, kh, kw, cin) */
        win = tg_reshape(win, (const int64_t[]){bs, oy, ox, 1, kh, kw, cin}, 7);
        win = tg_expand(win, (const int64_t[]){bs, oy, ox, cout, kh, kw, cin}, 7);
        tg_tensor wl = tg_contiguous(tg_permute(wsrc, (const int[]){2, 3, 1, 0}, 4)); /* (kh, kw, cin, cout) */
        wr = tg_reshape(tg_permute(wl, (const int[]){3, 0, 1, 2}, 4), (const int64_t[]){1, 1, 1, cout, kh, kw, cin}, 7);
      } else {
        win = tg_permute(win, (const int[]){0, 2, 3, 1, 4, 5}, 6); /* (bs, oy, ox, cin, kh, kw) */
        win = tg_reshape(win, (const int64_t[]){bs, oy, ox, 1, cin, kh, kw}, 7);
        win = tg_expand(win, (const int64_t[]){bs, oy, ox, cout, cin, kh, kw}, 7);
        tg_tensor wl = tg_contiguous(tg_permute(wsrc, (const int[]){1, 2, 3, 0}, 4)); /* (cin, kh, kw, cout) */
        wr = tg_reshape(tg_permute(wl, (const int[]){3, 0, 1, 2}, 4), (const int64_t[]){1, 1, 1, cout, cin, kh, kw}, 7);
      }
      r = conv_sum(tg_mul(win, wr), (const int[]){-1, -2, -3}, 3, false, sdt);
      r = tg_permute(r, (const int[]){0, 3, 1, 2}, 4);
    } else {
      win = tg_reshape(win, (const int64_t[]){bs, groups, cin, 1, oy, ox, kh, kw}, 8);
      win = tg_expand(win, (const int64_t[]){bs, groups, cin, rcout, oy, ox, kh, kw}, 8);
      win = tg_permute(win, (const int[]){0, 1, 3, 4, 5, 2, 6, 7}, 8);
      tg_tensor wr = tg_reshape(weight, (const int64_t[]){1, groups, rcout, 1, 1, cin, kh, kw}, 8);
      r = conv_sum(tg_mul(win, wr), (const int[]){-1, -2, -3}, 3, true, sdt);
      r = tg_reshape(r, (const int64_t[]){bs, cout, oy, ox}, 4);
    }
    if (simple) {
      UOp *ru = t_get(r, fn), *wu = t_get(weight, fn);
      bool custom = false;
      if (ru && wu && tg_dtype_is_float((tg_dtype)ru->dtype)) {
        UOp *ins[2] = {ain, wu};
        custom = ag_set_custom_grad(ru, ins, 2, conv_valid_grad);
      }
      /* without the custom backward (an integer input, such as uint8 images, times a float weight) the
       * weight must not stay detached: autograd then differentiates the graph */
      if (!custom && chlast && detach) continue;
    }
    break;
  }
  r = tg_cast(r, conv_out_dtype(sdt, tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)w->dtype)));
  if (b) r = tg_add(r, tg_reshape(bias, (const int64_t[]){1, cout, 1, 1}, 4));
  return done(o, r);
}

/* Convolution over nsp >= 3 spatial dims (or any count, but 1 and 2 go through tg_conv2d): tinygrad's
 * conv2d on windows of the padded input, (bs, groups*cin, o..., k...) -> (bs, groups, rcout, o...,
 * cin, k...) times the weight, reduced over (cin, k...). Autograd differentiates the window views. */
static tg_tensor conv_generic(const char *fn, tg_tensor x, UOp *a, tg_tensor weight, UOp *w, tg_tensor bias,
                              int nsp, int64_t groups, const int64_t *s, const int64_t *d, const int64_t *pads,
                              tg_dtype dtype) {
  int64_t bs = a->shape[0], cout = w->shape[0], cin = w->shape[1], rcout = cout / groups;
  int64_t sh[MAXD], o[TG_WINDOW_MAXDIMS], k[TG_WINDOW_MAXDIMS];
  for (int j = 0; j < nsp; j++) {
    k[j] = w->shape[2 + j];
    o[j] = cdiv(a->shape[2 + j] + pads[2 * j] + pads[2 * j + 1] - d[j] * (k[j] - 1), s[j]);
  }
  NnOp op = begin(fn);
  tg_tensor win = pad_pool(x, a, nsp, pads, 0.0, k, s, d); /* (bs, groups*cin, o..., k...) */
  int n = 0;
  sh[n++] = bs, sh[n++] = groups, sh[n++] = cin, sh[n++] = 1;
  for (int j = 0; j < nsp; j++) sh[n++] = o[j];
  for (int j = 0; j < nsp; j++) sh[n++] = k[j];
  win = tg_reshape(win, sh, n);
  sh[3] = rcout;
  win = tg_expand(win, sh, n);
  int perm[MAXD], m = 0;
  perm[m++] = 0, perm[m++] = 1, perm[m++] = 3;
  for (int j = 0; j < nsp; j++) perm[m++] = 4 + j;
  perm[m++] = 2;
  for (int j = 0; j < nsp; j++) perm[m++] = 4 + nsp + j;
  win = tg_permute(win, perm, n); /* (bs, groups, rcout, o..., cin, k...) */
  int64_t wsh[MAXD];
  m = 0;
  wsh[m++] = 1, wsh[m++] = groups, wsh[m++] = rcout;
  for (int j = 0; j < nsp; j++) wsh[m++] = 1;
  wsh[m++] = cin;
  for (int j = 0; j < nsp; j++) wsh[m++] = k[j];
  tg_tensor wr = tg_reshape(weight, wsh, m);
  int ax[TG_WINDOW_MAXDIMS + 1];
  for (int j = 0; j <= nsp; j++) ax[j] = -1 - j;
  tg_tensor r = conv_sum(tg_mul(win, wr), ax, nsp + 1, false, dtype); /* (bs, groups, rcout, o...) */
  m = 0;
  sh[m++] = bs, sh[m++] = cout;
  for (int j = 0; j < nsp; j++) sh[m++] = o[j];
  r = tg_reshape(r, sh, m);
  r = tg_cast(r, conv_out_dtype(dtype, tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)w->dtype)));
  if (bias.id) {
    sh[1] = cout;
    for (int j = 0; j < m; j++) if (j != 1) sh[j] = 1;
    r = tg_add(r, tg_reshape(bias, sh, m));
  }
  return done(op, r);
}

/* Checks the shapes of an n-d convolution: x (bs, groups*cin, spatial...), weight (cout, cin, k...). */
static bool conv_shapes_ok(const char *fn, UOp *a, UOp *w, UOp *b, int64_t groups) {
  if (w->ndim < 3 || w->ndim - 2 > TG_WINDOW_MAXDIMS || a->ndim != w->ndim) {
    tg_set_error(TG_ERR_INVALID,
                 "%s: input %s must be (batch, cin, spatial...) and weight %s (cout, cin/groups, kernel...) with "
                 "the same 1..%d spatial dims",
                 fn, SHP(a), SHP(w), TG_WINDOW_MAXDIMS);
    return false;
  }
  if (groups < 1) return tg_set_error(TG_ERR_INVALID, "%s: groups %lld must be positive", fn, (long long)groups), false;
  int64_t gcin;
  if (__builtin_mul_overflow(groups, w->shape[1], &gcin) || gcin != a->shape[1]) {
    tg_set_error(TG_ERR_INVALID, "%s: input %s has %lld channels but weight %s with groups=%lld expects groups*cin",
                 fn, SHP(a), (long long)a->shape[1], SHP(w), (long long)groups);
    return false;
  }
  if (w->shape[0] % groups) {
    tg_set_error(TG_ERR_INVALID, "%s: cout %lld of weight %s is not divisible by groups=%lld", fn,
                 (long long)w->shape[0], SHP(w), (long long)groups);
    return false;
  }
  for (int j = 2; j < w->ndim; j++)
    if (w->shape[j] < 1) return tg_set_error(TG_ERR_INVALID, "%s: weight %s has an empty kernel", fn, SHP(w)), false;
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
    tg_set_error(TG_ERR_INVALID, "%s: bias has shape %s but the weight %s needs (%lld,)", fn, SHP(b), SHP(w),
                 (long long)w->shape[0]);
    return false;
  }
  return same_device(fn, a, w, "weight") && (!b || same_device(fn, a, b, "bias"));
}

/* The n-d convolution once its options are resolved (pads: (before, after) per spatial dim). One and
 * two spatial dims run as tg_conv2d (a 1-d one on (bs, cin, 1, L)), which has the tuned kernels and
 * backward; more go through conv_generic. */
typedef struct {
  const char *fn;
  int64_t groups;
  const int64_t *s, *d, *pads;
} ConvNdArgs;
static tg_tensor conv_nd_nobias(tg_tensor x, tg_tensor w, tg_dtype dtype, void *ctx) {
  const ConvNdArgs *c = ctx;
  return conv_nd_resolved(c->fn, x, w, (tg_tensor){0}, c->groups, c->s, c->d, c->pads, dtype);
}

static tg_tensor conv_nd_dtype_fn(tg_tensor x, tg_tensor w, tg_tensor bias, tg_dtype dtype, void *ctx) {
  const ConvNdArgs *c = ctx;
  return conv_nd_resolved(c->fn, x, w, bias, c->groups, c->s, c->d, c->pads, dtype);
}

tg_tensor conv_nd_resolved(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, int64_t groups,
                           const int64_t *s, const int64_t *d, const int64_t *pads, tg_dtype dtype) {
  UOp *a = t_get(x, fn), *w = a ? t_get(weight, fn) : NULL, *b = NULL;
  if (!a || !w) return NONE;
  if (bias.id && !(b = t_get(bias, fn))) return NONE;
  if (!conv_sum_dtype(fn, dtype, tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)w->dtype), &dtype)) return NONE;
  {
    ConvNdArgs ca0 = {fn, groups, s, d, pads};
    tg_tensor wide;
    if (conv_exact_products(fn, x, weight, bias, a, w, dtype, conv_nd_dtype_fn, &ca0, &wide)) return wide;
  }
  if (!conv_shapes_ok(fn, a, w, b, groups)) return NONE;
  int nsp = w->ndim - 2;
  int64_t sp[TG_WINDOW_MAXDIMS], k[TG_WINDOW_MAXDIMS];
  for (int j = 0; j < nsp; j++) sp[j] = a->shape[2 + j], k[j] = w->shape[2 + j];
  if (!window_fits(fn, a, nsp, sp, pads, k, d, NULL)) return NONE;
  if (nsp != 2) {
    ConvNdArgs ca = {fn, groups, s, d, pads};
    tg_tensor hr;
    if (conv_half_via_float32(fn, x, weight, bias, a, w, dtype, conv_nd_nobias, &ca, &hr)) return hr;
    if (wino_dtype_ok(dtype) && wino_applies(a, w, nsp, s, d, pads, groups))
      return wino_conv(fn, x, weight, bias, groups, nsp, pads, dtype);
  }
  if (nsp > 2) {
    return conv_generic(fn, x, a, weight, w, bias, nsp, groups, s, d, pads, dtype);
  }
  NnOp op = begin(fn);
  tg_conv2d_opts co = {0};
  co.groups = groups, co.npadding = 4, co.dtype = dtype;
  tg_tensor r;
  if (nsp == 2) {
    co.stride[0] = s[0], co.stride[1] = s[1], co.dilation[0] = d[0], co.dilation[1] = d[1];
    co.padding[0] = pads[2], co.padding[1] = pads[3], co.padding[2] = pads[0], co.padding[3] = pads[1];
    r = tg_conv2d(x, weight, bias, &co);
  } else {
    co.stride[0] = 1, co.stride[1] = s[0], co.dilation[0] = 1, co.dilation[1] = d[0];
    co.padding[0] = pads[0], co.padding[1] = pads[1];
    r = tg_squeeze(tg_conv2d(tg_unsqueeze(x, 2), tg_unsqueeze(weight, 2), bias, &co), 2);
  }
  return done(op, r);
}

/* Reads the convolution fields of n-d options for nsp spatial dims. */
bool conv_opts_nd(const char *fn, const tg_window_opts *opts, int nsp, bool transposed, int64_t *groups,
                  int64_t *s, int64_t *d, int64_t *pads, int64_t *outpad) {
  static const tg_window_opts zero;
  if (!opts) opts = &zero;
  if (!nd_count_ok(fn, nsp)) return false;
  int64_t one[TG_WINDOW_MAXDIMS];
  for (int j = 0; j < TG_WINDOW_MAXDIMS; j++) one[j] = 1;
  for (int j = 0; j < TG_WINDOW_MAXDIMS; j++)
    if (opts->kernel_size[j])
      return tg_set_error(TG_ERR_INVALID, "%s: kernel_size is a pool option (the weight gives the kernel); leave it 0",
                          fn),
             false;
  if (opts->ceil_mode || opts->exclude_pad)
    return tg_set_error(TG_ERR_INVALID, "%s: ceil_mode and exclude_pad are pool options; leave them false", fn), false;
  if ((int)opts->dtype < 0 || opts->dtype >= TG_DTYPE_COUNT)
    return tg_set_error(TG_ERR_INVALID, "%s: invalid dtype %d (use a TG_* dtype or TG_DTYPE_DEFAULT)", fn,
                        (int)opts->dtype),
           false;
  *groups = opts->groups ? opts->groups : 1;
  if (!opt_dims(fn, "stride", opts->stride, nsp, one, s) || !opt_dims(fn, "dilation", opts->dilation, nsp, one, d) ||
      !opt_pads_nd(fn, opts->padding, opts->npadding, nsp, pads))
    return false;
  if (!transposed) {
    if (opts->noutput_padding)
      return tg_set_error(TG_ERR_INVALID, "%s: output_padding is a transposed-convolution option; leave it 0", fn),
             false;
    for (int j = 0; j < TG_WINDOW_MAXDIMS; j++)
      if (opts->output_padding[j])
        return tg_set_error(TG_ERR_INVALID, "%s: output_padding is a transposed-convolution option; leave it 0", fn),
               false;
    return true;
  }
  int no = opts->noutput_padding;
  for (int j = (no > 1 ? no : 1); j < TG_WINDOW_MAXDIMS; j++)
    if (opts->output_padding[j]) {
      tg_set_error(TG_ERR_INVALID, "%s: output_padding has an entry at position %d but noutput_padding is %d", fn, j,
                   no);
      return false;
    }
  if (no == 0 || no == 1) {
    for (int j = 0; j < nsp; j++) outpad[j] = opts->output_padding[0];
  } else if (no == nsp) {
    for (int j = 0; j < nsp; j++) outpad[j] = opts->output_padding[j];
  } else {
    tg_set_error(TG_ERR_INVALID, "%s: noutput_padding is %d; use 1 (every dim) or %d (one per spatial dim)", fn, no,
                 nsp);
    return false;
  }
  return true;
}

tg_tensor tg_conv_nd(tg_tensor x, tg_tensor weight, tg_tensor bias, const tg_window_opts *opts) {
  const char *fn = "tg_conv_nd";
  UOp *w = t_get(weight, fn);
  if (!w || !t_get(x, fn)) return NONE;
  int64_t g, s[TG_WINDOW_MAXDIMS], d[TG_WINDOW_MAXDIMS], pads[2 * TG_WINDOW_MAXDIMS];
  if (w->ndim < 3)
    return fail("%s: weight %s must be (cout, cin/groups, kernel...) with at least one spatial dim", fn, SHP(w));
  if (!conv_opts_nd(fn, opts, w->ndim - 2, false, &g, s, d, pads, NULL)) return NONE;
  return conv_nd_resolved(fn, x, weight, bias, g, s, d, pads, opts ? opts->dtype : TG_DTYPE_DEFAULT);
}

tg_tensor tg_dot(tg_tensor x, tg_tensor w) {
  const char *fn = "tg_dot";
  UOp *a = t_get(x, fn), *b = a ? t_get(w, fn) : NULL;
  if (!a || !b) return NONE;
  NnOp o = begin(fn);
  return done(o, tg_matmul(x, w));
}

tg_tensor tg_dot_dtype(tg_tensor x, tg_tensor w, tg_dtype dtype) {
  const char *fn = "tg_dot_dtype";
  UOp *a = t_get(x, fn), *b = a ? t_get(w, fn) : NULL;
  if (!a || !b) return NONE;
  NnOp o = begin(fn);
  return done(o, tg_matmul_dtype(x, w, dtype));
}

static tg_tensor linear_impl(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, tg_dtype dtype);

tg_tensor tg_linear(tg_tensor x, tg_tensor weight, tg_tensor bias) {
  return linear_impl("tg_linear", x, weight, bias, TG_DTYPE_DEFAULT);
}

/* tinygrad's linear(dtype=): x, weight and bias are cast to dtype first */
tg_tensor tg_linear_dtype(tg_tensor x, tg_tensor weight, tg_tensor bias, tg_dtype dtype) {
  if ((int)dtype < 0 || dtype >= TG_DTYPE_COUNT) return fail("tg_linear_dtype: invalid dtype %d", (int)dtype);
  return linear_impl("tg_linear_dtype", x, weight, bias, dtype);
}

static tg_tensor linear_impl(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, tg_dtype dtype) {
  UOp *a = t_get(x, fn), *w = a ? t_get(weight, fn) : NULL, *b = NULL;
  if (!a || !w) return NONE;
  if (bias.id && !(b = t_get(bias, fn))) return NONE;
  if (a->ndim < 1)
    return fail("%s: input must have at least 1 dimension (..., in_features), got shape %s", fn, SHP(a));
  int64_t in = a->shape[a->ndim - 1];
  if (w->ndim == 2 ? w->shape[1] != in : (w->ndim != 1 || w->shape[0] != in))
    return fail("%s: weight %s does not fit input %s; the weight is (out_features, in_features) = (?, %lld) "
                "as in tinygrad's nn.Linear",
                fn, SHP(w), SHP(a), (long long)in);
  int64_t outf = w->ndim == 2 ? w->shape[0] : in;
  if (b && (b->ndim > 1 || (b->ndim == 1 && b->shape[0] != outf && b->shape[0] != 1)))
    return fail("%s: bias has shape %s but the output has %lld features", fn, SHP(b), (long long)outf);
  if (!same_device(fn, a, w, "weight") || (b && !same_device(fn, a, b, "bias"))) return NONE;
  NnOp o = begin(fn);
  if (dtype != TG_DTYPE_DEFAULT) {
    x = tg_cast(x, dtype), weight = tg_cast(weight, dtype);
    if (b) bias = tg_cast(bias, dtype);
  }
  tg_tensor r = w->ndim == 1 ? tg_mul(x, weight) : tg_matmul(x, tg_transpose(weight, 0, 1));
  if (b) r = tg_add(r, bias);
  return done(o, r);
}

/* ---------------------------------------------------------------------------------------------- */
/* functional nn                                                                                   */

tg_tensor tg_one_hot(tg_tensor x, int64_t num_classes) {
  const char *fn = "tg_one_hot";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (!tg_dtype_is_int((tg_dtype)a->dtype))
    return fail("%s: expects an integer tensor, got %s", fn, tg_dtype_name((tg_dtype)a->dtype));
  /* no -1 (infer from the largest label), as in tinygrad: a lazy library would have to realize x */
  if (num_classes < 0 || num_classes > ((int64_t)1 << 31))
    return fail("%s: num_classes %lld must be in 0..2^31 (it cannot be inferred: pass the class count)", fn,
                (long long)num_classes);
  if (a->ndim >= MAXD) return fail("%s: too many dimensions", fn);
  NnOp o = begin(fn);
  tg_tensor eq = tg_eq(tg_unsqueeze(x, -1), iarange(a, 0, (double)num_classes, 1));
  return done(o, tg_cast(eq, TG_INT32));
}

tg_tensor tg_layernorm(tg_tensor x, int naxes, double eps) {
  const char *fn = "tg_layernorm";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (naxes < 1 || naxes > a->ndim)
    return fail("%s: normalizes the last naxes dims; naxes=%d is out of range 1..%d for shape %s", fn, naxes,
                a->ndim, SHP(a));
  if (!(eps >= 0) || !isfinite(eps)) return fail("%s: eps %g must be a finite non-negative number", fn, eps);
  int ax[MAXD];
  for (int i = 0; i < naxes; i++) ax[i] = -1 - i;
  NnOp o = begin(fn);
  tg_tensor y = tg_sub(x, tg_mean(x, ax, naxes, true));
  tg_tensor v = tg_mean(tg_mul(y, y), ax, naxes, true);
  return done(o, tg_mul(y, tg_reciprocal(tg_sqrt(tg_add_s(v, eps)))));
}

tg_tensor tg_batchnorm(tg_tensor x, tg_tensor weight, tg_tensor bias, tg_tensor mean, tg_tensor invstd) {
  const char *fn = "tg_batchnorm";
  UOp *a = t_get(x, fn), *m = a ? t_get(mean, fn) : NULL, *is = m ? t_get(invstd, fn) : NULL, *w = NULL,
      *b = NULL;
  if (!a || !m || !is) return NONE;
  if (weight.id && !(w = t_get(weight, fn))) return NONE;
  if (bias.id && !(b = t_get(bias, fn))) return NONE;
  if (a->ndim < 2) return fail("%s: input %s must be (batch, channels, ...)", fn, SHP(a));
  int64_t c = a->shape[1];
  struct {
    UOp *u;
    const char *name;
  } per[3] = {{m, "mean"}, {w, "weight"}, {b, "bias"}};
  for (int i = 0; i < 3; i++)
    if (per[i].u && shape_numel(per[i].u->shape, per[i].u->ndim) != c)
      return fail("%s: %s has shape %s but the input %s has %lld channels (dim 1)", fn, per[i].name,
                  SHP(per[i].u), SHP(a), (long long)c);
  if (is->ndim == 1 && is->shape[0] != c)
    return fail("%s: invstd has shape %s but the input %s has %lld channels (dim 1)", fn, SHP(is), SHP(a),
                (long long)c);
  int64_t bs[MAXD];
  if (is->ndim != 1 && bcast_shape(fn, a->shape, a->ndim, is->shape, is->ndim, bs, "invstd") < 0) return NONE;
  UOp *dv[4] = {m, is, w, b};
  for (int i = 0; i < 4; i++)
    if (dv[i] && !same_device(fn, a, dv[i], "a parameter")) return NONE;
  int64_t sh[MAXD];
  for (int i = 0; i < a->ndim; i++) sh[i] = i == 1 ? c : 1;
  NnOp o = begin(fn);
  tg_tensor r = tg_sub(x, tg_reshape(mean, sh, a->ndim));
  if (w) r = tg_mul(r, tg_reshape(weight, sh, a->ndim));
  r = tg_mul(r, is->ndim == 1 ? tg_reshape(invstd, sh, a->ndim) : invstd);
  if (b) r = tg_add(r, tg_reshape(bias, sh, a->ndim));
  return done(o, r);
}

tg_tensor tg_batchnorm_axes(tg_tensor x, tg_tensor weight, tg_tensor bias, tg_tensor mean, tg_tensor invstd,
                            const int *axes, int naxes) {
  const char *fn = "tg_batchnorm_axes";
  UOp *a = t_get(x, fn), *m = a ? t_get(mean, fn) : NULL, *is = m ? t_get(invstd, fn) : NULL, *w = NULL,
      *b = NULL;
  if (!a || !m || !is) return NONE;
  if (weight.id && !(w = t_get(weight, fn))) return NONE;
  if (bias.id && !(b = t_get(bias, fn))) return NONE;
  if (!t_axes_count_ok(fn, axes, naxes, a->ndim)) return NONE;
  bool keep[MAXD] = {false};
  int64_t sh[MAXD], c = 1;
  for (int i = 0; i < naxes; i++) {
    int ax;
    if (norm_axis(fn, axes[i], a->ndim, &ax) < 0) return NONE;
    if (keep[ax]) return fail("%s: axis %d appears twice", fn, axes[i]);
    keep[ax] = true;
  }
  for (int i = 0; i < a->ndim; i++) sh[i] = keep[i] ? a->shape[i] : 1, c *= sh[i];
  /* the parameters hold one value per kept position (any shape with that many elements, reshaped);
   * invstd of another rank broadcasts against x as it is (tinygrad's rule) */
  struct {
    UOp *u;
    const char *name;
  } per[3] = {{m, "mean"}, {w, "weight"}, {b, "bias"}};
  for (int i = 0; i < 3; i++)
    if (per[i].u && shape_numel(per[i].u->shape, per[i].u->ndim) != c)
      return fail("%s: %s has shape %s but x %s kept over the %d axes has %lld elements per position", fn,
                  per[i].name, SHP(per[i].u), SHP(a), naxes, (long long)c);
  bool is_per = is->ndim == naxes;
  int64_t bs[MAXD];
  if (is_per && shape_numel(is->shape, is->ndim) != c)
    return fail("%s: invstd has shape %s but x %s kept over the %d axes has %lld elements per position", fn, SHP(is),
                SHP(a), naxes, (long long)c);
  if (!is_per && bcast_shape(fn, a->shape, a->ndim, is->shape, is->ndim, bs, "invstd") < 0) return NONE;
  UOp *dv[4] = {m, is, w, b};
  for (int i = 0; i < 4; i++)
    if (dv[i] && !same_device(fn, a, dv[i], "a parameter")) return NONE;
  NnOp o = begin(fn);
  tg_tensor r = tg_sub(x, tg_reshape(mean, sh, a->ndim));
  if (w) r = tg_mul(r, tg_reshape(weight, sh, a->ndim));
  r = tg_mul(r, is_per ? tg_reshape(invstd, sh, a->ndim) : invstd);
  if (b) r = tg_add(r, tg_reshape(bias, sh, a->ndim));
  return done(o, r);
}

tg_tensor tg_dropout(tg_tensor x, double p) {
  const char *fn = "tg_dropout";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (!(p >= 0 && p <= 1)) return fail("%s: p=%g is out of range [0, 1]", fn, p);
  if (!tg_getenv_int("TRAINING", 0) || p == 0) return same(a);
  NnOp o = begin(fn);
  if (p == 1) return done(o, tg_zeros_like(x, NULL));
  tg_opts ro = on_device(a, tg_default_float());
  tg_tensor keep = tg_contiguous(tg_ge(tg_rand(a->shape, a->ndim, &ro), tg_scalar(p, &ro)));
  /* The mask is realized now: a lazy random tensor evaluated by two separate realizes (the forward
   * value and the gradient) would draw two different masks, because the RNG counter it reads advances
   * in between. tinygrad's .contiguous() gets the same effect from its becomes_map. */
  if (tg_realize(keep) != TG_OK) return done(o, NONE);
  return done(o, tg_div_s(tg_where(keep, x, tg_const_like(x, 0)), 1.0 - p));
}

/* repeat_interleave(r, dim=-3): (..., H, S, E) -> (..., H*r, S, E), each head r times in a row (a view) */
static tg_tensor repeat_heads(tg_tensor t, UOp *u, int64_t r) {
  int n = u->ndim;
  int64_t sh[MAXD];
  for (int i = 0; i < n - 2; i++) sh[i] = u->shape[i];
  sh[n - 2] = 1, sh[n - 1] = u->shape[n - 2], sh[n] = u->shape[n - 1];
  tg_tensor e = tg_reshape(t, sh, n + 1);
  sh[n - 2] = r;
  e = tg_expand(e, sh, n + 1);
  int64_t out[MAXD];
  memcpy(out, u->shape, sizeof(int64_t) * (size_t)n);
  out[n - 3] *= r;
  return tg_reshape(e, out, n);
}

tg_tensor tg_scaled_dot_product_attention(tg_tensor q, tg_tensor k, tg_tensor v, tg_tensor attn_mask,
                                          const tg_sdpa_opts *opts) {
  const char *fn = "tg_scaled_dot_product_attention";
  UOp *qa = t_get(q, fn), *ka = qa ? t_get(k, fn) : NULL, *va = ka ? t_get(v, fn) : NULL, *ma = NULL;
  if (!qa || !ka || !va) return NONE;
  if (attn_mask.id && !(ma = t_get(attn_mask, fn))) return NONE;
  bool causal = opts && opts->is_causal;
  double dp = opts ? opts->dropout_p : 0.0;
  if (qa->ndim < 2 || ka->ndim < 2 || va->ndim < 2)
    return fail("%s: query %s, key %s and value %s need at least 2 dims (..., seq, features)", fn, SHP(qa),
                SHP(ka), SHP(va));
  int64_t e = qa->shape[qa->ndim - 1], L = qa->shape[qa->ndim - 2], S = ka->shape[ka->ndim - 2];
  if (ka->shape[ka->ndim - 1] != e)
    return fail("%s: query %s and key %s must have the same last dim (features)", fn, SHP(qa), SHP(ka));
  if (va->shape[va->ndim - 2] != S)
    return fail("%s: key %s and value %s must have the same sequence length (dim -2)", fn, SHP(ka), SHP(va));
  if (causal && ma) return fail("%s: cannot set attn_mask when is_causal is true", fn);
  int64_t gqa_k = 1, gqa_v = 1;
  if (opts && opts->enable_gqa) {
    /* grouped-query attention: each key / value head serves Hq / Hkv consecutive query heads (dim -3) */
    if (qa->ndim < 3 || ka->ndim < 3 || va->ndim < 3)
      return fail("%s: enable_gqa needs a heads dim (-3) in query %s, key %s and value %s", fn, SHP(qa), SHP(ka),
                  SHP(va));
    int64_t hq = qa->shape[qa->ndim - 3], hk = ka->shape[ka->ndim - 3], hv = va->shape[va->ndim - 3];
    if (!hk || !hv || hq % hk || hq % hv)
      return fail("%s: enable_gqa: the query's %lld heads are not a multiple of the key's %lld and the value's %lld "
                  "heads (query %s, key %s, value %s)",
                  fn, (long long)hq, (long long)hk, (long long)hv, SHP(qa), SHP(ka), SHP(va));
    gqa_k = hq / hk, gqa_v = hq / hv;
  }
  if (!(dp >= 0 && dp <= 1)) return fail("%s: dropout_p=%g is out of range [0, 1]", fn, dp);
  int64_t qk[MAXD], tmp[MAXD], kbatch[MAXD];
  memcpy(kbatch, ka->shape, sizeof(int64_t) * (size_t)(ka->ndim - 2));
  if (gqa_k > 1) kbatch[ka->ndim - 3] *= gqa_k;
  int n = bcast_shape(fn, qa->shape, qa->ndim - 2, kbatch, ka->ndim - 2, qk, "query/key batch dims");
  if (n < 0 || n + 2 > MAXD) return NONE;
  qk[n] = L, qk[n + 1] = S;
  if (ma && bcast_shape(fn, qk, n + 2, ma->shape, ma->ndim, tmp, "attn_mask") < 0) return NONE;
  if (!same_device(fn, qa, ka, "key") || !same_device(fn, qa, va, "value") ||
      (ma && !same_device(fn, qa, ma, "attn_mask")))
    return NONE;
  NnOp o = begin(fn);
  if (gqa_k > 1) k = repeat_heads(k, ka, gqa_k);
  if (gqa_v > 1) v = repeat_heads(v, va, gqa_v);
  tg_dtype acc = tg_dtype_promote(tg_dtype_promote((tg_dtype)qa->dtype, (tg_dtype)ka->dtype), TG_FLOAT32);
  /* the key, transposed, is stored as (..., features, keys) first when both sequences are long:
   * the scores' kernel then runs along contiguous keys as a matmul does (vector lanes over the
   * output), not along the few features of each dot product with a horizontal sum per score
   * (BERT encoder, 32 x 128 tokens, 12 heads of 32: 22.9 -> 8.4 ms a layer, the copy 0.7 ms). The
   * query is stored too: each of its values is read once per 16 keys, and what produced it (a
   * linear's bias add, float16 roundings) would be recomputed in the inner loop every time (8.4 ->
   * 5.5 ms; float16: 21.4 -> 5.8 ms). A single query (a decode step over a cache) reads each key
   * once and keeps both in place. */
  tg_tensor kt = tg_transpose(tg_cast(k, acc), -2, -1);
  tg_tensor qf = tg_cast(q, acc);
  if (L >= 16 && S >= 16) kt = tg_contiguous(kt), qf = tg_contiguous(qf);
  tg_tensor s = tg_div_s(tg_matmul(qf, kt), sqrt((double)e));
  tg_tensor mask = ma ? attn_mask : NONE;
  if (causal) {
    UOp *su = t_get(s, fn);
    mask = su ? tg_tril(tg_ones_like(s, TG_OPTS(.dtype = TG_BOOL)), 0) : NONE;
  }
  if (mask.id) {
    UOp *mu = t_get(mask, fn);
    if (mu && mu->dtype == TG_BOOL) {
      tg_opts fo = on_device(qa, tg_default_float());
      mask = tg_where(mask, tg_scalar(0.0, &fo), tg_scalar(-INFINITY, &fo));
    }
    s = tg_add(s, mask);
  }
  tg_tensor att = tg_dropout(tg_softmax(tg_cast(s, (tg_dtype)qa->dtype), -1), dp);
  return done(o, tg_matmul(att, v));
}

/* ---------------------------------------------------------------------------------------------- */
/* losses                                                                                          */

static bool reduction_ok(const char *fn, const tg_loss_opts *o) {
  if (o && (o->reduction < TG_REDUCTION_MEAN || o->reduction > TG_REDUCTION_NONE)) {
    tg_set_error(TG_ERR_INVALID,
                 "%s: reduction %d is not one of TG_REDUCTION_MEAN, TG_REDUCTION_SUM, TG_REDUCTION_NONE", fn,
                 (int)o->reduction);
    return false;
  }
  return true;
}

/* Fields a loss does not use must stay zero, so a misplaced option is an error, not ignored. */
static bool unused_opts(const char *fn, const tg_loss_opts *o, bool smoothing, bool ignore, bool weight,
                        bool pos_weight) {
  if (!o) return true;
  const char *bad = NULL;
  if (!smoothing && o->label_smoothing != 0)
    bad = "label_smoothing";
  else if (!ignore && o->use_ignore_index)
    bad = "ignore_index";
  else if (!weight && o->weight.id)
    bad = "weight";
  else if (!pos_weight && o->pos_weight.id)
    bad = "pos_weight";
  if (bad) {
    tg_set_error(TG_ERR_INVALID, "%s: option %s is not supported by this loss", fn, bad);
    return false;
  }
  if (smoothing && !(o->label_smoothing >= 0 && o->label_smoothing <= 1)) {
    tg_set_error(TG_ERR_INVALID, "%s: label_smoothing %g must be in [0, 1]", fn, o->label_smoothing);
    return false;
  }
  return true;
}

static tg_tensor do_reduction(tg_tensor x, const tg_loss_opts *o) {
  tg_reduction r = o ? o->reduction : TG_REDUCTION_MEAN;
  if (r == TG_REDUCTION_NONE) return x;
  return r == TG_REDUCTION_SUM ? tg_sum(x, NULL, 0, false) : tg_mean(x, NULL, 0, false);
}

/* prediction x and target y must broadcast (tinygrad broadcasts; torch wants equal shapes) */
static bool xy_ok(const char *fn, UOp *a, UOp *y) {
  int64_t tmp[MAXD];
  return bcast_shape(fn, a->shape, a->ndim, y->shape, y->ndim, tmp, "input and target") >= 0 &&
         same_device(fn, a, y, "target");
}

tg_tensor tg_binary_crossentropy(tg_tensor x, tg_tensor y, const tg_loss_opts *opts) {
  const char *fn = "tg_binary_crossentropy";
  UOp *a = t_get(x, fn), *t = a ? t_get(y, fn) : NULL;
  if (!a || !t) return NONE;
  if (!reduction_ok(fn, opts) || !unused_opts(fn, opts, false, false, false, false) || !xy_ok(fn, a, t))
    return NONE;
  NnOp o = begin(fn);
  tg_tensor l1 = tg_mul(tg_neg(y), tg_log(x));
  tg_tensor l2 = tg_mul(tg_rsub_s(1, y), tg_log(tg_rsub_s(1, x)));
  return done(o, do_reduction(tg_sub(l1, l2), opts));
}

/* log(sigmoid(x)) = min(x, 0) - log(1 + exp(-|x|)), stable for large |x| */
static tg_tensor logsigmoid(tg_tensor x) {
  tg_tensor ab = tg_maximum(x, tg_neg(x));
  return tg_sub(tg_minimum_s(x, 0), tg_log(tg_add_s(tg_exp(tg_neg(ab)), 1)));
}

tg_tensor tg_binary_crossentropy_logits(tg_tensor x, tg_tensor y, const tg_loss_opts *opts) {
  const char *fn = "tg_binary_crossentropy_logits";
  UOp *a = t_get(x, fn), *t = a ? t_get(y, fn) : NULL, *pw = NULL;
  if (!a || !t) return NONE;
  if (!reduction_ok(fn, opts) || !unused_opts(fn, opts, false, false, false, true) || !xy_ok(fn, a, t))
    return NONE;
  if (opts && opts->pos_weight.id) {
    if (!(pw = t_get(opts->pos_weight, fn))) return NONE;
    int64_t tmp[MAXD];
    if (bcast_shape(fn, a->shape, a->ndim, pw->shape, pw->ndim, tmp, "input and pos_weight") < 0 ||
        !same_device(fn, a, pw, "pos_weight"))
      return NONE;
  }
  NnOp o = begin(fn);
  tg_tensor pos = tg_mul(y, logsigmoid(x));
  if (pw) pos = tg_mul(opts->pos_weight, pos);
  tg_tensor neg = tg_mul(tg_rsub_s(1, y), logsigmoid(tg_neg(x)));
  return done(o, do_reduction(tg_neg(tg_add(pos, neg)), opts));
}

/* labels y must have the shape of x without dim `cdim`, an integer dtype, and x's device */
static bool labels_ok(const char *fn, UOp *a, UOp *y, int cdim) {
  bool ok = y->ndim == a->ndim - 1;
  for (int i = 0, j = 0; ok && i < a->ndim; i++)
    if (i != cdim) ok = y->shape[j++] == a->shape[i];
  if (!ok) {
    char s1[256], s2[256];
    tg_set_error(
        TG_ERR_INVALID,
        "%s: labels have shape %s but the input %s needs labels of its shape without the class dim %d", fn,
        shp(s1, sizeof s1, y), shp(s2, sizeof s2, a), cdim);
    return false;
  }
  if (!tg_dtype_is_int((tg_dtype)y->dtype)) {
    tg_set_error(TG_ERR_INVALID, "%s: labels have dtype %s; class indices must be an integer tensor", fn,
                 tg_dtype_name((tg_dtype)y->dtype));
    return false;
  }
  return same_device(fn, a, y, "labels");
}

tg_tensor tg_sparse_categorical_crossentropy(tg_tensor logits, tg_tensor labels, const tg_loss_opts *opts) {
  const char *fn = "tg_sparse_categorical_crossentropy";
  UOp *a = t_get(logits, fn), *y = a ? t_get(labels, fn) : NULL;
  if (!a || !y) return NONE;
  if (a->ndim < 1)
    return fail("%s: logits must have at least 1 dim (..., classes), got shape %s", fn, SHP(a));
  if (!reduction_ok(fn, opts) || !unused_opts(fn, opts, true, true, false, false) ||
      !labels_ok(fn, a, y, a->ndim - 1))
    return NONE;
  double ls = opts ? opts->label_smoothing : 0.0;
  NnOp o = begin(fn);
  tg_tensor lp = tg_log_softmax(logits, -1);
  tg_tensor mask = (opts && opts->use_ignore_index)
                       ? tg_ne(labels, tg_scalar((double)opts->ignore_index,
                                                 TG_OPTS(.dtype = TG_INT64, .device = tg_device_of(labels))))
                       : tg_ones_like(labels, TG_OPTS(.dtype = TG_BOOL));
  tg_tensor oh =
      tg_bitwise_and(tg_eq(tg_unsqueeze(labels, -1), iarange(a, 0, (double)a->shape[a->ndim - 1], 1)),
                     tg_unsqueeze(mask, -1));
  /* the label's log-probability picked out by a select, not a product with the one-hot: a -inf
   * logit in another column (probability 0) leaves the loss finite, as in tinygrad (whose graph
   * rewrites turn the product into that select) and PyTorch */
  tg_tensor picked = tg_where(oh, lp, tg_zeros_like(lp, NULL));
  tg_tensor unred = tg_mul_s(tg_sum(picked, (const int[]){-1}, 1, false), 1 - ls);
  /* the smoothing term only where there is smoothing: at 0 it would read every logit once more (and
   * once more in the backward pass) to add zeros, and 0 * mean(...) would turn a -inf logit into a NaN
   * loss where tinygrad folds the product away and PyTorch leaves the term out */
  if (ls != 0) unred = tg_add(unred, tg_mul_s(tg_mul(tg_mean(lp, (const int[]){-1}, 1, false), mask), ls));
  tg_reduction r = opts ? opts->reduction : TG_REDUCTION_MEAN;
  tg_tensor res = r == TG_REDUCTION_MEAN
                      ? tg_div(tg_neg(tg_sum(unred, NULL, 0, false)), tg_sum(mask, NULL, 0, false))
                      : tg_neg(do_reduction(unred, opts));
  return done(o, res);
}

tg_tensor tg_cross_entropy(tg_tensor x, tg_tensor y, const tg_loss_opts *opts) {
  const char *fn = "tg_cross_entropy";
  UOp *a = t_get(x, fn), *t = a ? t_get(y, fn) : NULL;
  if (!a || !t) return NONE;
  if (a->ndim < 1)
    return fail("%s: input must be (classes,) or (batch, classes, ...), got shape %s", fn, SHP(a));
  if (!reduction_ok(fn, opts) || !unused_opts(fn, opts, true, false, false, false)) return NONE;
  int cdim = a->ndim == 1 ? 0 : 1;
  bool probs = t->ndim == a->ndim && !memcmp(t->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
  if (!probs && !labels_ok(fn, a, t, cdim)) return NONE;
  if (probs && !same_device(fn, a, t, "target")) return NONE;
  double ls = opts ? opts->label_smoothing : 0.0;
  int64_t c = a->shape[cdim];
  NnOp o = begin(fn);
  tg_tensor yy = y;
  if (!probs) {
    int64_t rs[MAXD];
    rs[0] = c;
    for (int i = 1; i < a->ndim - cdim; i++) rs[i] = 1;
    yy = tg_eq(tg_unsqueeze(y, cdim), tg_reshape(iarange(a, 0, (double)c, 1), rs, a->ndim - cdim));
  }
  tg_dtype ydt = probs && tg_dtype_is_float((tg_dtype)t->dtype) ? (tg_dtype)t->dtype : tg_default_float();
  int cd[1] = {cdim};
  tg_tensor lsm = tg_log_softmax(x, cdim), l;
  if (!probs && ls == 0) { /* class indices: the label's log-probability selected (see above) */
    l = tg_neg(tg_sum(tg_where(yy, lsm, tg_zeros_like(lsm, NULL)), cd, 1, false));
  } else {
    yy = tg_add_s(tg_mul_s(tg_cast(yy, ydt), 1 - ls), ls / (double)c);
    l = tg_neg(tg_sum(tg_mul(lsm, yy), cd, 1, false));
  }
  return done(o, do_reduction(l, opts));
}

tg_tensor tg_nll_loss(tg_tensor x, tg_tensor y, const tg_loss_opts *opts) {
  const char *fn = "tg_nll_loss";
  UOp *a = t_get(x, fn), *t = a ? t_get(y, fn) : NULL, *wu = NULL;
  if (!a || !t) return NONE;
  if (a->ndim < 1)
    return fail("%s: input must be (classes,) or (batch, classes, ...) log-probabilities, got shape %s", fn,
                SHP(a));
  if (!reduction_ok(fn, opts) || !unused_opts(fn, opts, false, true, true, false)) return NONE;
  int cdim = a->ndim == 1 ? 0 : 1;
  if (!labels_ok(fn, a, t, cdim)) return NONE;
  int64_t c = a->shape[cdim];
  if (opts && opts->weight.id) {
    if (!(wu = t_get(opts->weight, fn))) return NONE;
    if (wu->ndim != 1 || wu->shape[0] != c)
      return fail("%s: weight has shape %s but there are %lld classes; it must be (%lld,)", fn, SHP(wu),
                  (long long)c, (long long)c);
    if (!same_device(fn, a, wu, "weight")) return NONE;
  }
  NnOp o = begin(fn);
  tg_tensor xx = x, yy = y;
  if (a->ndim == 1) xx = tg_unsqueeze(x, 0), yy = tg_unsqueeze(y, 0);
  UOp *xu = t_get(xx, fn), *yu = t_get(yy, fn);
  if (!xu || !yu) return done(o, NONE);
  tg_tensor w;
  if (wu) {
    int64_t flat = shape_numel(yu->shape, yu->ndim);
    tg_tensor fy = tg_reshape(yy, &flat, 1);
    UOp *fu = t_get(fy, fn);
    w = fu ? tg_reshape(gather_impl(opts->weight, wu, 0, fy, fu), yu->shape, yu->ndim) : NONE;
  } else {
    w = tg_ones_like(yy, TG_OPTS(.dtype = tg_default_float()));
  }
  if (opts && opts->use_ignore_index)
    w = tg_mul(w, tg_ne(yy, tg_scalar((double)opts->ignore_index,
                                      TG_OPTS(.dtype = TG_INT64, .device = tg_device_of(yy)))));
  tg_tensor yi = tg_unsqueeze(yy, 1);
  UOp *yiu = t_get(yi, fn);
  tg_tensor picked = yiu ? tg_squeeze(gather_impl(xx, xu, 1, yi, yiu), 1) : NONE;
  tg_tensor nll = tg_mul(tg_neg(picked), w);
  tg_reduction r = opts ? opts->reduction : TG_REDUCTION_MEAN;
  tg_tensor res;
  if (r == TG_REDUCTION_MEAN)
    res = tg_div(tg_sum(nll, NULL, 0, false), tg_sum(w, NULL, 0, false));
  else if (r == TG_REDUCTION_SUM)
    res = tg_sum(nll, NULL, 0, false);
  else
    res = a->ndim == 1 ? tg_reshape(nll, NULL, 0) : nll;
  return done(o, res);
}
