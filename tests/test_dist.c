/*
 * test_dist.c -- tg_dist_* over MPI. Run plainly (as `make test` does), it starts itself under
 * `mpirun --oversubscribe -np 2` (as root with --allow-run-as-root) and checks both ranks passed;
 * each rank checks rank/size, an allreduce and a broadcast of tensors (a sharded one too), a
 * data-parallel gradient (each rank's half-batch gradient, allreduced and averaged, equals the whole
 * batch's gradient computed in one process), gradients through the collectives, TinyJit replays of
 * one, and data-parallel training with BatchNorm over the ranks against one process. A rank that dies mid-run makes the job end with an
 * error in bounded time.
 */
#include "test.h"

#include <dlfcn.h>
#include <tinygrad.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char self[4096];
/* The ranks run without LeakSanitizer under `make asan`: Open MPI keeps memory for the process in
 * plugins it unloads at MPI_Finalize (unattributable, so not suppressible by library); each rank
 * checks instead that it ends with no live tensor handle. */

/* Runs this program on 2 ranks under mpirun with the environment assignments env (TG_DIST_CHILD
 * picks the ranks' code); both must print "rank <r> ok" and the job must succeed. */
static void two_ranks(const char *env) {
  char cmd[16384];
  snprintf(cmd, sizeof cmd, "%s ASAN_OPTIONS=detect_leaks=0 timeout 120 mpirun --oversubscribe %s -np 2 %s 2>&1", env,
           geteuid() == 0 ? "--allow-run-as-root" : "", self);
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  if (!p) return;
  char line[1024];
  int ok = 0;
  while (fgets(line, sizeof line, p)) {
    if (strstr(line, "ok\n") && strstr(line, "rank ")) ok++;
    else fputs(line, stderr);
  }
  int rc = pclose(p);
  CHECK_MSG(rc == 0, "mpirun exited with status %d", rc);
  CHECK_MSG(ok == 2, "%d ranks reported ok", ok);
}

TEST(dist_two_ranks) { two_ranks("TG_DIST_CHILD=1"); }

/* A rank that dies mid-run (rank 1 exits before the allreduce rank 0 waits in) ends the job with an
 * error within a bounded time, never a hang. */
TEST(dist_rank_dies) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "TG_DIST_CHILD=die ASAN_OPTIONS=detect_leaks=0 timeout 60 mpirun --oversubscribe %s -np 2 %s >/dev/null 2>&1",
           geteuid() == 0 ? "--allow-run-as-root" : "", self);
  double t0 = (double)time(NULL);
  int rc = system(cmd);
  double dt = (double)time(NULL) - t0;
  CHECK_MSG(rc != 0, "the job succeeded although a rank died");
  /* timeout's 124 would mean the survivor hung until killed */
  CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) != 124 && dt < 55, "status %d after %.0f s", rc, dt);
}

/* A rank that stops making the collectives (here rank 1 finalizes while rank 0 allreduces) ends
 * the wait after DIST_TIMEOUT with an error naming it, and the job ends: never a hang. */
TEST(dist_rank_stops_collectives) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "TG_DIST_CHILD=stop DIST_TIMEOUT=2 ASAN_OPTIONS=detect_leaks=0 timeout 60 mpirun --oversubscribe %s -x DIST_TIMEOUT -np 2 %s 2>&1",
           geteuid() == 0 ? "--allow-run-as-root" : "", self);
  double t0 = (double)time(NULL);
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  if (!p) return;
  char line[1024];
  bool named = false;
  while (fgets(line, sizeof line, p)) named = named || strstr(line, "rank 0: did not finish in 2 s (DIST_TIMEOUT)");
  int rc = pclose(p);
  double dt = (double)time(NULL) - t0;
  CHECK_MSG(named, "rank 0 did not report the timeout");
  CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) != 124 && dt < 50, "status %d after %.0f s", rc, dt);
}

static int child_stop(void) {
  if (tg_dist_init() != TG_OK) return 1;
  tg_scope_begin();
  tg_tensor t = tg_ones(TG_SHAPE(10), NULL);
  if (tg_dist_rank() == 1) {
    tg_scope_end();
    tg_dist_finalize();
    return 0;
  }
  tg_status st = tg_realize(tg_dist_allreduce(t));
  if (st == TG_ERR_RUNTIME && strstr(tg_last_error(), "did not finish in 2 s (DIST_TIMEOUT)")) printf("rank 0: did not finish in 2 s (DIST_TIMEOUT)\n");
  fflush(stdout);
  /* the world is unusable now: later collectives and finalize say so */
  tg_clear_error();
  bool later = tg_realize(tg_dist_allreduce(tg_mul_s(t, 2))) == TG_ERR_RUNTIME && strstr(tg_last_error(), "cannot be used again");
  tg_clear_error();
  bool fin = tg_dist_finalize() == TG_ERR_RUNTIME && strstr(tg_last_error(), "MPI_Finalize skipped");
  tg_clear_error();
  tg_scope_end();
  fprintf(stderr, "rank 0: later collective %s, finalize %s\n", later ? "refused" : "NOT refused", fin ? "skipped" : "NOT skipped");
  return later && fin ? 2 : 3;
}

static tg_status jit_allreduce(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                               void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = tg_dist_allreduce(tg_mul_s(in[0], 2.0));
  return TG_OK;
}

static int child_die(void) {
  if (tg_dist_init() != TG_OK) return 1;
  tg_scope_begin();
  tg_tensor t = tg_ones(TG_SHAPE(1000), NULL);
  if (tg_dist_rank() == 1) _exit(3);
  tg_tensor s = tg_dist_allreduce(t);
  tg_status st = tg_realize(s); /* rank 0 waits here for a peer that is gone */
  fprintf(stderr, "rank 0: allreduce returned %s\n", st == TG_OK ? "a value" : tg_last_error());
  tg_scope_end();
  return 2;
}

/* A small net for the data-parallel check: linear -> BatchNorm -> relu -> linear, Adam. */
typedef struct {
  tg_nn_linear l1, l2;
  tg_nn_batchnorm bn;
  tg_optim *opt;
  tg_tensor params[5], x;
  int ranks, rank;
} Net;

static void net_init(Net *n, bool dist, int ranks, int rank, tg_tensor x) {
  memset(n, 0, sizeof *n);
  tg_manual_seed(11);
  /* no bias before the BatchNorm: its gradient is zero but for rounding, which Adam would scale up
   * to full steps of either sign (moving the running mean differently in the two runs) */
  tg_nn_linear_init(&n->l1, 3, 4, false);
  tg_nn_batchnorm_init(&n->bn, 4, TG_BATCHNORM_OPTS(.dist = dist));
  tg_nn_linear_init(&n->l2, 4, 1, true);
  tg_tensor p[8] = {n->l1.weight, n->bn.weight, n->bn.bias, n->l2.weight, n->l2.bias,
                    n->bn.running_mean, n->bn.running_var, n->bn.num_batches_tracked};
  memcpy(n->params, p, sizeof n->params);
  n->opt = tg_optim_adam(p, 8, NULL); /* the running statistics as its buffers, realized by its step */
  n->ranks = ranks, n->rank = rank, n->x = x;
}

/* one training step: on ranks > 1 over this rank's half of x, the gradients averaged over the ranks */
static tg_status net_step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *user) {
  (void)in, (void)nin, (void)args, (void)nargs, (void)nout;
  Net *n = user;
  tg_context_begin();
  tg_context_set_int("TRAINING", 1);
  tg_optim_zero_grad(n->opt);
  tg_tensor x = n->ranks > 1 ? tg_shrink(n->x, TG_SHAPE(4 * n->rank, 4 * n->rank + 4, 0, 3)) : n->x;
  tg_tensor h = tg_relu(tg_nn_batchnorm_forward(&n->bn, tg_nn_linear_forward(&n->l1, x)));
  tg_tensor loss = tg_mean(tg_square(tg_sub_s(tg_nn_linear_forward(&n->l2, h), 0.5)), NULL, 0, false);
  tg_status st = tg_backward(loss);
  for (int k = 0; n->ranks > 1 && k < 5 && st == TG_OK; k++)
    st = tg_set_grad(n->params[k], tg_div_s(tg_dist_allreduce(tg_grad(n->params[k])), (double)n->ranks));
  if (st == TG_OK) st = tg_optim_step(n->opt);
  tg_context_end();
  out[0] = loss;
  return st;
}

static void net_free(Net *n) {
  tg_optim_free(n->opt);
  tg_nn_linear_free(&n->l1), tg_nn_linear_free(&n->l2), tg_nn_batchnorm_free(&n->bn);
}

static int child(void) {
  int bad = 0;
#define EXPECT(c)                                                                                  \
  do {                                                                                             \
    if (!(c)) bad++, fprintf(stderr, "rank %d: FAIL %s:%d: %s (%s)\n", tg_dist_rank(), __FILE__, __LINE__, #c, \
                             tg_last_error() ? tg_last_error() : "");                               \
  } while (0)
  if (tg_dist_init() != TG_OK) {
    fprintf(stderr, "tg_dist_init: %s\n", tg_last_error());
    return 1;
  }
  int r = tg_dist_rank(), n = tg_dist_size();
  EXPECT(n == 2 && (r == 0 || r == 1));
  tg_scope_begin();
  float v[6];
  for (int i = 0; i < 6; i++) v[i] = (float)(i + 10 * r);
  tg_tensor t = tg_from_data(v, TG_SHAPE(2, 3), NULL);
  tg_tensor s = tg_dist_allreduce(t);
  float o[6];
  EXPECT(tg_data(s, o, sizeof o) == TG_OK);
  for (int i = 0; i < 6; i++) EXPECT(o[i] == (float)(2 * i + 10));
  tg_tensor b = tg_dist_broadcast(t, 1);
  EXPECT(tg_data(b, o, sizeof o) == TG_OK);
  for (int i = 0; i < 6; i++) EXPECT(o[i] == (float)(i + 10));
  /* a view (read through a contiguous copy) and an integer dtype */
  tg_tensor tv = tg_dist_allreduce(tg_permute(t, (const int[]){1, 0}, 2));
  EXPECT(tg_data(tv, o, sizeof o) == TG_OK && o[1] == (float)(2 * 3 + 10) && o[5] == (float)(2 * 5 + 10));
  int32_t iv[6];
  tg_tensor ti = tg_dist_allreduce(tg_cast(t, TG_INT32));
  EXPECT(tg_dtype_of(ti) == TG_INT32 && tg_data(ti, iv, sizeof iv) == TG_OK && iv[4] == 18);
  /* a sharded tensor keeps its sharding */
  const char *devs[] = {"CPU:0", "CPU:1"};
  tg_tensor sh = tg_dist_allreduce(tg_shard(t, devs, 2, 1));
  EXPECT(tg_shard_axis(sh) == 1);
  EXPECT(tg_data(sh, o, sizeof o) == TG_OK && o[5] == 20.0f);
  /* data parallel: same weights everywhere (broadcast from rank 0), half the batch per rank */
  tg_manual_seed(5);
  tg_tensor xall = tg_randn(TG_SHAPE(8, 4), NULL), w0 = tg_randn(TG_SHAPE(4, 2), NULL);
  tg_realize(xall);
  tg_tensor w = tg_dist_broadcast(w0, 0);
  tg_tensor g1, gh;
  EXPECT(tg_gradient(tg_mean(tg_square(tg_matmul(xall, w)), NULL, 0, false), &w, 1, &g1) == TG_OK);
  tg_tensor xh = tg_shrink(xall, TG_SHAPE(4 * r, 4 * r + 4, 0, 4));
  EXPECT(tg_gradient(tg_mean(tg_square(tg_matmul(xh, w)), NULL, 0, false), &w, 1, &gh) == TG_OK);
  tg_tensor gavg = tg_div_s(tg_dist_allreduce(gh), 2.0);
  float a[8], c[8];
  EXPECT(tg_data(gavg, a, sizeof a) == TG_OK && tg_data(g1, c, sizeof c) == TG_OK);
  for (int i = 0; i < 8; i++) EXPECT(fabsf(a[i] - c[i]) <= 1e-5f * (1 + fabsf(c[i])));
  /* lazy: nothing runs until realized; gradients flow through (an allreduce's is the allreduce of
   * the gradient: here 2x on each of 2 ranks; a broadcast's is the sum of the ranks' on the root) */
  tg_tensor xg = tg_from_data(v, TG_SHAPE(2, 3), TG_OPTS(.requires_grad = true));
  EXPECT(tg_backward(tg_sum(tg_dist_allreduce(tg_mul(xg, xg)), NULL, 0, false)) == TG_OK);
  EXPECT(tg_data(tg_grad(xg), o, sizeof o) == TG_OK);
  for (int i = 0; i < 6; i++) EXPECT(o[i] == 4.0f * v[i]);
  tg_tensor xb = tg_from_data(v, TG_SHAPE(2, 3), TG_OPTS(.requires_grad = true));
  EXPECT(tg_backward(tg_sum(tg_mul_s(tg_dist_broadcast(xb, 1), 1.0 + r), NULL, 0, false)) == TG_OK);
  EXPECT(tg_data(tg_grad(xb), o, sizeof o) == TG_OK);
  for (int i = 0; i < 6; i++) EXPECT(o[i] == (r == 1 ? 3.0f : 0.0f));
  /* TinyJit captures the collective and each replay runs it again, on that call's input */
  tg_jit *j = tg_jit_new(jit_allreduce, 1, NULL);
  for (int call = 0; call < 4; call++) {
    tg_scope_begin();
    float in[3] = {(float)call, (float)r, 1}, res[3];
    tg_tensor a = tg_from_data(in, TG_SHAPE(3), NULL), out;
    EXPECT(tg_jit_call(j, &a, 1, NULL, 0, &out) == TG_OK && tg_data(out, res, sizeof res) == TG_OK);
    EXPECT(res[0] == 4.0f * call && res[1] == 2.0f && res[2] == 4.0f);
    tg_scope_end();
  }
  /* an exported function runs in one process: a capture with a collective is refused, nothing written */
  char xp[64];
  snprintf(xp, sizeof xp, "/tmp/tg-dist-export-%d-%d.c", (int)getpid(), r);
  EXPECT(tg_jit_export(j, xp, NULL) == TG_ERR_INVALID && strstr(tg_last_error(), "MPI collective") && access(xp, F_OK) != 0);
  tg_clear_error();
  tg_jit_free(j);
  /* data-parallel training with BatchNorm over the ranks (jitted) equals one process on the whole
   * batch: each rank also runs the one-process reference itself */
  tg_manual_seed(9);
  tg_tensor xd = tg_randn(TG_SHAPE(8, 3), NULL);
  tg_realize(xd);
  Net dp, one;
  net_init(&dp, true, 2, r, xd);
  net_init(&one, false, 1, 0, xd);
  tg_jit *jd = tg_jit_new(net_step, 1, &dp);
  for (int step = 0; step < 4; step++) {
    tg_scope_begin();
    tg_tensor l1, l2;
    EXPECT(tg_jit_call(jd, NULL, 0, NULL, 0, &l1) == TG_OK && net_step(NULL, 0, NULL, 0, &l2, 1, &one) == TG_OK);
    tg_scope_end();
  }
  tg_tensor cmp[][2] = {{dp.l1.weight, one.l1.weight}, {dp.l2.weight, one.l2.weight}, {dp.bn.weight, one.bn.weight},
                        {dp.bn.running_mean, one.bn.running_mean}, {dp.bn.running_var, one.bn.running_var}};
  for (int k = 0; k < 5; k++) {
    float pa[12] = {0}, pb[12] = {0};
    size_t nb = sizeof(float) * (size_t)tg_numel(cmp[k][0]);
    EXPECT(nb <= sizeof pa && tg_data(cmp[k][0], pa, nb) == TG_OK && tg_data(cmp[k][1], pb, nb) == TG_OK);
    for (size_t i = 0; i < nb / sizeof(float); i++) EXPECT(fabsf(pa[i] - pb[i]) <= 1e-5f * (1 + fabsf(pb[i])));
  }
  tg_jit_free(jd);
  net_free(&dp), net_free(&one);
  /* bad input: an error, not an abort */
  EXPECT(!tg_valid(tg_dist_broadcast(t, 5)));
  tg_clear_error();
  /* a bare constant (0-d, no buffer) and an arange are stored before the call */
  float z = 0;
  EXPECT(tg_data(tg_dist_allreduce(tg_full(NULL, 0, 3.0, NULL)), &z, sizeof z) == TG_OK && z == 6.0f);
  EXPECT(tg_data(tg_dist_broadcast(tg_full(NULL, 0, 1.0 + r, NULL), 1), &z, sizeof z) == TG_OK && z == 2.0f);
  int32_t ar[3];
  EXPECT(tg_data(tg_dist_allreduce(tg_arange(0, 3, 1, NULL)), ar, sizeof ar) == TG_OK && ar[2] == 4);
  /* BatchNorm over ranks holding batches of different sizes (2 rows and 4): the statistics of all
   * 6 rows, as PyTorch's SyncBatchNorm (running_mean (0.35, 3.5), running_var (1.25, 35.9)) */
  {
    float rows[6][2] = {{1, 10}, {2, 20}, {3, 30}, {4, 40}, {5, 50}, {6, 60}};
    tg_nn_batchnorm bn;
    tg_nn_batchnorm_init(&bn, 2, TG_BATCHNORM_OPTS(.dist = true));
    tg_tensor xb6 = tg_from_data(r == 0 ? &rows[0][0] : &rows[2][0], TG_SHAPE(r == 0 ? 2 : 4, 2), NULL);
    tg_context_begin();
    tg_context_set_int("TRAINING", 1);
    tg_tensor yb = tg_nn_batchnorm_forward(&bn, xb6);
    tg_context_end();
    float rm[2], rv[2], y0[8];
    EXPECT(tg_data(yb, y0, sizeof(float) * (r == 0 ? 4 : 8)) == TG_OK && tg_data(bn.running_mean, rm, sizeof rm) == TG_OK &&
           tg_data(bn.running_var, rv, sizeof rv) == TG_OK);
    EXPECT(fabsf(rm[0] - 0.35f) < 1e-5f && fabsf(rm[1] - 3.5f) < 1e-5f && fabsf(rv[0] - 1.25f) < 1e-5f && fabsf(rv[1] - 35.9f) < 1e-4f);
    EXPECT(fabsf(y0[0] - (r == 0 ? -1.4638476f : -0.2927695f)) < 1e-4f && fabsf(y0[1] - y0[0]) < 1e-4f);
    tg_nn_batchnorm_free(&bn);
  }
  /* collectives that differ between the ranks: an error on every rank, no exchanged data */
  float four[5] = {1, 2, 3, 4, 5};
  EXPECT(tg_realize(tg_dist_allreduce(tg_from_data(four, TG_SHAPE(4 + r), NULL))) == TG_ERR_INVALID &&
         strstr(tg_last_error(), "element count ranges over 4..5"));
  tg_clear_error();
  tg_tensor k = tg_from_data(four, TG_SHAPE(4), NULL);
  EXPECT(tg_realize(r == 0 ? tg_dist_allreduce(k) : tg_dist_broadcast(k, 0)) == TG_ERR_INVALID &&
         strstr(tg_last_error(), "every rank must make the same collectives"));
  tg_clear_error();
  EXPECT(tg_realize(tg_dist_allreduce(r == 0 ? k : tg_cast(k, TG_INT32))) == TG_ERR_INVALID && strstr(tg_last_error(), "dtype"));
  tg_clear_error();
  EXPECT(tg_realize(tg_dist_broadcast(k, r)) == TG_ERR_INVALID && strstr(tg_last_error(), "kind or root"));
  tg_clear_error();
  /* and the world still works after them */
  EXPECT(tg_data(tg_dist_allreduce(k), o, 4 * sizeof(float)) == TG_OK && o[3] == 8.0f);
  tg_scope_end();
  EXPECT(tg_live_count() == 0);
  EXPECT(tg_dist_finalize() == TG_OK);
  /* MPI cannot start again once finalized: an error, not Open MPI's abort */
  EXPECT(tg_dist_init() == TG_ERR_INVALID && strstr(tg_last_error(), "finalized"));
  tg_clear_error();
  if (!bad) printf("rank %d ok\n", r);
  fflush(stdout);
  return bad ? 1 : 0;
}

/* The ranks of dist_cuda_nccl: CUDA tensors on the stand-in driver (tests/fake_libcuda.c, GPU
 * memory that is host memory, kernels that do nothing -- so only copies and collectives, which
 * need no kernel) with the stand-in NCCL (tests/fake_libnccl.c, each call done by MPI). */
static long nccl_stat(const char *name) {
  void *h = dlopen(getenv("TG_NCCL_LIB"), RTLD_NOW | RTLD_NOLOAD);
  long (*f)(const char *) = h ? (long (*)(const char *))dlsym(h, "fake_nccl_stat") : NULL;
  long v = f ? f(name) : -1;
  if (h) dlclose(h);
  return v;
}

static tg_status jit_plain_allreduce(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                                     void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = tg_dist_allreduce(in[0]);
  return TG_OK;
}

static int child_cuda(void) {
  int bad = 0;
  if (tg_dist_init() != TG_OK) {
    fprintf(stderr, "tg_dist_init: %s\n", tg_last_error());
    return 1;
  }
  int r = tg_dist_rank();
  tg_scope_begin();
  float v[6], o[6];
  for (int i = 0; i < 6; i++) v[i] = (float)(i + 10 * r);
  tg_tensor t = tg_from_data(v, TG_SHAPE(2, 3), TG_OPTS(.device = "CUDA"));
  EXPECT(tg_valid(t));
  /* the allreduce and broadcast run as NCCL calls on the device */
  EXPECT(tg_data(tg_dist_allreduce(t), o, sizeof o) == TG_OK);
  for (int i = 0; i < 6; i++) EXPECT(o[i] == (float)(2 * i + 10));
  EXPECT(nccl_stat("init") == 1 && nccl_stat("allreduce") == 1);
  EXPECT(tg_data(tg_dist_broadcast(t, 1), o, sizeof o) == TG_OK);
  for (int i = 0; i < 6; i++) EXPECT(o[i] == (float)(i + 10));
  EXPECT(nccl_stat("broadcast") == 1 && nccl_stat("init") == 1); /* one communicator per device */
  int64_t iv[3] = {1, 2, (int64_t)r << 40}, io[3];
  tg_tensor ti = tg_from_data(iv, TG_SHAPE(3), TG_OPTS(.dtype = TG_INT64, .device = "CUDA"));
  EXPECT(tg_data(tg_dist_allreduce(ti), io, sizeof io) == TG_OK && io[0] == 2 && io[1] == 4 && io[2] == (int64_t)1 << 40);
  /* TinyJit replays run the NCCL call again, on each call's input */
  tg_jit *j = tg_jit_new(jit_plain_allreduce, 1, NULL);
  long before = nccl_stat("allreduce");
  for (int call = 0; call < 4; call++) {
    tg_scope_begin();
    float in[3] = {(float)call, (float)r, 1}, res[3];
    tg_tensor a = tg_from_data(in, TG_SHAPE(3), TG_OPTS(.device = "CUDA")), out;
    EXPECT(tg_jit_call(j, &a, 1, NULL, 0, &out) == TG_OK && tg_data(out, res, sizeof res) == TG_OK);
    EXPECT(res[0] == 2.0f * call && res[1] == 1.0f && res[2] == 2.0f);
    tg_scope_end();
  }
  EXPECT(nccl_stat("allreduce") == before + 4);
  tg_jit_free(j);
  /* NCCL=0: through host memory and MPI, the same values, no NCCL call */
  tg_context_begin();
  tg_context_set_int("NCCL", 0);
  before = nccl_stat("allreduce");
  EXPECT(tg_data(tg_dist_allreduce(t), o, sizeof o) == TG_OK && o[5] == 20.0f);
  EXPECT(nccl_stat("allreduce") == before);
  tg_context_end();
  /* a failing NCCL call (on every rank) is an error naming it, not an abort or a hang */
  setenv("FAKE_NCCL_FAIL", "allreduce", 1);
  EXPECT(tg_realize(tg_dist_allreduce(t)) != TG_OK && tg_last_error() && strstr(tg_last_error(), "ncclAllReduce") &&
         strstr(tg_last_error(), "NCCL error 2"));
  tg_clear_error();
  unsetenv("FAKE_NCCL_FAIL");
  EXPECT(tg_data(tg_dist_allreduce(t), o, sizeof o) == TG_OK && o[0] == 10.0f);
  tg_scope_end();
  EXPECT(tg_live_count() == 0);
  EXPECT(tg_dist_finalize() == TG_OK && nccl_stat("destroy") == 1);
  if (!bad) printf("rank %d ok\n", r);
  fflush(stdout);
  return bad ? 1 : 0;
}

/* CUDA tensors on two ranks with libnccl present: their collectives are NCCL calls on the device
 * (checked through the stand-in libraries' counters), TinyJit replays them, NCCL=0 takes the host
 * path, and a failing NCCL call is a clear error on every rank. */
TEST(dist_cuda_nccl) {
  char dir[4096], env[12288];
  snprintf(dir, sizeof dir, "%s", self);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  snprintf(env, sizeof env, "TG_DIST_CHILD=cuda TG_CUDA_LIB=%s/libfakecuda.so TG_NCCL_LIB=%s/libfakenccl.so", dir, dir);
  two_ranks(env);
}

int main(int argc, char **argv) {
  (void)argc;
  if (getenv("TG_DIST_CHILD")) {
    if (!strcmp(getenv("TG_DIST_CHILD"), "die")) return child_die();
    if (!strcmp(getenv("TG_DIST_CHILD"), "stop")) return child_stop();
    if (!strcmp(getenv("TG_DIST_CHILD"), "cuda")) return child_cuda();
    return child();
  }
  if (!realpath(argv[0], self)) snprintf(self, sizeof self, "%s", argv[0]);
  return RUN_TESTS();
}
