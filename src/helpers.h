/*
 * helpers.h -- shared internals: error recording, settings (getenv + Context), GlobalCounters,
 * timing, a growable string builder, hashing, and dtype metadata used by every layer.
 * Nothing here knows about tensors, graphs or devices.
 */
#ifndef TG_HELPERS_H
#define TG_HELPERS_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tinygrad.h"

/* ---- internal invariants (never user input): print and abort ---- */
#define TG_ASSERT(c)                                                                               \
  do {                                                                                             \
    if (!(c)) tg__assert_fail(#c, __FILE__, __LINE__);                                             \
  } while (0)
_Noreturn void tg__assert_fail(const char *cond, const char *file, int line);

/* ---- memory ----
 * tg_x* never return NULL. When the system refuses, they free the process's memory reserve, retry,
 * and note the failure for the calling thread; they abort only when the retry fails too. Code that
 * completes an operation checks with tg_oom_check before handing its result out. */
void *tg_xmalloc(size_t n);
void *tg_xcalloc(size_t n, size_t sz);
void *tg_xrealloc(void *p, size_t n);
char *tg_xstrdup(const char *s);
/* True if an allocation of this thread failed since the last check (it was served from the reserve):
 * records TG_ERR_RUNTIME "<what>: out of host memory ..." and re-arms the reserve. The caller then
 * frees what it built and reports the error. */
bool tg_oom_check(const char *what);
/* For code that frees (releases never fail, they only need scratch): tg_oom_mark() before, and
 * tg_oom_forget(mark) after forgets failures the release itself had, keeping earlier ones. */
bool tg_oom_mark(void);
void tg_oom_forget(bool mark);
/* Test hook: the n-th tg_x* allocation of this thread from now fails (and every later one if
 * persistent); n = 0 turns it off. tg__alloc_calls counts this thread's calls since then. */
void tg__fail_alloc_after(long n, bool persistent);
long tg__alloc_calls(void);
/* RAM plus swap in bytes (read once): more than this can never be held, whatever the kernel's
 * overcommit policy lets an allocation call return. */
size_t host_memory_limit(void);
/* RAM free now (free + buffers, in bytes), and the process's address-space limit (RLIMIT_AS;
 * SIZE_MAX: none). */
size_t host_free_memory(void);
size_t host_address_limit(void);
/* The process's mapped address space now (bytes; 0 if unknown). */
size_t process_vm_bytes(void);

/* ---- errors: first error of the thread wins until tg_clear_error ---- */
/* Records an error (if none recorded yet) with printf formatting. Always returns TG_ERR-status `st`. */
tg_status tg_set_error(tg_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool tg_has_error(void);
/* The recorded error, if its message names no public function (one raised deep in the engine: a
 * compiler missing, a kernel that cannot load), is prefixed with fn, the call that reached it. */
void error_name_call(const char *fn);
/* The recorded error restated under the call that met it: "<prefix>: <message>", the prefix
 * printf-formatted, the message without a leading `strip` (NULL: none; "device_get: " where a
 * public function reports device_get's reason), with status st (TG_OK: the error's own). Nothing
 * when no error is recorded. */
void error_restate(tg_status st, const char *strip, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- settings ---- */
/* Integer setting from Context override, else environment, else def. Cached env lookups are fine:
 * Context overrides always take precedence. */
int64_t getenv_int(const char *name, int64_t def);
/* getenv_int clamped to [lo, hi]; a value outside is reported once, with the value used. */
int64_t getenv_int_in(const char *name, int64_t def, int64_t lo, int64_t hi);
/* String setting (Context override, else environment, else def). Returned string valid until the
 * Context level that set it ends / process end. */
const char *getenv_str(const char *name, const char *def);
/* Reports on stderr, once per setting name, that name=value is ignored (why) and what is used
 * instead. getenv_int reports values that are not integers. */
void env_warn(const char *name, const char *value, const char *why, const char *instead);
/* Context overrides are per thread. A thread working for another (a compile worker) takes the
 * caller's: ctx_copy (in the caller; NULL when it has none), then ctx_enter / ctx_leave around the
 * work in the worker, and ctx_copy_free once every worker is done. */
typedef struct CtxCopy CtxCopy;
CtxCopy *ctx_copy(void);
void ctx_enter(const CtxCopy *c);
void ctx_leave(const CtxCopy *c);
void ctx_copy_free(CtxCopy *c);
/* Shorthand for getenv_int("DEBUG", 0). Must be cheap (called on hot paths). */
int debug_level(void);

/* ---- counters ---- */
/* Bytes held by live device buffers (runtime/device.c), reported as tg_counters.mem_used. */
uint64_t device_mem_used(void);
/* The totals behind tg_global_counters. Atomic: realizes and jit replays on several threads add to
 * them at once. Read them with tg_global_counters, add with counters_add. */
typedef struct {
  _Atomic uint64_t kernel_count, global_ops, global_mem, compile_count;
  _Atomic double time_sum_s;
} Counters;
extern Counters g_counters;
/* Counts one executed item: a kernel (kernel true, with its estimated ops) or a copy, moving mem
 * bytes, and t seconds of measured kernel time (0 when not measured). Returns the kernel count
 * after this item, for DEBUG lines. */
uint64_t counters_add(bool kernel, uint64_t ops, uint64_t mem, double t);

/* ---- time ---- */
double now_seconds(void); /* monotonic */

/* ---- string builder ---- */
typedef struct {
  char *s;
  size_t len, cap;
} SB;
void sb_init(SB *b);
void sb_free(SB *b);
void sb_puts(SB *b, const char *s);
void sb_putc(SB *b, char c);
void sb_printf(SB *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_vprintf(SB *b, const char *fmt, va_list ap);
char *sb_take(SB *b); /* returns the malloc'd string, builder left empty */

/* ---- hashing ---- */
uint64_t hash_bytes(const void *p, size_t n, uint64_t seed);
static inline uint64_t hash_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 33);
}

/* ---- dtypes ---- */
typedef struct {
  const char *name;  /* tinygrad's name: "float", "half", "int", ... */
  const char *cname; /* C type used in generated code */
  int itemsize;
  char kind;         /* 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float */
} DTypeInfo;
const DTypeInfo *dtype_info(tg_dtype dt); /* NULL if invalid */
bool dtype_valid(tg_dtype dt);            /* a real dtype (not DEFAULT, in range) */
/* Accumulator dtype for sum (tinygrad sum_acc_dtype): bool/int8/16 -> int32, uint8/16 -> uint32,
 * half/bfloat16 -> float32, else itself. */
tg_dtype dtype_sum_acc(tg_dtype dt);
tg_dtype dtype_from_name(const char *name); /* "float32"/"float"/"half"/... -> dtype; 0 if unknown */
/* Smallest/largest value of a dtype as double (tinygrad dtype.min/max, the identities of max/min
 * reductions): -inf/+inf for floats, the integer limits for ints, 0/1 for bool. */
double dtype_min(tg_dtype dt);
double dtype_max(tg_dtype dt);
/* Converting between host values and element storage. */
void dtype_store(tg_dtype dt, void *dst, double v);          /* C cast semantics */
void dtype_store_i64(tg_dtype dt, void *dst, int64_t v);
double dtype_load(tg_dtype dt, const void *src);
int64_t dtype_load_i64(tg_dtype dt, const void *src);
/* v as integer dtype dt holds it by dtype_store's rule (NaN 0, truncate, saturate to int64, wrap to the
 * width), read back as dtype_load_i64 does: what a kernel's cast of a float constant folds to. */
int64_t dtype_int_of(tg_dtype dt, double v);
/* A whole number v as two's-complement bits, modulo 2^64 (exact for every double: 2^63 is INT64_MIN,
 * 1e30 its value mod 2^64), as tinygrad truncates a Python int to an integer dtype; narrower dtypes
 * then keep the low bits. NaN and infinities give 0 (callers that saturate them check first). */
int64_t double_wrap_i64(double v);
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);   /* round to nearest even */
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);   /* round to nearest even */
/* The fp8 dtypes: OCP e4m3 / e5m2 and the fnuz e4m3 / e5m2. */
bool dtype_is_fp8(tg_dtype dt);
/* Stored mantissa bits of a float dtype narrower than float32 (float16 10, bfloat16 7, fp8 3 or 2); 0
 * for the others. */
int dtype_mant_bits(tg_dtype dt);
/* tinygrad's fp8 conversions (dt one of the four fp8 dtypes): nearest even, saturating, see dtype.c */
uint8_t double_to_fp8(double d, tg_dtype dt);
double fp8_to_double(uint8_t b, tg_dtype dt);

/* numpy-style formatting of a contiguous host array (used by tg_to_string). Returns malloc'd. */
char *format_array(const void *data, tg_dtype dt, const int64_t *shape, int ndim);

#endif
