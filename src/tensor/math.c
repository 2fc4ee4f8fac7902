/*
 * math.c -- elementwise math, activations, rounding, predicates and dtype shorthands, composed from
 * the public primitive ops (tg_add, tg_where, tg_exp, tg_sin, ...) the way tinygrad composes them in
 * its Tensor class.
 *
 * In: handles and scalar parameters. Out: a new handle in the caller's scope, or none with the first
 * error of the thread naming the function. Nothing here touches nodes or kernels directly: the result
 * is an ordinary lazy graph, so it fuses with its neighbours (sigmoid(x).sum() is one kernel) and
 * autograd differentiates it through the primitive rules. Intermediate handles live in a private scope
 * that ends before the function returns; the result keeps the nodes it was built from alive.
 *
 * Where tinygrad's formula relies on a codegen rewrite we do not have (its stable-sigmoid rules) or
 * loses accuracy at the ends of the float range (cos of a large argument, atan/asinh/acosh once x*x
 * overflows, round above 2^mantissa), the formula is rearranged so that the forward value and the
 * gradient stay finite and accurate; each such place says why. Untaken where() branches are always
 * fed safe inputs: the gradient of an untaken branch is 0, and 0 * inf would make it nan.
 *
 * Float functions on 16-bit floats compute in float32 and round once at the end (as PyTorch does);
 * integer inputs to float functions become DEFAULT_FLOAT, as in tinygrad.
 */
#include <math.h>

#include "tensor.h"

#define NONE ((tg_tensor){0})
#define PI_2 1.57079632679489661923

/* Opens the private scope after checking the input handle (so errors name the public function). */
#define BEGIN(fn, x)                                                                                         \
  do {                                                                                                       \
    if (!t_get((x), (fn))) return NONE;                                                                      \
    tg_scope_begin();                                                                                        \
  } while (0)

/* Moves r to the caller's scope and ends the private one (freeing every intermediate handle). */
static tg_tensor done(tg_tensor r) {
  if (tg_valid(r))
    r = tg_keep(r);
  else
    r = NONE;
  tg_scope_end();
  return r;
}

static tg_tensor fail_in_scope(tg_status st, const char *fmt, const char *fn, const char *what) {
  tg_set_error(st, fmt, fn, what);
  tg_scope_end();
  return NONE;
}

/* ---------------------------------------------------------------------------------------------- */
/* small helpers (all results belong to the current scope)                                         */

static tg_tensor K(tg_tensor like, double v) { return tg_const_like(like, v); }
static tg_tensor same(tg_tensor x) { return tg_cast(x, tg_dtype_of(x)); } /* a new handle, same node */
static bool is_half(tg_dtype dt) { return dt == TG_FLOAT16 || dt == TG_BFLOAT16; }
static tg_dtype float_of(tg_dtype dt) { return tg_dtype_is_float(dt) ? dt : tg_default_float(); }
/* dtype the computation runs in: 16-bit floats widen to float32 */
static tg_dtype wide(tg_dtype dt) { return is_half(dt) ? TG_FLOAT32 : dt; }
/* trigonometry widens float32 to float64: cos/tan of large float32 arguments stay exact */
static tg_dtype wide_trig(tg_dtype dt) {
  return dt == TG_FLOAT64 || dt == TG_FLOAT32 ? TG_FLOAT64 : TG_FLOAT32;
}

/* |x| as a where(): gradient +1 at 0, so odd extensions below are differentiable at 0 */
static tg_tensor wabs(tg_tensor x) { return tg_where(tg_lt_s(x, 0), tg_neg(x), x); }

typedef tg_tensor (*ufn)(tg_tensor);
/* f extended to negative x as an odd function: sign(x) * f(|x|), with f(-0) = -f(0) harmless */
static tg_tensor odd(tg_tensor x, ufn f) {
  tg_tensor n = tg_lt_s(x, 0);
  tg_tensor r = f(tg_where(n, tg_neg(x), x));
  return tg_where(n, tg_neg(r), r);
}

/* Horner: c[0]*x^(n-1) + ... + c[n-1] (tinygrad's polyN, highest degree first) */
static tg_tensor polyn(tg_tensor x, const double *c, int n) {
  tg_tensor acc = tg_add_s(tg_mul_s(x, c[0]), c[1]);
  for (int i = 2; i < n; i++) acc = tg_add_s(tg_mul(acc, x), c[i]);
  return acc;
}

/* Checks that x and y broadcast; records an error naming fn otherwise. */
static bool bcast_ok(const char *fn, tg_tensor x, tg_tensor y) {
  int64_t sx[64], sy[64];
  int nx = tg_ndim(x), ny = tg_ndim(y);
  if (nx < 0 || ny < 0 || nx > 64 || ny > 64) return true; /* let the op report it */
  tg_shape(x, sx), tg_shape(y, sy);
  int n = nx > ny ? nx : ny;
  for (int i = 0; i < n; i++) {
    int64_t a = i < n - nx ? 1 : sx[i - (n - nx)], b = i < n - ny ? 1 : sy[i - (n - ny)];
    if (a != b && a != 1 && b != 1) {
      char s1[256], s2[256];
      tg_set_error(TG_ERR_INVALID,
                   "%s: shapes %s and %s cannot broadcast (each dimension must match or be 1)", fn,
                   fmt_shape(s1, sizeof s1, sx, nx), fmt_shape(s2, sizeof s2, sy, ny));
      return false;
    }
  }
  return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* float cores: x is already in the compute dtype                                                  */

/* tinygrad: 1/(1+exp(-x)). Its backward is nan at |x| > ~88 (0 * inf in exp2's gradient) unless
 * the stable-sigmoid codegen rewrite fires, so we write it with t = exp(-|x|) <= 1:
 * x >= 0: 1/(1+t); x < 0: t/(1+t). Same value, finite gradient everywhere, one kernel. */
static tg_tensor sigmoid_t(tg_tensor x) { return tg_exp(tg_where(tg_lt_s(x, 0), x, tg_neg(x))); }

/* d sigmoid(x) = t / (1 + t)^2 for either sign of x, one product with the incoming gradient (the
 * composed graph's two paths, g*s and g*t*(-s^2) for x < 0, made inf - inf = nan of an infinite
 * gradient, where tinygrad and PyTorch give inf) */
static void sigmoid_grad(UOp *out, UOp *g, UOp *const *in, int n, UOp **grads) {
  (void)out, (void)n;
  tg_scope_begin();
  tg_tensor t = sigmoid_t(t_wrap(uop_ref(in[0])));
  tg_tensor s = tg_reciprocal(tg_add_s(t, 1));
  UOp *u = t_get(tg_mul(t_wrap(uop_ref(g)), tg_mul(tg_mul(t, s), s)), "tg_sigmoid");
  grads[0] = u ? uop_ref(u) : NULL;
  tg_scope_end();
}

static tg_tensor sigmoid_(tg_tensor x) {
  tg_tensor n = tg_lt_s(x, 0);
  tg_tensor t = sigmoid_t(x);
  tg_tensor s = tg_reciprocal(tg_add_s(t, 1));
  tg_tensor r = tg_where(n, tg_mul(t, s), s);
  UOp *ru = t_get(r, "tg_sigmoid"), *xu = t_get(x, "tg_sigmoid");
  if (ru && xu && tg_dtype_is_float((tg_dtype)ru->dtype)) ag_set_custom_grad_mode(ru, &xu, 1, sigmoid_grad, AG_SHARD_ELEMENTWISE);
  return r;
}

static tg_tensor tanh_(tg_tensor x) { return tg_sub_s(tg_mul_s(sigmoid_(tg_mul_s(x, 2)), 2), 1); }

/* log(exp(a)+exp(b)) = max(a,b) + log(1 + exp(-|a-b|)). tinygrad subtracts the max from both, which
 * is nan for a = +inf (inf - inf); equal arguments (both infinite too) take d = 0. */
static tg_tensor logaddexp_(tg_tensor a, tg_tensor b) {
  tg_tensor m = tg_maximum(a, b);
  tg_tensor d = tg_where(tg_eq(a, b), K(a, 0), tg_sub(a, b));
  tg_tensor e = tg_exp(tg_neg(wabs(d)));
  return tg_add(tg_log(tg_add_s(e, 1)), m);
}

/* (1/beta) logaddexp(beta x, 0) as tinygrad, and x itself where beta x > 20 (PyTorch's threshold):
 * the same value in float precision, and finite when beta x overflows */
static tg_tensor softplus_(tg_tensor x, double beta) {
  tg_tensor xb = tg_mul_s(x, beta);
  return tg_where(tg_gt_s(xb, 20), x, tg_mul_s(logaddexp_(xb, K(xb, 0)), 1.0 / beta));
}
static tg_tensor softplus1_(tg_tensor x) { return softplus_(x, 1.0); }

/* exp(x) - 1 for the negative side of elu/celu/selu: x <= 0 there, so exp never overflows */
static tg_tensor negpart(tg_tensor x, tg_tensor *pos) {
  *pos = tg_gt_s(x, 0);
  return tg_where(*pos, K(x, 0), x);
}

/* cos(x) = 1 - 2 sin(x/2)^2. tinygrad writes sin(pi/2 - x), which is wrong once pi/2 - x rounds (|x|
 * above ~1e6 in float32, ~1e15 in float64); x/2 is exact, so this form is accurate over the whole
 * range (computed in float64 for float32 inputs, so the cancellation near the zeros of cos is
 * invisible after rounding). Its gradient is -2 sin(x/2) cos(x/2) = -sin(x). */
static tg_tensor cos_(tg_tensor x) {
  tg_tensor s = tg_sin(tg_mul_s(x, 0.5));
  return tg_rsub_s(1, tg_mul_s(tg_mul(s, s), 2));
}

/* Abramowitz & Stegun 4.4.46 on [0, 1] (tinygrad's asin polynomial, |error| <= 2e-8):
 * acos(a) = sqrt(1-a) * p(a), asin(a) = pi/2 - acos(a). */
static const double ASIN_C[] = {-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810,
                                -0.0501743046, 0.0889789874, -0.2145988016, 1.5707963050};
static tg_tensor acos_pos(tg_tensor a) { return tg_mul(tg_sqrt(tg_rsub_s(1, a)), polyn(a, ASIN_C, 8)); }
static tg_tensor asin_pos(tg_tensor a) { return tg_rsub_s(PI_2, acos_pos(a)); }

/* tinygrad: asin(x / sqrt(1 + x*x)), which returns 0 once x*x overflows (|x| > 1.8e19 in float32)
 * and loses digits above |x| ~ 1e3. For a > 1 we use atan(a) = pi/2 - atan(1/a); the reciprocal is
 * fed a safe value on the untaken side. */
static tg_tensor atan_pos(tg_tensor a) {
  tg_tensor big = tg_gt_s(a, 1);
  tg_tensor z = tg_where(big, tg_reciprocal(tg_where(big, a, K(a, 1))), a);
  tg_tensor f = asin_pos(tg_div(z, tg_sqrt(tg_add_s(tg_mul(z, z), 1))));
  return tg_where(big, tg_rsub_s(PI_2, f), f);
}

/* A&S 7.1.26 (tinygrad's erf polynomial, |error| <= 1.5e-7) on a >= 0 */
static const double ERF_C[] = {1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592};
static tg_tensor erf_pos(tg_tensor a) {
  /* erf is 1 (rounded) from 6 on: clamping there keeps the gradient at +-inf 0, not 0 * inf */
  a = tg_where(tg_gt_s(a, 6), K(a, 6), a);
  tg_tensor t = tg_reciprocal(tg_add_s(tg_mul_s(a, 0.3275911), 1));
  tg_tensor p = tg_mul(t, polyn(t, ERF_C, 5));
  return tg_rsub_s(1, tg_mul(p, tg_exp(tg_neg(tg_mul(a, a)))));
}

/* asinh(a), a >= 0. tinygrad: log(x + sqrt(x*x + 1)), which cancels for x << 0 and overflows for
 * |x| > 1.8e19 (float32). For a > 1: log(a) + log(1 + sqrt(1 + (1/a)^2)). */
static tg_tensor asinh_pos(tg_tensor a) {
  tg_tensor big = tg_gt_s(a, 1);
  tg_tensor ab = tg_where(big, a, K(a, 2)), as = tg_where(big, K(a, 1), a);
  tg_tensor r = tg_reciprocal(ab);
  tg_tensor fb = tg_add(tg_log(ab), tg_log(tg_add_s(tg_sqrt(tg_add_s(tg_mul(r, r), 1)), 1)));
  tg_tensor fs = tg_log(tg_add(as, tg_sqrt(tg_add_s(tg_mul(as, as), 1))));
  return tg_where(big, fb, fs);
}

/* acosh(x): log(x + sqrt(x-1) sqrt(x+1)) for 0 <= x <= 2 (no cancellation near 1; nan below 1).
 * Below 0 it is nan - acosh(|x|): the value stays nan, and the gradient is 1/sqrt(x^2-1) for x <= -1,
 * as tinygrad and PyTorch have it. Above 2, log(x) + log(1 + sqrt(1 - (1/x)^2)), so x*x never
 * overflows. */
static tg_tensor acosh_(tg_tensor x) {
  tg_tensor big = tg_gt_s(x, 2);
  tg_tensor xb = tg_where(big, x, K(x, 4)), xs = tg_where(big, K(x, 1.5), x);
  tg_tensor r = tg_reciprocal(xb);
  tg_tensor fb = tg_add(tg_log(xb), tg_log(tg_add_s(tg_sqrt(tg_rsub_s(1, tg_mul(r, r))), 1)));
  tg_tensor ax = wabs(xs);
  tg_tensor fa = tg_log(tg_add(ax, tg_mul(tg_sqrt(tg_sub_s(ax, 1)), tg_sqrt(tg_add_s(ax, 1)))));
  tg_tensor fs = tg_where(tg_lt_s(xs, 0), tg_rsub_s(NAN, fa), fa);
  return tg_where(big, fb, fs);
}

static tg_tensor sign_(tg_tensor x) {
  tg_dtype dt = tg_dtype_of(x);
  if (dt == TG_BOOL) return same(x);
  if (tg_dtype_is_unsigned(dt)) return tg_cast(tg_ne_s(x, 0), dt);
  if (!tg_dtype_is_float(dt))
    return tg_where(tg_gt_s(x, 0), K(x, 1), tg_where(tg_lt_s(x, 0), K(x, -1), K(x, 0)));
  /* tinygrad's where(x != 0, where(x < 0, -1, 1), 0) gives 1 for nan; PyTorch gives 0. The middle
   * value is trunc(x) for +-0 (so sign(-0) = -0 and abs(-0) = -0 * -0 = +0) and 0 for nan; trunc also
   * keeps x connected to the result for autograd, with gradient 0 */
  tg_tensor mid = tg_trunc(tg_where(tg_ne(x, x), K(x, 0), x));
  return tg_where(tg_gt_s(x, 0), K(x, 1), tg_where(tg_lt_s(x, 0), K(x, -1), mid));
}

/* d|x| = sign(x) (tinygrad's: 0 at 0, and 0 for nan) */
static void abs_grad(UOp *out, UOp *g, UOp *const *in, int n, UOp **grads) {
  (void)out, (void)n;
  tg_scope_begin();
  UOp *u = t_get(tg_mul(t_wrap(uop_ref(g)), sign_(t_wrap(uop_ref(in[0])))), "tg_abs");
  grads[0] = u ? uop_ref(u) : NULL;
  tg_scope_end();
}

static tg_tensor abs_(tg_tensor x) {
  tg_dtype dt = tg_dtype_of(x);
  if (dt == TG_BOOL || tg_dtype_is_unsigned(dt)) return same(x);
  if (!tg_dtype_is_float(dt)) return wabs(x);
  if (dt != TG_FLOAT32 && !is_half(dt)) return tg_mul(x, sign_(x)); /* tinygrad: gradient sign(x), 0 at 0 */
  /* the sign bit cleared: |x| for every x, -0 and nan included, in one instruction (x * sign(x)
   * took three compares, a trunc, three selects and a multiply: log(|x|) ran at 1.3x log(x)) */
  tg_dtype bits = dt == TG_FLOAT32 ? TG_UINT32 : TG_UINT16;
  tg_tensor b = tg_bitcast(x, bits);
  tg_tensor r = tg_bitcast(tg_bitwise_and(b, K(b, dt == TG_FLOAT32 ? 0x7fffffff : 0x7fff)), dt);
  UOp *ru = t_get(r, "tg_abs"), *xu = t_get(x, "tg_abs");
  if (ru && xu) ag_set_custom_grad_mode(ru, &xu, 1, abs_grad, AG_SHARD_ELEMENTWISE);
  return r;
}

static tg_tensor floor_(tg_tensor x) {
  tg_tensor b = tg_trunc(x);
  return tg_where(tg_lt(x, b), tg_sub_s(b, 1), b);
}
static tg_tensor ceil_(tg_tensor x) {
  tg_tensor b = tg_trunc(x);
  return tg_where(tg_gt(x, b), tg_add_s(b, 1), b);
}

/* ---------------------------------------------------------------------------------------------- */
/* float functions: int inputs become DEFAULT_FLOAT; 16-bit floats compute in float32               */

#define FLOAT_FN(name, core, widen)                                                                          \
  tg_tensor tg_##name(tg_tensor x) {                                                                         \
    BEGIN("tg_" #name, x);                                                                                   \
    tg_dtype o = float_of(tg_dtype_of(x));                                                                   \
    return done(tg_cast(core(tg_cast(x, widen(o))), o));                                                     \
  }

static tg_tensor log10_(tg_tensor x) { return tg_mul_s(tg_log2(x), 0.301029995663981195214); }
static tg_tensor rsqrt_(tg_tensor x) { return tg_reciprocal(tg_sqrt(x)); }
static tg_tensor tan_(tg_tensor x) { return tg_div(tg_sin(x), cos_(x)); }
/* asin and atan are odd: at 0 the polynomial leaves pi/2 - c0's rounding (1.2e-7 in float32), where
 * tinygrad's multiplication by sign(x) gives 0 -- x itself is returned there (its gradient 1 is
 * theirs too) */
static tg_tensor asin_(tg_tensor x) { return tg_where(tg_eq_s(x, 0), x, odd(x, asin_pos)); }
static tg_tensor acos_(tg_tensor x) {
  tg_tensor n = tg_lt_s(x, 0);
  tg_tensor g = acos_pos(tg_where(n, tg_neg(x), x));
  return tg_where(n, tg_rsub_s(M_PI, g), g);
}
static tg_tensor atan_(tg_tensor x) { return tg_where(tg_eq_s(x, 0), x, odd(x, atan_pos)); }
static tg_tensor logsigmoid_(tg_tensor x) { return tg_neg(softplus1_(tg_neg(x))); }
static tg_tensor swish_(tg_tensor x) { return tg_mul(x, sigmoid_(x)); }
static tg_tensor quick_gelu_(tg_tensor x) { return tg_mul(x, sigmoid_(tg_mul_s(x, 1.702))); }
static tg_tensor mish_(tg_tensor x) { return tg_mul(x, tanh_(softplus1_(x))); }
static tg_tensor softsign_(tg_tensor x) { return tg_div(x, tg_add_s(wabs(x), 1)); }
/* (exp(x) -+ exp(-x)) / 2; past |x| = 80 with the halving folded into the exponent, finite up to
 * |x| = 89.4 in float32 where exp(x) alone overflows at 88.7. Not below: x - ln 2 rounds, which cost
 * 1.3e-6 of relative accuracy at x = 20. Each side is fed 0 where the other is taken, so that its
 * gradient there is 0, not 0 * inf. */
static tg_tensor sinh_cosh(tg_tensor x, bool is_cosh) {
  tg_tensor big = tg_gt_s(wabs(x), 80), zero = K(x, 0);
  tg_tensor xs = tg_where(big, zero, x), xb = tg_where(big, x, zero);
  tg_tensor e = tg_exp(xs), f = tg_exp(tg_neg(xs));
  tg_tensor g = tg_exp(tg_sub_s(xb, M_LN2)), h = tg_exp(tg_sub_s(tg_neg(xb), M_LN2));
  tg_tensor small = tg_mul_s(is_cosh ? tg_add(e, f) : tg_sub(e, f), 0.5);
  return tg_where(big, is_cosh ? tg_add(g, h) : tg_sub(g, h), small);
}
static tg_tensor sinh_(tg_tensor x) { return sinh_cosh(x, false); }
static tg_tensor cosh_(tg_tensor x) { return sinh_cosh(x, true); }
/* (log(1+x) - log(1-x)) / 2: tinygrad's log((1+x)/(1-x)) / 2 in two logs, so that the gradient at
 * x = +-1 is inf (the quotient's derivative there is 0 * inf = nan) */
static tg_tensor atanh_(tg_tensor x) {
  return tg_mul_s(tg_sub(tg_log(tg_add_s(x, 1)), tg_log(tg_rsub_s(1, x))), 0.5);
}
static tg_tensor asinh_(tg_tensor x) { return odd(x, asinh_pos); }
static tg_tensor erf_(tg_tensor x) { return odd(x, erf_pos); }
static tg_tensor gelu_(tg_tensor x) {
  tg_tensor x3 = tg_mul(tg_mul(x, x), x);
  tg_tensor in = tg_mul_s(tg_add(x, tg_mul_s(x3, 0.044715)), 0.79788456080286535588 /* sqrt(2/pi) */);
  return tg_mul(tg_mul_s(x, 0.5), tg_add_s(tanh_(in), 1));
}
static tg_tensor selu_(tg_tensor x) {
  /* x >= 0 takes the linear branch: tinygrad's gradient at 0 is scale (PyTorch's is scale * alpha) */
  tg_tensor pos = tg_ge(x, K(x, 0)), xn = tg_where(pos, K(x, 0), x);
  tg_tensor neg = tg_mul_s(tg_sub_s(tg_exp(xn), 1), 1.6732632423543772848170429916717);
  return tg_mul_s(tg_where(pos, x, neg), 1.0507009873554804934193349852946);
}

FLOAT_FN(log10, log10_, wide)
FLOAT_FN(rsqrt, rsqrt_, wide)
FLOAT_FN(cos, cos_, wide_trig)
FLOAT_FN(tan, tan_, wide_trig)
FLOAT_FN(asin, asin_, wide)
FLOAT_FN(acos, acos_, wide)
FLOAT_FN(atan, atan_, wide)
FLOAT_FN(sigmoid, sigmoid_, wide)
FLOAT_FN(logsigmoid, logsigmoid_, wide)
FLOAT_FN(selu, selu_, wide)
FLOAT_FN(swish, swish_, wide)
FLOAT_FN(silu, swish_, wide)
FLOAT_FN(tanh, tanh_, wide)
FLOAT_FN(sinh, sinh_, wide)
FLOAT_FN(cosh, cosh_, wide)
FLOAT_FN(atanh, atanh_, wide)
FLOAT_FN(asinh, asinh_, wide)
FLOAT_FN(acosh, acosh_, wide)
FLOAT_FN(erf, erf_, wide)
FLOAT_FN(gelu, gelu_, wide)
FLOAT_FN(quick_gelu, quick_gelu_, wide)
FLOAT_FN(mish, mish_, wide)
FLOAT_FN(softsign, softsign_, wide)

tg_tensor tg_elu(tg_tensor x, double alpha) {
  BEGIN("tg_elu", x);
  tg_dtype o = float_of(tg_dtype_of(x));
  tg_tensor a = tg_cast(x, wide(o)), pos, xn = negpart(a, &pos);
  tg_tensor r = tg_where(pos, a, tg_mul_s(tg_sub_s(tg_exp(xn), 1), alpha));
  return done(tg_cast(r, o));
}

tg_tensor tg_celu(tg_tensor x, double alpha) {
  BEGIN("tg_celu", x);
  if (!(alpha != 0)) return fail_in_scope(TG_ERR_INVALID, "%s: %s must be non-zero", "tg_celu", "alpha");
  tg_dtype o = float_of(tg_dtype_of(x));
  tg_tensor a = tg_cast(x, wide(o)), pos, xn = negpart(a, &pos);
  tg_tensor r = tg_where(pos, a, tg_mul_s(tg_sub_s(tg_exp(tg_div_s(xn, alpha)), 1), alpha));
  return done(tg_cast(r, o));
}

tg_tensor tg_softplus(tg_tensor x, double beta) {
  BEGIN("tg_softplus", x);
  if (!(beta != 0)) return fail_in_scope(TG_ERR_INVALID, "%s: %s must be non-zero", "tg_softplus", "beta");
  tg_dtype o = float_of(tg_dtype_of(x));
  return done(tg_cast(softplus_(tg_cast(x, wide(o)), beta), o));
}

/* ---------------------------------------------------------------------------------------------- */
/* piecewise-linear activations (dtype of x, Python-scalar promotion for the parameters)           */

/* min(max(x, lo), hi) as two where()s: nan passes through, +-inf saturate, gradient 1 inside, and
 * tinygrad's relu(u - lo) - relu(u - hi) gradient at the kinks: 0 at u == lo (relu's gradient at 0
 * is 0), 1 at u == hi. Used where tinygrad composes from relu (relu6, hardsigmoid, hardswish); the
 * value is PyTorch's (6 at +inf where tinygrad's inf - inf gives nan). */
static tg_tensor relu_clamp_(tg_tensor x, double lo, double hi) {
  tg_tensor r = tg_where(tg_bitwise_or(tg_lt_s(x, lo), tg_eq_s(x, lo)), K(x, lo), x); /* nan passes */
  return tg_where(tg_gt_s(r, hi), K(r, hi), r);
}

/* tinygrad writes relu6 as relu(x) - relu(x - 6) and hardsigmoid likewise: nan at x = +inf (inf -
 * inf) and 0 for nan. The clamp form gives PyTorch's 6 / 1 and propagates nan; its gradient at the
 * kinks is tinygrad's (0 at 0, 1 at 6). */
tg_tensor tg_relu6(tg_tensor x) {
  BEGIN("tg_relu6", x);
  return done(relu_clamp_(x, 0, 6));
}

/* x * relu6(x + 3) / 6 (nan at -inf, as PyTorch) */
tg_tensor tg_hardswish(tg_tensor x) {
  BEGIN("tg_hardswish", x);
  /* integers as floats: x + 3 and x * relu6(..) would wrap in uint8/int8 */
  if (!tg_dtype_is_float(tg_dtype_of(x))) x = tg_cast(x, tg_default_float());
  return done(tg_mul_s(tg_mul(x, relu_clamp_(tg_add_s(x, 3), 0, 6)), 1.0 / 6));
}

tg_tensor tg_hardsigmoid(tg_tensor x) {
  BEGIN("tg_hardsigmoid", x);
  /* the kinks decided on x itself: x/6 + 1/2 does not round to 0 at x = -3 in float64 */
  tg_tensor lo = tg_bitwise_or(tg_lt_s(x, -3), tg_eq_s(x, -3)), hi = tg_gt_s(x, 3);
  return done(tg_where(lo, K(x, 0), tg_where(hi, K(x, 1), tg_add_s(tg_mul_s(x, 1.0 / 6), 0.5))));
}

tg_tensor tg_leaky_relu(tg_tensor x, double neg_slope) {
  BEGIN("tg_leaky_relu", x);
  return done(tg_where(tg_lt_s(x, 0), tg_mul_s(x, neg_slope), x));
}

tg_tensor tg_clamp_t(tg_tensor x, tg_tensor min, tg_tensor max) {
  if (!t_get(x, "tg_clamp_t") || (min.id && !t_get(min, "tg_clamp_t")) || (max.id && !t_get(max, "tg_clamp_t"))) return NONE;
  if (!min.id && !max.id)
    return tg_set_error(TG_ERR_INVALID, "tg_clamp_t: at least one of min and max must be given (tinygrad's rule)"), NONE;
  tg_scope_begin();
  tg_tensor r = same(x);
  if (min.id) r = tg_where(tg_lt(r, min), min, r);
  if (max.id) r = tg_where(tg_gt(r, max), max, r);
  return done(r);
}

tg_tensor tg_clamp(tg_tensor x, double min, double max) {
  BEGIN("tg_clamp", x);
  tg_tensor r = same(x);
  /* an integer tensor with a bound that is not a whole number is clamped as floats (tinygrad's
   * clamp(uint8, -1.0, 1.5) is [0, 1, 1.5, 1.5]); bounds its dtype cannot hold compare by value */
  bool frac = (isfinite(min) && min != trunc(min)) || (isfinite(max) && max != trunc(max));
  if (!tg_dtype_is_float(tg_dtype_of(r)) && tg_dtype_of(r) != TG_BOOL && frac) r = tg_cast(r, tg_default_float());
  if (!isnan(min) && min != -INFINITY) r = tg_where(tg_lt_s(r, min), K(r, min), r);
  if (!isnan(max) && max != INFINITY) r = tg_where(tg_gt_s(r, max), K(r, max), r);
  return done(r);
}
tg_tensor tg_clip(tg_tensor x, double min, double max) {
  if (!t_get(x, "tg_clip")) return NONE;
  return tg_clamp(x, min, max);
}
tg_tensor tg_hardtanh(tg_tensor x, double min_val, double max_val) {
  if (!t_get(x, "tg_hardtanh")) return NONE;
  return tg_clamp(x, min_val, max_val);
}

/* ---------------------------------------------------------------------------------------------- */
/* dtype-preserving unary ops                                                                      */

tg_tensor tg_square(tg_tensor x) {
  BEGIN("tg_square", x);
  return done(tg_mul(x, x));
}

tg_tensor tg_sign(tg_tensor x) {
  BEGIN("tg_sign", x);
  return done(sign_(x));
}

tg_tensor tg_abs(tg_tensor x) {
  BEGIN("tg_abs", x);
  return done(abs_(x));
}

/* rounding: integers (and bool) are returned unchanged */
#define ROUND_FN(name, core)                                                                                 \
  tg_tensor tg_##name(tg_tensor x) {                                                                         \
    BEGIN("tg_" #name, x);                                                                                   \
    return done(tg_dtype_is_float(tg_dtype_of(x)) ? core(x) : same(x));                                      \
  }
ROUND_FN(ceil, ceil_)
ROUND_FN(floor, floor_)

/* tinygrad: where((x > 0) == (trunc(x)/2 is whole), ceil(x - 0.5), floor(x + 0.5)) -- half to even.
 * x +- 0.5 is exact only below 2^mantissa; from there on every float is already whole (and odd
 * values would round wrongly), so those take trunc(x) (= x, with tinygrad's zero gradient). */
static tg_tensor round_(tg_tensor x) {
  tg_dtype dt = tg_dtype_of(x);
  double lim = dt == TG_FLOAT64 ? 0x1p52 : dt == TG_FLOAT32 ? 0x1p23 : dt == TG_FLOAT16 ? 0x1p10 : 0x1p7;
  tg_tensor b = tg_div_s(tg_trunc(x), 2);
  tg_tensor even = tg_eq(tg_trunc(b), b);
  tg_tensor r = tg_where(tg_eq(tg_gt_s(x, 0), even), ceil_(tg_sub_s(x, 0.5)), floor_(tg_add_s(x, 0.5)));
  return tg_where(tg_lt_s(wabs(x), lim), r, tg_trunc(x));
}
ROUND_FN(round, round_)

/* ---------------------------------------------------------------------------------------------- */
/* predicates (bool results)                                                                       */

static tg_tensor not_(tg_tensor x) { return tg_neg(tg_cast(x, TG_BOOL)); } /* NEG on bool is logical not */
static tg_tensor isinf_(tg_tensor x) { return tg_bitwise_or(tg_eq_s(x, INFINITY), tg_eq_s(x, -INFINITY)); }
static tg_tensor isnan_(tg_tensor x) { return tg_ne(x, x); }

tg_tensor tg_logical_not(tg_tensor x) {
  BEGIN("tg_logical_not", x);
  return done(not_(x));
}
tg_tensor tg_isinf(tg_tensor x) {
  BEGIN("tg_isinf", x);
  return done(isinf_(x));
}
tg_tensor tg_isnan(tg_tensor x) {
  BEGIN("tg_isnan", x);
  return done(isnan_(x));
}
tg_tensor tg_isfinite(tg_tensor x) {
  BEGIN("tg_isfinite", x);
  return done(not_(tg_bitwise_or(isinf_(x), isnan_(x))));
}

tg_tensor tg_bitwise_not(tg_tensor x) {
  BEGIN("tg_bitwise_not", x);
  tg_dtype dt = tg_dtype_of(x);
  if (dt == TG_BOOL) return done(not_(x));
  if (tg_dtype_is_float(dt))
    return fail_in_scope(TG_ERR_INVALID, "%s: needs an integer or bool tensor, got %s", "tg_bitwise_not",
                         tg_dtype_name(dt));
  /* unsigned: ~x = (0 - x) - 1 (uint64's max is not a double); signed: x ^ -1 as tinygrad */
  if (tg_dtype_is_unsigned(dt)) return done(tg_sub_s(tg_neg(x), 1));
  return done(tg_bitwise_xor(x, K(x, -1)));
}

/* ---------------------------------------------------------------------------------------------- */
/* binary                                                                                          */

tg_tensor tg_lerp(tg_tensor x, tg_tensor end, tg_tensor weight) {
  BEGIN("tg_lerp", x);
  if (!t_get(end, "tg_lerp") || !t_get(weight, "tg_lerp") || !bcast_ok("tg_lerp", x, end) ||
      !bcast_ok("tg_lerp", x, weight) || !bcast_ok("tg_lerp", end, weight)) {
    tg_scope_end();
    return NONE;
  }
  tg_dtype xd = tg_dtype_of(x);
  if (xd == TG_UINT8) {
    /* tinygrad's fixed-point uint8 lerp: the weight as a 7-bit fraction, the difference as a signed
     * byte (end - x wraps, the int8 view undoes it), rounded and shifted back; the result stays uint8 */
    tg_tensor wi = tg_cast(tg_add_s(tg_mul_s(weight, 128), 0.5), TG_INT16);
    tg_tensor d = tg_cast(tg_sub(end, x), TG_INT8);
    tg_tensor f = tg_rshift(tg_cast(tg_add_s(tg_mul(d, wi), 64), TG_UINT16), tg_const_like(tg_cast(d, TG_UINT16), 7));
    return done(tg_cast(tg_add(x, f), TG_UINT8));
  }
  /* a float result takes the difference in that float, so unsigned end - x cannot wrap */
  tg_dtype rd = tg_dtype_promote(tg_dtype_promote(xd, tg_dtype_of(end)), tg_dtype_of(weight));
  if (tg_dtype_is_float(rd)) x = tg_cast(x, rd), end = tg_cast(end, rd);
  return done(tg_add(x, tg_mul(tg_sub(end, x), weight)));
}

tg_tensor tg_lerp_s(tg_tensor x, tg_tensor end, double weight) {
  BEGIN("tg_lerp_s", x);
  if (!t_get(end, "tg_lerp_s") || !bcast_ok("tg_lerp_s", x, end)) {
    tg_scope_end();
    return NONE;
  }
  /* a fractional weight makes the result float: take the difference in it (no unsigned wrap) */
  tg_dtype rd = tg_dtype_promote(tg_dtype_of(x), tg_dtype_of(end));
  if (!tg_dtype_is_float(rd) && weight != trunc(weight)) x = tg_cast(x, tg_default_float()), end = tg_cast(end, tg_default_float());
  return done(tg_add(x, tg_mul_s(tg_sub(end, x), weight)));
}

/* Validates and promotes a pair: both cast to the promoted dtype (to DEFAULT_FLOAT if `flt` and not
 * float; then widened for 16-bit floats if `widen`). *o gets the result dtype. */
static bool pair(const char *fn, tg_tensor x, tg_tensor y, bool flt, bool widen, tg_tensor *a, tg_tensor *b,
                 tg_dtype *o) {
  if (!bcast_ok(fn, x, y)) return false;
  tg_dtype dt = tg_dtype_promote(tg_dtype_of(x), tg_dtype_of(y));
  if (flt) dt = float_of(dt);
  *o = dt;
  tg_dtype c = widen ? wide(dt) : dt;
  *a = tg_cast(x, c), *b = tg_cast(y, c);
  return true;
}

#define BEGIN2(fn, x, y)                                                                                     \
  do {                                                                                                       \
    if (!t_get((x), (fn)) || !t_get((y), (fn))) return NONE;                                                 \
    tg_scope_begin();                                                                                        \
  } while (0)

tg_tensor tg_logaddexp(tg_tensor x, tg_tensor y) {
  BEGIN2("tg_logaddexp", x, y);
  tg_tensor a, b;
  tg_dtype o;
  if (!pair("tg_logaddexp", x, y, true, true, &a, &b, &o)) return done(NONE);
  return done(tg_cast(logaddexp_(a, b), o));
}

/* tinygrad: where((y < 0) | (1/y < 0), -|x|, |x|) -- 1/y catches -0.0. Result dtype: the promoted
 * dtype of x and y (PyTorch always returns float). */
tg_tensor tg_copysign(tg_tensor x, tg_tensor y) {
  BEGIN2("tg_copysign", x, y);
  tg_tensor a, b;
  tg_dtype o;
  if (!pair("tg_copysign", x, y, false, false, &a, &b, &o)) return done(NONE);
  if (o == TG_BOOL)
    return fail_in_scope(TG_ERR_INVALID, "%s: needs numeric tensors, got %s", "tg_copysign", "bool");
  tg_tensor neg = tg_bitwise_or(tg_lt_s(b, 0), tg_lt_s(tg_reciprocal(b), 0));
  tg_tensor mag = abs_(a);
  return done(tg_where(neg, tg_neg(mag), mag));
}

/* C remainder (sign of x). Integers: derived from Python modulo, exact. Floats: tinygrad's
 * x - trunc(x/y)*y (gradient 1 for x and -trunc(x/y) for y, as PyTorch). */
tg_tensor tg_fmod(tg_tensor x, tg_tensor y) {
  BEGIN2("tg_fmod", x, y);
  tg_tensor a, b;
  tg_dtype o;
  if (!pair("tg_fmod", x, y, false, false, &a, &b, &o)) return done(NONE);
  if (o == TG_BOOL)
    return fail_in_scope(TG_ERR_INVALID, "%s: needs numeric tensors, got %s", "tg_fmod", "bool");
  if (tg_dtype_is_float(o)) return done(tg_sub(a, tg_mul(tg_trunc(tg_div(a, b)), b)));
  tg_tensor r = tg_mod(a, b);
  if (tg_dtype_is_unsigned(o)) return done(r);
  tg_tensor fix = tg_bitwise_and(tg_ne_s(r, 0), tg_ne(tg_lt_s(r, 0), tg_lt_s(a, 0)));
  return done(tg_where(fix, tg_sub(r, b), r));
}

/* The same with a Python-number y (typed against x as tg_const_like does). */
tg_tensor tg_logaddexp_s(tg_tensor x, double y) {
  BEGIN("tg_logaddexp_s", x);
  return done(tg_logaddexp(x, K(x, y)));
}

tg_tensor tg_copysign_s(tg_tensor x, double y) {
  BEGIN("tg_copysign_s", x);
  tg_tensor r = tg_copysign(x, K(x, y));
  if (!tg_valid(r) || tg_dtype_is_float(tg_dtype_of(r))) return done(r);
  /* an integer result takes its sign from the number itself (scalars compare by value): -1 typed as
   * uint8 is 255, yet tinygrad negates, wrapping ([1, 2] copysign -1 is [255, 254]) */
  tg_tensor mag = abs_(tg_cast(x, tg_dtype_of(r)));
  return done(signbit(y) ? tg_neg(mag) : mag);
}

tg_tensor tg_fmod_s(tg_tensor x, double y) {
  BEGIN("tg_fmod_s", x);
  return done(tg_fmod(x, K(x, y)));
}

tg_tensor tg_div_mode(tg_tensor x, tg_tensor y, tg_div_rounding mode) {
  BEGIN2("tg_div_mode", x, y);
  if (mode != TG_DIV_TRUE && mode != TG_DIV_TRUNC && mode != TG_DIV_FLOOR) {
    tg_set_error(TG_ERR_INVALID,
                 "tg_div_mode: invalid rounding mode %d (expected TG_DIV_TRUE, TG_DIV_TRUNC or TG_DIV_FLOOR)",
                 (int)mode);
    return done(NONE);
  }
  tg_tensor a, b;
  tg_dtype o;
  if (!pair("tg_div_mode", x, y, false, false, &a, &b, &o)) return done(NONE);
  if (mode == TG_DIV_TRUE) return done(tg_div(a, b));
  if (tg_dtype_is_int(o)) {
    tg_tensor q = tg_idiv(a, b);
    if (mode == TG_DIV_TRUNC || tg_dtype_is_unsigned(o)) return done(q);
    /* floor: one less where the division was inexact and the signs differ */
    tg_tensor fix = tg_bitwise_and(tg_ne_s(tg_mod(a, b), 0), tg_ne(tg_lt_s(a, 0), tg_lt_s(b, 0)));
    return done(tg_where(fix, tg_sub_s(q, 1), q));
  }
  tg_tensor d = tg_div(a, b);
  return done(mode == TG_DIV_TRUNC ? tg_trunc(d) : floor_(d));
}

tg_tensor tg_floordiv(tg_tensor x, tg_tensor y) {
  if (!t_get(x, "tg_floordiv") || !t_get(y, "tg_floordiv")) return NONE;
  return tg_div_mode(x, y, TG_DIV_FLOOR);
}

/* ---------------------------------------------------------------------------------------------- */
/* cast shorthands                                                                                 */

#define CAST_FN(name, dt)                                                                                    \
  tg_tensor tg_##name(tg_tensor x) {                                                                         \
    if (!t_get(x, "tg_" #name)) return NONE;                                                                 \
    return tg_cast(x, dt);                                                                                   \
  }
CAST_FN(float, TG_FLOAT32)
CAST_FN(half, TG_FLOAT16)
CAST_FN(bfloat16, TG_BFLOAT16)
CAST_FN(double, TG_FLOAT64)
CAST_FN(int, TG_INT32)
CAST_FN(long, TG_INT64)
CAST_FN(short, TG_INT16)
CAST_FN(bool, TG_BOOL)
