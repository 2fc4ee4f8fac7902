/*
 * compose.h -- helpers shared by the files that build public ops out of other public ops (nnops.c,
 * indexing.c, processing.c): a private scope per op whose failures are reported under the op's own
 * name, argument errors, and shape formatting for messages.
 */
#ifndef TG_COMPOSE_H
#define TG_COMPOSE_H

#include "tensor.h"

/* Records TG_ERR_INVALID with a printf message; returns none. */
tg_tensor op_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The private scope of a composed op; `had` remembers whether an error was pending before it. */
typedef struct {
  const char *fn;
  bool had;
} OpScope;
OpScope op_scope_begin(const char *fn);
/* Makes sure a failure inside the op is reported as "fn: <inner message>" (or "fn: failed"). */
void op_relabel(OpScope o);
/* Closes the scope, moving r (created inside it) to the caller's scope; none + relabel on failure. */
tg_tensor op_scope_done(OpScope o, tg_tensor r);

/* tinygrad's _pool (nnops.c): windows of the trailing nk dims of x (shape xs, n dims) with kernel k,
 * stride s and dilation d, as movement ops only: (..., i...) -> (..., o..., k...). */
tg_tensor pool_windows(tg_tensor x, const int64_t *xs, int n, int nk, const int64_t *k, const int64_t *s,
                       const int64_t *d);

/* n-d convolution (nnops.c): conv_opts_nd resolves tg_window_opts for nsp spatial dims (pads as
 * (before, after) per dim; outpad only when transposed; it checks opts->dtype); conv_nd_resolved
 * convolves with them, summing in dtype (TG_DTYPE_DEFAULT: the plain convolution). */
bool conv_opts_nd(const char *fn, const tg_window_opts *opts, int nsp, bool transposed, int64_t *groups,
                  int64_t *s, int64_t *d, int64_t *pads, int64_t *outpad);
tg_tensor conv_nd_resolved(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, int64_t groups,
                           const int64_t *s, const int64_t *d, const int64_t *pads, tg_dtype dtype);

/* IMAGE (image.c): image_mode says whether tg_conv2d / tg_matmul of a (weight w, bias b or NULL)
 * take the image path: 1 yes, 0 no (IMAGE unset, a CPU device, or not float32), -1 error recorded
 * (IMAGE set on a GPU device without images). image_conv2d takes checked tg_conv2d arguments (pads
 * as (top, bottom, left, right)); image_dot a 2-D w. */
int image_mode(const char *fn, const UOp *a, const UOp *w, const UOp *b);
tg_tensor image_conv2d(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, int64_t groups, const int64_t *s,
                       const int64_t *d, const int64_t *pads);
tg_tensor image_dot(const char *fn, tg_tensor x, tg_tensor w);
/* Do the images of such a convolution (input, weight, result) each fit the device's image limits
 * (an exact w x h of its texels)? cin is the weight's (per group); pads (top, bottom, left, right).
 * Where one does not (a prime row count past the width limit), the ordinary kernels compute it. */
bool image_conv_fits(int device, int64_t bs, int64_t cin, int64_t iy, int64_t ix, int64_t cout, int64_t kh, int64_t kw,
                     int64_t groups, const int64_t *s, const int64_t *d, const int64_t *pads);

/* WINO (winograd.c): wino_applies says whether a convolution of input a and weight w over nsp spatial
 * dims with strides s, dilations d, pads (before, after per dim) and groups takes Winograd's tiles:
 * F(4, 3) under WINO=1 (every kernel dim 3, stride and dilation 1, float, no symbolic or empty dims),
 * and under WINO=2 also F(4, 5) (every kernel dim 5, 1 or 2 dims), where the tiles pay; wino_conv
 * computes it from checked arguments, the channel sums in dtype (TG_DTYPE_DEFAULT, TG_FLOAT32 or
 * TG_FLOAT64). */
bool wino_applies(const UOp *a, const UOp *w, int nsp, const int64_t *s, const int64_t *d, const int64_t *pads,
                  int64_t groups);
tg_tensor wino_conv(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, int64_t groups, int nsp,
                    const int64_t *pads, tg_dtype dtype);

/* [0, n) as int32 on a's device, n = a's size along dim (tinygrad's arange(x.shape[dim])): symbolic
 * when that dim is (a tg_sym size), so the positions of a scan or a mask over a symbolic axis hold
 * for every value of its variable. */
tg_tensor dim_arange(UOp *a, int dim);
/* Is dt float16/bfloat16 on a device without half arithmetic (the CPU, PoCL)? A matmul or convolution
 * there multiplies and sums in float32 and rounds once, as tinygrad's kernels do (a product that only
 * feeds the float32 accumulator is not rounded), on the float32 kernels. */
bool half_via_float32(UOp *a, tg_dtype dt);
/* creation options: dtype dt on a's device */
tg_opts on_device(UOp *a, tg_dtype dt);
/* an int32 arange on a's device */
tg_tensor iarange(UOp *a, double start, double stop, double step);
/* Is dim of x a symbolic size? (false for an invalid handle) */
bool t_dim_sym(tg_tensor x, int dim);

/* Ceiling division for window sizes (b > 0). */
int64_t ceil_div(int64_t a, int64_t b);

/* Shape strings for messages, in compound-literal buffers (valid for the enclosing expression). */
#define SHP(u) fmt_shape((char[256]){0}, 256, (u)->shape, (u)->ndim)
#define FSHP(s, n) fmt_shape((char[256]){0}, 256, (s), (n))

#endif
