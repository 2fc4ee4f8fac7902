/*
 * test_cl_image.c -- IMAGE=1 on OpenCL (PoCL in `make test`): conv2d and matmul through 2-D images
 * give the values of IMAGE=0 (channels not a multiple of 4, stride, padding, dilation, groups,
 * bias; matmuls of odd sizes and batched inputs), their kernels read and write images
 * (read_imagef / write_imagef / image2d_t in the generated source), image buffers copy in and out,
 * gradients flow through the image path, a TinyJit replays it, the CPU ignores IMAGE, and a device
 * without images refuses IMAGE (conv2d and matmul fail naming it; codegen refuses image kernels).
 * Skips (saying why) only when this machine has no OpenCL device at all.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>

#include "codegen/codegen.h"
#include "runtime/device.h"
#include "schedule/schedule.h"
#include "tensor/tensor.h"
#include "test.h"

static Device *g_cl;

static tg_tensor mk(const char *dev, const int64_t *shape, int nd, float seed) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  float *d = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) d[i] = sinf((float)i * 0.37f + seed) * 1.5f;
  tg_tensor t = tg_from_data(d, shape, nd, TG_OPTS(.device = dev));
  free(d);
  return t;
}

/* the values of t as float32 on the host (malloc'd), NULL on failure */
static float *values(tg_tensor t, int64_t *n) {
  tg_tensor h = tg_to(t, "CPU");
  *n = tg_numel(h);
  float *v = malloc(sizeof(float) * (size_t)(*n ? *n : 1));
  if (tg_data(h, v, sizeof(float) * (size_t)*n) != TG_OK) {
    free(v);
    return NULL;
  }
  return v;
}

/* The sources of every kernel realizing t on CL would run, concatenated (malloc'd). */
static char *kernel_sources(tg_tensor t) {
  UOp *u = t_get(t, "kernel_sources");
  Schedule s;
  int tbuf;
  if (schedule_build(&s, &u, 1, &tbuf) != TG_OK) return NULL;
  size_t len = 1;
  char *all = calloc(1, 1);
  for (int i = 0; i < s.nitems; i++) {
    if (s.items[i].kind != SI_KERNEL) continue;
    KernelCode *kc = codegen_for(s.items[i].ast, &g_cl->caps, NULL);
    if (!kc) continue;
    size_t n = strlen(kc->src);
    all = realloc(all, len + n);
    memcpy(all + len - 1, kc->src, n + 1);
    len += n;
    kernel_code_free(kc);
  }
  schedule_free(&s);
  return all;
}

typedef tg_tensor (*build_fn)(const char *dev, const void *arg);

/* f on CL with IMAGE=1 against f on CL with IMAGE=0 (and on the CPU); with `images`, checks the
 * IMAGE=1 kernels read and write images. */
static void same_with_images(const char *what, build_fn f, const void *arg, double tol, bool images) {
  BEGIN;
  float *v[3] = {NULL, NULL, NULL};
  int64_t n[3] = {0, 0, 0};
  for (int i = 0; i < 3; i++) {
    tg_context_begin();
    tg_context_set("IMAGE", i == 1 ? "1" : "0");
    tg_tensor x = f(i == 2 ? "CPU" : "CL", arg);
    CHECK_MSG(x.id != 0, "%s (IMAGE=%d): %s", what, i == 1, tg_last_error());
    if (x.id && i == 1 && images) {
      char *src = kernel_sources(x);
      CHECK_MSG(src && strstr(src, "read_imagef(") && strstr(src, "write_imagef(") &&
                    strstr(src, "read_only image2d_t") && strstr(src, "write_only image2d_t"),
                "%s: the IMAGE=1 kernels do not use images", what);
      free(src);
    }
    if (x.id) {
      CHECK_MSG(tg_realize(x) == TG_OK, "%s (IMAGE=%d): %s", what, i == 1, tg_last_error());
      v[i] = values(x, &n[i]);
      CHECK_MSG(v[i] != NULL, "%s: %s", what, tg_last_error());
    }
    tg_context_end();
  }
  if (v[0] && v[1] && v[2]) {
    CHECK_MSG(n[0] == n[1] && n[0] == n[2] && n[0] > 0, "%s: %lld / %lld / %lld values", what,
              (long long)n[0], (long long)n[1], (long long)n[2]);
    int bad = 0;
    for (int64_t i = 0; i < n[0] && i < n[1] && i < n[2]; i++) {
      double a = v[0][i], b = v[1][i], c = v[2][i];
      bool ok = fabs(a - b) <= tol * (1 + fabs(a)) && fabs(c - b) <= tol * (1 + fabs(c));
      if (!ok && bad++ < 3)
        fprintf(stderr, "  %s[%lld]: IMAGE=0 %.9g, IMAGE=1 %.9g, CPU %.9g\n", what, (long long)i, a, b, c);
    }
    CHECK_MSG(bad == 0, "%s: %d values differ", what, bad);
  }
  free(v[0]), free(v[1]), free(v[2]);
  tg_clear_error();
  END;
}

typedef struct {
  int64_t bs, cin, h, w, cout, kh, kw, groups, stride, pad, dil;
  bool bias;
} ConvCase;

static tg_tensor f_conv(const char *dev, const void *arg) {
  const ConvCase *c = arg;
  tg_tensor x = mk(dev, TG_SHAPE(c->bs, c->cin * c->groups, c->h, c->w), 0.1f);
  tg_tensor w = mk(dev, TG_SHAPE(c->cout, c->cin, c->kh, c->kw), 0.7f);
  tg_tensor b = c->bias ? mk(dev, TG_SHAPE(c->cout), 2.0f) : (tg_tensor){0};
  return tg_conv2d(x, w, b,
                   TG_CONV2D_OPTS(.groups = c->groups, .stride = {c->stride, c->stride}, .padding = {c->pad},
                                  .npadding = 1, .dilation = {c->dil, c->dil}));
}

typedef struct {
  int64_t xs[3];
  int nx;
  int64_t k, n;
} DotCase;

static tg_tensor f_dot(const char *dev, const void *arg) {
  const DotCase *c = arg;
  int64_t xs[4];
  for (int i = 0; i < c->nx; i++) xs[i] = c->xs[i];
  xs[c->nx] = c->k;
  return tg_matmul(mk(dev, xs, c->nx + 1, 0.3f), mk(dev, TG_SHAPE(c->k, c->n), 1.1f));
}

TEST(image_conv2d_equals_plain) {
  if (!g_cl) return;
  static const ConvCase cases[] = {
      {2, 4, 9, 9, 8, 3, 3, 1, 1, 0, 1, false},    /* channels multiples of 4 */
      {2, 3, 10, 7, 5, 3, 3, 1, 1, 1, 1, true},    /* 3 -> 5 channels (both padded to 4), padding, bias */
      {1, 1, 28, 28, 32, 5, 5, 1, 1, 0, 1, false}, /* beautiful_mnist's first layer */
      {2, 6, 11, 12, 7, 3, 2, 1, 2, 1, 1, true},   /* stride 2, a 3x2 kernel */
      {1, 5, 12, 12, 4, 3, 3, 1, 1, 2, 2, false},  /* dilation 2, padding 2 */
      {2, 3, 8, 8, 6, 3, 3, 2, 1, 1, 1, true},     /* groups 2: 3 channels each, 3 outputs each */
      {1, 1, 7, 7, 4, 3, 3, 4, 1, 1, 1, false},    /* depthwise-like: 4 groups of one channel */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char what[96];
    const ConvCase *c = &cases[i];
    snprintf(what, sizeof what, "conv2d case %zu (cin %lld cout %lld groups %lld stride %lld pad %lld)", i,
             (long long)c->cin, (long long)c->cout, (long long)c->groups, (long long)c->stride,
             (long long)c->pad);
    same_with_images(what, f_conv, c, 1e-4, true);
  }
}

TEST(image_matmul_equals_plain) {
  if (!g_cl) return;
  static const DotCase cases[] = {
      {{16}, 1, 32, 8},     /* multiples of 4 */
      {{33}, 1, 65, 17},    /* none a multiple of 4 */
      {{3, 5}, 2, 7, 10},   /* a batch of (5, 7) @ (7, 10) */
      {{0}, 0, 9, 6},       /* a vector @ a matrix */
      {{2, 2, 3}, 3, 4, 1}, /* one output column */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char what[64];
    snprintf(what, sizeof what, "matmul case %zu (k %lld n %lld)", i, (long long)cases[i].k,
             (long long)cases[i].n);
    same_with_images(what, f_dot, &cases[i], 1e-4, true);
  }
}

/* An image buffer holds its values: written and read back whole, and in part (rows and a partial row). */
TEST(image_buffer_copies) {
  if (!g_cl) return;
  tg_clear_error();
  Buffer *b = buffer_new_image(g_cl, 5, 3);
  CHECK_MSG(b != NULL, "%s", tg_last_error());
  if (!b) return;
  CHECK(b->nbytes == 5 * 3 * 16 && b->img_w == 5 && b->img_h == 3);
  float in[60], out[60], part[60];
  for (int i = 0; i < 60; i++) in[i] = (float)i * 0.5f - 7.0f, out[i] = part[i] = -1.0f;
  CHECK(buffer_copyin(b, in, sizeof in) == TG_OK);
  CHECK(buffer_copyout(b, out, sizeof out) == TG_OK);
  CHECK(memcmp(in, out, sizeof in) == 0);
  CHECK(buffer_copyout(b, part, 28 * sizeof(float)) == TG_OK); /* one row and two texels */
  CHECK(memcmp(in, part, 28 * sizeof(float)) == 0 && part[28] == -1.0f);
  /* to and from a plain buffer of the device, and into another image of other dimensions */
  Buffer *p = buffer_new(g_cl, sizeof in), *b2 = buffer_new_image(g_cl, 3, 5);
  CHECK(p && b2);
  if (p && b2) {
    memset(out, 0, sizeof out);
    CHECK(buffer_copy(p, b, sizeof in) == TG_OK);
    CHECK(buffer_copy(b2, p, sizeof in) == TG_OK);
    CHECK(buffer_copyout(b2, out, sizeof out) == TG_OK);
    CHECK(memcmp(in, out, sizeof in) == 0);
    Buffer *b3 = buffer_new_image(g_cl, 15, 1);
    CHECK(b3 && buffer_copy(b3, b2, sizeof in) == TG_OK);
    memset(out, 0, sizeof out);
    CHECK(b3 && buffer_copyout(b3, out, sizeof out) == TG_OK && memcmp(in, out, sizeof in) == 0);
    buffer_unref(b3);
  }
  buffer_unref(p), buffer_unref(b2), buffer_unref(b);
  /* limits: a clear error, no crash */
  CHECK(buffer_new_image(g_cl, g_cl->caps.image_max_w + 1, 1) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "exceeds");
  tg_clear_error();
  CHECK(buffer_new_image(device_get("CPU"), 4, 4) == NULL);
  CHECK_STR_CONTAINS(tg_last_error(), "CPU has no 2-D images");
  tg_clear_error();
}

/* Gradients through the image path equal those of the plain path. */
static tg_tensor f_conv_grad(const char *dev, const void *arg) {
  (void)arg;
  tg_tensor x = mk(dev, TG_SHAPE(2, 3, 8, 8), 0.2f), w = mk(dev, TG_SHAPE(5, 3, 3, 3), 0.9f);
  tg_set_requires_grad(w, true);
  tg_tensor loss =
      tg_sum(tg_relu(tg_conv2d(x, w, (tg_tensor){0}, TG_CONV2D_OPTS(.padding = {1}, .npadding = 1))), NULL, 0,
             false);
  CHECK(tg_backward(loss) == TG_OK);
  return tg_grad(w);
}

TEST(image_conv2d_gradient) {
  if (!g_cl) return;
  same_with_images("conv2d weight gradient", f_conv_grad, NULL, 1e-4, false);
}

/* TinyJit captures and replays image kernels (the intermediate images are re-made on replay). */
static tg_tensor jit_body(const tg_tensor *in) {
  return tg_relu(tg_conv2d(in[0], in[1], (tg_tensor){0}, TG_CONV2D_OPTS(.padding = {1}, .npadding = 1)));
}
static tg_status jit_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                        void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = jit_body(in);
  return out[0].id ? TG_OK : tg_last_status();
}

TEST(image_tinyjit_replays) {
  if (!g_cl) return;
  BEGIN;
  tg_context_begin();
  tg_context_set("IMAGE", "1");
  tg_jit *j = tg_jit_new(jit_fn, 1, NULL);
  tg_tensor w = mk("CL", TG_SHAPE(6, 3, 3, 3), 0.4f);
  for (int call = 0; call < 4; call++) {
    tg_tensor x = mk("CL", TG_SHAPE(1, 3, 6, 6), (float)call);
    tg_tensor in[2] = {x, w};
    tg_tensor r = {0};
    CHECK_MSG(tg_jit_call(j, in, 2, NULL, 0, &r) == TG_OK && r.id != 0, "call %d: %s", call, tg_last_error());
    tg_context_set("IMAGE", "0");
    tg_tensor ref = jit_body(in);
    tg_context_set("IMAGE", "1");
    int64_t n1 = 0, n2 = 0;
    float *a = r.id ? values(r, &n1) : NULL, *b = values(ref, &n2);
    CHECK(a && b && n1 == n2 && n1 == 6 * 36);
    for (int64_t i = 0; a && b && i < n1; i++) CHECK_CLOSE(a[i], b[i], 1e-4 * (1 + fabs(b[i])));
    free(a), free(b);
  }
  tg_jit_free(j);
  tg_context_end();
  END;
}

/* On the CPU IMAGE changes nothing (tinygrad's image path is for GPU devices): the same kernels. */
TEST(image_ignored_on_cpu) {
  BEGIN;
  ConvCase c = {1, 3, 6, 6, 5, 3, 3, 1, 1, 1, 1, false};
  tg_context_begin();
  tg_context_set("IMAGE", "1");
  tg_tensor a = f_conv("CPU", &c);
  tg_context_set("IMAGE", "0");
  tg_tensor b = f_conv("CPU", &c);
  tg_context_end();
  CHECK(a.id && b.id);
  uint64_t k0 = tg_global_counters().kernel_count;
  CHECK(tg_realize(a) == TG_OK);
  uint64_t ka = tg_global_counters().kernel_count - k0;
  k0 = tg_global_counters().kernel_count;
  CHECK(tg_realize(b) == TG_OK);
  CHECK(tg_global_counters().kernel_count - k0 == ka);
  END;
}

/* codegen refuses an image kernel for a device without images, with a clear error */
TEST(image_refused_without_images) {
  if (!g_cl) return;
  BEGIN;
  tg_context_begin();
  tg_context_set("IMAGE", "1");
  tg_tensor t = f_dot("CL", &(DotCase){{8}, 1, 8, 8});
  tg_context_end();
  UOp *u = t_get(t, "test");
  Schedule s;
  int tbuf;
  CHECK(u && schedule_build(&s, &u, 1, &tbuf) == TG_OK);
  DeviceCaps caps = g_cl->caps;
  caps.images = false;
  int refused = 0;
  for (int i = 0; u && i < s.nitems; i++) {
    if (s.items[i].kind != SI_KERNEL) continue;
    tg_clear_error();
    KernelCode *kc = codegen_for(s.items[i].ast, &caps, NULL);
    if (!kc && strstr(tg_last_error(), "the device has none")) refused++;
    kernel_code_free(kc);
  }
  CHECK(refused >= 2);
  if (u) schedule_free(&s);
  tg_clear_error();
  /* the tensor layer: conv2d and matmul on a GPU device whose caps say it has no images fail,
   * naming the device and what it lacks (the device's caps are what the ops read) */
  g_cl->caps.images = false;
  tg_context_begin();
  tg_context_set("IMAGE", "1");
  ConvCase c = {1, 3, 6, 6, 5, 3, 3, 1, 1, 1, 1, false};
  tg_tensor r1 = f_conv("CL", &c);
  CHECK(r1.id == 0);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_conv2d: IMAGE=1 needs 2-D images, and CL has none");
  tg_clear_error();
  tg_tensor r2 = f_dot("CL", &(DotCase){{8}, 1, 8, 8});
  CHECK(r2.id == 0);
  CHECK_STR_CONTAINS(tg_last_error(), "tg_matmul: IMAGE=1 needs 2-D images");
  tg_clear_error();
  tg_context_end();
  g_cl->caps.images = true;
  END;
}

/* BEAM over image kernels: the lists that cannot store into an image are no candidates, and leave
 * no error behind (a later call of the program failed with one) */
TEST(image_beam_leaves_no_error) {
  if (!g_cl || !g_cl->caps.images) return;
  BEGIN;
  const int64_t shapes[2][3] = {{1, 3, 5}, {7, 17, 3}};
  for (int k = 0; k < 2; k++) {
    const int64_t *s = shapes[k];
    tg_tensor x = mk("CL", (const int64_t[]){s[0], s[1]}, 2, 0.3f), w = mk("CL", (const int64_t[]){s[1], s[2]}, 2, 1.1f);
    char dir[600];
    snprintf(dir, sizeof dir, "%s", tpath(k ? "beam-image-1" : "beam-image-0")); /* a search, not a cached choice */
    tg_context_begin();
    tg_context_set("BEAM", "1");
    tg_context_set("IMAGE", "1");
    tg_context_set("TINYGRAD_CACHE_DIR", dir);
    tg_tensor y = tg_matmul(x, w);
    tg_status st = tg_realize(y);
    tg_context_end();
    CHECK_MSG(st == TG_OK && tg_last_error() == NULL, "matmul %d: %s", k, tg_last_error() ? tg_last_error() : "");
    tg_clear_error();
    int64_t n = 0;
    float *got = values(y, &n), *want = values(tg_matmul(x, w), &n);
    CHECK(got && want);
    for (int64_t i = 0; got && want && i < n; i++) CHECK_MSG(fabsf(got[i] - want[i]) < 1e-4f, "matmul %d [%lld]", k, (long long)i);
    free(got), free(want);
  }
  END;
}

/* a matmul whose rows make a prime count of texels past the device's image width has no exact image
 * shape: the ordinary kernels compute it (IMAGE=1 was an error there), equal to IMAGE=0 */
TEST(image_matmul_unfactorable_rows) {
  if (!g_cl || !g_cl->caps.images) return;
  BEGIN;
  int64_t p = g_cl->caps.image_max_w > g_cl->caps.image_max_h ? g_cl->caps.image_max_w : g_cl->caps.image_max_h;
  for (bool prime = false; !prime;) {
    p++;
    prime = true;
    for (int64_t q = 2; q * q <= p && prime; q++) prime = p % q != 0;
  }
  tg_tensor x = mk("CL", (const int64_t[]){p, 4}, 2, 0.2f), w = mk("CL", (const int64_t[]){4, 5}, 2, 0.9f);
  tg_context_begin();
  tg_context_set("IMAGE", "1");
  tg_tensor y = tg_matmul(x, w);
  tg_context_end();
  CHECK_MSG(tg_valid(y), "%s", tg_last_error() ? tg_last_error() : "");
  int64_t n = 0;
  float *got = tg_valid(y) ? values(y, &n) : NULL, *want = values(tg_matmul(x, w), &n);
  CHECK(got && want && n == p * 5);
  double md = 0;
  for (int64_t i = 0; got && want && i < n; i++) md = fmax(md, fabs((double)got[i] - want[i]));
  CHECK_MSG(md < 1e-4, "rows %lld: off by %g", (long long)p, md);
  free(got), free(want);
  END;
}

int main(void) {
  tg_clear_error();
  g_cl = device_get("CL");
  if (!g_cl) {
    printf("test_cl_image: SKIPPED -- no OpenCL device here (%s)\n", tg_last_error());
    tg_clear_error();
  } else if (!g_cl->caps.images) {
    printf("test_cl_image: CL:0 has no image support; the image tests check only the error\n");
  }
  int rc = RUN_TESTS();
  tmpdir_remove();
  CHECK(tg_live_count() == 0);
  return rc;
}
