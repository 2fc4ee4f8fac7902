/*
 * cuda_nvrtc.h -- what the two CUDA devices (the real one, ops_cuda.c, and the compile-only
 * NULL:CUDA, ops_cuda_null.c) share: NVRTC opened with dlopen, CUDA C compiled to PTX or CUBIN,
 * sm_XX arch strings, and the DEBUG=7 listing (PTX, and SASS through nvdisasm or cuobjdump).
 */
#ifndef TG_CUDA_NVRTC_H
#define TG_CUDA_NVRTC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"

/* $CUDA_PATH, or /usr/local/cuda when unset or empty. Static storage (the environment's). */
const char *cuda_path(void);

/* Opens libnvrtc once (from $CUDA_PATH/lib64, then by its sonames; TG_NVRTC_LIB names the one file
 * to try). false + tg_set_error naming `who` (the device, "CUDA"), the files tried and CUDA_PATH
 * when it cannot. Thread-safe. */
bool nvrtc_load(const char *who);
/* NVRTC's version (after a successful nvrtc_load). */
void nvrtc_version(int *major, int *minor);

/* Parses an "sm_XY" arch string (sm_50 .. sm_200) into XY. false + tg_set_error naming `who` and the
 * string (with an example of the form) when it is not one. */
bool cuda_parse_arch(const char *who, const char *arch, int *sm);

/* The target NVRTC compiles for on a device of compute capability sm: *cubin true and sm itself where
 * NVRTC knows that arch (its machine code, SASS, in a CUBIN), else the newest arch below it that
 * NVRTC knows, as PTX (the driver compiles PTX for newer GPUs when it loads it). 0 + tg_set_error
 * naming `who` when NVRTC knows no arch at or below sm (a GPU older than NVRTC supports). */
int nvrtc_target(const char *who, int sm, bool *cubin);

/* CUDA C -> PTX text (with its terminating NUL, counted in *liblen, as cuModuleLoadData wants it)
 * for compute_<sm>, or a CUBIN for sm_<sm> when `cubin`. *lib is malloc'd, the caller frees it.
 * TG_ERR_COMPILE with NVRTC's log on failure, naming `who`. Thread-safe. */
tg_status nvrtc_compile(const char *who, const char *src, int sm, bool cubin, uint8_t **lib, size_t *liblen);

/* DEBUG=7's listing of a kernel: its PTX for compute_<sm> (compiled again from src), then the SASS of
 * `cubin_or_null` (a CUBIN; NULL: compiled from src for sm_<sm> here) through nvdisasm or
 * `cuobjdump -sass`, looked for in $CUDA_PATH/bin, then PATH. Without either tool the PTX alone,
 * and one line on stderr (once per process) saying that neither is installed. malloc'd text, or
 * NULL + tg_set_error. */
char *cuda_listing(const char *who, const char *src, int sm, const uint8_t *cubin_or_null, size_t cubinlen);

/* Whether bytes are an ELF object (a CUBIN) rather than PTX text. */
static inline bool cuda_is_cubin(const uint8_t *lib, size_t len) {
  return len >= 4 && lib[0] == 0x7f && lib[1] == 'E' && lib[2] == 'L' && lib[3] == 'F';
}

#endif
