/*
 * ops_cuda_null.c -- the compile-only NULL device for CUDA (DEV=NULL:CUDA[:sm_XX]): kernels are rendered
 * in CUDA C (renderer/cstyle.c, LANG_CUDA) and compiled to PTX with NVRTC for the arch; nothing is
 * launched and buffers stay zeroed. It checks CUDA codegen on machines without a GPU.
 *
 * In: CUDA C source with one `extern "C" __global__` function per program.
 * Out: PTX text (compile), a placeholder program (load), launches that do nothing (exec).
 * Invariants:
 *  - NVRTC (cuda_nvrtc.c) is opened at the first open; without it the open fails with an error
 *    naming the library and CUDA_PATH.
 *  - Buffers are host memory, zeroed at allocation; copies into a buffer are dropped (as in
 *    tinygrad's NULL device), so every read gives zeros.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_nvrtc.h"

typedef struct {
  int index;
  int sm; /* 80 for sm_80 */
  char id[96];
} NullCuda;

static void *nullcuda_open_arch(int index, const char *arch) {
  int sm = 90;
  if (arch && !cuda_parse_arch("NULL:CUDA", arch, &sm)) return NULL;
  if (!nvrtc_load("NULL:CUDA")) return NULL;
  NullCuda *s = tg_xcalloc(1, sizeof *s);
  s->index = index;
  s->sm = sm;
  int major, minor;
  nvrtc_version(&major, &minor);
  snprintf(s->id, sizeof s->id, "nvrtc-%d.%d-sm_%d-ptx", major, minor, sm);
  return s;
}
static void *nullcuda_open(int index) { return nullcuda_open_arch(index, NULL); }
static void nullcuda_close(void *state) { free(state); }

static void nullcuda_caps(void *state, DeviceCaps *c) {
  memset(c, 0, sizeof *c);
  c->sm = ((NullCuda *)state)->sm;
  int major, minor;
  nvrtc_version(&major, &minor);
  c->wgmma = c->sm == 90 && major >= 12; /* (compile-only: "the GPU" is the arch named) */
  c->lang = LANG_CUDA;
  c->gpu = true;
  c->fp16 = c->fp64 = true;
  c->max_local = 1024;
  c->max_local_dims[0] = c->max_local_dims[1] = 1024;
  c->max_local_dims[2] = 64;
  c->local_mem = 48 * 1024;
  c->max_dims = 3;
}
static const char *nullcuda_compiler_id(void *state) { return ((NullCuda *)state)->id; }
static void nullcuda_describe(void *state) {
  NullCuda *s = state;
  int major, minor;
  nvrtc_version(&major, &minor);
  fprintf(stderr, "NULL:CUDA:%d: compile-only, NVRTC %d.%d, sm_%d\n", s->index, major, minor, s->sm);
}

static void *nullcuda_alloc(void *state, size_t nbytes) {
  (void)state;
  return tg_xcalloc(1, nbytes ? nbytes : 1);
}
static void nullcuda_free(void *state, void *ptr, size_t nbytes) {
  (void)state, (void)nbytes;
  free(ptr);
}
static tg_status nullcuda_copyin(void *state, void *dst, const void *src, size_t nbytes) {
  (void)state, (void)dst, (void)src, (void)nbytes; /* nothing runs: buffers stay zeroed */
  return TG_OK;
}
static tg_status nullcuda_copyout(void *state, void *dst, const void *src, size_t nbytes) {
  (void)state;
  memcpy(dst, src, nbytes);
  return TG_OK;
}
static tg_status nullcuda_copy(void *state, void *dst, const void *src, size_t nbytes) {
  (void)state, (void)dst, (void)src, (void)nbytes;
  return TG_OK;
}

/* CUDA C -> PTX for the device's arch (compute_XX: no machine code, so any arch NVRTC knows the
 * virtual architecture of compiles); the NVRTC log is the error on failure. */
static tg_status nullcuda_compile(void *state, const char *src, uint8_t **lib, size_t *liblen) {
  return nvrtc_compile("NULL:CUDA", src, ((NullCuda *)state)->sm, false, lib, liblen);
}

static void *nullcuda_load(void *state, const char *fname, const uint8_t *lib, size_t liblen) {
  (void)state, (void)liblen;
  if (!fname || !lib) {
    tg_set_error(TG_ERR_INVALID, "load: no %s", fname ? "binary" : "name");
    return NULL;
  }
  return tg_xstrdup(fname);
}
static void nullcuda_unload(void *state, void *prg) {
  (void)state;
  free(prg);
}
static double nullcuda_exec(void *state, void *prg, void **bufs, int nbufs, int nvals, const int64_t *global_size,
                            const int64_t *local_size, bool wait) {
  (void)state, (void)prg, (void)bufs, (void)nbufs, (void)nvals, (void)global_size, (void)local_size, (void)wait;
  return 0.0;
}
static void nullcuda_synchronize(void *state) { (void)state; }
/* DEBUG=7: the PTX, and the SASS NVRTC compiles for sm_XX (through nvdisasm or cuobjdump), so the
 * GPU device's listing is exercised without a GPU. */
static char *nullcuda_disasm(void *state, const char *src, const uint8_t *lib, size_t liblen) {
  (void)lib, (void)liblen;
  return cuda_listing("NULL:CUDA", src, ((NullCuda *)state)->sm, NULL, 0);
}

const DeviceVT nullcuda_device_vt = {
    .name = "NULL",
    .open = nullcuda_open,
    .close = nullcuda_close,
    .alloc = nullcuda_alloc,
    .free = nullcuda_free,
    .copyin = nullcuda_copyin,
    .copyout = nullcuda_copyout,
    .compile = nullcuda_compile,
    .load = nullcuda_load,
    .unload = nullcuda_unload,
    .exec = nullcuda_exec,
    .synchronize = nullcuda_synchronize,
    .compiler_id = nullcuda_compiler_id,
    .caps = nullcuda_caps,
    .copy = nullcuda_copy,
    .describe = nullcuda_describe,
    .disasm = nullcuda_disasm,
    .open_arch = nullcuda_open_arch,
};
