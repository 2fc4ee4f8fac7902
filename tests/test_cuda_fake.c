/*
 * test_cuda_fake.c -- the CUDA device (ops_cuda.c) without a GPU: its errors with a missing driver
 * library, with the CUDA toolkit's stub libcuda, with no GPU, with a GPU number the machine lacks and
 * without NVRTC;
 * then, on the stand-in driver tests/fake_libcuda.c (build/tests/libfakecuda.so: host memory, two
 * sm_90 devices, launches recorded but not run), device names and archs (CUDA, NV, CUDA:1,
 * NV:CUDA:sm_80), caps, exact round trips CPU -> CUDA -> CPU through the pinned staging buffer,
 * CUDA:0 -> CUDA:1 through the peer path, launches of NVRTC-compiled kernels with DEBUG=2's line and
 * parameters that point into live allocations, and out-of-memory errors with the caching
 * allocator's retry. Kernels do not compute on the fake, so nothing here reads a kernel's output.
 * The tests run in file order: the first ones must open CUDA before the fake is loaded (a driver
 * library that initialised stays for the process).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>
#include <unistd.h>

#include "runtime/device.h"
#include "test.h"

#define STUB "/usr/local/cuda/lib64/stubs/libcuda.so"

static char g_fake[PATH_MAX + 32];
static long (*fake_stat)(const char *);

/* build/tests/libfakecuda.so, beside this binary */
static const char *fake_path(void) {
  if (!g_fake[0]) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(g_fake, sizeof g_fake, "%s/libfakecuda.so", exe);
  }
  return g_fake;
}

static bool has_nvrtc(void) {
  const char *cp = getenv("CUDA_PATH");
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/lib64/libnvrtc.so", cp && *cp ? cp : "/usr/local/cuda");
  return access(p, R_OK) == 0;
}

/* Runs realize(t) with stderr going to a file; returns what it printed (malloc'd). */
static char *stderr_of_realize(tg_tensor t, tg_status *st) {
  tt_stderr_begin();
  *st = tg_realize(t);
  return tt_stderr_end();
}

TEST(cuda_missing_driver_library) {
  tg_clear_error();
  tg_context_begin();
  tg_context_set("TG_CUDA_LIB", "/nonexistent/libcuda.so.1");
  CHECK(device_get("CUDA") == NULL);
  CHECK(tg_last_status() == TG_ERR_RUNTIME);
  CHECK_STR_CONTAINS(tg_last_error(), "cannot open CUDA:0");
  CHECK_STR_CONTAINS(tg_last_error(), "cannot load the CUDA driver library /nonexistent/libcuda.so.1");
  CHECK_STR_CONTAINS(tg_last_error(), "comes with the NVIDIA driver");
  tg_clear_error();
  /* NV is the same device, by its other name; the name parses and the same reason comes back */
  CHECK(device_get("NV:CUDA:sm_90") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "cannot open NV:0");
  CHECK_STR_CONTAINS(tg_last_error(), "comes with the NVIDIA driver");
  tg_clear_error();
  /* a bad arch string is told before any driver is needed */
  CHECK(device_get("CUDA:sm_7x") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "CUDA: arch 'sm_7x' is not an sm_XX compute capability");
  tg_clear_error();
  CHECK(device_get("CL:sm_90") == NULL); /* only CUDA kinds take an arch without their renderer */
  CHECK_STR_CONTAINS(tg_last_error(), "CL has no renderer 'sm_90'");
  tg_clear_error();
  tg_context_end();
}

TEST(cuda_stub_library_is_not_a_driver) {
  if (access(STUB, R_OK) != 0) {
    printf("  (no %s here: the stub's error is not checked)\n", STUB);
    return;
  }
  tg_clear_error();
  tg_context_begin();
  tg_context_set("TG_CUDA_LIB", STUB);
  CHECK(device_get("CUDA") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "only the CUDA toolkit's stub libcuda was found");
  CHECK_STR_CONTAINS(tg_last_error(), "no NVIDIA driver");
  tg_clear_error();
  tg_context_end();
}

TEST(cuda_no_gpu_and_no_such_gpu) {
  tg_clear_error();
  tg_context_begin();
  tg_context_set("TG_CUDA_LIB", fake_path());
  setenv("FAKE_CUDA_INIT", "100", 1); /* the driver is there, no GPU */
  CHECK(device_get("CUDA") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "no NVIDIA GPU found (cuInit: CUDA_ERROR_NO_DEVICE");
  tg_clear_error();
  unsetenv("FAKE_CUDA_INIT");
  setenv("FAKE_CUDA_DEVICES", "0", 1);
  CHECK(device_get("CUDA") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "no NVIDIA GPU found (the driver reports 0 devices)");
  tg_clear_error();
  setenv("FAKE_CUDA_DEVICES", "1", 1);
  CHECK(device_get("CUDA:5") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "no device CUDA:5 (this machine has one GPU, CUDA:0)");
  tg_clear_error();
  setenv("FAKE_CUDA_DEVICES", "2", 1);
  CHECK(device_get("CUDA:5") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "(this machine has 2 GPUs, CUDA:0 to CUDA:1)");
  tg_clear_error();
  /* a GPU but no NVRTC to compile for it */
  tg_context_set("TG_NVRTC_LIB", "/nonexistent/libnvrtc.so");
  CHECK(device_get("CUDA") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "CUDA: NVRTC not found: tried /nonexistent/libnvrtc.so (set CUDA_PATH to the CUDA toolkit");
  tg_clear_error();
  tg_context_end();
}

/* From here on the fake driver is loaded (TG_CUDA_LIB is read only until a library initialises). */
TEST(cuda_fake_device_names_and_caps) {
  if (!has_nvrtc()) {
    printf("  (no NVRTC in CUDA_PATH: the CUDA device cannot open; its fake-driver tests are not run)\n");
    return;
  }
  tg_clear_error();
  setenv("TG_CUDA_LIB", fake_path(), 1);
  Device *d = device_get("CUDA");
  CHECK_MSG(d != NULL, "%s", tg_last_error());
  if (!d) return;
  void *h = dlopen(fake_path(), RTLD_NOW | RTLD_NOLOAD);
  CHECK(h != NULL);
  if (h) *(void **)&fake_stat = dlsym(h, "fake_cuda_stat");
  CHECK(fake_stat != NULL);
  if (!fake_stat) return;
  CHECK(strcmp(d->name, "CUDA") == 0 && strcmp(d->renderer, "CUDA") == 0);
  CHECK(d->caps.lang == LANG_CUDA && d->caps.gpu && d->caps.fp16 && d->caps.fp64 && !d->caps.images);
  CHECK(d->caps.max_local == 1024 && d->caps.max_local_dims[2] == 64 && d->caps.local_mem == 49152 && d->caps.max_dims == 3);
  CHECK_STR_CONTAINS(device_compiler_id(d), "-sm_90-cubin");
  CHECK(device_get("cuda:0") == d && device_get("CUDA:CUDA") == d);
  Device *d1 = device_get("CUDA:1");
  CHECK(d1 && d1 != d && d1->index == 1 && strcmp(d1->name, "CUDA:1") == 0);
  /* NV: its own device of the same GPU; an older arch than the GPU's compiles to PTX */
  Device *nv = device_get("NV:CUDA:sm_80");
  CHECK_MSG(nv != NULL, "%s", tg_last_error());
  if (nv) {
    CHECK(strcmp(nv->name, "NV:CUDA:sm_80") == 0 && nv->vt == d->vt && nv != d);
    CHECK_STR_CONTAINS(device_compiler_id(nv), "-sm_80-ptx");
    CHECK(device_get(nv->name) == nv);
  }
  /* NVRTC has sm_89 machine code, but it does not run on an sm_90 GPU: PTX */
  Device *s89 = device_get("CUDA:sm_89");
  CHECK_MSG(s89 && strstr(device_compiler_id(s89), "-sm_89-ptx"), "%s", s89 ? device_compiler_id(s89) : tg_last_error());
  Device *s90 = device_get("CUDA:1:sm_90");
  CHECK(s90 && strcmp(s90->name, "CUDA:1:CUDA:sm_90") == 0);
  CHECK(device_get("CUDA:sm_100") == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "the GPU is sm_90 and cannot run code for sm_100");
  tg_clear_error();
  CHECK(fake_stat("live_streams") >= 3 && fake_stat("retained") >= 3);
}

TEST(cuda_fake_round_trips_and_peer_copy) {
  if (!fake_stat) return;
  BEGIN;
  enum { N = 3 * 1024 * 1024 + 7 }; /* past one staging half, and an odd size */
  uint8_t *src = malloc(N), *back = malloc(N), *back1 = malloc(N);
  for (size_t i = 0; i < N; i++) src[i] = (uint8_t)(i * 2654435761u >> 13);
  tg_tensor x = tg_from_data(src, TG_SHAPE(N), TG_OPTS(.dtype = TG_UINT8, .device = "CPU"));
  long htod0 = fake_stat("htod"), dtoh0 = fake_stat("dtoh"), peer0 = fake_stat("peer_copies");
  tg_tensor g = tg_to(x, "CUDA");
  CHECK(tg_realize(g) == TG_OK);
  CHECK(strcmp(tg_device_of(g), "CUDA") == 0);
  CHECK(fake_stat("htod") > htod0 && fake_stat("pinned") >= 1);
  memset(back, 0, N);
  CHECK(tg_data(tg_to(g, "CPU"), back, N) == TG_OK);
  CHECK(memcmp(src, back, N) == 0);
  CHECK(fake_stat("dtoh") > dtoh0);
  /* CUDA:0 -> CUDA:1 on the GPUs (the peer path: no host staging), then back to the host */
  tg_tensor g1 = tg_to(g, "CUDA:1");
  CHECK(tg_realize(g1) == TG_OK);
  CHECK_MSG(fake_stat("peer_copies") == peer0 + 1, "peer copies %ld -> %ld", peer0, fake_stat("peer_copies"));
  CHECK(fake_stat("enable_peer") >= 1);
  memset(back1, 0, N);
  CHECK(tg_data(tg_to(g1, "CPU"), back1, N) == TG_OK);
  CHECK(memcmp(src, back1, N) == 0);
  /* CUDA:0 -> NV:0: one GPU under two names, a copy on the GPU */
  long dtod0 = fake_stat("dtod");
  tg_tensor n0 = tg_to(g, "NV");
  CHECK(tg_realize(n0) == TG_OK && fake_stat("dtod") == dtod0 + 1);
  memset(back1, 0, N);
  CHECK(tg_data(tg_to(n0, "CPU"), back1, N) == TG_OK && memcmp(src, back1, N) == 0);
  free(src), free(back), free(back1);
  END;
}

TEST(cuda_fake_launch_debug2) {
  if (!fake_stat) return;
  BEGIN;
  float in[6] = {1, 2, 3, 4, 5, 6};
  tg_tensor x = tg_from_data(in, TG_SHAPE(2, 3), TG_OPTS(.dtype = TG_FLOAT32, .device = "CUDA"));
  tg_tensor y = tg_add(tg_sum(tg_mul_s(x, 2), TG_AXES(1), false), tg_ones(TG_SHAPE(2), TG_OPTS(.device = "CUDA")));
  long l0 = fake_stat("launches"), bad0 = fake_stat("bad_params");
  tg_context_begin();
  tg_context_set("DEBUG", "2");
  tg_status st;
  char *err = stderr_of_realize(y, &st);
  tg_context_end();
  CHECK_MSG(st == TG_OK, "%s", tg_last_error());
  CHECK(fake_stat("launches") > l0);
  CHECK(fake_stat("bad_params") == bad0);
  CHECK_STR_CONTAINS(err, "*** CUDA");
  CHECK_STR_CONTAINS(err, "tm ");
  free(err);
  /* DEBUG=7: the kernel's PTX, then its SASS from the cached CUBIN (or the note that no disassembler
   * is installed) */
  tg_context_begin();
  tg_context_set("DEBUG", "7");
  err = stderr_of_realize(tg_exp2(tg_add_s(x, 3)), &st);
  tg_context_end();
  CHECK_MSG(st == TG_OK, "%s", tg_last_error());
  CHECK_STR_CONTAINS(err, "assembly (CUDA)");
  CHECK_STR_CONTAINS(err, "// PTX (compute_90)");
  CHECK_MSG(strstr(err, "// SASS (sm_90, ") || strstr(err, "neither nvdisasm nor cuobjdump is installed"), "%.2000s", err);
  free(err);
  /* the same on NV:CUDA:sm_80, whose PTX tells the fake how many parameters each kernel takes */
  tg_tensor a = tg_from_data(in, TG_SHAPE(6), TG_OPTS(.dtype = TG_FLOAT32, .device = "NV:CUDA:sm_80"));
  tg_tensor b = tg_from_data(in, TG_SHAPE(6), TG_OPTS(.dtype = TG_FLOAT32, .device = "NV:CUDA:sm_80"));
  l0 = fake_stat("launches");
  CHECK(tg_realize(tg_add(tg_mul(a, b), a)) == TG_OK);
  CHECK_MSG(fake_stat("launches") == l0 + 1 && fake_stat("bad_params") == bad0, "launches %ld -> %ld, bad params %ld -> %ld", l0,
            fake_stat("launches"), bad0, fake_stat("bad_params"));
  CHECK(fake_stat("nparams") == 3); /* the output, a and b */
  CHECK(fake_stat("block0") >= 1 && fake_stat("grid0") * fake_stat("block0") == 6);
  /* a launch with more blocks along z than a CUDA grid has (65535): the grid is clamped and the
   * kernel's ids stride over the rest (65537 is prime, so the blocks along z hold one work-item) */
  float *host = calloc(5 * 3 * 65537, sizeof *host);
  tg_tensor big = tg_from_data(host, TG_SHAPE(5, 3, 65537), TG_OPTS(.dtype = TG_FLOAT32, .device = "CUDA"));
  free(host);
  l0 = fake_stat("launches");
  CHECK(tg_realize(tg_add_s(tg_contiguous(tg_permute(big, TG_AXES(2, 1, 0))), 1)) == TG_OK);
  CHECK(fake_stat("launches") > l0 && fake_stat("bad_params") == bad0);
  CHECK_MSG(fake_stat("max_grid2") == 65535, "largest grid z %ld", fake_stat("max_grid2"));
  END;
}

TEST(cuda_fake_out_of_memory) {
  if (!fake_stat) return;
  BEGIN;
  Device *d = device_get("CUDA");
  device_cache_clear(d);
  char lim[32];
  /* a tensor larger than the memory left: a clear error naming the device and the size */
  snprintf(lim, sizeof lim, "%d", 1 << 20);
  setenv("FAKE_CUDA_MEM_LIMIT", lim, 1);
  long fail0 = fake_stat("alloc_fail");
  tg_tensor big = tg_contiguous(tg_ones(TG_SHAPE(1 << 20), TG_OPTS(.device = "CUDA")));
  CHECK(tg_realize(big) != TG_OK);
  CHECK(fake_stat("alloc_fail") > fail0);
  CHECK_STR_CONTAINS(tg_last_error(), "out of GPU memory on CUDA:0: cannot allocate 4194304 bytes");
  tg_clear_error();
  unsetenv("FAKE_CUDA_MEM_LIMIT");
  /* idle cached memory is returned and the allocation tried again */
  device_cache_clear(d);
  Buffer *a = buffer_new(d, 600 << 10);
  CHECK(a != NULL);
  buffer_unref(a); /* kept in the device's cache */
  CHECK(d->cached_bytes >= (600u << 10));
  /* the limit leaves room for the new block only once the idle 600 KiB are returned */
  snprintf(lim, sizeof lim, "%ld", fake_stat("live_bytes") + (150 << 10));
  setenv("FAKE_CUDA_MEM_LIMIT", lim, 1);
  fail0 = fake_stat("alloc_fail");
  Buffer *b = buffer_new(d, 700 << 10); /* fits only once the cached block is gone */
  CHECK_MSG(b != NULL, "%s", tg_last_error());
  CHECK(fake_stat("alloc_fail") == fail0 + 1 && d->cached_bytes == 0);
  CHECK(!tg_has_error());
  buffer_unref(b);
  unsetenv("FAKE_CUDA_MEM_LIMIT");
  END;
}

TEST(cuda_fake_nothing_left) {
  if (!fake_stat) return;
  /* every buffer freed and the caches returned: the driver holds no allocation of ours */
  const char *names[] = {"CUDA", "CUDA:1", "NV", "NV:CUDA:sm_80", "CUDA:sm_89", "CUDA:1:sm_90"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    Device *d = device_get(names[i]);
    CHECK_MSG(d != NULL, "%s: %s", names[i], tg_last_error());
    if (d) device_cache_clear(d);
  }
  tg_clear_error();
  CHECK_MSG(fake_stat("live_allocs") == 0, "%ld allocations left", fake_stat("live_allocs"));
}

int main(void) {
  char cache[] = "/tmp/tg-cuda-cache-XXXXXX";
  if (!getenv("TINYGRAD_CACHE_DIR") && mkdtemp(cache)) setenv("TINYGRAD_CACHE_DIR", cache, 1);
  int rc = RUN_TESTS();
  program_tier_wait(); /* a background build of a CPU kernel may still be writing into the cache */
  if (strcmp(getenv("TINYGRAD_CACHE_DIR"), cache) == 0) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache);
  }
  return rc;
}
