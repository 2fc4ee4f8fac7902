/*
 * ops.c -- the public lazy op surface: argument checking, broadcasting, tinygrad's type promotion,
 * and the decomposition of higher-level ops into primitive graph nodes (so they fuse).
 *
 * In: handles and arguments from the user. Out: new handles (or none + an error naming the function,
 * the shapes/values and a hint). Nothing here computes data; realize happens in the engine.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compose.h"
#include "tensor.h"

#define NONE ((tg_tensor){0})
#define GET(var, t, fn)                                                                            \
  UOp *var = t_get(t, fn);                                                                         \
  if (!var) return NONE

static const char *shp(char *buf, size_t n, UOp *u) { return fmt_shape(buf, n, u->shape, u->ndim); }

static tg_tensor fail(tg_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static tg_tensor fail(tg_status st, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  tg_set_error(st, "%s", msg);
  return NONE;
}

int norm_axis(const char *fn, int axis, int ndim, int *out);
int norm_axis(const char *fn, int axis, int ndim, int *out) {
  int lo = ndim ? -ndim : -1, hi = ndim ? ndim - 1 : 0;
  if (axis < lo || axis > hi) {
    tg_set_error(TG_ERR_INVALID, "%s: axis %d is out of range for a %d-d tensor (expected %d..%d)", fn, axis, ndim, lo, hi);
    return -1;
  }
  *out = axis < 0 ? axis + (ndim ? ndim : 1) : axis;
  return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* dtype helpers                                                                                   */

static tg_dtype float_of(tg_dtype dt) { return tg_dtype_is_float(dt) ? dt : tg_default_float(); }

/* Python-scalar semantics (tinygrad's _broadcasted): a float x keeps its dtype; an integer x keeps
 * its dtype for an integral scalar; otherwise the scalar is int32 / DEFAULT_FLOAT and promotes. */
static tg_dtype scalar_dtype(tg_dtype xdt, double v) {
  bool integral = isfinite(v) && v == trunc(v);
  if (tg_dtype_is_float(xdt) || (tg_dtype_is_int(xdt) && integral)) return xdt;
  return integral ? TG_INT32 : tg_default_float();
}

/* ---------------------------------------------------------------------------------------------- */
/* broadcasting                                                                                    */

/* Dim i of u as a reshape argument: its tg_sym code when it is symbolic. A reshape that adds size-1
 * dims must be given the codes: a symbolic dim bound to 1 is otherwise one of several size-1 dims,
 * and the code would go to the wrong one (x(4, v=1) reshaped to (4, 1, 1) for a matmul). */
static int64_t dim_arg(const UOp *u, int i) { return u->sym && sym_is_code(u->sym[i]) ? u->sym[i] : u->shape[i]; }

static UOp *bcast_to(UOp *u, const int64_t *shape, int ndim) {
  int64_t tmp[64] = {0};
  int64_t *s = ndim <= 64 ? tmp : tg_xmalloc(sizeof(int64_t) * (size_t)ndim);
  int off = ndim - u->ndim;
  for (int i = 0; i < ndim; i++) s[i] = i < off ? 1 : dim_arg(u, i - off);
  UOp *r = g_reshape(u, s, ndim);
  UOp *e = g_expand(r, shape);
  uop_unref(r);
  if (s != tmp) free(s);
  return e;
}

/* Broadcast n nodes to a common shape. Returns 0 or -1 with an error. out[i] are new refs. */
static int broadcast_n(const char *fn, UOp **in, int n, UOp **out) {
  int nd = 0;
  for (int i = 0; i < n; i++)
    if (in[i]->ndim > nd) nd = in[i]->ndim;
  int64_t shape[64] = {0};
  if (nd > 64) {
    tg_set_error(TG_ERR_INVALID, "%s: more than 64 dimensions are not supported", fn);
    return -1;
  }
  for (int d = 0; d < nd; d++) {
    int64_t s = 1;
    for (int i = 0; i < n; i++) {
      int k = d - (nd - in[i]->ndim);
      if (k < 0) continue;
      int64_t v = in[i]->shape[k];
      if (v == s || v == 1) continue;
      if (s == 1) {
        s = v;
        continue;
      }
      char a[256], b[256];
      tg_set_error(TG_ERR_INVALID, "%s: shapes %s and %s cannot broadcast (each dimension must match or be 1)", fn,
                   shp(a, sizeof a, in[0]), shp(b, sizeof b, in[i]));
      return -1;
    }
    shape[d] = s;
  }
  if (!shape_fits(shape, nd)) {
    char a[256], b[256];
    tg_set_error(TG_ERR_INVALID, "%s: broadcasting shapes %s and %s gives too many elements", fn,
                 shp(a, sizeof a, in[0]), shp(b, sizeof b, in[n - 1]));
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (in[i]->device != in[0]->device) {
      tg_set_error(TG_ERR_INVALID, "%s: tensors are on different devices (%s and %s); move one with tg_to", fn,
                   device_by_id(in[0]->device)->name, device_by_id(in[i]->device)->name);
      for (int j = 0; j < i; j++) uop_unref(out[j]);
      return -1;
    }
    out[i] = bcast_to(in[i], shape, nd);
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* generic elementwise builders on nodes (new refs)                                                */

static UOp *n_const_like(UOp *like, double v, tg_dtype dt) { return g_const_shaped(v, dt, like->device, like->shape, like->ndim); }

static UOp *n_binary(int op, tg_dtype dt, UOp *a, UOp *b) { return g_alu(op, dt, a, b, NULL); }

/* Applies op to x (and y) after promotion to a common dtype `dt` and broadcasting. */
static tg_tensor binary_nodes(const char *fn, int op, UOp *x, UOp *y, tg_dtype dt, tg_dtype out_dt) {
  UOp *in[2] = {x, y}, *b[2];
  if (broadcast_n(fn, in, 2, b) < 0) return NONE;
  UOp *cx = g_cast(b[0], dt), *cy = g_cast(b[1], dt);
  UOp *r = n_binary(op, out_dt, cx, cy);
  uop_unref(cx), uop_unref(cy), uop_unref(b[0]), uop_unref(b[1]);
  return t_wrap(r);
}

static UOp *scalar_node(UOp *x, double v) {
  tg_dtype dt = scalar_dtype((tg_dtype)x->dtype, v);
  return g_const(v, dt, x->device);
}

/* ---------------------------------------------------------------------------------------------- */
/* binary ops                                                                                      */

typedef enum { K_ARITH, K_TRUEDIV, K_INT, K_CMP, K_BITS, K_FLOATOK } Kind;


static tg_tensor binop_nodes(const char *fn, int op, UOp *x, UOp *y, Kind kind) {
  tg_dtype dt = tg_dtype_promote((tg_dtype)x->dtype, (tg_dtype)y->dtype);
  if (kind == K_TRUEDIV) dt = float_of(dt);
  if (kind == K_BITS && tg_dtype_is_float(dt))
    return fail(TG_ERR_INVALID, "%s: bitwise ops need integer or bool tensors, got %s", fn, tg_dtype_name(dt));
  if (kind == K_INT && (tg_dtype_is_float(dt) || dt == TG_BOOL))
    return fail(TG_ERR_INVALID, "%s: needs integer tensors, got %s (use tg_div for floats)", fn, tg_dtype_name(dt));
  tg_dtype out = kind == K_CMP ? TG_BOOL : dt;
  return binary_nodes(fn, op, x, y, dt, out);
}

#define BINOP(name, op, kind)                                                                      \
  tg_tensor tg_##name(tg_tensor x, tg_tensor y) {                                                  \
    GET(a, x, "tg_" #name);                                                                        \
    GET(b, y, "tg_" #name);                                                                        \
    return binop_nodes("tg_" #name, op, a, b, kind);                                               \
  }
BINOP(add, OP_ADD, K_ARITH)
BINOP(mul, OP_MUL, K_ARITH)
BINOP(div, OP_FDIV, K_TRUEDIV)
BINOP(idiv, OP_IDIV, K_INT)
BINOP(lt, OP_CMPLT, K_CMP)
BINOP(eq, OP_CMPEQ, K_CMP)
BINOP(ne, OP_CMPNE, K_CMP)
BINOP(bitwise_and, OP_AND, K_BITS)
BINOP(bitwise_or, OP_OR, K_BITS)
BINOP(bitwise_xor, OP_XOR, K_BITS)
BINOP(lshift, OP_SHL, K_BITS)
BINOP(rshift, OP_SHR, K_BITS)
BINOP(pow, OP_POW, K_ARITH)

tg_tensor tg_sub(tg_tensor x, tg_tensor y) {
  GET(a, x, "tg_sub");
  GET(b, y, "tg_sub");
  tg_dtype dt = tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)b->dtype);
  if (dt == TG_BOOL) return fail(TG_ERR_INVALID, "tg_sub: subtracting bool tensors is not supported (use tg_bitwise_xor)");
  return binop_nodes("tg_sub", OP_SUB, a, b, K_ARITH);
}

tg_tensor tg_gt(tg_tensor x, tg_tensor y) {
  GET(a, x, "tg_gt");
  GET(b, y, "tg_gt");
  return binop_nodes("tg_gt", OP_CMPLT, b, a, K_CMP);
}

static tg_tensor not_of(tg_tensor t) {
  UOp *u = t_get(t, "tg_not");
  if (!u) return NONE;
  UOp *r = g_alu(OP_NEG, TG_BOOL, u, NULL, NULL);
  tg_free(t);
  return t_wrap(r);
}
tg_tensor tg_le(tg_tensor x, tg_tensor y) { return not_of(tg_gt(x, y)); }
tg_tensor tg_ge(tg_tensor x, tg_tensor y) { return not_of(tg_lt(x, y)); }

tg_tensor tg_maximum(tg_tensor x, tg_tensor y) {
  GET(a, x, "tg_maximum");
  GET(b, y, "tg_maximum");
  return binop_nodes("tg_maximum", OP_MAX, a, b, K_ARITH);
}

static tg_tensor minimum_nodes(const char *fn, UOp *a, UOp *b) {
  tg_dtype dt = tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)b->dtype);
  UOp *in[2] = {a, b}, *bb[2];
  if (broadcast_n(fn, in, 2, bb) < 0) return NONE;
  UOp *x = g_cast(bb[0], dt), *y = g_cast(bb[1], dt);
  UOp *r;
  if (tg_dtype_is_float(dt)) {
    /* -max(-x, -y) keeps max's NaN propagation */
    UOp *nx = g_alu(OP_NEG, dt, x, NULL, NULL), *ny = g_alu(OP_NEG, dt, y, NULL, NULL);
    UOp *m = g_alu(OP_MAX, dt, nx, ny, NULL);
    r = g_alu(OP_NEG, dt, m, NULL, NULL);
    uop_unref(nx), uop_unref(ny), uop_unref(m);
  } else {
    UOp *lt = g_alu(OP_CMPLT, TG_BOOL, x, y, NULL);
    r = g_alu(OP_WHERE, dt, lt, x, y);
    uop_unref(lt);
  }
  uop_unref(x), uop_unref(y), uop_unref(bb[0]), uop_unref(bb[1]);
  return t_wrap(r);
}

tg_tensor tg_minimum(tg_tensor x, tg_tensor y) {
  GET(a, x, "tg_minimum");
  GET(b, y, "tg_minimum");
  return minimum_nodes("tg_minimum", a, b);
}

/* d(x mod y) for floats, as tinygrad's x - floor(x / y) * y: dx = g, dy = -g * floor(x / y) (the
 * modulo primitive and the sign fix have no gradient of their own: x got none, y the fix's 1) */
static void fmod_grad(UOp *out, UOp *g, UOp *const *inputs, int n, UOp **grads) {
  (void)out, (void)n;
  tg_scope_begin();
  tg_tensor x = t_wrap(uop_ref(inputs[0])), y = t_wrap(uop_ref(inputs[1])), gt = t_wrap(uop_ref(g));
  tg_tensor dy = tg_neg(tg_mul(gt, tg_floor(tg_div(x, y))));
  UOp *du = tg_valid(dy) ? t_get(dy, "tg_backward") : NULL;
  grads[0] = uop_ref(g);
  grads[1] = du ? uop_ref(du) : NULL;
  tg_scope_end();
}

/* Python modulo: the result takes the sign of the divisor. */
static tg_tensor mod_nodes(const char *fn, UOp *a, UOp *b) {
  tg_dtype dt = tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)b->dtype);
  if (dt == TG_BOOL) return fail(TG_ERR_INVALID, "%s: modulo of bool tensors is not supported", fn);
  UOp *in[2] = {a, b}, *bb[2];
  if (broadcast_n(fn, in, 2, bb) < 0) return NONE;
  UOp *x = g_cast(bb[0], dt), *y = g_cast(bb[1], dt);
  UOp *r = g_alu(OP_MOD, dt, x, y, NULL);
  if (!tg_dtype_is_unsigned(dt)) {
    UOp *z = n_const_like(r, 0, dt);
    UOp *rnz = g_alu(OP_CMPNE, TG_BOOL, r, z, NULL);
    UOp *rneg = g_alu(OP_CMPLT, TG_BOOL, r, z, NULL), *yneg = g_alu(OP_CMPLT, TG_BOOL, y, z, NULL);
    UOp *diff = g_alu(OP_CMPNE, TG_BOOL, rneg, yneg, NULL);
    UOp *fix = g_alu(OP_AND, TG_BOOL, rnz, diff, NULL);
    UOp *ry = g_alu(OP_ADD, dt, r, y, NULL);
    UOp *w = g_alu(OP_WHERE, dt, fix, ry, r);
    uop_unref(z), uop_unref(rnz), uop_unref(rneg), uop_unref(yneg), uop_unref(diff), uop_unref(fix), uop_unref(ry);
    uop_unref(r);
    r = w;
  }
  if (tg_dtype_is_float(dt)) {
    UOp *ins[2] = {x, y};
    ag_set_custom_grad_mode(r, ins, 2, fmod_grad, AG_SHARD_ELEMENTWISE);
  }
  uop_unref(x), uop_unref(y), uop_unref(bb[0]), uop_unref(bb[1]);
  return t_wrap(r);
}

tg_tensor tg_mod(tg_tensor x, tg_tensor y) {
  GET(a, x, "tg_mod");
  GET(b, y, "tg_mod");
  return mod_nodes("tg_mod", a, b);
}

static tg_tensor where_nodes(const char *fn, UOp *c, UOp *a, UOp *b) {
  UOp *in[3] = {c, a, b}, *bb[3];
  if (broadcast_n(fn, in, 3, bb) < 0) return NONE;
  tg_dtype dt = tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)b->dtype);
  UOp *cc = g_cast(bb[0], TG_BOOL), *xa = g_cast(bb[1], dt), *yb = g_cast(bb[2], dt);
  UOp *r = g_alu(OP_WHERE, dt, cc, xa, yb);
  uop_unref(cc), uop_unref(xa), uop_unref(yb);
  for (int i = 0; i < 3; i++) uop_unref(bb[i]);
  return t_wrap(r);
}

tg_tensor tg_where(tg_tensor cond, tg_tensor x, tg_tensor y) {
  GET(c, cond, "tg_where");
  GET(a, x, "tg_where");
  GET(b, y, "tg_where");
  return where_nodes("tg_where", c, a, b);
}

/* ---- scalar right operands ---- */
/* A true division's scalar is made in the float dtype the division computes in: an integer tensor
 * divided by 256 or by -1 divides by that value (as tinygrad and PyTorch), not by the scalar wrapped
 * into the tensor's dtype (uint8: 0 and 255) */
static UOp *scalar_node_for(UOp *x, double v, Kind kind) {
  if (kind != K_TRUEDIV) return scalar_node(x, v);
  tg_dtype dt = float_of(tg_dtype_promote((tg_dtype)x->dtype, scalar_dtype((tg_dtype)x->dtype, v)));
  return g_const(v, dt, x->device);
}

/* Where a whole number lies against what x's integer dtype holds: -1 below its minimum, 1 above its
 * maximum, 0 inside it (or x is not an integer tensor, or v not a whole number). */
static int int_range_side(const UOp *x, double v) {
  tg_dtype dt = (tg_dtype)x->dtype;
  if (!tg_dtype_is_int(dt) || !isfinite(v) || v != trunc(v)) return 0;
  /* (the 64-bit maxima round up to 2^63 and 2^64 as doubles: those values are above already) */
  double hi = dtype_max(dt);
  return v < dtype_min(dt) ? -1 : v > hi || (tg_dtype_itemsize(dt) == 8 && v >= hi) ? 1 : 0;
}

/* A comparison of an integer tensor with a whole number its dtype cannot hold has one answer for
 * every element, as in tinygrad (which compares with the number, not with it wrapped into the
 * dtype: uint8 x < 300 is all true, x > -1 too). Returns 0 or 1, or -1 when the scalar is in range
 * (or not a whole number: it then promotes the comparison to a float one). */
static int cmp_known(const UOp *x, double v, int op, bool swap) {
  int side = x->sym ? 0 : int_range_side(x, v);
  if (!side) return -1;
  if (op == OP_CMPEQ) return 0;
  if (op == OP_CMPNE) return 1;
  return swap ? side < 0 : side > 0; /* x < v, or (swapped) v < x */
}

/* The maximum (or minimum) of an integer tensor and a whole number below (above) everything its
 * dtype holds is the tensor (tinygrad: uint8 x.maximum(-1) is x; the number wrapped into the dtype
 * gave 255 everywhere). A bound on the other side has no value in the dtype and wraps, as in tinygrad. */
static bool extreme_is_x(const UOp *x, double v, bool max) { return int_range_side(x, v) == (max ? -1 : 1); }

#define SCALAR_OP(name, fnname, kind, op, swap)                                                    \
  tg_tensor name {                                                                                 \
    GET(a, T, fnname);                                                                             \
    int known = kind == K_CMP ? cmp_known(a, V, op, swap) : -1;                                    \
    if (known >= 0) return t_wrap(n_const_like(a, known, TG_BOOL));                                \
    if (op == OP_MAX && extreme_is_x(a, V, true)) return t_wrap(uop_ref(a));                        \
    UOp *s = scalar_node_for(a, V, kind);                                                          \
    tg_tensor r = swap ? binop_nodes(fnname, op, s, a, kind) : binop_nodes(fnname, op, a, s, kind); \
    uop_unref(s);                                                                                  \
    return r;                                                                                      \
  }
#define T x
#define V y
SCALAR_OP(tg_add_s(tg_tensor x, double y), "tg_add_s", K_ARITH, OP_ADD, 0)
SCALAR_OP(tg_sub_s(tg_tensor x, double y), "tg_sub_s", K_ARITH, OP_SUB, 0)
SCALAR_OP(tg_mul_s(tg_tensor x, double y), "tg_mul_s", K_ARITH, OP_MUL, 0)
SCALAR_OP(tg_div_s(tg_tensor x, double y), "tg_div_s", K_TRUEDIV, OP_FDIV, 0)
SCALAR_OP(tg_maximum_s(tg_tensor x, double y), "tg_maximum_s", K_ARITH, OP_MAX, 0)
SCALAR_OP(tg_lt_s(tg_tensor x, double y), "tg_lt_s", K_CMP, OP_CMPLT, 0)
SCALAR_OP(tg_gt_s(tg_tensor x, double y), "tg_gt_s", K_CMP, OP_CMPLT, 1)
SCALAR_OP(tg_eq_s(tg_tensor x, double y), "tg_eq_s", K_CMP, OP_CMPEQ, 0)
SCALAR_OP(tg_ne_s(tg_tensor x, double y), "tg_ne_s", K_CMP, OP_CMPNE, 0)
#undef T
#undef V
#define T y
#define V x
SCALAR_OP(tg_rsub_s(double x, tg_tensor y), "tg_rsub_s", K_ARITH, OP_SUB, 1)
SCALAR_OP(tg_rdiv_s(double x, tg_tensor y), "tg_rdiv_s", K_TRUEDIV, OP_FDIV, 1)
#undef T
#undef V

tg_tensor tg_pow_s(tg_tensor x, double y) {
  GET(a, x, "tg_pow_s");
  /* tinygrad: a negative integer power of an integer tensor has no integer result */
  if (!tg_dtype_is_float((tg_dtype)a->dtype) && y == trunc(y) && y < 0)
    return fail(TG_ERR_INVALID, "tg_pow_s: %s tensor ** %g: the base needs to be float for a negative integer exponent (cast it first)",
                tg_dtype_name((tg_dtype)a->dtype), y);
  UOp *s = scalar_node(a, y);
  tg_tensor r = binop_nodes("tg_pow_s", OP_POW, a, s, K_ARITH);
  uop_unref(s);
  return r;
}

tg_tensor tg_minimum_s(tg_tensor x, double y) {
  GET(a, x, "tg_minimum_s");
  if (extreme_is_x(a, y, false)) return t_wrap(uop_ref(a));
  UOp *s = scalar_node(a, y);
  tg_tensor r = minimum_nodes("tg_minimum_s", a, s);
  uop_unref(s);
  return r;
}

/* tinygrad's where with Python numbers for x and/or y: each number is typed against the tensor
 * branch (tg_const_like's rule), or, when both are numbers, as a Python number on its own: int32
 * for a whole one, DEFAULT_FLOAT otherwise (tinygrad's weak int and float). */
tg_tensor tg_where_s(tg_tensor cond, tg_tensor x, double y) {
  GET(c, cond, "tg_where_s");
  GET(a, x, "tg_where_s");
  UOp *s = scalar_node(a, y);
  tg_tensor r = where_nodes("tg_where_s", c, a, s);
  uop_unref(s);
  return r;
}

tg_tensor tg_rwhere_s(tg_tensor cond, double x, tg_tensor y) {
  GET(c, cond, "tg_rwhere_s");
  GET(b, y, "tg_rwhere_s");
  UOp *s = scalar_node(b, x);
  tg_tensor r = where_nodes("tg_rwhere_s", c, s, b);
  uop_unref(s);
  return r;
}

tg_tensor tg_where_ss(tg_tensor cond, double x, double y) {
  GET(c, cond, "tg_where_ss");
  UOp *sx = g_const(x, scalar_dtype(TG_BOOL, x), c->device), *sy = g_const(y, scalar_dtype(TG_BOOL, y), c->device);
  tg_tensor r = where_nodes("tg_where_ss", c, sx, sy);
  uop_unref(sx), uop_unref(sy);
  return r;
}

tg_tensor tg_const_like(tg_tensor like, double value) {
  GET(a, like, "tg_const_like");
  return t_wrap(scalar_node(a, value));
}

/* ---------------------------------------------------------------------------------------------- */
/* unary ops                                                                                       */

static tg_tensor unary_float(const char *fn, tg_tensor x, int op) {
  GET(a, x, fn);
  tg_dtype dt = float_of((tg_dtype)a->dtype);
  UOp *c = g_cast(a, dt);
  UOp *r = g_alu(op, dt, c, NULL, NULL);
  uop_unref(c);
  return t_wrap(r);
}
tg_tensor tg_exp2(tg_tensor x) { return unary_float("tg_exp2", x, OP_EXP2); }
tg_tensor tg_log2(tg_tensor x) { return unary_float("tg_log2", x, OP_LOG2); }
tg_tensor tg_sin(tg_tensor x) { return unary_float("tg_sin", x, OP_SIN); }
tg_tensor tg_sqrt(tg_tensor x) { return unary_float("tg_sqrt", x, OP_SQRT); }
tg_tensor tg_reciprocal(tg_tensor x) { return unary_float("tg_reciprocal", x, OP_RECIP); }

tg_tensor tg_neg(tg_tensor x) {
  GET(a, x, "tg_neg");
  return t_wrap(g_alu(OP_NEG, (tg_dtype)a->dtype, a, NULL, NULL));
}
tg_tensor tg_trunc(tg_tensor x) {
  GET(a, x, "tg_trunc");
  if (!tg_dtype_is_float((tg_dtype)a->dtype)) return t_wrap(uop_ref(a));
  return t_wrap(g_alu(OP_TRUNC, (tg_dtype)a->dtype, a, NULL, NULL));
}

static UOp *mul_const(UOp *a, double c) {
  UOp *k = n_const_like(a, c, (tg_dtype)a->dtype);
  UOp *r = g_alu(OP_MUL, (tg_dtype)a->dtype, a, k, NULL);
  uop_unref(k);
  return r;
}

UOp *n_exp(UOp *a);
UOp *n_exp(UOp *a) {
  /* 16-bit floats compute in float32, as tinygrad's exp does: 1/ln2 rounded to half costs |x| * 2e-4 */
  if (a->dtype == TG_FLOAT16 || a->dtype == TG_BFLOAT16 || dtype_is_fp8((tg_dtype)a->dtype)) {
    UOp *c = g_cast(a, TG_FLOAT32), *e = n_exp(c), *r = g_cast(e, (tg_dtype)a->dtype);
    uop_unref(c), uop_unref(e);
    return r;
  }
  UOp *m = mul_const(a, 1.0 / M_LN2);
  UOp *r = g_alu(OP_EXP2, (tg_dtype)a->dtype, m, NULL, NULL);
  uop_unref(m);
  return r;
}
UOp *n_log(UOp *a);
UOp *n_log(UOp *a) {
  UOp *l = g_alu(OP_LOG2, (tg_dtype)a->dtype, a, NULL, NULL);
  UOp *r = mul_const(l, M_LN2);
  uop_unref(l);
  return r;
}

tg_tensor tg_exp(tg_tensor x) {
  GET(a, x, "tg_exp");
  UOp *c = g_cast(a, float_of((tg_dtype)a->dtype));
  UOp *r = n_exp(c);
  uop_unref(c);
  return t_wrap(r);
}
tg_tensor tg_log(tg_tensor x) {
  GET(a, x, "tg_log");
  UOp *c = g_cast(a, float_of((tg_dtype)a->dtype));
  UOp *r = n_log(c);
  uop_unref(c);
  return t_wrap(r);
}

tg_tensor tg_relu(tg_tensor x) {
  GET(a, x, "tg_relu");
  tg_dtype dt = (tg_dtype)a->dtype;
  UOp *z = n_const_like(a, 0, dt);
  UOp *gt = g_alu(OP_CMPLT, TG_BOOL, z, a, NULL);
  UOp *r = g_alu(OP_WHERE, dt, gt, a, z);
  uop_unref(z), uop_unref(gt);
  return t_wrap(r);
}

tg_tensor tg_cast(tg_tensor x, tg_dtype dtype) {
  GET(a, x, "tg_cast");
  if (!dtype_valid(dtype)) return fail(TG_ERR_INVALID, "tg_cast: invalid dtype %d", (int)dtype);
  return t_wrap(g_cast(a, dtype));
}

/* A realized node's buffer read as dtype, the last dim rescaled from si- to di-byte elements; NULL
 * where bn is not a buffer. */
static UOp *rebuffer(UOp *bn, tg_dtype dtype, size_t si, size_t di) {
  Buffer *b = g_buffer_of(bn);
  if (!b || bn->ndim < 1) return NULL;
  int64_t *sh = tg_xmalloc(sizeof(int64_t) * (size_t)bn->ndim);
  memcpy(sh, bn->shape, sizeof(int64_t) * (size_t)bn->ndim);
  sh[bn->ndim - 1] = sh[bn->ndim - 1] * (int64_t)si / (int64_t)di;
  UOp *r = g_buffer(buffer_ref(b), dtype, sh, bn->ndim);
  free(sh);
  return r;
}

tg_tensor tg_bitcast(tg_tensor x, tg_dtype dtype) {
  GET(a, x, "tg_bitcast");
  if (!dtype_valid(dtype)) return fail(TG_ERR_INVALID, "tg_bitcast: invalid dtype %d", (int)dtype);
  size_t si = tg_dtype_itemsize((tg_dtype)a->dtype), di = tg_dtype_itemsize(dtype);
  if (si == di) return t_wrap(g_bitcast(a, dtype));
  if (a->dtype == TG_BOOL || dtype == TG_BOOL) return fail(TG_ERR_INVALID, "tg_bitcast: cannot bitcast to or from bool with a different size");
  int64_t last = a->ndim ? a->shape[a->ndim - 1] : 1;
  if (a->ndim == 0 || (int64_t)(last * (int64_t)si) % (int64_t)di != 0) {
    char b[256];
    return fail(TG_ERR_INVALID, "tg_bitcast: last dimension of shape %s (%s, %zu bytes) is not a whole number of %s (%zu bytes)",
                shp(b, sizeof b, a), tg_dtype_name((tg_dtype)a->dtype), si, tg_dtype_name(dtype), di);
  }
  /* a multi-device tensor is bitcast shard by shard (tinygrad's rule): sharded on the last dim,
   * every shard's part of it must be whole elements of the new dtype */
  bool multi = m_is(a);
  if (multi && m_axis(a) == a->ndim - 1) {
    UOp *ra = g_resolve(a);
    for (uint32_t j = 0; j < ra->nsrc; j++) {
      int64_t sl = ra->src[j]->shape[a->ndim - 1];
      if ((sl * (int64_t)si) % (int64_t)di != 0) {
        char b[256];
        return fail(TG_ERR_INVALID,
                    "tg_bitcast: shape %s is sharded on its last dim and shard %u holds %lld %s (%zu bytes each) of "
                    "it, not a whole number of %s (%zu bytes); bitcast before sharding, or shard on another axis",
                    shp(b, sizeof b, a), j, (long long)sl, tg_dtype_name((tg_dtype)a->dtype), si, tg_dtype_name(dtype), di);
      }
    }
  }
  /* different sizes reinterpret the realized contiguous bytes */
  UOp *c = g_contiguous(a);
  tg_status st = realize_uops(&c, 1);
  if (st != TG_OK) {
    uop_unref(c);
    return NONE;
  }
  UOp *bn = uop_realized(c), *r = NULL;
  if (!multi) {
    r = rebuffer(bn, dtype, si, di);
  } else if (bn && m_is(bn)) {
    int n = (int)bn->nsrc;
    UOp **sh = tg_xcalloc((size_t)n, sizeof(UOp *));
    bool ok = true;
    for (int j = 0; j < n && ok; j++) ok = (sh[j] = rebuffer(bn->src[j], dtype, si, di)) != NULL;
    if (ok) r = m_from_shards(sh, n, m_axis(bn), bn->device);
    for (int j = 0; j < n; j++)
      if (sh[j]) uop_unref(sh[j]);
    free(sh);
  }
  uop_unref(c);
  if (!r) {
    char b[256];
    return fail(TG_ERR_INVALID, "tg_bitcast: the contiguous copy of shape %s on %s did not realize into buffers", shp(b, sizeof b, a),
                tg_device_of(x));
  }
  return t_wrap(r);
}

/* ---------------------------------------------------------------------------------------------- */
/* reductions                                                                                      */

/* Normalizes axes (naxes == 0: all). Returns count or -1. */
bool t_axes_count_ok(const char *fn, const int *axes, int naxes, int ndim) {
  if (naxes < 0 || (naxes > 0 && !axes)) {
    tg_set_error(TG_ERR_INVALID, naxes < 0 ? "%s: naxes=%d is negative" : "%s: axes is NULL with naxes=%d", fn, naxes);
    return false;
  }
  /* checked before any entry is read: each axis may appear once (a 0-d tensor takes axis 0 or -1) */
  if (naxes > (ndim > 0 ? ndim : 1)) {
    tg_set_error(TG_ERR_INVALID, "%s: %d axes for a tensor of %d dims (each axis at most once)", fn, naxes, ndim);
    return false;
  }
  return true;
}

static int norm_axes(const char *fn, UOp *a, const int *axes, int naxes, int64_t *out) {
  if (!t_axes_count_ok(fn, axes, naxes, a->ndim)) return -1;
  if (naxes == 0) {
    for (int i = 0; i < a->ndim; i++) out[i] = i;
    return a->ndim;
  }
  for (int i = 0; i < naxes; i++) {
    int ax;
    if (norm_axis(fn, axes[i], a->ndim, &ax) < 0) return -1;
    if (a->ndim == 0) return 0;
    for (int j = 0; j < i; j++)
      if (out[j] == ax) {
        tg_set_error(TG_ERR_INVALID, "%s: axis %d appears twice in axes", fn, axes[i]);
        return -1;
      }
    out[i] = ax;
  }
  return naxes;
}

static UOp *squeeze_axes(UOp *r, const int64_t *ax, int nax) {
  int64_t sh[64];
  int k = 0;
  for (int i = 0; i < r->ndim; i++) {
    bool red = false;
    for (int j = 0; j < nax; j++) red = red || ax[j] == i;
    if (!red) sh[k++] = r->shape[i];
  }
  return g_reshape(r, sh, k);
}

static tg_tensor reduce_nodes(const char *fn, UOp *a, int op, const int *axes, int naxes, bool keepdim, tg_dtype acc,
                              tg_dtype out) {
  int64_t ax[64];
  if (a->ndim > 64) return fail(TG_ERR_INVALID, "%s: more than 64 dimensions are not supported", fn);
  int nax = norm_axes(fn, a, axes, naxes, ax);
  if (nax < 0) return NONE;
  UOp *c = g_cast(a, acc);
  UOp *r = g_reduce(c, op, ax, nax);
  uop_unref(c);
  if (!keepdim) {
    UOp *s = squeeze_axes(r, ax, nax);
    uop_unref(r);
    r = s;
  }
  UOp *o = g_cast(r, out);
  uop_unref(r);
  return t_wrap(o);
}

tg_tensor tg_sum(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  GET(a, x, "tg_sum");
  tg_dtype dt = (tg_dtype)a->dtype, acc = dtype_sum_acc(dt);
  tg_dtype out = (dt == TG_FLOAT16 || dt == TG_BFLOAT16 || dtype_is_fp8(dt)) ? dt : acc;
  return reduce_nodes("tg_sum", a, OP_ADD, axes, naxes, keepdim, acc, out);
}
tg_tensor tg_prod(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  GET(a, x, "tg_prod");
  /* tinygrad's prod multiplies in the input dtype (no sum_acc_dtype widening) */
  tg_dtype dt = (tg_dtype)a->dtype;
  return reduce_nodes("tg_prod", a, OP_MUL, axes, naxes, keepdim, dt, dt);
}
/* tinygrad's sum(dtype=) / prod(dtype=): cast to dtype, reduce in it, result in it */
static tg_tensor reduce_in(const char *fn, tg_tensor x, int op, const int *axes, int naxes, bool keepdim, tg_dtype dtype) {
  GET(a, x, fn);
  if ((int)dtype <= 0 || dtype >= TG_DTYPE_COUNT)
    return fail(TG_ERR_INVALID, "%s: invalid dtype %d (use a TG_* dtype)", fn, (int)dtype);
  return reduce_nodes(fn, a, op, axes, naxes, keepdim, dtype, dtype);
}
tg_tensor tg_sum_dtype(tg_tensor x, const int *axes, int naxes, bool keepdim, tg_dtype dtype) {
  return reduce_in("tg_sum_dtype", x, OP_ADD, axes, naxes, keepdim, dtype);
}
tg_tensor tg_prod_dtype(tg_tensor x, const int *axes, int naxes, bool keepdim, tg_dtype dtype) {
  return reduce_in("tg_prod_dtype", x, OP_MUL, axes, naxes, keepdim, dtype);
}
tg_tensor tg_max(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  GET(a, x, "tg_max");
  UOp *sa = g_stable(a); /* the gradient compares each input with the maximum */
  tg_tensor r = reduce_nodes("tg_max", sa, OP_MAX, axes, naxes, keepdim, (tg_dtype)a->dtype, (tg_dtype)a->dtype);
  uop_unref(sa);
  return r;
}
tg_tensor tg_min(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  GET(a, x, "tg_min");
  tg_dtype dt = (tg_dtype)a->dtype;
  /* min(x) = inv(max(inv(x))) where inv is an order-reversing bijection of the dtype: -x for floats,
   * ~x for integers (as tinygrad's _inverse; -x would wrap the dtype's minimum onto itself) */
  UOp *inv;
  if (!tg_dtype_is_float(dt)) {
    UOp *m = n_const_like(a, dt == TG_BOOL ? 1 : -1, dt);
    inv = g_alu(OP_XOR, dt, a, m, NULL);
    uop_unref(m);
  } else {
    UOp *sa = g_stable(a); /* as in tg_max */
    inv = g_alu(OP_NEG, dt, sa, NULL, NULL);
    uop_unref(sa);
  }
  tg_tensor r = reduce_nodes("tg_min", inv, OP_MAX, axes, naxes, keepdim, dt, dt);
  uop_unref(inv);
  UOp *ru = t_get(r, "tg_min");
  if (!ru) return NONE;
  UOp *o;
  if (!tg_dtype_is_float(dt)) {
    UOp *m = n_const_like(ru, dt == TG_BOOL ? 1 : -1, dt);
    o = g_alu(OP_XOR, dt, ru, m, NULL);
    uop_unref(m);
  } else {
    o = g_alu(OP_NEG, dt, ru, NULL, NULL);
  }
  tg_free(r);
  return t_wrap(o);
}

tg_tensor tg_mean(tg_tensor x, const int *axes, int naxes, bool keepdim) {
  GET(a, x, "tg_mean");
  tg_dtype dt = (tg_dtype)a->dtype;
  tg_dtype out = tg_dtype_is_float(dt) ? dt : TG_FLOAT32; /* tinygrad: float32 for integers, whatever DEFAULT_FLOAT says */
  int64_t ax[64];
  if (a->ndim > 64) return fail(TG_ERR_INVALID, "tg_mean: more than 64 dimensions are not supported");
  int nax = norm_axes("tg_mean", a, axes, naxes, ax);
  if (nax < 0) return NONE;
  int64_t cnt = 1;
  for (int i = 0; i < nax; i++) cnt *= a->shape[ax[i]];
  /* as tinygrad: the sum and its scaling stay in the accumulation dtype, one rounding to a narrow
   * float at the end; integers are summed exactly in theirs (wrapping as tinygrad's sum does) and
   * only the sum is converted: mean([16777217, -16777216]) is 0.5 */
  bool fl = tg_dtype_is_float(dt);
  tg_dtype acc = fl ? dtype_sum_acc(dt) : out, sacc = fl ? acc : dtype_sum_acc(dt);
  tg_tensor s = reduce_nodes("tg_mean", a, OP_ADD, axes, naxes, keepdim, sacc, sacc);
  UOp *s0 = t_get(s, "tg_mean");
  if (!s0) return NONE;
  UOp *su = fl ? uop_ref(s0) : g_cast(s0, acc);
  bool red[64] = {false};
  for (int i = 0; i < nax; i++) red[ax[i]] = true;
  UOp *sc = g_sym_count(a, red, keepdim, acc); /* a symbolic count: divided at run time */
  UOp *d = sc ? sc : n_const_like(su, cnt ? 1.0 / (double)cnt : NAN, acc);
  UOp *r = g_alu(sc ? OP_FDIV : OP_MUL, acc, su, d, NULL);
  uop_unref(d), uop_unref(su);
  tg_free(s);
  if (acc != out) {
    UOp *c = g_cast(r, out);
    uop_unref(r);
    r = c;
  }
  return t_wrap(r);
}

/* softmax pieces along one axis: m = x - max(x), e = exp(m), s = sum(e) (keepdim). As in tinygrad
 * the max is detached: the result does not depend on it, and its gradient (zero, but only up to
 * rounding) would add noise and a kernel. */
static int softmax_parts(const char *fn, UOp *a, int axis, UOp **m, UOp **e, UOp **s, UOp **sred) {
  int ax;
  if (norm_axis(fn, axis, a->ndim, &ax) < 0) return -1;
  tg_dtype dt = float_of((tg_dtype)a->dtype);
  UOp *x = g_cast(a, dt);
  int64_t axx = ax;
  int nax = a->ndim ? 1 : 0;
  UOp *mx0 = g_reduce(x, OP_MAX, &axx, nax), *mx = g_detach(mx0);
  UOp *mxe = g_expand(mx, x->shape);
  uop_unref(mx0);
  *m = g_alu(OP_SUB, dt, x, mxe, NULL);
  *e = n_exp(*m);
  /* the sum accumulates as tg_sum's does (tinygrad's e.sum()): float16/bfloat16 in float32, cast
   * back once */
  tg_dtype acc = dtype_sum_acc(dt);
  UOp *ec = acc != dt ? g_cast(*e, acc) : uop_ref(*e);
  UOp *sm = g_reduce(ec, OP_ADD, &axx, nax);
  uop_unref(ec);
  if (acc != dt) {
    UOp *c = g_cast(sm, dt);
    uop_unref(sm);
    sm = c;
  }
  *s = g_expand(sm, x->shape);
  *sred = sm; /* the sum before the expand (kept dims) */
  uop_unref(x), uop_unref(mx), uop_unref(mxe);
  return 0;
}

tg_tensor tg_softmax(tg_tensor x, int axis) {
  GET(a, x, "tg_softmax");
  UOp *m, *e, *s, *sr;
  if (softmax_parts("tg_softmax", a, axis, &m, &e, &s, &sr) < 0) return NONE;
  /* e * (1/s) with the reciprocal taken before the broadcast, tinygrad's form: the backward then
   * sums g*e (the same sum as s when g is 1) before scaling by 1/s^2, and r - (s*r)*r cancels to 0
   * where e/s would leave rounding noise from summing e_i/s^2 */
  UOp *rs = g_alu(OP_RECIP, (tg_dtype)sr->dtype, sr, NULL, NULL), *rse = g_expand(rs, e->shape);
  UOp *r = g_alu(OP_MUL, (tg_dtype)e->dtype, e, rse, NULL);
  uop_unref(m), uop_unref(e), uop_unref(s), uop_unref(sr), uop_unref(rs), uop_unref(rse);
  return t_wrap(r);
}

tg_tensor tg_log_softmax(tg_tensor x, int axis) {
  GET(a, x, "tg_log_softmax");
  UOp *m, *e, *s, *sr;
  if (softmax_parts("tg_log_softmax", a, axis, &m, &e, &s, &sr) < 0) return NONE;
  UOp *ls = n_log(s);
  UOp *r = g_alu(OP_SUB, (tg_dtype)m->dtype, m, ls, NULL);
  uop_unref(m), uop_unref(e), uop_unref(s), uop_unref(sr), uop_unref(ls);
  return t_wrap(r);
}

/* ---------------------------------------------------------------------------------------------- */
/* movement                                                                                        */

static bool check_ndim(const char *fn, int ndim, const void *p) {
  if (ndim < 0 || ndim > 64) {
    tg_set_error(TG_ERR_INVALID, "%s: ndim %d is out of range (0..64)", fn, ndim);
    return false;
  }
  if (ndim > 0 && !p) {
    tg_set_error(TG_ERR_INVALID, "%s: NULL array with ndim=%d", fn, ndim);
    return false;
  }
  return true;
}

/* Symbolic sizes (tg_sym codes) in a size argument: conc gets the concrete values (the bound value
 * + offset). Returns 1 when any entry is a code, 0 when none, -1 + error for a code whose variable
 * does not exist (a corrupted value). */
static int sym_args(const char *fn, const int64_t *args, int n, int64_t *conc) {
  int any = 0;
  for (int i = 0; i < n; i++) {
    conc[i] = args[i];
    if (args[i] >= -((int64_t)1 << 62)) continue;
    SymDim d;
    if (!sym_decode(args[i], &d)) {
      tg_set_error(TG_ERR_INVALID, "%s: argument %d (%lld) is out of range: neither a size nor a symbolic size (tg_sym)", fn, i,
                   (long long)args[i]);
      return -1;
    }
    conc[i] = sym_concrete(args[i]);
    any = 1;
  }
  return any;
}

/* A symbolic size given to tg_reshape or tg_expand must not be negative for any value of its variable
 * (a negative one now read as -1, "infer" or "keep", and the scheduler stopped on it). */
static bool sym_sizes_nonneg(const char *fn, const int64_t *codes, int n) {
  for (int i = 0; i < n; i++) {
    SymDim d;
    if (!sym_decode(codes[i], &d) || d.min + d.offset >= 0) continue;
    const char *name = "?";
    var_info(d.var, &name, NULL, NULL);
    tg_set_error(TG_ERR_INVALID,
                 "%s: size %d is %s%+lld, which is %lld at %s's minimum %lld (%lld now); a size must not be negative for any "
                 "value of the variable (give %s a minimum of at least %lld)",
                 fn, i, name, (long long)d.offset, (long long)(d.min + d.offset), name, (long long)d.min,
                 (long long)sym_concrete(codes[i]), name, (long long)-d.offset);
    return false;
  }
  return true;
}

/* Can the scheduler index a reshape of a to (cs: sizes, sh: the same with tg_sym codes) for every
 * value of the variables? The dims must match in groups (schedule.c reshape_index): a symbolic dim
 * bound to 1 may stand for a plain size-1 dim. */
static bool sym_reshape_ok(const UOp *a, const int64_t *cs, const int64_t *sh, int ndim) {
  int ga[64], gb[64];
  if (a->ndim > 64) return false;
  if (sym_reshape_groups(a->shape, a->sym, a->ndim, cs, sh, ndim, ga, gb) >= 0) return true;
  int64_t fs[64], ts[64];
  for (int i = 0; i < a->ndim; i++) fs[i] = a->sym && a->shape[i] != 1 ? a->sym[i] : a->shape[i];
  for (int j = 0; j < ndim; j++) ts[j] = cs[j] != 1 ? sh[j] : cs[j];
  return sym_reshape_groups(a->shape, fs, a->ndim, cs, ts, ndim, ga, gb) >= 0;
}

tg_tensor tg_reshape(tg_tensor x, const int64_t *shape0, int ndim) {
  GET(a, x, "tg_reshape");
  if (!check_ndim("tg_reshape", ndim, shape0)) return NONE;
  int64_t shape[64];
  int syms = sym_args("tg_reshape", shape0, ndim, shape);
  if (syms < 0 || (syms && !sym_sizes_nonneg("tg_reshape", shape0, ndim))) return NONE;
  int64_t sh[64];
  int infer = -1;
  int64_t known = 1;
  char b1[256], b2[256];
  for (int i = 0; i < ndim; i++) {
    sh[i] = shape[i];
    if (shape[i] == -1) {
      if (infer >= 0) return fail(TG_ERR_INVALID, "tg_reshape: only one dimension can be -1 (new shape %s)", fmt_shape(b1, sizeof b1, shape, ndim));
      infer = i;
    } else if (shape[i] < 0) {
      return fail(TG_ERR_INVALID, "tg_reshape: negative dimension %lld in new shape %s", (long long)shape[i], fmt_shape(b1, sizeof b1, shape, ndim));
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      return fail(TG_ERR_INVALID, "tg_reshape: new shape %s overflows int64", fmt_shape(b1, sizeof b1, shape, ndim));
    }
  }
  int64_t numel = shape_numel(a->shape, a->ndim);
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return fail(TG_ERR_INVALID, "tg_reshape: cannot infer -1 in %s for a tensor of shape %s (%lld elements)",
                  fmt_shape(b1, sizeof b1, shape, ndim), shp(b2, sizeof b2, a), (long long)numel);
    sh[infer] = numel / known;
    known = numel;
  }
  if (known != numel)
    return fail(TG_ERR_INVALID, "tg_reshape: cannot reshape %s (%lld elements) to %s (%lld elements)", shp(b2, sizeof b2, a),
                (long long)numel, fmt_shape(b1, sizeof b1, sh, ndim), (long long)known);
  if (!shape_fits(sh, ndim)) /* only a 0-element tensor gets here: its other dims still must fit */
    return fail(TG_ERR_INVALID,
                "tg_reshape: new shape %s is too large (its non-zero dimensions multiply past 2^48)",
                fmt_shape(b1, sizeof b1, sh, ndim));
  int64_t cs[64]; /* the sizes at the variables' bound values */
  memcpy(cs, sh, sizeof(int64_t) * (size_t)ndim);
  for (int i = 0; syms && i < ndim; i++)
    if (sym_is_code(shape0[i])) sh[i] = shape0[i];
  if (syms && !sym_reshape_ok(a, cs, sh, ndim)) {
    char dims[160];
    size_t o = 0;
    for (int i = 0; i < ndim && o < sizeof dims; i++)
      if (sym_is_code(shape0[i])) o += (size_t)snprintf(dims + o, sizeof dims - o, o ? ", %d" : "%d", i);
    return fail(TG_ERR_INVALID,
                "tg_reshape: cannot reshape %s to %s (sizes at the variables' bound values; dim %s symbolic) for "
                "every value of its variables: a symbolic size must come from an equal symbolic dim of the "
                "input, not from concrete sizes; reshape with the concrete sizes, or shrink a symbolic dim to "
                "the variable",
                shp(b2, sizeof b2, a), fmt_shape(b1, sizeof b1, shape, ndim), dims);
  }
  /* a multi-device tensor reshaped to its own shape is itself (the multi reshape gathered shards a
   * one-wide shrink had left uneven, and writes through such a view went into the copy) */
  if (m_is(a) && !syms && !a->sym && ndim == a->ndim && (ndim == 0 || !memcmp(sh, a->shape, sizeof(int64_t) * (size_t)ndim)))
    return t_wrap(uop_ref(a));
  return t_wrap(g_reshape(a, sh, ndim));
}

tg_tensor tg_permute(tg_tensor x, const int *order, int ndim) {
  GET(a, x, "tg_permute");
  char b[256];
  if (ndim != a->ndim || (ndim > 0 && !order))
    return fail(TG_ERR_INVALID, "tg_permute: order has %d entries but the tensor of shape %s has %d dims", ndim, shp(b, sizeof b, a), a->ndim);
  int64_t o[64];
  bool seen[64] = {0};
  for (int i = 0; i < ndim; i++) {
    int ax;
    if (norm_axis("tg_permute", order[i], ndim, &ax) < 0) return NONE;
    if (seen[ax]) return fail(TG_ERR_INVALID, "tg_permute: axis %d appears twice in the order (not a permutation)", order[i]);
    seen[ax] = true;
    o[i] = ax;
  }
  return t_wrap(g_permute(a, o));
}

bool shape_fits(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return false;
    if (shape[i] > 0 && (__builtin_mul_overflow(n, shape[i], &n) || n > TG_MAX_NUMEL)) return false;
  }
  return true;
}

tg_tensor tg_expand(tg_tensor x, const int64_t *shape0, int ndim) {
  GET(a, x, "tg_expand");
  if (!check_ndim("tg_expand", ndim, shape0)) return NONE;
  int64_t shape[64];
  int syms = sym_args("tg_expand", shape0, ndim, shape);
  if (syms < 0 || (syms && !sym_sizes_nonneg("tg_expand", shape0, ndim))) return NONE;
  char b1[256], b2[256];
  if (ndim < a->ndim)
    return fail(TG_ERR_INVALID, "tg_expand: cannot expand %s to fewer dims %s", shp(b1, sizeof b1, a), fmt_shape(b2, sizeof b2, shape, ndim));
  int64_t sh[64];
  int off = ndim - a->ndim;
  for (int i = 0; i < ndim; i++) {
    int64_t old = i < off ? 1 : a->shape[i - off];
    int64_t s = shape[i] == -1 ? old : shape[i];
    if (s < 0 || (old != 1 && s != old))
      return fail(TG_ERR_INVALID, "tg_expand: cannot expand %s to %s (only size-1 dims expand)", shp(b1, sizeof b1, a),
                  fmt_shape(b2, sizeof b2, shape, ndim));
    sh[i] = s;
  }
  if (!shape_fits(sh, ndim))
    return fail(TG_ERR_INVALID, "tg_expand: cannot expand %s to %s (too many elements)", shp(b1, sizeof b1, a), fmt_shape(b2, sizeof b2, sh, ndim));
  for (int i = 0; syms && i < ndim; i++)
    if (sym_is_code(shape0[i])) sh[i] = shape0[i];
  return t_wrap(bcast_to(a, sh, ndim));
}

tg_tensor tg_shrink(tg_tensor x, const int64_t *bounds0, int nbounds) {
  GET(a, x, "tg_shrink");
  char b[256];
  if (nbounds != 2 * a->ndim || (nbounds && !bounds0))
    return fail(TG_ERR_INVALID, "tg_shrink: expected %d bounds (start, end per dim) for shape %s, got %d", 2 * a->ndim, shp(b, sizeof b, a), nbounds);
  int64_t bounds[128];
  int syms = sym_args("tg_shrink", bounds0, nbounds, bounds);
  if (syms < 0) return NONE;
  for (int i = 0; syms && i < a->ndim; i++) {
    SymDim s0, s1;
    bool c0 = sym_decode(bounds0[2 * i], &s0), c1 = sym_decode(bounds0[2 * i + 1], &s1);
    if (c0 && (!c1 || s1.var != s0.var))
      return fail(TG_ERR_INVALID, "tg_shrink: dim %d starts at a symbolic size, so it must end at one of the same "
                  "variable (a size end - start = c - v is not expressible; use (tg_sym(v, a), tg_sym(v, b)))", i);
  }
  for (int i = 0; i < a->ndim; i++)
    if (bounds[2 * i] < 0 || bounds[2 * i] > bounds[2 * i + 1] || bounds[2 * i + 1] > a->shape[i])
      return fail(TG_ERR_INVALID, "tg_shrink: bounds (%lld, %lld) for dim %d of shape %s must satisfy 0 <= start <= end <= %lld",
                  (long long)bounds[2 * i], (long long)bounds[2 * i + 1], i, shp(b, sizeof b, a), (long long)a->shape[i]);
  /* the sharded axis of a multi-device tensor is split at sizes computed from the bound value (see
   * multi.c): an unbound variable there has none */
  int max_ = m_is(a) ? m_axis(a) : -1;
  for (int k = 0; syms && max_ >= 0 && k < 2; k++) {
    SymDim e;
    if (sym_decode(bounds0[2 * max_ + k], &e) && e.value < 0) {
      const char *vn = "?";
      var_info(e.var, &vn, NULL, NULL);
      return fail(TG_ERR_INVALID, "tg_shrink: variable '%s' is unbound, and dim %d is the sharded axis of a multi-device "
                  "tensor, whose shards split at the bound value (bind it with tg_var_bind)", vn, max_);
    }
  }
  /* what a jit's replays with other values must keep: 0 <= start <= end <= the dim, each side a
   * plain size or v + c (a start v + c holds for v >= -c; an end v + c on a dim of n for v <= n - c,
   * after a plain start s for v >= s - c; a plain end e on a dim of w + c for w >= e - c; an end on a
   * dim of another variable's size, the relation between the two) */
  for (int i = 0; i < a->ndim; i++) {
    SymDim e, s, d;
    bool es = syms && sym_decode(bounds0[2 * i + 1], &e), ss = syms && sym_decode(bounds0[2 * i], &s);
    bool ds = a->sym && sym_decode(a->sym[i], &d);
    if (!es && !ss && (!ds || (bounds[2 * i] == 0 && bounds[2 * i + 1] == a->shape[i]))) continue; /* (a whole symbolic dim is kept symbolic) */
    if (ss) jit_note_var_le(-1, 0, s.var, s.offset);
    if (es && !ss) jit_note_var_le(-1, bounds[2 * i], e.var, e.offset);
    if (ds) jit_note_var_le(es ? e.var : -1, es ? e.offset : bounds[2 * i + 1], d.var, d.offset);
    else if (es) jit_note_var_le(e.var, e.offset, -1, a->shape[i]);
  }
  return t_wrap(g_shrink(a, bounds0));
}

/* The dtype a pad of an x of dtype dt with value makes (see tg_pad) */
static tg_dtype pad_value_dtype(tg_dtype dt, double value) {
  if (tg_dtype_is_float(dt)) return dt;
  if (!(isfinite(value) && value == trunc(value))) return tg_default_float();
  if (dt == TG_BOOL) {
    if (value == 0 || value == 1) return dt;
    return value >= dtype_min(TG_INT32) && value <= dtype_max(TG_INT32) ? TG_INT32 : tg_default_float();
  }
  return dt; /* (a whole number past the dtype's range wraps into it, as tinygrad's does) */
}

tg_tensor tg_pad(tg_tensor x, const int64_t *pads0, int npads, double value) {
  GET(a, x, "tg_pad");
  char b[256];
  /* a value an integer or bool tensor cannot hold makes the result wider, as tinygrad's where with a
   * Python number does: DEFAULT_FLOAT for 1.5, inf or NaN; int32 for a bool padded with another whole
   * number. A whole number past an integer dtype's range wraps into it (uint8 -1 is 255), as
   * tinygrad's and PyTorch's pads do */
  tg_dtype to = pad_value_dtype((tg_dtype)a->dtype, value);
  if (to != (tg_dtype)a->dtype) {
    tg_scope_begin();
    tg_tensor r = tg_pad(tg_cast(x, to), pads0, npads, value);
    if (tg_valid(r)) r = tg_keep(r);
    tg_scope_end();
    return r;
  }
  if (npads != 2 * a->ndim || (npads && !pads0))
    return fail(TG_ERR_INVALID, "tg_pad: expected %d pads (before, after per dim) for shape %s, got %d", 2 * a->ndim, shp(b, sizeof b, a), npads);
  int64_t pads[128];
  int syms = sym_args("tg_pad", pads0, npads, pads);
  if (syms < 0) return NONE;
  for (int i = 0; syms && i < npads; i++) {
    SymDim d;
    if (sym_decode(pads0[i], &d) && pads[i] < 0)
      return fail(TG_ERR_INVALID, "tg_pad: symbolic pad %d stands for %lld now; a symbolic pad must not be negative", i, (long long)pads[i]);
    if (sym_decode(pads0[i], &d)) jit_note_var_le(-1, 0, d.var, d.offset); /* (a jit's replays too) */
  }
  /* negative pads of a symbolic dim w + c cut it: replays need w + c >= what they cut */
  for (int i = 0; a->sym && i < a->ndim; i++) {
    SymDim d;
    int64_t cut = (pads[2 * i] < 0 ? -pads[2 * i] : 0) + (pads[2 * i + 1] < 0 ? -pads[2 * i + 1] : 0);
    if (cut && sym_decode(a->sym[i], &d)) jit_note_var_le(-1, cut, d.var, d.offset);
  }
  for (int i = 0; syms && i < a->ndim; i++) {
    int parts = (a->sym && sym_is_code(a->sym[i])) + sym_is_code(pads0[2 * i]) + sym_is_code(pads0[2 * i + 1]);
    if (parts > 1)
      return fail(TG_ERR_INVALID, "tg_pad: dim %d of shape %s would be a sum of %d symbolic sizes, which is not expressible "
                  "as variable + constant; pad a symbolic amount on one side of a dim of plain size only", i, shp(b, sizeof b, a), parts);
  }
  int64_t sb[128], pp[128];
  bool neg = false;
  for (int i = 0; i < a->ndim; i++) {
    int64_t lo = pads[2 * i], hi = pads[2 * i + 1];
    const int64_t lim = (int64_t)1 << 40;
    if (lo < -lim || lo > lim || hi < -lim || hi > lim || (lo < 0 ? -lo : 0) + (hi < 0 ? -hi : 0) > a->shape[i])
      return fail(TG_ERR_INVALID, "tg_pad: pads (%lld, %lld) for dim %d of shape %s are out of range", (long long)lo, (long long)hi, i, shp(b, sizeof b, a));
    sb[2 * i] = lo < 0 ? -lo : 0;
    sb[2 * i + 1] = a->shape[i] - (hi < 0 ? -hi : 0);
    pp[2 * i] = lo > 0 ? lo : 0;
    pp[2 * i + 1] = hi > 0 ? hi : 0;
    neg = neg || lo < 0 || hi < 0;
  }
  int64_t outsh[64];
  for (int i = 0; i < a->ndim; i++) outsh[i] = a->shape[i] + pads[2 * i] + pads[2 * i + 1];
  if (!shape_fits(outsh, a->ndim)) {
    char b2[256];
    return fail(TG_ERR_INVALID, "tg_pad: padding shape %s gives %s, too many elements", shp(b, sizeof b, a), fmt_shape(b2, sizeof b2, outsh, a->ndim));
  }
  for (int i = 0; syms && i < npads; i++)
    if (sym_is_code(pads0[i])) pp[i] = pads0[i];
  UOp *s = neg ? g_shrink(a, sb) : uop_ref(a);
  UOp *p = g_pad(s, pp);
  if (value != 0.0) {
    /* the mask has the symbolic dims of what it pads */
    UOp *t = g_const_shaped(1, TG_BOOL, s->device, s->sym ? s->sym : s->shape, s->ndim);
    UOp *mask = g_pad(t, pp);
    UOp *v = n_const_like(p, value, (tg_dtype)a->dtype);
    UOp *w = g_alu(OP_WHERE, (tg_dtype)a->dtype, mask, p, v);
    uop_unref(t), uop_unref(mask), uop_unref(v), uop_unref(p);
    p = w;
  }
  uop_unref(s);
  return t_wrap(p);
}

tg_tensor tg_flip(tg_tensor x, const int *axes, int naxes) {
  GET(a, x, "tg_flip");
  int64_t f[64] = {0};
  if (!t_axes_count_ok("tg_flip", axes, naxes, a->ndim)) return NONE;
  for (int i = 0; i < naxes; i++) {
    int ax;
    if (norm_axis("tg_flip", axes[i], a->ndim, &ax) < 0) return NONE;
    if (a->ndim == 0) continue;
    if (f[ax]) return fail(TG_ERR_INVALID, "tg_flip: axis %d appears twice", axes[i]);
    f[ax] = 1;
  }
  return t_wrap(g_flip(a, f));
}

tg_tensor tg_transpose(tg_tensor x, int dim0, int dim1) {
  GET(a, x, "tg_transpose");
  int d0, d1;
  if (norm_axis("tg_transpose", dim0, a->ndim, &d0) < 0 || norm_axis("tg_transpose", dim1, a->ndim, &d1) < 0) return NONE;
  if (a->ndim == 0) return t_wrap(uop_ref(a));
  int64_t o[64];
  for (int i = 0; i < a->ndim; i++) o[i] = i;
  o[d0] = d1, o[d1] = d0;
  return t_wrap(g_permute(a, o));
}

/* tinygrad's .T is transpose() with its defaults (1, 0): the first two dims swap, whatever the
 * rank (numpy's .T reverses them all); fewer than two dims is an error there too. */
tg_tensor tg_T(tg_tensor x) {
  GET(a, x, "tg_T");
  if (a->ndim < 2) {
    char b[256];
    return fail(TG_ERR_INVALID,
                "tg_T: swaps dims 0 and 1, so it needs at least 2 dims; got shape %s (a 1-d tensor is its own "
                "transpose: use it as is, or tg_unsqueeze it into a row or a column first)",
                shp(b, sizeof b, a));
  }
  return tg_transpose(x, 1, 0);
}

tg_tensor tg_flatten(tg_tensor x, int start_dim, int end_dim) {
  GET(a, x, "tg_flatten");
  int s, e;
  if (norm_axis("tg_flatten", start_dim, a->ndim, &s) < 0 || norm_axis("tg_flatten", end_dim, a->ndim, &e) < 0) return NONE;
  if (a->ndim == 0) {
    int64_t one = 1;
    return t_wrap(g_reshape(a, &one, 1));
  }
  if (s > e) return fail(TG_ERR_INVALID, "tg_flatten: start_dim %d comes after end_dim %d", start_dim, end_dim);
  int64_t sh[64];
  int k = 0;
  for (int i = 0; i < s; i++) sh[k++] = a->shape[i];
  int64_t m = 1;
  for (int i = s; i <= e; i++) m *= a->shape[i];
  sh[k++] = m;
  for (int i = e + 1; i < a->ndim; i++) sh[k++] = a->shape[i];
  return t_wrap(g_reshape(a, sh, k));
}

tg_tensor tg_unsqueeze(tg_tensor x, int dim) {
  GET(a, x, "tg_unsqueeze");
  int d;
  if (norm_axis("tg_unsqueeze", dim, a->ndim + 1, &d) < 0) return NONE;
  if (a->ndim >= 64) return fail(TG_ERR_INVALID, "tg_unsqueeze: more than 64 dimensions are not supported");
  int64_t sh[64];
  int k = 0;
  for (int i = 0; i <= a->ndim; i++) {
    if (i == d) sh[k++] = 1;
    if (i < a->ndim) sh[k++] = a->shape[i];
  }
  return t_wrap(g_reshape(a, sh, a->ndim + 1));
}

tg_tensor tg_squeeze(tg_tensor x, int dim) {
  GET(a, x, "tg_squeeze");
  int d;
  if (norm_axis("tg_squeeze", dim, a->ndim, &d) < 0) return NONE;
  if (a->ndim == 0 || a->shape[d] != 1) return t_wrap(uop_ref(a));
  int64_t sh[64];
  int k = 0;
  for (int i = 0; i < a->ndim; i++)
    if (i != d) sh[k++] = a->shape[i];
  return t_wrap(g_reshape(a, sh, k));
}

tg_tensor tg_squeeze_all(tg_tensor x) {
  GET(a, x, "tg_squeeze_all");
  int64_t sh[64];
  int k = 0;
  for (int i = 0; i < a->ndim; i++) {
    bool sym = a->sym && sym_is_code(a->sym[i]);
    if (sym || a->shape[i] != 1) sh[k++] = sym ? a->sym[i] : a->shape[i];
  }
  return k == a->ndim ? t_wrap(uop_ref(a)) : t_wrap(g_reshape(a, sh, k));
}

/* tinygrad's shrink_to / pad_to: (0, shape[i]) on each dim, -1 keeping a dim as it is */
static bool to_shape(const char *fn, UOp *a, const int64_t *shape, int ndim, bool grow, int64_t *out) {
  char b[256];
  if (ndim != a->ndim || (ndim && !shape))
    return tg_set_error(TG_ERR_INVALID, "%s: shape has %d dims but x has shape %s", fn, ndim, shp(b, sizeof b, a)), false;
  for (int i = 0; i < ndim; i++) {
    int64_t s = shape[i] == -1 ? a->shape[i] : shape[i];
    if (s < 0 || (grow ? s < a->shape[i] : s > a->shape[i]))
      return tg_set_error(TG_ERR_INVALID, "%s: dim %d of x %s cannot %s to %lld (-1 keeps a dim)", fn, i, shp(b, sizeof b, a),
                          grow ? "pad" : "shrink", (long long)shape[i]),
             false;
    out[2 * i] = 0, out[2 * i + 1] = grow ? s - a->shape[i] : s;
  }
  return true;
}

tg_tensor tg_shrink_to(tg_tensor x, const int64_t *shape, int ndim) {
  GET(a, x, "tg_shrink_to");
  int64_t b[128];
  if (!to_shape("tg_shrink_to", a, shape, ndim, false, b)) return NONE;
  return tg_shrink(x, b, 2 * ndim);
}

tg_tensor tg_pad_to(tg_tensor x, const int64_t *shape, int ndim, double value) {
  GET(a, x, "tg_pad_to");
  int64_t p[128];
  if (!to_shape("tg_pad_to", a, shape, ndim, true, p)) return NONE;
  return tg_pad(x, p, 2 * ndim, value);
}

/* ---------------------------------------------------------------------------------------------- */
/* matmul: (x[..., n, 1, k] * w[..., 1, m, k]).sum(-1), fused into one reduce kernel                */

/* A wide right-hand matrix is packed first, as BLAS libraries do: (k, m) is copied to (m/P, k, P),
 * so the P columns a register tile works on are contiguous for the whole reduction. Read in place,
 * each step of the reduction would touch a new page (the rows are m*4 bytes apart): from m = 2048 on
 * the kernel then runs at half speed. The copy costs k*m loads and stores against 2*n*k*m FLOPs, so
 * a left-hand matrix of few rows (a decode step's vector) reads the weight in place instead. */
#define PACK_MIN_ROWS 64 /* the copy (k*m) is then at most 1/128 of the work; fewer rows stream the weight once */
/* Where the packed path starts and how large its row blocks are, by the host's vector width and
 * caches. The AVX-512 figures were tuned on a Zen 4/5 with a 1 MiB L2 and a 32 MiB L3 slice: blocks
 * from half the L3 on, of at most a quarter of it (16 and 8 MB there). On an AVX2 Zen 3 (the same
 * caches) those left 2048^3 at 26 GFLOPS, and packing from 512 columns with row blocks of twice the
 * L2 from twice the L2 on gave 78 (1024^3: 47 -> 97; bench/matmul.py). Unknown caches count as
 * those machines'. */
typedef struct {
  int64_t min_cols, block_from, block_max; /* bytes for the last two */
  int64_t panel;                           /* columns per packed panel */
} PackLimits;
/* The panel is as wide as the register tile (8 lanes x 2 with AVX2, 16 x 2 with AVX-512): a tile
 * then reads whole cache lines of one contiguous panel. With AVX2's 16-column tiles in 32-column
 * panels, each tile used half of every line it fetched and its panel slice (k x 128 bytes apart)
 * was twice the size: 16-column panels took 1024^3 from 164 to 185 GFLOPS and 4096^3 from 118 to
 * 175 (bench/matmul.py; OpenBLAS 187 and 185 in the same run). With AVX-512 the path starts at
 * 1024 columns, where a row is 4 KiB: read in place, the k rows of a tile's columns then fall in one
 * L1 set and a few L2 sets. On a Zen 5 (48 KiB L1, 1 MiB L2) 1024^3 went from 322 to 441 GFLOPS
 * (OpenBLAS 438-443 in the same runs); 512 columns stay in place (468-484 against OpenBLAS's 405-441). */
static PackLimits pack_limits(int device) {
  Device *d = device_by_id(device);
  int64_t l2 = d && d->caps.l2_bytes >= (256 << 10) ? d->caps.l2_bytes : 1 << 20;
  int64_t l3 = d && d->caps.l3_bytes >= (4 << 20) ? d->caps.l3_bytes : 32 << 20;
  if (d && d->caps.vec_bytes == 32) return (PackLimits){256, 2 * l2, 2 * l2, 16};
  return (PackLimits){1024, l3 / 2, l3 / 4, 32};
}
/* Does (..., rows, k) a @ (k, m) b take the packed path, as far as shapes go (the dtypes are the
 * caller's to check)? Fills *pl. */
static bool takes_packed(const UOp *a, const UOp *b, int64_t rows, int64_t k, int64_t m, PackLimits *pl) {
  if (a->ndim < 2 || b->ndim != 2 || (a->ndim != 2 && (a->sym || b->sym)) || k < 64 || rows < PACK_MIN_ROWS) return false;
  *pl = pack_limits(a->device);
  return m >= pl->min_cols && m % pl->panel == 0;
}

static tg_tensor matmul_packed(tg_tensor x, tg_tensor w, int64_t n, int64_t k, int64_t m, PackLimits pl) {
  OpScope o = op_scope_begin("tg_matmul");
  const int64_t P = pl.panel;
  tg_tensor bp = tg_contiguous(tg_permute(tg_reshape(w, TG_SHAPE(k, m / P, P)), TG_AXES(1, 0, 2)));
  tg_tensor bt = tg_permute(bp, TG_AXES(0, 2, 1)), r;
  /* a left-hand matrix larger than the blocking size would stream from the shared cache (or
   * memory) once per panel: row blocks of at most block_max bytes are multiplied with every panel
   * in turn while they stay in cache */
  int64_t R = 0;
  if (n * k * 4 > pl.block_from)
    for (int64_t rb = 512; rb >= 64 && !R; rb /= 2)
      if (n % rb == 0 && rb * k * 4 <= pl.block_max) R = rb;
  if (R) {
    tg_tensor ar = tg_reshape(x, TG_SHAPE(n / R, 1, R, 1, k));
    tg_tensor br = tg_reshape(bt, TG_SHAPE(1, m / P, 1, P, k));
    r = tg_sum(tg_mul(ar, br), TG_AXES(4), false); /* (n/R, m/P, R, P) */
    r = tg_reshape(tg_permute(r, TG_AXES(0, 2, 1, 3)), TG_SHAPE(n, m));
  } else {
    tg_tensor ar = tg_reshape(x, TG_SHAPE(n, 1, 1, k));
    r = tg_reshape(tg_sum(tg_mul(ar, tg_reshape(bt, TG_SHAPE(1, m / P, P, k))), TG_AXES(3), false), TG_SHAPE(n, m));
  }
  return op_scope_done(o, r);
}

/* Is u a reshape whose last axis merges dims that a permute right below it took out of their order
 * -- attention's output (batch, heads, tokens, features) transposed and reshaped to (batch, tokens,
 * heads * features)? Read in place, each step along that axis then takes a division and a remainder
 * of its index, and jumps between the merged dims' blocks. */
static bool last_axis_scrambled(const UOp *u) {
  if (uop_realized((UOp *)u) || u->op != OP_RESHAPE || u->ndim < 1) return false;
  const UOp *p = u->src[0];
  if (uop_realized((UOp *)p) || p->op != OP_PERMUTE || (int)p->niarg != p->ndim) return false;
  int64_t need = u->shape[u->ndim - 1], got = 1;
  int j = p->ndim;
  while (j > 0 && got < need) got *= p->shape[--j];
  if (got != need) return false;
  int prev = -1;
  for (int i = j; i < p->ndim; i++) {
    if (p->shape[i] == 1) continue;
    if (prev >= 0 && p->iarg[i] != prev + 1) return true;
    prev = (int)p->iarg[i];
  }
  return false;
}

/* dtype TG_DTYPE_DEFAULT: the promoted dtype; else tinygrad's dot(dtype=): the product (in the promoted
 * dtype) is cast to dtype and summed, the result has that dtype */
static tg_tensor matmul_impl(const char *fn, tg_tensor x, tg_tensor w, tg_dtype dtype) {
  GET(a, x, fn);
  GET(b, w, fn);
  char s1[256], s2[256];
  if (a->ndim == 0 || b->ndim == 0)
    return fail(TG_ERR_INVALID, "%s: both arguments need at least 1 dimension, got %s and %s", fn, shp(s1, sizeof s1, a), shp(s2, sizeof s2, b));
  int64_t k = a->shape[a->ndim - 1];
  int64_t kb = b->shape[b->ndim >= 2 ? b->ndim - 2 : 0];
  if (k != kb)
    return fail(TG_ERR_INVALID, "%s: inner dimensions differ: %s @ %s (%lld != %lld)", fn, shp(s1, sizeof s1, a), shp(s2, sizeof s2, b),
                (long long)k, (long long)kb);
  if (a->ndim > 60 || b->ndim > 60) return fail(TG_ERR_INVALID, "%s: too many dimensions", fn);
  tg_dtype dt = tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)b->dtype);
  int64_t mcols = b->ndim >= 2 ? b->shape[b->ndim - 1] : 1;
  if (dtype == dt) dtype = TG_DTYPE_DEFAULT;
  int64_t rows = 1; /* (..., n, k) @ (k, m): the leading axes are rows too */
  for (int i = 0; i < a->ndim - 1; i++) rows *= a->shape[i];
  PackLimits pl;
  /* a left-hand matrix whose rows run across a permute's dims (see last_axis_scrambled), read by
   * many columns, is copied into row order first: every column tile would otherwise redo the
   * scrambled indexing. BERT's attention output into its projection (32 x 128 tokens, 384 -> 384):
   * 30 -> 17.5 ms, the copy 0.7 ms included. */
  if (rows >= 64 && mcols >= 64 && k >= 16 && last_axis_scrambled(a)) {
    OpScope o = op_scope_begin(fn);
    tg_tensor xc = tg_contiguous(x);
    tg_tensor r = matmul_impl(fn, xc, w, dtype);
    tg_free(xc);
    return op_scope_done(o, r);
  }
  /* float16/bfloat16 on the CPU: the products and their sum in float32 and one rounding at the end
   * (the product of two halves is exact in float32). That is what tinygrad computes -- its kernels
   * keep a product that only feeds the float32 accumulator unrounded (measured: 8 of 4096 results of
   * a 64x512x64 float16 matmul differ from exact products summed, by the order of the sum, and 1712
   * from rounded ones) -- and it runs on the float32 kernels, packing included. The same on a GPU
   * device without half arithmetic (PoCL: halves are stored, and computed in float32). */
  if ((dtype == TG_DTYPE_DEFAULT || dtype == TG_FLOAT32) && half_via_float32(a, dt)) {
    /* (tg_matmul_dtype(.., float32): the same float32 products and sum, without the rounding) */
    OpScope o = op_scope_begin(fn);
    tg_tensor x32 = tg_cast(x, TG_FLOAT32), w32 = tg_cast(w, TG_FLOAT32);
    /* a large product reads each operand value many times: converted once into float32 buffers,
     * not in the kernel's inner loop (float16 512^3: 4.0 -> 1.3 ms); a weight the packed path
     * copies anyway is converted by that copy */
    if (rows * k * mcols >= (int64_t)1 << 23) { /* smaller ones: an extra kernel costs more than it saves */
      if (mcols >= 64) x32 = tg_contiguous(x32); /* each x value is read mcols times */
      /* each w value is read rows times; from 16 rows the copy pays, and under TinyJit a realized
       * weight's copy is constant work, skipped on replays (float16 BERT, 2 x 16 tokens: 30 -> 21 ms
       * a replay with rows >= 16 instead of 64) */
      if (rows >= 16 && !takes_packed(a, b, rows, k, mcols, &pl)) w32 = tg_contiguous(w32);
    }
    tg_tensor r = matmul_impl(fn, x32, w32, TG_DTYPE_DEFAULT);
    return op_scope_done(o, tg_valid(r) && dtype == TG_DTYPE_DEFAULT ? tg_cast(r, dt) : r);
  }
  if (dtype == TG_DTYPE_DEFAULT && b->ndim == 2) { /* IMAGE=1 on a GPU device: a 1x1 image convolution */
    int im = image_mode(fn, a, b, NULL);
    if (im < 0) return NONE;
    static const int64_t one[2] = {1, 1}, zero[4] = {0, 0, 0, 0};
    int64_t rows = 1;
    for (int i = 0; i < a->ndim - 1; i++) rows *= a->shape[i];
    if (im && image_conv_fits(a->device, 1, b->shape[0], rows, 1, b->shape[1], 1, 1, 1, one, one, zero)) return image_dot(fn, x, w);
  }
  /* (..., n, k) @ (k, m): the leading axes are rows too (a 3-D linear's (B, L, in) input), so it
   * takes the 2-D path and the result is reshaped back -- unless a dim is symbolic (merging it into
   * the rows would bake its current value into the kernels). bench/bert.py, 32 x 128 tokens: 1993 ->
   * 1160 ms (PyTorch 1357-1397 in the same runs). */
  if (dtype == TG_DTYPE_DEFAULT && dt == TG_FLOAT32 && a->dtype == TG_FLOAT32 && b->dtype == TG_FLOAT32 &&
      takes_packed(a, b, rows, k, mcols, &pl)) {
    if (a->ndim == 2) return matmul_packed(x, w, rows, k, mcols, pl);
    int64_t osh[64];
    for (int i = 0; i < a->ndim - 1; i++) osh[i] = a->shape[i];
    osh[a->ndim - 1] = mcols;
    tg_tensor x2 = tg_reshape(x, TG_SHAPE(rows, k));
    tg_tensor r2 = matmul_packed(x2, w, rows, k, mcols, pl);
    tg_tensor r = tg_reshape(r2, osh, a->ndim);
    tg_free(x2), tg_free(r2);
    return r;
  }
  /* x: (..., n, k) -> (..., n, 1, k); w: (..., k, m) -> (..., 1, m, k) */
  int64_t sa[64], sbb[64];
  int na = 0, nb = 0;
  for (int i = 0; i < a->ndim - 1; i++) sa[na++] = dim_arg(a, i);
  if (b->ndim >= 2) sa[na++] = 1;
  sa[na++] = dim_arg(a, a->ndim - 1);
  UOp *xa = g_reshape(a, sa, na);
  UOp *wt;
  if (b->ndim >= 2) {
    int64_t o[64];
    for (int i = 0; i < b->ndim; i++) o[i] = i;
    o[b->ndim - 1] = b->ndim - 2, o[b->ndim - 2] = b->ndim - 1;
    UOp *p = g_permute(b, o);
    for (int i = 0; i < b->ndim - 2; i++) sbb[nb++] = dim_arg(p, i);
    sbb[nb++] = 1;
    sbb[nb++] = dim_arg(p, b->ndim - 2);
    sbb[nb++] = dim_arg(p, b->ndim - 1);
    wt = g_reshape(p, sbb, nb);
    uop_unref(p);
  } else {
    wt = uop_ref(b);
  }
  UOp *in[2] = {xa, wt}, *bb[2];
  int rc = broadcast_n(fn, in, 2, bb);
  uop_unref(xa), uop_unref(wt);
  if (rc < 0) return NONE;
  /* the products' dtype: the operands' own, or dtype= where the products must not wrap or round
   * before the sum (dot_products_dtype) */
  tg_dtype pd = dot_products_dtype(dt, dtype);
  UOp *cx = g_cast(bb[0], pd), *cw = g_cast(bb[1], pd);
  UOp *m = g_alu(OP_MUL, pd, cx, cw, NULL);
  uop_unref(cx), uop_unref(cw), uop_unref(bb[0]), uop_unref(bb[1]);
  if (dtype != TG_DTYPE_DEFAULT) {
    UOp *mc = g_cast(m, dtype);
    uop_unref(m);
    m = mc;
    dt = dtype;
  }
  tg_tensor mt = t_wrap(m);
  tg_tensor r = tg_sum(mt, TG_AXES(-1), false);
  tg_free(mt);
  if (!tg_valid(r)) return r;
  UOp *ru = t_get(r, fn);
  if (ru->dtype != dt) {
    UOp *c = g_cast(ru, dt);
    tg_free(r);
    r = t_wrap(c);
  }
  /* a 1-D first argument drops its n dimension */
  if (a->ndim == 1 && b->ndim >= 2) {
    tg_tensor s = tg_squeeze(r, -2);
    tg_free(r);
    return s;
  }
  return r;
}

tg_tensor tg_matmul(tg_tensor x, tg_tensor w) { return matmul_impl("tg_matmul", x, w, TG_DTYPE_DEFAULT); }

tg_tensor tg_matmul_dtype(tg_tensor x, tg_tensor w, tg_dtype dtype) {
  if ((int)dtype < 0 || dtype >= TG_DTYPE_COUNT)
    return fail(TG_ERR_INVALID, "tg_matmul_dtype: invalid dtype %d", (int)dtype);
  return matmul_impl("tg_matmul_dtype", x, w, dtype);
}

/* ---------------------------------------------------------------------------------------------- */
/* x[idx]: rows of x picked by an integer tensor, one fused data-dependent load (no one-hot)        */

tg_tensor tg_index(tg_tensor x, tg_tensor idx) {
  GET(a, x, "tg_index");
  GET(ix, idx, "tg_index");
  char b1[256], b2[256];
  if (a->ndim == 0) return fail(TG_ERR_INVALID, "tg_index: cannot index a 0-d tensor (shape %s)", shp(b1, sizeof b1, a));
  /* bool is refused as tinygrad refuses it: read as 0/1 row numbers it would silently pick rows 0 and
   * 1 where a mask was meant */
  if (!tg_dtype_is_int((tg_dtype)ix->dtype))
    return fail(TG_ERR_INVALID, "tg_index: indices have dtype %s; use an integer tensor%s", tg_dtype_name((tg_dtype)ix->dtype),
                ix->dtype == TG_BOOL ? " (for a boolean mask use tg_masked_select, tg_nonzero or tg_where)" : "");
  if (ix->ndim + a->ndim - 1 > 64) return fail(TG_ERR_INVALID, "tg_index: result would have more than 64 dimensions (%s[%s])", shp(b1, sizeof b1, a), shp(b2, sizeof b2, ix));
  if (ix->device != a->device)
    return fail(TG_ERR_INVALID, "tg_index: indices are on %s but x is on %s", device_by_id(ix->device)->name, device_by_id(a->device)->name);
  int64_t rs[64];
  memcpy(rs, ix->shape, sizeof(int64_t) * (size_t)ix->ndim);
  memcpy(rs + ix->ndim, a->shape + 1, sizeof(int64_t) * (size_t)(a->ndim - 1));
  if (!shape_fits(rs, ix->ndim + a->ndim - 1)) /* (an empty result's other dims must fit too) */
    return fail(TG_ERR_INVALID, "tg_index: the result %s[%s] would be too large (its non-zero dimensions multiply past 2^48)",
                shp(b1, sizeof b1, a), shp(b2, sizeof b2, ix));
  if (ix->dtype == TG_UINT64) {
    /* a uint64 index of 2^63 or more is out of range (it reads 0, as any index past the end): read as
     * int64 it would be negative and count from the end */
    tg_tensor big = tg_ge(idx, tg_full_like(idx, 9223372036854775808.0, NULL));
    tg_tensor safe = tg_where(big, tg_full_like(idx, (double)a->shape[0], NULL), idx);
    UOp *su = t_get(safe, "tg_index");
    tg_tensor r = su ? t_wrap(g_index(a, su)) : NONE;
    tg_free(big), tg_free(safe);
    return r;
  }
  return t_wrap(g_index(a, ix));
}

/* tinygrad's Tensor.sequential: applies each layer function in turn. */
tg_tensor tg_sequential(tg_tensor x, const tg_layer_fn *fns, void *const *ctxs, int n) {
  GET(a, x, "tg_sequential");
  (void)a;
  if (n < 0 || (n > 0 && !fns)) return fail(TG_ERR_INVALID, "tg_sequential: fns is NULL or n=%d < 0", n);
  tg_tensor cur = x;
  for (int i = 0; i < n; i++) {
    if (!fns[i]) return fail(TG_ERR_INVALID, "tg_sequential: layer %d is NULL", i);
    cur = fns[i](cur, ctxs ? ctxs[i] : NULL);
    if (!tg_valid(cur)) return NONE;
  }
  return n ? cur : t_wrap(uop_ref(a));
}
