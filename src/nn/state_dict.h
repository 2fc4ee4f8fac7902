/*
 * state_dict.h -- internals shared by the model-file loaders (safetensors.c, gguf.c, tar.c and any
 * other loader in src/nn/): adding owned handles to a tg_state_dict, mapping a file read-only, and
 * the in-memory entry points the fuzz targets call.
 *
 * Loaders parse from a (pointer, length) view of the whole file; nothing in a file is trusted: every
 * count, length and offset is checked against the bytes that are really there before it is used or
 * before anything is allocated from it.
 */
#ifndef TG_NN_STATE_DICT_H
#define TG_NN_STATE_DICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tinygrad.h"

/* ---- dict internals ---- */
/* tg_state_dict_get without an error for a missing name (none then): for callers that expect some. */
tg_tensor sd_get_quiet(const tg_state_dict *sd, const char *name);
/* Index of the entry named name[0..len) or -1. */
int sd_find(const tg_state_dict *sd, const char *name, size_t len);
/* Adds (or replaces) the entry `name` with t, TAKING OWNERSHIP of the handle t (it is moved to the
 * root scope; on error it is freed). name[0..len) must not contain NUL bytes. If `unique` is true an
 * existing name is an error (TG_ERR_IO "duplicate tensor name"), reported as `fn: path: ...`. */
tg_status sd_put(tg_state_dict *sd, const char *fn, const char *path, const char *name, size_t len,
                 tg_tensor t, bool unique);
/* Metadata with an explicit key length (key must not contain NUL); `unique` as for sd_put. */
tg_status sd_meta_put(tg_state_dict *sd, const char *fn, const char *path, const char *key, size_t klen,
                      const char *value, size_t vlen, bool unique);

/* ---- shared file mappings ---- */
/* A mapping that tensors wrap (tg_safe_load_mmap): reference counted, munmap'ed when the last
 * reference goes. The dict holds one and every buffer that wraps the mapping holds one, so tensors
 * and lazy results that read from it may outlive the dict. */
typedef struct FileMap FileMap;
/* A new mapping record holding one reference (the caller's). */
FileMap *file_map_new(void *addr, size_t len);
/* Drops one reference (void * so that it can be a buffer's on_free callback). */
void file_map_unref(void *m);
/* Makes the buffer of t, fresh from tg_from_blob over bytes inside m, hold a reference to m. */
void file_map_attach(FileMap *m, tg_tensor t);
/* Gives the dict the caller's reference to m (dropped after the handles in tg_state_dict_free). */
void sd_own_mapping(tg_state_dict *sd, FileMap *m);

/* ---- files ---- */
/* Copying loaders never map their file: bytes under a mapping that another process truncates raise
 * SIGBUS when touched, so they read with pread instead, and a file that shrinks or changes size while
 * it is read is a TG_ERR_IO error. Only tg_safe_load_mmap maps (its contract says what then). */
typedef struct {
  const uint8_t *data; /* whole file (NULL when len == 0) */
  size_t len;
  void *map; /* mmap'ed region (munmap on close) or NULL */
  size_t map_len;
  void *owned; /* the bytes read into memory (an anonymous mapping: munmap on close) or NULL */
  size_t owned_len;
} FileView;
/* The regular file `path`, whole: read into memory with pread (map = false), or mapped privately and
 * writable, so tensors may wrap it (map = true). Anything else -- a directory, a FIFO, a device, a
 * socket -- is refused without reading it (a FIFO without a writer does not block). Errors are
 * TG_ERR_IO "fn: path: reason", among them a file that changes size while it is read. */
tg_status file_view_open(FileView *fv, const char *fn, const char *path, bool map);
/* A file read in parts: pread at any offset (or a view of memory, for the fuzz targets). */
typedef struct {
  const uint8_t *mem; /* the whole input when in memory (or mapped), else NULL */
  int fd;             /* the open file (-1 for memory): src_read preads it even if mem is set */
  uint64_t len;       /* its size when it was opened */
  const char *fn, *path;
} Src;
/* Opens path for src_read (a regular file only, as file_view_open); close with src_close. */
tg_status src_open(Src *s, const char *fn, const char *path);
void src_close(Src *s);
/* n bytes at off into dst: TG_ERR_IO "fn: path: the file shrank ... (changed while it was read?)" if
 * they are no longer there. off + n must lie within len (callers check against the size first). */
tg_status src_read(const Src *s, uint64_t off, void *dst, size_t n);
/* For tests: when set, called with the path between the stages of a load (stage 0: the file is open
 * and its size known, nothing read; 1: a header is parsed, the tensor data not yet read), so a test
 * can change the file there. NULL in normal use. */
extern void (*io_test_hook)(const char *path, int stage);
/* Opens the regular file `path` for reading (blocking reads), filling *st; -1 with a TG_ERR_IO
 * error naming fn and path for anything else (a directory, a FIFO -- without waiting for a writer
 * --, a device, a socket) or a failed open. */
struct stat;
int open_regular(const char *fn, const char *path, struct stat *st);
void file_view_close(FileView *fv);
/* Tells the system that the loader is done with bytes p[0..n) of the file it is loading, when they
 * lie in the memory a file_view_open of this thread read the file into: their whole pages are given
 * back, so a loader that copies tensor after tensor peaks at about the file's size, not twice it.
 * Anything else (the fuzz targets' inputs, a mapping) is left alone. */
void sd_release_bytes(const uint8_t *p, size_t n);

/* ---- in-memory loaders (the fuzz targets and the file loaders call these) ---- */
/* `path` is only used in messages. For safe_load_mem with zero_copy, tensors wrap `data`: inside
 * `map` when it is not NULL (each wrapping buffer then holds a reference to it; the caller gives its
 * own to the dict with sd_own_mapping), else `data` must outlive every tensor that reads it. */
tg_state_dict *safe_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len,
                             bool zero_copy, FileMap *map);
tg_state_dict *gguf_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len);
tg_state_dict *tar_extract_mem(const char *fn, const char *path, const uint8_t *data, size_t len);

/* ---- small helpers ---- */
/* True if s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF). */
bool utf8_valid(const uint8_t *s, size_t n);
static inline uint16_t rd_u16le(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t rd_u32le(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t rd_u64le(const uint8_t *p) {
  return (uint64_t)rd_u32le(p) | ((uint64_t)rd_u32le(p + 4) << 32);
}

#endif
