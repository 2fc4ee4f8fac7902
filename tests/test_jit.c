/* test_jit.c -- TinyJit capture/replay, its error cases, and autograd basics. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>

#include "test.h"

static tg_status f_affine(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)nout, (void)u;
  double k = nargs ? args[0] : 1.0;
  out[0] = tg_sum(tg_relu(tg_add(tg_mul_s(in[0], k), in[1])), TG_AXES(1), false);
  return TG_OK;
}

static tg_status f_rand(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_add(in[0], tg_rand(TG_SHAPE(8), NULL));
  return TG_OK;
}

static tg_status f_assign_in(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_assign(in[0], tg_add_s(in[0], 1));
  out[0] = tg_mul_s(in[0], 2);
  return TG_OK;
}

/* two materialized 4 MB intermediates between a 4 KB input and a 4-byte output */
static tg_status f_big_middle(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_tensor big = tg_contiguous(tg_add_s(tg_expand(tg_reshape(in[0], TG_SHAPE(1, 1024)), TG_SHAPE(1024, 1024)), 1));
  tg_tensor flipped = tg_contiguous(tg_mul(tg_flip(big, TG_AXES(0)), big));
  out[0] = tg_sum(flipped, NULL, 0, false);
  return TG_OK;
}

static tg_tensor mk(float base, int n) {
  float d[64];
  for (int i = 0; i < n; i++) d[i] = base + (float)(i % 7) - 3.0f;
  return tg_from_data(d, TG_SHAPE(4, n / 4), NULL);
}

TEST(jit_holds_no_intermediates) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_jit *j = tg_jit_new(f_big_middle, 1, NULL);
  float v[1024];
  for (int i = 0; i < 1024; i++) v[i] = (float)(i % 5) * 0.25f;
  tg_tensor x = tg_from_data(v, TG_SHAPE(1024), NULL);
  CHECK(tg_realize(x) == TG_OK);
  uint64_t base = tg_global_counters().mem_used;
  double want = 0;
  for (int i = 0; i < 1024; i++) want += 1024.0 * (v[i] + 1) * (v[i] + 1);
  for (int it = 0; it < 4; it++) {
    tg_scope_begin();
    tg_tensor out;
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
    double got = 0;
    CHECK(tg_item(out, &got) == TG_OK);
    CHECK_CLOSE(got, want, 1e-4 * want);
    /* between calls (capture included) only the output is held: the 8 MB of intermediates live
     * while a call runs, not for as long as the capture */
    uint64_t held = tg_global_counters().mem_used - base;
    CHECK_MSG(held < 4096, "call %d: %llu bytes held after the call", it, (unsigned long long)held);
    tg_scope_end();
  }
  CHECK(tg_jit_captured_kernels(j) >= 2);
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

TEST(jit_replay_matches_eager) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_jit *j = tg_jit_new(f_affine, 1, NULL);
  double k = 3.0;
  for (int it = 0; it < 5; it++) {
    tg_tensor in[2] = {mk((float)it, 16), mk(-(float)it, 16)};
    tg_tensor out;
    CHECK(tg_jit_call(j, in, 2, &k, 1, &out) == TG_OK);
    float got[4], want[4];
    CHECK(tg_data(out, got, sizeof got) == TG_OK);
    tg_tensor e = tg_sum(tg_relu(tg_add(tg_mul_s(in[0], k), in[1])), TG_AXES(1), false);
    CHECK(tg_data(e, want, sizeof want) == TG_OK);
    for (int i = 0; i < 4; i++) CHECK_CLOSE(got[i], want[i], 1e-6);
    if (it >= 2) CHECK(tg_jit_captured_kernels(j) >= 1);
  }
  /* replays run only the captured kernels */
  tg_tensor in[2] = {mk(9, 16), mk(1, 16)};
  tg_global_counters_reset();
  tg_tensor out;
  CHECK(tg_jit_call(j, in, 2, &k, 1, &out) == TG_OK);
  CHECK(tg_global_counters().kernel_count == (uint64_t)tg_jit_captured_kernels(j));
  CHECK(tg_global_counters().compile_count == 0);
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

TEST(jit_divergence_errors) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_jit *j = tg_jit_new(f_affine, 1, NULL);
  double k = 2.0;
  tg_tensor out;
  /* an input that is a view (or not realized) is refused from the first call on (the first call
   * took it, and the second refused it) */
  tg_tensor view_in[2] = {tg_transpose(mk(1, 16), 0, 1), mk(2, 16)};
  CHECK(tg_jit_call(j, view_in, 2, &k, 1, &out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "input 0 is not realized (or is a view)");
  tg_clear_error();
  for (int it = 0; it < 2; it++) {
    tg_tensor in[2] = {mk(1, 16), mk(2, 16)};
    CHECK(tg_jit_call(j, in, 2, &k, 1, &out) == TG_OK);
  }
  tg_tensor good[2] = {mk(1, 16), mk(2, 16)};
  /* changed shape */
  tg_tensor bad_shape[2] = {mk(1, 32), mk(2, 32)};
  CHECK(tg_jit_call(j, bad_shape, 2, &k, 1, &out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "input 0");
  tg_clear_error();
  /* changed dtype */
  tg_tensor bad_dt[2] = {tg_contiguous(tg_cast(good[0], TG_FLOAT64)), good[1]};
  tg_realize(bad_dt[0]);
  CHECK(tg_jit_call(j, bad_dt, 2, &k, 1, &out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "double");
  tg_clear_error();
  /* changed device */
  tg_tensor bad_dev[2] = {tg_to(good[0], "CPU:1"), good[1]};
  tg_realize(bad_dev[0]);
  CHECK(tg_jit_call(j, bad_dev, 2, &k, 1, &out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "CPU:1");
  tg_clear_error();
  /* unrealized input */
  tg_tensor lazy[2] = {tg_add_s(good[0], 1), good[1]};
  CHECK(tg_jit_call(j, lazy, 2, &k, 1, &out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "not realized");
  tg_clear_error();
  /* non-tensor argument baked in */
  double k2 = 5.0;
  CHECK(tg_jit_call(j, good, 2, &k2, 1, &out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "non-tensor argument 0 changed");
  tg_clear_error();
  /* wrong input count */
  CHECK(tg_jit_call(j, good, 1, &k, 1, &out) == TG_ERR_INVALID);
  tg_clear_error();
  /* still works after errors */
  CHECK(tg_jit_call(j, good, 2, &k, 1, &out) == TG_OK);
  tg_jit_free(j);
  /* assign to an input that is not returned */
  tg_jit *j2 = tg_jit_new(f_assign_in, 1, NULL);
  tg_status st = TG_OK;
  for (int it = 0; it < 2 && st == TG_OK; it++) {
    tg_tensor x = mk(0, 16);
    st = tg_jit_call(j2, &x, 1, NULL, 0, &out);
  }
  CHECK(st == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "assigns to input 0");
  tg_clear_error();
  tg_jit_free(j2);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

TEST(jit_random_differs_per_replay) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_manual_seed(42);
  tg_jit *j = tg_jit_new(f_rand, 1, NULL);
  float prev[8] = {0}, cur[8];
  float zeros[8] = {0};
  for (int it = 0; it < 5; it++) {
    /* a seed set outside the function, just before the capturing call, starts a new stream that the
     * replays go on with (its fresh counter was captured as a constant: every replay repeated it) */
    if (it == 1) tg_manual_seed(43);
    tg_tensor x = tg_from_data(zeros, TG_SHAPE(8), NULL), out;
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
    CHECK(tg_data(out, cur, sizeof cur) == TG_OK);
    for (int i = 0; i < 8; i++) CHECK(cur[i] >= 0.0f && cur[i] < 1.0f);
    if (it > 0) CHECK(memcmp(prev, cur, sizeof cur) != 0);
    memcpy(prev, cur, sizeof cur);
  }
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* a function that seeds, then draws: every call (replays too) draws the same numbers, the eager
 * call's, as in tinygrad (the seed's counter reset is part of the capture: replays continued the
 * stream) */
static tg_status f_seeded_rand(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_manual_seed(1234);
  out[0] = tg_add(in[0], tg_add(tg_rand(TG_SHAPE(8), NULL), tg_rand(TG_SHAPE(8), NULL)));
  return TG_OK;
}

TEST(jit_seed_inside_repeats) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_jit *j = tg_jit_new(f_seeded_rand, 1, NULL);
  float first[8], cur[8], zeros[8] = {0};
  for (int it = 0; it < 5; it++) {
    tg_tensor x = tg_from_data(zeros, TG_SHAPE(8), NULL), out;
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
    CHECK(tg_data(out, it ? cur : first, sizeof cur) == TG_OK);
    if (it) CHECK_MSG(memcmp(first, cur, sizeof cur) == 0, "call %d drew other numbers", it + 1);
  }
  CHECK(tg_jit_captured_kernels(j) > 0);
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

TEST(jit_disabled_with_env) {
  tg_scope_begin();
  tg_context_begin();
  tg_context_set("JIT", "0");
  tg_jit *j = tg_jit_new(f_affine, 1, NULL);
  double k = 1;
  for (int it = 0; it < 3; it++) {
    tg_tensor in[2] = {mk(1, 16), mk(2, 16)}, out;
    CHECK(tg_jit_call(j, in, 2, &k, 1, &out) == TG_OK);
  }
  CHECK(tg_jit_captured_kernels(j) == 0);
  tg_jit_free(j);
  tg_context_end();
  tg_scope_end();
}

/* JIT=2 is tinygrad's "capture, but no graph batching": it still captures on the second call and
 * replays only the captured kernels after that (the CPU device has no graph executor to turn off). */
TEST(jit_two_still_captures) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_context_begin();
  tg_context_set("JIT", "2");
  tg_jit *j = tg_jit_new(f_affine, 1, NULL);
  double k = 1.5;
  for (int it = 0; it < 4; it++) {
    tg_tensor in[2] = {mk((float)it, 16), mk(1, 16)}, out;
    if (it == 3) tg_global_counters_reset();
    CHECK(tg_jit_call(j, in, 2, &k, 1, &out) == TG_OK);
    if (it == 3) {
      CHECK(tg_global_counters().kernel_count == (uint64_t)tg_jit_captured_kernels(j));
      CHECK(tg_global_counters().compile_count == 0);
    }
    float got[4], want[4];
    CHECK(tg_data(out, got, sizeof got) == TG_OK);
    tg_tensor e = tg_sum(tg_relu(tg_add(tg_mul_s(in[0], k), in[1])), TG_AXES(1), false);
    CHECK(tg_data(e, want, sizeof want) == TG_OK);
    for (int i = 0; i < 4; i++) CHECK_CLOSE(got[i], want[i], 1e-6);
  }
  CHECK(tg_jit_captured_kernels(j) >= 1);
  tg_jit_free(j);
  tg_context_end();
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

TEST(autograd_matches_hand_derivation) {
  size_t live = tg_live_count();
  tg_scope_begin();
  float xd[3] = {1, -2, 3};
  tg_tensor x = tg_from_data(xd, TG_SHAPE(3), TG_OPTS(.requires_grad = true));
  /* loss = sum(x*x*x + relu(x)) -> grad = 3x^2 + (x > 0) */
  tg_tensor loss = tg_sum(tg_add(tg_mul(tg_mul(x, x), x), tg_relu(x)), TG_ALL_AXES, false);
  CHECK(tg_backward(loss) == TG_OK);
  float g[3];
  CHECK(tg_data(tg_grad(x), g, sizeof g) == TG_OK);
  CHECK_CLOSE(g[0], 4, 1e-6);
  CHECK_CLOSE(g[1], 12, 1e-6);
  CHECK_CLOSE(g[2], 28, 1e-6);
  /* gradients accumulate, zero_grad clears */
  CHECK(tg_backward(loss) == TG_OK);
  CHECK(tg_data(tg_grad(x), g, sizeof g) == TG_OK);
  CHECK_CLOSE(g[0], 8, 1e-6);
  tg_zero_grad(x);
  CHECK(!tg_valid(tg_grad(x)));
  /* tg_gradient leaves .grad alone */
  tg_tensor gx;
  CHECK(tg_gradient(loss, &x, 1, &gx) == TG_OK);
  CHECK(tg_data(gx, g, sizeof g) == TG_OK);
  CHECK_CLOSE(g[2], 28, 1e-6);
  CHECK(!tg_valid(tg_grad(x)));
  /* max ties split the gradient */
  float td[4] = {1, 5, 5, 2};
  tg_tensor t = tg_from_data(td, TG_SHAPE(4), TG_OPTS(.requires_grad = true));
  CHECK(tg_backward(tg_max(t, TG_ALL_AXES, false)) == TG_OK);
  float tg[4];
  CHECK(tg_data(tg_grad(t), tg, sizeof tg) == TG_OK);
  CHECK_CLOSE(tg[0], 0, 0);
  CHECK_CLOSE(tg[1], 0.5, 1e-7);
  CHECK_CLOSE(tg[2], 0.5, 1e-7);
  /* errors: non-scalar loss, no differentiable path */
  CHECK(tg_backward(x) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_backward");
  tg_clear_error();
  tg_tensor y = tg_set_requires_grad(tg_from_data(xd, TG_SHAPE(3), NULL), false);
  CHECK(tg_backward(tg_set_requires_grad(tg_sum(y, TG_ALL_AXES, false), false)) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "requires_grad");
  tg_clear_error();
  /* a target read only through a comparison gets zeros (tinygrad), one outside the graph an error */
  tg_tensor cmp = tg_sum(tg_cast(tg_lt_s(x, 0), TG_FLOAT32), TG_ALL_AXES, false);
  CHECK(tg_gradient(cmp, &x, 1, &gx) == TG_OK);
  float gz[3] = {1, 1, 1};
  CHECK(tg_data(gx, gz, sizeof gz) == TG_OK);
  for (int i = 0; i < 3; i++) CHECK_CLOSE(gz[i], 0, 0);
  CHECK(tg_gradient(cmp, &y, 1, &gx) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "not part of the loss");
  tg_clear_error();
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

TEST(detach_stops_gradient) {
  size_t live = tg_live_count();
  tg_scope_begin();
  float xd[3] = {1, 2, 3};
  tg_tensor x = tg_from_data(xd, TG_SHAPE(3), TG_OPTS(.requires_grad = true));
  /* d/dx sum(detach(x) * x) = detach(x) = x */
  CHECK(tg_backward(tg_sum(tg_mul(tg_detach(x), x), TG_ALL_AXES, false)) == TG_OK);
  float g[3];
  CHECK(tg_data(tg_grad(x), g, sizeof g) == TG_OK);
  for (int i = 0; i < 3; i++) CHECK_CLOSE(g[i], xd[i], 1e-7);
  CHECK(tg_is_realized(tg_detach(x)));
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* A lazy leaf that is itself a reshape (a 2-d tg_rand is a reshape of 1-d random bits; or a
 * reshaped tensor marked with tg_set_requires_grad) stays in the graphs built on it: reshaping it
 * again must not fold it away, or its gradient is lost */
TEST(gradient_of_reshaped_lazy_leaf) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_tensor a = tg_rand(TG_SHAPE(2, 3), TG_OPTS(.requires_grad = true));
  tg_tensor y = tg_reshape(a, TG_SHAPE(3, 2));
  CHECK(tg_backward(tg_sum(tg_mul(y, y), TG_ALL_AXES, false)) == TG_OK);
  float av[6], g[6];
  CHECK(tg_data(a, av, sizeof av) == TG_OK);
  CHECK(tg_data(tg_grad(a), g, sizeof g) == TG_OK);
  for (int i = 0; i < 6; i++) CHECK_CLOSE(g[i], 2 * av[i], 1e-6);
  float d[6] = {1, 2, 3, 4, 5, 6};
  tg_tensor e = tg_set_requires_grad(tg_reshape(tg_from_data(d, TG_SHAPE(6), NULL), TG_SHAPE(2, 3)), true);
  tg_tensor gr;
  CHECK(tg_gradient(tg_sum(tg_mul_s(tg_flatten(e, 0, -1), 3), TG_ALL_AXES, false), &e, 1, &gr) == TG_OK);
  CHECK(tg_data(gr, g, sizeof g) == TG_OK);
  for (int i = 0; i < 6; i++) CHECK_CLOSE(g[i], 3, 0);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* The gradient flows back through tg_to, also when the moved value is the loss itself: the
 * backward pass starts from a constant, which is the same constant on the other device */
TEST(gradient_through_device_copy) {
  size_t live = tg_live_count();
  tg_scope_begin();
  float qd[3] = {1, -2, 0.5f};
  tg_tensor q = tg_from_data(qd, TG_SHAPE(3), TG_OPTS(.requires_grad = true, .device = "CPU:1"));
  CHECK(tg_backward(tg_to(tg_sum(tg_mul(q, q), TG_ALL_AXES, false), "CPU")) == TG_OK);
  tg_tensor g = tg_grad(q);
  CHECK(strcmp(tg_device_of(g), "CPU:1") == 0);
  float gv[3];
  CHECK(tg_data(g, gv, sizeof gv) == TG_OK);
  for (int i = 0; i < 3; i++) CHECK_CLOSE(gv[i], 2 * qd[i], 1e-7);
  tg_tensor p = tg_from_data(qd, TG_SHAPE(3), TG_OPTS(.requires_grad = true));
  CHECK(tg_backward(tg_to(tg_sum(tg_mul_s(p, 4), TG_ALL_AXES, false), "CPU:1")) == TG_OK);
  CHECK(tg_data(tg_grad(p), gv, sizeof gv) == TG_OK);
  for (int i = 0; i < 3; i++) CHECK_CLOSE(gv[i], 4, 0);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* Reading a value realizes it, and the tensor then holds a buffer; a loss built on it (or the
 * loss itself, read before tg_backward) still differentiates through the graph that computed it,
 * as in tinygrad and PyTorch. Without any tensor that requires grad, a realized tensor keeps no
 * graph: its inputs' memory is released with their handles. */
TEST(gradient_after_reading_values) {
  size_t live = tg_live_count();
  tg_scope_begin();
  float xd[3] = {1, 2, 3};
  tg_tensor x = tg_from_data(xd, TG_SHAPE(3), TG_OPTS(.requires_grad = true));
  tg_tensor y = tg_mul(x, x);
  float yv[3], lv, g[3];
  CHECK(tg_data(y, yv, sizeof yv) == TG_OK && yv[2] == 9);
  tg_tensor loss = tg_sum(tg_mul_s(y, 0.5), TG_ALL_AXES, false);
  CHECK(tg_data(loss, &lv, sizeof lv) == TG_OK && lv == 7);
  CHECK(tg_backward(loss) == TG_OK);
  CHECK(tg_data(tg_grad(x), g, sizeof g) == TG_OK);
  for (int i = 0; i < 3; i++) CHECK_CLOSE(g[i], xd[i], 1e-7); /* d/dx sum(x^2 / 2) = x */
  tg_zero_grad(x);
  /* twice realized: y2 from a realized y */
  tg_tensor y2 = tg_exp(y);
  CHECK(tg_realize(y2) == TG_OK);
  tg_tensor gx;
  CHECK(tg_gradient(tg_sum(y2, TG_ALL_AXES, false), &x, 1, &gx) == TG_OK);
  CHECK(tg_data(gx, g, sizeof g) == TG_OK);
  for (int i = 0; i < 3; i++) CHECK_CLOSE(g[i], 2 * xd[i] * expf(xd[i] * xd[i]), 1e-5 * expf(xd[i] * xd[i]));
  tg_scope_end();
  CHECK(tg_live_count() == live);
  /* no gradient anywhere: a running value realized a hundred times keeps no history */
  tg_scope_begin();
  uint64_t mem0 = tg_global_counters().mem_used;
  tg_tensor h = tg_zeros(TG_SHAPE(1 << 16), NULL);
  for (int i = 0; i < 100; i++) {
    tg_scope_begin();
    tg_tensor nh = tg_keep(tg_add_s(tg_mul_s(h, 0.5), 1));
    CHECK(tg_realize(nh) == TG_OK);
    tg_scope_end();
    tg_free(h);
    h = nh;
  }
  float hv;
  CHECK(tg_data(tg_shrink(h, (const int64_t[]){0, 1}, 2), &hv, sizeof hv) == TG_OK);
  CHECK_CLOSE(hv, 2.0f, 1e-6);
  CHECK_MSG(tg_global_counters().mem_used - mem0 <= (2u << 18), "%llu bytes held",
            (unsigned long long)(tg_global_counters().mem_used - mem0));
  tg_scope_end();
}

TEST(lazy_random_is_stable_across_realizes) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_tensor r = tg_rand(TG_SHAPE(16), NULL);
  tg_tensor a = tg_add_s(r, 0), b = tg_mul_s(r, 1);
  float va[16], vb[16];
  CHECK(tg_data(a, va, sizeof va) == TG_OK);
  tg_tensor other = tg_rand(TG_SHAPE(16), NULL); /* advances the counter in between */
  CHECK(tg_realize(other) == TG_OK);
  CHECK(tg_data(b, vb, sizeof vb) == TG_OK);
  CHECK(memcmp(va, vb, sizeof va) == 0);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

TEST(index_rows_and_gradient) {
  size_t live = tg_live_count();
  tg_scope_begin();
  float d[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  int32_t ii[5] = {2, 0, -1, 7, 1};
  tg_tensor x = tg_from_data(d, TG_SHAPE(4, 3), TG_OPTS(.requires_grad = true));
  tg_tensor i = tg_from_data(ii, TG_SHAPE(5), TG_OPTS(.dtype = TG_INT32));
  float r[15];
  tg_global_counters_reset();
  CHECK(tg_data(tg_index(x, i), r, sizeof r) == TG_OK);
  CHECK(tg_global_counters().kernel_count == 1);
  const float want[15] = {6, 7, 8, 0, 1, 2, 9, 10, 11, 0, 0, 0, 3, 4, 5}; /* 7 is out of range: zeros */
  for (int k = 0; k < 15; k++) CHECK_CLOSE(r[k], want[k], 0);
  tg_tensor y = tg_index(x, i);
  CHECK(tg_backward(tg_sum(tg_mul(y, y), TG_ALL_AXES, false)) == TG_OK);
  float g[12];
  CHECK(tg_data(tg_grad(x), g, sizeof g) == TG_OK);
  for (int k = 0; k < 12; k++) CHECK_CLOSE(g[k], 2 * d[k], 1e-6);
  CHECK(!tg_valid(tg_index(x, tg_cast(i, TG_FLOAT32))));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_index");
  tg_clear_error();
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

static tg_tensor layer_relu(tg_tensor x, void *ctx) { (void)ctx; return tg_relu(x); }
static tg_tensor layer_scale(tg_tensor x, void *ctx) { return tg_mul_s(x, *(const double *)ctx); }

TEST(sequential_applies_layers_in_order) {
  size_t live = tg_live_count();
  tg_scope_begin();
  float d[4] = {-1, 2, -3, 4};
  double k = 3;
  tg_layer_fn fns[2] = {layer_relu, layer_scale};
  void *ctx[2] = {NULL, &k};
  float out[4];
  CHECK(tg_data(tg_sequential(tg_from_data(d, TG_SHAPE(4), NULL), fns, ctx, 2), out, sizeof out) == TG_OK);
  CHECK_CLOSE(out[0], 0, 0);
  CHECK_CLOSE(out[1], 6, 0);
  CHECK_CLOSE(out[3], 12, 0);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* ---- nesting, fed-back outputs, reads during capture, refused calls, counters, prune ---- */

typedef struct {
  tg_jit *inner;  /* jit the function calls (NULL: none) */
  bool only_when_set, set;
  tg_status inner_status;
} NestCtx;

static tg_status f_nested(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  NestCtx *c = u;
  tg_tensor y = tg_mul_s(in[0], 2);
  if (c->inner && (!c->only_when_set || c->set)) {
    tg_tensor r;
    CHECK(tg_realize(y) == TG_OK);
    c->inner_status = tg_jit_call(c->inner, &y, 1, NULL, 0, &r);
    if (c->inner_status != TG_OK) return c->inner_status;
    y = r;
  }
  out[0] = tg_add_s(y, 1);
  return TG_OK;
}

/* A jit called from inside a jitted function that captures is an error (tinygrad: "having TinyJit
 * inside another TinyJit is not supported"); one whose function runs plainly -- its first call, or
 * JIT=0 -- may call it, as in tinygrad (it was refused there too). A jit calling itself fails at once
 * instead of recursing until the stack overflows. */
TEST(jit_nested_is_an_error) {
  size_t live = tg_live_count();
  tg_scope_begin();
  float d[3] = {1, 2, 3};
  tg_tensor x = tg_from_data(d, TG_SHAPE(3), NULL), out;
  NestCtx ic = {0};
  tg_jit *inner = tg_jit_new(f_nested, 1, &ic);
  NestCtx oc = {.inner = inner};
  tg_jit *outer = NULL;
  for (int jit = 0; jit < 2; jit++) {
    tg_jit_free(outer);
    outer = tg_jit_new(f_nested, 1, &oc); /* (a new one: its first call runs plainly) */
    tg_context_begin();
    tg_context_set_int("JIT", jit);
    for (int it = 0; it < 3; it++) {
      tg_status st = tg_jit_call(outer, &x, 1, NULL, 0, &out);
      if (jit == 0 || it == 0) { /* plain runs: the inner jit runs (its capture and replays too) */
        float v[3];
        CHECK_MSG(st == TG_OK && oc.inner_status == TG_OK, "JIT=%d call %d: %s", jit, it, tg_last_error());
        CHECK(tg_data(out, v, sizeof v) == TG_OK);
        for (int i = 0; i < 3; i++) CHECK_CLOSE(v[i], 4 * d[i] + 2, 0);
      } else {
        CHECK(st == TG_ERR_INVALID && !tg_valid(out) && oc.inner_status == TG_ERR_INVALID);
        CHECK_STR_CONTAINS(tg_last_error(), "while that jit captures; TinyJit inside another TinyJit is not supported");
      }
      tg_clear_error();
    }
    tg_context_end();
  }
  tg_jit_free(outer);
  /* itself, unbounded: one level down is refused */
  NestCtx sc = {0};
  tg_jit *self = tg_jit_new(f_nested, 1, &sc);
  sc.inner = self;
  CHECK(tg_jit_call(self, &x, 1, NULL, 0, &out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "its function calls it again");
  tg_clear_error();
  tg_jit_free(self);
  /* a jit called while another captures: the outer function calls it only on its second call */
  NestCtx lc = {.inner = inner, .only_when_set = true};
  tg_jit *late = tg_jit_new(f_nested, 1, &lc);
  CHECK(tg_jit_call(late, &x, 1, NULL, 0, &out) == TG_OK);
  lc.set = true;
  CHECK(tg_jit_call(late, &x, 1, NULL, 0, &out) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "TinyJit inside another TinyJit");
  tg_clear_error();
  /* the capture failed: the outer jit captures again once the function stops nesting */
  lc.set = false;
  for (int it = 0; it < 3; it++) {
    float v[3];
    CHECK(tg_jit_call(late, &x, 1, NULL, 0, &out) == TG_OK);
    CHECK(tg_data(out, v, sizeof v) == TG_OK);
    for (int i = 0; i < 3; i++) CHECK_CLOSE(v[i], 2 * d[i] + 1, 0);
  }
  CHECK(tg_jit_captured_kernels(late) >= 1);
  tg_jit_free(late);
  /* the inner jit, called by the plain runs above, works on its own */
  for (int it = 0; it < 3; it++) {
    float v[3];
    CHECK(tg_jit_call(inner, &x, 1, NULL, 0, &out) == TG_OK);
    CHECK(tg_data(out, v, sizeof v) == TG_OK);
    for (int i = 0; i < 3; i++) CHECK_CLOSE(v[i], 2 * d[i] + 1, 0);
  }
  tg_jit_free(inner);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* Shifts a window: new = cat(buf[1:], frame) (left) or cat(frame, buf[:2]) (right); returns new
 * and new[:1]. */
static tg_status f_shift(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  bool right = *(const bool *)u;
  tg_tensor parts[2] = {tg_shrink(in[0], (const int64_t[]){1, 3}, 2), in[1]};
  if (right) parts[0] = in[1], parts[1] = tg_shrink(in[0], (const int64_t[]){0, 2}, 2);
  out[0] = tg_cat(parts, 2, 0);
  out[1] = tg_shrink(out[0], (const int64_t[]){0, 1}, 2);
  return TG_OK;
}

/* An output fed back as the next call's input: a replay writes the output buffers while kernels of
 * the same replay still read the input, so the input is copied first (tinygrad prints 1 2 10 11
 * for the left shift). */
TEST(jit_output_fed_back_as_input) {
  size_t live = tg_live_count();
  tg_scope_begin();
  for (int mode = 0; mode < 4; mode++) {
    bool right = mode & 1;
    int jit = mode >> 1;
    tg_context_begin();
    tg_context_set_int("JIT", jit);
    tg_jit *j = tg_jit_new(f_shift, 2, &right);
    float want[3] = {0, 1, 2};
    tg_tensor buf = tg_from_data(want, TG_SHAPE(3), NULL);
    for (int it = 0; it < 6; it++) {
      float fr = (float)(10 + it), first, all[3];
      if (right) want[2] = want[1], want[1] = want[0], want[0] = fr;
      else want[0] = want[1], want[1] = want[2], want[2] = fr;
      tg_tensor in[2] = {buf, tg_from_data(&fr, TG_SHAPE(1), NULL)}, out[2];
      CHECK(tg_jit_call(j, in, 2, NULL, 0, out) == TG_OK);
      CHECK(tg_data(out[1], &first, sizeof first) == TG_OK);
      CHECK(tg_data(out[0], all, sizeof all) == TG_OK);
      CHECK_MSG(first == want[0], "JIT=%d %s call %d: first %g, want %g", jit, right ? "right" : "left", it, first, want[0]);
      for (int i = 0; i < 3; i++)
        CHECK_MSG(all[i] == want[i], "JIT=%d %s call %d: new[%d] = %g, want %g", jit, right ? "right" : "left", it, i,
                  all[i], want[i]);
      buf = out[0];
    }
    if (jit) CHECK(tg_jit_captured_kernels(j) >= 1);
    tg_jit_free(j);
    tg_context_end();
  }
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* Swapping two inputs between calls: each captured buffer is replaced once, so a swapped pair does
 * not swap back (and an input that aliases the other's captured buffer is read as itself). */
static tg_status f_sub(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_sub(in[0], in[1]);
  return TG_OK;
}

TEST(jit_swapped_inputs) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_jit *j = tg_jit_new(f_sub, 1, NULL);
  float a = 5, b = 2, v;
  tg_tensor ta = tg_from_data(&a, TG_SHAPE(1), NULL), tb = tg_from_data(&b, TG_SHAPE(1), NULL), out;
  for (int it = 0; it < 5; it++) {
    tg_tensor in[2] = {it % 2 ? tb : ta, it % 2 ? ta : tb};
    CHECK(tg_jit_call(j, in, 2, NULL, 0, &out) == TG_OK);
    CHECK(tg_data(out, &v, sizeof v) == TG_OK);
    CHECK_MSG(v == (it % 2 ? -3.0f : 3.0f), "call %d: %g", it, v);
  }
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* An input the function assigns and returns comes back as the buffer passed in this call. */
static tg_status f_assign_ret(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_assign(in[0], tg_add(in[0], in[1]));
  return TG_OK;
}

TEST(jit_assigned_input_returned) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_jit *j = tg_jit_new(f_assign_ret, 1, NULL);
  float one = 1;
  tg_tensor inc = tg_from_data(&one, TG_SHAPE(1), NULL);
  for (int it = 0; it < 5; it++) {
    float s = (float)(10 * it), v, back;
    tg_tensor x = tg_from_data(&s, TG_SHAPE(1), NULL), out;
    tg_tensor in[2] = {x, inc};
    CHECK(tg_jit_call(j, in, 2, NULL, 0, &out) == TG_OK);
    CHECK(tg_data(out, &v, sizeof v) == TG_OK);
    CHECK(tg_data(x, &back, sizeof back) == TG_OK);
    CHECK_MSG(v == s + 1 && back == s + 1, "call %d: out %g, input %g, want %g", it, v, back, s + 1);
  }
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

static tg_status f_reads(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)nargs, (void)nout, (void)u;
  tg_tensor s = tg_sum(in[0], TG_ALL_AXES, false);
  double v = 0;
  float buf[4];
  tg_status st = TG_OK;
  switch ((int)args[0]) {
  case 0: st = tg_item(s, &v); break;
  case 1: st = tg_data(in[0], buf, sizeof buf); break;
  case 2: st = tg_print(s); break;
  case 3: {
    char *str = tg_to_string(s);
    st = str ? TG_OK : tg_last_status();
    free(str);
    break;
  }
  }
  if (st != TG_OK) return st;
  out[0] = tg_mul_s(in[0], v + 1);
  return TG_OK;
}

/* Reading data inside the function while it is captured would bake the value into every replay:
 * an error naming the reader, as tinygrad raises. The first (uncaptured) call may read. */
TEST(jit_reading_data_during_capture) {
  size_t live = tg_live_count();
  tg_scope_begin();
  const char *names[4] = {"tg_item", "tg_data", "tg_print", "tg_to_string"};
  float d[4] = {1, 2, 3, 4};
  for (int r = 0; r < 4; r++) {
    tg_jit *j = tg_jit_new(f_reads, 1, NULL);
    double arg = r;
    tg_tensor x = tg_from_data(d, TG_SHAPE(4), NULL), out;
    CHECK(tg_jit_call(j, &x, 1, &arg, 1, &out) == TG_OK);
    CHECK(tg_jit_call(j, &x, 1, &arg, 1, &out) == TG_ERR_INVALID);
    CHECK(!tg_valid(out));
    CHECK_STR_CONTAINS(tg_last_error(), names[r]);
    CHECK_STR_CONTAINS(tg_last_error(), "baked into every replay");
    tg_clear_error();
    CHECK(tg_jit_captured_kernels(j) == 0);
    tg_jit_free(j);
    /* outside a capture reading works again */
    double v;
    CHECK(tg_item(tg_sum(x, TG_ALL_AXES, false), &v) == TG_OK && v == 10);
  }
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

static tg_status f_identity(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = in[0];
  return TG_OK;
}

/* Calls tinygrad refuses: the same tensor as two inputs ("duplicate inputs to JIT", on every call)
 * and a capture that runs no kernel ("didn't JIT anything!"). */
TEST(jit_refuses_duplicate_inputs_and_empty_captures) {
  size_t live = tg_live_count();
  tg_scope_begin();
  float a[4] = {1, 2, 3, 4}, b[4] = {4, 3, 2, 1};
  tg_tensor x = tg_from_data(a, TG_SHAPE(4), NULL), y = tg_from_data(b, TG_SHAPE(4), NULL), out;
  tg_jit *j = tg_jit_new(f_sub, 1, NULL);
  tg_tensor dup[2] = {x, x}, ok[2] = {x, y};
  for (int it = 0; it < 4; it++) {
    CHECK(tg_jit_call(j, dup, 2, NULL, 0, &out) == TG_ERR_INVALID);
    CHECK_STR_CONTAINS(tg_last_error(), "inputs 0 and 1 are the same tensor");
    tg_clear_error();
    /* a second handle to the same buffer is the same tensor too */
    tg_tensor alias[2] = {x, tg_reshape(x, TG_SHAPE(4))};
    CHECK(tg_jit_call(j, alias, 2, NULL, 0, &out) == TG_ERR_INVALID);
    CHECK_STR_CONTAINS(tg_last_error(), "same tensor");
    tg_clear_error();
    float v[4];
    CHECK(tg_jit_call(j, ok, 2, NULL, 0, &out) == TG_OK);
    CHECK(tg_data(out, v, sizeof v) == TG_OK);
    for (int i = 0; i < 4; i++) CHECK_CLOSE(v[i], a[i] - b[i], 0);
  }
  tg_jit_free(j);
  j = tg_jit_new(f_identity, 1, NULL);
  CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK); /* the first call runs the function as is */
  for (int it = 0; it < 2; it++) {
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_ERR_INVALID);
    CHECK(!tg_valid(out));
    CHECK_STR_CONTAINS(tg_last_error(), "ran no kernel");
    tg_clear_error();
  }
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* A replay counts what the captured run counted: kernels, FLOPs and bytes moved. */
TEST(jit_replay_counts_like_the_captured_run) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_jit *j = tg_jit_new(f_big_middle, 1, NULL);
  float v[1024];
  for (int i = 0; i < 1024; i++) v[i] = (float)(i % 3);
  tg_tensor x = tg_from_data(v, TG_SHAPE(1024), NULL), out;
  CHECK(tg_realize(x) == TG_OK);
  CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
  tg_global_counters_reset();
  CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK); /* capture: runs every kernel once */
  tg_counters cap = tg_global_counters();
  tg_global_counters_reset();
  CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
  tg_counters rep = tg_global_counters();
  CHECK(cap.global_mem > 8u << 20); /* two 4 MB intermediates written and read */
  CHECK(rep.kernel_count == cap.kernel_count);
  CHECK(rep.global_ops == cap.global_ops);
  CHECK_MSG(rep.global_mem == cap.global_mem, "replay moved %llu bytes, capture %llu",
            (unsigned long long)rep.global_mem, (unsigned long long)cap.global_mem);
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

typedef struct {
  tg_jit *j;
  tg_tensor x;
  int reps;
  int failures;
} ThreadJob;

static void *replay_thread(void *p) {
  ThreadJob *job = p;
  for (int r = 0; r < job->reps; r++) {
    tg_scope_begin();
    tg_tensor out;
    if (tg_jit_call(job->j, &job->x, 1, NULL, 0, &out) != TG_OK) job->failures++;
    tg_scope_end();
  }
  return NULL;
}

/* The global counters are atomic: replays on several threads at once lose no update. */
TEST(global_counters_exact_under_threads) {
  size_t live = tg_live_count();
  enum { NT = 4, REPS = 300 };
  tg_scope_begin();
  ThreadJob jobs[NT];
  tg_counters one = {0};
  for (int t = 0; t < NT; t++) {
    float d[64];
    for (int i = 0; i < 64; i++) d[i] = (float)(t + i);
    jobs[t] = (ThreadJob){tg_jit_new(f_big_middle, 1, NULL), tg_from_data(d, TG_SHAPE(1024 / 16), NULL), REPS, 0};
    jobs[t].x = tg_contiguous(tg_reshape(tg_expand(tg_reshape(jobs[t].x, TG_SHAPE(1, 64)), TG_SHAPE(16, 64)), TG_SHAPE(1024)));
    CHECK(tg_realize(jobs[t].x) == TG_OK);
    tg_tensor out;
    for (int c = 0; c < 3; c++) {
      if (c == 2) tg_global_counters_reset();
      CHECK(tg_jit_call(jobs[t].j, &jobs[t].x, 1, NULL, 0, &out) == TG_OK);
    }
    one = tg_global_counters(); /* one replay */
  }
  CHECK(one.kernel_count >= 2 && one.global_mem > 0 && one.global_ops > 0);
  tg_global_counters_reset();
  pthread_t th[NT];
  for (int t = 0; t < NT; t++) CHECK(pthread_create(&th[t], NULL, replay_thread, &jobs[t]) == 0);
  for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
  tg_counters all = tg_global_counters();
  uint64_t n = (uint64_t)NT * REPS;
  for (int t = 0; t < NT; t++) CHECK(jobs[t].failures == 0);
  CHECK_MSG(all.kernel_count == n * one.kernel_count, "%llu kernels, want %llu", (unsigned long long)all.kernel_count,
            (unsigned long long)(n * one.kernel_count));
  CHECK(all.global_ops == n * one.global_ops);
  CHECK(all.global_mem == n * one.global_mem);
  /* one jit, two threads: the second call is refused while the first runs, never interleaved */
  ThreadJob shared[2] = {{jobs[0].j, jobs[0].x, REPS, 0}, {jobs[0].j, jobs[0].x, REPS, 0}};
  for (int t = 0; t < 2; t++) CHECK(pthread_create(&th[t], NULL, replay_thread, &shared[t]) == 0);
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  CHECK(shared[0].failures + shared[1].failures < 2 * REPS);
  for (int t = 0; t < NT; t++) tg_jit_free(jobs[t].j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* ---- prune ---- */

typedef struct {
  tg_tensor acc; /* state the function updates (not an input) */
  bool realize_weight; /* the input-independent weight in its own realize (a held buffer), or not */
} PruneCtx;

/* out0 = x * w with w = (arange+1)*2, input-independent; out1 = acc*2 read before acc += x (a
 * kernel that reads no input but whose result each replay changes) */
static tg_status f_prune(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  PruneCtx *c = u;
  tg_tensor w = tg_contiguous(tg_mul_s(tg_add_s(tg_arange(0, 8, 1, NULL), 1), 2));
  if (c->realize_weight) CHECK(tg_realize(w) == TG_OK);
  tg_tensor prev = tg_contiguous(tg_mul_s(c->acc, 2));
  CHECK(tg_realize(prev) == TG_OK);
  tg_tensor upd = tg_assign(c->acc, tg_add(c->acc, tg_sum(in[0], TG_ALL_AXES, false)));
  CHECK(tg_realize(upd) == TG_OK);
  out[0] = tg_mul(in[0], w);
  out[1] = prev;
  return TG_OK;
}

/* prune drops the kernels that do not depend on the inputs: they are not replayed, and every
 * result equals the unpruned jit's (and eager execution's). The kernel that reads only the state
 * a replay updates is kept (tinygrad prunes it and returns a stale value). */
TEST(jit_prune_drops_input_independent_kernels) {
  size_t live = tg_live_count();
  tg_scope_begin();
  for (int rw = 0; rw < 2; rw++) {
    float res[4][6][9];
    int captured[4] = {0}, constant[4] = {0};
    uint64_t replay_kernels[4] = {0};
    for (int mode = 0; mode < 4; mode++) { /* eager, jit, jit with prune, jit with rerun_constants */
      PruneCtx c = {tg_zeros(TG_SHAPE(1), NULL), rw == 1};
      CHECK(tg_realize(c.acc) == TG_OK);
      tg_context_begin();
      tg_context_set_int("JIT", mode > 0);
      tg_jit *j = tg_jit_new_opts(f_prune, 2, &c, TG_JIT_OPTS(.prune = mode == 2, .rerun_constants = mode == 3));
      for (int it = 0; it < 6; it++) {
        float xd[8];
        for (int i = 0; i < 8; i++) xd[i] = (float)(it - i);
        tg_tensor x = tg_from_data(xd, TG_SHAPE(8), NULL), out[2];
        if (it == 5) tg_global_counters_reset();
        CHECK(tg_jit_call(j, &x, 1, NULL, 0, out) == TG_OK);
        if (it == 5) replay_kernels[mode] = tg_global_counters().kernel_count;
        CHECK(tg_data(out[0], res[mode][it], 8 * sizeof(float)) == TG_OK);
        CHECK(tg_data(out[1], &res[mode][it][8], sizeof(float)) == TG_OK);
      }
      captured[mode] = tg_jit_captured_kernels(j);
      constant[mode] = tg_jit_constant_kernels(j);
      tg_jit_free(j);
      tg_context_end();
    }
    for (int mode = 1; mode < 4; mode++)
      for (int it = 0; it < 6; it++)
        for (int i = 0; i < 9; i++)
          CHECK_MSG(res[mode][it][i] == res[0][it][i], "weight realized %d, %s, call %d, [%d]: %g, eager %g", rw,
                    mode == 2 ? "pruned" : "jit", it, i, res[mode][it][i], res[0][it][i]);
    CHECK_CLOSE(res[0][5][3], (5 - 3) * 8.0, 0);
    /* the weight's kernel is the one pruned */
    CHECK_MSG(captured[2] == captured[1] - 1, "weight realized %d: %d kernels pruned to %d", rw, captured[1], captured[2]);
    /* without prune, the weight's kernel is constant work when its result is an intermediate (a
     * weight realized on its own is a buffer the jit holds, written on every replay) */
    CHECK_MSG(constant[1] == (rw == 0), "weight realized %d: %d constant kernels", rw, constant[1]);
    CHECK(constant[2] == 0 && constant[3] == 0);
    CHECK(replay_kernels[1] == (uint64_t)(captured[1] - constant[1]));
    CHECK(replay_kernels[2] == (uint64_t)captured[2]);
    CHECK(replay_kernels[3] == (uint64_t)captured[3] && captured[3] == captured[1]);
  }
  tg_scope_end();
  CHECK(tg_live_count() == live);
}

/* With prune, a kernel that assigns to an input (returned) is kept, and so is a rand that depends
 * on one; a function whose outputs depend on no input replays nothing and returns the same values. */
static tg_status f_prune_const(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_assign(in[0], tg_mul_s(in[0], 3));
  out[1] = tg_contiguous(tg_add_s(tg_arange(0, 4, 1, TG_OPTS(.dtype = TG_FLOAT32)), 7));
  return TG_OK;
}

TEST(jit_prune_keeps_assigns) {
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_jit *j = tg_jit_new_opts(f_prune_const, 2, NULL, TG_JIT_OPTS(.prune = true));
  for (int it = 0; it < 5; it++) {
    float xd[4] = {1, 2, 3, (float)it}, o0[4], o1[4];
    tg_tensor x = tg_from_data(xd, TG_SHAPE(4), NULL), out[2];
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, out) == TG_OK);
    CHECK(tg_data(out[0], o0, sizeof o0) == TG_OK);
    CHECK(tg_data(out[1], o1, sizeof o1) == TG_OK);
    for (int i = 0; i < 4; i++) {
      CHECK_CLOSE(o0[i], 3 * xd[i], 0);
      CHECK_CLOSE(o1[i], 7 + i, 0);
    }
  }
  CHECK(tg_jit_captured_kernels(j) == 1);
  tg_jit_free(j);
  /* as in tinygrad, the random counter's advance reads no input: pruned, so every replay draws
   * the numbers the capture drew (without prune each replay draws new ones) */
  tg_manual_seed(3);
  j = tg_jit_new_opts(f_rand, 1, NULL, TG_JIT_OPTS(.prune = true));
  float r[5][8], zeros[8] = {0};
  for (int it = 0; it < 5; it++) {
    tg_tensor x = tg_from_data(zeros, TG_SHAPE(8), NULL), out;
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
    CHECK(tg_data(out, r[it], sizeof r[it]) == TG_OK);
  }
  CHECK(memcmp(r[0], r[1], sizeof r[0]) != 0);
  for (int it = 2; it < 5; it++) CHECK(memcmp(r[1], r[it], sizeof r[0]) == 0);
  tg_jit_free(j);
  CHECK(tg_jit_new_opts(NULL, 1, NULL, TG_JIT_OPTS(.prune = true)) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_jit_new");
  tg_clear_error();
  tg_scope_end();
  CHECK(tg_live_count() == live);
}


/* ---- constant work on realized weights ---- */

typedef struct {
  tg_tensor w;   /* (64, 1024): a matmul this wide packs its weight first */
  bool train;    /* also update w from the input inside the function */
  bool chain;    /* read w through a materialized copy of w * 0.5, doubled (two kernels of constant work) */
} WeightCtx;

static tg_status f_weight(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  WeightCtx *c = u;
  out[0] = tg_matmul(in[0], c->chain ? tg_mul_s(tg_contiguous(tg_mul_s(c->w, 0.5)), 2.0) : c->w);
  if (c->train) CHECK(tg_realize(tg_assign(c->w, tg_sub(c->w, tg_mul_s(tg_mean(in[0], TG_ALL_AXES, false), 0.5)))) == TG_OK);
  return TG_OK;
}

static void fill_weight(float *w, int n, float scale) {
  for (int i = 0; i < n; i++) w[i] = scale * (float)((i * 37) % 17 - 8) / 8;
}

/* x @ w for x (64, 64) in row-major floats */
static void ref_matmul(const float *x, const float *w, float *o) {
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < 1024; c++) {
      double acc = 0;
      for (int k = 0; k < 64; k++) acc += (double)x[r * 64 + k] * w[k * 1024 + c];
      o[r * 1024 + c] = (float)acc;
    }
}

/* The packing of a realized weight runs once, not on every replay: it runs again after the weight
 * is assigned outside the jit, always when the weight is memory the caller owns, and on every call
 * when the function updates the weight itself. A chain of constant kernels (a copy of the weight,
 * then its packing: an intermediate only constant work reads) behaves the same. Every result
 * equals the direct computation. */
TEST(jit_constant_work_runs_when_weights_change) {
  size_t live = tg_live_count();
  static float wd[64 * 1024], blob[64 * 1024], xd[64 * 64], o[64 * 1024], ref[64 * 1024];
  for (int kind = 0; kind < 4; kind++) { /* 0: library weight, 1: tg_from_blob weight, 2: trained inside, 3: 0 through a chain */
    tg_scope_begin();
    fill_weight(wd, 64 * 1024, 1);
    memcpy(blob, wd, sizeof blob);
    WeightCtx c = {kind == 1 ? tg_from_blob(blob, TG_SHAPE(64, 1024), NULL) : tg_from_data(wd, TG_SHAPE(64, 1024), NULL), kind == 2, kind == 3};
    if (kind == 1 && !tg_valid(c.w)) { /* only CPU devices wrap host memory (DEV=CL) */
      tg_clear_error();
      tg_scope_end();
      continue;
    }
    tg_jit *j = tg_jit_new(f_weight, 1, &c);
    int captured = 0, constant = 0;
    for (int it = 0; it < 7; it++) {
      for (int i = 0; i < 64 * 64; i++) xd[i] = (float)((i + it) % 13 - 6) / 4;
      if (it == 5 && (kind == 0 || kind == 3)) { /* the weight changes outside the jit */
        CHECK(tg_realize(tg_assign(c.w, tg_mul_s(c.w, 2))) == TG_OK);
        for (int i = 0; i < 64 * 1024; i++) wd[i] *= 2;
      }
      if (it == 5 && kind == 1)
        for (int i = 0; i < 64 * 1024; i++) blob[i] = wd[i] = -wd[i];
      tg_tensor x = tg_from_data(xd, TG_SHAPE(64, 64), NULL), out;
      tg_global_counters_reset();
      CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
      uint64_t ran = tg_global_counters().kernel_count;
      CHECK(tg_data(out, o, sizeof o) == TG_OK);
      ref_matmul(xd, wd, ref);
      float worst = 0;
      for (int i = 0; i < 64 * 1024; i++) worst = fmaxf(worst, fabsf(o[i] - ref[i]));
      CHECK_MSG(worst < 1e-3f, "weight kind %d, call %d: off by %g", kind, it, worst);
      if (kind == 2) { /* the function's own update: w -= mean(x) / 2 */
        double m = 0;
        for (int i = 0; i < 64 * 64; i++) m += xd[i];
        for (int i = 0; i < 64 * 1024; i++) wd[i] -= (float)(m / (64 * 64) * 0.5);
      }
      if (it == 1) captured = tg_jit_captured_kernels(j), constant = tg_jit_constant_kernels(j);
      /* call 2 captures, call 3 computes the constants; from then on they run only after a change */
      bool refresh = it == 2 || (it == 5 && (kind == 0 || kind == 3));
      if (it >= 2)
        CHECK_MSG(ran == (uint64_t)(refresh ? captured : captured - constant), "weight kind %d, call %d: %llu of %d kernels ran (%d constant)",
                  kind, it, (unsigned long long)ran, captured, constant);
    }
    CHECK_MSG(kind == 0 ? constant >= 1 : kind == 3 ? constant >= 2 : constant == 0, "weight kind %d: %d constant kernels", kind, constant);
    tg_jit_free(j);
    tg_scope_end();
  }
  CHECK(tg_live_count() == live);
}

int main(void) { return RUN_TESTS(); }
