/*
 * image.c -- IMAGE=1: convolutions and matmuls through 2-D images on GPU devices that have them
 * (OpenCL's image2d_t, RGBA float32 texels), tinygrad's image_conv2d / image_dot in our own form.
 *
 * In: the arguments of tg_conv2d / tg_matmul, already checked. Out: the same values, computed with
 * the input, the weight and the result each held in an image of float4 texels, channels-last
 * (NHWC) with the channels padded to multiples of 4, so that one texel is four channels of one
 * pixel. The kernels read them with read_imagef and write the result with write_imagef (see
 * codegen's image_lane_upcast and the renderer's tg_rimg). Invariants: an image node (g_image) is
 * float32 with a multiple of 4 elements; everything around it is ordinary movement ops, so
 * autograd, the scheduler and TinyJit see nothing new but a materialized buffer of another kind.
 */
#include <stdio.h>

#include "compose.h"

#define NONE ((tg_tensor){0})

int image_mode(const char *fn, const UOp *a, const UOp *w, const UOp *b) {
  int64_t level = getenv_int_in("IMAGE", 0, 0, 2);
  if (level <= 0 || a->device != w->device || (b && b->device != a->device)) return 0;
  Device *dev = device_by_id(a->device);
  /* tinygrad's image path is for GPU devices; the CPU has no image memory and keeps its kernels */
  if (!dev || !dev->caps.gpu) return 0;
  if (!dev->caps.images) {
    tg_set_error(
        TG_ERR_INVALID,
        "%s: IMAGE=%lld needs 2-D images, and %s has none (CL_DEVICE_IMAGE_SUPPORT is false); unset IMAGE",
        fn, (long long)level, dev->name);
    return -1;
  }
  /* images hold float32 texels: other dtypes take the ordinary kernels */
  if (a->dtype != TG_FLOAT32 || w->dtype != TG_FLOAT32 || (b && b->dtype != TG_FLOAT32)) return 0;
  return 1;
}

/* Is there a w x h image (w, h within the device's limits) of exactly `texels` texels? */
static bool texels_fit(const Device *dev, int64_t texels, int64_t rows) {
  int64_t mw = dev->caps.image_max_w, mh = dev->caps.image_max_h;
  int64_t h = rows > 0 && texels % rows == 0 ? rows : 1;
  if (texels / h <= mw && h <= mh) return true;
  for (int64_t c = mw < texels ? mw : texels; c >= 1; c--)
    if (texels % c == 0 && texels / c <= mh) return true;
  return false;
}

static int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }

bool image_conv_fits(int device, int64_t bs, int64_t cin, int64_t iy, int64_t ix, int64_t cout, int64_t kh, int64_t kw,
                     int64_t groups, const int64_t *s, const int64_t *d, const int64_t *pads) {
  const Device *dev = device_by_id(device);
  if (!dev) return false;
  int64_t cinp = round4(cin), rcoutp = round4(cout / groups);
  int64_t oy = (iy + pads[0] + pads[1] - d[0] * (kh - 1) - 1) / s[0] + 1, ox = (ix + pads[2] + pads[3] - d[1] * (kw - 1) - 1) / s[1] + 1;
  return texels_fit(dev, bs * iy * ix * groups * cinp / 4, bs * iy) &&
         texels_fit(dev, groups * rcoutp / 4 * kh * kw * cinp, groups * rcoutp / 4) &&
         texels_fit(dev, bs * oy * ox * groups * rcoutp / 4, bs * oy);
}

/* t (float32, last dim a multiple of 4) materialized in an image of `rows` rows where the device
 * allows, else the nearest shape that fits: any w x h with w*h texels holds it, since texel i is
 * at (i % w, i / w). */
static tg_tensor image_contig(const char *fn, tg_tensor t, int64_t rows) {
  UOp *u = t_get(t, fn);
  if (!u) return NONE;
  Device *dev = device_by_id(u->device);
  int64_t n = 1;
  for (int i = 0; i < u->ndim; i++) n *= u->shape[i];
  int64_t texels = n / 4, mw = dev->caps.image_max_w, mh = dev->caps.image_max_h;
  int64_t h = rows > 0 && texels % rows == 0 ? rows : 1, w = texels / h;
  if (w > mw || h > mh) {
    w = 0;
    for (int64_t c = mw < texels ? mw : texels; c >= 1 && !w; c--)
      if (texels % c == 0 && texels / c <= mh) w = c;
    if (!w)
      return op_fail("%s: IMAGE: %lld texels fit no image of %s (at most %lld x %lld); unset IMAGE", fn,
                     (long long)texels, dev->name, (long long)mw, (long long)mh);
    h = texels / w;
  }
  return t_wrap(g_image(u, w, h));
}

tg_tensor image_conv2d(const char *fn, tg_tensor x, tg_tensor weight, tg_tensor bias, int64_t groups,
                       const int64_t *s, const int64_t *d, const int64_t *pads) {
  UOp *a = t_get(x, fn), *w = a ? t_get(weight, fn) : NULL;
  if (!a || !w) return NONE;
  int64_t bs = a->shape[0], iy = a->shape[2], ix = a->shape[3], cout = w->shape[0], cin = w->shape[1],
          kh = w->shape[2], kw = w->shape[3];
  int64_t rcout = cout / groups, cinp = round4(cin), rcoutp = round4(rcout);
  OpScope o = op_scope_begin(fn);
  /* the input, channels-last with each group's channels padded to 4: (bs, iy, ix, groups, cinp),
   * texel rows of ix*groups*cinp/4 */
  tg_tensor xi = tg_reshape(x, (const int64_t[]){bs, groups, cin, iy, ix}, 5);
  if (cinp != cin) xi = tg_pad(xi, (const int64_t[]){0, 0, 0, 0, 0, cinp - cin, 0, 0, 0, 0}, 10, 0.0);
  xi = image_contig(fn, tg_permute(xi, (const int[]){0, 3, 4, 1, 2}, 5), bs * iy);
  /* viewed back as (bs, groups*cinp, iy, ix), padded and cut into windows (bs, C, oy, ox, kh, kw) */
  xi = tg_permute(tg_reshape(xi, (const int64_t[]){bs, iy, ix, groups * cinp}, 4), (const int[]){0, 3, 1, 2},
                  4);
  xi = tg_pad(xi, (const int64_t[]){0, 0, 0, 0, pads[0], pads[1], pads[2], pads[3]}, 8, 0.0);
  int64_t xs[4] = {bs, groups * cinp, iy + pads[0] + pads[1], ix + pads[2] + pads[3]}, k[2] = {kh, kw};
  tg_tensor win = pool_windows(xi, xs, 4, 2, k, s, d);
  UOp *wu = t_get(win, fn);
  if (!wu) return op_scope_done(o, NONE);
  int64_t oy = wu->shape[2], ox = wu->shape[3];
  win = tg_reshape(win, (const int64_t[]){bs, groups, cinp, oy, ox, kh, kw}, 7);
  win = tg_permute(win, (const int[]){0, 3, 4, 1, 2, 5, 6}, 7); /* (bs, oy, ox, groups, cinp, kh, kw) */
  win = tg_reshape(win, (const int64_t[]){bs, oy, ox, groups, 1, cinp, kh, kw}, 8);
  win = tg_expand(win, (const int64_t[]){bs, oy, ox, groups, rcoutp, cinp, kh, kw}, 8);
  /* the weight: a texel is four output channels of one (group, input channel, ky, kx):
   * (groups, rcoutp/4, kh, kw, cinp, 4) */
  tg_tensor wi = tg_reshape(weight, (const int64_t[]){groups, rcout, cin, kh, kw}, 5);
  if (cinp != cin || rcoutp != rcout)
    wi = tg_pad(wi, (const int64_t[]){0, 0, 0, rcoutp - rcout, 0, cinp - cin, 0, 0, 0, 0}, 10, 0.0);
  wi = tg_reshape(wi, (const int64_t[]){groups, rcoutp / 4, 4, cinp, kh, kw}, 6);
  wi = image_contig(fn, tg_permute(wi, (const int[]){0, 1, 4, 5, 3, 2}, 6), groups * rcoutp / 4);
  wi = tg_permute(wi, (const int[]){0, 1, 5, 4, 2, 3}, 6); /* back to (groups, rcoutp/4, 4, cinp, kh, kw) */
  wi = tg_reshape(wi, (const int64_t[]){1, 1, 1, groups, rcoutp, cinp, kh, kw}, 8);
  /* the convolution, stored channels-last into the result's image: (bs, oy, ox, groups, rcoutp) */
  tg_tensor r = tg_sum(tg_mul(win, wi), (const int[]){-1, -2, -3}, 3, false);
  r = image_contig(fn, r, bs * oy);
  if (rcoutp != rcout) r = tg_shrink(r, (const int64_t[]){0, bs, 0, oy, 0, ox, 0, groups, 0, rcout}, 10);
  r = tg_permute(tg_reshape(r, (const int64_t[]){bs, oy, ox, cout}, 4), (const int[]){0, 3, 1, 2}, 4);
  if (bias.id) r = tg_add(r, tg_reshape(bias, (const int64_t[]){1, cout, 1, 1}, 4));
  return op_scope_done(o, r);
}

/* x (..., m, k) @ w (k, n) as a 1x1 convolution of (1, k, M, 1) with (n, k, 1, 1), M = the rows of x
 * together. */
tg_tensor image_dot(const char *fn, tg_tensor x, tg_tensor w) {
  UOp *a = t_get(x, fn), *b = a ? t_get(w, fn) : NULL;
  if (!a || !b) return NONE;
  int64_t kdim = b->shape[0], n = b->shape[1], M = 1;
  for (int i = 0; i < a->ndim - 1; i++) M *= a->shape[i];
  OpScope o = op_scope_begin(fn);
  tg_tensor cx = tg_permute(tg_reshape(x, (const int64_t[]){1, M, 1, kdim}, 4), (const int[]){0, 3, 1, 2}, 4);
  tg_tensor cw = tg_reshape(tg_transpose(w, 0, 1), (const int64_t[]){n, kdim, 1, 1}, 4);
  static const int64_t one[2] = {1, 1}, zero[4] = {0, 0, 0, 0};
  tg_tensor r = image_conv2d(fn, cx, cw, NONE, 1, one, one, zero); /* (1, n, M, 1) */
  int64_t os[64];
  int no = 0;
  for (int i = 0; i < a->ndim - 1; i++) os[no++] = a->shape[i];
  os[no++] = n;
  r = tg_reshape(tg_permute(r, (const int[]){0, 2, 3, 1}, 4), os, no);
  return op_scope_done(o, r);
}
