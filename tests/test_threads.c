/*
 * test_threads.c -- the thread-safety guarantee of tinygrad.h: threads that share one model's
 * realized weights build graphs over them, read shapes and realize results at the same time, and
 * every thread gets the right shapes and values. `make tsan` builds this test with ThreadSanitizer,
 * which must report nothing.
 */
#include <pthread.h>

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

int main(void) {
  int rc = RUN_TESTS();
  tmpdir_remove();
  return rc;
}
