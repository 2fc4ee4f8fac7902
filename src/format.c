/*
 * format.c -- numpy's default print() rendering of a contiguous host array (what print(t.numpy())
 * shows in tinygrad), used by tg_to_string / tg_print.
 *
 * In: row-major element data, its dtype and shape. Out: a malloc'd string.
 * The rules reproduced (numpy >= 1.14 defaults: precision 8, floatmode "maxprec", threshold 1000,
 * edgeitems 3, linewidth 75):
 *  - one formatter per array, chosen from the elements that will be shown, so every element has the
 *    same width and the columns line up;
 *  - floats print the fewest digits that read back to the same value *in their own type* (float16
 *    and float32 are not widened for this), at most 8 fractional (positional) or 8 mantissa
 *    (scientific) digits, rounding the exact binary value half-to-even as numpy's Dragon4 does; in
 *    arrays every integer digit is printed; scientific notation when a nonzero |x| is >= 1e8 or
 *    < 1e-4 or max/min > 1e3, and then every element shows the same number of mantissa digits;
 *  - arrays over 1000 elements show 3 items at each end of every long axis with "...";
 *  - 0-d arrays print like numpy scalars ("5.0", "1e+20"); empty arrays print "[]".
 * bfloat16 prints as float32, since tinygrad converts it to float32 before handing it to numpy.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

enum { PRECISION = 8, THRESHOLD = 1000, EDGEITEMS = 3, LINEWIDTH = 75 };

/* ---- shortest round-trip digits ---- */

/* Which binary type a value must read back as: 'd' double, 'f' float, 'h' half. */
typedef char FloatKind;

/* Does the decimal `text` read back as x (>= 0) in kind k? For half the test compares against the
 * exact midpoints between neighbours, with ties going to the even mantissa, which avoids rounding
 * twice through float. */
static bool reads_back(const char *text, double x, FloatKind k) {
  if (k == 'd') return strtod(text, NULL) == x;
  if (k == 'f') return strtof(text, NULL) == (float)x;
  double d = fabs(strtod(text, NULL));
  uint16_t b = (uint16_t)(float_to_half((float)fabs(x)) & 0x7fff);
  double v = half_to_float(b);
  double up = b + 1 == 0x7c00 ? 65536.0 : half_to_float((uint16_t)(b + 1));
  double lo = b == 0 ? -half_to_float(1) : half_to_float((uint16_t)(b - 1));
  double mlo = (v + lo) / 2, mhi = (v + up) / 2;
  bool even = (b & 1) == 0;
  return (d > mlo && d < mhi) || (even && (d == mlo || d == mhi));
}

/* A decimal d1.d2d3... x 10^exp10, digits without trailing zeros (at least one digit). Sized for
 * the longest "%.8f" of a double (309 integer digits). */
typedef struct {
  char dig[340];
  int nd;
  int exp10;
} Decimal;

/* Adds +1 or -1 to a decimal digit string in place; returns false if -1 would go below zero. The
 * string has room for one more leading digit. */
static bool digits_step(char *dig, int *nd, int dir) {
  int i = *nd - 1;
  if (dir > 0) {
    for (; i >= 0 && dig[i] == '9'; i--) dig[i] = '0';
    if (i >= 0) {
      dig[i]++;
    } else {
      memmove(dig + 1, dig, (size_t)*nd + 1);
      dig[0] = '1';
      (*nd)++;
    }
    return true;
  }
  for (; i >= 0 && dig[i] == '0'; i--) dig[i] = '9';
  if (i < 0) return false;
  dig[i]--;
  return true;
}

/* Rounds |x| (finite) to a fixed decimal position -- n significant digits if sig, else n fractional
 * digits -- choosing the way numpy's Dragon4 does at its last digit: the nearest value (ties to
 * even) if it reads back as x, else a neighbour one unit away that does, else the nearest. Reading
 * back is judged in x's own type. Returns whether the chosen value reads back. */
static bool round_at(double x, FloatKind k, bool sig, int n, Decimal *out) {
  double a = fabs(x);
  char buf[400], text[400];
  snprintf(buf, sizeof buf, sig ? "%.*e" : "%.*f", sig ? n - 1 : n, a);
  /* digits of the printed value as an integer string m, with value = m * 10^q */
  char m[sizeof out->dig];
  int nm = 0, q;
  const char *c = buf;
  for (; *c && *c != 'e'; c++)
    if (*c >= '0' && *c <= '9' && nm < (int)sizeof m - 2) m[nm++] = *c;
  m[nm] = '\0';
  q = sig ? (*c == 'e' ? atoi(c + 1) : 0) - (n - 1) : -n;
  snprintf(text, sizeof text, "%se%d", m, q);
  bool ok = reads_back(text, a, k);
  if (!ok) {
    for (int dir = -1; dir <= 1 && !ok; dir += 2) {
      char t[sizeof m];
      int nt = nm;
      memcpy(t, m, (size_t)nm + 1);
      if (!digits_step(t, &nt, dir)) continue;
      snprintf(text, sizeof text, "%se%d", t, q);
      if (reads_back(text, a, k)) {
        memcpy(m, t, (size_t)nt + 1);
        nm = nt;
        ok = true;
      }
    }
  }
  /* normalise: no leading zeros, no trailing zeros */
  const char *d = m;
  while (*d == '0' && d[1]) d++;
  int nd = (int)strlen(d);
  if (*d == '0') {
    strcpy(out->dig, "0");
    out->nd = 1;
    out->exp10 = 0;
    return ok;
  }
  out->exp10 = q + nd - 1;
  while (nd > 1 && d[nd - 1] == '0') nd--;
  memcpy(out->dig, d, (size_t)nd);
  out->dig[nd] = '\0';
  out->nd = nd;
  return ok;
}

/* Shortest digits that read back as x in its type (17 always do for a double). */
static void shortest(double x, FloatKind k, Decimal *out) {
  for (int p = 1; p < 17; p++)
    if (round_at(x, k, true, p, out)) return;
  round_at(x, k, true, 17, out);
}

/* ---- element pieces ---- */

/* A finite float split into the parts numpy pads separately: sign+integer digits, fraction digits
 * (trailing zeros trimmed), and the exponent in scientific mode. */
typedef struct {
  char *ip, *fp;
  int exp10;
  int special; /* 0 finite, 1 nan, 2 inf, 3 -inf */
} FloatPieces;

static char *with_sign(bool neg, const char *s, size_t n) {
  char *r = tg_xmalloc(n + 2);
  size_t o = 0;
  if (neg) r[o++] = '-';
  memcpy(r + o, s, n);
  r[o + n] = '\0';
  return r;
}

static void positional_pieces(bool neg, const Decimal *d, FloatPieces *out) {
  SB ip, fp;
  sb_init(&ip);
  sb_init(&fp);
  if (neg) sb_putc(&ip, '-');
  if (d->exp10 < 0) sb_putc(&ip, '0');
  for (int i = 0; i <= d->exp10; i++) sb_putc(&ip, i < d->nd ? d->dig[i] : '0');
  for (int i = d->exp10 + 1; i < 0; i++) sb_putc(&fp, '0');
  for (int i = d->exp10 < -1 ? 0 : d->exp10 + 1; i < d->nd; i++) sb_putc(&fp, d->dig[i]);
  out->ip = sb_take(&ip);
  out->fp = sb_take(&fp);
}

/* Positional digits. In arrays (limited) numpy always prints every integer digit exactly and then
 * the fewest fractional digits, at most PRECISION, that read back; numpy scalars print the shortest
 * digits overall (float16 65504 is "65500.0" as a scalar but "65504." in an array). */
static void positional(double x, FloatKind k, bool limited, FloatPieces *out) {
  Decimal d;
  if (limited) {
    for (int f = 0; f <= PRECISION; f++)
      if (round_at(x, k, false, f, &d)) break;
  } else {
    shortest(x, k, &d);
  }
  positional_pieces(signbit(x), &d, out);
}

/* Scientific digits: the fewest significant digits (at most sig_max) that read back. */
static void scientific(double x, FloatKind k, int sig_max, FloatPieces *out) {
  Decimal d;
  for (int p = 1; p <= sig_max; p++)
    if (round_at(x, k, true, p, &d)) break;
  out->ip = with_sign(signbit(x), d.dig, 1);
  out->fp = with_sign(false, d.dig + 1, (size_t)d.nd - 1);
  out->exp10 = d.exp10;
}

static int count_digits(int v) {
  int n = 1;
  for (v = abs(v); v >= 10; v /= 10) n++;
  return n;
}

/* ---- reading elements ---- */

typedef struct {
  const unsigned char *data;
  tg_dtype dt;
  size_t itemsize;
  FloatKind kind;
} Source;

static double elem_f(const Source *src, size_t i) {
  return dtype_load(src->dt, src->data + i * src->itemsize);
}
static int64_t elem_i(const Source *src, size_t i) {
  return dtype_load_i64(src->dt, src->data + i * src->itemsize);
}

static char *int_text(const Source *src, size_t i) {
  char buf[32];
  int64_t v = elem_i(src, i);
  if (src->dt == TG_UINT64)
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)(uint64_t)v);
  else
    snprintf(buf, sizeof buf, "%lld", (long long)v);
  return tg_xstrdup(buf);
}

/* numpy scalar str(): positional for 1e-4 <= |x| < 1e16 (and 0), else scientific; unique digits. */
static char *scalar_text(const Source *src) {
  if (src->dt == TG_BOOL) return tg_xstrdup(elem_i(src, 0) ? "True" : "False");
  if (!tg_dtype_is_float(src->dt)) return int_text(src, 0);
  double x = elem_f(src, 0);
  if (isnan(x)) return tg_xstrdup("nan");
  if (isinf(x)) return tg_xstrdup(x < 0 ? "-inf" : "inf");
  double a = fabs(x);
  FloatPieces p = {0};
  SB b;
  sb_init(&b);
  if (a == 0 || (a >= 1e-4 && a < 1e16)) {
    positional(x, src->kind, false, &p);
    sb_printf(&b, "%s.%s", p.ip, *p.fp ? p.fp : "0");
  } else {
    scientific(x, src->kind, 17, &p);
    sb_printf(&b, "%s%s%se%c%02d", p.ip, *p.fp ? "." : "", p.fp, p.exp10 < 0 ? '-' : '+', abs(p.exp10));
  }
  free(p.ip);
  free(p.fp);
  return sb_take(&b);
}

/* ---- choosing the shown elements and their common format ---- */

typedef struct {
  const int64_t *shape;
  int ndim;
  bool summarize;
  char **words; /* formatted shown elements, row-major */
  size_t nwords, next;
} Layout;

/* Indices shown along an axis of length n: all, or the first and last EDGEITEMS. */
static size_t shown_count(const Layout *L, int64_t n) {
  return L->summarize && n > 2 * EDGEITEMS ? 2 * EDGEITEMS : (size_t)n;
}
static int64_t shown_index(const Layout *L, int64_t n, size_t j) {
  if (L->summarize && n > 2 * EDGEITEMS && j >= EDGEITEMS) return n - 2 * EDGEITEMS + (int64_t)j;
  return (int64_t)j;
}

/* Flat offsets of the shown elements in row-major order. */
static size_t *shown_offsets(const Layout *L, size_t *count) {
  size_t n = 1;
  for (int a = 0; a < L->ndim; a++) n *= shown_count(L, L->shape[a]);
  size_t *offs = tg_xmalloc(n * sizeof *offs);
  size_t *pos = tg_xcalloc((size_t)L->ndim + 1, sizeof *pos);
  for (size_t k = 0; k < n; k++) {
    size_t off = 0;
    for (int a = 0; a < L->ndim; a++)
      off = off * (size_t)L->shape[a] + (size_t)shown_index(L, L->shape[a], pos[a]);
    offs[k] = off;
    for (int a = L->ndim - 1; a >= 0; a--) {
      if (++pos[a] < shown_count(L, L->shape[a])) break;
      pos[a] = 0;
    }
  }
  free(pos);
  *count = n;
  return offs;
}

/* Rounds a threshold or ratio to the element type, because numpy compares in that type. */
static double in_kind(double v, FloatKind k) {
  if (k == 'f') return (float)v;
  if (k == 'h') return half_to_float(float_to_half((float)v));
  return v;
}

static void pad_to(SB *b, size_t have, size_t want) {
  for (; have < want; have++) sb_putc(b, ' ');
}

static char **format_floats(const Source *src, const size_t *offs, size_t n) {
  /* Decide the notation from the nonzero finite values. */
  double mx = 0, mn = INFINITY;
  bool any_nonzero = false, any_nonfinite = false, any_finite = false, neg_inf = false;
  for (size_t i = 0; i < n; i++) {
    double v = elem_f(src, offs[i]);
    if (!isfinite(v)) {
      any_nonfinite = true;
      if (isinf(v) && v < 0) neg_inf = true;
      continue;
    }
    any_finite = true;
    if (v == 0) continue;
    any_nonzero = true;
    if (fabs(v) > mx) mx = fabs(v);
    if (fabs(v) < mn) mn = fabs(v);
  }
  bool sci = false;
  if (any_nonzero) {
    double ratio = src->kind == 'd' ? mx / mn : in_kind((float)mx / (float)mn, src->kind);
    sci = mx >= in_kind(1e8, src->kind) || mn < 1e-4 || ratio > 1000.0;
  }
  FloatPieces *pc = tg_xcalloc(n ? n : 1, sizeof *pc);
  size_t pad_left = 0, pad_right = 0, frac_max = 0;
  int exp_size = 2;
  for (size_t i = 0; i < n; i++) {
    double v = elem_f(src, offs[i]);
    if (isnan(v)) {
      pc[i].special = 1;
      continue;
    }
    if (isinf(v)) {
      pc[i].special = v < 0 ? 3 : 2;
      continue;
    }
    if (sci) {
      scientific(v, src->kind, PRECISION + 1, &pc[i]);
      if (count_digits(pc[i].exp10) > exp_size) exp_size = count_digits(pc[i].exp10);
    } else {
      positional(v, src->kind, true, &pc[i]);
    }
    if (strlen(pc[i].ip) > pad_left) pad_left = strlen(pc[i].ip);
    if (strlen(pc[i].fp) > frac_max) frac_max = strlen(pc[i].fp);
  }
  if (!any_finite) {
    pad_left = pad_right = 0;
  } else {
    pad_right = sci ? (size_t)exp_size + 2 + frac_max : frac_max;
  }
  if (any_nonfinite) {
    /* nan/inf are right-aligned in the same total width pad_left + 1 + pad_right */
    size_t offset = pad_right + 1, inflen = 3 + (neg_inf ? 1 : 0);
    if (3 > offset && 3 - offset > pad_left) pad_left = 3 - offset;
    if (inflen > offset && inflen - offset > pad_left) pad_left = inflen - offset;
  }
  char **words = tg_xmalloc((n ? n : 1) * sizeof *words);
  for (size_t i = 0; i < n; i++) {
    SB b;
    sb_init(&b);
    if (pc[i].special) {
      const char *t = pc[i].special == 1 ? "nan" : pc[i].special == 2 ? "inf" : "-inf";
      pad_to(&b, strlen(t), pad_left + pad_right + 1);
      sb_puts(&b, t);
    } else {
      pad_to(&b, strlen(pc[i].ip), pad_left);
      if (sci) {
        if (pc[i].ip[0] == '-') sb_putc(&b, '-');
        /* Every element gets the widest element's digit count; digits past an element's own
         * shortest ones continue the exact value (1e-5f prints 9.9999997e-06 beside an element
         * that needs seven fractional digits), not zeros. */
        Decimal d;
        round_at(elem_f(src, offs[i]), src->kind, true, (int)frac_max + 1, &d);
        int ex = d.exp10;
        sb_putc(&b, d.dig[0]);
        sb_putc(&b, '.');
        for (size_t j = 1; j <= frac_max; j++) sb_putc(&b, j < (size_t)d.nd ? d.dig[j] : '0');
        sb_printf(&b, "e%c%0*d", ex < 0 ? '-' : '+', exp_size, abs(ex));
      } else {
        sb_printf(&b, "%s.%s", pc[i].ip, pc[i].fp);
        pad_to(&b, strlen(pc[i].fp), pad_right);
      }
    }
    words[i] = sb_take(&b);
    free(pc[i].ip);
    free(pc[i].fp);
  }
  free(pc);
  return words;
}

static char **format_words(const Source *src, const size_t *offs, size_t n) {
  if (tg_dtype_is_float(src->dt)) return format_floats(src, offs, n);
  char **words = tg_xmalloc((n ? n : 1) * sizeof *words);
  if (src->dt == TG_BOOL) {
    for (size_t i = 0; i < n; i++) words[i] = tg_xstrdup(elem_i(src, offs[i]) ? " True" : "False");
    return words;
  }
  size_t width = 0;
  for (size_t i = 0; i < n; i++) {
    words[i] = int_text(src, offs[i]);
    if (strlen(words[i]) > width) width = strlen(words[i]);
  }
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(words[i]);
    if (len < width) {
      char *w = tg_xmalloc(width + 1);
      memset(w, ' ', width - len);
      memcpy(w + width - len, words[i], len + 1);
      free(words[i]);
      words[i] = w;
    }
  }
  return words;
}

/* ---- nesting and line wrapping ---- */

static void put_spaces(SB *b, size_t n) {
  for (size_t i = 0; i < n; i++) sb_putc(b, ' ');
}

/* Appends word to the current line, first moving to a new line (indented by `indent`) when the word
 * would pass `width` -- unless the line holds only its indent, where wrapping cannot help. */
static void extend_line(SB *s, SB *line, const char *word, size_t width, size_t indent) {
  if (line->len + strlen(word) > width && line->len > indent) {
    size_t n = line->len;
    while (n > 0 && line->s[n - 1] == ' ') n--;
    line->s[n] = '\0';
    sb_puts(s, line->s);
    sb_putc(s, '\n');
    line->len = 0;
    put_spaces(line, indent);
  }
  sb_puts(line, word);
}

/* The bracketed text of the sub-array at `axis`; `indent` is the hanging indent of its lines and
 * `width` the columns left for them (each nesting level spends one on its '[' and one on ']'). */
static char *render(Layout *L, int axis, size_t indent, size_t width) {
  int64_t n = L->shape[axis];
  bool summary = L->summarize && n > 2 * EDGEITEMS;
  size_t shown = shown_count(L, n);
  SB s;
  sb_init(&s);
  sb_puts(&s, "");
  if (axis == L->ndim - 1) {
    size_t elem_width = width - 1; /* room for the closing ']' */
    SB line;
    sb_init(&line);
    put_spaces(&line, indent);
    for (size_t j = 0; j < shown; j++) {
      extend_line(&s, &line, L->words[L->next++], elem_width, indent);
      if (j + 1 < shown) sb_putc(&line, ' ');
      if (summary && j + 1 == EDGEITEMS) {
        extend_line(&s, &line, "...", elem_width, indent);
        sb_putc(&line, ' ');
      }
    }
    sb_puts(&s, line.s);
    sb_free(&line);
  } else {
    int blank = L->ndim - axis - 1; /* newlines between sub-arrays: more between bigger blocks */
    for (size_t j = 0; j < shown; j++) {
      char *nested = render(L, axis + 1, indent + 1, width - 1);
      put_spaces(&s, indent);
      sb_puts(&s, nested);
      free(nested);
      if (j + 1 < shown)
        for (int k = 0; k < blank; k++) sb_putc(&s, '\n');
      if (summary && j + 1 == EDGEITEMS) {
        put_spaces(&s, indent);
        sb_puts(&s, "...");
        for (int k = 0; k < blank; k++) sb_putc(&s, '\n');
      }
    }
  }
  SB out;
  sb_init(&out);
  sb_putc(&out, '[');
  sb_puts(&out, s.s + (s.len < indent ? s.len : indent));
  sb_putc(&out, ']');
  sb_free(&s);
  return sb_take(&out);
}

char *format_array(const void *data, tg_dtype dt, const int64_t *shape, int ndim) {
  if (!dtype_valid(dt) || ndim < 0 || (ndim > 0 && !shape)) {
    tg_set_error(TG_ERR_INVALID, "format_array: invalid dtype %d or shape (ndim %d)", (int)dt, ndim);
    return NULL;
  }
  size_t numel = 1;
  bool empty = false;
  for (int a = 0; a < ndim; a++) {
    if (shape[a] < 0) {
      tg_set_error(TG_ERR_INVALID, "format_array: negative dimension %lld at axis %d", (long long)shape[a],
                   a);
      return NULL;
    }
    if (shape[a] == 0)
      empty = true;
    else if (numel > SIZE_MAX / (size_t)shape[a])
      numel = SIZE_MAX; /* only compared with THRESHOLD */
    else
      numel *= (size_t)shape[a];
  }
  if (empty) return tg_xstrdup("[]");
  if (!data) {
    tg_set_error(TG_ERR_INVALID, "format_array: data is NULL");
    return NULL;
  }
  Source src = {data, dt, tg_dtype_itemsize(dt), dt == TG_FLOAT64 ? 'd' : dt == TG_FLOAT16 ? 'h' : 'f'};
  if (ndim == 0) return scalar_text(&src);
  Layout L = {shape, ndim, numel > THRESHOLD, NULL, 0, 0};
  size_t *offs = shown_offsets(&L, &L.nwords);
  L.words = format_words(&src, offs, L.nwords);
  free(offs);
  char *s = render(&L, 0, 1, LINEWIDTH);
  TG_ASSERT(L.next == L.nwords);
  for (size_t i = 0; i < L.nwords; i++) free(L.words[i]);
  free(L.words);
  return s;
}
