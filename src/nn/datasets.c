/*
 * datasets.c -- IDX files (the MNIST format) and tinygrad's nn.datasets.mnist().
 *
 * In: an IDX file (a regular file: a FIFO or a device is refused unread), plain or gzip-compressed
 * (one or more gzip members; nothing may follow the last): bytes 00 00 <type> <ndim>, ndim big-endian uint32 dims, then numel
 * elements of the type, big-endian. Out: a realized tensor of the matching dtype, elements converted
 * to host order.
 * Invariants: the header is validated before anything is allocated from it (known type, ndim <= 64,
 * numel without overflow); a plain file's size must equal what the header declares; a compressed
 * file's buffer grows only with the bytes really inflated, so a lying header costs no more memory than
 * the data that is there; data beyond the declared size is an error.
 *
 * CIFAR-10 (tg_cifar_load) reads either published version -- the binary batches (3073-byte records)
 * or the python ones (pickled dicts of a numpy array and a label list, read by torch_load.c's
 * unpickler, which executes nothing) -- from the tarball (tar.c; gzip inflated in memory) or an
 * extracted directory. Every batch is checked whole (record size, array shape and dtype, label
 * count and range) before any tensor is made.
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
  uint64_t n = 1, nonzero = 1; /* a zero dimension does not excuse the others (tg_from_data's rule) */
  for (int i = 0; i < h->ndim; i++) {
    uint32_t v =
        (uint32_t)d[4 * i] << 24 | (uint32_t)d[4 * i + 1] << 16 | (uint32_t)d[4 * i + 2] << 8 | d[4 * i + 3];
    h->shape[i] = v;
    if ((v && __builtin_mul_overflow(nonzero, (uint64_t)v, &nonzero)) || nonzero > (UINT64_C(1) << 48))
      return tg_set_error(TG_ERR_IO,
                          "%s: %s: dimensions overflow (dim %d = %u: the non-zero dimensions multiply past 2^48)",
                          fn, path, i, v),
             false;
    n *= v;
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

/* The file, read with read(2) (never mapped: a file that shrinks while it is read is an error, not a
 * crash): plain bytes, or one or more gzip members back to back (what `cat a.gz b.gz` makes), inflated
 * with zlib. Bytes after the last member that do not start another are an error, as gzip -t says. */
typedef struct {
  const char *fn, *path;
  int fd;
  bool gz, raw_eof, end; /* end: the last member is complete and nothing follows */
  z_stream z;
  uint8_t in[1 << 16];
  size_t in_pos, in_len; /* buffered raw bytes (plain files: the sniffed start) */
  uint64_t raw_off;      /* bytes read from the file so far */
} IdxReader;

/* More raw bytes into in[] (keeping the unread ones); false on an I/O error (recorded). */
static bool rd_fill(IdxReader *r) {
  if (r->in_pos) {
    memmove(r->in, r->in + r->in_pos, r->in_len - r->in_pos);
    r->in_len -= r->in_pos;
    r->in_pos = 0;
  }
  while (r->in_len < sizeof r->in && !r->raw_eof) {
    ssize_t k = read(r->fd, r->in + r->in_len, sizeof r->in - r->in_len);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return tg_set_error(TG_ERR_IO, "%s: %s: cannot read: %s", r->fn, r->path, strerror(errno)), false;
    if (k == 0) r->raw_eof = true;
    r->in_len += (size_t)k;
    r->raw_off += (uint64_t)k;
    break;
  }
  return true;
}

static bool rd_open(IdxReader *r, const char *fn, const char *path, int fd) {
  memset(r, 0, sizeof *r);
  r->fn = fn;
  r->path = path;
  r->fd = fd;
  while (r->in_len < 2 && !r->raw_eof)
    if (!rd_fill(r)) return false;
  r->gz = r->in_len >= 2 && r->in[0] == 0x1f && r->in[1] == 0x8b;
  if (r->gz && inflateInit2(&r->z, 16 + MAX_WBITS) != Z_OK) {
    r->gz = false;
    return tg_set_error(TG_ERR_IO, "%s: %s: cannot start zlib: out of memory", fn, path), false;
  }
  return true;
}

static void rd_close(IdxReader *r) {
  if (r->gz) inflateEnd(&r->z);
}

/* Up to n bytes into dst: the count (short only at the end of the data) or -1 with an error. */
static int64_t rd_read(IdxReader *r, uint8_t *dst, uint64_t n) {
  uint64_t got = 0;
  if (!r->gz) {
    size_t k = r->in_len - r->in_pos < n ? r->in_len - r->in_pos : (size_t)n;
    memcpy(dst, r->in + r->in_pos, k);
    r->in_pos += k;
    got = k;
    while (got < n && !r->raw_eof) {
      size_t want = n - got > (1u << 30) ? (1u << 30) : (size_t)(n - got);
      ssize_t m = read(r->fd, dst + got, want);
      if (m < 0 && errno == EINTR) continue;
      if (m < 0) return tg_set_error(TG_ERR_IO, "%s: %s: cannot read: %s", r->fn, r->path, strerror(errno)), -1;
      if (m == 0) r->raw_eof = true;
      got += (uint64_t)m;
    }
    return (int64_t)got;
  }
  while (got < n && !r->end) {
    if (r->in_pos == r->in_len && !r->raw_eof && !rd_fill(r)) return -1;
    uInt ia = (uInt)(r->in_len - r->in_pos);
    uInt oa = n - got > (1u << 30) ? (1u << 30) : (uInt)(n - got);
    r->z.next_in = r->in + r->in_pos;
    r->z.avail_in = ia;
    r->z.next_out = dst + got;
    r->z.avail_out = oa;
    int rc = inflate(&r->z, Z_NO_FLUSH);
    r->in_pos += ia - r->z.avail_in;
    got += oa - r->z.avail_out;
    if (rc == Z_STREAM_END) { /* another member, or the end; anything else is garbage */
      while (r->in_len - r->in_pos < 2 && !r->raw_eof)
        if (!rd_fill(r)) return -1;
      size_t left = r->in_len - r->in_pos;
      if (left == 0) {
        r->end = true;
      } else if (left >= 2 && r->in[r->in_pos] == 0x1f && r->in[r->in_pos + 1] == 0x8b) {
        inflateReset(&r->z);
      } else {
        uint64_t at = r->raw_off - left;
        return tg_set_error(TG_ERR_IO,
                            "%s: %s: %s after the gzip stream at byte %" PRIu64
                            " (not another gzip member): a corrupt file?",
                            r->fn, r->path, left == 1 && r->raw_eof ? "a stray byte" : "garbage", at),
               -1;
      }
    } else if (rc == Z_BUF_ERROR || (rc == Z_OK && ia == 0 && r->raw_eof)) {
      if (r->raw_eof && r->in_pos == r->in_len)
        return tg_set_error(TG_ERR_IO, "%s: %s: truncated gzip stream", r->fn, r->path), -1;
    } else if (rc != Z_OK) {
      return tg_set_error(TG_ERR_IO, "%s: %s: corrupt data: %s", r->fn, r->path,
                          rc == Z_MEM_ERROR ? "out of memory" : r->z.msg ? r->z.msg : "inflate error"),
             -1;
    }
  }
  return (int64_t)got;
}

tg_tensor tg_idx_load(const char *path) {
  static const char *fn = "tg_idx_load";
  if (!path) return tg_set_error(TG_ERR_INVALID, "%s: path is NULL", fn), NONE;
  struct stat st;
  int fd = open_regular(fn, path, &st);
  if (fd < 0) return NONE;
  if (io_test_hook) io_test_hook(path, 0);
  IdxReader *rd = malloc(sizeof *rd);
  if (!rd) {
    close(fd);
    return tg_set_error(TG_ERR_IO, "%s: %s: cannot open: out of memory", fn, path), NONE;
  }
  IdxHeader h;
  uint8_t head[4 + 4 * IDX_MAX_NDIM];
  uint8_t *buf = NULL;
  tg_tensor t = NONE;
  if (!rd_open(rd, fn, path, fd)) goto out;
  int64_t r = rd_read(rd, head, 4);
  if (r < 0) goto out;
  if (r < 4) {
    tg_set_error(TG_ERR_IO, "%s: %s: truncated IDX header (%" PRId64 " bytes)", fn, path, r);
    goto out;
  }
  if (!idx_magic(fn, path, head, &h)) goto out;
  r = rd_read(rd, head + 4, 4 * (uint64_t)h.ndim);
  if (r < 0) goto out;
  if (r < 4 * h.ndim) {
    tg_set_error(TG_ERR_IO, "%s: %s: truncated IDX header (%d dims need %d bytes)", fn, path, h.ndim,
                 4 + 4 * h.ndim);
    goto out;
  }
  if (!idx_dims(fn, path, head + 4, &h)) goto out;
  uint64_t hl = 4 + 4 * (uint64_t)h.ndim;
  bool plain = !rd->gz;
  if (plain && (uint64_t)st.st_size - hl != h.nbytes) {
    tg_set_error(TG_ERR_IO, "%s: %s: the header declares %" PRIu64 " bytes of data but the file has %" PRIu64,
                 fn, path, h.nbytes, (uint64_t)st.st_size - hl);
    goto out;
  }
  /* grow with the data actually inflated: a compressed file's header can't make us allocate more,
   * and inflating stops one byte past the declared size */
  uint64_t cap = h.nbytes < (1u << 20) || plain ? h.nbytes : (1u << 20), got = 0;
  buf = malloc(cap ? (size_t)cap : 1);
  if (!buf) {
    tg_set_error(TG_ERR_IO, "%s: %s: out of memory (%" PRIu64 " bytes)", fn, path, cap);
    goto out;
  }
  for (;;) {
    r = rd_read(rd, buf + got, cap - got);
    if (r < 0) goto out;
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
                 "%s: %s: truncated: the header declares %" PRIu64 " bytes of data, the file has %" PRIu64
                 " (changed while it was read?)",
                 fn, path, h.nbytes, got);
    goto out;
  }
  uint8_t extra;
  r = rd_read(rd, &extra, 1); /* also makes zlib check the gzip trailer (CRC and length) and what follows */
  if (r < 0) goto out;
  if (r > 0) {
    tg_set_error(TG_ERR_IO, "%s: %s: data continues past the %" PRIu64 " bytes the header declares", fn, path,
                 h.nbytes);
    goto out;
  }
  t = idx_tensor(&h, buf);
out:
  free(buf);
  rd_close(rd);
  free(rd);
  close(fd);
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
  /* MNIST's labels are digits (Fashion-MNIST's ten classes): a file holding another value is not
   * MNIST, and a label past the classifier's outputs would train silently to a loss of 0 */
  for (int i = 1; i < 4 && st == TG_OK; i += 2) {
    int64_t n = tg_numel(t[i]);
    uint8_t *lab = tg_xmalloc((size_t)(n ? n : 1));
    st = tg_data(t[i], lab, (size_t)n);
    for (int64_t j = 0; j < n && st == TG_OK; j++)
      if (lab[j] > 9)
        st = tg_set_error(TG_ERR_IO, "tg_mnist_load: %s: %s: label %d at index %" PRId64 " is not a class 0..9 (not an MNIST label file)",
                          dir, names[i], lab[j], j);
    free(lab);
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

/* ---- CIFAR-10 ---------------------------------------------------------------------------------- */

#define CIFAR_FN "tg_cifar_load"
#define CIFAR_PIXELS 3072                /* 3 x 32 x 32 bytes per image */
#define CIFAR_RECORD (1 + CIFAR_PIXELS)  /* the binary version: a label byte, then the pixels */
#define CIFAR_MAX_INFLATED ((size_t)1 << 31) /* the tarballs inflate to about 180 MB */

/* The batches in order: five training batches, then the test batch. */
static void cifar_member(char *buf, size_t cap, int i, bool bin) {
  if (i < 5) snprintf(buf, cap, "data_batch_%d%s", i + 1, bin ? ".bin" : "");
  else snprintf(buf, cap, "test_batch%s", bin ? ".bin" : "");
}

/* The images and labels read so far, for one split. */
typedef struct {
  uint8_t *px, *lab;
  size_t n, cap;
} CifarSplit;

static void split_add(CifarSplit *s, const uint8_t *px, const uint8_t *lab, size_t n, size_t lab_stride,
                      size_t px_stride) {
  if (s->n + n > s->cap) {
    size_t nc = s->cap ? s->cap : 1024;
    while (nc < s->n + n) nc *= 2;
    s->px = tg_xrealloc(s->px, nc * CIFAR_PIXELS);
    s->lab = tg_xrealloc(s->lab, nc);
    s->cap = nc;
  }
  for (size_t i = 0; i < n; i++) {
    memcpy(s->px + (s->n + i) * CIFAR_PIXELS, px + i * px_stride, CIFAR_PIXELS);
    s->lab[s->n + i] = lab[i * lab_stride];
  }
  s->n += n;
}

/* One batch of the binary version: whole 3073-byte records, labels 0..9. */
static bool cifar_bin_batch(const char *name, const uint8_t *d, size_t len, CifarSplit *s) {
  if (len % CIFAR_RECORD)
    return tg_set_error(TG_ERR_IO,
                        CIFAR_FN ": %s: %zu bytes is not a whole number of %d-byte records (a label byte and "
                                 "3072 pixels each): truncated or not CIFAR-10?",
                        name, len, CIFAR_RECORD),
           false;
  size_t n = len / CIFAR_RECORD;
  for (size_t i = 0; i < n; i++)
    if (d[i * CIFAR_RECORD] > 9)
      return tg_set_error(TG_ERR_IO, CIFAR_FN ": %s: record %zu has label %d, not a CIFAR-10 class (0..9)", name, i,
                          d[i * CIFAR_RECORD]),
             false;
  split_add(s, d + 1, d, n, CIFAR_RECORD, CIFAR_RECORD);
  return true;
}

/* One batch of the python version: a pickled dict whose b'data' is a (N, 3072) uint8 numpy array and
 * b'labels' a list of N ints 0..9. */
static bool cifar_py_batch(const char *name, const uint8_t *d, size_t len, CifarSplit *s) {
  PickleField f[2] = {{.key = "data", .want_array = true}, {.key = "labels", .want_array = false}};
  if (!pickle_fields_mem(CIFAR_FN, name, d, len, f, 2)) return false;
  bool ok = false;
  if (strcmp(f[0].dtype, "u1") || f[0].ndim != 2 || f[0].shape[1] != CIFAR_PIXELS)
    tg_set_error(TG_ERR_IO, CIFAR_FN ": %s: 'data' is a %d-d numpy array of '%s', not (N, 3072) uint8", name,
                 f[0].ndim, f[0].dtype);
  else if ((uint64_t)f[0].shape[0] != f[1].nints)
    tg_set_error(TG_ERR_IO, CIFAR_FN ": %s: 'data' has %" PRId64 " images but 'labels' %zu labels", name,
                 f[0].shape[0], f[1].nints);
  else {
    uint8_t *lab = tg_xmalloc(f[1].nints ? f[1].nints : 1);
    ok = true;
    for (size_t i = 0; i < f[1].nints && ok; i++) {
      if (f[1].ints[i] < 0 || f[1].ints[i] > 9)
        ok = false, tg_set_error(TG_ERR_IO, CIFAR_FN ": %s: label %zu is %" PRId64 ", not a CIFAR-10 class (0..9)",
                                 name, i, f[1].ints[i]);
      else
        lab[i] = (uint8_t)f[1].ints[i];
    }
    if (ok) split_add(s, f[0].data, lab, f[1].nints, 1, CIFAR_PIXELS);
    free(lab);
  }
  pickle_fields_free(f, 2);
  return ok;
}

/* The whole file at path into a malloc'd buffer: plain bytes, or a gzip stream of one or more members
 * inflated (IdxReader: the same checks of truncation and of what follows the last member), at most
 * CIFAR_MAX_INFLATED bytes. */
static bool cifar_read(const char *path, uint8_t **out, size_t *outlen) {
  struct stat st;
  int fd = open_regular(CIFAR_FN, path, &st);
  if (fd < 0) return false;
  IdxReader *rd = malloc(sizeof *rd);
  uint8_t *buf = NULL;
  bool ok = false;
  if (!rd) {
    tg_set_error(TG_ERR_IO, CIFAR_FN ": %s: cannot open: out of memory", path);
    close(fd);
    return false;
  }
  if (rd_open(rd, CIFAR_FN, path, fd)) {
    size_t cap = rd->gz ? (size_t)1 << 20 : (size_t)st.st_size + 1, got = 0;
    buf = tg_xmalloc(cap);
    for (;;) {
      int64_t r = rd_read(rd, buf + got, cap - got);
      if (r < 0) break;
      got += (size_t)r;
      if (got < cap) {
        ok = true;
        break;
      }
      if (rd->gz && cap >= CIFAR_MAX_INFLATED) {
        tg_set_error(TG_ERR_IO, CIFAR_FN ": %s: inflates past 2 GiB: not a CIFAR-10 archive", path);
        break;
      }
      cap = rd->gz && cap * 2 > CIFAR_MAX_INFLATED ? CIFAR_MAX_INFLATED : cap * 2;
      buf = tg_xrealloc(buf, cap);
    }
    *outlen = got;
  }
  rd_close(rd);
  free(rd);
  close(fd);
  if (!ok) free(buf), buf = NULL;
  *out = buf;
  return ok;
}

/* The batches of an archive (tar or tar.gz) at path, into the two splits. */
static bool cifar_archive(const char *path, CifarSplit *sp) {
  uint8_t *tarb;
  size_t tarn;
  if (!cifar_read(path, &tarb, &tarn)) return false;
  tg_state_dict *sd = tarn ? tar_extract_mem(CIFAR_FN, path, tarb, tarn) : NULL;
  if (!tarn) tg_set_error(TG_ERR_IO, CIFAR_FN ": %s: the file is empty", path);
  free(tarb);
  if (!sd) return false;
  /* which version: the binary batches' directory, else the python one's (members also taken at the
   * top level of the archive) */
  static const char *dirs[4] = {"cifar-10-batches-bin/", "cifar-10-batches-py/", "", ""};
  char name[128];
  int which = -1;
  for (int k = 0; k < 4 && which < 0; k++) {
    snprintf(name, sizeof name, "%s%s", dirs[k], k % 2 == 0 ? "data_batch_1.bin" : "data_batch_1");
    if (sd_get_quiet(sd, name).id) which = k;
  }
  bool ok = which >= 0;
  if (!ok)
    tg_set_error(TG_ERR_IO,
                 CIFAR_FN ": %s: no cifar-10-batches-bin/data_batch_1.bin or cifar-10-batches-py/data_batch_1 in "
                          "the archive: not cifar-10-binary.tar.gz or cifar-10-python.tar.gz",
                 path);
  bool bin = which % 2 == 0;
  for (int i = 0; i < 6 && ok; i++) {
    char member[64];
    cifar_member(member, sizeof member, i, bin);
    snprintf(name, sizeof name, "%s%s", dirs[which], member);
    tg_tensor t = sd_get_quiet(sd, name);
    char label[4200];
    snprintf(label, sizeof label, "%s: %s", path, name);
    if (!t.id) {
      ok = false;
      tg_set_error(TG_ERR_IO, CIFAR_FN ": %s: the archive has no %s", path, name);
      break;
    }
    size_t n = (size_t)tg_numel(t);
    uint8_t *b = tg_xmalloc(n ? n : 1);
    ok = tg_data(t, b, n) == TG_OK;
    if (ok) ok = bin ? cifar_bin_batch(label, b, n, &sp[i == 5]) : cifar_py_batch(label, b, n, &sp[i == 5]);
    free(b);
  }
  tg_state_dict_free(sd);
  return ok;
}

/* The batches of an extracted directory: dir itself, or its cifar-10-batches-bin / -py subdirectory. */
static bool cifar_dir(const char *dir, CifarSplit *sp) {
  static const char *subs[4] = {"", "", "/cifar-10-batches-bin", "/cifar-10-batches-py"};
  size_t cap = strlen(dir) + 64;
  char *p = tg_xmalloc(cap);
  int which = -1;
  for (int k = 0; k < 4 && which < 0; k++) {
    snprintf(p, cap, "%s%s/%s", dir, subs[k], k % 2 == 0 ? "data_batch_1.bin" : "data_batch_1");
    if (access(p, F_OK) == 0) which = k;
  }
  if (which < 0) {
    free(p);
    return tg_set_error(TG_ERR_IO,
                        CIFAR_FN ": %s: no data_batch_1.bin or data_batch_1 here or in cifar-10-batches-bin/ or "
                                 "cifar-10-batches-py/ (extract cifar-10-binary.tar.gz or cifar-10-python.tar.gz, or "
                                 "pass the tarball)",
                        dir),
           false;
  }
  bool bin = which % 2 == 0, ok = true;
  for (int i = 0; i < 6 && ok; i++) {
    char member[64];
    cifar_member(member, sizeof member, i, bin);
    snprintf(p, cap, "%s%s/%s", dir, subs[which], member);
    FileView fv;
    if (file_view_open(&fv, CIFAR_FN, p, false) != TG_OK) {
      ok = false;
      break;
    }
    ok = bin ? cifar_bin_batch(p, fv.data, fv.len, &sp[i == 5]) : cifar_py_batch(p, fv.data, fv.len, &sp[i == 5]);
    file_view_close(&fv);
  }
  free(p);
  return ok;
}

tg_status tg_cifar_load(const char *path, const char *device, tg_tensor *X_train, tg_tensor *Y_train,
                        tg_tensor *X_test, tg_tensor *Y_test) {
  tg_tensor *outs[4] = {X_train, Y_train, X_test, Y_test};
  for (int i = 0; i < 4; i++)
    if (outs[i]) *outs[i] = NONE;
  for (int i = 0; i < 4; i++)
    if (!outs[i]) return tg_set_error(TG_ERR_INVALID, CIFAR_FN ": output pointer %d is NULL", i + 1);
  if (!path)
    return tg_set_error(TG_ERR_INVALID, CIFAR_FN ": CIFAR-10 is not packaged: pass cifar-10-python.tar.gz, "
                                        "cifar-10-binary.tar.gz or a directory extracted from either");
  struct stat st;
  if (stat(path, &st) != 0) return tg_set_error(TG_ERR_IO, CIFAR_FN ": %s: cannot open: %s", path, strerror(errno));
  CifarSplit sp[2] = {{0}, {0}};
  bool ok = S_ISDIR(st.st_mode) ? cifar_dir(path, sp) : cifar_archive(path, sp);
  tg_status rc = TG_OK;
  if (!ok) rc = tg_last_status() ? tg_last_status() : TG_ERR_IO;
  tg_tensor t[4] = {NONE, NONE, NONE, NONE};
  tg_opts o = {.dtype = TG_UINT8, .device = device, .requires_grad = TG_GRAD_UNSET};
  for (int i = 0; i < 2 && rc == TG_OK; i++) {
    int64_t n = (int64_t)sp[i].n;
    static const uint8_t empty[1];
    t[2 * i] = tg_from_data(n ? sp[i].px : empty, (const int64_t[]){n, 3, 32, 32}, 4, &o);
    t[2 * i + 1] = tg_from_data(n ? sp[i].lab : empty, (const int64_t[]){n}, 1, &o);
    if (!t[2 * i].id || !t[2 * i + 1].id) rc = tg_last_status() ? tg_last_status() : TG_ERR_IO;
  }
  for (int i = 0; i < 2; i++) free(sp[i].px), free(sp[i].lab);
  for (int i = 0; i < 4; i++) {
    if (rc == TG_OK) *outs[i] = t[i];
    else tg_free(t[i]);
  }
  return rc;
}
