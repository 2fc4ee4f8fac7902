/*
 * cstyle.c -- the C-style renderer: LKernel -> C source for the CPU device, or OpenCL C for GPU-like
 * devices. The languages differ only in the spellings of one table row (Lang: type names, literal
 * suffixes, math builtins, bit casts, the kernel's signature and how a global loop becomes a
 * work-item id). Vector code is GCC vector types in C and clang's OpenCL vector types
 * (ext_vector_type, the type of float16 and friends) in OpenCL C: the same expressions, with a zero
 * vector, the address space of a vector pointer and the transcendental functions spelled per
 * language (OpenCL C takes its own exp2/log2/sin/sqrt/trunc, which work on vectors).
 *
 * Every value node becomes one local variable, declared at the outermost loop level where all its
 * inputs are available (loop-invariant code is hoisted by construction). float16, bfloat16 and the
 * fp8 types are stored as their bits and computed in float, rounded after every operation so results
 * match a true narrow-precision computation. Integer division and modulo by zero give 0 instead of
 * trapping; signed overflow wraps (kernels are compiled with -fwrapv).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../codegen/codegen.h"
#include "../uop/ptrmap.h"

typedef struct Lang {
  const char *types[TG_DTYPE_COUNT]; /* computation types (16-bit floats compute in float) */
  const char *bool_store;            /* how bools are stored */
  const char *half_store;            /* how float16 is stored (bfloat16 is always 16 raw bits) */
  const char *u16, *u32;             /* raw 16/32-bit words */
  const char *i64;                   /* loop counters */
  const char *ll, *ull;              /* 64-bit literal suffixes */
  const char *inf, *inff, *nan, *nanf;
  const char *math;                  /* prefix of exp2/log2/sin/sqrt/trunc/fmod/pow */
  bool math_fsuf;                    /* float versions end in f (C) or are overloads (OpenCL C) */
  bool as_type;                      /* bit casts are as_<type>() (OpenCL C) or memcpy (C) */
  const char *gptr;                  /* address space of a pointer to data: "" or "__global " */
  bool ext_vec;                      /* vectors are ext_vector_type(W) (OpenCL C), not vector_size */
  const char *memcpy;                /* the bit-copy builtin of a memcpy bit cast */
  const char *ninf, *ninff;          /* -inf (double, float): the initial value of a max reduction */
  const char *fn;                    /* qualifiers of a helper function */
  /* GPU dialects only: */
  const char *kern;                  /* the kernel's qualifiers */
  const char *restr;                 /* restrict */
  const char *gid[3], *lid[3];       /* global and local work-item ids, per dimension */
  const char *shared;                /* qualifier of the group's local-memory array */
  const char *barrier;               /* work-group barrier on local memory */
  const char *lmin;                  /* the minimum of two longs */
  bool bc_template;                  /* bit casts call the tg_bc<To> template (CUDA C++ has no statement expressions) */
} Lang;

static const Lang LANG_TABLE[] = {
    [LANG_C] = {{[TG_BOOL] = "_Bool", [TG_INT8] = "signed char", [TG_INT16] = "short", [TG_INT32] = "int",
                 [TG_INT64] = "long long", [TG_UINT8] = "unsigned char", [TG_UINT16] = "unsigned short",
                 [TG_UINT32] = "unsigned int", [TG_UINT64] = "unsigned long long", [TG_FLOAT16] = "float",
                 [TG_BFLOAT16] = "float", [TG_FLOAT32] = "float", [TG_FLOAT64] = "double", [TG_FP8E4M3] = "float", [TG_FP8E5M2] = "float",
                 [TG_FP8E4M3FNUZ] = "float", [TG_FP8E5M2FNUZ] = "float"},
                "_Bool", "unsigned short", "unsigned short", "unsigned int", "long long", "LL", "ULL",
                "__builtin_inf()", "__builtin_inff()", "__builtin_nan(\"\")", "__builtin_nanf(\"\")", "__builtin_", true, false, "", false,
                "__builtin_memcpy", "-__builtin_inf()", "-__builtin_inff()", "static inline", "", "", {"", "", ""}, {"", "", ""}, "", "", "", false},
    [LANG_OPENCL] = {{[TG_BOOL] = "bool", [TG_INT8] = "char", [TG_INT16] = "short", [TG_INT32] = "int",
                      [TG_INT64] = "long", [TG_UINT8] = "uchar", [TG_UINT16] = "ushort", [TG_UINT32] = "uint",
                      [TG_UINT64] = "ulong", [TG_FLOAT16] = "float", [TG_BFLOAT16] = "float", [TG_FLOAT32] = "float",
                      [TG_FLOAT64] = "double", [TG_FP8E4M3] = "float", [TG_FP8E5M2] = "float",
                 [TG_FP8E4M3FNUZ] = "float", [TG_FP8E5M2FNUZ] = "float"},
                     "uchar", "ushort", "ushort", "uint", "long", "L", "UL", "((double)INFINITY)", "INFINITY", "((double)NAN)",
                     "NAN", "", false, true, "__global ", true, "__builtin_memcpy", "(-(double)INFINITY)", "(-INFINITY)",
                     "static inline", "__kernel", "restrict", {"get_global_id(0)", "get_global_id(1)", "get_global_id(2)"},
                     {"get_local_id(0)", "get_local_id(1)", "get_local_id(2)"}, "__local", "barrier(CLK_LOCAL_MEM_FENCE);", "min", false},
    /* CUDA C as NVRTC compiles it: C++ with CUDA's qualifiers and intrinsics, no libc headers
     * (memcpy and the f-suffixed math functions are device builtins), 16-bit floats through
     * cuda_fp16.h/cuda_bf16.h, 64-bit work-item ids. */
    [LANG_CUDA] = {{[TG_BOOL] = "bool", [TG_INT8] = "signed char", [TG_INT16] = "short", [TG_INT32] = "int",
                    [TG_INT64] = "long long", [TG_UINT8] = "unsigned char", [TG_UINT16] = "unsigned short",
                    [TG_UINT32] = "unsigned int", [TG_UINT64] = "unsigned long long", [TG_FLOAT16] = "float",
                    [TG_BFLOAT16] = "float", [TG_FLOAT32] = "float", [TG_FLOAT64] = "double", [TG_FP8E4M3] = "float", [TG_FP8E5M2] = "float",
                 [TG_FP8E4M3FNUZ] = "float", [TG_FP8E5M2FNUZ] = "float"},
                   "unsigned char", "unsigned short", "unsigned short", "unsigned int", "long long", "LL", "ULL",
                   "__longlong_as_double(0x7ff0000000000000LL)", "__int_as_float(0x7f800000)",
                   "__longlong_as_double(0x7ff8000000000000LL)", "__int_as_float(0x7fc00000)", "", true, false, "", false,
                   "memcpy", "(-__longlong_as_double(0x7ff0000000000000LL))", "(-__int_as_float(0x7f800000))",
                   "static __device__ __forceinline__", "extern \"C\" __global__", "__restrict__",
                   {"((long)blockIdx.x * (long)blockDim.x + (long)threadIdx.x)", "((long)blockIdx.y * (long)blockDim.y + (long)threadIdx.y)",
                    "((long)blockIdx.z * (long)blockDim.z + (long)threadIdx.z)"},
                   {"threadIdx.x", "threadIdx.y", "threadIdx.z"}, "__shared__", "__syncthreads();", "tg_lmin", true},
};
/* The language of the kernel being rendered (renderers run on any thread). */
static _Thread_local const Lang *L = &LANG_TABLE[LANG_C];

static const char *ctype(tg_dtype dt) { return dt > 0 && dt < TG_DTYPE_COUNT ? L->types[dt] : "int"; }
/* storage type in memory */
static const char *stype(tg_dtype dt) {
  if (dt == TG_FLOAT16) return L->half_store;
  if (dt == TG_BFLOAT16) return L->u16;
  if (dtype_is_fp8(dt)) return ctype(TG_UINT8);
  if (dt == TG_BOOL) return L->bool_store;
  return ctype(dt);
}
/* floats narrower than float32: stored as their bits, computed in float */
static bool is_half(tg_dtype dt) { return dt == TG_FLOAT16 || dt == TG_BFLOAT16 || dtype_is_fp8(dt); }
/* rounding wrapper for the narrow floats computed in float */
static const char *rnd(tg_dtype dt) {
  switch (dt) {
  case TG_FLOAT16: return "tg_rh";
  case TG_BFLOAT16: return "tg_rb";
  case TG_FP8E4M3: return "tg_r8a";
  case TG_FP8E5M2: return "tg_r8b";
  case TG_FP8E4M3FNUZ: return "tg_r8c";
  case TG_FP8E5M2FNUZ: return "tg_r8d";
  default: return "";
  }
}
/* the rounding after arithmetic: for float16 the hardware's conversion where there is one (see
 * tg_rhq); a cast keeps rnd(), whose operand may be a signalling NaN read from memory */
static const char *rnd_arith(tg_dtype dt) { return dt == TG_FLOAT16 ? "tg_rhq" : rnd(dt); }
/* float arithmetic (codegen.h's float_arith_result): a cast of its result may round with the
 * hardware even where its bits are kept (a softmax's max over scaled float32 scores) */
static bool arith_op(int op) {
  switch (op) {
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_FDIV: case OP_SQRT: case OP_RECIP: case OP_EXP2: case OP_LOG2:
  case OP_SIN: case OP_POW:
    return true;
  default:
    return false;
  }
}
bool float_arith_result(const UOp *u) { return arith_op(u->op) && tg_dtype_is_float((tg_dtype)u->dtype); }
/* storage bits -> float, and float -> storage bits, for the narrow floats ("" for the others) */
static const char *to_f(tg_dtype dt) {
  switch (dt) {
  case TG_FLOAT16: return "tg_h2f";
  case TG_BFLOAT16: return "tg_b2f";
  case TG_FP8E4M3: return "tg_8a2f";
  case TG_FP8E5M2: return "tg_8b2f";
  case TG_FP8E4M3FNUZ: return "tg_8c2f";
  case TG_FP8E5M2FNUZ: return "tg_8d2f";
  default: return "";
  }
}
static const char *from_f(tg_dtype dt) {
  switch (dt) {
  case TG_FLOAT16: return "tg_f2h";
  case TG_BFLOAT16: return "tg_f2b";
  case TG_FP8E4M3: return "tg_f28a";
  case TG_FP8E5M2: return "tg_f28b";
  case TG_FP8E4M3FNUZ: return "tg_f28c";
  case TG_FP8E5M2FNUZ: return "tg_f28d";
  default: return "";
  }
}

static const char PRELUDE_HALF[] =
    "static inline float tg_h2f(unsigned short h){unsigned int o=(unsigned int)(h&0x7fffu)<<13,e=o&0x0f800000u,"
    "s=(unsigned int)(h&0x8000u)<<16;float f;o+=0x38000000u;if(e==0x0f800000u)o+=0x38000000u;else if(e==0){o+=0x00800000u;"
    "__builtin_memcpy(&f,&o,4);f-=0x1p-14f;__builtin_memcpy(&o,&f,4);}o|=s;__builtin_memcpy(&f,&o,4);return f;}\n"
    "static inline unsigned short tg_f2h(float f){unsigned int x;__builtin_memcpy(&x,&f,4);unsigned int s=(x>>16)&0x8000,"
    "a=x&0x7fffffffu;if(a>0x7f800000u){unsigned int p=(a>>13)&0x3ff;return (unsigned short)(s|0x7c00|(p?p:0x200));}if(a>=0x477ff000u)return (unsigned short)(s|0x7c00);"
    "if(a<0x38800000u){if(a<0x33000000u)return (unsigned short)s;unsigned int e=a>>23,m=(a&0x7fffff)|0x800000,sh=126-e,"
    "r=m>>sh,rem=m&((1u<<sh)-1),half=1u<<(sh-1);if(rem>half||(rem==half&&(r&1)))r++;return (unsigned short)(s|r);}"
    "unsigned int r=a+0xc8000fffu+((a>>13)&1);return (unsigned short)(s|(r>>13));}\n"
    "static inline float tg_rh(float f){return tg_h2f(tg_f2h(f));}\n"
    /* tg_rhq: the rounding after arithmetic (whose result is never a signalling NaN, the one input
     * on which the hardware's conversion differs from tg_f2h), by F16C where the CPU has it: two
     * instructions instead of tg_f2h's branches (a float16 softmax's scalar max over 16 keys:
     * 144 -> 9 us on an AVX2 Zen) */
    "#if defined(__F16C__)\n"
    "typedef float tg_q4f __attribute__((vector_size(16)));\n"
    "static inline float tg_rhq(float f){return __builtin_ia32_vcvtph2ps(__builtin_ia32_vcvtps2ph((tg_q4f){f, 0, 0, 0}, 0))[0];}\n"
    "#else\n"
    "static inline float tg_rhq(float f){return tg_rh(f);}\n"
    "#endif\n";
static const char PRELUDE_BF16[] =
    "static inline float tg_b2f(unsigned short h){unsigned int b=(unsigned int)h<<16;float f;__builtin_memcpy(&f,&b,4);return f;}\n"
    "static inline unsigned short tg_f2b(float f){unsigned int x;__builtin_memcpy(&x,&f,4);if((x&0x7fffffffu)>0x7f800000u)"
    "return (unsigned short)((x>>16)&0x7f?(x>>16):((x>>16)|0x40));x+=0x7fffu+((x>>16)&1);return (unsigned short)(x>>16);}\n"
    "static inline float tg_rb(float f){return tg_b2f(tg_f2b(f));}\n";
/* fp8 as tinygrad converts it (from the value's double bits, nearest-even; dtype.c's double_to_fp8
 * and fp8_to_double). k is the format's kind: 0 OCP e4m3 (bias 7, 3 mantissa bits) has no inf -- inf
 * and nan become nan (0x7f), finite overflow saturates to 448; 1 OCP e5m2 (bias 15, 2 bits) keeps inf
 * and nan, finite overflow saturates to 57344; 2 fnuz (e4m3 bias 8, max 240; e5m2 bias 16, max 57344):
 * no inf and no -0, inf and nan become the one nan 0x80 and a zero result is +0. */
static const char PRELUDE_FP8[] =
    "static inline unsigned char tg_f2f8(double f,int M,int B,int k,unsigned long long ovf,unsigned char mx){"
    "unsigned long long x;__builtin_memcpy(&x,&f,8);unsigned char s=(unsigned char)((x>>56)&0x80);"
    "unsigned long long a=x&0x7fffffffffffffffULL;"
    "if(a>=0x7ff0000000000000ULL){if(k==2)return 0x80;if(!k)return s|0x7f;return s|(a>0x7ff0000000000000ULL?0x7f:0x7c);}"
    "if(a>ovf)return s|mx;int E=(int)(a>>52)-1023;"
    "if(E>=1-B){int sh=52-M;unsigned long long rb=a&((1ULL<<sh)-1),h=1ULL<<(sh-1);"
    "unsigned r=((unsigned)(E+B)<<M)|(unsigned)((a>>sh)&((1u<<M)-1));if(rb>h||(rb==h&&(r&1)))r++;return s|(unsigned char)r;}"
    "if(E<-B-M)return k==2?0:s;int sh=53-B-M-E;unsigned long long m=(a&0xfffffffffffffULL)|(1ULL<<52),q=m>>sh,"
    "rm=m&((1ULL<<sh)-1),h=1ULL<<(sh-1);if(rm>h||(rm==h&&(q&1)))q++;return q||k!=2?s|(unsigned char)q:0;}\n"
    "static inline float tg_f82f(unsigned char b,int M,int B,int k){if(k==2&&b==0x80)return __builtin_nanf(\"\");"
    "int e=(b>>M)&((1<<(7-M))-1),m=b&((1<<M)-1);"
    "float v;if(k==1&&e==(1<<(7-M))-1)v=m?__builtin_nanf(\"\"):__builtin_inff();"
    "else if(!k&&e==15&&m==7)v=__builtin_nanf(\"\");"
    "else{unsigned int pb=(unsigned int)((e?e:1)-B-M+127)<<23;float p;__builtin_memcpy(&p,&pb,4);"
    "v=(float)(e?(m|(1<<M)):m)*p;}return (b&0x80)?-v:v;}\n"
    "static inline unsigned char tg_f28a(double f){return tg_f2f8(f,3,7,0,0x407D000000000000ULL,0x7e);}\n"
    "static inline unsigned char tg_f28b(double f){return tg_f2f8(f,2,15,1,0x40EE000000000000ULL-1,0x7b);}\n"
    "static inline unsigned char tg_f28c(double f){return tg_f2f8(f,3,8,2,0x406F000000000000ULL-1,0x7f);}\n"
    "static inline unsigned char tg_f28d(double f){return tg_f2f8(f,2,16,2,0x40EE000000000000ULL-1,0x7f);}\n"
    "static inline float tg_8a2f(unsigned char b){return tg_f82f(b,3,7,0);}\n"
    "static inline float tg_8b2f(unsigned char b){return tg_f82f(b,2,15,1);}\n"
    "static inline float tg_8c2f(unsigned char b){return tg_f82f(b,3,8,2);}\n"
    "static inline float tg_8d2f(unsigned char b){return tg_f82f(b,2,16,2);}\n"
    "static inline float tg_r8a(double f){return tg_8a2f(tg_f28a(f));}\n"
    "static inline float tg_r8b(double f){return tg_8b2f(tg_f28b(f));}\n"
    "static inline float tg_r8c(double f){return tg_8c2f(tg_f28c(f));}\n"
    "static inline float tg_r8d(double f){return tg_8d2f(tg_f28d(f));}\n";

/* The fp8 conversions in OpenCL C (needs cl_khr_fp64: the rounding works on the double's bits) */
static const char PRELUDE_FP8_CL[] =
    "static inline uchar tg_f2f8(double f,int M,int B,int k,ulong ovf,uchar mx){"
    "ulong x=as_ulong(f);uchar s=(uchar)((x>>56)&0x80);"
    "ulong a=x&0x7fffffffffffffffUL;"
    "if(a>=0x7ff0000000000000UL){if(k==2)return 0x80;if(!k)return s|0x7f;return s|(a>0x7ff0000000000000UL?0x7f:0x7c);}"
    "if(a>ovf)return s|mx;int E=(int)(a>>52)-1023;"
    "if(E>=1-B){int sh=52-M;ulong rb=a&((1UL<<sh)-1),h=1UL<<(sh-1);"
    "uint r=((uint)(E+B)<<M)|(uint)((a>>sh)&((1u<<M)-1));if(rb>h||(rb==h&&(r&1)))r++;return s|(uchar)r;}"
    "if(E<-B-M)return k==2?0:s;int sh=53-B-M-E;ulong m=(a&0xfffffffffffffUL)|(1UL<<52),q=m>>sh,"
    "rm=m&((1UL<<sh)-1),h=1UL<<(sh-1);if(rm>h||(rm==h&&(q&1)))q++;return q||k!=2?s|(uchar)q:0;}\n"
    /* (NaN is the CPU's quiet NaN, not PoCL's NAN) */
    "static inline float tg_f82f(uchar b,int M,int B,int k){if(k==2&&b==0x80)return as_float(0x7fc00000u);"
    "int e=(b>>M)&((1<<(7-M))-1),m=b&((1<<M)-1);"
    "float v;if(k==1&&e==(1<<(7-M))-1)v=m?as_float(0x7fc00000u):INFINITY;"
    "else if(!k&&e==15&&m==7)v=as_float(0x7fc00000u);"
    "else{uint pb=(uint)((e?e:1)-B-M+127)<<23;float p=as_float(pb);"
    "v=(float)(e?(m|(1<<M)):m)*p;}return (b&0x80)?-v:v;}\n"
    "static inline uchar tg_f28a(double f){return tg_f2f8(f,3,7,0,0x407D000000000000UL,0x7e);}\n"
    "static inline uchar tg_f28b(double f){return tg_f2f8(f,2,15,1,0x40EE000000000000UL-1,0x7b);}\n"
    "static inline uchar tg_f28c(double f){return tg_f2f8(f,3,8,2,0x406F000000000000UL-1,0x7f);}\n"
    "static inline uchar tg_f28d(double f){return tg_f2f8(f,2,16,2,0x40EE000000000000UL-1,0x7f);}\n"
    "static inline float tg_8a2f(uchar b){return tg_f82f(b,3,7,0);}\n"
    "static inline float tg_8b2f(uchar b){return tg_f82f(b,2,15,1);}\n"
    "static inline float tg_8c2f(uchar b){return tg_f82f(b,3,8,2);}\n"
    "static inline float tg_8d2f(uchar b){return tg_f82f(b,2,16,2);}\n"
    "static inline float tg_r8a(double f){return tg_8a2f(tg_f28a(f));}\n"
    "static inline float tg_r8b(double f){return tg_8b2f(tg_f28b(f));}\n"
    "static inline float tg_r8c(double f){return tg_8c2f(tg_f28c(f));}\n"
    "static inline float tg_r8d(double f){return tg_8d2f(tg_f28d(f));}\n";

/* The same conversions in OpenCL C (as_float/as_uint instead of memcpy). float16 is stored as
 * its 16 bits and computed in float whether or not the device has cl_khr_fp16, converted by these
 * rather than vload_half/vstore_half_rte: those quiet signalling NaNs and drop NaN payloads
 * (PoCL), and a bit cast or copy of half data must keep every bit. */
static const char PRELUDE_HALF_CL[] =
    "static inline float tg_h2f(ushort h){uint s=(h&0x8000u)<<16,e=(h>>10)&0x1f,m=h&0x3ff,b;"
    "if(e==0){if(m==0)b=s;else{e=113;while(!(m&0x400)){m<<=1;e--;}m&=0x3ff;b=s|(e<<23)|(m<<13);}}"
    "else if(e==31)b=s|0x7f800000u|(m<<13);else b=s|((e+112)<<23)|(m<<13);return as_float(b);}\n"
    "static inline ushort tg_f2h(float f){uint x=as_uint(f);uint s=(x>>16)&0x8000,"
    "a=x&0x7fffffffu;if(a>0x7f800000u){uint p=(a>>13)&0x3ff;return (ushort)(s|0x7c00|(p?p:0x200));}if(a>=0x477ff000u)return (ushort)(s|0x7c00);"
    "if(a<0x38800000u){if(a<0x33000000u)return (ushort)s;uint e=a>>23,m=(a&0x7fffff)|0x800000,sh=126-e,"
    "r=m>>sh,rem=m&((1u<<sh)-1),half_=1u<<(sh-1);if(rem>half_||(rem==half_&&(r&1)))r++;return (ushort)(s|r);}"
    "uint r=a+0xc8000fffu+((a>>13)&1);return (ushort)(s|(r>>13));}\n"
    "static inline float tg_rh(float f){return tg_h2f(tg_f2h(f));}\n"
    "static inline float tg_rhq(float f){return tg_rh(f);}\n";
static const char PRELUDE_BF16_CL[] =
    "static inline float tg_b2f(ushort h){return as_float((uint)h<<16);}\n"
    "static inline ushort tg_f2b(float f){uint x=as_uint(f);if((x&0x7fffffffu)>0x7f800000u)"
    "return (ushort)((x>>16)&0x7f?(x>>16):((x>>16)|0x40));x+=0x7fffu+((x>>16)&1);return (ushort)(x>>16);}\n"
    "static inline float tg_rb(float f){return tg_b2f(tg_f2b(f));}\n";

/* CUDA: the same conversions through cuda_fp16.h and cuda_bf16.h (round to nearest even). */
static const char PRELUDE_HALF_CUDA[] =
    "#include <cuda_fp16.h>\n"
    "static __device__ __forceinline__ float tg_h2f(unsigned short h){return __half2float(__ushort_as_half(h));}\n"
    "static __device__ __forceinline__ unsigned short tg_f2h(float f){return __half_as_ushort(__float2half_rn(f));}\n"
    "static __device__ __forceinline__ float tg_rh(float f){return tg_h2f(tg_f2h(f));}\n"
    "static __device__ __forceinline__ float tg_rhq(float f){return tg_rh(f);}\n";
static const char PRELUDE_BF16_CUDA[] =
    "#include <cuda_bf16.h>\n"
    "static __device__ __forceinline__ float tg_b2f(unsigned short h){return __bfloat162float(__ushort_as_bfloat16(h));}\n"
    "static __device__ __forceinline__ unsigned short tg_f2b(float f){return __bfloat16_as_ushort(__float2bfloat16_rn(f));}\n"
    "static __device__ __forceinline__ float tg_rb(float f){return tg_b2f(tg_f2b(f));}\n";

typedef struct {
  SB *b;
  PtrMap names; /* node -> malloc'd expression string */
  PtrMap vec;   /* node -> 1 if its value is a vector of vw lanes */
  int vw;
  int nvar;
  int indent;
  bool uses_half, uses_bf16, uses_fp8, uses_f64;
  const int64_t *pimg; /* per param: texels per image row, 0 for a plain buffer (IMAGE) */
  int np;
  PtrMap bits;  /* node -> 1 if a consumer keeps its bits (a store, a max, a negation...): a float16
                 * load without it only feeds arithmetic and may convert with the hardware's
                 * instruction, which quiets a signalling NaN that arithmetic would quiet anyway */
  PtrMap storeonly; /* float16/bfloat16 arithmetic results that nothing but the output store reads:
                     * not rounded first, since the store's conversion rounds the same way
                     * (rounding a rounded value changes nothing) */
} R;

/* IMAGE: float i of an image lives in texel i/4 (at x = texel % width, y = texel / width), lane i%4.
 * The sampler clamps, so a masked-off load with an index outside the image reads 0, never out of
 * bounds. */
static const char PRELUDE_IMAGE_CL[] =
    "__constant sampler_t tg_smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;\n"
    "static inline int2 tg_ixy(long i, long w){long t=i>>2;return (int2)((int)(t%w),(int)(t/w));}\n"
    "static inline float tg_rimg(read_only image2d_t im, long i, long w){float4 v=read_imagef(im,tg_smp,tg_ixy(i,w));"
    "int c=(int)(i&3);return c==0?v.x:c==1?v.y:c==2?v.z:v.w;}\n";

static int64_t img_of(const R *r, const UOp *g) {
  return g->op == OP_DEFINE_GLOBAL && r->pimg && g->arg.i >= 0 && g->arg.i < r->np ? r->pimg[g->arg.i] : 0;
}

static const char *nm(R *r, UOp *u) { return pm_get(&r->names, (uint64_t)(uintptr_t)u); }

static void ind(R *r) {
  for (int i = 0; i < r->indent; i++) sb_puts(r->b, "  ");
}

static char *const_str(tg_dtype dt, const UOp *u) {
  SB s;
  sb_init(&s);
  if (tg_dtype_is_float(dt)) {
    double v = u->arg.f;
    bool dbl = dt == TG_FLOAT64;
    if (isnan(v)) sb_puts(&s, dbl ? L->nan : L->nanf);
    else if (isinf(v)) sb_printf(&s, "%s%s", v < 0 ? "-" : "", dbl ? L->inf : L->inff);
    else if (dbl) sb_printf(&s, "%a", v);
    else sb_printf(&s, "%af", (double)(float)v);
  } else if (dt == TG_BOOL) {
    sb_puts(&s, u->arg.i ? "1" : "0");
  } else if (dt == TG_UINT64) {
    sb_printf(&s, "%llu%s", (unsigned long long)u->arg.i, L->ull);
  } else if (dt == TG_UINT32) {
    sb_printf(&s, "%lluu", (unsigned long long)(uint32_t)u->arg.i);
  } else if (u->arg.i == INT64_MIN) {
    sb_printf(&s, "(-9223372036854775807%s-1)", L->ll);
  } else {
    sb_printf(&s, "%lld%s", (long long)u->arg.i, L->ll);
  }
  /* parenthesize negatives so "a - -1" never appears */
  if (s.s[0] == '-') {
    SB p;
    sb_init(&p);
    sb_printf(&p, "(%s)", s.s);
    sb_free(&s);
    return sb_take(&p);
  }
  return sb_take(&s);
}

static const char *bin_op_str(int op) {
  switch (op) {
  case OP_ADD: return "+";
  case OP_SUB: return "-";
  case OP_MUL: return "*";
  case OP_FDIV: return "/";
  case OP_CMPLT: return "<";
  case OP_CMPNE: return "!=";
  case OP_CMPEQ: return "==";
  case OP_AND: return "&";
  case OP_OR: return "|";
  case OP_XOR: return "^";
  default: return NULL;
  }
}

static const char *fsuf(tg_dtype dt) { return dt == TG_FLOAT64 || !L->math_fsuf ? "" : "f"; }

/* Signed 32/64-bit add, sub, mul (and negation) computed on unsigned values and converted back: OpenCL
 * C and CUDA leave signed overflow undefined (PoCL's compiler folded (int)(a + a) widened to long
 * into a 64-bit add: 2^31 - 1 doubled became 4294967294, not -2); C kernels are built with -fwrapv,
 * where the plain operators wrap. */
static bool wraps_unsigned(tg_dtype dt, int op) {
  return L != &LANG_TABLE[LANG_C] && (dt == TG_INT32 || dt == TG_INT64) && (op == OP_ADD || op == OP_SUB || op == OP_MUL);
}

static const char *utype(tg_dtype dt) {
  switch (tg_dtype_itemsize(dt)) {
  case 1: return ctype(TG_UINT8);
  case 2: return ctype(TG_UINT16);
  case 4: return ctype(TG_UINT32);
  default: return ctype(TG_UINT64);
  }
}

/* Does a load have a mask? (One a bounded loop made always true has none.) */
static bool gated(const UOp *u) { return u->nsrc > 2 && !(u->src[2]->op == OP_CONST && u->src[2]->arg.i); }

/* Expression for an ALU/LOAD node given its sources' names. */
static void render_expr(R *r, UOp *u, SB *e) {
  tg_dtype dt = (tg_dtype)u->dtype;
  const char *a = u->nsrc > 0 ? nm(r, u->src[0]) : NULL, *b = u->nsrc > 1 ? nm(r, u->src[1]) : NULL,
             *c = u->nsrc > 2 ? nm(r, u->src[2]) : NULL;
  tg_dtype sdt = u->nsrc > 0 ? (tg_dtype)u->src[0]->dtype : dt;
  bool fl = tg_dtype_is_float(dt);
  const char *rd = fl && !pm_has(&r->storeonly, (uint64_t)(uintptr_t)u) ? rnd_arith(dt) : "";
  switch (u->op) {
  case OP_LOAD: {
    const char *conv = to_f(dt);
    int64_t iw = img_of(r, u->src[0]);
    if (iw && gated(u)) sb_printf(e, "(%s ? tg_rimg(%s, %s, %lldL) : 0)", c, a, b, (long long)iw);
    else if (iw) sb_printf(e, "tg_rimg(%s, %s, %lldL)", a, b, (long long)iw);
    else if (gated(u)) sb_printf(e, "(%s ? %s(%s[%s]) : 0)", c, conv, a, b);
    else sb_printf(e, "%s(%s[%s])", conv, a, b);
    return;
  }
  case OP_EXP2: sb_printf(e, "%s(%sexp2%s(%s))", rd, L->math, fsuf(dt), a); return;
  case OP_LOG2: sb_printf(e, "%s(%slog2%s(%s))", rd, L->math, fsuf(dt), a); return;
  case OP_SIN: sb_printf(e, "%s(%ssin%s(%s))", rd, L->math, fsuf(dt), a); return;
  case OP_SQRT: sb_printf(e, "%s(%ssqrt%s(%s))", rd, L->math, fsuf(dt), a); return;
  case OP_TRUNC:
    if (fl) sb_printf(e, "%strunc%s(%s)", L->math, fsuf(dt), a);
    else sb_printf(e, "%s", a);
    return;
  case OP_RECIP: sb_printf(e, "%s(1.0%s/%s)", rd, fsuf(dt), a); return;
  case OP_NEG:
    if (dt == TG_BOOL) sb_printf(e, "(!%s)", a);
    else if (tg_dtype_is_unsigned(dt)) sb_printf(e, "(%s)(0u-%s)", ctype(dt), a);
    else if (wraps_unsigned(dt, OP_SUB)) sb_printf(e, "(%s)((%s)0-(%s)%s)", ctype(dt), utype(dt), utype(dt), a);
    else sb_printf(e, "(-%s)", a);
    return;
  case OP_CAST:
    if (!fl && dt != TG_BOOL && u->src[0]->op == OP_CONST && tg_dtype_is_float(sdt)) {
      /* a float constant into an integer: folded here by the library's rule (NaN -> 0, truncate,
       * saturate to int64, wrap to the width). C (and OpenCL C, CUDA) leave the cast of an
       * out-of-range literal undefined, and gcc folded it to an uninitialized value */
      UOp c = {.op = OP_CONST, .dtype = dt};
      c.arg.i = dtype_int_of(dt, u->src[0]->arg.f);
      char *lit = const_str(dt, &c);
      sb_printf(e, "(%s)(%s)", ctype(dt), lit);
      free(lit);
      return;
    }
    if (dt == TG_BOOL) sb_printf(e, "(%s != 0)", a);
    else if (fl && dtype_is_fp8(dt)) sb_printf(e, "%s((double)%s)", rd, a); /* one rounding, also from double */
    else if (fl && is_half(dt)) /* exact, unless the bits kept cannot be a signalling NaN's */
      sb_printf(e, "%s((float)%s)", float_arith_result(u->src[0]) || !pm_has(&r->bits, (uint64_t)(uintptr_t)u) ? rnd_arith(dt) : rnd(dt), a);
    else sb_printf(e, "(%s)(%s)", ctype(dt), a);
    return;
  case OP_BITCAST: {
    /* reinterpret the storage bits: 16-bit floats are converted to/from their bit patterns */
    SB src;
    sb_init(&src);
    if (is_half(sdt)) sb_printf(&src, "%s(%s)", from_f(sdt), a);
    else sb_printf(&src, "%s", a);
    const char *st = is_half(sdt) ? stype(sdt) : ctype(sdt);
    const char *dstt = is_half(dt) ? stype(dt) : ctype(dt);
    const char *conv = to_f(dt);
    if (L->as_type) sb_printf(e, "%s(as_%s((%s)(%s)))", conv, dstt, st, src.s);
    else if (L->bc_template) sb_printf(e, "%s(tg_bc<%s>((%s)(%s)))", conv, dstt, st, src.s);
    else sb_printf(e, "%s(({%s s_=%s;%s d_;%s(&d_,&s_,sizeof d_);d_;}))", conv, st, src.s, dstt, L->memcpy);
    sb_free(&src);
    return;
  }
  case OP_IDIV:
  case OP_MOD:
    if (!fl && u->src[1]->op == OP_CONST && u->src[1]->arg.i != 0 && u->src[1]->arg.i != -1) {
      /* a constant divisor other than 0 and -1 needs no guard (OpenCL C compilers warn of the
       * constant `7L==0||7L==-1`) */
      sb_printf(e, "(%s)(%s%s%s)", ctype(dt), a, u->op == OP_IDIV ? "/" : "%", b);
      return;
    }
    if (u->op == OP_MOD) goto mod;
    if (fl) sb_printf(e, "%s(%strunc%s(%s/%s))", rd, L->math, fsuf(dt), a, b);
    else if (tg_dtype_is_unsigned(dt) || dt == TG_BOOL) sb_printf(e, "(%s ? (%s)(%s/%s) : 0)", b, ctype(dt), a, b);
    /* by 0: 0; by -1: the negation, which wraps for the most negative value (-fwrapv) as narrower
     * types do after promotion, instead of trapping */
    else sb_printf(e, "(%s==0 ? 0 : %s==-1 ? (%s)(-%s) : (%s)(%s/%s))", b, b, ctype(dt), a, ctype(dt), a, b);
    return;
  mod:
    if (fl) sb_printf(e, "%s(%sfmod%s(%s,%s))", rd, L->math, fsuf(dt), a, b);
    else if (tg_dtype_is_unsigned(dt) || dt == TG_BOOL) sb_printf(e, "(%s ? (%s)(%s%%%s) : 0)", b, ctype(dt), a, b);
    else sb_printf(e, "((%s==0||%s==-1) ? 0 : (%s)(%s%%%s))", b, b, ctype(dt), a, b);
    return;
  case OP_MAX:
    if (fl) sb_printf(e, "((%s>%s||%s!=%s)?%s:%s)", a, b, a, a, a, b);
    else sb_printf(e, "(%s>%s?%s:%s)", a, b, a, b);
    return;
  /* 8- and 16-bit values shift as C's int (tinygrad's, PyTorch's): counts up to 31, in 32 bits, the
   * left shift unsigned */
  case OP_SHL:
    if (tg_dtype_itemsize(dt) < 4) sb_printf(e, "(%s)((%s)(%s)%s<<(%s&31))", ctype(dt), utype(TG_UINT32), utype(dt), a, b);
    else sb_printf(e, "(%s)((%s)%s<<(%s&%d))", ctype(dt), utype(dt), a, b, (int)tg_dtype_itemsize(dt) * 8 - 1);
    return;
  case OP_SHR:
    if (tg_dtype_itemsize(dt) < 4) sb_printf(e, "(%s)((%s)%s>>(%s&31))", ctype(dt), tg_dtype_is_unsigned(dt) ? utype(TG_UINT32) : ctype(TG_INT32), a, b);
    else sb_printf(e, "(%s)(%s>>(%s&%d))", ctype(dt), a, b, (int)tg_dtype_itemsize(dt) * 8 - 1);
    return;
  case OP_POW:
    if (fl) sb_printf(e, "%s(%spow%s(%s,%s))", rd, L->math, fsuf(dt), a, b);
    else sb_printf(e, "(%s)tg_ipow((%s)%s,(%s)%s)", ctype(dt), L->i64, a, L->i64, b);
    return;
  case OP_WHERE: sb_printf(e, "(%s?%s:%s)", a, b, c); return;
  default: break;
  }
  const char *op = bin_op_str(u->op);
  TG_ASSERT(op != NULL);
  bool cmp = u->op == OP_CMPLT || u->op == OP_CMPNE || u->op == OP_CMPEQ;
  if (wraps_unsigned(dt, u->op)) sb_printf(e, "(%s)((%s)%s%s(%s)%s)", ctype(dt), utype(dt), a, op, utype(dt), b);
  else if (fl && !cmp && *rd) sb_printf(e, "%s(%s%s%s)", rd, a, op, b);
  else if (!fl && !cmp && dt != TG_BOOL && dt != DT_INDEX) sb_printf(e, "(%s)(%s%s%s)", ctype(dt), a, op, b);
  else sb_printf(e, "(%s%s%s)", a, op, b);
}

typedef struct {
  PtrMap level;  /* node -> level+1 */
  PtrMap post;   /* nodes depending on a reduce placeholder */
  PtrVec order;  /* post-order of all nodes */
  PtrMap seen;
  PtrMap nuse;   /* node -> how many nodes of order read it */
} Lin;

static void topo(Lin *l, UOp *u) {
  if (!u || pm_has(&l->seen, (uint64_t)(uintptr_t)u)) return;
  pm_put(&l->seen, (uint64_t)(uintptr_t)u, (void *)1);
  for (uint32_t i = 0; i < u->nsrc; i++) topo(l, u->src[i]);
  pv_push(&l->order, u);
}

static bool needs_var(UOp *u) {
  return u->op != OP_CONST && u->op != OP_RANGE && u->op != OP_DEFINE_GLOBAL && u->op != OP_NOOP && u->op != OP_DEFINE_VAR;
}

/* Does text use identifier `name` (or name + "u", its unaligned twin)? "tg_v8" is not "tg_v8_16". */
static bool uses_name(const char *text, const char *name) {
  size_t n = strlen(name);
  for (const char *p = text ? strstr(text, name) : NULL; p; p = strstr(p + 1, name)) {
    char c = p[n];
    if (c == 'u') c = p[n + 1];
    if (!(c >= '0' && c <= '9') && c != '_' && !(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z')) return true;
  }
  return false;
}

static bool isvec(R *r, UOp *u) { return u && pm_has(&r->vec, (uint64_t)(uintptr_t)u); }

static bool is_i32(int dt) { return dt == TG_INT32 || dt == TG_UINT32; }

/* the zero vector of type t: a compound literal in C, a cast of 0 (every lane) in OpenCL C, whose
 * vector literals must name every lane */
static const char *vz(char buf[48], const char *t) {
  snprintf(buf, 48, L->ext_vec ? "((%s)(0))" : "(%s){0}", t);
  return buf;
}

/* operand of a vector op: vectors as they are, scalars broadcast */
static void vopnd(R *r, UOp *u, bool mask, SB *e) {
  const char *n = nm(r, u);
  char z[48], t[32];
  if (isvec(r, u)) sb_puts(e, n);
  else if (mask) sb_printf(e, "(%s + ((%s) ? -1 : 0))", vz(z, "tg_vm"), n);
  else if (is_i32(u->dtype)) snprintf(t, sizeof t, "tg_v%d", (int)u->dtype), sb_printf(e, "(%s + (%s)(%s))", vz(z, t), ctype((tg_dtype)u->dtype), n);
  /* x - 0 is x for every float (0 + x turns -0 into +0, so the compiler must emit that add): the
   * broadcast folds into the consumer, e.g. an FMA with an embedded {1to16} memory broadcast */
  else sb_printf(e, "((float)(%s) - %s)", n, vz(z, "tg_vf"));
}

/* vector type names for a loaded dtype: float32 uses tg_vf; integer loads get their own lane type */
static void vtype_names(tg_dtype dt, char *vt, char *vtu) {
  if (dt == TG_FLOAT32 || dt == TG_FLOAT16 || dt == TG_BFLOAT16) {
    strcpy(vt, "tg_vf"), strcpy(vtu, "tg_vfu");
  } else {
    snprintf(vt, 32, "tg_v%d", (int)dt), snprintf(vtu, 32, "tg_v%du", (int)dt);
  }
}

static bool is_vhalf(int dt) { return dt == TG_FLOAT16 || dt == TG_BFLOAT16; }
static bool is_vfloat(int dt) { return dt == TG_FLOAT32 || is_vhalf(dt); }

static void render_vexpr_f(R *r, UOp *u, SB *e);

/* u = x << 8k | x >> (32 - 8k) (either order) on 32-bit integer lanes with constant amounts: k in
 * 1..3, else 0 */
static int rot_bytes(const UOp *u) {
  if (u->op != OP_OR || (u->dtype != TG_UINT32 && u->dtype != TG_INT32) || u->nsrc != 2) return 0;
  const UOp *l = u->src[0], *h = u->src[1];
  if (l->op == OP_SHR) l = u->src[1], h = u->src[0];
  if (l->op != OP_SHL || h->op != OP_SHR || l->src[0] != h->src[0] || l->src[1]->op != OP_CONST || h->src[1]->op != OP_CONST ||
      u->dtype != TG_UINT32 || l->dtype != TG_UINT32 || h->dtype != TG_UINT32)
    return 0;
  int64_t kl = l->src[1]->arg.i, kh = h->src[1]->arg.i;
  if (kl <= 0 || kl >= 32 || kl % 8 != 0 || kl + kh != 32) return 0;
  return (int)(kl / 8);
}

/* How a float16/bfloat16 vector result is rounded (codegen.h); here, after arithmetic, by tg_vrh
 * (the hardware's conversion where the CPU has one), which a store of it may use too (tg_vshr). */
VHRound vhalf_round(const UOp *u) {
  if (u->op == OP_LOAD || u->op == OP_NEG || u->op == OP_MAX || u->op == OP_WHERE ||
      (u->op == OP_CAST && u->src[0]->dtype == u->dtype))
    return VH_EXACT;
  return u->op == OP_CAST ? VH_CAST : VH_ARITH;
}

/* A vector operation; one whose dtype is float16 or bfloat16 is computed on float lanes and rounded
 * as vhalf_round says */
static void render_vexpr(R *r, UOp *u, SB *e) {
  VHRound how = is_vhalf(u->dtype) ? vhalf_round(u) : VH_EXACT;
  if (how == VH_ARITH && pm_has(&r->storeonly, (uint64_t)(uintptr_t)u)) how = VH_EXACT;
  if (how == VH_EXACT) {
    render_vexpr_f(r, u, e);
    return;
  }
  SB t;
  sb_init(&t);
  render_vexpr_f(r, u, &t);
  /* a cast whose bits no consumer keeps may take the hardware's conversion too */
  bool exact = how == VH_CAST && pm_has(&r->bits, (uint64_t)(uintptr_t)u) && !float_arith_result(u->src[0]);
  sb_printf(e, "%s(%s)", u->dtype == TG_BFLOAT16 ? "tg_vrb" : exact ? "tg_vrhx" : "tg_vrh", t.s);
  sb_free(&t);
}

static void render_vexpr_f(R *r, UOp *u, SB *e) {
  UOp *a = u->nsrc > 0 ? u->src[0] : NULL, *b = u->nsrc > 1 ? u->src[1] : NULL, *c = u->nsrc > 2 ? u->src[2] : NULL;
  bool amask = a && a->dtype == TG_BOOL;
  char z[48], z1[48];
  /* bools are masks here (true = -1): arithmetic on them is logic (false < true, a*b = a and b,
   * a+b and max = a or b), not the integer operation, which would see true as -1 */
  if (amask && b && (u->op == OP_CMPLT || u->op == OP_MUL || u->op == OP_ADD || u->op == OP_MAX)) {
    sb_puts(e, u->op == OP_CMPLT ? "(~" : "(");
    vopnd(r, a, true, e);
    sb_puts(e, u->op == OP_CMPLT || u->op == OP_MUL ? " & " : " | ");
    vopnd(r, b, true, e);
    sb_puts(e, ")");
    return;
  }
  switch (u->op) {
  case OP_LOAD: {
    char vt[32], vtu[32];
    vtype_names((tg_dtype)u->dtype, vt, vtu);
    if (u->niarg == 1) { /* a gather: lane l at base + l*stride */
      if (gated(u)) sb_printf(e, "((%s) ? ", nm(r, c));
      /* float16/bfloat16: the W halves gathered into integer lanes, converted exactly */
      bool h = is_vhalf(u->dtype);
      if (h) sb_printf(e, "%s(", u->dtype == TG_BFLOAT16 ? "tg_vb2f" : "tg_vh2f");
      sb_printf(e, "((%s){", h ? "tg_vhw" : vt);
      for (int l = 0; l < (int)u->arg.i; l++)
        sb_printf(e, "%s%s[%s + %lld%s]", l ? ", " : "", nm(r, a), nm(r, b), (long long)(l * u->iarg[0]), L->ll);
      sb_puts(e, h ? "}))" : "})");
      if (gated(u)) sb_printf(e, " : %s)", vz(z, vt));
      return;
    }
    if (is_vhalf(u->dtype)) {
      const char *f = u->dtype == TG_BFLOAT16 ? "tg_vlb" : pm_has(&r->bits, (uint64_t)(uintptr_t)u) ? "tg_vlh" : "tg_vlhq";
      if (gated(u)) sb_printf(e, "((%s) ? %s(%s + %s) : %s)", nm(r, c), f, nm(r, a), nm(r, b), vz(z, vt));
      else sb_printf(e, "%s(%s + %s)", f, nm(r, a), nm(r, b));
      return;
    }
    if (gated(u)) sb_printf(e, "((%s) ? *(const %s%s *)(%s + %s) : %s)", nm(r, c), L->gptr, vtu, nm(r, a), nm(r, b), vz(z, vt));
    else sb_printf(e, "(*(const %s%s *)(%s + %s))", L->gptr, vtu, nm(r, a), nm(r, b));
    return;
  }
  case OP_WHERE:
    if (is_i32(u->dtype) && isvec(r, a)) {
      sb_printf(e, "((tg_v%d)(((tg_vm)", (int)u->dtype);
      vopnd(r, b, false, e);
      sb_printf(e, " & %s) | ((tg_vm)", nm(r, a));
      vopnd(r, c, false, e);
      sb_printf(e, " & ~%s)))", nm(r, a));
    } else if (!isvec(r, a)) {
      sb_printf(e, "((%s) ? ", nm(r, a));
      vopnd(r, b, u->dtype == TG_BOOL, e);
      sb_puts(e, " : ");
      vopnd(r, c, u->dtype == TG_BOOL, e);
      sb_puts(e, ")");
    } else if (u->dtype == TG_BOOL) {
      sb_printf(e, "((%s & ", nm(r, a));
      vopnd(r, b, true, e);
      sb_printf(e, ") | (~%s & ", nm(r, a));
      vopnd(r, c, true, e);
      sb_puts(e, "))");
    } else {
      sb_printf(e, "tg_vsel(%s, ", nm(r, a));
      vopnd(r, b, false, e);
      sb_puts(e, ", ");
      vopnd(r, c, false, e);
      sb_puts(e, ")");
    }
    return;
  case OP_MAX:
    sb_puts(e, "tg_vmax(");
    vopnd(r, a, false, e);
    sb_puts(e, ", ");
    vopnd(r, b, false, e);
    sb_puts(e, ")");
    return;
  case OP_NEG:
    if (!amask && u->dtype == TG_INT32 && wraps_unsigned(TG_INT32, OP_SUB)) {
      sb_printf(e, "as_int%d((uint%d)(0) - as_uint%d(%s))", r->vw, r->vw, r->vw, nm(r, a));
      return;
    }
    sb_printf(e, amask ? "(~%s)" : "(-%s)", nm(r, a));
    return;
  case OP_RECIP:
    sb_printf(e, "(%s + 1.0f) / %s", vz(z, "tg_vf"), nm(r, a));
    return;
  case OP_EXP2: case OP_LOG2: case OP_SIN: case OP_SQRT: case OP_TRUNC: {
    const char *f = u->op == OP_EXP2 ? "exp2f" : u->op == OP_LOG2 ? "log2f" : u->op == OP_SIN ? "sinf" : u->op == OP_SQRT ? "sqrtf" : "truncf";
    sb_printf(e, "tg_v_%s(%s)", f, nm(r, a));
    return;
  }
  case OP_BITCAST: /* 32-bit lanes reinterpreted: float32 <-> int32/uint32 */
    if (L->as_type) /* (OpenCL C: vector types convert bit for bit only through as_<type>) */
      sb_printf(e, "as_%s%d(%s)", u->dtype == TG_FLOAT32 ? "float" : u->dtype == TG_INT32 ? "int" : "uint", r->vw, nm(r, a));
    else if (u->dtype == TG_FLOAT32) sb_printf(e, "((tg_vf)%s)", nm(r, a));
    else sb_printf(e, "((tg_v%d)%s)", (int)u->dtype, nm(r, a));
    return;
  case OP_OR: {
    /* x << 8k | x >> (32 - 8k) on 32-bit lanes: a byte rotation, one byte shuffle instead of two
     * shifts and an or (threefry's rotations by 16 and 24; Zen 1 has one vector shift pipe) */
    int kb = rot_bytes(u);
    if (kb && L == &LANG_TABLE[LANG_C]) {
      UOp *x = a->src[0];
      sb_printf(e, "((tg_v%d)tg_vrotb%d((tg_v%d)", (int)u->dtype, kb, (int)TG_UINT32);
      vopnd(r, x, false, e);
      sb_puts(e, "))");
      return;
    }
    break;
  }
  case OP_SHL: case OP_SHR: /* the amount taken mod 32 as the scalar code does; left shifts unsigned */
    if (u->op == OP_SHL) sb_printf(e, "((tg_v%d)((tg_v%d)", (int)u->dtype, (int)TG_UINT32);
    else sb_printf(e, "((tg_v%d)(", (int)u->dtype);
    vopnd(r, a, false, e); /* either operand may be the same in every lane */
    if (u->op == OP_SHL) sb_printf(e, " << ((tg_v%d)", (int)TG_UINT32);
    else sb_printf(e, " >> ((tg_v%d)", (int)u->dtype);
    vopnd(r, b, false, e);
    sb_puts(e, " & 31)))");
    return;
  case OP_CAST:
    if (u->niarg == 1) { /* lanes of an index: base + {0, 1, ..., W-1} (opt.c) */
      sb_printf(e, "((tg_v%d){", (int)u->dtype);
      for (int l = 0; l < (int)u->iarg[0]; l++) sb_printf(e, "%s%d", l ? ", " : "", l);
      sb_printf(e, "} + (%s)%s)", ctype((tg_dtype)u->dtype), nm(r, a));
      return;
    }
    if (is_vfloat(u->dtype) && is_vfloat(a->dtype)) vopnd(r, a, false, e); /* the same float lanes (render_vexpr rounds) */
    else if (is_vfloat(u->dtype) && a->dtype != TG_BOOL) sb_printf(e, "__builtin_convertvector(%s, tg_vf)", nm(r, a));
    else if (is_vfloat(u->dtype)) sb_printf(e, "tg_vsel(%s, %s + 1.0f, %s)", nm(r, a), vz(z, "tg_vf"), vz(z1, "tg_vf"));
    else sb_printf(e, "(%s != %s)", nm(r, a), vz(z, "tg_vf"));
    return;
  default: break;
  }
  const char *op = bin_op_str(u->op);
  TG_ASSERT(op != NULL);
  bool m = amask;
  if (!amask && u->dtype == TG_INT32 && wraps_unsigned(TG_INT32, u->op)) {
    /* (OpenCL C: vector types convert bit for bit only through as_<type>) */
    sb_printf(e, "as_int%d(as_uint%d(", r->vw, r->vw);
    vopnd(r, a, false, e);
    sb_printf(e, ")%sas_uint%d(", op, r->vw);
    vopnd(r, b, false, e);
    sb_puts(e, "))");
    return;
  }
  sb_puts(e, "(");
  vopnd(r, a, m, e);
  sb_puts(e, op);
  vopnd(r, b, m, e);
  sb_puts(e, ")");
}

/* Is index u a multiple of 4 by its form (constants, products by multiples of 4, their sums)? */
static bool mult4(const UOp *u) {
  if (u->op == OP_CONST) return u->arg.i % 4 == 0;
  if (u->op == OP_MUL) return (u->src[1]->op == OP_CONST && u->src[1]->arg.i % 4 == 0) || mult4(u->src[0]) || mult4(u->src[1]);
  if (u->op == OP_ADD) return mult4(u->src[0]) && mult4(u->src[1]);
  return false;
}

/* IMAGE: a load of lane c of texel base/4 (idx = base + c, base a multiple of 4 by its form) reads
 * the texel once per emitted block: `float4 tN = read_imagef(...)` then `tN.x` .. `tN.w`. Reading
 * the texel of a masked-off lane is harmless (the sampler clamps). Returns false where the index
 * has no such form (the load stays a tg_rimg call). */
static bool emit_texel_load(R *r, UOp *u, PtrMap *texels, SB *e) {
  int64_t w = img_of(r, u->src[0]);
  UOp *idx = u->src[1], *base = idx;
  int64_t c = 0;
  if (!w || isvec(r, u)) return false;
  if (idx->op == OP_ADD && idx->src[1]->op == OP_CONST && idx->src[1]->arg.i > 0 && idx->src[1]->arg.i < 4 && mult4(idx->src[0]))
    base = idx->src[0], c = idx->src[1]->arg.i;
  else if (!mult4(idx)) return false;
  const char *bn = nm(r, base);
  if (!bn) return false;
  const char *t = pm_get(texels, (uint64_t)(uintptr_t)base);
  if (!t || strncmp(t, nm(r, u->src[0]), strlen(nm(r, u->src[0]))) || t[strlen(nm(r, u->src[0]))] != ':') {
    if (t) return false; /* one texel name per base node and block: another image's stays */
    char name[64];
    snprintf(name, sizeof name, "%s:t%d", nm(r, u->src[0]), r->nvar++);
    ind(r);
    sb_printf(r->b, "float4 %s = read_imagef(%s, tg_smp, tg_ixy(%s, %lldL));\n", strchr(name, ':') + 1, nm(r, u->src[0]), bn,
              (long long)w);
    pm_put(texels, (uint64_t)(uintptr_t)base, tg_xstrdup(name));
    t = pm_get(texels, (uint64_t)(uintptr_t)base);
  }
  const char *tv = strchr(t, ':') + 1;
  static const char lanes[4] = {'x', 'y', 'z', 'w'};
  if (gated(u)) sb_printf(e, "(%s ? %s.%c : 0)", nm(r, u->src[2]), tv, lanes[c]);
  else sb_printf(e, "%s.%c", tv, lanes[c]);
  return true;
}

/* The W gathers of a W x W tile (gather_block) as W row loads and a transposition in registers:
 * log2(W) rounds of two-input shuffles, each exchanging one bit of the row index with the same bit
 * of the lane index, instead of W*W scalar loads. */
static void emit_gather_block(R *r, UOp **blk, UOp *root, int64_t off0) {
  int W = r->vw, t[16], lo[16], hi[16];
  const UOp *g = blk[0];
  for (int l = 0; l < W; l++) {
    t[l] = r->nvar++;
    ind(r);
    sb_printf(r->b, "tg_vf v%d = *(const tg_vfu *)(%s + %s + %lld%s);\n", t[l], nm(r, g->src[0]), nm(r, root),
              (long long)(off0 + l * g->iarg[0]), L->ll);
  }
  for (int h = W / 2; h >= 1; h /= 2) {
    gather_block_masks(W, h, lo, hi);
    for (int i = 0; i < W; i++) {
      if (i & h) continue;
      int a = t[i], b = t[i + h], n[2];
      for (int x = 0; x < 2; x++) {
        n[x] = r->nvar++;
        ind(r);
        sb_printf(r->b, "tg_vf v%d = TG_SHUF(v%d, v%d", n[x], a, b);
        for (int l = 0; l < W; l++) sb_printf(r->b, ", %d", x ? hi[l] : lo[l]);
        sb_puts(r->b, ");\n");
      }
      t[i] = n[0], t[i + h] = n[1];
    }
  }
  for (int j = 0; j < W; j++) {
    char name[32];
    snprintf(name, sizeof name, "v%d", t[j]);
    pm_put(&r->names, (uint64_t)(uintptr_t)blk[j], tg_xstrdup(name));
  }
}

static void emit_level(R *r, Lin *l, int level, bool post_phase) {
  PtrMap texels; /* base index node -> "<image>:<texel variable>" read in this block */
  pm_init(&texels);
  for (size_t i = 0; i < l->order.n; i++) {
    UOp *u = l->order.p[i];
    if (!needs_var(u) || nm(r, u)) continue;
    intptr_t lv = (intptr_t)pm_get(&l->level, (uint64_t)(uintptr_t)u) - 1;
    bool is_post = pm_has(&l->post, (uint64_t)(uintptr_t)u);
    if (lv != level || is_post != post_phase) continue;
    SB e;
    sb_init(&e);
    if (u->op == OP_LOAD && emit_texel_load(r, u, &texels, &e)) {
      char name[32];
      snprintf(name, sizeof name, "v%d", r->nvar++);
      ind(r);
      sb_printf(r->b, "float %s = %s;\n", name, e.s);
      sb_free(&e);
      pm_put(&r->names, (uint64_t)(uintptr_t)u, tg_xstrdup(name));
      continue;
    }
    UOp *blk[16], *root;
    int64_t off0;
    if (L == &LANG_TABLE[LANG_C] && u->op == OP_LOAD && gather_block(&l->order, &r->vec, &l->level, &l->post, u, r->vw, blk, &root, &off0)) {
      sb_free(&e);
      emit_gather_block(r, blk, root, off0);
      continue;
    }
    const char *ty;
    char vt[32], vtu[32];
    if (isvec(r, u)) {
      render_vexpr(r, u, &e);
      vtype_names((tg_dtype)u->dtype, vt, vtu);
      ty = u->dtype == TG_BOOL ? "tg_vm" : vt;
    } else {
      render_expr(r, u, &e);
      ty = ctype((tg_dtype)u->dtype);
    }
    char name[32];
    snprintf(name, sizeof name, "v%d", r->nvar++);
    ind(r);
    /* a vector load that several operations read (a register tile's operand): in a register (see
     * PRELUDE_PIN), not loaded again by each of them */
    int vb = r->vw * 4;
    bool pin = L == &LANG_TABLE[LANG_C] && isvec(r, u) && u->op == OP_LOAD && u->dtype == TG_FLOAT32 && u->niarg != 1 &&
               !gated(u) && (vb == 16 || vb == 32 || vb == 64) && (intptr_t)pm_get(&l->nuse, (uint64_t)(uintptr_t)u) >= 2;
    sb_printf(r->b, "%s %s = %s;", ty, name, e.s);
    if (pin) sb_printf(r->b, " TG_PIN%d(%s);\n", vb, name);
    else sb_puts(r->b, "\n");
    sb_free(&e);
    pm_put(&r->names, (uint64_t)(uintptr_t)u, tg_xstrdup(name));
  }
  for (size_t i = 0; i < texels.cap; i++)
    if (texels.keys[i]) free(texels.vals[i]);
  pm_free(&texels);
}

static void emit_store(R *r, const LKernel *k, int c) {
  tg_dtype odt = k->pdt[0];
  UOp *v = k->values[c];
  if (k->pimg && k->pimg[0]) {
    /* a texel at a time: copies c..c+3 are its lanes (image_lane_upcast) */
    if (c % 4) return;
    ind(r);
    sb_printf(r->b, "write_imagef(data0, tg_ixy(%s, %lldL), (float4)(%s, %s, %s, %s));\n", nm(r, k->sidxs[c]),
              (long long)k->pimg[0], nm(r, v), nm(r, k->values[c + 1]), nm(r, k->values[c + 2]), nm(r, k->values[c + 3]));
    return;
  }
  ind(r);
  if (k->vw) {
    const char *at = nm(r, k->sidxs[c]);
    SB e;
    sb_init(&e);
    vopnd(r, v, false, &e);
    if (is_vhalf(odt)) {
      /* the result of arithmetic (never a signalling NaN) may take the hardware's conversion */
      bool rounded = isvec(r, v) && op_is_alu(v->op) && vhalf_round(v) == VH_ARITH;
      sb_printf(r->b, "%s(data0 + %s, %s);\n", odt == TG_FLOAT16 ? (rounded ? "tg_vshr" : "tg_vsh") : "tg_vsb", at, e.s);
    } else if (!k->sop) {
      sb_printf(r->b, "*(%stg_vfu *)(data0 + %s) = %s;\n", L->gptr, at, e.s);
    } else {
      /* combining store (float32 only): the first window position stores, the others keep the max */
      sb_printf(r->b, "{ tg_vf nv_ = %s; if (!%s) nv_ = tg_vmax(nv_, *(const %stg_vfu *)(data0 + %s)); *(%stg_vfu *)(data0 + %s) = nv_; }\n",
                e.s, nm(r, k->sfirsts[c]), L->gptr, at, L->gptr, at);
    }
    sb_free(&e);
    return;
  }
  const char *conv = from_f(odt);
  if (!k->sop) {
    sb_printf(r->b, "data0[%s] = %s(%s);\n", nm(r, k->sidxs[c]), conv, nm(r, v));
  } else {
    /* combining store (float32 only): the first window position stores, the others keep the max */
    const char *at = nm(r, k->sidxs[c]), *x = nm(r, v), *f = nm(r, k->sfirsts[c]);
    sb_printf(r->b, "data0[%s] = (%s || %s > data0[%s] || %s != %s) ? %s : data0[%s];\n", at, f, x, at, x, x, x, at);
  }
}

/* GROUP: every work-item of the group leaves its partial in local memory; after the barrier
 * work-item 0 combines the group's partials (in work-item order) and alone computes the rest and
 * stores. */
static void emit_group_combine(R *r, const LKernel *k) {
  const char *at = ctype(k->racc);
  int64_t nc = k->ncopy;
  for (int c = 0; c < k->ncopy; c++) {
    ind(r);
    sb_printf(r->b, "tg_red[(lbase + lidx0) * %lldL + %d] = acc%d;\n", (long long)nc, c, c);
  }
  ind(r);
  sb_printf(r->b, "%s\n", L->barrier);
  ind(r);
  sb_puts(r->b, "if (lidx0 == 0) {\n");
  r->indent++;
  const char *rd = tg_dtype_is_float(k->racc) ? rnd_arith(k->racc) : "";
  for (int c = 0; c < k->ncopy; c++) {
    ind(r);
    sb_printf(r->b, "acc%d = tg_red[lbase * %lldL + %d];\n", c, (long long)nc, c);
    ind(r);
    sb_printf(r->b, "for (int i_ = 1; i_ < %d; i_++) { %s x_ = tg_red[(lbase + i_) * %lldL + %d]; ", k->group, at, (long long)nc, c);
    if (k->rop == OP_ADD) sb_printf(r->b, "acc%d = %s(acc%d + x_);", c, rd, c);
    else if (k->rop == OP_MUL) sb_printf(r->b, "acc%d = %s(acc%d * x_);", c, rd, c);
    else if (tg_dtype_is_float(k->racc)) sb_printf(r->b, "acc%d = (x_ > acc%d || x_ != x_) ? x_ : acc%d;", c, c, c);
    else sb_printf(r->b, "acc%d = x_ > acc%d ? x_ : acc%d;", c, c, c);
    sb_puts(r->b, " }\n");
  }
}

static void emit_post_and_store(R *r, Lin *l, const LKernel *k, int level) {
  for (int c = 0; c < k->ncopy; c++) {
    if (k->rplaces[c]) {
      char an[32];
      if (k->rvw && isvec(r, k->rbodies[c])) snprintf(an, sizeof an, "%s(acc%d)", k->rop == OP_MAX ? "tg_hmax" : "tg_hadd", c);
      else snprintf(an, sizeof an, "acc%d", c);
      pm_put(&r->names, (uint64_t)(uintptr_t)k->rplaces[c], tg_xstrdup(an));
    }
  }
  if (k->group) emit_group_combine(r, k);
  emit_level(r, l, level, true);
  for (int c = 0; c < k->ncopy; c++) emit_store(r, k, c);
  if (k->group) {
    r->indent--;
    ind(r);
    sb_puts(r->b, "}\n");
  }
}

/* A tensor core's row or column of an element, as text over the lane variable (the layout's
 * coefficients: see TcPos; wrow: a warpgroup's row, which adds its warp's 16 rows) */
static void tc_pos_text(char *buf, size_t n, const char *lane, int cg, int ct, int c0, bool wrow) {
  if (wrow) snprintf(buf, n, "(%d * (%s %% 32 / 4) + %d * (%s %% 4) + %d + %s / 32 * 16)", cg, lane, ct, lane, c0, lane);
  else snprintf(buf, n, "(%d * (%s / 4) + %d * (%s %% 4) + %d)", cg, lane, ct, lane, c0);
}

/* CUDA: the function giving a tensor core input's bits (16 for half and bfloat16, 32 for tf32) */
static const char *tc_bits(const TensorCore *tc) {
  return tc->in == TG_FLOAT16 ? "tg_f2h" : tc->in == TG_BFLOAT16 ? "tg_f2b" : "__float_as_uint";
}

/* CUDA: "unsigned int tg_<ab><reg> = ...": fragment elements f (and f + 1 for 16-bit inputs) packed
 * into one 32-bit register, the lower index in the low half (tf32 passes the float's bits) */
static void emit_tc_reg(R *r, const LKernel *k, char ab, int reg, int f) {
  const TensorCore *tc = k->tc;
  const char *bits = tc_bits(tc);
  ind(r);
  sb_printf(r->b, "unsigned int tg_%c%d = ", ab, reg);
  if (tc->per_reg == 2) sb_printf(r->b, "(unsigned int)%s(%s) | ((unsigned int)%s(%s) << 16);\n", bits, nm(r, k->tc_frag[f]), bits, nm(r, k->tc_frag[f + 1]));
  else sb_printf(r->b, "%s(%s);\n", bits, nm(r, k->tc_frag[f]));
}

/* CUDA: every accumulator fenced as an operand of the warpgroup instruction (an empty asm that
 * reads and writes it: CUTLASS's warpgroup_fence_operand) */
static void emit_acc_fences(R *r, const LKernel *k) {
  for (int c = 0; c < k->ncopy; c++) {
    ind(r);
    sb_printf(r->b, "asm volatile(\"\" : \"+f\"(acc%d) :: \"memory\");\n", c);
  }
}

/* The element offset in the staged B block (tc_smem_b) of block element (lane + 128 j) for a
 * block of `cols` columns, as text */
static void tc_smem_text(char *buf, size_t n, const char *lane, int j, int cols, int esize) {
  int T = 16 / esize;
  snprintf(buf, n, "((%s + %d) %% %d %% 8 * %d + (%s + %d) %% %d / 8 * %d + (%s + %d) / %d %% %d + (%s + %d) / %d / %d * %d)", lane, 128 * j,
           cols, T, lane, 128 * j, cols, TC_WG_SBO / esize, lane, 128 * j, cols, T, lane, 128 * j, cols, T, TC_WG_LBO / esize);
}

/* One k step of a warpgroup tensor core (TensorCore.wg). CUDA: the B block into shared memory
 * (each lane its elements, where tc_smem_b puts them), made visible to the tensor core's async
 * proxy, then per 64 rows one wgmma of A from registers and B through the block's descriptor
 * (tg_wdesc), committed and waited for at once. OpenCL: the emulation -- A through local memory by
 * the layout table, B read back from the staged block through the same canonical layout. */
static void emit_tc_wg(R *r, const LKernel *k, bool cuda) {
  const TensorCore *tc = k->tc;
  const char *lane = nm(r, k->granges[k->tc_lane]);
  int um = k->tc_um, un = k->tc_un, cols = tc->n * un, esize = tc->in == TG_FLOAT32 ? 4 : 2;
  char off[512], row[160], col[160];
  ind(r);
  sb_printf(r->b, "%s\n", cuda ? "__syncthreads();" : L->barrier); /* the previous step's reads are done */
  for (int j = 0; j < un; j++) {
    tc_smem_text(off, sizeof off, lane, j, cols, esize);
    ind(r);
    if (cuda) sb_printf(r->b, "tg_wb[%s] = %s(%s);\n", off, tc_bits(tc), nm(r, k->tc_frag[um * tc->na + j]));
    else sb_printf(r->b, "tg_wb[%s] = %s;\n", off, nm(r, k->tc_frag[um * tc->na + j]));
  }
  if (cuda) {
    ind(r);
    sb_puts(r->b, "asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n");
    ind(r);
    sb_puts(r->b, "__syncthreads();\n");
    int ra = tc->na / tc->per_reg;
    for (int f = 0; f < um * tc->na; f += tc->per_reg) emit_tc_reg(r, k, 'a', f / tc->per_reg, f);
    /* the registers the instruction reads and writes are fenced as its operands (CUTLASS's
     * warpgroup_fence_operand): the ISA leaves a register access between wgmma.fence and the
     * wgmma that uses it undefined, and the compiler would otherwise move the accumulators' first
     * zeroing or the A packing there */
    emit_acc_fences(r, k);
    for (int f = 0; f < um * tc->na; f += tc->per_reg) {
      ind(r);
      sb_printf(r->b, "asm volatile(\"\" : \"+r\"(tg_a%d) :: \"memory\");\n", f / tc->per_reg);
    }
    ind(r);
    sb_puts(r->b, "asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
    int nd = un * tc->nc; /* accumulators of one instruction */
    for (int im = 0; im < um; im++) {
      char ins[128];
      snprintf(ins, sizeof ins, tc->ptx, cols);
      ind(r);
      sb_printf(r->b, "asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n%s {", nd + ra + 1, ins);
      for (int i = 0; i < nd; i++) sb_printf(r->b, "%s%%%d", i ? "," : "", i);
      sb_puts(r->b, "}, {");
      for (int i = 0; i < ra; i++) sb_printf(r->b, "%s%%%d", i ? "," : "", nd + i);
      /* scale-d p (accumulate), A and B scaled by 1, B not transposed (K-major; tf32 has no such operand) */
      sb_printf(r->b, "}, %%%d, p, 1, 1%s;\\n}\\n\" : ", nd + ra, tc->in == TG_FLOAT32 ? "" : ", 0");
      for (int i = 0; i < nd; i++) sb_printf(r->b, "%s\"+f\"(acc%d)", i ? ", " : "", im * nd + i);
      sb_puts(r->b, " : ");
      for (int i = 0; i < ra; i++) sb_printf(r->b, "\"r\"(tg_a%d), ", im * ra + i);
      sb_puts(r->b, "\"l\"(tg_wdesc), \"r\"(1) : \"memory\");\n");
    }
    ind(r);
    sb_puts(r->b, "asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    ind(r);
    sb_puts(r->b, "asm volatile(\"wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");\n");
    emit_acc_fences(r, k);
    return;
  }
  for (int f = 0; f < um * tc->na; f++) {
    const TcPos *p = &tc->a[f % tc->na];
    tc_pos_text(row, sizeof row, lane, p->rg, p->rt, p->r0, true);
    tc_pos_text(col, sizeof col, lane, p->cg, p->ct, p->c0, false);
    ind(r);
    sb_printf(r->b, "tg_ta[%d + %s * %d + %s] = %s;\n", f / tc->na * tc->m * tc->k, row, tc->k, col, nm(r, k->tc_frag[f]));
  }
  ind(r);
  sb_printf(r->b, "%s\n", L->barrier);
  ind(r);
  sb_printf(r->b, "for (int kk_ = 0; kk_ < %d; kk_++) {\n", tc->k);
  int T = 16 / esize;
  for (int c = 0; c < k->ncopy; c++) {
    int e = c % tc->nc, in = (c / tc->nc) % un, im = c / tc->nc / un;
    const TcPos *p = &tc->c[e];
    tc_pos_text(row, sizeof row, lane, p->rg, p->rt, p->r0, true);
    tc_pos_text(col, sizeof col, lane, p->cg, p->ct, p->c0 + in * tc->n, false);
    ind(r);
    /* B(kk, col) where the descriptor's layout reads it: ((8, m), (T, 2k)) : ((T, SBO), (1, LBO)) */
    sb_printf(r->b, "  acc%d = fma(tg_ta[%d + %s * %d + kk_], tg_wb[%s %% 8 * %d + %s / 8 * %d + kk_ %% %d + kk_ / %d * %d], acc%d);\n", c,
              im * tc->m * tc->k, row, tc->k, col, T, col, TC_WG_SBO / esize, T, T, TC_WG_LBO / esize, c);
  }
  ind(r);
  sb_puts(r->b, "}\n");
}

/* One k step of a tensor-core kernel (LKernel.tc), after the lane's fragment elements (tc_frag)
 * were computed. CUDA: the elements packed into 32-bit registers (lower index in the low half), and
 * the instruction as inline PTX per tile, accumulating in place. OpenCL: an emulation with the same
 * layout -- each lane leaves its A and B elements in local memory where the layout puts them, and
 * after a barrier computes its accumulator elements from the whole tiles. It checks the layout's
 * consistency and the index math on a device that runs OpenCL; whether the hardware's layout is
 * the table's, only a run on a GPU shows. */
static void emit_tc(R *r, const LKernel *k, bool cuda) {
  const TensorCore *tc = k->tc;
  if (tc->wg) {
    emit_tc_wg(r, k, cuda);
    return;
  }
  const char *lane = nm(r, k->granges[k->tc_lane]);
  int um = k->tc_um, un = k->tc_un;
  if (cuda) {
    int ra = tc->na / tc->per_reg, rb = tc->nb / tc->per_reg;
    for (int f = 0; f < k->nfrag; f += tc->per_reg) {
      bool is_a = f < um * tc->na;
      emit_tc_reg(r, k, is_a ? 'a' : 'b', is_a ? f / tc->per_reg : (f - um * tc->na) / tc->per_reg, f);
    }
    for (int im = 0; im < um; im++)
      for (int in = 0; in < un; in++) {
        int c0 = (im * un + in) * tc->nc;
        ind(r);
        sb_printf(r->b, "asm(\"%s {", tc->ptx);
        for (int i = 0; i < tc->nc; i++) sb_printf(r->b, "%s%%%d", i ? "," : "", i);
        sb_puts(r->b, "}, {");
        for (int i = 0; i < ra; i++) sb_printf(r->b, "%s%%%d", i ? "," : "", tc->nc + i);
        sb_puts(r->b, "}, {");
        for (int i = 0; i < rb; i++) sb_printf(r->b, "%s%%%d", i ? "," : "", tc->nc + ra + i);
        sb_puts(r->b, "}, {");
        for (int i = 0; i < tc->nc; i++) sb_printf(r->b, "%s%%%d", i ? "," : "", i);
        sb_puts(r->b, "};\" : ");
        for (int i = 0; i < tc->nc; i++) sb_printf(r->b, "%s\"+f\"(acc%d)", i ? ", " : "", c0 + i);
        sb_puts(r->b, " : ");
        for (int i = 0; i < ra; i++) sb_printf(r->b, "%s\"r\"(tg_a%d)", i ? ", " : "", im * ra + i);
        for (int i = 0; i < rb; i++) sb_printf(r->b, ", \"r\"(tg_b%d)", in * rb + i);
        sb_puts(r->b, ");\n");
      }
    return;
  }
  char row[96], col[96];
  ind(r);
  sb_printf(r->b, "%s\n", L->barrier); /* the previous step's reads are done */
  for (int f = 0; f < k->nfrag; f++) {
    bool is_a = f < um * tc->na;
    int e = is_a ? f % tc->na : (f - um * tc->na) % tc->nb, t = is_a ? f / tc->na : (f - um * tc->na) / tc->nb;
    const TcPos *p = is_a ? &tc->a[e] : &tc->b[e];
    tc_pos_text(row, sizeof row, lane, p->rg, p->rt, p->r0, false);
    tc_pos_text(col, sizeof col, lane, p->cg, p->ct, p->c0, false);
    ind(r);
    if (is_a) sb_printf(r->b, "tg_ta[%d + %s * %d + %s] = %s;\n", t * tc->m * tc->k, row, tc->k, col, nm(r, k->tc_frag[f]));
    else sb_printf(r->b, "tg_tb[%d + %s * %d + %s] = %s;\n", t * tc->k * tc->n, row, tc->n, col, nm(r, k->tc_frag[f]));
  }
  ind(r);
  sb_printf(r->b, "%s\n", L->barrier);
  ind(r);
  sb_printf(r->b, "for (int kk_ = 0; kk_ < %d; kk_++) {\n", tc->k);
  for (int c = 0; c < k->ncopy; c++) {
    int e = c % tc->nc, in = (c / tc->nc) % un, im = c / tc->nc / un;
    const TcPos *p = &tc->c[e];
    tc_pos_text(row, sizeof row, lane, p->rg, p->rt, p->r0, false);
    tc_pos_text(col, sizeof col, lane, p->cg, p->ct, p->c0, false);
    ind(r);
    sb_printf(r->b, "  acc%d = fma(tg_ta[%d + %s * %d + kk_], tg_tb[%d + kk_ * %d + %s], acc%d);\n", c, im * tc->m * tc->k, row,
              tc->k, in * tc->k * tc->n, tc->n, col, c);
  }
  ind(r);
  sb_puts(r->b, "}\n");
}

/* TG_SHUF(a, b, i...): lanes of the float vectors a (0..W-1) and b (W..2W-1), constant indices */
static const char PRELUDE_SHUF[] =
    "#if defined(__clang__)\n"
    "#define TG_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)\n"
    "#else\n"
    "#define TG_SHUF(a, b, ...) __builtin_shuffle(a, b, (tg_vm){__VA_ARGS__})\n"
    "#endif\n";
/* TG_PIN<bytes>(v): the float vector v lives in a vector register from here. GCC folds a load into every instruction that
 * reads it when it can (vfmadd231ps (mem), ...), so a register tile whose operand vector feeds 4 or
 * 8 FMAs loads it 4 or 8 times: the loads, not the FMAs, then bound the inner loop (one conv kernel
 * of beautiful_mnist ran 1.3x slower than clang's build of the same source). An empty asm that
 * "changes" the value in a register stops the folding and costs no instruction. Clang loads the
 * vector once anyway, and other compilers, or a target where the vector needs two registers, get
 * nothing. */
static const char PRELUDE_PIN[] =
    "#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))\n"
    "#define TG_PIN_R(v) __asm__(\"\" : \"+v\"(v))\n"
    "#elif defined(__GNUC__) && !defined(__clang__) && defined(__aarch64__)\n"
    "#define TG_PIN_R(v) __asm__(\"\" : \"+w\"(v))\n"
    "#endif\n"
    /* only where one register holds the whole vector (without AVX a 32-byte vector is two) */
    "#if defined(TG_PIN_R) && (defined(__SSE2__) || defined(__aarch64__))\n"
    "#define TG_PIN16(v) TG_PIN_R(v)\n"
    "#else\n"
    "#define TG_PIN16(v) ((void)0)\n"
    "#endif\n"
    "#if defined(TG_PIN_R) && defined(__AVX__)\n"
    "#define TG_PIN32(v) TG_PIN_R(v)\n"
    "#else\n"
    "#define TG_PIN32(v) ((void)0)\n"
    "#endif\n"
    "#if defined(TG_PIN_R) && defined(__AVX512F__)\n"
    "#define TG_PIN64(v) TG_PIN_R(v)\n"
    "#else\n"
    "#define TG_PIN64(v) ((void)0)\n"
    "#endif\n";

static const char PRELUDE_VEC[] =
    "typedef float tg_vf __attribute__((vector_size(%d)));\n"
    "typedef float tg_vfu __attribute__((vector_size(%d), aligned(4)));\n"
    "typedef int tg_vm __attribute__((vector_size(%d)));\n"
    "static inline tg_vf tg_vsel(tg_vm m, tg_vf a, tg_vf b){return (tg_vf)(((tg_vm)a & m) | ((tg_vm)b & ~m));}\n"
    "static inline tg_vf tg_vmax(tg_vf a, tg_vf b){return tg_vsel((a > b) | (a != a), a, b);}\n";
/* float16 and bfloat16 lanes (the C renderer on the CPU): held as float lanes, rounded after every
 * operation as the scalar code rounds (tg_rh, tg_rb), converted with vector integer operations. Bit
 * for bit the scalar conversions: checked over every half and bfloat16 and every float32 bit
 * pattern, NaN payloads and signalling NaNs included (F16C's vcvtph2ps would quiet a signalling NaN).
 * A half's magnitude bits moved up to a float's (<< 13) with the exponent rebiased (+112) are the
 * float of a normal half; a subnormal one is that pattern plus one exponent step, less 2^-14 (its
 * value is mantissa x 2^-24), computed on normal floats only, so a thread with denormals flushed
 * (DAZ/FTZ, set by programs built with -ffast-math) still converts every half exactly. A float below
 * the half normals rounds to one by adding 0.5f, whose ulp is the half subnormals' step (the add
 * rounds to nearest even). The scalar tg_h2f works the same way. */
static const char PRELUDE_VHALF[] =
    "typedef unsigned int tg_vhw __attribute__((vector_size(%d)));\n"
    "typedef unsigned short tg_vhs __attribute__((vector_size(%d), aligned(2)));\n"
    "static inline tg_vhw tg_vselu(tg_vm m, tg_vhw a, tg_vhw b){return (tg_vhw)(((tg_vm)a & m) | ((tg_vm)b & ~m));}\n"
    "static inline tg_vf tg_vh2f(tg_vhw h){tg_vhw o = (h & 0x7fffu) << 13, e = o & 0x0f800000u, s = (h & 0x8000u) << 16;\n"
    "  o += 0x38000000u;\n"
    "  tg_vhw z = (tg_vhw)((tg_vf)(o + 0x00800000u) - 0x1p-14f);\n"
    "  o = tg_vselu(e == 0x0f800000u, o + 0x38000000u, o);\n"
    "  return (tg_vf)(tg_vselu(e == 0u, z, o) | s);}\n"
    "static inline tg_vhw tg_vf2h(tg_vf f){tg_vhw x = (tg_vhw)f, s = (x >> 16) & 0x8000u, a = x & 0x7fffffffu, p = (a >> 13) & 0x3ffu;\n"
    "  tg_vhw r = tg_vselu(a < 0x38800000u, s | ((tg_vhw)((tg_vf)a + 0.5f) - 0x3f000000u), s | ((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13));\n"
    "  r = tg_vselu(a >= 0x477ff000u, s | 0x7c00u, r);\n"
    "  return tg_vselu(a > 0x7f800000u, s | 0x7c00u | p | ((tg_vhw)(p == 0u) & 0x200u), r);}\n"
    "static inline tg_vf tg_vb2f(tg_vhw h){return (tg_vf)(h << 16);}\n"
    "static inline tg_vhw tg_vf2b(tg_vf f){tg_vhw x = (tg_vhw)f, t = x >> 16;\n"
    "  return tg_vselu((x & 0x7fffffffu) > 0x7f800000u, t | ((tg_vhw)((t & 0x7fu) == 0u) & 0x40u), (x + 0x7fffu + (t & 1u)) >> 16);}\n"
    "static inline tg_vf tg_vrb(tg_vf f){return tg_vb2f(tg_vf2b(f));}\n"
    "static inline tg_vf tg_vrhx(tg_vf f){return tg_vh2f(tg_vf2h(f));}\n"
    "static inline tg_vf tg_vlh(const unsigned short *p){return tg_vh2f(__builtin_convertvector(*(const tg_vhs *)p, tg_vhw));}\n"
    "static inline tg_vf tg_vlb(const unsigned short *p){return tg_vb2f(__builtin_convertvector(*(const tg_vhs *)p, tg_vhw));}\n"
    "static inline void tg_vsh(unsigned short *p, tg_vf v){*(tg_vhs *)p = __builtin_convertvector(tg_vf2h(v), tg_vhs);}\n"
    "static inline void tg_vsb(unsigned short *p, tg_vf v){*(tg_vhs *)p = __builtin_convertvector(tg_vf2b(v), tg_vhs);}\n";
/* tg_vrh: the rounding to float16 after an operation. With F16C (AVX-512 for 16 lanes) the
 * hardware's conversion there and back, two instructions, which round to nearest even as
 * tg_vf2h does; they differ from it only on a signalling NaN, which the result of an arithmetic
 * operation never is (loads and stores, which must keep every bit, stay with tg_vh2f/tg_vf2h).
 * tg_vshr stores such a result (never a signalling NaN) with the hardware's conversion too. The
 * arguments: the feature test, the bytes of 8 or 16 halves, the two conversions of this width. */
static const char PRELUDE_VRH_HW[] =
    "#if %s\n"
    "typedef short tg_vhx __attribute__((vector_size(%d)));\n"
    "typedef short tg_vhxu __attribute__((vector_size(%d), aligned(2)));\n"
    "static inline tg_vf tg_vrh(tg_vf f){%s}\n"
    "static inline void tg_vshr(unsigned short *p, tg_vf v){*(tg_vhx *)p = %s;}\n"
    "static inline tg_vf tg_vlhq(const unsigned short *p){return %s;}\n"
    "#else\n"
    "static inline tg_vf tg_vrh(tg_vf f){return tg_vrhx(f);}\n"
    "static inline void tg_vshr(unsigned short *p, tg_vf v){tg_vsh(p, v);}\n"
    "static inline tg_vf tg_vlhq(const unsigned short *p){return tg_vlh(p);}\n"
    "#endif\n";
/* OpenCL C: select() takes the lane of its second operand where the mask's top bit is set */
static const char PRELUDE_VEC_CL[] =
    "typedef float tg_vf __attribute__((ext_vector_type(%d)));\n"
    "typedef float tg_vfu __attribute__((ext_vector_type(%d), aligned(4)));\n"
    "typedef int tg_vm __attribute__((ext_vector_type(%d)));\n"
    "static inline tg_vf tg_vsel(tg_vm m, tg_vf a, tg_vf b){return select(b, a, m);}\n"
    "static inline tg_vf tg_vmax(tg_vf a, tg_vf b){return tg_vsel((a > b) | (a != a), a, b);}\n";

/* Vector exp2, log2 and sin, written with vector operations (a libm call per lane costs 6-7 times
 * as much). exp2 and log2 stay within 1.1 ulp of the exact result over all floats, sin within
 * 0.53 ulp (measured against double precision over every 112th float, and every float in
 * |x| < 3); infinities, NaN, zeros and subnormals give what libm gives.
 *  - exp2: x = n + f with n = round(x), |f| <= 1/2; 2^f by a degree-6 polynomial fitted for
 *    relative error (1.9e-9). When every lane has n in [-125, 127] (2^f is in [2^-1/2, 2^1/2], so
 *    the result is a normal float) 2^n is added to the exponent field as an integer: exact, the
 *    same bits as a multiply, and no clamp, no NaN select. Otherwise (a lane that under- or
 *    overflows, inf, NaN) x is clamped to [-151, 129] (NaN passes through) and 2^n is applied as
 *    two factors 2^(n/2) so subnormal results and the overflow to inf come out right (with
 *    AVX-512, scalef does it in one instruction, same bits, and without the slow subnormal
 *    multiply). The fast path is a third fewer instructions (the exp-bound softmax sum, 25 -> 16
 *    cycles per 8 lanes on Zen 1). n's integer value is read from the bits of t = x + 1.5*2^23
 *    (t - 0x4B400000 is n while |x| < 2^22, and out of the fast range otherwise, NaN and inf
 *    included), and t << 23 is n << 23, so no conversion instruction is needed (8% off an
 *    exp-bound sum on Zen 1, same bits).
 *  - log2: subnormals are scaled by 2^23; x = 2^e m with m in [sqrt(1/2), sqrt(2)), f = m - 1
 *    (exact); log2(1 + f) = f log2(e) + f^2 Q(f), Q of degree 8 (4.7e-8), log2(e) in two parts so
 *    the leading term is one fused rounding.
 *  - sin: in double, rounded once at the end: k = round(x 2/pi), r = x - k pi/2 (pi/2 in two
 *    parts), +-sin(r) or +-cos(r) by the quadrant, Taylor polynomials on |r| <= pi/4. A vector
 *    with a lane beyond 2^13, or inf or NaN, calls sinf per lane (large arguments need a longer
 *    reduction). */
static const char PRELUDE_V_EXP2[] =
    "static inline tg_vf tg_v_exp2f(tg_vf x){\n"
    "  typedef unsigned tg_vu_ __attribute__((vector_size(sizeof(tg_vf))));\n"
    "  tg_vf c = x, t = c + 0x1.8p23f, n = t - 0x1.8p23f;\n"
    "  tg_vm ni = (tg_vm)t - 0x4B400000, out = (tg_vm)((tg_vu_)(ni + 125) > 252u);\n"
    "  int slow = tg_vany(out);\n"
    "  if (__builtin_expect(slow, 0)) {\n"
    "    c = tg_vsel(x > 129.0f, (tg_vf){0} + 129.0f, x);\n"
    "    c = tg_vsel(c < -151.0f, (tg_vf){0} - 151.0f, c);\n"
    "    n = (c + 0x1.8p23f) - 0x1.8p23f;\n"
    "    ni = __builtin_convertvector(n, tg_vm);\n"
    "  }\n"
    "  tg_vf f = c - n;\n"
    "  tg_vf p = (tg_vf){0} + 0x1.41d32ep-13f;\n"
    "  p = p * f + 0x1.5f456ap-10f;\n"
    "  p = p * f + 0x1.3b2dbcp-7f;\n"
    "  p = p * f + 0x1.c6aed4p-5f;\n"
    "  p = p * f + 0x1.ebfbdap-3f;\n"
    "  p = p * f + 0x1.62e43p-1f;\n"
    "  p = p * f + 1.0f;\n"
    "  if (__builtin_expect(!slow, 1)) return (tg_vf)((tg_vm)p + ((tg_vm)t << 23));\n";
/* p 2^n: AVX-512's scalef when the vector is one register of it (exact, subnormal results without
 * a slow multiply), else two exponent-field factors. Bit-identical results either way. */
#define PRELUDE_V_EXP2_SCALE \
  "  tg_vf r = %s(p, n, p, (%s)-1%s);\n" \
  "#else\n"
static const char PRELUDE_V_EXP2_TAIL[] =
    "  tg_vm h = ni >> 1;\n"
    "  tg_vf r = p * (tg_vf)((h + 127) << 23) * (tg_vf)((ni - h + 127) << 23);\n"
    "#endif\n"
    "  return tg_vsel(x != x, x, r);\n"
    "}\n";
static const char PRELUDE_V_LOG2[] =
    "static inline tg_vf tg_v_log2f(tg_vf x){\n"
    "  typedef unsigned tg_vu_ __attribute__((vector_size(sizeof(tg_vf))));\n"
    "  tg_vm i = (tg_vm)x, sub = (tg_vm){0};\n"
    "  int slow = tg_vany((tg_vm)((tg_vu_)(i - 0x800000) >= 0x7f000000u));\n"
    "  if (__builtin_expect(slow, 0)) {\n"
    "    sub = x < 0x1p-126f;\n"
    "    i = (tg_vm)tg_vsel(sub, x * 0x1p23f, x);\n"
    "  }\n"
    "  tg_vm e = ((i >> 23) & 0xff) - 127 - (sub & 23);\n"
    "  tg_vm mi = (i & 0x7fffff) | 0x3f800000;\n"
    "  tg_vm big = mi > 0x3fb504f3;\n"
    "  mi = mi - (big & 0x800000);\n"
    "  e = e - big;\n"
    "  tg_vf f = (tg_vf)mi - 1.0f;\n"
    "  tg_vf q = (tg_vf){0} - 0x1.cb9ebap-4f;\n"
    "  q = q * f + 0x1.7985cep-3f;\n"
    "  q = q * f - 0x1.837912p-3f;\n"
    "  q = q * f + 0x1.a371f6p-3f;\n"
    "  q = q * f - 0x1.eb4548p-3f;\n"
    "  q = q * f + 0x1.277cf4p-2f;\n"
    "  q = q * f - 0x1.715768p-2f;\n"
    "  q = q * f + 0x1.ec7096p-2f;\n"
    "  q = q * f - 0x1.715476p-1f;\n"
    "  tg_vf l = f * 0x1.715476p+0f + (f * 0x1.4ae0cp-26f + f * f * q);\n"
    "  tg_vf r = __builtin_convertvector(e, tg_vf) + l;\n"
    "  if (__builtin_expect(!slow, 1)) return r;\n"
    "  r = tg_vsel(x == 0.0f, (tg_vf){0} - __builtin_inff(), r);\n"
    "  r = tg_vsel(x == __builtin_inff(), x, r);\n"
    "  return tg_vsel((x < 0.0f) | (x != x), (tg_vf){0} + __builtin_nanf(\"\"), r);\n"
    "}\n";
static const char PRELUDE_V_SIN[] =
    "typedef double tg_vd __attribute__((vector_size(2 * sizeof(tg_vf))));\n"
    "typedef long long tg_vl __attribute__((vector_size(2 * sizeof(tg_vf))));\n"
    "static inline tg_vf tg_v_sinf(tg_vf x){\n"
    "  enum { L = (int)(sizeof(tg_vf) / sizeof(float)) };\n"
    "  if (tg_vany((x > 8192.0f) | (x < -8192.0f) | (x != x))) {\n"
    "    tg_vf r;\n"
    "    for (int l = 0; l < L; l++) r[l] = __builtin_sinf(x[l]);\n"
    "    return r;\n"
    "  }\n"
    "  tg_vd d = __builtin_convertvector(x, tg_vd);\n"
    "  tg_vd t = d * 0x1.45f306dc9c883p-1 + 0x1.8p52, k = t - 0x1.8p52;\n"
    "  tg_vd r = (d - k * 0x1.921fb54442d18p+0) - k * 0x1.1a62633145c07p-54, z = r * r;\n"
    "  tg_vd s = r + r * z * (-0x1.5555555555555p-3 + z * (0x1.1111111111111p-7 + z * (-0x1.a01a01a01a01ap-13 + z * 0x1.71de3a556c734p-19)));\n"
    "  tg_vd c = 1.0 + z * (-0.5 + z * (0x1.5555555555555p-5 + z * (-0x1.6c16c16c16c17p-10 + z * (0x1.a01a01a01a01ap-16 + z * -0x1.27e4fb7789f5cp-22))));\n"
    "  tg_vl q = (tg_vl)t, odd = -(q & 1);\n"
    "  tg_vl v = ((tg_vl)c & odd) | ((tg_vl)s & ~odd);\n"
    "  return __builtin_convertvector((tg_vd)(v ^ ((q & 2) << 62)), tg_vf);\n"
    "}\n";

/* Blocked accumulation. A float sum of N terms added one after another into one accumulator has a
 * rounding error that grows with N -- linearly, not as sqrt(N), when the terms are alike (the
 * zero background of an image, the relu'd zeros of a batchnorm input), because every addition
 * then rounds the same way. Summing blocks of about sqrt(N) terms into a fresh partial and adding
 * the partials makes both chains about sqrt(N) long. The block is some iterations of one reduce
 * loop (with every loop inside it): the innermost loop whose iterations hold sqrt(N) terms between
 * them. Below BLOCK_MIN terms a chain is short enough as it is. */
#define BLOCK_MIN 1024
typedef struct {
  int level;     /* loop level (1-based, global loops first) that runs in blocks; 0 = none */
  int64_t iters; /* iterations of that loop per block */
} Blocking;

static Blocking blocking(const LKernel *k) {
  Blocking b = {0, 0};
  /* (a kernel with loops of variable length is not blocked: their sizes are only maxima) */
  if (!k->rbody || k->rop != OP_ADD || !tg_dtype_is_float(k->racc) || k->nr == 0 || k->sym || k->tc) return b;
  int64_t n = 1;
  for (int i = 0; i < k->nr; i++) n *= k->rranges[i]->iarg[0];
  if (n < BLOCK_MIN) return b;
  int64_t want = (int64_t)ceil(sqrt((double)n)), inner = 1;
  for (int i = k->nr - 1; i >= 0; i--) {
    int64_t sz = k->rranges[i]->iarg[0];
    if (inner * sz >= want) {
      int64_t it = (want + inner - 1) / inner;
      /* a divisor of the loop's size nearby saves the bounds check */
      for (int64_t d = it; d <= 2 * it && d < sz; d++)
        if (sz % d == 0) {
          it = d;
          break;
        }
      if (it >= sz) it = sz;
      b.level = k->ng + i + 1;
      b.iters = it;
      return b;
    }
    inner *= sz;
  }
  return b;
}

/* A transposing block (codegen.h): the W gathers of a W x W tile. */
static UOp *index_root(UOp *b, int64_t *off) {
  *off = 0;
  if (b->op == OP_ADD && b->nsrc == 2 && b->src[1]->op == OP_CONST) return *off = b->src[1]->arg.i, b->src[0];
  if (b->op == OP_ADD && b->nsrc == 2 && b->src[0]->op == OP_CONST) return *off = b->src[0]->arg.i, b->src[1];
  return b;
}

static bool block_gather(const UOp *u, int W) {
  return u->op == OP_LOAD && u->niarg == 1 && u->dtype == TG_FLOAT32 && u->arg.i == W && !gated(u);
}

bool gather_block(const PtrVec *order, const PtrMap *vec, const PtrMap *level, const PtrMap *post, UOp *u, int W,
                  UOp **members, UOp **root, int64_t *off0) {
  if (W < 2 || W > 16 || (W & (W - 1)) || !block_gather(u, W) || !pm_has(vec, (uint64_t)(uintptr_t)u)) return false;
  int64_t ou, o;
  UOp *ru = index_root(u->src[1], &ou);
  void *lv = pm_get(level, (uint64_t)(uintptr_t)u);
  bool pu = pm_has(post, (uint64_t)(uintptr_t)u);
  int n = 0;
  UOp *cand[16];
  int64_t offs[16], lo = ou;
  for (size_t i = 0; i < order->n; i++) {
    UOp *v = order->p[i];
    if (!block_gather(v, W) || v->src[0] != u->src[0] || v->iarg[0] != u->iarg[0] || !pm_has(vec, (uint64_t)(uintptr_t)v) ||
        pm_get(level, (uint64_t)(uintptr_t)v) != lv || pm_has(post, (uint64_t)(uintptr_t)v) != pu || index_root(v->src[1], &o) != ru)
      continue;
    if (n == W) return false; /* more than one tile's worth: not a single block */
    cand[n] = v, offs[n++] = o;
    if (o < lo) lo = o;
  }
  if (n != W) return false;
  for (int j = 0; j < W; j++) members[j] = NULL;
  for (int i = 0; i < n; i++) {
    int64_t j = offs[i] - lo;
    if (j < 0 || j >= W || members[j]) return false;
    members[j] = cand[i];
  }
  *root = ru, *off0 = lo;
  return true;
}

void gather_block_masks(int W, int h, int *lo, int *hi) {
  for (int l = 0; l < W; l++) {
    lo[l] = (l & h) ? W + l - h : l;
    hi[l] = (l & h) ? W + l : l + h;
  }
}

void kernel_use_counts(const PtrVec *order, PtrMap *nuse) {
  for (size_t i = 0; i < order->n; i++) {
    UOp *u = order->p[i];
    for (uint32_t j = 0; j < u->nsrc; j++) {
      uint64_t key = (uint64_t)(uintptr_t)u->src[j];
      pm_put(nuse, key, (void *)((intptr_t)pm_get(nuse, key) + 1));
    }
  }
}

/* The float16/bfloat16 nodes whose bits a consumer keeps, and the arithmetic results only the
 * output store reads (codegen.h): consumers come after their sources in the order, so a cast
 * (value-preserving, to float32) is settled when its sources are reached. */
void kernel_half_bits(const LKernel *k, const PtrVec *order, const PtrMap *nuse, PtrMap *bits, PtrMap *storeonly) {
  pm_init(bits);
  pm_init(storeonly);
  for (int c = 0; !k->sop && !(k->pimg && k->pimg[0]) && c < k->ncopy; c++) {
    UOp *v = k->values[c];
    if (v && (v->dtype == TG_FLOAT16 || v->dtype == TG_BFLOAT16) && v->dtype == k->pdt[0] && op_is_alu(v->op) &&
        v->op != OP_CAST && !pm_get(nuse, (uint64_t)(uintptr_t)v))
      pm_put(storeonly, (uint64_t)(uintptr_t)v, (void *)1);
  }
  UOp *const *roots[] = {k->values, k->sidxs, k->sfirsts, k->tc_frag};
  const int nroots[] = {k->ncopy, k->ncopy, k->sop ? k->ncopy : 0, k->nfrag};
  for (int g = 0; g < 4; g++)
    for (int c = 0; roots[g] && c < nroots[g]; c++)
      if (roots[g][c]) pm_put(bits, (uint64_t)(uintptr_t)roots[g][c], (void *)1);
  for (int c = 0; k->rbodies && c < k->ncopy; c++) /* a sum or product of them is arithmetic */
    if (k->rbodies[c] && k->rop != OP_ADD && k->rop != OP_MUL) pm_put(bits, (uint64_t)(uintptr_t)k->rbodies[c], (void *)1);
  for (size_t i = order->n; i-- > 0;) {
    UOp *u = order->p[i];
    bool arith = arith_op(u->op) || u->op == OP_CMPLT || u->op == OP_CMPNE || u->op == OP_CMPEQ ||
                 (u->op == OP_CAST && (u->dtype == TG_FLOAT32 || u->dtype == TG_FLOAT16) && !pm_has(bits, (uint64_t)(uintptr_t)u));
    for (uint32_t j = 0; !arith && j < u->nsrc; j++) pm_put(bits, (uint64_t)(uintptr_t)u->src[j], (void *)1);
  }
}

/* Vector-ness and loop levels, as both CPU renderers (C, LLVM) decide them, over the kernel's nodes
 * in topological order: vec gets the nodes computed as vectors of vw lanes (vw-wide loads and
 * everything computed from them; a reduction's placeholder follows its body); level gets each
 * node's loop level + 1, the deepest of its sources' (the loop ranges must be in it already); post
 * gets the nodes computed after the reduction loops (a placeholder, and what reads one). */
void kernel_vec_levels(const LKernel *k, int vw, const PtrVec *order, PtrMap *vec, PtrMap *level, PtrMap *post) {
#define ISVEC(x) ((x) && pm_has(vec, (uint64_t)(uintptr_t)(x)))
  for (size_t i = 0; i < order->n; i++) {
    UOp *u = order->p[i];
    bool v = (u->op == OP_LOAD && vw && u->arg.i == vw) || (u->op == OP_CAST && u->niarg == 1 && vw);
    for (uint32_t j = 0; j < u->nsrc && !v; j++)
      if (u->op != OP_LOAD && u->op != OP_STORE) v = ISVEC(u->src[j]);
    if (u->op == OP_NOOP && u->arg.i < 0) {
      int c = (int)(-u->arg.i) - 1;
      v = !k->rvw && c < k->ncopy && ISVEC(k->rbodies[c]);
    }
    if (u->dtype == DT_INDEX) v = false;
    if (v) pm_put(vec, (uint64_t)(uintptr_t)u, (void *)1);
  }
#undef ISVEC
  for (size_t i = 0; i < order->n; i++) {
    UOp *u = order->p[i];
    if (u->op == OP_RANGE) continue;
    intptr_t lv = 0;
    bool after = false;
    for (int c = 0; c < k->ncopy; c++) after = after || u == k->rplaces[c];
    if (after) lv = k->ng;
    for (uint32_t j = 0; j < u->nsrc; j++) {
      intptr_t sl = (intptr_t)pm_get(level, (uint64_t)(uintptr_t)u->src[j]) - 1;
      if (sl > lv) lv = sl;
      if (pm_has(post, (uint64_t)(uintptr_t)u->src[j])) after = true;
    }
    pm_put(level, (uint64_t)(uintptr_t)u, (void *)(intptr_t)(lv + 1));
    if (after) pm_put(post, (uint64_t)(uintptr_t)u, (void *)1);
  }
  /* A value at the reduction's level that only the post-reduction code reads (the bias and the
   * residual a matmul's epilogue adds) is computed after the reduce loop, not before it: held
   * across the loop it took registers from the loop's tile (gcc spilled a 4x4 tile's operands of
   * BERT's projections to the stack, with twenty such floats live). Sources come before their
   * consumers in the order, so walking it backwards settles every consumer first. */
  if (!k->rbody || k->nr == 0) return;
  PtrMap keep; /* nodes that a node outside the post phase reads, or that must exist before it */
  pm_init(&keep);
  UOp *const *roots[] = {k->rbodies, k->rlo, k->rhi, k->sidxs, k->sfirsts, k->tc_frag};
  const int nroots[] = {k->ncopy, k->rlo ? k->nr : 0, k->rhi ? k->nr : 0, k->ncopy, k->sop ? k->ncopy : 0, k->nfrag};
  for (int g = 0; g < 6; g++)
    for (int c = 0; roots[g] && c < nroots[g]; c++)
      if (roots[g][c]) pm_put(&keep, (uint64_t)(uintptr_t)roots[g][c], (void *)1);
  for (int i = 0; i < k->ng + k->nr; i++) {
    UOp *rg = i < k->ng ? k->granges[i] : k->rranges[i - k->ng];
    if (rg->nsrc) pm_put(&keep, (uint64_t)(uintptr_t)rg->src[0], (void *)1);
  }
  for (size_t i = order->n; i-- > 0;) {
    UOp *u = order->p[i];
    uint64_t key = (uint64_t)(uintptr_t)u;
    if (u->op == OP_RANGE || u->op == OP_CONST || u->op == OP_DEFINE_GLOBAL || u->op == OP_DEFINE_VAR) continue;
    bool sink = !pm_has(post, key) && !pm_has(&keep, key) && (intptr_t)pm_get(level, key) - 1 == k->ng;
    for (int c = 0; sink && c < k->ncopy; c++) sink = u != k->values[c];
    if (sink) pm_put(post, key, (void *)1);
    if (pm_has(post, key)) continue;
    for (uint32_t j = 0; j < u->nsrc; j++) pm_put(&keep, (uint64_t)(uintptr_t)u->src[j], (void *)1);
  }
  pm_free(&keep);
}

int kernel_block_level(const LKernel *k, int64_t *iters) {
  Blocking b = blocking(k);
  *iters = b.iters;
  return b.level;
}

/* One accumulator per copy, <prefix><c>, set to init: a vector where the copy's body is one. */
static void declare_accs(R *r, const LKernel *k, const char *prefix, const char *init) {
  for (int c = 0; c < k->ncopy; c++) {
    ind(r);
    char z[48];
    if (isvec(r, k->rbodies[c])) sb_printf(r->b, "tg_vf %s%d = %s + %s;\n", prefix, c, vz(z, "tg_vf"), init);
    else sb_printf(r->b, "%s %s%d = %s;\n", ctype(k->racc), prefix, c, init);
  }
}

char *render_c(const LKernel *k, const char *name) { return render_kernel(k, name, LANG_C); }

char *render_kernel(const LKernel *k, const char *name, int lang) {
  L = &LANG_TABLE[lang == LANG_OPENCL || lang == LANG_CUDA ? lang : LANG_C];
  bool gpu = lang == LANG_OPENCL || lang == LANG_CUDA, cuda = lang == LANG_CUDA;
  GDim gd[64];
  int64_t gsz[3];
  if (gpu) gpu_global_dims(k, gd, gsz);
  SB out, body;
  sb_init(&out);
  sb_init(&body);
  R r;
  memset(&r, 0, sizeof r);
  r.b = &body;
  r.vw = k->vw ? k->vw : k->rvw;
  r.pimg = k->pimg, r.np = k->np;
  pm_init(&r.names);
  pm_init(&r.vec);
  Lin l;
  memset(&l, 0, sizeof l);
  pm_init(&l.level);
  pm_init(&l.post);
  pm_init(&l.seen);
  pm_init(&l.nuse);
  int nloops = k->ng + k->nr;
  for (int i = 0; i < k->ng; i++) {
    char buf[32];
    snprintf(buf, sizeof buf, "ridx%d", i);
    pm_put(&r.names, (uint64_t)(uintptr_t)k->granges[i], tg_xstrdup(buf));
    pm_put(&l.level, (uint64_t)(uintptr_t)k->granges[i], (void *)(intptr_t)(i + 2));
  }
  for (int i = 0; i < k->nr; i++) {
    char buf[32];
    snprintf(buf, sizeof buf, "ridx%d", k->ng + i);
    pm_put(&r.names, (uint64_t)(uintptr_t)k->rranges[i], tg_xstrdup(buf));
    pm_put(&l.level, (uint64_t)(uintptr_t)k->rranges[i], (void *)(intptr_t)(k->ng + i + 2));
  }
  /* the ends of loops of variable length, computed before the loops */
  for (int i = 0; i < k->ng; i++) topo(&l, k->granges[i]->nsrc ? k->granges[i]->src[0] : NULL);
  for (int i = 0; i < k->nr; i++) topo(&l, k->rranges[i]->nsrc ? k->rranges[i]->src[0] : NULL);
  for (int c = 0; c < k->ncopy; c++) topo(&l, k->rbodies[c]);
  for (int i = 0; i < k->nfrag; i++) topo(&l, k->tc_frag[i]);
  for (int c = 0; c < k->ncopy; c++) topo(&l, k->values[c]);
  for (int c = 0; c < k->ncopy; c++) topo(&l, k->sidxs[c]);
  for (int c = 0; k->sop && c < k->ncopy; c++) topo(&l, k->sfirsts[c]);
  for (int i = 0; k->rlo && i < k->nr; i++) topo(&l, k->rlo[i]), topo(&l, k->rhi[i]); /* NULL: none */
  /* vector-ness: W-wide loads and everything computed from them; placeholders follow their body */
  kernel_vec_levels(k, r.vw, &l.order, &r.vec, &l.level, &l.post);
  kernel_use_counts(&l.order, &l.nuse);
  kernel_half_bits(k, &l.order, &l.nuse, &r.bits, &r.storeonly);
  for (size_t i = 0; i < l.order.n; i++) {
    UOp *u = l.order.p[i];
    if (u->op == OP_RANGE) continue;
    if (u->dtype == TG_FLOAT16) r.uses_half = true;
    if (u->dtype == TG_FLOAT64) r.uses_f64 = true;
    if (u->dtype == TG_BFLOAT16) r.uses_bf16 = true;
    if (dtype_is_fp8((tg_dtype)u->dtype)) r.uses_fp8 = true;
    if (u->op == OP_CONST) pm_put(&r.names, (uint64_t)(uintptr_t)u, const_str((tg_dtype)u->dtype, u));
    if (u->op == OP_DEFINE_GLOBAL) {
      char buf[32];
      snprintf(buf, sizeof buf, "data%lld", (long long)u->arg.i);
      pm_put(&r.names, (uint64_t)(uintptr_t)u, tg_xstrdup(buf));
    }
    if (u->op == OP_DEFINE_VAR) {
      /* the variable's own name (tinygrad's `int start_pos` argument), numbered by its argument
       * place so that two variables of one name stay apart */
      const char *vn = "v";
      var_info((int)u->arg.i, &vn, NULL, NULL);
      int place = 0;
      for (int j = 0; j < k->nvars; j++)
        if (k->vars[j] == u) place = j;
      char buf[48];
      snprintf(buf, sizeof buf, "%s_%d", vn, place);
      pm_put(&r.names, (uint64_t)(uintptr_t)u, tg_xstrdup(buf));
    }
  }
  for (int i = 0; i < k->np; i++) {
    if (k->pdt[i] == TG_FLOAT64) r.uses_f64 = true;
    if (k->pdt[i] == TG_FLOAT16) r.uses_half = true;
    if (k->pdt[i] == TG_BFLOAT16) r.uses_bf16 = true;
    if (dtype_is_fp8(k->pdt[i])) r.uses_fp8 = true;
  }
  if (k->rbody && k->racc == TG_FLOAT16) r.uses_half = true;
  if (k->rbody && k->racc == TG_BFLOAT16) r.uses_bf16 = true;
  if (k->rbody && dtype_is_fp8(k->racc)) r.uses_fp8 = true;

  r.indent = 1;
  for (int i = 0; i < k->np && !gpu; i++) {
    ind(&r);
    sb_printf(&body, "%s%s *restrict data%d = (%s%s *)bufs[%d];\n", i ? "const " : "", stype(k->pdt[i]), i,
              i ? "const " : "", stype(k->pdt[i]), i);
  }
  for (int i = 0; i < k->nvars && !gpu; i++) {
    ind(&r);
    sb_printf(&body, "const long long %s = (long long)(__INTPTR_TYPE__)bufs[%d];\n", nm(&r, k->vars[i]), k->np + i);
  }
  Blocking blk = blocking(k);
  if (gpu && k->group) {
    /* the group's partials; each work-item owns the slots at (lbase + lidx0) * ncopy */
    blk.level = 0; /* each work-item's chain is already 1/group of the axis */
    ind(&r);
    sb_printf(&body, "%s %s tg_red[%lldL];\n", L->shared, ctype(k->racc), (long long)(k->lsize[0] * k->lsize[1] * k->lsize[2] * k->ncopy));
    ind(&r);
    sb_printf(&body, "long lidx0 = (long)%s;\n", L->lid[0]);
    ind(&r);
    sb_printf(&body, "long lbase = ((long)%s * %lldL + (long)%s) * %dL;\n", L->lid[2], (long long)k->lsize[1], L->lid[1], k->group);
  }
  if (gpu && !cuda && k->tc) {
    /* (the OpenCL emulation of a tensor core) the work-group's -- the warp's -- A and B tiles */
    ind(&r);
    sb_printf(&body, "%s float tg_ta[%d], %s[%d];\n", L->shared, k->tc_um * k->tc->m * k->tc->k, k->tc->wg ? "tg_wb" : "tg_tb",
              k->tc_un * k->tc->k * k->tc->n);
  }
  if (cuda && k->tc && k->tc->wg) {
    /* a warpgroup's B block in shared memory, and its descriptor: the start address, LBO and SBO
     * (each in 16-byte units), no swizzle (the PTX ISA's "Matrix Descriptor Format") */
    ind(&r);
    sb_printf(&body, "__shared__ __align__(128) %s tg_wb[%d];\n", k->tc->in == TG_FLOAT32 ? "unsigned int" : "unsigned short",
              k->tc_un * k->tc->k * k->tc->n);
    ind(&r);
    sb_printf(&body, "const unsigned long long tg_wdesc = (((unsigned long long)__cvta_generic_to_shared(tg_wb) & 0x3FFFF) >> 4) | "
                     "((unsigned long long)(%d >> 4) << 16) | ((unsigned long long)(%d >> 4) << 32);\n", TC_WG_LBO, TC_WG_SBO);
  }
  emit_level(&r, &l, 0, false);
  if (k->ng == 0) {
    ind(&r);
    sb_puts(&body, gpu ? "{\n" : "for (long long g_ = gstart; g_ < gend; g_++) {\n");
    r.indent++;
  }
  for (int lv = 1; lv <= nloops; lv++) {
    if (lv == k->ng + 1) {
      /* accumulators, one per copy */
      tg_dtype at = k->racc;
      char ib[64];
      const char *init;
      if (k->rop == OP_ADD) init = "0";
      else if (k->rop == OP_MUL) init = "1";
      else if (tg_dtype_is_float(at)) init = at == TG_FLOAT64 ? L->ninf : L->ninff;
      else if (at == TG_BOOL || tg_dtype_is_unsigned(at)) init = "0";
      else {
        snprintf(ib, sizeof ib, "(%s)(%lld%s-1)", ctype(at), (long long)dtype_min(at) + 1, L->ll);
        init = ib;
      }
      declare_accs(&r, k, "acc", init);
    }
    UOp *rg = lv <= k->ng ? k->granges[lv - 1] : k->rranges[lv - 1 - k->ng];
    /* the loop's range: 0..size, or the bounds of a bounded reduce loop */
    char lo[64] = "0", hi[64];
    if (rg->nsrc) snprintf(hi, sizeof hi, "%s", nm(&r, rg->src[0]));
    else snprintf(hi, sizeof hi, "%lld%s", (long long)rg->iarg[0], L->ll);
    bool bounded = lv > k->ng && k->rlo && k->rlo[lv - 1 - k->ng];
    if (bounded) {
      snprintf(lo, sizeof lo, "%s", nm(&r, k->rlo[lv - 1 - k->ng]));
      snprintf(hi, sizeof hi, "%s", nm(&r, k->rhi[lv - 1 - k->ng]));
    }
    ind(&r);
    if (lv == blk.level) {
      /* blocked accumulation: loop lv runs in blocks of blk.iters; each block sums into part<c> */
      sb_printf(&body, "for (%s ridx%db = %s; ridx%db < %s; ridx%db += %lld%s) {\n", L->i64, lv - 1, lo, lv - 1, hi,
                lv - 1, (long long)blk.iters, L->ll);
      r.indent++;
      declare_accs(&r, k, "part", "0");
      char bound[96] = ""; /* the last block stops at the loop's end unless the blocks divide it */
      if (bounded || rg->iarg[0] % blk.iters) snprintf(bound, sizeof bound, " && ridx%d < %s", lv - 1, hi);
      ind(&r);
      sb_printf(&body, "for (%s ridx%d = ridx%db; ridx%d < ridx%db + %lld%s%s; ridx%d++) {\n", L->i64, lv - 1, lv - 1,
                lv - 1, lv - 1, (long long)blk.iters, L->ll, bound, lv - 1);
    } else if (gpu && k->group && lv == k->ng + 1 + k->group_axis) {
      /* the grouped reduce loop: work-item lidx0 takes every group-th step (GROUP) or one
       * contiguous chunk (GROUPTOP) of [lo, hi) */
      int v = lv - 1;
      if (!k->group_top)
        sb_printf(&body, "for (long ridx%d = %s + lidx0; ridx%d < %s; ridx%d += %dL) {\n", v, lo, v, hi, v, k->group);
      else
        sb_printf(&body, "for (long ch%d_ = ((%s) - (%s) + %dL) / %dL, ridx%d = %s + lidx0 * ch%d_; ridx%d < %s((long)(%s), (%s) + (lidx0 + 1) * ch%d_); ridx%d++) {\n",
                  v, hi, lo, k->group - 1, k->group, v, lo, v, v, L->lmin, hi, lo, v, v);
    } else if (gpu && lv <= k->ng) {
      /* a global loop of a GPU kernel is a work-item id (or a part of one: see gpu_global_dims) */
      const GDim *g = &gd[lv - 1];
      /* (CUDA: dimensions 1 and 2 stride over the grid, see the kernel's signature below) */
      static const char *const strided[3] = {NULL, "tg_gid1", "tg_gid2"};
      sb_printf(&body, "{ long ridx%d = (long)%s", lv - 1, cuda && g->dim > 0 && gsz[g->dim] > 1 ? strided[g->dim] : L->gid[g->dim]);
      if (g->div > 1) sb_printf(&body, " / %lldL", (long long)g->div);
      if (g->mod) sb_printf(&body, " %% %lldL", (long long)g->mod);
      sb_puts(&body, ";");
      /* a loop of variable length is launched at its largest extent: the work-items past the
       * variable's end do nothing (a block, not a return: CUDA's strided ids loop around it) */
      if (rg->nsrc) sb_printf(&body, " if (ridx%d < %s) {", lv - 1, hi);
      sb_puts(&body, "\n");
    } else if (lv == 1 && k->ng > 0 && rg->nsrc) {
      /* the threads split the loop's largest extent; those past the variable's end do nothing */
      sb_printf(&body, "for (long long ridx0 = gstart; ridx0 < gend && ridx0 < %s; ridx0++) {\n", hi);
    } else if (lv == 1 && k->ng > 0) sb_printf(&body, "for (long long ridx0 = gstart; ridx0 < gend; ridx0++) {\n");
    else sb_printf(&body, "for (%s ridx%d = %s; ridx%d < %s; ridx%d++) {\n", L->i64, lv - 1, lo, lv - 1, hi, lv - 1);
    r.indent++;
    emit_level(&r, &l, lv, false);
    if (lv == nloops && k->tc) emit_tc(&r, k, cuda);
    else if (lv == nloops && k->rbody) {
      for (int c = 0; c < k->ncopy; c++) {
        const char *v = nm(&r, k->rbodies[c]);
        bool vv = isvec(&r, k->rbodies[c]);
        const char *rd = tg_dtype_is_float(k->racc) && !vv ? rnd_arith(k->racc) : "";
        ind(&r);
        const char *an = blk.level ? "part" : "acc";
        /* OpenCL C fuses a*b+c only within one expression, and the product is a statement of its
         * own: a float32 sum of products accumulates through fma() (the C renderer's compiler
         * contracts across statements, -ffp-contract=fast; PoCL did not, and its register tiles
         * ran separate multiplies and adds). The product's own statement is then dead code. */
        UOp *m = k->rbodies[c];
        if (lang == LANG_OPENCL && k->rop == OP_ADD && k->racc == TG_FLOAT32 && m->op == OP_MUL && m->nsrc == 2 &&
            m->dtype == TG_FLOAT32 && m->src[0]->dtype == TG_FLOAT32 && m->src[1]->dtype == TG_FLOAT32 && nm(&r, m->src[0]) &&
            nm(&r, m->src[1])) {
          sb_printf(&body, "%s%d = fma(", an, c);
          for (int i = 0; i < 2; i++) {
            if (vv) vopnd(&r, m->src[i], false, &body); /* a scalar operand broadcast, as in the product */
            else sb_puts(&body, nm(&r, m->src[i]));
            sb_puts(&body, ", ");
          }
          sb_printf(&body, "%s%d);\n", an, c);
        } else if (k->rop == OP_ADD) sb_printf(&body, "%s%d = %s(%s%d + %s);\n", an, c, rd, an, c, v);
        else if (k->rop == OP_MUL) sb_printf(&body, "acc%d = %s(acc%d * %s);\n", c, rd, c, v);
        else if (vv) sb_printf(&body, "acc%d = tg_vmax(%s, acc%d);\n", c, v, c);
        else if (tg_dtype_is_float(k->racc)) sb_printf(&body, "acc%d = (%s > acc%d || %s != %s) ? %s : acc%d;\n", c, v, c, v, v, v, c);
        else sb_printf(&body, "acc%d = %s > acc%d ? %s : acc%d;\n", c, v, c, v, c);
      }
    }
    if (lv == nloops) {
      for (int cl = nloops; cl >= 1; cl--) {
        if (cl == k->ng) emit_post_and_store(&r, &l, k, k->ng);
        if (cl == blk.level) {
          r.indent--;
          ind(&r);
          sb_puts(&body, "}\n");
          for (int c = 0; c < k->ncopy; c++) {
            ind(&r);
            sb_printf(&body, "acc%d = %s(acc%d + part%d);\n", c, isvec(&r, k->rbodies[c]) ? "" : rnd_arith(k->racc), c, c);
          }
        }
        r.indent--;
        ind(&r);
        /* (and the guard of a GPU global loop of variable length) */
        sb_puts(&body, gpu && cl <= k->ng && k->granges[cl - 1]->nsrc ? "}}\n" : "}\n");
      }
    }
  }
  if (nloops == 0 || k->ng == 0) {
    emit_post_and_store(&r, &l, k, 0);
    r.indent--;
    ind(&r);
    sb_puts(&body, "}\n");
  }

  /* Every helper is guarded and width-specific names are aliased with #define around the kernel,
   * so several kernels can share one translation unit (batched compilation). */
  static const char *const vnames[] = {"tg_vf", "tg_vfu", "tg_vm", "tg_vsel", "tg_vmax", "tg_vany", "tg_vrotb1", "tg_vrotb2", "tg_vrotb3", "tg_hadd", "tg_hmax",
                                       "tg_v_exp2f", "tg_v_log2f", "tg_v_sinf", "tg_v_sqrtf", "tg_v_truncf", "tg_vd", "tg_vl",
                                       "tg_vhw", "tg_vhs", "tg_vselu", "tg_vh2f", "tg_vf2h", "tg_vb2f", "tg_vf2b", "tg_vrh",
                                       "tg_vrb", "tg_vlh", "tg_vlb", "tg_vsh", "tg_vsb", "tg_vhx", "tg_vshr", "tg_vrhx",
                                       "tg_vhxu", "tg_vlhq"};
  if (gpu && !cuda && (r.uses_f64 || r.uses_fp8)) sb_puts(&out, "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n");
  bool images = false;
  for (int i = 0; gpu && i < k->np; i++) images = images || k->pimg[i];
  if (images) sb_printf(&out, "#ifndef TG_IMAGE_H\n#define TG_IMAGE_H\n%s#endif\n", PRELUDE_IMAGE_CL);
  if (r.uses_half) sb_printf(&out, "#ifndef TG_HALF_H\n#define TG_HALF_H\n%s#endif\n", cuda ? PRELUDE_HALF_CUDA : gpu ? PRELUDE_HALF_CL : PRELUDE_HALF);
  if (r.uses_bf16) sb_printf(&out, "#ifndef TG_BF16_H\n#define TG_BF16_H\n%s#endif\n", cuda ? PRELUDE_BF16_CUDA : gpu ? PRELUDE_BF16_CL : PRELUDE_BF16);
  if (r.uses_fp8) /* (codegen refuses fp8 on CUDA, and on OpenCL devices without float64) */
    sb_printf(&out, "#ifndef TG_FP8_H\n#define TG_FP8_H\n%s#endif\n", gpu && !cuda ? PRELUDE_FP8_CL : PRELUDE_FP8);
  if (strstr(body.s ? body.s : "", "tg_ipow"))
    sb_printf(&out, "#ifndef TG_IPOW_H\n#define TG_IPOW_H\n%s %s tg_ipow(%s b,%s e){%s r=1;if(e<0)return b==1?1:(b==-1?((e&1)?-1:1):0);"
                    "while(e){if(e&1)r*=b;b*=b;e>>=1;}return r;}\n#endif\n", L->fn, L->i64, L->i64, L->i64, L->i64);
  if (strstr(body.s ? body.s : "", " TG_PIN")) sb_printf(&out, "#ifndef TG_PIN_H\n#define TG_PIN_H\n%s#endif\n", PRELUDE_PIN);
  if (strstr(body.s ? body.s : "", "TG_SHUF(")) sb_printf(&out, "#ifndef TG_SHUF_H\n#define TG_SHUF_H\n%s#endif\n", PRELUDE_SHUF);
  int W = r.vw;
  if (W) {
    for (size_t i = 0; i < sizeof vnames / sizeof *vnames; i++) sb_printf(&out, "#define %s %s%d\n", vnames[i], vnames[i], W);
    for (int dt = TG_INT8; dt <= TG_UINT32; dt++) sb_printf(&out, "#define tg_v%d tg_v%d_%d\n#define tg_v%du tg_v%du_%d\n", dt, dt, W, dt, dt, W);
    sb_printf(&out, "#ifndef TG_VEC%d_H\n#define TG_VEC%d_H\n", W, W);
    if (L->ext_vec) sb_printf(&out, PRELUDE_VEC_CL, W, W, W);
    else sb_printf(&out, PRELUDE_VEC, W * 4, W * 4, W * 4);
    sb_puts(&out, "#endif\n");
    const char *bs = body.s ? body.s : "";
    if (!L->ext_vec && (strstr(bs, "tg_vrh(") || strstr(bs, "tg_vrhx(") || strstr(bs, "tg_vrb(") || strstr(bs, "tg_vlh(") || strstr(bs, "tg_vlhq(") || strstr(bs, "tg_vlb(") ||
                        strstr(bs, "tg_vh2f(") || strstr(bs, "tg_vb2f(") || strstr(bs, "tg_vsh(") || strstr(bs, "tg_vsb(") || strstr(bs, "tg_vshr("))) {
      sb_printf(&out, "#ifndef TG_VHALF%d_H\n#define TG_VHALF%d_H\n", W, W);
      sb_printf(&out, PRELUDE_VHALF, W * 4, W * 2);
      if (W == 16)
        sb_printf(&out, PRELUDE_VRH_HW, "defined(__AVX512F__)", 32, 32,
                  "return __builtin_ia32_vcvtph2ps512_mask(__builtin_ia32_vcvtps2ph512_mask(f, 0, (tg_vhx){0}, -1), (tg_vf){0}, -1, 4);",
                  "__builtin_ia32_vcvtps2ph512_mask(v, 0, (tg_vhx){0}, -1)",
                  "__builtin_ia32_vcvtph2ps512_mask((tg_vhx)*(const tg_vhxu *)p, (tg_vf){0}, -1, 4)");
      else if (W == 8)
        sb_printf(&out, PRELUDE_VRH_HW, "defined(__F16C__)", 16, 16, "return __builtin_ia32_vcvtph2ps256(__builtin_ia32_vcvtps2ph256(f, 0));",
                  "__builtin_ia32_vcvtps2ph256(v, 0)", "__builtin_ia32_vcvtph2ps256((tg_vhx)*(const tg_vhxu *)p)");
      else
        sb_printf(&out, PRELUDE_VRH_HW, "0", 16, 16, "return f;", "(tg_vhx){0}", "(tg_vf){0}");
      sb_puts(&out, "#endif\n");
    }
    for (int dt = TG_INT8; dt <= TG_UINT32; dt++) {
      char key[32];
      snprintf(key, sizeof key, "tg_v%d", dt);
      if (dt == TG_INT64 || !uses_name(body.s, key)) continue;
      int bytes = W * (int)tg_dtype_itemsize((tg_dtype)dt);
      sb_printf(&out, "#ifndef TG_V%d_%d_H\n#define TG_V%d_%d_H\n", dt, W, dt, W);
      const char *va = L->ext_vec ? "ext_vector_type" : "vector_size";
      int vn = L->ext_vec ? W : bytes;
      sb_printf(&out, "typedef %s tg_v%d __attribute__((%s(%d)));\n", ctype((tg_dtype)dt), dt, va, vn);
      sb_printf(&out, "typedef %s tg_v%du __attribute__((%s(%d), aligned(1)));\n#endif\n", ctype((tg_dtype)dt), dt, va, vn);
    }
    for (int kb = 1; kb <= 3 && L == &LANG_TABLE[LANG_C]; kb++) {
      char key[32];
      snprintf(key, sizeof key, "tg_vrotb%d(", kb);
      if (!strstr(bs, key)) continue;
      /* the byte shuffle of a rotation left by kb bytes (little-endian lanes), else the shifts */
      int U = (int)TG_UINT32;
      sb_printf(&out, "#ifndef TG_VROTB%d_%d_H\n#define TG_VROTB%d_%d_H\nstatic inline tg_v%d tg_vrotb%d(tg_v%d x){\n", kb, W, kb, W, U, kb, U);
      sb_puts(&out, "#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__\n");
      sb_printf(&out, "  typedef unsigned char tg_vb_ __attribute__((vector_size(%d)));\n#if defined(__clang__)\n", 4 * W);
      sb_printf(&out, "  return (tg_v%d)__builtin_shufflevector((tg_vb_)x, (tg_vb_)x", U);
      for (int i = 0; i < 4 * W; i++) sb_printf(&out, ", %d", (i & ~3) + ((i - kb) & 3));
      sb_printf(&out, ");\n#else\n  return (tg_v%d)__builtin_shuffle((tg_vb_)x, (tg_vb_){", U);
      for (int i = 0; i < 4 * W; i++) sb_printf(&out, "%s%d", i ? ", " : "", (i & ~3) + ((i - kb) & 3));
      sb_printf(&out, "});\n#endif\n#else\n  return (x << %d) | (x >> %d);\n#endif\n}\n#endif\n", 8 * kb, 32 - 8 * kb);
    }
    if (k->rvw) {
      /* the lanes' maximum by halving, in vector registers: a scan over the lanes branched on each
       * compare, mispredicted on random data (a max over chunks of 8, one scan an output, ran at 15
       * cycles an element) */
      /* the lanes' sum in lane order (the scalar code's order), written out: as a loop gcc kept it
       * a loop through the stack, 16 dependent adds per accumulator after the reduce loop, and a
       * 4x4 tile's sixteen of them took longer than its 24-step reduce loop (BERT's linears) */
      sb_printf(&out, "#ifndef TG_HRED%d_H\n#define TG_HRED%d_H\nstatic inline float tg_hadd(tg_vf v){float s=0;", W, W);
      for (int i = 0; i < W; i++) sb_printf(&out, "s+=v[%d];", i);
      sb_puts(&out, "return s;}\nstatic inline float tg_hmax(tg_vf v){\n");
      for (int half = W / 2; half >= 1; half /= 2) {
        SB ix;
        sb_init(&ix);
        for (int i = 0; i < W; i++) sb_printf(&ix, "%s%d", i ? ", " : "", i ^ half);
        sb_printf(&out, "#if defined(__clang__)\n  v = tg_vmax(v, __builtin_shufflevector(v, v, %s));\n#else\n"
                        "  v = tg_vmax(v, __builtin_shuffle(v, (tg_vm){%s}));\n#endif\n", ix.s, ix.s);
        sb_free(&ix);
      }
      sb_puts(&out, "  return v[0];\n}\n#endif\n");
    }
    if (!L->ext_vec && (strstr(bs, "tg_v_exp2f(") || strstr(bs, "tg_v_log2f(") || strstr(bs, "tg_v_sinf("))) {
      /* whether any lane of a mask is set: the transcendentals' test for their rare slow path */
      sb_printf(&out, "#ifndef TG_VANY%d_H\n#define TG_VANY%d_H\nstatic inline int tg_vany(tg_vm m){\n", W, W);
      if (W == 8) sb_puts(&out, "#if defined(__AVX__)\n  return __builtin_ia32_movmskps256((tg_vf)m);\n#else\n");
      else if (W == 4) sb_puts(&out, "#if defined(__SSE__)\n  return __builtin_ia32_movmskps((tg_vf)m);\n#else\n");
      /* AVX-512: one compare into a mask register (gcc left the lane loop a store and 16 scalar
       * ORs, which made log2 2.4x slower than exp2) */
      else if (W == 16) sb_puts(&out, "#if defined(__AVX512F__)\n  return __builtin_ia32_cmpd512_mask(m, (tg_vm){0}, 4, (unsigned short)-1) != 0;\n#else\n");
      else sb_puts(&out, "#if 0\n#else\n");
      sb_printf(&out, "  int a = 0;\n  for (int l = 0; l < %d; l++) a |= m[l];\n  return a;\n#endif\n}\n#endif\n", W);
    }
    static const char *const fs[] = {"exp2f", "log2f", "sinf", "sqrtf", "truncf"};
    for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) {
      char key[32];
      snprintf(key, sizeof key, "tg_v_%s(", fs[i]);
      if (!body.s || !strstr(body.s, key)) continue;
      sb_printf(&out, "#ifndef TG_V_%s_%d_H\n#define TG_V_%s_%d_H\n", fs[i], W, fs[i], W);
      if (L->ext_vec) {
        /* OpenCL C's own functions take vectors (and are what its scalar code calls) */
        static const char *const clf[] = {"exp2", "log2", "sin", "sqrt", "trunc"};
        if (i == 2 && W > 1)
          /* PoCL's vector sin gives lanes below about 2^-7 the sine of a rescaled value (sin(1e-3)
           * = 0.008) when another lane of the vector needs its large-argument reduction (1e10; 9000
           * does not): such vectors, and NaN ones, go lane by lane, as the C renderer's do */
          sb_printf(&out, "static inline tg_vf tg_v_sinf(tg_vf x){\n  if (any((fabs(x) > 8192.0f) | isnan(x))) {\n"
                          "    tg_vf r;\n    for (int l = 0; l < %d; l++) r[l] = sin(x[l]);\n    return r;\n  }\n"
                          "  return sin(x);\n}\n", W);
        else
          sb_printf(&out, "static inline tg_vf tg_v_%s(tg_vf x){return %s(x);}\n", fs[i], clf[i]);
      } else if (i < 3) {
        sb_puts(&out, i == 0 ? PRELUDE_V_EXP2 : i == 1 ? PRELUDE_V_LOG2 : PRELUDE_V_SIN);
        if (i == 0) {
          /* the scalef builtin of this width and the feature macro that provides it */
          if (W == 16) sb_printf(&out, "#if defined(__AVX512F__)\n" PRELUDE_V_EXP2_SCALE, "__builtin_ia32_scalefps512_mask", "unsigned short", ", 4");
          else if (W == 8 || W == 4)
            sb_printf(&out, "#if defined(__AVX512VL__)\n" PRELUDE_V_EXP2_SCALE, W == 8 ? "__builtin_ia32_scalefps256_mask" : "__builtin_ia32_scalefps128_mask", "unsigned char", "");
          else sb_puts(&out, "#if 0\n#else\n");
          sb_puts(&out, PRELUDE_V_EXP2_TAIL);
        }
      } else {
        /* one call per lane, written out: the compiler's straight-line (SLP) vectorizer turns
         * sqrtf and truncf into one vector instruction without the loop vectorizer, which is off
         * for gcc (ops_cpu.c) */
        sb_printf(&out, "static inline tg_vf tg_v_%s(tg_vf x){return (tg_vf){", fs[i]);
        for (int l = 0; l < W; l++) sb_printf(&out, "%s__builtin_%s(x[%d])", l ? "," : "", fs[i], l);
        sb_puts(&out, "};}\n");
      }
      sb_puts(&out, "#endif\n");
    }
  }
  if (gpu) {
    if (cuda && strstr(body.s ? body.s : "", "tg_bc<"))
      sb_printf(&out, "#ifndef TG_BC_H\n#define TG_BC_H\ntemplate <class D, class S> %s D tg_bc(S s){D d;memcpy(&d,&s,sizeof d);return d;}\n#endif\n", L->fn);
    if (cuda && strstr(body.s ? body.s : "", "tg_lmin("))
      sb_printf(&out, "#ifndef TG_LMIN_H\n#define TG_LMIN_H\n%s long tg_lmin(long a,long b){return a<b?a:b;}\n#endif\n", L->fn);
    /* OpenCL C vectors wider than 32 bytes: a compiler targeting x86 with a preference for 256-bit
     * vectors (PoCL's skylake-avx512 target) splits every 16-lane operation in two unless the
     * kernel asks for 512-bit ones, and a register tile of split vectors spills (beautiful_mnist's
     * convolutions on PoCL ran 1.3-1.6x the CPU device's time). Compilers without the attribute
     * (GPU drivers) see nothing. */
    int lanes = k->vw > k->rvw ? k->vw : k->rvw;
    bool wide = lang == LANG_OPENCL && lanes * 4 > 32;
    if (wide)
      sb_puts(&out, "#if defined(__has_attribute) && !defined(TG_MINVW)\n#if __has_attribute(min_vector_width)\n"
                    "#define TG_MINVW __attribute__((min_vector_width(512)))\n#endif\n#endif\n#ifndef TG_MINVW\n#define TG_MINVW\n#endif\n");
    sb_printf(&out, "%s%s void %s(", L->kern, wide ? " TG_MINVW" : "", name);
    for (int i = 0; i < k->np; i++) {
      if (k->pimg[i]) sb_printf(&out, "%s%s image2d_t data%d", i ? ", " : "", i ? "read_only" : "write_only", i);
      else sb_printf(&out, "%s%s%s%s *%s data%d", i ? ", " : "", L->gptr, i ? "const " : "", stype(k->pdt[i]), L->restr, i);
    }
    /* a symbolic kernel's variables, by value after the buffers (the runtime's nvals) */
    for (int i = 0; i < k->nvars; i++) sb_printf(&out, "%sconst long %s", k->np + i ? ", " : "", nm(&r, k->vars[i]));
    sb_puts(&out, ") {\n");
    /* CUDA grids have at most 65535 blocks along y and z, fewer than a launch may need: the ids of
     * dimensions 1 and 2 stride over the grid, so the runtime may launch fewer blocks there and each
     * block then takes several. Every work-item of a block makes the same number of steps (the
     * block divides the launch), so a barrier inside stays uniform. */
    for (int d = 2; cuda && d >= 1; d--)
      if (gsz[d] > 1) {
        /* a tensor-core kernel's blocks are one warp(group) along x alone: its ids along y and z are
         * the block's, which ptxas then sees are uniform (threadIdx.y in them made it serialize a
         * warpgroup's consecutive wgmmas as if in a divergent path) */
        if (k->tc)
          sb_printf(&out, "  for (long tg_gid%d = (long)blockIdx.%c; tg_gid%d < %lldL; tg_gid%d += (long)gridDim.%c)\n", d, "xyz"[d], d,
                    (long long)gsz[d], d, "xyz"[d]);
        else
          sb_printf(&out, "  for (long tg_gid%d = %s; tg_gid%d < %lldL; tg_gid%d += (long)gridDim.%c * (long)blockDim.%c)\n", d, L->gid[d],
                    d, (long long)gsz[d], d, "xyz"[d], "xyz"[d]);
      }
    if (cuda && (gsz[1] > 1 || gsz[2] > 1)) sb_puts(&out, "  {\n");
  } else {
    sb_printf(&out, "void %s(void **restrict bufs, long long gstart, long long gend) {\n", name);
  }
  sb_puts(&out, body.s ? body.s : "");
  if (cuda && (gsz[1] > 1 || gsz[2] > 1)) sb_puts(&out, "  }\n");
  sb_puts(&out, "}\n");
  if (W) {
    for (size_t i = 0; i < sizeof vnames / sizeof *vnames; i++) sb_printf(&out, "#undef %s\n", vnames[i]);
    for (int dt = TG_INT8; dt <= TG_UINT32; dt++) sb_printf(&out, "#undef tg_v%d\n#undef tg_v%du\n", dt, dt);
  }
  sb_free(&body);
  for (size_t i = 0; i < r.names.cap; i++)
    if (r.names.keys[i]) free(r.names.vals[i]);
  pm_free(&r.names);
  pm_free(&r.vec);
  pm_free(&r.bits);
  pm_free(&r.storeonly);
  pm_free(&l.level);
  pm_free(&l.post);
  pm_free(&l.seen);
  pm_free(&l.nuse);
  pv_free(&l.order);
  return sb_take(&out);
}
