/*
 * test_tensor.c -- the public tensor API through include/tinygrad.h only: handles, scopes and
 * lifetimes, creation (every dtype, blobs, constants, ranges, random numbers), dtype promotion and
 * DEFAULT_FLOAT, a few value checks of each primitive family (the PyTorch differential tests do the
 * exhaustive comparison), realize / devices / assign, reading data out and numpy-style printing,
 * errors (each names the function and the offending shapes or values; the library keeps working
 * afterwards) and Context / GlobalCounters.
 *
 * Every test runs inside BEGIN/END: END closes the test's scope and checks that tg_live_count() is
 * back where it started and that no error was left recorded.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tinygrad.h"
#include "test.h"

/* ---------------------------------------------------------------------------------------------- */
/* helpers                                                                                         */


#define NONE_T ((tg_tensor){0})
#define F32 TG_OPTS(.dtype = TG_FLOAT32)
#define I32 TG_OPTS(.dtype = TG_INT32)

static tg_tensor f32(const float *v, const int64_t *shape, int ndim) {
  return tg_from_data(v, shape, ndim, F32);
}

/* Reads a float32 tensor of at most 4096 elements into out; returns the element count or -1. */
static int64_t readf(tg_tensor t, float *out) {
  int64_t n = tg_numel(t);
  if (n < 0 || n > 4096 || tg_dtype_of(t) != TG_FLOAT32) return -1;
  if (tg_data(t, out, (size_t)n * sizeof(float)) != TG_OK) return -1;
  return n;
}

/* Checks that t (any dtype) holds `n` values close to `want` (converted through float64). */
static double fp8_value(tg_dtype dt, unsigned b);
static void check_values_at(const char *file, int line, tg_tensor t, const double *want, int64_t n,
                            double tol) {
  tg_dtype dt = tg_dtype_of(t);
  int64_t got_n = tg_numel(t);
  if (got_n != n || dt == TG_DTYPE_DEFAULT) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL %s:%d: numel %lld, expected %lld (%s)\n", file, line, (long long)got_n,
            (long long)n, tg_last_error() ? tg_last_error() : "");
    return;
  }
  size_t isz = tg_dtype_itemsize(dt);
  unsigned char *buf = malloc((size_t)n * isz + 1);
  tg_status st = tg_data(t, buf, (size_t)n * isz);
  if (st != TG_OK) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL %s:%d: tg_data failed: %s\n", file, line,
            tg_last_error() ? tg_last_error() : "?");
    free(buf);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    double v = 0;
    unsigned char *p = buf + (size_t)i * isz;
    switch (dt) {
    case TG_BOOL:
      v = *(bool *)p;
      break;
    case TG_INT8:
      v = *(int8_t *)p;
      break;
    case TG_INT16:
      v = *(int16_t *)p;
      break;
    case TG_INT32:
      v = *(int32_t *)p;
      break;
    case TG_INT64:
      v = (double)*(int64_t *)p;
      break;
    case TG_UINT8:
      v = *(uint8_t *)p;
      break;
    case TG_UINT16:
      v = *(uint16_t *)p;
      break;
    case TG_UINT32:
      v = *(uint32_t *)p;
      break;
    case TG_UINT64:
      v = (double)*(uint64_t *)p;
      break;
    case TG_FLOAT32:
      v = *(float *)p;
      break;
    case TG_FLOAT64:
      v = *(double *)p;
      break;
    case TG_FLOAT16: {
      uint16_t h;
      memcpy(&h, p, 2);
      int e = (h >> 10) & 31, m = h & 1023;
      double mag = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
      v = (h & 0x8000) ? -mag : mag;
      break;
    }
    case TG_BFLOAT16: {
      uint16_t h;
      memcpy(&h, p, 2);
      uint32_t b = (uint32_t)h << 16;
      float f;
      memcpy(&f, &b, 4);
      v = f;
      break;
    }
    case TG_FP8E4M3:
    case TG_FP8E5M2:
    case TG_FP8E4M3FNUZ:
    case TG_FP8E5M2FNUZ:
      v = fp8_value(dt, *p);
      break;
    default:
      break;
    }
    double w = want[i];
    bool ok = (isnan(w) && isnan(v)) || v == w || fabs(v - w) <= tol * (1.0 + fabs(w));
    if (!ok) {
      tt_failed_checks++;
      fprintf(stderr, "  FAIL %s:%d: element %lld = %.9g, expected %.9g (%s)\n", file, line, (long long)i, v,
              w, tg_dtype_name(dt));
      break;
    }
  }
  free(buf);
}
#define CHECK_VALUES(t, tol, ...)                                                                            \
  do {                                                                                                       \
    const double tt_w[] = {__VA_ARGS__};                                                                     \
    check_values_at(__FILE__, __LINE__, (t), tt_w, (int64_t)(sizeof tt_w / sizeof tt_w[0]), (tol));          \
  } while (0)

static bool same_shape(tg_tensor t, const int64_t *shape, int ndim) {
  int64_t s[64];
  if (tg_shape(t, s) != ndim) return false;
  return ndim == 0 || memcmp(s, shape, sizeof(int64_t) * (size_t)ndim) == 0;
}
#define CHECK_SHAPE(t, ...) CHECK(same_shape((t), TG_SHAPE(__VA_ARGS__)))

static uint64_t kernels(void) { return tg_global_counters().kernel_count; }

/* float -> IEEE half bits for values exactly representable as normal halves (or zero) */
static uint16_t to_half(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
  if ((b & 0x7fffffff) == 0) return sign;
  int e = (int)((b >> 23) & 255) - 127 + 15;
  return (uint16_t)(sign | (e << 10) | ((b >> 13) & 1023));
}
static uint16_t to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)(b >> 16);
}

/* Stores value v (small integers, exactly representable in every dtype) as dtype dt at p. */
/* fp8 code -> value (OCP e4m3 / e5m2), for the round-trip tests */
/* (the fnuz formats: bias one more, 0x80 their only NaN, no inf) */
static double fp8_value(tg_dtype dt, unsigned b) {
  bool e4 = dt == TG_FP8E4M3 || dt == TG_FP8E4M3FNUZ, fnuz = dt == TG_FP8E4M3FNUZ || dt == TG_FP8E5M2FNUZ;
  if (fnuz && b == 0x80) return NAN;
  int M = e4 ? 3 : 2, B = (e4 ? 7 : 15) + fnuz, e = (int)(b >> M) & ((1 << (7 - M)) - 1), m = (int)b & ((1 << M) - 1);
  double v = e ? ldexp(m | (1 << M), e - B - M) : ldexp(m, 1 - B - M);
  return (b & 0x80) ? -v : v;
}
/* the code of the finite fp8 value nearest to v (the values used here are far from ties and limits) */
static unsigned char fp8_code(tg_dtype dt, double v) {
  unsigned best = 0;
  for (unsigned b = 0; b < 256; b++) {
    bool special = dt == TG_FP8E4M3 ? (b & 0x7f) == 0x7f : dt == TG_FP8E5M2 ? ((b >> 2) & 0x1f) == 0x1f : b == 0x80;
    if (!special && fabs(fp8_value(dt, b) - v) < fabs(fp8_value(dt, best) - v)) best = b;
  }
  return (unsigned char)best;
}

static void store_as(tg_dtype dt, void *p, double v) {
  switch (dt) {
  case TG_FP8E4M3:
  case TG_FP8E5M2:
  case TG_FP8E4M3FNUZ:
  case TG_FP8E5M2FNUZ:
    *(unsigned char *)p = fp8_code(dt, v);
    break;
  case TG_BOOL:
    *(bool *)p = v != 0;
    break;
  case TG_INT8:
    *(int8_t *)p = (int8_t)v;
    break;
  case TG_INT16:
    *(int16_t *)p = (int16_t)v;
    break;
  case TG_INT32:
    *(int32_t *)p = (int32_t)v;
    break;
  case TG_INT64:
    *(int64_t *)p = (int64_t)v;
    break;
  case TG_UINT8:
    *(uint8_t *)p = (uint8_t)v;
    break;
  case TG_UINT16:
    *(uint16_t *)p = (uint16_t)v;
    break;
  case TG_UINT32:
    *(uint32_t *)p = (uint32_t)v;
    break;
  case TG_UINT64:
    *(uint64_t *)p = (uint64_t)v;
    break;
  case TG_FLOAT16:
    *(uint16_t *)p = to_half((float)v);
    break;
  case TG_BFLOAT16:
    *(uint16_t *)p = to_bf16((float)v);
    break;
  case TG_FLOAT32:
    *(float *)p = (float)v;
    break;
  case TG_FLOAT64:
    *(double *)p = v;
    break;
  default:
    break;
  }
}

/* ---------------------------------------------------------------------------------------------- */
/* handles and lifetimes                                                                           */

TEST(scope_end_frees_handles) {
  size_t live0 = tg_live_count();
  tg_clear_error();
  tg_scope_begin();
  tg_tensor a = tg_ones(TG_SHAPE(3), NULL);
  tg_tensor b = tg_add_s(a, 1);
  CHECK(tg_valid(a) && tg_valid(b));
  CHECK(tg_live_count() == live0 + 2);
  tg_scope_end();
  CHECK(tg_live_count() == live0);
  CHECK(!tg_valid(a));
  CHECK(!tg_valid(b));
  CHECK(tg_last_error() == NULL);
}

TEST(nested_scopes_and_keep) {
  BEGIN;
  size_t base = tg_live_count();
  tg_scope_begin(); /* outer */
  tg_tensor outer = tg_full(TG_SHAPE(2), 3.0, NULL);
  tg_scope_begin(); /* inner */
  tg_tensor tmp = tg_add_s(outer, 1);
  tg_tensor kept = tg_keep(tg_mul(tmp, tmp)); /* moves to outer */
  CHECK(kept.id != 0);
  tg_scope_end(); /* inner: frees tmp only */
  CHECK(!tg_valid(tmp));
  CHECK(tg_valid(kept));
  CHECK_VALUES(kept, 0, 16, 16);
  CHECK(tg_live_count() == base + 2);
  tg_scope_end(); /* outer: frees outer and kept */
  CHECK(!tg_valid(kept));
  CHECK(!tg_valid(outer));
  CHECK(tg_live_count() == base);
  /* keep from the outermost open scope moves to the root: it outlives every scope until freed */
  tg_tensor r;
  tg_scope_begin();
  r = tg_keep(tg_ones(TG_SHAPE(1), NULL));
  tg_scope_end();
  CHECK(tg_valid(r));
  CHECK(tg_keep(r).id == r.id); /* already in the test's scope: moves to the root */
  tg_scope_end();               /* the test's scope */
  CHECK(tg_valid(r));
  CHECK(tg_keep(r).id == r.id); /* in the root already: stays there */
  CHECK(tg_valid(r));
  tg_free(r);
  CHECK(!tg_valid(r));
  tg_scope_begin(); /* reopened for END */
  END;
}

TEST(keep_moves_exactly_one_level) {
  BEGIN;
  tg_scope_begin();                                  /* level A */
  tg_scope_begin();                                  /* level B */
  tg_scope_begin();                                  /* level C */
  tg_tensor t = tg_keep(tg_ones(TG_SHAPE(2), NULL)); /* C -> B */
  tg_scope_end();                                    /* C */
  CHECK(tg_valid(t));
  tg_scope_end(); /* B: t dies here */
  CHECK(!tg_valid(t));
  tg_scope_end(); /* A */
  END;
}

TEST(persist_and_free) {
  BEGIN;
  size_t base = tg_live_count();
  tg_tensor p;
  tg_scope_begin();
  tg_scope_begin();
  p = tg_persist(tg_arange(0, 4, 1, NULL));
  tg_scope_end();
  tg_scope_end();
  CHECK(tg_valid(p));
  CHECK(tg_live_count() == base + 1);
  CHECK_VALUES(p, 0, 0, 1, 2, 3);
  tg_free(p);
  CHECK(!tg_valid(p));
  CHECK(tg_live_count() == base);
  tg_free(p);      /* double free of a stale handle: no-op */
  tg_free(NONE_T); /* none: no-op */
  CHECK(tg_live_count() == base);
  END;
}

TEST(stale_handle_errors_name_function) {
  BEGIN;
  tg_tensor a = tg_ones(TG_SHAPE(2), NULL);
  tg_tensor b = tg_ones(TG_SHAPE(2), NULL);
  tg_free(a);
  tg_tensor c = tg_add(a, b);
  CHECK(c.id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_add: stale tensor handle");

  tg_tensor s;
  tg_scope_begin();
  s = tg_ones(TG_SHAPE(2), NULL);
  tg_scope_end();
  CHECK(tg_mul(b, s).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_mul: stale tensor handle");
  CHECK(tg_realize(s) == TG_ERR_HANDLE);
  CHECK_ERR(TG_ERR_HANDLE, "stale");
  float out[2];
  CHECK(tg_data(s, out, sizeof out) == TG_ERR_HANDLE);
  CHECK_ERR(TG_ERR_HANDLE, "tg_data: stale tensor handle");
  CHECK(tg_numel(s) == -1);
  CHECK_ERR(TG_ERR_HANDLE, "tg_numel");
  CHECK(tg_ndim(s) == -1);
  CHECK_ERR(TG_ERR_HANDLE, "tg_ndim");
  CHECK(tg_dtype_of(s) == TG_DTYPE_DEFAULT);
  CHECK_ERR(TG_ERR_HANDLE, "tg_dtype_of");
  CHECK(tg_device_of(s) == NULL);
  CHECK_ERR(TG_ERR_HANDLE, "tg_device_of");
  CHECK(!tg_is_realized(s));
  tg_clear_error();
  CHECK(tg_keep(s).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_keep");
  CHECK(tg_persist(s).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_persist");
  /* a handle whose slot was reused by a new tensor is still stale (generations) */
  tg_tensor fresh = tg_zeros(TG_SHAPE(2), NULL);
  CHECK(fresh.id != s.id);
  CHECK(!tg_valid(s));
  CHECK_VALUES(fresh, 0, 0, 0);
  /* a made-up handle */
  CHECK(tg_neg((tg_tensor){0xdeadbeef12345ull}).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_neg");
  END;
}

TEST(none_propagates_through_chain) {
  BEGIN;
  tg_tensor x = tg_ones(TG_SHAPE(3, 4), NULL);
  tg_tensor y = tg_ones(TG_SHAPE(5), NULL);
  tg_tensor bad = tg_add(x, y); /* first error */
  CHECK(bad.id == 0);
  tg_tensor r = tg_sum(tg_exp(tg_mul_s(tg_relu(bad), 2)), TG_ALL_AXES, false);
  CHECK(r.id == 0);
  CHECK(tg_realize(r) == TG_ERR_HANDLE);
  float out[1];
  CHECK(tg_data(r, out, sizeof out) < 0);
  double d;
  CHECK(tg_item(r, &d) < 0);
  CHECK(tg_to_string(r) == NULL);
  /* the recorded error is still the root cause */
  CHECK_ERR(TG_ERR_INVALID, "tg_add: shapes (3, 4) and (5,) cannot broadcast");
  /* a none operand without an earlier error says so */
  CHECK(tg_neg(NONE_T).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_neg", "none");
  END;
}

TEST(free_temporary_keeps_result) {
  BEGIN;
  const float v[] = {1, 2, 3, 4};
  tg_tensor a = f32(v, TG_SHAPE(4));
  tg_tensor b = tg_add_s(a, 1);
  tg_tensor c = tg_mul(b, a);
  tg_free(a);
  tg_free(b);
  CHECK(!tg_valid(a) && !tg_valid(b));
  CHECK_VALUES(c, 0, 2, 6, 12, 20);
  /* freeing the source of a realized result, and a result of a realized source */
  tg_tensor d = tg_from_data(v, TG_SHAPE(2, 2), F32);
  tg_tensor e = tg_contiguous(tg_transpose(d, 0, 1));
  CHECK(tg_realize(e) == TG_OK);
  tg_free(d);
  CHECK_VALUES(e, 0, 1, 3, 2, 4);
  END;
}

TEST(live_count_exact) {
  BEGIN;
  size_t n0 = tg_live_count();
  tg_tensor a = tg_ones(TG_SHAPE(2), NULL);
  CHECK(tg_live_count() == n0 + 1);
  tg_tensor b = tg_add(a, a);
  CHECK(tg_live_count() == n0 + 2);
  /* failed ops create no handle */
  tg_tensor c = tg_reshape(b, TG_SHAPE(3));
  CHECK(c.id == 0);
  CHECK(tg_live_count() == n0 + 2);
  tg_clear_error();
  /* realize and data do not create handles */
  CHECK(tg_realize(b) == TG_OK);
  CHECK_VALUES(b, 0, 2, 2);
  CHECK(tg_live_count() == n0 + 2);
  tg_free(b);
  CHECK(tg_live_count() == n0 + 1);
  END;
}

/* Handles are created from several threads while another thread uses an existing one: the slot a
 * call is working on must stay where it is while the table grows (it lives in a fixed chunk) */
static void *make_handles(void *arg) {
  (void)arg;
  for (int r = 0; r < 20; r++) {
    tg_scope_begin();
    for (int i = 0; i < 3000; i++) tg_full(NULL, 0, (double)i, NULL);
    tg_scope_end();
  }
  return NULL;
}
TEST(handles_stable_across_threads) {
  BEGIN;
  tg_tensor p = tg_ones(TG_SHAPE(2), NULL);
  pthread_t th[3];
  for (int i = 0; i < 3; i++) CHECK(pthread_create(&th[i], NULL, make_handles, NULL) == 0);
  for (int i = 0; i < 20000; i++) {
    tg_set_requires_grad(p, i % 2 == 0);
    CHECK(tg_requires_grad(p) == (i % 2 == 0));
  }
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  CHECK_VALUES(p, 0, 1, 1);
  END;
}

TEST(scope_end_unbalanced_is_error) {
  size_t live0 = tg_live_count();
  tg_clear_error();
  tg_scope_end(); /* no scope is open in this test */
  CHECK_ERR(TG_ERR_INVALID, "tg_scope_end");
  CHECK(tg_live_count() == live0);
}

/* ---------------------------------------------------------------------------------------------- */
/* creation                                                                                        */

TEST(from_data_every_dtype_round_trip) {
  BEGIN;
  const double vals[6] = {0, 1, 2, 3, 100, 7};
  const double svals[6] = {0, 1, -2, 3, -100, 7};
  for (int d = TG_BOOL; d < TG_DTYPE_COUNT; d++) {
    tg_dtype dt = (tg_dtype)d;
    size_t isz = tg_dtype_itemsize(dt);
    CHECK(isz > 0);
    bool sgn = !tg_dtype_is_unsigned(dt) && dt != TG_BOOL;
    double want[6];
    unsigned char in[6 * 8], out[6 * 8 + 8];
    for (int i = 0; i < 6; i++) {
      want[i] = dt == TG_BOOL ? (vals[i] != 0) : sgn ? svals[i] : vals[i];
      store_as(dt, in + (size_t)i * isz, want[i]);
      if (dt == TG_FP8E4M3 || dt == TG_FP8E5M2 || dt == TG_FP8E4M3FNUZ || dt == TG_FP8E5M2FNUZ)
        want[i] = fp8_value(dt, in[i]); /* e5m2: -100 is -96 */
    }
    tg_tensor t = tg_from_data(in, TG_SHAPE(2, 3), TG_OPTS(.dtype = dt));
    CHECK_MSG(t.id != 0, "%s: %s", tg_dtype_name(dt), tg_last_error());
    CHECK(tg_dtype_of(t) == dt);
    CHECK_SHAPE(t, 2, 3);
    CHECK(tg_is_realized(t));
    memset(out, 0xAB, sizeof out);
    CHECK(tg_data(t, out, 6 * isz) == TG_OK);
    CHECK_MSG(memcmp(in, out, 6 * isz) == 0, "bytes differ for %s", tg_dtype_name(dt));
    CHECK(out[6 * isz] == 0xAB); /* no write past nbytes */
    /* through a generated kernel: a flipped, transposed copy of every dtype */
    tg_tensor f = tg_contiguous(tg_flip(tg_transpose(t, 0, 1), TG_AXES(0)));
    double wf[6];
    for (int r = 0; r < 3; r++)
      for (int c = 0; c < 2; c++) wf[r * 2 + c] = want[c * 3 + (2 - r)];
    check_values_at(__FILE__, __LINE__, f, wf, 6, 0);
    CHECK(tg_dtype_of(f) == dt);
  }
  END;
}

TEST(from_data_zero_size_and_scalar) {
  BEGIN;
  tg_tensor e = tg_from_data(NULL, TG_SHAPE(0, 3), F32);
  CHECK(e.id != 0);
  CHECK(tg_numel(e) == 0);
  CHECK(tg_data(e, NULL, 0) == TG_OK);
  tg_tensor es = tg_sum(e, TG_AXES(0), false);
  CHECK_SHAPE(es, 3);
  CHECK_VALUES(es, 0, 0, 0, 0);
  const int32_t seven = 7;
  tg_tensor s = tg_from_data(&seven, NULL, 0, I32);
  CHECK(tg_ndim(s) == 0);
  CHECK(tg_numel(s) == 1);
  int64_t iv = 0;
  CHECK(tg_item_i64(s, &iv) == TG_OK && iv == 7);
  END;
}

TEST(from_blob_zero_copy) {
  BEGIN;
  float buf[4] = {1, 2, 3, 4};
  tg_tensor t = tg_from_blob(buf, TG_SHAPE(4), F32);
  CHECK(t.id != 0);
  CHECK(tg_is_realized(t));
  tg_tensor y = tg_mul_s(t, 2);
  buf[0] = 10; /* before realize: the kernel reads the caller's memory */
  CHECK_VALUES(y, 0, 20, 4, 6, 8);
  buf[1] = -1; /* the tensor itself always shows the current memory */
  CHECK_VALUES(t, 0, 10, -1, 3, 4);
  /* assign into a blob writes the caller's memory */
  tg_tensor a = tg_assign(t, tg_add_s(tg_full_like(t, 5, NULL), 0.5));
  CHECK(a.id == t.id);
  CHECK(tg_realize(a) == TG_OK);
  CHECK(buf[0] == 5.5f && buf[1] == 5.5f && buf[2] == 5.5f && buf[3] == 5.5f);
  /* assign reading the blob itself */
  CHECK(tg_realize(tg_assign(t, tg_mul(t, t))) == TG_OK);
  CHECK_CLOSE(buf[3], 30.25, 1e-6);
  CHECK_VALUES(t, 1e-6, 30.25, 30.25, 30.25, 30.25);
  tg_tensor n = tg_from_blob(NULL, TG_SHAPE(2), F32);
  CHECK(n.id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_from_blob", "NULL");
  END;
}

TEST(empty_zeros_ones_full_like) {
  BEGIN;
  tg_tensor e = tg_empty(TG_SHAPE(2, 3), TG_OPTS(.dtype = TG_INT16));
  CHECK_SHAPE(e, 2, 3);
  CHECK(tg_dtype_of(e) == TG_INT16);
  CHECK(tg_is_realized(e));
  tg_tensor z = tg_zeros(TG_SHAPE(2, 2), NULL);
  CHECK(!tg_is_realized(z)); /* constants are lazy and cost no buffer until used */
  CHECK(tg_dtype_of(z) == TG_FLOAT32);
  CHECK_VALUES(z, 0, 0, 0, 0, 0);
  tg_tensor o = tg_ones(TG_SHAPE(3), TG_OPTS(.dtype = TG_UINT8));
  CHECK(tg_dtype_of(o) == TG_UINT8);
  CHECK_VALUES(o, 0, 1, 1, 1);
  tg_tensor f = tg_full(TG_SHAPE(2), -2.5, TG_OPTS(.dtype = TG_FLOAT64));
  CHECK_VALUES(f, 0, -2.5, -2.5);
  tg_tensor fi = tg_full(TG_SHAPE(2), 7, I32);
  CHECK_VALUES(fi, 0, 7, 7);
  /* scalars an integer dtype cannot hold compare by value, as in tinygrad (they were wrapped into
   * the dtype: uint8 x < 300 was false for 200, clamp(x, -1, 2) was 2 everywhere) */
  {
    tg_tensor u8 = tg_from_data((const uint8_t[]){0, 1, 2, 200}, TG_SHAPE(4), TG_OPTS(.dtype = TG_UINT8));
    CHECK_VALUES(tg_lt_s(u8, 300), 0, 1, 1, 1, 1);
    CHECK_VALUES(tg_gt_s(u8, -1), 0, 1, 1, 1, 1);
    CHECK_VALUES(tg_gt_s(u8, 256), 0, 0, 0, 0, 0);
    CHECK_VALUES(tg_eq_s(u8, 256), 0, 0, 0, 0, 0);
    CHECK_VALUES(tg_ne_s(u8, -256), 0, 1, 1, 1, 1);
    CHECK_VALUES(tg_clamp(u8, -1, 2), 0, 0, 1, 2, 2);
    CHECK_VALUES(tg_hardtanh(u8, -1, 1), 0, 0, 1, 1, 1);
    CHECK_VALUES(tg_maximum_s(u8, -1), 0, 0, 1, 2, 200);
    CHECK_VALUES(tg_minimum_s(u8, 1000), 0, 0, 1, 2, 200);
    tg_tensor cf = tg_clamp(u8, -1.0, 1.5); /* a fractional bound clamps as floats */
    CHECK(tg_dtype_is_float(tg_dtype_of(cf)));
    CHECK_VALUES(cf, 0, 0, 1, 1.5, 1.5);
    tg_tensor i8 = tg_from_data((const int8_t[]){-128, 0, 127}, TG_SHAPE(3), TG_OPTS(.dtype = TG_INT8));
    CHECK_VALUES(tg_clamp(i8, -200, 300), 0, -128, 0, 127);
    CHECK_VALUES(tg_clamp(i8, -5, 300), 0, -5, 0, 127);
  }
  /* the 64-bit limits: 2^63 (int64) and 2^64 (uint64) are above the dtype (as doubles INT64_MAX and
   * UINT64_MAX round up to them, and the scalar was taken for the maximum); an integer scalar the
   * result must hold wraps modulo 2^64, as tinygrad's constants (x + 2^63 adds INT64_MIN) */
  {
    const int64_t xd[3] = {INT64_MAX, INT64_MIN, 0};
    const uint64_t ud[4] = {UINT64_MAX, (uint64_t)1 << 63, 5, 0};
    tg_tensor x = tg_from_data(xd, TG_SHAPE(3), TG_OPTS(.dtype = TG_INT64));
    tg_tensor u = tg_from_data(ud, TG_SHAPE(4), TG_OPTS(.dtype = TG_UINT64));
    bool b[4] = {0};
    int64_t r[3] = {0};
    uint64_t q[4] = {0};
    CHECK(tg_data(tg_lt_s(x, 9223372036854775808.0), b, 3) == TG_OK && b[0] && b[1] && b[2]);
    CHECK(tg_data(tg_eq_s(x, 9223372036854775808.0), b, 3) == TG_OK && !b[0] && !b[1] && !b[2]);
    CHECK(tg_data(tg_add_s(x, 9223372036854775808.0), r, sizeof r) == TG_OK && r[0] == -1 && r[1] == 0 && r[2] == INT64_MIN);
    CHECK(tg_data(tg_lt_s(u, 18446744073709551616.0), b, 4) == TG_OK && b[0] && b[1] && b[2] && b[3]);
    CHECK(tg_data(tg_clamp(u, 0, 18446744073709551616.0), q, sizeof q) == TG_OK && !memcmp(q, ud, sizeof q));
    CHECK(tg_data(tg_minimum_s(u, 18446744073709551616.0), q, sizeof q) == TG_OK && !memcmp(q, ud, sizeof q));
    /* uint32 + (2^32 + 5) adds 5; the double 1e30 is a multiple of 2^32 (its low bits are zeros),
     * so uint32 + 1e30 adds 0 (it saturated to x - 1) */
    tg_tensor u32 = tg_from_data((const uint32_t[]){7}, TG_SHAPE(1), TG_OPTS(.dtype = TG_UINT32));
    uint32_t w = 0;
    CHECK(tg_data(tg_add_s(u32, 4294967301.0), &w, sizeof w) == TG_OK && w == 12u);
    CHECK(tg_data(tg_add_s(u32, 1e30), &w, sizeof w) == TG_OK && w == 7u);
  }
  /* an integer fill the dtype cannot hold at all is an error (PyTorch's too); in-range ones wrap */
  CHECK(!tg_valid(tg_full(TG_SHAPE(2), NAN, I32)));
  CHECK_ERR(TG_ERR_INVALID, "tg_full", "nan", "int");
  CHECK(!tg_valid(tg_full_like(fi, -INFINITY, NULL)));
  CHECK_ERR(TG_ERR_INVALID, "tg_full_like", "-inf");
  CHECK(!tg_valid(tg_full(TG_SHAPE(2), 1e20, TG_OPTS(.dtype = TG_UINT64))));
  CHECK_ERR(TG_ERR_INVALID, "tg_full", "1e+20");
  CHECK_VALUES(tg_full(TG_SHAPE(1), 300, TG_OPTS(.dtype = TG_UINT8)), 0, 44);
  CHECK_VALUES(tg_full(TG_SHAPE(1), NAN, TG_OPTS(.dtype = TG_FLOAT32)), 0, NAN);
  tg_tensor fs = tg_full(NULL, 0, 4.0, NULL);
  CHECK(tg_ndim(fs) == 0);
  CHECK_VALUES(fs, 0, 4);
  /* _like: shape, dtype and device of the model unless opts override */
  tg_tensor base = tg_empty(TG_SHAPE(2, 1, 3), TG_OPTS(.dtype = TG_INT64, .device = "CPU:1"));
  tg_tensor zl = tg_zeros_like(base, NULL);
  CHECK_SHAPE(zl, 2, 1, 3);
  CHECK(tg_dtype_of(zl) == TG_INT64);
  CHECK(strcmp(tg_device_of(zl), "CPU:1") == 0);
  CHECK_VALUES(zl, 0, 0, 0, 0, 0, 0, 0);
  tg_tensor ol = tg_ones_like(base, TG_OPTS(.dtype = TG_FLOAT16));
  CHECK(tg_dtype_of(ol) == TG_FLOAT16);
  CHECK_VALUES(ol, 0, 1, 1, 1, 1, 1, 1);
  tg_tensor fl = tg_full_like(base, 9, TG_OPTS(.device = "CPU"));
  CHECK(strcmp(tg_device_of(fl), "CPU") == 0);
  CHECK(tg_dtype_of(fl) == TG_INT64);
  CHECK_VALUES(fl, 0, 9, 9, 9, 9, 9, 9);
  tg_tensor el = tg_empty_like(base, NULL);
  CHECK_SHAPE(el, 2, 1, 3);
  CHECK(tg_dtype_of(el) == TG_INT64);
  CHECK(tg_is_realized(z)); /* reading it realized it */
  /* requires_grad is accepted */
  tg_tensor g = tg_ones(TG_SHAPE(2), TG_OPTS(.requires_grad = true));
  CHECK(g.id != 0);
  END;
}

TEST(eye_arange_linspace_scalar) {
  BEGIN;
  tg_tensor e = tg_eye(3, 3, NULL);
  CHECK_SHAPE(e, 3, 3);
  CHECK_VALUES(e, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1);
  tg_tensor e0 = tg_eye(3, 0, NULL); /* zero columns is a legal size */
  CHECK_SHAPE(e0, 3, 0);
  tg_tensor e2 = tg_eye(2, 4, I32);
  CHECK_SHAPE(e2, 2, 4);
  CHECK(tg_dtype_of(e2) == TG_INT32);
  CHECK_VALUES(e2, 0, 1, 0, 0, 0, 0, 1, 0, 0);

  tg_tensor a = tg_arange(0, 5, 1, NULL);
  CHECK(tg_dtype_of(a) == TG_INT32);
  CHECK_VALUES(a, 0, 0, 1, 2, 3, 4);
  tg_tensor ad = tg_arange(5, 0, -2, NULL);
  CHECK_VALUES(ad, 0, 5, 3, 1);
  tg_tensor af = tg_arange(0, 1, 0.25, NULL);
  CHECK(tg_dtype_of(af) == TG_FLOAT32);
  CHECK_VALUES(af, 0, 0, 0.25, 0.5, 0.75);
  tg_tensor af2 = tg_arange(-1.5, 1, 1, NULL);
  CHECK(tg_dtype_of(af2) == TG_FLOAT32);
  CHECK_VALUES(af2, 0, -1.5, -0.5, 0.5);
  tg_tensor a64 = tg_arange(0, 3, 1, TG_OPTS(.dtype = TG_INT64));
  CHECK(tg_dtype_of(a64) == TG_INT64);
  CHECK_VALUES(a64, 0, 0, 1, 2);
  tg_tensor a0 = tg_arange(3, 3, 1, NULL);
  CHECK(tg_numel(a0) == 0);
  /* an integer arange is computed where it is read: summing a million of them (a split reduction:
   * partials, then their sum) moves about a kilobyte, not the 8 MB a stored arange would be; on
   * another device too, and at the edges of a small dtype */
  tg_tensor big = tg_arange(-3, 2999997, 3, TG_OPTS(.dtype = TG_INT64));
  tg_global_counters_reset();
  tg_tensor bs = tg_sum(big, TG_ALL_AXES, false);
  CHECK(tg_realize(bs) == TG_OK);
  CHECK(tg_global_counters().kernel_count <= 2);
  CHECK_MSG(tg_global_counters().global_mem <= 4096, "%llu bytes moved", (unsigned long long)tg_global_counters().global_mem);
  int64_t sv = 0;
  CHECK(tg_item_i64(bs, &sv) == TG_OK && sv == 3 * (999999LL * 1000000 / 2) - 3 * 1000000);
  tg_tensor a1 = tg_arange(0, 4, 1, TG_OPTS(.device = "CPU:1"));
  CHECK_VALUES(a1, 0, 0, 1, 2, 3);
  CHECK_VALUES(tg_to(a1, "CPU"), 0, 0, 1, 2, 3);
  tg_tensor u8 = tg_arange(250, 256, 2, TG_OPTS(.dtype = TG_UINT8));
  CHECK_VALUES(u8, 0, 250, 252, 254);
  tg_tensor i8 = tg_arange(-128, 128, 85, TG_OPTS(.dtype = TG_INT8));
  CHECK_VALUES(i8, 0, -128, -43, 42, 127);
  tg_tensor ud = tg_arange(10, 0, -3, TG_OPTS(.dtype = TG_UINT8)); /* a negative step in an unsigned dtype */
  CHECK_VALUES(ud, 0, 10, 7, 4, 1);
  tg_tensor u32 = tg_arange(4000000000.0, 4000000020.0, 9, TG_OPTS(.dtype = TG_UINT32));
  CHECK_VALUES(u32, 0, 4000000000.0, 4000000009.0, 4000000018.0);
  CHECK(tg_arange(0, 1, 0, NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_arange", "step");

  tg_tensor l = tg_linspace(0, 1, 5, NULL);
  CHECK(tg_dtype_of(l) == TG_FLOAT32);
  CHECK_VALUES(l, 1e-7, 0, 0.25, 0.5, 0.75, 1);
  tg_tensor l1 = tg_linspace(3, 9, 1, NULL);
  CHECK_VALUES(l1, 0, 3);
  tg_tensor ln = tg_linspace(2, -2, 3, TG_OPTS(.dtype = TG_FLOAT64));
  CHECK_VALUES(ln, 0, 2, 0, -2);
  CHECK(tg_linspace(0, 1, -1, NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_linspace", "-1");

  tg_tensor s = tg_scalar(3.5, NULL);
  CHECK(tg_ndim(s) == 0);
  CHECK(tg_dtype_of(s) == TG_FLOAT32);
  double d = 0;
  CHECK(tg_item(s, &d) == TG_OK && d == 3.5);
  tg_tensor si = tg_scalar(-3, TG_OPTS(.dtype = TG_INT8));
  int64_t i = 0;
  CHECK(tg_item_i64(si, &i) == TG_OK && i == -3);
  END;
}

static void stats(const float *v, int n, double *mean, double *sd, double *lo, double *hi) {
  double s = 0, s2 = 0;
  *lo = INFINITY, *hi = -INFINITY;
  for (int i = 0; i < n; i++) {
    s += v[i];
    if (v[i] < *lo) *lo = v[i];
    if (v[i] > *hi) *hi = v[i];
  }
  *mean = s / n;
  for (int i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
  *sd = sqrt(s2 / n);
}

TEST(random_distributions) {
  BEGIN;
  enum { N = 4096 };
  static float v[N];
  double mean, sd, lo, hi;
  tg_manual_seed(1234);
  tg_tensor r = tg_rand(TG_SHAPE(64, 64), NULL);
  CHECK_SHAPE(r, 64, 64);
  CHECK(tg_dtype_of(r) == TG_FLOAT32);
  CHECK(readf(r, v) == N);
  stats(v, N, &mean, &sd, &lo, &hi);
  CHECK(lo >= 0 && hi < 1);
  CHECK_MSG(fabs(mean - 0.5) < 0.02, "rand mean %g", mean);
  CHECK_MSG(fabs(sd - 0.288675) < 0.02, "rand std %g", sd);

  tg_tensor n = tg_randn(TG_SHAPE(N), NULL);
  CHECK(readf(n, v) == N);
  stats(v, N, &mean, &sd, &lo, &hi);
  CHECK_MSG(fabs(mean) < 0.06, "randn mean %g", mean);
  CHECK_MSG(fabs(sd - 1) < 0.06, "randn std %g", sd);
  CHECK(lo < -2 && hi > 2 && lo > -6 && hi < 6);
  for (int i = 0; i < N; i++) CHECK(isfinite(v[i]));

  tg_tensor u = tg_uniform(TG_SHAPE(N), -2, 3, NULL);
  CHECK(readf(u, v) == N);
  stats(v, N, &mean, &sd, &lo, &hi);
  CHECK(lo >= -2 && hi < 3);
  CHECK_MSG(fabs(mean - 0.5) < 0.1, "uniform mean %g", mean);

  tg_tensor no = tg_normal(TG_SHAPE(N), 5, 2, NULL);
  CHECK(readf(no, v) == N);
  stats(v, N, &mean, &sd, &lo, &hi);
  CHECK_MSG(fabs(mean - 5) < 0.12, "normal mean %g", mean);
  CHECK_MSG(fabs(sd - 2) < 0.12, "normal std %g", sd);

  tg_tensor ri = tg_randint(TG_SHAPE(N), -3, 7, NULL);
  CHECK(tg_dtype_of(ri) == TG_INT32);
  static int32_t iv[N];
  CHECK(tg_data(ri, iv, sizeof iv) == TG_OK);
  int seen[10] = {0};
  bool inrange = true;
  for (int i = 0; i < N; i++) {
    if (iv[i] < -3 || iv[i] >= 7)
      inrange = false;
    else
      seen[iv[i] + 3]++;
  }
  CHECK(inrange);
  for (int i = 0; i < 10; i++) CHECK_MSG(seen[i] > N / 10 / 2, "value %d seen %d times", i - 3, seen[i]);

  tg_tensor rh = tg_rand(TG_SHAPE(100), TG_OPTS(.dtype = TG_FLOAT16));
  CHECK(tg_dtype_of(rh) == TG_FLOAT16);
  tg_tensor rh_ok =
      tg_sum(tg_bitwise_and(tg_ge(rh, tg_zeros_like(rh, NULL)), tg_lt_s(rh, 1)), TG_ALL_AXES, false);
  CHECK_VALUES(rh_ok, 0, 100);
  /* every low-precision float stays below 1 (rounded to fp8's 2 or 3 mantissa bits, a float32 value
   * just below 1 would become 1), and the draws cover the dtype's grid below 1 */
  static const tg_dtype low[] = {TG_BFLOAT16, TG_FP8E4M3, TG_FP8E5M2};
  for (size_t q = 0; q < sizeof low / sizeof low[0]; q++) {
    tg_tensor r8 = tg_cast(tg_rand(TG_SHAPE(4096), TG_OPTS(.dtype = low[q])), TG_FLOAT32);
    float v8[4096];
    CHECK(tg_data(r8, v8, sizeof v8) == TG_OK);
    float mx = 0, mn = 1;
    for (int i = 0; i < 4096; i++) mx = v8[i] > mx ? v8[i] : mx, mn = v8[i] < mn ? v8[i] : mn;
    CHECK_MSG(mn >= 0 && mx < 1 && mx >= 0.7f, "%s: draws in [%g, %g]", tg_dtype_name(low[q]), mn, mx);
  }
  /* non-float dtypes are rejected */
  CHECK(tg_rand(TG_SHAPE(2), I32).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_rand", "int");
  CHECK(tg_randint(TG_SHAPE(2), 5, 5, NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_randint", "low=5", "high=5");
  /* uniform needs low < high, normal std >= 0 (tinygrad's ValueErrors; uniform(2, 1) drew from (1, 2]) */
  CHECK(!tg_valid(tg_uniform(TG_SHAPE(2), 2, 1, NULL)));
  CHECK_ERR(TG_ERR_INVALID, "tg_uniform", "low=2", "high=1");
  CHECK(!tg_valid(tg_uniform(TG_SHAPE(2), 0, NAN, NULL)));
  CHECK_ERR(TG_ERR_INVALID, "tg_uniform");
  CHECK(!tg_valid(tg_normal(TG_SHAPE(2), 0, -1, NULL)));
  CHECK_ERR(TG_ERR_INVALID, "tg_normal", "std=-1");
  CHECK(tg_valid(tg_normal(TG_SHAPE(2), 0, 0, NULL))); /* std 0: the mean */
  /* float64 draws have 53 random bits (they had float32's 23: every value on the 2^-23 grid) */
  {
    tg_tensor r64 = tg_rand(TG_SHAPE(1000), TG_OPTS(.dtype = TG_FLOAT64));
    double d[1000];
    CHECK(tg_data(r64, d, sizeof d) == TG_OK);
    int off = 0, in01 = 1;
    for (int i = 0; i < 1000; i++) off += ldexp(d[i], 23) != floor(ldexp(d[i], 23)), in01 &= d[i] >= 0 && d[i] < 1;
    CHECK_MSG(off > 990 && in01, "%d of 1000 off the 2^-23 grid", off);
    tg_tensor u64 = tg_uniform(TG_SHAPE(1000), -3, 5, TG_OPTS(.dtype = TG_FLOAT64));
    CHECK(tg_data(u64, d, sizeof d) == TG_OK);
    double lo = 9, hi = -9;
    for (int i = 0; i < 1000; i++) lo = fmin(lo, d[i]), hi = fmax(hi, d[i]);
    CHECK(lo >= -3 && lo < -2.9 && hi < 5 && hi > 4.9);
  }
  /* a tensor of more than 2^32 elements does not repeat with period 2^32 (computed lazily: only the
   * two windows compared are drawn) */
  {
    const int64_t big = ((int64_t)1 << 32) + 64;
    tg_tensor r = tg_rand(&big, 1, NULL);
    float a[16], b[16];
    CHECK(tg_data(tg_shrink(r, TG_SHAPE(8, 24)), a, sizeof a) == TG_OK);
    CHECK(tg_data(tg_shrink(r, TG_SHAPE(((int64_t)1 << 32) + 8, ((int64_t)1 << 32) + 24)), b, sizeof b) == TG_OK);
    int same = 0;
    for (int i = 0; i < 16; i++) same += a[i] == b[i];
    CHECK_MSG(same == 0, "%d of 16 repeat at 2^32", same);
  }
  END;
}

/* randn takes both uniforms of a Box-Muller pair from the two output words of one threefry call:
 * the normals must still be independent and normal. 2^18 of them: mean and standard deviation
 * within 5 standard errors, the mass within 1 and 2 sigma, the third and fourth moments, and no
 * correlation between neighbours or between a number and the one half the tensor away. */
TEST(randn_from_one_call_is_normal) {
  BEGIN;
  enum { N = 1 << 18 };
  static float v[N];
  tg_manual_seed(77);
  tg_tensor t = tg_randn(TG_SHAPE(N), NULL);
  CHECK(tg_data(t, v, sizeof v) == TG_OK);
  tg_free(t);
  double m = 0, m2 = 0, m3 = 0, m4 = 0, in1 = 0, in2 = 0, c1 = 0, ch = 0;
  for (int i = 0; i < N; i++) m += v[i];
  m /= N;
  for (int i = 0; i < N; i++) {
    double z = v[i];
    m2 += z * z, m3 += z * z * z, m4 += z * z * z * z;
    in1 += fabs(z) < 1, in2 += fabs(z) < 2;
    c1 += z * v[(i + 1) % N], ch += z * v[(i + N / 2) % N];
  }
  m2 /= N, m3 /= N, m4 /= N, in1 /= N, in2 /= N, c1 /= N, ch /= N;
  double se = 1 / sqrt((double)N); /* 0.002 */
  CHECK_MSG(fabs(m) < 5 * se, "mean %g", m);
  CHECK_MSG(fabs(sqrt(m2) - 1) < 5 * se, "std %g", sqrt(m2));
  CHECK_MSG(fabs(in1 - 0.682689) < 0.005 && fabs(in2 - 0.954500) < 0.003, "mass within 1 and 2 sigma %g %g", in1, in2);
  CHECK_MSG(fabs(m3) < 0.03 && fabs(m4 - 3) < 0.08, "skew %g, kurtosis %g", m3, m4);
  CHECK_MSG(fabs(c1) < 5 * se && fabs(ch) < 5 * se, "correlations %g (neighbours) %g (half apart)", c1, ch);
  END;
}

TEST(random_seed_reproducible) {
  BEGIN;
  float a[256], b[256], c[256], d[256];
  tg_manual_seed(42);
  tg_tensor r1 = tg_rand(TG_SHAPE(256), NULL);
  tg_tensor r2 = tg_rand(TG_SHAPE(256), NULL);
  CHECK(readf(r1, a) == 256);
  CHECK(readf(r2, b) == 256);
  CHECK(memcmp(a, b, sizeof a) != 0); /* two calls differ */
  tg_manual_seed(42);
  tg_tensor r3 = tg_rand(TG_SHAPE(256), NULL);
  tg_tensor r4 = tg_rand(TG_SHAPE(256), NULL);
  CHECK(readf(r3, c) == 256);
  CHECK(readf(r4, d) == 256);
  CHECK(memcmp(a, c, sizeof a) == 0); /* same seed, same bytes */
  CHECK(memcmp(b, d, sizeof b) == 0);
  tg_manual_seed(43);
  tg_tensor r5 = tg_rand(TG_SHAPE(256), NULL);
  CHECK(readf(r5, c) == 256);
  CHECK(memcmp(a, c, sizeof a) != 0); /* another seed differs */
  /* on another device too */
  tg_manual_seed(42);
  tg_tensor r6 = tg_rand(TG_SHAPE(256), TG_OPTS(.device = "CPU:1"));
  CHECK(readf(r6, c) == 256);
  CHECK(memcmp(a, c, sizeof a) == 0);
  /* randn reproducible */
  tg_manual_seed(7);
  CHECK(readf(tg_randn(TG_SHAPE(64), NULL), a) == 64);
  tg_manual_seed(7);
  CHECK(readf(tg_randn(TG_SHAPE(64), NULL), b) == 64);
  CHECK(memcmp(a, b, 64 * sizeof(float)) == 0);
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* dtypes                                                                                          */

TEST(dtype_promote) {
  BEGIN;
  CHECK(tg_dtype_promote(TG_INT32, TG_INT32) == TG_INT32);
  CHECK(tg_dtype_promote(TG_BOOL, TG_INT8) == TG_INT8);
  CHECK(tg_dtype_promote(TG_BOOL, TG_FLOAT16) == TG_FLOAT16);
  CHECK(tg_dtype_promote(TG_INT8, TG_UINT8) == TG_INT16);
  CHECK(tg_dtype_promote(TG_UINT8, TG_INT16) == TG_INT16);
  CHECK(tg_dtype_promote(TG_UINT16, TG_INT16) == TG_INT32);
  CHECK(tg_dtype_promote(TG_INT32, TG_UINT32) == TG_INT64);
  CHECK(tg_dtype_promote(TG_UINT8, TG_UINT32) == TG_UINT32);
  CHECK(tg_dtype_promote(TG_INT64, TG_FLOAT16) == TG_FLOAT16);
  CHECK(tg_dtype_promote(TG_INT32, TG_FLOAT32) == TG_FLOAT32);
  CHECK(tg_dtype_promote(TG_FLOAT16, TG_BFLOAT16) == TG_FLOAT32);
  CHECK(tg_dtype_promote(TG_FLOAT16, TG_FLOAT32) == TG_FLOAT32);
  CHECK(tg_dtype_promote(TG_FLOAT32, TG_FLOAT64) == TG_FLOAT64);
  CHECK(tg_dtype_promote(TG_UINT64, TG_FLOAT64) == TG_FLOAT64);
  CHECK(tg_dtype_promote(TG_BFLOAT16, TG_INT8) == TG_BFLOAT16);
  /* symmetric over every pair */
  bool sym = true;
  for (int a = TG_BOOL; a < TG_DTYPE_COUNT; a++)
    for (int b = TG_BOOL; b < TG_DTYPE_COUNT; b++)
      sym = sym && tg_dtype_promote((tg_dtype)a, (tg_dtype)b) == tg_dtype_promote((tg_dtype)b, (tg_dtype)a);
  CHECK(sym);
  CHECK(tg_dtype_promote((tg_dtype)99, TG_INT8) == TG_DTYPE_DEFAULT);
  CHECK_ERR(TG_ERR_INVALID, "tg_dtype_promote", "99");
  /* promotion applies to ops */
  tg_tensor a = tg_ones(TG_SHAPE(2), TG_OPTS(.dtype = TG_INT8));
  tg_tensor b = tg_ones(TG_SHAPE(2), TG_OPTS(.dtype = TG_UINT8));
  tg_tensor c = tg_add(a, b);
  CHECK(tg_dtype_of(c) == TG_INT16);
  CHECK_VALUES(c, 0, 2, 2);
  CHECK(tg_dtype_of(tg_div(a, b)) == TG_FLOAT32);
  CHECK(tg_dtype_of(tg_lt(a, b)) == TG_BOOL);
  /* python-scalar semantics */
  CHECK(tg_dtype_of(tg_add_s(a, 3)) == TG_INT8);
  CHECK(tg_dtype_of(tg_add_s(a, 0.5)) == TG_FLOAT32);
  tg_tensor h = tg_ones(TG_SHAPE(2), TG_OPTS(.dtype = TG_FLOAT16));
  CHECK(tg_dtype_of(tg_mul_s(h, 2.5)) == TG_FLOAT16);
  CHECK(tg_dtype_of(tg_exp(a)) == TG_FLOAT32);
  /* names and sizes */
  CHECK(strcmp(tg_dtype_name(TG_FLOAT32), "float") == 0);
  CHECK(strcmp(tg_dtype_name(TG_FLOAT16), "half") == 0);
  CHECK(strcmp(tg_dtype_name(TG_BFLOAT16), "bfloat16") == 0);
  CHECK(strcmp(tg_dtype_name(TG_UINT8), "uchar") == 0);
  CHECK(tg_dtype_itemsize(TG_BFLOAT16) == 2 && tg_dtype_itemsize(TG_INT64) == 8 &&
        tg_dtype_itemsize(TG_BOOL) == 1);
  CHECK(tg_dtype_itemsize((tg_dtype)99) == 0);
  CHECK(tg_dtype_is_float(TG_BFLOAT16) && !tg_dtype_is_float(TG_INT32));
  CHECK(tg_dtype_is_int(TG_UINT64) && !tg_dtype_is_int(TG_BOOL));
  CHECK(tg_dtype_is_unsigned(TG_UINT16) && !tg_dtype_is_unsigned(TG_INT16));
  END;
}

TEST(default_float_context) {
  BEGIN;
  tg_dtype before = tg_default_float();
  CHECK(before == TG_FLOAT32);
  tg_context_begin();
  CHECK(tg_context_set("DEFAULT_FLOAT", "HALF") == TG_OK);
  CHECK(tg_default_float() == TG_FLOAT16);
  tg_tensor o = tg_ones(TG_SHAPE(3), NULL);
  CHECK(tg_dtype_of(o) == TG_FLOAT16);
  CHECK(tg_dtype_of(tg_arange(0, 1, 0.5, NULL)) == TG_FLOAT16);
  CHECK(tg_dtype_of(tg_div(tg_arange(0, 3, 1, NULL), tg_arange(1, 4, 1, NULL))) == TG_FLOAT16);
  /* but a mean (and var, std) of integers is float32, as in tinygrad */
  tg_tensor ints = tg_arange(0, 4, 1, NULL);
  CHECK(tg_dtype_of(tg_mean(ints, NULL, 0, false)) == TG_FLOAT32 && tg_dtype_of(tg_var(ints, NULL, 0, false, 1)) == TG_FLOAT32 &&
        tg_dtype_of(tg_std(ints, NULL, 0, false, 1)) == TG_FLOAT32);
  CHECK_VALUES(tg_var(tg_cast(tg_add_s(tg_mul_s(ints, 2), 70000), TG_INT32), NULL, 0, false, 1), 1e-6, 20.0 / 3.0);
  CHECK(tg_dtype_of(tg_rand(TG_SHAPE(2), NULL)) == TG_FLOAT16);
  CHECK_VALUES(tg_add_s(o, 0.5), 0, 1.5, 1.5, 1.5);
  /* a C float array without a dtype: its values, in DEFAULT_FLOAT; a blob stays float32 */
  float fdata[3] = {0.1f, -2.5f, 70000.0f};
  tg_tensor fd = tg_from_data(fdata, TG_SHAPE(3), NULL);
  CHECK(tg_dtype_of(fd) == TG_FLOAT16);
  CHECK_VALUES(tg_cast(fd, TG_FLOAT32), 0, 0.0999755859375, -2.5, INFINITY);
  CHECK(tg_dtype_of(tg_from_blob(fdata, TG_SHAPE(3), NULL)) == TG_FLOAT32);
  CHECK_VALUES(tg_from_blob(fdata, TG_SHAPE(3), NULL), 0, 0.1f, -2.5, 70000.0);
  tg_context_begin();
  CHECK(tg_context_set("DEFAULT_FLOAT", "float64") == TG_OK);
  CHECK(tg_dtype_of(tg_zeros(TG_SHAPE(1), NULL)) == TG_FLOAT64);
  CHECK_VALUES(tg_from_data(fdata, TG_SHAPE(3), NULL), 0, 0.1f, -2.5, 70000.0);
  tg_context_end();
  CHECK(tg_dtype_of(tg_zeros(TG_SHAPE(1), NULL)) == TG_FLOAT16);
  tg_context_end();
  CHECK(tg_default_float() == before);
  CHECK(tg_dtype_of(tg_ones(TG_SHAPE(3), NULL)) == TG_FLOAT32);
  /* the half tensor made inside keeps its dtype */
  CHECK(tg_dtype_of(o) == TG_FLOAT16);
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* ops                                                                                             */

TEST(ops_elementwise_float) {
  BEGIN;
  const float xv[] = {-2, -0.5, 0, 1, 4};
  tg_tensor x = f32(xv, TG_SHAPE(5));
  const float yv[] = {1, 2, 4, -1, 0.5};
  tg_tensor y = f32(yv, TG_SHAPE(5));
  CHECK_VALUES(tg_add(x, y), 0, -1, 1.5, 4, 0, 4.5);
  CHECK_VALUES(tg_sub(x, y), 0, -3, -2.5, -4, 2, 3.5);
  CHECK_VALUES(tg_mul(x, y), 0, -2, -1, 0, -1, 2);
  CHECK_VALUES(tg_div(x, y), 1e-7, -2, -0.25, 0, -1, 8);
  CHECK_VALUES(tg_neg(x), 0, 2, 0.5, 0, -1, -4);
  CHECK_VALUES(tg_relu(x), 0, 0, 0, 0, 1, 4);
  CHECK_VALUES(tg_maximum(x, y), 0, 1, 2, 4, 1, 4);
  CHECK_VALUES(tg_minimum(x, y), 0, -2, -0.5, 0, -1, 0.5);
  CHECK_VALUES(tg_exp(x), 1e-6, exp(-2), exp(-0.5), 1, exp(1), exp(4));
  CHECK_VALUES(tg_exp2(x), 1e-6, 0.25, pow(2, -0.5), 1, 2, 16);
  const float pv[] = {0.25, 1, 4, 9, 16};
  tg_tensor p = f32(pv, TG_SHAPE(5));
  CHECK_VALUES(tg_log(p), 1e-6, log(0.25), 0, log(4), log(9), log(16));
  CHECK_VALUES(tg_log2(p), 1e-6, -2, 0, 2, log2(9), 4);
  CHECK_VALUES(tg_sqrt(p), 1e-7, 0.5, 1, 2, 3, 4);
  CHECK_VALUES(tg_reciprocal(p), 1e-7, 4, 1, 0.25, 1.0 / 9, 0.0625);
  CHECK_VALUES(tg_sin(x), 1e-6, sin(-2), sin(-0.5), 0, sin(1), sin(4));
  CHECK_VALUES(tg_pow(p, tg_full_like(p, 0.5, NULL)), 1e-6, 0.5, 1, 2, 3, 4);
  CHECK_VALUES(tg_pow_s(x, 2), 1e-7, 4, 0.25, 0, 1, 16);
  const float tv[] = {-2.7f, -0.5f, 0.5f, 1.9f, 3};
  CHECK_VALUES(tg_trunc(f32(tv, TG_SHAPE(5))), 0, -2, 0, 0, 1, 3);
  /* special values */
  const float sv[] = {0, -1, INFINITY};
  tg_tensor s = f32(sv, TG_SHAPE(3));
  CHECK_VALUES(tg_log(s), 0, -INFINITY, NAN, INFINITY);
  CHECK_VALUES(tg_sqrt(s), 0, 0, NAN, INFINITY);
  CHECK_VALUES(tg_reciprocal(s), 0, INFINITY, -1, 0);
  /* scalar forms */
  CHECK_VALUES(tg_add_s(x, 1), 0, -1, 0.5, 1, 2, 5);
  CHECK_VALUES(tg_sub_s(x, 1), 0, -3, -1.5, -1, 0, 3);
  CHECK_VALUES(tg_rsub_s(1, x), 0, 3, 1.5, 1, 0, -3);
  CHECK_VALUES(tg_mul_s(x, -2), 0, 4, 1, 0, -2, -8);
  CHECK_VALUES(tg_div_s(x, 4), 0, -0.5, -0.125, 0, 0.25, 1);
  CHECK_VALUES(tg_rdiv_s(2, p), 1e-7, 8, 2, 0.5, 2.0 / 9, 0.125);
  CHECK_VALUES(tg_maximum_s(x, 0.5), 0, 0.5, 0.5, 0.5, 1, 4);
  CHECK_VALUES(tg_minimum_s(x, 0.5), 0, -2, -0.5, 0, 0.5, 0.5);
  /* comparisons and where */
  CHECK_VALUES(tg_lt(x, y), 0, 1, 1, 1, 0, 0);
  CHECK_VALUES(tg_gt(x, y), 0, 0, 0, 0, 1, 1);
  CHECK_VALUES(tg_le(x, tg_full_like(x, 0, NULL)), 0, 1, 1, 1, 0, 0);
  CHECK_VALUES(tg_ge(x, tg_full_like(x, 0, NULL)), 0, 0, 0, 1, 1, 1);
  CHECK_VALUES(tg_eq_s(x, 1), 0, 0, 0, 0, 1, 0);
  CHECK_VALUES(tg_ne_s(x, 1), 0, 1, 1, 1, 0, 1);
  CHECK_VALUES(tg_lt_s(x, 0), 0, 1, 1, 0, 0, 0);
  CHECK_VALUES(tg_gt_s(x, 0), 0, 0, 0, 0, 1, 1);
  CHECK_VALUES(tg_where(tg_gt_s(x, 0), x, y), 0, 1, 2, 4, 1, 4);
  CHECK(tg_dtype_of(tg_eq(x, y)) == TG_BOOL);
  CHECK(tg_dtype_of(tg_const_like(x, 2)) == TG_FLOAT32);
  CHECK_VALUES(tg_mul(x, tg_const_like(x, 3)), 0, -6, -1.5, 0, 3, 12);
  /* broadcasting */
  const float cv[] = {1, 2, 3};
  const float rv[] = {10, 20};
  tg_tensor col = f32(rv, TG_SHAPE(2, 1)), row = f32(cv, TG_SHAPE(3));
  tg_tensor bc = tg_add(col, row);
  CHECK_SHAPE(bc, 2, 3);
  CHECK_VALUES(bc, 0, 11, 12, 13, 21, 22, 23);
  END;
}

TEST(ops_integer) {
  BEGIN;
  const int32_t av[] = {7, -7, 7, -7, 0, 5};
  const int32_t bv[] = {2, 2, -2, -2, 3, 0};
  tg_tensor a = tg_from_data(av, TG_SHAPE(6), I32), b = tg_from_data(bv, TG_SHAPE(6), I32);
  tg_tensor q = tg_idiv(a, b);
  CHECK(tg_dtype_of(q) == TG_INT32);
  CHECK_VALUES(q, 0, 3, -3, -3, 3, 0, 0);            /* truncates toward zero; x // 0 -> 0 */
  CHECK_VALUES(tg_mod(a, b), 0, 1, 1, -1, -1, 0, 0); /* sign of the divisor; x % 0 -> 0 */
  CHECK_VALUES(tg_add(a, b), 0, 9, -5, 5, -9, 3, 5);
  CHECK_VALUES(tg_mul(a, b), 0, 14, -14, -14, 14, 0, 0);
  CHECK_VALUES(tg_div(a, b), 0, 3.5, -3.5, -3.5, 3.5, 0, INFINITY);
  CHECK(tg_dtype_of(tg_div(a, b)) == TG_FLOAT32);
  CHECK_VALUES(tg_neg(a), 0, -7, 7, -7, 7, 0, -5);
  CHECK_VALUES(tg_maximum(a, b), 0, 7, 2, 7, -2, 3, 5);
  CHECK_VALUES(tg_minimum(a, b), 0, 2, -7, -2, -7, 0, 0);
  CHECK_VALUES(tg_pow(tg_from_data(bv, TG_SHAPE(6), I32), tg_full_like(b, 3, NULL)), 0, 8, 8, -8, -8, 27, 0);
  /* division by zero in every integer dtype: no crash, result 0 */
  for (int d = TG_INT8; d <= TG_UINT64; d++) {
    tg_tensor x = tg_full(TG_SHAPE(3), 9, TG_OPTS(.dtype = (tg_dtype)d));
    tg_tensor z = tg_zeros(TG_SHAPE(3), TG_OPTS(.dtype = (tg_dtype)d));
    tg_tensor xr = tg_contiguous(x), zr = tg_contiguous(z); /* real buffers, not folded constants */
    CHECK(tg_realize_many((tg_tensor[]){xr, zr}, 2) == TG_OK);
    CHECK_VALUES(tg_idiv(xr, zr), 0, 0, 0, 0);
    CHECK_VALUES(tg_mod(xr, zr), 0, 0, 0, 0);
    CHECK_VALUES(tg_idiv(x, z), 0, 0, 0, 0);
  }
  /* INT_MIN / -1 does not trap */
  const int32_t mn[] = {INT32_MIN}, m1[] = {-1};
  tg_tensor tmn = tg_from_data(mn, TG_SHAPE(1), I32), tm1 = tg_from_data(m1, TG_SHAPE(1), I32);
  int64_t iv = 1;
  CHECK(tg_item_i64(tg_idiv(tmn, tm1), &iv) == TG_OK);
  CHECK(iv == INT32_MIN || iv == 0);
  CHECK(tg_item_i64(tg_mod(tmn, tm1), &iv) == TG_OK && iv == 0);
  /* overflow wraps */
  const int32_t big[] = {INT32_MAX, INT32_MIN};
  tg_tensor tb = tg_from_data(big, TG_SHAPE(2), I32);
  CHECK_VALUES(tg_add_s(tb, 1), 0, (double)INT32_MIN, (double)INT32_MIN + 1);
  CHECK_VALUES(tg_sub_s(tb, 1), 0, (double)INT32_MAX - 1, (double)INT32_MAX);
  CHECK_VALUES(tg_mul_s(tb, 2), 0, -2, 0);
  const uint8_t u8[] = {250, 3};
  tg_tensor tu = tg_from_data(u8, TG_SHAPE(2), TG_OPTS(.dtype = TG_UINT8));
  CHECK_VALUES(tg_add_s(tu, 10), 0, 4, 13);
  CHECK_VALUES(tg_sub_s(tu, 5), 0, 245, 254);
  CHECK(tg_dtype_of(tg_add_s(tu, 10)) == TG_UINT8);
  const int8_t i8[] = {127, -128};
  tg_tensor t8 = tg_from_data(i8, TG_SHAPE(2), TG_OPTS(.dtype = TG_INT8));
  CHECK_VALUES(tg_add_s(t8, 1), 0, -128, -127);
  CHECK_VALUES(tg_neg(t8), 0, -127, -128);
  const int64_t i64[] = {INT64_MAX};
  int64_t r64 = 0;
  CHECK(tg_item_i64(tg_add_s(tg_from_data(i64, TG_SHAPE(1), TG_OPTS(.dtype = TG_INT64)), 1), &r64) == TG_OK);
  CHECK(r64 == INT64_MIN);
  /* bitwise and shifts */
  const int32_t xv[] = {12, 10, -1}, yv[] = {10, 6, 4};
  tg_tensor x = tg_from_data(xv, TG_SHAPE(3), I32), y = tg_from_data(yv, TG_SHAPE(3), I32);
  CHECK_VALUES(tg_bitwise_and(x, y), 0, 8, 2, 4);
  CHECK_VALUES(tg_bitwise_or(x, y), 0, 14, 14, -1);
  CHECK_VALUES(tg_bitwise_xor(x, y), 0, 6, 12, -5);
  const int32_t sh[] = {1, 2, 3};
  tg_tensor tsh = tg_from_data(sh, TG_SHAPE(3), I32);
  CHECK_VALUES(tg_lshift(x, tsh), 0, 24, 40, -8);
  CHECK_VALUES(tg_rshift(x, tsh), 0, 6, 2, -1);
  const bool bv1[] = {true, true, false}, bv2[] = {true, false, false};
  tg_tensor b1 = tg_from_data(bv1, TG_SHAPE(3), TG_OPTS(.dtype = TG_BOOL));
  tg_tensor b2 = tg_from_data(bv2, TG_SHAPE(3), TG_OPTS(.dtype = TG_BOOL));
  CHECK_VALUES(tg_bitwise_and(b1, b2), 0, 1, 0, 0);
  CHECK_VALUES(tg_bitwise_or(b1, b2), 0, 1, 1, 0);
  CHECK_VALUES(tg_bitwise_xor(b1, b2), 0, 0, 1, 0);
  CHECK(tg_dtype_of(tg_bitwise_xor(b1, b2)) == TG_BOOL);
  CHECK_VALUES(tg_add(b1, b2), 0, 1, 1, 0); /* bool + bool is logical or */
  /* unsigned shift is logical */
  const uint32_t uv[] = {0x80000000u};
  tg_tensor tuv = tg_from_data(uv, TG_SHAPE(1), TG_OPTS(.dtype = TG_UINT32));
  CHECK_VALUES(tg_rshift(tuv, tg_full_like(tuv, 31, NULL)), 0, 1);
  END;
}

TEST(ops_half_bfloat16) {
  BEGIN;
  const float xv[] = {1, 2.5, -3, 1000};
  tg_tensor x32 = f32(xv, TG_SHAPE(4));
  tg_tensor h = tg_cast(x32, TG_FLOAT16);
  CHECK(tg_dtype_of(h) == TG_FLOAT16);
  CHECK_VALUES(h, 0, 1, 2.5, -3, 1000);
  tg_tensor hs = tg_add(h, h);
  CHECK(tg_dtype_of(hs) == TG_FLOAT16);
  CHECK_VALUES(hs, 0, 2, 5, -6, 2000);
  CHECK_VALUES(tg_mul(h, h), 0, 1, 6.25, 9, INFINITY); /* 1e6 overflows half */
  /* half rounds after every op: 2048 + 1 is 2048 in half */
  tg_tensor big = tg_full(TG_SHAPE(2), 2048, TG_OPTS(.dtype = TG_FLOAT16));
  CHECK_VALUES(tg_add_s(big, 1), 0, 2048, 2048);
  CHECK_VALUES(tg_add_s(big, 2), 0, 2050, 2050);
  CHECK_VALUES(tg_div_s(h, 4), 0, 0.25, 0.625, -0.75, 250);
  CHECK_VALUES(tg_sqrt(tg_cast(tg_full(TG_SHAPE(1), 2, NULL), TG_FLOAT16)), 0,
               1.4140625); /* sqrt(2) in half */
  uint16_t hb[4];
  CHECK(tg_data(h, hb, sizeof hb) == TG_OK);
  CHECK(hb[0] == 0x3C00 && hb[1] == 0x4100 && hb[2] == 0xC200 && hb[3] == 0x63D0);
  /* half sum accumulates in float, returns half */
  tg_tensor hsum = tg_sum(tg_full(TG_SHAPE(4096), 1, TG_OPTS(.dtype = TG_FLOAT16)), TG_ALL_AXES, false);
  CHECK(tg_dtype_of(hsum) == TG_FLOAT16);
  CHECK_VALUES(hsum, 0, 4096);

  tg_tensor bf = tg_cast(x32, TG_BFLOAT16);
  CHECK(tg_dtype_of(bf) == TG_BFLOAT16);
  CHECK_VALUES(bf, 0, 1, 2.5, -3, 1000);
  tg_tensor bs = tg_mul_s(bf, 3);
  CHECK(tg_dtype_of(bs) == TG_BFLOAT16);
  CHECK_VALUES(bs, 0, 3, 7.5, -9, 3008); /* 3000 rounds (half to even) to 3008 in bfloat16 */
  /* bfloat16 has 8 bits of mantissa: 256 + 1 rounds to 256 */
  tg_tensor b256 = tg_full(TG_SHAPE(1), 256, TG_OPTS(.dtype = TG_BFLOAT16));
  CHECK_VALUES(tg_add_s(b256, 1), 0, 256);
  CHECK_VALUES(tg_add_s(b256, 2), 0, 258);
  uint16_t bb[4];
  CHECK(tg_data(bf, bb, sizeof bb) == TG_OK);
  CHECK(bb[0] == 0x3F80 && bb[1] == 0x4020 && bb[2] == 0xC040 && bb[3] == 0x447A);
  /* mixing half and bfloat16 promotes to float32 */
  tg_tensor mix = tg_add(h, bf);
  CHECK(tg_dtype_of(mix) == TG_FLOAT32);
  CHECK_VALUES(mix, 0, 2, 5, -6, 2000);
  /* back to float32 */
  CHECK_VALUES(tg_cast(tg_exp(tg_cast(x32, TG_BFLOAT16)), TG_FLOAT32), 1e-2, exp(1), exp(2.5), exp(-3),
               INFINITY);
  END;
}

TEST(ops_cast_bitcast) {
  BEGIN;
  const float v[] = {-1.7f, 0.2f, 2.9f, 300.5f};
  tg_tensor x = f32(v, TG_SHAPE(4));
  CHECK_VALUES(tg_cast(x, TG_INT32), 0, -1, 0, 2, 300);
  CHECK_VALUES(tg_cast(x, TG_BOOL), 0, 1, 1, 1, 1);
  tg_tensor xi = tg_cast(x, TG_INT32);
  CHECK_VALUES(tg_cast(xi, TG_UINT8), 0, 255, 0, 2, 44); /* integer narrowing wraps */
  CHECK_VALUES(tg_cast(xi, TG_INT8), 0, -1, 0, 2, 44);
  CHECK_VALUES(tg_cast(tg_cast(xi, TG_INT8), TG_FLOAT64), 0, -1, 0, 2, 44);
  CHECK_VALUES(tg_cast(tg_cast(xi, TG_UINT16), TG_INT64), 0, 65535, 0, 2, 300);
  const float one[] = {1.0f, -2.0f};
  tg_tensor bc = tg_bitcast(f32(one, TG_SHAPE(2)), TG_UINT32);
  CHECK(tg_dtype_of(bc) == TG_UINT32);
  CHECK_VALUES(bc, 0, 0x3F800000u, 0xC0000000u);
  CHECK_VALUES(tg_bitcast(bc, TG_FLOAT32), 0, 1, -2);
  /* different sizes: the last dim scales */
  tg_tensor b16 = tg_bitcast(f32(one, TG_SHAPE(2)), TG_UINT16);
  CHECK_SHAPE(b16, 4);
  CHECK_VALUES(b16, 0, 0, 0x3F80, 0, 0xC000);
  tg_tensor b64 = tg_bitcast(b16, TG_INT64);
  CHECK_SHAPE(b64, 1);
  CHECK(tg_bitcast(f32(one, TG_SHAPE(2)), TG_INT64).id != 0);
  CHECK(tg_bitcast(f32(v, TG_SHAPE(4)), TG_FLOAT64).id != 0);
  const float three[] = {1, 2, 3};
  CHECK(tg_bitcast(f32(three, TG_SHAPE(3)), TG_INT64).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_bitcast", "(3,)");
  CHECK(tg_cast(x, (tg_dtype)99).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_cast", "99");
  END;
}

TEST(ops_reduce) {
  BEGIN;
  const float v[] = {1, -2, 3, 4, 5, -6};
  tg_tensor x = f32(v, TG_SHAPE(2, 3));
  CHECK_VALUES(tg_sum(x, TG_ALL_AXES, false), 0, 5);
  tg_tensor s0 = tg_sum(x, TG_AXES(0), false);
  CHECK_SHAPE(s0, 3);
  CHECK_VALUES(s0, 0, 5, 3, -3);
  tg_tensor s1 = tg_sum(x, TG_AXES(-1), true);
  CHECK_SHAPE(s1, 2, 1);
  CHECK_VALUES(s1, 0, 2, 3);
  CHECK_VALUES(tg_max(x, TG_AXES(1), false), 0, 3, 5);
  CHECK_VALUES(tg_min(x, TG_AXES(1), false), 0, -2, -6);
  CHECK_VALUES(tg_max(x, TG_ALL_AXES, false), 0, 5);
  CHECK_VALUES(tg_min(x, TG_ALL_AXES, false), 0, -6);
  CHECK_VALUES(tg_mean(x, TG_AXES(0), false), 1e-7, 2.5, 1.5, -1.5);
  CHECK_VALUES(tg_prod(x, TG_AXES(1), false), 0, -6, -120);
  tg_tensor k = tg_sum(x, TG_AXES(0, 1), true);
  CHECK_SHAPE(k, 1, 1);
  CHECK_VALUES(k, 0, 5);
  /* integer and bool reductions */
  const uint8_t u[] = {200, 100, 50, 250};
  tg_tensor tu = tg_from_data(u, TG_SHAPE(4), TG_OPTS(.dtype = TG_UINT8));
  tg_tensor su = tg_sum(tu, TG_ALL_AXES, false);
  CHECK(tg_dtype_of(su) == TG_UINT32);
  CHECK_VALUES(su, 0, 600);
  CHECK_VALUES(tg_min(tu, TG_ALL_AXES, false), 0, 50);
  CHECK_VALUES(tg_max(tu, TG_ALL_AXES, false), 0, 250);
  tg_tensor sb = tg_sum(tg_gt_s(x, 0), TG_ALL_AXES, false);
  CHECK(tg_dtype_of(sb) == TG_INT32);
  CHECK_VALUES(sb, 0, 4);
  const int8_t i8[] = {-100, -100, -100};
  tg_tensor s8 = tg_sum(tg_from_data(i8, TG_SHAPE(3), TG_OPTS(.dtype = TG_INT8)), TG_ALL_AXES, false);
  CHECK(tg_dtype_of(s8) == TG_INT32);
  CHECK_VALUES(s8, 0, -300);
  tg_tensor mi = tg_mean(tg_arange(0, 4, 1, NULL), TG_ALL_AXES, false);
  CHECK(tg_dtype_of(mi) == TG_FLOAT32);
  CHECK_VALUES(mi, 0, 1.5);
  /* softmax / log_softmax */
  const float lv[] = {1, 2, 3, 1, 1, 1};
  tg_tensor l = f32(lv, TG_SHAPE(2, 3));
  double e1 = exp(1), e2 = exp(2), e3 = exp(3), z = e1 + e2 + e3;
  CHECK_VALUES(tg_softmax(l, -1), 1e-6, e1 / z, e2 / z, e3 / z, 1.0 / 3, 1.0 / 3, 1.0 / 3);
  CHECK_VALUES(tg_log_softmax(l, 1), 1e-6, 1 - log(z), 2 - log(z), 3 - log(z), -log(3), -log(3), -log(3));
  CHECK_VALUES(tg_softmax(l, 0), 1e-6, 0.5, e2 / (e2 + e1), e3 / (e3 + e1), 0.5, e1 / (e2 + e1),
               e1 / (e3 + e1));
  /* reduce of a large 1-D input */
  tg_tensor big = tg_ones(TG_SHAPE(100000), NULL);
  CHECK_VALUES(tg_sum(big, TG_ALL_AXES, false), 0, 100000);
  /* reduce over a 0-size axis gives the identity */
  tg_tensor e = tg_zeros(TG_SHAPE(0, 2), NULL);
  CHECK_VALUES(tg_sum(e, TG_AXES(0), false), 0, 0, 0);
  CHECK_VALUES(tg_max(e, TG_AXES(0), false), 0, -INFINITY, -INFINITY);
  END;
}

/* Long float sums keep float32 accuracy when their terms are alike: added one after another into one
 * accumulator, n equal terms lose about n * 2^-24 (the same rounding every time); in blocks, about
 * sqrt(n) times that. A batchnorm's variance over a relu'd input (half its terms the same) is the
 * case that training meets. */
TEST(long_sums_accurate) {
  BEGIN;
  enum { N = 1 << 20, B = 512, C = 64, HW = 36 };
  float *v = malloc(sizeof(float) * B * C * HW); /* > N */
  for (int i = 0; i < N; i++) v[i] = 0.1f;
  double s;
  CHECK(tg_item(tg_sum(f32(v, TG_SHAPE(N)), TG_ALL_AXES, false), &s) == TG_OK);
  CHECK_MSG(fabs(s - (double)0.1f * N) <= 1e-6 * (double)0.1f * N, "sum of %d x 0.1f = %.9g", N, s);
  float cols[16];
  CHECK(tg_data(tg_sum(f32(v, TG_SHAPE(N / 16, 16)), TG_AXES(0), false), cols, sizeof cols) == TG_OK);
  for (int i = 0; i < 16; i++)
    CHECK_MSG(fabs(cols[i] - (double)0.1f * N / 16) <= 2e-6 * (double)0.1f * N / 16, "column %d of %d x 0.1f = %.9g", i,
              N / 16, cols[i]);
  /* per-channel mean and variance of a (512, 64, 6, 6) relu'd input, as BatchNorm computes them */
  uint64_t st = 12345;
  for (int i = 0; i < B * C * HW; i++) {
    st = st * 6364136223846793005ULL + 1442695040888963407ULL;
    double g = (double)(st >> 40) / (double)(1 << 24) - 0.5; /* uniform [-0.5, 0.5) */
    v[i] = g > 0 ? (float)(4 * g) : 0.0f;
  }
  tg_tensor x = f32(v, TG_SHAPE(B, C, 6, 6));
  tg_tensor m = tg_mean(x, TG_AXES(0, 2, 3), true);
  tg_tensor y = tg_sub(x, m);
  float var[C];
  CHECK(tg_data(tg_mean(tg_mul(y, y), TG_AXES(0, 2, 3), false), var, sizeof var) == TG_OK);
  double worst = 0;
  for (int c = 0; c < C; c++) {
    double mu = 0, q = 0;
    for (int b = 0; b < B; b++)
      for (int k = 0; k < HW; k++) mu += v[(b * C + c) * HW + k];
    mu /= B * HW;
    for (int b = 0; b < B; b++)
      for (int k = 0; k < HW; k++) q += (v[(b * C + c) * HW + k] - mu) * (v[(b * C + c) * HW + k] - mu);
    q /= B * HW;
    worst = fmax(worst, fabs(var[c] - q) / q);
  }
  CHECK_MSG(worst < 2e-6, "variance relative error %.3g", worst);
  free(v);
  END;
}

/* A flipped axis summed into one accumulator: the kernel's index arithmetic (a modulo and a
 * division of the flipped index) is what gcc 12's loop vectorizer miscompiled at -O2 (390 instead
 * of 276); the CPU device compiles with gcc's loop vectorizer off */
TEST(flip_then_full_sum) {
  BEGIN;
  tg_tensor a = tg_reshape(tg_arange(0, 24, 1, TG_OPTS(.dtype = TG_FLOAT32)), TG_SHAPE(3, 2, 4));
  CHECK_VALUES(tg_sum(tg_flip(tg_sum(a, TG_AXES(2), false), TG_AXES(1)), TG_ALL_AXES, false), 0, 276);
  tg_tensor b = tg_reshape(tg_arange(0, 10, 1, TG_OPTS(.dtype = TG_FLOAT32)), TG_SHAPE(5, 2));
  CHECK_VALUES(tg_sum(tg_flip(b, TG_AXES(1)), TG_ALL_AXES, false), 0, 45);
  END;
}

/* tinygrad's .T swaps dims 0 and 1 only: Tensor.arange(24).reshape(2,3,4).T has shape (3, 2, 4) and
 * the values below (tinygrad 0.14); a 1-d or 0-d tensor is an IndexError there. */
TEST(transpose_T) {
  BEGIN;
  tg_tensor x = tg_reshape(tg_arange(0, 24, 1, F32), TG_SHAPE(2, 3, 4));
  tg_tensor t = tg_T(x);
  CHECK_SHAPE(t, 3, 2, 4);
  CHECK_VALUES(t, 0, 0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 16, 17, 18, 19, 8, 9, 10, 11, 20, 21, 22, 23);
  tg_tensor m = f32((const float[]){0, 1, 2, 3, 4, 5}, TG_SHAPE(2, 3));
  CHECK_SHAPE(tg_T(m), 3, 2);
  CHECK_VALUES(tg_T(m), 0, 0, 3, 1, 4, 2, 5);
  CHECK_VALUES(tg_T(tg_T(m)), 0, 0, 1, 2, 3, 4, 5);
  CHECK(tg_T(tg_arange(0, 3, 1, NULL)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_T", "at least 2 dims", "(3,)");
  CHECK(tg_T(tg_const_like(m, 1)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_T", "at least 2 dims");
  CHECK(tg_T(NONE_T).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_T");
  END;
}

/* tinygrad's scatter(reduce=) as the header spells it with tg_scatter_reduce; expected values from
 * tinygrad 0.14: Tensor.full((2,4), 2.0).scatter(1, Tensor([[2],[3]]), 1.23, reduce='multiply'/'add'),
 * Tensor.zeros(3).scatter(0, Tensor([0,0,2]), 1.0, reduce='add') -> [2, 0, 1], Tensor.full((3,), 2.0)
 * .scatter(0, ..., 3.0, reduce='multiply') -> [18, 2, 6], and an int32 [1,2,3] with index [1,1]:
 * 1.5 'add' -> [1, 4, 3], -2.5 'multiply' -> [1, 8, 3] (the value is cast to int32 first). */
static tg_tensor scatter_value(tg_tensor x, int dim, tg_tensor index, double value, tg_scatter_reduce_op op) {
  return tg_scatter_reduce(x, dim, index, tg_full_like(index, value, TG_OPTS(.dtype = tg_dtype_of(x))), op, true);
}

TEST(scatter_with_a_reduce_argument) {
  BEGIN;
  tg_tensor x = tg_full(TG_SHAPE(2, 4), 2.0, F32);
  tg_tensor ix = tg_from_data((const int32_t[]){2, 3}, TG_SHAPE(2, 1), I32);
  CHECK_VALUES(scatter_value(x, 1, ix, 1.23, TG_SCATTER_PROD), 1e-6, 2, 2, 2.46, 2, 2, 2, 2, 2.46);
  CHECK_VALUES(scatter_value(x, 1, ix, 1.23, TG_SCATTER_SUM), 1e-6, 2, 2, 3.23, 2, 2, 2, 2, 3.23);
  tg_tensor dup = tg_from_data((const int32_t[]){0, 0, 2}, TG_SHAPE(3), I32);
  CHECK_VALUES(scatter_value(tg_zeros(TG_SHAPE(3), F32), 0, dup, 1.0, TG_SCATTER_SUM), 0, 2, 0, 1);
  CHECK_VALUES(scatter_value(tg_full(TG_SHAPE(3), 2.0, F32), 0, dup, 3.0, TG_SCATTER_PROD), 0, 18, 2, 6);
  tg_tensor xi = tg_from_data((const int32_t[]){1, 2, 3}, TG_SHAPE(3), I32);
  tg_tensor i11 = tg_from_data((const int32_t[]){1, 1}, TG_SHAPE(2), I32);
  tg_tensor ai = scatter_value(xi, 0, i11, 1.5, TG_SCATTER_SUM), mi = scatter_value(xi, 0, i11, -2.5, TG_SCATTER_PROD);
  CHECK(tg_dtype_of(ai) == TG_INT32 && tg_dtype_of(mi) == TG_INT32);
  CHECK_VALUES(ai, 0, 1, 4, 3);
  CHECK_VALUES(mi, 0, 1, 8, 3);
  END;
}

/* Scalar forms of where, copysign, logaddexp and fmod, against tinygrad 0.14 with Python numbers
 * (cb = [True, False], xi int32 [10, 20], xu8 uint8 [10, 20], xh half [1, 2], xb bool [True, True]):
 * cb.where(xi, 2.5) float [10, 2.5]; cb.where(xi, 2) int [10, 2]; cb.where(2.5, xi) float [2.5, 20];
 * cb.where(xu8, 300) uchar [10, 44]; cb.where(xu8, -1) uchar [10, 255]; cb.where(7, xu8) uchar [7, 20];
 * cb.where(7.5, xh) half [7.5, 2]; cb.where(xb, 2) int [1, 2]; cb.where(xi, inf) float [10, inf];
 * cb.where(1, 3) int [1, 3]; cb.where(1.5, 3) float [1.5, 3]; xi.copysign(-2.5) float [-10, -20];
 * xi.copysign(-2) int [-10, -20]; xf.copysign(-0.) [-1, -2]; xb.copysign(-1) int [-1, -1];
 * xi.logaddexp(1) float [10.000123, 20]; xf.logaddexp(1) [1.6931472, 2.3132617]; xf.logaddexp(-inf)
 * [1, 2]; int32 [-7, 7].fmod(3) and .fmod(-3) [-1, 1], .fmod(2.5) float [-2, 2]; float [-7, 7]
 * .fmod(2.5) [-2, 2]; uint8 [7, 250].fmod(300) [7, 30]. (int fmod 0 is 0 here, as documented.) */
TEST(scalar_forms_where_copysign_logaddexp_fmod) {
  BEGIN;
  tg_tensor cb = tg_from_data((const bool[]){true, false}, TG_SHAPE(2), TG_OPTS(.dtype = TG_BOOL));
  tg_tensor xi = tg_from_data((const int32_t[]){10, 20}, TG_SHAPE(2), I32);
  tg_tensor xu8 = tg_from_data((const uint8_t[]){10, 20}, TG_SHAPE(2), TG_OPTS(.dtype = TG_UINT8));
  tg_tensor xh = tg_cast(f32((const float[]){1, 2}, TG_SHAPE(2)), TG_FLOAT16);
  tg_tensor xb = tg_from_data((const bool[]){true, true}, TG_SHAPE(2), TG_OPTS(.dtype = TG_BOOL));
  tg_tensor xf = f32((const float[]){1, 2}, TG_SHAPE(2));
#define CHECK_DT_VALUES(t, dt, tol, ...)                                                                     \
  do {                                                                                                       \
    tg_tensor tt_r = (t);                                                                                    \
    CHECK_MSG(tg_dtype_of(tt_r) == (dt), "%s: dtype %s", #t, tg_dtype_name(tg_dtype_of(tt_r)));              \
    CHECK_VALUES(tt_r, tol, __VA_ARGS__);                                                                    \
  } while (0)
  CHECK_DT_VALUES(tg_where_s(cb, xi, 2.5), TG_FLOAT32, 0, 10, 2.5);
  CHECK_DT_VALUES(tg_where_s(cb, xi, 2), TG_INT32, 0, 10, 2);
  CHECK_DT_VALUES(tg_rwhere_s(cb, 2.5, xi), TG_FLOAT32, 0, 2.5, 20);
  CHECK_DT_VALUES(tg_where_s(cb, xu8, 300), TG_UINT8, 0, 10, 44);
  CHECK_DT_VALUES(tg_where_s(cb, xu8, -1), TG_UINT8, 0, 10, 255);
  CHECK_DT_VALUES(tg_rwhere_s(cb, 7, xu8), TG_UINT8, 0, 7, 20);
  CHECK_DT_VALUES(tg_rwhere_s(cb, 7.5, xh), TG_FLOAT16, 0, 7.5, 2);
  CHECK_DT_VALUES(tg_where_s(cb, xb, 2), TG_INT32, 0, 1, 2);
  CHECK_DT_VALUES(tg_where_s(cb, xi, INFINITY), TG_FLOAT32, 0, 10, INFINITY);
  CHECK_DT_VALUES(tg_where_ss(cb, 1, 3), TG_INT32, 0, 1, 3);
  CHECK_DT_VALUES(tg_where_ss(cb, 1.5, 3), TG_FLOAT32, 0, 1.5, 3);
  /* broadcasting: a (2, 1) condition against a (3,) branch */
  tg_tensor c21 = tg_reshape(cb, TG_SHAPE(2, 1));
  tg_tensor w = tg_where_s(c21, f32((const float[]){1, 2, 3}, TG_SHAPE(3)), 0);
  CHECK_SHAPE(w, 2, 3);
  CHECK_VALUES(w, 0, 1, 2, 3, 0, 0, 0);
  CHECK_SHAPE(tg_where_ss(c21, 1, 0), 2, 1);
  CHECK_DT_VALUES(tg_copysign_s(xi, -2.5), TG_FLOAT32, 0, -10, -20);
  CHECK_DT_VALUES(tg_copysign_s(xi, -2), TG_INT32, 0, -10, -20);
  CHECK_DT_VALUES(tg_copysign_s(xf, -0.0), TG_FLOAT32, 0, -1, -2);
  CHECK_DT_VALUES(tg_copysign_s(xb, -1), TG_INT32, 0, -1, -1);
  /* the sign is the number's: an unsigned x negated wraps, as tinygrad's [1, 2].copysign(-1) = [255, 254] */
  CHECK_DT_VALUES(tg_copysign_s(xu8, -1), TG_UINT8, 0, 246, 236);
  CHECK_DT_VALUES(tg_copysign_s(xu8, 3), TG_UINT8, 0, 10, 20);
  CHECK_DT_VALUES(tg_logaddexp_s(xi, 1), TG_FLOAT32, 1e-6, 10.000123, 20);
  CHECK_DT_VALUES(tg_logaddexp_s(xf, 1), TG_FLOAT32, 1e-6, 1.6931472, 2.3132617);
  CHECK_DT_VALUES(tg_logaddexp_s(xf, -INFINITY), TG_FLOAT32, 1e-7, 1, 2);
  tg_tensor i7 = tg_from_data((const int32_t[]){-7, 7}, TG_SHAPE(2), I32);
  CHECK_DT_VALUES(tg_fmod_s(i7, 3), TG_INT32, 0, -1, 1);
  CHECK_DT_VALUES(tg_fmod_s(i7, -3), TG_INT32, 0, -1, 1);
  CHECK_DT_VALUES(tg_fmod_s(i7, 2.5), TG_FLOAT32, 0, -2, 2);
  CHECK_DT_VALUES(tg_fmod_s(i7, 0), TG_INT32, 0, 0, 0);
  CHECK_DT_VALUES(tg_fmod_s(f32((const float[]){-7, 7}, TG_SHAPE(2)), 2.5), TG_FLOAT32, 0, -2, 2);
  tg_tensor u = tg_from_data((const uint8_t[]){7, 250}, TG_SHAPE(2), TG_OPTS(.dtype = TG_UINT8));
  CHECK_DT_VALUES(tg_fmod_s(u, 300), TG_UINT8, 0, 7, 30);
#undef CHECK_DT_VALUES
  /* differentiable in the tensor operand */
  tg_tensor p = tg_from_data((const float[]){1, -2}, TG_SHAPE(2), TG_OPTS(.dtype = TG_FLOAT32, .requires_grad = true));
  tg_tensor loss = tg_sum(tg_add(tg_mul_s(tg_where_s(cb, p, 0), 3), tg_rwhere_s(cb, 0, p)), TG_ALL_AXES, false);
  CHECK(tg_backward(loss) == TG_OK);
  CHECK_VALUES(tg_grad(p), 0, 3, 1);
  /* errors name the scalar form */
  CHECK(tg_where_s(NONE_T, xi, 1).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_where_s");
  CHECK(tg_rwhere_s(cb, 1, NONE_T).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_rwhere_s");
  CHECK(tg_where_ss(NONE_T, 1, 0).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_where_ss");
  CHECK(tg_where_s(tg_ones(TG_SHAPE(3), NULL), xi, 1).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_where_s", "(3,)", "(2,)");
  CHECK(tg_copysign_s(NONE_T, 1).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_copysign_s");
  CHECK(tg_logaddexp_s(NONE_T, 1).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_logaddexp_s");
  CHECK(tg_fmod_s(NONE_T, 1).id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_fmod_s");
  END;
}

TEST(ops_movement) {
  BEGIN;
  const float v[] = {0, 1, 2, 3, 4, 5};
  tg_tensor x = f32(v, TG_SHAPE(2, 3));
  tg_tensor r = tg_reshape(x, TG_SHAPE(3, -1));
  CHECK_SHAPE(r, 3, 2);
  CHECK_VALUES(r, 0, 0, 1, 2, 3, 4, 5);
  tg_tensor t = tg_permute(x, TG_AXES(1, 0));
  CHECK_SHAPE(t, 3, 2);
  CHECK_VALUES(t, 0, 0, 3, 1, 4, 2, 5);
  CHECK_VALUES(tg_transpose(x, -1, -2), 0, 0, 3, 1, 4, 2, 5);
  tg_tensor e = tg_expand(tg_reshape(x, TG_SHAPE(2, 1, 3)), TG_SHAPE(2, 2, -1));
  CHECK_SHAPE(e, 2, 2, 3);
  CHECK_VALUES(e, 0, 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5);
  tg_tensor e2 = tg_expand(tg_arange(0, 2, 1, NULL), TG_SHAPE(2, 2));
  CHECK_VALUES(e2, 0, 0, 1, 0, 1);
  tg_tensor p = tg_pad(x, TG_SHAPE(1, 0, 0, 1), 0);
  CHECK_SHAPE(p, 3, 4);
  CHECK_VALUES(p, 0, 0, 0, 0, 0, 0, 1, 2, 0, 3, 4, 5, 0);
  tg_tensor pv = tg_pad(x, TG_SHAPE(0, 0, 1, 1), -9);
  CHECK_VALUES(pv, 0, -9, 0, 1, 2, -9, -9, 3, 4, 5, -9);
  tg_tensor pn = tg_pad(x, TG_SHAPE(0, 0, -1, 1), 7); /* negative pads shrink */
  CHECK_SHAPE(pn, 2, 3);
  CHECK_VALUES(pn, 0, 1, 2, 7, 4, 5, 7);
  tg_tensor s = tg_shrink(x, TG_SHAPE(1, 2, 0, 2));
  CHECK_SHAPE(s, 1, 2);
  CHECK_VALUES(s, 0, 3, 4);
  CHECK_VALUES(tg_flip(x, TG_AXES(0)), 0, 3, 4, 5, 0, 1, 2);
  CHECK_VALUES(tg_flip(x, TG_AXES(0, 1)), 0, 5, 4, 3, 2, 1, 0);
  tg_tensor f = tg_flatten(tg_reshape(x, TG_SHAPE(1, 2, 3)), 0, -1);
  CHECK_SHAPE(f, 6);
  tg_tensor f2 = tg_flatten(tg_reshape(x, TG_SHAPE(1, 2, 3)), 1, 2);
  CHECK_SHAPE(f2, 1, 6);
  tg_tensor u = tg_unsqueeze(x, 1);
  CHECK_SHAPE(u, 2, 1, 3);
  tg_tensor u2 = tg_unsqueeze(x, -1);
  CHECK_SHAPE(u2, 2, 3, 1);
  CHECK_SHAPE(tg_squeeze(u, 1), 2, 3);
  CHECK_SHAPE(tg_squeeze(x, 0), 2, 3); /* non-1 dim: unchanged */
  /* chained views over a padded, flipped, permuted tensor */
  tg_tensor c = tg_shrink(tg_pad(tg_flip(tg_permute(x, TG_AXES(1, 0)), TG_AXES(0)), TG_SHAPE(1, 1, 0, 0), 0),
                          TG_SHAPE(0, 3, 0, 2));
  CHECK_SHAPE(c, 3, 2);
  CHECK_VALUES(c, 0, 0, 0, 2, 5, 1, 4);
  /* movement ops never copy: a view of a realized tensor is realized */
  CHECK(tg_is_realized(tg_permute(x, TG_AXES(1, 0))));
  CHECK(tg_dim(x, -1) == 3 && tg_dim(x, 0) == 2);
  END;
}

TEST(ops_matmul) {
  BEGIN;
  const float av[] = {1, 2, 3, 4, 5, 6};    /* 2x3 */
  const float bv[] = {7, 8, 9, 10, 11, 12}; /* 3x2 */
  tg_tensor a = f32(av, TG_SHAPE(2, 3)), b = f32(bv, TG_SHAPE(3, 2));
  tg_tensor m = tg_matmul(a, b);
  CHECK_SHAPE(m, 2, 2);
  CHECK_VALUES(m, 0, 58, 64, 139, 154);
  const float vv[] = {1, 0, -1};
  tg_tensor v = f32(vv, TG_SHAPE(3));
  tg_tensor mv = tg_matmul(a, v);
  CHECK_SHAPE(mv, 2);
  CHECK_VALUES(mv, 0, -2, -2);
  tg_tensor vm = tg_matmul(v, b);
  CHECK_SHAPE(vm, 2);
  CHECK_VALUES(vm, 0, -4, -4);
  /* batched with broadcasting */
  tg_tensor ab = tg_expand(tg_reshape(a, TG_SHAPE(1, 2, 3)), TG_SHAPE(4, 2, 3));
  tg_tensor bm = tg_matmul(ab, b);
  CHECK_SHAPE(bm, 4, 2, 2);
  tg_tensor ints = tg_matmul(tg_cast(a, TG_INT32), tg_cast(b, TG_INT32));
  CHECK(tg_dtype_of(ints) == TG_INT32);
  CHECK_VALUES(ints, 0, 58, 64, 139, 154);
  CHECK(tg_matmul(a, a).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_matmul", "(2, 3)", "3 != 2");
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* realize, devices, assign                                                                        */

TEST(realize_realized_runs_nothing) {
  BEGIN;
  const float v[] = {1, 2, 3};
  tg_tensor x = f32(v, TG_SHAPE(3));
  tg_tensor y = tg_exp2(tg_add_s(x, 1));
  CHECK(!tg_is_realized(y));
  tg_global_counters_reset();
  CHECK(tg_realize(y) == TG_OK);
  CHECK(kernels() == 1);
  CHECK(tg_is_realized(y));
  tg_global_counters_reset();
  CHECK(tg_realize(y) == TG_OK);
  CHECK(tg_realize(x) == TG_OK); /* a from_data tensor is realized */
  CHECK(tg_realize(tg_permute(tg_reshape(y, TG_SHAPE(3, 1)), TG_AXES(1, 0))) == TG_OK); /* a view */
  float out[3];
  CHECK(tg_data(y, out, sizeof out) == TG_OK);
  CHECK(kernels() == 0);
  CHECK(out[0] == 4 && out[1] == 8 && out[2] == 16);
  /* a second handle to the same lazy expression is realized too (realize swaps every live handle) */
  tg_tensor z1 = tg_mul_s(x, 3), z2 = tg_mul_s(x, 3);
  CHECK(tg_realize(z1) == TG_OK);
  CHECK(tg_is_realized(z2));
  tg_global_counters_reset();
  CHECK_VALUES(z2, 0, 3, 6, 9);
  CHECK(kernels() == 0);
  CHECK(tg_realize_many(NULL, 0) == TG_OK);
  END;
}

TEST(realize_many_shares_work) {
  BEGIN;
  const float v[] = {1, 2, 3, 4};
  tg_tensor x = f32(v, TG_SHAPE(2, 2));
  tg_tensor s = tg_sum(tg_mul_s(x, 2), TG_AXES(1), false); /* [6, 14] */
  tg_tensor t1 = tg_add_s(s, 1);
  tg_tensor t2 = tg_mul(s, s);
  tg_global_counters_reset();
  CHECK(tg_realize_many((tg_tensor[]){t1, t2}, 2) == TG_OK);
  CHECK(tg_is_realized(t1) && tg_is_realized(t2));
  CHECK_MSG(kernels() <= 3, "kernels %llu", (unsigned long long)kernels());
  CHECK_VALUES(t1, 0, 7, 15);
  CHECK_VALUES(t2, 0, 36, 196);
  /* the same tensor twice in the list */
  tg_tensor t3 = tg_neg(x);
  tg_global_counters_reset();
  CHECK(tg_realize_many((tg_tensor[]){t3, t3}, 2) == TG_OK);
  CHECK(kernels() == 1);
  CHECK_VALUES(t3, 0, -1, -2, -3, -4);
  /* an invalid handle in the list fails the whole call */
  CHECK(tg_realize_many((tg_tensor[]){t1, NONE_T}, 2) == TG_ERR_HANDLE);
  CHECK_ERR(TG_ERR_HANDLE, "tg_realize_many");
  CHECK(tg_realize_many(NULL, 2) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_realize_many");
  END;
}

TEST(to_device_and_back) {
  BEGIN;
  const float v[] = {1, 2, 3, 4};
  tg_tensor x = tg_from_data(v, TG_SHAPE(4), TG_OPTS(.dtype = TG_FLOAT32, .device = "cpu:0"));
  CHECK(strcmp(tg_device_of(x), "CPU") == 0); /* canonical name */
  /* the default device is DEV (CPU unless the environment says otherwise) */
  const char *dev_env = getenv("DEV");
  CHECK(strcmp(tg_default_device(), dev_env && *dev_env ? tg_device_of(tg_ones(NULL, 0, NULL)) : "CPU") == 0);
  tg_tensor y = tg_to(x, "CPU:1");
  CHECK(strcmp(tg_device_of(y), "CPU:1") == 0);
  tg_tensor y2 = tg_mul_s(y, 10); /* computed on CPU:1 */
  CHECK(strcmp(tg_device_of(y2), "CPU:1") == 0);
  tg_tensor back = tg_to(tg_add_s(y2, 1), "cpu");
  CHECK(strcmp(tg_device_of(back), "CPU") == 0);
  CHECK_VALUES(back, 0, 11, 21, 31, 41);
  CHECK_VALUES(y2, 0, 10, 20, 30, 40);
  CHECK(tg_is_realized(y2));
  /* to the same device is the same data */
  tg_tensor same = tg_to(x, "CPU:0");
  CHECK(strcmp(tg_device_of(same), "CPU") == 0);
  CHECK_VALUES(same, 0, 1, 2, 3, 4);
  /* a lazy expression moved: computed on the source, copied */
  tg_tensor lz = tg_to(tg_sqrt(x), "CPU:2");
  CHECK_VALUES(lz, 1e-7, 1, sqrt(2), sqrt(3), 2);
  /* a lazy value copied to another device and used on its own device, realized together */
  tg_tensor sh = tg_mul_s(x, 2);
  tg_tensor there = tg_to(sh, "CPU:1"), here = tg_add_s(sh, 1);
  tg_tensor there_view = tg_to(tg_flip(tg_mul_s(x, 3), TG_AXES(0)), "CPU:1");
  CHECK(tg_realize_many((tg_tensor[]){there, here, there_view}, 3) == TG_OK);
  CHECK_VALUES(there, 0, 2, 4, 6, 8);
  CHECK_VALUES(here, 0, 3, 5, 7, 9);
  CHECK_VALUES(there_view, 0, 12, 9, 6, 3);
  tg_tensor syn = tg_ones(TG_SHAPE(2), TG_OPTS(.device = "CPU:1"));
  CHECK_VALUES(syn, 0, 1, 1);
  CHECK(tg_synchronize("CPU:1") == TG_OK);
  CHECK(tg_synchronize(NULL) == TG_OK);
  END;
}

TEST(assign_in_place) {
  BEGIN;
  const float v[] = {1, 2, 3, 4};
  tg_tensor x = tg_from_data(v, TG_SHAPE(4), TG_OPTS(.dtype = TG_FLOAT32, .device = "CPU"));
  tg_tensor view = tg_reshape(x, TG_SHAPE(2, 2)); /* a view of x's buffer */
  tg_tensor old = tg_mul_s(x, 1);                 /* lazy value of the old contents */
  CHECK(tg_realize(old) == TG_OK);
  tg_tensor a = tg_assign(x, tg_add_s(x, 10));
  CHECK(a.id == x.id);
  CHECK(!tg_is_realized(x));
  CHECK(tg_realize(x) == TG_OK);
  CHECK(tg_is_realized(x));
  CHECK_VALUES(x, 0, 11, 12, 13, 14);
  CHECK_VALUES(old, 0, 1, 2, 3, 4);      /* realized earlier: unchanged */
  CHECK_VALUES(view, 0, 11, 12, 13, 14); /* views of the buffer see the write */
  /* assign casts the value to the target's dtype */
  tg_tensor xi = tg_contiguous(tg_zeros(TG_SHAPE(3), I32));
  CHECK(tg_realize(xi) == TG_OK);
  tg_assign(xi, tg_full(TG_SHAPE(3), 2.7, NULL));
  CHECK(tg_dtype_of(xi) == TG_INT32);
  CHECK_VALUES(xi, 0, 2, 2, 2);
  /* two assigns in a row, realized once */
  tg_assign(x, tg_mul_s(x, 2));
  tg_assign(x, tg_add_s(x, 1));
  CHECK_VALUES(x, 0, 23, 25, 27, 29);
  /* assign to a lazy (unrealized) target realizes it first */
  tg_tensor lz = tg_add_s(tg_zeros(TG_SHAPE(2), NULL), 1);
  tg_assign(lz, tg_full(TG_SHAPE(2), 5, NULL));
  CHECK_VALUES(lz, 0, 5, 5);
  /* errors */
  CHECK(tg_assign(x, tg_ones(TG_SHAPE(3), NULL)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_assign", "(3,)", "(4,)");
  CHECK(tg_assign(x, tg_ones(TG_SHAPE(4), TG_OPTS(.device = "CPU:1"))).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_assign", "CPU:1");
  /* a view of x's buffer writes x (tinygrad's view assign); a broadcast view cannot be written */
  tg_tensor pv = tg_permute(view, TG_AXES(1, 0));
  CHECK(tg_assign(pv, tg_from_data((float[]){1, 2, 3, 4}, TG_SHAPE(2, 2), NULL)).id == pv.id);
  CHECK_VALUES(x, 0, 1, 3, 2, 4);
  CHECK(
      tg_assign(tg_expand(tg_reshape(x, TG_SHAPE(1, 4)), TG_SHAPE(2, 4)), tg_ones(TG_SHAPE(2, 4), NULL)).id ==
      0);
  CHECK_ERR(TG_ERR_INVALID, "expanded");
  END;
}

/* Two creations of one shape are two tensors, as in tinygrad: realized and then assigned, one never
 * changes the other (hash-consing makes them one node until realize). A value computed from buffers
 * and built twice stays one buffer for both handles, as in tinygrad. */
TEST(assign_keeps_equal_creations_apart) {
  BEGIN;
  tg_tensor a = tg_contiguous(tg_zeros(TG_SHAPE(3), NULL)), b = tg_contiguous(tg_zeros(TG_SHAPE(3), NULL));
  CHECK(tg_realize(a) == TG_OK && tg_realize(b) == TG_OK);
  CHECK(tg_realize(tg_assign(a, tg_ones(TG_SHAPE(3), NULL))) == TG_OK);
  CHECK_VALUES(a, 0, 1, 1, 1);
  CHECK_VALUES(b, 0, 0, 0, 0);
  tg_tensor p = tg_zeros(TG_SHAPE(2, 2), NULL), q = tg_zeros(TG_SHAPE(2, 2), NULL), r = tg_zeros(TG_SHAPE(2, 2), NULL);
  tg_tensor pqr[3] = {p, q, r};
  CHECK(tg_realize_many(pqr, 3) == TG_OK);
  tg_assign(q, tg_full(TG_SHAPE(2, 2), 7, NULL));
  CHECK_VALUES(q, 0, 7, 7, 7, 7);
  CHECK_VALUES(p, 0, 0, 0, 0, 0);
  CHECK_VALUES(r, 0, 0, 0, 0, 0);
  tg_tensor i = tg_cast(tg_contiguous(tg_arange(0, 3, 1, NULL)), TG_FLOAT32), j = tg_cast(tg_contiguous(tg_arange(0, 3, 1, NULL)), TG_FLOAT32);
  CHECK(tg_realize(i) == TG_OK && tg_realize(j) == TG_OK);
  tg_assign(i, tg_ones(TG_SHAPE(3), NULL));
  CHECK_VALUES(i, 0, 1, 1, 1);
  CHECK_VALUES(j, 0, 0, 1, 2);
  tg_tensor x = tg_from_data((float[]){1, 2, 3}, TG_SHAPE(3), NULL), y = tg_from_data((float[]){1, 1, 1}, TG_SHAPE(3), NULL);
  tg_tensor c = tg_add(x, y), d = tg_add(x, y);
  CHECK(tg_realize(c) == TG_OK && tg_realize(d) == TG_OK);
  CHECK(tg_realize(tg_assign(c, tg_zeros(TG_SHAPE(3), NULL))) == TG_OK);
  CHECK_VALUES(d, 0, 0, 0, 0);
  END;
}

TEST(assign_reading_target_through_flip) {
  BEGIN;
  const float v[] = {1, 2, 3, 4, 5};
  tg_tensor x = f32(v, TG_SHAPE(5));
  tg_assign(x, tg_flip(x, TG_AXES(0)));
  CHECK_VALUES(x, 0, 5, 4, 3, 2, 1);
  /* 2-D: value reads a transposed target */
  const float m[] = {1, 2, 3, 4};
  tg_tensor y = f32(m, TG_SHAPE(2, 2));
  tg_assign(y, tg_add(tg_transpose(y, 0, 1), y));
  CHECK_VALUES(y, 0, 2, 5, 5, 8);
  /* value reads the target at shifted positions (a running pattern) */
  const float s[] = {1, 2, 3, 4};
  tg_tensor z = f32(s, TG_SHAPE(4));
  tg_tensor shifted = tg_pad(tg_shrink(z, TG_SHAPE(0, 3)), TG_SHAPE(1, 0), 0);
  tg_assign(z, tg_add(z, shifted));
  CHECK_VALUES(z, 0, 1, 3, 5, 7);
  /* from_blob target: the caller's memory ends up flipped */
  float blob[3] = {7, 8, 9};
  tg_tensor b = tg_from_blob(blob, TG_SHAPE(3), F32);
  CHECK(tg_realize(tg_assign(b, tg_flip(b, TG_AXES(0)))) == TG_OK);
  CHECK(blob[0] == 9 && blob[1] == 8 && blob[2] == 7);
  END;
}

TEST(assign_reads_before_write_in_one_schedule) {
  BEGIN;
  /* tinygrad's test_assign_diamond_possible: a lazy read of the old contents, realized in the same
   * schedule as the assign and a read of the new contents, sees the old contents */
  tg_tensor a = tg_contiguous(tg_ones(TG_SHAPE(4), NULL));
  CHECK(tg_realize(a) == TG_OK);
  tg_tensor times_a = tg_mul_s(a, 3);
  tg_assign(a, tg_contiguous(tg_full(TG_SHAPE(4), 2, NULL)));
  tg_tensor nw = tg_add(a, tg_sub_s(times_a, 1));
  CHECK_VALUES(nw, 0, 4, 4, 4, 4);
  CHECK_VALUES(a, 0, 2, 2, 2, 2);
  /* two targets: one needs the assign's result, the other the old contents */
  tg_tensor b = tg_contiguous(tg_arange(0, 4, 1, TG_OPTS(.dtype = TG_FLOAT32)));
  CHECK(tg_realize(b) == TG_OK);
  tg_tensor old_view = tg_mul_s(tg_flip(b, TG_AXES(0)), 10);
  tg_assign(b, tg_add_s(b, 100));
  tg_tensor new_use = tg_mul_s(b, 2);
  CHECK(tg_realize_many((tg_tensor[]){new_use, old_view}, 2) == TG_OK);
  CHECK_VALUES(new_use, 0, 200, 202, 204, 206);
  CHECK_VALUES(old_view, 0, 30, 20, 10, 0);
  CHECK_VALUES(b, 0, 100, 101, 102, 103);
  /* an assign whose value reads only the target needs no copy of the old contents */
  tg_tensor c = tg_contiguous(tg_ones(TG_SHAPE(1000), NULL));
  CHECK(tg_realize(c) == TG_OK);
  tg_assign(c, tg_add_s(c, 1));
  tg_tensor uses = tg_sum(c, TG_ALL_AXES, false);
  tg_global_counters_reset();
  CHECK_VALUES(uses, 0, 2000);
  CHECK(tg_global_counters().kernel_count == 2);
  CHECK(tg_global_counters().global_mem <= 3 * 4000 + 64);
  END;
}

/* tinygrad's clone(device): t = Tensor([1.,2.]); (t*t).sum().backward(); c = t.clone("CPU:1") gives
 * c.device "CPU:1", c.grad.device "CPU:1", c.grad [2, 4] (tinygrad 0.14). */
TEST(clone_to_device) {
  BEGIN;
  tg_tensor x = tg_from_data((const float[]){1, 2, 3}, TG_SHAPE(3), TG_OPTS(.dtype = TG_FLOAT32, .requires_grad = true));
  CHECK(tg_backward(tg_sum(tg_mul(x, x), TG_ALL_AXES, false)) == TG_OK);
  tg_tensor c = tg_clone_to(x, "CPU:1");
  CHECK(strcmp(tg_device_of(c), "CPU:1") == 0);
  CHECK(tg_requires_grad(c));
  tg_tensor gc = tg_grad(c);
  CHECK(gc.id != 0 && strcmp(tg_device_of(gc), "CPU:1") == 0);
  CHECK_VALUES(gc, 1e-6, 2, 4, 6);
  /* NULL or t's own device: still a buffer of its own (tg_to to the same device is t itself) */
  tg_tensor same = tg_clone_to(x, NULL), named = tg_clone_to(x, "CPU"), alias = tg_to(x, "CPU");
  CHECK(strcmp(tg_device_of(same), "CPU") == 0 && strcmp(tg_device_of(named), "CPU") == 0);
  CHECK(tg_grad(same).id != 0 && strcmp(tg_device_of(tg_grad(same)), "CPU") == 0);
  CHECK(tg_realize_many((const tg_tensor[]){c, same, named}, 3) == TG_OK);
  CHECK(tg_realize(tg_assign(x, tg_zeros_like(x, NULL))) == TG_OK);
  CHECK_VALUES(alias, 0, 0, 0, 0);
  CHECK_VALUES(c, 0, 1, 2, 3);
  CHECK_VALUES(same, 0, 1, 2, 3);
  CHECK_VALUES(named, 0, 1, 2, 3);
  /* a lazy tensor without a gradient: none on the clone, requires_grad as t's */
  tg_tensor l = tg_clone_to(tg_add_s(x, 5), "CPU:2");
  CHECK(tg_grad(l).id == 0 && !tg_requires_grad(l));
  CHECK_VALUES(l, 0, 5, 5, 5);
  tg_tensor off = tg_clone_to(tg_set_requires_grad(tg_ones(TG_SHAPE(2), F32), false), "CPU:1");
  CHECK(tg_valid(off) && !tg_requires_grad(off));
  /* false is kept (unset would take a gradient here) */
  CHECK(tg_backward(tg_set_requires_grad(tg_sum(off, TG_ALL_AXES, false), false)) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "requires_grad false");
  tg_tensor unset = tg_clone_to(tg_ones(TG_SHAPE(2), F32), "CPU:1");
  CHECK(tg_backward(tg_set_requires_grad(tg_sum(unset, TG_ALL_AXES, false), false)) == TG_OK);
  CHECK_VALUES(tg_grad(unset), 0, 1, 1);
  /* the clone is differentiable, as tg_clone is */
  tg_tensor w = tg_from_data((const float[]){3, 4}, TG_SHAPE(2), TG_OPTS(.dtype = TG_FLOAT32, .requires_grad = true));
  CHECK(tg_backward(tg_sum(tg_mul_s(tg_clone_to(w, NULL), 2), TG_ALL_AXES, false)) == TG_OK);
  CHECK_VALUES(tg_grad(w), 0, 2, 2);
  CHECK(tg_clone_to(x, "XYZ").id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_clone_to: unknown device 'XYZ'");
  CHECK(tg_clone_to(NONE_T, "CPU:1").id == 0);
  CHECK_ERR(TG_ERR_HANDLE, "tg_clone_to");
  END;
}

TEST(clone_detach_contiguous) {
  BEGIN;
  const float v[] = {1, 2, 3, 4};
  tg_tensor x = f32(v, TG_SHAPE(2, 2));
  tg_tensor c = tg_clone(x);
  CHECK(!tg_is_realized(c));
  CHECK_VALUES(c, 0, 1, 2, 3, 4);
  tg_assign(x, tg_zeros_like(x, NULL));
  CHECK_VALUES(x, 0, 0, 0, 0, 0);
  CHECK_VALUES(c, 0, 1, 2, 3, 4); /* the clone has its own buffer */
  tg_tensor d = tg_detach(c);
  CHECK_VALUES(d, 0, 1, 2, 3, 4);
  tg_tensor ct = tg_contiguous(tg_transpose(c, 0, 1));
  CHECK_VALUES(ct, 0, 1, 3, 2, 4);
  tg_tensor cc = tg_contiguous(c); /* already contiguous: no copy */
  tg_global_counters_reset();
  CHECK(tg_realize(cc) == TG_OK);
  CHECK(kernels() == 0);
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* data out and printing                                                                           */

TEST(data_item_errors) {
  BEGIN;
  const float v[] = {1, 2, 3, 4};
  tg_tensor x = f32(v, TG_SHAPE(4));
  float out[4];
  CHECK(tg_data(x, out, 3 * sizeof(float)) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_data", "12 bytes", "16");
  CHECK(tg_data(x, NULL, 16) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_data", "NULL");
  double d;
  CHECK(tg_item(x, &d) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_item", "(4,)", "4 elements");
  CHECK(tg_item(tg_sum(x, TG_ALL_AXES, false), NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_item", "NULL");
  CHECK(tg_item(tg_sum(x, TG_ALL_AXES, false), &d) == TG_OK && d == 10);
  CHECK(tg_item(tg_reshape(tg_shrink(x, TG_SHAPE(2, 3)), TG_SHAPE(1, 1)), &d) == TG_OK && d == 3);
  int64_t i;
  const int64_t big[] = {(int64_t)1 << 60 | 1};
  CHECK(tg_item_i64(tg_from_data(big, TG_SHAPE(1), TG_OPTS(.dtype = TG_INT64)), &i) == TG_OK);
  CHECK(i == ((int64_t)1 << 60 | 1)); /* exact: not through double */
  const uint64_t ub[] = {UINT64_MAX};
  CHECK(tg_item_i64(tg_from_data(ub, TG_SHAPE(1), TG_OPTS(.dtype = TG_UINT64)), &i) == TG_OK);
  CHECK((uint64_t)i == UINT64_MAX);
  CHECK(tg_item_i64(tg_scalar(-2.0, NULL), &i) == TG_OK && i == -2);
  CHECK(tg_item_i64(x, &i) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_item_i64");
  CHECK(tg_item_i64(x, NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_item_i64", "NULL");
  /* a larger buffer is fine; only numel*itemsize bytes are written */
  float big_out[6] = {-1, -1, -1, -1, -1, -1};
  CHECK(tg_data(tg_flip(x, TG_AXES(0)), big_out, sizeof big_out) == TG_OK);
  CHECK(big_out[0] == 4 && big_out[3] == 1 && big_out[4] == -1 && big_out[5] == -1);
  /* shape / ndim / dim queries */
  int64_t sh[2];
  CHECK(tg_shape(tg_reshape(x, TG_SHAPE(2, 2)), sh) == 2 && sh[0] == 2 && sh[1] == 2);
  CHECK(tg_shape(x, NULL) == -1);
  CHECK_ERR(TG_ERR_INVALID, "tg_shape");
  CHECK(tg_dim(x, 1) == -1);
  CHECK_ERR(TG_ERR_INVALID, "tg_dim", "axis 1");
  END;
}

static void check_string(const char *file, int line, tg_tensor t, const char *want) {
  char *s = tg_to_string(t);
  if (!s || strcmp(s, want) != 0) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL %s:%d: tg_to_string gave \"%s\", expected \"%s\" (%s)\n", file, line,
            s ? s : "(null)", want, tg_last_error() ? tg_last_error() : "");
  }
  free(s);
}
#define CHECK_STRING(t, want) check_string(__FILE__, __LINE__, (t), (want))

TEST(to_string_numpy_format) {
  BEGIN;
  const float v[] = {1, 2, 3, 4, 5};
  tg_tensor t4 = f32(v, TG_SHAPE(5));
  tg_tensor q = tg_log_softmax(tg_relu(tg_mul(tg_mul_s(tg_add_s(t4, 1), 2), t4)), -1);
  CHECK_STRING(q, "[-56. -48. -36. -20.   0.]");
  CHECK_STRING(t4, "[1. 2. 3. 4. 5.]");
  CHECK_STRING(tg_arange(0, 6, 1, NULL), "[0 1 2 3 4 5]");
  CHECK_STRING(tg_reshape(tg_arange(0, 6, 1, NULL), TG_SHAPE(2, 3)), "[[0 1 2]\n [3 4 5]]");
  CHECK_STRING(tg_div_s(t4, 4), "[0.25 0.5  0.75 1.   1.25]");
  CHECK_STRING(tg_gt_s(t4, 2), "[False False  True  True  True]");
  CHECK_STRING(tg_scalar(5, NULL), "5.0");
  CHECK_STRING(tg_zeros(TG_SHAPE(0), NULL), "[]");
  CHECK_STRING(tg_neg(tg_arange(0, 3, 1, TG_OPTS(.dtype = TG_INT8))), "[ 0 -1 -2]");
  CHECK_STRING(tg_cast(tg_div_s(t4, 3), TG_FLOAT16), "[0.3333 0.6665 1.     1.333  1.667 ]");
  CHECK(tg_print(t4) == TG_OK);
  CHECK(tg_to_string(NONE_T) == NULL);
  CHECK_ERR(TG_ERR_HANDLE, "tg_to_string");
  CHECK(tg_print(NONE_T) == TG_ERR_HANDLE);
  CHECK_ERR(TG_ERR_HANDLE);
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* errors: each returns none / a status and names the function and the offending shapes/values    */

TEST(error_broadcast) {
  BEGIN;
  tg_tensor a = tg_ones(TG_SHAPE(3, 4), NULL), b = tg_ones(TG_SHAPE(5), NULL);
  CHECK(tg_add(a, b).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_add: shapes (3, 4) and (5,) cannot broadcast");
  CHECK(tg_where(tg_gt_s(a, 0), a, b).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_where", "(5,)", "cannot broadcast");
  CHECK(tg_lt(b, a).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_lt", "(5,)", "(3, 4)");
  tg_tensor c = tg_ones(TG_SHAPE(2, 2, 4), NULL);
  CHECK(tg_mul(a, c).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_mul", "(3, 4)", "(2, 2, 4)");
  /* broadcastable shapes are fine */
  CHECK_SHAPE(tg_add(tg_ones(TG_SHAPE(3, 1), NULL), tg_ones(TG_SHAPE(2, 1, 4), NULL)), 2, 3, 4);
  CHECK(tg_last_error() == NULL);
  END;
}

TEST(error_axes) {
  BEGIN;
  tg_tensor a = tg_ones(TG_SHAPE(3, 4), NULL);
  CHECK(tg_sum(a, TG_AXES(5), false).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_sum", "axis 5", "2-d");
  CHECK(tg_max(a, TG_AXES(-3), false).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_max", "axis -3");
  CHECK(tg_sum(a, TG_AXES(1, -1), false).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_sum", "axis -1 appears twice");
  CHECK(tg_mean(a, TG_AXES(0, 0), false).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_mean", "twice");
  CHECK(tg_softmax(a, 2).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_softmax", "axis 2");
  CHECK(tg_sum(a, NULL, 1, false).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_sum", "NULL");
  CHECK(tg_transpose(a, 0, 2).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_transpose", "axis 2");
  CHECK(tg_unsqueeze(a, 4).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_unsqueeze", "axis 4");
  CHECK(tg_flip(a, TG_AXES(0, 0)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_flip", "twice");
  CHECK(tg_flatten(a, 1, 0).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_flatten");
  END;
}

TEST(error_reshape_permute_expand) {
  BEGIN;
  tg_tensor a = tg_ones(TG_SHAPE(3, 4), NULL);
  CHECK(tg_reshape(a, TG_SHAPE(5, 2)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_reshape", "(3, 4)", "(5, 2)", "12");
  CHECK(tg_reshape(a, TG_SHAPE(-1, -1)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_reshape", "only one dimension can be -1");
  CHECK(tg_reshape(a, TG_SHAPE(5, -1)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_reshape", "-1", "(3, 4)");
  CHECK(tg_reshape(a, TG_SHAPE(-2, -6)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_reshape", "negative");
  CHECK(tg_permute(a, TG_AXES(0)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_permute", "(3, 4)");
  CHECK(tg_permute(a, TG_AXES(1, 1)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_permute", "twice");
  CHECK(tg_permute(a, TG_AXES(0, 2)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_permute", "axis 2");
  CHECK(tg_expand(a, TG_SHAPE(3, 5)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_expand", "(3, 4)", "(3, 5)");
  CHECK(tg_expand(a, TG_SHAPE(4)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_expand", "(3, 4)");
  CHECK(tg_expand(tg_ones(TG_SHAPE(3, 1), NULL), TG_SHAPE(3, -2)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_expand");
  CHECK(tg_matmul(a, tg_scalar(1, NULL)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_matmul");
  END;
}

/* tinygrad's sum(dtype=), prod(dtype=), squeeze(), shrink_to, pad_to and clamp with tensor bounds */
TEST(tinygrad_forms_sum_dtype_squeeze_to_clamp) {
  BEGIN;
  const int8_t i8[4] = {100, 100, 100, -3};
  tg_tensor a = tg_from_data(i8, TG_SHAPE(4), TG_OPTS(.dtype = TG_INT8));
  CHECK(tg_dtype_of(tg_sum(a, NULL, 0, false)) == TG_INT32);
  tg_tensor s8 = tg_sum_dtype(a, NULL, 0, false, TG_INT8); /* 297 wraps in int8: 41 */
  CHECK(tg_dtype_of(s8) == TG_INT8);
  CHECK_VALUES(s8, 0, 41);
  CHECK_VALUES(tg_sum_dtype(a, NULL, 0, false, TG_FLOAT32), 0, 297);
  CHECK_VALUES(tg_prod_dtype(tg_arange(1, 6, 1, NULL), NULL, 0, false, TG_FLOAT64), 0, 120);
  CHECK(tg_dtype_of(tg_prod_dtype(a, NULL, 0, false, TG_INT64)) == TG_INT64);
  CHECK(!tg_valid(tg_sum_dtype(a, NULL, 0, false, (tg_dtype)99)));
  CHECK_ERR(TG_ERR_INVALID, "tg_sum_dtype", "invalid dtype 99");
  tg_tensor z = tg_zeros(TG_SHAPE(2, 1, 3, 1), NULL);
  CHECK_SHAPE(tg_squeeze_all(z), 2, 3);
  CHECK_SHAPE(tg_squeeze_all(tg_zeros(TG_SHAPE(1, 1), NULL)));
  tg_tensor m = tg_reshape(tg_arange(0, 12, 1, NULL), TG_SHAPE(3, 4));
  CHECK_SHAPE(tg_shrink_to(m, TG_SHAPE(2, -1)), 2, 4);
  CHECK_VALUES(tg_shrink_to(m, TG_SHAPE(1, 2)), 0, 0, 1);
  tg_tensor p = tg_pad_to(m, TG_SHAPE(-1, 5), 9);
  CHECK_SHAPE(p, 3, 5);
  CHECK_VALUES(tg_shrink(p, TG_SHAPE(0, 1, 0, 5)), 0, 0, 1, 2, 3, 9);
  CHECK(!tg_valid(tg_pad_to(m, TG_SHAPE(2, 4), 0)));
  CHECK_ERR(TG_ERR_INVALID, "tg_pad_to", "dim 0", "cannot pad to 2");
  CHECK(!tg_valid(tg_shrink_to(m, TG_SHAPE(3))));
  CHECK_ERR(TG_ERR_INVALID, "tg_shrink_to", "shape has 1 dims");
  const float xv[4] = {-2, 0.5f, 3, 7}, lo[4] = {-1, 1, 1, 1}, hi = 4;
  tg_tensor x = tg_from_data(xv, TG_SHAPE(4), NULL), l = tg_from_data(lo, TG_SHAPE(4), NULL),
            h = tg_from_data(&hi, TG_SHAPE(1), NULL);
  CHECK_VALUES(tg_clamp_t(x, l, h), 0, -1, 1, 3, 4);
  CHECK_VALUES(tg_clamp_t(x, (tg_tensor){0}, h), 0, -2, 0.5, 3, 4);
  CHECK(!tg_valid(tg_clamp_t(x, (tg_tensor){0}, (tg_tensor){0})));
  CHECK_ERR(TG_ERR_INVALID, "tg_clamp_t", "at least one");
  END;
}

/* a pad value an integer or bool tensor cannot hold promotes it to DEFAULT_FLOAT (tinygrad's where
 * with a Python float); a whole value keeps the dtype, wrapping into it when it is past its range
 * (tinygrad's where with a Python int, PyTorch's F.pad, and this library's tg_where_s and tg_full) */
TEST(pad_value_promotes) {
  BEGIN;
  tg_tensor i = tg_arange(0, 3, 1, NULL);
  tg_tensor p = tg_pad(i, TG_SHAPE(1, 1), 1.5);
  CHECK(tg_dtype_of(p) == TG_FLOAT32);
  CHECK_VALUES(p, 0, 1.5, 0, 1, 2, 1.5);
  CHECK(tg_dtype_of(tg_pad(i, TG_SHAPE(1, 1), 7)) == TG_INT32);
  CHECK_VALUES(tg_pad(i, TG_SHAPE(1, 0), 7), 0, 7, 0, 1, 2);
  tg_tensor b = tg_pad(tg_gt_s(i, 0), TG_SHAPE(0, 1), 0.5);
  CHECK(tg_dtype_of(b) == TG_FLOAT32);
  CHECK_VALUES(b, 0, 0, 1, 1, 0.5);
  CHECK(tg_dtype_of(tg_pad(i, TG_SHAPE(0, 1), NAN)) == TG_FLOAT32);
  /* a whole number past the dtype wraps (tinygrad: int32 padded with 3000000000 holds -1294967296;
   * uint8 with -1 holds 255, int8 with 300 holds 44), and a bool padded with 2 is int32 (it was True) */
  tg_tensor big = tg_pad(i, TG_SHAPE(0, 1), 3e9);
  CHECK(tg_dtype_of(big) == TG_INT32);
  CHECK_VALUES(big, 0, 0, 1, 2, -1294967296.0);
  tg_tensor u8 = tg_pad(tg_cast(i, TG_UINT8), TG_SHAPE(1, 1), -1);
  CHECK(tg_dtype_of(u8) == TG_UINT8);
  CHECK_VALUES(u8, 0, 255, 0, 1, 2, 255);
  tg_tensor i8 = tg_pad(tg_cast(i, TG_INT8), TG_SHAPE(0, 1), 300);
  CHECK(tg_dtype_of(i8) == TG_INT8);
  CHECK_VALUES(i8, 0, 0, 1, 2, 44);
  tg_tensor w = tg_where_s(tg_gt_s(tg_cast(i, TG_UINT8), 5), tg_cast(i, TG_UINT8), -1);
  CHECK_VALUES(w, 0, 255, 255, 255);
  tg_tensor i64 = tg_pad(tg_cast(i, TG_INT64), TG_SHAPE(0, 1), 9223372036854775808.0);
  CHECK(tg_dtype_of(i64) == TG_INT64);
  tg_tensor b2 = tg_pad(tg_gt_s(i, 0), TG_SHAPE(0, 1), 2);
  CHECK(tg_dtype_of(b2) == TG_INT32);
  CHECK_VALUES(b2, 0, 0, 1, 1, 2);
  CHECK(tg_dtype_of(tg_pad(tg_gt_s(i, 0), TG_SHAPE(0, 1), 1)) == TG_BOOL);
  END;
}

TEST(error_pad_shrink) {
  BEGIN;
  tg_tensor a = tg_ones(TG_SHAPE(3, 4), NULL);
  CHECK(tg_shrink(a, TG_SHAPE(0, 4, 0, 4)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_shrink", "(0, 4)", "dim 0", "(3, 4)");
  CHECK(tg_shrink(a, TG_SHAPE(2, 1, 0, 4)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_shrink", "(2, 1)");
  CHECK(tg_shrink(a, TG_SHAPE(-1, 2, 0, 4)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_shrink", "(-1, 2)");
  CHECK(tg_shrink(a, TG_SHAPE(0, 1)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_shrink", "expected 4 bounds", "got 2");
  CHECK(tg_pad(a, TG_SHAPE(1, 1), 0).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_pad", "expected 4 pads", "got 2");
  CHECK(tg_pad(a, TG_SHAPE(-2, -2, 0, 0), 0).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_pad", "(-2, -2)", "dim 0");
  CHECK(tg_pad(a, TG_SHAPE(0, 0, (int64_t)1 << 50, 0), 0).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_pad", "out of range");
  CHECK(tg_pad(a, TG_SHAPE(-5, 10, 0, 0), 0).id == 0); /* cuts 5 of 3 rows (a net growth is no excuse) */
  CHECK_ERR(TG_ERR_INVALID, "tg_pad", "(-5, 10)");
  CHECK(tg_pad(a, TG_SHAPE(INT64_MIN, 0, 0, 0), 0).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_pad", "out of range");
  CHECK(tg_pad(a, TG_SHAPE((int64_t)1 << 39, (int64_t)1 << 39, (int64_t)1 << 39, 0), 0).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_pad", "too many elements");
  CHECK(tg_flip(a, NULL, 1).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_flip", "NULL");
  END;
}

TEST(error_dtype_and_null) {
  BEGIN;
  float v[2] = {1, 2};
  CHECK(tg_from_data(v, TG_SHAPE(2), TG_OPTS(.dtype = (tg_dtype)99)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_from_data", "invalid dtype 99");
  CHECK(tg_ones(TG_SHAPE(2), TG_OPTS(.dtype = (tg_dtype)-3)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_ones: invalid dtype -3");
  CHECK(tg_zeros(TG_SHAPE(2), TG_OPTS(.dtype = TG_DTYPE_COUNT)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "invalid dtype");
  CHECK(tg_scalar(1, TG_OPTS(.dtype = (tg_dtype)99)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_scalar", "99");
  CHECK(tg_arange(0, 3, 1, TG_OPTS(.dtype = (tg_dtype)99)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_arange", "99");
  CHECK(tg_from_data(NULL, TG_SHAPE(2), F32).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_from_data", "NULL");
  CHECK(tg_from_data(v, NULL, 2, F32).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_from_data", "shape is NULL");
  CHECK(tg_ones(NULL, 1, NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_ones", "NULL");
  CHECK(tg_reshape(tg_ones(TG_SHAPE(2), NULL), NULL, 1).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_reshape", "NULL");
  tg_tensor t = f32(v, TG_SHAPE(2));
  CHECK(tg_data(t, NULL, 8) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_data", "NULL");
  CHECK(tg_context_set(NULL, "1") == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_context_set");
  CHECK(tg_context_set("DEBUG", "1") == TG_ERR_INVALID); /* no open context */
  CHECK_ERR(TG_ERR_INVALID, "tg_context_set", "tg_context_begin");
  tg_context_end();
  CHECK_ERR(TG_ERR_INVALID, "tg_context_end");
  CHECK(tg_getenv_int(NULL, 5) == 5);
  CHECK_ERR(TG_ERR_INVALID, "tg_getenv_int");
  END;
}

TEST(error_bad_shapes) {
  BEGIN;
  CHECK(tg_zeros(TG_SHAPE(3, -1), NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_zeros", "negative dimension -1", "(3, -1)");
  CHECK(tg_empty(TG_SHAPE((int64_t)1 << 40, (int64_t)1 << 40), NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_empty", "(1099511627776, 1099511627776)", "too large");
  CHECK(tg_rand(TG_SHAPE(INT64_MAX, 2), NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_rand", "too large");
  CHECK(tg_randn(TG_SHAPE(-5), NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_randn", "-5");
  float v[1] = {0};
  CHECK(tg_from_data(v, (const int64_t[]){1}, -1, F32).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_from_data", "ndim -1");
  CHECK(tg_from_blob(v, TG_SHAPE((int64_t)1 << 62, 8), F32).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_from_blob", "too large");
  CHECK(tg_reshape(tg_ones(TG_SHAPE(2), NULL), TG_SHAPE((int64_t)1 << 40, (int64_t)1 << 40, 1 << 30)).id ==
        0);
  CHECK_ERR(TG_ERR_INVALID, "tg_reshape");
  CHECK(tg_expand(tg_ones(TG_SHAPE(1, 1), NULL), TG_SHAPE((int64_t)1 << 40, (int64_t)1 << 40)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_expand", "(1099511627776, 1099511627776)", "too many elements");
  CHECK(tg_eye(-1, 0, NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_eye", "-1");
  CHECK(tg_eye(3, -3, NULL).id == 0); /* m is always the column count, never "none" */
  CHECK_ERR(TG_ERR_INVALID, "tg_eye", "m=-3");
  CHECK(tg_arange(0, 1e30, 1, NULL).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_arange");
  END;
}

TEST(error_devices) {
  BEGIN;
  CHECK(tg_ones(TG_SHAPE(2), TG_OPTS(.device = "GPU:7")).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_ones: unknown device 'GPU:7'", "CPU");
  CHECK(tg_zeros(TG_SHAPE(2), TG_OPTS(.device = "XYZ")).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_zeros: unknown device 'XYZ'");
  CHECK(tg_from_data((float[]){1}, TG_SHAPE(1), TG_OPTS(.device = "CPU:x")).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_from_data", "CPU:x");
  CHECK(tg_arange(0, 3, 1, TG_OPTS(.device = "XYZ")).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_arange", "XYZ");
  CHECK(tg_rand(TG_SHAPE(3), TG_OPTS(.device = "XYZ")).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_rand", "XYZ");
  tg_tensor a = tg_ones(TG_SHAPE(2), TG_OPTS(.device = "CPU"));
  CHECK(tg_ones_like(a, TG_OPTS(.device = "XYZ")).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_ones_like", "XYZ");
  CHECK(tg_to(a, "XYZ").id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_to: unknown device 'XYZ'");
  CHECK(tg_synchronize("XYZ") == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_synchronize", "XYZ");
  /* a device error after an earlier one keeps the earlier message */
  CHECK(tg_reshape(a, TG_SHAPE(3)).id == 0);
  CHECK(tg_to(a, "XYZ").id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_reshape");
  tg_tensor b = tg_ones(TG_SHAPE(2), TG_OPTS(.device = "CPU:1"));
  CHECK(tg_add(a, b).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_add", "different devices", "CPU", "CPU:1");
  CHECK(tg_matmul(tg_ones(TG_SHAPE(2, 2), TG_OPTS(.device = "CPU")),
                  tg_ones(TG_SHAPE(2, 2), TG_OPTS(.device = "CPU:1")))
            .id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_matmul", "different devices");
  CHECK(tg_where(tg_gt_s(a, 0), a, b).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_where", "CPU:1");
  END;
}

TEST(error_bitwise_on_floats) {
  BEGIN;
  tg_tensor f = tg_ones(TG_SHAPE(2), NULL), i = tg_ones(TG_SHAPE(2), I32);
  CHECK(tg_bitwise_and(f, f).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_bitwise_and", "float");
  CHECK(tg_bitwise_xor(i, f).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_bitwise_xor", "float");
  CHECK(tg_lshift(f, i).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_lshift");
  CHECK(tg_idiv(f, f).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_idiv", "float");
  CHECK(tg_sub(tg_gt_s(f, 0), tg_gt_s(f, 0)).id == 0);
  CHECK_ERR(TG_ERR_INVALID, "tg_sub", "bool");
  CHECK_VALUES(tg_bitwise_or(i, i), 0, 1, 1);
  END;
}

static int g_uniq;

TEST(error_compile_failure) {
  BEGIN;
  /* an expression no earlier kernel used, so neither cache can already hold its kernel */
  double k = 1.0 + (double)(++g_uniq) * 0.0001220703125;
  const float v[] = {1, 2, 3};
  tg_tensor x = f32(v, TG_SHAPE(3));
  tg_tensor y = tg_mul_s(tg_sin(x), k);
  tg_context_begin();
  CHECK(tg_context_set("CC", "/nonexistent/cc") == TG_OK);
  CHECK(tg_context_set("DISABLE_COMPILER_CACHE", "1") == TG_OK);
  tg_status st = tg_realize(y);
  CHECK(st == TG_ERR_COMPILE);
  CHECK(tg_last_status() == TG_ERR_COMPILE);
  CHECK_STR_CONTAINS(tg_last_error(), "/nonexistent/cc");
  CHECK(!tg_is_realized(y));
  tg_clear_error();
  float out[3];
  CHECK(tg_data(y, out, sizeof out) == TG_ERR_COMPILE);
  CHECK(tg_last_error() != NULL);
  tg_clear_error();
  tg_context_end();
  /* the library keeps working, and the same tensor realizes with the real compiler */
  CHECK(tg_realize(y) == TG_OK);
  CHECK_VALUES(y, 1e-6, sin(1) * k, sin(2) * k, sin(3) * k);
  END;
}

TEST(error_then_library_keeps_working) {
  BEGIN;
  tg_tensor a = tg_ones(TG_SHAPE(3, 4), NULL);
  CHECK(tg_add(a, tg_ones(TG_SHAPE(5), NULL)).id == 0);
  CHECK(tg_last_error() != NULL);
  /* the first error is kept: a later one does not overwrite it */
  CHECK(tg_reshape(a, TG_SHAPE(7)).id == 0);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_add");
  CHECK(tg_last_status() == TG_ERR_INVALID);
  tg_clear_error();
  CHECK(tg_last_error() == NULL);
  CHECK(tg_last_status() == TG_OK);
  /* a fresh error is recorded after the clear */
  CHECK(tg_reshape(a, TG_SHAPE(7)).id == 0);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_reshape");
  tg_clear_error();
  /* valid ops still work, even while an error is recorded */
  CHECK(tg_sum(a, TG_AXES(9), false).id == 0);
  CHECK_VALUES(tg_sum(a, TG_ALL_AXES, false), 0, 12);
  tg_clear_error();
  CHECK_VALUES(tg_sum(tg_mul_s(a, 2), TG_AXES(1), false), 0, 8, 8, 8);
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* Context and GlobalCounters                                                                      */

TEST(context_overrides_restore) {
  BEGIN;
  int64_t d0 = tg_getenv_int("DEBUG", 0);
  tg_context_begin();
  CHECK(tg_context_set_int("DEBUG", 3) == TG_OK);
  CHECK(tg_getenv_int("DEBUG", 0) == 3);
  tg_context_begin();
  CHECK(tg_context_set("DEBUG", "0") == TG_OK);
  CHECK(tg_getenv_int("DEBUG", 0) == 0);
  CHECK(tg_context_set("DEBUG", "1") == TG_OK); /* re-set in the same level */
  CHECK(tg_getenv_int("DEBUG", 0) == 1);
  tg_context_end();
  CHECK(tg_getenv_int("DEBUG", 0) == 3);
  tg_context_end();
  CHECK(tg_getenv_int("DEBUG", 0) == d0);
  /* settings nobody set: the default */
  CHECK(tg_getenv_int("TG_TEST_NOT_A_SETTING", 17) == 17);
  tg_context_begin();
  tg_context_set("TG_TEST_NOT_A_SETTING", "not a number");
  CHECK(tg_getenv_int("TG_TEST_NOT_A_SETTING", 17) == 17);
  tg_context_set("TG_TEST_NOT_A_SETTING", "12");
  CHECK(tg_getenv_int("TG_TEST_NOT_A_SETTING", 17) == 12);
  tg_context_end();
  CHECK(tg_getenv_int("TG_TEST_NOT_A_SETTING", 17) == 17);
  /* DEBUG=2 measures kernel time; with it off the time stays 0 */
  const float v[] = {1, 2, 3};
  tg_tensor x = f32(v, TG_SHAPE(3));
  tg_context_begin();
  tg_context_set("DEBUG", "2");
  tg_global_counters_reset();
  CHECK_VALUES(tg_add_s(tg_mul_s(x, 7), 0.25), 0, 7.25, 14.25, 21.25);
  tg_counters c = tg_global_counters();
  CHECK(c.kernel_count == 1);
  CHECK(c.time_sum_s > 0);
  tg_context_end();
  tg_global_counters_reset();
  CHECK_VALUES(tg_add_s(tg_mul_s(x, 7), 0.5), 0, 7.5, 14.5, 21.5);
  c = tg_global_counters();
  CHECK(c.kernel_count == 1);
  CHECK(c.time_sum_s == 0);
  END;
}

TEST(global_counters) {
  BEGIN;
  tg_global_counters_reset();
  tg_counters c = tg_global_counters();
  CHECK(c.kernel_count == 0 && c.global_ops == 0 && c.global_mem == 0 && c.time_sum_s == 0);
  tg_tensor x = tg_contiguous(tg_full(TG_SHAPE(1000), 2, NULL));
  CHECK(tg_realize(x) == TG_OK);
  tg_global_counters_reset();
  tg_tensor y = tg_add(tg_mul(x, x), x);
  CHECK(tg_realize(y) == TG_OK);
  c = tg_global_counters();
  CHECK(c.kernel_count == 1);
  CHECK_MSG(c.global_mem >= 8000 && c.global_mem <= 8000 + 64, "global_mem %llu",
            (unsigned long long)c.global_mem);
  CHECK_MSG(c.global_ops >= 2000, "global_ops %llu", (unsigned long long)c.global_ops);
  CHECK_VALUES(tg_sum(y, TG_ALL_AXES, false), 0, 6000);
  tg_global_counters_reset();
  c = tg_global_counters();
  CHECK(c.kernel_count == 0 && c.global_mem == 0 && c.global_ops == 0);
  /* compile_count counts in-memory cache misses: a repeated kernel compiles once */
  tg_global_counters_reset();
  double k = 3.0 + (double)(++g_uniq) * 0.0009765625;
  tg_tensor z1 = tg_mul_s(x, k);
  CHECK(tg_realize(z1) == TG_OK);
  uint64_t cc1 = tg_global_counters().compile_count;
  tg_tensor z2 = tg_mul_s(tg_add_s(x, 0), k); /* same kernel again */
  tg_tensor z3 = tg_mul_s(tg_contiguous(tg_full(TG_SHAPE(1000), 2, NULL)), k);
  CHECK(tg_realize_many((tg_tensor[]){z2, z3}, 2) == TG_OK);
  CHECK(tg_global_counters().compile_count <= cc1 + 1);
  END;
}


/* tg_cat of many small tensors: linear in the total size (it was cubic: 2000 one-element tensors
 * took minutes), a bounded number of kernels, exact values, and a backward through it. */
/* A float16 softmax sums its exponentials as tg_sum does (in float32, one rounding to float16 at the
 * end: tinygrad's e.sum()), so it equals e * (1 / sum(e)) written out with tg_sum, bit for bit,
 * with and without optimizations (summed in float16, 128 values of e differ in the last bits). */
TEST(half_softmax_sums_in_float32) {
  BEGIN;
  enum { R = 64, N = 128 };
  float *xv = malloc(sizeof(float) * R * N);
  uint32_t st = 12345;
  for (int i = 0; i < R * N; i++) st = st * 1664525u + 1013904223u, xv[i] = (float)(st >> 8) / (float)(1 << 24) * 8 - 4;
  for (int noopt = 0; noopt < 2; noopt++) {
    tg_context_begin();
    if (noopt) tg_context_set_int("NOOPT", 1);
    tg_tensor x = tg_contiguous(tg_cast(tg_from_data(xv, TG_SHAPE(R, N), TG_OPTS(.dtype = TG_FLOAT32)), TG_FLOAT16));
    tg_tensor e = tg_exp(tg_sub(x, tg_max(x, TG_AXES(1), true)));
    tg_tensor want = tg_mul(e, tg_reciprocal(tg_sum(e, TG_AXES(1), true)));
    uint16_t *a = malloc(2 * R * N), *b = malloc(2 * R * N);
    CHECK(tg_data(tg_softmax(x, 1), a, 2 * R * N) == TG_OK && tg_data(want, b, 2 * R * N) == TG_OK);
    int bad = 0;
    for (int i = 0; i < R * N; i++) bad += a[i] != b[i];
    CHECK_MSG(bad == 0, "%s: %d of %d differ from e * (1 / tg_sum(e))", noopt ? "NOOPT" : "default", bad, R * N);
    free(a), free(b);
    tg_context_end();
  }
  free(xv);
  END;
}

TEST(cat_many_tensors) {
  BEGIN;
  enum { N = 2000 };
  tg_tensor *ts = malloc(sizeof(tg_tensor) * N);
  for (int i = 0; i < N; i++) {
    float v = (float)i;
    ts[i] = tg_from_data(&v, TG_SHAPE(1), TG_OPTS(.dtype = TG_FLOAT32, .requires_grad = true));
  }
  double t0 = tt_now_s();
  tg_counters c0 = tg_global_counters();
  tg_tensor c = tg_cat(ts, N, 0);
  int64_t sh[2] = {0};
  CHECK(tg_shape(c, sh) == 1 && sh[0] == N);
  float *out = malloc(sizeof(float) * N);
  CHECK(tg_data(c, out, sizeof(float) * N) == TG_OK);
  uint64_t kernels = tg_global_counters().kernel_count - c0.kernel_count;
  int bad = 0;
  for (int i = 0; i < N; i++) bad += out[i] != (float)i;
  CHECK_MSG(bad == 0, "%d wrong values", bad);
  CHECK_MSG(kernels <= N / 31 + 4, "%llu kernels for a cat of %d tensors", (unsigned long long)kernels, N);
  /* d/dx_i sum(cat(x) * w) = w[i] */
  tg_tensor w = tg_arange(0, N, 1, TG_OPTS(.dtype = TG_FLOAT32));
  tg_tensor loss = tg_sum(tg_mul(c, tg_mul(w, tg_scalar(0.5, NULL))), TG_ALL_AXES, false);
  CHECK(tg_backward(loss) == TG_OK);
  /* the gradients, read through one more cat (one realize instead of 2000) */
  tg_tensor *gs = malloc(sizeof(tg_tensor) * N);
  for (int i = 0; i < N; i++) gs[i] = tg_grad(ts[i]);
  CHECK(tg_data(tg_cat(gs, N, 0), out, sizeof(float) * N) == TG_OK);
  bad = 0;
  for (int i = 0; i < N; i++) bad += out[i] != 0.5f * (float)i;
  CHECK_MSG(bad == 0, "%d wrong gradients", bad);
  free(gs);
  double dt = tt_now_s() - t0;
  printf("  cat of %d one-element tensors, forward and backward: %.2f s, %llu forward kernels\n", N, dt,
         (unsigned long long)kernels);
  CHECK_MSG(dt < 60, "took %.1f s", dt);
  /* bool (OR instead of add) and a ragged tail: 70 tensors of 1..3 elements along dim 1 */
  tg_tensor bs[70];
  int64_t want = 0;
  for (int i = 0; i < 70; i++) {
    int64_t k = 1 + i % 3;
    bool v[2 * 3];
    for (int j = 0; j < 2 * k; j++) v[j] = (i + j) % 2;
    bs[i] = tg_from_data(v, TG_SHAPE(2, k), TG_OPTS(.dtype = TG_BOOL));
    want += k;
  }
  tg_tensor cb = tg_cat(bs, 70, 1);
  CHECK(tg_shape(cb, sh) == 2 && sh[0] == 2 && sh[1] == want);
  bool *bv = malloc((size_t)(2 * want));
  CHECK(tg_data(cb, bv, (size_t)(2 * want)) == TG_OK);
  bad = 0;
  for (int r = 0; r < 2; r++) {
    int64_t col = 0;
    for (int i = 0; i < 70; i++) {
      int64_t k = 1 + i % 3;
      for (int j = 0; j < k; j++, col++) bad += bv[r * want + col] != (bool)((i + r * k + j) % 2);
    }
  }
  CHECK_MSG(bad == 0, "%d wrong bool values", bad);
  free(bv), free(out), free(ts);
  END;
}

/* Writes through two views of one realized tensor: the second builds on the first, whatever is read
 * first (the second used to start from the buffer alone and drop the first). */
static bool vals_are(tg_tensor t, const float *want, int n) {
  float o[8];
  if (tg_data(t, o, sizeof(float) * (size_t)n) != TG_OK) return false;
  for (int i = 0; i < n; i++)
    if (o[i] != want[i]) return false;
  return true;
}

TEST(assigns_through_two_views) {
  BEGIN;
  tg_tensor x = tg_zeros(TG_SHAPE(4), NULL);
  CHECK(tg_realize(x) == TG_OK);
  tg_tensor v = tg_shrink(x, (int64_t[]){0, 2}, 2), w = tg_shrink(x, (int64_t[]){2, 4}, 2);
  tg_assign(v, tg_full(TG_SHAPE(2), 5, NULL));
  tg_assign(w, tg_full(TG_SHAPE(2), 7, NULL));
  CHECK(vals_are(x, (const float[]){5, 5, 7, 7}, 4));
  /* each value reads the other view's pending write */
  tg_tensor y = tg_zeros(TG_SHAPE(4), NULL);
  CHECK(tg_realize(y) == TG_OK);
  tg_tensor a = tg_shrink(y, (int64_t[]){0, 2}, 2), b = tg_shrink(y, (int64_t[]){2, 4}, 2);
  tg_assign(a, tg_add_s(b, 1));
  tg_assign(b, tg_add_s(a, 10));
  CHECK(tg_realize(b) == TG_OK);
  CHECK(vals_are(y, (const float[]){1, 1, 11, 11}, 4));
  CHECK(vals_are(a, (const float[]){1, 1}, 2));
  /* a view of a tensor with a pending whole-tensor assign writes into it, not into a copy */
  tg_tensor z = tg_zeros(TG_SHAPE(4), NULL);
  CHECK(tg_realize(z) == TG_OK);
  tg_assign(z, tg_full(TG_SHAPE(4), 5, NULL));
  tg_tensor zv = tg_shrink(z, (int64_t[]){0, 2}, 2);
  tg_assign(zv, tg_add_s(zv, 1));
  CHECK(vals_are(z, (const float[]){6, 6, 5, 5}, 4));
  END;
}

/* a handle that is the tensor under another name (a full shrink, a same-shape reshape, tg_to its own
 * device, tg_detach): an assign through it is a write of the tensor, seen by graphs built after it
 * and kept when the alias is freed before the tensor is read (it was lost, or seen by tg_data only) */
TEST(assign_through_aliases) {
  BEGIN;
  for (int k = 0; k < 8; k++) {
    tg_scope_begin();
    tg_tensor x = tg_full(TG_SHAPE(2, 4), 1, NULL);
    CHECK(tg_realize(x) == TG_OK);
    tg_scope_begin();
    int a = k % 4;
    tg_tensor v = a == 0 ? tg_shrink(x, TG_SHAPE(0, 2, 0, 4)) : a == 1 ? tg_reshape(x, TG_SHAPE(2, 4)) : a == 2 ? tg_to(x, "CPU") : tg_detach(x);
    CHECK(tg_valid(tg_assign(v, tg_add_s(tg_mul_s(v, 10), 1))));
    if (k < 4) {
      tg_tensor y = tg_mul_s(x, 2); /* built after the write */
      float o[8] = {0};
      CHECK_MSG(tg_data(y, o, sizeof o) == TG_OK && o[0] == 22 && o[7] == 22, "alias %d: x*2 = %g", a, o[0]);
    } else {
      CHECK(tg_realize(x) == TG_OK); /* x itself, then the alias goes */
    }
    tg_scope_end(); /* the alias is freed */
    CHECK_MSG(vals_are(x, (const float[]){11, 11, 11, 11, 11, 11, 11, 11}, 8), "alias %d (%s)", a, k < 4 ? "x*2 read" : "x realized");
    tg_scope_end();
  }
  END;
}

/* QR and SVD of fp8 run in float32 and come back in the fp8 dtype: the singular values are the true
 * ones rounded to fp8 (tg_svd wrote 2-byte selector entries into a buffer of 1-byte ones) */
TEST(svd_qr_fp8) {
  BEGIN;
  const float v[9] = {1, 2, 0, 0.5f, 3, 1, 2, 0, 1}; /* singular values 3.9216, 2.0809, 0.7352 */
  const tg_dtype dts[2] = {TG_FP8E5M2, TG_FP8E4M3};
  for (int k = 0; k < 2; k++) {
    tg_tensor x = tg_cast(f32(v, TG_SHAPE(3, 3)), dts[k]);
    tg_tensor u, s, vt, q, r;
    CHECK(tg_svd(x, false, &u, &s, &vt) == TG_OK);
    CHECK(tg_dtype_of(u) == dts[k] && tg_dtype_of(s) == dts[k] && tg_dtype_of(vt) == dts[k]);
    CHECK_VALUES(s, 0, 4, 2, 0.75);
    tg_tensor us = tg_mul(tg_cast(u, TG_FLOAT32), tg_unsqueeze(tg_cast(s, TG_FLOAT32), -2));
    CHECK_VALUES(tg_matmul(us, tg_cast(vt, TG_FLOAT32)), 0.25, 1, 2, 0, 0.5, 3, 1, 2, 0, 1);
    CHECK(tg_qr(x, &q, &r) == TG_OK);
    CHECK(tg_dtype_of(q) == dts[k] && tg_dtype_of(r) == dts[k]);
    CHECK_VALUES(tg_matmul(tg_cast(q, TG_FLOAT32), tg_cast(r, TG_FLOAT32)), 0.25, 1, 2, 0, 0.5, 3, 1, 2, 0, 1);
  }
  END;
}

int main(void) { return RUN_TESTS(); }
