/*
 * test_helpers.c -- errors, settings and Context, dtypes and promotion, float16/bfloat16 bits,
 * host value conversions, numpy-style formatting, hashing, the string builder and counters.
 * Expected format strings were produced by numpy (print of the same array).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "runtime/threadpool.h"
#include "schedule/schedule.h"
#include "test.h"

/* ---- errors ---- */

TEST(error_first_wins) {
  tg_clear_error();
  CHECK(tg_last_error() == NULL);
  CHECK(tg_last_status() == TG_OK);
  CHECK(!tg_has_error());
  CHECK(tg_set_error(TG_ERR_INVALID, "tg_add: shapes (%d,%d) and (%d,) cannot broadcast", 3, 4, 5) ==
        TG_ERR_INVALID);
  CHECK(tg_set_error(TG_ERR_COMPILE, "second") == TG_ERR_COMPILE);
  CHECK(tg_has_error());
  CHECK(tg_last_status() == TG_ERR_INVALID);
  CHECK(tg_last_error() && strcmp(tg_last_error(), "tg_add: shapes (3,4) and (5,) cannot broadcast") == 0);
  tg_clear_error();
  CHECK(tg_last_error() == NULL);
  CHECK(tg_last_status() == TG_OK);
  tg_set_error(TG_ERR_IO, "%s", "after clear");
  CHECK(tg_last_status() == TG_ERR_IO);
  CHECK(tg_last_error() && strcmp(tg_last_error(), "after clear") == 0);
  tg_clear_error();
}

TEST(error_long_message_kept_whole) {
  size_t n = 200000;
  char *big = malloc(n + 1);
  for (size_t i = 0; i < n; i++) big[i] = (char)('a' + i % 26);
  big[n] = '\0';
  tg_clear_error();
  tg_set_error(TG_ERR_COMPILE, "cc failed:\n%s", big);
  const char *e = tg_last_error();
  CHECK(e && strlen(e) == n + 11);
  CHECK(e && strcmp(e + 11, big) == 0);
  tg_clear_error();
  tg_set_error(TG_ERR_INVALID, "short");
  CHECK(tg_last_error() && strcmp(tg_last_error(), "short") == 0);
  tg_clear_error();
  free(big);
}

static void *thread_errors(void *arg) {
  (void)arg;
  int ok = tg_last_error() == NULL; /* the main thread's error is not visible here */
  tg_set_error(TG_ERR_RUNTIME, "from thread");
  ok = ok && tg_last_status() == TG_ERR_RUNTIME;
  tg_context_begin(); /* left open on purpose: thread exit must release it */
  tg_context_set("TG_TEST_THREAD_ONLY", "9");
  ok = ok && getenv_int("TG_TEST_THREAD_ONLY", 0) == 9;
  return ok ? (void *)1 : NULL;
}

TEST(error_and_context_are_thread_local) {
  tg_clear_error();
  tg_set_error(TG_ERR_INVALID, "main");
  pthread_t th;
  void *ret = NULL;
  CHECK(pthread_create(&th, NULL, thread_errors, NULL) == 0);
  pthread_join(th, &ret);
  CHECK(ret == (void *)1);
  CHECK(tg_last_status() == TG_ERR_INVALID);
  CHECK(strcmp(tg_last_error(), "main") == 0);
  CHECK(getenv_int("TG_TEST_THREAD_ONLY", 0) == 0);
  tg_clear_error();
}

/* ---- settings ---- */

/* Runs fn with stderr redirected; what it wrote is left in out. */
static void capture_stderr(void (*fn)(void), char *out, size_t n) {
  tt_stderr_begin();
  fn();
  char *e = tt_stderr_end();
  snprintf(out, n, "%s", e);
  free(e);
}

static int64_t g_bad_int;
static tg_dtype g_bad_float;
static void read_bad_settings(void) {
  g_bad_int = getenv_int("TG_TEST_ENV_GARBAGE", 3);
  getenv_int("TG_TEST_ENV_GARBAGE", 3); /* reported once */
  tg_context_begin();
  tg_context_set("DEFAULT_FLOAT", "int8");
  g_bad_float = tg_default_float();
  tg_context_end();
}

/* a setting that is not a number (or not a float dtype) is ignored, and said so once on stderr */
TEST(bad_settings_are_reported) {
  setenv("TG_TEST_ENV_GARBAGE", "abc", 1);
  char out[1024];
  capture_stderr(read_bad_settings, out, sizeof out);
  CHECK(g_bad_int == 3);
  CHECK(g_bad_float == TG_FLOAT32);
  CHECK_MSG(strstr(out, "ignoring TG_TEST_ENV_GARBAGE=abc (not an integer); using 3") != NULL, "stderr: %s", out);
  CHECK_MSG(strstr(out, "ignoring DEFAULT_FLOAT=int8") != NULL, "stderr: %s", out);
  char *first = strstr(out, "TG_TEST_ENV_GARBAGE");
  CHECK(first && !strstr(first + 1, "TG_TEST_ENV_GARBAGE"));
}

static int64_t g_range;
static void read_range_setting(void) { g_range = getenv_int_in("TG_TEST_ENV_RANGE", 50, 8, 100); }

static int64_t g_depth[2];
static void read_depth_settings(void) {
  tg_context_begin();
  tg_context_set("DEPTH_SPLIT", "abc");
  g_depth[0] = schedule_depth_bound();
  tg_context_set("DEPTH_SPLIT", "3");
  g_depth[1] = getenv_int_in("DEPTH_SPLIT", 256, 8, 100000);
  tg_context_end();
}

/* a setting that is not a number names the default actually used (DEPTH_SPLIT said 0 and used 256),
 * and one outside its range is clamped and said so */
TEST(out_of_range_settings_are_reported) {
  char out[1024];
  capture_stderr(read_depth_settings, out, sizeof out);
  CHECK(g_depth[0] == 256 && g_depth[1] == 8);
  CHECK_MSG(strstr(out, "ignoring DEPTH_SPLIT=abc (not an integer); using 256") != NULL, "stderr: %s", out);
  setenv("TG_TEST_ENV_RANGE", "3", 1);
  capture_stderr(read_range_setting, out, sizeof out);
  CHECK(g_range == 8);
  CHECK_MSG(strstr(out, "ignoring TG_TEST_ENV_RANGE=3 (outside 8..100); using 8") != NULL, "stderr: %s", out);
}

static tg_status add_one(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_add_s(in[0], 1);
  return TG_OK;
}
static float g_jit_out;
static tg_status g_conv_st;
static void read_jit_image_settings(void) {
  tg_context_begin();
  tg_context_set("JIT", "99999999999");
  tg_context_set("IMAGE", "7");
  tg_jit *j = tg_jit_new(add_one, 1, NULL);
  tg_scope_begin();
  tg_tensor x = tg_contiguous(tg_full(TG_SHAPE(1), 2, NULL)), out;
  tg_realize(x);
  for (int k = 0; k < 3; k++)
    if (tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK) tg_data(out, &g_jit_out, sizeof g_jit_out);
    else fprintf(stderr, "jit: %s\n", tg_last_error());
  tg_tensor c = tg_conv2d(tg_ones(TG_SHAPE(1, 1, 4, 4), NULL), tg_ones(TG_SHAPE(1, 1, 3, 3), NULL), (tg_tensor){0}, NULL);
  g_conv_st = tg_realize(c);
  tg_scope_end();
  tg_jit_free(j);
  tg_context_end();
}

/* JIT and IMAGE take 0..2, as tinygrad's: a value past that is clamped and said so */
TEST(jit_and_image_levels_are_checked) {
  char out[1024];
  capture_stderr(read_jit_image_settings, out, sizeof out);
  CHECK_MSG(g_jit_out == 3 && g_conv_st == TG_OK, "jit out %g, conv %d; stderr: %s", g_jit_out, (int)g_conv_st, out);
  CHECK_MSG(strstr(out, "ignoring JIT=99999999999 (outside 0..2); using 2") != NULL, "stderr: %s", out);
  CHECK_MSG(strstr(out, "ignoring IMAGE=7 (outside 0..2); using 2") != NULL, "stderr: %s", out);
}

static int g_threads[4];
static void read_thread_settings(void) {
  g_threads[0] = tp_threads_setting(3, 2);
  g_threads[2] = tp_threads_setting(1000000000, 2); /* (the pool once tried to start this many) */
  g_threads[1] = tp_threads_setting(0, 2); /* (reported too, but a setting's first report is its only one) */
  g_threads[3] = tp_threads_setting(1000, 200);
}

/* THREADS is taken as given up to 8 per CPU (at least 256), capped and reported past that */
TEST(threads_setting_is_capped) {
  char out[1024];
  capture_stderr(read_thread_settings, out, sizeof out);
  CHECK(g_threads[0] == 3 && g_threads[1] == 1 && g_threads[2] == 256 && g_threads[3] == 1000);
  CHECK_MSG(strstr(out, "ignoring THREADS=1000000000") && strstr(out, "using 256"), "stderr: %s", out);
}

TEST(getenv_reads_environment_once) {
  setenv("TG_TEST_ENV_INT", "42", 1);
  setenv("TG_TEST_ENV_BAD", "4x2", 1);
  setenv("TG_TEST_ENV_OCT", " 010 ", 1);
  setenv("TG_TEST_ENV_STR", "hello", 1);
  CHECK(getenv_int("TG_TEST_ENV_INT", -1) == 42);
  CHECK(tg_getenv_int("TG_TEST_ENV_INT", -1) == 42);
  CHECK(getenv_int("TG_TEST_ENV_BAD", -1) == -1);
  CHECK(getenv_int("TG_TEST_ENV_OCT", -1) == 10); /* decimal, like int() */
  CHECK(getenv_int("TG_TEST_ENV_UNSET", 7) == 7);
  CHECK(strcmp(getenv_str("TG_TEST_ENV_STR", "x"), "hello") == 0);
  CHECK(strcmp(getenv_str("TG_TEST_ENV_UNSET", "dflt"), "dflt") == 0);
  /* cached like tinygrad's getenv: later changes to the environment are not seen */
  setenv("TG_TEST_ENV_INT", "43", 1);
  CHECK(getenv_int("TG_TEST_ENV_INT", -1) == 42);
}

TEST(context_nesting_and_restore) {
  tg_clear_error();
  int base = debug_level();
  CHECK(base == (int)getenv_int("DEBUG", 0));
  setenv("TG_TEST_CTX", "3", 1);
  CHECK(getenv_int("TG_TEST_CTX", 0) == 3);
  tg_context_begin();
  CHECK(debug_level() == base); /* an empty level changes nothing */
  CHECK(tg_context_set_int("DEBUG", base + 4) == TG_OK);
  CHECK(tg_context_set("TG_TEST_CTX", "5") == TG_OK);
  CHECK(debug_level() == base + 4);
  CHECK(getenv_int("TG_TEST_CTX", 0) == 5);
  const char *outer = getenv_str("TG_TEST_CTX", NULL);
  tg_context_begin();
  CHECK(tg_context_set("TG_TEST_CTX", "7") == TG_OK);
  CHECK(debug_level() == base + 4); /* not overridden at this level: the outer value holds */
  CHECK(tg_context_set_int("DEBUG", 6) == TG_OK);
  CHECK(debug_level() == 6);
  CHECK(tg_getenv_int("DEBUG", 0) == 6);
  CHECK(getenv_int("TG_TEST_CTX", 0) == 7);
  CHECK(tg_context_set("TG_TEST_CTX", "8") == TG_OK); /* re-set in the same level */
  CHECK(getenv_int("TG_TEST_CTX", 0) == 8);
  tg_context_end();
  CHECK(debug_level() == base + 4);
  CHECK(getenv_int("TG_TEST_CTX", 0) == 5);
  CHECK(outer && strcmp(outer, "5") == 0); /* still valid: its level is open */
  tg_context_set("TG_TEST_CTX", "not a number");
  CHECK(getenv_int("TG_TEST_CTX", -3) == -3);
  tg_context_end();
  CHECK(debug_level() == base);
  CHECK(getenv_int("TG_TEST_CTX", 0) == 3);
  CHECK(tg_last_error() == NULL);
}

TEST(context_misuse_is_an_error) {
  tg_clear_error();
  CHECK(tg_context_set("DEBUG", "2") == TG_ERR_INVALID);
  CHECK(tg_last_error() &&
        strcmp(tg_last_error(), "tg_context_set: no open context (call tg_context_begin first)") == 0);
  tg_clear_error();
  CHECK(tg_context_set_int("DEBUG", 2) == TG_ERR_INVALID);
  tg_clear_error();
  tg_context_end();
  CHECK(tg_last_status() == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_context_end");
  tg_clear_error();
  tg_context_begin();
  CHECK(tg_context_set(NULL, "1") == TG_ERR_INVALID);
  tg_context_end();
  tg_clear_error();
}

TEST(context_set_int_formats) {
  tg_context_begin();
  tg_context_set_int("TG_TEST_INT", -42);
  CHECK(strcmp(getenv_str("TG_TEST_INT", ""), "-42") == 0);
  tg_context_set_int("TG_TEST_INT", INT64_MIN);
  CHECK(getenv_int("TG_TEST_INT", 0) == INT64_MIN);
  tg_context_end();
  CHECK(strcmp(getenv_str("TG_TEST_INT", "none"), "none") == 0);
}

TEST(default_float) {
  tg_context_begin();
  tg_context_set("DEFAULT_FLOAT", "HALF");
  CHECK(tg_default_float() == TG_FLOAT16);
  tg_context_set("DEFAULT_FLOAT", "float16");
  CHECK(tg_default_float() == TG_FLOAT16);
  tg_context_set("DEFAULT_FLOAT", "bfloat16");
  CHECK(tg_default_float() == TG_BFLOAT16);
  tg_context_set("DEFAULT_FLOAT", "double");
  CHECK(tg_default_float() == TG_FLOAT64);
  tg_context_set("DEFAULT_FLOAT", "Float32");
  CHECK(tg_default_float() == TG_FLOAT32);
  tg_context_set("DEFAULT_FLOAT", "int32");
  CHECK(tg_default_float() == TG_FLOAT32);
  tg_context_set("DEFAULT_FLOAT", "nonsense");
  CHECK(tg_default_float() == TG_FLOAT32);
  tg_context_end();
}

/* ---- dtypes ---- */

TEST(dtype_table) {
  static const char *names[] = {"default", "bool", "char",  "short", "int",      "long",  "uchar",
                                "ushort",  "uint", "ulong", "half",  "bfloat16", "float", "double",
                                "float8_e4m3", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"};
  static const size_t sizes[] = {0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 1, 1, 1, 1};
  _Static_assert(sizeof names / sizeof *names == TG_DTYPE_COUNT, "a name per dtype");
  _Static_assert(sizeof sizes / sizeof *sizes == TG_DTYPE_COUNT, "a size per dtype");
  for (int d = 0; d < TG_DTYPE_COUNT; d++) {
    CHECK_MSG(strcmp(tg_dtype_name((tg_dtype)d), names[d]) == 0, "dtype %d name %s", d,
              tg_dtype_name((tg_dtype)d));
    CHECK(tg_dtype_itemsize((tg_dtype)d) == sizes[d]);
    if (d) {
      CHECK(dtype_from_name(names[d]) == (tg_dtype)d);
      CHECK(dtype_info((tg_dtype)d) && dtype_info((tg_dtype)d)->itemsize == (int)sizes[d]);
      CHECK(dtype_info((tg_dtype)d)->cname != NULL);
    }
  }
  CHECK(strcmp(tg_dtype_name(TG_DTYPE_COUNT), "invalid") == 0);
  CHECK(tg_dtype_itemsize((tg_dtype)99) == 0);
  CHECK(dtype_info(TG_DTYPE_DEFAULT) == NULL && !dtype_valid(TG_DTYPE_DEFAULT));
  CHECK(!dtype_valid((tg_dtype)-1));
  CHECK(tg_dtype_is_float(TG_BFLOAT16) && tg_dtype_is_float(TG_FLOAT16) && !tg_dtype_is_float(TG_INT32));
  CHECK(tg_dtype_is_int(TG_UINT8) && tg_dtype_is_int(TG_INT64) && !tg_dtype_is_int(TG_BOOL));
  CHECK(!tg_dtype_is_int(TG_FLOAT32));
  CHECK(tg_dtype_is_unsigned(TG_UINT64) && !tg_dtype_is_unsigned(TG_INT8) && !tg_dtype_is_unsigned(TG_BOOL));
  CHECK(dtype_from_name("float32") == TG_FLOAT32 && dtype_from_name("FLOAT32") == TG_FLOAT32);
  CHECK(dtype_from_name("float16") == TG_FLOAT16 && dtype_from_name("__bf16") == TG_BFLOAT16);
  CHECK(dtype_from_name("int64") == TG_INT64 && dtype_from_name("uint8") == TG_UINT8);
  CHECK(dtype_from_name("unsigned int") == TG_UINT32 && dtype_from_name("signed char") == TG_INT8);
  CHECK(dtype_from_name("float128") == TG_DTYPE_DEFAULT && dtype_from_name(NULL) == TG_DTYPE_DEFAULT);
  CHECK(strcmp(dtype_info(TG_FLOAT16)->cname, "_Float16") == 0);
  CHECK(dtype_info(TG_INT8)->kind == 'i' && dtype_info(TG_UINT16)->kind == 'u');
  CHECK(dtype_info(TG_BOOL)->kind == 'b' && dtype_info(TG_BFLOAT16)->kind == 'f');
  /* tinygrad's attribute names of the fp8 dtypes, and their DType names, round trip */
  static const struct {
    const char *attr, *name;
    tg_dtype dt;
  } fp8[] = {{"fp8e4m3", "float8_e4m3", TG_FP8E4M3},
             {"fp8e5m2", "float8_e5m2", TG_FP8E5M2},
             {"fp8e4m3fnuz", "float8_e4m3fnuz", TG_FP8E4M3FNUZ},
             {"fp8e5m2fnuz", "float8_e5m2fnuz", TG_FP8E5M2FNUZ}};
  for (size_t i = 0; i < sizeof fp8 / sizeof *fp8; i++) {
    CHECK(dtype_from_name(fp8[i].attr) == fp8[i].dt && dtype_from_name(fp8[i].name) == fp8[i].dt);
    CHECK(strcmp(tg_dtype_name(fp8[i].dt), fp8[i].name) == 0 && dtype_from_name(tg_dtype_name(fp8[i].dt)) == fp8[i].dt);
    CHECK(tg_dtype_is_float(fp8[i].dt) && !tg_dtype_is_int(fp8[i].dt) && tg_dtype_itemsize(fp8[i].dt) == 1);
    CHECK(dtype_is_fp8(fp8[i].dt) && dtype_sum_acc(fp8[i].dt) == TG_FLOAT32);
  }
  CHECK(dtype_from_name("FP8E4M3FNUZ") == TG_FP8E4M3FNUZ && dtype_from_name("float8_e4m3fn") == TG_FP8E4M3);
  CHECK(!dtype_is_fp8(TG_FLOAT16) && !dtype_is_fp8(TG_UINT8) && !dtype_is_fp8(TG_DTYPE_COUNT));
  CHECK(dtype_mant_bits(TG_FP8E4M3FNUZ) == 3 && dtype_mant_bits(TG_FP8E5M2FNUZ) == 2);
  CHECK(dtype_mant_bits(TG_BFLOAT16) == 7 && dtype_mant_bits(TG_FLOAT16) == 10 && dtype_mant_bits(TG_FLOAT32) == 0);
}

TEST(dtype_promotion) {
  struct {
    tg_dtype a, b, want;
  } cases[] = {
      {TG_INT32, TG_FLOAT16, TG_FLOAT16},
      {TG_BOOL, TG_INT8, TG_INT8},
      {TG_UINT8, TG_INT8, TG_INT16},
      {TG_FLOAT16, TG_BFLOAT16, TG_FLOAT32},
      {TG_UINT32, TG_INT32, TG_INT64},
      {TG_UINT8, TG_INT16, TG_INT16},
      {TG_INT16, TG_UINT16, TG_INT32},
      {TG_UINT16, TG_INT32, TG_INT32},
      {TG_UINT32, TG_INT64, TG_INT64},
      {TG_BOOL, TG_UINT8, TG_UINT8},
      {TG_BOOL, TG_BOOL, TG_BOOL},
      {TG_FLOAT16, TG_FLOAT32, TG_FLOAT32},
      {TG_FLOAT32, TG_FLOAT64, TG_FLOAT64},
      {TG_INT64, TG_FLOAT16, TG_FLOAT16},
      {TG_UINT64, TG_BFLOAT16, TG_BFLOAT16},
      {TG_UINT8, TG_UINT64, TG_UINT64},
      {TG_BOOL, TG_FLOAT64, TG_FLOAT64},
      {TG_INT8, TG_INT64, TG_INT64},
      /* a signed int meets uint64 only at the (weak) float: the default float */
      {TG_UINT64, TG_INT64, TG_FLOAT32},
      {TG_INT8, TG_UINT64, TG_FLOAT32},
  };
  tg_context_begin(); /* the test must not depend on DEFAULT_FLOAT in the environment */
  tg_context_set("DEFAULT_FLOAT", "float32");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tg_dtype r1 = tg_dtype_promote(cases[i].a, cases[i].b), r2 = tg_dtype_promote(cases[i].b, cases[i].a);
    CHECK_MSG(r1 == cases[i].want && r2 == cases[i].want, "promote(%s,%s) = %s/%s, want %s",
              tg_dtype_name(cases[i].a), tg_dtype_name(cases[i].b), tg_dtype_name(r1), tg_dtype_name(r2),
              tg_dtype_name(cases[i].want));
  }
  /* the fnuz fp8s against every dtype (bool .. fp8e5m2fnuz, enum order): tinygrad 0.14's
   * least_upper_dtype. Every integer meets them at themselves, any other fp8 at half. */
  static const tg_dtype fnuz[2] = {TG_FP8E4M3FNUZ, TG_FP8E5M2FNUZ};
  static const tg_dtype fnuz_row[2][TG_DTYPE_COUNT - 1] = {
      {TG_FP8E4M3FNUZ, TG_FP8E4M3FNUZ, TG_FP8E4M3FNUZ, TG_FP8E4M3FNUZ, TG_FP8E4M3FNUZ, TG_FP8E4M3FNUZ,
       TG_FP8E4M3FNUZ, TG_FP8E4M3FNUZ, TG_FP8E4M3FNUZ, TG_FLOAT16, TG_BFLOAT16, TG_FLOAT32, TG_FLOAT64, TG_FLOAT16,
       TG_FLOAT16, TG_FP8E4M3FNUZ, TG_FLOAT16},
      {TG_FP8E5M2FNUZ, TG_FP8E5M2FNUZ, TG_FP8E5M2FNUZ, TG_FP8E5M2FNUZ, TG_FP8E5M2FNUZ, TG_FP8E5M2FNUZ,
       TG_FP8E5M2FNUZ, TG_FP8E5M2FNUZ, TG_FP8E5M2FNUZ, TG_FLOAT16, TG_BFLOAT16, TG_FLOAT32, TG_FLOAT64, TG_FLOAT16,
       TG_FLOAT16, TG_FLOAT16, TG_FP8E5M2FNUZ},
  };
  for (int i = 0; i < 2; i++)
    for (int b = 1; b < TG_DTYPE_COUNT; b++) {
      tg_dtype r1 = tg_dtype_promote(fnuz[i], (tg_dtype)b), r2 = tg_dtype_promote((tg_dtype)b, fnuz[i]);
      CHECK_MSG(r1 == fnuz_row[i][b - 1] && r2 == r1, "promote(%s,%s) = %s/%s, want %s", tg_dtype_name(fnuz[i]),
                tg_dtype_name((tg_dtype)b), tg_dtype_name(r1), tg_dtype_name(r2), tg_dtype_name(fnuz_row[i][b - 1]));
    }
  tg_context_set("DEFAULT_FLOAT", "half");
  CHECK(tg_dtype_promote(TG_INT64, TG_UINT64) == TG_FLOAT16);
  tg_context_end();
  /* lattice laws over every pair */
  for (int a = 1; a < TG_DTYPE_COUNT; a++) {
    CHECK(tg_dtype_promote((tg_dtype)a, (tg_dtype)a) == (tg_dtype)a);
    for (int b = 1; b < TG_DTYPE_COUNT; b++) {
      tg_dtype r = tg_dtype_promote((tg_dtype)a, (tg_dtype)b);
      CHECK(r == tg_dtype_promote((tg_dtype)b, (tg_dtype)a));
      CHECK(tg_dtype_promote((tg_dtype)a, r) == r && tg_dtype_promote((tg_dtype)b, r) == r);
    }
  }
  tg_clear_error();
  CHECK(tg_dtype_promote(TG_DTYPE_DEFAULT, TG_INT32) == TG_DTYPE_DEFAULT);
  CHECK(tg_last_status() == TG_ERR_INVALID);
  tg_clear_error();
  CHECK(tg_dtype_promote(TG_INT32, (tg_dtype)77) == TG_DTYPE_DEFAULT);
  tg_clear_error();
}

TEST(dtype_sum_acc_and_limits) {
  CHECK(dtype_sum_acc(TG_BOOL) == TG_INT32 && dtype_sum_acc(TG_INT8) == TG_INT32);
  CHECK(dtype_sum_acc(TG_INT16) == TG_INT32 && dtype_sum_acc(TG_INT64) == TG_INT64);
  CHECK(dtype_sum_acc(TG_UINT8) == TG_UINT32 && dtype_sum_acc(TG_UINT16) == TG_UINT32);
  CHECK(dtype_sum_acc(TG_UINT64) == TG_UINT64 && dtype_sum_acc(TG_FLOAT16) == TG_FLOAT32);
  CHECK(dtype_sum_acc(TG_BFLOAT16) == TG_FLOAT32 && dtype_sum_acc(TG_FLOAT64) == TG_FLOAT64);
  CHECK(dtype_min(TG_FLOAT32) == -INFINITY && dtype_max(TG_FLOAT16) == INFINITY);
  CHECK(dtype_min(TG_INT8) == -128 && dtype_max(TG_INT8) == 127);
  CHECK(dtype_min(TG_UINT32) == 0 && dtype_max(TG_UINT32) == 4294967295.0);
  CHECK(dtype_min(TG_INT32) == -2147483648.0 && dtype_max(TG_INT16) == 32767);
  CHECK(dtype_min(TG_BOOL) == 0 && dtype_max(TG_BOOL) == 1);
  CHECK(dtype_min(TG_INT64) == -9223372036854775808.0);
  /* the fp8s without inf: their largest finite values */
  CHECK(dtype_min(TG_FP8E4M3) == -448 && dtype_max(TG_FP8E5M2) == INFINITY);
  CHECK(dtype_min(TG_FP8E4M3FNUZ) == -240 && dtype_max(TG_FP8E4M3FNUZ) == 240);
  CHECK(dtype_min(TG_FP8E5M2FNUZ) == -57344 && dtype_max(TG_FP8E5M2FNUZ) == 57344);
}

/* ---- float16 / bfloat16 ---- */

static float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

TEST(half_bits) {
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_half(-2.0f) == 0xc000);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65519.0f) == 0x7bff);
  CHECK(float_to_half(65520.0f) == 0x7c00); /* halfway to the next binade rounds to inf */
  CHECK(float_to_half(1e10f) == 0x7c00);
  CHECK(float_to_half(INFINITY) == 0x7c00 && float_to_half(-INFINITY) == 0xfc00);
  uint16_t n = float_to_half(NAN);
  CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
  CHECK(float_to_half(0.0f) == 0x0000 && float_to_half(-0.0f) == 0x8000);
  CHECK(float_to_half(ldexpf(1, -24)) == 0x0001);                         /* smallest subnormal */
  CHECK(float_to_half(ldexpf(1, -25)) == 0x0000);                         /* tie between 0 and 2^-24: even */
  CHECK(float_to_half(ldexpf(3, -26)) == 0x0001);                         /* 0.75 * 2^-24 rounds up */
  CHECK(float_to_half(ldexpf(3, -25)) == 0x0002);                         /* 1.5 * 2^-24: tie to even (2) */
  CHECK(float_to_half(ldexpf(1, -14)) == 0x0400);                         /* smallest normal */
  CHECK(float_to_half(ldexpf(1023, -24)) == 0x03ff);                      /* largest subnormal */
  CHECK(float_to_half(1.0f + ldexpf(1, -11)) == 0x3c00);                  /* tie, even stays */
  CHECK(float_to_half(1.0f + ldexpf(3, -11)) == 0x3c02);                  /* tie, odd rounds up */
  CHECK(float_to_half(1.0f + ldexpf(1, -11) + ldexpf(1, -20)) == 0x3c01); /* above the tie */
  CHECK(float_to_half(0.1f) == 0x2e66);
  CHECK(half_to_float(0x3c00) == 1.0f && half_to_float(0x7bff) == 65504.0f);
  CHECK(half_to_float(0x0001) == ldexpf(1, -24) && half_to_float(0x8000) == 0.0f &&
        signbit(half_to_float(0x8000)));
  CHECK(isinf(half_to_float(0xfc00)) && half_to_float(0xfc00) < 0 && isnan(half_to_float(0x7e00)));
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = half_to_float((uint16_t)h);
    if (isnan(f))
      bad += !isnan(half_to_float(float_to_half(f)));
    else
      bad += float_to_half(f) != h;
  }
  CHECK(bad == 0);
}

TEST(bf16_bits) {
  CHECK(float_to_bf16(1.0f) == 0x3f80 && float_to_bf16(-2.0f) == 0xc000);
  CHECK(float_to_bf16(1.0f + ldexpf(1, -8)) == 0x3f80); /* tie, even stays */
  CHECK(float_to_bf16(1.0f + ldexpf(3, -8)) == 0x3f82); /* tie, odd rounds up */
  CHECK(float_to_bf16(1.0f + ldexpf(1, -8) + ldexpf(1, -20)) == 0x3f81);
  CHECK(float_to_bf16(INFINITY) == 0x7f80 && float_to_bf16(-INFINITY) == 0xff80);
  CHECK(float_to_bf16(f32_from_bits(0x7f7fffff)) == 0x7f80); /* FLT_MAX rounds to inf */
  uint16_t n = float_to_bf16(NAN);
  CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
  CHECK(float_to_bf16(f32_from_bits(0x00010000)) == 0x0001); /* subnormal kept */
  CHECK(float_to_bf16(f32_from_bits(0x00008000)) == 0x0000); /* tie to even */
  CHECK(float_to_bf16(f32_from_bits(0x00018000)) == 0x0002);
  CHECK(bf16_to_float(0x3f80) == 1.0f && bf16_to_float(0x4049) == 3.140625f);
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = bf16_to_float((uint16_t)h);
    if (isnan(f))
      bad += !isnan(bf16_to_float(float_to_bf16(f)));
    else
      bad += float_to_bf16(f) != h;
  }
  CHECK(bad == 0);
}

/* ---- host value <-> storage ---- */

TEST(dtype_store_load) {
  unsigned char buf[8];
  for (int d = 1; d < TG_DTYPE_COUNT; d++) {
    dtype_store((tg_dtype)d, buf, 3.0);
    CHECK_MSG(dtype_load((tg_dtype)d, buf) == (d == TG_BOOL ? 1.0 : 3.0), "dtype %s",
              tg_dtype_name((tg_dtype)d));
    CHECK(dtype_load_i64((tg_dtype)d, buf) == (d == TG_BOOL ? 1 : 3));
    dtype_store_i64((tg_dtype)d, buf, 5);
    CHECK(dtype_load_i64((tg_dtype)d, buf) == (d == TG_BOOL ? 1 : 5));
  }
  dtype_store(TG_UINT8, buf, 300.0);
  CHECK(dtype_load_i64(TG_UINT8, buf) == 44);
  dtype_store(TG_UINT8, buf, -1.0);
  CHECK(dtype_load_i64(TG_UINT8, buf) == 255);
  dtype_store(TG_INT8, buf, -3.7);
  CHECK(dtype_load(TG_INT8, buf) == -3.0);
  dtype_store(TG_INT32, buf, NAN);
  CHECK(dtype_load_i64(TG_INT32, buf) == 0);
  dtype_store(TG_INT64, buf, 1e30); /* saturates instead of undefined behaviour */
  CHECK(dtype_load_i64(TG_INT64, buf) == INT64_MAX);
  dtype_store(TG_UINT64, buf, 18446744073709549568.0);
  CHECK((uint64_t)dtype_load_i64(TG_UINT64, buf) == 18446744073709549568ULL);
  dtype_store(TG_BOOL, buf, NAN);
  CHECK(dtype_load(TG_BOOL, buf) == 1.0);
  dtype_store(TG_BOOL, buf, 0.0);
  CHECK(dtype_load(TG_BOOL, buf) == 0.0);
  dtype_store(TG_FLOAT16, buf, 65520.0);
  CHECK(isinf(dtype_load(TG_FLOAT16, buf)));
  dtype_store(TG_FLOAT16, buf, 0.1);
  CHECK(dtype_load(TG_FLOAT16, buf) == 0.0999755859375);
  dtype_store(TG_BFLOAT16, buf, 3.14159);
  CHECK(dtype_load(TG_BFLOAT16, buf) == 3.140625);
  /* 64-bit integers never pass through double */
  dtype_store_i64(TG_INT64, buf, INT64_MAX);
  CHECK(dtype_load_i64(TG_INT64, buf) == INT64_MAX);
  dtype_store_i64(TG_INT64, buf, (1LL << 53) + 1);
  CHECK(dtype_load_i64(TG_INT64, buf) == (1LL << 53) + 1);
  dtype_store_i64(TG_UINT64, buf, -1);
  CHECK(dtype_load(TG_UINT64, buf) == 18446744073709551616.0);
  CHECK(dtype_load_i64(TG_UINT64, buf) == -1);
  dtype_store_i64(TG_UINT8, buf, 257);
  CHECK(dtype_load_i64(TG_UINT8, buf) == 1);
  dtype_store_i64(TG_INT16, buf, 40000);
  CHECK(dtype_load_i64(TG_INT16, buf) == 40000 - 65536);
  dtype_store_i64(TG_FLOAT32, buf, (1LL << 24) + 1);
  CHECK(dtype_load(TG_FLOAT32, buf) == 16777216.0);
  /* 2^60 + 2^52 + 1 is just above a bfloat16 tie; rounding through double would land on the tie */
  dtype_store_i64(TG_BFLOAT16, buf, (1LL << 60) + (1LL << 52) + 1);
  uint16_t bits;
  memcpy(&bits, buf, 2);
  CHECK(bits == 0x5d81);
  dtype_store_i64(TG_FLOAT16, buf, -70000);
  CHECK(dtype_load(TG_FLOAT16, buf) == -INFINITY);
  dtype_store(TG_FLOAT64, buf, 0.1);
  CHECK(dtype_load(TG_FLOAT64, buf) == 0.1);
  dtype_store(TG_FLOAT32, buf, -2.5);
  CHECK(dtype_load_i64(TG_FLOAT32, buf) == -2);
}

/* ---- formatting (expected strings from numpy's print) ---- */

static void check_format(const void *data, tg_dtype dt, const int64_t *shape, int ndim, const char *want,
                         int line) {
  char *got = format_array(data, dt, shape, ndim);
  if (!got || strcmp(got, want) != 0) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL %s:%d: format_array\n--- got\n%s\n--- want\n%s\n", __FILE__, line,
            got ? got : "(null)", want);
  }
  free(got);
}
#define CHECK_FORMAT(data, dt, shape, ndim, want) check_format(data, dt, shape, ndim, want, __LINE__)

TEST(format_floats) {
  float q[] = {-56, -48, -36, -20, 0};
  int64_t s5[] = {5};
  CHECK_FORMAT(q, TG_FLOAT32, s5, 1, "[-56. -48. -36. -20.   0.]");

  float m[] = {0.5f, -1.25f, 3.0f, 1.0f / 3.0f, 2.0f, -0.1f};
  int64_t s23[] = {2, 3};
  CHECK_FORMAT(m, TG_FLOAT32, s23, 2,
               "[[ 0.5        -1.25        3.        ]\n"
               " [ 0.33333334  2.         -0.1       ]]");

  float sci[] = {1e-5f, 1.0f, 12345.678f};
  int64_t s3[] = {3};
  CHECK_FORMAT(sci, TG_FLOAT32, s3, 1, "[9.9999997e-06 1.0000000e+00 1.2345678e+04]");

  float nf[] = {NAN, 1.5f, -INFINITY, INFINITY};
  int64_t s4[] = {4};
  CHECK_FORMAT(nf, TG_FLOAT32, s4, 1, "[ nan  1.5 -inf  inf]");

  double nn[] = {NAN, -INFINITY};
  int64_t s2[] = {2};
  CHECK_FORMAT(nn, TG_FLOAT64, s2, 1, "[ nan -inf]");

  double e10[] = {1e10, 1};
  CHECK_FORMAT(e10, TG_FLOAT64, s2, 1, "[1.e+10 1.e+00]");

  double f64[] = {0.1 + 0.2, 1.0 / 3.0, 0.001953125};
  CHECK_FORMAT(f64, TG_FLOAT64, s3, 1, "[0.3        0.33333333 0.00195312]");

  double wrap[30];
  for (int i = 0; i < 30; i++) wrap[i] = i / 29.0;
  wrap[29] = 1.0;
  int64_t s30[] = {30};
  CHECK_FORMAT(wrap, TG_FLOAT64, s30, 1,
               "[0.         0.03448276 0.06896552 0.10344828 0.13793103 0.17241379\n"
               " 0.20689655 0.24137931 0.27586207 0.31034483 0.34482759 0.37931034\n"
               " 0.4137931  0.44827586 0.48275862 0.51724138 0.55172414 0.5862069\n"
               " 0.62068966 0.65517241 0.68965517 0.72413793 0.75862069 0.79310345\n"
               " 0.82758621 0.86206897 0.89655172 0.93103448 0.96551724 1.        ]");
}

TEST(format_large_summarized) {
  float *big = malloc(2000 * sizeof *big);
  for (int i = 0; i < 2000; i++) big[i] = (float)i * 0.5f;
  int64_t s[] = {40, 50};
  CHECK_FORMAT(big, TG_FLOAT32, s, 2,
               "[[0.000e+00 5.000e-01 1.000e+00 ... 2.350e+01 2.400e+01 2.450e+01]\n"
               " [2.500e+01 2.550e+01 2.600e+01 ... 4.850e+01 4.900e+01 4.950e+01]\n"
               " [5.000e+01 5.050e+01 5.100e+01 ... 7.350e+01 7.400e+01 7.450e+01]\n"
               " ...\n"
               " [9.250e+02 9.255e+02 9.260e+02 ... 9.485e+02 9.490e+02 9.495e+02]\n"
               " [9.500e+02 9.505e+02 9.510e+02 ... 9.735e+02 9.740e+02 9.745e+02]\n"
               " [9.750e+02 9.755e+02 9.760e+02 ... 9.985e+02 9.990e+02 9.995e+02]]");
  free(big);

  int32_t *r = malloc(1001 * sizeof *r);
  for (int i = 0; i < 1001; i++) r[i] = i;
  int64_t s1[] = {1001};
  CHECK_FORMAT(r, TG_INT32, s1, 1, "[   0    1    2 ...  998  999 1000]");
  free(r);

  int64_t *c = malloc(3000 * sizeof *c);
  for (int i = 0; i < 3000; i++) c[i] = i;
  int64_t s3[] = {3, 10, 100};
  CHECK_FORMAT(c, TG_INT64, s3, 3,
               "[[[   0    1    2 ...   97   98   99]\n"
               "  [ 100  101  102 ...  197  198  199]\n"
               "  [ 200  201  202 ...  297  298  299]\n"
               "  ...\n"
               "  [ 700  701  702 ...  797  798  799]\n"
               "  [ 800  801  802 ...  897  898  899]\n"
               "  [ 900  901  902 ...  997  998  999]]\n"
               "\n"
               " [[1000 1001 1002 ... 1097 1098 1099]\n"
               "  [1100 1101 1102 ... 1197 1198 1199]\n"
               "  [1200 1201 1202 ... 1297 1298 1299]\n"
               "  ...\n"
               "  [1700 1701 1702 ... 1797 1798 1799]\n"
               "  [1800 1801 1802 ... 1897 1898 1899]\n"
               "  [1900 1901 1902 ... 1997 1998 1999]]\n"
               "\n"
               " [[2000 2001 2002 ... 2097 2098 2099]\n"
               "  [2100 2101 2102 ... 2197 2198 2199]\n"
               "  [2200 2201 2202 ... 2297 2298 2299]\n"
               "  ...\n"
               "  [2700 2701 2702 ... 2797 2798 2799]\n"
               "  [2800 2801 2802 ... 2897 2898 2899]\n"
               "  [2900 2901 2902 ... 2997 2998 2999]]]");
  free(c);
}

TEST(format_ints_bools) {
  int32_t t[24];
  for (int i = 0; i < 24; i++) t[i] = i - 5;
  int64_t s234[] = {2, 3, 4};
  CHECK_FORMAT(t, TG_INT32, s234, 3,
               "[[[-5 -4 -3 -2]\n"
               "  [-1  0  1  2]\n"
               "  [ 3  4  5  6]]\n"
               "\n"
               " [[ 7  8  9 10]\n"
               "  [11 12 13 14]\n"
               "  [15 16 17 18]]]");
  unsigned char b[] = {1, 0, 0, 1};
  int64_t s22[] = {2, 2};
  CHECK_FORMAT(b, TG_BOOL, s22, 2, "[[ True False]\n [False  True]]");
  uint64_t u[] = {UINT64_MAX, 0};
  int64_t s2[] = {2};
  CHECK_FORMAT(u, TG_UINT64, s2, 1, "[18446744073709551615                    0]");
  int64_t i64[] = {INT64_MIN, 5};
  CHECK_FORMAT(i64, TG_INT64, s2, 1, "[-9223372036854775808                    5]");
}

TEST(format_half_bf16) {
  uint16_t h[] = {float_to_half(0.1f), float_to_half(65504.0f), float_to_half(ldexpf(1, -24))};
  int64_t s3[] = {3};
  CHECK_FORMAT(h, TG_FLOAT16, s3, 1, "[1.00e-01 6.55e+04 5.96e-08]");
  /* integer digits are exact in arrays even where fewer digits would read back */
  uint16_t hi[] = {float_to_half(14576.0f), float_to_half(100.5f)};
  int64_t s2[] = {2};
  CHECK_FORMAT(hi, TG_FLOAT16, s2, 1, "[14576.    100.5]");
  uint16_t bf[] = {float_to_bf16(1.5f), float_to_bf16(-2.25f), float_to_bf16(3.140625f)};
  CHECK_FORMAT(bf, TG_BFLOAT16, s3, 1, "[ 1.5      -2.25      3.140625]");
}

TEST(format_scalars_and_empty) {
  float f = 5.0f, big = 1e20f, nz = -0.0f;
  int32_t i = 7;
  unsigned char b = 0;
  uint16_t h = float_to_half(65504.0f);
  double small = 1.5e-7, nan_v = NAN;
  CHECK_FORMAT(&f, TG_FLOAT32, NULL, 0, "5.0");
  CHECK_FORMAT(&big, TG_FLOAT32, NULL, 0, "1e+20");
  CHECK_FORMAT(&nz, TG_FLOAT32, NULL, 0, "-0.0");
  CHECK_FORMAT(&i, TG_INT32, NULL, 0, "7");
  CHECK_FORMAT(&b, TG_BOOL, NULL, 0, "False");
  CHECK_FORMAT(&h, TG_FLOAT16, NULL, 0, "65500.0");
  CHECK_FORMAT(&small, TG_FLOAT64, NULL, 0, "1.5e-07");
  CHECK_FORMAT(&nan_v, TG_FLOAT64, NULL, 0, "nan");
  int64_t s20[] = {2, 0};
  CHECK_FORMAT(NULL, TG_FLOAT32, s20, 2, "[]");
  int64_t s0[] = {0};
  CHECK_FORMAT(NULL, TG_INT64, s0, 1, "[]");
  tg_clear_error();
  CHECK(format_array(&f, TG_DTYPE_DEFAULT, NULL, 0) == NULL);
  CHECK(tg_last_status() == TG_ERR_INVALID);
  tg_clear_error();
  int64_t neg[] = {-1};
  CHECK(format_array(&f, TG_FLOAT32, neg, 1) == NULL);
  tg_clear_error();
}

/* ---- small utilities ---- */

TEST(hash_bytes_mixes) {
  unsigned char buf[40];
  for (int i = 0; i < 40; i++) buf[i] = (unsigned char)i;
  uint64_t h = hash_bytes(buf, sizeof buf, 1);
  CHECK(h == hash_bytes(buf, sizeof buf, 1));
  CHECK(h != hash_bytes(buf, sizeof buf, 2));
  CHECK(hash_bytes(NULL, 0, 0) == hash_bytes(buf, 0, 0));
  CHECK(hash_bytes(buf, 0, 0) != hash_bytes(buf, 1, 0));
  int collisions = 0;
  for (size_t len = 0; len < sizeof buf; len++)
    collisions += hash_bytes(buf, len, 0) == hash_bytes(buf, len + 1, 0);
  for (int i = 0; i < 40; i++)
    for (int bit = 0; bit < 8; bit++) {
      buf[i] ^= (unsigned char)(1u << bit);
      collisions += hash_bytes(buf, sizeof buf, 1) == h;
      buf[i] ^= (unsigned char)(1u << bit);
    }
  CHECK(collisions == 0);
  unsigned char zeros[16] = {0};
  CHECK(hash_bytes(zeros, 8, 0) != hash_bytes(zeros, 9, 0));
}

TEST(string_builder) {
  SB b;
  sb_init(&b);
  char *e = sb_take(&b);
  CHECK(e && e[0] == '\0');
  free(e);
  sb_puts(&b, "kernel ");
  sb_printf(&b, "r_%d_%d", 16, 4);
  sb_putc(&b, '!');
  CHECK(b.len == strlen("kernel r_16_4!") && strcmp(b.s, "kernel r_16_4!") == 0);
  for (int i = 0; i < 1000; i++) sb_printf(&b, "%04d", i);
  CHECK(b.len == 14 + 4000 && strlen(b.s) == b.len);
  CHECK(memcmp(b.s + b.len - 4, "0999", 4) == 0);
  char *s = sb_take(&b);
  CHECK(b.s == NULL && b.len == 0);
  free(s);
  sb_printf(&b, "%s", "");
  CHECK(b.s && b.len == 0 && b.s[0] == '\0');
  sb_free(&b);
}

TEST(counters_and_time) {
  tg_global_counters_reset();
  CHECK(counters_add(true, 100, 0, 0.5) == 1);
  CHECK(counters_add(true, 0, 64, 0) == 2);
  CHECK(counters_add(false, 0, 16, 0) == 2); /* a copy moves bytes, launches no kernel */
  CHECK(counters_add(true, 0, 0, 0) == 3);
  tg_counters c = tg_global_counters();
  CHECK(c.kernel_count == 3 && c.global_ops == 100 && c.global_mem == 80 && c.time_sum_s == 0.5 && c.compile_count == 0);
  tg_global_counters_reset();
  c = tg_global_counters();
  CHECK(c.kernel_count == 0 && c.global_ops == 0 && c.global_mem == 0 && c.time_sum_s == 0);
  double t0 = now_seconds(), t1 = now_seconds();
  CHECK(t0 > 0 && t1 >= t0);
}

TEST(xalloc) {
  char *p = tg_xmalloc(0);
  CHECK(p != NULL);
  p = tg_xrealloc(p, 100);
  memset(p, 1, 100);
  free(p);
  int *z = tg_xcalloc(10, sizeof *z);
  CHECK(z[9] == 0);
  free(z);
  char *d = tg_xstrdup("abc");
  CHECK(strcmp(d, "abc") == 0);
  free(d);
}

/* setenv on the caller's thread while the background thread compiles and loads kernels (tiered
 * compilation): that thread reads a copy of the environment, never `environ`, which setenv
 * reallocates (under ASan the old code read freed memory in about one run in three of this). */
TEST(setenv_while_kernels_compile_in_the_background) {
  char name[64];
  int k = 0;
  tg_context_begin();
  tg_context_set_int("DISABLE_COMPILER_CACHE", 1); /* (compiled now, not read from an earlier run's cache) */
  for (int it = 0; it < 4; it++) {
    tg_scope_begin();
    tg_tensor outs[16];
    for (int q = 0; q < 16; q++)
      outs[q] = tg_add_s(tg_mul_s(tg_arange(0, 70 + it * 31 + q, 1, TG_OPTS(.dtype = TG_FLOAT32)), 1.25 + q), it + 0.5);
    CHECK(tg_realize_many(outs, 16) == TG_OK);
    for (int j = 0; j < 3000; j++) {
      snprintf(name, sizeof name, "TG_TEST_ENV_RACE_%d", k++);
      setenv(name, "1", 1);
      if (j % 50 == 0) unsetenv(name);
    }
    float v = 0;
    CHECK(tg_data(tg_shrink(outs[3], TG_SHAPE(1, 2)), &v, sizeof v) == TG_OK && v == 1.0f * (1.25f + 3) + (it + 0.5f));
    tg_scope_end();
  }
  tg_context_end();
}

int main(void) { return RUN_TESTS(); }
