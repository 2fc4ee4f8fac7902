/*
 * fuzz_tar.c -- libFuzzer target for the tar extractor (make fuzz).
 *
 * Feeds the input to the in-memory extractor; an extracted member must read back as 1-D uint8 data
 * of its stated size. Any crash, sanitizer report, leaked handle or silent failure is a finding.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nn/state_dict.h"
#include "tinygrad.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tg_state_dict *sd = tar_extract_mem("fuzz", "input", data, size);
  if (!sd) {
    if (!tg_last_error()) abort();
    tg_clear_error();
  } else {
    for (int i = 0; i < tg_state_dict_len(sd); i++) {
      tg_tensor t = tg_state_dict_tensor(sd, i);
      if (tg_ndim(t) != 1 || tg_dtype_of(t) != TG_UINT8 || (size_t)tg_numel(t) > size) abort();
      size_t n = (size_t)tg_numel(t);
      void *buf = malloc(n ? n : 1);
      if (tg_data(t, buf, n) != TG_OK) abort();
      free(buf);
    }
    tg_state_dict_free(sd);
  }
  if (tg_live_count() != 0) abort();
  return 0;
}
