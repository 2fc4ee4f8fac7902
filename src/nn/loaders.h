/*
 * loaders.h -- in-memory entry points of the PyTorch checkpoint loader (torch_load.c), the IDX
 * reader (datasets.c) and the ONNX loader (onnx.c), for the file loaders and the fuzz targets.
 * `path` is only used in messages.
 */
#ifndef TG_NN_LOADERS_H
#define TG_NN_LOADERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tinygrad.h"

/* A torch.save file (zip or legacy format) held in data[0..len), which must stay valid during the
 * call. Returns a new dict, or NULL with a TG_ERR_IO error "fn: path: ...". */
tg_state_dict *torch_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len);

/* One value of a pickled dict for pickle_fields_mem: `key` and `want_array` in; out, a numpy array's
 * dtype ("u1", "i8", ...), shape and bytes (C order, little-endian), or a list's ints. The buffers are
 * malloc'd: free them with pickle_fields_free. */
typedef struct {
  const char *key; /* matched against str and bytes keys (Python 2 pickles read as encoding='bytes') */
  bool want_array; /* a numpy array, else a list (or tuple) of ints */
  char dtype[8];
  int ndim;
  int64_t shape[32];
  uint8_t *data;
  size_t nbytes;
  int64_t *ints;
  size_t nints;
} PickleField;

/* A pickle (protocol 2 to 5) in data[0..len) of a dict, nothing after it (CIFAR-10's python batches):
 * fills the nf fields from its values. Nothing is executed: the globals are torch_load's allow-list
 * plus numpy's array and dtype reconstructors. Returns true, or false with a TG_ERR_IO error "fn:
 * path: ..." (a missing key, a value of the wrong kind, a corrupt pickle) and nothing to free. */
bool pickle_fields_mem(const char *fn, const char *path, const uint8_t *data, size_t len, PickleField *f, int nf);
void pickle_fields_free(PickleField *f, int nf);

/* An uncompressed IDX file held in data[0..len). Returns a new realized tensor or none with an error. */
tg_tensor idx_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len);

/* An ONNX model held in data[0..len) (only read during the call), its tensors created on device
 * (NULL: the default). Returns a new model or NULL with a TG_ERR_IO error "fn: path: ...". */
tg_onnx *onnx_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len, const char *device);

#endif
