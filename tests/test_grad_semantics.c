/*
 * test_grad_semantics.c -- tinygrad's semantics for which tensors get gradients (the three-state
 * requires_grad), backward / gradient with an explicit upstream gradient, setitem through views and
 * its gradient, and the range of the random-number creators. The expected numbers are tinygrad's
 * (worked out by hand here: they are small).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test.h"
#include "tinygrad.h"

#define OK(x) CHECK_MSG((x) == TG_OK, "%s", tg_last_error() ? tg_last_error() : "(no error recorded)")
#define F32V(...)                                                                                            \
  f32((const float[]){__VA_ARGS__}, (int64_t)(sizeof((const float[]){__VA_ARGS__}) / sizeof(float)))
#define NONE_T ((tg_tensor){0})

static tg_tensor f32(const float *v, int64_t n) { return tg_from_data(v, &n, 1, NULL); }

/* t's values (cast to float32) against want[0..n-1], exactly or within tol */
static void check_vals(const char *file, int line, tg_tensor t, const double *want, int64_t n, double tol) {
  if (!tg_valid(t)) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL %s:%d: none tensor (%s)\n", file, line, tg_last_error() ? tg_last_error() : "");
    return;
  }
  if (tg_numel(t) != n) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL %s:%d: %lld elements, expected %lld\n", file, line, (long long)tg_numel(t),
            (long long)n);
    return;
  }
  tg_scope_begin();
  float v[64];
  if (n > 64 || tg_data(tg_cast(t, TG_FLOAT32), v, sizeof(float) * (size_t)n) != TG_OK) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL %s:%d: cannot read (%s)\n", file, line, tg_last_error() ? tg_last_error() : "");
  } else {
    for (int64_t i = 0; i < n; i++)
      if (!(fabs(v[i] - want[i]) <= tol)) {
        tt_failed_checks++;
        fprintf(stderr, "  FAIL %s:%d: [%lld] = %g, expected %g\n", file, line, (long long)i, v[i], want[i]);
      }
  }
  tg_scope_end();
}
#define CHECK_VALS(t, tol, ...)                                                                              \
  check_vals(__FILE__, __LINE__, (t), (const double[]){__VA_ARGS__},                                         \
             (int64_t)(sizeof((const double[]){__VA_ARGS__}) / sizeof(double)), (tol))

#define BEGIN_T                                                                                              \
  size_t live0 = tg_live_count();                                                                            \
  tg_clear_error();                                                                                          \
  tg_scope_begin()
#define END_T                                                                                                \
  do {                                                                                                       \
    tg_scope_end();                                                                                          \
    CHECK_MSG(tg_live_count() == live0, "live handles %zu, expected %zu", tg_live_count(), live0);           \
    CHECK_MSG(tg_last_error() == NULL, "unexpected error left: %s", tg_last_error());                        \
    tg_clear_error();                                                                                        \
  } while (0)

static tg_tensor sumall(tg_tensor t) { return tg_sum(t, TG_ALL_AXES, false); }

/* ---- which tensors get gradients ---- */

TEST(requires_grad_is_three_state) {
  BEGIN_T;
  tg_tensor x = F32V(1, 2);
  CHECK(!tg_requires_grad(x)); /* unset reads as not true */
  tg_tensor y = tg_mul_s(x, 3);
  tg_tensor z = sumall(tg_mul(y, y));
  OK(tg_backward(z));
  /* every float tensor in the graph not marked false: x, y and the loss itself */
  CHECK_VALS(tg_grad(x), 1e-5, 18, 36);
  CHECK_VALS(tg_grad(y), 1e-5, 6, 12);
  CHECK_VALS(tg_grad(z), 0, 1);
  /* marked false: no gradient, but the gradient still flows through it to x */
  tg_zero_grad(x);
  tg_tensor y2 = tg_set_requires_grad(tg_mul_s(x, 3), false);
  OK(tg_backward(sumall(tg_mul(y2, y2))));
  CHECK(tg_grad(y2).id == 0);
  CHECK_VALS(tg_grad(x), 1e-5, 18, 36);
  /* integer tensors never get one */
  tg_tensor ai = tg_arange(0, 2, 1, NULL);
  tg_zero_grad(x);
  OK(tg_backward(sumall(tg_mul(x, tg_cast(ai, TG_FLOAT32)))));
  CHECK(tg_grad(ai).id == 0);
  CHECK_VALS(tg_grad(x), 0, 0, 1);
  /* a TG_OPTS without .requires_grad is unset; .requires_grad = false marks the tensor false */
  tg_tensor u = tg_from_data((float[]){4, 5}, TG_SHAPE(2), TG_OPTS(.dtype = TG_FLOAT32));
  tg_tensor f = tg_from_data((float[]){6, 7}, TG_SHAPE(2), TG_OPTS(.requires_grad = false));
  OK(tg_backward(sumall(tg_add(tg_mul_s(u, 2), tg_mul_s(f, 3)))));
  CHECK_VALS(tg_grad(u), 0, 2, 2);
  CHECK(tg_grad(f).id == 0);
  /* everything marked false: an error naming the reason */
  tg_tensor g = tg_set_requires_grad(F32V(8, 9), false);
  tg_tensor l = tg_set_requires_grad(sumall(g), false);
  CHECK(tg_backward(l) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "requires_grad false");
  tg_clear_error();
  END_T;
}

TEST(gradient_of_clone_expand_reshaped_arange) {
  BEGIN_T;
  tg_tensor x = F32V(1, 2, 3);
  tg_tensor c = tg_clone(x), gc;
  OK(tg_gradient(sumall(tg_mul(c, c)), &c, 1, &gc));
  CHECK_VALS(gc, 1e-6, 2, 4, 6);
  tg_tensor e = tg_expand(tg_from_data((float[]){1, 2}, TG_SHAPE(1, 2), NULL), TG_SHAPE(3, 2)), ge;
  tg_tensor w = tg_cast(tg_reshape(tg_arange(0, 6, 1, NULL), TG_SHAPE(3, 2)), TG_FLOAT32);
  OK(tg_gradient(sumall(tg_mul(e, w)), &e, 1, &ge));
  CHECK_VALS(ge, 0, 0, 1, 2, 3, 4, 5);
  /* a reshape of a reshaped tensor still reaches it */
  tg_tensor a = tg_reshape(tg_arange(0, 6, 1, TG_OPTS(.dtype = TG_FLOAT32)), TG_SHAPE(2, 3)), ga;
  OK(tg_gradient(sumall(tg_mul_s(tg_reshape(a, TG_SHAPE(3, 2)), 2)), &a, 1, &ga));
  CHECK_VALS(ga, 0, 2, 2, 2, 2, 2, 2);
  /* and tg_backward fills them too */
  OK(tg_backward(sumall(tg_mul_s(tg_reshape(a, TG_SHAPE(3, 2)), 5))));
  CHECK_VALS(tg_grad(a), 0, 5, 5, 5, 5, 5, 5);
  END_T;
}

TEST(optimizer_takes_unset_tensors_as_parameters) {
  BEGIN_T;
  tg_tensor w = tg_persist(F32V(1, 2)), b = tg_persist(tg_set_requires_grad(F32V(0, 0), false));
  tg_optim *o = tg_optim_sgd((tg_tensor[]){w, b}, 2, TG_SGD_OPTS(.lr = 0.5));
  CHECK(o != NULL);
  CHECK(tg_requires_grad(w) && !tg_requires_grad(b)); /* unset became true, as tinygrad's Optimizer does */
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_scope_begin();
  OK(tg_backward(sumall(tg_mul(w, w))));
  OK(tg_optim_step(o));
  tg_scope_end();
  tg_context_end();
  CHECK_VALS(w, 1e-6, 0, 0); /* w - 0.5 * 2w */
  tg_optim_free(o);
  tg_tensor f = tg_persist(tg_set_requires_grad(F32V(1), false));
  CHECK(tg_optim_sgd(&f, 1, NULL) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "at least one param");
  tg_clear_error();
  tg_free(w), tg_free(b), tg_free(f);
  END_T;
}

/* Gradients accumulated over optimizer steps (no zero_grad): tinygrad stores the sum
 * (t.grad.assign(t.grad + g)), so each step adds the gradient at that step's parameters. SGD lr 0.1
 * on sum(p*p) from [1, 2]: tinygrad's parameters after three steps are [0.064, 0.128] (the grad's
 * earlier terms, evaluated again at the new parameters, gave [0.128, 0.256]); reading the grad
 * between the steps changes nothing. */
TEST(gradients_accumulate_across_steps_as_tinygrad) {
  BEGIN_T;
  for (int read = 0; read < 2; read++) {
    tg_tensor p = tg_persist(F32V(1, 2));
    tg_optim *o = tg_optim_sgd(&p, 1, TG_SGD_OPTS(.lr = 0.1));
    tg_context_begin();
    tg_context_set_int("TRAINING", 1);
    for (int step = 0; step < 3; step++) {
      tg_scope_begin();
      OK(tg_backward(sumall(tg_mul(p, p))));
      OK(tg_optim_step(o));
      if (read && step == 0) CHECK_VALS(tg_grad(p), 1e-6, 1.6, 3.2); /* the first grad stays lazy, as tinygrad's */
      if (read && step == 1) CHECK_VALS(tg_grad(p), 1e-6, 3.2, 6.4);
      tg_scope_end();
    }
    tg_context_end();
    CHECK_VALS(p, 1e-6, 0.064, 0.128);
    CHECK_VALS(tg_grad(p), 1e-6, 4.16, 8.32);
    tg_optim_free(o);
    tg_free(p);
  }
  END_T;
}

/* A graph built before a realized assign to a parameter (an optimizer step between forward and
 * backward) reads the parameter's buffer, and its gradient reaches the parameter as in tinygrad
 * (x.grad was left unset, and tg_gradient said x is not in the graph). Before the assign is
 * realized the tensor is the pending write, which the graph does not hold (tinygrad: None too). */
TEST(gradient_reaches_a_parameter_written_after_the_graph) {
  BEGIN_T;
  tg_tensor x = tg_persist(tg_set_requires_grad(F32V(1, 2, 3), true));
  OK(tg_realize(x));
  tg_tensor y = tg_mul_s(x, 1.0);
  OK(tg_realize(tg_assign(x, F32V(4, 5, 6))));
  tg_tensor l = sumall(tg_mul(y, y));
  tg_tensor g;
  OK(tg_gradient(l, &x, 1, &g));
  CHECK_VALS(g, 1e-6, 8, 10, 12);
  OK(tg_backward(l));
  CHECK_VALS(tg_grad(x), 1e-6, 8, 10, 12);
  /* the parameter read both before and after the write: the two paths add up */
  tg_tensor x0 = tg_mul_s(x, 1.0);
  OK(tg_realize(tg_assign(x, F32V(1, 1, 1))));
  tg_tensor g2;
  OK(tg_gradient(sumall(tg_mul(x0, x)), &x, 1, &g2));
  CHECK_VALS(g2, 1e-6, 2, 2, 2);
  tg_free(x);
  END_T;
}

/* A lazy leaf (tg_ones, tg_randn) realized after a graph was built from it: the graph holds the
 * computation it came from and the handle its buffer, and the gradient still finds it, as in tinygrad
 * (x = Tensor.ones(3); x.requires_grad = True; y = (x*2).sum(); x.realize(); y.backward() gives 2s).
 * Read through both (built before and after the realize), the two paths add up; a computed tensor
 * realized after the loss was built gets its gradient once, and the leaf beneath it its own. */
TEST(gradient_reaches_a_leaf_realized_after_the_graph) {
  BEGIN_T;
  tg_tensor x = tg_set_requires_grad(tg_ones(TG_SHAPE(3), NULL), true);
  tg_tensor z = sumall(tg_mul_s(x, 2));
  OK(tg_realize(x));
  OK(tg_backward(z));
  CHECK_VALS(tg_grad(x), 0, 2, 2, 2);
  tg_zero_grad(x);
  tg_tensor x2 = tg_set_requires_grad(tg_randn(TG_SHAPE(3), NULL), true);
  tg_tensor z2 = sumall(tg_mul_s(x2, 2));
  OK(tg_realize(x2));
  OK(tg_backward(tg_add(z2, sumall(tg_mul_s(x2, 5)))));
  CHECK_VALS(tg_grad(x2), 0, 7, 7, 7);
  tg_tensor h = tg_mul_s(x, 2);
  tg_tensor l = sumall(tg_mul_s(h, 3));
  OK(tg_realize(h));
  OK(tg_backward(tg_add(l, sumall(h))));
  CHECK_VALS(tg_grad(h), 0, 4, 4, 4);
  CHECK_VALS(tg_grad(x), 0, 8, 8, 8);
  END_T;
}

/* Equal creations are one hash-consed node; as leaves they are different tensors, as in tinygrad: two
 * lazy tg_zeros(3) marked requires_grad each take only their own gradient (both took the sum), and a
 * lazy tg_ones(3) takes none from a tg_randn(3)'s backward (its threefry reads a ones of that shape). */
TEST(equal_creations_are_different_leaves) {
  BEGIN_T;
  tg_tensor a = tg_set_requires_grad(tg_zeros(TG_SHAPE(3), NULL), true);
  tg_tensor b = tg_set_requires_grad(tg_zeros(TG_SHAPE(3), NULL), true);
  OK(tg_backward(sumall(tg_mul_s(b, 2))));
  CHECK(!tg_valid(tg_grad(a)));
  CHECK_VALS(tg_grad(b), 0, 2, 2, 2);
  OK(tg_backward(tg_add(sumall(tg_mul_s(a, 3)), sumall(b))));
  CHECK_VALS(tg_grad(a), 0, 3, 3, 3);
  CHECK_VALS(tg_grad(b), 0, 3, 3, 3);
  tg_tensor x = tg_set_requires_grad(tg_ones(TG_SHAPE(3), NULL), true);
  tg_tensor r = tg_set_requires_grad(tg_randn(TG_SHAPE(3), NULL), true);
  OK(tg_backward(sumall(tg_mul_s(r, 2))));
  CHECK(!tg_valid(tg_grad(x)));
  CHECK_VALS(tg_grad(r), 0, 2, 2, 2);
  END_T;
}

/* An infinite gradient stays where it belongs, as in tinygrad and PyTorch: the backward of a tensor
 * index puts it in the rows that were read only (a one-hot product made 0 * inf = nan in every other
 * row), and sigmoid's and tanh's backward pass it on as inf for negative x too (their two composed
 * paths made inf - inf) */
TEST(infinite_gradients_stay_in_place) {
  BEGIN_T;
  tg_tensor x = tg_set_requires_grad(tg_from_data((const float[]){1, 2, 3, 4, 5, 6}, TG_SHAPE(2, 3), NULL), true);
  tg_tensor rows = tg_index(x, tg_from_data((const int32_t[]){1}, TG_SHAPE(1), TG_OPTS(.dtype = TG_INT32)));
  OK(tg_backward(sumall(tg_mul(rows, tg_from_data((const float[]){INFINITY, 1, 1}, TG_SHAPE(1, 3), NULL)))));
  float g[7];
  OK(tg_data(tg_grad(x), g, 6 * sizeof(float)));
  CHECK_MSG(g[0] == 0 && g[1] == 0 && g[2] == 0 && isinf(g[3]) && g[3] > 0 && g[4] == 1 && g[5] == 1,
            "index: %g %g %g / %g %g %g", g[0], g[1], g[2], g[3], g[4], g[5]);
  for (int f = 0; f < 2; f++) {
    tg_tensor v = tg_set_requires_grad(F32V(-3, -0.7f, -0.1f, 0, 0.1f, 0.5f, 3), true);
    OK(tg_backward_with_grad(f ? tg_tanh(v) : tg_sigmoid(v), tg_full(TG_SHAPE(7), INFINITY, NULL)));
    OK(tg_data(tg_grad(v), g, sizeof g));
    for (int i = 0; i < 7; i++) CHECK_MSG(isinf(g[i]) && g[i] > 0, "%s: [%d] = %g", f ? "tanh" : "sigmoid", i, g[i]);
  }
  END_T;
}

/* A creation marked requires_grad gets a buffer no other node reads: not its creation node's own
 * realization (equal creations made later read that: a scatter's identity constant became the
 * leaf), nor a view of an earlier, realized creation (tg_ones(3, 1) expands the (1, 1) one made
 * before). y = 2a + 0.5, z = scatter_reduce(y, 0, arange, y, prod, include_self false) is y: d sum(z) /
 * da = 2 every time (it was 4.5 once a tg_ones(1, 1) leaf had been made and realized). */
static double scatter_prod_grad(int64_t n, bool lazy, bool realize_z) {
  tg_scope_begin();
  static const float one[3] = {1, 1, 1}, two[3] = {2, 2, 2}, half[3] = {0.5f, 0.5f, 0.5f};
  static const int32_t iv[3] = {0, 1, 2};
  int64_t sh[2] = {n, 1};
  tg_tensor a = lazy ? tg_ones(sh, 2, NULL) : tg_from_data(one, sh, 2, NULL);
  tg_set_requires_grad(a, true);
  tg_tensor y = tg_add(tg_mul(a, tg_from_data(two, sh, 2, NULL)), tg_from_data(half, sh, 2, NULL));
  tg_tensor z = tg_scatter_reduce(y, 0, tg_from_data(iv, sh, 2, TG_OPTS(.dtype = TG_INT32)), y, TG_SCATTER_PROD, false);
  if (realize_z) tg_realize(z);
  double g = NAN;
  if (tg_backward(sumall(z)) == TG_OK) tg_item(tg_sum(tg_grad(a), TG_ALL_AXES, false), &g);
  tg_scope_end();
  return g / (double)n;
}
TEST(creation_leaves_read_no_shared_buffer) {
  BEGIN_T;
  CHECK_CLOSE(scatter_prod_grad(1, false, true), 2.0, 1e-6);
  CHECK_CLOSE(scatter_prod_grad(1, true, false), 2.0, 1e-6);
  CHECK_CLOSE(scatter_prod_grad(3, true, false), 2.0, 1e-6);
  CHECK_CLOSE(scatter_prod_grad(3, true, true), 2.0, 1e-6);
  END_T;
}

TEST(state_dict_aliases_take_no_gradient) {
  BEGIN_T;
  /* a dict entry is a second handle of the model's tensor: repeated backward passes must not pile
   * gradients onto it, and the parameters it lists are the owners' handles */
  tg_tensor w = tg_persist(F32V(1, 2));
  tg_state_dict *sd = tg_state_dict_new();
  OK(tg_state_dict_set(sd, "w", w));
  for (int k = 0; k < 3; k++) {
    tg_scope_begin();
    OK(tg_backward(sumall(tg_mul(w, w))));
    tg_scope_end();
  }
  CHECK(tg_grad(tg_state_dict_get(sd, "w")).id == 0);
  CHECK_VALS(tg_grad(w), 1e-6, 6, 12); /* accumulated over the three passes */
  tg_tensor p[2];
  CHECK(tg_state_dict_parameters(sd, true, p, 2) == 1 && p[0].id == w.id);
  tg_state_dict_free(sd);
  tg_free(w);
  END_T;
}

/* ---- an explicit upstream gradient ---- */

TEST(backward_and_gradient_with_an_upstream_gradient) {
  BEGIN_T;
  tg_tensor x = F32V(1, 2, 3);
  tg_tensor y = tg_mul(x, x);
  OK(tg_backward_with_grad(y, F32V(1, 10, 100)));
  CHECK_VALS(tg_grad(x), 1e-4, 2, 40, 600);
  CHECK_VALS(tg_grad(y), 0, 1, 10, 100); /* y itself is in the graph */
  tg_tensor gx;
  OK(tg_gradient_with_grad(y, F32V(1, 0.5, 2), &x, 1, &gx));
  CHECK_VALS(gx, 1e-5, 2, 2, 12);
  /* a 2-d output, an integer upstream gradient cast to the output's dtype */
  tg_tensor m = tg_from_data((float[]){1, 2, 3, 4}, TG_SHAPE(2, 2), NULL);
  tg_tensor up = tg_from_data((int32_t[]){1, 0, 0, 2}, TG_SHAPE(2, 2), TG_OPTS(.dtype = TG_INT32)), gm;
  OK(tg_gradient_with_grad(tg_exp(m), up, &m, 1, &gm));
  CHECK_VALS(gm, 1e-4, exp(1.0), 0, 0, 2 * exp(4.0));
  /* {0} upstream is the plain scalar form */
  tg_tensor s = sumall(y), gs;
  OK(tg_gradient_with_grad(s, NONE_T, &x, 1, &gs));
  CHECK_VALS(gs, 1e-6, 2, 4, 6);
  /* errors: shape mismatch, a non-scalar without one (the hint names the _with_grad forms) */
  CHECK(tg_backward_with_grad(y, F32V(1, 2)) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_backward_with_grad", "(2,)", "(3,)");
  CHECK(tg_gradient(y, &x, 1, &gx) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_gradient", "not a scalar", "tg_gradient_with_grad");
  CHECK(tg_backward_with_grad(tg_cast(y, TG_INT32), tg_ones(TG_SHAPE(3), TG_OPTS(.dtype = TG_INT32))) ==
        TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_backward_with_grad", "float");
  END_T;
}

/* ---- setitem through views, and its gradient ---- */

static tg_tensor realized_zeros33(void) {
  tg_tensor t = tg_contiguous(tg_zeros(TG_SHAPE(3, 3), NULL));
  if (tg_realize(t) != TG_OK) return NONE_T;
  return t;
}

TEST(setitem_through_a_view_writes_the_base) {
  BEGIN_T;
  /* t.T[1, 0] = 5 */
  tg_tensor t = realized_zeros33();
  tg_tensor tt = tg_transpose(t, 0, 1);
  OK(tg_setitem_s(tt, TG_INDEX(TG_IX_INT(1), TG_IX_INT(0)), 5));
  CHECK_VALS(t, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0);
  CHECK_VALS(tt, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0); /* the view shows it too */
  /* t[::-1][0] = 5 */
  t = realized_zeros33();
  OK(tg_setitem_s(tg_getitem(t, TG_INDEX(TG_IX_STEP(-1))), TG_INDEX(TG_IX_INT(0)), 5));
  CHECK_VALS(t, 0, 0, 0, 0, 0, 0, 0, 5, 5, 5);
  /* t[1][2] = 5, with a tensor value */
  t = realized_zeros33();
  OK(tg_setitem(tg_getitem(t, TG_INDEX(TG_IX_INT(1))), TG_INDEX(TG_IX_INT(2)), tg_scalar(5, NULL)));
  CHECK_VALS(t, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0);
  /* t[:3] *= 10 on a realized tensor: the view is read before the write lands */
  tg_tensor a = tg_contiguous(tg_cast(tg_arange(0, 5, 1, NULL), TG_FLOAT32));
  OK(tg_realize(a));
  tg_tensor v = tg_getitem(a, TG_INDEX(TG_IX_TO(3, 1)));
  OK(tg_setitem(v, TG_INDEX(TG_IX_ALL), tg_mul_s(v, 10)));
  CHECK_VALS(a, 0, 0, 10, 20, 3, 4);
  /* a strided, padded and reshaped view; other handles of the base see the write */
  tg_tensor b = tg_contiguous(tg_zeros(TG_SHAPE(6), NULL));
  OK(tg_realize(b));
  tg_tensor b2 = tg_reshape(b, TG_SHAPE(6)); /* same node: another handle of the base */
  tg_tensor w = tg_reshape(tg_getitem(b, TG_INDEX(TG_IX_STEP(2))), TG_SHAPE(3, 1));
  OK(tg_setitem_s(w, TG_INDEX(TG_IX_SLICE(1, 3, 1)), 7));
  CHECK_VALS(b2, 0, 0, 0, 7, 0, 7, 0);
  tg_tensor pd = tg_pad(b, (const int64_t[]){1, 1}, 2, 0.0);
  OK(tg_setitem_s(pd, TG_INDEX(TG_IX_SLICE(0, 2, 1)), 9)); /* [0] is padding: only b[0] is written */
  CHECK_VALS(b, 0, 9, 0, 7, 0, 7, 0);
  /* tg_assign into a view writes the base too (tinygrad's view assign) */
  tg_tensor c = realized_zeros33();
  tg_tensor col = tg_getitem(c, TG_INDEX(TG_IX_ALL, TG_IX_INT(2)));
  CHECK(tg_assign(col, F32V(1, 2, 3)).id == col.id);
  CHECK_VALS(c, 0, 0, 0, 1, 0, 0, 2, 0, 0, 3);
  /* an expanded view shares elements: refused with a hint */
  tg_tensor e = tg_expand(tg_reshape(b, TG_SHAPE(1, 6)), TG_SHAPE(2, 6));
  CHECK(tg_setitem_s(e, TG_INDEX(TG_IX_INT(0)), 1) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_setitem_s", "expanded");
  /* a view of a lazy tensor (no storage yet) changes only the view, as in tinygrad */
  tg_tensor z = tg_zeros(TG_SHAPE(3, 3), NULL);
  tg_tensor zt = tg_transpose(z, 0, 1);
  OK(tg_setitem_s(zt, TG_INDEX(TG_IX_INT(1), TG_IX_INT(0)), 5));
  CHECK_VALS(zt, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0);
  CHECK_VALS(z, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  END_T;
}

TEST(setitem_is_differentiable) {
  BEGIN_T;
  /* y = x * 2 (lazy: no storage); y[1:3] = v * 2; loss = sum(y * [1, 2, 3, 4]) */
  tg_tensor x = F32V(1, 2, 3, 4), v = F32V(10, 20);
  tg_tensor y = tg_mul_s(x, 2);
  OK(tg_setitem(y, TG_INDEX(TG_IX_SLICE(1, 3, 1)), tg_mul_s(v, 2)));
  tg_tensor l = sumall(tg_mul(y, F32V(1, 2, 3, 4)));
  tg_tensor g[2];
  OK(tg_gradient(l, (tg_tensor[]){x, v}, 2, g));
  CHECK_VALS(y, 0, 2, 20, 40, 8);  /* (read after: a realized unset tensor keeps no graph, as tinygrad's) */
  CHECK_VALS(g[0], 0, 2, 0, 0, 8); /* the overwritten part of x gets nothing */
  CHECK_VALS(g[1], 0, 4, 6);
  /* a scalar write, and tg_backward */
  tg_tensor y2 = tg_mul_s(x, 2);
  OK(tg_setitem_s(y2, TG_INDEX(TG_IX_INT(1)), 7));
  OK(tg_backward(sumall(tg_mul(y2, y2))));
  CHECK_VALS(tg_grad(x), 1e-5, 8, 0, 24, 32);
  /* advanced indices too */
  tg_tensor y3 = tg_mul_s(x, 2),
            idx = tg_from_data((int32_t[]){3, 0}, TG_SHAPE(2), TG_OPTS(.dtype = TG_INT32)), g3[2];
  OK(tg_setitem(y3, TG_INDEX(TG_IX_TENSOR(idx)), tg_mul_s(v, 3)));
  OK(tg_gradient(sumall(tg_mul(y3, F32V(1, 2, 3, 4))), (tg_tensor[]){x, v}, 2, g3));
  CHECK_VALS(g3[0], 0, 0, 4, 6, 0);
  CHECK_VALS(g3[1], 0, 12, 3);
  END_T;
}

/* ---- random numbers ---- */

TEST(rand_is_below_one_in_every_float_dtype) {
  BEGIN_T;
  const tg_dtype dts[] = {TG_FLOAT16, TG_BFLOAT16, TG_FLOAT32, TG_FLOAT64};
  for (int k = 0; k < 4; k++) {
    tg_scope_begin();
    tg_manual_seed(0);
    tg_tensor r = tg_rand(TG_SHAPE(2, 128, 128), TG_OPTS(.dtype = dts[k]));
    double mx = -1, mn = 2, mean = 0;
    OK(tg_item(tg_max(r, TG_ALL_AXES, false), &mx));
    OK(tg_item(tg_min(r, TG_ALL_AXES, false), &mn));
    OK(tg_item(tg_mean(tg_cast(r, TG_FLOAT32), TG_ALL_AXES, false), &mean));
    CHECK_MSG(mx < 1 && mn >= 0, "%s: range [%g, %g]", tg_dtype_name(dts[k]), mn, mx);
    CHECK_MSG(fabs(mean - 0.5) < 0.01, "%s: mean %g", tg_dtype_name(dts[k]), mean);
    /* the largest value is the dtype's largest below 1 (or close): the top of the range is used */
    CHECK_MSG(mx > 0.99, "%s: max %g", tg_dtype_name(dts[k]), mx);
    tg_scope_end();
  }
  END_T;
}

TEST(randn_with_an_integer_dtype_casts) {
  BEGIN_T;
  tg_manual_seed(3);
  tg_tensor f = tg_randn(TG_SHAPE(1000), NULL);
  tg_manual_seed(3);
  tg_tensor i = tg_randn(TG_SHAPE(1000), TG_OPTS(.dtype = TG_INT32));
  CHECK(tg_dtype_of(i) == TG_INT32);
  /* the same draws, truncated toward zero */
  double diff = -1;
  OK(tg_item(tg_max(tg_abs(tg_sub(tg_cast(tg_cast(f, TG_INT32), TG_FLOAT32), tg_cast(i, TG_FLOAT32))),
                    TG_ALL_AXES, false),
             &diff));
  CHECK(diff == 0);
  tg_tensor il = tg_randn_like(tg_zeros(TG_SHAPE(4), TG_OPTS(.dtype = TG_INT16)), NULL);
  CHECK(tg_dtype_of(il) == TG_INT16);
  OK(tg_realize(il));
  /* rand itself stays float-only, as tinygrad's */
  CHECK(tg_rand(TG_SHAPE(2), TG_OPTS(.dtype = TG_INT32)).id == 0);
  CHECK_STR_CONTAINS(tg_last_error(), "not a float dtype");
  tg_clear_error();
  END_T;
}

TEST(abs_clears_the_sign_bit_and_its_gradient_is_sign) {
  BEGIN_T;
  /* float32, float16 and bfloat16 take |x| as the sign bit cleared (with a gradient of its own):
   * values and gradients as tinygrad's x * sign(x), with -0 -> +0 and nan kept */
  const tg_dtype dts[] = {TG_FLOAT32, TG_FLOAT16, TG_BFLOAT16, TG_FLOAT64};
  for (int k = 0; k < 4; k++) {
    tg_scope_begin();
    tg_tensor x = tg_set_requires_grad(tg_cast(F32V(-2, -0.0f, 0, 3, NAN, INFINITY, -INFINITY, -0.5f), dts[k]), true);
    OK(tg_realize(x));
    tg_tensor y = tg_abs(x);
    CHECK(tg_dtype_of(y) == dts[k]);
    OK(tg_backward(tg_sum(tg_mul(y, tg_arange(1, 9, 1, TG_OPTS(.dtype = dts[k]))), TG_ALL_AXES, false)));
    float v[8], g[8];
    OK(tg_data(tg_cast(y, TG_FLOAT32), v, sizeof v));
    OK(tg_data(tg_cast(tg_grad(x), TG_FLOAT32), g, sizeof g));
    const float wv[8] = {2, 0, 0, 3, NAN, INFINITY, INFINITY, 0.5f}, wg[8] = {-1, 0, 0, 4, 0, 6, -7, -8};
    for (int i = 0; i < 8; i++) {
      CHECK_MSG(i == 4 ? isnan(v[i]) : v[i] == wv[i] && !signbit(v[i]), "%s: |x|[%d] = %g", tg_dtype_name(dts[k]), i, v[i]);
      CHECK_MSG(g[i] == wg[i], "%s: grad[%d] = %g, expected %g", tg_dtype_name(dts[k]), i, g[i], wg[i]);
    }
    tg_scope_end();
  }
  END_T;
}

/* The gradient of a broadcast (a bias added over a batch) sums a narrow float in float32 and rounds
 * once, as tg_sum does: summed in bfloat16, 10^4 terms of about 1 came out 10% off */
TEST(broadcast_gradient_of_a_narrow_float_sums_in_float32) {
  BEGIN_T;
  enum { N = 3 * 57 * 59 };
  static float gv[N];
  double exact = 0;
  uint32_t st = 7;
  for (int i = 0; i < N; i++) {
    st = st * 1664525u + 1013904223u;
    gv[i] = (float)(st >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
  }
  const tg_dtype dts[] = {TG_BFLOAT16, TG_FLOAT16};
  for (int k = 0; k < 2; k++) {
    tg_scope_begin();
    tg_tensor g = tg_cast(tg_from_data(gv, TG_SHAPE(3, 1, 57, 59), NULL), dts[k]);
    float gq[N];
    OK(tg_data(tg_cast(g, TG_FLOAT32), gq, sizeof gq));
    exact = 0;
    for (int i = 0; i < N; i++) exact += gq[i];
    tg_tensor b = tg_set_requires_grad(tg_zeros(TG_SHAPE(1), TG_OPTS(.dtype = dts[k])), true);
    tg_tensor y = tg_add(tg_zeros(TG_SHAPE(3, 1, 57, 59), TG_OPTS(.dtype = dts[k])), tg_reshape(b, TG_SHAPE(1, 1, 1, 1)));
    OK(tg_backward_with_grad(y, g));
    float got;
    OK(tg_data(tg_cast(tg_grad(b), TG_FLOAT32), &got, sizeof got));
    /* within one rounding of the exact sum: half an ulp of the dtype at its magnitude */
    double ulp = ldexp(1.0, (int)floor(log2(fabs(exact))) - (dts[k] == TG_BFLOAT16 ? 7 : 10));
    CHECK_MSG(fabs(got - exact) <= 0.5 * ulp + 1e-9, "%s: bias gradient %.6g, exact sum %.6g", tg_dtype_name(dts[k]), got, exact);
    tg_scope_end();
  }
  END_T;
}

/* A convolution of an integer input (uint8 images) with a float weight: the weight still gets its
 * gradient (the channels-last form reads a detached weight and relies on its custom backward, which
 * a check on the input's dtype had skipped: beautiful_mnist's first layer lost its gradient) */
TEST(conv_of_integer_input_gives_the_weight_a_gradient) {
  BEGIN_T;
  uint8_t xv[2 * 3 * 7 * 7];
  for (int i = 0; i < (int)sizeof xv; i++) xv[i] = (uint8_t)(i * 37 % 251);
  tg_tensor x = tg_from_data(xv, TG_SHAPE(2, 3, 7, 7), TG_OPTS(.dtype = TG_UINT8));
  tg_tensor w = tg_set_requires_grad(tg_ones(TG_SHAPE(16, 3, 3, 3), NULL), true);
  OK(tg_realize(w));
  OK(tg_backward(tg_sum(tg_conv2d(x, w, (tg_tensor){0}, NULL), TG_ALL_AXES, false)));
  CHECK(tg_valid(tg_grad(w)));
  float g[16 * 27];
  OK(tg_data(tg_grad(w), g, sizeof g));
  /* d sum / d w[o][c][i][j] = the sum of x[n][c][i:i+5][j:j+5] over n, for every o */
  for (int c = 0; c < 3; c++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) {
        double want = 0;
        for (int n = 0; n < 2; n++)
          for (int y = 0; y < 5; y++)
            for (int z = 0; z < 5; z++) want += xv[((n * 3 + c) * 7 + i + y) * 7 + j + z];
        for (int o = 0; o < 16; o += 5) CHECK_MSG(g[o * 27 + c * 9 + i * 3 + j] == want, "grad[%d][%d][%d][%d] %g, want %g", o, c, i, j, g[o * 27 + c * 9 + i * 3 + j], want);
      }
  END_T;
}

int main(void) { return RUN_TESTS(); }
