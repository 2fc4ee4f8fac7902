/*
 * ops.c -- common single ops on realistic sizes, each built and realized 10 times (kernels already
 * compiled after the first); prints "<name> <median ms> <bytes moved> <FLOPs>" per op (the last two
 * from GlobalCounters over one run). bench/ops.py runs this and the same
 * ops in PyTorch (2 threads) and prints the ratios. An argument runs only the ops whose name
 * contains it.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <tinygrad.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static tg_tensor A, B, M2k, S, L, V, M1k, P, C, Wc, E, IDX, Q, K, Vv, LG, LB, IMG, S64k, T4;

static tg_tensor o_add(void) { return tg_add(A, B); }
static tg_tensor o_gelu(void) { return tg_gelu(A); }
static tg_tensor o_sigmoid(void) { return tg_sigmoid(A); }
static tg_tensor o_exp(void) { return tg_exp(A); }
static tg_tensor o_log(void) { return tg_log(tg_abs(A)); }
static tg_tensor o_sumall(void) { return tg_sum(A, TG_ALL_AXES, false); }
static tg_tensor o_sumrows(void) { return tg_sum(M2k, TG_AXES(1), false); }
static tg_tensor o_sumcols(void) { return tg_sum(M2k, TG_AXES(0), false); }
static tg_tensor o_softmax(void) { return tg_softmax(S, -1); }
static tg_tensor o_lsm(void) { return tg_log_softmax(S, -1); }
static tg_tensor o_ln(void) { return tg_layernorm(L, 1, 1e-5); }
static tg_tensor o_var(void) { return tg_var(M2k, TG_AXES(1), false, 1); }
static tg_tensor o_mm(void) { return tg_matmul(M1k, M1k); }
static tg_tensor o_argmax(void) { return tg_argmax(M1k, TG_AXES(1), false); }
static tg_tensor o_cumsum(void) { return tg_cumsum(V, 0); }
static tg_tensor o_maxpool(void) { return tg_max_pool2d(P, NULL); }
static tg_tensor o_conv(void) { return tg_conv2d(C, Wc, (tg_tensor){0}, TG_CONV2D_OPTS(.padding = {1}, .npadding = 1)); }
static tg_tensor o_T(void) { return tg_contiguous(tg_transpose(M2k, 0, 1)); }
static tg_tensor o_nhwc(void) { return tg_contiguous(tg_permute(T4, (const int[]){0, 2, 3, 1}, 4)); }
static tg_tensor o_emb(void) { return tg_index(E, IDX); }
static tg_tensor o_sort(void) {
  tg_tensor v, i;
  return tg_sort(S64k, 0, false, &v, &i) == TG_OK ? v : (tg_tensor){0};
}
static tg_tensor o_topk(void) {
  tg_tensor v, i;
  return tg_topk(M1k, 10, 1, true, true, &v, &i) == TG_OK ? v : (tg_tensor){0};
}
static tg_tensor o_sdpa(void) { return tg_scaled_dot_product_attention(Q, K, Vv, (tg_tensor){0}, NULL); }
static tg_tensor o_xent(void) { return tg_sparse_categorical_crossentropy(LG, LB, NULL); }
static tg_tensor o_interp(void) { return tg_interpolate(IMG, (const int64_t[]){112, 112}, 2, NULL); }
static tg_tensor o_gather(void) { return tg_gather(M1k, 1, tg_argmax(M1k, TG_AXES(1), true)); }
static tg_tensor o_rand(void) { return tg_rand(TG_SHAPE(1 << 22), NULL); }
static tg_tensor o_randn(void) { return tg_randn(TG_SHAPE(1 << 22), NULL); }
static tg_tensor o_where(void) { return tg_where(tg_gt(A, B), A, B); }

static const struct {
  const char *name;
  tg_tensor (*fn)(void);
} OPS[] = {{"add_4M", o_add}, {"gelu_4M", o_gelu}, {"sigmoid_4M", o_sigmoid}, {"exp_4M", o_exp}, {"log_4M", o_log},
           {"where_4M", o_where}, {"sum_4M", o_sumall}, {"sum_rows_2048x2048", o_sumrows}, {"sum_cols_2048x2048", o_sumcols},
           {"softmax_256x4096", o_softmax}, {"log_softmax_256x4096", o_lsm}, {"layernorm_1024x1024", o_ln},
           {"var_rows_2048x2048", o_var}, {"matmul_1024", o_mm}, {"argmax_rows_1024x1024", o_argmax},
           {"cumsum_1M", o_cumsum}, {"maxpool2_64x32x56x56", o_maxpool}, {"conv3x3_16x64x56x56", o_conv},
           {"transpose_2048x2048", o_T}, {"nchw_to_nhwc_64x64x56x56", o_nhwc}, {"embedding_4096_of_50000x512", o_emb},
           {"gather_rows_1024x1024", o_gather}, {"sort_64k", o_sort}, {"topk10_1024x1024", o_topk},
           {"sdpa_4x8x256x64", o_sdpa}, {"xent_512x1000", o_xent}, {"interpolate_16x32x56->112", o_interp},
           {"rand_4M", o_rand}, {"randn_4M", o_randn}};

int main(int argc, char **argv) {
  tg_manual_seed(1);
  tg_tensor *all[] = {&A, &B, &M2k, &S, &L, &V, &M1k, &P, &C, &Wc, &E, &IDX, &Q, &K, &Vv, &LG, &LB, &IMG, &S64k, &T4};
  A = tg_randn(TG_SHAPE(1 << 22), NULL), B = tg_randn(TG_SHAPE(1 << 22), NULL);
  M2k = tg_randn(TG_SHAPE(2048, 2048), NULL), S = tg_randn(TG_SHAPE(256, 4096), NULL);
  L = tg_randn(TG_SHAPE(1024, 1024), NULL), V = tg_randn(TG_SHAPE(1 << 20), NULL);
  M1k = tg_randn(TG_SHAPE(1024, 1024), NULL), P = tg_randn(TG_SHAPE(64, 32, 56, 56), NULL);
  C = tg_randn(TG_SHAPE(16, 64, 56, 56), NULL), Wc = tg_randn(TG_SHAPE(64, 64, 3, 3), NULL);
  E = tg_randn(TG_SHAPE(50000, 512), NULL), IDX = tg_randint(TG_SHAPE(4096), 0, 50000, NULL);
  Q = tg_randn(TG_SHAPE(4, 8, 256, 64), NULL), K = tg_randn(TG_SHAPE(4, 8, 256, 64), NULL);
  Vv = tg_randn(TG_SHAPE(4, 8, 256, 64), NULL), LG = tg_randn(TG_SHAPE(512, 1000), NULL);
  LB = tg_randint(TG_SHAPE(512), 0, 1000, NULL), IMG = tg_randn(TG_SHAPE(16, 32, 56, 56), NULL);
  S64k = tg_randn(TG_SHAPE(65536), NULL), T4 = tg_randn(TG_SHAPE(64, 64, 56, 56), NULL);
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
    *all[i] = tg_persist(*all[i]);
    if (tg_realize(*all[i]) != TG_OK) {
      fprintf(stderr, "ops: %s\n", tg_last_error());
      return 1;
    }
  }
  for (size_t i = 0; i < sizeof OPS / sizeof *OPS; i++) {
    if (argc > 1 && !strstr(OPS[i].name, argv[1])) continue;
    double ts[9];
    int n = 0;
    tg_counters c0 = {0}, c1 = {0};
    for (int r = 0; r < 10; r++) {
      tg_scope_begin();
      if (r == 9) c0 = tg_global_counters();
      double t0 = now();
      tg_tensor y = OPS[i].fn();
      if (tg_realize(y) != TG_OK) {
        fprintf(stderr, "ops: %s: %s\n", OPS[i].name, tg_last_error());
        return 1;
      }
      double t = now() - t0;
      if (r == 9) c1 = tg_global_counters();
      tg_scope_end();
      if (r) ts[n++] = t;
    }
    for (int a = 0; a < n; a++)
      for (int b = a + 1; b < n; b++)
        if (ts[b] < ts[a]) {
          double t = ts[a];
          ts[a] = ts[b], ts[b] = t;
        }
    /* the median ms, then the bytes the kernels of one run moved and their FLOPs (DEBUG=2's counts) */
    printf("%s %.4f %llu %llu\n", OPS[i].name, ts[n / 2] * 1e3, (unsigned long long)(c1.global_mem - c0.global_mem),
           (unsigned long long)(c1.global_ops - c0.global_ops));
    fflush(stdout);
  }
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tg_free(*all[i]);
  return tg_live_count() == 0 ? 0 : 1;
}
