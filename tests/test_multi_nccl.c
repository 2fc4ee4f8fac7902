/*
 * test_multi_nccl.c -- tensors sharded over several GPUs of one process allreduce through NCCL: the
 * allreduce of a reduction over the sharded axis and of a replicated weight's gradient runs as one
 * NCCL group (one ncclCommInitAll per device tuple, ncclGroupStart, an ncclAllReduce per GPU,
 * ncclGroupEnd), in the forward and the backward pass and under TinyJit; without libnccl, with
 * NCCL=0, for a dtype or an op NCCL is not used for, or for one GPU named twice, the graph's copies
 * do it; a failing NCCL call is an error naming it, never an abort or a hang; and no communicator is
 * left at exit. Every value is checked against the same computation on the CPU alone.
 *
 * Without a GPU: the stand-in driver tests/fake_libcuda.c (three GPUs whose memory is host memory)
 * runs the kernels that the stand-in NVRTC tests/fake_libnvrtc.c hands it as CUDA C, compiled for
 * the host; the stand-in tests/fake_libnccl.c combines a group's allreduces on the host and counts
 * the calls (fake_nccl_stat). The tests run in file order: the first that allreduces runs before
 * libnccl is loaded.
 * FAKE_NCCL_LIVE_CHECK makes the process fail at exit if a communicator was left.
 */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>
#include <unistd.h>

#include "fake_cuda_env.h"
#include "maxdiff.h"
#include "test.h"

#define L 5 /* elements of the weight */

static char g_dir[PATH_MAX];
static char g_nccl[PATH_MAX + 32];
static bool g_ok; /* the CUDA device opens on the stand-in driver */

static const char *DEV2[] = {"CUDA:0", "CUDA:1"};
static const char *DEV3[] = {"CUDA:0", "CUDA:1", "CUDA:2"};

static bool nccl_loaded(void) {
  void *h = dlopen(g_nccl, RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);
  return h != NULL;
}

/* a counter of the stand-in libnccl (0 while it is not loaded) */
static long nstat(const char *name) {
  void *h = dlopen(g_nccl, RTLD_NOW | RTLD_NOLOAD);
  long (*f)(const char *) = h ? (long (*)(const char *))dlsym(h, "fake_nccl_stat") : NULL;
  long v = f ? f(name) : 0;
  if (h) dlclose(h);
  return v;
}

/* c[i][k]: replica i's coefficients */
static void coeffs(float c[3][L], int seed) {
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < L; k++) c[i][k] = (float)((seed * 7 + i * 13 + k * 5) % 11) - 4.5f + 0.25f * (float)i;
}

/* sum over i < n of sum(w_i * c_i), w_i the replica of w on device i (or w itself, on the CPU)
 * copied to the CPU: only copies on the GPUs */
static tg_tensor replica_loss(tg_tensor w, const tg_tensor *c, int n) {
  tg_tensor loss = {0};
  for (int i = 0; i < n; i++) {
    tg_tensor wi = tg_shard_count(w) > 1 ? tg_to(tg_shard_get(w, i), "CPU") : w;
    tg_tensor t = tg_sum(tg_mul(wi, c[i]), NULL, 0, false);
    loss = i ? tg_add(loss, t) : t;
  }
  return loss;
}

/* The gradient of replica_loss over devs[0..n) (w replicated there), each replica checked against
 * the gradient of the same loss on the CPU. */
static void check_replica_grad(const char *const *devs, int n, int seed) {
  float w0[L] = {1, -2, 3, 0.5f, 4}, c[3][L], got[L];
  coeffs(c, seed);
  tg_tensor wc = tg_from_data(w0, TG_SHAPE(L), NULL), cs[3];
  for (int i = 0; i < n; i++) cs[i] = tg_from_data(c[i], TG_SHAPE(L), NULL);
  tg_tensor w = tg_shard(wc, devs, n, TG_SHARD_NONE), g = {0}, want = {0};
  CHECK(tg_realize(w) == TG_OK);
  CHECK(tg_gradient(replica_loss(w, cs, n), &w, 1, &g) == TG_OK);
  CHECK(tg_gradient(replica_loss(wc, cs, n), &wc, 1, &want) == TG_OK);
  CHECK_MSG(tg_realize(g) == TG_OK, "%s", tg_last_error());
  CHECK(tg_shard_count(g) == n && tg_shard_axis(g) == TG_SHARD_NONE);
  float ref[L];
  CHECK(tg_data(want, ref, sizeof ref) == TG_OK);
  for (int i = 0; i < n; i++) {
    CHECK(tg_data(tg_shard_get(g, i), got, sizeof got) == TG_OK);
    for (int k = 0; k < L; k++)
      CHECK_MSG(got[k] == ref[k], "n %d replica %d [%d]: %g, want %g", n, i, k, got[k], ref[k]);
  }
}

/* max |a - b| (a multi-device tensor is gathered) */
static double maxdiff(tg_tensor a, tg_tensor b) { return tensor_maxdiff(a, b); }

/* every replica of a replicated tensor against want */
static double replicas_diff(tg_tensor r, tg_tensor want) {
  double m = 0;
  for (int i = 0; i < tg_shard_count(r); i++) {
    double d = maxdiff(tg_shard_get(r, i), want);
    if (!(d <= m)) m = d;
  }
  return m;
}

/* X (6, 4) with ties across the batch (each column's maximum twice or three times) */
static tg_tensor batch(int seed, const char *dev) {
  float xs[24];
  for (int i = 0; i < 24; i++) xs[i] = (float)((i * 5 + seed * 3) % 9) * 0.5f - 1.5f;
  for (int c = 0; c < 4; c++) xs[c] = xs[8 + c] = xs[20 + c] = 4.0f + (float)c; /* rows 0, 2 and 5 */
  return tg_from_data(xs, TG_SHAPE(6, 4), TG_OPTS(.device = dev));
}

/* The stand-in driver runs kernels (main opened CUDA:2 on it); every other test needs it. */
TEST(nccl_stand_in_driver_opens) {
  CHECK_MSG(g_ok, "the CUDA device does not open on the stand-in driver in %s (its error is above)", g_dir);
}

/* The first test that allreduces: libnccl is not there (TG_NCCL_LIB names a missing file): the graph's copies. */
TEST(nccl_no_library_uses_copies) {
  if (!g_ok) return;
  BEGIN;
  setenv("TG_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
  tg_context_begin();
  tg_context_set_int("DEBUG", 2);
  tt_stderr_begin();
  tg_tensor x = batch(1, "CPU"), r = tg_sum(tg_shard(x, DEV2, 2, 0), (int[]){0}, 1, false);
  tg_status st = tg_realize(r);
  char *err = tt_stderr_end();
  tg_context_end();
  CHECK_MSG(st == TG_OK, "%s", tg_last_error());
  CHECK(replicas_diff(r, tg_sum(x, (int[]){0}, 1, false)) == 0);
  CHECK_STR_CONTAINS(err, "allreduce over CUDA,CUDA:1 with copies, not NCCL: cannot open libnccl");
  CHECK_STR_CONTAINS(err, "allreduce: naive 2x4 float");
  CHECK(!strstr(err, "NCCL allreduce"));
  free(err);
  CHECK(!nccl_loaded());
  setenv("TG_NCCL_LIB", g_nccl, 1);
  END;
}

/* A sum and a max over the sharded axis on 2 and 3 GPUs: one communicator set per device tuple, one
 * group per allreduce, with its op and size; DEBUG=2 says so. */
TEST(nccl_sum_and_max) {
  if (!g_ok) return;
  BEGIN;
  tg_tensor x = batch(2, "CPU");
  tg_context_begin();
  tg_context_set_int("DEBUG", 2);
  tt_stderr_begin();
  tg_tensor s2 = tg_sum(tg_shard(x, DEV2, 2, 0), (int[]){0}, 1, false);
  CHECK(tg_realize(s2) == TG_OK);
  char *err = tt_stderr_end();
  tg_context_end();
  CHECK(replicas_diff(s2, tg_sum(x, (int[]){0}, 1, false)) == 0);
  CHECK(nstat("initall") == 1 && nstat("group") == 1 && nstat("local_allreduce") == 1 &&
        nstat("allreduce") == 2);
  CHECK(nstat("last_nranks") == 2 && nstat("last_count") == 4 && nstat("last_op") == 0 &&
        nstat("last_type") == 7);
  CHECK(nstat("live") == 2);
  CHECK_STR_CONTAINS(err, "allreduce: NCCL sum 2x4 float");
  CHECK_STR_CONTAINS(err, "*** CUDA,CUDA:1");
  CHECK_STR_CONTAINS(err, "NCCL allreduce sum 2x16 bytes float");
  CHECK(!strstr(err, "allreduce: naive") && !strstr(err, "allreduce: ring"));
  free(err);
  /* the same tuple again: its communicators, a new group; a max */
  tg_tensor m2 = tg_max(tg_shard(x, DEV2, 2, 0), (int[]){0}, 1, false);
  CHECK(tg_realize(m2) == TG_OK && replicas_diff(m2, tg_max(x, (int[]){0}, 1, false)) == 0);
  CHECK(nstat("initall") == 1 && nstat("group") == 2 && nstat("last_op") == 2);
  /* 3 GPUs: the whole sum (a scalar), an int sum, a max */
  tg_tensor x3 = tg_shard(x, DEV3, 3, 0);
  tg_tensor s3 = tg_sum(x3, NULL, 0, false), m3 = tg_max(x3, (int[]){0}, 1, true),
            i3 = tg_sum(tg_cast(x3, TG_INT32), (int[]){0}, 1, false);
  tg_tensor three[3] = {s3, m3, i3};
  CHECK(tg_realize_many(three, 3) == TG_OK);
  CHECK(replicas_diff(s3, tg_sum(x, NULL, 0, false)) == 0);
  CHECK(replicas_diff(m3, tg_max(x, (int[]){0}, 1, true)) == 0);
  CHECK(replicas_diff(i3, tg_sum(tg_cast(x, TG_INT32), (int[]){0}, 1, false)) == 0);
  CHECK(nstat("initall") == 2 && nstat("group") == 5 && nstat("last_nranks") == 3 && nstat("live") == 5);
  /* another order of the GPUs is another tuple */
  const char *rev[] = {"CUDA:2", "CUDA:1", "CUDA:0"};
  tg_tensor sr = tg_sum(tg_shard(x, rev, 3, 0), (int[]){0}, 1, false);
  CHECK(tg_realize(sr) == TG_OK && replicas_diff(sr, tg_sum(x, (int[]){0}, 1, false)) == 0);
  CHECK(nstat("initall") == 3 && nstat("group") == 6);
  END;
}

/* The gradient through an allreduce: a max's goes to the maxima, split evenly between tied shards
 * (their count is allreduced too), a sum's to every shard. */
TEST(nccl_allreduce_gradients) {
  if (!g_ok) return;
  BEGIN;
  tg_tensor x = batch(3, "CPU"), gx = {0}, want = {0};
  for (int n = 2; n <= 3; n++) {
    tg_tensor sx = tg_shard(x, n == 2 ? DEV2 : DEV3, n, 0);
    long a0 = nstat("local_allreduce");
    tg_tensor l1 =
        tg_sum(tg_mul(tg_max(sx, (int[]){0}, 1, false), tg_sum(sx, (int[]){0}, 1, false)), NULL, 0, false);
    tg_tensor l0 =
        tg_sum(tg_mul(tg_max(x, (int[]){0}, 1, false), tg_sum(x, (int[]){0}, 1, false)), NULL, 0, false);
    CHECK(tg_gradient(l1, &sx, 1, &gx) == TG_OK && tg_gradient(l0, &x, 1, &want) == TG_OK);
    CHECK(tg_shard_axis(gx) == 0);
    CHECK_MSG(maxdiff(gx, want) == 0, "%d GPUs: %g", n, maxdiff(gx, want));
    CHECK(maxdiff(l1, l0) == 0);
    /* forward: the max, the sum and the loss's sum; backward: the ties' count */
    CHECK_MSG(nstat("local_allreduce") >= a0 + 4, "%d GPUs: %ld allreduces", n,
              nstat("local_allreduce") - a0);
  }
  END;
}

/* A replicated weight whose replicas are used on the CPU: its gradient is the allreduce of the
 * replicas' (an exact sum of coefficients). */
TEST(nccl_replica_gradient) {
  if (!g_ok) return;
  BEGIN;
  long g0 = nstat("group");
  check_replica_grad(DEV2, 2, 1);
  check_replica_grad(DEV3, 3, 2);
  CHECK(nstat("group") == g0 + 2);
  END;
}

/* A data-parallel training step: the batch sharded over 3 GPUs, the weight replicated; the loss,
 * the gradient and the updated weight equal the CPU's. */
static tg_tensor mse(tg_tensor x, tg_tensor w, tg_tensor y) {
  tg_tensor d = tg_sub(tg_matmul(x, w), y);
  return tg_mean(tg_mul(d, d), NULL, 0, false);
}

TEST(nccl_training_step) {
  if (!g_ok) return;
  BEGIN;
  float w0[8] = {0.5f, -1, 0.25f, 2, -0.5f, 1, 1.5f, 0}, ys[12];
  for (int i = 0; i < 12; i++) ys[i] = (float)(i % 5) - 2;
  tg_tensor x = batch(4, "CPU"), w = tg_from_data(w0, TG_SHAPE(4, 2), NULL),
            y = tg_from_data(ys, TG_SHAPE(6, 2), NULL);
  tg_tensor sx = tg_shard(x, DEV3, 3, 0), sy = tg_shard(y, DEV3, 3, 0),
            sw = tg_shard(w, DEV3, 3, TG_SHARD_NONE);
  CHECK(tg_realize(sw) == TG_OK);
  tg_tensor loss = mse(sx, sw, sy), g = {0}, want_g = {0}, want_loss = mse(x, w, y);
  CHECK(tg_gradient(loss, &sw, 1, &g) == TG_OK && tg_gradient(want_loss, &w, 1, &want_g) == TG_OK);
  tg_tensor w2 = tg_sub(sw, tg_mul_s(g, 0.1)), want_w2 = tg_sub(w, tg_mul_s(want_g, 0.1));
  long a0 = nstat("local_allreduce");
  tg_tensor both[2] = {loss, w2};
  CHECK_MSG(tg_realize_many(both, 2) == TG_OK, "%s", tg_last_error());
  /* the loss's sum over the batch and the gradient's join */
  CHECK_MSG(nstat("local_allreduce") == a0 + 2, "%ld allreduces", nstat("local_allreduce") - a0);
  CHECK_MSG(maxdiff(loss, want_loss) < 1e-5, "loss %g", maxdiff(loss, want_loss));
  CHECK(tg_shard_axis(w2) == TG_SHARD_NONE && tg_shard_count(w2) == 3);
  CHECK_MSG(replicas_diff(g, want_g) < 1e-5, "grad %g", replicas_diff(g, want_g));
  CHECK_MSG(replicas_diff(w2, want_w2) < 1e-5, "w2 %g", replicas_diff(w2, want_w2));
  END;
}

/* Realizing one replica of the gradient still runs the whole group (each GPU must take part); the
 * others' results go to temporary buffers. */
TEST(nccl_one_replica_realized) {
  if (!g_ok) return;
  BEGIN;
  float w0[L] = {2, 2, 2, 2, 2}, c[3][L], got[L];
  coeffs(c, 5);
  tg_tensor w = tg_shard(tg_from_data(w0, TG_SHAPE(L), NULL), DEV3, 3, TG_SHARD_NONE), cs[3], g = {0};
  for (int i = 0; i < 3; i++) cs[i] = tg_from_data(c[i], TG_SHAPE(L), NULL);
  CHECK(tg_gradient(replica_loss(w, cs, 3), &w, 1, &g) == TG_OK);
  long g0 = nstat("group");
  CHECK(tg_data(tg_shard_get(g, 2), got, sizeof got) == TG_OK);
  CHECK(nstat("group") == g0 + 1);
  for (int k = 0; k < L; k++) CHECK(got[k] == c[0][k] + c[1][k] + c[2][k]);
  END;
}

static tg_status jit_step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                          int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  tg_tensor w = in[1];
  out[0] = mse(in[0], w, in[2]);
  /* and, with a user tensor (sharded), an allreduce that depends on no input */
  if (user) out[2] = tg_sum(*(tg_tensor *)user, (int[]){0}, 1, false);
  return tg_gradient(out[0], &w, 1, out + 1);
}

/* TinyJit: a jitted data-parallel step; the captured groups run again on every replay, on that
 * call's batch. With prune, an allreduce that depends on no input is dropped, all its members. */
TEST(nccl_jit_replays) {
  if (!g_ok) return;
  BEGIN;
  float w0[8] = {0.5f, -1, 0.25f, 2, -0.5f, 1, 1.5f, 0}, ys[12];
  for (int i = 0; i < 12; i++) ys[i] = (float)(i % 3) - 1;
  tg_tensor w = tg_from_data(w0, TG_SHAPE(4, 2), NULL), y = tg_from_data(ys, TG_SHAPE(6, 2), NULL);
  for (int n = 2; n <= 3; n++) {
    const char *const *devs = n == 2 ? DEV2 : DEV3;
    tg_tensor sw = tg_shard(w, devs, n, TG_SHARD_NONE), sy = tg_shard(y, devs, n, 0);
    tg_realize(sw), tg_realize(sy);
    tg_tensor cx = batch(20, "CPU"), csh = tg_shard(cx, devs, n, 0);
    CHECK(tg_realize(csh) == TG_OK);
    bool prune = n == 3;
    tg_jit *j = prune ? tg_jit_new_opts(jit_step, 3, &csh, TG_JIT_OPTS(.prune = true))
                      : tg_jit_new(jit_step, 2, NULL);
    for (int call = 0; call < 5; call++) {
      tg_scope_begin();
      tg_tensor x = batch(10 + call, "CPU"), sx = tg_shard(x, devs, n, 0), out[3] = {{0}, {0}, {0}},
                want_g = {0};
      CHECK(tg_realize(sx) == TG_OK);
      long g0 = nstat("group");
      tg_tensor in[3] = {sx, sw, sy};
      tg_status st = tg_jit_call(j, in, 3, NULL, 0, out);
      CHECK_MSG(st == TG_OK, "%d GPUs, call %d: %s", n, call, tg_last_error());
      tg_tensor want_loss = mse(x, w, y);
      CHECK(tg_gradient(want_loss, &w, 1, &want_g) == TG_OK);
      CHECK_MSG(maxdiff(out[0], want_loss) < 1e-5 && replicas_diff(out[1], want_g) < 1e-5,
                "%d GPUs, call %d: loss %g, grad %g", n, call, maxdiff(out[0], want_loss),
                replicas_diff(out[1], want_g));
      if (prune) CHECK_MSG(replicas_diff(out[2], tg_sum(cx, (int[]){0}, 1, false)) == 0, "call %d", call);
      /* the loss's allreduce and the gradient's; with prune the constant one ran in the capture only */
      long want = 2 + (prune && call < 2);
      CHECK_MSG(nstat("group") == g0 + want, "%d GPUs, call %d: %ld groups", n, call, nstat("group") - g0);
      tg_scope_end();
    }
    tg_jit_free(j);
  }
  END;
}

/* NCCL=0, a dtype NCCL lacks, an op it is not used for, one GPU under two names: the graph's
 * copies, the CPU's values, and no NCCL call. */
TEST(nccl_fallbacks) {
  if (!g_ok) return;
  BEGIN;
  long g0 = nstat("group"), i0 = nstat("initall");
  tg_tensor x = batch(5, "CPU");
  tg_context_begin();
  tg_context_set_int("DEBUG", 2);
  tg_context_set_int("NCCL", 0);
  tt_stderr_begin();
  tg_tensor s = tg_sum(tg_shard(x, DEV3, 3, 0), (int[]){0}, 1, false);
  CHECK(tg_realize(s) == TG_OK);
  /* the training step's loss and gradient through the copies */
  float w0[8] = {1, -1, 0.5f, 2, -0.5f, 1, 1.5f, 0.25f}, ys[12];
  for (int i = 0; i < 12; i++) ys[i] = (float)(i % 4) - 1;
  tg_tensor w = tg_from_data(w0, TG_SHAPE(4, 2), NULL), y = tg_from_data(ys, TG_SHAPE(6, 2), NULL);
  tg_tensor sw = tg_shard(w, DEV3, 3, TG_SHARD_NONE),
            loss = mse(tg_shard(x, DEV3, 3, 0), sw, tg_shard(y, DEV3, 3, 0));
  tg_tensor g = {0}, want_g = {0}, want_loss = mse(x, w, y);
  CHECK(tg_gradient(loss, &sw, 1, &g) == TG_OK);
  CHECK(tg_gradient(want_loss, &w, 1, &want_g) == TG_OK);
  tg_tensor both[2] = {loss, g};
  CHECK(tg_realize_many(both, 2) == TG_OK);
  tg_context_set_int("NCCL", 1);
  tg_tensor xh = tg_cast(x, TG_INT16); /* (a max keeps the dtype; a sum would widen it to int) */
  tg_tensor h = tg_max(tg_shard(xh, DEV2, 2, 0), (int[]){0}, 1, false);
  tg_tensor p = tg_prod(tg_shard(x, DEV2, 2, 0), (int[]){0}, 1, false);
  const char *same[] = {"CUDA:0", "NV"};
  tg_tensor sn = tg_sum(tg_shard(x, same, 2, 0), (int[]){0}, 1, false);
  tg_tensor all[3] = {h, p, sn};
  CHECK(tg_realize_many(all, 3) == TG_OK);
  char *err = tt_stderr_end();
  tg_context_end();
  CHECK(replicas_diff(s, tg_sum(x, (int[]){0}, 1, false)) == 0);
  CHECK_MSG(maxdiff(loss, want_loss) < 1e-5 && replicas_diff(g, want_g) < 1e-5, "loss %g, grad %g",
            maxdiff(loss, want_loss), replicas_diff(g, want_g));
  CHECK(replicas_diff(h, tg_max(xh, (int[]){0}, 1, false)) == 0);
  CHECK(replicas_diff(p, tg_prod(x, (int[]){0}, 1, false)) == 0);
  CHECK(replicas_diff(sn, tg_sum(x, (int[]){0}, 1, false)) == 0);
  CHECK_STR_CONTAINS(err, "with copies, not NCCL: NCCL=0");
  CHECK_STR_CONTAINS(err, "with copies, not NCCL: NCCL has no type for short");
  CHECK_STR_CONTAINS(err, "with copies, not NCCL: only sums and maxima go through NCCL");
  CHECK(!strstr(err, ",NV with copies")); /* not distinct GPUs: nothing to say */
  CHECK(!strstr(err, "NCCL allreduce"));
  free(err);
  CHECK(nstat("group") == g0 && nstat("initall") == i0);
  END;
}

/* Each failure is an error naming the NCCL call, the devices and the way out; the failed
 * communicators are aborted, and the next allreduce makes new ones. */
static void expect_failure(const char *knob, const char *value, const char *needle, bool existed) {
  long ab0 = nstat("abort"), live0 = nstat("live");
  setenv(knob, value, 1);
  float w0[L] = {0}, c0[L] = {0};
  tg_tensor w = tg_shard(tg_from_data(w0, TG_SHAPE(L), NULL), DEV3, 3, TG_SHARD_NONE), g = {0};
  tg_tensor cs[3] = {tg_from_data(c0, TG_SHAPE(L), NULL), tg_from_data(c0, TG_SHAPE(L), NULL),
                     tg_from_data(c0, TG_SHAPE(L), NULL)};
  CHECK(tg_gradient(replica_loss(w, cs, 3), &w, 1, &g) == TG_OK);
  CHECK_MSG(tg_realize(g) == TG_ERR_RUNTIME, "%s=%s: %s", knob, value,
            tg_last_error() ? tg_last_error() : "no error");
  CHECK_STR_CONTAINS(tg_last_error(), "allreduce over CUDA,CUDA:1,CUDA:2: ");
  CHECK_STR_CONTAINS(tg_last_error(), needle);
  CHECK_STR_CONTAINS(tg_last_error(), "NCCL=0 allreduces with copies between the devices instead");
  tg_clear_error();
  unsetenv(knob);
  /* (a failed ncclCommInitAll made nothing to abort) */
  long aborted = strcmp(value, "initall") ? 3 : 0;
  CHECK_MSG(nstat("abort") == ab0 + aborted && nstat("live") == live0 - (existed ? 3 : 0),
            "%s: %ld aborted, %ld live", needle, nstat("abort") - ab0, nstat("live"));
}

TEST(nccl_failures_are_errors) {
  if (!g_ok) return;
  BEGIN;
  check_replica_grad(DEV3, 3, 8); /* the tuple's communicators exist */
  expect_failure("FAKE_NCCL_FAIL", "allreduce",
                 "ncclAllReduce failed (NCCL error 2: unhandled system error (fake))", true);
  long in0 = nstat("initall");
  check_replica_grad(DEV3, 3, 9); /* new communicators */
  CHECK(nstat("initall") == in0 + 1);
  expect_failure("FAKE_NCCL_FAIL", "groupend", "ncclGroupEnd failed (NCCL error 2", true);
  expect_failure("FAKE_NCCL_FAIL", "groupstart", "ncclGroupStart failed (NCCL error 2", false);
  expect_failure("FAKE_NCCL_FAIL", "initall", "ncclCommInitAll failed (NCCL error 2", false);
  expect_failure("FAKE_NCCL_ASYNC", "1", "ncclAllReduce failed (NCCL error 6: remote process exited", false);
  /* a stream that never finishes: DIST_TIMEOUT, then the communicators are aborted */
  tg_context_begin();
  tg_context_set_int("DIST_TIMEOUT", 0);
  expect_failure("FAKE_CUDA_STREAM_BUSY", "1", "ncclAllReduce did not finish in 0 s (DIST_TIMEOUT)", false);
  tg_context_end();
  check_replica_grad(DEV3, 3, 10); /* and it works again */
  END;
}

int main(void) {
  setenv("FAKE_CUDA_DEVICES", "3", 1);
  setenv("FAKE_NCCL_LIVE_CHECK", "1", 1); /* the stand-in fails the process if a communicator is left */
  bool ok = fake_cuda_env_begin(g_dir, sizeof g_dir, "CUDA:2");
  snprintf(g_nccl, sizeof g_nccl, "%s/libfakenccl.so", g_dir);
  setenv("TG_NCCL_LIB", g_nccl, 1);
  g_ok = ok;
  int rc = RUN_TESTS();
  fake_cuda_env_end();
  return rc;
}
