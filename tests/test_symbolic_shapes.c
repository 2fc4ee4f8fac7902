/* test_symbolic_shapes.c -- symbolic sizes (tinygrad's Variable): shrinks to [0:v], sums, softmax and
 * attention over v keys, a symbolic arange, reshape/expand with a variable, a KV cache written at a
 * symbolic position, TinyJit over changing v -- each against the concrete-size result, each kernel
 * compiled once for every value -- and the errors (out of bounds, unbound at realize). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>

#include "test.h"

#define MAXC 16 /* the cache's context length */
#define H 2
#define D 8

static uint64_t compiles(void) { return tg_global_counters().compile_count; }

static tg_tensor seq(int64_t n, float scale, float off) {
  float *d = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) d[i] = (float)sin((double)i * scale) + off;
  tg_tensor t = tg_from_data(d, &n, 1, NULL);
  free(d);
  return t;
}

/* max |a - b| over n floats of two tensors (read through tg_data) */
static double maxdiff(tg_tensor a, tg_tensor b, int64_t n) {
  float *x = calloc((size_t)n + 1, sizeof(float)), *y = calloc((size_t)n + 1, sizeof(float));
  double m = INFINITY;
  if (tg_data(a, x, sizeof(float) * (size_t)n) == TG_OK && tg_data(b, y, sizeof(float) * (size_t)n) == TG_OK) {
    m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i] - (double)y[i]));
  } else {
    fprintf(stderr, "    tg_data failed: %s\n", tg_last_error());
  }
  free(x), free(y);
  return m;
}

TEST(variable_api) {
  tg_symvar v = tg_variable("start_pos", 1, 8);
  CHECK(v.id != 0);
  CHECK(tg_variable("start_pos", 1, 8).id == v.id); /* interned */
  CHECK(tg_var_value(v) == -1);
  CHECK(!strcmp(tg_var_name(v), "start_pos") && tg_var_min(v) == 1 && tg_var_max(v) == 8);
  tg_symvar b = tg_var_bind(v, 5);
  CHECK(tg_var_value(b) == 5 && tg_var_value(tg_var_bind(b, 6)) == 6 && tg_var_value(tg_var_unbind(b)) == -1);
  int64_t c = tg_sym(b, 3), off = 0;
  CHECK(tg_is_sym(c) && c < -((int64_t)1 << 62));
  CHECK(tg_sym_variable(c, &off).id == b.id && off == 3);
  CHECK(!tg_is_sym(-1) && !tg_is_sym(0) && !tg_is_sym(7) && !tg_is_sym(TG_SYM_NONE));
  tg_clear_error();
  CHECK(tg_var_bind(v, 9).id == 0);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_var_bind: start_pos = 9 is outside its bounds [1, 8]");
  tg_clear_error();
  CHECK(tg_var_bind(v, 0).id == 0);
  tg_clear_error();
  CHECK(tg_variable("2bad", 0, 3).id == 0);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_variable");
  tg_clear_error();
  CHECK(tg_variable("n", 5, 3).id == 0);
  CHECK_STR_CONTAINS(tg_last_error(), "[5, 3]");
  tg_clear_error();
  CHECK(tg_sym((tg_symvar){0}, 0) == TG_SYM_NONE);
  tg_clear_error();
}

/* x[0:v] * 2 + 1, for several v: the same values as a concrete shrink, one compile */
TEST(shrink_to_v) {
  tg_scope_begin();
  tg_symvar v = tg_variable("v", 1, 10);
  tg_tensor x = seq(10, 0.7f, 0);
  for (int val = 2; val <= 9; val += 3) {
    tg_scope_begin();
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor y = tg_add_s(tg_mul_s(tg_shrink(x, TG_SHAPE(0, tg_sym(b, 0))), 2), 1);
    int64_t sh[1], shs[1];
    CHECK(tg_shape(y, sh) == 1 && sh[0] == val);
    CHECK(tg_shape_sym(y, shs) == 1 && tg_is_sym(shs[0]));
    tg_tensor r = tg_add_s(tg_mul_s(tg_shrink(x, TG_SHAPE(0, val)), 2), 1);
    uint64_t c0 = compiles();
    CHECK(tg_realize(y) == TG_OK);
    if (val > 2) CHECK_MSG(compiles() == c0, "compiled %llu kernels for a new value", (unsigned long long)(compiles() - c0));
    CHECK_MSG(maxdiff(y, r, val) == 0, "v=%d", val);
    tg_scope_end();
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* A product and broadcasts over a symbolic dim bound to 1, where it is one of several size-1 dims
 * once a matmul adds its own: the code stays on its dim (it went to the first size-1 dim, and then
 * to a dim broadcast to 3: wrong values, or a read of 48 bytes from a buffer of 16). */
TEST(matmul_over_v_bound_to_one) {
  tg_scope_begin();
  tg_symvar v = tg_variable("v", 1, 12);
  tg_tensor X = tg_reshape(seq(48, 1.3f, 0.2f), TG_SHAPE(4, 12)), W = tg_reshape(seq(36, 0.7f, 0), TG_SHAPE(12, 3));
  for (int val = 1; val <= 5; val += 4) {
    tg_scope_begin();
    int64_t L = tg_sym(tg_var_bind(v, val), 0);
    tg_tensor xs = tg_shrink(X, TG_SHAPE(0, 4, 0, L)), a = tg_matmul(xs, tg_shrink(W, TG_SHAPE(0, L, 0, 3)));
    tg_tensor c = tg_matmul(tg_shrink(X, TG_SHAPE(0, 4, 0, val)), tg_shrink(W, TG_SHAPE(0, val, 0, 3)));
    int64_t ss[2];
    CHECK(tg_shape_sym(a, ss) == 2 && ss[0] == 4 && ss[1] == 3);
    CHECK_MSG(maxdiff(a, c, 12) < 1e-5, "v=%d", val);
    tg_tensor g = tg_matmul(xs, tg_transpose(xs, 0, 1)); /* (4, v) @ (v, 4) */
    CHECK(tg_shape_sym(g, ss) == 2 && ss[0] == 4 && ss[1] == 4);
    /* a symbolic size in an index spec is an error (it read as a huge negative index: x[:, 0:v]
     * came out empty, and a setitem wrote nothing) */
    CHECK(!tg_valid(tg_getitem(X, TG_INDEX(TG_IX_ALL, TG_IX_SLICE(0, L, 1)))));
    CHECK_STR_CONTAINS(tg_last_error(), "tg_getitem: entry 1 holds a symbolic size");
    tg_clear_error();
    CHECK(tg_setitem_s(X, TG_INDEX(TG_IX_ALL, TG_IX_SLICE(L, L + 1, 1)), 5) == TG_ERR_INVALID);
    tg_clear_error();
    tg_scope_end();
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* sums, max and softmax over a symbolic axis of a (4, v) view */
TEST(reduce_softmax_over_v) {
  tg_scope_begin();
  tg_symvar v = tg_variable("v", 1, 12);
  tg_tensor x = tg_reshape(seq(4 * 12, 1.3f, 0.5f), TG_SHAPE(4, 12));
  tg_realize(x);
  /* a size of 1 may be built as a broadcastable dim (another graph): kernels are shared from 2 on */
  const int vals[] = {1, 2, 7, 12};
  for (int vi = 0; vi < 4; vi++) {
    int val = vals[vi];
    tg_scope_begin();
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor xs = tg_shrink(x, TG_SHAPE(0, 4, 0, tg_sym(b, 0))), xc = tg_shrink(x, TG_SHAPE(0, 4, 0, val));
    tg_tensor s = tg_sum(xs, TG_AXES(1), false), sc = tg_sum(xc, TG_AXES(1), false);
    tg_tensor m = tg_max(xs, TG_AXES(1), false), mc = tg_max(xc, TG_AXES(1), false);
    tg_tensor sm = tg_softmax(xs, 1), smc = tg_softmax(xc, 1);
    uint64_t c0 = compiles();
    tg_tensor outs[3] = {s, m, sm};
    CHECK(tg_realize_many(outs, 3) == TG_OK);
    if (val > 2) CHECK_MSG(compiles() == c0, "v=%d compiled %llu", val, (unsigned long long)(compiles() - c0));
    CHECK_MSG(maxdiff(s, sc, 4) < 1e-5, "sum v=%d", val);
    CHECK_MSG(maxdiff(m, mc, 4) == 0, "max v=%d", val);
    CHECK_MSG(maxdiff(sm, smc, 4 * val) < 1e-6, "softmax v=%d", val);
    tg_scope_end();
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* attention of one query over the first v keys of a cache (tinygrad's gpt2 decode step) */
static tg_tensor attention(tg_tensor q, tg_tensor k, tg_tensor vv, int64_t len) {
  /* q (1, H, 1, D); k, v: (1, MAXC, H, D) caches, the first len positions used */
  tg_tensor ks = tg_transpose(tg_shrink(k, TG_SHAPE(0, 1, 0, len, 0, H, 0, D)), 1, 2);
  tg_tensor vs = tg_transpose(tg_shrink(vv, TG_SHAPE(0, 1, 0, len, 0, H, 0, D)), 1, 2);
  tg_tensor sc = tg_mul_s(tg_matmul(q, tg_transpose(ks, 2, 3)), 1.0 / sqrt((double)D));
  return tg_matmul(tg_softmax(sc, -1), vs);
}

TEST(attention_over_v_keys) {
  tg_scope_begin();
  tg_symvar v = tg_variable("v", 1, MAXC);
  tg_tensor q = tg_reshape(seq(H * D, 0.9f, 0), TG_SHAPE(1, H, 1, D));
  tg_tensor k = tg_reshape(seq(MAXC * H * D, 0.37f, 0), TG_SHAPE(1, MAXC, H, D));
  tg_tensor vv = tg_reshape(seq(MAXC * H * D, 0.21f, 0.1f), TG_SHAPE(1, MAXC, H, D));
  tg_realize(q), tg_realize(k), tg_realize(vv);
  uint64_t csym = 0;
  const int vals[] = {1, 2, 5, 9, 16};
  for (int vi = 0; vi < 5; vi++) {
    int val = vals[vi];
    tg_scope_begin();
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor rc = attention(q, k, vv, val);
    tg_realize(rc);
    uint64_t c1 = compiles();
    tg_tensor rs = attention(q, k, vv, tg_sym(b, 0));
    tg_realize(rs);
    if (val > 2) CHECK_MSG(compiles() == c1, "v=%d: the symbolic attention compiled %llu kernels", val, (unsigned long long)(compiles() - c1));
    else if (val == 2) csym = compiles() - c1;
    CHECK_MSG(maxdiff(rs, rc, H * D) < 1e-5, "v=%d", val);
    tg_scope_end();
  }
  CHECK(csym > 0);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

TEST(arange_reshape_expand) {
  tg_scope_begin();
  tg_symvar v = tg_variable("n", 0, 20);
  for (int val = 0; val <= 20; val += 7) {
    tg_scope_begin();
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor a = tg_arange_sym(tg_sym(b, 0), NULL);
    int64_t sh[1];
    CHECK(tg_shape(a, sh) == 1 && sh[0] == val);
    int32_t got[32] = {0};
    CHECK(tg_data(a, got, sizeof got) == TG_OK);
    for (int i = 0; i < val; i++) CHECK_MSG(got[i] == i, "arange(%d)[%d] = %d", val, i, got[i]);
    int64_t total = -1;
    CHECK(tg_item_i64(tg_sum(a, NULL, 0, false), &total) == TG_OK && total == (int64_t)val * (val - 1) / 2);
    /* (v,) -> (1, v) -> (3, v), summed over the 3 copies; (v + 2,) by a pad */
    tg_tensor e = tg_expand(tg_reshape(tg_cast(a, TG_FLOAT32), TG_SHAPE(1, tg_sym(b, 0))), TG_SHAPE(3, tg_sym(b, 0)));
    tg_tensor es = tg_sum(e, TG_AXES(0), false);
    tg_tensor ref = tg_mul_s(tg_cast(tg_arange(0, val, 1, NULL), TG_FLOAT32), 3);
    if (val) CHECK_MSG(maxdiff(es, ref, val) == 0, "expand v=%d", val);
    tg_tensor p = tg_pad(tg_cast(a, TG_FLOAT32), TG_SHAPE(1, 1), 5.0);
    float pd[32] = {0};
    CHECK(tg_data(p, pd, sizeof pd) == TG_OK);
    CHECK(pd[0] == 5 && pd[val + 1] == 5);
    for (int i = 0; i < val; i++) CHECK(pd[i + 1] == (float)i);
    tg_scope_end();
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* A decode step as gpt2 does it: write this position's k and v into the cache at start_pos (an
 * assign into a symbolic-offset shrink), then attend over cache[0 : start_pos + 1]. */
typedef struct {
  tg_tensor cache; /* (2, 1, MAXC, H, D) */
} Model;

static tg_status f_step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  Model *m = u;
  tg_symvar sp = tg_jit_var(0);
  /* in[0]: q (1, H, 1, D); in[1]: the new k and v, (2, 1, 1, H, D) */
  tg_tensor slot = tg_shrink(m->cache, TG_SHAPE(0, 2, 0, 1, tg_sym(sp, 0), tg_sym(sp, 1), 0, H, 0, D));
  tg_assign(slot, in[1]);
  tg_status st = tg_realize(m->cache);
  if (st != TG_OK) return st;
  tg_tensor k = tg_reshape(tg_shrink(m->cache, TG_SHAPE(0, 1, 0, 1, 0, MAXC, 0, H, 0, D)), TG_SHAPE(1, MAXC, H, D));
  tg_tensor v = tg_reshape(tg_shrink(m->cache, TG_SHAPE(1, 2, 0, 1, 0, MAXC, 0, H, 0, D)), TG_SHAPE(1, MAXC, H, D));
  out[0] = attention(in[0], k, v, tg_sym(sp, 1));
  return TG_OK;
}

/* the reference, in plain C: softmax(q.k / sqrt(D)) . v over positions 0..len-1 */
static void ref_attention(const float *q, const float *kc, const float *vc, int len, float *o) {
  for (int h = 0; h < H; h++) {
    double s[MAXC], mx = -INFINITY, tot = 0;
    for (int p = 0; p < len; p++) {
      double d = 0;
      for (int i = 0; i < D; i++) d += (double)q[h * D + i] * kc[(p * H + h) * D + i];
      s[p] = d / sqrt((double)D);
      mx = fmax(mx, s[p]);
    }
    for (int p = 0; p < len; p++) tot += s[p] = exp(s[p] - mx);
    for (int i = 0; i < D; i++) {
      double a = 0;
      for (int p = 0; p < len; p++) a += s[p] / tot * vc[(p * H + h) * D + i];
      o[h * D + i] = (float)a;
    }
  }
}

TEST(jit_kv_cache_decode) {
  tg_scope_begin();
  Model m = {tg_contiguous(tg_zeros(TG_SHAPE(2, 1, MAXC, H, D), NULL))};
  CHECK(tg_realize(m.cache) == TG_OK);
  tg_jit *j = tg_jit_new(f_step, 1, &m);
  tg_symvar sp = tg_variable("start_pos", 0, MAXC - 1);
  float kc[MAXC * H * D], vc[MAXC * H * D];
  uint64_t c_after_capture = 0;
  int ncap = -1;
  for (int pos = 0; pos < MAXC; pos++) {
    tg_scope_begin();
    float qd[H * D], kv[2 * H * D], o[H * D], want[H * D];
    for (int i = 0; i < H * D; i++) {
      qd[i] = (float)sin(pos * 0.3 + i);
      kv[i] = kc[pos * H * D + i] = (float)cos(pos * 0.7 + i * 0.1);
      kv[H * D + i] = vc[pos * H * D + i] = (float)sin(pos * 1.1 - i * 0.2);
    }
    tg_tensor in[2] = {tg_from_data(qd, TG_SHAPE(1, H, 1, D), NULL), tg_from_data(kv, TG_SHAPE(2, 1, 1, H, D), NULL)};
    tg_symvar b = tg_var_bind(sp, pos);
    tg_tensor out[1];
    tg_status st = tg_jit_call_vars(j, in, 2, &b, 1, NULL, 0, out);
    CHECK_MSG(st == TG_OK, "pos %d: %s", pos, tg_last_error());
    if (st != TG_OK) {
      tg_scope_end();
      break;
    }
    ref_attention(qd, kc, vc, pos + 1, want);
    CHECK(tg_data(out[0], o, sizeof o) == TG_OK);
    double err = 0;
    for (int i = 0; i < H * D; i++) err = fmax(err, fabs((double)o[i] - want[i]));
    CHECK_MSG(err < 1e-5, "pos %d: max error %g", pos, err);
    if (pos == 1) c_after_capture = compiles(), ncap = tg_jit_captured_kernels(j);
    if (pos > 1) {
      CHECK_MSG(compiles() == c_after_capture, "pos %d compiled %llu kernels", pos, (unsigned long long)(compiles() - c_after_capture));
      CHECK(tg_jit_captured_kernels(j) == ncap);
    }
    tg_scope_end();
  }
  CHECK(ncap > 0);
  /* the cache holds every position written */
  float all[2 * MAXC * H * D];
  CHECK(tg_data(m.cache, all, sizeof all) == TG_OK);
  CHECK(!memcmp(all, kc, sizeof kc) && !memcmp(all + MAXC * H * D, vc, sizeof vc));
  /* a replay without the variable is refused, not run with the captured value */
  tg_clear_error();
  tg_tensor in[2] = {tg_zeros(TG_SHAPE(1, H, 1, D), NULL), tg_zeros(TG_SHAPE(2, 1, 1, H, D), NULL)};
  tg_realize(in[0]), tg_realize(in[1]);
  tg_tensor out[1];
  CHECK(tg_jit_call(j, in, 2, NULL, 0, out) != TG_OK);
  CHECK_STR_CONTAINS(tg_last_error(), "variables");
  tg_clear_error();
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}


/* tinygrad's test_symbolic_jit: a jitted function of x[0:i] and y[0:j] for changing i and j, two
 * variables as jit inputs, one capture for every value */
static tg_status f_two(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_symvar i = tg_jit_var(0), j = tg_jit_var(1);
  tg_tensor a = tg_sum(tg_mul_s(tg_shrink(in[0], TG_SHAPE(0, 3, 0, tg_sym(i, 0))), 2), TG_AXES(1), false);
  tg_tensor b = tg_max(tg_shrink(in[1], TG_SHAPE(0, tg_sym(j, 1), 0, 3)), TG_AXES(0), false);
  out[0] = tg_add(a, b);
  return TG_OK;
}

/* rows [w-2, w) of in[1], summed, plus the sum of a pad of w - 1 ones */
static tg_status f_window(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_symvar w = tg_jit_var(0);
  tg_tensor rows = tg_sum(tg_shrink(in[1], TG_SHAPE(tg_sym(w, -2), tg_sym(w, 0), 0, 3)), TG_AXES(0), false);
  tg_tensor pad = tg_sum(tg_pad(tg_zeros(TG_SHAPE(3, 1), NULL), TG_SHAPE(0, 0, 0, tg_sym(w, -1)), 1.0), TG_AXES(1), false);
  out[0] = tg_realize(rows) == TG_OK ? tg_add(rows, pad) : rows;
  return TG_OK;
}

/* plain sizes cut from a symbolic input dim n: x[0:3] (needs n >= 3), a pad of -3 (the same), and
 * x[v:v+2] of the input (needs v + 2 <= n): replays outside read past the input with status OK */
static int g_cut_mode;
static tg_status f_cut(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_symvar v = tg_jit_var(0);
  tg_tensor r = g_cut_mode == 0   ? tg_shrink(in[0], TG_SHAPE(0, 3))
                : g_cut_mode == 1 ? tg_pad(in[0], TG_SHAPE(-3, 0), 0)
                                  : tg_shrink(in[0], TG_SHAPE(tg_sym(v, 0), tg_sym(v, 2)));
  out[0] = tg_contiguous(tg_mul_s(r, 2));
  return tg_valid(out[0]) ? TG_OK : tg_last_status();
}

TEST(jit_plain_cuts_of_symbolic_dims) {
  tg_scope_begin();
  tg_symvar nv = tg_variable("rows", 1, 10), vv = tg_variable("at", 0, 10);
  float d[16];
  for (int i = 0; i < 16; i++) d[i] = (float)i;
  tg_tensor full = tg_from_data(d, TG_SHAPE(16), NULL);
  for (g_cut_mode = 0; g_cut_mode < 3; g_cut_mode++) {
    tg_jit *j = tg_jit_new(f_cut, 1, NULL);
    const int ns[] = {5, 6, 7, 4, 2}, vs[] = {1, 2, 3, 2, 5};
    for (int c = 0; c < 5; c++) {
      tg_symvar b[2] = {g_cut_mode == 2 ? tg_var_bind(vv, vs[c]) : tg_var_bind(nv, ns[c]), tg_var_bind(nv, ns[c])};
      tg_tensor x = tg_shrink(full, TG_SHAPE(0, tg_sym(b[g_cut_mode == 2 ? 1 : 0], 0))), out;
      tg_status st = tg_jit_call_vars(j, &x, 1, b, g_cut_mode == 2 ? 2 : 1, NULL, 0, &out);
      bool fits = g_cut_mode == 2 ? vs[c] + 2 <= ns[c] : ns[c] >= 3;
      CHECK_MSG((st == TG_OK) == fits, "mode %d call %d: status %d (%s)", g_cut_mode, c, st, st ? tg_last_error() : "");
      if (!fits) CHECK_STR_CONTAINS(tg_last_error(), g_cut_mode == 2 ? "break what the captured graph needs (at+2 <= rows+0" : "is below what the captured graph can use (3");
      tg_clear_error();
    }
    tg_jit_free(j);
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

TEST(jit_two_variables) {
  tg_scope_begin();
  tg_symvar vi = tg_variable("i", 1, 12), vj = tg_variable("j", 0, 11);
  float xd[36], yd[36];
  for (int k = 0; k < 36; k++) xd[k] = (float)sin(k * 0.3), yd[k] = (float)cos(k * 0.45);
  tg_tensor in[2] = {tg_from_data(xd, TG_SHAPE(3, 12), NULL), tg_from_data(yd, TG_SHAPE(12, 3), NULL)};
  tg_jit *jit = tg_jit_new(f_two, 1, NULL);
  uint64_t c0 = 0;
  int ncap = 0;
  for (int call = 0; call < 8; call++) {
    tg_scope_begin();
    int iv = 2 + (call * 5) % 11, jv = (call * 7) % 12;
    tg_symvar vars[2] = {tg_var_bind(vi, iv), tg_var_bind(vj, jv)};
    tg_tensor out[1];
    CHECK_MSG(tg_jit_call_vars(jit, in, 2, vars, 2, NULL, 0, out) == TG_OK, "%s", tg_last_error());
    float o[3] = {0};
    CHECK(tg_data(out[0], o, sizeof o) == TG_OK);
    for (int r = 0; r < 3; r++) {
      double a = 0, b = -INFINITY;
      for (int k = 0; k < iv; k++) a += 2.0 * xd[r * 12 + k];
      for (int k = 0; k < jv + 1; k++) b = fmax(b, yd[k * 3 + r]);
      CHECK_MSG(fabs(o[r] - (a + b)) < 1e-5, "call %d (i=%d j=%d) row %d: %g vs %g", call, iv, jv, r, o[r], a + b);
    }
    if (call == 1) c0 = compiles(), ncap = tg_jit_captured_kernels(jit);
    if (call > 1) CHECK(compiles() == c0 && tg_jit_captured_kernels(jit) == ncap);
    tg_scope_end();
  }
  CHECK(ncap > 0);
  /* the same call with one variable missing is refused */
  tg_symvar one = tg_var_bind(vi, 3);
  tg_tensor out[1];
  CHECK(tg_jit_call_vars(jit, in, 2, &one, 1, NULL, 0, out) != TG_OK);
  CHECK_STR_CONTAINS(tg_last_error(), "variables");
  tg_clear_error();
  /* unbound variables are refused at the call */
  tg_symvar unb[2] = {vi, vj};
  CHECK(tg_jit_call_vars(jit, in, 2, unb, 2, NULL, 0, out) != TG_OK);
  CHECK_STR_CONTAINS(tg_last_error(), "unbound");
  tg_clear_error();
  tg_jit_free(jit);
  /* a variable whose max is past what the tensors hold: replays with such a value are refused (the
   * captured kernels read x[0:i] past its 12 columns, and y[0:j+1] past its 12 rows, with status OK) */
  tg_symvar wi = tg_variable("i", 1, 1000), wj = tg_variable("j", 0, 1000);
  tg_jit *jw = tg_jit_new(f_two, 1, NULL);
  for (int call = 0; call < 3; call++) {
    tg_symvar vars[2] = {tg_var_bind(wi, 3 + call), tg_var_bind(wj, 4)};
    CHECK(tg_jit_call_vars(jw, in, 2, vars, 2, NULL, 0, out) == TG_OK);
  }
  tg_symvar ok[2] = {tg_var_bind(wi, 12), tg_var_bind(wj, 11)}, past_i[2] = {tg_var_bind(wi, 13), tg_var_bind(wj, 2)},
            past_j[2] = {tg_var_bind(wi, 5), tg_var_bind(wj, 12)};
  CHECK(tg_jit_call_vars(jw, in, 2, ok, 2, NULL, 0, out) == TG_OK);
  CHECK(tg_jit_call_vars(jw, in, 2, past_i, 2, NULL, 0, out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "variable 'i' = 13 is past what the captured graph can read (12");
  tg_clear_error();
  CHECK(tg_jit_call_vars(jw, in, 2, past_j, 2, NULL, 0, out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "variable 'j' = 12 is past what the captured graph can read (11");
  tg_clear_error();
  tg_jit_free(jw);
  /* and one below what the graph can use: a window x[v-2:v] (a replay at v = 1 read the row before
   * the tensor, with status OK) and a symbolic pad of v - 1 */
  tg_jit *jl = tg_jit_new(f_window, 1, NULL);
  tg_symvar wv = tg_variable("w", 0, 12);
  for (int call = 0; call < 3; call++) {
    tg_symvar b = tg_var_bind(wv, 4 + call);
    CHECK(tg_jit_call_vars(jl, in, 2, &b, 1, NULL, 0, out) == TG_OK);
    float got[3];
    CHECK(tg_data(out[0], got, sizeof got) == TG_OK);
    for (int c = 0; c < 3; c++) /* rows 2+call and 3+call of y, and the pad's sum of ones */
      CHECK_MSG(fabsf(got[c] - (yd[(2 + call) * 3 + c] + yd[(3 + call) * 3 + c] + (float)(3 + call))) < 1e-5, "call %d col %d", call, c);
  }
  tg_symvar low = tg_var_bind(wv, 1), edge = tg_var_bind(wv, 2);
  CHECK(tg_jit_call_vars(jl, in, 2, &edge, 1, NULL, 0, out) == TG_OK);
  CHECK(tg_jit_call_vars(jl, in, 2, &low, 1, NULL, 0, out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "variable 'w' = 1 is below what the captured graph can use (2");
  tg_clear_error();
  tg_jit_free(jl);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* The decode step the way tinygrad's gpt2 writes it: xk, xv stacked into the cache at start_pos,
 * keys and values cache[i][:, 0:start_pos+1] reshaped and transposed, scaled_dot_product_attention,
 * then a projection; jitted, against the same step with concrete sizes. */
#define B2 2
static tg_status f_gpt2(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  Model *m = u;
  int64_t sp = nargs ? (int64_t)args[0] : 0; /* concrete form: the position as a plain size */
  tg_symvar v = tg_jit_var(0);
  int64_t st = v.id ? tg_sym(v, 0) : sp, en = v.id ? tg_sym(v, 1) : sp + 1;
  /* in[0]: x (B2, 1, H*D); in[1]: the qkv weight (H*D, 3*H*D) */
  tg_tensor qkv = tg_matmul(in[0], in[1]);
  tg_tensor xq = tg_reshape(tg_shrink(qkv, TG_SHAPE(0, B2, 0, 1, 0, H * D)), TG_SHAPE(B2, 1, H, D));
  tg_tensor xk = tg_reshape(tg_shrink(qkv, TG_SHAPE(0, B2, 0, 1, H * D, 2 * H * D)), TG_SHAPE(B2, 1, H, D));
  tg_tensor xv = tg_reshape(tg_shrink(qkv, TG_SHAPE(0, B2, 0, 1, 2 * H * D, 3 * H * D)), TG_SHAPE(B2, 1, H, D));
  tg_tensor kv[2] = {xk, xv};
  tg_assign(tg_shrink(m->cache, TG_SHAPE(0, 2, 0, B2, st, en, 0, H, 0, D)), tg_stack(kv, 2, 0));
  tg_status s = tg_realize(m->cache);
  if (s != TG_OK) return s;
  tg_tensor keys = tg_reshape(tg_shrink(m->cache, TG_SHAPE(0, 1, 0, B2, 0, en, 0, H, 0, D)), TG_SHAPE(B2, en, H, D));
  tg_tensor vals = tg_reshape(tg_shrink(m->cache, TG_SHAPE(1, 2, 0, B2, 0, en, 0, H, 0, D)), TG_SHAPE(B2, en, H, D));
  tg_tensor a = tg_scaled_dot_product_attention(tg_transpose(xq, 1, 2), tg_transpose(keys, 1, 2), tg_transpose(vals, 1, 2),
                                                (tg_tensor){0}, NULL);
  out[0] = tg_reshape(tg_transpose(a, 1, 2), TG_SHAPE(B2, 1, H * D));
  return TG_OK;
}

TEST(gpt2_style_decode) {
  tg_scope_begin();
  Model ms = {tg_contiguous(tg_zeros(TG_SHAPE(2, B2, MAXC, H, D), NULL))}, mc = {tg_contiguous(tg_zeros(TG_SHAPE(2, B2, MAXC, H, D), NULL))};
  tg_realize(ms.cache), tg_realize(mc.cache);
  float w[H * D * 3 * H * D];
  for (int i = 0; i < H * D * 3 * H * D; i++) w[i] = (float)sin(i * 0.013) * 0.3f;
  tg_tensor wt = tg_from_data(w, TG_SHAPE(H * D, 3 * H * D), NULL);
  tg_jit *jit = tg_jit_new(f_gpt2, 1, &ms);
  tg_symvar sp = tg_variable("start_pos", 0, MAXC - 1);
  for (int pos = 0; pos < 10; pos++) {
    tg_scope_begin();
    float x[B2 * H * D];
    for (int i = 0; i < B2 * H * D; i++) x[i] = (float)cos(pos * 0.77 + i * 0.31);
    tg_tensor in[2] = {tg_from_data(x, TG_SHAPE(B2, 1, H * D), NULL), wt};
    tg_symvar b = tg_var_bind(sp, pos);
    tg_tensor os[1], oc[1];
    uint64_t cb = compiles();
    CHECK_MSG(tg_jit_call_vars(jit, in, 2, &b, 1, NULL, 0, os) == TG_OK, "pos %d: %s", pos, tg_last_error());
    /* call 1 (pos 0) runs and compiles; call 2 (pos 1, start_pos + 1 = 2) captures; replays compile nothing */
    if (pos >= 2) CHECK_MSG(compiles() == cb, "pos %d: the jitted step compiled %llu kernels", pos, (unsigned long long)(compiles() - cb));
    double arg = pos;
    CHECK(f_gpt2(in, 2, &arg, 1, oc, 1, &mc) == TG_OK);
    CHECK_MSG(maxdiff(os[0], oc[0], B2 * H * D) < 1e-5, "pos %d", pos);
    tg_scope_end();
  }
  float all_s[2 * B2 * MAXC * H * D], all_c[2 * B2 * MAXC * H * D];
  CHECK(tg_data(ms.cache, all_s, sizeof all_s) == TG_OK && tg_data(mc.cache, all_c, sizeof all_c) == TG_OK);
  CHECK(!memcmp(all_s, all_c, sizeof all_s));
  tg_jit_free(jit);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* a symbolic loop long enough to be split across threads (over its max extent) */
TEST(threaded_symbolic_loop) {
  tg_scope_begin();
  const int64_t N = 300000;
  tg_symvar v = tg_variable("big", 1, N);
  tg_tensor x = seq(N, 0.001f, 0);
  for (int64_t val = 100001; val <= N; val += 99999) {
    tg_scope_begin();
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor y = tg_exp(tg_shrink(x, TG_SHAPE(0, tg_sym(b, 0))));
    tg_tensor r = tg_exp(tg_shrink(x, TG_SHAPE(0, val)));
    /* (the concrete kernel may be vectorized, whose exp can differ from libm's by an ulp) */
    CHECK_MSG(maxdiff(y, r, val) < 1e-6, "v=%lld", (long long)val);
    double s1 = 0, s2 = 0;
    CHECK(tg_item(tg_sum(tg_shrink(x, TG_SHAPE(0, tg_sym(b, 0))), NULL, 0, false), &s1) == TG_OK);
    CHECK(tg_item(tg_sum(tg_shrink(x, TG_SHAPE(0, val)), NULL, 0, false), &s2) == TG_OK);
    CHECK_CLOSE(s1, s2, 1e-4);
    tg_scope_end();
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* tg_cat along a symbolic dim: right values, but the pad it makes for the second part is the bound
 * value's: a jit refuses to capture it rather than replay that pad at other values */
static tg_status f_cat(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_tensor ts[2] = {tg_shrink(in[0], TG_SHAPE(0, tg_sym(tg_jit_var(0), 0))), in[1]};
  out[0] = tg_sum(tg_mul(tg_cat(ts, 2, 0), tg_arange_sym(tg_sym(tg_jit_var(0), 3), NULL)), NULL, 0, false);
  return TG_OK;
}

TEST(cat_symbolic) {
  tg_scope_begin();
  tg_symvar v = tg_variable("v", 1, 12);
  float d[12], e[3] = {100, 200, 300};
  for (int i = 0; i < 12; i++) d[i] = (float)(i + 1);
  tg_tensor in[2] = {tg_from_data(d, TG_SHAPE(12), NULL), tg_from_data(e, TG_SHAPE(3), NULL)};
  for (int val = 2; val < 6; val++) {
    tg_scope_begin();
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor ts[2] = {tg_shrink(in[0], TG_SHAPE(0, tg_sym(b, 0))), in[1]};
    tg_tensor c = tg_cat(ts, 2, 0);
    float out[16] = {0};
    CHECK(tg_data(c, out, sizeof out) == TG_OK);
    for (int i = 0; i < val + 3; i++) CHECK(out[i] == (i < val ? d[i] : e[i - val]));
    tg_scope_end();
  }
  tg_jit *j = tg_jit_new(f_cat, 1, NULL);
  tg_status st = TG_OK;
  for (int call = 0; call < 3 && st == TG_OK; call++) {
    tg_symvar b = tg_var_bind(v, 2 + call);
    tg_tensor out[1];
    st = tg_jit_call_vars(j, in, 2, &b, 1, NULL, 0, out);
  }
  CHECK(st != TG_OK);
  CHECK_STR_CONTAINS(tg_last_error(), "concrete size computed from its bound value");
  tg_clear_error();
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

static tg_status f_symout(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_mul_s(tg_shrink(in[0], TG_SHAPE(0, tg_sym(tg_jit_var(0), 0))), 3);
  return TG_OK;
}

/* a jitted function's output of symbolic shape: each replay returns the [0, v) view of the output
 * buffer (stored at its max) at that call's value */
TEST(jit_symbolic_output) {
  tg_scope_begin();
  tg_symvar v = tg_variable("v", 1, 12);
  tg_tensor in[1] = {seq(12, 0.5f, 0)};
  float x[12];
  CHECK(tg_data(in[0], x, sizeof x) == TG_OK);
  tg_jit *j = tg_jit_new(f_symout, 1, NULL);
  const int vals[] = {4, 5, 9, 2, 12, 7};
  uint64_t c0 = 0;
  for (int c = 0; c < 6; c++) {
    tg_scope_begin();
    tg_symvar b = tg_var_bind(v, vals[c]);
    tg_tensor out[1];
    c0 = compiles();
    CHECK_MSG(tg_jit_call_vars(j, in, 1, &b, 1, NULL, 0, out) == TG_OK, "v=%d: %s", vals[c], tg_last_error());
    if (c >= 2) CHECK_MSG(compiles() == c0, "v=%d: the replay compiled", vals[c]); /* replays compile nothing */
    int64_t sh[1] = {0}, ss[1] = {0};
    CHECK_MSG(tg_shape(out[0], sh) == 1 && sh[0] == vals[c], "v=%d: shape %lld", vals[c], (long long)sh[0]);
    CHECK(tg_shape_sym(out[0], ss) == 1 && tg_is_sym(ss[0]));
    float o[12] = {0};
    CHECK(tg_data(out[0], o, sizeof(float) * (size_t)vals[c]) == TG_OK);
    for (int i = 0; i < vals[c]; i++) CHECK_MSG(o[i] == x[i] * 3, "v=%d [%d]: %g vs %g", vals[c], i, o[i], x[i] * 3);
    /* the output is a tensor like any other: it feeds further (non-jitted) ops */
    double s = 0, want = 0;
    CHECK(tg_item(tg_sum(out[0], NULL, 0, false), &s) == TG_OK);
    for (int i = 0; i < vals[c]; i++) want += x[i] * 3;
    CHECK_MSG(fabs(s - want) < 1e-4, "v=%d: sum %g vs %g", vals[c], s, want);
    if (c >= 1) CHECK(tg_jit_captured_kernels(j) > 0);
    tg_scope_end();
  }
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* A batch size chosen per call: the input is a (B, 8) view of each call's own (n, 8) tensor (a
 * tg_shrink to [0, B) with B bound to n), the output (B, 4); one capture serves every batch. */
static tg_tensor g_w1, g_w2;
static tg_status f_mlp(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_matmul(tg_relu(tg_matmul(in[0], g_w1)), g_w2);
  return TG_OK;
}

TEST(jit_symbolic_batch) {
  tg_scope_begin();
  tg_symvar bv = tg_variable("batch", 1, 32);
  float w1[8 * 16], w2[16 * 4];
  for (int i = 0; i < 8 * 16; i++) w1[i] = (float)sin(i * 0.7) * 0.5f;
  for (int i = 0; i < 16 * 4; i++) w2[i] = (float)cos(i * 0.3) * 0.5f;
  g_w1 = tg_from_data(w1, TG_SHAPE(8, 16), NULL), g_w2 = tg_from_data(w2, TG_SHAPE(16, 4), NULL);
  tg_jit *j = tg_jit_new(f_mlp, 1, NULL);
  const int ns[] = {3, 5, 32, 1, 17, 8};
  uint64_t c0 = 0;
  for (int c = 0; c < 6; c++) {
    tg_scope_begin();
    int n = ns[c];
    float xd[32 * 8];
    for (int i = 0; i < n * 8; i++) xd[i] = (float)sin(i * 0.11 + c);
    tg_tensor x = tg_from_data(xd, TG_SHAPE(n, 8), NULL);
    tg_symvar b = tg_var_bind(bv, n);
    tg_tensor in[1] = {tg_shrink(x, TG_SHAPE(0, tg_sym(b, 0), 0, 8))};
    tg_tensor out[1];
    CHECK(tg_realize(x) == TG_OK);
    c0 = compiles();
    CHECK_MSG(tg_jit_call_vars(j, in, 1, &b, 1, NULL, 0, out) == TG_OK, "n=%d: %s", n, tg_last_error());
    if (c >= 2) CHECK_MSG(compiles() == c0, "n=%d: the replay compiled %llu kernels", n, (unsigned long long)(compiles() - c0));
    int64_t sh[2] = {0};
    CHECK(tg_shape(out[0], sh) == 2 && sh[0] == n && sh[1] == 4);
    float o[32 * 4];
    CHECK(tg_data(out[0], o, sizeof(float) * (size_t)n * 4) == TG_OK);
    double err = 0;
    for (int r = 0; r < n; r++)
      for (int k = 0; k < 4; k++) {
        double acc = 0;
        for (int h = 0; h < 16; h++) {
          double z = 0;
          for (int i = 0; i < 8; i++) z += (double)xd[r * 8 + i] * w1[i * 16 + h];
          acc += (z > 0 ? z : 0) * w2[h * 4 + k];
        }
        err = fmax(err, fabs(acc - o[r * 4 + k]));
      }
    CHECK_MSG(err < 1e-4, "n=%d: max error %g", n, err);
    tg_scope_end();
  }
  CHECK(tg_jit_captured_kernels(j) > 0);
  /* a plain (concrete) input where a symbolic one was captured is refused */
  tg_tensor x = tg_contiguous(tg_zeros(TG_SHAPE(4, 8), NULL));
  CHECK(tg_realize(x) == TG_OK);
  tg_symvar b = tg_var_bind(bv, 4);
  tg_tensor out[1];
  CHECK(tg_jit_call_vars(j, &x, 1, &b, 1, NULL, 0, out) != TG_OK);
  CHECK_STR_CONTAINS(tg_last_error(), "input 0");
  tg_clear_error();
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* The call's variables are the only values a replay uses, so they must agree with what the
 * capture saw: an input sized by the variable bound to another value than vars[] passes (a replay
 * would read past the input's end: 30 rows of a 12-row buffer), a function that binds the call's
 * variable to a value of its own (the capture ran with it, replays would not), and a variable of
 * the same name with other bounds (another variable) are errors that say so */
static tg_status f_sum2(const tg_tensor *in, int nin, const double *a, int na, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)a, (void)na, (void)nout, (void)u;
  out[0] = tg_sum(tg_mul_s(in[0], 2), TG_AXES(0), false);
  return TG_OK;
}
static float g_rows[40 * 4];
static tg_status f_rebind(const tg_tensor *in, int nin, const double *a, int na, tg_tensor *out, int nout, void *u) {
  (void)in, (void)nin, (void)a, (void)na, (void)nout;
  /* (*(int *)u: 0 binds the call's variable to 5 here; 1 makes a variable of the same name, [1, 30]) */
  tg_symvar v = *(int *)u ? tg_var_bind(tg_variable("m", 1, 30), 5) : tg_var_bind(tg_jit_var(0), 5);
  tg_tensor x = tg_from_data(g_rows, TG_SHAPE(40, 4), NULL);
  out[0] = tg_sum(tg_shrink(x, TG_SHAPE(0, tg_sym(v, 0), 0, 4)), TG_AXES(0), false);
  return TG_OK;
}

TEST(jit_call_variables_must_agree) {
  tg_scope_begin();
  for (int i = 0; i < 40 * 4; i++) g_rows[i] = (float)(i % 7);
  tg_symvar bv = tg_variable("b", 1, 40);
  tg_jit *j = tg_jit_new(f_sum2, 1, NULL);
  const int rows[] = {3, 4, 7, 12}, binds[] = {3, 4, 7, 30};
  for (int c = 0; c < 4; c++) {
    tg_scope_begin();
    tg_tensor x = tg_from_data(g_rows, TG_SHAPE(rows[c], 4), NULL);
    CHECK(tg_realize(x) == TG_OK);
    tg_tensor in = tg_shrink(x, TG_SHAPE(0, tg_sym(tg_var_bind(bv, rows[c]), 0), 0, 4));
    tg_symvar b = tg_var_bind(bv, binds[c]);
    tg_tensor out[1];
    tg_status st = tg_jit_call_vars(j, &in, 1, &b, 1, NULL, 0, out);
    if (rows[c] == binds[c]) {
      CHECK_MSG(st == TG_OK, "rows=%d: %s", rows[c], tg_last_error());
    } else {
      CHECK(st != TG_OK);
      CHECK_STR_CONTAINS(tg_last_error(), "input 0's dim 0 is sized by variable 'b' bound to 12, but vars[] passes 'b' = 30");
      tg_clear_error();
    }
    tg_scope_end();
  }
  tg_jit_free(j);
  for (int mode = 0; mode < 2; mode++) {
    tg_symvar mv = tg_variable("m", 1, 20);
    j = tg_jit_new(f_rebind, 1, &mode);
    int fails = 0;
    for (int c = 0; c < 4; c++) {
      tg_scope_begin();
      tg_symvar m = tg_var_bind(mv, (const int[]){3, 4, 6, 7}[c]); /* (never the function's 5) */
      tg_tensor out[1];
      if (tg_jit_call_vars(j, NULL, 0, &m, 1, NULL, 0, out) != TG_OK) {
        fails++;
        CHECK_STR_CONTAINS(tg_last_error(), mode ? "takes variable 'm' in [1, 30], and the call passes 'm' in [1, 20]"
                                                 : "ran with variable 'm' = 5, but the call passes");
        tg_clear_error();
      }
      tg_scope_end();
    }
    /* the first call runs the function plainly; every capture after it is refused (one at the
     * function's own value could not tell: tinygrad's replays, too, take the call's values) */
    CHECK_MSG(fails == 3, "mode %d: %d calls failed", mode, fails);
    tg_jit_free(j);
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* a window at a symbolic offset, x[v : v+3] (a concrete size), and a pad by a symbolic amount */
TEST(symbolic_offset_and_pad) {
  tg_scope_begin();
  tg_symvar v = tg_variable("off", 0, 9);
  tg_tensor x = seq(12, 0.9f, 1);
  for (int val = 0; val <= 9; val += 3) {
    tg_scope_begin();
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor w = tg_mul_s(tg_shrink(x, TG_SHAPE(tg_sym(b, 0), tg_sym(b, 3))), 2);
    tg_tensor wc = tg_mul_s(tg_shrink(x, TG_SHAPE(val, val + 3)), 2);
    int64_t sh[1], ss[1];
    CHECK(tg_shape(w, sh) == 1 && sh[0] == 3 && tg_shape_sym(w, ss) == 1 && ss[0] == 3); /* a concrete size */
    uint64_t c0 = compiles();
    CHECK(tg_realize(w) == TG_OK);
    if (val > 0) CHECK_MSG(compiles() == c0, "off=%d compiled %llu", val, (unsigned long long)(compiles() - c0));
    CHECK_MSG(maxdiff(w, wc, 3) == 0, "window off=%d", val);
    /* pad(x[0:3], (off, 0)): off zeros, then the three values */
    tg_tensor p = tg_pad(tg_shrink(x, TG_SHAPE(0, 3)), TG_SHAPE(tg_sym(b, 0), 0), 0.0);
    tg_tensor pc = tg_pad(tg_shrink(x, TG_SHAPE(0, 3)), TG_SHAPE(val, 0), 0.0);
    CHECK(tg_shape(p, sh) == 1 && sh[0] == val + 3);
    CHECK_MSG(maxdiff(p, pc, val + 3) == 0, "pad off=%d", val);
    tg_scope_end();
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* mean and variance over a symbolic axis count its elements in the kernel: jitted over changing v */
static tg_status f_meanvar(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_tensor xs = tg_shrink(in[0], TG_SHAPE(0, 3, 0, tg_sym(tg_jit_var(0), 0)));
  out[0] = tg_add(tg_mean(xs, TG_AXES(1), false), tg_mul_s(tg_var(xs, TG_AXES(1), false, 1.0), 10));
  return TG_OK;
}

TEST(jit_mean_var_over_v) {
  tg_scope_begin();
  tg_symvar v = tg_variable("v", 2, 20);
  float xd[60];
  for (int i = 0; i < 60; i++) xd[i] = (float)sin(i * 0.37) * 2;
  tg_tensor in[1] = {tg_from_data(xd, TG_SHAPE(3, 20), NULL)};
  tg_jit *j = tg_jit_new(f_meanvar, 1, NULL);
  uint64_t c0 = 0;
  for (int call = 0; call < 6; call++) {
    tg_scope_begin();
    int val = 2 + (call * 7) % 19;
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor out[1];
    CHECK_MSG(tg_jit_call_vars(j, in, 1, &b, 1, NULL, 0, out) == TG_OK, "%s", tg_last_error());
    float o[3] = {0};
    CHECK(tg_data(out[0], o, sizeof o) == TG_OK);
    for (int r = 0; r < 3; r++) {
      double m = 0, q = 0;
      for (int k = 0; k < val; k++) m += xd[r * 20 + k];
      m /= val;
      for (int k = 0; k < val; k++) q += (xd[r * 20 + k] - m) * (xd[r * 20 + k] - m);
      CHECK_MSG(fabs(o[r] - (m + 10 * q / (val - 1))) < 1e-4, "v=%d row %d: %g vs %g", val, r, o[r], m + 10 * q / (val - 1));
    }
    if (call == 1) c0 = compiles();
    if (call > 1) CHECK(compiles() == c0);
    tg_scope_end();
  }
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* a call where the symbolic size is 1 runs but is not captured (its graph treats the size as a
 * broadcastable 1); the jit captures at the first call with a larger size and replays from there */
static tg_status f_soft(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_tensor xs = tg_shrink(in[0], TG_SHAPE(0, 3, 0, tg_sym(tg_jit_var(0), 0)));
  out[0] = tg_sum(tg_mul(tg_softmax(xs, 1), xs), TG_AXES(1), false);
  return TG_OK;
}

TEST(jit_capture_postponed_at_size_one) {
  tg_scope_begin();
  tg_symvar v = tg_variable("v", 1, 10);
  float xd[30];
  for (int i = 0; i < 30; i++) xd[i] = (float)cos(i * 0.61) * 3;
  tg_tensor in[1] = {tg_from_data(xd, TG_SHAPE(3, 10), NULL)};
  tg_jit *j = tg_jit_new(f_soft, 1, NULL);
  const int vals[] = {1, 1, 1, 2, 3, 1, 7, 10, 4};
  for (int c = 0; c < 9; c++) {
    tg_scope_begin();
    int val = vals[c];
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor out[1];
    CHECK_MSG(tg_jit_call_vars(j, in, 1, &b, 1, NULL, 0, out) == TG_OK, "call %d: %s", c, tg_last_error());
    if (c < 3) CHECK(tg_jit_captured_kernels(j) == 0);
    if (c >= 4) CHECK(tg_jit_captured_kernels(j) > 0);
    float o[3] = {0};
    CHECK(tg_data(out[0], o, sizeof o) == TG_OK);
    for (int r = 0; r < 3; r++) {
      double mx = -INFINITY, t = 0, a = 0;
      for (int k = 0; k < val; k++) mx = fmax(mx, xd[r * 10 + k]);
      for (int k = 0; k < val; k++) t += exp(xd[r * 10 + k] - mx);
      for (int k = 0; k < val; k++) a += exp(xd[r * 10 + k] - mx) / t * xd[r * 10 + k];
      CHECK_MSG(fabs(o[r] - a) < 1e-5, "call %d v=%d row %d: %g vs %g", c, val, r, o[r], a);
    }
    tg_scope_end();
  }
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* CPU:LLVM renders loops of variable length too: softmax and a sum over v, a symbolic arange and a
 * jitted mean/variance over changing v, each against the C renderer's result; one compile for
 * every value */
TEST(llvm_symbolic) {
  tg_scope_begin();
  float xd[60];
  for (int i = 0; i < 60; i++) xd[i] = (float)sin(i * 0.37) * 2;
  tg_tensor xc = tg_from_data(xd, TG_SHAPE(3, 20), NULL), xl = tg_to(xc, "CPU:LLVM");
  if (!tg_valid(xl) || tg_realize(xl) != TG_OK) {
    printf("  (CPU:LLVM does not open here: %s)\n", tg_last_error() ? tg_last_error() : "?");
    tg_clear_error();
    tg_scope_end();
    return;
  }
  tg_symvar v = tg_variable("v", 2, 20);
  uint64_t c0 = 0;
  for (int val = 2; val <= 20; val += 6) {
    tg_scope_begin();
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor t[2] = {xc, xl}, r[2][3];
    for (int d = 0; d < 2; d++) {
      tg_tensor xs = tg_shrink(t[d], TG_SHAPE(0, 3, 0, tg_sym(b, 0)));
      r[d][0] = tg_softmax(xs, 1);
      r[d][1] = tg_sum(tg_mul_s(xs, 2), TG_AXES(1), false);
      r[d][2] = tg_mul(xs, tg_cast(tg_arange_sym(tg_sym(b, 0), TG_OPTS(.device = d ? "CPU:LLVM" : NULL)), TG_FLOAT32));
    }
    /* the kernels (a read of a symbolic shape then copies out its part: one more per value) */
    c0 = compiles();
    CHECK(tg_realize_many(r[0], 3) == TG_OK && tg_realize_many(r[1], 3) == TG_OK);
    if (val > 2) CHECK_MSG(compiles() == c0, "v=%d compiled %llu kernels", val, (unsigned long long)(compiles() - c0));
    CHECK_MSG(maxdiff(r[1][0], r[0][0], 3 * val) < 1e-6, "softmax v=%d", val);
    CHECK_MSG(maxdiff(r[1][1], r[0][1], 3) < 1e-5, "sum v=%d", val);
    CHECK_MSG(maxdiff(r[1][2], r[0][2], 3 * val) == 0, "arange v=%d", val);
    tg_scope_end();
  }
  /* jitted on CPU:LLVM */
  tg_tensor in[1] = {xl};
  tg_jit *j = tg_jit_new(f_meanvar, 1, NULL);
  for (int call = 0; call < 5; call++) {
    tg_scope_begin();
    int val = 2 + (call * 7) % 19;
    tg_symvar b = tg_var_bind(v, val);
    tg_tensor out[1];
    CHECK_MSG(tg_jit_call_vars(j, in, 1, &b, 1, NULL, 0, out) == TG_OK, "%s", tg_last_error());
    tg_tensor xs = tg_shrink(xc, TG_SHAPE(0, 3, 0, tg_sym(b, 0)));
    tg_tensor want = tg_add(tg_mean(xs, TG_AXES(1), false), tg_mul_s(tg_var(xs, TG_AXES(1), false, 1.0), 10));
    CHECK_MSG(maxdiff(out[0], want, 3) < 1e-4, "jit v=%d: %g", val, maxdiff(out[0], want, 3));
    tg_scope_end();
  }
  CHECK(tg_jit_captured_kernels(j) > 0);
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* scans, masks and positions over a symbolic axis (tinygrad's cumsum/cumprod/triu/pad(value=) over
 * a Variable): jitted over changing v, each against the same op on the concrete [0, v) slice, one
 * capture for every value. Their positions come from a symbolic arange, not from the bound value. */
#define NSCAN 15
static const char *const scan_names[NSCAN] = {"cumsum", "cumprod", "cummax", "cummax indices", "cummin indices",
                                              "logcumsumexp", "argmax", "argmin", "triu", "tril", "pad value",
                                              "gather", "roll of a plain dim", "repeat of a plain dim",
                                              "cumsum 80 rows"};
static tg_tensor scan_op(int k, tg_tensor x) {
  tg_tensor v, ix;
  switch (k) {
  case 0: return tg_cumsum(x, 1);
  case 1: return tg_cumprod(x, 1);
  case 2: return tg_cummax(x, 1, &v, &ix) == TG_OK ? v : (tg_tensor){0};
  case 3: return tg_cummax(x, 1, &v, &ix) == TG_OK ? ix : (tg_tensor){0};
  case 4: return tg_cummin(x, 1, &v, &ix) == TG_OK ? ix : (tg_tensor){0};
  case 5: return tg_logcumsumexp(x, 1);
  case 6: return tg_argmax(x, TG_AXES(1), false);
  case 7: return tg_argmin(x, TG_AXES(1), true);
  case 8: return tg_triu(tg_unsqueeze(x, 0), 1);
  case 9: return tg_tril(tg_unsqueeze(x, 0), -1);
  case 10: return tg_pad(x, TG_SHAPE(1, 0, 2, 1), 5.0);
  case 11: return tg_gather(x, 1, tg_cast(tg_gt_s(x, 0.3), TG_INT32));
  case 12: return tg_roll(x, TG_SHAPE(1), TG_AXES(0));
  case 13: return tg_repeat(x, TG_SHAPE(2, 1));
  default: return tg_cumsum(tg_transpose(x, 0, 1), 0);
  }
}
static int scan_k;
static tg_status f_scan(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_cast(scan_op(scan_k, tg_shrink(in[0], TG_SHAPE(0, 3, 0, tg_sym(tg_jit_var(0), 0)))), TG_FLOAT64);
  return TG_OK;
}

static tg_status f_pool(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_max_pool2d(tg_unsqueeze(tg_shrink(in[0], TG_SHAPE(0, 3, 0, tg_sym(tg_jit_var(0), 0))), 0), NULL);
  return TG_OK;
}

TEST(jit_scans_over_v) {
  tg_scope_begin();
  tg_symvar v = tg_variable("v", 1, 80);
  float xd[240];
  for (int i = 0; i < 240; i++) xd[i] = (float)cos(i * 0.61) * 1.1f + (i % 7 == 0 ? 0.4f : 0.0f);
  xd[5] = xd[4]; /* a tie */
  tg_tensor in[1] = {tg_from_data(xd, TG_SHAPE(3, 80), NULL)};
  for (scan_k = 0; scan_k < NSCAN; scan_k++) {
    tg_jit *j = tg_jit_new(f_scan, 1, NULL);
    const int vals[] = {2, 5, 3, 9, 1, 17, 80, 4};
    for (int c = 0; c < 8; c++) {
      tg_scope_begin();
      int val = scan_k == NSCAN - 1 ? vals[c] * 8 % 81 : vals[c];
      tg_symvar b = tg_var_bind(v, val);
      tg_tensor out[1];
      uint64_t c0 = compiles();
      tg_status st = tg_jit_call_vars(j, in, 1, &b, 1, NULL, 0, out);
      CHECK_MSG(st == TG_OK, "%s v=%d: %s", scan_names[scan_k], val, tg_last_error());
      /* the replays compile nothing */
      if (c > 2 && val > 1) CHECK_MSG(compiles() == c0, "%s v=%d compiled again", scan_names[scan_k], val);
      tg_tensor want = tg_cast(scan_op(scan_k, tg_shrink(in[0], TG_SHAPE(0, 3, 0, val))), TG_FLOAT64);
      int64_t n = tg_numel(want);
      double *o = calloc((size_t)n + 1, sizeof(double)), *w = calloc((size_t)n + 1, sizeof(double));
      if (st == TG_OK) {
        CHECK(tg_numel(out[0]) == n);
        CHECK(tg_data(out[0], o, sizeof(double) * (size_t)n) == TG_OK && tg_data(want, w, sizeof(double) * (size_t)n) == TG_OK);
        double md = 0;
        for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(o[i] - w[i]) / (1 + fabs(w[i])));
        CHECK_MSG(md < 1e-5, "%s v=%d: off by %g", scan_names[scan_k], val, md);
      }
      free(o), free(w);
      if (c >= 2) CHECK(tg_jit_captured_kernels(j) > 0);
      tg_scope_end();
    }
    tg_jit_free(j);
  }
  /* a dim that would need two symbolic terms is refused where it is made */
  tg_symvar b = tg_var_bind(v, 2);
  tg_clear_error();
  CHECK(!tg_valid(tg_pad(in[0], TG_SHAPE(0, 0, tg_sym(b, 0), tg_sym(b, 1)), 0.0)));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_pad: dim 1 of shape (3, 80) would be a sum of 2 symbolic sizes");
  tg_clear_error();
  CHECK(!tg_valid(tg_pad(tg_shrink(in[0], TG_SHAPE(0, 3, 0, tg_sym(b, 0))), TG_SHAPE(0, 0, 0, tg_sym(b, 0)), 1.0)));
  CHECK_STR_CONTAINS(tg_last_error(), "symbolic sizes");
  tg_clear_error();
  tg_tensor xs = tg_shrink(in[0], TG_SHAPE(0, 3, 0, tg_sym(b, 0)));
  CHECK(!tg_valid(tg_roll(xs, TG_SHAPE(1), TG_AXES(1))));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_roll: dim 1 of shape (3, 2) is symbolic");
  tg_clear_error();
  CHECK(!tg_valid(tg_repeat(xs, TG_SHAPE(1, 2))));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_repeat: dim 1 of shape (3, 2) is symbolic");
  tg_clear_error();
  /* a pool's window count over a symbolic dim would come from the bound value (a replay at another
   * value would read the wrong windows): refused at every value, in the jit and outside it */
  tg_jit *j = tg_jit_new(f_pool, 1, NULL);
  for (int c = 0; c < 3; c++) {
    tg_symvar bc = tg_var_bind(v, 3 + c);
    tg_tensor out[1];
    CHECK(tg_jit_call_vars(j, in, 1, &bc, 1, NULL, 0, out) != TG_OK);
    CHECK_STR_CONTAINS(tg_last_error(), "tg_max_pool2d: windows over dim 2, a symbolic size");
    tg_clear_error();
  }
  tg_jit_free(j);
  CHECK(!tg_valid(tg_avg_pool2d(tg_unsqueeze(xs, 0), NULL)));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_avg_pool2d: windows over dim 2, a symbolic size");
  tg_clear_error();
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* a prefill: cache[:, 0:v] = x[:, 0:v] (a region of symbolic size at a plain start) written in place
 * for every v under TinyJit, through tg_assign and through tg_setitem (it went through the setitem
 * form, a mask built at the bound value, and wrote the wrong elements) */
static tg_tensor g_cache3;
static int g_prefill_setitem;
static tg_status f_prefill(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  int64_t S = tg_sym(tg_jit_var(0), 0);
  tg_tensor dst = tg_shrink(g_cache3, TG_SHAPE(0, 3, 0, S, 0, 4)), src = tg_shrink(in[0], TG_SHAPE(0, 3, 0, S, 0, 4));
  if (g_prefill_setitem ? tg_setitem(dst, NULL, 0, src) != TG_OK : !tg_valid(tg_assign(dst, src))) return TG_ERR_INVALID;
  out[0] = tg_sum(tg_shrink(g_cache3, TG_SHAPE(0, 3, 0, S, 0, 4)), TG_AXES(1), false);
  return TG_OK;
}

/* sizes a library op computes from a symbolic dim's bound value (the second part's offset in a
 * tg_cat along it, tg_chunk's piece size, interpolate's sampling positions): right for that value,
 * never replayed at another (a capture is refused; interpolate refuses the dim outright). Positions
 * counted from the end of the dim (x[-1], x[-2:], x[-3:-1]) are symbolic and replay. */
static int g_baked_op;
static tg_status f_baked(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_tensor xs = tg_shrink(in[0], TG_SHAPE(0, 1, 0, 1, 0, tg_sym(tg_jit_var(0), 0)));
  tg_tensor pieces[8];
  if (g_baked_op == 0) out[0] = tg_cat((tg_tensor[]){xs, tg_mul_s(xs, 2)}, 2, 2);
  else if (g_baked_op == 1) out[0] = tg_chunk(xs, 2, 2, pieces, 8) > 0 ? pieces[0] : (tg_tensor){0};
  else if (g_baked_op == 3) /* x[..., -2:] ends at n: symbolic positions n - 2, n (replays read x[n-2:n]) */
    out[0] = tg_contiguous(tg_getitem(xs, TG_INDEX(TG_IX_ELLIPSIS, TG_IX_FROM(-2, 1))));
  else if (g_baked_op == 4) /* x[..., -1] and x[..., -3:-1] */
    out[0] = tg_cat((tg_tensor[]){tg_getitem(xs, TG_INDEX(TG_IX_ELLIPSIS, TG_IX_INT(-1))),
                                  tg_reshape(tg_getitem(xs, TG_INDEX(TG_IX_ELLIPSIS, TG_IX_SLICE(-3, -1, 1))), TG_SHAPE(1, 2))},
                    2, 1);
  else if (g_baked_op == 6) /* x[..., 0] and x[..., :3]: positions from the start, for every n >= 3 */
    out[0] = tg_cat((tg_tensor[]){tg_getitem(xs, TG_INDEX(TG_IX_ELLIPSIS, TG_IX_INT(0))),
                                  tg_reshape(tg_getitem(xs, TG_INDEX(TG_IX_ELLIPSIS, TG_IX_SLICE(0, 3, 1))), TG_SHAPE(1, 3))},
                    2, 1);
  else if (g_baked_op == 5) /* x[..., [-1, -2]]: a tensor index wraps and range-checks by the bound value */
    out[0] = tg_contiguous(tg_getitem(xs, TG_INDEX(TG_IX_ELLIPSIS, TG_IX_TENSOR(tg_from_data((int32_t[]){-1, -2}, TG_SHAPE(2), TG_OPTS(.dtype = TG_INT32))))));
  else out[0] = tg_interpolate(xs, TG_SHAPE(5), NULL);
  return tg_valid(out[0]) ? TG_OK : TG_ERR_INVALID;
}

TEST(jit_refuses_sizes_from_bound_values) {
  tg_scope_begin();
  float xd[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  tg_tensor x = tg_from_data(xd, TG_SHAPE(1, 1, 8), NULL);
  tg_symvar v = tg_variable("v", 1, 8);
  for (g_baked_op = 0; g_baked_op < 7; g_baked_op++) {
    tg_jit *j = tg_jit_new(f_baked, 1, NULL);
    const int vals[] = {3, 5, 8, 2};
    for (int c = 0; c < 4; c++) {
      tg_scope_begin();
      tg_symvar b = tg_var_bind(v, vals[c]);
      tg_tensor out[1];
      tg_status st = tg_jit_call_vars(j, &x, 1, &b, 1, NULL, 0, out);
      if (g_baked_op == 2) {
        CHECK(st != TG_OK);
        CHECK_STR_CONTAINS(tg_last_error(), "tg_interpolate: dim 2 of shape (1, 1, ");
      } else if ((g_baked_op == 4 || g_baked_op == 6) && vals[c] == 2) {
        /* x[..., -3:-1] starts at n - 3: a replay at n = 2 would read before the dim */
        CHECK(st != TG_OK);
        CHECK_STR_CONTAINS(tg_last_error(), "below what the captured graph can use");
      } else if (c == 0 || g_baked_op == 3 || g_baked_op == 4 || g_baked_op == 6) {
        CHECK_MSG(st == TG_OK && tg_numel(out[0]) == (g_baked_op == 0 ? 2 * vals[c] : g_baked_op == 4 ? 3 : g_baked_op == 6 ? 4 : 2), "op %d v=%d: %s",
                  g_baked_op, vals[c], tg_last_error());
        float got[3] = {0}, n = (float)vals[c];
        if (g_baked_op == 3) CHECK(tg_data(out[0], got, 2 * sizeof(float)) == TG_OK && got[0] == n - 1 && got[1] == n);
        float g4[4] = {0};
        if (g_baked_op == 6)
          CHECK(tg_data(out[0], g4, sizeof g4) == TG_OK && g4[0] == 1 && g4[1] == 1 && g4[2] == 2 && g4[3] == 3);
        if (g_baked_op == 5) CHECK(tg_data(out[0], got, 2 * sizeof(float)) == TG_OK && got[0] == n && got[1] == n - 1);
        if (g_baked_op == 4)
          CHECK_MSG(tg_data(out[0], got, sizeof got) == TG_OK && got[0] == n && got[1] == n - 2 && got[2] == n - 1,
                    "v=%d: %g %g %g", vals[c], got[0], got[1], got[2]);
      } else {
        CHECK_MSG(st != TG_OK, "op %d v=%d replayed", g_baked_op, vals[c]);
        CHECK_STR_CONTAINS(tg_last_error(), "computed from its bound value");
      }
      tg_clear_error();
      tg_scope_end();
    }
    tg_jit_free(j);
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

TEST(jit_prefill_symbolic_region) {
  tg_scope_begin();
  float xd[144];
  for (int i = 0; i < 144; i++) xd[i] = (float)(i + 1);
  tg_tensor x = tg_from_data(xd, TG_SHAPE(3, 12, 4), NULL);
  tg_symvar v = tg_variable("v", 1, 11);
  for (g_prefill_setitem = 0; g_prefill_setitem < 2; g_prefill_setitem++) {
    tg_jit *j = tg_jit_new(f_prefill, 1, NULL);
    const int vals[] = {3, 5, 2, 9, 4};
    g_cache3 = tg_contiguous(tg_zeros(TG_SHAPE(3, 12, 4), NULL)); /* one cache: the capture writes its buffer */
    CHECK(tg_realize(g_cache3) == TG_OK);
    for (int c = 0; c < 5; c++) {
      tg_scope_begin();
      CHECK(tg_valid(tg_assign(g_cache3, tg_zeros(TG_SHAPE(3, 12, 4), NULL))) && tg_realize(g_cache3) == TG_OK);
      tg_symvar b = tg_var_bind(v, vals[c]);
      tg_tensor out[1];
      CHECK_MSG(tg_jit_call_vars(j, &x, 1, &b, 1, NULL, 0, out) == TG_OK, "%s", tg_last_error());
      float o[144];
      CHECK(tg_data(g_cache3, o, sizeof o) == TG_OK);
      int bad = 0;
      for (int i = 0; i < 144; i++) bad += o[i] != ((i / 4) % 12 < vals[c] ? xd[i] : 0.0f);
      CHECK_MSG(bad == 0, "%s v=%d: %d elements wrong", g_prefill_setitem ? "setitem" : "assign", vals[c], bad);
      tg_scope_end();
    }
    tg_jit_free(j);
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

static tg_status f_affine(const tg_tensor *in, int nin, const double *a, int na, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)a, (void)na, (void)nout, (void)u;
  out[0] = tg_add_s(tg_mul_s(in[0], 2), 1);
  return TG_OK;
}

/* the messages of a negative nvars, of a concrete input where a symbolic one was captured (both
 * printed as (7, 3) before), and of a symbolic size given to a creation function (its raw code) */
TEST(jit_and_creation_messages) {
  tg_scope_begin();
  tg_symvar q = tg_variable("q", 0, 16);
  tg_tensor x = tg_contiguous(tg_zeros(TG_SHAPE(16, 3), NULL));
  CHECK(tg_realize(x) == TG_OK);
  tg_jit *j = tg_jit_new(f_affine, 1, NULL);
  tg_symvar b = tg_var_bind(q, 7);
  tg_tensor in = tg_shrink(x, TG_SHAPE(0, tg_sym(b, 0), 0, 3)), o;
  for (int c = 0; c < 3; c++) CHECK(tg_jit_call_vars(j, &in, 1, &b, 1, NULL, 0, &o) == TG_OK);
  CHECK(tg_jit_call_vars(j, &in, 1, &b, -1, NULL, 0, &o) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_jit_call_vars: nvars=-1 is negative");
  tg_clear_error();
  tg_tensor y = tg_contiguous(tg_zeros(TG_SHAPE(7, 3), NULL));
  CHECK(tg_realize(y) == TG_OK);
  CHECK(tg_jit_call_vars(j, &y, 1, &b, 1, NULL, 0, &o) == TG_ERR_INVALID);
  /* (the suite runs on DEV=CL too: the device's name is not checked) */
  CHECK_STR_CONTAINS(tg_last_error(), "tg_jit_call_vars: input 0 is float (7, 3) on ");
  CHECK_STR_CONTAINS(tg_last_error(), "but was float (q, 3) on ");
  CHECK_STR_CONTAINS(tg_last_error(), "when captured (a symbolic dim");
  tg_clear_error();
  CHECK(!tg_valid(tg_zeros(TG_SHAPE(tg_sym(b, 0)), NULL)));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_zeros: dimension 0 is symbolic");
  tg_clear_error();
  tg_jit_free(j);
  tg_scope_end();
}

TEST(errors) {
  tg_scope_begin();
  tg_symvar v = tg_variable("len", 1, 10);
  tg_tensor x = seq(10, 1, 0);
  /* unbound at realize: the shape uses the max, the realize names the variable */
  tg_clear_error();
  tg_tensor y = tg_mul_s(tg_shrink(x, TG_SHAPE(0, tg_sym(v, 0))), 2);
  int64_t sh[1];
  CHECK(tg_shape(y, sh) == 1 && sh[0] == 10);
  CHECK(tg_realize(y) != TG_OK);
  CHECK_STR_CONTAINS(tg_last_error(), "variable 'len' [1, 10] is unbound");
  tg_clear_error();
  /* a symbolic start must come with a symbolic end of the same variable */
  tg_symvar b = tg_var_bind(v, 3);
  CHECK(!tg_valid(tg_shrink(x, TG_SHAPE(tg_sym(b, 0), 10))));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_shrink");
  tg_clear_error();
  /* a bound value past the tensor: the usual bounds error */
  CHECK(!tg_valid(tg_shrink(x, TG_SHAPE(0, tg_sym(b, 8)))));
  CHECK_STR_CONTAINS(tg_last_error(), "0 <= start <= end <= 10");
  tg_clear_error();
  /* an argmax over a symbolic axis that may be empty (its variable reaches 0) has no answer there */
  tg_symvar zv = tg_var_bind(tg_variable("len0", 0, 10), 3);
  CHECK(!tg_valid(tg_argmax(tg_reshape(tg_shrink(x, TG_SHAPE(0, tg_sym(zv, 0))), TG_SHAPE(1, tg_sym(zv, 0))), TG_AXES(1), false)));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_argmax: the symbolic axis 1 may be empty");
  tg_clear_error();
  /* a size that is negative at the variable's minimum (or now): an error, not a -1 read as "infer"
   * (the scheduler stopped the process on it) */
  tg_tensor six = seq(6, 1, 0);
  CHECK(!tg_valid(tg_reshape(six, TG_SHAPE(2, tg_sym(zv, -4)))));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_reshape: size 1 is len0-4, which is -4 at len0's minimum 0 (-1 now)");
  tg_clear_error();
  CHECK(!tg_valid(tg_expand(tg_reshape(six, TG_SHAPE(1, 6)), TG_SHAPE(tg_sym(zv, -1), 6))));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_expand: size 0 is len0-1, which is -1 at len0's minimum 0");
  tg_clear_error();
  CHECK(!tg_valid(tg_arange_sym(tg_sym(zv, -3), NULL)));
  CHECK_STR_CONTAINS(tg_last_error(), "it is -3 at the variable's minimum 0");
  tg_clear_error();
  /* a handle that is no variable, given to a jit call: the error names the call's argument */
  tg_jit *gj = tg_jit_new(f_window, 1, NULL);
  tg_symvar junk = {987654321};
  tg_tensor ins[2] = {x, x}, outs[1];
  CHECK(tg_jit_call_vars(gj, ins, 2, &junk, 1, NULL, 0, outs) != TG_OK);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_jit_call_vars: vars[0] is not a variable");
  tg_clear_error();
  tg_jit_free(gj);
  /* garbage that looks like a code */
  CHECK(!tg_valid(tg_reshape(x, TG_SHAPE(-((int64_t)1 << 62) - 5))));
  tg_clear_error();
  /* one variable bound to two values in one realize */
  tg_tensor z = tg_add(tg_shrink(x, TG_SHAPE(0, tg_sym(tg_var_bind(v, 4), 0))),
                       tg_shrink(tg_flip(x, TG_AXES(0)), TG_SHAPE(0, tg_sym(tg_var_bind(v, 2), 2))));
  CHECK(tg_valid(z));
  CHECK(tg_realize(z) != TG_OK);
  CHECK_STR_CONTAINS(tg_last_error(), "bound to 4 and to 2");
  tg_clear_error();
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

int main(void) { return RUN_TESTS(); }
