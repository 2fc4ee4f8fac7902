/*
 * tc.c -- tensor cores: the TC action (tinygrad's Opt(OptOps.TC, ...)) for matmul-like kernels.
 *
 * In: a lowered, not yet optimized GPU kernel whose reduction is a float32 sum of a product of two
 * loads (each possibly cast to float): out[.., m, n] = sum_k A(m, k) * B(k, n), with float16 or
 * bfloat16 inputs (float32 ones as tf32 when ALLOW_TF32=1). Out: the same LKernel in a warp-tiled
 * form the renderers know (codegen.h, LKernel.tc): the row axis m and the column axis n become
 * tile indices, the reduction axis k steps a tile depth at a time, and a new innermost global axis
 * of 32 -- one work-group, one warp -- is the lane. Per k step, each lane computes the A and B
 * elements the instruction's layout gives it (tc_frag, the kernel's own expressions with m, k and n
 * substituted by tile position + layout), and holds nc accumulators per tile (the copies, whose
 * stored values and indices are substituted the same way).
 *
 * Narrower than tinygrad's TC: the kernel must be recognised as a whole (one product of two loads,
 * nothing else accumulated), TC comes first in its list, and only UPCASTs of its row and column axes
 * may follow. The arg is tinygrad's tc_opt: 0 takes only shapes the tiles divide; 2 pads the others
 * (a 50257-column vocabulary projection, a 784-deep first layer): the row and column tiles past the
 * end recompute and store again the last row or column (clamped indices, as PADTO does), and the
 * depth past the end reads zeros. The heuristics pad only where that adds at most a quarter of an
 * axis (tc_apply_heuristic).
 *
 * The layouts are the PTX ISA's; CUDA C renders the instruction as inline PTX (cstyle.c), OpenCL C
 * as an emulation through local memory with the same layout (which checks the index math here,
 * not the hardware's layout: tests/test_tc.c).
 *
 * On sm_90 the same form runs Hopper's warpgroup instruction (wgmma, TensorCore.wg): the lane axis is
 * 128 long (four warps, 64 rows a tile), A stays in registers in mma.sync's per-warp layout, and B's
 * fragments are not a lane's own: lane L computes elements L + 128 j of the step's k x N block, which
 * the renderer stages in shared memory for the instruction's descriptor (docs/DESIGN.md, "Hopper's
 * warpgroup MMA").
 */
#include <string.h>

#include "codegen.h"

/* m16n8k16 with 16-bit inputs: A is 16x16 in 4 registers of 2 elements, B 16x8 in 2, C 16x8 */
static const TcPos A_16816[8] = {{1, 0, 0, 0, 2, 0}, {1, 0, 0, 0, 2, 1}, {1, 0, 8, 0, 2, 0}, {1, 0, 8, 0, 2, 1},
                                 {1, 0, 0, 0, 2, 8}, {1, 0, 0, 0, 2, 9}, {1, 0, 8, 0, 2, 8}, {1, 0, 8, 0, 2, 9}};
static const TcPos B_16816[4] = {{0, 2, 0, 1, 0, 0}, {0, 2, 1, 1, 0, 0}, {0, 2, 8, 1, 0, 0}, {0, 2, 9, 1, 0, 0}};
/* the float32 accumulator of every m16n8 shape */
static const TcPos C_168[4] = {{1, 0, 0, 0, 2, 0}, {1, 0, 0, 0, 2, 1}, {1, 0, 8, 0, 2, 0}, {1, 0, 8, 0, 2, 1}};
/* m16n8k8 with tf32 inputs: A is 16x8 in 4 registers, B 8x8 in 2 */
static const TcPos A_1688[4] = {{1, 0, 0, 0, 1, 0}, {1, 0, 8, 0, 1, 0}, {1, 0, 0, 0, 1, 4}, {1, 0, 8, 0, 1, 4}};
static const TcPos B_1688[2] = {{0, 1, 0, 1, 0, 0}, {0, 1, 4, 1, 0, 0}};

/* a warpgroup's tf32 tiles are 16 columns wide (k 8 x n 16 = one B element per lane): two m16n8
 * accumulator layouts side by side */
static const TcPos C_1616[8] = {{1, 0, 0, 0, 2, 0}, {1, 0, 0, 0, 2, 1}, {1, 0, 8, 0, 2, 0}, {1, 0, 8, 0, 2, 1},
                                {1, 0, 0, 0, 2, 8}, {1, 0, 0, 0, 2, 9}, {1, 0, 8, 0, 2, 8}, {1, 0, 8, 0, 2, 9}};

/* The order is TC_SELECT's: 0-2 the warp's mma.sync (sm_80 on), 3-5 the warpgroup's wgmma (sm_90).
 * wgmma's A comes from registers in mma.sync's per-warp layout (the PTX ISA's "Matrix Fragments for
 * wgmma.mma_async.m64nNk16 / k8"), its accumulator in the m16n8 layout repeated along the columns. */
static const TensorCore TCS[] = {
    {"m16n8k16.f16", TG_FLOAT16, 16, 8, 16, 8, 4, 4, 2, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", A_16816, B_16816, C_168, false},
    {"m16n8k16.bf16", TG_BFLOAT16, 16, 8, 16, 8, 4, 4, 2, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", A_16816, B_16816, C_168, false},
    {"m16n8k8.tf32", TG_FLOAT32, 16, 8, 8, 4, 2, 4, 1, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", A_1688, B_1688, C_168, false},
    {"wgmma.m64nNk16.f16", TG_FLOAT16, 64, 8, 16, 8, 1, 4, 2, "wgmma.mma_async.sync.aligned.m64n%dk16.f32.f16.f16", A_16816, NULL, C_168, true},
    {"wgmma.m64nNk16.bf16", TG_BFLOAT16, 64, 8, 16, 8, 1, 4, 2, "wgmma.mma_async.sync.aligned.m64n%dk16.f32.bf16.bf16", A_16816, NULL, C_168, true},
    {"wgmma.m64nNk8.tf32", TG_FLOAT32, 64, 16, 8, 4, 1, 8, 1, "wgmma.mma_async.sync.aligned.m64n%dk8.f32.tf32.tf32", A_1688, NULL, C_1616, true},
};
#define NTCS ((int)(sizeof TCS / sizeof TCS[0]))

const TensorCore *tc_table(int *n) {
  *n = NTCS;
  return TCS;
}

void tc_pos(const TensorCore *tc, const TcPos *p, int lane, int *row, int *col) {
  int g = lane % 32 / 4, t = lane % 4;
  *row = p->rg * g + p->rt * t + p->r0 + (tc->wg ? 16 * (lane / 32) : 0);
  *col = p->cg * g + p->ct * t + p->c0;
}

/* an operand of the product: a load, or a float cast of one (float16 values widened to float32) */
static UOp *operand_load(UOp *u) {
  if (u->op == OP_CAST && tg_dtype_is_float((tg_dtype)u->dtype)) u = u->src[0];
  return u->op == OP_LOAD ? u : NULL;
}

/* The tensor cores a device offers for inputs of dtype in, in its order of preference (n of them):
 * CUDA sm_90 the warpgroup's wgmma, then mma.sync; other CUDA archs from sm_80 (or unknown) mma.sync;
 * OpenCL (the emulation, for tests) mma.sync, then wgmma. Float32 only with ALLOW_TF32=1; TC_SELECT=i
 * (tinygrad's setting) keeps TCS[i] alone. */
static int tc_for(const DeviceCaps *caps, tg_dtype in, const TensorCore **out) {
  if (in == TG_FLOAT32 && !getenv_int("ALLOW_TF32", 0)) return 0;
  int sel = getenv_int("TC_SELECT", -1), n = 0;
  bool cuda = caps->lang == LANG_CUDA;
  for (int pass = 0; pass < 2; pass++) {
    bool wg = cuda ? pass == 0 : pass == 1;
    if (wg && cuda && (caps->sm != 90 || !caps->wgmma)) continue; /* (sm_90a's alone: Blackwell has none) */
    for (int i = 0; i < NTCS; i++)
      if (TCS[i].in == in && TCS[i].wg == wg && (sel < 0 || sel == i)) out[n++] = &TCS[i];
  }
  return n;
}

typedef struct {
  const TensorCore *tc;
  int gm, gn, kr;
  UOp *a, *b; /* borrowed */
} TcWay;

/* An axis of n elements in tiles of t: t divides n, or (pad) it is padded to the next multiple. */
static bool tiles_fit(int64_t n, int64_t t, bool pad) { return n > 0 && (n % t == 0 || pad); }
static int64_t padded(int64_t n, int64_t t) { return (n + t - 1) / t * t; }

/* The i-th way k runs on a tensor core (ways are counted per instruction in the device's order,
 * tc_for, then innermost column axis first, then row axis, then reduce axis, then which operand is
 * A); returns how many there are when i < 0 or i is past them. */
static int tc_ways(const LKernel *k, const DeviceCaps *caps, int i, TcWay *out, bool pad) {
  if (!caps || !k->gpu || (caps->lang != LANG_CUDA && caps->lang != LANG_OPENCL) || (caps->lang == LANG_CUDA && caps->sm && caps->sm < 80))
    return 0;
  if (!k->rbody || k->sop || k->rop != OP_ADD || k->racc != TG_FLOAT32 || k->ncopy || k->vw || k->rvw || k->group ||
      k->nlocal || k->nolocals || k->sym || k->nvars || k->tc)
    return 0;
  for (int p = 0; k->pimg && p < k->np; p++)
    if (k->pimg[p]) return 0;
  UOp *mul = k->rbody;
  if (mul->op == OP_CAST && mul->dtype == TG_FLOAT32) mul = mul->src[0];
  if (mul->op != OP_MUL || mul->nsrc != 2 || !tg_dtype_is_float((tg_dtype)mul->dtype)) return 0;
  UOp *la = operand_load(mul->src[0]), *lb = operand_load(mul->src[1]);
  if (!la || !lb || la->dtype != lb->dtype) return 0;
  const TensorCore *tcs[NTCS];
  int ntc = tc_for(caps, (tg_dtype)la->dtype, tcs), n = 0;
  for (int ti = 0; ti < ntc; ti++) {
    const TensorCore *tc = tcs[ti];
    if (caps->max_local < TC_LANES(tc) || caps->max_local_dims[0] < TC_LANES(tc)) continue;
    for (int kr = k->nr - 1; kr >= 0; kr--) {
      UOp *rk = k->rranges[kr];
      if (rk->nsrc || !tiles_fit(rk->iarg[0], tc->k, pad) || !uop_depends_on(la, rk) || !uop_depends_on(lb, rk)) continue;
      for (int gn = k->ng - 1; gn >= 0; gn--)
        for (int gm = k->ng - 1; gm >= 0; gm--) {
          UOp *rm = k->granges[gm], *rn = k->granges[gn];
          if (gm == gn || rm->nsrc || rn->nsrc || !tiles_fit(rm->iarg[0], tc->m, pad) || !tiles_fit(rn->iarg[0], tc->n, pad)) continue;
          for (int sw = 0; sw < 2; sw++) {
            UOp *a = mul->src[sw], *b = mul->src[1 - sw];
            if (!uop_depends_on(a, rm) || uop_depends_on(a, rn) || !uop_depends_on(b, rn) || uop_depends_on(b, rm)) continue;
            if (n == i && out) *out = (TcWay){tc, gm, gn, kr, a, b};
            n++;
          }
        }
    }
  }
  return n;
}

int tc_match(const LKernel *k, const DeviceCaps *caps) { return tc_ways(k, caps, -1, NULL, false); }

static void tc_take(LKernel *k, const TcWay *w, bool pad, int *next_axis);

bool tc_apply(LKernel *k, int i, int arg, const DeviceCaps *caps, int *next_axis) {
  TcWay w;
  if (i < 0 || (arg != 0 && arg != 2) || i >= tc_ways(k, caps, i, &w, arg == 2)) return false;
  tc_take(k, &w, arg == 2, next_axis);
  return true;
}

/* The heuristics' TC: the first way the tiles divide (TC(i, 0)), else the first way padding adds at
 * most a quarter to each of its axes (TC(i, 2)); the Opt's index and arg in *i and *arg. */
bool tc_apply_heuristic(LKernel *k, const DeviceCaps *caps, int *next_axis, int *i, int *arg) {
  TcWay w;
  for (int pad = 0; pad < 2; pad++) {
    int n = tc_ways(k, caps, -1, NULL, pad);
    for (int j = 0; j < n; j++) {
      tc_ways(k, caps, j, &w, pad);
      int64_t M = k->granges[w.gm]->iarg[0], N = k->granges[w.gn]->iarg[0], K = k->rranges[w.kr]->iarg[0];
      if (pad && (padded(M, w.tc->m) * 3 > M * 4 || padded(N, w.tc->n) * 3 > N * 4 || padded(K, w.tc->k) * 3 > K * 4)) continue;
      tc_take(k, &w, pad, next_axis);
      *i = j, *arg = pad ? 2 : 0;
      return true;
    }
  }
  return false;
}

static void tc_take(LKernel *k, const TcWay *wp, bool pad, int *next_axis) {
  TcWay w = *wp;
  k->tc_pad = pad;
  k->tc = w.tc;
  k->tc_gm = w.gm, k->tc_gn = w.gn, k->tc_kr = w.kr;
  k->tc_um = k->tc_un = 1;
  k->tc_opa = uop_ref(w.a), k->tc_opb = uop_ref(w.b);
  /* the lane: the innermost global axis, so it is work-item dimension 0, in work-groups of one warp
   * (warpgroup) */
  int lanes = TC_LANES(w.tc);
  k->granges = tg_xrealloc(k->granges, sizeof(UOp *) * (size_t)(k->ng + 1));
  k->tc_lane = k->ng;
  k->granges[k->ng++] = s_range((*next_axis)++, lanes);
  k->nlocal = 1;
  k->local_axis[0] = k->tc_lane, k->local_arg[0] = lanes;
}

bool tc_upcast(LKernel *k, int g, int f) {
  if (f < 2 || (g != k->tc_gm && g != k->tc_gn)) return false;
  int *u = g == k->tc_gm ? &k->tc_um : &k->tc_un;
  int64_t tile = g == k->tc_gm ? k->tc->m : k->tc->n;
  /* (a warpgroup instruction's columns: at most 256) */
  if (k->tc->wg && g == k->tc_gn && (int64_t)k->tc->n * *u * f > 256) return false;
  /* (padded: the axis pads to whole groups of f tiles; at least one of them is all real rows) */
  int64_t n = k->granges[g]->iarg[0];
  if (k->tc_pad ? n < tile * *u * f : n % (tile * *u * f) != 0) return false;
  *u *= f;
  return true;
}

/* base * tile + pos: a tile's origin plus an element's position in it (new ref) */
static UOp *at(UOp *base, int64_t tile, UOp *pos) {
  UOp *m = s_mulc(base, tile), *r = s_add(m, pos);
  uop_unref(m);
  return r;
}

/* the layout's row or column of an element as an expression of the lane (new ref); wrow: a
 * warpgroup's rows of this lane's warp (w * 16), or NULL */
static UOp *lane_pos(UOp *g, UOp *t, int cg, int ct, int c0, int64_t off, UOp *wrow) {
  UOp *a = s_mulc(g, cg), *b = s_mulc(t, ct), *s = s_add(a, b), *r = s_addc(s, c0 + off);
  uop_unref(a), uop_unref(b), uop_unref(s);
  if (wrow) {
    UOp *x = s_add(r, wrow);
    uop_unref(r);
    r = x;
  }
  return r;
}

/* A padded row or column past the axis's end: the last one again (pos is consumed; new ref). */
static UOp *clamped(UOp *pos, int64_t n) {
  UOp *r = s_minc(pos, n - 1);
  uop_unref(pos);
  return r;
}

/* An operand at a row or column (s[0]) and a depth (s[1], consumed here): past the depth's end K a
 * zero, so a padded step adds nothing (new ref). */
static UOp *depth_operand(UOp *op, USubst s[2], int64_t K) {
  UOp *kp = s[1].to;
  s[1].to = clamped(uop_ref(kp), K);
  UOp *v = uop_substitute(op, s, 2);
  if (kp->op != OP_CONST && s[1].to != kp) {
    UOp *in = s_ltc(kp, K), *z = uop_const_f((tg_dtype)v->dtype, 0), *w = uop_alu(OP_WHERE, (tg_dtype)v->dtype, in, v, z);
    uop_unref(in), uop_unref(z), uop_unref(v);
    v = w;
  }
  uop_unref(kp);
  return v;
}

void tc_make_copies(LKernel *k, int *next_axis) {
  const TensorCore *tc = k->tc;
  UOp *om = k->granges[k->tc_gm], *on = k->granges[k->tc_gn], *ok = k->rranges[k->tc_kr], *lane = k->granges[k->tc_lane];
  int um = k->tc_um, un = k->tc_un;
  int64_t M = om->iarg[0], N = on->iarg[0], K = ok->iarg[0];
  UOp *rm = s_range((*next_axis)++, padded(M, tc->m * um) / (tc->m * um));
  UOp *rn = s_range((*next_axis)++, padded(N, tc->n * un) / (tc->n * un));
  UOp *rk = s_range((*next_axis)++, padded(K, tc->k) / tc->k);
  /* g and t of the layouts; a warpgroup's: within the lane's warp, whose 16 rows are wrow's */
  UOp *l32 = tc->wg ? s_modc(lane, 32) : uop_ref(lane), *g = s_divc(l32, 4), *t = s_modc(lane, 4), *wrow = NULL;
  if (tc->wg) {
    UOp *w = s_divc(lane, 32);
    wrow = s_mulc(w, 16);
    uop_unref(w);
  }
  uop_unref(l32);
  k->nfrag = um * tc->na + un * tc->nb;
  k->tc_frag = tg_xcalloc((size_t)k->nfrag, sizeof(UOp *));
  int f = 0;
  for (int im = 0; im < um; im++)
    for (int e = 0; e < tc->na; e++, f++) {
      const TcPos *p = &tc->a[e];
      UOp *row = lane_pos(g, t, p->rg, p->rt, p->r0, (int64_t)im * tc->m, wrow), *col = lane_pos(g, t, p->cg, p->ct, p->c0, 0, NULL);
      USubst s[2] = {{om, clamped(at(rm, (int64_t)tc->m * um, row), M)}, {ok, at(rk, tc->k, col)}};
      k->tc_frag[f] = depth_operand(k->tc_opa, s, K);
      uop_unref(row), uop_unref(col), uop_unref(s[0].to), uop_unref(s[1].to);
    }
  for (int in = 0; in < un; in++)
    for (int e = 0; e < tc->nb; e++, f++) {
      UOp *row, *col;
      if (tc->wg) {
        /* the block's element lane + 128 in, row-major over k x (n * un): consecutive lanes read
         * consecutive columns */
        UOp *el = s_addc(lane, 128 * (int64_t)in);
        row = s_divc(el, (int64_t)tc->n * un), col = s_modc(el, (int64_t)tc->n * un);
        uop_unref(el);
      } else {
        const TcPos *p = &tc->b[e];
        row = lane_pos(g, t, p->rg, p->rt, p->r0, 0, NULL), col = lane_pos(g, t, p->cg, p->ct, p->c0, (int64_t)in * tc->n, NULL);
      }
      USubst s[2] = {{on, clamped(at(rn, (int64_t)tc->n * un, col), N)}, {ok, at(rk, tc->k, row)}};
      k->tc_frag[f] = depth_operand(k->tc_opb, s, K);
      uop_unref(row), uop_unref(col), uop_unref(s[0].to), uop_unref(s[1].to);
    }
  int total = um * un * tc->nc;
  k->ncopy = total;
  k->values = tg_xcalloc((size_t)total, sizeof(UOp *));
  k->sidxs = tg_xcalloc((size_t)total, sizeof(UOp *));
  k->rbodies = tg_xcalloc((size_t)total, sizeof(UOp *));
  k->rplaces = tg_xcalloc((size_t)total, sizeof(UOp *));
  for (int c = 0; c < total; c++) {
    int e = c % tc->nc, in = (c / tc->nc) % un, im = c / tc->nc / un;
    const TcPos *p = &tc->c[e];
    UOp *row = lane_pos(g, t, p->rg, p->rt, p->r0, (int64_t)im * tc->m, wrow), *col = lane_pos(g, t, p->cg, p->ct, p->c0, (int64_t)in * tc->n, NULL);
    UArg a;
    a.i = -(c + 1);
    UOp *ph = uop_new(OP_NOOP, (tg_dtype)k->racc, NULL, 0, NULL, 0, a);
    USubst s[3] = {{om, clamped(at(rm, (int64_t)tc->m * um, row), M)}, {on, clamped(at(rn, (int64_t)tc->n * un, col), N)}, {k->rplace, ph}};
    k->values[c] = uop_substitute(k->value, s, 3);
    k->sidxs[c] = uop_substitute(k->sidx, s, 3);
    k->rplaces[c] = ph;
    uop_unref(row), uop_unref(col), uop_unref(s[0].to), uop_unref(s[1].to);
  }
  uop_unref(g), uop_unref(t), uop_unref(wrow);
  uop_unref(om), uop_unref(on), uop_unref(ok);
  k->granges[k->tc_gm] = rm, k->granges[k->tc_gn] = rn, k->rranges[k->tc_kr] = rk;
}
