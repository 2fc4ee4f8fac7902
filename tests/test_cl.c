/*
 * test_cl.c -- the OpenCL device (PoCL in `make test`) and the GPU kernel model: device names and
 * their errors, the missing-library error, tg_device_list, buffers and copies CPU<->CL and CL<->CL,
 * build errors with the build log, the on-disk binary cache, launch timing, computations on CL
 * against the same on CPU (values and kernel counts: elementwise, reductions, softmax, matmul,
 * float16/bfloat16, float64, autograd), forced LOCAL/GROUP/GROUPTOP/UPCAST/UNROLL lists (GPU_OPTS)
 * and their errors, and the float64 error of a device without cl_khr_fp64.
 * The first test must be the first to open CL in the process (it points the loader at a missing
 * library); the binary cache goes to a fresh temporary directory.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <tinygrad.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "runtime/device.h"
#include "schedule/schedule.h"
#include "tensor/tensor.h"
#include "test.h"
#include "last_kernel.h"

static char g_cache[256];

/* ---------------------------------------------------------------------------------------------- */

TEST(cl_missing_library_names_the_package) {
  tg_clear_error();
  tg_context_begin();
  tg_context_set("TG_OPENCL_LIB", "libOpenCL-not-here.so.1");
  Device *d = device_get("CL");
  CHECK(d == NULL);
  CHECK(tg_last_status() == TG_ERR_RUNTIME);
  CHECK_STR_CONTAINS(tg_last_error(), "libOpenCL-not-here.so.1");
  CHECK_STR_CONTAINS(tg_last_error(), "ocl-icd-libopencl1");
  CHECK_STR_CONTAINS(tg_last_error(), "pocl-opencl-icd");
  tg_clear_error();
  /* the public API reports the same through tg_device_list, leaving no error behind */
  tg_device_info info[6];
  int n = tg_device_list(info, 6);
  CHECK(n == 5 && !info[1].available && strcmp(info[2].name, "NULL") == 0 && strcmp(info[3].name, "CUDA") == 0 &&
        strcmp(info[4].name, "NV") == 0);
  CHECK_STR_CONTAINS(info[1].why, "pocl-opencl-icd");
  CHECK(!tg_has_error());
  tg_context_end();
}

TEST(cl_device_names) {
  tg_clear_error();
  Device *a = device_get("CL");
  CHECK_MSG(a != NULL, "%s", tg_last_error());
  if (!a) return;
  CHECK(strcmp(a->name, "CL") == 0 && a->index == 0);
  CHECK(strcmp(a->renderer, "OpenCL") == 0);
  CHECK(device_get("cl") == a && device_get("CL:0") == a && device_get("CL:OpenCL") == a && device_get("cl:opencl:0") == a);
  CHECK(a->caps.gpu && a->caps.lang == LANG_OPENCL);
  CHECK(a->caps.max_local >= 1 && a->caps.max_local_dims[0] >= 1 && a->caps.local_mem > 0 && a->caps.max_dims == 3);
  CHECK(device_get("CPU:C") == device_get("CPU"));
  /* the LLVM renderer is a device of its own on the CPU's memory, one per arch */
  Device *l = device_get("CPU:LLVM");
  CHECK_MSG(l != NULL, "%s", tg_last_error());
  if (l) {
    CHECK(l != device_get("CPU") && strcmp(l->name, "CPU:LLVM") == 0 && strcmp(l->renderer, "LLVM") == 0);
    CHECK(l->caps.lang == LANG_LLVM && !l->caps.gpu && device_get("cpu:llvm:0") == l);
    Device *l1 = device_get("CPU:1:LLVM");
    CHECK(l1 && l1 != l && strcmp(l1->name, "CPU:1:LLVM") == 0);
  }
  CHECK(!tg_has_error());
  struct {
    const char *name, *msg;
  } bad[] = {
      {"AMD:HIP:gfx1100", "unknown device 'AMD:HIP:gfx1100'"},
      {"CPU:FORTRAN", "CPU has no renderer 'FORTRAN' (renderers: C, LLVM)"},
      {"CPU:C:x86_64", "renderer C has no arch 'x86_64'"},
      {"CL:CUDA", "CL has no renderer 'CUDA' (renderers: OpenCL)"},
      {"CL:OpenCL:sm_90", "renderer OpenCL has no arch 'sm_90'"},
      {"CL:1:2", "two instance numbers"},
      {"CL:", "empty part"},
      {"CL:1x", "bad instance number"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tg_clear_error();
    CHECK(device_get(bad[i].name) == NULL);
    CHECK_STR_CONTAINS(tg_last_error(), bad[i].msg);
    CHECK_STR_CONTAINS(tg_last_error(), "available: CPU[:<n>][:C|LLVM], CL[:<n>][:OpenCL], NULL[:<n>][:CUDA], CUDA[:<n>][:CUDA], NV[:<n>][:CUDA]");
  }
  /* an instance this machine lacks: the message counts what it has */
  tg_clear_error();
  CHECK(device_get("CL:77") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "no device CL:77");
  tg_clear_error();
}

TEST(cl_device_list) {
  tg_clear_error();
  tg_set_error(TG_ERR_INVALID, "an earlier error");
  tg_device_info info[6];
  int n = tg_device_list(info, 6);
  CHECK(n == 5);
  CHECK(strcmp(info[0].name, "CPU") == 0 && info[0].available && strcmp(info[0].renderers[0], "C") == 0);
  CHECK(strcmp(info[1].name, "CL") == 0 && info[1].available && strcmp(info[1].renderers[0], "OpenCL") == 0);
  CHECK(info[1].renderers[1] == NULL);
  CHECK(strcmp(info[2].name, "NULL") == 0 && strcmp(info[2].renderers[0], "CUDA") == 0 && info[2].renderers[1] == NULL);
  CHECK(strcmp(info[3].name, "CUDA") == 0 && strcmp(info[4].name, "NV") == 0 && strcmp(info[4].renderers[0], "CUDA") == 0);
  CHECK(tg_device_list(NULL, 0) == 5);
  CHECK_STR_CONTAINS(tg_last_error(), "an earlier error"); /* the caller's error is kept */
  tg_clear_error();
}

TEST(cl_buffers_and_copies) {
  tg_clear_error();
  Device *cl = device_get("CL"), *cpu = device_get("CPU");
  if (!cl) return;
  enum { N = 3000 };
  float in[N], out[N];
  for (int i = 0; i < N; i++) in[i] = (float)i * 0.5f - 7;
  size_t live0 = buffer_live_count();
  Buffer *a = buffer_new(cl, sizeof in), *b = buffer_new(cl, sizeof in), *h = buffer_new(cpu, sizeof in);
  CHECK(a && b && h);
  if (!a || !b || !h) return;
  CHECK(buffer_copyin(a, in, sizeof in) == TG_OK);
  CHECK(buffer_copy(b, a, sizeof in) == TG_OK); /* CL -> CL on the device */
  memset(out, 0, sizeof out);
  CHECK(buffer_copyout(b, out, sizeof out) == TG_OK && memcmp(in, out, sizeof in) == 0);
  CHECK(buffer_copy(h, b, sizeof in) == TG_OK); /* CL -> CPU */
  CHECK(memcmp(h->ptr, in, sizeof in) == 0);
  ((float *)h->ptr)[5] = 42;
  CHECK(buffer_copy(a, h, sizeof in) == TG_OK); /* CPU -> CL */
  CHECK(buffer_copyout(a, out, sizeof out) == TG_OK && out[5] == 42 && out[6] == in[6]);
  buffer_unref(a), buffer_unref(b), buffer_unref(h);
  /* large buffers are whole cl_mem objects (no pointer arithmetic on device handles) */
  Buffer *big = buffer_new(cl, (size_t)3 << 20);
  CHECK(big != NULL && big->chunk == NULL);
  buffer_unref(big);
  CHECK(buffer_live_count() == live0);
  CHECK(!tg_has_error());
}


/* A device whose memory is not the host's keeps its idle blocks (past the 256 MB the host keeps of
 * small ones) until its footprint would pass twice the most its buffers held at once: a training
 * step that frees more activations than that gets the same cl_mem objects back the next step, an
 * evaluation its big output (returning them made PoCL map and fault them in afresh: a quarter of
 * beautiful_mnist's step, half of its evaluation). */
TEST(cl_idle_blocks_kept_to_the_peak) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  device_cache_clear(cl);
  enum { N = 4 };
  const size_t SZ = (size_t)96 << 20; /* 4 x 96 MB: 384 MB live at once */
  Buffer *b[N];
  void *p[N];
  for (int i = 0; i < N; i++) {
    b[i] = buffer_new(cl, SZ);
    CHECK(b[i] != NULL);
    if (!b[i]) return;
    p[i] = b[i]->ptr;
  }
  for (int i = 0; i < N; i++) buffer_unref(b[i]);
  CHECK_MSG(cl->cached_bytes == N * SZ, "idle bytes %zu, want %zu", cl->cached_bytes, N * SZ);
  int same = 0;
  for (int i = 0; i < N; i++) {
    b[i] = buffer_new(cl, SZ);
    for (int j = 0; b[i] && j < N; j++) same += b[i]->ptr == p[j];
  }
  CHECK(same == N);
  CHECK(cl->cached_bytes == 0);
  for (int i = 0; i < N; i++) buffer_unref(b[i]);
  device_cache_clear(cl);
  CHECK(cl->cached_bytes == 0);
  /* an evaluation's pattern: a big output (x) read into a smaller one (y), freed, then another (z);
   * x's block must still be there for the next evaluation (the footprint may exceed the most it
   * held before, 384 MB, but not twice the most its buffers held at once) */
  const size_t M = (size_t)1 << 20;
  void *px = NULL;
  for (int round = 0; round < 2; round++) {
    Buffer *x = buffer_new(cl, 300 * M), *y = buffer_new(cl, 60 * M);
    CHECK(x && y);
    if (!x || !y) return;
    if (round == 0) px = x->ptr;
    else CHECK_MSG(x->ptr == px, "the 300 MB block was returned to the device between the rounds");
    buffer_unref(x);
    Buffer *z = buffer_new(cl, 70 * M);
    CHECK(z != NULL);
    buffer_unref(y), buffer_unref(z);
    CHECK(cl->cached_bytes == 430 * M);
  }
  device_cache_clear(cl);
  CHECK(!tg_has_error());
}
TEST(cl_build_error_has_the_log) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  Program *p = program_get(cl, "broken", "__kernel void broken(__global float *a) { a[0] = no_such_variable_here; }\n");
  CHECK(p == NULL);
  CHECK(tg_last_status() == TG_ERR_COMPILE);
  CHECK_STR_CONTAINS(tg_last_error(), "compile failed for kernel 'broken'");
  CHECK_STR_CONTAINS(tg_last_error(), "no_such_variable_here");
  tg_clear_error();
}

static int count_bins(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d) return 0;
  for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".bin") != NULL;
  closedir(d);
  return n;
}

TEST(cl_binary_cache_and_launch) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/cl", g_cache);
  int before = count_bins(dir);
  const char *src = "__kernel void twice(__global float *restrict o, __global const float *restrict i) {\n"
                    "  long g = (long)get_global_id(0) + (long)get_global_id(1) * 8L; o[g] = 2.0f * i[g];\n}\n";
  uint8_t *lib = NULL;
  size_t len = 0;
  CHECK(cl->vt->compile(cl->state, src, &lib, &len) == TG_OK && len > 0);
  CHECK(count_bins(dir) == before + 1);
  uint8_t *lib2 = NULL;
  size_t len2 = 0;
  CHECK(cl->vt->compile(cl->state, src, &lib2, &len2) == TG_OK); /* from the cache: the same bytes */
  CHECK(len2 == len && lib && lib2 && memcmp(lib, lib2, len) == 0);
  free(lib), free(lib2);
  /* a damaged entry is rebuilt */
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (!strstr(e->d_name, ".bin")) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r+b");
    if (f) fseek(f, 20, SEEK_SET), fputc(0x5a, f), fputc(0xa5, f), fclose(f);
  }
  if (d) closedir(d);
  Program *p = program_get(cl, "twice", src);
  CHECK_MSG(p != NULL, "%s", tg_last_error());
  if (!p) return;
  enum { N = 64 };
  float in[N], out[N];
  for (int i = 0; i < N; i++) in[i] = (float)i;
  Buffer *bi = buffer_new(cl, sizeof in), *bo = buffer_new(cl, sizeof out);
  CHECK(buffer_copyin(bi, in, sizeof in) == TG_OK);
  void *bufs[2] = {bo->ptr, bi->ptr};
  int64_t gs[3] = {8, 8, 1}, ls[3] = {4, 2, 1};
  double t = program_exec(p, bufs, 2, 0, gs, ls, true); /* timed by the device's events */
  CHECK(t >= 0 && t < 10);
  CHECK(program_exec(p, bufs, 2, 0, gs, NULL, false) == 0.0);
  cl->vt->synchronize(cl->state);
  CHECK(buffer_copyout(bo, out, sizeof out) == TG_OK);
  bool ok = true;
  for (int i = 0; i < N; i++) ok = ok && out[i] == 2.0f * i;
  CHECK(ok);
  /* a work-group size that does not divide the global size is a launch error, not a crash */
  int64_t bad[3] = {3, 1, 1};
  CHECK(program_exec(p, bufs, 2, 0, gs, bad, true) < 0);
  CHECK_STR_CONTAINS(tg_last_error(), "CL: launch on CL:0 failed");
  tg_clear_error();
  buffer_unref(bi), buffer_unref(bo);
}

/* The names of dir's entries (ending .bin), into names; their count. */
static int new_bins(const char *dir, char names[][256], int cap) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d)) && n < cap;)
    if (strstr(e->d_name, ".bin")) snprintf(names[n++], 256, "%s", e->d_name);
  if (d) closedir(d);
  return n;
}

/* The first of after[0..na) that is not among before[0..nb) (an entry a compile added), or NULL */
static const char *added_bin(char after[][256], int na, char before[][256], int nb) {
  for (int i = 0; i < na; i++) {
    bool old = false;
    for (int j = 0; j < nb; j++) old = old || strcmp(after[i], before[j]) == 0;
    if (!old) return after[i];
  }
  return NULL;
}

/* An entry holds its whole key: two kernels' entries swapped on disk (or one copied over the other)
 * are rebuilt, never run in each other's place (the entries held only a checksum of their payload,
 * and the swapped binaries ran: a*2 gave a+1's values). */
TEST(cl_cache_swapped_entries_rebuilt) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/cl", g_cache);
  const char *src[2] = {"__kernel void same(__global float *restrict o, __global const float *restrict i) {\n"
                        "  long g = (long)get_global_id(0); o[g] = 2.0f * i[g];\n}\n",
                        "__kernel void same(__global float *restrict o, __global const float *restrict i) {\n"
                        "  long g = (long)get_global_id(0); o[g] = 1.0f + i[g];\n}\n"};
  char before[64][256], after[64][256], path[2][900];
  uint8_t *lib[2] = {NULL, NULL};
  size_t len[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    int nb = new_bins(dir, before, 64);
    CHECK(cl->vt->compile(cl->state, src[k], &lib[k], &len[k]) == TG_OK);
    const char *name = added_bin(after, new_bins(dir, after, 64), before, nb);
    path[k][0] = 0;
    if (name) snprintf(path[k], sizeof path[k], "%s/%.255s", dir, name);
    CHECK_MSG(path[k][0], "kernel %d wrote no entry", k);
  }
  if (!path[0][0] || !path[1][0]) return;
  char tmp[920];
  snprintf(tmp, sizeof tmp, "%s.swap", path[0]);
  CHECK(rename(path[0], tmp) == 0 && rename(path[1], path[0]) == 0 && rename(tmp, path[1]) == 0);
  for (int k = 0; k < 2; k++) {
    uint8_t *again = NULL;
    size_t n = 0;
    CHECK(cl->vt->compile(cl->state, src[k], &again, &n) == TG_OK);
    /* rebuilt from its own source: the same binary as its first build, not the other's */
    CHECK_MSG(n == len[k] && again && lib[k] && memcmp(again, lib[k], n) == 0, "kernel %d got another binary", k);
    free(again);
  }
  Program *p = program_get(cl, "same", src[0]);
  CHECK_MSG(p != NULL, "%s", tg_last_error());
  if (p) {
    float in[4] = {0, 1, 2, 3}, out[4] = {0};
    Buffer *bi = buffer_new(cl, sizeof in), *bo = buffer_new(cl, sizeof out);
    CHECK(buffer_copyin(bi, in, sizeof in) == TG_OK);
    void *bufs[2] = {bo->ptr, bi->ptr};
    int64_t gs[3] = {4, 1, 1};
    CHECK(program_exec(p, bufs, 2, 0, gs, NULL, false) == 0.0);
    cl->vt->synchronize(cl->state);
    CHECK(buffer_copyout(bo, out, sizeof out) == TG_OK);
    CHECK_MSG(out[3] == 6.0f, "a*2 of 3 gave %g", out[3]);
    buffer_unref(bi), buffer_unref(bo);
  }
  free(lib[0]), free(lib[1]);
}


/* Cache entries other users could plant in a shared cache directory: a FIFO at an entry's path
 * (the open waited forever for a writer), a huge file there (read whole), and links at the names of
 * the temporary files a new entry is written through (followed: their targets were overwritten).
 * Each is rebuilt over or refused; no link target changes. */
TEST(cl_cache_planted_entries) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/cl", g_cache);
  char victim[600];
  snprintf(victim, sizeof victim, "%s/victim", g_cache);
  FILE *vf = fopen(victim, "w");
  CHECK(vf && fputs("precious data\n", vf) >= 0 && fclose(vf) == 0);
  /* links at the next temporary names this thread would write (the counter is process-wide) */
  char link[700];
  mkdir(dir, 0755);
  for (int n = 0; n < 400; n++) {
    snprintf(link, sizeof link, "%s/.tmp-%d-%ld-%d", dir, (int)getpid(), (long)syscall(SYS_gettid), n);
    if (symlink(victim, link) != 0 && errno != EEXIST) break;
  }
  for (int kind = 0; kind < 3; kind++) {
    char src[400];
    snprintf(src, sizeof src,
             "__kernel void planted%d(__global float *restrict o, __global const float *restrict i) {\n"
             "  long g = (long)get_global_id(0); o[g] = %d.0f + i[g];\n}\n", kind, kind + 3);
    char before[64][256], after[64][256];
    int nb = new_bins(dir, before, 64);
    uint8_t *lib = NULL;
    size_t len = 0;
    CHECK(cl->vt->compile(cl->state, src, &lib, &len) == TG_OK && len > 0);
    free(lib);
    if (kind == 0) { /* links in the way: no entry was written, nothing else changed */
      CHECK(new_bins(dir, after, 64) == nb);
      for (int n = 0; n < 400; n++) {
        snprintf(link, sizeof link, "%s/.tmp-%d-%ld-%d", dir, (int)getpid(), (long)syscall(SYS_gettid), n);
        unlink(link);
      }
      continue;
    }
    /* the new entry: plant a FIFO (kind 1) or a 4 GB sparse file (kind 2) in its place */
    const char *name = added_bin(after, new_bins(dir, after, 64), before, nb);
    CHECK_MSG(name != NULL, "kind %d: no new entry", kind);
    if (!name) continue;
    char path[900];
    snprintf(path, sizeof path, "%s/%.255s", dir, name);
    CHECK(unlink(path) == 0);
    if (kind == 1) CHECK(mkfifo(path, 0644) == 0);
    else {
      int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      CHECK(fd >= 0 && ftruncate(fd, (off_t)4 << 30) == 0);
      if (fd >= 0) close(fd);
    }
    alarm(60); /* a hang fails the test (SIGALRM) instead of stalling the suite */
    lib = NULL;
    CHECK(cl->vt->compile(cl->state, src, &lib, &len) == TG_OK && len > 0);
    alarm(0);
    free(lib);
  }
  vf = fopen(victim, "r");
  char got[64] = {0};
  CHECK(vf && fgets(got, sizeof got, vf) && strcmp(got, "precious data\n") == 0);
  if (vf) fclose(vf);
  CHECK(!tg_has_error());
}

/* ---------------------------------------------------------------------------------------------- */
/* computations: CL against CPU                                                                    */

typedef tg_tensor (*build_fn)(const char *dev);

static tg_tensor mk(const char *dev, int64_t r, int64_t c, float seed, tg_dtype dt) {
  float *d = malloc(sizeof(float) * (size_t)(r * c));
  for (int64_t i = 0; i < r * c; i++) d[i] = sinf((float)i * 0.37f + seed) * 3.0f;
  tg_tensor t = tg_cast(tg_from_data(d, TG_SHAPE(r, c), TG_OPTS(.device = dev)), dt);
  free(d);
  return t;
}

/* Realizes f on CPU and on CL (with setting=value there unless NULL); compares values (as
 * float64) within tol and the kernel counts. */
static void same_on_cl_set(const char *what, build_fn f, double tol, const char *setting, const char *opts) {
  BEGIN;
  double *v[2] = {NULL, NULL};
  int64_t n[2] = {0, 0};
  uint64_t kernels[2] = {0, 0};
  const char *devs[2] = {"CPU", "CL"};
  for (int i = 0; i < 2; i++) {
    tg_tensor x = f(devs[i]);
    CHECK_MSG(x.id != 0, "%s: %s", what, tg_last_error());
    if (!x.id) break;
    CHECK(strcmp(tg_device_of(x), devs[i]) == 0);
    bool forced = opts && i == 1;
    if (forced) tg_context_begin(), tg_context_set(setting, opts);
    uint64_t k0 = tg_global_counters().kernel_count;
    tg_status st = tg_realize(x);
    kernels[i] = tg_global_counters().kernel_count - k0;
    if (forced) tg_context_end();
    CHECK_MSG(st == TG_OK, "%s on %s: %s", what, devs[i], tg_last_error());
    if (st != TG_OK) break;
    tg_tensor h = tg_to(tg_cast(x, TG_FLOAT64), "CPU");
    n[i] = tg_numel(h);
    v[i] = malloc(sizeof(double) * (size_t)(n[i] ? n[i] : 1));
    CHECK_MSG(tg_data(h, v[i], sizeof(double) * (size_t)n[i]) == TG_OK, "%s: %s", what, tg_last_error());
  }
  if (v[0] && v[1]) {
    CHECK_MSG(n[0] == n[1], "%s", what);
    CHECK_MSG(kernels[0] == kernels[1], "%s: %llu kernels on CPU, %llu on CL", what, (unsigned long long)kernels[0],
              (unsigned long long)kernels[1]);
    int bad = 0;
    for (int64_t i = 0; i < n[0] && i < n[1]; i++) {
      double a = v[0][i], b = v[1][i];
      bool ok = (isnan(a) && isnan(b)) || a == b || fabs(a - b) <= tol * (1 + fabs(a));
      if (!ok && bad++ < 3) fprintf(stderr, "  %s[%lld]: CPU %.9g, CL %.9g\n", what, (long long)i, a, b);
    }
    CHECK_MSG(bad == 0, "%s: %d values differ", what, bad);
  }
  free(v[0]), free(v[1]);
  tg_clear_error();
  END;
}

static void same_on_cl(const char *what, build_fn f, double tol) { same_on_cl_set(what, f, tol, NULL, NULL); }

static tg_tensor f_elementwise(const char *d) {
  tg_tensor a = mk(d, 37, 53, 0, TG_FLOAT32), b = mk(d, 1, 53, 1, TG_FLOAT32);
  return tg_where(tg_lt(a, b), tg_exp(tg_mul(a, b)), tg_sqrt(tg_abs(tg_sub(a, b))));
}
static tg_tensor f_sum_rows(const char *d) { return tg_sum(mk(d, 8, 3000, 0, TG_FLOAT32), TG_AXES(1), false); }
static tg_tensor f_max_cols(const char *d) { return tg_max(mk(d, 300, 7, 0, TG_FLOAT32), TG_AXES(0), false); }
static tg_tensor f_sum_all(const char *d) { return tg_sum(mk(d, 100, 100, 2, TG_FLOAT32), NULL, 0, false); }
static tg_tensor f_softmax(const char *d) { return tg_softmax(mk(d, 16, 1000, 0, TG_FLOAT32), -1); }
static tg_tensor f_matmul(const char *d) { return tg_matmul(mk(d, 33, 65, 0, TG_FLOAT32), mk(d, 65, 17, 3, TG_FLOAT32)); }
static tg_tensor f_permuted(const char *d) {
  tg_tensor a = tg_reshape(mk(d, 6, 60, 0, TG_FLOAT32), TG_SHAPE(2, 3, 4, 5, 3));
  return tg_contiguous(tg_add_s(tg_flip(tg_permute(a, TG_AXES(4, 2, 0, 3, 1)), TG_AXES(1)), 1));
}
static tg_tensor f_half(const char *d) {
  tg_tensor a = mk(d, 16, 70, 0, TG_FLOAT16), b = mk(d, 16, 70, 1, TG_FLOAT16);
  return tg_sum(tg_mul(tg_add(a, b), a), TG_AXES(1), false);
}
static tg_tensor f_bf16(const char *d) {
  tg_tensor a = mk(d, 16, 70, 0, TG_BFLOAT16);
  return tg_sum(tg_exp(tg_mul_s(a, 0.5)), TG_AXES(1), false);
}
static tg_tensor f_f64(const char *d) { return tg_sum(tg_mul(mk(d, 9, 300, 0, TG_FLOAT64), mk(d, 9, 300, 1, TG_FLOAT64)), TG_AXES(1), false); }
static tg_tensor f_int(const char *d) {
  tg_tensor a = mk(d, 12, 40, 0, TG_INT32), b = mk(d, 12, 40, 2, TG_INT32);
  return tg_sum(tg_add(tg_mul(a, b), tg_idiv(a, tg_add_s(b, 7))), TG_AXES(0), false);
}
static tg_tensor f_grad(const char *d) {
  tg_tensor w = mk(d, 20, 30, 0, TG_FLOAT32);
  tg_set_requires_grad(w, true);
  tg_tensor loss = tg_sum(tg_log_softmax(tg_matmul(mk(d, 8, 20, 1, TG_FLOAT32), w), -1), NULL, 0, false);
  if (tg_backward(loss) != TG_OK) return (tg_tensor){0};
  return tg_grad(w);
}

TEST(cl_matches_cpu) {
  tg_clear_error();
  if (!device_get("CL")) return;
  same_on_cl("elementwise", f_elementwise, 2e-6);
  same_on_cl("sum of rows", f_sum_rows, 1e-5);
  same_on_cl("max of columns", f_max_cols, 0);
  same_on_cl("sum of all", f_sum_all, 1e-5);
  same_on_cl("softmax", f_softmax, 1e-6);
  same_on_cl("matmul", f_matmul, 2e-4); /* 65 products of |x| <= 9 summed in another order */
  same_on_cl("permute flip contiguous", f_permuted, 0);
  same_on_cl("float16", f_half, 2e-3);
  same_on_cl("bfloat16", f_bf16, 1e-2);
  same_on_cl("float64", f_f64, 1e-12);
  same_on_cl("int32", f_int, 0);
  same_on_cl("autograd through log_softmax(matmul)", f_grad, 2e-4);
}

/* conv -> relu -> affine -> 2x2 max-pool -> linear, the tail of beautiful_mnist's evaluation at 200
 * images. The pool is computed inside the convolution's kernel (a combining store: the window's
 * positions max into one output in turn). On the CPU the window's positions are loop iterations; on
 * CL they are copies inside one work-item. When they were work-items of their own they raced on the
 * store (this model gave 150 of 1000 wrong predictions, and NaNs where no position stored). */
static tg_tensor f_conv_pool_linear(const char *d) {
  tg_tensor x = tg_reshape(mk(d, 200, 64 * 8 * 8, 0, TG_FLOAT32), TG_SHAPE(200, 64, 8, 8));
  tg_tensor w = tg_mul_s(tg_reshape(mk(d, 64, 64 * 9, 1, TG_FLOAT32), TG_SHAPE(64, 64, 3, 3)), 0.02);
  tg_tensor sc = tg_reshape(mk(d, 1, 64, 2, TG_FLOAT32), TG_SHAPE(1, 64, 1, 1));
  tg_tensor c = tg_relu(tg_conv2d(x, w, (tg_tensor){0}, NULL));
  tg_tensor p = tg_max_pool2d(tg_add_s(tg_mul(c, sc), 0.25), NULL);
  return tg_matmul(tg_flatten(p, 1, -1), tg_mul_s(mk(d, 576, 10, 3, TG_FLOAT32), 0.05));
}

TEST(cl_window_pool_fused_in_one_work_item) {
  tg_clear_error();
  if (!device_get("CL")) return;
  BEGIN;
  double *v[2] = {NULL, NULL};
  uint64_t kernels[3] = {0, 0, 0};
  const char *devs[3] = {"CPU", "CL", "CPU"};
  for (int i = 0; i < 3; i++) {
    if (i == 2) tg_context_begin(), tg_context_set("FUSE_WINDOW", "0");
    tg_tensor y = f_conv_pool_linear(devs[i]);
    uint64_t k0 = tg_global_counters().kernel_count;
    CHECK_MSG(tg_realize(y) == TG_OK, "%s: %s", devs[i], tg_last_error());
    kernels[i] = tg_global_counters().kernel_count - k0;
    if (i < 2) {
      v[i] = malloc(sizeof(double) * 2000);
      CHECK(tg_data(tg_to(tg_cast(y, TG_FLOAT64), "CPU"), v[i], sizeof(double) * 2000) == TG_OK);
    }
    if (i == 2) tg_context_end();
  }
  /* CL fuses the pool as the CPU does (one kernel fewer than with FUSE_WINDOW=0) */
  CHECK_MSG(kernels[0] + 1 == kernels[2] && kernels[1] == kernels[0], "kernels: CPU %llu, CL %llu, CPU unfused %llu",
            (unsigned long long)kernels[0], (unsigned long long)kernels[1], (unsigned long long)kernels[2]);
  int bad = 0;
  for (int i = 0; v[0] && v[1] && i < 2000; i++)
    if (!(fabs(v[0][i] - v[1][i]) <= 1e-4 * (1 + fabs(v[0][i]))) && bad++ < 3)
      fprintf(stderr, "  [%d]: CPU %.9g, CL %.9g\n", i, v[0][i], v[1][i]);
  CHECK_MSG(bad == 0, "%d of 2000 values differ", bad);
  free(v[0]), free(v[1]);
  END;
}

/* a 1x1 convolution written as a broadcast product summed over the input channels, then a 2x2
 * max-pool: one kernel on the CPU and on CL (the pool fused into the reduction; a work-item per
 * pooled output, its window's four positions copies inside it). It reads its realized inputs as
 * they are (no layout copy), so a forced Opt list meets that kernel alone. Under such lists, BEAM=2,
 * NOOPT, and the GPU heuristics' own list (as a GPU not made of CPU cores would choose it): the
 * CPU's values. */
static tg_tensor f_sum_pool(const char *d) {
  tg_tensor x = tg_reshape(mk(d, 4, 8 * 8 * 8, 0, TG_FLOAT32), TG_SHAPE(4, 1, 8, 8, 8));
  tg_tensor w = tg_reshape(mk(d, 16, 8, 1, TG_FLOAT32), TG_SHAPE(1, 16, 8, 1, 1));
  tg_tensor c = tg_sum(tg_mul(x, w), TG_AXES(2), false);
  return tg_max_pool2d(tg_add_s(tg_relu(c), 0.25), NULL);
}

/* two 5x5 convolutions with bias and relu, then a 2x2 max-pool (beautiful_mnist's first layers) */
static tg_tensor f_conv5_pool(const char *d) {
  tg_tensor x = tg_reshape(mk(d, 32, 28 * 28, 4, TG_FLOAT32), TG_SHAPE(32, 1, 28, 28));
  tg_tensor w1 = tg_mul_s(tg_reshape(mk(d, 32, 25, 6, TG_FLOAT32), TG_SHAPE(32, 1, 5, 5)), 0.1);
  tg_tensor w2 = tg_mul_s(tg_reshape(mk(d, 32, 32 * 25, 5, TG_FLOAT32), TG_SHAPE(32, 32, 5, 5)), 0.02);
  tg_tensor b1 = tg_reshape(mk(d, 1, 32, 7, TG_FLOAT32), TG_SHAPE(32)), b2 = tg_reshape(mk(d, 1, 32, 8, TG_FLOAT32), TG_SHAPE(32));
  tg_tensor h = tg_relu(tg_conv2d(x, w1, b1, NULL));
  return tg_max_pool2d(tg_relu(tg_conv2d(h, w2, b2, NULL)), NULL);
}

TEST(cl_window_pool_opts) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  same_on_cl_set("sum + pool", f_sum_pool, 1e-5, NULL, NULL);
  const char *lists[] = {"NOLOCALS", "LOCAL:3:4", "UPCAST:1:4", "UPCAST:0:2,LOCAL:2:2,LOCAL:3:4", "SWAP:0:1,UPCAST:3:4"};
  for (size_t i = 0; i < sizeof lists / sizeof *lists; i++)
    same_on_cl_set(lists[i], f_sum_pool, 1e-5, "GPU_OPTS", lists[i]);
  same_on_cl_set("BEAM=2 sum + pool", f_sum_pool, 1e-5, "BEAM", "2");
  same_on_cl_set("NOOPT=1 sum + pool", f_sum_pool, 1e-5, "NOOPT", "1");
  same_on_cl_set("conv5 + pool", f_conv5_pool, 1e-4, NULL, NULL);
  BEGIN;
  /* on a device of CPU cores a work-group is the whole of the two fastest dimensions when they are
   * small (one image's output positions share its input through the cache), the driver's choice
   * on a GPU */
  KernelCode *kp = last_kernel(f_conv5_pool("CL"), &cl->caps, NULL);
  CHECK(kp != NULL);
  if (kp) {
    CHECK_MSG(kp->global_size[0] * kp->global_size[1] <= 1024 && kp->global_size[2] >= 16 &&
                  kp->local_size[0] == kp->global_size[0] && kp->local_size[1] == kp->global_size[1] && kp->local_size[2] == 1,
              "%s: global %lldx%lldx%lld local %lldx%lldx%lld", kp->name, (long long)kp->global_size[0],
              (long long)kp->global_size[1], (long long)kp->global_size[2], (long long)kp->local_size[0],
              (long long)kp->local_size[1], (long long)kp->local_size[2]);
    kernel_code_free(kp);
  }
  DeviceCaps gcaps = cl->caps;
  gcaps.cpu_cores = false;
  KernelCode *kc = last_kernel(f_sum_pool("CL"), &gcaps, NULL);
  CHECK(kc != NULL);
  if (kc) {
    char list[256];
    optlist_format(&kc->applied, list, sizeof list);
    /* a work-item per pooled output (4 x 16 x 4 x 4): the window's loops are not global loops */
    CHECK_MSG(strcmp(kc->name, "r_4_16_4_4_8") == 0, "kernel %s [%s]", kc->name, kc->opts);
    same_on_cl_set(list, f_sum_pool, 1e-5, "GPU_OPTS", list[0] ? list : "NOLOCALS");
    kernel_code_free(kc);
  }
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* forced Opt lists                                                                                */

/* f under GPU_OPTS=opts on CL: as many kernels as on the CPU, and the CPU's values. */
static void forced(const char *opts, build_fn f, double tol) { same_on_cl_set(opts, f, tol, "GPU_OPTS", opts); }

static tg_tensor f_sum_rows_odd(const char *d) { return tg_sum(mk(d, 12, 1001, 0, TG_FLOAT32), TG_AXES(1), false); }
static tg_tensor f_max_rows(const char *d) { return tg_max(mk(d, 12, 1001, 0, TG_FLOAT32), TG_AXES(1), false); }
/* two global loops that do not merge (one operand is transposed) */
static tg_tensor f_add2d(const char *d) { return tg_add(mk(d, 24, 40, 0, TG_FLOAT32), tg_permute(mk(d, 40, 24, 1, TG_FLOAT32), TG_AXES(1, 0))); }

TEST(cl_forced_opts) {
  tg_clear_error();
  if (!device_get("CL")) return;
  forced("GROUP:0:16", f_sum_rows_odd, 1e-4); /* 1001 terms of |x| <= 3 in another order */
  forced("GROUPTOP:0:16", f_sum_rows_odd, 1e-4);
  forced("GROUPTOP:0:64", f_max_rows, 0);
  forced("GROUP:0:128,LOCAL:0:4", f_sum_rows_odd, 1e-4);
  forced("UPCAST:0:4,GROUP:0:8", f_sum_rows_odd, 1e-4);
  forced("UNROLL:0:7", f_sum_rows_odd, 1e-4);
  forced("LOCAL:0:8,LOCAL:1:4", f_add2d, 0);
  forced("SWAP:0:1,LOCAL:1:6", f_add2d, 0);
  forced("UPCAST:1:4,LOCAL:0:2", f_add2d, 0);
  forced("NOLOCALS", f_add2d, 0);

  /* lists that do not fit: clear errors */
  struct {
    const char *opts, *msg;
  } bad[] = {
      {"GROUP:0:7000", "does not fit this kernel (global loops [12], reduce loops [1001])"},
      {"LOCAL:0:5", "does not fit"},
      {"GROUP:1:16", "does not fit"},
      {"PADTO:0:16", "does not fit"},
      {"NOLOCALS,LOCAL:0:4", "does not fit"},
      {"WIBBLE:0:1", "is not a list of actions"},
      {"LOCAL:0", "is not a list of actions"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    BEGIN;
    tg_tensor x = f_sum_rows_odd("CL");
    tg_context_begin();
    tg_context_set("GPU_OPTS", bad[i].opts);
    CHECK(tg_realize(x) != TG_OK);
    tg_context_end();
    CHECK_STR_CONTAINS(tg_last_error(), bad[i].msg);
    CHECK_STR_CONTAINS(tg_last_error(), bad[i].opts);
    tg_clear_error();
    END;
  }
}

TEST(cl_kernel_model) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  BEGIN;
  /* the GPU heuristics (those of a device that is not made of CPU cores, as PoCL is) */
  DeviceCaps gcaps = cl->caps;
  gcaps.cpu_cores = false;
  tg_tensor x = tg_sum(mk("CL", 12, 1001, 0, TG_FLOAT32), TG_AXES(1), false);
  /* heuristics: a reduction with few outputs is grouped, dimension 0 holds the group */
  KernelCode *kc = last_kernel(x, &gcaps, NULL);
  CHECK(kc != NULL);
  if (kc) {
    CHECK_STR_CONTAINS(kc->src, "__kernel void r_12_1001(__global float *restrict data0, __global const float *restrict data1)");
    CHECK_STR_CONTAINS(kc->src, "__local float tg_red[");
    CHECK_STR_CONTAINS(kc->src, "barrier(CLK_LOCAL_MEM_FENCE);");
    CHECK_STR_CONTAINS(kc->src, "get_global_id(1)");
    CHECK(kc->local_size[0] >= 2 && kc->global_size[0] == kc->local_size[0] && kc->global_size[1] == 12);
    kernel_code_free(kc);
  }
  /* GROUPTOP:0:32 with LOCAL:0:4: 32 x 4 work-items per group, 3 groups */
  OptList l;
  CHECK(optlist_parse("GROUPTOP:0:32,LOCAL:0:4", &l) && l.n == 2 && l.o[0].op == OPT_GROUPTOP && l.o[1].arg == 4);
  char buf[64];
  optlist_format(&l, buf, sizeof buf);
  CHECK(strcmp(buf, "GROUPTOP:0:32,LOCAL:0:4") == 0);
  kc = last_kernel(x, &cl->caps, &l);
  CHECK(kc != NULL);
  if (kc) {
    CHECK(kc->global_size[0] == 32 && kc->global_size[1] == 12 && kc->local_size[0] == 32 && kc->local_size[1] == 4);
    CHECK_STR_CONTAINS(kc->src, "__local float tg_red[128L];");
    CHECK_STR_CONTAINS(kc->src, "min((long)(1001L)");
    kernel_code_free(kc);
  }
  /* the device's limits: a group bigger than a work-group, or partials past the local memory */
  DeviceCaps small = gcaps;
  small.max_local = small.max_local_dims[0] = 16;
  CHECK(optlist_parse("GROUP:0:32", &l));
  CHECK(last_kernel(x, &small, &l) == NULL);
  small = gcaps;
  small.local_mem = 64;
  CHECK(last_kernel(x, &small, &l) == NULL);
  kc = last_kernel(x, &small, NULL); /* the heuristics fit what there is */
  CHECK(kc != NULL && kc->local_size[0] * 8 <= 64);
  kernel_code_free(kc);
  /* elementwise: loops are work-item ids, innermost in dimension 0; no group size of ours */
  tg_tensor e = tg_contiguous(tg_permute(tg_reshape(mk("CL", 6, 20, 0, TG_FLOAT32), TG_SHAPE(2, 3, 4, 5)), TG_AXES(3, 1, 2, 0)));
  kc = last_kernel(e, &gcaps, NULL);
  CHECK(kc != NULL);
  if (kc) {
    CHECK(kc->local_size[0] == 0);
    CHECK(kc->global_size[0] * kc->global_size[1] * kc->global_size[2] == 120);
    CHECK_STR_CONTAINS(kc->src, "get_global_id(0)");
    kernel_code_free(kc);
  }
  /* on PoCL (CPU cores) the CPU's choices: the sum runs 16 lanes along its reduction, no group;
   * its 12 work-items are work-groups of one (spread over the cores), while a launch of many
   * work-items leaves the work-group size to the driver */
  if (cl->caps.cpu_cores) {
    kc = last_kernel(tg_sum(mk("CL", 12, 1024, 0, TG_FLOAT32), TG_AXES(1), false), &cl->caps, NULL);
    CHECK(kc != NULL);
    if (kc) {
      CHECK_STR_CONTAINS(kc->src, "tg_hadd(acc0)");
      CHECK(strstr(kc->src, "tg_red") == NULL && kc->local_size[0] == 1 && kc->local_size[1] == 1 && kc->local_size[2] == 1);
      kernel_code_free(kc);
    }
    kc = last_kernel(tg_sum(mk("CL", 16384, 32, 0, TG_FLOAT32), TG_AXES(1), false), &cl->caps, NULL);
    CHECK(kc != NULL);
    if (kc) {
      CHECK(kc->global_size[0] * kc->global_size[1] * kc->global_size[2] > 256 && kc->local_size[0] == 0);
      kernel_code_free(kc);
    }
  }
  CHECK(!optlist_parse("GROUP:0", &l) && !optlist_parse("FOO:1:2", &l) && !optlist_parse("LOCAL:-1:2", &l));
  CHECK(optlist_parse("", &l) && l.n == 0);
  END;
}

/* vector UPCASTs: OpenCL C vector types (masks, where, exp2, sqrt, max; gathers of a transposed
 * operand; register tiles of vector accumulators) compute what the CPU computes; the lists forced
 * here include gpu_heuristic's own choice for the matmul */
static tg_tensor f_vec_elementwise(const char *d) {
  tg_tensor a = mk(d, 32, 64, 0, TG_FLOAT32), b = mk(d, 1, 64, 1, TG_FLOAT32);
  tg_tensor w = tg_where(tg_lt(a, b), tg_exp(tg_mul(a, b)), tg_sqrt(tg_abs(tg_sub(a, b))));
  return tg_maximum(tg_relu(w), tg_mul_s(b, 0.5));
}
static tg_tensor f_vec_matmul(const char *d) { return tg_matmul(mk(d, 32, 48, 0, TG_FLOAT32), mk(d, 48, 64, 3, TG_FLOAT32)); }
static tg_tensor f_vec_maxrows(const char *d) { return tg_max(mk(d, 16, 1024, 0, TG_FLOAT32), TG_AXES(0), false); }
static tg_tensor f_vec_relu_grad(const char *d) {
  tg_tensor w = mk(d, 48, 64, 0, TG_FLOAT32);
  tg_set_requires_grad(w, true);
  tg_tensor loss = tg_sum(tg_relu(tg_matmul(mk(d, 32, 48, 1, TG_FLOAT32), w)), NULL, 0, false);
  if (tg_backward(loss) != TG_OK) return (tg_tensor){0};
  return tg_grad(w);
}

TEST(cl_vector_opts) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  forced("UPCAST:1:16", f_vec_elementwise, 2e-6);
  forced("UPCAST:1:4,LOCAL:0:4", f_vec_elementwise, 2e-6);
  forced("UPCAST:1:8", f_add2d, 0); /* the transposed operand is gathered */
  forced("UPCAST:1:16,UPCAST:0:8,UPCAST:1:2", f_vec_matmul, 2e-4);
  forced("UPCAST:1:4,UPCAST:0:4,LOCAL:0:2", f_vec_matmul, 2e-4);
  forced("UPCAST:0:16,UNROLL:0:4", f_vec_maxrows, 0);
  /* the device's own heuristics (on PoCL the CPU's choices, in OpenCL C) */
  same_on_cl("heuristics: matmul", f_vec_matmul, 2e-4);
  same_on_cl("heuristics: relu backward", f_vec_relu_grad, 2e-4);
  same_on_cl("heuristics: elementwise", f_vec_elementwise, 2e-6);
  BEGIN;
  /* the GPU heuristics' matmul: 16 lanes along the output's rows, a tile of 8 rows x 2 vectors */
  DeviceCaps gcaps = cl->caps;
  gcaps.cpu_cores = false;
  tg_tensor x = f_vec_matmul("CL");
  KernelCode *kc = last_kernel(x, &gcaps, NULL);
  CHECK(kc != NULL);
  if (kc) {
    CHECK_STR_CONTAINS(kc->src, "typedef float tg_vf __attribute__((ext_vector_type(16)));");
    CHECK_STR_CONTAINS(kc->src, "(*(const __global tg_vfu *)(data2 + ");
    CHECK_STR_CONTAINS(kc->src, "*(__global tg_vfu *)(data0 + ");
    CHECK(kc->local_size[0] == 0);
    kernel_code_free(kc);
  }
  /* a GROUP reduction keeps scalar accumulators: a vector UPCAST before it does not fit */
  OptList l;
  CHECK(optlist_parse("UPCAST:0:4,GROUP:0:8", &l));
  tg_tensor y = f_vec_maxrows("CL");
  CHECK(last_kernel(y, &cl->caps, &l) == NULL);
  tg_clear_error();
  END;
}

/* On PoCL the kernels take the CPU's hand-coded choices, recorded as an Opt list: applying that
 * list gives the same OpenCL C again (BEAM times it and starts from it), for a matmul's vector
 * tile, a relu backward and an elementwise kernel; and on a GPU that is not made of CPU cores,
 * gpu_heuristic's list replays the same way. */
static int cl_replay_mismatches(tg_tensor t, const DeviceCaps *caps) {
  UOp *u = t_get(t, "cl_replay_mismatches");
  Schedule s;
  int tbuf, bad = 0;
  if (schedule_build(&s, &u, 1, &tbuf) != TG_OK) return 1;
  for (int i = 0; i < s.nitems; i++) {
    if (s.items[i].kind != SI_KERNEL) continue;
    KernelCode *h = codegen_for(s.items[i].ast, caps, NULL);
    KernelCode *r = h ? codegen_for(s.items[i].ast, caps, &h->applied) : NULL;
    if (!r || strcmp(h->src, r->src) != 0 || memcmp(h->local_size, r->local_size, sizeof h->local_size) != 0) {
      fprintf(stderr, "  %s [%s] does not replay\n", h ? h->name : "?", h ? h->opts : "");
      bad++;
    }
    kernel_code_free(h), kernel_code_free(r);
  }
  schedule_free(&s);
  return bad;
}

TEST(cl_heuristic_list_replays) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  BEGIN;
  DeviceCaps gcaps = cl->caps;
  gcaps.cpu_cores = false;
  tg_tensor (*const fs[])(const char *) = {f_vec_matmul, f_vec_relu_grad, f_vec_elementwise, f_vec_maxrows, f_sum_rows_odd};
  for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) {
    tg_tensor x = fs[i]("CL");
    CHECK(cl_replay_mismatches(x, &cl->caps) == 0);
    CHECK(cl_replay_mismatches(x, &gcaps) == 0);
  }
  END;
}

static tg_tensor f_small_sum(const char *d) { return tg_sum(mk(d, 8, 64, 0, TG_FLOAT32), TG_AXES(1), false); }

/* BEAM=2 on CL: the searched kernel computes what the CPU computes (and what NOOPT computes) */
TEST(cl_beam) {
  tg_clear_error();
  if (!device_get("CL")) return;
  same_on_cl_set("BEAM=2 sum", f_small_sum, 1e-5, "BEAM", "2");
  same_on_cl_set("NOOPT=1 sum", f_small_sum, 1e-5, "NOOPT", "1");
}

/* sin of vectors whose lanes mix tiny and huge arguments: PoCL's vector sin gave the tiny lanes the
 * sine of a rescaled value (sin(1e-3) = 0.008, sin(1e-35) = 2^-7) when another lane needed its
 * large-argument reduction; such vectors now go lane by lane. Every lane within 4 ulp (OpenCL's
 * bound for sin) of libm in double precision, for each lane position of a 16-float vector. */
TEST(cl_sin_tiny_lanes_beside_huge_ones) {
  tg_clear_error();
  if (!device_get("CL")) return;
  BEGIN;
  enum { N = 16 * 64 };
  static const float tiny[] = {1e-3f, -2.5e-5f, 0x1.723888p-117f, 1e-38f, -0x1p-149f, 0.0f, 0.01f, -0x1.3408d8p-78f};
  static const float big[] = {1e10f, -3e7f, 8193.0f, 1e30f, 123456.7f, -0x1.fffffep+127f, 65536.5f, 2e5f};
  float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
  for (int i = 0; i < N; i++) {
    int v = i / 16, lane = i % 16;
    /* each vector: one huge lane at position v % 16, tiny ones elsewhere, and ordinary values */
    x[i] = lane == v % 16 ? big[v % 8] : (lane + v) % 3 ? tiny[(lane + v) % 8] : 0.25f * (float)(lane + 1);
  }
  tg_tensor t = tg_from_data(x, TG_SHAPE(N), TG_OPTS(.device = "CL"));
  CHECK(tg_data(tg_sin(t), y, sizeof(float) * N) == TG_OK);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    double want = sin((double)x[i]), sp = fabs(want) < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(want) - 23);
    if (!(fabs((double)y[i] - want) <= 4 * sp) && bad++ < 3) fprintf(stderr, "  sin(%a) = %a, want %a\n", x[i], y[i], want);
  }
  CHECK_MSG(bad == 0, "%d of %d sines off by more than 4 ulp", bad, N);
  free(x), free(y);
  END;
}

/* kernels that PoCL's default work-group method ("loopvec") handed to LLVM 15's vectorizers, whose
 * x86 back end then aborted the process ("Cannot select X86ISD::VBROADCAST"): an argsort of 200
 * floats, a bfloat16 sort. The library opens the driver with POCL_WORK_GROUP_METHOD=loops. */
TEST(cl_sorts_that_crashed_the_driver) {
  tg_clear_error();
  if (!device_get("CL")) return;
  BEGIN;
  float x[200];
  for (int i = 0; i < 200; i++) x[i] = (float)((i * 37) % 101);
  int32_t idx[200];
  CHECK(tg_data(tg_argsort(tg_from_data(x, TG_SHAPE(200), TG_OPTS(.device = "CL")), -1, false), idx, sizeof idx) == TG_OK);
  for (int i = 1; i < 200; i++) CHECK(x[idx[i - 1]] < x[idx[i]] || (x[idx[i - 1]] == x[idx[i]] && idx[i - 1] < idx[i]));
  CHECK(idx[0] == 0 && idx[199] == 131);
  tg_tensor b = tg_cast(tg_arange(40, 0, -1, TG_OPTS(.device = "CL")), TG_BFLOAT16);
  tg_tensor sv, si;
  CHECK(tg_sort(b, -1, false, &sv, &si) == TG_OK);
  float v[40];
  int32_t vi[40];
  CHECK(tg_data(tg_cast(sv, TG_FLOAT32), v, sizeof v) == TG_OK && tg_data(si, vi, sizeof vi) == TG_OK);
  for (int i = 0; i < 40; i++) CHECK(v[i] == (float)(i + 1) && vi[i] == 39 - i);
  END;
}

/* fp8 on CL (a device with float64): every bit pattern to float32, a sweep of floats (ties, subnormals,
 * overflow, inf, NaN, -0 and negatives that round to zero) to the OCP and the fnuz fp8 formats, and a
 * view of fp8 data copied, all equal to the CPU's (CL refused every fp8 computation) */
TEST(cl_fp8_matches_cpu) {
  tg_clear_error();
  if (!device_get("CL")) return;
  BEGIN;
  uint8_t bits[256];
  for (int i = 0; i < 256; i++) bits[i] = (uint8_t)i;
  enum { NF = 600 };
  float f[NF];
  for (int i = 0; i < NF; i++) f[i] = (float)ldexp(1.0 + (i % 37) / 16.0, i / 37 - 12) * (i % 2 ? -1.0f : 1.0f);
  f[0] = INFINITY, f[1] = -INFINITY, f[2] = NAN, f[3] = 448.0f, f[4] = 464.0f, f[5] = 57344.0f, f[6] = 61440.0f, f[7] = 0x1p-9f, f[8] = 0x1p-17f;
  f[9] = 244.0f, f[10] = 248.0f, f[11] = -0x1p-12f, f[12] = -0.0f, f[13] = -0x1p-19f, f[14] = -NAN;
  const tg_dtype fmts[4] = {TG_FP8E4M3, TG_FP8E5M2, TG_FP8E4M3FNUZ, TG_FP8E5M2FNUZ};
  for (int fmt = 0; fmt < 4; fmt++) {
    tg_dtype dt = fmts[fmt];
    float a[256], b[256];
    uint8_t qa[NF], qb[NF];
    CHECK(tg_data(tg_cast(tg_from_data(bits, TG_SHAPE(256), TG_OPTS(.dtype = dt, .device = "CL")), TG_FLOAT32), a, sizeof a) == TG_OK);
    CHECK(tg_data(tg_cast(tg_from_data(bits, TG_SHAPE(256), TG_OPTS(.dtype = dt)), TG_FLOAT32), b, sizeof b) == TG_OK);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(tg_data(tg_bitcast(tg_cast(tg_from_data(f, TG_SHAPE(NF), TG_OPTS(.dtype = TG_FLOAT32, .device = "CL")), dt), TG_UINT8), qa, sizeof qa) == TG_OK);
    CHECK(tg_data(tg_bitcast(tg_cast(tg_from_data(f, TG_SHAPE(NF), TG_OPTS(.dtype = TG_FLOAT32)), dt), TG_UINT8), qb, sizeof qb) == TG_OK);
    int bad = 0;
    for (int i = 0; i < NF; i++) bad += qa[i] != qb[i];
    CHECK_MSG(bad == 0, "%s: %d of %d conversions differ from the CPU's", tg_dtype_name(dt), bad, NF);
    /* a copy of a view (a flip), as the CPU makes it */
    uint8_t fa[256], fb[256];
    CHECK(tg_data(tg_flip(tg_from_data(bits, TG_SHAPE(256), TG_OPTS(.dtype = dt, .device = "CL")), TG_AXES(0)), fa, sizeof fa) == TG_OK);
    CHECK(tg_data(tg_flip(tg_from_data(bits, TG_SHAPE(256), TG_OPTS(.dtype = dt)), TG_AXES(0)), fb, sizeof fb) == TG_OK);
    CHECK(memcmp(fa, fb, sizeof fa) == 0 && fa[0] == 255 && fa[255] == 0);
  }
  END;
}

/* float64 on a device without cl_khr_fp64 is an error naming the extension, not a build failure; so
 * is fp8 (OCP or fnuz), whose conversions work on the double */
TEST(cl_float64_needs_fp64) {
  tg_clear_error();
  Device *cl = device_get("CL");
  if (!cl) return;
  BEGIN;
  tg_tensor x = tg_sum(mk("CL", 3, 40, 0, TG_FLOAT64), TG_AXES(1), false);
  DeviceCaps caps = cl->caps;
  caps.fp64 = false;
  CHECK(last_kernel(x, &caps, NULL) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "cl_khr_fp64");
  tg_clear_error();
  caps.fp64 = true;
  KernelCode *kc = last_kernel(x, &caps, NULL);
  CHECK(kc != NULL && strstr(kc->src, "double") != NULL);
  kernel_code_free(kc);
  /* the fp8 conversions round the double's bits: every fp8 dtype, OCP and fnuz, needs it too */
  for (int dt = TG_FP8E4M3; dt <= TG_FP8E5M2FNUZ; dt++) {
    tg_tensor y = tg_add(mk("CL", 3, 40, 0, (tg_dtype)dt), mk("CL", 3, 40, 1, (tg_dtype)dt));
    caps.fp64 = false;
    CHECK(last_kernel(y, &caps, NULL) == NULL);
    CHECK_STR_CONTAINS(tg_last_error(), "fp8 dtypes");
    tg_clear_error();
    caps.fp64 = true;
    kc = last_kernel(y, &caps, NULL);
    CHECK_MSG(kc != NULL && strstr(kc->src, "tg_f2f8") != NULL, "%s", tg_dtype_name((tg_dtype)dt));
    kernel_code_free(kc);
  }
  END;
}

/* The child of cl_address_space_limit: lowers its own address-space limit to what it maps now plus
 * 700 MB, then asks CL for five 300 MB buffers (each written, so PoCL maps it). Exit 0 when the ones
 * past the limit were refused with the error naming it and the others hold their data; PoCL aborted
 * the process at a buffer's first use before. */
static int address_space_child(void) {
  Device *cl = device_get("CL");
  if (!cl) return 3;
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0) return 4;
  rl.rlim_cur = (rlim_t)(process_vm_bytes() + ((size_t)700 << 20));
  if (setrlimit(RLIMIT_AS, &rl) != 0) return 5;
  const size_t SZ = (size_t)300 << 20;
  char *host = malloc(SZ);
  if (!host) return 6;
  memset(host, 7, SZ);
  Buffer *b[5] = {0};
  int got = 0, refused = 0;
  for (int i = 0; i < 5; i++) {
    tg_clear_error();
    b[i] = buffer_new(cl, SZ);
    if (b[i] && buffer_copyin(b[i], host, SZ) == TG_OK) got++;
    else if (!b[i] && tg_last_error() && strstr(tg_last_error(), "address-space limit")) refused++;
  }
  for (int i = 0; i < 5; i++) buffer_unref(b[i]);
  free(host);
  return got >= 1 && refused >= 1 && got + refused == 5 ? 0 : 10 + got * 10 + refused;
}

/* (sys/wait.h brings signal.h, whose SI_KERNEL the schedule's enum also names) */
pid_t waitpid(pid_t pid, int *status, int options);

TEST(cl_address_space_limit) {
  if (!device_get("CL")) return;
  pid_t pid = fork();
  if (pid == 0) { /* a fresh process: PoCL's threads do not survive a fork */
    setenv("TG_TEST_CL_ADDRESS_CHILD", "1", 1);
    execl("/proc/self/exe", "test_cl", (char *)NULL);
    _exit(127);
  }
  int ws = 0;
  CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid);
  CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child: %s %d", WIFEXITED(ws) ? "exit" : "signal",
            WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? WTERMSIG(ws) : -1);
}

int main(void) {
  if (getenv("TG_TEST_CL_ADDRESS_CHILD")) return address_space_child();
  snprintf(g_cache, sizeof g_cache, "%s/tg-test-cl-XXXXXX", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_cache)) return 2;
  setenv("TINYGRAD_CACHE_DIR", g_cache, 1);
  int rc = RUN_TESTS();
  program_tier_wait(); /* a background build of a CPU kernel may still be writing into the cache */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache);
  if (system(cmd) != 0) rc = rc ? rc : 1;
  CHECK(tg_live_count() == 0);
  return rc;
}
