/*
 * test_dist.c -- tg_dist_* over MPI. Run plainly (as `make test` does), it starts itself under
 * `mpirun --oversubscribe -np 2` (as root with --allow-run-as-root) and checks both ranks passed;
 * each rank checks rank/size, an allreduce and a broadcast of tensors (a sharded one too), and a
 * data-parallel gradient: each rank's half-batch gradient, allreduced and averaged, equals the
 * whole batch's gradient computed in one process. A rank that dies mid-run makes the job end with an
 * error in bounded time.
 */
#include "test.h"

#include <tinygrad.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char self[4096];
/* The ranks run without LeakSanitizer under `make asan`: Open MPI keeps memory for the process in
 * plugins it unloads at MPI_Finalize (unattributable, so not suppressible by library); each rank
 * checks instead that it ends with no live tensor handle. */

TEST(dist_two_ranks) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "TG_DIST_CHILD=1 ASAN_OPTIONS=detect_leaks=0 timeout 120 mpirun --oversubscribe %s -np 2 %s 2>&1",
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

static int child_die(void) {
  if (tg_dist_init() != TG_OK) return 1;
  tg_scope_begin();
  tg_tensor t = tg_ones(TG_SHAPE(1000), NULL);
  if (tg_dist_rank() == 1) _exit(3);
  tg_tensor s = tg_dist_allreduce(t); /* rank 0 waits here for a peer that is gone */
  fprintf(stderr, "rank 0: allreduce returned %s\n", tg_valid(s) ? "a value" : tg_last_error());
  tg_scope_end();
  return 2;
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
  /* bad input: an error, not an abort */
  EXPECT(!tg_valid(tg_dist_broadcast(t, 5)));
  tg_clear_error();
  tg_scope_end();
  EXPECT(tg_live_count() == 0);
  EXPECT(tg_dist_finalize() == TG_OK);
  if (!bad) printf("rank %d ok\n", r);
  fflush(stdout);
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  (void)argc;
  if (getenv("TG_DIST_CHILD")) return strcmp(getenv("TG_DIST_CHILD"), "die") ? child() : child_die();
  if (!realpath(argv[0], self)) snprintf(self, sizeof self, "%s", argv[0]);
  return RUN_TESTS();
}
