/*
 * beautiful_mnist_multigpu.c -- tinygrad's examples/beautiful_mnist_multigpu.py in C: the
 * beautiful_mnist CNN trained data-parallel over GPUS devices of DEV's kind (CPU:0..CPU:n-1 with
 * DEV=CPU, CL:0.. with DEV=CL). The weights (and BatchNorm statistics) are replicated on every
 * device, each step's batch is sharded on axis 0, and the whole step is TinyJit'd: the gradients of
 * the replicated weights are allreduced by the library (the reduction over the sharded batch), so the
 * losses equal the single-device run's up to float rounding.
 *
 *   GPUS=2 BS=512 STEPS=70 ./build/examples/beautiful_mnist_multigpu
 *
 * Knobs: GPUS (default 2; 1 is the single-device run), BS, STEPS, SEED, EVAL_N (test accuracy on the
 * first n test images), MNIST_DIR/FASHION as in beautiful_mnist. Prints "step <i> loss <x>" per step
 * and the final test accuracy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>

#include "mnist_model.h"

typedef struct {
  Ctx c;
  const char **devs;
  int ndev;
} MCtx;

/* train_step with the batch sharded over the devices */
static tg_status train_step_multi(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                                  void *user) {
  (void)in, (void)nin, (void)args, (void)nargs, (void)nout;
  MCtx *m = user;
  Ctx *c = &m->c;
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_optim_zero_grad(c->opt);
  tg_tensor samples = tg_randint(TG_SHAPE(c->bs), 0, tg_dim(c->X_train, 0), NULL);
  tg_tensor X = tg_index(c->X_train, samples), Y = tg_index(c->Y_train, samples);
  if (m->ndev > 1) X = tg_shard(X, m->devs, m->ndev, 0), Y = tg_shard(Y, m->devs, m->ndev, 0);
  tg_tensor loss = tg_sparse_categorical_crossentropy(model_forward(c->model, X), Y, NULL);
  tg_status st = backward_step(c->opt, loss);
  tg_context_end();
  out[0] = loss;
  return st;
}

static tg_status test_acc(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *user) {
  (void)in, (void)nin, (void)args, (void)nargs, (void)nout;
  Ctx *c = user;
  tg_tensor pred = tg_argmax(model_forward(c->model, c->X_test), TG_AXES(1), false);
  out[0] = tg_mul_s(tg_mean(tg_eq(pred, c->Y_test), TG_ALL_AXES, false), 100);
  return TG_OK;
}

static int fail(const char *what) {
  fprintf(stderr, "beautiful_mnist_multigpu: %s: %s\n", what, tg_last_error() ? tg_last_error() : "unknown error");
  return 1;
}

int main(void) {
  int64_t bs = tg_getenv_int("BS", 512), steps = tg_getenv_int("STEPS", 70), gpus = tg_getenv_int("GPUS", 2);
  if (bs <= 0 || steps < 0 || gpus < 1 || gpus > 64) {
    fprintf(stderr, "beautiful_mnist_multigpu: BS=%lld, STEPS=%lld and GPUS=%lld must be positive (GPUS at most 64)\n",
            (long long)bs, (long long)steps, (long long)gpus);
    return 1;
  }
  /* GPUS devices of DEV's kind: the part of DEV before its first ':' */
  const char *dev = getenv("DEV") && *getenv("DEV") ? getenv("DEV") : "CPU";
  char kind[64];
  snprintf(kind, sizeof kind, "%.*s", (int)strcspn(dev, ":"), dev);
  char names[64][80];
  const char *devs[64];
  for (int i = 0; i < gpus; i++) snprintf(names[i], sizeof names[i], "%s:%d", kind, i), devs[i] = names[i];
  const char *dir = getenv("MNIST_DIR");
  bool fashion = dir && *dir ? tg_getenv_int("FASHION", 0) != 0 : true;
  tg_manual_seed((uint64_t)tg_getenv_int("SEED", 42));
  tg_scope_begin();
  MCtx m = {0};
  m.devs = devs, m.ndev = (int)gpus;
  Ctx *c = &m.c;
  c->bs = bs;
  if (tg_mnist_load(dir && *dir ? dir : NULL, fashion, &c->X_train, &c->Y_train, &c->X_test, &c->Y_test) != TG_OK)
    return fail("loading the dataset");
  int64_t eval_n = tg_getenv_int("EVAL_N", 0);
  if (eval_n > 0 && eval_n < tg_dim(c->X_test, 0)) {
    c->X_test = tg_shrink(c->X_test, (const int64_t[]){0, eval_n, 0, 1, 0, 28, 0, 28}, 8);
    c->Y_test = tg_shrink(c->Y_test, (const int64_t[]){0, eval_n}, 2);
  }
  Model model;
  memset(&model, 0, sizeof model);
  c->model = &model;
  if (model_init(&model) != TG_OK) return fail("creating the model");
  tg_state_dict *sd = tg_state_dict_new();
  if (model_state(&model, sd) != TG_OK) return fail("collecting parameters");
  int np = tg_state_dict_parameters(sd, false, NULL, 0);
  tg_tensor *params = malloc(sizeof(tg_tensor) * (size_t)(np + 1));
  tg_state_dict_parameters(sd, false, params, np);
  /* for x in get_state_dict(model).values(): x.to_(GPUS) */
  for (int i = 0; gpus > 1 && i < np; i++)
    if (tg_shard_(params[i], devs, (int)gpus, TG_SHARD_NONE) != TG_OK) return fail("replicating the weights");
  c->opt = tg_optim_adam(params, np, NULL);
  free(params);
  if (!c->opt) return fail("creating the optimizer");
  if (gpus > 1) {
    c->X_test = tg_shard(c->X_test, devs, (int)gpus, 0);
    c->Y_test = tg_shard(c->Y_test, devs, (int)gpus, 0);
    if (tg_realize(c->X_test) != TG_OK || tg_realize(c->Y_test) != TG_OK) return fail("sharding the test set");
  }
  printf("%lld device%s (%s", (long long)gpus, gpus > 1 ? "s" : "", devs[0]);
  for (int i = 1; i < gpus; i++) printf(", %s", devs[i]);
  printf("), BS=%lld, %lld steps\n", (long long)bs, (long long)steps);
  tg_jit *jtrain = tg_jit_new(train_step_multi, 1, &m), *jtest = tg_jit_new(test_acc, 1, c);
  double loss = 0, acc = 0;
  for (int64_t i = 0; i < steps; i++) {
    tg_scope_begin();
    tg_tensor lo;
    if (tg_jit_call(jtrain, NULL, 0, NULL, 0, &lo) != TG_OK || tg_item(lo, &loss) != TG_OK) return fail("train step");
    printf("step %lld loss %.6f\n", (long long)i, loss);
    tg_scope_end();
  }
  tg_tensor a;
  if (tg_jit_call(jtest, NULL, 0, NULL, 0, &a) != TG_OK || tg_item(a, &acc) != TG_OK) return fail("test accuracy");
  printf("test_accuracy %.2f%%\n", acc);
  tg_jit_free(jtrain), tg_jit_free(jtest);
  tg_optim_free(c->opt);
  tg_state_dict_free(sd);
  model_free(&model);
  tg_scope_end();
  return 0;
}
