/*
 * opt.c -- kernel optimizations as Opt lists (tinygrad's Opt(op, axis, arg), see codegen.h): the
 * hand-coded heuristics (tinygrad's BEAM=0 choices), and applying a given list (BEAM's candidates,
 * a cached choice, GPU_OPTS), to a lowered kernel before rendering. The actions:
 *
 *  - vector lanes (the first UPCAST by 4, 8 or 16 that can make them): a global axis along which
 *    the output is contiguous steps by W lanes and every load whose index moves by exactly 1 per
 *    lane becomes one W-wide load (loads that do not depend on the axis stay scalar and are
 *    broadcast). Refused when any lane-dependent value is not float32/bool, or lanes reach index
 *    arithmetic other than a contiguous load/store offset. Or (UNROLL by 4, 8 or 16) lanes along a
 *    reduce axis, with vector accumulators summed across lanes at the end.
 *  - UPCAST of global axes (register tiles): the body is copied for each unrolled position, each
 *    copy with its own accumulator, so one loaded vector of one input is reused by every copy that
 *    shares it (hash-consing shares the common loads automatically).
 *  - PADTO: an upcast axis of a reduce kernel that the factor does not divide (10 outputs of a
 *    classifier, a 6x6 feature map) is padded to the next multiple; the copies past the end are
 *    clamped to the last position (see make_copies).
 *  - UNROLL of a reduce axis, SWAP of loop order, THREAD, and the GPU actions (LOCAL, GROUP,
 *    GROUPTOP, NOLOCALS).
 *
 * The heuristics apply their choices as they make them and record them as the list that, applied
 * to the same kernel, gives the same code (tests/test_opt.c heuristic_list_replays).
 *
 * In: an LKernel with value/sidx/rbody/rplace. Out: ncopy copies in values/sidxs/rbodies/rplaces,
 * vw set, loop ranges resized, the list in `applied`. Invariant: the copies together compute
 * exactly what the unoptimized kernel computes (checked by running the op suite with NOOPT=1 and
 * without).
 */
#include <stdio.h>
#include <string.h>

#include "../uop/ptrmap.h"
#include "codegen.h"

#define LANE_AXIS 999999

typedef struct {
  UOp *lane;
  int W;
  bool gather; /* float32 loads strided along the lanes may become gathers */
  bool gpu;    /* an OpenCL kernel: float32 lanes and masks only (no integer lanes or loads) */
  bool half;   /* float16/bfloat16 lanes too (the C renderer: float lanes rounded after every op) */
  PtrMap dep;  /* node -> 1 (depends on lane) / 2 (does not) */
  PtrMap memo; /* node -> rewritten node (owned) */
  bool fail;
  UOp *vacc;   /* the reduce result's placeholder (k->rplace) when the reduction runs in the lanes: the
                * value after the reduce depends on them through it, so it must vectorize too */
} VR;

static bool dep_lane(VR *v, UOp *u) {
  intptr_t d = (intptr_t)pm_get(&v->dep, (uint64_t)(uintptr_t)u);
  if (d) return d == 1;
  bool r = u == v->lane || (v->vacc && u == v->vacc);
  for (uint32_t i = 0; i < u->nsrc && !r; i++) r = dep_lane(v, u->src[i]);
  pm_put(&v->dep, (uint64_t)(uintptr_t)u, (void *)(intptr_t)(r ? 1 : 2));
  return r;
}

/* index == base + lane with base independent of the lane? returns base (new ref) or NULL */
static UOp *contiguous_base(VR *v, UOp *idx) {
  UOp *z = s_const(0);
  USubst s = {v->lane, z};
  UOp *base = uop_substitute(idx, &s, 1);
  uop_unref(z);
  UOp *chk = s_add(base, v->lane);
  bool ok = chk == idx && !dep_lane(v, base);
  uop_unref(chk);
  if (!ok) {
    uop_unref(base);
    return NULL;
  }
  return base;
}

/* index == base + lane*stride with a constant stride (not 0 or 1) and base independent of the lane?
 * returns base (new ref) and sets *stride, or NULL */
static UOp *strided_base(VR *v, UOp *idx, int64_t *stride) {
  UOp *z = s_const(0), *one = s_const(1);
  USubst s0 = {v->lane, z}, s1 = {v->lane, one};
  UOp *b0 = uop_substitute(idx, &s0, 1), *b1 = uop_substitute(idx, &s1, 1);
  UOp *nb0 = s_mulc(b0, -1), *d = s_add(b1, nb0);
  bool ok = d->op == OP_CONST && d->arg.i != 0 && d->arg.i != 1 && !dep_lane(v, b0);
  if (ok) {
    UOp *ls = s_mulc(v->lane, d->arg.i), *chk = s_add(b0, ls);
    ok = chk == idx;
    uop_unref(ls), uop_unref(chk);
  }
  if (ok) *stride = d->arg.i;
  uop_unref(z), uop_unref(one), uop_unref(b1), uop_unref(nb0), uop_unref(d);
  if (!ok) {
    uop_unref(b0);
    return NULL;
  }
  return b0;
}

/* integer dtypes that load as vectors of their own type (only to be converted to float32) */
static bool vec_int_load_dtype(tg_dtype dt) {
  return dt == TG_UINT8 || dt == TG_INT8 || dt == TG_INT16 || dt == TG_UINT16 || dt == TG_INT32 || dt == TG_UINT32;
}

static bool is_half_dt(int dt) { return dt == TG_FLOAT16 || dt == TG_BFLOAT16; }
/* the float lane dtypes: float32, and with `half` float16/bfloat16 (held in float lanes) */
static bool vflt(const VR *v, int dt) { return dt == TG_FLOAT32 || (v->half && is_half_dt(dt)); }

static bool vec_op_ok(const VR *v, UOp *u) {
  switch (u->op) {
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_FDIV: case OP_NEG: case OP_MAX: case OP_CMPLT: case OP_CMPNE:
  case OP_CMPEQ: case OP_WHERE: case OP_AND: case OP_OR: case OP_XOR: case OP_EXP2: case OP_LOG2: case OP_SIN:
  case OP_SQRT: case OP_RECIP: case OP_TRUNC:
    if (!vflt(v, u->dtype) && u->dtype != TG_BOOL) return false;
    /* integer vectors only exist to be converted: every operand must be a float lane or a mask, and
     * the float operands of one op have one dtype (a float16 op rounds to float16) */
    for (uint32_t i = 0; i < u->nsrc; i++) {
      int sd = u->src[i]->dtype;
      if (!vflt(v, sd) && sd != TG_BOOL) return false;
      if (sd != TG_BOOL && u->dtype != TG_BOOL && sd != u->dtype) return false;
      if (sd != TG_BOOL && i && u->src[0]->dtype != TG_BOOL && sd != u->src[0]->dtype) return false;
    }
    if (is_half_dt(u->dtype) && (u->op == OP_AND || u->op == OP_OR || u->op == OP_XOR)) return false;
    /* mask operands: only the ops the renderer writes as logic on masks */
    if (u->nsrc && u->src[0]->dtype == TG_BOOL && u->op != OP_WHERE)
      return u->op == OP_AND || u->op == OP_OR || u->op == OP_XOR || u->op == OP_NEG || u->op == OP_CMPLT ||
             u->op == OP_CMPNE || u->op == OP_CMPEQ || u->op == OP_MUL || u->op == OP_ADD || u->op == OP_MAX;
    return true;
  case OP_CAST: {
    int sd = u->src[0]->dtype;
    if (vflt(v, u->dtype) && (sd == TG_BOOL || vec_int_load_dtype((tg_dtype)sd))) return true;
    if (u->dtype == TG_BOOL && vflt(v, sd)) return true;
    /* between float lanes: float32 <-> float16/bfloat16 (a rounding, or nothing) */
    return vflt(v, u->dtype) && vflt(v, sd) && (u->dtype == TG_FLOAT32 || sd == TG_FLOAT32 || sd == u->dtype);
  }
  default:
    return false;
  }
}

/* 32-bit integer lanes (random bits: threefry's adds, rotates and xors) vectorize too, as vectors
 * of their own type; they meet float32 only through a bitcast or a conversion. */
static bool vec_i32(int dt) { return dt == TG_INT32 || dt == TG_UINT32; }
static bool vec_int_op_ok(UOp *u) {
  switch (u->op) {
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_NEG: case OP_XOR: case OP_OR: case OP_AND: case OP_SHL: case OP_SHR:
    if (!vec_i32(u->dtype)) return false;
    for (uint32_t i = 0; i < u->nsrc; i++)
      if (u->src[i]->dtype != u->dtype) return false;
    return true;
  case OP_CMPLT: case OP_CMPNE: case OP_CMPEQ:
    return u->dtype == TG_BOOL && vec_i32(u->src[0]->dtype) && u->src[1]->dtype == u->src[0]->dtype;
  case OP_WHERE:
    return vec_i32(u->dtype) && u->src[0]->dtype == TG_BOOL && u->src[1]->dtype == u->dtype && u->src[2]->dtype == u->dtype;
  case OP_BITCAST:
    return (u->dtype == TG_FLOAT32 || vec_i32(u->dtype)) && (u->src[0]->dtype == TG_FLOAT32 || vec_i32(u->src[0]->dtype));
  default:
    return false;
  }
}

static UOp *vr(VR *v, UOp *u) {
  UOp *m = pm_get(&v->memo, (uint64_t)(uintptr_t)u);
  if (m) return uop_ref(m);
  UOp *r = NULL;
  if (v->fail) return NULL;
  if (!dep_lane(v, u) || u == v->vacc) { /* (the accumulator: a vector already) */
    r = uop_ref(u);
  } else if (u->op == OP_LOAD) {
    bool dt_ok = vflt(v, u->dtype) || (!v->gpu && vec_int_load_dtype((tg_dtype)u->dtype));
    bool mask_ok = !(u->nsrc > 2 && dep_lane(v, u->src[2]));
    UOp *base = dt_ok && mask_ok ? contiguous_base(v, u->src[1]) : NULL;
    int64_t stride = 0;
    /* a strided float32 (or, in float16/bfloat16 lanes, half) load becomes a gather: W scalar
     * loads into one vector (a LOAD whose iarg holds the stride), so the rest of the kernel still
     * runs W lanes at a time */
    if (!base && v->gather && mask_ok && (u->dtype == TG_FLOAT32 || (v->half && is_half_dt(u->dtype))))
      base = strided_base(v, u->src[1], &stride);
    if (!base) {
      v->fail = true;
      return NULL;
    }
    UOp *s[3] = {u->src[0], base, u->nsrc > 2 ? u->src[2] : NULL};
    UArg a;
    a.i = v->W;
    r = uop_new(OP_LOAD, (tg_dtype)u->dtype, s, (int)u->nsrc, stride ? &stride : NULL, stride ? 1 : 0, a);
    uop_unref(base);
  } else if (u->op == OP_CAST && vec_i32(u->dtype) && u->src[0]->dtype == DT_INDEX && !v->gpu) {
    /* an index value (an iota: random counters, an arange) base + lane becomes the vector
     * base + {0, 1, ..., W-1}: a CAST marked with W in iarg */
    UOp *base = contiguous_base(v, u->src[0]);
    if (!base) {
      v->fail = true;
      return NULL;
    }
    int64_t w = v->W;
    r = uop_new(OP_CAST, (tg_dtype)u->dtype, &base, 1, &w, 1, u->arg);
    uop_unref(base);
  } else if (u->dtype != DT_INDEX && (vec_op_ok(v, u) || (!v->gpu && vec_int_op_ok(u)))) {
    UOp *s[3] = {NULL, NULL, NULL};
    for (uint32_t i = 0; i < u->nsrc; i++) {
      s[i] = vr(v, u->src[i]);
      if (!s[i]) {
        for (uint32_t j = 0; j < i; j++) uop_unref(s[j]);
        v->fail = true;
        return NULL;
      }
    }
    r = uop_new(u->op, (tg_dtype)u->dtype, s, (int)u->nsrc, u->iarg, (int)u->niarg, u->arg);
    for (uint32_t i = 0; i < u->nsrc; i++) uop_unref(s[i]);
  } else {
    v->fail = true;
    return NULL;
  }
  pm_put(&v->memo, (uint64_t)(uintptr_t)u, r);
  return uop_ref(r);
}

static void vr_free(VR *v) {
  for (size_t i = 0; i < v->memo.cap; i++)
    if (v->memo.keys[i]) uop_unref(v->memo.vals[i]);
  pm_free(&v->memo);
  pm_free(&v->dep);
}

/* a loop of variable length (its end is an expression of a variable): never split, vectorized,
 * unrolled or padded */
static bool sym_range(const UOp *r) { return r && r->nsrc > 0; }
/* a global loop of variable length: on a GPU its work-items past the end skip the body, so no
 * work-group barrier (GROUP) may follow */
static bool sym_global(const LKernel *k) {
  for (int g = 0; g < k->ng; g++)
    if (sym_range(k->granges[g])) return true;
  return false;
}

/* Tries to vectorize global axis g by W lanes. On success updates k (value/sidx/rbody hold the
 * rewritten expressions; sidx holds the store's base offset) and returns true. */
/* float16/bfloat16 lanes: on the CPU, with the C or the LLVM renderer (the OpenCL renderer keeps
 * those kernels scalar) */
static bool half_lanes(const LKernel *k) {
  return !k->gpu && (!k->caps || k->caps->lang == LANG_C || k->caps->lang == LANG_LLVM);
}

static bool try_vectorize_g(LKernel *k, int g, int W, int *next_axis, bool gather) {
  int64_t n = k->granges[g]->iarg[0];
  if (W < 1 || n % W != 0 || n < W || sym_range(k->granges[g])) return false;
  UOp *lane = s_range(LANE_AXIS, W);
  UOp *R = s_range((*next_axis)++, n / W);
  UOp *RW = s_mulc(R, W);
  UOp *e = s_add(RW, lane);
  uop_unref(RW);
  USubst s = {k->granges[g], e};
  UOp *val = uop_substitute(k->value, &s, 1), *sidx = uop_substitute(k->sidx, &s, 1);
  UOp *rb = k->rbody ? uop_substitute(k->rbody, &s, 1) : NULL;
  uop_unref(e);
  VR v;
  memset(&v, 0, sizeof v);
  v.lane = lane;
  v.W = W;
  v.gather = gather;
  v.gpu = k->gpu;
  v.half = half_lanes(k);
  UOp *sbase = contiguous_base(&v, sidx);
  /* a reduction whose body runs in the lanes has vector accumulators: the value after it (reading
   * them through the placeholder) is vectorized, or refused, like any other lane-dependent value
   * (it was left scalar, and a float -> int cast of it rendered as a mask) */
  if (rb && k->rplace && dep_lane(&v, rb)) v.vacc = k->rplace;
  UOp *nval = sbase ? vr(&v, val) : NULL;
  UOp *nrb = (nval && rb) ? vr(&v, rb) : NULL;
  bool ok = sbase && nval && (!rb || nrb) && !v.fail && vflt(&v, k->pdt[0]);
  /* the stored value must be a float lane of the output's dtype (a vector) or independent of the
   * lanes; a combining store (a window max) is float32 only */
  if (ok && (nval->dtype != k->pdt[0] || (k->sop && k->pdt[0] != TG_FLOAT32))) ok = false;
  /* vector accumulators are float32: a reduction of integers (the max of uint8 values) whose body
   * depends on the lanes stays scalar */
  if (ok && rb && dep_lane(&v, rb) && (nrb->dtype != TG_FLOAT32 || k->racc != TG_FLOAT32)) ok = false;
  vr_free(&v);
  if (ok) {
    uop_unref(k->value), uop_unref(k->sidx), uop_unref(k->rbody);
    k->value = nval, k->sidx = sbase, k->rbody = nrb;
    uop_unref(k->granges[g]);
    k->granges[g] = R;
    k->vw = W;
  } else {
    uop_unref(nval), uop_unref(sbase), uop_unref(nrb), uop_unref(R);
  }
  uop_unref(val), uop_unref(sidx), uop_unref(rb), uop_unref(lane);
  return ok;
}

/* Gathers only in elementwise kernels: a reduction is better vectorized along its own axis than fed
 * by a gather in every step -- unless its own axes do not vectorize either (a normalization's
 * backward reading a gradient that arrives in another layout, as a classifier's reshaped input
 * gradient does): then W lanes with one gathered operand still beat scalar code. */
static bool try_vectorize(LKernel *k, int g, int W, int *next_axis) {
  return try_vectorize_g(k, g, W, next_axis, k->rbody == NULL);
}

static void find_vloads(UOp *u, int vw, PtrMap *seen, PtrVec *out) {
  if (!u || pm_has(seen, (uint64_t)(uintptr_t)u)) return;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  if (u->op == OP_LOAD && (vw < 0 || u->arg.i == vw)) pv_push(out, u);
  for (uint32_t i = 0; i < u->nsrc; i++) find_vloads(u->src[i], vw, seen, out);
}

/* Questions about the loads in `body` (those vw wide; vw < 0: every load) and loop variable r: does
 * any of them depend on r, does any one's validity condition (a padded read), or do all of them
 * (and is there at least one)? */
typedef enum { ANY_LOAD, ANY_MASK, ALL_LOADS } LoadQ;
static bool loads_depend(UOp *body, int vw, UOp *r, LoadQ q) {
  PtrMap seen, memo;
  pm_init(&seen), pm_init(&memo);
  PtrVec loads = {0};
  find_vloads(body, vw, &seen, &loads);
  bool all = q == ALL_LOADS, d = all && loads.n > 0;
  for (size_t i = 0; i < loads.n && d == all; i++) {
    UOp *ld = loads.p[i];
    d = q == ANY_MASK ? ld->nsrc > 2 && uop_depends_on_memo(ld->src[2], r, &memo) : uop_depends_on_memo(ld, r, &memo);
  }
  pm_free(&seen), pm_free(&memo), pv_free(&loads);
  return d;
}

/* does `body` load float16 or bfloat16 values? */
static bool has_half_load(UOp *body) {
  PtrMap seen;
  pm_init(&seen);
  PtrVec loads = {0};
  find_vloads(body, -1, &seen, &loads);
  bool h = false;
  for (size_t i = 0; i < loads.n && !h; i++) h = is_half_dt(((UOp *)loads.p[i])->dtype);
  pm_free(&seen), pv_free(&loads);
  return h;
}

/* The bytes of the loads in `body` that depend on global axis g (dep) or do not (!dep): for each, its
 * element size times the sizes of the loops (and its vector lanes) its index moves along -- the part
 * of its buffer the kernel reads. */
static int64_t axis_loads_bytes(const LKernel *k, UOp *body, int g, bool dep) {
  PtrMap seen;
  pm_init(&seen);
  PtrVec loads = {0};
  find_vloads(body, -1, &seen, &loads);
  int64_t total = 0;
  for (size_t i = 0; i < loads.n; i++) {
    UOp *ld = loads.p[i];
    if (uop_depends_on(ld->src[1], k->granges[g]) != dep) continue;
    int64_t b = (int64_t)tg_dtype_itemsize((tg_dtype)ld->dtype) * (ld->arg.i > 1 ? ld->arg.i : 1);
    for (int j = 0; j < k->ng + k->nr; j++) {
      UOp *r = j < k->ng ? k->granges[j] : k->rranges[j - k->ng];
      if (uop_depends_on(ld->src[1], r)) b *= r->iarg[0];
    }
    total += b;
  }
  pm_free(&seen), pv_free(&loads);
  return total;
}
static int64_t axis_load_bytes(const LKernel *k, UOp *body, int g) { return axis_loads_bytes(k, body, g, true); }
static int64_t axis_free_load_bytes(const LKernel *k, UOp *body, int g) { return axis_loads_bytes(k, body, g, false); }

/* A global axis (other than the vector axis vg) along which some gathered (lane-strided) load of
 * the vectorized value is contiguous: its index moves by exactly 1 per step of the axis. -1: none. */
static int gather_contiguous_axis(LKernel *k, int vg) {
  PtrMap seen;
  pm_init(&seen);
  PtrVec loads = {0};
  find_vloads(k->value, k->vw, &seen, &loads);
  int found = -1;
  for (size_t i = 0; i < loads.n && found < 0; i++) {
    UOp *ld = loads.p[i];
    if (ld->niarg != 1 || ld->iarg[0] == 0) continue; /* not a gather */
    for (int g = 0; g < k->ng && found < 0; g++) {
      if (g == vg) continue;
      UOp *r = k->granges[g], *z = s_const(0), *one = s_const(1);
      USubst s0 = {r, z}, s1 = {r, one};
      UOp *b0 = uop_substitute(ld->src[1], &s0, 1), *b1 = uop_substitute(ld->src[1], &s1, 1);
      UOp *nb0 = s_mulc(b0, -1), *d = s_add(b1, nb0);
      if (d->op == OP_CONST && d->arg.i == 1) found = g;
      uop_unref(z), uop_unref(one), uop_unref(b0), uop_unref(b1), uop_unref(nb0), uop_unref(d);
    }
  }
  pm_free(&seen), pv_free(&loads);
  return found;
}

/* Vectorizes reduce axis ri by W lanes: only the reduce body changes (its loads along the axis
 * become W-wide), the accumulators become vectors summed across lanes at the end. */
static bool try_vectorize_reduce(LKernel *k, int ri, int W, int *next_axis) {
  int64_t n = k->rranges[ri]->iarg[0];
  /* a max of float16/bfloat16 values is exact in float32 lanes: its accumulators become float32
   * (the values they hold are all halves, so nothing rounds differently) */
  bool hmax = k->rop == OP_MAX && is_half_dt(k->racc) && half_lanes(k);
  if (!k->rbody || W < 1 || n % W != 0 || n < W || (k->racc != TG_FLOAT32 && !hmax) || (k->rop != OP_ADD && k->rop != OP_MAX) ||
      sym_range(k->rranges[ri]))
    return false;
  UOp *lane = s_range(LANE_AXIS, W);
  UOp *R = s_range((*next_axis)++, n / W);
  UOp *RW = s_mulc(R, W);
  UOp *e = s_add(RW, lane);
  uop_unref(RW);
  USubst s = {k->rranges[ri], e};
  UOp *rb = uop_substitute(k->rbody, &s, 1);
  uop_unref(e);
  VR v;
  memset(&v, 0, sizeof v);
  v.lane = lane;
  v.W = W;
  v.half = half_lanes(k);
  UOp *nrb = vr(&v, rb);
  if (hmax && nrb && !v.fail && nrb->dtype == k->racc) {
    UOp *w = uop_new(OP_CAST, TG_FLOAT32, &nrb, 1, NULL, 0, (UArg){0});
    uop_unref(nrb);
    nrb = w;
  }
  bool ok = nrb && !v.fail && nrb->dtype == TG_FLOAT32 && dep_lane(&v, rb);
  vr_free(&v);
  if (ok) {
    uop_unref(k->rbody);
    k->rbody = nrb;
    uop_unref(k->rranges[ri]);
    k->rranges[ri] = R;
    k->rvw = W;
    if (hmax) k->racc = TG_FLOAT32;
  } else {
    uop_unref(nrb), uop_unref(R);
  }
  uop_unref(rb), uop_unref(lane);
  return ok;
}

typedef struct {
  int axis;   /* index into granges */
  int factor;
} Upcast;

static void make_copies(LKernel *k, const Upcast *ups, int nup, int *next_axis) {
  int total = 1, tile;
  for (int i = 0; i < nup; i++) total *= ups[i].factor;
  tile = total;
  /* a GPU kernel's window positions (take_window): copies too, the slowest-varying, so every copy
   * of the window's first position stores before any other position combines */
  for (int w = 0; w < k->nwr; w++) total *= (int)k->wranges[w]->iarg[0];
  k->ncopy = total;
  k->values = tg_xcalloc((size_t)total, sizeof(UOp *));
  k->sidxs = tg_xcalloc((size_t)total, sizeof(UOp *));
  k->rbodies = tg_xcalloc((size_t)total, sizeof(UOp *));
  k->rplaces = tg_xcalloc((size_t)total, sizeof(UOp *));
  if (k->sop) k->sfirsts = tg_xcalloc((size_t)total, sizeof(UOp *));
  UOp *newr[8];
  for (int i = 0; i < nup; i++) {
    /* PADTO: an axis the factor does not divide runs to the next multiple; positions past its end
     * are clamped to its last one, so the extra copies recompute (and store again) the last
     * element -- no out-of-bounds access and no masks */
    int64_t n = k->granges[ups[i].axis]->iarg[0], f = ups[i].factor;
    newr[i] = s_range((*next_axis)++, (n + f - 1) / f);
  }
  for (int c = 0; c < total; c++) {
    USubst s[13];
    int ns = 0, rem = c % tile, wrem = c / tile;
    for (int i = 0; i < nup; i++) {
      int pos = rem % ups[i].factor;
      rem /= ups[i].factor;
      UOp *m = s_mulc(newr[i], ups[i].factor), *e = s_addc(m, pos);
      s[ns].from = k->granges[ups[i].axis];
      s[ns++].to = s_minc(e, k->granges[ups[i].axis]->iarg[0] - 1);
      uop_unref(m), uop_unref(e);
    }
    for (int w = k->nwr - 1; w >= 0; w--) { /* (the innermost window loop fastest) */
      int64_t n = k->wranges[w]->iarg[0];
      s[ns].from = k->wranges[w];
      s[ns++].to = s_const(wrem % n);
      wrem /= (int)n;
    }
    UOp *ph = NULL;
    if (k->rbody) {
      UArg a;
      a.i = -(c + 1);
      ph = uop_new(OP_NOOP, (tg_dtype)k->racc, NULL, 0, NULL, 0, a);
      s[ns].from = k->rplace;
      s[ns++].to = ph;
    }
    k->values[c] = uop_substitute(k->value, s, ns);
    k->sidxs[c] = uop_substitute(k->sidx, s, ns);
    if (k->sop) k->sfirsts[c] = uop_substitute(k->sfirst, s, ns);
    if (k->rbody) {
      k->rbodies[c] = uop_substitute(k->rbody, s, ns);
      k->rplaces[c] = ph;
    }
    for (int i = 0; i < nup + k->nwr; i++) uop_unref(s[i].to);
  }
  for (int i = 0; i < nup; i++) {
    uop_unref(k->granges[ups[i].axis]);
    k->granges[ups[i].axis] = newr[i];
  }
}

/* LOCAL on a CPU device: the axis runs in tiles, as a work-group's items run inside the loop over
 * work-groups. Global loop g of n iterations (counted after the upcasts) keeps its place as a loop
 * of n/f tiles, and a loop of the f positions inside a tile goes after every global loop. Two
 * LOCALs tile a 2-D iteration space: a transposing copy then finishes a block of rows and columns
 * before it moves on. False when f does not divide the loop (the list does not fit). */
static void subst_in_place(UOp **u, const USubst *s, int n) {
  if (!*u) return;
  UOp *t = uop_substitute(*u, s, n);
  uop_unref(*u);
  *u = t;
}

static bool cpu_tiles(LKernel *k, int *next_axis) {
  int nl = k->nlocal, ng = k->ng;
  for (int i = 0; i < nl; i++) {
    int g = k->local_axis[i];
    if (g >= ng || sym_range(k->granges[g]) || k->local_arg[i] < 2 || k->granges[g]->iarg[0] % k->local_arg[i]) return false;
  }
  /* every tiled loop r becomes O * f + I at once: the outer loops keep r's places, the inner ones
   * follow the global loops */
  USubst s[3];
  k->granges = tg_xrealloc(k->granges, sizeof(UOp *) * (size_t)(ng + nl + 1));
  for (int i = 0; i < nl; i++) {
    int g = k->local_axis[i];
    int64_t f = k->local_arg[i], n = k->granges[g]->iarg[0];
    UOp *O = s_range((*next_axis)++, n / f), *I = s_range((*next_axis)++, f), *Of = s_mulc(O, f);
    s[i].from = k->granges[g], s[i].to = s_add(Of, I);
    uop_unref(Of);
    k->granges[g] = O;
    k->granges[k->ng++] = I;
  }
  UOp **copies[] = {k->values, k->sidxs, k->rbodies, k->sfirsts};
  for (int e = 0; e < 4; e++)
    for (int c = 0; copies[e] && c < k->ncopy; c++) subst_in_place(&copies[e][c], s, nl);
  subst_in_place(&k->value, s, nl), subst_in_place(&k->sidx, s, nl);
  subst_in_place(&k->rbody, s, nl), subst_in_place(&k->sfirst, s, nl);
  for (int i = 0; i < nl; i++) uop_unref(s[i].from), uop_unref(s[i].to);
  k->nlocal = 0;
  return true;
}

/* UNROLL: reduce axis ri runs f steps per iteration -- r = R*f + u for u < f, the body becomes the
 * sum (or max) of its f copies, so the compiler sees f independent loads and FMAs per loop turn. */
static bool try_unroll_reduce(LKernel *k, int ri, int f) {
  if (!k->rbody || ri < 0 || ri >= k->nr || f < 2 || (k->rop != OP_ADD && k->rop != OP_MAX) || sym_range(k->rranges[ri]))
    return false;
  int64_t n = k->rranges[ri]->iarg[0];
  if (n % f != 0 || n / f < 1) return false;
  UOp *R = s_range((int)k->rranges[ri]->arg.i, n / f), *acc = NULL;
  if (R == k->rranges[ri]) { /* the same id and size: n / f == n cannot happen for f >= 2 */
    uop_unref(R);
    return false;
  }
  UOp *Rf = s_mulc(R, f);
  for (int u = 0; u < f; u++) {
    UOp *e = s_addc(Rf, u);
    USubst s = {k->rranges[ri], e};
    UOp *b = uop_substitute(k->rbody, &s, 1);
    uop_unref(e);
    if (!acc) {
      acc = b;
    } else {
      UOp *nx = uop_alu(k->rop, (tg_dtype)k->rbody->dtype, acc, b, NULL);
      uop_unref(acc), uop_unref(b);
      acc = nx;
    }
  }
  uop_unref(Rf);
  uop_unref(k->rbody);
  k->rbody = acc;
  uop_unref(k->rranges[ri]);
  k->rranges[ri] = R;
  return true;
}

/* Moves global axis g to loop position pos (0 = outermost), pos <= g. */
static void swap_outer(LKernel *k, int g, int pos) {
  UOp *t = k->granges[g];
  memmove(&k->granges[pos + 1], &k->granges[pos], sizeof(UOp *) * (size_t)(g - pos));
  k->granges[pos] = t;
}

/* k->opts: the applied list as GPU_OPTS spells it, and what became vector lanes */
static void describe(LKernel *k) {
  optlist_format(&k->applied, k->opts, sizeof k->opts);
  size_t o = strlen(k->opts);
  if (k->tc && k->ncopy && k->tc_frag)
    snprintf(k->opts + o, sizeof k->opts - o, " [tensor core %s, %dx%d tiles per %s]", k->tc->name, k->tc_um, k->tc_un,
             k->tc->wg ? "warpgroup" : "warp");
  if (k->vw || k->rvw)
    snprintf(k->opts + o, sizeof k->opts - o, "%s[%d %slanes]", o ? " " : "", k->vw ? k->vw : k->rvw, k->rvw ? "reduce " : "");
}

static void push_opt(OptList *l, int op, int axis, int arg) {
  if (l->n < OPTLIST_MAX) l->o[l->n++] = (Opt){op, axis, arg};
}

/* May global axis g be upcast by f: f divides it, or (PADTO) the kernel is a reduction -- whose
 * output is a fresh buffer, so the padded copies' repeated stores of the last element are harmless
 * -- and padding adds at most a quarter to the axis. */
static bool pad_ok(const LKernel *k, int g, int f) {
  int64_t n = k->granges[g]->iarg[0];
  if (sym_range(k->granges[g])) return false;
  if (n % f == 0) return true;
  int64_t padded = (n + f - 1) / f * f;
  /* not in a combining store (the clamped copies of a window axis would read and write one output
   * in an order the store's first-position test does not expect) */
  return k->rbody && !k->sop && n > f && (padded - n) * 4 <= n;
}

/* The widest vector (in 4-byte lanes, 4..16) worth using on the kernel's CPU: 16 with AVX-512, 8
 * with AVX2. Wider vectors than the registers split into several instructions each and, in a
 * register tile, spill. Unknown (a GPU-like device run by CPU cores): 16. */
static int cpu_max_lanes(const LKernel *k) {
  int vb = k->caps ? k->caps->vec_bytes : 0;
  int w = vb ? vb / 4 : 16;
  return w < 4 ? 4 : w > 16 ? 16 : w;
}

/* Enough vector registers (32) for the 8-row register tiles; AVX2's 16 hold a 4-row tile. */
static bool cpu_many_regs(const LKernel *k) { return !k->caps || !k->caps->vec_regs || k->caps->vec_regs >= 32; }

/* The number of positions of a GPU kernel's window (take_window's loops), 1 without one. */
static int64_t window_positions(const LKernel *k) {
  int64_t p = 1;
  for (int w = 0; w < k->nwr; w++) p *= k->wranges[w]->iarg[0];
  return p;
}

/* The largest divisor of n from 8 to at most m, or 0 (a tile of a transposing copy's loop). */
static int64_t tile_div(int64_t n, int64_t m) {
  for (int64_t t = m < n ? m : n; t >= 8; t--)
    if (n % t == 0) return t;
  return 0;
}

/* tinygrad's hand-coded heuristics (BEAM=0). */
static void heuristic(LKernel *k, int *next_axis) {
  OptList l = {.n = 0};
  Upcast ups[3] = {{0, 0}};
  int nup = 0;
  int vg = -1, vr = -1;
  const int wmax = cpu_max_lanes(k);
  for (int g = k->ng - 1; g >= 0 && vg < 0; g--)
    for (int W = wmax; W >= 4 && vg < 0; W /= 2)
      if (try_vectorize(k, g, W, next_axis)) vg = g, push_opt(&l, OPT_UPCAST, g, W);
  /* no contiguous output axis: vectorize the innermost reduce axis the loads run along */
  for (int ri = k->nr - 1; vg < 0 && ri >= 0 && vr < 0; ri--)
    for (int W = wmax; W >= 4 && vr < 0; W /= 2)
      if (try_vectorize_reduce(k, ri, W, next_axis)) vr = ri, push_opt(&l, OPT_UNROLL, ri, W);
  /* neither: a reduction whose only obstacle is a strided operand gathers it */
  for (int g = k->ng - 1; k->rbody && g >= 0 && vg < 0 && vr < 0; g--)
    for (int W = wmax; W >= 4 && vg < 0; W /= 2)
      if (try_vectorize_g(k, g, W, next_axis, true)) vg = g, push_opt(&l, OPT_UPCAST, g, W);
  int lanes = k->vw ? k->vw : k->rvw;
  /* does every load move along the vector axis (a column sum's blocks of rows)? */
  bool vg_every_load = vg >= 0 && k->rbody && loads_depend(k->rbody, -1, k->granges[vg], ALL_LOADS);
  if (k->rbody) {
    /* register tile: upcast another global axis, preferring one the vector loads do not depend
     * on (every copy then reuses the same loaded vectors and only its scalar operand differs: rows
     * of A in a matmul, output channels in a convolution), and the vector axis by 2 */
    int best = -1;
    bool best_free = false;
    bool best_masked = false;
    /* where every load moves along the vector axis, another axis's copies would reuse no load, only
     * read more rows at once; the vector axis's copy below reads each row further instead */
    bool stream_only = vg_every_load && lanes;
    /* (a GPU kernel's window positions are its tile already: their copies share every load the
     * window does not move, a convolution's weights -- on a device of CPU cores with 32 vector
     * registers, a window of 4 positions leaves room for 2 copies of another axis, below) */
    bool win_room = k->nwr && k->caps && k->caps->cpu_cores && cpu_many_regs(k) && window_positions(k) <= 4;
    for (int g = 0; g < k->ng && (!k->nwr || win_room); g++) {
      if (g == vg || sym_range(k->granges[g])) continue;
      int64_t n = k->granges[g]->iarg[0];
      bool free_axis = lanes && !loads_depend(k->rbody, lanes, k->granges[g], ANY_LOAD);
      if (stream_only && !free_axis) continue;
      /* a short free axis (a 5-wide kernel window) is upcast whole */
      if (n % 4 != 0 && !(free_axis && !k->rvw && n >= 3 && n <= 8)) continue;
      /* among equally free axes, one that no load's padding condition involves: an upcast axis
       * keeps its masks (BOUNDS cannot narrow a reduce loop by a condition on an unrolled axis),
       * so upcasting the batch of a padded convolution beats upcasting its output rows */
      bool masked = loads_depend(k->rbody, -1, k->granges[g], ANY_MASK);
      if (best < 0 || (free_axis && !best_free) ||
          (free_axis == best_free && ((!masked && best_masked) || (masked == best_masked && n > k->granges[best]->iarg[0]))))
        best = g, best_free = free_axis, best_masked = masked;
    }
    /* nothing divides by 4: PADTO the longest axis that pads by at most a quarter */
    bool padded = best < 0 && !k->nwr && !stream_only;
    for (int g = 0; padded && g < k->ng; g++)
      if (g != vg && k->granges[g]->iarg[0] > 8 && pad_ok(k, g, 4) &&
          (best < 0 || k->granges[g]->iarg[0] > k->granges[best]->iarg[0]))
        best = g;
    padded = padded && best >= 0;
    int f = 1;
    if (best >= 0 && k->rvw) {
      /* lanes run along the reduction: tile two output axes 4x4 so each loaded vector feeds 4 FMAs */
      int second = -1;
      for (int g = 0; g < k->ng; g++)
        if (g != best && !sym_range(k->granges[g]) && k->granges[g]->iarg[0] % 4 == 0 && (second < 0 || k->granges[g]->iarg[0] > k->granges[second]->iarg[0])) second = g;
      f = second < 0 && k->granges[best]->iarg[0] % 8 == 0 && cpu_many_regs(k) ? 8 : 4;
      if (padded) push_opt(&l, OPT_PADTO, best, f);
      ups[nup].axis = best, ups[nup++].factor = f;
      push_opt(&l, OPT_UPCAST, best, f);
      if (second >= 0) {
        /* 16 vector registers (AVX2) hold a 4x2 tile's 8 accumulators and its 6 operand vectors; a
         * 4x4 tile's 16 accumulators spill to the stack, 8 of them loaded and stored again on every
         * step (a 32-row x 384 x 1536 product: 1.68 ms 4x4 against 1.2 ms 4x2 on an AVX2 Zen) */
        int f2 = cpu_many_regs(k) || has_half_load(k->rbody) ? 4 : 2; /* (a float16 operand converted in the
                                                                        * loop: more FMAs per conversion) */
        ups[nup].axis = second, ups[nup++].factor = f2;
        push_opt(&l, OPT_UPCAST, second, f2);
      }
    } else if (best >= 0) {
      int64_t n = k->granges[best]->iarg[0];
      f = win_room ? 2 : padded ? 4 : n % 4 != 0 ? (int)n : n % 8 == 0 && n >= 16 && cpu_many_regs(k) ? 8 : 4;
      if (padded) push_opt(&l, OPT_PADTO, best, f);
      ups[nup].axis = best, ups[nup++].factor = f;
      push_opt(&l, OPT_UPCAST, best, f);
    }
    int vf2 = stream_only ? 4 : 2; /* (four vectors: a longer piece of each row per load stream) */
    if (vg >= 0 && k->granges[vg]->iarg[0] % vf2 == 0 && f * vf2 <= 16 && k->granges[vg]->iarg[0] >= vf2) {
      ups[nup].axis = vg, ups[nup++].factor = vf2;
      push_opt(&l, OPT_UPCAST, vg, vf2);
    }
  }
  /* an elementwise kernel whose vector lanes gather a strided operand (a transposing copy) upcasts
   * the axis that operand is contiguous along: each pass then reads every gathered row at f
   * neighbouring positions -- whole cache lines -- instead of one element per line. The rows of a
   * power-of-two stride all fall into a few cache sets, so a line fetched for one element was
   * evicted long before the next pass came back for its neighbour (2048x2048 transpose: 11.4 ->
   * 3.2 ms). Only when one pass along the vector axis touches more rows than L1 holds lines: a
   * short vector axis (NCHW -> NHWC with 64 channels) already reuses its rows from L1, and the
   * upcast copies only cost there (4.0 -> 7.1 ms). */
  if (!k->rbody && vg >= 0 && k->granges[vg]->iarg[0] * k->vw > 512) {
    int g2 = gather_contiguous_axis(k, vg);
    if (g2 >= 0 && !sym_range(k->granges[g2])) {
      int64_t n = k->granges[g2]->iarg[0];
      /* on the CPU, as many positions as lanes where they divide the axis: the renderers then load
       * the W x W tile's rows as vectors and transpose it in registers (gather_block) */
      int f = !k->gpu && k->vw >= 4 && k->vw <= 16 && n % k->vw == 0 ? k->vw : 8;
      while (f > 1 && n % f) f /= 2;
      if (f >= 4) {
        ups[nup].axis = g2, ups[nup++].factor = f, push_opt(&l, OPT_UPCAST, g2, f);
        /* ...and walks the copy in tiles of about 256 x 256 elements (LOCAL on both axes, see
         * cpu_tiles): inside one, the gathered rows' cache lines are still in L1 when the next
         * pass comes back for their neighbours, and the stores stream along a few output rows
         * (2048x2048 transpose: 5.1 -> 3.3 ms on an AVX2 Zen) */
        int64_t nv = k->granges[vg]->iarg[0], n2 = n / f, tv = tile_div(nv, 256 / k->vw), t2 = tile_div(n2, 256 / f);
        if (!k->gpu && tv && t2 && nv > tv && n2 > t2) { /* (on a GPU device LOCAL means work-groups) */
          k->local_axis[0] = g2, k->local_arg[0] = t2, push_opt(&l, OPT_LOCAL, g2, (int)t2);
          k->local_axis[1] = vg, k->local_arg[1] = tv, push_opt(&l, OPT_LOCAL, vg, (int)tv);
          k->nlocal = 2;
        }
      }
    }
  }
  /* a reduction nothing vectorizes (integer sums, strided loads) unrolls its innermost axis by 4:
   * four loads per loop turn instead of one, and a shorter chain of dependent adds */
  if (k->rbody && vg < 0 && vr < 0 && k->nr > 0) {
    int64_t n = k->rranges[k->nr - 1]->iarg[0];
    if (n % 4 == 0 && n >= 8 && try_unroll_reduce(k, k->nr - 1, 4)) push_opt(&l, OPT_UNROLL, k->nr - 1, 4);
  }
  /* lanes along the reduction (a product of a few rows with a weight read in place): the loop over
   * the operand larger than L2 goes outermost, so that operand streams through once while the small
   * one is read again from cache -- in shape order each block of rows read the whole weight from
   * memory again (float BERT at 2 x 16 tokens, a 384 -> 1536 linear: the 2.4 MB weight 8 times) */
  int big = -1;
  if (k->rbody && vr >= 0 && k->ng >= 2 && !k->sym && k->caps && k->caps->l2_bytes > 0) {
    int64_t l2 = k->caps->l2_bytes, b0 = axis_load_bytes(k, k->rbody, 0), most = l2;
    for (int g = 1; g < k->ng && b0 <= l2 / 2; g++) {
      int64_t bg = sym_range(k->granges[g]) ? 0 : axis_load_bytes(k, k->rbody, g);
      if (bg > most) big = g, most = bg;
    }
  }
  /* A register-tiled product over two global axes (rows, then the vector axis's columns) whose
   * rows' operand is larger than L2: the loop over the columns goes outermost below (so the panel
   * of the other operand stays in cache), and then every column panel streams the whole rows'
   * operand again from L3 or memory. Instead the rows run in tiles (LOCAL, see cpu_tiles) of about
   * half the L2: each tile is multiplied with every panel while it stays in L2, as the packed path
   * (ops.c) blocks its rows -- which a product with a fused epilogue (BERT's linear + gelu, stored
   * in row order) cannot keep, its row blocks merged back into one axis. A 4096 x 384 x 1536
   * product with gelu: 92 -> 72 ms on an AVX2 Zen (the plain product takes 64). */
  int64_t row_bytes = 0; /* the rows' (axis 0's) operand bytes per row, before the upcasts; 0: no tiles */
  const int64_t l2 = k->caps && k->caps->l2_bytes > 0 ? k->caps->l2_bytes : 1 << 20; /* (unknown: 1 MiB, as ops.c) */
  if (k->rbody && vg == 1 && k->ng == 2 && nup > 0 && !k->sym && !vg_every_load && !k->gpu && k->caps &&
      !sym_range(k->granges[0]) && k->granges[0]->iarg[0] > 0)
    row_bytes = axis_load_bytes(k, k->rbody, 0) / k->granges[0]->iarg[0];
  make_copies(k, ups, nup, next_axis);
  bool rows_tiled = false;
  if (row_bytes > 0) {
    int64_t f = 1;
    for (int i = 0; i < nup; i++)
      if (ups[i].axis == 0) f = ups[i].factor;
    int64_t n = k->granges[0]->iarg[0], per = row_bytes * f, t = l2 / 2 / per;
    while (t >= 2 && n % t) t--;
    /* (at least 4 tiles: the threads split the loop over them) */
    if (n * per > l2 && t >= 2 && n / t >= 4) {
      k->local_axis[0] = 0, k->local_arg[0] = (int)t, k->nlocal = 1, rows_tiled = true;
      push_opt(&l, OPT_LOCAL, 0, (int)t);
    }
  }
  if (big > 0 && l.n + big <= OPTLIST_MAX) {
    swap_outer(k, big, 0);
    for (int j = big; j > 0; j--) push_opt(&l, OPT_SWAP, j - 1, j);
  }
  if (k->nlocal) cpu_tiles(k, next_axis); /* (the sizes were checked above) */
  /* for register-tiled reduce kernels, iterate the vector axis outermost: the input panel that
   * varies along it then stays in cache while the other axis streams. Only where some load does
   * not depend on it (the streamed operand): where every load does (the blocks of rows of a
   * column sum), nothing is reused across it, and the outer axes' order keeps the reads moving
   * along rows */
  if (k->rbody && vg > 0 && nup > 0 && !k->sym && !vg_every_load && !rows_tiled) {
    /* ...but inside an outer batch-like axis that every load depends on (the batch groups of a
     * convolution's weight gradient): each of its iterations has its own small working set, and
     * it is the axis the threads split. As actions: SWAPs of neighbours that walk it there. */
    /* (loads that do not depend on it count only if they are larger than a quarter of L1, where the
     * kernel writes more than 8x L2: a small matrix applied to a batch of large panels, the
     * transforms of Winograd's tiles, stays in cache anyway, and with the vector axis outermost each
     * batch's panel was its own stream: 64 read and 64 write streams of 128 bytes per step; smaller
     * outputs keep the order that suits them, a 16-image convolution with one input channel ran
     * 1.4x slower with the batch outermost) */
    int64_t l1 = k->caps && k->caps->l1d_bytes > 0 ? k->caps->l1d_bytes : 32 << 10;
    int64_t out_bytes = (int64_t)k->vw * 4;
    for (int g = 0; g < k->ng; g++) out_bytes *= sym_range(k->granges[g]) ? 1 : k->granges[g]->iarg[0];
    int64_t l2 = k->caps && k->caps->l2_bytes > 0 ? k->caps->l2_bytes : 1 << 20; /* (unknown: 1 MiB, as above) */
    int pos = vg > 1 && (loads_depend(k->rbody, -1, k->granges[0], ALL_LOADS) ||
                         (axis_free_load_bytes(k, k->rbody, 0) <= l1 / 4 && out_bytes > 8 * l2))
                  ? 1
                  : 0;
    if (l.n + vg - pos <= OPTLIST_MAX) {
      swap_outer(k, vg, pos);
      for (int j = vg; j > pos; j--) push_opt(&l, OPT_SWAP, j - 1, j);
    }
  }
  k->applied = l;
  describe(k);
}

/* Moves global loops of one iteration (an axis upcast entirely into registers) behind the others:
 * the threads split the outermost loop, which must not be a trivial one. */
static void trivial_axes_last(LKernel *k) {
  int o = 0;
  UOp *tmp[64];
  if (k->ng > 64) return;
  for (int g = 0; g < k->ng; g++)
    if (k->granges[g]->iarg[0] != 1) tmp[o++] = k->granges[g];
  for (int g = 0; g < k->ng; g++)
    if (k->granges[g]->iarg[0] == 1) tmp[o++] = k->granges[g];
  memcpy(k->granges, tmp, sizeof(UOp *) * (size_t)k->ng);
}

/* a parameter held in a 2-D image (IMAGE): its loads and stores go texel by texel, so the kernel
 * takes the GPU heuristics, never vectors */
static bool has_image_param(const LKernel *k) {
  for (int i = 0; k->pimg && i < k->np; i++)
    if (k->pimg[i]) return true;
  return false;
}

void optimize_kernel(LKernel *k, int *next_axis) {
  k->applied.n = 0;
  k->opts[0] = 0;
  bool noopt = getenv_int("NOOPT", 0) != 0;
  if (k->gpu) {
    /* GPU kernels take the GPU heuristics */
    if (k->force) apply_opts(k, k->force, k->caps, next_axis);
    /* an OpenCL device made of CPU cores (PoCL) runs a work-item's body as the CPU runs one loop
     * iteration: the CPU's choices (vectors along the output or the reduction, register tiles,
     * gathers) fit it better than spreading work over many lanes (beautiful_mnist's step on PoCL:
     * 2.0-2.5 s against 2.8-3.0 s with gpu_heuristic, side by side on a loaded machine) */
    else if (!noopt && k->np > 0 && k->caps->cpu_cores && !has_image_param(k)) heuristic(k, next_axis);
    else if (!noopt && k->np > 0) gpu_heuristic(k, k->caps, next_axis);
    else apply_opts(k, &(OptList){.n = 0}, k->caps, next_axis);
    return; /* axis order is the work-item dimension order: no trivial_axes_last */
  } else if (k->sym && (k->force || noopt || k->np == 0)) make_copies(k, NULL, 0, next_axis);
  /* (a kernel with loops of variable length takes the heuristic, which leaves those loops as they
   * are and vectorizes and tiles the others; BEAM does not search it) */
  else if (k->force) apply_opts(k, k->force, k->caps, next_axis);
  else if (!noopt && k->np > 0) heuristic(k, next_axis);
  else make_copies(k, NULL, 0, next_axis);
  trivial_axes_last(k);
}

/* ---------------------------------------------------------------------------------------------- */
/* Opt lists: text form, and applying one                                                          */

static const char *const OPT_NAMES[OPT_NOPS] = {"UPCAST", "UNROLL", "LOCAL", "GROUP", "GROUPTOP", "PADTO", "SWAP", "NOLOCALS", "THREAD", "TC"};

const char *opt_name(int op) { return op >= 0 && op < OPT_NOPS ? OPT_NAMES[op] : "?"; }

bool optlist_parse(const char *s, OptList *out) {
  OptList l = {.n = 0};
  while (s && *s) {
    while (*s == ' ' || *s == ',') s++;
    if (!*s) break;
    size_t n = strcspn(s, ":, ");
    int op = -1;
    for (int i = 0; i < OPT_NOPS; i++)
      if (strlen(OPT_NAMES[i]) == n && strncmp(OPT_NAMES[i], s, n) == 0) op = i;
    if (op < 0 || l.n == OPTLIST_MAX) return false;
    s += n;
    int axis = 0, arg = 0, used = 0;
    if (op != OPT_NOLOCALS) {
      if (sscanf(s, ":%d:%d%n", &axis, &arg, &used) != 2 || axis < 0 || axis > 64 || arg < 0 || arg > 65536) return false;
      s += used;
    }
    l.o[l.n++] = (Opt){op, axis, arg};
    if (*s && *s != ',' && *s != ' ') return false;
  }
  *out = l;
  return true;
}

void optlist_format(const OptList *l, char *buf, size_t n) {
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < l->n && o < n; i++) {
    const Opt *p = &l->o[i];
    int w = p->op == OPT_NOLOCALS ? snprintf(buf + o, n - o, "%s%s", i ? "," : "", opt_name(p->op))
                                  : snprintf(buf + o, n - o, "%s%s:%d:%d", i ? "," : "", opt_name(p->op), p->axis, p->arg);
    if (w < 0) break;
    o += (size_t)w;
  }
}

/* IMAGE: the texel lanes of an image output as the first upcast (see image_lane_upcast) */
static void img_lanes(LKernel *k, UOp *lane, Upcast *ups, int *nup) {
  ImgUpcast iu[3];
  for (int j = 0; j < *nup; j++) iu[j] = (ImgUpcast){ups[j].axis, ups[j].factor};
  image_lane_upcast(k, lane, iu, nup, 3);
  for (int j = 0; j < *nup; j++) ups[j].axis = iu[j].axis, ups[j].factor = iu[j].factor;
}

/* Vector lanes come from the first UPCAST or UNROLL by 4, 8 or 16 that can make them, while the
 * kernel has none: in a language with vector types (C and LLVM IR on the CPU, OpenCL C), not for
 * image parameters (texel by texel) and not after a GROUP (scalar accumulators). */
static bool lanes_possible(const LKernel *k, const DeviceCaps *caps, int f) {
  if (k->vw || k->rvw || k->group || has_image_param(k) || (f != 4 && f != 8 && f != 16)) return false;
  return !k->gpu || (caps && caps->lang == LANG_OPENCL);
}

/* UPCAST(g, f) as f lanes along g: the output contiguous there (try_vectorize), or in a reduction
 * a gathered strided operand (the heuristics' last resort) -- on the CPU and on OpenCL devices
 * made of CPU cores, whose heuristics are the CPU's, and not when a GROUP follows in the list
 * (scalar accumulators: the UPCAST stays a register tile then). */
static bool vector_upcast(LKernel *k, const DeviceCaps *caps, int g, int f, bool group_follows, int *next_axis) {
  if (!lanes_possible(k, caps, f) || g >= k->ng) return false;
  return try_vectorize(k, g, f, next_axis) ||
         (k->rbody && (!k->gpu || caps->cpu_cores) && !group_follows && try_vectorize_g(k, g, f, next_axis, true));
}

static bool group_after(const OptList *l, int i) {
  for (int j = i + 1; j < l->n; j++)
    if (l->o[j].op == OPT_GROUP || l->o[j].op == OPT_GROUPTOP) return true;
  return false;
}

/* UNROLL(r, f) as f lanes along reduce axis r, with vector accumulators (the same devices) */
static bool vector_unroll(LKernel *k, const DeviceCaps *caps, int r, int f, int *next_axis) {
  if (!lanes_possible(k, caps, f) || r >= k->nr || (k->gpu && !caps->cpu_cores)) return false;
  return try_vectorize_reduce(k, r, f, next_axis);
}

/* Applies l->o[from..] in order (l->o[..from] were applied by the caller). UPCASTs are collected
 * and made into copies at the end (axis numbers stay the lowered kernel's) -- except one that
 * becomes vector lanes (vector_upcast), at once; UNROLL applies at once; SWAP renumbers the
 * collected UPCASTs, PADTOs and LOCALs that name its axes. Limits come from the device: a GROUP's
 * size must fit a work-group and its partials the local memory. */
static void apply_from(LKernel *k, const OptList *l, int from, const DeviceCaps *caps, int *next_axis) {
  Upcast ups[3], pads[3];
  int nup = 0, npad = 0;
  bool ok = true;
  UOp *lane = k->gpu && k->pimg && k->np && k->pimg[0] && k->ng ? k->granges[k->ng - 1] : NULL;
  k->applied = *l;
  for (int i = from; i < l->n && ok; i++) {
    const Opt *o = &l->o[i];
    /* a tensor-core kernel takes more tiles per warp, nothing else (tc.c) */
    if (k->tc) {
      ok = o->op == OPT_UPCAST && o->axis < k->ng && tc_upcast(k, o->axis, o->arg);
      continue;
    }
    switch (o->op) {
    case OPT_TC:
      ok = i == 0 && tc_apply(k, o->axis, o->arg, caps, next_axis);
      break;
    case OPT_UPCAST: {
      if (vector_upcast(k, caps, o->axis, o->arg, group_after(l, i), next_axis)) break;
      ok = nup < 3 && o->axis < k->ng && o->arg > 1 && !sym_range(k->granges[o->axis]);
      bool padded = false;
      for (int j = 0; ok && j < npad; j++) padded = padded || (pads[j].axis == o->axis && pads[j].factor == o->arg);
      ok = ok && (k->granges[o->axis]->iarg[0] % o->arg == 0 || padded);
      for (int j = 0; ok && j < nup; j++) ok = ups[j].axis != o->axis;
      if (ok) ups[nup].axis = o->axis, ups[nup++].factor = o->arg;
      break;
    }
    case OPT_UNROLL:
      if (vector_unroll(k, caps, o->axis, o->arg, next_axis)) break;
      ok = try_unroll_reduce(k, o->axis, o->arg);
      break;
    case OPT_PADTO: /* (before the UPCAST it is for; reductions only, see pad_ok) */
      ok = npad < 3 && o->axis < k->ng && o->arg > 1 && pad_ok(k, o->axis, o->arg);
      for (int j = 0; ok && j < nup; j++) ok = ups[j].axis != o->axis;
      if (ok) pads[npad].axis = o->axis, pads[npad++].factor = o->arg;
      break;
    case OPT_THREAD: /* the CPU device splits the outermost loop */
      ok = !k->gpu && o->axis == 0 && o->arg >= 1 && !k->threads;
      if (ok) k->threads = o->arg;
      break;
    case OPT_LOCAL: /* (on a CPU device: tiles, see cpu_tiles; the upcasts' copies come first) */
      ok = !k->nolocals && k->nlocal < 3 && o->axis < k->ng && o->arg >= 1 &&
           (!k->gpu || (k->granges[o->axis]->iarg[0] % o->arg == 0 && !sym_range(k->granges[o->axis])));
      for (int j = 0; ok && j < k->nlocal; j++) ok = k->local_axis[j] != o->axis;
      if (ok) k->local_axis[k->nlocal] = o->axis, k->local_arg[k->nlocal++] = o->arg;
      break;
    case OPT_GROUP: case OPT_GROUPTOP: /* (scalar accumulators: not after vector lanes) */
      ok = k->gpu && !k->nolocals && !k->group && !k->vw && !k->rvw && k->rbody && !k->sop && o->axis < k->nr && o->arg >= 2 &&
           o->arg <= caps->max_local_dims[0] && o->arg <= caps->max_local && !sym_global(k);
      if (ok) k->group = o->arg, k->group_axis = o->axis, k->group_top = o->op == OPT_GROUPTOP;
      break;
    case OPT_SWAP:
      ok = o->axis < k->ng && o->arg >= 0 && o->arg < k->ng && o->arg != o->axis;
      if (ok) {
        UOp *t = k->granges[o->axis];
        k->granges[o->axis] = k->granges[o->arg];
        k->granges[o->arg] = t;
#define SWAPPED(x) ((x) == o->axis ? o->arg : (x) == o->arg ? o->axis : (x))
        for (int j = 0; j < k->nlocal; j++) k->local_axis[j] = SWAPPED(k->local_axis[j]);
        for (int j = 0; j < nup; j++) ups[j].axis = SWAPPED(ups[j].axis);
        for (int j = 0; j < npad; j++) pads[j].axis = SWAPPED(pads[j].axis);
#undef SWAPPED
      }
      break;
    case OPT_NOLOCALS:
      ok = k->gpu && !k->nlocal && !k->group;
      k->nolocals = true;
      break;
    default: ok = false; break;
    }
  }
  if (ok && lane) img_lanes(k, lane, ups, &nup);
  /* the partials of every copy of every work-item of a group live in local memory together */
  if (ok && k->group) {
    int64_t items = k->group, copies = 1;
    for (int j = 0; j < k->nlocal; j++) items *= k->local_arg[j];
    for (int j = 0; j < nup; j++) copies *= ups[j].factor;
    tg_dtype at = k->racc == TG_FLOAT16 || k->racc == TG_BFLOAT16 ? TG_FLOAT32 : k->racc;
    ok = items <= caps->max_local && items * copies * (int64_t)tg_dtype_itemsize(at) <= caps->local_mem;
  }
  if (!ok) {
    k->opts_failed = true;
    nup = 0;
    if (lane) img_lanes(k, lane, ups, &nup);
  }
  if (ok && k->tc) tc_make_copies(k, next_axis);
  else make_copies(k, ups, nup, next_axis);
  if (ok && !k->gpu && k->nlocal && !cpu_tiles(k, next_axis)) k->opts_failed = true;
  describe(k);
}

void apply_opts(LKernel *k, const OptList *l, const DeviceCaps *caps, int *next_axis) { apply_from(k, l, 0, caps, next_axis); }

/* Hand-coded GPU choices: a reduction with few outputs and a long reduce axis spreads that axis
 * over a work-group (GROUP, strided so neighbouring work-items read neighbouring elements).
 * Otherwise, where the language has vectors, the innermost axis the output is contiguous along
 * becomes a vector (UPCAST by 16, 8 or 4), and a reduction with many outputs gets a register tile
 * as the CPU's kernels do: another axis upcast by 8 (or 4), preferring one the vector loads do not
 * depend on (each loaded vector then feeds every copy), and the vector axis by 2. Work-groups are
 * left to the driver then: each work-item is already a vector loop body (PoCL runs a work-group's
 * items as a loop; it vectorizes across them only where the body has no loop, so a reduction's
 * lanes must be explicit). Without a vector, a register tile of 8 x 4 outputs over the two
 * innermost axes and work-groups of 16 along the innermost. */
void gpu_heuristic(LKernel *k, const DeviceCaps *caps, int *next_axis) {
  OptList l = {.n = 0};
  /* a matmul-like kernel on a CUDA device with tensor cores (sm_80 and up, the arch known) runs on
   * them; a large one takes 2 x 2 tiles per warp, so each fragment loaded feeds two instructions */
  int tci, tcarg;
  if (caps->lang == LANG_CUDA && caps->sm >= 80 && tc_apply_heuristic(k, caps, next_axis, &tci, &tcarg)) {
    push_opt(&l, OPT_TC, tci, tcarg);
    int64_t M = k->granges[k->tc_gm]->iarg[0], N = k->granges[k->tc_gn]->iarg[0];
    if (k->tc->wg) {
      /* a warpgroup instruction: as many column tiles as divide N, up to 128 columns (64 accumulators
       * a lane), and 128 rows of a large M */
      int f = 1;
      while (k->tc->n * f * 2 <= 128 && N % (k->tc->n * f * 2) == 0) f *= 2;
      if (f > 1) push_opt(&l, OPT_UPCAST, k->tc_gn, f);
      if (M >= 256 && M % (2 * k->tc->m) == 0) push_opt(&l, OPT_UPCAST, k->tc_gm, 2);
    } else {
      if (M >= 256 && M % (2 * k->tc->m) == 0) push_opt(&l, OPT_UPCAST, k->tc_gm, 2);
      if (N >= 256 && N % (2 * k->tc->n) == 0) push_opt(&l, OPT_UPCAST, k->tc_gn, 2);
    }
    apply_from(k, &l, 1, caps, next_axis);
    return;
  }
  if (k->rbody && !k->sop && k->nr > 0) {
    int64_t outs = 1;
    for (int g = 0; g < k->ng; g++) outs *= k->granges[g]->iarg[0];
    int ri = k->nr - 1;
    int64_t n = k->rranges[ri]->iarg[0];
    int64_t G = n >= 1024 ? 256 : n >= 256 ? 64 : n >= 64 ? 16 : 0;
    while (G >= 2 && (G > caps->max_local_dims[0] || G > caps->max_local || G * 8 > caps->local_mem)) G /= 2;
    if (outs <= 4096 && G >= 2 && !sym_global(k) && !sym_range(k->rranges[ri])) l.o[l.n++] = (Opt){OPT_GROUP, ri, (int)G};
  }
  int vg = -1, applied = 0; /* the vector UPCAST is applied here (it tells which axes are free) */
  for (int g = k->ng - 1; l.n == 0 && g >= 0 && vg < 0; g--)
    for (int W = 16; W >= 4 && vg < 0; W /= 2)
      if (vector_upcast(k, caps, g, W, false, next_axis)) vg = g, l.o[l.n++] = (Opt){OPT_UPCAST, g, W}, applied = 1;
  if (vg >= 0 && k->rbody) {
    int best = -1;
    bool best_free = false;
    for (int g = 0; g < k->ng && !k->nwr; g++) { /* (window positions: the tile already) */
      int64_t n = k->granges[g]->iarg[0];
      if (g == vg || n % 4) continue;
      bool free_axis = !loads_depend(k->rbody, k->vw, k->granges[g], ANY_LOAD);
      if (best < 0 || (free_axis && !best_free) || (free_axis == best_free && n > k->granges[best]->iarg[0])) best = g, best_free = free_axis;
    }
    if (best >= 0) {
      int64_t n = k->granges[best]->iarg[0];
      l.o[l.n++] = (Opt){OPT_UPCAST, best, n % 8 == 0 && n >= 16 ? 8 : 4};
    }
    if (k->granges[vg]->iarg[0] % 2 == 0 && k->granges[vg]->iarg[0] >= 2 && l.n < OPTLIST_MAX) l.o[l.n++] = (Opt){OPT_UPCAST, vg, 2};
  }
  /* a reduction with many outputs and no vector: a register tile of 8 x 4 outputs per work-item
   * over the two innermost global axes (4 x 4, or one axis, where they do not divide), and
   * work-groups of 16 along the innermost */
  if (l.n == 0 && k->rbody && !k->sop && k->ng >= 1) {
    int a1 = k->ng - 1, a0 = k->ng - 2;
    int64_t n1 = k->granges[a1]->iarg[0], n0 = a0 >= 0 ? k->granges[a0]->iarg[0] : 0;
    int f0 = a0 >= 0 && n0 % 8 == 0 && n0 >= 16 ? 8 : a0 >= 0 && n0 % 4 == 0 && n0 >= 8 ? 4 : 1;
    int f1 = n1 % 4 == 0 && n1 >= 8 ? 4 : 1;
    if (a0 >= 0 && sym_range(k->granges[a0])) f0 = 1; /* (loops of variable length are left whole) */
    if (sym_range(k->granges[a1])) f1 = 1;
    if (f0 > 1) l.o[l.n++] = (Opt){OPT_UPCAST, a0, f0};
    if (f1 > 1) l.o[l.n++] = (Opt){OPT_UPCAST, a1, f1};
    if (f1 > 1 && (n1 / f1) % 16 == 0 && caps->max_local >= 16 && caps->max_local_dims[0] >= 16)
      l.o[l.n++] = (Opt){OPT_LOCAL, a1, 16};
  }
  apply_from(k, &l, applied, caps, next_axis);
}
