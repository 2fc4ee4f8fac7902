/*
 * fuzz_onnx.c -- libFuzzer target for the ONNX loader (make fuzz).
 *
 * Loads the input as an .onnx model (onnx_load_mem, the bytes tg_onnx_load reads). A model that
 * loads is described through every accessor and run once on zero inputs of its declared shapes
 * (dynamic dims 1); a failed load or run must say why. The model is freed and no handle may stay
 * live. Any crash, sanitizer report, leaked handle or silent failure is a finding.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/loaders.h"
#include "tinygrad.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tg_onnx *m = onnx_load_mem("tg_onnx_load", "input", data, size, NULL);
  if (!m) {
    if (!tg_last_error()) abort();
    tg_clear_error();
    if (tg_live_count() != 0) abort();
    return 0;
  }
  int nin = tg_onnx_input_count(m), nout = tg_onnx_output_count(m);
  if (nin < 0 || nout < 1) abort();
  tg_scope_begin();
  tg_tensor *in = calloc((size_t)nin + 1, sizeof *in), *out = calloc((size_t)nout + 1, sizeof *out);
  bool ok = true;
  for (int i = 0; i < nin && ok; i++) {
    int64_t shape[64];
    int nd = tg_onnx_input_shape(m, i, shape, 64);
    if (!tg_onnx_input_name(m, i)) abort();
    tg_dtype dt = tg_onnx_input_dtype(m, i);
    if (nd < 0 || nd > 8) { /* unknown rank or too big to try */
      ok = false;
      break;
    }
    int64_t numel = 1;
    for (int d = 0; d < nd; d++) {
      if (shape[d] < 0) shape[d] = 1;
      numel *= shape[d] > 64 ? 65 : shape[d];
    }
    if (numel > 4096) {
      ok = false;
      break;
    }
    in[i] = tg_zeros(shape, nd, &(tg_opts){.dtype = dt ? dt : TG_FLOAT32, .requires_grad = TG_GRAD_UNSET});
    if (!tg_valid(in[i])) ok = false;
  }
  for (int i = 0; i < nout; i++)
    if (!tg_onnx_output_name(m, i)) abort();
  /* run only small graphs: the point is the loader and the ops' argument checks, not kernels */
  if (ok && size < 4096) {
    if (tg_onnx_run(m, in, nin, out, nout) != TG_OK) {
      if (!tg_last_error()) abort();
    } else {
      for (int i = 0; i < nout; i++)
        if (!tg_valid(out[i])) abort();
    }
  }
  tg_clear_error();
  free(in);
  free(out);
  tg_scope_end();
  tg_onnx_free(m);
  if (tg_live_count() != 0) abort();
  return 0;
}
