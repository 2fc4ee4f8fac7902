/*
 * test_optim.c -- training with the nn layers and optimizers from C: a small MLP learns a synthetic
 * task, a 1000-step loop keeps handles and memory flat, an optimizer step under TinyJit gives the
 * same parameters as without it, and a model's state dict survives a safetensors round trip.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "tinygrad.h"

/* AddressSanitizer keeps freed memory in quarantine, so RSS grows there by design */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

#define OK(x) CHECK_MSG((x) == TG_OK, "%s", tg_last_error() ? tg_last_error() : "(no error recorded)")

static double item(tg_tensor t) {
  double v = NAN;
  if (tg_item(t, &v) != TG_OK) v = NAN;
  return v;
}

/* resident set size in bytes (/proc/self/statm, second field) */
static long rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0, res = 0;
  if (!f) return -1;
  if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
  fclose(f);
  return res < 0 ? -1 : res * sysconf(_SC_PAGESIZE);
}

/* ---- a 2-layer MLP with a BatchNorm in between ---- */
typedef struct {
  tg_nn_linear l1, l2;
  tg_nn_batchnorm bn;
  bool use_bn;
} Mlp;

static tg_status mlp_init(Mlp *m, int in, int hidden, int out, bool use_bn) {
  memset(m, 0, sizeof *m);
  m->use_bn = use_bn;
  tg_status st = tg_nn_linear_init(&m->l1, in, hidden, true);
  if (st == TG_OK) st = tg_nn_linear_init(&m->l2, hidden, out, true);
  if (st == TG_OK && use_bn) st = tg_nn_batchnorm_init(&m->bn, hidden, NULL);
  return st;
}

static tg_tensor mlp_forward(Mlp *m, tg_tensor x) {
  tg_tensor h = tg_nn_linear_forward(&m->l1, x);
  if (m->use_bn) h = tg_nn_batchnorm_forward(&m->bn, h);
  return tg_nn_linear_forward(&m->l2, tg_relu(h));
}

static tg_state_dict *mlp_state(const Mlp *m) {
  tg_state_dict *sd = tg_state_dict_new();
  tg_nn_linear_state(&m->l1, sd, "l1");
  if (m->use_bn) tg_nn_batchnorm_state(&m->bn, sd, "bn");
  tg_nn_linear_state(&m->l2, sd, "l2");
  return sd;
}

static void mlp_free(Mlp *m) {
  tg_nn_linear_free(&m->l1);
  tg_nn_linear_free(&m->l2);
  tg_nn_batchnorm_free(&m->bn);
}

/* synthetic 3-class data: the label is the argmax of 3 fixed linear projections of x */
static void make_data(int n, int in, tg_tensor *X, tg_tensor *Y) {
  tg_scope_begin();
  tg_tensor x = tg_randn((const int64_t[]){n, in}, 2, NULL);
  tg_tensor proj = tg_randn((const int64_t[]){in, 3}, 2, NULL);
  tg_tensor y = tg_cast(tg_argmax(tg_matmul(x, proj), TG_AXES(1), false), TG_INT32);
  *X = tg_persist(tg_contiguous(x));
  *Y = tg_persist(tg_contiguous(y));
  tg_tensor both[2] = {*X, *Y};
  tg_realize_many(both, 2);
  tg_scope_end();
}

static tg_tensor mlp_loss(Mlp *m, tg_tensor x, tg_tensor y) {
  return tg_sparse_categorical_crossentropy(mlp_forward(m, x), y, NULL);
}

/* one training step: zero_grad, backward, the optimizer's updates realized together with the loss */
static double train_step(Mlp *m, tg_optim *opt, tg_tensor x, tg_tensor y) {
  tg_scope_begin();
  tg_optim_zero_grad(opt);
  tg_tensor loss = mlp_loss(m, x, y);
  double v = NAN;
  if (tg_backward(loss) == TG_OK) {
    int n = tg_optim_schedule_step(opt, NULL, 0);
    tg_tensor *ts = malloc(sizeof(tg_tensor) * (size_t)(n + 1));
    int k = tg_optim_schedule_step(opt, ts, n);
    if (k >= 0) {
      ts[k++] = loss;
      if (tg_realize_many(ts, k) == TG_OK) v = item(loss);
    }
    free(ts);
  }
  tg_scope_end();
  return v;
}

static int params_of(const Mlp *m, bool trainable_only, tg_tensor *out, int cap) {
  tg_state_dict *sd = mlp_state(m);
  int n = tg_state_dict_parameters(sd, trainable_only, out, cap);
  tg_state_dict_free(sd);
  return n;
}

TEST(mlp_learns_synthetic_task) {
  tg_manual_seed(1);
  Mlp m;
  OK(mlp_init(&m, 8, 32, 3, false));
  tg_tensor X, Y;
  make_data(256, 8, &X, &Y);
  tg_tensor params[8];
  int n = params_of(&m, true, params, 8);
  CHECK(n == 4);
  tg_optim *opt = tg_optim_adam(params, n, TG_ADAM_OPTS(.lr = 0.01));
  CHECK(opt != NULL);
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  double first = NAN, last = NAN;
  for (int step = 0; step < 50 && opt; step++) {
    double l = train_step(&m, opt, X, Y);
    if (step == 0) first = l;
    last = l;
  }
  tg_context_end();
  printf("  mlp: loss %.4f -> %.4f after 50 Adam steps\n", first, last);
  CHECK(first > 0.7);        /* chance level for 3 classes is ln 3 = 1.10 */
  CHECK(last < 0.5 * first); /* it learned */
  /* accuracy on the training data */
  tg_scope_begin();
  tg_tensor pred = tg_cast(tg_argmax(mlp_forward(&m, X), TG_AXES(1), false), TG_INT32);
  double acc = item(tg_mean(tg_cast(tg_eq(pred, Y), TG_FLOAT32), TG_ALL_AXES, false));
  tg_scope_end();
  printf("  mlp: training accuracy %.3f\n", acc);
  CHECK(acc > 0.85);
  tg_optim_free(opt);
  mlp_free(&m);
  tg_free(X), tg_free(Y);
  CHECK(tg_live_count() == 0);
}

TEST(sgd_1000_steps_flat_handles_and_memory) {
  tg_manual_seed(2);
  tg_nn_linear l;
  OK(tg_nn_linear_init(&l, 8, 8, true));
  /* The data is marked requires_grad false, as a dataset kept across steps must be: with tinygrad's
   * unset (None) requires_grad, tg_backward fills a gradient for every float tensor in the graph and
   * adds each step's to the last, and these gradients, never zeroed by the optimizer, would grow a
   * graph of 23 nodes a step, and the memory this loop checks would grow. */
  tg_tensor X = tg_persist(tg_randn(TG_SHAPE(16, 8), TG_OPTS(.requires_grad = false)));
  tg_tensor T = tg_persist(tg_randn(TG_SHAPE(16, 8), TG_OPTS(.requires_grad = false)));
  OK(tg_realize(X));
  OK(tg_realize(T));
  {
    /* an unset tensor in the graph does get (and accumulate) a gradient */
    tg_scope_begin();
    tg_tensor U = tg_randn(TG_SHAPE(16, 8), NULL);
    tg_tensor y = tg_sum(tg_mul(tg_nn_linear_forward(&l, U), X), TG_ALL_AXES, false);
    OK(tg_backward(y));
    OK(tg_backward(y));
    CHECK(tg_valid(tg_grad(U)) && !tg_valid(tg_grad(X)));
    tg_clear_error();
    tg_zero_grad(l.weight), tg_zero_grad(l.bias), tg_zero_grad(U);
    tg_scope_end();
  }
  tg_tensor params[2] = {l.weight, l.bias};
  tg_optim *opt = tg_optim_sgd(params, 2, TG_SGD_OPTS(.lr = 0.01, .momentum = 0.9));
  CHECK(opt != NULL);
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  size_t live0 = tg_live_count(), live_max = live0;
  long rss_warm = 0, rss_max = 0;
  double first = NAN, last = NAN;
  for (int step = 0; step < 1000 && opt; step++) {
    tg_scope_begin();
    tg_optim_zero_grad(opt);
    tg_tensor d = tg_sub(tg_nn_linear_forward(&l, X), T);
    tg_tensor loss = tg_mean(tg_mul(d, d), TG_ALL_AXES, false);
    tg_backward(loss);
    tg_tensor ts[8];
    int k = tg_optim_schedule_step(opt, ts, 7);
    if (k < 0) {
      CHECK_MSG(false, "%s", tg_last_error());
      tg_scope_end();
      break;
    }
    ts[k++] = loss;
    tg_realize_many(ts, k);
    if (step == 0) first = item(loss);
    if (step == 999) last = item(loss);
    tg_scope_end();
    size_t live = tg_live_count();
    if (live > live_max) live_max = live;
    if (step == 100) rss_warm = rss_bytes();
    if (step > 100) {
      long r = rss_bytes();
      if (r > rss_max) rss_max = r;
    }
  }
  tg_context_end();
  printf("  sgd loop: loss %.4f -> %.4f; live handles %zu (max %zu); RSS after warmup %.1f MB, max %.1f MB\n",
         first, last, tg_live_count(), live_max, rss_warm / 1e6, rss_max / 1e6);
  CHECK(tg_live_count() == live0);
  CHECK(live_max == live0);
  if (UNDER_ASAN)
    printf("  (RSS bound not checked under AddressSanitizer: its quarantine holds freed memory)\n");
  else
    CHECK(rss_warm > 0 && rss_max - rss_warm < 4 * 1024 * 1024);
  CHECK(last < first);
  tg_optim_free(opt);
  tg_nn_linear_free(&l);
  tg_free(X), tg_free(T);
  CHECK(tg_live_count() == 0);
}

/* ---- TinyJit ---- */
typedef struct {
  Mlp *m;
  tg_optim *opt;
} StepCtx;

static tg_status jit_step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                          int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  StepCtx *c = user;
  tg_optim_zero_grad(c->opt);
  tg_tensor loss = mlp_loss(c->m, in[0], in[1]);
  tg_status st = tg_backward(loss);
  if (st != TG_OK) return st;
  tg_tensor ts[32];
  int k = tg_optim_schedule_step(c->opt, ts, 31);
  if (k < 0) return tg_last_status();
  ts[k++] = loss;
  st = tg_realize_many(ts, k);
  out[0] = loss;
  return st;
}

/* trains a fresh copy of the same model for `steps` steps (with or without the JIT) on per-step
 * batches; writes every parameter and buffer (flattened, concatenated) to vals */
static int train_copy(bool jit, bool use_bn, int steps, float *vals, int cap, double *losses) {
  tg_manual_seed(5);
  Mlp m;
  if (mlp_init(&m, 6, 16, 3, use_bn) != TG_OK) return -1;
  tg_tensor ps[16];
  int n = params_of(&m, false, ps, 16); /* with the BatchNorm buffers: realized by each step */
  tg_optim *opt = tg_optim_adamw(ps, n, TG_ADAMW_OPTS(.lr = 0.02, .weight_decay = 0.05));
  StepCtx ctx = {&m, opt};
  tg_jit *j = jit ? tg_jit_new(jit_step, 1, &ctx) : NULL;
  tg_manual_seed(9);
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  for (int s = 0; s < steps; s++) {
    tg_scope_begin();
    tg_tensor X, Y;
    make_data(32, 6, &X, &Y);
    tg_tensor in[2] = {X, Y}, out[1] = {{0}};
    tg_status st = jit ? tg_jit_call(j, in, 2, NULL, 0, out) : jit_step(in, 2, NULL, 0, out, 1, &ctx);
    losses[s] = st == TG_OK ? item(out[0]) : NAN;
    if (st != TG_OK) fprintf(stderr, "  step %d: %s\n", s, tg_last_error());
    tg_free(X), tg_free(Y);
    tg_scope_end();
  }
  tg_context_end();
  if (jit) printf("  jit: %d kernels captured per step\n", tg_jit_captured_kernels(j));
  int k = 0;
  tg_state_dict *sd = mlp_state(&m);
  for (int i = 0; i < tg_state_dict_len(sd); i++) {
    tg_tensor t = tg_state_dict_tensor(sd, i);
    tg_scope_begin();
    tg_tensor f = tg_cast(t, TG_FLOAT32);
    int64_t ne = tg_numel(f);
    if (k + ne <= cap && tg_data(f, vals + k, (size_t)ne * sizeof(float)) == TG_OK) k += (int)ne;
    tg_scope_end();
  }
  tg_state_dict_free(sd);
  tg_jit_free(j);
  tg_optim_free(opt);
  mlp_free(&m);
  return k;
}

static void jit_matches(bool use_bn) {
  enum { STEPS = 6, CAP = 4096 };
  static float a[CAP], b[CAP];
  double la[STEPS], lb[STEPS];
  int na = train_copy(false, use_bn, STEPS, a, CAP, la);
  int nb = train_copy(true, use_bn, STEPS, b, CAP, lb);
  CHECK(na > 0 && na == nb);
  double maxd = 0;
  for (int i = 0; i < na && i < nb; i++) maxd = fmax(maxd, fabs((double)a[i] - b[i]));
  for (int s = 0; s < STEPS; s++) CHECK_CLOSE(lb[s], la[s], 1e-5);
  printf("  jit vs eager (%s): %d values, max |diff| %.3g; losses %.4f -> %.4f\n",
         use_bn ? "with BatchNorm" : "MLP", na, maxd, la[0], la[STEPS - 1]);
  CHECK(maxd < 1e-5);
  CHECK(la[STEPS - 1] < la[0]);
  CHECK(tg_live_count() == 0);
}

TEST(optimizer_step_under_jit_matches_eager) { jit_matches(false); }
TEST(optimizer_step_under_jit_with_batchnorm_buffers) { jit_matches(true); }

/* The learning rate is a tensor: changing it between replays of a jitted step takes effect without
 * recapturing. f(w) = sum(w) has gradient 1, so each SGD step subtracts lr. */
typedef struct {
  tg_tensor w;
  tg_optim *opt;
} LrCtx;

static tg_status sgd_sum_step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                              int nout, void *user) {
  (void)in, (void)nin, (void)args, (void)nargs, (void)nout;
  LrCtx *c = user;
  tg_optim_zero_grad(c->opt);
  tg_tensor loss = tg_sum(c->w, TG_ALL_AXES, false);
  tg_status st = tg_backward(loss);
  if (st != TG_OK) return st;
  tg_tensor ts[4];
  int k = tg_optim_schedule_step(c->opt, ts, 3);
  if (k < 0) return tg_last_status();
  ts[k++] = loss;
  st = tg_realize_many(ts, k);
  out[0] = loss;
  return st;
}

TEST(set_lr_takes_effect_in_jitted_step) {
  tg_tensor w = tg_persist(tg_from_data((float[]){1, 1}, TG_SHAPE(2), TG_OPTS(.requires_grad = true)));
  tg_optim *opt = tg_optim_sgd(&w, 1, TG_SGD_OPTS(.lr = 0.5));
  LrCtx ctx = {w, opt};
  tg_jit *j = tg_jit_new(sgd_sum_step, 1, &ctx);
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  double expect = 1;
  for (int s = 0; s < 6; s++) {
    if (s == 4) OK(tg_optim_set_lr(opt, 0.25)); /* calls 3.. are replays */
    tg_scope_begin();
    tg_tensor out[1];
    OK(tg_jit_call(j, NULL, 0, NULL, 0, out));
    CHECK_CLOSE(item(out[0]), 2 * expect, 1e-6); /* the loss is computed before the update */
    expect -= s < 4 ? 0.5 : 0.25;
    tg_scope_end();
  }
  tg_context_end();
  CHECK(tg_jit_captured_kernels(j) > 0);
  float v[2];
  OK(tg_data(w, v, sizeof v));
  CHECK_CLOSE(v[0], 1 - 4 * 0.5 - 2 * 0.25, 1e-6);
  CHECK_CLOSE(v[1], expect, 1e-6);
  CHECK_CLOSE(tg_optim_get_lr(opt), 0.25, 1e-7);
  tg_jit_free(j);
  tg_optim_free(opt);
  tg_free(w);
  CHECK(tg_live_count() == 0);
}

/* beautiful_mnist's second block at training size: conv, relu, batchnorm with batch statistics,
 * max_pool2d. max_pool2d's backward compares each input with the maximum; when the input was
 * recomputed by two kernels compiled differently (one vectorized, one not, with FMAs contracted
 * differently) no element of a window matched and every gradient became NaN. The gradients must be
 * finite and agree with an unoptimized (NOOPT=1) run. */
static int block_grads(float *gb, float *gw) {
  tg_manual_seed(3);
  tg_scope_begin();
  tg_nn_conv2d c;
  tg_nn_batchnorm bn;
  tg_nn_linear l;
  int rc = tg_nn_conv2d_init(&c, 64, 64, (const int64_t[2]){3}, true, NULL) != TG_OK;
  rc |= tg_nn_batchnorm_init(&bn, 64, NULL) != TG_OK;
  rc |= tg_nn_linear_init(&l, 64 * 3 * 3, 10, true) != TG_OK;
  tg_tensor x = tg_contiguous(tg_relu(tg_randn(TG_SHAPE(32, 64, 8, 8), NULL)));
  tg_tensor y = tg_randint(TG_SHAPE(32), 0, 10, NULL);
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_tensor h = tg_max_pool2d(tg_nn_batchnorm_forward(&bn, tg_relu(tg_nn_conv2d_forward(&c, x))), NULL);
  tg_tensor loss = tg_sparse_categorical_crossentropy(tg_nn_linear_forward(&l, tg_flatten(h, 1, -1)), y, NULL);
  rc |= tg_backward(loss) != TG_OK;
  tg_context_end();
  rc |= tg_data(tg_grad(bn.bias), gb, sizeof(float) * 64) != TG_OK;
  rc |= tg_data(tg_grad(c.weight), gw, sizeof(float) * 64 * 64 * 9) != TG_OK;
  tg_nn_conv2d_free(&c), tg_nn_batchnorm_free(&bn), tg_nn_linear_free(&l);
  tg_scope_end();
  return rc;
}

TEST(conv_batchnorm_maxpool_block_grads_finite) {
  static float gb[64], gw[64 * 64 * 9], rb[64], rw[64 * 64 * 9];
  CHECK(block_grads(gb, gw) == 0);
  tg_context_begin();
  tg_context_set("NOOPT", "1");
  CHECK(block_grads(rb, rw) == 0);
  tg_context_end();
  int bad = 0, off = 0;
  for (int i = 0; i < 64; i++) bad += !isfinite(gb[i]), off += !(fabsf(gb[i] - rb[i]) <= 1e-4f + 1e-2f * fabsf(rb[i]));
  for (int i = 0; i < 64 * 64 * 9; i++) bad += !isfinite(gw[i]), off += !(fabsf(gw[i] - rw[i]) <= 1e-4f + 1e-2f * fabsf(rw[i]));
  CHECK_MSG(bad == 0, "%d non-finite gradients", bad);
  CHECK_MSG(off == 0, "%d gradients differ from the unoptimized run", off);
}

TEST(state_dict_safetensors_round_trip) {
  tg_manual_seed(3);
  Mlp a, b;
  OK(mlp_init(&a, 5, 7, 2, true));
  OK(mlp_init(&b, 5, 7, 2, true));
  /* give the BatchNorm non-trivial running statistics */
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_scope_begin();
  tg_tensor xs = tg_randn(TG_SHAPE(9, 5), NULL);
  OK(tg_realize(mlp_forward(&a, xs)));
  OK(tg_realize(a.bn.running_var));
  tg_scope_end();
  tg_context_end();
  char path[] = "/tmp/tg_test_optim_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  tg_state_dict *sa = mlp_state(&a), *sb = mlp_state(&b);
  OK(tg_safe_save(sa, path));
  tg_state_dict *loaded = tg_safe_load(path);
  CHECK(loaded != NULL);
  CHECK(tg_state_dict_len(loaded) == 9);
  OK(tg_load_state_dict(sb, loaded, true));
  tg_scope_begin();
  tg_tensor x = tg_randn(TG_SHAPE(4, 5), NULL);
  tg_tensor ya = mlp_forward(&a, x), yb = mlp_forward(&b, x);
  float va[8], vb[8];
  OK(tg_data(ya, va, sizeof va));
  OK(tg_data(yb, vb, sizeof vb));
  for (int i = 0; i < 8; i++) CHECK_CLOSE(vb[i], va[i], 1e-6);
  int64_t nbt = -1;
  OK(tg_item_i64(b.bn.num_batches_tracked, &nbt));
  CHECK(nbt == 1);
  tg_scope_end();
  /* a missing key is an error in strict mode, and names the key */
  tg_state_dict *partial = tg_state_dict_new();
  tg_state_dict_set(partial, "l1.weight", tg_state_dict_get(loaded, "l1.weight"));
  CHECK(tg_load_state_dict(sb, partial, true) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "'l2.bias'");
  tg_clear_error();
  OK(tg_load_state_dict(sb, partial, false));
  tg_state_dict_free(partial);
  tg_state_dict_free(loaded);
  tg_state_dict_free(sa);
  tg_state_dict_free(sb);
  unlink(path);
  mlp_free(&a);
  mlp_free(&b);
  CHECK(tg_live_count() == 0);
}

/* Two parameters whose updates read each other (every optimizer step of a multi-layer model): each
 * update must see the other's old value, though both realize in one schedule. */
TEST(assigns_reading_each_other_see_old_values) {
  tg_tensor a = tg_persist(tg_from_data((float[]){1, 10}, TG_SHAPE(2), NULL));
  tg_tensor b = tg_persist(tg_from_data((float[]){2, 20}, TG_SHAPE(2), NULL));
  tg_scope_begin();
  tg_tensor na = tg_sub(tg_detach(a), tg_mul_s(tg_sum(b, TG_ALL_AXES, false), 0.5));
  tg_tensor nb = tg_sub(tg_detach(b), tg_mul_s(a, 0.5));
  tg_assign(a, na);
  tg_assign(b, nb);
  tg_tensor ts[2] = {b, a};
  OK(tg_realize_many(ts, 2));
  float va[2], vb[2];
  OK(tg_data(a, va, sizeof va));
  OK(tg_data(b, vb, sizeof vb));
  CHECK_CLOSE(va[0], 1 - 11, 1e-6);
  CHECK_CLOSE(va[1], 10 - 11, 1e-6);
  CHECK_CLOSE(vb[0], 2 - 0.5, 1e-6);
  CHECK_CLOSE(vb[1], 20 - 5, 1e-6);
  tg_scope_end();
  tg_free(a), tg_free(b);
}

/* Optimizer-style state made with tg_zeros: equal constants are one hash-consed node, but assigning
 * into one of them must not change the others. */
TEST(assign_into_equal_lazy_constants_keeps_them_separate) {
  tg_tensor m = tg_persist(tg_zeros(TG_SHAPE(3), NULL)), v = tg_persist(tg_zeros(TG_SHAPE(3), NULL));
  tg_scope_begin();
  tg_assign(m, tg_add_s(m, 1));
  OK(tg_realize(m));
  float vm[3], vv[3];
  OK(tg_data(m, vm, sizeof vm));
  OK(tg_data(v, vv, sizeof vv));
  CHECK(vm[0] == 1 && vm[2] == 1);
  CHECK(vv[0] == 0 && vv[2] == 0);
  tg_scope_end();
  tg_free(m), tg_free(v);
  CHECK(tg_live_count() == 0);
}

/* Every layer: init, forward (and backward through it), state names, free -- no leaks (also run
 * under AddressSanitizer by make asan). */
TEST(every_layer_init_forward_state_free) {
  tg_manual_seed(4);
  tg_nn_linear lin;
  tg_nn_conv2d c2;
  tg_nn_conv_transpose2d ct2;
  tg_nn_conv1d c1;
  tg_nn_conv_transpose1d ct1;
  tg_nn_batchnorm bn;
  tg_nn_groupnorm gn;
  tg_nn_instancenorm in;
  tg_nn_layernorm ln;
  tg_nn_layernorm2d ln2;
  tg_nn_rmsnorm rms;
  tg_nn_embedding emb;
  tg_nn_lstmcell lstm;
  OK(tg_nn_linear_init(&lin, 4, 3, true));
  OK(tg_nn_conv2d_init(&c2, 2, 4, (const int64_t[]){3, 0}, true,
                       TG_CONV2D_OPTS(.padding = {1}, .npadding = 1)));
  OK(tg_nn_conv_transpose2d_init(&ct2, 4, 2, (const int64_t[]){2, 0}, true,
                                 TG_CONV_TRANSPOSE2D_OPTS(.stride = {2})));
  OK(tg_nn_conv1d_init(&c1, 2, 2, 3, false, TG_CONV1D_OPTS(.padding = 1)));
  OK(tg_nn_conv_transpose1d_init(&ct1, 2, 2, 3, true, NULL));
  OK(tg_nn_batchnorm_init(&bn, 4, NULL));
  OK(tg_nn_groupnorm_init(&gn, 2, 4, NULL));
  OK(tg_nn_instancenorm_init(&in, 4, TG_NORM_OPTS(.affine = false)));
  OK(tg_nn_layernorm_init(&ln, TG_SHAPE(4), NULL));
  OK(tg_nn_layernorm2d_init(&ln2, 4, NULL));
  OK(tg_nn_rmsnorm_init(&rms, 4, NULL));
  OK(tg_nn_embedding_init(&emb, 10, 4));
  OK(tg_nn_lstmcell_init(&lstm, 4, 3, true));
  size_t live = tg_live_count();
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_scope_begin();
  tg_tensor x = tg_randn(TG_SHAPE(2, 2, 5, 5), TG_OPTS(.requires_grad = true));
  tg_tensor y = tg_nn_conv2d_forward(&c2, x); /* (2, 4, 5, 5) */
  y = tg_nn_batchnorm_forward(&bn, y);
  y = tg_nn_groupnorm_forward(&gn, tg_nn_instancenorm_forward(&in, y));
  y = tg_nn_layernorm2d_forward(&ln2, y);
  y = tg_nn_conv_transpose2d_forward(&ct2, y); /* (2, 2, 10, 10) */
  tg_tensor s = tg_reshape(y, TG_SHAPE(2, 2, 100));
  s = tg_nn_conv_transpose1d_forward(&ct1, tg_nn_conv1d_forward(&c1, s)); /* (2, 2, 102) */
  tg_tensor v = tg_shrink(s, (const int64_t[]){0, 2, 0, 2, 0, 4}, 6);
  v = tg_reshape(v, TG_SHAPE(2, 8));
  tg_tensor e =
      tg_nn_embedding_forward(&emb, tg_from_data((int32_t[]){1, 7}, TG_SHAPE(2), TG_OPTS(.dtype = TG_INT32)));
  tg_tensor f = tg_add(tg_nn_rmsnorm_forward(&rms, tg_nn_layernorm_forward(&ln, e)),
                       tg_shrink(v, (const int64_t[]){0, 2, 0, 4}, 4));
  tg_tensor h, c;
  OK(tg_nn_lstmcell_forward(&lstm, f, (tg_tensor){0}, (tg_tensor){0}, &h, &c));
  tg_tensor out = tg_nn_linear_forward(
      &lin, tg_cat((tg_tensor[]){h, tg_shrink(c, (const int64_t[]){0, 2, 0, 1}, 4)}, 2, 1));
  tg_tensor loss = tg_sum(tg_mul(out, out), TG_ALL_AXES, false);
  OK(tg_backward(loss));
  tg_tensor g = tg_grad(x);
  CHECK(tg_valid(g));
  double gs = item(tg_sum(tg_abs(g), TG_ALL_AXES, false));
  CHECK(isfinite(gs) && gs > 0);
  OK(tg_realize(bn.running_mean));
  tg_scope_end();
  tg_context_end();
  CHECK(tg_live_count() == live);
  tg_state_dict *sd = tg_state_dict_new();
  OK(tg_nn_linear_state(&lin, sd, "lin"));
  OK(tg_nn_conv2d_state(&c2, sd, "c2"));
  OK(tg_nn_conv_transpose2d_state(&ct2, sd, "ct2"));
  OK(tg_nn_conv1d_state(&c1, sd, "c1"));
  OK(tg_nn_conv_transpose1d_state(&ct1, sd, "ct1"));
  OK(tg_nn_batchnorm_state(&bn, sd, "bn"));
  OK(tg_nn_groupnorm_state(&gn, sd, "gn"));
  OK(tg_nn_instancenorm_state(&in, sd, "in"));
  OK(tg_nn_layernorm_state(&ln, sd, "ln"));
  OK(tg_nn_layernorm2d_state(&ln2, sd, "ln2"));
  OK(tg_nn_rmsnorm_state(&rms, sd, "rms"));
  OK(tg_nn_embedding_state(&emb, sd, "emb"));
  OK(tg_nn_lstmcell_state(&lstm, sd, "lstm"));
  /* 2+2+2+1+2 conv, 5 bn, 2 gn, 0 in (no affine), 2+2 ln, 1 rms, 1 emb, 4 lstm */
  CHECK(tg_state_dict_len(sd) == 26);
  CHECK(tg_state_dict_get(sd, "bn.num_batches_tracked").id != 0);
  CHECK(tg_state_dict_get(sd, "lstm.weight_hh").id != 0);
  CHECK(!tg_state_dict_has(sd, "c1.bias"));
  CHECK(tg_state_dict_parameters(sd, true, NULL, 0) == 23);
  CHECK(tg_state_dict_parameters(sd, false, NULL, 0) == 26);
  int64_t nbt = 0;
  OK(tg_item_i64(tg_state_dict_get(sd, "bn.num_batches_tracked"), &nbt));
  CHECK(nbt == 1);
  tg_nn_linear_free(&lin);
  tg_nn_conv2d_free(&c2);
  tg_nn_conv_transpose2d_free(&ct2);
  tg_nn_conv1d_free(&c1);
  tg_nn_conv_transpose1d_free(&ct1);
  tg_nn_batchnorm_free(&bn);
  tg_nn_groupnorm_free(&gn);
  tg_nn_instancenorm_free(&in);
  tg_nn_layernorm_free(&ln);
  tg_nn_layernorm2d_free(&ln2);
  tg_nn_rmsnorm_free(&rms);
  tg_nn_embedding_free(&emb);
  tg_nn_lstmcell_free(&lstm);
  tg_nn_lstmcell_free(&lstm);         /* a freed (zeroed) layer frees nothing */
  CHECK(tg_state_dict_len(sd) == 26); /* the dict outlives the layers */
  tg_state_dict_free(sd);
  CHECK(tg_live_count() == 0);
  /* a freed layer is an error, not a crash */
  tg_scope_begin();
  CHECK(tg_nn_linear_forward(&lin, tg_ones(TG_SHAPE(1, 4), NULL)).id == 0);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_nn_linear_forward");
  tg_clear_error();
  tg_scope_end();
}

/* The options macros fill in tinygrad's defaults, so every field means the value written there:
 * lr 0, momentum 0, weight_decay 0, b1 0, BatchNorm momentum 0, eps 0 are all reachable. */
static double state_value(tg_optim *o, const char *name, int *count) {
  tg_state_dict *sd = tg_state_dict_new();
  double v = NAN;
  tg_scope_begin();
  if (tg_optim_state(o, sd, "") == TG_OK) {
    *count = tg_state_dict_len(sd);
    tg_tensor t = tg_state_dict_get(sd, name);
    if (t.id) v = item(tg_getitem(tg_flatten(t, 0, -1), TG_INDEX(TG_IX_INT(0))));
  }
  tg_scope_end();
  tg_clear_error();
  tg_state_dict_free(sd);
  return v;
}

TEST(options_zero_values_are_literal) {
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_tensor w = tg_persist(tg_from_data((float[]){1, -2}, TG_SHAPE(2), TG_OPTS(.requires_grad = true)));
  /* defaults: the macro with no designators and NULL agree */
  tg_optim *d1 = tg_optim_sgd(&w, 1, TG_SGD_OPTS()), *d2 = tg_optim_sgd(&w, 1, NULL);
  CHECK_CLOSE(tg_optim_get_lr(d1), 0.001, 1e-9);
  CHECK_CLOSE(tg_optim_get_lr(d2), 0.001, 1e-9);
  tg_optim_free(d1), tg_optim_free(d2);
  /* lr = 0: a step leaves the parameter as it is */
  tg_optim *o = tg_optim_sgd(&w, 1, TG_SGD_OPTS(.lr = 0, .momentum = 0.9));
  CHECK(o != NULL);
  CHECK_CLOSE(tg_optim_get_lr(o), 0.0, 0);
  tg_scope_begin();
  OK(tg_backward(tg_sum(tg_mul(w, w), TG_ALL_AXES, false)));
  OK(tg_optim_step(o));
  tg_scope_end();
  float v[2];
  OK(tg_data(w, v, sizeof v));
  CHECK(v[0] == 1 && v[1] == -2);
  tg_optim_zero_grad(o);
  tg_optim_free(o);
  /* momentum 0 means no momentum buffer, for SGD and for LARS (whose default is 0.9) */
  int n_sgd = 0, n_lars = 0, n_lars_def = 0;
  o = tg_optim_sgd(&w, 1, TG_SGD_OPTS(.lr = 0.1, .momentum = 0));
  state_value(o, "lr", &n_sgd);
  tg_optim_free(o);
  o = tg_optim_lars(&w, 1, TG_LARS_OPTS(.momentum = 0, .weight_decay = 0));
  state_value(o, "lr", &n_lars);
  tg_optim_free(o);
  o = tg_optim_lars(&w, 1, NULL);
  state_value(o, "lr", &n_lars_def);
  tg_optim_free(o);
  CHECK_MSG(n_sgd == 1 && n_lars == 1 && n_lars_def == 2, "state sizes %d %d %d", n_sgd, n_lars, n_lars_def);
  /* b1 = 0: b1_t becomes 0 after one step (the default 0.9 gives 0.9) */
  int cnt = 0;
  tg_optim *a0 = tg_optim_adam(&w, 1, TG_ADAM_OPTS(.b1 = 0, .lr = 0)),
           *a9 = tg_optim_adam(&w, 1, TG_ADAM_OPTS(.lr = 0));
  tg_scope_begin();
  OK(tg_backward(tg_sum(tg_mul(w, w), TG_ALL_AXES, false)));
  OK(tg_optim_step(a0));
  OK(tg_optim_step(a9));
  tg_scope_end();
  CHECK_CLOSE(state_value(a0, "b1_t", &cnt), 0.0, 0);
  CHECK_CLOSE(state_value(a9, "b1_t", &cnt), 0.9, 1e-7);
  tg_optim_free(a0), tg_optim_free(a9);
  tg_zero_grad(w);
  /* AdamW with weight_decay 0 takes the same steps as Adam; with the default 0.01 it does not */
  float r[3][2];
  for (int k = 0; k < 3; k++) {
    tg_tensor p = tg_persist(tg_from_data((float[]){1, -2}, TG_SHAPE(2), TG_OPTS(.requires_grad = true)));
    tg_optim *q = k == 0   ? tg_optim_adam(&p, 1, TG_ADAM_OPTS(.lr = 0.1))
                  : k == 1 ? tg_optim_adamw(&p, 1, TG_ADAMW_OPTS(.lr = 0.1, .weight_decay = 0))
                           : tg_optim_adamw(&p, 1, TG_ADAMW_OPTS(.lr = 0.1));
    for (int s = 0; s < 3; s++) {
      tg_scope_begin();
      tg_optim_zero_grad(q);
      OK(tg_backward(tg_sum(tg_mul(p, p), TG_ALL_AXES, false)));
      OK(tg_optim_step(q));
      tg_scope_end();
    }
    OK(tg_data(p, r[k], sizeof r[k]));
    tg_optim_free(q);
    tg_free(p);
  }
  CHECK(r[0][0] == r[1][0] && r[0][1] == r[1][1]);
  CHECK(r[0][0] != r[2][0]);
  tg_free(w);
  /* BatchNorm momentum 0: training leaves the running statistics as they were */
  tg_nn_batchnorm bn;
  OK(tg_nn_batchnorm_init(&bn, 2, TG_BATCHNORM_OPTS(.momentum = 0)));
  CHECK(bn.momentum == 0 && bn.eps == 1e-5 && bn.affine && bn.track_running_stats);
  tg_scope_begin();
  tg_tensor x = tg_from_data((float[]){1, 2, 3, 5, 7, 11}, TG_SHAPE(3, 2), NULL);
  OK(tg_realize(tg_nn_batchnorm_forward(&bn, x)));
  OK(tg_realize(bn.running_mean));
  float rm[2], rv[2];
  OK(tg_data(bn.running_mean, rm, sizeof rm));
  OK(tg_data(bn.running_var, rv, sizeof rv));
  CHECK(rm[0] == 0 && rm[1] == 0 && rv[0] == 1 && rv[1] == 1);
  tg_scope_end();
  tg_nn_batchnorm_free(&bn);
  tg_context_end();
  /* eps 0 is kept; the RMSNorm default differs from the others */
  tg_nn_layernorm ln;
  tg_nn_rmsnorm rms;
  OK(tg_nn_layernorm_init(&ln, TG_SHAPE(4), TG_NORM_OPTS(.eps = 0)));
  OK(tg_nn_rmsnorm_init(&rms, 4, NULL));
  CHECK(ln.eps == 0 && ln.weight.id && rms.eps == 1e-6 && rms.weight.id);
  tg_nn_layernorm_free(&ln);
  tg_nn_rmsnorm_free(&rms);
  CHECK(tg_live_count() == 0);
}

/* tinygrad's OptimizerGroup. Expected values from tinygrad 0.14: a = [1, -2], b = [0.5, 1.5, -1],
 * OptimizerGroup(Adam([a], lr=0.1), SGD([b], lr=0.1, momentum=0.9)), three steps of zero_grad,
 * ((a*a).sum() + (b*b*b).sum()).backward(), step: a [0.70158923, -1.70062637], b [0.16619422,
 * -0.71725941, -4.07047844], SGD's momentum buffer [1.37118292, 7.30571890, 19.93478584], Adam's m
 * [0.48408288, -1.02603376]; get_state_dict(group) names them optimizers.0.m.0 and optimizers.1.b.0. */
TEST(optimizer_group) {
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_tensor a = tg_persist(tg_from_data((float[]){1, -2}, TG_SHAPE(2), NULL));
  tg_tensor b = tg_persist(tg_from_data((float[]){0.5f, 1.5f, -1}, TG_SHAPE(3), NULL));
  tg_optim *g = tg_optim_group((tg_optim *[]){tg_optim_adam(&a, 1, TG_ADAM_OPTS(.lr = 0.1)),
                                              tg_optim_sgd(&b, 1, TG_SGD_OPTS(.lr = 0.1, .momentum = 0.9))},
                               2);
  CHECK(g != NULL && tg_optim_group_count(g) == 2);
  tg_optim *adam = tg_optim_group_get(g, 0), *sgd = tg_optim_group_get(g, 1);
  CHECK(adam && sgd && tg_optim_group_count(adam) == 0);
  CHECK_CLOSE(tg_optim_get_lr(adam), 0.1, 1e-7);
  /* Adam's b1_t, b2_t, m.0, v.0 and a, then SGD's momentum buffer and b */
  CHECK(tg_optim_schedule_step(g, NULL, 0) == 4 + 1 + 2);
  for (int step = 0; step < 3; step++) {
    tg_scope_begin();
    tg_optim_zero_grad(g);
    tg_tensor loss = tg_add(tg_sum(tg_mul(a, a), TG_ALL_AXES, false), tg_sum(tg_mul(tg_mul(b, b), b), TG_ALL_AXES, false));
    OK(tg_backward(loss));
    if (step < 2) {
      OK(tg_optim_step(g));
    } else { /* the loss and both optimizers' updates in one schedule */
      tg_tensor ts[8];
      ts[0] = loss;
      int n = tg_optim_schedule_step(g, ts + 1, 7);
      CHECK(n == 7 && ts[5].id == a.id && ts[7].id == b.id); /* member by member, each parameters last */
      OK(tg_realize_many(ts, n + 1));
    }
    tg_scope_end();
  }
  float av[2], bv[3];
  OK(tg_data(a, av, sizeof av));
  OK(tg_data(b, bv, sizeof bv));
  CHECK_CLOSE(av[0], 0.70158923, 1e-5);
  CHECK_CLOSE(av[1], -1.70062637, 1e-5);
  CHECK_CLOSE(bv[0], 0.16619422, 1e-5);
  CHECK_CLOSE(bv[1], -0.71725941, 1e-5);
  CHECK_CLOSE(bv[2], -4.07047844, 1e-5);
  int cnt = 0;
  CHECK_CLOSE(state_value(g, "optimizers.1.b.0", &cnt), 1.37118292, 1e-5);
  CHECK(cnt == 5 + 2); /* Adam's lr, b1_t, b2_t, m.0, v.0; SGD's lr, b.0 */
  CHECK_CLOSE(state_value(g, "optimizers.0.m.0", &cnt), 0.48408288, 1e-5);
  /* the members' learning rates, not the group's */
  OK(tg_optim_set_lr(sgd, 0.05));
  CHECK_CLOSE(state_value(g, "optimizers.1.lr", &cnt), 0.05, 1e-7);
  CHECK(tg_optim_set_lr(g, 0.1) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_optim_set_lr: an optimizer group");
  CHECK_STR_CONTAINS(tg_last_error(), "tg_optim_group_get");
  tg_clear_error();
  CHECK(isnan(tg_optim_get_lr(g)) && tg_optim_lr(g).id == 0);
  tg_clear_error();
  CHECK(tg_optim_group_get(g, 2) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "index 2 is out of range for a group of 2");
  tg_clear_error();
  CHECK(tg_optim_group_get(adam, 0) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "not a group");
  tg_clear_error();
  /* nothing is assigned unless every member can step */
  tg_optim_zero_grad(g);
  tg_scope_begin();
  OK(tg_backward(tg_sum(tg_mul(a, a), TG_ALL_AXES, false)));
  CHECK(tg_optim_step(g) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "group member 1: SGD parameter 0 has no gradient");
  tg_clear_error();
  OK(tg_data(a, av, sizeof av));
  CHECK_CLOSE(av[0], 0.70158923, 1e-5);
  tg_scope_end();
  tg_optim_zero_grad(g);
  /* a group of a group: state names nest as in tinygrad */
  tg_tensor c = tg_persist(tg_from_data((float[]){3}, TG_SHAPE(1), NULL));
  tg_optim *outer = tg_optim_group((tg_optim *[]){g, tg_optim_sgd(&c, 1, NULL)}, 2);
  CHECK(outer != NULL);
  CHECK_CLOSE(state_value(outer, "optimizers.0.optimizers.1.lr", &cnt), 0.05, 1e-7);
  CHECK_CLOSE(state_value(outer, "optimizers.1.lr", &cnt), 0.001, 1e-7);
  tg_optim_free(outer); /* frees g and its members too */
  /* errors: each frees what it was given */
  CHECK(tg_optim_group(NULL, 1) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_optim_group: needs at least one optimizer");
  tg_clear_error();
  tg_tensor none = {0};
  CHECK(tg_optim_group((tg_optim *[]){tg_optim_sgd(&a, 1, NULL), tg_optim_sgd(&none, 1, NULL)}, 2) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_optim_sgd"); /* the constructor's error comes first */
  tg_clear_error();
  CHECK(tg_optim_group((tg_optim *[]){tg_optim_sgd(&a, 1, NULL), NULL}, 2) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "optimizer 1 is NULL");
  tg_clear_error();
  CHECK(tg_optim_group((tg_optim *[]){tg_optim_sgd(&b, 1, NULL), tg_optim_adam((tg_tensor[]){a, b}, 2, NULL)}, 2) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "parameter 1 of optimizer 1 (Adam) is also in optimizer 0 (SGD)");
  tg_clear_error();
  tg_optim *once = tg_optim_sgd(&a, 1, NULL);
  CHECK(tg_optim_group((tg_optim *[]){once, once}, 2) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "listed twice");
  tg_clear_error();
  tg_optim *inner = tg_optim_group((tg_optim *[]){tg_optim_sgd(&a, 1, NULL)}, 1);
  CHECK(tg_optim_group((tg_optim *[]){inner, tg_optim_group_get(inner, 0)}, 2) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "listed twice");
  tg_clear_error();
  tg_free(a), tg_free(b), tg_free(c);
  tg_context_end();
  CHECK(tg_live_count() == 0);
}

/* Adam, AdamW and LAMB on a float16 parameter with small gradients: the moments' increments are
 * formed in their float32 state (rounded to float16, (1 - b2) * g * g was 0 below |g| ~ 8e-3, and
 * the step lr * g / eps took a weight to -4732); one step with lr 0.01 moves every weight by lr
 * (Adam's first step is lr * sign(g)), as tinygrad's and torch.optim's */
TEST(adam_lamb_float16_small_gradients) {
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  for (int k = 0; k < 3; k++) {
    tg_scope_begin();
    float w0[3] = {0.5f, 0.5f, 0.5f}, c[3] = {0.004734f, 0.001f, 0.05f};
    tg_tensor w = tg_persist(tg_contiguous(tg_cast(tg_from_data(w0, TG_SHAPE(3), NULL), TG_FLOAT16)));
    CHECK(tg_realize(w) == TG_OK);
    tg_optim *o = k == 0   ? tg_optim_adam(&w, 1, TG_ADAM_OPTS(.lr = 0.01))
                  : k == 1 ? tg_optim_adamw(&w, 1, TG_ADAMW_OPTS(.lr = 0.01))
                           : tg_optim_lamb(&w, 1, TG_LAMB_OPTS(.lr = 0.01));
    tg_tensor gc = tg_cast(tg_from_data(c, TG_SHAPE(3), NULL), TG_FLOAT16);
    CHECK(tg_backward(tg_sum(tg_mul(w, gc), NULL, 0, false)) == TG_OK);
    CHECK(tg_optim_step(o) == TG_OK);
    float out[3];
    CHECK(tg_data(tg_cast(w, TG_FLOAT32), out, sizeof out) == TG_OK);
    /* LAMB: the trust ratio |w| / |update| scales lr * sign(g) to lr / 2 */
    double want = k == 2 ? 0.495 : 0.49;
    for (int i = 0; i < 3; i++) CHECK_MSG(fabs(out[i] - want) < 1e-3, "optimizer %d weight %d: %g, want %g", k, i, out[i], want);
    tg_optim_free(o);
    tg_free(w);
    tg_scope_end();
  }
  tg_context_end();
  CHECK(tg_live_count() == 0);
}

int main(void) { return RUN_TESTS(); }
