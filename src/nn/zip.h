/*
 * zip.h -- a minimal read-only zip reader over an in-memory view of the whole archive (the PyTorch
 * checkpoint format is a zip). Stored and deflated (zlib) members, zip64 sizes and offsets; no
 * encryption, no multi-disk archives. Nothing in the archive is trusted: every count, size and offset
 * is checked against the bytes that are really there before it is used or allocated from.
 */
#ifndef TG_NN_ZIP_H
#define TG_NN_ZIP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  char *name;           /* NUL-terminated copy (names containing NUL bytes are rejected) */
  uint64_t header_offset; /* its local header's first byte */
  uint64_t data_offset; /* first byte of the member's (compressed) data in the archive */
  uint64_t csize, usize;
  uint32_t crc;
  uint16_t method; /* 0 stored, 8 deflate */
} ZipEntry;

typedef struct {
  const uint8_t *data; /* the archive (borrowed) */
  size_t len;
  ZipEntry *entries; /* central-directory order */
  size_t n;
  ZipEntry **by_name; /* the entries sorted by name (for zip_find) */
} ZipArchive;

/* Parses the central directory of data[0..len). Returns 0, or -1 with a message in err (the archive
 * is then empty and needs no zip_close, though calling it is harmless). data must outlive the
 * archive. */
int zip_open(ZipArchive *z, const uint8_t *data, size_t len, char *err, size_t errlen);
void zip_close(ZipArchive *z);
/* The entry named exactly `name`, or NULL. */
const ZipEntry *zip_find(const ZipArchive *z, const char *name);
/* The member's uncompressed bytes, at most the first `max` of them (UINT64_MAX: all). A stored member
 * points into the archive (*owned = NULL); its CRC is checked unless it is 0 (torch writes 0 when
 * CRCs are switched off). A deflated one is inflated, only as far as `max`, into a malloc'd buffer
 * returned in *owned, which the caller frees; inflating past the declared size is an error, and the
 * CRC is checked whenever the whole member was inflated. Returns 0, or -1 with a message in err. */
int zip_read(const ZipArchive *z, const ZipEntry *e, uint64_t max, const uint8_t **out, size_t *outlen,
             void **owned, char *err, size_t errlen);

#endif
