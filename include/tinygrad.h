/*
 * tinygrad.h -- the one public header of tinygrad.c.
 *
 * Tensors are lazy: every operation only records a node in a graph. tg_realize() schedules the graph
 * into as few kernels as it can (fusion), renders each kernel as source code, compiles it for the
 * device and runs it. Reading data (tg_data, tg_item) realizes implicitly.
 *
 * Conventions used by every function in this header:
 *  - tg_tensor is a handle passed by value. {0} is "none". Every new handle belongs to the innermost
 *    open scope (tg_scope_begin/tg_scope_end) or to the root scope; ending a scope frees its handles.
 *    A freed or stale handle is an error, never undefined behaviour.
 *  - Errors: a function given bad input returns "none" (or a negative tg_status) and records the first
 *    error of the thread; read it with tg_last_error(). An op given "none" returns "none", so a chain
 *    of calls can be checked once at the end. The library never aborts or exits on user input.
 *  - Out of host memory: an operation during which an allocation fails is undone (its handles and
 *    gradients are not handed out) and reports TG_ERR_RUNTIME "<operation>: out of host memory ...";
 *    the library stays usable. A realize that has started running kernels finishes them (an assign
 *    must not run twice) and then reports the error; its results are right. A failure in a call that
 *    returns no tensor or status is reported by the next call that does. The library keeps a small
 *    reserve for finishing an operation; it aborts only if memory is still short once that is spent.
 *  - Graphs may be arbitrarily deep: building, realizing, differentiating and freeing walk them
 *    without recursion, and kernels are split at a depth bound (the DEPTH_SPLIT setting).
 *  - Keyword arguments: a trailing `const tg_xxx_opts *` argument; NULL means tinygrad's defaults.
 *    Build one with its macro, TG_XXX_OPTS(.field = value, ...): the macro starts from tinygrad's
 *    defaults (written in the macro) and the designators given override them, so every field holds
 *    the value it says and every legal value can be passed (lr 0, weight_decay 0, momentum 0). A
 *    field whose tinygrad default is None, or derived from other arguments, uses a value that is not
 *    otherwise legal for it and says so (0 for a size or stride, NULL, {0}, TG_DTYPE_DEFAULT). A
 *    struct filled by hand (C++, where the macros do not compile) must set every field.
 *  - Axes may be negative (counted from the end). Shapes are int64_t arrays with an explicit ndim.
 *
 * Threads. Safe from any number of threads at once, also over tensors that several threads share
 * (an inference server: one model's realized weights, one request per thread): creating tensors,
 * building graphs with any op, reading shapes and dtypes, realizing and reading data (tg_realize,
 * tg_data, tg_item), scopes, tg_free of a thread's own handles, loading files, each thread's own
 * tg_jit (random draws in replays included). Scopes and the error state are per thread; a thread
 * that exits with scopes open ends them (their handles are freed, as tg_scope_end frees them). Realizations are serialized inside the library (one schedule runs at a
 * time, each on every core), so threads gain concurrency in graph building, not in kernels.
 * Not safe without the caller's own locking: changing a shared tensor (tg_assign or an optimizer
 * step into it, tg_backward or tg_zero_grad over tensors another thread uses, requires_grad
 * changes), freeing a handle another thread still uses, and sharing one tg_jit or tg_optim between
 * threads.
 */
#ifndef TINYGRAD_H
#define TINYGRAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TG_VERSION "0.1.0"

/* The options macros' engine: a compound literal of `type` initialized with the defaults followed by
 * the caller's designators (a later designator overrides an earlier one). gcc's -Woverride-init
 * (in -Wextra) warns about exactly that, and a _Pragma cannot stand inside an expression in gcc, so
 * the initialization happens in a statement expression that silences it; the value is then copied
 * into a compound literal in the caller's block, which lives as long as that block. */
#if defined(__GNUC__) && !defined(__cplusplus)
#define TG_OPTS_WITH_(type, ...)                                                                       \
  (&(struct { type v_; }){(__extension__({                                                             \
     _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Woverride-init\"")              \
     type tg_opts_v_ = {__VA_ARGS__};                                                                  \
     _Pragma("GCC diagnostic pop") tg_opts_v_;                                                         \
   }))}.v_)
#else
#define TG_OPTS_WITH_(type, ...) (&(type){__VA_ARGS__})
#endif

/* ---------------------------------------------------------------------------------------------- */
/* dtypes                                                                                          */

/* Element types. TG_DTYPE_DEFAULT (0) in an options struct means "the default for this call":
 * DEFAULT_FLOAT (float32 unless the DEFAULT_FLOAT environment variable says otherwise) for float
 * creation, int32 for integer creation, or the dtype inferred from the inputs. */
typedef enum {
  TG_DTYPE_DEFAULT = 0,
  TG_BOOL,
  TG_INT8,
  TG_INT16,
  TG_INT32,
  TG_INT64,
  TG_UINT8,
  TG_UINT16,
  TG_UINT32,
  TG_UINT64,
  TG_FLOAT16,
  TG_BFLOAT16,
  TG_FLOAT32,
  TG_FLOAT64,
  TG_FP8E4M3, /* OCP fp8 (tinygrad's fp8e4m3): 4 exponent bits, 3 mantissa bits, no inf, max 448 */
  TG_FP8E5M2, /* OCP fp8 (tinygrad's fp8e5m2): 5 exponent bits, 2 mantissa bits, inf, max 57344 */
  /* AMD's fnuz fp8 (tinygrad's fp8e4m3fnuz / fp8e5m2fnuz): finite values in every exponent, one NaN
   * (0x80), no inf, no negative zero; inf and NaN convert to NaN, finite overflow saturates */
  TG_FP8E4M3FNUZ, /* 4 exponent bits (bias 8), 3 mantissa bits, max 240 */
  TG_FP8E5M2FNUZ, /* 5 exponent bits (bias 16), 2 mantissa bits, max 57344 */
  TG_DTYPE_COUNT
} tg_dtype;

/* Name as tinygrad spells it ("float", "half", "bfloat16", "int", "uchar", "bool", ...). Static. */
const char *tg_dtype_name(tg_dtype dt);
/* Size of one element in bytes; 0 for an invalid dtype. */
size_t tg_dtype_itemsize(tg_dtype dt);
bool tg_dtype_is_float(tg_dtype dt);
bool tg_dtype_is_int(tg_dtype dt);      /* signed or unsigned integer (not bool) */
bool tg_dtype_is_unsigned(tg_dtype dt); /* uint8..uint64 */
/* tinygrad's type promotion: the least dtype both a and b convert to without loss. */
tg_dtype tg_dtype_promote(tg_dtype a, tg_dtype b);
/* The current default float dtype (DEFAULT_FLOAT, Context-overridable). */
tg_dtype tg_default_float(void);

/* ---------------------------------------------------------------------------------------------- */
/* handles, scopes, errors                                                                         */

typedef struct {
  uint64_t id;
} tg_tensor;

typedef enum {
  TG_OK = 0,
  TG_ERR_INVALID = -1,  /* bad argument: shape, axis, dtype, value, NULL pointer */
  TG_ERR_HANDLE = -2,   /* "none", freed or stale handle */
  TG_ERR_COMPILE = -3,  /* a kernel failed to compile (message carries the compiler's output) */
  TG_ERR_RUNTIME = -4,  /* device failure: allocation, launch, copy */
  TG_ERR_IO = -5,       /* file or format error */
} tg_status;

/* True if t is a live handle (not none, not freed). */
bool tg_valid(tg_tensor t);
/* Opens a scope: handles created until the matching tg_scope_end belong to it. Scopes nest
 * (thread-local stack). */
void tg_scope_begin(void);
/* Frees every handle still owned by the innermost scope and closes it. */
void tg_scope_end(void);
/* Moves t one scope outward (to the caller's scope) and returns it. */
tg_tensor tg_keep(tg_tensor t);
/* Moves t to the root scope: it lives until tg_free. */
tg_tensor tg_persist(tg_tensor t);
/* Frees one handle now. Other handles and results built from t stay valid. Freeing none is a no-op.
 * A BORROWED handle (a tg_state_dict entry) is refused: TG_ERR_HANDLE is recorded and the handle
 * stays valid, so the dict never holds a dead entry; the dict frees its own handles. */
void tg_free(tg_tensor t);
/* Number of live handles in all scopes (for leak tests). */
size_t tg_live_count(void);

/* The first error recorded on this thread since the last tg_clear_error, or NULL. Valid until the
 * next tg_clear_error. Messages name the function, the shapes or values, and a hint. */
const char *tg_last_error(void);
/* The status of the first recorded error (TG_OK if none). */
tg_status tg_last_status(void);
void tg_clear_error(void);

/* ---------------------------------------------------------------------------------------------- */
/* creation                                                                                        */

/* tinygrad's requires_grad=None: neither true nor false (see tg_backward). */
#define TG_GRAD_UNSET (-1)
/* Options for creation functions. */
typedef struct {
  tg_dtype dtype;     /* TG_DTYPE_DEFAULT: chosen by the function */
  const char *device; /* "CPU", "CPU:1", "CL", ...; NULL = default device (DEV environment variable);
                       * "" is an error */
  int8_t requires_grad; /* true, false or TG_GRAD_UNSET (the default, tinygrad's None) */
} tg_opts;
#define TG_OPTS(...) TG_OPTS_WITH_(tg_opts, .requires_grad = TG_GRAD_UNSET, __VA_ARGS__)
/* Compound-literal helpers for C callers: TG_SHAPE(2,3) expands to "array, ndim". */
#define TG_SHAPE(...) ((const int64_t[]){__VA_ARGS__}), ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define TG_AXES(...) ((const int[]){__VA_ARGS__}), ((int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)))
#define TG_ALL_AXES NULL, 0

/* Copies numel elements of opts->dtype from `data` into a new realized tensor. Without a dtype
 * (NULL opts or TG_DTYPE_DEFAULT), `data` is a C float array and the tensor is DEFAULT_FLOAT: under
 * DEFAULT_FLOAT=half the floats are rounded to half, as tinygrad's Tensor([...]) does. */
tg_tensor tg_from_data(const void *data, const int64_t *shape, int ndim, const tg_opts *opts);
/* Wraps a caller's buffer without copying (CPU devices only). The caller keeps ownership and must keep
 * the memory alive and unmoved while any tensor or result uses it. Writes through tg_assign land in
 * the caller's memory. Without a dtype the memory is float32, whatever DEFAULT_FLOAT says. */
tg_tensor tg_from_blob(void *data, const int64_t *shape, int ndim, const tg_opts *opts);
/* A 0-d tensor holding one value (dtype default: DEFAULT_FLOAT). */
tg_tensor tg_scalar(double value, const tg_opts *opts);
tg_tensor tg_empty(const int64_t *shape, int ndim, const tg_opts *opts);
tg_tensor tg_zeros(const int64_t *shape, int ndim, const tg_opts *opts);
tg_tensor tg_ones(const int64_t *shape, int ndim, const tg_opts *opts);
tg_tensor tg_full(const int64_t *shape, int ndim, double value, const tg_opts *opts);
/* _like forms: the shape, and unless opts says otherwise the dtype and device, of t. */
tg_tensor tg_empty_like(tg_tensor t, const tg_opts *opts);
tg_tensor tg_zeros_like(tg_tensor t, const tg_opts *opts);
tg_tensor tg_ones_like(tg_tensor t, const tg_opts *opts);
tg_tensor tg_full_like(tg_tensor t, double value, const tg_opts *opts);
/* n x m matrix with ones on the main diagonal (tinygrad's eye(n, m); pass m = n for the square
 * identity). n, m >= 0: eye(n, 0) is an empty (n, 0) tensor. */
tg_tensor tg_eye(int64_t n, int64_t m, const tg_opts *opts);
/* [start, stop) with step. dtype default: int32 if all three are integers (int64 when start or
 * stop - step is outside int32), else DEFAULT_FLOAT. As in tinygrad, an integer dtype that cannot hold
 * start and stop - step is an error (arange(0, 129) in int8), not a wrap. An integer arange is lazy
 * and computed inside the kernels that read it (no memory); a float one is made on the host, as exact
 * as PyTorch's. */
tg_tensor tg_arange(double start, double stop, double step, const tg_opts *opts);
/* steps values evenly spaced over [start, stop]; any dtype but bool. */
tg_tensor tg_linspace(double start, double stop, int64_t steps, const tg_opts *opts);

/* Random numbers: a counter-based generator (threefry2x32) seeded by tg_manual_seed; the same seed
 * gives the same numbers on every device and in every run. */
void tg_manual_seed(uint64_t seed);
/* Uniform [0, 1) in every float dtype (float16 / bfloat16 values lie on their own 2^-10 / 2^-7 grid,
 * so none rounds up to 1; float32 has 23 random bits, float64 53). */
tg_tensor tg_rand(const int64_t *shape, int ndim, const tg_opts *opts);
/* Standard normal. With an integer or bool dtype it is drawn in float32 and cast (truncated toward
 * zero), as tinygrad's. */
tg_tensor tg_randn(const int64_t *shape, int ndim, const tg_opts *opts);
tg_tensor tg_randint(const int64_t *shape, int ndim, int64_t low, int64_t high, const tg_opts *opts);
tg_tensor tg_uniform(const int64_t *shape, int ndim, double low, double high, const tg_opts *opts);
tg_tensor tg_normal(const int64_t *shape, int ndim, double mean, double std, const tg_opts *opts);

/* ---------------------------------------------------------------------------------------------- */
/* properties and data                                                                             */

int tg_ndim(tg_tensor t);  /* -1 for an invalid handle */
/* Writes the shape into out (room for tg_ndim(t) values). Returns ndim, or -1. */
int tg_shape(tg_tensor t, int64_t *out);
/* Size of dimension `axis` (negative counts from the end); -1 on error. */
int64_t tg_dim(tg_tensor t, int axis);
int64_t tg_numel(tg_tensor t); /* -1 on error */
tg_dtype tg_dtype_of(tg_tensor t); /* TG_DTYPE_DEFAULT (0) on error */
/* Canonical device name ("CPU", "CPU:1"). Static storage. NULL on error. */
const char *tg_device_of(tg_tensor t);
/* True once t is backed by a device buffer (no pending computation). */
bool tg_is_realized(tg_tensor t);

/* Realizes t and copies its elements (row-major, contiguous, in t's dtype) into out.
 * nbytes must be at least numel * itemsize. */
tg_status tg_data(tg_tensor t, void *out, size_t nbytes);
/* The single element of a one-element tensor, converted to double. */
tg_status tg_item(tg_tensor t, double *out);
/* Same, for integer dtypes where double would lose precision. */
tg_status tg_item_i64(tg_tensor t, int64_t *out);
/* Formats t the way numpy prints an array (tinygrad's `print(t.numpy())`). Returns a malloc'd string
 * the caller frees with free(), or NULL on error. */
char *tg_to_string(tg_tensor t);
/* Prints tg_to_string(t) and a newline to stdout. */
tg_status tg_print(tg_tensor t);

/* ---------------------------------------------------------------------------------------------- */
/* realize, devices                                                                                */

/* Computes t (and everything it depends on) now. Realizing a realized tensor runs nothing. */
tg_status tg_realize(tg_tensor t);
/* Realizes several tensors in one schedule (shared work is computed once). */
tg_status tg_realize_many(const tg_tensor *ts, int n);
/* Lazy copy of t to another device ("CPU:1"; "" is an error, not the default device). A
 * comma-separated device tuple ("CPU:0,CPU:1") replicates t onto every member (tinygrad's
 * to(tuple)); a tuple of one ("CPU:1,") is that device. A multi-device tensor sent to one device is
 * gathered there (the shards joined in order). */
tg_tensor tg_to(tg_tensor t, const char *device);

/* ---- multi-device tensors (tinygrad's shard) ----
 * A tensor on a device tuple holds one shard per device: the whole tensor on each (replicated) or a
 * slice of it along one axis. Every op accepts such tensors (the tuple is their device, and the
 * inputs of an op must share it): elementwise ops with matching shardings run per shard, mismatched
 * ones reshard first; a reduction over the sharded axis ends in an allreduce (naive, or ring for
 * more than 2 devices and more than RING_ALLREDUCE_THRESHOLD=256000 elements; RING=0 forces naive,
 * RING=2 ring; DEBUG=2 prints each one); autograd, TinyJit and data readers (which gather) work on
 * them. Over distinct CUDA GPUs, a sum or max allreduce of a dtype NCCL has runs as one NCCL group
 * when libnccl opens (TG_NCCL_LIB=<path>, that file alone, else libnccl.so.2; NCCL=0 declines it);
 * a failing NCCL call is an error (TG_ERR_RUNTIME) naming it, after DIST_TIMEOUT seconds at most.
 * docs/DESIGN.md describes the rules. */
#define TG_SHARD_NONE (-2147483647 - 1)
/* t split along `axis` over the n devices (names as tg_to takes them; each listed once), in order:
 * shard i holds the i-th ceil(size/n) slice (the last ones may be smaller or empty). A negative axis
 * counts from the end, as in tinygrad (-1 is the last axis); TG_SHARD_NONE (tinygrad's axis=None)
 * replicates. One device (n = 1) is tg_to that device, as in tinygrad: a plain tensor, not a tuple
 * of one. Lazy: new handle. */
tg_tensor tg_shard(tg_tensor t, const char *const *devices, int n, int axis);
/* tinygrad's shard_: t itself becomes the sharded tensor (realized; the handle, its requires_grad
 * and whoever borrows it, an optimizer or a state dict, see the new value; a gradient it had is
 * dropped). TG_OK or the error of tg_shard. */
tg_status tg_shard_(tg_tensor t, const char *const *devices, int n, int axis);
/* ---- across processes and machines: MPI (Open MPI's libmpi, opened at run time) ----
 * tg_dist_init starts MPI (a process not started by mpirun is a world of one) and makes its calls
 * return errors instead of aborting (MPI_ERRORS_RETURN): TG_ERR_RUNTIME naming what is missing when
 * libmpi cannot be opened (TG_LIBMPI=<path>: that file alone, else libmpi.so.40). Rank and size are
 * -1 before it. MPI cannot start again after tg_dist_finalize (TG_ERR_INVALID). */
tg_status tg_dist_init(void);
int tg_dist_rank(void);
int tg_dist_size(void);
tg_status tg_dist_finalize(void);
/* The sum of t over all ranks (MPI_Allreduce; float32/64, int32/64), or rank root's t on every rank
 * (MPI_Bcast): a new lazy tensor with t's shape, dtype, device and sharding, realized with the rest
 * of its graph. Differentiable (an allreduce's gradient is the allreduce of the gradient), and
 * TinyJit captures it: each replay runs the MPI call again. Every rank must build and realize the
 * same collectives, with the same shapes and dtypes, in the same order: the ranks check that they
 * agree before each one (a small MPI call), and where they differ every rank gets TG_ERR_INVALID
 * naming what differs (no data is exchanged; the world stays usable). MPI pairs calls by their order,
 * so a rank's collectives must be realized in one order its program fixes: two threads realizing
 * collectives at once may pair different tensors of equal shape. A rank that does not come to
 * a collective within DIST_TIMEOUT seconds (default 600; it died, hangs, or skipped it) ends the
 * others' wait with TG_ERR_RUNTIME; MPI cannot be used again in that process (later collectives and
 * tg_dist_finalize say so), which should exit: mpirun then ends the job. A CUDA tensor's collective
 * runs as the NCCL call on its device when libnccl opens (TG_NCCL_LIB=<path>, that file alone,
 * else libnccl.so.2; NCCL=0 declines it), with one communicator per device over the ranks; without
 * NCCL it goes through host memory and MPI. A NCCL call that a dead or silent peer holds up ends in
 * an error after DIST_TIMEOUT seconds (default 600). */
tg_tensor tg_dist_allreduce(tg_tensor t);
tg_tensor tg_dist_broadcast(tg_tensor t, int root);
/* t on like's devices with like's sharding (axis and shard sizes); shapes must match. */
tg_tensor tg_shard_like(tg_tensor t, tg_tensor like);
/* The sharded axis, TG_SHARD_NONE for a replicated or single-device tensor; -2 on a bad handle. */
int tg_shard_axis(tg_tensor t);
/* The number of shards (1 for a single-device tensor; -1 on a bad handle). */
int tg_shard_count(tg_tensor t);
/* Shard i as a tensor on its own device (new handle; lazy). */
tg_tensor tg_shard_get(tg_tensor t, int i);
/* A tensor whose data is contiguous in memory (a copy if t is a non-trivial view). */
tg_tensor tg_contiguous(tg_tensor t);
/* Writes value into target's buffer (shapes must match; value is cast to target's dtype). Returns
 * target's handle updated to the assignment; the write happens when it is realized. A target that is
 * a view of a tensor with storage writes into that storage, as tinygrad's assign does (see
 * tg_setitem: every handle of that tensor sees the write). */
tg_tensor tg_assign(tg_tensor target, tg_tensor value);
/* A copy of t's graph with the same data (lazy). */
tg_tensor tg_clone(tg_tensor t);
/* tinygrad's clone(device): a lazy copy of t with a buffer of its own on `device` (a name or a tuple,
 * as tg_to takes; NULL: t's device), with t's requires_grad and, when t has a gradient, a clone of it
 * on that device as its gradient (tg_clone copies the data alone). Unlike tg_to, the same device
 * still gives a copy. */
tg_tensor tg_clone_to(tg_tensor t, const char *device);
/* The same data, cut off from autograd. */
tg_tensor tg_detach(tg_tensor t);
/* The default device's name (DEV, or "CPU"), as tensors made without a device get it. */
const char *tg_default_device(void);
/* Blocks until all queued work on the device is done. */
tg_status tg_synchronize(const char *device);

/* Device names are tinygrad's: DEVICE[:N][:RENDERER[:ARCH]], case-insensitive -- "CPU", "CPU:1",
 * "CL" (OpenCL, the first device of the first platform), "CL:1", "CL:OpenCL". An unknown device,
 * renderer or arch is an error whose message lists what exists. */
typedef struct {
  const char *name;             /* "CPU", "CL" (static storage) */
  const char *const *renderers; /* the renderers it takes, default first, NULL-terminated (static) */
  bool available;               /* instance 0 opens on this machine */
  char why[512];                /* when not available: the reason (a missing library, no driver) */
} tg_device_info;
/* Describes every device kind: fills min(cap, count) entries of out (out may be NULL with cap 0)
 * and returns the number of kinds. A kind is probed by opening its instance 0, which then stays
 * open, as on first use. Leaves the thread's error state as it was. */
int tg_device_list(tg_device_info *out, int cap);

/* ---------------------------------------------------------------------------------------------- */
/* primitive ops (lazy)                                                                            */

/* Unary math. Integer inputs to float functions are cast to DEFAULT_FLOAT first. */
tg_tensor tg_exp2(tg_tensor x);
tg_tensor tg_log2(tg_tensor x);
tg_tensor tg_sin(tg_tensor x);
tg_tensor tg_sqrt(tg_tensor x);
tg_tensor tg_reciprocal(tg_tensor x);
tg_tensor tg_neg(tg_tensor x);
tg_tensor tg_trunc(tg_tensor x);
tg_tensor tg_exp(tg_tensor x);
tg_tensor tg_log(tg_tensor x);
tg_tensor tg_relu(tg_tensor x);

tg_tensor tg_cast(tg_tensor x, tg_dtype dtype);
/* Reinterprets the bits. Same itemsize: same shape. Different itemsize: the last dimension scales. */
tg_tensor tg_bitcast(tg_tensor x, tg_dtype dtype);

/* Broadcasted binary ops with tinygrad's type promotion. */
tg_tensor tg_add(tg_tensor x, tg_tensor y);
tg_tensor tg_sub(tg_tensor x, tg_tensor y);
tg_tensor tg_mul(tg_tensor x, tg_tensor y);
tg_tensor tg_div(tg_tensor x, tg_tensor y);   /* true division: ints promote to DEFAULT_FLOAT */
tg_tensor tg_idiv(tg_tensor x, tg_tensor y);  /* integer division truncating toward zero (ints only) */
tg_tensor tg_mod(tg_tensor x, tg_tensor y);   /* result has the sign of y (Python %) */
tg_tensor tg_maximum(tg_tensor x, tg_tensor y);
tg_tensor tg_minimum(tg_tensor x, tg_tensor y);
tg_tensor tg_lt(tg_tensor x, tg_tensor y);    /* bool results */
tg_tensor tg_gt(tg_tensor x, tg_tensor y);
tg_tensor tg_le(tg_tensor x, tg_tensor y);
tg_tensor tg_ge(tg_tensor x, tg_tensor y);
tg_tensor tg_eq(tg_tensor x, tg_tensor y);
tg_tensor tg_ne(tg_tensor x, tg_tensor y);
tg_tensor tg_bitwise_and(tg_tensor x, tg_tensor y); /* ints and bools */
tg_tensor tg_bitwise_or(tg_tensor x, tg_tensor y);
tg_tensor tg_bitwise_xor(tg_tensor x, tg_tensor y);
tg_tensor tg_lshift(tg_tensor x, tg_tensor y);
tg_tensor tg_rshift(tg_tensor x, tg_tensor y);
tg_tensor tg_pow(tg_tensor x, tg_tensor y);
/* where(cond, x, y): cond is cast to bool; x and y promote. */
tg_tensor tg_where(tg_tensor cond, tg_tensor x, tg_tensor y);
/* where with numbers (tinygrad's cond.where(x, 0), .where(1, y), .where(1, 0)): tg_where_s takes a
 * scalar y, tg_rwhere_s a scalar x, tg_where_ss both. A number next to a tensor branch follows the
 * Python-scalar rule below (an integral one keeps an integer tensor's dtype, a fractional one makes it
 * DEFAULT_FLOAT); two numbers give int32 when both are whole, else DEFAULT_FLOAT (a bool result needs
 * tg_cast). The shape is cond's broadcast with the tensor branch. */
tg_tensor tg_where_s(tg_tensor cond, tg_tensor x, double y);
tg_tensor tg_rwhere_s(tg_tensor cond, double x, tg_tensor y);
tg_tensor tg_where_ss(tg_tensor cond, double x, double y);

/* Scalar right operands with Python-scalar semantics: an integer-valued scalar keeps x's dtype, a
 * fractional scalar promotes an integer x to DEFAULT_FLOAT, as tinygrad does with Python numbers. */
tg_tensor tg_add_s(tg_tensor x, double y);
tg_tensor tg_sub_s(tg_tensor x, double y);
tg_tensor tg_rsub_s(double x, tg_tensor y); /* x - y */
tg_tensor tg_mul_s(tg_tensor x, double y);
tg_tensor tg_div_s(tg_tensor x, double y);
tg_tensor tg_rdiv_s(double x, tg_tensor y); /* x / y */
tg_tensor tg_pow_s(tg_tensor x, double y); /* an integer x needs y >= 0 or fractional (tinygrad) */
tg_tensor tg_maximum_s(tg_tensor x, double y);
tg_tensor tg_minimum_s(tg_tensor x, double y);
tg_tensor tg_lt_s(tg_tensor x, double y);
tg_tensor tg_gt_s(tg_tensor x, double y);
tg_tensor tg_eq_s(tg_tensor x, double y);
tg_tensor tg_ne_s(tg_tensor x, double y);
/* A 0-d constant with Python-scalar semantics relative to `like` (dtype and device of like). */
tg_tensor tg_const_like(tg_tensor like, double value);

/* Reductions over `axes` (naxes == 0: all axes). keepdim keeps reduced axes as size 1.
 * sum of bool/small ints accumulates in int32/uint32 (tinygrad's sum_acc_dtype). */
tg_tensor tg_sum(tg_tensor x, const int *axes, int naxes, bool keepdim);
tg_tensor tg_prod(tg_tensor x, const int *axes, int naxes, bool keepdim);
/* tinygrad's sum(dtype=) and prod(dtype=): x cast to dtype, reduced in it (no widening: an int8 sum
 * wraps in int8), the result in dtype. */
tg_tensor tg_sum_dtype(tg_tensor x, const int *axes, int naxes, bool keepdim, tg_dtype dtype);
tg_tensor tg_prod_dtype(tg_tensor x, const int *axes, int naxes, bool keepdim, tg_dtype dtype);
tg_tensor tg_max(tg_tensor x, const int *axes, int naxes, bool keepdim);
tg_tensor tg_min(tg_tensor x, const int *axes, int naxes, bool keepdim);
/* The mean keeps a float dtype; integer and bool input gives float32 (tinygrad's rule, whatever
 * DEFAULT_FLOAT says). */
tg_tensor tg_mean(tg_tensor x, const int *axes, int naxes, bool keepdim);
/* softmax and log_softmax along one axis. */
tg_tensor tg_softmax(tg_tensor x, int axis);
tg_tensor tg_log_softmax(tg_tensor x, int axis);

/* Movement ops: zero-copy views. */
/* One entry may be -1 (inferred). */
tg_tensor tg_reshape(tg_tensor x, const int64_t *shape, int ndim);
tg_tensor tg_permute(tg_tensor x, const int *order, int ndim);
/* Size-1 dimensions broadcast to the new size; -1 keeps a size; new leading dimensions allowed. */
tg_tensor tg_expand(tg_tensor x, const int64_t *shape, int ndim);
/* pads holds 2*ndim values: (before, after) for dim 0, dim 1, ... Negative values shrink. A value an
 * integer or bool x cannot hold makes the result wider, as in tinygrad: DEFAULT_FLOAT for 1.5, inf or
 * NaN, int32 for a bool padded with another whole number; a whole number past an integer dtype's
 * range wraps into it (uint8 padded with -1 holds 255), as tinygrad's and PyTorch's pads. */
tg_tensor tg_pad(tg_tensor x, const int64_t *pads, int npads, double value);
/* bounds holds 2*ndim values: (start, end) for each dim, 0 <= start <= end <= size. */
tg_tensor tg_shrink(tg_tensor x, const int64_t *bounds, int nbounds);
tg_tensor tg_flip(tg_tensor x, const int *axes, int naxes);
tg_tensor tg_transpose(tg_tensor x, int dim0, int dim1);
/* tinygrad's .T: tg_transpose(x, 1, 0), the first two dims swapped (a 3-d (2,3,4) gives (3,2,4), not
 * numpy's full reversal); x needs at least 2 dims. */
tg_tensor tg_T(tg_tensor x);
tg_tensor tg_flatten(tg_tensor x, int start_dim, int end_dim);
tg_tensor tg_unsqueeze(tg_tensor x, int dim);
tg_tensor tg_squeeze(tg_tensor x, int dim);
/* Every size-1 dim removed (tinygrad's squeeze() with no dim). */
tg_tensor tg_squeeze_all(tg_tensor x);
/* tinygrad's shrink_to / pad_to: each dim cut to (0, shape[i]) or padded at its end to shape[i] (with
 * value, as tg_pad); -1 keeps a dim. ndim must be x's. */
tg_tensor tg_shrink_to(tg_tensor x, const int64_t *shape, int ndim);
tg_tensor tg_pad_to(tg_tensor x, const int64_t *shape, int ndim, double value);

/* x[idx] (tinygrad's advanced indexing on dim 0): the rows of x chosen by the integer tensor idx (a
 * bool idx is an error, as in tinygrad: it is not a mask here);
 * shape idx.shape + x.shape[1:]. Negative indices count from the end; an index out of range reads
 * zeros (never memory outside x). One fused kernel with a data-dependent load; differentiable in x. */
tg_tensor tg_index(tg_tensor x, tg_tensor idx);
/* tinygrad's Tensor.sequential(ll): fns[0](x), then fns[1] of that, ... (ctxs[i] passed to fns[i];
 * ctxs may be NULL). Stops at the first none. */
typedef tg_tensor (*tg_layer_fn)(tg_tensor x, void *ctx);
tg_tensor tg_sequential(tg_tensor x, const tg_layer_fn *fns, void *const *ctxs, int n);
/* Matrix product of 2-D (or batched) tensors. */
tg_tensor tg_matmul(tg_tensor x, tg_tensor y);
/* tinygrad's matmul(dtype=) / dot(dtype=): the elementwise products (in the promoted dtype) are cast
 * to dtype and summed there, and the result has dtype (float16 sums accumulate in float32 inside the
 * kernel and round once, as tg_sum does). Where dtype is one the products should not wrap or round
 * before (integers into a wider integer or any float, 8- and 16-bit floats into float32 or float64)
 * the operands are widened to dtype first, as tinygrad 0.14 computes (int8 operands with TG_INT32 or
 * TG_FLOAT32 give the exact sums). TG_DTYPE_DEFAULT is the plain op. */
tg_tensor tg_matmul_dtype(tg_tensor x, tg_tensor y, tg_dtype dtype);

/* ---------------------------------------------------------------------------------------------- */
/* nn ops: movement, statistics, pooling and convolution, functional nn, losses                    */
/* Each is built from the primitive ops above the way tinygrad builds it, so it is lazy, fuses with
 * its neighbours and is differentiable by tg_backward. Results are new handles in the current scope;
 * inputs are never consumed. Optional tensor arguments take {0} (none) for "absent". */

/* Concatenates n tensors along dim (shapes equal except in dim; dtypes promote). Up to 32 inputs it is
 * one lazy expression that fuses into its consumer; more are concatenated in groups of 32 into
 * buffers first (about n / 31 kernels), so time and memory stay linear in the total size. */
tg_tensor tg_cat(const tg_tensor *ts, int n, int dim);
/* Stacks n equally shaped tensors along a new dimension dim (-ndim-1 <= dim <= ndim). */
tg_tensor tg_stack(const tg_tensor *ts, int n, int dim);
/* Tiles x: repeats[i] copies along dim i (nrepeats >= ndim; extra leading repeats add dims). */
tg_tensor tg_repeat(tg_tensor x, const int64_t *repeats, int nrepeats);
/* Splits x along dim into views. nsizes == 1: sizes[0] is a chunk size (the last piece may be
 * smaller; tinygrad's split(int)); otherwise sizes lists the pieces and must sum to the dim's size.
 * Returns the number of pieces and writes their handles to out, or -1 on error. out == NULL only
 * counts the pieces; otherwise out_cap must be at least that count. */
int tg_split(tg_tensor x, const int64_t *sizes, int nsizes, int dim, tg_tensor *out, int out_cap);
/* Splits x into at most `chunks` pieces of ceil(size / chunks) along dim (tinygrad's chunk; may return
 * fewer pieces). Returns the count and fills out as tg_split does. */
int tg_chunk(tg_tensor x, int chunks, int dim, tg_tensor *out, int out_cap);
/* out[i...] = x[..., index[i...], ...] along dim (torch.gather). index is an integer tensor with x's
 * ndim and index.shape[d] <= x.shape[d] for d != dim. Out-of-range indices give 0. */
tg_tensor tg_gather(tg_tensor x, int dim, tg_tensor index);
typedef struct {
  bool xy; /* false: "ij" indexing (default); true: "xy" (the first two outputs swap roles) */
} tg_meshgrid_opts;
#define TG_MESHGRID_OPTS(...) (&(const tg_meshgrid_opts){__VA_ARGS__})
/* Coordinate grids of n 0-d or 1-d tensors into out[0..n-1] (expanded views). */
tg_status tg_meshgrid(const tg_tensor *ts, int n, tg_tensor *out, const tg_meshgrid_opts *opts);

/* Variance over axes (naxes == 0: all) with divisor max(N - correction, 0) (tinygrad's default
 * correction is 1, Bessel's). Float result (float32 for integer input, as tg_mean). */
tg_tensor tg_var(tg_tensor x, const int *axes, int naxes, bool keepdim, double correction);
tg_tensor tg_std(tg_tensor x, const int *axes, int naxes, bool keepdim, double correction);
/* Both statistics at once (torch.var_mean / std_mean): two new handles into *var_out / *std_out and
 * *mean_out (none on error). */
tg_status tg_var_mean(tg_tensor x, const int *axes, int naxes, bool keepdim, double correction, tg_tensor *var_out, tg_tensor *mean_out);
tg_status tg_std_mean(tg_tensor x, const int *axes, int naxes, bool keepdim, double correction, tg_tensor *std_out, tg_tensor *mean_out);
/* log(sum(exp(x))) over axes, computed as max + log(sum(exp(x - max))). */
tg_tensor tg_logsumexp(tg_tensor x, const int *axes, int naxes, bool keepdim);
/* Index (int32) of the largest / smallest element along one axis (naxes == 1), or of the flattened
 * tensor (naxes == 0; keepdim then keeps every dim, of size 1, as PyTorch: tinygrad ignores it and
 * gives shape ()). Ties give the first index. */
tg_tensor tg_argmax(tg_tensor x, const int *axes, int naxes, bool keepdim);
tg_tensor tg_argmin(tg_tensor x, const int *axes, int naxes, bool keepdim);
/* Logical or / and over axes (bool result; any of nothing is false, all of nothing true). */
tg_tensor tg_any(tg_tensor x, const int *axes, int naxes, bool keepdim);
tg_tensor tg_all(tg_tensor x, const int *axes, int naxes, bool keepdim);
/* Running sum along axis (dtype as tg_sum's). One fused reduce kernel up to 64 elements; above,
 * cumsums of chunks of 16 plus the cumsum of the chunk totals (split the same way when long). An inf
 * or NaN reaches only the outputs at and after it. */
tg_tensor tg_cumsum(tg_tensor x, int axis);
/* Upper / lower triangle of the last two dims (others zeroed). diagonal 0 is the main diagonal,
 * positive is above it, negative below. */
tg_tensor tg_triu(tg_tensor x, int64_t diagonal);
tg_tensor tg_tril(tg_tensor x, int64_t diagonal);

/* Window options shared by pooling and convolution. Pairs are (height, width); a pair {v} (second
 * entry 0) means (v, v); {0, 0} (not a legal size) means the default. padding follows tinygrad: npadding 0 or 1 =
 * padding[0] on every side, 2 = (pad_h, pad_w) on both sides of each, 4 = (left, right, top,
 * bottom); negative padding crops. */
typedef struct {
  int64_t kernel_size[2]; /* default (2, 2) */
  int64_t stride[2];      /* default: kernel_size */
  int64_t dilation[2];    /* default (1, 1) */
  int64_t padding[4];
  int npadding;
  bool ceil_mode;   /* output size rounds up (the last window may hang over the edge) */
  bool exclude_pad; /* avg_pool2d: don't count padding in the divisor (torch count_include_pad=False) */
} tg_pool2d_opts;
#define TG_POOL2D_OPTS(...) TG_OPTS_WITH_(tg_pool2d_opts, .kernel_size = {2, 2}, .dilation = {1, 1}, __VA_ARGS__)
/* Pooling over the last two dims of x (..., H, W). max pads with the dtype's minimum. */
tg_tensor tg_max_pool2d(tg_tensor x, const tg_pool2d_opts *opts);
tg_tensor tg_avg_pool2d(tg_tensor x, const tg_pool2d_opts *opts);

typedef struct {
  int64_t groups;      /* default 1 */
  int64_t stride[2];   /* default (1, 1) */
  int64_t dilation[2]; /* default (1, 1) */
  int64_t padding[4];  /* as tg_pool2d_opts */
  int npadding;
  tg_dtype dtype; /* tinygrad's conv2d(dtype=): TG_DTYPE_DEFAULT as today; see tg_conv2d */
} tg_conv2d_opts;
#define TG_CONV2D_OPTS(...) TG_OPTS_WITH_(tg_conv2d_opts, .groups = 1, .stride = {1, 1}, .dilation = {1, 1}, __VA_ARGS__)
/* 2-D convolution (cross-correlation, as torch): x (batch, cin, H, W), weight (cout, cin/groups, kh,
 * kw), bias (cout,) or {0}. Windows are views of x (no im2col buffer): the convolution is one fused
 * reduce kernel. opts->dtype is tinygrad's conv2d(dtype=), the dtype of the final sum: the products
 * are made in the operands' promoted dtype, cast to dtype and summed there, except that a dtype the
 * products should not wrap or round before widens the operands first (as tg_matmul_dtype: an int8
 * convolution with dtype TG_INT32 makes exact products and sums them in int32), and the result
 * has dtype (then promoted with the bias's). float16 / bfloat16 operands computed in float32 (the
 * CPU) make exact products. TG_DTYPE_DEFAULT is the plain convolution: a float result has the
 * operands' promoted dtype, an integer or bool one the dtype its sum accumulates in (int8 -> int32,
 * uint8 -> uint32, bool -> int32, as tinygrad's conv2d and tg_sum). WINO honours it for TG_FLOAT32 / TG_FLOAT64 (the channel sums in dtype); other dtypes
 * run the direct convolution. */
tg_tensor tg_conv2d(tg_tensor x, tg_tensor weight, tg_tensor bias, const tg_conv2d_opts *opts);
/* N-d windows: tinygrad's conv2d, conv_transpose2d and pools take any number of spatial dims (the
 * trailing dims: a 1-d pool over (..., L), a 3-d convolution over (N, C, D, H, W)). tg_conv2d and
 * tg_conv_transpose2d accept such shapes too when stride, dilation and padding are uniform (one
 * value for every dim); the _nd functions below take one value per spatial dim, first dim first.
 * A per-dim array that is all zero means the default; only its first entry set means that value in
 * every dim; else give all nk entries. padding: npadding 0 or 1 = padding[0] on every side, nk =
 * one value per dim (both sides), 2*nk = (before, after) pairs from the LAST dim back (tinygrad's
 * and F.pad's order; for 2 dims (left, right, top, bottom)); negative padding crops. A field an op
 * does not use (kernel_size for a convolution, groups for a pool) must be zero. */
#define TG_WINDOW_MAXDIMS 8
typedef struct {
  int64_t kernel_size[TG_WINDOW_MAXDIMS]; /* pools: default 2 in every dim */
  int64_t stride[TG_WINDOW_MAXDIMS];      /* default: 1 (convolutions), kernel_size (pools) */
  int64_t dilation[TG_WINDOW_MAXDIMS];    /* default 1 */
  int64_t padding[2 * TG_WINDOW_MAXDIMS];
  int npadding;
  int64_t groups;                             /* convolutions: default 1 */
  int64_t output_padding[TG_WINDOW_MAXDIMS]; /* tg_conv_transpose_nd: extra size at the end of each dim */
  int noutput_padding;                       /* 0 or 1: output_padding[0] in every dim; nk: one per dim */
  bool ceil_mode;                            /* pools, as tg_pool2d_opts */
  bool exclude_pad;                          /* tg_avg_pool_nd, as tg_pool2d_opts */
  tg_dtype dtype;                            /* convolutions: the sum's dtype, as tg_conv2d_opts */
} tg_window_opts;
#define TG_WINDOW_OPTS(...) (&(const tg_window_opts){__VA_ARGS__})
/* Pooling over the trailing nk (1..TG_WINDOW_MAXDIMS) dims of x; tg_max_pool2d / tg_avg_pool2d are
 * nk = 2. max pads with the dtype's minimum. */
tg_tensor tg_max_pool_nd(tg_tensor x, int nk, const tg_window_opts *opts);
tg_tensor tg_avg_pool_nd(tg_tensor x, int nk, const tg_window_opts *opts);
/* Convolution (cross-correlation) with as many spatial dims as the weight has: x (batch, cin,
 * spatial...), weight (cout, cin/groups, kernel...), bias (cout,) or {0}. 1 and 2 spatial dims run as
 * tg_conv2d (its kernels and backward); more are tinygrad's window views times the weight, one
 * reduce kernel. */
tg_tensor tg_conv_nd(tg_tensor x, tg_tensor weight, tg_tensor bias, const tg_window_opts *opts);

/* tinygrad's Tensor.dot: the same as tg_matmul. */
tg_tensor tg_dot(tg_tensor x, tg_tensor w);
/* x @ weight.T + bias with weight (out_features, in_features), bias (out_features,) or {0}: the
 * convention of tinygrad's nn.Linear and torch's F.linear. A 1-d weight scales x elementwise. */
tg_tensor tg_linear(tg_tensor x, tg_tensor weight, tg_tensor bias);
/* tinygrad's dot(dtype=) (as tg_matmul_dtype) and linear(dtype=): x, weight and bias cast to dtype. */
tg_tensor tg_dot_dtype(tg_tensor x, tg_tensor w, tg_dtype dtype);
tg_tensor tg_linear_dtype(tg_tensor x, tg_tensor weight, tg_tensor bias, tg_dtype dtype);

/* int32 one-hot of integer labels: shape x.shape + (num_classes,). num_classes must be given (>= 0):
 * as in tinygrad, -1 is an error, since inferring the count would have to realize x. */
tg_tensor tg_one_hot(tg_tensor x, int64_t num_classes);
/* Normalizes over the last naxes dims: (x - mean) / sqrt(var + eps) (biased variance; no affine
 * parameters: multiply and add them yourself). tinygrad's default eps is 1e-5. */
tg_tensor tg_layernorm(tg_tensor x, int naxes, double eps);
/* (x - mean) * weight * invstd + bias over channel dim 1 of x (batch, C, ...). mean, weight, bias
 * have C elements; weight / bias may be {0}. invstd is (C,) or broadcasts against x. */
tg_tensor tg_batchnorm(tg_tensor x, tg_tensor weight, tg_tensor bias, tg_tensor mean, tg_tensor invstd);
/* tinygrad's batchnorm(axis=...): the same over any set of axes of x (tg_batchnorm is axes {1}).
 * mean, weight, bias have one element per position of the kept axes (reshaped to x's rank with 1s
 * elsewhere); invstd too when it has naxes dims, else it broadcasts against x as it is. */
tg_tensor tg_batchnorm_axes(tg_tensor x, tg_tensor weight, tg_tensor bias, tg_tensor mean, tg_tensor invstd,
                            const int *axes, int naxes);
/* Zeroes elements with probability p and scales the rest by 1/(1-p), only while the TRAINING
 * setting is non-zero (tg_context_set_int("TRAINING", 1), tinygrad's Context(TRAINING=1));
 * otherwise returns x unchanged (a new handle). While training, the random mask is computed when
 * tg_dropout is called (one small kernel), so the value and its gradient use the same mask. */
tg_tensor tg_dropout(tg_tensor x, double p);
typedef struct {
  bool is_causal;   /* mask out keys after the query position (top-left aligned, as torch) */
  double dropout_p; /* dropout on the attention weights (only while TRAINING) */
  bool enable_gqa;  /* grouped-query attention: key / value heads (dim -3) repeat to the query's count */
} tg_sdpa_opts;
#define TG_SDPA_OPTS(...) (&(const tg_sdpa_opts){__VA_ARGS__})
/* softmax(q @ k^T / sqrt(E) + mask) @ v for q (..., L, E), k (..., S, E), v (..., S, Ev). attn_mask
 * ({0} for none) broadcasts to (..., L, S): a bool mask keeps true positions, a float mask is added. */
tg_tensor tg_scaled_dot_product_attention(tg_tensor q, tg_tensor k, tg_tensor v, tg_tensor attn_mask, const tg_sdpa_opts *opts);

typedef enum { TG_REDUCTION_MEAN = 0, TG_REDUCTION_SUM, TG_REDUCTION_NONE } tg_reduction;
/* Loss options. A loss given an option it does not use reports an error. */
typedef struct {
  tg_reduction reduction;  /* default mean */
  double label_smoothing;  /* sparse_categorical_crossentropy, cross_entropy; in [0, 1] */
  bool use_ignore_index;   /* sparse_categorical_crossentropy, nll_loss: targets equal to */
  int64_t ignore_index;    /* ignore_index add nothing and don't count in the mean */
  tg_tensor weight;        /* nll_loss: per-class weights (C,) or {0} */
  tg_tensor pos_weight;    /* binary_crossentropy_logits: weight of positive examples or {0} */
} tg_loss_opts;
#define TG_LOSS_OPTS(...) (&(const tg_loss_opts){__VA_ARGS__})
/* -(y log x + (1 - y) log(1 - x)) for probabilities x; x and y broadcast. */
tg_tensor tg_binary_crossentropy(tg_tensor x, tg_tensor y, const tg_loss_opts *opts);
/* The same from logits, computed stably with log-sigmoid. */
tg_tensor tg_binary_crossentropy_logits(tg_tensor x, tg_tensor y, const tg_loss_opts *opts);
/* Cross-entropy of logits (..., C) (classes on the LAST dim, as tinygrad) against integer labels of
 * shape (...). Without use_ignore_index every label counts (tinygrad's ignore_index=-1 default). */
tg_tensor tg_sparse_categorical_crossentropy(tg_tensor logits, tg_tensor labels, const tg_loss_opts *opts);
/* torch's cross_entropy: logits (C,) or (N, C, ...) with classes on dim 1, target either integer
 * class indices (the shape without dim 1) or probabilities (the logits' shape). As tinygrad's, it has
 * no ignore_index or weight (use tg_nll_loss on tg_log_softmax for those). */
tg_tensor tg_cross_entropy(tg_tensor x, tg_tensor y, const tg_loss_opts *opts);
/* Negative log-likelihood of log-probabilities x (C,) or (N, C, ...) at integer targets (shape without
 * dim 1); with weight, the mean divides by the summed weights of the counted targets. */
tg_tensor tg_nll_loss(tg_tensor x, tg_tensor y, const tg_loss_opts *opts);

/* ---------------------------------------------------------------------------------------------- */
/* elementwise math and activations                                                                */

/* Composed from the primitive ops as tinygrad's Tensor composes them: each is lazy, fuses into the
 * surrounding kernel (sigmoid(x).sum() is one kernel) and is differentiable by tg_backward. */
/* Float functions: integer and bool inputs are cast to DEFAULT_FLOAT first; float16/bfloat16 inputs
 * compute in float32 and round once. The result is a new lazy handle in the current scope; none on
 * error (with tg_last_error naming the function). Values match PyTorch over the whole float range,
 * including +-inf, nan, denormals and large arguments (cos/tan of float32 compute in float64). */
tg_tensor tg_log10(tg_tensor x);
tg_tensor tg_rsqrt(tg_tensor x);      /* 1 / sqrt(x) */
tg_tensor tg_cos(tg_tensor x);
tg_tensor tg_tan(tg_tensor x);
tg_tensor tg_asin(tg_tensor x);       /* polynomial (A&S 4.4.46), |error| <= 2e-8; nan outside [-1, 1] */
tg_tensor tg_acos(tg_tensor x);
tg_tensor tg_atan(tg_tensor x);
tg_tensor tg_sinh(tg_tensor x);
tg_tensor tg_cosh(tg_tensor x);
tg_tensor tg_tanh(tg_tensor x);       /* 2 * sigmoid(2x) - 1 */
tg_tensor tg_asinh(tg_tensor x);
tg_tensor tg_acosh(tg_tensor x);      /* nan below 1 */
tg_tensor tg_atanh(tg_tensor x);      /* nan outside [-1, 1] */
tg_tensor tg_erf(tg_tensor x);        /* polynomial (A&S 7.1.26), |error| <= 1.5e-7 */
tg_tensor tg_sigmoid(tg_tensor x);    /* 1 / (1 + exp(-x)), gradient finite for every x */
tg_tensor tg_logsigmoid(tg_tensor x); /* -softplus(-x) */
tg_tensor tg_swish(tg_tensor x);      /* x * sigmoid(x) */
tg_tensor tg_silu(tg_tensor x);       /* same as tg_swish */
tg_tensor tg_quick_gelu(tg_tensor x); /* x * sigmoid(1.702 x) */
/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
tg_tensor tg_gelu(tg_tensor x);
tg_tensor tg_mish(tg_tensor x);       /* x * tanh(softplus(x)) */
tg_tensor tg_softsign(tg_tensor x);   /* x / (1 + |x|) */
tg_tensor tg_selu(tg_tensor x);       /* PyTorch's alpha = 1.6732632..., scale = 1.0507009... */
tg_tensor tg_elu(tg_tensor x, double alpha);     /* x > 0 ? x : alpha (exp(x) - 1); tinygrad default 1 */
tg_tensor tg_celu(tg_tensor x, double alpha);    /* x > 0 ? x : alpha (exp(x/alpha) - 1); alpha != 0 */
tg_tensor tg_softplus(tg_tensor x, double beta); /* log(1 + exp(beta x)) / beta; beta != 0 (default 1) */
/* log(exp(x) + exp(y)), broadcast; float result of the promoted dtype. */
tg_tensor tg_logaddexp(tg_tensor x, tg_tensor y);
tg_tensor tg_logaddexp_s(tg_tensor x, double y); /* y a Python number (typed as tg_const_like) */

/* Piecewise-linear activations keep x's dtype (a fractional parameter promotes an integer x to
 * DEFAULT_FLOAT, like a Python float). */
tg_tensor tg_relu6(tg_tensor x);                       /* min(max(x, 0), 6) */
tg_tensor tg_hardswish(tg_tensor x);                   /* x * relu6(x + 3) / 6 */
tg_tensor tg_hardsigmoid(tg_tensor x);                 /* relu6(x + 3) / 6 (PyTorch's alpha, beta) */
tg_tensor tg_leaky_relu(tg_tensor x, double neg_slope); /* x < 0 ? neg_slope x : x; tinygrad default 0.01 */
/* Clamps x to [min, max] (nan stays nan; min > max gives max everywhere). Pass -INFINITY / INFINITY
 * (or NAN) for a side without a bound: that side is then not applied, so an integer x keeps its
 * dtype. tg_clip is the same function; tg_hardtanh is the activation (tinygrad defaults -1, 1). */
tg_tensor tg_clamp(tg_tensor x, double min, double max);
/* tinygrad's clamp with tensor bounds: where(x < min, min, x), then where(> max, max, .); either bound
 * may be none (not both). Broadcasts and promotes as tg_where. */
tg_tensor tg_clamp_t(tg_tensor x, tg_tensor min, tg_tensor max);
tg_tensor tg_clip(tg_tensor x, double min, double max);
tg_tensor tg_hardtanh(tg_tensor x, double min_val, double max_val);

/* Same-dtype unary ops (any numeric dtype). */
tg_tensor tg_square(tg_tensor x); /* x * x */
/* -1, 0 or 1 in x's dtype (0 for nan, as PyTorch; unsigned: 0 or 1; bool: x). Gradient 0. */
tg_tensor tg_sign(tg_tensor x);
/* |x| (unsigned and bool: x; the most negative integer wraps to itself). Gradient sign(x). */
tg_tensor tg_abs(tg_tensor x);
/* Rounding of floats (integers and bools are returned unchanged); gradient 0. tg_round rounds half to
 * even (2.5 -> 2, 3.5 -> 4), as tinygrad and PyTorch do. */
tg_tensor tg_ceil(tg_tensor x);
tg_tensor tg_floor(tg_tensor x);
tg_tensor tg_round(tg_tensor x);

/* Predicates: bool results, any input dtype. */
tg_tensor tg_logical_not(tg_tensor x); /* x == 0 (nan counts as true, so its not is false) */
tg_tensor tg_isinf(tg_tensor x);       /* x == +inf or x == -inf */
tg_tensor tg_isnan(tg_tensor x);       /* x != x */
tg_tensor tg_isfinite(tg_tensor x);    /* neither inf nor nan */
/* tinygrad's argument forms of the ops above (opforms.c). */
/* gelu(approximate): "tanh" (tg_gelu; also NULL) or "none", the exact x/2 (1 + erf(x / sqrt 2)). */
tg_tensor tg_gelu_ex(tg_tensor x, const char *approximate);
/* gamma * (x >= 0 ? x : alpha (exp(x) - 1)); tinygrad's defaults are alpha 1.67326, gamma 1.0507. */
tg_tensor tg_selu_ex(tg_tensor x, double alpha, double gamma);
/* clamp(alpha x + beta, 0, 1), x's dtype as tg_hardsigmoid (which is alpha 1/6, beta 0.5). */
tg_tensor tg_hardsigmoid_ex(tg_tensor x, double alpha, double beta);
/* isinf(detect_positive, detect_negative): true where x is +inf (if detect_positive) or -inf (if
 * detect_negative); both false gives all false. */
tg_tensor tg_isinf_ex(tg_tensor x, bool detect_positive, bool detect_negative);
/* softmax / log_softmax with tinygrad's dtype argument: x - max(x) is cast to dtype (a float dtype)
 * before exp and sum, so the result has that dtype; TG_DTYPE_DEFAULT is the plain op. tg_softmin is
 * softmax(-x) with the same dtype argument. */
tg_tensor tg_softmax_dtype(tg_tensor x, int axis, tg_dtype dtype);
tg_tensor tg_log_softmax_dtype(tg_tensor x, int axis, tg_dtype dtype);
tg_tensor tg_softmin(tg_tensor x, int axis, tg_dtype dtype);
/* Lp normalization along dim (torch's F.normalize, tinygrad's normalize; defaults p 2, dim 1, eps
 * 1e-12): x / max(||x||_p, eps), where ||x||_0 counts the non-zero elements. p must be finite, >= 0. */
tg_tensor tg_normalize(tg_tensor x, double p, int dim, double eps);
/* tinygrad's newton_schulz: over the last two dims (a tall matrix works on its transpose), G = x /
 * (||x||_F + eps), then steps times G = sum_i coefs[i] (G G^T)^i G -- an odd polynomial that drives the
 * singular values towards 1 (Muon's orthogonalization; tinygrad's eps default 1e-7). steps in
 * 0..TG_NS_MAX_STEPS (1000), ncoefs in 1..TG_MUON_MAX_COEFS (8). */
tg_tensor tg_newton_schulz(tg_tensor x, int steps, const double *coefs, int ncoefs, double eps);

/* ~x for integers (two's complement), logical not for bool; error for floats. */
tg_tensor tg_bitwise_not(tg_tensor x);

/* x + (end - x) * weight, broadcast over all three; tg_lerp_s takes a scalar weight. A uint8 x with a
 * tensor weight uses tinygrad's fixed-point uint8 formula (a 7-bit weight; the result is uint8); other
 * integer inputs with a float weight lerp in that float (end - x cannot wrap). */
tg_tensor tg_lerp(tg_tensor x, tg_tensor end, tg_tensor weight);
tg_tensor tg_lerp_s(tg_tensor x, tg_tensor end, double weight);
/* |x| with the sign of y (-0.0 counts as negative); broadcast; result in the promoted dtype. */
tg_tensor tg_copysign(tg_tensor x, tg_tensor y);
/* y a Python number (typed as tg_const_like: copysign of an int32 x by -2 stays int32, by -2.5 is
 * DEFAULT_FLOAT; a bool x with a whole number gives int32). */
tg_tensor tg_copysign_s(tg_tensor x, double y);
/* C remainder, sign of x (PyTorch's fmod; tg_mod is Python's %). Integers exact (0 for y == 0);
 * floats x - trunc(x/y) * y as tinygrad, accurate while |x/y| < 2^24 (float32). */
tg_tensor tg_fmod(tg_tensor x, tg_tensor y);
/* y a Python number (typed as tg_const_like: a whole y keeps an integer x's dtype, wrapping into it as
 * tinygrad does, so uint8 x fmod 300 divides by 44; a fractional one makes x DEFAULT_FLOAT). */
tg_tensor tg_fmod_s(tg_tensor x, double y);

/* Division with a rounding mode (tinygrad's div(rounding_mode=...)). Integer / integer stays integer
 * for TRUNC and FLOOR (division by zero gives 0); otherwise true division, then trunc or floor. */
typedef enum {
  TG_DIV_TRUE = 0, /* same as tg_div */
  TG_DIV_TRUNC,    /* round toward zero */
  TG_DIV_FLOOR,    /* round toward -inf (Python //) */
} tg_div_rounding;
tg_tensor tg_div_mode(tg_tensor x, tg_tensor y, tg_div_rounding mode);
tg_tensor tg_floordiv(tg_tensor x, tg_tensor y); /* tg_div_mode(x, y, TG_DIV_FLOOR) */

/* Cast shorthands (tinygrad's .float(), .half(), ...): tg_cast to float32, float16, bfloat16,
 * float64, int32, int64, int16, bool. */
tg_tensor tg_float(tg_tensor x);
tg_tensor tg_half(tg_tensor x);
tg_tensor tg_bfloat16(tg_tensor x);
tg_tensor tg_double(tg_tensor x);
tg_tensor tg_int(tg_tensor x);
tg_tensor tg_long(tg_tensor x);
tg_tensor tg_short(tg_tensor x);
tg_tensor tg_bool(tg_tensor x);

/* ---------------------------------------------------------------------------------------------- */
/* comparison, scans, sorting, pooling indices, einsum, interpolation, sampling, linear algebra   */

/* Composed from the ops above as tinygrad composes them (src/tensor/processing.c): lazy, fused, and
 * differentiable by tg_backward where tinygrad's are. Results are new handles in the current scope.
 * Functions with several results write them to out-pointers and return a tg_status; on error every
 * out-pointer gets none. Index results are int32 (tinygrad's default int; PyTorch uses int64). */

/* |x - y| <= atol + rtol * |y| for finite elements, equal infinities, and nan with nan when equal_nan
 * (tinygrad's and torch's isclose; their defaults are rtol 1e-5, atol 1e-8). x and y broadcast;
 * integers are compared exactly in float64. Bool result. rtol, atol >= 0. */
tg_tensor tg_isclose(tg_tensor x, tg_tensor y, double rtol, double atol, bool equal_nan);
/* Whether every element is close (tg_all of tg_isclose; true for empty tensors). Realizes and writes
 * the answer to *out. (For a lazy 0-d bool tensor instead, use tg_all(tg_isclose(...), NULL, 0, 0).) */
tg_status tg_allclose(tg_tensor x, tg_tensor y, double rtol, double atol, bool equal_nan, bool *out);

/* Running scans along one axis, as tinygrad: identity-padded windows reduced in one kernel, two stages
 * above 512 elements. cumprod keeps tg_prod's dtype; its gradient divides by x (nan at zeros, as
 * tinygrad). logcumsumexp is log(sum_{j<=i} exp(x_j - m_i)) + m_i with m the running max (float result;
 * integers become DEFAULT_FLOAT). */
tg_tensor tg_cumprod(tg_tensor x, int axis);
tg_tensor tg_logcumsumexp(tg_tensor x, int axis);
/* Running max / min along axis into *values (x's dtype) and *indices (int32, may be NULL): the position
 * of the element that is the running extreme. Ties give the latest position, as torch (tinygrad gives
 * the earliest). The values are differentiable (ties split the gradient, as tg_max). */
tg_status tg_cummax(tg_tensor x, int axis, tg_tensor *values, tg_tensor *indices);
tg_status tg_cummin(tg_tensor x, int axis, tg_tensor *values, tg_tensor *indices);

/* tg_max_pool2d (same options, same values) that also returns, per output element, the flat index
 * h * W + w of the maximum inside its (H, W) plane (torch's return_indices; int32). Ties: the first
 * in row-major order, as torch. indices may be NULL. */
tg_status tg_max_pool2d_with_indices(tg_tensor x, const tg_pool2d_opts *opts, tg_tensor *values, tg_tensor *indices);
/* Partial inverse of max pooling (torch's max_unpool2d, tinygrad's): x (..., H, W) and integer
 * indices of x's shape into each (OH, OW) plane; every other output element is 0. output_size
 * (noutput >= 2; its last two entries are used) or NULL/0: (H-1)*stride - pad_before - pad_after +
 * dilation*(k-1) + 1 per dim, from opts (kernel_size, stride, dilation, padding as tg_max_pool2d). An
 * index out of range writes nothing; an index given several times (overlapping windows) receives the
 * largest of its values (they are equal when they come from max pooling, so this is torch's result;
 * tinygrad would add them) and they share its gradient. */
tg_tensor tg_max_unpool2d(tg_tensor x, tg_tensor indices, const tg_pool2d_opts *opts, const int64_t *output_size,
                          int noutput);

/* Einstein summation over n tensors (torch.einsum / tinygrad's Tensor.einsum): "ij,jk->ik",
 * implicit output ("ij,jk": the letters used once, sorted, uppercase first), repeated letters in one
 * operand take the diagonal ("ii->i", "ii" is the trace), "..." stands for the broadcast leading dims
 * ("...ij,...jk->...ik"). Letters a-z, A-Z; spaces are ignored. Sizes of one letter must match or be
 * 1 (broadcast). Operands are aligned to one alphabet, multiplied and summed in one fused kernel. */
tg_tensor tg_einsum(const char *formula, const tg_tensor *ts, int n);
/* tinygrad's einsum(dtype=): the product is cast to dtype before the summation; the result has dtype.
 * A dtype the products should not wrap or round before widens the operands first (by their promoted
 * dtype, as tg_matmul_dtype). */
tg_tensor tg_einsum_dtype(const char *formula, const tg_tensor *ts, int n, tg_dtype dtype);

typedef enum {
  TG_INTERP_LINEAR = 0,    /* linear along every resized dim (bilinear / trilinear for 2 / 3 dims) */
  TG_INTERP_NEAREST,       /* torch's "nearest": floor(i * in / out) */
  TG_INTERP_NEAREST_EXACT, /* torch's "nearest-exact": floor((i + 0.5) * in / out) */
  TG_INTERP_BILINEAR,      /* LINEAR, requiring nsize == 2 */
  TG_INTERP_TRILINEAR,     /* LINEAR, requiring nsize == 3 */
} tg_interp_mode;
typedef struct {
  tg_interp_mode mode; /* default linear */
  bool align_corners;  /* linear modes only: the corner pixels of input and output align */
} tg_interpolate_opts;
#define TG_INTERPOLATE_OPTS(...) (&(const tg_interpolate_opts){__VA_ARGS__})
/* Resizes the last nsize dims of x to size[0..nsize-1] (tinygrad's Tensor.interpolate; torch's
 * F.interpolate on (N, C, ...) with size=). One gather per dim; the result has x's dtype. Sizes and
 * the resized input dims must be positive. */
tg_tensor tg_interpolate(tg_tensor x, const int64_t *size, int nsize, const tg_interpolate_opts *opts);

/* Sorts along dim with tinygrad's bitonic network of lazy min/max ops (padded to a power of two;
 * about log2(n)^2 / 2 kernels) into *values and *indices (int32; either may be NULL). The indices are
 * stable: equal elements keep their original order, in both directions (torch's CPU sort does the
 * same). The values are differentiable. NaN is not supported (as tinygrad). */
tg_status tg_sort(tg_tensor x, int dim, bool descending, tg_tensor *values, tg_tensor *indices);
/* The indices of tg_sort. */
tg_tensor tg_argsort(tg_tensor x, int dim, bool descending);
/* The k largest (largest) or smallest elements along dim and their int32 indices (0 <= k <=
 * size): the first k of tg_sort, so always sorted (`sorted` false allows any order, and gives this
 * one), and among equal elements the earliest positions win (torch's topk may pick other ones).
 * k <= 64 (and below the size) is found by k rounds of selection, O(k * size) per row, with NaN
 * counting as the largest value as in torch (taken last when largest is false); larger k sorts. */
tg_status tg_topk(tg_tensor x, int64_t k, int dim, bool largest, bool sorted, tg_tensor *values, tg_tensor *indices);

/* num_samples int32 category indices per row of non-negative weights probs (K,) or (B, K) -> (n,) or
 * (B, n) (tinygrad's multinomial; draws from tg_rand, so tg_manual_seed makes it repeatable). With
 * replacement (or one sample): the number of entries of the normalized cumulative sum that are <= a
 * uniform draw. Without: Efraimidis-Spirakis, the top num_samples of log2(u) / w (n <= K; categories of
 * weight 0 come last). Weights are not checked (that would read the data): negative weights or a zero
 * row sum give meaningless indices. */
tg_tensor tg_multinomial(tg_tensor probs, int64_t num_samples, bool replacement);

/* QR decomposition of x (..., m, n) by Householder reflections (tinygrad's Tensor.qr): *q (..., m, m)
 * orthogonal and *r (..., m, n) upper triangular with x = q @ r (numpy's mode="complete"; the signs of
 * rows of r may differ from LAPACK's). Integer input becomes DEFAULT_FLOAT; fp8 input is decomposed in
 * float32 and the results are cast back to its dtype. */
tg_status tg_qr(tg_tensor x, tg_tensor *q, tg_tensor *r);
/* Singular value decomposition of x (..., m, n) = u @ diag(s) @ vt (tinygrad's Tensor.svd: QR, then
 * one-sided Jacobi on the k x k triangle, k = min(m, n), in rounds of k/2 parallel rotations). The
 * round count is fixed: (ceil(log2 k) + 4) * k (tinygrad's 4k rounds are too few from k ~ 8 in float64,
 * 16 in float32). *s (..., k) descending, *u (..., m, m) and *vt (..., n, n) orthogonal
 * (full_matrices), or u (..., m, k) and vt (..., k, n). Singular vectors are unique only up to sign
 * (and within repeated values). Integer input becomes DEFAULT_FLOAT; fp8 input is decomposed in float32
 * and the results are cast back to its dtype. */
tg_status tg_svd(tg_tensor x, bool full_matrices, tg_tensor *u, tg_tensor *s, tg_tensor *vt);

/* ---------------------------------------------------------------------------------------------- */
/* indexing: getitem / setitem, padding modes, movement, scatter, masks                            */

/* Built from the ops above the way tinygrad builds them (src/tensor/indexing.c): lazy, fused with
 * their neighbours, differentiable by tg_backward. Results are new handles in the current scope;
 * tensors passed in are BORROWED for the call. Errors name the function, the shapes and a hint. */

/* One entry of a Python index x[e0, e1, ...]. A zeroed entry is the full slice ":". */
typedef enum {
  TG_INDEX_SLICE = 0, /* start:stop:step over one dim (Python's slice semantics, clamped) */
  TG_INDEX_INT,       /* one position; the dim is removed. Negative counts from the end; out of range is an error */
  TG_INDEX_NEWAXIS,   /* None: a new dim of size 1 */
  TG_INDEX_ELLIPSIS,  /* ...: as many ":" as the other entries leave (at most one per index) */
  TG_INDEX_TENSOR,    /* an integer tensor (advanced indexing) */
} tg_index_kind;
typedef struct {
  tg_index_kind kind;
  int64_t index;             /* TG_INDEX_INT */
  int64_t start, stop, step; /* TG_INDEX_SLICE; step 0 means 1; a negative step walks backwards */
  bool has_start, has_stop;  /* false: that end is open (x[:3], x[2:], x[::-1]); start / stop ignored */
  tg_tensor tensor;          /* TG_INDEX_TENSOR */
} tg_index_spec;
/* Entry builders for C callers; TG_INDEX(...) expands to "array, count" like TG_SHAPE:
 * x[1, 2:5, ::-1, None, ..., idx] is tg_getitem(x, TG_INDEX(TG_IX_INT(1), TG_IX_SLICE(2, 5, 1),
 * TG_IX_STEP(-1), TG_IX_NEWAXIS, TG_IX_ELLIPSIS, TG_IX_TENSOR(idx))). */
#define TG_IX_INT(i) ((tg_index_spec){.kind = TG_INDEX_INT, .index = (i)})
#define TG_IX_SLICE(a, b, s) \
  ((tg_index_spec){.kind = TG_INDEX_SLICE, .start = (a), .stop = (b), .step = (s), .has_start = true, .has_stop = true})
#define TG_IX_FROM(a, s) ((tg_index_spec){.kind = TG_INDEX_SLICE, .start = (a), .step = (s), .has_start = true}) /* a::s */
#define TG_IX_TO(b, s) ((tg_index_spec){.kind = TG_INDEX_SLICE, .stop = (b), .step = (s), .has_stop = true})    /* :b:s */
#define TG_IX_STEP(s) ((tg_index_spec){.kind = TG_INDEX_SLICE, .step = (s)})                                   /* ::s */
#define TG_IX_ALL ((tg_index_spec){.kind = TG_INDEX_SLICE})                                                    /* : */
#define TG_IX_NEWAXIS ((tg_index_spec){.kind = TG_INDEX_NEWAXIS})
#define TG_IX_ELLIPSIS ((tg_index_spec){.kind = TG_INDEX_ELLIPSIS})
#define TG_IX_TENSOR(t) ((tg_index_spec){.kind = TG_INDEX_TENSOR, .tensor = (t)})
#define TG_INDEX(...) \
  ((const tg_index_spec[]){__VA_ARGS__}), ((int)(sizeof((const tg_index_spec[]){__VA_ARGS__}) / sizeof(tg_index_spec)))

/* x[spec[0], ..., spec[n-1]] with tinygrad's semantics. Ints, slices, None and ellipsis make a
 * zero-copy view (shrink, flip, pad + reshape + shrink for steps, reshape). Integer tensors index
 * their dims: negative values count from the end, values still out of range read 0 (no error, as
 * tinygrad). Several index tensors broadcast together; the broadcast dims replace the indexed dims
 * where the first one was if the tensor entries are adjacent (after int entries are removed),
 * otherwise they go first (numpy's rule, as tinygrad applies it). The indexed dims are gathered by
 * one fused data-dependent load (tg_index at the linearized index); differentiable in x. */
tg_tensor tg_getitem(tg_tensor x, const tg_index_spec *spec, int n);
/* x[spec...] = value (broadcast to the indexed shape, cast to x's dtype), as tinygrad's __setitem__.
 * x's handle is updated lazily to where(mask, value placed in x's shape, x); how the write lands
 * depends on x's storage, as in tinygrad:
 *  - x has storage (its own buffer, realized): x is tg_assign'ed, the write happens when x is
 *    realized (read x, or tg_realize).
 *  - x is a view (getitem, transpose, reshape, flip, pad, ... of a tensor with storage): the write
 *    lands in that tensor's storage, and every handle of it sees it: t.T[1,0] = 5, t[::-1][0] = 5,
 *    t[1][2] = 5 and t[:3] *= 10 (setitem of the view with view * 10) all change t. A view that
 *    broadcasts (tg_expand) is refused.
 *  - x has no storage yet (a lazy value, or a view of one): only x's handle changes (a view does not
 *    write its base, as in tinygrad), and the update is differentiable: the gradient reaches value
 *    and the part of x not written. (An integer x with index tensors is assigned as above.)
 * With index tensors, out-of-range indices write nothing and when one position is indexed several
 * times the last one (row-major) wins. */
tg_status tg_setitem(tg_tensor x, const tg_index_spec *spec, int n, tg_tensor value);
tg_status tg_setitem_s(tg_tensor x, const tg_index_spec *spec, int n, double value);

typedef enum {
  TG_PAD_CONSTANT = 0, /* fill with value (tg_pad) */
  TG_PAD_REFLECT,      /* mirror without repeating the edge: pads must be < the dim's size */
  TG_PAD_REPLICATE,    /* repeat the edge element */
  TG_PAD_CIRCULAR,     /* wrap around: pads at most the dim's size (after negative pads shrink it) */
} tg_padding_mode;
/* Pads (before, after) pairs for the LAST npads/2 dims, in dim order (npads even, at most 2*ndim:
 * {1, 2} pads the last dim, {0, 0, 1, 1} the last two). Negative pads remove elements (for reflect
 * and replicate after the padding, for circular before it, as tinygrad). value is for
 * TG_PAD_CONSTANT only. Built from slices, flips, expands and cat: a view-only graph. */
tg_tensor tg_pad_mode(tg_tensor x, const int64_t *pads, int npads, tg_padding_mode mode, double value);

/* "No dim": tg_repeat_interleave of the flattened tensor (tinygrad's dim=None). */
#define TG_DIM_NONE INT32_MIN
/* Each element repeated `repeats` times along dim ([1, 2] -> [1, 1, 2, 2]); TG_DIM_NONE flattens first. */
tg_tensor tg_repeat_interleave(tg_tensor x, int64_t repeats, int dim);
/* Windows of `size` elements every `step` along dim (torch's Tensor.unfold): dim becomes
 * (size(dim) - size) / step + 1 windows and a new last dim of `size` is appended. A view. */
tg_tensor tg_unfold(tg_tensor x, int dim, int64_t size, int64_t step);
/* Splits dim into sizes (one of them may be -1). */
tg_tensor tg_unflatten(tg_tensor x, int dim, const int64_t *sizes, int nsizes);
/* 1-d (n,) -> (n, n) with x on the diagonal. */
tg_tensor tg_diag(tg_tensor x);
/* The diagonal of the (dim1, dim2) planes as a view: those dims are removed and the diagonal becomes
 * the last dim. offset > 0 above the main diagonal, < 0 below. */
tg_tensor tg_diagonal(tg_tensor x, int64_t offset, int dim1, int dim2);
/* Circular shift by shifts[i] along dims[i] (ndims == nshifts); ndims == 0: the flattened tensor by
 * shifts[0], reshaped back (torch.roll without dims). */
tg_tensor tg_roll(tg_tensor x, const int64_t *shifts, int nshifts, const int *dims, int ndims);

/* einops' rearrange: "b c h w -> b (h w) c", "b (h p) -> b h p" (with sizes {"p", 2}), "... c -> c
 * ...", "1" for a size-1 dim ("h w -> 1 h w"). Axis names are identifiers not starting or ending with
 * _; parentheses do not nest; one ellipsis at most (never inside parentheses on the left). sizes
 * names axes of the left side (needed when a group has more than one unknown size). Reshape +
 * permute + reshape: a view. */
typedef struct {
  const char *name;
  int64_t size;
} tg_axis_size;
tg_tensor tg_rearrange(tg_tensor x, const char *formula, const tg_axis_size *sizes, int nsizes);

/* where(mask, value, x): mask is bool, broadcast with x (and value); the dtype is promoted as
 * tg_where does (tg_masked_fill_s: a Python-scalar value, so x keeps its dtype for an integral one). */
tg_tensor tg_masked_fill(tg_tensor x, tg_tensor mask, tg_tensor value);
tg_tensor tg_masked_fill_s(tg_tensor x, tg_tensor mask, double value);
/* The elements of x where the bool mask (broadcast to x's shape) is true, row-major, as a new 1-d
 * tensor. REALIZES the mask to know the count, then gathers (one fused kernel; differentiable in x). */
tg_tensor tg_masked_select(tg_tensor x, tg_tensor mask);
/* The indices of the non-zero elements (nan counts as non-zero), shape (count, ndim), int32 (as in
 * tinygrad), row-major order (torch.nonzero). REALIZES x. */
tg_tensor tg_nonzero(tg_tensor x);
/* tinygrad's masked_select(mask, size, fill_value) and nonzero(size, fill_value): the same selections
 * with a fixed length, so nothing is realized (they can be captured by TinyJit). The first size
 * selected elements (masked_select: x's dtype, shape (size,)) or indices (nonzero: int32, shape (size,
 * ndim), as tinygrad), padded with fill_value (converted to the result's dtype) when there are fewer.
 * Costs one size x numel compare-and-count reduce. masked_select is differentiable in x. */
tg_tensor tg_masked_select_size(tg_tensor x, tg_tensor mask, int64_t size, double fill_value);
tg_tensor tg_nonzero_size(tg_tensor x, int64_t size, double fill_value);

/* out = x with src[i][j][k] written at out[index[i][j][k]][j][k] (dim 0; likewise for other dims),
 * torch's scatter. index, src and x have the same ndim; index.shape[d] <= src.shape[d] for every d
 * and <= x.shape[d] for d != dim; src has x's dtype. Indices outside [0, x.shape[dim]) (negative ones
 * too, as tinygrad) write nothing; a target written several times keeps the last (row-major) value.
 * Built from one-hot masks over the target dim (index.shape[dim] x x.shape[dim] compares per
 * element). Differentiable in x and src. tg_scatter_s writes a scalar. */
tg_tensor tg_scatter(tg_tensor x, int dim, tg_tensor index, tg_tensor src);
tg_tensor tg_scatter_s(tg_tensor x, int dim, tg_tensor index, double value);
typedef enum { TG_SCATTER_SUM = 0, TG_SCATTER_PROD, TG_SCATTER_MEAN, TG_SCATTER_AMAX, TG_SCATTER_AMIN } tg_scatter_reduce_op;
/* torch's scatter_reduce: every target combines the src values scattered to it (and its own value
 * when include_self) with sum, prod, mean, amax or amin; targets nothing is scattered to keep x's
 * value. The result has x's dtype (an integer mean rounds toward -inf, as torch). Differentiable in x
 * and src (amax / amin split the gradient between ties). */
tg_tensor tg_scatter_reduce(tg_tensor x, int dim, tg_tensor index, tg_tensor src, tg_scatter_reduce_op reduce,
                            bool include_self);
/* tinygrad's scatter(dim, index, value, reduce="add" / "multiply") takes a scalar value only (with a
 * tensor src it refers to scatter_reduce) and is tg_scatter_reduce(x, dim, index, tg_full_like(index,
 * value, TG_OPTS(.dtype = tg_dtype_of(x))), TG_SCATTER_SUM / TG_SCATTER_PROD, true): the value cast to
 * x's dtype first (an int32 x adds 1 for 1.5), each target combined with x's value and every write. */

/* Size of one element in bytes (torch's element_size), numel * that (nbytes); -1 on error. */
int64_t tg_element_size(tg_tensor x);
int64_t tg_nbytes(tg_tensor x);
/* True for float16, bfloat16, float32 and float64 tensors (false with an error for a bad handle). */
bool tg_is_floating_point(tg_tensor x);
/* The identity in the forward pass; in the backward pass the gradient flowing through it is made
 * contiguous (materialized) before it goes on (tinygrad's contiguous_backward). */
tg_tensor tg_contiguous_backward(tg_tensor x);

/* ---------------------------------------------------------------------------------------------- */
/* autograd                                                                                        */

/* requires_grad has tinygrad's three states: unset (TG_GRAD_UNSET, every new tensor's), true and
 * false. true marks a leaf: tensors computed from it and realized keep the graph for a later
 * tg_backward, and a realized one stops the backward pass there. false keeps tg_backward from
 * filling t's gradient (the gradient still flows through t to what it was computed from). An
 * optimizer turns unset parameters into true ones (tinygrad's Optimizer). Gradients accumulate:
 * each tg_backward adds to every reached tensor's gradient until tg_zero_grad, so a tensor kept
 * across training steps with requires_grad unset (a dataset held in one tensor) gathers a longer
 * graph every step: create it with TG_OPTS(.requires_grad = false). A creation marked true (tg_zeros,
 * tg_ones, tg_full, ... not yet realized) is realized at once into a buffer of its own: equal
 * creations are one lazy node, and each must be its own leaf. Returns t (none if that realize fails). */
tg_tensor tg_set_requires_grad(tg_tensor t, bool requires_grad);
/* True only when requires_grad was set true (unset and false read false). */
bool tg_requires_grad(tg_tensor t);
/* Reverse-mode differentiation of a scalar float loss. As in tinygrad, every live float tensor in the
 * loss's graph that is not marked requires_grad false (the loss itself, intermediates, clones,
 * views, leaves) gets d loss / d t added to its gradient (gradients accumulate until tg_zero_grad).
 * Tensors already realized (read with tg_data/tg_item, or tg_realize'd) on the way still pass the
 * gradient through the graph that computed them when it reaches a requires_grad true leaf: the loss
 * may be read before its backward pass. Gradients are lazy: they realize when read or when
 * tg_realize is called on tg_grad(t). Error if the loss is not a scalar or no tensor in its graph can
 * take a gradient. */
tg_status tg_backward(tg_tensor loss);
/* tinygrad's t.backward(gradient): as tg_backward from a tensor of any shape, starting from the
 * upstream gradient d L / d t (t's shape and device, cast to t's dtype; no gradient flows into it).
 * gradient {0} is tg_backward. */
tg_status tg_backward_with_grad(tg_tensor t, tg_tensor gradient);
/* A new handle to t's accumulated gradient, or none (with no error) if it has none. */
tg_tensor tg_grad(tg_tensor t);
/* Drops t's gradient. */
void tg_zero_grad(tg_tensor t);
/* Replaces t's gradient (none clears it). Shapes must match. */
tg_status tg_set_grad(tg_tensor t, tg_tensor grad);
/* d loss / d targets[i] into out[i] (new handles) without touching any tensor's gradient; any
 * tensor may be a target, whatever its requires_grad. A float target that the loss reads only
 * through non-differentiable ops (a where condition, the sign of copysign, a comparison) gets zeros,
 * as in tinygrad. Error if a target is not float or is not part of the loss's graph at all. */
tg_status tg_gradient(tg_tensor loss, const tg_tensor *targets, int n, tg_tensor *out);
/* tinygrad's t.gradient(*targets, gradient=...): tg_gradient from a tensor of any shape, starting
 * from the upstream gradient (as tg_backward_with_grad; {0} is tg_gradient). */
tg_status tg_gradient_with_grad(tg_tensor t, tg_tensor gradient, const tg_tensor *targets, int n, tg_tensor *out);

/* ---------------------------------------------------------------------------------------------- */
/* state dicts and model files: safetensors, GGUF, tar                                             */

/* A named-tensor dictionary (tinygrad's state_dict: an ordered {name: Tensor}) plus string metadata
 * (safetensors' __metadata__, GGUF key/values). Every loader returns one; tg_safe_save writes one.
 * The dict owns one root-scope handle per entry (it survives tg_scope_end) and frees them in
 * tg_state_dict_free; handles it returns are BORROWED: valid until the entry is replaced or the dict
 * is freed (tg_detach one to get a handle of your own). Names and values are copied. Not
 * thread-safe: use one dict from one thread at a time. */
typedef struct tg_state_dict tg_state_dict;
/* An empty dict; free with tg_state_dict_free. NULL only if out of memory. */
tg_state_dict *tg_state_dict_new(void);
/* Frees the dict, its names, its metadata and the handles it owns (NULL is a no-op). For a dict from
 * tg_safe_load_mmap, also drops the dict's share of the file mapping: see there. */
void tg_state_dict_free(tg_state_dict *sd);
/* Number of tensors (0 for NULL). */
int tg_state_dict_len(const tg_state_dict *sd);
/* Name / tensor of entry i in insertion (file) order; NULL / none if i is out of range. Borrowed. */
const char *tg_state_dict_name(const tg_state_dict *sd, int i);
tg_tensor tg_state_dict_tensor(const tg_state_dict *sd, int i);
/* The tensor named `name` (borrowed). A missing name returns none and records TG_ERR_INVALID
 * "tg_state_dict_get: no tensor named 'x' (did you mean 'y'?)", with the closest name (by edit
 * distance), so a wrong weight name is reported where it is asked for. */
tg_tensor tg_state_dict_get(const tg_state_dict *sd, const char *name);
/* True if the dict has a tensor named `name` (false for NULL); never records an error. */
bool tg_state_dict_has(const tg_state_dict *sd, const char *name);
/* Casts every floating-point entry (float16, bfloat16, float32, float64) to the floating-point dtype
 * `dtype`, realized, in place (tinygrad: {k: v.cast(dtype) for k, v in state_dict.items()}); integer
 * and bool entries (indices, counters such as num_batches_tracked) keep their dtype. Loaders keep each
 * tensor's dtype from the file, and DEFAULT_FLOAT changes only what creation functions make, so this
 * is the one call that turns a float32 checkpoint into a half model. Handles borrowed from the dict
 * before the call are replaced (they go stale). Errors: NULL dict, a dtype that is not floating. */
tg_status tg_state_dict_cast(tg_state_dict *sd, tg_dtype dtype);
/* Stores t under name: the dict takes a new root-scope handle of t's value (the caller's handle is
 * untouched, so the entry's lifetime is independent of the caller's scopes). An existing name is
 * replaced in place (keeping its position; the old entry's handle is freed). Lazy tensors are stored
 * lazily. The entry's handle is marked requires_grad false (gradients go to t's own handle, not to
 * this alias). Errors: NULL dict or name, empty name, invalid t. */
tg_status tg_state_dict_set(tg_state_dict *sd, const char *name, tg_tensor t);
/* Metadata: string key/value pairs in insertion order. set replaces an existing key's value. get
 * returns the value (borrowed) or NULL if absent (no error). key / value give entry i (NULL if out of
 * range). */
tg_status tg_state_dict_meta_set(tg_state_dict *sd, const char *key, const char *value);
const char *tg_state_dict_meta_get(const tg_state_dict *sd, const char *key);
int tg_state_dict_meta_len(const tg_state_dict *sd);
const char *tg_state_dict_meta_key(const tg_state_dict *sd, int i);
const char *tg_state_dict_meta_value(const tg_state_dict *sd, int i);

/* Loads a .safetensors file (tinygrad's safe_load): every tensor in the file's dtype and shape, copied
 * into realized tensors on the default device, in header order; __metadata__ goes to the dict's
 * metadata. All 13 dtypes (BOOL U8 I8 I16 U16 I32 U32 I64 U64 F16 BF16 F32 F64) are supported. The
 * header is validated strictly: JSON syntax, UTF-8, at most 100 MB, known dtype names, integer shapes,
 * sizes = numel * itemsize, byte ranges that cover the data section exactly (no overlap, no hole, no
 * trailing bytes), no duplicate names. Returns a new dict the caller frees, or NULL with a TG_ERR_IO
 * error naming the function, the file and the problem. Like every file loader (tg_gguf_load,
 * tg_tar_extract, tg_torch_load, tg_idx_load), it reads regular files only: a FIFO, a device or a
 * socket is refused ("<path> is not a regular file (a FIFO)") without being read or waited on.
 * Like every copying loader it reads the file with read/pread and never maps it, so a file that
 * another process truncates or rewrites during the load gives a TG_ERR_IO error ("the file shrank
 * ... while it was read"), never a crash; the tensors own their bytes, so later changes to the file
 * do not reach them. It reads the header, then each tensor into its own buffer: the peak memory is
 * the tensors plus the largest one (tg_gguf_load, tg_torch_load and tg_tar_extract read the file into
 * memory and give its pages back as they copy each tensor out, so theirs stays near the file's
 * size). */
tg_state_dict *tg_safe_load(const char *path);
/* The same without copying: the file is mapped privately (copy-on-write) and each tensor whose offset
 * is aligned for its dtype wraps the mapping (tg_from_blob; misaligned ones are copied). The mapping is
 * shared by the dict and every buffer that wraps it, and unmapped when the last of them goes: the
 * dict's entries, handles detached from them and lazy results not yet realized stay valid after
 * tg_state_dict_free. tg_assign to an entry changes the mapped pages only, never the file. CPU devices
 * only. If the file changes: the load reads the header with pread and checks the file's size before
 * it touches the mapping, so a file truncated before or during the load is a TG_ERR_IO error. After
 * the load the tensors ARE the file's pages: a page not yet written through a tensor shows what the
 * file holds now (another process's rewrite shows through), and reading a tensor whose pages a
 * truncation removed raises SIGBUS -- the kernel's rule for mappings, which a library cannot turn
 * into an error. Keep the file unchanged while tensors from it live, or use tg_safe_load when another
 * process may change it. */
tg_state_dict *tg_safe_load_mmap(const char *path);
/* Writes the dict as .safetensors (tinygrad's safe_save): tensors in dict order, realized and made
 * contiguous as needed, the dict's metadata as __metadata__; names and metadata must be valid UTF-8
 * and no tensor may be named "__metadata__". Atomic: writes a temporary file in the same directory,
 * fsyncs it and renames it over path (keeping a replaced file's permissions, and its owner and group
 * where the process may set them), so on any failure an existing file at path is left untouched and
 * no temporary file remains. A file the process may not write (made read-only) is refused, as
 * open(path, "w") refuses it; a hard link to the old file keeps the old contents. A symbolic link at path is
 * followed: the file it leads to is replaced (the temporary file is made next to that file) and the
 * link stays; a link to a missing file creates that file. Only regular files are replaced: if path
 * (or the file its links lead to) is a directory, a FIFO, a device or a socket, the save fails with
 * TG_ERR_IO "tg_safe_save: <path> is not a regular file (...)" and touches nothing. The temporary
 * file is "<path>.tmp.<pid>.<n>"; a process killed mid-save leaves its one behind, and the next save
 * to the same path removes every such file whose process no longer exists (never one of a live
 * process: a save in progress elsewhere keeps its file). */
tg_status tg_safe_save(const tg_state_dict *sd, const char *path);

/* Loads a GGUF file (versions 2 and 3; tinygrad's gguf_load). Metadata: every key/value in file
 * order, rendered as text: integers in decimal, floats in the shortest decimal that reads back
 * exactly, bools "true"/"false", strings as they are, arrays in full as JSON-style lists ("[1, 2]",
 * "[\"a\", \"b\"]", nested arrays nested). general.alignment is honoured. Tensors come back
 * realized with their GGUF dims reversed (row-major, as tinygrad and PyTorch see them; at most 8
 * dims): F32, F16, BF16, F64, I8, I16, I32, I64 keep their dtype; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q5_K, Q6_K and MXFP4 are dequantized to float32 exactly as ggml does. Other types, duplicate
 * keys or names, misaligned / overlapping / out-of-range data are errors. Returns a new dict, or NULL
 * with a TG_ERR_IO error naming the function, the file and the problem. */
tg_state_dict *tg_gguf_load(const char *path);

/* Extracts an uncompressed tar archive (tinygrad's tar_extract; ustar, GNU long names and base-256
 * sizes, POSIX pax "path"/"size" records) into a dict of 1-D uint8 tensors named by member path as
 * Python's tarfile names them, in archive order; a later member with the same name replaces the
 * earlier one. Directories, links and other non-regular members are skipped. Checksums, sizes and
 * the archive's length are validated; a compressed file is rejected with a hint. Returns a new dict,
 * or NULL with a TG_ERR_IO error. */
tg_state_dict *tg_tar_extract(const char *path);

/* ---------------------------------------------------------------------------------------------- */
/* PyTorch checkpoints, IDX files, datasets                                                        */

/* Loads a PyTorch checkpoint written by torch.save (tinygrad's torch_load): the zip format (the
 * default) or the legacy format (_use_new_zipfile_serialization=False), pickle protocols 1 to 5
 * (protocol 0, which torch.load cannot read either, is an error saying so). NOTHING IN THE FILE IS
 * EXECUTED: the pickle is read by a restricted unpickler that only accepts the names needed to
 * rebuild tensors (collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_parameter[_
 * with_state], torch._tensor._rebuild_from_type_v2, the torch.<X>Storage types, and the values
 * torch.load(weights_only=True) takes: torch.Size (its tuple) and the torch.<dtype> names); any other global
 * (os.system, builtins.eval, a model class, numpy) is an error "tg_torch_load: <path>: pickle
 * references forbidden global 'os.system'; only tensors can be loaded" (save model.state_dict()).
 * Every reachable tensor comes back realized, contiguous, in its dtype (float32/64, float16,
 * bfloat16, int8/16/32/64, uint8, bool; views with strides and storage offsets are materialized
 * row-major; requires_grad is not restored), on the default device, named by its path joined with dots: {"model": {"fc.weight": t}} gives "model.fc.weight",
 * list items are named by index, a tuple key by its repr ("(1, 2)"), a bare torch.save(tensor) gives "tensor". A tensor reachable under
 * several names (shared objects) is stored under each. Other values on the way (an epoch number,
 * hyper-parameters) become metadata text in Python repr style (a str stays plain), at most 4 KiB
 * each. Limits against hostile files: nesting depth 100, names of 4096 bytes, views that repeat
 * storage elements may materialize at most 8x the storage bytes + 64 MiB. Returns a new dict the
 * caller frees, or NULL with a TG_ERR_IO error naming the file and the problem. */
tg_state_dict *tg_torch_load(const char *path);

/* ---------------------------------------------------------------------------------------------- */
/* ONNX models (tinygrad's nn.onnx OnnxRunner)                                                     */

/* A loaded ONNX model: its weights as tensors and its graph, ready to run. Opaque; free with
 * tg_onnx_free. One model may be run any number of times (not from two threads at once). */
typedef struct tg_onnx tg_onnx;
/* Loads an .onnx file (a protobuf ModelProto, read by the library's own bounds-checked decoder; no
 * onnx or protobuf library is needed). Initializers and Constant nodes become realized tensors on
 * `device` (NULL: the default device) once, here; raw_data and the typed float_data / int32_data /
 * int64_data / double_data / uint64_data fields are read. Checked before anything runs: every op is
 * supported (docs/DESIGN.md lists them; an unsupported one is an error naming the op and the node),
 * every name a node reads is defined exactly once, the graph has no cycle (nodes may come in any
 * order), tensors' dims match their data. Weights in an external data file, sparse initializers,
 * subgraphs (If, Loop, Scan) and non-default domains are refused. Returns a new model, or NULL with
 * a TG_ERR_IO error "tg_onnx_load: <path>: <what> (at byte N)" (the field and a hint). */
tg_onnx *tg_onnx_load(const char *path, const char *device);
/* Frees the model and its weight tensors. Tensors returned by tg_onnx_run stay valid. NULL is a no-op. */
void tg_onnx_free(tg_onnx *m);
/* The graph's inputs (initializers listed as inputs by old exporters excluded) and outputs, in the
 * file's order. Counts are -1 for a NULL model. Names are owned by the model. The dtype is
 * TG_DTYPE_DEFAULT where the file does not say. _shape writes up to cap dims into out (may be NULL)
 * and returns the rank, -2 when the file gives no shape, -1 on error; a dynamic dim (a dim_param
 * such as "batch", or none) is -1, and tg_onnx_input_dim_param names it (NULL if unnamed). */
int tg_onnx_input_count(const tg_onnx *m);
int tg_onnx_output_count(const tg_onnx *m);
const char *tg_onnx_input_name(const tg_onnx *m, int i);
const char *tg_onnx_output_name(const tg_onnx *m, int i);
tg_dtype tg_onnx_input_dtype(const tg_onnx *m, int i);
tg_dtype tg_onnx_output_dtype(const tg_onnx *m, int i);
int tg_onnx_input_shape(const tg_onnx *m, int i, int64_t *out, int cap);
int tg_onnx_output_shape(const tg_onnx *m, int i, int64_t *out, int cap);
const char *tg_onnx_input_dim_param(const tg_onnx *m, int i, int dim);
/* Runs the graph on inputs[0..nin) (the graph's input order; BORROWED) and writes one NEW lazy
 * tensor per graph output into outputs[0..nout) (the caller's scope owns them: tg_realize or read
 * them; nothing is realized here except where a shape argument is only known as tensor data).
 * nin and nout must equal the counts; each input's dtype, rank and static dims must match the
 * file's, and inputs sharing a named dim must agree on it. Small integer tensors that compute shapes
 * (Shape -> Gather -> Concat -> Reshape) are evaluated on the host, so a model runs inside tg_jit.
 * Errors name the node and op ("tg_onnx_run: node 'x' (Reshape): ..."); outputs are then {0}. */
tg_status tg_onnx_run(tg_onnx *m, const tg_tensor *inputs, int nin, tg_tensor *outputs, int nout);

/* Loads an IDX file (the MNIST format; gzip-compressed files are read transparently; regular files
 * only, as for tg_safe_load): a big-endian header 00 00 <type> <ndim>, ndim big-endian uint32 dims,
 * then the data. Types: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64
 * (the tensor's dtype). The data must be exactly what the dims declare (shorter or longer is an
 * error). Returns a new realized tensor in the current scope, or none with a TG_ERR_IO error naming
 * the file and the problem. */
tg_tensor tg_idx_load(const char *path);

/* MNIST as tinygrad's nn.datasets.mnist(): *X_train (60000, 1, 28, 28) uint8, *Y_train (60000,)
 * uint8, *X_test (10000, 1, 28, 28), *Y_test (10000,), new handles in the current scope. `dir` holds
 * train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
 * t10k-labels-idx1-ubyte, each optionally with .gz (any image count N works, as long as images and
 * labels agree, and every label is a class 0..9: another value is TG_ERR_IO naming it). dir NULL with fashion = true reads Fashion-MNIST from Debian's dataset-fashion-mnist
 * package (/usr/share/datasets/fashion-mnist); the original MNIST has no Debian package, so dir NULL
 * with fashion = false is an error asking for a directory. On error all four outputs are none. */
tg_status tg_mnist_load(const char *dir, bool fashion, tg_tensor *X_train, tg_tensor *Y_train, tg_tensor *X_test,
                        tg_tensor *Y_test);
/* CIFAR-10 as tinygrad's nn.datasets.cifar(device): *X_train (50000, 3, 32, 32) uint8, *Y_train
 * (50000,) uint8 (tinygrad's dtypes: the label bytes), *X_test (10000, 3, 32, 32), *Y_test (10000,),
 * new realized handles in the current scope, on `device` (NULL: the default device). Nothing is
 * downloaded: `path` is cifar-10-binary.tar.gz (what tinygrad fetches: data_batch_1.bin ..
 * data_batch_5.bin and test_batch.bin of 3073-byte records, a label byte and 3072 pixel bytes) or
 * cifar-10-python.tar.gz (data_batch_1 .. 5 and test_batch, pickled dicts whose b'data' is a (N,
 * 3072) uint8 numpy array and b'labels' a list of N ints; unpickled without executing anything), a
 * tar of either, or a directory extracted from either (the batches in it or in its
 * cifar-10-batches-bin/ or cifar-10-batches-py/). Any number of records per batch works (the train
 * split is the five batches in order). Truncated or corrupt files, records that are not whole,
 * labels outside 0..9 and pickles of anything else are TG_ERR_IO errors naming tg_cifar_load and the
 * file; on error all four outputs are none. */
tg_status tg_cifar_load(const char *path, const char *device, tg_tensor *X_train, tg_tensor *Y_train,
                        tg_tensor *X_test, tg_tensor *Y_test);

/* ---------------------------------------------------------------------------------------------- */
/* nn: initializers, transposed convolution, layers, model state, optimizers                      */

/* Initializers (tinygrad's Tensor.kaiming_uniform & co.): new lazy tensors in the current scope. opts
 * as for tg_rand (dtype default DEFAULT_FLOAT; requires_grad honoured). fan_in is prod(shape[1:]) (1
 * for a 1-d shape). */
/* uniform(-b, b), b = sqrt(6 / (1 + a^2) / fan_in). tinygrad's default a is 0.01 (pass it: a is a
 * plain argument); a = sqrt(5) gives PyTorch's Linear/Conv init, b = 1 / sqrt(fan_in). */
tg_tensor tg_kaiming_uniform(const int64_t *shape, int ndim, double a, const tg_opts *opts);
/* normal(0, s), s = sqrt(2 / (1 + a^2) / fan_in). */
tg_tensor tg_kaiming_normal(const int64_t *shape, int ndim, double a, const tg_opts *opts);
/* uniform(-b, b), b = sqrt(6 / (shape[0] + prod(shape[1:]))); needs ndim >= 1. */
tg_tensor tg_glorot_uniform(const int64_t *shape, int ndim, const tg_opts *opts);
/* uniform(-1, 1) * prod(shape)^-0.5. */
tg_tensor tg_scaled_uniform(const int64_t *shape, int ndim, const tg_opts *opts);
/* A uniformly random permutation of 0 .. n-1 (dtype default int32; integer dtypes only): the rank of
 * each of n tg_rand draws (ties broken by position). The draws are realized at once (one small
 * kernel); the ranks are one fused kernel of n^2 compares (fine up to ~10^4; tinygrad argsorts). */
tg_tensor tg_randperm(int64_t n, const tg_opts *opts);
/* tg_rand / tg_randn with t's shape, and unless opts says otherwise t's dtype (a float for rand_like;
 * randn_like casts to an integer one as tg_randn does) and device. */
tg_tensor tg_rand_like(tg_tensor t, const tg_opts *opts);
tg_tensor tg_randn_like(tg_tensor t, const tg_opts *opts);

typedef struct {
  int64_t groups;      /* default 1 */
  int64_t stride[2];   /* default (1, 1); pairs as tg_conv2d_opts */
  int64_t dilation[2]; /* default (1, 1) */
  int64_t padding[4];  /* as tg_conv2d_opts: npadding 0/1 all sides, 2 (h, w), 4 (left, right, top, bottom) */
  int npadding;
  int64_t output_padding[2]; /* extra rows / columns at the end of the output */
  int noutput_padding;       /* 0 or 1: output_padding[0] for both dims; 2: (h, w) */
  tg_dtype dtype;            /* the sum's dtype, as tg_conv2d_opts (tinygrad's conv2d(dtype=)) */
} tg_conv_transpose2d_opts;
#define TG_CONV_TRANSPOSE2D_OPTS(...) \
  TG_OPTS_WITH_(tg_conv_transpose2d_opts, .groups = 1, .stride = {1, 1}, .dilation = {1, 1}, __VA_ARGS__)
/* Transposed 2-D convolution (torch's conv_transpose2d): x (batch, cin, H, W), weight (cin,
 * cout/groups, kh, kw), bias (cout,) or {0}. Built as tinygrad builds it: the input is dilated by the
 * stride (zeros inserted), padded by dilation*(k-1) - padding (+ output_padding after), and convolved
 * (tg_conv2d) with the flipped, group-transposed weight. Output size per dim:
 * (in - 1)*stride - pad_before - pad_after + dilation*(k - 1) + output_padding + 1. */
tg_tensor tg_conv_transpose2d(tg_tensor x, tg_tensor weight, tg_tensor bias, const tg_conv_transpose2d_opts *opts);

/* Transposed convolution with as many spatial dims as the weight (cin, cout/groups, kernel...) has;
 * options as tg_conv_nd plus output_padding; sizes per dim as tg_conv_transpose2d. */
tg_tensor tg_conv_transpose_nd(tg_tensor x, tg_tensor weight, tg_tensor bias, const tg_window_opts *opts);

/* Layers (tinygrad's nn.*): plain structs with public fields. _init fills one (on error it is left
 * zeroed and a status is returned); its parameters are root-scope handles OWNED BY THE LAYER,
 * realized, initialised exactly as tinygrad does, with requires_grad set on the trainable ones (never
 * on running statistics); _free frees them and zeroes the struct (a zeroed struct frees nothing).
 * Optional parameters that are absent are {0}. _forward builds a lazy result in the current scope
 * (none + an error naming the function on bad input). _state adds the parameters to a state dict
 * under PyTorch's / tinygrad's names, prefixed ("prefix.weight"; prefix "" or NULL gives "weight"),
 * so a model's dict is built by calling each layer's _state with its path ("layers.0"). */

typedef struct {
  int64_t in_features, out_features;
  tg_tensor weight; /* (out_features, in_features), uniform(+-1/sqrt(in_features)) */
  tg_tensor bias;   /* (out_features,) same bound, or {0} */
} tg_nn_linear;
tg_status tg_nn_linear_init(tg_nn_linear *l, int64_t in_features, int64_t out_features, bool bias);
/* x (..., in_features) -> x @ weight.T + bias. */
tg_tensor tg_nn_linear_forward(const tg_nn_linear *l, tg_tensor x);
tg_status tg_nn_linear_state(const tg_nn_linear *l, tg_state_dict *sd, const char *prefix);
void tg_nn_linear_free(tg_nn_linear *l);

/* Conv2d: weight (out, in/groups, kh, kw) and bias (out,) both uniform(+-1/sqrt(in * kh * kw)), as
 * tinygrad (= torch's kaiming_uniform(a=sqrt(5)) init when groups == 1). opts (stride, dilation,
 * padding, groups) is copied into the layer and used by every forward. */
typedef struct {
  int64_t in_channels, out_channels, kernel_size[2];
  tg_conv2d_opts opts;
  tg_tensor weight, bias;
} tg_nn_conv2d;
/* kernel_size as a pair: {k} = (k, k). */
tg_status tg_nn_conv2d_init(tg_nn_conv2d *l, int64_t in_channels, int64_t out_channels, const int64_t kernel_size[2],
                            bool bias, const tg_conv2d_opts *opts);
tg_tensor tg_nn_conv2d_forward(const tg_nn_conv2d *l, tg_tensor x); /* (N, in, H, W) -> (N, out, H', W') */
tg_status tg_nn_conv2d_state(const tg_nn_conv2d *l, tg_state_dict *sd, const char *prefix);
void tg_nn_conv2d_free(tg_nn_conv2d *l);

/* ConvTranspose2d: weight (in, out/groups, kh, kw) and bias (out,), both uniform(+-1/sqrt(in*kh*kw)) as
 * tinygrad. */
typedef struct {
  int64_t in_channels, out_channels, kernel_size[2];
  tg_conv_transpose2d_opts opts;
  tg_tensor weight, bias;
} tg_nn_conv_transpose2d;
tg_status tg_nn_conv_transpose2d_init(tg_nn_conv_transpose2d *l, int64_t in_channels, int64_t out_channels,
                                      const int64_t kernel_size[2], bool bias, const tg_conv_transpose2d_opts *opts);
tg_tensor tg_nn_conv_transpose2d_forward(const tg_nn_conv_transpose2d *l, tg_tensor x);
tg_status tg_nn_conv_transpose2d_state(const tg_nn_conv_transpose2d *l, tg_state_dict *sd, const char *prefix);
void tg_nn_conv_transpose2d_free(tg_nn_conv_transpose2d *l);

/* 1-d convolutions over (N, C, L): the 2-d ones with a (1, k) kernel, as tinygrad. Weights are 3-d:
 * Conv1d (out, in/groups, k), ConvTranspose1d (in, out/groups, k); init as the 2-d layers. */
typedef struct {
  int64_t stride;         /* default 1 */
  int64_t padding;        /* both ends (default 0) */
  int64_t dilation;       /* default 1 */
  int64_t groups;         /* default 1 */
  int64_t output_padding; /* ConvTranspose1d only (default 0) */
} tg_conv1d_opts;
#define TG_CONV1D_OPTS(...) TG_OPTS_WITH_(tg_conv1d_opts, .stride = 1, .dilation = 1, .groups = 1, __VA_ARGS__)
typedef struct {
  int64_t in_channels, out_channels, kernel_size;
  tg_conv1d_opts opts; /* defaults resolved (stride, dilation, groups >= 1) */
  tg_tensor weight, bias;
} tg_nn_conv1d;
tg_status tg_nn_conv1d_init(tg_nn_conv1d *l, int64_t in_channels, int64_t out_channels, int64_t kernel_size, bool bias,
                            const tg_conv1d_opts *opts);
tg_tensor tg_nn_conv1d_forward(const tg_nn_conv1d *l, tg_tensor x);
tg_status tg_nn_conv1d_state(const tg_nn_conv1d *l, tg_state_dict *sd, const char *prefix);
void tg_nn_conv1d_free(tg_nn_conv1d *l);
typedef tg_nn_conv1d tg_nn_conv_transpose1d;
tg_status tg_nn_conv_transpose1d_init(tg_nn_conv_transpose1d *l, int64_t in_channels, int64_t out_channels,
                                      int64_t kernel_size, bool bias, const tg_conv1d_opts *opts);
tg_tensor tg_nn_conv_transpose1d_forward(const tg_nn_conv_transpose1d *l, tg_tensor x);
tg_status tg_nn_conv_transpose1d_state(const tg_nn_conv_transpose1d *l, tg_state_dict *sd, const char *prefix);
void tg_nn_conv_transpose1d_free(tg_nn_conv_transpose1d *l);

/* Options of the normalization layers, as tinygrad's keyword arguments: tg_norm_opts for GroupNorm,
 * InstanceNorm, LayerNorm and LayerNorm2d, tg_rmsnorm_opts for RMSNorm (its eps default differs),
 * tg_batchnorm_opts for BatchNorm. */
typedef struct {
  double eps;  /* default 1e-5 */
  bool affine; /* default true; false: no weight / bias (tinygrad's affine / elementwise_affine) */
} tg_norm_opts;
#define TG_NORM_OPTS(...) TG_OPTS_WITH_(tg_norm_opts, .eps = 1e-5, .affine = true, __VA_ARGS__)
typedef struct {
  double eps;  /* default 1e-6 */
  bool affine; /* default true */
} tg_rmsnorm_opts;
#define TG_RMSNORM_OPTS(...) TG_OPTS_WITH_(tg_rmsnorm_opts, .eps = 1e-6, .affine = true, __VA_ARGS__)
typedef struct {
  double eps;               /* default 1e-5 */
  bool affine;              /* default true */
  bool track_running_stats; /* default true; false: always normalize with batch statistics */
  double momentum;          /* running-statistics momentum, default 0.1 (0: they never change) */
  bool unsynced;            /* default false. true: an input sharded on its batch axis (tg_shard, axis
                             * 0, evenly) is normalized per device with that device's batch statistics
                             * (tinygrad's UnsyncedBatchNorm), no allreduce; the running statistics
                             * take the mean of the devices' statistics. Otherwise as synced. */
  bool dist;                /* default false. true: while MPI runs several ranks (tg_dist_init), the
                             * batch statistics are over all ranks' inputs together (PyTorch's
                             * SyncBatchNorm): sums allreduced (tg_dist_allreduce), gradients too,
                             * and the count: ranks may pass different batch sizes (the other dims
                             * must agree). Data-parallel training then equals one process on the
                             * whole batch. */
} tg_batchnorm_opts;
#define TG_BATCHNORM_OPTS(...) \
  TG_OPTS_WITH_(tg_batchnorm_opts, .eps = 1e-5, .affine = true, .track_running_stats = true, .momentum = 0.1, __VA_ARGS__)

/* BatchNorm (tinygrad's nn.BatchNorm = BatchNorm2d = BatchNorm3d) over dim 1 of (N, C, ...): weight
 * ones(C), bias zeros(C) (when affine), running_mean zeros(C), running_var ones(C) (when
 * track_running_stats), num_batches_tracked a 0-d int64 zero. While TRAINING is set (tinygrad's
 * Context(TRAINING=1): tg_context_set_int("TRAINING", 1)) or without running statistics, it normalizes
 * with the batch mean and biased variance; while training it also updates, with lazy tg_assigns that
 * realize with whatever realizes them next (the optimizer step, see tg_optim_schedule_step),
 * running_mean = (1-m) running_mean + m mean, running_var = (1-m) running_var + m var * n/(n-1) and
 * num_batches_tracked += 1. In eval it normalizes with the running statistics. */
typedef struct {
  int64_t num_features;
  double eps, momentum;
  bool affine, track_running_stats, unsynced, dist;
  tg_tensor weight, bias, running_mean, running_var, num_batches_tracked;
} tg_nn_batchnorm;
tg_status tg_nn_batchnorm_init(tg_nn_batchnorm *l, int64_t num_features, const tg_batchnorm_opts *opts);
tg_tensor tg_nn_batchnorm_forward(tg_nn_batchnorm *l, tg_tensor x);
tg_status tg_nn_batchnorm_state(const tg_nn_batchnorm *l, tg_state_dict *sd, const char *prefix);
void tg_nn_batchnorm_free(tg_nn_batchnorm *l);

/* GroupNorm(num_groups, num_channels): layernorm over (N, G, -1), then weight * x + bias per channel
 * (weight ones, bias zeros). InstanceNorm(num_features) is the same with one group per channel (as
 * tinygrad, affine by default, unlike torch). */
typedef struct {
  int64_t num_groups, num_channels;
  double eps;
  tg_tensor weight, bias;
} tg_nn_groupnorm;
tg_status tg_nn_groupnorm_init(tg_nn_groupnorm *l, int64_t num_groups, int64_t num_channels, const tg_norm_opts *opts);
tg_tensor tg_nn_groupnorm_forward(const tg_nn_groupnorm *l, tg_tensor x);
tg_status tg_nn_groupnorm_state(const tg_nn_groupnorm *l, tg_state_dict *sd, const char *prefix);
void tg_nn_groupnorm_free(tg_nn_groupnorm *l);
typedef tg_nn_groupnorm tg_nn_instancenorm;
tg_status tg_nn_instancenorm_init(tg_nn_instancenorm *l, int64_t num_features, const tg_norm_opts *opts);
tg_tensor tg_nn_instancenorm_forward(const tg_nn_instancenorm *l, tg_tensor x);
tg_status tg_nn_instancenorm_state(const tg_nn_instancenorm *l, tg_state_dict *sd, const char *prefix);
void tg_nn_instancenorm_free(tg_nn_instancenorm *l);

/* LayerNorm(normalized_shape): normalizes over the last ndim (1..8) dims, which must equal the shape,
 * then * weight + bias (ones / zeros of that shape). LayerNorm2d(channels) applies it to the channel dim of
 * (N, C, H, W) (permuted to the end and back). */
typedef struct {
  int ndim;
  int64_t normalized_shape[8];
  double eps;
  tg_tensor weight, bias;
} tg_nn_layernorm;
tg_status tg_nn_layernorm_init(tg_nn_layernorm *l, const int64_t *normalized_shape, int ndim, const tg_norm_opts *opts);
tg_tensor tg_nn_layernorm_forward(const tg_nn_layernorm *l, tg_tensor x);
tg_status tg_nn_layernorm_state(const tg_nn_layernorm *l, tg_state_dict *sd, const char *prefix);
void tg_nn_layernorm_free(tg_nn_layernorm *l);
typedef tg_nn_layernorm tg_nn_layernorm2d;
tg_status tg_nn_layernorm2d_init(tg_nn_layernorm2d *l, int64_t channels, const tg_norm_opts *opts);
tg_tensor tg_nn_layernorm2d_forward(const tg_nn_layernorm2d *l, tg_tensor x);
tg_status tg_nn_layernorm2d_state(const tg_nn_layernorm2d *l, tg_state_dict *sd, const char *prefix);
void tg_nn_layernorm2d_free(tg_nn_layernorm2d *l);

/* RMSNorm(dim): x * rsqrt(mean(x^2, -1) + eps) computed in float32 and cast back to x's dtype, then
 * * weight (ones(dim), when affine). */
typedef struct {
  int64_t dim;
  double eps;
  tg_tensor weight;
} tg_nn_rmsnorm;
tg_status tg_nn_rmsnorm_init(tg_nn_rmsnorm *l, int64_t dim, const tg_rmsnorm_opts *opts);
tg_tensor tg_nn_rmsnorm_forward(const tg_nn_rmsnorm *l, tg_tensor x);
tg_status tg_nn_rmsnorm_state(const tg_nn_rmsnorm *l, tg_state_dict *sd, const char *prefix);
void tg_nn_rmsnorm_free(tg_nn_rmsnorm *l);

/* Embedding(vocab_size, embed_size): weight (vocab, embed) glorot_uniform. forward gathers rows:
 * integer idx of any shape -> idx.shape + (embed_size,) = tg_index(weight, idx) (one fused kernel
 * with a data-dependent load rather than tinygrad's one-hot sum over the vocabulary; the same values
 * and gradients). Indices >= vocab_size give zero rows; negative ones count from the end. */
typedef struct {
  int64_t vocab_size, embed_size;
  tg_tensor weight;
} tg_nn_embedding;
tg_status tg_nn_embedding_init(tg_nn_embedding *l, int64_t vocab_size, int64_t embed_size);
tg_tensor tg_nn_embedding_forward(const tg_nn_embedding *l, tg_tensor idx);
tg_status tg_nn_embedding_state(const tg_nn_embedding *l, tg_state_dict *sd, const char *prefix);
void tg_nn_embedding_free(tg_nn_embedding *l);

/* LSTMCell(input_size, hidden_size): weight_ih (4h, in) and weight_hh (4h, h) uniform(+-1/sqrt(h)),
 * bias_ih / bias_hh zeros(4h) (tinygrad's init; torch draws the biases uniformly too). Gates (i, f, g,
 * o) in torch's order. */
typedef struct {
  int64_t input_size, hidden_size;
  tg_tensor weight_ih, weight_hh, bias_ih, bias_hh;
} tg_nn_lstmcell;
tg_status tg_nn_lstmcell_init(tg_nn_lstmcell *l, int64_t input_size, int64_t hidden_size, bool bias);
/* x (N, input_size); h, c (N, hidden_size) or both {0} (zeros). Writes the new h and c (new handles
 * in the current scope) to *h_out and *c_out (none on error). */
tg_status tg_nn_lstmcell_forward(const tg_nn_lstmcell *l, tg_tensor x, tg_tensor h, tg_tensor c, tg_tensor *h_out,
                                 tg_tensor *c_out);
tg_status tg_nn_lstmcell_state(const tg_nn_lstmcell *l, tg_state_dict *sd, const char *prefix);
void tg_nn_lstmcell_free(tg_nn_lstmcell *l);

/* Model state. A dict built by the layers' _state functions (or tg_state_dict_set of realized
 * tensors) holds handles of its own to the parameters' buffers: it always reads their current values
 * (save it with tg_safe_save at any time, e.g. after optimizer steps) and may outlive the layers. */
/* tinygrad's load_state_dict: copies each tensor of `loaded` into the model tensor of the same name
 * (tg_assign: cast to the model's dtype, moved to its device), realized before returning; every live
 * handle of a model tensor (the layer's own) sees the new values. Shapes must match (() and (1,) are
 * interchangeable, as in tinygrad). strict: a model name missing from `loaded` or a name in `loaded`
 * that the model lacks is an error; otherwise they are skipped. Every problem is checked before
 * anything is written: an error (TG_ERR_INVALID, naming the keys) leaves the model untouched. */
tg_status tg_load_state_dict(tg_state_dict *model, const tg_state_dict *loaded, bool strict);
/* tinygrad's get_parameters: the tensors of a model dict as the handles that own them (each layer's
 * own parameter handle, not the dict's view: gradients and optimizer updates land on those), without
 * duplicates, in dict order. trainable_only: only tensors not marked requires_grad false (what an
 * optimizer updates); otherwise running statistics too (an optimizer given them realizes their pending updates
 * with each step, as tinygrad's does). Returns the count and writes the handles (BORROWED from their
 * owners) to out; out NULL only counts; -1 with an error if cap is too small. */
int tg_state_dict_parameters(const tg_state_dict *sd, bool trainable_only, tg_tensor *out, int cap);

/* Optimizers (tinygrad's nn.optim), updating parameters in place with lazy tg_assigns. The optimizer
 * BORROWS the parameter handles (keep them alive while it is used) and OWNS its state: the learning
 * rate (a (1,) float32 tensor, so changing it recompiles nothing), momentum buffers, Adam moments and
 * the b1^t / b2^t step counters, all updated by tg_assign. Handles marked requires_grad false are
 * buffers (realized with each step, never updated); unset ones become parameters and are marked true,
 * as in tinygrad; duplicates count once; at least one parameter is required.
 * Each optimizer has its own options struct and macro with tinygrad's defaults (every value, 0
 * included, means itself). Constructors return NULL with an error. */
typedef struct tg_optim tg_optim;
typedef struct {
  double lr;           /* default 0.001 */
  double momentum;     /* default 0 (none) */
  double weight_decay; /* default 0: added to the gradient (wd * param) before momentum */
  bool nesterov;       /* default false */
  bool classic;        /* default false; classic momentum: lr scales the gradient before the momentum buffer */
} tg_sgd_opts;
#define TG_SGD_OPTS(...) TG_OPTS_WITH_(tg_sgd_opts, .lr = 0.001, .momentum = 0, .weight_decay = 0, __VA_ARGS__)
/* SGD = LARS without the trust ratio (same numbers as torch.optim.SGD, dampening 0). */
tg_optim *tg_optim_sgd(const tg_tensor *params, int n, const tg_sgd_opts *opts);
typedef struct {
  double lr;           /* default 0.001 */
  double momentum;     /* default 0.9; 0: no momentum */
  double weight_decay; /* default 1e-4; 0: none */
  double tcoef;        /* trust coefficient, default 0.001 */
  bool nesterov;       /* default false */
  bool classic;        /* default true; false: lr applied after the momentum buffer */
} tg_lars_opts;
#define TG_LARS_OPTS(...) \
  TG_OPTS_WITH_(tg_lars_opts, .lr = 0.001, .momentum = 0.9, .weight_decay = 1e-4, .tcoef = 0.001, .classic = true, __VA_ARGS__)
/* LARS: the gradient scaled by the layer-wise trust ratio tcoef*|w| / (|g| + wd*|w|) (1 where a norm
 * is 0). */
tg_optim *tg_optim_lars(const tg_tensor *params, int n, const tg_lars_opts *opts);
#define TG_MUON_MAX_COEFS 8
#define TG_NS_MAX_STEPS 1000 /* the most Newton-Schulz iterations tg_newton_schulz and Muon accept */
typedef struct {
  double lr;           /* default 0.001 */
  double momentum;     /* default 0.95; 0: no momentum */
  double weight_decay; /* default 0.1 (decoupled: wd * lr * param after the orthogonalization); 0: none */
  int ns_steps;        /* Newton-Schulz iterations, default 5; 0: only the normalization */
  double ns_coefficients[TG_MUON_MAX_COEFS]; /* default (3.4445, -4.775, 2.0315) */
  int n_ns_coefficients;                     /* how many of ns_coefficients are used, default 3 */
  bool nesterov;       /* default true */
} tg_muon_opts;
#define TG_MUON_OPTS(...)                                                                                \
  TG_OPTS_WITH_(tg_muon_opts, .lr = 0.001, .momentum = 0.95, .weight_decay = 0.1, .ns_steps = 5,         \
                .ns_coefficients = {3.4445, -4.775, 2.0315}, .n_ns_coefficients = 3, .nesterov = true, __VA_ARGS__)
/* Muon (tinygrad's nn.optim.Muon = LARS without trust ratio, popular momentum, Nesterov): the momentum
 * update of each parameter, viewed as (shape[0], rest), is orthogonalized by tg_newton_schulz, scaled
 * by lr, plus wd * lr * param. Parameters need at least one dim. */
tg_optim *tg_optim_muon(const tg_tensor *params, int n, const tg_muon_opts *opts);
typedef struct {
  double lr;     /* default 0.001 */
  double b1, b2; /* defaults 0.9, 0.999 */
  double eps;    /* default 1e-8 */
} tg_adam_opts;
#define TG_ADAM_OPTS(...) TG_OPTS_WITH_(tg_adam_opts, .lr = 0.001, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, __VA_ARGS__)
typedef struct {
  double lr;           /* default 0.001 */
  double b1, b2;       /* defaults 0.9, 0.999 */
  double eps;          /* default 1e-8 */
  double weight_decay; /* decoupled weight decay, default 0.01 */
} tg_adamw_opts;
#define TG_ADAMW_OPTS(...) \
  TG_OPTS_WITH_(tg_adamw_opts, .lr = 0.001, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, __VA_ARGS__)
typedef struct {
  double lr;           /* default 0.001 */
  double b1, b2;       /* defaults 0.9, 0.999 */
  double eps;          /* default 1e-6 */
  double weight_decay; /* default 0 */
} tg_lamb_opts;
#define TG_LAMB_OPTS(...) \
  TG_OPTS_WITH_(tg_lamb_opts, .lr = 0.001, .b1 = 0.9, .b2 = 0.999, .eps = 1e-6, .weight_decay = 0, __VA_ARGS__)
/* Adam = LAMB without trust ratio or weight decay; AdamW = with decoupled weight decay (both the same
 * numbers as torch.optim's); LAMB scales each update by |w| / |update| (1 where a norm is 0). */
tg_optim *tg_optim_adam(const tg_tensor *params, int n, const tg_adam_opts *opts);
tg_optim *tg_optim_adamw(const tg_tensor *params, int n, const tg_adamw_opts *opts);
tg_optim *tg_optim_lamb(const tg_tensor *params, int n, const tg_lamb_opts *opts);
/* Drops the parameters' gradients (tinygrad's zero_grad: grad = None). */
void tg_optim_zero_grad(tg_optim *o);
/* tinygrad's schedule_step: builds the update of every parameter from its gradient (tg_backward must
 * have run) as lazy assigns, and writes the tensors to realize -- optimizer state, then the
 * parameters, then the buffers (all BORROWED) -- to out. Realize them together with the loss in one
 * tg_realize_many (one schedule; under TinyJit, inside the jitted function). Requires TRAINING, as
 * tinygrad does. Returns the count (out NULL: only counts, builds nothing), -1 with an error. */
int tg_optim_schedule_step(tg_optim *o, tg_tensor *out, int cap);
/* tg_realize_many of tg_optim_schedule_step. */
tg_status tg_optim_step(tg_optim *o);
/* Sets / reads the learning rate (writes the lr tensor: jitted steps see the new value). */
tg_status tg_optim_set_lr(tg_optim *o, double lr);
double tg_optim_get_lr(const tg_optim *o);
/* The lr tensor, shape (1,) (BORROWED; e.g. to tg_assign a schedule into it). */
tg_tensor tg_optim_lr(const tg_optim *o);
/* Adds the optimizer's state to sd as tinygrad names it ("lr", "b1_t", "b2_t", "m.0", "v.0", "b.0",
 * ...), for checkpoints (tg_load_state_dict restores it). */
tg_status tg_optim_state(const tg_optim *o, tg_state_dict *sd, const char *prefix);
/* Frees the optimizer's state (not the parameters). NULL is a no-op. */
void tg_optim_free(tg_optim *o);
/* tinygrad's OptimizerGroup: one optimizer made of n others (Muon for the matrices and AdamW for the
 * rest, say). tg_optim_zero_grad, tg_optim_schedule_step (each member's tensors in turn: realize them
 * all in one tg_realize_many), tg_optim_step and tg_optim_free act on every member; tg_optim_state
 * names member i's state "optimizers.<i>.lr", ... as tinygrad's get_state_dict does. The group TAKES
 * OWNERSHIP of the members, also when it fails (NULL with an error: a NULL member, e.g. a failed
 * constructor, an optimizer listed twice, or a parameter in two members), so that a one-line
 * tg_optim_group((tg_optim *[]){tg_optim_muon(...), tg_optim_adamw(...)}, 2) leaks nothing. Members
 * may be groups. Like tinygrad's, a group has no learning rate of its own: tg_optim_set_lr, _get_lr
 * and _lr on it are errors; use its members' through tg_optim_group_get. */
tg_optim *tg_optim_group(tg_optim *const *optims, int n);
/* Member i of a group (tinygrad's group[i]), BORROWED: valid while the group lives. NULL with an error
 * for an index out of range or an optimizer that is not a group. */
tg_optim *tg_optim_group_get(const tg_optim *o, int i);
/* The number of members of a group, 0 for a single optimizer, -1 with an error for NULL. */
int tg_optim_group_count(const tg_optim *o);

/* ---------------------------------------------------------------------------------------------- */
/* Symbolic sizes (tinygrad's Variable)                                                            */

/* A named integer with bounds that can stand where a size goes, so that one kernel (compiled once)
 * serves every value: tinygrad's Variable("start_pos", 1, MAX_CONTEXT).bind(pos). A tg_symvar is a
 * value (no handle to free): it names the variable and, once bound, carries its value. {0} is none.
 * Variables are interned by (name, min, max) and live for the process. (tg_var is the variance.) */
typedef struct {
  uint64_t id;
} tg_symvar;
/* The variable `name` (a C identifier, at most 31 characters) with 0 <= min <= max <= TG_VAR_MAX.
 * Bad input: {0} and an error naming the function and the values. */
#define TG_VAR_MAX 0x3ffffffeLL
tg_symvar tg_variable(const char *name, int64_t min, int64_t max);
/* v bound to value (the same variable, carrying the value): min <= value <= max, else {0} and an
 * error "tg_var_bind: start_pos = 9 is outside its bounds [1, 8]". Binding again replaces the value
 * (tg_var_bind(b, 5) of a bound b is v bound to 5). */
tg_symvar tg_var_bind(tg_symvar v, int64_t value);
/* The bound value, or -1 for an unbound variable or none. */
int64_t tg_var_value(tg_symvar v);
/* The variable's name (static storage, lives for the process), bounds, and the variable unbound. */
const char *tg_var_name(tg_symvar v);
int64_t tg_var_min(tg_symvar v);
int64_t tg_var_max(tg_symvar v);
tg_symvar tg_var_unbind(tg_symvar v);

/* A size argument that stands for v + offset (|offset| < 2^16), for the int64_t arrays of
 * tg_shrink (start and end), tg_reshape, tg_expand, tg_pad and tg_arange_sym. It is a tagged
 * negative number (below -2^62), never a legal plain size, that packs the variable, its bound value
 * and the offset, so a size argument stays one int64_t and every existing call keeps its form:
 *   tg_shrink(kv, TG_SHAPE(0, 2, 0, B, tg_sym(sp, 0), tg_sym(sp, 1), 0, H, 0, D))
 *   tg_shrink(k, TG_SHAPE(0, B, 0, tg_sym(sp, 1), 0, H, 0, D))        keys [0, start_pos+1)
 * The tensor's shape (tg_shape) reports the bound value (v's value + offset); an unbound v makes
 * the shape use v's max and the realize fail ("tg_realize: variable 'start_pos' [1, 1024] is
 * unbound"). Kernels depend on the variable, not on its value: the value is a kernel argument, and
 * the kernel cache, compile counts and TinyJit captures are the same for every value. tg_sym of
 * none (or a bad offset) returns TG_SYM_NONE, which every op rejects. */
#define TG_SYM_NONE INT64_MIN
int64_t tg_sym(tg_symvar v, int64_t offset);
#define TG_SYM(v) tg_sym((v), 0)
/* Is `size` a symbolic size (a tg_sym result)? Its variable (bound as it was given) and offset. */
bool tg_is_sym(int64_t size);
tg_symvar tg_sym_variable(int64_t size, int64_t *offset);
/* [0, stop) as an integer tensor (int32 unless opts says otherwise) whose length may be symbolic
 * (stop = tg_sym(v, c)): tinygrad's Tensor.arange(v). Computed inside the kernels that read it. */
tg_tensor tg_arange_sym(int64_t stop, const tg_opts *opts);
/* The shape of t with its symbolic dims as tg_sym codes (others plain), as tg_shape writes it. Returns
 * ndim, or -1 for a bad handle. */
int tg_shape_sym(tg_tensor t, int64_t *out);

/* ---------------------------------------------------------------------------------------------- */
/* TinyJit                                                                                         */

/* A jittable function: computes nout outputs from tensor inputs and non-tensor arguments (args).
 * It must be pure in its inputs: anything else it reads (user memory, globals) is baked into the
 * captured kernels. Returns TG_OK or an error status. Handles it creates are freed by the JIT except
 * the outputs it stores in out[]. */
typedef tg_status (*tg_jit_fn)(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                                void *user);
typedef struct tg_jit tg_jit;
/* Wraps fn. The first call runs it normally, the second captures the kernels it runs, later calls
 * replay them with the new inputs' buffers (no graph building or scheduling). On a CUDA device a
 * replay of kernels of that one device is one CUDA graph (recorded at the first replay; later ones
 * only give the launches that read new buffers their arguments). JIT=0 disables capture; JIT=2
 * captures and replays launch by launch (tinygrad's "no graphs"). Between calls the jit holds
 * its outputs (and buffers that outlived one realize inside fn), not the intermediates: a replay
 * allocates them as the captured run did. A jit serves one call at a time: a call from another
 * thread while one runs is an error (give each thread its own jit). Free with tg_jit_free. */
tg_jit *tg_jit_new(tg_jit_fn fn, int nout, void *user);
/* TinyJit options. prune (tinygrad's TinyJit(prune=True)): after the capture, drop the kernels that
 * do not depend on the inputs (weights prepared once, constants): they ran during the capture and
 * their results stay in their buffers, so replays run only the kernels that do. Kernels writing an
 * input (assigns) are kept, and so is any kernel a replay could change the result of (it reads or
 * writes a buffer a kept kernel writes). Like tinygrad's, a pruned state update that reads no input
 * (a counter a function bumps) is not replayed. */
/* Without prune, a replay still skips the constant work on realized weights: the kernels that read
 * only buffers no input reaches and nothing in the capture writes (the packed copy of a matmul's
 * weight, a cast or layout copy of it) and produce intermediates. They run on the first replay and
 * again only when one of the buffers they read has been written since (a tg_assign, a state-dict
 * load, an optimizer step outside the jit); their results stay in buffers the jit holds.
 * Memory the caller owns (tg_from_blob) may change unseen, so kernels reading it always run.
 * rerun_constants: run them on every replay instead (no extra memory held between calls). */
typedef struct {
  bool prune;
  bool rerun_constants;
} tg_jit_opts;
#define TG_JIT_OPTS(...) (&(const tg_jit_opts){__VA_ARGS__})
/* tg_jit_new with options (NULL: the defaults, as tg_jit_new). */
tg_jit *tg_jit_new_opts(tg_jit_fn fn, int nout, void *user, const tg_jit_opts *opts);
/* Calls the jitted function. Inputs must be realized, contiguous tensors; outputs come back
 * realized in out[] (new handles in the caller's scope; on replays they alias the same buffers).
 * An input that is one of those buffers (an output of an earlier call fed back) is copied before
 * the replay overwrites it. Errors, never silent divergence: a changed input count, shape, dtype or
 * device, an unrealized input, a changed non-tensor argument, an input the function writes but does
 * not return, the same tensor passed as two inputs, a call from inside a jitted function (nested
 * TinyJit, including a jit calling itself), a capture that runs no kernel, and reading data
 * (tg_data, tg_item, tg_print, ...) inside the function while it is captured. */
tg_status tg_jit_call(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out);
void tg_jit_free(tg_jit *j);
/* tg_jit_call with bound variables as inputs (tinygrad's jit over a function taking
 * Variable(...).bind(v)): vars[] are the variables the function's symbolic sizes use, bound to this
 * call's values. The capture records which kernels take which variable; a replay passes the new
 * values to those kernels, so one capture serves every value (no recompiles, no re-capture). The
 * function builds its graphs with the same bound variables (pass them through `user`, or read
 * them with tg_jit_var). An input may have a symbolic shape: the [0, v + c) tg_shrink of a realized
 * tensor (a batch of B rows: tg_shrink(x, TG_SHAPE(0, tg_sym(b, 0), 0, 784)) with b bound to x's row
 * count); later calls pass the same variable at any value, over a tensor of any first size and the
 * same other sizes. An output of symbolic shape comes back as the [0, v + c) view of its buffer,
 * which is stored at the variable's max (tg_shape reports this call's size). Errors: a changed set
 * of variables, an unbound or repeated variable, an input sized by a variable bound to another value
 * than vars[] passes, a captured kernel or output whose variable is not in vars[] (or ran with
 * another value of it: the function bound it itself), and a capture whose
 * graph holds a size computed from a bound value next to a symbolic one (tg_cat along a symbolic
 * dim): its kernels would hold for that value only. A call where a symbolic size is 0 or 1 (which
 * graphs may treat as a broadcastable size-1 dim) runs but is not captured; the next call captures.
 * Kernels with variables run on CPU devices. A plain tg_jit_call is this with no variables. */
tg_status tg_jit_call_vars(tg_jit *j, const tg_tensor *in, int nin, const tg_symvar *vars, int nvars, const double *args,
                           int nargs, tg_tensor *out);
/* Inside a jitted function: the i-th bound variable of the running tg_jit_call_vars ({0} if none). */
tg_symvar tg_jit_var(int i);
/* Number of kernel launches and copies captured, those prune kept (-1 for NULL; 0 before capture). */
int tg_jit_captured_kernels(const tg_jit *j);
/* Of those, the constant work a replay skips while the weights it reads are unchanged (-1 for NULL). */
int tg_jit_constant_kernels(const tg_jit *j);

/* Export of a captured TinyJit as C. name: the entry point, a C identifier that prefixes every
 * generated symbol (NULL: "model"). weights_path: NULL embeds the weights in the C file as a byte
 * array; else they are written to this safetensors file, and the generated <name>_load(path) reads
 * and checks it (a wrong, truncated or damaged file is an error code with a message). */
typedef struct {
  const char *name;
  const char *weights_path;
} tg_jit_export_opts;
#define TG_JIT_EXPORT_OPTS(...) (&(const tg_jit_export_opts){__VA_ARGS__})
/* Writes the jit's capture (it must have been called at least twice) as one C11 file at path, and
 * its header next to it (path with .c replaced by .h): every captured kernel's C source as the CPU
 * device compiled it, intermediates in one static arena laid out by a memory plan (no allocation
 * per call), and `int <name>(const T *in0, ..., T *out0, ...)` running the kernels in order, with
 * the shapes and dtypes in comments and #defines. The shapes are the captured ones, except for a
 * capture by tg_jit_call_vars: each variable becomes an int argument of the entry point, before the
 * arrays (`int model(int batch, const float *in0, float *out0)`), checked against its bounds
 * (<NAME>_ERR_RANGE), and an input or output symbolic in its first dim takes an array of exactly
 * that call's rows (<NAME>_IN0_BYTES(batch)); intermediates are planned at the max. A symbolic dim
 * past the first is refused (the caller's array would have to be padded). The code needs only libc
 * and libm, compiles as C11 and C++, runs single-threaded, or
 * splits kernels over pthreads as the CPU device does with -DTG_EXPORT_THREADS; compiled with the
 * runtime's flags (-O2 -march=native -ffp-contract=fast) it computes the library's bits.
 * The files are replaced as tg_safe_save replaces its file: each is written to a temporary file
 * next to it, and all of them are renamed into place only once every one is complete, so a failed
 * export leaves existing files as they were; a path that is not a regular file (a directory, a FIFO,
 * a device) is refused before anything is written, and so are two outputs naming the same file.
 * Errors (nothing is left written): a jit that captured nothing, a capture on another device than
 * CPU, a function that writes its inputs or keeps state across calls, a bad name (a C or C++ keyword, a
 * name the C headers the generated file includes declare -- exp, time, FILE, str..., ..._t -- or,
 * for a variable, a macro of theirs or of the export: EOF, SIZE_MAX, MODEL_OK), a file name the
 * generated #include cannot spell (a quote, a backslash, a control character), a file that cannot
 * be written (TG_ERR_IO), embedded weights over 256 MiB (use weights_path). */
tg_status tg_jit_export(const tg_jit *j, const char *path, const tg_jit_export_opts *opts);

/* ---------------------------------------------------------------------------------------------- */
/* settings, counters, debugging                                                                   */

/* Reads an integer setting: a Context override if one is active, else the environment variable,
 * else def. Names as tinygrad's: DEBUG, BEAM, NOOPT, JIT, DEFAULT_FLOAT is a dtype name. */
int64_t tg_getenv_int(const char *name, int64_t def);
/* Context: scoped overrides of settings. tg_context_begin opens a level; tg_context_set overrides a
 * setting in the innermost level; tg_context_end restores what was in force before. */
void tg_context_begin(void);
tg_status tg_context_set(const char *name, const char *value);
tg_status tg_context_set_int(const char *name, int64_t value);
void tg_context_end(void);

/* GlobalCounters: totals since the last reset. */
typedef struct {
  uint64_t kernel_count;  /* kernels launched */
  uint64_t global_ops;    /* estimated FLOPs */
  uint64_t global_mem;    /* bytes read + written by kernels */
  double time_sum_s;      /* kernel time measured when DEBUG >= 2 (else 0) */
  uint64_t compile_count; /* kernels compiled or loaded from the disk cache (misses of the in-memory
                           * cache); a batch compiled in one compiler run counts each of its kernels */
  uint64_t mem_used;      /* bytes held by live device buffers now (not a total: reset leaves it) */
} tg_counters;
tg_counters tg_global_counters(void);
void tg_global_counters_reset(void);

#ifdef __cplusplus
}
#endif
#endif /* TINYGRAD_H */
