/*
 * dtype.c -- element-type metadata, tinygrad's promotion lattice, and conversions between host
 * values (double / int64) and element storage, including float16, bfloat16 and fp8 bit patterns.
 *
 * In: a tg_dtype (0 = TG_DTYPE_DEFAULT and out-of-range values are "invalid" everywhere except where
 * a function says otherwise). Out: static metadata, a promoted dtype, or converted values.
 * Invariants: the table is indexed by tg_dtype and covers every real dtype; conversions never invoke
 * undefined behaviour (out-of-range float -> int casts are defined here: NaN -> 0, in-range values
 * truncate toward zero and wrap to the target width, values beyond int64 saturate first); float16 and
 * bfloat16 rounding is round-to-nearest-even done once from the exact source value.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "helpers.h"

/* cname is the C spelling used by the C renderer. float16 uses _Float16 (arithmetic type on gcc >= 12
 * for x86-64); bfloat16 has no portable C type, so it is stored as its 16 raw bits and the renderer
 * converts explicitly. */
static const DTypeInfo dtype_table[TG_DTYPE_COUNT] = {
    [TG_BOOL] = {"bool", "_Bool", 1, 'b'},
    [TG_INT8] = {"char", "signed char", 1, 'i'},
    [TG_INT16] = {"short", "short", 2, 'i'},
    [TG_INT32] = {"int", "int", 4, 'i'},
    [TG_INT64] = {"long", "long long", 8, 'i'},
    [TG_UINT8] = {"uchar", "unsigned char", 1, 'u'},
    [TG_UINT16] = {"ushort", "unsigned short", 2, 'u'},
    [TG_UINT32] = {"uint", "unsigned int", 4, 'u'},
    [TG_UINT64] = {"ulong", "unsigned long long", 8, 'u'},
    [TG_FLOAT16] = {"half", "_Float16", 2, 'f'},
    [TG_BFLOAT16] = {"bfloat16", "unsigned short", 2, 'f'},
    [TG_FLOAT32] = {"float", "float", 4, 'f'},
    [TG_FLOAT64] = {"double", "double", 8, 'f'},
    [TG_FP8E4M3] = {"float8_e4m3", "unsigned char", 1, 'f'},
    [TG_FP8E5M2] = {"float8_e5m2", "unsigned char", 1, 'f'},
    [TG_FP8E4M3FNUZ] = {"float8_e4m3fnuz", "unsigned char", 1, 'f'},
    [TG_FP8E5M2FNUZ] = {"float8_e5m2fnuz", "unsigned char", 1, 'f'},
};

bool dtype_valid(tg_dtype dt) { return (int)dt > 0 && (int)dt < TG_DTYPE_COUNT; }

const DTypeInfo *dtype_info(tg_dtype dt) { return dtype_valid(dt) ? &dtype_table[dt] : NULL; }

const char *tg_dtype_name(tg_dtype dt) {
  if (dt == TG_DTYPE_DEFAULT) return "default";
  return dtype_valid(dt) ? dtype_table[dt].name : "invalid";
}

size_t tg_dtype_itemsize(tg_dtype dt) { return dtype_valid(dt) ? (size_t)dtype_table[dt].itemsize : 0; }
bool tg_dtype_is_float(tg_dtype dt) { return dtype_valid(dt) && dtype_table[dt].kind == 'f'; }
bool tg_dtype_is_int(tg_dtype dt) {
  return dtype_valid(dt) && (dtype_table[dt].kind == 'i' || dtype_table[dt].kind == 'u');
}
bool tg_dtype_is_unsigned(tg_dtype dt) { return dtype_valid(dt) && dtype_table[dt].kind == 'u'; }

/* Every spelling a user may know: tinygrad's attribute names and aliases, tinygrad's DType.name
 * strings (C spellings), and numpy/torch names. Matched case-insensitively, as tinygrad's to_dtype
 * lowercases. */
static const struct {
  const char *name;
  tg_dtype dt;
} dtype_names[] = {
    {"bool", TG_BOOL},
    {"int8", TG_INT8},
    {"char", TG_INT8},
    {"signed char", TG_INT8},
    {"int16", TG_INT16},
    {"short", TG_INT16},
    {"int32", TG_INT32},
    {"int", TG_INT32},
    {"int64", TG_INT64},
    {"long", TG_INT64},
    {"long long", TG_INT64},
    {"uint8", TG_UINT8},
    {"uchar", TG_UINT8},
    {"unsigned char", TG_UINT8},
    {"uint16", TG_UINT16},
    {"ushort", TG_UINT16},
    {"unsigned short", TG_UINT16},
    {"uint32", TG_UINT32},
    {"uint", TG_UINT32},
    {"unsigned int", TG_UINT32},
    {"uint64", TG_UINT64},
    {"ulong", TG_UINT64},
    {"unsigned long", TG_UINT64},
    {"unsigned long long", TG_UINT64},
    {"float16", TG_FLOAT16},
    {"half", TG_FLOAT16},
    {"bfloat16", TG_BFLOAT16},
    {"__bf16", TG_BFLOAT16},
    {"float32", TG_FLOAT32},
    {"float", TG_FLOAT32},
    {"float64", TG_FLOAT64},
    {"double", TG_FLOAT64},
    {"fp8e4m3", TG_FP8E4M3},
    {"float8_e4m3", TG_FP8E4M3},
    {"float8_e4m3fn", TG_FP8E4M3},
    {"fp8e5m2", TG_FP8E5M2},
    {"float8_e5m2", TG_FP8E5M2},
    {"fp8e4m3fnuz", TG_FP8E4M3FNUZ},
    {"float8_e4m3fnuz", TG_FP8E4M3FNUZ},
    {"fp8e5m2fnuz", TG_FP8E5M2FNUZ},
    {"float8_e5m2fnuz", TG_FP8E5M2FNUZ},
};

tg_dtype dtype_from_name(const char *name) {
  if (!name) return TG_DTYPE_DEFAULT;
  for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
    if (strcasecmp(name, dtype_names[i].name) == 0) return dtype_names[i].dt;
  return TG_DTYPE_DEFAULT;
}

tg_dtype tg_default_float(void) {
  const char *s = getenv_str("DEFAULT_FLOAT", NULL);
  if (!s || !*s) return TG_FLOAT32;
  tg_dtype dt = dtype_from_name(s);
  if (tg_dtype_is_float(dt)) return dt;
  env_warn("DEFAULT_FLOAT", s, "not a float dtype: float32, half/float16, bfloat16 or float64", "float32");
  return TG_FLOAT32;
}

/* ---- promotion ----
 * tinygrad's lattice (JAX JEP 9407 without complex). A signed integer and uint64 share no integer
 * supertype; in tinygrad they meet at the weak float, which becomes the default float once
 * materialised. We model that weak float as one extra node. The fp8 types sit between the weak float and
 * half/bfloat16: an integer meets an fp8 at the fp8, two different fp8s meet at float16. */
enum { NODE_WEAKFLOAT = TG_DTYPE_COUNT, NODE_COUNT };

/* Edges as bitmasks of direct parents. */
static const unsigned lattice_up[NODE_COUNT] = {
    [TG_BOOL] = 1u << TG_INT8 | 1u << TG_UINT8,
    [TG_INT8] = 1u << TG_INT16,
    [TG_INT16] = 1u << TG_INT32,
    [TG_INT32] = 1u << TG_INT64,
    [TG_INT64] = 1u << NODE_WEAKFLOAT,
    [TG_UINT8] = 1u << TG_INT16 | 1u << TG_UINT16,
    [TG_UINT16] = 1u << TG_INT32 | 1u << TG_UINT32,
    [TG_UINT32] = 1u << TG_INT64 | 1u << TG_UINT64,
    [TG_UINT64] = 1u << NODE_WEAKFLOAT,
    [NODE_WEAKFLOAT] = 1u << TG_FP8E4M3 | 1u << TG_FP8E5M2 | 1u << TG_FP8E4M3FNUZ | 1u << TG_FP8E5M2FNUZ,
    [TG_FP8E4M3] = 1u << TG_FLOAT16 | 1u << TG_BFLOAT16,
    [TG_FP8E5M2] = 1u << TG_FLOAT16 | 1u << TG_BFLOAT16,
    [TG_FP8E4M3FNUZ] = 1u << TG_FLOAT16 | 1u << TG_BFLOAT16,
    [TG_FP8E5M2FNUZ] = 1u << TG_FLOAT16 | 1u << TG_BFLOAT16,
    [TG_FLOAT16] = 1u << TG_FLOAT32,
    [TG_BFLOAT16] = 1u << TG_FLOAT32,
    [TG_FLOAT32] = 1u << TG_FLOAT64,
    [TG_FLOAT64] = 0,
};

/* The lattice's total order used to pick the least of the common supertypes (tinygrad's DType
 * priority; it differs from the enum order: uint8 ranks between int8 and int16). */
static const int lattice_order[] = {TG_BOOL,     TG_INT8,        TG_UINT8,   TG_INT16,       TG_UINT16,
                                    TG_INT32,    TG_UINT32,      TG_INT64,   TG_UINT64,      NODE_WEAKFLOAT,
                                    TG_FP8E4M3,  TG_FP8E4M3FNUZ, TG_FP8E5M2, TG_FP8E5M2FNUZ, TG_FLOAT16,
                                    TG_BFLOAT16, TG_FLOAT32,     TG_FLOAT64};

static unsigned lattice_closure(int node) {
  unsigned mask = 1u << node;
  /* The lattice is small and acyclic: iterate to a fixed point instead of recursing. */
  for (;;) {
    unsigned next = mask;
    for (int n = 0; n < NODE_COUNT; n++)
      if (mask & (1u << n)) next |= lattice_up[n];
    if (next == mask) return mask;
    mask = next;
  }
}

tg_dtype tg_dtype_promote(tg_dtype a, tg_dtype b) {
  if (!dtype_valid(a) || !dtype_valid(b)) {
    tg_set_error(TG_ERR_INVALID, "tg_dtype_promote: invalid dtype (%d, %d)", (int)a, (int)b);
    return TG_DTYPE_DEFAULT;
  }
  if (a == b) return a;
  unsigned common = lattice_closure(a) & lattice_closure(b);
  for (size_t i = 0; i < sizeof lattice_order / sizeof lattice_order[0]; i++) {
    int n = lattice_order[i];
    if (common & (1u << n)) return n == NODE_WEAKFLOAT ? tg_default_float() : (tg_dtype)n;
  }
  TG_ASSERT(0 && "float64 is above every dtype");
}

tg_dtype dtype_sum_acc(tg_dtype dt) {
  switch (dt) {
  case TG_BOOL:
  case TG_INT8:
  case TG_INT16:
    return TG_INT32;
  case TG_UINT8:
  case TG_UINT16:
    return TG_UINT32;
  case TG_FLOAT16:
  case TG_BFLOAT16:
  case TG_FP8E4M3:
  case TG_FP8E5M2:
  case TG_FP8E4M3FNUZ:
  case TG_FP8E5M2FNUZ:
    return TG_FLOAT32;
  default:
    return dt;
  }
}

/* Identities of max/min reductions as tinygrad defines them: +-inf for floats, the integer range for
 * ints, 0/1 for bool. int64/uint64 limits are not exact in double (they round to +-2^63 / 2^64). */
double dtype_min(tg_dtype dt) {
  switch (dt) {
  case TG_BOOL:
    return 0;
  case TG_INT8:
    return INT8_MIN;
  case TG_INT16:
    return INT16_MIN;
  case TG_INT32:
    return INT32_MIN;
  case TG_INT64:
    return (double)INT64_MIN;
  case TG_UINT8:
  case TG_UINT16:
  case TG_UINT32:
  case TG_UINT64:
    return 0;
  case TG_FLOAT16:
  case TG_BFLOAT16:
  case TG_FLOAT32:
  case TG_FLOAT64:
  case TG_FP8E5M2:
    return -INFINITY;
  case TG_FP8E4M3:
    return -448; /* no inf: its lowest value */
  case TG_FP8E4M3FNUZ:
    return -240;
  case TG_FP8E5M2FNUZ:
    return -57344;
  default:
    return 0;
  }
}

double dtype_max(tg_dtype dt) {
  switch (dt) {
  case TG_BOOL:
    return 1;
  case TG_INT8:
    return INT8_MAX;
  case TG_INT16:
    return INT16_MAX;
  case TG_INT32:
    return INT32_MAX;
  case TG_INT64:
    return (double)INT64_MAX;
  case TG_UINT8:
    return UINT8_MAX;
  case TG_UINT16:
    return UINT16_MAX;
  case TG_UINT32:
    return UINT32_MAX;
  case TG_UINT64:
    return (double)UINT64_MAX;
  case TG_FLOAT16:
  case TG_BFLOAT16:
  case TG_FLOAT32:
  case TG_FLOAT64:
  case TG_FP8E5M2:
    return INFINITY;
  case TG_FP8E4M3:
    return 448;
  case TG_FP8E4M3FNUZ:
    return 240;
  case TG_FP8E5M2FNUZ:
    return 57344;
  default:
    return 0;
  }
}

/* ---- float16 / bfloat16 ---- */

static uint64_t double_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

/* Rounds a double to a binary format with `mbits` stored mantissa bits and exponent bias `bias`
 * (5/15 for half, 8/127 for bfloat16), nearest-even, with subnormals, overflow to inf and a quiet
 * NaN that keeps the sign. Working from the double's bits makes the rounding single-step for both
 * float and double inputs. */
static uint16_t round_to_small_float(double d, int ebits, int mbits) {
  uint64_t u = double_bits(d);
  uint16_t sign = (uint16_t)((u >> 63) << 15);
  uint64_t frac = u & ((1ULL << 52) - 1);
  int exp_field = (int)((u >> 52) & 0x7ff);
  uint16_t exp_all = (uint16_t)(((1u << ebits) - 1) << mbits);
  if (exp_field == 0x7ff) {
    if (frac == 0) return sign | exp_all;
    return sign | exp_all | (uint16_t)(1u << (mbits - 1)); /* quiet NaN */
  }
  if (exp_field == 0) return sign; /* zero or double subnormal: far below every small subnormal */
  int bias = (1 << (ebits - 1)) - 1;
  int e = exp_field - 1023;
  uint64_t m = frac | (1ULL << 52);
  int shift;     /* bits of m dropped */
  uint32_t base; /* exponent field placed above the kept mantissa */
  if (e >= 1 - bias) {
    shift = 52 - mbits;
    base = (uint32_t)(e + bias) << mbits;
    if (e + bias >= (1 << ebits) - 1) return sign | exp_all; /* overflow */
    m &= (1ULL << 52) - 1;                                   /* implicit bit lives in base */
  } else {
    shift = 52 - mbits + (1 - bias - e);
    base = 0;
    if (shift >= 64) return sign;
  }
  uint64_t kept = m >> shift;
  uint64_t rest = m & ((1ULL << shift) - 1);
  uint64_t half = 1ULL << (shift - 1);
  uint32_t r = base + (uint32_t)kept;
  if (rest > half || (rest == half && (kept & 1))) r++; /* a carry into the exponent is correct */
  if (r >= exp_all) return sign | exp_all;
  return sign | (uint16_t)r;
}

static double small_float_to_double(uint16_t h, int ebits, int mbits) {
  int sign = h >> 15;
  int exp_field = (h >> mbits) & ((1 << ebits) - 1);
  int mant = h & ((1 << mbits) - 1);
  int bias = (1 << (ebits - 1)) - 1;
  double v;
  if (exp_field == (1 << ebits) - 1)
    v = mant ? NAN : INFINITY;
  else if (exp_field == 0)
    v = ldexp(mant, 1 - bias - mbits);
  else
    v = ldexp(mant | (1 << mbits), exp_field - bias - mbits);
  return sign ? -v : v;
}

float half_to_float(uint16_t h) { return (float)small_float_to_double(h, 5, 10); }
uint16_t float_to_half(float f) { return round_to_small_float(f, 5, 10); }
float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t float_to_bf16(float f) { return round_to_small_float(f, 8, 7); }

/* ---- fp8 ----
 * tinygrad's conversions, nearest-even from the double's bits (one rounding for float and double
 * sources). Four formats differ in mantissa bits, bias and what their top codes mean:
 *  - OCP e4m3 (bias 7): no inf; 0x7f / 0xff are NaN, and inf and NaN both become NaN (0x7f | sign);
 *  - OCP e5m2 (bias 15): IEEE-like, exponent 31 holds inf (0x7c) and NaN (0x7d..0x7f);
 *  - fnuz e4m3 / e5m2 (bias 8 / 16, AMD's): every exponent is finite, 0x80 (the would-be -0) is the
 *    one NaN, there is no inf and no -0: inf and NaN become 0x80, a result of zero is +0.
 * Finite values at or past halfway beyond the largest code saturate to it (for OCP e4m3 that halfway
 * point, 464, rounds to 448 anyway). */
enum { FP8_E4M3, FP8_E5M2, FP8_FNUZ };
typedef struct {
  int mant, bias, kind;
  uint8_t maxcode; /* the largest finite code */
  uint64_t sat;    /* double bits from which finite values saturate to maxcode */
} Fp8Format;
static const Fp8Format fp8_formats[] = {
    [TG_FP8E4M3 - TG_FP8E4M3] = {3, 7, FP8_E4M3, 0x7e, 0x407D000000000000ULL},      /* 448, from 464 */
    [TG_FP8E5M2 - TG_FP8E4M3] = {2, 15, FP8_E5M2, 0x7b, 0x40EE000000000000ULL},     /* 57344, from 61440 */
    [TG_FP8E4M3FNUZ - TG_FP8E4M3] = {3, 8, FP8_FNUZ, 0x7f, 0x406F000000000000ULL},  /* 240, from 248 */
    [TG_FP8E5M2FNUZ - TG_FP8E4M3] = {2, 16, FP8_FNUZ, 0x7f, 0x40EE000000000000ULL}, /* 57344, from 61440 */
};

bool dtype_is_fp8(tg_dtype dt) { return dt >= TG_FP8E4M3 && dt <= TG_FP8E5M2FNUZ; }

int dtype_mant_bits(tg_dtype dt) {
  if (dtype_is_fp8(dt)) return fp8_formats[dt - TG_FP8E4M3].mant;
  return dt == TG_FLOAT16 ? 10 : dt == TG_BFLOAT16 ? 7 : 0;
}

uint8_t double_to_fp8(double d, tg_dtype dt) {
  TG_ASSERT(dtype_is_fp8(dt));
  const Fp8Format *f = &fp8_formats[dt - TG_FP8E4M3];
  int M = f->mant, B = f->bias, kind = f->kind;
  uint64_t x = double_bits(d), a = x & 0x7fffffffffffffffULL;
  uint8_t s = (uint8_t)((x >> 56) & 0x80);
  if (a >= 0x7ff0000000000000ULL) {
    if (kind == FP8_FNUZ) return 0x80;
    if (kind == FP8_E4M3) return s | 0x7f;
    return s | (a > 0x7ff0000000000000ULL ? 0x7f : 0x7c);
  }
  if (a >= f->sat) return s | f->maxcode;
  int E = (int)(a >> 52) - 1023;
  unsigned r;
  if (E >= 1 - B) { /* normal: keep M mantissa bits */
    int sh = 52 - M;
    uint64_t rb = a & ((1ULL << sh) - 1), h = 1ULL << (sh - 1);
    r = ((unsigned)(E + B) << M) | (unsigned)((a >> sh) & ((1u << M) - 1));
    if (rb > h || (rb == h && (r & 1))) r++;
  } else if (E < -B - M) { /* below half the smallest subnormal */
    r = 0;
  } else {
    int sh = 53 - B - M - E; /* subnormal: the significand's bits above 2^(1-B-M) */
    uint64_t m = (a & 0xfffffffffffffULL) | (1ULL << 52), rm = m & ((1ULL << sh) - 1), h = 1ULL << (sh - 1);
    r = (unsigned)(m >> sh);
    if (rm > h || (rm == h && (r & 1))) r++;
  }
  if (r == 0 && kind == FP8_FNUZ) return 0; /* no -0 */
  return s | (uint8_t)r;
}

double fp8_to_double(uint8_t b, tg_dtype dt) {
  TG_ASSERT(dtype_is_fp8(dt));
  const Fp8Format *f = &fp8_formats[dt - TG_FP8E4M3];
  int M = f->mant, B = f->bias, kind = f->kind;
  int emax = (1 << (7 - M)) - 1, e = (b >> M) & emax, m = b & ((1 << M) - 1);
  if (kind == FP8_FNUZ && b == 0x80) return NAN;
  double v;
  if (kind == FP8_E5M2 && e == emax) v = m ? NAN : INFINITY;
  else if (kind == FP8_E4M3 && e == emax && m == (1 << M) - 1) v = NAN;
  else if (e == 0) v = ldexp(m, 1 - B - M);
  else v = ldexp(m | (1 << M), e - B - M);
  return (b & 0x80) ? -v : v;
}

/* ---- host value <-> storage ---- */

/* double -> int64 with C truncation where defined; NaN -> 0 and out-of-range saturates, so the
 * conversion is total. */
static int64_t double_to_i64(double v) {
  if (isnan(v)) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v < -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

int64_t double_wrap_i64(double v) {
  if (!isfinite(v)) return 0;
  v = trunc(v);
  if (v >= -9223372036854775808.0 && v < 9223372036854775808.0) return (int64_t)v;
  double m = fmod(v, 18446744073709551616.0); /* exact; |v| >= 2^63 is a multiple of 2^11 */
  if (m < 0) m += 18446744073709551616.0;
  return (int64_t)(m >= 9223372036854775808.0 ? (uint64_t)(m - 9223372036854775808.0) + ((uint64_t)1 << 63) : (uint64_t)m);
}

static uint64_t double_to_u64_bits(double v) {
  /* values in [2^63, 2^64) only fit the unsigned conversion */
  if (v >= 9223372036854775808.0 && v < 18446744073709551616.0) return (uint64_t)v;
  return (uint64_t)double_to_i64(v);
}

/* int64 -> double rounded to odd when inexact: a later rounding to 24 or fewer bits then equals a
 * single rounding of the exact integer. */
static double i64_to_double_sticky(int64_t v) {
  uint64_t a = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  int k = 0;
  while ((a >> k) >= (1ULL << 53)) k++;
  uint64_t m = a >> k;
  if (k && (a & ((1ULL << k) - 1))) m |= 1;
  double d = ldexp((double)m, k);
  return v < 0 ? -d : d;
}

static void store_bits(tg_dtype dt, void *dst, uint64_t bits) {
  switch (dtype_table[dt].itemsize) {
  case 1: {
    uint8_t x = (uint8_t)bits;
    memcpy(dst, &x, 1);
    break;
  }
  case 2: {
    uint16_t x = (uint16_t)bits;
    memcpy(dst, &x, 2);
    break;
  }
  case 4: {
    uint32_t x = (uint32_t)bits;
    memcpy(dst, &x, 4);
    break;
  }
  default:
    memcpy(dst, &bits, 8);
    break;
  }
}

void dtype_store(tg_dtype dt, void *dst, double v) {
  TG_ASSERT(dtype_valid(dt));
  switch (dt) {
  case TG_BOOL: {
    uint8_t b = v != 0;
    memcpy(dst, &b, 1);
    return;
  } /* NaN is true, as in C */
  case TG_FLOAT16: {
    uint16_t h = round_to_small_float(v, 5, 10);
    memcpy(dst, &h, 2);
    return;
  }
  case TG_BFLOAT16: {
    uint16_t h = round_to_small_float(v, 8, 7);
    memcpy(dst, &h, 2);
    return;
  }
  case TG_FLOAT32: {
    float f = (float)v;
    memcpy(dst, &f, 4);
    return;
  }
  case TG_FLOAT64:
    memcpy(dst, &v, 8);
    return;
  case TG_FP8E4M3:
  case TG_FP8E5M2:
  case TG_FP8E4M3FNUZ:
  case TG_FP8E5M2FNUZ: {
    uint8_t b = double_to_fp8(v, dt);
    memcpy(dst, &b, 1);
    return;
  }
  case TG_UINT64:
    store_bits(dt, dst, double_to_u64_bits(v));
    return;
  default:
    store_bits(dt, dst, (uint64_t)double_to_i64(v));
    return;
  }
}

void dtype_store_i64(tg_dtype dt, void *dst, int64_t v) {
  TG_ASSERT(dtype_valid(dt));
  switch (dt) {
  case TG_BOOL: {
    uint8_t b = v != 0;
    memcpy(dst, &b, 1);
    return;
  }
  case TG_FLOAT16: {
    uint16_t h = round_to_small_float(i64_to_double_sticky(v), 5, 10);
    memcpy(dst, &h, 2);
    return;
  }
  case TG_BFLOAT16: {
    uint16_t h = round_to_small_float(i64_to_double_sticky(v), 8, 7);
    memcpy(dst, &h, 2);
    return;
  }
  case TG_FLOAT32: {
    float f = (float)v;
    memcpy(dst, &f, 4);
    return;
  }
  case TG_FLOAT64: {
    double d = (double)v;
    memcpy(dst, &d, 8);
    return;
  }
  case TG_FP8E4M3:
  case TG_FP8E5M2:
  case TG_FP8E4M3FNUZ:
  case TG_FP8E5M2FNUZ: {
    uint8_t b = double_to_fp8(i64_to_double_sticky(v), dt);
    memcpy(dst, &b, 1);
    return;
  }
  default:
    store_bits(dt, dst, (uint64_t)v);
    return; /* wraps modulo 2^bits */
  }
}

/* Reads the raw element as an integer of its own width and signedness. */
static int64_t load_int_raw(tg_dtype dt, const void *src, uint64_t *as_unsigned) {
  int64_t s = 0;
  uint64_t u = 0;
  switch (dt) {
  case TG_BOOL: {
    uint8_t x;
    memcpy(&x, src, 1);
    u = x != 0;
    s = (int64_t)u;
    break;
  }
  case TG_INT8: {
    int8_t x;
    memcpy(&x, src, 1);
    s = x;
    u = (uint64_t)s;
    break;
  }
  case TG_INT16: {
    int16_t x;
    memcpy(&x, src, 2);
    s = x;
    u = (uint64_t)s;
    break;
  }
  case TG_INT32: {
    int32_t x;
    memcpy(&x, src, 4);
    s = x;
    u = (uint64_t)s;
    break;
  }
  case TG_INT64: {
    memcpy(&s, src, 8);
    u = (uint64_t)s;
    break;
  }
  case TG_UINT8: {
    uint8_t x;
    memcpy(&x, src, 1);
    u = x;
    s = (int64_t)u;
    break;
  }
  case TG_UINT16: {
    uint16_t x;
    memcpy(&x, src, 2);
    u = x;
    s = (int64_t)u;
    break;
  }
  case TG_UINT32: {
    uint32_t x;
    memcpy(&x, src, 4);
    u = x;
    s = (int64_t)u;
    break;
  }
  case TG_UINT64: {
    memcpy(&u, src, 8);
    s = (int64_t)u;
    break;
  }
  default:
    TG_ASSERT(0 && "not an integer dtype");
  }
  if (as_unsigned) *as_unsigned = u;
  return s;
}

double dtype_load(tg_dtype dt, const void *src) {
  TG_ASSERT(dtype_valid(dt));
  switch (dt) {
  case TG_FLOAT16: {
    uint16_t h;
    memcpy(&h, src, 2);
    return small_float_to_double(h, 5, 10);
  }
  case TG_BFLOAT16: {
    uint16_t h;
    memcpy(&h, src, 2);
    return bf16_to_float(h);
  }
  case TG_FLOAT32: {
    float f;
    memcpy(&f, src, 4);
    return f;
  }
  case TG_FLOAT64: {
    double d;
    memcpy(&d, src, 8);
    return d;
  }
  case TG_FP8E4M3:
  case TG_FP8E5M2:
  case TG_FP8E4M3FNUZ:
  case TG_FP8E5M2FNUZ: {
    uint8_t b;
    memcpy(&b, src, 1);
    return fp8_to_double(b, dt);
  }
  case TG_UINT64: {
    uint64_t u;
    load_int_raw(dt, src, &u);
    return (double)u;
  }
  default:
    return (double)load_int_raw(dt, src, NULL);
  }
}

/* uint64 values >= 2^63 come back as their two's-complement int64 bits. */
int64_t dtype_load_i64(tg_dtype dt, const void *src) {
  TG_ASSERT(dtype_valid(dt));
  if (tg_dtype_is_float(dt)) return double_to_i64(dtype_load(dt, src));
  return load_int_raw(dt, src, NULL);
}

int64_t dtype_int_of(tg_dtype dt, double v) {
  unsigned char b[8];
  dtype_store(dt, b, v);
  return dtype_load_i64(dt, b);
}
