/*
 * onnx_run.c -- load an ONNX model, run it once on zeros (or uniform random numbers) of the shapes
 * its inputs declare, and print each output's shape and first values.
 *
 *   build/examples/onnx_run model.onnx [--rand] [dynamic-dim-size]
 *
 * Dynamic dims (dim_param "batch", or none) take dynamic-dim-size (default 1). Integer inputs are
 * zeros either way. DEBUG=2 shows the kernels; DEV=CL runs it on OpenCL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tinygrad.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s model.onnx [--rand] [dynamic-dim-size]\n", argv[0]);
    return 2;
  }
  bool rnd = false;
  int64_t dyn = 1;
  for (int i = 2; i < argc; i++) {
    char *end;
    if (!strcmp(argv[i], "--rand")) {
      rnd = true;
    } else if ((dyn = strtoll(argv[i], &end, 10)) <= 0 || *end || end == argv[i]) {
      fprintf(stderr, "%s: \"%s\" is neither --rand nor a positive dynamic-dim size\n", argv[0], argv[i]);
      return 2;
    }
  }
  tg_onnx *m = tg_onnx_load(argv[1], NULL);
  if (!m) {
    fprintf(stderr, "%s\n", tg_last_error());
    return 1;
  }
  int nin = tg_onnx_input_count(m), nout = tg_onnx_output_count(m);
  tg_tensor *in = calloc((size_t)nin + 1, sizeof *in), *out = calloc((size_t)nout + 1, sizeof *out);
  int rc = 0;
  tg_scope_begin();
  for (int i = 0; i < nin; i++) {
    int64_t shape[32];
    int nd = tg_onnx_input_shape(m, i, shape, 32);
    tg_dtype dt = tg_onnx_input_dtype(m, i);
    if (nd < 0 || nd > 32) {
      fprintf(stderr, "input '%s' has no static rank\n", tg_onnx_input_name(m, i));
      rc = 1;
      goto done;
    }
    printf("input  %-16s %-8s (", tg_onnx_input_name(m, i), tg_dtype_name(dt ? dt : TG_FLOAT32));
    for (int d = 0; d < nd; d++) {
      if (shape[d] < 0) shape[d] = dyn;
      printf("%s%lld", d ? ", " : "", (long long)shape[d]);
    }
    printf(")\n");
    tg_opts o = {.dtype = dt ? dt : TG_FLOAT32, .requires_grad = TG_GRAD_UNSET};
    in[i] = rnd && tg_dtype_is_float(o.dtype) ? tg_rand(shape, nd, &o) : tg_zeros(shape, nd, &o);
  }
  if (tg_onnx_run(m, in, nin, out, nout) != TG_OK || tg_realize_many(out, nout) != TG_OK) {
    fprintf(stderr, "%s\n", tg_last_error());
    rc = 1;
    goto done;
  }
  for (int i = 0; i < nout; i++) {
    int64_t shape[64];
    int nd = tg_shape(out[i], shape);
    printf("output %-16s %-8s (", tg_onnx_output_name(m, i), tg_dtype_name(tg_dtype_of(out[i])));
    for (int d = 0; d < nd; d++) printf("%s%lld", d ? ", " : "", (long long)shape[d]);
    printf(")");
    int64_t n = tg_numel(out[i]), k = n < 6 ? n : 6;
    tg_tensor flat = tg_cast(tg_reshape(out[i], &n, 1), TG_FLOAT64);
    double vals[6];
    if (k > 0 && tg_data(tg_shrink(flat, (int64_t[]){0, k}, 2), vals, sizeof vals) == TG_OK)
      for (int j = 0; j < k; j++) printf(" %.6g", vals[j]);
    printf("%s\n", n > k ? " ..." : "");
  }
done:
  tg_scope_end();
  free(in);
  free(out);
  tg_onnx_free(m);
  return rc;
}
