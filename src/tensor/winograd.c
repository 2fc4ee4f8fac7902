/*
 * winograd.c -- WINO=1: convolutions with a 3-wide kernel in every spatial dim (3, 3x3, 3x3x3), stride
 * and dilation 1, by Winograd's minimal filtering F(4, 3): tinygrad's WINO, in our own form.
 *
 * In: the arguments of tg_conv2d / an n-d convolution, already checked (pads as (before, after) per
 * spatial dim). Out: the same values, summed in another order. The input is cut into 6-wide tiles
 * that overlap by 2 (a window view of stride 4), each tile and the weight are carried into the
 * transformed space by the constant matrices below (B^T d B and G g G^T along every spatial dim),
 * multiplied there and summed over the input channels (one product per transformed point instead of
 * 9 per output in 2-D: 36 products make a 4x4 output tile, against 144 directly), and brought back by
 * A^T m A. Everything is ordinary tensor ops, so autograd differentiates it (the gradients are again
 * Winograd-shaped: transposed transforms around the same channel sums) and the scheduler fuses the
 * transforms into elementwise kernels. The transformed input and weight are materialized once each,
 * as is the result, so nothing downstream recomputes a transform per read.
 *
 * Invariants: every spatial kernel dim is 3; the output tile is 4 wide, so the padded input spans
 * 4 * tiles + 2 elements per dim (the extra zeros only pad the last tile, whose extra outputs are cut
 * off at the end).
 */
#include "compose.h"

#define NONE ((tg_tensor){0})

/* F(4, 3): a 6-point tile from 3 kernel taps and 4 outputs (interpolation points 0, +-1, +-2, inf) */
static const double WG[6 * 3] = {1 / 4.0,  0,        0,       -1 / 6.0, -1 / 6.0, -1 / 6.0, -1 / 6.0, 1 / 6.0, -1 / 6.0,
                                 1 / 24.0, 1 / 12.0, 1 / 6.0, 1 / 24.0, -1 / 12.0, 1 / 6.0, 0,        0,       1};
static const double WBT[6 * 6] = {4, 0,  -5, 0,  1, 0, 0, -4, -4, 1, 1, 0, 0, 4, -4, -1, 1, 0,
                                  0, -2, -1, 2,  1, 0, 0, 2,  -1, -2, 1, 0, 0, 4, 0,  -5, 0, 1};
static const double WAT[4 * 6] = {1, 1, 1, 1, 1, 0, 0, 1, -1, 2, -2, 0, 0, 1, 1, 4, 4, 0, 0, 1, -1, 8, -8, 1};

static int wino_level(void) { return (int)getenv_int_in("WINO", 0, 0, 1); }

bool wino_applies(const UOp *a, const UOp *w, int nsp, const int64_t *s, const int64_t *d, const int64_t *pads) {
  if (nsp < 1 || nsp > 3 || !wino_level() || !tg_dtype_is_float((tg_dtype)a->dtype) ||
      !tg_dtype_is_float((tg_dtype)w->dtype) || a->ndim != 2 + nsp || w->ndim != 2 + nsp)
    return false;
  for (int j = 0; j < nsp; j++)
    if (w->shape[2 + j] != 3 || s[j] != 1 || d[j] != 1 || pads[2 * j] < 0 || pads[2 * j + 1] < 0) return false;
  if (a->sym || w->sym) return false; /* symbolic sizes: the tiles would follow the bound value */
  if (m_is(a) || m_is(w)) return false; /* sharded: the direct form (its shards' kernels) */
  for (int j = 0; j < a->ndim; j++)
    if (a->shape[j] <= 0) return false; /* empty tensors: direct */
  for (int j = 0; j < w->ndim; j++)
    if (w->shape[j] <= 0) return false;
  return true;
}

/* mat (m x n, row-major) applied along axis ax of t (size n there): out[i] = sum_k mat[i][k] t[k] */
static tg_tensor apply_mat(tg_tensor t, UOp *u, int ax, const double *mat, int m, int n) {
  tg_dtype dt = (tg_dtype)u->dtype;
  tg_opts co = on_device(u, dt == TG_FLOAT64 ? TG_FLOAT64 : TG_FLOAT32);
  int64_t bounds[2 * 12], cshape[12]; /* up to 3 transformed dims + 6 others */
  for (int i = 0; i < u->ndim; i++) bounds[2 * i] = 0, bounds[2 * i + 1] = u->shape[i], cshape[i] = 1;
  cshape[ax] = m;
  tg_tensor acc = NONE;
  for (int k = 0; k < n; k++) {
    double col[6];
    float colf[6];
    bool any = false;
    for (int i = 0; i < m; i++) col[i] = mat[i * n + k], colf[i] = (float)col[i], any |= col[i] != 0;
    if (!any) continue;
    bounds[2 * ax] = k, bounds[2 * ax + 1] = k + 1;
    tg_tensor c = tg_from_data(dt == TG_FLOAT64 ? (const void *)col : (const void *)colf, cshape, u->ndim, &co);
    tg_tensor term = tg_mul(tg_shrink(t, bounds, 2 * u->ndim), tg_cast(c, dt));
    acc = acc.id ? tg_add(acc, term) : term;
  }
  return acc;
}

/* apply_mat along axes 0..nsp-1, one pass per axis, each materialized before the next: fused, every
 * output point summed all 36 (2-D) products of its tile, twice the time of the two 6-term passes and
 * the memory between them */
static tg_tensor apply_mats(tg_tensor t, int nsp, const double *mat, int m, int n) {
  for (int j = 0; j < nsp; j++) {
    if (j) t = tg_contiguous(t);
    UOp *u = t_get(t, "WINO");
    if (!u) return NONE;
    t = apply_mat(t, u, j, mat, m, n);
  }
  return t;
}

tg_tensor wino_conv(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, int64_t groups, int nsp,
                    const int64_t *pads) {
  UOp *a = t_get(x, fn), *w = a ? t_get(weight, fn) : NULL;
  if (!a || !w) return NONE;
  int64_t bs = a->shape[0], cin_ = a->shape[1], cout = w->shape[0], cin = w->shape[1], rcout = cout / groups;
  int64_t outs[3], tiles[3], xpads[2 * (2 + 3)] = {0}, xps[2 + 3], k6[3], s4[3], d1[3], T = 1, N = bs;
  xps[0] = bs, xps[1] = cin_;
  for (int j = 0; j < nsp; j++) {
    int64_t sp = a->shape[2 + j];
    outs[j] = sp + pads[2 * j] + pads[2 * j + 1] - 2;
    tiles[j] = ceil_div(outs[j], 4);
    xpads[4 + 2 * j] = pads[2 * j];
    xpads[5 + 2 * j] = 4 * tiles[j] + 2 - sp - pads[2 * j]; /* >= the after-padding: 4*tiles >= outs */
    xps[2 + j] = 4 * tiles[j] + 2;
    k6[j] = 6, s4[j] = 4, d1[j] = 1;
    T *= 6, N *= tiles[j];
  }
  OpScope o = op_scope_begin(fn);
  int n = 2 + nsp, perm[12], np = 0;
  /* Everything is laid out channels-last, so that every transform's loads and stores run along the
   * channels (vector lanes) and the channel sums are batched matmuls: the input as (bs, sp..., C) in
   * memory, read through the (bs, C, sp...) view */
  perm[np++] = 0;
  for (int j = 0; j < nsp; j++) perm[np++] = 2 + j;
  perm[np++] = 1;
  tg_tensor xl = tg_permute(x, perm, n);
  bool chlast = a->op == OP_PERMUTE && !uop_realized(a) && a->niarg == (uint32_t)n && a->iarg[0] == 0 && a->iarg[1] == n - 1 &&
                g_is_stored(a->src[0], false);
  for (int j = 2; chlast && j < n; j++) chlast = a->iarg[j] == j - 1;
  if (!chlast) xl = tg_contiguous(xl); /* x is not already a view of channels-last data */
  np = 0;
  perm[np++] = 0, perm[np++] = n - 1;
  for (int j = 0; j < nsp; j++) perm[np++] = 1 + j;
  xl = tg_permute(xl, perm, n);
  /* tiles: (bs, C, tiles..., 6...) -> (6..., bs, tiles..., C); the input transform's gradient is
   * materialized before the windows' overlaps are summed back into the input */
  tg_tensor vt = pool_windows(tg_pad(xl, xpads, 2 * n, 0.0), xps, n, nsp, k6, s4, d1);
  np = 0;
  for (int j = 0; j < nsp; j++) perm[np++] = n + j;
  perm[np++] = 0;
  for (int j = 0; j < nsp; j++) perm[np++] = 2 + j;
  perm[np++] = 1;
  vt = tg_contiguous(apply_mats(tg_contiguous_backward(tg_permute(vt, perm, np)), nsp, WBT, 6, 6));
  /* (T, N, groups, cin) -> (T * groups, N, cin) */
  vt = tg_reshape(tg_permute(tg_reshape(vt, (const int64_t[]){T, N, groups, cin}, 4), (const int[]){0, 2, 1, 3}, 4),
                  (const int64_t[]){T * groups, N, cin}, 3);
  /* weight (groups, rcout, cin, 3...) -> (3..., groups, cin, rcout) -> (6..., groups, cin, rcout) */
  int64_t ws[3 + 3];
  ws[0] = groups, ws[1] = rcout, ws[2] = cin;
  for (int j = 0; j < nsp; j++) ws[3 + j] = 3;
  np = 0;
  for (int j = 0; j < nsp; j++) perm[np++] = 3 + j;
  perm[np++] = 0, perm[np++] = 2, perm[np++] = 1;
  tg_tensor ut = tg_contiguous(apply_mats(tg_permute(tg_reshape(weight, ws, 3 + nsp), perm, np), nsp, WG, 6, 3));
  ut = tg_reshape(ut, (const int64_t[]){T * groups, cin, rcout}, 3);
  /* the channel sums, one matmul per transformed point and group: (T * groups, N, rcout) ->
   * (6..., bs, tiles..., cout) */
  tg_tensor m = tg_matmul(vt, ut);
  m = tg_permute(tg_reshape(m, (const int64_t[]){T, groups, N, rcout}, 4), (const int[]){0, 2, 1, 3}, 4);
  int64_t ms[3 + 1 + 3 + 1];
  int r = 0;
  for (int j = 0; j < nsp; j++) ms[r++] = 6;
  ms[r++] = bs;
  for (int j = 0; j < nsp; j++) ms[r++] = tiles[j];
  ms[r++] = cout;
  m = apply_mats(tg_reshape(m, ms, r), nsp, WAT, 4, 6); /* (4..., bs, tiles..., cout) */
  /* interleave the tiles with their 4 outputs: (bs, tile0, 4, tile1, 4, ..., cout) -> (bs, o..., cout) */
  np = 0;
  perm[np++] = nsp;
  for (int j = 0; j < nsp; j++) perm[np++] = nsp + 1 + j, perm[np++] = j;
  perm[np++] = 2 * nsp + 1;
  int64_t rs[2 + 3], sh[2 * (2 + 3)];
  rs[0] = bs, sh[0] = 0, sh[1] = bs;
  for (int j = 0; j < nsp; j++) rs[1 + j] = 4 * tiles[j], sh[2 + 2 * j] = 0, sh[3 + 2 * j] = outs[j];
  rs[n - 1] = cout, sh[2 * n - 2] = 0, sh[2 * n - 1] = cout;
  tg_tensor y = tg_shrink(tg_reshape(tg_permute(m, perm, np), rs, n), sh, 2 * n);
  y = tg_cast(y, tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)w->dtype));
  if (bias.id) y = tg_add(y, bias); /* bias (cout,) broadcasts along the last dim */
  /* stored channels-last, returned as the (bs, cout, o...) view */
  y = tg_contiguous_backward(tg_contiguous(y));
  np = 0;
  perm[np++] = 0, perm[np++] = n - 1;
  for (int j = 0; j < nsp; j++) perm[np++] = 1 + j;
  return op_scope_done(o, tg_permute(y, perm, n));
}
