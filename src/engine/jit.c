/*
 * jit.c -- TinyJit: capture the kernels a function runs and replay them.
 *
 * Call 1 runs the function normally (kernels compile, shapes settle). Call 2 runs it again while the
 * engine records every executed kernel and copy with the buffers it used. Later calls check that the
 * inputs match what was captured (count, shape, dtype, device, realized, non-tensor arguments) and
 * replay the recorded launches with the new inputs' buffers swapped in: no graph building, no
 * scheduling, no codegen. Outputs are the same device buffers on every replay (as in tinygrad), each
 * call returning fresh handles to them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tensor/tensor.h"
#include "engine.h"

typedef struct {
  tg_dtype dtype;
  int device;
  int ndim;
  int64_t *shape;
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
};

tg_jit *tg_jit_new(tg_jit_fn fn, int nout, void *user) {
  if (!fn || nout < 0) {
    tg_set_error(TG_ERR_INVALID, "tg_jit_new: fn is NULL or nout=%d < 0", nout);
    return NULL;
  }
  tg_jit *j = tg_xcalloc(1, sizeof *j);
  j->fn = fn;
  j->user = user;
  j->nout = nout;
  return j;
}

static void sig_free(Sig *s, int n) {
  for (int i = 0; s && i < n; i++) free(s[i].shape);
  free(s);
}

/* Drops everything captured (a failed capture leaves the jit as after its first call, to capture
 * again on the next one). */
static void jit_reset(tg_jit *j) {
  capture_free(&j->cap);
  for (int i = 0; j->in_buf && i < j->nin; i++) buffer_unref(j->in_buf[i]);
  for (int i = 0; j->out_buf && i < j->nout; i++) buffer_unref(j->out_buf[i]);
  free(j->in_buf);
  free(j->out_buf);
  sig_free(j->in_sig, j->nin);
  sig_free(j->out_sig, j->nout);
  free(j->args);
  j->in_buf = j->out_buf = NULL;
  j->in_sig = j->out_sig = NULL;
  j->args = NULL;
  j->nin = j->nargs = 0;
}

void tg_jit_free(tg_jit *j) {
  if (!j) return;
  jit_reset(j);
  free(j);
}

static Sig sig_of(UOp *u) {
  Sig s = {(tg_dtype)u->dtype, u->device, u->ndim, NULL};
  if (u->ndim) {
    s.shape = tg_xmalloc(sizeof(int64_t) * (size_t)u->ndim);
    memcpy(s.shape, u->shape, sizeof(int64_t) * (size_t)u->ndim);
  }
  return s;
}

static bool sig_eq(const Sig *s, UOp *u) {
  return s->dtype == (tg_dtype)u->dtype && s->device == u->device && s->ndim == u->ndim &&
         (!s->ndim || !memcmp(s->shape, u->shape, sizeof(int64_t) * (size_t)s->ndim));
}

/* The buffer behind a realized, contiguous input; NULL + error otherwise. */
static Buffer *input_buffer(tg_tensor t, int i) {
  UOp *u = t_get(t, "tg_jit_call");
  if (!u) return NULL;
  UOp *b = uop_realized(u) ? uop_realized(u) : u;
  if (b->op != OP_BUFFER) {
    tg_set_error(TG_ERR_INVALID, "tg_jit_call: input %d is not realized (or is a view); realize it (tg_realize, tg_contiguous) before calling the jitted function", i);
    return NULL;
  }
  return g_buffer_of(b);
}

/* Runs fn in its own scope; outputs are realized, contiguous and moved to the caller's scope. */
static tg_status run_fn(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out) {
  tg_scope_begin();
  for (int i = 0; i < j->nout; i++) out[i] = (tg_tensor){0};
  tg_status st = j->fn(in, nin, args, nargs, out, j->nout, j->user);
  if (st == TG_OK) {
    for (int i = 0; i < j->nout; i++) out[i] = tg_contiguous(out[i]);
    st = tg_realize_many(out, j->nout);
  }
  for (int i = 0; i < j->nout; i++) out[i] = st == TG_OK ? tg_keep(out[i]) : (tg_tensor){0};
  tg_scope_end();
  if (st == TG_OK && tg_has_error()) st = tg_last_status();
  /* a function that fails without recording why still leaves the caller an error to read */
  if (st != TG_OK && !tg_has_error())
    st = tg_set_error(st < 0 ? st : TG_ERR_INVALID,
                      "tg_jit_call: the jitted function returned status %d without recording an error",
                      (int)st);
  return st;
}

tg_status tg_jit_call(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out) {
  if (!j) return tg_set_error(TG_ERR_INVALID, "tg_jit_call: jit is NULL");
  if (nin < 0 || nargs < 0 || (nin && !in) || (nargs && !args) || (j->nout && !out))
    return tg_set_error(TG_ERR_INVALID, "tg_jit_call: NULL arrays or negative counts (nin=%d nargs=%d)", nin, nargs);
  if (getenv_int("JIT", 1) == 0 || j->calls == 0) {
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
  if (j->calls == 1) {
    /* capture */
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
    free(bufs);
    if (st != TG_OK) {
      jit_reset(j);
      return st;
    }
    j->out_sig = tg_xcalloc((size_t)j->nout + 1, sizeof(Sig));
    j->out_buf = tg_xcalloc((size_t)j->nout + 1, sizeof(Buffer *));
    for (int i = 0; i < j->nout; i++) {
      UOp *u = t_get(out[i], "tg_jit_call");
      UOp *b = uop_realized(u) ? uop_realized(u) : u;
      j->out_sig[i] = sig_of(u);
      j->out_buf[i] = buffer_ref(g_buffer_of(b));
    }
    /* an input written by a captured kernel must come back as an output, or replays would
     * silently write into whatever buffer is passed next time */
    for (int k = 0; k < j->cap.n; k++) {
      Buffer *w = j->cap.items[k].bufs[0];
      for (int i = 0; i < nin; i++) {
        if (w != j->in_buf[i]) continue;
        bool returned = false;
        for (int o = 0; o < j->nout; o++) returned = returned || j->out_buf[o] == w;
        if (!returned) {
          st = tg_set_error(TG_ERR_INVALID,
                            "tg_jit_call: the function assigns to input %d but does not return it; return it "
                            "as an output (or do not jit this function)",
                            i);
          jit_reset(j);
          for (int o = 0; o < j->nout; o++) {
            tg_free(out[o]);
            out[o] = (tg_tensor){0};
          }
          return st;
        }
      }
    }
    j->calls = 2;
    return TG_OK;
  }
  /* replay */
  tg_status st = TG_OK;
  if (nin != j->nin) st = tg_set_error(TG_ERR_INVALID, "tg_jit_call: called with %d inputs, captured with %d", nin, j->nin);
  for (int i = 0; st == TG_OK && i < nin; i++) {
    UOp *u = t_get(in[i], "tg_jit_call");
    if (!sig_eq(&j->in_sig[i], u)) {
      char a[256], b[256];
      st = tg_set_error(TG_ERR_INVALID, "tg_jit_call: input %d is %s %s on %s, but was %s %s on %s when captured", i,
                        tg_dtype_name((tg_dtype)u->dtype), fmt_shape(a, sizeof a, u->shape, u->ndim), device_by_id(u->device)->name,
                        tg_dtype_name(j->in_sig[i].dtype), fmt_shape(b, sizeof b, j->in_sig[i].shape, j->in_sig[i].ndim),
                        device_by_id(j->in_sig[i].device)->name);
    }
  }
  if (st == TG_OK && nargs != j->nargs) st = tg_set_error(TG_ERR_INVALID, "tg_jit_call: called with %d non-tensor arguments, captured with %d", nargs, j->nargs);
  for (int i = 0; st == TG_OK && i < nargs; i++)
    if (memcmp(&args[i], &j->args[i], sizeof(double)))
      st = tg_set_error(TG_ERR_INVALID, "tg_jit_call: non-tensor argument %d changed (%g when captured, %g now); it is baked into the captured kernels — pass it as a tensor", i,
                        j->args[i], args[i]);
  if (st == TG_OK) st = capture_replay(&j->cap, j->in_buf, bufs, nin);
  free(bufs);
  if (st != TG_OK) return st;
  for (int i = 0; i < j->nout; i++)
    out[i] = t_wrap(g_buffer(buffer_ref(j->out_buf[i]), j->out_sig[i].dtype, j->out_sig[i].shape, j->out_sig[i].ndim));
  j->calls++;
  return TG_OK;
}

int tg_jit_captured_kernels(const tg_jit *j) { return j ? j->cap.n : -1; }
