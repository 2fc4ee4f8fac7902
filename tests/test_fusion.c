/*
 * test_fusion.c -- fusion is a feature: how many kernels a computation takes, and how much memory
 * they move, measured with GlobalCounters around one tg_realize. Every test also checks the values
 * against a host computation, so a "fused" kernel that computes the wrong thing fails too.
 *
 * The buffer-reuse test reads the CPU device's caching allocator (an internal header, as
 * test_runtime.c does) to see that dead intermediates are handed back during a schedule.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/runtime/device.h"
#include "test.h"
#include "tinygrad.h"


#define F32 TG_OPTS(.dtype = TG_FLOAT32)

/* Realizes t and returns the number of kernels that took (UINT64_MAX on failure). */
static uint64_t kernels_for(tg_tensor t) {
  tg_global_counters_reset();
  if (tg_realize(t) != TG_OK) {
    fprintf(stderr, "  realize failed: %s\n", tg_last_error() ? tg_last_error() : "?");
    return UINT64_MAX;
  }
  return tg_global_counters().kernel_count;
}

#define CHECK_KERNELS(t, op, n)                                                                              \
  do {                                                                                                       \
    uint64_t tt_k = kernels_for(t);                                                                          \
    CHECK_MSG(tt_k op(n), "%llu kernels, expected " #op " %d", (unsigned long long)tt_k, (int)(n));          \
  } while (0)

/* Deterministic test data in [-1, 1). */
static float *test_data(size_t n, uint32_t seed) {
  float *v = malloc(n * sizeof(float) + 1);
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  return v;
}

/* Compares t (float32) against want[n] with a relative tolerance; reports the first mismatch. */
static void check_close_at(const char *file, int line, tg_tensor t, const double *want, size_t n,
                           double tol) {
  if (tg_numel(t) != (int64_t)n || tg_dtype_of(t) != TG_FLOAT32) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL %s:%d: numel %lld dtype %d, expected %zu float32\n", file, line,
            (long long)tg_numel(t), (int)tg_dtype_of(t), n);
    return;
  }
  float *got = malloc(n * sizeof(float) + 1);
  if (tg_data(t, got, n * sizeof(float)) != TG_OK) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL %s:%d: tg_data: %s\n", file, line, tg_last_error() ? tg_last_error() : "?");
    free(got);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    if (!(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])))) {
      tt_failed_checks++;
      fprintf(stderr, "  FAIL %s:%d: element %zu = %.9g, expected %.9g\n", file, line, i, got[i], want[i]);
      break;
    }
  }
  free(got);
}
#define CHECK_CLOSE_ALL(t, want, n, tol) check_close_at(__FILE__, __LINE__, (t), (want), (n), (tol))

/* ---------------------------------------------------------------------------------------------- */

static void elementwise_then_reduce(int64_t r, int64_t c) {
  BEGIN;
  size_t n = (size_t)(r * c);
  float *v = test_data(n, (uint32_t)(r * 100 + c));
  tg_tensor a = tg_from_data(v, TG_SHAPE(r, c), F32);
  /* ((a + 1) * 2).relu().sum() */
  tg_tensor y = tg_sum(tg_relu(tg_mul_s(tg_add_s(a, 1), 2)), TG_ALL_AXES, false);
  CHECK_KERNELS(y, ==, 1);
  double want = 0;
  for (size_t i = 0; i < n; i++) want += fmax((v[i] + 1.0) * 2.0, 0.0);
  CHECK_CLOSE_ALL(y, &want, 1, 1e-5);
  free(v);
  END;
}

TEST(elementwise_reduce_one_kernel_16x16) { elementwise_then_reduce(16, 16); }
TEST(elementwise_reduce_one_kernel_45x65) { elementwise_then_reduce(45, 65); }

TEST(relu_sum_one_kernel) {
  BEGIN;
  float *v = test_data(1000, 3);
  tg_tensor x = tg_from_data(v, TG_SHAPE(1000), F32);
  tg_tensor y = tg_sum(tg_relu(x), TG_ALL_AXES, false);
  CHECK_KERNELS(y, ==, 1);
  double want = 0;
  for (int i = 0; i < 1000; i++) want += v[i] > 0 ? v[i] : 0;
  CHECK_CLOSE_ALL(y, &want, 1, 1e-5);
  free(v);
  END;
}

TEST(reduce_then_elementwise_one_kernel) {
  BEGIN;
  enum { R = 13, C = 29 };
  float *v = test_data(R * C, 4);
  tg_tensor a = tg_from_data(v, TG_SHAPE(R, C), F32);
  tg_tensor y = tg_add_s(tg_sum(a, TG_AXES(1), false), 1);
  CHECK_KERNELS(y, ==, 1);
  double want[R];
  for (int i = 0; i < R; i++) {
    want[i] = 1;
    for (int j = 0; j < C; j++) want[i] += v[i * C + j];
  }
  CHECK_CLOSE_ALL(y, want, R, 1e-5);
  /* keepdim and a longer elementwise tail still fuse */
  tg_tensor z = tg_exp(tg_mul_s(tg_max(a, TG_AXES(1), true), -0.5));
  CHECK_KERNELS(z, ==, 1);
  for (int i = 0; i < R; i++) {
    double m = -INFINITY;
    for (int j = 0; j < C; j++) m = fmax(m, v[i * C + j]);
    want[i] = exp(-0.5 * m);
  }
  CHECK_CLOSE_ALL(z, want, R, 1e-6);
  free(v);
  END;
}

TEST(reduce_with_epilogue_using_it_twice_one_kernel) {
  BEGIN;
  enum { R = 12, C = 10 };
  float *v = test_data(R * C, 16);
  tg_tensor a = tg_from_data(v, TG_SHAPE(R, C), F32);
  /* relu reads its input twice (0 < s ? s : 0): both uses are in the reduce's own kernel */
  tg_tensor y = tg_relu(tg_sum(a, TG_AXES(1), false));
  CHECK_KERNELS(y, ==, 1);
  double want[R];
  for (int i = 0; i < R; i++) {
    double s = 0;
    for (int j = 0; j < C; j++) s += v[i * C + j];
    want[i] = s > 0 ? s : 0;
  }
  CHECK_CLOSE_ALL(y, want, R, 1e-5);
  /* s * s + s through a reshape */
  tg_tensor s = tg_sum(a, TG_AXES(1), true);
  tg_tensor z = tg_add(tg_mul(s, s), tg_reshape(s, TG_SHAPE(R, 1)));
  tg_tensor z2 = tg_add(tg_reshape(tg_mul(s, s), TG_SHAPE(R)), tg_reshape(s, TG_SHAPE(R)));
  CHECK_KERNELS(z, ==, 1);
  CHECK_KERNELS(z2, ==, 1);
  for (int i = 0; i < R; i++) {
    double t = 0;
    for (int j = 0; j < C; j++) t += v[i * C + j];
    want[i] = t * t + t;
  }
  CHECK_CLOSE_ALL(z, want, R, 1e-5);
  CHECK_CLOSE_ALL(z2, want, R, 1e-5);
  /* a reduce whose result is needed before a second pass over its input is materialized */
  tg_tensor m = tg_max(a, TG_AXES(1), true);
  tg_tensor w = tg_add(tg_reshape(m, TG_SHAPE(R)), tg_sum(tg_sub(a, m), TG_AXES(1), false));
  CHECK_KERNELS(w, ==, 2);
  for (int i = 0; i < R; i++) {
    double mx = -INFINITY, t = 0;
    for (int j = 0; j < C; j++) mx = fmax(mx, v[i * C + j]);
    for (int j = 0; j < C; j++) t += v[i * C + j] - mx;
    want[i] = mx + t;
  }
  CHECK_CLOSE_ALL(w, want, R, 1e-5);
  free(v);
  END;
}

TEST(softmax_at_most_3_kernels) {
  BEGIN;
  enum { R = 7, C = 33 };
  float *v = test_data(R * C, 5);
  tg_tensor a = tg_from_data(v, TG_SHAPE(R, C), F32);
  tg_tensor s = tg_softmax(a, 1);
  CHECK_KERNELS(s, <=, 3);
  double want[R * C];
  for (int i = 0; i < R; i++) {
    double m = -INFINITY, z = 0;
    for (int j = 0; j < C; j++) m = fmax(m, v[i * C + j]);
    for (int j = 0; j < C; j++) z += exp(v[i * C + j] - m);
    for (int j = 0; j < C; j++) want[i * C + j] = exp(v[i * C + j] - m) / z;
  }
  CHECK_CLOSE_ALL(s, want, R * C, 1e-6);
  tg_tensor ls = tg_log_softmax(a, -1);
  CHECK_KERNELS(ls, <=, 3);
  for (int i = 0; i < R * C; i++) want[i] = log(want[i]);
  CHECK_CLOSE_ALL(ls, want, R * C, 1e-5);
  free(v);
  END;
}

TEST(broadcast_matmul_one_kernel_no_big_buffer) {
  BEGIN;
  enum { N = 64, M = 64, K = 64 };
  float *av = test_data(N * K, 6), *bv = test_data(K * M, 7);
  tg_tensor a = tg_from_data(av, TG_SHAPE(N, K), F32);
  tg_tensor b = tg_from_data(bv, TG_SHAPE(K, M), F32);
  /* (a.reshape(N,1,K) * b.T.reshape(1,M,K)).sum(2) */
  tg_tensor prod =
      tg_mul(tg_reshape(a, TG_SHAPE(N, 1, K)), tg_reshape(tg_transpose(b, 0, 1), TG_SHAPE(1, M, K)));
  tg_tensor c = tg_sum(prod, TG_AXES(2), false);
  CHECK_KERNELS(c, ==, 1);
  uint64_t mem = tg_global_counters().global_mem;
  uint64_t cube = (uint64_t)N * M * K * sizeof(float);
  /* inputs + output: 3 * 64*64*4 = 48 KiB; the N*M*K product (1 MiB) must never be materialized */
  CHECK_MSG(mem <= 3ull * N * M * sizeof(float), "global_mem %llu bytes", (unsigned long long)mem);
  CHECK_MSG(mem * 10 < cube, "global_mem %llu vs cube %llu", (unsigned long long)mem,
            (unsigned long long)cube);
  double *want = malloc(sizeof(double) * N * M);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (double)av[i * K + k] * bv[k * M + j];
      want[i * M + j] = s;
    }
  CHECK_CLOSE_ALL(c, want, N * M, 1e-5);
  /* tg_matmul is the same single kernel */
  tg_tensor c2 = tg_matmul(a, b);
  CHECK_KERNELS(c2, ==, 1);
  CHECK_MSG(tg_global_counters().global_mem * 10 < cube, "tg_matmul global_mem %llu",
            (unsigned long long)tg_global_counters().global_mem);
  CHECK_CLOSE_ALL(c2, want, N * M, 1e-5);
  free(want);
  free(av);
  free(bv);
  END;
}

/* An expensive elementwise result feeding a matmul is stored once (2 kernels) instead of being
 * recomputed inside the reduce loop for every output column; a cheap one (relu) stays fused. */
TEST(gelu_into_matmul_materialized_relu_fused) {
  BEGIN;
  enum { N = 128, K = 128, M = 64 };
  float *hv = test_data(N * K, 8), *wv = test_data(M * K, 9);
  tg_tensor h = tg_from_data(hv, TG_SHAPE(N, K), F32);
  tg_tensor w = tg_from_data(wv, TG_SHAPE(M, K), F32); /* (out, in) */
  tg_tensor g = tg_linear(tg_gelu_ex(h, "none"), w, (tg_tensor){0});
  CHECK_KERNELS(g, ==, 2);
  tg_tensor r = tg_linear(tg_relu(h), w, (tg_tensor){0});
  CHECK_KERNELS(r, ==, 1);
  double *wg = malloc(sizeof(double) * N * M), *wr = malloc(sizeof(double) * N * M);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) {
      double sg = 0, sr = 0;
      for (int k = 0; k < K; k++) {
        double x = hv[i * K + k];
        sg += 0.5 * x * (1 + erf(x / sqrt(2.0))) * wv[j * K + k];
        sr += (x > 0 ? x : 0) * wv[j * K + k];
      }
      wg[i * M + j] = sg, wr[i * M + j] = sr;
    }
  CHECK_CLOSE_ALL(g, wg, N * M, 1e-4);
  CHECK_CLOSE_ALL(r, wr, N * M, 1e-5);
  free(wg);
  free(wr);
  free(hv);
  free(wv);
  END;
}

TEST(matmul_2d_one_kernel_odd_shapes) {
  BEGIN;
  enum { N = 5, K = 17, M = 3 };
  float *av = test_data(N * K, 8), *bv = test_data(K * M, 9);
  tg_tensor a = tg_from_data(av, TG_SHAPE(N, K), F32);
  tg_tensor b = tg_from_data(bv, TG_SHAPE(K, M), F32);
  tg_tensor c = tg_matmul(a, b);
  CHECK_KERNELS(c, ==, 1);
  double want[N * M];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (double)av[i * K + k] * bv[k * M + j];
      want[i * M + j] = s;
    }
  CHECK_CLOSE_ALL(c, want, N * M, 1e-5);
  /* matmul followed by an elementwise epilogue (bias + relu) is still one kernel */
  tg_tensor bias = tg_full(TG_SHAPE(M), 0.25, NULL);
  tg_tensor y = tg_relu(tg_add(tg_matmul(a, b), bias));
  CHECK_KERNELS(y, ==, 1);
  for (int i = 0; i < N * M; i++) want[i] = fmax(want[i] + 0.25, 0);
  CHECK_CLOSE_ALL(y, want, N * M, 1e-5);
  free(av);
  free(bv);
  END;
}

TEST(elementwise_chain_on_views_one_kernel) {
  BEGIN;
  enum { R = 6, C = 8 };
  float *v = test_data(R * C, 10);
  float *w = test_data(C * R, 11);
  tg_tensor x = tg_from_data(v, TG_SHAPE(R, C), F32);
  tg_tensor y = tg_from_data(w, TG_SHAPE(C, R), F32);
  tg_tensor yt = tg_permute(y, TG_AXES(1, 0)); /* (R, C) permuted */
  tg_tensor xf = tg_flip(x, TG_AXES(0, 1));    /* flipped */
  tg_tensor xp = tg_pad(tg_shrink(x, TG_SHAPE(1, R, 0, C - 2)), TG_SHAPE(0, 1, 2, 0), 0); /* shrunk+padded */
  /* 10 elementwise ops */
  tg_tensor t = tg_add(yt, xf);                    /* 1 */
  t = tg_mul(t, xp);                               /* 2 */
  t = tg_sub_s(t, 0.5);                            /* 3 */
  t = tg_maximum(t, tg_neg(xf));                   /* 4, 5 */
  t = tg_mul_s(t, 1.5);                            /* 6 */
  t = tg_exp2(t);                                  /* 7 */
  t = tg_add(t, tg_where(tg_gt_s(yt, 0), xp, yt)); /* 8, 9, 10 */
  t = tg_sqrt(tg_add_s(t, 4));                     /* 11, 12 */
  CHECK_KERNELS(t, ==, 1);
  double want[R * C];
  for (int i = 0; i < R; i++)
    for (int j = 0; j < C; j++) {
      double ytv = w[j * R + i];
      double xfv = v[(R - 1 - i) * C + (C - 1 - j)];
      double xpv = (i < R - 1 && j >= 2) ? v[(i + 1) * C + (j - 2)] : 0.0;
      double a = (ytv + xfv) * xpv - 0.5;
      a = fmax(a, -xfv) * 1.5;
      a = exp2(a);
      a += ytv > 0 ? xpv : ytv;
      want[i * C + j] = sqrt(a + 4);
    }
  CHECK_CLOSE_ALL(t, want, R * C, 1e-5);
  free(v);
  free(w);
  END;
}

TEST(more_single_kernel_reductions) {
  BEGIN;
  enum { R = 30, C = 40 };
  float *v = test_data(R * C, 17);
  tg_tensor x = tg_from_data(v, TG_SHAPE(R, C), F32);
  double want[C];
  /* mean = sum * (1/n) */
  tg_tensor m = tg_mean(x, TG_AXES(1), false);
  CHECK_KERNELS(m, ==, 1);
  for (int i = 0; i < R; i++) {
    double t = 0;
    for (int j = 0; j < C; j++) t += v[i * C + j];
    want[i] = t / C;
  }
  CHECK_CLOSE_ALL(m, want, R, 1e-5);
  /* reduce over the leading (strided) axis */
  tg_tensor s0 = tg_sum(x, TG_AXES(0), false);
  CHECK_KERNELS(s0, ==, 1);
  for (int j = 0; j < C; j++) {
    double t = 0;
    for (int i = 0; i < R; i++) t += v[i * C + j];
    want[j] = t;
  }
  CHECK_CLOSE_ALL(s0, want, C, 1e-5);
  /* reduce of a padded input (zero padding and a value) */
  tg_tensor sp = tg_sum(tg_pad(x, TG_SHAPE(1, 2, 3, 4), 0), TG_ALL_AXES, false);
  tg_tensor spv = tg_sum(tg_pad(x, TG_SHAPE(1, 2, 3, 4), 0.5), TG_ALL_AXES, false);
  CHECK_KERNELS(sp, ==, 1);
  CHECK_KERNELS(spv, ==, 1);
  double tot = 0;
  for (int i = 0; i < R * C; i++) tot += v[i];
  double padded = (double)(R + 3) * (C + 7) - (double)R * C;
  CHECK_CLOSE_ALL(sp, &tot, 1, 1e-5);
  double totv = tot + 0.5 * padded;
  CHECK_CLOSE_ALL(spv, &totv, 1, 1e-5);
  /* a half-precision chain with casts at both ends */
  tg_tensor h = tg_cast(tg_mul_s(tg_exp(tg_cast(x, TG_FLOAT16)), 2), TG_FLOAT32);
  CHECK_KERNELS(h, ==, 1);
  double *hw = malloc(sizeof(double) * R * C);
  for (int i = 0; i < R * C; i++) hw[i] = 2 * exp(v[i]);
  CHECK_CLOSE_ALL(h, hw, R * C, 2e-3);
  free(hw);
  /* two independent full reductions added: one fuses into the output kernel, the other is separate */
  tg_tensor two =
      tg_add(tg_sum(tg_add_s(x, 1), TG_ALL_AXES, false), tg_sum(tg_mul_s(x, 2), TG_ALL_AXES, false));
  CHECK_KERNELS(two, <=, 2);
  double tw = (tot + R * C) + 2 * tot;
  CHECK_CLOSE_ALL(two, &tw, 1, 1e-5);
  /* constants fold into their consumer: summing ones needs no input buffer */
  tg_tensor os = tg_sum(tg_ones(TG_SHAPE(10, 10), NULL), TG_ALL_AXES, false);
  CHECK_KERNELS(os, ==, 1);
  CHECK(tg_global_counters().global_mem <= 64);
  double hundred = 100;
  CHECK_CLOSE_ALL(os, &hundred, 1, 0);
  free(v);
  END;
}

TEST(realized_tensor_zero_kernels) {
  BEGIN;
  float *v = test_data(64, 12);
  tg_tensor x = tg_from_data(v, TG_SHAPE(8, 8), F32);
  CHECK_KERNELS(x, ==, 0);
  tg_tensor y = tg_mul_s(x, 2);
  CHECK_KERNELS(y, ==, 1);
  CHECK_KERNELS(y, ==, 0);
  CHECK_KERNELS(tg_permute(y, TG_AXES(1, 0)), ==, 0); /* a view of a realized buffer */
  CHECK_KERNELS(tg_reshape(y, TG_SHAPE(64)), ==, 0);
  double want[64];
  for (int i = 0; i < 64; i++) want[i] = 2.0 * v[i];
  tg_global_counters_reset();
  CHECK_CLOSE_ALL(y, want, 64, 0);
  CHECK(tg_global_counters().kernel_count == 0); /* reading a realized tensor runs nothing */
  free(v);
  END;
}

/* A contiguous() that a kernel computed on the way to another target, and that a handle still
 * holds, becomes that handle's buffer (as in tinygrad): using it again costs no kernel for it. One
 * no handle holds is a dead intermediate (dead_intermediates_reused). */
TEST(contiguous_kept) {
  BEGIN;
  tg_tensor c = tg_contiguous(tg_zeros(TG_SHAPE(20, 30), NULL));
  CHECK_KERNELS(tg_add_s(c, 1), ==, 2);
  CHECK(tg_is_realized(c));
  tg_tensor d = tg_mul_s(c, 2);
  CHECK_KERNELS(d, ==, 1);
  double want[600];
  for (int i = 0; i < 600; i++) want[i] = 0;
  CHECK_CLOSE_ALL(d, want, 600, 0);
  /* an embedding-style weight: zeros_like(...).contiguous(), gathered twice; the second lookup does
   * not compute the weight again */
  float wv[12];
  for (int i = 0; i < 12; i++) wv[i] = (float)i;
  tg_tensor w0 = tg_from_data(wv, TG_SHAPE(4, 3), F32);
  tg_tensor w = tg_contiguous(tg_add(tg_zeros_like(w0, NULL), w0));
  int64_t iv[2] = {3, 1};
  tg_tensor idx = tg_from_data(iv, TG_SHAPE(2), &(tg_opts){.dtype = TG_INT64});
  tg_global_counters_reset();
  CHECK(tg_realize(tg_index(w, idx)) == TG_OK);
  uint64_t first = tg_global_counters().kernel_count;
  CHECK_KERNELS(tg_index(w, idx), ==, 1);
  CHECK_MSG(first == 2, "the first lookup took %llu kernels", (unsigned long long)first);
  double wl[6] = {9, 10, 11, 3, 4, 5};
  CHECK_CLOSE_ALL(tg_index(w, idx), wl, 6, 0);
  /* a gradient still flows through the kept contiguous() */
  tg_tensor x = tg_set_requires_grad(tg_from_data(wv, TG_SHAPE(12), F32), true);
  tg_tensor xc = tg_contiguous(tg_mul_s(x, 3));
  CHECK(tg_realize(tg_add_s(xc, 1)) == TG_OK);
  CHECK(tg_is_realized(xc));
  CHECK(tg_backward(tg_sum(tg_mul(xc, xc), TG_ALL_AXES, false)) == TG_OK);
  double gw[12];
  for (int i = 0; i < 12; i++) gw[i] = 18.0 * wv[i];
  CHECK_CLOSE_ALL(tg_grad(x), gw, 12, 1e-5);
  END;
}

/* Bytes the default device's caching allocator holds right now (idle blocks). */
static size_t cpu_cached_bytes(void) {
  Device *d = device_get(tg_default_device());
  return d ? d->cached_bytes : 0;
}

/* A CONTIGUOUS of an intermediate that is already stored in its order is no kernel: it takes the
 * intermediate's buffer. A copy of a user's buffer stays a copy (writes to the original must not
 * show through). */
TEST(contiguous_of_stored_intermediate_is_no_copy) {
  BEGIN;
  float *v = test_data(24 * 16, 31);
  tg_tensor x = tg_from_data(v, TG_SHAPE(24, 16), F32);
  tg_tensor m = tg_contiguous(tg_add_s(tg_mul_s(x, 2), 1));
  tg_tensor y = tg_contiguous(tg_reshape(m, TG_SHAPE(16, 24)));
  tg_tensor z = tg_add(tg_reshape(y, TG_SHAPE(24, 16)), m); /* both read by one more kernel */
  CHECK_KERNELS(z, ==, 2);
  float got[24 * 16];
  CHECK(tg_data(z, got, sizeof got) == TG_OK);
  for (int i = 0; i < 24 * 16; i++) CHECK_CLOSE(got[i], 2 * (2 * v[i] + 1), 1e-6);
  /* the realized copy (a target) owns that buffer now: it reads back as the values */
  CHECK(tg_data(y, got, sizeof got) == TG_OK);
  for (int i = 0; i < 24 * 16; i++) CHECK_CLOSE(got[i], 2 * v[i] + 1, 1e-6);
  /* a realized user tensor copied: one kernel, and the copy keeps its values when x changes */
  tg_tensor c = tg_contiguous(tg_reshape(tg_permute(x, TG_AXES(1, 0)), TG_SHAPE(16 * 24)));
  CHECK(tg_realize(c) == TG_OK);
  tg_assign(x, tg_zeros_like(x, NULL));
  CHECK(tg_realize(x) == TG_OK);
  float cv[16 * 24];
  CHECK(tg_data(c, cv, sizeof cv) == TG_OK);
  CHECK_CLOSE(cv[1], v[16], 0);
  free(v);
  END;
}

TEST(dead_intermediates_reused) {
  BEGIN;
  /* an unusual size, so no block of it is cached before this test */
  enum { R = 37, C = 48 };
  const size_t S = (size_t)R * C * sizeof(float); /* 7104 bytes: a multiple of the 64-byte block */
  float *v = test_data(R * C, 13);
  tg_tensor x = tg_from_data(v, TG_SHAPE(R, C), F32);
  /* six materialized stages, each read only by the next */
  tg_tensor y = x;
  for (int k = 0; k < 6; k++) {
    tg_tensor f = tg_flip(y, TG_AXES(k % 2));
    tg_tensor next = tg_contiguous(tg_add_s(tg_mul_s(f, 0.5), (double)k));
    /* no handle keeps the earlier stages (a held contiguous() would be kept: see contiguous_kept) */
    if (k > 0) tg_free(y);
    y = next;
  }
  size_t cached0 = cpu_cached_bytes();
  CHECK_KERNELS(y, ==, 6);
  size_t cached1 = cpu_cached_bytes();
  /* dead intermediates went back to the allocator and were taken again by later stages: two blocks
   * ping-pong, so one or two (not five, and not zero) idle blocks of this size remain afterwards */
  CHECK_MSG(cached1 >= cached0 + S && cached1 <= cached0 + 2 * S,
            "cache grew by %zu bytes (%zu blocks of %zu)", cached1 - cached0, (cached1 - cached0) / S, S);
  double want[R * C], cur[R * C];
  for (int i = 0; i < R * C; i++) cur[i] = v[i];
  for (int k = 0; k < 6; k++) {
    for (int i = 0; i < R; i++)
      for (int j = 0; j < C; j++) {
        int si = k % 2 == 0 ? R - 1 - i : i, sj = k % 2 == 1 ? C - 1 - j : j;
        want[i * C + j] = cur[si * C + sj] * 0.5 + k;
      }
    memcpy(cur, want, sizeof cur);
  }
  CHECK_CLOSE_ALL(y, want, R * C, 1e-6);

  /* softmax stages with several materialized reductions, twice in one schedule */
  tg_tensor s1 = tg_sum(x, TG_AXES(1), true);   /* (R, 1) */
  tg_tensor z = tg_softmax(tg_sub(x, s1), 1);   /* (R, C) */
  tg_tensor z2 = tg_softmax(tg_mul_s(z, 3), 0); /* along the other axis */
  CHECK_KERNELS(z2, <=, 6);
  double zz[R * C];
  for (int i = 0; i < R; i++) {
    double s = 0, m = -INFINITY, e = 0;
    for (int j = 0; j < C; j++) s += v[i * C + j];
    for (int j = 0; j < C; j++) m = fmax(m, v[i * C + j] - s);
    for (int j = 0; j < C; j++) e += exp(v[i * C + j] - s - m);
    for (int j = 0; j < C; j++) zz[i * C + j] = exp(v[i * C + j] - s - m) / e * 3;
  }
  for (int j = 0; j < C; j++) {
    double m = -INFINITY, e = 0;
    for (int i = 0; i < R; i++) m = fmax(m, zz[i * C + j]);
    for (int i = 0; i < R; i++) e += exp(zz[i * C + j] - m);
    for (int i = 0; i < R; i++) want[i * C + j] = exp(zz[i * C + j] - m) / e;
  }
  CHECK_CLOSE_ALL(z2, want, R * C, 1e-5);
  free(v);
  END;
}

TEST(reduce_used_twice) {
  BEGIN;
  enum { N = 50 };
  float *v = test_data(N, 14);
  tg_tensor x = tg_from_data(v, TG_SHAPE(N), F32);
  tg_tensor m = tg_max(x, TG_ALL_AXES, false); /* 0-d */
  tg_tensor e = tg_exp(tg_sub(x, m));          /* uses m broadcast */
  tg_tensor y = tg_add(tg_mul(e, m), m);       /* and m again */
  CHECK_KERNELS(y, <=, 2);
  double mx = -INFINITY;
  for (int i = 0; i < N; i++) mx = fmax(mx, v[i]);
  double want[N];
  for (int i = 0; i < N; i++) want[i] = exp(v[i] - mx) * mx + mx;
  CHECK_CLOSE_ALL(y, want, N, 1e-6);
  /* both the reduce and a consumer as realize targets */
  tg_tensor m2 = tg_min(x, TG_ALL_AXES, false);
  tg_tensor d = tg_sub(x, m2);
  tg_global_counters_reset();
  CHECK(tg_realize_many((tg_tensor[]){m2, d}, 2) == TG_OK);
  CHECK_MSG(tg_global_counters().kernel_count <= 2, "%llu kernels",
            (unsigned long long)tg_global_counters().kernel_count);
  double mn = INFINITY;
  for (int i = 0; i < N; i++) mn = fmin(mn, v[i]);
  CHECK_CLOSE_ALL(m2, &mn, 1, 0);
  for (int i = 0; i < N; i++) want[i] = v[i] - mn;
  CHECK_CLOSE_ALL(d, want, N, 1e-6);
  free(v);
  END;
}

TEST(two_reduces_in_sequence) {
  BEGIN;
  enum { R = 9, C = 11 };
  float *v = test_data(R * C, 15);
  tg_tensor x = tg_from_data(v, TG_SHAPE(R, C), F32);
  /* mean of squared deviations: x.mean(1) feeds a second reduction over the same axis */
  tg_tensor mu = tg_mean(x, TG_AXES(1), true);
  tg_tensor d = tg_sub(x, mu);
  tg_tensor var = tg_mean(tg_mul(d, d), TG_AXES(1), false);
  CHECK_KERNELS(var, <=, 2);
  double want[R];
  for (int i = 0; i < R; i++) {
    double s = 0, q = 0;
    for (int j = 0; j < C; j++) s += v[i * C + j];
    s /= C;
    for (int j = 0; j < C; j++) q += (v[i * C + j] - s) * (v[i * C + j] - s);
    want[i] = q / C;
  }
  CHECK_CLOSE_ALL(var, want, R, 1e-5);
  free(v);
  END;
}

/* intermediates computed from a channels-last buffer (max_pool2d's materialized input, the pooled
 * result read by three kernels) are stored channels-last inside the schedule: the values must not
 * notice. Kernels: relu(x), the pooling, the two reductions, the final elementwise. */
TEST(intermediate_stored_in_input_order) {
  BEGIN;
  enum { N = 2, H = 6, W = 6, C = 16 };
  float *v = test_data(N * H * W * C, 16);
  tg_tensor xl = tg_from_data(v, TG_SHAPE(N, H, W, C), F32);
  tg_tensor x = tg_permute(xl, TG_AXES(0, 3, 1, 2)); /* (N, C, H, W) view */
  tg_tensor p = tg_max_pool2d(tg_relu(x), NULL);      /* (N, C, 3, 3) */
  tg_tensor y = tg_add(tg_mul(p, tg_sum(p, TG_ALL_AXES, false)), tg_mean(p, TG_AXES(1), true));
  CHECK_KERNELS(y, <=, 5);
  double pool[N][C][3][3], tot = 0;
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
          double m = 0; /* relu: >= 0 */
          for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) m = fmax(m, v[((n * H + 2 * i + a) * W + 2 * j + b) * C + c]);
          pool[n][c][i][j] = m, tot += m;
        }
  static double want[N * C * 9];
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
          double mc = 0;
          for (int c2 = 0; c2 < C; c2++) mc += pool[n][c2][i][j];
          want[((n * C + c) * 3 + i) * 3 + j] = pool[n][c][i][j] * tot + mc / C;
        }
  CHECK_CLOSE_ALL(y, want, N * C * 9, 1e-5);
  free(v);
  END;
}

/* conv -> relu -> per-channel affine (an evaluation's batchnorm) -> 2x2 max-pool: without a
 * gradient the pool is computed inside the convolution's kernel (its output is never stored), with
 * FUSE_WINDOW=0 it is a kernel of its own; with a gradient in view the input stays materialized.
 * On a GPU device (DEV=CL) it fuses too: one work-item computes a whole window (no race on the
 * combining store). Values agree in all three, and the gradients are finite and agree. */
static tg_tensor conv_pool(tg_tensor x, tg_tensor w, tg_tensor sc) {
  tg_tensor c = tg_relu(tg_conv2d(x, w, (tg_tensor){0}, NULL));
  return tg_max_pool2d(tg_add_s(tg_mul(c, sc), 0.25), NULL);
}

TEST(window_max_fused_into_reduction) {
  BEGIN;
  enum { N = 4, CI = 3, CO = 16, H = 10, KS = 3 }; /* 8x8 conv output, pooled to 4x4 */
  float *xv = test_data(N * CI * H * H, 41), *wv = test_data(CO * CI * KS * KS, 42), *sv = test_data(CO, 43);
  tg_tensor x = tg_from_data(xv, TG_SHAPE(N, CI, H, H), F32);
  tg_tensor w = tg_set_requires_grad(tg_from_data(wv, TG_SHAPE(CO, CI, KS, KS), F32), true);
  tg_tensor sc = tg_reshape(tg_from_data(sv, TG_SHAPE(CO), F32), TG_SHAPE(1, CO, 1, 1));
  CHECK(tg_realize(sc) == TG_OK);
  enum { NO = N * CO * 4 * 4 };
  float fused[NO], plain[NO], grad1[CO * CI * KS * KS], grad2[CO * CI * KS * KS];
  tg_tensor p1 = conv_pool(x, w, sc);
  uint64_t k1 = kernels_for(p1);
  CHECK(tg_data(p1, fused, sizeof fused) == TG_OK);
  tg_context_begin();
  tg_context_set("FUSE_WINDOW", "0");
  tg_tensor p2 = conv_pool(x, tg_mul_s(w, 1.0), sc);
  uint64_t k2 = kernels_for(p2);
  CHECK(tg_data(p2, plain, sizeof plain) == TG_OK);
  tg_context_end();
  CHECK_MSG(k1 + 1 == k2, "%llu kernels fused, %llu not", (unsigned long long)k1, (unsigned long long)k2);
  double want[NO];
  for (int i = 0; i < NO; i++) want[i] = plain[i];
  CHECK_CLOSE_ALL(p1, want, NO, 1e-5);
  /* (p2 keeps its graph, realized, for autograd while it lives: the passes below build the same
   * graph and must compute it again) */
  tg_free(p2);
  /* with a gradient built through the pool, its input keeps a kernel of its own (the gradient
   * compares it with the maximum: both must see the same bits), fusion allowed or not */
  for (int pass = 0; pass < 2; pass++) {
    tg_context_begin();
    if (pass) tg_context_set("FUSE_WINDOW", "0");
    tg_zero_grad(w);
    tg_tensor p = conv_pool(x, pass ? tg_mul_s(w, 1.0) : tg_add_s(w, 0.0), sc);
    CHECK(tg_backward(tg_sum(p, TG_ALL_AXES, false)) == TG_OK);
    CHECK(kernels_for(p) == k2);
    CHECK(tg_data(tg_grad(w), pass ? grad2 : grad1, sizeof grad1) == TG_OK);
    tg_context_end();
  }
  for (int i = 0; i < CO * CI * KS * KS; i++) {
    CHECK(isfinite(grad1[i]));
    CHECK_CLOSE(grad1[i], grad2[i], 1e-4);
  }
  free(xv), free(wv), free(sv);
  END;
}

/* a sum of many elements into few outputs runs as two kernels (partial sums per group, then their
 * sum: tinygrad's split_reduceop), one with SPLIT_REDUCEOP=0; the values agree */
TEST(big_sum_split_in_two_stages) {
  BEGIN;
  enum { R = 256, C = 4 * 1024 };
  float *v = test_data((size_t)R * C, 17);
  tg_tensor x = tg_from_data(v, TG_SHAPE(R, C), F32);
  double tot = 0, col0 = 0;
  for (size_t i = 0; i < (size_t)R * C; i++) tot += v[i];
  for (int r = 0; r < R; r++) col0 += v[(size_t)r * C];
  tg_tensor s = tg_sum(x, TG_ALL_AXES, false);
  CHECK_KERNELS(s, ==, 2);
  CHECK_CLOSE_ALL(s, &tot, 1, 1e-3);
  tg_context_begin();
  tg_context_set("SPLIT_REDUCEOP", "0");
  tg_tensor s1 = tg_sum(tg_mul_s(x, 1.0), TG_ALL_AXES, false);
  CHECK_KERNELS(s1, ==, 1);
  tg_context_end();
  CHECK_CLOSE_ALL(s1, &tot, 1, 1e-3);
  /* many outputs, each of few elements: one kernel, the threads split the outputs */
  tg_tensor rs = tg_sum(x, TG_AXES(1), false);
  CHECK_KERNELS(rs, ==, 1);
  /* a column sum of a large matrix: blocks of rows first (split_columns), then their sum */
  tg_tensor cs = tg_sum(x, TG_AXES(0), false);
  CHECK_KERNELS(cs, ==, 2);
  float c0;
  CHECK(tg_data(tg_shrink(cs, (const int64_t[]){0, 1}, 2), &c0, sizeof c0) == TG_OK);
  CHECK(fabs(c0 - col0) < 1e-3);
  free(v);
  END;
}

/* A sum over the rows of a large matrix whose columns are contiguous sums blocks of 16 rows first,
 * then the partial rows (2048 x 512: 2 kernels); its values and gradient are the plain sum's. It
 * stays one kernel with SPLIT_REDUCEOP=0, for a small matrix, and where the kept axis is not
 * contiguous (a transposed view: its rows are the reduction's contiguous axis). */
TEST(column_sum_split_by_row_blocks) {
  BEGIN;
  enum { R = 2048, C = 512 };
  float *v = test_data((size_t)R * C, 23);
  double *want = calloc(C, sizeof(double));
  for (size_t r = 0; r < R; r++)
    for (size_t c = 0; c < C; c++) want[c] += v[r * C + c];
  tg_tensor x = tg_set_requires_grad(tg_from_data(v, TG_SHAPE(R, C), F32), true);
  tg_tensor s = tg_sum(tg_mul_s(x, 2.0), TG_AXES(0), false);
  CHECK_KERNELS(s, ==, 2);
  double *want2 = malloc(C * sizeof(double));
  for (size_t c = 0; c < C; c++) want2[c] = 2 * want[c];
  CHECK_CLOSE_ALL(s, want2, C, 1e-4);
  /* backward of the two stages: every element's gradient is 2 */
  CHECK(tg_backward(tg_sum(s, TG_ALL_AXES, false)) == TG_OK);
  float g[8];
  CHECK(tg_data(tg_shrink(tg_reshape(tg_grad(x), TG_SHAPE(R * C)), (const int64_t[]){R * C - 8, R * C}, 2), g, sizeof g) == TG_OK);
  for (int i = 0; i < 8; i++) CHECK(g[i] == 2.0f);
  tg_context_begin();
  tg_context_set("SPLIT_REDUCEOP", "0");
  tg_tensor s0 = tg_sum(tg_mul_s(x, 1.0), TG_AXES(0), false);
  CHECK_KERNELS(s0, ==, 1);
  tg_context_end();
  CHECK_CLOSE_ALL(s0, want, C, 1e-4);
  /* the same columns of a quarter of the rows (under 2^20 elements): one kernel */
  tg_tensor small = tg_from_data(v, TG_SHAPE(R / 4, C), F32);
  CHECK_KERNELS(tg_sum(small, TG_AXES(0), false), ==, 1);
  /* x stored transposed, (C, R), viewed as (R, C) again: summed over its rows, it reads along its
   * contiguous axis */
  tg_tensor xt = tg_contiguous(tg_permute(tg_detach(x), TG_AXES(1, 0)));
  CHECK(tg_realize(xt) == TG_OK);
  tg_tensor st = tg_sum(tg_permute(xt, TG_AXES(1, 0)), TG_AXES(0), false);
  CHECK_KERNELS(st, ==, 1);
  CHECK_CLOSE_ALL(st, want, C, 1e-4);
  free(v), free(want), free(want2);
  END;
}

/* A stored channels-first input with 16 or more channels is copied channels-last before a padded
 * 3x3 convolution (its windows then fit L1); with 8 channels it is read in place. Values and
 * gradients against a direct loop, in both forms. */
static void conv_stored_input(int C, uint64_t nkernels) {
  enum { N = 2, H = 6, W = 6, CO = 8 };
  float *v = test_data((size_t)N * C * H * W, 31), *wv = test_data((size_t)CO * C * 9, 37);
  tg_tensor x = tg_set_requires_grad(tg_from_data(v, TG_SHAPE(N, C, H, W), F32), true);
  tg_tensor w = tg_set_requires_grad(tg_from_data(wv, TG_SHAPE(CO, C, 3, 3), F32), true);
  CHECK(tg_realize(x) == TG_OK && tg_realize(w) == TG_OK);
  tg_tensor y = tg_conv2d(x, w, (tg_tensor){0}, TG_CONV2D_OPTS(.padding = {1}, .npadding = 1));
  CHECK_KERNELS(y, ==, nkernels);
  double *want = calloc((size_t)N * CO * H * W, sizeof(double)), *gx = calloc((size_t)N * C * H * W, sizeof(double)),
         *gw = calloc((size_t)CO * C * 9, sizeof(double));
  for (int n = 0; n < N; n++)
    for (int co = 0; co < CO; co++)
      for (int i = 0; i < H; i++)
        for (int j = 0; j < W; j++)
          for (int ci = 0; ci < C; ci++)
            for (int a = 0; a < 3; a++)
              for (int b = 0; b < 3; b++) {
                int yi = i + a - 1, xj = j + b - 1;
                if (yi < 0 || yi >= H || xj < 0 || xj >= W) continue;
                size_t xo = ((size_t)(n * C + ci) * H + yi) * W + xj, wo = ((size_t)(co * C + ci) * 3 + a) * 3 + b;
                want[((size_t)(n * CO + co) * H + i) * W + j] += v[xo] * wv[wo];
                gx[xo] += wv[wo], gw[wo] += v[xo];
              }
  CHECK_CLOSE_ALL(y, want, (size_t)N * CO * H * W, 1e-4);
  CHECK(tg_backward(tg_sum(y, TG_ALL_AXES, false)) == TG_OK);
  CHECK_CLOSE_ALL(tg_grad(x), gx, (size_t)N * C * H * W, 1e-4);
  CHECK_CLOSE_ALL(tg_grad(w), gw, (size_t)CO * C * 9, 1e-4);
  free(v), free(wv), free(want), free(gx), free(gw);
}

TEST(conv_stored_input_channels_last_from_16) {
  BEGIN;
  conv_stored_input(16, 4); /* weight and input copied channels-last, the convolution, its output */
  conv_stored_input(8, 3);  /* the input read in place */
  END;
}

/* A float16 residual stream through layernorms, each layer's output feeding a matmul: the matmul
 * stores its operand widened to float32, and the float16 value itself must be stored too, or every
 * later layer recomputes all the earlier ones (the bytes the kernels move grew with the square of
 * the depth). Here each extra pair of layers moves the same bytes. */
static uint64_t half_stack_bytes(tg_tensor x0, tg_tensor w, int layers) {
  tg_tensor x = x0;
  for (int l = 0; l < layers; l++) x = tg_layernorm(tg_add(x, tg_linear(x, w, (tg_tensor){0})), 1, 1e-5);
  tg_global_counters_reset();
  if (tg_realize(x) != TG_OK) return UINT64_MAX;
  uint64_t b = tg_global_counters().global_mem;
  double v = 0;
  tg_tensor s = tg_sum(tg_cast(tg_mul(x, x), TG_FLOAT32), NULL, 0, false);
  if (tg_item(s, &v) != TG_OK || !(v > 0.9 * 32 * 384 && v < 1.1 * 32 * 384)) return UINT64_MAX; /* rows of unit variance */
  return b;
}

TEST(half_residual_stream_stored_once) {
  BEGIN;
  float *xv = test_data(32 * 384, 21), *wv = test_data(384 * 384, 22);
  for (int i = 0; i < 384 * 384; i++) wv[i] *= 0.05f;
  tg_tensor x0 = tg_contiguous(tg_cast(tg_from_data(xv, TG_SHAPE(32, 384), F32), TG_FLOAT16));
  tg_tensor w = tg_contiguous(tg_cast(tg_from_data(wv, TG_SHAPE(384, 384), F32), TG_FLOAT16));
  CHECK(tg_realize(x0) == TG_OK && tg_realize(w) == TG_OK);
  uint64_t b2 = half_stack_bytes(x0, w, 2), b4 = half_stack_bytes(x0, w, 4), b6 = half_stack_bytes(x0, w, 6);
  CHECK_MSG(b2 != UINT64_MAX && b4 != UINT64_MAX && b6 != UINT64_MAX, "realize or values failed");
  CHECK_MSG(b6 - b4 <= b4 - b2 + (b4 - b2) / 10, "bytes moved: %llu (2 layers), %llu (4), %llu (6)", (unsigned long long)b2,
            (unsigned long long)b4, (unsigned long long)b6);
  free(xv);
  free(wv);
  END;
}

/* tg_matmul_dtype(half, half, float32) of a large product converts its operands to float32 once,
 * outside the product, as tg_matmul of halves does (converting in the inner loop made it 8-10x
 * slower than tg_matmul: 13 against 120 GFLOPS at 1024^3), and equals the float32 product of the
 * widened operands */
TEST(half_matmul_dtype_float32_converts_operands_once) {
  BEGIN;
  for (int d = 0; d < 2; d++) {
    tg_dtype dt = d ? TG_BFLOAT16 : TG_FLOAT16;
    float *av = test_data(256 * 256, 31), *bv = test_data(256 * 256, 32);
    tg_tensor a = tg_contiguous(tg_cast(tg_from_data(av, TG_SHAPE(256, 256), F32), dt));
    tg_tensor b = tg_contiguous(tg_cast(tg_from_data(bv, TG_SHAPE(256, 256), F32), dt));
    CHECK(tg_realize(a) == TG_OK && tg_realize(b) == TG_OK);
    tg_tensor c = tg_matmul_dtype(a, b, TG_FLOAT32);
    tg_tensor r = tg_matmul(tg_cast(a, TG_FLOAT32), tg_cast(b, TG_FLOAT32));
    CHECK(tg_dtype_of(c) == TG_FLOAT32);
    tg_global_counters_reset();
    CHECK(tg_realize(c) == TG_OK);
    /* the conversions and the product: not one kernel converting in its inner loop */
    uint64_t kc = tg_global_counters().kernel_count;
    CHECK_MSG(kc >= 2, "%s: matmul_dtype(float32) ran %llu kernel(s)", tg_dtype_name(dt), (unsigned long long)kc);
    CHECK(tg_realize(r) == TG_OK);
    float *cv = malloc(sizeof(float) * 256 * 256), *rv = malloc(sizeof(float) * 256 * 256);
    CHECK(tg_data(c, cv, sizeof(float) * 256 * 256) == TG_OK && tg_data(r, rv, sizeof(float) * 256 * 256) == TG_OK);
    int differ = 0;
    for (int i = 0; i < 256 * 256; i++) differ += fabsf(cv[i] - rv[i]) > 1e-5f * (1 + fabsf(rv[i]));
    CHECK_MSG(differ == 0, "%s: %d values differ from the float32 product", tg_dtype_name(dt), differ);
    free(av), free(bv), free(cv), free(rv);
  }
  END;
}

/* a wide right-hand matrix is packed into column panels before the product (tg_matmul): values
 * and gradients as the plain product's */
TEST(matmul_wide_packed_values_and_grads) {
  BEGIN;
  enum { N = 5, K = 70, M = 1536 };
  float *av = test_data(N * K, 18), *bv = test_data(K * M, 19);
  tg_tensor a = tg_set_requires_grad(tg_from_data(av, TG_SHAPE(N, K), F32), true);
  tg_tensor b = tg_set_requires_grad(tg_from_data(bv, TG_SHAPE(K, M), F32), true);
  tg_tensor c = tg_matmul(a, b);
  static double want[N * M], ga[N * K], gb[K * M];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) {
      double acc = 0;
      for (int k = 0; k < K; k++) acc += (double)av[i * K + k] * bv[k * M + j];
      want[i * M + j] = acc;
    }
  CHECK(tg_backward(tg_sum(c, TG_ALL_AXES, false)) == TG_OK);
  CHECK_CLOSE_ALL(c, want, N * M, 1e-4);
  for (int i = 0; i < N; i++)
    for (int k = 0; k < K; k++) {
      double acc = 0;
      for (int j = 0; j < M; j++) acc += bv[k * M + j];
      ga[i * K + k] = acc;
    }
  for (int k = 0; k < K; k++)
    for (int j = 0; j < M; j++) {
      double acc = 0;
      for (int i = 0; i < N; i++) acc += av[i * K + k];
      gb[k * M + j] = acc;
    }
  CHECK_CLOSE_ALL(tg_grad(a), ga, N * K, 1e-3);
  CHECK_CLOSE_ALL(tg_grad(b), gb, K * M, 1e-4);
  free(av);
  free(bv);
  END;
}

/* a left-hand matrix over 16 MB is multiplied in row blocks (tg_matmul): sampled values and
 * gradients against the host */
TEST(matmul_row_blocked_values_and_grads) {
  BEGIN;
  enum { N = 2048, K = 2049, M = 1536 };
  float *av = test_data((size_t)N * K, 20), *bv = test_data((size_t)K * M, 21);
  tg_tensor a = tg_set_requires_grad(tg_from_data(av, TG_SHAPE(N, K), F32), true);
  tg_tensor b = tg_from_data(bv, TG_SHAPE(K, M), F32);
  tg_tensor c = tg_matmul(a, b);
  CHECK(tg_backward(tg_sum(c, TG_ALL_AXES, false)) == TG_OK);
  float *cv = malloc(sizeof(float) * (size_t)N * M), *ga = malloc(sizeof(float) * (size_t)N * K);
  CHECK(tg_data(c, cv, sizeof(float) * (size_t)N * M) == TG_OK);
  CHECK(tg_data(tg_grad(a), ga, sizeof(float) * (size_t)N * K) == TG_OK);
  int bad = 0;
  uint32_t s = 7;
  for (int t = 0; t < 300; t++) {
    s = s * 1664525u + 1013904223u;
    int i = (int)(s % N), j = (int)((s >> 12) % M), k = (int)((s >> 7) % K);
    double want = 0, gw = 0;
    for (int q = 0; q < K; q++) want += (double)av[(size_t)i * K + q] * bv[(size_t)q * M + j];
    for (int q = 0; q < M; q++) gw += bv[(size_t)k * M + q];
    if (fabs(cv[(size_t)i * M + j] - want) > 1e-3 * (1 + fabs(want))) bad++;
    if (fabs(ga[(size_t)i * K + k] - gw) > 1e-3 * (1 + fabs(gw))) bad++;
  }
  CHECK_MSG(bad == 0, "%d of 600 sampled values wrong", bad);
  free(cv), free(ga), free(av), free(bv);
  END;
}

/* A matmul whose left-hand rows run across a permute's dims (attention's (batch, heads, tokens,
 * features) output transposed and reshaped to (batch * tokens, heads * features)) copies them into
 * row order first: two kernels, not one matmul kernel that divides and wraps every index of its
 * inner loop. Values and the gradient through the permute, against double sums. A transpose the
 * reshape keeps in order (only the rows' dims permuted) stays one kernel. */
TEST(matmul_scrambled_rows_copied_first) {
  BEGIN;
  enum { B = 2, H = 4, L = 32, D = 16, M = 64 };
  float *av = test_data((size_t)B * H * L * D, 30), *bv = test_data((size_t)H * D * M, 31);
  tg_tensor a = tg_set_requires_grad(tg_from_data(av, TG_SHAPE(B, H, L, D), F32), true);
  tg_tensor b = tg_from_data(bv, TG_SHAPE(H * D, M), F32);
  CHECK(tg_realize(a) == TG_OK && tg_realize(b) == TG_OK);
  tg_tensor x = tg_reshape(tg_transpose(a, 1, 2), TG_SHAPE(B * L, H * D));
  tg_tensor c = tg_matmul(x, b);
  CHECK_KERNELS(c, ==, 2);
  CHECK(tg_backward(tg_sum(tg_mul(c, c), TG_ALL_AXES, false)) == TG_OK);
  float *cv = malloc(sizeof(float) * B * L * M), *ga = malloc(sizeof(float) * B * H * L * D);
  CHECK(tg_data(c, cv, sizeof(float) * B * L * M) == TG_OK);
  CHECK(tg_data(tg_grad(a), ga, sizeof(float) * B * H * L * D) == TG_OK);
  int bad = 0;
  for (int r = 0; r < B * L; r++)
    for (int j = 0; j < M; j++) {
      double want = 0;
      for (int q = 0; q < H * D; q++) want += (double)av[(((size_t)(r / L) * H + q / D) * L + r % L) * D + q % D] * bv[(size_t)q * M + j];
      if (fabs(cv[(size_t)r * M + j] - want) > 1e-4 * (1 + fabs(want))) bad++;
    }
  /* d/da of sum(c^2): 2 c @ b^T, read back through the permute */
  for (int i = 0; i < B * H * L * D; i += 7) {
    int bb = i / (H * L * D), h = i / (L * D) % H, l = i / D % L, d = i % D, r = bb * L + l, q = h * D + d;
    double want = 0;
    for (int j = 0; j < M; j++) want += 2.0 * cv[(size_t)r * M + j] * bv[(size_t)q * M + j];
    if (fabs(ga[i] - want) > 1e-3 * (1 + fabs(want))) bad++;
  }
  CHECK_MSG(bad == 0, "%d values wrong", bad);
  tg_tensor kept = tg_reshape(tg_transpose(a, 0, 1), TG_SHAPE(H * B * L, D));
  CHECK_KERNELS(tg_matmul(kept, tg_reshape(b, TG_SHAPE(D, H * M))), ==, 1);
  free(cv), free(ga), free(av), free(bv);
  END;
}

int main(void) { return RUN_TESTS(); }
