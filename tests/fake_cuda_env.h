/*
 * fake_cuda_env.h -- for tests that run the CUDA device on the stand-in driver and NVRTC
 * (tests/fake_libcuda.c, tests/fake_libnvrtc.c: kernels compiled for the host and run there).
 *
 * fake_cuda_env_begin(dir, cap, device) points TG_CUDA_LIB and TG_NVRTC_LIB at the stand-ins next to
 * the test binary (their directory goes to dir), gives the process a kernel cache of its own unless
 * TINYGRAD_CACHE_DIR is set, and returns whether `device` opens on them (saying why not).
 * fake_cuda_env_end() removes that cache.
 */
#ifndef TG_FAKE_CUDA_ENV_H
#define TG_FAKE_CUDA_ENV_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>
#include <unistd.h>

#include "runtime/device.h" /* program_tier_wait */

static char fake_cache_dir[] = "/tmp/tg-fake-cuda-cache-XXXXXX";
static bool fake_cache_ours;

static bool fake_cuda_env_begin(char *dir, size_t cap, const char *device) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  char *slash = strrchr(exe, '/');
  if (slash) *slash = '\0';
  snprintf(dir, cap, "%s", exe);
  char lib[PATH_MAX + 32];
  snprintf(lib, sizeof lib, "%s/libfakecuda.so", exe);
  setenv("TG_CUDA_LIB", lib, 1);
  snprintf(lib, sizeof lib, "%s/libfakenvrtc.so", exe);
  setenv("TG_NVRTC_LIB", lib, 1); /* CUDA C the stand-in driver compiles for the host and runs */
  fake_cache_ours = !getenv("TINYGRAD_CACHE_DIR") && mkdtemp(fake_cache_dir);
  if (fake_cache_ours) setenv("TINYGRAD_CACHE_DIR", fake_cache_dir, 1);
  tg_clear_error();
  tg_tensor t = tg_zeros(TG_SHAPE(1), TG_OPTS(.device = device));
  bool ok = tg_valid(t);
  if (!ok) fprintf(stderr, "%s on the stand-in driver: %s\n", device, tg_last_error());
  tg_free(t);
  tg_clear_error();
  return ok;
}

static void fake_cuda_env_end(void) {
  if (!fake_cache_ours) return;
  program_tier_wait(); /* a background build of a CPU kernel may still be writing into the cache */
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", fake_cache_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", fake_cache_dir);
}

#endif
