/*
 * creation.c -- creating tensors (from data, from a caller's buffer, constants, ranges, random),
 * properties, data out, realize and device moves.
 *
 * Constants (zeros/ones/full) are lazy: a 0-d CONST expanded to the shape, so they fuse into whatever
 * uses them and cost no memory. Random numbers come from threefry2x32 built out of uint32 ops, so
 * they are generated inside a fused kernel and are identical on every device.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/engine.h"
#include "tensor.h"

#define NONE ((tg_tensor){0})
#define GET(var, t, fn)                                                                            \
  UOp *var = t_get(t, fn);                                                                         \
  if (!var) return NONE

int norm_axis(const char *fn, int axis, int ndim, int *out);
UOp *n_exp(UOp *a);
UOp *n_log(UOp *a);

/* device_get, with its error restated under the public function's name ("tg_ones: unknown device
 * 'XYZ' (available: ...)") when it is the thread's first error. */
static Device *named_device(const char *fn, const char *name) {
  bool had = tg_has_error();
  Device *d = device_get(name);
  if (!d && !had) {
    if (!tg_has_error()) tg_set_error(TG_ERR_INVALID, "unknown device");
    error_restate(TG_OK, "device_get: ", "%s", fn);
  }
  return d;
}

static Device *opts_device(const char *fn, const tg_opts *o) { return named_device(fn, o ? o->device : NULL); }

static bool opts_dtype(const char *fn, const tg_opts *o, tg_dtype def, tg_dtype *out) {
  tg_dtype dt = (o && o->dtype != TG_DTYPE_DEFAULT) ? o->dtype : def;
  if (!dtype_valid(dt)) {
    tg_set_error(TG_ERR_INVALID, "%s: invalid dtype %d (use a TG_* dtype)", fn, (int)dt);
    return false;
  }
  *out = dt;
  return true;
}

static bool check_shape(const char *fn, const int64_t *shape, int ndim, int64_t *numel) {
  if (ndim < 0 || ndim > 64) {
    tg_set_error(TG_ERR_INVALID, "%s: ndim %d is out of range (0..64)", fn, ndim);
    return false;
  }
  if (ndim > 0 && !shape) {
    tg_set_error(TG_ERR_INVALID, "%s: shape is NULL with ndim=%d", fn, ndim);
    return false;
  }
  for (int i = 0; i < ndim; i++) {
    char b[256];
    if (shape[i] < 0 && sym_is_code(shape[i])) {
      tg_set_error(TG_ERR_INVALID, "%s: dimension %d is symbolic (a tg_sym size); this function makes concrete shapes: make the "
                   "variable's largest size and tg_shrink it to the variable", fn, i);
      return false;
    }
    if (shape[i] < 0) {
      tg_set_error(TG_ERR_INVALID, "%s: negative dimension %lld in shape %s", fn, (long long)shape[i], fmt_shape(b, sizeof b, shape, ndim));
      return false;
    }
  }
  if (!shape_fits(shape, ndim)) { /* a 0 in one dimension does not excuse the others */
    char b[256];
    tg_set_error(TG_ERR_INVALID, "%s: shape %s is too large (its non-zero dimensions multiply past 2^48)", fn,
                 fmt_shape(b, sizeof b, shape, ndim));
    return false;
  }
  *numel = shape_numel(shape, ndim);
  return true;
}

static tg_tensor finish(UOp *u, const tg_opts *o) {
  tg_tensor t = t_wrap(u);
  if (o && o->requires_grad != TG_GRAD_UNSET && t.id) tg_set_requires_grad(t, o->requires_grad != 0);
  return t;
}

/* Creation on a device tuple: made on its first member (member_opts: opts with that device and
 * no requires_grad), then replicated over the tuple with opts' requires_grad (on_first_member). */
static const tg_opts *member_opts(Device *tuple, const tg_opts *opts) {
  static _Thread_local tg_opts o;
  const int *ids;
  device_tuple_members(tuple->id, &ids);
  o = opts ? *opts : *TG_OPTS();
  o.device = device_by_id(ids[0])->name;
  o.requires_grad = TG_GRAD_UNSET;
  return &o;
}
static tg_tensor on_first_member(Device *tuple, const tg_opts *opts, tg_tensor t) {
  if (!tg_valid(t)) return NONE;
  UOp *c = g_copy(t_get(t, "tg_to"), tuple->id);
  tg_free(t);
  return finish(c, opts);
}

static void *host_alloc(const char *fn, int64_t n, size_t sz, bool zero);

tg_tensor tg_from_data(const void *data, const int64_t *shape, int ndim, const tg_opts *opts) {
  int64_t n;
  tg_dtype dt;
  if (!check_shape("tg_from_data", shape, ndim, &n) || !opts_dtype("tg_from_data", opts, tg_default_float(), &dt)) return NONE;
  if (!data && n > 0) return tg_set_error(TG_ERR_INVALID, "tg_from_data: data is NULL"), NONE;
  Device *d = opts_device("tg_from_data", opts);
  if (!d) return NONE;
  if (!d->vt) return on_first_member(d, opts, tg_from_data(data, shape, ndim, member_opts(d, opts)));
  /* no dtype given: the data is a C float array, and the tensor takes DEFAULT_FLOAT (tinygrad's
   * Tensor([1.0, 2.0]) under DEFAULT_FLOAT=half is a half tensor of those values) */
  unsigned char *conv = NULL;
  if ((!opts || opts->dtype == TG_DTYPE_DEFAULT) && dt != TG_FLOAT32 && n > 0) {
    size_t isz = tg_dtype_itemsize(dt);
    if (!(conv = host_alloc("tg_from_data", n, isz, false))) return NONE;
    for (int64_t i = 0; i < n; i++) dtype_store(dt, conv + (size_t)i * isz, ((const float *)data)[i]);
    data = conv;
  }
  size_t nbytes = (size_t)n * tg_dtype_itemsize(dt);
  Buffer *b = buffer_new(d, nbytes);
  if (b && nbytes && buffer_copyin(b, data, nbytes) != TG_OK) {
    buffer_unref(b);
    b = NULL;
  }
  free(conv);
  if (!b) return NONE;
  return finish(g_buffer(b, dt, shape, ndim), opts);
}

tg_tensor tg_from_blob(void *data, const int64_t *shape, int ndim, const tg_opts *opts) {
  int64_t n;
  tg_dtype dt;
  /* no dtype given: the memory is a C float array, whatever DEFAULT_FLOAT is (wrapping cannot convert) */
  if (!check_shape("tg_from_blob", shape, ndim, &n) || !opts_dtype("tg_from_blob", opts, TG_FLOAT32, &dt)) return NONE;
  if (!data) return tg_set_error(TG_ERR_INVALID, "tg_from_blob: data is NULL"), NONE;
  Device *d = opts_device("tg_from_blob", opts);
  if (!d) return NONE;
  if (strncmp(d->name, "CPU", 3) != 0)
    return tg_set_error(TG_ERR_INVALID, "tg_from_blob: device %s cannot wrap host memory (use tg_from_data)", d->name), NONE;
  Buffer *b = buffer_wrap(d, data, (size_t)n * tg_dtype_itemsize(dt));
  if (!b) return NONE;
  return finish(g_buffer(b, dt, shape, ndim), opts);
}

tg_tensor tg_scalar(double value, const tg_opts *opts) {
  tg_dtype dt;
  if (!opts_dtype("tg_scalar", opts, tg_default_float(), &dt)) return NONE;
  Device *d = opts_device("tg_scalar", opts);
  if (!d) return NONE;
  return finish(g_const(value, dt, d->id), opts);
}

/* tg_full and its wrappers; errors carry the name of the function the caller used */
static tg_tensor full_named(const char *fn, const int64_t *shape, int ndim, double value, const tg_opts *opts) {
  int64_t n;
  tg_dtype dt;
  if (!check_shape(fn, shape, ndim, &n) || !opts_dtype(fn, opts, tg_default_float(), &dt)) return NONE;
  /* an integer fill must be a number an integer can hold: NaN, an infinity or a value past 64 bits
   * has no integer to become (PyTorch refuses them too; smaller values wrap, as in tinygrad) */
  if (tg_dtype_is_int(dt) && !(value >= -0x1p63 && value < 0x1p64)) {
    tg_set_error(TG_ERR_INVALID, "%s: the fill value %g cannot be held by %s (hint: integer dtypes hold finite values within "
                 "64 bits; use a float dtype)", fn, value, tg_dtype_name(dt));
    return NONE;
  }
  Device *d = opts_device(fn, opts);
  if (!d) return NONE;
  return finish(g_const_shaped(value, dt, d->id, shape, ndim), opts);
}
tg_tensor tg_full(const int64_t *shape, int ndim, double value, const tg_opts *opts) { return full_named("tg_full", shape, ndim, value, opts); }
tg_tensor tg_zeros(const int64_t *shape, int ndim, const tg_opts *opts) { return full_named("tg_zeros", shape, ndim, 0.0, opts); }
tg_tensor tg_ones(const int64_t *shape, int ndim, const tg_opts *opts) { return full_named("tg_ones", shape, ndim, 1.0, opts); }

tg_tensor tg_empty(const int64_t *shape, int ndim, const tg_opts *opts) {
  int64_t n;
  tg_dtype dt;
  if (!check_shape("tg_empty", shape, ndim, &n) || !opts_dtype("tg_empty", opts, tg_default_float(), &dt)) return NONE;
  Device *d = opts_device("tg_empty", opts);
  if (!d) return NONE;
  if (!d->vt) return on_first_member(d, opts, tg_empty(shape, ndim, member_opts(d, opts)));
  bool had = tg_has_error();
  Buffer *b = buffer_new(d, (size_t)n * tg_dtype_itemsize(dt));
  if (!b) {
    char b1[256]; /* the allocator's message, under the public name */
    if (!had) error_restate(TG_OK, NULL, "tg_empty of %s %s", tg_dtype_name(dt), fmt_shape(b1, sizeof b1, shape, ndim));
    return NONE;
  }
  return finish(g_buffer(b, dt, shape, ndim), opts);
}

static tg_opts like_opts(UOp *u, const tg_opts *o) {
  tg_opts r = o ? *o : *TG_OPTS();
  if (r.dtype == TG_DTYPE_DEFAULT) r.dtype = (tg_dtype)u->dtype;
  if (!r.device) r.device = device_full_name(device_by_id(u->device));
  return r;
}
tg_tensor tg_empty_like(tg_tensor t, const tg_opts *opts) {
  GET(u, t, "tg_empty_like");
  tg_opts o = like_opts(u, opts);
  return tg_empty(u->shape, u->ndim, &o);
}
static tg_tensor full_like_named(const char *fn, tg_tensor t, double value, const tg_opts *opts) {
  GET(u, t, fn);
  tg_opts o = like_opts(u, opts);
  return full_named(fn, u->shape, u->ndim, value, &o);
}
tg_tensor tg_zeros_like(tg_tensor t, const tg_opts *opts) { return full_like_named("tg_zeros_like", t, 0.0, opts); }
tg_tensor tg_ones_like(tg_tensor t, const tg_opts *opts) { return full_like_named("tg_ones_like", t, 1.0, opts); }
tg_tensor tg_full_like(tg_tensor t, double value, const tg_opts *opts) { return full_like_named("tg_full_like", t, value, opts); }

/* Host staging memory sized by a tensor's element count (n elements of sz bytes, zeroed when asked):
 * NULL with a TG_ERR_RUNTIME error naming fn when it cannot be had, as a device allocation reports,
 * instead of tg_xmalloc's abort. */
static void *host_alloc(const char *fn, int64_t n, size_t sz, bool zero) {
  size_t cnt = (size_t)(n > 0 ? n : 0) + 1, bytes;
  void *p = NULL;
  /* what RAM plus swap could never hold is refused up front, as the CPU device does: with
   * overcommit the allocation itself could succeed, and filling it would not */
  if (!__builtin_mul_overflow(cnt, sz, &bytes) && bytes <= host_memory_limit())
    p = zero ? calloc(cnt, sz) : malloc(bytes);
  if (!p)
    tg_set_error(TG_ERR_RUNTIME, "%s: cannot allocate host memory for %lld elements of %zu bytes", fn,
                 (long long)n, sz);
  return p;
}

/* Host-computed small index tensors: float aranges, linspace and eye are uploaded once (they are
 * tiny next to the data that uses them); an integer arange is an IOTA computed in the kernel. Each
 * value is computed straight into the staging buffer in the dtype (no array of doubles beside it). */
typedef double (*ValueAt)(int64_t i, const double *p);
static tg_tensor from_values(const char *fn, ValueAt at, const double *p, const int64_t *shape, int ndim, tg_dtype dt,
                             const tg_opts *opts) {
  if (!opts_device(fn, opts)) return NONE;
  int64_t n = shape_numel(shape, ndim);
  size_t isz = tg_dtype_itemsize(dt);
  unsigned char *buf = host_alloc(fn, n, isz, false);
  if (!buf) return NONE;
  for (int64_t i = 0; i < n; i++) dtype_store(dt, buf + (size_t)i * isz, at(i, p));
  tg_opts o = opts ? *opts : *TG_OPTS();
  o.dtype = dt;
  tg_tensor t = tg_from_data(buf, shape, ndim, &o);
  free(buf);
  return t;
}
static double arange_at(int64_t i, const double *p) { return p[0] + (double)i * p[1]; }
static double linspace_at(int64_t i, const double *p) {
  return p[2] == 1 ? p[0] : p[0] + (p[1] - p[0]) * (double)i / (p[2] - 1);
}
static double eye_at(int64_t i, const double *p) {
  int64_t m = (int64_t)p[0];
  return i / m == i % m ? 1.0 : 0.0;
}

tg_tensor tg_arange(double start, double stop, double step, const tg_opts *opts) {
  if (step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step))
    return tg_set_error(TG_ERR_INVALID, "tg_arange: start=%g stop=%g step=%g: step must be non-zero and values finite", start, stop, step), NONE;
  double cnt = ceil((stop - start) / step);
  if (cnt < 0) cnt = 0;
  if (cnt > (double)((int64_t)1 << 40)) return tg_set_error(TG_ERR_INVALID, "tg_arange: %g elements is too many", cnt), NONE;
  bool ints = start == trunc(start) && stop == trunc(stop) && step == trunc(step);
  /* tinygrad's range check: [lo, hi] spans start and stop - step (not the last value), checked before
   * the length so that a range the dtype cannot hold is an error even when it is empty */
  double lo = step > 0 ? start : stop - step, hi = step > 0 ? stop - step : start;
  tg_dtype def = !ints ? tg_default_float() : lo < dtype_min(TG_INT32) || hi > dtype_max(TG_INT32) ? TG_INT64 : TG_INT32;
  tg_dtype dt;
  if (!opts_dtype("tg_arange", opts, def, &dt)) return NONE;
  if (!tg_dtype_is_float(dt) && (lo < dtype_min(dt) || hi > dtype_max(dt)))
    return tg_set_error(TG_ERR_INVALID, "tg_arange: the range [%.17g, %.17g) with step %.17g overflows %s (values %.17g..%.17g); use a wider dtype",
                        start, stop, step, tg_dtype_name(dt), dtype_min(dt), dtype_max(dt)),
           NONE;
  int64_t n = (int64_t)cnt;
  double last = start + (double)(n > 0 ? n - 1 : 0) * step;
  if (tg_dtype_is_int(dt) && ints && n > 0 && fmin(start, last) >= dtype_min(dt) && fmax(start, last) <= dtype_max(dt) &&
      (double)n <= dtype_max(dt) + 1) {
    /* exact in the dtype (every value fits it): start + i * step computed where it is read -- no
     * buffer and no host loop */
    Device *d = opts_device("tg_arange", opts);
    if (!d) return NONE;
    int dev = d->id;
    UOp *io = g_iota(n, dt, dev);
    UOp *st = g_const_shaped(step, dt, dev, &n, 1), *s0 = g_const_shaped(start, dt, dev, &n, 1);
    UOp *m = step == 1 ? uop_ref(io) : g_alu(OP_MUL, dt, io, st, NULL);
    UOp *r = start == 0 ? uop_ref(m) : g_alu(OP_ADD, dt, m, s0, NULL);
    uop_unref(io), uop_unref(st), uop_unref(s0), uop_unref(m);
    return t_wrap(r);
  }
  const double p[2] = {start, step};
  return from_values("tg_arange", arange_at, p, &n, 1, dt, opts);
}

tg_tensor tg_linspace(double start, double stop, int64_t steps, const tg_opts *opts) {
  if (steps < 0) return tg_set_error(TG_ERR_INVALID, "tg_linspace: steps=%lld must be >= 0", (long long)steps), NONE;
  if (steps > ((int64_t)1 << 40)) return tg_set_error(TG_ERR_INVALID, "tg_linspace: steps=%lld is too many", (long long)steps), NONE;
  tg_dtype dt;
  if (!opts_dtype("tg_linspace", opts, tg_default_float(), &dt)) return NONE;
  if (dt == TG_BOOL) return tg_set_error(TG_ERR_INVALID, "tg_linspace: dtype bool is not supported (use a numeric dtype and compare)"), NONE;
  const double p[3] = {start, stop, (double)steps};
  return from_values("tg_linspace", linspace_at, p, &steps, 1, dt, opts);
}

tg_tensor tg_eye(int64_t n, int64_t m, const tg_opts *opts) {
  if (n < 0 || m < 0 || n > (1 << 20) || m > (1 << 20))
    return tg_set_error(TG_ERR_INVALID,
                        "tg_eye: n=%lld m=%lld: a size is %s (each in [0, 2^20]; pass m = n for a square identity)",
                        (long long)n, (long long)m, n < 0 || m < 0 ? "negative" : "out of range"),
           NONE;
  tg_dtype dt;
  if (!opts_dtype("tg_eye", opts, tg_default_float(), &dt)) return NONE;
  int64_t sh[2] = {n, m};
  const double p[1] = {(double)m};
  return from_values("tg_eye", eye_at, p, sh, 2, dt, opts);
}

/* ---------------------------------------------------------------------------------------------- */
/* random: threefry2x32 (20 rounds) over (counter, 0) with key (seed, call number)                 */

static uint64_t rng_seed = 0;
/* Per-device call counter, kept in a 1-element uint32 device buffer and advanced by an ASSIGN inside
 * the graph. Kernels read it at run time, so a replayed TinyJit capture draws new numbers each time. */
static UOp **rng_ctr;
static int nrng_ctr;
/* Guards rng_seed, rng_ctr and nrng_ctr: threads drawing random numbers at once advance the counter
 * one at a time, so every draw gets a counter value of its own (which thread gets which value
 * depends on the order in which they take the lock). */
static pthread_mutex_t rng_lock = PTHREAD_MUTEX_INITIALIZER;

void tg_manual_seed(uint64_t seed) {
  pthread_mutex_lock(&rng_lock);
  rng_seed = seed;
  if (g_capture) g_capture->seeded = true;
  for (int i = 0; i < nrng_ctr; i++) {
    uop_unref(rng_ctr[i]);
    rng_ctr[i] = NULL;
  }
  pthread_mutex_unlock(&rng_lock);
}

static UOp *u32c(UOp *like, uint32_t v) { return g_const_shaped((double)v, TG_UINT32, like->device, like->shape, like->ndim); }
static UOp *u32op(int op, UOp *a, UOp *b) { return g_alu(op, TG_UINT32, a, b, NULL); }
static UOp *u32add(UOp *a, UOp *b) { return u32op(OP_ADD, a, b); }
static UOp *rotl(UOp *x, int r) {
  UOp *a = u32c(x, (uint32_t)r), *b = u32c(x, (uint32_t)(32 - r));
  UOp *l = u32op(OP_SHL, x, a), *h = u32op(OP_SHR, x, b);
  UOp *o = u32op(OP_OR, l, h);
  uop_unref(a), uop_unref(b), uop_unref(l), uop_unref(h);
  return o;
}

/* next_counter with rng_lock held */
static UOp *next_counter_locked(int device) {
  if (device >= nrng_ctr) {
    rng_ctr = tg_xrealloc(rng_ctr, sizeof(UOp *) * (size_t)(device + 1));
    for (int i = nrng_ctr; i <= device; i++) rng_ctr[i] = NULL;
    nrng_ctr = device + 1;
  }
  int64_t one = 1;
  /* a counter new since a seed set inside the TinyJit function being captured counts from 0 as a
   * constant, not from its buffer: the first advance writes 1 whatever the buffer holds, so each
   * replay draws what the function's plain call draws (the seed's reset is part of the capture).
   * Seeded before the capture, the counter is read from its buffer (which starts at 0): a constant
   * there made every replay repeat the capture's numbers. */
  if (g_capture) g_capture->serial = &rng_lock; /* (its replays advance the counter too) */
  bool fresh = !rng_ctr[device];
  if (fresh) {
    Buffer *b = buffer_new(device_by_id(device), 4);
    if (!b) return NULL;
    uint32_t zero = 0;
    if (buffer_copyin(b, &zero, 4) != TG_OK) {
      buffer_unref(b);
      return NULL;
    }
    rng_ctr[device] = g_buffer(b, TG_UINT32, &one, 1);
  }
  UOp *c = rng_ctr[device];
  UOp *from = fresh && g_capture && g_capture->seeded ? u32c(c, 0) : uop_ref(c);
  UOp *k1 = u32c(c, 1), *nv = u32op(OP_ADD, from, k1);
  UOp *a = g_assign(c, nv);
  UOp *snap = g_contiguous(a);
  uop_unref(k1), uop_unref(nv), uop_unref(from);
  tg_status st = realize_uops(&snap, 1);
  uop_unref(a);
  if (st != TG_OK) {
    uop_unref(snap);
    return NULL;
  }
  /* a fresh node for the counter's new contents, so the next advance is a new graph */
  rng_ctr[device] = g_buffer(buffer_ref(g_buffer_of(c)), TG_UINT32, &one, 1);
  uop_unref(c);
  UOp *key = uop_ref(uop_realized(snap));
  uop_unref(snap);
  return key;
}

/* The counter value for this call (a realized 1-element node), advancing the device counter, and the
 * seed it goes with. The value is snapshotted into its own buffer right away, so a lazy random tensor
 * realized in pieces always sees the same key, while a TinyJit capture records the advance and the
 * snapshot and so draws new numbers on every replay. Takes rng_lock. */
static UOp *next_counter(int device, uint64_t *seed) {
  pthread_mutex_lock(&rng_lock);
  *seed = rng_seed;
  UOp *key = next_counter_locked(device);
  pthread_mutex_unlock(&rng_lock);
  return key;
}

/* Random uint32 bits for `n` elements (1-D), new ref: threefry2x32 with key (seed, call counter)
 * over counters (i, 0), its first output word. With second, *second gets the other output word of
 * the same calls (another n independent words for the price of none: a normal draw takes both of
 * its uniforms from one call). fn names the public function in errors. */
static UOp *random_bits(const char *fn, int device, int64_t n, UOp **second) {
  (void)fn;
  uint64_t seed;
  UOp *ctr = next_counter(device, &seed);
  if (!ctr) return NULL;
  uint32_t k0 = (uint32_t)(seed ^ (seed >> 32));
  UOp *c = g_iota(n, TG_UINT32, device), *hi = NULL; /* element index, computed in the kernel */
  if (n > (int64_t)UINT32_MAX) {
    /* past 2^32 elements the counter's second word takes the index's high half (it was 0 and the
     * numbers repeated with period 2^32; below, nothing changes) */
    UOp *c64 = g_iota(n, TG_UINT64, device), *k32 = g_const_shaped(32, TG_UINT64, device, c64->shape, 1);
    UOp *h64 = g_alu(OP_SHR, TG_UINT64, c64, k32, NULL);
    uop_unref(c);
    c = g_cast(c64, TG_UINT32), hi = g_cast(h64, TG_UINT32);
    uop_unref(c64), uop_unref(k32), uop_unref(h64);
  }
  UOp *ks[3];
  ks[0] = u32c(c, k0);
  ks[1] = g_expand(ctr, c->shape);
  UOp *kx = u32c(c, k0 ^ 0x1BD11BDAu);
  ks[2] = u32op(OP_XOR, kx, ks[1]);
  uop_unref(kx);
  uop_unref(ctr);
  static const int R[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  UOp *x0 = u32add(c, ks[0]);
  UOp *x1 = hi ? u32add(hi, ks[1]) : uop_ref(ks[1]);
  if (hi) uop_unref(hi);
  for (int i = 0; i < 5; i++) {
    for (int j = 0; j < 4; j++) {
      UOp *s = u32add(x0, x1);
      uop_unref(x0);
      x0 = s;
      UOp *rl = rotl(x1, R[(i % 2) * 4 + j]);
      uop_unref(x1);
      x1 = u32op(OP_XOR, rl, x0);
      uop_unref(rl);
    }
    UOp *ic = u32c(c, (uint32_t)(i + 1));
    UOp *a = u32add(x0, ks[(i + 1) % 3]);
    UOp *bk = u32add(ks[(i + 2) % 3], ic);
    UOp *b = u32add(x1, bk);
    uop_unref(x0), uop_unref(x1), uop_unref(ic), uop_unref(bk);
    x0 = a, x1 = b;
  }
  if (second) *second = x1;
  else uop_unref(x1);
  uop_unref(c);
  for (int i = 0; i < 3; i++) uop_unref(ks[i]);
  return x0;
}

/* uniform [0, 1) float32 from 23 of the random bits, new ref (bits' reference is taken) */
static UOp *bits01(UOp *bits, int device) {
  UOp *nine = u32c(bits, 9), *one = u32c(bits, 0x3F800000u);
  UOp *sh = u32op(OP_SHR, bits, nine);
  UOp *o = u32op(OP_OR, sh, one);
  UOp *f = g_bitcast(o, TG_FLOAT32);
  UOp *fo = g_const_shaped(1.0, TG_FLOAT32, device, f->shape, f->ndim);
  UOp *r = g_alu(OP_SUB, TG_FLOAT32, f, fo, NULL);
  uop_unref(bits), uop_unref(nine), uop_unref(one), uop_unref(sh), uop_unref(o), uop_unref(f), uop_unref(fo);
  return r;
}

/* uniform [0, 1) float32 of numel n (1-D), new ref; with second, *second gets n more from the same
 * calls' other words */
static UOp *rand01(const char *fn, int device, int64_t n, UOp **second) {
  UOp *w1 = NULL, *bits = random_bits(fn, device, n, second ? &w1 : NULL);
  if (!bits) return NULL;
  if (second) *second = bits01(w1, device);
  return bits01(bits, device);
}

/* int_ok: tinygrad's randn, which draws in float and casts to an integer or bool dtype */
static tg_tensor rand_shaped(const char *fn, const int64_t *shape, int ndim, const tg_opts *opts,
                             double scale, double shift, bool normal, bool int_ok) {
  int64_t n;
  tg_dtype dt;
  if (!check_shape(fn, shape, ndim, &n) || !opts_dtype(fn, opts, tg_default_float(), &dt)) return NONE;
  if (!tg_dtype_is_float(dt) && !int_ok)
    return tg_set_error(TG_ERR_INVALID, "%s: dtype %s is not a float dtype", fn, tg_dtype_name(dt)), NONE;
  Device *d = opts_device(fn, opts);
  if (!d) return NONE;
  if (!d->vt) return on_first_member(d, opts, rand_shaped(fn, shape, ndim, member_opts(d, opts), scale, shift, normal, int_ok));
  UOp *r;
  if (!normal && dt == TG_FLOAT64) {
    /* 53 random bits, from both words of each call: (w0 >> 5) * 2^-27 + (w1 >> 6) * 2^-53 */
    UOp *w1 = NULL, *w0 = random_bits(fn, d->id, n, &w1);
    if (!w0) return NONE;
    UOp *s5 = u32c(w0, 5), *s6 = u32c(w1, 6);
    UOp *a = u32op(OP_SHR, w0, s5), *b = u32op(OP_SHR, w1, s6);
    UOp *af = g_cast(a, TG_FLOAT64), *bf = g_cast(b, TG_FLOAT64);
    UOp *ka = g_const_shaped(ldexp(1, -27), TG_FLOAT64, d->id, w0->shape, 1), *kb = g_const_shaped(ldexp(1, -53), TG_FLOAT64, d->id, w0->shape, 1);
    UOp *ma = g_alu(OP_MUL, TG_FLOAT64, af, ka, NULL), *mb = g_alu(OP_MUL, TG_FLOAT64, bf, kb, NULL);
    r = g_alu(OP_ADD, TG_FLOAT64, ma, mb, NULL);
    UOp *all[] = {w0, w1, s5, s6, a, b, af, bf, ka, kb, ma, mb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) uop_unref(all[i]);
  } else if (!normal) {
    r = rand01(fn, d->id, n, NULL);
    /* [0, 1) in float32 has 2^-24 steps; rounded to float16's 11, bfloat16's 8 or fp8's 3-4 significant bits,
     * the values just below 1 would become 1. Truncate to the dtype's own grid (tinygrad fills the
     * dtype's mantissa bits), which keeps every value below 1. */
    int nmant = dtype_mant_bits(dt);
    if (r && nmant) {
      UOp *k = g_const_shaped(ldexp(1, nmant), TG_FLOAT32, d->id, r->shape, 1);
      UOp *ik = g_const_shaped(ldexp(1, -nmant), TG_FLOAT32, d->id, r->shape, 1);
      UOp *sc = g_alu(OP_MUL, TG_FLOAT32, r, k, NULL), *ti = g_cast(sc, TG_INT32),
          *tf = g_cast(ti, TG_FLOAT32);
      UOp *q = g_alu(OP_MUL, TG_FLOAT32, tf, ik, NULL);
      uop_unref(k), uop_unref(ik), uop_unref(sc), uop_unref(ti), uop_unref(tf), uop_unref(r);
      r = q;
    }
  } else {
    /* Box-Muller: cos(2*pi*u0) * sqrt(-2*log(1-u1)), u0 and u1 the two output words of one
     * threefry call (one call per normal number, as tinygrad's randn, whose rand of 2n numbers
     * takes the calls' two words for its halves) */
    UOp *u1 = NULL, *u0 = rand01(fn, d->id, n, &u1);
    if (!u0) return NONE;
    UOp *k = g_const_shaped(2 * M_PI, TG_FLOAT32, d->id, u0->shape, 1), *hp = g_const_shaped(M_PI / 2, TG_FLOAT32, d->id, u0->shape, 1);
    UOp *ang = g_alu(OP_MUL, TG_FLOAT32, u0, k, NULL), *ang2 = g_alu(OP_ADD, TG_FLOAT32, ang, hp, NULL);
    UOp *cs = g_alu(OP_SIN, TG_FLOAT32, ang2, NULL, NULL);
    UOp *one = g_const_shaped(1, TG_FLOAT32, d->id, u0->shape, 1), *m2 = g_const_shaped(-2, TG_FLOAT32, d->id, u0->shape, 1);
    UOp *om = g_alu(OP_SUB, TG_FLOAT32, one, u1, NULL);
    UOp *lg = n_log(om);
    UOp *t = g_alu(OP_MUL, TG_FLOAT32, lg, m2, NULL);
    UOp *sq = g_alu(OP_SQRT, TG_FLOAT32, t, NULL, NULL);
    r = g_alu(OP_MUL, TG_FLOAT32, cs, sq, NULL);
    UOp *all[] = {u0, u1, k, hp, ang, ang2, cs, one, m2, om, lg, t, sq};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) uop_unref(all[i]);
  }
  if (!r) return NONE;
  tg_dtype rdt = (tg_dtype)r->dtype; /* (float32, or float64's own draw) */
  if (scale != 1.0) {
    UOp *s = g_const_shaped(scale, rdt, d->id, r->shape, 1);
    UOp *m = g_alu(OP_MUL, rdt, r, s, NULL);
    uop_unref(s), uop_unref(r);
    r = m;
  }
  if (shift != 0.0) {
    UOp *s = g_const_shaped(shift, rdt, d->id, r->shape, 1);
    UOp *m = g_alu(OP_ADD, rdt, r, s, NULL);
    uop_unref(s), uop_unref(r);
    r = m;
  }
  UOp *c = g_cast(r, dt);
  uop_unref(r);
  UOp *rs = g_reshape(c, shape, ndim);
  uop_unref(c);
  return finish(rs, opts);
}

tg_tensor tg_rand(const int64_t *shape, int ndim, const tg_opts *opts) {
  return rand_shaped("tg_rand", shape, ndim, opts, 1, 0, false, false);
}
tg_tensor tg_randn(const int64_t *shape, int ndim, const tg_opts *opts) {
  return rand_shaped("tg_randn", shape, ndim, opts, 1, 0, true, true);
}
tg_tensor tg_uniform(const int64_t *shape, int ndim, double low, double high, const tg_opts *opts) {
  if (!(low < high) || !isfinite(high - low))
    return tg_set_error(TG_ERR_INVALID, "tg_uniform: low=%g must be below high=%g (both finite)", low, high), NONE;
  return rand_shaped("tg_uniform", shape, ndim, opts, high - low, low, false, false);
}
tg_tensor tg_normal(const int64_t *shape, int ndim, double mean, double std, const tg_opts *opts) {
  if (!(std >= 0) || !isfinite(std) || !isfinite(mean))
    return tg_set_error(TG_ERR_INVALID, "tg_normal: std=%g must be finite and >= 0 (mean=%g finite)", std, mean), NONE;
  return rand_shaped("tg_normal", shape, ndim, opts, std, mean, true, false);
}
tg_tensor tg_randint(const int64_t *shape, int ndim, int64_t low, int64_t high, const tg_opts *opts) {
  if (high <= low) return tg_set_error(TG_ERR_INVALID, "tg_randint: low=%lld must be < high=%lld", (long long)low, (long long)high), NONE;
  int64_t range;
  if (__builtin_sub_overflow(high, low, &range))
    return tg_set_error(
               TG_ERR_INVALID,
               "tg_randint: the range high - low (low=%lld, high=%lld) overflows int64; use a narrower range",
               (long long)low, (long long)high),
           NONE;
  tg_dtype dt;
  if (!opts_dtype("tg_randint", opts, TG_INT32, &dt)) return NONE;
  if (!tg_dtype_is_int(dt)) return tg_set_error(TG_ERR_INVALID, "tg_randint: dtype %s is not an integer dtype", tg_dtype_name(dt)), NONE;
  tg_opts o = opts ? *opts : *TG_OPTS();
  o.dtype = TG_FLOAT32;
  o.requires_grad = false;
  tg_tensor u = rand_shaped("tg_randint", shape, ndim, &o, (double)range, 0, false, false);
  UOp *uu = t_get(u, "tg_randint");
  if (!uu) return NONE;
  /* floor(u * (high-low)) + low, computed in int after truncation (u >= 0) */
  UOp *ti = g_cast(uu, TG_INT64);
  UOp *lo = g_const_shaped((double)low, TG_INT64, uu->device, uu->shape, uu->ndim);
  UOp *s = g_alu(OP_ADD, TG_INT64, ti, lo, NULL);
  UOp *r = g_cast(s, dt);
  uop_unref(ti), uop_unref(lo), uop_unref(s);
  tg_free(u);
  return t_wrap(r);
}

/* ---------------------------------------------------------------------------------------------- */
/* properties                                                                                      */

int tg_ndim(tg_tensor t) {
  UOp *u = t_get(t, "tg_ndim");
  return u ? u->ndim : -1;
}
int tg_shape(tg_tensor t, int64_t *out) {
  UOp *u = t_get(t, "tg_shape");
  if (!u) return -1;
  if (!out && u->ndim) {
    tg_set_error(TG_ERR_INVALID, "tg_shape: out is NULL");
    return -1;
  }
  if (u->ndim) memcpy(out, u->shape, sizeof(int64_t) * (size_t)u->ndim);
  return u->ndim;
}
int64_t tg_dim(tg_tensor t, int axis) {
  UOp *u = t_get(t, "tg_dim");
  int ax;
  if (!u || norm_axis("tg_dim", axis, u->ndim, &ax) < 0) return -1;
  return u->ndim ? u->shape[ax] : 1;
}
int64_t tg_numel(tg_tensor t) {
  UOp *u = t_get(t, "tg_numel");
  return u ? shape_numel(u->shape, u->ndim) : -1;
}
tg_dtype tg_dtype_of(tg_tensor t) {
  UOp *u = t_get(t, "tg_dtype_of");
  return u ? (tg_dtype)u->dtype : TG_DTYPE_DEFAULT;
}
const char *tg_device_of(tg_tensor t) {
  UOp *u = t_get(t, "tg_device_of");
  return u ? device_full_name(device_by_id(u->device)) : NULL;
}
bool tg_is_realized(tg_tensor t) {
  Slot *s = t_slot(t);
  return s && (uop_realized(s->u) || g_base_buffer(s->u));
}

/* ---------------------------------------------------------------------------------------------- */
/* realize and data                                                                                */

static tg_status realize_many(const char *fn, const tg_tensor *ts, int n);

tg_status tg_realize(tg_tensor t) { return realize_many("tg_realize", &t, 1); }

tg_status tg_realize_many(const tg_tensor *ts, int n) { return realize_many("tg_realize_many", ts, n); }

/* fn: the entry point, named in a handle's error */
static tg_status realize_many(const char *fn, const tg_tensor *ts, int n) {
  if (n < 0 || (n > 0 && !ts)) return tg_set_error(TG_ERR_INVALID, "tg_realize_many: ts is NULL or n=%d < 0", n);
  UOp **us = tg_xmalloc(sizeof(UOp *) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    us[i] = t_get(ts[i], fn);
    if (!us[i]) {
      free(us);
      return TG_ERR_HANDLE;
    }
    uop_ref(us[i]);
  }
  tg_status st = realize_uops(us, n);
  for (int i = 0; i < n; i++) uop_unref(us[i]);
  free(us);
  if (st != TG_OK) error_name_call(fn);
  return st;
}

/* A BUFFER node holding u's elements contiguously (realizing or copying as needed); new ref. */
static UOp *contiguous_buffer(UOp *u, tg_status *st) {
  if (m_is(u)) { /* a multi-device tensor: realized, then gathered on its first device */
    *st = realize_uops(&u, 1);
    if (*st != TG_OK) return NULL;
    const int *ids;
    device_tuple_members(u->device, &ids);
    UOp *g = m_gather(g_resolve(u), ids[0]);
    UOp *b = contiguous_buffer(g, st);
    uop_unref(g);
    return b;
  }
  UOp *r = uop_realized(u) ? uop_realized(u) : u;
  if (r->op == OP_BUFFER) {
    *st = TG_OK;
    return uop_ref(r);
  }
  if (!g_base_buffer(u)) {
    /* pending computation: realize u itself (as tg_realize does) so the caller's handle is swapped
     * to the result and reading it again runs nothing */
    *st = realize_uops(&u, 1);
    return (*st == TG_OK && uop_realized(u)) ? uop_ref(uop_realized(u)) : NULL;
  }
  /* a strided view of a realized buffer: copy it out contiguously, leaving the view as it is */
  UOp *c = g_contiguous(u);
  *st = realize_uops(&c, 1);
  UOp *b = (*st == TG_OK) ? uop_ref(uop_realized(c)) : NULL;
  uop_unref(c);
  return b;
}

/* tinygrad refuses reading data while a TinyJit captures: the value read would be a constant in
 * every replay, silently. */
static tg_status refuse_read_in_capture(const char *fn) {
  return tg_set_error(TG_ERR_INVALID,
                      "%s: cannot read a tensor's data while a TinyJit captures the function (the value would be "
                      "baked into every replay); return the tensor as an output of the jitted function and read it "
                      "after tg_jit_call",
                      fn);
}

static tg_status data_impl(tg_tensor t, void *out, size_t nbytes);
tg_status tg_data(tg_tensor t, void *out, size_t nbytes) {
  tg_status st = data_impl(t, out, nbytes);
  if (st != TG_OK) error_name_call("tg_data");
  return st;
}
static tg_status data_impl(tg_tensor t, void *out, size_t nbytes) {
  if (engine_capturing()) return refuse_read_in_capture("tg_data");
  UOp *u = t_get(t, "tg_data");
  if (!u) return TG_ERR_HANDLE;
  size_t need = (size_t)shape_numel(u->shape, u->ndim) * tg_dtype_itemsize((tg_dtype)u->dtype);
  if (!out && need) return tg_set_error(TG_ERR_INVALID, "tg_data: out is NULL");
  if (nbytes < need)
    return tg_set_error(TG_ERR_INVALID, "tg_data: out has %zu bytes but the tensor needs %zu (%lld elements of %s)", nbytes, need,
                        (long long)shape_numel(u->shape, u->ndim), tg_dtype_name((tg_dtype)u->dtype));
  uop_ref(u);
  tg_status st;
  if (u->sym && !g_base_buffer(u)) {
    /* a symbolic shape: realized at its max, the handle then holds a view of that buffer */
    st = realize_uops(&u, 1);
    uop_unref(u);
    if (st != TG_OK) return st;
    u = uop_ref(t_get(t, "tg_data"));
  }
  /* a view of a buffer (or the buffer itself) that other handles have a pending write into (t[1]
   * taken before t[1, 2] = -5, or t read after a setitem through t[:, :]) reads it after the write,
   * as the same memory would */
  if (!u->sym && g_base_buffer(u) && !uop_realized(u)) {
    st = t_realize_pending_writes(g_buffer_of(g_base_buffer(u)));
    if (st != TG_OK) {
      uop_unref(u);
      return st;
    }
  }
  if (u->sym) {
    /* read the bound-size elements through a view with the bound values */
    UOp *c = g_concrete(u);
    uop_unref(u);
    u = c;
  }
  UOp *b = contiguous_buffer(u, &st);
  uop_unref(u);
  if (!b) return st;
  /* the realized node now backs the handle too */
  Slot *s = t_slot(t);
  if (s && s->u == u && uop_realized(u)) t_replace_everywhere(u, uop_realized(u));
  st = need ? buffer_copyout(g_buffer_of(b), out, need) : TG_OK;
  uop_unref(b);
  return st;
}

tg_status tg_item(tg_tensor t, double *out) {
  if (engine_capturing()) return refuse_read_in_capture("tg_item");
  UOp *u = t_get(t, "tg_item");
  if (!u) return TG_ERR_HANDLE;
  if (!out) return tg_set_error(TG_ERR_INVALID, "tg_item: out is NULL");
  char b[256];
  if (shape_numel(u->shape, u->ndim) != 1)
    return tg_set_error(TG_ERR_INVALID, "tg_item: tensor of shape %s has %lld elements, item needs exactly 1", fmt_shape(b, sizeof b, u->shape, u->ndim),
                        (long long)shape_numel(u->shape, u->ndim));
  /* tg_data may swap the handle to its realized node and drop u: read the dtype first */
  tg_dtype dt = (tg_dtype)u->dtype;
  unsigned char tmp[16];
  tg_status st = tg_data(t, tmp, sizeof tmp);
  if (st == TG_OK) *out = dtype_load(dt, tmp);
  return st;
}

tg_status tg_item_i64(tg_tensor t, int64_t *out) {
  if (engine_capturing()) return refuse_read_in_capture("tg_item_i64");
  UOp *u = t_get(t, "tg_item_i64");
  if (!u) return TG_ERR_HANDLE;
  if (!out) return tg_set_error(TG_ERR_INVALID, "tg_item_i64: out is NULL");
  if (shape_numel(u->shape, u->ndim) != 1) return tg_set_error(TG_ERR_INVALID, "tg_item_i64: tensor has %lld elements, item needs exactly 1", (long long)shape_numel(u->shape, u->ndim));
  tg_dtype dt = (tg_dtype)u->dtype; /* before tg_data, which may drop u */
  unsigned char tmp[16];
  tg_status st = tg_data(t, tmp, sizeof tmp);
  if (st == TG_OK) *out = dtype_load_i64(dt, tmp);
  return st;
}

char *tg_to_string(tg_tensor t) {
  if (engine_capturing()) {
    refuse_read_in_capture("tg_to_string");
    return NULL;
  }
  UOp *u = t_get(t, "tg_to_string");
  if (!u) return NULL;
  size_t need = (size_t)shape_numel(u->shape, u->ndim) * tg_dtype_itemsize((tg_dtype)u->dtype);
  void *buf = tg_xmalloc(need + 1);
  int64_t *sh = u->ndim ? tg_xmalloc(sizeof(int64_t) * (size_t)u->ndim) : NULL;
  int nd = u->ndim;
  tg_dtype dt = (tg_dtype)u->dtype;
  if (nd) memcpy(sh, u->shape, sizeof(int64_t) * (size_t)nd);
  char *s = NULL;
  if (tg_data(t, buf, need) == TG_OK) s = format_array(buf, dt, sh, nd);
  free(buf);
  free(sh);
  return s;
}

tg_status tg_print(tg_tensor t) {
  if (engine_capturing()) return refuse_read_in_capture("tg_print");
  char *s = tg_to_string(t);
  if (!s) return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
  printf("%s\n", s);
  free(s);
  return TG_OK;
}

tg_tensor tg_to(tg_tensor t, const char *device) {
  GET(u, t, "tg_to");
  Device *d = named_device("tg_to", device);
  if (!d) return NONE;
  if (d->id == u->device) return t_wrap(uop_ref(u));
  return t_wrap(g_copy(u, d->id));
}

tg_tensor tg_contiguous(tg_tensor t) {
  GET(u, t, "tg_contiguous");
  UOp *r = uop_realized(u) ? uop_realized(u) : u;
  if (r->op == OP_BUFFER) return t_wrap(uop_ref(u));
  return t_wrap(g_contiguous(u));
}

tg_tensor tg_clone(tg_tensor t) {
  GET(u, t, "tg_clone");
  return t_wrap(g_contiguous(u));
}

/* tinygrad's clone(device): a buffer of its own (a copy when the device differs, else what tg_clone
 * makes), t's requires_grad, and t's gradient cloned onto that device (NULL: each stays where it is). */
tg_tensor tg_clone_to(tg_tensor t, const char *device) {
  const char *fn = "tg_clone_to";
  GET(u, t, fn);
  Device *d = NULL;
  if (device && !(d = named_device(fn, device))) return NONE;
  int dev = d ? d->id : u->device;
  Slot *s = t_slot(t);
  UOp *g = s->grad;
  int8_t rg = s->requires_grad;
  tg_tensor r = t_wrap(dev == u->device ? g_contiguous(u) : g_copy(u, dev));
  if (!r.id) return NONE;
  if (rg != TG_GRAD_UNSET) tg_set_requires_grad(r, rg != 0);
  int gdev = d ? d->id : g ? g->device : dev;
  if (g) t_slot(r)->grad = g->device == gdev ? g_contiguous(g) : g_copy(g, gdev);
  return r;
}

tg_tensor tg_detach(tg_tensor t) {
  GET(u, t, "tg_detach");
  return t_wrap(g_detach(u));
}

/* Is t a chain of shrinks, one with a symbolic argument, over a buffer (or a pending assign into
 * one)? Such a target is written in place (an ASSIGN of a region); a concrete shrink keeps the
 * setitem path. */
bool t_region_target(UOp *t) {
  bool sym = false;
  while (t->op == OP_SHRINK && !uop_realized(t)) {
    int n;
    sym = sym || uop_move_args(t, &n) != t->iarg;
    t = t->src[0];
  }
  UOp *b = uop_realized(t) ? uop_realized(t) : t;
  return sym && (b->op == OP_BUFFER || b->op == OP_ASSIGN);
}

static tg_tensor assign_region(tg_tensor target, UOp *tb, UOp *vu) {
  int nd = tb->ndim;
  int64_t lo[64], loc[64]; /* the region's start per dim (codes kept) and its concrete value */
  for (int i = 0; i < nd; i++) lo[i] = 0, loc[i] = 0;
  UOp *t = tb, *chain[64];
  int nc = 0;
  while (t->op == OP_SHRINK && !uop_realized(t) && nc < 64) {
    chain[nc++] = t;
    t = t->src[0];
  }
  /* compose the starts, innermost first: start = sum of the chain's starts */
  for (int k = nc - 1; k >= 0; k--) {
    int n;
    const int64_t *a = uop_move_args(chain[k], &n);
    for (int i = 0; i < nd; i++) {
      int64_t s = a[2 * i];
      if (sym_is_code(s) && sym_is_code(lo[i]))
        return tg_set_error(TG_ERR_INVALID, "tg_assign: dim %d of the target view is shrunk at two symbolic starts", i), (tg_tensor){0};
      loc[i] += chain[k]->iarg[2 * i];
      if (sym_is_code(s)) {
        SymDim d;
        sym_decode(s, &d);
        lo[i] = sym_encode(d.var, d.value, d.offset + (lo[i]));
      } else if (sym_is_code(lo[i])) {
        SymDim d;
        sym_decode(lo[i], &d);
        lo[i] = sym_encode(d.var, d.value, d.offset + s);
      } else {
        lo[i] += s;
      }
    }
  }
  UOp *base = t;
  if (base->op == OP_ASSIGN || (uop_realized(base) == NULL && base->op != OP_BUFFER)) {
    if (realize_uops(&base, 1) != TG_OK) return (tg_tensor){0};
  }
  UOp *bn = uop_realized(base) ? uop_realized(base) : base;
  if (bn->op != OP_BUFFER) return tg_set_error(TG_ERR_INVALID, "tg_assign: the target view's base has no storage"), (tg_tensor){0};
  /* the region: [start, start + the value's size) per dim */
  int64_t bounds[128];
  for (int i = 0; i < nd; i++) {
    bounds[2 * i] = lo[i];
    SymDim d, z;
    bool ssym = tb->sym && sym_decode(tb->sym[i], &z); /* a region of symbolic size (cache[:, 0:v]) */
    if (sym_decode(lo[i], &d) && ssym)
      return tg_set_error(TG_ERR_INVALID, "tg_assign: dim %d of the target view starts and extends symbolically", i), (tg_tensor){0};
    if (sym_decode(lo[i], &d)) bounds[2 * i + 1] = sym_encode(d.var, d.value, d.offset + tb->shape[i]);
    else if (ssym) bounds[2 * i + 1] = sym_encode(z.var, z.value, z.offset + loc[i]);
    else bounds[2 * i + 1] = loc[i] + tb->shape[i];
  }
  UOp *v = g_cast(vu, (tg_dtype)bn->dtype);
  UOp *a = g_assign_region(bn, v, bounds);
  uop_unref(v);
  t_replace_buffer_everywhere(g_buffer_of(bn), a);
  /* the target: the same view of the assigned buffer */
  UOp *r = uop_ref(a);
  for (int k = nc - 1; k >= 0; k--) {
    int n;
    const int64_t *ma = uop_move_args(chain[k], &n);
    UOp *x = g_shrink(r, ma);
    uop_unref(r);
    r = x;
  }
  Slot *s = t_slot(target);
  UOp *old = s->u;
  s->u = r;
  uop_unref(old);
  return target;
}

/* The lazy write of vu (cast to tb's dtype) into tb, the target's storage: target's handle holds the
 * ASSIGN node from now on. */
static tg_tensor assign_node(tg_tensor target, UOp *tb, UOp *vu) {
  /* a write another handle holds pending into the same storage goes first (built on the buffer
   * alone, this one would drop it) */
  Buffer *buf = tb->op == OP_BUFFER ? g_buffer_of(tb) : NULL; /* (tb may be the slot's node, freed below) */
  if (buf && t_realize_pending_writes(buf) != TG_OK) return NONE;
  UOp *v = g_cast(vu, (tg_dtype)tb->dtype);
  UOp *a = g_assign(tb, v);
  uop_unref(v);
  Slot *s = t_slot(target);
  UOp *old = s->u;
  s->u = a;
  /* every other handle of that storage (an alias: a full shrink, a same-shape reshape, tg_to its own
   * device) sees the write, in graphs built after it and when the target handle is freed first; for a
   * multi-device tensor of buffers, every handle of the same node (a full shrink of a sharded tensor
   * is that node: the write stayed pending in the view's handle, and the tensor never saw it) */
  if (buf) t_replace_buffer_everywhere(buf, a);
  else if (old == tb && tb->op == OP_MULTI) t_replace_node_everywhere(tb, a);
  uop_unref(old);
  return target;
}

/* tg_assign to a multi-device target: each shard's buffer takes its part of the value (resharded
 * to the target's sharding). A target whose shards are not buffers of their own gets them first. */
bool shards_are_buffers(UOp *tb) {
  for (uint32_t i = 0; i < tb->nsrc; i++)
    if (g_resolve(tb->src[i])->op != OP_BUFFER) return false;
  return true;
}

/* (an empty shard -- a view that keeps none of a member's part -- counts: there is nothing to write) */
bool m_is_view_of_buffers(UOp *tu) {
  UOp *tb = g_resolve(tu);
  bool views = true;
  for (uint32_t i = 0; i < tb->nsrc; i++)
    views = views && (g_base_buffer(tb->src[i]) != NULL || shape_numel(tb->src[i]->shape, tb->src[i]->ndim) == 0);
  return views && !shards_are_buffers(tb);
}

static tg_tensor assign_multi(tg_tensor target, UOp *tu, UOp *vu) {
  UOp *tb = g_resolve(tu);
  bool own = shards_are_buffers(tb);
  if (!own && m_is_view_of_buffers(tu)) {
    /* views of buffers (a shrink of a realized sharded tensor): each shard's part of the value is
     * written through its view into that buffer, as on one device (it went into a copy, and the
     * sharded tensor the view was taken of never changed). Not a value of symbolic size along the
     * sharded axis (a region cut there at a symbolic size: the shards hold the bound value's split,
     * and such writes read and wrote outside their buffers) */
    int ax = m_axis(tb);
    UOp *v0 = ax >= 0 && m_is(vu) ? g_resolve(vu)->src[0] : vu;
    if (ax >= 0 && ax < v0->ndim && v0->sym && sym_is_code(v0->sym[ax]))
      return tg_set_error(TG_ERR_INVALID, "tg_assign: the value has a symbolic size on the sharded axis (%d) of the "
                          "multi-device target, whose shards split at the bound value; write a region of plain size "
                          "there (the bound value), or shard another axis", ax),
             NONE;
    UOp *v = m_reshard_like(vu, tb);
    tg_status st = TG_OK;
    for (uint32_t i = 0; st == TG_OK && i < tb->nsrc; i++) {
      if (shape_numel(tb->src[i]->shape, tb->src[i]->ndim) == 0) continue;
      tg_tensor ti = t_wrap(uop_ref(tb->src[i])), vi = t_wrap(uop_ref(g_resolve(v)->src[i]));
      st = tg_setitem(ti, NULL, 0, vi);
      if (st == TG_OK) st = tg_realize(ti); /* (now: the shard's handle is a temporary one) */
      tg_free(ti), tg_free(vi);
    }
    uop_unref(v);
    return st == TG_OK ? target : NONE;
  }
  if (!own) {
    UOp *c = g_contiguous(tu);
    tg_status st = realize_uops(&c, 1);
    if (st != TG_OK) {
      uop_unref(c);
      return NONE;
    }
    Slot *ts = t_slot(target);
    UOp *prev = ts->u;
    ts->u = uop_ref(g_resolve(c));
    uop_unref(prev), uop_unref(c);
    tu = tb = ts->u;
  }
  return assign_node(target, tb, vu);
}

/* Is u a chain of views over a pending write (an ASSIGN not yet realized)? Its storage is that
 * write's buffer: an assign into it is a write through the view, not into a copy. */
static bool view_of_pending_write(UOp *u) {
  UOp *b = g_view_base(u);
  return b && b->op == OP_ASSIGN;
}

tg_tensor tg_assign(tg_tensor target, tg_tensor value) {
  GET(tu, target, "tg_assign");
  GET(vu, value, "tg_assign");
  char b1[256], b2[256];
  if (tu->ndim != vu->ndim || (tu->ndim && memcmp(tu->shape, vu->shape, sizeof(int64_t) * (size_t)tu->ndim)))
    return tg_set_error(TG_ERR_INVALID, "tg_assign: value shape %s does not match target shape %s", fmt_shape(b1, sizeof b1, vu->shape, vu->ndim),
                        fmt_shape(b2, sizeof b2, tu->shape, tu->ndim)),
           NONE;
  if (tu->device != vu->device)
    return tg_set_error(TG_ERR_INVALID, "tg_assign: value is on %s but the target is on %s", device_by_id(vu->device)->name, device_by_id(tu->device)->name), NONE;
  if (m_is(tu)) return assign_multi(target, tu, vu);
  /* the target must be backed by its own contiguous buffer; a detached handle of a tensor with
   * storage shares it (PyTorch's detach().add_() writes the tensor) */
  UOp *tb = uop_realized(tu) ? uop_realized(tu) : tu;
  while (tb->op == OP_DETACH && tb->nsrc == 1 && (tb->src[0]->op == OP_BUFFER || uop_realized(tb->src[0])))
    tb = uop_realized(tb->src[0]) ? uop_realized(tb->src[0]) : tb->src[0];
  if (tb->op != OP_BUFFER) {
    if (tb->op == OP_ASSIGN) {
      if (tg_realize(target) != TG_OK) return NONE;
      tu = t_get(target, "tg_assign");
      tb = uop_realized(tu) ? uop_realized(tu) : tu;
    } else if (!g_base_buffer(tb) && !view_of_pending_write(tb)) {
      /* A lazy target gets a buffer of its own holding its current value. Realizing the node itself
       * would give that buffer to every handle holding the (hash-consed) node -- two tg_zeros of one
       * shape are one node -- and the assign would change all of them. */
      Slot *ts = t_slot(target);
      bool self = vu == ts->u && t_slot(value) == ts; /* x assigned to itself */
      if (!t_own_buffer(ts, "tg_assign")) return NONE;
      if (self) vu = ts->u; /* the value is what x holds now */
      tu = tb = ts->u;
    }
    if (tb->op != OP_BUFFER && t_region_target(tb)) {
      /* a shrink of a buffer at a symbolic offset (a KV cache at start_pos): written in place */
      return assign_region(target, tb, vu);
    }
    if (tb->op != OP_BUFFER) {
      /* a view of a tensor with storage: the write lands in that storage (tinygrad's view assign),
       * as a setitem of the whole view does it */
      tg_status st = tg_setitem(target, NULL, 0, value);
      return st == TG_OK ? target : NONE;
    }
  }
  return assign_node(target, tb, vu);
}

int tg_device_list(tg_device_info *out, int cap) {
  int n = device_kind_count();
  /* probing records errors of its own: the caller's pending error is put back afterwards */
  tg_status saved = tg_last_status();
  char *saved_msg = saved != TG_OK ? tg_xstrdup(tg_last_error()) : NULL;
  for (int i = 0; out && i < n && i < cap; i++) {
    tg_device_info *d = &out[i];
    memset(d, 0, sizeof *d);
    d->name = device_kind_name(i);
    d->renderers = device_kind_renderers(i);
    tg_clear_error();
    d->available = device_get(d->name) != NULL;
    if (!d->available) snprintf(d->why, sizeof d->why, "%s", tg_last_error() ? tg_last_error() : "cannot open");
  }
  tg_clear_error();
  if (saved_msg) tg_set_error(saved, "%s", saved_msg);
  free(saved_msg);
  return n;
}

const char *tg_default_device(void) {
  Device *d = device_default();
  return d ? d->name : NULL;
}

tg_status tg_synchronize(const char *device) {
  Device *d = named_device("tg_synchronize", device);
  if (!d) return tg_last_status() != TG_OK ? tg_last_status() : TG_ERR_INVALID;
  if (d->vt->synchronize) d->vt->synchronize(d->state);
  return TG_OK;
}

/* tinygrad's Tensor.arange(v) for a symbolic length (see tinygrad.h): an iota, computed where it is read */
tg_tensor tg_arange_sym(int64_t stop, const tg_opts *opts) {
  tg_dtype dt = opts && opts->dtype != TG_DTYPE_DEFAULT ? opts->dtype : TG_INT32;
  SymDim d;
  bool sym = sym_decode(stop, &d);
  int64_t n = sym ? sym_concrete(stop) : stop;
  if (!sym && stop < -((int64_t)1 << 62))
    return tg_set_error(TG_ERR_INVALID, "tg_arange_sym: stop %lld is neither a size nor a symbolic size (tg_sym)", (long long)stop),
           (tg_tensor){0};
  if (n < 0 || (sym && d.min + d.offset < 0))
    return tg_set_error(TG_ERR_INVALID, "tg_arange_sym: length %lld must not be negative (for any value of the variable: it is %lld at the "
                        "variable's minimum %lld)", (long long)n, (long long)(sym ? d.min + d.offset : n), (long long)(sym ? d.min : 0)),
           (tg_tensor){0};
  if (!tg_dtype_is_int(dt) || (sym ? sym_maxval(stop) : n) - 1 > dtype_max(dt))
    return tg_set_error(TG_ERR_INVALID, "tg_arange_sym: dtype %s cannot hold every index below %lld", tg_dtype_name(dt),
                        (long long)(sym ? sym_maxval(stop) : n)),
           (tg_tensor){0};
  Device *dev = opts_device("tg_arange_sym", opts);
  if (!dev) return (tg_tensor){0};
  return t_wrap(g_iota(stop, dt, dev->id));
}

