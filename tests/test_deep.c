/*
 * test_deep.c -- lazy graphs as deep as a loop builds them: a chain of a million adds realized,
 * differentiated and freed, and a chain of realized steps (each with an autograd history) read,
 * differentiated and freed. Every case runs on a thread with a 1 MiB stack, so any walk that
 * recurses once per node (a million frames) would overflow it: passing proves the graph walks,
 * the kernel building and the release of nodes are iterative or bounded by the kernel depth split.
 */
#include <math.h>
#include <pthread.h>

#include "test.h"
#include "tinygrad.h"
#include "uop/uop.h"

#define SMALL_STACK (1u << 20)

/* Runs fn on a thread with a 1 MiB stack and waits for it. */
static void on_small_stack(void *(*fn)(void *)) {
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, SMALL_STACK);
  pthread_t t;
  CHECK(pthread_create(&t, &at, fn, NULL) == 0);
  pthread_join(t, NULL);
  pthread_attr_destroy(&at);
}

static tg_tensor vec4(bool grad) {
  const float d[4] = {1, 2, 3, 4};
  const int64_t sh[1] = {4};
  tg_opts o = {0};
  o.requires_grad = grad;
  return tg_from_data(d, sh, 1, &o);
}

/* x = x + x0, n times: every element i is (n + 1) * x0[i], exact in float32 below 2^24. */
static tg_tensor add_chain(tg_tensor x0, int n) {
  tg_tensor x = x0;
  for (int i = 0; i < n; i++) x = tg_add(x, x0);
  return x;
}

static void *chain_realize(void *arg) {
  (void)arg;
  tg_tensor x0 = vec4(false);
  tg_scope_begin();
  tg_tensor x = add_chain(x0, 1000000);
  float out[4] = {0};
  CHECK_MSG(tg_data(x, out, sizeof out) == TG_OK, "%s", tg_last_error());
  for (int i = 0; i < 4; i++) CHECK_CLOSE(out[i], 1000001.0 * (i + 1), 0);
  tg_scope_end();
  tg_free(x0);
  return NULL;
}

TEST(million_add_chain_realizes) {
  size_t before = uop_live_count();
  on_small_stack(chain_realize);
  CHECK(tg_live_count() == 0);
  /* what stays is the compiled kernels' ASTs (the kernel cache), not the chain */
  CHECK_MSG(uop_live_count() < before + 1000, "%zu nodes live, %zu before", uop_live_count(), before);
}

static void *chain_free(void *arg) {
  (void)arg;
  tg_tensor x0 = vec4(false);
  tg_scope_begin();
  (void)add_chain(x0, 1000000);
  tg_scope_end(); /* frees a million handles; the last one's node releases the whole chain */
  tg_free(x0);
  return NULL;
}

TEST(million_add_chain_freed_unrealized) {
  size_t before = uop_live_count();
  on_small_stack(chain_free);
  CHECK(tg_live_count() == 0);
  CHECK(uop_live_count() <= before);
}

static void *chain_backward(void *arg) {
  (void)arg;
  tg_tensor x0 = vec4(true);
  tg_scope_begin();
  tg_tensor x = add_chain(x0, 100000);
  tg_tensor l = tg_sum(tg_mul(x, x0), NULL, 0, false); /* sum((n+1) x0^2): grad 2 (n+1) x0 */
  CHECK_MSG(tg_backward(l) == TG_OK, "%s", tg_last_error());
  float g[4] = {0};
  CHECK_MSG(tg_data(tg_grad(x0), g, sizeof g) == TG_OK, "%s", tg_last_error());
  for (int i = 0; i < 4; i++) CHECK_CLOSE(g[i], 2.0 * 100001.0 * (i + 1), 0);
  tg_scope_end();
  tg_free(x0);
  return NULL;
}

TEST(backward_through_deep_chain) {
  on_small_stack(chain_backward);
  CHECK(tg_live_count() == 0);
}

/* Each step realized: a chain of buffers, each remembering the graph it was computed by (its
 * autograd history, since x0 requires grad). Backward walks all the histories; freeing drops them
 * one inside the other. */
static void *history_chain(void *arg) {
  (void)arg;
  const int n = 20000;
  tg_tensor x0 = vec4(true);
  tg_scope_begin();
  tg_tensor x = x0;
  for (int i = 0; i < n; i++) {
    x = tg_add(x, x0);
    if (tg_realize(x) != TG_OK) {
      CHECK_MSG(0, "step %d: %s", i, tg_last_error());
      break;
    }
  }
  float out[4] = {0};
  CHECK(tg_data(x, out, sizeof out) == TG_OK);
  CHECK_CLOSE(out[3], 4.0 * (n + 1), 0);
  CHECK_MSG(tg_backward(tg_sum(x, NULL, 0, false)) == TG_OK, "%s", tg_last_error());
  CHECK(tg_data(tg_grad(x0), out, sizeof out) == TG_OK);
  for (int i = 0; i < 4; i++) CHECK_CLOSE(out[i], n + 1.0, 0);
  tg_scope_end();
  tg_free(x0);
  return NULL;
}

TEST(chain_of_realized_histories) {
  on_small_stack(history_chain);
  CHECK(tg_live_count() == 0);
}

/* A deep chain through views and a reduction each step: x = transpose(x) * 0.5 + x0 + sum(x)/64
 * on 4x4, checked against the same recurrence on the host. */
static double host[16];
static void *mixed_chain(void *arg) {
  (void)arg;
  const int n = 3000;
  float d[16];
  for (int i = 0; i < 16; i++) d[i] = (float)(i % 5) - 2.0f, host[i] = d[i];
  const int64_t sh[2] = {4, 4};
  tg_tensor x0 = tg_from_data(d, sh, 2, NULL);
  tg_scope_begin();
  tg_tensor x = x0, half = tg_scalar(0.5, NULL), k = tg_scalar(1.0 / 64, NULL);
  for (int s = 0; s < n; s++) {
    tg_tensor tot = tg_mul(tg_sum(x, NULL, 0, true), k);
    x = tg_add(tg_add(tg_mul(tg_transpose(x, 0, 1), half), x0), tot);
    double t = 0, nx[16];
    for (int i = 0; i < 16; i++) t += host[i];
    for (int r = 0; r < 4; r++)
      for (int c = 0; c < 4; c++) nx[r * 4 + c] = host[c * 4 + r] * 0.5 + d[r * 4 + c] + t / 64;
    for (int i = 0; i < 16; i++) host[i] = nx[i];
  }
  float out[16] = {0};
  CHECK_MSG(tg_data(x, out, sizeof out) == TG_OK, "%s", tg_last_error());
  for (int i = 0; i < 16; i++) CHECK_CLOSE(out[i], host[i], 1e-4);
  tg_scope_end();
  tg_free(x0);
  return NULL;
}

TEST(deep_chain_of_views_and_reductions) {
  on_small_stack(mixed_chain);
  CHECK(tg_live_count() == 0);
}

/* The split is what keeps kernels bounded: a 1000-deep chain takes several kernels, a 100-deep
 * one still fuses into one (DEPTH_SPLIT's default is 256). */
TEST(depth_split_kernel_count) {
  tg_tensor x0 = vec4(false);
  int depths[2] = {100, 1000};
  uint64_t kernels[2];
  for (int j = 0; j < 2; j++) {
    tg_scope_begin();
    tg_tensor x = add_chain(x0, depths[j]);
    tg_global_counters_reset();
    CHECK(tg_realize(x) == TG_OK);
    kernels[j] = tg_global_counters().kernel_count;
    tg_scope_end();
  }
  CHECK_MSG(kernels[0] == 1, "%llu", (unsigned long long)kernels[0]);
  CHECK_MSG(kernels[1] >= 4 && kernels[1] <= 5, "%llu", (unsigned long long)kernels[1]);
  tg_free(x0);
  CHECK(tg_live_count() == 0);
}

/* DEPTH_SPLIT past its range is clamped to 512 (10 000 overflowed the stack building a 20 000-add
 * chain's first kernel), on a thread of the default 8 MB stack (512 levels fit a 1 MB one too, but
 * not under AddressSanitizer's larger frames) */
static void *depth_split_huge(void *arg) {
  (void)arg;
  tg_tensor x0 = vec4(false);
  tg_scope_begin();
  tg_context_begin();
  tg_context_set_int("DEPTH_SPLIT", 100000);
  tg_tensor x = add_chain(x0, 20000);
  float out[4] = {0};
  tg_global_counters_reset();
  CHECK_MSG(tg_data(x, out, sizeof out) == TG_OK, "%s", tg_last_error());
  CHECK(out[0] == 20001.0f && out[3] == 80004.0f);
  CHECK_MSG(tg_global_counters().kernel_count >= 39, "%llu kernels", (unsigned long long)tg_global_counters().kernel_count);
  tg_context_end();
  tg_scope_end();
  tg_free(x0);
  return NULL;
}

TEST(depth_split_clamped) {
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, (size_t)8 << 20);
  pthread_t t;
  CHECK(pthread_create(&t, &at, depth_split_huge, NULL) == 0);
  pthread_join(t, NULL);
  pthread_attr_destroy(&at);
  CHECK(tg_live_count() == 0);
}

/* A matmul at the end of a graph deeper than the bound (a transformer's last layer) must not get its
 * broadcast product x[:, None, :] * w (or the EXPAND under it) stored as the depth cut. With
 * DEPTH_SPLIT=8, chains of 1 to 12 ops into a 64x64 matmul: wherever the bound falls, the kernels
 * move well under the 1 MB a stored 64x64x64 product would (the inputs are 16 KB each). */
TEST(depth_split_never_stores_a_broadcast) {
  size_t live0 = tg_live_count();
  float xv[64 * 64], wv[64 * 64];
  for (int i = 0; i < 64 * 64; i++) xv[i] = (float)(i % 13) * 0.01f, wv[i] = (float)(i % 7) * 0.01f - 0.03f;
  for (int len = 1; len <= 12; len++) {
    tg_scope_begin();
    tg_context_begin();
    tg_context_set_int("DEPTH_SPLIT", 8);
    tg_tensor x = tg_from_data(xv, TG_SHAPE(64, 64), NULL), w = tg_from_data(wv, TG_SHAPE(64, 64), NULL);
    tg_tensor h = x;
    for (int i = 0; i < len; i++) h = tg_add_s(h, 0.01f); /* h = x + 0.01 len */
    tg_tensor y = tg_matmul(h, w);
    tg_global_counters_reset();
    CHECK(tg_realize(y) == TG_OK);
    uint64_t mem = tg_global_counters().global_mem;
    CHECK_MSG(mem < 300000, "chain of %d: %llu bytes moved (a stored broadcast is over 1 MB)", len, (unsigned long long)mem);
    float out[64 * 64];
    CHECK(tg_data(y, out, sizeof out) == TG_OK);
    int bad = 0;
    for (int i = 0; i < 64; i += 9)
      for (int j = 0; j < 64; j += 7) {
        double want = 0;
        for (int k = 0; k < 64; k++) want += ((double)xv[i * 64 + k] + 0.01 * len) * wv[k * 64 + j];
        if (fabs(out[i * 64 + j] - want) > 1e-4) bad++;
      }
    CHECK_MSG(bad == 0, "chain of %d: %d sampled values wrong", len, bad);
    tg_context_end();
    tg_scope_end();
  }
  CHECK(tg_live_count() == live0);
}

int main(void) { return RUN_TESTS(); }
