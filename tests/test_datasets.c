/*
 * test_datasets.c -- tg_idx_load and tg_mnist_load.
 *
 *  - IDX round trips of hand-written files for every IDX type (u8, i8, i16, i32, f32, f64), plain
 *    and gzip-compressed, including 0-d and zero-size shapes; values must come back exactly.
 *  - Hostile files: every truncation (plain and gz), trailing data, bad magic, unknown type, too many
 *    dims, dims whose product overflows, a header declaring far more data than there is (no big
 *    allocation), corrupt gzip streams; missing paths and directories. Every error names the function
 *    and the file.
 *  - tg_mnist_load: Fashion-MNIST from Debian's dataset-fashion-mnist (shapes, dtypes, label counts,
 *    pixel sums computed once with Python), a directory of small hand-written files (plain and .gz),
 *    and its errors.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "test.h"
#include "tinygrad.h"


static void write_file(const char *path, const void *data, size_t n, bool gz) {
  if (gz) {
    gzFile g = gzopen(path, "wb");
    if (!g || (n && gzwrite(g, data, (unsigned)n) != (int)n) || gzclose(g) != Z_OK) {
      fprintf(stderr, "cannot write %s\n", path);
      exit(2);
    }
    return;
  }
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
}


/* An IDX image: header + big-endian elements (host values in `vals`, itemsize isz). */
static size_t make_idx(uint8_t *out, uint8_t type, int ndim, const uint32_t *dims, const void *vals,
                       size_t isz, size_t numel) {
  size_t o = 0;
  out[o++] = 0;
  out[o++] = 0;
  out[o++] = type;
  out[o++] = (uint8_t)ndim;
  for (int i = 0; i < ndim; i++) {
    out[o++] = (uint8_t)(dims[i] >> 24);
    out[o++] = (uint8_t)(dims[i] >> 16);
    out[o++] = (uint8_t)(dims[i] >> 8);
    out[o++] = (uint8_t)dims[i];
  }
  const uint8_t *v = vals;
  for (size_t e = 0; e < numel; e++)
    for (size_t j = 0; j < isz; j++) out[o++] = v[e * isz + (isz - 1 - j)]; /* host little-endian -> big */
  return o;
}

/* Loading must fail with a message naming tg_idx_load, the path and `phrase`; no handle may leak. */
static void expect_idx_fail(const char *path, const char *phrase, int line) {
  size_t live = tg_live_count();
  tg_clear_error();
  tg_tensor t = tg_idx_load(path);
  if (t.id) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL line %d: loading %s succeeded (expected \"%s\")\n", line, path, phrase);
    tg_free(t);
    return;
  }
  const char *e = tg_last_error();
  if (!e || !strstr(e, "tg_idx_load") || (path && !strstr(e, path)) || !strstr(e, phrase)) {
    tt_failed_checks++;
    fprintf(stderr, "  FAIL line %d: error \"%s\" lacks tg_idx_load / the path / \"%s\"\n", line,
            e ? e : "(none)", phrase);
  }
  CHECK(tg_last_status() != TG_OK);
  CHECK(tg_live_count() == live);
  tg_clear_error();
}
#define EXPECT_IDX_FAIL(path, phrase) expect_idx_fail(path, phrase, __LINE__)

typedef struct {
  uint8_t code;
  tg_dtype dt;
  size_t isz;
} IdxType;
static const IdxType k_types[] = {{0x08, TG_UINT8, 1}, {0x09, TG_INT8, 1},    {0x0B, TG_INT16, 2},
                                  {0x0C, TG_INT32, 4}, {0x0D, TG_FLOAT32, 4}, {0x0E, TG_FLOAT64, 8}};

/* Values with every byte position significant (so a wrong byte order shows) and the extremes. */
static void fill_values(const IdxType *ty, void *vals, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double x = ((double)i - (double)n / 2) * 1234.567;
    switch (ty->dt) {
    case TG_UINT8:
      ((uint8_t *)vals)[i] = (uint8_t)(i * 37 + (i == 1 ? 255 : 0));
      break;
    case TG_INT8:
      ((int8_t *)vals)[i] = (int8_t)(i == 0 ? -128 : i == 1 ? 127 : (int)(i * 37 % 256) - 128);
      break;
    case TG_INT16:
      ((int16_t *)vals)[i] = (int16_t)(i == 0 ? -32768 : i == 1 ? 32767 : (int)(i * 4099 % 65536) - 32768);
      break;
    case TG_INT32:
      ((int32_t *)vals)[i] = i == 0 ? INT32_MIN : i == 1 ? INT32_MAX : (int32_t)(x * 1001);
      break;
    case TG_FLOAT32:
      ((float *)vals)[i] = i == 0 ? -INFINITY : i == 1 ? 1e-40f : (float)x;
      break;
    case TG_FLOAT64:
      ((double *)vals)[i] = i == 0 ? 1e300 : i == 1 ? -4.9e-324 : x / 3;
      break;
    default:
      break;
    }
  }
}

TEST(idx_round_trip_every_type_plain_and_gz) {
  const uint32_t dims[3] = {2, 3, 4};
  const int64_t shape[3] = {2, 3, 4};
  for (size_t k = 0; k < sizeof k_types / sizeof k_types[0]; k++) {
    const IdxType *ty = &k_types[k];
    uint8_t vals[24 * 8], file[16 + 24 * 8], back[24 * 8];
    fill_values(ty, vals, 24);
    size_t n = make_idx(file, ty->code, 3, dims, vals, ty->isz, 24);
    for (int gz = 0; gz < 2; gz++) {
      char name[64];
      snprintf(name, sizeof name, "rt_%02x%s", ty->code, gz ? ".gz" : "");
      const char *p = tpath(name);
      write_file(p, file, n, gz);
      tg_scope_begin();
      tg_tensor t = tg_idx_load(p);
      CHECK_MSG(t.id, "%s: %s", p, tg_last_error() ? tg_last_error() : "");
      if (t.id) {
        int64_t got[8];
        CHECK(tg_shape(t, got) == 3 && memcmp(got, shape, sizeof shape) == 0);
        CHECK_MSG(tg_dtype_of(t) == ty->dt, "type 0x%02x gave %s", ty->code, tg_dtype_name(tg_dtype_of(t)));
        CHECK(tg_is_realized(t));
        CHECK(tg_data(t, back, sizeof back) == TG_OK);
        CHECK_MSG(memcmp(back, vals, 24 * ty->isz) == 0, "type 0x%02x (%s) values differ", ty->code,
                  gz ? "gz" : "plain");
      }
      tg_scope_end();
    }
  }
  CHECK(tg_live_count() == 0);
}

TEST(idx_0d_and_empty) {
  uint8_t file[64];
  int32_t v = -123456789;
  size_t n = make_idx(file, 0x0C, 0, NULL, &v, 4, 1);
  const char *p = tpath("scalar.idx");
  write_file(p, file, n, false);
  tg_tensor t = tg_idx_load(p);
  CHECK(t.id && tg_ndim(t) == 0 && tg_dtype_of(t) == TG_INT32);
  int64_t iv = 0;
  CHECK(tg_item_i64(t, &iv) == TG_OK && iv == -123456789);
  tg_free(t);
  const uint32_t dims[2] = {0, 5};
  n = make_idx(file, 0x0D, 2, dims, NULL, 4, 0);
  p = tpath("empty.idx");
  write_file(p, file, n, true);
  t = tg_idx_load(p);
  CHECK(t.id && tg_ndim(t) == 2 && tg_dim(t, 0) == 0 && tg_dim(t, 1) == 5 && tg_dtype_of(t) == TG_FLOAT32);
  tg_free(t);
  CHECK(tg_live_count() == 0);
}

TEST(idx_every_truncation_and_trailing_data) {
  const uint32_t dims[2] = {3, 5};
  int16_t vals[15];
  for (int i = 0; i < 15; i++) vals[i] = (int16_t)(i * 1000 - 7000);
  uint8_t file[64], big[65];
  size_t n = make_idx(file, 0x0B, 2, dims, vals, 2, 15);
  for (int gz = 0; gz < 2; gz++) {
    for (size_t cut = 0; cut < n; cut++) {
      const char *p = tpath(gz ? "cut.gz" : "cut");
      write_file(p, file, cut, gz);
      EXPECT_IDX_FAIL(p, cut < 4 + 8 ? "truncated IDX header" : gz ? "truncated" : "declares");
    }
    memcpy(big, file, n);
    big[n] = 7;
    const char *p = tpath(gz ? "long.gz" : "long");
    write_file(p, big, n + 1, gz);
    EXPECT_IDX_FAIL(p, gz ? "data continues past" : "declares 30 bytes of data but the file has 31");
  }
  /* a truncated gzip stream (the compressed bytes themselves cut short) */
  write_file(tpath("whole.gz"), file, n, true);
  size_t zn = 0;
  uint8_t *z = tt_read_file(tpath("whole.gz"), &zn);
  if (!z) {
    CHECK(z != NULL);
    return;
  }
  for (size_t cut = 0; cut + 1 < zn; cut += 3) {
    write_file(tpath("zcut.gz"), z, cut, false);
    tg_clear_error();
    tg_tensor t = tg_idx_load(tpath("zcut.gz"));
    CHECK_MSG(!t.id, "a gzip stream cut to %zu of %zu bytes loaded", cut, zn);
    CHECK_STR_CONTAINS(tg_last_error(), "tg_idx_load");
    tg_free(t);
    tg_clear_error();
  }
  /* corrupt compressed data (CRC or inflate errors) */
  z[zn - 6] ^= 0x55; /* inside the CRC32 trailer */
  write_file(tpath("crc.gz"), z, zn, false);
  EXPECT_IDX_FAIL(tpath("crc.gz"), "corrupt data: incorrect data check");
  free(z);
  CHECK(tg_live_count() == 0);
}

TEST(idx_hostile_headers) {
  uint8_t f[300];
  memset(f, 0, sizeof f);
  const char *p = tpath("hostile");
  /* bad magic */
  f[0] = 1, f[2] = 8, f[3] = 1, f[7] = 1;
  write_file(p, f, 9, false);
  EXPECT_IDX_FAIL(p, "not an IDX file");
  /* unknown type */
  f[0] = 0, f[2] = 0x0A;
  write_file(p, f, 9, false);
  EXPECT_IDX_FAIL(p, "unknown IDX data type 0x0a");
  /* too many dims */
  f[2] = 8, f[3] = 65;
  write_file(p, f, 4 + 65 * 4, false);
  EXPECT_IDX_FAIL(p, "65 dimensions");
  /* dims whose product overflows */
  f[3] = 4;
  memset(f + 4, 0xFF, 16);
  write_file(p, f, 20, false);
  EXPECT_IDX_FAIL(p, "dimensions overflow");
  write_file(tpath("hostile.gz"), f, 20, true);
  EXPECT_IDX_FAIL(tpath("hostile.gz"), "dimensions overflow");
  /* a header declaring 2^40 bytes over a tiny file: rejected before any allocation */
  f[3] = 2;
  const uint8_t d2[8] = {0, 0x10, 0, 0, 0, 0x10, 0, 0};
  memcpy(f + 4, d2, 8);
  write_file(p, f, 13, false);
  EXPECT_IDX_FAIL(p, "declares 1099511627776 bytes of data but the file has 1");
  /* the same compressed: the buffer grows with the data really there, then "truncated" */
  write_file(tpath("lie.gz"), f, 13, true);
  EXPECT_IDX_FAIL(tpath("lie.gz"),
                  "truncated: the header declares 1099511627776 bytes of data, the file has 1");
  /* files that are not there, directories, NULL */
  EXPECT_IDX_FAIL(tpath("no-such-file"), "cannot open");
  EXPECT_IDX_FAIL(tmpdir(), "is a directory");
  tg_clear_error();
  CHECK(!tg_idx_load(NULL).id && tg_last_status() == TG_ERR_INVALID);
  tg_clear_error();
  CHECK(tg_live_count() == 0);
}

/* Appends raw bytes to a file. */
static void append_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "ab");
  if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "cannot append to %s\n", path);
    exit(2);
  }
}

TEST(idx_gzip_members_trailing_garbage_and_bombs) {
  const uint32_t dims[1] = {6};
  const uint8_t vals[6] = {1, 2, 3, 4, 5, 6};
  uint8_t file[64];
  size_t n = make_idx(file, 0x08, 1, dims, vals, 1, 6);
  /* two gzip members back to back (cat a.gz b.gz) form one stream: header in one, data in the other */
  const char *p = tpath("two.gz");
  write_file(p, file, 5, true);
  write_file(tpath("second.gz"), file + 5, n - 5, true);
  size_t zn = 0;
  uint8_t *z = tt_read_file(tpath("second.gz"), &zn);
  CHECK(z != NULL);
  if (!z) return;
  append_file(p, z, zn);
  tg_clear_error();
  tg_tensor t = tg_idx_load(p);
  CHECK_MSG(t.id, "%s", tg_last_error() ? tg_last_error() : "");
  uint8_t got[6] = {0};
  CHECK(tg_data(t, got, 6) == TG_OK && memcmp(got, vals, 6) == 0);
  tg_free(t);
  /* garbage after the gzip stream is an error (it loaded before), one stray byte too */
  p = tpath("garbage.gz");
  write_file(p, file, n, true);
  append_file(p, "garbage!", 8);
  EXPECT_IDX_FAIL(p, "garbage after the gzip stream");
  write_file(p, file, n, true);
  append_file(p, "\x1f", 1);
  EXPECT_IDX_FAIL(p, "after the gzip stream");
  write_file(p, file, n, true);
  append_file(p, "\0\0\0\0", 4);
  EXPECT_IDX_FAIL(p, "garbage after the gzip stream");
  free(z);
  /* a gzip bomb: 6 declared bytes, 64 MiB of zeros inflated after them; inflating stops one byte past
   * the declared size (the test would take seconds and 64 MiB if it inflated everything) */
  p = tpath("bomb.gz");
  gzFile g = gzopen(p, "wb9");
  CHECK(g != NULL);
  if (!g) return;
  gzwrite(g, file, (unsigned)n);
  static uint8_t zeros[1 << 20];
  for (int i = 0; i < 64; i++) gzwrite(g, zeros, sizeof zeros);
  gzclose(g);
  EXPECT_IDX_FAIL(p, "data continues past the 6 bytes the header declares");
  /* a zero dimension beside huge ones: 0 elements, but the others multiply past 2^48 */
  uint8_t h[16] = {0, 0, 0x08, 3, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  for (int gz = 0; gz < 2; gz++) {
    p = tpath(gz ? "zero_dim.idx.gz" : "zero_dim.idx");
    write_file(p, h, sizeof h, gz);
    tg_clear_error();
    CHECK(!tg_idx_load(p).id && tg_last_status() == TG_ERR_IO);
    CHECK_STR_CONTAINS(tg_last_error(), p);
    CHECK_STR_CONTAINS(tg_last_error(), "non-zero dimensions multiply past 2^48");
    tg_clear_error();
  }
  /* a zero dimension beside ordinary ones is an empty tensor */
  uint8_t e[16] = {0, 0, 0x08, 3, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x10, 0};
  write_file(tpath("empty3.idx"), e, sizeof e, false);
  t = tg_idx_load(tpath("empty3.idx"));
  CHECK(t.id && tg_numel(t) == 0 && tg_ndim(t) == 3);
  tg_free(t);
  CHECK(tg_live_count() == 0);
}

/* ---- MNIST ------------------------------------------------------------------------------------- */

static void check_mnist_shapes(tg_tensor X, tg_tensor Y, int64_t n, int64_t h, int64_t w) {
  int64_t s[8];
  CHECK(tg_shape(X, s) == 4 && s[0] == n && s[1] == 1 && s[2] == h && s[3] == w);
  CHECK(tg_shape(Y, s) == 1 && s[0] == n);
  CHECK(tg_dtype_of(X) == TG_UINT8 && tg_dtype_of(Y) == TG_UINT8);
}

TEST(mnist_fashion_from_debian_package) {
  struct stat st;
  CHECK_MSG(stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &st) == 0,
            "Debian's dataset-fashion-mnist is not installed (scripts/deps.sh installs it)");
  tg_scope_begin();
  tg_tensor Xtr, Ytr, Xte, Yte;
  tg_status s = tg_mnist_load(NULL, true, &Xtr, &Ytr, &Xte, &Yte);
  CHECK_MSG(s == TG_OK, "%s", tg_last_error() ? tg_last_error() : "");
  if (s == TG_OK) {
    check_mnist_shapes(Xtr, Ytr, 60000, 28, 28);
    check_mnist_shapes(Xte, Yte, 10000, 28, 28);
    /* values computed once with Python (gzip + numpy) from the same files */
    uint8_t *x = malloc(60000 * 784), y[60000];
    CHECK(tg_data(Xtr, x, 60000 * 784) == TG_OK);
    CHECK(tg_data(Ytr, y, sizeof y) == TG_OK);
    uint64_t first = 0, total = 0;
    for (int i = 0; i < 784; i++) first += x[i];
    for (size_t i = 0; i < (size_t)60000 * 784; i++) total += x[i];
    CHECK_MSG(first == 76247, "sum of the first training image = %llu", (unsigned long long)first);
    CHECK_MSG(total == 3431114169ULL, "sum of all training pixels = %llu", (unsigned long long)total);
    int counts[256] = {0};
    for (int i = 0; i < 60000; i++) counts[y[i]]++;
    for (int c = 0; c < 10; c++) CHECK_MSG(counts[c] == 6000, "label %d appears %d times", c, counts[c]);
    CHECK(y[0] == 9 && y[1] == 0 && y[3] == 3);
    uint8_t yt[10000];
    CHECK(tg_data(Yte, yt, sizeof yt) == TG_OK);
    int maxl = 0;
    for (int i = 0; i < 10000; i++) maxl = yt[i] > maxl ? yt[i] : maxl;
    CHECK(maxl == 9 && yt[0] == 9 && yt[1] == 2);
    CHECK(tg_data(Xte, x, 10000 * 784) == TG_OK);
    first = 0;
    for (int i = 0; i < 784; i++) first += x[i];
    CHECK_MSG(first == 33456, "sum of the first test image = %llu", (unsigned long long)first);
    free(x);
  }
  tg_scope_end();
  CHECK(tg_live_count() == 0);
}

/* Writes a small MNIST-like directory: N images of h x w and N labels for train and test. */
static void write_mnist_dir(const char *dir, uint32_t ntrain, uint32_t nlabels_train, bool gz_test) {
  mkdir(dir, 0755);
  uint8_t buf[4096], img[1024], lab[64];
  for (int i = 0; i < 1024; i++) img[i] = (uint8_t)(i * 7);
  for (int i = 0; i < 64; i++) lab[i] = (uint8_t)(i % 10);
  char p[512];
  uint32_t d3[3] = {ntrain, 5, 4}, d1[1] = {nlabels_train};
  size_t n = make_idx(buf, 0x08, 3, d3, img, 1, ntrain * 20);
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", dir);
  write_file(p, buf, n, false);
  n = make_idx(buf, 0x08, 1, d1, lab, 1, nlabels_train);
  snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte", dir);
  write_file(p, buf, n, false);
  uint32_t t3[3] = {2, 5, 4}, t1[1] = {2};
  n = make_idx(buf, 0x08, 3, t3, img + 100, 1, 40);
  snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte%s", dir, gz_test ? ".gz" : "");
  write_file(p, buf, n, gz_test);
  n = make_idx(buf, 0x08, 1, t1, lab + 3, 1, 2);
  snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte%s", dir, gz_test ? ".gz" : "");
  write_file(p, buf, n, gz_test);
}

TEST(mnist_from_a_directory) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/mnist", tmpdir());
  write_mnist_dir(dir, 3, 3, true);
  tg_tensor Xtr, Ytr, Xte, Yte;
  CHECK_MSG(tg_mnist_load(dir, false, &Xtr, &Ytr, &Xte, &Yte) == TG_OK, "%s",
            tg_last_error() ? tg_last_error() : "");
  check_mnist_shapes(Xtr, Ytr, 3, 5, 4);
  check_mnist_shapes(Xte, Yte, 2, 5, 4);
  uint8_t x[60], y[3];
  CHECK(tg_data(Xtr, x, sizeof x) == TG_OK && tg_data(Ytr, y, sizeof y) == TG_OK);
  for (int i = 0; i < 60; i++) CHECK(x[i] == (uint8_t)(i * 7));
  CHECK(y[0] == 0 && y[1] == 1 && y[2] == 2);
  CHECK(tg_data(Xte, x, 40) == TG_OK && x[0] == (uint8_t)(100 * 7));
  CHECK(tg_data(Yte, y, 2) == TG_OK && y[0] == 3 && y[1] == 4);
  tg_free(Xtr), tg_free(Ytr), tg_free(Xte), tg_free(Yte);
  CHECK(tg_live_count() == 0);
}

TEST(mnist_errors) {
  tg_tensor X = {1}, Y = {1}, Xt = {1}, Yt = {1};
  char dir[512], p[600];
  /* images and labels disagree */
  snprintf(dir, sizeof dir, "%s/mnist_bad", tmpdir());
  write_mnist_dir(dir, 3, 4, false);
  tg_clear_error();
  CHECK(tg_mnist_load(dir, false, &X, &Y, &Xt, &Yt) == TG_ERR_IO);
  CHECK_STR_CONTAINS(tg_last_error(), "3 images but train-labels-idx1-ubyte has 4 labels");
  CHECK(!X.id && !Y.id && !Xt.id && !Yt.id);
  CHECK(tg_live_count() == 0);
  /* a label that is not a digit (it trained silently to a loss of 0) */
  {
    char d2[512], lp[600];
    snprintf(d2, sizeof d2, "%s/mnist_label", tmpdir());
    write_mnist_dir(d2, 3, 3, false);
    uint8_t buf[64], lab[2] = {4, 200};
    uint32_t d1[1] = {2};
    size_t n = make_idx(buf, 0x08, 1, d1, lab, 1, 2);
    snprintf(lp, sizeof lp, "%s/t10k-labels-idx1-ubyte", d2);
    write_file(lp, buf, n, false);
    tg_clear_error();
    CHECK(tg_mnist_load(d2, false, &X, &Y, &Xt, &Yt) == TG_ERR_IO);
    CHECK_STR_CONTAINS(tg_last_error(), "t10k-labels-idx1-ubyte: label 200 at index 1 is not a class 0..9");
    CHECK(!X.id && !Y.id && !Xt.id && !Yt.id);
    CHECK(tg_live_count() == 0);
  }
  /* a missing file */
  snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", dir);
  unlink(p);
  tg_clear_error();
  CHECK(tg_mnist_load(dir, false, &X, &Y, &Xt, &Yt) == TG_ERR_IO);
  CHECK_STR_CONTAINS(tg_last_error(), "no t10k-labels-idx1-ubyte or t10k-labels-idx1-ubyte.gz");
  CHECK(tg_live_count() == 0);
  /* labels of the wrong type */
  uint8_t buf[64];
  uint32_t d1[1] = {2};
  int16_t lab[2] = {1, 2};
  write_file(p, buf, make_idx(buf, 0x0B, 1, d1, lab, 2, 2), false);
  tg_clear_error();
  CHECK(tg_mnist_load(dir, false, &X, &Y, &Xt, &Yt) != TG_OK);
  tg_clear_error();
  /* the original MNIST has no default location; NULL outputs */
  CHECK(tg_mnist_load(NULL, false, &X, &Y, &Xt, &Yt) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(tg_last_error(), "pass the directory");
  tg_clear_error();
  CHECK(tg_mnist_load(dir, false, &X, NULL, &Xt, &Yt) == TG_ERR_INVALID);
  CHECK(!X.id && !Xt.id && !Yt.id);
  tg_clear_error();
  CHECK(tg_live_count() == 0);
}


int main(void) {
  int rc = RUN_TESTS();
  tmpdir_remove();
  return rc;
}
