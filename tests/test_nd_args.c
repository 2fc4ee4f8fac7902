/* test_nd_args.c -- the C side of tinygrad's argument forms: n-d convolutions and pools, fixed-size
 * selection, Newton-Schulz and Muon, fp8 storage (OCP and fnuz); values small enough to check by hand, error
 * messages, and no leaked handles (run under ASan by make asan). The differential tests against
 * PyTorch are tests/test_nd_args_torch.py. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>

#include "test.h"

static void get_f32(tg_tensor t, float *out, size_t n) {
  CHECK_MSG(tg_data(tg_cast(t, TG_FLOAT32), out, n * sizeof(float)) == TG_OK, "%s", tg_last_error());
}

TEST(conv_nd_3d_ones_and_grad) {
  BEGIN;
  tg_tensor x = tg_set_requires_grad(tg_ones(TG_SHAPE(1, 2, 3, 3, 3), NULL), true);
  tg_tensor w = tg_set_requires_grad(tg_ones(TG_SHAPE(4, 2, 2, 2, 2), NULL), true);
  tg_tensor b = tg_full(TG_SHAPE(4), 0.5, NULL);
  tg_tensor y = tg_conv_nd(x, w, b, TG_WINDOW_OPTS(.padding = {1}, .npadding = 1, .stride = {2}));
  int64_t sh[8];
  CHECK(tg_shape(y, sh) == 5 && sh[0] == 1 && sh[1] == 4 && sh[2] == 2 && sh[3] == 2 && sh[4] == 2);
  float v[32];
  /* padding 1, stride 2, kernel 2 over 3: per dim the first window covers 1 input (the other is
   * padding), the second 2; times 2 channels, plus the bias */
  CHECK(tg_backward(tg_sum(y, NULL, 0, false)) == TG_OK);
  get_f32(y, v, 32);
  for (int i = 0; i < 32; i++) {
    int od = (i >> 2) & 1, oh = (i >> 1) & 1, ow = i & 1;
    CHECK_CLOSE(v[i], 2.0 * (1 + od) * (1 + oh) * (1 + ow) + 0.5, 1e-6);
  }
  float gx[54];
  get_f32(tg_grad(x), gx, 54);
  for (int i = 0; i < 54; i++) CHECK_CLOSE(gx[i], 4.0, 1e-6); /* each input is in one window of each of 4 filters */
  /* the same through tg_conv2d with a 3-d weight and uniform options */
  tg_tensor y2 = tg_conv2d(x, w, b, TG_CONV2D_OPTS(.padding = {1}, .npadding = 1, .stride = {2}));
  float v2[32];
  get_f32(y2, v2, 32);
  CHECK(memcmp(v, v2, sizeof v) == 0);
  END;
}

TEST(pools_nd) {
  BEGIN;
  tg_tensor x = tg_arange(0, 10, 1, TG_OPTS(.dtype = TG_FLOAT32));
  x = tg_reshape(x, TG_SHAPE(1, 10));
  float m[5], a[4];
  get_f32(tg_max_pool_nd(x, 1, NULL), m, 5); /* kernel 2, stride 2 */
  for (int i = 0; i < 5; i++) CHECK_CLOSE(m[i], 2 * i + 1, 0);
  get_f32(tg_avg_pool_nd(x, 1, TG_WINDOW_OPTS(.kernel_size = {3}, .stride = {2})), a, 4);
  for (int i = 0; i < 4; i++) CHECK_CLOSE(a[i], 2 * i + 1, 1e-6);
  tg_tensor c = tg_reshape(tg_arange(0, 27, 1, TG_OPTS(.dtype = TG_FLOAT32)), TG_SHAPE(1, 1, 3, 3, 3));
  float mx;
  get_f32(tg_max_pool_nd(c, 3, TG_WINDOW_OPTS(.kernel_size = {3})), &mx, 1);
  CHECK_CLOSE(mx, 26, 0);
  /* errors name the function and the problem */
  CHECK(tg_max_pool_nd(x, 0, NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_max_pool_nd", "spatial dims");
  CHECK(tg_avg_pool_nd(c, 3, TG_WINDOW_OPTS(.kernel_size = {2, 2, 2, 2})).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_avg_pool_nd", "kernel_size");
  CHECK(tg_conv_nd(c, tg_ones(TG_SHAPE(1, 1, 2, 2), NULL), (tg_tensor){0}, NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_conv_nd", "spatial");
  END;
}

TEST(conv_transpose_nd_1d) {
  BEGIN;
  const float xd[3] = {1, 2, 3}, wd[2] = {1, 10};
  tg_tensor x = tg_from_data(xd, TG_SHAPE(1, 1, 3), NULL), w = tg_from_data(wd, TG_SHAPE(1, 1, 2), NULL);
  float y[6];
  /* stride 2: each input spreads (x, 10x) at 2i */
  get_f32(tg_conv_transpose_nd(x, w, (tg_tensor){0}, TG_WINDOW_OPTS(.stride = {2})), y, 6);
  float y7[7]; /* output_padding adds a position at the end */
  get_f32(tg_conv_transpose_nd(x, w, (tg_tensor){0}, TG_WINDOW_OPTS(.stride = {2}, .output_padding = {1}, .noutput_padding = 1)),
          y7, 7);
  CHECK(y7[6] == 0.0f && y7[5] == 30.0f);
  const float want[6] = {1, 10, 2, 20, 3, 30};
  for (int i = 0; i < 6; i++) CHECK_CLOSE(y[i], want[i], 0);
  END;
}

/* One convolution under WINO=lv: its values and the gradients of x and w for a cos-weighted sum
 * (malloc'd into r), and the kernels an equal convolution takes to realize afterwards (the direct
 * form: layout copies and the sum, at most 3; Winograd's transforms and channel sums, more) */
typedef struct {
  float *y, *gx, *gw;
  size_t ny, nx, nw;
  uint64_t kernels;
} ConvRun;

static ConvRun conv_run(const char *lv, const int64_t *xs, const int64_t *ws, int nd, int groups, int64_t pad, uint64_t seed) {
  ConvRun r = {0};
  r.nx = r.nw = 1;
  for (int j = 0; j < nd; j++) r.nx *= (size_t)xs[j], r.nw *= (size_t)ws[j];
  tg_context_begin();
  CHECK(tg_context_set("WINO", lv) == TG_OK);
  tg_manual_seed(seed);
  tg_tensor x = tg_set_requires_grad(tg_randn(xs, nd, NULL), true);
  tg_tensor w = tg_set_requires_grad(tg_randn(ws, nd, NULL), true);
  tg_tensor b = tg_randn(TG_SHAPE(ws[0]), NULL);
  const tg_conv2d_opts *o = TG_CONV2D_OPTS(.groups = groups, .padding = {pad}, .npadding = 1);
  tg_tensor y = tg_conv2d(x, w, b, o);
  CHECK_MSG(tg_ndim(y) == nd, "%s", tg_last_error());
  r.ny = (size_t)tg_numel(y);
  CHECK(tg_realize(x) == TG_OK && tg_realize(w) == TG_OK && tg_realize(b) == TG_OK);
  tg_tensor wts = tg_cos(tg_arange(0, (double)r.ny, 1, NULL));
  CHECK(tg_backward(tg_sum(tg_mul(tg_reshape(y, (const int64_t[]){-1}, 1), wts), NULL, 0, false)) == TG_OK);
  r.y = malloc(r.ny * sizeof(float)), r.gx = malloc(r.nx * sizeof(float)), r.gw = malloc(r.nw * sizeof(float));
  get_f32(y, r.y, r.ny);
  get_f32(tg_grad(x), r.gx, r.nx);
  get_f32(tg_grad(w), r.gw, r.nw);
  /* (after the backward: a realize cuts a graph, and an equal convolution is the same node) */
  tg_tensor yk = tg_conv2d(x, w, b, o);
  tg_global_counters_reset();
  CHECK(tg_realize(yk) == TG_OK);
  r.kernels = tg_global_counters().kernel_count;
  tg_context_end();
  return r;
}

static void conv_run_free(ConvRun *r) { free(r->y), free(r->gx), free(r->gw); }

/* WINO=1: a convolution whose kernel is 3 wide in every spatial dim (stride and dilation 1) goes through
 * Winograd's F(4, 3) tiles: more kernels, the same values and gradients as the direct sum up to
 * float rounding, in 1, 2 and 3 spatial dims, grouped, with padding and sizes the tiles do not divide */
TEST(winograd_matches_direct) {
  BEGIN;
  static const int64_t xs[3][5] = {{2, 4, 11}, {2, 4, 9, 7}, {1, 2, 5, 6, 4}}, ws[3][5] = {{6, 2, 3}, {6, 2, 3, 3}, {4, 1, 3, 3, 3}};
  for (int c = 0; c < 3; c++) {
    int nd = 3 + c;
    ConvRun d = conv_run("0", xs[c], ws[c], nd, 2, 1, 7), wi = conv_run("1", xs[c], ws[c], nd, 2, 1, 7);
    CHECK_MSG(d.kernels <= 2 && wi.kernels >= 4, "%d-d: %llu kernels direct, %llu Winograd", nd - 2,
              (unsigned long long)d.kernels, (unsigned long long)wi.kernels);
    for (size_t i = 0; i < d.ny && wi.ny == d.ny; i++) CHECK_CLOSE(wi.y[i], d.y[i], 1e-4);
    for (size_t i = 0; i < d.nx; i++) CHECK_CLOSE(wi.gx[i], d.gx[i], 1e-4);
    for (size_t i = 0; i < d.nw; i++) CHECK_CLOSE(wi.gw[i], d.gw[i], 2e-4);
    conv_run_free(&d), conv_run_free(&wi);
  }
  END;
}

/* float16 and bfloat16 operands, alone or with a float32 one: the transforms run in float32 and the
 * values are the direct convolution's up to float32 rounding (the transform matrix was read from
 * float32 bytes as halves, results off by up to 2000x; transforms in bfloat16 were 4% off) */
static void mixed_dtype_conv(const char *lv, const int64_t *xs, const int64_t *ws, tg_dtype xdt, tg_dtype wdt, float *y, size_t ny) {
  tg_context_begin();
  CHECK(tg_context_set("WINO", lv) == TG_OK);
  tg_manual_seed(5);
  tg_tensor x = tg_cast(tg_randn(xs, 4, NULL), xdt), w = tg_cast(tg_mul_s(tg_randn(ws, 4, NULL), 0.2), wdt);
  get_f32(tg_cast(tg_conv2d(x, w, (tg_tensor){0}, TG_CONV2D_OPTS(.padding = {1}, .npadding = 1)), TG_FLOAT32), y, ny);
  tg_context_end();
}

TEST(winograd_mixed_float_dtypes) {
  BEGIN;
  static const int64_t xs[2][4] = {{1, 3, 9, 10}, {1, 8, 16, 14}}, ws[2][4] = {{4, 3, 3, 3}, {8, 8, 5, 5}};
  static const size_t ny[2] = {4 * 9 * 10, 8 * 14 * 12};
  const tg_dtype pairs[4][2] = {{TG_FLOAT16, TG_FLOAT32}, {TG_FLOAT32, TG_FLOAT16}, {TG_BFLOAT16, TG_FLOAT32}, {TG_FLOAT16, TG_BFLOAT16}};
  float *d = malloc(sizeof(float) * ny[1]), *wi = malloc(sizeof(float) * ny[1]);
  for (int c = 0; c < 2; c++)
    for (int p = 0; p < 4; p++) {
      mixed_dtype_conv("0", xs[c], ws[c], pairs[p][0], pairs[p][1], d, ny[c]);
      mixed_dtype_conv(c ? "2" : "1", xs[c], ws[c], pairs[p][0], pairs[p][1], wi, ny[c]);
      double big = 0, err = 0;
      for (size_t i = 0; i < ny[c]; i++) big = fmax(big, fabs(d[i])), err = fmax(err, fabs(wi[i] - d[i]));
      CHECK_MSG(big > 0.5 && err <= 1e-4 * big, "case %d, dtype pair %d: max error %g of %g", c, p, err, big);
    }
  free(d), free(wi);
  END;
}

/* WINO=2: 5-wide kernels too, through F(4, 5)'s 8-point tiles, where the tiles pay (at least 8
 * channels in and out, at least 12 outputs along every spatial dim): values and both gradients as
 * the direct sum's up to float rounding in 1 and 2 dims, grouped too; a convolution below the sizes,
 * a 5-wide one in 3 dims, and any 5-wide one under WINO=1 stay direct (the direct form is at most 3
 * kernels: layout copies and the sum; Winograd's at least 7) */
TEST(winograd_f45_matches_direct) {
  BEGIN;
  static const int64_t xs[3][4] = {{2, 8, 22}, {2, 8, 16, 14}, {2, 16, 13, 12}};
  static const int64_t ws[3][4] = {{8, 8, 5}, {12, 8, 5, 5}, {16, 8, 5, 5}};
  static const int groups[3] = {1, 1, 2};
  static const int64_t pad[3] = {1, 2, 2};
  for (int c = 0; c < 3; c++) {
    int nd = c == 0 ? 3 : 4;
    ConvRun d = conv_run("0", xs[c], ws[c], nd, groups[c], pad[c], 11), wi = conv_run("2", xs[c], ws[c], nd, groups[c], pad[c], 11);
    CHECK_MSG(d.kernels <= 3 && wi.kernels >= 7, "case %d: %llu kernels direct, %llu Winograd", c,
              (unsigned long long)d.kernels, (unsigned long long)wi.kernels);
    double sy = 0, sx = 0, sw = 0;
    for (size_t i = 0; i < d.ny; i++) sy = fmax(sy, fabs(d.y[i]));
    for (size_t i = 0; i < d.nx; i++) sx = fmax(sx, fabs(d.gx[i]));
    for (size_t i = 0; i < d.nw; i++) sw = fmax(sw, fabs(d.gw[i]));
    /* F(4, 5)'s transforms carry coefficients up to 21/4: errors of a few 1e-6 of the largest value */
    for (size_t i = 0; i < d.ny && wi.ny == d.ny; i++) CHECK_CLOSE(wi.y[i] / sy, d.y[i] / sy, 2e-5);
    for (size_t i = 0; i < d.nx; i++) CHECK_CLOSE(wi.gx[i] / sx, d.gx[i] / sx, 2e-5);
    for (size_t i = 0; i < d.nw; i++) CHECK_CLOSE(wi.gw[i] / sw, d.gw[i] / sw, 2e-5);
    conv_run_free(&d), conv_run_free(&wi);
  }
/* below the sizes (10 outputs along a dim; 4 input channels), and 5-wide under WINO=1: direct */
  const struct {
    const char *lv;
    int nd;
    int64_t x[5], w[5];
  } direct[4] = {{"2", 4, {2, 8, 14, 16}, {8, 8, 5, 5}},
                 {"2", 4, {2, 4, 16, 16}, {8, 4, 5, 5}},
                 {"1", 4, {2, 8, 16, 16}, {8, 8, 5, 5}},
                 {"2", 5, {1, 8, 12, 13, 12}, {8, 8, 5, 5, 5}}};
  for (int c = 0; c < 4; c++) {
    tg_context_begin();
    CHECK(tg_context_set("WINO", direct[c].lv) == TG_OK);
    tg_tensor x = tg_randn(direct[c].x, direct[c].nd, NULL), w = tg_randn(direct[c].w, direct[c].nd, NULL);
    CHECK(tg_realize(x) == TG_OK && tg_realize(w) == TG_OK);
    tg_global_counters_reset();
    CHECK(tg_realize(tg_conv2d(x, w, (tg_tensor){0}, NULL)) == TG_OK);
    CHECK_MSG(tg_global_counters().kernel_count <= 3, "direct case %d: %llu kernels", c,
              (unsigned long long)tg_global_counters().kernel_count);
    tg_context_end();
  }
  END;
}

TEST(fixed_size_selection) {
  BEGIN;
  const float xd[6] = {5, 0, 7, 0, 0, 9};
  tg_tensor x = tg_from_data(xd, TG_SHAPE(2, 3), NULL);
  float s[4];
  get_f32(tg_masked_select_size(x, tg_gt_s(x, 0), 4, -1), s, 4);
  const float ws[4] = {5, 7, 9, -1};
  for (int i = 0; i < 4; i++) CHECK_CLOSE(s[i], ws[i], 0);
  tg_tensor nz = tg_nonzero_size(x, 2, -1);
  CHECK(tg_dtype_of(nz) == TG_INT32);
  int32_t idx[4];
  CHECK(tg_data(nz, idx, sizeof idx) == TG_OK);
  CHECK(idx[0] == 0 && idx[1] == 0 && idx[2] == 0 && idx[3] == 2);
  CHECK(tg_nonzero_size(x, -2, 0).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_nonzero_size", "size");
  END;
}

TEST(newton_schulz_and_muon) {
  BEGIN;
  static const double coefs[3] = {3.4445, -4.775, 2.0315};
  /* a diagonal matrix stays diagonal; its entries are driven towards 1 */
  const float d[4] = {3, 0, 0, 1};
  float g[4];
  get_f32(tg_newton_schulz(tg_from_data(d, TG_SHAPE(2, 2), NULL), 5, coefs, 3, 1e-7), g, 4);
  CHECK(fabsf(g[1]) < 1e-6f && fabsf(g[2]) < 1e-6f);
  CHECK(g[0] > 0.6f && g[0] < 1.25f && g[3] > 0.6f && g[3] < 1.25f);
  CHECK(tg_newton_schulz(tg_ones(TG_SHAPE(3), NULL), 5, coefs, 3, 1e-7).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_newton_schulz", "matrices");

  tg_tensor p = tg_persist(tg_set_requires_grad(tg_from_data(d, TG_SHAPE(2, 2), NULL), true));
  tg_optim *o = tg_optim_muon(&p, 1, TG_MUON_OPTS(.lr = 0.1));
  CHECK_MSG(o != NULL, "%s", tg_last_error());
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_scope_begin();
  CHECK(tg_backward(tg_sum(tg_square(p), NULL, 0, false)) == TG_OK);
  CHECK(tg_optim_step(o) == TG_OK);
  tg_scope_end();
  tg_context_end();
  float after[4];
  get_f32(p, after, 4);
  /* the orthogonalized step moves both diagonal entries by about lr, plus lr * wd * p */
  CHECK_MSG(after[0] < 3.0f - 0.05f && after[0] > 3.0f - 0.2f, "%g", after[0]);
  CHECK(after[3] < 1.0f && after[1] == 0.0f);
  tg_optim_free(o);
  tg_free(p);
  tg_tensor z = tg_set_requires_grad(tg_scalar(1.0, NULL), true);
  CHECK(tg_optim_muon(&z, 1, NULL) == NULL);
  CHECK_ERR(TG_ERR_INVALID, "tg_optim_muon", "0-d");
  /* a 0-d tensor with requires_grad unset is a parameter too (it was taken, and its step read an
   * uninitialized shape); one marked false is a buffer, which Muon leaves alone */
  tg_tensor u = tg_scalar(1.0, NULL), v = tg_from_data((float[]){1, 2}, TG_SHAPE(1, 2), NULL);
  CHECK(tg_optim_muon((tg_tensor[]){v, u}, 2, NULL) == NULL);
  CHECK_ERR(TG_ERR_INVALID, "tg_optim_muon", "parameter 1 is 0-d");
  tg_tensor buf0 = tg_set_requires_grad(tg_scalar(1.0, NULL), false);
  tg_optim *ob = tg_optim_muon((tg_tensor[]){v, buf0}, 2, NULL);
  CHECK(ob != NULL);
  tg_optim_free(ob);
  /* an empty parameter: refused by name (its first step failed inside a reshape of (0, -1)) */
  tg_tensor e = tg_set_requires_grad(tg_zeros(TG_SHAPE(0, 3), NULL), true);
  CHECK(tg_optim_muon((tg_tensor[]){v, e}, 2, NULL) == NULL);
  CHECK_ERR(TG_ERR_INVALID, "tg_optim_muon", "parameter 1 is empty");
  /* a negative weight decay is refused as AdamW's and LAMB's are (tinygrad ignores it) */
  tg_tensor q = tg_set_requires_grad(tg_ones(TG_SHAPE(2, 2), NULL), true);
  CHECK(tg_optim_muon(&q, 1, TG_MUON_OPTS(.weight_decay = -0.5)) == NULL);
  CHECK_ERR(TG_ERR_INVALID, "tg_optim_muon", "weight_decay", "-0.5");
  CHECK(tg_optim_sgd(&q, 1, TG_SGD_OPTS(.weight_decay = -0.5)) == NULL);
  CHECK_ERR(TG_ERR_INVALID, "tg_optim_sgd", "weight_decay", "-0.5");
  CHECK(tg_optim_lars(&q, 1, TG_LARS_OPTS(.weight_decay = -1)) == NULL);
  CHECK_ERR(TG_ERR_INVALID, "tg_optim_lars", "weight_decay");
  END;
}

TEST(fp8_storage_and_casts) {
  BEGIN;
  CHECK(strcmp(tg_dtype_name(TG_FP8E4M3), "float8_e4m3") == 0 && tg_dtype_itemsize(TG_FP8E5M2) == 1);
  CHECK(tg_dtype_promote(TG_FP8E4M3, TG_FP8E5M2) == TG_FLOAT16);
  CHECK(tg_dtype_promote(TG_INT32, TG_FP8E5M2) == TG_FP8E5M2);
  const float v[6] = {0.3f, 460.0f, 1000.0f, INFINITY, -1e-4f, 57344.0f};
  tg_tensor x = tg_from_data(v, TG_SHAPE(6), NULL);
  unsigned char a[6], b[6];
  CHECK(tg_data(tg_cast(x, TG_FP8E4M3), a, 6) == TG_OK);
  CHECK(tg_data(tg_cast(x, TG_FP8E5M2), b, 6) == TG_OK);
  const unsigned char wa[6] = {42, 126, 126, 127, 128, 126}, wb[6] = {53, 95, 100, 124, 135, 123};
  for (int i = 0; i < 6; i++) CHECK_MSG(a[i] == wa[i] && b[i] == wb[i], "%d: %u %u", i, a[i], b[i]);
  /* storage made on the host (tg_full) rounds the same way; values read back through float */
  tg_tensor f = tg_full(TG_SHAPE(2), 465.0, TG_OPTS(.dtype = TG_FP8E4M3));
  double item;
  CHECK(tg_item(tg_sum(tg_cast(f, TG_FLOAT32), NULL, 0, false), &item) == TG_OK);
  CHECK_CLOSE(item, 896.0, 0);
  /* the sum of an fp8 tensor keeps its dtype, as tinygrad's: 896 in float32 saturates to 448 */
  CHECK(tg_item(tg_sum(f, NULL, 0, false), &item) == TG_OK);
  CHECK_CLOSE(item, 448.0, 0);
  END;
}

/* The fnuz fp8s (AMD's) on every CPU renderer and CL: values whose codes were taken from tinygrad 0.14's
 * float_to_fp8 -- ties, saturation (244 and 248 -> 240), subnormals, and the traps of the format: inf
 * and NaN become the one NaN 0x80, and a negative value that rounds to zero is +0 (0x80 would be NaN).
 * The exhaustive comparison is tests/test_nd_args_torch.py's. */
TEST(fp8_fnuz_casts) {
  BEGIN;
  CHECK(strcmp(tg_dtype_name(TG_FP8E4M3FNUZ), "float8_e4m3fnuz") == 0 && tg_dtype_itemsize(TG_FP8E5M2FNUZ) == 1);
  CHECK(strcmp(tg_dtype_name(TG_FP8E5M2FNUZ), "float8_e5m2fnuz") == 0 && tg_dtype_is_float(TG_FP8E4M3FNUZ));
  CHECK(tg_dtype_promote(TG_FP8E4M3FNUZ, TG_FP8E5M2FNUZ) == TG_FLOAT16 && tg_dtype_promote(TG_FP8E4M3, TG_FP8E4M3FNUZ) == TG_FLOAT16);
  CHECK(tg_dtype_promote(TG_UINT64, TG_FP8E4M3FNUZ) == TG_FP8E4M3FNUZ && tg_dtype_promote(TG_FP8E5M2FNUZ, TG_BFLOAT16) == TG_BFLOAT16);
  enum { N = 17 };
  const float v[N] = {0.3f, 244.0f, 248.0f, 1000.0f, INFINITY, NAN, -1e-4f, -0.0f, 57344.0f, 61440.0f, 0x1p-10f,
                      0x1p-11f, 0x3p-12f, 0x1p-17f, 0x1p-18f, 0x3p-19f, -0x1p-19f};
  const unsigned char want[2][N] = {{50, 127, 127, 127, 128, 128, 0, 0, 127, 127, 1, 0, 1, 0, 0, 0, 0},
                                    {57, 96, 96, 104, 128, 128, 139, 0, 127, 127, 24, 20, 22, 1, 0, 1, 0}};
  /* codes -> float32: tinygrad's fp8_to_float (0x80 is NaN, 0x00 the only zero) */
  const unsigned char codes[9] = {0x00, 0x01, 0x07, 0x08, 0x40, 0x7f, 0x80, 0x81, 0xff};
  const float dec[2][9] = {{0, 0x1p-10f, 0x7p-10f, 0x1p-7f, 1, 240, NAN, -0x1p-10f, -240},
                           {0, 0x1p-17f, 0x7p-17f, 0x1p-14f, 1, 57344, NAN, -0x1p-17f, -57344}};
  const char *devs[3] = {"CPU", "CPU:LLVM", "CL"};
  for (int d = 0; d < 3; d++) {
    tg_tensor probe = tg_from_data(v, TG_SHAPE(1), TG_OPTS(.device = devs[d]));
    if (d == 2 && !tg_valid(probe)) { /* (no OpenCL device) */
      tg_clear_error();
      continue;
    }
    for (int k = 0; k < 2; k++) {
      tg_dtype dt = k ? TG_FP8E5M2FNUZ : TG_FP8E4M3FNUZ;
      unsigned char got[N];
      CHECK_MSG(tg_data(tg_cast(tg_from_data(v, TG_SHAPE(N), TG_OPTS(.device = devs[d])), dt), got, N) == TG_OK, "%s",
                tg_last_error());
      for (int i = 0; i < N; i++)
        CHECK_MSG(got[i] == want[k][i], "%s on %s: %g -> %u, tinygrad %u", tg_dtype_name(dt), devs[d], v[i], got[i], want[k][i]);
      float f[9];
      CHECK(tg_data(tg_cast(tg_from_data(codes, TG_SHAPE(9), TG_OPTS(.dtype = dt, .device = devs[d])), TG_FLOAT32), f, sizeof f) == TG_OK);
      for (int i = 0; i < 9; i++)
        CHECK_MSG(isnan(dec[k][i]) ? isnan(f[i]) && !signbit(f[i]) : f[i] == dec[k][i] && !signbit(f[i]) == !signbit(dec[k][i]),
                  "%s on %s: code 0x%02x -> %g, tinygrad %g", tg_dtype_name(dt), devs[d], codes[i], f[i], dec[k][i]);
      /* storage made on the host (tg_full) rounds the same way */
      for (int i = 0; i < N; i++) {
        unsigned char h[1];
        CHECK(tg_data(tg_full(TG_SHAPE(1), v[i], TG_OPTS(.dtype = dt, .device = devs[d])), h, 1) == TG_OK);
        CHECK_MSG(h[0] == want[k][i], "tg_full(%g, %s) on %s: %u, tinygrad %u", v[i], tg_dtype_name(dt), devs[d], h[0], want[k][i]);
      }
    }
  }
  /* no inf: a max reduction's identity is the largest finite value, and a sum saturates at it */
  tg_tensor z = tg_full(TG_SHAPE(3), 200.0, TG_OPTS(.dtype = TG_FP8E4M3FNUZ));
  double item;
  CHECK(tg_item(tg_sum(z, NULL, 0, false), &item) == TG_OK);
  CHECK_CLOSE(item, 240.0, 0);
  CHECK(tg_item(tg_max(tg_neg(z), NULL, 0, false), &item) == TG_OK);
  CHECK_CLOSE(item, -192.0, 0); /* (200 is 192 in e4m3fnuz) */
  END;
}

int main(void) { return RUN_TESTS(); }
