/*
 * tar.c -- tar archive -> tg_state_dict of 1-D uint8 tensors (tinygrad's tar_extract).
 *
 * Format: 512-byte headers, each followed by its data padded to 512 bytes; two zero blocks end the
 * archive. Supported: v7/ustar/GNU headers (ustar prefix + name), GNU long names ('L') and long link
 * names ('K'), POSIX pax extended headers ('x': "path" and "size" records; 'g' global headers are
 * skipped), octal and GNU base-256 numbers.
 *
 * In: untrusted bytes. Out: one tensor per regular file ('0', '\0', '7'), named by its member path as
 * Python's tarfile reports it; a later member with the same name replaces the earlier one (as
 * extracting would). Invariants: every header checksum is verified; every size is checked against
 * the bytes that are really left before anything is read or allocated; names never contain NUL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../helpers.h"
#include "state_dict.h"

#define BLOCK 512

/* Numeric header field: octal digits (leading spaces, then NUL/space terminated) or GNU base-256
 * (first byte 0x80 positive; 0xff negative, which we reject). */
static bool tar_num(const uint8_t *f, size_t n, uint64_t *out) {
  if (f[0] & 0x80) {
    if (f[0] != 0x80) return false; /* negative or unknown */
    uint64_t v = 0;
    for (size_t i = 1; i < n; i++) {
      if (v >> 56) return false;
      v = (v << 8) | f[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < n && f[i] == ' ') i++;
  uint64_t v = 0;
  bool digits = false;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
    if (v >> 60) return false;
    v = v * 8 + (uint64_t)(f[i] - '0');
    digits = true;
  }
  for (; i < n; i++)
    if (f[i] != ' ' && f[i] != 0) return false;
  if (!digits) v = 0; /* an all-blank field is 0, as tarfile reads it */
  *out = v;
  return true;
}

static size_t field_len(const uint8_t *f, size_t n) {
  const uint8_t *z = memchr(f, 0, n);
  return z ? (size_t)(z - f) : n;
}

static bool all_zero(const uint8_t *b) {
  for (int i = 0; i < BLOCK; i++)
    if (b[i]) return false;
  return true;
}

/* Parses pax records "<len> <key>=<value>\n" in rec[0..n); sets the path and size when present. */
static bool parse_pax(const uint8_t *rec, size_t n, const uint8_t **path, size_t *path_len, bool *has_size,
                      uint64_t *size) {
  size_t i = 0;
  while (i < n) {
    if (rec[i] == 0) break; /* padding */
    size_t j = i;
    uint64_t L = 0;
    while (j < n && rec[j] >= '0' && rec[j] <= '9') {
      if (L > (uint64_t)1 << 40) return false;
      L = L * 10 + (uint64_t)(rec[j] - '0');
      j++;
    }
    if (j == i || j >= n || rec[j] != ' ' || L < (uint64_t)(j - i + 3) || L > n - i) return false;
    const uint8_t *kv = rec + j + 1, *endp = rec + i + L; /* record ends with '\n' at endp[-1] */
    if (endp[-1] != '\n') return false;
    const uint8_t *eq = memchr(kv, '=', (size_t)(endp - 1 - kv));
    if (!eq) return false;
    size_t klen = (size_t)(eq - kv), vlen = (size_t)(endp - 1 - (eq + 1));
    if (klen == 4 && memcmp(kv, "path", 4) == 0) {
      *path = eq + 1;
      *path_len = vlen;
    } else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
      uint64_t v = 0;
      if (vlen == 0) return false;
      for (size_t k = 0; k < vlen; k++) {
        uint8_t c = eq[1 + k];
        if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) return false;
        v = v * 10 + (uint64_t)(c - '0');
      }
      *has_size = true;
      *size = v;
    }
    i += (size_t)L;
  }
  return true;
}

tg_state_dict *tar_extract_mem(const char *fn, const char *path, const uint8_t *data, size_t len) {
  tg_state_dict *sd = tg_state_dict_new();
  SB name;
  sb_init(&name);
  /* pending long name from a GNU 'L' or pax header for the next member */
  const uint8_t *long_name = NULL;
  size_t long_len = 0;
  bool pending_name = false, pending_size = false;
  uint64_t pax_size = 0;
  size_t pos = 0;
  bool ok = false;

  if (len == 0) {
    tg_set_error(TG_ERR_IO, "%s: %s: empty file (not a tar archive)", fn, path);
    goto out;
  }
  static const struct {
    const char *magic;
    size_t n;
    const char *name;
  } compressed[] = {{"\x1f\x8b", 2, "gzip"},
                    {"BZh", 3, "bzip2"},
                    {"\xfd"
                     "7zXZ",
                     5, "xz"},
                    {"\x28\xb5\x2f\xfd", 4, "zstd"}};
  for (size_t i = 0; i < sizeof compressed / sizeof compressed[0]; i++)
    if (len >= compressed[i].n && memcmp(data, compressed[i].magic, compressed[i].n) == 0 &&
        (len < BLOCK || memcmp(data + 257, "ustar", 5) != 0)) {
      tg_set_error(TG_ERR_IO,
                   "%s: %s: this is a %s-compressed file, not a plain tar archive (decompress it first)", fn,
                   path, compressed[i].name);
      goto out;
    }
  for (int member = 0;; member++) {
    if (len - pos < BLOCK) {
      if (pos == len && member > 0 && !pending_name && !pending_size) break; /* no end-of-archive blocks */
      if (pos == len && member > 0) {
        tg_set_error(TG_ERR_IO, "%s: %s: truncated: an extended header at the end is followed by no member",
                     fn, path);
        goto out;
      }
      tg_set_error(TG_ERR_IO, "%s: %s: truncated header at byte %zu (%zu bytes left, a header is 512)", fn,
                   path, pos, len - pos);
      goto out;
    }
    const uint8_t *h = data + pos;
    if (all_zero(h) && (pending_name || pending_size)) {
      tg_set_error(TG_ERR_IO, "%s: %s: an extended header at byte %zu is followed by no member", fn, path,
                   pos);
      goto out;
    }
    if (all_zero(h)) {
      if (member == 0) {
        tg_set_error(
            TG_ERR_IO,
            "%s: %s: the archive starts with an end-of-archive block (empty archive or not a tar file)", fn,
            path);
        goto out;
      }
      break;
    }
    /* checksum: the header summed with the checksum field as spaces (unsigned; old tars signed) */
    uint64_t want;
    if (!tar_num(h + 148, 8, &want)) {
      tg_set_error(TG_ERR_IO, "%s: %s: header at byte %zu has a malformed checksum field (not a tar file?)",
                   fn, path, pos);
      goto out;
    }
    uint64_t us = 0;
    int64_t ss = 0;
    for (int i = 0; i < BLOCK; i++) {
      uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
      us += c;
      ss += (int8_t)c;
    }
    if (us != want && (uint64_t)ss != want) {
      tg_set_error(TG_ERR_IO,
                   "%s: %s: header at byte %zu has checksum %llu but its bytes sum to %llu (corrupt, or not "
                   "a tar file)",
                   fn, path, pos, (unsigned long long)want, (unsigned long long)us);
      goto out;
    }
    uint64_t size;
    if (!tar_num(h + 124, 12, &size)) {
      tg_set_error(TG_ERR_IO, "%s: %s: header at byte %zu has a malformed size field", fn, path, pos);
      goto out;
    }
    uint8_t type = h[156];
    if (pending_size && type != 'x' && type != 'g' && type != 'L' && type != 'K') {
      size = pax_size;
      pending_size = false;
    }
    size_t body = pos + BLOCK;
    if (size > len - body) {
      tg_set_error(TG_ERR_IO,
                   "%s: %s: member at byte %zu has size %llu but only %zu bytes follow (truncated?)", fn,
                   path, pos, (unsigned long long)size, len - body);
      goto out;
    }
    size_t padded = (size_t)size + ((BLOCK - (size_t)size % BLOCK) % BLOCK);
    if (padded > len - body) { /* tarfile rejects this too: the archive was cut inside the padding */
      tg_set_error(
          TG_ERR_IO,
          "%s: %s: truncated: the member at byte %zu ends %zu bytes before its 512-byte padding does", fn,
          path, pos, padded - (len - body));
      goto out;
    }
    size_t next = body + padded;

    if (type == 'L' || type == 'x') {
      const uint8_t *p = NULL;
      size_t plen = 0;
      if (type == 'L') {
        p = data + body;
        plen = field_len(p, (size_t)size);
      } else {
        bool has_size = false;
        uint64_t s = 0;
        if (!parse_pax(data + body, (size_t)size, &p, &plen, &has_size, &s)) {
          tg_set_error(TG_ERR_IO, "%s: %s: malformed pax extended header at byte %zu", fn, path, pos);
          goto out;
        }
        if (has_size) pending_size = true, pax_size = s;
      }
      if (p) {
        if (memchr(p, 0, plen)) {
          tg_set_error(TG_ERR_IO, "%s: %s: long name at byte %zu contains a NUL byte", fn, path, pos);
          goto out;
        }
        long_name = p;
        long_len = plen;
        pending_name = true;
      }
      pos = next;
      continue;
    }
    if (type == 'K' || type == 'g') { /* long link name, pax global header: nothing we use */
      pos = next;
      continue;
    }

    /* the member's name */
    name.len = 0;
    sb_puts(&name, "");
    if (pending_name) {
      for (size_t i = 0; i < long_len; i++) sb_putc(&name, (char)long_name[i]);
    } else {
      bool ustar = memcmp(h + 257, "ustar", 5) == 0;
      bool gnu = memcmp(h + 257, "ustar  ", 8) == 0;
      size_t pl = ustar && !gnu ? field_len(h + 345, 155) : 0;
      for (size_t i = 0; i < pl; i++) sb_putc(&name, (char)h[345 + i]);
      if (pl) sb_putc(&name, '/');
      size_t nl = field_len(h, 100);
      for (size_t i = 0; i < nl; i++) sb_putc(&name, (char)h[i]);
    }
    pending_name = false;
    pending_size = false;

    bool regular = type == '0' || type == 0 || type == '7';
    /* tarfile treats an old-style regular file whose name ends in '/' as a directory */
    if (regular && name.len && name.s[name.len - 1] == '/') regular = false;
    if (regular) {
      if (name.len == 0) {
        tg_set_error(TG_ERR_IO, "%s: %s: regular member at byte %zu has an empty name", fn, path, pos);
        goto out;
      }
      int64_t shape[1] = {(int64_t)size};
      tg_tensor t = tg_from_data(size ? data + body : NULL, shape, 1, TG_OPTS(.dtype = TG_UINT8));
      if (!t.id) goto out;
      sd_release_bytes(data + body, (size_t)size); /* copied: a file's pages can go */
      if (sd_put(sd, fn, path, name.s, name.len, t, false) != TG_OK) goto out;
    }
    pos = next;
  }
  ok = true;
out:
  sb_free(&name);
  if (!ok) {
    tg_state_dict_free(sd);
    return NULL;
  }
  return sd;
}

tg_state_dict *tg_tar_extract(const char *path) {
  FileView fv;
  if (file_view_open(&fv, "tg_tar_extract", path, false) != TG_OK) return NULL;
  tg_state_dict *sd = tar_extract_mem("tg_tar_extract", path, fv.data, fv.len);
  file_view_close(&fv);
  return sd;
}
