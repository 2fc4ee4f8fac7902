/*
 * test_tc.c -- tensor cores (the TC action, src/codegen/tc.c) without a GPU:
 *  - the layout tables against the PTX ISA's statements of the mma fragments, written here a second
 *    time as the ISA words them (closed forms in groupID and threadID_in_group), and as bijections
 *    lane x element -> tile position;
 *  - the same lowered TC kernels executed on OpenCL (PoCL), where the instruction is emulated with the
 *    table's layout through local memory: results equal NOOPT's and a float64 reference for several
 *    shapes, dtypes, upcasts, a batch, a transposed operand and a fused epilogue. This checks the
 *    index math and that the layout is used consistently; only a GPU checks that the hardware's
 *    layout is the table's;
 *  - CUDA on the compile-only NULL device: the heuristics choose TC on sm_80/sm_90 for float16,
 *    bfloat16 and (ALLOW_TF32=1) float32 matmuls and not otherwise, NVRTC compiles each kernel, its PTX
 *    holds the mma.sync instruction, and ptxas (when $CUDA_PATH/bin/ptxas exists) assembles it for
 *    the arch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "runtime/device.h"
#include "schedule/schedule.h"
#include "tensor/tensor.h"
#include "test.h"
#include "last_kernel.h"

/* ---------------------------------------------------------------------------------------------- */
/* the layouts                                                                                     */

/* PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and "... mma.m16n8k8"
 * (.tf32), with groupID = laneid >> 2 and threadID_in_group = laneid % 4; and "Matrix Fragments for
 * wgmma.mma_async.m64nNk16 / m64nNk8": warp w of the warpgroup holds rows 16 w to 16 w + 15 of A
 * and D in the same per-warp layout, D's repeating every 8 columns. */
static void isa_a(const TensorCore *tc, int lane, int i, int *row, int *col) {
  int g = lane % 32 >> 2, t = lane % 4, w = tc->wg ? lane / 32 : 0;
  if (tc->k == 16) { /* .f16/.bf16 A: a0..a7 */
    *row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
    *col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
  } else { /* .tf32 A: a0..a3 */
    *row = (i == 0 || i == 2) ? g : g + 8;
    *col = (i < 2) ? t : t + 4;
  }
  *row += 16 * w;
}
static void isa_b(const TensorCore *tc, int lane, int i, int *row, int *col) {
  int g = lane >> 2, t = lane % 4;
  if (tc->k == 16) *row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
  else *row = i == 0 ? t : t + 4;
  *col = g;
}
static void isa_c(const TensorCore *tc, int lane, int i, int *row, int *col) {
  int g = lane % 32 >> 2, t = lane % 4, w = tc->wg ? lane / 32 : 0;
  *row = (i % 4 < 2 ? g : g + 8) + 16 * w;
  *col = t * 2 + (i & 1) + 8 * (i / 4);
}

/* Each (row, col) of a rows x cols tile is held by exactly one (lane, element); the table agrees
 * with the ISA's statement at every one. */
static void check_layout(const char *what, const TensorCore *tc, const TcPos *tab, int nel, int rows, int cols,
                         void (*isa)(const TensorCore *, int, int, int *, int *)) {
  int *hits = calloc((size_t)(rows * cols), sizeof(int));
  int out = 0, differ = 0, lanes = TC_LANES(tc);
  for (int lane = 0; lane < lanes; lane++)
    for (int e = 0; e < nel; e++) {
      int r, c, ir, ic;
      tc_pos(tc, &tab[e], lane, &r, &c);
      isa(tc, lane, e, &ir, &ic);
      if (r != ir || c != ic) differ++;
      if (r < 0 || r >= rows || c < 0 || c >= cols) out++;
      else hits[r * cols + c]++;
    }
  int bad = 0;
  for (int i = 0; i < rows * cols; i++) bad += hits[i] != 1;
  CHECK_MSG(lanes * nel == rows * cols && out == 0 && bad == 0, "%s %s: %d outside the tile, %d positions not held exactly once",
            tc->name, what, out, bad);
  CHECK_MSG(differ == 0, "%s %s: %d (lane, element) pairs differ from the PTX ISA", tc->name, what, differ);
  free(hits);
}

/* A warpgroup's staged B block of k x cols: the lanes' elements (lane + 128 j, row-major) cover it
 * once, and tc_smem_b places them one to one on [0, k * cols), at the PTX ISA's canonical K-major
 * offsets without swizzling: column c, depth kk at (c % 8) * T + (c / 8) * SBO + (kk % T) + (kk / T)
 * * LBO (elements; T = 16 bytes of elements), every 16-byte row of a core matrix contiguous and
 * 16-byte aligned. */
static void check_smem_b(const TensorCore *tc, int cols) {
  int esize = tc->in == TG_FLOAT32 ? 4 : 2, T = 16 / esize, n = tc->k * cols, bad = 0;
  CHECK(n % 128 == 0 && tc->k == 2 * T);
  int *hits = calloc((size_t)n, sizeof(int));
  for (int j = 0; j < n / 128; j++)
    for (int lane = 0; lane < 128; lane++) {
      int el = lane + 128 * j, kk = el / cols, c = el % cols;
      int64_t off = tc_smem_b(kk, c, esize), want = c % 8 * T + c / 8 * (256 / esize) + kk % T + kk / T * (128 / esize);
      if (off != want || off < 0 || off >= n) bad++;
      else hits[off]++;
      if (kk % T == 0 && off * esize % 16 != 0) bad++;
    }
  for (int i = 0; i < n; i++) bad += hits[i] != 1;
  CHECK_MSG(bad == 0, "%s: B block of %d columns: %d misplaced elements", tc->name, cols, bad);
  free(hits);
}

TEST(tc_layouts_match_the_ptx_isa) {
  int n;
  const TensorCore *t = tc_table(&n);
  CHECK(n == 6);
  for (int i = 0; i < n; i++) {
    const TensorCore *tc = &t[i];
    CHECK(tc->wg == (i >= 3)); /* (TC_SELECT's numbering) */
    CHECK(tc->m == (tc->wg ? 64 : 16) && (tc->k == 16 || tc->k == 8));
    CHECK(tc->n == (tc->wg && tc->k == 8 ? 16 : 8));
    CHECK(tc->per_reg == (tc->in == TG_FLOAT32 ? 1 : 2));
    check_layout("A", tc, tc->a, tc->na, tc->m, tc->k, isa_a);
    if (tc->wg) {
      CHECK(tc->nb == 1 && tc->k * tc->n == 128 && tc->b == NULL);
      for (int cols = tc->n; cols <= 256; cols += tc->n) check_smem_b(tc, cols);
    } else {
      check_layout("B", tc, tc->b, tc->nb, tc->k, tc->n, isa_b);
    }
    check_layout("C", tc, tc->c, tc->nc, tc->m, tc->n, isa_c);
    /* the instruction's shape and types are those of the table row */
    char shape[48], ptx[160];
    if (tc->wg) {
      snprintf(ptx, sizeof ptx, tc->ptx, 8 * tc->n);
      snprintf(shape, sizeof shape, "wgmma.mma_async.sync.aligned.m64n%dk%d.f32.", 8 * tc->n, tc->k);
      CHECK_STR_CONTAINS(ptx, tc->in == TG_FLOAT16 ? ".f32.f16.f16" : tc->in == TG_BFLOAT16 ? ".f32.bf16.bf16" : ".f32.tf32.tf32");
    } else {
      snprintf(ptx, sizeof ptx, "%s", tc->ptx);
      snprintf(shape, sizeof shape, ".m%dn%dk%d.row.col.f32.", tc->m, tc->n, tc->k);
      CHECK_STR_CONTAINS(ptx, tc->in == TG_FLOAT16 ? ".f16.f16.f32" : tc->in == TG_BFLOAT16 ? ".bf16.bf16.f32" : ".tf32.tf32.f32");
    }
    CHECK_STR_CONTAINS(ptx, shape);
  }
}

/* ---------------------------------------------------------------------------------------------- */
/* executed on OpenCL                                                                              */

/* Small integers (exact in float16/bfloat16, products and sums exact in float32: any summation
 * order gives the same result), or fractions (then within a tolerance of the float64 result). */
static tg_tensor mat(const char *dev, const int64_t *shape, int nd, int seed, tg_dtype dt, bool ints) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  float *d = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) d[i] = ints ? (float)((i * 7 + seed * 5 + i / 13) % 9 - 4) : sinf((float)i * 0.37f + (float)seed);
  tg_tensor t = tg_cast(tg_from_data(d, shape, nd, TG_OPTS(.device = dev)), dt);
  free(d);
  return t;
}

typedef struct {
  int64_t b, m, n, k; /* b 0: a plain matmul */
  tg_dtype dt;
  bool bt;            /* B given transposed (its k axis contiguous) */
  bool epilogue;      /* relu(a @ b + 1) stored as the input dtype */
} Case;

/* realizes x with setting k=v (and k2=v2 unless NULL) in a context */
static tg_status realize_with(tg_tensor x, const char *k, const char *v, const char *k2, const char *v2) {
  tg_context_begin();
  tg_context_set(k, v);
  if (k2) tg_context_set(k2, v2);
  tg_status st = tg_realize(x);
  tg_context_end();
  return st;
}

/* the case on dev: float32 accumulation of dt products (tg_matmul_dtype); f64: the same inputs
 * multiplied and summed in float64 (the reference) */
static tg_tensor build_f64(const Case *c, const char *dev, bool ints, bool f64) {
  tg_tensor a, b;
  if (c->b) a = mat(dev, TG_SHAPE(c->b, c->m, c->k), 1, c->dt, ints), b = mat(dev, TG_SHAPE(c->b, c->k, c->n), 2, c->dt, ints);
  else a = mat(dev, TG_SHAPE(c->m, c->k), 1, c->dt, ints), b = mat(dev, TG_SHAPE(c->k, c->n), 2, c->dt, ints);
  if (c->bt) b = tg_transpose(tg_contiguous(tg_transpose(b, -1, -2)), -1, -2);
  tg_realize(a), tg_realize(b);
  tg_tensor r = f64 ? tg_matmul_dtype(tg_cast(a, TG_FLOAT64), tg_cast(b, TG_FLOAT64), TG_FLOAT64) : tg_matmul_dtype(a, b, TG_FLOAT32);
  if (c->epilogue) r = tg_cast(tg_relu(tg_add_s(r, 1)), c->dt);
  return r;
}

static tg_tensor build(const Case *c, const char *dev, bool ints) { return build_f64(c, dev, ints, false); }

static double *values(tg_tensor t, int64_t *n) {
  tg_tensor d = tg_cast(tg_to(t, "CPU"), TG_FLOAT64);
  *n = tg_numel(d);
  double *v = malloc(sizeof(double) * (size_t)(*n ? *n : 1));
  if (tg_data(d, v, sizeof(double) * (size_t)*n) != TG_OK) memset(v, 0, sizeof(double) * (size_t)*n);
  return v;
}

/* The case under GPU_OPTS=opts on dev (its matmul kernel only: the inputs are realized before; opts
 * NULL: the device's heuristics), against NOOPT on dev and the float64 product on the CPU. With
 * integer inputs every result must be exact. */
static void on_dev(const char *dev, const Case *c, const char *opts, bool ints, double tol) {
  BEGIN;
  char what[200];
  const char *sel = getenv_str("TC_SELECT", NULL);
  snprintf(what, sizeof what, "%s %s%s%s %s[%lld]%lldx%lldx%lld%s%s (%s)", dev, opts ? opts : "heuristics", sel ? " TC_SELECT=" : "",
           sel ? sel : "", tg_dtype_name(c->dt), (long long)c->b, (long long)c->m, (long long)c->n, (long long)c->k, c->bt ? " B^T" : "",
           c->epilogue ? " +epilogue" : "", ints ? "integers" : "fractions");
  double *v[3];
  int64_t n[3];
  for (int run = 0; run < 3; run++) {
    tg_tensor x = build_f64(c, run == 2 ? "CPU" : dev, ints, run == 2);
    tg_status st = run == 0 ? (opts ? realize_with(x, "GPU_OPTS", opts, NULL, NULL) : tg_realize(x))
                   : run == 1 ? realize_with(x, "NOOPT", "1", NULL, NULL) : tg_realize(x);
    CHECK_MSG(st == TG_OK, "%s: %s", what, tg_last_error());
    tg_clear_error();
    v[run] = values(x, &n[run]);
  }
  CHECK(n[0] == n[1] && n[0] == n[2]);
  int bad = 0;
  for (int64_t i = 0; i < n[0] && n[0] == n[2]; i++) {
    /* (an epilogue rounds the float64 reference to the stored dtype too) */
    double ref = v[2][i], got = v[0][i];
    bool ok = ints ? got == v[1][i] && got == ref : fabs(got - ref) <= tol * (1 + fabs(ref));
    if (!ok && bad++ < 3) fprintf(stderr, "  %s [%lld]: TC %.9g, NOOPT %.9g, float64 %.9g\n", what, (long long)i, got, v[1][i], ref);
  }
  CHECK_MSG(bad == 0, "%s: %d values differ", what, bad);
  for (int i = 0; i < 3; i++) free(v[i]);
  END;
}
static void on_cl(const Case *c, const char *opts, bool ints, double tol) { on_dev("CL", c, opts, ints, tol); }

TEST(tc_emulated_on_cl_matches_noopt) {
  tg_clear_error();
  if (!device_get("CL")) {
    printf("test_tc: no OpenCL device (%s); the emulation is not checked\n", tg_last_error());
    tg_clear_error();
    return;
  }
  const Case cases[] = {
      {0, 16, 16, 16, TG_FLOAT16, false, false},  {0, 64, 32, 48, TG_FLOAT16, false, false},
      {0, 128, 128, 64, TG_FLOAT16, false, false}, {0, 64, 32, 48, TG_BFLOAT16, false, false},
      {3, 32, 16, 32, TG_FLOAT16, false, false},  {0, 32, 24, 32, TG_FLOAT16, true, false},
      {0, 48, 16, 16, TG_BFLOAT16, false, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) on_cl(&cases[i], "TC:0:0", true, 0);
  /* more tiles per warp: the UPCASTs of the row and column axes (axes 0, 1 of a plain matmul) */
  on_cl(&cases[2], "TC:0:0,UPCAST:0:2,UPCAST:1:4", true, 0);
  on_cl(&cases[1], "TC:0:0,UPCAST:1:2", true, 0);
  /* the other way the product matches: the output's columns as the instruction's rows (C^T = B^T A^T) */
  on_cl(&cases[1], "TC:1:0", true, 0);
  on_cl(&cases[4], "TC:1:0,UPCAST:1:2", true, 0);
  Case bup = cases[4];
  on_cl(&bup, "TC:0:0,UPCAST:1:2,UPCAST:2:2", true, 0);
  /* fractions: float16 inputs, exact products, float32 sums */
  on_cl(&cases[2], "TC:0:0", false, 1e-5);
  on_cl(&cases[3], "TC:0:0,UPCAST:0:2", false, 1e-5);
  /* padded (TC:i:2): rows, columns and depth the tiles do not divide -- each alone, all three, with
   * more tiles per warp, a batch, B transposed, an epilogue, fractions, and one tile larger than the
   * whole matrix */
  const Case padc[] = {
      {0, 20, 32, 48, TG_FLOAT16, false, false}, {0, 64, 20, 48, TG_FLOAT16, false, false},
      {0, 64, 32, 40, TG_FLOAT16, false, false}, {0, 37, 13, 29, TG_FLOAT16, false, false},
      {3, 21, 11, 19, TG_BFLOAT16, false, false}, {0, 37, 13, 29, TG_FLOAT16, true, true},
      {0, 5, 3, 7, TG_FLOAT16, false, false},
  };
  for (size_t i = 0; i < sizeof padc / sizeof padc[0]; i++) on_cl(&padc[i], "TC:0:2", true, 0);
  on_cl(&padc[3], "TC:0:2,UPCAST:0:2", true, 0);
  Case pad2 = {0, 40, 24, 29, TG_FLOAT16, false, false};
  on_cl(&pad2, "TC:0:2,UPCAST:0:2,UPCAST:1:2", true, 0);
  on_cl(&padc[3], "TC:1:2", true, 0);
  on_cl(&padc[3], "TC:0:2", false, 1e-5);
  /* float32 as tf32, only with ALLOW_TF32 (the emulation keeps every bit: integers) */
  tg_context_begin();
  tg_context_set("ALLOW_TF32", "1");
  Case f32 = {0, 64, 32, 48, TG_FLOAT32, false, false};
  on_cl(&f32, "TC:0:0", true, 0);
  tg_context_end();

  /* the warpgroup instruction (TC_SELECT=3/4/5: sm_90's wgmma; on OpenCL the emulation reads B back
   * from the staged block through the descriptor's layout): 64-row tiles, B staged by every lane,
   * column tiles up to the instruction's N, more row tiles, a batch, B transposed, an epilogue,
   * padding, the other way round, fractions, tf32 */
  {
    tg_context_begin();
    tg_context_set("TC_SELECT", "3");
    const Case wc[] = {{0, 64, 8, 16, TG_FLOAT16, false, false}, {0, 128, 64, 48, TG_FLOAT16, false, false},
                       {2, 64, 32, 32, TG_FLOAT16, true, true}, {0, 64, 256, 16, TG_FLOAT16, false, false}};
    for (size_t i = 0; i < sizeof wc / sizeof wc[0]; i++) on_cl(&wc[i], "TC:0:0", true, 0);
    on_cl(&wc[1], "TC:0:0,UPCAST:1:8", true, 0);
    on_cl(&wc[1], "TC:0:0,UPCAST:0:2,UPCAST:1:4", true, 0);
    on_cl(&wc[3], "TC:0:0,UPCAST:1:32", true, 0);
    on_cl(&wc[2], "TC:0:0,UPCAST:2:4", true, 0);
    on_cl(&wc[1], "TC:1:0,UPCAST:0:2", true, 0);
    on_cl(&wc[1], "TC:0:0,UPCAST:1:4", false, 1e-5);
    const Case wp[] = {{0, 37, 13, 29, TG_FLOAT16, false, false}, {3, 21, 11, 19, TG_FLOAT16, true, true},
                       {0, 100, 40, 29, TG_FLOAT16, false, false}};
    for (size_t i = 0; i < sizeof wp / sizeof wp[0]; i++) on_cl(&wp[i], "TC:0:2", true, 0);
    on_cl(&wp[2], "TC:0:2,UPCAST:1:4", true, 0);
    tg_context_set("TC_SELECT", "4");
    Case wb = {0, 64, 32, 48, TG_BFLOAT16, false, false};
    on_cl(&wb, "TC:0:0,UPCAST:1:4", true, 0);
    tg_context_set("TC_SELECT", "5");
    tg_context_set("ALLOW_TF32", "1");
    Case wf = {0, 64, 32, 24, TG_FLOAT32, false, false};
    on_cl(&wf, "TC:0:0", true, 0);
    on_cl(&wf, "TC:0:0,UPCAST:1:2", true, 0);
    Case wfp = {0, 70, 20, 13, TG_FLOAT32, false, true};
    on_cl(&wfp, "TC:0:2", true, 0);
    tg_context_end();
  }
  /* what TC refuses: float32 without ALLOW_TF32, a shape the tiles do not divide, actions after it
   * other than UPCASTs of its axes, TC not first, a kernel that is not a product */
  struct {
    Case c;
    const char *opts;
  } bad[] = {
      {{0, 64, 32, 48, TG_FLOAT32, false, false}, "TC:0:0"}, {{0, 20, 32, 48, TG_FLOAT16, false, false}, "TC:0:0"},
      {{0, 64, 32, 40, TG_FLOAT16, false, false}, "TC:0:0"}, {{0, 64, 32, 48, TG_FLOAT16, false, false}, "TC:0:0,LOCAL:0:2"},
      {{0, 64, 32, 48, TG_FLOAT16, false, false}, "UPCAST:0:2,TC:0:0"}, {{0, 64, 32, 48, TG_FLOAT16, false, false}, "TC:0:0,UPCAST:0:8"},
      {{0, 64, 32, 48, TG_FLOAT16, false, false}, "TC:0:1"}, {{0, 64, 32, 48, TG_FLOAT16, false, false}, "TC:9:0"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    BEGIN;
    tg_tensor x = build(&bad[i].c, "CL", true);
    CHECK_MSG(realize_with(x, "GPU_OPTS", bad[i].opts, NULL, NULL) != TG_OK, "%s applied to %lldx%lldx%lld", bad[i].opts,
              (long long)bad[i].c.m, (long long)bad[i].c.n, (long long)bad[i].c.k);
    CHECK_STR_CONTAINS(tg_last_error(), "does not fit this kernel");
    tg_clear_error();
    END;
  }
  BEGIN;
  tg_tensor s = tg_sum(mat("CL", TG_SHAPE(64, 32), 1, TG_FLOAT16, true), TG_AXES(1), false);
  CHECK(realize_with(s, "GPU_OPTS", "TC:0:0", NULL, NULL) != TG_OK);
  tg_clear_error();
  END;
}

/* ---------------------------------------------------------------------------------------------- */
/* CUDA on the compile-only NULL device                                                            */

static bool first_is_tc(const KernelCode *kc) { return kc && kc->applied.n > 0 && kc->applied.o[0].op == OPT_TC; }

/* ptxas assembles the PTX for sm (true when there is no ptxas to ask: said once) */
static bool ptxas_ok(const uint8_t *ptx, size_t n, int sm) {
  const char *cp = getenv("CUDA_PATH");
  char exe[600], in[300], cmd[1600];
  snprintf(exe, sizeof exe, "%s/bin/ptxas", cp && *cp ? cp : "/usr/local/cuda");
  if (access(exe, X_OK) != 0) {
    static bool said;
    if (!said) printf("test_tc: no %s; PTX not assembled\n", exe), said = true;
    return true;
  }
  snprintf(in, sizeof in, "%s/k_sm%d.ptx", tmpdir(), sm);
  FILE *f = fopen(in, "wb");
  if (!f) return false;
  fwrite(ptx, 1, n && !ptx[n - 1] ? n - 1 : n, f); /* (NVRTC's size counts the terminating NUL) */
  fclose(f);
  /* (Hopper's warpgroup instructions: the arch-specific sm_90a) */
  bool a = strstr((const char *)ptx, ".target sm_90a") != NULL;
  snprintf(cmd, sizeof cmd, "'%s' -arch=sm_%d%s '%s' -o '%s.cubin' 2>&1", exe, sm, a ? "a" : "", in, in);
  int rc = system(cmd);
  return rc == 0;
}

TEST(tc_cuda_null_heuristics_nvrtc_ptxas) {
  tg_clear_error();
  Device *dev = device_get("NULL:CUDA:sm_80");
  if (!dev) {
    printf("test_tc: no NULL:CUDA device (%s); CUDA not checked\n", tg_last_error());
    tg_clear_error();
    return;
  }
  for (int smi = 0; smi < 2; smi++) {
    int sm = smi ? 90 : 80;
    char name[32];
    snprintf(name, sizeof name, "NULL:CUDA:sm_%d", sm);
    Device *d = device_get(name);
    CHECK(d != NULL);
    if (!d) continue;
    /* what the runtime reports of the arch (ops_cuda.c may leave it 0: unknown, no TC by heuristics) */
    DeviceCaps caps = d->caps;
    CHECK(caps.lang == LANG_CUDA && (caps.sm == 0 || caps.sm == sm));
    caps.sm = sm;
    /* sm_80 runs mma.sync, sm_90 the warpgroup's wgmma where its 64-row tiles fit, with as many
     * 8-column tiles as divide the columns up to 128 */
    struct {
      tg_dtype dt;
      bool tf32;
      const char *ptx80, *ptx90;
      int64_t m, n, k, b;
      bool expect;
    } cs[] = {
        {TG_FLOAT16, false, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16", 64, 32, 48, 0, true},
        {TG_FLOAT16, false, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", 512, 256, 64, 0, true},
        {TG_BFLOAT16, false, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16", 64, 32, 48, 2, true},
        {TG_FLOAT32, true, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32", 64, 32, 48, 0, true},
        {TG_FLOAT32, false, NULL, NULL, 64, 32, 48, 0, false},  /* exact float32 by default */
        /* 20 rows, not a multiple of 16: the instruction's columns (8) take them, 20 -> 24 padded (64-row
         * warpgroup tiles would be mostly padding: sm_90 takes mma.sync too) */
        {TG_FLOAT16, false, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 20, 32, 48, 0, true},
        /* 1001 columns (a vocabulary projection), padded to 1008 */
        {TG_FLOAT16, false, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16", 64, 1001, 48, 0, true},
        {TG_FLOAT16, false, NULL, NULL, 5, 3, 7, 0, false},     /* padding would be most of the work */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
      const char *want = sm == 90 ? cs[i].ptx90 : cs[i].ptx80;
      BEGIN;
      tg_context_begin();
      if (cs[i].tf32) tg_context_set("ALLOW_TF32", "1");
      Case c = {cs[i].b, cs[i].m, cs[i].n, cs[i].k, cs[i].dt, false, false};
      tg_tensor x = build(&c, name, true);
      KernelCode *kc = last_kernel(x, &caps, NULL);
      CHECK_MSG(kc && first_is_tc(kc) == cs[i].expect, "sm_%d %s %lldx%lldx%lld: heuristics chose '%s'", sm, tg_dtype_name(cs[i].dt),
                (long long)cs[i].m, (long long)cs[i].n, (long long)cs[i].k, kc ? kc->opts : "(no kernel)");
      if (kc && want) {
        CHECK_STR_CONTAINS(kc->src, want);
        uint8_t *ptx = NULL;
        size_t n = 0;
        tg_status st = d->vt->compile(d->state, kc->src, &ptx, &n);
        CHECK_MSG(st == TG_OK, "NVRTC: %s", tg_last_error());
        tg_clear_error();
        if (st == TG_OK) {
          char *t = malloc(n + 1);
          memcpy(t, ptx, n);
          t[n] = 0;
          CHECK_STR_CONTAINS(t, want);
          CHECK_MSG(ptxas_ok(ptx, n, sm), "ptxas -arch=sm_%d rejected the PTX of %s", sm, kc->name);
          free(t);
        }
        free(ptx);
      }
      /* sm_90 where wgmma may not be used (an NVRTC before 12.0, or code for sm_90 on a newer GPU):
       * mma.sync, as on sm_80 */
      if (kc && want && sm == 90) {
        DeviceCaps nowg = caps;
        nowg.wgmma = false;
        KernelCode *km = last_kernel(x, &nowg, NULL);
        CHECK(km && first_is_tc(km) && strstr(km->src, "mma.sync.aligned") && !strstr(km->src, "wgmma"));
        kernel_code_free(km);
      }
      /* a device known to be older than sm_80: neither the heuristics nor a forced TC */
      if (kc && want) {
        DeviceCaps old = caps;
        old.sm = 75;
        KernelCode *k75 = last_kernel(x, &old, NULL);
        CHECK(k75 && !first_is_tc(k75));
        OptList tc = {.n = 1};
        tc.o[0] = (Opt){OPT_TC, 0, 0};
        KernelCode *f75 = last_kernel(x, &old, &tc);
        CHECK(f75 == NULL);
        kernel_code_free(k75), kernel_code_free(f75);
      }
      kernel_code_free(kc);
      tg_context_end();
      tg_clear_error();
      END;
    }
  }
  /* through realize with GPU_OPTS: the TC kernel compiles on the device itself */
  BEGIN;
  Case c = {0, 64, 64, 32, TG_FLOAT16, false, true};
  tg_tensor x = build(&c, "NULL:CUDA:sm_80", true);
  CHECK_MSG(realize_with(x, "GPU_OPTS", "TC:0:0,UPCAST:0:2,UPCAST:1:2", NULL, NULL) == TG_OK, "%s", tg_last_error());
  tg_clear_error();
  END;
  /* BEAM on a CUDA device compiles TC candidates too (NULL runs nothing: no timing to choose by) */
  {
  BEGIN;
  Case c2 = {0, 64, 32, 32, TG_FLOAT16, false, false};
  tg_tensor y = build(&c2, "NULL:CUDA:sm_90", true);
  CHECK_MSG(realize_with(y, "BEAM", "1", "DISABLE_COMPILER_CACHE", "1") == TG_OK, "%s", tg_last_error());
  tg_clear_error();
  END;
  }
  /* the heuristics of OpenCL devices never choose TC */
  Device *cl = device_get("CL");
  tg_clear_error();
  if (cl) {
    BEGIN;
    Case h = {0, 64, 32, 48, TG_FLOAT16, false, false};
    tg_tensor x2 = build(&h, "CL", true);
    DeviceCaps g = cl->caps;
    g.cpu_cores = false;
    KernelCode *a = last_kernel(x2, &cl->caps, NULL), *b = last_kernel(x2, &g, NULL);
    CHECK(a && b && !first_is_tc(a) && !first_is_tc(b));
    kernel_code_free(a), kernel_code_free(b);
    END;
  }
}

/* ---------------------------------------------------------------------------------------------- */
/* on a real NVIDIA GPU (tests/gpu/run.sh; here the device does not open and this says so)         */

/* The hardware's own layout: every case of the emulation above on CUDA, through mma.sync, exact
 * against NOOPT and float64 for small integers (a table that is a consistent permutation of the
 * right one fails here, where the emulation cannot see it), within 1e-5 for fractions; float16,
 * bfloat16, tf32 under ALLOW_TF32, padded shapes, and the heuristics' own choice. */
TEST(tc_on_cuda_gpu) {
  tg_clear_error();
  Device *d = device_get("CUDA");
  if (!d) {
    printf("test_tc: no CUDA GPU (%s); the tensor cores' hardware layout is not checked\n", tg_last_error());
    tg_clear_error();
    return;
  }
  if (d->caps.sm && d->caps.sm < 80) {
    printf("test_tc: CUDA sm_%d has no mma.sync m16n8k16; not checked\n", d->caps.sm);
    return;
  }
  const Case cs[] = {
      {0, 16, 16, 16, TG_FLOAT16, false, false},  {0, 64, 32, 48, TG_FLOAT16, false, false},
      {0, 128, 128, 64, TG_FLOAT16, false, false}, {0, 64, 32, 48, TG_BFLOAT16, false, false},
      {3, 32, 16, 32, TG_FLOAT16, false, false},  {0, 32, 24, 32, TG_FLOAT16, true, false},
      {0, 48, 16, 16, TG_BFLOAT16, false, true},  {0, 512, 256, 128, TG_FLOAT16, false, false},
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    on_dev("CUDA", &cs[i], "TC:0:0", true, 0);
    on_dev("CUDA", &cs[i], NULL, true, 0);
  }
  on_dev("CUDA", &cs[2], "TC:0:0,UPCAST:0:2,UPCAST:1:4", true, 0);
  on_dev("CUDA", &cs[1], "TC:1:0", true, 0);
  on_dev("CUDA", &cs[2], "TC:0:0", false, 1e-5);
  on_dev("CUDA", &cs[3], "TC:0:0,UPCAST:0:2", false, 1e-5);
  const Case pad[] = {{0, 37, 13, 29, TG_FLOAT16, false, false}, {3, 21, 11, 19, TG_BFLOAT16, false, false},
                      {0, 64, 1001, 48, TG_FLOAT16, false, false}, {0, 37, 13, 29, TG_FLOAT16, true, true}};
  for (size_t i = 0; i < sizeof pad / sizeof pad[0]; i++) {
    on_dev("CUDA", &pad[i], "TC:0:2", true, 0);
    on_dev("CUDA", &pad[i], NULL, true, 0);
  }
  tg_context_begin();
  tg_context_set("ALLOW_TF32", "1");
  Case f32 = {0, 64, 32, 48, TG_FLOAT32, false, false};
  on_dev("CUDA", &f32, "TC:0:0", true, 0);
  on_dev("CUDA", &f32, NULL, true, 0);
  /* fractions through tf32: 10 mantissa bits per input, float32 sums */
  on_dev("CUDA", &f32, "TC:0:0", false, 1e-2);
  tg_context_end();
  if (d->caps.sm != 90) return;
  /* sm_90: TC:0 above was the warpgroup's wgmma; mma.sync (TC_SELECT=0..2) on the same cases, and
   * wgmma's own: every column-tile count to its 256, 128 rows a warpgroup, B transposed, padding */
  tg_context_begin();
  for (int sel = 0; sel < 2; sel++) {
    tg_context_set("TC_SELECT", sel ? "1" : "0");
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
      if ((cs[i].dt == TG_BFLOAT16) == (sel == 1)) on_dev("CUDA", &cs[i], "TC:0:0", true, 0);
  }
  tg_context_set("TC_SELECT", "3");
  const Case wc[] = {{0, 64, 8, 16, TG_FLOAT16, false, false}, {0, 128, 64, 48, TG_FLOAT16, false, false},
                     {2, 64, 32, 32, TG_FLOAT16, true, true}, {0, 64, 256, 16, TG_FLOAT16, false, false},
                     {0, 1024, 1024, 256, TG_FLOAT16, false, false}};
  for (size_t i = 0; i < sizeof wc / sizeof wc[0]; i++) on_dev("CUDA", &wc[i], "TC:0:0", true, 0);
  on_dev("CUDA", &wc[1], "TC:0:0,UPCAST:1:8", true, 0);
  on_dev("CUDA", &wc[1], "TC:0:0,UPCAST:0:2,UPCAST:1:4", true, 0);
  on_dev("CUDA", &wc[3], "TC:0:0,UPCAST:1:32", true, 0);
  on_dev("CUDA", &wc[2], "TC:0:0,UPCAST:2:4", true, 0);
  on_dev("CUDA", &wc[1], "TC:1:0,UPCAST:0:2", true, 0);
  on_dev("CUDA", &wc[4], NULL, true, 0);
  on_dev("CUDA", &wc[1], "TC:0:0,UPCAST:1:4", false, 1e-5);
  const Case wp[] = {{0, 37, 13, 29, TG_FLOAT16, false, false}, {3, 21, 11, 19, TG_FLOAT16, true, true},
                     {0, 100, 40, 29, TG_FLOAT16, false, false}};
  for (size_t i = 0; i < sizeof wp / sizeof wp[0]; i++) on_dev("CUDA", &wp[i], "TC:0:2", true, 0);
  on_dev("CUDA", &wp[2], "TC:0:2,UPCAST:1:4", true, 0);
  tg_context_set("TC_SELECT", "4");
  Case wb = {0, 64, 32, 48, TG_BFLOAT16, false, false};
  on_dev("CUDA", &wb, "TC:0:0,UPCAST:1:4", true, 0);
  tg_context_set("TC_SELECT", "5");
  tg_context_set("ALLOW_TF32", "1");
  Case wf = {0, 64, 32, 24, TG_FLOAT32, false, false}, wfp = {0, 70, 20, 13, TG_FLOAT32, false, true};
  on_dev("CUDA", &wf, "TC:0:0", true, 0);
  on_dev("CUDA", &wf, "TC:0:0,UPCAST:1:2", true, 0);
  on_dev("CUDA", &wfp, "TC:0:2", true, 0);
  on_dev("CUDA", &wf, "TC:0:0", false, 1e-2);
  tg_context_end();
}

int main(void) {
  int rc = RUN_TESTS();
  tmpdir_remove();
  return rc;
}
