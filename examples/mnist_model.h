/*
 * mnist_model.h -- the beautiful_mnist CNN (tinygrad's examples/beautiful_mnist.py), shared by
 * examples/beautiful_mnist.c, examples/export_mnist.c and tests/test_export.c: its layers, their
 * creation and release, the forward pass, and the state-dict names tinygrad gives them.
 */
#ifndef TG_EXAMPLES_MNIST_MODEL_H
#define TG_EXAMPLES_MNIST_MODEL_H

#include <tinygrad.h>

typedef struct {
  tg_nn_conv2d c1, c2, c3, c4;
  tg_nn_batchnorm b1, b2;
  tg_nn_linear l;
} Model;

static inline tg_status model_init(Model *m) {
  tg_status st = TG_OK;
  if (st == TG_OK) st = tg_nn_conv2d_init(&m->c1, 1, 32, (const int64_t[2]){5}, true, NULL);
  if (st == TG_OK) st = tg_nn_conv2d_init(&m->c2, 32, 32, (const int64_t[2]){5}, true, NULL);
  if (st == TG_OK) st = tg_nn_batchnorm_init(&m->b1, 32, NULL);
  if (st == TG_OK) st = tg_nn_conv2d_init(&m->c3, 32, 64, (const int64_t[2]){3}, true, NULL);
  if (st == TG_OK) st = tg_nn_conv2d_init(&m->c4, 64, 64, (const int64_t[2]){3}, true, NULL);
  if (st == TG_OK) st = tg_nn_batchnorm_init(&m->b2, 64, NULL);
  if (st == TG_OK) st = tg_nn_linear_init(&m->l, 576, 10, true);
  return st;
}

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

#endif
