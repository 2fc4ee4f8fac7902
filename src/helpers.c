/*
 * helpers.c -- process-wide plumbing every layer uses: checked allocation, the thread's first error,
 * settings (environment + Context overrides), GlobalCounters, a monotonic clock, a string builder and
 * a 64-bit hash.
 *
 * In: environment variables (read once per name, then cached for the process, as tinygrad's getenv
 * is cached) and Context overrides (per thread). Out: settings, error state, counters.
 * Invariants:
 *  - The error slot of a thread holds the first error since the last tg_clear_error; later errors are
 *    dropped so the root cause survives a chain of propagating calls.
 *  - tl_override_count is the number of name/value pairs in this thread's open Context levels, so
 *    debug_level() with no Context is one thread-local read plus one relaxed atomic read.
 *  - Strings handed out by getenv_str stay valid: environment copies for the process, Context values
 *    until their level ends (a re-set in the same level appends instead of overwriting).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

Counters g_counters;

/* ---- invariants and memory ---- */

_Noreturn void tg__assert_fail(const char *cond, const char *file, int line) {
  fprintf(stderr, "tinygrad.c: internal assertion failed: %s (%s:%d)\n", cond, file, line);
  fflush(stderr);
  abort();
}

static _Noreturn void out_of_memory(size_t n) {
  fprintf(stderr, "tinygrad.c: out of host memory (requested %zu bytes, and the reserve is spent)\n", n);
  fflush(stderr);
  abort();
}

/* ---- running out of host memory ----
 * A failed small allocation does not abort. The allocator frees a reserve it holds for this moment
 * (RESERVE_BYTES, taken at the first allocation), retries, and notes the failure for the thread; the
 * operation under way then finishes on the reserve with valid state, and the next check point
 * (tg_oom_check: creating a tensor handle, a realize, a backward, a load) undoes what the operation
 * made and reports TG_ERR_RUNTIME. Every allocation site is covered without unwinding code at each,
 * and nothing is left half-built. Only if memory is still short after the reserve is gone does the
 * allocator abort. A test hook makes chosen calls fail (tg__fail_alloc_after). */
#define RESERVE_BYTES ((size_t)16 << 20)
static void *_Atomic g_reserve;
static _Atomic bool g_reserve_taken;
static _Thread_local bool tl_oom;
static _Thread_local size_t tl_oom_bytes;
static _Thread_local long tl_alloc_calls, tl_fail_at;
static _Thread_local bool tl_fail_persistent;

void tg__fail_alloc_after(long n, bool persistent) {
  tl_alloc_calls = 0;
  tl_fail_at = n > 0 ? n : 0;
  tl_fail_persistent = persistent;
}

long tg__alloc_calls(void) { return tl_alloc_calls; }

/* Counts the call; true if the test hook makes it fail. */
static inline bool alloc_should_fail(void) {
  long c = ++tl_alloc_calls;
  if (!tl_fail_at) {
    if (!atomic_load_explicit(&g_reserve_taken, memory_order_relaxed) && !atomic_exchange(&g_reserve_taken, true))
      atomic_store(&g_reserve, malloc(RESERVE_BYTES)); /* once, by the first thread here */
    return false;
  }
  return tl_fail_persistent ? c >= tl_fail_at : c == tl_fail_at;
}

/* An allocation of n bytes failed: note it and give the reserve back to the system for the retry. */
static void alloc_failed(size_t n) {
  if (!tl_oom) tl_oom_bytes = n;
  tl_oom = true;
  free(atomic_exchange(&g_reserve, NULL));
}

bool tg_oom_check(const char *what) {
  if (!tl_oom) return false;
  size_t n = tl_oom_bytes;
  tg_set_error(TG_ERR_RUNTIME,
               "%s: out of host memory (an allocation of %zu bytes failed); what it built was freed and the library "
               "stays usable: free tensors or lower the batch size, then retry",
               what, n);
  tl_oom = false; /* after recording: the message itself may have needed the reserve */
  tl_oom_bytes = 0;
  if (!atomic_load(&g_reserve)) {
    void *r = malloc(RESERVE_BYTES), *none = NULL;
    if (r && !atomic_compare_exchange_strong(&g_reserve, &none, r)) free(r);
  }
  return true;
}

bool tg_oom_mark(void) { return tl_oom; }

void tg_oom_forget(bool mark) {
  if (!mark) tl_oom = false, tl_oom_bytes = 0;
}

void *tg_xmalloc(size_t n) {
  void *p = alloc_should_fail() ? NULL : malloc(n ? n : 1);
  if (!p) {
    alloc_failed(n);
    if (!(p = malloc(n ? n : 1))) out_of_memory(n);
  }
  return p;
}

void *tg_xcalloc(size_t n, size_t sz) {
  if (sz && n > SIZE_MAX / sz) out_of_memory(SIZE_MAX);
  void *p = alloc_should_fail() ? NULL : calloc(n ? n : 1, sz ? sz : 1);
  if (!p) {
    alloc_failed(n * sz);
    if (!(p = calloc(n ? n : 1, sz ? sz : 1))) out_of_memory(n * sz);
  }
  return p;
}

size_t host_memory_limit(void) {
  static _Atomic size_t limit;
  size_t lim = atomic_load_explicit(&limit, memory_order_relaxed);
  if (!lim) {
    struct sysinfo si;
    lim = sysinfo(&si) == 0 ? (size_t)(si.totalram + si.totalswap) * si.mem_unit : SIZE_MAX / 2;
    atomic_store_explicit(&limit, lim, memory_order_relaxed);
  }
  return lim;
}

size_t host_free_memory(void) {
  struct sysinfo si;
  return sysinfo(&si) == 0 ? (size_t)(si.freeram + si.bufferram) * si.mem_unit : SIZE_MAX;
}

size_t host_address_limit(void) {
  struct rlimit rl;
  return getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (size_t)rl.rlim_cur : SIZE_MAX;
}

size_t process_vm_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long pages = 0;
  bool ok = f && fscanf(f, "%llu", &pages) == 1;
  if (f) fclose(f);
  long ps = sysconf(_SC_PAGESIZE);
  return ok && ps > 0 ? (size_t)pages * (size_t)ps : 0;
}

void *tg_xrealloc(void *p, size_t n) {
  void *q = alloc_should_fail() ? NULL : realloc(p, n ? n : 1);
  if (!q) {
    alloc_failed(n); /* p is still valid */
    if (!(q = realloc(p, n ? n : 1))) out_of_memory(n);
  }
  return q;
}

char *tg_xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = tg_xmalloc(n);
  memcpy(d, s, n);
  return d;
}

/* Grows *buf (capacity *cap, elements of size sz) to hold at least need elements. */
static void grow(void **buf, size_t *cap, size_t need, size_t sz) {
  if (need <= *cap) return;
  size_t c = *cap ? *cap : 4;
  while (c < need) c *= 2;
  *buf = tg_xrealloc(*buf, c * sz);
  *cap = c;
}

/* ---- per-thread state ---- */

typedef struct {
  char *name, *value;
} CtxPair;

typedef struct {
  CtxPair *pairs;
  size_t n, cap;
} CtxLevel;

typedef struct {
  char *err_msg;
  size_t err_cap;
  tg_status err_status;
  bool err_set;
  CtxLevel *levels;
  size_t nlevels, cap_levels;
} ThreadState;

static _Thread_local ThreadState *tl_state;
static _Thread_local size_t tl_override_count;

static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;

static void free_level(CtxLevel *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->pairs[i].name);
    free(l->pairs[i].value);
  }
  free(l->pairs);
  memset(l, 0, sizeof *l);
}

/* Runs at thread exit so that threads which recorded errors or left Contexts open do not leak. */
static void thread_state_destroy(void *p) {
  ThreadState *st = p;
  for (size_t i = 0; i < st->nlevels; i++) free_level(&st->levels[i]);
  free(st->levels);
  free(st->err_msg);
  free(st);
  if (tl_state == st) {
    tl_state = NULL;
    tl_override_count = 0;
  }
}

static void thread_key_create(void) {
  if (pthread_key_create(&thread_key, thread_state_destroy) != 0) {
    fprintf(stderr, "tinygrad.c: pthread_key_create failed\n");
    abort();
  }
}

static ThreadState *thread_state(void) {
  if (tl_state) return tl_state;
  pthread_once(&thread_key_once, thread_key_create);
  ThreadState *st = tg_xcalloc(1, sizeof *st);
  st->err_status = TG_OK;
  pthread_setspecific(thread_key, st);
  tl_state = st;
  return st;
}

/* ---- errors ---- */

tg_status tg_set_error(tg_status st, const char *fmt, ...) {
  TG_ASSERT(st < 0);
  ThreadState *ts = thread_state();
  if (ts->err_set) return st;
  /* Reuse the thread's buffer: it only grows, so long compiler messages are kept whole. */
  SB b = {ts->err_msg, 0, ts->err_cap};
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(&b, fmt, ap);
  va_end(ap);
  ts->err_msg = b.s;
  ts->err_cap = b.cap;
  ts->err_status = st;
  ts->err_set = true;
  return st;
}

void error_restate(tg_status st, const char *strip, const char *fmt, ...) {
  ThreadState *ts = tl_state;
  if (!ts || !ts->err_set) return;
  const char *m = ts->err_msg;
  size_t sl = strip ? strlen(strip) : 0;
  if (sl && strncmp(m, strip, sl) == 0) m += sl;
  /* after the operation's last check point: a short allocation here must not be left noted for
   * the next operation to report */
  bool mark = tg_oom_mark();
  SB b;
  sb_init(&b);
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(&b, fmt, ap);
  va_end(ap);
  sb_printf(&b, ": %s", m);
  free(ts->err_msg);
  ts->err_msg = b.s, ts->err_cap = b.cap;
  if (st < 0) ts->err_status = st;
  tg_oom_forget(mark);
}

void error_name_call(const char *fn) {
  ThreadState *ts = tl_state;
  if (!ts || !ts->err_set || !fn || strncmp(ts->err_msg, "tg_", 3) == 0) return;
  error_restate(TG_OK, NULL, "%s", fn);
}

bool tg_has_error(void) { return tl_state && tl_state->err_set; }

const char *tg_last_error(void) { return tg_has_error() ? tl_state->err_msg : NULL; }

tg_status tg_last_status(void) { return tg_has_error() ? tl_state->err_status : TG_OK; }

void tg_clear_error(void) {
  if (!tl_state) return;
  tl_state->err_set = false;
  tl_state->err_status = TG_OK;
}

/* ---- settings ---- */

/* Environment values, looked up once per name. Entries are never freed, so pointers into them stay
 * valid for the process. Settings are read on every realize (several per kernel), so a lookup takes
 * no lock: an open-addressing table whose slots are filled once, under env_lock, and published by
 * their hash (written last, with release order; 0 is a free slot). A table that fills up (more than
 * ENV_SLOTS distinct names) keeps the rest in a locked list. */
#define ENV_SLOTS 1024
typedef struct {
  char *name;
  char *value; /* NULL if unset */
  uint64_t hash; /* set last; 0 while the slot is free */
} EnvEntry;

static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;
static EnvEntry env_table[ENV_SLOTS];
static size_t env_used;
static EnvEntry *env_more; /* past the table's capacity */
static size_t env_nmore, env_capmore;

static uint64_t env_hash(const char *name) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211ULL;
  return h ? h : 1;
}

/* The slot holding name, or the free slot where it would go (NULL: the table is full of others). */
static EnvEntry *env_probe(const char *name, uint64_t h) {
  for (size_t k = 0, i = h & (ENV_SLOTS - 1); k < ENV_SLOTS; k++, i = (i + 1) & (ENV_SLOTS - 1)) {
    EnvEntry *e = &env_table[i];
    uint64_t eh = __atomic_load_n(&e->hash, __ATOMIC_ACQUIRE);
    if (eh == 0 || (eh == h && strcmp(e->name, name) == 0)) return e;
  }
  return NULL;
}

/* Reads name from the environment into e (its hash, for a table slot, is the caller's to publish). */
static const char *env_fill(EnvEntry *e, const char *name) {
  const char *ev = getenv(name);
  e->name = tg_xstrdup(name);
  e->value = ev ? tg_xstrdup(ev) : NULL;
  return e->value;
}

static const char *env_cached(const char *name) {
  uint64_t h = env_hash(name);
  EnvEntry *e = env_probe(name, h);
  if (e && __atomic_load_n(&e->hash, __ATOMIC_ACQUIRE)) return e->value;
  pthread_mutex_lock(&env_lock);
  e = env_probe(name, h); /* another thread may have added it meanwhile */
  const char *v;
  if (e && e->hash) {
    v = e->value;
  } else if (e && env_used + 1 < ENV_SLOTS) {
    v = env_fill(e, name);
    __atomic_store_n(&e->hash, h, __ATOMIC_RELEASE);
    env_used++;
  } else {
    size_t i = 0;
    for (; i < env_nmore; i++)
      if (strcmp(env_more[i].name, name) == 0) break;
    if (i == env_nmore) {
      grow((void **)&env_more, &env_capmore, env_nmore + 1, sizeof *env_more);
      env_fill(&env_more[i], name);
      env_nmore++;
    }
    v = env_more[i].value;
  }
  pthread_mutex_unlock(&env_lock);
  return v;
}

/* Innermost Context override of name on this thread, or NULL. */
static const char *ctx_lookup(const char *name) {
  if (tl_override_count == 0) return NULL;
  ThreadState *ts = tl_state;
  for (size_t l = ts->nlevels; l-- > 0;) {
    CtxLevel *lv = &ts->levels[l];
    for (size_t i = lv->n; i-- > 0;)
      if (strcmp(lv->pairs[i].name, name) == 0) return lv->pairs[i].value;
  }
  return NULL;
}

/* Whole-string decimal integer (as Python's int(): "010" is 10), surrounding whitespace allowed;
 * false if invalid. */
static bool parse_int(const char *s, int64_t *out) {
  if (!s) return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || errno == ERANGE) return false;
  while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
  if (*end) return false;
  *out = (int64_t)v;
  return true;
}

/* The library reads its settings by string literal, several times per realize: a small per-thread
 * cache keyed by the literal's address skips the hash and the compare. (A value, once read, never
 * changes or moves: see env_cached.) Names from the user (tg_getenv_int) may live in reused buffers,
 * so they take the full lookup. */
typedef struct {
  const char *lit, *value;
} LitSlot;
static _Thread_local LitSlot tl_lits[64];

static const char *env_lit(const char *name) {
  LitSlot *s = &tl_lits[((uintptr_t)name * 0x9e3779b97f4a7c15ULL) >> 58];
  if (s->lit == name) return s->value;
  const char *v = env_cached(name);
  s->lit = name, s->value = v;
  return v;
}

const char *getenv_str(const char *name, const char *def) {
  const char *v = ctx_lookup(name);
  if (v) return v;
  v = env_lit(name);
  return v ? v : def;
}

/* A setting that cannot be used is reported on stderr (once per name: settings are read often),
 * since the call that reads it has no error to return. */
void env_warn(const char *name, const char *value, const char *why, const char *instead) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static char warned[32][64];
  static int nwarned;
  pthread_mutex_lock(&lock);
  bool seen = false;
  for (int i = 0; i < nwarned && !seen; i++) seen = strcmp(warned[i], name) == 0;
  if (!seen && nwarned < 32) snprintf(warned[nwarned++], sizeof warned[0], "%s", name);
  pthread_mutex_unlock(&lock);
  if (!seen) fprintf(stderr, "tinygrad.c: ignoring %s=%s (%s); using %s\n", name, value, why, instead);
}

/* name's value s read as an integer; def (with a warning) if it is not one */
static int64_t env_int_of(const char *name, const char *s, int64_t def) {
  int64_t v;
  if (!s || !*s) return def;
  if (parse_int(s, &v)) return v;
  char d[32];
  snprintf(d, sizeof d, "%lld", (long long)def);
  env_warn(name, s, "not an integer", d);
  return def;
}

int64_t getenv_int(const char *name, int64_t def) { return env_int_of(name, getenv_str(name, NULL), def); }

int64_t getenv_int_in(const char *name, int64_t def, int64_t lo, int64_t hi) {
  int64_t v = getenv_int(name, def);
  if (v >= lo && v <= hi) return v;
  int64_t c = v < lo ? lo : hi;
  char why[96], used[32];
  snprintf(why, sizeof why, "outside %lld..%lld", (long long)lo, (long long)hi);
  snprintf(used, sizeof used, "%lld", (long long)c);
  env_warn(name, getenv_str(name, ""), why, used);
  return c;
}

int64_t tg_getenv_int(const char *name, int64_t def) {
  if (!name) {
    tg_set_error(TG_ERR_INVALID, "tg_getenv_int: name is NULL");
    return def;
  }
  const char *v = ctx_lookup(name);
  return env_int_of(name, v ? v : env_cached(name), def);
}

/* DEBUG from the environment; INT_MIN until first read. */
static atomic_int debug_env = INT_MIN;

int debug_level(void) {
  if (tl_override_count) {
    const char *v = ctx_lookup("DEBUG");
    int64_t d;
    if (v) {
      if (parse_int(v, &d)) return (int)d;
      if (*v) env_warn("DEBUG", v, "not an integer", "0");
      return 0;
    }
  }
  int d = atomic_load_explicit(&debug_env, memory_order_relaxed);
  if (d == INT_MIN) {
    int64_t e;
    const char *s = env_cached("DEBUG");
    bool ok = parse_int(s, &e) && e > INT_MIN && e <= INT_MAX;
    if (!ok && s && *s) env_warn("DEBUG", s, "not an integer", "0");
    d = ok ? (int)e : 0;
    atomic_store_explicit(&debug_env, d, memory_order_relaxed);
  }
  return d;
}

void tg_context_begin(void) {
  ThreadState *ts = thread_state();
  grow((void **)&ts->levels, &ts->cap_levels, ts->nlevels + 1, sizeof *ts->levels);
  memset(&ts->levels[ts->nlevels], 0, sizeof ts->levels[0]);
  ts->nlevels++;
}

tg_status tg_context_set(const char *name, const char *value) {
  if (!name || !*name || !value)
    return tg_set_error(TG_ERR_INVALID, "tg_context_set: name and value must be non-empty strings");
  ThreadState *ts = tl_state;
  if (!ts || ts->nlevels == 0)
    return tg_set_error(TG_ERR_INVALID, "tg_context_set: no open context (call tg_context_begin first)");
  CtxLevel *lv = &ts->levels[ts->nlevels - 1];
  grow((void **)&lv->pairs, &lv->cap, lv->n + 1, sizeof *lv->pairs);
  lv->pairs[lv->n].name = tg_xstrdup(name);
  lv->pairs[lv->n].value = tg_xstrdup(value);
  lv->n++;
  tl_override_count++;
  return TG_OK;
}

tg_status tg_context_set_int(const char *name, int64_t value) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, value);
  return tg_context_set(name, buf);
}

void tg_context_end(void) {
  ThreadState *ts = tl_state;
  if (!ts || ts->nlevels == 0) {
    tg_set_error(TG_ERR_INVALID, "tg_context_end: no open context (unbalanced tg_context_begin/end)");
    return;
  }
  CtxLevel *lv = &ts->levels[--ts->nlevels];
  tl_override_count -= lv->n;
  free_level(lv);
}

/* A thread that works for another (a compile worker) sees the other's Context overrides. */
struct CtxCopy {
  CtxLevel all; /* every override of the source thread, outermost first */
};

CtxCopy *ctx_copy(void) {
  ThreadState *ts = tl_state;
  if (!ts || tl_override_count == 0) return NULL;
  CtxCopy *c = tg_xcalloc(1, sizeof *c);
  for (size_t l = 0; l < ts->nlevels; l++)
    for (size_t i = 0; i < ts->levels[l].n; i++) {
      grow((void **)&c->all.pairs, &c->all.cap, c->all.n + 1, sizeof *c->all.pairs);
      c->all.pairs[c->all.n].name = tg_xstrdup(ts->levels[l].pairs[i].name);
      c->all.pairs[c->all.n].value = tg_xstrdup(ts->levels[l].pairs[i].value);
      c->all.n++;
    }
  return c;
}

void ctx_enter(const CtxCopy *c) {
  if (!c) return;
  tg_context_begin();
  for (size_t i = 0; i < c->all.n; i++) tg_context_set(c->all.pairs[i].name, c->all.pairs[i].value);
}

void ctx_leave(const CtxCopy *c) {
  if (c) tg_context_end();
}

void ctx_copy_free(CtxCopy *c) {
  if (!c) return;
  free_level(&c->all);
  free(c);
}

/* ---- counters ---- */

uint64_t counters_add(bool kernel, uint64_t ops, uint64_t mem, double t) {
  uint64_t n = kernel ? atomic_fetch_add_explicit(&g_counters.kernel_count, 1, memory_order_relaxed) + 1
                      : atomic_load_explicit(&g_counters.kernel_count, memory_order_relaxed);
  if (ops) atomic_fetch_add_explicit(&g_counters.global_ops, ops, memory_order_relaxed);
  if (mem) atomic_fetch_add_explicit(&g_counters.global_mem, mem, memory_order_relaxed);
  if (t > 0) {
    double old = atomic_load_explicit(&g_counters.time_sum_s, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&g_counters.time_sum_s, &old, old + t, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
  }
  return n;
}

/* Each field is read atomically; a snapshot taken while other threads run may mix totals from
 * slightly different moments, but no update is ever lost or torn. */
tg_counters tg_global_counters(void) {
  tg_counters c;
  c.kernel_count = atomic_load_explicit(&g_counters.kernel_count, memory_order_relaxed);
  c.global_ops = atomic_load_explicit(&g_counters.global_ops, memory_order_relaxed);
  c.global_mem = atomic_load_explicit(&g_counters.global_mem, memory_order_relaxed);
  c.time_sum_s = atomic_load_explicit(&g_counters.time_sum_s, memory_order_relaxed);
  c.compile_count = atomic_load_explicit(&g_counters.compile_count, memory_order_relaxed);
  c.mem_used = device_mem_used();
  return c;
}
void tg_global_counters_reset(void) {
  atomic_store_explicit(&g_counters.kernel_count, 0, memory_order_relaxed);
  atomic_store_explicit(&g_counters.global_ops, 0, memory_order_relaxed);
  atomic_store_explicit(&g_counters.global_mem, 0, memory_order_relaxed);
  atomic_store_explicit(&g_counters.time_sum_s, 0.0, memory_order_relaxed);
  atomic_store_explicit(&g_counters.compile_count, 0, memory_order_relaxed);
}

/* ---- time ---- */

double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- string builder: s is NUL-terminated whenever it is non-NULL ---- */

void sb_init(SB *b) { memset(b, 0, sizeof *b); }

void sb_free(SB *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}

static void sb_reserve(SB *b, size_t extra) {
  if (extra > SIZE_MAX - b->len - 1) out_of_memory(SIZE_MAX);
  grow((void **)&b->s, &b->cap, b->len + extra + 1, 1);
}

static void sb_append(SB *b, const char *s, size_t n) {
  sb_reserve(b, n);
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
}

void sb_puts(SB *b, const char *s) { sb_append(b, s, strlen(s)); }
void sb_putc(SB *b, char c) { sb_append(b, &c, 1); }

void sb_vprintf(SB *b, const char *fmt, va_list ap) {
  /* Format straight into the spare capacity; only an overflowing message formats twice. */
  sb_reserve(b, 64);
  size_t avail = b->cap - b->len;
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(b->s + b->len, avail, fmt, ap);
  if (n > 0 && (size_t)n >= avail) {
    sb_reserve(b, (size_t)n);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap2);
  }
  va_end(ap2);
  if (n > 0) b->len += (size_t)n;
  b->s[b->len] = '\0';
}

void sb_printf(SB *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(b, fmt, ap);
  va_end(ap);
}

char *sb_take(SB *b) {
  char *s = b->s ? b->s : tg_xstrdup("");
  memset(b, 0, sizeof *b);
  return s;
}

/* ---- hashing ----
 * Multiply-fold mixing over 16-byte blocks: each step multiplies two 64-bit words into 128 bits and
 * folds the halves, so every input bit reaches every output bit within two steps. Not for hostile
 * inputs; used for hash-consing and cache keys. */

static const uint64_t HK0 = 0xa0761d6478bd642fULL, HK1 = 0xe7037ed1a0b428dbULL, HK2 = 0x8ebc6af09c88c6e3ULL,
                      HK3 = 0x589965cc75374cc3ULL;

static inline uint64_t mulfold(uint64_t a, uint64_t b) {
  __uint128_t r = (__uint128_t)a * b;
  return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t load64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

uint64_t hash_bytes(const void *data, size_t n, uint64_t seed) {
  const unsigned char *p = data;
  uint64_t h = seed ^ mulfold(seed ^ HK0, (uint64_t)n ^ HK1);
  size_t left = n;
  while (left >= 16) {
    h = mulfold(load64(p) ^ HK1 ^ h, load64(p + 8) ^ HK2);
    p += 16;
    left -= 16;
  }
  uint64_t a = 0, b = 0;
  if (left >= 8) {
    a = load64(p);
    memcpy(&b, p + 8, left - 8);
  } else if (left) {
    memcpy(&a, p, left);
  }
  h = mulfold(a ^ HK3 ^ h, b ^ HK2 ^ (uint64_t)left);
  return mulfold(h ^ HK0, (uint64_t)n ^ HK3);
}
