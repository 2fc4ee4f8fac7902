/*
 * fuzz_gguf.c -- libFuzzer target for the GGUF loader (make fuzz).
 *
 * Feeds the input to the in-memory loader; a loaded dict must read back (every tensor's data and
 * every metadata value). Any crash, sanitizer report, leaked handle or silent failure is a finding.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nn/state_dict.h"
#include "tinygrad.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tg_state_dict *sd = gguf_load_mem("fuzz", "input", data, size);
  if (!sd) {
    if (!tg_last_error()) abort();
    tg_clear_error();
  } else {
    for (int i = 0; i < tg_state_dict_len(sd); i++) {
      tg_tensor t = tg_state_dict_tensor(sd, i);
      size_t n = (size_t)tg_numel(t) * tg_dtype_itemsize(tg_dtype_of(t));
      void *buf = malloc(n ? n : 1);
      if (tg_data(t, buf, n) != TG_OK) abort();
      free(buf);
    }
    for (int i = 0; i < tg_state_dict_meta_len(sd); i++)
      if (!tg_state_dict_meta_value(sd, i) ||
          tg_state_dict_meta_get(sd, tg_state_dict_meta_key(sd, i)) != tg_state_dict_meta_value(sd, i))
        abort();
    tg_state_dict_free(sd);
  }
  if (tg_live_count() != 0) abort();
  return 0;
}
