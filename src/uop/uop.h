/*
 * uop.h -- the UOp IR shared by every layer: an immutable, hash-consed DAG of {op, dtype, src[], arg}.
 *
 * The same node type describes the lazy tensor graph (BUFFER, CONST, ALU ops, REDUCE_AXIS, movement
 * ops, COPY, ASSIGN), the kernel AST produced by the scheduler (DEFINE_GLOBAL, RANGE, LOAD, REDUCE,
 * STORE, SINK) and the index arithmetic inside kernels. Hash-consing makes structurally equal graphs
 * pointer-equal, which gives common-subexpression elimination and O(1) kernel-cache keys for free.
 *
 * Ownership: uop_new returns a new reference; the caller owns it and releases it with uop_unref.
 * A node holds references to its sources. Nodes are freed when their count drops to zero.
 */
#ifndef TG_UOP_H
#define TG_UOP_H

#include <stdbool.h>
#include <stdint.h>

#include "../helpers.h"
#include "ptrmap.h"

/* X(name, flags). Flags: U unary ALU, B binary ALU, T ternary, Z zero-preserving (f(0,..)=0), M
 * movement op. Adding an op = a row here + its semantics in the renderer/tensor tables. */
#define TG_OPS(X)                                                                                  \
  X(NOOP, 0)                                                                                       \
  /* tensor graph leaves */                                                                        \
  X(BUFFER, 0)                                                                                     \
  X(CONST, 0)                                                                                      \
  X(IOTA, 0) /* 0, 1, ..., n-1 (1-d): computed from the loop index where it is read, never stored */ \
  /* unary ALU */                                                                                  \
  X(EXP2, OPF_UNARY)                                                                               \
  X(LOG2, OPF_UNARY)                                                                               \
  X(SIN, OPF_UNARY | OPF_ZERO)                                                                     \
  X(SQRT, OPF_UNARY | OPF_ZERO)                                                                    \
  X(RECIP, OPF_UNARY)                                                                              \
  X(NEG, OPF_UNARY | OPF_ZERO)                                                                     \
  X(TRUNC, OPF_UNARY | OPF_ZERO)                                                                   \
  X(CAST, OPF_UNARY | OPF_ZERO)                                                                    \
  X(BITCAST, OPF_UNARY | OPF_ZERO)                                                                 \
  /* binary ALU */                                                                                 \
  X(ADD, OPF_BINARY | OPF_ZERO)                                                                    \
  X(SUB, OPF_BINARY | OPF_ZERO)                                                                    \
  X(MUL, OPF_BINARY | OPF_ZERO)                                                                    \
  X(FDIV, OPF_BINARY)                                                                              \
  X(IDIV, OPF_BINARY)                                                                              \
  X(MOD, OPF_BINARY)                                                                               \
  X(MAX, OPF_BINARY | OPF_ZERO)                                                                    \
  X(CMPLT, OPF_BINARY | OPF_ZERO)                                                                  \
  X(CMPNE, OPF_BINARY | OPF_ZERO)                                                                  \
  X(CMPEQ, OPF_BINARY)                                                                             \
  X(AND, OPF_BINARY | OPF_ZERO)                                                                    \
  X(OR, OPF_BINARY | OPF_ZERO)                                                                     \
  X(XOR, OPF_BINARY | OPF_ZERO)                                                                    \
  X(SHL, OPF_BINARY | OPF_ZERO)                                                                    \
  X(SHR, OPF_BINARY | OPF_ZERO)                                                                    \
  X(POW, OPF_BINARY)                                                                               \
  /* ternary */                                                                                    \
  X(WHERE, OPF_TERNARY | OPF_ZERO)                                                                 \
  /* tensor graph: reduce over iarg axes (keepdim shape), arg.i = ADD/MUL/MAX op */                \
  X(REDUCE_AXIS, 0)                                                                                \
  /* movement ops (iarg holds the argument) */                                                     \
  X(RESHAPE, OPF_MOVE)                                                                             \
  X(PERMUTE, OPF_MOVE)                                                                             \
  X(EXPAND, OPF_MOVE)                                                                              \
  X(PAD, OPF_MOVE)                                                                                 \
  X(SHRINK, OPF_MOVE)                                                                              \
  X(FLIP, OPF_MOVE)                                                                                \
  /* tensor graph: materialization and side effects */                                             \
  X(CONTIGUOUS, 0)                                                                                 \
  /* identity that stops gradients (tinygrad's DETACH); no code is generated for it */            \
  X(DETACH, 0)                                                                                     \
  /* x[idx] along dim 0: src0 data, src1 integer indices; shape idx.shape + data.shape[1:] */       \
  X(INDEX, 0)                                                                                      \
  X(COPY, 0)                                                                                       \
  /* across the processes of an MPI world (dist.c), src0 stored first, on a host-memory device:     \
   * arg.i -1 the sum of src0 over all of them, r >= 0 process r's src0 (a broadcast), -2-r the sum \
   * on process r and zeros on the others (a reduce to r: a broadcast's gradient) */              \
  X(COLLECTIVE, 0)                                                                                 \
  X(ASSIGN, 0)                                                                                     \
  X(MULTI, 0) /* a tensor over a device tuple: src = one node per member; arg.i the sharded axis (-1: replicated) */ \
  /* kernel AST */                                                                                 \
  X(DEFINE_GLOBAL, 0)                                                                              \
  X(RANGE, 0) /* iarg[0] the size (max); a symbolic loop has src[0], its end (index arithmetic) */   \
  X(DEFINE_VAR, 0) /* a variable's value as a kernel argument: arg.i its index, iarg {min, max} */ \
  X(LOAD, 0)                                                                                       \
  X(REDUCE, 0)                                                                                     \
  X(STORE, 0)                                                                                      \
  X(SINK, 0)

enum { OPF_UNARY = 1, OPF_BINARY = 2, OPF_TERNARY = 4, OPF_ZERO = 8, OPF_MOVE = 16 };

typedef enum {
#define X(name, flags) OP_##name,
  TG_OPS(X)
#undef X
      OP_COUNT
} Op;

extern const char *const op_names[OP_COUNT];
extern const int op_flags[OP_COUNT];
static inline bool op_is_alu(int op) { return (op_flags[op] & (OPF_UNARY | OPF_BINARY | OPF_TERNARY)) != 0; }
/* The number of elements of a shape (1 for a 0-d one). */
static inline int64_t shape_numel(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}
static inline bool op_is_movement(int op) { return (op_flags[op] & OPF_MOVE) != 0; }

/* The dtype used for index arithmetic inside kernels. */
#define DT_INDEX TG_INT64

typedef union {
  int64_t i;
  double f;
  void *p;
} UArg;

typedef struct UOp UOp;
struct UOp {
  uint16_t op;
  uint8_t dtype;
  uint8_t flags;     /* internal */
  uint32_t nsrc;
  uint32_t rc;       /* reference count */
  uint32_t niarg;
  uint64_t hash;
  uint64_t id;       /* creation order: a stable total order for canonical sorting */
  UOp **src;
  int64_t *iarg;     /* op argument: shape, axes, pads... (part of identity) */
  UArg arg;          /* scalar argument (part of identity): CONST value, BUFFER pointer, RANGE axis */
  /* derived, not part of identity */
  int64_t *shape;    /* tensor-graph nodes: the shape (an empty array for 0-d); NULL for kernel nodes */
  int64_t *sym;      /* tensor-graph nodes with symbolic dims: the shape with those dims as tg_sym codes */
  int ndim;
  int device;        /* device id (tensor-graph nodes) */
  bool shape_inline; /* (internal) shape lives in the node's own allocation, after src and iarg */
  uint32_t kmark, kpos; /* (internal) the schedule cache's walk: kpos is valid while kmark is its epoch */
  int64_t vmin, vmax;/* index-arithmetic bounds (kernel nodes of integer dtype) */
  UOp *realized;     /* tensor graph: BUFFER node holding this node's value once realized (owned ref) */
  UOp *next;         /* intern-table chain */
};

/* flags bit: shape/ndim/device are filled (tensor-graph nodes, set once before the node is visible) */
#define UOPF_META 1
/* flags bit: the node has side-table entries (e.g. a custom gradient) to drop when it is freed */
#define UOPF_HOOKED 2
/* flags bit: a gradient compares this node (or a view of it) with a maximum computed from it, so
 * the scheduler must keep computing it in a kernel of its own (see schedule.c's window fusion) */
#define UOPF_MAX_GRAD 4
/* flags bit: a tensor with requires_grad holds this node, so graphs built on it must contain it (a
 * reshape of it is not folded into a reshape of its source, or the gradient could not find it) */
#define UOPF_GRAD_LEAF 8
/* flags bit: ->realized is not owned -- the realized BUFFER node keeps this node as its history for
 * autograd (it owns this node), and clears ->realized when it dies (autograd.c, ag_attach_history) */
#define UOPF_WEAK_REALIZED 16
/* flags bit: a tensor handle holds this reshape. tg_backward and tg_gradient may target any tensor
 * (tinygrad's rule), so a reshape of it is not folded into a reshape of its source either */
#define UOPF_HELD_RESHAPE 32
/* flags bit: a reshape merged or split a symbolic dim (its shape is no longer v + c): the scheduler
 * refuses kernels that contain it rather than bake the bound value in */
#define UOPF_SYM_LOST 64
/* flags bit: an elementwise op meets a symbolic dim and, in the same place, a concrete size that is
 * not a broadcast (a pad or shrink whose amount the library computed from the bound value, as
 * tg_cat does): the kernel is right for this value only, so a TinyJit capture refuses it */
#define UOPF_SYM_BAKED 128
extern void (*uop_free_hook)(UOp *u);

/* Creates (or finds) a node. Takes no ownership of srcs (they are ref'd by the new node). Returns a
 * new reference. iarg copied. Kernel and index nodes carry no shape (ndim 0, device -1). */
UOp *uop_new(int op, tg_dtype dt, UOp *const *src, int nsrc, const int64_t *iarg, int niarg, UArg arg);
/* The same for tensor-graph nodes: shape (copied), ndim and device are filled before the node is
 * published in the intern table, so a thread that finds it never sees them half written (a found
 * node created without them gets them under the table's lock). */
UOp *uop_new_meta(int op, tg_dtype dt, UOp *const *src, int nsrc, const int64_t *iarg, int niarg, UArg arg,
                  const int64_t *shape, int ndim, int device);
/* The node's flag bits (UOPF_*), set and read atomically: threads building graphs over shared nodes
 * may mark one while another reads it. */
static inline uint8_t uop_flags(const UOp *u) { return __atomic_load_n(&u->flags, __ATOMIC_ACQUIRE); }
/* Marks u as holding a size computed from a variable's bound value (UOPF_SYM_BAKED): right for that
 * value, never captured by TinyJit for others. */
static inline void uop_mark_sym_baked(UOp *u) { __atomic_fetch_or(&u->flags, (uint8_t)UOPF_SYM_BAKED, __ATOMIC_RELEASE); }
/* true once any node got UOPF_GRAD_LEAF (never cleared): until then no graph can need a gradient,
 * and the walks that look for one are skipped */
extern bool uop_any_grad_leaf;
static inline void uop_set_flag(UOp *u, uint8_t f) {
  if (f & UOPF_GRAD_LEAF) __atomic_store_n(&uop_any_grad_leaf, true, __ATOMIC_SEQ_CST);
  __atomic_fetch_or(&u->flags, f, __ATOMIC_SEQ_CST);
}
static inline void uop_clear_flag(UOp *u, uint8_t f) { __atomic_fetch_and(&u->flags, (uint8_t)~f, __ATOMIC_RELEASE); }
/* ->realized, read and written atomically: a realize in one thread sets it on nodes that graphs
 * built by other threads share (the BUFFER node it points to is complete before it is stored). */
static inline UOp *uop_realized(const UOp *u) { return __atomic_load_n(&u->realized, __ATOMIC_ACQUIRE); }
static inline void uop_set_realized(UOp *u, UOp *r) { __atomic_store_n(&u->realized, r, __ATOMIC_RELEASE); }
UOp *uop_ref(UOp *u);
void uop_unref(UOp *u);
size_t uop_live_count(void);
/* Sets kmark to 0 on every live node (the schedule cache's epochs wrapped around). */
void uop_clear_kmarks(void);

/* Convenience constructors (all return new references, srcs are borrowed). */
UOp *uop_const_i(tg_dtype dt, int64_t v);
UOp *uop_const_f(tg_dtype dt, double v);
UOp *uop_alu(int op, tg_dtype dt, UOp *a, UOp *b, UOp *c); /* b/c may be NULL */
/* CONST value as double / int64 regardless of dtype. */
double uop_const_as_f(const UOp *u);
int64_t uop_const_as_i(const UOp *u);

/* ---- symbolic index arithmetic (int64, bounds tracked in vmin/vmax) ----
 * These smart constructors keep index expressions in a canonical affine form (sum of terms times
 * constants plus a constant) and simplify division and modulo by constants using the bounds, so
 * contiguous access comes out as a plain running index. All take borrowed refs, return new refs. */
UOp *s_const(int64_t v);
UOp *s_range(int axis, int64_t size);
/* a loop over [0, end) where end is index arithmetic (a variable) of at most max */
UOp *s_range_sym(int axis, int64_t max, UOp *end);
/* the value of variable `var` (index arithmetic with its bounds) */
UOp *s_var(int var);
/* a < b for two index expressions (a bool; folded when the bounds decide it) */
UOp *s_lt(UOp *a, UOp *b);
UOp *s_add(UOp *a, UOp *b);
UOp *s_addc(UOp *a, int64_t c);
UOp *s_mulc(UOp *a, int64_t c);
UOp *s_divc(UOp *a, int64_t c); /* floor division by c > 0 (exact for the valid, non-negative range) */
UOp *s_modc(UOp *a, int64_t c); /* modulo by c > 0 */
/* Boolean conditions: a < c, a >= c, and conjunction (NULL = true). */
UOp *s_ltc(UOp *a, int64_t c);
UOp *s_gec(UOp *a, int64_t c);
UOp *s_and(UOp *a, UOp *b);
/* min(x, c): x itself where its bounds allow, else a select (with bounds) */
UOp *s_minc(UOp *x, int64_t c);
/* Rebuilds `u` with RANGE nodes replaced (subst[i].from -> subst[i].to), re-simplifying. */
typedef struct {
  UOp *from, *to;
} USubst;
UOp *uop_substitute(UOp *u, const USubst *subst, int n);

/* Does u (NULL: no) contain node r? The _memo form keeps its answers per node in memo, so several
 * questions about one r share the walk (memo belongs to that r). */
bool uop_depends_on(const UOp *u, const UOp *r);
bool uop_depends_on_memo(const UOp *u, const UOp *r, PtrMap *memo);
/* Appends every distinct node of op `op` in u's graph to out, depth first, sources in order. */
void uop_collect(UOp *u, int op, PtrVec *out);

/* ---- symbolic sizes (var.c) ----
 * Variables are rows of a process-wide table (index >= 0); a size code (tg_sym) is a tagged int64
 * packing a variable, its bound value (-1: unbound) and an offset. */
typedef struct {
  int var;
  int64_t value, offset, min, max;
} SymDim;
/* The index of variable (name, min, max), created at the first call; -1 + error on bad input. */
int var_intern(const char *fn, const char *name, int64_t min, int64_t max);
bool var_info(int idx, const char **name, int64_t *min, int64_t *max);
bool sym_is_code(int64_t x);
/* TG_SYM_NONE when a field does not fit */
int64_t sym_encode(int var, int64_t value, int64_t offset);
/* false when x is not a valid code */
bool sym_decode(int64_t x, SymDim *out);
/* the size a code stands for now (value + offset; max + offset when unbound); plain sizes as they are */
int64_t sym_concrete(int64_t x);
/* the largest size a code can stand for (max + offset); plain sizes as they are */
int64_t sym_maxval(int64_t x);
/* A movement node's arguments with their codes (the second half of iarg when it has codes, else
 * iarg itself); *n gets their count. */
const int64_t *uop_move_args(const UOp *u, int *n);
/* The symbolic shape of a tensor-graph node (malloc'd, NULL when no dim is symbolic), inferred from
 * its sources' and its own codes; *lost when a reshape merged or split a symbolic dim, *baked when
 * a concrete size that is not a broadcast meets a symbolic dim (UOPF_SYM_BAKED). */
int64_t *sym_infer(const UOp *u, bool *lost, bool *baked);
/* Inside one of the library's own composed ops (on this thread: sym_library(+1) on entry, -1 on
 * exit)? A shrink there that cuts a symbolic dim to a plain size computed that size from the bound
 * value (a pool's window count, say), so sym_infer marks it baked; the same shrink written by the
 * user (x[:, :2] of a dim of v >= 2) holds for every value. */
void sym_library(int delta);
/* Groups matching the dims of a reshape: dims of `a` and of `b` get group numbers (a size-1 dim
 * that is not symbolic gets -1); a group is either one symbolic dim on each side or concrete dims
 * of equal product. Returns the group count, or -1 when a symbolic dim would be merged or split.
 * asym/bsym may be NULL (no symbolic dims). */
int sym_reshape_groups(const int64_t *a, const int64_t *asym, int na, const int64_t *b, const int64_t *bsym, int nb,
                       int *ga, int *gb);
/* index arithmetic for a code (DEFINE_VAR + offset), or s_const for a plain size */
UOp *sym_expr(int64_t x);

/* Debug: prints a node tree to stderr. */
void uop_print(const UOp *u);

#endif
