/*
 * fuzz_idx.c -- libFuzzer target for the IDX reader (make fuzz).
 *
 * Each input is read twice: by the in-memory parser, and by tg_idx_load from a memory file (memfd)
 * so that zlib's gzip path runs too (an input starting with 1f 8b is a gzip stream). A loaded tensor
 * must read back with as many elements as its shape says; a failure must say why. Any crash,
 * sanitizer report or leaked handle is a finding.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nn/loaders.h"
#include "tinygrad.h"

static void check(tg_tensor t) {
  if (!t.id) {
    if (!tg_last_error()) abort();
    tg_clear_error();
    return;
  }
  size_t n = (size_t)tg_numel(t) * tg_dtype_itemsize(tg_dtype_of(t));
  void *buf = malloc(n ? n : 1);
  if (tg_data(t, buf, n) != TG_OK) abort();
  free(buf);
  tg_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("fuzz_idx", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  check(idx_load_mem("tg_idx_load", "input", data, size));
  if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
  check(tg_idx_load(path));
  if (tg_live_count() != 0) abort();
  return 0;
}
