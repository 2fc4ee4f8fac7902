/*
 * bert.c -- a BERT-style sentence encoder (post-layernorm, GELU FFN) with random weights, forward
 * only, written plainly with the public API: tg_linear on (batch, tokens, hidden) activations,
 * tg_scaled_dot_product_attention, tg_gelu_ex "none", tg_layernorm with its affine parameters.
 * Usage: bert [batch tokens [runs]] (defaults 32 128 10); prints "bert_<batch>x<tokens> <median ms>"
 * over the runs after the first (which compiles), then "jit <median ms> <kernels> <constant kernels>" for
 * the model as a TinyJit function (replays only) and "jit_rerun <median ms>" for the same jit running
 * its constant work on the weights (the packed copies of wide weights) on every replay. With PARTS=1 it also prints the median of each
 * part of one layer on its own (a linear on 3-d input, the gelu'd FFN, attention). bench/bert.py
 * runs this against PyTorch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <tinygrad.h>

enum { LAYERS = 6, HID = 384, HEADS = 12, FFN = 1536 };

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
  tg_tensor wq, bq, wk, bk, wv, bv, wo, bo, g1, b1, w1, c1, w2, c2, g2, b2;
} Layer;

static tg_tensor randw(int64_t o, int64_t i, double scale) {
  tg_tensor t = i ? tg_randn((const int64_t[]){o, i}, 2, NULL) : tg_randn((const int64_t[]){o}, 1, NULL);
  return tg_persist(tg_contiguous(tg_mul_s(t, scale)));
}

static tg_tensor ones(int64_t n) { return tg_persist(tg_contiguous(tg_add_s(tg_zeros((const int64_t[]){n}, 1, NULL), 1.0))); }

static tg_tensor heads(tg_tensor x, int64_t b, int64_t l) {
  return tg_transpose(tg_reshape(x, (const int64_t[]){b, l, HEADS, HID / HEADS}, 4), 1, 2);
}

static tg_tensor ln(tg_tensor x, tg_tensor g, tg_tensor b) { return tg_add(tg_mul(tg_layernorm(x, 1, 1e-12), g), b); }

static tg_tensor attention(const Layer *w, tg_tensor x, int64_t b, int64_t l) {
  tg_tensor q = heads(tg_linear(x, w->wq, w->bq), b, l), k = heads(tg_linear(x, w->wk, w->bk), b, l);
  tg_tensor v = heads(tg_linear(x, w->wv, w->bv), b, l);
  tg_tensor a = tg_scaled_dot_product_attention(q, k, v, (tg_tensor){0}, NULL);
  return tg_reshape(tg_transpose(a, 1, 2), (const int64_t[]){b, l, HID}, 3);
}

static tg_tensor ffn(const Layer *w, tg_tensor x) { return tg_linear(tg_gelu_ex(tg_linear(x, w->w1, w->c1), "none"), w->w2, w->c2); }

static tg_tensor layer(const Layer *w, tg_tensor x, int64_t b, int64_t l) {
  x = ln(tg_add(x, tg_linear(attention(w, x, b, l), w->wo, w->bo)), w->g1, w->b1);
  return ln(tg_add(x, ffn(w, x)), w->g2, w->b2);
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* median ms of runs-1 realizes of f (the first compiles) */
static double timeit(tg_tensor (*f)(void *), void *arg, int runs) {
  double t[64];
  if (runs > 64) runs = 64;
  for (int r = 0; r < runs; r++) {
    tg_scope_begin();
    double t0 = now();
    tg_tensor y = f(arg);
    if (tg_realize(y) != TG_OK) {
      fprintf(stderr, "bert: %s\n", tg_last_error());
      exit(1);
    }
    t[r] = (now() - t0) * 1e3;
    tg_scope_end();
  }
  qsort(t + 1, (size_t)runs - 1, sizeof *t, cmpd);
  return t[1 + (runs - 1) / 2];
}

static Layer L[LAYERS];
static tg_tensor X, H;
static int64_t B, T;

static tg_tensor f_model(void *a) {
  (void)a;
  tg_tensor x = X;
  for (int i = 0; i < LAYERS; i++) x = layer(&L[i], x, B, T);
  return x;
}
/* The model as a TinyJit function of its input. */
static tg_status j_model(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  tg_tensor x = in[0];
  for (int i = 0; i < LAYERS; i++) x = layer(&L[i], x, B, T);
  out[0] = x;
  return TG_OK;
}

/* median ms of the TinyJit replays (calls 3 to runs + 2) of the model; *nk: kernels per replay as
 * captured, *nc: those that are constant work on the weights */
static double timeit_jit(bool rerun_constants, int runs, int *nk, int *nc) {
  double t[64];
  if (runs > 64) runs = 64;
  tg_jit *j = tg_jit_new_opts(j_model, 1, NULL, TG_JIT_OPTS(.rerun_constants = rerun_constants));
  for (int r = 0; r < runs + 2; r++) {
    tg_scope_begin();
    double t0 = now();
    tg_tensor y;
    if (tg_jit_call(j, &X, 1, NULL, 0, &y) != TG_OK) {
      fprintf(stderr, "bert: %s\n", tg_last_error());
      exit(1);
    }
    if (r >= 2) t[r - 2] = (now() - t0) * 1e3;
    tg_scope_end();
  }
  *nk = tg_jit_captured_kernels(j), *nc = tg_jit_constant_kernels(j);
  tg_jit_free(j);
  qsort(t, (size_t)runs, sizeof *t, cmpd);
  return t[(runs - 1) / 2];
}

static tg_tensor f_linear3d(void *a) { (void)a; return tg_linear(X, L[0].w1, L[0].c1); }
static tg_tensor f_ffn(void *a) { (void)a; return ffn(&L[0], X); }
static tg_tensor f_gelu_mm(void *a) { (void)a; return tg_linear(tg_gelu_ex(H, "none"), L[0].w2, L[0].c2); }
static tg_tensor f_attn(void *a) { (void)a; return attention(&L[0], X, B, T); }

int main(int argc, char **argv) {
  B = argc > 2 ? atoll(argv[1]) : 32;
  T = argc > 2 ? atoll(argv[2]) : 128;
  int runs = argc > 3 ? atoi(argv[3]) : 10;
  if (B < 1 || T < 1 || runs < 2) {
    fprintf(stderr, "usage: bert [batch tokens [runs >= 2]]\n");
    return 2;
  }
  tg_manual_seed(1);
  double s = 0.05;
  for (int i = 0; i < LAYERS; i++) {
    Layer *w = &L[i];
    w->wq = randw(HID, HID, s), w->bq = randw(HID, 0, s), w->wk = randw(HID, HID, s), w->bk = randw(HID, 0, s);
    w->wv = randw(HID, HID, s), w->bv = randw(HID, 0, s), w->wo = randw(HID, HID, s), w->bo = randw(HID, 0, s);
    w->w1 = randw(FFN, HID, s), w->c1 = randw(FFN, 0, s), w->w2 = randw(HID, FFN, s), w->c2 = randw(HID, 0, s);
    w->g1 = ones(HID), w->b1 = randw(HID, 0, s), w->g2 = ones(HID), w->b2 = randw(HID, 0, s);
  }
  X = tg_persist(tg_contiguous(tg_randn((const int64_t[]){B, T, HID}, 3, NULL)));
  H = tg_persist(tg_contiguous(tg_randn((const int64_t[]){B, T, FFN}, 3, NULL)));
  if (tg_realize(X) != TG_OK || tg_realize(H) != TG_OK) {
    fprintf(stderr, "bert: %s\n", tg_last_error());
    return 1;
  }
  printf("bert_%lldx%lld %.3f\n", (long long)B, (long long)T, timeit(f_model, NULL, runs));
  int nk, nc;
  double tj = timeit_jit(false, runs, &nk, &nc);
  printf("jit %.3f %d %d\n", tj, nk, nc);
  printf("jit_rerun %.3f\n", timeit_jit(true, runs, &nk, &nc));
  const char *p = getenv("PARTS");
  if (p && atoi(p)) {
    printf("linear3d %.3f\n", timeit(f_linear3d, NULL, runs));
    printf("gelu_linear %.3f\n", timeit(f_gelu_mm, NULL, runs));
    printf("ffn %.3f\n", timeit(f_ffn, NULL, runs));
    printf("attention %.3f\n", timeit(f_attn, NULL, runs));
  }
  return 0;
}
