/*
 * safetensors.c -- .safetensors load (copying or zero-copy over a mapping) and atomic save.
 *
 * Format: u64 little-endian header length N, N bytes of JSON header, then the data section. The
 * header is one object: "__metadata__" -> {string: string} and, per tensor, name -> {"dtype": "F32",
 * "shape": [..], "data_offsets": [begin, end]} with offsets relative to the data section.
 *
 * In: untrusted bytes. Out: a tg_state_dict (or NULL + a TG_ERR_IO error "fn: path: what").
 * Invariants: the header is parsed by a strict streaming JSON reader (RFC 8259 syntax, UTF-8,
 * bounded nesting) that never builds a tree, so memory is bounded by the number of tensors; the data
 * section must be exactly covered by the tensors' byte ranges (no overlap, no hole, no trailing
 * bytes -- the rule of the reference implementation), and each range must equal numel * itemsize.
 * Save writes PATH.tmp.PID.N and renames it over PATH; a save killed before the rename leaves that
 * file, so each save first removes the PATH.tmp.* files of processes that no longer exist.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../helpers.h"
#include "../savefile.h"
#include "state_dict.h"

#define MAX_HEADER ((uint64_t)100000000) /* the reference implementation's limit (100 MB) */
#define MAX_DEPTH 64
#define MAX_NDIM 64

static const struct {
  const char *name;
  tg_dtype dt;
} st_dtypes[] = {
    {"BOOL", TG_BOOL},     {"U8", TG_UINT8},    {"I8", TG_INT8},     {"I16", TG_INT16},  {"U16", TG_UINT16},
    {"I32", TG_INT32},     {"U32", TG_UINT32},  {"I64", TG_INT64},   {"U64", TG_UINT64}, {"F16", TG_FLOAT16},
    {"BF16", TG_BFLOAT16}, {"F32", TG_FLOAT32}, {"F64", TG_FLOAT64}, {"F8_E4M3", TG_FP8E4M3}, {"F8_E5M2", TG_FP8E5M2},
    {"F8_E4M3FNUZ", TG_FP8E4M3FNUZ}, {"F8_E5M2FNUZ", TG_FP8E5M2FNUZ},
};

static const char *st_name_of(tg_dtype dt) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
  return NULL;
}

/* ---- a strict streaming JSON reader over the header ---- */
typedef struct {
  const uint8_t *p, *start, *end;
  const char *fn, *path;
  bool failed;
} J;

static bool j_fail(J *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool j_fail(J *j, const char *fmt, ...) {
  if (!j->failed) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tg_set_error(TG_ERR_IO, "%s: %s: invalid header at byte %zu: %s", j->fn, j->path,
                 (size_t)(j->p - j->start) + 8, msg);
    j->failed = true;
  }
  return false;
}

static void j_ws(J *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

/* Consumes character c after whitespace. */
static bool j_expect(J *j, char c, const char *what) {
  j_ws(j);
  if (j->p >= j->end) return j_fail(j, "unexpected end of header, expected %s", what);
  if (*j->p != (uint8_t)c) {
    uint8_t g = *j->p;
    if (g >= 0x20 && g < 0x7f) return j_fail(j, "expected %s, got '%c'", what, g);
    return j_fail(j, "expected %s, got byte 0x%02x", what, g);
  }
  j->p++;
  return true;
}

/* Peeks the next non-space char (0 at end). */
static int j_peek(J *j) {
  j_ws(j);
  return j->p < j->end ? *j->p : 0;
}

static int hexval(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static bool j_hex4(J *j, uint32_t *out) {
  if (j->end - j->p < 4) return j_fail(j, "truncated \\u escape");
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval(j->p[i]);
    if (h < 0) return j_fail(j, "bad hex digit in \\u escape");
    v = v * 16 + (uint32_t)h;
  }
  j->p += 4;
  *out = v;
  return true;
}

static void sb_put_utf8(SB *b, uint32_t cp) {
  if (cp < 0x80) {
    sb_putc(b, (char)cp);
  } else if (cp < 0x800) {
    sb_putc(b, (char)(0xc0 | (cp >> 6)));
    sb_putc(b, (char)(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    sb_putc(b, (char)(0xe0 | (cp >> 12)));
    sb_putc(b, (char)(0x80 | ((cp >> 6) & 0x3f)));
    sb_putc(b, (char)(0x80 | (cp & 0x3f)));
  } else {
    sb_putc(b, (char)(0xf0 | (cp >> 18)));
    sb_putc(b, (char)(0x80 | ((cp >> 12) & 0x3f)));
    sb_putc(b, (char)(0x80 | ((cp >> 6) & 0x3f)));
    sb_putc(b, (char)(0x80 | (cp & 0x3f)));
  }
}

/* Reads a string into out (cleared first; out may be NULL to validate only). The decoded bytes are
 * valid UTF-8; a NUL (\u0000) is kept, callers that need C strings reject it. */
static bool j_string(J *j, SB *out) {
  if (!j_expect(j, '"', "a string")) return false;
  if (out) out->len = 0, sb_puts(out, "");
  for (;;) {
    if (j->p >= j->end) return j_fail(j, "unterminated string");
    uint8_t c = *j->p;
    if (c == '"') {
      j->p++;
      return true;
    }
    if (c < 0x20) return j_fail(j, "control character 0x%02x in a string", c);
    if (c == '\\') {
      if (j->end - j->p < 2) return j_fail(j, "truncated escape");
      uint8_t e = j->p[1];
      j->p += 2;
      char r;
      switch (e) {
      case '"':
        r = '"';
        break;
      case '\\':
        r = '\\';
        break;
      case '/':
        r = '/';
        break;
      case 'b':
        r = '\b';
        break;
      case 'f':
        r = '\f';
        break;
      case 'n':
        r = '\n';
        break;
      case 'r':
        r = '\r';
        break;
      case 't':
        r = '\t';
        break;
      case 'u': {
        uint32_t cp;
        if (!j_hex4(j, &cp)) return false;
        if (cp >= 0xdc00 && cp <= 0xdfff) return j_fail(j, "unpaired low surrogate \\u%04x", cp);
        if (cp >= 0xd800 && cp <= 0xdbff) {
          uint32_t lo;
          if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
            return j_fail(j, "unpaired high surrogate \\u%04x", cp);
          j->p += 2;
          if (!j_hex4(j, &lo)) return false;
          if (lo < 0xdc00 || lo > 0xdfff)
            return j_fail(j, "high surrogate \\u%04x not followed by a low one", cp);
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (out) {
          if (cp == 0)
            sb_putc(out, 0), out->s[out->len] = 0;
          else
            sb_put_utf8(out, cp);
        }
        continue;
      }
      default:
        j->p -= 1;
        return j_fail(j, "invalid escape");
      }
      if (out) sb_putc(out, r);
      continue;
    }
    /* a run of raw bytes: validate UTF-8 sequence by sequence */
    size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!k || (size_t)(j->end - j->p) < k || !utf8_valid(j->p, k))
      return j_fail(j, "invalid UTF-8 in a string");
    if (out)
      for (size_t i = 0; i < k; i++) sb_putc(out, (char)j->p[i]);
    j->p += k;
  }
}

/* A non-negative integer (JSON number without sign, fraction or exponent) that fits in uint64. */
static bool j_uint(J *j, uint64_t *out, const char *what) {
  j_ws(j);
  if (j->p >= j->end || *j->p < '0' || *j->p > '9') {
    if (j->p < j->end && *j->p == '-') return j_fail(j, "%s must not be negative", what);
    return j_fail(j, "%s must be a non-negative integer", what);
  }
  if (*j->p == '0' && j->end - j->p > 1 && j->p[1] >= '0' && j->p[1] <= '9')
    return j_fail(j, "leading zero in %s", what);
  uint64_t v = 0;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*j->p - '0'), &v))
      return j_fail(j, "%s is too large", what);
    j->p++;
  }
  if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
    return j_fail(j, "%s must be an integer", what);
  *out = v;
  return true;
}

/* Skips (and validates) any JSON value. */
static bool j_skip(J *j, int depth) {
  if (depth > MAX_DEPTH) return j_fail(j, "nesting deeper than %d", MAX_DEPTH);
  int c = j_peek(j);
  if (c == '"') return j_string(j, NULL);
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    j->p++;
    if (j_peek(j) == close) return j->p++, true;
    for (;;) {
      if (c == '{') {
        if (!j_string(j, NULL) || !j_expect(j, ':', "':'")) return false;
      }
      if (!j_skip(j, depth + 1)) return false;
      int n = j_peek(j);
      if (n == ',') {
        j->p++;
        continue;
      }
      return j_expect(j, close, c == '{' ? "',' or '}'" : "',' or ']'");
    }
  }
  static const char *lits[] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(lits[i]);
    if ((size_t)(j->end - j->p) >= n && memcmp(j->p, lits[i], n) == 0) return j->p += n, true;
  }
  if (c == '-' || (c >= '0' && c <= '9')) { /* number: -?int frac? exp? */
    const uint8_t *p = j->p;
    if (*p == '-') p++;
    if (p >= j->end || *p < '0' || *p > '9') return j_fail(j, "bad number");
    if (*p == '0')
      p++;
    else
      while (p < j->end && *p >= '0' && *p <= '9') p++;
    if (p < j->end && *p == '.') {
      p++;
      if (p >= j->end || *p < '0' || *p > '9') return j_fail(j, "bad number");
      while (p < j->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < j->end && (*p == 'e' || *p == 'E')) {
      p++;
      if (p < j->end && (*p == '+' || *p == '-')) p++;
      if (p >= j->end || *p < '0' || *p > '9') return j_fail(j, "bad number");
      while (p < j->end && *p >= '0' && *p <= '9') p++;
    }
    j->p = p;
    return true;
  }
  if (!c) return j_fail(j, "unexpected end of header, expected a value");
  return j_fail(j, "expected a value");
}

/* ---- loading ---- */
typedef struct {
  char *name;
  tg_dtype dt;
  int ndim;
  size_t shape_off; /* into the shared Dims pool: entries stay small, so memory follows the header */
  uint64_t begin, end;
} Entry;

typedef struct {
  int64_t *v;
  size_t n, cap;
} Dims;

static void dims_push(Dims *d, int64_t x) {
  if (d->n == d->cap) {
    d->cap = d->cap ? d->cap * 2 : 64;
    d->v = tg_xrealloc(d->v, d->cap * sizeof(int64_t));
  }
  d->v[d->n++] = x;
}

static bool parse_entry(J *j, Entry *e, Dims *dims) {
  if (!j_expect(j, '{', "'{' (tensor info)")) return false;
  bool have_dtype = false, have_shape = false, have_off = false;
  SB key, val;
  sb_init(&key);
  sb_init(&val);
  bool ok = false;
  if (j_peek(j) == '}') {
    j->p++;
    goto check;
  }
  for (;;) {
    if (!j_string(j, &key) || !j_expect(j, ':', "':'")) goto out;
    if (strcmp(key.s, "dtype") == 0 && key.len == 5) {
      if (have_dtype) {
        j_fail(j, "tensor '%.200s': duplicate \"dtype\"", e->name);
        goto out;
      }
      have_dtype = true;
      if (!j_string(j, &val)) goto out;
      e->dt = 0;
      for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strlen(val.s) == val.len && strcmp(val.s, st_dtypes[i].name) == 0) e->dt = st_dtypes[i].dt;
      if (!e->dt) {
        j_fail(j,
               "tensor '%.200s': unsupported dtype \"%.40s\" (supported: BOOL U8 I8 I16 U16 I32 U32 I64 U64 "
               "F16 BF16 F32 F64 F8_E4M3 F8_E5M2 F8_E4M3FNUZ F8_E5M2FNUZ)",
               e->name, val.s);
        goto out;
      }
    } else if (strcmp(key.s, "shape") == 0 && key.len == 5) {
      if (have_shape) {
        j_fail(j, "tensor '%.200s': duplicate \"shape\"", e->name);
        goto out;
      }
      have_shape = true;
      if (!j_expect(j, '[', "'[' (shape)")) goto out;
      e->ndim = 0;
      e->shape_off = dims->n;
      if (j_peek(j) == ']') {
        j->p++;
      } else {
        for (;;) {
          uint64_t d;
          if (!j_uint(j, &d, "a shape dimension")) goto out;
          if (e->ndim == MAX_NDIM) {
            j_fail(j, "tensor '%.200s': more than %d dimensions", e->name, MAX_NDIM);
            goto out;
          }
          if (d > ((uint64_t)1 << 48)) {
            j_fail(j, "tensor '%.200s': dimension %llu is too large", e->name, (unsigned long long)d);
            goto out;
          }
          dims_push(dims, (int64_t)d);
          e->ndim++;
          if (j_peek(j) == ',') {
            j->p++;
            continue;
          }
          if (!j_expect(j, ']', "',' or ']' (shape)")) goto out;
          break;
        }
      }
    } else if (strcmp(key.s, "data_offsets") == 0 && key.len == 12) {
      if (have_off) {
        j_fail(j, "tensor '%.200s': duplicate \"data_offsets\"", e->name);
        goto out;
      }
      have_off = true;
      if (!j_expect(j, '[', "'[' (data_offsets)") || !j_uint(j, &e->begin, "data_offsets[0]") ||
          !j_expect(j, ',', "',' (data_offsets)") || !j_uint(j, &e->end, "data_offsets[1]") ||
          !j_expect(j, ']', "']' (data_offsets has two entries)"))
        goto out;
    } else {
      /* unknown fields are ignored (as the reference implementation does), but must be valid JSON */
      if (!j_skip(j, 2)) goto out;
    }
    if (j_peek(j) == ',') {
      j->p++;
      continue;
    }
    if (!j_expect(j, '}', "',' or '}' (tensor info)")) goto out;
    break;
  }
check:
  if (!have_dtype || !have_shape || !have_off) {
    j_fail(j, "tensor '%.200s' has no \"%s\"", e->name,
           !have_dtype   ? "dtype"
           : !have_shape ? "shape"
                         : "data_offsets");
    goto out;
  }
  ok = true;
out:
  sb_free(&key);
  sb_free(&val);
  return ok;
}

static int cmp_entry(const void *a, const void *b) {
  const Entry *x = *(Entry *const *)a, *y = *(Entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int cmp_entry_name(const void *a, const void *b) {
  return strcmp((*(Entry *const *)a)->name, (*(Entry *const *)b)->name);
}

static void free_entries(Entry *es, size_t n) {
  for (size_t i = 0; i < n; i++) free(es[i].name);
  free(es);
}

/* The loader over a Src: a file is read in parts (the header, then each tensor's bytes straight
 * into a buffer of its own), so the peak memory is the tensors + the largest one; memory (the fuzz
 * targets, tg_safe_load_mmap's mapping) is read in place. */
static tg_state_dict *safe_load_src(const char *fn, const char *path, const Src *in, bool zero_copy,
                                    FileMap *map) {
  if (in->len > SIZE_MAX / 2) {
    tg_set_error(TG_ERR_IO, "%s: %s: file too large (%llu bytes)", fn, path, (unsigned long long)in->len);
    return NULL;
  }
  size_t len = (size_t)in->len;
  uint8_t *hbuf = NULL, *dbuf = NULL;
  if (len < 8) {
    tg_set_error(TG_ERR_IO,
                 "%s: %s: file is %zu bytes, too short for a safetensors header (8-byte length + JSON)", fn,
                 path, len);
    return NULL;
  }
  uint8_t h8[8];
  if (src_read(in, 0, h8, 8) != TG_OK) return NULL;
  uint64_t hlen = rd_u64le(h8);
  if (hlen > MAX_HEADER) {
    tg_set_error(TG_ERR_IO,
                 "%s: %s: header length %llu is larger than the %llu-byte limit (not a safetensors file?)",
                 fn, path, (unsigned long long)hlen, (unsigned long long)MAX_HEADER);
    return NULL;
  }
  if (hlen > len - 8) {
    tg_set_error(TG_ERR_IO, "%s: %s: header length %llu runs past the end of the %zu-byte file (truncated?)",
                 fn, path, (unsigned long long)hlen, len);
    return NULL;
  }
  if (hlen < 2) {
    tg_set_error(TG_ERR_IO,
                 "%s: %s: header length %llu is too short for a JSON object (not a safetensors file?)", fn,
                 path, (unsigned long long)hlen);
    return NULL;
  }
  const uint8_t *ds = in->mem ? in->mem + 8 + hlen : NULL; /* data section, when in memory */
  size_t dlen = len - 8 - (size_t)hlen;
  const uint8_t *hdr = in->fd < 0 ? in->mem + 8 : NULL; /* a file's header is read, even when mapped */
  if (!hdr) {
    hbuf = malloc((size_t)hlen);
    if (!hbuf) {
      tg_set_error(TG_ERR_IO, "%s: %s: out of memory for a %llu-byte header", fn, path, (unsigned long long)hlen);
      return NULL;
    }
    if (src_read(in, 8, hbuf, (size_t)hlen) != TG_OK) {
      free(hbuf);
      return NULL;
    }
    hdr = hbuf;
  }

  J j = {.p = hdr, .start = hdr, .end = hdr + hlen, .fn = fn, .path = path};
  Entry *es = NULL;
  size_t n = 0, cap = 0;
  tg_state_dict *sd = tg_state_dict_new();
  bool have_meta = false, ok = false;
  SB key, val, mkey;
  sb_init(&key);
  sb_init(&val);
  sb_init(&mkey);
  Entry **order = NULL;
  uint8_t *tmp = NULL;
  Dims dims = {0};

  if (!j_expect(&j, '{', "'{' (not a safetensors file?)")) goto out;
  if (j_peek(&j) != '}') {
    for (;;) {
      if (!j_string(&j, &key) || !j_expect(&j, ':', "':'")) goto out;
      if (strlen(key.s) != key.len) {
        j_fail(&j, "a name contains a NUL character");
        goto out;
      }
      if (strcmp(key.s, "__metadata__") == 0) {
        if (have_meta) {
          j_fail(&j, "duplicate \"__metadata__\"");
          goto out;
        }
        have_meta = true;
        if (!j_expect(&j, '{', "'{' (__metadata__ is an object of strings)")) goto out;
        if (j_peek(&j) == '}') {
          j.p++;
        } else {
          for (;;) {
            if (!j_string(&j, &mkey) || !j_expect(&j, ':', "':'")) goto out;
            if (j_peek(&j) != '"') {
              j_fail(&j, "__metadata__ value of '%.200s' is not a string", mkey.s);
              goto out;
            }
            if (!j_string(&j, &val)) goto out;
            if (strlen(val.s) != val.len) {
              j_fail(&j, "__metadata__ value of '%.200s' contains a NUL character", mkey.s);
              goto out;
            }
            if (sd_meta_put(sd, fn, path, mkey.s, mkey.len, val.s, val.len, true) != TG_OK) goto out;
            if (j_peek(&j) == ',') {
              j.p++;
              continue;
            }
            if (!j_expect(&j, '}', "',' or '}' (__metadata__)")) goto out;
            break;
          }
        }
      } else {
        if (key.len == 0) {
          j_fail(&j, "empty tensor name");
          goto out;
        }
        if (n == cap) {
          /* each entry needs well over 32 header bytes, so this stays proportional to the header */
          cap = cap ? cap * 2 : 16;
          es = tg_xrealloc(es, cap * sizeof(Entry));
        }
        Entry *e = &es[n];
        memset(e, 0, sizeof *e);
        e->name = tg_xstrdup(key.s);
        n++;
        if (!parse_entry(&j, e, &dims)) goto out;
      }
      if (j_peek(&j) == ',') {
        j.p++;
        continue;
      }
      if (!j_expect(&j, '}', "',' or '}'")) goto out;
      break;
    }
  } else {
    j.p++;
  }
  j_ws(&j);
  if (j.p != j.end) {
    j_fail(&j, "trailing bytes after the header object");
    goto out;
  }

  /* duplicate names (sorted copy), sizes, then coverage of the data section */
  order = tg_xmalloc((n ? n : 1) * sizeof(Entry *));
  for (size_t i = 0; i < n; i++) order[i] = &es[i];
  qsort(order, n, sizeof(Entry *), cmp_entry_name);
  for (size_t i = 1; i < n; i++)
    if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
      tg_set_error(TG_ERR_IO, "%s: %s: duplicate tensor name '%.200s' in the header", fn, path,
                   order[i]->name);
      goto out;
    }
  for (size_t i = 0; i < n; i++) {
    Entry *e = &es[i];
    uint64_t numel = 1, nonzero = 1, nbytes; /* a zero dimension does not excuse the others */
    for (int d = 0; d < e->ndim; d++) {
      uint64_t v = (uint64_t)dims.v[e->shape_off + (size_t)d];
      if ((v && __builtin_mul_overflow(nonzero, v, &nonzero)) || nonzero > ((uint64_t)1 << 48)) {
        tg_set_error(TG_ERR_IO,
                     "%s: %s: tensor '%.200s' has too many elements (its non-zero dimensions multiply past 2^48)",
                     fn, path, e->name);
        goto out;
      }
      numel *= v;
    }
    if (__builtin_mul_overflow(numel, (uint64_t)tg_dtype_itemsize(e->dt), &nbytes)) nbytes = UINT64_MAX;
    if (e->end < e->begin) {
      tg_set_error(TG_ERR_IO, "%s: %s: tensor '%.200s' has data_offsets [%llu, %llu] with end before begin",
                   fn, path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end);
      goto out;
    }
    if (e->end > dlen) {
      tg_set_error(TG_ERR_IO,
                   "%s: %s: tensor '%.200s' has data_offsets [%llu, %llu] past the end of the %zu-byte data "
                   "section (truncated?)",
                   fn, path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end, dlen);
      goto out;
    }
    if (e->end - e->begin != nbytes) {
      tg_set_error(TG_ERR_IO, "%s: %s: tensor '%.200s' spans %llu bytes but its shape and dtype %s need %llu",
                   fn, path, e->name, (unsigned long long)(e->end - e->begin), st_name_of(e->dt),
                   (unsigned long long)nbytes);
      goto out;
    }
    order[i] = e;
  }
  qsort(order, n, sizeof(Entry *), cmp_entry);
  uint64_t pos = 0;
  for (size_t i = 0; i < n; i++) {
    Entry *e = order[i];
    if (e->begin < pos) {
      tg_set_error(TG_ERR_IO, "%s: %s: tensor '%.200s' (bytes %llu..%llu) overlaps tensor '%.200s'", fn, path,
                   e->name, (unsigned long long)e->begin, (unsigned long long)e->end, order[i - 1]->name);
      goto out;
    }
    if (e->begin > pos) {
      tg_set_error(TG_ERR_IO, "%s: %s: bytes %llu..%llu of the data section belong to no tensor", fn, path,
                   (unsigned long long)pos, (unsigned long long)e->begin);
      goto out;
    }
    pos = e->end;
  }
  if (pos != dlen) {
    tg_set_error(TG_ERR_IO, "%s: %s: the data section has %zu bytes but the tensors cover %llu", fn, path,
                 dlen, (unsigned long long)pos);
    goto out;
  }

  /* tensors, in header order */
  if (io_test_hook && in->fd >= 0) io_test_hook(path, 1);
  if (ds && in->fd >= 0) { /* mapped: the bytes below are touched next, so the file must still be whole */
    struct stat st;
    if (fstat(in->fd, &st) != 0 || (uint64_t)st.st_size < in->len) {
      tg_set_error(TG_ERR_IO, "%s: %s: the file shrank from %zu bytes while it was loaded (truncated by another process?)",
                   fn, path, len);
      goto out;
    }
  }
  for (size_t i = 0; i < n; i++) {
    Entry *e = &es[i];
    const int64_t *shape = e->ndim ? dims.v + e->shape_off : NULL;
    size_t nbytes = (size_t)(e->end - e->begin);
    const uint8_t *src;
    if (ds) {
      src = ds + e->begin;
    } else {
      dbuf = malloc(nbytes ? nbytes : 1);
      if (!dbuf) {
        tg_set_error(TG_ERR_IO, "%s: %s: out of memory (%zu bytes for tensor '%.200s')", fn, path, nbytes,
                     e->name);
        goto out;
      }
      if (src_read(in, 8 + hlen + e->begin, dbuf, nbytes) != TG_OK) goto out;
      src = dbuf;
    }
    size_t isz = tg_dtype_itemsize(e->dt);
    bool bad_bool = false;
    if (e->dt == TG_BOOL)
      for (size_t k = 0; k < nbytes && !bad_bool; k++) bad_bool = src[k] > 1;
    tg_tensor t;
    if (zero_copy && nbytes && ((uintptr_t)src % isz) == 0 && !bad_bool) {
      t = tg_from_blob((void *)(uintptr_t)src, shape, e->ndim, TG_OPTS(.dtype = e->dt));
      if (map && t.id) file_map_attach(map, t); /* the buffer keeps the mapping alive */
    } else if (bad_bool) { /* bools are stored as 0/1: normalise other bytes as numpy's view would read them
                            */
      tmp = tg_xmalloc(nbytes);
      for (size_t k = 0; k < nbytes; k++) tmp[k] = src[k] != 0;
      t = tg_from_data(tmp, shape, e->ndim, TG_OPTS(.dtype = e->dt));
      free(tmp);
      tmp = NULL;
    } else {
      t = tg_from_data(nbytes ? src : NULL, shape, e->ndim, TG_OPTS(.dtype = e->dt));
    }
    free(dbuf);
    dbuf = NULL;
    if (!t.id) goto out;
    if (sd_put(sd, fn, path, e->name, strlen(e->name), t, true) != TG_OK) goto out;
  }
  ok = true;
out:
  sb_free(&key);
  sb_free(&val);
  sb_free(&mkey);
  free(order);
  free(tmp);
  free(hbuf);
  free(dbuf);
  free(dims.v);
  free_entries(es, n);
  if (!ok) {
    tg_state_dict_free(sd);
    return NULL;
  }
  return sd;
}

tg_state_dict *safe_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len,
                             bool zero_copy, FileMap *map) {
  Src in = {.mem = data, .fd = -1, .len = len, .fn = fn, .path = path};
  return safe_load_src(fn, path, &in, zero_copy, map);
}

tg_state_dict *tg_safe_load(const char *path) {
  Src in;
  if (src_open(&in, "tg_safe_load", path) != TG_OK) return NULL;
  tg_state_dict *sd = safe_load_src("tg_safe_load", path, &in, false, NULL);
  src_close(&in);
  if (tg_oom_check("tg_safe_load") && sd) tg_state_dict_free(sd), sd = NULL;
  return sd;
}

tg_state_dict *tg_safe_load_mmap(const char *path) {
  static const char *fn = "tg_safe_load_mmap";
  Src in;
  if (src_open(&in, fn, path) != TG_OK) return NULL;
  if (in.len == 0 || in.len > SIZE_MAX / 2) { /* nothing to map: the loader says why it can't load */
    tg_state_dict *sd = safe_load_src(fn, path, &in, false, NULL);
    src_close(&in);
    return sd;
  }
  void *addr = mmap(NULL, (size_t)in.len, PROT_READ | PROT_WRITE, MAP_PRIVATE, in.fd, 0);
  if (addr == MAP_FAILED) {
    tg_set_error(TG_ERR_IO, "%s: %s: cannot map %llu bytes: %s", fn, path, (unsigned long long)in.len,
                 strerror(errno));
    src_close(&in);
    return NULL;
  }
  /* the header is read with pread, never through the mapping, and the size is checked once more: a
   * file truncated before or during the load is an error here, not a SIGBUS (see tinygrad.h) */
  in.mem = addr;
  tg_state_dict *sd = NULL;
  FileMap *m = file_map_new(addr, (size_t)in.len);
  struct stat st;
  if (fstat(in.fd, &st) != 0 || (uint64_t)st.st_size < in.len)
    tg_set_error(TG_ERR_IO, "%s: %s: the file shrank from %llu bytes while it was loaded (truncated by another process?)",
                 fn, path, (unsigned long long)in.len);
  else
    sd = safe_load_src(fn, path, &in, true, m); /* shared by the dict and the buffers that wrap it */
  if (sd)
    sd_own_mapping(sd, m);
  else
    file_map_unref(m);
  src_close(&in);
  if (tg_oom_check("tg_safe_load_mmap") && sd) tg_state_dict_free(sd), sd = NULL;
  return sd;
}

/* ---- saving ---- */

static void json_str(SB *b, const char *s) {
  sb_putc(b, '"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      sb_putc(b, '\\');
      sb_putc(b, (char)*p);
    } else if (*p < 0x20) {
      sb_printf(b, "\\u%04x", *p);
    } else {
      sb_putc(b, (char)*p);
    }
  }
  sb_putc(b, '"');
}

tg_status tg_safe_save(const tg_state_dict *sd, const char *path) {
  const char *fn = "tg_safe_save";
  if (!sd) return tg_set_error(TG_ERR_INVALID, "%s: dict is NULL", fn);
  if (!path || !*path) return tg_set_error(TG_ERR_INVALID, "%s: path is %s", fn, path ? "empty" : "NULL");
  int n = tg_state_dict_len(sd);
  tg_status st = TG_OK;
  SB h;
  sb_init(&h);
  uint64_t *offs = tg_xmalloc((size_t)(n ? n : 1) * sizeof(uint64_t));
  int *layout = tg_xmalloc((size_t)(n ? n : 1) * sizeof(int));
  SaveFile sf = {.fd = -1};

  /* validate every entry before touching the file system */
  for (int i = 0; i < n; i++) {
    const char *name = tg_state_dict_name(sd, i);
    tg_tensor t = tg_state_dict_tensor(sd, i);
    if (strcmp(name, "__metadata__") == 0) {
      st = tg_set_error(TG_ERR_INVALID, "%s: %s: a tensor cannot be named __metadata__", fn, path);
      goto done;
    }
    if (!utf8_valid((const uint8_t *)name, strlen(name))) {
      st = tg_set_error(TG_ERR_INVALID, "%s: %s: tensor name '%.200s' is not valid UTF-8", fn, path, name);
      goto done;
    }
    if (!tg_valid(t)) {
      st = tg_set_error(TG_ERR_HANDLE,
                        "%s: %s: tensor '%.200s' is not a valid handle (freed behind the dict's back?)", fn,
                        path, name);
      goto done;
    }
    if (tg_ndim(t) > MAX_NDIM || !st_name_of(tg_dtype_of(t))) {
      st = tg_set_error(TG_ERR_INVALID, "%s: %s: tensor '%.200s' (dtype %s, %d dims) has no safetensors form (at most %d dims)",
                        fn, path, name, tg_dtype_name(tg_dtype_of(t)), tg_ndim(t), MAX_NDIM);
      goto done;
    }
  }
  for (int i = 0; i < tg_state_dict_meta_len(sd); i++) {
    const char *k = tg_state_dict_meta_key(sd, i), *v = tg_state_dict_meta_value(sd, i);
    if (!utf8_valid((const uint8_t *)k, strlen(k)) || !utf8_valid((const uint8_t *)v, strlen(v))) {
      st = tg_set_error(TG_ERR_INVALID, "%s: %s: metadata '%.200s' is not valid UTF-8", fn, path, k);
      goto done;
    }
  }

  /* data layout: largest itemsize first (dict order within a size), so that every tensor starts aligned
   * for its dtype and a mapped file can be wrapped without copies; the header keeps dict order */
  uint64_t off = 0;
  int nl = 0;
  for (size_t isz = 8; isz >= 1; isz /= 2)
    for (int i = 0; i < n; i++) {
      tg_tensor t = tg_state_dict_tensor(sd, i);
      if (tg_dtype_itemsize(tg_dtype_of(t)) != isz) continue;
      offs[i] = off;
      off += (uint64_t)tg_numel(t) * isz;
      layout[nl++] = i;
    }
  TG_ASSERT(nl == n);

  /* the header: __metadata__ first (as tinygrad writes it), then the tensors in dict order */
  sb_putc(&h, '{');
  if (tg_state_dict_meta_len(sd) > 0) {
    sb_puts(&h, "\"__metadata__\":{");
    for (int i = 0; i < tg_state_dict_meta_len(sd); i++) {
      if (i) sb_putc(&h, ',');
      json_str(&h, tg_state_dict_meta_key(sd, i));
      sb_putc(&h, ':');
      json_str(&h, tg_state_dict_meta_value(sd, i));
    }
    sb_putc(&h, '}');
  }
  for (int i = 0; i < n; i++) {
    tg_tensor t = tg_state_dict_tensor(sd, i);
    int64_t shape[MAX_NDIM];
    int nd = tg_shape(t, shape);
    tg_dtype dt = tg_dtype_of(t);
    if (h.len > 1) sb_putc(&h, ',');
    json_str(&h, tg_state_dict_name(sd, i));
    sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_name_of(dt));
    for (int d = 0; d < nd; d++) sb_printf(&h, "%s%lld", d ? "," : "", (long long)shape[d]);
    uint64_t nbytes = (uint64_t)tg_numel(t) * tg_dtype_itemsize(dt);
    sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offs[i],
              (unsigned long long)(offs[i] + nbytes));
  }
  sb_putc(&h, '}');
  while (h.len % 8) sb_putc(&h, ' '); /* the data section starts 8-byte aligned */

  /* the file to replace (savefile.h): only a regular file, through a temporary file renamed over it */
  if ((st = savefile_open(&sf, fn, path)) != TG_OK) goto done;
  uint8_t lenb[8];
  for (int k = 0; k < 8; k++) lenb[k] = (uint8_t)((uint64_t)h.len >> (8 * k));
  if ((st = savefile_write(&sf, lenb, 8)) != TG_OK || (st = savefile_write(&sf, h.s, h.len)) != TG_OK) goto done;
  for (int k = 0; k < n; k++) {
    int i = layout[k];
    tg_tensor t = tg_state_dict_tensor(sd, i);
    size_t nbytes = (size_t)tg_numel(t) * tg_dtype_itemsize(tg_dtype_of(t));
    if (!nbytes) continue;
    void *buf = malloc(nbytes);
    if (!buf) {
      st = tg_set_error(TG_ERR_RUNTIME, "%s: %s: out of memory for tensor '%.200s' (%zu bytes)", fn, path,
                        tg_state_dict_name(sd, i), nbytes);
      goto done;
    }
    st = tg_data(t, buf, nbytes); /* realizes lazy tensors and makes views contiguous */
    if (st == TG_OK) st = savefile_write(&sf, buf, nbytes);
    free(buf);
    if (st != TG_OK) goto done;
  }
  if ((st = savefile_finish(&sf)) == TG_OK) st = savefile_rename(&sf);
done:
  savefile_close(&sf);
  free(offs);
  free(layout);
  sb_free(&h);
  return st;
}
