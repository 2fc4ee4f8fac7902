/*
 * compose.c -- see compose.h. Invariant: op_scope_done always closes exactly the scope that
 * op_scope_begin opened, on success and on failure.
 */
#include "compose.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

tg_tensor op_fail(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  tg_set_error(TG_ERR_INVALID, "%s", msg);
  return (tg_tensor){0};
}

bool half_via_float32(UOp *a, tg_dtype dt) {
  Device *d = device_by_id(a->device);
  return (dt == TG_FLOAT16 || dt == TG_BFLOAT16) && d && (!d->caps.gpu || !d->caps.fp16);
}

tg_opts on_device(UOp *a, tg_dtype dt) {
  tg_opts o = {0};
  o.dtype = dt;
  o.device = device_full_name(device_by_id(a->device));
  return o;
}

tg_tensor iarange(UOp *a, double start, double stop, double step) {
  tg_opts o = on_device(a, TG_INT32);
  return tg_arange(start, stop, step, &o);
}

tg_tensor dim_arange(UOp *a, int dim) {
  if (a->sym && sym_is_code(a->sym[dim])) return t_wrap(g_iota(a->sym[dim], TG_INT32, a->device));
  return iarange(a, 0, (double)a->shape[dim], 1);
}

bool t_dim_sym(tg_tensor x, int dim) {
  UOp *a = tg_valid(x) ? t_get(x, "t_dim_sym") : NULL;
  return a && dim >= 0 && dim < a->ndim && a->sym && sym_is_code(a->sym[dim]);
}

OpScope op_scope_begin(const char *fn) {
  OpScope o = {fn, tg_has_error()};
  t_scope_begin_library();
  return o;
}

void op_relabel(OpScope o) {
  const char *m = tg_last_error();
  size_t fl = strlen(o.fn);
  if (!o.had && m && !(strncmp(m, o.fn, fl) == 0 && m[fl] == ':')) {
    error_restate(TG_OK, NULL, "%s", o.fn);
  } else if (!tg_has_error()) {
    tg_set_error(TG_ERR_INVALID, "%s: failed", o.fn);
  }
}

tg_tensor op_scope_done(OpScope o, tg_tensor r) {
  if (tg_valid(r)) {
    r = tg_keep(r);
  } else {
    r = (tg_tensor){0};
    op_relabel(o);
  }
  tg_scope_end();
  return r;
}

int64_t ceil_div(int64_t a, int64_t b) {
  int64_t q = a / b, r = a % b;
  return (r != 0 && ((r > 0) == (b > 0))) ? q + 1 : q;
}
