/*
 * optim.c -- tinygrad's nn.optim: SGD, LARS and Muon (one LARS implementation: SGD is LARS without the
 * trust ratio, Muon is LARS with a Newton-Schulz orthogonalized momentum and decoupled weight decay), Adam, AdamW and LAMB (one LAMB implementation: Adam/AdamW are LAMB without the trust ratio).
 *
 * In: borrowed parameter handles and their gradients (after tg_backward). Out: lazy tg_assigns of the
 * new parameter values and optimizer state, handed back by schedule_step to be realized together with
 * the loss (one schedule; also what TinyJit captures).
 * Invariants: the optimizer owns its state handles (root scope: lr, momentum buffers, moments, the
 * b1^t / b2^t counters), all realized at construction so that tg_assign writes them in place; the
 * update formulas follow tinygrad's optim.py line by line, including its dtypes (state in float32, lr
 * in at least float32, updates cast to the parameter's dtype). A group (tinygrad's OptimizerGroup)
 * owns its member optimizers and has no state of its own; no parameter is in two of its members.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../helpers.h"
#include "../tensor/tensor.h"

#define NONE ((tg_tensor){0})

typedef enum { K_LARS, K_LAMB, K_GROUP } Kind;

struct tg_optim {
  Kind kind;
  const char *name; /* for messages: "SGD", "LARS", "Adam", "AdamW", "LAMB" */
  int n, nbuf;
  tg_tensor *params;  /* borrowed, requires_grad */
  tg_tensor *buffers; /* borrowed, realized with each step */
  const char *device; /* of params[0] (static storage) */
  tg_tensor lr;       /* owned, (1,) */
  /* LARS */
  double momentum, wd, tcoef;
  bool nesterov, classic, pre_wd; /* pre_wd: weight decay added to the gradient (else Muon's, after) */
  int ns_steps, n_ns;             /* Muon: Newton-Schulz steps and coefficients (n_ns 0: none) */
  double ns_coef[TG_MUON_MAX_COEFS];
  tg_tensor *b; /* owned momentum buffers (n, or none without momentum) */
  /* LAMB */
  double b1, b2, eps;
  bool adam;
  tg_tensor b1_t, b2_t; /* owned, (1,) float32 */
  tg_tensor *m, *v;     /* owned */
  /* group */
  tg_optim **members; /* owned */
  int nmembers;
};

/* ---- construction ---- */

/* A root-scope tensor with a buffer of its own holding `value` (lazy until finish() realizes it).
 * tg_full/tg_zeros of equal shape and value are one hash-consed node, so two optimizer states made
 * with them would realize into one shared buffer. */
static tg_tensor fresh(const int64_t *shape, int ndim, double value, const tg_opts *o) {
  tg_scope_begin();
  tg_tensor t = tg_assign(tg_empty(shape, ndim, o), tg_full(shape, ndim, value, o));
  t = t.id ? tg_persist(t) : t;
  tg_scope_end();
  return t;
}

static tg_optim *optim_new(const char *fn, const char *name, const tg_tensor *params, int n, double lr) {
  if (n < 0 || (n > 0 && !params)) {
    tg_set_error(TG_ERR_INVALID, "%s: params is NULL or n=%d < 0", fn, n);
    return NULL;
  }
  if (!(lr >= 0) || !isfinite(lr)) {
    tg_set_error(TG_ERR_INVALID, "%s: invalid learning rate %g", fn, lr);
    return NULL;
  }
  tg_optim *o = tg_xcalloc(1, sizeof *o);
  o->name = name;
  o->params = tg_xmalloc(sizeof(tg_tensor) * (size_t)(n + 1));
  o->buffers = tg_xmalloc(sizeof(tg_tensor) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    if (!tg_valid(params[i])) {
      tg_set_error(TG_ERR_HANDLE, "%s: parameter %d is %s", fn, i,
                   params[i].id ? "a freed or stale handle" : "none (an earlier call failed?)");
      tg_optim_free(o);
      return NULL;
    }
    /* as tinygrad's: a tensor whose requires_grad is unset becomes a parameter (and is marked so);
     * one marked false is a buffer */
    bool grad = t_slot(params[i])->requires_grad != 0;
    if (grad) tg_set_requires_grad(params[i], true);
    tg_tensor *list = grad ? o->params : o->buffers;
    int *cnt = grad ? &o->n : &o->nbuf;
    bool dup = false;
    for (int j = 0; j < *cnt && !dup; j++) dup = list[j].id == params[i].id;
    if (!dup) list[(*cnt)++] = params[i];
  }
  if (o->n == 0) {
    tg_set_error(
        TG_ERR_INVALID,
        "%s: optimizer must have at least one param (a tensor not marked requires_grad false; got %d "
        "tensors, all marked false)",
        fn, n);
    tg_optim_free(o);
    return NULL;
  }
  o->device = tg_device_of(o->params[0]);
  /* lr in at least float32 precision */
  tg_dtype ldt = tg_dtype_promote(tg_default_float(), TG_FLOAT32);
  tg_opts lo = {ldt, o->device, false};
  o->lr = fresh((const int64_t[]){1}, 1, lr, &lo);
  return o;
}

/* zeros of each param's shape in float32 on the optimizer's device (tinygrad's _new_optim_param) */
static tg_tensor *new_state(tg_optim *o) {
  tg_tensor *s = tg_xcalloc((size_t)o->n + 1, sizeof(tg_tensor));
  tg_opts zo = {TG_FLOAT32, o->device, false};
  for (int i = 0; i < o->n; i++) {
    int64_t sh[64];
    int nd = tg_shape(o->params[i], sh);
    s[i] = fresh(sh, nd < 0 ? 0 : nd, 0.0, &zo);
  }
  return s;
}

/* Realizes every owned state tensor (so assigns write them in place); frees o on error. */
static tg_optim *finish(const char *fn, tg_optim *o) {
  int cap = 3 + 3 * o->n, k = 0;
  tg_tensor *all = tg_xmalloc(sizeof(tg_tensor) * (size_t)cap);
  all[k++] = o->lr;
  if (o->b1_t.id) all[k++] = o->b1_t, all[k++] = o->b2_t;
  for (int i = 0; i < o->n; i++) {
    if (o->b) all[k++] = o->b[i];
    if (o->m) all[k++] = o->m[i], all[k++] = o->v[i];
  }
  bool ok = true;
  for (int i = 0; i < k; i++) ok = ok && tg_valid(all[i]);
  tg_status st = ok ? tg_realize_many(all, k) : (tg_has_error() ? tg_last_status() : TG_ERR_INVALID);
  free(all);
  if (st != TG_OK) {
    if (!tg_has_error()) tg_set_error(st, "%s: could not create the optimizer state", fn);
    tg_optim_free(o);
    return NULL;
  }
  return o;
}

static tg_optim *lars_new(const char *fn, const char *name, const tg_tensor *params, int n, double lr,
                          double momentum, double wd, double tcoef, bool nesterov, bool classic) {
  if (momentum < 0 || !isfinite(momentum)) {
    tg_set_error(TG_ERR_INVALID, "%s: invalid momentum value %g", fn, momentum);
    return NULL;
  }
  if (!isfinite(wd) || !isfinite(tcoef)) {
    tg_set_error(TG_ERR_INVALID, "%s: weight_decay %g and tcoef %g must be finite", fn, wd, tcoef);
    return NULL;
  }
  /* (tinygrad skips a negative one silently; PyTorch, and AdamW and LAMB here, refuse it) */
  if (wd < 0) {
    tg_set_error(TG_ERR_INVALID, "%s: invalid weight_decay value %g (it must be >= 0)", fn, wd);
    return NULL;
  }
  tg_optim *o = optim_new(fn, name, params, n, lr);
  if (!o) return NULL;
  o->kind = K_LARS;
  o->momentum = momentum, o->wd = wd, o->tcoef = tcoef, o->nesterov = nesterov, o->classic = classic;
  o->pre_wd = true;
  if (momentum) o->b = new_state(o);
  return o;
}

/* Options are taken as given (the TG_*_OPTS macros fill in tinygrad's defaults; NULL means them). */
tg_optim *tg_optim_sgd(const tg_tensor *params, int n, const tg_sgd_opts *opts) {
  const tg_sgd_opts opts_v = opts ? *opts : *TG_SGD_OPTS();
  opts = &opts_v;
  tg_optim *o = lars_new("tg_optim_sgd", "SGD", params, n, opts->lr, opts->momentum, opts->weight_decay, 0.0,
                         opts->nesterov, opts->classic);
  return o ? finish("tg_optim_sgd", o) : NULL;
}

tg_optim *tg_optim_lars(const tg_tensor *params, int n, const tg_lars_opts *opts) {
  const tg_lars_opts opts_v = opts ? *opts : *TG_LARS_OPTS();
  opts = &opts_v;
  tg_optim *o = lars_new("tg_optim_lars", "LARS", params, n, opts->lr, opts->momentum, opts->weight_decay,
                         opts->tcoef, opts->nesterov, opts->classic);
  return o ? finish("tg_optim_lars", o) : NULL;
}

tg_optim *tg_optim_muon(const tg_tensor *params, int n, const tg_muon_opts *opts) {
  const char *fn = "tg_optim_muon";
  const tg_muon_opts opts_v = opts ? *opts : *TG_MUON_OPTS();
  opts = &opts_v;
  double mom = opts->momentum, wd = opts->weight_decay;
  int nc = opts->n_ns_coefficients;
  if (opts->ns_steps < 0 || opts->ns_steps > TG_NS_MAX_STEPS) {
    tg_set_error(TG_ERR_INVALID, "%s: ns_steps %d must be in 0..%d (0 skips the iteration; the default is 5)", fn,
                 opts->ns_steps, TG_NS_MAX_STEPS);
    return NULL;
  }
  if (nc < 0 || nc > TG_MUON_MAX_COEFS) {
    tg_set_error(TG_ERR_INVALID, "%s: n_ns_coefficients %d must be in 0..%d", fn, nc, TG_MUON_MAX_COEFS);
    return NULL;
  }
  for (int i = 0; i < nc; i++)
    if (!isfinite(opts->ns_coefficients[i])) {
      tg_set_error(TG_ERR_INVALID, "%s: ns_coefficients[%d] = %g is not finite", fn, i, opts->ns_coefficients[i]);
      return NULL;
    }
  for (int i = 0; i < n && params; i++)
    /* every tensor the optimizer takes as a parameter: requires_grad true or unset (a buffer, marked
     * false, is not updated) */
    if (tg_valid(params[i]) && t_slot(params[i])->requires_grad != 0 && (tg_ndim(params[i]) < 1 || tg_numel(params[i]) == 0)) {
      tg_set_error(TG_ERR_INVALID, "%s: parameter %d is %s; Muon views each parameter as (shape[0], -1), which needs at least one "
                   "dim and one element", fn, i, tg_ndim(params[i]) < 1 ? "0-d" : "empty (0 elements)");
      return NULL;
    }
  tg_optim *o = lars_new(fn, "Muon", params, n, opts->lr, mom, wd, 0.0, opts->nesterov, false);
  if (!o) return NULL;
  o->pre_wd = false;
  o->ns_steps = opts->ns_steps;
  o->n_ns = nc;
  memcpy(o->ns_coef, opts->ns_coefficients, sizeof(double) * (size_t)nc);
  return finish(fn, o);
}

static tg_optim *lamb_new(const char *fn, const char *name, const tg_tensor *params, int n, double lr,
                          double b1, double b2, double eps, double wd, bool adam) {
  if (wd < 0 || !isfinite(wd)) {
    tg_set_error(TG_ERR_INVALID, "%s: invalid weight_decay value %g", fn, wd);
    return NULL;
  }
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1) || !(eps >= 0) || !isfinite(eps)) {
    tg_set_error(TG_ERR_INVALID, "%s: betas (%g, %g) must be in [0, 1) and eps %g non-negative", fn, b1, b2,
                 eps);
    return NULL;
  }
  tg_optim *o = optim_new(fn, name, params, n, lr);
  if (!o) return NULL;
  o->kind = K_LAMB;
  o->b1 = b1, o->b2 = b2, o->eps = eps, o->wd = wd, o->adam = adam;
  tg_opts fo = {TG_FLOAT32, o->device, false};
  o->b1_t = fresh((const int64_t[]){1}, 1, 1.0, &fo);
  o->b2_t = fresh((const int64_t[]){1}, 1, 1.0, &fo);
  o->m = new_state(o);
  o->v = new_state(o);
  return finish(fn, o);
}

tg_optim *tg_optim_adam(const tg_tensor *params, int n, const tg_adam_opts *opts) {
  const tg_adam_opts opts_v = opts ? *opts : *TG_ADAM_OPTS();
  opts = &opts_v;
  return lamb_new("tg_optim_adam", "Adam", params, n, opts->lr, opts->b1, opts->b2, opts->eps, 0.0, true);
}

tg_optim *tg_optim_adamw(const tg_tensor *params, int n, const tg_adamw_opts *opts) {
  const tg_adamw_opts opts_v = opts ? *opts : *TG_ADAMW_OPTS();
  opts = &opts_v;
  return lamb_new("tg_optim_adamw", "AdamW", params, n, opts->lr, opts->b1, opts->b2, opts->eps,
                  opts->weight_decay, true);
}

tg_optim *tg_optim_lamb(const tg_tensor *params, int n, const tg_lamb_opts *opts) {
  const tg_lamb_opts opts_v = opts ? *opts : *TG_LAMB_OPTS();
  opts = &opts_v;
  return lamb_new("tg_optim_lamb", "LAMB", params, n, opts->lr, opts->b1, opts->b2, opts->eps,
                  opts->weight_decay, false);
}

static void free_list(tg_tensor *ts, int n) {
  for (int i = 0; ts && i < n; i++) tg_free(ts[i]);
  free(ts);
}

void tg_optim_free(tg_optim *o) {
  if (!o) return;
  for (int i = 0; i < o->nmembers; i++) tg_optim_free(o->members[i]);
  free(o->members);
  tg_free(o->lr);
  tg_free(o->b1_t);
  tg_free(o->b2_t);
  free_list(o->b, o->n);
  free_list(o->m, o->n);
  free_list(o->v, o->n);
  free(o->params);
  free(o->buffers);
  free(o);
}

/* ---- stepping ---- */

void tg_optim_zero_grad(tg_optim *o) {
  if (!o) return;
  for (int i = 0; i < o->nmembers; i++) tg_optim_zero_grad(o->members[i]);
  for (int i = 0; i < o->n; i++) tg_zero_grad(o->params[i]);
}

static int extra_count(const tg_optim *o) {
  if (o->kind == K_GROUP) return 0;
  if (o->kind == K_LAMB) return 2 + 2 * o->n;
  return o->b ? o->n : 0;
}

/* sqrt(sum(x^2)) as a 0-d tensor */
static tg_tensor norm2(tg_tensor x) { return tg_sqrt(tg_sum(tg_square(x), NULL, 0, false)); }

/* where(a > 0, where(b > 0, num, 1), 1) */
static tg_tensor ratio_or_one(tg_tensor a, tg_tensor b, tg_tensor num) {
  tg_tensor one = tg_const_like(num, 1.0);
  return tg_where(tg_gt_s(a, 0), tg_where(tg_gt_s(b, 0), num, one), one);
}

static tg_tensor to_dev(tg_tensor t, const char *dev) {
  const char *d = tg_device_of(t);
  return d && strcmp(d, dev) != 0 ? tg_to(t, dev) : t;
}

/* LARS._step for parameter i: returns the update (param dtype, param device) */
static tg_tensor lars_update(tg_optim *o, int i, tg_tensor t, tg_tensor g, tg_tensor lr0) {
  tg_tensor td = tg_detach(t), r = NONE;
  if (o->tcoef != 0) {
    tg_tensor r1 = norm2(td), r2 = norm2(g);
    r = ratio_or_one(r1, r2, tg_div(tg_mul_s(r1, o->tcoef), tg_add(r2, tg_mul_s(r1, o->wd))));
  }
  if (o->pre_wd && o->wd > 0) g = tg_add(g, tg_mul_s(td, o->wd));
  if (o->classic) g = tg_mul(r.id ? tg_mul(g, r) : g, lr0);
  if (o->momentum) {
    tg_assign(o->b[i], tg_add(tg_mul_s(o->b[i], o->momentum), g));
    g = o->nesterov ? tg_add(g, tg_mul_s(o->b[i], o->momentum)) : o->b[i];
  }
  if (o->n_ns) {
    int64_t sh[64];
    int nd = tg_shape(g, sh);
    tg_tensor g2 = tg_reshape(g, (const int64_t[]){sh[0], -1}, 2);
    g = tg_reshape(tg_newton_schulz(g2, o->ns_steps, o->ns_coef, o->n_ns, 1e-7), sh, nd);
  }
  if (!o->classic) g = tg_mul(r.id ? tg_mul(g, r) : g, lr0);
  if (!o->pre_wd && o->wd > 0) g = tg_add(g, tg_mul(tg_mul_s(td, o->wd), lr0));
  return tg_cast(g, tg_dtype_of(t));
}

/* LAMB._step for parameter i (after b1_t / b2_t were advanced) */
static tg_tensor lamb_update(tg_optim *o, int i, tg_tensor t, tg_tensor g, tg_tensor lr0, tg_tensor b1t,
                             tg_tensor b2t) {
  tg_dtype mdt = tg_dtype_of(o->m[i]), vdt = tg_dtype_of(o->v[i]);
  /* the moments' increments in the moments' own (float32) precision: for a float16 parameter,
   * (1 - b2) * g * g rounded to float16 is 0 below |g| of about 8e-3, and v = 0 makes the step
   * lr * g / eps (tinygrad computes the expression in float32 too) */
  tg_tensor gm = tg_cast(g, mdt), gv = tg_cast(g, vdt);
  tg_assign(o->m[i], tg_cast(tg_add(tg_mul_s(o->m[i], o->b1), tg_mul_s(gm, 1.0 - o->b1)), mdt));
  tg_assign(o->v[i], tg_cast(tg_add(tg_mul_s(o->v[i], o->b2), tg_mul_s(tg_mul(gv, gv), 1.0 - o->b2)), vdt));
  tg_tensor m_hat = tg_div(o->m[i], tg_rsub_s(1.0, b1t));
  tg_tensor v_hat = tg_div(o->v[i], tg_rsub_s(1.0, b2t));
  tg_tensor td = tg_detach(t);
  tg_tensor up = tg_div(m_hat, tg_add_s(tg_sqrt(v_hat), o->eps));
  if (o->wd) up = tg_add(up, tg_mul_s(to_dev(td, o->device), o->wd));
  tg_tensor scale = lr0;
  if (!o->adam) {
    tg_tensor r1 = norm2(tg_cast(to_dev(td, o->device), tg_dtype_of(up))), r2 = norm2(up); /* (a float16 weight's norm in float32) */
    scale = tg_mul(lr0, ratio_or_one(r1, r2, tg_div(r1, r2)));
  }
  return tg_cast(tg_mul(scale, up), tg_dtype_of(t));
}

/* Can o step (every parameter alive and with a gradient)? Checked for every member of a group before
 * any of them assigns anything. `where` names the group member in messages ("group member 1: "). */
static bool ready(const tg_optim *o, const char *fn, const char *where) {
  for (int i = 0; i < o->nmembers; i++) {
    char w[256];
    snprintf(w, sizeof w, "%.200s%smember %d: ", where, where[0] ? "" : "group ", i);
    if (!ready(o->members[i], fn, w)) return false;
  }
  for (int i = 0; i < o->n; i++) {
    if (!tg_valid(o->params[i]))
      return tg_set_error(TG_ERR_HANDLE, "%s: %s%s parameter %d was freed (the optimizer borrows its parameters)",
                          fn, where, o->name, i),
             false;
    tg_tensor g = tg_grad(o->params[i]);
    bool has = g.id != 0;
    tg_free(g);
    if (!has)
      return tg_set_error(TG_ERR_INVALID,
                          "%s: %s%s parameter %d has no gradient; call tg_backward on a loss that uses it first",
                          fn, where, o->name, i),
             false;
  }
  return true;
}

static int total_count(const tg_optim *o) {
  int total = extra_count(o) + o->n + o->nbuf;
  for (int i = 0; i < o->nmembers; i++) total += total_count(o->members[i]);
  return total;
}

int tg_optim_schedule_step(tg_optim *o, tg_tensor *out, int cap) {
  const char *fn = "tg_optim_schedule_step";
  if (!o) return tg_set_error(TG_ERR_INVALID, "%s: optimizer is NULL", fn), -1;
  int total = total_count(o);
  if (!out) return total;
  if (cap < total)
    return tg_set_error(TG_ERR_INVALID, "%s: out has room for %d tensors, the step needs %d", fn, cap, total),
           -1;
  if (!tg_getenv_int("TRAINING", 0))
    return tg_set_error(TG_ERR_INVALID,
                        "%s: TRAINING=0; the optimizer only steps in training mode: "
                        "tg_context_set_int(\"TRAINING\", 1) "
                        "first (tinygrad's Context(TRAINING=1))",
                        fn),
           -1;
  /* every parameter must have a gradient before anything is assigned */
  if (!ready(o, fn, "")) return -1;
  if (o->kind == K_GROUP) {
    /* each member's tensors in turn (tinygrad's OptimizerGroup.schedule_step) */
    int k = 0;
    for (int i = 0; i < o->nmembers; i++) {
      int m = tg_optim_schedule_step(o->members[i], out + k, cap - k);
      if (m < 0) return -1;
      k += m;
    }
    return k;
  }
  bool had = tg_has_error();
  tg_scope_begin();
  tg_tensor lr0 = tg_reshape(o->lr, NULL, 0); /* 0-d view: broadcasts against any parameter shape */
  tg_tensor b1t = NONE, b2t = NONE;
  if (o->kind == K_LAMB) {
    tg_assign(o->b1_t, tg_mul_s(o->b1_t, o->b1));
    tg_assign(o->b2_t, tg_mul_s(o->b2_t, o->b2));
    b1t = tg_reshape(o->b1_t, NULL, 0), b2t = tg_reshape(o->b2_t, NULL, 0);
  }
  for (int i = 0; i < o->n; i++) {
    tg_tensor t = o->params[i], g = tg_grad(t);
    tg_tensor up = o->kind == K_LARS ? lars_update(o, i, t, to_dev(g, o->device), lr0)
                                     : lamb_update(o, i, t, to_dev(g, o->device), lr0, b1t, b2t);
    tg_assign(t, tg_sub(tg_detach(t), to_dev(up, tg_device_of(t))));
  }
  tg_scope_end();
  if (!had && tg_has_error()) {
    const char *m = tg_last_error();
    if (strncmp(m, fn, strlen(fn)) != 0) {
      char buf[1200];
      snprintf(buf, sizeof buf, "%s: %s", fn, m);
      tg_status st = tg_last_status();
      tg_clear_error();
      tg_set_error(st, "%s", buf);
    }
    return -1;
  }
  int k = 0;
  if (o->kind == K_LAMB) {
    out[k++] = o->b1_t, out[k++] = o->b2_t;
    for (int i = 0; i < o->n; i++) out[k++] = o->m[i];
    for (int i = 0; i < o->n; i++) out[k++] = o->v[i];
  } else if (o->b) {
    for (int i = 0; i < o->n; i++) out[k++] = o->b[i];
  }
  for (int i = 0; i < o->n; i++) out[k++] = o->params[i];
  for (int i = 0; i < o->nbuf; i++) out[k++] = o->buffers[i];
  return k;
}

tg_status tg_optim_step(tg_optim *o) {
  int n = tg_optim_schedule_step(o, NULL, 0);
  if (n < 0) return tg_last_status();
  tg_tensor *ts = tg_xmalloc(sizeof(tg_tensor) * (size_t)(n + 1));
  int k = tg_optim_schedule_step(o, ts, n);
  tg_status st = k < 0 ? tg_last_status() : tg_realize_many(ts, k);
  free(ts);
  return st;
}

/* A group has no learning rate of its own (nor has tinygrad's OptimizerGroup). */
static bool not_group(const tg_optim *o, const char *fn) {
  if (!o) return tg_set_error(TG_ERR_INVALID, "%s: optimizer is NULL", fn), false;
  if (o->kind != K_GROUP) return true;
  tg_set_error(TG_ERR_INVALID,
               "%s: an optimizer group (of %d optimizers) has no learning rate of its own, as in tinygrad; use "
               "its members' (tg_optim_group_get(group, i))",
               fn, o->nmembers);
  return false;
}

tg_status tg_optim_set_lr(tg_optim *o, double lr) {
  if (!not_group(o, "tg_optim_set_lr")) return tg_last_status();
  if (!(lr >= 0) || !isfinite(lr))
    return tg_set_error(TG_ERR_INVALID, "tg_optim_set_lr: invalid learning rate %g", lr);
  tg_scope_begin();
  tg_assign(o->lr, tg_full_like(o->lr, lr, NULL));
  tg_status st = tg_realize(o->lr);
  tg_scope_end();
  return st;
}

double tg_optim_get_lr(const tg_optim *o) {
  double v = NAN;
  if (!not_group(o, "tg_optim_get_lr")) return v;
  tg_scope_begin();
  if (tg_item(o->lr, &v) != TG_OK) v = NAN;
  tg_scope_end();
  return v;
}

tg_tensor tg_optim_lr(const tg_optim *o) {
  if (!not_group(o, "tg_optim_lr")) return NONE;
  return o->lr;
}

static tg_status put_named(tg_state_dict *sd, const char *prefix, const char *name, int idx, tg_tensor t) {
  char buf[512];
  const char *dot = prefix[0] && prefix[strlen(prefix) - 1] != '.' ? "." : "";
  if (idx >= 0)
    snprintf(buf, sizeof buf, "%.400s%s%s.%d", prefix, dot, name, idx);
  else
    snprintf(buf, sizeof buf, "%.400s%s%s", prefix, dot, name);
  return tg_state_dict_set(sd, buf, t);
}

tg_status tg_optim_state(const tg_optim *o, tg_state_dict *sd, const char *prefix) {
  if (!o || !sd)
    return tg_set_error(TG_ERR_INVALID, "tg_optim_state: %s is NULL", o ? "state dict" : "optimizer");
  if (!prefix) prefix = "";
  if (o->kind == K_GROUP) {
    /* tinygrad's get_state_dict of an OptimizerGroup: "optimizers.<i>." before each member's names */
    tg_status st = TG_OK;
    const char *dot = prefix[0] && prefix[strlen(prefix) - 1] != '.' ? "." : "";
    for (int i = 0; st == TG_OK && i < o->nmembers; i++) {
      char sub[512];
      snprintf(sub, sizeof sub, "%.400s%soptimizers.%d", prefix, dot, i);
      st = tg_optim_state(o->members[i], sd, sub);
    }
    return st;
  }
  tg_status st = put_named(sd, prefix, "lr", -1, o->lr);
  if (st == TG_OK && o->b1_t.id) st = put_named(sd, prefix, "b1_t", -1, o->b1_t);
  if (st == TG_OK && o->b2_t.id) st = put_named(sd, prefix, "b2_t", -1, o->b2_t);
  for (int i = 0; st == TG_OK && o->m && i < o->n; i++) st = put_named(sd, prefix, "m", i, o->m[i]);
  for (int i = 0; st == TG_OK && o->v && i < o->n; i++) st = put_named(sd, prefix, "v", i, o->v[i]);
  for (int i = 0; st == TG_OK && o->b && i < o->n; i++) st = put_named(sd, prefix, "b", i, o->b[i]);
  return st;
}

/* ---- groups ---- */

typedef struct {
  tg_optim **v;
  int n, cap;
} OptimList;

/* Adds o to l unless it is there already; returns whether it was. */
static bool list_add(OptimList *l, tg_optim *o) {
  for (int i = 0; i < l->n; i++)
    if (l->v[i] == o) return true;
  if (l->n == l->cap) l->cap = l->cap ? 2 * l->cap : 8, l->v = tg_xrealloc(l->v, sizeof(tg_optim *) * (size_t)l->cap);
  l->v[l->n++] = o;
  return false;
}

/* Collects the single optimizers under o (o itself when it is one) into leaves and the groups into
 * groups, each once; returns whether a single optimizer was met twice. */
static bool collect(tg_optim *o, OptimList *leaves, OptimList *groups) {
  if (o->kind != K_GROUP) return list_add(leaves, o);
  bool twice = false;
  if (!list_add(groups, o))
    for (int i = 0; i < o->nmembers; i++) twice = collect(o->members[i], leaves, groups) || twice;
  else
    twice = true;
  return twice;
}

/* The failure path of tg_optim_group: frees every optimizer it was given exactly once (the same one
 * may be listed twice, or sit inside a listed group too). */
static void free_given(tg_optim *const *optims, int n) {
  OptimList leaves = {0}, groups = {0};
  for (int i = 0; i < n; i++)
    if (optims[i]) collect(optims[i], &leaves, &groups);
  for (int i = 0; i < groups.n; i++) groups.v[i]->nmembers = 0; /* the members go with the leaves */
  for (int i = 0; i < leaves.n; i++) tg_optim_free(leaves.v[i]);
  for (int i = 0; i < groups.n; i++) tg_optim_free(groups.v[i]);
  free(leaves.v);
  free(groups.v);
}

tg_optim *tg_optim_group(tg_optim *const *optims, int n) {
  const char *fn = "tg_optim_group";
  if (n < 1 || !optims) {
    tg_set_error(TG_ERR_INVALID, "%s: needs at least one optimizer (got %s, n=%d)", fn, optims ? "a list" : "NULL", n);
    return NULL;
  }
  for (int i = 0; i < n; i++)
    if (!optims[i]) {
      if (!tg_has_error())
        tg_set_error(TG_ERR_INVALID, "%s: optimizer %d is NULL (did its constructor fail?); the others were freed", fn, i);
      free_given(optims, n);
      return NULL;
    }
  /* every single optimizer once, and every parameter in one of them only */
  OptimList leaves = {0}, groups = {0};
  bool twice = false;
  for (int i = 0; i < n; i++) twice = collect(optims[i], &leaves, &groups) || twice;
  int bi = -1, bj = -1, bp = -1;
  for (int i = 0; i < leaves.n && !twice && bi < 0; i++)
    for (int j = 0; j < i && bi < 0; j++)
      for (int p = 0; p < leaves.v[i]->n && bi < 0; p++)
        for (int q = 0; q < leaves.v[j]->n; q++)
          if (leaves.v[i]->params[p].id == leaves.v[j]->params[q].id) {
            bi = j, bj = i, bp = p;
            break;
          }
  const char *ni = bi >= 0 ? leaves.v[bi]->name : "", *nj = bj >= 0 ? leaves.v[bj]->name : "";
  free(leaves.v);
  free(groups.v);
  if (twice || bi >= 0) {
    if (twice)
      tg_set_error(TG_ERR_INVALID, "%s: an optimizer is listed twice (directly or inside a group); each one can be in a "
                   "group once (all were freed)", fn);
    else
      tg_set_error(TG_ERR_INVALID, "%s: parameter %d of optimizer %d (%s) is also in optimizer %d (%s), counting the "
                   "members of groups in order; a parameter can be updated by one optimizer only (all were freed)",
                   fn, bp, bj, nj, bi, ni);
    free_given(optims, n);
    return NULL;
  }
  tg_optim *o = tg_xcalloc(1, sizeof *o);
  o->kind = K_GROUP;
  o->name = "OptimizerGroup";
  o->members = tg_xmalloc(sizeof(tg_optim *) * (size_t)n);
  memcpy(o->members, optims, sizeof(tg_optim *) * (size_t)n);
  o->nmembers = n;
  return o;
}

tg_optim *tg_optim_group_get(const tg_optim *o, int i) {
  const char *fn = "tg_optim_group_get";
  if (!o) return tg_set_error(TG_ERR_INVALID, "%s: optimizer is NULL", fn), NULL;
  if (o->kind != K_GROUP)
    return tg_set_error(TG_ERR_INVALID, "%s: this %s optimizer is not a group (tg_optim_group makes one)", fn, o->name),
           NULL;
  if (i < 0 || i >= o->nmembers)
    return tg_set_error(TG_ERR_INVALID, "%s: index %d is out of range for a group of %d optimizers (0..%d)", fn, i,
                        o->nmembers, o->nmembers - 1),
           NULL;
  return o->members[i];
}

int tg_optim_group_count(const tg_optim *o) {
  if (!o) return tg_set_error(TG_ERR_INVALID, "tg_optim_group_count: optimizer is NULL"), -1;
  return o->kind == K_GROUP ? o->nmembers : 0;
}
