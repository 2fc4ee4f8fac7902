/*
 * zip.c -- minimal zip reader (see zip.h): end-of-central-directory record (and its zip64 variant),
 * central directory, local headers; members stored, or deflated (and then CRC-checked).
 *
 * In: a (pointer, length) view of the whole archive. Out: the member list and each member's bytes.
 * Invariants: every field read lies inside the view; an entry's data range [data_offset, +csize) lies
 * inside the view; an inflated member is allocated from its declared size only after that size is
 * bounded by deflate's maximum ratio, and must inflate to exactly that many bytes.
 */
#include "zip.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_EOCD64_LOC 0x07064b50u

static uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t u32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t u64(const uint8_t *p) { return (uint64_t)u32(p) | ((uint64_t)u32(p + 4) << 32); }

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* True if [off, off + n) lies inside a buffer of len bytes (no overflow). */
static bool in_range(uint64_t off, uint64_t n, size_t len) { return off <= len && n <= len - off; }

static int cmp_name(const void *a, const void *b) {
  return strcmp((*(ZipEntry *const *)a)->name, (*(ZipEntry *const *)b)->name);
}

void zip_close(ZipArchive *z) {
  if (!z) return;
  for (size_t i = 0; i < z->n; i++) free(z->entries[i].name);
  free(z->entries);
  free(z->by_name);
  memset(z, 0, sizeof *z);
}

/* Finds the end-of-central-directory record: the last signature whose comment ends inside the file. */
static int find_eocd(const uint8_t *d, size_t len, size_t *pos) {
  if (len < 22) return -1;
  size_t lo = len - 22 > 65535 ? len - 22 - 65535 : 0;
  for (size_t i = len - 22 + 1; i-- > lo;) {
    if (u32(d + i) == SIG_EOCD && i + 22 + (size_t)u16(d + i + 20) <= len) {
      *pos = i;
      return 0;
    }
  }
  return -1;
}

/* Reads the zip64 extended-information extra field for the fields that are saturated. */
static int zip64_extra(const uint8_t *ex, size_t exlen, uint64_t *usize, uint64_t *csize, uint64_t *off,
                       bool need_u, bool need_c, bool need_o) {
  size_t p = 0;
  while (p + 4 <= exlen) {
    uint16_t id = u16(ex + p), sz = u16(ex + p + 2);
    if ((size_t)sz > exlen - p - 4) return -1;
    if (id == 0x0001) {
      const uint8_t *f = ex + p + 4;
      size_t q = 0;
      if (need_u) {
        if (q + 8 > sz) return -1;
        *usize = u64(f + q), q += 8;
      }
      if (need_c) {
        if (q + 8 > sz) return -1;
        *csize = u64(f + q), q += 8;
      }
      if (need_o) {
        if (q + 8 > sz) return -1;
        *off = u64(f + q), q += 8;
      }
      return 0;
    }
    p += 4 + (size_t)sz;
  }
  return (need_u || need_c || need_o) ? -1 : 0;
}

static int cmp_offset(const void *a, const void *b) {
  uint64_t x = (*(ZipEntry *const *)a)->header_offset, y = (*(ZipEntry *const *)b)->header_offset;
  return x < y ? -1 : x > y;
}

int zip_open(ZipArchive *z, const uint8_t *d, size_t len, char *err, size_t errlen) {
  memset(z, 0, sizeof *z);
  z->data = d;
  z->len = len;
  size_t eocd;
  if (!d || find_eocd(d, len, &eocd) != 0) {
    if (d && len >= 4 && u32(d) == SIG_LOCAL) /* it starts as a zip: the end is what is missing */
      return fail(err, errlen,
                  "zip archive without its end-of-central-directory record (truncated? %zu bytes)", len);
    return fail(err, errlen, "not a zip archive (no end-of-central-directory record)");
  }
  uint64_t ndisk = u16(d + eocd + 4), cd_disk = u16(d + eocd + 6), n_here = u16(d + eocd + 8),
           n_total = u16(d + eocd + 10);
  uint64_t cd_size = u32(d + eocd + 12), cd_off = u32(d + eocd + 16);
  if (n_here == 0xFFFF || n_total == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu ||
      ndisk == 0xFFFF || cd_disk == 0xFFFF) {
    /* zip64: the locator sits right before the classic record and points at the zip64 record */
    if (eocd < 20 || u32(d + eocd - 20) != SIG_EOCD64_LOC)
      return fail(err, errlen, "zip64 end-of-central-directory locator missing");
    uint64_t e64 = u64(d + eocd - 20 + 8);
    if (!in_range(e64, 56, len) || u32(d + e64) != SIG_EOCD64)
      return fail(err, errlen, "zip64 end-of-central-directory record missing or out of range");
    ndisk = u32(d + e64 + 16);
    cd_disk = u32(d + e64 + 20);
    n_here = u64(d + e64 + 24);
    n_total = u64(d + e64 + 32);
    cd_size = u64(d + e64 + 40);
    cd_off = u64(d + e64 + 48);
  }
  if (ndisk != 0 || cd_disk != 0 || n_here != n_total)
    return fail(err, errlen, "multi-disk zip archives are not supported");
  if (!in_range(cd_off, cd_size, len))
    return fail(err, errlen,
                "central directory (offset %llu, %llu bytes) lies outside the file (%zu bytes; truncated?)",
                (unsigned long long)cd_off, (unsigned long long)cd_size, len);
  if (n_total > cd_size / 46)
    return fail(err, errlen, "central directory declares %llu entries but has room for %llu",
                (unsigned long long)n_total, (unsigned long long)(cd_size / 46));
  z->entries = calloc(n_total ? n_total : 1, sizeof *z->entries);
  z->by_name = calloc(n_total ? n_total : 1, sizeof *z->by_name);
  if (!z->entries || !z->by_name) {
    zip_close(z);
    return fail(err, errlen, "out of memory reading the central directory");
  }
  const uint8_t *cd = d + cd_off;
  size_t p = 0;
  for (uint64_t i = 0; i < n_total; i++) {
    if (p + 46 > cd_size || u32(cd + p) != SIG_CENTRAL) {
      zip_close(z);
      return fail(err, errlen, "central directory entry %llu is corrupt", (unsigned long long)i);
    }
    const uint8_t *h = cd + p;
    uint16_t flags = u16(h + 8), method = u16(h + 10), nlen = u16(h + 28), xlen = u16(h + 30),
             clen = u16(h + 32);
    uint16_t disk = u16(h + 34);
    uint32_t crc = u32(h + 16);
    uint64_t csize = u32(h + 20), usize = u32(h + 24), loff = u32(h + 42);
    if ((uint64_t)p + 46 + nlen + xlen + clen > cd_size) {
      zip_close(z);
      return fail(err, errlen, "central directory entry %llu runs past the directory", (unsigned long long)i);
    }
    const uint8_t *name = h + 46;
    if (zip64_extra(h + 46 + nlen, xlen, &usize, &csize, &loff, usize == 0xFFFFFFFFu, csize == 0xFFFFFFFFu,
                    loff == 0xFFFFFFFFu) != 0) {
      zip_close(z);
      return fail(err, errlen, "entry '%.*s': bad zip64 extra field", (int)(nlen > 200 ? 200 : nlen),
                  (const char *)name);
    }
    p += 46 + (size_t)nlen + xlen + clen;
    if (memchr(name, 0, nlen)) {
      zip_close(z);
      return fail(err, errlen, "entry %llu has a NUL byte in its name", (unsigned long long)i);
    }
    if (flags & 1) {
      zip_close(z);
      return fail(err, errlen, "entry '%.*s' is encrypted", (int)(nlen > 200 ? 200 : nlen),
                  (const char *)name);
    }
    if (disk != 0 && disk != 0xFFFF) {
      zip_close(z);
      return fail(err, errlen, "multi-disk zip archives are not supported");
    }
    /* the local header repeats the name and has its own extra field; the data follows it */
    if (!in_range(loff, 30, len) || u32(d + loff) != SIG_LOCAL) {
      zip_close(z);
      return fail(err, errlen, "entry '%.*s': local header missing or out of range",
                  (int)(nlen > 200 ? 200 : nlen), (const char *)name);
    }
    uint64_t doff = loff + 30 + (uint64_t)u16(d + loff + 26) + u16(d + loff + 28);
    if (!in_range(doff, csize, len)) {
      zip_close(z);
      return fail(err, errlen,
                  "entry '%.*s': data (%llu bytes at offset %llu) lies outside the file (%zu bytes; truncated?)",
                  (int)(nlen > 200 ? 200 : nlen), (const char *)name, (unsigned long long)csize,
                  (unsigned long long)doff, len);
    }
    ZipEntry *e = &z->entries[z->n];
    e->name = malloc((size_t)nlen + 1);
    if (!e->name) {
      zip_close(z);
      return fail(err, errlen, "out of memory reading the central directory");
    }
    memcpy(e->name, name, nlen);
    e->name[nlen] = 0;
    e->header_offset = loff;
    e->data_offset = doff;
    e->csize = csize;
    e->usize = usize;
    e->crc = crc;
    e->method = method;
    z->by_name[z->n] = e;
    z->n++;
  }
  /* members must not share bytes: a loader done with one member gives its pages back (the file's
   * copy, sd_release_bytes), and a second member over them would read zeros */
  ZipEntry **by_off = calloc(z->n ? z->n : 1, sizeof *by_off);
  if (!by_off) {
    zip_close(z);
    return fail(err, errlen, "out of memory reading the central directory");
  }
  for (size_t i = 0; i < z->n; i++) by_off[i] = &z->entries[i];
  qsort(by_off, z->n, sizeof *by_off, cmp_offset);
  for (size_t i = 1; i < z->n; i++) {
    const ZipEntry *a = by_off[i - 1], *b = by_off[i];
    if (a->data_offset + a->csize > b->header_offset) {
      char na[208], nb[208];
      snprintf(na, sizeof na, "%.200s", a->name);
      snprintf(nb, sizeof nb, "%.200s", b->name);
      free(by_off);
      zip_close(z);
      return fail(err, errlen, "entries '%s' and '%s' overlap in the archive (a crafted or damaged zip)", na, nb);
    }
  }
  free(by_off);
  qsort(z->by_name, z->n, sizeof *z->by_name, cmp_name);
  for (size_t i = 1; i < z->n; i++) {
    if (strcmp(z->by_name[i - 1]->name, z->by_name[i]->name) == 0) {
      char nm[208];
      snprintf(nm, sizeof nm, "%.200s", z->by_name[i]->name);
      zip_close(z);
      return fail(err, errlen, "duplicate entry name '%s'", nm);
    }
  }
  return 0;
}

const ZipEntry *zip_find(const ZipArchive *z, const char *name) {
  size_t lo = 0, hi = z->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(z->by_name[mid]->name, name);
    if (c == 0) return z->by_name[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

/* zlib's crc32 takes a uInt length: feed it in pieces. */
static uint32_t crc_of(const uint8_t *p, uint64_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
    c = crc32(c, p, k);
    p += k;
    n -= k;
  }
  return (uint32_t)c;
}

int zip_read(const ZipArchive *z, const ZipEntry *e, uint64_t max, const uint8_t **out, size_t *outlen,
             void **owned, char *err, size_t errlen) {
  *out = NULL;
  *outlen = 0;
  *owned = NULL;
  const uint8_t *src = z->data + e->data_offset; /* range checked by zip_open */
  if (e->method == 0) {
    if (e->csize != e->usize)
      return fail(err, errlen, "entry '%.200s': stored sizes differ (%llu vs %llu)", e->name,
                  (unsigned long long)e->csize, (unsigned long long)e->usize);
    /* a CRC of 0 is what torch writes when CRCs are switched off
     * (torch.serialization.set_crc32_options(False)); any other value must match */
    if (e->crc != 0 && crc_of(src, e->usize) != e->crc)
      return fail(err, errlen, "entry '%.200s': CRC mismatch (corrupt file)", e->name);
    *out = src;
    *outlen = (size_t)e->usize;
    return 0;
  }
  if (e->method != 8)
    return fail(err, errlen, "entry '%.200s': unsupported compression method %u", e->name, e->method);
  /* deflate cannot expand data by more than about 1032:1, so a larger declared size is a lie */
  if (e->usize / 1032 > e->csize + 1)
    return fail(err, errlen, "entry '%.200s': declared size %llu is impossible for %llu compressed bytes",
                e->name, (unsigned long long)e->usize, (unsigned long long)e->csize);
  /* only the first `max` bytes are wanted: the rest is never inflated (a 16-byte storage whose member
   * declares a GiB costs 16 bytes); the CRC covers the whole member, so it is checked when all of it
   * is inflated */
  bool whole = e->usize <= max;
  uint64_t want = whole ? e->usize : max;
  uint8_t *buf = malloc(want ? (size_t)want : 1);
  if (!buf)
    return fail(err, errlen, "entry '%.200s': out of memory (%llu bytes)", e->name, (unsigned long long)want);
  z_stream s;
  memset(&s, 0, sizeof s);
  if (inflateInit2(&s, -MAX_WBITS) != Z_OK) {
    free(buf);
    return fail(err, errlen, "entry '%.200s': inflateInit failed", e->name);
  }
  uint64_t in_left = e->csize, out_left = want;
  const uint8_t *ip = src;
  uint8_t *op = buf;
  uLong crc = crc32(0L, Z_NULL, 0);
  int rc = Z_OK;
  bool excess = false;
  while (rc == Z_OK && (whole || out_left > 0)) {
    uInt ia = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
    uInt oa = out_left > (1u << 30) ? (1u << 30) : (uInt)out_left;
    s.next_in = (Bytef *)(uintptr_t)ip;
    s.avail_in = ia;
    s.next_out = op;
    s.avail_out = oa;
    /* with no room left, offer one scratch byte so that excess output is detected, not looped on */
    uint8_t extra;
    if (oa == 0) {
      s.next_out = &extra;
      s.avail_out = 1;
    }
    rc = inflate(&s, Z_NO_FLUSH);
    size_t used_in = ia - s.avail_in, produced = 0;
    ip += used_in;
    in_left -= used_in;
    if (oa == 0) {
      if (s.avail_out == 0) {
        rc = Z_DATA_ERROR; /* produced more than declared */
        excess = true;
        break;
      }
    } else {
      produced = oa - s.avail_out;
      crc = crc32(crc, op, (uInt)produced); /* while the bytes are fresh in the cache */
      op += produced;
      out_left -= produced;
    }
    if (rc == Z_BUF_ERROR) rc = (used_in || produced) ? Z_OK : Z_DATA_ERROR; /* no progress: truncated */
  }
  inflateEnd(&s);
  if (whole ? (rc != Z_STREAM_END || out_left != 0) : out_left != 0) {
    free(buf);
    if (excess)
      return fail(err, errlen, "entry '%.200s': inflates to more than its declared %llu bytes (corrupt file)",
                  e->name, (unsigned long long)e->usize);
    return fail(err, errlen, "entry '%.200s': corrupt or truncated deflate data", e->name);
  }
  if (whole && (uint32_t)crc != e->crc) {
    free(buf);
    return fail(err, errlen, "entry '%.200s': CRC mismatch (corrupt file)", e->name);
  }
  *out = buf;
  *outlen = (size_t)want;
  *owned = buf;
  return 0;
}
