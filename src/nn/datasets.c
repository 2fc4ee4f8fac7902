/*
 * datasets.c -- IDX files (the MNIST format) and tinygrad's nn.datasets.mnist().
 *
 * In: an IDX file (a regular file: a FIFO or a device is refused unread), plain or gzip-compressed
 * (zlib's gzread reads both): bytes 00 00 <type> <ndim>, ndim big-endian uint32 dims, then numel
 * elements of the type, big-endian. Out: a realized tensor of the matching dtype, elements converted
 * to host order.
 * Invariants: the header is validated before anything is allocated from it (known type, ndim <= 64,
 * numel without overflow); a plain file's size must equal what the header declares; a compressed
 * file's buffer grows only with the bytes really inflated, so a lying header costs no more memory than
 * the data that is there; data beyond the declared size is an error.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "../helpers.h"
#include "loaders.h"
#include "state_dict.h"

#define IDX_MAX_NDIM 64
#define NONE ((tg_tensor){0})

typedef struct {
  tg_dtype dt;
  int ndim;
  int64_t shape[IDX_MAX_NDIM];
  uint64_t numel, nbytes;
} IdxHeader;

/* Parses the 4-byte magic; on success fills dt/ndim. */
static bool idx_magic(const char *fn, const char *path, const uint8_t m[4], IdxHeader *h) {
  if (m[0] != 0 || m[1] != 0)
    return tg_set_error(TG_ERR_IO, "%s: %s: not an IDX file (bad magic %02x %02x)", fn, path, m[0], m[1]),
           false;
  switch (m[2]) {
  case 0x08:
    h->dt = TG_UINT8;
    break;
  case 0x09:
    h->dt = TG_INT8;
    break;
  case 0x0B:
    h->dt = TG_INT16;
    break;
  case 0x0C:
    h->dt = TG_INT32;
    break;
  case 0x0D:
    h->dt = TG_FLOAT32;
    break;
  case 0x0E:
    h->dt = TG_FLOAT64;
    break;
  default:
    return tg_set_error(TG_ERR_IO, "%s: %s: unknown IDX data type 0x%02x", fn, path, m[2]), false;
  }
  if (m[3] > IDX_MAX_NDIM)
    return tg_set_error(TG_ERR_IO, "%s: %s: %d dimensions (at most %d are supported)", fn, path, m[3],
                        IDX_MAX_NDIM),
           false;
  h->ndim = m[3];
  return true;
}

/* Parses the dims (4 * ndim bytes) and checks the total size. */
static bool idx_dims(const char *fn, const char *path, const uint8_t *d, IdxHeader *h) {
  uint64_t n = 1;
  for (int i = 0; i < h->ndim; i++) {
    uint32_t v =
        (uint32_t)d[4 * i] << 24 | (uint32_t)d[4 * i + 1] << 16 | (uint32_t)d[4 * i + 2] << 8 | d[4 * i + 3];
    h->shape[i] = v;
    if (__builtin_mul_overflow(n, (uint64_t)v, &n) || n > (UINT64_C(1) << 48))
      return tg_set_error(TG_ERR_IO, "%s: %s: dimensions overflow (dim %d = %u makes the tensor too large)",
                          fn, path, i, v),
             false;
  }
  h->numel = n;
  h->nbytes = n * tg_dtype_itemsize(h->dt);
  return true;
}

/* Converts the big-endian elements in place and wraps them in a tensor. */
static tg_tensor idx_tensor(const IdxHeader *h, uint8_t *data) {
  size_t isz = tg_dtype_itemsize(h->dt);
  if (isz > 1)
    for (uint64_t i = 0; i < h->numel; i++) {
      uint8_t *p = data + i * isz;
      for (size_t j = 0; j < isz / 2; j++) {
        uint8_t t = p[j];
        p[j] = p[isz - 1 - j];
        p[isz - 1 - j] = t;
      }
    }
  return tg_from_data(data, h->shape, h->ndim, &(const tg_opts){.dtype = h->dt});
}

tg_tensor idx_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len) {
  IdxHeader h;
  if (len < 4)
    return tg_set_error(TG_ERR_IO, "%s: %s: truncated IDX header (%zu bytes)", fn, path, len), NONE;
  if (!idx_magic(fn, path, data, &h)) return NONE;
  size_t hl = 4 + 4 * (size_t)h.ndim;
  if (len < hl)
    return tg_set_error(TG_ERR_IO, "%s: %s: truncated IDX header (%d dims need %zu bytes, file has %zu)", fn,
                        path, h.ndim, hl, len),
           NONE;
  if (!idx_dims(fn, path, data + 4, &h)) return NONE;
  if (len - hl != h.nbytes)
    return tg_set_error(TG_ERR_IO,
                        "%s: %s: the header declares %" PRIu64 " bytes of data but the file has %zu", fn,
                        path, h.nbytes, len - hl),
           NONE;
  uint8_t *buf = malloc(h.nbytes ? (size_t)h.nbytes : 1);
  if (!buf)
    return tg_set_error(TG_ERR_IO, "%s: %s: out of memory (%" PRIu64 " bytes)", fn, path, h.nbytes), NONE;
  if (h.nbytes) memcpy(buf, data + hl, (size_t)h.nbytes);
  tg_tensor t = idx_tensor(&h, buf);
  free(buf);
  return t;
}

/* Reads up to n bytes; returns the count (short only at end of file) or -1 on a read/inflate error. */
static int64_t gz_read_full(gzFile g, uint8_t *dst, uint64_t n) {
  uint64_t got = 0;
  while (got < n) {
    unsigned k = n - got > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
    int r = gzread(g, dst + got, k);
    if (r < 0) return -1;
    if (r == 0) break;
    got += (unsigned)r;
  }
  return (int64_t)got;
}

/* Reports a read error: the OS's for I/O failures, zlib's for bad data (without the "<fd:3>: " it
 * prefixes for a stream opened with gzdopen: the message names the path instead). */
static tg_tensor gz_fail(gzFile g, const char *fn, const char *path) {
  int err = 0;
  const char *m = gzerror(g, &err);
  const char *end = m && strncmp(m, "<fd:", 4) == 0 ? strstr(m, ">: ") : NULL;
  if (end) m = end + 3;
  if (err == Z_ERRNO)
    tg_set_error(TG_ERR_IO, "%s: %s: cannot read: %s", fn, path, strerror(errno));
  else if (err == Z_BUF_ERROR)
    tg_set_error(TG_ERR_IO, "%s: %s: truncated gzip stream", fn, path);
  else
    tg_set_error(TG_ERR_IO, "%s: %s: corrupt data: %s", fn, path, m && *m ? m : "read error");
  return NONE;
}

tg_tensor tg_idx_load(const char *path) {
  static const char *fn = "tg_idx_load";
  if (!path) return tg_set_error(TG_ERR_INVALID, "%s: path is NULL", fn), NONE;
  struct stat st;
  int fd = open_regular(fn, path, &st);
  if (fd < 0) return NONE;
  gzFile g = gzdopen(fd, "rb"); /* owns fd from here on (gzclose closes it) */
  if (!g) {
    close(fd);
    return tg_set_error(TG_ERR_IO, "%s: %s: cannot open: out of memory", fn, path), NONE;
  }
  gzbuffer(g, 1 << 17);
  IdxHeader h;
  uint8_t head[4 + 4 * IDX_MAX_NDIM];
  uint8_t *buf = NULL;
  tg_tensor t = NONE;
  int64_t r = gz_read_full(g, head, 4);
  if (r < 0) {
    gz_fail(g, fn, path);
    goto out;
  }
  if (r < 4) {
    tg_set_error(TG_ERR_IO, "%s: %s: truncated IDX header (%" PRId64 " bytes)", fn, path, r);
    goto out;
  }
  if (!idx_magic(fn, path, head, &h)) goto out;
  r = gz_read_full(g, head + 4, 4 * (uint64_t)h.ndim);
  if (r < 0) {
    gz_fail(g, fn, path);
    goto out;
  }
  if (r < 4 * h.ndim) {
    tg_set_error(TG_ERR_IO, "%s: %s: truncated IDX header (%d dims need %d bytes)", fn, path, h.ndim,
                 4 + 4 * h.ndim);
    goto out;
  }
  if (!idx_dims(fn, path, head + 4, &h)) goto out;
  uint64_t hl = 4 + 4 * (uint64_t)h.ndim;
  bool plain = gzdirect(g);
  if (plain && (uint64_t)st.st_size - hl != h.nbytes) {
    tg_set_error(TG_ERR_IO, "%s: %s: the header declares %" PRIu64 " bytes of data but the file has %" PRIu64,
                 fn, path, h.nbytes, (uint64_t)st.st_size - hl);
    goto out;
  }
  /* grow with the data actually read: a compressed file's header can't make us allocate more */
  uint64_t cap = h.nbytes < (1u << 20) || plain ? h.nbytes : (1u << 20), got = 0;
  buf = malloc(cap ? (size_t)cap : 1);
  if (!buf) {
    tg_set_error(TG_ERR_IO, "%s: %s: out of memory (%" PRIu64 " bytes)", fn, path, cap);
    goto out;
  }
  for (;;) {
    r = gz_read_full(g, buf + got, cap - got);
    if (r < 0) {
      gz_fail(g, fn, path);
      goto out;
    }
    got += (uint64_t)r;
    if (got < cap || cap == h.nbytes) break;
    cap = cap * 2 < h.nbytes ? cap * 2 : h.nbytes;
    uint8_t *nb = realloc(buf, (size_t)cap);
    if (!nb) {
      tg_set_error(TG_ERR_IO, "%s: %s: out of memory (%" PRIu64 " bytes)", fn, path, cap);
      goto out;
    }
    buf = nb;
  }
  if (got < h.nbytes) {
    tg_set_error(TG_ERR_IO,
                 "%s: %s: truncated: the header declares %" PRIu64 " bytes of data, the file has %" PRIu64,
                 fn, path, h.nbytes, got);
    goto out;
  }
  uint8_t extra;
  r = gz_read_full(g, &extra, 1); /* also makes zlib check the gzip trailer (CRC and length) */
  if (r < 0) {
    gz_fail(g, fn, path);
    goto out;
  }
  if (r > 0) {
    tg_set_error(TG_ERR_IO, "%s: %s: data continues past the %" PRIu64 " bytes the header declares", fn, path,
                 h.nbytes);
    goto out;
  }
  int zerr = Z_OK;
  gzerror(g, &zerr);
  if (zerr != Z_OK) { /* gzread reports a stream cut short (even in its trailer) only here */
    gz_fail(g, fn, path);
    goto out;
  }
  t = idx_tensor(&h, buf);
out:
  free(buf);
  gzclose(g);
  return t;
}

/* ---- MNIST ------------------------------------------------------------------------------------- */

#define FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* dir/name or dir/name.gz, whichever exists (malloc'd), or NULL with an error. */
static char *find_file(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 8;
  char *p = tg_xmalloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  if (access(p, R_OK) == 0) return p;
  snprintf(p, n, "%s/%s.gz", dir, name);
  if (access(p, R_OK) == 0) return p;
  free(p);
  tg_set_error(TG_ERR_IO, "tg_mnist_load: %s: no %s or %s.gz in this directory", dir, name, name);
  return NULL;
}

static tg_tensor load_part(const char *dir, const char *name, int want_ndim) {
  char *p = find_file(dir, name);
  if (!p) return NONE;
  tg_tensor t = tg_idx_load(p);
  if (t.id && (tg_dtype_of(t) != TG_UINT8 || tg_ndim(t) != want_ndim)) {
    tg_set_error(TG_ERR_IO, "tg_mnist_load: %s: expected %s, got %d dims of %s", p,
                 want_ndim == 3 ? "(N, H, W) uint8 images" : "(N,) uint8 labels", tg_ndim(t),
                 tg_dtype_name(tg_dtype_of(t)));
    tg_free(t);
    t = NONE;
  }
  free(p);
  return t;
}

tg_status tg_mnist_load(const char *dir, bool fashion, tg_tensor *X_train, tg_tensor *Y_train,
                        tg_tensor *X_test, tg_tensor *Y_test) {
  tg_tensor *outs[4] = {X_train, Y_train, X_test, Y_test};
  for (int i = 0; i < 4; i++)
    if (outs[i]) *outs[i] = NONE;
  for (int i = 0; i < 4; i++)
    if (!outs[i]) return tg_set_error(TG_ERR_INVALID, "tg_mnist_load: output pointer %d is NULL", i + 1);
  if (!dir) {
    if (!fashion)
      return tg_set_error(TG_ERR_INVALID,
                          "tg_mnist_load: the original MNIST is not packaged: pass the directory holding "
                          "train-images-idx3-ubyte[.gz] and the other three files (or fashion = true)");
    struct stat st;
    if (stat(FASHION_MNIST_DIR, &st) != 0 || !S_ISDIR(st.st_mode))
      return tg_set_error(TG_ERR_IO,
                          "tg_mnist_load: %s not found: install Fashion-MNIST with "
                          "`apt-get install dataset-fashion-mnist` (or pass a directory)",
                          FASHION_MNIST_DIR);
    dir = FASHION_MNIST_DIR;
  }
  static const char *names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  tg_tensor t[4] = {NONE, NONE, NONE, NONE};
  tg_status st = TG_OK;
  for (int i = 0; i < 4 && st == TG_OK; i++) {
    t[i] = load_part(dir, names[i], i % 2 == 0 ? 3 : 1);
    if (!t[i].id) st = tg_last_status() ? tg_last_status() : TG_ERR_IO;
  }
  for (int i = 0; i < 4 && st == TG_OK; i += 2) {
    if (tg_dim(t[i], 0) != tg_dim(t[i + 1], 0)) {
      st = tg_set_error(TG_ERR_IO,
                        "tg_mnist_load: %s: %s has %" PRId64 " images but %s has %" PRId64 " labels", dir,
                        names[i], tg_dim(t[i], 0), names[i + 1], tg_dim(t[i + 1], 0));
    }
  }
  for (int i = 0; i < 4 && st == TG_OK; i += 2) { /* (N, H, W) -> (N, 1, H, W) */
    int64_t shape[4] = {tg_dim(t[i], 0), 1, tg_dim(t[i], 1), tg_dim(t[i], 2)};
    tg_tensor r = tg_reshape(t[i], shape, 4);
    tg_free(t[i]);
    t[i] = r;
    if (!r.id) st = tg_last_status() ? tg_last_status() : TG_ERR_IO;
  }
  for (int i = 0; i < 4; i++) {
    if (st == TG_OK)
      *outs[i] = t[i];
    else
      tg_free(t[i]);
  }
  return st;
}
