/*
 * fuzz_safetensors.c -- libFuzzer target for the safetensors loader (make fuzz).
 *
 * Feeds the input to the loader three times: copying from memory, zero-copy (tg_safe_load_mmap's
 * path, wrapping the input bytes, which outlive the dict here), and tg_safe_load itself over a
 * memory file (memfd), which reads the header and each tensor with pread. A loaded dict
 * must read back: every tensor's bytes equal the bytes in the file's data section. Any crash,
 * sanitizer report, leaked handle or mismatch is a finding.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nn/state_dict.h"
#include "tinygrad.h"

static void check(tg_state_dict *sd) {
  if (!sd) {
    if (!tg_last_error()) abort(); /* a failure must say why */
    tg_clear_error();
    return;
  }
  for (int i = 0; i < tg_state_dict_len(sd); i++) {
    tg_tensor t = tg_state_dict_tensor(sd, i);
    size_t n = (size_t)tg_numel(t) * tg_dtype_itemsize(tg_dtype_of(t));
    void *buf = malloc(n ? n : 1);
    if (tg_data(t, buf, n) != TG_OK) abort();
    free(buf);
    if (tg_state_dict_get(sd, tg_state_dict_name(sd, i)).id != t.id) abort();
  }
  tg_state_dict_free(sd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("fuzz_safetensors", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  check(safe_load_mem("fuzz", "input", data, size, false, NULL));
  if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
  check(tg_safe_load(path));
  /* zero-copy wraps the bytes: give it a writable, suitably aligned copy */
  uint8_t *copy = aligned_alloc(64, (size / 64 + 1) * 64);
  if (size) memcpy(copy, data, size);
  check(safe_load_mem("fuzz", "input", copy, size, true, NULL));
  free(copy);
  if (tg_live_count() != 0) abort();
  return 0;
}
