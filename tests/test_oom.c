/*
 * test_oom.c -- running out of host memory, as SQLite tests it: the test hook makes the N-th
 * allocation fail (or every one from the N-th on), for every N over a realize, a fresh kernel's
 * code generation, a backward and a safetensors load. Each run must either succeed with the right
 * values or fail with TG_ERR_RUNTIME and an "out of host memory" message -- never crash -- and a
 * normal run right after must succeed. Under `make asan` the same runs prove nothing leaks.
 */
#include <stdio.h>
#include <unistd.h>

#include "test.h"
#include "tinygrad.h"

/* the library's test hook (helpers.h) */
void tg__fail_alloc_after(long n, bool persistent);
long tg__alloc_calls(void);

typedef tg_status (*scenario)(long variant);

static const float A[6] = {1, -2, 3, 0.5f, 2, -1}, B[6] = {2, 1, -1, 4, 0.25f, 3};

/* relu(a * b - 1) summed over the last axis of 2x3: {1 + 0 + 0, 1 + 0 + 0} */
static tg_status realize_case(long variant) {
  (void)variant;
  const int64_t sh[2] = {2, 3};
  tg_scope_begin();
  tg_tensor a = tg_from_data(A, sh, 2, NULL), b = tg_from_data(B, sh, 2, NULL);
  tg_tensor c = tg_sum(tg_relu(tg_sub(tg_mul(a, b), tg_scalar(1, NULL))), (int[]){1}, 1, false);
  float out[2] = {-1, -1};
  tg_status st = tg_data(c, out, sizeof out);
  if (st == TG_OK) {
    CHECK_CLOSE(out[0], 1.0, 1e-6);
    CHECK_CLOSE(out[1], 1.0, 1e-6);
  }
  tg_scope_end();
  return st;
}

/* a * k + b with k different on every run: a kernel never seen before, so scheduling, code
 * generation, rendering and loading all run under the failing allocator */
static tg_status codegen_case(long variant) {
  const int64_t sh[2] = {2, 3};
  double k = 1.0 + (double)variant / 1024;
  tg_scope_begin();
  tg_tensor a = tg_from_data(A, sh, 2, NULL), b = tg_from_data(B, sh, 2, NULL);
  tg_tensor c = tg_add(tg_mul(a, tg_scalar(k, NULL)), b);
  float out[6] = {0};
  tg_status st = tg_data(c, out, sizeof out);
  if (st == TG_OK)
    for (int i = 0; i < 6; i++) CHECK_CLOSE(out[i], A[i] * (float)k + B[i], 1e-6);
  tg_scope_end();
  return st;
}

/* loss = sum((x @ w - 1)^2), x 2x3, w 3x2: grad w = x^T (2 (x @ w - 1)) */
static tg_status backward_case(long variant) {
  (void)variant;
  const int64_t xs[2] = {2, 3}, ws[2] = {3, 2};
  tg_scope_begin();
  tg_tensor x = tg_from_data(A, xs, 2, NULL);
  tg_tensor w = tg_from_data(B, ws, 2, TG_OPTS(.requires_grad = true));
  tg_tensor loss = tg_sum(tg_square(tg_sub(tg_matmul(x, w), tg_scalar(1, NULL))), NULL, 0, false);
  tg_status st = tg_backward(loss);
  if (st == TG_OK) {
    float g[6] = {0};
    st = tg_data(tg_grad(w), g, sizeof g);
    if (st == TG_OK) {
      double y[2][2], want;
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
          y[i][j] = -1;
          for (int k = 0; k < 3; k++) y[i][j] += A[i * 3 + k] * B[k * 2 + j];
        }
      for (int k = 0; k < 3; k++)
        for (int j = 0; j < 2; j++) {
          want = 0;
          for (int i = 0; i < 2; i++) want += A[i * 3 + k] * 2 * y[i][j];
          CHECK_CLOSE(g[k * 2 + j], want, 1e-5);
        }
    }
  }
  tg_scope_end();
  return st;
}

static char st_path[256];

static tg_status load_case(long variant) {
  (void)variant;
  tg_state_dict *sd = tg_safe_load(st_path);
  if (!sd) return tg_last_status();
  tg_status st = TG_OK;
  float a[6] = {0}, b[6] = {0};
  if (tg_state_dict_len(sd) != 2) CHECK(tg_state_dict_len(sd) == 2);
  if (st == TG_OK) st = tg_data(tg_state_dict_get(sd, "a"), a, sizeof a);
  if (st == TG_OK) st = tg_data(tg_state_dict_get(sd, "b.weight"), b, sizeof b);
  if (st == TG_OK)
    for (int i = 0; i < 6; i++) CHECK(a[i] == A[i] && b[i] == B[i]);
  tg_state_dict_free(sd);
  return st;
}

/* Runs sc with the N-th allocation failing for N = 1, 1 + stride, ... up to the number of
 * allocations a clean run makes. Returns how many runs reported the failure. */
static long sweep(const char *name, scenario sc, long stride, bool persistent, long *variant) {
  CHECK(sc((*variant)++) == TG_OK); /* warm: kernels compiled (unless sc makes new ones) */
  tg__fail_alloc_after(0, false);
  CHECK(sc((*variant)++) == TG_OK);
  long calls = tg__alloc_calls(), failed = 0, runs = 0;
  CHECK(calls > 0);
  for (long n = 1; n <= calls; n += stride) {
    tg__fail_alloc_after(n, persistent);
    tg_status st = sc((*variant)++);
    tg__fail_alloc_after(0, false);
    runs++;
    if (getenv("OOM_TRACE")) fprintf(stderr, "%s %ld: %d\n", name, n, (int)st);
    if (st != TG_OK) {
      failed++;
      /* the first error of the run is the failed allocation (a later call given the none handle
       * it left may report TG_ERR_HANDLE; the thread's recorded error stays the first) */
      CHECK_MSG(tg_last_status() == TG_ERR_RUNTIME, "%s, allocation %ld: status %d (%s)", name, n, (int)st,
                tg_last_error() ? tg_last_error() : "no message");
      CHECK_STR_CONTAINS(tg_last_error(), "out of host memory");
      tg_clear_error();
    }
    /* and the library works normally right after */
    st = sc((*variant)++);
    CHECK_MSG(st == TG_OK, "%s: the run after a failure at allocation %ld failed: %s", name, n,
              tg_last_error() ? tg_last_error() : "?");
    tg_clear_error();
    CHECK_MSG(tg_live_count() == 0, "%s, allocation %ld: %zu handles live", name, n, tg_live_count());
  }
  fprintf(stderr, "  %s: %ld allocations, %ld runs, %ld reported the failure%s\n", name, calls, runs, failed,
          persistent ? " (persistent)" : "");
  /* most allocations are made before the last check point of the operation */
  CHECK_MSG(failed * 2 > runs, "%s: only %ld of %ld runs reported a failed allocation", name, failed, runs);
  return failed;
}

static long variant = 1;

TEST(oom_every_allocation_of_a_realize) {
  sweep("realize", realize_case, 1, false, &variant);
  sweep("realize", realize_case, 7, true, &variant);
  CHECK(tg_live_count() == 0);
}

TEST(oom_during_code_generation) {
  /* every kernel is new here (a compile each), so sample the allocations */
  tg__fail_alloc_after(0, false);
  CHECK(codegen_case(variant++) == TG_OK);
  long calls = tg__alloc_calls();
  long stride = calls / 40 + 1;
  sweep("codegen", codegen_case, stride, false, &variant);
  CHECK(tg_live_count() == 0);
}

TEST(oom_every_allocation_of_a_backward) {
  sweep("backward", backward_case, 1, false, &variant);
  sweep("backward", backward_case, 5, true, &variant);
  CHECK(tg_live_count() == 0);
}

TEST(oom_every_allocation_of_a_load) {
  snprintf(st_path, sizeof st_path, "/tmp/tg_test_oom_%d.safetensors", (int)getpid());
  tg_state_dict *sd = tg_state_dict_new();
  const int64_t sh[2] = {2, 3};
  tg_tensor a = tg_from_data(A, sh, 2, NULL), b = tg_from_data(B, sh, 2, NULL);
  CHECK(tg_state_dict_set(sd, "a", a) == TG_OK);
  CHECK(tg_state_dict_set(sd, "b.weight", b) == TG_OK);
  tg_free(a), tg_free(b);
  CHECK(tg_safe_save(sd, st_path) == TG_OK);
  tg_state_dict_free(sd);
  sweep("tg_safe_load", load_case, 1, false, &variant);
  sweep("tg_safe_load", load_case, 3, true, &variant);
  unlink(st_path);
  CHECK(tg_live_count() == 0);
}

int main(void) { return RUN_TESTS(); }
