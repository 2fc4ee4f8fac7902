/* test_jit.c -- TinyJit capture/replay, its error cases, and autograd basics. */
#include <math.h>
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
  tg_tensor y = tg_from_data(xd, TG_SHAPE(3), NULL);
  CHECK(tg_backward(tg_sum(y, TG_ALL_AXES, false)) == TG_ERR_INVALID);
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

int main(void) { return RUN_TESTS(); }
