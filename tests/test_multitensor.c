/*
 * test_multitensor.c -- multi-device tensors (tg_shard) on CPU:0..CPU:3, each case against the
 * same computation on one device: basics, resharding, reductions and the allreduce (ring against
 * naive, kernel counts), the 9 matmul shardings, conv2d, embedding, BatchNorm, autograd, TinyJit,
 * rand, assign/setitem across shard boundaries.
 */
#include "maxdiff.h"
#include "test.h"

#include <tinygrad.h>

static const char *DEV4[] = {"CPU:0", "CPU:1", "CPU:2", "CPU:3"};
static const char *DEV2[] = {"CPU:0", "CPU:1"};

/* max |a - b| of two tensors of equal numel (a may be multi-device: tg_data gathers) */
static double maxdiff(tg_tensor a, tg_tensor b) { return tensor_maxdiff(a, b); }

/* the sharding axes a 2-d tensor can take: replicated, 0, 1 */
static const int SHARD_AXES[3] = {TG_SHARD_NONE, 0, 1};

static tg_tensor realized(tg_tensor t) {
  tg_realize(t);
  return t;
}

TEST(shard_roundtrip) {
  BEGIN;
  tg_tensor x = realized(tg_randn(TG_SHAPE(10, 3), NULL));
  for (int ax_i = 0, axis; ax_i < 3 && (axis = SHARD_AXES[ax_i], 1); ax_i++) {
    tg_tensor s = tg_shard(x, DEV4, 4, axis);
    CHECK(tg_shard_axis(s) == axis);
    CHECK(tg_shard_count(s) == 4);
    CHECK(tg_numel(s) == 30);
    CHECK_STR_CONTAINS(tg_device_of(s), "CPU:1");
    CHECK(maxdiff(s, x) == 0);
    tg_tensor back = tg_to(s, "CPU");
    CHECK(strcmp(tg_device_of(back), "CPU") == 0);
    CHECK(maxdiff(back, x) == 0);
  }
  /* a negative axis counts from the end, as in tinygrad (-1 is not "replicate") */
  CHECK(tg_shard_axis(tg_shard(x, DEV4, 4, -1)) == 1 && tg_shard_axis(tg_shard(x, DEV4, 4, -2)) == 0);
  CHECK(maxdiff(tg_shard(x, DEV4, 4, -1), x) == 0);
  CHECK(!tg_valid(tg_shard(x, DEV4, 4, -3)));
  CHECK_STR_CONTAINS(tg_last_error(), "axis -3 is out of range for shape (10, 3) (-2..1, or TG_SHARD_NONE to replicate)");
  tg_clear_error();
  /* uneven: 10 rows over 4 devices are 3, 3, 3, 1 */
  tg_tensor s = tg_shard(x, DEV4, 4, 0);
  CHECK(tg_numel(tg_shard_get(s, 0)) == 9 && tg_numel(tg_shard_get(s, 3)) == 3);
  /* replication through tg_to of a tuple */
  tg_tensor r = tg_to(x, "CPU:0,CPU:1,CPU:2");
  CHECK(tg_shard_count(r) == 3 && tg_shard_axis(r) == TG_SHARD_NONE);
  CHECK(maxdiff(tg_shard_get(r, 2), x) == 0);
  /* shard_like */
  tg_tensor y = realized(tg_randn(TG_SHAPE(10, 3), NULL));
  tg_tensor yl = tg_shard_like(y, s);
  CHECK(tg_shard_axis(yl) == 0 && tg_numel(tg_shard_get(yl, 3)) == 3);
  CHECK(maxdiff(yl, y) == 0);
  /* sharded again on its own tuple: the whole tensor split anew (it came out as its first shard
   * split, 3 x 3 rows of 10; replicating left it sharded) */
  tg_tensor s2 = tg_shard(s, DEV4, 4, 0), s3 = tg_shard(s, DEV4, 4, TG_SHARD_NONE), s4 = tg_shard(s, DEV4, 4, 1);
  CHECK(tg_numel(s2) == 30 && maxdiff(s2, x) == 0 && tg_numel(tg_shard_get(s2, 0)) == 9);
  CHECK(tg_shard_axis(s3) == TG_SHARD_NONE && maxdiff(tg_shard_get(s3, 3), x) == 0);
  CHECK(tg_shard_axis(s4) == 1 && maxdiff(s4, x) == 0);
  /* gathering keeps every bit: -0.0 stays -0.0 (a join padded with +0.0 and summed made it +0.0),
   * read back, moved to one device, or resharded by an op */
  const float nz[6] = {-0.0f, 1, -0.0f, 2, -0.0f, 3};
  tg_tensor z = tg_from_data(nz, TG_SHAPE(3, 2), NULL), zs = tg_shard(z, DEV4, 3, 0);
  float back[6];
  CHECK(tg_data(zs, back, sizeof back) == TG_OK && signbit(back[0]) && signbit(back[2]) && signbit(back[4]));
  CHECK(tg_data(tg_to(zs, "CPU:1"), back, sizeof back) == TG_OK && signbit(back[0]) && signbit(back[4]));
  tg_tensor ones = tg_shard(tg_ones(TG_SHAPE(3, 2), NULL), DEV4, 2, 1);
  CHECK(tg_data(tg_reciprocal(tg_mul(ones, tg_shard(z, DEV4, 2, 0))), back, sizeof back) == TG_OK);
  CHECK(isinf(back[0]) && back[0] < 0 && isinf(back[4]) && back[4] < 0 && back[1] == 1);
  END;
}

TEST(shard_errors) {
  BEGIN;
  tg_tensor x = tg_ones(TG_SHAPE(4, 4), NULL);
  CHECK(!tg_valid(tg_shard(x, DEV2, 2, 2)));
  CHECK_ERR(TG_ERR_INVALID, "tg_shard", "axis 2");
  CHECK(!tg_valid(tg_shard(x, DEV2, 0, 0)));
  CHECK_ERR(TG_ERR_INVALID, "tg_shard");
  const char *dup[] = {"CPU:1", "CPU:1"};
  CHECK(!tg_valid(tg_shard(x, dup, 2, 0)));
  CHECK_ERR(TG_ERR_INVALID, "tg_shard", "twice");
  const char *none[] = {"CPU:1", NULL};
  CHECK(!tg_valid(tg_shard(x, none, 2, 0)));
  CHECK_ERR(TG_ERR_INVALID, "tg_shard", "device 1 is NULL");
  /* an unknown device: the error is tg_shard's (it was device_get's), as tg_to's is */
  const char *bogus[] = {"CPU:0", "BOGUS"};
  CHECK(!tg_valid(tg_shard(x, bogus, 2, 0)));
  CHECK_ERR(TG_ERR_INVALID, "tg_shard: device 1: unknown device 'BOGUS' (available: CPU");
  tg_tensor s = tg_shard(x, DEV2, 2, 0);
  CHECK(!tg_valid(tg_add(s, x)));
  CHECK_ERR(TG_ERR_INVALID, "tg_add");
  CHECK(!tg_valid(tg_shard(tg_scalar(3, NULL), DEV2, 2, 0)));
  CHECK_ERR(TG_ERR_INVALID, "tg_shard", "0-d tensor has no axis");
  CHECK(!tg_valid(tg_to(x, ",CPU:1")));
  CHECK_ERR(TG_ERR_INVALID, "member 0", "is empty");
  /* a tuple too long for a device's fixed-size name: tg_device_of still names every member, so
   * tg_to(t, tg_device_of(x)) lands on all of them (it kept the first 24 of 40) */
  enum { NT = 40 };
  const char *many[NT];
  char names[NT][16];
  for (int i = 0; i < NT; i++) snprintf(names[i], sizeof names[i], "CPU:%d", i), many[i] = names[i];
  tg_tensor big = tg_shard(tg_ones(TG_SHAPE(NT, 2), NULL), many, NT, 0);
  CHECK(tg_shard_count(big) == NT);
  tg_tensor moved = tg_to(tg_ones(TG_SHAPE(3), NULL), tg_device_of(big));
  CHECK_MSG(tg_shard_count(moved) == NT, "%d shards", tg_shard_count(moved));
  CHECK(tg_valid(tg_add(tg_sum(big, NULL, 0, false), tg_sum(moved, NULL, 0, false))));
  /* and ops that make tensors on a tensor's device use the whole name too (they failed on the
   * shortened one: "unknown device 'CPU:23,...'") */
  CHECK(tg_shard_count(tg_zeros_like(big, NULL)) == NT);
  tg_tensor cs = tg_cumsum(big, 1);
  CHECK_MSG(tg_valid(cs) && tg_shard_count(cs) == NT, "%s", tg_last_error());
  tg_clear_error();
  CHECK(tg_shard_count(tg_triu(big, 0)) == NT);
  END;
}

/* A shard over one device is tinygrad's `to` that device: a plain tensor there, which mixes with the
 * other tensors on it (a tuple of one was named "CPU:1" yet refused them: "different devices (CPU:1
 * and CPU:1)"), and so is a device tuple of one ("CPU:1,"). */
TEST(shard_one_device_is_to) {
  BEGIN;
  const char *one[] = {"CPU:1"};
  tg_tensor x = realized(tg_randn(TG_SHAPE(3, 2), NULL)), e = tg_eye(2, 2, TG_OPTS(.device = "CPU:1"));
  tg_tensor s = tg_shard(x, one, 1, 1);
  CHECK(strcmp(tg_device_of(s), "CPU:1") == 0 && tg_shard_count(s) == 1 && tg_shard_axis(s) == TG_SHARD_NONE);
  tg_tensor m = tg_matmul(s, e);
  CHECK_MSG(tg_valid(m), "%s", tg_last_error());
  CHECK(maxdiff(m, x) == 0);
  tg_tensor q, r;
  CHECK(tg_qr(s, &q, &r) == TG_OK && maxdiff(tg_matmul(q, r), x) < 1e-5);
  tg_tensor t = tg_to(x, "CPU:1,");
  CHECK(strcmp(tg_device_of(t), "CPU:1") == 0 && tg_shard_count(t) == 1 && maxdiff(tg_add(t, s), tg_mul_s(x, 2)) == 0);
  /* a sharded tensor sharded onto one device is gathered there */
  tg_tensor g = tg_shard(tg_shard(x, DEV2, 2, 0), one, 1, 0);
  CHECK(strcmp(tg_device_of(g), "CPU:1") == 0 && maxdiff(g, x) == 0 && maxdiff(tg_sub(g, s), tg_zeros_like(x, NULL)) == 0);
  CHECK(!tg_valid(tg_shard(x, one, 1, 2)));
  CHECK_ERR(TG_ERR_INVALID, "tg_shard", "axis 2");
  END;
}

TEST(elementwise) {
  BEGIN;
  tg_tensor a = realized(tg_randn(TG_SHAPE(7, 6), NULL)), b = realized(tg_randn(TG_SHAPE(7, 6), NULL));
  tg_tensor want = tg_add(tg_mul(a, b), tg_exp(a));
  int axes[] = {TG_SHARD_NONE, 0, 1};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      tg_tensor sa = tg_shard(a, DEV4, 4, axes[i]), sb = tg_shard(b, DEV4, 4, axes[j]);
      tg_tensor got = tg_add(tg_mul(sa, sb), tg_exp(sa));
      CHECK_MSG(maxdiff(got, want) < 1e-6, "axes %d %d", axes[i], axes[j]);
      /* the result takes the first sharded input's sharding */
      CHECK(tg_shard_axis(got) == (axes[i] >= 0 ? axes[i] : axes[j]));
    }
  /* a scalar with a sharded tensor */
  tg_tensor s = tg_shard(a, DEV4, 4, 0);
  CHECK(maxdiff(tg_add_s(s, 2.5), tg_add_s(a, 2.5)) < 1e-6);
  END;
}

TEST(reduce) {
  BEGIN;
  tg_tensor a = realized(tg_randn(TG_SHAPE(9, 5), NULL));
  for (int ax_i = 0, ax; ax_i < 3 && (ax = SHARD_AXES[ax_i], 1); ax_i++) {
    tg_tensor s = tg_shard(a, DEV4, 4, ax);
    for (int r = 0; r < 2; r++) {
      int axis[] = {r};
      CHECK_MSG(maxdiff(tg_sum(s, axis, 1, false), tg_sum(a, axis, 1, false)) < 1e-5, "sum shard %d over %d", ax, r);
      CHECK_MSG(maxdiff(tg_max(s, axis, 1, true), tg_max(a, axis, 1, true)) == 0, "max shard %d over %d", ax, r);
    }
    CHECK(maxdiff(tg_sum(s, NULL, 0, false), tg_sum(a, NULL, 0, false)) < 1e-5);
    CHECK(maxdiff(tg_mean(s, NULL, 0, false), tg_mean(a, NULL, 0, false)) < 1e-6);
  }
  END;
}

TEST(movement) {
  BEGIN;
  tg_tensor a = realized(tg_randn(TG_SHAPE(8, 6), NULL));
  for (int ax_i = 0, ax; ax_i < 3 && (ax = SHARD_AXES[ax_i], 1); ax_i++) {
    tg_tensor s = tg_shard(a, DEV4, 4, ax);
    CHECK(maxdiff(tg_reshape(s, TG_SHAPE(48)), tg_reshape(a, TG_SHAPE(48))) == 0);
    CHECK(maxdiff(tg_reshape(s, TG_SHAPE(4, 2, 6)), tg_reshape(a, TG_SHAPE(4, 2, 6))) == 0);
    CHECK(maxdiff(tg_reshape(s, TG_SHAPE(6, 8)), tg_reshape(a, TG_SHAPE(6, 8))) == 0);
    CHECK(maxdiff(tg_permute(s, (int[]){1, 0}, 2), tg_permute(a, (int[]){1, 0}, 2)) == 0);
    CHECK(maxdiff(tg_shrink(s, TG_SHAPE(1, 7, 2, 5)), tg_shrink(a, TG_SHAPE(1, 7, 2, 5))) == 0);
    CHECK(maxdiff(tg_pad(s, TG_SHAPE(1, 2, 3, 0), 0), tg_pad(a, TG_SHAPE(1, 2, 3, 0), 0)) == 0);
    CHECK(maxdiff(tg_flip(s, (int[]){0, 1}, 2), tg_flip(a, (int[]){0, 1}, 2)) == 0);
    tg_tensor e = tg_reshape(s, TG_SHAPE(8, 1, 6));
    CHECK(maxdiff(tg_expand(e, TG_SHAPE(8, 3, 6)), tg_expand(tg_reshape(a, TG_SHAPE(8, 1, 6)), TG_SHAPE(8, 3, 6))) == 0);
  }
  /* the sharded axis kept by a merge: still sharded */
  tg_tensor s0 = tg_shard(a, DEV4, 4, 0);
  CHECK(tg_shard_axis(tg_reshape(s0, TG_SHAPE(48))) == 0);
  CHECK(tg_shard_axis(tg_permute(s0, (int[]){1, 0}, 2)) == 1);
  END;
}


TEST(matmul_9) {
  BEGIN;
  tg_tensor x = realized(tg_randn(TG_SHAPE(8, 12), NULL)), w = realized(tg_randn(TG_SHAPE(12, 4), NULL));
  tg_tensor want = tg_matmul(x, w);
  int axes[] = {TG_SHARD_NONE, 0, 1};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      tg_tensor got = tg_matmul(tg_shard(x, DEV4, 4, axes[i]), tg_shard(w, DEV4, 4, axes[j]));
      CHECK_MSG(maxdiff(got, want) < 1e-4, "X axis %d, W axis %d: %g", axes[i], axes[j], maxdiff(got, want));
    }
  END;
}

/* gradients of a small MLP with the batch sharded and the weights replicated, against one device */
TEST(autograd_data_parallel) {
  BEGIN;
  tg_tensor x = realized(tg_randn(TG_SHAPE(10, 6), NULL)), w1 = realized(tg_randn(TG_SHAPE(6, 5), NULL));
  tg_tensor w2 = realized(tg_randn(TG_SHAPE(5, 3), NULL));
  tg_tensor y = realized(tg_cast(tg_arange(0, 10, 1, NULL), TG_INT32));
  y = realized(tg_mod(y, tg_const_like(y, 3)));
  tg_tensor ws[2] = {w1, w2}, g1[2], g2[2];
  tg_tensor loss1 = tg_sparse_categorical_crossentropy(tg_matmul(tg_relu(tg_matmul(x, w1)), w2), y, NULL);
  CHECK(tg_gradient(loss1, ws, 2, g1) == TG_OK);
  tg_tensor sx = tg_shard(x, DEV4, 4, 0), sy = tg_shard(y, DEV4, 4, 0);
  tg_tensor sw[2] = {tg_shard(w1, DEV4, 4, TG_SHARD_NONE), tg_shard(w2, DEV4, 4, TG_SHARD_NONE)};
  tg_tensor loss2 = tg_sparse_categorical_crossentropy(tg_matmul(tg_relu(tg_matmul(sx, sw[0])), sw[1]), sy, NULL);
  CHECK(tg_gradient(loss2, sw, 2, g2) == TG_OK);
  CHECK(maxdiff(loss2, loss1) < 1e-5);
  for (int i = 0; i < 2; i++) {
    CHECK(tg_shard_axis(g2[i]) == TG_SHARD_NONE && tg_shard_count(g2[i]) == 4);
    CHECK_MSG(maxdiff(g2[i], g1[i]) < 1e-5, "grad %d: %g", i, maxdiff(g2[i], g1[i]));
    /* every replica holds the whole gradient */
    CHECK(maxdiff(tg_shard_get(g2[i], 3), g1[i]) < 1e-5);
  }
  /* tg_backward finds sharded leaves too */
  tg_tensor p = realized(tg_shard(w1, DEV2, 2, 1));
  tg_set_requires_grad(p, true);
  tg_tensor l3 = tg_sum(tg_mul(tg_matmul(tg_shard(x, DEV2, 2, TG_SHARD_NONE), p), tg_matmul(x, w1) /* wrong device */), NULL, 0, false);
  CHECK(!tg_valid(l3));
  tg_clear_error();
  tg_tensor l4 = tg_sum(tg_square(tg_matmul(tg_shard(x, DEV2, 2, TG_SHARD_NONE), p)), NULL, 0, false);
  CHECK(tg_backward(l4) == TG_OK);
  tg_tensor w1g = realized(tg_detach(w1));
  tg_set_requires_grad(w1g, true);
  tg_tensor l5 = tg_sum(tg_square(tg_matmul(x, w1g)), NULL, 0, false);
  CHECK(tg_backward(l5) == TG_OK);
  CHECK(tg_shard_axis(tg_grad(p)) == 1);
  CHECK(maxdiff(tg_grad(p), tg_grad(w1g)) < 1e-4);
  tg_zero_grad(p), tg_zero_grad(w1g);
  END;
}


/* kernels (and results) of a sum over the sharded axis: per-shard reductions, then the allreduce */
static uint64_t allreduce_kernels(tg_tensor x, int ring, tg_tensor want, double *diff) {
  tg_context_begin();
  tg_context_set_int("RING", ring);
  tg_tensor s = tg_shard(x, DEV4, 4, 0);
  tg_realize(s);
  tg_global_counters_reset();
  tg_tensor r = tg_sum(s, (int[]){0}, 1, false);
  tg_realize(r);
  uint64_t k = tg_global_counters().kernel_count;
  tg_context_end();
  *diff = maxdiff(r, want);
  return k;
}

/* A sharded value read before its backward (the loss printed first, an intermediate inspected)
 * still passes the gradient on to the sharded leaves, as one device's does: its handles held the
 * realized shards without their graph, and the gradient was none with status OK. */
TEST(autograd_after_reading) {
  BEGIN;
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  const float d[6] = {1, 2, 3, 4, 5, 6};
  const int axes[2] = {0, TG_SHARD_NONE};
  for (int a = 0; a < 2; a++) {
    tg_tensor s = tg_shard(tg_from_data(d, TG_SHAPE(6), NULL), DEV2, 2, axes[a]);
    CHECK(tg_realize(s) == TG_OK);
    tg_set_requires_grad(s, true);
    tg_tensor y = tg_mul(s, s);
    float yv[6];
    CHECK(tg_data(y, yv, sizeof yv) == TG_OK && yv[5] == 36);
    CHECK(tg_backward(tg_sum(y, TG_ALL_AXES, false)) == TG_OK);
    tg_tensor g = tg_grad(s);
    float gv[6] = {0};
    CHECK_MSG(tg_valid(g) && tg_data(g, gv, sizeof gv) == TG_OK, "axis %d: no gradient", axes[a]);
    for (int i = 0; i < 6; i++) CHECK_MSG(gv[i] == 2 * d[i], "axis %d: grad[%d] = %g", axes[a], i, gv[i]);
  }
  /* data-parallel: the batch sharded, the weight replicated, the loss read before backward */
  float xd[8], wd[4] = {0.5f, -1, 2, 0.25f};
  for (int i = 0; i < 8; i++) xd[i] = (float)i - 3;
  tg_tensor g1 = {0}, g2 = {0};
  for (int sharded = 0; sharded < 2; sharded++) {
    tg_tensor x = tg_from_data(xd, TG_SHAPE(4, 2), NULL), w = tg_from_data(wd, TG_SHAPE(2, 2), NULL);
    if (sharded) x = tg_shard(x, DEV2, 2, 0), w = tg_shard(w, DEV2, 2, TG_SHARD_NONE);
    CHECK(tg_realize(x) == TG_OK && tg_realize(w) == TG_OK);
    tg_set_requires_grad(w, true);
    tg_tensor loss = tg_sum(tg_mul(tg_matmul(x, w), tg_matmul(x, w)), TG_ALL_AXES, false);
    double lv = 0;
    CHECK(tg_item(loss, &lv) == TG_OK);
    CHECK(tg_backward(loss) == TG_OK);
    if (sharded) g2 = tg_to(tg_grad(w), "CPU:0");
    else g1 = tg_grad(w);
  }
  CHECK_MSG(tg_valid(g1) && tg_valid(g2) && maxdiff(g1, g2) < 1e-5, "data-parallel gradient after reading the loss");
  /* and after optimizer steps replaced the weight's node: every step's gradient arrives */
  tg_tensor wf[2] = {{0}, {0}};
  for (int sharded = 0; sharded < 2; sharded++) {
    tg_tensor w = tg_from_data(wd, TG_SHAPE(2, 2), NULL);
    if (sharded) w = tg_shard(w, DEV2, 2, TG_SHARD_NONE);
    CHECK(tg_realize(w) == TG_OK);
    tg_set_requires_grad(w, true);
    tg_optim *o = tg_optim_sgd(&w, 1, TG_SGD_OPTS(.lr = 0.05));
    for (int step = 0; step < 3; step++) {
      tg_scope_begin();
      tg_tensor x = tg_from_data(xd, TG_SHAPE(4, 2), NULL);
      if (sharded) x = tg_shard(x, DEV2, 2, 0);
      tg_optim_zero_grad(o);
      tg_tensor loss = tg_sum(tg_matmul(x, w), TG_ALL_AXES, false);
      double lv = 0;
      CHECK(tg_item(loss, &lv) == TG_OK && tg_backward(loss) == TG_OK);
      tg_tensor g = tg_grad(w);
      CHECK_MSG(tg_valid(g), "sharded %d step %d: no gradient", sharded, step);
      CHECK(tg_optim_step(o) == TG_OK);
      tg_scope_end();
    }
    wf[sharded] = sharded ? tg_to(w, "CPU:0") : w;
    tg_optim_free(o);
  }
  CHECK_MSG(maxdiff(wf[0], wf[1]) < 1e-5, "weights after 3 steps differ by %g", maxdiff(wf[0], wf[1]));
  tg_context_end();
  END;
}

/* A stepped slice of the sharded axis, given to setitem on a view of a sharded tensor, selects a
 * gathered copy: the write would not reach the shards and was lost with status OK; it is refused.
 * Step 1 there still writes through. */
TEST(setitem_view_stepped_refused) {
  BEGIN;
  float d[12];
  for (int i = 0; i < 12; i++) d[i] = (float)i;
  tg_tensor x = tg_shard(tg_from_data(d, TG_SHAPE(2, 6), NULL), DEV2, 2, 1);
  CHECK(tg_realize(x) == TG_OK);
  tg_tensor v = tg_permute(x, TG_AXES(1, 0)); /* x.T: the sharded axis first */
  CHECK(tg_setitem_s(v, TG_INDEX(TG_IX_SLICE(0, 6, 2)), -1) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "gathered copy");
  tg_clear_error();
  float o[12];
  CHECK(tg_data(x, o, sizeof o) == TG_OK && o[0] == 0 && o[2] == 2);
  CHECK(tg_setitem_s(v, TG_INDEX(TG_IX_SLICE(0, 3, 1)), -1) == TG_OK);
  CHECK(tg_data(x, o, sizeof o) == TG_OK && o[0] == -1 && o[2] == -1 && o[3] == 3 && o[6] == -1);
  END;
}

TEST(allreduce_ring_vs_naive) {
  BEGIN;
  tg_tensor x = realized(tg_randn(TG_SHAPE(8, 1000), NULL));
  tg_tensor want = tg_sum(x, (int[]){0}, 1, false);
  double dn, dr;
  uint64_t kn = allreduce_kernels(x, 0, want, &dn), kr = allreduce_kernels(x, 2, want, &dr);
  CHECK_MSG(dn < 1e-4 && dr < 1e-4, "naive %g ring %g", dn, dr);
  /* naive: 4 per-shard sums, then on each device one kernel adding the 3 copies to its own part */
  CHECK_MSG(kn == 8, "naive: %llu kernels", (unsigned long long)kn);
  /* ring: 4 sums, per chunk its slice made contiguous for the first hop and 3 reduce steps, and
   * one kernel per device joining the 4 chunks */
  CHECK_MSG(kr == 24, "ring: %llu kernels", (unsigned long long)kr);
  /* ring and naive agree to rounding on a bigger one, chosen by size (RING=1: ring above 256000) */
  tg_tensor y = realized(tg_randn(TG_SHAPE(4, 300000), NULL));
  tg_tensor wy = tg_sum(y, (int[]){0}, 1, false);
  uint64_t ka = allreduce_kernels(y, 1, wy, &dr);
  CHECK_MSG(ka == 24 && dr < 1e-4, "auto: %llu kernels, diff %g", (unsigned long long)ka, dr);
  END;
}


TEST(conv2d_batch_sharded) {
  BEGIN;
  tg_tensor x = realized(tg_randn(TG_SHAPE(4, 3, 8, 8), NULL)), w = realized(tg_randn(TG_SHAPE(5, 3, 3, 3), NULL));
  tg_tensor b = realized(tg_randn(TG_SHAPE(5), NULL));
  tg_tensor ws[2] = {w, b}, g1[2], g2[2];
  tg_tensor want = tg_conv2d(x, w, b, TG_CONV2D_OPTS(.padding = {1}, .npadding = 1));
  CHECK(tg_gradient(tg_sum(tg_square(want), NULL, 0, false), ws, 2, g1) == TG_OK);
  tg_tensor sw[2] = {tg_shard(w, DEV2, 2, TG_SHARD_NONE), tg_shard(b, DEV2, 2, TG_SHARD_NONE)};
  tg_tensor got = tg_conv2d(tg_shard(x, DEV2, 2, 0), sw[0], sw[1], TG_CONV2D_OPTS(.padding = {1}, .npadding = 1));
  CHECK(tg_shard_axis(got) == 0);
  CHECK(tg_gradient(tg_sum(tg_square(got), NULL, 0, false), sw, 2, g2) == TG_OK);
  CHECK(maxdiff(got, want) < 1e-4);
  for (int i = 0; i < 2; i++) CHECK_MSG(maxdiff(g2[i], g1[i]) < 1e-3, "grad %d: %g", i, maxdiff(g2[i], g1[i]));
  END;
}

/* A convolution whose weight is sharded (on cout or cin), with the input replicated or split on the
 * batch or on its channels: outputs and the gradients of input, weight and bias against one device.
 * Sizes large enough for the channels-last form, whose weight gradient comes from a custom
 * backward that per-shard registration cannot place when the output is split differently. */
TEST(conv2d_weight_sharded) {
  BEGIN;
  tg_tensor x = realized(tg_randn(TG_SHAPE(4, 16, 10, 10), NULL)), w = realized(tg_randn(TG_SHAPE(32, 16, 3, 3), NULL));
  tg_tensor b = realized(tg_randn(TG_SHAPE(32), NULL));
  tg_tensor all[3] = {x, w, b}, g1[3], g2[3];
  tg_tensor want = tg_conv2d(x, w, b, NULL);
  CHECK(tg_gradient(tg_sum(tg_square(want), NULL, 0, false), all, 3, g1) == TG_OK);
  for (int wa = -1; wa < 2; wa++)
    for (int xa = -1; xa < 2; xa++) {
      tg_tensor sx = tg_shard(x, DEV2, 2, xa < 0 ? TG_SHARD_NONE : xa), sw = tg_shard(w, DEV2, 2, wa < 0 ? TG_SHARD_NONE : wa);
      tg_tensor sb = tg_shard(b, DEV2, 2, wa == 0 ? 0 : TG_SHARD_NONE);
      tg_tensor got = tg_conv2d(sx, sw, sb, NULL);
      tg_tensor ins[3] = {sx, sw, sb};
      tg_status st = tg_gradient(tg_sum(tg_square(got), NULL, 0, false), ins, 3, g2);
      CHECK_MSG(st == TG_OK, "weight axis %d, input axis %d: %s", wa, xa, tg_last_error());
      if (st != TG_OK) continue;
      CHECK_MSG(maxdiff(got, want) < 1e-3, "weight axis %d, input axis %d: output %g", wa, xa, maxdiff(got, want));
      for (int i = 0; i < 3; i++)
        CHECK_MSG(tg_valid(g2[i]) && maxdiff(g2[i], g1[i]) < 1e-5 * (1 + maxdiff(g1[i], tg_zeros_like(g1[i], NULL))),
                  "weight axis %d, input axis %d: gradient %d differs by %g", wa, xa, i, tg_valid(g2[i]) ? maxdiff(g2[i], g1[i]) : -1.0);
    }
  END;
}

TEST(embedding) {
  BEGIN;
  tg_tensor w = realized(tg_randn(TG_SHAPE(10, 4), NULL));
  int32_t ids[] = {1, 3, 3, 9, 0, 2, 7, 7};
  tg_tensor idx = tg_from_data(ids, TG_SHAPE(2, 4), TG_OPTS(.dtype = TG_INT32));
  tg_tensor g1, g2;
  tg_tensor want = tg_index(w, idx);
  CHECK(tg_gradient(tg_sum(tg_square(want), NULL, 0, false), &w, 1, &g1) == TG_OK);
  for (int wa = -1; wa < 1; wa++)
    for (int ia = -1; ia < 1; ia++) {
      tg_tensor sw = tg_shard(w, DEV2, 2, wa < 0 ? TG_SHARD_NONE : wa), si = tg_shard(idx, DEV2, 2, ia < 0 ? TG_SHARD_NONE : ia);
      tg_tensor got = tg_index(sw, si);
      CHECK(tg_gradient(tg_sum(tg_square(got), NULL, 0, false), &sw, 1, &g2) == TG_OK);
      CHECK_MSG(maxdiff(got, want) == 0, "weight axis %d, idx axis %d", wa, ia);
      CHECK_MSG(maxdiff(g2, g1) < 1e-5, "grad: weight axis %d, idx axis %d", wa, ia);
    }
  END;
}


/* ops with a custom gradient on every combination of shardings, against one device: gather (its
 * gradient on the shards only where each gathers from its own shard along an unsplit axis: a
 * replicated x with a sharded index scattered every shard's gradient into the top rows), float mod
 * (elementwise: a replicated or differently split y is resharded like the output, as the forward
 * does; it failed to broadcast, or left x without a gradient), sigmoid and abs */
TEST(custom_gradients_any_sharding) {
  BEGIN;
  tg_tensor x = realized(tg_randn(TG_SHAPE(6, 4), NULL));
  int32_t iv[] = {0, 1, 1, 3, 2, 0, 3, 3, 1, 0, 2, 2, 1, 1, 1, 0, 0, 3, 2, 1, 3, 0, 0, 2};
  tg_tensor idx1 = tg_from_data(iv, TG_SHAPE(6, 4), TG_OPTS(.dtype = TG_INT32));
  int32_t jv[] = {5, 0, 2, 1, 3, 3, 4, 0, 1, 2, 5, 4, 0, 0, 1, 2, 3, 4, 5, 5, 2, 1, 0, 3};
  tg_tensor idx0 = tg_from_data(jv, TG_SHAPE(6, 4), TG_OPTS(.dtype = TG_INT32));
  tg_tensor y = realized(tg_add_s(tg_abs(tg_randn(TG_SHAPE(6, 4), NULL)), 0.5)), y1 = realized(tg_add_s(tg_abs(tg_randn(TG_SHAPE(1, 4), NULL)), 0.5));
  for (int nd = 2; nd <= 3; nd++)
    for (int xa = -1; xa < 2; xa++)
      for (int ia = -1; ia < 2; ia++) {
        for (int dim = 0; dim < 2; dim++) {
          tg_tensor idx = dim ? idx1 : idx0, g1, g2;
          tg_tensor want = tg_gather(x, dim, idx);
          CHECK(tg_gradient(tg_sum(tg_mul(want, want), NULL, 0, false), &x, 1, &g1) == TG_OK);
          tg_tensor sx = tg_shard(x, DEV4, nd, xa < 0 ? TG_SHARD_NONE : xa), si = tg_shard(idx, DEV4, nd, ia < 0 ? TG_SHARD_NONE : ia);
          tg_tensor got = tg_gather(sx, dim, si);
          CHECK(tg_gradient(tg_sum(tg_mul(got, got), NULL, 0, false), &sx, 1, &g2) == TG_OK);
          CHECK_MSG(maxdiff(got, want) == 0, "gather dim %d on %d devices: x axis %d, index axis %d", dim, nd, xa, ia);
          CHECK_MSG(maxdiff(g2, g1) < 1e-5, "gather grad dim %d on %d devices: x axis %d, index axis %d: %g", dim, nd, xa, ia, maxdiff(g2, g1));
        }
        for (int b = 0; b < 2; b++) {
          tg_tensor yy = b ? y1 : y, t[2] = {x, yy}, g1[2], g2[2];
          tg_tensor want = tg_mod(x, yy);
          CHECK(tg_gradient(tg_sum(tg_mul(want, want), NULL, 0, false), t, 2, g1) == TG_OK);
          tg_tensor st[2] = {tg_shard(x, DEV4, nd, xa < 0 ? TG_SHARD_NONE : xa),
                             tg_shard(yy, DEV4, nd, ia < 0 || (b && ia == 0) ? TG_SHARD_NONE : ia)};
          tg_tensor got = tg_mod(st[0], st[1]);
          CHECK_MSG(tg_gradient(tg_sum(tg_mul(got, got), NULL, 0, false), st, 2, g2) == TG_OK, "%s", tg_last_error());
          tg_clear_error();
          CHECK_MSG(maxdiff(got, want) < 1e-6, "mod on %d devices: x axis %d, y axis %d%s", nd, xa, ia, b ? " (1, 4)" : "");
          for (int k = 0; k < 2; k++)
            CHECK_MSG(tg_valid(g2[k]) && maxdiff(g2[k], g1[k]) < 1e-4, "mod grad %d on %d devices: x axis %d, y axis %d%s", k, nd, xa, ia,
                      b ? " (1, 4)" : "");
        }
      }
  for (int xa = -1; xa < 2; xa++) {
    tg_tensor sx = tg_shard(x, DEV2, 2, xa < 0 ? TG_SHARD_NONE : xa), g1, g2;
    tg_tensor want = tg_add(tg_sigmoid(x), tg_abs(x)), got = tg_add(tg_sigmoid(sx), tg_abs(sx));
    CHECK(tg_gradient(tg_sum(tg_mul(want, x), NULL, 0, false), &x, 1, &g1) == TG_OK);
    CHECK(tg_gradient(tg_sum(tg_mul(got, sx), NULL, 0, false), &sx, 1, &g2) == TG_OK);
    CHECK_MSG(maxdiff(g2, g1) < 1e-5, "sigmoid + abs grad, x axis %d", xa);
  }
  END;
}

/* a layer's parameters replicated on DEV2 in place (the layer keeps the new handles) */
static void replicate2(tg_tensor *const *p, int n) {
  for (int i = 0; i < n; i++) {
    tg_tensor r = tg_shard(*p[i], DEV2, 2, TG_SHARD_NONE);
    CHECK(tg_realize(r) == TG_OK);
    tg_free(*p[i]);
    *p[i] = r;
    tg_persist(r);
  }
}

/* BatchNorm in training mode with the batch sharded: the batch statistics reduce over the sharded
 * axis, so they are allreduced (synced BatchNorm) and match one device's */
TEST(batchnorm) {
  BEGIN;
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_tensor x = realized(tg_randn(TG_SHAPE(6, 3, 4, 4), NULL));
  tg_nn_batchnorm b1, b2;
  CHECK(tg_nn_batchnorm_init(&b1, 3, NULL) == TG_OK && tg_nn_batchnorm_init(&b2, 3, NULL) == TG_OK);
  tg_tensor want = tg_nn_batchnorm_forward(&b1, x);
  replicate2((tg_tensor *[]){&b2.weight, &b2.bias, &b2.running_mean, &b2.running_var}, 4);
  tg_tensor got = tg_nn_batchnorm_forward(&b2, tg_shard(x, DEV2, 2, 0));
  CHECK(maxdiff(got, want) < 1e-5);
  tg_realize(b1.running_mean), tg_realize(b2.running_mean);
  CHECK(maxdiff(b2.running_mean, b1.running_mean) < 1e-6);
  CHECK(maxdiff(b2.running_var, b1.running_var) < 1e-6);
  tg_context_end();
  tg_nn_batchnorm_free(&b1), tg_nn_batchnorm_free(&b2);
  END;
}

/* Unsynced BatchNorm (tinygrad's UnsyncedBatchNorm): each device normalizes its part of the batch
 * with its own statistics -- against one device normalizing each half alone; the gradients of x
 * and the weight against the halves'; the running statistics take the halves' mean. */
TEST(batchnorm_unsynced) {
  BEGIN;
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_tensor x = realized(tg_randn(TG_SHAPE(8, 3, 4, 4), NULL));
  tg_tensor gy = realized(tg_randn(TG_SHAPE(8, 3, 4, 4), NULL));
  tg_nn_batchnorm h[2], b;
  CHECK(tg_nn_batchnorm_init(&b, 3, TG_BATCHNORM_OPTS(.unsynced = true)) == TG_OK);
  float wv[3] = {0.5f, 1.5f, -2.0f}, bv[3] = {0.1f, -0.2f, 0.3f};
  tg_tensor w0 = tg_from_data(wv, TG_SHAPE(3), NULL), b0 = tg_from_data(bv, TG_SHAPE(3), NULL);
  tg_tensor halves[2], gw[2], gb[2], gx[2];
  for (int i = 0; i < 2; i++) {
    CHECK(tg_nn_batchnorm_init(&h[i], 3, NULL) == TG_OK);
    tg_assign(h[i].weight, w0), tg_assign(h[i].bias, b0);
    CHECK(tg_realize(h[i].weight) == TG_OK && tg_realize(h[i].bias) == TG_OK);
    tg_tensor xi = realized(tg_contiguous(tg_shrink(x, TG_SHAPE(4 * i, 4 * i + 4, 0, 3, 0, 4, 0, 4))));
    halves[i] = tg_nn_batchnorm_forward(&h[i], xi);
    tg_tensor l = tg_sum(tg_mul(halves[i], tg_shrink(gy, TG_SHAPE(4 * i, 4 * i + 4, 0, 3, 0, 4, 0, 4))), NULL, 0, false);
    tg_tensor tg3[3] = {xi, h[i].weight, h[i].bias}, g3[3];
    CHECK(tg_gradient(l, tg3, 3, g3) == TG_OK);
    gx[i] = g3[0], gw[i] = g3[1], gb[i] = g3[2];
  }
  tg_tensor want = tg_cat(halves, 2, 0), want_gx = tg_cat(gx, 2, 0);
  tg_assign(b.weight, w0), tg_assign(b.bias, b0);
  replicate2((tg_tensor *[]){&b.weight, &b.bias, &b.running_mean, &b.running_var}, 4);
  tg_tensor sx = tg_shard(x, DEV2, 2, 0);
  tg_tensor got = tg_nn_batchnorm_forward(&b, sx);
  CHECK(tg_shard_axis(got) == 0);
  tg_tensor tg3[3] = {sx, b.weight, b.bias}, g3[3];
  CHECK(tg_gradient(tg_sum(tg_mul(got, tg_shard(gy, DEV2, 2, 0)), NULL, 0, false), tg3, 3, g3) == TG_OK);
  CHECK_MSG(maxdiff(got, want) < 1e-5, "output: %g", maxdiff(got, want));
  CHECK_MSG(maxdiff(g3[0], want_gx) < 1e-4, "x gradient: %g", maxdiff(g3[0], want_gx));
  CHECK_MSG(maxdiff(g3[1], tg_add(gw[0], gw[1])) < 1e-4, "weight gradient: %g", maxdiff(g3[1], tg_add(gw[0], gw[1])));
  CHECK_MSG(maxdiff(g3[2], tg_add(gb[0], gb[1])) < 1e-4, "bias gradient: %g", maxdiff(g3[2], tg_add(gb[0], gb[1])));
  tg_realize(b.running_mean), tg_realize(b.running_var), tg_realize(h[0].running_mean), tg_realize(h[1].running_mean);
  tg_tensor rm = tg_mul_s(tg_add(h[0].running_mean, h[1].running_mean), 0.5);
  tg_tensor rv = tg_mul_s(tg_add(h[0].running_var, h[1].running_var), 0.5);
  CHECK_MSG(maxdiff(b.running_mean, rm) < 1e-6, "running mean: %g", maxdiff(b.running_mean, rm));
  CHECK_MSG(maxdiff(b.running_var, rv) < 1e-6, "running var: %g", maxdiff(b.running_var, rv));
  /* the synced layer on the same input differs (its statistics are the whole batch's) */
  tg_nn_batchnorm s;
  CHECK(tg_nn_batchnorm_init(&s, 3, NULL) == TG_OK);
  CHECK(maxdiff(tg_nn_batchnorm_forward(&s, x), want) > 1e-3);
  tg_context_end();
  tg_nn_batchnorm_free(&b), tg_nn_batchnorm_free(&h[0]), tg_nn_batchnorm_free(&h[1]), tg_nn_batchnorm_free(&s);
  END;
}

static tg_status jit_step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  tg_tensor h = tg_relu(tg_matmul(in[0], in[1]));
  out[0] = tg_sum(tg_mul(h, h), (int[]){0}, 1, false); /* over the sharded batch: an allreduce */
  out[1] = tg_add_s(h, 1.0);
  return TG_OK;
}

static tg_status jit_colsum(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = tg_sum(in[0], (int[]){0}, 1, false);
  return tg_last_status();
}

TEST(jit_sharded) {
  BEGIN;
  tg_tensor w = realized(tg_randn(TG_SHAPE(5, 3), NULL));
  tg_tensor sw = realized(tg_shard(w, DEV4, 4, TG_SHARD_NONE));
  tg_jit *j = tg_jit_new(jit_step, 2, NULL);
  for (int it = 0; it < 4; it++) {
    tg_scope_begin();
    tg_tensor x = realized(tg_randn(TG_SHAPE(8, 5), NULL));
    tg_tensor sx = realized(tg_shard(x, DEV4, 4, 0));
    tg_tensor out[2], in[2] = {sx, sw};
    CHECK(tg_jit_call(j, in, 2, NULL, 0, out) == TG_OK);
    tg_tensor h = tg_relu(tg_matmul(x, w));
    CHECK_MSG(maxdiff(out[0], tg_sum(tg_mul(h, h), (int[]){0}, 1, false)) < 1e-4, "call %d", it);
    CHECK_MSG(maxdiff(out[1], tg_add_s(h, 1.0)) < 1e-5, "call %d", it);
    CHECK(tg_shard_axis(out[1]) == 0 && tg_shard_axis(out[0]) == TG_SHARD_NONE);
    tg_scope_end();
  }
  CHECK(tg_jit_captured_kernels(j) > 4);
  tg_jit_free(j);
  /* an input sharded otherwise, with shards of the same shapes (6 x 6 on axis 0 over 3 devices,
   * then 2 x 18 on axis 1: shards of 2 x 6 both times), is refused: the replay ran the capture on
   * it and answered the wrong shape */
  tg_jit *js = tg_jit_new(jit_colsum, 1, NULL);
  for (int it = 0; it < 3; it++) {
    tg_tensor o, x6 = realized(tg_shard(realized(tg_randn(TG_SHAPE(6, 6), NULL)), DEV4, 3, 0));
    CHECK(tg_jit_call(js, &x6, 1, NULL, 0, &o) == TG_OK);
  }
  tg_tensor o, x18 = realized(tg_shard(realized(tg_randn(TG_SHAPE(2, 18), NULL)), DEV4, 3, 1));
  CHECK(tg_jit_call(js, &x18, 1, NULL, 0, &o) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_jit_call", "input 0", "sharding");
  tg_jit_free(js);
  END;
}

TEST(rand_on_shards) {
  BEGIN;
  tg_manual_seed(7);
  tg_tensor want = tg_rand(TG_SHAPE(8, 4), NULL);
  tg_realize(want);
  tg_manual_seed(7);
  tg_tensor got = tg_rand(TG_SHAPE(8, 4), TG_OPTS(.device = "CPU:0,CPU:1,CPU:2,CPU:3"));
  CHECK(tg_shard_count(got) == 4);
  CHECK(maxdiff(got, want) == 0);
  /* rand_like of a sharded tensor has its sharding */
  tg_tensor s = tg_shard(want, DEV4, 4, 1);
  tg_tensor rl = tg_rand_like(s, NULL);
  CHECK(tg_shard_axis(rl) == 1 && tg_numel(rl) == 32);
  float v[32];
  CHECK(tg_data(rl, v, sizeof v) == TG_OK);
  bool in01 = true, differ = false;
  for (int i = 0; i < 32; i++) in01 = in01 && v[i] >= 0 && v[i] < 1, differ = differ || v[i] != v[0];
  CHECK(in01 && differ);
  END;
}

TEST(assign_setitem) {
  BEGIN;
  tg_tensor a = realized(tg_randn(TG_SHAPE(10, 4), NULL)), v = realized(tg_randn(TG_SHAPE(10, 4), NULL));
  for (int ax_i = 0, ax; ax_i < 3 && (ax = SHARD_AXES[ax_i], 1); ax_i++) {
    tg_tensor s = realized(tg_shard(a, DEV4, 4, ax));
    CHECK(tg_valid(tg_assign(s, tg_shard(v, DEV4, 4, ax == 0 ? 1 : 0)))); /* a value sharded differently */
    CHECK(tg_realize(s) == TG_OK);
    CHECK(tg_shard_axis(s) == ax);
    CHECK_MSG(maxdiff(s, v) == 0, "assign, axis %d", ax);
    /* rows 2:7 cross the shard boundaries at 3 and 6 */
    tg_tensor want = tg_contiguous(v);
    tg_realize(want);
    CHECK(tg_setitem_s(want, TG_INDEX(TG_IX_SLICE(2, 7, 1)), 5.0) == TG_OK);
    CHECK(tg_setitem_s(s, TG_INDEX(TG_IX_SLICE(2, 7, 1)), 5.0) == TG_OK);
    CHECK_MSG(maxdiff(s, want) == 0, "setitem, axis %d", ax);
    /* reading a shrink across the boundaries */
    CHECK(maxdiff(tg_shrink(s, TG_SHAPE(1, 8, 0, 4)), tg_shrink(want, TG_SHAPE(1, 8, 0, 4))) == 0);
    /* an assign into a view of the sharded tensor writes the tensor (it went into a copy) */
    tg_tensor cols = tg_shrink(s, TG_SHAPE(0, 10, 1, 3));
    CHECK(tg_valid(tg_assign(cols, tg_shard_like(tg_full(TG_SHAPE(10, 2), 7.0, NULL), cols))));
    CHECK(tg_realize(cols) == TG_OK);
    tg_tensor want2 = tg_contiguous(want);
    tg_realize(want2);
    CHECK(tg_setitem_s(want2, TG_INDEX(TG_IX_SLICE(0, 10, 1), TG_IX_SLICE(1, 3, 1)), 7.0) == TG_OK);
    CHECK_MSG(maxdiff(s, want2) == 0, "assign into a view, axis %d", ax);
    /* a setitem through a view of the realized sharded tensor lands in it, as on one device (it went
     * into the view's own copy): a reshape, a getitem and a permute (a reshape that does not keep the
     * sharded axis whole in its shards -- rows in shards of 3 and 1 into pairs, columns into rows of 8
     * -- gathers the tensor first: that view is of the gathered copy) */
    tg_tensor want3 = tg_contiguous(want2);
    tg_realize(want3);
    if (ax < 0) {
      tg_tensor rv = tg_reshape(s, TG_SHAPE(5, 8)), wrv = tg_reshape(want3, TG_SHAPE(5, 8));
      CHECK(tg_setitem_s(rv, TG_INDEX(TG_IX_INT(1)), -1.0) == TG_OK && tg_setitem_s(wrv, TG_INDEX(TG_IX_INT(1)), -1.0) == TG_OK);
    }
    tg_tensor pv = tg_permute(s, (int[]){1, 0}, 2), wpv = tg_permute(want3, (int[]){1, 0}, 2);
    CHECK(tg_setitem_s(pv, TG_INDEX(TG_IX_SLICE(0, 1, 1), TG_IX_SLICE(4, 9, 1)), -2.0) == TG_OK);
    CHECK(tg_setitem_s(wpv, TG_INDEX(TG_IX_SLICE(0, 1, 1), TG_IX_SLICE(4, 9, 1)), -2.0) == TG_OK);
    CHECK(tg_realize(s) == TG_OK && tg_realize(want3) == TG_OK);
    CHECK_MSG(maxdiff(s, want3) == 0, "setitem through views, axis %d", ax);
    /* integer indices into views, and a full shrink (the tensor's own node): a row, a column of a
     * column-sharded tensor (its one shard holding it), through shrinks crossing the boundaries (the
     * write stayed pending in the view's handle, or went into a gathered copy) */
    tg_tensor want4 = tg_contiguous(want3);
    tg_realize(want4);
    struct {
      int64_t b[4];
      tg_index_spec ix[2];
      int n;
    } cases[] = {{{0, 10, 0, 4}, {TG_IX_INT(0)}, 1},
                 {{2, 7, 0, 4}, {TG_IX_ALL, TG_IX_INT(0)}, 2},
                 {{0, 10, 1, 3}, {TG_IX_ALL, TG_IX_INT(-1)}, 2},
                 {{2, 7, 0, 4}, {TG_IX_INT(1), TG_IX_SLICE(1, 3, 1)}, 2}};
    for (int c = 0; c < 4; c++) {
      double val = 40 + c;
      CHECK(tg_setitem_s(tg_shrink(s, cases[c].b, 4), cases[c].ix, cases[c].n, val) == TG_OK);
      CHECK(tg_setitem_s(tg_shrink(want4, cases[c].b, 4), cases[c].ix, cases[c].n, val) == TG_OK);
    }
    /* a getitem view one wide on the sharded axis (it came back gathered: a reshape to its own shape
     * gathered the uneven shards), and an integer with a flipped one-element slice */
    tg_tensor gv = tg_getitem(s, TG_INDEX(TG_IX_SLICE(2, 3, 1))), wgv = tg_getitem(want4, TG_INDEX(TG_IX_SLICE(2, 3, 1)));
    CHECK(tg_setitem_s(gv, NULL, 0, 50) == TG_OK && tg_setitem_s(wgv, NULL, 0, 50) == TG_OK);
    CHECK(tg_setitem_s(tg_shrink(s, TG_SHAPE(0, 3, 0, 4)), TG_INDEX(TG_IX_INT(1), TG_IX_SLICE(3, 2, -1)), 51) == TG_OK);
    CHECK(tg_setitem_s(tg_shrink(want4, TG_SHAPE(0, 3, 0, 4)), TG_INDEX(TG_IX_INT(1), TG_IX_SLICE(3, 2, -1)), 51) == TG_OK);
    /* a one-wide sharded axis beside an integer or a stepped slice of another axis (their reshapes
     * dropped or split size-1 dims and gathered the uneven shards; on axis 0 the integer and the step
     * are on the sharded axis: views of a gathered copy, as documented) */
    if (ax != 0) {
      CHECK(tg_setitem_s(tg_getitem(s, TG_INDEX(TG_IX_INT(2), TG_IX_SLICE(3, 4, 1))), NULL, 0, 52) == TG_OK);
      CHECK(tg_setitem_s(tg_getitem(want4, TG_INDEX(TG_IX_INT(2), TG_IX_SLICE(3, 4, 1))), NULL, 0, 52) == TG_OK);
      CHECK(tg_setitem_s(tg_getitem(s, TG_INDEX(TG_IX_STEP(2), TG_IX_SLICE(1, 2, 1))), NULL, 0, 53) == TG_OK);
      CHECK(tg_setitem_s(tg_getitem(want4, TG_INDEX(TG_IX_STEP(2), TG_IX_SLICE(1, 2, 1))), NULL, 0, 53) == TG_OK);
    }
    CHECK(tg_realize(s) == TG_OK && tg_realize(want4) == TG_OK);
    CHECK_MSG(maxdiff(s, want4) == 0, "setitem with integers through views, axis %d", ax);
  }
  END;
}

/* symbolic sizes on sharded tensors under TinyJit: a dim that is not split between the shards keeps
 * its variable (a KV cache sharded on its batch axis, written and read at start_pos: every replay
 * right, through tg_assign and through tg_setitem); the sharded axis itself splits at the bound
 * value, so such a capture is refused rather than replayed with the captured sizes, and an unbound
 * variable there is an error */
static tg_tensor g_kv;
static int g_kv_setitem;
static tg_status kv_step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_symvar sp = tg_jit_var(0);
  tg_tensor region = tg_shrink(g_kv, TG_SHAPE(0, 4, tg_sym(sp, 0), tg_sym(sp, 1)));
  if (g_kv_setitem) {
    if (tg_setitem(region, NULL, 0, in[0]) != TG_OK) return TG_ERR_INVALID;
  } else if (!tg_valid(tg_assign(region, in[0]))) {
    return TG_ERR_INVALID;
  }
  out[0] = tg_sum(tg_shrink(g_kv, TG_SHAPE(0, 4, 0, tg_sym(sp, 1))), (int[]){1}, 1, false);
  return TG_OK;
}
static tg_status sum_to_n(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_sum(tg_mul_s(tg_shrink(in[0], TG_SHAPE(0, tg_sym(tg_jit_var(0), 0), 0, 3)), 2), (int[]){0}, 1, false);
  return TG_OK;
}

TEST(jit_symbolic_sharded) {
  BEGIN;
  tg_symvar v = tg_variable("sp", 0, 7);
  for (int mode = 0; mode < 4; mode++) { /* tg_assign, then tg_setitem (mode 2, 3); sharded on axis 0 (1, 2) */
    tg_scope_begin();
    bool sharded = mode == 1 || mode == 2;
    g_kv_setitem = mode >= 2;
    g_kv = realized(tg_zeros(TG_SHAPE(4, 8), NULL));
    if (sharded) g_kv = realized(tg_shard(g_kv, DEV2, 2, 0));
    tg_jit *j = tg_jit_new(kv_step, 1, NULL);
    for (int p = 0; p < 7; p++) {
      tg_scope_begin();
      tg_tensor nw = tg_full(TG_SHAPE(4, 1), p + 1, NULL);
      if (sharded) nw = tg_shard(nw, DEV2, 2, 0);
      nw = realized(nw);
      tg_symvar b = tg_var_bind(v, p);
      tg_tensor o;
      CHECK_MSG(tg_jit_call_vars(j, &nw, 1, &b, 1, NULL, 0, &o) == TG_OK, "mode %d sp %d: %s", mode, p, tg_last_error());
      float r[4] = {0};
      CHECK(tg_data(o, r, sizeof r) == TG_OK);
      for (int i = 0; i < 4; i++) CHECK_MSG(r[i] == (p + 1) * (p + 2) / 2, "mode %d sp %d row %d: %g", mode, p, i, r[i]);
      tg_scope_end();
    }
    CHECK(tg_jit_captured_kernels(j) > 0);
    tg_jit_free(j);
    tg_scope_end();
  }
  /* the sharded axis at a symbolic size: right outside the jit, refused by it after the first call */
  float xd[24];
  for (int i = 0; i < 24; i++) xd[i] = (float)i;
  tg_tensor x = realized(tg_shard(tg_from_data(xd, TG_SHAPE(8, 3), NULL), DEV2, 2, 0));
  tg_symvar n = tg_variable("n", 1, 8);
  tg_jit *j = tg_jit_new(sum_to_n, 1, NULL);
  const int vals[] = {5, 6, 7};
  for (int c = 0; c < 3; c++) {
    tg_scope_begin();
    tg_symvar b = tg_var_bind(n, vals[c]);
    tg_tensor o;
    tg_status st = tg_jit_call_vars(j, &x, 1, &b, 1, NULL, 0, &o);
    if (c == 0) {
      float r[3] = {0}, want = 0;
      for (int i = 0; i < vals[c]; i++) want += 2 * xd[3 * i];
      CHECK(st == TG_OK && tg_data(o, r, sizeof r) == TG_OK && r[0] == want);
    } else {
      CHECK_MSG(st != TG_OK && strstr(tg_last_error(), "computed from its bound value"), "call %d", c);
      tg_clear_error();
    }
    tg_scope_end();
  }
  tg_jit_free(j);
  CHECK(!tg_valid(tg_shrink(x, TG_SHAPE(0, tg_sym(n, 0), 0, 3))));
  CHECK_ERR(TG_ERR_INVALID, "tg_shrink", "variable 'n' is unbound", "sharded axis");
  END;
}


/* a tuple of unlike devices: the CPU and OpenCL (PoCL in `make test`); says so when no CL device opens */
/* a write through a region cut at a symbolic size on the sharded axis is refused (its shards hold the
 * bound value's split, and the write read and wrote outside their buffers, status OK); the same
 * region with a plain size writes (a symbolic size on another axis: jit_symbolic_sharded) */
TEST(symbolic_region_on_sharded_axis) {
  BEGIN;
  float d[24];
  for (int i = 0; i < 24; i++) d[i] = (float)(i + 1);
  tg_symvar v = tg_var_bind(tg_variable("cols", 0, 6), 3);
  tg_tensor t = realized(tg_shard(tg_from_data(d, TG_SHAPE(4, 6), NULL), DEV2, 2, 1));
  tg_tensor e = tg_shard(tg_full(TG_SHAPE(4, 1), -1, NULL), DEV2, 2, TG_SHARD_NONE);
  CHECK(!tg_valid(tg_assign(tg_shrink(t, TG_SHAPE(0, 4, 0, tg_sym(v, 0))), tg_expand(e, TG_SHAPE(4, tg_sym(v, 0))))));
  CHECK_STR_CONTAINS(tg_last_error(), "the value has a symbolic size on the sharded axis (1)");
  tg_clear_error();
  float got[24];
  CHECK(tg_data(t, got, sizeof got) == TG_OK && memcmp(got, d, sizeof d) == 0);
  tg_tensor ok = tg_assign(tg_shrink(t, TG_SHAPE(0, 4, 0, 3)), tg_expand(e, TG_SHAPE(4, 3)));
  CHECK_MSG(tg_valid(ok), "%s", tg_last_error());
  CHECK(tg_realize(t) == TG_OK && tg_data(t, got, sizeof got) == TG_OK);
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 3; c++) CHECK_MSG(got[r * 6 + c] == -1, "row %d col %d: %g", r, c, got[r * 6 + c]);
  CHECK(got[3] == 4 && got[23] == 24);
  END;
}

/* tg_svd of a tensor sharded over one device: the SVD, or an error naming tg_svd with none results
 * (an inner op failed on it and the Jacobi rounds wrote past a buffer sized for none's dtype) */
TEST(svd_one_device_shard) {
  BEGIN;
  tg_tensor x = realized(tg_from_data((float[]){3, 1, 1, 2}, TG_SHAPE(2, 2), NULL));
  tg_tensor u = {1}, s = {1}, vt = {1};
  tg_status st = tg_svd(tg_shard(x, DEV2, 1, 1), false, &u, &s, &vt);
  if (st == TG_OK) {
    tg_tensor u0, s0, vt0;
    CHECK(tg_svd(x, false, &u0, &s0, &vt0) == TG_OK);
    CHECK(maxdiff(s, s0) < 1e-5);
  } else {
    CHECK(!tg_valid(u) && !tg_valid(s) && !tg_valid(vt));
    CHECK_STR_CONTAINS(tg_last_error(), "tg_svd: ");
    tg_clear_error();
  }
  END;
}

/* tg_bitcast to a dtype of another size bitcasts shard by shard (it dereferenced the buffer of a
 * multi-device node, which has none): sharded on another axis, on the last one, replicated, with an
 * empty shard; a shard whose part of the last dim is not whole elements of the new dtype is refused */
TEST(bitcast_sharded_other_size) {
  BEGIN;
  const double d[6] = {1, 2, 3, 4, 5, 6};
  tg_tensor base = tg_bitcast(tg_from_data(d, TG_SHAPE(6), TG_OPTS(.dtype = TG_FLOAT64)), TG_INT32); /* (12,) */
  tg_tensor m = tg_reshape(base, TG_SHAPE(3, 4));
  tg_tensor want = realized(tg_from_data(d, TG_SHAPE(3, 2), TG_OPTS(.dtype = TG_FLOAT64)));
  const struct { tg_tensor x; int axis; } cases[] = {
      {tg_shard(base, DEV2, 2, 0), 0},         {tg_shard(base, DEV2, 2, TG_SHARD_NONE), TG_SHARD_NONE},
      {tg_shard(m, DEV2, 2, 0), 0},            {tg_shard(m, DEV2, 2, 1), 1},
      {tg_shard(m, DEV4, 4, 0), 0} /* 1, 1, 1, 0 rows */};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tg_tensor r = tg_bitcast(cases[c].x, TG_FLOAT64);
    CHECK_MSG(tg_valid(r) && tg_dtype_of(r) == TG_FLOAT64, "case %zu: %s", c, tg_last_error() ? tg_last_error() : "");
    if (!tg_valid(r)) continue;
    CHECK(tg_shard_count(r) == tg_shard_count(cases[c].x) && tg_shard_axis(r) == cases[c].axis);
    CHECK(tg_numel(r) == 6);
    CHECK_MSG(maxdiff(tg_reshape(r, TG_SHAPE(3, 2)), want) == 0, "case %zu", c);
  }
  tg_tensor h = tg_bitcast(tg_shard(tg_arange(0, 6, 1, NULL), DEV2, 2, 0), TG_INT16); /* int32 -> 2 int16 */
  int16_t o[12] = {0};
  CHECK(tg_numel(h) == 12 && tg_data(h, o, sizeof o) == TG_OK && o[4] == 2 && o[5] == 0 && o[10] == 5);
  CHECK(!tg_valid(tg_bitcast(tg_shard(base, DEV4, 4, 0), TG_FLOAT64))); /* 3 int32 a shard */
  CHECK_STR_CONTAINS(tg_last_error(), "tg_bitcast: shape (12,) is sharded on its last dim and shard 0 holds 3");
  tg_clear_error();
  END;
}

TEST(cpu_and_cl) {
  BEGIN;
  tg_tensor probe = tg_zeros(TG_SHAPE(1), TG_OPTS(.device = "CL"));
  if (!tg_valid(probe)) {
    fprintf(stderr, "  cpu_and_cl: no OpenCL device here (%s); not run\n", tg_last_error());
    tg_clear_error();
  } else {
    const char *d[] = {"CPU", "CL"};
    tg_tensor x = realized(tg_randn(TG_SHAPE(8, 6), NULL)), w = realized(tg_randn(TG_SHAPE(6, 3), NULL));
    tg_tensor want = tg_matmul(x, w), g1, g2;
    CHECK(tg_gradient(tg_sum(tg_square(want), NULL, 0, false), &w, 1, &g1) == TG_OK);
    tg_tensor sw = tg_shard(w, d, 2, TG_SHARD_NONE);
    tg_tensor got = tg_matmul(tg_shard(x, d, 2, 0), sw);
    CHECK(tg_gradient(tg_sum(tg_square(got), NULL, 0, false), &sw, 1, &g2) == TG_OK);
    CHECK(maxdiff(got, want) < 1e-4);
    CHECK(maxdiff(g2, g1) < 1e-3);
  }
  END;
}

int main(void) { return RUN_TESTS(); }
