/*
 * opforms.c -- tinygrad's non-default forms of ops: exact (erf) gelu, softmin, Lp normalize, one-sided
 * isinf, selu and hardsigmoid with their parameters, and the dtype argument of softmax, log_softmax,
 * matmul / dot, linear and einsum.
 *
 * In: handles and plain parameters. Out: a new handle in the caller's scope, or none with the first
 * error naming the function. Everything is composed from public ops, as tinygrad composes them in its
 * Tensor class, so the results fuse with their neighbours and autograd differentiates them through the
 * primitive rules. Untaken where() branches get safe inputs (exp of a clamped value) so that their
 * zero gradient never meets an inf.
 */
#include <math.h>
#include <string.h>

#include "compose.h"

#define NONE ((tg_tensor){0})

static bool is_half(tg_dtype dt) { return dt == TG_FLOAT16 || dt == TG_BFLOAT16; }
static tg_dtype float_of(tg_dtype dt) { return tg_dtype_is_float(dt) ? dt : tg_default_float(); }
/* 16-bit floats compute in float32 and round once at the end (as math.c does) */
static tg_dtype wide(tg_dtype dt) { return is_half(dt) ? TG_FLOAT32 : dt; }

/* ---------------------------------------------------------------------------------------------- */
/* activations                                                                                     */

tg_tensor tg_gelu_ex(tg_tensor x, const char *approximate) {
  const char *fn = "tg_gelu_ex";
  if (!t_get(x, fn)) return NONE;
  if (!approximate) approximate = "tanh";
  bool exact = !strcmp(approximate, "none");
  if (!exact && strcmp(approximate, "tanh"))
    return op_fail("%s: approximate is \"%s\"; use \"tanh\" or \"none\" (exact, with erf)", fn, approximate);
  if (!exact) {
    OpScope o = op_scope_begin(fn);
    return op_scope_done(o, tg_gelu(x));
  }
  OpScope o = op_scope_begin(fn);
  tg_dtype od = float_of(tg_dtype_of(x));
  tg_tensor a = tg_cast(x, wide(od));
  /* x/2 (1 + erf(x / sqrt 2)) */
  tg_tensor r = tg_mul(tg_mul_s(a, 0.5), tg_add_s(tg_erf(tg_mul_s(a, 0.70710678118654752440)), 1.0));
  return op_scope_done(o, tg_cast(r, od));
}

tg_tensor tg_selu_ex(tg_tensor x, double alpha, double gamma) {
  const char *fn = "tg_selu_ex";
  if (!t_get(x, fn)) return NONE;
  OpScope o = op_scope_begin(fn);
  tg_dtype od = float_of(tg_dtype_of(x));
  tg_tensor a = tg_cast(x, wide(od)), pos = tg_logical_not(tg_lt_s(a, 0));
  tg_tensor xn = tg_where(pos, tg_zeros_like(a, NULL), a);
  tg_tensor r = tg_mul_s(tg_where(pos, a, tg_mul_s(tg_sub_s(tg_exp(xn), 1), alpha)), gamma);
  return op_scope_done(o, tg_cast(r, od));
}

tg_tensor tg_hardsigmoid_ex(tg_tensor x, double alpha, double beta) {
  const char *fn = "tg_hardsigmoid_ex";
  if (!t_get(x, fn)) return NONE;
  OpScope o = op_scope_begin(fn);
  /* clamp(alpha x + beta, 0, 1) as two where()s, like tg_hardsigmoid (nan propagates, inf saturates) */
  tg_tensor v = tg_add_s(tg_mul_s(x, alpha), beta);
  v = tg_where(tg_lt_s(v, 0), tg_const_like(v, 0), v);
  v = tg_where(tg_gt_s(v, 1), tg_const_like(v, 1), v);
  return op_scope_done(o, v);
}

tg_tensor tg_isinf_ex(tg_tensor x, bool detect_positive, bool detect_negative) {
  const char *fn = "tg_isinf_ex";
  if (!t_get(x, fn)) return NONE;
  OpScope o = op_scope_begin(fn);
  tg_tensor r;
  if (detect_positive && detect_negative) r = tg_isinf(x);
  else if (detect_positive) r = tg_eq_s(x, INFINITY);
  else if (detect_negative) r = tg_eq_s(x, -INFINITY);
  else r = tg_zeros_like(x, &(tg_opts){.dtype = TG_BOOL});
  return op_scope_done(o, r);
}

/* ---------------------------------------------------------------------------------------------- */
/* softmax family with a dtype                                                                     */

/* tinygrad's _softmax: m = x - max(x) (max detached), cast to dtype when one is given; e = exp(m);
 * s = sum(e) keepdim. dtype TG_DTYPE_DEFAULT: x's float dtype. */
static bool softmax_parts(const char *fn, tg_tensor x, int axis, tg_dtype dtype, tg_tensor *m, tg_tensor *e,
                          tg_tensor *s) {
  if (dtype != TG_DTYPE_DEFAULT && !tg_dtype_is_float(dtype)) {
    op_fail("%s: dtype %s is not a float dtype", fn, tg_dtype_name(dtype));
    return false;
  }
  int ax[1] = {axis}, nax = tg_ndim(x) ? 1 : 0;
  tg_tensor xf = tg_cast(x, float_of(tg_dtype_of(x)));
  *m = tg_sub(xf, tg_detach(tg_max(xf, ax, nax, true)));
  if (dtype != TG_DTYPE_DEFAULT) *m = tg_cast(*m, dtype);
  *e = tg_exp(*m);
  *s = tg_sum(*e, ax, nax, true);
  return tg_valid(*s);
}

tg_tensor tg_softmax_dtype(tg_tensor x, int axis, tg_dtype dtype) {
  const char *fn = "tg_softmax_dtype";
  if (!t_get(x, fn)) return NONE;
  OpScope o = op_scope_begin(fn);
  tg_tensor m, e, s;
  if (!softmax_parts(fn, x, axis, dtype, &m, &e, &s)) return op_scope_done(o, NONE);
  return op_scope_done(o, tg_mul(e, tg_reciprocal(s)));
}

tg_tensor tg_log_softmax_dtype(tg_tensor x, int axis, tg_dtype dtype) {
  const char *fn = "tg_log_softmax_dtype";
  if (!t_get(x, fn)) return NONE;
  OpScope o = op_scope_begin(fn);
  tg_tensor m, e, s;
  if (!softmax_parts(fn, x, axis, dtype, &m, &e, &s)) return op_scope_done(o, NONE);
  return op_scope_done(o, tg_sub(m, tg_log(s)));
}

tg_tensor tg_softmin(tg_tensor x, int axis, tg_dtype dtype) {
  const char *fn = "tg_softmin";
  if (!t_get(x, fn)) return NONE;
  OpScope o = op_scope_begin(fn);
  tg_tensor m, e, s;
  /* (an integer is negated as a float: -x of an unsigned tensor would wrap) */
  if (!softmax_parts(fn, tg_neg(tg_cast(x, float_of(tg_dtype_of(x)))), axis, dtype, &m, &e, &s)) return op_scope_done(o, NONE);
  return op_scope_done(o, tg_mul(e, tg_reciprocal(s)));
}

/* ---------------------------------------------------------------------------------------------- */
/* normalize                                                                                       */

tg_tensor tg_normalize(tg_tensor x, double p, int dim, double eps) {
  const char *fn = "tg_normalize";
  if (!t_get(x, fn)) return NONE;
  if (isnan(p) || p < 0 || isinf(p)) return op_fail("%s: p = %g must be finite and non-negative", fn, p);
  if (tg_ndim(x) == 0) return op_fail("%s: x is 0-d; it needs a dimension to normalize along", fn);
  OpScope o = op_scope_begin(fn);
  int ax[1] = {dim};
  /* an integer tensor is normalized as floats: |x|^p in its own dtype would wrap (tinygrad's p is a
   * Python float, which promotes) */
  x = tg_cast(x, float_of(tg_dtype_of(x)));
  tg_tensor den = p == 0 ? tg_sum(tg_ne_s(x, 0), ax, 1, true)
                         : tg_pow_s(tg_sum(tg_pow_s(tg_abs(x), p), ax, 1, true), 1.0 / p);
  return op_scope_done(o, tg_div(x, tg_maximum_s(den, eps)));
}

/* ---------------------------------------------------------------------------------------------- */
/* Newton-Schulz iteration (tinygrad's Tensor.newton_schulz, used by Muon)                         */

tg_tensor tg_newton_schulz(tg_tensor x, int steps, const double *coefs, int ncoefs, double eps) {
  const char *fn = "tg_newton_schulz";
  if (!t_get(x, fn)) return NONE;
  int nd = tg_ndim(x);
  if (nd < 2) return op_fail("%s: x has %d dims; the iteration works on matrices (at least 2 dims)", fn, nd);
  if (steps < 0 || steps > TG_NS_MAX_STEPS)
    return op_fail("%s: steps %d must be in 0..%d (Muon uses 5)", fn, steps, TG_NS_MAX_STEPS);
  if (ncoefs < 1 || !coefs) return op_fail("%s: needs at least one coefficient (ncoefs=%d)", fn, ncoefs);
  if (ncoefs > TG_MUON_MAX_COEFS)
    return op_fail("%s: %d coefficients; at most %d (the polynomial's terms)", fn, ncoefs, TG_MUON_MAX_COEFS);
  for (int i = 0; i < ncoefs; i++)
    if (!isfinite(coefs[i])) return op_fail("%s: coefficient %d (%g) is not finite", fn, i, coefs[i]);
  int64_t sh[64];
  tg_shape(x, sh);
  OpScope o = op_scope_begin(fn);
  /* a tall matrix iterates on its transpose, so that G G^T is the smaller Gram matrix */
  bool tall = sh[nd - 2] > sh[nd - 1];
  tg_tensor g = tall ? tg_transpose(x, -2, -1) : x;
  tg_tensor nrm = tg_sqrt(tg_sum(tg_square(g), (const int[]){-2, -1}, 2, true));
  g = tg_div(g, tg_add_s(nrm, eps));
  for (int s = 0; s < steps; s++) {
    /* the odd polynomial sum_i c_i (G G^T)^i G */
    tg_tensor a = tg_matmul(g, tg_transpose(g, -2, -1)), term = g;
    tg_tensor acc = tg_mul_s(g, coefs[0]);
    for (int i = 1; i < ncoefs; i++) {
      term = tg_matmul(a, term);
      acc = tg_add(acc, tg_mul_s(term, coefs[i]));
    }
    g = acc;
  }
  return op_scope_done(o, tall ? tg_transpose(g, -2, -1) : g);
}
