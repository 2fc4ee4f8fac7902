/*
 * var.c -- symbolic sizes: the table of variables (tinygrad's Variable) and the tagged int64 size
 * codes that stand for "variable + offset" in shape arguments.
 *
 * A variable is interned by (name, min, max) and lives for the process; tg_var packs its table index
 * and, once bound, its value. A size code packs the same plus an offset into one negative int64
 * below -2^62 (the two top bits set), so shapes stay int64_t arrays and no legal plain size is ever
 * mistaken for a code:
 *   bits 63-62: 10   bits 61-47: variable index + 1   bits 46-17: value + 1 (0: unbound)
 *   bits 16-0: offset + 2^16
 * The bound value is what tensor shapes hold (so every shape computation of the tensor layer stays
 * concrete); kernels see the variable only (DEFINE_VAR), and take the value as an argument.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "uop.h"

typedef struct {
  char name[32];
  int64_t min, max;
} VarRow;

static pthread_mutex_t g_vlock = PTHREAD_MUTEX_INITIALIZER;
static VarRow *g_vars;
static int g_nvars, g_capvars;

#define VAR_INDEX_MAX ((1 << 15) - 2)
#define CODE_MASK ((uint64_t)3 << 62)
#define CODE_TAG ((uint64_t)2 << 62)
#define OFF_BIAS (1 << 16)

static bool ident_ok(const char *s) {
  if (!s || !*s || strlen(s) > 31) return false;
  for (const char *p = s; *p; p++) {
    bool alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_';
    if (!alpha && !(p != s && *p >= '0' && *p <= '9')) return false;
  }
  return true;
}

int var_intern(const char *fn, const char *name, int64_t min, int64_t max) {
  if (!ident_ok(name)) {
    tg_set_error(TG_ERR_INVALID, "%s: name '%s' is not a C identifier of 1 to 31 characters", fn, name ? name : "(null)");
    return -1;
  }
  if (min < 0 || max < min || max > TG_VAR_MAX) {
    tg_set_error(TG_ERR_INVALID, "%s: variable '%s' bounds [%lld, %lld]: need 0 <= min <= max <= %lld", fn, name,
                 (long long)min, (long long)max, (long long)TG_VAR_MAX);
    return -1;
  }
  pthread_mutex_lock(&g_vlock);
  int found = -1;
  for (int i = 0; i < g_nvars && found < 0; i++)
    if (g_vars[i].min == min && g_vars[i].max == max && !strcmp(g_vars[i].name, name)) found = i;
  if (found < 0 && g_nvars < VAR_INDEX_MAX) {
    if (g_nvars == g_capvars) {
      g_capvars = g_capvars ? 2 * g_capvars : 16;
      g_vars = tg_xrealloc(g_vars, sizeof(VarRow) * (size_t)g_capvars);
    }
    VarRow *r = &g_vars[g_nvars];
    memset(r, 0, sizeof *r);
    strcpy(r->name, name);
    r->min = min, r->max = max;
    found = g_nvars++;
  }
  pthread_mutex_unlock(&g_vlock);
  if (found < 0) tg_set_error(TG_ERR_INVALID, "%s: too many variables (%d)", fn, VAR_INDEX_MAX);
  return found;
}

bool var_info(int idx, const char **name, int64_t *min, int64_t *max) {
  pthread_mutex_lock(&g_vlock);
  bool ok = idx >= 0 && idx < g_nvars;
  if (ok) {
    if (name) *name = g_vars[idx].name;
    if (min) *min = g_vars[idx].min;
    if (max) *max = g_vars[idx].max;
  }
  pthread_mutex_unlock(&g_vlock);
  return ok;
}

/* tagged: the two top bits 10 (so below -2^62) and a variable index field that is not 0 */
bool sym_is_code(int64_t x) { return ((uint64_t)x & CODE_MASK) == CODE_TAG && (((uint64_t)x >> 47) & 0x7fff) != 0; }

int64_t sym_encode(int var, int64_t value, int64_t offset) {
  if (var < 0 || var > VAR_INDEX_MAX || value < -1 || value > TG_VAR_MAX || offset <= -OFF_BIAS || offset >= OFF_BIAS)
    return TG_SYM_NONE;
  uint64_t c = CODE_TAG | ((uint64_t)(var + 1) << 47) | ((uint64_t)(value + 1) << 17) | (uint64_t)(offset + OFF_BIAS);
  return (int64_t)c;
}

bool sym_decode(int64_t code, SymDim *out) {
  if (!sym_is_code(code)) return false;
  uint64_t c = (uint64_t)code;
  int var = (int)((c >> 47) & 0x7fff) - 1;
  int64_t value = (int64_t)((c >> 17) & 0x3fffffff) - 1;
  int64_t off = (int64_t)(c & 0x1ffff) - OFF_BIAS;
  int64_t mn, mx;
  if (!var_info(var, NULL, &mn, &mx)) return false;
  if (value != -1 && (value < mn || value > mx)) return false;
  out->var = var, out->value = value, out->offset = off, out->min = mn, out->max = mx;
  return true;
}

int64_t sym_concrete(int64_t code) {
  SymDim d;
  if (!sym_decode(code, &d)) return code;
  return (d.value < 0 ? d.max : d.value) + d.offset;
}

int64_t sym_maxval(int64_t code) {
  SymDim d;
  if (!sym_decode(code, &d)) return code;
  return d.max + d.offset;
}

/* ---- symbolic shapes of tensor-graph nodes ---- */

static bool code_of(const int64_t *sym, int i, SymDim *d) { return sym && sym_decode(sym[i], d); }

/* the code for d's variable with another offset (TG_SYM_NONE when it does not fit) */
static int64_t shifted(const SymDim *d, int64_t off) { return sym_encode(d->var, d->value, off); }

const int64_t *uop_move_args(const UOp *u, int *n) {
  int k;
  switch (u->op) {
  case OP_RESHAPE: case OP_EXPAND: case OP_PERMUTE: case OP_FLIP: k = u->ndim; break;
  case OP_PAD: case OP_SHRINK: case OP_ASSIGN: k = 2 * u->ndim; break;
  default: k = (int)u->niarg; break;
  }
  if ((int)u->niarg == 2 * k && k > 0) {
    *n = k;
    return u->iarg + k;
  }
  *n = (int)u->niarg;
  return u->iarg;
}

int sym_reshape_groups(const int64_t *a, const int64_t *asym, int na, const int64_t *b, const int64_t *bsym, int nb,
                       int *ga, int *gb) {
  SymDim d;
  int i = 0, j = 0, g = 0;
  for (;;) {
    /* concrete size-1 dims belong to no group */
    while (i < na && a[i] == 1 && !code_of(asym, i, &d)) ga[i++] = -1;
    while (j < nb && b[j] == 1 && !code_of(bsym, j, &d)) gb[j++] = -1;
    if (i == na || j == nb) break;
    bool sa = code_of(asym, i, &d), sb = code_of(bsym, j, &d);
    if (sa || sb) {
      /* one symbolic dim on each side, the same size */
      if (!(sa && sb) || a[i] != b[j]) return -1;
      ga[i++] = g, gb[j++] = g;
      g++;
      continue;
    }
    int64_t pa = a[i], pb = b[j];
    ga[i++] = g, gb[j++] = g;
    while (pa != pb) {
      if (pa < pb) {
        if (i == na || code_of(asym, i, &d)) return -1;
        pa *= a[i], ga[i++] = g;
      } else {
        if (j == nb || code_of(bsym, j, &d)) return -1;
        pb *= b[j], gb[j++] = g;
      }
      if (pa == 0 || pb == 0) break;
    }
    g++;
  }
  for (; i < na; i++) {
    if (a[i] != 1 || code_of(asym, i, &d)) return -1;
    ga[i] = -1;
  }
  for (; j < nb; j++) {
    if (b[j] != 1 || code_of(bsym, j, &d)) return -1;
    gb[j] = -1;
  }
  return g;
}

/* The output dims of a reshape (a -> b) that carry input a's symbolic dims: each symbolic dim maps
 * to one output dim of its size, concrete dims group by equal products. bs holds b's sizes on entry
 * and gets the codes. False when a symbolic dim is merged with others or split. */
static bool reshape_carry(const int64_t *a, const int64_t *as, int na, const int64_t *b, int64_t *bs, int nb) {
  SymDim d;
  int i = 0, j = 0;
  for (;;) {
    while (i < na && a[i] == 1 && !code_of(as, i, &d)) i++;
    if (i < na && code_of(as, i, &d)) {
      if (a[i] != 1)
        while (j < nb && b[j] == 1) j++;
      if (a[i] == 1 && (j == nb || b[j] != 1)) {
        i++; /* a symbolic dim bound to 1 that the reshape dropped (as a size-1 dim) */
        continue;
      }
      if (j == nb || b[j] != a[i]) return false;
      bs[j++] = as[i++];
      continue;
    }
    while (j < nb && b[j] == 1) j++;
    if (i == na || j == nb) break;
    int64_t pa = a[i++], pb = b[j++];
    while (pa != pb && pa && pb) {
      if (pa < pb) {
        if (i == na || code_of(as, i, &d)) return false;
        pa *= a[i++];
      } else {
        if (j == nb) return false;
        pb *= b[j++];
      }
    }
  }
  for (; i < na; i++)
    if (code_of(as, i, &d)) return false;
  return true;
}

/* Is dim i of x independent of its size -- a broadcast of a size-1 dim (through elementwise ops and
 * permutes), or symbolic itself? Then it may meet a symbolic dim of another source. */
static bool size_free_dim(const UOp *x, int i, int depth) {
  if (depth > 32 || i >= x->ndim) return false;
  if (x->sym && sym_is_code(x->sym[i])) return true;
  switch (x->op) {
  case OP_EXPAND:
    return x->src[0]->shape[i] == 1 || size_free_dim(x->src[0], i, depth + 1);
  case OP_PERMUTE:
    return size_free_dim(x->src[0], (int)x->iarg[i], depth + 1);
  case OP_CONTIGUOUS: case OP_DETACH:
    return size_free_dim(x->src[0], i, depth + 1);
  default:
    if (!op_is_alu(x->op)) return false;
    for (uint32_t k = 0; k < x->nsrc; k++)
      if (x->src[k]->ndim == x->ndim && !size_free_dim(x->src[k], i, depth + 1)) return false;
    return x->nsrc > 0;
  }
}

static _Thread_local int library_depth;
void sym_library(int delta) { library_depth += delta; }

int64_t *sym_infer(const UOp *u, bool *lost, bool *baked) {
  int nd = u->ndim;
  *lost = false;
  *baked = false;
  if (nd <= 0) return NULL;
  UOp *s0 = u->nsrc ? u->src[0] : NULL;
  const int64_t *ss = s0 ? s0->sym : NULL;
  int nargs;
  const int64_t *args = uop_move_args(u, &nargs);
  bool has_codes = op_is_movement(u->op) && args != u->iarg;
  if (!has_codes && u->op != OP_IOTA) {
    bool any = false;
    for (uint32_t k = 0; k < u->nsrc; k++) any = any || u->src[k]->sym;
    if (!any) return NULL;
  }
  int64_t *out = tg_xmalloc(sizeof(int64_t) * (size_t)nd);
  memcpy(out, u->shape, sizeof(int64_t) * (size_t)nd);
  SymDim d, e;
  switch (u->op) {
  case OP_IOTA:
    if (u->niarg == 3) out[0] = u->iarg[2];
    break;
  case OP_REDUCE_AXIS:
    if (ss) memcpy(out, ss, sizeof(int64_t) * (size_t)nd);
    for (uint32_t k = 0; k < u->niarg; k++) out[u->iarg[k]] = 1;
    break;
  case OP_PERMUTE:
    for (int i = 0; i < nd; i++) out[i] = ss ? ss[u->iarg[i]] : u->shape[i];
    break;
  case OP_FLIP:
    if (ss) memcpy(out, ss, sizeof(int64_t) * (size_t)nd);
    break;
  case OP_EXPAND:
    for (int i = 0; i < nd; i++) {
      if (has_codes && sym_is_code(args[i])) out[i] = args[i];
      else if (ss && s0->shape[i] == 1 && code_of(ss, i, &d) && u->shape[i] != 1)
        /* a symbolic dim bound to 1 broadcast to a plain size: it was a broadcast dim all along (a
         * reshape put the code on the wrong one of several size-1 dims); the size is the plain one,
         * and what was built for the value 1 is not symbolic (a capture of it is refused) */
        *baked = true;
      else if (ss && (s0->shape[i] != 1 || code_of(ss, i, &d))) out[i] = ss[i];
    }
    break;
  case OP_RESHAPE:
    if (has_codes) {
      memcpy(out, args, sizeof(int64_t) * (size_t)nd);
    } else if (ss && !reshape_carry(s0->shape, ss, s0->ndim, u->shape, out, nd)) {
      *lost = true;
    }
    break;
  case OP_SHRINK: {
    const int64_t *b = args;
    for (int i = 0; i < nd; i++) {
      int64_t st = u->iarg[2 * i], en = u->iarg[2 * i + 1];
      bool cs = sym_decode(b[2 * i], &d), ce = sym_decode(b[2 * i + 1], &e);
      if (ce && !cs) out[i] = shifted(&e, e.offset - st);
      else if (ce && cs) out[i] = d.var == e.var ? en - st : TG_SYM_NONE;
      else if (cs) out[i] = TG_SYM_NONE; /* c - v is not v + c */
      else if (code_of(ss, i, &d) && en == s0->shape[i]) out[i] = shifted(&d, d.offset - st);
      else if (code_of(ss, i, &d) && library_depth > 0) *baked = true;
      if (out[i] == TG_SYM_NONE) out[i] = en - st, *lost = true;
    }
    break;
  }
  case OP_PAD: {
    for (int i = 0; i < nd; i++) {
      int nsym = 0;
      SymDim w = {0};
      int64_t rest = 0;
      int64_t parts[3] = {ss ? ss[i] : s0->shape[i], args[2 * i], args[2 * i + 1]};
      for (int k = 0; k < 3; k++) {
        if (sym_decode(parts[k], &d)) nsym++, w = d;
        else rest += parts[k];
      }
      if (nsym == 1) out[i] = shifted(&w, w.offset + rest);
      if (nsym > 1 || out[i] == TG_SYM_NONE) out[i] = u->shape[i], *lost = true;
      /* a plain pad of a symbolic dim inside a library op: its amount came from a bound value (the
       * other part of a tg_cat along the dim) */
      else if (library_depth > 0 && nsym == 1 && sym_is_code(parts[0]) && (parts[1] || parts[2])) *baked = true;
    }
    break;
  }
  case OP_INDEX: {
    UOp *data = u->src[0], *ix = u->src[1];
    for (int i = 0; i < ix->ndim && i < nd; i++)
      if (ix->sym) out[i] = ix->sym[i];
    for (int i = 1; i < data->ndim && ix->ndim + i - 1 < nd; i++)
      if (data->sym) out[ix->ndim + i - 1] = data->sym[i];
    break;
  }
  case OP_ASSIGN:
    if (u->niarg) { /* a write into a region of the target: the target's shape */
      if (ss) memcpy(out, ss, sizeof(int64_t) * (size_t)nd);
      break;
    }
    /* fall through */
  default: /* elementwise and the rest: a symbolic dim of any source */
    for (uint32_t k = 0; k < u->nsrc; k++) {
      UOp *x = u->src[k];
      if (!x->sym || x->ndim != nd) continue;
      for (int i = 0; i < nd; i++)
        if (!sym_is_code(out[i]) && sym_is_code(x->sym[i])) out[i] = x->sym[i];
    }
    /* a source whose dim is a plain size where another's is symbolic must not depend on that size */
    if (op_is_alu(u->op) || u->op == OP_ASSIGN)
      for (uint32_t k = 0; k < u->nsrc && !*baked; k++) {
        UOp *x = u->src[k];
        if (x->ndim != nd || (u->op == OP_ASSIGN && u->niarg)) continue;
        for (int i = 0; i < nd && !*baked; i++)
          /* (a plain size 1 there is a symbolic size bound to 1: the sym_unit case, not this one) */
          if (sym_is_code(out[i]) && !(x->sym && sym_is_code(x->sym[i])) && x->shape[i] != 1 && !size_free_dim(x, i, 0))
            *baked = true;
      }
    break;
  }
  bool any = false;
  for (int i = 0; i < nd; i++) any = any || sym_is_code(out[i]);
  if (!any) {
    free(out);
    return NULL;
  }
  return out;
}

UOp *sym_expr(int64_t x) {
  SymDim d;
  if (!sym_decode(x, &d)) return s_const(x);
  UOp *v = s_var(d.var), *r = s_addc(v, d.offset);
  uop_unref(v);
  return r;
}
