/*
 * jit.c -- TinyJit: capture the kernels a function runs and replay them.
 *
 * Call 1 runs the function normally (kernels compile, shapes settle). Call 2 runs it again while the
 * engine records every executed kernel and copy with the buffers it used. Later calls check that the
 * inputs match what was captured (count, shape, dtype, device, realized, non-tensor arguments) and
 * replay the recorded launches with the new inputs' buffers swapped in: no graph building, no
 * scheduling, no codegen. Outputs are the same device buffers on every replay (as in tinygrad), each
 * call returning fresh handles to them.
 *
 * Refused as tinygrad refuses them, because each would replay something else than the function:
 * a jit called from inside a jitted function (itself or another), the same buffer passed as two
 * inputs, a capture that runs no kernel, reading data during the capture (creation.c). An input
 * that a replay writes (a previous call's output fed back) is copied first, as tinygrad does,
 * since the replay overwrites it while other kernels of the same replay still read it.
 *
 * The capture itself (recording launches, replaying, pruning) is the engine's (engine/realize.c);
 * this file is the tensor API over it: handles in and out, and the checks a replay needs.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/engine.h"
#include "tensor.h"

/* An input's or output's dtype, device and shape. A symbolic one (a [0, v + c) view of a buffer
 * stored at its max) also keeps its dims as tg_sym codes (sym) and the shape of the buffer behind
 * it (base). */
typedef struct {
  tg_dtype dtype;
  int device;
  int ndim;
  int64_t *shape;
  int64_t *sym;  /* NULL: no symbolic dim */
  int64_t *base;
} Sig;

struct tg_jit {
  tg_jit_fn fn;
  void *user;
  int nout;
  int calls;
  /* captured state */
  Capture cap;
  int nin, nargs;
  Sig *in_sig;
  Buffer **in_buf;   /* input buffers at capture (refs) */
  double *args;
  Sig *out_sig;
  Buffer **out_buf;  /* output buffers (refs) */
  Buffer **written;  /* persistent buffers the captured items write, inputs excepted (refs) */
  int nwritten;
  bool prune, rerun_constants;
  atomic_bool busy;  /* a call is running: a second one (another thread) is refused */
  bool free_pending; /* tg_jit_free was called from inside the running function: freed when it returns */
  int *vars;         /* the variables passed to the captured call (indices), whose values replays pass on */
  int nvars;
  int64_t *var_limit; /* per vars[k]: the largest value the captured graph reads in bounds (jit_note_var_le) */
  int64_t *var_floor; /* per vars[k]: the least such value */
  JitVarLe *rel;      /* relations between two of vars[] the captured graph needs (jit_note_var_le) */
  int nrel;
  /* multi-device tensors: the captured call sees their shards as separate tensors (flattened), and
   * the user function sees them joined again; the layout of each output (shards, axis, tuple) is
   * taken from the first call. */
  bool multi;
  int nuser_out;     /* the user's nout (nout is the flattened count while a flattened call runs) */
  int *out_lay;      /* 3 per user output: shard count (0: a plain tensor), axis, tuple id */
  uint64_t *in_key;  /* per user input of the first call: its layout and whole shape (in_key_of) */
  int nin_key;
  int ncap_out;      /* entries of out_sig/out_buf (the nout of the captured call) */
};

/* Jitted functions running on this thread: a tg_jit_call inside one is nesting. */
static _Thread_local int tl_depth;
/* The bound variables of the tg_jit_call_vars running on this thread (tg_jit_var). */
static _Thread_local const tg_symvar *tl_vars;
static _Thread_local int tl_nvars;

tg_symvar tg_jit_var(int i) { return tl_vars && i >= 0 && i < tl_nvars ? tl_vars[i] : (tg_symvar){0}; }

/* The bounds the jitted function's graph puts on its variables while it runs on this thread: a
 * symbolic shrink of a dim of n ending at v + c reads in bounds only for v <= n - c, one starting at
 * v + c only for v >= -c, a symbolic pad v + c is a size only for v >= -c. The capture keeps them,
 * and a replay refuses a value outside them (it would read or write outside the buffers: the graph's
 * own checks ran only for the values of the first calls). */
#define MAX_VAR_LIMITS 64
static _Thread_local struct {
  int var;
  int64_t min, max;
} tl_limits[MAX_VAR_LIMITS];
static _Thread_local int tl_nlimits;
static _Thread_local JitVarLe tl_rel[MAX_VAR_LIMITS];
static _Thread_local int tl_nrel;

static void jit_note_var_range(int var, int64_t min, int64_t max) {
  for (int i = 0; i < tl_nlimits; i++)
    if (tl_limits[i].var == var) {
      if (max < tl_limits[i].max) tl_limits[i].max = max;
      if (min > tl_limits[i].min) tl_limits[i].min = min;
      return;
    }
  if (tl_nlimits < MAX_VAR_LIMITS) tl_limits[tl_nlimits].var = var, tl_limits[tl_nlimits].min = min, tl_limits[tl_nlimits++].max = max;
}

void jit_note_var_le(int va, int64_t ca, int vb, int64_t cb) {
  if (tl_depth <= 0) return;
  if (va == vb) return; /* (a constant relation: the graph's own check holds for every value) */
  if (va < 0) { /* ca <= vb + cb */
    jit_note_var_range(vb, ca - cb, INT64_MAX);
    return;
  }
  if (vb < 0) { /* va + ca <= cb */
    jit_note_var_range(va, INT64_MIN, cb - ca);
    return;
  }
  for (int i = 0; i < tl_nrel; i++)
    if (tl_rel[i].va == va && tl_rel[i].vb == vb) {
      if (cb - ca < tl_rel[i].cb - tl_rel[i].ca) tl_rel[i].ca = ca, tl_rel[i].cb = cb;
      return;
    }
  if (tl_nrel < MAX_VAR_LIMITS) tl_rel[tl_nrel++] = (JitVarLe){va, ca, vb, cb};
}


tg_jit *tg_jit_new_opts(tg_jit_fn fn, int nout, void *user, const tg_jit_opts *opts) {
  if (!fn || nout < 0) {
    if (!fn) tg_set_error(TG_ERR_INVALID, "tg_jit_new: fn is NULL (give the function to capture)");
    else tg_set_error(TG_ERR_INVALID, "tg_jit_new: nout=%d is negative (the number of outputs fn sets)", nout);
    return NULL;
  }
  tg_jit *j = tg_xcalloc(1, sizeof *j);
  j->fn = fn;
  j->user = user;
  j->nout = nout;
  j->prune = opts && opts->prune;
  j->rerun_constants = opts && opts->rerun_constants;
  atomic_init(&j->busy, false);
  return j;
}

tg_jit *tg_jit_new(tg_jit_fn fn, int nout, void *user) { return tg_jit_new_opts(fn, nout, user, NULL); }

static void sig_free(Sig *s, int n) {
  for (int i = 0; s && i < n; i++) free(s[i].shape), free(s[i].sym), free(s[i].base);
  free(s);
}

/* Drops everything captured (a failed capture leaves the jit as after its first call, to capture
 * again on the next one). */
static void jit_reset(tg_jit *j) {
  capture_free(&j->cap);
  for (int i = 0; j->in_buf && i < j->nin; i++) buffer_unref(j->in_buf[i]);
  for (int i = 0; j->out_buf && i < j->ncap_out; i++) buffer_unref(j->out_buf[i]);
  for (int i = 0; i < j->nwritten; i++) buffer_unref(j->written[i]);
  free(j->written);
  j->written = NULL;
  j->nwritten = 0;
  free(j->in_buf);
  free(j->out_buf);
  sig_free(j->in_sig, j->nin);
  sig_free(j->out_sig, j->ncap_out);
  j->ncap_out = 0;
  free(j->args);
  free(j->vars), free(j->var_limit), free(j->var_floor), free(j->rel);
  j->vars = NULL, j->var_limit = NULL, j->var_floor = NULL, j->rel = NULL, j->nrel = 0;
  j->nvars = 0;
  j->in_buf = j->out_buf = NULL;
  j->in_sig = j->out_sig = NULL;
  j->args = NULL;
  j->nin = j->nargs = 0;
}

void tg_jit_free(tg_jit *j) {
  if (!j) return;
  if (atomic_load(&j->busy)) {
    /* inside its own function (or one it calls): freed when the call returns; from another thread
     * while a call runs: refused (freeing it would pull the memory from under that call) */
    if (tl_depth > 0) j->free_pending = true;
    else
      tg_set_error(TG_ERR_INVALID, "tg_jit_free: the jit is running a call in another thread; free it after that "
                                   "tg_jit_call returns");
    return;
  }
  free(j->out_lay), free(j->in_key);
  jit_reset(j);
  free(j);
}

/* Is u the [0, v + c) view of a realized buffer that a realize of a symbolic shape hands out (or
 * that a caller builds with tg_shrink to pass a symbolic input)? Every start 0, every end the full
 * size or a tg_sym code. Its buffer node in *base. */
static bool sym_view(UOp *u, UOp **base) {
  if (!u || u->op != OP_SHRINK || !u->sym || u->nsrc != 1) return false;
  UOp *b = g_resolve(u->src[0]);
  if (b->op != OP_BUFFER || b->ndim != u->ndim) return false;
  int n = 0;
  const int64_t *a = uop_move_args(u, &n);
  if (n != 2 * u->ndim) return false;
  for (int d = 0; d < u->ndim; d++)
    if (a[2 * d] != 0 || (!sym_is_code(a[2 * d + 1]) && a[2 * d + 1] != b->shape[d])) return false;
  if (base) *base = b;
  return true;
}

static int64_t *dup_dims(const int64_t *s, int n) {
  int64_t *d = tg_xmalloc(sizeof(int64_t) * (size_t)(n + 1));
  if (n) memcpy(d, s, sizeof(int64_t) * (size_t)n);
  return d;
}

static Sig sig_of(UOp *u) {
  Sig s = {(tg_dtype)u->dtype, u->device, u->ndim, NULL, NULL, NULL};
  if (u->ndim) s.shape = dup_dims(u->shape, u->ndim);
  UOp *b;
  if (sym_view(u, &b)) s.sym = dup_dims(u->sym, u->ndim), s.base = dup_dims(b->shape, b->ndim);
  return s;
}

/* Same dtype, device and shape; a symbolic dim must be the same variable + offset (any value), and
 * the buffer behind a symbolic view the same shape past its first dim (which no index reads). */
/* A shape for messages: "(7, 3)", a symbolic dim by its variable's name ("(q, 3)", "(q+1, 3)"). */
static const char *shape_text(char *buf, size_t n, const int64_t *shape, const int64_t *sym, int ndim) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, n - o, "(");
  for (int d = 0; d < ndim && o < n; d++) {
    SymDim v;
    const char *name = "?";
    if (sym && sym_decode(sym[d], &v)) {
      var_info(v.var, &name, NULL, NULL);
      if (v.offset) o += (size_t)snprintf(buf + o, n - o, "%s%s%+lld", d ? ", " : "", name, (long long)v.offset);
      else o += (size_t)snprintf(buf + o, n - o, "%s%s", d ? ", " : "", name);
    } else {
      o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
    }
  }
  if (o < n) snprintf(buf + o, n - o, ndim == 1 ? ",)" : ")");
  return buf;
}

static bool sig_eq(const Sig *s, UOp *u) {
  if (s->dtype != (tg_dtype)u->dtype || s->device != u->device || s->ndim != u->ndim) return false;
  UOp *b = NULL;
  bool sv = sym_view(u, &b);
  if (sv != (s->sym != NULL)) return false;
  if (!sv) return !s->ndim || !memcmp(s->shape, u->shape, sizeof(int64_t) * (size_t)s->ndim);
  for (int d = 0; d < s->ndim; d++) {
    SymDim a, c;
    bool as = sym_decode(s->sym[d], &a), cs = sym_decode(u->sym[d], &c);
    if (as != cs || (as && (a.var != c.var || a.offset != c.offset)) || (!as && s->sym[d] != u->sym[d])) return false;
    if (d && b->shape[d] != s->base[d]) return false;
  }
  return true;
}

/* The buffer behind a realized, contiguous input (or a symbolic view of one); NULL + error otherwise. */
static Buffer *input_buffer(tg_tensor t, int i) {
  UOp *u = t_get(t, "tg_jit_call");
  if (!u) return NULL;
  UOp *b = g_resolve(u), *vb;
  if (sym_view(b, &vb)) b = vb;
  if (b->op != OP_BUFFER) {
    tg_set_error(TG_ERR_INVALID, "tg_jit_call: input %d is not realized (or is a view); realize it (tg_realize, tg_contiguous) before calling the jitted function (a symbolic input is a [0, v) tg_shrink of a realized tensor)", i);
    return NULL;
  }
  return g_buffer_of(b);
}

/* Runs fn in its own scope; outputs are realized, contiguous and moved to the caller's scope. */
static tg_status run_fn(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out) {
  tg_scope_begin();
  int depth = t_scope_depth();
  for (int i = 0; i < j->nout; i++) out[i] = (tg_tensor){0};
  tl_nlimits = 0, tl_nrel = 0;
  tl_depth++;
  tg_status st = j->fn(in, nin, args, nargs, out, j->nout, j->user);
  tl_depth--;
  /* the function's scopes must balance: extra ones it left open are closed (their handles would
   * outlive every call), and one it closed that it had not opened is reported */
  if (t_scope_depth() != depth) {
    int d = t_scope_depth(), k = d > depth ? d - depth : depth - d;
    while (t_scope_depth() > depth) tg_scope_end();
    if (st == TG_OK || !tg_has_error())
      st = tg_set_error(TG_ERR_INVALID, "tg_jit_call: the jitted function %s %d scope%s (tg_scope_begin and tg_scope_end "
                                        "must pair up inside it)", d > depth ? "left open" : "closed", k, k == 1 ? "" : "s");
    if (t_scope_depth() < depth) {
      for (int i = 0; i < j->nout; i++) out[i] = (tg_tensor){0};
      while (t_scope_depth() < depth - 1) tg_scope_begin(); /* the caller's scopes it closed are gone: reopen */
      return st;
    }
  }
  /* realize first, then copy only what is still a view: an assigned input returned as itself stays
   * its own buffer (a contiguous copy of it would hide that the function writes the input) */
  /* an output the function left unset (or freed) is its error, not one of the realize below */
  for (int i = 0; st == TG_OK && i < j->nout; i++)
    if (!tg_valid(out[i]))
      st = tg_has_error() ? tg_last_status()
                          : tg_set_error(TG_ERR_HANDLE, "tg_jit_call: the jitted function returned TG_OK but out[%d] is none "
                                                        "(never set, or freed)", i);
  if (st == TG_OK) st = tg_realize_many(out, j->nout);
  bool views = false;
  for (int i = 0; st == TG_OK && i < j->nout; i++) {
    UOp *u = t_get(out[i], "tg_jit_call");
    if (!u) st = tg_last_status();
    else if (g_resolve(u)->op != OP_BUFFER && !sym_view(u, NULL)) out[i] = tg_contiguous(out[i]), views = true;
  }
  if (st == TG_OK && views) st = tg_realize_many(out, j->nout);
  /* fresh handles: the function may have stored a caller's handle (an input) in out[] */
  for (int i = 0; i < j->nout; i++) {
    UOp *u = st == TG_OK ? t_get(out[i], "tg_jit_call") : NULL;
    out[i] = u ? tg_keep(t_wrap(uop_ref(uop_realized(u) ? uop_realized(u) : u))) : (tg_tensor){0};
  }
  tg_scope_end();
  if (st == TG_OK && tg_has_error()) st = tg_last_status();
  /* a function that fails without recording why still leaves the caller an error to read */
  if (st != TG_OK && !tg_has_error())
    st = tg_set_error(st < 0 ? st : TG_ERR_INVALID,
                      "tg_jit_call: the jitted function returned status %d without recording an error",
                      (int)st);
  return st;
}

/* The buffer behind a realized input (or a symbolic view of one), or NULL. */
static Buffer *buffer_behind(tg_tensor t) {
  if (!tg_valid(t)) return NULL;
  UOp *b = g_resolve(t_get(t, "tg_jit_call")), *vb;
  if (sym_view(b, &vb)) b = vb;
  return b->op == OP_BUFFER ? g_buffer_of(b) : NULL;
}

/* tinygrad refuses the same buffer as two inputs: a replay would read and write it as two. */
static tg_status check_distinct(const tg_tensor *in, int nin) {
  for (int i = 0; i < nin; i++) {
    Buffer *bi = buffer_behind(in[i]);
    for (int k = i + 1; bi && k < nin; k++)
      if (buffer_behind(in[k]) == bi)
        return tg_set_error(TG_ERR_INVALID,
                            "tg_jit_call: inputs %d and %d are the same tensor (one buffer); pass it once, or pass a "
                            "copy (tg_contiguous of a tg_clone, realized) as the second",
                            i, k);
  }
  return TG_OK;
}

static void free_outputs(tg_jit *j, tg_tensor *out) {
  for (int o = 0; o < j->nout; o++) {
    tg_free(out[o]);
    out[o] = (tg_tensor){0};
  }
}

static bool in_list(Buffer *const *l, int n, const Buffer *b) {
  for (int i = 0; i < n; i++)
    if (l[i] == b) return true;
  return false;
}

/* Call 2: runs fn while recording its kernels, then checks and (with prune) trims the capture. */
/* The call's variables, decoded: vidx[i] the variable index, vval[i] its value. */
typedef struct {
  int *idx;
  int64_t *val;
  int n;
} CallVars;

/* Is variable var one of the call's? Its value in *val (when val is not NULL). */
static bool call_var(const CallVars *cv, int var, int64_t *val) {
  for (int q = 0; q < cv->n; q++)
    if (cv->idx[q] == var) {
      if (val) *val = cv->val[q];
      return true;
    }
  return false;
}

static tg_status capture(tg_jit *j, const tg_tensor *in, int nin, Buffer **bufs, const double *args, int nargs,
                         tg_tensor *out, const CallVars *cv) {
  j->nin = nin, j->nargs = nargs;
  j->in_sig = tg_xcalloc((size_t)nin + 1, sizeof(Sig));
  j->in_buf = tg_xcalloc((size_t)nin + 1, sizeof(Buffer *));
  for (int i = 0; i < nin; i++) {
    j->in_sig[i] = sig_of(t_get(in[i], "tg_jit_call"));
    j->in_buf[i] = buffer_ref(bufs[i]);
  }
  j->args = tg_xmalloc(sizeof(double) * (size_t)(nargs + 1));
  if (nargs) memcpy(j->args, args, sizeof(double) * (size_t)nargs);
  Capture *saved = g_capture;
  g_capture = &j->cap;
  tg_status st = run_fn(j, in, nin, args, nargs, out);
  g_capture = saved;
  if (st != TG_OK) {
    jit_reset(j);
    return st;
  }
  if (j->cap.n == 0) {
    st = tg_set_error(TG_ERR_INVALID,
                      "tg_jit_call: the function ran no kernel while being captured, so a replay would return the "
                      "captured outputs unchanged; it must compute its outputs from its inputs (don't jit it)");
    jit_reset(j);
    free_outputs(j, out);
    return st;
  }
  if (j->cap.sym_unit) {
    /* a symbolic size was 0 or 1, which graphs may treat as a plain size-1 dim (broadcasting): the
     * kernels need not hold for other values. The call ran and its outputs are right; the capture
     * is dropped and the next call captures again. */
    jit_reset(j);
    return TG_OK;
  }
  if (j->cap.sym_baked) {
    st = tg_set_error(TG_ERR_INVALID, "tg_jit_call: the function combines a symbolic size with a concrete size computed "
                      "from its bound value (as tg_cat along a symbolic dim does), so the captured kernels would hold "
                      "for this value only; build that part from symbolic sizes (tg_sym) or do not jit it");
    jit_reset(j);
    free_outputs(j, out);
    return st;
  }
  /* every variable a captured kernel takes must be an input of the call, or a replay would run it
   * with the captured value */
  for (int k = 0; k < j->cap.n; k++) {
    const KernelCode *kc = j->cap.items[k].code;
    for (int v = 0; kc && v < kc->nvars; v++) {
      int64_t val = 0, mn = 0, mx = 0;
      const char *name = "?";
      var_info(kc->vars[v], &name, &mn, &mx);
      if (call_var(cv, kc->vars[v], &val)) {
        /* the function bound the call's variable to another value (tg_var_bind inside it): the
         * capture ran with that value, a replay would run with the call's */
        const int64_t *cvals = j->cap.items[k].vals;
        if (!cvals || cvals[v] == val) continue;
        st = tg_set_error(TG_ERR_INVALID, "tg_jit_call_vars: kernel '%s' ran with variable '%s' = %lld, but the call "
                          "passes %lld: the function binds it to another value; build the graph with the call's bound "
                          "variables (tg_jit_var), whose values a replay changes",
                          kc->name, name, (long long)cvals[v], (long long)val);
      } else {
        /* a variable of the same name with other bounds is another variable */
        int other = -1;
        for (int q = 0; q < cv->n && other < 0; q++) {
          const char *cn = NULL;
          if (var_info(cv->idx[q], &cn, NULL, NULL) && cn && !strcmp(cn, name)) other = q;
        }
        if (other >= 0) {
          int64_t omn = 0, omx = 0;
          var_info(cv->idx[other], NULL, &omn, &omx);
          st = tg_set_error(TG_ERR_INVALID, "tg_jit_call_vars: kernel '%s' takes variable '%s' in [%lld, %lld], and the call "
                            "passes '%s' in [%lld, %lld]: a variable is its name and its bounds, so these are two; "
                            "build the graph with the call's variables (tg_jit_var)",
                            kc->name, name, (long long)mn, (long long)mx, name, (long long)omn, (long long)omx);
        } else
          st = tg_set_error(TG_ERR_INVALID, "%s: kernel '%s' takes variable '%s', which is not an input of the "
                            "call; pass it bound in tg_jit_call_vars' vars[] (a replay would use its captured value)",
                            cv->n ? "tg_jit_call_vars" : "tg_jit_call", kc->name, name);
      }
      jit_reset(j);
      free_outputs(j, out);
      return st;
    }
  }
  if (cv->n) {
    j->vars = tg_xmalloc(sizeof(int) * (size_t)cv->n);
    memcpy(j->vars, cv->idx, sizeof(int) * (size_t)cv->n);
    j->var_limit = tg_xmalloc(sizeof(int64_t) * (size_t)cv->n);
    j->var_floor = tg_xmalloc(sizeof(int64_t) * (size_t)cv->n);
    for (int k = 0; k < cv->n; k++) {
      int64_t mn = 0, mx = INT64_MAX;
      var_info(cv->idx[k], NULL, &mn, &mx);
      for (int q = 0; q < tl_nlimits; q++)
        if (tl_limits[q].var == cv->idx[k]) {
          if (tl_limits[q].max < mx) mx = tl_limits[q].max;
          if (tl_limits[q].min > mn) mn = tl_limits[q].min;
        }
      j->var_limit[k] = mx, j->var_floor[k] = mn;
    }
    j->nvars = cv->n;
    /* relations between two of the call's variables (a variable that is not one keeps its value) */
    j->rel = tg_xmalloc(sizeof(JitVarLe) * (size_t)(tl_nrel + 1));
    for (int q = 0; q < tl_nrel; q++)
      if (call_var(cv, tl_rel[q].va, NULL) && call_var(cv, tl_rel[q].vb, NULL)) j->rel[j->nrel++] = tl_rel[q];
  }
  for (int i = 0; i < j->nout; i++) {
    UOp *u = t_get(out[i], "tg_jit_call");
    UOp *b = u ? g_resolve(u) : NULL;
    if (b && b->op == OP_BUFFER) continue;
    if (!b || !sym_view(b, NULL))
      st = tg_set_error(TG_ERR_INVALID, "tg_jit_call: output %d is neither a buffer nor a [0, v) view of one; a jitted "
                        "function's outputs must be realized tensors", i);
    /* a symbolic output: its variables must be the call's, so that a replay can size it */
    for (int d = 0; st == TG_OK && d < b->ndim; d++) {
      SymDim sd;
      if (!sym_decode(b->sym[d], &sd) || call_var(cv, sd.var, NULL)) continue;
      const char *name = "?";
      var_info(sd.var, &name, NULL, NULL);
      st = tg_set_error(TG_ERR_INVALID, "tg_jit_call: output %d's dim %d is symbolic in variable '%s', which is not an "
                        "input of the call; pass it bound in tg_jit_call_vars' vars[]", i, d, name);
    }
    if (st == TG_OK) continue;
    jit_reset(j);
    free_outputs(j, out);
    return st;
  }
  j->ncap_out = j->nout; /* the flattened count when the call is flattened (multi-device) */
  j->out_sig = tg_xcalloc((size_t)j->nout + 1, sizeof(Sig));
  j->out_buf = tg_xcalloc((size_t)j->nout + 1, sizeof(Buffer *));
  for (int i = 0; i < j->nout; i++) {
    UOp *u = g_resolve(t_get(out[i], "tg_jit_call")), *b = u;
    sym_view(u, &b); /* a symbolic output: b is the buffer behind its view */
    j->out_sig[i] = sig_of(u);
    j->out_buf[i] = buffer_ref(g_buffer_of(b));
  }
  /* an input written by a captured kernel must come back as an output, or replays would
   * silently write into whatever buffer is passed next time */
  for (int k = 0; k < j->cap.n; k++) {
    Buffer *w = j->cap.items[k].bufs[0];
    for (int i = 0; w && i < nin; i++) {
      if (w != j->in_buf[i] || in_list(j->out_buf, j->nout, w)) continue;
      st = tg_set_error(TG_ERR_INVALID,
                        "tg_jit_call: the function assigns to input %d but does not return it; return it "
                        "as an output (or do not jit this function)",
                        i);
      jit_reset(j);
      free_outputs(j, out);
      return st;
    }
  }
  if (j->prune) {
    int before = j->cap.n;
    if (capture_prune(&j->cap, j->in_buf, nin) < 0) {
      st = tg_last_status();
      jit_reset(j);
      free_outputs(j, out);
      return st;
    }
    if (debug_level() >= 1) fprintf(stderr, "TinyJit: pruned %d -> %d kernels\n", before, j->cap.n);
  } else if (!j->rerun_constants) {
    int h = capture_hoist(&j->cap, j->in_buf, nin);
    if (h && debug_level() >= 1)
      fprintf(stderr, "TinyJit: %d of %d kernels are constant work on realized weights (run again only when those change)\n", h,
              j->cap.n);
  }
  for (int k = 0; k < j->cap.n; k++) {
    Buffer *w = j->cap.items[k].bufs[0];
    if (!w || in_list(j->in_buf, nin, w) || in_list(j->written, j->nwritten, w)) continue;
    j->written = tg_xrealloc(j->written, sizeof(Buffer *) * (size_t)(j->nwritten + 1));
    j->written[j->nwritten++] = buffer_ref(w);
  }
  j->calls = 2;
  return TG_OK;
}

/* A replay's output: the buffer, or for a symbolic output the [0, v + c) view of it at this call's
 * values. */
static UOp *out_node(const Sig *s, Buffer *b, const CallVars *cv) {
  if (!s->sym) return g_buffer(buffer_ref(b), s->dtype, s->shape, s->ndim);
  UOp *bm = g_buffer(buffer_ref(b), s->dtype, s->base, s->ndim);
  int64_t bd[128], *bounds = s->ndim <= 64 ? bd : tg_xmalloc(sizeof(int64_t) * (size_t)(2 * s->ndim));
  for (int d = 0; d < s->ndim; d++) {
    SymDim sd;
    int64_t val;
    bounds[2 * d] = 0, bounds[2 * d + 1] = s->sym[d];
    if (sym_decode(s->sym[d], &sd) && call_var(cv, sd.var, &val)) bounds[2 * d + 1] = sym_encode(sd.var, val, sd.offset);
  }
  UOp *v = g_shrink(bm, bounds);
  uop_unref(bm);
  if (bounds != bd) free(bounds);
  return v;
}

/* Call 3 on: checks the call against the capture and replays it with the new inputs' buffers. */
static tg_status replay(tg_jit *j, const tg_tensor *in, int nin, Buffer **bufs, const double *args, int nargs,
                        tg_tensor *out, const CallVars *cv) {
  tg_status st = TG_OK;
  bool same = cv->n == j->nvars;
  for (int q = 0; same && q < cv->n; q++) {
    bool found = false;
    for (int k = 0; k < j->nvars && !found; k++) found = j->vars[k] == cv->idx[q];
    same = found;
  }
  if (!same)
    return tg_set_error(TG_ERR_INVALID, "tg_jit_call: called with %d variables, captured with %d (or other ones); pass "
                        "the same variables (bound to this call's values) on every call", cv->n, j->nvars);
  for (int q = 0; q < cv->n; q++)
    for (int k = 0; k < j->nvars; k++)
      if (j->vars[k] == cv->idx[q] && j->var_limit && cv->val[q] > j->var_limit[k]) {
        const char *name = "?";
        var_info(cv->idx[q], &name, NULL, NULL);
        return tg_set_error(TG_ERR_INVALID,
                            "tg_jit_call_vars: variable '%s' = %lld is past what the captured graph can read (%lld: a "
                            "symbolic tg_shrink ends past its dim beyond that); give the variable a max the tensors hold",
                            name, (long long)cv->val[q], (long long)j->var_limit[k]);
      } else if (j->vars[k] == cv->idx[q] && j->var_floor && cv->val[q] < j->var_floor[k]) {
        const char *name = "?";
        var_info(cv->idx[q], &name, NULL, NULL);
        return tg_set_error(TG_ERR_INVALID,
                            "tg_jit_call_vars: variable '%s' = %lld is below what the captured graph can use (%lld: a "
                            "shrink or pad in it would start before a dim, end before its start or past a dim of that "
                            "variable, or pad by a negative size, below that); give the variable a min the graph holds",
                            name, (long long)cv->val[q], (long long)j->var_floor[k]);
      }
  for (int r = 0; r < j->nrel; r++) {
    const JitVarLe *e = &j->rel[r];
    int64_t a = 0, b = 0;
    if (!call_var(cv, e->va, &a) || !call_var(cv, e->vb, &b) || a + e->ca <= b + e->cb) continue;
    const char *na = "?", *nb = "?";
    var_info(e->va, &na, NULL, NULL), var_info(e->vb, &nb, NULL, NULL);
    return tg_set_error(TG_ERR_INVALID,
                        "tg_jit_call_vars: variables '%s' = %lld and '%s' = %lld break what the captured graph needs "
                        "(%s%+lld <= %s%+lld: a symbolic tg_shrink ends past a symbolic dim)",
                        na, (long long)a, nb, (long long)b, na, (long long)e->ca, nb, (long long)e->cb);
  }
  if (nin != j->nin) return tg_set_error(TG_ERR_INVALID, "tg_jit_call: called with %d inputs, captured with %d", nin, j->nin);
  for (int i = 0; i < nin; i++) {
    UOp *u = t_get(in[i], "tg_jit_call");
    if (!sig_eq(&j->in_sig[i], u)) {
      char a[256], b[256];
      UOp *base = NULL;
      bool usym = sym_view(u, &base);
      const Sig *c = &j->in_sig[i];
      return tg_set_error(TG_ERR_INVALID, "%s: input %d is %s %s on %s, but was %s %s on %s when captured%s", cv->n ? "tg_jit_call_vars" : "tg_jit_call", i,
                          tg_dtype_name((tg_dtype)u->dtype), shape_text(a, sizeof a, u->shape, usym ? u->sym : NULL, u->ndim),
                          device_by_id(u->device)->name, tg_dtype_name(c->dtype), shape_text(b, sizeof b, c->shape, c->sym, c->ndim),
                          device_by_id(c->device)->name,
                          c->sym && !usym ? " (a symbolic dim takes a tensor with that variable's dim: a tg_shrink to it, not a concrete size)" : "");
    }
  }
  if (nargs != j->nargs) return tg_set_error(TG_ERR_INVALID, "tg_jit_call: called with %d non-tensor arguments, captured with %d", nargs, j->nargs);
  for (int i = 0; i < nargs; i++)
    if (memcmp(&args[i], &j->args[i], sizeof(double)))
      return tg_set_error(TG_ERR_INVALID, "tg_jit_call: non-tensor argument %d changed (%g when captured, %g now); it is baked into the captured kernels — pass it as a tensor", i,
                          j->args[i], args[i]);
  /* an input the replay writes (an output of an earlier call fed back) is read from a copy */
  bool *copied = tg_xcalloc((size_t)nin + 1, sizeof(bool));
  for (int i = 0; i < nin && st == TG_OK; i++) {
    if (!in_list(j->written, j->nwritten, bufs[i])) continue;
    Buffer *c = buffer_new_like(bufs[i]->dev, bufs[i]->nbytes, bufs[i]->img_w, bufs[i]->img_h);
    if (!c || (st = buffer_copy(c, bufs[i], bufs[i]->nbytes)) != TG_OK) {
      if (st == TG_OK) st = tg_last_status();
      buffer_unref(c);
      break;
    }
    counters_add(false, 0, bufs[i]->nbytes, 0);
    bufs[i] = c;
    copied[i] = true;
  }
  if (st == TG_OK) st = capture_replay(&j->cap, j->in_buf, bufs, nin, cv->idx, cv->val, cv->n);
  if (st == TG_OK) {
    /* an assigned input comes back as itself: the buffer passed now, not the captured one */
    for (int i = 0; i < j->nout; i++) {
      Buffer *b = j->out_buf[i];
      for (int k = 0; k < nin; k++)
        if (b == j->in_buf[k]) {
          b = bufs[k];
          break;
        }
      out[i] = t_wrap(out_node(&j->out_sig[i], b, cv));
    }
    j->calls++;
  }
  for (int i = 0; i < nin; i++)
    if (copied[i]) buffer_unref(bufs[i]);
  free(copied);
  return st;
}

static tg_status jit_call(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                          const CallVars *cv) {
  bool jit_on = getenv_int_in("JIT", 1, 0, 2) != 0;
  if (!jit_on || j->calls == 0) {
    /* the inputs a capture and its replays will take: checked on the first call too (a view was
     * taken by it and refused from the second call on) */
    for (int i = 0; jit_on && i < nin; i++) {
      UOp *u = t_get(in[i], "tg_jit_call");
      if (u && !m_is(u) && !input_buffer(in[i], i)) return tg_last_status();
    }
    if (j->calls == 0) j->calls = 1;
    return run_fn(j, in, nin, args, nargs, out);
  }
  Buffer **bufs = tg_xmalloc(sizeof(Buffer *) * (size_t)(nin + 1));
  for (int i = 0; i < nin; i++) {
    bufs[i] = input_buffer(in[i], i);
    if (!bufs[i]) {
      free(bufs);
      return tg_last_status();
    }
  }
  tg_status st = j->calls == 1 ? capture(j, in, nin, bufs, args, nargs, out, cv) : replay(j, in, nin, bufs, args, nargs, out, cv);
  free(bufs);
  return st;
}

static tg_status tg_jit_call_impl(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                                  const CallVars *cv, const tg_symvar *vars, int nvars);
static tg_status jit_call_multi(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                                const CallVars *cv);

tg_status tg_jit_call(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out) {
  return tg_jit_call_vars(j, in, nin, NULL, 0, args, nargs, out);
}

tg_status tg_jit_call_vars(tg_jit *j, const tg_tensor *in, int nin, const tg_symvar *vars, int nvars, const double *args,
                           int nargs, tg_tensor *out) {
  if (!j) return tg_set_error(TG_ERR_INVALID, "tg_jit_call: jit is NULL");
  if (nvars < 0) return tg_set_error(TG_ERR_INVALID, "tg_jit_call_vars: nvars=%d is negative", nvars);
  if (nvars && !vars) return tg_set_error(TG_ERR_INVALID, "tg_jit_call_vars: vars is NULL with nvars=%d", nvars);
  CallVars cv = {NULL, NULL, 0};
  if (nvars) {
    cv.idx = tg_xmalloc(sizeof(int) * (size_t)nvars);
    cv.val = tg_xmalloc(sizeof(int64_t) * (size_t)nvars);
  }
  for (int i = 0; i < nvars; i++) {
    bool had = tg_has_error();
    int64_t code = vars[i].id ? tg_sym(vars[i], 0) : TG_SYM_NONE;
    if (!had && tg_has_error()) tg_clear_error(); /* (tg_sym's complaint: this call names the argument below) */
    SymDim d;
    tg_status vs = TG_OK;
    if (!sym_decode(code, &d)) {
      vs = tg_set_error(TG_ERR_INVALID, "tg_jit_call_vars: vars[%d] is not a variable (tg_variable)", i);
    } else if (d.value < 0) {
      const char *name = tg_var_name(vars[i]);
      vs = tg_set_error(TG_ERR_INVALID, "tg_jit_call_vars: variable '%s' (vars[%d]) is unbound; pass it bound to this "
                        "call's value (tg_var_bind)", name ? name : "?", i);
    }
    for (int q = 0; vs == TG_OK && q < cv.n; q++)
      if (cv.idx[q] == d.var)
        vs = tg_set_error(TG_ERR_INVALID, "tg_jit_call_vars: variable '%s' is passed twice", tg_var_name(vars[i]));
    if (vs != TG_OK) {
      free(cv.idx), free(cv.val);
      return vs;
    }
    cv.idx[cv.n] = d.var, cv.val[cv.n++] = d.value;
  }
  /* an input of symbolic shape is bound to the call's value of its variable (tinygrad merges the
   * inputs' values with the call's and refuses a disagreement): a replay sizes its kernels by vars[],
   * and an input bound to less than that would be read past its end */
  for (int i = 0; in && i < nin; i++) {
    UOp *u = tg_valid(in[i]) ? t_get(in[i], "tg_jit_call_vars") : NULL;
    for (int dim = 0; u && u->sym && dim < u->ndim; dim++) {
      SymDim d;
      int64_t val = 0;
      if (!sym_is_code(u->sym[dim]) || !sym_decode(u->sym[dim], &d) || d.value < 0 || !call_var(&cv, d.var, &val) ||
          d.value == val)
        continue;
      const char *name = "?";
      var_info(d.var, &name, NULL, NULL);
      free(cv.idx), free(cv.val);
      return tg_set_error(TG_ERR_INVALID, "tg_jit_call_vars: input %d's dim %d is sized by variable '%s' bound to %lld, "
                          "but vars[] passes '%s' = %lld; bind both to this call's value", i, dim, name,
                          (long long)d.value, name, (long long)val);
    }
  }
  tg_status st = tg_jit_call_impl(j, in, nin, args, nargs, out, &cv, vars, nvars);
  free(cv.idx), free(cv.val);
  return st;
}

static tg_status tg_jit_call_impl(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                                  const CallVars *cv, const tg_symvar *vars, int nvars) {
  if (!j) return tg_set_error(TG_ERR_INVALID, "tg_jit_call: jit is NULL");
  if (nin < 0 || nargs < 0 || (nin && !in) || (nargs && !args) || (j->nout && !out))
    return tg_set_error(TG_ERR_INVALID, "tg_jit_call: NULL arrays or negative counts (nin=%d nargs=%d)", nin, nargs);
  /* tinygrad: "having TinyJit inside another TinyJit is not supported" while the outer one captures
   * (a nested replay would not be captured by it). A jit whose function runs plainly -- its first
   * call, or JIT=0 -- may call another one, as in tinygrad. */
  if (tl_depth > 0 && g_capture)
    return tg_set_error(TG_ERR_INVALID,
                        "tg_jit_call: called from inside a jitted function while that jit captures; TinyJit inside "
                        "another TinyJit is not supported: call the inner function directly");
  bool was = false;
  if (!atomic_compare_exchange_strong(&j->busy, &was, true))
    return tg_set_error(TG_ERR_INVALID,
                        tl_depth > 0 ? "tg_jit_call: this jit is already running a call (its function calls it again, "
                                       "which would recurse without end, or another thread's call runs)"
                                     : "tg_jit_call: this jit is running a call in another thread; a tg_jit serves "
                                       "one call at a time (give each thread its own jit)");
  tg_status st = check_distinct(in, nin);
  const tg_symvar *saved_vars = tl_vars;
  int saved_n = tl_nvars;
  tl_vars = vars, tl_nvars = nvars;
  if (st == TG_OK) st = jit_call_multi(j, in, nin, args, nargs, out, cv);
  tl_vars = saved_vars, tl_nvars = saved_n;
  atomic_store(&j->busy, false);
  if (j->free_pending) tg_jit_free(j);
  return st;
}

/* ---- multi-device inputs and outputs ---- */

typedef struct {
  tg_jit *j;
  tg_jit_fn fn;      /* the user's function and data */
  void *user;
  const int *in_lay; /* 3 per user input, as out_lay */
  int nin;
} MultiCall;

static void lay_of(tg_tensor t, int *lay) {
  UOp *u = t_get(t, "tg_jit_call");
  bool m = u && m_is(u);
  lay[0] = m ? (int)g_resolve(u)->nsrc : 0, lay[1] = m ? m_axis(u) : 0, lay[2] = m ? u->device : 0;
}

/* A layout in words: "on CPU", "sharded on axis 0 over (CPU, CPU:1)", "replicated over (...)". */
static const char *lay_text(char *buf, size_t n, const int *lay) {
  const char *dev = device_by_id(lay[2]) ? device_by_id(lay[2])->name : "?";
  if (!lay[0]) snprintf(buf, n, "on one device, not sharded");
  else if (lay[1] < 0) snprintf(buf, n, "replicated over %s", dev);
  else snprintf(buf, n, "sharded on axis %d over %s", lay[1], dev);
  return buf;
}

/* An input's layout (lay_of) and whole shape, as one key: a replay takes the inputs' shards, whose
 * shapes the capture checks, so a tensor sharded otherwise with shards of the same shapes (6 x 6 on
 * axis 0 over 3 devices, then 2 x 18 on axis 1) must be told apart here. */
static uint64_t in_key_of(tg_tensor t) {
  int lay[3];
  lay_of(t, lay);
  uint64_t h = hash_bytes(lay, sizeof lay, 0x6a69746c);
  UOp *u = t_get(t, "tg_jit_call");
  if (u && !u->sym) /* (a symbolic shape varies with the call's variables) */
    h = hash_mix(hash_bytes(u->shape, sizeof(int64_t) * (size_t)u->ndim, (uint64_t)u->ndim), h);
  return h;
}

/* The user function, given the flattened inputs: joins them, calls it, flattens its outputs. */
static tg_status multi_tramp(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *user) {
  MultiCall *c = user;
  tg_jit *j = c->j;
  (void)nin, (void)nout;
  tg_tensor *uin = tg_xcalloc((size_t)c->nin + 1, sizeof(tg_tensor)), *uout = tg_xcalloc((size_t)j->nuser_out + 1, sizeof(tg_tensor));
  int p = 0;
  for (int k = 0; k < c->nin; k++) {
    int n = c->in_lay[3 * k];
    if (!n) {
      uin[k] = in[p++];
      continue;
    }
    UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
    for (int i = 0; i < n; i++) sh[i] = t_get(in[p + i], "tg_jit_call");
    uin[k] = t_wrap(m_from_shards(sh, n, c->in_lay[3 * k + 1], c->in_lay[3 * k + 2]));
    free(sh);
    p += n;
  }
  tg_status st = c->fn(uin, c->nin, args, nargs, uout, j->nuser_out, c->user);
  p = 0;
  for (int k = 0; st == TG_OK && k < j->nuser_out; k++) {
    int lay[3];
    lay_of(uout[k], lay);
    if (memcmp(lay, j->out_lay + 3 * k, sizeof lay)) {
      char b1[300], b2[300];
      st = tg_set_error(TG_ERR_INVALID, "tg_jit_call: output %d changed its devices or sharding since the first call (now %s, was %s)",
                        k, lay_text(b1, sizeof b1, lay), lay_text(b2, sizeof b2, j->out_lay + 3 * k));
      break;
    }
    if (!lay[0]) out[p++] = uout[k];
    else
      for (int i = 0; i < lay[0]; i++) out[p++] = tg_shard_get(uout[k], i);
  }
  free(uin), free(uout);
  return st;
}

/* jit_call, with multi-device inputs and outputs flattened into their shards once the first call
 * (run as is) has shown the outputs' layout */
static tg_status jit_call_multi(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                                const CallVars *cv) {
  bool any = j->multi;
  for (int i = 0; i < nin && !any; i++) {
    UOp *u = t_get(in[i], "tg_jit_call");
    any = u && m_is(u);
  }
  /* the inputs' sharding is the first call's (the capture is of shards) */
  if (any && j->in_key && getenv_int_in("JIT", 1, 0, 2) != 0) {
    for (int i = 0; i < nin && i < j->nin_key; i++)
      if (in_key_of(in[i]) != j->in_key[i]) {
        int lay[3];
        lay_of(in[i], lay);
        char b[256], lb[300];
        UOp *u = t_get(in[i], "tg_jit_call");
        return tg_set_error(TG_ERR_INVALID,
                            "tg_jit_call: input %d (shape %s, %s) changed its shape, devices or sharding "
                            "since the first call; a TinyJit replays one layout: make a new jit for another",
                            i, u ? fmt_shape(b, sizeof b, u->shape, u->ndim) : "?", lay_text(lb, sizeof lb, lay));
      }
  }
  if (!j->in_key && nin > 0) {
    j->in_key = tg_xmalloc(sizeof(uint64_t) * (size_t)nin);
    j->nin_key = nin;
    for (int i = 0; i < nin; i++) j->in_key[i] = in_key_of(in[i]);
  }
  if (!any || j->calls == 0 || getenv_int_in("JIT", 1, 0, 2) == 0) {
    tg_status st = jit_call(j, in, nin, args, nargs, out, cv);
    if (st == TG_OK && !j->out_lay) {
      j->out_lay = tg_xcalloc((size_t)j->nout * 3 + 1, sizeof(int));
      j->nuser_out = j->nout;
      for (int k = 0; k < j->nout; k++) {
        lay_of(out[k], j->out_lay + 3 * k);
        j->multi = j->multi || j->out_lay[3 * k];
      }
      j->multi = j->multi || any;
    }
    return st;
  }
  int *in_lay = tg_xcalloc((size_t)nin * 3 + 1, sizeof(int));
  int nflat = 0, nfout = 0;
  for (int i = 0; i < nin; i++) lay_of(in[i], in_lay + 3 * i), nflat += in_lay[3 * i] ? in_lay[3 * i] : 1;
  for (int k = 0; k < j->nuser_out; k++) nfout += j->out_lay[3 * k] ? j->out_lay[3 * k] : 1;
  tg_tensor *fin = tg_xcalloc((size_t)nflat + 1, sizeof(tg_tensor)), *fout = tg_xcalloc((size_t)nfout + 1, sizeof(tg_tensor));
  int p = 0;
  for (int i = 0; i < nin; i++) {
    if (!in_lay[3 * i]) {
      fin[p++] = in[i];
      continue;
    }
    UOp *r = g_resolve(t_get(in[i], "tg_jit_call"));
    for (uint32_t s = 0; s < r->nsrc; s++) fin[p++] = t_wrap(uop_ref(r->src[s]));
  }
  MultiCall c = {j, j->fn, j->user, in_lay, nin};
  j->fn = multi_tramp, j->user = &c, j->nout = nfout;
  tg_status st = jit_call(j, fin, nflat, args, nargs, fout, cv);
  j->fn = c.fn, j->user = c.user, j->nout = j->nuser_out;
  p = 0;
  for (int k = 0; k < j->nuser_out; k++) {
    int n = j->out_lay[3 * k];
    if (!n) {
      out[k] = st == TG_OK ? fout[p] : (tg_tensor){0};
      p++;
      continue;
    }
    out[k] = (tg_tensor){0};
    if (st == TG_OK) {
      UOp **sh = tg_xmalloc(sizeof(UOp *) * (size_t)n);
      for (int i = 0; i < n; i++) sh[i] = t_get(fout[p + i], "tg_jit_call");
      out[k] = t_wrap(m_from_shards(sh, n, j->out_lay[3 * k + 1], j->out_lay[3 * k + 2]));
      free(sh);
    }
    for (int i = 0; i < n; i++) tg_free(fout[p + i]);
    p += n;
  }
  for (int i = 0, q = 0; i < nin; i++) {
    if (!in_lay[3 * i]) {
      q++;
      continue;
    }
    for (int s = 0; s < in_lay[3 * i]; s++) tg_free(fin[q++]);
  }
  free(in_lay), free(fin), free(fout);
  return st;
}

int tg_jit_captured_kernels(const tg_jit *j) { return j ? j->cap.n : -1; }
int tg_jit_constant_kernels(const tg_jit *j) { return j ? j->cap.nhoisted : -1; }
int jit_nvars(const tg_jit *j) { return j ? j->nvars : 0; }

void jit_view(const tg_jit *j, JitView *v) {
  memset(v, 0, sizeof *v);
  v->calls = j->calls;
  if (j->calls < 2) return;
  v->cap = &j->cap;
  v->nin = j->nin, v->nout = j->nout, v->nargs = j->nargs;
  v->in = tg_xcalloc((size_t)j->nin + 1, sizeof(JitIO));
  v->out = tg_xcalloc((size_t)j->nout + 1, sizeof(JitIO));
  for (int i = 0; i < j->nin; i++) {
    const Sig *s = &j->in_sig[i];
    v->in[i] = (JitIO){j->in_buf[i], s->dtype, s->ndim, s->shape, s->sym, s->base};
  }
  for (int i = 0; i < j->nout; i++) {
    const Sig *s = &j->out_sig[i];
    v->out[i] = (JitIO){j->out_buf[i], s->dtype, s->ndim, s->shape, s->sym, s->base};
  }
  v->nvars = j->nvars, v->vars = j->vars, v->var_limit = j->var_limit, v->var_floor = j->var_floor;
  v->rel = j->rel, v->nrel = j->nrel;
}

tg_status tg_jit_export(const tg_jit *j, const char *path, const tg_jit_export_opts *opts) {
  if (!j) return tg_set_error(TG_ERR_INVALID, "tg_jit_export: jit is NULL");
  JitView v;
  jit_view(j, &v);
  return export_capture(&v, path, opts);
}
