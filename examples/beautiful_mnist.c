/*
 * beautiful_mnist.c -- tinygrad's examples/beautiful_mnist.py in C.
 *
 * A small CNN trained on Fashion-MNIST (Debian's dataset-fashion-mnist; MNIST_DIR=<dir> uses a
 * directory of the original MNIST files instead) with Adam. The train step and the test accuracy are
 * TinyJit'd: the second call captures their kernels and every later call just replays them.
 *
 *   BS=512 STEPS=70 TARGET_EVAL_ACC_PCT=83 ./build/examples/beautiful_mnist
 *
 * Knobs (tinygrad's names): BS, STEPS, FASHION (with MNIST_DIR), TARGET_EVAL_ACC_PCT, SEED; EVAL_N=n
 * measures the test accuracy on the first n test images only (a quick check on a slow device); the
 * trained weights are saved to MNIST_SAVE (default mnist.safetensors; empty to skip). BENCH=1 also
 * prints timings for bench/mnist.py on stdout ("bench step=<i> ms=<t>" per train step, "bench eval=<k>
 * ms=<t>" per test-accuracy call) and evaluates three times more after training, through a TinyJit
 * that reruns every kernel, so that the last evaluation is a full replay. MNIST_TRACE=<dir> writes what bench/mnist_lockstep.py replays in
 * PyTorch: the initial weights (<dir>/init.safetensors), each step's batch indices (<dir>/samples.bin,
 * int32) and loss (<dir>/losses.txt).
 *
 * Data-parallel over MPI: started by mpirun (`mpirun -np 2 ./build/examples/beautiful_mnist`), every
 * rank draws the same global batch of BS images and trains on its BS/ranks slice; the BatchNorm
 * statistics are over the whole batch (their sums allreduced) and the gradients are averaged over the
 * ranks before Adam's step, all inside the one jitted step, so the run gives the losses and accuracy
 * of one process with the same BS. The initial weights are rank 0's; rank 0 alone prints progress
 * and writes MNIST_SAVE and MNIST_TRACE.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <tinygrad.h>

#include "mnist_model.h"

/* @TinyJit def get_test_acc(): return (model(X_test).argmax(axis=1) == Y_test).mean()*100 */
static tg_status test_acc(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                          void *user) {
  (void)in, (void)nin, (void)args, (void)nargs, (void)nout;
  Ctx *c = user;
  tg_tensor pred = tg_argmax(model_forward(c->model, c->X_test), TG_AXES(1), false);
  out[0] = tg_mul_s(tg_mean(tg_eq(pred, c->Y_test), TG_ALL_AXES, false), 100);
  return TG_OK;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* tinygrad's trange: "<desc>:  43%|████▎     | 30/70 [00:12<00:16,  2.41it/s]" */
static void progress(const char *desc, int i, int total, double t0) {
  double el = now() - t0, rate = i > 0 ? i / el : 0;
  double left = rate > 0 ? (total - i) / rate : 0;
  int width = 20, filled = total ? i * width / total : width;
  char bar[128] = {0};
  int o = 0;
  for (int k = 0; k < width; k++) o += snprintf(bar + o, sizeof bar - (size_t)o, "%s", k < filled ? "\u2588" : " ");
  fprintf(stderr, "\r%s: %3d%%|%s| %d/%d [%02d:%02d<%02d:%02d, %5.2fit/s]", desc, total ? i * 100 / total : 100, bar, i, total,
          (int)el / 60, (int)el % 60, (int)left / 60, (int)left % 60, rate);
  fflush(stderr);
}

static int fail(const char *what) {
  fprintf(stderr, "\nbeautiful_mnist: %s: %s\n", what, tg_last_error() ? tg_last_error() : "unknown error");
  return 1;
}

int main(void) {
  int64_t bs = tg_getenv_int("BS", 512), steps = tg_getenv_int("STEPS", 70);
  const char *target_s = getenv("TARGET_EVAL_ACC_PCT");
  char *tend = NULL;
  double target = target_s && *target_s ? strtod(target_s, &tend) : 0.0;
  if (tend && (*tend || !(target >= 0 && target <= 100))) {
    fprintf(stderr, "beautiful_mnist: TARGET_EVAL_ACC_PCT=%s is not a percentage (0..100)\n", target_s);
    return 1;
  }
  const char *dir = getenv("MNIST_DIR");
  bool fashion = dir && *dir ? tg_getenv_int("FASHION", 0) != 0 : true;
  const char *save = getenv("MNIST_SAVE") ? getenv("MNIST_SAVE") : "mnist.safetensors";
  const char *trace = getenv("MNIST_TRACE");
  bool bench = tg_getenv_int("BENCH", 0) != 0;
  int nevals = 0;
  if (bench) setvbuf(stdout, NULL, _IOLBF, 0); /* bench/mnist.py reads the lines as they come */
  if (bs <= 0 || steps <= 0) {
    fprintf(stderr, "beautiful_mnist: BS=%lld and STEPS=%lld must be positive\n", (long long)bs, (long long)steps);
    return 1;
  }
  tg_manual_seed((uint64_t)tg_getenv_int("SEED", 42));
  Ctx c = {0};
  c.bs = bs, c.ranks = 1;
  const char *world = getenv("OMPI_COMM_WORLD_SIZE"); /* set by Open MPI's mpirun */
  if (world && atoi(world) > 1) {
    if (tg_dist_init() != TG_OK) return fail("starting MPI");
    c.rank = tg_dist_rank(), c.ranks = tg_dist_size();
    if (bs % c.ranks) {
      fprintf(stderr, "beautiful_mnist: BS=%lld must be a multiple of the %d MPI ranks\n", (long long)bs, c.ranks);
      tg_dist_finalize();
      return 1;
    }
  }
  bool lead = c.rank == 0;
  if (!lead) save = NULL, trace = NULL;
  tg_scope_begin();
  if (tg_mnist_load(dir && *dir ? dir : NULL, fashion, &c.X_train, &c.Y_train, &c.X_test, &c.Y_test) != TG_OK)
    return fail("loading the dataset");
  int64_t eval_n = tg_getenv_int("EVAL_N", 0);
  if (eval_n > 0 && eval_n < tg_dim(c.X_test, 0)) { /* EVAL_N: the test accuracy over the first n test images */
    int64_t b[2 * 8];
    int nd = tg_ndim(c.X_test);
    for (int k = 0; k < nd && k < 8; k++) b[2 * k] = 0, b[2 * k + 1] = k ? tg_dim(c.X_test, k) : eval_n;
    c.X_test = tg_shrink(c.X_test, b, 2 * nd);
    c.Y_test = tg_shrink(c.Y_test, (const int64_t[]){0, eval_n}, 2);
  }
  Model model;
  memset(&model, 0, sizeof model);
  c.model = &model;
  if (model_init_dist(&model, c.ranks > 1) != TG_OK) return fail("creating the model");
  tg_state_dict *sd = tg_state_dict_new();
  if (model_state(&model, sd) != TG_OK) return fail("collecting parameters");
  int np = tg_state_dict_parameters(sd, false, NULL, 0);
  tg_tensor *params = malloc(sizeof(tg_tensor) * (size_t)(np + 1));
  tg_state_dict_parameters(sd, false, params, np);
  c.opt = tg_optim_adam(params, np, NULL);
  c.params = params, c.nparams = np;
  if (!c.opt) return fail("creating the optimizer");
  for (int k = 0; c.ranks > 1 && k < np; k++) /* every rank starts from rank 0's weights */
    if (!tg_valid(tg_assign(params[k], tg_dist_broadcast(params[k], 0))) || tg_realize(params[k]) != TG_OK)
      return fail("broadcasting the initial weights");
  if (lead) {
    printf("%s: %lld train / %lld test images, BS=%lld, %lld steps", fashion ? "Fashion-MNIST" : "MNIST",
           (long long)tg_dim(c.X_train, 0), (long long)tg_dim(c.X_test, 0), (long long)bs, (long long)steps);
    if (c.ranks > 1) printf(", data-parallel over %d MPI ranks (%lld images each)", c.ranks, (long long)(bs / c.ranks));
    printf("\n");
  }

  FILE *fsamples = NULL, *flosses = NULL;
  int32_t *idx = NULL;
  if (trace && *trace) {
    char path[4096];
    snprintf(path, sizeof path, "%s/init.safetensors", trace);
    if (tg_safe_save(sd, path) != TG_OK) return fail("MNIST_TRACE: saving the initial weights");
    snprintf(path, sizeof path, "%s/samples.bin", trace);
    fsamples = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/losses.txt", trace);
    flosses = fopen(path, "w");
    idx = malloc(sizeof(int32_t) * (size_t)bs);
    if (!fsamples || !flosses || !idx) {
      fprintf(stderr, "beautiful_mnist: MNIST_TRACE: cannot write to %s\n", trace);
      return 1;
    }
  }
  tg_jit *jtrain = tg_jit_new(train_step, fsamples ? 2 : 1, &c), *jtest = tg_jit_new(test_acc, 1, &c);
  double acc = NAN, loss = NAN, t0 = now();
  char desc[128];
  for (int64_t i = 0; i < steps; i++) {
    tg_scope_begin();
    tg_global_counters_reset();
    tg_tensor lo[2];
    double ts = now();
    if (tg_jit_call(jtrain, NULL, 0, NULL, 0, lo) != TG_OK || tg_item(lo[0], &loss) != TG_OK) return fail("train step");
    if (bench && lead) printf("bench step=%lld ms=%.3f\n", (long long)i, (now() - ts) * 1e3);
    if (fsamples) {
      if (tg_data(lo[1], idx, sizeof(int32_t) * (size_t)bs) != TG_OK) return fail("MNIST_TRACE: reading the batch");
      if (fwrite(idx, sizeof(int32_t), (size_t)bs, fsamples) != (size_t)bs || fprintf(flosses, "%.9g\n", loss) < 0) {
        fprintf(stderr, "beautiful_mnist: MNIST_TRACE: cannot write to %s: %s\n", trace, strerror(errno));
        return 1;
      }
    }
    if (i % 10 == 9 || i == steps - 1) {
      tg_tensor a;
      ts = now();
      if (tg_jit_call(jtest, NULL, 0, NULL, 0, &a) != TG_OK || tg_item(a, &acc) != TG_OK) return fail("test accuracy");
      if (bench && lead) printf("bench eval=%d ms=%.3f\n", nevals++, (now() - ts) * 1e3);
    }
    tg_scope_end();
    snprintf(desc, sizeof desc, "loss: %6.2f test_accuracy: %5.2f%%", loss, acc);
    if (lead) progress(desc, (int)i + 1, (int)steps, t0);
  }
  if (lead) fprintf(stderr, "\n");
  if (fsamples) {
    /* (a full disk shows at the last flush: a short trace would be replayed as if whole) */
    bool ok = fclose(fsamples) == 0;
    ok = fclose(flosses) == 0 && ok;
    free(idx);
    if (!ok) {
      fprintf(stderr, "beautiful_mnist: MNIST_TRACE: cannot write to %s: %s\n", trace, strerror(errno));
      return 1;
    }
  }
  /* BENCH: the last of these is a TinyJit replay. The evaluation reads no input, only the weights,
   * so jtest's replays skip it while the weights stay unchanged (its result stays in the jit's
   * buffers): the timed jit runs every kernel on every replay instead. */
  tg_jit *jeval = bench ? tg_jit_new_opts(test_acc, 1, &c, TG_JIT_OPTS(.rerun_constants = true)) : NULL;
  for (int k = 0; bench && k < 3; k++) {
    tg_scope_begin();
    tg_tensor a;
    double ts = now();
    if (tg_jit_call(jeval, NULL, 0, NULL, 0, &a) != TG_OK || tg_item(a, &acc) != TG_OK) return fail("test accuracy");
    if (lead) printf("bench eval=%d ms=%.3f\n", nevals++, (now() - ts) * 1e3);
    tg_scope_end();
  }
  if (lead) printf("final: loss %.4f, test accuracy %.2f%% (%.1f s)\n", loss, acc, now() - t0);
  int rc = 0;
  if (save && *save) {
    if (tg_safe_save(sd, save) != TG_OK) rc = fail("saving weights");
    else printf("saved weights to %s\n", save);
  }
  if (target > 0 && !(acc >= target)) {
    fprintf(stderr, "test accuracy %.2f%% is below TARGET_EVAL_ACC_PCT=%.2f%%\n", acc, target);
    rc = 1;
  }
  tg_jit_free(jtrain);
  tg_jit_free(jtest);
  if (jeval) tg_jit_free(jeval);
  tg_optim_free(c.opt);
  tg_state_dict_free(sd);
  model_free(&model);
  free(params);
  tg_scope_end();
  if (c.ranks > 1 && tg_dist_finalize() != TG_OK) rc = fail("ending MPI");
  return rc;
}
