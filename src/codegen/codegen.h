/*
 * codegen.h -- from a kernel AST (SINK of one STORE) to a linear kernel description and source code.
 *
 * LKernel is the lowered form the renderers consume: the loop nest (global loops, then the reduce
 * loops of the kernel's single REDUCE), and three expressions over the loop variables: the reduce
 * body, the value stored (with the reduction's result standing in as a placeholder), and the store
 * index.
 */
#ifndef TG_CODEGEN_H
#define TG_CODEGEN_H

#include "../runtime/device.h"
#include "../uop/ptrmap.h"
#include "../uop/uop.h"

/* One optimization action, tinygrad's Opt(op, axis, arg). Every kernel's optimizations are a list of
 * them, applied in order -- the hand-coded heuristics' choice and BEAM's candidates alike, on the
 * CPU and on GPU devices (opt.c, apply_opts):
 *   UPCAST(g, f)   global axis g computes f outputs per loop iteration or work-item (register tile:
 *                  one copy of the body per position). While nothing is a vector yet, an UPCAST
 *                  by 4, 8 or 16 of an axis the output is contiguous along becomes f vector lanes
 *                  instead (a reduction on the CPU may gather a strided operand for it)
 *   UNROLL(r, f)   reduce axis r runs f steps per loop turn; while nothing is a vector yet, an UNROLL
 *                  by 4, 8 or 16 of an axis the loads run along becomes vector accumulators summed
 *                  across lanes at the end (CPU and CPU-core OpenCL devices)
 *   PADTO(g, f)    global axis g of a reduction runs to the next multiple of f, so that a later
 *                  UPCAST(g, f) applies; the positions past its end recompute its last element
 *   SWAP(g, h)     exchanges global axes g and h (loop order; on GPUs, which is dimension 0)
 *   THREAD(0, n)   (CPU) the launch splits the outermost loop over n threads (default: all)
 *   LOCAL(g, n)    (GPU) global axis g runs in work-groups of n along its dimension
 *   GROUP(r, n)    (GPU) n work-items of a work-group share reduce axis r (strided); their partial
 *                  results meet in local memory after a barrier and work-item 0 combines them
 *   GROUPTOP(r, n) (GPU) the same with contiguous chunks of the axis per work-item
 *   NOLOCALS       (GPU) no work-groups of our choosing (the driver picks)
 *   TC(i, 0)       (GPU, first in its list) tensor cores: a matmul-like reduction becomes warp tiles
 *                  of one warp-level matrix instruction (tc.c); i picks among the ways the kernel
 *                  matches (tc_match). After it only UPCASTs of its row and column axes apply (more
 *                  tiles per warp)
 * Axis numbers index the lowered, merged kernel's loops. A list that does not fit the kernel or
 * the device does not apply. */
typedef enum { OPT_UPCAST, OPT_UNROLL, OPT_LOCAL, OPT_GROUP, OPT_GROUPTOP, OPT_PADTO, OPT_SWAP, OPT_NOLOCALS, OPT_THREAD, OPT_TC, OPT_NOPS } OptOp;
typedef struct {
  int op, axis, arg;
} Opt;
#define OPTLIST_MAX 16
typedef struct {
  Opt o[OPTLIST_MAX];
  int n;
} OptList;
/* "LOCAL:0:16,GROUP:0:32" <-> list; parse rejects unknown names, bad numbers and more than
 * OPTLIST_MAX actions. */
bool optlist_parse(const char *s, OptList *out);
void optlist_format(const OptList *l, char *buf, size_t n);
const char *opt_name(int op);

/* Tensor cores (tc.c). A warp-level matrix instruction D = A x B + C on an m x k tile A, a k x n
 * tile B and an m x n float32 accumulator tile, each spread over the 32 lanes of a warp: lane L
 * holds elements 0..na-1 of A, 0..nb-1 of B and 0..nc-1 of C. Where each element sits in its tile
 * is data (NVIDIA's PTX ISA, "Matrix Fragments for mma.m16n8k16" / "mma.m16n8k8"): with
 * g = L / 4 and t = L % 4, element e is at row rg*g + rt*t + r0, column cg*g + ct*t + c0. */
typedef struct {
  int8_t rg, rt, r0, cg, ct, c0;
} TcPos;
typedef struct {
  const char *name;      /* "m16n8k16.f16" (DEBUG=3) */
  tg_dtype in;           /* the inputs' dtype (float32: the instruction reads them as tf32) */
  int m, n, k;
  int na, nb, nc;        /* elements per lane of A, B, C */
  int per_reg;           /* A and B elements per 32-bit register (2 for 16-bit inputs, 1 for tf32) */
  const char *ptx;       /* the instruction (a warpgroup's: "%d" is the column count of all its tiles) */
  const TcPos *a, *b, *c;
  /* A warpgroup instruction (sm_90's wgmma): 128 lanes, four warps; warp w = L / 32 holds rows
   * 16 w on of A and C, at the table's positions with g = (L % 32) / 4. B is not in registers: the
   * work-group stages the k x (n * tiles) block in shared memory, element L + 128 j of it row-major
   * by lane L (nb = 1 per lane and tile), in the instruction's K-major layout without swizzling,
   * which a 64-bit descriptor names (tc_smem_b). One instruction per 64 rows covers every column
   * tile (N = n * tiles, at most 256). */
  bool wg;
} TensorCore;
/* a tensor core's lanes: a warp's 32, a warpgroup's 128 */
#define TC_LANES(tc) ((tc)->wg ? 128 : 32)
/* (warpgroup) B element (row kk, column c) of the block in shared memory: its element offset, for
 * elements of esize bytes. The PTX ISA's canonical K-major layout without swizzling,
 * ((8, m), (T, 2k)) : ((T, SBO), (1, LBO)) with T = 16 / esize: a core matrix is 8 columns of
 * 16 contiguous bytes of k; LBO steps to the next 16 bytes of k (128 B), SBO to the next 8
 * columns (256 B: the two core matrices of a k step of 2T lie between). */
#define TC_WG_LBO 128
#define TC_WG_SBO 256
static inline int64_t tc_smem_b(int64_t kk, int64_t c, int esize) {
  int64_t T = 16 / esize;
  return c % 8 * T + c / 8 * (TC_WG_SBO / esize) + kk % T + kk / T * (TC_WG_LBO / esize);
}
/* Every tensor core codegen knows (n of them). */
const TensorCore *tc_table(int *n);
/* Where lane `lane`'s element at p sits in its tile (for a warpgroup's A and C: with its warp's rows). */
void tc_pos(const TensorCore *tc, const TcPos *p, int lane, int *row, int *col);


typedef struct {
  UOp **granges; /* global loop RANGE nodes, outermost first (owned refs) */
  int ng;
  UOp **rranges; /* reduce loop RANGE nodes, outermost first (owned refs) */
  int nr;
  UOp *rbody;    /* value accumulated by the reduction, NULL if none (owned) */
  int rop;       /* OP_ADD / OP_MUL / OP_MAX */
  tg_dtype racc; /* accumulator dtype */
  UOp *rplace;   /* placeholder node for the reduction result inside `value` (owned) */
  UOp *value;    /* stored value (owned) */
  UOp *sidx;     /* store index (owned) */
  int sop;       /* 0, or OP_MAX: a window maximum over the kernel's reduction -- its loops are
                  * global loops, and each value max-combines into the output except the first of
                  * its window (sfirst true), which stores */
  UOp *sfirst;   /* (sop) the window position is the first (owned) */
  UOp *wranges[4]; /* (sop, GPU) the window's loops, taken out of the global loops: every position
                    * runs in the same work-item, as copies that combine in order (owned) */
  int nwr;
  tg_dtype *pdt; /* dtype of each param buffer; param 0 is the output */
  int np;
  int64_t *pimg; /* per param: texels per row of the 2-D image holding it, 0 for a plain buffer (IMAGE) */
  bool img_bad;  /* an image output whose store is not 4 consecutive floats along one global axis */
  /* after optimization (what renderers consume): upcast copies of the expressions above, one per
   * unrolled position of the upcast axes (copy 0 alone when nothing is upcast) */
  int ncopy;
  UOp **values, **sidxs, **rbodies, **rplaces; /* owned; rbodies/rplaces entries NULL without reduce */
  UOp **sfirsts; /* (sop) sfirst per copy (owned) */
  int vw;        /* vector width: loads/stores marked with arg.i == vw move vw contiguous lanes */
  int rvw;       /* vector width along a reduce axis: the accumulators are vectors, summed across
                  * lanes when the reduction ends (0 = none; exclusive with vw) */
  UOp **rlo, **rhi; /* NULL, or per reduce loop its bounds over the enclosing loops' variables: the
                     * loop runs rlo <= ridx < rhi (bounds.c; owned; NULL entries: 0..size) */
  char opts[160];/* the applied optimizations as text, for DEBUG=3 and VIZ */
  OptList applied; /* the optimizations applied (the heuristics' choice when none was forced) */
  bool opts_failed; /* a forced Opt list could not be applied (BEAM drops such candidates) */
  bool gpu;        /* GPU kernel model: global loops are work-item ids, no vector types */
  int threads;     /* THREAD: the CPU threads the launch may use (0: all) */
  /* GPU: what the applied Opt list chose */
  int nlocal;      /* LOCAL actions: local_axis[i] (a global axis) runs in groups of local_arg[i] */
  int local_axis[3];
  int64_t local_arg[3];
  int group;       /* GROUP/GROUPTOP: work-items sharing reduce axis group_axis (0 = none) */
  int group_axis;
  bool group_top;
  bool nolocals;
  int64_t lsize[3]; /* the work-group size per dimension (after gpu_launch) */
  bool sym;         /* some loop runs to a variable's expression (RANGE with a source): no optimizations */
  UOp **vars;       /* the kernel's DEFINE_VAR nodes in argument order (by name, min, max; owned) */
  int nvars;
  /* TC: the tensor core the kernel's product runs on (NULL: none), and how */
  const TensorCore *tc;
  int tc_gm, tc_gn, tc_kr; /* its axes: rows of A and of the output, columns of B and of the output, the sum */
  int tc_um, tc_un;        /* tiles per warp along rows and columns (UPCASTs after TC) */
  int tc_lane;             /* the lane axis: a global loop of 32 (128), one warp (warpgroup) per work-group */
  bool tc_pad;             /* TC(i, 2): axes the tiles do not divide are padded */
  UOp *tc_opa, *tc_opb;    /* (until the copies) the product's operands that feed A and B (owned) */
  UOp **tc_frag;           /* A's na elements per tile row, then B's nb per tile column (owned); copy
                            * (im * tc_un + in) * nc + e is accumulator element e of tile (im, in) */
  int nfrag;
  const DeviceCaps *caps; /* (while lowering) the device's limits */
  const OptList *force;   /* (while lowering) the Opt list to apply; NULL: the heuristics */
} LKernel;

/* GPU kernels: where the index of global loop g comes from -- (get_global_id(dim) / div) % mod
 * (mod 0: no modulo). The innermost loop is dimension 0 (neighbouring work-items touch neighbouring
 * elements), the next dimension 1, and every loop further out shares dimension 2. */
typedef struct {
  int dim;
  int64_t div, mod;
} GDim;
/* Fills dims[g] for each global loop (k->ng <= 64) and the launch's global size. With GROUP,
 * dimension 0 holds the group's work-items and the loops start at dimension 1. */
void gpu_global_dims(const LKernel *k, GDim *dims, int64_t global_size[3]);
/* Applies an Opt list to a lowered kernel (opts_failed when it does not fit), the same on every
 * device; gpu_heuristic chooses one for a GPU device. */
void apply_opts(LKernel *k, const OptList *l, const DeviceCaps *caps, int *next_axis);
void gpu_heuristic(LKernel *k, const DeviceCaps *caps, int *next_axis);
/* TC (tc.c). tc_match: how many ways the lowered, not yet optimized kernel k runs on a tensor core
 * of the device as it is (0: none -- not matmul-like, a shape the tiles do not divide, a dtype
 * without one, float32 without ALLOW_TF32, a device without them). tc_apply: TC(i, arg), arg 0 (the
 * tiles divide the axes) or 2 (axes padded); false: does not fit. tc_apply_heuristic: the
 * heuristics' choice, padding only where it is cheap. tc_upcast: UPCAST(g, f) after it.
 * tc_make_copies: the fragments and the copies, where make_copies would make them. */
int tc_match(const LKernel *k, const DeviceCaps *caps);
bool tc_apply(LKernel *k, int i, int arg, const DeviceCaps *caps, int *next_axis);
bool tc_apply_heuristic(LKernel *k, const DeviceCaps *caps, int *next_axis, int *i, int *arg);
bool tc_upcast(LKernel *k, int g, int f);
void tc_make_copies(LKernel *k, int *next_axis);

typedef struct {
  char name[64];
  char *src;             /* malloc'd source text */
  int64_t global_size[3];
  int64_t local_size[3]; /* local_size[0] = thread count hint for CPU (1 = single thread, 0 = all) */
  uint64_t ops;          /* estimated FLOPs per launch */
  int nparams;
  int nvars;             /* variables the kernel takes after its buffers (bufs[nparams + i]) */
  int *vars;             /* their variable indices (malloc'd) */
  OptList applied;       /* the optimizations applied (the heuristics' choice when none was given) */
  char opts[160];        /* the applied optimizations as DEBUG=3 prints them (VIZ shows them) */
} KernelCode;

/* Lowers and renders `ast` for the C renderer. Returns NULL with an error recorded on failure. */
KernelCode *codegen_c(UOp *ast);
/* Lowers and renders `ast` for a device of the given capabilities (NULL = the CPU's: C, loops),
 * with the given Opt list (NULL = the hand-coded heuristics, or on a GPU device the GPU_OPTS
 * setting when set). Returns NULL when a given list does not fit the kernel or the device (no
 * error recorded; for GPU_OPTS, which the user chose, an error naming it), or when the device
 * cannot run the kernel (error recorded: float64 without cl_khr_fp64). */
KernelCode *codegen_for(UOp *ast, const DeviceCaps *caps, const OptList *opts);
void kernel_code_free(KernelCode *k);

/* Lowering (shared by every renderer): builds the LKernel of an AST, with adjacent loops merged
 * wherever that removes index arithmetic (contiguous access becomes a single running index). */
LKernel *lower_kernel(UOp *ast, const OptList *opts);
LKernel *lower_kernel_for(UOp *ast, const DeviceCaps *caps, const OptList *opts);
void lkernel_free(LKernel *k);

/* After optimization: bounds reduce loops by the validity conditions that zero every term outside
 * them (bounds.c). */
void bound_reduce_loops(LKernel *k);

/* The coefficient of loop variable r in the affine index u, or INT64_MIN when u is not affine in r. */
int64_t index_coef(UOp *u, UOp *r);
/* IMAGE: an image output is stored a texel at a time, so one work-item computes the 4 consecutive
 * floats of a texel: its innermost global axis (the store moves by 1 along it) is upcast by 4 (or a
 * multiple) and comes first among the upcasts, so copies 4t..4t+3 are texel t's lanes. Called by
 * apply_opts before the copies are made; sets k->img_bad when the store does not allow it. */
typedef struct {
  int axis, factor;
} ImgUpcast;
void image_lane_upcast(LKernel *k, UOp *lane, ImgUpcast *ups, int *nup, int cap);
/* DEBUG=5 and 6 (describe.c): the AST one node per line (id, op, dtype, the loop sizes it varies
 * over, argument, source ids), and the lowered kernel (loop nest, then the instruction list) as
 * codegen_for would lower it for caps with opts (NULL: the heuristics). malloc'd text. */
char *kernel_ast_format(UOp *ast);
char *lkernel_format(const LKernel *k);
char *kernel_lowered_format(UOp *ast, const DeviceCaps *caps, const OptList *opts);

/* Blocked accumulation of long float sums (cstyle.c): the loop level (1-based, global loops first)
 * that runs in blocks of *iters iterations, each summed into a fresh partial; 0 = none. Every
 * renderer blocks the same way so results agree bit for bit. */
int kernel_block_level(const LKernel *k, int64_t *iters);
/* Vector-ness and loop levels of a kernel's nodes (order: topological), as both CPU renderers
 * decide them (cstyle.c): vec gets the nodes computed as vw-lane vectors, level each node's loop
 * level + 1 (the loop ranges must be in it already), post the nodes computed after the reduction. */
void kernel_vec_levels(const LKernel *k, int vw, const PtrVec *order, PtrMap *vec, PtrMap *level, PtrMap *post);
/* float16/bfloat16 in float lanes (cstyle.c, for both CPU renderers). How a vector result u of
 * either dtype is rounded: not at all where it is exact already (a negation, a max, a selection, a
 * load, a cast from the same dtype); after a cast, by the exact conversion (its operand may be a
 * signalling NaN read from memory, whose bits the scalar cast keeps); after arithmetic, whose result
 * is never a signalling NaN, by the hardware's conversion where the CPU has one. */
typedef enum { VH_EXACT, VH_CAST, VH_ARITH } VHRound;
VHRound vhalf_round(const UOp *u);
/* Is u the result of float arithmetic (never a signalling NaN: the one input on which the
 * hardware's conversion to float16 differs from the exact one)? */
bool float_arith_result(const UOp *u);
/* bits: the nodes whose bits a consumer keeps (a store, a max, a negation...); a float16 load
 * outside it only feeds arithmetic and may convert with the hardware's instruction, which quiets a
 * signalling NaN that the arithmetic would quiet anyway. storeonly: the float16/bfloat16 arithmetic
 * results nothing but the output store reads, left unrounded since the store's conversion rounds
 * the same way. order: the kernel's nodes, topological; nuse: how many nodes of order read each.
 * Both maps are initialized here (the caller frees them). */
void kernel_half_bits(const LKernel *k, const PtrVec *order, const PtrMap *nuse, PtrMap *bits, PtrMap *storeonly);
/* nuse (initialized by the caller) += for each node, how many nodes of order read it */
void kernel_use_counts(const PtrVec *order, PtrMap *nuse);
/* A transposing tile (cstyle.c, for both CPU renderers): is u one of W ungated float32 gathers of
 * W lanes, of one buffer with one stride, at one level, whose indices are root + off0 + j for
 * j = 0..W-1 (no other such gather there)? Then members[j] is gather j, and the tile's rows are W
 * contiguous floats each at root + off0 + l * stride: the renderers load them as vectors and
 * transpose in registers. gather_block_masks: the two-input shuffle indices (0..W-1 from the first,
 * W..2W-1 from the second) of the round exchanging bit h of the row and lane indices, for the pair
 * of rows (i, i + h): lo becomes row i, hi row i + h. */
bool gather_block(const PtrVec *order, const PtrMap *vec, const PtrMap *level, const PtrMap *post, UOp *u, int W,
                  UOp **members, UOp **root, int64_t *off0);
void gather_block_masks(int W, int h, int *lo, int *hi);
/* The LLVM IR renderer (llvmir.c): LKernel -> LLVM IR text (malloc'd), the CPU kernel ABI, for the
 * device caps describe (NULL: the portable choices). */
char *render_llvm(const LKernel *k, const char *name, const DeviceCaps *caps);


/* The C renderer: LKernel -> C source (malloc'd). */
char *render_c(const LKernel *k, const char *name);
/* The C-style renderer for a language (LANG_C, LANG_OPENCL): LKernel -> source (malloc'd). */
char *render_kernel(const LKernel *k, const char *name, int lang);

#endif
