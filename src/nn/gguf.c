/*
 * gguf.c -- GGUF (llama.cpp's model format, versions 2 and 3) -> tg_state_dict.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count, kv_count key/values
 * (string key, u32 type, value), tensor_count tensor infos (string name, u32 n_dims, u64 dims[n_dims]
 * innermost first, u32 ggml type, u64 offset), padding to general.alignment (default 32), data.
 *
 * In: untrusted bytes. Out: metadata rendered as text; tensors realized, dims reversed to row-major,
 * plain types in their dtype, quantized blocks dequantized to float32 exactly as ggml's reference
 * dequantizers do (float arithmetic in the same order). Errors: NULL + TG_ERR_IO "fn: path: what".
 * Invariants: every read is bounds-checked against the file; counts are checked against the bytes
 * left before anything is allocated from them; tensor byte ranges are aligned, inside the file and
 * do not overlap.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../helpers.h"
#include "state_dict.h"

#define GGUF_MAX_DIMS 8
#define GGUF_MAX_NEST 8 /* arrays of arrays */

/* ---- ggml types ---- */
enum { K_PLAIN, K_Q4_0, K_Q4_1, K_Q5_0, K_Q5_1, K_Q8_0, K_Q4_K, K_Q5_K, K_Q6_K, K_MXFP4, K_UNSUPPORTED };
typedef struct {
  uint32_t id;
  const char *name;
  uint32_t blck, tsize; /* elements per block, bytes per block */
  int kind;
  tg_dtype dt; /* result dtype */
} GType;

static const GType gtypes[] = {
    {0, "F32", 1, 4, K_PLAIN, TG_FLOAT32},      {1, "F16", 1, 2, K_PLAIN, TG_FLOAT16},
    {2, "Q4_0", 32, 18, K_Q4_0, TG_FLOAT32},    {3, "Q4_1", 32, 20, K_Q4_1, TG_FLOAT32},
    {6, "Q5_0", 32, 22, K_Q5_0, TG_FLOAT32},    {7, "Q5_1", 32, 24, K_Q5_1, TG_FLOAT32},
    {8, "Q8_0", 32, 34, K_Q8_0, TG_FLOAT32},    {9, "Q8_1", 32, 40, K_UNSUPPORTED, 0},
    {10, "Q2_K", 256, 84, K_UNSUPPORTED, 0},    {11, "Q3_K", 256, 110, K_UNSUPPORTED, 0},
    {12, "Q4_K", 256, 144, K_Q4_K, TG_FLOAT32}, {13, "Q5_K", 256, 176, K_Q5_K, TG_FLOAT32},
    {14, "Q6_K", 256, 210, K_Q6_K, TG_FLOAT32}, {15, "Q8_K", 256, 292, K_UNSUPPORTED, 0},
    {16, "IQ2_XXS", 256, 66, K_UNSUPPORTED, 0}, {17, "IQ2_XS", 256, 74, K_UNSUPPORTED, 0},
    {18, "IQ3_XXS", 256, 98, K_UNSUPPORTED, 0}, {19, "IQ1_S", 256, 50, K_UNSUPPORTED, 0},
    {20, "IQ4_NL", 32, 18, K_UNSUPPORTED, 0},   {21, "IQ3_S", 256, 110, K_UNSUPPORTED, 0},
    {22, "IQ2_S", 256, 82, K_UNSUPPORTED, 0},   {23, "IQ4_XS", 256, 136, K_UNSUPPORTED, 0},
    {24, "I8", 1, 1, K_PLAIN, TG_INT8},         {25, "I16", 1, 2, K_PLAIN, TG_INT16},
    {26, "I32", 1, 4, K_PLAIN, TG_INT32},       {27, "I64", 1, 8, K_PLAIN, TG_INT64},
    {28, "F64", 1, 8, K_PLAIN, TG_FLOAT64},     {29, "IQ1_M", 256, 56, K_UNSUPPORTED, 0},
    {30, "BF16", 1, 2, K_PLAIN, TG_BFLOAT16},   {34, "TQ1_0", 256, 54, K_UNSUPPORTED, 0},
    {35, "TQ2_0", 256, 66, K_UNSUPPORTED, 0},   {39, "MXFP4", 32, 17, K_MXFP4, TG_FLOAT32},
    {40, "NVFP4", 64, 36, K_UNSUPPORTED, 0},    {41, "Q1_0", 128, 18, K_UNSUPPORTED, 0},
};

static const GType *gtype_find(uint32_t id) {
  for (size_t i = 0; i < sizeof gtypes / sizeof gtypes[0]; i++)
    if (gtypes[i].id == id) return &gtypes[i];
  return NULL;
}

/* ---- bounds-checked reader ---- */
typedef struct {
  const uint8_t *start, *p, *end;
  const char *fn, *path;
} R;

static bool r_err(R *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool r_err(R *r, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  tg_set_error(TG_ERR_IO, "%s: %s: %s (at byte %zu)", r->fn, r->path, msg, (size_t)(r->p - r->start));
  return false;
}

static size_t r_left(const R *r) { return (size_t)(r->end - r->p); }

static bool r_need(R *r, size_t n, const char *what) {
  if (r_left(r) < n) return r_err(r, "truncated: %s needs %zu bytes, %zu left", what, n, r_left(r));
  return true;
}
static bool r_u32(R *r, uint32_t *v, const char *what) {
  if (!r_need(r, 4, what)) return false;
  *v = rd_u32le(r->p);
  r->p += 4;
  return true;
}
static bool r_u64(R *r, uint64_t *v, const char *what) {
  if (!r_need(r, 8, what)) return false;
  *v = rd_u64le(r->p);
  r->p += 8;
  return true;
}
/* A GGUF string: u64 length + bytes (not NUL-terminated). */
static bool r_str(R *r, const char **s, size_t *n, const char *what) {
  uint64_t len;
  if (!r_u64(r, &len, what)) return false;
  if (len > r_left(r)) {
    r->p -= 8;
    return r_err(r, "%s has length %llu but only %zu bytes are left", what, (unsigned long long)len,
                 r_left(r) - 8);
  }
  if (!utf8_valid(r->p, (size_t)len)) /* (gguf's reader and tinygrad's decode them as UTF-8 too) */
    return r_err(r, "%s is not valid UTF-8", what);
  *s = (const char *)r->p;
  *n = (size_t)len;
  r->p += len;
  return true;
}

/* ---- metadata values ---- */
enum {
  V_U8,
  V_I8,
  V_U16,
  V_I16,
  V_U32,
  V_I32,
  V_F32,
  V_BOOL,
  V_STRING,
  V_ARRAY,
  V_U64,
  V_I64,
  V_F64,
  V_COUNT
};
static const char *vtype_names[V_COUNT] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                           "int32",  "float32", "bool",   "string", "array",
                                           "uint64", "int64",   "float64"};
/* smallest encoding of one value of each type (a string is at least its length; an array its header) */
static const uint8_t vtype_min[V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 12, 8, 8, 8};

static void put_json_string(SB *b, const char *s, size_t n) {
  sb_putc(b, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      sb_putc(b, '\\'), sb_putc(b, (char)c);
    else if (c < 0x20)
      sb_printf(b, "\\u%04x", c);
    else
      sb_putc(b, (char)c);
  }
  sb_putc(b, '"');
}

/* Shortest decimal that reads back to the same value. */
static void put_float(SB *b, double v, bool single) {
  if (isnan(v)) return sb_puts(b, "nan");
  if (isinf(v)) return sb_puts(b, v < 0 ? "-inf" : "inf");
  char buf[64];
  for (int prec = 1; prec <= 17; prec++) { /* the shortest that reads back exactly */
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (single ? strtof(buf, NULL) == (float)v : strtod(buf, NULL) == v) break;
  }
  sb_puts(b, buf);
}

/* Reads one value of type `type` and appends its text to out. Top-level strings are raw (and must
 * not contain NUL); strings inside arrays are JSON-quoted. */
/* Rendering an array can take ~6x its bytes (int8 -128 -> "-128, "): past this many bytes of text the
 * rest is still parsed and validated, but the value becomes a summary. */
#define META_TEXT_CAP ((size_t)64 << 20)

static bool read_value(R *r, uint32_t type, SB *out, int depth, const char *key, bool *over) {
  uint64_t u;
  uint32_t w;
  switch (type) {
  case V_U8:
  case V_I8:
  case V_BOOL:
    if (!r_need(r, 1, "a metadata value")) return false;
    if (type == V_U8)
      sb_printf(out, "%u", r->p[0]);
    else if (type == V_I8)
      sb_printf(out, "%d", (int8_t)r->p[0]);
    else {
      if (r->p[0] > 1) return r_err(r, "metadata '%.200s': bool value %u is not 0 or 1", key, r->p[0]);
      sb_puts(out, r->p[0] ? "true" : "false");
    }
    r->p += 1;
    return true;
  case V_U16:
  case V_I16:
    if (!r_need(r, 2, "a metadata value")) return false;
    if (type == V_U16)
      sb_printf(out, "%u", rd_u16le(r->p));
    else
      sb_printf(out, "%d", (int16_t)rd_u16le(r->p));
    r->p += 2;
    return true;
  case V_U32:
  case V_I32:
  case V_F32:
    if (!r_u32(r, &w, "a metadata value")) return false;
    if (type == V_U32)
      sb_printf(out, "%u", w);
    else if (type == V_I32)
      sb_printf(out, "%d", (int32_t)w);
    else {
      float f;
      memcpy(&f, &w, 4);
      put_float(out, f, true);
    }
    return true;
  case V_U64:
  case V_I64:
  case V_F64:
    if (!r_u64(r, &u, "a metadata value")) return false;
    if (type == V_U64)
      sb_printf(out, "%llu", (unsigned long long)u);
    else if (type == V_I64)
      sb_printf(out, "%lld", (long long)(int64_t)u);
    else {
      double d;
      memcpy(&d, &u, 8);
      put_float(out, d, false);
    }
    return true;
  case V_STRING: {
    const char *s;
    size_t n;
    if (!r_str(r, &s, &n, "a metadata string")) return false;
    if (depth > 0) {
      put_json_string(out, s, n);
    } else {
      if (memchr(s, 0, n)) return r_err(r, "metadata '%.200s': string value contains a NUL byte", key);
      for (size_t i = 0; i < n; i++) sb_putc(out, s[i]);
    }
    return true;
  }
  case V_ARRAY: {
    uint32_t et;
    uint64_t count;
    if (depth >= GGUF_MAX_NEST)
      return r_err(r, "metadata '%.200s': arrays nested deeper than %d", key, GGUF_MAX_NEST);
    if (!r_u32(r, &et, "an array element type") || !r_u64(r, &count, "an array length")) return false;
    if (et >= V_COUNT) return r_err(r, "metadata '%.200s': unknown array element type %u", key, et);
    if (count > r_left(r) / vtype_min[et])
      return r_err(r, "metadata '%.200s': array of %llu %s values does not fit in the %zu bytes left", key,
                   (unsigned long long)count, vtype_names[et], r_left(r));
    sb_putc(out, '[');
    for (uint64_t i = 0; i < count; i++) {
      if (out->len > META_TEXT_CAP) {
        *over = true;
        out->len = 0; /* keep parsing into the same (now scratch) buffer */
      }
      if (i) sb_puts(out, ", ");
      if (!read_value(r, et, out, depth + 1, key, over)) return false;
    }
    sb_putc(out, ']');
    return true;
  }
  default:
    return r_err(r, "metadata '%.200s': unknown value type %u", key, type);
  }
}

/* ---- dequantization (ggml's reference order of float operations) ---- */
static inline float f16(const uint8_t *p) { return half_to_float(rd_u16le(p)); }

static void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

static float e8m0_half(uint8_t x) {
  uint32_t bits = x < 2 ? (0x00200000u << x) : ((uint32_t)(x - 1) << 23);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static void dequant_block(int kind, const uint8_t *b, float *y) {
  switch (kind) {
  case K_Q4_0: {
    float d = f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
      y[j] = (float)((qs[j] & 0xF) - 8) * d;
      y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
    break;
  }
  case K_Q4_1: {
    float d = f16(b), m = f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
      y[j] = (float)(qs[j] & 0xF) * d + m;
      y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
    break;
  }
  case K_Q5_0: {
    float d = f16(b);
    uint32_t qh = rd_u32le(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
      int xh0 = (int)(((qh >> j) << 4) & 0x10), xh1 = (int)((qh >> (j + 12)) & 0x10);
      y[j] = (float)(((qs[j] & 0xF) | xh0) - 16) * d;
      y[j + 16] = (float)(((qs[j] >> 4) | xh1) - 16) * d;
    }
    break;
  }
  case K_Q5_1: {
    float d = f16(b), m = f16(b + 2);
    uint32_t qh = rd_u32le(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
      int xh0 = (int)(((qh >> j) << 4) & 0x10), xh1 = (int)((qh >> (j + 12)) & 0x10);
      y[j] = (float)((qs[j] & 0xF) | xh0) * d + m;
      y[j + 16] = (float)((qs[j] >> 4) | xh1) * d + m;
    }
    break;
  }
  case K_Q8_0: {
    float d = f16(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
    break;
  }
  case K_Q4_K: {
    float d = f16(b), dmin = f16(b + 2);
    const uint8_t *sc = b + 4, *q = b + 16;
    int is = 0;
    for (int j = 0; j < 256; j += 64) {
      uint8_t s, m;
      get_scale_min_k4(is, sc, &s, &m);
      float d1 = d * s, m1 = dmin * m;
      get_scale_min_k4(is + 1, sc, &s, &m);
      float d2 = d * s, m2 = dmin * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
    break;
  }
  case K_Q5_K: {
    float d = f16(b), dmin = f16(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + 48;
    int is = 0;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 256; j += 64) {
      uint8_t s, m;
      get_scale_min_k4(is, sc, &s, &m);
      float d1 = d * s, m1 = dmin * m;
      get_scale_min_k4(is + 1, sc, &s, &m);
      float d2 = d * s, m2 = dmin * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 = (uint8_t)(u1 << 2);
      u2 = (uint8_t)(u2 << 2);
    }
    break;
  }
  case K_Q6_K: {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16(b + 208);
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; l++) {
        int is = l / 16;
        int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * (float)sc[is] * (float)q1;
        y[l + 32] = d * (float)sc[is + 2] * (float)q2;
        y[l + 64] = d * (float)sc[is + 4] * (float)q3;
        y[l + 96] = d * (float)sc[is + 6] * (float)q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
    break;
  }
  case K_MXFP4: {
    static const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    float d = e8m0_half(b[0]);
    for (int j = 0; j < 16; j++) {
      y[j] = (float)kv[b[1 + j] & 0xF] * d;
      y[j + 16] = (float)kv[b[1 + j] >> 4] * d;
    }
    break;
  }
  default:
    TG_ASSERT(0);
  }
}

/* ---- loading ---- */
typedef struct {
  const char *name;
  size_t name_len;
  int ndim;
  const uint8_t *dims; /* in the file: ndim u64, GGUF order (innermost first) */
  const GType *type;
  uint64_t offset, nbytes;
  int64_t numel;
} TInfo;

static int cmp_tinfo(const void *a, const void *b) {
  const TInfo *x = *(TInfo *const *)a, *y = *(TInfo *const *)b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

tg_state_dict *gguf_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len) {
  R r = {.start = data, .p = data, .end = data + len, .fn = fn, .path = path};
  tg_state_dict *sd = tg_state_dict_new();
  TInfo *ti = NULL, **order = NULL;
  float *deq = NULL;
  SB val;
  sb_init(&val);
  bool ok = false;
  uint32_t version;
  uint64_t ntensors, nkv, alignment = 32;

  if (len < 4 || memcmp(data, "GGUF", 4) != 0) {
    tg_set_error(TG_ERR_IO, "%s: %s: not a GGUF file (the first 4 bytes are not \"GGUF\")", fn, path);
    goto out;
  }
  r.p += 4;
  if (!r_u32(&r, &version, "the version")) goto out;
  if (version == 0x02000000u || version == 0x03000000u) {
    r_err(&r, "big-endian GGUF files are not supported");
    goto out;
  }
  if (version != 2 && version != 3) {
    r_err(&r, "GGUF version %u is not supported (only versions 2 and 3)", version);
    goto out;
  }
  if (!r_u64(&r, &ntensors, "the tensor count") || !r_u64(&r, &nkv, "the metadata count")) goto out;
  if (nkv > r_left(&r) / 13) {
    r_err(&r, "metadata count %llu cannot fit in the %zu bytes left", (unsigned long long)nkv, r_left(&r));
    goto out;
  }

  for (uint64_t i = 0; i < nkv; i++) {
    const char *key;
    size_t klen;
    uint32_t type;
    if (!r_str(&r, &key, &klen, "a metadata key") || !r_u32(&r, &type, "a metadata type")) goto out;
    if (klen == 0) {
      r_err(&r, "metadata key %llu is empty", (unsigned long long)i);
      goto out;
    }
    char kbuf[256];
    snprintf(kbuf, sizeof kbuf, "%.*s", (int)(klen < 200 ? klen : 200), key);
    if (type >= V_COUNT) {
      r_err(&r, "metadata '%s' has unknown type %u", kbuf, type);
      goto out;
    }
    if (klen == 17 && memcmp(key, "general.alignment", 17) == 0) {
      uint32_t a;
      if (type != V_U32) {
        r_err(&r, "general.alignment has type %s, expected uint32", vtype_names[type]);
        goto out;
      }
      if (!r_u32(&r, &a, "general.alignment")) goto out;
      if (a == 0 || (a & (a - 1))) {
        r_err(&r, "general.alignment %u is not a power of two", a);
        goto out;
      }
      alignment = a;
      r.p -= 4;
    }
    val.len = 0;
    sb_puts(&val, "");
    bool over = false;
    const uint8_t *vstart = r.p;
    if (!read_value(&r, type, &val, 0, kbuf, &over)) goto out;
    if (over) { /* only arrays can overflow: summarize from the array's own header */
      val.len = 0;
      sb_printf(&val, "[array of %llu %s, %zu bytes: too large to render]",
                (unsigned long long)rd_u64le(vstart + 4), vtype_names[rd_u32le(vstart)],
                (size_t)(r.p - vstart));
    }
    if (sd_meta_put(sd, fn, path, key, klen, val.s, val.len, true) != TG_OK) goto out;
  }

  /* tensor infos: each takes at least 24 bytes */
  if (ntensors > r_left(&r) / 24) {
    r_err(&r, "tensor count %llu cannot fit in the %zu bytes left", (unsigned long long)ntensors, r_left(&r));
    goto out;
  }
  /* ~2.5x the 24 bytes each info takes in the file at least; a failed allocation is an error, not an abort */
  ti = calloc(ntensors ? (size_t)ntensors : 1, sizeof(TInfo));
  if (!ti) {
    tg_set_error(TG_ERR_RUNTIME, "%s: %s: out of memory for %llu tensor infos", fn, path,
                 (unsigned long long)ntensors);
    goto out;
  }
  for (uint64_t i = 0; i < ntensors; i++) {
    TInfo *t = &ti[i];
    uint32_t nd, type;
    if (!r_str(&r, &t->name, &t->name_len, "a tensor name") || !r_u32(&r, &nd, "a tensor's dimension count"))
      goto out;
    if (t->name_len == 0 || memchr(t->name, 0, t->name_len)) {
      r_err(&r, "tensor %llu has an empty name or one with a NUL byte", (unsigned long long)i);
      goto out;
    }
    int nl = (int)(t->name_len < 200 ? t->name_len : 200);
    if (nd > GGUF_MAX_DIMS) {
      r_err(&r, "tensor '%.*s' has %u dimensions (at most %d)", nl, t->name, nd, GGUF_MAX_DIMS);
      goto out;
    }
    t->ndim = (int)nd;
    t->dims = r.p;
    int64_t numel = 1, nonzero = 1; /* a zero dimension does not excuse the others (tg_from_data's rule) */
    for (uint32_t d = 0; d < nd; d++) {
      uint64_t v;
      if (!r_u64(&r, &v, "a tensor dimension")) goto out;
      if (v > ((uint64_t)1 << 48) || (v && __builtin_mul_overflow(nonzero, (int64_t)v, &nonzero)) ||
          nonzero > ((int64_t)1 << 48)) {
        r_err(&r, "tensor '%.*s' is too large (dimension %llu: its non-zero dimensions multiply past 2^48)", nl,
              t->name, (unsigned long long)v);
        goto out;
      }
      numel *= (int64_t)v;
    }
    t->numel = numel;
    if (!r_u32(&r, &type, "a tensor type") || !r_u64(&r, &t->offset, "a tensor offset")) goto out;
    t->type = gtype_find(type);
    if (!t->type) {
      r_err(&r, "tensor '%.*s' has unknown ggml type %u", nl, t->name, type);
      goto out;
    }
    if (t->type->kind == K_UNSUPPORTED) {
      r_err(&r,
            "tensor '%.*s' has type %s, which is not supported (supported: F32 F16 BF16 F64 I8 I16 I32 I64 "
            "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 "
            "Q4_K Q5_K Q6_K MXFP4)",
            nl, t->name, t->type->name);
      goto out;
    }
    int64_t inner = nd ? (int64_t)rd_u64le(t->dims) : 1;
    if (inner % t->type->blck) {
      r_err(&r, "tensor '%.*s': first dimension %lld is not a multiple of the %s block size %u", nl, t->name,
            (long long)inner, t->type->name, t->type->blck);
      goto out;
    }
    t->nbytes = (uint64_t)(numel / t->type->blck) * t->type->tsize; /* < 2^48 * 292: no overflow */
    if (t->offset % alignment) {
      r_err(&r, "tensor '%.*s': offset %llu is not a multiple of the alignment %llu", nl, t->name,
            (unsigned long long)t->offset, (unsigned long long)alignment);
      goto out;
    }
  }
  size_t pos = (size_t)(r.p - data);
  uint64_t data_start = ((uint64_t)pos + alignment - 1) / alignment * alignment;
  if (ntensors && data_start > len) {
    tg_set_error(TG_ERR_IO, "%s: %s: truncated: the tensor data would start at byte %llu of a %zu-byte file",
                 fn, path, (unsigned long long)data_start, len);
    goto out;
  }
  uint64_t dlen = ntensors ? len - data_start : 0;
  order = malloc((ntensors ? (size_t)ntensors : 1) * sizeof(TInfo *));
  if (!order) {
    tg_set_error(TG_ERR_RUNTIME, "%s: %s: out of memory for %llu tensor infos", fn, path,
                 (unsigned long long)ntensors);
    goto out;
  }
  for (uint64_t i = 0; i < ntensors; i++) {
    TInfo *t = &ti[i];
    if (t->offset > dlen || t->nbytes > dlen - t->offset) {
      tg_set_error(
          TG_ERR_IO,
          "%s: %s: tensor '%.*s' (%llu bytes at data offset %llu) runs past the end of the file (truncated?)",
          fn, path, (int)(t->name_len < 200 ? t->name_len : 200), t->name, (unsigned long long)t->nbytes,
          (unsigned long long)t->offset);
      goto out;
    }
    order[i] = t;
  }
  qsort(order, (size_t)ntensors, sizeof(TInfo *), cmp_tinfo);
  for (uint64_t i = 1; i < ntensors; i++) {
    TInfo *a = order[i - 1], *b = order[i];
    if (b->offset < a->offset + a->nbytes) {
      tg_set_error(TG_ERR_IO, "%s: %s: tensors '%.*s' and '%.*s' overlap", fn, path,
                   (int)(a->name_len < 200 ? a->name_len : 200), a->name,
                   (int)(b->name_len < 200 ? b->name_len : 200), b->name);
      goto out;
    }
  }

  for (uint64_t i = 0; i < ntensors; i++) {
    TInfo *t = &ti[i];
    const uint8_t *src = data + data_start + t->offset;
    int64_t shape[GGUF_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) shape[d] = (int64_t)rd_u64le(t->dims + 8 * (size_t)(t->ndim - 1 - d));
    tg_tensor h;
    if (t->type->kind == K_PLAIN) {
      h = tg_from_data(t->nbytes ? src : NULL, shape, t->ndim, TG_OPTS(.dtype = t->type->dt));
    } else {
      deq = malloc(t->numel ? (size_t)t->numel * sizeof(float) : 1);
      if (!deq) {
        tg_set_error(TG_ERR_RUNTIME, "%s: %s: out of memory dequantizing tensor '%.*s' (%lld elements)", fn,
                     path, (int)(t->name_len < 200 ? t->name_len : 200), t->name, (long long)t->numel);
        goto out;
      }
      int64_t nblocks = t->numel / t->type->blck;
      for (int64_t k = 0; k < nblocks; k++)
        dequant_block(t->type->kind, src + (size_t)k * t->type->tsize, deq + (size_t)k * t->type->blck);
      h = tg_from_data(deq, shape, t->ndim, TG_OPTS(.dtype = TG_FLOAT32));
      free(deq);
      deq = NULL;
    }
    if (!h.id) goto out;
    sd_release_bytes(src, (size_t)t->nbytes); /* copied: a file's pages can go */
    if (sd_put(sd, fn, path, t->name, t->name_len, h, true) != TG_OK) goto out;
  }
  ok = true;
out:
  free(ti);
  free(order);
  free(deq);
  sb_free(&val);
  if (!ok) {
    tg_state_dict_free(sd);
    return NULL;
  }
  return sd;
}

tg_state_dict *tg_gguf_load(const char *path) {
  FileView fv;
  if (file_view_open(&fv, "tg_gguf_load", path, false) != TG_OK) return NULL;
  tg_state_dict *sd = gguf_load_mem("tg_gguf_load", path, fv.data, fv.len);
  file_view_close(&fv);
  return sd;
}
