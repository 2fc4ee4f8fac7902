/*
 * fake_libnvrtc.c -- a stand-in for NVRTC whose "PTX" is the CUDA C source itself, so that the
 * stand-in driver tests/fake_libcuda.c can compile it for the host and run its kernels there (see
 * FAKE_HOST_MARK there). Loaded through TG_NVRTC_LIB by tests that check values computed by CUDA
 * kernels without a GPU (tests/test_multi_nccl.c). Built as build/tests/libfakenvrtc.so by the
 * Makefile; not part of libtinygrad.
 *
 * In: the nvrtc* calls runtime/cuda_nvrtc.c makes. Out: version 99.0 (so its kernels never share
 * the disk cache with a real NVRTC's), no list of archs (every target is "PTX" for the arch asked),
 * and as the PTX: the marker line, then the source, NUL-terminated.
 */
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *image;
} FakeProgram;

static const char MARK[] = "// tinygrad.c fake NVRTC: CUDA C for the host\n";

const char *nvrtcGetErrorString(int r) { return r == 0 ? "NVRTC_SUCCESS" : "NVRTC_ERROR (fake)"; }

int nvrtcVersion(int *major, int *minor) {
  *major = 99, *minor = 0;
  return 0;
}

int nvrtcCreateProgram(FakeProgram **p, const char *src, const char *name, int nh, const char *const *headers,
                       const char *const *names) {
  (void)name, (void)nh, (void)headers, (void)names;
  if (!p || !src) return 1;
  FakeProgram *f = calloc(1, sizeof *f);
  if (!f) return 1;
  size_t n = strlen(src);
  if (!(f->image = malloc(sizeof MARK + n))) {
    free(f);
    return 1;
  }
  memcpy(f->image, MARK, sizeof MARK - 1);
  memcpy(f->image + sizeof MARK - 1, src, n + 1);
  *p = f;
  return 0;
}

int nvrtcCompileProgram(FakeProgram *p, int n, const char *const *opts) {
  (void)n, (void)opts;
  return p ? 0 : 1;
}

int nvrtcGetPTXSize(FakeProgram *p, size_t *n) {
  *n = strlen(p->image) + 1;
  return 0;
}

int nvrtcGetPTX(FakeProgram *p, char *out) {
  memcpy(out, p->image, strlen(p->image) + 1);
  return 0;
}

int nvrtcGetProgramLogSize(FakeProgram *p, size_t *n) {
  (void)p;
  *n = 1;
  return 0;
}

int nvrtcGetProgramLog(FakeProgram *p, char *log) {
  (void)p;
  log[0] = '\0';
  return 0;
}

int nvrtcDestroyProgram(FakeProgram **p) {
  if (!p || !*p) return 1;
  free((*p)->image);
  free(*p);
  *p = NULL;
  return 0;
}
