/*
 * test_limits.c -- arguments at the edges of what fits: sizes, counts, strides and ranges whose
 * arithmetic would overflow int64, shapes whose element count does not fit (also when another
 * dimension is 0), host staging arrays too large to allocate, layer fields changed after init,
 * random numbers drawn from several threads at once and TinyJit functions that fail. Each case must
 * come back as an error naming the function (none handle or error status), never as a crash, an
 * abort or undefined behaviour (`make asan` runs this file under ASan/UBSan with leak checking), and
 * the library must keep working afterwards.
 *
 * Every test runs inside BEGIN/END: END closes the test's scope and checks that tg_live_count() is
 * back where it started and that no error was left recorded.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tinygrad.h"
#include "test.h"

/* Under AddressSanitizer a malloc too large to serve returns NULL (as the C library's does) instead of
 * stopping the program: the host-allocation tests below need to see that NULL. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }


/* A none handle plus a TG_ERR_INVALID error naming fn. */
#define CHECK_NONE(t, ...)                                                                                   \
  do {                                                                                                       \
    CHECK(!tg_valid(t));                                                                                     \
    CHECK_ERR(TG_ERR_INVALID, __VA_ARGS__);                                                                  \
  } while (0)

#define F32 TG_OPTS(.dtype = TG_FLOAT32)

static const int64_t BIG = (int64_t)1 << 32;

/* The library still computes: sum(arange(10)) == 45. */
static void check_usable(void) {
  tg_scope_begin();
  float v = -1;
  tg_tensor s = tg_sum(tg_arange(0, 10, 1, F32), TG_ALL_AXES, false);
  CHECK(tg_data(s, &v, sizeof v) == TG_OK);
  CHECK_CLOSE(v, 45.0, 0);
  tg_scope_end();
}

static tg_tensor seq(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return tg_reshape(tg_arange(0, (double)n, 1, F32), shape, ndim);
}

/* ---------------------------------------------------------------------------------------------- */
/* integer overflow in sizes and options                                                           */

TEST(randint_range_overflows) {
  BEGIN;
  CHECK_NONE(tg_randint(TG_SHAPE(3), INT64_MIN, INT64_MAX, NULL), "tg_randint", "overflows");
  CHECK_NONE(tg_randint(TG_SHAPE(3), -2, INT64_MAX, NULL), "tg_randint");
  /* the widest range that fits still works */
  CHECK(tg_valid(tg_randint(TG_SHAPE(3), -1, INT64_MAX - 1, TG_OPTS(.dtype = TG_INT64))));
  int32_t v[16];
  CHECK(tg_data(tg_randint(TG_SHAPE(16), 3, 7, NULL), v, sizeof v) == TG_OK);
  for (int i = 0; i < 16; i++) CHECK(v[i] >= 3 && v[i] < 7);
  check_usable();
  END;
}

TEST(conv2d_groups_overflow) {
  BEGIN;
  tg_tensor x = tg_rand(TG_SHAPE(1, 4, 5, 5), NULL), w = tg_rand(TG_SHAPE(2, 4, 3, 3), NULL);
  CHECK_NONE(tg_conv2d(x, w, (tg_tensor){0}, TG_CONV2D_OPTS(.groups = INT64_MAX)), "tg_conv2d", "groups");
  CHECK_NONE(tg_conv2d(x, w, (tg_tensor){0}, TG_CONV2D_OPTS(.groups = INT64_MAX / 2)), "tg_conv2d");
  /* a kernel whose dilated span overflows */
  tg_tensor wk = tg_zeros(TG_SHAPE(1, 4, (int64_t)1 << 40, 1), NULL);
  CHECK_NONE(tg_conv2d(x, wk, (tg_tensor){0}, TG_CONV2D_OPTS(.dilation = {BIG, 1})), "tg_conv2d");
  CHECK_NONE(tg_max_pool2d(x, &(tg_pool2d_opts){.kernel_size = {BIG, 2}, .dilation = {BIG, 1}}),
             "tg_max_pool2d");
  CHECK(tg_realize(tg_conv2d(x, w, (tg_tensor){0}, NULL)) == TG_OK);
  check_usable();
  END;
}

/* A ceil_mode pool over an empty dim padded only after it: the last window may not start in that
 * padding, so the padding is trimmed away and no window is left (tinygrad asserts; this divided by
 * the 0-sized dim). Padding before the dim leaves one window. */
TEST(pool_ceil_mode_empty_dim) {
  BEGIN;
  tg_tensor x = tg_zeros(TG_SHAPE(1, 1, 3, 0), NULL);
  tg_pool2d_opts o = {.kernel_size = {1, 1}, .dilation = {1, 2}, .padding = {0, 1, 0, 0}, .npadding = 4,
                      .ceil_mode = true};
  CHECK_NONE(tg_max_pool2d(x, &o), "tg_max_pool2d", "larger than", "(0;");
  CHECK_NONE(tg_avg_pool2d(x, &o), "tg_avg_pool2d", "larger than");
  tg_tensor v = {0}, ix = {0};
  CHECK(tg_max_pool2d_with_indices(x, &o, &v, &ix) != TG_OK && !tg_valid(v) && !tg_valid(ix));
  CHECK_ERR(TG_ERR_INVALID, "tg_max_pool2d_with_indices", "larger than");
  o.padding[0] = 1, o.padding[1] = 0;
  int64_t sh[4];
  tg_tensor r = tg_max_pool2d(x, &o);
  CHECK(tg_shape(r, sh) == 4 && sh[2] == 3 && sh[3] == 1);
  CHECK(tg_realize(r) == TG_OK);
  check_usable();
  END;
}

TEST(conv_transpose2d_option_overflow) {
  BEGIN;
  tg_tensor x = tg_rand(TG_SHAPE(1, 2, 5, 5), NULL), w = tg_rand(TG_SHAPE(2, 2, 3, 3), NULL);
  for (int which = 0; which < 5; which++) {
    tg_conv_transpose2d_opts o = {0};
    if (which == 0) o.stride[0] = INT64_MAX;
    if (which == 1) o.dilation[0] = INT64_MAX;
    if (which == 2) o.padding[0] = -INT64_MAX, o.npadding = 1;
    if (which == 3) o.output_padding[0] = INT64_MAX, o.noutput_padding = 1;
    if (which == 4) o.groups = INT64_MAX; /* no channel count is divisible by it */
    tg_tensor y = tg_conv_transpose2d(x, w, (tg_tensor){0}, &o);
    CHECK_MSG(!tg_valid(y), "case %d", which);
    CHECK_ERR(TG_ERR_INVALID, "tg_conv_transpose2d");
  }
  /* zero input channels: any groups divides them, groups * (cout / groups) must still not overflow */
  tg_tensor x0 = tg_zeros(TG_SHAPE(1, 0, 5, 5), NULL), w0 = tg_zeros(TG_SHAPE(0, 2, 3, 3), NULL);
  CHECK_NONE(tg_conv_transpose2d(x0, w0, (tg_tensor){0}, &(tg_conv_transpose2d_opts){.groups = INT64_MAX}),
             "tg_conv_transpose2d");
  tg_nn_conv_transpose1d c;
  CHECK(tg_nn_conv_transpose1d_init(&c, 2, 2, 3, true, NULL) == TG_OK);
  c.opts.stride = INT64_MAX;
  CHECK_NONE(tg_nn_conv_transpose1d_forward(&c, tg_rand(TG_SHAPE(1, 2, 5), NULL)),
             "tg_nn_conv_transpose1d_forward");
  c.opts.stride = 2;
  CHECK(tg_realize(tg_nn_conv_transpose1d_forward(&c, tg_rand(TG_SHAPE(1, 2, 5), NULL))) == TG_OK);
  tg_nn_conv_transpose1d_free(&c);
  CHECK(tg_realize(tg_conv_transpose2d(x, w, (tg_tensor){0}, &(tg_conv_transpose2d_opts){.stride = {2}})) ==
        TG_OK);
  check_usable();
  END;
}

TEST(movement_size_overflow) {
  BEGIN;
  tg_tensor x = tg_rand(TG_SHAPE(2, 3), NULL);
  CHECK_NONE(tg_repeat(x, (const int64_t[]){INT64_MAX, 2}, 2), "tg_repeat");
  CHECK_NONE(tg_repeat(x, (const int64_t[]){INT64_MAX, 1, 1}, 3), "tg_repeat");
  CHECK_NONE(tg_repeat(x, (const int64_t[]){BIG, BIG}, 2), "tg_repeat");
  CHECK_NONE(tg_repeat_interleave(x, INT64_MAX, 0), "tg_repeat_interleave");
  CHECK_NONE(tg_repeat_interleave(x, INT64_MAX, TG_DIM_NONE), "tg_repeat_interleave");
  CHECK_NONE(tg_unflatten(tg_rand(TG_SHAPE(3, 4), NULL), 0, (const int64_t[]){BIG, BIG}, 2), "tg_unflatten");
  tg_tensor parts[4];
  CHECK(tg_split(tg_rand(TG_SHAPE(6, 3), NULL), (const int64_t[]){INT64_MAX, INT64_MAX}, 2, 0, parts, 4) ==
        -1);
  CHECK_ERR(TG_ERR_INVALID, "tg_split");
  CHECK(tg_split(tg_rand(TG_SHAPE(6, 3), NULL), (const int64_t[]){INT64_MAX, 1, INT64_MAX}, 3, 0, parts, 4) ==
        -1);
  CHECK_ERR(TG_ERR_INVALID, "tg_split");
  /* the same functions with sizes that fit */
  CHECK(tg_split(tg_rand(TG_SHAPE(6, 3), NULL), (const int64_t[]){2, 4}, 2, 0, parts, 4) == 2);
  int64_t sh[4];
  CHECK(tg_shape(tg_repeat(x, (const int64_t[]){2, 2}, 2), sh) == 2 && sh[0] == 4 && sh[1] == 6);
  CHECK(tg_shape(tg_repeat_interleave(x, 3, 0), sh) == 2 && sh[0] == 6 && sh[1] == 3);
  CHECK(tg_shape(tg_unflatten(x, 1, (const int64_t[]){3, 1}, 2), sh) == 3 && sh[1] == 3 && sh[2] == 1);
  check_usable();
  END;
}

TEST(unfold_huge_step) {
  BEGIN;
  /* a step past the end of the dim gives one window (tinygrad / PyTorch), not an overflow */
  tg_tensor x = seq(TG_SHAPE(3, 4));
  const int64_t steps[] = {INT64_MAX, 4, 3};
  for (int i = 0; i < 3; i++) {
    tg_tensor y = tg_unfold(x, 0, 2, steps[i]);
    int64_t sh[3];
    CHECK(tg_shape(y, sh) == 3 && sh[0] == 1 && sh[1] == 4 && sh[2] == 2);
    float v[8];
    CHECK(tg_data(y, v, sizeof v) == TG_OK);
    /* window 0 of dim 0: rows 0 and 1 -> y[0, j, :] = (x[0, j], x[1, j]) */
    for (int j = 0; j < 4; j++) CHECK(v[2 * j] == (float)j && v[2 * j + 1] == (float)(4 + j));
  }
  tg_tensor e = tg_unfold(x, 1, 0, INT64_MAX); /* empty windows */
  int64_t sh[3];
  CHECK(tg_shape(e, sh) == 3 && sh[0] == 3 && sh[1] == 1 && sh[2] == 0);
  /* windows too large to build out of movement ops */
  tg_tensor big = tg_zeros(TG_SHAPE((int64_t)1 << 40), NULL);
  CHECK_NONE(tg_unfold(big, 0, (int64_t)1 << 39, 1), "tg_unfold", "too many elements");
  CHECK_NONE(tg_unfold(big, 0, (int64_t)1 << 39, (int64_t)1 << 39), "tg_unfold", "too large");
  check_usable();
  END;
}

TEST(zero_numel_huge_dims) {
  BEGIN;
  /* a 0 in one dimension does not excuse the product of the others */
  CHECK_NONE(tg_zeros(TG_SHAPE(0, BIG, BIG), NULL), "tg_zeros", "too large");
  CHECK_NONE(tg_empty(TG_SHAPE(BIG, 0, BIG), NULL), "tg_empty", "too large");
  CHECK_NONE(tg_rand(TG_SHAPE(BIG, BIG, 0), NULL), "tg_rand", "too large");
  CHECK_NONE(tg_from_data(NULL, TG_SHAPE(0, BIG, BIG), NULL), "tg_from_data", "too large");
  /* nor can movement ops make such a shape out of a 0-element tensor */
  tg_tensor z = tg_zeros(TG_SHAPE(0, 1, 1), NULL);
  CHECK_NONE(tg_reshape(z, TG_SHAPE(0, BIG, BIG)), "tg_reshape", "too large");
  CHECK_NONE(tg_expand(z, TG_SHAPE(0, BIG, BIG)), "tg_expand");
  CHECK_NONE(tg_pad(z, (const int64_t[]){0, 0, 0, (int64_t)1 << 40, 0, (int64_t)1 << 40}, 6, 0), "tg_pad");
  /* nor broadcasting */
  tg_tensor row = tg_zeros(TG_SHAPE(1, (int64_t)1 << 40), NULL),
            col = tg_zeros(TG_SHAPE((int64_t)1 << 40, 1), NULL);
  CHECK_NONE(tg_add(row, col), "tg_add");
  CHECK_NONE(tg_where(tg_zeros(TG_SHAPE(0, BIG, 1), TG_OPTS(.dtype = TG_BOOL)),
                      tg_zeros(TG_SHAPE(1, BIG), NULL), tg_zeros(TG_SHAPE(1, 1), NULL)),
             "tg_where");
  /* 0-element tensors whose other dims fit still work, and realize */
  tg_tensor ok = tg_zeros(TG_SHAPE(0, (int64_t)1 << 20, (int64_t)1 << 20), NULL);
  CHECK(tg_valid(ok));
  CHECK(tg_realize(ok) == TG_OK);
  CHECK(tg_numel(tg_reshape(ok, TG_SHAPE(0, (int64_t)1 << 40))) == 0);
  CHECK(tg_realize(tg_add_s(tg_expand(z, TG_SHAPE(0, 3, 4)), 1)) == TG_OK);
  check_usable();
  END;
}

/* A reduction over no elements is its identity at once: the kernel does not walk the other reduced
 * dims (3037000500 * 16 of them here: 15 s when it did). */
TEST(empty_reduce_does_not_walk_other_dims) {
  BEGIN;
  tg_tensor x = tg_add_s(tg_zeros(TG_SHAPE(3037000500LL, 2, 2, 2, 0, 2), NULL), 1);
  double t0 = tt_now_s(), s = -1, m = 0;
  CHECK(tg_item(tg_sum(x, NULL, 0, true), &s) == TG_OK);
  CHECK(tg_item(tg_max(x, NULL, 0, false), &m) == TG_OK);
  double dt = tt_now_s() - t0;
  CHECK(s == 0 && isinf(m) && m < 0);
  CHECK_MSG(dt < 2.0, "the empty reductions took %.2f s", dt);
  END;
}

/* A max pool of an empty batch's convolution is empty too (a (0, 2, 2, 2) result, as tinygrad and
 * PyTorch give), and so are its gradients: the window fusion once built an index modulo 0. */
TEST(empty_batch_conv_max_pool) {
  BEGIN;
  tg_tensor x = tg_set_requires_grad(tg_zeros(TG_SHAPE(0, 1, 6, 6), NULL), true);
  tg_tensor w = tg_set_requires_grad(tg_ones(TG_SHAPE(2, 1, 3, 3), NULL), true);
  tg_tensor y = tg_max_pool2d(tg_relu(tg_conv2d(x, w, (tg_tensor){0}, NULL)), NULL);
  int64_t s[4] = {-1, -1, -1, -1};
  CHECK(tg_realize(y) == TG_OK && tg_shape(y, s) == 4 && s[0] == 0 && s[1] == 2 && s[2] == 2 && s[3] == 2);
  CHECK(tg_backward(tg_sum(y, NULL, 0, false)) == TG_OK);
  float g[18] = {1};
  CHECK(tg_data(tg_grad(w), g, sizeof g) == TG_OK && g[0] == 0.0f && g[17] == 0.0f);
  END;
}

TEST(layer_init_size_overflow) {
  BEGIN;
  tg_nn_conv2d c;
  CHECK(tg_nn_conv2d_init(&c, 4, 4, (const int64_t[]){INT64_MAX, 3}, true, NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_nn_conv2d_init", "too large");
  CHECK(tg_nn_conv2d_init(&c, BIG, BIG, (const int64_t[]){3, 3}, true, NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_nn_conv2d_init");
  tg_nn_conv1d c1;
  CHECK(tg_nn_conv1d_init(&c1, 4, 4, INT64_MAX, true, NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_nn_conv1d_init");
  tg_nn_embedding e;
  CHECK(tg_nn_embedding_init(&e, INT64_MAX, 2) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_nn_embedding_init");
  tg_nn_lstmcell l;
  CHECK(tg_nn_lstmcell_init(&l, 3, INT64_MAX / 2, true) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_nn_lstmcell_init");
  CHECK(tg_nn_lstmcell_init(&l, 3, INT64_MAX / 8, true) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_nn_lstmcell_init");
  CHECK_NONE(tg_glorot_uniform(TG_SHAPE(INT64_MAX, 2), NULL), "tg_glorot_uniform");
  CHECK_NONE(tg_kaiming_uniform(TG_SHAPE(2, BIG, BIG), 0, NULL), "tg_kaiming_uniform");
  /* the layers still initialize at ordinary sizes */
  CHECK(tg_nn_conv2d_init(&c, 4, 4, (const int64_t[]){3, 3}, true, NULL) == TG_OK);
  tg_nn_conv2d_free(&c);
  CHECK(tg_nn_embedding_init(&e, 10, 2) == TG_OK);
  tg_nn_embedding_free(&e);
  CHECK(tg_nn_lstmcell_init(&l, 3, 4, true) == TG_OK);
  tg_nn_lstmcell_free(&l);
  check_usable();
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* host memory                                                                                     */

TEST(host_allocation_failure_is_an_error) {
  BEGIN;
  /* each below builds a host array of the tensor's element count first: 4 TiB or more, refused as
   * more than RAM plus swap (so whatever the system's overcommit policy), or 256 TiB and more,
   * beyond any 64-bit process's address space. Random tensors need no host array (their counters
   * are computed in the kernel): they stay lazy, and realizing one is refused by the device
   * allocator instead. */
  const int64_t huge = (int64_t)1 << 46, big = (int64_t)1 << 40;
  tg_tensor t = tg_rand(TG_SHAPE((int64_t)1 << 48), NULL);
  CHECK(tg_valid(t));
  CHECK(tg_realize(t) == TG_ERR_RUNTIME);
  CHECK_ERR(TG_ERR_RUNTIME, "CPU", "cannot allocate");
  t = tg_rand(TG_SHAPE(huge), NULL);
  CHECK(tg_realize(t) == TG_ERR_RUNTIME);
  CHECK_ERR(TG_ERR_RUNTIME, "CPU", "cannot allocate");
  t = tg_randn(TG_SHAPE(huge), NULL);
  CHECK(tg_realize(t) == TG_ERR_RUNTIME);
  CHECK_ERR(TG_ERR_RUNTIME, "CPU", "cannot allocate");
  t = tg_linspace(0, 1, big, NULL);
  CHECK(!tg_valid(t));
  CHECK_ERR(TG_ERR_RUNTIME, "tg_linspace", "cannot allocate");
  t = tg_empty(TG_SHAPE(huge, 3), TG_OPTS(.dtype = TG_INT32));
  CHECK(!tg_valid(t));
  CHECK_ERR(TG_ERR_RUNTIME, "tg_empty", "cannot allocate", "(70368744177664, 3)");
  /* (a float arange: an integer one of any length is lazy, int64 past int32's range) */
  t = tg_arange(0.5, (double)big, 1, NULL);
  CHECK(!tg_valid(t));
  CHECK_ERR(TG_ERR_RUNTIME, "tg_arange", "cannot allocate");
  t = tg_arange(0, (double)big, 1, NULL);
  CHECK(tg_valid(t) && tg_dtype_of(t) == TG_INT64 && !tg_is_realized(t));
  t = tg_eye(1 << 20, 1 << 20, NULL);
  CHECK(!tg_valid(t));
  CHECK_ERR(TG_ERR_RUNTIME, "tg_eye", "cannot allocate");
  tg_nn_linear l;
  CHECK(tg_nn_linear_init(&l, (int64_t)1 << 23, (int64_t)1 << 23, true) == TG_ERR_RUNTIME);
  CHECK_ERR(TG_ERR_RUNTIME, "tg_nn_linear_init", "cannot allocate");
  CHECK(tg_nn_linear_init(&l, 3, 2, true) == TG_OK);
  CHECK(tg_realize(tg_nn_linear_forward(&l, tg_rand(TG_SHAPE(4, 3), NULL))) == TG_OK);
  tg_nn_linear_free(&l);
  check_usable();
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* random numbers from several threads                                                             */

enum { NTHREADS = 4, NDRAWS = 12 };
static float g_draws[NTHREADS][NDRAWS][64];
static int g_thread_errors;

static void *rand_worker(void *arg) {
  int id = (int)(intptr_t)arg;
  for (int i = 0; i < NDRAWS; i++) {
    tg_scope_begin();
    tg_tensor a = tg_rand(TG_SHAPE(8, 8), NULL);
    if (tg_data(a, g_draws[id][i], sizeof g_draws[id][i]) != TG_OK)
      __atomic_add_fetch(&g_thread_errors, 1, __ATOMIC_RELAXED);
    tg_scope_end();
  }
  tg_clear_error();
  return NULL;
}

TEST(rand_from_threads) {
  BEGIN;
  /* the stream for a seed is the same with or without threads drawing in between */
  tg_manual_seed(1234);
  float ref[2][64];
  CHECK(tg_data(tg_rand(TG_SHAPE(8, 8), NULL), ref[0], sizeof ref[0]) == TG_OK);
  CHECK(tg_data(tg_rand(TG_SHAPE(8, 8), NULL), ref[1], sizeof ref[1]) == TG_OK);
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    CHECK(pthread_create(&th[i], NULL, rand_worker, (void *)(intptr_t)i) == 0);
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  CHECK(g_thread_errors == 0);
  /* every draw got its own counter: no two of the NTHREADS * NDRAWS draws are the same numbers */
  int same = 0;
  for (int a = 0; a < NTHREADS * NDRAWS; a++)
    for (int b = a + 1; b < NTHREADS * NDRAWS; b++)
      same += !memcmp(g_draws[a / NDRAWS][a % NDRAWS], g_draws[b / NDRAWS][b % NDRAWS], sizeof ref[0]);
  CHECK_MSG(same == 0, "%d pairs of identical draws", same);
  for (int t = 0; t < NTHREADS; t++)
    for (int i = 0; i < NDRAWS; i++)
      for (int k = 0; k < 64; k++) CHECK(g_draws[t][i][k] >= 0 && g_draws[t][i][k] < 1);
  tg_manual_seed(1234);
  float again[2][64];
  CHECK(tg_data(tg_rand(TG_SHAPE(8, 8), NULL), again[0], sizeof again[0]) == TG_OK);
  CHECK(tg_data(tg_rand(TG_SHAPE(8, 8), NULL), again[1], sizeof again[1]) == TG_OK);
  CHECK(!memcmp(ref, again, sizeof ref));
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* TinyJit functions that fail                                                                     */

static tg_status f_fail_silently(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                                 int nout, void *user) {
  (void)in, (void)nin, (void)args, (void)nargs, (void)out, (void)nout, (void)user;
  return TG_ERR_INVALID;
}

static tg_status f_assign_input(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                                int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  tg_assign(in[0], tg_add_s(in[0], 1));
  out[0] = tg_mul_s(in[0], 2);
  return TG_OK;
}

static tg_status f_double(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                          int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = tg_mul_s(in[0], 2);
  return TG_OK;
}

/* sets out[0] but not out[1] */
static tg_status f_half_outputs(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                                int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = tg_add_s(in[0], 3);
  return TG_OK;
}

TEST(jit_failing_function) {
  BEGIN;
  tg_tensor x = tg_rand(TG_SHAPE(4), NULL), out[1];
  CHECK(tg_realize(x) == TG_OK);
  /* fails on every call, the capture call (the second) included, without recording why: each call
   * still reports an error, and `make asan` checks that the repeated capture attempts leak nothing */
  tg_jit *j = tg_jit_new(f_fail_silently, 1, NULL);
  for (int i = 0; i < 4; i++) {
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, out) == TG_ERR_INVALID);
    CHECK(!tg_valid(out[0]));
    CHECK_ERR(TG_ERR_INVALID, "tg_jit_call", "returned status -1");
  }
  tg_jit_free(j);
  /* assigns to its input without returning it: an error on every capture attempt, no output handles */
  j = tg_jit_new(f_assign_input, 1, NULL);
  CHECK(tg_jit_call(j, &x, 1, NULL, 0, out) == TG_OK);
  for (int i = 0; i < 3; i++) {
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, out) == TG_ERR_INVALID);
    CHECK(!tg_valid(out[0]));
    CHECK_ERR(TG_ERR_INVALID, "tg_jit_call", "assigns to input 0");
  }
  tg_jit_free(j);
  /* returns TG_OK but leaves an output unset: the error is the call's and names the output (it was
   * "tg_realize_many: got a none tensor") */
  j = tg_jit_new(f_half_outputs, 2, NULL);
  tg_tensor out2[2];
  for (int i = 0; i < 3; i++) {
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, out2) == TG_ERR_HANDLE);
    CHECK(!tg_valid(out2[0]) && !tg_valid(out2[1]));
    CHECK_ERR(TG_ERR_HANDLE, "tg_jit_call: the jitted function returned TG_OK but out[1] is none");
  }
  tg_jit_free(j);
  /* each bad argument of tg_jit_new is named alone (it was "fn is NULL or nout=1 < 0") */
  CHECK(tg_jit_new(NULL, 1, NULL) == NULL);
  CHECK_ERR(TG_ERR_INVALID, "tg_jit_new: fn is NULL");
  CHECK(tg_jit_new(f_double, -1, NULL) == NULL);
  CHECK_ERR(TG_ERR_INVALID, "tg_jit_new: nout=-1 is negative");
  /* a working function still captures and replays */
  j = tg_jit_new(f_double, 1, NULL);
  float xv[4], ov[4];
  CHECK(tg_data(x, xv, sizeof xv) == TG_OK);
  for (int i = 0; i < 4; i++) {
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, out) == TG_OK);
    CHECK(tg_data(out[0], ov, sizeof ov) == TG_OK);
    for (int k = 0; k < 4; k++) CHECK(ov[k] == 2 * xv[k]);
  }
  CHECK(tg_jit_captured_kernels(j) >= 1);
  tg_jit_free(j);
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* layer fields changed after init                                                                 */

TEST(layernorm_fields_changed_after_init) {
  BEGIN;
  tg_nn_layernorm ln;
  CHECK(tg_nn_layernorm_init(&ln, TG_SHAPE(3, 4), NULL) == TG_OK);
  tg_tensor x = tg_rand(TG_SHAPE(2, 3, 4), NULL);
  const int bad[] = {50, -1, 9, 65, INT32_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ln.ndim = bad[i];
    CHECK_NONE(tg_nn_layernorm_forward(&ln, x), "tg_nn_layernorm_forward", "ndim");
  }
  ln.ndim = 2;
  ln.normalized_shape[1] = -4;
  CHECK_NONE(tg_nn_layernorm_forward(&ln, x), "tg_nn_layernorm_forward");
  ln.normalized_shape[1] = 4;
  CHECK(tg_realize(tg_nn_layernorm_forward(&ln, x)) == TG_OK);
  tg_nn_layernorm_free(&ln);

  tg_nn_layernorm2d l2;
  CHECK(tg_nn_layernorm2d_init(&l2, 3, NULL) == TG_OK);
  l2.ndim = 50;
  CHECK_NONE(tg_nn_layernorm2d_forward(&l2, tg_rand(TG_SHAPE(1, 3, 2, 2), NULL)),
             "tg_nn_layernorm2d_forward");
  l2.ndim = 1;
  CHECK(tg_realize(tg_nn_layernorm2d_forward(&l2, tg_rand(TG_SHAPE(1, 3, 2, 2), NULL))) == TG_OK);
  tg_nn_layernorm2d_free(&l2);

  tg_nn_groupnorm g;
  CHECK(tg_nn_groupnorm_init(&g, 2, 4, NULL) == TG_OK);
  g.num_groups = 3;
  CHECK_NONE(tg_nn_groupnorm_forward(&g, tg_rand(TG_SHAPE(1, 4, 2), NULL)), "tg_nn_groupnorm_forward");
  g.num_groups = -2;
  CHECK_NONE(tg_nn_groupnorm_forward(&g, tg_rand(TG_SHAPE(1, 4, 2), NULL)), "tg_nn_groupnorm_forward");
  g.num_groups = 2;
  CHECK(tg_realize(tg_nn_groupnorm_forward(&g, tg_rand(TG_SHAPE(1, 4, 2), NULL))) == TG_OK);
  tg_nn_groupnorm_free(&g);
  check_usable();
  END;
}

/* The jit freed from inside its own function: freed when the call returns (not under it). */
static tg_jit *g_self_freeing;
static tg_status f_free_own_jit(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                                void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  tg_jit_free(g_self_freeing);
  out[0] = tg_add_s(in[0], 1);
  return TG_OK;
}

static int g_extra_scopes;
static tg_status f_unbalanced_scopes(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                                     int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  for (int i = 0; i < g_extra_scopes; i++) tg_scope_begin();
  out[0] = tg_add_s(in[0], 1);
  return TG_OK;
}

TEST(jit_freed_inside_its_function_and_unbalanced_scopes) {
  BEGIN;
  tg_tensor x = tg_ones(TG_SHAPE(4), NULL), out[1];
  CHECK(tg_realize(x) == TG_OK);
  g_self_freeing = tg_jit_new(f_free_own_jit, 1, NULL);
  CHECK(tg_jit_call(g_self_freeing, &x, 1, NULL, 0, out) == TG_OK); /* ASan: no use after free */
  float v[4];
  CHECK(tg_data(out[0], v, sizeof v) == TG_OK && v[0] == 2);
  tg_free(out[0]);
  /* scopes the function leaves open are closed, and the call is an error; no handle outlives it */
  size_t live = tg_live_count();
  tg_jit *j = tg_jit_new(f_unbalanced_scopes, 1, NULL);
  for (int k = 0; k < 3; k++) {
    g_extra_scopes = 2;
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, out) == TG_ERR_INVALID);
    CHECK_ERR(TG_ERR_INVALID, "tg_jit_call", "left open 2 scopes");
    CHECK(tg_live_count() == live);
  }
  tg_jit_free(j);
  END;
}

/* More axes than dims: an error before the array is read past what a tensor could take (the caller's
 * array may be that short), as for a NULL array */
TEST(axis_counts_past_ndim) {
  BEGIN;
  tg_tensor x = tg_zeros(TG_SHAPE(2, 3, 4), NULL);
  int ax[3] = {0, 1, 2};
  CHECK_NONE(tg_sum(x, ax, 4, false), "tg_sum", "4 axes for a tensor of 3 dims");
  CHECK_NONE(tg_max(x, ax, 1000, false), "tg_max", "1000 axes");
  CHECK_NONE(tg_mean(x, ax, 1000, true), "tg_mean", "1000 axes");
  CHECK_NONE(tg_flip(x, ax, 1000), "tg_flip", "1000 axes");
  CHECK_NONE(tg_logsumexp(x, ax, 1000, false), "tg_logsumexp", "1000 axes");
  CHECK_NONE(tg_sum(x, ax, -1, false), "tg_sum", "naxes=-1 is negative");
  tg_tensor s = tg_sum(x, ax, 3, false); /* all of them is still right */
  CHECK(tg_valid(s) && tg_ndim(s) == 0);
  tg_tensor m = tg_ones(TG_SHAPE(3, 3), NULL);
  CHECK_NONE(tg_newton_schulz(m, TG_NS_MAX_STEPS + 1, (const double[]){1, 2, 3}, 3, 1e-7), "tg_newton_schulz", "steps");
  CHECK_NONE(tg_newton_schulz(m, 5, (const double[]){1, 2, 3}, 1000, 1e-7), "tg_newton_schulz", "coefficients");
  check_usable();
  END;
}

/* uint64 indices of 2^63 and more are out of range (read 0), not negative indices from the end */
TEST(uint64_index_past_int64) {
  BEGIN;
  tg_tensor p = tg_from_data((float[]){10, 11, 12, 13}, TG_SHAPE(4), NULL);
  tg_tensor u = tg_from_data((uint64_t[]){UINT64_MAX, 1, (uint64_t)1 << 63, 3, 4}, TG_SHAPE(5), TG_OPTS(.dtype = TG_UINT64));
  float o[5];
  CHECK(tg_data(tg_index(p, u), o, sizeof o) == TG_OK);
  CHECK(o[0] == 0 && o[1] == 11 && o[2] == 0 && o[3] == 13 && o[4] == 0);
  END;
}

/* an inner step of tg_svd / tg_qr that fails (here the (m, m) identity of a lazy 3e9 x 2 matrix) gives
 * an error naming the op and none results (tg_svd went on rotating none and wrote 2-byte entries into
 * a buffer sized by the dtype of none) */
TEST(svd_qr_inner_failure) {
  BEGIN;
  tg_tensor x = tg_zeros(TG_SHAPE(3000000000LL, 2), NULL);
  tg_tensor u = {1}, s = {1}, vt = {1}, q = {1}, r = {1};
  CHECK(tg_svd(x, false, &u, &s, &vt) == TG_ERR_INVALID);
  CHECK(!tg_valid(u) && !tg_valid(s) && !tg_valid(vt));
  CHECK_ERR(TG_ERR_INVALID, "tg_svd: tg_eye", "3000000000");
  CHECK(tg_svd(tg_transpose(x, 0, 1), true, &u, &s, &vt) == TG_ERR_INVALID);
  CHECK(!tg_valid(u) && !tg_valid(s) && !tg_valid(vt));
  CHECK_ERR(TG_ERR_INVALID, "tg_svd: tg_eye", "3000000000");
  CHECK(tg_qr(x, &q, &r) == TG_ERR_INVALID);
  CHECK(!tg_valid(q) && !tg_valid(r));
  CHECK_ERR(TG_ERR_INVALID, "tg_qr: tg_eye", "3000000000");
  check_usable();
  END;
}

/* the scans of a legal but huge lazy 1-d tensor (3037000500 elements, 11863283 chunks of 256): the
 * running totals of the chunks need more elements than a tensor may have, so each scan fails cleanly
 * naming itself (the shape of the failed step's none was used as -1 dims: a write at b[-4]) */
TEST(scan_huge_inner_failure) {
  BEGIN;
  tg_tensor x = tg_zeros(TG_SHAPE(3037000500LL), NULL);
  CHECK_NONE(tg_cumprod(x, 0), "tg_cumprod: ", "too many elements");
  CHECK_NONE(tg_logcumsumexp(x, 0), "tg_logcumsumexp: ");
  tg_tensor v = {1}, i = {1};
  CHECK(tg_cummax(x, 0, &v, &i) == TG_ERR_INVALID);
  CHECK(!tg_valid(v) && !tg_valid(i));
  CHECK_ERR(TG_ERR_INVALID, "tg_cummax: ");
  CHECK(tg_cummin(tg_reshape(x, TG_SHAPE(1, 3037000500LL)), 1, &v, &i) == TG_ERR_INVALID);
  CHECK(!tg_valid(v) && !tg_valid(i));
  CHECK_ERR(TG_ERR_INVALID, "tg_cummin: ");
  check_usable();
  END;
}

/* a dim longer than int32 indices can number: tg_topk / tg_argsort / tg_sort with indices refuse it
 * naming the op (tg_topk of 3037000512 elements returned TG_OK and two handles while tg_arange had
 * recorded an overflow); a values-only sort does not need indices and stays a lazy result */
TEST(topk_sort_indices_past_int32) {
  BEGIN;
  const int64_t lens[2] = {3037000512LL, 3037000500LL}; /* the chunked selection and the plain one */
  for (int j = 0; j < 2; j++) {
    tg_tensor x = tg_zeros(&lens[j], 1, NULL), v = {1}, i = {1};
    CHECK(tg_topk(x, 4, 0, true, true, &v, &i) == TG_ERR_INVALID);
    CHECK(!tg_valid(v) && !tg_valid(i));
    CHECK_ERR(TG_ERR_INVALID, "tg_topk: dim 0 of shape", "int32 indices");
    CHECK_NONE(tg_argsort(x, 0, false), "tg_argsort: dim 0", "int32 indices");
    CHECK(tg_sort(x, -1, true, &v, &i) == TG_ERR_INVALID);
    CHECK(!tg_valid(v) && !tg_valid(i));
    CHECK_ERR(TG_ERR_INVALID, "tg_sort: dim -1", "int32 indices");
    CHECK(tg_sort(x, 0, true, &v, NULL) == TG_OK && tg_valid(v) && tg_numel(v) == lens[j]);
  }
  check_usable();
  END;
}

int main(void) {
  int rc = RUN_TESTS();
  if (tg_live_count() != 0) {
    fprintf(stderr, "live handles left: %zu\n", tg_live_count());
    rc = 1;
  }
  return rc;
}
