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
