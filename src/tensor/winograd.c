/*
 * winograd.c -- WINO: convolutions by Winograd's minimal filtering. WINO=1 is tinygrad's: every
 * convolution with a 3-wide kernel in every spatial dim (3, 3x3, 3x3x3), stride and dilation 1, by
 * F(4, 3). WINO=2 adds 5-wide kernels in 1 and 2 dims by F(4, 5), and takes only convolutions where
 * the tiles pay (wino_pays).
 *
 * In: the arguments of tg_conv2d / an n-d convolution, already checked (pads as (before, after) per
 * spatial dim). Out: the same values, summed in another order. The input is cut into a-wide tiles
 * (a = r + 3 for an r-wide kernel) that overlap by r - 1, each tile and the weight are carried into
 * the transformed space by the constant matrices below (B^T d B and G g G^T along every spatial
 * dim), multiplied there and summed over the input channels (one product per transformed point: 36
 * make a 4x4 output tile of a 3x3 kernel, against 144 directly; 64 of a 5x5 one, against 400), and
 * brought back by A^T m A. Everything is tensor ops, so autograd differentiates it; where the
 * generic rules would build a poor backward graph (the transforms' matmuls, the channel sums) a
 * custom gradient builds the same kind of kernels the forward pass has. Every intermediate is
 * materialized, for the forward pass and for the gradient, so nothing recomputes a transform per read.
 *
 * With a dtype (conv2d(dtype=), float32 or float64) the transforms of the input and the weight run in
 * their own dtype (float16 / bfloat16 ones in float32, as without a dtype) and the channel sums, the output transform and the result in dtype (tinygrad's
 * (gfactors * dfactors).sum(dtype=dtype)).
 *
 * Invariants: the output tile is 4 wide; the padded input spans 4 * (tiles + 1) elements per dim
 * (the extra zeros only pad the last tile, whose extra outputs are cut off at the end).
 */
#include "compose.h"

#define NONE ((tg_tensor){0})

/* F(4, 3): a 6-point tile from 3 kernel taps and 4 outputs (interpolation points 0, +-1, +-2, inf) */
static const double WG3[6 * 3] = {1 / 4.0,  0,        0,       -1 / 6.0, -1 / 6.0, -1 / 6.0, -1 / 6.0, 1 / 6.0, -1 / 6.0,
                                  1 / 24.0, 1 / 12.0, 1 / 6.0, 1 / 24.0, -1 / 12.0, 1 / 6.0, 0,        0,       1};
static const double WBT3[6 * 6] = {4, 0,  -5, 0,  1, 0, 0, -4, -4, 1, 1, 0, 0, 4, -4, -1, 1, 0,
                                   0, -2, -1, 2,  1, 0, 0, 2,  -1, -2, 1, 0, 0, 4, 0,  -5, 0, 1};
static const double WAT3[4 * 6] = {1, 1, 1, 1, 1, 0, 0, 1, -1, 2, -2, 0, 0, 1, 1, 4, 4, 0, 0, 1, -1, 8, -8, 1};
/* F(4, 5) (WINO=2): an 8-point tile from 5 taps and 4 outputs (points 0, +-1, +-2, +-1/2, inf; the
 * input transform is the one of F(6, 3), which shares the points) */
static const double WG5[8 * 5] = {-1,          0,           0,          0,           0,          -2 / 9.0,   -2 / 9.0,
                                  -2 / 9.0,    -2 / 9.0,    -2 / 9.0,   -2 / 9.0,    2 / 9.0,    -2 / 9.0,   2 / 9.0,
                                  -2 / 9.0,    1 / 90.0,    1 / 45.0,   2 / 45.0,    4 / 45.0,   8 / 45.0,   1 / 90.0,
                                  -1 / 45.0,   2 / 45.0,    -4 / 45.0,  8 / 45.0,    32 / 45.0,  16 / 45.0,  8 / 45.0,
                                  4 / 45.0,    2 / 45.0,    32 / 45.0,  -16 / 45.0,  8 / 45.0,   -4 / 45.0,  2 / 45.0,
                                  0,           0,           0,          0,           1};
static const double WBT5[8 * 8] = {-1, 0,    21 / 4.0, 0,         -21 / 4.0, 0,         1, 0, /**/
                                   0,  1,    1,        -17 / 4.0, -17 / 4.0, 1,         1, 0, /**/
                                   0,  -1,   1,        17 / 4.0,  -17 / 4.0, -1,        1, 0, /**/
                                   0,  0.5,  0.25,     -2.5,      -1.25,     2,         1, 0, /**/
                                   0,  -0.5, 0.25,     2.5,       -1.25,     -2,        1, 0, /**/
                                   0,  2,    4,        -2.5,      -5,        0.5,       1, 0, /**/
                                   0,  -2,   4,        2.5,       -5,        -0.5,      1, 0, /**/
                                   0,  -1,   0,        21 / 4.0,  0,         -21 / 4.0, 0, 1};
static const double WAT5[4 * 8] = {1, 1, 1,  1, 1,  1,     1,      0, 0, 1, -1, 2, -2, 0.5,   -0.5,   0,
                                   0, 1, 1,  4, 4,  0.25,  0.25,   0, 0, 1, -1, 8, -8, 0.125, -0.125, 1};

/* one Winograd variant: r kernel taps, 4 outputs, a = r + 3 points */
typedef struct {
  int r, a;
  const double *g, *bt, *at;
} Wvar;
static const Wvar WV[2] = {{3, 6, WG3, WBT3, WAT3}, {5, 8, WG5, WBT5, WAT5}};

static int wino_level(void) { return (int)getenv_int_in("WINO", 0, 0, 2); }

/* WINO=2 takes a convolution only where the tiles pay for their transforms: 5-wide kernels too (in
 * 1 and 2 dims; in 3, F(4, 5)'s transforms, three deep, carry errors of 4e-5 of the largest value), but
 * only with at least 8 input and output channels per group (the channel sums are the only work the
 * tiles save), at least 12 outputs along every spatial dim (a 6x6 output computes 8x8 in tiles), and
 * a transformed input of at most 2^26 floats (the transforms are passes over memory) */
static bool wino_pays(const UOp *a, const UOp *w, int nsp, const int64_t *pads, int64_t groups) {
  if (w->shape[1] < 8 || w->shape[0] / groups < 8) return false;
  int64_t r = w->shape[2], elems = a->shape[1] * a->shape[0];
  for (int j = 0; j < nsp; j++) {
    int64_t o = a->shape[2 + j] + pads[2 * j] + pads[2 * j + 1] - r + 1;
    if (o < 12) return false;
    elems *= (r + 3) * ((o + 3) / 4);
  }
  /* and whose transformed input stays under 256 MB: (r + 3)^2 / 16 = 4x the output for 5-wide
   * kernels in 2-D, 2 GB for an evaluation of 10 000 MNIST images at once */
  return elems <= ((int64_t)64 << 20);
}

bool wino_applies(const UOp *a, const UOp *w, int nsp, const int64_t *s, const int64_t *d, const int64_t *pads,
                  int64_t groups) {
  int lv = wino_level();
  if (nsp < 1 || nsp > 3 || !lv || !tg_dtype_is_float((tg_dtype)a->dtype) || !tg_dtype_is_float((tg_dtype)w->dtype) ||
      a->ndim != 2 + nsp || w->ndim != 2 + nsp)
    return false;
  int64_t r = w->shape[2];
  if (r != 3 && (r != 5 || lv < 2 || nsp > 2)) return false; /* 5-wide in 3-d: errors of 4e-5 */
  for (int j = 0; j < nsp; j++)
    if (w->shape[2 + j] != r || s[j] != 1 || d[j] != 1 || pads[2 * j] < 0 || pads[2 * j + 1] < 0) return false;
  if (a->sym || w->sym) return false; /* symbolic sizes: the tiles would follow the bound value */
  if (m_is(a) || m_is(w)) return false; /* sharded: the direct form (its shards' kernels) */
  for (int j = 0; j < a->ndim; j++)
    if (a->shape[j] <= 0) return false; /* empty tensors: direct */
  for (int j = 0; j < w->ndim; j++)
    if (w->shape[j] <= 0) return false;
  return lv < 2 || wino_pays(a, w, nsp, pads, groups);
}

/* The overlapping tiles of t (bs, 4 * (tiles + 1)..., C), channels last: (a..., bs, tiles..., C), tile
 * i of a dim holding elements 4i .. 4i + a - 1. Each dim is split into blocks of 4 and a tile is
 * block i followed by the first a - 4 of block i + 1: two shrinks and a cat, whose gradient is two
 * pads and a sum, materialized in the blocked shape (bs, tiles + 1, 4, ..., C), where every read of
 * it is affine in the loop indices (a window view's gradient summed the overlaps back in a scalar
 * kernel of div/mod index arithmetic that cost more than the convolution; the sum fused into the
 * layer before, a batchnorm's reduction, was recomputed per read) */
static tg_tensor tile_windows(tg_tensor t, int nsp, const int64_t *tiles, int a) {
  int64_t rs[2 + 2 * 3], b0[2 * (2 + 2 * 3)], b1[2 * (2 + 2 * 3)];
  int nd = 2 + 2 * nsp, k = 0;
  rs[k++] = tg_dim(t, 0);
  for (int j = 0; j < nsp; j++) rs[k++] = tiles[j] + 1, rs[k++] = 4;
  rs[k++] = tg_dim(t, 1 + nsp);
  t = tg_contiguous_backward(tg_reshape(t, rs, nd));
  for (int j = nsp - 1; j >= 0; j--) {
    int ta = 1 + 2 * j;
    if (tg_shape(t, rs) != nd) return NONE;
    for (int i = 0; i < nd; i++) b0[2 * i] = b1[2 * i] = 0, b0[2 * i + 1] = b1[2 * i + 1] = rs[i];
    b0[2 * ta + 1] = tiles[j];
    b1[2 * ta] = 1, b1[2 * ta + 3] = a - 4;
    tg_tensor parts[2] = {tg_shrink(t, b0, 2 * nd), tg_shrink(t, b1, 2 * nd)};
    t = tg_cat(parts, 2, ta + 1);
  }
  int perm[2 + 2 * 3], np = 0;
  for (int j = 0; j < nsp; j++) perm[np++] = 2 + 2 * j;
  perm[np++] = 0;
  for (int j = 0; j < nsp; j++) perm[np++] = 1 + 2 * j;
  perm[np++] = nd - 1;
  return tg_permute(t, perm, np);
}

/* The gradient of c @ t (c constant) for t, as the same kind of matmul: c^T @ g, stored in the
 * layout of t (autograd's general matmul rule summed over a broadcast axis into a transposed
 * layout, and every pass of the backward was followed by a transposing copy) */
static void mat_grad(UOp *out, UOp *g, UOp *const *in, int n, UOp **grads) {
  (void)out, (void)n;
  tg_scope_begin();
  UOp *gt = t_get(tg_matmul(tg_transpose(t_wrap(uop_ref(in[1])), 0, 1), t_wrap(uop_ref(g))), "WINO");
  grads[0] = gt ? uop_ref(gt) : NULL;
  grads[1] = NULL;
  tg_scope_end();
}

/* mat (m x n, row-major) applied along axis ax of t (size n there): out[i] = sum_k mat[i][k] t[k] */
static tg_tensor apply_mat(tg_tensor t, UOp *u, int ax, const double *mat, int m, int n) {
  tg_dtype dt = (tg_dtype)u->dtype, mdt = dt == TG_FLOAT64 ? TG_FLOAT64 : TG_FLOAT32;
  tg_opts co = on_device(u, mdt);
  /* a matmul of the (m, n) matrix with t: the matmul kernels hold the m outputs of each point in
   * registers and read each input once (a sum of n shrinks times coefficient columns was a
   * reduction kernel per output row; rows joined by a cat computed every row's terms under masks for
   * every output; bringing ax to the front made transposing copies) */
  double md[64];
  float mf[64];
  for (int i = 0; i < m * n; i++) md[i] = mat[i], mf[i] = (float)mat[i];
  /* the matrix in t's dtype, as tinygrad's: given in float32 (float64) and cast */
  tg_tensor c = tg_from_data(mdt == TG_FLOAT64 ? (const void *)md : (const void *)mf, (const int64_t[]){m, n}, 2, &co);
  if (dt != mdt) c = tg_cast(c, dt);
  /* (pre, n, post) -> (pre, m, post): one (m, n) @ (n, post) per leading index, no copy of t */
  int64_t pre = 1, post = 1, sh[12];
  for (int i = 0; i < u->ndim; i++) {
    sh[i] = i == ax ? m : u->shape[i];
    if (i < ax) pre *= u->shape[i];
    if (i > ax) post *= u->shape[i];
  }
  tg_tensor t3 = tg_reshape(t, (const int64_t[]){pre, n, post}, 3), r = tg_matmul(c, t3);
  UOp *ru = t_get(r, "WINO"), *ins[2] = {t_get(t3, "WINO"), t_get(c, "WINO")};
  if (ru && ins[0] && ins[1]) ag_set_custom_grad(ru, ins, 2, mat_grad);
  return tg_reshape(r, sh, u->ndim);
}

/* apply_mat along axes 0..nsp-1, one pass per axis, each materialized before the next: fused, every
 * output point summed all 36 (2-D) products of its tile, twice the time of the two 6-term passes and
 * the memory between them */
static tg_tensor apply_mats(tg_tensor t, int nsp, const double *mat, int m, int n) {
  for (int j = 0; j < nsp; j++) {
    if (j) t = tg_contiguous_backward(tg_contiguous(t));
    UOp *u = t_get(t, "WINO");
    if (!u) return NONE;
    t = apply_mat(t, u, j, mat, m, n);
  }
  return t;
}

/* The channel sums' gradients, (T, N, cin) @ (T, cin, cout): the input's against the transposed
 * transformed weight stored as such (read through a transposed view, the matmul summed along the
 * contiguous axis of both operands, a third of the step of a 5x5 convolution), the weight's over
 * chunks of tiles (below) */
static void chansum_grad(UOp *out, UOp *g, UOp *const *in, int n, UOp **grads) {
  (void)out, (void)n;
  tg_scope_begin();
  tg_tensor gt = t_wrap(uop_ref(g)), vt = t_wrap(uop_ref(in[0])), ut = t_wrap(uop_ref(in[1]));
  UOp *gv = t_get(tg_matmul(gt, tg_contiguous(tg_transpose(ut, 1, 2))), "WINO");
  /* the weight's: a sum over N = batch * tiles, long against the (cin, cout) output, whose kernels
   * keep a block of cin in registers and stream N once per block from memory; split into chunks of
   * a few hundred that stay in the cache across the blocks, summed afterwards */
  int64_t bt = tg_dim(vt, 0), nn = tg_dim(vt, 1), ci = tg_dim(vt, 2), co = tg_dim(gt, 2), ch = 0;
  for (int64_t d = 512; d >= 128 && !ch; d--)
    if (nn % d == 0 && nn / d > 1) ch = d;
  tg_tensor wg;
  if (ch) {
    tg_tensor vc = tg_reshape(vt, (const int64_t[]){bt, nn / ch, ch, ci}, 4);
    tg_tensor gc = tg_reshape(gt, (const int64_t[]){bt, nn / ch, ch, co}, 4);
    wg = tg_sum(tg_contiguous(tg_matmul(tg_transpose(vc, 2, 3), gc)), (const int[]){1}, 1, false);
  } else
    wg = tg_matmul(tg_transpose(vt, 1, 2), gt);
  UOp *gu = t_get(wg, "WINO");
  grads[0] = gv ? uop_ref(gv) : NULL;
  grads[1] = gu ? uop_ref(gu) : NULL;
  tg_scope_end();
}

tg_tensor wino_conv(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, int64_t groups, int nsp,
                    const int64_t *pads, tg_dtype dtype) {
  UOp *a = t_get(x, fn), *w = a ? t_get(weight, fn) : NULL;
  if (!a || !w) return NONE;
  int64_t bs = a->shape[0], cout = w->shape[0], cin = w->shape[1], rcout = cout / groups;
  const Wvar *v = &WV[w->shape[2] == 5];
  /* Transforms in float16 or bfloat16 lose too much (with a bfloat16 operand, 4% of the largest
   * output through F(4, 3), 4.5% through F(4, 5)): they run in float32, and the result is cast to
   * the operands' promoted dtype below (tinygrad's run in the operands' dtypes) */
  if ((a->dtype == TG_FLOAT16 || a->dtype == TG_BFLOAT16 || w->dtype == TG_FLOAT16 || w->dtype == TG_BFLOAT16))
    x = tg_cast(x, TG_FLOAT32), weight = tg_cast(weight, TG_FLOAT32);
  /* lpads: the channels-last input's pads, (bs, sp..., C) */
  int64_t outs[3], tiles[3], lpads[2 * (2 + 3)] = {0}, T = 1, N = bs;
  for (int j = 0; j < nsp; j++) {
    int64_t sp = a->shape[2 + j];
    outs[j] = sp + pads[2 * j] + pads[2 * j + 1] - (v->r - 1);
    tiles[j] = ceil_div(outs[j], 4);
    lpads[2 * (1 + j)] = pads[2 * j];
    /* 4 * (tiles + 1) >= the padded input (4 * tiles + r - 1 would do: the rest is never read) */
    lpads[2 * (1 + j) + 1] = 4 * tiles[j] + 4 - sp - pads[2 * j];
    T *= v->a, N *= tiles[j];
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
  /* tiles: (a..., bs, tiles..., C); the input transform's gradient is materialized before the tiles'
   * overlaps are summed back into the input */
  tg_tensor vt = tile_windows(tg_pad(xl, lpads, 2 * n, 0.0), nsp, tiles, v->a);
  vt = tg_contiguous_backward(tg_contiguous(apply_mats(tg_contiguous_backward(vt), nsp, v->bt, v->a, v->a)));
  /* (T, N, groups, cin) -> (T * groups, N, cin); one group: a plain reshape, which the kernels
   * index without the div/mod chains of a permute of size-1 dims */
  if (groups == 1) vt = tg_reshape(vt, (const int64_t[]){T, N, cin}, 3);
  else
    vt = tg_reshape(tg_permute(tg_reshape(vt, (const int64_t[]){T, N, groups, cin}, 4), (const int[]){0, 2, 1, 3}, 4),
                    (const int64_t[]){T * groups, N, cin}, 3);
  /* weight (groups, rcout, cin, r...) -> (r..., groups, cin, rcout) -> (a..., groups, cin, rcout) */
  int64_t ws[3 + 3];
  ws[0] = groups, ws[1] = rcout, ws[2] = cin;
  for (int j = 0; j < nsp; j++) ws[3 + j] = v->r;
  np = 0;
  for (int j = 0; j < nsp; j++) perm[np++] = 3 + j;
  perm[np++] = 0, perm[np++] = 2, perm[np++] = 1;
  tg_tensor ut = tg_permute(tg_reshape(weight, ws, 3 + nsp), perm, np);
  ut = tg_contiguous_backward(tg_contiguous(apply_mats(ut, nsp, v->g, v->a, v->r)));
  ut = tg_reshape(ut, (const int64_t[]){T * groups, cin, rcout}, 3);
  /* the channel sums, one matmul per transformed point and group: (T * groups, N, rcout) ->
   * (a..., bs, tiles..., cout) */
  tg_tensor m;
  if (dtype == TG_DTYPE_DEFAULT) {
    m = tg_matmul(vt, ut);
    UOp *mu = t_get(m, fn), *ins[2] = {t_get(vt, fn), t_get(ut, fn)};
    if (mu && ins[0] && ins[1]) ag_set_custom_grad(mu, ins, 2, chansum_grad);
  } else {
    m = tg_matmul_dtype(vt, ut, dtype); /* autograd's matmul and cast rules give its gradient */
  }
  m = tg_contiguous_backward(m);
  if (groups > 1) m = tg_permute(tg_reshape(m, (const int64_t[]){T, groups, N, rcout}, 4), (const int[]){0, 2, 1, 3}, 4);
  int64_t ms[3 + 1 + 3 + 1];
  int r = 0;
  for (int j = 0; j < nsp; j++) ms[r++] = v->a;
  ms[r++] = bs;
  for (int j = 0; j < nsp; j++) ms[r++] = tiles[j];
  ms[r++] = cout;
  m = apply_mats(tg_reshape(m, ms, r), nsp, v->at, 4, v->a); /* (4..., bs, tiles..., cout) */
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
  y = tg_cast(y, dtype != TG_DTYPE_DEFAULT ? dtype : tg_dtype_promote((tg_dtype)a->dtype, (tg_dtype)w->dtype));
  if (bias.id) y = tg_add(y, bias); /* bias (cout,) broadcasts along the last dim */
  /* stored channels-last, returned as the (bs, cout, o...) view */
  y = tg_contiguous_backward(tg_contiguous(y));
  np = 0;
  perm[np++] = 0, perm[np++] = n - 1;
  for (int j = 0; j < nsp; j++) perm[np++] = 1 + j;
  return op_scope_done(o, tg_permute(y, perm, n));
}
