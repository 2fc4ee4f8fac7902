/*
 * loaders.h -- in-memory entry points of the PyTorch checkpoint loader (torch_load.c) and the IDX
 * reader (datasets.c), for the file loaders and the fuzz targets. `path` is only used in messages.
 */
#ifndef TG_NN_LOADERS_H
#define TG_NN_LOADERS_H

#include <stddef.h>
#include <stdint.h>

#include "tinygrad.h"

/* A torch.save file (zip or legacy format) held in data[0..len), which must stay valid during the
 * call. Returns a new dict, or NULL with a TG_ERR_IO error "fn: path: ...". */
tg_state_dict *torch_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len);

/* An uncompressed IDX file held in data[0..len). Returns a new realized tensor or none with an error. */
tg_tensor idx_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len);

#endif
