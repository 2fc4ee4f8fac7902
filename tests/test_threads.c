/*
 * test_threads.c -- the thread-safety guarantee of tinygrad.h: threads that share one model's
 * realized weights build graphs over them, read shapes and realize results at the same time, and
 * every thread gets the right shapes and values. `make tsan` builds this test with ThreadSanitizer,
 * which must report nothing.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tinygrad.h"
#include "test.h"

#define NTHREADS 4
#define IN 12
#define HID 16
#define OUT 5
#define BATCH 3

/* the shared model: Linear(IN, HID) -> relu -> Linear(HID, OUT), realized before the threads start */
static float w1[HID * IN], b1[HID], w2[OUT * HID], b2[OUT];
static tg_tensor W1, B1, W2, B2;

static void model_init(void) {
  for (int i = 0; i < HID * IN; i++) w1[i] = (float)((i * 37 % 23) - 11) / 16.0f;
  for (int i = 0; i < HID; i++) b1[i] = (float)(i % 5) / 8.0f - 0.25f;
  for (int i = 0; i < OUT * HID; i++) w2[i] = (float)((i * 13 % 17) - 8) / 16.0f;
  for (int i = 0; i < OUT; i++) b2[i] = (float)i / 4.0f;
  W1 = tg_persist(tg_from_data(w1, TG_SHAPE(HID, IN), NULL));
  B1 = tg_persist(tg_from_data(b1, TG_SHAPE(HID), NULL));
  W2 = tg_persist(tg_from_data(w2, TG_SHAPE(OUT, HID), NULL));
  B2 = tg_persist(tg_from_data(b2, TG_SHAPE(OUT), NULL));
}

static void model_free(void) { tg_free(W1), tg_free(B1), tg_free(W2), tg_free(B2); }

static void forward_ref(const float *x, float *y) {
  for (int b = 0; b < BATCH; b++) {
    float h[HID];
    for (int j = 0; j < HID; j++) {
      float s = b1[j];
      for (int k = 0; k < IN; k++) s += x[b * IN + k] * w1[j * IN + k];
      h[j] = s > 0 ? s : 0;
    }
    for (int o = 0; o < OUT; o++) {
      float s = b2[o];
      for (int j = 0; j < HID; j++) s += h[j] * w2[o * HID + j];
      y[b * OUT + o] = s;
    }
  }
}

typedef struct {
  int id, iters;
  int bad; /* checks that failed in this thread (CHECK's counter is not thread-safe) */
  char msg[256];
} Job;

#define TCHECK(j, c, ...)                                                                            \
  do {                                                                                             \
    if (!(c) && !(j)->bad++) snprintf((j)->msg, sizeof (j)->msg, __VA_ARGS__);                     \
  } while (0)

/* One request thread of an inference server: each iteration a new input, the shared weights. */
static void *serve(void *arg) {
  Job *j = arg;
  for (int it = 0; it < j->iters; it++) {
    tg_scope_begin();
    float x[BATCH * IN], y[BATCH * OUT], want[BATCH * OUT];
    for (int i = 0; i < BATCH * IN; i++) x[i] = (float)(((i + 7 * it + 31 * j->id) % 19) - 9) / 8.0f;
    forward_ref(x, want);
    tg_tensor xt = tg_from_data(x, TG_SHAPE(BATCH, IN), NULL);
    tg_tensor h = tg_relu(tg_linear(xt, W1, B1));
    tg_tensor out = tg_linear(h, W2, B2);
    int64_t sh[8] = {0};
    TCHECK(j, tg_shape(out, sh) == 2 && sh[0] == BATCH && sh[1] == OUT, "thread %d: output shape (%lld, %lld)", j->id,
           (long long)sh[0], (long long)sh[1]);
    TCHECK(j, tg_data(out, y, sizeof y) == TG_OK, "thread %d: tg_data: %s", j->id, tg_last_error());
    for (int i = 0; i < BATCH * OUT; i++)
      TCHECK(j, fabsf(y[i] - want[i]) <= 1e-4f * (1 + fabsf(want[i])), "thread %d iter %d: y[%d] = %g, expected %g", j->id,
             it, i, y[i], want[i]);
    /* the same expression over the shared weights in every thread: one hash-consed node, built,
     * shaped and realized by several threads at once */
    tg_tensor s = tg_sum(tg_mul(tg_add(W1, W1), W1), TG_AXES(1), false);
    TCHECK(j, tg_shape(s, sh) == 1 && sh[0] == HID, "thread %d: shared sum shape %lld", j->id, (long long)sh[0]);
    float sv[HID];
    TCHECK(j, tg_data(s, sv, sizeof sv) == TG_OK, "thread %d: tg_data (shared): %s", j->id, tg_last_error());
    for (int r = 0; r < HID; r++) {
      float e = 0;
      for (int k = 0; k < IN; k++) e += 2 * w1[r * IN + k] * w1[r * IN + k];
      TCHECK(j, fabsf(sv[r] - e) <= 1e-4f * (1 + e), "thread %d: shared sum[%d] = %g, expected %g", j->id, r, sv[r], e);
    }
    TCHECK(j, tg_last_error() == NULL, "thread %d: error %s", j->id, tg_last_error());
    tg_clear_error();
    tg_scope_end();
  }
  return NULL;
}

static void run_threads(void *(*fn)(void *), int iters) {
  pthread_t th[NTHREADS];
  Job jobs[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) {
    jobs[i] = (Job){.id = i, .iters = iters};
    CHECK(pthread_create(&th[i], NULL, fn, &jobs[i]) == 0);
  }
  for (int i = 0; i < NTHREADS; i++) {
    pthread_join(th[i], NULL);
    CHECK_MSG(jobs[i].bad == 0, "%d failed checks, first: %s", jobs[i].bad, jobs[i].msg);
  }
}

TEST(threads_share_model_weights) {
  BEGIN;
  model_init();
  size_t live = tg_live_count();
  run_threads(serve, 12);
  CHECK_MSG(tg_live_count() == live, "live handles %zu after the threads, expected %zu", tg_live_count(), live);
  model_free();
  END;
}

/* Nodes built, dropped and built again: a node another thread is creating must never be visible
 * with its shape half written (tg_shape read ndim 2 and a NULL or stale shape). */
static void *shapes(void *arg) {
  Job *j = arg;
  for (int it = 0; it < j->iters; it++) {
    tg_scope_begin();
    tg_tensor a = tg_reshape(tg_add(W2, W2), TG_SHAPE(OUT * HID / 4, 4));
    tg_tensor b = tg_permute(tg_mul(a, a), TG_AXES(1, 0));
    int64_t sh[4] = {0};
    TCHECK(j, tg_shape(a, sh) == 2 && sh[0] == OUT * HID / 4 && sh[1] == 4, "thread %d: shape (%lld, %lld)", j->id,
           (long long)sh[0], (long long)sh[1]);
    TCHECK(j, tg_shape(b, sh) == 2 && sh[0] == 4 && sh[1] == OUT * HID / 4, "thread %d: permuted shape (%lld, %lld)",
           j->id, (long long)sh[0], (long long)sh[1]);
    TCHECK(j, tg_numel(b) == OUT * HID, "thread %d: numel %lld", j->id, (long long)tg_numel(b));
    tg_scope_end();
  }
  return NULL;
}

TEST(threads_build_same_nodes) {
  BEGIN;
  model_init();
  run_threads(shapes, 3000);
  model_free();
  END;
}

/* Lazy tensors made by the main thread, read by every thread in a different order: whichever thread
 * comes first realizes one while others hold its handle and read it too. */
#define NLAZY 40
static tg_tensor lazy[NLAZY];

static void *read_lazy(void *arg) {
  Job *j = arg;
  for (int it = 0; it < j->iters; it++) {
    for (int k = 0; k < NLAZY; k++) {
      int i = (k * (j->id + 1) + it) % NLAZY;
      float v[OUT * HID];
      TCHECK(j, tg_data(lazy[i], v, sizeof v) == TG_OK, "thread %d: tg_data(lazy %d): %s", j->id, i, tg_last_error());
      for (int e = 0; e < OUT * HID; e++) {
        float want = w2[e] * (float)(i + 1) + 0.5f;
        TCHECK(j, fabsf(v[e] - want) <= 1e-5f * (1 + fabsf(want)), "thread %d: lazy %d [%d] = %g, expected %g", j->id, i,
               e, v[e], want);
      }
      int64_t sh[4];
      TCHECK(j, tg_shape(lazy[i], sh) == 2 && sh[0] == OUT && sh[1] == HID, "thread %d: lazy %d shape", j->id, i);
    }
    tg_clear_error();
  }
  return NULL;
}

TEST(threads_read_shared_lazy_tensors) {
  BEGIN;
  model_init();
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < NLAZY; i++)
      lazy[i] = tg_add(tg_mul(W2, tg_scalar(i + 1, NULL)), tg_scalar(0.5, NULL));
    run_threads(read_lazy, 2);
    for (int i = 0; i < NLAZY; i++) tg_free(lazy[i]);
  }
  model_free();
  END;
}

/* ---- walks over every live handle while other threads free theirs ---- */

static atomic_int g_stop;
static int g_walk_mode; /* 0: tg_backward, 1: tg_load_state_dict */
static atomic_int g_walk_errors;

static void *walker(void *arg) {
  (void)arg;
  float w0[32], x[128];
  for (int i = 0; i < 32; i++) w0[i] = (float)(i % 7) / 7.0f;
  for (int i = 0; i < 128; i++) x[i] = (float)(i % 5) / 5.0f;
  tg_tensor W = tg_from_data(w0, TG_SHAPE(8, 4), TG_OPTS(.requires_grad = true));
  tg_tensor X = tg_from_data(x, TG_SHAPE(16, 8), NULL);
  tg_state_dict *model = tg_state_dict_new(), *src = tg_state_dict_new();
  tg_tensor ones = tg_ones(TG_SHAPE(8, 4), NULL);
  tg_state_dict_set(model, "w", W);
  tg_state_dict_set(src, "w", ones);
  tg_free(ones);
  for (int it = 0; it < 3000; it++) {
    tg_scope_begin();
    tg_status st;
    if (g_walk_mode) {
      st = tg_load_state_dict(model, src, true);
    } else {
      tg_zero_grad(W);
      st = tg_backward(tg_sum(tg_matmul(X, W), TG_ALL_AXES, false));
    }
    if (st != TG_OK) atomic_fetch_add(&g_walk_errors, 1);
    tg_clear_error();
    tg_scope_end();
  }
  tg_state_dict_free(model), tg_state_dict_free(src);
  tg_free(W), tg_free(X);
  atomic_store(&g_stop, 1);
  return NULL;
}

static void *churn(void *arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) tg_free(tg_ones(TG_SHAPE(4), NULL));
  return NULL;
}

/* tg_backward and tg_load_state_dict look at every live handle; another thread freeing its own
 * handles meanwhile (allowed) handed the walk a slot without a node: a crash. */
TEST(threads_walk_handles_while_others_free) {
  BEGIN;
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  for (g_walk_mode = 0; g_walk_mode < 2; g_walk_mode++) {
    atomic_store(&g_stop, 0);
    atomic_store(&g_walk_errors, 0);
    pthread_t a, b, c;
    pthread_create(&a, NULL, walker, NULL);
    pthread_create(&b, NULL, churn, NULL);
    pthread_create(&c, NULL, churn, NULL);
    pthread_join(a, NULL), pthread_join(b, NULL), pthread_join(c, NULL);
    CHECK_MSG(atomic_load(&g_walk_errors) == 0, "mode %d: %d calls failed", g_walk_mode, atomic_load(&g_walk_errors));
  }
  tg_context_end();
  END;
}

/* ---- random draws replayed by TinyJits on several threads ---- */

#define DRAWS 1500
#define NDRAW_THREADS 4
static float g_draws[NDRAW_THREADS][DRAWS];

static tg_status draw_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)in, (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_rand(TG_SHAPE(1), NULL);
  return TG_OK;
}

static void *drawer(void *arg) {
  float *mine = arg;
  tg_jit *j = tg_jit_new(draw_fn, 1, NULL);
  for (int i = 0; i < DRAWS; i++) {
    tg_scope_begin();
    tg_tensor out;
    if (tg_jit_call(j, NULL, 0, NULL, 0, &out) != TG_OK || tg_data(out, &mine[i], sizeof(float)) != TG_OK) mine[i] = -1;
    tg_scope_end();
  }
  tg_jit_free(j);
  return NULL;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Each thread replays its own jit of tg_rand (as the header prescribes): every draw takes its own
 * counter value (the replays advanced the device's counter without the random lock, and concurrent
 * ones drew the same numbers). */
TEST(threads_jit_random_draws_differ) {
  BEGIN;
  pthread_t t[NDRAW_THREADS];
  for (int i = 0; i < NDRAW_THREADS; i++) pthread_create(&t[i], NULL, drawer, g_draws[i]);
  for (int i = 0; i < NDRAW_THREADS; i++) pthread_join(t[i], NULL);
  float *all = malloc(sizeof g_draws);
  memcpy(all, g_draws, sizeof g_draws);
  int n = NDRAW_THREADS * DRAWS, failed = 0, dup = 0;
  qsort(all, (size_t)n, sizeof(float), cmp_float);
  for (int i = 0; i < n; i++) failed += all[i] < 0, dup += i && all[i] >= 0 && all[i] == all[i - 1];
  /* (float32 uniforms from 2^23 values: about 0.7 equal pairs by chance in 6000 honest draws) */
  CHECK_MSG(failed == 0 && dup <= 4, "%d failed draws, %d equal pairs among %d", failed, dup, n);
  free(all);
  END;
}

/* ---- a thread that exits with a scope open ---- */

static void *leave_scope_open(void *arg) {
  (void)arg;
  tg_scope_begin();
  tg_tensor a = tg_ones(TG_SHAPE(3), NULL);
  tg_scope_begin();
  tg_add_s(a, 1);
  return NULL; /* both scopes still open */
}

/* its scopes end when it exits, as tg_scope_end would end them (their handles stayed live forever) */
TEST(threads_exit_ends_open_scopes) {
  size_t live = tg_live_count();
  for (int i = 0; i < 20; i++) {
    pthread_t t;
    pthread_create(&t, NULL, leave_scope_open, NULL);
    pthread_join(t, NULL);
  }
  CHECK_MSG(tg_live_count() == live, "%zu handles live, %zu before", tg_live_count(), live);
}

int main(void) {
  int rc = RUN_TESTS();
  tmpdir_remove();
  return rc;
}
