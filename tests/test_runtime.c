/*
 * test_runtime.c -- the runtime layer on its own: device strings, buffers and the caching allocator,
 * cross-device copies, compiling/loading/running hand-written C kernels on the thread pool, compile
 * errors, the on-disk kernel cache (hits, damaged entries, disabling it), and dispatch latency
 * (printed, not asserted). The kernel cache goes to a fresh temporary directory.
 */
#include <dirent.h>
#include <math.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/runtime/device.h"
size_t kernel_cache_count(void); /* engine/realize.c: entries of the in-memory kernel cache */
#include "../src/runtime/threadpool.h"
#include "test.h"

static char g_cache_root[256];

static char *kernels_dir(void) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/kernels", g_cache_root);
  return buf;
}

/* Number of cache entries (*.so) and the inode of the first one. */
static int cache_entries(char *first, size_t cap) {
  DIR *d = opendir(kernels_dir());
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (len > 3 && strcmp(e->d_name + len - 3, ".so") == 0) {
      if (n == 0 && first) snprintf(first, cap, "%s/%s", kernels_dir(), e->d_name);
      n++;
    }
  }
  closedir(d);
  return n;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void clear_cache_dir(void) { nftw(kernels_dir(), rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static const char *ADD_SRC = "#include <stdint.h>\n"
                             "void add_f32(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
                             "  float *restrict c = bufs[0];\n"
                             "  const float *restrict a = bufs[1], *restrict b = bufs[2];\n"
                             "  for (int64_t i = gstart; i < gend; i++) c[i] = a[i] + b[i];\n"
                             "}\n";

/* Counts its calls and how often each index is visited. */
static const char *COVER_SRC = "#include <stdint.h>\n"
                               "void cover(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
                               "  int *hits = bufs[0];\n"
                               "  __atomic_fetch_add((int *)bufs[1], 1, __ATOMIC_RELAXED);\n"
                               "  for (int64_t i = gstart; i < gend; i++) hits[i]++;\n"
                               "}\n";

static const char *NOP_SRC = "#include <stdint.h>\n"
                             "void nop(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
                             "  (void)bufs; (void)gstart; (void)gend;\n"
                             "}\n";

/* ---------------------------------------------------------------------------------------------- */

TEST(device_get_names) {
  tg_clear_error();
  Device *a = device_get("CPU");
  CHECK(a != NULL);
  if (!a) return;
  CHECK(strcmp(a->name, "CPU") == 0);
  CHECK(a->index == 0);
  CHECK(device_get("cpu") == a);
  CHECK(device_get("Cpu:0") == a);
  CHECK(device_get(NULL) == a);
  /* an empty name is not the default device: an error (tinygrad refuses "" too) */
  CHECK(device_get("") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "device_get: the device name \"\" is empty");
  tg_clear_error();
  CHECK(device_default() == a);
  Device *b = device_get("CPU:1");
  CHECK(b != NULL && b != a);
  if (b) {
    CHECK(strcmp(b->name, "CPU:1") == 0);
    CHECK(b->index == 1);
    CHECK(device_get("cpu:1") == b);
    CHECK(device_by_id(b->id) == b);
  }
  CHECK(device_by_id(a->id) == a);
  CHECK(device_by_id(-1) == NULL);
  CHECK(device_by_id(1 << 20) == NULL);
  CHECK(!tg_has_error());
}

TEST(device_get_from_dev_setting) {
  tg_context_begin();
  tg_context_set("DEV", "cpu:1");
  Device *d = device_get(NULL);
  CHECK(d != NULL && strcmp(d->name, "CPU:1") == 0);
  tg_context_end();
  d = device_get(NULL);
  CHECK(d != NULL && strcmp(d->name, "CPU") == 0);
}

/* The CPU device knows the host's data caches (they size matmul's row blocks): plausible sizes,
 * growing by level, the L1 and L2 the ones the C library reports where it reports them */
TEST(cpu_caps_know_the_caches) {
  Device *d = device_get("CPU");
  CHECK(d != NULL);
  if (!d) return;
  const DeviceCaps *c = &d->caps;
  CHECK_MSG(c->l1d_bytes >= (8 << 10) && c->l1d_bytes <= (4 << 20), "L1 %lld", (long long)c->l1d_bytes);
  CHECK_MSG(c->l2_bytes >= c->l1d_bytes && c->l2_bytes <= (256 << 20), "L2 %lld", (long long)c->l2_bytes);
  CHECK_MSG(c->l3_bytes == 0 || c->l3_bytes >= c->l2_bytes, "L3 %lld", (long long)c->l3_bytes);
  if (access("/sys/devices/system/cpu/cpu0/cache/index3/size", R_OK) == 0) CHECK(c->l3_bytes > 0);
#ifdef _SC_LEVEL1_DCACHE_SIZE
  if (sysconf(_SC_LEVEL1_DCACHE_SIZE) > 0) CHECK(c->l1d_bytes == sysconf(_SC_LEVEL1_DCACHE_SIZE));
  if (sysconf(_SC_LEVEL2_CACHE_SIZE) > 0) CHECK(c->l2_bytes == sysconf(_SC_LEVEL2_CACHE_SIZE));
#endif
}

TEST(device_get_errors) {
  const char *bad[] = {"XYZ", "CPU:", "CPU:x", "CPU:-1", "CPUX", "CPU:1:2", ":1", "CPU:99999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tg_clear_error();
    CHECK_MSG(device_get(bad[i]) == NULL, "%s", bad[i]);
    CHECK(tg_last_status() == TG_ERR_INVALID);
    CHECK_STR_CONTAINS(tg_last_error(), "unknown device");
    CHECK_STR_CONTAINS(tg_last_error(), "available: CPU");
  }
  tg_clear_error();
  device_get("XYZ");
  CHECK_STR_CONTAINS(tg_last_error(), "device_get: unknown device 'XYZ'");
  tg_clear_error();
  /* a negative instance number is one, not a renderer's name ("CPU has no renderer '-1'") */
  tg_tensor x = tg_zeros(TG_SHAPE(2), NULL);
  CHECK(!tg_valid(tg_to(x, "CPU:-1")));
  CHECK_STR_CONTAINS(tg_last_error(), "tg_to: unknown device 'CPU:-1': instance numbers count from 0");
  CHECK(tg_last_error() && !strstr(tg_last_error(), "renderer '-1'"));
  tg_clear_error();
  /* an empty name (an unset setting passed along) is an error, not the default device */
  CHECK(!tg_valid(tg_to(x, "")));
  CHECK_ERR(TG_ERR_INVALID, "tg_to: the device name \"\" is empty");
  CHECK(!tg_valid(tg_ones(TG_SHAPE(2), TG_OPTS(.device = ""))));
  CHECK_ERR(TG_ERR_INVALID, "tg_ones: the device name \"\" is empty");
  tg_free(x);
}

TEST(buffer_round_trip) {
  size_t live = buffer_live_count();
  Device *d = device_get("CPU");
  enum { N = 1000 };
  float in[N], out[N];
  for (int i = 0; i < N; i++) in[i] = (float)i * 0.5f;
  Buffer *b = buffer_new(d, sizeof in);
  CHECK(b != NULL);
  if (!b) return;
  CHECK(((uintptr_t)b->ptr & 63) == 0);
  CHECK(b->nbytes == sizeof in && b->dev == d && !b->external && b->refcount == 1);
  CHECK(buffer_live_count() == live + 1);
  CHECK(buffer_copyin(b, in, sizeof in) == TG_OK);
  memset(out, 0, sizeof out);
  CHECK(buffer_copyout(b, out, sizeof out) == TG_OK);
  CHECK(memcmp(in, out, sizeof in) == 0);
  /* partial copies */
  float x = 42.0f;
  CHECK(buffer_copyin(b, &x, sizeof x) == TG_OK);
  CHECK(buffer_copyout(b, out, 2 * sizeof(float)) == TG_OK);
  CHECK(out[0] == 42.0f && out[1] == 0.5f);
  /* too large */
  tg_clear_error();
  CHECK(buffer_copyin(b, in, sizeof in + 1) == TG_ERR_INVALID);
  tg_clear_error();
  CHECK(buffer_copyout(b, out, sizeof in + 4) == TG_ERR_INVALID);
  tg_clear_error();
  CHECK(buffer_ref(b) == b && b->refcount == 2);
  buffer_unref(b);
  CHECK(buffer_live_count() == live + 1);
  buffer_unref(b);
  CHECK(buffer_live_count() == live);
  buffer_unref(NULL);
}

TEST(buffer_zero_size) {
  size_t live = buffer_live_count();
  Device *d = device_get("CPU");
  Buffer *a = buffer_new(d, 0), *b = buffer_new(d, 0);
  CHECK(a && b);
  if (!a || !b) return;
  CHECK(a->ptr != NULL && b->ptr != NULL && a->ptr != b->ptr);
  CHECK(a->nbytes == 0);
  CHECK(buffer_copyin(a, NULL, 0) == TG_OK);
  CHECK(buffer_copyout(a, NULL, 0) == TG_OK);
  CHECK(buffer_copy(a, b, 0) == TG_OK);
  buffer_unref(a);
  buffer_unref(b);
  CHECK(buffer_live_count() == live);
}

TEST(buffer_cache_reuses_blocks) {
  Device *d = device_get("CPU");
  Buffer *a = buffer_new(d, 4096 + 3);
  CHECK(a != NULL);
  if (!a) return;
  void *p = a->ptr;
  size_t cached = d->cached_bytes;
  buffer_unref(a);
  CHECK(d->cached_bytes == cached + 4096 + 64);
  Buffer *b = buffer_new(d, 4096 + 1); /* same 64-byte-rounded block */
  CHECK(b && b->ptr == p);
  CHECK(d->cached_bytes == cached);
  buffer_unref(b);
}

TEST(buffer_large_blocks_split_and_merge) {
  /* an instance of its own, so that no other test's idle memory or high-water mark is involved */
  Device *d = device_get("CPU:7");
  CHECK(d != NULL);
  if (!d) return;
  const size_t M = (size_t)1 << 20;
  Buffer *a = buffer_new(d, 8 * M);
  CHECK(a != NULL);
  if (!a) return;
  char *base = a->ptr;
  buffer_unref(a);
  CHECK(d->cached_bytes == 8 * M);
  /* smaller requests are carved out of the idle block, in address order */
  Buffer *x = buffer_new(d, 3 * M), *y = buffer_new(d, 2 * M);
  CHECK(x && y && x->ptr == base && y->ptr == base + 3 * M);
  CHECK(d->cached_bytes == 3 * M);
  buffer_unref(x);
  CHECK(d->cached_bytes == 6 * M);
  /* the first 3 MB are free but not next to the last 3: a 5 MB request cannot be carved out */
  Buffer *z = buffer_new(d, 5 * M);
  CHECK(z && ((char *)z->ptr < base || (char *)z->ptr >= base + 8 * M));
  buffer_unref(z);
  buffer_unref(y);
  /* freed neighbours merged: the whole block is there again */
  Buffer *w = buffer_new(d, 8 * M);
  CHECK(w && w->ptr == base);
  buffer_unref(w);
  /* a request past the high-water mark returns wholly idle segments to the device first: the idle
   * memory never adds to the peak */
  device_cache_clear(d);
  CHECK(d->cached_bytes == 0);
  Buffer *p = buffer_new(d, 4 * M);
  buffer_unref(p);
  CHECK(d->cached_bytes == 4 * M);
  Buffer *q = buffer_new(d, 16 * M);
  CHECK(q != NULL);
  CHECK(d->cached_bytes == 0);
  buffer_unref(q);
  CHECK(d->cached_bytes == 16 * M);
  device_cache_clear(d);
}

/* Random allocations and frees, large and small, on a private instance: every live buffer keeps the
 * pattern written into it (no two overlap, splitting and merging never hand out memory in use), and
 * when all are freed the idle bytes are exactly what the instance holds. */
TEST(buffer_allocator_stress) {
  Device *d = device_get("CPU:6");
  CHECK(d != NULL);
  if (!d) return;
  enum { N = 48, ROUNDS = 1500 };
  Buffer *live[N] = {0};
  unsigned char tag[N] = {0};
  uint64_t rng = 0x9e3779b97f4a7c15ULL;
  bool ok = true;
  for (int r = 0; r < ROUNDS && ok; r++) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    int i = (int)(rng % N);
    if (live[i]) {
      /* check the first, middle and last bytes, then free */
      const unsigned char *p = live[i]->ptr;
      size_t n = live[i]->nbytes;
      ok = p[0] == tag[i] && p[n / 2] == tag[i] && p[n - 1] == tag[i];
      CHECK_MSG(ok, "round %d: buffer %d of %zu bytes was overwritten", r, i, n);
      buffer_unref(live[i]);
      live[i] = NULL;
    } else {
      /* sizes from 100 bytes to 6 MB, most of them large */
      size_t n = (rng >> 20) % 4 == 0 ? 100 + (size_t)(rng >> 32) % 60000 : ((size_t)1 << 20) + (size_t)(rng >> 28) % (5u << 20);
      live[i] = buffer_new(d, n);
      CHECK(live[i] != NULL);
      if (!live[i]) break;
      tag[i] = (unsigned char)(r * 7 + 1);
      memset(live[i]->ptr, tag[i], n);
    }
  }
  for (int i = 0; i < N; i++) buffer_unref(live[i]);
  size_t idle = d->cached_bytes;
  device_cache_clear(d);
  CHECK(d->cached_bytes == 0);
  CHECK(idle > 0);
}

TEST(buffer_alloc_failure) {
  size_t live = buffer_live_count();
  Device *d = device_get("CPU");
  tg_clear_error();
  CHECK(buffer_new(d, SIZE_MAX - 10) == NULL);
  CHECK(tg_last_status() == TG_ERR_RUNTIME);
  CHECK_STR_CONTAINS(tg_last_error(), "18446744073709551605");
  tg_clear_error();
  size_t huge = (size_t)1 << 52;
  CHECK(buffer_new(d, huge) == NULL);
  CHECK(tg_last_status() == TG_ERR_RUNTIME);
  CHECK_STR_CONTAINS(tg_last_error(), "4503599627370496");
  tg_clear_error();
  CHECK(buffer_new(NULL, 16) == NULL);
  CHECK(tg_last_status() == TG_ERR_INVALID);
  tg_clear_error();
  CHECK(buffer_live_count() == live);
}

TEST(buffer_wrap_external) {
  size_t live = buffer_live_count();
  Device *d = device_get("CPU");
  int data[4] = {1, 2, 3, 4};
  Buffer *w = buffer_wrap(d, data, sizeof data);
  CHECK(w && w->external && w->ptr == data);
  if (!w) return;
  int v = 9;
  CHECK(buffer_copyin(w, &v, sizeof v) == TG_OK);
  CHECK(data[0] == 9);
  buffer_unref(w); /* must not free the caller's memory */
  CHECK(data[3] == 4);
  CHECK(buffer_live_count() == live);
  tg_clear_error();
  CHECK(buffer_wrap(d, NULL, 8) == NULL);
  CHECK(tg_last_status() == TG_ERR_INVALID);
  tg_clear_error();
}

TEST(buffer_cross_device_copy) {
  size_t live = buffer_live_count();
  Device *c0 = device_get("CPU"), *c1 = device_get("CPU:1");
  enum { N = 4097 };
  static double in[N], out[N];
  for (int i = 0; i < N; i++) in[i] = i * 1.25 - 7;
  Buffer *a = buffer_new(c0, sizeof in), *b = buffer_new(c1, sizeof in), *c = buffer_new(c0, sizeof in);
  CHECK(a && b && c);
  if (!a || !b || !c) return;
  CHECK(b->dev == c1);
  CHECK(buffer_copyin(a, in, sizeof in) == TG_OK);
  CHECK(buffer_copy(b, a, sizeof in) == TG_OK);
  CHECK(buffer_copy(c, b, sizeof in) == TG_OK);
  CHECK(buffer_copyout(c, out, sizeof out) == TG_OK);
  CHECK(memcmp(in, out, sizeof in) == 0);
  tg_clear_error();
  Buffer *small = buffer_new(c1, 8);
  CHECK(buffer_copy(small, a, sizeof in) == TG_ERR_INVALID);
  tg_clear_error();
  buffer_unref(small);
  buffer_unref(a);
  buffer_unref(b);
  buffer_unref(c);
  CHECK(buffer_live_count() == live);
}

static void *alloc_worker(void *arg) {
  Device *d = arg;
  for (int i = 0; i < 20000; i++) {
    Buffer *b = buffer_new(d, (size_t)(i % 7) * 100);
    if (!b) return (void *)1;
    memset(b->ptr, i & 0xff, b->nbytes);
    Buffer *r = buffer_ref(b);
    buffer_unref(b);
    buffer_unref(r);
  }
  return NULL;
}

TEST(buffer_threads) {
  size_t live = buffer_live_count();
  pthread_t t[4];
  Device *devs[4] = {device_get("CPU"), device_get("CPU:1"), device_get("CPU"), device_get("CPU:1")};
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, alloc_worker, devs[i]);
  for (int i = 0; i < 4; i++) {
    void *rv;
    pthread_join(t[i], &rv);
    CHECK(rv == NULL);
  }
  CHECK(buffer_live_count() == live);
}

/* ---------------------------------------------------------------------------------------------- */

TEST(kernel_add_two_threads) {
  size_t live = buffer_live_count();
  Device *d = device_get("CPU");
  tg_clear_error();
  Program *p = program_get(d, "add_f32", ADD_SRC);
  CHECK_MSG(p != NULL, "%s", tg_last_error() ? tg_last_error() : "");
  if (!p) return;
  CHECK(p->dev == d && strcmp(p->name, "add_f32") == 0 && p->handle != NULL);
  enum { N = 1000000 };
  float *a = malloc(N * sizeof(float)), *bb = malloc(N * sizeof(float)), *c = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) {
    a[i] = (float)i;
    bb[i] = (float)(N - i) * 0.25f;
  }
  Buffer *A = buffer_new(d, N * sizeof(float)), *B = buffer_new(d, N * sizeof(float)),
         *C = buffer_new(d, N * sizeof(float));
  buffer_copyin(A, a, N * sizeof(float));
  buffer_copyin(B, bb, N * sizeof(float));
  void *bufs[3] = {C->ptr, A->ptr, B->ptr};
  const int64_t threads_opts[] = {0, 2, 1, 64};
  for (size_t t = 0; t < sizeof threads_opts / sizeof threads_opts[0]; t++) {
    memset(C->ptr, 0, N * sizeof(float));
    int64_t gs[3] = {N, 1, 1}, ls[3] = {threads_opts[t], 1, 1};
    double el = program_exec(p, bufs, 3, 0, gs, ls, true);
    CHECK(el >= 0);
    buffer_copyout(C, c, N * sizeof(float));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += c[i] != a[i] + bb[i];
    CHECK_MSG(bad == 0, "threads=%lld: %d wrong", (long long)threads_opts[t], bad);
  }
  buffer_unref(A);
  buffer_unref(B);
  buffer_unref(C);
  free(a);
  free(bb);
  free(c);
  CHECK(buffer_live_count() == live);
}

/* Loaded kernel objects cost few mappings each (a process loading thousands of kernels must not
 * run into vm.max_map_count early): at most 3 per object (2 measured). */
static int count_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  int n = 0, c;
  if (!f) return -1;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

TEST(kernel_objects_map_compactly) {
  Device *d = device_get("CPU");
  int before = count_maps();
  if (before < 0) return; /* no /proc: nothing to measure */
  enum { K = 12 };
  for (int i = 0; i < K; i++) {
    char name[32], src[256];
    snprintf(name, sizeof name, "maps_probe_%d", i);
    snprintf(src, sizeof src,
             "void maps_probe_%d(void **restrict bufs, long long s, long long e) {\n"
             "  float *o = (float *)bufs[0];\n  for (long long i = s; i < e; i++) o[i] = (float)i * %d.5f;\n}\n",
             i, i + 7);
    tg_clear_error();
    Program *p = program_get(d, name, src);
    CHECK_MSG(p != NULL, "%s", tg_last_error() ? tg_last_error() : "");
  }
  int added = count_maps() - before;
  CHECK_MSG(added <= 3 * K, "%d kernel objects added %d mappings", K, added);
}

TEST(kernel_chunks_cover_range) {
  Device *d = device_get("CPU");
  Program *p = program_get(d, "cover", COVER_SRC);
  CHECK(p != NULL);
  if (!p) return;
  int maxt = tp_max_threads();
  const int64_t sizes[] = {1, 2, 3, 1003, 65536};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    for (int64_t lt = 0; lt <= 3; lt++) {
      int64_t n = sizes[s];
      int *hits = calloc((size_t)n, sizeof(int));
      int calls = 0;
      void *bufs[2] = {hits, &calls};
      int64_t gs[3] = {n, 1, 1}, ls[3] = {lt, 1, 1};
      program_exec(p, bufs, 2, 0, gs, ls, false);
      int bad = 0;
      for (int64_t i = 0; i < n; i++) bad += hits[i] != 1;
      int64_t want = lt == 0 || lt > maxt ? maxt : lt;
      if (want > n) want = n;
      CHECK_MSG(bad == 0, "n=%lld threads=%lld: %d indices not visited once", (long long)n, (long long)lt,
                bad);
      CHECK_MSG(calls == want, "n=%lld threads=%lld: %d chunks, want %lld", (long long)n, (long long)lt,
                calls, (long long)want);
      free(hits);
    }
  }
  /* empty range: nothing runs */
  int calls = 0;
  void *bufs[2] = {NULL, &calls};
  int64_t gs[3] = {0, 1, 1};
  CHECK(program_exec(p, bufs, 2, 0, gs, NULL, true) >= 0);
  CHECK(calls == 0);
}

static void *exec_worker(void *arg) {
  Program *p = arg;
  enum { N = 4099 };
  static _Thread_local int hits[N];
  for (int it = 0; it < 300; it++) {
    memset(hits, 0, sizeof hits);
    int calls = 0;
    void *bufs[2] = {hits, &calls};
    int64_t gs[3] = {N, 1, 1};
    program_exec(p, bufs, 2, 0, gs, NULL, false);
    for (int i = 0; i < N; i++)
      if (hits[i] != 1) return (void *)1;
  }
  return NULL;
}

TEST(kernel_exec_from_many_threads) {
  Program *p = program_get(device_get("CPU"), "cover", COVER_SRC);
  CHECK(p != NULL);
  if (!p) return;
  pthread_t t[3];
  for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, exec_worker, p);
  for (int i = 0; i < 3; i++) {
    void *rv;
    pthread_join(t[i], &rv);
    CHECK(rv == NULL);
  }
}

TEST(program_cache_in_memory) {
  Device *c0 = device_get("CPU"), *c1 = device_get("CPU:1");
  const char *src = "#include <stdint.h>\n"
                    "void scale2(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
                    "  float *x = bufs[0];\n"
                    "  for (int64_t i = gstart; i < gend; i++) x[i] *= 2.0f;\n"
                    "}\n";
  uint64_t before = g_counters.compile_count;
  Program *p = program_get(c0, "scale2", src);
  CHECK(p != NULL);
  CHECK(g_counters.compile_count == before + 1);
  CHECK(program_get(c0, "scale2", src) == p);
  CHECK(g_counters.compile_count == before + 1);
  /* same code on another CPU instance: its own Program, no new compile */
  Program *q = program_get(c1, "scale2", src);
  CHECK(q != NULL && q != p && q->dev == c1);
  CHECK(q && p && q->handle == p->handle);
  CHECK(g_counters.compile_count == before + 1);
  float x[4] = {1, 2, 3, 4};
  void *bufs[1] = {x};
  int64_t gs[3] = {4, 1, 1};
  if (q) program_exec(q, bufs, 1, 0, gs, NULL, true);
  CHECK(x[0] == 2 && x[3] == 8);
  /* different source, same name: a different program */
  const char *src2 = "#include <stdint.h>\n"
                     "void scale2(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
                     "  float *x = bufs[0];\n"
                     "  for (int64_t i = gstart; i < gend; i++) x[i] *= 3.0f;\n"
                     "}\n";
  Program *r = program_get(c0, "scale2", src2);
  CHECK(r != NULL && r != p);
  if (r) program_exec(r, bufs, 1, 0, gs, NULL, true);
  CHECK(x[0] == 6);
  CHECK(g_counters.compile_count == before + 2);
  /* loads from the same path string must not alias: the second program is really the new code */
  if (p) program_exec(p, bufs, 1, 0, gs, NULL, true);
  CHECK(x[0] == 12);
}

typedef struct {
  const char *src;
  Program *out;
} GetArg;

static void *get_worker(void *arg) {
  GetArg *g = arg;
  g->out = program_get(device_get(NULL), "sub1", g->src);
  return NULL;
}

/* A batch compiles its kernels in one compiler run; compile_count still counts kernels, and a
 * kernel already loaded is neither compiled again nor counted. */
TEST(program_batch_counts_kernels) {
  static char srcs[3][256];
  const char *names[3] = {"bk_add1", "bk_add2", "bk_add3"}, *sp[3];
  for (int i = 0; i < 3; i++) {
    snprintf(srcs[i], sizeof srcs[i],
             "#include <stdint.h>\n"
             "void %s(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
             "  int *x = bufs[0]; for (int64_t i = gstart; i < gend; i++) x[i] += %d; /* %d */\n"
             "}\n",
             names[i], i + 1, (int)getpid());
    sp[i] = srcs[i];
  }
  Device *d = device_get("CPU");
  Program *first = program_get(d, names[0], sp[0]);
  CHECK(first != NULL);
  uint64_t before = g_counters.compile_count;
  CHECK(program_get_batch(d, names, sp, 3) == 3);
  CHECK_MSG(g_counters.compile_count == before + 2, "a batch of 2 new kernels counted %llu compiles",
            (unsigned long long)(g_counters.compile_count - before));
  int x[4] = {0, 0, 0, 0};
  void *bufs[1] = {x};
  int64_t gs[3] = {4, 1, 1};
  for (int i = 0; i < 3; i++) {
    Program *p = program_get(d, names[i], sp[i]);
    CHECK(p != NULL);
    if (p) program_exec(p, bufs, 1, 0, gs, NULL, true), program_release(p);
  }
  CHECK(x[0] == 6 && x[3] == 6);
  CHECK(g_counters.compile_count == before + 2);
  if (first) program_release(first);
}

TEST(program_cache_concurrent_get) {
  static char src[256];
  snprintf(src, sizeof src,
           "#include <stdint.h>\n"
           "void sub1(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
           "  int *x = bufs[0]; for (int64_t i = gstart; i < gend; i++) x[i] -= 1; /* %d */\n"
           "}\n",
           (int)getpid());
  uint64_t before = g_counters.compile_count;
  pthread_t t[4];
  GetArg args[4];
  for (int i = 0; i < 4; i++) {
    args[i].src = src;
    pthread_create(&t[i], NULL, get_worker, &args[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  CHECK(args[0].out != NULL);
  for (int i = 1; i < 4; i++) CHECK(args[i].out == args[0].out);
  CHECK(g_counters.compile_count == before + 1);
}

TEST(compile_error_reports_diagnostic) {
  tg_clear_error();
  const char *src = "#include <stdint.h>\n"
                    "void broken_k(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
                    "  float *x = bufs[0];\n"
                    "  x[gstart] = undefined_thing_xyz + gend;\n"
                    "}\n";
  uint64_t before = g_counters.compile_count;
  Program *p = program_get(device_get("CPU"), "broken_k", src);
  CHECK(p == NULL);
  CHECK(tg_last_status() == TG_ERR_COMPILE);
  CHECK_STR_CONTAINS(tg_last_error(), "compile failed");
  CHECK_STR_CONTAINS(tg_last_error(), "broken_k");
  CHECK_STR_CONTAINS(tg_last_error(), "undefined_thing_xyz");
  CHECK(g_counters.compile_count == before);
  tg_clear_error();
  /* a failed source is not cached as a failure: asking again reports again */
  CHECK(program_get(device_get("CPU"), "broken_k", src) == NULL);
  CHECK(tg_last_status() == TG_ERR_COMPILE);
  tg_clear_error();
  /* missing symbol */
  CHECK(program_get(device_get("CPU"), "not_there", ADD_SRC) == NULL);
  CHECK(tg_last_status() == TG_ERR_RUNTIME);
  CHECK_STR_CONTAINS(tg_last_error(), "not_there");
  tg_clear_error();
}

TEST(compile_missing_compiler) {
  tg_clear_error();
  tg_context_begin();
  tg_context_set("CC", "/nonexistent/dir/cc-xyz");
  uint8_t *lib = NULL;
  size_t len = 0;
  tg_status st = cpu_device_vt.compile(device_get("CPU")->state, NOP_SRC, &lib, &len);
  CHECK(st == TG_ERR_COMPILE);
  CHECK(lib == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "C compiler '/nonexistent/dir/cc-xyz' not found (set CC)");
  tg_clear_error();
  tg_context_set("CC", "no-such-compiler-xyz");
  st = cpu_device_vt.compile(device_get("CPU")->state, NOP_SRC, &lib, &len);
  CHECK(st == TG_ERR_COMPILE);
  CHECK_STR_CONTAINS(tg_last_error(), "not found");
  tg_clear_error();
  /* through the API, the error names the call that needed the kernel */
  tg_context_set("TIERED", "0");
  tg_context_set("DISABLE_COMPILER_CACHE", "1");
  tg_scope_begin();
  tg_tensor x = tg_mul_s(tg_arange(0, 37, 1, NULL), 3.25);
  CHECK(tg_realize(x) == TG_ERR_COMPILE);
  const char *e = tg_last_error();
  CHECK_MSG(e && strncmp(e, "tg_realize: ", 12) == 0 && strstr(e, "not found (set CC)"), "%s", e ? e : "no error");
  tg_clear_error();
  float v[37];
  CHECK(tg_data(tg_add_s(x, 1), v, sizeof v) == TG_ERR_COMPILE);
  e = tg_last_error();
  CHECK_MSG(e && strncmp(e, "tg_data: ", 9) == 0, "%s", e ? e : "no error");
  tg_scope_end();
  tg_context_end();
  tg_clear_error();
}

TEST(compiler_id) {
  const char *id = cpu_device_vt.compiler_id(device_get("CPU")->state);
  CHECK(id != NULL);
  CHECK_STR_CONTAINS(id, "-O2");
  CHECK_STR_CONTAINS(id, "-march=native");
  CHECK(cpu_device_vt.compiler_id(NULL) == id);
}

/* Loads lib and checks that it computes x[i] = i * 3 over a few elements. */
static bool lib_works(const uint8_t *lib, size_t len, const char *fname) {
  void *prg = cpu_device_vt.load(NULL, fname, lib, len);
  if (!prg) return false;
  int x[8] = {0};
  void *bufs[1] = {x};
  int64_t gs[3] = {8, 1, 1};
  cpu_device_vt.exec(NULL, prg, bufs, 1, 0, gs, NULL, true);
  cpu_device_vt.unload(NULL, prg);
  for (int i = 0; i < 8; i++)
    if (x[i] != i * 3) return false;
  return true;
}

static ino_t inode_of(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_ino : 0;
}

TEST(disk_cache) {
  clear_cache_dir();
  char src[512];
  snprintf(src, sizeof src,
           "#include <stdint.h>\n"
           "void times3(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
           "  int *x = bufs[0]; for (int64_t i = gstart; i < gend; i++) x[i] = (int)i * 3;\n"
           "} /* %d */\n",
           (int)getpid());
  void *st = device_get("CPU")->state;
  uint8_t *lib = NULL;
  size_t len = 0;
  tg_clear_error();
  double t0 = now_seconds();
  CHECK(cpu_device_vt.compile(st, src, &lib, &len) == TG_OK);
  double t_miss = now_seconds() - t0;
  CHECK(lib && len > 0 && lib_works(lib, len, "times3"));
  free(lib);
  char entry[1024] = "";
  CHECK(cache_entries(entry, sizeof entry) == 1);
  ino_t ino = inode_of(entry);
  CHECK(ino != 0);

  /* hit: same bytes, file not rewritten */
  t0 = now_seconds();
  CHECK(cpu_device_vt.compile(st, src, &lib, &len) == TG_OK);
  double t_hit = now_seconds() - t0;
  CHECK(lib && lib_works(lib, len, "times3"));
  free(lib);
  CHECK(inode_of(entry) == ino);
  printf("  disk cache: miss %.1f ms, hit %.3f ms\n", t_miss * 1e3, t_hit * 1e3);

  /* damaged payload byte: detected, rebuilt, still a working library */
  struct stat sb;
  stat(entry, &sb);
  long mid = (long)(sb.st_size / 2);
  int c = -1;
  FILE *f = fopen(entry, "r+b");
  CHECK(f != NULL);
  if (f) {
    fseek(f, mid, SEEK_SET);
    c = fgetc(f);
    fseek(f, mid, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
  }
  CHECK(cpu_device_vt.compile(st, src, &lib, &len) == TG_OK);
  CHECK(lib && lib_works(lib, len, "times3"));
  free(lib);
  CHECK(cache_entries(NULL, 0) == 1);
  /* the entry was rebuilt: the same compiler output is back in place of the damaged byte */
  f = fopen(entry, "rb");
  CHECK(f != NULL);
  if (f) {
    fseek(f, mid, SEEK_SET);
    CHECK(fgetc(f) == c);
    fclose(f);
  }

  /* truncated file */
  CHECK(truncate(entry, 10) == 0);
  CHECK(cpu_device_vt.compile(st, src, &lib, &len) == TG_OK);
  CHECK(lib && lib_works(lib, len, "times3"));
  free(lib);
  stat(entry, &sb);
  CHECK(sb.st_size > 1000);

  /* garbage of the right length with a wrong magic */
  f = fopen(entry, "r+b");
  if (f) {
    fputs("XXXX", f);
    fclose(f);
  }
  CHECK(cpu_device_vt.compile(st, src, &lib, &len) == TG_OK);
  CHECK(lib && lib_works(lib, len, "times3"));
  free(lib);
  CHECK(!tg_has_error());

  /* DISABLE_COMPILER_CACHE=1 writes nothing */
  clear_cache_dir();
  tg_context_begin();
  tg_context_set("DISABLE_COMPILER_CACHE", "1");
  CHECK(cpu_device_vt.compile(st, src, &lib, &len) == TG_OK);
  CHECK(lib && lib_works(lib, len, "times3"));
  free(lib);
  CHECK(cache_entries(NULL, 0) == 0);
  tg_context_end();

  /* an unusable cache directory: still compiles */
  tg_context_begin();
  tg_context_set("TINYGRAD_CACHE_DIR", "/proc/no/such/dir");
  CHECK(cpu_device_vt.compile(st, src, &lib, &len) == TG_OK);
  CHECK(lib && lib_works(lib, len, "times3"));
  free(lib);
  tg_context_end();
  CHECK(!tg_has_error());
}

/* A kernel `fname` computing x[i] = i * k, tagged so that no other test or process shares its source. */
static void times_src(char *out, size_t cap, const char *fname, int k, const char *tag) {
  snprintf(out, cap,
           "#include <stdint.h>\n"
           "void %s(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
           "  int *x = bufs[0]; for (int64_t i = gstart; i < gend; i++) x[i] = (int)i * %d;\n"
           "} /* %s %d */\n",
           fname, k, tag, (int)getpid());
}

/* Does lib's fname compute x[i] = i * k? */
static bool lib_computes(const uint8_t *lib, size_t len, const char *fname, int k) {
  void *prg = cpu_device_vt.load(NULL, fname, lib, len);
  if (!prg) return false;
  int x[8] = {0};
  void *bufs[1] = {x};
  int64_t gs[3] = {8, 1, 1};
  cpu_device_vt.exec(NULL, prg, bufs, 1, 0, gs, NULL, true);
  cpu_device_vt.unload(NULL, prg);
  for (int i = 0; i < 8; i++)
    if (x[i] != i * k) return false;
  return true;
}

static bool prog_computes(Program *p, int k) {
  if (!p) return false;
  int x[8] = {0};
  void *bufs[1] = {x};
  int64_t gs[3] = {8, 1, 1};
  if (program_exec(p, bufs, 1, 0, gs, NULL, true) < 0) return false;
  for (int i = 0; i < 8; i++)
    if (x[i] != i * k) return false;
  return true;
}


static bool spill(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(p, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

/* The one cache entry that compiling src adds (the cache directory is cleared first). */
static bool entry_of(const char *src, char *path, size_t cap) {
  clear_cache_dir();
  uint8_t *lib = NULL;
  size_t len = 0;
  bool ok = cpu_device_vt.compile(device_get("CPU")->state, src, &lib, &len) == TG_OK;
  free(lib);
  return ok && cache_entries(path, cap) == 1;
}

/* Entry layout v2 (ops_cpu.c): 24-byte header (magic, version, payload length, key length, 0), key,
 * payload, checksum of all before it. Rewrites entry `path` with its own header and key but another
 * payload: a complete, valid-looking entry whose binary is not this kernel's. */
static bool forge_payload(const char *path, const uint8_t *payload, size_t plen) {
  size_t n = 0;
  uint8_t *e = tt_read_file(path, &n);
  if (!e || n < 32) {
    free(e);
    return false;
  }
  uint32_t klen;
  memcpy(&klen, e + 16, 4);
  size_t total = 24 + klen + plen + 8;
  uint8_t *f = malloc(total);
  memcpy(f, e, 24 + klen);
  uint64_t p64 = plen;
  memcpy(f + 8, &p64, 8);
  memcpy(f + 24 + klen, payload, plen);
  uint64_t sum = hash_bytes(f, total - 8, 0x54474b45524e4c31ULL);
  memcpy(f + total - 8, &sum, 8);
  bool ok = spill(path, f, total);
  free(e), free(f);
  return ok;
}

/* An entry is checked against its key (compiler id + source hash), not only its own checksum: a
 * complete entry of another kernel with the same symbol, copied in under this kernel's name, is
 * discarded and rebuilt instead of run. */
TEST(disk_cache_entry_of_another_kernel) {
  tg_clear_error();
  void *st = device_get("CPU")->state;
  char a[512], b[512], ea[1024], eb[1024];
  times_src(a, sizeof a, "timesk", 3, "key-a");
  times_src(b, sizeof b, "timesk", 5, "key-b");
  CHECK(entry_of(b, eb, sizeof eb));
  size_t nb = 0;
  uint8_t *bytes_b = tt_read_file(eb, &nb);
  CHECK(entry_of(a, ea, sizeof ea));
  CHECK(strcmp(ea, eb) != 0);
  CHECK(bytes_b && spill(ea, bytes_b, nb)); /* b's complete entry now sits under a's name */
  free(bytes_b);
  uint8_t *lib = NULL;
  size_t len = 0;
  CHECK(cpu_device_vt.compile(st, a, &lib, &len) == TG_OK);
  CHECK_MSG(lib && lib_computes(lib, len, "timesk", 3), "ran the other kernel's binary");
  free(lib);
  /* rebuilt in place: the next read is a hit on a's own entry */
  size_t n1 = 0;
  uint8_t *rebuilt = tt_read_file(ea, &n1);
  CHECK(rebuilt && n1 > 0);
  ino_t ino = inode_of(ea);
  CHECK(cpu_device_vt.compile(st, a, &lib, &len) == TG_OK);
  CHECK(lib && lib_computes(lib, len, "timesk", 3));
  free(lib), free(rebuilt);
  CHECK(inode_of(ea) == ino);
  CHECK(!tg_has_error());
}

/* An entry whose binary does not load -- the symbol is missing, or it is no shared object at all --
 * is damaged: program_get removes it, compiles again and runs the right code; the rebuilt entry
 * serves the next process. */
TEST(disk_cache_entry_that_does_not_load) {
  tg_clear_error();
  Device *d = device_get("CPU");
  char a[512], other[512], e[1024];
  times_src(other, sizeof other, "other_k", 7, "load-other");
  uint8_t *olib = NULL;
  size_t olen = 0;
  CHECK(cpu_device_vt.compile(d->state, other, &olib, &olen) == TG_OK);

  /* the symbol is missing */
  times_src(a, sizeof a, "sym_k", 3, "load-sym");
  CHECK(entry_of(a, e, sizeof e));
  CHECK(olib && forge_payload(e, olib, olen));
  uint8_t *lib = NULL;
  size_t len = 0;
  CHECK(cpu_device_vt.compile(d->state, a, &lib, &len) == TG_OK); /* the forged entry reads as valid */
  CHECK(lib && !lib_computes(lib, len, "sym_k", 3));
  free(lib);
  tg_clear_error();
  Program *p = program_get(d, "sym_k", a);
  CHECK_MSG(prog_computes(p, 3), "program_get: %s", tg_last_error() ? tg_last_error() : "wrong values");
  CHECK(cpu_device_vt.compile(d->state, a, &lib, &len) == TG_OK);
  CHECK_MSG(lib && lib_computes(lib, len, "sym_k", 3), "the damaged entry was not replaced");
  free(lib);

  /* not a shared object (dlopen fails) */
  times_src(a, sizeof a, "elf_k", 4, "load-elf");
  CHECK(entry_of(a, e, sizeof e));
  static const uint8_t junk[] = "this is not an ELF object, but its entry's checksum is right";
  CHECK(forge_payload(e, junk, sizeof junk));
  p = program_get(d, "elf_k", a);
  CHECK_MSG(prog_computes(p, 4), "program_get: %s", tg_last_error() ? tg_last_error() : "wrong values");
  CHECK(cpu_device_vt.compile(d->state, a, &lib, &len) == TG_OK);
  CHECK(lib && lib_computes(lib, len, "elf_k", 4));
  free(lib), free(olib);
  CHECK(!tg_has_error());
}

/* A FIFO where an entry belongs is not read (that would block until a writer comes): the kernel is
 * compiled and its entry replaces the FIFO. */
TEST(disk_cache_fifo_does_not_hang) {
  tg_clear_error();
  char a[512], e[1024];
  times_src(a, sizeof a, "fifo_k", 6, "fifo");
  CHECK(entry_of(a, e, sizeof e));
  CHECK(unlink(e) == 0);
  CHECK(mkfifo(e, 0644) == 0);
  alarm(60); /* a hang fails the test (SIGALRM) instead of stalling the suite */
  uint8_t *lib = NULL;
  size_t len = 0;
  CHECK(cpu_device_vt.compile(device_get("CPU")->state, a, &lib, &len) == TG_OK);
  alarm(0);
  CHECK(lib && lib_computes(lib, len, "fifo_k", 6));
  free(lib);
  struct stat sb;
  CHECK(lstat(e, &sb) == 0 && S_ISREG(sb.st_mode));
  CHECK(!tg_has_error());
}

/* An entry far larger than any kernel (a sparse 100 GB file, or a link to one) is rebuilt over, not
 * read into memory (the allocation of its whole size aborted the program). */
TEST(disk_cache_huge_entry_is_rebuilt) {
  tg_clear_error();
  char a[512], e[1024];
  times_src(a, sizeof a, "huge_k", 6, "huge");
  CHECK(entry_of(a, e, sizeof e));
  CHECK(unlink(e) == 0);
  int fd = open(e, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0 && ftruncate(fd, (off_t)100 << 30) == 0);
  if (fd >= 0) close(fd);
  uint8_t *lib = NULL;
  size_t len = 0;
  CHECK(cpu_device_vt.compile(device_get("CPU")->state, a, &lib, &len) == TG_OK);
  CHECK(lib && lib_computes(lib, len, "huge_k", 6));
  free(lib);
  struct stat sb;
  CHECK(stat(e, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size < (off_t)1 << 30);
  CHECK(!tg_has_error());
}

/* Kernel objects mapped into this process (lines of /proc/self/maps naming a tgk- file). */
static int kernel_mappings(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "/tgk-")) n++;
  fclose(f);
  return n;
}

/* The program cache keeps at most MAX_LOADED_KERNELS programs loaded: the least recently used ones
 * nobody holds are unloaded (dlclose: their mappings go), held ones never are, and an unloaded one
 * asked for again is loaded again and runs. */
TEST(program_cache_unloads_least_recently_used) {
  tg_clear_error();
  Device *d = device_get("CPU");
  tg_context_begin();
  tg_context_set("MAX_LOADED_KERNELS", "8");
  char src[512];
  times_src(src, sizeof src, "held_k", 2, "lru-held");
  Program *held = program_get(d, "held_k", src);
  CHECK(prog_computes(held, 2));
  size_t before = program_loaded_count();
  int maps0 = kernel_mappings();
  for (int k = 0; k < 40; k++) {
    char tag[32];
    snprintf(tag, sizeof tag, "lru-%d", k);
    times_src(src, sizeof src, "lru_k", k + 3, tag);
    Program *p = program_get(d, "lru_k", src);
    CHECK_MSG(prog_computes(p, k + 3), "kernel %d: %s", k, tg_last_error() ? tg_last_error() : "wrong values");
    program_release(p);
  }
  size_t after = program_loaded_count();
  int maps1 = kernel_mappings();
  printf("  40 kernels at MAX_LOADED_KERNELS=8: loaded %zu -> %zu, kernel mappings %d -> %d\n", before, after, maps0,
         maps1);
  CHECK_MSG(after <= (before > 8 ? before : 8), "%zu programs loaded (%zu before)", after, before);
  CHECK_MSG(maps1 <= maps0 + 8 * 2, "kernel mappings %d -> %d", maps0, maps1);
  CHECK(prog_computes(held, 2)); /* held the whole time: still loaded */
  /* the first of the 40 was unloaded; asking again loads it again */
  times_src(src, sizeof src, "lru_k", 3, "lru-0");
  Program *again = program_get(d, "lru_k", src);
  CHECK(prog_computes(again, 3));
  program_release(again);
  program_release(held);
  tg_context_end();
  CHECK(!tg_has_error());
}

static tg_status jit_triple_plus(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                                 void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = tg_add(tg_mul(in[0], tg_scalar(3, NULL)), tg_scalar(0.5, NULL));
  return TG_OK;
}

/* The same bound through the tensor API: realizing many distinct kernels keeps the kernel cache and
 * the loaded programs bounded, and a TinyJit whose kernels the caches dropped still replays them
 * (its capture holds them). */
TEST(kernel_cache_bounded_and_jit_keeps_its_kernels) {
  tg_clear_error();
  tg_context_begin();
  tg_context_set("MAX_LOADED_KERNELS", "4");
  size_t live = tg_live_count();
  tg_scope_begin();
  tg_jit *j = tg_jit_new(jit_triple_plus, 1, NULL);
  float xv[16];
  for (int i = 0; i < 16; i++) xv[i] = (float)i;
  tg_tensor x = tg_from_data(xv, TG_SHAPE(16), NULL);
  for (int it = 0; it < 3; it++) { /* run, capture, replay */
    tg_tensor out;
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
  }
  CHECK(tg_jit_captured_kernels(j) >= 1);
  size_t before = program_loaded_count();
  for (int k = 0; k < 24; k++) {
    tg_scope_begin();
    /* a constant of its own makes each a distinct kernel */
    tg_tensor y = tg_sub(tg_mul(x, tg_scalar(1000 + k, NULL)), tg_scalar(7 * k + 0.25, NULL));
    float got[16];
    CHECK(tg_data(y, got, sizeof got) == TG_OK);
    for (int i = 0; i < 16; i++) CHECK(got[i] == (float)i * (float)(1000 + k) - (float)(7 * k + 0.25));
    tg_scope_end();
  }
  CHECK_MSG(kernel_cache_count() <= 4, "%zu kernels cached", kernel_cache_count());
  CHECK_MSG(program_loaded_count() <= before + 4, "%zu programs loaded (%zu before)", program_loaded_count(), before);
  float xv2[16];
  for (int i = 0; i < 16; i++) xv2[i] = (float)(2 * i + 1);
  tg_tensor x2 = tg_from_data(xv2, TG_SHAPE(16), NULL);
  tg_tensor out;
  CHECK(tg_jit_call(j, &x2, 1, NULL, 0, &out) == TG_OK);
  float got[16];
  CHECK(tg_data(out, got, sizeof got) == TG_OK);
  for (int i = 0; i < 16; i++) CHECK(got[i] == xv2[i] * 3 + 0.5f);
  tg_jit_free(j);
  tg_scope_end();
  CHECK(tg_live_count() == live);
  tg_context_end();
  CHECK(!tg_has_error());
}

/* Cache entries whose key names the C compiler ("cc:...", ops_cpu.c) and those of CPU:LLVM. */
static void cache_entry_kinds(int *c_entries, int *llvm_entries) {
  *c_entries = *llvm_entries = 0;
  DIR *d = opendir(kernels_dir());
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", kernels_dir(), e->d_name);
    FILE *f = e->d_name[0] != '.' ? fopen(path, "rb") : NULL;
    if (!f) continue;
    char head[64] = {0};
    size_t n = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    /* the key follows the 24-byte header */
    if (n > 27 && memcmp(head + 24, "cc:", 3) == 0) (*c_entries)++;
    if (n > 30 && memcmp(head + 24, "llvm15", 6) == 0) (*llvm_entries)++;
  }
  closedir(d);
}

/* Tiered compilation: a cold DEV=CPU schedule runs CPU:LLVM stand-ins of its kernels at once, while
 * the C compiler builds them in the background (stopped while kernels run); the C binaries then
 * replace the stand-ins and land in the disk cache. TIERED=0 compiles them with the C compiler
 * before they run. */
TEST(tiered_compile_runs_stand_ins_then_c_code) {
  tg_clear_error();
  const char *cc = getenv("CC");
  bool had = tg_has_error();
  bool llvm = device_get("CPU:LLVM") != NULL;
  if (!had) tg_clear_error();
  bool expect = llvm && (!cc || !*cc || strcmp(cc, "cc") == 0); /* a CC of the user's own is not tiered */
  static int uniq;
  float xv[64], got[64];
  for (int i = 0; i < 64; i++) xv[i] = (float)i * 0.5f;
  for (int tiered = 1; tiered >= 0; tiered--) {
    tg_context_begin();
    tg_context_set_int("TIERED", tiered);
    double k = 3.0 + (double)(++uniq) * 0.0078125; /* kernels no earlier test compiled */
    int c0, l0, c1, l1;
    cache_entry_kinds(&c0, &l0);
    uint64_t compiled = g_counters.compile_count;
    cpu_background_pause(true); /* as while kernels run: the stand-ins are what runs */
    tg_scope_begin();
    tg_tensor x = tg_from_data(xv, TG_SHAPE(64), NULL);
    tg_tensor y = tg_add(tg_mul(x, tg_scalar(k, NULL)), tg_sum(tg_contiguous(tg_exp(tg_mul(x, tg_scalar(0.01 * k, NULL)))), NULL, 0, false));
    CHECK(tg_data(y, got, sizeof got) == TG_OK);
    double sum = 0;
    for (int i = 0; i < 64; i++) sum += exp(xv[i] * 0.01 * k);
    for (int i = 0; i < 64; i++) CHECK_CLOSE(got[i], xv[i] * k + sum, 1e-4 * fabs(xv[i] * k + sum));
    tg_scope_end();
    size_t pending = program_tier_pending();
    uint64_t ncompiled = g_counters.compile_count - compiled;
    CHECK_MSG(ncompiled >= 2, "%llu kernels compiled", (unsigned long long)ncompiled); /* once each */
    cache_entry_kinds(&c1, &l1);
    if (tiered && expect) {
      CHECK_MSG(pending >= 2, "%zu tiered programs pending", pending);
      CHECK_MSG(l1 > l0 && c1 == c0, "cache entries: C %d -> %d, LLVM %d -> %d", c0, c1, l0, l1);
    } else {
      CHECK_MSG(pending == 0, "%zu tiered programs pending (TIERED=%d)", pending, tiered);
      CHECK_MSG(l1 == l0 && c1 > c0, "cache entries: C %d -> %d, LLVM %d -> %d", c0, c1, l0, l1);
    }
    cpu_background_pause(false);
    program_tier_wait();
    CHECK(program_tier_pending() == 0);
    CHECK(g_counters.compile_count - compiled == ncompiled); /* the background build is not a second count */
    int c2, l2;
    cache_entry_kinds(&c2, &l2);
    CHECK_MSG(c2 > c0, "C cache entries %d -> %d after the background compile", c0, c2);
    /* the same kernels again, now the C compiler's */
    tg_scope_begin();
    float xv2[64];
    for (int i = 0; i < 64; i++) xv2[i] = (float)(63 - i);
    tg_tensor x2 = tg_from_data(xv2, TG_SHAPE(64), NULL);
    tg_tensor y2 = tg_add(tg_mul(x2, tg_scalar(k, NULL)), tg_sum(tg_contiguous(tg_exp(tg_mul(x2, tg_scalar(0.01 * k, NULL)))), NULL, 0, false));
    CHECK(tg_data(y2, got, sizeof got) == TG_OK);
    double sum2 = 0;
    for (int i = 0; i < 64; i++) sum2 += exp(xv2[i] * 0.01 * k);
    for (int i = 0; i < 64; i++) CHECK_CLOSE(got[i], xv2[i] * k + sum2, 1e-4 * fabs(xv2[i] * k + sum2));
    tg_scope_end();
    CHECK(g_counters.compile_count - compiled == ncompiled);
    tg_context_end();
  }
  CHECK(!tg_has_error());
}

/* ---------------------------------------------------------------------------------------------- */

/* Spins about `work` iterations per index, so that each chunk takes a known time. */
static const char *SPIN_SRC = "#include <stdint.h>\n"
                              "void spin(void **restrict bufs, int64_t gstart, int64_t gend) {\n"
                              "  int64_t work = *(const int64_t *)bufs[0];\n"
                              "  volatile int64_t sink = 0;\n"
                              "  for (int64_t i = gstart; i < gend; i++)\n"
                              "    for (int64_t j = 0; j < work; j++) sink = sink + j;\n"
                              "}\n";

static double time_exec(Program *p, void **bufs, int64_t n, int64_t threads, int iters) {
  int64_t gs[3] = {n, 1, 1}, ls[3] = {threads, 1, 1};
  for (int i = 0; i < iters / 10 + 1; i++) program_exec(p, bufs, 1, 0, gs, ls, false);
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now_seconds();
    for (int i = 0; i < iters; i++) program_exec(p, bufs, 1, 0, gs, ls, false);
    double dt = (now_seconds() - t0) / iters;
    if (dt < best) best = dt;
  }
  return best;
}

TEST(bench_exec_latency) {
  Device *d = device_get("CPU");
  Program *nop = program_get(d, "nop", NOP_SRC), *spin = program_get(d, "spin", SPIN_SRC);
  CHECK(nop != NULL && spin != NULL);
  if (!nop || !spin) return;
  int nt = tp_max_threads();
  void *bufs[1] = {NULL};
  printf("  exec of an empty kernel: 1 thread %.0f ns, %d threads %.0f ns\n",
         time_exec(nop, bufs, 1024, 1, 200000) * 1e9, nt, time_exec(nop, bufs, 1024, 0, 200000) * 1e9);
  /* Hand-off cost: with chunks of known length, overhead = t(all threads) - t(1 thread) / nt. */
  int64_t work = 1;
  bufs[0] = &work;
  for (work = 1; time_exec(spin, bufs, 64, 1, 20) < 20e-6; work *= 2) {
  }
  double t1 = time_exec(spin, bufs, 64, 1, 2000), tn = time_exec(spin, bufs, 64, 0, 2000);
  printf("  exec of a %.1f us kernel: 1 thread %.2f us, %d threads %.2f us (hand-off overhead %.2f us)\n",
         t1 * 1e6, t1 * 1e6, nt, tn * 1e6, (tn - t1 / nt) * 1e6);
  /* After idling past the spin window the workers sleep: the first launch pays a futex wake-up. */
  int64_t gs[3] = {64, 1, 1}, ls[3] = {0, 1, 1};
  double worst = 0, total = 0;
  for (int i = 0; i < 20; i++) {
    usleep(2000);
    double t0 = now_seconds();
    program_exec(spin, bufs, 1, 0, gs, ls, false);
    double dt = now_seconds() - t0;
    total += dt;
    if (dt > worst) worst = dt;
  }
  printf("  same kernel after 2 ms idle, %d threads: mean %.2f us, worst %.2f us\n", nt, total / 20 * 1e6,
         worst * 1e6);
  Program *h = NULL;
  double t0 = now_seconds();
  for (int i = 0; i < 100000; i++) h = program_get(d, "nop", NOP_SRC);
  printf("  program_get (cached): %.0f ns\n", (now_seconds() - t0) / 100000 * 1e9);
  CHECK(h == nop);
  t0 = now_seconds();
  for (int i = 0; i < 1000000; i++) buffer_unref(buffer_new(d, 4096));
  printf("  buffer_new + buffer_unref: %.0f ns\n", (now_seconds() - t0) / 1000000 * 1e9);
}

int main(void) {
  snprintf(g_cache_root, sizeof g_cache_root, "/tmp/tg_test_runtime_XXXXXX");
  if (!mkdtemp(g_cache_root)) {
    perror("mkdtemp");
    return 1;
  }
  /* Set before anything reads it. */
  setenv("TINYGRAD_CACHE_DIR", g_cache_root, 1);
  int rc = RUN_TESTS();
  nftw(g_cache_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
