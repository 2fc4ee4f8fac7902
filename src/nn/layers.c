/*
 * layers.c -- tinygrad's nn layers (Linear, Conv1d/2d, ConvTranspose1d/2d, BatchNorm, GroupNorm,
 * InstanceNorm, LayerNorm, LayerNorm2d, RMSNorm, Embedding, LSTMCell), the initializers they use
 * (kaiming/glorot/scaled uniform, randperm, rand_like), tg_conv_transpose2d, and the model-state
 * helpers tg_load_state_dict / tg_state_dict_parameters.
 *
 * In: sizes and options (init), input tensors (forward), state dicts (load). Out: layers whose
 * parameters are realized root-scope handles owned by the layer; lazy forward results in the caller's
 * scope; state dict entries named as tinygrad / PyTorch name them.
 * Invariants: every forward composes public ops inside its own scope and moves only the result out,
 * so it leaks no handles and re-labels an inner error with its own name. A state dict holds views
 * (tg_detach) of the parameters' buffers; tg_load_state_dict writes through to the buffer and moves
 * every live handle of that buffer to the written version, and tg_state_dict_parameters maps an entry
 * back to the live handle that owns its buffer (the slot table is tinygrad's all_tensors registry).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../helpers.h"
#include "../tensor/compose.h"
#include "../tensor/tensor.h"
#include "../uop/ptrmap.h"
#include "state_dict.h"

#define NONE ((tg_tensor){0})

/* ---------------------------------------------------------------------------------------------- */
/* composition helpers                                                                             */

typedef struct {
  const char *fn;
  bool had; /* an error was already recorded before the op started */
} NnOp;

static NnOp op_begin(const char *fn) {
  NnOp o = {fn, tg_has_error()};
  tg_scope_begin();
  return o;
}

/* Re-records the first error as "fn: <inner message>" unless it already names fn (or predates the op). */
static void relabel(NnOp o) {
  const char *m = tg_last_error();
  size_t fl = strlen(o.fn);
  if (o.had || !m || (strncmp(m, o.fn, fl) == 0 && m[fl] == ':')) return;
  char buf[1400];
  snprintf(buf, sizeof buf, "%s: %s", o.fn, m);
  tg_status st = tg_last_status();
  tg_clear_error();
  tg_set_error(st, "%s", buf);
}

/* Closes the op's scope, moving r out to the caller's scope. */
static tg_tensor op_done(NnOp o, tg_tensor r) {
  if (tg_valid(r) && !(tg_has_error() && !o.had)) {
    r = tg_keep(r);
  } else {
    r = NONE;
    relabel(o);
  }
  tg_scope_end();
  return r;
}

static tg_status op_done_status(NnOp o, tg_status st) {
  if (st == TG_OK && tg_has_error() && !o.had) st = tg_last_status();
  if (st != TG_OK) relabel(o);
  tg_scope_end();
  if (st != TG_OK && !tg_has_error()) st = tg_set_error(st, "%s: failed", o.fn);
  return st;
}

#define fail op_fail /* (compose.h) */

static const char *shape_str(char *buf, size_t n, tg_tensor t) {
  int64_t s[64];
  int nd = tg_ndim(t);
  if (nd < 0 || nd > 64) return "(?)";
  tg_shape(t, s);
  return fmt_shape(buf, n, s, nd);
}
#define TSHP(t) shape_str((char[256]){0}, 256, (t)) /* of a handle (compose.h's SHP takes a UOp) */

static int64_t prod(const int64_t *s, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; i++) p *= s[i];
  return p;
}

/* ---------------------------------------------------------------------------------------------- */
/* initializers                                                                                    */

static bool check_shape(const char *fn, const int64_t *shape, int ndim) {
  if (ndim < 0 || ndim > 64 || (ndim > 0 && !shape)) {
    tg_set_error(TG_ERR_INVALID, "%s: invalid shape (ndim=%d, shape %s)", fn, ndim, shape ? "given" : "NULL");
    return false;
  }
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) {
      tg_set_error(TG_ERR_INVALID, "%s: negative dimension %lld in shape", fn, (long long)shape[i]);
      return false;
    }
  /* also keeps the fan products below (prod) within int64 */
  if (!shape_fits(shape, ndim)) {
    tg_set_error(TG_ERR_INVALID, "%s: shape %s is too large (its non-zero dimensions multiply past 2^48)", fn,
                 FSHP(shape, ndim));
    return false;
  }
  return true;
}

/* uniform(-bound, bound) with requires_grad applied to the result only. */
static tg_tensor sym_uniform(const char *fn, const int64_t *shape, int ndim, double bound,
                             const tg_opts *opts) {
  if (!(bound > 0) || !isfinite(bound))
    return fail("%s: the bound %g computed from the shape is not a positive finite number (empty fan?)", fn,
                bound);
  NnOp o = op_begin(fn);
  return op_done(o, tg_uniform(shape, ndim, -bound, bound, opts));
}

tg_tensor tg_kaiming_uniform(const int64_t *shape, int ndim, double a, const tg_opts *opts) {
  const char *fn = "tg_kaiming_uniform";
  if (!check_shape(fn, shape, ndim)) return NONE;
  int64_t fan = ndim > 1 ? prod(shape + 1, ndim - 1) : 1;
  return sym_uniform(fn, shape, ndim, sqrt(6.0 / (1.0 + a * a) / (double)fan), opts);
}

tg_tensor tg_kaiming_normal(const int64_t *shape, int ndim, double a, const tg_opts *opts) {
  const char *fn = "tg_kaiming_normal";
  if (!check_shape(fn, shape, ndim)) return NONE;
  int64_t fan = ndim > 1 ? prod(shape + 1, ndim - 1) : 1;
  double std = sqrt(2.0 / (1.0 + a * a) / (double)fan);
  if (!isfinite(std)) return fail("%s: fan_in of shape is 0", fn);
  NnOp o = op_begin(fn);
  return op_done(o, tg_normal(shape, ndim, 0.0, std, opts));
}

tg_tensor tg_glorot_uniform(const int64_t *shape, int ndim, const tg_opts *opts) {
  const char *fn = "tg_glorot_uniform";
  if (!check_shape(fn, shape, ndim)) return NONE;
  if (ndim < 1) return fail("%s: needs at least one dimension", fn);
  return sym_uniform(fn, shape, ndim, sqrt(6.0 / (double)(shape[0] + prod(shape + 1, ndim - 1))), opts);
}

tg_tensor tg_scaled_uniform(const int64_t *shape, int ndim, const tg_opts *opts) {
  const char *fn = "tg_scaled_uniform";
  if (!check_shape(fn, shape, ndim)) return NONE;
  int64_t n = prod(shape, ndim);
  tg_opts ro = opts ? *opts : *TG_OPTS();
  int rg = ro.requires_grad;
  ro.requires_grad = TG_GRAD_UNSET;
  NnOp o = op_begin(fn);
  tg_tensor r = tg_mul_s(tg_uniform(shape, ndim, -1.0, 1.0, &ro), n > 0 ? pow((double)n, -0.5) : 1.0);
  if (rg != TG_GRAD_UNSET && r.id) tg_set_requires_grad(r, rg != 0);
  return op_done(o, r);
}

tg_tensor tg_randperm(int64_t n, const tg_opts *opts) {
  const char *fn = "tg_randperm";
  if (n < 0 || n > ((int64_t)1 << 31)) return fail("%s: n=%lld is out of range [0, 2^31]", fn, (long long)n);
  tg_dtype dt = opts && opts->dtype ? opts->dtype : TG_INT32;
  if (!tg_dtype_is_int(dt)) return fail("%s: dtype %s is not an integer dtype", fn, tg_dtype_name(dt));
  tg_opts ro = {TG_FLOAT32, opts ? opts->device : NULL, false};
  NnOp o = op_begin(fn);
  /* the draws are realized first, so the n^2 compare kernel reads them instead of recomputing them */
  tg_tensor r = tg_contiguous(tg_rand((const int64_t[]){n}, 1, &ro));
  if (tg_realize(r) != TG_OK) return op_done(o, NONE);
  tg_tensor ri = tg_reshape(r, (const int64_t[]){n, 1}, 2), rj = tg_reshape(r, (const int64_t[]){1, n}, 2);
  tg_opts io = {TG_INT32, opts ? opts->device : NULL, false};
  tg_tensor ar = tg_arange(0, (double)n, 1, &io);
  tg_tensor ai = tg_reshape(ar, (const int64_t[]){n, 1}, 2), aj = tg_reshape(ar, (const int64_t[]){1, n}, 2);
  /* rank of draw i: #{j: r_j < r_i} + #{j < i: r_j == r_i} */
  tg_tensor before = tg_bitwise_or(tg_lt(rj, ri), tg_bitwise_and(tg_eq(rj, ri), tg_lt(aj, ai)));
  tg_tensor rank = tg_sum(tg_cast(before, TG_INT32), (const int[]){1}, 1, false);
  return op_done(o, tg_cast(rank, dt));
}

static tg_opts like_opts(tg_tensor t, const tg_opts *opts) {
  tg_opts o = opts ? *opts : *TG_OPTS();
  if (!o.dtype) o.dtype = tg_dtype_of(t);
  if (!o.device) o.device = tg_device_of(t);
  return o;
}

tg_tensor tg_rand_like(tg_tensor t, const tg_opts *opts) {
  const char *fn = "tg_rand_like";
  if (!t_get(t, fn)) return NONE;
  tg_opts o = like_opts(t, opts);
  int64_t s[64];
  int nd = tg_shape(t, s);
  NnOp op = op_begin(fn);
  tg_tensor r = tg_rand(s, nd, &o);
  /* a sharded tensor's: drawn whole, then sharded as t is */
  if (!opts || !opts->device) r = tg_shard_axis(t) >= 0 && tg_valid(r) ? tg_shard_like(r, t) : r;
  return op_done(op, r);
}

tg_tensor tg_randn_like(tg_tensor t, const tg_opts *opts) {
  const char *fn = "tg_randn_like";
  if (!t_get(t, fn)) return NONE;
  tg_opts o = like_opts(t, opts);
  int64_t s[64];
  int nd = tg_shape(t, s);
  NnOp op = op_begin(fn);
  tg_tensor r = tg_randn(s, nd, &o);
  /* a sharded tensor's: drawn whole, then sharded as t is */
  if (!opts || !opts->device) r = tg_shard_axis(t) >= 0 && tg_valid(r) ? tg_shard_like(r, t) : r;
  return op_done(op, r);
}

/* ---------------------------------------------------------------------------------------------- */
/* transposed convolution                                                                          */

/* nsp spatial dims; pads: (before, after) per dim; op: output padding per dim; dtype: the sum's
 * dtype (TG_DTYPE_DEFAULT: the plain convolution), passed on to the equivalent convolution. */
static tg_tensor conv_transpose_impl(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias,
                                     int64_t groups, int nsp, const int64_t *s, const int64_t *d,
                                     const int64_t *pads, const int64_t *op, tg_dtype dtype) {
  if (!t_get(x, fn) || !t_get(weight, fn) || (bias.id && !t_get(bias, fn))) return NONE;
  int64_t xs[64], ws[64];
  int xn = tg_shape(x, xs), wn = tg_shape(weight, ws);
  if (xn != wn || wn != nsp + 2)
    return fail("%s: input %s must be (batch, cin, spatial...) and weight %s (cin, cout/groups, kernel...) with "
                "%d spatial dims",
                fn, TSHP(x), TSHP(weight), nsp);
  if (groups < 1) return fail("%s: groups %lld must be positive", fn, (long long)groups);
  int64_t cin = xs[1], rcout = ws[1];
  if (ws[0] != cin)
    return fail(
        "%s: input %s has %lld channels but weight %s expects %lld (weight is (cin, cout/groups, kernel...))",
        fn, TSHP(x), (long long)cin, TSHP(weight), (long long)ws[0]);
  if (cin % groups)
    return fail("%s: cin %lld is not divisible by groups=%lld", fn, (long long)cin, (long long)groups);
  for (int j = 0; j < nsp; j++)
    if (ws[2 + j] < 1) return fail("%s: weight %s has an empty kernel", fn, TSHP(weight));
  for (int j = 0; j < nsp; j++)
    if (s[j] < 1 || d[j] < 1 || op[j] < 0)
      return fail("%s: stride %lld and dilation %lld must be positive, output_padding %lld non-negative (spatial "
                  "dim %d)",
                  fn, (long long)s[j], (long long)d[j], (long long)op[j], j);
  /* the sizes below, computed up front so that none overflows: the stride-dilated input (in*s), the
   * equivalent convolution's padding (k-1)*d - pad (+ output_padding) and its groups*rcout filters */
  int64_t hs[8], cpad[16], gr;
  bool ovf = __builtin_mul_overflow(groups, rcout, &gr);
  for (int j = 0; j < nsp; j++) {
    int64_t span;
    ovf = ovf || __builtin_mul_overflow(xs[2 + j], s[j], &hs[j]) ||
          __builtin_mul_overflow(ws[2 + j] - 1, d[j], &span) ||
          __builtin_sub_overflow(span, pads[2 * j], &cpad[2 * j]) ||
          __builtin_sub_overflow(span, pads[2 * j + 1], &cpad[2 * j + 1]) ||
          __builtin_add_overflow(cpad[2 * j + 1], op[j], &cpad[2 * j + 1]);
  }
  if (ovf)
    return fail("%s: stride, dilation, padding and output_padding are too large for input %s and weight %s "
                "(sizes overflow int64)",
                fn, TSHP(x), TSHP(weight));
  NnOp o = op_begin(fn);
  /* weight (cin, rcout, k...) -> (groups, cin/g, rcout, k...) -> (groups, rcout, cin/g, k...), flipped
   * spatially -> (groups*rcout, cin/g, k...) */
  int64_t sh[64];
  int flip[8];
  sh[0] = groups, sh[1] = cin / groups, sh[2] = rcout;
  for (int j = 0; j < nsp; j++) sh[3 + j] = ws[2 + j], flip[j] = 3 + j;
  tg_tensor w = tg_reshape(weight, sh, nsp + 3);
  w = tg_flip(tg_transpose(w, 1, 2), flip, nsp);
  sh[0] = gr, sh[1] = cin / groups;
  for (int j = 0; j < nsp; j++) sh[2 + j] = ws[2 + j];
  w = tg_reshape(w, sh, nsp + 2);
  /* dilate the input by the stride: (k) -> (k, 1) -> pad -> (k, s) -> (k*s) -> shrink to k*s - (s-1) */
  tg_tensor xd = x;
  bool strided = false;
  for (int j = 0; j < nsp; j++) strided = strided || s[j] > 1;
  if (strided) {
    int64_t p[128] = {0}, b[128] = {0};
    sh[0] = xs[0], sh[1] = cin;
    for (int j = 0; j < nsp; j++) sh[2 + 2 * j] = xs[2 + j], sh[3 + 2 * j] = 1, p[2 * (3 + 2 * j) + 1] = s[j] - 1;
    xd = tg_pad(tg_reshape(x, sh, 2 + 2 * nsp), p, 2 * (2 + 2 * nsp), 0.0);
    for (int j = 0; j < nsp; j++) sh[2 + j] = hs[j];
    xd = tg_reshape(xd, sh, 2 + nsp);
    b[1] = xs[0], b[3] = cin;
    for (int j = 0; j < nsp; j++) b[2 * (2 + j) + 1] = hs[j] - (s[j] - 1);
    xd = tg_shrink(xd, b, 2 * (2 + nsp));
  }
  int64_t one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  return op_done(o, conv_nd_resolved(fn, xd, w, bias, groups, one, d, cpad, dtype));
}

tg_tensor tg_conv_transpose_nd(tg_tensor x, tg_tensor weight, tg_tensor bias, const tg_window_opts *opts) {
  const char *fn = "tg_conv_transpose_nd";
  if (!t_get(x, fn) || !t_get(weight, fn)) return NONE;
  int nsp = tg_ndim(weight) - 2;
  if (nsp < 1) return fail("%s: weight %s must be (cin, cout/groups, kernel...)", fn, TSHP(weight));
  int64_t g, s[8], d[8], pads[16], op[8];
  if (!conv_opts_nd(fn, opts, nsp, true, &g, s, d, pads, op)) return NONE;
  return conv_transpose_impl(fn, x, weight, bias, g, nsp, s, d, pads, op, opts ? opts->dtype : TG_DTYPE_DEFAULT);
}

/* tinygrad's padding forms -> (H before, H after, W before, W after) */
static bool resolve_pads(const char *fn, const int64_t *p, int np, int64_t *out) {
  switch (np) {
  case 0:
    if (p[1] || p[2] || p[3]) {
      tg_set_error(TG_ERR_INVALID,
                   "%s: padding has several entries but npadding is 0; set npadding to 1, 2 or 4", fn);
      return false;
    }
    /* fallthrough */
  case 1:
    out[0] = out[1] = out[2] = out[3] = p[0];
    return true;
  case 2:
    out[0] = out[1] = p[0], out[2] = out[3] = p[1];
    return true;
  case 4:
    out[2] = p[0], out[3] = p[1], out[0] = p[2], out[1] = p[3];
    return true;
  default:
    tg_set_error(TG_ERR_INVALID,
                 "%s: npadding is %d; use 1 (all sides), 2 (pad_h, pad_w) or 4 (left, right, top, bottom)",
                 fn, np);
    return false;
  }
}

static void pair_or(const int64_t *v, int64_t def, int64_t *out) {
  if (v[0] == 0 && v[1] == 0)
    out[0] = out[1] = def;
  else if (v[1] == 0)
    out[0] = out[1] = v[0];
  else
    out[0] = v[0], out[1] = v[1];
}

tg_tensor tg_conv_transpose2d(tg_tensor x, tg_tensor weight, tg_tensor bias,
                              const tg_conv_transpose2d_opts *opts) {
  const char *fn = "tg_conv_transpose2d";
  static const tg_conv_transpose2d_opts zero;
  if (!opts) opts = &zero;
  int64_t s[2], d[2], pads[4], op[2];
  pair_or(opts->stride, 1, s);
  pair_or(opts->dilation, 1, d);
  if (!resolve_pads(fn, opts->padding, opts->npadding, pads)) return NONE;
  switch (opts->noutput_padding) {
  case 0:
    if (opts->output_padding[1])
      return fail("%s: output_padding has two entries but noutput_padding is 0; set it to 2", fn);
    /* fallthrough */
  case 1:
    op[0] = op[1] = opts->output_padding[0];
    break;
  case 2:
    op[0] = opts->output_padding[0], op[1] = opts->output_padding[1];
    break;
  default:
    return fail("%s: noutput_padding is %d; use 1 (both dims) or 2 (h, w)", fn, opts->noutput_padding);
  }
  int nsp = tg_ndim(weight) - 2;
  if (t_get(weight, fn) && nsp != 2 && nsp >= 1 && nsp <= TG_WINDOW_MAXDIMS) {
    /* tinygrad's conv_transpose2d takes any number of spatial dims: uniform options only here */
    if (s[0] != s[1] || d[0] != d[1] || pads[0] != pads[1] || pads[0] != pads[2] || pads[0] != pads[3] ||
        op[0] != op[1])
      return fail("%s: a %d-d transposed convolution (weight %s) takes only uniform stride, dilation, padding and "
                  "output_padding here; use tg_conv_transpose_nd for per-dim values",
                  fn, nsp, TSHP(weight));
    int64_t sn[8], dn[8], pn[16], on[8];
    for (int j = 0; j < nsp; j++) sn[j] = s[0], dn[j] = d[0], pn[2 * j] = pn[2 * j + 1] = pads[0], on[j] = op[0];
    return conv_transpose_impl(fn, x, weight, bias, opts->groups ? opts->groups : 1, nsp, sn, dn, pn, on,
                               opts->dtype);
  }
  return conv_transpose_impl(fn, x, weight, bias, opts->groups ? opts->groups : 1, 2, s, d, pads, op, opts->dtype);
}

/* ---------------------------------------------------------------------------------------------- */
/* parameters                                                                                      */

typedef struct {
  tg_tensor *dst;
  tg_tensor val;
  bool trainable;
} PDef;

/* Realizes the new parameters together, then makes each a root-scope handle in *dst (requires_grad on
 * the trainable ones). On error frees them all and returns the status. Called inside an op scope. */
static tg_status make_params(PDef *p, int n) {
  tg_tensor ts[8];
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (!p[i].val.id && !tg_has_error()) continue; /* absent optional parameter */
    if (!tg_valid(p[i].val)) return tg_has_error() ? tg_last_status() : TG_ERR_HANDLE;
    /* Each parameter gets a buffer of its own: equal constant tensors (the ones of two BatchNorm
     * weights, zeros of a bias and a running mean) are one hash-consed node, which realizes into one
     * shared buffer, and an assign to one would change the other. */
    int64_t sh[64];
    int nd = tg_shape(p[i].val, sh);
    tg_opts eo = {tg_dtype_of(p[i].val), tg_device_of(p[i].val), false};
    p[i].val = tg_assign(tg_empty(sh, nd, &eo), p[i].val);
    if (!p[i].val.id) return tg_last_status();
    ts[m++] = p[i].val;
  }
  tg_status st = m ? tg_realize_many(ts, m) : TG_OK;
  if (st != TG_OK) return st;
  for (int i = 0; i < n; i++) {
    if (!p[i].val.id) continue;
    *p[i].dst = tg_persist(p[i].val);
    tg_set_requires_grad(*p[i].dst, p[i].trainable);
  }
  return TG_OK;
}

static void free_params(tg_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++) {
    tg_free(*ts[i]);
    *ts[i] = NONE;
  }
}

/* Adds t under "prefix.name" (prefix "" / NULL: "name"; a trailing '.' in prefix is not doubled). */
static tg_status put(tg_state_dict *sd, const char *fn, const char *prefix, const char *name, tg_tensor t) {
  if (!t.id) return TG_OK;
  if (!prefix) prefix = "";
  size_t lp = strlen(prefix), ln = strlen(name);
  char *buf = tg_xmalloc(lp + ln + 2);
  if (lp == 0)
    memcpy(buf, name, ln + 1);
  else if (prefix[lp - 1] == '.')
    snprintf(buf, lp + ln + 2, "%s%s", prefix, name);
  else
    snprintf(buf, lp + ln + 2, "%s.%s", prefix, name);
  tg_status st = tg_state_dict_set(sd, buf, t);
  free(buf);
  if (st != TG_OK) {
    NnOp o = {fn, false};
    relabel(o);
  }
  return st;
}

static tg_status put_all(const char *fn, const void *l, tg_state_dict *sd, const char *prefix,
                         const char *const *names, const tg_tensor *ts, int n) {
  if (!l) return tg_set_error(TG_ERR_INVALID, "%s: layer is NULL", fn);
  if (!sd) return tg_set_error(TG_ERR_INVALID, "%s: state dict is NULL", fn);
  for (int i = 0; i < n; i++) {
    tg_status st = put(sd, fn, prefix, names[i], ts[i]);
    if (st != TG_OK) return st;
  }
  return TG_OK;
}

static bool layer_ok(const char *fn, const void *l, bool initialised) {
  if (!l) {
    tg_set_error(TG_ERR_INVALID, "%s: layer is NULL", fn);
    return false;
  }
  if (!initialised) {
    tg_set_error(TG_ERR_HANDLE, "%s: the layer is not initialised (or was freed)", fn);
    return false;
  }
  return true;
}

/* init prologue: NULL check and zeroing */
#define INIT_BEGIN(fn, l)                                                                                    \
  do {                                                                                                       \
    if (!(l)) return tg_set_error(TG_ERR_INVALID, "%s: layer is NULL", fn);                                  \
    memset((l), 0, sizeof *(l));                                                                             \
  } while (0)

static tg_tensor lazy_uniform(const int64_t *shape, int ndim, double bound) {
  return tg_uniform(shape, ndim, -bound, bound, NULL);
}

/* ---------------------------------------------------------------------------------------------- */
/* Linear                                                                                          */

tg_status tg_nn_linear_init(tg_nn_linear *l, int64_t in_features, int64_t out_features, bool bias) {
  const char *fn = "tg_nn_linear_init";
  INIT_BEGIN(fn, l);
  if (in_features < 1 || out_features < 0)
    return tg_set_error(TG_ERR_INVALID,
                        "%s: in_features=%lld must be positive and out_features=%lld non-negative", fn,
                        (long long)in_features, (long long)out_features);
  l->in_features = in_features, l->out_features = out_features;
  double bound = 1.0 / sqrt((double)in_features);
  NnOp o = op_begin(fn);
  PDef p[2] = {{&l->weight, lazy_uniform((const int64_t[]){out_features, in_features}, 2, bound), true},
               {&l->bias, bias ? lazy_uniform((const int64_t[]){out_features}, 1, bound) : NONE, true}};
  tg_status st = op_done_status(o, make_params(p, 2));
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

tg_tensor tg_nn_linear_forward(const tg_nn_linear *l, tg_tensor x) {
  const char *fn = "tg_nn_linear_forward";
  if (!layer_ok(fn, l, l && l->weight.id)) return NONE;
  NnOp o = op_begin(fn);
  return op_done(o, tg_linear(x, l->weight, l->bias));
}

tg_status tg_nn_linear_state(const tg_nn_linear *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight", "bias"};
  return put_all("tg_nn_linear_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight, l->bias} : NULL, 2);
}

void tg_nn_linear_free(tg_nn_linear *l) {
  if (!l) return;
  free_params((tg_tensor *const[]){&l->weight, &l->bias}, 2);
  memset(l, 0, sizeof *l);
}

/* ---------------------------------------------------------------------------------------------- */
/* Conv2d / ConvTranspose2d                                                                        */

static tg_status conv_params(const char *fn, int64_t wshape0, int64_t wshape1, const int64_t *k, int nk,
                             int64_t in_channels, int64_t out_channels, bool bias, tg_tensor *w,
                             tg_tensor *b) {
  double scale = 1.0 / sqrt((double)in_channels * (double)prod(k, nk));
  int64_t ws[4] = {wshape0, wshape1, k[0], nk > 1 ? k[1] : 0};
  NnOp o = op_begin(fn);
  PDef p[2] = {{w, lazy_uniform(ws, 2 + nk, scale), true},
               {b, bias ? lazy_uniform((const int64_t[]){out_channels}, 1, scale) : NONE, true}};
  return op_done_status(o, make_params(p, 2));
}

static tg_status conv_check(const char *fn, int64_t in, int64_t out, int64_t groups, const int64_t *k,
                            int nk) {
  if (in < 1 || out < 1 || groups < 1 || in % groups || out % groups)
    return tg_set_error(
        TG_ERR_INVALID,
        "%s: in_channels=%lld and out_channels=%lld must be positive and divisible by groups=%lld", fn,
        (long long)in, (long long)out, (long long)groups);
  for (int i = 0; i < nk; i++)
    if (k[i] < 1)
      return tg_set_error(TG_ERR_INVALID, "%s: kernel_size %lld must be positive", fn, (long long)k[i]);
  /* the weight has in * out / groups * prod(kernel_size) elements (conv and transposed conv alike) */
  int64_t n = out / groups;
  bool big = __builtin_mul_overflow(n, in, &n) || n > TG_MAX_NUMEL;
  for (int i = 0; i < nk && !big; i++) big = __builtin_mul_overflow(n, k[i], &n) || n > TG_MAX_NUMEL;
  if (big)
    return tg_set_error(
        TG_ERR_INVALID,
        "%s: in_channels=%lld, out_channels=%lld, groups=%lld and kernel_size %s give a weight "
        "too large (more than 2^48 elements)",
        fn, (long long)in, (long long)out, (long long)groups, FSHP(k, nk));
  return TG_OK;
}

tg_status tg_nn_conv2d_init(tg_nn_conv2d *l, int64_t in_channels, int64_t out_channels,
                            const int64_t kernel_size[2], bool bias, const tg_conv2d_opts *opts) {
  const char *fn = "tg_nn_conv2d_init";
  INIT_BEGIN(fn, l);
  if (!kernel_size) return tg_set_error(TG_ERR_INVALID, "%s: kernel_size is NULL", fn);
  int64_t k[2];
  pair_or(kernel_size, 0, k);
  if (opts) l->opts = *opts;
  int64_t g = l->opts.groups ? l->opts.groups : 1;
  tg_status st = conv_check(fn, in_channels, out_channels, g, k, 2);
  if (st != TG_OK) {
    memset(l, 0, sizeof *l);
    return st;
  }
  l->in_channels = in_channels, l->out_channels = out_channels, l->kernel_size[0] = k[0],
  l->kernel_size[1] = k[1];
  st = conv_params(fn, out_channels, in_channels / g, k, 2, in_channels, out_channels, bias, &l->weight,
                   &l->bias);
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

tg_tensor tg_nn_conv2d_forward(const tg_nn_conv2d *l, tg_tensor x) {
  const char *fn = "tg_nn_conv2d_forward";
  if (!layer_ok(fn, l, l && l->weight.id)) return NONE;
  NnOp o = op_begin(fn);
  return op_done(o, tg_conv2d(x, l->weight, l->bias, &l->opts));
}

tg_status tg_nn_conv2d_state(const tg_nn_conv2d *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight", "bias"};
  return put_all("tg_nn_conv2d_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight, l->bias} : NULL, 2);
}

void tg_nn_conv2d_free(tg_nn_conv2d *l) {
  if (!l) return;
  free_params((tg_tensor *const[]){&l->weight, &l->bias}, 2);
  memset(l, 0, sizeof *l);
}

tg_status tg_nn_conv_transpose2d_init(tg_nn_conv_transpose2d *l, int64_t in_channels, int64_t out_channels,
                                      const int64_t kernel_size[2], bool bias,
                                      const tg_conv_transpose2d_opts *opts) {
  const char *fn = "tg_nn_conv_transpose2d_init";
  INIT_BEGIN(fn, l);
  if (!kernel_size) return tg_set_error(TG_ERR_INVALID, "%s: kernel_size is NULL", fn);
  int64_t k[2];
  pair_or(kernel_size, 0, k);
  if (opts) l->opts = *opts;
  int64_t g = l->opts.groups ? l->opts.groups : 1;
  tg_status st = conv_check(fn, in_channels, out_channels, g, k, 2);
  if (st != TG_OK) {
    memset(l, 0, sizeof *l);
    return st;
  }
  l->in_channels = in_channels, l->out_channels = out_channels, l->kernel_size[0] = k[0],
  l->kernel_size[1] = k[1];
  st = conv_params(fn, in_channels, out_channels / g, k, 2, in_channels, out_channels, bias, &l->weight,
                   &l->bias);
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

tg_tensor tg_nn_conv_transpose2d_forward(const tg_nn_conv_transpose2d *l, tg_tensor x) {
  const char *fn = "tg_nn_conv_transpose2d_forward";
  if (!layer_ok(fn, l, l && l->weight.id)) return NONE;
  NnOp o = op_begin(fn);
  return op_done(o, tg_conv_transpose2d(x, l->weight, l->bias, &l->opts));
}

tg_status tg_nn_conv_transpose2d_state(const tg_nn_conv_transpose2d *l, tg_state_dict *sd,
                                       const char *prefix) {
  static const char *const names[] = {"weight", "bias"};
  return put_all("tg_nn_conv_transpose2d_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight, l->bias} : NULL, 2);
}

void tg_nn_conv_transpose2d_free(tg_nn_conv_transpose2d *l) {
  if (!l) return;
  free_params((tg_tensor *const[]){&l->weight, &l->bias}, 2);
  memset(l, 0, sizeof *l);
}

/* ---------------------------------------------------------------------------------------------- */
/* Conv1d / ConvTranspose1d: the 2-d ops on (N, C, 1, L) with a (1, k) kernel                      */

static tg_status conv1d_init(const char *fn, tg_nn_conv1d *l, int64_t in_channels, int64_t out_channels,
                             int64_t kernel_size, bool bias, const tg_conv1d_opts *opts, bool transposed) {
  INIT_BEGIN(fn, l);
  if (opts) l->opts = *opts;
  if (!l->opts.stride) l->opts.stride = 1;
  if (!l->opts.dilation) l->opts.dilation = 1;
  if (!l->opts.groups) l->opts.groups = 1;
  tg_status st = TG_OK;
  if (l->opts.stride < 1 || l->opts.dilation < 1 || l->opts.output_padding < 0 ||
      (!transposed && l->opts.output_padding))
    st = tg_set_error(
        TG_ERR_INVALID,
        "%s: stride %lld and dilation %lld must be positive; output_padding %lld is for ConvTranspose1d "
        "only and non-negative",
        fn, (long long)l->opts.stride, (long long)l->opts.dilation, (long long)l->opts.output_padding);
  if (st == TG_OK) st = conv_check(fn, in_channels, out_channels, l->opts.groups, &kernel_size, 1);
  if (st != TG_OK) {
    memset(l, 0, sizeof *l);
    return st;
  }
  l->in_channels = in_channels, l->out_channels = out_channels, l->kernel_size = kernel_size;
  int64_t g = l->opts.groups;
  st = transposed ? conv_params(fn, in_channels, out_channels / g, &kernel_size, 1, in_channels, out_channels,
                                bias, &l->weight, &l->bias)
                  : conv_params(fn, out_channels, in_channels / g, &kernel_size, 1, in_channels, out_channels,
                                bias, &l->weight, &l->bias);
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

static tg_tensor conv1d_forward(const char *fn, const tg_nn_conv1d *l, tg_tensor x, bool transposed) {
  if (!layer_ok(fn, l, l && l->weight.id)) return NONE;
  if (!t_get(x, fn)) return NONE;
  if (tg_ndim(x) != 3) return fail("%s: input %s must be (batch, channels, length)", fn, TSHP(x));
  NnOp o = op_begin(fn);
  tg_tensor x4 = tg_unsqueeze(x, 2), w4 = tg_unsqueeze(l->weight, 2), r;
  const tg_conv1d_opts *c = &l->opts;
  if (!transposed) {
    tg_conv2d_opts co = {0};
    co.groups = c->groups;
    co.stride[0] = 1, co.stride[1] = c->stride;
    co.dilation[0] = 1, co.dilation[1] = c->dilation;
    co.padding[0] = co.padding[1] = c->padding, co.npadding = 4;
    r = tg_conv2d(x4, w4, l->bias, &co);
  } else {
    int64_t s[2] = {1, c->stride}, d[2] = {1, c->dilation}, pads[4] = {0, 0, c->padding, c->padding},
            op[2] = {0, c->output_padding};
    r = conv_transpose_impl(fn, x4, w4, l->bias, c->groups, 2, s, d, pads, op, TG_DTYPE_DEFAULT);
  }
  return op_done(o, tg_squeeze(r, 2));
}

tg_status tg_nn_conv1d_init(tg_nn_conv1d *l, int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                            bool bias, const tg_conv1d_opts *opts) {
  return conv1d_init("tg_nn_conv1d_init", l, in_channels, out_channels, kernel_size, bias, opts, false);
}
tg_tensor tg_nn_conv1d_forward(const tg_nn_conv1d *l, tg_tensor x) {
  return conv1d_forward("tg_nn_conv1d_forward", l, x, false);
}
tg_status tg_nn_conv1d_state(const tg_nn_conv1d *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight", "bias"};
  return put_all("tg_nn_conv1d_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight, l->bias} : NULL, 2);
}
void tg_nn_conv1d_free(tg_nn_conv1d *l) {
  if (!l) return;
  free_params((tg_tensor *const[]){&l->weight, &l->bias}, 2);
  memset(l, 0, sizeof *l);
}

tg_status tg_nn_conv_transpose1d_init(tg_nn_conv_transpose1d *l, int64_t in_channels, int64_t out_channels,
                                      int64_t kernel_size, bool bias, const tg_conv1d_opts *opts) {
  return conv1d_init("tg_nn_conv_transpose1d_init", l, in_channels, out_channels, kernel_size, bias, opts,
                     true);
}
tg_tensor tg_nn_conv_transpose1d_forward(const tg_nn_conv_transpose1d *l, tg_tensor x) {
  return conv1d_forward("tg_nn_conv_transpose1d_forward", l, x, true);
}
tg_status tg_nn_conv_transpose1d_state(const tg_nn_conv_transpose1d *l, tg_state_dict *sd,
                                       const char *prefix) {
  static const char *const names[] = {"weight", "bias"};
  return put_all("tg_nn_conv_transpose1d_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight, l->bias} : NULL, 2);
}
void tg_nn_conv_transpose1d_free(tg_nn_conv_transpose1d *l) { tg_nn_conv1d_free(l); }

/* ---------------------------------------------------------------------------------------------- */
/* BatchNorm                                                                                       */

static bool eps_ok(const char *fn, double eps) {
  if (!(eps >= 0) || !isfinite(eps)) {
    tg_set_error(TG_ERR_INVALID, "%s: eps %g must be a finite non-negative number", fn, eps);
    return false;
  }
  return true;
}

tg_status tg_nn_batchnorm_init(tg_nn_batchnorm *l, int64_t num_features, const tg_batchnorm_opts *opts) {
  const char *fn = "tg_nn_batchnorm_init";
  INIT_BEGIN(fn, l);
  const tg_batchnorm_opts opts_v = opts ? *opts : *TG_BATCHNORM_OPTS();
  opts = &opts_v;
  if (num_features < 1)
    return tg_set_error(TG_ERR_INVALID, "%s: num_features=%lld must be positive", fn,
                        (long long)num_features);
  double eps = opts->eps, mom = opts->momentum;
  if (!eps_ok(fn, eps)) return TG_ERR_INVALID;
  if (!isfinite(mom)) return tg_set_error(TG_ERR_INVALID, "%s: momentum %g must be finite", fn, mom);
  l->num_features = num_features, l->eps = eps, l->momentum = mom;
  l->affine = opts->affine, l->track_running_stats = opts->track_running_stats, l->unsynced = opts->unsynced, l->dist = opts->dist;
  const int64_t c[1] = {num_features};
  NnOp o = op_begin(fn);
  PDef p[5] = {{&l->weight, l->affine ? tg_ones(c, 1, NULL) : NONE, true},
               {&l->bias, l->affine ? tg_zeros(c, 1, NULL) : NONE, true},
               {&l->running_mean, l->track_running_stats ? tg_zeros(c, 1, NULL) : NONE, false},
               {&l->running_var, l->track_running_stats ? tg_ones(c, 1, NULL) : NONE, false},
               {&l->num_batches_tracked, tg_zeros(NULL, 0, TG_OPTS(.dtype = TG_INT64)), false}};
  tg_status st = op_done_status(o, make_params(p, 5));
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

/* running_mean = (1-m) running_mean + m mean, running_var = (1-m) running_var + f var (lazy
 * assigns; f is m times the unbiasing count/(count-1)), num_batches_tracked += 1; mean and var are
 * the batch's (detached here) */
static void bn_update_running(tg_nn_batchnorm *l, tg_tensor mean, tg_tensor var, double f) {
  double m = l->momentum;
  tg_assign(l->running_mean, tg_add(tg_mul_s(l->running_mean, 1.0 - m), tg_mul_s(tg_detach(mean), m)));
  tg_assign(l->running_var, tg_add(tg_mul_s(l->running_var, 1.0 - m), tg_mul_s(tg_detach(var), f)));
  tg_assign(l->num_batches_tracked, tg_add_s(l->num_batches_tracked, 1));
}

tg_tensor tg_nn_batchnorm_forward(tg_nn_batchnorm *l, tg_tensor x) {
  const char *fn = "tg_nn_batchnorm_forward";
  if (!layer_ok(fn, l, l && l->num_batches_tracked.id)) return NONE;
  if (!t_get(x, fn)) return NONE;
  int64_t xs[64];
  int nd = tg_shape(x, xs);
  if (nd < 2 || xs[1] != l->num_features)
    return fail("%s: input %s must be (batch, %lld channels, ...)", fn, TSHP(x), (long long)l->num_features);
  bool training = tg_getenv_int("TRAINING", 0) != 0;
  int axes[64], na = 0;
  for (int i = 0; i < nd; i++)
    if (i != 1) axes[na++] = i;
  int64_t mask[64];
  for (int i = 0; i < nd; i++) mask[i] = i == 1 ? -1 : 1;
  NnOp o = op_begin(fn);
  tg_tensor mean, invstd;
  int ndev = tg_shard_count(x);
  if (l->unsynced && ndev > 1 && tg_shard_axis(x) == 0 && xs[0] % ndev == 0 && nd < 63 &&
      !(l->track_running_stats && !training)) {
    /* per device: (N, C, ...) as (devices, N/devices, C, ...), whose first axis is the sharded one,
     * so statistics over the others stay on their device */
    int64_t s5[64], m5[64];
    int a5[64], n5 = 0;
    s5[0] = ndev, s5[1] = xs[0] / ndev;
    for (int i = 1; i < nd; i++) s5[i + 1] = xs[i];
    for (int i = 0; i <= nd; i++) {
      m5[i] = i == 0 ? ndev : i == 2 ? xs[1] : 1;
      if (i != 0 && i != 2) a5[n5++] = i;
    }
    tg_tensor x5 = tg_reshape(x, s5, nd + 1);
    tg_tensor bm = tg_mean(x5, a5, n5, false); /* (devices, C) */
    tg_tensor y = tg_sub(x5, tg_reshape(tg_detach(bm), m5, nd + 1));
    tg_tensor bv = tg_mean(tg_mul(y, y), a5, n5, false);
    if (l->track_running_stats && training) {
      int64_t cnt = prod(xs, nd) / xs[1] / ndev;
      if (cnt <= 1)
        return op_done(o, fail("%s: training needs more than one value per channel on each device, got input %s over %d devices",
                               fn, TSHP(x), ndev));
      double f = l->momentum * (double)cnt / (double)(cnt - 1);
      bn_update_running(l, tg_mean(bm, TG_AXES(0), false), tg_mean(bv, TG_AXES(0), false), f); /* the devices' mean */
    }
    tg_tensor z = tg_mul(tg_sub(x5, tg_reshape(bm, m5, nd + 1)), tg_reshape(tg_rsqrt(tg_add_s(bv, l->eps)), m5, nd + 1));
    z = tg_reshape(z, xs, nd);
    for (int i = 0; i < nd; i++) mask[i] = i == 1 ? xs[1] : 1;
    if (l->weight.id) z = tg_mul(z, tg_reshape(l->weight, mask, nd));
    if (l->bias.id) z = tg_add(z, tg_reshape(l->bias, mask, nd));
    return op_done(o, z);
  }
  if (l->track_running_stats && !training) {
    mean = l->running_mean;
    invstd = tg_rsqrt(tg_add_s(l->running_var, l->eps));
  } else {
    /* two passes over x; d(var)/d(mean) = 0, so the mean is detached inside the variance. Over MPI
     * ranks (dist): each pass's sums are allreduced and divided by the count over all ranks, itself
     * an allreduce (ranks may hold batches of different sizes, as PyTorch's SyncBatchNorm allows) */
    int ranks = l->dist && tg_dist_size() > 1 ? tg_dist_size() : 1;
    double local = (double)(prod(xs, nd) / xs[1]);
    tg_tensor bm, bv, y, total = NONE;
    if (ranks > 1) {
      tg_tensor sx = tg_sum(x, axes, na, false);
      total = tg_cast(tg_dist_allreduce(tg_full(TG_SHAPE(1), local, TG_OPTS(.dtype = TG_FLOAT64))), tg_dtype_of(sx));
      bm = tg_div(tg_dist_allreduce(sx), total);
      y = tg_sub(x, tg_reshape(tg_detach(bm), mask, nd));
      bv = tg_div(tg_dist_allreduce(tg_sum(tg_mul(y, y), axes, na, false)), total);
    } else {
      bm = tg_mean(x, axes, na, false);
      y = tg_sub(x, tg_reshape(tg_detach(bm), mask, nd));
      bv = tg_mean(tg_mul(y, y), axes, na, false);
    }
    if (l->track_running_stats && training) {
      /* an empty batch (PyTorch's): an empty output, the running statistics as they were, one more
       * batch counted */
      if (ranks == 1 && local == 0) {
        tg_assign(l->num_batches_tracked, tg_add_s(l->num_batches_tracked, 1));
        return op_done(o, tg_batchnorm(x, l->weight, l->bias, l->running_mean, tg_rsqrt(tg_add_s(l->running_var, l->eps))));
      }
      if (ranks == 1 && local <= 1)
        return op_done(o,
                       fail("%s: training needs more than one value per channel, got input %s", fn, TSHP(x)));
      /* the running variance is the unbiased one: n / (n - 1) times the batch's */
      if (ranks > 1) bn_update_running(l, bm, tg_div(tg_mul(bv, total), tg_sub_s(total, 1.0)), l->momentum);
      else bn_update_running(l, bm, bv, l->momentum * local / (local - 1));
    }
    mean = bm;
    invstd = tg_rsqrt(tg_add_s(bv, l->eps));
  }
  return op_done(o, tg_batchnorm(x, l->weight, l->bias, mean, invstd));
}

tg_status tg_nn_batchnorm_state(const tg_nn_batchnorm *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"};
  return put_all(
      "tg_nn_batchnorm_state", l, sd, prefix, names,
      l ? (const tg_tensor[]){l->weight, l->bias, l->running_mean, l->running_var, l->num_batches_tracked}
        : NULL,
      5);
}

void tg_nn_batchnorm_free(tg_nn_batchnorm *l) {
  if (!l) return;
  free_params(
      (tg_tensor *const[]){&l->weight, &l->bias, &l->running_mean, &l->running_var, &l->num_batches_tracked},
      5);
  memset(l, 0, sizeof *l);
}

/* ---------------------------------------------------------------------------------------------- */
/* GroupNorm / InstanceNorm                                                                        */

static tg_status affine_params(const char *fn, const int64_t *shape, int ndim, bool affine, tg_tensor *w,
                               tg_tensor *b) {
  NnOp o = op_begin(fn);
  PDef p[2] = {{w, affine ? tg_ones(shape, ndim, NULL) : NONE, true},
               {b, affine ? tg_zeros(shape, ndim, NULL) : NONE, true}};
  return op_done_status(o, make_params(p, 2));
}

static tg_status groupnorm_init(const char *fn, tg_nn_groupnorm *l, int64_t num_groups, int64_t num_channels,
                                const tg_norm_opts *opts) {
  INIT_BEGIN(fn, l);
  const tg_norm_opts opts_v = opts ? *opts : *TG_NORM_OPTS();
  opts = &opts_v;
  if (num_groups < 1 || num_channels < 1 || num_channels % num_groups)
    return tg_set_error(TG_ERR_INVALID,
                        "%s: num_channels=%lld must be a positive multiple of num_groups=%lld", fn,
                        (long long)num_channels, (long long)num_groups);
  double eps = opts->eps;
  if (!eps_ok(fn, eps)) return TG_ERR_INVALID;
  l->num_groups = num_groups, l->num_channels = num_channels, l->eps = eps;
  tg_status st = affine_params(fn, (const int64_t[]){num_channels}, 1, opts->affine, &l->weight, &l->bias);
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

/* x * weight.reshape(1, -1, 1, ...) + bias.reshape(...) when both are present */
static tg_tensor channel_affine(tg_tensor x, int nd, tg_tensor w, tg_tensor b) {
  if (!w.id || !b.id) return x;
  int64_t sh[64];
  for (int i = 0; i < nd; i++) sh[i] = i == 1 ? -1 : 1;
  return tg_add(tg_mul(x, tg_reshape(w, sh, nd)), tg_reshape(b, sh, nd));
}

static tg_tensor groupnorm_forward(const char *fn, const tg_nn_groupnorm *l, tg_tensor x) {
  if (!layer_ok(fn, l, l && l->num_groups)) return NONE;
  if (l->num_groups < 1 || l->num_channels < 1 || l->num_channels % l->num_groups)
    return fail("%s: the layer's num_channels=%lld must be a positive multiple of num_groups=%lld (as init "
                "sets them)",
                fn, (long long)l->num_channels, (long long)l->num_groups);
  if (!t_get(x, fn)) return NONE;
  int64_t xs[64];
  int nd = tg_shape(x, xs);
  if (nd < 2 || xs[1] != l->num_channels)
    return fail("%s: input %s must be (batch, %lld channels, ...)", fn, TSHP(x), (long long)l->num_channels);
  NnOp o = op_begin(fn);
  int64_t per_group = xs[1] / l->num_groups * prod(xs + 2, nd - 2);
  tg_tensor y = tg_reshape(x, (const int64_t[]){xs[0], l->num_groups, per_group}, 3);
  y = tg_reshape(tg_layernorm(y, 1, l->eps), xs, nd);
  return op_done(o, channel_affine(y, nd, l->weight, l->bias));
}

tg_status tg_nn_groupnorm_init(tg_nn_groupnorm *l, int64_t num_groups, int64_t num_channels,
                               const tg_norm_opts *opts) {
  return groupnorm_init("tg_nn_groupnorm_init", l, num_groups, num_channels, opts);
}
tg_tensor tg_nn_groupnorm_forward(const tg_nn_groupnorm *l, tg_tensor x) {
  return groupnorm_forward("tg_nn_groupnorm_forward", l, x);
}
tg_status tg_nn_groupnorm_state(const tg_nn_groupnorm *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight", "bias"};
  return put_all("tg_nn_groupnorm_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight, l->bias} : NULL, 2);
}
void tg_nn_groupnorm_free(tg_nn_groupnorm *l) {
  if (!l) return;
  free_params((tg_tensor *const[]){&l->weight, &l->bias}, 2);
  memset(l, 0, sizeof *l);
}

tg_status tg_nn_instancenorm_init(tg_nn_instancenorm *l, int64_t num_features, const tg_norm_opts *opts) {
  return groupnorm_init("tg_nn_instancenorm_init", l, num_features, num_features, opts);
}
tg_tensor tg_nn_instancenorm_forward(const tg_nn_instancenorm *l, tg_tensor x) {
  return groupnorm_forward("tg_nn_instancenorm_forward", l, x);
}
tg_status tg_nn_instancenorm_state(const tg_nn_instancenorm *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight", "bias"};
  return put_all("tg_nn_instancenorm_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight, l->bias} : NULL, 2);
}
void tg_nn_instancenorm_free(tg_nn_instancenorm *l) { tg_nn_groupnorm_free(l); }

/* ---------------------------------------------------------------------------------------------- */
/* LayerNorm / LayerNorm2d / RMSNorm                                                               */

static tg_status layernorm_init(const char *fn, tg_nn_layernorm *l, const int64_t *shape, int ndim,
                                const tg_norm_opts *opts) {
  INIT_BEGIN(fn, l);
  const tg_norm_opts opts_v = opts ? *opts : *TG_NORM_OPTS();
  opts = &opts_v;
  if (ndim < 1 || ndim > 8 || !shape)
    return tg_set_error(TG_ERR_INVALID, "%s: normalized_shape needs 1..8 dimensions, got %d", fn, ndim);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 1)
      return tg_set_error(TG_ERR_INVALID, "%s: normalized_shape has a non-positive dimension %lld", fn,
                          (long long)shape[i]);
  double eps = opts->eps;
  if (!eps_ok(fn, eps)) return TG_ERR_INVALID;
  l->ndim = ndim, l->eps = eps;
  memcpy(l->normalized_shape, shape, sizeof(int64_t) * (size_t)ndim);
  tg_status st = affine_params(fn, shape, ndim, opts->affine, &l->weight, &l->bias);
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

/* The fields forward relies on, checked as init checks them: they are public and may have been
 * changed since. */
static bool layernorm_ok(const char *fn, const tg_nn_layernorm *l) {
  bool ok = l->ndim >= 1 && l->ndim <= 8;
  for (int i = 0; ok && i < l->ndim; i++) ok = l->normalized_shape[i] >= 1;
  if (!ok)
    tg_set_error(TG_ERR_INVALID,
                 "%s: the layer's ndim %d or normalized_shape is invalid (1..8 positive dimensions, as init "
                 "sets them)",
                 fn, l->ndim);
  return ok;
}

static tg_tensor layernorm_apply(const char *fn, const tg_nn_layernorm *l, tg_tensor x) {
  int64_t xs[64];
  int nd = tg_shape(x, xs);
  if (nd < l->ndim || memcmp(xs + nd - l->ndim, l->normalized_shape, sizeof(int64_t) * (size_t)l->ndim))
    return fail("%s: last dimensions of %s must match the normalized shape %s", fn, TSHP(x),
                fmt_shape((char[256]){0}, 256, l->normalized_shape, l->ndim));
  tg_tensor y = tg_layernorm(x, l->ndim, l->eps);
  if (!l->weight.id || !l->bias.id) return y;
  return tg_add(tg_mul(y, l->weight), l->bias);
}

tg_status tg_nn_layernorm_init(tg_nn_layernorm *l, const int64_t *normalized_shape, int ndim,
                               const tg_norm_opts *opts) {
  return layernorm_init("tg_nn_layernorm_init", l, normalized_shape, ndim, opts);
}

tg_tensor tg_nn_layernorm_forward(const tg_nn_layernorm *l, tg_tensor x) {
  const char *fn = "tg_nn_layernorm_forward";
  if (!layer_ok(fn, l, l && l->ndim) || !layernorm_ok(fn, l)) return NONE;
  if (!t_get(x, fn)) return NONE;
  NnOp o = op_begin(fn);
  return op_done(o, layernorm_apply(fn, l, x));
}

tg_status tg_nn_layernorm_state(const tg_nn_layernorm *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight", "bias"};
  return put_all("tg_nn_layernorm_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight, l->bias} : NULL, 2);
}

void tg_nn_layernorm_free(tg_nn_layernorm *l) {
  if (!l) return;
  free_params((tg_tensor *const[]){&l->weight, &l->bias}, 2);
  memset(l, 0, sizeof *l);
}

tg_status tg_nn_layernorm2d_init(tg_nn_layernorm2d *l, int64_t channels, const tg_norm_opts *opts) {
  return layernorm_init("tg_nn_layernorm2d_init", l, (const int64_t[]){channels}, 1, opts);
}

tg_tensor tg_nn_layernorm2d_forward(const tg_nn_layernorm2d *l, tg_tensor x) {
  const char *fn = "tg_nn_layernorm2d_forward";
  if (!layer_ok(fn, l, l && l->ndim) || !layernorm_ok(fn, l)) return NONE;
  if (!t_get(x, fn)) return NONE;
  if (tg_ndim(x) != 4) return fail("%s: input %s must be (batch, channels, height, width)", fn, TSHP(x));
  NnOp o = op_begin(fn);
  tg_tensor y = layernorm_apply(fn, l, tg_permute(x, (const int[]){0, 2, 3, 1}, 4));
  return op_done(o, tg_permute(y, (const int[]){0, 3, 1, 2}, 4));
}

tg_status tg_nn_layernorm2d_state(const tg_nn_layernorm2d *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight", "bias"};
  return put_all("tg_nn_layernorm2d_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight, l->bias} : NULL, 2);
}

void tg_nn_layernorm2d_free(tg_nn_layernorm2d *l) { tg_nn_layernorm_free(l); }

tg_status tg_nn_rmsnorm_init(tg_nn_rmsnorm *l, int64_t dim, const tg_rmsnorm_opts *opts) {
  const char *fn = "tg_nn_rmsnorm_init";
  INIT_BEGIN(fn, l);
  const tg_rmsnorm_opts opts_v = opts ? *opts : *TG_RMSNORM_OPTS();
  opts = &opts_v;
  if (dim < 1) return tg_set_error(TG_ERR_INVALID, "%s: dim=%lld must be positive", fn, (long long)dim);
  double eps = opts->eps;
  if (!eps_ok(fn, eps)) return TG_ERR_INVALID;
  l->dim = dim, l->eps = eps;
  NnOp o = op_begin(fn);
  PDef p[1] = {{&l->weight, !opts->affine ? NONE : tg_ones((const int64_t[]){dim}, 1, NULL), true}};
  tg_status st = op_done_status(o, make_params(p, 1));
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

tg_tensor tg_nn_rmsnorm_forward(const tg_nn_rmsnorm *l, tg_tensor x) {
  const char *fn = "tg_nn_rmsnorm_forward";
  if (!layer_ok(fn, l, l && l->dim)) return NONE;
  if (!t_get(x, fn)) return NONE;
  if (tg_ndim(x) < 1 || tg_dim(x, -1) != l->dim)
    return fail("%s: the last dimension of input %s must be %lld", fn, TSHP(x), (long long)l->dim);
  NnOp o = op_begin(fn);
  tg_tensor xf = tg_float(x);
  tg_tensor ms = tg_mean(tg_square(xf), (const int[]){-1}, 1, true);
  tg_tensor y = tg_cast(tg_mul(xf, tg_rsqrt(tg_add_s(ms, l->eps))), tg_dtype_of(x));
  return op_done(o, l->weight.id ? tg_mul(y, l->weight) : y);
}

tg_status tg_nn_rmsnorm_state(const tg_nn_rmsnorm *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight"};
  return put_all("tg_nn_rmsnorm_state", l, sd, prefix, names, l ? (const tg_tensor[]){l->weight} : NULL, 1);
}

void tg_nn_rmsnorm_free(tg_nn_rmsnorm *l) {
  if (!l) return;
  free_params((tg_tensor *const[]){&l->weight}, 1);
  memset(l, 0, sizeof *l);
}

/* ---------------------------------------------------------------------------------------------- */
/* Embedding                                                                                       */

tg_status tg_nn_embedding_init(tg_nn_embedding *l, int64_t vocab_size, int64_t embed_size) {
  const char *fn = "tg_nn_embedding_init";
  INIT_BEGIN(fn, l);
  if (vocab_size < 1 || embed_size < 1)
    return tg_set_error(TG_ERR_INVALID, "%s: vocab_size=%lld and embed_size=%lld must be positive", fn,
                        (long long)vocab_size, (long long)embed_size);
  l->vocab_size = vocab_size, l->embed_size = embed_size;
  NnOp o = op_begin(fn);
  PDef p[1] = {{&l->weight, tg_glorot_uniform((const int64_t[]){vocab_size, embed_size}, 2, NULL), true}};
  tg_status st = op_done_status(o, make_params(p, 1));
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

tg_tensor tg_nn_embedding_forward(const tg_nn_embedding *l, tg_tensor idx) {
  const char *fn = "tg_nn_embedding_forward";
  if (!layer_ok(fn, l, l && l->weight.id)) return NONE;
  if (!t_get(idx, fn)) return NONE;
  tg_dtype dt = tg_dtype_of(idx);
  if (!tg_dtype_is_int(dt))
    return fail("%s: indices must be an integer tensor, got %s", fn, tg_dtype_name(dt));
  if (tg_ndim(idx) > 60) return fail("%s: indices %s have too many dimensions", fn, TSHP(idx));
  NnOp o = op_begin(fn);
  /* a data-dependent row load instead of tinygrad's (idx == arange(vocab)) one-hot sum: same values
   * and gradient, without vocab-times the work */
  return op_done(o, tg_index(l->weight, idx));
}

tg_status tg_nn_embedding_state(const tg_nn_embedding *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight"};
  return put_all("tg_nn_embedding_state", l, sd, prefix, names, l ? (const tg_tensor[]){l->weight} : NULL, 1);
}

void tg_nn_embedding_free(tg_nn_embedding *l) {
  if (!l) return;
  free_params((tg_tensor *const[]){&l->weight}, 1);
  memset(l, 0, sizeof *l);
}

/* ---------------------------------------------------------------------------------------------- */
/* LSTMCell                                                                                        */

tg_status tg_nn_lstmcell_init(tg_nn_lstmcell *l, int64_t input_size, int64_t hidden_size, bool bias) {
  const char *fn = "tg_nn_lstmcell_init";
  INIT_BEGIN(fn, l);
  if (input_size < 1 || hidden_size < 1)
    return tg_set_error(TG_ERR_INVALID, "%s: input_size=%lld and hidden_size=%lld must be positive", fn,
                        (long long)input_size, (long long)hidden_size);
  int64_t h4;
  if (__builtin_mul_overflow(hidden_size, 4, &h4))
    return tg_set_error(TG_ERR_INVALID, "%s: hidden_size=%lld is too large (4 * hidden_size overflows int64)",
                        fn, (long long)hidden_size);
  l->input_size = input_size, l->hidden_size = hidden_size;
  double stdv = 1.0 / sqrt((double)hidden_size);
  NnOp o = op_begin(fn);
  PDef p[4] = {{&l->weight_ih, lazy_uniform((const int64_t[]){h4, input_size}, 2, stdv), true},
               {&l->weight_hh, lazy_uniform((const int64_t[]){h4, hidden_size}, 2, stdv), true},
               {&l->bias_ih, bias ? tg_zeros((const int64_t[]){h4}, 1, NULL) : NONE, true},
               {&l->bias_hh, bias ? tg_zeros((const int64_t[]){h4}, 1, NULL) : NONE, true}};
  tg_status st = op_done_status(o, make_params(p, 4));
  if (st != TG_OK) memset(l, 0, sizeof *l);
  return st;
}

tg_status tg_nn_lstmcell_forward(const tg_nn_lstmcell *l, tg_tensor x, tg_tensor h, tg_tensor c,
                                 tg_tensor *h_out, tg_tensor *c_out) {
  const char *fn = "tg_nn_lstmcell_forward";
  if (h_out) *h_out = NONE;
  if (c_out) *c_out = NONE;
  if (!h_out || !c_out) return tg_set_error(TG_ERR_INVALID, "%s: h_out and c_out must not be NULL", fn);
  if (!layer_ok(fn, l, l && l->weight_ih.id)) return tg_last_status();
  if (!t_get(x, fn)) return tg_last_status();
  if (!h.id != !c.id) return tg_set_error(TG_ERR_INVALID, "%s: pass both h and c, or neither (zeros)", fn);
  if (tg_ndim(x) != 2 || tg_dim(x, 1) != l->input_size)
    return tg_set_error(TG_ERR_INVALID, "%s: input %s must be (batch, %lld)", fn, TSHP(x),
                        (long long)l->input_size);
  NnOp o = op_begin(fn);
  if (!h.id) {
    tg_opts zo = {tg_dtype_of(x), tg_device_of(x), false};
    h = c = tg_zeros((const int64_t[]){tg_dim(x, 0), l->hidden_size}, 2, &zo);
  }
  tg_tensor gates = tg_add(tg_linear(x, l->weight_ih, l->bias_ih), tg_linear(h, l->weight_hh, l->bias_hh));
  tg_tensor q[4] = {NONE, NONE, NONE, NONE};
  if (tg_valid(gates) && tg_chunk(gates, 4, 1, q, 4) != 4) q[0] = NONE;
  tg_tensor i = tg_sigmoid(q[0]), f = tg_sigmoid(q[1]), g = tg_tanh(q[2]), og = tg_sigmoid(q[3]);
  tg_tensor nc = tg_add(tg_mul(f, c), tg_mul(i, g));
  tg_tensor nh = tg_mul(og, tg_tanh(nc));
  tg_status st = tg_valid(nh) && tg_valid(nc) ? TG_OK : TG_ERR_INVALID;
  if (st == TG_OK && !tg_has_error()) {
    *h_out = tg_keep(nh);
    *c_out = tg_keep(nc);
  }
  st = op_done_status(o, st);
  if (st != TG_OK) *h_out = *c_out = NONE;
  return st;
}

tg_status tg_nn_lstmcell_state(const tg_nn_lstmcell *l, tg_state_dict *sd, const char *prefix) {
  static const char *const names[] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
  return put_all("tg_nn_lstmcell_state", l, sd, prefix, names,
                 l ? (const tg_tensor[]){l->weight_ih, l->weight_hh, l->bias_ih, l->bias_hh} : NULL, 4);
}

void tg_nn_lstmcell_free(tg_nn_lstmcell *l) {
  if (!l) return;
  free_params((tg_tensor *const[]){&l->weight_ih, &l->weight_hh, &l->bias_ih, &l->bias_hh}, 4);
  memset(l, 0, sizeof *l);
}

/* ---------------------------------------------------------------------------------------------- */
/* model state                                                                                     */

/* Looks through realized caches and DETACH (a dict entry is a detached view of its tensor). */
static UOp *skip_detach(UOp *u) {
  for (;;) {
    if (uop_realized(u)) u = uop_realized(u);
    if (u->op != OP_DETACH) return u;
    u = u->src[0];
  }
}

/* The BUFFER node a dict entry denotes. Pending work (a lazy tensor, an unrealized assign) is realized
 * first, which also moves the handles holding it to the buffer. whole: the entry must be the whole
 * buffer (not a view of one); otherwise views resolve to their base buffer. NULL + error. */
static UOp *entry_buffer(const char *fn, const char *name, tg_tensor e, bool whole) {
  UOp *u = t_get(e, fn);
  if (!u) return NULL;
  u = skip_detach(u);
  if (u->op != OP_BUFFER && !g_base_buffer(u)) {
    UOp *t = uop_ref(u);
    tg_status st = realize_uops(&t, 1);
    u = skip_detach(u);
    uop_unref(t); /* u stays alive: the entry's view references it */
    if (st != TG_OK) return NULL;
  }
  if (u->op != OP_BUFFER) {
    UOp *b = whole ? NULL : g_base_buffer(u);
    if (!b) {
      char sb[256];
      tg_set_error(TG_ERR_INVALID,
                   "%s: '%.200s' of shape %s is a view of another tensor, not a tensor with its own buffer",
                   fn, name, fmt_shape(sb, sizeof sb, u->shape, u->ndim));
    }
    return b;
  }
  return u;
}

/* The BUFFER node a live slot's tensor is (its realized buffer, or the buffer its pending ASSIGN
 * writes: *pending then says so); NULL if it is something else. */
static UOp *slot_buffer(const Slot *s, bool *pending) {
  *pending = false;
  UOp *u = s->u;
  if (!u) return NULL;
  if (uop_realized(u)) u = uop_realized(u);
  if (u->op == OP_ASSIGN) {
    *pending = true;
    u = u->src[0];
    if (uop_realized(u)) u = uop_realized(u);
  }
  return u->op == OP_BUFFER ? u : NULL;
}

typedef struct {
  Buffer *b;
  tg_tensor self, best;
  int best_score;
} OwnerScan;
static void owner_scan(void *ctx, Slot *s, tg_tensor h) {
  OwnerScan *o = ctx;
  if (h.id == o->self.id) return;
  bool pend;
  UOp *bn = slot_buffer(s, &pend);
  if (!bn || g_buffer_of(bn) != o->b) return;
  /* requires_grad true, then unset (a dict's own aliases are false), then root scope */
  int score = (s->requires_grad == 1 ? 4 : s->requires_grad < 0 ? 2 : 0) + (s->scope == 0 ? 1 : 0);
  if (score > o->best_score) o->best = h, o->best_score = score;
}

/* The live handle that owns buffer b, other than the dict entry `self` (the fallback when nothing
 * else holds it): preferring requires_grad true, then unset, then root scope, then the oldest slot. */
static tg_tensor owner_of(Buffer *b, tg_tensor self) {
  OwnerScan o = {b, self, self, -1};
  t_each_live(owner_scan, &o);
  return o.best;
}

/* Live handles' nodes on the buffers bufs[0..n) (t_each_live's walk; references in found, each node
 * once): with `pending`, the pending ASSIGNs into them (an optimizer step not yet realized); without,
 * the handles that are the buffer node itself (not `except`). */
typedef struct {
  Buffer *const *bufs;
  int n;
  bool pending;
  PtrVec found;
  UOp *except;
} BufScan;
static void buf_scan(void *ctx, Slot *s, tg_tensor h) {
  (void)h;
  BufScan *bs = ctx;
  bool pend;
  UOp *bn = slot_buffer(s, &pend);
  if (!bn || pend != bs->pending || (!pend && (bn == bs->except || s->u != bn))) return;
  UOp *take = pend ? s->u : bn;
  bool mine = false;
  for (int k = 0; k < bs->n && !mine; k++) mine = bs->bufs[k] == g_buffer_of(bn);
  for (size_t j = 0; j < bs->found.n && mine; j++) mine = bs->found.p[j] != take;
  if (mine) pv_push(&bs->found, uop_ref(take));
}

int tg_state_dict_parameters(const tg_state_dict *sd, bool trainable_only, tg_tensor *out, int cap) {
  const char *fn = "tg_state_dict_parameters";
  if (!sd) return tg_set_error(TG_ERR_INVALID, "%s: state dict is NULL", fn), -1;
  if (out && cap < 0) return tg_set_error(TG_ERR_INVALID, "%s: negative cap %d", fn, cap), -1;
  int n = tg_state_dict_len(sd), cnt = 0;
  tg_tensor *found = tg_xmalloc(sizeof(tg_tensor) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    UOp *bn = entry_buffer(fn, tg_state_dict_name(sd, i), tg_state_dict_tensor(sd, i), false);
    if (!bn) {
      free(found);
      return -1;
    }
    tg_tensor h = owner_of(g_buffer_of(bn), tg_state_dict_tensor(sd, i));
    if (!h.id || (trainable_only && t_slot(h)->requires_grad == 0)) continue;
    bool dup = false;
    for (int j = 0; j < cnt && !dup; j++) dup = found[j].id == h.id;
    if (!dup) found[cnt++] = h;
  }
  if (out) {
    if (cap < cnt) {
      free(found);
      return tg_set_error(TG_ERR_INVALID, "%s: the dict has %d parameters but out has room for %d", fn, cnt,
                          cap),
             -1;
    }
    memcpy(out, found, sizeof(tg_tensor) * (size_t)cnt);
  }
  free(found);
  return cnt;
}

static bool same_shape(tg_tensor a, tg_tensor b, bool *reshape) {
  int64_t sa[64], sb[64];
  int na = tg_shape(a, sa), nb = tg_shape(b, sb);
  *reshape = false;
  if (na < 0 || nb < 0) return false;
  if (na == nb && !memcmp(sa, sb, sizeof(int64_t) * (size_t)na)) return true;
  /* () and (1,) are interchangeable (tinygrad) */
  if ((na == 0 && nb == 1 && sb[0] == 1) || (nb == 0 && na == 1 && sa[0] == 1)) return *reshape = true;
  return false;
}

/* Appends "'name'" to a list of at most 10 names ("... and N more" after). */
static void list_name(SB *b, int *count, const char *name) {
  if (*count < 10) sb_printf(b, "%s'%.200s'", *count ? ", " : "", name);
  (*count)++;
}

tg_status tg_load_state_dict(tg_state_dict *model, const tg_state_dict *loaded, bool strict) {
  const char *fn = "tg_load_state_dict";
  if (!model || !loaded)
    return tg_set_error(TG_ERR_INVALID, "%s: %s dict is NULL", fn, model ? "loaded" : "model");
  int n = tg_state_dict_len(model), nl = tg_state_dict_len(loaded);
  /* 1. check everything before writing anything */
  SB missing, unexpected, shapes;
  sb_init(&missing), sb_init(&unexpected), sb_init(&shapes);
  int nmiss = 0, nunexp = 0, nshape = 0;
  for (int i = 0; i < n; i++) {
    const char *name = tg_state_dict_name(model, i);
    tg_tensor mt = tg_state_dict_tensor(model, i), lt = sd_get_quiet(loaded, name);
    if (!lt.id) {
      if (strict) list_name(&missing, &nmiss, name);
      continue;
    }
    bool rs;
    if (!tg_valid(mt) || !tg_valid(lt)) {
      sb_free(&missing), sb_free(&unexpected), sb_free(&shapes);
      return tg_set_error(TG_ERR_HANDLE, "%s: the tensor of '%.200s' is freed or stale", fn, name);
    }
    if (!same_shape(mt, lt, &rs)) {
      if (nshape < 10)
        sb_printf(&shapes, "%s'%.200s' is %s in the model but %s in the loaded dict", nshape ? ", " : "",
                  name, TSHP(mt), TSHP(lt));
      nshape++;
    }
  }
  if (strict)
    for (int j = 0; j < nl; j++) {
      const char *name = tg_state_dict_name(loaded, j);
      if (!sd_get_quiet(model, name).id) list_name(&unexpected, &nunexp, name);
    }
  if (nmiss || nunexp || nshape) {
    SB msg;
    sb_init(&msg);
    sb_printf(&msg, "%s:", fn);
    const char *sep = " ";
    if (nmiss) {
      sb_printf(&msg, "%smissing keys (in the model, not in the loaded dict): %s", sep,
                missing.s ? missing.s : "");
      if (nmiss > 10) sb_printf(&msg, " and %d more", nmiss - 10);
      sep = "; ";
    }
    if (nunexp) {
      sb_printf(&msg, "%sunexpected keys (in the loaded dict, not in the model): %s", sep,
                unexpected.s ? unexpected.s : "");
      if (nunexp > 10) sb_printf(&msg, " and %d more", nunexp - 10);
      sep = "; ";
    }
    if (nshape) {
      sb_printf(&msg, "%sshape mismatch: %s", sep, shapes.s ? shapes.s : "");
      if (nshape > 10) sb_printf(&msg, " and %d more", nshape - 10);
    }
    if (nmiss || nunexp) sb_printf(&msg, " (strict=false skips missing and unexpected keys)");
    char *m = sb_take(&msg);
    tg_set_error(TG_ERR_INVALID, "%s", m);
    free(m);
    sb_free(&missing), sb_free(&unexpected), sb_free(&shapes);
    return TG_ERR_INVALID;
  }
  sb_free(&missing), sb_free(&unexpected), sb_free(&shapes);

  /* 2. one assign per target buffer (a later name for the same buffer wins), realized together */
  NnOp o = op_begin(fn);
  tg_tensor *tmp = tg_xmalloc(sizeof(tg_tensor) * (size_t)(n + 1));
  Buffer **bufs = tg_xmalloc(sizeof(Buffer *) * (size_t)(n + 1));
  Buffer **ebuf = tg_xcalloc((size_t)(n + 1), sizeof(Buffer *));
  tg_tensor *vals = tg_xmalloc(sizeof(tg_tensor) * (size_t)(n + 1));
  int m = 0;
  tg_status st = TG_OK;
  for (int i = 0; i < n && st == TG_OK; i++) {
    const char *name = tg_state_dict_name(model, i);
    tg_tensor lt = sd_get_quiet(loaded, name);
    if (!lt.id) continue;
    UOp *bn = entry_buffer(fn, name, tg_state_dict_tensor(model, i), true);
    if (!bn) {
      st = tg_last_status();
      break;
    }
    tg_tensor v = lt;
    bool rs;
    same_shape(tg_state_dict_tensor(model, i), lt, &rs);
    if (rs) v = tg_reshape(v, bn->shape, bn->ndim);
    const char *dev = device_full_name(device_by_id(bn->device));
    if (strcmp(tg_device_of(v), dev) != 0) v = tg_to(v, dev);
    int k = 0;
    while (k < m && bufs[k] != g_buffer_of(bn)) k++;
    if (k == m) {
      bufs[m] = g_buffer_of(bn);
      tmp[m] = t_wrap(uop_ref(bn));
      m++;
    }
    ebuf[i] = bufs[k];
    vals[k] = v;
  }
  /* pending assigns on these buffers (an optimizer step not yet realized) happen before the load */
  if (st == TG_OK) {
    BufScan bs = {bufs, m, true, {0}, NULL};
    t_each_live(buf_scan, &bs);
    if (bs.found.n) st = realize_uops((UOp **)bs.found.p, (int)bs.found.n);
    for (size_t i = 0; i < bs.found.n; i++) uop_unref(bs.found.p[i]);
    pv_free(&bs.found);
  }
  for (int k = 0; k < m && st == TG_OK; k++)
    if (!tg_assign(tmp[k], vals[k]).id) st = tg_last_status();
  if (st == TG_OK && m) st = tg_realize_many(tmp, m);
  /* 3. every live handle of a written buffer moves to the written version; the dict entries too */
  if (st == TG_OK) {
    for (int k = 0; k < m; k++) {
      UOp *nn = t_get(tmp[k], fn);
      if (!nn) continue;
      BufScan bs = {&bufs[k], 1, false, {0}, nn};
      t_each_live(buf_scan, &bs);
      for (size_t j = 0; j < bs.found.n; j++) t_replace_everywhere((UOp *)bs.found.p[j], nn), uop_unref(bs.found.p[j]);
      pv_free(&bs.found);
    }
    for (int i = 0; i < n && st == TG_OK; i++)
      for (int k = 0; k < m && ebuf[i]; k++)
        if (ebuf[i] == bufs[k]) {
          st = tg_state_dict_set(model, tg_state_dict_name(model, i), tmp[k]);
          break;
        }
  }
  free(tmp), free(bufs), free(ebuf), free(vals);
  return op_done_status(o, st);
}
