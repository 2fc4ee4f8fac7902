/*
 * fuzz_torch_load.c -- libFuzzer target for the PyTorch checkpoint loader (make fuzz).
 *
 * Feeds the input to the in-memory loader (tg_torch_load's path: zip or legacy format, the restricted
 * unpickler, view materialization, flattening). A loaded dict must read back (every tensor's data,
 * every name found by lookup, every metadata value valid UTF-8); a failure must say why. Any crash,
 * sanitizer report, leaked handle or unexplained failure is a finding. Seeds: tests/fuzz_corpus/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nn/loaders.h"
#include "nn/state_dict.h"
#include "tinygrad.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tg_state_dict *sd = torch_load_mem("tg_torch_load", "input", data, size);
  if (!sd) {
    if (!tg_last_error()) abort(); /* a failure must say why */
    tg_clear_error();
  } else {
    for (int i = 0; i < tg_state_dict_len(sd); i++) {
      tg_tensor t = tg_state_dict_tensor(sd, i);
      size_t n = (size_t)tg_numel(t) * tg_dtype_itemsize(tg_dtype_of(t));
      void *buf = malloc(n ? n : 1);
      if (tg_data(t, buf, n) != TG_OK) abort();
      free(buf);
      if (tg_state_dict_get(sd, tg_state_dict_name(sd, i)).id != t.id) abort();
    }
    for (int i = 0; i < tg_state_dict_meta_len(sd); i++) {
      const char *v = tg_state_dict_meta_value(sd, i);
      if (!utf8_valid((const uint8_t *)v, strlen(v))) abort();
    }
    tg_state_dict_free(sd);
  }
  if (tg_last_error()) abort(); /* nothing may be left recorded */
  if (tg_live_count() != 0) abort();
  return 0;
}
