/*
 * test_opt.c -- kernel optimizations never change results: every expression here is realized once
 * with the default (hand-coded) opts and once with NOOPT=1 (no merging, vectorizing or upcasting),
 * and the two must agree. Shapes are chosen so that vectorization and upcasting actually apply.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <tinygrad.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "schedule/schedule.h"
#include "tensor/tensor.h"
#include "test.h"

typedef tg_tensor (*expr_fn)(tg_tensor a, tg_tensor b);
static void last_kernel_opts(tg_tensor t, char *out, size_t n);
static KernelCode *first_kernel_for(tg_tensor t, const DeviceCaps *caps, const char *opts);

/* the applied list's text ends in "[W lanes]" when a global axis became W vector lanes (W = 0: any
 * width), "[W reduce lanes]" for lanes along a reduce axis */
static bool has_lanes(const char *opts, int w) {
  const char *p = strchr(opts, '[');
  if (!p || strstr(p, "reduce")) return false;
  return w == 0 || atoi(p + 1) == w;
}

static int count_of(const char *s, const char *what) {
  int n = 0;
  for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
  return n;
}

static tg_tensor mkrand(int64_t r, int64_t c, unsigned seed) {
  float *d = malloc(sizeof(float) * (size_t)(r * c));
  srand(seed);
  for (int64_t i = 0; i < r * c; i++) d[i] = (float)rand() / (float)RAND_MAX * 4.0f - 2.0f;
  tg_tensor t = tg_from_data(d, TG_SHAPE(r, c), NULL);
  free(d);
  return t;
}

static const char *g_beam = NULL; /* BEAM value for the optimized side (NULL: heuristics) */

static int compare(expr_fn f, int64_t ar, int64_t ac, int64_t br, int64_t bc, double tol) {
  int bad = 0;
  tg_scope_begin();
  tg_tensor a = mkrand(ar, ac, 1), b = mkrand(br, bc, 2);
  tg_context_begin();
  if (g_beam) tg_context_set("BEAM", g_beam);
  tg_tensor x = f(a, b);
  int64_t n = tg_numel(x);
  float *o1 = malloc(sizeof(float) * (size_t)(n + 1)), *o2 = malloc(sizeof(float) * (size_t)(n + 1));
  if (tg_data(tg_cast(x, TG_FLOAT32), o1, sizeof(float) * (size_t)n) != TG_OK) bad = 1;
  tg_context_end();
  tg_context_begin();
  tg_context_set("NOOPT", "1");
  /* the same values in new buffers: every node of this graph is new, so no kernel's result (an
   * intermediate the first graph materialized included) is reused from the optimized run */
  tg_tensor a2 = mkrand(ar, ac, 1), b2 = mkrand(br, bc, 2);
  tg_tensor y2 = f(a2, b2);
  if (tg_data(tg_cast(y2, TG_FLOAT32), o2, sizeof(float) * (size_t)n) != TG_OK) bad = 1;
  tg_context_end();
  for (int64_t i = 0; i < n && !bad; i++) {
    double d = fabs((double)o1[i] - (double)o2[i]);
    if (!(d <= tol * (1 + fabs((double)o2[i]))) && !(isnan(o1[i]) && isnan(o2[i]))) {
      fprintf(stderr, "  mismatch at %lld: %.9g vs %.9g\n", (long long)i, o1[i], o2[i]);
      bad = 1;
    }
  }
  free(o1);
  free(o2);
  tg_scope_end();
  return bad;
}

static tg_tensor e_matmul(tg_tensor a, tg_tensor b) { return tg_matmul(a, b); }
static tg_tensor e_matmul_relu_bias(tg_tensor a, tg_tensor b) {
  return tg_relu(tg_add(tg_matmul(a, b), tg_sum(b, TG_AXES(0), false)));
}
static tg_tensor e_matmul_t(tg_tensor a, tg_tensor b) { return tg_matmul(a, tg_transpose(b, 0, 1)); }
static tg_tensor e_elementwise(tg_tensor a, tg_tensor b) {
  tg_tensor m = tg_maximum(a, b);
  tg_tensor w = tg_where(tg_lt(a, b), tg_exp2(a), tg_log2(tg_add_s(tg_mul(b, b), 1)));
  return tg_add(tg_mul(m, w), tg_sqrt(tg_add_s(tg_mul(a, a), 0.5)));
}
static tg_tensor e_sin_recip(tg_tensor a, tg_tensor b) { return tg_add(tg_sin(a), tg_reciprocal(tg_add_s(tg_mul(b, b), 1))); }
static tg_tensor e_flip_pad(tg_tensor a, tg_tensor b) {
  tg_tensor fa = tg_flip(a, TG_AXES(1));
  tg_tensor pb = tg_pad(tg_shrink(b, (const int64_t[]){0, 32, 2, 32}, 4), (const int64_t[]){0, 0, 1, 1}, 4, 0.0);
  return tg_mul(fa, pb);
}
/* a transposed operand: vectorized along the output rows, its loads become gathers (stride 48) */
static tg_tensor e_add_transposed(tg_tensor a, tg_tensor b) {
  return tg_mul(tg_sqrt(tg_add_s(tg_mul(a, a), 1)), tg_transpose(b, 0, 1));
}
/* a transposing copy whose gathered rows outnumber L1's lines: the axis the source is contiguous
 * along is upcast too (whole cache lines per pass) */
static tg_tensor e_transpose_copy(tg_tensor a, tg_tensor b) {
  (void)b;
  return tg_contiguous(tg_transpose(a, 0, 1));
}
/* 32-bit integer lanes (the shape of threefry's random bits): adds, multiplies, rotates, xors,
 * an arithmetic right shift, a compare and a select on int32/uint32, back to float32 by a bitcast
 * and a conversion -- all vectorized, bit-exact against the scalar code */
static tg_tensor e_int_lanes(tg_tensor a, tg_tensor b) {
  tg_tensor x = tg_bitcast(a, TG_UINT32), y = tg_bitcast(b, TG_UINT32);
  tg_tensor k = tg_full_like(x, 0x9E3779B9u, NULL), s7 = tg_full_like(x, 7, NULL), s25 = tg_full_like(x, 25, NULL);
  tg_tensor h = tg_add(tg_bitwise_xor(x, k), tg_mul(y, tg_full_like(x, 2654435761u, NULL)));
  h = tg_bitwise_xor(tg_bitwise_or(tg_lshift(h, s7), tg_rshift(h, s25)), y);
  tg_tensor si = tg_rshift(tg_bitcast(h, TG_INT32), tg_full_like(tg_bitcast(h, TG_INT32), 3, NULL));
  tg_tensor pick = tg_where(tg_lt(h, y), h, tg_sub(h, y));
  tg_tensor m = tg_bitwise_or(tg_rshift(pick, tg_full_like(x, 9, NULL)), tg_full_like(x, 0x3F800000u, NULL));
  return tg_add(tg_bitcast(m, TG_FLOAT32), tg_mul_s(tg_cast(si, TG_FLOAT32), 1e-9));
}
/* integer sums do not vectorize: the reduction is unrolled instead (UNROLL) */
static tg_tensor e_int_sums(tg_tensor a, tg_tensor b) {
  tg_tensor ai = tg_cast(tg_mul_s(a, 100), TG_INT32), bi = tg_cast(tg_mul_s(b, 100), TG_INT32);
  return tg_cast(tg_add(tg_sum(tg_mul(ai, bi), TG_AXES(1), true), tg_max(ai, TG_AXES(1), true)), TG_FLOAT32);
}
/* out[c] = sum_r a[r, c] * b[c, r]: b is strided along the output and a along the reduction, so
 * neither axis vectorizes plainly; the output axis vectorizes with b gathered */
static tg_tensor e_sum_mixed_layouts(tg_tensor a, tg_tensor b) {
  return tg_sum(tg_mul(a, tg_transpose(b, 0, 1)), TG_AXES(0), false);
}
static tg_tensor e_sum_rows(tg_tensor a, tg_tensor b) { return tg_add(tg_sum(tg_mul(a, b), TG_AXES(1), true), b); }
static tg_tensor e_max_cols(tg_tensor a, tg_tensor b) { return tg_sub(tg_max(a, TG_AXES(0), true), b); }
static tg_tensor e_softmax(tg_tensor a, tg_tensor b) { return tg_mul(tg_softmax(a, 1), b); }
static tg_tensor e_bool_cast(tg_tensor a, tg_tensor b) { return tg_mul(tg_cast(tg_gt(a, b), TG_FLOAT32), tg_cast(tg_ne(a, b), TG_FLOAT32)); }
static tg_tensor e_batched(tg_tensor a, tg_tensor b) {
  tg_tensor a3 = tg_reshape(a, TG_SHAPE(4, 16, 32));
  tg_tensor b3 = tg_reshape(b, TG_SHAPE(4, 32, 16));
  return tg_reshape(tg_matmul(a3, b3), TG_SHAPE(64, 16));
}
static tg_tensor e_half(tg_tensor a, tg_tensor b) {
  return tg_cast(tg_mul(tg_cast(a, TG_FLOAT16), tg_cast(b, TG_FLOAT16)), TG_FLOAT32);
}

static tg_tensor e_conv(tg_tensor a, tg_tensor b) {
  tg_tensor x = tg_reshape(a, TG_SHAPE(4, 4, 16, 16));
  tg_tensor w = tg_reshape(b, TG_SHAPE(8, 4, 3, 3));
  return tg_reshape(tg_conv2d(x, w, (tg_tensor){0}, NULL), TG_SHAPE(4 * 8, 14 * 14));
}
static tg_tensor e_conv_u8(tg_tensor a, tg_tensor b) {
  /* uint8 input (as MNIST images are) loads as byte vectors converted to float */
  tg_tensor x = tg_cast(tg_mul_s(tg_add_s(tg_reshape(a, TG_SHAPE(4, 4, 16, 16)), 2), 2), TG_UINT8);
  tg_tensor w = tg_reshape(b, TG_SHAPE(8, 4, 3, 3));
  tg_realize(x);
  return tg_reshape(tg_conv2d(x, w, (tg_tensor){0}, NULL), TG_SHAPE(4 * 8, 14 * 14));
}
static tg_tensor e_conv_relu(tg_tensor a, tg_tensor b) {
  tg_tensor x = tg_reshape(a, TG_SHAPE(2, 8, 16, 16));
  tg_tensor w = tg_reshape(b, TG_SHAPE(16, 8, 1, 1));
  return tg_reshape(tg_relu(tg_conv2d(x, w, (tg_tensor){0}, NULL)), TG_SHAPE(32, 256));
}

/* a 2x2 max-pool over the convolution: computed inside the convolution's kernel (window fusion, a
 * max-combining store), so every optimization of that kernel must keep the combine right */
static tg_tensor e_conv_pool(tg_tensor a, tg_tensor b) {
  tg_tensor x = tg_reshape(a, TG_SHAPE(4, 4, 16, 16));
  tg_tensor w = tg_reshape(b, TG_SHAPE(8, 4, 3, 3));
  tg_tensor c = tg_add_s(tg_mul_s(tg_relu(tg_conv2d(x, w, (tg_tensor){0}, NULL)), 1.5), 0.25);
  return tg_reshape(tg_max_pool2d(c, NULL), TG_SHAPE(4 * 8, 7 * 7));
}

TEST(conv_shapes) {
  CHECK(compare(e_conv_pool, 64, 64, 8, 36, 1e-5) == 0);
  CHECK(compare(e_conv, 64, 64, 8, 36, 1e-5) == 0);
  CHECK(compare(e_conv_relu, 64, 64, 16, 8, 1e-5) == 0);
  CHECK(compare(e_conv_u8, 64, 64, 8, 36, 1e-5) == 0);
}

TEST(matmul_shapes) {
  CHECK(compare(e_matmul, 64, 64, 64, 64, 1e-5) == 0);
  CHECK(compare(e_matmul, 32, 48, 48, 80, 1e-5) == 0);
  CHECK(compare(e_matmul, 24, 40, 40, 16, 1e-5) == 0);
  CHECK(compare(e_matmul, 13, 7, 7, 19, 1e-5) == 0);
  CHECK(compare(e_matmul, 128, 96, 96, 128, 1e-5) == 0);
  CHECK(compare(e_matmul_t, 64, 32, 48, 32, 1e-5) == 0);
  CHECK(compare(e_matmul_relu_bias, 32, 32, 32, 32, 1e-5) == 0);
  /* a few rows times a weight larger than L2, read in place (a linear): lanes along the sum, the
   * weight's loop outermost, a 4x2 register tile on 16 vector registers */
  CHECK(compare(e_matmul_t, 32, 384, 1536, 384, 1e-4) == 0); /* (sums of 384 in another order) */
}
TEST(elementwise_vectorized) {
  CHECK(compare(e_elementwise, 32, 64, 32, 64, 1e-5) == 0);
  CHECK(compare(e_sin_recip, 16, 48, 16, 48, 1e-5) == 0);
  CHECK(compare(e_add_transposed, 32, 48, 48, 32, 1e-6) == 0);
  CHECK(compare(e_flip_pad, 32, 32, 32, 36, 1e-6) == 0);
  CHECK(compare(e_bool_cast, 16, 32, 16, 32, 0) == 0);
  CHECK(compare(e_half, 16, 32, 16, 32, 0) == 0);
  CHECK(compare(e_int_lanes, 16, 64, 16, 64, 0) == 0);
  CHECK(compare(e_transpose_copy, 1024, 1000, 1, 1, 0) == 0);
  CHECK(compare(e_transpose_copy, 40, 1024, 1, 1, 0) == 0);
  tg_scope_begin();
  char opts[256];
  last_kernel_opts(e_transpose_copy(mkrand(1024, 1000, 5), mkrand(1, 1, 6)), opts, sizeof opts);
  CHECK_MSG(has_lanes(opts, 0) && count_of(opts, "UPCAST:") == 2, "1024x1000 transpose: %s", opts);
  /* ...walked in tiles of rows and columns (cpu_tiles) */
  CHECK_MSG(count_of(opts, "LOCAL:") == 2, "1024x1000 transpose: %s", opts);
  last_kernel_opts(e_transpose_copy(mkrand(64, 48, 5), mkrand(1, 1, 6)), opts, sizeof opts);
  CHECK_MSG(has_lanes(opts, 0) && count_of(opts, "UPCAST:") == 1, "64x48 transpose: %s", opts);
  last_kernel_opts(e_int_lanes(mkrand(16, 64, 5), mkrand(16, 64, 6)), opts, sizeof opts);
  CHECK_MSG(has_lanes(opts, 0), "integer lanes: %s", opts);
  last_kernel_opts(tg_rand(TG_SHAPE(4096), NULL), opts, sizeof opts);
  CHECK_MSG(has_lanes(opts, 0), "tg_rand: %s", opts);
  tg_scope_end();
}
/* A transposing copy whose tile is W x W (W lanes, W positions along the gathered rows) loads the
 * tile's rows as vectors and transposes them in registers: the same values as the scalar kernel,
 * and shuffles in the CPU device's kernel source (C or LLVM IR) */
TEST(transpose_in_registers) {
  CHECK(compare(e_transpose_copy, 1024, 256, 1, 1, 0) == 0);
  CHECK(compare(e_transpose_copy, 2048, 96, 1, 1, 0) == 0);
  tg_scope_begin();
  const char *dev = getenv_str("DEV", NULL);
  Device *d = device_get(dev && *dev ? dev : "CPU");
  CHECK(d != NULL);
  KernelCode *kc = d ? first_kernel_for(e_transpose_copy(mkrand(1024, 256, 5), mkrand(1, 1, 6)), &d->caps, NULL) : NULL;
  CHECK(kc != NULL);
  if (kc && d && !d->caps.gpu) { /* (the CPU's renderers; a GPU device's work-items gather) */
    const char *shuf = d->caps.lang == LANG_LLVM ? "shufflevector" : "TG_SHUF(";
    CHECK_MSG(strstr(kc->src, shuf) != NULL, "1024x256 transpose (%s): no %s in its kernel", kc->opts, shuf);
  }
  kernel_code_free(kc);
  tg_scope_end();
}
/* A linear's epilogue (bias, residual) is loaded after the reduce loop, not held in registers
 * across it: the C kernel reads no scalar element before the reduce loop begins */
TEST(epilogue_after_reduce_loop) {
  tg_scope_begin();
  tg_tensor x = mkrand(64, 384, 1), w = mkrand(96, 384, 2), b = mkrand(1, 96, 3), res = mkrand(64, 96, 4);
  CHECK(tg_realize(x) == TG_OK && tg_realize(w) == TG_OK && tg_realize(b) == TG_OK && tg_realize(res) == TG_OK);
  tg_tensor y = tg_add(tg_linear(x, w, tg_reshape(b, TG_SHAPE(96))), res);
  KernelCode *kc = first_kernel_for(y, &device_get("CPU")->caps, NULL);
  CHECK(kc != NULL && kc->src);
  if (kc && kc->src) {
    const char *body = strstr(kc->src, "void r_");
    const char *loop = body ? strstr(body, "for (long long ridx2") : NULL;
    CHECK_MSG(loop != NULL, "no reduce loop at ridx2 (%s)", kc->opts);
    int early = 0;
    for (const char *p = body; loop && p < loop; p++) /* "(data<n>[": a scalar element read */
      if (!strncmp(p, "(data", 5) && p[5] >= '0' && p[5] <= '9' && strchr(p + 5, '[') && strchr(p + 5, '[') - p <= 8) early++;
    CHECK_MSG(early == 0, "%d scalar loads before the reduce loop (%s)", early, kc->opts);
  }
  kernel_code_free(kc);
  CHECK(compare(e_matmul_relu_bias, 64, 384, 384, 96, 1e-4) == 0);
  tg_scope_end();
}
TEST(reductions_vectorized) {
  CHECK(compare(e_sum_mixed_layouts, 24, 48, 48, 24, 1e-5) == 0);
  {
    tg_scope_begin();
    char opts[256];
    last_kernel_opts(e_sum_mixed_layouts(mkrand(24, 48, 3), mkrand(48, 24, 4)), opts, sizeof opts);
    CHECK_MSG(has_lanes(opts, 0), "opts: %s", opts);
    /* argmax of floats selects with float positions: its second reduction has vector lanes (the
     * int32 positions of before left it scalar) */
    last_kernel_opts(tg_argmax(mkrand(64, 256, 5), TG_AXES(1), false), opts, sizeof opts);
    CHECK_MSG(strstr(opts, "reduce lanes") != NULL, "argmax: %s", opts);
    tg_scope_end();
  }
  CHECK(compare(e_sum_rows, 32, 64, 32, 64, 1e-5) == 0);
  CHECK(compare(e_int_sums, 12, 40, 12, 40, 0) == 0);
  CHECK(compare(e_max_cols, 32, 64, 1, 64, 0) == 0);
  CHECK(compare(e_softmax, 16, 64, 16, 64, 1e-5) == 0);
  CHECK(compare(e_batched, 64, 32, 128, 16, 1e-5) == 0);
}

/* The FLOPs the kernels of realizing t count (DEBUG=2's GFLOPS, tg_global_counters' global_ops); with
 * NOOPT (no vector or upcast) when noopt. */
static uint64_t flops_of(tg_tensor t, bool noopt) {
  tg_context_begin();
  if (noopt) tg_context_set_int("NOOPT", 1);
  tg_global_counters_reset();
  uint64_t ops = tg_realize(t) == TG_OK ? tg_global_counters().global_ops : 0;
  tg_context_end();
  return ops;
}

/* The FLOP count is the same with and without optimizations: a matmul is 2nkm, a sum vectorized along
 * its reduce axis counts every lane (not one per vector), and a padded conv counts its full window. */
TEST(flop_counts) {
  tg_scope_begin();
  for (int noopt = 0; noopt < 2; noopt++) {
    tg_tensor a = mkrand(96, 64, 11), b = mkrand(64, 80, 12), v = tg_rand(TG_SHAPE(1 << 16), NULL);
    tg_tensor x = tg_rand(TG_SHAPE(2, 8, 12, 12), NULL), w = tg_rand(TG_SHAPE(16, 8, 3, 3), NULL);
    CHECK(tg_realize(a) == TG_OK && tg_realize(b) == TG_OK && tg_realize(v) == TG_OK);
    CHECK(tg_realize(x) == TG_OK && tg_realize(w) == TG_OK);
    uint64_t mm = flops_of(tg_matmul(a, b), noopt), want_mm = 2ull * 96 * 64 * 80;
    CHECK_MSG(mm >= want_mm && mm <= want_mm + 96 * 80, "matmul 96x64 @ 64x80: %llu FLOPs, want %llu (noopt %d)",
              (unsigned long long)mm, (unsigned long long)want_mm, noopt);
    /* one add per element, and a few more where lanes, splits or work-groups combine partial sums */
    uint64_t sm = flops_of(tg_sum(v, NULL, 0, false), noopt), want_sm = 1 << 16;
    CHECK_MSG(sm >= want_sm - 1 && sm <= want_sm + want_sm / 16, "sum of 65536: %llu FLOPs (noopt %d)", (unsigned long long)sm,
              noopt);
    tg_tensor c = tg_conv2d(x, w, (tg_tensor){0}, TG_CONV2D_OPTS(.padding = {1}));
    uint64_t cv = flops_of(c, noopt), want_cv = 2ull * 2 * 16 * 12 * 12 * 8 * 9;
    CHECK_MSG(cv >= want_cv && cv <= want_cv + 2 * 16 * 12 * 12 * 4, "conv 2x8x12x12 * 16x8x3x3: %llu FLOPs, want %llu (noopt %d)",
              (unsigned long long)cv, (unsigned long long)want_cv, noopt);
  }
  tg_scope_end();
}

/* The optimizations the heuristics apply to the last kernel that realizing t would run. */
static void last_kernel_opts(tg_tensor t, char *out, size_t n) {
  out[0] = 0;
  UOp *u = t_get(t, "last_kernel_opts");
  Schedule s;
  int tbuf;
  if (schedule_build(&s, &u, 1, &tbuf) != TG_OK) return;
  for (int i = s.nitems - 1; i >= 0; i--) {
    if (s.items[i].kind != SI_KERNEL) continue;
    LKernel *k = lower_kernel(s.items[i].ast, NULL);
    if (k) snprintf(out, n, "%s", k->opts);
    lkernel_free(k);
    break;
  }
  schedule_free(&s);
}

/* How many of the kernels that realizing t would run apply an optimization named `what`. */
static int kernels_with(tg_tensor t, const char *what) {
  UOp *u = t_get(t, "kernels_with");
  Schedule s;
  int tbuf, n = 0;
  if (schedule_build(&s, &u, 1, &tbuf) != TG_OK) return -1;
  for (int i = 0; i < s.nitems; i++) {
    if (s.items[i].kind != SI_KERNEL) continue;
    LKernel *k = lower_kernel(s.items[i].ast, NULL);
    if (k && strstr(k->opts, what)) n++;
    lkernel_free(k);
  }
  schedule_free(&s);
  return n;
}

static tg_tensor e_classifier(tg_tensor a, tg_tensor b) { return tg_matmul(a, b); }

/* PADTO: output axes no factor divides (a 10-class classifier over 37 rows, a 13x19 matmul) are
 * padded to the next multiple of 4 and upcast; the copies past the end recompute the last element,
 * so the results are exactly the unoptimized kernel's */
TEST(padded_upcasts) {
  tg_scope_begin();
  char opts[256];
  tg_tensor a = mkrand(37, 24, 5), b = mkrand(24, 10, 6);
  last_kernel_opts(tg_matmul(a, b), opts, sizeof opts);
  CHECK_MSG(strstr(opts, "PADTO:") != NULL, "opts: %s", opts);
  tg_scope_end();
  CHECK(compare(e_classifier, 37, 24, 24, 10, 1e-5) == 0);
  CHECK(compare(e_classifier, 13, 7, 7, 19, 1e-5) == 0);
  CHECK(compare(e_classifier, 9, 33, 33, 6, 1e-5) == 0);
  g_beam = "2";
  CHECK(compare(e_classifier, 37, 24, 24, 10, 1e-5) == 0);
  g_beam = NULL;
}

/* Bounded loops (codegen/bounds.c): a sum whose every term is zero where the padding's validity
 * conditions fail runs its window loops over the valid part only. Padded convolutions -- symmetric,
 * one-sided, and padded wider than the kernel so that corner outputs have no valid tap at all (an
 * empty loop) -- and a convolution's input gradient (the padded output gradient convolved with the
 * flipped weight) must agree with NOOPT; a sum that also adds an unmasked term is not bounded. */
static tg_tensor conv_padded(tg_tensor a, tg_tensor b, const tg_conv2d_opts *o) {
  tg_tensor x = tg_reshape(a, TG_SHAPE(4, 4, 16, 16));
  tg_tensor w = tg_reshape(b, TG_SHAPE(8, 4, 5, 5));
  tg_tensor y = tg_conv2d(x, w, (tg_tensor){0}, o);
  return tg_reshape(y, TG_SHAPE(32, tg_numel(y) / 32));
}
static tg_tensor e_conv_pad(tg_tensor a, tg_tensor b) { return conv_padded(a, b, TG_CONV2D_OPTS(.padding = {2})); }
static tg_tensor e_conv_pad_wide(tg_tensor a, tg_tensor b) {
  return conv_padded(a, b, TG_CONV2D_OPTS(.padding = {6}));
}
static tg_tensor e_conv_pad_sides(tg_tensor a, tg_tensor b) {
  return conv_padded(a, b, TG_CONV2D_OPTS(.padding = {0, 3, 4, 1}, .npadding = 4));
}
static tg_tensor e_conv_input_grad(tg_tensor a, tg_tensor b) {
  /* 8 input channels: the gradient's convolution accumulates channels-last and pads in its loads */
  tg_tensor x = tg_set_requires_grad(tg_detach(tg_reshape(a, TG_SHAPE(2, 8, 16, 16))), true);
  tg_tensor w = tg_reshape(b, TG_SHAPE(8, 8, 5, 5));
  tg_tensor y = tg_conv2d(x, w, (tg_tensor){0}, NULL);
  tg_tensor g = tg_reshape(tg_shrink(tg_reshape(a, TG_SHAPE(4096)), (const int64_t[]){0, 2 * 8 * 144}, 2), TG_SHAPE(2, 8, 12, 12));
  tg_tensor gx = x;
  tg_gradient(tg_sum(tg_mul(y, g), TG_ALL_AXES, false), &x, 1, &gx);
  return tg_reshape(gx, TG_SHAPE(64, 64));
}
static tg_tensor e_pad_sum_plus(tg_tensor a, tg_tensor b) {
  (void)b;
  tg_tensor p = tg_pad(a, (const int64_t[]){0, 0, 3, 5}, 4, 0.0);
  return tg_sum(tg_add_s(p, 1), TG_AXES(1), true);
}

TEST(bounded_loops) {
  CHECK(compare(e_conv_pad, 64, 64, 8, 100, 1e-5) == 0);
  CHECK(compare(e_conv_pad_wide, 64, 64, 8, 100, 1e-5) == 0);
  CHECK(compare(e_conv_pad_sides, 64, 64, 8, 100, 1e-5) == 0);
  CHECK(compare(e_conv_input_grad, 64, 64, 16, 100, 1e-5) == 0);
  CHECK(compare(e_pad_sum_plus, 16, 40, 1, 1, 1e-6) == 0);
  g_beam = "2";
  CHECK(compare(e_conv_pad_sides, 64, 64, 8, 100, 1e-5) == 0);
  g_beam = NULL;
  tg_scope_begin();
  CHECK(kernels_with(e_conv_pad(mkrand(64, 64, 7), mkrand(8, 100, 8)), "BOUNDS") == 1);
  CHECK(kernels_with(e_conv_input_grad(mkrand(64, 64, 7), mkrand(16, 100, 8)), "BOUNDS") == 1);
  CHECK(kernels_with(e_conv(mkrand(64, 64, 7), mkrand(8, 36, 8)), "BOUNDS") == 0); /* no padding */
  CHECK(kernels_with(e_pad_sum_plus(mkrand(16, 40, 7), mkrand(1, 1, 8)), "BOUNDS") == 0);
  tg_scope_end();
}

/* Error of got in units in the last place of the float nearest to the exact value want; 0 when
 * both are the same infinity or both NaN, huge when only one is. */
static double ulps(float got, double want) {
  if (isnan(want) || isnan(got)) return isnan(want) && isnan(got) ? 0 : 1e30;
  float wf = (float)want;
  if (isinf(wf) || isinf(got)) return got == wf ? 0 : 1e30;
  double sp = fabs(want) < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(want) - 23);
  return fabs((double)got - want) / sp;
}

/* The vector kernels' exp2, log2 and sin are polynomials of their own (the renderer's prelude),
 * not libm: checked here against double precision over floats of every exponent and sign, the
 * ranges each reduction changes at, and the special values. */
TEST(vector_transcendentals_accurate) {
  enum { N = 1 << 16 };
  float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
  uint32_t s = 12345;
  int n = 0;
  static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 0x1p-149f, 0x1p-127f, 0x1p-126f,
                                  -0x1p-130f, 1.0f, -1.0f, 0.5f, 2.0f, 0x1.6a09e6p+0f, 0x1.6a09e8p+0f,
                                  127.99f, 128.0f, 129.0f, -126.0f, -149.0f, -149.5f, -150.0f, -151.0f,
                                  -200.0f, 8191.9f, 8192.0f, 8192.5f, -8192.5f, 1e30f, 3.14159265f,
                                  1.5707964f, 0x1.fffffep+127f};
  for (size_t i = 0; i < sizeof special / sizeof *special; i++) x[n++] = special[i];
  while (n < N) {
    s = s * 1664525u + 1013904223u;
    uint32_t r = s;
    float v;
    switch (n % 4) {
    case 0: /* any bit pattern */
      memcpy(&v, &r, 4);
      break;
    case 1: /* exp2's range and the sin reduction's */
      v = ((float)(r >> 8) / 16777216.0f - 0.5f) * 320.0f;
      break;
    case 2: /* near 1, where log2 is small */
      v = 1.0f + ((float)(r >> 8) / 16777216.0f - 0.5f) * 0x1p-6f;
      break;
    default: /* sin up to and past 2^13 */
      v = ((float)(r >> 8) / 16777216.0f - 0.5f) * 20000.0f;
      break;
    }
    x[n++] = v;
  }
  static const char *const names[] = {"exp2", "log2", "sin"};
  /* measured: 0.95, 1.10, 0.53; an OpenCL device computes them with its own exp2, log2 and sin,
   * whose accuracy the OpenCL C specification bounds by 3, 3 and 4 ulp (PoCL's sin: 1.48) */
  static const double own_bound[] = {1.0, 1.2, 0.6}, cl_bound[] = {3.0, 3.0, 4.0};
  const double *bound = device_get(NULL)->caps.lang == LANG_OPENCL ? cl_bound : own_bound;
  /* lengths divisible by 16, by 8 only and by 4 only: each vector width has its own helpers */
  static const int lens[] = {N, N - 8, N - 4}, widths[] = {16, 8, 4};
  for (int f = 0; f < 9; f++) {
    int len = lens[f / 3];
    tg_scope_begin();
    tg_tensor t = tg_from_data(x, TG_SHAPE(len), NULL);
    tg_tensor r = f % 3 == 0 ? tg_exp2(t) : f % 3 == 1 ? tg_log2(t) : tg_sin(t);
    char opts[256];
    last_kernel_opts(r, opts, sizeof opts);
    CHECK_MSG(has_lanes(opts, widths[f / 3]),
              "%s over %d: opts %s", names[f % 3], len, opts);
    CHECK(tg_data(r, y, sizeof(float) * (size_t)len) == TG_OK);
    double worst = 0;
    int at = 0;
    for (int i = 0; i < len; i++) {
      double xd = x[i], want = f % 3 == 0 ? exp2(xd) : f % 3 == 1 ? log2(xd) : sin(xd);
      double e = ulps(y[i], want);
      if (e > worst) worst = e, at = i;
    }
    CHECK_MSG(worst <= bound[f % 3], "%s(%a) = %a: %.3f ulp from %a (width %d)", names[f % 3], x[at], y[at], worst,
              f % 3 == 0 ? exp2(x[at]) : f % 3 == 1 ? log2(x[at]) : sin(x[at]), widths[f / 3]);
    tg_scope_end();
  }
  free(x);
  free(y);
}

/* A padded convolution's register tile unrolls the batch, not the output rows that the padding's
 * conditions involve: BOUNDS then still narrows the window loop by those rows (2x faster on
 * 32x32x28x28, bench/ops.py's 3x3 convolution 22.4 -> 18.7 ms) */
TEST(padded_conv_upcasts_the_batch) {
  tg_scope_begin();
  tg_tensor x = tg_reshape(tg_mul_s(tg_arange(0, 8 * 8 * 28 * 28, 1, NULL), 1e-3), TG_SHAPE(8, 8, 28, 28));
  tg_tensor w = tg_reshape(tg_mul_s(tg_arange(0, 32 * 8 * 9, 1, NULL), 1e-3), TG_SHAPE(32, 8, 3, 3));
  x = tg_contiguous(tg_cast(x, TG_FLOAT32)), w = tg_contiguous(tg_cast(w, TG_FLOAT32));
  CHECK(tg_realize(x) == TG_OK && tg_realize(w) == TG_OK);
  tg_tensor y = tg_conv2d(x, w, (tg_tensor){0}, TG_CONV2D_OPTS(.padding = {1}));
  CHECK(kernels_with(y, "BOUNDS") == 1);
  CHECK(kernels_with(y, "UPCAST:0:") == 1); /* the one reduce kernel; axis 0 is the batch */
  tg_scope_end();
}

/* A gather whose index is computed from positions and provably in range loads without a mask at
 * an address the vectorizer follows: a bilinear resize's second pass (rows chosen per output row,
 * contiguous along the row) is vectorized. Values against a host computation of the same formula. */
TEST(position_gather_vectorizes) {
  tg_scope_begin();
  enum { C = 3, H = 5, Wd = 32, OH = 9, OW = 64 };
  float xs[C * H * Wd];
  for (int i = 0; i < C * H * Wd; i++) xs[i] = (float)((i * 37) % 101) * 0.01f - 0.5f;
  tg_tensor x = tg_from_data(xs, TG_SHAPE(1, C, H, Wd), NULL);
  CHECK(tg_realize(x) == TG_OK);
  tg_tensor y = tg_interpolate(x, (const int64_t[]){OH, OW}, 2, TG_INTERPOLATE_OPTS(.mode = TG_INTERP_BILINEAR));
  char opts[256];
  last_kernel_opts(y, opts, sizeof opts);
  CHECK_MSG(has_lanes(opts, 0), "second pass opts: %s", opts);
  float got[C * OH * OW];
  CHECK(tg_data(y, got, sizeof got) == TG_OK);
  double worst = 0;
  for (int c = 0; c < C; c++)
    for (int i = 0; i < OH; i++)
      for (int j = 0; j < OW; j++) {
        /* torch's align_corners=False source position, clamped at 0 */
        double si = fmax(0.0, (i + 0.5) * H / OH - 0.5), sj = fmax(0.0, (j + 0.5) * Wd / OW - 0.5);
        int i0 = (int)si, j0 = (int)sj, i1 = i0 + 1 < H ? i0 + 1 : H - 1, j1 = j0 + 1 < Wd ? j0 + 1 : Wd - 1;
        double fi = si - i0, fj = sj - j0;
        const float *p = xs + c * H * Wd;
        double top = p[i0 * Wd + j0] * (1 - fj) + p[i0 * Wd + j1] * fj;
        double bot = p[i1 * Wd + j0] * (1 - fj) + p[i1 * Wd + j1] * fj;
        double want = top * (1 - fi) + bot * fi, e = fabs(got[(c * OH + i) * OW + j] - want);
        if (e > worst) worst = e;
      }
  CHECK_MSG(worst < 1e-5, "largest difference %g", worst);
  tg_scope_end();
}

/* A gather through a stored index table (a bilinear resize's first pass: per-column source
 * positions) checks each index once: the gather's own range test bounds the position, so the load
 * needs neither the negative wrap nor a second range check (31% off that pass of
 * bench/ops.py's interpolate). Out-of-range indices of a plain gather still read 0. */
TEST(table_gather_checks_index_once) {
  tg_scope_begin();
  tg_tensor x = tg_reshape(tg_mul_s(tg_cast(tg_arange(0, 3 * 5 * 32, 1, NULL), TG_FLOAT32), 0.01), TG_SHAPE(1, 3, 5, 32));
  x = tg_contiguous(x);
  CHECK(tg_realize(x) == TG_OK);
  tg_tensor y = tg_interpolate(x, (const int64_t[]){9, 64}, 2, TG_INTERPOLATE_OPTS(.mode = TG_INTERP_BILINEAR));
  UOp *u = t_get(y, "test");
  Schedule s;
  int tbuf, seen = 0;
  CHECK(schedule_build(&s, &u, 1, &tbuf) == TG_OK);
  for (int i = 0; i < s.nitems; i++) {
    if (s.items[i].kind != SI_KERNEL) continue;
    KernelCode *kc = codegen_for(s.items[i].ast, &device_get("CPU")->caps, NULL); /* C source, whatever DEV is */
    CHECK(kc != NULL);
    if (kc && count_of(kc->src, "? (data") == 2 && !strstr(kc->src, "tg_vf")) { /* the scalar first pass */
      seen++;
      CHECK_MSG(count_of(kc->src, "<0") == 2, "first pass:\n%s", kc->src);
    }
    kernel_code_free(kc);
  }
  schedule_free(&s);
  CHECK(seen == 1);
  /* a plain gather: indices below 0 and past the end still read 0 */
  float xs[4] = {1, 2, 3, 4};
  int32_t is[5] = {-1, 0, 3, 4, 2};
  tg_tensor g = tg_gather(tg_from_data(xs, TG_SHAPE(4), NULL), 0,
                          tg_from_data(is, TG_SHAPE(5), TG_OPTS(.dtype = TG_INT32)));
  float got[5];
  CHECK(tg_data(g, got, sizeof got) == TG_OK);
  CHECK(got[0] == 0 && got[1] == 1 && got[2] == 4 && got[3] == 0 && got[4] == 3);
  tg_scope_end();
}

/* x << 8k | x >> (32 - 8k) on uint32 vector lanes renders as a byte shuffle (tg_vrotb): threefry's
 * rotations by 16 and 24 in rand's kernel, whose values stay those of the shifts -- the same bits as
 * CPU:LLVM's kernel, which keeps the shifts, and as the scalar kernel (NOOPT) */
TEST(byte_rotation_in_rand) {
  enum { N = 1 << 16 };
  static float got[3][N];
  for (int pass = 0; pass < 3; pass++) {
    tg_scope_begin();
    tg_manual_seed(11);
    tg_context_begin(); /* (settings are read from the environment once: a context overrides them) */
    if (pass == 2) tg_context_set("NOOPT", "1");
    tg_tensor y = tg_rand(TG_SHAPE(N), TG_OPTS(.device = pass == 1 ? "CPU:LLVM" : "CPU"));
    if (pass == 0) {
      UOp *u = t_get(y, "test");
      Schedule s;
      int tbuf, rot = 0;
      CHECK(schedule_build(&s, &u, 1, &tbuf) == TG_OK);
      for (int i = 0; i < s.nitems; i++) {
        if (s.items[i].kind != SI_KERNEL) continue;
        KernelCode *kc = codegen_for(s.items[i].ast, &device_get("CPU")->caps, NULL);
        if (kc) rot += count_of(kc->src, "tg_vrotb2((") + count_of(kc->src, "tg_vrotb3((");
        kernel_code_free(kc);
      }
      schedule_free(&s);
      CHECK_MSG(rot == 4, "%d byte rotations in rand's kernel", rot); /* 16 and 24, in two of the five round groups */
    }
    CHECK(tg_data(y, got[pass], sizeof got[pass]) == TG_OK);
    tg_context_end();
    tg_scope_end();
  }
  CHECK(memcmp(got[0], got[1], sizeof got[0]) == 0);
  CHECK(memcmp(got[0], got[2], sizeof got[0]) == 0);
}

/* The vector exp2's fast path (every lane's n = round(x) in [-125, 127]: 2^n added to the exponent
 * field, n read from the bits of x + 1.5*2^23) and its slow path (clamps, two factors, NaN): values
 * stepping across both ends of the range, so vectors lie inside, across and outside it, with NaN and
 * inf lanes in a few. The C kernel (compiled, not tiered) and CPU:LLVM's give the same bits, within
 * an ulp of exp2 in double. */
TEST(exp2_fast_path_both_renderers) {
  enum { N = 8192 };
  static float x[N], got[2][N];
  for (int i = 0; i < N; i++) x[i] = -127.0f + 256.0f * (float)i / (float)N;
  x[2048 + 3] = NAN, x[4096 + 5] = INFINITY, x[6144 + 1] = -INFINITY, x[100] = 1e30f, x[7000] = -1e30f;
  tg_context_begin();
  tg_context_set("TIERED", "0");
  for (int pass = 0; pass < 2; pass++) {
    tg_scope_begin();
    tg_tensor y = tg_exp2(tg_from_data(x, TG_SHAPE(N), TG_OPTS(.device = pass ? "CPU:LLVM" : "CPU")));
    CHECK(tg_data(y, got[pass], sizeof got[pass]) == TG_OK);
    tg_scope_end();
  }
  tg_context_end();
  CHECK(memcmp(got[0], got[1], sizeof got[0]) == 0);
  double worst = 0;
  int at = 0;
  for (int i = 0; i < N; i++) {
    double e = ulps(got[0][i], exp2((double)x[i]));
    if (e > worst) worst = e, at = i;
  }
  CHECK_MSG(worst <= 1.0, "exp2(%a) = %a: %.3f ulp", x[at], got[0][at], worst);
}

/* BEAM search picks among candidates checked against the unoptimized kernel: the chosen kernels
 * must agree with NOOPT too (a private cache directory keeps earlier choices out of it) */
TEST(beam_choices_agree) {
  g_beam = "2";
  CHECK(compare(e_matmul, 64, 32, 32, 48, 1e-5) == 0);
  CHECK(compare(e_elementwise, 16, 32, 16, 32, 1e-5) == 0);
  CHECK(compare(e_conv, 64, 64, 8, 36, 1e-5) == 0);
  CHECK(compare(e_conv_pool, 64, 64, 8, 36, 1e-5) == 0);
  CHECK(compare(e_sum_rows, 32, 64, 32, 64, 1e-5) == 0);
  g_beam = NULL;
}

/* The list BEAM chose for the one kernel of f() (NULL: none or several cached), searched in a private
 * cache directory `name` */
static char *beam_choice(const char *name, tg_tensor (*f)(void)) {
  char dir[4096], bd[4200], p[4500];
  snprintf(dir, sizeof dir, "%s", tpath(name));
  if (mkdir(dir, 0755) != 0) return NULL;
  tg_context_begin();
  tg_context_set("BEAM", "2");
  tg_context_set("TINYGRAD_CACHE_DIR", dir);
  tg_scope_begin();
  tg_status st = tg_realize(f());
  tg_scope_end();
  tg_context_end();
  if (st != TG_OK) return NULL;
  snprintf(bd, sizeof bd, "%s/beam", dir);
  DIR *d = opendir(bd);
  char *line = NULL;
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (!strstr(e->d_name, ".opts")) continue;
    n++;
    snprintf(p, sizeof p, "%s/%s", bd, e->d_name);
    size_t len = 0;
    free(line);
    line = tt_read_file(p, &len);
  }
  if (d) closedir(d);
  if (n != 1) free(line), line = NULL;
  return line;
}
static tg_tensor inf_row_max(void) {
  float *x = malloc(sizeof(float) * 64 * 4093);
  for (int i = 0; i < 64 * 4093; i++) x[i] = (float)((i * 37) % 101) * 0.01f;
  for (int j = 0; j < 4093; j++) x[5 * 4093 + j] = -INFINITY;
  tg_tensor t = tg_max(tg_from_data(x, TG_SHAPE(64, 4093), NULL), TG_AXES(1), false);
  free(x);
  return t;
}
static tg_tensor g_ha, g_hb; /* float16 inputs, realized before the search */
static tg_tensor half_matmul(void) { return tg_matmul(g_ha, g_hb); }

/* BEAM compares each candidate's output with the unoptimized kernel's: an output with an infinity
 * (a max over a row of -inf) matches where both are the same infinity (inf - inf is NaN: every
 * candidate, the heuristics' own list too, was dropped and the kernel ran unoptimized, 30x slower),
 * and float16 outputs within a few of their rounding steps (other summation orders round
 * differently: compared byte for byte, only the unoptimized kernel remained) */
TEST(beam_compares_inf_and_half_outputs) {
  char *l = beam_choice("beam-inf", inf_row_max);
  CHECK_MSG(l && l[0] && l[0] != '\n', "the -inf max kept no optimization: '%s'", l ? l : "(no choice)");
  free(l);
  tg_scope_begin();
  g_ha = tg_cast(mkrand(63, 129, 5), TG_FLOAT16), g_hb = tg_cast(mkrand(129, 33, 6), TG_FLOAT16);
  CHECK(tg_realize(g_ha) == TG_OK && tg_realize(g_hb) == TG_OK);
  l = beam_choice("beam-half", half_matmul);
  tg_scope_end();
  CHECK_MSG(l && l[0] && l[0] != '\n', "the float16 matmul kept no optimization: '%s'", l ? l : "(no choice)");
  free(l);
}

/* Runs this test binary's beam_cache_odd_entries as a child with BEAM=2 and TINYGRAD_CACHE_DIR=dir
 * (a fresh process: no choice cached in memory), under `timeout 120`; its exit status, or -1. */
static int beam_child(const char *dir) {
  char self[4096], cmd[9000];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return -1;
  self[n] = 0;
  snprintf(cmd, sizeof cmd,
           "env -u BEAM TINYGRAD_CACHE_DIR='%s' TEST_FILTER=beam_cache_odd_entries TG_BEAM_CHILD=1 timeout 120 '%s' "
           ">/dev/null 2>&1",
           dir, self);
  int st = system(cmd);
  return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Counts the entries of dir/beam whose name holds `part`; with replace set, each .opts entry is first
 * replaced by a directory ('d') or a FIFO ('f'). */
static int beam_entries(const char *dir, const char *part, char replace) {
  char bd[4200], p[4500];
  snprintf(bd, sizeof bd, "%s/beam", dir);
  DIR *d = opendir(bd);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strstr(e->d_name, part)) continue;
    n++;
    snprintf(p, sizeof p, "%s/%s", bd, e->d_name);
    if (replace && (unlink(p) == 0 || rmdir(p) == 0)) {
      if (replace == 'd') mkdir(p, 0755);
      else mkfifo(p, 0644);
    }
  }
  closedir(d);
  return n;
}

/* The disk cache of BEAM choices takes only regular files: a FIFO where a choice should be is a
 * miss (opening it waited for a writer forever), and a directory there keeps the fresh choice from
 * being stored without leaving its temporary file behind. */
TEST(beam_cache_odd_entries) {
  if (getenv("TG_BEAM_CHILD")) { /* the child: one search (or cache read), checked against NOOPT */
    g_beam = "2";
    CHECK(compare(e_matmul, 16, 32, 32, 16, 1e-5) == 0);
    g_beam = NULL;
    return;
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", tpath("beam-odd"));
  CHECK(mkdir(dir, 0755) == 0);
  CHECK(beam_child(dir) == 0);
  CHECK(beam_entries(dir, ".opts", 0) >= 1);
  CHECK(beam_entries(dir, ".opts", 'd') >= 1);
  CHECK(beam_child(dir) == 0);
  CHECK(beam_child(dir) == 0);
  CHECK_MSG(beam_entries(dir, ".tmp", 0) == 0, "temporary files left in %s/beam", dir);
  CHECK(beam_entries(dir, ".opts", 'f') >= 1);
  CHECK(beam_child(dir) == 0); /* 124 from timeout: the read hung */
}

/* a BEAM choice read back from the disk cache is the list that was written: CPU actions (vector
 * lanes along a reduce axis, PADTO, the SWAPs of a loop order, THREAD) included; malformed lines,
 * the former twelve-integer form among them, are misses */
TEST(beam_cache_line_round_trip) {
  static const char *const lines[] = {"UNROLL:1:8,UPCAST:0:4,UPCAST:2:4", "UPCAST:2:16,UPCAST:0:8,UPCAST:2:2,SWAP:1:2,SWAP:0:1",
                                      "PADTO:0:4,UPCAST:0:4,THREAD:0:1", "LOCAL:0:16,GROUP:0:32,NOLOCALS", ""};
  for (int i = 0; i < (int)(sizeof lines / sizeof *lines); i++) {
    OptList l;
    char back[256];
    CHECK_MSG(optlist_parse(lines[i], &l), "%s", lines[i]);
    optlist_format(&l, back, sizeof back);
    CHECK_MSG(strcmp(back, lines[i]) == 0, "%s came back as %s", lines[i], back);
  }
  OptList l;
  CHECK(!optlist_parse("0 16 -1 1 1 0 -1 0 -1 1 -1 1", &l)); /* the former form of a CPU choice */
  CHECK(!optlist_parse("UPCAST:0", &l));                     /* no argument */
  CHECK(!optlist_parse("UPCAST:0:4x", &l));                  /* trailing text */
  CHECK(!optlist_parse("VECTORIZE:0:16", &l));               /* no such action */
  CHECK(!optlist_parse("UPCAST:0:-4", &l));                  /* negative */
  char many[512] = "";
  for (int i = 0; i <= OPTLIST_MAX; i++) strcat(many, "SWAP:0:1,");
  CHECK(!optlist_parse(many, &l)); /* longer than OPTLIST_MAX */
}

/* The heuristics' choice is an Opt list like any other: applying the list a kernel reports gives
 * that kernel again, byte for byte (BEAM's seed candidate and a cached choice rely on it). Kernels
 * with vector lanes along the output and along a reduction, gathers, register tiles, PADTO, the
 * loop swaps of a convolution and a scalar unroll; the device's own capabilities. */
static int replay_mismatches(expr_fn f, int64_t ar, int64_t ac, int64_t br, int64_t bc, int *nk) {
  int bad = 0;
  tg_scope_begin();
  tg_tensor y = f(mkrand(ar, ac, 1), mkrand(br, bc, 2));
  UOp *u = t_get(y, "replay_mismatches");
  Schedule s;
  int tbuf;
  Device *dev = device_get(NULL);
  if (!dev || schedule_build(&s, &u, 1, &tbuf) != TG_OK) {
    tg_scope_end();
    return 1;
  }
  for (int i = 0; i < s.nitems; i++) {
    if (s.items[i].kind != SI_KERNEL) continue;
    KernelCode *h = codegen_for(s.items[i].ast, &dev->caps, NULL);
    KernelCode *r = h ? codegen_for(s.items[i].ast, &dev->caps, &h->applied) : NULL;
    if (!h || !r || strcmp(h->src, r->src) != 0) {
      fprintf(stderr, "  %s [%s] does not replay%s\n", h ? h->name : "?", h ? h->opts : "", r ? " to the same source" : "");
      bad++;
    }
    (*nk)++;
    kernel_code_free(h), kernel_code_free(r);
  }
  schedule_free(&s);
  tg_scope_end();
  return bad;
}

static tg_tensor e_int_sum_strided(tg_tensor a, tg_tensor b) {
  (void)b;
  return tg_sum(tg_cast(tg_transpose(tg_mul_s(a, 8), 0, 1), TG_INT32), TG_AXES(1), false);
}

TEST(heuristic_list_replays) {
  int nk = 0;
  CHECK(replay_mismatches(e_matmul, 64, 32, 32, 48, &nk) == 0);
  CHECK(replay_mismatches(e_classifier, 37, 24, 24, 10, &nk) == 0);
  CHECK(replay_mismatches(e_conv, 64, 64, 8, 36, &nk) == 0);
  CHECK(replay_mismatches(e_conv_pool, 64, 64, 8, 36, &nk) == 0);
  CHECK(replay_mismatches(e_conv_input_grad, 64, 64, 8, 200, &nk) == 0);
  CHECK(replay_mismatches(e_sum_mixed_layouts, 24, 48, 48, 24, &nk) == 0);
  CHECK(replay_mismatches(e_transpose_copy, 1024, 1000, 1, 1, &nk) == 0);
  CHECK(replay_mismatches(e_int_sums, 12, 40, 12, 40, &nk) == 0);
  CHECK(replay_mismatches(e_int_sum_strided, 64, 48, 1, 1, &nk) == 0);
  CHECK(replay_mismatches(e_softmax, 32, 64, 32, 64, &nk) == 0);
  CHECK(replay_mismatches(e_half, 16, 32, 16, 32, &nk) == 0);
  CHECK(nk >= 12);
}

/* Lists forced on a CPU kernel: THREAD sets the launch's thread count; LOCAL tiles a loop where it
 * divides the loop left after the upcasts; GROUP (a GPU action), an UPCAST the axis does not allow
 * (not dividing it, without PADTO) and a second tile of one axis do not apply.
 * (The CPU device's kernel for t's first reduction, whatever DEV is.) */
static KernelCode *first_kernel_for(tg_tensor t, const DeviceCaps *caps, const char *opts) {
  UOp *u = t_get(t, "first_kernel_for");
  Schedule s;
  int tbuf;
  OptList l;
  KernelCode *kc = NULL;
  if ((opts && !optlist_parse(opts, &l)) || schedule_build(&s, &u, 1, &tbuf) != TG_OK) return NULL;
  for (int i = 0; i < s.nitems && !kc; i++)
    if (s.items[i].kind == SI_KERNEL) kc = codegen_for(s.items[i].ast, caps, opts ? &l : NULL);
  schedule_free(&s);
  return kc;
}
static KernelCode *first_reduce_kernel(tg_tensor t, const char *opts) { return first_kernel_for(t, &device_get("CPU")->caps, opts); }

TEST(cpu_lists_apply) {
  tg_scope_begin();
  tg_tensor a = mkrand(37, 64, 1), b = mkrand(64, 48, 2);
  CHECK(tg_realize(a) == TG_OK && tg_realize(b) == TG_OK);
  tg_tensor y = tg_matmul(a, b); /* one kernel: 37 x 48 outputs, 64 terms */
  static const struct {
    const char *opts;
    bool applies;
    int64_t threads; /* local_size[0] when it applies; -1: the default's */
  } cases[] = {
      {"UPCAST:1:16,UPCAST:0:4,THREAD:0:1", false, 0},        /* 37 rows: 4 does not divide */
      {"UPCAST:1:16,PADTO:0:4,UPCAST:0:4,THREAD:0:1", true, 1}, {"UPCAST:1:16,THREAD:0:2", true, 2},
      {"UPCAST:1:16,UPCAST:0:37,SWAP:0:1", true, -1},         {"THREAD:1:2", false, 0},
      {"LOCAL:0:4", false, 0},                                 {"GROUP:0:16", false, 0},
      {"UPCAST:1:16,LOCAL:1:3", true, -1},                     {"UPCAST:1:16,LOCAL:1:2", false, 0},
      {"LOCAL:0:37,LOCAL:1:8", true, -1},
      {"UPCAST:1:16,UPCAST:0:37,UPCAST:0:37", false, 0},       {"UNROLL:0:3", false, 0},
      {"UNROLL:0:16,UPCAST:1:4", true, -1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    KernelCode *kc = first_reduce_kernel(y, cases[i].opts);
    CHECK_MSG((kc != NULL) == cases[i].applies, "%s: %s", cases[i].opts, kc ? "applies" : "does not apply");
    if (kc && cases[i].threads >= 0) CHECK_MSG(kc->local_size[0] == cases[i].threads, "%s: %lld threads", cases[i].opts, (long long)kc->local_size[0]);
    kernel_code_free(kc);
  }
  tg_scope_end();
  /* BEAM's lists compute what NOOPT computes, THREAD and PADTO among them */
  g_beam = "1";
  CHECK(compare(e_classifier, 37, 64, 64, 48, 1e-5) == 0);
  g_beam = NULL;
}

/* The applied list of t's first kernel (here its only one, a product), generated for `caps`. */
static void reduce_opts_for(tg_tensor t, const DeviceCaps *caps, char *out, size_t n) {
  KernelCode *kc = first_kernel_for(t, caps, NULL);
  snprintf(out, n, "%s", kc ? kc->opts : "");
  kernel_code_free(kc);
}

static tg_tensor e_matmul_gelu(tg_tensor a, tg_tensor b) { return tg_gelu(tg_matmul(a, b)); }

/* A product vectorized along its columns whose rows' operand is larger than L2 runs its rows in
 * tiles of about half the L2 (LOCAL on the rows, the tiles' loop outermost), each tile multiplied
 * with every column panel while it stays in cache; with the operand inside L2 the rows stay one
 * loop. Lowered for the host CPU with its L2 set small, then large; then computed on the host with
 * the rows' operand four times its L2, against NOOPT. */
TEST(matmul_rows_tiled_past_l2) {
  BEGIN;
  tg_tensor a = mkrand(512, 64, 1), b = mkrand(64, 48, 2); /* the rows' operand: 128 KiB */
  CHECK(tg_realize(a) == TG_OK && tg_realize(b) == TG_OK);
  tg_tensor y = tg_gelu(tg_matmul(a, b));
  DeviceCaps caps = device_get("CPU")->caps;
  char opts[200];
  caps.l2_bytes = 32 << 10;
  reduce_opts_for(y, &caps, opts, sizeof opts);
  const char *loc = strstr(opts, "LOCAL:0:");
  CHECK_MSG(loc != NULL && !strstr(opts, "SWAP"), "L2 32 KiB: %s", opts);
  if (loc) {
    /* rows in 4-row register tiles: a tile of t of them reads t * 4 * 64 floats, at most half the L2 */
    int t = atoi(loc + 8);
    CHECK_MSG(t >= 2 && t * 4 * 64 * 4 <= 16 << 10 && 512 / 4 / t >= 4, "L2 32 KiB: %s", opts);
  }
  caps.l2_bytes = 1 << 20;
  reduce_opts_for(y, &caps, opts, sizeof opts);
  CHECK_MSG(opts[0] && !strstr(opts, "LOCAL"), "L2 1 MiB: %s", opts);
  const DeviceCaps *host = &device_get(NULL)->caps;
  int64_t l2 = !host->gpu && host->l2_bytes > 0 ? host->l2_bytes : 1 << 20;
  int64_t rows = (4 * l2 / (64 * 4) + 63) / 64 * 64;
  if (!host->gpu) {
    tg_scope_begin();
    tg_tensor a2 = mkrand(rows, 64, 3), b2 = mkrand(64, 48, 4);
    char real[200];
    reduce_opts_for(tg_gelu(tg_matmul(a2, b2)), host, real, sizeof real);
    CHECK_MSG(strstr(real, "LOCAL:0:") != NULL, "%lld rows on the host: %s", (long long)rows, real);
    tg_scope_end();
  }
  CHECK(compare(e_matmul_gelu, rows, 64, 64, 48, 1e-4) == 0);
  END;
}

/* Attention's scores q @ k^T over 16 features per head: the transposed key is stored first, so the
 * scores' kernel runs vector lanes along the keys (the output) as a matmul does, not along the 16
 * features with a horizontal sum per score. Of the kernels, only the softmax's two row reductions
 * (max and sum along the keys) take lanes along a reduction. A single query keeps the key in
 * place. Values against NOOPT. */
static tg_tensor e_attention(tg_tensor a, tg_tensor b) {
  tg_tensor q = tg_reshape(a, TG_SHAPE(2, 4, 32, 16)), k = tg_reshape(b, TG_SHAPE(2, 4, 32, 16));
  return tg_reshape(tg_scaled_dot_product_attention(q, k, tg_mul_s(k, 0.5), (tg_tensor){0}, NULL), TG_SHAPE(256, 16));
}

TEST(attention_scores_lanes_along_keys) {
  BEGIN;
  tg_tensor a = mkrand(256, 16, 1), b = mkrand(256, 16, 2);
  tg_tensor y = e_attention(a, b);
  CHECK_MSG(kernels_with(y, "reduce lanes") == 2, "%d kernels with reduce lanes", kernels_with(y, "reduce lanes"));
  tg_tensor q1 = tg_reshape(tg_shrink(a, (const int64_t[]){0, 8, 0, 16}, 4), TG_SHAPE(8, 1, 16));
  tg_tensor k1 = tg_reshape(b, TG_SHAPE(8, 32, 16));
  tg_tensor y1 = tg_scaled_dot_product_attention(q1, k1, k1, (tg_tensor){0}, NULL);
  UOp *u = t_get(y1, "attention_scores_lanes_along_keys");
  Schedule s;
  int tbuf, copies = 0;
  CHECK(u != NULL);
  if (!u || schedule_build(&s, &u, 1, &tbuf) != TG_OK) {
    END;
    return;
  }
  for (int i = 0; i < s.nitems; i++) copies += s.items[i].kind == SI_KERNEL && s.items[i].ast->src[0]->src[2]->op == OP_LOAD;
  schedule_free(&s);
  CHECK_MSG(copies == 0, "%d plain copies for a single query", copies);
  END;
  CHECK(compare(e_attention, 256, 16, 256, 16, 1e-5) == 0);
}

/* The launch's thread count counts every element a kernel touches: a reduction vectorized along its
 * axis does a vector of elements per iteration of its loop. A cross-entropy's sums of exponentials
 * (512 rows of 1000) ran on one thread, its work counted a vector width too small (0.95 -> 0.49 ms
 * with two threads); a few rows of the same stay on the calling thread. */
TEST(cpu_threads_count_reduce_lanes) {
  tg_scope_begin();
  static const int row_counts[] = {4, 512};
  for (size_t i = 0; i < sizeof row_counts / sizeof *row_counts; i++) {
    int rows = row_counts[i];
    tg_tensor x = mkrand(rows, 1000, 3);
    CHECK(tg_realize(x) == TG_OK);
    KernelCode *kc = first_reduce_kernel(tg_sum(tg_exp(x), TG_AXES(1), false), NULL);
    CHECK(kc != NULL);
    if (kc) CHECK_MSG(kc->local_size[0] == (rows == 4 ? 1 : 0), "%d rows: %s, %lld threads", rows, kc->opts, (long long)kc->local_size[0]);
    kernel_code_free(kc);
  }
  tg_scope_end();
}

/* float16 and bfloat16 run in vector lanes (float lanes, rounded after every operation, converted
 * with vector integer code): bit for bit what the scalar kernels (NOOPT) give, over every one of the
 * 65536 bit patterns -- infinities, subnormals, overflow, NaN payloads -- and a selection passes
 * every NaN, signalling ones too, through unchanged, as the scalar code does. */
typedef tg_tensor (*hfn)(tg_tensor x, tg_tensor y);
static tg_tensor h_add(tg_tensor x, tg_tensor y) { return tg_add(x, y); }
static tg_tensor h_mul(tg_tensor x, tg_tensor y) { return tg_mul(x, y); }
static tg_tensor h_div(tg_tensor x, tg_tensor y) { return tg_div(x, y); }
static tg_tensor h_max(tg_tensor x, tg_tensor y) { return tg_maximum(x, y); }
static tg_tensor h_sel(tg_tensor x, tg_tensor y) { return tg_where(tg_lt(x, y), x, tg_neg(y)); }
static tg_tensor h_sqrt(tg_tensor x, tg_tensor y) { return tg_add(tg_sqrt(tg_abs(x)), tg_reciprocal(y)); }
static tg_tensor h_f32(tg_tensor x, tg_tensor y) {
  return tg_cast(tg_add(tg_mul(tg_cast(x, TG_FLOAT32), tg_cast(y, TG_FLOAT32)), tg_cast(y, TG_FLOAT32)), tg_dtype_of(x));
}
static tg_tensor h_keep(tg_tensor x, tg_tensor y) { return tg_where(tg_ne(y, y), y, x); } /* NaN y: y's own bits */
/* x read transposed: the vector lanes gather it (a strided half load) */
static tg_tensor h_gather(tg_tensor x, tg_tensor y) { return tg_add(tg_transpose(x, 0, 1), y); }
static tg_tensor h_gather_keep(tg_tensor x, tg_tensor y) { (void)y; return tg_neg(tg_transpose(x, 0, 1)); }
/* a max along rows of a product: float32 vector accumulators over the half values */
static tg_tensor h_rowmax(tg_tensor x, tg_tensor y) { return tg_add(y, tg_max(tg_mul(x, y), TG_AXES(1), true)); }
/* float32 bit patterns (x's bits in the top half, y's in the bottom: signalling NaNs among them) cast
 * to x's dtype: a cast keeps a NaN's payload without quieting it, as the scalar conversion does */
static tg_tensor h_narrow(tg_tensor x, tg_tensor y) {
  tg_tensor hi = tg_cast(tg_bitcast(x, TG_UINT16), TG_UINT32), lo = tg_cast(tg_bitcast(y, TG_UINT16), TG_UINT32);
  tg_tensor f = tg_contiguous(tg_bitcast(tg_bitwise_or(tg_mul_s(hi, 65536), lo), TG_FLOAT32)); /* its own kernel */
  return tg_cast(f, tg_dtype_of(x));
}

static const char *g_half_cc; /* a compiler command for the kernels (NULL: the default) */

/* How many of the 65536 results differ between a and b, and the first (-1: none). An operation on
 * two NaNs may return either one's (the compiler may swap the operands of a commutative op, and x86
 * returns the first's): unless nan_bits (the function keeps NaN bits), a NaN for a NaN is equal. */
static int half_diff(bool bf16, const uint16_t *a, const uint16_t *b, bool nan_bits, int *first) {
  int diff = 0;
  *first = -1;
  for (int i = 0; i < 65536; i++) {
    bool na = bf16 ? (a[i] & 0x7fff) > 0x7f80 : (a[i] & 0x7fff) > 0x7c00;
    bool nb = bf16 ? (b[i] & 0x7fff) > 0x7f80 : (b[i] & 0x7fff) > 0x7c00;
    if (a[i] != b[i] && !(na && nb && !nan_bits)) diff++, *first = *first < 0 ? i : *first;
  }
  return diff;
}

static size_t half_run(hfn f, tg_tensor x, tg_tensor y, bool noopt, uint16_t *out) {
  tg_scope_begin();
  tg_context_begin();
  tg_context_set("TIERED", "0"); /* the C kernels themselves, not an LLVM stand-in run while they compile */
  if (noopt) tg_context_set_int("NOOPT", 1);
  if (g_half_cc) tg_context_set("CC", g_half_cc);
  tg_status st = tg_data(f(x, y), out, 65536 * 2);
  tg_context_end();
  tg_scope_end();
  return st == TG_OK;
}

/* the value after a reduction whose lanes run along the output axis reads the vector accumulators:
 * it vectorizes by the same rules as the rest (a float -> int cast of it was left to the renderer,
 * which wrote it as a mask: float(argmax(x, 0)) was -1 where the answer was 1) */
TEST(post_reduce_casts_in_lanes) {
  tg_scope_begin();
  float d[12] = {5, 1, 9, 7, 6, 8, 0, 8, 0, 3, 4, -1}; /* argmax over axis 0: 1 1 0 1 */
  tg_tensor x = tg_from_data(d, TG_SHAPE(3, 4), NULL);
  float o[4];
  CHECK(tg_data(tg_cast(tg_argmax(x, TG_AXES(0), false), TG_FLOAT32), o, sizeof o) == TG_OK);
  CHECK_MSG(o[0] == 1 && o[1] == 1 && o[2] == 0 && o[3] == 1, "float(argmax) = %g %g %g %g", o[0], o[1], o[2], o[3]);
  CHECK(tg_data(tg_add_s(tg_argmin(x, TG_AXES(0), false), 0.5), o, sizeof o) == TG_OK);
  CHECK_MSG(o[0] == 2.5 && o[1] == 0.5 && o[2] == 1.5 && o[3] == 2.5, "argmin + 0.5 = %g %g %g %g", o[0], o[1], o[2], o[3]);
  float e[64];
  for (int i = 0; i < 64; i++) e[i] = (float)i * 0.75f;
  tg_tensor y = tg_from_data(e, TG_SHAPE(4, 16), NULL);
  float s[16];
  CHECK(tg_data(tg_cast(tg_cast(tg_sum(y, TG_AXES(0), false), TG_INT32), TG_FLOAT32), s, sizeof s) == TG_OK);
  for (int j = 0; j < 16; j++) {
    float want = (float)(int)(0.75f * (float)(4 * j + 96));
    CHECK_MSG(s[j] == want, "float(int(sum))[%d] = %g, want %g", j, s[j], want);
  }
  tg_scope_end();
}

/* cummax's indices compare the input with its running max: an input that rounds (softmax's exp2),
 * computed in vector lanes for one and in scalar code for the other, could differ in its last bit
 * and match no position (index -1); both read one materialized copy */
TEST(cummax_indices_read_one_copy) {
  tg_scope_begin();
  float yd[12];
  for (int i = 0; i < 12; i++) yd[i] = (float)sin(i * 0.77 + 13.0) * 1.2f + 0.1f * (float)((i * 7 + 10) % 5);
  tg_tensor t = tg_softmax(tg_from_data(yd, TG_SHAPE(3, 4), NULL), 0);
  t = tg_tril(t, 1);
  t = tg_sub(t, tg_max(t, TG_AXES(1), true));
  tg_tensor v, ix;
  CHECK(tg_cummax(t, 0, &v, &ix) == TG_OK);
  int io[12];
  float vf[12], tf[12];
  CHECK(tg_data(ix, io, sizeof io) == TG_OK && tg_data(v, vf, sizeof vf) == TG_OK && tg_data(t, tf, sizeof tf) == TG_OK);
  /* each index points at a position at or before it holding the running max */
  for (int i = 0; i < 12; i++) {
    int r = i / 4, c = i % 4;
    CHECK_MSG(io[i] >= 0 && io[i] <= r && fabsf(tf[io[i] * 4 + c] - vf[i]) <= 1e-6f, "index [%d][%d] = %d", r, c, io[i]);
  }
  tg_scope_end();
}

TEST(half_lanes_bit_exact) {
  BEGIN;
  static uint16_t xb[65536], yb[65536], o1[65536], o2[65536], o3[65536];
  for (int i = 0; i < 65536; i++) xb[i] = (uint16_t)i, yb[i] = (uint16_t)((i * 40503u + 12345u) & 0xffff);
  const hfn fs[] = {h_add, h_mul, h_div, h_max, h_sel, h_sqrt, h_f32, h_keep, h_narrow, h_gather, h_gather_keep, h_rowmax};
  const char *names[] = {"add", "mul", "div", "max", "where", "sqrt+recip", "via float32", "keep NaN bits", "cast from float32 bits",
                         "gathered add", "gathered negation", "row max"};
  tg_dtype dts[2] = {TG_FLOAT16, TG_BFLOAT16};
  /* with the host's F16C/AVX-512 conversions, and (x86) without them: the portable vector code */
#if defined(__x86_64__)
  const char *ccs[2] = {NULL, "cc -mno-avx512f -mno-f16c"};
  int ncc = getenv_str("CC", NULL) ? 1 : 2; /* a CC of the user's own is left alone */
#else
  const char *ccs[1] = {NULL};
  int ncc = 1;
#endif
  for (int pass = 0; pass < 2 * ncc; pass++) {
    int d = pass % 2;
    g_half_cc = ccs[pass / 2];
    tg_tensor x = tg_bitcast(tg_from_data(xb, TG_SHAPE(256, 256), TG_OPTS(.dtype = TG_UINT16)), dts[d]);
    tg_tensor y = tg_bitcast(tg_from_data(yb, TG_SHAPE(256, 256), TG_OPTS(.dtype = TG_UINT16)), dts[d]);
    x = tg_contiguous(x), y = tg_contiguous(y);
    CHECK(tg_realize(x) == TG_OK && tg_realize(y) == TG_OK);
    for (size_t k = 0; k < sizeof fs / sizeof *fs; k++) {
      CHECK(half_run(fs[k], x, y, false, o1) && half_run(fs[k], x, y, true, o2));
      /* with the host's conversions, the scalar kernels round arithmetic with F16C too: the
       * portable scalar code (no F16C) is the reference for both */
      bool cross = ncc == 2 && !g_half_cc;
      if (cross) {
        g_half_cc = ccs[1];
        CHECK(half_run(fs[k], x, y, true, o3));
        g_half_cc = NULL;
      }
      bool nan_bits = fs[k] == h_keep || fs[k] == h_narrow || fs[k] == h_gather_keep;
      int first, diff = half_diff(d, o1, o2, nan_bits, &first);
      CHECK_MSG(diff == 0, "%s %s%s%s: %d of 65536 differ from the scalar kernel (first at %d: %04x, scalar %04x)",
                d ? "bfloat16" : "float16", names[k], g_half_cc ? ", CC=" : "", g_half_cc ? g_half_cc : "", diff, first,
                first >= 0 ? o1[first] : 0, first >= 0 ? o2[first] : 0);
      diff = cross ? half_diff(d, o1, o3, nan_bits, &first) : 0;
      CHECK_MSG(diff == 0, "%s %s: %d of 65536 differ from the portable scalar kernel (first at %d: %04x, portable %04x)",
                d ? "bfloat16" : "float16", names[k], diff, first, first >= 0 ? o1[first] : 0, first >= 0 ? o3[first] : 0);
      if (fs[k] == h_keep) {
        int lost = 0;
        for (int i = 0; i < 65536; i++) {
          bool ynan = d ? ((yb[i] & 0x7f80) == 0x7f80 && (yb[i] & 0x7f)) : ((yb[i] & 0x7c00) == 0x7c00 && (yb[i] & 0x3ff));
          if (ynan && o1[i] != yb[i]) lost++;
        }
        CHECK_MSG(lost == 0, "%s: %d NaN bit patterns changed", d ? "bfloat16" : "float16", lost);
      }
    }
    char opts[256];
    last_kernel_opts(h_add(x, y), opts, sizeof opts);
    CHECK_MSG(has_lanes(opts, 0), "%s add: %s", d ? "bfloat16" : "float16", opts);
    last_kernel_opts(h_gather(x, y), opts, sizeof opts);
    CHECK_MSG(has_lanes(opts, 0), "%s gathered add: %s", d ? "bfloat16" : "float16", opts);
  }
  g_half_cc = NULL;
  END;
}

int main(void) {
  int rc = RUN_TESTS();
  tmpdir_remove();
  if (tg_live_count() != 0) {
    fprintf(stderr, "live handles left: %zu\n", tg_live_count());
    rc = 1;
  }
  return rc;
}
