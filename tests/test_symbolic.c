/*
 * test_symbolic.c -- the index simplifier (src/uop/uop.c): floor division and modulo of affine
 * index expressions by constants must fold to expressions that evaluate to the same value at every
 * point of the loop ranges, and the folds that remove a division must happen.
 */
#include "test.h"
#include "uop/uop.h"

/* evaluates an index expression with range axis i set to v[i] */
static int64_t ev(const UOp *u, const int64_t *v) {
  switch (u->op) {
  case OP_CONST: return u->arg.i;
  case OP_RANGE: return v[u->arg.i];
  case OP_ADD: return ev(u->src[0], v) + ev(u->src[1], v);
  case OP_MUL: return ev(u->src[0], v) * ev(u->src[1], v);
  case OP_IDIV: return ev(u->src[0], v) / ev(u->src[1], v);
  case OP_MOD: return ev(u->src[0], v) % ev(u->src[1], v);
  default: return INT64_MIN;
  }
}

static bool has_op(const UOp *u, int op) {
  if (u->op == op) return true;
  for (uint32_t i = 0; i < u->nsrc; i++)
    if (has_op(u->src[i], op)) return true;
  return false;
}

/* x = k0*r0 + k1*r1 + c over r0 < n0, r1 < n1: x // d and x % d against plain arithmetic */
static int check_affine(int64_t k0, int64_t n0, int64_t k1, int64_t n1, int64_t c, int64_t d) {
  UOp *r0 = s_range(0, n0), *r1 = s_range(1, n1);
  UOp *t0 = s_mulc(r0, k0), *t1 = s_mulc(r1, k1), *s = s_add(t0, t1), *x = s_addc(s, c);
  UOp *q = s_divc(x, d), *m = s_modc(x, d);
  int bad = 0;
  for (int64_t a = 0; a < n0; a++)
    for (int64_t b = 0; b < n1; b++) {
      int64_t v[2] = {a, b}, xv = k0 * a + k1 * b + c;
      if (ev(q, v) != xv / d || ev(m, v) != xv % d) bad++;
    }
  uop_unref(r0), uop_unref(r1), uop_unref(t0), uop_unref(t1), uop_unref(s), uop_unref(x), uop_unref(q), uop_unref(m);
  return bad;
}

TEST(divmod_values) {
  static const int64_t cases[][6] = {
      {20, 20, 1, 20, 0, 40}, {20, 20, 1, 20, 0, 20}, {20, 7, 1, 20, 5, 40}, {32, 9, 1, 32, 0, 64},
      {6, 10, 1, 6, 0, 12},   {6, 10, 1, 7, 0, 12},   {4, 5, 2, 2, 1, 8},   {24, 24, 1, 24, 3, 48},
      {3, 11, 5, 13, 2, 7},   {12, 6, 3, 4, 0, 36},   {10, 10, 1, 10, 0, 100}, {40, 3, 1, 40, 0, 80},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int64_t *k = cases[i];
    int bad = check_affine(k[0], k[1], k[2], k[3], k[4], k[5]);
    CHECK_MSG(bad == 0, "(%lld*a + %lld*b + %lld) divmod %lld: %d wrong points", (long long)k[0], (long long)k[2],
              (long long)k[4], (long long)k[5], bad);
  }
}

/* (20*y + x) // 40 with x < 20 is y // 2, and (20*y + x) % 40 is 20*(y % 2) + x: no division of
 * the whole sum is left (pooling windows of a row-major image produce these) */
TEST(divmod_splits_multiple) {
  UOp *y = s_range(0, 20), *x = s_range(1, 20);
  UOp *t = s_mulc(y, 20), *s = s_add(t, x);
  UOp *q = s_divc(s, 40), *want = s_divc(y, 2);
  CHECK(q == want);
  UOp *m = s_modc(s, 40);
  CHECK(!has_op(m, OP_IDIV));
  CHECK(m->src[0] != s);
  uop_unref(y), uop_unref(x), uop_unref(t), uop_unref(s), uop_unref(q), uop_unref(want), uop_unref(m);
}

int main(void) { return RUN_TESTS(); }
