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
 *  - Keyword arguments: a trailing `const tg_xxx_opts *` argument; NULL or a zeroed field means
 *    tinygrad's default. The TG_OPTS-style macros build them with designated initializers.
 *  - Axes may be negative (counted from the end). Shapes are int64_t arrays with an explicit ndim.
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
/* Frees one handle now. Other handles and results built from t stay valid. Freeing none is a no-op. */
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

/* Options for creation functions. Zero means default: dtype by the function, device from DEV. */
typedef struct {
  tg_dtype dtype;
  const char *device; /* "CPU", "CPU:1", ...; NULL = default device (DEV environment variable) */
  bool requires_grad;
} tg_opts;
#define TG_OPTS(...) (&(const tg_opts){__VA_ARGS__})
/* Compound-literal helpers for C callers: TG_SHAPE(2,3) expands to "array, ndim". */
#define TG_SHAPE(...) ((const int64_t[]){__VA_ARGS__}), ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define TG_AXES(...) ((const int[]){__VA_ARGS__}), ((int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)))
#define TG_ALL_AXES NULL, 0

/* Copies nbytes-worth of data (numel * itemsize of dtype) from `data` into a new realized tensor. */
tg_tensor tg_from_data(const void *data, const int64_t *shape, int ndim, const tg_opts *opts);
/* Wraps a caller's buffer without copying (CPU devices only). The caller keeps ownership and must keep
 * the memory alive and unmoved while any tensor or result uses it. Writes through tg_assign land in
 * the caller's memory. */
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
/* n x n identity (m columns if m > 0). */
tg_tensor tg_eye(int64_t n, int64_t m, const tg_opts *opts);
/* [start, stop) with step. dtype default: int32 if all three are integers, else DEFAULT_FLOAT. */
tg_tensor tg_arange(double start, double stop, double step, const tg_opts *opts);
/* steps values evenly spaced over [start, stop]. */
tg_tensor tg_linspace(double start, double stop, int64_t steps, const tg_opts *opts);

/* Random numbers: a counter-based generator (threefry2x32) seeded by tg_manual_seed; the same seed
 * gives the same numbers on every device and in every run. */
void tg_manual_seed(uint64_t seed);
tg_tensor tg_rand(const int64_t *shape, int ndim, const tg_opts *opts);   /* uniform [0, 1) */
tg_tensor tg_randn(const int64_t *shape, int ndim, const tg_opts *opts);  /* standard normal */
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
/* Lazy copy of t to another device ("CPU:1"). */
tg_tensor tg_to(tg_tensor t, const char *device);
/* A tensor whose data is contiguous in memory (a copy if t is a non-trivial view). */
tg_tensor tg_contiguous(tg_tensor t);
/* Writes value into target's buffer (shapes must match; value is cast to target's dtype). Returns
 * target's handle updated to the assignment; the write happens when it is realized. */
tg_tensor tg_assign(tg_tensor target, tg_tensor value);
/* A copy of t's graph with the same data (lazy). */
tg_tensor tg_clone(tg_tensor t);
/* The same data, cut off from autograd. */
tg_tensor tg_detach(tg_tensor t);
/* Number of devices the CPU backend exposes ("CPU", "CPU:1", ...). */
const char *tg_default_device(void);
/* Blocks until all queued work on the device is done. */
tg_status tg_synchronize(const char *device);

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

/* Scalar right operands with Python-scalar semantics: an integer-valued scalar keeps x's dtype, a
 * fractional scalar promotes an integer x to DEFAULT_FLOAT, as tinygrad does with Python numbers. */
tg_tensor tg_add_s(tg_tensor x, double y);
tg_tensor tg_sub_s(tg_tensor x, double y);
tg_tensor tg_rsub_s(double x, tg_tensor y); /* x - y */
tg_tensor tg_mul_s(tg_tensor x, double y);
tg_tensor tg_div_s(tg_tensor x, double y);
tg_tensor tg_rdiv_s(double x, tg_tensor y); /* x / y */
tg_tensor tg_pow_s(tg_tensor x, double y);
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
tg_tensor tg_max(tg_tensor x, const int *axes, int naxes, bool keepdim);
tg_tensor tg_min(tg_tensor x, const int *axes, int naxes, bool keepdim);
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
/* pads holds 2*ndim values: (before, after) for dim 0, dim 1, ... Negative values shrink. */
tg_tensor tg_pad(tg_tensor x, const int64_t *pads, int npads, double value);
/* bounds holds 2*ndim values: (start, end) for each dim, 0 <= start <= end <= size. */
tg_tensor tg_shrink(tg_tensor x, const int64_t *bounds, int nbounds);
tg_tensor tg_flip(tg_tensor x, const int *axes, int naxes);
tg_tensor tg_transpose(tg_tensor x, int dim0, int dim1);
tg_tensor tg_flatten(tg_tensor x, int start_dim, int end_dim);
tg_tensor tg_unsqueeze(tg_tensor x, int dim);
tg_tensor tg_squeeze(tg_tensor x, int dim);

/* Matrix product of 2-D (or batched) tensors. */
tg_tensor tg_matmul(tg_tensor x, tg_tensor y);

/* ---------------------------------------------------------------------------------------------- */
/* autograd                                                                                        */

/* Marks t as a leaf whose gradient tg_backward computes (also settable with tg_opts.requires_grad).
 * Returns t. */
tg_tensor tg_set_requires_grad(tg_tensor t, bool requires_grad);
bool tg_requires_grad(tg_tensor t);
/* Reverse-mode differentiation of a scalar float loss. For every live tensor with requires_grad that
 * the loss depends on, adds d loss / d t to t's gradient (gradients accumulate until tg_zero_grad).
 * Gradients are lazy: they realize when read or when tg_realize is called on tg_grad(t).
 * Error if the loss is not a scalar or does not depend on any tensor that requires grad. */
tg_status tg_backward(tg_tensor loss);
/* A new handle to t's accumulated gradient, or none (with no error) if it has none. */
tg_tensor tg_grad(tg_tensor t);
/* Drops t's gradient. */
void tg_zero_grad(tg_tensor t);
/* Replaces t's gradient (none clears it). Shapes must match. */
tg_status tg_set_grad(tg_tensor t, tg_tensor grad);
/* d loss / d targets[i] into out[i] (new handles) without touching any tensor's gradient.
 * Error if a target is not connected to the loss through differentiable ops. */
tg_status tg_gradient(tg_tensor loss, const tg_tensor *targets, int n, tg_tensor *out);

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
 * replay them with the new inputs' buffers (no graph building or scheduling). JIT=0 disables capture;
 * JIT=2 captures too (there is no separate graph batching to turn off). Free with tg_jit_free. */
tg_jit *tg_jit_new(tg_jit_fn fn, int nout, void *user);
/* Calls the jitted function. Inputs must be realized, contiguous tensors; outputs come back
 * realized in out[] (new handles in the caller's scope; on replays they alias the same buffers).
 * Errors, never silent divergence: a changed input count, shape, dtype or device, an unrealized
 * input, a changed non-tensor argument, or an input the function writes but does not return. */
tg_status tg_jit_call(tg_jit *j, const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out);
void tg_jit_free(tg_jit *j);
/* Number of kernel launches and copies captured (-1 for NULL; 0 before capture). */
int tg_jit_captured_kernels(const tg_jit *j);

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
  uint64_t compile_count; /* kernels compiled in this process (cache misses in memory) */
} tg_counters;
tg_counters tg_global_counters(void);
void tg_global_counters_reset(void);

#ifdef __cplusplus
}
#endif
#endif /* TINYGRAD_H */
