/*
 * test_cuda_graph.c -- TinyJit's replays on a CUDA device run as one CUDA graph (JIT=1, tinygrad's
 * default): the first replay records the captured kernels as a chain of kernel nodes and launches
 * it, later replays launch it again, changing only the launches whose arguments changed (the new
 * call's input buffers); the transients live in one planned buffer the jit keeps. JIT=2, DEBUG=2
 * (which times each kernel) and a driver without graphs replay launch by launch. Every call's values
 * equal the CPU's, and nothing is left alive at the end.
 *
 * Without a GPU: the stand-in driver tests/fake_libcuda.c runs the kernels the stand-in NVRTC
 * (tests/fake_libnvrtc.c) hands it as CUDA C compiled for the host, and keeps graphs as the driver
 * does (parameter values copied when a node is added or set); fake_cuda_stat counts launches,
 * graph launches, the kernels graphs ran, parameter updates and live graphs.
 */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>
#include <unistd.h>

#include "fake_cuda_env.h"
#include "maxdiff.h"
#include "test.h"

static char g_cuda[PATH_MAX + 32];
static bool g_ok; /* the CUDA device opens on the stand-in driver */

/* a counter of the stand-in driver */
static long cstat(const char *name) {
  void *h = dlopen(g_cuda, RTLD_NOW | RTLD_NOLOAD);
  long (*f)(const char *) = h ? (long (*)(const char *))dlsym(h, "fake_cuda_stat") : NULL;
  long v = f ? f(name) : -1;
  if (h) dlclose(h);
  return v;
}

static tg_tensor data(const char *dev, int64_t r, int64_t c, int seed) {
  float *d = malloc(sizeof(float) * (size_t)(r * c));
  for (int64_t i = 0; i < r * c; i++) d[i] = (float)((i * 7 + seed * 13) % 17) * 0.125f - 1.0f;
  tg_tensor t = tg_from_data(d, TG_SHAPE(r, c), TG_OPTS(.device = dev));
  free(d);
  return t;
}

/* a small layer and a reduction: several kernels with intermediates between them */
static tg_tensor model(tg_tensor x, tg_tensor w) {
  tg_tensor h = tg_relu(tg_add_s(tg_matmul(x, w), 0.5));
  return tg_add(tg_sum(tg_mul(h, h), TG_AXES(1), true), tg_mul_s(tg_sum(h, TG_AXES(1), true), -0.25));
}

static tg_status jfn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = model(in[0], in[1]);
  return TG_OK;
}

static double maxdiff(tg_tensor a, tg_tensor b) { return tensor_maxdiff(a, b); }

/* Runs the jit for `calls` calls with a new input each time; the counters' changes over the replays
 * (calls 3 and later) go to *launches, *graph_launches, *graph_runs and *sets. */
static void run_jit(int calls, long *launches, long *graph_launches, long *graph_runs, long *sets) {
  tg_tensor w = data("CUDA", 12, 6, 1), wc = data("CPU", 12, 6, 1);
  tg_realize(w);
  tg_jit *j = tg_jit_new(jfn, 1, NULL);
  long l0 = 0, gl0 = 0, gr0 = 0, s0 = 0;
  /* every call's input in a buffer of its own (all alive at once), so each replay's differs */
  tg_tensor xs[8];
  for (int call = 0; call < calls && call < 8; call++) xs[call] = data("CUDA", 8, 12, 10 + call), tg_realize(xs[call]);
  for (int call = 0; call < calls && call < 8; call++) {
    tg_scope_begin();
    if (call == 2) l0 = cstat("launches"), gl0 = cstat("graph_launches"), gr0 = cstat("graph_runs"), s0 = cstat("graph_sets");
    tg_tensor x = xs[call], xc = data("CPU", 8, 12, 10 + call), out = {0};
    tg_tensor in[2] = {x, w};
    tg_status st = tg_jit_call(j, in, 2, NULL, 0, &out);
    CHECK_MSG(st == TG_OK, "call %d: %s", call, tg_last_error());
    double d = maxdiff(out, model(xc, wc));
    CHECK_MSG(d < 1e-5, "call %d: differs from the CPU by %g", call, d);
    tg_scope_end();
  }
  *launches = cstat("launches") - l0, *graph_launches = cstat("graph_launches") - gl0;
  *graph_runs = cstat("graph_runs") - gr0, *sets = cstat("graph_sets") - s0;
  tg_jit_free(j);
  for (int call = 0; call < calls && call < 8; call++) tg_free(xs[call]);
  tg_free(w), tg_free(wc);
}

/* JIT=1: every replay is one graph launch and no kernel launch; each graph runs every captured
 * kernel; the input changes every call, so its launches get new arguments (and only those). */
TEST(jit_replays_as_cuda_graph) {
  if (!g_ok) return;
  BEGIN;
  long launches, gl, gr, sets;
  run_jit(6, &launches, &gl, &gr, &sets);
  CHECK_MSG(launches == 0 && gl == 4, "replays: %ld kernel launches, %ld graph launches", launches, gl);
  CHECK_MSG(gr > 0 && gr % 4 == 0 && gr / 4 >= 2, "graphs ran %ld kernels over 4 replays", gr);
  /* the first replay records the graph; the other three update the launches that read the input
   * (a new buffer each call), not the others */
  CHECK_MSG(sets >= 3 && sets < 3 * (gr / 4), "%ld parameter updates over 3 replays of %ld kernels", sets, gr / 4);
  CHECK_MSG(cstat("live_graphs") == 0, "%ld graphs alive after tg_jit_free", cstat("live_graphs"));
  END;
}

/* JIT=2 (tinygrad's "no graphs") and DEBUG=2 (each kernel timed) replay launch by launch, same values */
TEST(jit_without_graphs) {
  if (!g_ok) return;
  const char *env[][2] = {{"JIT", "2"}, {"DEBUG", "2"}};
  for (int k = 0; k < 2; k++) {
    BEGIN;
    tg_context_begin();
    tg_context_set(env[k][0], env[k][1]);
    long launches, gl, gr, sets;
    run_jit(5, &launches, &gl, &gr, &sets);
    tg_context_end();
    CHECK_MSG(gl == 0 && gr == 0 && launches >= 3 * 2, "%s=%s: %ld launches, %ld graph launches", env[k][0], env[k][1], launches, gl);
    END;
  }
}

/* A driver that cannot instantiate the graph: the replays go launch by launch, with no error and
 * the same values. A graph that ran and then fails to launch: that call's error names the call. */
TEST(graph_failures) {
  if (!g_ok) return;
  BEGIN;
  setenv("FAKE_CUDA_GRAPH_FAIL", "instantiate", 1);
  long launches, gl, gr, sets;
  run_jit(5, &launches, &gl, &gr, &sets);
  CHECK_MSG(gl == 0 && launches >= 3 * 2, "instantiate refused: %ld launches, %ld graph launches", launches, gl);
  unsetenv("FAKE_CUDA_GRAPH_FAIL");
  tg_tensor w = data("CUDA", 12, 6, 1);
  tg_realize(w);
  tg_jit *j = tg_jit_new(jfn, 1, NULL);
  for (int call = 0; call < 5; call++) {
    tg_scope_begin();
    if (call == 4) setenv("FAKE_CUDA_GRAPH_FAIL", "launch", 1);
    tg_tensor x = data("CUDA", 8, 12, 10 + call), out = {0};
    tg_realize(x);
    tg_tensor in[2] = {x, w};
    tg_status st = tg_jit_call(j, in, 2, NULL, 0, &out);
    if (call < 4) CHECK_MSG(st == TG_OK, "call %d: %s", call, tg_last_error());
    else CHECK_MSG(st != TG_OK && strstr(tg_last_error(), "cuGraphLaunch"), "call 4: %s", st == TG_OK ? "no error" : tg_last_error());
    tg_clear_error();
    tg_scope_end();
  }
  unsetenv("FAKE_CUDA_GRAPH_FAIL");
  tg_jit_free(j);
  tg_free(w);
  CHECK(cstat("live_graphs") == 0);
  END;
}

int main(void) {
  char dir[PATH_MAX];
  g_ok = fake_cuda_env_begin(dir, sizeof dir, "CUDA");
  snprintf(g_cuda, sizeof g_cuda, "%s/libfakecuda.so", dir);
  int rc = RUN_TESTS();
  if (!g_ok) rc = 1;
  fake_cuda_env_end();
  return rc;
}
