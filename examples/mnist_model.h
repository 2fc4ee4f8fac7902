/*
 * mnist_model.h -- the beautiful_mnist CNN (tinygrad's examples/beautiful_mnist.py), shared by
 * examples/beautiful_mnist.c, examples/export_mnist.c and tests/test_export.c: its layers, their
 * creation and release, the forward pass, the state-dict names tinygrad gives them, and the jitted
 * training step of the examples.
 */
#ifndef TG_EXAMPLES_MNIST_MODEL_H
#define TG_EXAMPLES_MNIST_MODEL_H

#include <stdlib.h>
#include <tinygrad.h>

typedef struct {
  tg_nn_conv2d c1, c2, c3, c4;
  tg_nn_batchnorm b1, b2;
  tg_nn_linear l;
} Model;

/* dist: the BatchNorms take their batch statistics over all MPI ranks (data-parallel training) */
static inline tg_status model_init_dist(Model *m, bool dist) {
  tg_status st = TG_OK;
  const tg_batchnorm_opts *bn = TG_BATCHNORM_OPTS(.dist = dist);
  if (st == TG_OK) st = tg_nn_conv2d_init(&m->c1, 1, 32, (const int64_t[2]){5}, true, NULL);
  if (st == TG_OK) st = tg_nn_conv2d_init(&m->c2, 32, 32, (const int64_t[2]){5}, true, NULL);
  if (st == TG_OK) st = tg_nn_batchnorm_init(&m->b1, 32, bn);
  if (st == TG_OK) st = tg_nn_conv2d_init(&m->c3, 32, 64, (const int64_t[2]){3}, true, NULL);
  if (st == TG_OK) st = tg_nn_conv2d_init(&m->c4, 64, 64, (const int64_t[2]){3}, true, NULL);
  if (st == TG_OK) st = tg_nn_batchnorm_init(&m->b2, 64, bn);
  if (st == TG_OK) st = tg_nn_linear_init(&m->l, 576, 10, true);
  return st;
}
static inline tg_status model_init(Model *m) { return model_init_dist(m, false); }

static inline void model_free(Model *m) {
  tg_nn_conv2d_free(&m->c1), tg_nn_conv2d_free(&m->c2), tg_nn_conv2d_free(&m->c3), tg_nn_conv2d_free(&m->c4);
  tg_nn_batchnorm_free(&m->b1), tg_nn_batchnorm_free(&m->b2);
  tg_nn_linear_free(&m->l);
}

/* tinygrad: self.layers = [Conv2d(1,32,5), relu, Conv2d(32,32,5), relu, BatchNorm(32), max_pool2d,
 * Conv2d(32,64,3), relu, Conv2d(64,64,3), relu, BatchNorm(64), max_pool2d, flatten(1), Linear(576,10)] */
static inline tg_tensor model_forward(Model *m, tg_tensor x) {
  x = tg_relu(tg_nn_conv2d_forward(&m->c1, x));
  x = tg_relu(tg_nn_conv2d_forward(&m->c2, x));
  x = tg_max_pool2d(tg_nn_batchnorm_forward(&m->b1, x), NULL);
  x = tg_relu(tg_nn_conv2d_forward(&m->c3, x));
  x = tg_relu(tg_nn_conv2d_forward(&m->c4, x));
  x = tg_max_pool2d(tg_nn_batchnorm_forward(&m->b2, x), NULL);
  return tg_nn_linear_forward(&m->l, tg_flatten(x, 1, -1));
}

static inline tg_status model_state(const Model *m, tg_state_dict *sd) {
  tg_status st = TG_OK;
  if (st == TG_OK) st = tg_nn_conv2d_state(&m->c1, sd, "layers.0");
  if (st == TG_OK) st = tg_nn_conv2d_state(&m->c2, sd, "layers.2");
  if (st == TG_OK) st = tg_nn_batchnorm_state(&m->b1, sd, "layers.4");
  if (st == TG_OK) st = tg_nn_conv2d_state(&m->c3, sd, "layers.6");
  if (st == TG_OK) st = tg_nn_conv2d_state(&m->c4, sd, "layers.8");
  if (st == TG_OK) st = tg_nn_batchnorm_state(&m->b2, sd, "layers.10");
  if (st == TG_OK) st = tg_nn_linear_state(&m->l, sd, "layers.13");
  return st;
}

/* what the jitted functions of the examples read: the model, its optimizer, the data, the batch
 * size; data-parallel over MPI (beautiful_mnist under mpirun): this process's rank, the number of
 * ranks, and the parameters whose gradients are averaged over them */
typedef struct {
  Model *model;
  tg_optim *opt;
  tg_tensor X_train, Y_train, X_test, Y_test;
  int64_t bs;
  int rank, ranks;
  tg_tensor *params;
  int nparams;
} Ctx;

/* loss.backward(); opt.step(): the loss and every parameter update realize in one schedule. Over
 * several ranks each parameter's gradient is first replaced by its mean over the ranks. */
static inline tg_status backward_step_ranks(tg_optim *opt, tg_tensor loss, const Ctx *c) {
  tg_status st = tg_backward(loss);
  if (st != TG_OK) return st;
  for (int k = 0; c && c->ranks > 1 && k < c->nparams && st == TG_OK; k++) {
    tg_tensor g = tg_grad(c->params[k]);
    if (tg_valid(g)) st = tg_set_grad(c->params[k], tg_div_s(tg_dist_allreduce(g), (double)c->ranks));
  }
  if (st != TG_OK) return st;
  int n = tg_optim_schedule_step(opt, NULL, 0);
  tg_tensor *ts = malloc(sizeof(tg_tensor) * (size_t)(n > 0 ? n + 1 : 1));
  ts[0] = loss;
  if (n < 0 || tg_optim_schedule_step(opt, ts + 1, n) != n) st = tg_last_status();
  else st = tg_realize_many(ts, n + 1);
  free(ts);
  return st;
}
static inline tg_status backward_step(tg_optim *opt, tg_tensor loss) { return backward_step_ranks(opt, loss, NULL); }

/* @TinyJit @Tensor.train() def train_step(): zero_grad; sample a batch; loss.backward(); opt.step()
 * (returns the loss, and with MNIST_TRACE the batch's indices) */
static inline tg_status train_step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                            void *user) {
  (void)in, (void)nin, (void)args, (void)nargs;
  Ctx *c = user;
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_optim_zero_grad(c->opt);
  tg_tensor samples = tg_randint(TG_SHAPE(c->bs), 0, tg_dim(c->X_train, 0), NULL);
  /* over ranks: every rank draws the same global batch and trains on its slice of it */
  int64_t lb = c->ranks > 1 ? c->bs / c->ranks : c->bs;
  tg_tensor mine = c->ranks > 1 ? tg_shrink(samples, TG_SHAPE(c->rank * lb, (c->rank + 1) * lb)) : samples;
  tg_tensor logits = model_forward(c->model, tg_index(c->X_train, mine));
  tg_tensor loss = tg_sparse_categorical_crossentropy(logits, tg_index(c->Y_train, mine), NULL);
  tg_status st = backward_step_ranks(c->opt, loss, c);
  tg_context_end();
  /* the loss reported: the whole batch's (the mean of the ranks') */
  out[0] = c->ranks > 1 ? tg_div_s(tg_dist_allreduce(loss), (double)c->ranks) : loss;
  if (nout > 1) out[1] = samples; /* MNIST_TRACE */
  return st;
}

#endif
