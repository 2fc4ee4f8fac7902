/*
 * symbolic.c -- the public face of symbolic sizes: tg_variable / tg_var_bind (tinygrad's
 * Variable(...).bind(v)), tg_sym size codes, tg_arange_sym and tg_shape_sym.
 *
 * A tg_symvar packs the variable's table index + 1 in its low 32 bits and its bound value + 1 in the
 * high 32 bits (0: unbound), so binding makes no allocation and a tg_symvar needs no freeing.
 */
#include <string.h>

#include "tensor.h"

static tg_symvar var_pack(int idx, int64_t value) {
  return (tg_symvar){(uint64_t)(uint32_t)(idx + 1) | ((uint64_t)(value + 1) << 32)};
}

/* The variable's index and bound value (-1 unbound); false + error naming fn for none or a bad id. */
static bool var_unpack(tg_symvar v, const char *fn, int *idx, int64_t *value) {
  int i = (int)(uint32_t)(v.id & 0xffffffffu) - 1;
  int64_t val = (int64_t)(v.id >> 32) - 1;
  int64_t mn, mx;
  if (!v.id || !var_info(i, NULL, &mn, &mx) || (val != -1 && (val < mn || val > mx))) {
    tg_set_error(TG_ERR_INVALID, "%s: not a variable (%s); make one with tg_variable", fn, v.id ? "bad id" : "none");
    return false;
  }
  *idx = i, *value = val;
  return true;
}

tg_symvar tg_variable(const char *name, int64_t min, int64_t max) {
  int i = var_intern("tg_variable", name, min, max);
  return i < 0 ? (tg_symvar){0} : var_pack(i, -1);
}

tg_symvar tg_var_bind(tg_symvar v, int64_t value) {
  int i;
  int64_t old;
  if (!var_unpack(v, "tg_var_bind", &i, &old)) return (tg_symvar){0};
  const char *name;
  int64_t mn, mx;
  var_info(i, &name, &mn, &mx);
  if (value < mn || value > mx) {
    tg_set_error(TG_ERR_INVALID, "tg_var_bind: %s = %lld is outside its bounds [%lld, %lld]", name, (long long)value,
                 (long long)mn, (long long)mx);
    return (tg_symvar){0};
  }
  return var_pack(i, value);
}

tg_symvar tg_var_unbind(tg_symvar v) {
  int i;
  int64_t val;
  return var_unpack(v, "tg_var_unbind", &i, &val) ? var_pack(i, -1) : (tg_symvar){0};
}

int64_t tg_var_value(tg_symvar v) {
  int i;
  int64_t val;
  return var_unpack(v, "tg_var_value", &i, &val) ? val : -1;
}

const char *tg_var_name(tg_symvar v) {
  int i;
  int64_t val;
  const char *name = NULL;
  if (var_unpack(v, "tg_var_name", &i, &val)) var_info(i, &name, NULL, NULL);
  return name;
}

int64_t tg_var_min(tg_symvar v) {
  int i;
  int64_t val, mn = -1;
  if (var_unpack(v, "tg_var_min", &i, &val)) var_info(i, NULL, &mn, NULL);
  return mn;
}

int64_t tg_var_max(tg_symvar v) {
  int i;
  int64_t val, mx = -1;
  if (var_unpack(v, "tg_var_max", &i, &val)) var_info(i, NULL, NULL, &mx);
  return mx;
}

int64_t tg_sym(tg_symvar v, int64_t offset) {
  int i;
  int64_t val;
  if (!var_unpack(v, "tg_sym", &i, &val)) return TG_SYM_NONE;
  int64_t c = sym_encode(i, val, offset);
  if (c == TG_SYM_NONE)
    tg_set_error(TG_ERR_INVALID, "tg_sym: offset %lld is out of range (|offset| < 65536)", (long long)offset);
  return c;
}

bool tg_is_sym(int64_t size) {
  SymDim d;
  return sym_decode(size, &d);
}

tg_symvar tg_sym_variable(int64_t size, int64_t *offset) {
  SymDim d;
  if (!sym_decode(size, &d)) {
    tg_set_error(TG_ERR_INVALID, "tg_sym_variable: %lld is not a symbolic size (tg_sym)", (long long)size);
    return (tg_symvar){0};
  }
  if (offset) *offset = d.offset;
  return var_pack(d.var, d.value);
}

int tg_shape_sym(tg_tensor t, int64_t *out) {
  UOp *u = t_get(t, "tg_shape_sym");
  if (!u) return -1;
  if (!out && u->ndim) {
    tg_set_error(TG_ERR_INVALID, "tg_shape_sym: out is NULL");
    return -1;
  }
  if (u->ndim) memcpy(out, u->sym ? u->sym : u->shape, sizeof(int64_t) * (size_t)u->ndim);
  return u->ndim;
}
