/*
 * llvmir.c -- the LLVM IR renderer: LKernel -> LLVM IR text for the CPU device's LLVM renderer
 * (DEV=CPU:LLVM, compiled in process by ops_llvm.c).
 *
 * In: a lowered, optimized LKernel (the one the C renderer consumes).
 * Out: one module defining `void @<name>(ptr %bufs, i64 %gstart, i64 %gend)` -- the C renderer's
 * kernel ABI, so the runtime splits the outermost global loop across threads the same way.
 * Invariants, all the C renderer's:
 *  - the same loop nest, the same hoisting (each value at the outermost loop level where its inputs
 *    exist), the same blocked accumulation, the same operation order: results agree with the C
 *    renderer's bit for bit except where the C kernels use their own vector exp2/log2/sin (here
 *    libm's, through LLVM's intrinsics) -- within an ulp;
 *  - float16, bfloat16 and fp8 are stored as their bits and computed in float, rounded after every
 *    operation: scalars by the runtime's conversion helpers (the same algorithms as the C prelude),
 *    float16/bfloat16 vector lanes by the C prelude's vector integer conversions written as IR
 *    functions (tg_vh2f/tg_vf2h, tg_vb2f/tg_vf2b), or where the device has F16C, LLVM's half
 *    fptrunc/fpext for what the C kernels convert with the hardware (codegen.h's vhalf_round and
 *    kernel_half_bits decide it the same way for both renderers): bit for bit the scalar results;
 *  - integer division and modulo by zero give 0, signed overflow wraps, a gated load never reads
 *    memory when its condition is false (a branch for scalars, a masked load for vectors);
 *  - float multiplies and adds carry `contract` (the C kernels' -ffp-contract=fast): FMA.
 * Loop counters and accumulators live in allocas that LLVM's mem2reg turns into registers, so the
 * text is emitted in one pass in the C renderer's order. The kernel body is an internal function
 * whose buffer arguments are `noalias` (C's restrict), inlined into the exported entry point.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../codegen/codegen.h"
#include "../uop/ptrmap.h"

static bool is_narrow(tg_dtype dt) { return dt == TG_FLOAT16 || dt == TG_BFLOAT16 || dtype_is_fp8(dt); }

/* register type of a value */
static const char *lty(tg_dtype dt) {
  switch (dt) {
  case TG_BOOL: return "i1";
  case TG_INT8: case TG_UINT8: return "i8";
  case TG_INT16: case TG_UINT16: return "i16";
  case TG_INT32: case TG_UINT32: return "i32";
  case TG_FLOAT64: return "double";
  case TG_FLOAT16: case TG_BFLOAT16: case TG_FLOAT32: return "float";
  case TG_FP8E4M3: case TG_FP8E5M2: case TG_FP8E4M3FNUZ: case TG_FP8E5M2FNUZ: return "float";
  default: return "i64";
  }
}
/* memory type */
static const char *sty(tg_dtype dt) {
  if (dt == TG_BOOL || dtype_is_fp8(dt)) return "i8";
  if (dt == TG_FLOAT16 || dt == TG_BFLOAT16) return "i16";
  return lty(dt);
}
static int bits(tg_dtype dt) { return dt == TG_BOOL ? 1 : (int)tg_dtype_itemsize(dt) * 8; }
static bool is_fl(tg_dtype dt) { return tg_dtype_is_float(dt); }
static bool is_uns(tg_dtype dt) { return tg_dtype_is_unsigned(dt) || dt == TG_BOOL; }

/* runtime helpers (ops_llvm.c defines them in the JIT) */
static const char *rnd_fn(tg_dtype dt) {
  switch (dt) {
  case TG_FLOAT16: return "tg_llvm_rh";
  case TG_BFLOAT16: return "tg_llvm_rb";
  case TG_FP8E4M3: return "tg_llvm_r8a";
  case TG_FP8E5M2: return "tg_llvm_r8b";
  case TG_FP8E4M3FNUZ: return "tg_llvm_r8c";
  case TG_FP8E5M2FNUZ: return "tg_llvm_r8d";
  default: return NULL;
  }
}
static const char *tof_fn(tg_dtype dt) {
  switch (dt) {
  case TG_FLOAT16: return "tg_llvm_h2f";
  case TG_BFLOAT16: return "tg_llvm_b2f";
  case TG_FP8E4M3: return "tg_llvm_8a2f";
  case TG_FP8E5M2: return "tg_llvm_8b2f";
  case TG_FP8E4M3FNUZ: return "tg_llvm_8c2f";
  case TG_FP8E5M2FNUZ: return "tg_llvm_8d2f";
  default: return NULL;
  }
}
static const char *fromf_fn(tg_dtype dt) {
  switch (dt) {
  case TG_FLOAT16: return "tg_llvm_f2h";
  case TG_BFLOAT16: return "tg_llvm_f2b";
  case TG_FP8E4M3: return "tg_llvm_f28a";
  case TG_FP8E5M2: return "tg_llvm_f28b";
  case TG_FP8E4M3FNUZ: return "tg_llvm_f28c";
  case TG_FP8E5M2FNUZ: return "tg_llvm_f28d";
  default: return NULL;
  }
}

static const char DECLS[] =
    "declare float @tg_llvm_h2f(i16 zeroext)\n"
    "declare zeroext i16 @tg_llvm_f2h(float)\n"
    "declare float @tg_llvm_rh(float)\n"
    "declare float @tg_llvm_b2f(i16 zeroext)\n"
    "declare zeroext i16 @tg_llvm_f2b(float)\n"
    "declare float @tg_llvm_rb(float)\n"
    "declare float @tg_llvm_8a2f(i8 zeroext)\n"
    "declare float @tg_llvm_8b2f(i8 zeroext)\n"
    "declare float @tg_llvm_8c2f(i8 zeroext)\n"
    "declare float @tg_llvm_8d2f(i8 zeroext)\n"
    "declare zeroext i8 @tg_llvm_f28a(double)\n"
    "declare zeroext i8 @tg_llvm_f28b(double)\n"
    "declare zeroext i8 @tg_llvm_f28c(double)\n"
    "declare zeroext i8 @tg_llvm_f28d(double)\n"
    "declare float @tg_llvm_r8a(double)\n"
    "declare float @tg_llvm_r8b(double)\n"
    "declare float @tg_llvm_r8c(double)\n"
    "declare float @tg_llvm_r8d(double)\n"
    "declare i64 @tg_llvm_ipow(i64, i64)\n";

typedef struct {
  SB *b;
  const LKernel *k;
  PtrMap names; /* node -> malloc'd operand text (SSA name or literal) */
  PtrMap vec;   /* node -> 1 when the value is a vector of vw lanes */
  PtrMap level; /* node -> level + 1 */
  PtrMap post;  /* nodes that depend on a reduction result */
  PtrMap seen;
  PtrVec order;
  int vw;
  int nv, nl;
  bool uses_vexp2, uses_vlog2, uses_vsin;
  bool uses_vh, uses_vb; /* the float16 / bfloat16 vector conversions */
  bool f16c;             /* float16 vectors may convert with LLVM's half type (the CPU's F16C) */
  PtrMap bits, storeonly; /* kernel_half_bits */
  SB intr; /* intrinsic declarations used */
} LR;

static const char *nm(LR *r, UOp *u) { return pm_get(&r->names, (uint64_t)(uintptr_t)u); }
static bool isvec(LR *r, UOp *u) { return u && pm_has(&r->vec, (uint64_t)(uintptr_t)u); }
static void setname(LR *r, UOp *u, const char *s) { pm_put(&r->names, (uint64_t)(uintptr_t)u, tg_xstrdup(s)); }

/* a fresh SSA name */
static const char *fresh(LR *r, char *buf) {
  snprintf(buf, 32, "%%t%d", r->nv++);
  return buf;
}

static void declare_intr(LR *r, const char *decl) {
  if (!r->intr.s || !strstr(r->intr.s, decl)) sb_printf(&r->intr, "%s\n", decl);
}

/* the type of u's value (vector or scalar) */
static void tyof(LR *r, UOp *u, char *out) {
  if (isvec(r, u)) snprintf(out, 48, "<%d x %s>", r->vw, lty((tg_dtype)u->dtype));
  else snprintf(out, 48, "%s", lty((tg_dtype)u->dtype));
}

static void flit(double v, bool dbl, char *out) {
  double d = dbl ? v : (double)(float)v;
  uint64_t b;
  memcpy(&b, &d, 8);
  snprintf(out, 48, "0x%016llX", (unsigned long long)b);
}

static char *const_text(tg_dtype dt, const UOp *u) {
  char buf[64];
  if (is_fl(dt)) flit(u->arg.f, dt == TG_FLOAT64, buf);
  else if (dt == TG_BOOL) snprintf(buf, sizeof buf, "%s", u->arg.i ? "true" : "false");
  else {
    int n = bits(dt);
    int64_t v = u->arg.i;
    if (n == 8) v = (int8_t)v;
    else if (n == 16) v = (int16_t)v;
    else if (n == 32) v = (int32_t)v;
    snprintf(buf, sizeof buf, "%lld", (long long)v);
  }
  return tg_xstrdup(buf);
}

/* operand u as a vector of W lanes of its type (scalars are broadcast) */
static void vopnd(LR *r, UOp *u, char *out) {
  if (isvec(r, u)) {
    snprintf(out, 48, "%s", nm(r, u));
    return;
  }
  const char *t = lty((tg_dtype)u->dtype);
  char a[32], b2[32];
  fresh(r, a), fresh(r, b2);
  sb_printf(r->b, "  %s = insertelement <%d x %s> poison, %s %s, i64 0\n", a, r->vw, t, t, nm(r, u));
  sb_printf(r->b, "  %s = shufflevector <%d x %s> %s, <%d x %s> poison, <%d x i32> zeroinitializer\n", b2, r->vw, t, a,
            r->vw, t, r->vw);
  snprintf(out, 48, "%s", b2);
}

/* operand text of u for an instruction whose result is vector when `v` (broadcast if needed) */
static void opnd(LR *r, UOp *u, bool v, char *out) {
  if (v) vopnd(r, u, out);
  else snprintf(out, 48, "%s", nm(r, u));
}

static void call_round(LR *r, tg_dtype dt, char *val) {
  const char *f = rnd_fn(dt);
  if (!f || !is_fl(dt)) return;
  char t[32];
  fresh(r, t);
  if (dtype_is_fp8(dt)) {
    char d[32];
    fresh(r, d);
    sb_printf(r->b, "  %s = fpext float %s to double\n", d, val);
    sb_printf(r->b, "  %s = call float @%s(double %s)\n", t, f, d);
  } else {
    sb_printf(r->b, "  %s = call float @%s(float %s)\n", t, f, val);
  }
  strcpy(val, t);
}

static bool is_vhalf(tg_dtype dt) { return dt == TG_FLOAT16 || dt == TG_BFLOAT16; }
static bool has(const PtrMap *m, const UOp *u) { return pm_has(m, (uint64_t)(uintptr_t)u); }

/* W halves of dtype dt, their bits in raw (<W x i16>) -> float lanes: with the hardware where `hw`
 * and the CPU has F16C (it quiets a signalling NaN), else exactly */
static void vhalf_bits_to_float(LR *r, tg_dtype dt, const char *raw, bool hw, char *out) {
  fresh(r, out);
  if (dt == TG_FLOAT16 && hw && r->f16c) {
    char h[32];
    fresh(r, h);
    sb_printf(r->b, "  %s = bitcast <%d x i16> %s to <%d x half>\n", h, r->vw, raw, r->vw);
    sb_printf(r->b, "  %s = fpext <%d x half> %s to <%d x float>\n", out, r->vw, h, r->vw);
    return;
  }
  bool b = dt == TG_BFLOAT16;
  if (b) r->uses_vb = true;
  else r->uses_vh = true;
  sb_printf(r->b, "  %s = call <%d x float> @tg_v%s2f_%d(<%d x i16> %s)\n", out, r->vw, b ? "b" : "h", r->vw, r->vw, raw);
}

/* A float16/bfloat16 load u's bits -> float lanes: by the hardware only where no consumer keeps u's
 * bits (the arithmetic reading it would quiet a signalling NaN anyway) */
static void vhalf_from_bits(LR *r, const UOp *u, const char *raw, char *out) {
  vhalf_bits_to_float(r, (tg_dtype)u->dtype, raw, !has(&r->bits, u), out);
}

/* float lanes x of dtype dt -> their <W x i16> bits, rounding to nearest even: with the hardware
 * where `hw` (x is never a signalling NaN) and the CPU has F16C, else exactly */
static void vhalf_to_bits(LR *r, tg_dtype dt, const char *x, bool hw, char *out) {
  fresh(r, out);
  if (dt == TG_FLOAT16 && hw && r->f16c) {
    char h[32];
    fresh(r, h);
    sb_printf(r->b, "  %s = fptrunc <%d x float> %s to <%d x half>\n", h, r->vw, x, r->vw);
    sb_printf(r->b, "  %s = bitcast <%d x half> %s to <%d x i16>\n", out, r->vw, h, r->vw);
    return;
  }
  bool b = dt == TG_BFLOAT16;
  if (b) r->uses_vb = true;
  else r->uses_vh = true;
  sb_printf(r->b, "  %s = call <%d x i16> @tg_vf2%s_%d(<%d x float> %s)\n", out, r->vw, b ? "b" : "h", r->vw, r->vw, x);
}

/* A float16/bfloat16 vector result u (float lanes, name in out) rounded to its dtype, as the C
 * renderer rounds it (vhalf_round): the hardware's conversion there and back after arithmetic and
 * after a cast whose bits no consumer keeps, the exact one otherwise. */
static void vhalf_result(LR *r, UOp *u, char *out) {
  VHRound how = vhalf_round(u);
  if (how == VH_ARITH && has(&r->storeonly, u)) how = VH_EXACT;
  if (how == VH_EXACT) return;
  bool hw = how == VH_ARITH || !has(&r->bits, u) || float_arith_result(u->src[0]);
  char bits16[32];
  vhalf_to_bits(r, (tg_dtype)u->dtype, out, hw, bits16);
  vhalf_bits_to_float(r, (tg_dtype)u->dtype, bits16, hw, out);
}

/* a unary float intrinsic (scalar or vector of type ty) */
static void intr1(LR *r, const char *name, const char *ty, bool vec, bool dbl, const char *a, char *out) {
  char decl[160], suffix[32];
  if (vec) snprintf(suffix, sizeof suffix, "v%d%s", r->vw, dbl ? "f64" : "f32");
  else snprintf(suffix, sizeof suffix, "%s", dbl ? "f64" : "f32");
  snprintf(decl, sizeof decl, "declare %s @llvm.%s.%s(%s)", ty, name, suffix, ty);
  declare_intr(r, decl);
  fresh(r, out);
  sb_printf(r->b, "  %s = call %s @llvm.%s.%s(%s %s)\n", out, ty, name, suffix, ty, a);
}
static void intr2(LR *r, const char *name, const char *ty, bool vec, bool dbl, const char *a, const char *b, char *out) {
  char decl[200], suffix[32];
  if (vec) snprintf(suffix, sizeof suffix, "v%d%s", r->vw, dbl ? "f64" : "f32");
  else snprintf(suffix, sizeof suffix, "%s", dbl ? "f64" : "f32");
  snprintf(decl, sizeof decl, "declare %s @llvm.%s.%s(%s, %s)", ty, name, suffix, ty, ty);
  declare_intr(r, decl);
  fresh(r, out);
  sb_printf(r->b, "  %s = call %s @llvm.%s.%s(%s %s, %s %s)\n", out, ty, name, suffix, ty, a, ty, b);
}

/* float max as the C renderer writes it: (a > b || a != a) ? a : b */
static void fmax_emit(LR *r, const char *ty, const char *cty, const char *a, const char *b, char *out) {
  char c1[32], c2[32], c3[32];
  fresh(r, c1), fresh(r, c2), fresh(r, c3), fresh(r, out);
  sb_printf(r->b, "  %s = fcmp ogt %s %s, %s\n  %s = fcmp uno %s %s, %s\n  %s = or %s %s, %s\n", c1, ty, a, b, c2, ty, a, a,
            c3, cty, c1, c2);
  sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", out, cty, c3, ty, a, ty, b);
}

/* the i1 (or <W x i1>) type matching ty */
static void cmp_ty(LR *r, bool v, char *out) {
  if (v) snprintf(out, 48, "<%d x i1>", r->vw);
  else snprintf(out, 48, "i1");
}

/* a constant: lit itself, or a vector of W copies of it */
static void splat(LR *r, bool v, const char *ety, const char *lit, char *out, size_t cap) {
  if (!v) {
    snprintf(out, cap, "%s", lit);
    return;
  }
  SB s;
  sb_init(&s);
  sb_puts(&s, "<");
  for (int l = 0; l < r->vw; l++) sb_printf(&s, "%s%s %s", l ? ", " : "", ety, lit);
  sb_puts(&s, ">");
  snprintf(out, cap, "%s", s.s);
  sb_free(&s);
}

/* integer division / modulo with the C renderer's guards (by 0: 0; by -1: negation / 0) */
static void idivmod(LR *r, UOp *u, bool v, const char *ty, const char *a, const char *b, char *out) {
  tg_dtype dt = (tg_dtype)u->dtype;
  bool mod = u->op == OP_MOD;
  char ct[48], z[32], m1[32], bad[32], bs[32], q[32], one[2048], zero[2048], mone[2048];
  cmp_ty(r, v, ct);
  splat(r, v, lty(dt), "1", one, sizeof one);
  splat(r, v, lty(dt), "0", zero, sizeof zero);
  splat(r, v, lty(dt), "-1", mone, sizeof mone);
  fresh(r, z), fresh(r, bs), fresh(r, q), fresh(r, out);
  sb_printf(r->b, "  %s = icmp eq %s %s, %s\n", z, ty, b, zero);
  if (is_uns(dt)) {
    sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", bs, ct, z, ty, one, ty, b);
    sb_printf(r->b, "  %s = %s %s %s, %s\n", q, mod ? "urem" : "udiv", ty, a, bs);
    sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", out, ct, z, ty, zero, ty, q);
    return;
  }
  fresh(r, m1), fresh(r, bad);
  sb_printf(r->b, "  %s = icmp eq %s %s, %s\n", m1, ty, b, mone);
  sb_printf(r->b, "  %s = or %s %s, %s\n", bad, ct, z, m1);
  sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", bs, ct, bad, ty, one, ty, b);
  sb_printf(r->b, "  %s = %s %s %s, %s\n", q, mod ? "srem" : "sdiv", ty, a, bs);
  if (mod) {
    sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", out, ct, bad, ty, zero, ty, q);
  } else {
    char ng[32], t2[32];
    fresh(r, ng), fresh(r, t2);
    sb_printf(r->b, "  %s = sub %s %s, %s\n", ng, ty, zero, a);
    sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", t2, ct, m1, ty, ng, ty, q);
    sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", out, ct, z, ty, zero, ty, t2);
  }
}

/* converts value a of dtype sdt (register form; vector when v) to dtype dt (C conversions) */
static void convert(LR *r, bool v, tg_dtype sdt, tg_dtype dt, const char *a, char *out) {
  char st[48], dty[48];
  if (v) snprintf(st, sizeof st, "<%d x %s>", r->vw, lty(sdt)), snprintf(dty, sizeof dty, "<%d x %s>", r->vw, lty(dt));
  else snprintf(st, sizeof st, "%s", lty(sdt)), snprintf(dty, sizeof dty, "%s", lty(dt));
  if (dt == TG_BOOL) {
    fresh(r, out);
    if (is_fl(sdt)) sb_printf(r->b, "  %s = fcmp une %s %s, %s\n", out, st, a, v ? "zeroinitializer" : "0.0");
    else if (sdt == TG_BOOL) sb_printf(r->b, "  %s = or %s %s, %s\n", out, st, a, v ? "zeroinitializer" : "false");
    else sb_printf(r->b, "  %s = icmp ne %s %s, %s\n", out, st, a, v ? "zeroinitializer" : "0");
    return;
  }
  if (!strcmp(st, dty) && (is_fl(sdt) == is_fl(dt))) {
    snprintf(out, 48, "%s", a);
    if (is_fl(dt) && rnd_fn(dt) && !v) {
      char t[48];
      snprintf(t, sizeof t, "%s", a);
      /* float -> narrow float: one rounding (fp8 from the value's double form) */
      call_round(r, dt, t);
      snprintf(out, 48, "%s", t);
    }
    return;
  }
  fresh(r, out);
  if (is_fl(sdt) && is_fl(dt)) {
    /* float <-> double */
    bool up = sdt != TG_FLOAT64 && dt == TG_FLOAT64;
    sb_printf(r->b, "  %s = %s %s %s to %s\n", out, up ? "fpext" : "fptrunc", st, a, dty);
    if (!v && rnd_fn(dt)) {
      if (dtype_is_fp8(dt)) {
        /* one rounding from the double value */
        char t[32];
        fresh(r, t);
        sb_printf(r->b, "  %s = call float @%s(double %s)\n", t, rnd_fn(dt), a);
        strcpy(out, t);
      } else {
        call_round(r, dt, out);
      }
    }
    return;
  }
  if (is_fl(dt)) {
    sb_printf(r->b, "  %s = %s %s %s to %s\n", out, is_uns(sdt) ? "uitofp" : "sitofp", st, a, dty);
    if (!v && rnd_fn(dt)) {
      if (dtype_is_fp8(dt)) {
        char d[32], t[32];
        fresh(r, d), fresh(r, t);
        sb_printf(r->b, "  %s = %s %s %s to double\n", d, is_uns(sdt) ? "uitofp" : "sitofp", st, a);
        sb_printf(r->b, "  %s = call float @%s(double %s)\n", t, rnd_fn(dt), d);
        strcpy(out, t);
      } else {
        call_round(r, dt, out);
      }
    }
    return;
  }
  if (is_fl(sdt)) {
    sb_printf(r->b, "  %s = %s %s %s to %s\n", out, is_uns(dt) ? "fptoui" : "fptosi", st, a, dty);
    return;
  }
  int sb_ = bits(sdt), db = bits(dt);
  if (db < sb_) sb_printf(r->b, "  %s = trunc %s %s to %s\n", out, st, a, dty);
  else if (db > sb_) sb_printf(r->b, "  %s = %s %s %s to %s\n", out, is_uns(sdt) ? "zext" : "sext", st, a, dty);
  else sb_printf(r->b, "  %s = or %s %s, %s\n", out, st, a, v ? "zeroinitializer" : "0");
}

/* the address of element idx of buffer p */
static void gep(LR *r, tg_dtype dt, const char *p, const char *idx, char *out) {
  fresh(r, out);
  sb_printf(r->b, "  %s = getelementptr inbounds %s, ptr %s, i64 %s\n", out, sty(dt), p, idx);
}

/* loads one element's storage bits (its memory type) */
static void load_raw(LR *r, tg_dtype dt, const char *p, const char *idx, char *out) {
  char a[32];
  gep(r, dt, p, idx, a);
  fresh(r, out);
  sb_printf(r->b, "  %s = load %s, ptr %s, align %d\n", out, sty(dt), a, (int)tg_dtype_itemsize(dt));
}

/* loads one scalar element, converted to its register form */
static void load_scalar(LR *r, tg_dtype dt, const char *p, const char *idx, char *out) {
  char x[32];
  load_raw(r, dt, p, idx, x);
  if (dt == TG_BOOL) {
    fresh(r, out);
    sb_printf(r->b, "  %s = icmp ne i8 %s, 0\n", out, x);
  } else if (tof_fn(dt)) {
    fresh(r, out);
    sb_printf(r->b, "  %s = call float @%s(%s zeroext %s)\n", out, tof_fn(dt), sty(dt), x);
  } else {
    strcpy(out, x);
  }
}

static const char *zero_of(tg_dtype dt) {
  if (dt == TG_BOOL) return "false";
  if (is_fl(dt)) return "0.0";
  return "0";
}

/* a gated value: `cond ? <computed in a block of its own> : zero` as a branch and a phi */
typedef struct {
  char then_lbl[32], join_lbl[32], from_lbl[32];
} Gate;

static void gate_open(LR *r, const char *cond, Gate *g) {
  int n = r->nl++;
  snprintf(g->then_lbl, sizeof g->then_lbl, "g%d.then", n);
  snprintf(g->join_lbl, sizeof g->join_lbl, "g%d.join", n);
  snprintf(g->from_lbl, sizeof g->from_lbl, "g%d.from", n);
  /* the block the branch leaves from gets a name so the phi can refer to it */
  sb_printf(r->b, "  br label %%%s\n%s:\n", g->from_lbl, g->from_lbl);
  sb_printf(r->b, "  br i1 %s, label %%%s, label %%%s\n%s:\n", cond, g->then_lbl, g->join_lbl, g->then_lbl);
}
static void gate_close(LR *r, Gate *g, const char *ty, const char *val, const char *zero, char *out) {
  char end[48];
  snprintf(end, sizeof end, "%s.end", g->then_lbl);
  sb_printf(r->b, "  br label %%%s\n%s:\n  br label %%%s\n%s:\n", end, end, g->join_lbl, g->join_lbl);
  fresh(r, out);
  sb_printf(r->b, "  %s = phi %s [ %s, %%%s ], [ %s, %%%s ]\n", out, ty, val, end, zero, g->from_lbl);
}

static bool gated(const UOp *u) { return u->nsrc > 2 && !(u->src[2]->op == OP_CONST && u->src[2]->arg.i); }

static void emit_load(LR *r, UOp *u, char *out) {
  tg_dtype dt = (tg_dtype)u->dtype;
  const char *p = nm(r, u->src[0]), *idx = nm(r, u->src[1]);
  bool v = isvec(r, u);
  if (!v) {
    if (!gated(u)) {
      load_scalar(r, dt, p, idx, out);
      return;
    }
    Gate g;
    char x[32];
    gate_open(r, nm(r, u->src[2]), &g);
    load_scalar(r, dt, p, idx, x);
    gate_close(r, &g, lty(dt), x, zero_of(dt), out);
    return;
  }
  char vt[48], vst[48];
  snprintf(vt, sizeof vt, "<%d x %s>", r->vw, lty(dt));
  snprintf(vst, sizeof vst, "<%d x %s>", r->vw, sty(dt));
  Gate g;
  if (gated(u)) gate_open(r, nm(r, u->src[2]), &g);
  char x[32];
  if (u->niarg == 1) { /* a gather: lane l at base + l*stride */
    char prev[32] = "poison";
    bool h = is_vhalf(dt); /* halves: their bits gathered, then converted as a vector */
    for (int l = 0; l < (int)u->arg.i; l++) {
      char ix[32], e[32], nv[32];
      fresh(r, ix);
      sb_printf(r->b, "  %s = add i64 %s, %lld\n", ix, idx, (long long)(l * u->iarg[0]));
      if (h) load_raw(r, dt, p, ix, e);
      else load_scalar(r, dt, p, ix, e);
      fresh(r, nv);
      sb_printf(r->b, "  %s = insertelement %s %s, %s %s, i64 %d\n", nv, h ? vst : vt, prev, h ? "i16" : lty(dt), e, l);
      strcpy(prev, nv);
    }
    if (h) vhalf_from_bits(r, u, prev, x);
    else strcpy(x, prev);
  } else {
    char a[32], raw[32];
    gep(r, dt, p, idx, a);
    fresh(r, raw);
    sb_printf(r->b, "  %s = load %s, ptr %s, align %d\n", raw, vst, a, (int)tg_dtype_itemsize(dt));
    if (dt == TG_BOOL) {
      fresh(r, x);
      sb_printf(r->b, "  %s = icmp ne %s %s, zeroinitializer\n", x, vst, raw);
    } else if (is_vhalf(dt)) {
      vhalf_from_bits(r, u, raw, x);
    } else {
      strcpy(x, raw);
    }
  }
  if (gated(u)) gate_close(r, &g, vt, x, "zeroinitializer", out);
  else strcpy(out, x);
}

/* the value of node u (an ALU op or a load), written as instructions; its name in out (float16
 * and bfloat16 vectors unrounded: emit_node rounds them) */
static void emit_node_f(LR *r, UOp *u, char *out) {
  tg_dtype dt = (tg_dtype)u->dtype;
  bool v = isvec(r, u);
  UOp *A = u->nsrc > 0 ? u->src[0] : NULL, *B = u->nsrc > 1 ? u->src[1] : NULL, *C = u->nsrc > 2 ? u->src[2] : NULL;
  tg_dtype sdt = A ? (tg_dtype)A->dtype : dt;
  char ty[48], sty_[48], a[48] = "", b[48] = "", c[48] = "";
  tyof(r, u, ty);
  if (u->op == OP_LOAD) {
    emit_load(r, u, out);
    return;
  }
  if (v) snprintf(sty_, sizeof sty_, "<%d x %s>", r->vw, lty(sdt));
  else snprintf(sty_, sizeof sty_, "%s", lty(sdt));
  bool fl = is_fl(dt), sfl = is_fl(sdt), dbl = dt == TG_FLOAT64;
  switch (u->op) {
  case OP_EXP2: case OP_LOG2: case OP_SIN: case OP_SQRT: {
    opnd(r, A, v, a);
    if (v && (dt == TG_FLOAT32 || is_vhalf(dt)) && u->op != OP_SQRT) {
      const char *fn = u->op == OP_EXP2 ? "exp2" : u->op == OP_LOG2 ? "log2" : "sin";
      if (u->op == OP_EXP2) r->uses_vexp2 = true;
      else if (u->op == OP_LOG2) r->uses_vlog2 = true;
      else r->uses_vsin = true;
      char decl[160];
      snprintf(decl, sizeof decl, "declare <%d x float> @llvm.fma.v%df32(<%d x float>, <%d x float>, <%d x float>)", r->vw, r->vw,
               r->vw, r->vw, r->vw);
      declare_intr(r, decl);
      if (u->op == OP_EXP2) {
        snprintf(decl, sizeof decl, "declare i1 @llvm.vector.reduce.and.v%di1(<%d x i1>)", r->vw, r->vw);
        declare_intr(r, decl);
      }
      if (u->op == OP_SIN) {
        snprintf(decl, sizeof decl, "declare <%d x double> @llvm.fma.v%df64(<%d x double>, <%d x double>, <%d x double>)", r->vw,
                 r->vw, r->vw, r->vw, r->vw);
        declare_intr(r, decl);
        snprintf(decl, sizeof decl, "declare i1 @llvm.vector.reduce.or.v%di1(<%d x i1>)", r->vw, r->vw);
        declare_intr(r, decl);
        declare_intr(r, "declare float @llvm.sin.f32(float)");
      }
      fresh(r, out);
      sb_printf(r->b, "  %s = call %s @tg_v%s_%d(%s %s)\n", out, ty, fn, r->vw, ty, a);
      return;
    }
    const char *f = u->op == OP_EXP2 ? "exp2" : u->op == OP_LOG2 ? "log2" : u->op == OP_SIN ? "sin" : "sqrt";
    intr1(r, f, ty, v, dbl, a, out);
    if (!v) call_round(r, dt, out);
    return;
  }
  case OP_TRUNC:
    opnd(r, A, v, a);
    if (fl) intr1(r, "trunc", ty, v, dbl, a, out);
    else strcpy(out, a);
    return;
  case OP_RECIP: {
    char one[2048];
    opnd(r, A, v, a);
    splat(r, v, lty(dt), dbl ? "1.0" : "1.0", one, sizeof one);
    fresh(r, out);
    sb_printf(r->b, "  %s = fdiv %s %s, %s\n", out, ty, one, a);
    if (!v) call_round(r, dt, out);
    return;
  }
  case OP_NEG: {
    char t[2048];
    opnd(r, A, v, a);
    fresh(r, out);
    if (dt == TG_BOOL) {
      splat(r, v, "i1", "true", t, sizeof t);
      sb_printf(r->b, "  %s = xor %s %s, %s\n", out, ty, a, t);
    } else if (fl) {
      sb_printf(r->b, "  %s = fneg %s %s\n", out, ty, a);
    } else {
      sb_printf(r->b, "  %s = sub %s %s, %s\n", out, ty, v ? "zeroinitializer" : "0", a);
    }
    return;
  }
  case OP_CAST:
    if (u->niarg == 1 && v) { /* lanes of an index: base + <0, 1, ..., W-1> */
      char base[32], bv[48];
      convert(r, false, sdt, dt, nm(r, A), base);
      char ins[32];
      fresh(r, ins), fresh(r, bv);
      sb_printf(r->b, "  %s = insertelement %s poison, %s %s, i64 0\n", ins, ty, lty(dt), base);
      sb_printf(r->b, "  %s = shufflevector %s %s, %s poison, <%d x i32> zeroinitializer\n", bv, ty, ins, ty, r->vw);
      SB s;
      sb_init(&s);
      sb_puts(&s, "<");
      for (int l = 0; l < r->vw; l++) sb_printf(&s, "%s%s %d", l ? ", " : "", lty(dt), l);
      sb_puts(&s, ">");
      fresh(r, out);
      sb_printf(r->b, "  %s = add %s %s, %s\n", out, ty, bv, s.s);
      sb_free(&s);
      return;
    }
    if (A->op == OP_CONST && tg_dtype_is_float(sdt) && tg_dtype_is_int(dt) && dt != TG_BOOL) {
      /* a float constant into an integer: folded by the library's rule (NaN -> 0, truncate,
       * saturate to int64, wrap to the width); fptosi of an out-of-range constant is poison */
      char lit[32], sl[2048];
      int64_t iv = dtype_int_of(dt, A->arg.f);
      int nb = (int)tg_dtype_itemsize(dt) * 8;
      if (nb < 64) iv = (int64_t)((uint64_t)iv << (64 - nb)) >> (64 - nb); /* (LLVM's literals: signed in the width) */
      snprintf(lit, sizeof lit, "%lld", (long long)iv);
      splat(r, v, lty(dt), lit, sl, sizeof sl);
      fresh(r, out);
      sb_printf(r->b, "  %s = add %s %s, %s\n", out, ty, v ? "zeroinitializer" : "0", sl);
      return;
    }
    opnd(r, A, v, a);
    convert(r, v, sdt, dt, a, out);
    return;
  case OP_BITCAST: {
    opnd(r, A, v, a);
    /* the source's storage bits */
    char bitsv[48];
    int nb = (int)tg_dtype_itemsize(sdt) * 8;
    char ity[48];
    if (v) snprintf(ity, sizeof ity, "<%d x i%d>", r->vw, nb);
    else snprintf(ity, sizeof ity, "i%d", nb);
    if (!v && is_narrow(sdt)) {
      fresh(r, bitsv);
      if (dtype_is_fp8(sdt)) {
        char d[32];
        fresh(r, d);
        sb_printf(r->b, "  %s = fpext float %s to double\n", d, a);
        sb_printf(r->b, "  %s = call i8 @%s(double %s)\n", bitsv, fromf_fn(sdt), d);
      } else {
        sb_printf(r->b, "  %s = call i16 @%s(float %s)\n", bitsv, fromf_fn(sdt), a);
      }
    } else if (sfl) {
      fresh(r, bitsv);
      sb_printf(r->b, "  %s = bitcast %s %s to %s\n", bitsv, sty_, a, ity);
    } else if (sdt == TG_BOOL) {
      fresh(r, bitsv);
      sb_printf(r->b, "  %s = zext %s %s to %s\n", bitsv, sty_, a, ity);
    } else {
      strcpy(bitsv, a);
    }
    if (!v && is_narrow(dt)) {
      fresh(r, out);
      sb_printf(r->b, "  %s = call float @%s(%s zeroext %s)\n", out, tof_fn(dt), sty(dt), bitsv);
    } else if (fl) {
      fresh(r, out);
      sb_printf(r->b, "  %s = bitcast %s %s to %s\n", out, ity, bitsv, ty);
    } else if (dt == TG_BOOL) {
      fresh(r, out);
      sb_printf(r->b, "  %s = icmp ne %s %s, %s\n", out, ity, bitsv, v ? "zeroinitializer" : "0");
    } else {
      strcpy(out, bitsv);
    }
    return;
  }
  case OP_WHERE: {
    char ct[48];
    snprintf(a, sizeof a, "%s", nm(r, A));
    cmp_ty(r, isvec(r, A), ct);
    opnd(r, B, v, b);
    opnd(r, C, v, c);
    fresh(r, out);
    sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", out, ct, a, ty, b, ty, c);
    return;
  }
  default: break;
  }
  /* binary ops */
  opnd(r, A, v, a);
  opnd(r, B, v, b);
  char ct[48];
  cmp_ty(r, v, ct);
  bool amask = sdt == TG_BOOL;
  if (amask && (u->op == OP_CMPLT || u->op == OP_MUL || u->op == OP_ADD || u->op == OP_MAX || u->op == OP_SUB)) {
    /* bools: false < true is ~a & b; a*b is a and b; a+b and max are a or b; a-b is a xor b */
    fresh(r, out);
    if (u->op == OP_CMPLT) {
      sb_printf(r->b, "  %s = icmp ult %s %s, %s\n", out, sty_, a, b);
    } else {
      const char *op = u->op == OP_MUL ? "and" : u->op == OP_SUB ? "xor" : "or";
      sb_printf(r->b, "  %s = %s %s %s, %s\n", out, op, ty, a, b);
    }
    return;
  }
  switch (u->op) {
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_FDIV: {
    const char *op;
    if (sfl) op = u->op == OP_ADD ? "fadd contract" : u->op == OP_SUB ? "fsub contract" : u->op == OP_MUL ? "fmul contract" : "fdiv";
    else op = u->op == OP_ADD ? "add" : u->op == OP_SUB ? "sub" : u->op == OP_MUL ? "mul" : (is_uns(dt) ? "udiv" : "sdiv");
    fresh(r, out);
    sb_printf(r->b, "  %s = %s %s %s, %s\n", out, op, ty, a, b);
    if (!v) call_round(r, dt, out);
    return;
  }
  case OP_IDIV:
    if (fl) {
      char q[32];
      fresh(r, q);
      sb_printf(r->b, "  %s = fdiv %s %s, %s\n", q, ty, a, b);
      intr1(r, "trunc", ty, v, dbl, q, out);
      if (!v) call_round(r, dt, out);
    } else {
      idivmod(r, u, v, ty, a, b, out);
    }
    return;
  case OP_MOD:
    if (fl) {
      fresh(r, out);
      sb_printf(r->b, "  %s = frem %s %s, %s\n", out, ty, a, b);
      if (!v) call_round(r, dt, out);
    } else {
      idivmod(r, u, v, ty, a, b, out);
    }
    return;
  case OP_MAX:
    if (fl) {
      fmax_emit(r, ty, ct, a, b, out);
    } else {
      char cc[32];
      fresh(r, cc), fresh(r, out);
      sb_printf(r->b, "  %s = icmp %s %s %s, %s\n", cc, is_uns(dt) ? "ugt" : "sgt", ty, a, b);
      sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", out, ct, cc, ty, a, ty, b);
    }
    return;
  case OP_CMPLT: case OP_CMPNE: case OP_CMPEQ:
    fresh(r, out);
    if (sfl) sb_printf(r->b, "  %s = fcmp %s %s %s, %s\n", out, u->op == OP_CMPLT ? "olt" : u->op == OP_CMPNE ? "une" : "oeq", sty_, a, b);
    else sb_printf(r->b, "  %s = icmp %s %s %s, %s\n", out,
                   u->op == OP_CMPLT ? (is_uns(sdt) ? "ult" : "slt") : u->op == OP_CMPNE ? "ne" : "eq", sty_, a, b);
    return;
  case OP_AND: case OP_OR: case OP_XOR:
    fresh(r, out);
    sb_printf(r->b, "  %s = %s %s %s, %s\n", out, u->op == OP_AND ? "and" : u->op == OP_OR ? "or" : "xor", ty, a, b);
    return;
  case OP_SHL: case OP_SHR: {
    int nb = bits(dt);
    char m[32];
    fresh(r, m), fresh(r, out);
    char lim[16], ml[2048];
    /* 8- and 16-bit values shift as C's int (tinygrad's, PyTorch's): counts up to 31, in 32 bits */
    bool narrow = nb < 32;
    snprintf(lim, sizeof lim, "%d", narrow ? 31 : nb - 1);
    splat(r, v, lty(dt), lim, ml, sizeof ml);
    sb_printf(r->b, "  %s = and %s %s, %s\n", m, ty, b, ml);
    const char *op = u->op == OP_SHL ? "shl" : is_uns(dt) ? "lshr" : "ashr";
    if (!narrow) {
      sb_printf(r->b, "  %s = %s %s %s, %s\n", out, op, ty, a, m);
      return;
    }
    char wty[48], wa[32], wm[32], wr[32];
    if (v) snprintf(wty, sizeof wty, "<%d x i32>", r->vw);
    else snprintf(wty, sizeof wty, "i32");
    fresh(r, wa), fresh(r, wm), fresh(r, wr);
    sb_printf(r->b, "  %s = %s %s %s to %s\n", wa, is_uns(dt) ? "zext" : "sext", ty, a, wty);
    sb_printf(r->b, "  %s = zext %s %s to %s\n", wm, ty, m, wty);
    sb_printf(r->b, "  %s = %s %s %s, %s\n", wr, op, wty, wa, wm);
    sb_printf(r->b, "  %s = trunc %s %s to %s\n", out, wty, wr, ty);
    return;
  }
  case OP_POW:
    if (fl) {
      intr2(r, "pow", ty, v, dbl, a, b, out);
      if (!v) call_round(r, dt, out);
    } else {
      char a64[32], b64[32], p[32];
      convert(r, false, dt, TG_INT64, a, a64);
      convert(r, false, dt, TG_INT64, b, b64);
      fresh(r, p);
      sb_printf(r->b, "  %s = call i64 @tg_llvm_ipow(i64 %s, i64 %s)\n", p, a64, b64);
      convert(r, false, TG_INT64, dt, p, out);
    }
    return;
  default:
    TG_ASSERT(0 && "llvm renderer: unhandled op");
  }
}

static void emit_node(LR *r, UOp *u, char *out) {
  emit_node_f(r, u, out);
  if (isvec(r, u) && is_vhalf((tg_dtype)u->dtype) && u->op != OP_LOAD) vhalf_result(r, u, out);
}

/* ---- vector exp2 and log2: the C renderer's polynomials (cstyle.c, PRELUDE_V_EXP2/LOG2) as IR, so
 * a vectorized exp or log is not a libm call per lane ---- */

/* "<W x float> <c, c, ...>" text of a float constant */
static char *vk(int W, double v) {
  char one[48];
  flit(v, false, one);
  SB s;
  sb_init(&s);
  sb_puts(&s, "<");
  for (int l = 0; l < W; l++) sb_printf(&s, "%sfloat %s", l ? ", " : "", one);
  sb_puts(&s, ">");
  return sb_take(&s);
}
static char *vki(int W, long long v) {
  SB s;
  sb_init(&s);
  sb_puts(&s, "<");
  for (int l = 0; l < W; l++) sb_printf(&s, "%si32 %lld", l ? ", " : "", v);
  sb_puts(&s, ">");
  return sb_take(&s);
}

/* ---- float16/bfloat16 lanes: the C prelude's vector conversions (cstyle.c, PRELUDE_VHALF) as IR,
 * bit for bit the scalar ones, signalling NaNs and payloads included; subnormal halves are
 * computed on normal floats only, so flushed denormals (DAZ/FTZ) change nothing ---- */

/* "<W x i32> <c, c, ...>" operand text (type included) */
static void vi(char *out, size_t cap, int W, long long v) {
  char *k = vki(W, v);
  snprintf(out, cap, "%s", k);
  free(k);
}

static void emit_vhalf(SB *b, int W, bool half, bool bf16) {
  char t[32], I[32], F[32];
  snprintf(t, sizeof t, "<%d x i16>", W);
  snprintf(I, sizeof I, "<%d x i32>", W);
  snprintf(F, sizeof F, "<%d x float>", W);
  /* each instruction: "%name = op <ty> %a, <splat of k>" */
#define KI(name, op, a, k)                                  \
  do {                                                      \
    char c_[1024];                                          \
    vi(c_, sizeof c_, W, (k));                              \
    sb_printf(b, "  %%%s = %s %s %s, %s\n", name, op, I, a, c_); \
  } while (0)
  if (half) {
    char *k14 = vk(W, 0x1p-14), *khalf = vk(W, 0.5);
    /* halves -> floats: the magnitude moved up 13 bits and rebiased; infinities and NaNs one more
     * exponent step; subnormals as (that pattern + one exponent step) - 2^-14 */
    sb_printf(b, "define internal %s @tg_vh2f_%d(%s %%h16) alwaysinline {\n  %%h = zext %s %%h16 to %s\n", F, W, t, t, I);
    KI("m", "and", "%h", 0x7fff);
    KI("o0", "shl", "%m", 13);
    KI("e", "and", "%o0", 0x0f800000);
    KI("sm", "and", "%h", 0x8000);
    KI("s", "shl", "%sm", 16);
    KI("o1", "add", "%o0", 0x38000000);
    KI("zi", "add", "%o1", 0x00800000);
    sb_printf(b, "  %%zf = bitcast %s %%zi to %s\n  %%zs = fsub %s %%zf, %s\n  %%z = bitcast %s %%zs to %s\n", I, F, F, k14, F, I);
    KI("o2a", "add", "%o1", 0x38000000);
    KI("inf", "icmp eq", "%e", 0x0f800000);
    sb_printf(b, "  %%o2 = select <%d x i1> %%inf, %s %%o2a, %s %%o1\n", W, I, I);
    KI("den", "icmp eq", "%e", 0);
    sb_printf(b, "  %%r0 = select <%d x i1> %%den, %s %%z, %s %%o2\n  %%r = or %s %%r0, %%s\n", W, I, I, I);
    sb_printf(b, "  %%f = bitcast %s %%r to %s\n  ret %s %%f\n}\n", I, F, F);
    /* floats -> halves, nearest even: below the half normals by adding 0.5f (whose ulp is the
     * subnormals' step); normals rebiased with the rounding carry; overflow to infinity; a NaN keeps
     * its payload's top bits (a quiet bit where none would remain) */
    sb_printf(b, "define internal %s @tg_vf2h_%d(%s %%f) alwaysinline {\n  %%x = bitcast %s %%f to %s\n", t, W, F, F, I);
    KI("xs", "lshr", "%x", 16);
    KI("s", "and", "%xs", 0x8000);
    KI("a", "and", "%x", 0x7fffffff);
    KI("pa", "lshr", "%a", 13);
    KI("p", "and", "%pa", 0x3ff);
    sb_printf(b, "  %%af = bitcast %s %%a to %s\n  %%ah = fadd %s %%af, %s\n  %%ahi = bitcast %s %%ah to %s\n", I, F, F, khalf, F, I);
    KI("sm0", "sub", "%ahi", 0x3f000000);
    sb_printf(b, "  %%smr = or %s %%s, %%sm0\n", I);
    KI("odd", "and", "%pa", 1);
    KI("n0", "add", "%a", (int32_t)0xc8000fffu); /* i32 literals are signed */
    sb_printf(b, "  %%n1 = add %s %%n0, %%odd\n", I);
    KI("n2", "lshr", "%n1", 13);
    sb_printf(b, "  %%nm = or %s %%s, %%n2\n", I);
    KI("lt", "icmp ult", "%a", 0x38800000);
    sb_printf(b, "  %%r0 = select <%d x i1> %%lt, %s %%smr, %s %%nm\n", W, I, I);
    KI("big", "icmp uge", "%a", 0x477ff000);
    KI("sinf", "or", "%s", 0x7c00);
    sb_printf(b, "  %%r1 = select <%d x i1> %%big, %s %%sinf, %s %%r0\n", W, I, I);
    KI("pz", "icmp eq", "%p", 0);
    {
      char c2[1024], c0[1024];
      vi(c2, sizeof c2, W, 0x200), vi(c0, sizeof c0, W, 0);
      sb_printf(b, "  %%q = select <%d x i1> %%pz, %s %s, %s %s\n", W, I, c2, I, c0);
    }
    sb_printf(b, "  %%nan0 = or %s %%sinf, %%p\n  %%nan = or %s %%nan0, %%q\n", I, I);
    KI("isnan", "icmp ugt", "%a", 0x7f800000);
    sb_printf(b, "  %%r2 = select <%d x i1> %%isnan, %s %%nan, %s %%r1\n", W, I, I);
    sb_printf(b, "  %%r = trunc %s %%r2 to %s\n  ret %s %%r\n}\n", I, t, t);
    free(k14), free(khalf);
  }
  if (bf16) {
    sb_printf(b, "define internal %s @tg_vb2f_%d(%s %%h16) alwaysinline {\n  %%h = zext %s %%h16 to %s\n", F, W, t, t, I);
    KI("x", "shl", "%h", 16);
    sb_printf(b, "  %%f = bitcast %s %%x to %s\n  ret %s %%f\n}\n", I, F, F);
    /* nearest even by the rounding carry; a NaN keeps its top bits (a quiet bit where none would remain) */
    sb_printf(b, "define internal %s @tg_vf2b_%d(%s %%f) alwaysinline {\n  %%x = bitcast %s %%f to %s\n", t, W, F, F, I);
    KI("t", "lshr", "%x", 16);
    KI("a", "and", "%x", 0x7fffffff);
    KI("isnan", "icmp ugt", "%a", 0x7f800000);
    KI("t7", "and", "%t", 0x7f);
    KI("tz", "icmp eq", "%t7", 0);
    {
      char c4[1024], c0[1024];
      vi(c4, sizeof c4, W, 0x40), vi(c0, sizeof c0, W, 0);
      sb_printf(b, "  %%q = select <%d x i1> %%tz, %s %s, %s %s\n", W, I, c4, I, c0);
    }
    sb_printf(b, "  %%nan = or %s %%t, %%q\n", I);
    KI("odd", "and", "%t", 1);
    KI("r0", "add", "%x", 0x7fff);
    sb_printf(b, "  %%r1 = add %s %%r0, %%odd\n", I);
    KI("rn", "lshr", "%r1", 16);
    sb_printf(b, "  %%r2 = select <%d x i1> %%isnan, %s %%nan, %s %%rn\n", W, I, I);
    sb_printf(b, "  %%r = trunc %s %%r2 to %s\n  ret %s %%r\n}\n", I, t, t);
  }
#undef KI
}

/* out = fma(a, b, c) on <W x float>, c a constant */
static void vfma_k(SB *b, int W, const char *out, const char *x, const char *y, double c) {
  char *k = vk(W, c);
  sb_printf(b, "  %s = call <%d x float> @llvm.fma.v%df32(<%d x float> %s, <%d x float> %s, <%d x float> %s)\n", out, W, W, W, x, W,
            y, W, k);
  free(k);
}

/* exp2 as the C renderer's prelude computes it (cstyle.c), with the same fast path: when every
 * lane's n = round(x) is in [-125, 127] (an ordered compare, so NaN lanes take the slow path),
 * 2^n is added to p's exponent field as an integer; otherwise x is clamped to [-151, 129] and p is
 * scaled by two factors 2^(n/2), 2^(n - n/2), NaN passing through. Both paths give the C code's
 * bits. (n << 23 is the bits of x + 1.5*2^23 shifted by 23, as in C: no conversion.) */
static void emit_poly_exp2(SB *b, int W, const char *pre, const char *f) {
  static const double P[] = {0x1.41d32ep-13, 0x1.5f456ap-10, 0x1.3b2dbcp-7, 0x1.c6aed4p-5, 0x1.ebfbdap-3, 0x1.62e43p-1, 1.0};
  char *p0 = vk(W, P[0]);
  sb_printf(b, "  %%%sp0 = fadd <%d x float> %s, zeroinitializer\n", pre, W, p0);
  free(p0);
  for (int i = 1; i < 7; i++) {
    char o[24], pin[24];
    snprintf(o, sizeof o, "%%%sp%d", pre, i);
    snprintf(pin, sizeof pin, "%%%sp%d", pre, i - 1);
    vfma_k(b, W, o, pin, f, P[i]);
  }
}

static void emit_vexp2(SB *b, int W) {
  char *k129 = vk(W, 129.0), *km151 = vk(W, -151.0), *kr = vk(W, 0x1.8p23), *k127 = vki(W, 127), *k1 = vki(W, 1),
       *k23 = vki(W, 23), *kmin = vk(W, -125.0), *kmax = vk(W, 127.0);
  sb_printf(b, "define internal <%d x float> @tg_vexp2_%d(<%d x float> %%x) alwaysinline {\n", W, W, W);
  sb_printf(b, "  %%fn0 = fadd <%d x float> %%x, %s\n  %%fn = fsub <%d x float> %%fn0, %s\n", W, kr, W, kr);
  sb_printf(b, "  %%flo = fcmp oge <%d x float> %%fn, %s\n  %%fhi = fcmp ole <%d x float> %%fn, %s\n", W, kmin, W, kmax);
  sb_printf(b, "  %%fok = and <%d x i1> %%flo, %%fhi\n  %%fall = call i1 @llvm.vector.reduce.and.v%di1(<%d x i1> %%fok)\n", W, W, W);
  sb_puts(b, "  br i1 %fall, label %fast, label %slow\nfast:\n");
  sb_printf(b, "  %%ff = fsub <%d x float> %%x, %%fn\n", W);
  emit_poly_exp2(b, W, "f", "%ff");
  sb_printf(b, "  %%fti = bitcast <%d x float> %%fn0 to <%d x i32>\n  %%fe = shl <%d x i32> %%fti, %s\n", W, W, W, k23);
  sb_printf(b, "  %%fpi = bitcast <%d x float> %%fp6 to <%d x i32>\n  %%fri = add <%d x i32> %%fpi, %%fe\n", W, W, W);
  sb_printf(b, "  %%fr = bitcast <%d x i32> %%fri to <%d x float>\n  ret <%d x float> %%fr\nslow:\n", W, W, W);
  sb_printf(b, "  %%g = fcmp ogt <%d x float> %%x, %s\n  %%c0 = select <%d x i1> %%g, <%d x float> %s, <%d x float> %%x\n", W, k129,
            W, W, k129, W);
  sb_printf(b, "  %%l = fcmp olt <%d x float> %%c0, %s\n  %%c = select <%d x i1> %%l, <%d x float> %s, <%d x float> %%c0\n", W,
            km151, W, W, km151, W);
  sb_printf(b, "  %%n0 = fadd <%d x float> %%c, %s\n  %%n = fsub <%d x float> %%n0, %s\n  %%f = fsub <%d x float> %%c, %%n\n", W, kr,
            W, kr, W);
  emit_poly_exp2(b, W, "", "%f");
  sb_printf(b, "  %%ni = fptosi <%d x float> %%n to <%d x i32>\n  %%h = ashr <%d x i32> %%ni, %s\n", W, W, W, k1);
  sb_printf(b, "  %%h1 = add <%d x i32> %%h, %s\n  %%h2 = shl <%d x i32> %%h1, %s\n  %%s1 = bitcast <%d x i32> %%h2 to <%d x float>\n",
            W, k127, W, k23, W, W);
  sb_printf(b, "  %%d = sub <%d x i32> %%ni, %%h\n  %%d1 = add <%d x i32> %%d, %s\n  %%d2 = shl <%d x i32> %%d1, %s\n", W, W, k127, W,
            k23);
  sb_printf(b, "  %%s2 = bitcast <%d x i32> %%d2 to <%d x float>\n  %%r0 = fmul <%d x float> %%p6, %%s1\n  %%r = fmul <%d x float> %%r0, %%s2\n",
            W, W, W, W);
  sb_printf(b, "  %%nan = fcmp uno <%d x float> %%x, %%x\n  %%o = select <%d x i1> %%nan, <%d x float> %%x, <%d x float> %%r\n", W, W,
            W, W);
  sb_printf(b, "  ret <%d x float> %%o\n}\n", W);
  free(k129), free(km151), free(kr), free(k127), free(k1), free(k23), free(kmin), free(kmax);
}

static void emit_vlog2(SB *b, int W) {
  char *tiny = vk(W, 0x1p-126), *s23 = vk(W, 0x1p23), *k23 = vki(W, 23), *kff = vki(W, 0xff), *k127 = vki(W, 127),
       *km = vki(W, 0x7fffff), *kone = vki(W, 0x3f800000), *kbig = vki(W, 0x3fb504f3), *k800 = vki(W, 0x800000),
       *kz = vki(W, 0), *f1 = vk(W, 1.0), *fa = vk(W, 0x1.715476p+0), *fb = vk(W, 0x1.4ae0cp-26), *finf = vk(W, INFINITY),
       *fninf = vk(W, -INFINITY), *fnan = vk(W, NAN), *kw1 = vki(W, 1);
  sb_printf(b, "define internal <%d x float> @tg_vlog2_%d(<%d x float> %%x) alwaysinline {\n", W, W, W);
  sb_printf(b, "  %%sub = fcmp olt <%d x float> %%x, %s\n  %%xs0 = fmul <%d x float> %%x, %s\n", W, tiny, W, s23);
  sb_printf(b, "  %%xs = select <%d x i1> %%sub, <%d x float> %%xs0, <%d x float> %%x\n  %%i = bitcast <%d x float> %%xs to <%d x i32>\n", W,
            W, W, W, W);
  sb_printf(b, "  %%e0 = ashr <%d x i32> %%i, %s\n  %%e1 = and <%d x i32> %%e0, %s\n  %%e2 = sub <%d x i32> %%e1, %s\n", W, k23, W, kff, W, k127);
  sb_printf(b, "  %%sb = select <%d x i1> %%sub, <%d x i32> %s, <%d x i32> %s\n  %%e3 = sub <%d x i32> %%e2, %%sb\n", W, W, k23, W, kz, W);
  sb_printf(b, "  %%m0 = and <%d x i32> %%i, %s\n  %%m1 = or <%d x i32> %%m0, %s\n  %%big = icmp sgt <%d x i32> %%m1, %s\n", W, km, W,
            kone, W, kbig);
  sb_printf(b, "  %%bm = select <%d x i1> %%big, <%d x i32> %s, <%d x i32> %s\n  %%m2 = sub <%d x i32> %%m1, %%bm\n", W, W, k800, W, kz, W);
  sb_printf(b, "  %%bi = select <%d x i1> %%big, <%d x i32> %s, <%d x i32> %s\n  %%e = add <%d x i32> %%e3, %%bi\n", W, W, kw1, W, kz, W);
  sb_printf(b, "  %%mf = bitcast <%d x i32> %%m2 to <%d x float>\n  %%f = fsub <%d x float> %%mf, %s\n", W, W, W, f1);
  static const double Q[] = {-0x1.cb9ebap-4, 0x1.7985cep-3, -0x1.837912p-3, 0x1.a371f6p-3, -0x1.eb4548p-3,
                             0x1.277cf4p-2,  -0x1.715768p-2, 0x1.ec7096p-2, -0x1.715476p-1};
  char *q0 = vk(W, Q[0]);
  sb_printf(b, "  %%q0 = fadd <%d x float> %s, zeroinitializer\n", W, q0);
  free(q0);
  for (int i = 1; i < 9; i++) {
    char o[16], qin[16];
    snprintf(o, sizeof o, "%%q%d", i);
    snprintf(qin, sizeof qin, "%%q%d", i - 1);
    vfma_k(b, W, o, qin, "%f", Q[i]);
  }
  sb_printf(b, "  %%ff = fmul <%d x float> %%f, %%f\n  %%fb = fmul <%d x float> %%f, %s\n", W, W, fb);
  sb_printf(b, "  %%in = call <%d x float> @llvm.fma.v%df32(<%d x float> %%ff, <%d x float> %%q8, <%d x float> %%fb)\n", W, W, W, W, W);
  sb_printf(b, "  %%lg = call <%d x float> @llvm.fma.v%df32(<%d x float> %%f, <%d x float> %s, <%d x float> %%in)\n", W, W, W, W, fa, W);
  sb_printf(b, "  %%ef = sitofp <%d x i32> %%e to <%d x float>\n  %%r0 = fadd <%d x float> %%ef, %%lg\n", W, W, W);
  sb_printf(b, "  %%z = fcmp oeq <%d x float> %%x, zeroinitializer\n  %%r1 = select <%d x i1> %%z, <%d x float> %s, <%d x float> %%r0\n", W,
            W, W, fninf, W);
  sb_printf(b, "  %%pi = fcmp oeq <%d x float> %%x, %s\n  %%r2 = select <%d x i1> %%pi, <%d x float> %%x, <%d x float> %%r1\n", W, finf,
            W, W, W);
  sb_printf(b, "  %%ng = fcmp olt <%d x float> %%x, zeroinitializer\n  %%un = fcmp uno <%d x float> %%x, %%x\n", W, W);
  sb_printf(b, "  %%bad = or <%d x i1> %%ng, %%un\n  %%o = select <%d x i1> %%bad, <%d x float> %s, <%d x float> %%r2\n", W, W, W, fnan, W);
  sb_printf(b, "  ret <%d x float> %%o\n}\n", W);
  free(tiny), free(s23), free(k23), free(kff), free(k127), free(km), free(kone), free(kbig), free(k800), free(kz), free(f1),
      free(fa), free(fb), free(finf), free(fninf), free(fnan), free(kw1);
}

/* "<W x double> <c, ...>" */
static char *vkd(int W, double v) {
  char one[48];
  flit(v, true, one);
  SB s;
  sb_init(&s);
  sb_puts(&s, "<");
  for (int l = 0; l < W; l++) sb_printf(&s, "%sdouble %s", l ? ", " : "", one);
  sb_puts(&s, ">");
  return sb_take(&s);
}
static char *vkl(int W, long long v) {
  SB s;
  sb_init(&s);
  sb_puts(&s, "<");
  for (int l = 0; l < W; l++) sb_printf(&s, "%si64 %lld", l ? ", " : "", v);
  sb_puts(&s, ">");
  return sb_take(&s);
}

/* out = fma(x, y, c) on <W x double>; c a constant (kc) or a value (vc) */
static void vdfma(SB *b, int W, const char *out, const char *x, const char *y, const char *z) {
  sb_printf(b, "  %s = call <%d x double> @llvm.fma.v%df64(<%d x double> %s, <%d x double> %s, <%d x double> %s)\n", out, W, W, W, x,
            W, y, W, z);
}

/* vector sin as the C prelude's PRELUDE_V_SIN: in double, k = round(x 2/pi), r = x - k pi/2 in two
 * parts, sin or cos polynomial by the quadrant; a vector with a lane past 2^13 (or inf, NaN) takes
 * libm's sinf lane by lane */
static void emit_vsin(SB *b, int W) {
  char *kf = vk(W, 8192.0), *kfn = vk(W, -8192.0), *k2pi = vkd(W, 0x1.45f306dc9c883p-1), *kr = vkd(W, 0x1.8p52),
       *khi = vkd(W, -0x1.921fb54442d18p+0), *klo = vkd(W, -0x1.1a62633145c07p-54), *kone = vkd(W, 1.0), *l1 = vkl(W, 1),
       *l2 = vkl(W, 2), *l62 = vkl(W, 62), *lz = vkl(W, 0);
  static const double S[] = {-0x1.5555555555555p-3, 0x1.1111111111111p-7, -0x1.a01a01a01a01ap-13, 0x1.71de3a556c734p-19};
  static const double C[] = {-0.5, 0x1.5555555555555p-5, -0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-16, -0x1.27e4fb7789f5cp-22};
  sb_printf(b, "define internal <%d x float> @tg_vsin_%d(<%d x float> %%x) alwaysinline {\nentry:\n", W, W, W);
  sb_printf(b, "  %%f1 = fcmp ogt <%d x float> %%x, %s\n  %%f2 = fcmp olt <%d x float> %%x, %s\n  %%f3 = fcmp uno <%d x float> %%x, %%x\n", W,
            kf, W, kfn, W);
  sb_printf(b, "  %%f12 = or <%d x i1> %%f1, %%f2\n  %%far = or <%d x i1> %%f12, %%f3\n", W, W);
  sb_printf(b, "  %%any = call i1 @llvm.vector.reduce.or.v%di1(<%d x i1> %%far)\n  br i1 %%any, label %%slow, label %%fast\nslow:\n", W, W);
  char prev[32] = "poison";
  for (int l = 0; l < W; l++) {
    sb_printf(b, "  %%se%d = extractelement <%d x float> %%x, i64 %d\n  %%ss%d = call float @llvm.sin.f32(float %%se%d)\n", l, W, l, l, l);
    sb_printf(b, "  %%sv%d = insertelement <%d x float> %s, float %%ss%d, i64 %d\n", l, W, prev, l, l);
    snprintf(prev, sizeof prev, "%%sv%d", l);
  }
  sb_printf(b, "  ret <%d x float> %s\nfast:\n", W, prev);
  sb_printf(b, "  %%d = fpext <%d x float> %%x to <%d x double>\n", W, W);
  vdfma(b, W, "%k0", "%d", k2pi, kr);
  sb_printf(b, "  %%k = fsub <%d x double> %%k0, %s\n", W, kr);
  vdfma(b, W, "%r0", "%k", khi, "%d");
  vdfma(b, W, "%r", "%k", klo, "%r0");
  sb_printf(b, "  %%z = fmul <%d x double> %%r, %%r\n", W);
  /* S: s = r + r z (S0 + z (S1 + z (S2 + z S3))) */
  char *s3 = vkd(W, S[3]), *s2 = vkd(W, S[2]), *s1 = vkd(W, S[1]), *s0 = vkd(W, S[0]);
  vdfma(b, W, "%sp2", "%z", s3, s2);
  vdfma(b, W, "%sp1", "%z", "%sp2", s1);
  vdfma(b, W, "%sp0", "%z", "%sp1", s0);
  sb_printf(b, "  %%rz = fmul <%d x double> %%r, %%z\n", W);
  vdfma(b, W, "%s", "%rz", "%sp0", "%r");
  char *c4 = vkd(W, C[4]), *c3 = vkd(W, C[3]), *c2 = vkd(W, C[2]), *c1 = vkd(W, C[1]), *c0 = vkd(W, C[0]);
  vdfma(b, W, "%cp3", "%z", c4, c3);
  vdfma(b, W, "%cp2", "%z", "%cp3", c2);
  vdfma(b, W, "%cp1", "%z", "%cp2", c1);
  vdfma(b, W, "%cp0", "%z", "%cp1", c0);
  vdfma(b, W, "%c", "%z", "%cp0", kone);
  sb_printf(b, "  %%q = fptosi <%d x double> %%k to <%d x i64>\n  %%qo = and <%d x i64> %%q, %s\n  %%odd = icmp ne <%d x i64> %%qo, %s\n", W, W,
            W, l1, W, lz);
  sb_printf(b, "  %%v = select <%d x i1> %%odd, <%d x double> %%c, <%d x double> %%s\n  %%vi = bitcast <%d x double> %%v to <%d x i64>\n", W,
            W, W, W, W);
  sb_printf(b, "  %%q2 = and <%d x i64> %%q, %s\n  %%sg = shl <%d x i64> %%q2, %s\n  %%vx = xor <%d x i64> %%vi, %%sg\n", W, l2, W, l62, W);
  sb_printf(b, "  %%vd = bitcast <%d x i64> %%vx to <%d x double>\n  %%o = fptrunc <%d x double> %%vd to <%d x float>\n", W, W, W, W);
  sb_printf(b, "  ret <%d x float> %%o\n}\n", W);
  free(kf), free(kfn), free(k2pi), free(kr), free(khi), free(klo), free(kone), free(l1), free(l2), free(l62), free(lz);
  free(s3), free(s2), free(s1), free(s0), free(c4), free(c3), free(c2), free(c1), free(c0);
}

static bool needs_var(UOp *u) {
  return u->op != OP_CONST && u->op != OP_RANGE && u->op != OP_DEFINE_GLOBAL && u->op != OP_NOOP && u->op != OP_DEFINE_VAR;
}

static void topo(LR *r, UOp *u) {
  if (!u || pm_has(&r->seen, (uint64_t)(uintptr_t)u)) return;
  pm_put(&r->seen, (uint64_t)(uintptr_t)u, (void *)1);
  for (uint32_t i = 0; i < u->nsrc; i++) topo(r, u->src[i]);
  pv_push(&r->order, u);
}

/* The W gathers of a W x W tile (gather_block) as W row loads and log2(W) rounds of two-input
 * shuffles, as the C renderer writes them */
static void emit_gather_block(LR *r, UOp **blk, UOp *root, int64_t off0) {
  int W = r->vw, lo[16], hi[16];
  char t[16][32];
  const UOp *g = blk[0];
  for (int l = 0; l < W; l++) {
    char ix[32], a[32];
    fresh(r, ix);
    sb_printf(r->b, "  %s = add i64 %s, %lld\n", ix, nm(r, root), (long long)(off0 + l * g->iarg[0]));
    gep(r, TG_FLOAT32, nm(r, g->src[0]), ix, a);
    fresh(r, t[l]);
    sb_printf(r->b, "  %s = load <%d x float>, ptr %s, align 4\n", t[l], W, a);
  }
  for (int h = W / 2; h >= 1; h /= 2) {
    gather_block_masks(W, h, lo, hi);
    for (int i = 0; i < W; i++) {
      if (i & h) continue;
      char n[2][32];
      for (int x = 0; x < 2; x++) {
        fresh(r, n[x]);
        sb_printf(r->b, "  %s = shufflevector <%d x float> %s, <%d x float> %s, <%d x i32> <", n[x], W, t[i], W, t[i + h], W);
        for (int l = 0; l < W; l++) sb_printf(r->b, "%si32 %d", l ? ", " : "", x ? hi[l] : lo[l]);
        sb_puts(r->b, ">\n");
      }
      strcpy(t[i], n[0]), strcpy(t[i + h], n[1]);
    }
  }
  for (int j = 0; j < W; j++) setname(r, blk[j], t[j]);
}

static void emit_level(LR *r, int level, bool post_phase) {
  for (size_t i = 0; i < r->order.n; i++) {
    UOp *u = r->order.p[i];
    if (!needs_var(u) || nm(r, u)) continue;
    intptr_t lv = (intptr_t)pm_get(&r->level, (uint64_t)(uintptr_t)u) - 1;
    bool is_post = pm_has(&r->post, (uint64_t)(uintptr_t)u);
    if (lv != level || is_post != post_phase) continue;
    UOp *blk[16], *root;
    int64_t off0;
    if (u->op == OP_LOAD && gather_block(&r->order, &r->vec, &r->level, &r->post, u, r->vw, blk, &root, &off0)) {
      emit_gather_block(r, blk, root, off0);
      continue;
    }
    char out[48];
    emit_node(r, u, out);
    setname(r, u, out);
  }
}

/* accumulator c's type */
static void acc_ty(LR *r, int c, char *out) {
  const LKernel *k = r->k;
  if (isvec(r, k->rbodies[c])) snprintf(out, 48, "<%d x %s>", r->vw, lty(k->racc));
  else snprintf(out, 48, "%s", lty(k->racc));
}

static void acc_init_text(LR *r, int c, char *out, size_t cap) {
  const LKernel *k = r->k;
  tg_dtype at = k->racc;
  char s[64];
  if (k->rop == OP_ADD) snprintf(s, sizeof s, "%s", zero_of(at));
  else if (k->rop == OP_MUL) {
    if (is_fl(at)) snprintf(s, sizeof s, "1.0");
    else snprintf(s, sizeof s, "%s", at == TG_BOOL ? "true" : "1");
  } else if (is_fl(at)) {
    flit(-INFINITY, at == TG_FLOAT64, s);
  } else if (at == TG_BOOL || tg_dtype_is_unsigned(at)) {
    snprintf(s, sizeof s, "%s", zero_of(at));
  } else {
    int n = bits(at);
    snprintf(s, sizeof s, "%lld", n >= 64 ? (long long)INT64_MIN : -(1LL << (n - 1)));
  }
  if (!isvec(r, k->rbodies[c])) {
    snprintf(out, cap, "%s", s);
    return;
  }
  SB v;
  sb_init(&v);
  sb_puts(&v, "<");
  for (int l = 0; l < r->vw; l++) sb_printf(&v, "%s%s %s", l ? ", " : "", lty(at), s);
  sb_puts(&v, ">");
  snprintf(out, cap, "%s", v.s);
  sb_free(&v);
}

/* acc = acc (op) x, the C renderer's update; returns the new value's name */
static void combine(LR *r, int c, const char *accv, const char *x, bool vec, char *out) {
  const LKernel *k = r->k;
  char ty[48];
  acc_ty(r, c, ty);
  tg_dtype at = k->racc;
  if (k->rop == OP_ADD || k->rop == OP_MUL) {
    fresh(r, out);
    if (at == TG_BOOL) sb_printf(r->b, "  %s = %s %s %s, %s\n", out, k->rop == OP_ADD ? "or" : "and", ty, accv, x);
    else if (is_fl(at)) sb_printf(r->b, "  %s = %s %s %s, %s\n", out, k->rop == OP_ADD ? "fadd contract" : "fmul contract", ty, accv, x);
    else sb_printf(r->b, "  %s = %s %s %s, %s\n", out, k->rop == OP_ADD ? "add" : "mul", ty, accv, x);
    if (!vec) call_round(r, at, out);
    return;
  }
  char ct[48];
  cmp_ty(r, vec, ct);
  if (is_fl(at)) {
    fmax_emit(r, ty, ct, x, accv, out);
  } else {
    char cc[32];
    fresh(r, cc), fresh(r, out);
    sb_printf(r->b, "  %s = icmp %s %s %s, %s\n", cc, is_uns(at) ? "ugt" : "sgt", ty, x, accv);
    sb_printf(r->b, "  %s = select %s %s, %s %s, %s %s\n", out, ct, cc, ty, x, ty, accv);
  }
}

static void emit_store(LR *r, int c) {
  const LKernel *k = r->k;
  tg_dtype odt = k->pdt[0];
  UOp *v = k->values[c];
  const char *at = nm(r, k->sidxs[c]);
  char addr[32];
  gep(r, odt, "%data0", at, addr);
  if (k->vw) {
    char x[48], vt[48];
    vopnd(r, v, x);
    snprintf(vt, sizeof vt, "<%d x float>", r->vw);
    if (is_vhalf(odt)) {
      /* the result of arithmetic (never a signalling NaN) may take the hardware's conversion */
      bool rounded = isvec(r, v) && op_is_alu(v->op) && vhalf_round(v) == VH_ARITH;
      char hb[32];
      vhalf_to_bits(r, odt, x, rounded, hb);
      sb_printf(r->b, "  store <%d x i16> %s, ptr %s, align 2\n", r->vw, hb, addr);
      return;
    }
    if (k->sop) {
      char old[32], mx[48], sel[32], ct[48];
      fresh(r, old);
      sb_printf(r->b, "  %s = load %s, ptr %s, align 4\n", old, vt, addr);
      cmp_ty(r, true, ct);
      fmax_emit(r, vt, ct, x, old, mx);
      fresh(r, sel);
      sb_printf(r->b, "  %s = select i1 %s, %s %s, %s %s\n", sel, nm(r, k->sfirsts[c]), vt, x, vt, mx);
      strcpy(x, sel);
    }
    sb_printf(r->b, "  store %s %s, ptr %s, align 4\n", vt, x, addr);
    return;
  }
  char x[48];
  snprintf(x, sizeof x, "%s", nm(r, v));
  if (k->sop) {
    char old[32], c1[32], c2[32], c3[32], c4[32], sel[32];
    fresh(r, old), fresh(r, c1), fresh(r, c2), fresh(r, c3), fresh(r, c4), fresh(r, sel);
    sb_printf(r->b, "  %s = load float, ptr %s, align 4\n", old, addr);
    sb_printf(r->b, "  %s = fcmp ogt float %s, %s\n  %s = fcmp uno float %s, %s\n", c1, x, old, c2, x, x);
    sb_printf(r->b, "  %s = or i1 %s, %s\n  %s = or i1 %s, %s\n", c3, c1, c2, c4, c3, nm(r, k->sfirsts[c]));
    sb_printf(r->b, "  %s = select i1 %s, float %s, float %s\n", sel, c4, x, old);
    strcpy(x, sel);
  }
  char sv[48];
  if (odt == TG_BOOL) {
    fresh(r, sv);
    sb_printf(r->b, "  %s = zext i1 %s to i8\n", sv, x);
  } else if (is_narrow(odt)) {
    fresh(r, sv);
    if (dtype_is_fp8(odt)) {
      char d[32];
      fresh(r, d);
      sb_printf(r->b, "  %s = fpext float %s to double\n", d, x);
      sb_printf(r->b, "  %s = call i8 @%s(double %s)\n", sv, fromf_fn(odt), d);
    } else {
      sb_printf(r->b, "  %s = call i16 @%s(float %s)\n", sv, fromf_fn(odt), x);
    }
  } else {
    strcpy(sv, x);
  }
  sb_printf(r->b, "  store %s %s, ptr %s, align %d\n", sty(odt), sv, addr, (int)tg_dtype_itemsize(odt));
}

static void emit_post_and_store(LR *r) {
  const LKernel *k = r->k;
  for (int c = 0; c < k->ncopy; c++) {
    if (!k->rplaces[c]) continue;
    char ty[48], val[48];
    acc_ty(r, c, ty);
    fresh(r, val);
    sb_printf(r->b, "  %s = load %s, ptr %%acc%d, align 64\n", val, ty, c);
    if (k->rvw && isvec(r, k->rbodies[c])) {
      /* across the lanes, in lane order as the C renderer does */
      char s[48];
      const char *et = lty(k->racc);
      if (k->rop == OP_MAX) {
        fresh(r, s);
        sb_printf(r->b, "  %s = extractelement %s %s, i64 0\n", s, ty, val);
      } else {
        snprintf(s, sizeof s, "%s", zero_of(k->racc));
      }
      for (int l = k->rop == OP_MAX ? 1 : 0; l < r->vw; l++) {
        char e[32], n2[48];
        fresh(r, e);
        sb_printf(r->b, "  %s = extractelement %s %s, i64 %d\n", e, ty, val, l);
        if (k->rop == OP_MAX) {
          fmax_emit(r, et, "i1", e, s, n2);
        } else {
          fresh(r, n2);
          sb_printf(r->b, "  %s = fadd %s %s, %s\n", n2, et, s, e);
        }
        strcpy(s, n2);
      }
      strcpy(val, s);
    }
    setname(r, k->rplaces[c], val);
  }
  emit_level(r, k->ng, true);
  for (int c = 0; c < k->ncopy; c++) emit_store(r, c);
}

/* Is reduce loop i of a vector kernel short enough to unroll whole (at most 4 steps: a 2x2 pooling
 * window)? */
static bool short_loop(const LKernel *k, int i) {
  return (k->vw || k->rvw) && !k->sym && k->rranges[i]->nsrc == 0 && k->rranges[i]->iarg[0] <= 4;
}

char *render_llvm(const LKernel *k, const char *name, const DeviceCaps *caps) {
  LR r;
  memset(&r, 0, sizeof r);
  SB body;
  sb_init(&body);
  sb_init(&r.intr);
  r.b = &body;
  r.k = k;
  r.vw = k->vw ? k->vw : k->rvw;
  pm_init(&r.names), pm_init(&r.vec), pm_init(&r.level), pm_init(&r.post), pm_init(&r.seen);
  int nloops = k->ng + k->nr;
  for (int i = 0; i < nloops; i++) {
    UOp *rg = i < k->ng ? k->granges[i] : k->rranges[i - k->ng];
    char buf[32];
    snprintf(buf, sizeof buf, "%%ridx%d", i);
    setname(&r, rg, buf);
    pm_put(&r.level, (uint64_t)(uintptr_t)rg, (void *)(intptr_t)(i + 2));
  }
  for (int c = 0; c < k->ncopy; c++) topo(&r, k->rbodies[c]);
  for (int c = 0; c < k->ncopy; c++) topo(&r, k->values[c]);
  for (int c = 0; c < k->ncopy; c++) topo(&r, k->sidxs[c]);
  for (int c = 0; k->sop && c < k->ncopy; c++) topo(&r, k->sfirsts[c]);
  for (int i = 0; k->rlo && i < k->nr; i++) topo(&r, k->rlo[i]), topo(&r, k->rhi[i]);
  /* a loop of variable length ends at an expression of the kernel's variables (computed on entry) */
  for (int i = 0; i < nloops; i++) {
    UOp *rg = i < k->ng ? k->granges[i] : k->rranges[i - k->ng];
    if (rg->nsrc) topo(&r, rg->src[0]);
  }
  for (int i = 0; i < k->nvars; i++) {
    char buf[32];
    snprintf(buf, sizeof buf, "%%var%d", i);
    setname(&r, k->vars[i], buf);
  }
  /* vector-ness, as the C renderer decides it */
  kernel_vec_levels(k, r.vw, &r.order, &r.vec, &r.level, &r.post);
  /* float16/bfloat16 lanes: which bits are kept, as the C renderer decides it */
  r.f16c = caps && caps->f16c;
  {
    PtrMap nuse;
    pm_init(&nuse);
    kernel_use_counts(&r.order, &nuse);
    kernel_half_bits(k, &r.order, &nuse, &r.bits, &r.storeonly);
    pm_free(&nuse);
  }
  for (size_t i = 0; i < r.order.n; i++) {
    UOp *u = r.order.p[i];
    if (u->op == OP_RANGE) continue;
    if (u->op == OP_CONST) pm_put(&r.names, (uint64_t)(uintptr_t)u, const_text((tg_dtype)u->dtype, u));
    if (u->op == OP_DEFINE_GLOBAL) {
      char buf[32];
      snprintf(buf, sizeof buf, "%%data%lld", (long long)u->arg.i);
      setname(&r, u, buf);
    }
  }
  int64_t biters = 0;
  int blevel = kernel_block_level(k, &biters);
  int nunroll = 0; /* loops marked for unrolling whole (llvm.loop metadata !0 ... !nunroll-1) */

  /* entry: accumulators and loop counters as allocas (mem2reg makes them registers) */
  sb_puts(&body, "entry:\n");
  for (int c = 0; k->rbody && c < k->ncopy; c++) {
    char ty[48];
    acc_ty(&r, c, ty);
    sb_printf(&body, "  %%acc%d = alloca %s, align 64\n", c, ty);
    if (blevel) sb_printf(&body, "  %%part%d = alloca %s, align 64\n", c, ty);
  }
  for (int i = 0; i < nloops; i++) {
    sb_printf(&body, "  %%ridx%d.p = alloca i64, align 8\n", i);
    if (i + 1 == blevel) sb_printf(&body, "  %%ridx%db.p = alloca i64, align 8\n", i);
  }
  if (k->ng == 0) sb_puts(&body, "  %g.p = alloca i64, align 8\n");
  emit_level(&r, 0, false);
  if (k->ng == 0) {
    /* no global loop: the one output is computed once per index of [gstart, gend) */
    sb_puts(&body, "  store i64 %gstart, ptr %g.p, align 8\n  br label %G.head\nG.head:\n  %g = load i64, ptr %g.p, align 8\n"
                   "  %g.c = icmp slt i64 %g, %gend\n  br i1 %g.c, label %G.body, label %G.exit\nG.body:\n");
  }
  for (int lv = 1; lv <= nloops; lv++) {
    int i = lv - 1;
    if (lv == k->ng + 1) {
      for (int c = 0; c < k->ncopy; c++) {
        char ty[48], init[2048];
        acc_ty(&r, c, ty);
        acc_init_text(&r, c, init, sizeof init);
        sb_printf(&body, "  store %s %s, ptr %%acc%d, align 64\n", ty, init, c);
      }
    }
    UOp *rg = lv <= k->ng ? k->granges[i] : k->rranges[i - k->ng];
    char lo[64] = "0", hi[64];
    if (rg->nsrc) snprintf(hi, sizeof hi, "%s", nm(&r, rg->src[0]));
    else snprintf(hi, sizeof hi, "%lld", (long long)rg->iarg[0]);
    bool bounded = lv > k->ng && k->rlo && k->rlo[i - k->ng];
    if (bounded) {
      snprintf(lo, sizeof lo, "%s", nm(&r, k->rlo[i - k->ng]));
      snprintf(hi, sizeof hi, "%s", nm(&r, k->rhi[i - k->ng]));
    }
    if (lv == 1 && k->ng > 0 && rg->nsrc) {
      /* the threads split the loop's largest extent; those past the variable's end do nothing */
      sb_printf(&body, "  %%ghi.c = icmp slt i64 %%gend, %s\n  %%ghi = select i1 %%ghi.c, i64 %%gend, i64 %s\n", hi, hi);
      snprintf(lo, sizeof lo, "%%gstart"), snprintf(hi, sizeof hi, "%%ghi");
    } else if (lv == 1 && k->ng > 0) snprintf(lo, sizeof lo, "%%gstart"), snprintf(hi, sizeof hi, "%%gend");
    if (lv == blevel) {
      /* blocked accumulation: ridx<i>b steps by biters; each block sums into part<c> */
      sb_printf(&body, "  store i64 %s, ptr %%ridx%db.p, align 8\n  br label %%L%db.head\nL%db.head:\n", lo, i, i, i);
      sb_printf(&body, "  %%ridx%db = load i64, ptr %%ridx%db.p, align 8\n  %%ridx%db.c = icmp slt i64 %%ridx%db, %s\n", i, i, i, i, hi);
      sb_printf(&body, "  br i1 %%ridx%db.c, label %%L%db.body, label %%L%db.exit\nL%db.body:\n", i, i, i, i);
      for (int c = 0; c < k->ncopy; c++) {
        char ty[48], init[2048];
        acc_ty(&r, c, ty);
        bool vv = isvec(&r, k->rbodies[c]);
        if (vv) snprintf(init, sizeof init, "zeroinitializer");
        else snprintf(init, sizeof init, "%s", zero_of(k->racc));
        sb_printf(&body, "  store %s %s, ptr %%part%d, align 64\n", ty, init, c);
      }
      sb_printf(&body, "  %%ridx%d.end0 = add i64 %%ridx%db, %lld\n", i, i, (long long)biters);
      if (bounded || rg->iarg[0] % biters) {
        sb_printf(&body, "  %%ridx%d.lt = icmp slt i64 %%ridx%d.end0, %s\n", i, i, hi);
        sb_printf(&body, "  %%ridx%d.end = select i1 %%ridx%d.lt, i64 %%ridx%d.end0, i64 %s\n", i, i, i, hi);
      } else {
        sb_printf(&body, "  %%ridx%d.end = add i64 %%ridx%d.end0, 0\n", i, i);
      }
      snprintf(lo, sizeof lo, "%%ridx%db", i);
      snprintf(hi, sizeof hi, "%%ridx%d.end", i);
    }
    sb_printf(&body, "  store i64 %s, ptr %%ridx%d.p, align 8\n  br label %%L%d.head\nL%d.head:\n", lo, i, i, i);
    sb_printf(&body, "  %%ridx%d = load i64, ptr %%ridx%d.p, align 8\n  %%ridx%d.c = icmp slt i64 %%ridx%d, %s\n", i, i, i, i, hi);
    sb_printf(&body, "  br i1 %%ridx%d.c, label %%L%d.body, label %%L%d.exit\nL%d.body:\n", i, i, i, i);
    emit_level(&r, lv, false);
    if (lv == nloops && k->rbody) {
      for (int c = 0; c < k->ncopy; c++) {
        const char *an = blevel ? "part" : "acc";
        char ty[48], cur[32], nv[48], x[48];
        acc_ty(&r, c, ty);
        bool vv = isvec(&r, k->rbodies[c]);
        fresh(&r, cur);
        sb_printf(&body, "  %s = load %s, ptr %%%s%d, align 64\n", cur, ty, k->rop == OP_ADD ? an : "acc", c);
        opnd(&r, k->rbodies[c], vv, x);
        combine(&r, c, cur, x, vv, nv);
        sb_printf(&body, "  store %s %s, ptr %%%s%d, align 64\n", ty, nv, k->rop == OP_ADD ? an : "acc", c);
      }
    }
    if (lv == nloops) {
      for (int cl = nloops; cl >= 1; cl--) {
        int ci = cl - 1;
        if (cl == k->ng) emit_post_and_store(&r);
        /* latch; a short reduce loop of a vector kernel asks to be unrolled whole (see the mark below):
         * the metadata lifts loop-unroll-full's size limit, which a 16-lane window gather exceeds */
        sb_printf(&body, "  %%ridx%d.n = add i64 %%ridx%d, 1\n  store i64 %%ridx%d.n, ptr %%ridx%d.p, align 8\n", ci, ci, ci, ci);
        if (ci >= k->ng && short_loop(k, ci - k->ng))
          sb_printf(&body, "  br label %%L%d.head, !llvm.loop !%d\nL%d.exit:\n", ci, nunroll++, ci);
        else
          sb_printf(&body, "  br label %%L%d.head\nL%d.exit:\n", ci, ci);
        if (cl == blevel) {
          for (int c = 0; c < k->ncopy; c++) {
            char ty[48], a[32], p[32], s[48];
            acc_ty(&r, c, ty);
            bool vv = isvec(&r, k->rbodies[c]);
            fresh(&r, a), fresh(&r, p);
            sb_printf(&body, "  %s = load %s, ptr %%acc%d, align 64\n  %s = load %s, ptr %%part%d, align 64\n", a, ty, c, p, ty, c);
            combine(&r, c, a, p, vv, s);
            sb_printf(&body, "  store %s %s, ptr %%acc%d, align 64\n", ty, s, c);
          }
          sb_printf(&body, "  %%ridx%db.n = add i64 %%ridx%db, %lld\n  store i64 %%ridx%db.n, ptr %%ridx%db.p, align 8\n", ci, ci,
                    (long long)biters, ci, ci);
          sb_printf(&body, "  br label %%L%db.head\nL%db.exit:\n", ci, ci);
        }
      }
    }
  }
  if (nloops == 0 || k->ng == 0) emit_post_and_store(&r);
  if (k->ng == 0) {
    sb_puts(&body, "  %g.n = add i64 %g, 1\n  store i64 %g.n, ptr %g.p, align 8\n  br label %G.head\nG.exit:\n");
  }
  sb_puts(&body, "  ret void\n");

  SB out;
  sb_init(&out);
  sb_printf(&out, "; kernel %s\n", name);
  /* A kernel the heuristics left scalar (no vector axis, along the output or the reduce axis: an
   * integer max-index reduction, or a gather such as a bilinear interpolation's) asks the compiler for
   * LLVM's loop vectorizer (LLVM_LOOP_VECTORIZE in ops_llvm.c): gcc's SLP vectorizer packs such a tile
   * for the C renderer, and LLVM's lean pipeline does not. Vector kernels are left as rendered.
   * Marking the scalar elementwise kernels too (not only reductions) took interpolate's gather kernel
   * from 4.5 to 3.2 ms and 2.3 to 2.0 ms in two alternating runs on a Zen 5, for about 6% more
   * compile time in beautiful_mnist's first step (379 against 357 ms, medians of 4). A kernel of
   * fewer than LV_MIN_WORK loop steps in all is not marked: it runs in microseconds either way, and
   * the vectorizer costs 5-20 ms of compiling it (beautiful_mnist's threefry of 512 batch indices:
   * 23 ms). Its train and evaluation kernels compiled in 672-729 ms before, 636-663 after, their
   * run time unchanged (the smallest kernel still marked, 92 k steps, is 25% faster vectorized). */
  enum { LV_MIN_WORK = 16384 };
  int64_t work = 1;
  for (int i = 0; i < k->ng; i++) work *= k->granges[i]->iarg[0];
  for (int i = 0; i < k->nr; i++) work *= k->rranges[i]->iarg[0];
  if (!k->vw && !k->rvw && !k->sym && work >= LV_MIN_WORK) sb_puts(&out, LLVM_LOOP_VECTORIZE_MARK "\n");
  else if (nunroll) sb_puts(&out, LLVM_SHORT_LOOPS_MARK "\n");
  sb_printf(&out, "%s%s", DECLS, r.intr.s ? r.intr.s : "");
  if (r.uses_vexp2) emit_vexp2(&out, r.vw);
  if (r.uses_vlog2) emit_vlog2(&out, r.vw);
  if (r.uses_vsin) emit_vsin(&out, r.vw);
  if (r.uses_vh || r.uses_vb) emit_vhalf(&out, r.vw, r.uses_vh, r.uses_vb);
  sb_printf(&out, "define internal void @%s.body(", name);
  for (int i = 0; i < k->np; i++) sb_printf(&out, "ptr noalias %%data%d, ", i);
  for (int i = 0; i < k->nvars; i++) sb_printf(&out, "i64 %%var%d, ", i);
  sb_puts(&out, "i64 %gstart, i64 %gend) #0 {\n");
  sb_puts(&out, body.s);
  sb_puts(&out, "}\n");
  sb_printf(&out, "define void @%s(ptr noalias %%bufs, i64 %%gstart, i64 %%gend) #1 {\n", name);
  for (int i = 0; i < k->np; i++)
    sb_printf(&out, "  %%b%d = getelementptr inbounds ptr, ptr %%bufs, i64 %d\n  %%p%d = load ptr, ptr %%b%d, align 8\n", i, i, i, i);
  /* the variables' values follow the buffers, as integers in pointer slots */
  for (int i = 0; i < k->nvars; i++)
    sb_printf(&out, "  %%vb%d = getelementptr inbounds ptr, ptr %%bufs, i64 %d\n  %%vp%d = load ptr, ptr %%vb%d, align 8\n"
                    "  %%vv%d = ptrtoint ptr %%vp%d to i64\n", i, k->np + i, i, i, i, i);
  sb_printf(&out, "  call void @%s.body(", name);
  for (int i = 0; i < k->np; i++) sb_printf(&out, "ptr %%p%d, ", i);
  for (int i = 0; i < k->nvars; i++) sb_printf(&out, "i64 %%vv%d, ", i);
  sb_puts(&out, "i64 %gstart, i64 %gend)\n  ret void\n}\n");
  /* "min-legal-vector-width": the kernel's vector types are meant as written. Without it a target
   * whose tuning prefers 256-bit vectors (LLVM 15's "generic" CPU, which is what it names a CPU newer
   * than it knows, such as a Zen 5; skylake-avx512) splits every 16-lane operation into two ymm ones:
   * matmul_1024 took 10.1 ms against the C kernel's 5.3 on a Zen 5. A target without AVX-512 is not
   * affected (512-bit types are not legal there anyway). */
  for (int i = 0; i < nunroll; i++) sb_printf(&out, "!%d = distinct !{!%d, !%d}\n", i, i, nunroll);
  if (nunroll) sb_printf(&out, "!%d = !{!\"llvm.loop.unroll.full\"}\n", nunroll);
  sb_puts(&out, "attributes #0 = { alwaysinline nounwind \"no-trapping-math\"=\"true\" \"min-legal-vector-width\"=\"512\" }\n");
  sb_puts(&out, "attributes #1 = { nounwind \"no-trapping-math\"=\"true\" \"min-legal-vector-width\"=\"512\" }\n");
  sb_free(&body);
  sb_free(&r.intr);
  for (size_t i = 0; i < r.names.cap; i++)
    if (r.names.keys[i]) free(r.names.vals[i]);
  pm_free(&r.names), pm_free(&r.vec), pm_free(&r.level), pm_free(&r.post), pm_free(&r.seen);
  pm_free(&r.bits), pm_free(&r.storeonly);
  pv_free(&r.order);
  return sb_take(&out);
}
