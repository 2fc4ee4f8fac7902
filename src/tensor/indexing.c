/*
 * indexing.c -- Python-style indexing (getitem / setitem), the padding modes (reflect, replicate,
 * circular), and the remaining movement / indexing ops of tinygrad's Tensor: repeat_interleave,
 * unfold, unflatten, diag, diagonal, roll, rearrange, masked_fill, masked_select, nonzero, scatter,
 * scatter_reduce, contiguous_backward and the size queries.
 *
 * In: handles and arguments from the user. Out: new handles in the caller's scope (or none + an error
 * naming the function, the shapes/values and a hint); tg_setitem updates its target's handle with a
 * lazy assign, as tg_assign does. Every op is a composition of the public primitive ops, so it is
 * lazy, fuses with its neighbours and autograd differentiates it with the per-primitive rules. Basic
 * indexing (ints, slices with any step, None, ellipsis) is pure movement: shrink, flip, pad + reshape
 * + shrink for steps, reshape; no data is copied. Only masked_select and nonzero compute data now
 * (their output size depends on it); they realize the mask and build the result from its indices.
 *
 * Pattern (as nnops.c): validate every argument first, so errors name the function the user called,
 * then compose inside a private scope and move only the result out (done()).
 *
 * Where we differ from tinygrad's construction, and why:
 *  - Tensor (advanced) indices of getitem gather with the fused data-dependent load of tg_index
 *    instead of one-hot masks summed over the indexed dims: the indexed dims are permuted to the
 *    front and linearized (tinygrad does that for consecutive indices too), so any number of index
 *    tensors is one gather. Values, out-of-range-reads-zero, result placement and gradients are the
 *    same.
 *  - "The last write wins" in scatter / advanced setitem is a max-reduce of the winning position over
 *    the one-hot mask instead of tinygrad's chain of where()s (one per index position), so the graph
 *    size does not grow with the index.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compose.h"

#define NONE ((tg_tensor){0})
#define MAXD 64

int norm_axis(const char *fn, int axis, int ndim, int *out); /* ops.c */

#define fail op_fail
#define begin op_scope_begin
#define done op_scope_done
#define cdiv ceil_div
typedef OpScope Op_;

static int64_t round_up(int64_t a, int64_t b) { return cdiv(a, b) * b; }

static bool same_device(const char *fn, UOp *a, UOp *b, const char *what) {
  if (a->device == b->device) return true;
  tg_set_error(TG_ERR_INVALID, "%s: %s is on %s but the input is on %s; move it with tg_to", fn, what,
               device_by_id(b->device)->name, device_by_id(a->device)->name);
  return false;
}

/* Broadcast of shapes a and b into out (returns ndim), or -1 (no error recorded). */
static int bcast(const int64_t *a, int na, const int64_t *b, int nb, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int ia = i - (n - na), ib = i - (n - nb);
    int64_t x = ia >= 0 ? a[ia] : 1, y = ib >= 0 ? b[ib] : 1;
    if (x != y && x != 1 && y != 1) return -1;
    out[i] = x == 1 ? y : x;
  }
  return n;
}

/* Can shape s (ns dims) broadcast to shape t (nt dims)? */
static bool bcast_to_ok(const int64_t *s, int ns, const int64_t *t, int nt) {
  if (ns > nt) return false;
  for (int i = 0; i < ns; i++) {
    int64_t x = s[ns - 1 - i], y = t[nt - 1 - i];
    if (x != y && x != 1) return false;
  }
  return true;
}

static int64_t numel_of(const int64_t *s, int n) { return shape_numel(s, n); }

/* The node of a handle created inside a composition (borrowed), or NULL if an inner op failed (its
 * error is already recorded; callers then bail out and done() reports it). */
static UOp *U(tg_tensor t) { return tg_valid(t) ? t_get(t, "internal") : NULL; }

/* 1-D int64 arange(n) on a's device, reshaped so that it lies along axis `ax` of an nd-dim shape. */
static tg_tensor arange_along(UOp *a, int64_t n, int ax, int nd) {
  tg_opts o = on_device(a, TG_INT64);
  tg_tensor r = tg_arange(0, (double)n, 1, &o);
  int64_t sh[MAXD];
  for (int i = 0; i < nd; i++) sh[i] = i == ax ? n : 1;
  return tg_reshape(r, sh, nd);
}

/* A zero-filled tensor of `shape` built from x, which has no elements (so it stays on the graph:
 * its gradient is the empty gradient of x). */
static tg_tensor zeros_from_empty(tg_tensor x, const int64_t *shape, int nd) {
  int64_t z = 0, n = numel_of(shape, nd);
  tg_tensor f = tg_reshape(x, &z, 1);
  f = tg_pad(f, (const int64_t[]){0, n}, 2, 0.0);
  return tg_reshape(f, shape, nd);
}

/* ---------------------------------------------------------------------------------------------- */
/* getitem / setitem: parsing                                                                      */

enum { E_VIEW, E_NEW, E_TENSOR };

typedef struct {
  int kind;
  bool collapse;          /* an int index: the dim disappears */
  int64_t size;           /* size of the entry in the view (1 for ints and new axes) */
  int64_t b0, b1, stride; /* selected range [b0, b1) of x's dim and the step (tensor entries: all, 1) */
  int xdim;               /* dim of x the entry consumes (-1 for a new axis) */
  tg_tensor t;            /* tensor entries: the user's index (borrowed) */
} Entry;

typedef struct {
  Entry *e;
  int n;           /* entries after the ellipsis is expanded */
  int nd;          /* x's ndim */
  int64_t X[MAXD]; /* view shape: entries that are not collapsed (new axes are 1) */
  int nX;
  int tpos[MAXD]; /* positions in X of the tensor entries */
  int nt;
  int64_t B[MAXD]; /* broadcast shape of the index tensors */
  int nB;
  bool front;      /* tensor dims are not adjacent: the broadcast dims go first */
  int64_t R[MAXD]; /* result shape */
  int nR;
  bool baked;      /* a position was computed from a symbolic dim's bound value (x[-3:] of a dim of n) */
} Index;

static void index_free(Index *ix) {
  free(ix->e);
  ix->e = NULL;
}

/* Python's slice.indices(size) followed by tinygrad's boundary rule; the boundary is tightened to
 * the elements the step actually selects (so a strided setitem never reaches past them). */
static void parse_slice(const tg_index_spec *s, int64_t size, Entry *e) {
  int64_t step = s->step ? s->step : 1;
  int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? size : size - 1;
  int64_t start, stop;
  if (!s->has_start) {
    start = step < 0 ? upper : lower;
  } else {
    start = s->start;
    if (start < 0) {
      start = start < -size ? lower : start + size;
      if (start < lower) start = lower;
    } else if (start > upper) {
      start = upper;
    }
  }
  if (!s->has_stop) {
    stop = step < 0 ? lower : upper;
  } else {
    stop = s->stop;
    if (stop < 0) {
      stop = stop < -size ? lower : stop + size;
      if (stop < lower) stop = lower;
    } else if (stop > upper) {
      stop = upper;
    }
  }
  int64_t b0, b1;
  if ((step > 0 && stop < start) || (step < 0 && stop > start))
    b0 = b1 = 0;
  else if (step < 0)
    b0 = stop + 1, b1 = start + 1;
  else
    b0 = start, b1 = stop;
  uint64_t ast = step > 0 ? (uint64_t)step : (uint64_t)0 - (uint64_t)step;
  int64_t diff = b1 - b0;
  int64_t count = diff <= 0 ? 0 : (int64_t)(((uint64_t)diff - 1) / ast + 1);
  int64_t span = count ? (int64_t)((uint64_t)(count - 1) * ast) + 1 : 0; /* <= diff: no overflow */
  if (step > 0)
    b1 = b0 + span;
  else
    b0 = b1 - span;
  if (count <= 1) step = step > 0 ? 1 : -1; /* one element or none: the step does not matter */
  e->kind = E_VIEW;
  e->collapse = false;
  e->size = count;
  e->b0 = b0, e->b1 = b1, e->stride = step;
}

/* Positions counted from the end of a symbolic dim (size v + c) as symbolic positions v + c + k, so
 * that they hold for every value of v: x[-1] and x[-3:] / x[-3:-1] (step 1) of a dim that holds them
 * at its bound value (no clamping: the size is the same constant for every v). Sets e's range to
 * the codes and returns true; false leaves e as parse_slice or the int case made it. Only getitem
 * takes them (setitem computes pads from the positions). */
static bool sym_tail_range(UOp *a, int d, int64_t k0, int64_t k1, Entry *e) {
  if (!a->sym || !sym_is_code(a->sym[d]) || k0 >= k1 || k1 > 0 || k0 < -a->shape[d]) return false;
  int64_t off;
  tg_symvar v = tg_sym_variable(a->sym[d], &off);
  int64_t b0 = tg_sym(v, off + k0), b1 = k1 == 0 ? a->sym[d] : tg_sym(v, off + k1);
  if (b0 == TG_SYM_NONE || b1 == TG_SYM_NONE) return false;
  e->b0 = b0, e->b1 = b1, e->size = k1 - k0, e->stride = 1;
  return true;
}

static int parse_index(const char *fn, UOp *a, const tg_index_spec *spec, int n, bool sym_pos, Index *ix) {
  memset(ix, 0, sizeof *ix);
  ix->nd = a->ndim;
  if (n < 0 || (n > 0 && !spec))
    return tg_set_error(TG_ERR_INVALID, "%s: spec is %s with n=%d", fn, spec ? "set" : "NULL", n), -1;
  int nell = 0, nreal = 0;
  for (int i = 0; i < n; i++) {
    switch (spec[i].kind) {
    case TG_INDEX_ELLIPSIS:
      nell++;
      break;
    case TG_INDEX_NEWAXIS:
      break;
    case TG_INDEX_SLICE:
    case TG_INDEX_INT:
      /* a symbolic size (tg_sym) is a movement op's argument only: here it read as a huge negative
       * index (x[:, 0:sp+1] came out empty, x[:, sp:sp+1] = 5 wrote nothing) */
      if ((spec[i].kind == TG_INDEX_INT && sym_is_code(spec[i].index)) ||
          (spec[i].kind == TG_INDEX_SLICE && ((spec[i].has_start && sym_is_code(spec[i].start)) ||
                                              (spec[i].has_stop && sym_is_code(spec[i].stop)) || sym_is_code(spec[i].step))))
        return tg_set_error(TG_ERR_INVALID,
                            "%s: entry %d holds a symbolic size (tg_sym); index with it through tg_shrink (and write "
                            "with tg_assign into the shrink)", fn, i),
               -1;
      nreal++;
      break;
    case TG_INDEX_TENSOR:
      nreal++;
      break;
    default:
      return tg_set_error(TG_ERR_INVALID, "%s: entry %d has unknown kind %d (expected a TG_INDEX_* value)",
                          fn, i, (int)spec[i].kind),
             -1;
    }
  }
  if (nell > 1)
    return tg_set_error(TG_ERR_INVALID, "%s: an index can have only one ellipsis (found %d)", fn, nell), -1;
  if (nreal > a->ndim)
    return tg_set_error(TG_ERR_INVALID, "%s: too many indices (%d) for a %d-d tensor of shape %s", fn, nreal,
                        a->ndim, SHP(a)),
           -1;
  int fill = a->ndim - nreal;
  ix->e = tg_xcalloc((size_t)(n + fill + 1), sizeof(Entry));
  int d = 0;
  static const tg_index_spec full = {0};
  for (int i = 0; i <= n; i++) {
    bool at_ell = i < n && spec[i].kind == TG_INDEX_ELLIPSIS;
    if (at_ell || (i == n && nell == 0)) {
      for (int k = 0; k < fill; k++) {
        Entry *e = &ix->e[ix->n++];
        parse_slice(&full, a->shape[d], e);
        e->xdim = d++;
      }
    }
    if (i == n || at_ell) continue;
    const tg_index_spec *s = &spec[i];
    Entry *e = &ix->e[ix->n++];
    switch (s->kind) {
    case TG_INDEX_NEWAXIS:
      e->kind = E_NEW, e->size = 1, e->b0 = 0, e->b1 = 1, e->stride = 1, e->xdim = -1;
      break;
    case TG_INDEX_INT: {
      int64_t size = a->shape[d], v = s->index;
      if (v < -size || v >= size)
        return index_free(ix),
               tg_set_error(
                   TG_ERR_INVALID,
                   "%s: index %lld is out of range for dim %d of size %lld (shape %s); valid indices are "
                   "%lld..%lld",
                   fn, (long long)v, d, (long long)size, SHP(a), (long long)-size, (long long)size - 1),
               -1;
      if (v < 0) v += size;
      e->kind = E_VIEW, e->collapse = true, e->size = 1, e->b0 = v, e->b1 = v + 1, e->stride = 1;
      if (s->index < 0 && a->sym && sym_is_code(a->sym[d]) && !(sym_pos && sym_tail_range(a, d, s->index, s->index + 1, e)))
        ix->baked = true;
      e->xdim = d++;
      break;
    }
    case TG_INDEX_SLICE:
      parse_slice(s, a->shape[d], e);
      /* from the end, backwards, or clamped to the size: the positions hold for the bound value only */
      if (a->sym && sym_is_code(a->sym[d]) &&
          ((s->has_start && (s->start < 0 || s->start > a->shape[d])) || (s->has_stop && (s->stop < 0 || s->stop > a->shape[d])) ||
           s->step < 0) &&
          !(sym_pos && (s->step == 0 || s->step == 1) && s->has_start && s->start < 0 && (!s->has_stop || s->stop < 0) &&
            sym_tail_range(a, d, s->start, s->has_stop ? s->stop : 0, e)))
        ix->baked = true;
      e->xdim = d++;
      break;
    case TG_INDEX_TENSOR: {
      UOp *t = t_get(s->tensor, fn);
      if (!t) return index_free(ix), -1;
      if (!tg_dtype_is_int((tg_dtype)t->dtype))
        return index_free(ix),
               tg_set_error(
                   TG_ERR_INVALID,
                   "%s: index tensor (entry %d) has dtype %s; use an integer tensor (for a bool mask use "
                   "tg_masked_select or tg_nonzero)",
                   fn, i, tg_dtype_name((tg_dtype)t->dtype)),
               -1;
      if (!same_device(fn, a, t, "an index tensor")) return index_free(ix), -1;
      e->kind = E_TENSOR, e->size = a->shape[d], e->b0 = 0, e->b1 = a->shape[d], e->stride = 1,
      e->t = s->tensor;
      /* negative positions wrap, and positions past the end read 0, by the dim's bound value */
      if (a->sym && sym_is_code(a->sym[d])) ix->baked = true;
      e->xdim = d++;
      break;
    }
    default:
      break;
    }
  }
  /* view shape, tensor positions, broadcast shape, result shape */
  for (int i = 0; i < ix->n; i++) {
    Entry *e = &ix->e[i];
    if (e->collapse) continue;
    if (ix->nX >= MAXD)
      return index_free(ix),
             tg_set_error(TG_ERR_INVALID, "%s: the result would have more than %d dims", fn, MAXD), -1;
    if (e->kind == E_TENSOR) {
      UOp *t = t_get(e->t, fn);
      int64_t nbs[MAXD];
      int nb = bcast(ix->B, ix->nB, t->shape, t->ndim, nbs);
      if (nb >= 0) memcpy(ix->B, nbs, sizeof(int64_t) * (size_t)nb);
      if (nb < 0) {
        char s1[256];
        fmt_shape(s1, sizeof s1, ix->B, ix->nB);
        return index_free(ix),
               tg_set_error(TG_ERR_INVALID, "%s: index tensors of shapes %s and %s cannot broadcast together",
                            fn, s1, SHP(t)),
               -1;
      }
      ix->nB = nb;
      ix->tpos[ix->nt++] = ix->nX;
    }
    ix->X[ix->nX++] = e->size;
  }
  if (ix->nt == 0) {
    memcpy(ix->R, ix->X, sizeof(int64_t) * (size_t)ix->nX);
    ix->nR = ix->nX;
    return 0;
  }
  bool consecutive = true;
  for (int i = 1; i < ix->nt; i++) consecutive = consecutive && ix->tpos[i] == ix->tpos[0] + i;
  ix->front = !consecutive && ix->tpos[0] != 0;
  int pos = ix->front ? 0 : ix->tpos[0];
  if (ix->nX - ix->nt + ix->nB > MAXD)
    return index_free(ix),
           tg_set_error(TG_ERR_INVALID, "%s: the result would have more than %d dims", fn, MAXD), -1;
  int k = 0, r = 0;
  for (int p = 0; p <= ix->nX; p++) {
    if (r == pos && k == 0) {
      for (int j = 0; j < ix->nB; j++) ix->R[ix->nR++] = ix->B[j];
      k = 1;
    }
    if (p == ix->nX) break;
    bool is_t = false;
    for (int j = 0; j < ix->nt; j++) is_t = is_t || ix->tpos[j] == p;
    if (!is_t) ix->R[ix->nR++] = ix->X[p], r++;
  }
  if (!k)
    for (int j = 0; j < ix->nB; j++) ix->R[ix->nR++] = ix->B[j];
  return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* getitem / setitem: composition                                                                  */

/* Shrink, flip and stride x into the entries' ranges, then reshape to the view shape X. */
static tg_tensor apply_views(tg_tensor x, UOp *a, const Index *ix) {
  int nd = a->ndim;
  int64_t bounds[2 * MAXD], shp[MAXD], st[MAXD];
  int flips[MAXD], nf = 0;
  bool strided = false;
  for (int i = 0; i < ix->n; i++) {
    const Entry *e = &ix->e[i];
    if (e->kind == E_NEW) continue;
    int d = e->xdim;
    bounds[2 * d] = e->b0, bounds[2 * d + 1] = e->b1;
    shp[d] = sym_is_code(e->b0) ? e->size : e->b1 - e->b0; /* (symbolic positions: step 1) */
    st[d] = e->stride < 0 ? -e->stride : e->stride;
    if (e->stride < 0) flips[nf++] = d;
    strided = strided || st[d] != 1;
  }
  /* the positions are the caller's (those computed from a bound value mark the result baked, in
   * tg_getitem): the shrink is not counted as the library's own, as getitem's scope would count it */
  sym_library(-1);
  tg_tensor r = tg_shrink(x, bounds, 2 * nd);
  sym_library(+1);
  if (nf) r = tg_flip(r, flips, nf);
  if (strided) {
    int64_t pads[2 * MAXD], pairs[2 * MAXD], cut[4 * MAXD], fin[MAXD];
    for (int d = 0; d < nd; d++) {
      int64_t ru = round_up(shp[d], st[d]);
      pads[2 * d] = 0, pads[2 * d + 1] = ru - shp[d];
      pairs[2 * d] = ru / st[d], pairs[2 * d + 1] = st[d];
      cut[4 * d] = 0, cut[4 * d + 1] = ru / st[d], cut[4 * d + 2] = 0, cut[4 * d + 3] = 1;
      fin[d] = ru / st[d];
    }
    r = tg_pad(r, pads, 2 * nd, 0.0);
    r = tg_reshape(r, pairs, 2 * nd);
    r = tg_shrink(r, cut, 4 * nd);
    r = tg_reshape(r, fin, nd);
  }
  return tg_reshape(r, ix->X, ix->nX);
}

/* Index tensor of entry j, as int64 with negative values wrapped once (tinygrad's rule). */
static tg_tensor wrapped_index(const Index *ix, int j) {
  const Entry *e = NULL;
  int c = 0;
  for (int i = 0; i < ix->n; i++)
    if (ix->e[i].kind == E_TENSOR && c++ == j) e = &ix->e[i];
  tg_tensor t = tg_cast(e->t, TG_INT64);
  t = tg_where(tg_lt_s(t, 0), tg_add_s(t, (double)e->size), t);
  /* a uint64 index of 2^63 or more is out of range, not a negative one (2^64 - 1 read the last
   * element): it becomes `size`, which every caller treats as out of range */
  if (tg_dtype_of(e->t) == TG_UINT64)
    t = tg_where(tg_logical_not(tg_lt_s(e->t, 9223372036854775808.0)), tg_full_like(t, (double)e->size, NULL), t);
  return t;
}

/* Advanced getitem on the view v (shape X): the tensor dims are permuted to the front, merged into
 * one dim of L = prod(sizes) and read with one data-dependent gather (tg_index) at the linear index;
 * positions where any index is out of range read 0. Result placed as tinygrad places it. */
static tg_tensor adv_get(tg_tensor v, const Index *ix) {
  int nX = ix->nX, nt = ix->nt;
  int perm[MAXD], np = 0;
  int64_t rest[MAXD];
  int nrest = 0;
  bool is_t[MAXD] = {0};
  for (int j = 0; j < nt; j++) perm[np++] = ix->tpos[j], is_t[ix->tpos[j]] = true;
  for (int p = 0; p < nX; p++)
    if (!is_t[p]) perm[np++] = p, rest[nrest++] = ix->X[p];
  int64_t L = 1, strides[MAXD];
  for (int j = nt - 1; j >= 0; j--) strides[j] = L, L *= ix->X[ix->tpos[j]];
  tg_tensor lin = NONE, valid = NONE;
  for (int j = 0; j < nt; j++) {
    int64_t S = ix->X[ix->tpos[j]];
    tg_tensor t = wrapped_index(ix, j);
    tg_tensor ok = tg_bitwise_and(tg_logical_not(tg_lt_s(t, 0)), tg_lt_s(t, (double)S));
    tg_tensor term = tg_mul_s(t, (double)strides[j]);
    lin = j == 0 ? term : tg_add(lin, term);
    valid = j == 0 ? ok : tg_bitwise_and(valid, ok);
  }
  lin = tg_expand(lin, ix->B, ix->nB);
  valid = tg_expand(valid, ix->B, ix->nB);
  int64_t gshape[MAXD];
  int ng = 0;
  for (int j = 0; j < ix->nB; j++) gshape[ng++] = ix->B[j];
  for (int j = 0; j < nrest; j++) gshape[ng++] = rest[j];
  tg_tensor r;
  if (L == 0) {
    r = zeros_from_empty(v, gshape, ng);
  } else {
    int64_t xs[MAXD];
    xs[0] = L;
    for (int j = 0; j < nrest; j++) xs[1 + j] = rest[j];
    tg_tensor xr = tg_reshape(tg_permute(v, perm, nX), xs, nrest + 1);
    r = tg_index(xr, tg_where(valid, lin, tg_const_like(lin, 0)));
    int64_t vs[MAXD];
    for (int j = 0; j < ng; j++) vs[j] = j < ix->nB ? ix->B[j] : 1;
    r = tg_where(tg_reshape(valid, vs, ng), r, tg_const_like(r, 0));
  }
  if (ix->front || ix->tpos[0] == 0) return r;
  /* broadcast dims go where the first tensor index was */
  int pos = ix->tpos[0], order[MAXD], no = 0;
  for (int j = 0; j < pos; j++) order[no++] = ix->nB + j;
  for (int j = 0; j < ix->nB; j++) order[no++] = j;
  for (int j = pos; j < nrest; j++) order[no++] = ix->nB + j;
  return tg_permute(r, order, ng);
}

tg_tensor tg_getitem(tg_tensor x, const tg_index_spec *spec, int n) {
  const char *fn = "tg_getitem";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  Index ix;
  if (parse_index(fn, a, spec, n, true, &ix) < 0) return NONE;
  Op_ o = begin(fn);
  tg_tensor r = apply_views(x, a, &ix);
  if (ix.nt) r = adv_get(r, &ix);
  /* (a TinyJit capture of it is then refused, not replayed with the captured positions: x[-3:] of a
   * dim of n replayed x[4:n] for every n after a capture at 7) */
  UOp *ru = ix.baked && tg_valid(r) ? t_get(r, fn) : NULL;
  if (ru) uop_mark_sym_baked(ru);
  index_free(&ix);
  return done(o, r);
}

/* Advanced setitem: vb (the value, shape R) and the positions of the view X it writes. For every
 * position of the indexed dims, the last index position (row-major over the broadcast shape) that
 * names it wins, as in tinygrad's _masked_merge. Returns the value in X's layout and *mask (bool, X's
 * layout) marking written positions. */
static tg_tensor adv_set(tg_tensor vb, UOp *a, const Index *ix, tg_tensor *mask) {
  int nX = ix->nX, nt = ix->nt, nB = ix->nB;
  int pos = ix->front ? 0 : ix->tpos[0];
  /* vb: R -> (B..., rest...) -> (NB, rest...) */
  int ord[MAXD], no = 0;
  for (int j = 0; j < nB; j++) ord[no++] = pos + j;
  for (int j = 0; j < ix->nR; j++)
    if (j < pos || j >= pos + nB) ord[no++] = j;
  int64_t rest[MAXD];
  int nrest = 0;
  bool is_t[MAXD] = {0};
  for (int j = 0; j < nt; j++) is_t[ix->tpos[j]] = true;
  for (int p = 0; p < nX; p++)
    if (!is_t[p]) rest[nrest++] = ix->X[p];
  int64_t NB = numel_of(ix->B, nB);
  /* (NB, S_1..S_k, 1...) one-hot of each index, AND-ed */
  int nm = 1 + nt + nrest;
  tg_tensor m = NONE;
  for (int j = 0; j < nt; j++) {
    int64_t S = ix->X[ix->tpos[j]];
    tg_tensor t = tg_reshape(tg_expand(wrapped_index(ix, j), ix->B, nB), &NB, 1);
    int64_t sh[MAXD];
    for (int i = 0; i < nm; i++) sh[i] = i == 0 ? NB : 1;
    tg_tensor oh = tg_eq(tg_reshape(t, sh, nm), arange_along(a, S, 1 + j, nm));
    m = j == 0 ? oh : tg_bitwise_and(m, oh);
  }
  /* the winning (last) index position of each target, -1 if none */
  tg_tensor jpos = arange_along(a, NB, 0, nm);
  tg_tensor jw = tg_where(m, jpos, tg_const_like(jpos, -1));
  tg_tensor jstar = tg_max(jw, (const int[]){0}, 1, true);
  tg_tensor hit = tg_logical_not(tg_lt_s(jstar, 0));
  tg_tensor sel = tg_eq(jpos, jstar);
  int64_t vsh[MAXD];
  vsh[0] = NB;
  for (int j = 0; j < nt; j++) vsh[1 + j] = 1;
  for (int j = 0; j < nrest; j++) vsh[1 + nt + j] = rest[j];
  tg_tensor vf = tg_reshape(tg_permute(vb, ord, ix->nR), vsh, nm);
  tg_tensor val = tg_sum(tg_where(sel, vf, tg_const_like(vf, 0)), (const int[]){0}, 1, false);
  val = tg_cast(val, (tg_dtype)a->dtype);
  /* (S..., rest...) -> X's layout */
  int perm[MAXD], ti = 0, ri = 0;
  for (int p = 0; p < nX; p++) perm[p] = is_t[p] ? ti++ : nt + ri++;
  int64_t hsh[MAXD];
  for (int j = 0; j < nt; j++) hsh[j] = ix->X[ix->tpos[j]];
  for (int j = 0; j < nrest; j++) hsh[nt + j] = 1;
  tg_tensor h = tg_reshape(hit, hsh, nt + nrest);
  *mask = tg_expand(tg_permute(h, perm, nX), ix->X, nX);
  return tg_permute(val, perm, nX);
}

/* Moves (value, mask) from the view's layout back to x's full shape: undo the reshape, the steps
 * (interleave zeros), the flips and the shrink (pad). Unselected positions get mask false. */
static void unview(UOp *a, const Index *ix, tg_tensor *vb, tg_tensor *mask) {
  int nd = a->ndim;
  int64_t ms[MAXD];
  for (int i = 0, d = 0; i < ix->n; i++)
    if (ix->e[i].kind != E_NEW) ms[d++] = ix->e[i].collapse ? 1 : ix->e[i].size;
  tg_tensor t[2] = {tg_reshape(*vb, ms, nd), tg_reshape(*mask, ms, nd)};
  int flips[MAXD], nf = 0;
  int64_t pads[2 * MAXD];
  for (int i = 0; i < ix->n; i++) {
    const Entry *e = &ix->e[i];
    if (e->kind == E_NEW) continue;
    int d = e->xdim;
    int64_t st = e->stride < 0 ? -e->stride : e->stride, span = e->b1 - e->b0;
    if (st != 1 && ms[d] > 1) {
      /* (n) -> (n, 1) -> (n, st) -> (n*st) -> first (n-1)*st + 1 = span */
      for (int k = 0; k < 2; k++) {
        tg_tensor u = tg_unsqueeze(t[k], d + 1);
        int64_t p[2 * (MAXD + 1)] = {0};
        p[2 * (d + 1) + 1] = st - 1;
        u = tg_pad(u, p, 2 * (nd + 1), 0.0);
        UOp *uu = U(u);
        if (!uu) {
          *vb = *mask = NONE;
          return;
        }
        int64_t s2[MAXD];
        for (int j = 0; j < nd; j++) s2[j] = j == d ? ms[d] * st : uu->shape[j < d ? j : j + 1];
        u = tg_reshape(u, s2, nd);
        int64_t b[2 * MAXD];
        for (int j = 0; j < nd; j++) b[2 * j] = 0, b[2 * j + 1] = j == d ? span : s2[j];
        t[k] = tg_shrink(u, b, 2 * nd);
      }
    }
    if (e->stride < 0) flips[nf++] = d;
    pads[2 * d] = e->b0, pads[2 * d + 1] = a->shape[d] - e->b1;
  }
  for (int k = 0; k < 2; k++) {
    if (nf) t[k] = tg_flip(t[k], flips, nf);
    t[k] = tg_pad(t[k], pads, 2 * nd, 0.0);
  }
  *vb = t[0], *mask = t[1];
}

/* Setitem through a view, as tinygrad: when x is a chain of movement ops over a tensor with storage,
 * the write lands in that storage. (vb, mask) in x's shape are carried down the chain by each
 * op's inverse (reshape back, inverse permutation, flip again, pad what a shrink removed -- never
 * written --, shrink away a pad), the base is assigned where(mask, value, base), every handle holding
 * the base sees the pending write, and x is rebuilt as the same views of it. */
static tg_status write_through(const char *fn, tg_tensor x, UOp *const *chain, int nc, tg_tensor vb,
                               tg_tensor mask) {
  for (int k = 0; k < nc; k++) { /* chain[0] is x's node, chain[nc-1] sits on the base */
    UOp *u = chain[k], *src = u->src[0];
    int nd = src->ndim;
    tg_tensor t[2] = {vb, mask};
    for (int j = 0; j < 2; j++) {
      switch (u->op) {
      case OP_RESHAPE:
        t[j] = tg_reshape(t[j], src->shape, nd);
        break;
      case OP_PERMUTE: {
        int inv[MAXD];
        for (int d = 0; d < nd; d++) inv[u->iarg[d]] = d;
        t[j] = tg_permute(t[j], inv, nd);
        break;
      }
      case OP_FLIP: {
        int ax[MAXD], na = 0;
        for (int d = 0; d < nd; d++)
          if (u->iarg[d]) ax[na++] = d;
        t[j] = tg_flip(t[j], ax, na);
        break;
      }
      case OP_SHRINK: {
        int64_t pads[2 * MAXD];
        for (int d = 0; d < nd; d++)
          pads[2 * d] = u->iarg[2 * d], pads[2 * d + 1] = src->shape[d] - u->iarg[2 * d + 1];
        UOp *before = tg_valid(t[j]) ? t_get(t[j], fn) : NULL;
        t[j] = tg_pad(t[j], pads, 2 * nd, 0.0);
        /* a view at a symbolic offset put back at the bound value's position: right for that value
         * only (a TinyJit capture is refused); a pad of nothing is the node it was given */
        int na;
        UOp *tu = tg_valid(t[j]) ? t_get(t[j], fn) : NULL;
        if (tu && tu != before && uop_move_args(u, &na) != u->iarg) uop_mark_sym_baked(tu);
        break;
      }
      case OP_PAD: {
        int64_t b[2 * MAXD];
        for (int d = 0; d < nd; d++) b[2 * d] = u->iarg[2 * d], b[2 * d + 1] = u->iarg[2 * d] + src->shape[d];
        t[j] = tg_shrink(t[j], b, 2 * nd);
        break;
      }
      default:
        return tg_set_error(
            TG_ERR_INVALID,
            "%s: the target is an expanded (broadcast) view, whose elements share storage; setitem "
            "into the tensor it was expanded from, or into tg_contiguous of the view",
            fn);
      }
    }
    vb = t[0], mask = t[1];
  }
  UOp *base = chain[nc - 1]->src[0];
  if (base->op == OP_ASSIGN) { /* a pending write first, so the base is its buffer */
    if (realize_uops(&base, 1) != TG_OK) return tg_last_status();
  }
  UOp *bn = uop_realized(base) ? uop_realized(base) : base;
  if (bn->op != OP_BUFFER)
    return tg_set_error(TG_ERR_INVALID, "%s: the base of the target view has no storage", fn);
  /* a write into the same storage that another handle (the tensor itself, another view of it) holds
   * pending goes first: built on the buffer alone, this one would drop it */
  tg_status pst = t_realize_pending_writes(g_buffer_of(bn));
  if (pst != TG_OK) return pst;
  tg_tensor hb = t_wrap(uop_ref(bn));
  tg_tensor nb = tg_where(mask, vb, hb);
  if (!tg_valid(nb) || !tg_valid(tg_assign(hb, nb)))
    return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
  UOp *as = t_get(hb, fn);
  t_replace_buffer_everywhere(g_buffer_of(bn), as);
  /* x: the same views, now of the assigned base */
  tg_tensor r = hb;
  for (int k = nc - 1; k >= 0; k--) {
    UOp *u = chain[k];
    int nd = u->ndim;
    switch (u->op) {
    case OP_RESHAPE: {
      int na;
      const int64_t *ma = uop_move_args(u, &na);
      r = tg_reshape(r, ma, na);
      break;
    }
    case OP_PERMUTE: {
      int o[MAXD];
      for (int d = 0; d < nd; d++) o[d] = (int)u->iarg[d];
      r = tg_permute(r, o, nd);
      break;
    }
    case OP_FLIP: {
      int ax[MAXD], na = 0;
      for (int d = 0; d < nd; d++)
        if (u->iarg[d]) ax[na++] = d;
      r = tg_flip(r, ax, na);
      break;
    }
    case OP_SHRINK: {
      int na;
      const int64_t *ma = uop_move_args(u, &na);
      r = tg_shrink(r, ma, na);
      break;
    }
    case OP_PAD: {
      int na;
      const int64_t *ma = uop_move_args(u, &na);
      r = tg_pad(r, ma, na, 0.0);
      break;
    }
    default:
      break;
    }
  }
  UOp *ru = t_get(r, fn);
  if (!ru) return tg_last_status();
  Slot *xs = t_slot(x);
  UOp *old = xs->u;
  xs->u = uop_ref(ru);
  uop_unref(old);
  return TG_OK;
}

/* The writes pending into the storage under a multi-device view (a setitem through another view of
 * the same sharded tensor, not realized yet) run now, so that the view is one of buffers again and a
 * write through it lands there (it was updated functionally, and lost). */
static tg_status m_realize_pending(UOp *a) {
  UOp *tb = g_resolve(g_view_base(a));
  UOp *pend[64];
  int np = 0;
  if (tb->op == OP_ASSIGN && !uop_realized(tb)) pend[np++] = tb;
  for (uint32_t i = 0; tb->op == OP_MULTI && i < tb->nsrc && np < 64; i++) {
    UOp *s = g_view_base(tb->src[i]);
    if (s && s->op == OP_ASSIGN && !uop_realized(s)) pend[np++] = s;
  }
  return np ? realize_uops(pend, np) : TG_OK;
}

static tg_status setitem_impl(const char *fn, tg_tensor x, const tg_index_spec *spec, int n, tg_tensor value,
                              bool scalar, double sval) {
  UOp *a = t_get(x, fn);
  if (!a) return TG_ERR_HANDLE;
  UOp *v = NULL;
  if (!scalar) {
    v = t_get(value, fn);
    if (!v) return TG_ERR_HANDLE;
    if (!same_device(fn, a, v, "value")) return TG_ERR_INVALID;
  }
  if (m_is(a) && !m_is_view_of_buffers(a) && m_realize_pending(a) != TG_OK) return tg_last_status();
  if (m_is(a) && m_is_view_of_buffers(a)) {
    /* a view of a realized sharded tensor: the write goes through each shard's view into its buffer
     * (tg_assign's multi-device path), as a write through a view does on one device */
    for (int i = 0; i < n; i++)
      if (spec && spec[i].kind == TG_INDEX_TENSOR)
        return tg_set_error(TG_ERR_INVALID, "%s: a tensor index into a view of a multi-device tensor is not supported; "
                            "setitem into the sharded tensor itself", fn);
    tg_scope_begin();
    tg_tensor t = n ? tg_getitem(x, spec, n) : x;
    UOp *tu = tg_valid(t) ? t_get(t, fn) : NULL;
    tg_tensor vb = !tu ? NONE : scalar ? tg_full_like(t, sval, NULL) : tg_expand(tg_cast(value, (tg_dtype)a->dtype), tu->shape, tu->ndim);
    /* integers become one-wide slices, so that no dim is dropped (a dropped sharded axis gathers the
     * view, and the write went into the copy); the value is reshaped to that view (t above checked
     * the indices) */
    bool ints = false;
    for (int i = 0; i < n; i++) ints = ints || spec[i].kind == TG_INDEX_INT;
    if (ints && tg_valid(vb)) {
      tg_index_spec *keep = tg_xmalloc(sizeof *keep * (size_t)n);
      for (int i = 0; i < n; i++) {
        keep[i] = spec[i];
        int64_t k = spec[i].index;
        if (spec[i].kind == TG_INDEX_INT)
          keep[i] = k == -1 ? (tg_index_spec){.kind = TG_INDEX_SLICE, .start = -1, .step = 1, .has_start = true}
                            : (tg_index_spec){.kind = TG_INDEX_SLICE, .start = k, .stop = k + 1, .step = 1, .has_start = true, .has_stop = true};
      }
      t = tg_getitem(x, keep, n);
      free(keep);
      UOp *ku = tg_valid(t) ? t_get(t, fn) : NULL;
      vb = ku ? tg_reshape(vb, ku->shape, ku->ndim) : NONE;
    }
    /* a stepped or flipped slice of the sharded axis gathers the view: the write would change only
     * that copy, and was lost with status OK */
    UOp *tt = tg_valid(vb) && tg_valid(t) ? t_get(t, fn) : NULL;
    if (tt && !(m_is(tt) && m_is_view_of_buffers(tt))) {
      tg_scope_end();
      return tg_set_error(TG_ERR_INVALID,
                          "%s: this index of a view of a multi-device tensor selects a gathered copy of it (a stepped or "
                          "flipped slice of the sharded axis), which the write could not reach the shards' buffers "
                          "through; use a step of 1 on that axis, or setitem into the sharded tensor itself",
                          fn);
    }
    tg_tensor as = tg_valid(vb) ? tg_assign(t, vb) : NONE;
    tg_status st = tg_valid(as) ? TG_OK : tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
    tg_scope_end();
    return st;
  }
  if (n == 0 && t_region_target(a) && (scalar || bcast_to_ok(v->shape, v->ndim, a->shape, a->ndim))) {
    /* the whole of a view at a symbolic offset (cache[:, sp:sp+1] = new): tg_assign's in-place
     * region write, whose kernel holds for every value (the where over the base below would be
     * built at the bound value's position) */
    tg_scope_begin();
    tg_tensor vb = scalar ? tg_full_like(x, sval, NULL) : tg_expand(tg_cast(value, (tg_dtype)a->dtype), a->shape, a->ndim);
    tg_tensor as = tg_assign(x, vb);
    tg_status st = tg_valid(as) ? TG_OK : tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
    tg_scope_end();
    return st;
  }
  Index ix;
  if (parse_index(fn, a, spec, n, false, &ix) < 0) return tg_last_status();
  if (v && !bcast_to_ok(v->shape, v->ndim, ix.R, ix.nR)) {
    char s1[256];
    fmt_shape(s1, sizeof s1, ix.R, ix.nR);
    index_free(&ix);
    return tg_set_error(TG_ERR_INVALID, "%s: value of shape %s cannot broadcast to the indexed shape %s", fn,
                        SHP(v), s1);
  }
  Op_ o = begin(fn);
  tg_dtype dt = (tg_dtype)a->dtype;
  tg_tensor vb = scalar ? tg_cast(tg_const_like(x, sval), dt) : tg_cast(value, dt);
  vb = tg_expand(vb, ix.R, ix.nR);
  tg_tensor mask;
  if (ix.nt) {
    vb = adv_set(vb, a, &ix, &mask);
  } else {
    mask = tg_expand(tg_cast(tg_const_like(x, 1), TG_BOOL), ix.X, ix.nX);
  }
  unview(a, &ix, &vb, &mask);
  bool advanced = ix.nt > 0;
  index_free(&ix);
  /* x's node: a chain of views over a base; the base has storage (a buffer, realized, or a pending
   * assign into one) or is a lazy value */
  UOp *chain[MAXD * 4];
  int nc = 0;
  UOp *base = a;
  while (op_is_movement(base->op) && !uop_realized(base) && nc < (int)(sizeof chain / sizeof *chain))
    chain[nc++] = base, base = base->src[0];
  /* (a multi-device tensor of buffers has storage too: a full shrink of a realized sharded tensor,
   * which is that tensor's node, was updated functionally, and the tensor never saw the write) */
  bool stored = base->op == OP_BUFFER || base->op == OP_ASSIGN ||
                (uop_realized(base) && uop_realized(base)->op == OP_BUFFER) ||
                (m_is(base) && shards_are_buffers(g_resolve(base)));
  if (!stored && (tg_dtype_is_float(dt) || !advanced)) {
    /* tinygrad: a tensor without storage is updated functionally (only this handle, and
     * differentiably: the gradient reaches the value and the untouched part of x) */
    tg_tensor r = done(o, tg_where(mask, vb, x));
    UOp *ru = t_get(r, fn);
    if (!ru) return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
    Slot *xs = t_slot(x);
    UOp *old = xs->u;
    xs->u = uop_ref(ru);
    uop_unref(old);
    tg_free(r);
    return TG_OK;
  }
  if (stored && nc > 0) {
    tg_status st = write_through(fn, x, chain, nc, vb, mask);
    if (st == TG_OK) {
      tg_scope_end();
      return TG_OK;
    }
    done(o, NONE); /* relabels the error under fn */
    return tg_last_status() ? tg_last_status() : st;
  }
  tg_tensor nv = tg_where(mask, vb, x);
  tg_tensor r = done(o, nv);
  if (!tg_valid(r)) return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
  bool had = tg_has_error();
  tg_tensor as = tg_assign(x, r);
  tg_free(r);
  if (tg_valid(as)) return TG_OK;
  tg_status st = tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
  const char *m = tg_last_error();
  if (!had && m) { /* "tg_assign: ..." -> "tg_setitem: tg_assign: ..." */
    char buf[1200];
    snprintf(buf, sizeof buf, "%s: %s", fn, m);
    tg_clear_error();
    tg_set_error(st, "%s", buf);
  }
  return st;
}

tg_status tg_setitem(tg_tensor x, const tg_index_spec *spec, int n, tg_tensor value) {
  return setitem_impl("tg_setitem", x, spec, n, value, false, 0);
}

tg_status tg_setitem_s(tg_tensor x, const tg_index_spec *spec, int n, double value) {
  return setitem_impl("tg_setitem_s", x, spec, n, NONE, true, value);
}

/* ---------------------------------------------------------------------------------------------- */
/* padding modes                                                                                   */

/* x[lo:hi:step] along dim d as a view. */
static tg_tensor slice_dim(tg_tensor x, int nd, int d, int64_t lo, int64_t hi, bool has_hi, int64_t step) {
  tg_index_spec s[MAXD];
  memset(s, 0, sizeof s);
  s[d].kind = TG_INDEX_SLICE;
  s[d].start = lo, s[d].has_start = true;
  s[d].stop = hi, s[d].has_stop = has_hi;
  s[d].step = step;
  return tg_getitem(x, s, nd);
}

tg_tensor tg_pad_mode(tg_tensor x, const int64_t *pads, int npads, tg_padding_mode mode, double value) {
  const char *fn = "tg_pad_mode";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  int nd = a->ndim;
  if (npads < 0 || npads % 2 || npads > 2 * nd || (npads && !pads))
    return fail(
        "%s: got %d pads for a tensor of shape %s; give (before, after) pairs for the last npads/2 dims "
        "(at most %d values)",
        fn, npads, SHP(a), 2 * nd);
  if ((int)mode < TG_PAD_CONSTANT || (int)mode > TG_PAD_CIRCULAR)
    return fail("%s: unknown mode %d (expected TG_PAD_CONSTANT, _REFLECT, _REPLICATE or _CIRCULAR)", fn,
                (int)mode);
  if (mode != TG_PAD_CONSTANT && value != 0.0)
    return fail("%s: a fill value (%g) only applies to TG_PAD_CONSTANT", fn, value);
  int64_t p[2 * MAXD] = {0};
  int off = nd - npads / 2;
  for (int i = 0; i < npads; i++) p[2 * off + i] = pads[i];
  const int64_t lim = (int64_t)1 << 40;
  for (int i = 0; i < 2 * nd; i++)
    if (p[i] < -lim || p[i] > lim) return fail("%s: pad %lld is out of range", fn, (long long)p[i]);
  if (mode == TG_PAD_CONSTANT) {
    Op_ o = begin(fn);
    return done(o, tg_pad(x, p, 2 * nd, value));
  }
  /* the dims after the negative pads' shrink (circular) or before it (reflect, replicate) */
  for (int d = 0; d < nd; d++) {
    int64_t s = a->shape[d], pb = p[2 * d], pa = p[2 * d + 1];
    int64_t cut = (pb < 0 ? -pb : 0) + (pa < 0 ? -pa : 0);
    if (mode == TG_PAD_CIRCULAR) {
      if (cut > s)
        return fail("%s: pads (%lld, %lld) for dim %d of shape %s remove more than the whole dim", fn,
                    (long long)pb, (long long)pa, d, SHP(a));
      int64_t sh = s - cut;
      if (pb > sh || pa > sh)
        return fail(
            "%s: circular pads (%lld, %lld) for dim %d of shape %s wrap around more than once (each must be "
            "at most %lld)",
            fn, (long long)pb, (long long)pa, d, SHP(a), (long long)sh);
    } else if (mode == TG_PAD_REFLECT) {
      if ((pb > 0 && pb >= s) || (pa > 0 && pa >= s))
        return fail(
            "%s: reflect pads (%lld, %lld) for dim %d of shape %s must be less than the dim's size %lld", fn,
            (long long)pb, (long long)pa, d, SHP(a), (long long)s);
    } else {
      if ((pb > 0 || pa > 0) && s == 0)
        return fail("%s: cannot replicate-pad dim %d of shape %s: it is empty", fn, d, SHP(a));
    }
    if (mode != TG_PAD_CIRCULAR) {
      int64_t full = s + (pb > 0 ? pb : 0) + (pa > 0 ? pa : 0);
      if (cut > full)
        return fail("%s: pads (%lld, %lld) for dim %d of shape %s remove more than the whole dim", fn,
                    (long long)pb, (long long)pa, d, SHP(a));
    }
  }
  Op_ o = begin(fn);
  tg_tensor X = x;
  if (mode == TG_PAD_CIRCULAR) {
    int64_t b[2 * MAXD], reps[MAXD], osh[MAXD];
    for (int d = 0; d < nd; d++) {
      int64_t s = a->shape[d], pb = p[2 * d], pa = p[2 * d + 1];
      b[2 * d] = pb < 0 ? -pb : 0;
      b[2 * d + 1] = pa < 0 ? s + pa : s;
    }
    X = tg_shrink(X, b, 2 * nd);
    for (int d = 0; d < nd; d++) {
      int64_t pb = p[2 * d] > 0 ? p[2 * d] : 0, pa = p[2 * d + 1] > 0 ? p[2 * d + 1] : 0;
      osh[d] = b[2 * d + 1] - b[2 * d];
      reps[d] = 1 + (pb > 0) + (pa > 0);
    }
    X = tg_repeat(X, reps, nd);
    for (int d = 0; d < nd; d++) {
      int64_t pb = p[2 * d] > 0 ? p[2 * d] : 0, pa = p[2 * d + 1] > 0 ? p[2 * d + 1] : 0;
      int64_t xs = osh[d] * reps[d];
      b[2 * d] = pb == 0 ? 0 : osh[d] - pb;
      b[2 * d + 1] = pa == 0 ? xs : xs - osh[d] + pa;
    }
    return done(o, tg_shrink(X, b, 2 * nd));
  }
  for (int d = 0; d < nd; d++) {
    int64_t pb = p[2 * d] > 0 ? p[2 * d] : 0, pa = p[2 * d + 1] > 0 ? p[2 * d + 1] : 0;
    if (!pb && !pa) continue;
    UOp *ux = U(X);
    if (!ux) return done(o, NONE);
    int64_t s = ux->shape[d];
    tg_tensor pieces[3];
    int np = 0;
    if (mode == TG_PAD_REFLECT) {
      if (pb) pieces[np++] = slice_dim(X, nd, d, pb, 0, true, -1);
      pieces[np++] = X;
      if (pa) pieces[np++] = slice_dim(X, nd, d, s - 2, s - 2 - pa, s - 2 - pa >= 0, -1);
    } else {
      int64_t esh[MAXD];
      memcpy(esh, ux->shape, sizeof(int64_t) * (size_t)nd);
      if (pb) {
        esh[d] = pb;
        pieces[np++] = tg_expand(slice_dim(X, nd, d, 0, 1, true, 1), esh, nd);
      }
      pieces[np++] = X;
      if (pa) {
        esh[d] = pa;
        pieces[np++] = tg_expand(slice_dim(X, nd, d, s - 1, s, true, 1), esh, nd);
      }
    }
    X = tg_cat(pieces, np, d);
  }
  int64_t b[2 * MAXD];
  UOp *ux = U(X);
  if (!ux) return done(o, NONE);
  for (int d = 0; d < nd; d++) {
    int64_t s = ux->shape[d], pb = p[2 * d], pa = p[2 * d + 1];
    b[2 * d] = pb < 0 ? -pb : 0;
    b[2 * d + 1] = pa < 0 ? s + pa : s;
  }
  return done(o, tg_shrink(X, b, 2 * nd));
}

/* ---------------------------------------------------------------------------------------------- */
/* movement                                                                                        */

tg_tensor tg_repeat_interleave(tg_tensor x, int64_t repeats, int dim) {
  const char *fn = "tg_repeat_interleave";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (repeats < 0) return fail("%s: repeats %lld must be non-negative", fn, (long long)repeats);
  int d = 0;
  if (dim != TG_DIM_NONE) {
    if (a->ndim == 0) return fail("%s: cannot repeat along a dim of a 0-d tensor (pass TG_DIM_NONE)", fn);
    if (norm_axis(fn, dim, a->ndim, &d) < 0) return NONE;
  }
  if (a->ndim >= MAXD) return fail("%s: too many dimensions", fn);
  Op_ o = begin(fn);
  tg_tensor t = x;
  UOp *u = a;
  if (dim == TG_DIM_NONE) {
    t = tg_flatten(x, 0, -1);
    u = U(t);
    if (!u) return done(o, NONE);
  }
  int nd = u->ndim;
  int64_t s1[MAXD], s2[MAXD], s3[MAXD];
  for (int i = 0, k = 0; i < nd; i++) {
    s1[k] = u->shape[i], s2[k] = u->shape[i], k++;
    if (i == d) s1[k] = 1, s2[k] = repeats, k++;
    s3[i] = u->shape[i];
    if (i == d && __builtin_mul_overflow(u->shape[i], repeats, &s3[i]))
      return done(o, fail("%s: repeats %lld times dim %d (size %lld) overflows int64", fn, (long long)repeats,
                          d, (long long)u->shape[i]));
  }
  t = tg_reshape(t, s1, nd + 1);
  t = tg_expand(t, s2, nd + 1);
  return done(o, tg_reshape(t, s3, nd));
}

tg_tensor tg_unflatten(tg_tensor x, int dim, const int64_t *sizes, int nsizes) {
  const char *fn = "tg_unflatten";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (a->ndim == 0) return fail("%s: cannot unflatten a 0-d tensor", fn);
  int d;
  if (norm_axis(fn, dim, a->ndim, &d) < 0) return NONE;
  if (nsizes < 0 || (nsizes > 0 && !sizes) || a->ndim - 1 + nsizes > MAXD)
    return fail("%s: sizes is %s with nsizes=%d", fn, sizes ? "set" : "NULL", nsizes);
  int64_t known = 1;
  int infer = -1;
  for (int i = 0; i < nsizes; i++) {
    if (sizes[i] == -1) {
      if (infer >= 0) return fail("%s: only one size can be -1 (sizes %s)", fn, FSHP(sizes, nsizes));
      infer = i;
    } else if (sizes[i] < 0) {
      return fail("%s: size %lld is negative (sizes %s)", fn, (long long)sizes[i], FSHP(sizes, nsizes));
    } else if (__builtin_mul_overflow(known, sizes[i], &known)) {
      return fail("%s: sizes %s multiply past int64", fn, FSHP(sizes, nsizes));
    }
  }
  int64_t s = a->shape[d];
  if ((infer < 0 && known != s) || (infer >= 0 && (known == 0 || s % known)))
    return fail("%s: sizes %s do not multiply to the size %lld of dim %d (shape %s)", fn, FSHP(sizes, nsizes),
                (long long)s, d, SHP(a));
  int64_t sh[MAXD];
  int k = 0;
  for (int i = 0; i < d; i++) sh[k++] = a->shape[i];
  for (int i = 0; i < nsizes; i++) sh[k++] = sizes[i] == -1 ? s / known : sizes[i];
  for (int i = d + 1; i < a->ndim; i++) sh[k++] = a->shape[i];
  Op_ o = begin(fn);
  return done(o, tg_reshape(x, sh, k));
}

/* One window axis (tinygrad's _pool for a 1-d kernel) over the LAST dim of x: (..., L) -> (..., o, k)
 * with o = (L - k) / s + 1 windows of k elements every s, made of movement ops only. */
static tg_tensor pool1(tg_tensor x, UOp *u, int64_t k, int64_t s) {
  int nd = u->ndim;
  int64_t i = u->shape[nd - 1];
  int64_t o = cdiv(i - (k - 1), s);
  int64_t f = cdiv(o * s - 1, i); /* o * s < i - k + 1 + s: the caller keeps s <= i + 1 */
  if (f < 1) f = 1;
  int64_t w = i * f + 1, kw;
  if (__builtin_mul_overflow(k, w, &kw))
    return fail("tg_unfold: windows of size %lld over a dim of size %lld are too large to build",
                (long long)k, (long long)i);
  int64_t rep = cdiv(kw, i);
  int64_t sh[MAXD + 2];
  for (int j = 0; j < nd - 1; j++) sh[j] = u->shape[j];
  int64_t reps[MAXD];
  for (int j = 0; j < nd; j++) reps[j] = j == nd - 1 ? rep : 1;
  tg_tensor r = tg_repeat(x, reps, nd);
  int64_t b[2 * (MAXD + 2)];
  for (int j = 0; j < nd - 1; j++) b[2 * j] = 0, b[2 * j + 1] = u->shape[j];
  b[2 * (nd - 1)] = 0, b[2 * (nd - 1) + 1] = kw;
  r = tg_shrink(r, b, 2 * nd);
  sh[nd - 1] = k, sh[nd] = w;
  r = tg_reshape(r, sh, nd + 1);
  b[2 * (nd - 1)] = 0, b[2 * (nd - 1) + 1] = k, b[2 * nd] = 0, b[2 * nd + 1] = o * s;
  r = tg_shrink(r, b, 2 * (nd + 1));
  sh[nd] = o, sh[nd + 1] = s;
  r = tg_reshape(r, sh, nd + 2);
  b[2 * nd] = 0, b[2 * nd + 1] = o, b[2 * (nd + 1)] = 0, b[2 * (nd + 1) + 1] = 1;
  r = tg_shrink(r, b, 2 * (nd + 2));
  r = tg_reshape(r, sh, nd + 1);
  return tg_transpose(r, -1, -2);
}

tg_tensor tg_unfold(tg_tensor x, int dim, int64_t size, int64_t step) {
  const char *fn = "tg_unfold";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (a->ndim == 0) return fail("%s: cannot unfold a 0-d tensor", fn);
  if (a->ndim >= MAXD - 2) return fail("%s: too many dimensions", fn);
  int d;
  if (norm_axis(fn, dim, a->ndim, &d) < 0) return NONE;
  if (size < 0) return fail("%s: size %lld must be non-negative", fn, (long long)size);
  if (step <= 0) return fail("%s: step %lld must be positive", fn, (long long)step);
  if (size > a->shape[d])
    return fail("%s: size %lld is larger than dim %d (size %lld) of shape %s", fn, (long long)size, d,
                (long long)a->shape[d], SHP(a));
  /* every step longer than the dim gives the same single window: clamping keeps pool1's arithmetic small */
  if (step > a->shape[d]) step = a->shape[d] + 1;
  int64_t nw = (a->shape[d] - size) / step + 1;
  int64_t out[MAXD];
  int k = 0;
  for (int i = 0; i < a->ndim; i++) out[k++] = i == d ? nw : a->shape[i];
  out[k++] = size;
  if (!shape_fits(out, k))
    return fail("%s: %lld windows of size %lld over shape %s are too many elements", fn, (long long)nw,
                (long long)size, SHP(a));
  Op_ o = begin(fn);
  if (numel_of(out, k) == 0) {
    int64_t b[2 * MAXD];
    for (int i = 0; i < a->ndim; i++) b[2 * i] = 0, b[2 * i + 1] = i == d ? 0 : a->shape[i];
    return done(o, tg_reshape(tg_shrink(x, b, 2 * a->ndim), out, k));
  }
  int perm[MAXD], np = 0, inv[MAXD];
  for (int i = 0; i < a->ndim; i++)
    if (i != d) perm[np++] = i;
  perm[np++] = d;
  tg_tensor t = tg_permute(x, perm, a->ndim);
  UOp *ut = U(t);
  if (!ut) return done(o, NONE);
  t = pool1(t, ut, size, step); /* (..others, nw, size) */
  for (int i = 0; i < a->ndim; i++) inv[perm[i]] = i;
  inv[a->ndim] = a->ndim;
  return done(o, tg_permute(t, inv, a->ndim + 1));
}

tg_tensor tg_diag(tg_tensor x) {
  const char *fn = "tg_diag";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (a->ndim != 1)
    return fail("%s: expected a 1-d tensor, got shape %s (use tg_diagonal for N-d)", fn, SHP(a));
  int64_t n = a->shape[0];
  Op_ o = begin(fn);
  tg_tensor t = tg_unsqueeze(x, -1);
  t = tg_pad(t, (const int64_t[]){0, 0, 0, n}, 4, 0.0);
  t = tg_flatten(t, 0, -1);
  t = tg_shrink(t, (const int64_t[]){0, n * n}, 2);
  return done(o, tg_reshape(t, (const int64_t[]){n, n}, 2));
}

tg_tensor tg_diagonal(tg_tensor x, int64_t offset, int dim1, int dim2) {
  const char *fn = "tg_diagonal";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (a->ndim < 2) return fail("%s: needs at least 2 dims, got shape %s", fn, SHP(a));
  int d1, d2;
  if (norm_axis(fn, dim1, a->ndim, &d1) < 0 || norm_axis(fn, dim2, a->ndim, &d2) < 0) return NONE;
  if (d1 == d2) return fail("%s: dim1 and dim2 are both dim %d; they must differ", fn, d1);
  int nd = a->ndim, perm[MAXD], np = 0;
  for (int i = 0; i < nd; i++)
    if (i != d1 && i != d2) perm[np++] = i;
  perm[np++] = d1, perm[np++] = d2;
  Op_ o = begin(fn);
  tg_tensor t = tg_permute(x, perm, nd);
  int64_t sh[MAXD], b[2 * MAXD];
  UOp *ut = U(t);
  if (!ut) return done(o, NONE);
  memcpy(sh, ut->shape, sizeof(int64_t) * (size_t)nd);
  for (int i = 0; i < nd; i++) b[2 * i] = 0, b[2 * i + 1] = sh[i];
  int64_t r = sh[nd - 2], c = sh[nd - 1];
  if (offset >= 0)
    b[2 * (nd - 1)] = offset >= c ? c : offset;
  else
    b[2 * (nd - 2)] = offset <= -r ? r : -offset;
  int64_t rr = b[2 * (nd - 2) + 1] - b[2 * (nd - 2)], cc = b[2 * (nd - 1) + 1] - b[2 * (nd - 1)];
  int64_t dd = rr < cc ? rr : cc;
  b[2 * (nd - 2) + 1] = b[2 * (nd - 2)] + dd;
  b[2 * (nd - 1) + 1] = b[2 * (nd - 1)] + dd;
  t = tg_shrink(t, b, 2 * nd);
  sh[nd - 2] = dd;
  if (dd == 0) return done(o, tg_reshape(t, sh, nd - 1));
  /* (..., d, d) -> (..., d*d) -> pad to d*(d+1) -> (..., d, d+1) -> column 0 */
  t = tg_flatten(t, nd - 2, nd - 1);
  int64_t p[2 * MAXD] = {0};
  p[2 * (nd - 2) + 1] = dd;
  t = tg_pad(t, p, 2 * (nd - 1), 0.0);
  sh[nd - 2] = dd, sh[nd - 1] = dd + 1;
  t = tg_reshape(t, sh, nd);
  for (int i = 0; i < nd; i++) b[2 * i] = 0, b[2 * i + 1] = sh[i];
  b[2 * (nd - 1) + 1] = 1;
  t = tg_shrink(t, b, 2 * nd);
  return done(o, tg_reshape(t, sh, nd - 1));
}

tg_tensor tg_roll(tg_tensor x, const int64_t *shifts, int nshifts, const int *dims, int ndims) {
  const char *fn = "tg_roll";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (nshifts < 1 || !shifts) return fail("%s: needs at least one shift (nshifts=%d)", fn, nshifts);
  if (ndims < 0 || (ndims > 0 && !dims)) return fail("%s: dims is NULL with ndims=%d", fn, ndims);
  if (ndims == 0 && nshifts != 1)
    return fail("%s: without dims (roll of the flattened tensor) give exactly one shift, got %d", fn,
                nshifts);
  if (ndims > 0 && ndims != nshifts)
    return fail("%s: %d shifts but %d dims; give one shift per dim", fn, nshifts, ndims);
  int64_t sh[MAXD] = {0};
  int nd = a->ndim;
  if (ndims > 0) {
    if (nd == 0) return fail("%s: cannot roll a dim of a 0-d tensor (pass no dims)", fn);
    for (int i = 0; i < ndims; i++) {
      int d;
      if (norm_axis(fn, dims[i], nd, &d) < 0) return NONE;
      if (t_dim_sym(x, d))
        return fail("%s: dim %d of shape %s is symbolic; rolling it would cut it at an offset computed from its "
                    "bound value (roll only plain dims)", fn, d, SHP(a));
      sh[d] += shifts[i] % (a->shape[d] ? a->shape[d] : 1);
    }
  }
  if (ndims == 0 && a->sym)
    return fail("%s: shape %s has a symbolic dim, so it cannot be flattened for a roll without dims (give the dims "
                "to roll)", fn, SHP(a));
  Op_ o = begin(fn);
  if (ndims == 0) {
    int64_t n = numel_of(a->shape, nd);
    tg_tensor f = tg_flatten(x, 0, -1);
    if (n == 0) return done(o, tg_reshape(f, a->shape, nd));
    int64_t s = ((shifts[0] % n) + n) % n;
    tg_tensor r = tg_repeat(f, (const int64_t[]){2}, 1);
    r = tg_shrink(r, (const int64_t[]){n - s, 2 * n - s}, 2);
    return done(o, tg_reshape(r, a->shape, nd));
  }
  if (numel_of(a->shape, nd) == 0) return done(o, tg_reshape(x, a->shape, nd));
  int64_t reps[MAXD], b[2 * MAXD];
  bool rolled[MAXD] = {0};
  for (int i = 0; i < ndims; i++) {
    int d;
    norm_axis(fn, dims[i], nd, &d);
    rolled[d] = true;
  }
  for (int d = 0; d < nd; d++) {
    int64_t s = a->shape[d];
    reps[d] = rolled[d] ? 2 : 1;
    if (rolled[d]) {
      int64_t m = ((sh[d] % s) + s) % s, delta = s - m;
      b[2 * d] = delta, b[2 * d + 1] = delta + s;
    } else {
      b[2 * d] = 0, b[2 * d + 1] = s;
    }
  }
  tg_tensor r = tg_repeat(x, reps, nd);
  return done(o, tg_shrink(r, b, 2 * nd));
}

/* ---------------------------------------------------------------------------------------------- */
/* rearrange (einops)                                                                              */

#define RA_MAXTOK 128

typedef struct {
  char *names[RA_MAXTOK]; /* owned */
  int n;
  int gs[RA_MAXTOK], ge[RA_MAXTOK]; /* groups as [start, end) over names */
  int ng;
} RaSide;

static void ra_free(RaSide *s) {
  for (int i = 0; i < s->n; i++) free(s->names[i]);
  s->n = 0;
}

static bool ra_name_ok(const char *s) {
  if (!strcmp(s, "...")) return true;
  size_t n = strlen(s);
  if (!n || s[0] == '_' || s[n - 1] == '_') return false;
  if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z'))) return false;
  for (size_t i = 1; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
          s[i] == '_'))
      return false;
  return true;
}

/* Parses one side of the formula: names, "...", "(" ")" groups (not nested), and "1" (an empty
 * group, i.e. a size-1 dim). Returns 0 or -1 with an error. */
static int ra_parse(const char *fn, const char *formula, const char *p, const char *end, RaSide *s) {
  memset(s, 0, sizeof *s);
  bool open = false;
  while (p < end) {
    if (*p == ' ' || *p == '\t' || *p == '\n') {
      p++;
      continue;
    }
    if (*p == '(' || *p == ')') {
      bool lp = *p == '(';
      if (lp == open)
        return tg_set_error(TG_ERR_INVALID, "%s: unbalanced or nested parentheses in \"%s\"", fn, formula),
               -1;
      if (lp) {
        if (s->ng >= RA_MAXTOK) return tg_set_error(TG_ERR_INVALID, "%s: formula too long", fn), -1;
        s->gs[s->ng] = s->n;
      } else {
        s->ge[s->ng++] = s->n;
      }
      open = lp;
      p++;
      continue;
    }
    const char *q = p;
    if (!strncmp(p, "\xe2\x80\xa6", 3)) { /* the ellipsis character */
      q = p + 3;
    } else {
      while (q < end && *q != ' ' && *q != '\t' && *q != '\n' && *q != '(' && *q != ')') q++;
    }
    size_t len = (size_t)(q - p);
    bool unicode_ell = !strncmp(p, "\xe2\x80\xa6", 3) && len == 3;
    char *tok = tg_xmalloc(len + 4);
    if (unicode_ell)
      strcpy(tok, "...");
    else
      memcpy(tok, p, len), tok[len] = 0;
    p = q;
    if (!strcmp(tok, "1")) { /* "1": an empty group */
      free(tok);
      if (open)
        return tg_set_error(TG_ERR_INVALID, "%s: \"1\" inside parentheses in \"%s\"", fn, formula), -1;
      if (s->ng >= RA_MAXTOK) return tg_set_error(TG_ERR_INVALID, "%s: formula too long", fn), -1;
      s->gs[s->ng] = s->n, s->ge[s->ng++] = s->n;
      continue;
    }
    if (!ra_name_ok(tok)) {
      tg_set_error(
          TG_ERR_INVALID,
          "%s: invalid axis name \"%s\" in \"%s\" (names are identifiers that neither start nor end with _)",
          fn, tok, formula);
      free(tok);
      return -1;
    }
    if (s->n >= RA_MAXTOK) {
      free(tok);
      return tg_set_error(TG_ERR_INVALID, "%s: formula too long", fn), -1;
    }
    s->names[s->n++] = tok;
  }
  if (open) return tg_set_error(TG_ERR_INVALID, "%s: unbalanced parentheses in \"%s\"", fn, formula), -1;
  return 0;
}

static int ra_find(const RaSide *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->names[i], name)) return i;
  return -1;
}

/* Replaces "..." by ell names "...0", "...1", ... and shifts the groups after it. */
static void ra_expand_ellipsis(RaSide *s, int ell) {
  int at = ra_find(s, "...");
  if (at < 0) return;
  free(s->names[at]);
  int n = s->n;
  memmove(&s->names[at + ell], &s->names[at + 1], sizeof(char *) * (size_t)(n - at - 1));
  for (int j = 0; j < ell; j++) {
    char buf[32];
    snprintf(buf, sizeof buf, "...%d", j);
    s->names[at + j] = tg_xmalloc(strlen(buf) + 1);
    strcpy(s->names[at + j], buf);
  }
  s->n = n - 1 + ell;
  for (int g = 0; g < s->ng; g++) {
    if (s->gs[g] > at) s->gs[g] += ell - 1;
    if (s->ge[g] > at) s->ge[g] += ell - 1;
  }
}

tg_tensor tg_rearrange(tg_tensor x, const char *formula, const tg_axis_size *sizes, int nsizes) {
  const char *fn = "tg_rearrange";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (!formula) return fail("%s: formula is NULL", fn);
  if (nsizes < 0 || (nsizes > 0 && !sizes)) return fail("%s: sizes is NULL with nsizes=%d", fn, nsizes);
  const char *arrow = strstr(formula, "->");
  if (!arrow || strstr(arrow + 2, "->"))
    return fail("%s: \"%s\" needs exactly one \"->\" (e.g. \"b c h w -> b (h w) c\")", fn, formula);
  RaSide L, R;
  if (ra_parse(fn, formula, formula, arrow, &L) < 0) return ra_free(&L), NONE;
  if (ra_parse(fn, formula, arrow + 2, formula + strlen(formula), &R) < 0)
    return ra_free(&L), ra_free(&R), NONE;
  tg_tensor res = NONE;
  /* checks: sizes named on the left, same names on both sides, no duplicates, ellipsis rules */
  for (int i = 0; i < nsizes; i++) {
    if (!sizes[i].name || ra_find(&L, sizes[i].name) < 0) {
      fail("%s: size given for axis \"%s\", which is not on the left of \"%s\"", fn,
           sizes[i].name ? sizes[i].name : "(null)", formula);
      goto out;
    }
    if (sizes[i].size < 0) {
      fail("%s: size %lld for axis \"%s\" is negative", fn, (long long)sizes[i].size, sizes[i].name);
      goto out;
    }
  }
  for (int i = 0; i < L.n; i++)
    for (int j = i + 1; j < L.n; j++)
      if (!strcmp(L.names[i], L.names[j])) {
        fail("%s: axis \"%s\" appears twice on the left of \"%s\"", fn, L.names[i], formula);
        goto out;
      }
  for (int i = 0; i < R.n; i++)
    for (int j = i + 1; j < R.n; j++)
      if (!strcmp(R.names[i], R.names[j])) {
        fail("%s: axis \"%s\" appears twice on the right of \"%s\"", fn, R.names[i], formula);
        goto out;
      }
  for (int i = 0; i < L.n; i++)
    if (ra_find(&R, L.names[i]) < 0) {
      fail("%s: axis \"%s\" is on the left of \"%s\" but not on the right", fn, L.names[i], formula);
      goto out;
    }
  for (int i = 0; i < R.n; i++)
    if (ra_find(&L, R.names[i]) < 0) {
      fail("%s: axis \"%s\" is on the right of \"%s\" but not on the left", fn, R.names[i], formula);
      goto out;
    }
  for (int g = 0; g < L.ng; g++)
    for (int i = L.gs[g]; i < L.ge[g]; i++)
      if (!strcmp(L.names[i], "...")) {
        fail("%s: an ellipsis cannot be inside parentheses on the left of \"%s\"", fn, formula);
        goto out;
      }
  {
    int inner = 0; /* dims the left side describes */
    bool has_ell = ra_find(&L, "...") >= 0;
    for (int i = 0; i < L.n; i++) inner += strcmp(L.names[i], "...") != 0;
    int grouped_extra = 0;
    for (int g = 0; g < L.ng; g++) grouped_extra += L.ge[g] - L.gs[g] - 1;
    int ldims = inner - grouped_extra; /* tensor dims the left side consumes, not counting "..." */
    if ((!has_ell && ldims != a->ndim) || (has_ell && ldims > a->ndim)) {
      fail("%s: the left side of \"%s\" describes %d dims%s but the tensor has shape %s", fn, formula, ldims,
           has_ell ? " plus an ellipsis" : "", SHP(a));
      goto out;
    }
    if (has_ell) {
      int ell = a->ndim - ldims;
      ra_expand_ellipsis(&L, ell);
      ra_expand_ellipsis(&R, ell);
    }
    if (L.n > MAXD) {
      fail("%s: more than %d axes", fn, MAXD);
      goto out;
    }
    /* unflatten each left group; check given sizes */
    int64_t sh[MAXD];
    int ns = 0, li = 0;
    for (int d = 0, g = 0; li < L.n || g < L.ng;) {
      if (g < L.ng && L.gs[g] == li) {
        int64_t known = 1, s = a->shape[d++];
        int infer = -1;
        for (int i = L.gs[g]; i < L.ge[g]; i++) {
          int64_t v = -1;
          for (int k = 0; k < nsizes; k++)
            if (!strcmp(sizes[k].name, L.names[i])) v = sizes[k].size;
          if (v < 0) {
            if (infer >= 0) {
              fail("%s: cannot infer both \"%s\" and \"%s\" in \"%s\"; give one of their sizes", fn,
                   L.names[infer], L.names[i], formula);
              goto out;
            }
            infer = i;
          } else {
            known *= v;
          }
          sh[ns + i - L.gs[g]] = v;
        }
        if (L.gs[g] == L.ge[g] && s != 1) {
          fail("%s: dim %d of shape %s has size %lld but \"1\" or \"()\" in \"%s\" needs size 1", fn, d - 1,
               SHP(a), (long long)s, formula);
          goto out;
        }
        if ((infer < 0 && known != s) || (infer >= 0 && (known == 0 ? s != 0 : s % known != 0))) {
          fail("%s: dim %d of shape %s has size %lld, which the group (%s ...) of \"%s\" cannot split into",
               fn, d - 1, SHP(a), (long long)s, L.names[L.gs[g]], formula);
          goto out;
        }
        if (infer >= 0) sh[ns + infer - L.gs[g]] = known ? s / known : 0;
        ns += L.ge[g] - L.gs[g];
        li = L.ge[g];
        g++;
      } else {
        int64_t s = a->shape[d++];
        for (int k = 0; k < nsizes; k++)
          if (!strcmp(sizes[k].name, L.names[li]) && sizes[k].size != s) {
            fail("%s: axis \"%s\" was given size %lld but has size %lld in shape %s", fn, L.names[li],
                 (long long)sizes[k].size, (long long)s, SHP(a));
            goto out;
          }
        sh[ns++] = s;
        li++;
      }
    }
    Op_ o = begin(fn);
    tg_tensor t = tg_reshape(x, sh, ns);
    int perm[MAXD];
    for (int i = 0; i < R.n; i++) perm[i] = ra_find(&L, R.names[i]);
    t = tg_permute(t, perm, R.n);
    for (int g = R.ng - 1; g >= 0; g--) {
      if (R.gs[g] < R.ge[g])
        t = tg_flatten(t, R.gs[g], R.ge[g] - 1);
      else
        t = tg_unsqueeze(t, R.gs[g]);
    }
    res = done(o, t);
  }
out:
  ra_free(&L), ra_free(&R);
  return res;
}

/* ---------------------------------------------------------------------------------------------- */
/* masks                                                                                           */

static bool check_mask(const char *fn, UOp *a, UOp *m, bool to_x) {
  if (m->dtype != TG_BOOL) {
    tg_set_error(TG_ERR_INVALID, "%s: mask has dtype %s; it must be bool (e.g. tg_gt_s(x, 0))", fn,
                 tg_dtype_name((tg_dtype)m->dtype));
    return false;
  }
  if (!same_device(fn, a, m, "mask")) return false;
  int64_t tmp[MAXD];
  if (to_x ? !bcast_to_ok(m->shape, m->ndim, a->shape, a->ndim)
           : bcast(a->shape, a->ndim, m->shape, m->ndim, tmp) < 0) {
    tg_set_error(TG_ERR_INVALID, "%s: mask of shape %s cannot broadcast %s x's shape %s", fn, SHP(m),
                 to_x ? "to" : "with", SHP(a));
    return false;
  }
  return true;
}

tg_tensor tg_masked_fill(tg_tensor x, tg_tensor mask, tg_tensor value) {
  const char *fn = "tg_masked_fill";
  UOp *a = t_get(x, fn), *m = a ? t_get(mask, fn) : NULL, *v = m ? t_get(value, fn) : NULL;
  if (!a || !m || !v) return NONE;
  if (!check_mask(fn, a, m, false) || !same_device(fn, a, v, "value")) return NONE;
  int64_t tmp[MAXD], tmp2[MAXD];
  int n1 = bcast(a->shape, a->ndim, m->shape, m->ndim, tmp);
  if (bcast(tmp, n1, v->shape, v->ndim, tmp2) < 0)
    return fail("%s: value of shape %s cannot broadcast with x %s and mask %s", fn, SHP(v), SHP(a), SHP(m));
  Op_ o = begin(fn);
  return done(o, tg_where(mask, value, x));
}

tg_tensor tg_masked_fill_s(tg_tensor x, tg_tensor mask, double value) {
  const char *fn = "tg_masked_fill_s";
  UOp *a = t_get(x, fn), *m = a ? t_get(mask, fn) : NULL;
  if (!a || !m) return NONE;
  if (!check_mask(fn, a, m, false)) return NONE;
  Op_ o = begin(fn);
  return done(o, tg_where(mask, tg_const_like(x, value), x));
}

/* Realizes a bool tensor and returns its elements (malloc'd, numel bytes), or NULL with an error. */
static uint8_t *read_bool(tg_tensor t, int64_t n) {
  uint8_t *buf = tg_xmalloc((size_t)(n > 0 ? n : 1));
  if (tg_data(t, buf, (size_t)n) != TG_OK) {
    free(buf);
    return NULL;
  }
  return buf;
}

tg_tensor tg_masked_select(tg_tensor x, tg_tensor mask) {
  const char *fn = "tg_masked_select";
  UOp *a = t_get(x, fn), *m = a ? t_get(mask, fn) : NULL;
  if (!a || !m) return NONE;
  if (!check_mask(fn, a, m, true)) return NONE;
  int64_t n = numel_of(a->shape, a->ndim);
  Op_ o = begin(fn);
  tg_tensor mb = tg_flatten(tg_expand(mask, a->shape, a->ndim), 0, -1);
  /* reading the mask realizes x's graph too, and x's handle may let go of a: the device from before */
  tg_opts io = on_device(a, TG_INT64);
  uint8_t *bits = tg_valid(mb) ? read_bool(mb, n) : NULL;
  if (!bits) return done(o, NONE);
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; i++) cnt += bits[i] != 0;
  int64_t *idx = tg_xmalloc(sizeof(int64_t) * (size_t)(cnt > 0 ? cnt : 1));
  for (int64_t i = 0, k = 0; i < n; i++)
    if (bits[i]) idx[k++] = i;
  free(bits);
  tg_tensor it = tg_from_data(idx, &cnt, 1, &io);
  free(idx);
  tg_tensor flat = tg_flatten(x, 0, -1);
  tg_tensor r = n == 0 ? tg_reshape(flat, (const int64_t[]){0}, 1) : tg_index(flat, it);
  return done(o, r);
}

tg_tensor tg_nonzero(tg_tensor x) {
  const char *fn = "tg_nonzero";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  int nd = a->ndim;
  int64_t n = numel_of(a->shape, nd), shape[64];
  memcpy(shape, a->shape, sizeof(int64_t) * (size_t)nd);
  /* reading the mask realizes x's graph too, and x's handle may let go of a: its device and shape
   * from before */
  tg_opts io = on_device(a, TG_INT32);
  Op_ o = begin(fn);
  tg_tensor nz = tg_flatten(tg_ne_s(x, 0), 0, -1);
  uint8_t *bits = tg_valid(nz) ? read_bool(nz, n) : NULL;
  if (!bits) return done(o, NONE);
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; i++) cnt += bits[i] != 0;
  /* int32 indices, as tinygrad returns them (a coordinate is below its dim's size, < 2^31 here) */
  int32_t *out = tg_xmalloc(sizeof(int32_t) * (size_t)(cnt * nd > 0 ? cnt * nd : 1));
  for (int64_t i = 0, k = 0; i < n; i++) {
    if (!bits[i]) continue;
    int64_t r = i;
    for (int d = nd - 1; d >= 0; d--) {
      out[k * nd + d] = (int32_t)(r % shape[d]);
      r /= shape[d];
    }
    k++;
  }
  free(bits);
  int64_t sh[2] = {cnt, nd};
  tg_tensor r = tg_from_data(out, sh, 2, &io);
  free(out);
  return done(o, r);
}

/* tinygrad's fixed-size selection (jittable: nothing is realized). Output position j takes the
 * element at flat index idx_j = #{i : cumsum(mask)[i] <= j}, the position of the (j+1)-th true
 * element, and fill where j >= the number of true elements. One (size, n) compare-and-count reduce,
 * the work of tinygrad's one-hot scatter. Returns the flat source indices (int32, clamped into range)
 * and in *valid whether each output position has an element. */
static tg_tensor select_positions(UOp *a, tg_tensor maskflat, int64_t n, int64_t size, tg_tensor *valid) {
  tg_opts io = on_device(a, TG_INT32);
  tg_tensor cs = tg_reshape(tg_cumsum(tg_cast(maskflat, TG_INT32), 0), (const int64_t[]){1, n}, 2);
  tg_tensor j = tg_reshape(tg_arange(0, (double)size, 1, &io), (const int64_t[]){size, 1}, 2);
  tg_tensor idx = tg_cast(tg_sum(tg_logical_not(tg_gt(cs, j)), (const int[]){1}, 1, false), TG_INT32);
  tg_tensor cnt = tg_sum(tg_cast(maskflat, TG_INT32), NULL, 0, false);
  *valid = tg_lt(tg_reshape(j, (const int64_t[]){size}, 1), cnt);
  return tg_minimum_s(idx, (double)(n - 1));
}

static bool size_ok(const char *fn, int64_t size) {
  if (size < 0 || size > ((int64_t)1 << 31) - 1) {
    tg_set_error(TG_ERR_INVALID, "%s: size %lld must be in 0 .. 2^31-1", fn, (long long)size);
    return false;
  }
  return true;
}

tg_tensor tg_masked_select_size(tg_tensor x, tg_tensor mask, int64_t size, double fill_value) {
  const char *fn = "tg_masked_select_size";
  UOp *a = t_get(x, fn), *m = a ? t_get(mask, fn) : NULL;
  if (!a || !m) return NONE;
  if (!check_mask(fn, a, m, true) || !size_ok(fn, size)) return NONE;
  int64_t n = numel_of(a->shape, a->ndim);
  Op_ o = begin(fn);
  tg_tensor flat = tg_flatten(x, 0, -1), r;
  if (n == 0 || size == 0) {
    tg_opts fo = on_device(a, (tg_dtype)a->dtype);
    r = tg_full((const int64_t[]){size}, 1, fill_value, &fo);
  } else {
    tg_tensor valid, mb = tg_flatten(tg_expand(mask, a->shape, a->ndim), 0, -1);
    tg_tensor idx = select_positions(a, mb, n, size, &valid);
    tg_tensor g = tg_index(flat, idx);
    r = tg_cast(tg_where(valid, g, tg_const_like(g, fill_value)), (tg_dtype)a->dtype);
  }
  return done(o, r);
}

tg_tensor tg_nonzero_size(tg_tensor x, int64_t size, double fill_value) {
  const char *fn = "tg_nonzero_size";
  UOp *a = t_get(x, fn);
  if (!a || !size_ok(fn, size)) return NONE;
  int nd = a->ndim;
  int64_t n = numel_of(a->shape, nd);
  Op_ o = begin(fn);
  tg_opts io = on_device(a, TG_INT32);
  tg_tensor r;
  if (nd == 0) {
    r = tg_zeros((const int64_t[]){size, 0}, 2, &io);
  } else if (n == 0 || size == 0) {
    r = tg_full((const int64_t[]){size, nd}, 2, fill_value, &io);
  } else {
    tg_tensor valid, idx = select_positions(a, tg_flatten(tg_ne_s(x, 0), 0, -1), n, size, &valid);
    /* unravel the flat index: coordinate d = idx / stride_d % shape_d */
    int64_t stride = 1;
    tg_tensor cols[MAXD];
    for (int d = nd - 1; d >= 0; d--) {
      tg_tensor c = tg_idiv(idx, tg_const_like(idx, (double)stride));
      cols[d] = tg_mod(c, tg_const_like(c, (double)a->shape[d]));
      stride *= a->shape[d];
    }
    tg_tensor coords = tg_stack(cols, nd, 1); /* (size, nd) */
    tg_tensor v2 = tg_reshape(valid, (const int64_t[]){size, 1}, 2);
    r = tg_cast(tg_where(v2, coords, tg_const_like(coords, fill_value)), TG_INT32);
  }
  return done(o, r);
}

/* ---------------------------------------------------------------------------------------------- */
/* scatter                                                                                         */

/* Checks the shapes (tinygrad's _pre_scatter) and returns 0, or -1 with an error. */
static int scatter_check(const char *fn, UOp *a, int dim, UOp *ix, UOp *s, int *d) {
  if (!tg_dtype_is_int((tg_dtype)ix->dtype))
    return tg_set_error(TG_ERR_INVALID, "%s: index has dtype %s; it must be an integer tensor", fn,
                        tg_dtype_name((tg_dtype)ix->dtype)),
           -1;
  if (a->ndim == 0 || ix->ndim != a->ndim || (s && s->ndim != a->ndim))
    return tg_set_error(TG_ERR_INVALID,
                        "%s: x %s, index %s%s%s must have the same number of dimensions (at least 1)", fn,
                        SHP(a), SHP(ix), s ? " and src " : "", s ? SHP(s) : ""),
           -1;
  if (norm_axis(fn, dim, a->ndim, d) < 0) return -1;
  for (int j = 0; j < a->ndim; j++) {
    if (j != *d && ix->shape[j] > a->shape[j])
      return tg_set_error(
                 TG_ERR_INVALID,
                 "%s: index shape %s is larger than x's shape %s in dim %d (only dim %d may be larger)", fn,
                 SHP(ix), SHP(a), j, *d),
             -1;
    if (s && ix->shape[j] > s->shape[j])
      return tg_set_error(TG_ERR_INVALID, "%s: index shape %s is larger than src's shape %s in dim %d", fn,
                          SHP(ix), SHP(s), j),
             -1;
  }
  if (s && s->dtype != a->dtype)
    return tg_set_error(TG_ERR_INVALID,
                        "%s: src has dtype %s but x has dtype %s; they must be equal (tg_cast src)", fn,
                        tg_dtype_name((tg_dtype)s->dtype), tg_dtype_name((tg_dtype)a->dtype)),
           -1;
  if (!same_device(fn, a, ix, "index") || (s && !same_device(fn, a, s, "src"))) return -1;
  return 0;
}

/* src and the one-hot mask, both (x.shape..., index.shape[d]) with the target dim d of size
 * x.shape[d] and the index position along the last dim; padded to x's shape (mask false there). */
static void pre_scatter(UOp *a, int d, tg_tensor index, UOp *ix, tg_tensor src, tg_tensor *srcp,
                        tg_tensor *maskp) {
  int nd = a->ndim;
  int64_t b[2 * MAXD] = {0}, esh[MAXD + 1];
  for (int j = 0; j < nd; j++) b[2 * j] = 0, b[2 * j + 1] = ix->shape[j];
  tg_tensor s = tg_shrink(src, b, 2 * nd);
  for (int j = 0; j < nd; j++) esh[j] = ix->shape[j];
  esh[nd] = a->shape[d];
  s = tg_transpose(tg_expand(tg_unsqueeze(s, -1), esh, nd + 1), -1, d);
  tg_tensor m = tg_eq(tg_unsqueeze(index, -1), arange_along(a, a->shape[d], nd, nd + 1));
  m = tg_transpose(m, -1, d);
  int64_t p[2 * (MAXD + 1)] = {0};
  for (int j = 0; j < nd; j++)
    p[2 * j + 1] = j == d ? 0 : a->shape[j] - ix->shape[j]; /* s, m: index's shape, dim d full */
  *srcp = tg_pad(s, p, 2 * (nd + 1), 0.0);
  *maskp = tg_pad(m, p, 2 * (nd + 1), 0.0);
}

static tg_tensor scatter_impl(const char *fn, tg_tensor x, int dim, tg_tensor index, tg_tensor src,
                              bool scalar, double value) {
  UOp *a = t_get(x, fn), *ix = a ? t_get(index, fn) : NULL, *s = NULL;
  if (!a || !ix) return NONE;
  if (!scalar && !(s = t_get(src, fn))) return NONE;
  int d;
  if (scatter_check(fn, a, dim, ix, s, &d) < 0) return NONE;
  Op_ o = begin(fn);
  if (scalar) {
    tg_opts so = on_device(a, (tg_dtype)a->dtype);
    src = tg_full(ix->shape, ix->ndim, value, &so);
  }
  int nd = a->ndim;
  int64_t K = ix->shape[d];
  tg_tensor sp, m;
  pre_scatter(a, d, index, ix, src, &sp, &m);
  /* last write wins: the largest index position that names each target */
  tg_tensor j = arange_along(a, K, nd, nd + 1);
  tg_tensor jw = tg_where(m, j, tg_const_like(j, -1));
  tg_tensor jstar = tg_max(jw, (const int[]){-1}, 1, true);
  tg_tensor sel = tg_eq(j, jstar);
  tg_tensor val = tg_sum(tg_where(sel, sp, tg_const_like(sp, 0)), (const int[]){-1}, 1, false);
  tg_tensor hit = tg_squeeze(tg_logical_not(tg_lt_s(jstar, 0)), -1);
  return done(o, tg_where(hit, tg_cast(val, (tg_dtype)a->dtype), x));
}

tg_tensor tg_scatter(tg_tensor x, int dim, tg_tensor index, tg_tensor src) {
  return scatter_impl("tg_scatter", x, dim, index, src, false, 0);
}

tg_tensor tg_scatter_s(tg_tensor x, int dim, tg_tensor index, double value) {
  return scatter_impl("tg_scatter_s", x, dim, index, NONE, true, value);
}

tg_tensor tg_scatter_reduce(tg_tensor x, int dim, tg_tensor index, tg_tensor src, tg_scatter_reduce_op reduce,
                            bool include_self) {
  const char *fn = "tg_scatter_reduce";
  UOp *a = t_get(x, fn), *ix = a ? t_get(index, fn) : NULL, *s = ix ? t_get(src, fn) : NULL;
  if (!a || !ix || !s) return NONE;
  if ((int)reduce < TG_SCATTER_SUM || (int)reduce > TG_SCATTER_AMIN)
    return fail("%s: unknown reduce %d (expected TG_SCATTER_SUM, _PROD, _MEAN, _AMAX or _AMIN)", fn,
                (int)reduce);
  int d;
  if (scatter_check(fn, a, dim, ix, s, &d) < 0) return NONE;
  tg_dtype dt = (tg_dtype)a->dtype;
  Op_ o = begin(fn);
  tg_tensor sp, m;
  pre_scatter(a, d, index, ix, src, &sp, &m);
  const int last[] = {-1};
  tg_tensor untouched = tg_logical_not(tg_any(m, last, 1, false));
  tg_tensor r;
  switch (reduce) {
  case TG_SCATTER_SUM:
  case TG_SCATTER_MEAN: {
    r = tg_sum(tg_where(m, sp, tg_const_like(sp, 0)), last, 1, false);
    r = tg_add(r, include_self ? x : tg_where(untouched, x, tg_const_like(x, 0)));
    if (reduce == TG_SCATTER_MEAN) {
      tg_tensor cnt = tg_sum(tg_cast(m, TG_INT32), last, 1, false);
      cnt = tg_add(cnt, include_self ? tg_const_like(cnt, 1) : tg_cast(untouched, TG_INT32));
      if (tg_dtype_is_float(dt))
        r = tg_div(r, tg_cast(cnt, dt));
      else
        r = tg_div_mode(r, tg_cast(cnt, tg_valid(r) ? tg_dtype_of(r) : dt), TG_DIV_FLOOR);
    }
    break;
  }
  case TG_SCATTER_PROD:
    r = tg_prod(tg_where(m, sp, tg_const_like(sp, 1)), last, 1, false);
    r = tg_mul(r, include_self ? x : tg_where(untouched, x, tg_const_like(x, 1)));
    break;
  case TG_SCATTER_AMAX:
  case TG_SCATTER_AMIN: {
    bool mx = reduce == TG_SCATTER_AMAX;
    double idv = mx ? dtype_min(dt) : dtype_max(dt);
    tg_tensor w = tg_where(m, sp, tg_const_like(sp, idv));
    r = mx ? tg_max(w, last, 1, false) : tg_min(w, last, 1, false);
    tg_tensor other = include_self ? x : tg_where(untouched, x, tg_const_like(x, idv));
    r = mx ? tg_maximum(r, other) : tg_minimum(r, other);
    break;
  }
  default:
    r = NONE;
    break;
  }
  return done(o, tg_cast(r, dt));
}

/* ---------------------------------------------------------------------------------------------- */
/* properties, contiguous_backward                                                                 */

int64_t tg_element_size(tg_tensor x) {
  UOp *a = t_get(x, "tg_element_size");
  return a ? (int64_t)tg_dtype_itemsize((tg_dtype)a->dtype) : -1;
}

int64_t tg_nbytes(tg_tensor x) {
  UOp *a = t_get(x, "tg_nbytes");
  return a ? numel_of(a->shape, a->ndim) * (int64_t)tg_dtype_itemsize((tg_dtype)a->dtype) : -1;
}

bool tg_is_floating_point(tg_tensor x) {
  UOp *a = t_get(x, "tg_is_floating_point");
  return a ? tg_dtype_is_float((tg_dtype)a->dtype) : false;
}

/* d x = contiguous(d out): the incoming gradient is materialized before it flows on. */
static void cb_grad(UOp *out, UOp *g, UOp *const *inputs, int n, UOp **grads) {
  (void)out, (void)inputs, (void)n;
  grads[0] = g_contiguous(g);
}

tg_tensor tg_contiguous_backward(tg_tensor x) {
  const char *fn = "tg_contiguous_backward";
  UOp *a = t_get(x, fn);
  if (!a) return NONE;
  if (!tg_dtype_is_float((tg_dtype)a->dtype)) return t_wrap(uop_ref(a)); /* no gradient to shape */
  /* The forward is the identity; we need a node of our own to hang the custom gradient on. x * 1 is
   * exact for every float (and -0.0, inf, nan) and costs nothing once fused. Hash-consing may share
   * the node with another x * 1; its gradient then gets a contiguous too, which is the same value. */
  UOp *one = g_const_shaped(1.0, (tg_dtype)a->dtype, a->device, a->shape, a->ndim);
  UOp *r = g_alu(OP_MUL, (tg_dtype)a->dtype, a, one, NULL);
  uop_unref(one);
  UOp *ins[1] = {a};
  ag_set_custom_grad(r, ins, 1, cb_grad);
  return t_wrap(r);
}
